/* Checkpoints at the edges of the format:
 * - the data checksum of a tensor of 4 GiB or more (zlib's crc32 takes a
 *   32-bit length), computed on untouched anonymous memory, so no 4 GiB file
 *   is written;
 * - a header over the format's 100 MiB limit is refused by save (previous
 *   file intact), one just under it saves and loads;
 * - 400,000 entries save in seconds, a duplicate among them is refused;
 * - num_batches_tracked of any size (none, several) is range-checked
 *   within the entry;
 * - the cleanup of crashed saves' temporary files removes only names the
 *   library makes, and nothing when the save is refused;
 * - an empty path is named as such;
 * - a new file gets 0666 less the umask, a replaced file keeps its mode;
 * - as root, a replaced file owned by another user keeps its owner and
 *   group; that user, saving over root's file in a folder of theirs, gets
 *   a file of their own (a chown it may not do is not an error); not root:
 *   SKIP;
 * - a save through a symbolic link (a chain, a dangling one) replaces the
 *   link's target and keeps the link; a loop of links is refused;
 * - a save over a FIFO, a directory or (as root) a device, or through a
 *   link to one, is refused at once and leaves it as it was (a rename would
 *   have put a regular file in place of /dev/null);
 * - a save over the file size limit (RLIMIT_FSIZE, in a child process)
 *   returns SBN_STATUS_IO_ERROR naming the file and the limit instead of
 *   dying from SIGXFSZ, keeps the previous file, leaves no temporary file,
 *   and leaves the thread's signal mask and a SIGXFSZ pending before the
 *   call as they were;
 * - file names of 237 to 255 bytes save and load back (a temporary name
 *   with the name in it would pass NAME_MAX), and a crashed save's leftover
 *   of such a name is removed by the next save. */
#include <dirent.h>
#include <pwd.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "nn_testutil.h"
#include "../../src/nn/safetensors.h"

static int failures;

#define MUST(call)                                                                      \
  do {                                                                                  \
    if ((call) != SBN_STATUS_OK) {                                                      \
      printf("FAIL: %s: %s\n", #call, sbn_last_error());                                \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The CRC of n bytes of which only those at touched[] may be nonzero,
 * built piece by piece with crc32_combine: independent of the helper's
 * chunking and reads only the touched pieces. */
#define PIECE ((size_t)1 << 20)
static uint32_t reference_crc(const unsigned char *p, size_t n, const size_t *touched, int nt) {
  static unsigned char zeros[PIECE];
  const uLong zero_piece = crc32(0L, zeros, (uInt)PIECE);
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t off = 0; off < n; off += PIECE) {
    size_t len = n - off < PIECE ? n - off : PIECE;
    int dirty = len < PIECE;
    for (int i = 0; i < nt; i++) dirty |= touched[i] / PIECE == off / PIECE;
    uLong piece = dirty ? crc32(0L, p + off, (uInt)len) : zero_piece;
    crc = crc32_combine(crc, piece, (z_off_t)len);
  }
  return (uint32_t)crc;
}

static void test_crc_over_4gib(void) {
  const char *check = "123456789"; /* CRC-32's check value is cbf43926 */
  uint32_t c = sbn_nn_st_crc32(0, check, 9);
  printf("crc32(\"123456789\") = %08x (want cbf43926)\n", (unsigned)c);
  failures += c != 0xcbf43926u;

  const size_t n = ((size_t)4 << 30) + 3 * PIECE + 5;
  if (test_skip_large((int64_t)n, (int64_t)1 << 30)) return; /* zlib is not instrumented */
  unsigned char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    printf("SKIP crc over 4 GiB: cannot map %zu bytes of address space\n", n);
    return;
  }
  /* A few nonzero bytes, around the 4 GiB mark a 32-bit length wraps at. */
  const size_t touched[] = {0, ((size_t)1 << 32) - 1, (size_t)1 << 32, n - 1};
  for (int i = 0; i < 4; i++) p[touched[i]] = (unsigned char)(0x5a + i);
  uint32_t want = reference_crc(p, n, touched, 4);
  double t0 = now_s();
  uint32_t got = sbn_nn_st_crc32(0, p, n);
  double t1 = now_s();
  printf("crc of %zu bytes (4 GiB + %zu): %08x, pieces combined: %08x (%.1f s)%s\n", n, n - ((size_t)4 << 30),
         (unsigned)got, (unsigned)want, t1 - t0, got == want ? "" : "  FAIL");
  failures += got != want;
  munmap(p, n);
}

static int count_tmp(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp-") != NULL;
  if (d) closedir(d);
  return n;
}

/* The directory of a path, in a static buffer. */
static const char *dirname_of(const char *path) {
  static char d[400];
  snprintf(d, sizeof d, "%s", path);
  char *slash = strrchr(d, '/');
  if (slash) *slash = 0;
  return d;
}

static int same_file(const char *path, const unsigned char *want, size_t wl) {
  unsigned char *b;
  size_t l;
  if (nn_read_file(path, &b, &l)) return 0;
  int same = l == wl && !memcmp(b, want, wl);
  free(b);
  return same;
}

static sbn_nn_entry float_entry(const char *name, float *v) {
  sbn_nn_entry e;
  memset(&e, 0, sizeof e);
  snprintf(e.name, sizeof e.name, "%s", name);
  e.kind = SBN_NN_ENTRY_KIND_PARAMETER, e.dtype = SBN_DTYPE_FLOAT32, e.ndim = 1, e.shape[0] = 1, e.numel = 1;
  e.data = v;
  return e;
}

/* Entries whose names escape to 6 bytes a character in JSON (\u0001), so a
 * header near 100 MiB needs only ~65,000 of them. */
static sbn_nn_entry *escaped_entries(int n, float *v) {
  sbn_nn_entry *e = calloc((size_t)n, sizeof *e);
  char name[SBN_NN_NAME_MAX];
  for (int i = 0; e && i < n; i++) {
    snprintf(name, sizeof name, "%06d", i);
    memset(name + 6, 1, SBN_NN_NAME_MAX - 7);
    name[SBN_NN_NAME_MAX - 1] = 0;
    e[i] = float_entry(name, &v[i]);
  }
  return e;
}

static void test_header_limit(const char *dir) {
  char path[300];
  snprintf(path, sizeof path, "%s/limit.safetensors", dir);
  float one = 1, *v = calloc(70000, sizeof *v);
  sbn_nn_entry small = float_entry("w", &one);
  MUST(sbn_nn_save_entries(path, &small, 1));
  unsigned char *before;
  size_t bl;
  if (!v || nn_read_file(path, &before, &bl)) exit(1);
  sbn_nn_entry *e = escaped_entries(70000, v);
  sbn_status st = sbn_nn_save_entries(path, e, 70000);
  int intact = same_file(path, before, bl), tmps = count_tmp(dir);
  printf("save of 70000 entries with 255-character escaped names -> %s: %s\n", sbn_status_name(st), sbn_last_error());
  printf("  previous file %s, %d temporary files\n", intact ? "intact" : "CHANGED", tmps);
  int bad = st != SBN_STATUS_INVALID_ARGUMENT || !strstr(sbn_last_error(), "limit") || !intact || tmps;
  if (bad) printf("  FAIL: a header the loader refuses must not be written\n");
  failures += bad;
  /* Just under the limit: saves, and loads back. */
  st = sbn_nn_save_entries(path, e, 64000);
  unsigned char *buf;
  size_t len;
  sbn_status lst = st == SBN_STATUS_OK && !nn_read_file(path, &buf, &len)
                       ? sbn_nn_load_entries(e, 64000, buf, len, SBN_NN_LOAD_STRICT, NULL)
                       : SBN_STATUS_IO_ERROR;
  uint64_t hl = 0;
  for (int i = 7; st == SBN_STATUS_OK && i >= 0; i--) hl = hl << 8 | buf[i];
  printf("save of 64000 such entries -> %s (header %llu bytes); load -> %s %s\n", sbn_status_name(st),
         (unsigned long long)hl, sbn_status_name(lst), lst ? sbn_last_error() : "");
  failures += st != SBN_STATUS_OK || lst != SBN_STATUS_OK;
  if (st == SBN_STATUS_OK) free(buf);
  free(e), free(v), free(before);
}

static void too_slow(int sig) {
  (void)sig;
  static const char msg[] = "FAIL: saving the entries took over 60 s\n";
  (void)!write(1, msg, sizeof msg - 1);
  _exit(1);
}

static void test_many_entries(const char *dir) {
  const char *san = getenv("SBN_TEST_SANITIZED");
  const int N = san && atoi(san) ? 40000 : 400000; /* the speed is the normal build's to check */
  if (N < 400000) printf("  (40000 entries, not 400000, under SBN_TEST_SANITIZED=1)\n");
  char path[300];
  snprintf(path, sizeof path, "%s/many.safetensors", dir);
  sbn_nn_entry *e = calloc(N, sizeof *e), *back = calloc(N, sizeof *back);
  float *v = calloc(N, sizeof *v), *w = calloc(N, sizeof *w);
  if (!e || !back || !v || !w) exit(1);
  char name[64];
  for (int i = 0; i < N; i++) {
    v[i] = (float)i;
    snprintf(name, sizeof name, "blocks.%d.weight", (int)((int64_t)i * 7919 % N)); /* not in sorted order */
    e[i] = float_entry(name, &v[i]);
    back[i] = float_entry(name, &w[i]);
  }
  signal(SIGALRM, too_slow);
  alarm(60);
  double t0 = now_s();
  snprintf(e[N - 1].name, sizeof e[N - 1].name, "%s", e[12345].name);
  sbn_status dup = sbn_nn_save_entries(path, e, N);
  char msg[300];
  snprintf(msg, sizeof msg, "%s", sbn_last_error());
  double t1 = now_s();
  snprintf(e[N - 1].name, sizeof e[N - 1].name, "%s", back[N - 1].name);
  sbn_status st = sbn_nn_save_entries(path, e, N);
  double t2 = now_s();
  alarm(0);
  printf("%d entries, one name twice -> %s in %.2f s: %s\n", N, sbn_status_name(dup), t1 - t0, msg);
  unsigned char *buf;
  size_t len;
  sbn_status lst = st == SBN_STATUS_OK && !nn_read_file(path, &buf, &len)
                       ? sbn_nn_load_entries(back, N, buf, len, SBN_NN_LOAD_STRICT, NULL)
                       : SBN_STATUS_IO_ERROR;
  int same = lst == SBN_STATUS_OK && !memcmp(v, w, (size_t)N * sizeof *v);
  printf("%d distinct entries -> %s in %.2f s; loaded back: %s, values %s\n", N, sbn_status_name(st), t2 - t1,
         sbn_status_name(lst), same ? "equal" : "DIFFER");
  failures += dup != SBN_STATUS_INVALID_ARGUMENT || !strstr(msg, "appears twice") || st || lst || !same;
  if (lst == SBN_STATUS_OK) free(buf);
  free(e), free(back), free(v), free(w);
}

/* Load from a buffer of exactly the file's size, so reading past an entry
 * that ends the data is caught by ASan. */
static sbn_status save_and_load(const char *path, sbn_nn_entry *e, sbn_nn_entry *into) {
  sbn_status st = sbn_nn_save_entries(path, e, 1);
  unsigned char *buf;
  size_t len;
  if (st != SBN_STATUS_OK || nn_read_file(path, &buf, &len)) return SBN_STATUS_IO_ERROR;
  st = sbn_nn_load_entries(into, 1, buf, len, SBN_NN_LOAD_STRICT, NULL);
  free(buf);
  return st;
}

static void test_nbt_sizes(const char *dir) {
  char path[300];
  snprintf(path, sizeof path, "%s/nbt.safetensors", dir);
  int64_t none = 7, two[2] = {4, -1}, into[2] = {9, 9};
  sbn_nn_entry e, in;
  memset(&e, 0, sizeof e);
  snprintf(e.name, sizeof e.name, "num_batches_tracked");
  e.kind = SBN_NN_ENTRY_KIND_BUFFER, e.dtype = SBN_DTYPE_INT64, e.ndim = 1, e.shape[0] = 0, e.numel = 0;
  e.data = &none;
  in = e, in.data = into;
  sbn_status st = save_and_load(path, &e, &in);
  printf("num_batches_tracked of shape [0] -> %s %s\n", sbn_status_name(st), st ? sbn_last_error() : "");
  failures += st != SBN_STATUS_OK || into[0] != 9;
  snprintf(e.name, sizeof e.name, "bn.num_batches_tracked");
  e.shape[0] = e.numel = 2, e.data = two;
  in = e, in.data = into;
  st = save_and_load(path, &e, &in);
  printf("num_batches_tracked of shape [2] = {4, -1} -> %s: %s\n", sbn_status_name(st), sbn_last_error());
  failures += st != SBN_STATUS_INVALID_ARGUMENT || !strstr(sbn_last_error(), "-1") || into[0] != 9 || into[1] != 9;
}

static void make_old_file(const char *dir, const char *name) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  if (nn_write_file(p, "user data", 9)) exit(1);
  struct timespec t[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
  utimensat(AT_FDCWD, p, t, 0);
}

static int exists(const char *dir, const char *name) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return access(p, F_OK) == 0;
}

static void test_stale_temps(const char *dir) {
  static const char *keep[] = {"model.st.tmp-backup", "model.st.tmp-XYZ123", "model.st.tmp-syncbn-Ab12C",
                               "model.st.tmp-syncbn-Ab12Cd7", "model.st.tmp-syncbn-Ab-2Cd",
                               "model.st.tmp-syncbn-Ab12Cd.old", "other.st.tmp-syncbn-Ab12Cd"};
  const char *ours = "model.st.tmp-syncbn-Ab12Cd";
  const int nk = (int)(sizeof keep / sizeof *keep);
  char path[300];
  snprintf(path, sizeof path, "%s/model.st", dir);
  for (int i = 0; i < nk; i++) make_old_file(dir, keep[i]);
  make_old_file(dir, ours);
  float one = 1;
  sbn_nn_entry e = float_entry("", &one);
  sbn_status st = sbn_nn_save_entries(path, &e, 1);
  int all = exists(dir, ours);
  for (int i = 0; i < nk; i++) all &= exists(dir, keep[i]);
  printf("refused save (%s) -> %s; the hour-old files %s\n", sbn_last_error(), sbn_status_name(st),
         all ? "all still there" : "CHANGED");
  failures += st != SBN_STATUS_INVALID_ARGUMENT || !all;
  e = float_entry("w", &one);
  MUST(sbn_nn_save_entries(path, &e, 1));
  printf("a save of %s: stale temporary file %s %s\n", path, ours, exists(dir, ours) ? "KEPT" : "removed");
  failures += exists(dir, ours);
  for (int i = 0; i < nk; i++) {
    int ok = exists(dir, keep[i]);
    printf("  %-32s %s\n", keep[i], ok ? "kept" : "DELETED");
    failures += !ok;
  }
}

static void test_empty_path(void) {
  float one = 1;
  sbn_nn_entry e = float_entry("w", &one);
  sbn_status st = sbn_nn_save_entries("", &e, 1);
  printf("sbn_nn_save_entries(\"\") -> %s: %s\n", sbn_status_name(st), sbn_last_error());
  failures += st != SBN_STATUS_INVALID_ARGUMENT || !strstr(sbn_last_error(), "empty");
  sbn_module *m;
  if (nn_build_net(&m, 1)) exit(1);
  st = sbn_nn_save("", m);
  printf("sbn_nn_save(\"\") -> %s: %s\n", sbn_status_name(st), sbn_last_error());
  failures += st != SBN_STATUS_INVALID_ARGUMENT || !strstr(sbn_last_error(), "empty");
  sbn_module_destroy(m);
}

static unsigned mode_of(const char *path) {
  struct stat sb;
  return lstat(path, &sb) == 0 ? (unsigned)(sb.st_mode & 07777) : 0u;
}

static void check_mode(const char *what, const char *path, unsigned want) {
  unsigned got = mode_of(path);
  printf("%-52s mode %04o (want %04o) %s\n", what, got, want, got == want ? "ok" : "FAIL");
  failures += got != want;
}

static void test_modes(const char *dir) {
  char path[300];
  float one = 1;
  sbn_nn_entry e = float_entry("w", &one);
  const mode_t old = umask(077);
  snprintf(path, sizeof path, "%s/private.st", dir);
  MUST(sbn_nn_save_entries(path, &e, 1));
  check_mode("new file under umask 077", path, 0600);
  umask(022);
  snprintf(path, sizeof path, "%s/public.st", dir);
  MUST(sbn_nn_save_entries(path, &e, 1));
  check_mode("new file under umask 022", path, 0644);
  chmod(path, 0600);
  MUST(sbn_nn_save_entries(path, &e, 1));
  check_mode("existing 0600 file saved over under umask 022", path, 0600);
  chmod(path, 0640);
  umask(077);
  MUST(sbn_nn_save_entries(path, &e, 1));
  check_mode("existing 0640 file saved over under umask 077", path, 0640);
  umask(old);
}

static int is_link(const char *path) {
  struct stat sb;
  return lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode);
}

static float value_in(const char *path) {
  float v = -1;
  sbn_nn_entry e = float_entry("w", &v);
  unsigned char *buf;
  size_t len;
  if (nn_read_file(path, &buf, &len)) return -1;
  if (sbn_nn_load_entries(&e, 1, buf, len, SBN_NN_LOAD_STRICT, NULL) != SBN_STATUS_OK) v = -1;
  free(buf);
  return v;
}

/* A folder of the test's own under top, so that counting temporaries sees
 * only that test's; 0 if it could not be made (counted as a failure). */
static int own_dir(char *out, size_t n, const char *top, const char *name) {
  snprintf(out, n, "%s/%s", top, name);
  if (mkdir(out, 0700) == 0) return 1;
  printf("mkdir %s: %s FAIL\n", out, strerror(errno));
  failures++;
  return 0;
}

static void test_symlinks(const char *top) {
  char dir[300];
  if (!own_dir(dir, sizeof dir, top, "links")) return;
  char real_dir[400], real[400], link1[400], link2[400], dangling[400], created[400], loop[400];
  snprintf(real_dir, sizeof real_dir, "%s/real", dir);
  snprintf(real, sizeof real, "%s/real/r.st", dir);
  snprintf(link1, sizeof link1, "%s/link.st", dir);
  snprintf(link2, sizeof link2, "%s/link2.st", dir);
  snprintf(dangling, sizeof dangling, "%s/dangling.st", dir);
  snprintf(created, sizeof created, "%s/real/new.st", dir);
  snprintf(loop, sizeof loop, "%s/loop.st", dir);
  float v = 1;
  sbn_nn_entry e = float_entry("w", &v);
  if (mkdir(real_dir, 0700) != 0 || symlink("real/r.st", link1) != 0 || symlink("link.st", link2) != 0 ||
      symlink("real/new.st", dangling) != 0 || symlink("loop.st", loop) != 0) {
    printf("cannot set up links in %s: %s FAIL\n", dir, strerror(errno));
    failures++;
    return;
  }
  MUST(sbn_nn_save_entries(real, &e, 1));
  chmod(real, 0600);
  v = 5;
  MUST(sbn_nn_save_entries(link2, &e, 1)); /* link2 -> link.st -> real/r.st */
  int ok = is_link(link1) && is_link(link2) && value_in(real) == 5 && mode_of(real) == 0600 &&
           count_tmp(dir) == 0 && count_tmp(real_dir) == 0;
  printf("save through a chain of 2 links: links kept %s, target holds %g (want 5), mode %04o, temporaries %d %s\n",
         is_link(link1) && is_link(link2) ? "yes" : "no", value_in(real), mode_of(real),
         count_tmp(dir) + count_tmp(real_dir), ok ? "ok" : "FAIL");
  failures += !ok;
  v = 7;
  MUST(sbn_nn_save_entries(dangling, &e, 1));
  ok = is_link(dangling) && value_in(created) == 7 && value_in(dangling) == 7;
  printf("save through a dangling link: link kept %s, its target created with %g %s\n", is_link(dangling) ? "yes" : "no",
         value_in(created), ok ? "ok" : "FAIL");
  failures += !ok;
  sbn_status st = sbn_nn_save_entries(loop, &e, 1);
  printf("save through a loop of links -> %s: %s\n", sbn_status_name(st), sbn_last_error());
  failures += st != SBN_STATUS_IO_ERROR || !strstr(sbn_last_error(), "symbolic links") || !is_link(loop);
}

static void check_owner(const char *what, const char *path, uid_t uid, gid_t gid) {
  struct stat sb = {0};
  sb.st_uid = sb.st_gid = (unsigned)-1;
  (void)stat(path, &sb);
  int ok = sb.st_uid == uid && sb.st_gid == gid;
  printf("%-52s owner %d:%d (want %d:%d) %s\n", what, (int)sb.st_uid, (int)sb.st_gid, (int)uid, (int)gid,
         ok ? "ok" : "FAIL");
  failures += !ok;
}

/* Saving over the file as the user `pw`, in a child (setuid cannot be
 * undone); exit 0 when the save succeeded. */
static int save_as(const struct passwd *pw, const char *path) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    float two = 2;
    sbn_nn_entry e = float_entry("w", &two);
    if (setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0) _exit(2);
    sbn_status st = sbn_nn_save_entries(path, &e, 1);
    if (st != SBN_STATUS_OK) printf("  [child] save as %s -> %s: %s\n", pw->pw_name, sbn_status_name(st), sbn_last_error());
    fflush(stdout);
    _exit(st == SBN_STATUS_OK ? 0 : 1);
  }
  int ws = 0;
  return pid > 0 && waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0 ? 0 : 1;
}

static void owner_cases(const struct passwd *pw, const char *dir);

/* A folder of its own, not under the test's 0700 one, which nobody could
 * not enter. */
static void test_owner(void) {
  const struct passwd *pw = getpwnam("nobody");
  if (geteuid() != 0 || !pw) {
    printf("SKIP: owner kept on replace: needs root and a user 'nobody'\n");
    return;
  }
  char dir[] = "/tmp/sbn_owner_XXXXXX", cmd[64];
  if (!mkdtemp(dir)) {
    printf("mkdtemp: %s FAIL\n", strerror(errno));
    failures++;
    return;
  }
  owner_cases(pw, dir);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) printf("warning: could not remove %s\n", dir);
}

static void owner_cases(const struct passwd *pw, const char *dir) {
  const uid_t uid = pw->pw_uid;
  const gid_t gid = pw->pw_gid;
  char path[400];
  float one = 1;
  sbn_nn_entry e = float_entry("w", &one);
  snprintf(path, sizeof path, "%s/theirs.st", dir);
  MUST(sbn_nn_save_entries(path, &e, 1));
  if (chown(path, uid, gid) != 0 || chmod(path, 0640) != 0) {
    printf("chown %s: %s FAIL\n", path, strerror(errno));
    failures++;
    return;
  }
  MUST(sbn_nn_save_entries(path, &e, 1));
  check_owner("root saved over nobody's file", path, uid, gid);
  check_mode("root saved over nobody's 0640 file", path, 0640);
  /* The other way: nobody replaces root's file in a folder nobody owns. */
  snprintf(path, sizeof path, "%s/roots.st", dir);
  MUST(sbn_nn_save_entries(path, &e, 1));
  chmod(path, 0644);
  if (chown(dir, uid, gid) != 0) {
    printf("chown %s: %s FAIL\n", dir, strerror(errno));
    failures++;
    return;
  }
  int bad = save_as(pw, path);
  printf("nobody saved over root's file in its own folder: %s\n", bad ? "failed FAIL" : "ok");
  failures += bad;
  check_owner("nobody saved over root's file", path, uid, gid);
  check_mode("nobody saved over root's 0644 file", path, 0644);
}

static unsigned type_of(const char *path) {
  struct stat sb;
  return lstat(path, &sb) == 0 ? (unsigned)(sb.st_mode & S_IFMT) : 0u;
}

static void refused_special(const char *what, const char *path, const char *kind, const char *dir, unsigned type) {
  float one = 1;
  sbn_nn_entry e = float_entry("w", &one);
  sbn_status st = sbn_nn_save_entries(path, &e, 1);
  const char *msg = sbn_last_error();
  int ok = st == SBN_STATUS_IO_ERROR && strstr(msg, kind) && strstr(msg, "only replace a regular file") &&
           type_of(path) == type && count_tmp(dir) == 0;
  printf("save over %s -> %s: %s; still %s, temporaries %d %s\n", what, sbn_status_name(st), msg,
         type_of(path) == type ? "there" : "REPLACED", count_tmp(dir), ok ? "ok" : "FAIL");
  failures += !ok;
}

static void test_special(const char *top) {
  char dir[300], fifo[400], sub[400], link[400], dev[400];
  if (!own_dir(dir, sizeof dir, top, "special")) return;
  snprintf(fifo, sizeof fifo, "%s/fifo.st", dir);
  snprintf(sub, sizeof sub, "%s/dir.st", dir);
  snprintf(link, sizeof link, "%s/link.st", dir);
  snprintf(dev, sizeof dev, "%s/null.st", dir);
  if (mkfifo(fifo, 0600) != 0 || mkdir(sub, 0700) != 0 || symlink("fifo.st", link) != 0) {
    printf("cannot set up %s: %s FAIL\n", dir, strerror(errno));
    failures++;
    return;
  }
  refused_special("a FIFO", fifo, "a FIFO", dir, S_IFIFO);
  refused_special("a link to a FIFO", link, "a FIFO", dir, S_IFLNK);
  refused_special("a directory", sub, "a directory", dir, S_IFDIR);
  if (mknod(dev, S_IFCHR | 0600, makedev(1, 3)) == 0) /* /dev/null's numbers */
    refused_special("a character device", dev, "a device", dir, S_IFCHR);
  else
    printf("SKIP: save over a device: mknod: %s\n", strerror(errno));
}

static void *idle_thread(void *arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}

static int sigxfsz_pending(void) {
  sigset_t p;
  return sigpending(&p) == 0 && sigismember(&p, SIGXFSZ) == 1;
}

static int sigxfsz_blocked(void) {
  sigset_t m;
  return pthread_sigmask(SIG_BLOCK, NULL, &m) == 0 && sigismember(&m, SIGXFSZ) == 1;
}

/* In a child: RLIMIT_FSIZE of 32 KiB, a 64 KiB save over a small file.
 * Another thread that does not block SIGXFSZ runs meanwhile. Exit 0 when
 * every check passed; killed by SIGXFSZ is the bug. */
static int fsize_child(const char *path) {
  static float big[16384];
  float one = 1;
  sbn_nn_entry e = float_entry("w", &one);
  MUST(sbn_nn_save_entries(path, &e, 1));
  unsigned char *before;
  size_t bl;
  if (nn_read_file(path, &before, &bl)) return 1;
  pthread_t t;
  pthread_create(&t, NULL, idle_thread, NULL);
  struct rlimit r = {32 * 1024, 32 * 1024};
  if (setrlimit(RLIMIT_FSIZE, &r) != 0) return perror("setrlimit"), 1;
  e.ndim = 1, e.shape[0] = e.numel = 16384, e.data = big;
  int bad = 0;
  for (int round = 0; round < 2; round++) {
    if (round == 1) { /* the caller blocks SIGXFSZ and one is already pending: both stay */
      sigset_t s;
      sigemptyset(&s), sigaddset(&s, SIGXFSZ);
      pthread_sigmask(SIG_BLOCK, &s, NULL);
      raise(SIGXFSZ);
    }
    sbn_status st = sbn_nn_save_entries(path, &e, 1);
    const char *msg = sbn_last_error();
    int ok = st == SBN_STATUS_IO_ERROR && strstr(msg, path) && strstr(msg, "32768") && strstr(msg, "limit") &&
             same_file(path, before, bl) && count_tmp(dirname_of(path)) == 0 &&
             sigxfsz_pending() == (round == 1) && sigxfsz_blocked() == (round == 1);
    printf("  [child] %s: save of 64 KiB under ulimit -f 32 -> %s: %s; previous file %s, temporaries %d, "
           "SIGXFSZ %s and %s %s\n",
           round ? "SIGXFSZ blocked and pending" : "default mask", sbn_status_name(st), msg,
           same_file(path, before, bl) ? "intact" : "CHANGED", count_tmp(dirname_of(path)),
           sigxfsz_pending() ? "pending" : "not pending", sigxfsz_blocked() ? "blocked" : "unblocked",
           ok ? "ok" : "FAIL");
    bad |= !ok;
  }
  return bad;
}

static void test_file_size_limit(const char *dir) {
  char path[300];
  if (!own_dir(path, sizeof path, dir, "fsize")) return;
  snprintf(path, sizeof path, "%s/fsize/fsize.st", dir);
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    printf("fork: %s FAIL\n", strerror(errno));
    failures++;
    return;
  }
  if (pid == 0) {
    int bad = fsize_child(path);
    fflush(stdout);
    _exit(bad);
  }
  int ws = 0;
  waitpid(pid, &ws, 0);
  int ok = WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
  if (WIFSIGNALED(ws)) printf("the child was killed by signal %d (%s) FAIL\n", WTERMSIG(ws), strsignal(WTERMSIG(ws)));
  else printf("file size limit: the child exited with %d %s\n", WEXITSTATUS(ws), ok ? "ok" : "FAIL");
  failures += !ok;
}

extern long sbn_nn_test_save_fault_at;
extern int sbn_nn_test_save_fault_kind;

/* Entries of dir whose names start with prefix, other than `except`; the
 * last one into last. */
static int count_prefixed(const char *dir, const char *prefix, const char *except, char *last, size_t cap) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *de; d && (de = readdir(d));)
    if (!strncmp(de->d_name, prefix, strlen(prefix)) && strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
        strcmp(de->d_name, except))
      n++, snprintf(last, cap, "%s", de->d_name);
  if (d) closedir(d);
  return n;
}

/* File names up to NAME_MAX (255 bytes) save and load back: the temporary
 * name "<name>.tmp-syncbn-XXXXXX" would not fit past 237 bytes, so those
 * saves use the short ".tmp-syncbn-<hash>-XXXXXX" beside it. A crashed
 * save's short-named leftover is removed by the next save of that file and
 * no other target's is. */
static void test_long_names(const char *top) {
  char dir[300], path[600], name[300], left[300];
  if (!own_dir(dir, sizeof dir, top, "long")) return;
  sbn_module *a, *b;
  rng r = rng_seed(77);
  if (nn_build_net(&a, 1) || nn_build_net(&b, 2)) exit(1);
  nn_randomize(a, &r);
  nn_snapshot s;
  if (nn_snapshot_take(&s, a)) exit(1);
  static const int lens[] = {237, 238, 250, 255};
  for (int k = 0; k < 4; k++) {
    memset(name, 'm', (size_t)lens[k] - 12), strcpy(name + lens[k] - 12, ".safetensors");
    snprintf(path, sizeof path, "%s/%s", dir, name);
    sbn_status sv = sbn_nn_save(path, a);
    char why[200] = "";
    sbn_status ld = sv == SBN_STATUS_OK ? sbn_nn_load(b, path, 0, NULL) : sv;
    int diff = ld == SBN_STATUS_OK ? nn_snapshot_diff(&s, b, 0, why, sizeof why) : -1;
    int files = count_prefixed(dir, "", "", left, sizeof left);
    int ok = sv == SBN_STATUS_OK && ld == SBN_STATUS_OK && diff == 0 && files == k + 1;
    printf("%d-byte file name: save %s, load %s, %d entries differ, files in the directory: %d (want %d) %s%s%s\n",
           lens[k], sbn_status_name(sv), sbn_status_name(ld), diff, files, k + 1, ok ? "ok" : "FAIL",
           sv || ld ? ": " : "", sv || ld ? sbn_last_error() : why);
    failures += !ok;
  }
  static const char other[] = ".tmp-syncbn-0123456789abcdef-Ab12Cd"; /* another long name's leftover */
  make_old_file(dir, other);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) { /* dies in the middle of writing its temporary file */
    sbn_nn_test_save_fault_at = 100, sbn_nn_test_save_fault_kind = 2;
    sbn_nn_save(path, a);
    _exit(0);
  }
  int ws = 0;
  if (pid > 0) waitpid(pid, &ws, 0);
  int crashed = pid > 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 3;
  int n = count_prefixed(dir, ".tmp-syncbn-", other, left, sizeof left);
  int ok = crashed && n == 1 && strlen(left) == 35;
  printf("a 255-byte name's save killed mid-write left %d temporary file (want 1) beside the other one: %s %s\n", n,
         n ? left : "-", ok ? "ok" : "FAIL");
  failures += !ok;
  if (!n) return;
  char leftover[700];
  snprintf(leftover, sizeof leftover, "%s/%s", dir, left);
  struct timespec t[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
  utimensat(AT_FDCWD, leftover, t, 0);
  MUST(sbn_nn_save(path, a));
  ok = access(leftover, F_OK) != 0 && exists(dir, other);
  printf("the next save removed it: %s, kept the other one's: %s %s\n", access(leftover, F_OK) ? "yes" : "no",
         exists(dir, other) ? "yes" : "no", ok ? "ok" : "FAIL");
  failures += !ok;
  nn_snapshot_free(&s);
  sbn_module_destroy(a), sbn_module_destroy(b);
}

/* Arguments name the parts to run (crc header many nbt temps path modes owner links special fsize long); none: all. */
static int wanted(int argc, char **argv, const char *part) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], part)) return 1;
  return argc < 2;
}

int main(int argc, char **argv) {
  char dir[] = "/tmp/sbn_edges_XXXXXX";
  if (!mkdtemp(dir)) return 1;
  if (wanted(argc, argv, "crc")) test_crc_over_4gib();
  if (wanted(argc, argv, "header")) test_header_limit(dir);
  if (wanted(argc, argv, "many")) test_many_entries(dir);
  if (wanted(argc, argv, "nbt")) test_nbt_sizes(dir);
  if (wanted(argc, argv, "temps")) test_stale_temps(dir);
  if (wanted(argc, argv, "path")) test_empty_path();
  if (wanted(argc, argv, "modes")) test_modes(dir);
  if (wanted(argc, argv, "owner")) test_owner();
  if (wanted(argc, argv, "links")) test_symlinks(dir);
  if (wanted(argc, argv, "special")) test_special(dir);
  if (wanted(argc, argv, "fsize")) test_file_size_limit(dir);
  if (wanted(argc, argv, "long")) test_long_names(dir);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) printf("warning: could not remove %s\n", dir);
  printf("%s (%d failures)\n", failures ? "FAILED" : "all ok", failures);
  return failures ? 1 : 0;
}

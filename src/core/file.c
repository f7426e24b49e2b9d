/* Opening input files (regular files only, never blocking on a FIFO) and
 * the pieces of an atomic save. */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "error.h"

static const char *kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

sbn_status sbn_open_regular(FILE **out, size_t *size, const char *path, const char *call) {
  *out = NULL, *size = 0;
  /* O_NONBLOCK: opening a FIFO for reading would wait for a writer. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return sbn_fail(SBN_STATUS_IO_ERROR, "%s: cannot open %s: %s", call, path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    close(fd);
    return sbn_fail(SBN_STATUS_IO_ERROR, "%s: cannot stat %s: %s", call, path, strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return sbn_fail(SBN_STATUS_IO_ERROR, "%s: %s is %s; expected a regular file", call, path, kind_of(sb.st_mode));
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    int e = errno;
    close(fd);
    return sbn_fail(SBN_STATUS_IO_ERROR, "%s: cannot open %s: %s", call, path, strerror(e));
  }
  *out = f;
  *size = (size_t)sb.st_size;
  return SBN_STATUS_OK;
}

/* ---- saving ---- */

#define SYMLINK_HOPS 40 /* Linux's own limit on links followed in one lookup */

/* readlink into a fresh string of any length. */
static char *read_link(const char *path) {
  for (size_t cap = 256;; cap *= 2) {
    char *buf = malloc(cap);
    if (!buf) return NULL;
    ssize_t n = readlink(path, buf, cap);
    if (n >= 0 && (size_t)n < cap) {
      buf[n] = 0;
      return buf;
    }
    int e = n < 0 ? errno : ENAMETOOLONG;
    free(buf);
    if (n < 0 || cap > (1u << 20)) return errno = e, NULL;
  }
}

/* A link's target relative to the directory holding the link. */
static char *join_link(const char *link, const char *target) {
  const char *slash = strrchr(link, '/');
  if (target[0] == '/' || !slash) return strdup(target);
  const size_t dl = (size_t)(slash - link) + 1, tl = strlen(target);
  char *p = malloc(dl + tl + 1);
  if (!p) return NULL;
  memcpy(p, link, dl);
  memcpy(p + dl, target, tl + 1);
  return p;
}

sbn_status sbn_save_target(char **out, const char *path, const char *call) {
  *out = NULL;
  char *cur = strdup(path);
  if (!cur) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  for (int hops = 0;; hops++) {
    struct stat sb;
    /* A path that cannot be examined is saved to as it is: creating the
     * temporary file reports what is wrong. Only a regular file can be
     * replaced: a rename over a device or a FIFO (/dev/null as root) would
     * put a regular file in its place, over a directory it fails only after
     * the whole file is written. */
    if (lstat(cur, &sb) != 0 || S_ISREG(sb.st_mode)) {
      *out = cur;
      return SBN_STATUS_OK;
    }
    if (!S_ISLNK(sb.st_mode)) {
      sbn_status st = sbn_fail(SBN_STATUS_IO_ERROR, "%s: %s is %s; a checkpoint can only replace a regular file "
                               "(nothing was written)", call, cur, kind_of(sb.st_mode));
      free(cur);
      return st;
    }
    if (hops == SYMLINK_HOPS) {
      free(cur);
      return sbn_fail(SBN_STATUS_IO_ERROR, "%s: %s: more than %d levels of symbolic links", call, path, SYMLINK_HOPS);
    }
    char *target = read_link(cur);
    const int e = errno;
    char *next = target ? join_link(cur, target) : NULL;
    if (!next) {
      sbn_status st = target ? sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call)
                             : sbn_fail(SBN_STATUS_IO_ERROR, "%s: cannot read the symbolic link %s: %s", call, cur,
                                        strerror(e));
      free(target), free(cur);
      return st;
    }
    free(target), free(cur);
    cur = next;
  }
}

/* 64 bits that differ between calls, threads and processes; the O_EXCL
 * retry makes a collision harmless. */
static uint64_t temp_entropy(void) {
  static uint64_t counter; /* atomic */
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t z = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32) ^
               (uint64_t)(uintptr_t)&ts ^ __atomic_add_fetch(&counter, 0x9E3779B97F4A7C15ull, __ATOMIC_RELAXED);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Give the new file the owner and group of the one it replaces (root
 * saving over another user's checkpoint must not take it over). Only root
 * may give a file away, so for anyone else the owner stays theirs: EPERM is
 * what a plain write's result would be too, and is not an error; the group
 * alone is still kept where the caller belongs to it. Before fchmod, since
 * a chown clears the set-user-ID and set-group-ID bits. */
static int keep_owner(int fd, const struct stat *old) {
  struct stat now;
  if (fstat(fd, &now) != 0) return -1;
  if (now.st_uid == old->st_uid && now.st_gid == old->st_gid) return 0;
  if (fchown(fd, old->st_uid, old->st_gid) == 0) return 0;
  if (errno != EPERM) return -1;
  if (now.st_gid == old->st_gid || fchown(fd, (uid_t)-1, old->st_gid) == 0 || errno == EPERM) return 0;
  return -1;
}

int sbn_create_temp(char *tmpl, const char *keep_mode_of) {
  static const char chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const size_t n = strlen(tmpl);
  if (n < 6 || strcmp(tmpl + n - 6, "XXXXXX")) return errno = EINVAL, -1;
  for (int attempt = 0; attempt < 100; attempt++) {
    uint64_t r = temp_entropy();
    for (int i = 0; i < 6; i++, r /= 62) tmpl[n - 6 + i] = chars[r % 62];
    /* Not mkstemp: it creates mode 0600 whatever the umask, and a later
     * fchmod to a fixed mode would ignore the umask. */
    int fd = open(tmpl, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) return -1;
    struct stat sb;
    if (keep_mode_of && stat(keep_mode_of, &sb) == 0 && S_ISREG(sb.st_mode) &&
        (keep_owner(fd, &sb) != 0 || fchmod(fd, sb.st_mode & 07777) != 0)) {
      int e = errno;
      close(fd), unlink(tmpl);
      return errno = e, -1;
    }
    return fd;
  }
  return errno = EEXIST, -1;
}

void sbn_fsize_guard_begin(sbn_fsize_guard *g) {
  sigset_t s, pending;
  sigemptyset(&s);
  sigaddset(&s, SIGXFSZ);
  pthread_sigmask(SIG_BLOCK, &s, &g->old);
  g->was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ) == 1;
}

void sbn_fsize_guard_end(sbn_fsize_guard *g, int raised) {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGXFSZ);
  /* The kernel sends SIGXFSZ to the writing thread, so it is pending here
   * and taken before a process-directed one. Standard signals do not
   * queue: one pending before the write cannot be told from ours and is
   * left alone. */
  if (raised && !g->was_pending) {
    const struct timespec zero = {0, 0};
    while (sigtimedwait(&s, NULL, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

long long sbn_file_size_limit(void) {
  struct rlimit r;
  if (getrlimit(RLIMIT_FSIZE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return -1;
  return (long long)r.rlim_cur;
}

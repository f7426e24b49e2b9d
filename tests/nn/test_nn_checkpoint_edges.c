/* Checkpoints at the edges of the format:
 * - the data checksum of a tensor of 4 GiB or more (zlib's crc32 takes a
 *   32-bit length), computed on untouched anonymous memory, so no 4 GiB file
 *   is written. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
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

/* Arguments name the parts to run (crc); none: all. */
static int wanted(int argc, char **argv, const char *part) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], part)) return 1;
  return argc < 2;
}

int main(int argc, char **argv) {
  char dir[] = "/tmp/sbn_edges_XXXXXX";
  if (!mkdtemp(dir)) return 1;
  if (wanted(argc, argv, "crc")) test_crc_over_4gib();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) printf("warning: could not remove %s\n", dir);
  printf("%s (%d failures)\n", failures ? "FAILED" : "all ok", failures);
  return failures ? 1 : 0;
}

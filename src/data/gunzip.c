/* Datasets as they are distributed: MNIST's files come gzipped
 * (train-images-idx3-ubyte.gz). zlib inflates them in memory; a file that
 * is not gzip passes through unchanged. A file of several gzip members
 * (cat a.gz b.gz, bgzip, pigz -i) inflates to their concatenation and zero
 * padding after the last member is ignored, as gzip, zcat and Python read it. */
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "dataset_io.h"

/* Inflated data above this is refused (a corrupt or hostile size field must
 * not exhaust memory; the largest real dataset file here is ~50 MB). */
#define SBN_GUNZIP_MAX ((size_t)1 << 32)

static int all_zero(const unsigned char *p, size_t n) {
  while (n && !*p) p++, n--;
  return n == 0;
}

sbn_status sbn_gunzip_if_needed(unsigned char **data, size_t *size, const char *path) {
  if (*size < 2 || (*data)[0] != 0x1f || (*data)[1] != 0x8b) return SBN_STATUS_OK;
  z_stream z;
  memset(&z, 0, sizeof z);
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) /* 16: gzip wrapper */
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: cannot start zlib", path);
  size_t cap = *size * 4 + 4096, len = 0;
  unsigned char *out = malloc(cap);
  int zr = Z_OK;
  z.next_in = *data;
  z.avail_in = 0;
  size_t in_left = *size;
  int member = 1, done = 0;
  while (out && !done) {
    if (len == cap) {
      if (cap >= SBN_GUNZIP_MAX) break;
      unsigned char *bigger = realloc(out, cap * 2);
      if (!bigger) free(out);
      out = bigger, cap *= 2;
      if (!out) break;
    }
    if (z.avail_in == 0 && in_left) {
      z.avail_in = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
      in_left -= z.avail_in;
    }
    size_t room = cap - len > (1u << 30) ? (1u << 30) : cap - len;
    z.next_out = out + len;
    z.avail_out = (uInt)room;
    zr = inflate(&z, Z_NO_FLUSH);
    len += room - z.avail_out;
    if (zr == Z_STREAM_END) {
      /* The remaining input follows z.next_in contiguously. */
      size_t rest = z.avail_in + in_left;
      if (rest == 0 || all_zero(z.next_in, rest)) done = 1;
      else if ((zr = inflateReset(&z)) != Z_OK) break;
      else member++;
    } else if (zr != Z_OK && !(zr == Z_BUF_ERROR && z.avail_out == 0)) break;
  }
  inflateEnd(&z);
  if (!out) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory inflating", path);
  if (!done) {
    free(out);
    if (len >= SBN_GUNZIP_MAX) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: inflates to more than 4 GiB", path);
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: corrupt or truncated gzip data in member %d (%s)", path, member,
                    z.msg ? z.msg : "unexpected end");
  }
  free(*data);
  *data = out, *size = len;
  return SBN_STATUS_OK;
}

/* The elementwise passes, bit for bit against their definition: per value,
 * for 16-bit storage in float32, y = ((x - hi) - lo) * a + b and
 * dx = (a * dy - b) - c * ((x - hi) - lo) (mean = hi + lo), rounded once to
 * the storage type by the scalar conversions of half.h (themselves checked
 * against F16C and the definition of round-to-nearest-even in
 * test_cpu_dtypes); for float32 storage the same in float64 with the mean
 * whole, rounded once to float32.
 *
 * Every vector path must give those bits: bfloat16's 16 values as even and
 * odd positions with permuted channels-last coefficients, the 16-bit types'
 * 16-value zmm path (AVX-512; bfloat16 with AVX512_BF16), the 8-value path,
 * the scalar tails, streamed stores, short channels-first rows as one flat
 * stream, wide channels-last rows (C >= 1024: 2100 x 20 rows, and 1035 x
 * 21 rows, whose channels end in an 8-value step and a scalar tail; they
 * once went four rows a step), wide streamed channels-last
 * rows in channel blocks (2100 x 1040 rows); in every instruction set this
 * CPU runs, with 1 and 2 threads. Inputs include NaN (quiet and signalling,
 * with payloads), infinities, zeros of both signs, subnormals, channels
 * whose scale is 1 + 2^-8, which puts products of bfloat16 values exactly
 * halfway between two bfloat16 values (ties), and channels whose bias or
 * mean is a NaN with a full payload (its low 16 bits set: the rounding must
 * not carry them into the sign). Channels scaled to the bottom of the
 * storage type's range give subnormal results (ties among them, and values
 * that round up to the smallest normal: vcvtneps2bf16 flushes subnormals, so
 * the avx512bf16 level must redo them), channels scaled to its top
 * overflow to infinity, and identity channels pass subnormal inputs through.
 * Tolerance: 0 differing values (NaN results: any NaN, see differs()). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/cpu/bn_kernels.h"
#include "cpu_data.h"

/* Storage value i as a float (exact), and a float rounded to storage. */
static float ld(const void *p, int64_t i, sbn_dtype dt) {
  float v;
  from_storage(&v, (const char *)p + i * (int64_t)dt_size(dt), 1, dt);
  return v;
}
static uint32_t st(float v, sbn_dtype dt) {
  union { float f; uint16_t h; double d; } b = {0}; /* written as its storage type (not float64 here) */
  uint32_t u = 0;
  if (dt == SBN_DTYPE_FLOAT32) to_storage(&b.f, &v, 1, dt);
  else to_storage(&b.h, &v, 1, dt);
  memcpy(&u, &b, dt_size(dt) < 4 ? dt_size(dt) : 4);
  return u;
}
static uint32_t bits(const void *p, int64_t i, sbn_dtype dt) {
  uint32_t u = 0; /* 16 or 32 bits (float64 has its own check below) */
  memcpy(&u, (const char *)p + i * (int64_t)dt_size(dt), dt_size(dt) < 4 ? dt_size(dt) : 4);
  return u;
}

/* A stored result against the value it should round from. NaN payloads are
 * not compared: where two NaNs meet (a NaN x and a NaN bias), which payload
 * survives depends on the order of the operands of a commutative operation,
 * which the compiler may swap; the result must still be a NaN (not an
 * infinity or a zero that a carry out of the payload would give). */
static int differs(uint32_t got, float want, sbn_dtype dt) {
  if (want != want) {
    const uint32_t a = dt == SBN_DTYPE_FLOAT32 ? got & 0x7fffffffu : got & 0x7fffu;
    return !(a > (dt == SBN_DTYPE_FLOAT32 ? 0x7f800000u : dt == SBN_DTYPE_BFLOAT16 ? 0x7f80u : 0x7c00u));
  }
  return got != st(want, dt);
}

/* A storage value: mostly N(0, 2), some special ones. */
static void value(void *p, int64_t i, rng *r, sbn_dtype dt) {
  static const float specials[] = {0, -0.0f, INFINITY, -INFINITY, 1e-40f /* subnormal */};
  float v = (float)(2.0 * rng_normal(r));
  const int k = rng_int(r, 0, 63);
  if (k < 5) v = specials[k];
  to_storage((char *)p + i * (int64_t)dt_size(dt), &v, 1, dt);
  if (k == 5 || k == 6) { /* NaN with a payload, quiet or signalling, either sign */
    const uint32_t u = dt == SBN_DTYPE_FLOAT32 ? (k == 5 ? 0x7fc00123u : 0xff800321u)
                       : dt == SBN_DTYPE_BFLOAT16 ? (k == 5 ? 0x7fc1u : 0xff81u)
                                                  : (k == 5 ? 0x7e01u : 0xfc01u);
    memcpy((char *)p + i * (int64_t)dt_size(dt), &u, dt_size(dt));
  }
}

/* The storage type's smallest normal and largest finite magnitudes' powers of two. */
static double tiny(sbn_dtype dt) { return dt == SBN_DTYPE_FLOAT16 ? 0x1p-14 : 0x1p-126; }
static double huge(sbn_dtype dt) { return dt == SBN_DTYPE_FLOAT16 ? 0x1p14 : 0x1p126; }

/* A stored value's class: 1 subnormal, 2 infinite, 0 otherwise. */
static int cls(uint32_t u, sbn_dtype dt) {
  const uint32_t a = dt == SBN_DTYPE_FLOAT32 ? u & 0x7fffffffu : u & 0x7fffu;
  const uint32_t inf = dt == SBN_DTYPE_FLOAT32 ? 0x7f800000u : dt == SBN_DTYPE_BFLOAT16 ? 0x7f80u : 0x7c00u;
  const uint32_t minn = dt == SBN_DTYPE_FLOAT32 ? 0x00800000u : dt == SBN_DTYPE_BFLOAT16 ? 0x0080u : 0x0400u;
  return a == inf ? 2 : a != 0 && a < minn ? 1 : 0;
}

static int isas_run(void) {
  int k = 0;
  for (int i = 0; i < sbn_cpu_isa_count(); i++) k += sbn_cpu_isa_supported(i);
  return k;
}

static int one(sbn_dtype dt, sbn_layout lay, int64_t N, int64_t C, int64_t S, int stream, rng *r) {
  const int64_t n = N * C * S;
  const size_t es = dt_size(dt);
  void *x = malloc(es * n), *dy = malloc(es * n), *y = malloc(es * n), *dx = malloc(es * n);
  double *mean = malloc(8 * C), *a = malloc(8 * C), *b = malloc(8 * C), *c = malloc(8 * C);
  for (int64_t i = 0; i < n; i++) value(x, i, r, dt), value(dy, i, r, dt);
  for (int64_t ch = 0; ch < C; ch++) {
    const int tie = ch % 5 == 1; /* x * (1 + 2^-8): ties for bfloat16 */
    mean[ch] = tie ? 0 : 0.5 * rng_normal(r) + 1e-9 * rng_normal(r); /* a lo part */
    a[ch] = tie ? 1 + 0x1p-8 : 1 + rng_normal(r);
    b[ch] = tie ? 0 : rng_normal(r);
    c[ch] = rng_normal(r);
    const int kind = tie ? 0 : ch % 6; /* 2: subnormal results, 4: overflow, 5: identity */
    if (kind == 2 || kind == 4 || kind == 5) {
      mean[ch] = 0, b[ch] = 0;
      a[ch] = kind == 2 ? tiny(dt) : kind == 4 ? huge(dt) * (1 + 0x1p-8) : 1;
      c[ch] = kind == 2 ? -tiny(dt) * 0.75 : kind == 4 ? huge(dt) : 0;
    }
    /* NaN coefficients whose float32 payload is all ones: rounding them
     * as numbers would carry into the sign (+0 or -0 instead of NaN) */
    const uint64_t nan_bits = ch % 7 == 3 ? 0x7fffffffffffffffull : 0xffffffffffffffffull;
    if (ch % 7 == 3) memcpy(&b[ch], &nan_bits, 8);
    if (ch % 7 == 5) memcpy(&mean[ch], &nan_bits, 8);
  }
  sbn_geom g = {N, C, S, lay, dt};
  sbn_cpu_ws ws = {NULL, 0, 1};
  if (sbn_cpu_ws_reserve(&ws, g)) return 1;
  double diff_y = 0, diff_dx = 0, nan_seen = 0, sub_seen = 0, inf_seen = 0;
  int bad = 0;
  for (int isa = 0; isa < sbn_cpu_isa_count(); isa++) {
    if (!sbn_cpu_isa_supported(isa)) continue;
    sbn_cpu_set_isa(isa);
    for (int t = 1; t <= 2; t++) {
      ws.threads = t;
      memset(y, 0xa5, es * n), memset(dx, 0xa5, es * n);
      sbn_cpu_normalize(&ws, y, x, g, mean, a, b);
      sbn_cpu_backward_elemt(&ws, dx, dy, x, g, mean, a, b, c);
      for (int64_t i = 0; i < n; i++) {
        const int64_t ch = lay == SBN_LAYOUT_CHANNELS_LAST ? i % C : i / S % C;
        float vy, vdx;
        if (dt == SBN_DTYPE_FLOAT32) { /* float64 arithmetic, one rounding */
          const double xm = (double)ld(x, i, dt) - mean[ch];
          vy = (float)(xm * a[ch] + b[ch]);
          vdx = (float)((a[ch] * (double)ld(dy, i, dt) - b[ch]) - c[ch] * xm);
        } else { /* float32 with the mean split in hi + lo */
          const float hi = (float)mean[ch], lo = (float)(mean[ch] - (double)hi);
          const float fa = (float)a[ch], fb = (float)b[ch], fc = (float)c[ch];
          const float xm = (ld(x, i, dt) - hi) - lo;
          vy = xm * fa + fb;
          vdx = (fa * ld(dy, i, dt) - fb) - fc * xm;
        }
        diff_y += differs(bits(y, i, dt), vy, dt);
        diff_dx += differs(bits(dx, i, dt), vdx, dt);
        nan_seen += vy != vy;
        sub_seen += cls(st(vy, dt), dt) == 1, inf_seen += cls(st(vy, dt), dt) == 2 && isfinite(ld(x, i, dt));
      }
    }
  }
  printf("%s %s %lldx%lldx%lld%s: %lld values x %d instruction set(s) x 2 thread counts, %.0f NaN, %.0f "
         "subnormal, %.0f overflowed outputs in all\n",
         dt_name(dt), lay ? "CL" : "CF", (long long)N, (long long)C, (long long)S, stream ? " (streamed)" : "",
         (long long)n, isas_run(), nan_seen, sub_seen, inf_seen);
  bad |= check("  y values differing from the definition", diff_y, 0);
  bad |= check("  dx values differing from the definition", diff_dx, 0);
  bad |= check("  evidence: NaN inputs reached the outputs (0: yes)", nan_seen > 0 ? 0 : 1, 0);
  bad |= check("  evidence: subnormal and overflowed outputs (0: yes)", sub_seen > 0 && inf_seen > 0 ? 0 : 1, 0);
  sbn_cpu_ws_free(&ws);
  free(x), free(dy), free(y), free(dx), free(mean), free(a), free(b), free(c);
  return bad;
}

/* float64 storage (a float64 layer): the same definitions in float64, no
 * rounding after the last operation; values of full precision and the
 * specials of float64 (NaN payloads, infinities, signed zeros, subnormals).
 * Bits compared as 64-bit words; NaN results: any NaN. */
static double value64(rng *r) {
  static const double specials[] = {0, -0.0, INFINITY, -INFINITY, 4e-320 /* subnormal */};
  const int k = rng_int(r, 0, 63);
  if (k < 5) return specials[k];
  if (k == 5 || k == 6) {
    const uint64_t u = k == 5 ? 0x7ff8000000000123ull : 0xfff0000000000321ull; /* quiet, signalling */
    double v;
    memcpy(&v, &u, 8);
    return v;
  }
  return 2.0 * rng_normal(r);
}

static int differs64(double got, double want) {
  if (want != want) return got == got;
  return memcmp(&got, &want, 8) != 0;
}

static int one_f64(sbn_layout lay, int64_t N, int64_t C, int64_t S, int stream, rng *r) {
  const int64_t n = N * C * S;
  double *x = malloc(8 * n), *dy = malloc(8 * n), *y = malloc(8 * n), *dx = malloc(8 * n);
  double *mean = malloc(8 * C), *a = malloc(8 * C), *b = malloc(8 * C), *c = malloc(8 * C);
  for (int64_t i = 0; i < n; i++) x[i] = value64(r), dy[i] = value64(r);
  for (int64_t ch = 0; ch < C; ch++) {
    mean[ch] = 0.5 * rng_normal(r) + 1e-9 * rng_normal(r);
    a[ch] = 1 + rng_normal(r), b[ch] = rng_normal(r), c[ch] = rng_normal(r);
    if (ch % 7 == 3) b[ch] = NAN;
  }
  sbn_geom g = {N, C, S, lay, SBN_DTYPE_FLOAT64};
  sbn_cpu_ws ws = {NULL, 0, 1};
  if (sbn_cpu_ws_reserve(&ws, g)) return 1;
  double diff_y = 0, diff_dx = 0, nan_seen = 0;
  for (int isa = 0; isa < sbn_cpu_isa_count(); isa++) {
    if (!sbn_cpu_isa_supported(isa)) continue;
    sbn_cpu_set_isa(isa);
    for (int t = 1; t <= 2; t++) {
      ws.threads = t;
      memset(y, 0xa5, 8 * n), memset(dx, 0xa5, 8 * n);
      sbn_cpu_normalize(&ws, y, x, g, mean, a, b);
      sbn_cpu_backward_elemt(&ws, dx, dy, x, g, mean, a, b, c);
      for (int64_t i = 0; i < n; i++) {
        const int64_t ch = lay == SBN_LAYOUT_CHANNELS_LAST ? i % C : i / S % C;
        const double xm = x[i] - mean[ch];
        const double vy = xm * a[ch] + b[ch], vdx = (a[ch] * dy[i] - b[ch]) - c[ch] * xm;
        diff_y += differs64(y[i], vy), diff_dx += differs64(dx[i], vdx);
        nan_seen += vy != vy;
      }
    }
  }
  printf("float64 %s %lldx%lldx%lld%s: %lld values x %d instruction set(s) x 2 thread counts, %.0f NaN outputs in all\n",
         lay ? "CL" : "CF", (long long)N, (long long)C, (long long)S, stream ? " (streamed size)" : "", (long long)n,
         isas_run(), nan_seen);
  int bad = check("  y values differing from the definition", diff_y, 0);
  bad |= check("  dx values differing from the definition", diff_dx, 0);
  bad |= check("  evidence: NaN inputs reached the outputs (0: yes)", nan_seen > 0 ? 0 : 1, 0);
  sbn_cpu_ws_free(&ws);
  free(x), free(dy), free(y), free(dx), free(mean), free(a), free(b), free(c);
  return bad;
}

int main(void) {
  const int isa = sbn_cpu_get_isa();
  rng r = rng_seed(77);
  int bad = 0;
  /* C = 45 = 2 x 16 + 8 + 5 (every width of the rows layout); S = 29 =
   * 16 + 8 + 5 per channels-first row; 3x45x29 = 3915 values: one thread.
   * 8x160x41 = 52480 values: several units and threads, rows of 160.
   * 4x2100x5: rows layout's reductions in channel blocks of 512-1024 and a
   * short last one; elementwise passes 4 rows a step. 3x1035x7: 4 rows a
   * step, then a last row alone. */
  static const int64_t shapes[][3] = {{3, 45, 29}, {8, 160, 41}, {5, 7, 1000}, {4, 2100, 5}, {3, 1035, 7}};
  const sbn_dtype dts[] = {SBN_DTYPE_BFLOAT16, SBN_DTYPE_FLOAT16, SBN_DTYPE_FLOAT32};
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < 5; s++)
      for (int lay = 0; lay < 2; lay++)
        bad |= one(dts[d], (sbn_layout)lay, shapes[s][0], shapes[s][1], shapes[s][2], 0, &r);
  /* Streamed stores: outputs of at least SYNCBN_STREAM_MIB (4 MiB by default);
   * channels-first rows of 4608 bytes, and of 1090 bytes (streamed from
   * 1 KiB), most of them starting off the 32-byte alignment of the stores. */
  for (int d = 0; d < 3; d++)
    for (int lay = 0; lay < 2; lay++) {
      bad |= one(dts[d], (sbn_layout)lay, 4, 256, 2304, 1, &r);
      bad |= one(dts[d], (sbn_layout)lay, 4, 1100, 545, 1, &r);
    }
  /* Wide streamed channels-last rows go in channel blocks of 1024 (here
   * 1024 + 1024 + 52, the last with a tail of 4 after 48 channels). */
  for (int d = 0; d < 3; d++) bad |= one(dts[d], SBN_LAYOUT_CHANNELS_LAST, 4, 2100, 260, 1, &r);
  /* Channels-first rows under 1 KiB stream as one flat run per hand-out
   * (14x14-like rows of 250 values; rows of 13, odd, several per vector
   * boundary), vectors spanning two channels. */
  for (int d = 0; d < 3; d++) {
    bad |= one(dts[d], SBN_LAYOUT_CHANNELS_FIRST, 8, 1100, 250, 1, &r);
    bad |= one(dts[d], SBN_LAYOUT_CHANNELS_FIRST, 16, 6007, 13, 1, &r);
    bad |= one(dts[d], SBN_LAYOUT_CHANNELS_FIRST, 16, 2701, 49, 1, &r); /* 7x7 */
  }
  /* Unstreamed flat runs (64 KiB and more) of rows of 16, 17 and 49 values:
   * bfloat16 below AVX-512 takes 16-value steps only, from a 32-byte
   * boundary, the vectors spanning two channels blended (a spanning vector
   * at every position of its 16, rows that end exactly on a vector). */
  for (int d = 0; d < 3; d++) {
    bad |= one(dts[d], SBN_LAYOUT_CHANNELS_FIRST, 8, 300, 16, 0, &r);
    bad |= one(dts[d], SBN_LAYOUT_CHANNELS_FIRST, 7, 301, 17, 0, &r);
    bad |= one(dts[d], SBN_LAYOUT_CHANNELS_FIRST, 8, 100, 49, 0, &r);
  }
  /* float64: the same shapes (every width and tail of its 4-double
   * vectors), and sizes past the streaming threshold, where the 16-bit and
   * float32 paths switch to streamed and flat stores (float64 does not). */
  for (int s = 0; s < 3; s++)
    for (int lay = 0; lay < 2; lay++) bad |= one_f64((sbn_layout)lay, shapes[s][0], shapes[s][1], shapes[s][2], 0, &r);
  for (int lay = 0; lay < 2; lay++) bad |= one_f64((sbn_layout)lay, 4, 1100, 545, 1, &r);
  bad |= one_f64(SBN_LAYOUT_CHANNELS_FIRST, 16, 6007, 13, 1, &r);
  sbn_cpu_set_isa(isa);
  printf(bad ? "\nELEMENTWISE BIT CHECKS FAILED\n" : "\nall elementwise bit checks passed\n");
  return bad;
}

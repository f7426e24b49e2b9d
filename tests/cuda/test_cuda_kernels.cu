/* The CUDA kernels of the four passes (src/cuda/bn_kernels_cuda.h), called
 * directly on device buffers, against the float64 reference
 * (kernel_ref.h), for float32/bfloat16/float16 storage x both layouts x
 * shapes from ResNet-50's (at small N, and (32, 2048, 7, 7) whole) to odd
 * sizes (rows not a multiple of the vector width, S = 1, C = 1, long rows cut
 * into segments, many row tiles), channels whose mean is 1e4 x their
 * standard deviation, and the empty input. Also:
 *  - bitwise repeatability: each reduction run twice, memcmp;
 *  - the vector width does not change a bit: the same data at a pointer
 *    offset by one value (scalar loads) gives the same bits as aligned data
 *    (vector loads), for all four passes;
 *  - y aliasing x, dx aliasing dy, dx aliasing x: the same bits as separate
 *    buffers;
 *  - y and dx have the bits of the CPU kernels (src/cpu) given the same
 *    coefficients: both perform the same operations in the same order;
 *  - empty input: zero sums and count, no tensor touched; a workspace that
 *    was not reserved is an error, not an overrun.
 *
 * Tolerances (u = 2^-24, the float32 unit roundoff).
 *  - Reductions: the kernels accumulate in float64 from the first value on
 *    (bn_reduce.cu), so their sums are exact up to float64 rounding: at
 *    most n 2^-53 of the summed magnitudes, < 1e-10 for the n <= 4e5 values
 *    per channel here. Tolerance 1e-9 of the summed magnitudes:
 *    mean: 1e-9 mean|x - k| (k: the shift, the channel's first value);
 *    variance, computed as the layer does (sumsq/n - (sum/n)^2):
 *      1e-9 mean((x - k)^2) + 8 * 2^-52 mean^2 — the second term is the
 *      cancellation the payload format itself costs (ARCHITECTURE.md:
 *      ~1e-16 (mean/std)^2 relative), tiny next to the 2e-6 relative that
 *      the CPU tests allow a float32 result;
 *    sum_dy, sum_dy_xmu: 1e-9 sum|term|.
 *    Float32 accumulation would miss these by 10^2 (benign data) to 10^6
 *    (mean = 1e4 x std); a shifted-sum error by more.
 *  - y and dx, per value (bn_elemt.cu: float64 arithmetic for float32
 *    storage, float32 with a split mean for 16 bits): half an ulp of
 *    the storage type relative to the value (2^-8 bfloat16, 2^-11 float16,
 *    2^-24 float32), plus 5 u times the magnitudes of the terms
 *    (|x - mean| |scale|, |bias|, |y|; |a dy|, |b|, |c (x - mean)|, |dx|:
 *    each float32 operation and each coefficient conversion rounds once
 *    relative to one of them), plus 2 u^2 |mean| x the multiplier (the split
 *    mean's own error), plus 2^-24 absolute for float16's subnormal steps.
 * A kernel that summed a value twice or missed one, used another channel's
 * coefficients, accumulated in float32, or lost the split mean exceeds
 * these by orders of magnitude (the ill-conditioned cases above all).
 *
 * Without a CUDA device it prints "SKIP: no CUDA device" and exits 0.
 * Compiled as C++ with -DSBN_KERNEL_TEST_ON_CPU, it runs on the CPU against
 * the CPU kernels (cpu_shim.h): a check of this test, not of the GPU.
 * --quick leaves out the cases above 500000 values. */
#ifdef SBN_KERNEL_TEST_ON_CPU
#include "cpu_shim.h"
#else
#include <cuda_runtime.h>
#endif
#include <math.h>

#include <cmath>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" { /* C headers without C++ guards */
#include "../../src/cpu/bn_kernels.h"
#include "../../src/cpu/half.h"
}
#include "../../src/cuda/bn_kernels_cuda.h"
#include "kernel_ref.h"

#define CK(call)                                                                             \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      printf("FAIL: %s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)
#define KK(call)                                                                           \
  do {                                                                                     \
    int e_ = (call);                                                                       \
    if (e_ != 0) {                                                                         \
      printf("FAIL: %s returned %d (%s) (%s:%d)\n", #call, e_,                            \
             cudaGetErrorString((cudaError_t)e_), __FILE__, __LINE__);                     \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

static const double U = 0x1p-24;

/* ---- data ---- */

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double)(next() >> 11) * 0x1p-53; }
  double normal() {
    double a = uniform(), b = uniform();
    return sqrt(-2.0 * log(a + 0x1p-60)) * cos(6.283185307179586 * b);
  }
};

static size_t dt_size(sbn_dtype dt) { return dt == SBN_DTYPE_FLOAT32 ? 4 : 2; }
static const char *dt_name(sbn_dtype dt) {
  return dt == SBN_DTYPE_FLOAT32 ? "f32" : dt == SBN_DTYPE_BFLOAT16 ? "bf16" : "f16";
}
static double half_ulp(sbn_dtype dt) {
  return dt == SBN_DTYPE_BFLOAT16 ? 0x1p-8 : dt == SBN_DTYPE_FLOAT16 ? 0x1p-11 : 0x1p-24;
}

/* value -> storage (round to nearest even), storage -> exact double */
static void put(void *buf, int64_t i, double v, sbn_dtype dt) {
  const float f = (float)v;
  if (dt == SBN_DTYPE_FLOAT32) ((float *)buf)[i] = f;
  else if (dt == SBN_DTYPE_BFLOAT16) ((uint16_t *)buf)[i] = sbn_f32_to_bf16(f);
  else ((uint16_t *)buf)[i] = sbn_f32_to_f16(f);
}
static double get(const void *buf, int64_t i, sbn_dtype dt) {
  if (dt == SBN_DTYPE_FLOAT32) return ((const float *)buf)[i];
  if (dt == SBN_DTYPE_BFLOAT16) return sbn_bf16_to_f32(((const uint16_t *)buf)[i]);
  return sbn_f16_to_f32(((const uint16_t *)buf)[i]);
}

/* A device buffer of `bytes` with one spare value in front: at(0) is
 * aligned as cudaMalloc's memory is, at(1) one value further (forcing scalar
 * loads for the kernels' groups). */
struct DevBuf {
  char *base = nullptr;
  size_t es = 4, bytes = 0;
  void alloc(size_t b, size_t e) {
    es = e, bytes = b;
    CK(cudaMalloc(&base, b + 16));
  }
  void *at(int off) { return base + off * es; }
  ~DevBuf() {
    if (base) cudaFree(base);
  }
};

static int g_failed = 0, g_cases = 0;

/* ratio = err / tol over a set: the worst one and whether it passed */
struct Worst {
  double ratio = 0, err = 0;
  void add(double err_, double tol) {
    const double q = err_ / tol;
    if (!(q <= ratio)) ratio = q; /* NaN sticks */
    if (!(err_ <= err)) err = err_;
  }
};

static int report(const char *what, const Worst &w) {
  const int bad = !(w.ratio <= 1.0);
  printf("    %-26s max err %.3e  err/tol %.3f%s\n", what, w.err, w.ratio, bad ? "  FAIL" : "");
  return bad;
}
static int expect(const char *what, int ok) {
  if (!ok) printf("    %-26s FAIL\n", what);
  return !ok;
}

static bool same_bytes(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

template <class T> static std::vector<T> d2h(const void *d, size_t n) {
  std::vector<T> h(n ? n : 1);
  if (n) CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

/* ---- one case ---- */

static int run_case(cudaStream_t st, sbn_dtype dt, sbn_layout layout, int64_t N, int64_t C, int64_t S,
                    double mean_scale, uint64_t seed) {
  const int cl = layout == SBN_LAYOUT_CHANNELS_LAST;
  const int64_t numel = N * C * S;
  const size_t es = dt_size(dt), bytes = (size_t)numel * es;
  printf("%s %s N=%lld C=%lld S=%lld mean=%gxstd\n", dt_name(dt), cl ? "CL" : "CF", (long long)N,
         (long long)C, (long long)S, mean_scale);
  g_cases++;
  int bad = 0;
  Rng r{seed};

  /* x: per channel N(mean, std), mean = (u - 0.3) * scale * std; dy: N(0.2 c-offset, 1) */
  std::vector<double> cmean(C), cstd(C), w(C), b(C), dyoff(C);
  for (int64_t c = 0; c < C; c++) {
    cstd[c] = 0.5 + r.uniform();
    cmean[c] = (r.uniform() - 0.3) * mean_scale * cstd[c];
    w[c] = 0.5 + r.uniform(), b[c] = r.uniform() - 0.5, dyoff[c] = 0.4 * (r.uniform() - 0.5);
  }
  std::vector<char> hx(bytes + 16), hdy(bytes + 16);
  std::vector<double> xd(numel ? numel : 1), dyd(numel ? numel : 1);
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t s = 0; s < S; s++) {
        const int64_t i = kref_index(N, C, S, cl, n, c, s);
        put(hx.data(), i, cmean[c] + cstd[c] * r.normal(), dt);
        put(hdy.data(), i, dyoff[c] + r.normal(), dt);
        xd[i] = get(hx.data(), i, dt), dyd[i] = get(hdy.data(), i, dt);
      }

  DevBuf dx_, ddy, dout, dtmp;
  dx_.alloc(bytes, es), ddy.alloc(bytes, es), dout.alloc(bytes, es), dtmp.alloc(bytes, es);
  CK(cudaMemcpy(dx_.at(0), hx.data(), bytes, cudaMemcpyHostToDevice));
  /* the same data one value past an aligned address (u*: scalar loads) */
  DevBuf ux, udy, uout;
  ux.alloc(bytes, es), udy.alloc(bytes, es), uout.alloc(bytes, es);
  CK(cudaMemcpy(ux.at(1), hx.data(), bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(ddy.at(0), hdy.data(), bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(udy.at(1), hdy.data(), bytes, cudaMemcpyHostToDevice));

  sbn_geom g = {N, C, S, layout, dt};
  sbn_cuda_ws ws = {};
  KK(sbn_cuda_ws_reserve(&ws, g));
  double *dsum; /* device per-channel arrays: 2 results, count, mean, 3 coefficients */
  CK(cudaMalloc(&dsum, sizeof(double) * (size_t)(6 * C + 1)));
  double *d_s1 = dsum, *d_s2 = dsum + C, *d_cnt = dsum + 2 * C, *d_mean = dsum + 2 * C + 1;
  double *d_a = d_mean + C, *d_b = d_a + C, *d_c = d_b + C;
  sbn_cuda_stream s = (sbn_cuda_stream)st;

  /* ---- reference statistics ---- */
  std::vector<double> rmean(C), rm2(C), rabs(C), rsq(C);
  kref_stats(xd.data(), N, C, S, cl, rmean.data(), rm2.data(), rabs.data());
  for (int64_t c = 0; c < C; c++) { /* mean((x - k)^2) = var + (mean - k)^2 */
    const double k = N * S > 0 ? xd[kref_index(N, C, S, cl, 0, c, 0)] : 0;
    rsq[c] = N * S > 0 ? rm2[c] / (double)(N * S) + (rmean[c] - k) * (rmean[c] - k) : 0;
  }
  const double n = (double)(N * S);

  /* ---- statistics ---- */
  KK(sbn_cuda_stats(&ws, s, d_s1, d_s2, d_cnt, dx_.at(0), g));
  CK(cudaStreamSynchronize(st));
  std::vector<double> st1 = d2h<double>(dsum, (size_t)(2 * C + 1));
  KK(sbn_cuda_stats(&ws, s, d_s1, d_s2, d_cnt, dx_.at(0), g));
  std::vector<double> st2 = d2h<double>(dsum, (size_t)(2 * C + 1));
  bad |= expect("stats repeat: same bits", same_bytes(st1.data(), st2.data(), sizeof(double) * (2 * C + 1)));
  KK(sbn_cuda_stats(&ws, s, d_s1, d_s2, d_cnt, ux.at(1), g));
  std::vector<double> st3 = d2h<double>(dsum, (size_t)(2 * C + 1));
  bad |= expect("stats unaligned: same bits", same_bytes(st1.data(), st3.data(), sizeof(double) * (2 * C + 1)));
  bad |= expect("count = N*S", st1[2 * C] == n);
  Worst wm, wv;
  for (int64_t c = 0; c < C; c++) {
    const double gm = st1[c] / n, gv = st1[C + c] / n - gm * gm, rv = rm2[c] / n;
    wm.add(fabs(gm - rmean[c]), 1e-9 * rabs[c] + 1e-15 * fabs(rmean[c]) + 1e-300);
    wv.add(fabs(gv - rv), 1e-9 * rsq[c] + 8 * 0x1p-52 * rmean[c] * rmean[c] + 1e-300);
  }
  bad |= report("mean", wm);
  bad |= report("var (sumsq/n - mean^2)", wv);

  /* ---- coefficients from the reference statistics, as a layer would form them ---- */
  std::vector<double> invstd(C), scale(C), bias(C);
  for (int64_t c = 0; c < C; c++) {
    invstd[c] = 1.0 / sqrt(rm2[c] / n + 1e-5);
    scale[c] = w[c] * invstd[c], bias[c] = b[c];
  }
  CK(cudaMemcpy(d_mean, rmean.data(), sizeof(double) * C, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_a, scale.data(), sizeof(double) * C, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_b, bias.data(), sizeof(double) * C, cudaMemcpyHostToDevice));

  /* ---- normalize ---- */
  KK(sbn_cuda_normalize(s, dout.at(0), dx_.at(0), g, d_mean, d_a, d_b));
  std::vector<char> hy = d2h<char>(dout.at(0), bytes);
  {
    Worst wy;
    double ymax = 0;
    for (int64_t i = 0; i < numel; i++) {
      const int64_t c = cl ? i % C : (i / S) % C;
      const double ref = kref_norm(xd[i], rmean[c], scale[c], bias[c]), got = get(hy.data(), i, dt);
      const double mag = fabs((xd[i] - rmean[c]) * scale[c]) + fabs(bias[c]) + fabs(ref);
      const double tol = half_ulp(dt) * fabs(ref) + 5 * U * mag + 2 * U * U * fabs(rmean[c] * scale[c]) +
                         (dt == SBN_DTYPE_FLOAT16 ? 0x1p-24 : 1e-300);
      wy.add(fabs(got - ref), tol);
      ymax = fmax(ymax, fabs(ref));
    }
    bad |= report("y", wy);
    if (N * S >= 8) bad |= expect("evidence: max |y| > 0.5", ymax > 0.5);
  }
  std::vector<char> hcpu(bytes + 16);
  sbn_cpu_ws cws = {NULL, 0, 1};
  if (sbn_cpu_ws_reserve(&cws, g) != 0) {
    printf("FAIL: out of memory\n");
    exit(1);
  }
  if (numel) sbn_cpu_normalize(&cws, hcpu.data(), hx.data(), g, rmean.data(), scale.data(), bias.data());
  bad |= expect("y = the CPU kernels' bits", same_bytes(hy.data(), hcpu.data(), bytes));
  KK(sbn_cuda_normalize(s, uout.at(1), ux.at(1), g, d_mean, d_a, d_b));
  bad |= expect("y unaligned: same bits", same_bytes(hy.data(), d2h<char>(uout.at(1), bytes).data(), bytes));
  CK(cudaMemcpy(dtmp.at(0), dx_.at(0), bytes, cudaMemcpyDeviceToDevice));
  KK(sbn_cuda_normalize(s, dtmp.at(0), dtmp.at(0), g, d_mean, d_a, d_b));
  bad |= expect("y in place (y = x): same bits", same_bytes(hy.data(), d2h<char>(dtmp.at(0), bytes).data(), bytes));

  /* ---- backward reduce ---- */
  std::vector<double> rsdy(C), rsdx(C), rady(C), radx(C);
  kref_bred(xd.data(), dyd.data(), N, C, S, cl, rmean.data(), rsdy.data(), rsdx.data(), rady.data(), radx.data());
  KK(sbn_cuda_backward_reduce(&ws, s, d_s1, d_s2, ddy.at(0), dx_.at(0), g, d_mean, NULL));
  std::vector<double> br1 = d2h<double>(dsum, (size_t)(2 * C));
  KK(sbn_cuda_backward_reduce(&ws, s, d_s1, d_s2, ddy.at(0), dx_.at(0), g, d_mean, NULL));
  std::vector<double> br2 = d2h<double>(dsum, (size_t)(2 * C));
  bad |= expect("bwd reduce repeat: same bits", same_bytes(br1.data(), br2.data(), sizeof(double) * 2 * C));
  KK(sbn_cuda_backward_reduce(&ws, s, d_s1, d_s2, udy.at(1), ux.at(1), g, d_mean, NULL));
  std::vector<double> br3 = d2h<double>(dsum, (size_t)(2 * C));
  bad |= expect("bwd reduce unaligned: same bits", same_bytes(br1.data(), br3.data(), sizeof(double) * 2 * C));
  {
    Worst w1, w2;
    for (int64_t c = 0; c < C; c++) {
      w1.add(fabs(br1[c] - rsdy[c]), 1e-9 * rady[c] + 1e-300);
      w2.add(fabs(br1[C + c] - rsdx[c]), 1e-9 * radx[c] + 1e-300);
    }
    bad |= report("sum_dy", w1);
    bad |= report("sum_dy_xmu", w2);
  }

  /* ---- backward elementwise, coefficients as the layer forms them ---- */
  std::vector<double> ka(C), kb(C), kc(C);
  for (int64_t c = 0; c < C; c++) {
    ka[c] = w[c] * invstd[c];
    kb[c] = n > 0 ? ka[c] * rsdy[c] / n : 0;
    kc[c] = n > 0 ? ka[c] * invstd[c] * invstd[c] * rsdx[c] / n : 0;
  }
  CK(cudaMemcpy(d_a, ka.data(), sizeof(double) * C, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_b, kb.data(), sizeof(double) * C, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_c, kc.data(), sizeof(double) * C, cudaMemcpyHostToDevice));
  KK(sbn_cuda_backward_elemt(s, dout.at(0), ddy.at(0), dx_.at(0), g, d_mean, d_a, d_b, d_c));
  std::vector<char> hdx = d2h<char>(dout.at(0), bytes);
  {
    Worst wd;
    double dmax = 0;
    for (int64_t i = 0; i < numel; i++) {
      const int64_t c = cl ? i % C : (i / S) % C;
      const double ref = kref_belt(xd[i], dyd[i], rmean[c], ka[c], kb[c], kc[c]), got = get(hdx.data(), i, dt);
      const double mag = fabs(ka[c] * dyd[i]) + fabs(kb[c]) + fabs(kc[c] * (xd[i] - rmean[c])) + fabs(ref);
      const double tol = half_ulp(dt) * fabs(ref) + 5 * U * mag + 2 * U * U * fabs(rmean[c] * kc[c]) +
                         (dt == SBN_DTYPE_FLOAT16 ? 0x1p-24 : 1e-300);
      wd.add(fabs(got - ref), tol);
      dmax = fmax(dmax, fabs(ref));
    }
    bad |= report("dx", wd);
    if (N * S >= 8) bad |= expect("evidence: max |dx| > 0.1", dmax > 0.1);
  }
  if (numel) sbn_cpu_backward_elemt(&cws, hcpu.data(), hdy.data(), hx.data(), g, rmean.data(), ka.data(), kb.data(), kc.data());
  bad |= expect("dx = the CPU kernels' bits", same_bytes(hdx.data(), hcpu.data(), bytes));
  sbn_cpu_ws_free(&cws);
  KK(sbn_cuda_backward_elemt(s, uout.at(1), udy.at(1), ux.at(1), g, d_mean, d_a, d_b, d_c));
  bad |= expect("dx unaligned: same bits", same_bytes(hdx.data(), d2h<char>(uout.at(1), bytes).data(), bytes));
  CK(cudaMemcpy(dtmp.at(0), ddy.at(0), bytes, cudaMemcpyDeviceToDevice));
  KK(sbn_cuda_backward_elemt(s, dtmp.at(0), dtmp.at(0), dx_.at(0), g, d_mean, d_a, d_b, d_c));
  bad |= expect("dx in place (dx = dy): same bits", same_bytes(hdx.data(), d2h<char>(dtmp.at(0), bytes).data(), bytes));
  CK(cudaMemcpy(dtmp.at(0), dx_.at(0), bytes, cudaMemcpyDeviceToDevice));
  KK(sbn_cuda_backward_elemt(s, dtmp.at(0), ddy.at(0), dtmp.at(0), g, d_mean, d_a, d_b, d_c));
  bad |= expect("dx in place (dx = x): same bits", same_bytes(hdx.data(), d2h<char>(dtmp.at(0), bytes).data(), bytes));

  CK(cudaStreamSynchronize(st));
  CK(cudaGetLastError());
  sbn_cuda_ws_free(&ws);
  CK(cudaFree(dsum));
  if (bad) g_failed++;
  return bad;
}

/* Empty input: zero sums and count whatever the buffers held, no tensor
 * touched; an unreserved workspace is an error. */
static int empty_and_misuse(cudaStream_t st) {
  printf("empty input and misuse\n");
  int bad = 0;
  const int64_t C = 8;
  double *d;
  CK(cudaMalloc(&d, sizeof(double) * (2 * C + 1)));
  std::vector<double> junk(2 * C + 1, 12345.0), got;
  float *y;
  CK(cudaMalloc(&y, 64));
  CK(cudaMemset(y, 0x7f, 64));
  for (int e = 0; e < 2; e++) {
    sbn_geom g = {e ? 4 : 0, C, e ? 0 : 10, SBN_LAYOUT_CHANNELS_FIRST, SBN_DTYPE_FLOAT32};
    sbn_cuda_ws ws = {};
    KK(sbn_cuda_ws_reserve(&ws, g));
    CK(cudaMemcpy(d, junk.data(), sizeof(double) * (2 * C + 1), cudaMemcpyHostToDevice));
    KK(sbn_cuda_stats(&ws, (sbn_cuda_stream)st, d, d + C, d + 2 * C, NULL, g));
    got = d2h<double>(d, (size_t)(2 * C + 1));
    int zero = 1;
    for (double v : got) zero &= v == 0.0;
    bad |= expect(e ? "S = 0: stats all zero" : "N = 0: stats all zero", zero);
    CK(cudaMemcpy(d, junk.data(), sizeof(double) * (2 * C + 1), cudaMemcpyHostToDevice));
    KK(sbn_cuda_backward_reduce(&ws, (sbn_cuda_stream)st, d, d + C, NULL, NULL, g, d, NULL));
    got = d2h<double>(d, (size_t)(2 * C + 1));
    zero = 1;
    for (int64_t i = 0; i < 2 * C; i++) zero &= got[i] == 0.0;
    bad |= expect("empty: bwd reduce all zero", zero);
    KK(sbn_cuda_normalize((sbn_cuda_stream)st, y, y, g, d, d, d));
    KK(sbn_cuda_backward_elemt((sbn_cuda_stream)st, y, y, y, g, d, d, d, d));
    std::vector<unsigned char> hy = d2h<unsigned char>(y, 64);
    int untouched = 1;
    for (unsigned char v : hy) untouched &= v == 0x7f;
    bad |= expect("empty: elementwise touched nothing", untouched);
    sbn_cuda_ws_free(&ws);
  }
  {
    sbn_geom g = {4, C, 10, SBN_LAYOUT_CHANNELS_FIRST, SBN_DTYPE_FLOAT32};
    sbn_cuda_ws ws = {};
    int rc = sbn_cuda_stats(&ws, (sbn_cuda_stream)st, d, d + C, d + 2 * C, y, g);
    bad |= expect("unreserved workspace: an error", rc != 0);
    sbn_geom g2 = {4, C, 10, SBN_LAYOUT_CHANNELS_FIRST, SBN_DTYPE_FLOAT64};
    bad |= expect("float64 storage: an error", sbn_cuda_ws_reserve(&ws, g2) != 0);
    bad |= expect("nothing reserved on error", ws.part == NULL && ws.cap == 0);
  }
  CK(cudaStreamSynchronize(st));
  CK(cudaGetLastError());
  CK(cudaFree(d));
  CK(cudaFree(y));
  g_cases++;
  if (bad) g_failed++;
  return bad;
}

/* A channel whose first value (the reductions' shift) is +inf, -inf or
 * NaN: its sum (n * mean) is +inf, -inf or NaN as PyTorch's mean, never the
 * NaN that inf - inf would give; both layouts and the small-map path. */
static int nonfinite_shift(cudaStream_t st) {
  printf("non-finite first values\n");
  int bad = 0;
  const int64_t N = 3, C = 3;
  for (int64_t S : {1, 7, 300})
    for (int cl = 0; cl < 2; cl++) {
      sbn_geom g = {N, C, S, cl ? SBN_LAYOUT_CHANNELS_LAST : SBN_LAYOUT_CHANNELS_FIRST, SBN_DTYPE_FLOAT32};
      std::vector<float> hx((size_t)(N * C * S));
      for (size_t i = 0; i < hx.size(); i++) hx[i] = (float)(1.5 + 0.25 * (double)(i % 13));
      const float first[3] = {INFINITY, -INFINITY, NAN};
      for (int64_t c = 0; c < C; c++) hx[(size_t)(cl ? c : c * S)] = first[c];
      float *x;
      double *d;
      CK(cudaMalloc(&x, hx.size() * sizeof(float)));
      CK(cudaMalloc(&d, sizeof(double) * (2 * C + 1)));
      CK(cudaMemcpy(x, hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice));
      sbn_cuda_ws ws = {};
      KK(sbn_cuda_ws_reserve(&ws, g));
      KK(sbn_cuda_stats(&ws, (sbn_cuda_stream)st, d, d + C, d + 2 * C, x, g));
      std::vector<double> got = d2h<double>(d, (size_t)(2 * C + 1));
      char what[64];
      snprintf(what, sizeof what, "%s S = %lld: sums inf, -inf, NaN", cl ? "cl" : "cf", (long long)S);
      const int ok = std::isinf(got[0]) && got[0] > 0 && std::isinf(got[1]) && got[1] < 0 && std::isnan(got[2]);
      if (!ok) printf("    got %g %g %g\n", got[0], got[1], got[2]);
      bad |= expect(what, ok);
      sbn_cuda_ws_free(&ws);
      CK(cudaFree(x));
      CK(cudaFree(d));
    }
  g_cases++;
  if (bad) g_failed++;
  return bad;
}

int main(int argc, char **argv) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device\n");
    return 0;
  }
  const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device 0: %s (sm_%d%d), %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  cudaStream_t st;
  /* a blocking stream: the test's synchronous copies (legacy stream) are
   * ordered with its kernels, before and after */
  CK(cudaStreamCreate(&st));

  struct Shape {
    int64_t n, c, s;
  };
  static const Shape shapes[] = {
      {2, 64, 112 * 112}, /* ResNet-50 stem/layer1 maps at small N (long rows: segments) */
      {2, 256, 56 * 56},
      {2, 512, 28 * 28},
      {2, 1024, 14 * 14},
      {32, 2048, 7 * 7},  /* the last stage, whole */
      {3, 5, 63},         /* odd everything */
      {2, 7, 13},
      {3, 33, 289},
      {4, 12, 6},         /* S < 8: one short group per row */
      {5, 3, 1},          /* S = 1: rows layout in both */
      {1, 1, 1},
      {16, 1, 1000},      /* C = 1 */
      {1, 2, 100003},     /* one very long odd row */
      {2, 3, 40000},      /* channels-last: many row tiles */
      {256, 10, 1},       /* (N, C) */
      {64, 1000, 1},
      {3, 4097, 1},       /* large odd C */
      {1000, 1, 1},
      {7, 3, 1},
      {2, 130, 9},
  };
  const sbn_dtype dts[] = {SBN_DTYPE_FLOAT32, SBN_DTYPE_BFLOAT16, SBN_DTYPE_FLOAT16};
  const double scales[] = {1.0, 1e4};
  uint64_t seed = 1;
  for (const Shape &sh : shapes)
    for (sbn_dtype dt : dts)
      for (int layout = 0; layout < 2; layout++)
        for (double sc : scales) {
          if (quick && sh.n * sh.c * sh.s > 500000) continue;
          /* bfloat16 keeps 8 bits: at 1e4 x std every value of a channel
           * would be equal; 100 x std is its ill-conditioned case */
          const double scale = dt == SBN_DTYPE_BFLOAT16 && sc > 100 ? 100 : sc;
          run_case(st, dt, (sbn_layout)layout, sh.n, sh.c, sh.s, scale, seed++);
        }
  /* Rows layout: reductions whose chunks hold several row tiles (the
   * ResNet shapes above get them only at N = 32: here a target of 4 blocks
   * gives small shapes 4-19 tiles a chunk). */
  static const Shape chunked[] = {{2, 40, 5000}, {16, 1, 1000}, {2, 3, 40000}, {4, 130, 300}};
  sbn_cuda_set_reduce_blocks(4);
  for (const Shape &sh : chunked)
    for (sbn_dtype dt : dts)
      run_case(st, dt, SBN_LAYOUT_CHANNELS_LAST, sh.n, sh.c, sh.s, dt == SBN_DTYPE_BFLOAT16 ? 100 : 1e4, seed++);
  sbn_cuda_set_reduce_blocks(0);
  empty_and_misuse(st);
  nonfinite_shift(st);
  CK(cudaStreamDestroy(st));
  printf("%d cases, %d failed\n", g_cases, g_failed);
  if (g_failed) {
    printf("FAIL\n");
    return 1;
  }
  printf("PASS\n");
  return 0;
}

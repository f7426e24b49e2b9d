/* The elementwise passes on the GPU: normalize (forward pass 2) and backward
 * elementwise (backward pass 2). One kernel each, tiles as in
 * kern_common.cuh; every value is read and written by one thread, which
 * loads a whole group of 8 before storing it, so y may be x and dx may be dy
 * or x (no __restrict__ on these pointers, no read-only-cache loads).
 *
 * Numerics. Each block first converts its channels' float64 coefficients to
 * float32 once, into shared memory: the mean split as hi = (float)mean and
 * lo = (float)(mean - hi), and the scale/bias (a, b, c). Per value:
 *   y  = fma((x - hi) - lo, a, b)
 *   dx = fma(-c, (x - hi) - lo, fma(a, dy, -b))
 * in float32 (explicit fused multiply-adds: one rounding each, and the same
 * operations whatever the vector width). x - hi is exact when x is near the mean (Sterbenz) and
 * otherwise rounded once, relative to |x - mean|; hi + lo carries the mean to
 * ~2^-48 relative, so x - mean keeps float32 accuracy even when |mean| is
 * 1e4 times the standard deviation (where a plain float32 (x - mean) would
 * lose the digits the mean's rounding takes: 2^-24 |mean| ~ 6e-4 std). Each
 * further operation rounds once relative to its own result, so y and dx are
 * within a few float32 ulps of the magnitudes of their terms (|x - mean| a,
 * b, y; a dy, b, c |x - mean|, dx) — below the rounding of 16-bit storage,
 * and for float32 storage within 4e-6 absolute of the float64 result for
 * |y| < ~8 (the CPU kernels' tolerance); the tests bound it per value. */
#include "kern_common.cuh"

using namespace sbn_cuda;

namespace {

/* Coefficients for one channel, float32, into tab[k][i] (k = 0..4: hi, lo,
 * a, b, c). */
template <bool BWD>
__device__ __forceinline__ void coef_fill(float (*tab)[MAX_RPT_ELEMT], int i, int64_t ch, const double *mean,
                                          const double *a, const double *b, const double *c) {
  const double m = mean[ch];
  const float hi = (float)m;
  tab[0][i] = hi;
  tab[1][i] = (float)(m - (double)hi);
  tab[2][i] = (float)a[ch];
  tab[3][i] = (float)b[ch];
  if (BWD) tab[4][i] = (float)c[ch];
}

/* One group: out = f(x[, dy]) with the coefficients of column i of tab. */
template <bool BWD>
__device__ __forceinline__ void apply(float o[8], const float v[8], const float w[8], const float hi,
                                      const float lo, const float a, const float b, const float c) {
#pragma unroll
  for (int k = 0; k < 8; k++) {
    const float xm = fsub(fsub(v[k], hi), lo);
    o[k] = BWD ? ffma(-c, xm, ffma(a, w[k], -b)) : ffma(xm, a, b);
  }
}

/* Channels-first: tiles of the N*C rows of S values; a tile holds at most
 * MAX_RPT_ELEMT rows, whose channels' coefficients the block converts first. */
template <class D, int V, bool BWD>
__global__ void __launch_bounds__(NT) elemt_cf(typename D::S *out, const typename D::S *x,
                                               const typename D::S *dy, int64_t C, cf_plan p,
                                               const double *__restrict__ mean, const double *__restrict__ a,
                                               const double *__restrict__ b, const double *__restrict__ cc) {
  __shared__ float tab[5][MAX_RPT_ELEMT];
  const cf_tile t = cf_tile_of(p, blockIdx.x);
  const int64_t S = p.s, ch0 = t.row0 % C;
  for (uint32_t r = threadIdx.x; r < t.nr; r += NT) coef_fill<BWD>(tab, (int)r, (ch0 + r) % C, mean, a, b, cc);
  __syncthreads();
  const uint32_t ng = t.nr * t.gs;
  for (uint32_t g = threadIdx.x; g < ng; g += NT) {
    const cf_group q = cf_group_of(p, t, g);
    const uint32_t r = q.r;
    const int64_t base = (t.row0 + r) * S + q.off;
    float v[8], w[8] = {}, o[8];
    load_group<D, V>(x + base, q.len, v);
    if (BWD) load_group<D, V>(dy + base, q.len, w);
    apply<BWD>(o, v, w, tab[0][r], tab[1][r], tab[2][r], tab[3][r], BWD ? tab[4][r] : 0.0f);
    store_group<D, V>(out + base, q.len, o);
  }
}

/* Rows of C channels: tiles of RT rows x CBW channels (cl_plan); thread
 * (tx, ty) writes channels [8 tx, 8 tx + 8) of the tile in GPT rows. */
template <class D, int V, bool BWD>
__global__ void __launch_bounds__(NT) elemt_cl(typename D::S *out, const typename D::S *x,
                                               const typename D::S *dy, cl_plan p,
                                               const double *__restrict__ mean, const double *__restrict__ a,
                                               const double *__restrict__ b, const double *__restrict__ cc) {
  constexpr int GPT = Gpt<D>::value;
  __shared__ float tab[5][MAX_RPT_ELEMT]; /* columns: the tile's channels (cbw <= 64) */
  const int64_t C = p.c;
  const cl_tile t = cl_tile_of(p, blockIdx.x);
  const int64_t cstart = cl_c0(p, t, 0);
  for (int i = threadIdx.x; i < p.cbw; i += NT)
    if (cstart + i < C) coef_fill<BWD>(tab, i, cstart + i, mean, a, b, cc);
  __syncthreads();
  const int tx = threadIdx.x & (p.tx - 1), ty = threadIdx.x / p.tx;
  const int64_t c0 = cl_c0(p, t, tx);
  const int clen = cl_clen(p, c0);
  if (clen == 0) return;
  float hi[8], lo[8], ka[8], kb[8], kc[8];
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const int col = 8 * tx + (i < clen ? i : 0); /* columns past C: any valid one (unused) */
    hi[i] = tab[0][col], lo[i] = tab[1][col], ka[i] = tab[2][col], kb[i] = tab[3][col];
    kc[i] = BWD ? tab[4][col] : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < GPT; k++) {
    const int64_t r = cl_row(p, t, ty, k);
    if (r < p.rows) {
      const int64_t base = r * C + c0;
      float v[8], w[8] = {}, o[8];
      load_group<D, V>(x + base, clen, v);
      if (BWD) load_group<D, V>(dy + base, clen, w);
#pragma unroll
      for (int i = 0; i < 8; i++) {
        const float xm = fsub(fsub(v[i], hi[i]), lo[i]);
        o[i] = BWD ? ffma(-kc[i], xm, ffma(ka[i], w[i], -kb[i])) : ffma(xm, ka[i], kb[i]);
      }
      store_group<D, V>(out + base, clen, o);
    }
  }
}

template <bool BWD>
int elemt_pass(cudaStream_t st, void *out, const void *x, const void *dy, sbn_geom g, const double *mean,
               const double *a, const double *b, const double *c) {
  if (!geom_ok(g)) return (int)cudaErrorInvalidValue;
  if (g.n == 0 || g.c == 0 || g.s == 0) return 0;
  if (!out || !x || !mean || !a || !b || (BWD && (!dy || !c))) return (int)cudaErrorInvalidValue;
  const void *dyv = BWD ? dy : x;
  if (rows_layout(g)) {
    const cl_plan p = cl_make(g.n * g.s, g.c, gpt_of(g.dtype));
    if (p.ntiles > INT32_MAX) return (int)cudaErrorInvalidValue;
    const int v = vec_width(g.dtype, g.c, out, x, dyv);
    return dispatch(g.dtype, v, [&](auto d, auto vc) {
      typedef decltype(d) D;
      typedef typename D::S S;
      elemt_cl<D, decltype(vc)::value, BWD>
          <<<(unsigned)p.ntiles, NT, 0, st>>>((S *)out, (const S *)x, (const S *)dyv, p, mean, a, b, c);
      return launch_status();
    });
  }
  const cf_plan p = cf_make(g.n * g.c, g.s, (int64_t)NT * gpt_of(g.dtype), MAX_RPT_ELEMT);
  if (p.ntiles > INT32_MAX) return (int)cudaErrorInvalidValue;
  const int v = vec_width(g.dtype, g.s, out, x, dyv);
  return dispatch(g.dtype, v, [&](auto d, auto vc) {
    typedef decltype(d) D;
    typedef typename D::S S;
    elemt_cf<D, decltype(vc)::value, BWD>
        <<<(unsigned)p.ntiles, NT, 0, st>>>((S *)out, (const S *)x, (const S *)dyv, g.c, p, mean, a, b, c);
    return launch_status();
  });
}

} /* namespace */

extern "C" int sbn_cuda_normalize(sbn_cuda_stream stream, void *y, const void *x, sbn_geom g,
                                  const double *mean, const double *scale, const double *bias) {
  return elemt_pass<false>((cudaStream_t)stream, y, x, NULL, g, mean, scale, bias, NULL);
}

extern "C" int sbn_cuda_backward_elemt(sbn_cuda_stream stream, void *dx, const void *dy, const void *x,
                                       sbn_geom g, const double *mean, const double *a, const double *b,
                                       const double *c) {
  return elemt_pass<true>((cudaStream_t)stream, dx, x, dy, g, mean, a, b, c);
}

/* The elementwise passes on the GPU: normalize (forward pass 2) and backward
 * elementwise (backward pass 2). One kernel each, tiles as in
 * kern_common.cuh; every value is read and written by one thread, which
 * loads a whole group of 8 before storing it, so y may be x and dx may be dy
 * or x (no __restrict__ on these pointers, no read-only-cache loads).
 *
 * Numerics: the operations of the CPU kernels (src/cpu/kern_body.inc), in
 * the same order, each rounded once (no fused multiply-add), so given the
 * same coefficients a GPU and a CPU layer write the same bits. Each block
 * first converts its channels' coefficients once, into shared memory:
 *  - float32 storage: float64 arithmetic (cheap on the GPUs this targets:
 *    the conversions and 2-3 float64 operations per value stay under the
 *    memory-bound budget), y and dx rounded once to float32 (half an ulp):
 *      y  = (x - mean) * a + b
 *      dx = (a * dy - b) - c * (x - mean)
 *  - bfloat16/float16 storage: float32 arithmetic with the mean split in
 *    hi = (float)mean and lo = (float)(mean - hi), so that x - mean keeps
 *    float32 accuracy even when |mean| is 1e4 times the standard deviation
 *    (x - hi is exact near the mean, by Sterbenz's lemma):
 *      y  = ((x - hi) - lo) * a + b
 *      dx = (a * dy - b) - c * ((x - hi) - lo)
 *    within a few float32 roundings of the terms' magnitudes, far below the
 *    half ulp (2^-8, 2^-11) of the 16-bit result. */
#include "bn_finish_cuda.h"
#include "finish_math.cuh"
#include "kern_common.cuh"
#include "launch.cuh"

using namespace sbn_cuda;

namespace {

/* Per storage type: a channel's coefficients and the two formulas. */
template <class D> struct Arith { /* bfloat16, float16: float32 with a split mean */
  struct K {
    float hi, lo, a, b, c;
  };
  __device__ static __forceinline__ K make(double m, double a, double b, double c) {
    K k;
    k.hi = (float)m;
    k.lo = (float)(m - (double)k.hi);
    k.a = (float)a, k.b = (float)b, k.c = (float)c;
    return k;
  }
  __device__ static __forceinline__ float norm(float x, const K &k) {
    return fadd(fmul(fsub(fsub(x, k.hi), k.lo), k.a), k.b);
  }
  __device__ static __forceinline__ float belt(float x, float dy, const K &k) {
    return fsub(fsub(fmul(k.a, dy), k.b), fmul(k.c, fsub(fsub(x, k.hi), k.lo)));
  }
};
template <> struct Arith<DF32> { /* float32: float64 */
  struct K {
    double m, a, b, c;
  };
  __device__ static __forceinline__ K make(double m, double a, double b, double c) {
    K k;
    k.m = m, k.a = a, k.b = b, k.c = c;
    return k;
  }
  __device__ static __forceinline__ float norm(float x, const K &k) {
    return (float)__dadd_rn(__dmul_rn(__dsub_rn((double)x, k.m), k.a), k.b);
  }
  __device__ static __forceinline__ float belt(float x, float dy, const K &k) {
    return (float)__dsub_rn(__dsub_rn(__dmul_rn(k.a, (double)dy), k.b),
                            __dmul_rn(k.c, __dsub_rn((double)x, k.m)));
  }
};

/* SBN_CUDA_FINISH_PREFETCH (measuring knob): before begin(), each thread
 * prefetches the inputs of its table entry into L1, so that a block's start
 * waits for about one memory round trip instead of two (begin()'s loads,
 * then the channel's): the longer start is what made the backward slower
 * with its finish in the kernel on large float32 grids (BENCHMARKS.md), so
 * with it the backward takes the finish on grids of every size
 * (fuse_backward). Off, the kernels compile to the same code as without it. */
#ifdef SBN_CUDA_FINISH_PREFETCH
constexpr bool kPrefetch = true;
#else
constexpr bool kPrefetch = false;
#endif
template <class T> __device__ __forceinline__ void prefetch_l1(const T *p) {
#ifdef __CUDA_ARCH__
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

/* Where a block's coefficients come from. begin() runs first in every
 * block (all its threads); false: the block writes nothing. get() gives
 * channel ch's mean, a, b, c; prefetch() issues its loads early. */
struct GivenCoef { /* arrays the finish kernel wrote (bn_finish.cu) */
  const double *mean, *a, *b, *c;
  template <int = 0> __device__ void prefetch(int64_t ch) const { /* a template: unused unless kPrefetch */
    prefetch_l1(mean + ch), prefetch_l1(a + ch), prefetch_l1(b + ch);
    if (c) prefetch_l1(c + ch);
  }
  __device__ bool begin() { return true; }
  template <bool BWD> __device__ void get(int64_t ch, double &m, double &ka, double &kb, double &kc) const {
    m = mean[ch], ka = a[ch], kb = b[ch], kc = BWD ? c[ch] : 0.0;
  }
};
/* The forward finish done by the normalize kernel itself: each block
 * computes its channels' coefficients from the payload (the same
 * operations, so the same bits, in every block), and the first blocks
 * (finish_blocks) also write what the finish kernel would: saved
 * statistics, running statistics, num_batches_tracked. One kernel boundary
 * less per pass: a drain and a launch of a few microseconds, more than the
 * data itself on 7x7 maps. */
struct FwdFinishCoef {
  sbn_cuda_finish f;
  int batch_stats, update;
  double n;
  template <int = 0> __device__ void prefetch(int64_t ch) const { /* a template: unused unless kPrefetch */
    if (batch_stats) prefetch_l1(f.payload + ch), prefetch_l1(f.payload + f.c + ch);
    else prefetch_l1(f.rm + ch), prefetch_l1(f.rv + ch);
    if (f.affine) prefetch_l1(f.w + ch), prefetch_l1(f.b + ch);
  }
  __device__ bool begin() {
    n = batch_stats ? f.payload[2 * f.c] : 0.0;
    if (fwd_count_bad(f, batch_stats, n)) return false; /* the deferred error: y is not written */
    const unsigned nb = finish_blocks(f.c, gridDim.x);
    if (blockIdx.x < nb) fwd_finish_channels(f, batch_stats, update, n, blockIdx.x, nb, false);
    return true;
  }
  template <bool BWD> __device__ void get(int64_t ch, double &m, double &ka, double &kb, double &kc) const {
    fwd_coef(f, batch_stats, n, ch, m, ka, kb);
    kc = 0.0;
  }
};
/* The backward finish done by the backward elementwise kernel (as above):
 * the first blocks add this rank's sums to grad_weight and grad_bias. */
struct BwdFinishCoef {
  sbn_cuda_finish f;
  int synced, batch_stats;
  double count;
  template <int = 0> __device__ void prefetch(int64_t ch) const { /* a template: unused unless kPrefetch */
    const double *sums = synced ? f.payload : f.local;
    prefetch_l1(sums + ch), prefetch_l1(sums + f.c + ch), prefetch_l1(f.mean + ch), prefetch_l1(f.invstd + ch);
    if (f.affine) prefetch_l1(f.w + ch);
  }
  __device__ bool begin() {
    if (*f.fwd_bad) return false;
    count = *f.saved_count;
    const unsigned nb = finish_blocks(f.c, gridDim.x);
    if (blockIdx.x < nb) bwd_finish_channels(f, synced, batch_stats, blockIdx.x, nb, false);
    return true;
  }
  template <bool BWD> __device__ void get(int64_t ch, double &m, double &ka, double &kb, double &kc) const {
    m = f.mean[ch];
    bwd_coef(f, synced, batch_stats, count, ch, ka, kb, kc);
  }
};

template <class D, bool BWD, class Src>
__device__ __forceinline__ typename Arith<D>::K coef(int64_t ch, const Src &src) {
  double m, a, b, c;
  src.template get<BWD>(ch, m, a, b, c);
  return Arith<D>::make(m, a, b, c);
}

/* Resident blocks per SM the channels-first kernels are compiled for. 0:
 * the compiler's choice (the same cubin, byte for byte, as no second
 * __launch_bounds__ argument; 1 made ptxas allocate differently, float32
 * backward 124-128 -> 150-161 registers). SBN_CUDA_ELEMT16_BLOCKS=N
 * (measuring knob) asks for N with 16-bit storage: 8 caps them at 32
 * registers, what they took before they did the finish (45-48 since: 5
 * resident blocks), and lets their backward take the finish too
 * (fuse_backward). */
#ifdef SBN_CUDA_ELEMT16_BLOCKS
constexpr int kElemt16Blocks = SBN_CUDA_ELEMT16_BLOCKS;
#else
constexpr int kElemt16Blocks = 0;
#endif
template <class D> struct ElemtBlocks {
  static constexpr int value = sizeof(typename D::S) == 2 && kElemt16Blocks > 0 ? kElemt16Blocks : 0;
};

/* Channels-first: tiles of the N*C rows of S values; a tile holds at most
 * MAX_RPT_ELEMT rows, whose channels' coefficients the block converts first. */
template <class D, int V, bool BWD, class Src>
__global__ void __launch_bounds__(NT, ElemtBlocks<D>::value) elemt_cf(typename D::S *out, const typename D::S *x,
                                               const typename D::S *dy, int64_t C, cf_plan p,
                                               Src src) {
  typedef typename Arith<D>::K K;
  __shared__ K tab[MAX_RPT_ELEMT];
  pdl_wait();
  if constexpr (kPrefetch) {
    const cf_tile t0 = cf_tile_of(p, blockIdx.x);
    if (threadIdx.x < t0.nr) src.template prefetch<>((t0.row0 % C + threadIdx.x) % C);
  }
  if (!src.begin()) return;
  const cf_tile t = cf_tile_of(p, blockIdx.x);
  const int64_t S = p.s, ch0 = t.row0 % C;
  for (uint32_t r = threadIdx.x; r < t.nr; r += NT) tab[r] = coef<D, BWD>((ch0 + r) % C, src);
  __syncthreads();
  const uint32_t ng = t.nr * t.gs;
  /* B groups at a time, all loaded before the first store (out may alias x
   * or dy, so the compiler cannot move a load above an earlier store) */
  constexpr int B = Batch<D>::value;
  for (uint32_t g0 = threadIdx.x; g0 < ng; g0 += B * NT) {
    float v[B][8], w[B][8];
    cf_group q[B];
#pragma unroll
    for (int b = 0; b < B; b++) {
      const uint32_t g = g0 + b * NT;
      q[b].len = 0;
      if (g < ng) {
        q[b] = cf_group_of(p, t, g);
        const int64_t base = (t.row0 + q[b].r) * S + q[b].off;
        load_group<D, V>(x + base, q[b].len, v[b]);
        if (BWD) load_group<D, V>(dy + base, q[b].len, w[b]);
      }
    }
#pragma unroll
    for (int b = 0; b < B; b++)
      if (q[b].len > 0) {
        const K k = tab[q[b].r];
        float o[8];
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = BWD ? Arith<D>::belt(v[b][i], w[b][i], k) : Arith<D>::norm(v[b][i], k);
        store_group<D, V>(out + (t.row0 + q[b].r) * S + q[b].off, q[b].len, o);
      }
  }
}

/* Channels-first, S not a multiple of 8: the flat groups of flat_plan, so
 * that full groups load and store whole aligned vectors (the caller checks
 * the pointers' alignment to 8 values). */
template <class D, int V, bool BWD, class Src>
__global__ void __launch_bounds__(NT, ElemtBlocks<D>::value) elemt_flat(typename D::S *out, const typename D::S *x,
                                                 const typename D::S *dy, int64_t C, flat_plan p,
                                                 Src src) {
  typedef typename Arith<D>::K K;
  __shared__ K tab[MAX_RPT_ELEMT];
  pdl_wait();
  if constexpr (kPrefetch) {
    const flat_tile t0 = flat_tile_of(p, blockIdx.x);
    if (threadIdx.x < t0.nrows) src.template prefetch<>((t0.row0 % C + threadIdx.x) % C);
  }
  if (!src.begin()) return;
  const flat_tile t = flat_tile_of(p, blockIdx.x);
  const int64_t ch0 = t.row0 % C;
  for (uint32_t r = threadIdx.x; r < t.nrows; r += NT) tab[r] = coef<D, BWD>((ch0 + r) % C, src);
  __syncthreads();
  constexpr int B = Batch<D>::value;
  for (uint32_t g0 = threadIdx.x; g0 < t.ng; g0 += B * NT) {
    float v[B][8], w[B][8];
    flat_group q[B];
#pragma unroll
    for (int bb = 0; bb < B; bb++) {
      const uint32_t g = g0 + bb * NT;
      q[bb].len = 0;
      if (g < t.ng) {
        q[bb] = flat_group_of(p, t, g);
        const int64_t base = (t.g0 + g) * 8;
        load_group<D, V>(x + base, q[bb].len, v[bb]);
        if (BWD) load_group<D, V>(dy + base, q[bb].len, w[bb]);
      }
    }
#pragma unroll
    for (int bb = 0; bb < B; bb++)
      if (q[bb].len > 0) {
        const K k0 = tab[q[bb].r];
        const K k1 = q[bb].split < (uint32_t)q[bb].len ? tab[q[bb].r + 1] : k0;
        float o[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
          const K &k = (uint32_t)i < q[bb].split ? k0 : k1;
          o[i] = BWD ? Arith<D>::belt(v[bb][i], w[bb][i], k) : Arith<D>::norm(v[bb][i], k);
        }
        store_group<D, V>(out + (t.g0 + (g0 + bb * NT)) * 8, q[bb].len, o);
      }
  }
}

/* Rows of C channels: tiles of RT rows x CBW channels (cl_plan); thread
 * (tx, ty) writes channels [8 tx, 8 tx + 8) of the tile in GPT rows. The
 * coefficients are read from shared memory where they are used, one channel
 * at a time: held in registers for the whole tile, 8 channels' worth took
 * 64 of float32's 112 registers, and the fewer resident blocks made the
 * float32 passes 13-25% slower on an H200 (BENCHMARKS.md). tab[i][tx] holds
 * channel 8 tx + i of the tile, so a warp's lanes read neighbouring entries. */
template <class D, int V, bool BWD, class Src>
__global__ void __launch_bounds__(NT) elemt_cl(typename D::S *out, const typename D::S *x,
                                               const typename D::S *dy, cl_plan p,
                                               Src src) {
  typedef typename Arith<D>::K K;
  constexpr int GPT = Gpt<D>::value;
  __shared__ K tab[8][MAX_TX];
  pdl_wait();
  if constexpr (kPrefetch) {
    const int64_t c0 = cl_c0(p, cl_tile_of(p, blockIdx.x), 0) + threadIdx.x;
    if ((int64_t)threadIdx.x < p.cbw && c0 < p.c) src.template prefetch<>(c0);
  }
  if (!src.begin()) return;
  const int64_t C = p.c;
  const cl_tile t = cl_tile_of(p, blockIdx.x);
  const int64_t cstart = cl_c0(p, t, 0);
  for (int j = threadIdx.x; j < p.cbw; j += NT)
    if (cstart + j < C) tab[j % 8][j / 8] = coef<D, BWD>(cstart + j, src);
  __syncthreads();
  const int tx = threadIdx.x & (p.tx - 1), ty = threadIdx.x / p.tx;
  const int64_t c0 = cl_c0(p, t, tx);
  const int clen = cl_clen(p, c0);
  if (clen == 0) return;
  /* B rows at a time, all loaded before the first store (see elemt_cf) */
  constexpr int B = Batch<D, BWD>::value;
#pragma unroll
  for (int k0 = 0; k0 < GPT; k0 += B) {
    float v[B][8], w[B][8];
    cl_load_rows<D, V, B, BWD>(p, t, ty, k0, x, dy, c0, clen, v, w);
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const K k = tab[i < clen ? i : 0][tx]; /* past C: any filled one (unused) */
#pragma unroll
      for (int bb = 0; bb < B; bb++)
        v[bb][i] = BWD ? Arith<D>::belt(v[bb][i], w[bb][i], k) : Arith<D>::norm(v[bb][i], k);
    }
#pragma unroll
    for (int bb = 0; bb < B; bb++) {
      const int64_t r = cl_row(p, t, ty, k0 + bb);
      if (r < p.rows) store_group<D, V>(out + r * C + c0, clen, v[bb]);
    }
  }
}

/* An elementwise pass's plan: which kernel, its tiles, its vector width. */
struct elemt_plan {
  enum { ROWS, FLAT, CF } kind;
  cl_plan cl;
  flat_plan flat;
  cf_plan cf;
  int64_t ntiles;
  int v;
};

/* g has values and geom_ok(g) */
elemt_plan plan_elemt(sbn_geom g, const void *out, const void *x, const void *dyv) {
  elemt_plan pl = {};
  if (rows_layout(g)) {
    pl.kind = elemt_plan::ROWS;
    pl.cl = cl_make(g.n * g.s, g.c, gpt_of(g.dtype));
    pl.ntiles = pl.cl.ntiles;
    pl.v = vec_width(g.dtype, g.c, out, x, dyv);
    return pl;
  }
  const int full = 16 / dtype_size(g.dtype); /* values per 16-byte vector */
  if (flat_fits(g.s) && vec_width(g.dtype, full, out, x, dyv) == full) {
    pl.kind = elemt_plan::FLAT;
    pl.flat = flat_make(g.n * g.c * g.s, g.s, (int64_t)NT * gpt_of(g.dtype));
    pl.ntiles = pl.flat.ntiles;
    pl.v = full;
    return pl;
  }
  pl.kind = elemt_plan::CF;
  pl.cf = cf_make(g.n * g.c, g.s, (int64_t)NT * gpt_of(g.dtype), MAX_RPT_ELEMT);
  pl.ntiles = pl.cf.ntiles;
  pl.v = vec_width(g.dtype, g.s, out, x, dyv);
  return pl;
}

/* Whether an elementwise pass over g launches a kernel (that can do the finish). */
bool has_values(sbn_geom g) { return geom_ok(g) && g.n != 0 && g.c != 0 && g.s != 0; }

/* The pass over g (with values) as planned in pl (dyv: dy, or x forward). */
template <bool BWD, class Src>
int elemt_launch(cudaStream_t st, void *out, const void *x, const void *dyv, sbn_geom g, const elemt_plan &pl,
                 Src src) {
  if (pl.ntiles > INT32_MAX) return (int)cudaErrorInvalidValue;
  return dispatch(g.dtype, pl.v, [&](auto d, auto vc) {
    typedef decltype(d) D;
    typedef typename D::S S;
    constexpr int V = decltype(vc)::value;
    const unsigned grid = (unsigned)pl.ntiles;
    if (pl.kind == elemt_plan::ROWS)
      return launch_kernel(elemt_cl<D, V, BWD, Src>, grid, NT, st, (S *)out, (const S *)x, (const S *)dyv, pl.cl, src);
    if (pl.kind == elemt_plan::FLAT)
      return launch_kernel(elemt_flat<D, V, BWD, Src>, grid, NT, st, (S *)out, (const S *)x, (const S *)dyv, g.c,
                           pl.flat, src);
    return launch_kernel(elemt_cf<D, V, BWD, Src>, grid, NT, st, (S *)out, (const S *)x, (const S *)dyv, g.c,
                         pl.cf, src);
  });
}

/* Whether the pass's tensors are missing or g is no shape: checked before
 * anything is launched, so that a failed call changes nothing. */
bool bad_args(sbn_geom g, const void *out, const void *x, const void *dy) {
  return !geom_ok(g) || (has_values(g) && (!out || !x || !dy));
}

template <bool BWD, class Src>
int elemt_pass(cudaStream_t st, void *out, const void *x, const void *dy, sbn_geom g, Src src) {
  const void *dyv = BWD ? dy : x;
  if (bad_args(g, out, x, dyv)) return (int)cudaErrorInvalidValue;
  if (!has_values(g)) return 0;
  return elemt_launch<BWD>(st, out, x, dyv, g, plan_elemt(g, out, x, dyv), src);
}

/* Whether the backward's finish goes into its elementwise kernel. There it
 * costs every block a longer start (two dependent loads, then the
 * coefficients' divisions) against one kernel boundary saved. Measured on
 * an H200 against the finish kernel (BENCHMARKS.md): 1-6% faster on grids
 * of up to 1024 blocks (7x7 and 14x14 maps at N = 32, 16-bit rows layout up
 * to 56x56), 2-5% slower on larger float32 grids, whose backward kernel
 * (120-128 registers, 2 resident blocks) pays that start in every wave;
 * the 16-bit channels-first kernels lose occupancy to it (32 -> 45
 * registers: 8 -> 5 resident blocks), 2-8% slower, and keep the finish
 * kernel. The forward's finish always goes into normalize (1-12% faster
 * but on one shape, +1%). */
constexpr int64_t kFuseBackwardMaxBlocks = 1024;
bool fuse_backward(sbn_geom g, const elemt_plan &pl) {
  const bool occupancy_kept = g.dtype == SBN_DTYPE_FLOAT32 || pl.kind == elemt_plan::ROWS || kElemt16Blocks > 0;
  return (pl.ntiles <= kFuseBackwardMaxBlocks || kPrefetch) && occupancy_kept;
}

/* SBN_CUDA_SEPARATE_FINISH (measuring knob): the finish kernels run before
 * the elementwise ones, as they did before the elementwise kernels took
 * their work over. */
#ifdef SBN_CUDA_SEPARATE_FINISH
constexpr bool kSeparateFinish = true;
#else
constexpr bool kSeparateFinish = false;
#endif

} /* namespace */

extern "C" int sbn_cuda_normalize(sbn_cuda_stream stream, void *y, const void *x, sbn_geom g,
                                  const double *mean, const double *scale, const double *bias) {
  if (has_values(g) && (!mean || !scale || !bias)) return (int)cudaErrorInvalidValue;
  return elemt_pass<false>((cudaStream_t)stream, y, x, NULL, g, GivenCoef{mean, scale, bias, NULL});
}

extern "C" int sbn_cuda_backward_elemt(sbn_cuda_stream stream, void *dx, const void *dy, const void *x,
                                       sbn_geom g, const double *mean, const double *a, const double *b,
                                       const double *c) {
  if (has_values(g) && (!mean || !a || !b || !c)) return (int)cudaErrorInvalidValue;
  return elemt_pass<true>((cudaStream_t)stream, dx, x, dy, g, GivenCoef{mean, a, b, c});
}

extern "C" int sbn_cuda_finish_normalize(sbn_cuda_stream stream, void *y, const void *x, sbn_geom g,
                                         const sbn_cuda_finish *f, int batch_stats, int update) {
  if (!f || bad_args(g, y, x, x)) return (int)cudaErrorInvalidValue;
  if (kSeparateFinish || !has_values(g)) {
    const int e = sbn_cuda_forward_finish(stream, f, batch_stats, update);
    return e ? e : sbn_cuda_normalize(stream, y, x, g, f->mean, f->ka, f->kb);
  }
  return elemt_pass<false>((cudaStream_t)stream, y, x, NULL, g, FwdFinishCoef{*f, batch_stats, update, 0.0});
}

extern "C" int sbn_cuda_finish_backward_elemt(sbn_cuda_stream stream, void *dx, const void *dy, const void *x,
                                              sbn_geom g, const sbn_cuda_finish *f, int synced,
                                              int batch_stats) {
  if (!f || bad_args(g, dx, x, dy)) return (int)cudaErrorInvalidValue;
  const bool values = has_values(g);
  const elemt_plan pl = values ? plan_elemt(g, dx, x, dy) : elemt_plan{};
  if (kSeparateFinish || !values || !fuse_backward(g, pl)) {
    const int e = sbn_cuda_backward_finish(stream, f, synced, 1, batch_stats);
    return e ? e : sbn_cuda_backward_elemt(stream, dx, dy, x, g, f->mean, f->ka, f->kb, f->kc);
  }
  return elemt_launch<true>((cudaStream_t)stream, dx, x, dy, g, pl, BwdFinishCoef{*f, synced, batch_stats, 0.0});
}

/* The reduction passes on the GPU: statistics (forward pass 1) and backward
 * reduce (backward pass 1), and the workspace of their partial sums.
 *
 * Each pass is two kernels on the caller's stream:
 *  1. a grid of tiles (kern_common.cuh; in the rows layout, chunks of
 *     tiles) — per channel and tile (chunk) one pair of float64 partial
 *     sums, written to the workspace (no atomics);
 *  2. a merge of each channel's partials in a fixed order: channels-first,
 *     one warp per channel, lane l taking tiles l, l + 32, ... and the 32
 *     lanes combined by a fixed butterfly (skipped when a channel has one
 *     tile: the tile kernel writes the outputs); rows layout, merge_rows,
 *     32 channels x 32 warps, coalesced.
 * Every addition happens in an order fixed by the shape, so the same input
 * gives the same bits on every run and on every GPU.
 *
 * Numerics. Statistics accumulate shifted values d = x - k, where the shift
 * k is a value of the channel (its first one, as the CPU kernels do): every
 * tile of a channel uses the same k, so tile partials merge by plain
 * addition, and mean = k + sum(d)/n, M2 = sum(d^2) - sum(d)^2/n stay free
 * of cancellation when |mean| >> std (d is of the order of the standard
 * deviation). All of it is float64, per value too: x is widened exactly,
 * x - k is exact (two floats), and each value costs one conversion and two
 * or three float64 operations. That fits the memory-bound budget of the
 * GPUs this targets (H100: 64 float64 FMA and 16 conversions per SM and
 * clock against ~7 bfloat16 values per SM and clock of DRAM bandwidth;
 * A100: 32 and 16 against ~6.5), and it makes the sums exact up to float64
 * rounding — n 2^-53 of the summed magnitudes at worst — where float32
 * partials would leave errors of order 2^-24 (1 + z^2) for a shift z
 * standard deviations from the mean, too close to a float32 result's own
 * rounding on small batches. Backward reduce sums dy and dy * (x - mean)
 * the same way (x - mean in float64, with the float64 mean). */
#include "kern_common.cuh"
#include "launch.cuh"

using namespace sbn_cuda;

namespace {

/* The shift of a channel: its first value, or 0 where that is infinite or
 * NaN (inf - inf would turn a mean PyTorch reports as inf into NaN). */
__device__ __forceinline__ double shift_of(double v) { return isfinite(v) ? v : 0.0; }

/* Fixed-order reduction of two doubles over the block; the result is in
 * thread 0. */
__device__ __forceinline__ void block_sum2(double &a, double &b) {
  __shared__ double sh[WARPS][2];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sh[w][0] = a, sh[w][1] = b;
  __syncthreads();
  if (threadIdx.x == 0) {
    a = sh[0][0], b = sh[0][1];
#pragma unroll
    for (int i = 1; i < WARPS; i++) a += sh[i][0], b += sh[i][1];
  }
}

/* Add one value to the float64 sums.
 * Statistics (BWD false): s += x - k, q += (x - k)^2 with k the shift.
 * Backward (BWD true):    s += dy,    q += dy * (x - k) with k the mean.
 * A value that is not there (valid false) adds exactly 0. Explicit
 * roundings: the same operations in every instantiation. */
template <bool BWD>
__device__ __forceinline__ void add_value(float v, float w, bool valid, double k, double &s, double &q) {
  if (BWD) {
    const double g = valid ? widen(w) : 0.0;
    s = __dadd_rn(s, g);
    q = __fma_rn(g, __dsub_rn(widen(v), k), q);
  } else {
    const double d = valid ? __dsub_rn(widen(v), k) : 0.0;
    s = __dadd_rn(s, d);
    q = __fma_rn(d, d, q);
  }
}

/* A channel's merged sums to the pass's outputs. Statistics: out1 = n *
 * mean, out2 = M2 + n * mean^2 from the shifted sums s, q and the shift k
 * (see the file comment). Backward: the sums themselves. */
template <bool STATS>
__device__ __forceinline__ void put_sums(double s, double q, double k, double n, int64_t c, double *out1,
                                         double *out2, int64_t C, double *dup) {
  if (STATS) {
    const double mean = k + s / n;
    double m2 = q - s * s / n; /* >= 0 up to rounding */
    if (m2 < 0.0) m2 = 0.0;
    out1[c] = n * mean;
    out2[c] = m2 + n * mean * mean;
  } else {
    out1[c] = s;
    out2[c] = q;
    if (dup) dup[c] = s, dup[C + c] = q;
  }
}

/* A partial written by another block of the same grid: read past L1 */
__device__ __forceinline__ double ld_other(const double *p) { return *(const volatile double *)p; }

/* One warp merges channel c's tile partials part[j * sj + c * sc] and
 * [... + oq], j < ntiles: lane l takes tiles l, l + 32, ..., then a fixed
 * butterfly; lane 0 writes the outputs (see merge below). */
template <class D, bool STATS>
__device__ __forceinline__ void merge_channel(const double *part, int64_t c, int64_t ntiles, int64_t sj,
                                              int64_t sc, int64_t oq, const typename D::S *x, int64_t ks,
                                              double n, double *out1, double *out2, int64_t C, double *dup) {
  const int lane = threadIdx.x % 32;
  double s = 0.0, q = 0.0;
  for (int64_t j = lane; j < ntiles; j += 32) {
    const double *pp = part + j * sj + c * sc;
    s += ld_other(pp);
    q += ld_other(pp + oq);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
    q += __shfl_xor_sync(0xffffffffu, q, o);
  }
  if (lane == 0) put_sums<STATS>(s, q, STATS ? shift_of(D::ld(x[c * ks])) : 0.0, n, c, out1, out2, C, dup);
}

/* Chains of float64 additions per thread in the channels-first reduction:
 * the statistics of 16-bit storage, with the least memory time per value,
 * wait on the latency of one chain; even and odd values in two chains made
 * them 4-10% faster on an H200, while the backward pass (two tensors) was
 * 3-17% slower and float32 unchanged (BENCHMARKS.md). */
template <class D, bool BWD> struct CfChains {
  static constexpr bool two = sizeof(typename D::S) == 2 && !BWD;
};

/* Channels-first: block = (channel c, tile j of the channel's N rows).
 * A channel of one tile (small maps) writes its outputs itself (the merge
 * is skipped); else the tile's partials go to part. */
template <class D, int V, bool BWD>
__global__ void __launch_bounds__(NT) reduce_cf(const typename D::S *__restrict__ x,
                                                const typename D::S *__restrict__ dy,
                                                const double *__restrict__ mean, int64_t C, cf_plan p,
                                                double *__restrict__ part, double n, double *__restrict__ out1,
                                                double *__restrict__ out2, double *__restrict__ count,
                                                double *__restrict__ dup) {
  pdl_wait();
  const int64_t c = blockIdx.x / p.ntiles, j = blockIdx.x - c * p.ntiles;
  const int64_t S = p.s;
  /* the shift (the channel's first value) or the mean */
  const double k = BWD ? mean[c] : shift_of(D::ld(x[c * S]));
  const cf_tile t = cf_tile_of(p, j);
  const uint32_t ng = t.nr * t.gs;
  double as = 0.0, aq = 0.0, as2 = 0.0, aq2 = 0.0; /* chains 1 and 2 */
  /* groups threadIdx.x, + NT, + 2 NT, ... in order, B at a time: their
   * loads are all issued before the first add */
  constexpr int B = Batch<D, BWD>::value;
  for (uint32_t g0 = threadIdx.x; g0 < ng; g0 += B * NT) {
    float v[B][8], w[B][8];
    int len[B];
#pragma unroll
    for (int b = 0; b < B; b++) {
      const uint32_t g = g0 + b * NT;
      len[b] = 0;
      if (g < ng) {
        const cf_group q8 = cf_group_of(p, t, g);
        const int64_t base = ((t.row0 + q8.r) * C + c) * S + q8.off;
        len[b] = q8.len;
        load_group<D, V>(x + base, q8.len, v[b]);
        if (BWD) load_group<D, V>(dy + base, q8.len, w[b]);
      }
    }
#pragma unroll
    for (int b = 0; b < B; b++)
      if (len[b] > 0) {
        if (CfChains<D, BWD>::two) {
#pragma unroll
          for (int i = 0; i < 8; i += 2) {
            add_value<BWD>(v[b][i], BWD ? w[b][i] : 0.0f, i < len[b], k, as, aq);
            add_value<BWD>(v[b][i + 1], BWD ? w[b][i + 1] : 0.0f, i + 1 < len[b], k, as2, aq2);
          }
        } else {
#pragma unroll
          for (int i = 0; i < 8; i++) add_value<BWD>(v[b][i], BWD ? w[b][i] : 0.0f, i < len[b], k, as, aq);
        }
      }
  }
  if (CfChains<D, BWD>::two) as = __dadd_rn(as, as2), aq = __dadd_rn(aq, aq2);
  pdl_trigger();
  block_sum2(as, aq);
  if (threadIdx.x != 0) return;
  if (p.ntiles == 1) {
    /* 0 + s as the merge's first addition has it (-0 becomes +0), so the
     * bits are those of a merge of one partial */
    put_sums<!BWD>(__dadd_rn(0.0, as), __dadd_rn(0.0, aq), k, n, c, out1, out2, C, dup);
    if (!BWD && c == 0) *count = n;
  } else {
    part[2 * blockIdx.x] = as; /* = 2 * (c * ntiles + j) */
    part[2 * blockIdx.x + 1] = aq;
  }
}

/* The rows-layout reduction's occupancy. 16-bit storage, whose float64
 * arithmetic per byte is twice float32's, is compiled for 4 resident blocks
 * (at most 64 registers; it took 78-96 and got 3) and reads its shifts from
 * shared memory; float32 keeps them in registers (2 resident blocks either
 * way). Measured on an H200 against the 3-block build: 16-bit rows layout
 * 4% faster forward, 11% backward; float32 with shared shifts was up to 6%
 * slower (BENCHMARKS.md). */
template <class D> struct ClReduce {
  static constexpr bool small = sizeof(typename D::S) == 2;
  static constexpr int resident = small ? 4 : 2;
  static constexpr bool shift_smem = small;
};

/* Rows of C channels: block = (chunk of tpc row tiles, channel block);
 * thread (tx, ty) sums channels [c0, c0 + 8) over rows ty, ty + TY, ... of
 * each tile of the chunk (GPT rows a tile, tiles in order), then the block
 * adds the TY threads of each tx in a fixed butterfly (within a warp) and
 * in warp order (across warps). Partials: part[(2 * chunk + {0, 1}) * C + c]. */
template <class D, int V, bool BWD>
__global__ void __launch_bounds__(NT, ClReduce<D>::resident) reduce_cl(const typename D::S *__restrict__ x,
                                                const typename D::S *__restrict__ dy,
                                                const double *__restrict__ mean, cl_plan p,
                                                double *__restrict__ part) {
  constexpr int GPT = Gpt<D>::value;
  __shared__ double sh[WARPS][MAX_TX][16];
  pdl_wait();
  const int64_t C = p.c;
  const int64_t chunk = blockIdx.x / p.ncb;
  cl_tile t;
  t.cb = blockIdx.x - chunk * p.ncb;
  const int tx = threadIdx.x & (p.tx - 1), ty = threadIdx.x / p.tx;
  const int64_t c0 = cl_c0(p, t, tx);
  const int clen = cl_clen(p, c0);
  double a[16]; /* sums (0..7) and second sums (8..15) */
#pragma unroll
  for (int i = 0; i < 8; i++) a[i] = 0.0, a[8 + i] = 0.0;
  /* k: per channel the shift (its value in row 0) or the mean; 16-bit
   * storage reads it from shared memory where it is used (ktab[i][tx]:
   * channel 8 tx + i of the block), 16 registers fewer */
  __shared__ double ktab[8][MAX_TX]; /* unused (and dropped) with float32 */
  double k[8];
  if (ClReduce<D>::shift_smem) {
    const int64_t cstart = cl_c0(p, t, 0);
    for (int j = threadIdx.x; j < p.cbw; j += NT)
      if (cstart + j < C) ktab[j % 8][j / 8] = BWD ? mean[cstart + j] : shift_of(D::ld(x[cstart + j]));
    __syncthreads();
  } else {
#pragma unroll
    for (int i = 0; i < 8; i++) k[i] = i < clen ? (BWD ? mean[c0 + i] : shift_of(D::ld(x[c0 + i]))) : 0.0;
  }
#define SBN_SHIFT(i) (ClReduce<D>::shift_smem ? ktab[(i) < clen ? (i) : 0][tx] : k[i])
  const int64_t tend = (chunk + 1) * p.tpc < p.nrt ? (chunk + 1) * p.tpc : p.nrt;
  if (clen > 0) {
    /* B rows at a time: their loads are all issued before the first add */
    constexpr int B = Batch<D, BWD>::value;
    for (t.rti = chunk * p.tpc; t.rti < tend; t.rti++) {
#pragma unroll
      for (int k0 = 0; k0 < GPT; k0 += B) {
        float v[B][8], w[B][8];
        cl_load_rows<D, V, B, BWD>(p, t, ty, k0, x, dy, c0, clen, v, w);
#pragma unroll
        for (int b = 0; b < B; b++) {
          if (cl_row(p, t, ty, k0 + b) < p.rows) {
#pragma unroll
            for (int i = 0; i < 8; i++)
              add_value<BWD>(v[b][i], BWD ? w[b][i] : 0.0f, i < clen, SBN_SHIFT(i), a[i], a[8 + i]);
          }
        }
      }
    }
  }
  pdl_trigger();
  /* lanes with the same tx differ in the bits >= log2(tx) */
  for (int o = 16; o >= p.tx; o >>= 1)
#pragma unroll
    for (int i = 0; i < 16; i++) a[i] += __shfl_xor_sync(0xffffffffu, a[i], o);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane < p.tx)
#pragma unroll
    for (int i = 0; i < 16; i++) sh[w][lane][i] = a[i];
  __syncthreads();
  if (threadIdx.x < 16 * p.tx) {
    const int ttx = threadIdx.x / 16, comp = threadIdx.x % 16;
    double sum = sh[0][ttx][comp];
#pragma unroll
    for (int i = 1; i < WARPS; i++) sum += sh[i][ttx][comp];
    const int64_t c = cl_c0(p, t, ttx) + comp % 8;
    if (c < C) part[(2 * chunk + comp / 8) * C + c] = sum;
  }
}

#undef SBN_SHIFT

/* Merge of the rows layout's chunk partials, coalesced: block = 32
 * channels x MW warps; lane l of warp w adds chunks w, w + MW, ... of channel
 * 32 blockIdx.x + l in order, then warp 0 adds the MW warps' sums in warp
 * order. Then as merge (below). */
constexpr int MW = 32;
template <class D, bool STATS>
__global__ void __launch_bounds__(32 * MW) merge_rows(const double *__restrict__ part, int64_t C, int64_t nch,
                                                      const typename D::S *__restrict__ x, double n,
                                                      double *__restrict__ out1, double *__restrict__ out2,
                                                      double *__restrict__ count, double *__restrict__ dup) {
  __shared__ double sh[2][MW][33];
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int64_t c = (int64_t)blockIdx.x * 32 + lane;
  if (STATS && blockIdx.x == 0 && threadIdx.x == 0) *count = n;
  double s = 0.0, q = 0.0;
  if (c < C)
    for (int64_t j = w; j < nch; j += MW) {
      s += part[2 * j * C + c];
      q += part[(2 * j + 1) * C + c];
    }
  sh[0][w][lane] = s, sh[1][w][lane] = q;
  __syncthreads();
  if (w != 0 || c >= C) return;
  s = sh[0][0][lane], q = sh[1][0][lane];
  for (int i = 1; i < MW; i++) s += sh[0][i][lane], q += sh[1][i][lane];
  put_sums<STATS>(s, q, STATS ? shift_of(D::ld(x[c])) : 0.0, n, c, out1, out2, C, dup);
}

/* Merge: warp per channel; the tile partials of channel c are
 * part[j * sj + c * sc] and part[j * sj + c * sc + oq], j < ntiles.
 * Statistics: out1 = n * mean, out2 = M2 + n * mean^2, *count = n (see the
 * file comment; the shift is read again from x, at x[c * ks]). Backward:
 * out1, out2 = the sums. */
template <class D, bool STATS>
__global__ void __launch_bounds__(NT) merge(const double *__restrict__ part, int64_t C, int64_t ntiles,
                                            int64_t sj, int64_t sc, int64_t oq,
                                            const typename D::S *__restrict__ x, int64_t ks, double n,
                                            double *__restrict__ out1, double *__restrict__ out2,
                                            double *__restrict__ count, double *__restrict__ dup) {
  pdl_wait();
  pdl_trigger();
  const int64_t c = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
  if (STATS && blockIdx.x == 0 && threadIdx.x == 0) *count = n;
  if (c >= C) return; /* whole warps */
  merge_channel<D, STATS>(part, c, ntiles, sj, sc, oq, x, ks, n, out1, out2, C, dup);
}

__global__ void zero_sums(double *a, double *b, double *count, int64_t C) {
  pdl_wait();
  pdl_trigger();
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < C; i += stride) a[i] = 0.0, b[i] = 0.0;
  if (count && blockIdx.x == 0 && threadIdx.x == 0) *count = 0.0;
}

int launch_zero(cudaStream_t st, double *a, double *b, double *count, int64_t C) {
  int64_t blocks = (C + NT - 1) / NT;
  if (blocks < 1) blocks = 1;
  if (blocks > 1024) blocks = 1024;
  return launch_kernel(zero_sums, (unsigned)blocks, NT, st, a, b, count, C);
}

/* Both reduction passes: the tiles, then the merge; dup (backward) gets
 * the sums too, from the kernels. */
template <bool BWD>
int reduce_launch(sbn_cuda_ws *ws, cudaStream_t st, double *out1, double *out2, double *count,
                  const void *x, const void *dy, const double *mean, sbn_geom g, double *dup) {
  if (!geom_ok(g) || (g.c > 0 && (!out1 || !out2)) || (!BWD && !count)) return (int)cudaErrorInvalidValue;
  if (g.n == 0 || g.c == 0 || g.s == 0) {
    const int e = launch_zero(st, out1, out2, count, g.c);
    return e || !dup ? e : launch_zero(st, dup, dup + g.c, NULL, g.c);
  }
  if (!ws || !x || (BWD && (!dy || !mean))) return (int)cudaErrorInvalidValue;
  const int64_t C = g.c, tiles = reduce_tiles_per_channel(g);
  /* the workspace must have been reserved for this shape; grids are 1-D */
  if (!ws->part || (size_t)(2 * C * tiles) * sizeof(double) > ws->cap || C * tiles > INT32_MAX)
    return (int)cudaErrorInvalidValue;
  double *part = (double *)ws->part;
  const double n = (double)(g.n * g.s);
  const unsigned merge_blocks = (unsigned)((C + WARPS - 1) / WARPS);
  if (rows_layout(g)) {
    const cl_plan p = cl_make(g.n * g.s, C, gpt_of(g.dtype));
    const int v = vec_width(g.dtype, C, x, BWD ? dy : x, x);
    return dispatch(g.dtype, v, [&](auto d, auto vc) {
      typedef decltype(d) D;
      typedef typename D::S S;
      const int e = launch_kernel(reduce_cl<D, decltype(vc)::value, BWD>, (unsigned)(p.nch * p.ncb), NT, st,
                                  (const S *)x, (const S *)dy, mean, p, part);
      if (e) return e;
      return launch_kernel(merge_rows<D, !BWD>, (unsigned)((C + 31) / 32), 32 * MW, st, part, C, p.nch,
                           (const S *)x, n, out1, out2, count, dup);
    });
  }
  const cf_plan p = cf_make(g.n, g.s, (int64_t)NT * gpt_of(g.dtype), INT64_MAX);
  const int v = vec_width(g.dtype, g.s, x, BWD ? dy : x, x);
  return dispatch(g.dtype, v, [&](auto d, auto vc) {
    typedef decltype(d) D;
    typedef typename D::S S;
    const int e = launch_kernel(reduce_cf<D, decltype(vc)::value, BWD>, (unsigned)(C * p.ntiles), NT, st,
                                (const S *)x, (const S *)dy, mean, C, p, part, n, out1, out2, count, dup);
    if (e || p.ntiles == 1) return e;
    return launch_kernel(merge<D, !BWD>, merge_blocks, NT, st, part, C, p.ntiles, (int64_t)2, 2 * p.ntiles,
                         (int64_t)1, (const S *)x, g.s, n, out1, out2, count, dup);
  });
}

} /* namespace */

static int64_t reduce_blocks_target = CL_REDUCE_BLOCKS;
int64_t sbn_cuda::sbn_cuda_reduce_blocks(void) { return reduce_blocks_target; }
extern "C" void sbn_cuda_set_reduce_blocks(int64_t blocks) {
  reduce_blocks_target = blocks > 0 ? blocks : CL_REDUCE_BLOCKS;
}

extern "C" int sbn_cuda_ws_reserve(sbn_cuda_ws *ws, sbn_geom g) {
  if (!ws || !geom_ok(g)) return (int)cudaErrorInvalidValue;
  if (g.n == 0 || g.c == 0 || g.s == 0) return 0;
  size_t need = (size_t)(2 * g.c * reduce_tiles_per_channel(g)) * sizeof(double);
  if (need <= ws->cap && ws->part) return 0;
  if (ws->part && need < 2 * ws->cap) need = 2 * ws->cap; /* few growths: few kept blocks */
  if (ws->part && ws->nretired == SBN_CUDA_WS_RETIRED) return (int)cudaErrorMemoryAllocation;
  void *p = NULL;
  const cudaError_t e = cudaMalloc(&p, need);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* not sticky: clear it */
    return (int)e;
  }
  /* kept, not freed: a graph captured earlier may still use it */
  if (ws->part) ws->retired[ws->nretired++] = ws->part;
  ws->part = p;
  ws->cap = need;
  return 0;
}

extern "C" void sbn_cuda_ws_free(sbn_cuda_ws *ws) {
  if (!ws) return;
  if (ws->part) cudaFree(ws->part);
  for (int i = 0; i < ws->nretired; i++) cudaFree(ws->retired[i]);
  ws->part = NULL;
  ws->cap = 0;
  ws->nretired = 0;
}

extern "C" int sbn_cuda_stats(sbn_cuda_ws *ws, sbn_cuda_stream stream, double *sum, double *sumsq,
                              double *count, const void *x, sbn_geom g) {
  return reduce_launch<false>(ws, (cudaStream_t)stream, sum, sumsq, count, x, NULL, NULL, g, NULL);
}

extern "C" int sbn_cuda_backward_reduce(sbn_cuda_ws *ws, sbn_cuda_stream stream, double *sum_dy,
                                        double *sum_dy_xmu, const void *dy, const void *x, sbn_geom g,
                                        const double *mean, double *dup) {
  return reduce_launch<true>(ws, (cudaStream_t)stream, sum_dy, sum_dy_xmu, NULL, x, dy, mean, g, dup);
}

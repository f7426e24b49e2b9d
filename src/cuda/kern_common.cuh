/* Internal: what the CUDA kernels of the four passes share — storage types,
 * loads and stores of groups of 8 values, the work plans (tiles) of both
 * layouts, fixed-order block reductions, and the host-side dispatch on
 * (dtype, vector width).
 *
 * Work units. Every thread works on GROUPS of 8 consecutive values of one
 * row: channels-first, 8 positions of one (n, c) plane row (a group never
 * crosses a row); channels-last (and any input with S = 1), 8 consecutive
 * channels of one row of C. A group is loaded with 16-, 8-, 4- or 2-byte
 * vector loads when the row length and the pointers allow it (vec_width),
 * else value by value; either way its 8 values are then combined in the
 * same fixed order, so the bits of every result depend only on the shape,
 * never on the vector width, the pointers' alignment or the scheduling.
 *
 * Tiles (one thread block each, NT threads) depend only on the shape and
 * the dtype:
 *  - channels-first (cf_plan): rows of S values (the N rows of one channel
 *    for the reductions, all N*C rows for the elementwise passes), a tile
 *    being a run of whole rows, or a segment of one long row, of about
 *    NT * GPT groups; elementwise passes over rows whose S is not a
 *    multiple of 8 use flat groups instead (flat_plan);
 *  - rows of C channels (cl_plan): a tile is RT rows x CBW channels; thread
 *    (tx, ty) owns channels [8 tx, 8 tx + 8) of the tile and rows ty,
 *    ty + TY, ... (GPT rows). TX <= 8 keeps CBW <= 64, so each tile's
 *    partial sums cost at most 1/32 of the bytes it reads (2 doubles per
 *    channel per RT >= 32 rows x GPT).
 * GPT (groups per thread) is 4 for float32 and 8 for 16-bit storage: a
 * tile reads about 32 KiB. */
#ifndef SBN_CUDA_KERN_COMMON_CUH
#define SBN_CUDA_KERN_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "bn_kernels_cuda.h"

namespace sbn_cuda {

constexpr int NT = 256;           /* threads per block */
constexpr int WARPS = NT / 32;
/* rows layout: at most 8 x MAX_TX = 64 channels per tile (tiles of 128
 * were up to 12% slower on an H200: BENCHMARKS.md) */
constexpr int MAX_TX = 8;
static_assert(16 * MAX_TX <= NT, "reduce_cl: one thread per (tx, sum) in the combine");
constexpr int64_t MAX_RPT_ELEMT = 256; /* channels-first elementwise: rows per tile (coefficient table) */


/* ---- storage types: bits in memory, float32 in registers ---- */

struct DF32 {
  typedef float S;
  __device__ static __forceinline__ float ld(S v) { return v; }
  __device__ static __forceinline__ S st(float f) { return f; }
};
struct DBF16 { /* bfloat16 widens exactly by a shift; narrowing rounds to nearest even */
  typedef uint16_t S;
  __device__ static __forceinline__ float ld(S v) { return __uint_as_float((uint32_t)v << 16); }
  __device__ static __forceinline__ S st(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};
struct DF16 {
  typedef uint16_t S;
  __device__ static __forceinline__ float ld(S v) { return __half2float(__ushort_as_half(v)); }
  __device__ static __forceinline__ S st(float f) { return __half_as_ushort(__float2half_rn(f)); }
};

/* groups per thread (see the header comment); SBN_CUDA_GPT (4, 8 or 16)
 * overrides it for every dtype, to measure (tiles, and so the order of the
 * additions, change with it) */
#ifdef SBN_CUDA_GPT
static_assert(SBN_CUDA_GPT == 4 || SBN_CUDA_GPT == 8 || SBN_CUDA_GPT == 16, "SBN_CUDA_GPT: 4, 8 or 16");
template <class D> struct Gpt { static constexpr int value = SBN_CUDA_GPT; };
static inline int gpt_of(sbn_dtype) { return SBN_CUDA_GPT; }
#else
template <class D> struct Gpt { static constexpr int value = sizeof(typename D::S) == 4 ? 4 : 8; };
static inline int gpt_of(sbn_dtype dt) { return dt == SBN_DTYPE_FLOAT32 ? 4 : 8; }
#endif
/* Groups a thread loads before it uses the first one: more bytes in
 * flight, more registers. Measured on an H100 (BENCHMARKS.md): float32
 * gains from 4 (2 in the passes that read two tensors), 16-bit storage,
 * whose float64 arithmetic per byte is twice float32's, loses occupancy
 * with any batch and takes 1. The order of the additions does not depend
 * on it. SBN_CUDA_BATCH (1, 2 or 4) overrides it for every dtype, to
 * measure. */
template <class D, bool TWO = false> struct Batch {
#ifdef SBN_CUDA_BATCH
  static constexpr int base = SBN_CUDA_BATCH;
#else
  static constexpr int base = sizeof(typename D::S) == 4 ? 4 : 1;
#endif
  static constexpr int value = TWO && base > 1 ? base / 2 : base;
  static_assert(base == 1 || base == 2 || base == 4, "SBN_CUDA_BATCH: 1, 2 or 4");
};
static inline int dtype_size(sbn_dtype dt) { return dt == SBN_DTYPE_FLOAT32 ? 4 : 2; }

/* ---- groups of 8 values ---- */

/* 8 values at p (aligned to V values), V values per memory access. The
 * vector types are built explicitly (float4, packed 16-bit pairs in uint32
 * lanes), and vector stores go through __stwb (an ordinary write-back store):
 * as plain stores, the compiler merged them with the scalar stores of a
 * partial group's path and split them back into 4-byte stores. */
template <class D, int V>
__device__ __forceinline__ void load8(const typename D::S *p, float v[8]) {
  typedef typename D::S S;
  static_assert(V == 1 || V == 2 || V == 4 || V == 8, "vector width");
  static_assert(V * sizeof(S) <= 16, "at most 16 bytes per access");
  if (V == 1) {
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = D::ld(p[i]);
  } else if (sizeof(S) == 4) {
    const float *f = reinterpret_cast<const float *>(p);
    if (V == 4) {
      const float4 a = reinterpret_cast<const float4 *>(f)[0], b = reinterpret_cast<const float4 *>(f)[1];
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const float2 a = reinterpret_cast<const float2 *>(f)[j];
        v[2 * j] = a.x, v[2 * j + 1] = a.y;
      }
    }
  } else { /* 16-bit: pairs in uint32 lanes, the lower address in the low half */
    uint32_t w[4];
    if (V == 8) {
      const uint4 a = *reinterpret_cast<const uint4 *>(p);
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    } else if (V == 4) {
      const uint2 a = reinterpret_cast<const uint2 *>(p)[0], b = reinterpret_cast<const uint2 *>(p)[1];
      w[0] = a.x, w[1] = a.y, w[2] = b.x, w[3] = b.y;
    } else {
#pragma unroll
      for (int j = 0; j < 4; j++) w[j] = reinterpret_cast<const uint32_t *>(p)[j];
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
      v[2 * j] = D::ld((S)(w[j] & 0xffffu));
      v[2 * j + 1] = D::ld((S)(w[j] >> 16));
    }
  }
}
/* One vector store: __stwb (st.global.wb, which the sm_90 code shows as
 * STG.E.128.STRONG.SM; plain st.global vectors measured the same on an
 * H200). */
template <class T> __device__ __forceinline__ void vstore(T *p, T v) { __stwb(p, v); }

template <class D, int V>
__device__ __forceinline__ void store8(typename D::S *p, const float v[8]) {
  typedef typename D::S S;
  static_assert(V == 1 || V == 2 || V == 4 || V == 8, "vector width");
  static_assert(V * sizeof(S) <= 16, "at most 16 bytes per access");
  if (V == 1) {
#pragma unroll
    for (int i = 0; i < 8; i++) p[i] = D::st(v[i]);
  } else if (sizeof(S) == 4) {
    float *f = reinterpret_cast<float *>(p);
    if (V == 4) {
      vstore(reinterpret_cast<float4 *>(f), make_float4(v[0], v[1], v[2], v[3]));
      vstore(reinterpret_cast<float4 *>(f) + 1, make_float4(v[4], v[5], v[6], v[7]));
    } else {
#pragma unroll
      for (int j = 0; j < 4; j++) vstore(reinterpret_cast<float2 *>(f) + j, make_float2(v[2 * j], v[2 * j + 1]));
    }
  } else {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; j++) w[j] = (uint32_t)D::st(v[2 * j]) | ((uint32_t)D::st(v[2 * j + 1]) << 16);
    if (V == 8) {
      vstore(reinterpret_cast<uint4 *>(p), make_uint4(w[0], w[1], w[2], w[3]));
    } else if (V == 4) {
      vstore(reinterpret_cast<uint2 *>(p), make_uint2(w[0], w[1]));
      vstore(reinterpret_cast<uint2 *>(p) + 1, make_uint2(w[2], w[3]));
    } else {
#pragma unroll
      for (int j = 0; j < 4; j++) vstore(reinterpret_cast<unsigned int *>(p) + j, w[j]);
    }
  }
}

/* A group of len (1..8) values; the missing ones read as 0. Only a full
 * group is loaded with vectors (its start is then aligned: see vec_width). */
template <class D, int V>
__device__ __forceinline__ void load_group(const typename D::S *p, int len, float v[8]) {
  if (len == 8) {
    load8<D, V>(p, v);
  } else {
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = i < len ? D::ld(p[i]) : 0.0f;
  }
}
template <class D, int V>
__device__ __forceinline__ void store_group(typename D::S *p, int len, const float v[8]) {
  if (len == 8) {
    store8<D, V>(p, v);
  } else {
#pragma unroll
    for (int i = 0; i < 8; i++)
      if (i < len) p[i] = D::st(v[i]);
  }
}

/* float -> double, exactly: the conversion instruction (widening by
 * integer operations on the bits was 8-16% slower on an H200). */
__device__ __forceinline__ double widen(float f) { return (double)f; }

/* float32 arithmetic with explicit rounding: the compiler never contracts
 * (fuses) or reorders these, so every instantiation (vector width, layout)
 * performs the same operations and gives the same bits. */
__device__ __forceinline__ float fadd(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float fsub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float fmul(float a, float b) { return __fmul_rn(a, b); }

/* ---- plans ---- */

/* Channels-first: `rows` rows of s values, each row cut into groups of 8
 * (the last one shorter when 8 does not divide s). A tile is rpt whole rows
 * (short rows) or one segment of sg groups of one row (long rows). */
struct cf_plan {
  int64_t rows, s;
  int64_t gpr;   /* groups per row */
  int64_t rpt;   /* rows per tile */
  int64_t nseg;  /* segments per row (1 when rpt >= 1 whole rows fit) */
  int64_t sg;    /* groups per segment */
  int64_t ntiles;
};

static inline cf_plan cf_make(int64_t rows, int64_t s, int64_t tile_groups, int64_t max_rpt) {
  cf_plan p;
  p.rows = rows, p.s = s;
  p.gpr = (s + 7) / 8;
  if (p.gpr <= tile_groups) {
    p.nseg = 1, p.sg = p.gpr;
    p.rpt = tile_groups / p.gpr;
    if (p.rpt > max_rpt) p.rpt = max_rpt;
    if (p.rpt < 1) p.rpt = 1;
  } else {
    p.rpt = 1;
    p.nseg = (p.gpr + tile_groups - 1) / tile_groups;
    p.sg = (p.gpr + p.nseg - 1) / p.nseg;
    p.nseg = (p.gpr + p.sg - 1) / p.sg;
  }
  p.ntiles = (rows + p.rpt - 1) / p.rpt * p.nseg;
  return p;
}

/* Tile j of a cf_plan: rows [row0, row0 + nr), groups [g0, g0 + gs) of each
 * row. nr * gs <= NT * GPT, so tile-local group indices fit 32 bits. */
struct cf_tile {
  int64_t row0, g0;
  uint32_t nr, gs;
};
__host__ __device__ __forceinline__ cf_tile cf_tile_of(const cf_plan &p, int64_t j) {
  cf_tile t;
  const int64_t rb = j / p.nseg, si = j - rb * p.nseg;
  t.row0 = rb * p.rpt;
  const int64_t nr = p.rows - t.row0;
  t.nr = (uint32_t)(nr < p.rpt ? nr : p.rpt);
  t.g0 = si * p.sg;
  const int64_t gs = p.gpr - t.g0;
  t.gs = (uint32_t)(gs < p.sg ? gs : p.sg);
  return t;
}

/* Group g (< nr * gs) of a tile: tile row r (its row is row0 + r), first
 * value off within the row (a multiple of 8), len values (1..8). */
struct cf_group {
  uint32_t r;
  int64_t off;
  int len;
};
__host__ __device__ __forceinline__ cf_group cf_group_of(const cf_plan &p, const cf_tile &t, uint32_t g) {
  cf_group q;
  q.r = g / t.gs;
  q.off = (t.g0 + (g - q.r * t.gs)) * 8;
  q.len = p.s - q.off < 8 ? (int)(p.s - q.off) : 8;
  return q;
}

/* Channels-first elementwise passes over rows of S values where S is not
 * a multiple of 8 (7x7 and 14x14 maps): the tensor as one flat array cut
 * into groups of 8 from its start, so every full group is one aligned
 * vector whatever S is. A group meets at most two rows (S >= 8). A tile is
 * tg consecutive groups whose rows, at most MAX_RPT_ELEMT, have their
 * coefficients converted into shared memory first. Elementwise results do
 * not depend on how values are grouped, so this changes no bit. */
struct flat_plan {
  int64_t numel, s;
  int64_t ngroups; /* groups of 8 values (the last one shorter when 8 does not divide numel) */
  int64_t tg;      /* groups per tile */
  int64_t ntiles;
};
static inline bool flat_fits(int64_t s) { return s >= 8 && s % 8 != 0 && s <= INT32_MAX; }
static inline flat_plan flat_make(int64_t numel, int64_t s, int64_t tile_groups) {
  flat_plan p;
  p.numel = numel, p.s = s;
  p.ngroups = (numel + 7) / 8;
  /* rows met by a tile starting anywhere: at most (8 tg - 1) / S + 2 */
  const int64_t most = ((MAX_RPT_ELEMT - 2) * s + 1) / 8;
  p.tg = tile_groups < most ? tile_groups : most;
  if (p.tg < 1) p.tg = 1;
  p.ntiles = (p.ngroups + p.tg - 1) / p.tg;
  return p;
}
/* Tile j: groups [g0, g0 + ng); its first value lies in row row0, at
 * position pos0 of that row; rows [row0, row0 + nrows) are its table. */
struct flat_tile {
  int64_t g0, row0;
  uint32_t ng, pos0, nrows;
};
__host__ __device__ __forceinline__ flat_tile flat_tile_of(const flat_plan &p, int64_t j) {
  flat_tile t;
  t.g0 = j * p.tg;
  const int64_t ng = p.ngroups - t.g0;
  t.ng = (uint32_t)(ng < p.tg ? ng : p.tg);
  const int64_t v0 = t.g0 * 8, v1 = (t.g0 + t.ng) * 8 < p.numel ? (t.g0 + t.ng) * 8 : p.numel;
  t.row0 = v0 / p.s;
  t.pos0 = (uint32_t)(v0 - t.row0 * p.s);
  t.nrows = (uint32_t)((v1 - 1) / p.s - t.row0 + 1);
  return t;
}
/* Group g (< ng) of a tile: its first value's table row r and position
 * off within that row, split = values in row r (the rest are in r + 1),
 * len values (1..8). */
struct flat_group {
  uint32_t r, split;
  int len;
};
__host__ __device__ __forceinline__ flat_group flat_group_of(const flat_plan &p, const flat_tile &t, uint32_t g) {
  flat_group q;
  const uint32_t s = (uint32_t)p.s;
  const uint32_t pos = t.pos0 + 8 * g;
  q.r = pos / s;
  const uint32_t off = pos - q.r * s;
  q.split = s - off < 8 ? s - off : 8;
  const int64_t left = p.numel - (t.g0 + g) * 8;
  q.len = left < 8 ? (int)left : 8;
  return q;
}

/* Rows of C channels (channels-last, or S = 1). The elementwise passes run
 * a block per tile; the reductions a block per chunk of tpc consecutive row
 * tiles and one channel block, so that each thread adds many rows before the
 * block's fixed-order combine, and a channel has nch partials, not nrt. */
struct cl_plan {
  int64_t rows, c;
  int tx, ty;   /* threads across channel groups (power of 2, <= MAX_TX) and across rows */
  int64_t cbw;  /* channels per tile = 8 tx */
  int64_t ncb;  /* channel blocks */
  int64_t rt;   /* rows per tile = ty * GPT */
  int64_t nrt;  /* row tiles */
  int64_t ntiles;
  int64_t tpc;  /* reductions: row tiles per chunk */
  int64_t nch;  /* reductions: chunks (partials per channel); blocks = nch * ncb */
};

/* Reductions of the rows layout aim at about this many blocks (several per
 * multiprocessor, so that the last wave is short), fewer when each chunk
 * would hold less than one tile. A constant, not the device's size: the
 * chunks fix the order of the additions, which must not depend on the GPU. */
constexpr int64_t CL_REDUCE_BLOCKS = 512; /* 1024 was 0-5% slower on an H200 */
/* The target in use: CL_REDUCE_BLOCKS, or a test's (sbn_cuda_set_reduce_blocks). */
int64_t sbn_cuda_reduce_blocks(void);

static inline cl_plan cl_make(int64_t rows, int64_t c, int gpt) {
  cl_plan p;
  p.rows = rows, p.c = c;
  const int64_t groups = (c + 7) / 8;
  p.tx = 1;
  while (p.tx < MAX_TX && p.tx < groups) p.tx *= 2;
  p.ty = NT / p.tx;
  p.cbw = 8 * (int64_t)p.tx;
  p.ncb = (c + p.cbw - 1) / p.cbw;
  p.rt = (int64_t)p.ty * gpt;
  p.nrt = (rows + p.rt - 1) / p.rt;
  p.ntiles = p.nrt * p.ncb;
  p.tpc = p.ntiles / sbn_cuda_reduce_blocks();
  if (p.tpc < 1) p.tpc = 1;
  p.nch = (p.nrt + p.tpc - 1) / p.tpc;
  return p;
}

/* Block b of a cl_plan: row tile rti (rows [rti * rt, ...)), channel block
 * cb (channels [cb * cbw, ...)). Thread (tx, ty) = (t % tx, t / tx) owns
 * channels [c0, c0 + clen) (clen 0..8) and rows cl_row(.., k), k < GPT,
 * those below `rows`. */
struct cl_tile {
  int64_t rti, cb;
};
__host__ __device__ __forceinline__ cl_tile cl_tile_of(const cl_plan &p, int64_t b) {
  cl_tile t;
  t.rti = b / p.ncb;
  t.cb = b - t.rti * p.ncb;
  return t;
}
__host__ __device__ __forceinline__ int64_t cl_c0(const cl_plan &p, const cl_tile &t, int tx) {
  return t.cb * p.cbw + 8 * (int64_t)tx;
}
__host__ __device__ __forceinline__ int cl_clen(const cl_plan &p, int64_t c0) {
  return p.c - c0 >= 8 ? 8 : p.c - c0 > 0 ? (int)(p.c - c0) : 0;
}
__host__ __device__ __forceinline__ int64_t cl_row(const cl_plan &p, const cl_tile &t, int ty, int k) {
  return t.rti * p.rt + ty + (int64_t)k * p.ty;
}

/* Rows k0 .. k0 + B - 1 of thread (tx, ty)'s GPT rows of a rows-layout
 * tile: its channels [c0, c0 + clen) of x into v and, when TWO, of dy into
 * w (rows past the end are skipped; callers test cl_row < rows again). */
template <class D, int V, int B, bool TWO>
__device__ __forceinline__ void cl_load_rows(const cl_plan &p, const cl_tile &t, int ty, int k0,
                                             const typename D::S *x, const typename D::S *dy, int64_t c0,
                                             int clen, float v[B][8], float w[B][8]) {
#pragma unroll
  for (int b = 0; b < B; b++) {
    const int64_t r = cl_row(p, t, ty, k0 + b);
    if (r < p.rows) {
      load_group<D, V>(x + r * p.c + c0, clen, v[b]);
      if (TWO) load_group<D, V>(dy + r * p.c + c0, clen, w[b]);
    }
  }
}

static inline bool rows_layout(sbn_geom g) { return g.layout == SBN_LAYOUT_CHANNELS_LAST || g.s == 1; }

/* Partials per channel of the reduction passes (identical for statistics
 * and backward reduce): tiles (channels-first) or chunks (rows layout); two
 * doubles each. */
static inline int64_t reduce_tiles_per_channel(sbn_geom g) {
  if (rows_layout(g)) return cl_make(g.n * g.s, g.c, gpt_of(g.dtype)).nch;
  return cf_make(g.n, g.s, (int64_t)NT * gpt_of(g.dtype), INT64_MAX).ntiles;
}

/* The widest vector (in values: 8, 4, 2 or 1; at most 16 bytes) that
 * divides the row length and to whose size every pointer is aligned: then
 * every full group starts aligned (groups start at multiples of 8 within a
 * row, rows at multiples of the row length). */
static inline int vec_width(sbn_dtype dt, int64_t row_len, const void *p0, const void *p1, const void *p2) {
  const int es = dtype_size(dt);
  for (int v = 16 / es; v > 1; v /= 2) {
    const uintptr_t a = (uintptr_t)v * (uintptr_t)es;
    if (row_len % v == 0 && (uintptr_t)p0 % a == 0 && (uintptr_t)p1 % a == 0 && (uintptr_t)p2 % a == 0)
      return v;
  }
  return 1;
}

/* Call f(D(), std::integral_constant<int, V>()) for the dtype and the
 * vector width v (rounded down to one that the dtype has). */
template <int V> using IC = std::integral_constant<int, V>;
template <class F> static inline int dispatch(sbn_dtype dt, int v, F f) {
  switch (dt) {
    case SBN_DTYPE_FLOAT32:
      if (v >= 4) return f(DF32(), IC<4>());
      if (v == 2) return f(DF32(), IC<2>());
      return f(DF32(), IC<1>());
    case SBN_DTYPE_BFLOAT16:
      if (v >= 8) return f(DBF16(), IC<8>());
      if (v == 4) return f(DBF16(), IC<4>());
      if (v == 2) return f(DBF16(), IC<2>());
      return f(DBF16(), IC<1>());
    case SBN_DTYPE_FLOAT16:
      if (v >= 8) return f(DF16(), IC<8>());
      if (v == 4) return f(DF16(), IC<4>());
      if (v == 2) return f(DF16(), IC<2>());
      return f(DF16(), IC<1>());
    default: return (int)cudaErrorInvalidValue;
  }
}

/* A geometry the kernels accept: storage dtype, a layout, non-negative
 * sizes, C < 2^31 (channel indices are 32-bit in places) and at most 2^62
 * values. */
static inline bool geom_ok(sbn_geom g) {
  if (g.dtype != SBN_DTYPE_FLOAT32 && g.dtype != SBN_DTYPE_BFLOAT16 && g.dtype != SBN_DTYPE_FLOAT16) return false;
  if (g.layout != SBN_LAYOUT_CHANNELS_FIRST && g.layout != SBN_LAYOUT_CHANNELS_LAST) return false;
  if (g.n < 0 || g.c < 0 || g.s < 0 || g.c > INT32_MAX) return false;
  if (g.n == 0 || g.c == 0 || g.s == 0) return true;
  const int64_t lim = (int64_t)1 << 62;
  return g.n <= lim / g.c && g.s <= lim / (g.n * g.c);
}

} /* namespace sbn_cuda */

#endif

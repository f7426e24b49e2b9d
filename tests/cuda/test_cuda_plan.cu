/* The CUDA kernels' work plans, checked on the host (no GPU needed): for
 * every pass, layout, dtype and a range of shapes, the kernels' own index
 * helpers (kern_common.cuh), driven through the same loops as the kernels
 * (blocks x threads x groups), must
 *  - visit every tensor value exactly once (count per value);
 *  - start every full group at a multiple of 8 within its row (so vector
 *    loads are aligned whenever vec_width allows them);
 *  - write each (channel, tile) partial sum exactly once, within the
 *    workspace that sbn_cuda_ws_reserve sizes, and merge exactly those;
 *  - give each elementwise value the coefficients of its own channel, from
 *    table slots inside the shared tables;
 *  - keep grids and tile-local indices within their integer types.
 * And vec_width picks the widest vector the row length and pointers allow.
 * Prints the plans of the ResNet-50 shapes (tiles, blocks, partial bytes
 * per tensor byte). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "../../src/cuda/kern_common.cuh"

using namespace sbn_cuda;

static int failed = 0;
#define REQUIRE(cond, ...)                    \
  do {                                        \
    if (!(cond)) {                            \
      if (failed++ < 20) {                    \
        printf("  FAIL: %s: ", #cond);        \
        printf(__VA_ARGS__);                  \
        printf("\n");                         \
      }                                       \
    }                                         \
  } while (0)

static const char *dt_name(sbn_dtype dt) {
  return dt == SBN_DTYPE_FLOAT32 ? "f32" : dt == SBN_DTYPE_BFLOAT16 ? "bf16" : "f16";
}

/* The reduction passes: tiles of bn_reduce.cu's reduce_cf / reduce_cl. */
static void check_reduce(sbn_geom g, bool verbose) {
  const int64_t N = g.n, C = g.c, S = g.s, numel = N * C * S;
  std::vector<uint8_t> seen((size_t)numel, 0);
  const int64_t tiles = reduce_tiles_per_channel(g);
  const int64_t cap = 2 * C * tiles; /* doubles sbn_cuda_ws_reserve provides */
  std::vector<uint8_t> written((size_t)cap, 0);
  int64_t blocks;
  if (rows_layout(g)) {
    const cl_plan p = cl_make(N * S, C, gpt_of(g.dtype));
    const int gpt = gpt_of(g.dtype);
    REQUIRE(p.tx >= 1 && p.tx <= MAX_TX && (p.tx & (p.tx - 1)) == 0 && p.tx * p.ty == NT, "tx %d ty %d", p.tx, p.ty);
    REQUIRE(p.nch == tiles, "nch %lld tiles %lld", (long long)p.nch, (long long)tiles);
    REQUIRE(p.tpc >= 1 && (p.nch - 1) * p.tpc < p.nrt && p.nch * p.tpc >= p.nrt, "chunks %lld x %lld, %lld tiles",
            (long long)p.nch, (long long)p.tpc, (long long)p.nrt);
    blocks = p.nch * p.ncb;
    for (int64_t b = 0; b < blocks; b++) {
      /* reduce_cl: block = (chunk, channel block), the chunk's tiles in order */
      const int64_t chunk = b / p.ncb;
      cl_tile t;
      t.cb = b - chunk * p.ncb;
      t.rti = chunk;
      const int64_t tend = (chunk + 1) * p.tpc < p.nrt ? (chunk + 1) * p.tpc : p.nrt;
      for (int tid = 0; tid < NT; tid++) {
        const int tx = tid & (p.tx - 1), ty = tid / p.tx;
        const int64_t c0 = cl_c0(p, t, tx);
        const int clen = cl_clen(p, c0);
        REQUIRE(c0 % 8 == 0, "c0 %lld", (long long)c0);
        if (clen == 0) continue;
        cl_tile tt = t;
        for (tt.rti = chunk * p.tpc; tt.rti < tend; tt.rti++)
          for (int k = 0; k < gpt; k++) {
            const int64_t r = cl_row(p, tt, ty, k);
            if (r >= p.rows) continue;
            for (int i = 0; i < clen; i++) seen[(size_t)(r * C + c0 + i)]++;
          }
      }
      /* the block's writers: threads < 16 tx, channel cl_c0(ttx) + comp % 8 */
      for (int tid = 0; tid < 16 * p.tx; tid++) {
        const int ttx = tid / 16, comp = tid % 16;
        const int64_t c = cl_c0(p, t, ttx) + comp % 8;
        if (c >= C) continue;
        const int64_t idx = (2 * t.rti + comp / 8) * C + c;
        REQUIRE(idx >= 0 && idx < cap, "partial %lld cap %lld", (long long)idx, (long long)cap);
        if (idx >= 0 && idx < cap) written[(size_t)idx]++;
      }
    }
    /* merge_rows: part[2 j C + c] and part[(2 j + 1) C + c], j < nch */
    for (int64_t c = 0; c < C; c++)
      for (int64_t j = 0; j < p.nch; j++) {
        const int64_t a = j * 2 * C + c;
        REQUIRE(a + C < cap && written[(size_t)a] == 1 && written[(size_t)(a + C)] == 1, "merge c %lld j %lld", (long long)c, (long long)j);
      }
  } else {
    const cf_plan p = cf_make(N, S, (int64_t)NT * gpt_of(g.dtype), INT64_MAX);
    REQUIRE(p.ntiles == tiles, "tiles");
    blocks = C * p.ntiles;
    for (int64_t b = 0; b < blocks; b++) {
      const int64_t c = b / p.ntiles, j = b - c * p.ntiles;
      const cf_tile t = cf_tile_of(p, j);
      REQUIRE((uint64_t)t.nr * t.gs <= (uint64_t)NT * gpt_of(g.dtype), "tile groups %u x %u", t.nr, t.gs);
      const uint32_t ng = t.nr * t.gs;
      for (int tid = 0; tid < NT; tid++)
        for (uint32_t gg = tid; gg < ng; gg += NT) {
          const cf_group q = cf_group_of(p, t, gg);
          REQUIRE(q.off % 8 == 0 && q.len >= 1 && q.len <= 8 && q.off + q.len <= S, "group off %lld len %d", (long long)q.off, q.len);
          REQUIRE(t.row0 + q.r < N, "row");
          const int64_t base = ((t.row0 + q.r) * C + c) * S + q.off;
          for (int i = 0; i < q.len; i++) seen[(size_t)(base + i)]++;
        }
      if (p.ntiles == 1) continue; /* one tile a channel: the block writes the outputs, no partials */
      REQUIRE(2 * b + 1 < cap, "partial");
      if (2 * b + 1 < cap) written[(size_t)(2 * b)]++, written[(size_t)(2 * b + 1)]++;
    }
    /* merge<...>(part, C, ntiles, sj = 2, sc = 2 ntiles, oq = 1), when ntiles > 1 */
    for (int64_t c = 0; c < C && p.ntiles > 1; c++)
      for (int64_t j = 0; j < p.ntiles; j++) {
        const int64_t a = j * 2 + c * 2 * p.ntiles;
        REQUIRE(written[(size_t)a] == 1 && written[(size_t)(a + 1)] == 1, "merge c %lld j %lld", (long long)c, (long long)j);
      }
  }
  REQUIRE(blocks <= INT32_MAX, "grid");
  int64_t bad = 0;
  for (int64_t i = 0; i < numel; i++) bad += seen[(size_t)i] != 1;
  REQUIRE(bad == 0, "%lld values not visited exactly once (reduce)", (long long)bad);
  if (verbose) {
    const double tb = (double)numel * dtype_size(g.dtype);
    printf("  reduce: %lld tiles/channel, %lld blocks, partials %.1f%% of the tensor's bytes\n", (long long)tiles,
           (long long)blocks, tb > 0 ? 100.0 * 16.0 * (double)(C * tiles) / tb : 0.0);
  }
}

/* The elementwise passes: tiles of bn_elemt.cu's elemt_cf / elemt_cl. */
static void check_elemt(sbn_geom g, bool verbose) {
  const int64_t N = g.n, C = g.c, S = g.s, numel = N * C * S;
  std::vector<uint8_t> seen((size_t)numel, 0);
  int64_t blocks;
  if (rows_layout(g)) {
    const cl_plan p = cl_make(N * S, C, gpt_of(g.dtype));
    const int gpt = gpt_of(g.dtype);
    blocks = p.ntiles;
    REQUIRE(p.cbw <= MAX_RPT_ELEMT, "table");
    for (int64_t b = 0; b < p.ntiles; b++) {
      const cl_tile t = cl_tile_of(p, b);
      const int64_t cstart = cl_c0(p, t, 0);
      for (int tid = 0; tid < NT; tid++) {
        const int tx = tid & (p.tx - 1), ty = tid / p.tx;
        const int64_t c0 = cl_c0(p, t, tx);
        const int clen = cl_clen(p, c0);
        if (clen == 0) continue;
        for (int k = 0; k < gpt; k++) {
          const int64_t r = cl_row(p, t, ty, k);
          if (r >= p.rows) continue;
          for (int i = 0; i < clen; i++) {
            const int col = 8 * tx + i; /* table column of channel c0 + i */
            REQUIRE(col < p.cbw && cstart + col == c0 + i, "column");
            seen[(size_t)(r * C + c0 + i)]++;
          }
        }
      }
    }
  } else {
    const cf_plan p = cf_make(N * C, S, (int64_t)NT * gpt_of(g.dtype), MAX_RPT_ELEMT);
    blocks = p.ntiles;
    for (int64_t b = 0; b < p.ntiles; b++) {
      const cf_tile t = cf_tile_of(p, b);
      REQUIRE(t.nr <= MAX_RPT_ELEMT, "rows per tile %u", t.nr);
      const int64_t ch0 = t.row0 % C;
      const uint32_t ng = t.nr * t.gs;
      for (int tid = 0; tid < NT; tid++)
        for (uint32_t gg = tid; gg < ng; gg += NT) {
          const cf_group q = cf_group_of(p, t, gg);
          REQUIRE(q.off % 8 == 0 && q.len >= 1 && q.len <= 8 && q.off + q.len <= S, "group");
          const int64_t row = t.row0 + q.r;
          REQUIRE((ch0 + q.r) % C == row % C, "channel of row %lld", (long long)row);
          for (int i = 0; i < q.len; i++) seen[(size_t)(row * S + q.off + i)]++;
        }
    }
  }
  REQUIRE(blocks <= INT32_MAX, "grid");
  int64_t bad = 0;
  for (int64_t i = 0; i < numel; i++) bad += seen[(size_t)i] != 1;
  REQUIRE(bad == 0, "%lld values not visited exactly once (elementwise)", (long long)bad);
  if (!rows_layout(g) && flat_fits(S)) { /* elemt_flat, when the pointers are aligned */
    const flat_plan p = flat_make(numel, S, (int64_t)NT * gpt_of(g.dtype));
    std::fill(seen.begin(), seen.end(), 0);
    REQUIRE(p.ntiles <= INT32_MAX, "flat grid");
    for (int64_t b = 0; b < p.ntiles; b++) {
      const flat_tile t = flat_tile_of(p, b);
      REQUIRE(t.nrows >= 1 && t.nrows <= MAX_RPT_ELEMT, "flat tile rows %u", t.nrows);
      const int64_t ch0 = t.row0 % C;
      for (int tid = 0; tid < NT; tid++)
        for (uint32_t gg = tid; gg < t.ng; gg += NT) {
          const flat_group q = flat_group_of(p, t, gg);
          const int64_t base = (t.g0 + gg) * 8;
          REQUIRE(q.len >= 1 && q.len <= 8 && base + q.len <= numel && q.split >= 1, "flat group");
          for (int i = 0; i < q.len; i++) {
            const uint32_t r = q.r + ((uint32_t)i < q.split ? 0 : 1); /* the kernel's table row */
            const int64_t v = base + i, row = v / S;
            REQUIRE(r < t.nrows && t.row0 + r == row && (ch0 + r) % C == row % C, "flat value %lld: row %lld, table %u",
                    (long long)v, (long long)row, r);
            seen[(size_t)v]++;
          }
        }
    }
    bad = 0;
    for (int64_t i = 0; i < numel; i++) bad += seen[(size_t)i] != 1;
    REQUIRE(bad == 0, "%lld values not visited exactly once (flat elementwise)", (long long)bad);
    if (verbose) printf("  elementwise (flat, aligned pointers): %lld blocks\n", (long long)p.ntiles);
  }
  if (verbose) printf("  elementwise: %lld blocks\n", (long long)blocks);
}

static void check_vec_width(void) {
  char *base = (char *)0x10000; /* addresses only, never dereferenced */
  REQUIRE(vec_width(SBN_DTYPE_FLOAT32, 64, base, base, base) == 4, "f32 aligned");
  REQUIRE(vec_width(SBN_DTYPE_FLOAT32, 49, base, base, base) == 1, "f32 odd row");
  REQUIRE(vec_width(SBN_DTYPE_FLOAT32, 6, base, base, base) == 2, "f32 row 6");
  REQUIRE(vec_width(SBN_DTYPE_FLOAT32, 64, base + 4, base, base) == 1, "f32 pointer +4");
  REQUIRE(vec_width(SBN_DTYPE_FLOAT32, 64, base, base + 8, base) == 2, "f32 pointer +8");
  REQUIRE(vec_width(SBN_DTYPE_BFLOAT16, 64, base, base, base) == 8, "bf16 aligned");
  REQUIRE(vec_width(SBN_DTYPE_BFLOAT16, 196, base, base, base) == 4, "bf16 row 196");
  REQUIRE(vec_width(SBN_DTYPE_FLOAT16, 64, base, base + 2, base) == 1, "f16 pointer +2");
  REQUIRE(vec_width(SBN_DTYPE_FLOAT16, 64, base, base + 4, base) == 2, "f16 pointer +4");
}

int main(void) {
  struct Shape {
    int64_t n, c, s;
    bool show;
  };
  static const Shape shapes[] = {
      {32, 64, 112 * 112, true}, {32, 256, 56 * 56, true}, {32, 512, 28 * 28, true},
      {32, 1024, 14 * 14, true}, {32, 2048, 7 * 7, true},  {2, 64, 112 * 112, false},
      {3, 5, 63, false},         {2, 7, 13, false},         {3, 33, 289, false},
      {4, 12, 6, false},         {5, 3, 1, false},          {1, 1, 1, false},
      {16, 1, 1000, false},      {1, 2, 100003, false},     {2, 3, 40000, false},
      {256, 10, 1, false},       {64, 1000, 1, false},      {3, 4097, 1, false},
      {1000, 1, 1, false},       {7, 3, 1, false},          {2, 130, 9, false},
      {1, 1, 3000001, false},    {3, 100003, 1, false},     {1, 70000, 2, false},
      {9, 17, 8, false},         {1024, 24, 9, false},
  };
  const sbn_dtype dts[] = {SBN_DTYPE_FLOAT32, SBN_DTYPE_BFLOAT16, SBN_DTYPE_FLOAT16};
  int cases = 0;
  for (const Shape &sh : shapes)
    for (sbn_dtype dt : dts)
      for (int layout = 0; layout < 2; layout++) {
        const sbn_geom g = {sh.n, sh.c, sh.s, (sbn_layout)layout, dt};
        const bool show = sh.show && dt != SBN_DTYPE_FLOAT16;
        if (show)
          printf("%s %s (%lld, %lld, %lld):\n", dt_name(dt), layout ? "CL" : "CF", (long long)sh.n,
                 (long long)sh.c, (long long)sh.s);
        REQUIRE(geom_ok(g), "geom");
        const int before = failed;
        check_reduce(g, show);
        check_elemt(g, show);
        if (rows_layout(g)) { /* chunks of several row tiles at small sizes too (the kernel test's hook) */
          sbn_cuda_set_reduce_blocks(4);
          check_reduce(g, false);
          sbn_cuda_set_reduce_blocks(0);
        }
        if (failed != before)
          printf("  ^ in %s %s (%lld, %lld, %lld)\n", dt_name(dt), layout ? "CL" : "CF", (long long)sh.n,
                 (long long)sh.c, (long long)sh.s);
        cases++;
      }
  check_vec_width();
  const sbn_geom bad_dt = {2, 3, 4, SBN_LAYOUT_CHANNELS_FIRST, SBN_DTYPE_FLOAT64};
  const sbn_geom bad_c = {2, (int64_t)1 << 32, 1, SBN_LAYOUT_CHANNELS_LAST, SBN_DTYPE_FLOAT32};
  const sbn_geom big = {(int64_t)1 << 40, (int64_t)1 << 20, (int64_t)1 << 10, SBN_LAYOUT_CHANNELS_LAST, SBN_DTYPE_FLOAT32};
  REQUIRE(!geom_ok(bad_dt) && !geom_ok(bad_c) && !geom_ok(big), "geom_ok rejects");
  printf("%d plans checked, %d failures\n", cases, failed);
  if (failed) {
    printf("FAIL\n");
    return 1;
  }
  printf("PASS\n");
  return 0;
}

/* The equivalence suite over MPI ranks (run under mpirun -np P).
 *
 * For randomized configurations (bn_case.c's case_random: uneven and empty
 * ranks, 2-D..5-D, both layouts, affine/tracking on and off, momentum
 * 0.1/0.3/none, 1-3 training steps then eval, and the two-sub-group case
 * made alternately with sbn_group_new and sbn_group_split), every rank runs
 * its own rank through the MPI backend; rank 0 collects all ranks' outputs
 * and checks them
 *   1. against the float64 reference on the concatenated batch (testutil's
 *      ref_step; tolerances of bn_case.c: y 2e-6, dx 1e-5 relative, grads
 *      and running statistics 1e-6 relative), and
 *   2. BITWISE against the threads backend: rank 0 runs the same
 *      configuration on the same per-rank inputs with sbn_team_run and
 *      compares y, dx, grad_weight, grad_bias, running stats and
 *      num_batches_tracked with memcmp.
 * Usage: test_mpi_equivalence [cases]   (default 24) */
#include <mpi.h>
#include <stdio.h>

#include "../../src/comm/exact_lanes.h"
#include "../../src/comm/mpi_paths.h"
#include "mpi_case.h"
#include "mpi_check.h"
#include "syncbn_mpi.h"

/* The group collectives directly, in both payload regimes (in the envelope,
 * and the ordered reduce-scatter beyond 64 KiB): every rank generates every
 * rank's values (wide exponents, so the summation order shows in the last
 * bits), and the result must equal the correctly rounded exact sum (the
 * definition of both backends), bitwise. Also broadcast and barrier,
 * on the world and on a split sub-group. Returns failures (rank 0's count). */
static int check_collectives(sbn_group *g, int rank, const char *label) {
  const int P = sbn_group_size(g), me = sbn_group_rank(g);
  static const size_t counts[] = {0, 1, 129, 4097, 8193, 50001};
  int bad = 0;
  for (int dt = 0; dt < 2; dt++)
    for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
      const size_t n = counts[k] * (dt ? 2 : 1); /* float32: 2x the count, same bytes */
      const sbn_dtype dtype = dt ? SBN_DTYPE_FLOAT32 : SBN_DTYPE_FLOAT64;
      double *all = malloc(8 * (n * (size_t)P + 1)), *want = malloc(8 * (n + 1)), *mine = malloc(8 * (n + 1));
      float *minef = (float *)mine;
      rng r = rng_seed(777 + n);
      for (size_t i = 0; i < n * (size_t)P; i++) {
        all[i] = rng_normal(&r) * pow(10.0, rng_int(&r, -6, 6));
        if (dt) all[i] = (float)all[i];
      }
      size_t order_matters = 0;
      for (size_t i = 0; i < n; i++) {
        /* want: the exact sum rounded once (terms span < 2^100, so their
         * binary128 sum is exact); order_matters: elements where a float64
         * sum in rank order and in reverse order differ */
        __float128 exact = 0;
        double s = 0, rev = 0;
        for (int q = 0; q < P; q++) s += all[(size_t)q * n + i], exact += all[(size_t)q * n + i];
        for (int q = P - 1; q >= 0; q--) rev += all[(size_t)q * n + i];
        want[i] = dt ? (double)(float)exact : (double)exact;
        order_matters += dt ? (float)s != (float)rev : s != rev;
        if (dt) minef[i] = (float)all[(size_t)me * n + i];
        else mine[i] = all[(size_t)me * n + i];
      }
      size_t engine_off = 0; /* evidence: the engine's own float64 sum depends on its order */
      const int show_engine = !dt && n == 50001 && P == sbn_group_size(g) && strncmp(label, "world", 5) == 0;
      if (show_engine) {
        double *e = malloc(8 * n);
        memcpy(e, mine, 8 * n);
        MPI_Request req;
        MPI_Iallreduce(MPI_IN_PLACE, e, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        for (size_t i = 0; i < n; i++) engine_off += memcmp(&e[i], &want[i], 8) != 0;
        memcpy(e, mine, 8 * n);
        MPI_Allreduce(MPI_IN_PLACE, e, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        size_t blocking_off = 0;
        for (size_t i = 0; i < n; i++) blocking_off += memcmp(&e[i], &want[i], 8) != 0;
        if (rank == 0)
          printf("     engine's own MPI_SUM of the same doubles: %zu (MPI_Iallreduce) and %zu (MPI_Allreduce) of %zu "
                 "elements differ from the exact sum\n", engine_off, blocking_off, n);
        free(e);
      }
      sbn_status st = sbn_group_allreduce(g, mine, n, dtype, SBN_REDUCE_OP_SUM);
      size_t wrong = 0;
      for (size_t i = 0; st == SBN_STATUS_OK && i < n; i++)
        wrong += dt ? memcmp(&minef[i], &(float){(float)want[i]}, 4) != 0 : memcmp(&mine[i], &want[i], 8) != 0;
      int fail = st != SBN_STATUS_OK || wrong;
      int any = 0;
      MPI_Allreduce(&fail, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
      bad += any;
      if (rank == 0)
        printf("%-4s %s allreduce %6zu x %s (%zu bytes, %s): %zu elements differ from the correctly rounded "
               "exact sum (float64 sums in and against rank order differ in %zu)%s%s\n", any ? "FAIL" : "ok", label, n, dt ? "float32" : "float64",
               n * (dt ? 4 : 8), n * (dt ? 4 : 8) <= 65536 ? "in the envelope" : "ordered reduce-scatter", wrong,
               order_matters, st ? " status " : "", st ? sbn_status_name(st) : "");
      free(all), free(want), free(mine);
    }
  static const size_t bsizes[] = {0, 100, 200000};
  for (size_t k = 0; k < 3; k++) {
    const size_t n = bsizes[k];
    unsigned char *b = malloc(n + 1);
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(me == P - 1 ? i * 7 + 3 : 0xEE);
    sbn_status st = sbn_group_broadcast(g, b, n, P - 1);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += b[i] != (unsigned char)(i * 7 + 3);
    int fail = st != SBN_STATUS_OK || wrong, any = 0;
    MPI_Allreduce(&fail, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    bad += any;
    if (rank == 0) printf("%-4s %s broadcast of %zu bytes from rank %d: %zu bytes wrong\n", any ? "FAIL" : "ok", label, n, P - 1, wrong);
    free(b);
  }
  sbn_status st = sbn_group_barrier(g);
  int fail = st != SBN_STATUS_OK, any = 0;
  MPI_Allreduce(&fail, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  bad += any;
  if (rank == 0) printf("%-4s %s barrier\n", any ? "FAIL" : "ok", label);
  return bad;
}

/* The same collective again and again, as a training loop calls it, with
 * magnitudes that hold for a while, jump up, jump down, cancel, and one
 * rank far below the others: after the first call the values go as
 * integer lanes in predicted windows, falling back to binned sums when a
 * term leaves its window. Every result must be bitwise the binned exact sum
 * of all ranks' terms (computed here in rank order, from the same inputs),
 * whichever path it took; the path counts are printed (lanes must have
 * been used, and the fallback too; with the two-rank path on, that path
 * alone). Returns failures (rank 0's count). */
static int check_repeats(sbn_group *g, int rank, int pair) {
  const int P = sbn_group_size(g), me = sbn_group_rank(g);
  static const int scale[] = {0, 0, 1, -1, 0, 40, 40, 41, -30, -30, 0, 0, 0, 0, 3, 0};
  enum { STEPS = sizeof scale / sizeof *scale };
  int bad = 0;
  uint64_t before[SBN_MPI_PATHS], after[SBN_MPI_PATHS];
  sbn_mpi_path_counts(g, before);
  for (int dt = 0; dt < 2; dt++)
    for (size_t n = 129; n <= 4097; n += 3968) {
      const sbn_dtype dtype = dt ? SBN_DTYPE_FLOAT32 : SBN_DTYPE_FLOAT64;
      double *all = malloc(8 * n * (size_t)P), *mine = malloc(8 * n), *want = malloc(8 * n);
      float *minef = (float *)mine;
      size_t wrong = 0;
      for (int k = 0; k < STEPS; k++) {
        rng r = rng_seed(4242 + (uint64_t)k * 7 + n);
        for (int q = 0; q < P; q++)
          for (size_t i = 0; i < n; i++) {
            double v = ldexp(rng_normal(&r) * pow(10.0, rng_int(&r, -3, 3)), scale[k]);
            if (k == 12 && q == P - 1) v = ldexp(v, -60);                      /* one rank far below */
            if (k == 13 && q == P - 1 && i % 2) v = -all[i];                   /* cancellation */
            all[(size_t)q * n + i] = dt ? (float)v : v;
          }
        for (size_t i = 0; i < n; i++) {
          sbn_xbin acc = sbn_xsum_zero();
          for (int q = 0; q < P; q++) sbn_xsum_add(&acc, all[(size_t)q * n + i]);
          if (dt) {
            float f;
            sbn_xsum_decode_f32(&f, &acc, 1);
            want[i] = f;
            minef[i] = (float)all[(size_t)me * n + i];
          } else {
            sbn_xsum_decode_f64(&want[i], &acc, 1);
            mine[i] = all[(size_t)me * n + i];
          }
        }
        sbn_status st = sbn_group_allreduce(g, mine, n, dtype, SBN_REDUCE_OP_SUM);
        for (size_t i = 0; i < n; i++)
          wrong += st != SBN_STATUS_OK || (dt ? memcmp(&minef[i], &(float){(float)want[i]}, 4) : memcmp(&mine[i], &want[i], 8)) != 0;
      }
      int fail = wrong != 0, any = 0;
      MPI_Allreduce(&fail, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
      bad += any;
      if (rank == 0)
        printf("%-4s repeated allreduce %5zu x %s, %d calls (magnitude jumps, cancellation, a rank 2^-60 below): "
               "%zu elements differ from the binned exact sum\n", any ? "FAIL" : "ok", n, dt ? "float32" : "float64",
               STEPS, wrong);
      free(all), free(mine), free(want);
    }
  sbn_mpi_path_counts(g, after);
  const uint64_t lanes = after[0] - before[0], fallback = after[1] - before[1], binned = after[2] - before[2];
  const uint64_t pairs = after[3] - before[3];
  const int used = pair ? pairs > 0 && lanes + fallback + binned == 0
                        : pairs == 0 && (P > SBN_XLANES_MAX_TERMS || (lanes > 0 && fallback > 0));
  int any = 0;
  MPI_Allreduce(&(int){!used}, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  bad += any;
  if (rank == 0)
    printf("%-4s paths of those sums: %llu integer lanes, %llu lanes then binned fallback, %llu binned, %llu two-rank "
           "(%s)\n", any ? "FAIL" : "ok", (unsigned long long)lanes, (unsigned long long)fallback,
           (unsigned long long)binned, (unsigned long long)pairs,
           pair ? "two-rank path on: it alone" : "lanes and fallback must both occur for P <= 63");
  return bad;
}

/* P = 2: the two-rank path (raw values exchanged, each rank sums the
 * pair) against the binned path (the two-rank path turned off) in the same
 * process on the same data, bitwise, and both against the binned exact sum
 * of the two terms computed here. The data: exponents up to 60 apart (the
 * shortcut's limit is 22), near ties decided by a bit beyond the binned
 * window (where a + b in hardware differs from the binned sum), cancellation,
 * +-0, subnormals, +-inf, NaN, overflow; blocks of 64 ordinary values (the
 * vectorized shortcut) and blocks with such values here and there. Counts change between calls (1, 63,
 * 64, 65, 4097, then SBN_MPI_PAIR_MAX-sized pieces), so some sums go inline
 * (predicted count), others after a header (new count, learnt); 500-1000
 * values are just over the eager limit, so their exchanges go in two parts
 * (values in both, or a header and an empty part). */
static double special_value(rng *r, int me) {
  static const double sp[] = {0.0, -0.0, 0x1p-1074, -0x1p-1060, 0x1p-1022, INFINITY, -INFINITY, NAN, 0x1.fffffffffffffp1023};
  const int k = rng_int(r, 0, (int)(sizeof sp / sizeof *sp) - 1);
  return me && sp[k] == 0x1.fffffffffffffp1023 ? sp[k] : sp[k] * (rng_uniform(r) < 0.5 ? 1 : -1);
}

static int check_pair_path(sbn_group *g, int rank) {
  const int me = sbn_group_rank(g);
  static const size_t counts[] = {1, 63, 64, 65, 4097, 4097, 4097, 64, (size_t)2 * 1048576 + 3, 4097,
                                  513, 513, 513, 700, 513, 1000, 1000, 1001, 1001, 503};
  int bad = 0;
  for (int dt = 0; dt < 2; dt++)
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
      const size_t n = counts[c];
      const sbn_dtype dtype = dt ? SBN_DTYPE_FLOAT32 : SBN_DTYPE_FLOAT64;
      const size_t es = dt ? 4 : 8;
      double *v[2];
      for (int q = 0; q < 2; q++) v[q] = malloc(8 * n);
      rng r = rng_seed(9090 + 31 * c + (size_t)dt);
      size_t far = 0, special = 0, zeros = 0;
      for (size_t i = 0; i < n; i++) {
        const int mode = (int)(i / 64 % 4); /* whole blocks of ordinary values, and mixed ones */
        double a = ldexp(1 + rng_uniform(&r), rng_int(&r, dt ? -100 : -1000, dt ? 100 : 1000)) * (rng_uniform(&r) < 0.5 ? -1 : 1);
        double b = ldexp(rng_normal(&r), ilogb(a) - rng_int(&r, 0, mode == 3 ? 60 : 22));
        if (mode < 2 && rng_uniform(&r) < 0.05) b = rng_uniform(&r) < 0.5 ? 0.0 : -0.0, a = rng_uniform(&r) < 0.3 ? -0.0 : a;
        if (mode >= 2 && rng_uniform(&r) < 0.1) b = -a * (1 + ldexp(rng_int(&r, -2, 2), dt ? -23 : -52)); /* cancellation */
        if (mode == 2 && !dt && i % 2) /* a near tie decided by a bit beyond the binned window: not the shortcut */
          b = ldexp(1, ilogb(a) - 53 + rng_int(&r, 0, 2)) * (1 + ldexp(rng_int(&r, 1, 3), -52));
        if (mode == 3 && rng_uniform(&r) < 0.2) (rng_uniform(&r) < 0.5 ? (a = special_value(&r, 0)) : (b = special_value(&r, 1))), special++;
        if (rng_uniform(&r) < 0.5) { const double t = a; a = b, b = t; }
        if (dt) a = (float)a, b = (float)b; /* float32: values in float range, subnormal floats included */
        far += isfinite(a) && isfinite(b) && a && b && abs(ilogb(a) - ilogb(b)) > 22;
        zeros += a == 0 || b == 0;
        v[0][i] = a, v[1][i] = b;
      }
      void *on = malloc(es * n), *off = malloc(es * n), *want = malloc(es * n);
      for (size_t i = 0; i < n; i++) {
        sbn_xbin acc = sbn_xsum_zero();
        sbn_xsum_add(&acc, v[0][i]), sbn_xsum_add(&acc, v[1][i]);
        if (dt) ((float *)on)[i] = (float)v[me][i], sbn_xsum_decode_f32((float *)want + i, &acc, 1);
        else ((double *)on)[i] = v[me][i], sbn_xsum_decode_f64((double *)want + i, &acc, 1);
      }
      memcpy(off, on, es * n);
      uint64_t p0[SBN_MPI_PATHS], p1[SBN_MPI_PATHS], p2[SBN_MPI_PATHS];
      sbn_mpi_path_counts(g, p0);
      const int was = sbn_mpi_set_pair(g, 1);
      sbn_status s1 = sbn_group_allreduce(g, on, n, dtype, SBN_REDUCE_OP_SUM);
      sbn_mpi_path_counts(g, p1);
      sbn_mpi_set_pair(g, 0);
      sbn_status s2 = sbn_group_allreduce(g, off, n, dtype, SBN_REDUCE_OP_SUM);
      sbn_mpi_path_counts(g, p2);
      sbn_mpi_set_pair(g, was);
      size_t diff = 0, wrong = 0;
      for (size_t i = 0; i < n; i++) {
        diff += memcmp((char *)on + es * i, (char *)off + es * i, es) != 0;
        wrong += memcmp((char *)on + es * i, (char *)want + es * i, es) != 0;
      }
      const int paths_ok = p1[3] == p0[3] + 1 && p2[3] == p1[3] && p2[0] + p2[1] + p2[2] == p1[0] + p1[1] + p1[2] + 1;
      int fail = s1 != SBN_STATUS_OK || s2 != SBN_STATUS_OK || diff || wrong || !paths_ok, any = 0;
      MPI_Allreduce(&fail, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
      bad += any;
      if (rank == 0)
        printf("%-4s two-rank path vs binned path, %7zu x %s (%zu pairs > 22 binades apart, %zu with +-0, %zu specials): %zu "
               "results differ between the paths, %zu from the binned exact sum; path counts %s%s%s\n",
               any ? "FAIL" : "ok", n, dt ? "float32" : "float64", far, zeros, special, diff, wrong,
               paths_ok ? "ok" : "WRONG", s1 || s2 ? " status " : "", s1 ? sbn_status_name(s1) : s2 ? sbn_status_name(s2) : "");
      free(v[0]), free(v[1]), free(on), free(off), free(want);
    }
  return bad;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, P;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const int ncases = argc > 1 ? atoi(argv[1]) : 24;
  int failures = 0;
  sbn_group *world = NULL;
  sbn_status st = sbn_group_from_mpi(&world, MPI_COMM_WORLD);
  if (st != SBN_STATUS_OK || sbn_group_rank(world) != rank || sbn_group_size(world) != P ||
      strcmp(sbn_group_backend(world), "mpi") != 0) {
    fprintf(stderr, "rank %d: sbn_group_from_mpi: %s %s\n", rank, sbn_status_name(st), sbn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0) printf("MPI equivalence suite: %d ranks, %d cases, group '%s' (%s)\n", P, ncases,
                        sbn_group_name(world), sbn_group_backend(world));
  failures += check_collectives(world, rank, "world:");
  if (P >= 2) {
    const int pair = sbn_mpi_set_pair(world, 1); /* on by default at P = 2, unless SYNCBN_MPI_PAIR=0 */
    sbn_mpi_set_pair(world, pair);
    if (rank == 0) printf("two-rank path (P = 2): %s\n", P != 2 ? "not used" : pair ? "on" : "off (SYNCBN_MPI_PAIR=0)");
    failures += check_repeats(world, rank, pair);
    if (P == 2) { /* the other path too, in the same process */
      sbn_mpi_set_pair(world, !pair);
      failures += check_repeats(world, rank, !pair);
      sbn_mpi_set_pair(world, pair);
      failures += check_pair_path(world, rank);
    }
  }
  if (P >= 2) { /* a split sub-group (odd/even ranks, reversed by key) */
    sbn_group *sub = NULL;
    st = sbn_group_split(&sub, world, rank % 2, -rank);
    int bad = st != SBN_STATUS_OK || sbn_group_size(sub) != (P - rank % 2 + 1) / 2, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    if (any) {
      if (rank == 0) printf("FAIL split: %s %s\n", sbn_status_name(st), sbn_last_error());
      failures++;
    } else {
      char label[160];
      snprintf(label, sizeof label, "'%s' (rank %d of %d):", sbn_group_name(sub), sbn_group_rank(sub), sbn_group_size(sub));
      failures += check_collectives(sub, rank, label);
    }
    sbn_group_destroy(sub);
  }
  rng r = rng_seed(20261122u + (uint64_t)P);
  errs tot = {0};
  int bitwise_diffs = 0;
  for (int k = 0; k < ncases; k++) {
    case_cfg cfg;
    const int halves = P >= 2 && k % 3 == 2;
    case_random(&cfg, &r, P, halves); /* same stream on every rank: same configuration */
    static mcase mc;
    mcase_generate(&mc, &cfg, k % 2);
    mcase_rank(world, &mc, rank);
    collect(&mc, rank);
    if (rank == 0) failures += check_case(&mc, k, "threads", &tot, &bitwise_diffs);
    mcase_free(&mc);
  }
  MPI_Bcast(&failures, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rank == 0)
    printf("\nnp=%d: %d cases, %d failed. worst: y %.2e (tol %.0e), dx %.2e (tol %.0e rel), gw %.2e gb %.2e "
           "rm %.2e rv %.2e (tol %.0e rel); records differing from threads: %d (must be 0)\n",
           P, ncases, failures, tot.y, TOL_Y, tot.dx, TOL_DX_REL, tot.gw, tot.gb, tot.rm, tot.rv, TOL_REL,
           bitwise_diffs);
  sbn_group_destroy(world);
  MPI_Finalize();
  return failures ? 1 : 0;
}

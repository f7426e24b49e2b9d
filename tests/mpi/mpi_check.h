/* Rank 0's checks of an MPI run of an mcase (mpi_case.h): the records
 * collected from every rank, against the float64 reference and bitwise
 * against the same case run by thread ranks (team_fn with sbn_team_run).
 * Header-only test support, for the MPI tests on the CPU and on a GPU. */
#ifndef SBN_MPI_CHECK_H
#define SBN_MPI_CHECK_H

#include <mpi.h>

#include "mpi_case.h"

#define TOL_REL 1e-6 /* as bn_case.c: float32 rounding of float64 sums */

static inline void worst(double *w, double v) {
  if (!(v <= *w)) *w = v;
}

typedef struct errs { double y, dx, gw, gb, rm, rv; int nbt_bad; } errs;

/* Rank 0: the MPI outputs in mc against the float64 reference. */
static inline void check_reference(const mcase *mc, errs *e) {
  const case_cfg *cfg = &mc->cfg;
  const int64_t C = cfg->opt.num_features;
  for (int half = 0; half < (cfg->halves ? 2 : 1); half++) {
    int lo = cfg->halves && half ? cfg->P / 2 : 0, hi = cfg->halves && !half ? cfg->P / 2 : cfg->P;
    ref_bn ref;
    ref_init(&ref, &cfg->opt, mc->w, mc->b);
    for (int s = 0; s < mcase_steps(mc); s++) {
      ref_out out[CASE_MAX_RANKS];
      rank_data tmp[CASE_MAX_RANKS]; /* ref_step takes non-const rank data */
      for (int p = lo; p < hi; p++) tmp[p] = mc->data[s][p], ref_out_alloc(&out[p], &tmp[p], C);
      ref_step(&ref, s < cfg->steps, &tmp[lo], hi - lo, &out[lo]);
      double dxmax = 0;
      for (int p = lo; p < hi; p++) dxmax = fmax(dxmax, max_abs(out[p].dx, tmp[p].numel));
      for (int p = lo; p < hi; p++) {
        const mrec *r = &mc->rec[s][p];
        const int64_t n = tmp[p].numel;
        worst(&e->y, y_err(r->y, out[p].y, n));
        worst(&e->dx, max_abs_diff(r->dx, out[p].dx, n) / (dxmax + 1e-30));
        if (cfg->opt.affine) worst(&e->gw, rel_err_f(r->gw, out[p].gw, C)), worst(&e->gb, rel_err_f(r->gb, out[p].gb, C));
        if (cfg->opt.track_running_stats) {
          worst(&e->rm, rel_err_f(r->rm, ref.rm, C));
          worst(&e->rv, rel_err_f(r->rv, ref.rv, C));
          if (r->nbt != ref.nbt) e->nbt_bad = 1;
        }
        ref_out_free(&out[p]);
      }
    }
    ref_free(&ref);
  }
}

static inline int same(const float *a, const float *b, int64_t n) {
  if (!a || !b) return a == b;
  return memcmp(a, b, 4 * (size_t)n) == 0;
}

/* Rank 0: number of records differing from the threads run (bitwise). */
static inline int check_bitwise(const mcase *mpi, const mcase *thr) {
  const int64_t C = mpi->cfg.opt.num_features;
  int diffs = 0;
  for (int s = 0; s < mcase_steps(mpi); s++)
    for (int p = 0; p < mpi->cfg.P; p++) {
      const mrec *a = &mpi->rec[s][p], *b = &thr->rec[s][p];
      const int64_t n = mpi->data[s][p].numel;
      diffs += !same(a->y, b->y, n) + !same(a->dx, b->dx, n) + !same(a->gw, b->gw, C) +
               !same(a->gb, b->gb, C) + !same(a->rm, b->rm, C) + !same(a->rv, b->rv, C) + (a->nbt != b->nbt);
    }
  return diffs;
}

static inline int team_fn(sbn_group *world, void *arg) {
  return mcase_rank(world, arg, sbn_group_rank(world));
}

/* Ranks != 0 send their records to rank 0, which stores them in mc. */
static inline void collect(mcase *mc, int rank) {
  const int64_t C = mc->cfg.opt.num_features;
  for (int p = 1; p < mc->cfg.P; p++) {
    if (rank != 0 && rank != p) continue;
    int st = (int)mc->status[p];
    if (rank == p) MPI_Send(&st, 1, MPI_INT, 0, 1, MPI_COMM_WORLD), MPI_Send(mc->msg[p], 256, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
    else MPI_Recv(&st, 1, MPI_INT, p, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE), MPI_Recv(mc->msg[p], 256, MPI_CHAR, p, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    mc->status[p] = (sbn_status)st;
    if (st != SBN_STATUS_OK) continue;
    for (int s = 0; s < mcase_steps(mc); s++) {
      mrec *r = &mc->rec[s][p];
      const int64_t n = mc->data[s][p].numel;
      float **fields[6] = {&r->y, &r->dx, &r->gw, &r->gb, &r->rm, &r->rv};
      int64_t lens[6] = {n, n, C, C, C, C};
      for (int f = 0; f < 6; f++) {
        int present = *fields[f] != NULL;
        if (rank == p) {
          MPI_Send(&present, 1, MPI_INT, 0, 2, MPI_COMM_WORLD);
          if (present) MPI_Send(*fields[f], (int)lens[f], MPI_FLOAT, 0, 2, MPI_COMM_WORLD);
        } else {
          MPI_Recv(&present, 1, MPI_INT, p, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          if (present) {
            *fields[f] = malloc(4 * (size_t)(lens[f] ? lens[f] : 1));
            MPI_Recv(*fields[f], (int)lens[f], MPI_FLOAT, p, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          }
        }
      }
      if (rank == p) MPI_Send(&r->nbt, 1, MPI_INT64_T, 0, 3, MPI_COMM_WORLD);
      else MPI_Recv(&r->nbt, 1, MPI_INT64_T, p, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
  }
}

/* Rank 0, after collect: case k (mc, run over MPI with use_split = k % 2)
 * against the reference and, bitwise, against thread ranks running it
 * (`vs` names them in the line printed). Folds the errors into *tot and
 * the differing records into *bitwise_diffs; returns 1 if the case failed. */
static inline int check_case(const mcase *mc, int k, const char *vs, errs *tot, int *bitwise_diffs) {
  const case_cfg *cfg = &mc->cfg;
  static mcase mt;
  char desc[512];
  int bad = 0, diffs = -1;
  for (int p = 0; p < cfg->P; p++)
    if (mc->status[p] != SBN_STATUS_OK)
      printf("  rank %d failed: %s: %s\n", p, sbn_status_name(mc->status[p]), mc->msg[p]), bad = 1;
  errs e = {0};
  if (!bad) {
    check_reference(mc, &e);
    mcase_generate(&mt, cfg, k % 2);
    sbn_status ts = sbn_team_run(cfg->P, team_fn, &mt);
    if (ts != SBN_STATUS_OK) printf("  threads run failed: %s: %s\n", sbn_status_name(ts), sbn_last_error()), bad = 1;
    else diffs = check_bitwise(mc, &mt);
    mcase_free(&mt);
    bad |= !(e.y <= TOL_Y) || !(e.dx <= TOL_DX_REL) || !(e.gw <= TOL_REL) || !(e.gb <= TOL_REL) ||
           !(e.rm <= TOL_REL) || !(e.rv <= TOL_REL) || e.nbt_bad || diffs != 0;
    worst(&tot->y, e.y), worst(&tot->dx, e.dx), worst(&tot->gw, e.gw), worst(&tot->gb, e.gb);
    worst(&tot->rm, e.rm), worst(&tot->rv, e.rv);
    if (diffs > 0) *bitwise_diffs += diffs;
  }
  printf("%-4s %s%s: y %.1e dx %.1e gw %.1e gb %.1e rm %.1e rv %.1e; vs %s: %s%s\n", bad ? "FAIL" : "ok",
         case_describe(desc, sizeof desc, cfg), cfg->halves ? (k % 2 ? " [split]" : " [new_group]") : "", e.y, e.dx,
         e.gw, e.gb, e.rm, e.rv, vs, diffs == 0 ? "bitwise identical" : diffs < 0 ? "not compared" : "DIFFERENT",
         e.nbt_bad ? " num_batches_tracked WRONG" : "");
  return bad;
}

#endif

/* One randomized SyncBN scenario run over a team of thread ranks and checked
 * against the float64 reference and against plain BatchNorm (group NULL) on
 * the concatenated batch. Shared by the reference, equivalence, determinism
 * and PyTorch-peer tests. */
#ifndef SBN_BN_CASE_H
#define SBN_BN_CASE_H

#include "testutil.h"

enum { CASE_MAX_RANKS = 16, CASE_MAX_STEPS = 8 };

typedef struct case_cfg {
  int P;                 /* ranks in the team */
  int halves;            /* 1: two sub-groups {0..P/2-1} and {P/2..P-1} synchronize separately */
  int ndim;
  int64_t shape[CASE_MAX_RANKS][SBN_MAX_DIMS]; /* per-rank shape (C equal) */
  sbn_layout layout;
  sbn_bn_options opt;
  int steps;             /* training steps, then one eval step */
  double mean_scale;     /* channel means are mean_scale * std (ill-conditioning) */
  uint64_t seed;
} case_cfg;

typedef struct case_err { /* worst errors of a run, relative as documented */
  double y, dx, gw, gb, rm, rv, single;
  int nbt_bad;
} case_err;

/* Random configuration (P ranks, uneven and possibly empty, each group's
 * count > 1); halves: two sub-groups. */
void case_random(case_cfg *cfg, rng *r, int P, int halves);
/* Describe cfg in one line. */
const char *case_describe(char *buf, size_t cap, const case_cfg *cfg);
/* Run it; compare; fill err. Returns 0 if all within tolerance. If outputs is
 * non-NULL, the per-rank y and dx of every step are appended to it (for
 * bitwise determinism checks; caller frees). */
int case_run(const case_cfg *cfg, case_err *err, float **outputs, size_t *n_outputs);

/* Where case_run's P-rank layers live: NULL (the default) is the CPU. A GPU
 * test points it at hooks that place each rank's tensors in device memory
 * (the outputs are poisoned there too) and copy parameters and results;
 * the single-rank comparison layer stays on the CPU. */
typedef struct case_device {
  sbn_device device;
  void *(*alloc)(size_t bytes);                               /* device memory */
  void (*release)(void *p);
  void (*upload)(void *dst, const void *src, size_t bytes);   /* host -> device, waits */
  void (*download)(void *dst, const void *src, size_t bytes); /* device -> host, waits */
  int (*rank_begin)(sbn_bn *bn, int rank); /* e.g. give the layer a stream; 0: ok */
  void (*rank_end)(int rank);
} case_device;
extern const case_device *case_dev;

/* Tolerances (justified in bn_case.c). */
#define TOL_Y 2e-6
#define TOL_DX_REL 1e-5

#endif

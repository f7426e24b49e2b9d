/* How syncbn-train was started: alone, by an MPI launcher it can join, or by
 * a launcher it cannot join (torchrun-style variables, Slurm without PMIx). */
#ifndef SBN_TRAIN_LAUNCH_H
#define SBN_TRAIN_LAUNCH_H

#include <stddef.h>

typedef enum launch_kind {
  LAUNCH_STANDALONE, /* no launcher (or a launcher with one process) */
  LAUNCH_MPI,        /* mpirun, or direct launch through PMIx/PMI (srun --mpi=pmix) */
  LAUNCH_REFUSED     /* several processes we cannot join: *why says how to launch */
} launch_kind;

/* Decide from the environment. with_mpi: this binary has MPI support. */
launch_kind launch_detect(int with_mpi, char *why, size_t cap);

#endif

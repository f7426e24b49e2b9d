/* Launcher detection. A launcher that starts several copies of the program
 * and is ignored would make each copy train alone as "rank 0" on the whole
 * data set: several independent jobs that look like one. So: join what Open
 * MPI can join (mpirun, or direct launch where PMIx/PMI hands out ranks),
 * and refuse everything else with the command that works. */
#include "launch.h"

#include <stdio.h>
#include <stdlib.h>

static long env_long(const char *name) {
  const char *s = getenv(name);
  if (!s || !*s) return -1;
  char *end;
  long v = strtol(s, &end, 10);
  return *end ? -1 : v;
}

launch_kind launch_detect(int with_mpi, char *why, size_t cap) {
  why[0] = 0;
  /* Set by mpirun (OMPI_*), by PMIx servers (srun --mpi=pmix, prterun) and
   * by PMI-1/2 launchers (MPICH's hydra, srun --mpi=pmi2). */
  const char *mpi_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"};
  const char *found = NULL;
  for (size_t i = 0; i < sizeof mpi_vars / sizeof *mpi_vars && !found; i++)
    if (getenv(mpi_vars[i])) found = mpi_vars[i];
  if (found) {
    if (with_mpi) return LAUNCH_MPI;
    if (env_long("OMPI_COMM_WORLD_SIZE") == 1 || env_long("PMI_SIZE") == 1) return LAUNCH_STANDALONE;
    snprintf(why, cap,
             "started by an MPI launcher (%s is set) but this syncbn-train was built without MPI: "
             "install libopenmpi-dev and rebuild, or run one process with thread ranks "
             "(syncbn-train --ranks P)",
             found);
    return LAUNCH_REFUSED;
  }
  long ws = env_long("WORLD_SIZE"), nt = env_long("SLURM_NTASKS");
  if (nt < 0) nt = env_long("SLURM_NPROCS");
  if (ws > 1) {
    snprintf(why, cap,
             "started by a torchrun-style launcher (RANK=%s, WORLD_SIZE=%ld), which syncbn-train cannot "
             "join: run one process with thread ranks (syncbn-train --ranks %ld) or one MPI process per rank "
             "(mpirun -np %ld syncbn-train)",
             getenv("RANK") ? getenv("RANK") : "?", ws, ws, ws);
    return LAUNCH_REFUSED;
  }
  if (getenv("SLURM_PROCID") && nt > 1) {
    snprintf(why, cap,
             "started as Slurm task %s of %ld without an MPI process manager: launch with "
             "'srun --mpi=pmix syncbn-train' (Open MPI direct launch) or 'mpirun -np %ld syncbn-train' "
             "inside the allocation",
             getenv("SLURM_PROCID"), nt, nt);
    return LAUNCH_REFUSED;
  }
  return LAUNCH_STANDALONE;
}

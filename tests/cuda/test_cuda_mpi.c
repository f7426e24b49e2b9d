/* The equivalence suite with MPI processes sharing a GPU (run under mpirun
 * -np P): every process is one rank whose layer lives on CUDA device 0 and
 * synchronizes through the MPI group, i.e. the host-staged path (the O(C)
 * statistics copied to the host, the MPI backend's exact all-reduce, copied
 * back). For randomized configurations (bn_case.c's case_random: uneven and
 * empty ranks, 2-D..5-D, both layouts, options, several steps then eval,
 * ill-conditioned channels, two sub-groups made with sbn_group_new and
 * sbn_group_split) rank 0 collects every rank's outputs and checks them
 *   1. against the float64 reference on the concatenated batch (the
 *      tolerances of bn_case.c), and
 *   2. BITWISE against the same configuration run by thread ranks sharing
 *      the GPU in rank 0's process (the threads backend's exact sums are
 *      the MPI backend's, and the kernels are deterministic).
 * Without a GPU every rank prints SKIP and passes.
 * Usage: test_cuda_mpi [cases]   (default 12) */
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <stdio.h>

#include "mpi_case.h"
#include "mpi_check.h"
#include "syncbn_mpi.h"

/* Device hooks for mpi_case.h: each rank (a process here, a thread in the
 * threads comparison) has its own non-blocking stream, so that a missing
 * wait in the library shows as a wrong result. */
static _Thread_local cudaStream_t tl_stream;

static void cuda_ok(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "test_cuda_mpi: %s: %s\n", what, cudaGetErrorString(e));
  MPI_Abort(MPI_COMM_WORLD, 1);
}
static void *hook_alloc(size_t bytes) {
  void *p = NULL;
  cuda_ok(cudaMalloc(&p, bytes ? bytes : 4), "cudaMalloc");
  return p;
}
static void hook_release(void *p) { cuda_ok(cudaFree(p), "cudaFree"); }
static void hook_upload(void *dst, const void *src, size_t bytes) {
  cuda_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, tl_stream), "cudaMemcpyAsync");
  cuda_ok(cudaStreamSynchronize(tl_stream), "cudaStreamSynchronize");
}
static void hook_download(void *dst, const void *src, size_t bytes) {
  cuda_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, tl_stream), "cudaMemcpyAsync");
  cuda_ok(cudaStreamSynchronize(tl_stream), "cudaStreamSynchronize");
}
static int hook_rank_begin(sbn_bn *bn, int rank) {
  (void)rank;
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  cuda_ok(cudaStreamCreateWithFlags(&tl_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return sbn_bn_set_stream(bn, tl_stream) == SBN_STATUS_OK ? 0 : 1;
}
static void hook_rank_end(int rank) {
  (void)rank;
  cuda_ok(cudaStreamSynchronize(tl_stream), "cudaStreamSynchronize");
  cuda_ok(cudaStreamDestroy(tl_stream), "cudaStreamDestroy");
  tl_stream = NULL;
}
static const case_device gpu_hooks = {{SBN_DEVICE_CUDA, 0}, hook_alloc,  hook_release,  hook_upload,
                                      hook_download,        hook_rank_begin, hook_rank_end};

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const int ncases = argc > 1 ? atoi(argv[1]) : 12;
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  int have = e == cudaSuccess && ndev > 0, all = 0;
  MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  if (!all) {
    if (rank == 0)
      printf("SKIP: test_cuda_mpi needs a GPU on every rank (rank 0: %s, %d devices)\n",
             e == cudaSuccess ? "ok" : cudaGetErrorString(e), ndev);
    MPI_Finalize();
    return 0;
  }
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  case_dev = &gpu_hooks;
  sbn_group *world = NULL;
  sbn_status st = sbn_group_from_mpi(&world, MPI_COMM_WORLD);
  if (st != SBN_STATUS_OK) {
    fprintf(stderr, "rank %d: sbn_group_from_mpi: %s %s\n", rank, sbn_status_name(st), sbn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0) {
    struct cudaDeviceProp prop;
    cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    printf("GPU equivalence over MPI: %d processes sharing %s, %d cases, group '%s' (%s)\n", P, prop.name, ncases,
           sbn_group_name(world), sbn_group_backend(world));
  }
  rng r = rng_seed(20261126u + (uint64_t)P);
  errs tot = {0};
  int failures = 0, bitwise_diffs = 0;
  for (int k = 0; k < ncases; k++) {
    case_cfg cfg;
    const int halves = P >= 2 && k % 3 == 2;
    case_random(&cfg, &r, P, halves); /* the same stream on every rank: the same configuration */
    static mcase mc;
    mcase_generate(&mc, &cfg, k % 2);
    mcase_rank(world, &mc, rank);
    collect(&mc, rank);
    if (rank == 0) failures += check_case(&mc, k, "GPU thread ranks", &tot, &bitwise_diffs);
    mcase_free(&mc);
  }
  MPI_Bcast(&failures, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rank == 0)
    printf("\nnp=%d on the GPU: %d cases, %d failed. worst: y %.2e (tol %.0e), dx %.2e (tol %.0e rel), gw %.2e "
           "gb %.2e rm %.2e rv %.2e (tol %.0e rel); records differing from GPU thread ranks: %d (must be 0)\n",
           P, ncases, failures, tot.y, TOL_Y, tot.dx, TOL_DX_REL, tot.gw, tot.gb, tot.rm, tot.rv, TOL_REL,
           bitwise_diffs);
  sbn_group_destroy(world);
  MPI_Finalize();
  return failures ? 1 : 0;
}

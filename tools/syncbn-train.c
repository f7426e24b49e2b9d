/* syncbn-train: train a small ResNet data-parallel with synchronized batch
 * normalization, the reason syncbn exists.
 *
 *   syncbn-train                       4 thread ranks, SyncBN vs local BN
 *   mpirun -np 4 syncbn-train --bn sync   one MPI process per rank
 *
 * See --help. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/report.h"
#include "train/trainer.h"
#ifdef SBN_TRAIN_WITH_MPI
#include "syncbn_mpi.h"
#endif

void openblas_set_num_threads(int num_threads); /* OpenBLAS's (no header needed) */

static void usage(FILE *f) {
  fprintf(f,
          "usage: syncbn-train [options]\n"
          "Train a small ResNet data-parallel over several ranks. Each rank sees a small\n"
          "batch; with --bn sync its batch-norm statistics are synchronized over all ranks.\n\n"
          "  --ranks P          thread ranks in this process (default 4; under mpirun the\n"
          "                     MPI processes are the ranks and this is ignored)\n"
          "  --batch B          images per rank per step (default 4)\n"
          "  --epochs E         epochs (default 5)\n"
          "  --lr LR            SGD learning rate (default 0.02, cosine decay over the\n"
          "                     epochs), --momentum M (0.9),\n"
          "                     --weight-decay W (5e-4)\n"
          "  --bn MODE          sync | local | both (default both: train each, compare)\n"
          "  --data SPEC        synthetic (default), cifar10:DIR (data_batch_*.bin,\n"
          "                     test_batch.bin), mnist:DIR (train-images-idx3-ubyte, ...)\n"
          "  --train-size N     synthetic training images (default 2048), --test-size N (1024)\n"
          "  --width W          channels of the first stage (default 16)\n"
          "  --seed S           seed for data, weights and shuffling (default 1)\n"
          "  --checkpoint-dir D write an atomic checkpoint per epoch into D\n"
          "  --resume           continue from D's checkpoint (exactly where it stopped)\n"
          "  --out DIR          where train_log.csv and train_curves.png go (default build/run)\n"
          "  --stop-after K     stop after K steps as if interrupted (for tests)\n"
          "  --quiet            no per-epoch lines\n"
          "  --help             this text\n\n"
          "Ctrl-C stops after the current step and writes a checkpoint (with\n"
          "--checkpoint-dir); --resume continues from it.\n");
}

typedef struct run_ctx {
  train_cfg cfg;
  const sbn_dataset *train, *test;
  train_result *result;
} run_ctx;

static int rank_main(sbn_group *world, void *arg) {
  run_ctx *c = arg;
  return (int)train_run(world, &c->cfg, c->train, c->test, c->result);
}

static void on_sigint(int sig) {
  (void)sig;
  train_interrupted = 1;
}

static sbn_status load_data(sbn_dataset *train, sbn_dataset *test, const char *spec, int64_t ntrain,
                            int64_t ntest, uint64_t seed) {
  if (!strcmp(spec, "synthetic")) {
    sbn_status st = sbn_dataset_synthetic(train, ntrain, seed);
    return st == SBN_STATUS_OK ? sbn_dataset_synthetic(test, ntest, seed + 1000003) : st;
  }
  char p[8][600];
  if (!strncmp(spec, "cifar10:", 8)) {
    const char *files[5];
    for (int i = 0; i < 5; i++) snprintf(p[i], sizeof p[i], "%s/data_batch_%d.bin", spec + 8, i + 1), files[i] = p[i];
    snprintf(p[5], sizeof p[5], "%s/test_batch.bin", spec + 8);
    const char *tf[1] = {p[5]};
    sbn_status st = sbn_dataset_load_cifar10(train, files, 5);
    return st == SBN_STATUS_OK ? sbn_dataset_load_cifar10(test, tf, 1) : st;
  }
  if (!strncmp(spec, "mnist:", 6)) {
    snprintf(p[0], sizeof p[0], "%s/train-images-idx3-ubyte", spec + 6);
    snprintf(p[1], sizeof p[1], "%s/train-labels-idx1-ubyte", spec + 6);
    snprintf(p[2], sizeof p[2], "%s/t10k-images-idx3-ubyte", spec + 6);
    snprintf(p[3], sizeof p[3], "%s/t10k-labels-idx1-ubyte", spec + 6);
    sbn_status st = sbn_dataset_load_mnist(train, p[0], p[1]);
    return st == SBN_STATUS_OK ? sbn_dataset_load_mnist(test, p[2], p[3]) : st;
  }
  fprintf(stderr, "syncbn-train: unknown --data '%s' (synthetic, cifar10:DIR or mnist:DIR)\n", spec);
  return SBN_STATUS_INVALID_ARGUMENT;
}

int main(int argc, char **argv) {
  train_cfg base = {.ranks = 4, .batch = 4, .epochs = 5, .width = 16, .lr = 0.02, .momentum = 0.9,
                    .weight_decay = 5e-4, .sync_bn = 1, .seed = 1};
  const char *bn_mode = "both", *data = "synthetic", *out_dir = "build/run";
  int64_t ntrain = 2048, ntest = 1024;
  enum { O_LR = 256, O_MOM, O_WD, O_BN, O_DATA, O_TRAIN, O_TEST, O_WIDTH, O_SEED, O_CKPT, O_RESUME, O_OUT, O_STOP, O_QUIET };
  static const struct option opts[] = {
      {"ranks", 1, 0, 'p'}, {"batch", 1, 0, 'b'}, {"epochs", 1, 0, 'e'}, {"lr", 1, 0, O_LR},
      {"momentum", 1, 0, O_MOM}, {"weight-decay", 1, 0, O_WD}, {"bn", 1, 0, O_BN}, {"data", 1, 0, O_DATA},
      {"train-size", 1, 0, O_TRAIN}, {"test-size", 1, 0, O_TEST}, {"width", 1, 0, O_WIDTH}, {"seed", 1, 0, O_SEED},
      {"checkpoint-dir", 1, 0, O_CKPT}, {"resume", 0, 0, O_RESUME}, {"out", 1, 0, O_OUT},
      {"stop-after", 1, 0, O_STOP}, {"quiet", 0, 0, O_QUIET}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
  for (int c; (c = getopt_long(argc, argv, "p:b:e:h", opts, NULL)) != -1;) {
    switch (c) {
      case 'p': base.ranks = atoi(optarg); break;
      case 'b': base.batch = atoi(optarg); break;
      case 'e': base.epochs = atoi(optarg); break;
      case O_LR: base.lr = atof(optarg); break;
      case O_MOM: base.momentum = atof(optarg); break;
      case O_WD: base.weight_decay = atof(optarg); break;
      case O_BN: bn_mode = optarg; break;
      case O_DATA: data = optarg; break;
      case O_TRAIN: ntrain = atoll(optarg); break;
      case O_TEST: ntest = atoll(optarg); break;
      case O_WIDTH: base.width = atoi(optarg); break;
      case O_SEED: base.seed = strtoull(optarg, NULL, 10); break;
      case O_CKPT: base.ckpt_dir = optarg; break;
      case O_RESUME: base.resume = 1; break;
      case O_OUT: out_dir = optarg; break;
      case O_STOP: base.stop_after_steps = atoll(optarg); break;
      case O_QUIET: base.quiet = 1; break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  int want_sync = !strcmp(bn_mode, "sync") || !strcmp(bn_mode, "both");
  int want_local = !strcmp(bn_mode, "local") || !strcmp(bn_mode, "both");
  if ((!want_sync && !want_local) || base.ranks < 1 || base.batch < 1 || base.epochs < 1 ||
      base.epochs > TRAIN_MAX_EPOCHS || base.width < 1 || ntrain < 2 || ntest < 1 || !(base.lr > 0)) {
    fprintf(stderr, "syncbn-train: bad arguments (see --help)\n");
    return 2;
  }

  /* Ranks are the parallelism: OpenBLAS threads inside each rank's small
   * GEMMs would only oversubscribe the cores (4.5x slower measured here). */
  openblas_set_num_threads(1);
  sbn_group *mpi_world = NULL;
  int rank = 0;
#ifdef SBN_TRAIN_WITH_MPI
  if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE")) { /* launched by mpirun */
    MPI_Init(&argc, &argv);
    sbn_status st = sbn_group_from_mpi(&mpi_world, MPI_COMM_WORLD);
    if (st != SBN_STATUS_OK) {
      fprintf(stderr, "syncbn-train: MPI group: %s\n", sbn_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    rank = sbn_group_rank(mpi_world);
    base.ranks = sbn_group_size(mpi_world);
  }
#endif
  base.progress = rank == 0 && isatty(STDERR_FILENO) && !base.quiet;
  if (rank != 0) base.quiet = 1;
  signal(SIGINT, on_sigint);
  mkdir(out_dir, 0755);
  if (base.ckpt_dir) mkdir(base.ckpt_dir, 0755);

  sbn_dataset train = {0}, test = {0};
  sbn_status st = load_data(&train, &test, data, ntrain, ntest, base.seed);
  if (st != SBN_STATUS_OK) {
    fprintf(stderr, "syncbn-train: %s\n", sbn_last_error());
    return 1;
  }
  if (rank == 0)
    printf("syncbn-train: %s data (%lld train / %lld test images of %dx%dx%d), %d %s ranks x batch %d, %d epochs\n",
           train.name, (long long)train.count, (long long)test.count, train.channels, train.height, train.width,
           base.ranks, mpi_world ? "MPI" : "thread", base.batch, base.epochs);

  static train_result results[2];
  const char *modes[2];
  const train_result *res_ptrs[2];
  int nmodes = 0, failed = 0;
  for (int pass = 0; pass < 2 && !failed; pass++) {
    if (pass == 0 ? !want_sync : !want_local) continue;
    run_ctx ctx = {base, &train, &test, &results[nmodes]};
    ctx.cfg.sync_bn = pass == 0;
    modes[nmodes] = pass == 0 ? "syncbn" : "localbn";
    res_ptrs[nmodes] = &results[nmodes];
    if (rank == 0 && !base.quiet) printf("%s:\n", pass == 0 ? "SyncBatchNorm over all ranks" : "local BatchNorm on each rank");
    st = mpi_world ? (sbn_status)rank_main(mpi_world, &ctx) : sbn_team_run(base.ranks, rank_main, &ctx);
    if (st != SBN_STATUS_OK) {
      fprintf(stderr, "syncbn-train: rank %d: training failed: %s: %s\n", rank, sbn_status_name(st),
              results[nmodes].error[0] ? results[nmodes].error : sbn_last_error());
      failed = 1;
    }
    nmodes++;
    if (results[nmodes - 1].interrupted) break;
  }
  int rc = failed;
  if (rank == 0 && nmodes > 0 && !failed) {
    char csv[600], png[600];
    snprintf(csv, sizeof csv, "%s/train_log.csv", out_dir);
    snprintf(png, sizeof png, "%s/train_curves.png", out_dir);
    printf("\n  %-16s %10s %12s %12s\n", "batch norm", "final loss", "train acc", "test acc");
    for (int i = 0; i < nmodes; i++) {
      const train_result *r = res_ptrs[i];
      const epoch_stats *e = r->epochs_done ? &r->epoch[r->epochs_done - 1] : NULL;
      printf("  %-16s %10.4f %11.1f%% %11.1f%%%s\n", i == 0 && want_sync ? "SyncBN" : "local BN", e ? e->loss : 0,
             e ? 100 * e->train_acc : 0, e ? 100 * e->test_acc : 0, r->interrupted ? "  (interrupted)" : "");
      if (r->checkpoint[0]) printf("  checkpoint: %s\n", r->checkpoint);
    }
    if (report_csv(csv, modes, res_ptrs, nmodes) == 0) printf("  log:  %s\n", csv);
    char title[200];
    snprintf(title, sizeof title, "syncbn-train: %d ranks x batch %d, %s data", base.ranks, base.batch, train.name);
    if (report_plot(png, csv, title) == 0) printf("  plot: %s\n", png);
    else printf("  plot: not drawn (gnuplot missing or failed)\n");
  }
  sbn_dataset_free(&train), sbn_dataset_free(&test);
#ifdef SBN_TRAIN_WITH_MPI
  if (mpi_world) {
    sbn_group_destroy(mpi_world);
    MPI_Finalize();
  }
#endif
  return rc;
}

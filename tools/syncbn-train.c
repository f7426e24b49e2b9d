/* syncbn-train: train a small ResNet data-parallel with synchronized batch
 * normalization, the reason syncbn exists.
 *
 *   syncbn-train                       4 thread ranks, SyncBN vs local BN
 *   mpirun -np 4 syncbn-train --bn sync   one MPI process per rank
 *
 * See --help. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/args.h"
#include "train/data.h"
#include "train/fail.h"
#include "train/file.h"
#include "train/launch.h"
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
          "  --batch B          images per rank per step (default 4; 1 works: batch-norm\n"
          "                     statistics of images are over N x H x W values)\n"
          "  --epochs E         epochs (default 5)\n"
          "  --lr LR            SGD learning rate (default 0.02, cosine decay over the\n"
          "                     epochs), --momentum M (0.9), --weight-decay W (5e-4)\n"
          "  --bn MODE          sync | local | both (default both: train each, compare)\n"
          "  --data SPEC        synthetic (default); fashion-mnist (Debian's\n"
          "                     dataset-fashion-mnist); mnist:DIR (train-images-idx3-ubyte\n"
          "                     ..., gzipped or not); cifar10:DIR (binary version:\n"
          "                     data_batch_1.bin ... test_batch.bin)\n"
          "  --train-size N     synthetic training images (default 2048), --test-size N (1024)\n"
          "  --width W          channels of the first stage (default 16)\n"
          "  --seed S           seed for data, weights and shuffling (default 1)\n"
          "  --checkpoint-dir D after every epoch write D/syncbn-train-MODE.safetensors (MODE:\n"
          "                     syncbn or localbn; the model: a PyTorch state dict) and\n"
          "                     ...MODE.resume.safetensors\n"
          "  --resume           continue from D's resume file (--checkpoint-dir D),\n"
          "                     exactly where it stopped (refused if --ranks, --batch,\n"
          "                     --seed, --width, --momentum or the data differ, or the\n"
          "                     file is past --epochs; a changed --lr or\n"
          "                     --weight-decay applies from there on, and is said; a complete\n"
          "                     run trains nothing and exits 0; none yet: start at epoch 1,\n"
          "                     unless D holds the model file)\n"
          "  --out DIR          where train_log.csv and train_curves.png go (default\n"
          "                     build/run, under the current directory)\n"
          "  --stop-after K     stop after K steps as if interrupted (for tests)\n"
          "  --quiet            no per-epoch lines\n"
          "  --version, --help\n\n"
          "Numbers are decimal: an optional sign, digits, for real values a '.' and an\n"
          "exponent (--lr 2e-2); spaces, hexadecimal, inf and nan are refused.\n\n"
          "Ctrl-C (SIGINT) or SIGTERM stops after the current step, on every rank, and\n"
          "writes a checkpoint (with --checkpoint-dir); --resume continues from it. A run\n"
          "stopped so exits 0 and marks its rows \"(interrupted)\". A second Ctrl-C or\n"
          "SIGTERM (half a second or more after the first) ends the process at once\n"
          "(killed by that signal), e.g. when a step cannot finish; the last checkpoint\n"
          "saved stays complete. A folder given as\n"
          "--out or --checkpoint-dir is locked: a second run into it is refused. Errors\n"
          "exit 1, a bad command line or a folder in use 2 (an option's value may not\n"
          "start with \"--\": write --out=--x).\n");
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

/* The first SIGINT/SIGTERM asks every rank to stop at the end of the step
 * (and save a checkpoint to resume from). A second one ends the process at
 * once by the signal's default action: the way out of a run that does not
 * reach the end of its step (a collective waiting for a lost rank) short of
 * SIGKILL or SYNCBN_TIMEOUT. One Ctrl-C often arrives twice within
 * milliseconds (the terminal signals the whole process group, and a wrapper
 * such as timeout or mpirun forwards its own copy), so a signal counts as a
 * second one only STOP_REPEAT_NS after the first. Checkpoints are saved by
 * renaming a complete file into place, so the last one saved stays whole;
 * a save cut short leaves only its temporary file, which the next save
 * removes. */
#define STOP_REPEAT_NS 500000000LL
static atomic_llong first_stop_ns; /* 0: no stop signal yet */

static void on_stop_signal(int sig) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t); /* async-signal-safe */
  const long long now = (long long)t.tv_sec * 1000000000LL + t.tv_nsec + 1;
  atomic_store_explicit(&train_interrupted, 1, memory_order_relaxed);
  long long first = 0;
  if (atomic_compare_exchange_strong(&first_stop_ns, &first, now) || now - first < STOP_REPEAT_NS) return;
  signal(sig, SIG_DFL);
  raise(sig);
}

/* A group that broke (a rank stopped arriving) cannot be finalized: under
 * MPI the job must be aborted or it waits for the lost rank forever. */
static int group_broke(sbn_status st) {
  return st == SBN_STATUS_TIMEOUT || st == SBN_STATUS_GROUP_BROKEN || st == SBN_STATUS_PEER_FAILED;
}

/* mkdir -p */
static int make_dirs(const char *path) {
  char p[4096];
  if (!*path) return errno = ENOENT, -1; /* the loop below starts after the first character */
  if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return errno = ENAMETOOLONG, -1;
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = 0;
      if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
      *s = '/';
    }
  return mkdir(p, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* The output folder must exist and take files before any training starts. */
static int check_dir(const char *what, const char *dir) {
  struct stat sb;
  const int made = make_dirs(dir) == 0 && stat(dir, &sb) == 0;
  if (made && !S_ISDIR(sb.st_mode)) { /* mkdir's EEXIST accepted it; access would only say EACCES */
    fprintf(stderr, "syncbn-train: %s '%s' is not a directory%s\n", what, dir,
            S_ISREG(sb.st_mode) ? ": it is a regular file" : "");
    return -1;
  }
  if (!made || access(dir, W_OK | X_OK) != 0) {
    fprintf(stderr, "syncbn-train: %s '%s' is not a writable folder: %s\n", what, dir, strerror(errno));
    return -1;
  }
  return 0;
}

/* Two runs saving into one folder would overwrite each other's checkpoints
 * epoch after epoch, each then naming the file as its own (and, in one
 * --out, each other's log and plot). Both folders are
 * locked (flock on the directory: no file of ours in it) for the life of
 * the process; the lock goes with it, however it ends. Only a lock that is
 * held elsewhere stops the run: a file system without flock (some network
 * ones) does not. */
static int lock_dir(const char *what, const char *dir) {
  /* --out and --checkpoint-dir may name one folder: flock locks belong to
   * an open file, so a second lock of our own would refuse us. */
  static dev_t held_dev;
  static ino_t held_ino;
  static int held;
  struct stat sb;
  if (held && stat(dir, &sb) == 0 && sb.st_dev == held_dev && sb.st_ino == held_ino) return 0;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return 0;
  if (flock(fd, LOCK_EX | LOCK_NB) == 0 || errno != EWOULDBLOCK) { /* fd stays open */
    if (!held && fstat(fd, &sb) == 0) held = 1, held_dev = sb.st_dev, held_ino = sb.st_ino;
    return 0;
  }
  fprintf(stderr, "syncbn-train: %s '%s' is in use by another run (it holds a lock on the folder); "
                  "wait for it to end or use another folder\n", what, dir);
  close(fd);
  return -1;
}

int main(int argc, char **argv) {
  train_cfg base = {.ranks = 4, .batch = 4, .epochs = 5, .width = 16, .lr = 0.02, .momentum = 0.9,
                    .weight_decay = 5e-4, .sync_bn = 1, .seed = 1};
  const char *bn_mode = "both", *data = "synthetic", *out_dir = "build/run";
  int64_t ntrain = 2048, ntest = 1024;
  enum { O_LR = 256, O_MOM, O_WD, O_BN, O_DATA, O_TRAIN, O_TEST, O_WIDTH, O_SEED, O_CKPT, O_RESUME, O_OUT, O_STOP,
         O_QUIET, O_VERSION };
  static const struct option opts[] = {
      {"ranks", 1, 0, 'p'}, {"batch", 1, 0, 'b'}, {"epochs", 1, 0, 'e'}, {"lr", 1, 0, O_LR},
      {"momentum", 1, 0, O_MOM}, {"weight-decay", 1, 0, O_WD}, {"bn", 1, 0, O_BN}, {"data", 1, 0, O_DATA},
      {"train-size", 1, 0, O_TRAIN}, {"test-size", 1, 0, O_TEST}, {"width", 1, 0, O_WIDTH}, {"seed", 1, 0, O_SEED},
      {"checkpoint-dir", 1, 0, O_CKPT}, {"resume", 0, 0, O_RESUME}, {"out", 1, 0, O_OUT},
      {"stop-after", 1, 0, O_STOP}, {"quiet", 0, 0, O_QUIET}, {"version", 0, 0, O_VERSION}, {"help", 0, 0, 'h'},
      {0, 0, 0, 0}};
  opterr = 0; /* one line of our own instead of getopt's */
  int bad = 0;
  for (int c, li = -1; !bad && (c = getopt_long(argc, argv, ":p:b:e:h", opts, &li)) != -1; li = -1) {
    /* "--checkpoint-dir --resume": a forgotten value would take the next
     * option as a folder or a file name (--opt=--x stays possible) */
    if (c != ':' && c != '?' && optarg && optarg == argv[optind - 1] && strncmp(optarg, "--", 2) == 0) {
      char name[40];
      if (li >= 0) snprintf(name, sizeof name, "--%s", opts[li].name);
      else snprintf(name, sizeof name, "-%c", c);
      fprintf(stderr, "syncbn-train: %s needs a value; got the option %s\n", name, optarg);
      bad = 1;
      break;
    }
    switch (c) {
      case 'p': bad = arg_int(&base.ranks, "ranks", optarg, 1, 1024); break;
      case 'b': bad = arg_int(&base.batch, "batch", optarg, 1, 4096); break;
      case 'e': bad = arg_int(&base.epochs, "epochs", optarg, 1, TRAIN_MAX_EPOCHS); break;
      case O_LR: bad = arg_double(&base.lr, "lr", optarg, 0, 1e3, 1); break;
      case O_MOM: bad = arg_double(&base.momentum, "momentum", optarg, 0, 1, 0); break;
      case O_WD: bad = arg_double(&base.weight_decay, "weight-decay", optarg, 0, 1, 0); break;
      case O_BN:
        bn_mode = optarg;
        if (strcmp(bn_mode, "sync") && strcmp(bn_mode, "local") && strcmp(bn_mode, "both"))
          bad = 1, fprintf(stderr, "syncbn-train: --bn '%s': expected sync, local or both\n", optarg);
        break;
      case O_DATA:
        data = optarg;
        if (strcmp(data, "synthetic") && strcmp(data, "fashion-mnist") &&
            !(strncmp(data, "mnist:", 6) == 0 && data[6]) && !(strncmp(data, "cifar10:", 8) == 0 && data[8]))
          bad = 1, fprintf(stderr, "syncbn-train: --data '%s': expected synthetic, fashion-mnist, mnist:DIR or "
                                   "cifar10:DIR (DIR not empty)\n", optarg);
        break;
      case O_TRAIN: bad = arg_i64(&ntrain, "train-size", optarg, 2, (int64_t)1 << 26); break;
      case O_TEST: bad = arg_i64(&ntest, "test-size", optarg, 1, (int64_t)1 << 26); break;
      case O_WIDTH: bad = arg_int(&base.width, "width", optarg, 1, 4096); break;
      case O_SEED: bad = arg_u64(&base.seed, "seed", optarg); break;
      case O_CKPT: base.ckpt_dir = optarg; break;
      case O_RESUME: base.resume = 1; break;
      case O_OUT: out_dir = optarg; break;
      case O_STOP: bad = arg_i64(&base.stop_after_steps, "stop-after", optarg, 1, INT64_MAX); break;
      case O_QUIET: base.quiet = 1; break;
      case O_VERSION: {
        int v = sbn_version();
        printf("syncbn-train %d.%d.%d (libsyncbn %d.%d.%d)\n", SYNCBN_VERSION_MAJOR, SYNCBN_VERSION_MINOR,
               SYNCBN_VERSION_PATCH, v / 10000, v / 100 % 100, v % 100);
        return 0;
      }
      case 'h': usage(stdout); return 0;
      case ':': bad = 1, fprintf(stderr, "syncbn-train: %s needs a value\n", argv[optind - 1]); break;
      default: bad = 1, fprintf(stderr, "syncbn-train: unknown option '%s'\n", argv[optind - 1]); break;
    }
  }
  if (!bad && optind < argc) bad = 1, fprintf(stderr, "syncbn-train: unexpected argument '%s'\n", argv[optind]);
  /* Without a folder no checkpoint is written: a job script that always
   * passes --resume would restart from epoch 1 every time, saying only that
   * no resume file was found. */
  if (!bad && base.resume && !base.ckpt_dir)
    bad = 1, fprintf(stderr, "syncbn-train: --resume needs --checkpoint-dir D (the folder of the resume file; "
                             "without it no checkpoint is written)\n");
  if (bad) {
    fprintf(stderr, "Try 'syncbn-train --help' for the options.\n");
    return 2;
  }
  int want_sync = !strcmp(bn_mode, "sync") || !strcmp(bn_mode, "both");
  int want_local = !strcmp(bn_mode, "local") || !strcmp(bn_mode, "both");

  char why[512];
#ifdef SBN_TRAIN_WITH_MPI
  const int with_mpi = 1;
#else
  const int with_mpi = 0;
#endif
  launch_kind launch = launch_detect(with_mpi, why, sizeof why);
  if (launch == LAUNCH_REFUSED) {
    fprintf(stderr, "syncbn-train: %s\n", why);
    return 2;
  }

  /* Ranks are the parallelism: OpenBLAS threads inside each rank's small
   * GEMMs would only oversubscribe the cores (4.5x slower measured here). */
  openblas_set_num_threads(1);
  sbn_group *mpi_world = NULL;
  int rank = 0;
#ifdef SBN_TRAIN_WITH_MPI
  if (launch == LAUNCH_MPI) {
    MPI_Init(&argc, &argv);
    sbn_status st = sbn_group_from_mpi(&mpi_world, MPI_COMM_WORLD);
    if (st != SBN_STATUS_OK) {
      fprintf(stderr, "syncbn-train: MPI group: %s\n", sbn_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    rank = sbn_group_rank(mpi_world);
    base.ranks = sbn_group_size(mpi_world);
  }
#define ABORT_JOB(code) \
  do {                  \
    if (mpi_world) MPI_Abort(MPI_COMM_WORLD, code); \
  } while (0)
#else
#define ABORT_JOB(code) ((void)0)
#endif
  if ((int64_t)base.ranks * base.batch < 2) { /* every BN of a step needs 2 values: a global batch of 2 */
    if (rank == 0)
      fprintf(stderr, "syncbn-train: --ranks %d x --batch %d is a global batch of 1; use at least 2 images per step\n",
              base.ranks, base.batch);
    ABORT_JOB(2);
    return 2;
  }
  base.progress = rank == 0 && isatty(STDERR_FILENO) && !base.quiet;
  if (rank != 0) base.quiet = 1;
  /* SIGINT: Ctrl-C. SIGTERM: schedulers (Slurm, Kubernetes) and mpirun,
   * which turns Ctrl-C into SIGTERM to every rank, then SIGKILL after
   * odls_base_sigkill_timeout (1 s by default). */
  signal(SIGINT, on_stop_signal);
  signal(SIGTERM, on_stop_signal);
  signal(SIGPIPE, SIG_IGN);

  char csv[4200], png[4200];
  snprintf(csv, sizeof csv, "%s/train_log.csv", out_dir);
  snprintf(png, sizeof png, "%s/train_curves.png", out_dir);
  int io_bad = 0;
  if (rank == 0) {
    io_bad = check_dir("--out", out_dir) ||
             (base.ckpt_dir && (check_dir("--checkpoint-dir", base.ckpt_dir) ||
                                lock_dir("--checkpoint-dir", base.ckpt_dir))) ||
             lock_dir("--out", out_dir);
    /* gnuplot opens the plot itself: a FIFO there would block it, and the
     * program waiting for gnuplot, at the end of the run */
    if (!io_bad && train_check_regular(png) != 0) io_bad = 1, fprintf(stderr, "syncbn-train: %s\n", train_error());
  }
  if (io_bad) {
    ABORT_JOB(2);
    return 2;
  }
  base.csv_path = csv;

  sbn_dataset train = {0}, test = {0};
  sbn_status st = train_load_data(&train, &test, data, ntrain, ntest, base.seed);
  if (st != SBN_STATUS_OK) {
    fprintf(stderr, "syncbn-train: %s\n", train_error());
    ABORT_JOB(1);
    return 1;
  }
  /* A new run replaces the log in --out only once it can start: data that
   * cannot be loaded (a typo in --data) leaves an earlier run's log as it was. */
  if (rank == 0 && !base.resume && report_csv_create(csv) != 0) {
    fprintf(stderr, "syncbn-train: %s\n", train_error());
    sbn_dataset_free(&train), sbn_dataset_free(&test);
    ABORT_JOB(2);
    return 2;
  }
  base.data_fingerprint = train_fingerprint(&train);
  if (rank == 0)
    printf("syncbn-train: %s data (%lld train / %lld test images of %dx%dx%d), %d %s ranks x batch %d, %d epochs\n",
           train.name, (long long)train.count, (long long)test.count, train.channels, train.height, train.width,
           base.ranks, mpi_world ? "MPI" : "thread", base.batch, base.epochs);
  fflush(stdout);

  static train_result results[2];
  const char *modes[2];
  const train_result *res_ptrs[2];
  int nmodes = 0, failed = 0, broke = 0;
  for (int pass = 0; pass < 2 && !failed; pass++) {
    if (pass == 0 ? !want_sync : !want_local) continue;
    run_ctx ctx = {base, &train, &test, &results[nmodes]};
    ctx.cfg.sync_bn = pass == 0;
    modes[nmodes] = pass == 0 ? "syncbn" : "localbn";
    res_ptrs[nmodes] = &results[nmodes];
    if (rank == 0 && !base.quiet) {
      printf("%s:\n", pass == 0 ? "SyncBatchNorm over all ranks" : "local BatchNorm on each rank");
      fflush(stdout);
    }
    st = mpi_world ? (sbn_status)rank_main(mpi_world, &ctx) : sbn_team_run(base.ranks, rank_main, &ctx);
    if (st != SBN_STATUS_OK) {
      fprintf(stderr, "syncbn-train: rank %d: training failed: %s: %s\n", rank, sbn_status_name(st),
              results[nmodes].error[0] ? results[nmodes].error : train_error());
      failed = 1, broke = group_broke(st);
    }
    nmodes++;
    if (results[nmodes - 1].interrupted) break;
  }
  int rc = failed;
  if (rank == 0 && nmodes > 0 && !failed) {
    printf("\n  %-16s %10s %12s %12s\n", "batch norm", "final loss", "train acc", "test acc");
    for (int i = 0; i < nmodes; i++) {
      const train_result *r = res_ptrs[i];
      const epoch_stats *e = r->epochs_done ? &r->epoch[r->epochs_done - 1] : NULL;
      const char *note = r->already_complete ? "  (already complete: nothing trained)"
                         : r->interrupted      ? (e ? "  (interrupted)" : "  (interrupted before an epoch completed)")
                                               : "";
      if (e)
        printf("  %-16s %10.4f %11.1f%% %11.1f%%%s\n", !strcmp(modes[i], "syncbn") ? "SyncBN" : "local BN", e->loss,
               100 * e->train_acc, 100 * e->test_acc, note);
      else
        printf("  %-16s %10s %12s %12s%s\n", !strcmp(modes[i], "syncbn") ? "SyncBN" : "local BN", "-", "-", "-",
               note);
      if (r->checkpoint[0]) printf("  checkpoint: %s\n", r->checkpoint);
      if (r->interrupted && r->checkpoint[0]) printf("  (to continue: the same command with --resume)\n");
      if (r->images_skipped)
        printf("  (local BN skipped the last %lld image(s) of each epoch: fewer than the %d ranks)\n",
               (long long)r->images_skipped, base.ranks);
    }
    printf("  log:  %s\n", csv);
    fflush(stdout);
    char title[200];
    snprintf(title, sizeof title, "syncbn-train: %d ranks x batch %d, %s data", base.ranks, base.batch, train.name);
    int epochs_done = 0; /* the plot draws complete epochs only */
    for (int i = 0; i < nmodes; i++) epochs_done += res_ptrs[i]->epochs_done;
    int complete = 0;
    for (int i = 0; i < nmodes; i++) complete |= res_ptrs[i]->already_complete;
    if (!epochs_done)
      printf("  plot: not drawn (%s)\n", complete ? "the log holds no complete epoch" : "no epoch completed");
    else if (report_plot(png, csv, title, modes, nmodes) == 0) printf("  plot: %s\n", png);
    else printf("  plot: not drawn (gnuplot missing or failed)\n");
  }
  sbn_dataset_free(&train), sbn_dataset_free(&test);
#ifdef SBN_TRAIN_WITH_MPI
  if (mpi_world) {
    if (broke) { /* a lost rank would keep MPI_Finalize waiting forever */
      fprintf(stderr, "syncbn-train: rank %d: the group is broken; aborting the MPI job\n", rank);
      fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    sbn_group_destroy(mpi_world);
    MPI_Finalize();
  }
#endif
  (void)broke;
  return rc;
}

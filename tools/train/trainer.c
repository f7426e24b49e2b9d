/* The training loop of every rank: data sharding (each global batch of
 * ranks*batch images is split across ranks; the last one may be uneven),
 * loss divided by the global batch size with gradients summed by the
 * wrapper (exactly the single-process gradient), one small all-reduce per
 * step for the loss, accuracy and the stop decision, evaluation with running
 * statistics, atomic checkpoints every epoch, and resume. */
#include "trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "model.h"
#include "fail.h"
#include "report.h"
#include "resume.h"

atomic_int train_interrupted;
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the stop flag is set in a signal handler: it must be lock-free");

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t splitmix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Fisher-Yates with a splitmix stream: the epoch's order depends only on
 * (seed, epoch), so a resumed run sees exactly the same batches. */
static void shuffle(int64_t *idx, int64_t n, uint64_t seed, int epoch) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + (uint64_t)epoch * 0xD1B54A32D192ED03ull + 7;
  for (int64_t i = 0; i < n; i++) idx[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    uint64_t z = splitmix(s += 0x9E3779B97F4A7C15ull);
    int64_t j = (int64_t)(z % (uint64_t)(i + 1));
    int64_t t = idx[i];
    idx[i] = idx[j], idx[j] = t;
  }
}

uint64_t train_fingerprint(const sbn_dataset *d) {
  uint64_t h = splitmix((uint64_t)d->count ^ (uint64_t)d->channels << 40 ^ (uint64_t)d->height << 20 ^
                        (uint64_t)d->width ^ (uint64_t)d->num_classes << 56);
  for (int64_t i = 0; i < d->count; i++) h = splitmix(h ^ (uint64_t)(uint32_t)d->labels[i]);
  const uint32_t *px = (const uint32_t *)d->images; /* the float bits */
  const size_t n = (size_t)d->count * d->channels * d->height * d->width;
  for (size_t i = 0; i + 1 < n; i += 2) h = splitmix(h ^ ((uint64_t)px[i] << 32 | px[i + 1]));
  if (n % 2) h = splitmix(h ^ px[n - 1]);
  return h;
}

static void ckpt_path(char *buf, size_t cap, const train_cfg *cfg, const char *suffix) {
  snprintf(buf, cap, "%s/syncbn-train-%s%s", cfg->ckpt_dir ? cfg->ckpt_dir : ".", cfg->sync_bn ? "syncbn" : "localbn",
           suffix);
}
void train_model_path(char *buf, size_t cap, const train_cfg *cfg) { ckpt_path(buf, cap, cfg, ".safetensors"); }
void train_resume_path(char *buf, size_t cap, const train_cfg *cfg) {
  ckpt_path(buf, cap, cfg, ".resume.safetensors");
}

static int term_columns(void) {
  struct winsize w;
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col >= 20) return w.ws_col;
  const char *c = getenv("COLUMNS");
  return c && atoi(c) >= 20 ? atoi(c) : 80;
}

static void fmt_time(char *buf, size_t cap, double s) {
  long t = s > 0 && s < 1e8 ? (long)(s + 0.5) : 0;
  if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

/* One line that fits the terminal: epoch, bar, steps, loss, ETA of the mode. */
static void progress_bar(int epoch, int epochs, int64_t step, int64_t steps, double loss, double eta) {
  char tail[128], t[32];
  fmt_time(t, sizeof t, eta);
  int n = snprintf(tail, sizeof tail, "] %lld/%lld loss %.4f ETA %s", (long long)(step + 1), (long long)steps, loss, t);
  char head[48];
  int h = snprintf(head, sizeof head, "  epoch %d/%d [", epoch + 1, epochs);
  int width = term_columns() - 1 - h - n;
  if (width < 5) { /* too narrow for a bar: the numbers alone */
    fprintf(stderr, "\r%.*s", term_columns() - 1, tail + 2);
  } else {
    if (width > 40) width = 40;
    int filled = (int)(width * (step + 1) / (steps ? steps : 1));
    fprintf(stderr, "\r%s", head);
    for (int i = 0; i < width; i++) fputc(i < filled ? '#' : '.', stderr);
    fputs(tail, stderr);
  }
  fflush(stderr);
}

/* Accuracy on `test` in eval mode, each rank taking a contiguous shard. */
static sbn_status evaluate(double *acc, sbn_group *g, sbn_module *model, const sbn_dataset *test, float *img,
                           int32_t *lab, int64_t *targets, int64_t chunk) {
  const int P = sbn_group_size(g), r = sbn_group_rank(g);
  const int64_t lo = test->count * r / P, hi = test->count * (r + 1) / P;
  double correct = 0;
  sbn_status st = sbn_module_train(model, 0);
  for (int64_t a = lo; a < hi && st == SBN_STATUS_OK; a += chunk) {
    int64_t n = hi - a < chunk ? hi - a : chunk, idx[1024];
    for (int64_t i = 0; i < n; i++) idx[i] = a + i;
    st = sbn_dataset_gather(img, lab, test, idx, n);
    for (int64_t i = 0; i < n; i++) targets[i] = lab[i];
    int64_t shape[4] = {n, test->channels, test->height, test->width};
    sbn_tensor x = sbn_tensor_cpu(img, 4, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y = {0};
    int64_t c = 0;
    if (st == SBN_STATUS_OK) st = sbn_module_forward(model, &y, &x);
    if (st == SBN_STATUS_OK) st = sbn_nn_count_correct(&c, &y, targets);
    correct += (double)c;
  }
  sbn_status tst = sbn_module_train(model, 1);
  if (st == SBN_STATUS_OK) st = tst;
  if (st == SBN_STATUS_OK) st = sbn_group_allreduce(g, &correct, 1, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  *acc = test->count ? correct / (double)test->count : 0;
  return st;
}

/* A rank-local failure (a file only rank 0 writes, a resume file one rank
 * cannot read) must reach every rank before the next collective, or the
 * others would wait for the failed rank until the group's timeout. */
static sbn_status agree(sbn_group *g, sbn_status st) {
  if (st != SBN_STATUS_OK) { /* keep the reason: the all-reduce clears the library's last error */
    char why[1024];
    snprintf(why, sizeof why, "%s", train_error());
    train_fail(st, "%s", why);
  }
  double bad = st != SBN_STATUS_OK;
  sbn_status ast = sbn_group_allreduce(g, &bad, 1, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  if (st != SBN_STATUS_OK) return st;
  if (ast != SBN_STATUS_OK) return ast;
  return bad > 0 ? train_fail(SBN_STATUS_PEER_FAILED, "another rank failed (its message is printed by that rank)")
                 : SBN_STATUS_OK;
}

sbn_status train_run(sbn_group *g, const train_cfg *cfg, const sbn_dataset *train, const sbn_dataset *test,
                     train_result *result) {
  const int P = sbn_group_size(g), rank = sbn_group_rank(g);
  train_clear_error();
  const char *mode = cfg->sync_bn ? "syncbn" : "localbn";
  const int64_t global_batch = (int64_t)P * cfg->batch;
  const int64_t steps_per_epoch = (train->count + global_batch - 1) / global_batch;
  sbn_module *model = NULL, *converted = NULL;
  sbn_nn_sgd *sgd = NULL;
  sbn_dp *dp = NULL;
  resume_state ck = {0};
  int64_t *perm = malloc(sizeof(int64_t) * (size_t)train->count);
  const int64_t max_local = cfg->batch + 1 > 64 ? cfg->batch + 1 : 64;
  const size_t img_floats = (size_t)max_local * train->channels * train->height * train->width;
  float *img = malloc(sizeof(float) * img_floats);
  float *dlogits = malloc(sizeof(float) * (size_t)max_local * (size_t)train->num_classes);
  int32_t *lab = malloc(sizeof(int32_t) * (size_t)max_local);
  int64_t *targets = malloc(sizeof(int64_t) * (size_t)max_local);
  sbn_status st = perm && img && dlogits && lab && targets ? SBN_STATUS_OK : SBN_STATUS_OUT_OF_MEMORY;
  if (st != SBN_STATUS_OK) train_fail(st, "syncbn-train: out of memory");
  if (st == SBN_STATUS_OK) st = build_resnet(&model, train->channels, cfg->width, train->num_classes, cfg->seed);
  if (st == SBN_STATUS_OK && cfg->sync_bn) { /* before wrapping, as the wrapper requires */
    st = sbn_nn_convert_sync_batchnorm(&converted, model, g);
    if (st == SBN_STATUS_OK) model = converted;
  }
  sbn_nn_sgd_options so = {cfg->lr, cfg->momentum, 0.0, cfg->weight_decay, 0};
  if (st == SBN_STATUS_OK) st = sbn_nn_sgd_create(&sgd, model, &so);
  if (st == SBN_STATUS_OK) st = resume_init(&ck, model, sgd, cfg, P, train->count);
  char model_path[512], resume_path[512];
  train_model_path(model_path, sizeof model_path, cfg);
  train_resume_path(resume_path, sizeof resume_path, cfg);
  if (st == SBN_STATUS_OK && cfg->resume && access(resume_path, F_OK) == 0) {
    st = resume_load(&ck, resume_path);
    if (st == SBN_STATUS_OK && resume_complete(&ck)) {
      if (rank == 0) {
        printf("  resume: %s: the run is already complete (%lld of %d epochs); nothing to train (to train it "
               "further, resume with a larger --epochs)\n",
               resume_path, (long long)ck.v[RESUME_EPOCH], cfg->epochs);
        result->already_complete = 1;
        snprintf(result->checkpoint, sizeof result->checkpoint, "%s", model_path);
      }
    } else if (st == SBN_STATUS_OK && rank == 0 && !cfg->quiet) {
      printf("  resumed from %s at epoch %lld, step %lld\n", resume_path, (long long)ck.v[RESUME_EPOCH] + 1,
             (long long)ck.v[RESUME_STEP]);
    }
    if (st == SBN_STATUS_OK && rank == 0 && !resume_complete(&ck)) resume_print_changes(&ck, stdout);
  } else if (st == SBN_STATUS_OK && cfg->resume && access(model_path, F_OK) == 0) {
    /* the first save would replace a model trained once */
    st = train_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "resume: %s is missing, but %s exists: the model file alone cannot resume (it holds no "
                    "optimizer state or position). To start over, remove it or use another --checkpoint-dir",
                    resume_path, model_path);
  } else if (st == SBN_STATUS_OK && cfg->resume && rank == 0) { /* a job script that always passes --resume */
    printf("  resume: no %s; starting at epoch 1\n", resume_path);
  }
  if (st == SBN_STATUS_OK && rank == 0 && cfg->csv_path && report_csv_trim(cfg->csv_path, mode, (int)ck.v[RESUME_EPOCH]))
    st = SBN_STATUS_IO_ERROR; /* report_csv_trim said why */
  if (st == SBN_STATUS_OK && rank == 0 && result->already_complete && cfg->csv_path) { /* the summary's last epoch */
    epoch_stats e;
    const int last = report_csv_last(cfg->csv_path, mode, cfg->epochs, &e);
    if (last) result->epoch[last - 1] = e, result->epochs_done = last;
  }
  st = agree(g, st);
  sbn_dp_options dpo = sbn_dp_options_default();
  dpo.reduce = SBN_DP_REDUCE_SUM; /* with the loss divided by the global batch */
  if (st == SBN_STATUS_OK) st = sbn_dp_wrap(&dp, model, &sgd, 1, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, g, &dpo);
  if (st == SBN_STATUS_OK) st = sbn_dp_set_train_step_counter(dp, ck.v[RESUME_EPOCH] * steps_per_epoch + ck.v[RESUME_STEP]);

  int stop = 0;
  int64_t steps_here = 0;
  const double t_start = now();
  const int64_t steps_total = (cfg->epochs - ck.v[RESUME_EPOCH]) * steps_per_epoch - ck.v[RESUME_STEP];
  for (int epoch = (int)ck.v[RESUME_EPOCH]; epoch < cfg->epochs && st == SBN_STATUS_OK && !stop; epoch++) {
    shuffle(perm, train->count, cfg->seed, epoch);
    /* cosine learning-rate decay per epoch: a function of the epoch alone,
     * so a resumed run follows the same schedule */
    st = sbn_nn_sgd_set_lr(sgd, cfg->lr * 0.5 * (1.0 + cos(3.141592653589793 * epoch / cfg->epochs)));
    double t0 = now(), loss_sum = 0, correct_sum = 0, seen = 0;
    int64_t step = 0, steps_epoch_here = 0;
    if (epoch == ck.v[RESUME_EPOCH] && ck.v[RESUME_STEP] > 0) /* the rest of a partial epoch */
      step = ck.v[RESUME_STEP], loss_sum = ck.sums[0], correct_sum = ck.sums[1], seen = ck.sums[2];
    for (; step < steps_per_epoch && st == SBN_STATUS_OK && !stop; step++) {
      const int64_t b0 = step * global_batch;
      const int64_t m = train->count - b0 < global_batch ? train->count - b0 : global_batch;
      /* A tail smaller than the ranks leaves some rank without images:
       * SyncBN handles that (an empty rank contributes nothing to the
       * global statistics), a local BatchNorm over 0 values cannot. */
      if (!cfg->sync_bn && m < P) {
        if (rank == 0 && epoch == ck.v[RESUME_EPOCH]) result->images_skipped = m;
        continue;
      }
      const int64_t lo = b0 + m * rank / P, hi = b0 + m * (rank + 1) / P, n = hi - lo;
      st = sbn_dataset_gather(img, lab, train, perm + lo, n);
      for (int64_t i = 0; i < n; i++) targets[i] = lab[i];
      int64_t shape[4] = {n, train->channels, train->height, train->width};
      sbn_tensor x = sbn_tensor_cpu(img, 4, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y = {0};
      double loss = 0;
      int64_t correct = 0;
      if (st == SBN_STATUS_OK) st = sbn_dp_zero_grad(dp);
      if (st == SBN_STATUS_OK) st = sbn_dp_forward(dp, &y, &x);
      if (st == SBN_STATUS_OK) st = sbn_nn_cross_entropy_forward(&loss, &y, targets, (double)m);
      if (st == SBN_STATUS_OK) st = sbn_nn_count_correct(&correct, &y, targets);
      sbn_tensor dy = y;
      dy.data = dlogits;
      if (st == SBN_STATUS_OK) st = sbn_nn_cross_entropy_backward(&dy, &y, targets, (double)m);
      if (st == SBN_STATUS_OK) st = sbn_dp_backward(dp, NULL, &dy);
      if (st == SBN_STATUS_OK) st = sbn_dp_step(dp);
      /* loss (already / m), correct, and the stop requests: a signal may
       * reach the ranks at different moments; the sum makes them agree */
      steps_here++, steps_epoch_here++;
      double red[3] = {loss, (double)correct, atomic_load_explicit(&train_interrupted, memory_order_relaxed) ? 1 : 0};
      if (rank == 0 && cfg->stop_after_steps > 0 && steps_here >= cfg->stop_after_steps) red[2] = 1;
      if (st == SBN_STATUS_OK) st = sbn_group_allreduce(g, red, 3, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
      if (st != SBN_STATUS_OK) break;
      loss_sum += red[0] * (double)m, correct_sum += red[1], seen += (double)m;
      if (rank == 0) result->step_loss_sum += red[0], result->steps_run++;
      stop = red[2] != 0;
      if (rank == 0 && cfg->progress) {
        double rate = (now() - t_start) / (double)steps_here;
        progress_bar(epoch, cfg->epochs, step, steps_per_epoch, loss_sum / seen, rate * (double)(steps_total - steps_here));
      }
    }
    if (st != SBN_STATUS_OK) break;
    double elapsed = now() - t0;
    if (rank == 0 && cfg->progress) fprintf(stderr, "\r%*s\r", term_columns() - 1, "");
    const int partial = stop && step < steps_per_epoch;
    /* position for a checkpoint: the next step, or the next epoch */
    ck.v[RESUME_EPOCH] = partial ? epoch : epoch + 1;
    ck.v[RESUME_STEP] = partial ? step : 0;
    ck.sums[0] = partial ? loss_sum : 0, ck.sums[1] = partial ? correct_sum : 0, ck.sums[2] = partial ? seen : 0;
    if (seen == 0 && !partial) {
      st = train_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "epoch %d ran no step: %lld training images cannot give each of %d ranks an image", epoch + 1,
                    (long long)train->count, P);
      break;
    }
    epoch_stats e = {seen ? loss_sum / seen : NAN, seen ? correct_sum / seen : NAN, NAN,
                     elapsed > 0 ? (double)steps_epoch_here * (double)global_batch / elapsed : 0};
    if (!partial) { /* a completed epoch: evaluate and report */
      st = evaluate(&e.test_acc, g, model, test, img, lab, targets, 64);
      if (st != SBN_STATUS_OK) break;
      if (rank == 0) {
        result->epoch[epoch] = e;
        result->epochs_done = epoch + 1;
        if (!cfg->quiet)
          printf("  [%s] epoch %2d  loss %.4f  train acc %5.1f%%  test acc %5.1f%%  %7.0f images/s\n",
                 cfg->sync_bn ? "SyncBN " : "localBN", epoch + 1, e.loss, 100 * e.train_acc, 100 * e.test_acc,
                 e.images_per_s);
        fflush(stdout);
      }
    }
    /* rank 0 writes (atomically: the resume state, then the model alone)
     * and logs; the others wait for it and learn whether it worked */
    if (rank == 0 && cfg->ckpt_dir) {
      st = sbn_nn_save_entries(resume_path, ck.entries, ck.count);
      if (st == SBN_STATUS_OK) st = sbn_nn_save_entries(model_path, ck.entries, ck.model_count);
      if (st == SBN_STATUS_OK) snprintf(result->checkpoint, sizeof result->checkpoint, "%s", model_path);
    }
    if (rank == 0 && cfg->csv_path && st == SBN_STATUS_OK &&
        report_csv_row(cfg->csv_path, mode, epoch + 1, &e, partial ? step : steps_per_epoch, partial))
      st = SBN_STATUS_IO_ERROR; /* report_csv_row said why */
    st = agree(g, st);
  }
  if (rank == 0) result->interrupted = stop;
  if (rank == 0 && st != SBN_STATUS_OK) /* before cleanup calls clear it */
    snprintf(result->error, sizeof result->error, "%s", train_error());
  sbn_dp_destroy(dp);
  sbn_nn_sgd_destroy(sgd);
  sbn_module_destroy(model);
  resume_free(&ck);
  free(perm), free(img), free(dlogits), free(lab), free(targets);
  return st;
}

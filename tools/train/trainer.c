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
#include <time.h>
#include <unistd.h>

#include "model.h"

volatile sig_atomic_t train_interrupted;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Fisher-Yates with a splitmix stream: the epoch's order depends only on
 * (seed, epoch), so a resumed run sees exactly the same batches. */
static void shuffle(int64_t *idx, int64_t n, uint64_t seed, int epoch) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + (uint64_t)epoch * 0xD1B54A32D192ED03ull + 7;
  for (int64_t i = 0; i < n; i++) idx[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    int64_t j = (int64_t)(z % (uint64_t)(i + 1));
    int64_t t = idx[i];
    idx[i] = idx[j], idx[j] = t;
  }
}

void train_checkpoint_path(char *buf, size_t cap, const train_cfg *cfg) {
  snprintf(buf, cap, "%s/syncbn-train-%s.safetensors", cfg->ckpt_dir ? cfg->ckpt_dir : ".",
           cfg->sync_bn ? "syncbn" : "localbn");
}

/* Everything a resume needs: model state, optimizer state, position. */
typedef struct ckpt_state {
  sbn_nn_entry *entries;
  int count;
  int64_t epoch, step; /* the next step to run */
} ckpt_state;

static sbn_status ckpt_entries(ckpt_state *c, sbn_module *model, sbn_nn_sgd *sgd) {
  sbn_nn_entry *me = NULL, *oe = NULL;
  int mn = 0, on = 0;
  sbn_status st = sbn_module_entries(&me, &mn, model, SBN_NN_STATE);
  if (st == SBN_STATUS_OK) st = sbn_nn_sgd_entries(&oe, &on, sgd);
  if (st == SBN_STATUS_OK) {
    c->entries = calloc((size_t)(mn + on + 2), sizeof *c->entries);
    if (!c->entries) st = SBN_STATUS_OUT_OF_MEMORY;
  }
  if (st == SBN_STATUS_OK) {
    memcpy(c->entries, me, sizeof *me * (size_t)mn);
    for (int i = 0; i < on; i++) { /* keep optimizer names apart from the model's */
      c->entries[mn + i] = oe[i];
      snprintf(c->entries[mn + i].name, SBN_NN_NAME_MAX, "optimizer.%.200s", oe[i].name);
    }
    static const char *const names[2] = {"trainer.epoch", "trainer.step"};
    for (int i = 0; i < 2; i++) {
      sbn_nn_entry *e = &c->entries[mn + on + i];
      snprintf(e->name, SBN_NN_NAME_MAX, "%s", names[i]);
      e->kind = SBN_NN_ENTRY_KIND_BUFFER, e->dtype = SBN_DTYPE_INT64, e->ndim = 0, e->numel = 1;
      e->data = i ? &c->step : &c->epoch;
    }
    c->count = mn + on + 2;
  }
  free(me), free(oe);
  return st;
}

static void progress_bar(int epoch, int epochs, int64_t step, int64_t steps, double loss) {
  int width = 30, filled = steps ? (int)(width * (step + 1) / steps) : width;
  fprintf(stderr, "\r  epoch %d/%d [", epoch + 1, epochs);
  for (int i = 0; i < width; i++) fputc(i < filled ? '#' : '.', stderr);
  fprintf(stderr, "] %lld/%lld loss %.4f ", (long long)(step + 1), (long long)steps, loss);
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
    sbn_tensor x = sbn_tensor_cpu(img, 4, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y;
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

sbn_status train_run(sbn_group *g, const train_cfg *cfg, const sbn_dataset *train, const sbn_dataset *test,
                     train_result *result) {
  const int P = sbn_group_size(g), rank = sbn_group_rank(g);
  const int64_t global_batch = (int64_t)P * cfg->batch;
  const int64_t steps_per_epoch = (train->count + global_batch - 1) / global_batch;
  sbn_module *model = NULL, *converted = NULL;
  sbn_nn_sgd *sgd = NULL;
  sbn_dp *dp = NULL;
  ckpt_state ck = {0};
  int64_t *perm = malloc(sizeof(int64_t) * (size_t)train->count);
  const int64_t max_local = cfg->batch + 1 > 64 ? cfg->batch + 1 : 64;
  const size_t img_floats = (size_t)max_local * train->channels * train->height * train->width;
  float *img = malloc(sizeof(float) * img_floats);
  float *dlogits = malloc(sizeof(float) * (size_t)max_local * (size_t)train->num_classes);
  int32_t *lab = malloc(sizeof(int32_t) * (size_t)max_local);
  int64_t *targets = malloc(sizeof(int64_t) * (size_t)max_local);
  sbn_status st = perm && img && dlogits && lab && targets ? SBN_STATUS_OK : SBN_STATUS_OUT_OF_MEMORY;
  if (st != SBN_STATUS_OK) fprintf(stderr, "syncbn-train: out of memory\n");
  if (st == SBN_STATUS_OK) st = build_resnet(&model, train->channels, cfg->width, train->num_classes, cfg->seed);
  if (st == SBN_STATUS_OK && cfg->sync_bn) { /* before wrapping, as the wrapper requires */
    st = sbn_nn_convert_sync_batchnorm(&converted, model, g);
    if (st == SBN_STATUS_OK) model = converted;
  }
  sbn_nn_sgd_options so = {cfg->lr, cfg->momentum, 0.0, cfg->weight_decay, 0};
  if (st == SBN_STATUS_OK) st = sbn_nn_sgd_create(&sgd, model, &so);
  if (st == SBN_STATUS_OK) st = ckpt_entries(&ck, model, sgd);
  char path[512];
  train_checkpoint_path(path, sizeof path, cfg);
  if (st == SBN_STATUS_OK && cfg->resume && access(path, R_OK) == 0) {
    /* Every rank reads the file (a shared file system for MPI across
     * machines); the wrap below would broadcast rank 0's model anyway. */
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    long len = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (f && len > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len)) &&
        fread(buf, 1, (size_t)len, f) == (size_t)len)
      st = sbn_nn_load_entries(ck.entries, ck.count, buf, (size_t)len, SBN_NN_LOAD_STRICT, NULL);
    else
      st = SBN_STATUS_IO_ERROR, fprintf(stderr, "syncbn-train: resume: cannot read %s\n", path);
    if (f) fclose(f);
    free(buf);
    if (st == SBN_STATUS_OK && rank == 0 && !cfg->quiet)
      printf("  resumed from %s at epoch %lld, step %lld\n", path, (long long)ck.epoch + 1, (long long)ck.step);
  }
  sbn_dp_options dpo = sbn_dp_options_default();
  dpo.reduce = SBN_DP_REDUCE_SUM; /* with the loss divided by the global batch */
  if (st == SBN_STATUS_OK) st = sbn_dp_wrap(&dp, model, &sgd, 1, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, g, &dpo);
  if (st == SBN_STATUS_OK) st = sbn_dp_set_train_step_counter(dp, ck.epoch * steps_per_epoch + ck.step);

  int stop = 0;
  int64_t steps_here = 0;
  for (int epoch = (int)ck.epoch; epoch < cfg->epochs && st == SBN_STATUS_OK && !stop; epoch++) {
    shuffle(perm, train->count, cfg->seed, epoch);
    /* cosine learning-rate decay per epoch: a function of the epoch alone,
     * so a resumed run follows the same schedule */
    if (st == SBN_STATUS_OK)
      st = sbn_nn_sgd_set_lr(sgd, cfg->lr * 0.5 * (1.0 + cos(3.141592653589793 * epoch / cfg->epochs)));
    double t0 = now(), loss_sum = 0, correct_sum = 0, seen = 0;
    int64_t step = epoch == ck.epoch ? ck.step : 0;
    for (; step < steps_per_epoch && st == SBN_STATUS_OK && !stop; step++) {
      const int64_t b0 = step * global_batch;
      const int64_t m = train->count - b0 < global_batch ? train->count - b0 : global_batch;
      if (m < 2 * P) continue; /* a tail too small to give every rank 2 images */
      const int64_t lo = b0 + m * rank / P, hi = b0 + m * (rank + 1) / P, n = hi - lo;
      st = sbn_dataset_gather(img, lab, train, perm + lo, n);
      for (int64_t i = 0; i < n; i++) targets[i] = lab[i];
      int64_t shape[4] = {n, train->channels, train->height, train->width};
      sbn_tensor x = sbn_tensor_cpu(img, 4, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y;
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
      /* loss (already / m), correct, and rank 0's stop request */
      double red[3] = {loss, (double)correct, 0};
      steps_here++;
      if (rank == 0)
        red[2] = train_interrupted || (cfg->stop_after_steps > 0 && steps_here >= cfg->stop_after_steps);
      if (st == SBN_STATUS_OK) st = sbn_group_allreduce(g, red, 3, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
      if (st != SBN_STATUS_OK) break;
      loss_sum += red[0] * (double)m, correct_sum += red[1], seen += (double)m;
      if (rank == 0) result->step_loss_sum += red[0], result->steps_run++;
      stop = red[2] != 0;
      if (rank == 0 && cfg->progress) progress_bar(epoch, cfg->epochs, step, steps_per_epoch, loss_sum / seen);
    }
    if (st != SBN_STATUS_OK) break;
    double elapsed = now() - t0;
    if (rank == 0 && cfg->progress) fprintf(stderr, "\r%*s\r", 78, "");
    /* position for a checkpoint: the next step, or the next epoch */
    ck.epoch = stop && step < steps_per_epoch ? epoch : epoch + 1;
    ck.step = stop && step < steps_per_epoch ? step : 0;
    if (!stop || ck.step == 0) { /* a completed epoch: evaluate and report */
      double test_acc = 0;
      st = evaluate(&test_acc, g, model, test, img, lab, targets, 64);
      if (st != SBN_STATUS_OK) break;
      if (rank == 0) {
        epoch_stats *e = &result->epoch[epoch];
        e->loss = seen ? loss_sum / seen : NAN;
        e->train_acc = seen ? correct_sum / seen : NAN;
        e->test_acc = test_acc;
        e->images_per_s = elapsed > 0 ? seen / elapsed : 0;
        result->epochs_done = epoch + 1;
        if (!cfg->quiet)
          printf("  [%s] epoch %2d  loss %.4f  train acc %5.1f%%  test acc %5.1f%%  %7.0f images/s\n",
                 cfg->sync_bn ? "SyncBN " : "localBN", epoch + 1, e->loss, 100 * e->train_acc, 100 * test_acc,
                 e->images_per_s);
        fflush(stdout);
      }
    }
    if (cfg->ckpt_dir) { /* rank 0 writes (atomically); the others wait for it */
      if (rank == 0) st = sbn_nn_save_entries(path, ck.entries, ck.count);
      sbn_status bst = sbn_group_barrier(g);
      if (st == SBN_STATUS_OK) st = bst;
      if (rank == 0 && st == SBN_STATUS_OK) snprintf(result->checkpoint, sizeof result->checkpoint, "%s", path);
    }
  }
  if (rank == 0) result->interrupted = stop;
  if (rank == 0 && st != SBN_STATUS_OK) /* before cleanup calls clear it */
    snprintf(result->error, sizeof result->error, "%s", sbn_last_error());
  sbn_dp_destroy(dp);
  sbn_nn_sgd_destroy(sgd);
  sbn_module_destroy(model);
  free(ck.entries), free(perm), free(img), free(dlogits), free(lab), free(targets);
  return st;
}

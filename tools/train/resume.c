#include "resume.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fail.h"
#include "file.h"

static const char *const trainer_names[RESUME_NINT] = {
    "trainer.epoch",       "trainer.step",        "trainer.config.ranks",        "trainer.config.batch",
    "trainer.config.seed", "trainer.config.data", "trainer.config.train_images", "trainer.config.width"};
#define SUMS_NAME "trainer.epoch_sums"
#define OPT_STEP_NAME "optimizer.step"
#define SGD_NAME "trainer.config.sgd"
#define MOMENTUM_SUFFIX ".momentum_buffer"

static void scalar_entry(sbn_nn_entry *e, const char *name, int64_t *data) {
  memset(e, 0, sizeof *e);
  snprintf(e->name, SBN_NN_NAME_MAX, "%s", name);
  e->kind = SBN_NN_ENTRY_KIND_BUFFER, e->dtype = SBN_DTYPE_INT64, e->ndim = 0, e->numel = 1;
  e->data = data;
}
static void f64x3_entry(sbn_nn_entry *e, const char *name, double *data) {
  memset(e, 0, sizeof *e);
  snprintf(e->name, SBN_NN_NAME_MAX, "%s", name);
  e->kind = SBN_NN_ENTRY_KIND_BUFFER, e->dtype = SBN_DTYPE_FLOAT64, e->ndim = 1, e->shape[0] = 3, e->numel = 3;
  e->data = data;
}

sbn_status resume_init(resume_state *rs, sbn_module *model, sbn_nn_sgd *sgd, const train_cfg *cfg, int ranks,
                       int64_t train_count) {
  memset(rs, 0, sizeof *rs);
  sbn_nn_entry *me = NULL, *oe = NULL;
  int mn = 0, on = 0;
  sbn_status st = sbn_module_entries(&me, &mn, model, SBN_NN_STATE);
  if (st == SBN_STATUS_OK) st = sbn_nn_sgd_entries(&oe, &on, sgd);
  if (st == SBN_STATUS_OK) {
    rs->entries = calloc((size_t)(mn + on + RESUME_NINT + 2), sizeof *rs->entries);
    if (!rs->entries) st = train_fail(SBN_STATUS_OUT_OF_MEMORY, "syncbn-train: out of memory");
  }
  if (st == SBN_STATUS_OK) {
    memcpy(rs->entries, me, sizeof *me * (size_t)mn);
    for (int i = 0; i < on; i++) { /* keep optimizer names apart from the model's */
      rs->entries[mn + i] = oe[i];
      snprintf(rs->entries[mn + i].name, SBN_NN_NAME_MAX, "optimizer.%.200s", oe[i].name);
    }
    for (int i = 0; i < RESUME_NINT; i++) scalar_entry(&rs->entries[mn + on + i], trainer_names[i], &rs->v[i]);
    f64x3_entry(&rs->entries[mn + on + RESUME_NINT], SUMS_NAME, rs->sums);
    /* last: resume_load_memory leaves it out for files without it */
    f64x3_entry(&rs->entries[mn + on + RESUME_NINT + 1], SGD_NAME, rs->run_sgd);
    rs->count = mn + on + RESUME_NINT + 2, rs->model_count = mn;
    rs->run[RESUME_RANKS] = ranks, rs->run[RESUME_BATCH] = cfg->batch, rs->run[RESUME_SEED] = (int64_t)cfg->seed;
    rs->run[RESUME_DATA] = (int64_t)cfg->data_fingerprint, rs->run[RESUME_COUNT] = train_count;
    rs->run[RESUME_WIDTH] = cfg->width;
    rs->run_sgd[0] = cfg->lr, rs->run_sgd[1] = cfg->momentum, rs->run_sgd[2] = cfg->weight_decay;
    memcpy(rs->v, rs->run, sizeof rs->v);
    rs->epochs = cfg->epochs;
    rs->global_batch = (int64_t)ranks * cfg->batch;
    rs->steps_per_epoch = rs->global_batch > 0 ? (train_count + rs->global_batch - 1) / rs->global_batch : 0;
  }
  free(me), free(oe);
  if (st != SBN_STATUS_OK) resume_free(rs);
  return st;
}

void resume_free(resume_state *rs) {
  free(rs->entries);
  rs->entries = NULL, rs->count = rs->model_count = 0;
}

/* The file's configuration against this run's. file_momentum: the file's
 * momentum, or -1 when it holds no trainer.config.sgd and momentum buffers
 * (an earlier version's file written with a momentum), or -2 when it holds
 * neither (its momentum was 0). */
static sbn_status check_config(const resume_state *rs, const int64_t *file, double file_momentum, const char *name) {
  static const char *const what[RESUME_NINT] = {0,         0,         "--ranks",         "--batch",
                                                "--seed",  "dataset", "training images", "--width"};
  char diff[600] = "";
  for (int i = RESUME_RANKS; i < RESUME_NINT; i++)
    if (file[i] != rs->run[i]) {
      size_t l = strlen(diff);
      if (i == RESUME_DATA)
        snprintf(diff + l, sizeof diff - l, "%sa different dataset (fingerprint %016llx, now %016llx)", l ? "; " : "",
                 (unsigned long long)file[i], (unsigned long long)rs->run[i]);
      else
        snprintf(diff + l, sizeof diff - l, "%s%s %lld (now %lld)", l ? "; " : "", what[i], (long long)file[i],
                 (long long)rs->run[i]);
    }
  const int batches_differ = diff[0] != 0;
  const double now = rs->run_sgd[1];
  const int momentum_differs = file_momentum == -1 ? now == 0 : file_momentum == -2 ? now != 0 : file_momentum != now;
  if (momentum_differs) {
    size_t l = strlen(diff);
    if (file_momentum == -1)
      snprintf(diff + l, sizeof diff - l, "%sa nonzero --momentum (now %g)", l ? "; " : "", now);
    else
      snprintf(diff + l, sizeof diff - l, "%s--momentum %g (now %g)", l ? "; " : "",
               file_momentum < 0 ? 0.0 : file_momentum, now);
  }
  if (diff[0])
    return train_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "resume: %s was written by a run with %s: %s%s%s. Resume with the same options, or start "
                      "afresh without --resume",
                      name, diff, batches_differ ? "the batches and statistics would differ" : "",
                      batches_differ && momentum_differs ? "; " : "",
                      momentum_differs ? "the optimizer's momentum buffers belong to that momentum" : "");
  return SBN_STATUS_OK;
}

/* Position, epoch sums and optimizer step: values this run could have
 * written. Every step before a partial epoch's stop is a full global batch
 * (only the last one may be short), so `seen` is exactly step * batch. */
static sbn_status check_position(const resume_state *rs, const int64_t *file, const double *sums, int64_t opt_step,
                                 const char *name) {
  const int64_t e = file[RESUME_EPOCH], s = file[RESUME_STEP], spe = rs->steps_per_epoch;
  /* no run (of any --epochs) writes these */
  if (e < 0 || e > TRAIN_MAX_EPOCHS || s < 0 || s >= spe || (e == TRAIN_MAX_EPOCHS && s != 0))
    return train_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "resume: %s holds position epoch %lld, step %lld, outside this run's %d epochs of %lld steps "
                      "(a damaged or foreign checkpoint)",
                      name, (long long)e, (long long)s, rs->epochs, (long long)spe);
  const double seen = (double)(s * rs->global_batch); /* s < spe: no overflow */
  if (sums[2] != seen || !(sums[1] >= 0 && sums[1] <= seen) || sums[0] < 0 || (s == 0 && sums[0] != 0))
    return train_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "resume: %s holds epoch sums (loss %g, correct %g, seen %g) that %lld steps of %lld images "
                      "cannot give (a damaged or foreign checkpoint)",
                      name, sums[0], sums[1], sums[2], (long long)s, (long long)rs->global_batch);
  /* one optimizer step per training step, none for a local-BN tail that
   * cannot give every rank an image */
  const int64_t steps_done = e * spe + s;
  if (opt_step < 0 || opt_step > steps_done)
    return train_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "resume: %s holds optimizer step %lld, but its position is %lld steps into the run "
                      "(a damaged or foreign checkpoint)",
                      name, (long long)opt_step, (long long)steps_done);
  /* a consistent file of a run with a larger --epochs */
  if (e > rs->epochs || (e == rs->epochs && s != 0)) {
    char where[96];
    if (s == 0) snprintf(where, sizeof where, "after %lld complete epochs", (long long)e);
    else
      snprintf(where, sizeof where, "%lld step%s into epoch %lld", (long long)s, s == 1 ? "" : "s", (long long)e + 1);
    return train_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "resume: %s holds a run stopped %s, beyond this run's --epochs %d. To train it further, "
                      "resume with --epochs %lld or more; to start a new run, leave out --resume or use another "
                      "--checkpoint-dir",
                      name, where, rs->epochs, (long long)e + 1);
  }
  return SBN_STATUS_OK;
}

sbn_status resume_load_memory(resume_state *rs, const void *buf, size_t len, const char *name) {
  train_clear_error();
  /* First the trainer's scalars and the optimizer step alone, into scratch
   * copies: checked before the model and optimizer are touched. */
  int64_t v[RESUME_NINT], opt_step = 0;
  double sums[3], sgd[3] = {0, 0, 0};
  sbn_nn_entry head[RESUME_NINT + 3];
  for (int i = 0; i < RESUME_NINT; i++) scalar_entry(&head[i], trainer_names[i], &v[i]);
  f64x3_entry(&head[RESUME_NINT], SUMS_NAME, sums);
  scalar_entry(&head[RESUME_NINT + 1], OPT_STEP_NAME, &opt_step);
  f64x3_entry(&head[RESUME_NINT + 2], SGD_NAME, sgd);
  sbn_nn_load_report rep = {0};
  sbn_status st = sbn_nn_load_entries(head, RESUME_NINT + 3, buf, len, SBN_NN_LOAD_EXACT_DTYPES, &rep);
  if (st != SBN_STATUS_OK) return train_fail(st, "resume: %s: %.900s", name, sbn_last_error());
  int missing = 0, has_sgd = 1, has_buffers = 0;
  char first[SBN_NN_NAME_MAX] = "";
  for (int i = 0; i < rep.num_missing; i++)
    if (strcmp(rep.missing[i], SGD_NAME) == 0) has_sgd = 0; /* an earlier version's file */
    else if (!missing++) snprintf(first, sizeof first, "%s", rep.missing[i]);
  for (int i = 0; i < rep.num_unexpected && !has_buffers; i++) {
    const char *k = rep.unexpected[i];
    const size_t kl = strlen(k), sl = strlen(MOMENTUM_SUFFIX);
    has_buffers = strncmp(k, "optimizer.", 10) == 0 && kl > sl && strcmp(k + kl - sl, MOMENTUM_SUFFIX) == 0;
  }
  sbn_nn_load_report_free(&rep);
  if (missing)
    return train_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "resume: %s has no %s%s: not a syncbn-train resume checkpoint (the model file alone cannot "
                      "resume; start afresh without --resume)",
                      name, first, missing > 1 ? " (and more)" : "");
  if (has_sgd && !(isfinite(sgd[0]) && isfinite(sgd[1]) && isfinite(sgd[2]) && sgd[0] >= 0 && sgd[1] >= 0 &&
                   sgd[2] >= 0))
    return train_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "resume: %s holds " SGD_NAME " (lr %g, momentum %g, weight decay %g) that no run can write "
                      "(a damaged or foreign checkpoint)",
                      name, sgd[0], sgd[1], sgd[2]);
  st = check_config(rs, v, has_sgd ? sgd[1] : has_buffers ? -1 : -2, name);
  if (st == SBN_STATUS_OK) st = check_position(rs, v, sums, opt_step, name);
  if (st != SBN_STATUS_OK) return st;
  /* Then everything, strictly: same file, so only the model's and the
   * optimizer's keys, shapes and dtypes can still fail, and then nothing
   * changed. trainer.config.sgd (last) goes to scratch memory: run_sgd
   * stays this run's, which its checkpoints record. */
  sbn_nn_entry *se = &rs->entries[rs->count - 1];
  double scratch[3];
  se->data = scratch;
  st = sbn_nn_load_entries(rs->entries, rs->count - !has_sgd, buf, len, SBN_NN_LOAD_STRICT | SBN_NN_LOAD_EXACT_DTYPES, NULL);
  se->data = rs->run_sgd;
  if (st != SBN_STATUS_OK) return train_fail(st, "resume: %s: %.900s", name, sbn_last_error());
  rs->has_file_sgd = has_sgd;
  memcpy(rs->file_sgd, sgd, sizeof sgd);
  return SBN_STATUS_OK;
}

sbn_status resume_load(resume_state *rs, const char *path) {
  train_clear_error();
  FILE *f = train_fopen(path, "rb");
  if (!f) {
    char why[1024];
    snprintf(why, sizeof why, "%s", train_error());
    return train_fail(SBN_STATUS_IO_ERROR, "resume: %s", why);
  }
  unsigned char *buf = NULL;
  long len = -1;
  size_t got = 0;
  sbn_status st = SBN_STATUS_IO_ERROR;
  errno = 0;
  if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
    train_fail(st, "resume: cannot read %s: %s", path, strerror(errno));
  else if (len == 0)
    train_fail(st,
               "resume: %s is empty (0 bytes), not a resume checkpoint. Restore it from a copy, or remove it to "
               "start afresh",
               path);
  else if (!(buf = malloc((size_t)len)))
    st = train_fail(SBN_STATUS_OUT_OF_MEMORY, "resume: cannot read %s: out of memory for its %ld bytes", path, len);
  else if ((got = fread(buf, 1, (size_t)len, f)) != (size_t)len) {
    if (ferror(f)) train_fail(st, "resume: cannot read %s: %s", path, strerror(errno ? errno : EIO));
    else
      train_fail(st, "resume: cannot read %s: it ended after %zu of its %ld bytes (truncated while it was read)", path,
                 got, len);
  } else
    st = resume_load_memory(rs, buf, (size_t)len, path);
  fclose(f);
  free(buf);
  return st;
}

int resume_complete(const resume_state *rs) { return rs->v[RESUME_EPOCH] >= rs->epochs && rs->v[RESUME_STEP] == 0; }

void resume_print_changes(const resume_state *rs, FILE *f) {
  if (!rs->has_file_sgd) return;
  static const char *const opt[3] = {"--lr", 0, "--weight-decay"};
  for (int i = 0; i < 3; i += 2)
    if (rs->file_sgd[i] != rs->run_sgd[i])
      fprintf(f, "  resume: %s %g (the checkpoint's run had %g); the run continues with %g\n", opt[i], rs->run_sgd[i],
              rs->file_sgd[i], rs->run_sgd[i]);
}

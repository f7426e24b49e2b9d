/* The resume checkpoint of syncbn-train: one safetensors file holding the
 * model, the optimizer (optimizer.*), the position and the running sums of
 * a partial epoch, and the configuration a resume must match (trainer.*).
 * The load validates everything before it changes anything. */
#ifndef SBN_TRAIN_RESUME_H
#define SBN_TRAIN_RESUME_H

#include <stdio.h>

#include "trainer.h"

enum { RESUME_EPOCH, RESUME_STEP, RESUME_RANKS, RESUME_BATCH, RESUME_SEED, RESUME_DATA, RESUME_COUNT, RESUME_WIDTH,
       RESUME_NINT };

typedef struct resume_state {
  sbn_nn_entry *entries; /* model, then optimizer.*, then trainer.* */
  int count, model_count;
  int64_t v[RESUME_NINT]; /* trainer.epoch, trainer.step, trainer.config.* */
  double sums[3];         /* trainer.epoch_sums: loss_sum, correct, seen of the epoch so far */
  int64_t run[RESUME_NINT]; /* this run's configuration (the file's must match) */
  /* trainer.config.sgd: the base lr, the momentum and the weight decay.
   * run_sgd is this run's (saved); file_sgd the loaded file's, when
   * has_file_sgd (files of earlier versions do not hold it). The momentum
   * must match (its buffers belong to it); lr and weight decay may change. */
  double run_sgd[3], file_sgd[3];
  int has_file_sgd;
  int epochs;
  int64_t steps_per_epoch, global_batch;
} resume_state;

/* The entries of (model, sgd) plus the trainer's; v[] holds this run's
 * configuration (ranks, train_count images) at position 0. Release with
 * resume_free. */
sbn_status resume_init(resume_state *rs, sbn_module *model, sbn_nn_sgd *sgd, const train_cfg *cfg, int ranks,
                       int64_t train_count);
void resume_free(resume_state *rs);

/* Load a resume file image (`name` for messages) into the model, the
 * optimizer and rs->v/sums, after checking the file's format, that it was
 * written by a run with this configuration, and that its position, epoch
 * sums and optimizer step are ones this run can reach. On failure nothing
 * changed and train_error() says why. */
sbn_status resume_load_memory(resume_state *rs, const void *buf, size_t len, const char *name);
/* The same from a file. */
sbn_status resume_load(resume_state *rs, const char *path);

/* After a load: 1 when the file's run has completed all of this run's
 * epochs (nothing left to train). */
int resume_complete(const resume_state *rs);
/* After a load: print to `f` one line per SGD option this run changes
 * (--lr, --weight-decay), saying the run continues with the new value. */
void resume_print_changes(const resume_state *rs, FILE *f);

#endif

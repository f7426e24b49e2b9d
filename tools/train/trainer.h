/* One data-parallel training run of syncbn-train, executed by every rank. */
#ifndef SBN_TRAIN_TRAINER_H
#define SBN_TRAIN_TRAINER_H

#include <stdatomic.h>

#include "syncbn_data.h"
#include "syncbn_dp.h"

typedef struct train_cfg {
  int ranks, batch, epochs, width;
  double lr, momentum, weight_decay;
  int sync_bn;               /* 1: SyncBatchNorm over all ranks; 0: local BatchNorm */
  uint64_t seed;
  uint64_t data_fingerprint; /* of the training set (train_fingerprint); checked on resume */
  const char *ckpt_dir;      /* NULL: no checkpoints */
  int resume;                /* continue from ckpt_dir's checkpoint if present */
  const char *csv_path;      /* rank 0 appends a row per epoch (NULL: none) */
  int64_t stop_after_steps;  /* > 0: stop (as on Ctrl-C) after this many steps (tests) */
  int progress;              /* rank 0 draws a progress bar on stderr */
  int quiet;                 /* no per-epoch lines */
} train_cfg;

enum { TRAIN_MAX_EPOCHS = 1000 };

typedef struct epoch_stats {
  double loss, train_acc, test_acc, images_per_s;
} epoch_stats;

typedef struct train_result {
  int epochs_done;           /* epochs completed (including resumed ones) */
  int interrupted;           /* stopped early (signal or stop_after_steps) */
  int already_complete;      /* resumed a run that had completed its epochs: nothing trained */
  epoch_stats epoch[TRAIN_MAX_EPOCHS];
  double step_loss_sum;      /* sum of the global losses of the steps run here (resume tests) */
  int64_t steps_run;
  int64_t images_skipped;    /* per epoch: tail images too few to give every rank one */
  char checkpoint[512];      /* the model file (PyTorch state dict) */
  char error[1024];          /* rank 0's failure message */
} train_result;

/* Set by the SIGINT/SIGTERM handler on any rank; at every step boundary the
 * ranks agree (one all-reduce) to stop together. An atomic, not a volatile
 * sig_atomic_t: the handler runs on one thread while the thread ranks read
 * it on theirs (a lock-free atomic is safe in a signal handler too). */
extern atomic_int train_interrupted;

/* Train on `group` (every rank calls it with the same cfg and datasets).
 * Rank 0 fills *result. Returns a status; messages via sbn_last_error(). */
sbn_status train_run(sbn_group *group, const train_cfg *cfg, const sbn_dataset *train,
                     const sbn_dataset *test, train_result *result);

/* The files of a mode inside ckpt_dir: the model alone (a PyTorch state
 * dict) and the resume state (model, optimizer, position, configuration). */
void train_model_path(char *buf, size_t cap, const train_cfg *cfg);
void train_resume_path(char *buf, size_t cap, const train_cfg *cfg);

/* A 64-bit fingerprint of a dataset's shape, labels and pixels. */
uint64_t train_fingerprint(const sbn_dataset *d);

#endif

/* A small syncbn-train run (the trainer's ResNet at width 1, its SGD with
 * momentum, its resume entries) that the resume unit test, its seed writer
 * and the fuzz target share, so the checked-in seeds fit all three. */
#ifndef SBN_TEST_RESUME_FIXTURE_H
#define SBN_TEST_RESUME_FIXTURE_H

#include "train/resume.h"

/* 2 ranks x batch 2 over 10 images: 3 steps per epoch (the last one short),
 * 3 epochs; SGD with lr 0.1, momentum 0.9, no weight decay. */
typedef struct resume_fixture {
  sbn_module *model;
  sbn_nn_sgd *sgd;
  train_cfg cfg;
  resume_state rs;
} resume_fixture;

/* 0 on success; prints why not otherwise. */
int resume_fixture_init(resume_fixture *f);
/* The same with another SGD momentum than 0.9 (0: no momentum buffers). */
int resume_fixture_init_momentum(resume_fixture *f, double momentum);
void resume_fixture_free(resume_fixture *f);
/* A hash of every byte the resume file loads into (model, optimizer,
 * position, sums): equal before and after a failed load. */
uint64_t resume_fixture_hash(const resume_fixture *f);

#endif

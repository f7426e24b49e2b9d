#include "resume_fixture.h"

#include <stdio.h>
#include <string.h>

#include "train/model.h"

int resume_fixture_init(resume_fixture *f) { return resume_fixture_init_momentum(f, 0.9); }

int resume_fixture_init_momentum(resume_fixture *f, double momentum) {
  memset(f, 0, sizeof *f);
  f->cfg = (train_cfg){.ranks = 2, .batch = 2, .epochs = 3, .width = 1, .lr = 0.1, .momentum = momentum, .sync_bn = 1,
                       .seed = 5, .data_fingerprint = 0x0123456789abcdefull};
  sbn_nn_sgd_options so = {f->cfg.lr, f->cfg.momentum, 0.0, 0.0, 0};
  sbn_status st = build_resnet(&f->model, 1, f->cfg.width, 2, f->cfg.seed);
  if (st == SBN_STATUS_OK) st = sbn_nn_sgd_create(&f->sgd, f->model, &so);
  if (st == SBN_STATUS_OK) st = resume_init(&f->rs, f->model, f->sgd, &f->cfg, f->cfg.ranks, 10);
  if (st != SBN_STATUS_OK) {
    fprintf(stderr, "resume fixture: %s\n", sbn_last_error());
    resume_fixture_free(f);
    return 1;
  }
  return 0;
}

void resume_fixture_free(resume_fixture *f) {
  resume_free(&f->rs);
  sbn_nn_sgd_destroy(f->sgd);
  sbn_module_destroy(f->model);
  f->sgd = NULL, f->model = NULL;
}

uint64_t resume_fixture_hash(const resume_fixture *f) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (int i = 0; i < f->rs.count; i++) {
    const sbn_nn_entry *e = &f->rs.entries[i];
    const size_t n = (size_t)e->numel * (e->dtype == SBN_DTYPE_FLOAT32 ? 4 : 8);
    for (size_t k = 0; k < n; k++) h = (h ^ ((const unsigned char *)e->data)[k]) * 1099511628211ull;
  }
  return h;
}

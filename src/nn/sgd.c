/* SGD with momentum, dampening, weight decay and Nesterov, with PyTorch's
 * update rule evaluated in float32 in PyTorch's order of operations
 * (torch/optim/sgd.py, _single_tensor_sgd). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "module.h"

struct sbn_nn_sgd {
  sbn_nn_sgd_options o;
  sbn_nn_entry *p; /* parameters that require grad */
  int n;
  float **buf;  /* momentum buffers (momentum != 0) */
  int64_t step; /* steps taken; the first one initializes the buffers */
};

sbn_status sbn_nn_sgd_create(sbn_nn_sgd **out, sbn_module *m, const sbn_nn_sgd_options *o) {
  static const char call[] = "sbn_nn_sgd_create";
  sbn_clear_error();
  if (!out || !m || !o) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: NULL argument", call);
  *out = NULL;
  const struct {
    const char *name;
    double v;
    int nonneg;
  } f[] = {{"lr", o->lr, 1}, {"momentum", o->momentum, 1}, {"dampening", o->dampening, 0},
           {"weight_decay", o->weight_decay, 1}};
  for (size_t i = 0; i < sizeof f / sizeof *f; i++)
    if (!isfinite(f[i].v) || (f[i].nonneg && f[i].v < 0))
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: options->%s = %g: must be a finite number%s", call,
                      f[i].name, f[i].v, f[i].nonneg ? " >= 0" : "");
  if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: Nesterov momentum requires a momentum and zero dampening",
                    call);
  sbn_nn_sgd *s = calloc(1, sizeof *s);
  if (!s) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  s->o = *o;
  sbn_nn_entry *all;
  int n;
  sbn_status st = sbn_module_entries(&all, &n, m, SBN_NN_PARAMETERS);
  if (st != SBN_STATUS_OK) {
    free(s);
    return st;
  }
  s->p = all;
  for (int i = 0; i < n; i++)
    if (all[i].requires_grad) s->p[s->n++] = all[i];
  s->buf = calloc((size_t)(s->n ? s->n : 1), sizeof *s->buf);
  int ok = s->buf != NULL;
  for (int i = 0; ok && i < s->n && o->momentum != 0; i++)
    ok = (s->buf[i] = calloc((size_t)s->p[i].numel, sizeof(float))) != NULL;
  if (!ok) {
    sbn_nn_sgd_destroy(s);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory for momentum buffers", call);
  }
  *out = s;
  return SBN_STATUS_OK;
}

sbn_status sbn_nn_sgd_step(sbn_nn_sgd *s) {
  sbn_clear_error();
  if (!s) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_nn_sgd_step: optimizer is NULL");
  const float lr = (float)s->o.lr, mom = (float)s->o.momentum, damp1 = (float)(1.0 - s->o.dampening);
  const float wd = (float)s->o.weight_decay;
  for (int i = 0; i < s->n; i++) {
    float *p = s->p[i].data, *g = s->p[i].grad, *b = s->buf[i];
    for (int64_t j = 0; j < s->p[i].numel; j++) {
      float d = g[j];
      if (wd != 0) d = d + wd * p[j];
      if (mom != 0) {
        if (s->step == 0)
          b[j] = d;
        else
          b[j] = b[j] * mom + damp1 * d;
        d = s->o.nesterov ? d + mom * b[j] : b[j];
      }
      p[j] = p[j] + (-lr) * d;
    }
  }
  s->step++;
  return SBN_STATUS_OK;
}

sbn_status sbn_nn_sgd_set_lr(sbn_nn_sgd *s, double lr) {
  sbn_clear_error();
  if (!s) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_nn_sgd_set_lr: optimizer is NULL");
  if (!isfinite(lr) || lr < 0)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "sbn_nn_sgd_set_lr: lr = %g: must be a finite number >= 0 (the learning rate is unchanged)", lr);
  s->o.lr = lr;
  return SBN_STATUS_OK;
}

sbn_status sbn_nn_sgd_entries(sbn_nn_entry **out, int *count, sbn_nn_sgd *s) {
  sbn_clear_error();
  if (!out || !count || !s) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_nn_sgd_entries: NULL argument");
  int nb = s->o.momentum != 0 ? s->n : 0;
  sbn_nn_entry *e = calloc((size_t)nb + 1, sizeof *e);
  if (!e) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_nn_sgd_entries: out of memory");
  for (int i = 0; i < nb; i++) {
    e[i] = s->p[i];
    if ((size_t)snprintf(e[i].name, sizeof e[i].name, "%s.momentum_buffer", s->p[i].name) >= sizeof e[i].name) {
      free(e);
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_nn_sgd_entries: name too long");
    }
    e[i].kind = SBN_NN_ENTRY_KIND_BUFFER;
    e[i].data = s->buf[i];
    e[i].grad = NULL;
    e[i].requires_grad = 0;
  }
  sbn_nn_entry *st = &e[nb];
  snprintf(st->name, sizeof st->name, "step");
  st->kind = SBN_NN_ENTRY_KIND_BUFFER;
  st->dtype = SBN_DTYPE_INT64;
  st->ndim = 0;
  st->numel = 1;
  st->data = &s->step;
  *out = e, *count = nb + 1;
  return SBN_STATUS_OK;
}

sbn_status sbn_nn_sgd_destroy(sbn_nn_sgd *s) {
  if (!s) return SBN_STATUS_OK;
  for (int i = 0; s->buf && i < s->n; i++) free(s->buf[i]);
  free(s->buf), free(s->p), free(s);
  return SBN_STATUS_OK;
}

/* Internal: the module tree shared by the layers of src/nn. A module is a
 * kind, a table of operations, named children, named parameters/buffers
 * (local names; full names are built while listing), and the activations
 * it keeps for backward. */
#ifndef SBN_NN_MODULE_H
#define SBN_NN_MODULE_H

#include "../core/error.h"
#include "grads.h"
#include "syncbn_nn.h"

#define SBN_NN_MAX_LOCAL 8 /* parameters + buffers held by one module */

typedef struct sbn_nn_local {
  const char *name; /* static local name: "weight", "running_mean" */
  sbn_nn_entry_kind kind;
  sbn_dtype dtype;
  int ndim;
  int64_t shape[SBN_MAX_DIMS];
  int64_t numel;
  void *data;
  float *grad;
  int requires_grad;
  int grad_saved; /* how the last sbn_nn_grads_save kept grad: see module.c */
} sbn_nn_local;

typedef struct sbn_module_ops {
  /* x was checked (float32, CPU, channels-first) and saved in m->x. */
  sbn_status (*forward)(sbn_module *m, sbn_tensor *y, const sbn_tensor *x);
  /* dy was checked against m->y (shape). */
  sbn_status (*backward)(sbn_module *m, sbn_tensor *dx, const sbn_tensor *dy);
  void (*destroy)(sbn_module *m); /* frees m->impl (children are freed by the tree) */
  sbn_status (*train)(sbn_module *m, int training); /* optional hook */
} sbn_module_ops;

typedef struct sbn_nn_buf {
  float *p;
  size_t cap; /* floats */
} sbn_nn_buf;

struct sbn_module {
  sbn_module_kind kind;
  const sbn_module_ops *ops;
  sbn_module *parent;
  int nchild, child_cap;
  sbn_module **child;
  char **child_name;
  int nlocal;
  sbn_nn_local local[SBN_NN_MAX_LOCAL];
  int training, wrapped;
  void *impl;
  sbn_tensor x, y; /* last forward's input and output descriptors */
  int have_fwd;
  sbn_nn_buf out, dx; /* module-owned output and input gradient */
  sbn_nn_buf saved;   /* gradients saved while a backward from this module runs */
  /* Second buffers, allocated only when a call's input lies in out or dx
   * (see unalias in module.c); they then hold that input. */
  sbn_nn_buf out_spare, dx_spare;
};

/* Allocate a module (training mode, no children); NULL on OOM. */
sbn_module *sbn_nn_module_new(sbn_module_kind kind, const sbn_module_ops *ops, void *impl);
/* Register a float32 parameter/buffer or an int64 scalar buffer. */
sbn_nn_local *sbn_nn_add_local(sbn_module *m, const char *name, sbn_nn_entry_kind kind,
                               sbn_dtype dtype, int ndim, const int64_t *shape, void *data,
                               float *grad);
sbn_nn_local *sbn_nn_find_local(sbn_module *m, const char *name);
/* Attach a child (the caller guarantees it is parentless) when every
 * state-dict name of the tree stays within SBN_NN_NAME_MAX - 1 characters
 * (else INVALID_ARGUMENT, the message prefixed by `call`); name copied. */
sbn_status sbn_nn_add_child(sbn_module *m, const char *name, sbn_module *child, const char *call);
/* Free a module and its subtree (no parent checks). */
void sbn_nn_module_free(sbn_module *m);

/* Ensure the buffer holds n floats; returns it or NULL (error recorded). */
float *sbn_nn_buf_reserve(sbn_nn_buf *b, int64_t n, const char *who);
/* A float32 CPU channels-first tensor descriptor. */
sbn_tensor sbn_nn_view(float *data, int ndim, const int64_t *shape);
/* "[2, 3, 4]" */
const char *sbn_nn_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape);
/* Forward of a child without clearing the error (internal use; the
 * backward counterpart is in grads.h). */
sbn_status sbn_nn_forward(sbn_module *m, sbn_tensor *y, const sbn_tensor *x);

/* Deterministic PyTorch-like init: uniform(-bound, bound) from a seed. */
void sbn_nn_init_uniform(float *p, int64_t n, double bound, uint64_t seed);

/* batchnorm.c: build a BN module around an existing core layer (taking
 * ownership), used by the constructors and by convert/revert. */
sbn_status sbn_nn_bn_module_wrap(sbn_module **out, sbn_module_kind kind, sbn_bn *bn,
                                 sbn_module_kind revert_kind);
sbn_module_kind sbn_nn_bn_revert_kind(const sbn_module *m);
int64_t *sbn_nn_bn_nbt(sbn_module *m);

#endif

/* Internal: what the data-parallel wrapper needs to run a model's backward
 * itself (child by child, with gradient all-reduces in between) and still
 * keep sbn_module_backward's promise that a failed call changes no
 * gradient. */
#ifndef SBN_NN_GRADS_H
#define SBN_NN_GRADS_H

#include "syncbn_nn.h"

/* 1 when m's most recent forward succeeded (its backward may run). */
int sbn_nn_has_forward(const sbn_module *m);
/* What sbn_module_backward does before it saves gradients: check that m
 * has a forward and dy its output's shape, and point the modules whose
 * input-gradient buffers hold dy or the forward's x at their second ones. */
sbn_status sbn_nn_backward_prepare(sbn_module *m, const sbn_tensor *dy);
/* Backward without clearing the error and without saving gradients. */
sbn_status sbn_nn_backward(sbn_module *m, sbn_tensor *dx, const sbn_tensor *dy);
/* Remember every gradient of the tree that a backward may change (those of
 * parameters requiring grad), in storage kept by `root`: one read pass, and
 * a copy only of the gradients that are not all zero (after zero_grad
 * nothing is copied; *copied, if not NULL: how many floats were). Fails
 * (out of memory) before anything changed. */
sbn_status sbn_nn_grads_save(sbn_module *root, int64_t *copied);
/* Are all n floats at g +0.0f (-0.0f is not)? */
int sbn_nn_all_zero_bits(const float *g, int64_t n);
/* Put back exactly what the last sbn_nn_grads_save of `root` saw. */
void sbn_nn_grads_restore(sbn_module *root);
/* A wrapper holds its model as a root: is m some module's child? Is m, or
 * any module below it, wrapped already? */
int sbn_nn_has_parent(const sbn_module *m);
int sbn_nn_wrapped_below(const sbn_module *m);

#endif

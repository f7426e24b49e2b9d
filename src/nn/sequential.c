/* Sequential: runs its children in order; backward in reverse. The output
 * is the last child's output (a view); an empty Sequential is the identity. */
#include <stdio.h>
#include <string.h>

#include "module.h"

static sbn_status seq_forward(sbn_module *m, sbn_tensor *y, const sbn_tensor *x) {
  sbn_tensor cur = *x;
  for (int i = 0; i < m->nchild; i++) {
    sbn_tensor next;
    sbn_status st = sbn_nn_forward(m->child[i], &next, &cur);
    if (st != SBN_STATUS_OK) return st;
    cur = next;
  }
  *y = cur;
  return SBN_STATUS_OK;
}

static sbn_status seq_backward(sbn_module *m, sbn_tensor *dx, const sbn_tensor *dy) {
  sbn_tensor cur = *dy;
  for (int i = m->nchild - 1; i >= 0; i--) {
    sbn_tensor prev;
    sbn_status st = sbn_nn_backward(m->child[i], &prev, &cur);
    if (st != SBN_STATUS_OK) return st;
    cur = prev;
  }
  *dx = cur;
  return SBN_STATUS_OK;
}

static const sbn_module_ops seq_ops = {seq_forward, seq_backward, NULL, NULL};

sbn_status sbn_nn_sequential_create(sbn_module **out) {
  sbn_clear_error();
  if (!out) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_nn_sequential_create: out is NULL");
  *out = sbn_nn_module_new(SBN_MODULE_KIND_SEQUENTIAL, &seq_ops, NULL);
  return *out ? SBN_STATUS_OK : sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_nn_sequential_create: out of memory");
}

sbn_status sbn_nn_sequential_append(sbn_module *seq, const char *name, sbn_module *child) {
  static const char call[] = "sbn_nn_sequential_append";
  sbn_clear_error();
  if (!seq || !child) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: NULL argument", call);
  if (seq->kind != SBN_MODULE_KIND_SEQUENTIAL)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: the container is a %s, not a Sequential", call,
                    sbn_module_kind_name(seq->kind));
  if (child->parent) return sbn_fail(SBN_STATUS_BAD_STATE, "%s: the child already has a parent", call);
  for (sbn_module *a = seq; a; a = a->parent)
    if (a == child) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: a module cannot contain itself", call);
  if (sbn_module_is_wrapped(seq) == 1)
    return sbn_fail(SBN_STATUS_BAD_STATE, "%s: the tree is wrapped for data-parallel training", call);
  if (sbn_nn_wrapped_below(child)) /* its wrapper holds it as a root */
    return sbn_fail(SBN_STATUS_BAD_STATE, "%s: the child is wrapped for data-parallel training", call);
  char idx[24];
  if (!name) {
    snprintf(idx, sizeof idx, "%d", seq->nchild);
    name = idx;
  }
  if (!*name || strchr(name, '.'))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: child name \"%s\" must be non-empty without '.'", call, name);
  for (int i = 0; i < seq->nchild; i++)
    if (!strcmp(seq->child_name[i], name))
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: a child named \"%s\" exists", call, name);
  return sbn_nn_add_child(seq, name, child, call);
}

/* convert_sync_batchnorm and revert_sync_batchnorm over a module tree.
 * All or nothing: every replacement is built first (allocation and group
 * checks can fail), then swapped in; on failure the tree is unchanged.
 * Like PyTorch's convert, the replacement keeps the original's parameter
 * and buffer storage (the memory moves to the new module, the discarded one
 * gets equal copies), so an optimizer created before the convert keeps
 * updating the live parameters. */
#include <stdlib.h>
#include <string.h>

#include "../core/bn_internal.h"
#include "module.h"

static int is_plain_bn(const sbn_module *m) {
  return m->kind == SBN_MODULE_KIND_BATCHNORM1D || m->kind == SBN_MODULE_KIND_BATCHNORM2D ||
         m->kind == SBN_MODULE_KIND_BATCHNORM3D;
}
static int is_sync_bn(const sbn_module *m) { return m->kind == SBN_MODULE_KIND_SYNC_BATCHNORM; }

/* A new module of `kind` (group) with old's options and state: parameters,
 * gradients, buffers, num_batches_tracked, requires_grad and training. */
static sbn_status rebuild(sbn_module **out, const sbn_module *old, sbn_module_kind kind,
                          sbn_module_kind revert_kind, sbn_group *group) {
  sbn_bn *obn, *nbn;
  sbn_status st = sbn_module_bn(&obn, (sbn_module *)old);
  if (st != SBN_STATUS_OK) return st;
  sbn_bn_options o;
  if ((st = sbn_bn_get_options(obn, &o)) != SBN_STATUS_OK) return st;
  if ((st = sbn_bn_create(&nbn, &o, group)) != SBN_STATUS_OK) return st;
  sbn_bn_set_training(nbn, old->training);
  sbn_module *m;
  if ((st = sbn_nn_bn_module_wrap(&m, kind, nbn, revert_kind)) != SBN_STATUS_OK) {
    sbn_bn_destroy(nbn);
    return st;
  }
  for (int i = 0; i < old->nlocal; i++) {
    const sbn_nn_local *a = &old->local[i];
    sbn_nn_local *b = sbn_nn_find_local(m, a->name);
    if (!b || b->numel != a->numel || b->dtype != a->dtype) {
      sbn_nn_module_free(m);
      return sbn_fail(SBN_STATUS_INTERNAL, "convert: %s has no matching %s", sbn_module_kind_name(kind), a->name);
    }
    memcpy(b->data, a->data, (size_t)a->numel * (a->dtype == SBN_DTYPE_INT64 ? 8 : 4));
    if (a->grad && b->grad) memcpy(b->grad, a->grad, sizeof(float) * (size_t)a->numel);
    b->requires_grad = a->requires_grad;
  }
  m->training = old->training;
  *out = m;
  return SBN_STATUS_OK;
}

/* Give `repl` the storage of `old` (equal values: repl was built as a copy),
 * in the core layers and in the modules' entries; nothing can fail. */
static void adopt_storage(sbn_module *repl, sbn_module *old) {
  sbn_bn *obn = NULL, *nbn = NULL;
  sbn_module_bn(&obn, old), sbn_module_bn(&nbn, repl);
  if (sbn_bn_swap_storage(obn, nbn) != 0) return; /* same options by construction */
  for (int i = 0; i < old->nlocal; i++) {
    sbn_nn_local *a = &old->local[i], *b = sbn_nn_find_local(repl, a->name);
    if (!b || a->dtype != SBN_DTYPE_FLOAT32) continue; /* num_batches_tracked lives in the module */
    void *d = a->data;
    float *g = a->grad;
    a->data = b->data, a->grad = b->grad;
    b->data = d, b->grad = g;
  }
}

typedef struct slot {
  sbn_module *parent;
  int index;
  sbn_module *repl;
} slot;

typedef struct slots {
  slot *s;
  int n, cap;
} slots;

static sbn_status collect(slots *S, sbn_module *m, int (*match)(const sbn_module *)) {
  for (int i = 0; i < m->nchild; i++) {
    if (match(m->child[i])) {
      if (S->n == S->cap) {
        int cap = S->cap ? 2 * S->cap : 16;
        slot *s = realloc(S->s, sizeof *s * (size_t)cap);
        if (!s) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "convert: out of memory");
        S->s = s, S->cap = cap;
      }
      S->s[S->n++] = (slot){m, i, NULL};
    } else {
      sbn_status st = collect(S, m->child[i], match);
      if (st != SBN_STATUS_OK) return st;
    }
  }
  return SBN_STATUS_OK;
}

static sbn_status transform(sbn_module **out, sbn_module *module, sbn_group *group, int to_sync, const char *call) {
  sbn_clear_error();
  if (!out || !module) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: NULL argument", call);
  /* *out is written only on success: callers pass the pointer they convert
   * (sbn_nn_convert_sync_batchnorm(&net, net, g)), which a failure must keep. */
  if (sbn_module_is_wrapped(module) == 1 || sbn_nn_wrapped_below(module))
    return sbn_fail(SBN_STATUS_BAD_STATE,
                    "%s: the model is already wrapped for data-parallel training; convert BatchNorm layers "
                    "before wrapping",
                    call);
  int (*match)(const sbn_module *) = to_sync ? is_plain_bn : is_sync_bn;
  if (match(module)) {
    if (module->parent)
      return sbn_fail(SBN_STATUS_BAD_STATE,
                      "%s: this %s is a child of a %s: convert its parent, which replaces it in place", call,
                      sbn_module_kind_name(module->kind), sbn_module_kind_name(module->parent->kind));
    sbn_module_kind k = to_sync ? SBN_MODULE_KIND_SYNC_BATCHNORM : sbn_nn_bn_revert_kind(module);
    sbn_module *repl = NULL;
    sbn_status st = rebuild(&repl, module, k, to_sync ? module->kind : k, to_sync ? group : NULL);
    if (st != SBN_STATUS_OK) return st;
    adopt_storage(repl, module);
    *out = repl;
    return SBN_STATUS_OK;
  }
  slots S = {NULL, 0, 0};
  sbn_status st = collect(&S, module, match);
  for (int i = 0; st == SBN_STATUS_OK && i < S.n; i++) {
    sbn_module *old = S.s[i].parent->child[S.s[i].index];
    sbn_module_kind k = to_sync ? SBN_MODULE_KIND_SYNC_BATCHNORM : sbn_nn_bn_revert_kind(old);
    st = rebuild(&S.s[i].repl, old, k, to_sync ? old->kind : k, to_sync ? group : NULL);
  }
  if (st != SBN_STATUS_OK) {
    for (int i = 0; i < S.n; i++) sbn_nn_module_free(S.s[i].repl);
    free(S.s);
    return st;
  }
  for (int i = 0; i < S.n; i++) {
    sbn_module **pos = &S.s[i].parent->child[S.s[i].index];
    adopt_storage(S.s[i].repl, *pos);
    sbn_nn_module_free(*pos);
    *pos = S.s[i].repl;
    S.s[i].repl->parent = S.s[i].parent;
  }
  free(S.s);
  *out = module;
  return SBN_STATUS_OK;
}

sbn_status sbn_nn_convert_sync_batchnorm(sbn_module **out, sbn_module *module, sbn_group *group) {
  return transform(out, module, group, 1, "sbn_nn_convert_sync_batchnorm");
}

sbn_status sbn_nn_revert_sync_batchnorm(sbn_module **out, sbn_module *module) {
  return transform(out, module, NULL, 0, "sbn_nn_revert_sync_batchnorm");
}

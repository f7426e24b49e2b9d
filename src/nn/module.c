/* The module tree: allocation, children, train/eval, the checked
 * forward/backward entry points, zero_grad, requires_grad, the wrapped flag,
 * and listing parameters and buffers under PyTorch's state-dict names. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "module.h"
#include "../core/checked.h"

static const char *const kind_names[SBN_MODULE_KIND_COUNT_] = {
    "Sequential",  "Linear",      "Conv2d",      "ReLU",          "MaxPool2d",  "AdaptiveAvgPool2d",
    "Flatten",     "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",   "SyncBatchNorm", "BasicBlock"};

const char *sbn_module_kind_name(sbn_module_kind kind) {
  return (kind >= 0 && kind < SBN_MODULE_KIND_COUNT_) ? kind_names[kind] : "unknown";
}

sbn_module_kind sbn_module_kind_of(const sbn_module *m) { return m ? m->kind : SBN_MODULE_KIND_COUNT_; }

sbn_module *sbn_nn_module_new(sbn_module_kind kind, const sbn_module_ops *ops, void *impl) {
  sbn_module *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->kind = kind;
  m->ops = ops;
  m->impl = impl;
  m->training = 1;
  return m;
}

sbn_nn_local *sbn_nn_add_local(sbn_module *m, const char *name, sbn_nn_entry_kind kind, sbn_dtype dtype,
                               int ndim, const int64_t *shape, void *data, float *grad) {
  if (m->nlocal >= SBN_NN_MAX_LOCAL) return NULL;
  sbn_nn_local *l = &m->local[m->nlocal++];
  memset(l, 0, sizeof *l);
  l->name = name;
  l->kind = kind;
  l->dtype = dtype;
  l->ndim = ndim;
  for (int i = 0; i < ndim; i++) l->shape[i] = shape[i];
  /* Constructors check their sizes before they allocate the storage. */
  if (!sbn_shape_numel(&l->numel, ndim, l->shape)) l->numel = -1;
  l->data = data;
  l->grad = grad;
  l->requires_grad = kind == SBN_NN_ENTRY_KIND_PARAMETER;
  return l;
}

sbn_nn_local *sbn_nn_find_local(sbn_module *m, const char *name) {
  for (int i = 0; i < m->nlocal; i++)
    if (!strcmp(m->local[i].name, name)) return &m->local[i];
  return NULL;
}

/* ---- state-dict name lengths ----
 * Every full name (module path, '.', local name) must fit in an entry's
 * name[SBN_NN_NAME_MAX]. Checking when a child is attached keeps a model
 * from being built whose checkpoint could not be written. */

/* The longest name below m, relative to m ("layer1.0.bn1.running_mean"
 * below the root), into buf (cap >= SBN_NN_NAME_MAX); returns its length.
 * A module without state counts its path and the '.' that listing adds. */
static size_t longest_below(const sbn_module *m, char *buf, size_t cap) {
  size_t best = 0;
  buf[0] = 0;
  for (int i = 0; i < m->nlocal; i++)
    if (strlen(m->local[i].name) > best) best = strlen(m->local[i].name), snprintf(buf, cap, "%s", m->local[i].name);
  for (int i = 0; i < m->nchild; i++) {
    char sub[SBN_NN_NAME_MAX];
    const size_t n = strlen(m->child_name[i]) + 1 + longest_below(m->child[i], sub, sizeof sub);
    /* A relative name fits by the same check when it was attached; cut
     * the example short rather than trust that. */
    if (n > best && snprintf(buf, cap, "%s.%s", m->child_name[i], sub) >= 0) best = n;
  }
  return best;
}

/* m's dotted path from its root into buf ("" for a root); the paths of
 * attached modules are short enough by the check below. */
static void module_path(char *buf, size_t cap, const sbn_module *m) {
  buf[0] = 0;
  if (!m->parent) return;
  module_path(buf, cap, m->parent);
  for (int i = 0; i < m->parent->nchild; i++)
    if (m->parent->child[i] == m) {
      size_t n = strlen(buf);
      snprintf(buf + n, cap - n, "%s%s", n ? "." : "", m->parent->child_name[i]);
    }
}

static sbn_status check_child_name(const sbn_module *m, const char *name, const sbn_module *child, const char *call) {
  const size_t limit = SBN_NN_NAME_MAX - 1;
  char prefix[SBN_NN_NAME_MAX], below[SBN_NN_NAME_MAX];
  module_path(prefix, sizeof prefix, m);
  const size_t plen = strlen(prefix), nlen = strlen(name);
  const size_t full = (plen ? plen + 1 : 0) + nlen + 1 + longest_below(child, below, sizeof below);
  if (full <= limit) return SBN_STATUS_OK;
  return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                  "%s: the child \"%.48s%s\" (%zu characters) under %s%s%s would give state names of up to %zu "
                  "characters, over the limit of %zu (SBN_NN_NAME_MAX - 1); use shorter names or less nesting "
                  "(longest: \"%s%s%.48s%s%s%s\")",
                  call, name, nlen > 48 ? "..." : "", nlen, plen ? "module \"" : "the root", prefix, plen ? "\"" : "",
                  full, limit, prefix, plen ? "." : "", name, nlen > 48 ? "..." : "", below[0] ? "." : "", below);
}

sbn_status sbn_nn_add_child(sbn_module *m, const char *name, sbn_module *child, const char *call) {
  sbn_status st = check_child_name(m, name, child, call);
  if (st != SBN_STATUS_OK) return st;
  if (m->nchild == m->child_cap) {
    int cap = m->child_cap ? 2 * m->child_cap : 4;
    sbn_module **c = realloc(m->child, sizeof *c * (size_t)cap);
    if (!c) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory adding a child", call);
    m->child = c;
    char **n = realloc(m->child_name, sizeof *n * (size_t)cap);
    if (!n) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory adding a child", call);
    m->child_name = n;
    m->child_cap = cap;
  }
  char *copy = strdup(name);
  if (!copy) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory adding a child", call);
  m->child[m->nchild] = child;
  m->child_name[m->nchild] = copy;
  m->nchild++;
  child->parent = m;
  return SBN_STATUS_OK;
}

void sbn_nn_module_free(sbn_module *m) {
  if (!m) return;
  for (int i = 0; i < m->nchild; i++) {
    sbn_nn_module_free(m->child[i]);
    free(m->child_name[i]);
  }
  free(m->child), free(m->child_name);
  if (m->ops && m->ops->destroy) m->ops->destroy(m);
  free(m->out.p), free(m->dx.p), free(m->saved.p), free(m->out_spare.p), free(m->dx_spare.p);
  free(m);
}

sbn_status sbn_module_destroy(sbn_module *m) {
  if (!m) return SBN_STATUS_OK;
  if (m->parent)
    return sbn_fail(SBN_STATUS_BAD_STATE,
                    "sbn_module_destroy: this %s is a child of a %s; destroy the root instead",
                    sbn_module_kind_name(m->kind), sbn_module_kind_name(m->parent->kind));
  /* A wrapper keeps a pointer to its model and writes to it when it is
   * destroyed: the model must outlive it (a wrapped module anywhere in the
   * tree: one appended under this root after its wrapping). */
  if (sbn_nn_wrapped_below(m))
    return sbn_fail(SBN_STATUS_BAD_STATE,
                    "sbn_module_destroy: this %s %s wrapped for data-parallel training; destroy the "
                    "wrapper first (sbn_dp_destroy)",
                    sbn_module_kind_name(m->kind), m->wrapped ? "is" : "holds a module");
  sbn_nn_module_free(m);
  return SBN_STATUS_OK;
}

int sbn_module_num_children(const sbn_module *m) { return m ? m->nchild : 0; }

sbn_status sbn_module_child(sbn_module **child, const char **name, sbn_module *m, int i) {
  sbn_clear_error();
  if (!m || !child) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_module_child: NULL argument");
  if (i < 0 || i >= m->nchild)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_module_child: index %d out of range [0, %d)", i,
                    m->nchild);
  *child = m->child[i];
  if (name) *name = m->child_name[i];
  return SBN_STATUS_OK;
}

sbn_status sbn_module_find(sbn_module **out, sbn_module *m, const char *path) {
  sbn_clear_error();
  if (!out || !m || !path) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_module_find: NULL argument");
  const char *p = path;
  while (*p) {
    const char *dot = strchr(p, '.');
    size_t len = dot ? (size_t)(dot - p) : strlen(p);
    sbn_module *next = NULL;
    for (int i = 0; i < m->nchild && !next; i++)
      if (strlen(m->child_name[i]) == len && !strncmp(m->child_name[i], p, len)) next = m->child[i];
    if (!next) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_module_find: no submodule \"%s\"", path);
    m = next;
    p += len + (dot ? 1 : 0);
  }
  *out = m;
  return SBN_STATUS_OK;
}

static sbn_status train_rec(sbn_module *m, int training) {
  if (m->ops->train) {
    sbn_status st = m->ops->train(m, training);
    if (st != SBN_STATUS_OK) return st;
  }
  m->training = training;
  for (int i = 0; i < m->nchild; i++) {
    sbn_status st = train_rec(m->child[i], training);
    if (st != SBN_STATUS_OK) return st;
  }
  return SBN_STATUS_OK;
}

sbn_status sbn_module_train(sbn_module *m, int training) {
  sbn_clear_error();
  if (!m) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_module_train: module is NULL");
  return train_rec(m, training != 0);
}

int sbn_module_is_training(const sbn_module *m) { return m ? m->training : -1; }

sbn_tensor sbn_nn_view(float *data, int ndim, const int64_t *shape) {
  return sbn_tensor_cpu(data, ndim, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
}

const char *sbn_nn_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t n = 0;
  n += (size_t)snprintf(buf + n, cap - n, "[");
  for (int i = 0; i < ndim && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
  return buf;
}

float *sbn_nn_buf_reserve(sbn_nn_buf *b, int64_t n, const char *who) {
  size_t need = n > 0 ? (size_t)n : 1, bytes;
  if (n < 0 || !sbn_bytes(&bytes, (int64_t)need, sizeof(float))) {
    sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %lld floats: size overflows", who, (long long)n);
    return NULL;
  }
  if (need > b->cap) {
    float *p = realloc(b->p, bytes);
    if (!p) {
      sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory for %zu floats", who, need);
      return NULL;
    }
    b->p = p;
    b->cap = need;
  }
  return b->p;
}

void sbn_nn_init_uniform(float *p, int64_t n, double bound, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
  for (int64_t i = 0; i < n; i++) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    double u = (double)(z >> 11) * 0x1.0p-53;
    p[i] = (float)((2 * u - 1) * bound);
  }
}

static sbn_status check_tensor(const sbn_tensor *t, const char *call, const char *name) {
  if (!t) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", call, name);
  if (t->dtype != SBN_DTYPE_FLOAT32)
    return sbn_fail(SBN_STATUS_UNSUPPORTED, "%s: %s must be float32", call, name);
  if (t->device.type != SBN_DEVICE_CPU)
    return sbn_fail(SBN_STATUS_UNSUPPORTED, "%s: %s must be on the CPU", call, name);
  if (t->layout != SBN_LAYOUT_CHANNELS_FIRST && t->ndim > 2)
    return sbn_fail(SBN_STATUS_UNSUPPORTED, "%s: %s must be channels-first (contiguous)", call, name);
  if (t->ndim < 1 || t->ndim > SBN_MAX_DIMS)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s has %d dims (1..%d supported)", call, name,
                    t->ndim, SBN_MAX_DIMS);
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] < 0)
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s has a negative dimension", call, name);
  size_t bytes;
  if (sbn_tensor_numel(t) < 0 || !sbn_bytes(&bytes, sbn_tensor_numel(t), 8)) {
    char s[96];
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s has shape %s whose size overflows", call, name,
                    sbn_nn_shape_str(s, sizeof s, t->ndim, t->shape));
  }
  if (!t->data && sbn_tensor_numel(t) > 0)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s has no data", call, name);
  return SBN_STATUS_OK;
}

/* A tensor of at most 2 dims lies the same in both layouts and
 * check_tensor takes either, but the core layer behind a BatchNorm requires
 * x, y and dy of one layout (and the modules' outputs are channels-first):
 * pass it on as channels-first. */
static sbn_tensor as_module_input(const sbn_tensor *t) {
  sbn_tensor c = *t;
  if (c.ndim <= 2) c.layout = SBN_LAYOUT_CHANNELS_FIRST;
  return c;
}

sbn_status sbn_nn_forward(sbn_module *m, sbn_tensor *y, const sbn_tensor *x) {
  sbn_status st = check_tensor(x, "sbn_module_forward", "x");
  if (st != SBN_STATUS_OK) return st;
  sbn_tensor xin = as_module_input(x), yout;
  m->have_fwd = 0;
  st = m->ops->forward(m, &yout, &xin);
  if (st != SBN_STATUS_OK) return st;
  m->x = xin;
  m->y = yout;
  m->have_fwd = 1;
  *y = yout;
  return SBN_STATUS_OK;
}

static sbn_status check_backward(sbn_module *m, const sbn_tensor *dy) {
  static const char call[] = "sbn_module_backward";
  if (!m->have_fwd)
    return sbn_fail(SBN_STATUS_BAD_STATE, "%s: %s has no successful forward to differentiate", call,
                    sbn_module_kind_name(m->kind));
  sbn_status st = check_tensor(dy, call, "dy");
  if (st != SBN_STATUS_OK) return st;
  int same = dy->ndim == m->y.ndim;
  for (int i = 0; same && i < dy->ndim; i++) same = dy->shape[i] == m->y.shape[i];
  if (!same) {
    char a[96], b[96];
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s: dy has shape %s, the forward's output %s", call,
                    sbn_module_kind_name(m->kind), sbn_nn_shape_str(a, sizeof a, dy->ndim, dy->shape),
                    sbn_nn_shape_str(b, sizeof b, m->y.ndim, m->y.shape));
  }
  return SBN_STATUS_OK;
}

sbn_status sbn_nn_backward(sbn_module *m, sbn_tensor *dx, const sbn_tensor *dy) {
  sbn_status st = check_backward(m, dy);
  if (st != SBN_STATUS_OK) return st;
  const sbn_tensor dyin = as_module_input(dy);
  return m->ops->backward(m, dx, &dyin);
}

/* ---- inputs that lie in the module's own buffers ----
 * A forward writes the output buffers of the module and of its descendants,
 * a backward their input-gradient buffers. A caller may pass a view of such
 * a buffer back in (a block applied to its own output, y = f(f(x)); a
 * gradient fed back): writing it would overwrite the values being read, and
 * the input must also stay intact until the backward. Such a module writes
 * its second buffer instead and keeps the first, which holds the input.
 * The normal path only compares addresses; nothing is copied. */

static int tensor_in_buf(const sbn_tensor *t, const sbn_nn_buf *b) {
  if (!t || !t->data || !b->p) return 0;
  const uintptr_t tp = (uintptr_t)t->data, bp = (uintptr_t)b->p;
  const uintptr_t tn = (uintptr_t)sbn_tensor_numel(t) * sizeof(float), bn = (uintptr_t)b->cap * sizeof(float);
  return tn > 0 && tp < bp + bn && bp < tp + tn;
}

static void swap_bufs(sbn_nn_buf *a, sbn_nn_buf *b) {
  sbn_nn_buf t = *a;
  *a = *b, *b = t;
}

/* Forward has one input: it lies in at most one of the two buffers, so a
 * swap always leaves a free one. */
static void unalias_outputs(sbn_module *m, const sbn_tensor *x) {
  if (tensor_in_buf(x, &m->out)) swap_bufs(&m->out, &m->out_spare);
  for (int i = 0; i < m->nchild; i++) unalias_outputs(m->child[i], x);
}

/* Backward reads dy and the saved input x; when one lies in dx and the
 * other in the spare, no buffer is free and the call is refused before
 * anything is written. */
static sbn_status unalias_grads(sbn_module *m, const sbn_tensor *dy, const sbn_tensor *x) {
  if (tensor_in_buf(dy, &m->dx) || tensor_in_buf(x, &m->dx)) {
    if (tensor_in_buf(dy, &m->dx_spare) || tensor_in_buf(x, &m->dx_spare))
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "sbn_module_backward: dy and the forward's input x both lie in input-gradient buffers "
                      "of a %s that this backward writes (views returned by its earlier backward calls); "
                      "copy one of them first",
                      sbn_module_kind_name(m->kind));
    swap_bufs(&m->dx, &m->dx_spare);
  }
  for (int i = 0; i < m->nchild; i++) {
    sbn_status st = unalias_grads(m->child[i], dy, x);
    if (st != SBN_STATUS_OK) return st;
  }
  return SBN_STATUS_OK;
}

sbn_status sbn_nn_backward_prepare(sbn_module *m, const sbn_tensor *dy) {
  sbn_status st = check_backward(m, dy);
  return st == SBN_STATUS_OK ? unalias_grads(m, dy, &m->x) : st;
}

sbn_status sbn_module_forward(sbn_module *m, sbn_tensor *y, const sbn_tensor *x) {
  sbn_clear_error();
  if (!m || !y) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_module_forward: %s is NULL", m ? "y" : "module");
  sbn_status st = check_tensor(x, "sbn_module_forward", "x");
  if (st != SBN_STATUS_OK) return st;
  unalias_outputs(m, x);
  return sbn_nn_forward(m, y, x);
}

int sbn_nn_has_forward(const sbn_module *m) { return m && m->have_fwd; }

/* ---- saving gradients around a backward ----
 *
 * Backward accumulates into the gradients module by module, and a later
 * module can still fail (a SyncBatchNorm's collective finds the ranks
 * disagree, a peer failed, out of memory) after earlier ones added theirs.
 * A failed call must change nothing, so the gradients are saved first and
 * put back on failure. Gradients are usually zero before a backward (after
 * zero_grad): those are only read and marked, and put back with a memset;
 * only gradients being accumulated over several backwards are copied. */
enum { GRAD_NOT_SAVED = 0, GRAD_WAS_ZERO = 1, GRAD_COPIED = 2 };

int sbn_nn_all_zero_bits(const float *g, int64_t n) {
  const uint32_t *u = (const uint32_t *)(const void *)g; /* -0.0f is not zero here */
  for (int64_t i = 0; i < n; i++)
    if (u[i]) return 0;
  return 1;
}

/* Mark every gradient backward may change; count the floats to copy. */
static void grads_mark(sbn_module *m, int64_t *to_copy) {
  for (int i = 0; i < m->nlocal; i++) {
    sbn_nn_local *l = &m->local[i];
    l->grad_saved = GRAD_NOT_SAVED;
    if (!l->grad || !l->requires_grad || l->numel <= 0) continue;
    l->grad_saved = sbn_nn_all_zero_bits(l->grad, l->numel) ? GRAD_WAS_ZERO : GRAD_COPIED;
    if (l->grad_saved == GRAD_COPIED) *to_copy += l->numel;
  }
  for (int i = 0; i < m->nchild; i++) grads_mark(m->child[i], to_copy);
}

static void grads_unmark(sbn_module *m) {
  for (int i = 0; i < m->nlocal; i++) m->local[i].grad_saved = GRAD_NOT_SAVED;
  for (int i = 0; i < m->nchild; i++) grads_unmark(m->child[i]);
}

/* Copy the marked gradients to (restore = 0) or back from (restore = 1)
 * `store`, in the same tree order both ways. */
static void grads_move(sbn_module *m, float *store, int64_t *at, int restore) {
  for (int i = 0; i < m->nlocal; i++) {
    sbn_nn_local *l = &m->local[i];
    size_t bytes = sizeof(float) * (size_t)(l->numel > 0 ? l->numel : 0);
    if (l->grad_saved == GRAD_WAS_ZERO && restore) memset(l->grad, 0, bytes);
    if (l->grad_saved != GRAD_COPIED) continue;
    if (restore) memcpy(l->grad, store + *at, bytes);
    else memcpy(store + *at, l->grad, bytes);
    *at += l->numel;
  }
  for (int i = 0; i < m->nchild; i++) grads_move(m->child[i], store, at, restore);
}

sbn_status sbn_nn_grads_save(sbn_module *root, int64_t *copied) {
  int64_t n = 0, at = 0;
  grads_mark(root, &n);
  if (copied) *copied = n;
  float *store = n > 0 ? sbn_nn_buf_reserve(&root->saved, n, "backward (saving the gradients)") : NULL;
  if (n > 0 && !store) {
    grads_unmark(root); /* a restore after this failure must change nothing */
    return SBN_STATUS_OUT_OF_MEMORY;
  }
  if (n > 0) grads_move(root, store, &at, 0);
  return SBN_STATUS_OK;
}

void sbn_nn_grads_restore(sbn_module *root) {
  int64_t at = 0;
  grads_move(root, root->saved.p, &at, 1);
}

sbn_status sbn_module_backward(sbn_module *m, sbn_tensor *dx, const sbn_tensor *dy) {
  sbn_clear_error();
  if (!m || !dx)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_module_backward: %s is NULL", m ? "dx" : "module");
  sbn_status st = sbn_nn_backward_prepare(m, dy);
  if (st == SBN_STATUS_OK) st = sbn_nn_grads_save(m, NULL);
  if (st != SBN_STATUS_OK) return st;
  const sbn_tensor dyin = as_module_input(dy);
  st = m->ops->backward(m, dx, &dyin); /* checked by the prepare step */
  if (st != SBN_STATUS_OK) sbn_nn_grads_restore(m);
  return st;
}

static void zero_rec(sbn_module *m) {
  for (int i = 0; i < m->nlocal; i++)
    if (m->local[i].grad) memset(m->local[i].grad, 0, sizeof(float) * (size_t)m->local[i].numel);
  for (int i = 0; i < m->nchild; i++) zero_rec(m->child[i]);
}

sbn_status sbn_module_zero_grad(sbn_module *m) {
  sbn_clear_error();
  if (!m) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_module_zero_grad: module is NULL");
  zero_rec(m);
  return SBN_STATUS_OK;
}

sbn_status sbn_module_set_wrapped(sbn_module *m, int wrapped) {
  sbn_clear_error();
  if (!m) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_module_set_wrapped: module is NULL");
  m->wrapped = wrapped != 0;
  return SBN_STATUS_OK;
}

int sbn_nn_has_parent(const sbn_module *m) { return m && m->parent != NULL; }

int sbn_nn_wrapped_below(const sbn_module *m) {
  if (m->wrapped) return 1;
  for (int i = 0; i < m->nchild; i++)
    if (sbn_nn_wrapped_below(m->child[i])) return 1;
  return 0;
}

int sbn_module_is_wrapped(const sbn_module *m) {
  if (!m) return -1;
  for (; m; m = m->parent)
    if (m->wrapped) return 1;
  return 0;
}

/* ---- listing ---- */

typedef struct lister {
  sbn_nn_entry *e;
  int n, cap;
  unsigned what;
} lister;

static sbn_status list_rec(lister *L, sbn_module *m, char *prefix, size_t plen) {
  for (int i = 0; i < m->nlocal; i++) {
    sbn_nn_local *l = &m->local[i];
    unsigned bit = l->kind == SBN_NN_ENTRY_KIND_PARAMETER ? SBN_NN_PARAMETERS : SBN_NN_BUFFERS;
    if (!(L->what & bit)) continue;
    if (L->n == L->cap) {
      int cap = L->cap ? 2 * L->cap : 32;
      sbn_nn_entry *e = realloc(L->e, sizeof *e * (size_t)cap);
      if (!e) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_module_entries: out of memory");
      L->e = e, L->cap = cap;
    }
    sbn_nn_entry *e = &L->e[L->n];
    memset(e, 0, sizeof *e);
    if (plen + strlen(l->name) + 1 > SBN_NN_NAME_MAX)
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "sbn_module_entries: the state name \"%s%s\" of a %s has %zu characters, over the limit of %d "
                      "(SBN_NN_NAME_MAX - 1)",
                      prefix, l->name, sbn_module_kind_name(m->kind), plen + strlen(l->name), SBN_NN_NAME_MAX - 1);
    memcpy(e->name, prefix, plen);
    memcpy(e->name + plen, l->name, strlen(l->name) + 1);
    e->kind = l->kind;
    e->dtype = l->dtype;
    e->ndim = l->ndim;
    memcpy(e->shape, l->shape, sizeof e->shape);
    e->numel = l->numel;
    e->data = l->data;
    e->grad = l->grad;
    e->requires_grad = l->kind == SBN_NN_ENTRY_KIND_PARAMETER ? l->requires_grad : 0;
    e->owner = m;
    L->n++;
  }
  for (int i = 0; i < m->nchild; i++) {
    size_t cl = strlen(m->child_name[i]);
    if (plen + cl + 2 > SBN_NN_NAME_MAX)
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "sbn_module_entries: the path of child \"%.48s%s\" under %s%s%s has %zu characters, over the "
                      "limit of %d for state names (SBN_NN_NAME_MAX - 1)",
                      m->child_name[i], cl > 48 ? "..." : "", plen ? "module \"" : "the root",
                      plen ? prefix : "", plen ? "\"" : "", plen + cl, SBN_NN_NAME_MAX - 1);
    memcpy(prefix + plen, m->child_name[i], cl);
    prefix[plen + cl] = '.';
    prefix[plen + cl + 1] = 0;
    sbn_status st = list_rec(L, m->child[i], prefix, plen + cl + 1);
    prefix[plen] = 0;
    if (st != SBN_STATUS_OK) return st;
  }
  return SBN_STATUS_OK;
}

sbn_status sbn_module_entries(sbn_nn_entry **out, int *count, sbn_module *m, unsigned what) {
  sbn_clear_error();
  if (!out || !count || !m) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_module_entries: NULL argument");
  *out = NULL, *count = 0;
  lister L = {NULL, 0, 0, what};
  char prefix[SBN_NN_NAME_MAX] = "";
  sbn_status st = list_rec(&L, m, prefix, 0);
  if (st != SBN_STATUS_OK) {
    free(L.e);
    return st;
  }
  if (!L.e) L.e = malloc(sizeof *L.e); /* never NULL on success */
  if (!L.e) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_module_entries: out of memory");
  *out = L.e, *count = L.n;
  return SBN_STATUS_OK;
}

int64_t sbn_module_num_parameters(sbn_module *m) {
  sbn_nn_entry *e;
  int n;
  if (sbn_module_entries(&e, &n, m, SBN_NN_PARAMETERS) != SBN_STATUS_OK) return -1;
  int64_t t = 0;
  for (int i = 0; i < n; i++) t += e[i].numel;
  free(e);
  return t;
}

sbn_status sbn_module_set_requires_grad(sbn_module *m, const char *name, int requires_grad) {
  sbn_clear_error();
  if (!m) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_module_set_requires_grad: module is NULL");
  sbn_nn_entry *e;
  int n;
  sbn_status st = sbn_module_entries(&e, &n, m, SBN_NN_PARAMETERS);
  if (st != SBN_STATUS_OK) return st;
  int found = 0;
  for (int i = 0; i < n; i++) {
    if (name && strcmp(e[i].name, name)) continue;
    const char *dot = strrchr(e[i].name, '.');
    sbn_nn_local *l = sbn_nn_find_local(e[i].owner, dot ? dot + 1 : e[i].name);
    if (l) l->requires_grad = requires_grad != 0, found++;
  }
  free(e);
  if (name && !found)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_module_set_requires_grad: no parameter \"%s\"", name);
  return SBN_STATUS_OK;
}

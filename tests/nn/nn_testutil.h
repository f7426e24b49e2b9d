/* Test support for the module layer: the reference network shared with the
 * PyTorch peer, randomized state, bit-exact snapshots of a tree's state. */
#ifndef SBN_NN_TESTUTIL_H
#define SBN_NN_TESTUTIL_H

#include <stdint.h>

#include "syncbn_nn.h"
#include "testutil.h"

/* Sequential: 0 Conv2d(3,8,3,p1,bias) 1 BatchNorm2d(8) 2 ReLU 3 MaxPool2d(2)
 * 4 BasicBlock(8,8) 5 BasicBlock(8,16,stride 2) 6 AdaptiveAvgPool2d 7 Flatten
 * 8 Linear(16,12) 9 BatchNorm1d(12) 10 ReLU 11 Linear(12,5). Input (N,3,8,8).
 * tests/nn/torch_peer.py builds the same network in PyTorch. */
#define NET_CLASSES 5
int nn_build_net(sbn_module **out, uint64_t seed);

/* Random parameters (N(0, 0.3)-ish), running means, positive running
 * variances, num_batches_tracked in [0, 20]. */
void nn_randomize(sbn_module *m, rng *r);

/* A copy of every entry's bytes (state and, optionally, gradients). */
typedef struct nn_snapshot {
  int n;
  sbn_nn_entry *e;
  unsigned char **bytes, **grads;
} nn_snapshot;
int nn_snapshot_take(nn_snapshot *s, sbn_module *m);
/* Number of entries of m whose names, shapes or bytes differ from s (grads
 * too when with_grads); prints the first differing name into why. */
int nn_snapshot_diff(const nn_snapshot *s, sbn_module *m, int with_grads, char *why, size_t cap);
void nn_snapshot_restore(const nn_snapshot *s, sbn_module *m);
void nn_snapshot_free(nn_snapshot *s);

size_t nn_entry_bytes(const sbn_nn_entry *e);
int nn_read_file(const char *path, unsigned char **buf, size_t *len);
int nn_write_file(const char *path, const void *buf, size_t len);

#define NN_CHECK(cond, ...)                                                      \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: FAILED %s: ", __FILE__, __LINE__, #cond);          \
      fprintf(stderr, __VA_ARGS__);                                              \
      fprintf(stderr, " (last error: %s)\n", sbn_last_error());                  \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

#endif

/* syncbn-bench-consumer: what streaming a layer's output costs the pass
 * that reads it next. syncbn-bench evicts every input on purpose, so it
 * credits non-temporal stores with the read-for-ownership they save and
 * charges nobody for the consumer, which then reads y from memory instead
 * of the L3. Here every forward is followed by a consumer that reads y and
 * writes it in place on the same threads (a second layer's eval-mode
 * normalize, y = a*y + b, as an in-place ReLU would), and the pair is
 * timed; every backward likewise by the same consumer of dx (as the layer
 * below reads the gradient next). Run it under both settings of the
 * streaming threshold, e.g.
 *
 *   SYNCBN_STREAM_MIB=4 build/bench/syncbn-bench-consumer 8 2048 7 cl
 *   SYNCBN_STREAM_MIB=1 build/bench/syncbn-bench-consumer 8 2048 7 cl
 *
 * Inputs rotate through 512 MiB (every x, dy and y cold, as in
 * syncbn-bench); medians over the calls.
 *
 * Usage: syncbn-bench-consumer N C H cf|cl [calls] (float32, H x H maps) */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "syncbn.h"
#include "bench_machine.h"

int main(int argc, char **argv) {
  if (argc < 5 || (strcmp(argv[4], "cf") && strcmp(argv[4], "cl"))) {
    fprintf(stderr, "usage: %s N C H cf|cl [calls]\n", argv[0]);
    return 2;
  }
  const int64_t n = atoll(argv[1]), c = atoll(argv[2]), h = atoll(argv[3]);
  const int calls = argc > 5 ? atoi(argv[5]) : 400;
  const sbn_layout lay = strcmp(argv[4], "cl") ? SBN_LAYOUT_CHANNELS_FIRST : SBN_LAYOUT_CHANNELS_LAST;
  if (n < 1 || c < 1 || h < 1 || calls < 1) return fprintf(stderr, "bad sizes\n"), 2;
  /* per call: x, y (forward), x, dy, dx (backward): 4 tensors a set */
  const size_t tb = ((size_t)(n * c * h * h) * sizeof(float) + 63) / 64 * 64, set = 4 * tb;
  const size_t arena_bytes = (size_t)512 << 20;
  int sets = (int)(arena_bytes / set);
  if (sets < 4) return fprintf(stderr, "tensor too large for the 512 MiB arena\n"), 2;
  if (sets > 256) sets = 256;
  char *arena = aligned_alloc(64, (size_t)sets * set);
  double *fwd = malloc(sizeof(double) * (size_t)calls), *pair = malloc(sizeof(double) * (size_t)calls),
         *bwd = malloc(sizeof(double) * (size_t)calls), *bpair = malloc(sizeof(double) * (size_t)calls);
  if (!arena || !fwd || !pair || !bwd || !bpair) return fprintf(stderr, "out of memory\n"), 1;
  for (size_t i = 0; i < (size_t)sets * set / sizeof(float); i++)
    ((float *)arena)[i] = (float)((i * 37) % 101) / 25.0f - 2.0f;
  sbn_bn_options o = sbn_bn_options_default(c);
  sbn_bn *bn, *consumer;
  if (sbn_bn_create(&bn, &o, NULL) || sbn_bn_create(&consumer, &o, NULL) || sbn_bn_set_training(consumer, 0))
    return fprintf(stderr, "%s\n", sbn_last_error()), 1;
  const int64_t shape[4] = {n, c, h, h};
  for (int r = -20; r < calls; r++) {
    char *fs = arena + (size_t)((r + 40) % sets) * set, *bs = arena + (size_t)((r + 40 + sets / 2) % sets) * set;
    sbn_tensor x = sbn_tensor_cpu(fs, 4, shape, SBN_DTYPE_FLOAT32, lay),
               y = sbn_tensor_cpu(fs + tb, 4, shape, SBN_DTYPE_FLOAT32, lay),
               bx = sbn_tensor_cpu(bs, 4, shape, SBN_DTYPE_FLOAT32, lay),
               dy = sbn_tensor_cpu(bs + 2 * tb, 4, shape, SBN_DTYPE_FLOAT32, lay),
               dx = sbn_tensor_cpu(bs + 3 * tb, 4, shape, SBN_DTYPE_FLOAT32, lay);
    const double t0 = now();
    sbn_status st = sbn_bn_forward(bn, &y, &x);
    const double t1 = now();
    if (st == SBN_STATUS_OK) st = sbn_bn_forward(consumer, &y, &y); /* reads y, writes it in place */
    const double t2 = now();
    if (st == SBN_STATUS_OK) st = sbn_bn_backward(bn, &dx, &dy, &bx);
    const double t3 = now();
    if (st == SBN_STATUS_OK) st = sbn_bn_forward(consumer, &dx, &dx); /* reads dx, as the layer below would */
    const double t4 = now();
    if (st != SBN_STATUS_OK) return fprintf(stderr, "%s\n", sbn_last_error()), 1;
    if (r >= 0) fwd[r] = t1 - t0, pair[r] = t2 - t0, bwd[r] = t3 - t2, bpair[r] = t4 - t2;
  }
  const char *env = getenv("SYNCBN_STREAM_MIB");
  printf("%lldx%lldx%lldx%lld %s float32, SYNCBN_STREAM_MIB=%s: forward %.4f ms, forward + consumer %.4f ms, "
         "backward %.4f ms, backward + consumer %.4f ms (medians of %d)\n",
         (long long)n, (long long)c, (long long)h, (long long)h, argv[4], env ? env : "(default)",
         1e3 * median(fwd, calls), 1e3 * median(pair, calls), 1e3 * median(bwd, calls),
         1e3 * median(bpair, calls), calls);
  sbn_bn_destroy(consumer);
  sbn_bn_destroy(bn);
  free(arena), free(fwd), free(pair), free(bwd), free(bpair);
  return 0;
}

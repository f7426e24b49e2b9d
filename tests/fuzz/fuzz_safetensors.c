/* libFuzzer target: the checkpoint loader (safetensors) on arbitrary bytes.
 * Loads into a small model (BatchNorm2d(2) then Linear(2, 3)) strictly and
 * non-strictly; a failed load must leave the model's bytes unchanged and
 * leave a message, a successful one must leave valid values
 * (num_batches_tracked in range). Any crash or sanitizer report is a bug. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "syncbn_nn.h"

static sbn_module *model;
static unsigned char before[4096], after[4096];

static size_t state_bytes(unsigned char *out) {
  sbn_nn_entry *e;
  int n;
  size_t k = 0;
  if (sbn_module_entries(&e, &n, model, SBN_NN_STATE) != SBN_STATUS_OK) abort();
  for (int i = 0; i < n; i++) {
    size_t b = (size_t)e[i].numel * (e[i].dtype == SBN_DTYPE_INT64 ? 8 : 4);
    memcpy(out + k, e[i].data, b), k += b;
  }
  free(e);
  return k;
}

static void build(void) {
  sbn_module *bn, *lin;
  sbn_bn_options o = sbn_bn_options_default(2);
  if (sbn_nn_sequential_create(&model) || sbn_nn_batchnorm_create(&bn, 1, &o) ||
      sbn_nn_sequential_append(model, NULL, bn) || sbn_nn_linear_create(&lin, 2, 3, 1, 1) ||
      sbn_nn_sequential_append(model, NULL, lin))
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!model) build();
  for (unsigned flags = 0; flags <= (SBN_NN_LOAD_STRICT | SBN_NN_LOAD_EXACT_DTYPES); flags++) {
    size_t nb = state_bytes(before);
    sbn_nn_load_report rep;
    sbn_status st = sbn_nn_load_memory(model, data, size, flags, &rep);
    const int has_message = sbn_last_error()[0] != 0; /* before the next call clears it */
    state_bytes(after);
    if (st != SBN_STATUS_OK) {
      if (memcmp(before, after, nb) != 0) abort(); /* a failed load changed the model */
      if (!has_message) abort();
    } else {
      sbn_nn_load_report_free(&rep);
      sbn_nn_entry *e;
      int n;
      if (sbn_module_entries(&e, &n, model, SBN_NN_STATE) != SBN_STATUS_OK) abort();
      for (int i = 0; i < n; i++)
        if (e[i].dtype == SBN_DTYPE_INT64 &&
            (*(int64_t *)e[i].data < 0 || *(int64_t *)e[i].data > SBN_NUM_BATCHES_TRACKED_MAX))
          abort(); /* an out-of-range num_batches_tracked was accepted */
      free(e);
    }
  }
  return 0;
}

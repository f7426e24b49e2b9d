/* A program linked without libsyncbn_cuda (every in-tree program but the
 * CUDA tests; any program when the library was built with `make NVCC=`):
 * every CUDA request answers SBN_STATUS_NOT_BUILT with a message, nothing
 * crashes, the CPU path is untouched, and a CPU layer refuses a stream. */
#include <stdio.h>
#include <string.h>

#include "syncbn.h"

static int bad;

static void expect(const char *what, sbn_status got, sbn_status want) {
  int ok = got == want && (want == SBN_STATUS_OK || strlen(sbn_last_error()) > 0);
  printf("  %-48s -> %s (\"%s\") %s\n", what, sbn_status_name(got), sbn_last_error(), ok ? "ok" : "FAIL");
  bad |= !ok;
}

int main(void) {
  int count = 7;
  expect("sbn_cuda_device_count", sbn_cuda_device_count(&count), SBN_STATUS_NOT_BUILT);
  if (count != 0) printf("  FAIL: count %d, expected 0\n", count), bad = 1;

  sbn_bn_options o = sbn_bn_options_default(3);
  o.device.type = SBN_DEVICE_CUDA;
  sbn_bn *bn = (sbn_bn *)&o;
  expect("sbn_bn_create on cuda:0", sbn_bn_create(&bn, &o, NULL), SBN_STATUS_NOT_BUILT);
  if (bn) printf("  FAIL: layer not NULL after a failed create\n"), bad = 1;
  o.device.type = (sbn_device_type)5;
  expect("sbn_bn_create on device type 5", sbn_bn_create(&bn, &o, NULL), SBN_STATUS_UNSUPPORTED);

  o = sbn_bn_options_default(3);
  if (sbn_bn_create(&bn, &o, NULL) != SBN_STATUS_OK) return printf("FAIL: CPU layer: %s\n", sbn_last_error()), 1;
  int stream_dummy;
  expect("sbn_bn_set_stream on a CPU layer", sbn_bn_set_stream(bn, &stream_dummy), SBN_STATUS_INVALID_ARGUMENT);
  expect("sbn_bn_set_stream(NULL) on a CPU layer", sbn_bn_set_stream(bn, NULL), SBN_STATUS_INVALID_ARGUMENT);
  expect("sbn_bn_set_stream on a NULL layer", sbn_bn_set_stream(NULL, NULL), SBN_STATUS_INVALID_ARGUMENT);
  /* a CUDA tensor given to a CPU layer */
  float x[6] = {1, 2, 3, 4, 5, 7}, y[6];
  int64_t shape[2] = {2, 3};
  sbn_tensor tx = sbn_tensor_cpu(x, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor ty = sbn_tensor_cpu(y, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  tx.device.type = ty.device.type = SBN_DEVICE_CUDA;
  expect("forward of a cuda tensor on a CPU layer", sbn_bn_forward(bn, &ty, &tx), SBN_STATUS_UNSUPPORTED);
  tx.device.type = ty.device.type = SBN_DEVICE_CPU;
  expect("then a CPU forward", sbn_bn_forward(bn, &ty, &tx), SBN_STATUS_OK);
  int64_t nbt = -1;
  sbn_bn_get_num_batches_tracked(bn, &nbt);
  if (nbt != 1 || !(y[0] < 0 && y[3] > 0)) printf("  FAIL: nbt %lld, y[0] %g\n", (long long)nbt, y[0]), bad = 1;
  sbn_bn_destroy(bn);
  printf(bad ? "FAILED\n" : "CUDA requests without libsyncbn_cuda: NOT_BUILT, CPU path intact\n");
  return bad;
}

/* The CUDA device table linked statically, checked on any machine (with or
 * without a GPU): the layer finds the table through the device type, the
 * device count is the runtime's (0 without a GPU or driver), and a device
 * that does not exist is a clear error, not a crash. With a GPU it also
 * checks what a new layer holds (device pointers, initial values). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "../../src/core/device.h"
#include "testutil.h"

static int bad;

static void expect(const char *what, sbn_status got, sbn_status want, const char *needle) {
  int ok = got == want && (want == SBN_STATUS_OK || strlen(sbn_last_error()) > 0) &&
           (!needle || strstr(sbn_last_error(), needle));
  printf("  %-44s -> %s (\"%s\") %s\n", what, sbn_status_name(got), sbn_last_error(), ok ? "ok" : "FAIL");
  bad |= !ok;
}

int main(void) {
  sbn_status st;
  const sbn_dev_ops *cpu = sbn_device_ops(SBN_DEVICE_CPU, &st, "test");
  const sbn_dev_ops *cuda = sbn_device_ops(SBN_DEVICE_CUDA, &st, "test");
  printf("tables: cpu %s, cuda %s\n", cpu ? cpu->name : "(none)", cuda ? cuda->name : "(none)");
  bad |= !(cpu == &sbn_cpu_device_ops && cuda == &SBN_CUDA_DEVICE_TABLE && strcmp(cuda->name, "cuda") == 0 &&
           cuda->payload_on_device && !cpu->payload_on_device && cuda->set_stream && !cpu->set_stream);

  int runtime = 0, count = -1;
  if (cudaGetDeviceCount(&runtime) != cudaSuccess) runtime = 0;
  expect("sbn_cuda_device_count", sbn_cuda_device_count(&count), SBN_STATUS_OK, NULL);
  printf("  devices: %d (the runtime says %d)\n", count, runtime);
  bad |= count != runtime;
  expect("sbn_cuda_device_count(NULL)", sbn_cuda_device_count(NULL), SBN_STATUS_INVALID_ARGUMENT, NULL);

  sbn_bn_options o = sbn_bn_options_default(4);
  o.device.type = SBN_DEVICE_CUDA;
  sbn_bn *bn = NULL;
  o.device.index = count;
  expect("create on cuda:<count> (one past the last)", sbn_bn_create(&bn, &o, NULL), SBN_STATUS_INVALID_ARGUMENT,
         "is not a device");
  o.device.index = -1;
  expect("create on cuda:-1", sbn_bn_create(&bn, &o, NULL), SBN_STATUS_INVALID_ARGUMENT, "is not a device");
  bad |= bn != NULL;
  if (count == 0) {
    o.device.index = 0;
    expect("create on cuda:0 without a GPU", sbn_bn_create(&bn, &o, NULL), SBN_STATUS_INVALID_ARGUMENT,
           "0 CUDA device");
    printf(bad ? "FAILED\n" : "no GPU: the CUDA table answers cleanly (layer checks need a GPU)\n");
    return bad;
  }

  /* a GPU: what a new layer holds */
  o.device.index = 0;
  CHECK_OK(sbn_bn_create(&bn, &o, NULL));
  float host[4];
  static const float want[6] = {1, 0, 0, 0, 0, 1}; /* weight, bias, grads, running mean, var */
  for (int id = 0; id < 6; id++) {
    sbn_tensor v;
    CHECK_OK(sbn_bn_tensor(&v, bn, (sbn_bn_tensor_id)id));
    struct cudaPointerAttributes a;
    int dev_ptr = cudaPointerGetAttributes(&a, v.data) == cudaSuccess && a.type == cudaMemoryTypeDevice && a.device == 0;
    cudaMemcpy(host, v.data, sizeof host, cudaMemcpyDeviceToHost);
    int ok = dev_ptr && v.device.type == SBN_DEVICE_CUDA && host[0] == want[id] && host[3] == want[id];
    printf("  view %d: device pointer %d, values %g..%g %s\n", id, dev_ptr, host[0], host[3], ok ? "ok" : "FAIL");
    bad |= !ok;
  }
  int64_t nbt = -1;
  CHECK_OK(sbn_bn_set_num_batches_tracked(bn, 41));
  CHECK_OK(sbn_bn_get_num_batches_tracked(bn, &nbt));
  printf("  num_batches_tracked set 41, read %lld %s\n", (long long)nbt, nbt == 41 ? "ok" : "FAIL");
  bad |= nbt != 41;
  cudaStream_t s;
  cudaStreamCreate(&s);
  expect("set_stream(created stream)", sbn_bn_set_stream(bn, s), SBN_STATUS_OK, NULL);
  expect("set_stream(NULL)", sbn_bn_set_stream(bn, NULL), SBN_STATUS_OK, NULL);
  sbn_bn_destroy(bn);
  cudaStreamDestroy(s);
  printf(bad ? "FAILED\n" : "CUDA table checks passed\n");
  return bad;
}

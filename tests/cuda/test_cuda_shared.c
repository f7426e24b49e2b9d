/* Through the shared libraries (linked with -lsyncbn only):
 *   cpu:  a program that only uses CPU layers never loads libsyncbn_cuda or
 *         libcudart;
 *   cuda: the first CUDA request opens libsyncbn_cuda.so.MAJOR from
 *         libsyncbn.so's directory; its answers (device count, a clear
 *         error for a device that does not exist, with the message recorded
 *         in libsyncbn's per-thread last error) come back. */
#include <stdio.h>
#include <string.h>

#include "syncbn.h"

static int loaded(const char *name) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[1024];
  int found = 0;
  while (f && fgets(line, sizeof line, f))
    if (strstr(line, name)) found = 1;
  if (f) fclose(f);
  return found;
}

int main(int argc, char **argv) {
  const int cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
  int bad = 0;
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 9}, y[8];
  int64_t shape[2] = {4, 2};
  sbn_tensor tx = sbn_tensor_cpu(x, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor ty = sbn_tensor_cpu(y, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_bn_options o = sbn_bn_options_default(2);
  sbn_bn *bn;
  if (sbn_bn_create(&bn, &o, NULL) != SBN_STATUS_OK || sbn_bn_forward(bn, &ty, &tx) != SBN_STATUS_OK)
    return printf("FAIL: CPU layer: %s\n", sbn_last_error()), 1;
  sbn_bn_destroy(bn);
  if (!cuda) {
    int a = loaded("libcudart"), b = loaded("libsyncbn_cuda");
    printf("CPU layer through libsyncbn.so: libcudart loaded %d, libsyncbn_cuda loaded %d %s\n", a, b,
           a || b ? "FAIL" : "ok");
    return a || b;
  }
  int count = -1;
  sbn_status st = sbn_cuda_device_count(&count);
  printf("sbn_cuda_device_count -> %s, %d device(s) (\"%s\")\n", sbn_status_name(st), count, sbn_last_error());
  bad |= st != SBN_STATUS_OK || count < 0;
  int a = loaded("libsyncbn_cuda.so"), b = loaded("libcudart");
  printf("after it: libsyncbn_cuda loaded %d, libcudart loaded %d %s\n", a, b, a && b ? "ok" : "FAIL");
  bad |= !(a && b);
  o.device.type = SBN_DEVICE_CUDA;
  o.device.index = count; /* one past the last */
  st = sbn_bn_create(&bn, &o, NULL);
  int ok = st == SBN_STATUS_INVALID_ARGUMENT && strstr(sbn_last_error(), "is not a device");
  printf("create on cuda:%d -> %s (\"%s\") %s\n", count, sbn_status_name(st), sbn_last_error(), ok ? "ok" : "FAIL");
  bad |= !ok;
  printf(bad ? "FAILED\n" : "the CUDA library is found and answers through libsyncbn.so\n");
  return bad;
}

/* Finding a device's table (device.h).
 *
 * The CPU table is part of libsyncbn. The CUDA table lives in its own
 * library, libsyncbn_cuda (so that a program that never uses a GPU never
 * loads libcudart), and is found the first time a CUDA device is asked for:
 *  - linked statically: libsyncbn_cuda.a defines SBN_CUDA_DEVICE_TABLE, which
 *    this file references weakly (link it with -Wl,-u,sbn_internal_cuda_device_v3
 *    so that the archive member is pulled in: README, "GPUs");
 *  - shared: libsyncbn.so opens libsyncbn_cuda.so.MAJOR, first from its own
 *    directory (found with dladdr), then through the loader's search path,
 *    and looks the table up by name. */
#define _GNU_SOURCE
#include "device.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

extern const sbn_dev_ops SBN_CUDA_DEVICE_TABLE __attribute__((weak, visibility("hidden")));

#define SBN_STR2_(x) #x
#define SBN_STR_(x) SBN_STR2_(x)
#define CUDA_SONAME "libsyncbn_cuda.so." SBN_STR_(SYNCBN_VERSION_MAJOR)

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static const sbn_dev_ops *cuda_ops;
static char cuda_why[512];

/* The directory of the object holding this code, when it is libsyncbn.so
 * (a program linked with libsyncbn.a does not open the shared CUDA library:
 * that would load a second libsyncbn beside the program's own). */
static int shared_dir(char *dir, size_t cap) {
  Dl_info info;
  if (!dladdr((void *)&sbn_device_ops, &info) || !info.dli_fname) return 0;
  const char *base = strrchr(info.dli_fname, '/');
  base = base ? base + 1 : info.dli_fname;
  if (strncmp(base, "libsyncbn.so", 12) != 0) return 0;
  snprintf(dir, cap, "%.*s", (int)(base - info.dli_fname), info.dli_fname);
  return 1;
}

static void find_cuda(void) {
  if (&SBN_CUDA_DEVICE_TABLE) {
    cuda_ops = &SBN_CUDA_DEVICE_TABLE;
    return;
  }
  char dir[4096];
  if (!shared_dir(dir, sizeof dir)) {
#ifdef SBN_WITH_CUDA
    snprintf(cuda_why, sizeof cuda_why,
             "CUDA support is not linked into this program (link libsyncbn_cuda.a with "
             "-Wl,-u," SBN_CUDA_DEVICE_TABLE_NAME " and -lcudart, or use the shared libraries)");
#else
    snprintf(cuda_why, sizeof cuda_why, "CUDA support is not built into this library");
#endif
    return;
  }
  char path[4200], err1[200] = "";
  snprintf(path, sizeof path, "%s%s", dir, CUDA_SONAME);
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(err1, sizeof err1, "%s", dlerror());
    h = dlopen(CUDA_SONAME, RTLD_NOW | RTLD_LOCAL);
  }
  if (!h) {
    snprintf(cuda_why, sizeof cuda_why, "CUDA support is not built into this library (%s: %.200s)",
             CUDA_SONAME, err1);
    return;
  }
  cuda_ops = dlsym(h, SBN_CUDA_DEVICE_TABLE_NAME);
  if (!cuda_ops)
    snprintf(cuda_why, sizeof cuda_why, "%s has no table %s (a library of another version?)",
             CUDA_SONAME, SBN_CUDA_DEVICE_TABLE_NAME);
}

const sbn_dev_ops *sbn_device_ops(sbn_device_type type, sbn_status *st, const char *call) {
  *st = SBN_STATUS_OK;
  if (type == SBN_DEVICE_CPU) return &sbn_cpu_device_ops;
  if (type == SBN_DEVICE_CUDA) {
    pthread_once(&cuda_once, find_cuda);
    if (cuda_ops) return cuda_ops;
    *st = sbn_fail(SBN_STATUS_NOT_BUILT, "%s: %s", call, cuda_why);
    return NULL;
  }
  *st = sbn_fail(SBN_STATUS_UNSUPPORTED, "%s: unknown device type %d", call, (int)type);
  return NULL;
}

sbn_status sbn_cuda_device_count(int *count) {
  sbn_clear_error();
  if (count) *count = 0;
  if (!count) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_cuda_device_count: count is NULL");
  sbn_status st;
  const sbn_dev_ops *ops = sbn_device_ops(SBN_DEVICE_CUDA, &st, "sbn_cuda_device_count");
  return ops ? ops->device_count(count) : st;
}

#include "data.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fail.h"

/* name, or name.gz when only that exists (the loader inflates either). */
static void pick(char *buf, size_t cap, const char *dir, const char *name) {
  snprintf(buf, cap, "%s/%s", dir, name);
  if (access(buf, F_OK) != 0) {
    snprintf(buf, cap, "%s/%s.gz", dir, name);
    if (access(buf, F_OK) != 0) snprintf(buf, cap, "%s/%s", dir, name); /* the loader names it */
  }
}

static sbn_status load_mnist_dir(sbn_dataset *train, sbn_dataset *test, const char *dir, const char *name) {
  char p[4][4200];
  pick(p[0], sizeof p[0], dir, "train-images-idx3-ubyte");
  pick(p[1], sizeof p[1], dir, "train-labels-idx1-ubyte");
  pick(p[2], sizeof p[2], dir, "t10k-images-idx3-ubyte");
  pick(p[3], sizeof p[3], dir, "t10k-labels-idx1-ubyte");
  sbn_status st = sbn_dataset_load_mnist(train, p[0], p[1]);
  if (st == SBN_STATUS_OK) st = sbn_dataset_load_mnist(test, p[2], p[3]);
  if (st == SBN_STATUS_OK) {
    snprintf(train->name, sizeof train->name, "%s", name);
    snprintf(test->name, sizeof test->name, "%s", name);
  } else {
    sbn_dataset_free(train);
  }
  return st;
}

static sbn_status load_cifar10_dir(sbn_dataset *train, sbn_dataset *test, const char *dir) {
  char p[6][4200];
  const char *files[5], *tf[1] = {p[5]};
  for (int i = 0; i < 5; i++) snprintf(p[i], sizeof p[i], "%s/data_batch_%d.bin", dir, i + 1), files[i] = p[i];
  snprintf(p[5], sizeof p[5], "%s/test_batch.bin", dir);
  if (access(p[0], F_OK) != 0) { /* the python version names its files without .bin */
    char py[4200];
    snprintf(py, sizeof py, "%s/data_batch_1", dir);
    if (access(py, F_OK) == 0)
      return train_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "%s holds CIFAR-10's python (pickle) version; syncbn-train reads the binary version: "
                      "download https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz and pass its "
                      "cifar-10-batches-bin folder",
                      dir);
  }
  sbn_status st = sbn_dataset_load_cifar10(train, files, 5);
  if (st == SBN_STATUS_OK) st = sbn_dataset_load_cifar10(test, tf, 1);
  if (st != SBN_STATUS_OK) sbn_dataset_free(train);
  return st;
}

sbn_status train_load_data(sbn_dataset *train, sbn_dataset *test, const char *spec, int64_t ntrain,
                           int64_t ntest, uint64_t seed) {
  if (!strcmp(spec, "synthetic")) {
    sbn_status st = sbn_dataset_synthetic(train, ntrain, seed);
    return st == SBN_STATUS_OK ? sbn_dataset_synthetic(test, ntest, seed + 1000003) : st;
  }
  if (!strcmp(spec, "fashion-mnist")) {
    char probe[256];
    snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", TRAIN_FASHION_MNIST_DIR);
    if (access(probe, R_OK) != 0)
      return train_fail(SBN_STATUS_IO_ERROR,
                      "Fashion-MNIST is not installed (%s missing): install Debian's package with "
                      "'scripts/deps.sh dataset-fashion-mnist' (or apt-get install dataset-fashion-mnist), "
                      "or run 'make run-fashion-mnist', which does",
                      probe);
    return load_mnist_dir(train, test, TRAIN_FASHION_MNIST_DIR, "fashion-mnist");
  }
  if (!strncmp(spec, "mnist:", 6)) return load_mnist_dir(train, test, spec + 6, "mnist");
  if (!strncmp(spec, "cifar10:", 8)) return load_cifar10_dir(train, test, spec + 8);
  return train_fail(SBN_STATUS_INVALID_ARGUMENT,
                  "unknown --data '%s' (synthetic, fashion-mnist, mnist:DIR or cifar10:DIR)", spec);
}

/* syncbn-train's --data: the synthetic default, Fashion-MNIST from Debian's
 * package, MNIST-format folders and CIFAR-10's binary version. */
#ifndef SBN_TRAIN_DATA_H
#define SBN_TRAIN_DATA_H

#include "syncbn_data.h"

/* Where Debian's dataset-fashion-mnist puts the four gzipped IDX files. */
#define TRAIN_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Load the training and test sets named by spec. Errors: a status and a
 * message (sbn_last_error) that says what to install or download. */
sbn_status train_load_data(sbn_dataset *train, sbn_dataset *test, const char *spec, int64_t ntrain,
                           int64_t ntest, uint64_t seed);

#endif

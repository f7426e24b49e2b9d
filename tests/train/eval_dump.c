/* The C side of the PyTorch recipe test: build syncbn-train's network, load
 * a model file it wrote, run eval on synthetic images and save the images
 * and logits, for the README's Python recipe to reproduce.
 * Usage: eval_dump MODEL.safetensors OUT.safetensors IN_CHANNELS WIDTH */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncbn_data.h"
#include "train/model.h"

int main(int argc, char **argv) {
  if (argc != 5) return fprintf(stderr, "usage: eval_dump MODEL OUT IN_CHANNELS WIDTH\n"), 2;
  const int cin = atoi(argv[3]), width = atoi(argv[4]), n = 32;
  sbn_module *net = NULL;
  sbn_dataset d = {0};
  sbn_status st = build_resnet(&net, cin, width, 10, 7);
  if (st == SBN_STATUS_OK) st = sbn_nn_load(net, argv[1], SBN_NN_LOAD_STRICT, NULL);
  if (st == SBN_STATUS_OK) st = sbn_dataset_synthetic(&d, n, 12345);
  if (st == SBN_STATUS_OK && d.channels != cin) st = SBN_STATUS_INVALID_ARGUMENT;
  if (st == SBN_STATUS_OK) st = sbn_module_train(net, 0);
  int64_t xs[4] = {n, d.channels, d.height, d.width};
  sbn_tensor x = sbn_tensor_cpu(d.images, 4, xs, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y;
  if (st == SBN_STATUS_OK) st = sbn_module_forward(net, &y, &x);
  if (st == SBN_STATUS_OK) {
    sbn_nn_entry e[2];
    memset(e, 0, sizeof e);
    snprintf(e[0].name, sizeof e[0].name, "x");
    e[0].dtype = SBN_DTYPE_FLOAT32, e[0].ndim = 4, memcpy(e[0].shape, xs, sizeof xs);
    e[0].numel = (int64_t)n * d.channels * d.height * d.width, e[0].data = d.images;
    snprintf(e[1].name, sizeof e[1].name, "logits");
    e[1].dtype = SBN_DTYPE_FLOAT32, e[1].ndim = 2, e[1].shape[0] = y.shape[0], e[1].shape[1] = y.shape[1];
    e[1].numel = y.shape[0] * y.shape[1], e[1].data = y.data;
    st = sbn_nn_save_entries(argv[2], e, 2);
  }
  if (st != SBN_STATUS_OK) fprintf(stderr, "eval_dump: %s: %s\n", sbn_status_name(st), sbn_last_error());
  else printf("eval_dump: %d images through %s in eval mode -> %s\n", n, argv[1], argv[2]);
  sbn_dataset_free(&d);
  sbn_module_destroy(net);
  return st != SBN_STATUS_OK;
}

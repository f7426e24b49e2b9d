#include "model.h"

/* Append a freshly made child to a Sequential; on failure it is destroyed. */
static sbn_status add(sbn_module *seq, const char *name, sbn_status made, sbn_module *child) {
  if (made != SBN_STATUS_OK) return made;
  sbn_status st = sbn_nn_sequential_append(seq, name, child);
  if (st != SBN_STATUS_OK) sbn_module_destroy(child);
  return st;
}

/* torchvision's layerK: a Sequential of blocks (one here), so names read
 * "layer1.0.bn1.running_mean". */
static sbn_status stage(sbn_module *net, const char *name, int64_t in, int64_t out, int stride, uint64_t seed) {
  sbn_module *layer = NULL, *block = NULL;
  sbn_status st = sbn_nn_sequential_create(&layer);
  if (st != SBN_STATUS_OK) return st;
  st = sbn_nn_basic_block_create(&block, in, out, stride, seed);
  st = add(layer, "0", st, block);
  if (st != SBN_STATUS_OK) {
    sbn_module_destroy(layer);
    return st;
  }
  return add(net, name, SBN_STATUS_OK, layer);
}

sbn_status build_resnet(sbn_module **out, int in_channels, int width, int classes, uint64_t seed) {
  sbn_module *net = NULL, *m = NULL;
  *out = NULL;
  sbn_status st = sbn_nn_sequential_create(&net);
  /* each layer is made first, then appended (argument order is unspecified) */
#define ADD(name, make) \
  if (st == SBN_STATUS_OK) st = (make), st = add(net, name, st, m)
  ADD("conv1", sbn_nn_conv2d_create(&m, in_channels, width, 3, 1, 1, 0, seed + 1));
  sbn_bn_options bn = sbn_bn_options_default(width);
  ADD("bn1", sbn_nn_batchnorm_create(&m, 2, &bn));
  ADD("relu", sbn_nn_relu_create(&m));
  if (st == SBN_STATUS_OK) st = stage(net, "layer1", width, width, 1, seed + 2);
  if (st == SBN_STATUS_OK) st = stage(net, "layer2", width, 2 * width, 2, seed + 3);
  ADD("avgpool", sbn_nn_global_avgpool_create(&m));
  ADD("flatten", sbn_nn_flatten_create(&m));
  ADD("fc", sbn_nn_linear_create(&m, 2 * width, classes, 1, seed + 4));
#undef ADD
  if (st != SBN_STATUS_OK) {
    sbn_module_destroy(net);
    return st;
  }
  *out = net;
  return SBN_STATUS_OK;
}

/* The network syncbn-train trains: a small ResNet in torchvision's naming. */
#ifndef SBN_TRAIN_MODEL_H
#define SBN_TRAIN_MODEL_H

#include "syncbn_nn.h"

/* conv1 (3x3, width) - bn1 - relu - layer1.0 (BasicBlock width) -
 * layer2.0 (BasicBlock 2*width, stride 2) - avgpool - flatten - fc.
 * Deterministic in seed; BatchNorm2d layers (convert for SyncBN). */
sbn_status build_resnet(sbn_module **out, int in_channels, int width, int classes, uint64_t seed);

#endif

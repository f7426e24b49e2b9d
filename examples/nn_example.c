/* A small network converted to SyncBatchNorm over 2 thread ranks: one
 * training step each, a checkpoint saved by rank 0, loaded back by both.
 * Build: make build/examples/nn_example   Run: nn_example [model.safetensors] */
#include <stdio.h>
#include <syncbn_nn.h>

#define TRY(call) do { sbn_status s_ = (call); if (s_ != SBN_STATUS_OK) { \
    fprintf(stderr, "%s: %s\n", #call, sbn_last_error()); return s_; } } while (0)

static const char *path = "model.safetensors";

static int rank_main(sbn_group *world, void *arg) {
  (void)arg;
  int rank = sbn_group_rank(world);
  sbn_module *net, *m;
  sbn_bn_options bn = sbn_bn_options_default(8);
  TRY(sbn_nn_sequential_create(&net)); /* same seeds on every rank: equal replicas */
  TRY(sbn_nn_conv2d_create(&m, 3, 8, 3, 1, 1, 0, 1)); TRY(sbn_nn_sequential_append(net, NULL, m));
  TRY(sbn_nn_batchnorm_create(&m, 2, &bn));            TRY(sbn_nn_sequential_append(net, NULL, m));
  TRY(sbn_nn_relu_create(&m));                         TRY(sbn_nn_sequential_append(net, NULL, m));
  TRY(sbn_nn_basic_block_create(&m, 8, 16, 2, 2));     TRY(sbn_nn_sequential_append(net, NULL, m));
  TRY(sbn_nn_global_avgpool_create(&m));               TRY(sbn_nn_sequential_append(net, NULL, m));
  TRY(sbn_nn_flatten_create(&m));                      TRY(sbn_nn_sequential_append(net, NULL, m));
  TRY(sbn_nn_linear_create(&m, 16, 10, 1, 3));         TRY(sbn_nn_sequential_append(net, NULL, m));

  /* Every BatchNorm2d becomes a SyncBatchNorm over the world group. */
  TRY(sbn_nn_convert_sync_batchnorm(&net, net, world));

  /* One step on this rank's 4 images (rank-dependent data). */
  static float x[2][4 * 3 * 8 * 8], dlogits[2][4 * 10];
  int64_t shape[4] = {4, 3, 8, 8}, labels[4] = {1, 7, 3, rank};
  for (int i = 0; i < 4 * 3 * 8 * 8; i++) x[rank][i] = (float)((i * 7919 + rank * 104729) % 997) / 500.0f - 1.0f;
  sbn_tensor xt = sbn_tensor_cpu(x[rank], 4, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y, dx;
  sbn_nn_sgd_options so = {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = 1};
  sbn_nn_sgd *opt;
  double loss;
  TRY(sbn_nn_sgd_create(&opt, net, &so));
  TRY(sbn_module_zero_grad(net));
  TRY(sbn_module_forward(net, &y, &xt));               /* batch statistics over both ranks */
  TRY(sbn_nn_cross_entropy_forward(&loss, &y, labels, 8)); /* divide by the global batch */
  sbn_tensor dl = sbn_tensor_cpu(dlogits[rank], 2, y.shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  TRY(sbn_nn_cross_entropy_backward(&dl, &y, labels, 8));
  TRY(sbn_module_backward(net, &dx, &dl));
  /* (a data-parallel wrapper would all-reduce the parameter gradients here) */
  TRY(sbn_nn_sgd_step(opt));
  printf("rank %d: loss share %.4f, %lld parameters\n", rank, loss, (long long)sbn_module_num_parameters(net));

  if (rank == 0) TRY(sbn_nn_save(path, net));          /* atomic; PyTorch state-dict names */
  TRY(sbn_group_barrier(world));
  sbn_nn_load_report rep;
  TRY(sbn_nn_load(net, path, SBN_NN_LOAD_STRICT, &rep)); /* validated before anything changes */
  printf("rank %d: loaded %s (%d missing, %d unexpected keys)\n", rank, path, rep.num_missing, rep.num_unexpected);
  sbn_nn_load_report_free(&rep);
  sbn_nn_sgd_destroy(opt);
  return sbn_module_destroy(net);
}

int main(int argc, char **argv) {
  if (argc > 1) path = argv[1];
  sbn_status st = sbn_team_run(2, rank_main, NULL);    /* 2 thread ranks, one process */
  if (st != SBN_STATUS_OK) fprintf(stderr, "failed: %s\n", sbn_status_name(st));
  return st == SBN_STATUS_OK ? 0 : 1;
}

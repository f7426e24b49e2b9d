/* ReLU on NaN, signed zeros and infinities, as PyTorch 1.13 computes it:
 * forward is x < 0 ? 0 : x (relu(NaN) = NaN, relu(-0.0) = -0.0, relu(-inf)
 * = +0.0), backward is threshold_backward(dy, y, 0) = y <= 0 ? 0 : dy, so
 * the gradient passes where y is NaN. The expected bits below are what
 * torch.relu gives (printed by the test next to ours). BasicBlock's inline
 * relus follow the same rules: in eval mode a NaN pixel spreads through
 * conv1 (3x3) and conv2 (3x3) to the 5x5 square around it in every output
 * channel, as in PyTorch, and every other output is the bits of the same
 * block on the input with that pixel finite. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn_testutil.h"

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static int relu_checks(void) {
  enum { N = 9 };
  float x[N] = {NAN, -0.0f, 0.0f, INFINITY, -INFINITY, -1.5f, 2.5f, -1e-45f, 1e-45f};
  /* torch.relu(x).view(torch.int32) and x.grad for dy = 3 (dy[1] = NaN below) */
  const uint32_t want_y[N] = {0x7fc00000u, 0x80000000u, 0, 0x7f800000u, 0, 0, 0x40200000u, 0, 0x00000001u};
  const float want_g[N] = {3, 0, 0, 3, 0, 0, 3, 0, 3};
  float dyv[N];
  for (int i = 0; i < N; i++) dyv[i] = 3;
  dyv[1] = NAN; /* masked (y = -0.0 <= 0): torch gives 0, not NaN */
  int64_t sh[1] = {N};
  sbn_module *m;
  CHECK_OK(sbn_nn_relu_create(&m));
  sbn_tensor xt = sbn_tensor_cpu(x, 1, sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y, dx;
  sbn_tensor dyt = sbn_tensor_cpu(dyv, 1, sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  CHECK_OK(sbn_module_forward(m, &y, &xt));
  int bad = 0;
  printf("ReLU forward (bits, PyTorch's in brackets)\n");
  for (int i = 0; i < N; i++) {
    uint32_t got = bits(((const float *)y.data)[i]);
    printf("  relu(%-9g) = %-9g 0x%08x [0x%08x] %s\n", x[i], ((const float *)y.data)[i], got, want_y[i],
           got == want_y[i] ? "ok" : "FAIL");
    bad |= got != want_y[i];
  }
  CHECK_OK(sbn_module_backward(m, &dx, &dyt));
  printf("ReLU backward, dy = 3 but NaN at x = -0 (PyTorch's in brackets)\n");
  for (int i = 0; i < N; i++) {
    float g = ((const float *)dx.data)[i];
    printf("  x = %-9g dx = %g [%g] %s\n", x[i], g, want_g[i], bits(g) == bits(want_g[i]) ? "ok" : "FAIL");
    bad |= bits(g) != bits(want_g[i]);
  }
  sbn_module_destroy(m);
  return bad;
}

enum { C = 2, H = 7, W = 7, HOLE = 3 }; /* the NaN at channel 0, (3, 3) */

/* Block (eval) output for the input with x[0][HOLE][HOLE] = hole. */
static int block_run(sbn_module *b, float hole, float *out) {
  float x[C * H * W];
  for (int i = 0; i < C * H * W; i++) x[i] = (float)((i * 37) % 11) / 4 - 1.2f;
  x[HOLE * W + HOLE] = hole;
  int64_t sh[4] = {1, C, H, W};
  sbn_tensor xt = sbn_tensor_cpu(x, 4, sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y;
  CHECK_OK(sbn_module_forward(b, &y, &xt));
  memcpy(out, y.data, sizeof(float) * C * H * W);
  return 0;
}

static int block_checks(void) {
  sbn_module *b;
  CHECK_OK(sbn_nn_basic_block_create(&b, C, C, 1, 7));
  CHECK_OK(sbn_module_train(b, 0));
  float yn[C * H * W], yf[C * H * W];
  if (block_run(b, NAN, yn) || block_run(b, 0.5f, yf)) return 1;
  int nans = 0, wrong = 0;
  printf("BasicBlock(eval), NaN input at (0, %d, %d): NaN outputs (1 = NaN; PyTorch: the 5x5 square)\n", HOLE, HOLE);
  for (int c = 0; c < C; c++)
    for (int h = 0; h < H; h++) {
      printf("  ");
      for (int w = 0; w < W; w++) {
        int i = (c * H + h) * W + w, in_sq = abs(h - HOLE) <= 2 && abs(w - HOLE) <= 2;
        nans += isnan(yn[i]) != 0;
        wrong += in_sq ? !isnan(yn[i]) : bits(yn[i]) != bits(yf[i]);
        printf("%d", isnan(yn[i]) != 0);
      }
      printf("\n");
    }
  printf("  %d NaN outputs (want %d), %d outputs differ from PyTorch's pattern %s\n", nans, C * 25, wrong,
         wrong ? "FAIL" : "ok");
  sbn_module_destroy(b);
  return wrong != 0;
}

int main(void) {
  int bad = relu_checks();
  bad |= block_checks();
  printf("%s\n", bad ? "FAILED" : "all ok");
  return bad ? 1 : 0;
}

/* Conv2d (square kernel, stride, zero padding, optional bias), NCHW:
 * per sample, im2col then one OpenBLAS sgemm; backward recomputes the
 * columns (no per-batch column storage) for the weight gradient and
 * scatters W^T dy back with col2im. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "module.h"
#include "../core/checked.h"

typedef struct conv2d {
  int64_t in, out;
  int k, stride, pad;
  float *w, *b, *gw, *gb;
  sbn_nn_buf col, dcol;
} conv2d;

static void im2col(float *col, const float *x, int64_t C, int64_t H, int64_t W, int k, int s, int p,
                   int64_t Ho, int64_t Wo) {
  for (int64_t c = 0; c < C; c++)
    for (int ki = 0; ki < k; ki++)
      for (int kj = 0; kj < k; kj++) {
        float *row = col + ((c * k + ki) * k + kj) * Ho * Wo;
        for (int64_t oh = 0; oh < Ho; oh++) {
          int64_t ih = oh * s - p + ki;
          float *r = row + oh * Wo;
          if (ih < 0 || ih >= H) {
            memset(r, 0, sizeof(float) * (size_t)Wo);
            continue;
          }
          const float *xr = x + (c * H + ih) * W;
          for (int64_t ow = 0; ow < Wo; ow++) {
            int64_t iw = ow * s - p + kj;
            r[ow] = (iw >= 0 && iw < W) ? xr[iw] : 0.0f;
          }
        }
      }
}

static void col2im_add(float *x, const float *col, int64_t C, int64_t H, int64_t W, int k, int s, int p,
                       int64_t Ho, int64_t Wo) {
  for (int64_t c = 0; c < C; c++)
    for (int ki = 0; ki < k; ki++)
      for (int kj = 0; kj < k; kj++) {
        const float *row = col + ((c * k + ki) * k + kj) * Ho * Wo;
        for (int64_t oh = 0; oh < Ho; oh++) {
          int64_t ih = oh * s - p + ki;
          if (ih < 0 || ih >= H) continue;
          float *xr = x + (c * H + ih) * W;
          for (int64_t ow = 0; ow < Wo; ow++) {
            int64_t iw = ow * s - p + kj;
            if (iw >= 0 && iw < W) xr[iw] += row[oh * Wo + ow];
          }
        }
      }
}

static sbn_status conv_geom(const conv2d *c, const sbn_tensor *x, int64_t *Ho, int64_t *Wo) {
  char s[96];
  if (x->ndim != 4)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "Conv2d.forward: expected 4D input (N, C, H, W), got %s",
                    sbn_nn_shape_str(s, sizeof s, x->ndim, x->shape));
  if (x->shape[1] != c->in)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "Conv2d.forward: input %s has %lld channels, expected in_channels = %lld",
                    sbn_nn_shape_str(s, sizeof s, x->ndim, x->shape), (long long)x->shape[1], (long long)c->in);
  int64_t hp, wp, P, KP, NOP;
  if (!sbn_add_i64(&hp, x->shape[2], 2 * (int64_t)c->pad) || !sbn_add_i64(&wp, x->shape[3], 2 * (int64_t)c->pad))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "Conv2d.forward: input %s: padded size overflows",
                    sbn_nn_shape_str(s, sizeof s, x->ndim, x->shape));
  if (hp < c->k || wp < c->k)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "Conv2d.forward: padded input %lldx%lld is smaller than the kernel %dx%d", (long long)hp,
                    (long long)wp, c->k, c->k);
  *Ho = (hp - c->k) / c->stride + 1;
  *Wo = (wp - c->k) / c->stride + 1;
  /* The GEMMs count in int and the columns (K x P floats) and the output
   * (N x out x P floats) must be addressable. */
  if (!sbn_mul_i64(&P, *Ho, *Wo) || P > INT32_MAX || !sbn_mul_i64(&KP, c->in * c->k * c->k, P) ||
      !sbn_mul_i64(&NOP, x->shape[0], c->out) || !sbn_mul_i64(&NOP, NOP, P) || !sbn_bytes(&(size_t){0}, KP, 8) ||
      !sbn_bytes(&(size_t){0}, NOP, 8))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "Conv2d.forward: input %s gives a %lldx%lld output whose size overflows (at most %d "
                    "output pixels per image)",
                    sbn_nn_shape_str(s, sizeof s, x->ndim, x->shape), (long long)*Ho, (long long)*Wo, INT32_MAX);
  return SBN_STATUS_OK;
}

static sbn_status conv_forward(sbn_module *m, sbn_tensor *y, const sbn_tensor *x) {
  conv2d *c = m->impl;
  int64_t Ho = 0, Wo = 0;
  sbn_status st = conv_geom(c, x, &Ho, &Wo);
  if (st != SBN_STATUS_OK) return st;
  const int64_t N = x->shape[0], H = x->shape[2], W = x->shape[3], P = Ho * Wo;
  const int64_t K = c->in * c->k * c->k;
  float *out = sbn_nn_buf_reserve(&m->out, N * c->out * P, "Conv2d.forward");
  float *col = out ? sbn_nn_buf_reserve(&c->col, K * P, "Conv2d.forward") : NULL;
  if (!out || !col) return SBN_STATUS_OUT_OF_MEMORY;
  const float *xd = x->data;
  for (int64_t n = 0; n < N; n++) {
    im2col(col, xd + n * c->in * H * W, c->in, H, W, c->k, c->stride, c->pad, Ho, Wo);
    float *yn = out + n * c->out * P;
    sbn_nn_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)c->out, (int)P, (int)K, 1.0f, c->w, (int)K, col,
                (int)P, 0.0f, yn, (int)P);
    if (c->b)
      for (int64_t o = 0; o < c->out; o++)
        for (int64_t i = 0; i < P; i++) yn[o * P + i] += c->b[o];
  }
  int64_t shape[4] = {N, c->out, Ho, Wo};
  *y = sbn_nn_view(out, 4, shape);
  return SBN_STATUS_OK;
}

static sbn_status conv_backward(sbn_module *m, sbn_tensor *dx, const sbn_tensor *dy) {
  conv2d *c = m->impl;
  const int64_t N = m->x.shape[0], H = m->x.shape[2], W = m->x.shape[3];
  const int64_t Ho = m->y.shape[2], Wo = m->y.shape[3], P = Ho * Wo;
  const int64_t K = c->in * c->k * c->k;
  float *g = sbn_nn_buf_reserve(&m->dx, N * c->in * H * W, "Conv2d.backward");
  float *col = g ? sbn_nn_buf_reserve(&c->col, K * P, "Conv2d.backward") : NULL;
  float *dcol = col ? sbn_nn_buf_reserve(&c->dcol, K * P, "Conv2d.backward") : NULL;
  if (!dcol) return SBN_STATUS_OUT_OF_MEMORY;
  memset(g, 0, sizeof(float) * (size_t)(N * c->in * H * W));
  const int want_w = m->local[0].requires_grad, want_b = c->b && m->local[1].requires_grad;
  const float *xd = m->x.data, *d = dy->data;
  for (int64_t n = 0; n < N; n++) {
    const float *dyn = d + n * c->out * P;
    if (want_w) {
      im2col(col, xd + n * c->in * H * W, c->in, H, W, c->k, c->stride, c->pad, Ho, Wo);
      sbn_nn_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)c->out, (int)K, (int)P, 1.0f, dyn, (int)P, col,
                  (int)P, 1.0f, c->gw, (int)K);
    }
    sbn_nn_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)K, (int)P, (int)c->out, 1.0f, c->w, (int)K, dyn,
                (int)P, 0.0f, dcol, (int)P);
    col2im_add(g + n * c->in * H * W, dcol, c->in, H, W, c->k, c->stride, c->pad, Ho, Wo);
  }
  if (want_b)
    for (int64_t o = 0; o < c->out; o++) {
      double s = 0;
      for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < P; i++) s += d[(n * c->out + o) * P + i];
      c->gb[o] += (float)s;
    }
  *dx = sbn_nn_view(g, 4, m->x.shape);
  return SBN_STATUS_OK;
}

static void conv_destroy(sbn_module *m) {
  conv2d *c = m->impl;
  if (!c) return;
  free(c->w), free(c->b), free(c->gw), free(c->gb), free(c->col.p), free(c->dcol.p), free(c);
}

static const sbn_module_ops conv_ops = {conv_forward, conv_backward, conv_destroy, NULL};

sbn_status sbn_nn_conv2d_create(sbn_module **out, int64_t in_channels, int64_t out_channels, int kernel_size,
                                int stride, int padding, int bias, uint64_t seed) {
  static const char call[] = "sbn_nn_conv2d_create";
  sbn_clear_error();
  if (!out) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: out is NULL", call);
  *out = NULL;
  if (in_channels <= 0 || out_channels <= 0 || in_channels > 65536 || out_channels > 65536 || kernel_size <= 0 ||
      kernel_size > 64 || stride <= 0 || padding < 0 || padding > 64)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "%s: bad geometry in=%lld out=%lld kernel=%d stride=%d padding=%d", call,
                    (long long)in_channels, (long long)out_channels, kernel_size, stride, padding);
  conv2d *c = calloc(1, sizeof *c);
  sbn_module *m = c ? sbn_nn_module_new(SBN_MODULE_KIND_CONV2D, &conv_ops, c) : NULL;
  if (!m) {
    free(c);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  }
  c->in = in_channels, c->out = out_channels, c->k = kernel_size, c->stride = stride, c->pad = padding;
  const int64_t K = in_channels * kernel_size * kernel_size;
  c->w = calloc((size_t)(K * out_channels), sizeof(float));
  c->gw = calloc((size_t)(K * out_channels), sizeof(float));
  int ok = c->w && c->gw;
  if (bias) {
    c->b = calloc((size_t)out_channels, sizeof(float)), c->gb = calloc((size_t)out_channels, sizeof(float));
    ok = ok && c->b && c->gb;
  }
  if (!ok) {
    sbn_nn_module_free(m);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory for the weights", call);
  }
  const double bound = 1.0 / sqrt((double)K); /* PyTorch's default init bound */
  sbn_nn_init_uniform(c->w, K * out_channels, bound, seed);
  int64_t ws[4] = {out_channels, in_channels, kernel_size, kernel_size};
  sbn_nn_add_local(m, "weight", SBN_NN_ENTRY_KIND_PARAMETER, SBN_DTYPE_FLOAT32, 4, ws, c->w, c->gw);
  if (bias) {
    sbn_nn_init_uniform(c->b, out_channels, bound, seed ^ 0xB1A5ull);
    sbn_nn_add_local(m, "bias", SBN_NN_ENTRY_KIND_PARAMETER, SBN_DTYPE_FLOAT32, 1, &out_channels, c->b, c->gb);
  }
  *out = m;
  return SBN_STATUS_OK;
}

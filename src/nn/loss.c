/* Cross-entropy over class logits (N, K), accumulated in double; the
 * divisor option makes data-parallel ranks divide by the global batch. */
#include <math.h>

#include "module.h"

static sbn_status ce_check(const sbn_tensor *logits, const int64_t *targets, double divisor, const char *call,
                           double *div) {
  if (!logits) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: logits is NULL", call);
  if (logits->dtype != SBN_DTYPE_FLOAT32 || logits->device.type != SBN_DEVICE_CPU || logits->ndim != 2 ||
      logits->shape[0] < 0 || logits->shape[1] <= 0)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: logits must be float32 CPU (N, K) with K > 0", call);
  if (sbn_tensor_numel(logits) < 0) {
    char sh[96];
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: logits shape %s: size overflows", call,
                    sbn_nn_shape_str(sh, sizeof sh, logits->ndim, logits->shape));
  }
  const int64_t N = logits->shape[0], K = logits->shape[1];
  if (N > 0 && (!targets || !logits->data))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", call, targets ? "logits data" : "targets");
  for (int64_t i = 0; i < N; i++)
    if (targets[i] < 0 || targets[i] >= K)
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: target %lld of sample %lld is out of range [0, %lld)",
                      call, (long long)targets[i], (long long)i, (long long)K);
  if (!(divisor == divisor) || isinf(divisor))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: divisor must be finite", call);
  *div = divisor > 0 ? divisor : (double)(N > 0 ? N : 1);
  return SBN_STATUS_OK;
}

static double row_lse(const float *z, int64_t K, double *mx) {
  double m = z[0];
  for (int64_t k = 1; k < K; k++)
    if (z[k] > m) m = z[k];
  double s = 0;
  for (int64_t k = 0; k < K; k++) s += exp((double)z[k] - m);
  *mx = m;
  return m + log(s);
}

sbn_status sbn_nn_cross_entropy_forward(double *loss, const sbn_tensor *logits, const int64_t *targets,
                                        double divisor) {
  static const char call[] = "sbn_nn_cross_entropy_forward";
  sbn_clear_error();
  if (!loss) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: loss is NULL", call);
  double div;
  sbn_status st = ce_check(logits, targets, divisor, call, &div);
  if (st != SBN_STATUS_OK) return st;
  const int64_t N = logits->shape[0], K = logits->shape[1];
  const float *z = logits->data;
  double acc = 0, mx;
  for (int64_t i = 0; i < N; i++) acc += row_lse(z + i * K, K, &mx) - (double)z[i * K + targets[i]];
  *loss = acc / div;
  return SBN_STATUS_OK;
}

sbn_status sbn_nn_cross_entropy_backward(sbn_tensor *dlogits, const sbn_tensor *logits, const int64_t *targets,
                                         double divisor) {
  static const char call[] = "sbn_nn_cross_entropy_backward";
  sbn_clear_error();
  double div;
  sbn_status st = ce_check(logits, targets, divisor, call, &div);
  if (st != SBN_STATUS_OK) return st;
  if (!dlogits || dlogits->ndim != 2 || dlogits->shape[0] != logits->shape[0] ||
      dlogits->shape[1] != logits->shape[1] || dlogits->dtype != SBN_DTYPE_FLOAT32 ||
      (!dlogits->data && logits->shape[0] > 0))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: dlogits must be float32 with the logits' shape", call);
  const int64_t N = logits->shape[0], K = logits->shape[1];
  const float *z = logits->data;
  float *g = dlogits->data;
  for (int64_t i = 0; i < N; i++) {
    double mx, lse = row_lse(z + i * K, K, &mx);
    for (int64_t k = 0; k < K; k++) {
      double p = exp((double)z[i * K + k] - lse);
      g[i * K + k] = (float)((p - (k == targets[i] ? 1.0 : 0.0)) / div);
    }
  }
  return SBN_STATUS_OK;
}

sbn_status sbn_nn_count_correct(int64_t *correct, const sbn_tensor *logits, const int64_t *targets) {
  static const char call[] = "sbn_nn_count_correct";
  sbn_clear_error();
  double div;
  if (!correct) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: correct is NULL", call);
  sbn_status st = ce_check(logits, targets, 0, call, &div);
  if (st != SBN_STATUS_OK) return st;
  const int64_t N = logits->shape[0], K = logits->shape[1];
  const float *z = logits->data;
  int64_t c = 0;
  for (int64_t i = 0; i < N; i++) {
    int64_t best = 0;
    for (int64_t k = 1; k < K; k++)
      if (z[i * K + k] > z[i * K + best]) best = k;
    c += best == targets[i];
  }
  *correct = c;
  return SBN_STATUS_OK;
}

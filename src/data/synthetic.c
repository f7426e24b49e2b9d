/* The synthetic dataset: the class is the texture's contrast.
 *
 * Each image = a random brightness offset + smooth random texture whose
 * amplitude is 0.5 * 1.2^class (10 classes, each 20% stronger than the
 * last), the same in all three channels. Batch normalization divides each
 * channel by the batch's standard deviation: over a batch of 2 that leaves
 * only the ratio of the two images' contrasts (the class is mostly erased,
 * and eval with running statistics sees features training never showed),
 * while over a synchronized batch of 16 or more the divisor approaches the
 * dataset's and the contrast, hence the class, survives. */
#include <math.h>
#include <string.h>

#include "dataset_io.h"

static uint64_t mix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double uniform(uint64_t *s) { return (double)(mix(s) >> 11) * 0x1.0p-53; }
static double normal(uint64_t *s) {
  return sqrt(-2.0 * log(1.0 - uniform(s))) * cos(6.283185307179586 * uniform(s));
}

enum { SYN_C = 3, SYN_H = 16, SYN_W = 16 };

double sbn_synthetic_contrast(int k) { return 0.5 * pow(1.2, k); }

sbn_status sbn_dataset_synthetic(sbn_dataset *out, int64_t count, uint64_t seed) {
  sbn_clear_error();
  if (!out || count < 1)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_dataset_synthetic: need out and count >= 1");
  sbn_status st = sbn_dataset_alloc(out, count, SYN_C, SYN_H, SYN_W, "synthetic");
  if (st != SBN_STATUS_OK) return st;
  uint64_t s = seed * 0x2545F4914F6CDD1Dull + 1;
  float noise[SYN_H + 1][SYN_W + 1];
  for (int64_t i = 0; i < count; i++) {
    int k = (int)(mix(&s) % 10);
    out->labels[i] = k;
    double brightness = 0.5 * normal(&s), amplitude = sbn_synthetic_contrast(k);
    for (int c = 0; c < SYN_C; c++) {
      for (int y = 0; y <= SYN_H; y++)
        for (int x = 0; x <= SYN_W; x++) noise[y][x] = (float)normal(&s);
      float *img = out->images + ((size_t)i * SYN_C + c) * SYN_H * SYN_W;
      for (int y = 0; y < SYN_H; y++)
        for (int x = 0; x < SYN_W; x++) /* 2x2 box blur: texture with some spatial structure */
          img[y * SYN_W + x] = (float)(brightness + amplitude * (noise[y][x] + noise[y + 1][x] + noise[y][x + 1] +
                                                                 noise[y + 1][x + 1]) / 2);
    }
  }
  return SBN_STATUS_OK;
}

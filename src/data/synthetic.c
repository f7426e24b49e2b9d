/* The synthetic dataset: the class is an average colour under texture.
 *
 * Each image = class colour (one of 10 points in RGB, spaced 0.35 apart per
 * channel level) + a random per-image brightness offset shared by the three
 * channels + strong per-pixel noise with some spatial smoothness. What tells
 * the classes apart is the per-channel mean of the image relative to the
 * dataset: batch normalization over a batch of 2 subtracts the pair's mean,
 * which erases most of it; over a synchronized batch of 16 or more, the
 * statistics approach the dataset's and the colour survives. */
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

sbn_status sbn_dataset_synthetic(sbn_dataset *out, int64_t count, uint64_t seed) {
  sbn_clear_error();
  if (!out || count < 1)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_dataset_synthetic: need out and count >= 1");
  sbn_status st = sbn_dataset_alloc(out, count, SYN_C, SYN_H, SYN_W, "synthetic");
  if (st != SBN_STATUS_OK) return st;
  /* 10 class colours: levels in {-1, 0, 1} per channel, distinct. */
  static const signed char colour[10][3] = {{-1, -1, -1}, {1, 1, 1}, {1, -1, -1}, {-1, 1, -1}, {-1, -1, 1},
                                            {1, 1, -1},   {1, -1, 1}, {-1, 1, 1},  {0, 0, 0},   {1, 0, -1}};
  uint64_t s = seed * 0x2545F4914F6CDD1Dull + 1;
  float noise[SYN_H + 1][SYN_W + 1];
  for (int64_t i = 0; i < count; i++) {
    int k = (int)(mix(&s) % 10);
    out->labels[i] = k;
    double brightness = 0.25 * normal(&s);
    for (int c = 0; c < SYN_C; c++) {
      for (int y = 0; y <= SYN_H; y++)
        for (int x = 0; x <= SYN_W; x++) noise[y][x] = (float)normal(&s);
      float *img = out->images + ((size_t)i * SYN_C + c) * SYN_H * SYN_W;
      for (int y = 0; y < SYN_H; y++)
        for (int x = 0; x < SYN_W; x++) /* 2x2 box blur: texture with some spatial structure */
          img[y * SYN_W + x] = (float)(0.35 * colour[k][c] + brightness +
                                       0.9 * (noise[y][x] + noise[y + 1][x] + noise[y][x + 1] + noise[y + 1][x + 1]) / 2);
    }
  }
  return SBN_STATUS_OK;
}

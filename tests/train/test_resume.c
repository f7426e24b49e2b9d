/* The resume checkpoint's validation (tools/train/resume.c, what
 * syncbn-train --resume runs) over the checked-in fuzz seeds: each good
 * file loads with its position, each damaged one is refused with a message
 * naming what is wrong, and a refused file changes nothing.
 *
 *   test_resume CORPUS_DIR             check tests/fuzz/corpus/resume
 *   test_resume --write-good OUT_DIR   write the good seeds (make fuzz-seeds;
 *                                      tests/fuzz/make_seeds.py damages them) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resume_fixture.h"
#include "train/fail.h"

/* Good files: position, epoch sums and optimizer step a run can write. */
typedef struct good_seed {
  const char *name;
  int64_t epoch, step, opt_step;
  double sums[3];
} good_seed;
static const good_seed goods[] = {
    {"good_start", 0, 0, 0, {0, 0, 0}},
    {"good_partial", 1, 2, 5, {3.5, 5, 8}},       /* stopped after 2 steps of epoch 2 */
    {"good_partial_nocrc", 1, 2, 5, {3.5, 5, 8}}, /* the same without a CRC (make_seeds.py) */
    {"good_epoch_done", 2, 0, 6, {0, 0, 0}},      /* after 2 complete epochs */
    {"good_finished", 3, 0, 9, {0, 0, 0}},        /* nothing left to run */
    {"good_local_bn_tail", 2, 0, 4, {0, 0, 0}},   /* local BN skipped 2 short tails */
};

/* Damaged files (make_seeds.py) and a part of the message each must give. */
static const struct {
  const char *name, *expect;
} bads[] = {
    {"bad_epoch_past_end", "outside this run's 3 epochs"},
    {"bad_epoch_end_with_step", "epoch 3, step 1, outside"},
    {"bad_epoch_negative", "epoch -1, step 2, outside"},
    {"bad_epoch_int64_max", "epoch 9223372036854775807"},
    {"bad_step_negative", "step -1, outside"},
    {"bad_step_past_epoch", "step 3, outside this run's 3 epochs of 3 steps"},
    {"bad_step_int64_max", "step 9223372036854775807"},
    {"bad_step_int64_min", "step -9223372036854775808"},
    {"bad_optimizer_step_int64_max", "optimizer step 9223372036854775807"},
    {"bad_optimizer_step_negative", "optimizer step -1"},
    {"bad_optimizer_step_ahead", "optimizer step 6, but its position is 5 steps"},
    {"bad_sums_seen", "epoch sums"},
    {"bad_sums_correct_nan", "epoch sums"},
    {"bad_sums_loss_negative", "epoch sums"},
    {"bad_sums_at_step_0", "epoch sums"},
    {"bad_config_ranks", "--ranks 3 (now 2)"},
    {"bad_config_batch_int64_max", "--batch 9223372036854775807 (now 2)"},
    {"bad_config_width", "--width 4 (now 1)"},
    {"bad_config_data", "a different dataset"},
    {"bad_config_images", "training images 11 (now 10)"},
    {"bad_truncated_data", "resume: "},
    {"bad_truncated_header", "resume: "},
    {"bad_empty_header", "resume: "},
    {"bad_crc", "resume: "},
    {"bad_dtype_epoch_f64", "trainer.epoch"},
    {"bad_dtype_weight_i64", "conv1.weight"},
    {"bad_shape_sums", "trainer.epoch_sums"},
    {"bad_shape_weight", "conv1.weight"},
    {"bad_missing_step", "has no trainer.step"},
    {"bad_model_file_only", "not a syncbn-train resume checkpoint"},
    {"bad_missing_weight", "fc.weight"},
    {"bad_extra_key", "extra.weight"},
    {"bad_nbt_negative", "num_batches_tracked"},
};

static unsigned char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
      (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *len = (size_t)n;
  return buf;
}

static sbn_nn_entry *find(resume_fixture *f, const char *name) {
  for (int i = 0; i < f->rs.count; i++)
    if (strcmp(f->rs.entries[i].name, name) == 0) return &f->rs.entries[i];
  return NULL;
}

/* Give every float a distinct value (momentum buffers included), so a load
 * that mixes entries up or changes a byte cannot go unnoticed. */
static void fill_floats(resume_fixture *f, float base) {
  for (int i = 0; i < f->rs.count; i++) {
    sbn_nn_entry *e = &f->rs.entries[i];
    if (e->dtype != SBN_DTYPE_FLOAT32) continue;
    for (int64_t k = 0; k < e->numel; k++) ((float *)e->data)[k] = base + 0.001f * (float)(i * 64 + k);
  }
}

static int write_good(const char *dir) {
  resume_fixture f;
  if (resume_fixture_init(&f)) return 1;
  fill_floats(&f, 0.5f);
  for (size_t i = 0; i < sizeof goods / sizeof *goods; i++) {
    const good_seed *g = &goods[i];
    if (strstr(g->name, "_nocrc")) continue; /* make_seeds.py writes it */
    f.rs.v[RESUME_EPOCH] = g->epoch, f.rs.v[RESUME_STEP] = g->step;
    memcpy(f.rs.sums, g->sums, sizeof f.rs.sums);
    *(int64_t *)find(&f, "optimizer.step")->data = g->opt_step;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, g->name);
    if (sbn_nn_save_entries(path, f.rs.entries, f.rs.count) != SBN_STATUS_OK) {
      fprintf(stderr, "%s: %s\n", path, sbn_last_error());
      return 1;
    }
    printf("wrote %s\n", path);
  }
  resume_fixture_free(&f);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--write-good") == 0) return write_good(argv[2]);
  if (argc != 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR | --write-good OUT_DIR\n", argv[0]);
    return 2;
  }
  resume_fixture f;
  if (resume_fixture_init(&f)) return 1;
  int fails = 0;
  char path[1024];
  for (size_t i = 0; i < sizeof goods / sizeof *goods; i++) {
    const good_seed *g = &goods[i];
    size_t len;
    snprintf(path, sizeof path, "%s/%s", argv[1], g->name);
    unsigned char *buf = read_all(path, &len);
    fill_floats(&f, -7.0f); /* not the file's values */
    sbn_status st = buf ? resume_load_memory(&f.rs, buf, len, g->name) : SBN_STATUS_IO_ERROR;
    const float w0 = *(float *)find(&f, "conv1.weight")->data;
    const int ok = st == SBN_STATUS_OK && f.rs.v[RESUME_EPOCH] == g->epoch && f.rs.v[RESUME_STEP] == g->step &&
                   memcmp(f.rs.sums, g->sums, sizeof g->sums) == 0 &&
                   *(int64_t *)find(&f, "optimizer.step")->data == g->opt_step && w0 == 0.5f;
    printf("  %-4s %-32s -> %s: epoch %lld step %lld, conv1.weight[0] %g%s%s\n", ok ? "ok" : "FAIL", g->name,
           sbn_status_string(st), (long long)f.rs.v[RESUME_EPOCH], (long long)f.rs.v[RESUME_STEP], w0,
           st ? ": " : "", st ? train_error() : "");
    fails += !ok;
    free(buf);
  }
  for (size_t i = 0; i < sizeof bads / sizeof *bads; i++) {
    size_t len;
    snprintf(path, sizeof path, "%s/%s", argv[1], bads[i].name);
    unsigned char *buf = read_all(path, &len);
    if (!buf) {
      printf("  FAIL %s: cannot read %s\n", bads[i].name, path);
      fails++;
      continue;
    }
    fill_floats(&f, -7.0f);
    const uint64_t before = resume_fixture_hash(&f);
    sbn_status st = resume_load_memory(&f.rs, buf, len, bads[i].name);
    const char *msg = train_error();
    const int unchanged = resume_fixture_hash(&f) == before;
    const int ok = st != SBN_STATUS_OK && unchanged && strstr(msg, bads[i].expect) != NULL;
    printf("  %-4s %-32s -> %s%s: %.300s\n", ok ? "ok" : "FAIL", bads[i].name, sbn_status_string(st),
           unchanged ? "" : " (state CHANGED)", msg);
    if (!ok) printf("       expected a failure whose message contains \"%s\", state unchanged\n", bads[i].expect);
    fails += !ok;
    free(buf);
  }
  resume_fixture_free(&f);
  printf("%s: %d of %zu cases failed\n", fails ? "FAIL" : "resume validation checks passed", fails,
         sizeof goods / sizeof *goods + sizeof bads / sizeof *bads);
  return fails != 0;
}

/* The resume checkpoint's validation (tools/train/resume.c, what
 * syncbn-train --resume runs) over the checked-in fuzz seeds: each good
 * file loads with its position, each damaged one is refused with a message
 * naming what is wrong, and a refused file changes nothing. Then files
 * written here by the fixture itself (with trainer.config.sgd, which the
 * checked-in seeds of an earlier version lack): a changed momentum is
 * refused naming both values, a changed lr or weight decay loads and is
 * reported, a position past this run's --epochs says so (not "damaged"),
 * a complete run loads as complete, an empty file says it is empty.
 *
 *   test_resume CORPUS_DIR             check tests/fuzz/corpus/resume
 *   test_resume --write-good OUT_DIR   write the good seeds (make fuzz-seeds;
 *                                      tests/fuzz/make_seeds.py damages them) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    /* a consistent file of a longer run: what to do, not "damaged" */
    {"bad_epoch_past_end", "stopped 2 steps into epoch 5, beyond this run's --epochs 3. To train it further, resume "
                           "with --epochs 5 or more"},
    {"bad_epoch_end_with_step", "epoch sums"}, /* seen 8 after 1 step of 4 images: damaged */
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

/* Save the fixture's entries at a position, with the SGD values `sgd` as
 * the file's (this run's run_sgd is restored after), into dir/name. */
static int save_at(resume_fixture *f, const char *dir, const char *name, int64_t epoch, int64_t step,
                   int64_t opt_step, const double *sums, const double *sgd, char *path, size_t cap) {
  const double keep[3] = {f->rs.run_sgd[0], f->rs.run_sgd[1], f->rs.run_sgd[2]};
  f->rs.v[RESUME_EPOCH] = epoch, f->rs.v[RESUME_STEP] = step;
  memcpy(f->rs.sums, sums, sizeof f->rs.sums);
  *(int64_t *)find(f, "optimizer.step")->data = opt_step;
  memcpy(f->rs.run_sgd, sgd, sizeof keep);
  snprintf(path, cap, "%s/%s", dir, name);
  sbn_status st = sbn_nn_save_entries(path, f->rs.entries, f->rs.count);
  memcpy(f->rs.run_sgd, keep, sizeof keep);
  if (st != SBN_STATUS_OK) printf("  FAIL saving %s: %s\n", path, sbn_last_error());
  return st != SBN_STATUS_OK;
}

/* Load `path` into f: expect a refusal whose message holds `expect` and no
 * change, or (expect NULL) success. */
static int load_case(resume_fixture *f, const char *what, const char *path, const char *expect) {
  fill_floats(f, -7.0f);
  const uint64_t before = resume_fixture_hash(f);
  sbn_status st = resume_load(&f->rs, path);
  const char *msg = st != SBN_STATUS_OK ? train_error() : "";
  const int unchanged = resume_fixture_hash(f) == before;
  const int ok = expect ? st != SBN_STATUS_OK && unchanged && strstr(msg, expect) != NULL : st == SBN_STATUS_OK;
  printf("  %-4s %-32s -> %s%s%s%.300s\n", ok ? "ok" : "FAIL", what, sbn_status_string(st),
         expect && !unchanged ? " (state CHANGED)" : "", msg[0] ? ": " : "", msg);
  if (!ok && expect) printf("       expected a failure whose message contains \"%s\", state unchanged\n", expect);
  return !ok;
}

static int written_here(const char *corpus) {
  char dir[] = "/tmp/test_resume_XXXXXX", path[1024], pmom[1024];
  if (!mkdtemp(dir)) return printf("  FAIL mkdtemp\n"), 1;
  int fails = 0;
  resume_fixture f, f0;
  if (resume_fixture_init(&f)) return 1;
  if (resume_fixture_init_momentum(&f0, 0)) return resume_fixture_free(&f), 1;
  const double run[3] = {0.1, 0.9, 0.0}, zero[3] = {0, 0, 0}, part[3] = {3.5, 5, 8}, tail[3] = {1.5, 2, 4};
  fill_floats(&f, 0.5f);

  /* the same options: loads, and records the file's SGD values */
  fails += save_at(&f, dir, "same", 1, 2, 5, part, run, path, sizeof path);
  fails += load_case(&f, "new format, same options", path, NULL);
  if (!f.rs.has_file_sgd || memcmp(f.rs.file_sgd, run, sizeof run))
    printf("  FAIL new format: file_sgd not loaded (has %d: %g %g %g)\n", f.rs.has_file_sgd, f.rs.file_sgd[0],
           f.rs.file_sgd[1], f.rs.file_sgd[2]), fails++;

  /* momentum: the buffers belong to it */
  fails += load_case(&f0, "momentum 0.9 -> 0", path, "--momentum 0.9 (now 0): the optimizer's momentum buffers");
  f.rs.run_sgd[1] = 0.5;
  fails += load_case(&f, "momentum 0.9 -> 0.5", path, "was written by a run with --momentum 0.9 (now 0.5)");
  f.rs.run_sgd[1] = 0.9;
  const double nomom[3] = {0.1, 0, 0};
  fails += save_at(&f0, dir, "nomom", 1, 2, 5, part, nomom, pmom, sizeof pmom);
  fails += load_case(&f, "momentum 0 -> 0.9", pmom, "--momentum 0 (now 0.9)");
  /* an earlier version's file (no trainer.config.sgd): the buffers tell */
  snprintf(path, sizeof path, "%s/good_partial", corpus);
  fails += load_case(&f0, "old format, momentum -> 0", path, "a nonzero --momentum (now 0)");

  /* lr and weight decay: accepted, said, and this run's values kept */
  fails += save_at(&f, dir, "same", 1, 2, 5, part, run, path, sizeof path);
  f.rs.run_sgd[0] = 0.5, f.rs.run_sgd[2] = 1e-3;
  fails += load_case(&f, "lr 0.1 -> 0.5, wd 0 -> 0.001", path, NULL);
  char notes[512] = "";
  FILE *t = tmpfile();
  if (t) {
    resume_print_changes(&f.rs, t);
    rewind(t);
    size_t n = fread(notes, 1, sizeof notes - 1, t);
    notes[n] = 0;
    fclose(t);
  }
  const int said = strstr(notes, "resume: --lr 0.5 (the checkpoint's run had 0.1); the run continues with 0.5\n") &&
                   strstr(notes, "resume: --weight-decay 0.001 (the checkpoint's run had 0); the run continues with "
                                 "0.001\n") && f.rs.run_sgd[0] == 0.5 && f.rs.run_sgd[2] == 1e-3;
  printf("  %-4s %-32s -> run_sgd %g %g %g; said:\n%s", said ? "ok" : "FAIL", "  ... the changes are said",
         f.rs.run_sgd[0], f.rs.run_sgd[1], f.rs.run_sgd[2], notes);
  fails += !said;
  f.rs.run_sgd[0] = 0.1, f.rs.run_sgd[2] = 0;

  /* past this run's --epochs: what to do; complete: loads as complete */
  fails += save_at(&f, dir, "end1", 3, 1, 10, tail, run, path, sizeof path);
  fails += load_case(&f, "epoch 3, step 1 of 3 epochs", path,
                     "holds a run stopped 1 step into epoch 4, beyond this run's --epochs 3. To train it further, "
                     "resume with --epochs 4 or more; to start a new run, leave out --resume");
  fails += save_at(&f, dir, "ep4", 4, 0, 12, zero, run, path, sizeof path);
  fails += load_case(&f, "epoch 4 of 3 epochs", path,
                     "holds a run stopped after 4 complete epochs, beyond this run's --epochs 3. To train it "
                     "further, resume with --epochs 5 or more");
  fails += save_at(&f, dir, "ep1001", 1001, 0, 0, zero, run, path, sizeof path);
  fails += load_case(&f, "epoch 1001 (no run writes it)", path, "(a damaged or foreign checkpoint)");
  fails += save_at(&f, dir, "done", 3, 0, 9, zero, run, path, sizeof path);
  fails += load_case(&f, "complete run", path, NULL);
  if (!resume_complete(&f.rs)) printf("  FAIL complete run: resume_complete() is 0\n"), fails++;
  fails += save_at(&f, dir, "mid", 1, 2, 5, part, run, path, sizeof path);
  fails += load_case(&f, "partial run", path, NULL);
  if (resume_complete(&f.rs)) printf("  FAIL partial run: resume_complete() is 1\n"), fails++;

  /* SGD values no run writes */
  const double nan_lr[3] = {NAN, 0.9, 0};
  fails += save_at(&f, dir, "nanlr", 1, 2, 5, part, nan_lr, path, sizeof path);
  fails += load_case(&f, "trainer.config.sgd lr nan", path, "trainer.config.sgd (lr nan, momentum 0.9");

  /* files that cannot be read: the reason */
  snprintf(path, sizeof path, "%s/empty", dir);
  FILE *e = fopen(path, "wb");
  if (e) fclose(e);
  fails += load_case(&f, "empty file", path, "is empty (0 bytes), not a resume checkpoint");
  snprintf(path, sizeof path, "%s/none", dir);
  fails += load_case(&f, "missing file", path, "No such file or directory");

  const char *names[] = {"same", "nomom", "end1", "ep4", "ep1001", "done", "mid", "nanlr", "empty"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    unlink(path);
  }
  rmdir(dir);
  resume_fixture_free(&f), resume_fixture_free(&f0);
  return fails;
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
  printf("files written here:\n");
  fails += written_here(argv[1]);
  printf("%s: %d cases failed\n", fails ? "FAIL" : "resume validation checks passed", fails);
  return fails != 0;
}

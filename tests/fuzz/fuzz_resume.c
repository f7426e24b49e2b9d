/* libFuzzer target: syncbn-train's resume checkpoint on arbitrary bytes,
 * through resume_load_memory (what --resume runs) into the trainer's model
 * and optimizer (tests/train/resume_fixture.h). A refused file must leave a
 * message and change nothing; an accepted one must hold a position, sums
 * and optimizer step this run can continue from, and the optimizer must
 * then take a step cleanly. Any crash or sanitizer report is a bug. */
#include <stdint.h>
#include <stdlib.h>

#include "resume_fixture.h"
#include "train/fail.h"

static resume_fixture fx;
static int ready;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!ready) {
    if (resume_fixture_init(&fx)) abort();
    ready = 1;
  }
  const uint64_t before = resume_fixture_hash(&fx);
  sbn_status st = resume_load_memory(&fx.rs, data, size, "fuzz input");
  if (st != SBN_STATUS_OK) {
    if (resume_fixture_hash(&fx) != before) abort(); /* a refused file changed the state */
    if (!train_error()[0]) abort();                 /* ... or gave no message */
    return 0;
  }
  const resume_state *rs = &fx.rs;
  const int64_t e = rs->v[RESUME_EPOCH], s = rs->v[RESUME_STEP];
  if (e < 0 || e > rs->epochs || s < 0 || s >= rs->steps_per_epoch) abort(); /* an unreachable position passed */
  for (int i = RESUME_RANKS; i < RESUME_NINT; i++)
    if (rs->v[i] != rs->run[i]) abort(); /* another run's configuration passed */
  /* what the trainer computes from the position next */
  volatile int64_t counter = e * rs->steps_per_epoch + s;
  volatile int64_t left = (rs->epochs - e) * rs->steps_per_epoch - s;
  (void)counter, (void)left;
  if (sbn_nn_sgd_step(fx.sgd) != SBN_STATUS_OK) abort();
  return 0;
}

/* The NCCL constructors of a library built without NCCL (src/comm/nccl.c
 * compiled without SBN_WITH_NCCL, linked here on every machine): programs
 * link, and both constructors answer SBN_STATUS_NOT_BUILT with a message and
 * a NULL group, also when given a real bootstrap group. No nccl.h here, so
 * the entry points are declared by hand. */
#include <stdio.h>
#include <string.h>

#include "syncbn.h"

sbn_status sbn_group_create_nccl_comm(sbn_group **out, const void *comm, size_t comm_size, int device);
sbn_status sbn_group_create_nccl_over(sbn_group **out, sbn_group *bootstrap, int device);

static int check(const char *what, sbn_status st, sbn_group *g) {
  const int ok = st == SBN_STATUS_NOT_BUILT && g == NULL && strstr(sbn_last_error(), "without NCCL");
  printf("%s -> %s (\"%s\"), group %s: %s\n", what, sbn_status_name(st), sbn_last_error(),
         g ? "not NULL" : "NULL", ok ? "ok" : "FAIL");
  return ok;
}

static int rank_fn(sbn_group *world, void *arg) {
  int *ok = arg;
  sbn_group *g = (sbn_group *)&g; /* must be reset to NULL */
  sbn_status st = sbn_group_create_nccl_over(&g, world, 0);
  *ok &= check("sbn_group_create_nccl_over(threads group of 1)", st, g);
  return 0;
}

int main(void) {
  int ok = 1;
  sbn_group *g = (sbn_group *)&g;
  void *fake_comm = &ok;
  sbn_status st = sbn_group_create_nccl_comm(&g, &fake_comm, sizeof fake_comm, 0);
  ok &= check("sbn_group_create_nccl", st, g);
  g = (sbn_group *)&g;
  st = sbn_group_create_nccl_over(&g, NULL, 0);
  ok &= check("sbn_group_create_nccl_over(NULL)", st, g);
  if (sbn_team_run(1, rank_fn, &ok) != SBN_STATUS_OK) ok = 0;
  printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

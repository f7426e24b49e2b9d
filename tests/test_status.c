/* Status table, last-error messages and version. */
#include <string.h>

#include "testutil.h"

int main(void) {
  int bad = 0;
  for (int s = 0; s < SBN_STATUS_COUNT_; s++) {
    const char *name = sbn_status_name((sbn_status)s), *msg = sbn_status_string((sbn_status)s);
    int ok = strncmp(name, "SBN_STATUS_", 11) == 0 && strlen(msg) > 5;
    for (int q = 0; q < s; q++) ok &= strcmp(name, sbn_status_name((sbn_status)q)) != 0;
    printf("  %-28s %s%s\n", name, msg, ok ? "" : "   <- FAIL");
    bad |= !ok;
  }
  bad |= check("SBN_STATUS_OK is 0", SBN_STATUS_OK, 0);
  bad |= check("unknown status has a message",
               strcmp(sbn_status_string((sbn_status)999), "unknown status") != 0, 0);
  bad |= check("runtime version == header version", sbn_version() != SYNCBN_VERSION, 0);
  /* A failing call records a message naming the problem; a good call clears it. */
  sbn_bn *bn = NULL;
  sbn_bn_options o = sbn_bn_options_default(0);
  sbn_status st = sbn_bn_create(&bn, &o, NULL);
  printf("  create with C=0 -> %s: %s\n", sbn_status_name(st), sbn_last_error());
  bad |= check("C=0 rejected with INVALID_ARGUMENT", st != SBN_STATUS_INVALID_ARGUMENT, 0);
  bad |= check("message names num_features", strstr(sbn_last_error(), "num_features") == NULL, 0);
  bad |= check("no layer returned", bn != NULL, 0);
  o.num_features = 3;
  st = sbn_bn_create(&bn, &o, NULL);
  bad |= check("good call succeeds and clears the message", st != SBN_STATUS_OK || sbn_last_error()[0], 0);
  sbn_bn_destroy(bn);
  printf(bad ? "FAILED\n" : "status checks passed\n");
  return bad;
}

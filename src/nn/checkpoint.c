/* Checkpoints of a module tree: its state dict (parameters and buffers under
 * PyTorch's names) in a safetensors file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/file.h"
#include "module.h"
#include "safetensors.h"

sbn_status sbn_nn_save_entries(const char *path, const sbn_nn_entry *entries, int count) {
  sbn_clear_error();
  return sbn_nn_st_save(path, entries, count, "sbn_nn_save_entries");
}

sbn_status sbn_nn_save(const char *path, sbn_module *m) {
  sbn_clear_error();
  if (!m) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_nn_save: module is NULL");
  sbn_nn_entry *e;
  int n;
  sbn_status st = sbn_module_entries(&e, &n, m, SBN_NN_STATE);
  if (st != SBN_STATUS_OK) return st;
  st = sbn_nn_st_save(path, e, n, "sbn_nn_save");
  free(e);
  return st;
}

sbn_status sbn_nn_load_entries(sbn_nn_entry *entries, int count, const void *buf, size_t len, unsigned flags,
                               sbn_nn_load_report *report) {
  sbn_clear_error();
  return sbn_nn_st_load_entries(entries, count, buf, len, flags, report, 0, "sbn_nn_load_entries");
}

sbn_status sbn_nn_load_memory(sbn_module *m, const void *buf, size_t len, unsigned flags, sbn_nn_load_report *report) {
  sbn_clear_error();
  if (report) memset(report, 0, sizeof *report);
  if (!m) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_nn_load: module is NULL");
  sbn_nn_entry *e;
  int n;
  sbn_status st = sbn_module_entries(&e, &n, m, SBN_NN_STATE);
  if (st != SBN_STATUS_OK) return st;
  st = sbn_nn_st_load_entries(e, n, buf, len, flags, report, 1, "sbn_nn_load");
  free(e);
  return st;
}

sbn_status sbn_nn_load(sbn_module *m, const char *path, unsigned flags, sbn_nn_load_report *report) {
  sbn_clear_error();
  if (report) memset(report, 0, sizeof *report);
  if (!m || !path) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_nn_load: NULL argument");
  FILE *fp;
  size_t len;
  sbn_status ost = sbn_open_regular(&fp, &len, path, "sbn_nn_load");
  if (ost != SBN_STATUS_OK) return ost;
  void *buf = malloc(len ? len : 1);
  if (!buf) {
    fclose(fp);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_nn_load: out of memory for %zu bytes", len);
  }
  size_t got = fread(buf, 1, len, fp);
  int err = ferror(fp);
  fclose(fp);
  if (got != len || err) {
    free(buf);
    return sbn_fail(SBN_STATUS_IO_ERROR, "sbn_nn_load: reading %s failed", path);
  }
  sbn_status st = sbn_nn_load_memory(m, buf, len, flags, report);
  if (st != SBN_STATUS_OK) {
    /* Name the file in the message. */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sbn_last_error());
    sbn_fail(st, "%s (file %s)", msg, path);
  }
  free(buf);
  return st;
}

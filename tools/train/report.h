/* What syncbn-train writes at the end: a CSV log and a PNG plot. */
#ifndef SBN_TRAIN_REPORT_H
#define SBN_TRAIN_REPORT_H

#include "trainer.h"

/* Write out_dir/train_log.csv with one row per (mode, epoch). results[i]
 * belongs to modes[i] ("syncbn", "localbn"). Returns 0 on success. */
int report_csv(const char *path, const char *const *modes, const train_result *const *results, int n);
/* Draw the curves with gnuplot into png_path; returns 0 on success, -1 if
 * gnuplot is missing or failed (the CSV is still there). */
int report_plot(const char *png_path, const char *csv_path, const char *title);

#endif

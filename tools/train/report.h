/* What syncbn-train writes: a CSV log appended after every epoch (a run that
 * dies keeps its history) and a PNG plot drawn at the end. */
#ifndef SBN_TRAIN_REPORT_H
#define SBN_TRAIN_REPORT_H

#include "trainer.h"

/* The log's columns. A row is "complete" (an epoch finished, evaluated) or
 * "partial" (the run stopped inside the epoch: loss and train accuracy of
 * the steps run, no test accuracy; resuming finishes the epoch and adds its
 * complete row). */
#define REPORT_CSV_HEADER "mode,epoch,loss,train_acc,test_acc,images_per_s,steps,status"

/* The log's functions return 0, or -1 with the reason in train_error(); a
 * log that is not a regular file (a FIFO would block) is refused at once. */

/* Start a fresh log (header only). */
int report_csv_create(const char *path);
/* Before `mode` resumes at (0-based) epoch `next_epoch`: drop that mode's
 * rows of later epochs and complete rows of next_epoch (from an earlier run
 * that went further), keep everything else. Creates the log if missing. */
int report_csv_trim(const char *path, const char *mode, int next_epoch);
/* Append one row (epoch 1-based) and flush it to the file. */
int report_csv_row(const char *path, const char *mode, int epoch, const epoch_stats *s, int64_t steps, int partial);
/* The statistics of `mode`'s last complete row (of an epoch <= max_epoch)
 * into *s: its epoch (1-based), or 0 when the log (or the file) has none. */
int report_csv_last(const char *path, const char *mode, int max_epoch, epoch_stats *s);
/* Draw the complete rows of the modes in `modes` with gnuplot into png_path.
 * Paths and title reach gnuplot as arguments (gnuplot -c), never as script
 * text. Returns 0, -1 if gnuplot is missing or failed (the CSV is there). */
int report_plot(const char *png_path, const char *csv_path, const char *title, const char *const *modes, int n);

#endif

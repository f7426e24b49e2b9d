#include "report.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fail.h"
#include "file.h"

static int write_failed(const char *path) {
  train_fail(SBN_STATUS_IO_ERROR, "writing %s failed: %s", path, strerror(errno));
  return -1;
}

int report_csv_create(const char *path) {
  FILE *f = train_fopen(path, "w");
  if (!f) return -1;
  fprintf(f, "%s\n", REPORT_CSV_HEADER);
  return fclose(f) == 0 ? 0 : write_failed(path);
}

int report_csv_trim(const char *path, const char *mode, int next_epoch) {
  FILE *f = train_fopen(path, "r");
  if (!f) return errno == ENOENT ? report_csv_create(path) : -1;
  char tmp[4200];
  if (snprintf(tmp, sizeof tmp, "%s.trim", path) >= (int)sizeof tmp)
    return fclose(f), train_fail(SBN_STATUS_IO_ERROR, "%s: path too long", path), -1;
  FILE *o = train_fopen(tmp, "w");
  if (!o) return fclose(f), -1;
  char line[1024];
  size_t ml = strlen(mode);
  int first = 1;
  while (fgets(line, sizeof line, f)) {
    if (first && strncmp(line, "mode,", 5) != 0) fprintf(o, "%s\n", REPORT_CSV_HEADER); /* no header */
    first = 0;
    if (!strncmp(line, mode, ml) && line[ml] == ',') {
      int epoch = atoi(line + ml + 1); /* 1-based */
      int partial = strstr(line, ",partial") != NULL;
      if (epoch > next_epoch + 1 || (epoch == next_epoch + 1 && !partial)) continue;
    }
    fputs(line, o);
  }
  if (first) fprintf(o, "%s\n", REPORT_CSV_HEADER);
  int err = ferror(f);
  fclose(f);
  if (fclose(o) != 0 || err || rename(tmp, path) != 0) return write_failed(path), unlink(tmp), -1;
  return 0;
}

int report_csv_row(const char *path, const char *mode, int epoch, const epoch_stats *s, int64_t steps, int partial) {
  FILE *f = train_fopen(path, "a");
  if (!f) return -1;
  fprintf(f, "%s,%d,%.6f,%.6f,", mode, epoch, s->loss, s->train_acc);
  if (partial) fprintf(f, ",");
  else fprintf(f, "%.6f,", s->test_acc);
  fprintf(f, "%.1f,%lld,%s\n", s->images_per_s, (long long)steps, partial ? "partial" : "complete");
  return fclose(f) == 0 ? 0 : write_failed(path);
}

int report_csv_last(const char *path, const char *mode, int max_epoch, epoch_stats *s) {
  FILE *f = train_fopen(path, "r");
  if (!f) return 0;
  char line[1024], m[64], status[32];
  int found = 0, epoch;
  long long steps;
  epoch_stats e;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "%63[^,],%d,%lf,%lf,%lf,%lf,%lld,%31[a-z]", m, &epoch, &e.loss, &e.train_acc, &e.test_acc,
               &e.images_per_s, &steps, status) == 8 &&
        !strcmp(m, mode) && !strcmp(status, "complete") && epoch >= 1 && epoch <= max_epoch)
      found = epoch, *s = e;
  fclose(f);
  return found;
}

/* The gnuplot script: ARG1 png, ARG2 csv, ARG3 title, ARG4 the modes run
 * (space-separated words). Only complete rows are drawn. */
static const char plot_script[] =
    "set terminal pngcairo size 1000,420 noenhanced\n"
    "set output ARG1\n"
    "set datafile separator ','\n"
    "set datafile missing ''\n"
    "label(m) = m eq 'syncbn' ? 'SyncBN' : 'local BN'\n"
    "sel(m) = (strcol(1) eq m && strcol(8) eq 'complete') ? $2 : NaN\n"
    "set multiplot layout 1,2 title ARG3\n"
    "set xlabel 'epoch'; set xtics 1; set grid; set key bottom right\n"
    "set title 'test accuracy (%)'; set yrange [0:100]\n"
    "plot for [m in ARG4] ARG2 using (sel(m)):($5*100) with linespoints lw 2 title label(m)\n"
    "set title 'training loss'; set autoscale y; set key top right\n"
    "plot for [m in ARG4] ARG2 using (sel(m)):3 with linespoints lw 2 title label(m)\n"
    "unset multiplot\n";

int report_plot(const char *png_path, const char *csv_path, const char *title, const char *const *modes, int n) {
  char words[64] = "";
  for (int i = 0; i < n; i++) {
    if (strlen(words) + strlen(modes[i]) + 2 > sizeof words) return -1;
    if (i) strcat(words, " ");
    strcat(words, modes[i]);
  }
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return close(fds[0]), close(fds[1]), -1;
  if (pid == 0) { /* gnuplot reads the script from the pipe; data as arguments */
    dup2(fds[0], 0);
    close(fds[0]), close(fds[1]);
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, 1), dup2(devnull, 2);
    const char *gp = getenv("SYNCBN_GNUPLOT"); /* another gnuplot (or a test's stand-in) */
    if (!gp || !*gp) gp = "gnuplot";
    execlp(gp, gp, "-c", "/dev/stdin", png_path, csv_path, title, words, (char *)NULL);
    _exit(127);
  }
  close(fds[0]);
  size_t len = sizeof plot_script - 1;
  int werr = write(fds[1], plot_script, len) != (ssize_t)len;
  close(fds[1]);
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return !werr && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

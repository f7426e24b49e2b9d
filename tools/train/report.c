#include "report.h"

#include <stdio.h>
#include <stdlib.h>

int report_csv(const char *path, const char *const *modes, const train_result *const *results, int n) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f, "mode,epoch,loss,train_acc,test_acc,images_per_s\n");
  for (int i = 0; i < n; i++)
    for (int e = 0; e < results[i]->epochs_done; e++) {
      const epoch_stats *s = &results[i]->epoch[e];
      fprintf(f, "%s,%d,%.6f,%.6f,%.6f,%.1f\n", modes[i], e + 1, s->loss, s->train_acc, s->test_acc, s->images_per_s);
    }
  return fclose(f) == 0 ? 0 : -1;
}

int report_plot(const char *png_path, const char *csv_path, const char *title) {
  if (system("command -v gnuplot >/dev/null 2>&1") != 0) return -1;
  FILE *g = popen("gnuplot 2>/dev/null", "w");
  if (!g) return -1;
  fprintf(g,
          "set terminal pngcairo size 1000,420 noenhanced\n"
          "set output '%s'\n"
          "set datafile separator ','\n"
          "set multiplot layout 1,2 title '%s'\n"
          "set xlabel 'epoch'; set xtics 1; set grid; set key bottom right\n"
          "set title 'test accuracy (%%)'; set yrange [0:100]\n"
          "plot '%s' using (strcol(1) eq 'syncbn' ? $2 : NaN):($5*100) with linespoints lw 2 title 'SyncBN', "
          "'' using (strcol(1) eq 'localbn' ? $2 : NaN):($5*100) with linespoints lw 2 title 'local BN'\n"
          "set title 'training loss'; set autoscale y; set key top right\n"
          "plot '%s' using (strcol(1) eq 'syncbn' ? $2 : NaN):3 with linespoints lw 2 title 'SyncBN', "
          "'' using (strcol(1) eq 'localbn' ? $2 : NaN):3 with linespoints lw 2 title 'local BN'\n"
          "unset multiplot\n",
          png_path, title, csv_path, csv_path);
  return pclose(g) == 0 ? 0 : -1;
}

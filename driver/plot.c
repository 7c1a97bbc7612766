/* plot.c: cavs plot, a training log's curves as a PNG drawn by gnuplot. The log (the
 * JSON lines of `cavs train --log`) is read strictly, as any file from someone else:
 * each line one record of known fields, numbers finite or null, nothing else. The
 * numbers go to gnuplot through a data file, never through its script; the script is
 * written by us and names only files we made, and gnuplot runs without a shell. The
 * picture is written whole or not at all (afile.c), so a failed plot leaves no partial
 * PNG, and never over the log it reads. */
#include "afile.h"
#include "driver.h"
#include "options.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* the columns of the data file, in the order of the log's keys */
static const char *const keys[] = {"epoch", "train_loss", "train_acc", "dev_loss", "dev_acc", "dev_root_acc"};
enum { NKEYS = sizeof keys / sizeof *keys };

/* The value of "key": in one line of the log, or die naming the line. A missing key or
   null is NAN (gnuplot leaves the point out); the epoch must be there. */
static double field(const char *line, const char *key, const char *path, long lineno) {
  char pat[40];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *p = strstr(line, pat);
  if (!p) {
    if (!strcmp(key, "epoch")) die(1, "%s:%ld: error: a record without \"epoch\"", path, lineno);
    return NAN;
  }
  p += strlen(pat);
  if (!strncmp(p, "null", 4)) return NAN;
  char *end;
  double x = strtod(p, &end);
  if (end == p || !isfinite(x) || (*end != ',' && *end != '}'))
    die(1, "%s:%ld:%ld: error: \"%s\" is not a number or null", path, lineno, (long)(p - line) + 1, key);
  return x;
}

static void remove_all(char *dir, const char *const *names, int n) {
  for (int i = 0; i < n; i++) unlink(fmt("%s/%s", dir, names[i]));
  rmdir(dir);
}

int cmd_plot(int argc, char **argv) {
  const char *out = NULL, *log = NULL;
  static const struct option lo[] = {{"output", 1, 0, 'o'}, {0, 0, 0, 0}};
  /* LOG and -o FILE (--output FILE, --output=FILE), in any order */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
      if (i + 1 == argc) die(1, "plot: option '%s' needs a value", a);
      out = argv[++i];
    } else if (!strncmp(a, "--output=", 9)) out = a + 9;
    else if (a[0] == '-' && a[1]) {
      opterr = 0;
      opt_complain("cavs", "plot", a, lo);
      exit(1);
    } else if (log) die(1, "plot: unexpected argument '%s'", a);
    else log = a;
  }
  if (!log || !out) die(1, "plot: usage: cavs plot LOG -o FILE.png");
  const char *inputs[] = {log}, *what[] = {"the log"};
  check_output("o", out, inputs, what, 1);
  FILE *in = fopen(log, "r");
  if (!in) die(1, "cannot read '%s': %s", log, strerror(errno));
  char dir[] = "/tmp/cavs-plot-XXXXXX";
  if (!mkdtemp(dir)) die(1, "cannot make a temporary directory: %s", strerror(errno));
  static const char *const made[] = {"data", "script", "out.png"};
  FILE *data = fopen(fmt("%s/data", dir), "w");
  if (!data) {
    remove_all(dir, made, 3);
    die(1, "cannot write in '%s': %s", dir, strerror(errno));
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  long lineno = 0, records = 0;
  bool acc = false, dev = false;
  while ((len = getline(&line, &cap, in)) > 0) {
    lineno++;
    if (len > 65536 || memchr(line, 0, (size_t)len)) {
      remove_all(dir, made, 3);
      die(1, "%s:%ld: error: not a line of a training log", log, lineno);
    }
    if (strspn(line, " \t\r\n") == (size_t)len) continue;
    if (line[0] != '{' || !strchr(line, '}')) {
      remove_all(dir, made, 3);
      die(1, "%s:%ld: error: not a record (a training log has one JSON object a line)", log, lineno);
    }
    for (int k = 0; k < NKEYS; k++) {
      double x = field(line, keys[k], log, lineno);
      acc |= k == 2 && !isnan(x);
      dev |= k == 3 && !isnan(x);
      fprintf(data, k ? " %.9g" : "%.9g", x);
    }
    fputc('\n', data);
    records++;
  }
  free(line);
  fclose(in);
  if (!records) {
    remove_all(dir, made, 3);
    die(1, "%s: error: no records", log);
  }
  if (fclose(data)) {
    remove_all(dir, made, 3);
    die(1, "cannot write in '%s': %s", dir, strerror(errno));
  }
  /* the script: loss on the left, accuracy (for a classifier) on the right */
  FILE *s = fopen(fmt("%s/script", dir), "w");
  if (!s) {
    remove_all(dir, made, 3);
    die(1, "cannot write in '%s': %s", dir, strerror(errno));
  }
  fprintf(s, "set terminal png size %d,480\nset output '%s/out.png'\nset datafile missing 'nan'\n", acc ? 1100 : 640,
          dir);
  fprintf(s, "set key bottom left\nset grid\nset xlabel 'epoch'\n%s", records <= 20 ? "set xtics 1\n" : "");
  if (acc) fprintf(s, "set multiplot layout 1,2\n");
  fprintf(s, "set ylabel 'loss'\nplot '%s/data' using 1:2 with linespoints title 'train loss'%s\n", dir,
          dev ? fmt(", '' using 1:4 with linespoints title 'dev loss'") : "");
  if (acc) {
    fprintf(s, "set key bottom right\nset ylabel 'accuracy'\nplot '%s/data' using 1:3 with linespoints title 'train'", dir);
    if (dev) fprintf(s, ", '' using 1:5 with linespoints title 'dev (all vertices)', '' using 1:6 with linespoints title 'dev (roots)'");
    fprintf(s, "\nunset multiplot\n");
  }
  if (fclose(s)) {
    remove_all(dir, made, 3);
    die(1, "cannot write in '%s': %s", dir, strerror(errno));
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 1);
    execlp("gnuplot", "gnuplot", fmt("%s/script", dir), (char *)NULL);
    fprintf(stderr, "cavs: plot: cannot run gnuplot: %s (Debian: apt-get install gnuplot-nox)\n", strerror(errno));
    _exit(127);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
    remove_all(dir, made, 3);
    die(1, "plot: gnuplot failed%s", pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 127 ? "" : " (see above)");
  }
  /* into place, whole (afile.c) */
  cv_afile a;
  char err[1024];
  FILE *png = fopen(fmt("%s/out.png", dir), "rb");
  bool okay = png && !cv_afile_open(&a, out, false, err, sizeof err);
  if (!png) snprintf(err, sizeof err, "cannot read what gnuplot drew: %s", strerror(errno));
  char buf[65536];
  size_t n;
  while (okay && (n = fread(buf, 1, sizeof buf, png)) > 0) okay = !cv_afile_write(&a, buf, n, err, sizeof err);
  if (okay && ferror(png)) {
    cv_afile_abort(&a);
    snprintf(err, sizeof err, "cannot read what gnuplot drew");
    okay = false;
  }
  if (png) fclose(png);
  okay = okay && !cv_afile_commit(&a, err, sizeof err);
  remove_all(dir, made, 3);
  if (!okay) die(1, "%s", err);
  return 0;
}

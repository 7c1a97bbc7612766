/* plot.c: cavs plot, a training log's curves as a PNG drawn by gnuplot. The log (the
 * JSON lines of `cavs train --log`) is read as any file from someone else, through
 * jansson: a sequence of JSON objects, one a line as cavs writes them or spread over
 * lines (pretty-printed), keys in any order, unknown keys passed over; anything that is
 * not JSON is an error naming its line and column, and the known fields must be numbers
 * or null. The numbers go to gnuplot through a data file, never through its script; the
 * script is written by us and names only files we made, and gnuplot runs without a
 * shell. The picture is written whole or not at all (afile.c), so a failed plot leaves
 * no partial PNG, and never over the log it reads. */
#include "afile.h"
#include "cache.h"
#include "driver.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* the columns of the data file, in the order of the log's keys */
static const char *const keys[] = {"epoch", "train_loss", "train_acc", "dev_loss", "dev_acc", "dev_root_acc"};
enum { NKEYS = sizeof keys / sizeof *keys };
/* the most a log may hold: 10^6 epochs of records are about 250 MB */
#define LOG_MAX (1L << 30)

typedef struct Log {
  const char *path;
  char *text;
  size_t len;
  double *rows; /* NKEYS numbers a record, NAN for null or missing (static: reachable) */
  long nrows, cap;
  long replaced; /* rows of a history the log's later records went back on */
  bool acc, dev; /* some record has a train accuracy, a dev loss */
} Log;

/* The whole log, at most LOG_MAX bytes (it may be a pipe or a device). */
static void read_log(Log *g) {
  FILE *f = fopen(g->path, "rb");
  if (!f) die(file_status(errno), "cannot read '%s': %s", g->path, strerror(errno));
  size_t cap = 1 << 16, got;
  char *text = malloc(cap + 1);
  if (!text) die(2, "out of memory");
  while ((got = fread(text + g->len, 1, cap - g->len, f)) > 0) {
    g->len += got;
    if (g->len < cap) continue;
    if (cap > LOG_MAX) die(1, "%s: error: larger than %ld bytes, not a training log", g->path, LOG_MAX);
    char *t = realloc(text, (cap *= 2) + 1);
    if (!t) die(2, "out of memory reading '%s'", g->path);
    text = t;
  }
  bool bad = ferror(f);
  fclose(f);
  if (bad) die(1, "cannot read '%s'", g->path);
  text[g->len] = 0;
  g->text = keep(text);
}

/* Line and column (from 1, in bytes) of the byte at `at`. */
static void position(const Log *g, size_t at, long *line, long *col) {
  *line = 1, *col = 1;
  for (size_t i = 0; i < at && i < g->len; i++) {
    if (g->text[i] == '\n') ++*line, *col = 1;
    else ++*col;
  }
}

/* the record read last, held here until the next (so that a die() leaves it reachable) */
static json_t *record;

/* The record that starts at *off (white space skipped), or NULL at the end of the log;
   *line is the line it starts on. What is not JSON dies at the place jansson stopped:
   the last byte it read. Duplicate keys are refused: which "dev_acc" would count? */
static json_t *next_record(const Log *g, size_t *off, long *line) {
  *off += strspn(g->text + *off, " \t\r\n");
  if (*off >= g->len) return NULL;
  long col;
  position(g, *off, line, &col);
  json_error_t e;
  size_t flags = JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL;
  json_t *rec = json_read(g->text + *off, g->len - *off, flags, &e);
  if (!rec) {
    long eline, ecol;
    position(g, *off + (size_t)(e.position > 0 ? e.position - 1 : 0), &eline, &ecol);
    /* (jansson's text quotes the log: shown escaped) */
    fprintf(stderr, "%s: %s:%ld:%ld: error: not JSON: %s\n", prog, g->path, eline, ecol, shown(e.text, strlen(e.text)));
    if (eline != *line) fprintf(stderr, "%s: %s:%ld:%ld: note: the record begins here\n", prog, g->path, *line, col);
    exit(1);
  }
  *off += (size_t)e.position;
  if (!json_is_object(rec)) die(1, "%s:%ld:%ld: error: not a record (a training log holds JSON objects)", g->path, *line, col);
  json_decref(record);
  return record = rec;
}

/* One record's row: each known field a number or null (NAN: gnuplot leaves the point
   out), the epoch a number. A record whose epoch is not after the last row's begins a
   history of its own (a run resumed from an earlier checkpoint, or after a save that
   failed, or another run appended): the rows of that epoch and after are the earlier
   history's, which the training went back on, and the new ones take their place. */
static void add_row(Log *g, const json_t *rec, long line) {
  json_t *ep = json_object_get(rec, keys[0]);
  if (!json_is_number(ep)) die(1, "%s:%ld: error: a record without a number for \"epoch\"", g->path, line);
  double epoch = json_number_value(ep);
  while (g->nrows && !(g->rows[NKEYS * (g->nrows - 1)] < epoch)) g->nrows--, g->replaced++;
  if (g->nrows == g->cap) {
    g->cap = g->cap ? 2 * g->cap : 16;
    double *rows = realloc(g->rows, sizeof(double) * NKEYS * (size_t)g->cap);
    if (!rows) die(2, "out of memory");
    g->rows = rows;
  }
  double *row = g->rows + NKEYS * g->nrows++;
  for (int k = 0; k < NKEYS; k++) {
    json_t *v = json_object_get(rec, keys[k]);
    if (v && !json_is_null(v) && !json_is_number(v))
      die(1, "%s:%ld: error: \"%s\" is not a number or null", g->path, line, keys[k]);
    row[k] = v && json_is_number(v) ? json_number_value(v) : NAN;
  }
  g->acc |= !isnan(row[2]);
  g->dev |= !isnan(row[3]);
}

static void remove_all(char *dir, const char *const *names, int n) {
  for (int i = 0; i < n; i++) unlink(fmt("%s/%s", dir, names[i]));
  rmdir(dir);
}

/* Closes f, written: false with errno where a write failed, earlier or at the close (a
   failed write in the middle, the rest written after it, left a file with a hole that
   the close alone did not report, and gnuplot drew what was left) */
static bool closed_whole(FILE *f) {
  bool whole = !ferror(f);
  int e = errno ? errno : EIO;
  if (fclose(f)) return false;
  if (!whole) errno = e;
  return whole;
}

/* The data file: a row a record, "nan" where gnuplot leaves the point out. */
static bool write_data(const Log *g, const char *path) {
  FILE *data = fopen(path, "w");
  if (!data) return false;
  errno = 0;
  for (long r = 0; r < g->nrows; r++)
    for (int k = 0; k < NKEYS; k++) fprintf(data, k ? " %.17g%s" : "%.17g%s", g->rows[NKEYS * r + k], k == NKEYS - 1 ? "\n" : "");
  return closed_whole(data);
}

/* The script: loss on the left, accuracy (for a classifier) on the right. */
static bool write_script(const Log *g, const char *dir) {
  FILE *s = fopen(fmt("%s/script", dir), "w");
  if (!s) return false;
  errno = 0;
  fprintf(s, "set terminal png size %d,480\nset output '%s/out.png'\nset datafile missing 'nan'\n", g->acc ? 1100 : 640,
          dir);
  fprintf(s, "set key bottom left\nset grid\nset xlabel 'epoch'\n%s", g->nrows <= 20 ? "set xtics 1\n" : "");
  if (g->acc) fprintf(s, "set multiplot layout 1,2\n");
  fprintf(s, "set ylabel 'loss'\nplot '%s/data' using 1:2 with linespoints title 'train loss'%s\n", dir,
          g->dev ? ", '' using 1:4 with linespoints title 'dev loss'" : "");
  if (g->acc) {
    fprintf(s, "set key bottom right\nset ylabel 'accuracy'\nplot '%s/data' using 1:3 with linespoints title 'train'", dir);
    if (g->dev) fprintf(s, ", '' using 1:5 with linespoints title 'dev (all vertices)', '' using 1:6 with linespoints title 'dev (roots)'");
    fprintf(s, "\nunset multiplot\n");
  }
  return closed_whole(s);
}

/* gnuplot on the script, without a shell; NULL, or what went wrong. */
/* A plot killed (SIGINT, SIGTERM, SIGHUP) while its temporary directory is there stops
   gnuplot, waits for it, removes the directory's files and the directory, and dies of
   the signal as it would have: nothing of it is left in $TMPDIR. (SIGKILL no process
   can catch: the next plot removes what it left, whose lock died with it.) The paths
   are set before the handler is: it only unlinks, kills and waits, which a signal
   handler may. */
static char kill_paths[4][3200]; /* the directory's three files, then the directory */
static volatile sig_atomic_t gnuplot_pid;

static void on_kill(int sig) {
  pid_t pid = (pid_t)gnuplot_pid;
  if (pid > 0 && kill(pid, SIGTERM) == 0) waitpid(pid, NULL, 0);
  for (int i = 0; i < 3; i++) unlink(kill_paths[i]);
  rmdir(kill_paths[3]);
  raise(sig); /* (SA_RESETHAND: the default action now, unblocked on return) */
}

static void remove_when_killed(const char *dir, const char *const *names) {
  for (int i = 0; i < 3; i++) snprintf(kill_paths[i], sizeof kill_paths[i], "%s/%s", dir, names[i]);
  snprintf(kill_paths[3], sizeof kill_paths[3], "%s", dir);
  struct sigaction sa = {.sa_handler = on_kill, .sa_flags = SA_RESETHAND};
  sigemptyset(&sa.sa_mask);
  const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 3; i++) sigaddset(&sa.sa_mask, sigs[i]);
  for (int i = 0; i < 3; i++) sigaction(sigs[i], &sa, NULL);
}

static const char *run_gnuplot(const char *dir) {
  fflush(stdout);
  pid_t pid = fork();
  gnuplot_pid = pid;
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 1);
    execlp("gnuplot", "gnuplot", fmt("%s/script", dir), (char *)NULL);
    fprintf(stderr, "cavs: plot: cannot run gnuplot: %s (Debian: apt-get install gnuplot-nox)\n", strerror(errno));
    _exit(127);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
    return pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 127 ? "plot: gnuplot failed" : "plot: gnuplot failed (see above)";
  return NULL;
}

/* What gnuplot drew, into place whole (afile.c); false with err said. */
static bool install_png(const char *dir, const char *out, char *err, size_t errlen) {
  cv_afile a;
  FILE *png = fopen(fmt("%s/out.png", dir), "rb");
  bool okay = png && !cv_afile_open(&a, out, CV_AFILE_USER, err, errlen);
  if (!png) snprintf(err, errlen, "cannot read what gnuplot drew: %s", strerror(errno));
  char buf[65536];
  size_t n;
  while (okay && (n = fread(buf, 1, sizeof buf, png)) > 0) okay = !cv_afile_write(&a, buf, n, err, errlen);
  if (okay && ferror(png)) {
    cv_afile_abort(&a);
    snprintf(err, errlen, "cannot read what gnuplot drew");
    okay = false;
  }
  if (png) fclose(png);
  return okay && !cv_afile_commit(&a, err, errlen);
}

int cmd_plot(int argc, char **argv) {
  const char *out = NULL;
  static Log g;
  /* LOG and -o FILE (--output FILE, --output=FILE, --out FILE), in any order */
  optind = 0;
  for (int ch; (ch = next_option(argc, argv, CMD_PLOT)) != -1;) {
    if (ch == OPT_OUTPUT) out = optarg;
    else if (g.path) die(1, "plot: unexpected argument '%s'", optarg);
    else g.path = optarg;
  }
  for (; optind < argc; optind++) {
    if (g.path) die(1, "plot: unexpected argument '%s'", argv[optind]);
    g.path = argv[optind];
  }
  if (!g.path || !out) die(1, "plot: usage: cavs plot LOG -o FILE.png");
  const char *inputs[] = {g.path}, *what[] = {"the log"};
  check_output("o", out, inputs, what, 1);
  read_log(&g);
  if (g.len >= 3 && !memcmp(g.text, "\xef\xbb\xbf", 3)) g.text[0] = g.text[1] = g.text[2] = ' '; /* a UTF-8 BOM */
  size_t off = 0;
  long line;
  for (json_t *rec; (rec = next_record(&g, &off, &line));) add_row(&g, rec, line);
  json_decref(record);
  record = NULL;
  if (!g.nrows) die(1, "%s: error: no records", g.path);
  if (g.replaced)
    fprintf(stderr, "%s: %s: note: %ld record%s not drawn: a later record went back to %s epoch (a run resumed "
            "from an earlier checkpoint, or another run appended)\n", prog, g.path, g.replaced,
            g.replaced == 1 ? "" : "s", g.replaced == 1 ? "its" : "their");
  /* in $TMPDIR where it is a plain absolute path (gnuplot's script quotes it: no quote,
     newline or other character that would need escaping there), else /tmp */
  const char *tmpdir = getenv("TMPDIR");
  if (!tmpdir || tmpdir[0] != '/' ||
      strspn(tmpdir, "/._-+0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") != strlen(tmpdir) ||
      strlen(tmpdir) > 3000)
    tmpdir = "/tmp";
  /* a directory locked while this process lives, so that what a plot killed by SIGKILL
     left is removed by the next one (cache.c's build directories are made so) */
  sweep_temp_dirs(tmpdir, "plot");
  char *dir = NULL, why[1024];
  int lock = lock_temp_dir(tmpdir, "plot", &dir, why, sizeof why); /* (held until the end) */
  if (lock < 0) die(1, "plot: %s", why);
  keep(dir); /* (cache.c's malloc: kept reachable as fmt's are, however the command ends) */
  static const char *const made[] = {"data", "script", "out.png"};
  remove_when_killed(dir, made); /* (tmpdir is at most 3000 bytes) */
  if (!write_data(&g, fmt("%s/data", dir)) || !write_script(&g, dir)) {
    int e = errno;
    remove_all(dir, made, 3);
    die(file_status(e), "cannot write in '%s': %s", dir, strerror(e));
  }
  const char *failed = run_gnuplot(dir);
  char err[1024];
  bool okay = !failed && install_png(dir, out, err, sizeof err);
  int e = errno; /* (memory run out: status 2, as cavs(1) says) */
  remove_all(dir, made, 3);
  close(lock);
  if (failed) die(1, "%s", failed);
  if (!okay) die(file_status(e), "%s", err);
  return 0;
}

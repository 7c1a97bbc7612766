/* util.c: what every command of the `cavs` command leans on: dying with a message and
 * the right status, the keep list that holds what a command allocates until it exits,
 * whole files read into memory, JSON written through jansson, and the checks an output
 * path passes before a run writes anything. */
#include "driver.h"
#include "afile.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *prog = "cavs";
void (*die_hook)(int status);
const char *rank_tag = "";
int main_argc;
const char *const *main_argv;
cavs_model_opts model_opts;
int model_ablations, model_policy = CAVS_BFS;
const char *model_precision; /* NULL: float */
int build_ablations;

_Noreturn void die(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", prog);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  quit(status);
}

_Noreturn void quit(int status) {
  if (die_hook) die_hook(status);
  exit(status);
}

double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A failure reported by libcavs: exit status 2 when memory ran out or the device failed
 * (the library sets errno to ENOMEM or EIO; errno is cleared before each call), 1 for
 * anything else. */
_Noreturn void lib_die(const char *msg) { die(errno == ENOMEM || errno == EIO ? 2 : 1, "%s", msg); }

/* The checkpoint's vocabulary, kept, or the command's end: memory run out (status 2) or
 * a damaged vocabulary (1). */
cavs_vocab *ckpt_vocab(const cavs_ckpt *k, const char *path) {
  errno = 0;
  cavs_vocab *v = keep(cavs_ckpt_vocab(k));
  if (!v && errno == ENOMEM) die(2, "out of memory reading '%s'", path);
  if (!v) die(1, "%s: damaged vocabulary", path);
  return v;
}

/* ---- the keep list ---- */

/* What the command allocates lives until it exits, as the compiler's arena does: each
 * block is kept in this list, so that it stays reachable however the command ends (a
 * die() deep in a call included), and the leak checker of the sanitizer build sees no
 * leak. The large blocks (datasets, the model) are still freed when a command is done
 * with them; a freed block left in the list is never touched again. */
static void **kept;
static size_t nkept, capkept;

void *keep(void *p) {
  if (!p) return NULL;
  if (nkept == capkept) {
    size_t cap = capkept ? 2 * capkept : 256;
    void **k = realloc(kept, cap * sizeof *k);
    if (!k) die(2, "out of memory");
    kept = k;
    capkept = cap;
  }
  kept[nkept++] = p;
  return p;
}

void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) die(2, "out of memory");
  return keep(p);
}

char *xstrdup(const char *s) {
  char *p = strdup(s);
  if (!p) die(2, "out of memory");
  return keep(p);
}

char *fmt(const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  char *s = NULL;
  if (vasprintf(&s, f, ap) < 0) die(2, "out of memory");
  va_end(ap);
  return keep(s);
}

/* ---- files ---- */

char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0, got;
  char *buf = malloc(cap + 1);
  if (!buf) die(2, "out of memory");
  while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n < cap) continue;
    char *b = realloc(buf, (cap *= 2) + 1);
    if (!b) die(2, "out of memory reading '%s'", path);
    buf = b;
  }
  fclose(f);
  buf[n] = 0;
  if (len) *len = n;
  return keep(buf);
}

bool exists(const char *path) { return access(path, F_OK) == 0; }
bool lm_format(const char *f) {
  return !strcmp(f, "text") || !strcmp(f, "text-bptt") || !strncmp(f, "text-bptt:", 10);
}

int bptt_state = BPTT_DEFAULT;
bool carries(const char *f) {
  bool bptt = !strcmp(f, "text-bptt") || !strncmp(f, "text-bptt:", 10);
  if (bptt_state == BPTT_CARRY && !bptt)
    die(1, "--bptt-state carry: the graphs of format %s do not continue one another (text-bptt's chunks do)", f);
  return bptt && bptt_state != BPTT_RESET;
}

void bptt_as_saved(const cavs_train_state *cs) {
  if (bptt_state == BPTT_DEFAULT && cs->bptt_state == CAVS_BPTT_RESET) bptt_state = BPTT_RESET;
}

int *stream_order(int n, int batch) {
  int *order = xmalloc(sizeof(int) * (size_t)(n ? n : 1));
  int per = n / batch, extra = n % batch;
  for (int s = 0, start = 0; s < batch && start < n; s++) {
    int len = per + (s < extra);
    for (int j = 0; j < len; j++) order[j * batch + s] = start + j;
    start += len;
  }
  return order;
}

/* ---- JSON, through jansson ---- */

/* JSON has no NaN or infinity (jansson's json_real refuses them): such a value, a loss
   that diverged or a speed over no time, is written null. */
json_t *json_num(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* Into an object or an array; jansson returns -1 only when memory ran out (a value or
   the container NULL), and a record short of a field is never written. */
void json_set(json_t *obj, const char *key, json_t *v) {
  if (json_object_set_new(obj, key, v)) die(2, "out of memory");
}

void json_push(json_t *arr, json_t *v) {
  if (json_array_append_new(arr, v)) die(2, "out of memory");
}

/* jansson's allocations, watched. Its parser takes one that failed for a syntax error (a
 * string's copy: "invalid token") or lets it by (a token's text saved short: a number or
 * a name read wrong), so a parse during which one failed is memory run out, whatever
 * it returned. */
static bool json_starved;

static void *json_malloc_watched(size_t n) {
  void *p = malloc(n);
  if (!p) json_starved = true;
  return p;
}

void json_watch(void) { json_set_alloc_funcs(json_malloc_watched, free); }

json_t *json_read(const char *text, size_t n, size_t flags, json_error_t *e) {
  json_starved = false;
  json_t *j = json_loadb(text, n, flags, e);
  if (json_starved) {
    json_decref(j);
    die(2, "out of memory");
  }
  return j;
}

/* json_dumps(j, flags), checked: jansson 2.14's dump lets a key's failed write by (a
 * malloc failing as its buffer grows), and returns the rest, a record with a hole; so
 * the text is read back and must be j. Memory run out, on either way: status 2. */
char *json_text(const json_t *j, size_t flags) {
  char *text = json_dumps(j, flags); /* (jansson's malloc: freed with free) */
  json_t *back = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
  bool same = back && json_equal(back, (json_t *)j);
  json_decref(back);
  if (!same) {
    free(text);
    die(2, "out of memory");
  }
  return text;
}

/* jansson writes each real with 17 significant digits, which read back to the same
   double, and escapes every string; keys come out in the order they were set. The
   record is made in memory and written with its end of line at once: json_dumpf wrote
   it to the stream a piece at a time and let a key's failed write by, so that a full
   disk left a record with a hole in the log and the run went on. In a file of the
   process's own on a disk (a --log; not standard output or error, whose stream other
   lines share) it goes straight to the descriptor, and a line the disk took only part
   of is cut off again: the log stays a JSON record a line for what reads it (cavs plot,
   a resume), whatever the failure left. */
int json_put_line(json_t *obj, FILE *f, int *cut_error) {
  char *text = json_text(obj, 0);
  json_decref(obj);
  size_t len = strlen(text);
  char *line = realloc(text, len + 2);
  if (!line) {
    free(text);
    die(2, "out of memory");
  }
  line[len++] = '\n';
  line[len] = 0;
  struct stat st;
  int fd = fileno(f), e = 0, cut = 0;
  if (f != stdout && f != stderr && fd >= 0 && !fstat(fd, &st) && S_ISREG(st.st_mode)) {
    /* (the stream's buffer is empty: open_log flushed what it wrote, and the lines go here) */
    for (size_t done = 0; done < len && !e;) {
      ssize_t w = write(fd, line + done, len - done);
      if (w > 0) done += (size_t)w;
      else if (w == 0 || errno != EINTR) e = w < 0 ? errno : ENOSPC;
    }
    /* (appended to at its end: where the line began) */
    if (e && ftruncate(fd, st.st_size)) cut = errno;
  } else {
    errno = 0;
    if (fputs(line, f) == EOF || fflush(f) || ferror(f)) e = errno ? errno : EIO;
  }
  free(line);
  *cut_error = cut;
  return e;
}

void json_write_line(json_t *obj, FILE *f, const char *what) {
  int cut, e = json_put_line(obj, f, &cut);
  /* a second fault, the part written not cut off again: the torn line said (--resume
     cuts it off, open_log) */
  if (e && cut)
    die(file_status(e),
        "cannot write %s: %s; the line written in part could not be cut off (%s): a run resumed cuts it off", what,
        strerror(e), strerror(cut));
  if (e) die(file_status(e), "cannot write %s: %s", what, strerror(e));
}

/* ---- outputs ---- */

/* The path with its directory resolved (the file itself need not exist yet). */
static char *canon(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? fmt("%.*s", (int)(slash - path), path) : xstrdup(".");
  char *real = realpath(*dir ? dir : "/", NULL);
  char *c = real ? fmt("%s/%s", real, slash ? slash + 1 : path) : xstrdup(path);
  free(real);
  free(dir);
  return c;
}

static bool same_file(const char *a, const char *b) {
  struct stat sa, sb;
  if (stat(a, &sa) == 0 && stat(b, &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  char *ca = canon(a), *cb = canon(b);
  bool same = !strcmp(ca, cb);
  free(ca);
  free(cb);
  return same;
}

/* An output of this run (--save, --log) must not be one of its inputs, nor a directory
 * or another file that is not a regular one but a FIFO or a character device (written
 * straight to), and the directory of the file it replaces (its links followed, as the
 * save follows them: afile.h's CV_AFILE_USER) must take a new file: found out before
 * training, not after an epoch. */
void check_output(const char *opt, const char *out, const char *const *inputs, const char *const *what, int n) {
  struct stat so;
  const char *dash = opt[1] ? "--" : "-"; /* -o, --save */
  if (stat(out, &so) == 0 && S_ISDIR(so.st_mode)) die(1, "%s%s %s: it is a directory", dash, opt, out);
  for (int i = 0; i < n; i++)
    if (inputs[i] && same_file(out, inputs[i])) die(1, "%s%s %s would overwrite %s, %s", dash, opt, out, inputs[i], what[i]);
  char *target, err[1024];
  bool direct;
  errno = 0;
  if (cv_afile_target(out, &target, &direct, err, sizeof err)) die(file_status(errno), "%s%s: %s", dash, opt, err);
  const char *slash = strrchr(target, '/');
  /* the probe a file without a name (O_TMPFILE), which nothing can leave behind however
     this process dies; where the filesystem has none, a named one removed at once */
  int fd = -2;
  if (!direct) {
    char *d = slash ? fmt("%.*s", slash == target ? 1 : (int)(slash - target), target) : xstrdup(".");
    fd = open(d, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
    int e = errno;
    free(d);
    errno = e;
  }
  if (fd == -1 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    char *probe = slash ? fmt("%.*s/.cavs-probe-XXXXXX", (int)(slash - target), target) : xstrdup(".cavs-probe-XXXXXX");
    fd = mkstemp(probe);
    if (fd >= 0) unlink(probe);
    free(probe);
  }
  if (fd == -1) die(file_status(errno), "%s%s %s: cannot write there: %s", dash, opt, out, strerror(errno));
  if (fd >= 0) close(fd);
  free(target);
}

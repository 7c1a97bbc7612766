/* main.c: the `cavs` command, a thin CLI over libcavs (as jq's main.c is over libjq).
 *
 *   cavs train MODEL.vf|MODEL.so --format F --train FILE [--dev FILE] [options]
 *   cavs eval CKPT --data FILE        cavs predict CKPT --data FILE
 *   cavs gen toy|complete|random [options] -o FILE        cavs info CKPT
 *
 * A .vf model is compiled through cavsc and the system C compiler into a shared object in
 * the compile cache (cache.c), then loaded. Exit status: 0 success, 1 user error, 2
 * internal error or memory, 128 + the signal when SIGINT or SIGTERM stopped training. */
#include "cavs.h"
#include "cache.h"

#include <stdbool.h>

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CAVS_VERSION
#define CAVS_VERSION "0.1.0"
#endif

static const char *prog = "cavs";
/* how models are made: the backend and its threads, from the command line */
static cavs_model_opts model_opts;

static _Noreturn void die(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", prog);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(status);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A failure reported by libcavs: exit status 2 when memory ran out (the library sets
 * errno to ENOMEM; errno is cleared before each call), 1 for anything else. */
static _Noreturn void lib_die(const char *msg) { die(errno == ENOMEM ? 2 : 1, "%s", msg); }

/* What the command allocates lives until it exits, as the compiler's arena does: each
 * block is kept in this list, so that it stays reachable however the command ends (a
 * die() deep in a call included), and the leak checker of the sanitizer build sees no
 * leak. The large blocks (datasets, the model) are still freed when a command is done
 * with them; a freed block left in the list is never touched again. */
static void **kept;
static size_t nkept, capkept;

static void *keep(void *p) {
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

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) die(2, "out of memory");
  return keep(p);
}

static char *xstrdup(const char *s) {
  char *p = strdup(s);
  if (!p) die(2, "out of memory");
  return keep(p);
}

static char *fmt(const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  char *s = NULL;
  if (vasprintf(&s, f, ap) < 0) die(2, "out of memory");
  va_end(ap);
  return keep(s);
}

/* ---- numbers on the command line: whole, in range, never silently cut ---- */

static long parse_long(const char *opt, const char *s, long lo, long hi) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end || errno == ERANGE || v < lo || v > hi)
    die(1, "--%s: '%s' is not an integer from %ld to %ld", opt, s, lo, hi);
  return v;
}

static uint64_t parse_u64(const char *opt, const char *s) {
  char *end;
  errno = 0;
  uint64_t v = strtoull(s, &end, 10);
  /* strtoull takes "-1" as 2^64 - 1: only digits are a count */
  if (end == s || *end || errno == ERANGE || *s < '0' || *s > '9')
    die(1, "--%s: '%s' is not an integer from 0 to %llu", opt, s, (unsigned long long)UINT64_MAX);
  return v;
}

/* A finite real in [lo, hi]; with open_lo, lo itself is out. */
static double parse_real(const char *opt, const char *s, double lo, double hi, bool open_lo) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end || errno == ERANGE || !isfinite(v) || v < lo || v > hi || (open_lo && v == lo))
    die(1, "--%s: '%s' is not a number %s %g and at most %g", opt, s, open_lo ? "above" : "of at least", lo, hi);
  return v;
}

/* Bytes, with an optional binary suffix: 512M, 8G, 1T. */
static size_t parse_size(const char *opt, const char *s) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  double unit = 1;
  if (*end && !end[1]) {
    const char *u = strchr("KMGT", *end == 'k' ? 'K' : *end);
    if (u && *u) unit = (double)(1ull << (10 * (1 + (u - "KMGT"))));
    if (u && *u) end++;
  }
  if (end == s || *end || !isfinite(v) || v <= 0 || v * unit > 1e18)
    die(1, "--%s: '%s' is not a size (bytes, or with K, M, G or T)", opt, s);
  return (size_t)(v * unit);
}

static char *slurp(const char *path, size_t *len) {
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

static bool exists(const char *path) { return access(path, F_OK) == 0; }

/* ---- compiling a model ---- */

static char *exe_dir(void) {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return xstrdup(".");
  buf[n] = 0;
  char *slash = strrchr(buf, '/');
  if (slash) *slash = 0;
  return xstrdup(buf);
}

/* cavsc and cavs.h: from the environment, beside this program (a build tree, where
 * libtool puts the real binary in .libs/), or where `make install` put them. */
static const char *find_cavsc(void) {
  const char *e = getenv("CAVSC");
  if (e && *e) return e;
  char *dir = exe_dir();
  const char *cands[] = {"%s/cavsc", "%s/../cavsc"};
  for (int i = 0; i < 2; i++) {
    char *p = fmt(cands[i], dir);
    if (exists(p)) return p;
    free(p);
  }
  return "cavsc";
}

static const char *find_include(void) {
  const char *e = getenv("CAVS_INCLUDE");
  if (e && *e) return e;
  char *dir = exe_dir();
  const char *cands[] = {"%s/runtime", "%s/../runtime"};
  for (int i = 0; i < 2; i++) {
    char *p = fmt(cands[i], dir);
    char *h = fmt("%s/cavs.h", p);
    if (exists(h)) return p;
    free(p);
  }
#ifdef CAVS_SRCDIR
  if (exists(CAVS_SRCDIR "/runtime/cavs.h")) return CAVS_SRCDIR "/runtime";
#endif
#ifdef CAVS_INCLUDEDIR
  return CAVS_INCLUDEDIR;
#else
  return "/usr/local/include";
#endif
}

typedef struct Loaded {
  const cavs_desc *desc;
  char *source; /* the .vf text, NULL for a prebuilt .so */
  char *name;
} Loaded;

static const char *cc_flags[] = {"-std=c11", "-O3", "-march=native", "-fPIC", "-shared",
#ifdef CAVS_MODEL_NO_AVX512
                                  "-mno-avx512f", /* a --enable-valgrind build: valgrind has no AVX-512 */
#endif
};

static CacheReq cache_req(const char *name, const char *text, size_t len, const char *expect) {
  const char *cc = getenv("CC");
  return (CacheReq){.cavsc = find_cavsc(), .include = find_include(), .cc = cc && *cc ? cc : "cc",
                    .cflags = cc_flags, .ncflags = (int)(sizeof cc_flags / sizeof *cc_flags),
                    .version = CAVS_VERSION, .text = text, .len = len, .name = name, .expect = expect};
}

/* Compiles source text (which cavsc's messages call `name`) through the cache and loads
 * it; `expect`, when set, is the model name the text must define. */
static Loaded load_vf(const char *name, const char *text, size_t len, const char *expect) {
  Loaded L = {0};
  CacheReq q = cache_req(name, text, len, expect);
  char err[2048];
  int rc = cache_load(&q, &L.desc, &L.name, err, sizeof err);
  keep(L.name);
  if (rc) {
    if (*err) die(rc, "%s", err);
    exit(rc);
  }
  L.source = xmalloc(len + 1);
  memcpy(L.source, text, len);
  L.source[len] = 0;
  return L;
}

static Loaded load_model_arg(const char *path) {
  size_t n = strlen(path);
  if (n > 3 && !strcmp(path + n - 3, ".so")) {
    Loaded L = {0};
    void *lib = dlopen(strchr(path, '/') ? path : fmt("./%s", path), RTLD_NOW | RTLD_LOCAL);
    if (!lib) die(1, "cannot load '%s': %s", path, dlerror());
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char *name = xstrdup(base);
    name[strlen(name) - 3] = 0;
    const char *prefix = "lib";
    if (!strncmp(name, prefix, 3) && !dlsym(lib, fmt("%s_desc", name))) name += 3;
    L.desc = dlsym(lib, fmt("%s_desc", name));
    if (!L.desc) die(1, "'%s' has no symbol %s_desc (build it from cavsc's MODEL.c)", path, name);
    L.name = name;
    return L;
  }
  size_t len;
  char *text = slurp(path, &len);
  if (!text) die(1, "cannot open '%s': %s", path, strerror(errno));
  return load_vf(path, text, len, NULL);
}

/* For a checkpoint: the model's source is inside it. The checkpoint has been read and
 * checked whole; its source is parsed and checked by cavsc (which writes nothing) before
 * it is compiled, and it must define the model the checkpoint names. Nothing from the
 * file becomes a path: the cache entry is named by a hash. */
static Loaded load_from_ckpt(const cavs_ckpt *k, const char *ckpt_path) {
  const char *src = cavs_ckpt_source(k);
  char *name = fmt("%s (the model source in the checkpoint)", ckpt_path);
  CacheReq q = cache_req(name, src, strlen(src), cavs_ckpt_model(k));
  char err[2048];
  int rc = cache_check_source(&q, err, sizeof err);
  if (rc == 1) die(1, "%s: the checkpoint's model source does not compile", ckpt_path);
  if (rc) die(rc, "%s", err);
  return load_vf(name, src, strlen(src), cavs_ckpt_model(k));
}

/* ---- data ---- */

static cavs_dataset *load_data(const char *path, const char *format, const cavs_desc *d, const long *dims,
                               cavs_vocab *v, int grow) {
  char err[1024];
  errno = 0;
  cavs_dataset *s = keep(cavs_dataset_load(path, format, d, dims, v, grow, err, sizeof err));
  if (!s) {
    fprintf(stderr, "%s\n", err);
    exit(errno == ENOMEM ? 2 : 1);
  }
  return s;
}

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* What a pass over data adds up to: the classification counts (softmax_xent losses) and
 * every loss on its own, so that a regression loss never enters an accuracy and a model
 * with several losses reports each. */
enum { MAX_LOSSES = 64 };
typedef struct Totals {
  double batch_loss; /* the minibatches' mean losses, summed (training) */
  int batches, nl;
  long count, correct, root_count, root_correct, graphs;
  double lsum[MAX_LOSSES];
  long lcount[MAX_LOSSES], lcorrect[MAX_LOSSES];
  double secs;
} Totals;

static void add_batch(Totals *t, const cavs_model *m, const cavs_stats *st, int k) {
  t->batch_loss += st->loss;
  t->batches++;
  t->count += st->count;
  t->correct += st->correct;
  t->root_count += st->root_count;
  t->root_correct += st->root_correct;
  t->graphs += k;
  int n;
  const cavs_loss_acc *a = cavs_model_losses(m, &n);
  t->nl = n < MAX_LOSSES ? n : MAX_LOSSES;
  for (int l = 0; l < t->nl; l++) {
    t->lsum[l] += a[l].sum;
    t->lcount[l] += a[l].count;
    t->lcorrect[l] += a[l].correct;
  }
}

/* Over a whole dataset: each loss's mean over its rows, summed as a minibatch's is. */
static double total_loss(const Totals *t) {
  double s = 0;
  for (int l = 0; l < t->nl; l++) s += t->lcount[l] ? t->lsum[l] / (double)t->lcount[l] : 0;
  return s;
}

static double ratio(long a, long b) { return b ? (double)a / (double)b : 0; }

static bool has_accuracy(const cavs_desc *d) {
  for (int l = 0; l < d->nlosses; l++)
    if (d->losses[l].kind == 0) return true;
  return false;
}

/* " (softmax_xent 0.4312 acc 0.8123, mse 0.0200)" for a model with several losses. */
static void print_losses(FILE *f, const cavs_desc *d, const Totals *t) {
  if (t->nl < 2) return;
  fputs(" (", f);
  for (int l = 0; l < t->nl; l++) {
    bool xent = d->losses[l].kind == 0;
    fprintf(f, "%s%s %.4f", l ? ", " : "", xent ? "softmax_xent" : "mse", (t->lcount[l] ? t->lsum[l] / (double)t->lcount[l] : 0));
    if (xent) fprintf(f, " acc %.4f", ratio(t->lcorrect[l], t->lcount[l]));
  }
  fputc(')', f);
}

static void evaluate(cavs_model *m, const cavs_dataset *s, int batch, Totals *t) {
  memset(t, 0, sizeof *t);
  int n = cavs_dataset_count(s);
  const cavs_graph **gs = xmalloc(sizeof(cavs_graph *) * (size_t)batch);
  double start = now();
  for (int b = 0; b < n; b += batch) {
    int k = 0;
    for (; k < batch && b + k < n; k++) gs[k] = cavs_dataset_graph(s, b + k);
    cavs_stats st;
    errno = 0;
    if (cavs_model_forward(m, gs, k, &st)) lib_die(cavs_model_error(m));
    add_batch(t, m, &st, k);
  }
  t->secs = now() - start;
  free(gs);
}

/* ---- train ---- */

typedef struct TrainOpts {
  const char *model, *format, *train, *dev, *save, *resume, *log;
  int epochs, batch, threads, quiet;
  uint64_t seed;
  cavs_optim optim;
  const char *dimset[64];
  int ndimset;
  /* given on the command line (else a resume keeps the checkpoint's) */
  bool set_kind, set_lr, set_clip, set_wd, set_batch;
} TrainOpts;

/* An output of this run (--save, --log) must not be one of its inputs, nor a directory,
 * and its directory must take a new file: found out before training, not after an
 * epoch. */
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

static void check_output(const char *opt, const char *out, const char *const *inputs, const char *const *what, int n) {
  struct stat so;
  if (stat(out, &so) == 0 && S_ISDIR(so.st_mode)) die(1, "--%s %s: it is a directory", opt, out);
  for (int i = 0; i < n; i++)
    if (inputs[i] && same_file(out, inputs[i])) die(1, "--%s %s would overwrite %s, %s", opt, out, inputs[i], what[i]);
  const char *slash = strrchr(out, '/');
  char *probe = slash ? fmt("%.*s/.cavs-probe-XXXXXX", (int)(slash - out), out) : xstrdup(".cavs-probe-XXXXXX");
  int fd = mkstemp(probe);
  if (fd < 0) die(1, "--%s %s: cannot write there: %s", opt, out, strerror(errno));
  close(fd);
  unlink(probe);
  free(probe);
}

/* SIGINT or SIGTERM during training: the step under way finishes, the state is saved
 * (atomically, as always) and cavs exits with 128 + the signal. The handler only sets
 * this; a second signal gets the default action (SA_RESETHAND), which is safe: a
 * checkpoint is never torn. */
static volatile sig_atomic_t interrupted;
static void on_signal(int sig) { interrupted = sig; }


static void progress(int epoch, int epochs, long done, long total, double rate, double loss, double eta) {
  int width = 24, fill = total ? (int)((double)width * (double)done / (double)total) : width;
  char bar[64];
  for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '-';
  bar[width] = 0;
  int em = (int)(eta / 60), es = (int)eta % 60;
  fprintf(stdout, "\repoch %d/%d [%s] %ld/%ld graphs  %.0f graphs/s  loss %.3f  ETA %d:%02d ", epoch, epochs, bar,
          done, total, rate, loss, em, es);
  fflush(stdout);
}

static void apply_dims(const cavs_desc *d, long *dims, const TrainOpts *o) {
  for (int i = 0; i < o->ndimset; i++) {
    const char *eq = strchr(o->dimset[i], '=');
    if (!eq) die(1, "--dim takes NAME=VALUE, not '%s'", o->dimset[i]);
    int found = -1;
    for (int j = 0; j < d->ndims; j++)
      if (strlen(d->dims[j].name) == (size_t)(eq - o->dimset[i]) && !strncmp(d->dims[j].name, o->dimset[i], (size_t)(eq - o->dimset[i])))
        found = j;
    if (found < 0) die(1, "model '%s' has no dim '%.*s'", d->name, (int)(eq - o->dimset[i]), o->dimset[i]);
    char *end;
    long v = strtol(eq + 1, &end, 10);
    if (*end || v <= 0 || v > (1L << 24)) die(1, "--dim %s: the value must be a positive integer", o->dimset[i]);
    if (d->dims[found].kind == CAVS_DIM_VOCAB) die(1, "dim %s is bound by the data (vocab); it cannot be set", d->dims[found].name);
    dims[found] = v;
  }
}

static int cmd_train(TrainOpts *o) {
  if (!o->model) die(1, "train: no model (a .vf file or a built .so)");
  if (!o->train) die(1, "train: --train FILE is required");
  if (!o->format) die(1, "train: --format is required (ptb-tree, text, cgf)");
  if (o->epochs <= 0 || o->batch <= 0) die(1, "train: --epochs and --batch must be positive");
  char *best_path = o->save ? fmt("%s.best", o->save) : NULL;
  /* what --save may not write over (--resume it may: that is how a run goes on), then
     what --log may not */
  const char *inputs[] = {o->model, o->train, o->dev, o->log, o->resume, o->save, best_path};
  const char *what[] = {"the model", "the --train data", "the --dev data", "the --log file", "the checkpoint resumed from",
                        "the --save checkpoint", "the best checkpoint"};
  if (o->save) {
    check_output("save", o->save, inputs, what, 4);
    check_output("save", best_path, inputs, what, 4);
  }
  if (o->log) check_output("log", o->log, inputs + 4, what + 4, 3), check_output("log", o->log, inputs, what, 3);
  Loaded L = load_model_arg(o->model);
  const cavs_desc *d = L.desc;
  long dims[CAVS_MAX_DIMS] = {0};
  cavs_dims_default(d, dims);
  apply_dims(d, dims, o);
  cavs_ckpt *ck = NULL;
  cavs_vocab *v;
  char err[1024];
  if (o->resume) {
    ck = keep(cavs_ckpt_read(o->resume, err, sizeof err));
    if (!ck) die(1, "%s", err);
    if (strcmp(cavs_ckpt_model(ck), d->name))
      die(1, "%s: the checkpoint is of model '%s', not '%s'", o->resume, cavs_ckpt_model(ck), d->name);
    if (strcmp(cavs_ckpt_hash(ck), d->source_hash))
      die(1, "%s: the checkpoint was trained from another version of model '%s' (source hash %s, %s is %s)", o->resume,
          d->name, cavs_ckpt_hash(ck), o->model, d->source_hash);
    long cd[CAVS_MAX_DIMS] = {0};
    if (cavs_ckpt_dims(ck, d, cd, err, sizeof err)) die(1, "%s: %s", o->resume, err);
    /* only the dims given on the command line must agree with the checkpoint */
    long asked[CAVS_MAX_DIMS] = {0};
    for (int j = 0; j < d->ndims; j++) asked[j] = -1;
    apply_dims(d, asked, o);
    for (int j = 0; j < d->ndims; j++)
      if (asked[j] >= 0 && asked[j] != cd[j])
        die(1, "%s: dim %s is %ld in the checkpoint, but --dim asks for %ld", o->resume, d->dims[j].name, cd[j], asked[j]);
    /* the training settings continue too, unless given again */
    const cavs_train_state *cs = cavs_ckpt_state(ck);
    cavs_optim c = cs->optim;
    if (o->set_kind) {
      c.kind = o->optim.kind;
      c.lr = cavs_optim_default_lr(c.kind); /* another optimizer: its own default rate */
    }
    if (o->set_lr) c.lr = o->optim.lr;
    if (o->set_clip) c.clip = o->optim.clip;
    if (o->set_wd) c.weight_decay = o->optim.weight_decay;
    o->optim = c;
    if (!o->set_batch && cs->batch > 0) o->batch = cs->batch;
    memcpy(dims, cd, sizeof(long) * (size_t)d->ndims);
    v = keep(cavs_ckpt_vocab(ck));
    if (!v) die(1, "%s: damaged vocabulary", o->resume);
  } else {
    v = keep(cavs_vocab_new());
  }
  cavs_dataset *tr = load_data(o->train, o->format, d, dims, v, ck == NULL);
  cavs_dataset *dev = o->dev ? load_data(o->dev, o->format, d, dims, v, 0) : NULL;
  /* a vocabulary dim counts the tokens read, or for cgf, whose features are numbers
     already, the ids used */
  if (!ck)
    for (int j = 0; j < d->ndims; j++) {
      if (d->dims[j].kind != CAVS_DIM_VOCAB) continue;
      dims[j] = cavs_vocab_size(v);
      if (!strcmp(o->format, "cgf")) {
        int mx = cavs_dataset_max_feature(tr, d->inputs[d->dims[j].input].slot);
        if (dev && cavs_dataset_max_feature(dev, d->inputs[d->dims[j].input].slot) > mx)
          mx = cavs_dataset_max_feature(dev, d->inputs[d->dims[j].input].slot);
        dims[j] = mx + 1 > 1 ? mx + 1 : 1;
      }
    }
  errno = 0;
  cavs_model *m = keep(cavs_model_new_opts(d, dims, &model_opts, err, sizeof err));
  if (!m) lib_die(err);
  cavs_train_state ts = {.rng = o->seed * 0x9e3779b97f4a7c15ull + 1, .best = -1, .seed = o->seed,
                         .threads = o->threads, .batch = o->batch, .optim = o->optim};
  const cavs_graph **gs = xmalloc(sizeof(cavs_graph *) * (size_t)o->batch);
  snprintf(ts.format, sizeof ts.format, "%s", o->format);
  if (ck) {
    if (cavs_ckpt_apply(ck, m, err, sizeof err)) die(1, "%s: %s", o->resume, err);
    const cavs_train_state *cs = cavs_ckpt_state(ck);
    ts.epoch = cs->epoch;
    ts.rng = cs->rng;
    ts.best = cs->best;
    ts.seed = cs->seed;
    ts.graphs_done = cs->graphs_done;
  } else {
    cavs_model_init(m, o->seed);
  }
  FILE *log = NULL;
  if (o->log) {
    log = fopen(o->log, ck ? "a" : "w");
    if (!log) die(1, "cannot write '%s': %s", o->log, strerror(errno));
  }
  bool tty = isatty(1) && !o->quiet, with_acc = has_accuracy(d);
  int n = cavs_dataset_count(tr);
  int *order = xmalloc(sizeof(int) * (size_t)n);
  long nparams = 0;
  for (int i = 0; i < d->nparams; i++) {
    long r, c;
    cavs_model_param(m, i, &r, &c, NULL);
    nparams += r * c;
  }
  struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESETHAND};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  if (!o->quiet) {
    printf("model %s: %ld parameters; %d training graphs (%ld vertices)", d->name, nparams, n, cavs_dataset_vertices(tr));
    if (ck) printf("; resumed after epoch %d", ts.epoch);
    if (ck && ts.graphs_done) printf(" and %ld graphs of the next", ts.graphs_done);
    printf("\n");
    fflush(stdout);
  }
  int first = ts.epoch + 1, last_epoch = ts.epoch + o->epochs;
  for (int epoch = first; epoch <= last_epoch; epoch++) {
    /* an interrupted epoch goes on where it stopped, in the same order */
    uint64_t rng_at_start = ts.rng;
    int b0 = epoch == first && ts.graphs_done > 0 ? (int)(ts.graphs_done < n ? ts.graphs_done : n) : 0;
    ts.graphs_done = 0;
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n - 1; i > 0; i--) {
      int j = (int)(rng_next(&ts.rng) % (uint64_t)(i + 1));
      int t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    Totals t = {0};
    double start = now(), shown = 0;
    for (int b = b0; b < n; b += o->batch) {
      int k = 0;
      for (; k < o->batch && b + k < n; k++) gs[k] = cavs_dataset_graph(tr, order[b + k]);
      cavs_stats st;
      errno = 0;
    if (cavs_model_forward(m, gs, k, &st)) lib_die(cavs_model_error(m));
      if (!isfinite(st.loss)) {
        char why[512];
        int bg, bv;
        if (cavs_model_check_finite(m, &bg, &bv, why, sizeof why)) {
          if (bg >= 0)
            die(1, "epoch %d: %s at vertex %d of graph %d of %s; try a smaller --lr or --clip", epoch, why, bv,
                order[b + bg] + 1, o->train);
          die(1, "epoch %d: %s; try a smaller --lr or --clip", epoch, why);
        }
        die(1, "epoch %d: the loss is %g (diverged); try a smaller --lr or --clip", epoch, st.loss);
      }
      cavs_model_backward(m);
      errno = 0;
      if (cavs_model_step(m, &o->optim)) lib_die(cavs_model_error(m));
      add_batch(&t, m, &st, k);
      if (interrupted && b + k < n) {
        /* the epoch so far: the shuffling state it began with and how far it got */
        ts.rng = rng_at_start;
        ts.graphs_done = b + k;
        if (tty) printf("\r\033[K");
        if (o->save && cavs_ckpt_save(o->save, m, L.source ? L.source : "", v, &ts, err, sizeof err)) die(1, "%s", err);
        if (o->save)
          fprintf(stderr, "%s: interrupted after %d of the %d graphs of epoch %d; saved to %s (go on with --resume %s)\n",
                  prog, b + k, n, epoch, o->save, o->save);
        else fprintf(stderr, "%s: interrupted in epoch %d; nothing saved (no --save)\n", prog, epoch);
        exit(128 + interrupted);
      }
      double el = now() - start;
      if (tty && (el - shown > 0.1 || b + k >= n)) {
        shown = el;
        double rate = (double)t.graphs / (el > 0 ? el : 1e-9);
        progress(epoch, last_epoch, t.graphs, n, rate, t.batch_loss / t.batches, (double)(n - t.graphs) / (rate > 0 ? rate : 1));
      }
    }
    t.secs = now() - start;
    if (tty) printf("\r\033[K");
    Totals dv = {0};
    if (dev) evaluate(m, dev, o->batch, &dv);
    /* .best: by dev accuracy for a classifier, else by dev loss */
    double acc = ratio(dv.correct, dv.count), racc = ratio(dv.root_correct, dv.root_count);
    double dloss = total_loss(&dv), tloss = t.batch_loss / (t.batches ? t.batches : 1);
    bool better = dev && (with_acc ? acc > ts.best : ts.best < 0 || dloss < ts.best);
    if (better) ts.best = with_acc ? acc : dloss;
    ts.epoch = epoch;
    if (!o->quiet) {
      printf("epoch %d/%d  train loss %.4f", epoch, last_epoch, tloss);
      if (with_acc) printf(" acc %.4f", ratio(t.correct, t.count));
      if (dev) {
        printf("  dev loss %.4f", dloss);
        if (with_acc) printf(" acc %.4f root %.4f", acc, racc);
        print_losses(stdout, d, &dv);
      }
      printf("  %.1fs  %.0f graphs/s%s\n", t.secs, (double)t.graphs / t.secs, better && o->save ? "  (best, saved)" : "");
      fflush(stdout);
    }
    if (log) {
      /* null where a value does not exist: no dev set, or no classifier */
      char ta[32] = "null", dl[32] = "null", da[32] = "null", dr[32] = "null";
      if (with_acc) snprintf(ta, sizeof ta, "%.6f", ratio(t.correct, t.count));
      if (dev) snprintf(dl, sizeof dl, "%.6f", dloss);
      if (dev && with_acc) snprintf(da, sizeof da, "%.6f", acc), snprintf(dr, sizeof dr, "%.6f", racc);
      fprintf(log, "{\"epoch\": %d, \"train_loss\": %.6f, \"train_acc\": %s, \"dev_loss\": %s, \"dev_acc\": %s, "
                   "\"dev_root_acc\": %s, ",
              epoch, tloss, ta, dl, da, dr);
      if (dev && dv.nl > 1) {
        fputs("\"dev_losses\": [", log);
        for (int l = 0; l < dv.nl; l++) fprintf(log, "%s%.6f", l ? ", " : "", dv.lcount[l] ? dv.lsum[l] / (double)dv.lcount[l] : 0);
        fputs("], ", log);
      }
      fprintf(log, "\"graphs_per_s\": %.1f, \"seconds\": %.3f}\n", (double)t.graphs / t.secs, t.secs);
      fflush(log);
    }
    if (o->save) {
      if (cavs_ckpt_save(o->save, m, L.source ? L.source : "", v, &ts, err, sizeof err)) die(1, "%s", err);
      if (better && cavs_ckpt_save(best_path, m, L.source ? L.source : "", v, &ts, err, sizeof err)) die(1, "%s", err);
    }
    if (interrupted && epoch < last_epoch) {
      fprintf(stderr, "%s: interrupted after epoch %d%s\n", prog, epoch, o->save ? fmt("; saved to %s", o->save) : "");
      exit(128 + interrupted);
    }
  }
  if (log) fclose(log);
  free(order);
  free(gs);
  cavs_model_free(m);
  cavs_dataset_free(tr);
  cavs_dataset_free(dev);
  cavs_vocab_free(v);
  cavs_ckpt_free(ck);
  return 0;
}

/* ---- eval, predict, info ---- */

typedef struct CkptModel {
  cavs_ckpt *ck;
  Loaded L;
  cavs_model *m;
  cavs_vocab *v;
} CkptModel;

/* The model comes from the checkpoint's own source, or from --model (required for a
 * checkpoint trained from a prebuilt .so); cavs_ckpt_apply checks that they match. */
static CkptModel open_ckpt(const char *path, const char *model) {
  CkptModel c = {0};
  char err[1024];
  c.ck = keep(cavs_ckpt_read(path, err, sizeof err));
  if (!c.ck) die(1, "%s", err);
  if (model) c.L = load_model_arg(model);
  else if (!*cavs_ckpt_source(c.ck))
    die(1, "%s: the checkpoint was trained from a built model library; name it with --model MODEL.so", path);
  else c.L = load_from_ckpt(c.ck, path);
  long dims[CAVS_MAX_DIMS] = {0};
  if (cavs_ckpt_dims(c.ck, c.L.desc, dims, err, sizeof err)) die(1, "%s: %s", path, err);
  errno = 0;
  c.m = keep(cavs_model_new_opts(c.L.desc, dims, &model_opts, err, sizeof err));
  if (!c.m) die(errno == ENOMEM ? 2 : 1, "%s: %s", path, err);
  if (cavs_ckpt_apply(c.ck, c.m, err, sizeof err)) die(1, "%s: %s", path, err);
  c.v = keep(cavs_ckpt_vocab(c.ck));
  if (!c.v) die(1, "%s: damaged vocabulary", path);
  return c;
}

static int cmd_eval(const char *ckpt, const char *model, const char *data, const char *format, int batch, bool predict) {
  if (!ckpt || !data) die(1, "%s: usage: cavs %s CKPT --data FILE", predict ? "predict" : "eval", predict ? "predict" : "eval");
  CkptModel c = open_ckpt(ckpt, model);
  if (!format) format = cavs_ckpt_state(c.ck)->format;
  long dims[CAVS_MAX_DIMS] = {0};
  for (int i = 0; i < c.L.desc->ndims; i++) dims[i] = cavs_model_dim(c.m, i);
  cavs_dataset *s = load_data(data, format, c.L.desc, dims, c.v, 0);
  if (!predict) {
    Totals t;
    evaluate(c.m, s, batch, &t);
    printf("graphs %ld  loss %.4f", t.graphs, total_loss(&t));
    print_losses(stdout, c.L.desc, &t);
    if (has_accuracy(c.L.desc))
      printf("  accuracy %.4f (all %ld vertices)  root accuracy %.4f (%ld roots)", ratio(t.correct, t.count), t.count,
             ratio(t.root_correct, t.root_count), t.root_count);
    printf("  %.0f graphs/s\n", (double)t.graphs / t.secs);
  } else {
    int n = cavs_dataset_count(s);
    const cavs_graph **gs = xmalloc(sizeof *gs * (size_t)batch);
    for (int b = 0; b < n; b += batch) {
      int k = 0;
      for (; k < batch && b + k < n; k++) gs[k] = cavs_dataset_graph(s, b + k);
      cavs_stats st;
      errno = 0;
      if (cavs_model_forward(c.m, gs, k, &st)) lib_die(cavs_model_error(c.m));
      for (int g = 0; g < k; g++) printf("%d\n", cavs_model_root_class(c.m, g));
    }
    free(gs);
  }
  cavs_dataset_free(s);
  return 0;
}

static int cmd_info(const char *path) {
  if (!path) die(1, "info: usage: cavs info CKPT");
  char err[1024];
  cavs_ckpt *k = keep(cavs_ckpt_read(path, err, sizeof err));
  if (!k) die(1, "%s", err);
  const cavs_train_state *ts = cavs_ckpt_state(k);
  cavs_vocab *v = keep(cavs_ckpt_vocab(k));
  printf("checkpoint  %s\nmodel       %s (source hash %s, %s)\n", path, cavs_ckpt_model(k), cavs_ckpt_hash(k),
         cavs_ckpt_precision(k) == CAVS_DOUBLE ? "double" : "float");
  printf("dims       ");
  for (int i = 0; i < cavs_ckpt_ndims(k); i++) printf(" %s=%ld", cavs_ckpt_dim_name(k, i), cavs_ckpt_dim_value(k, i));
  printf("\nparameters  %ld\nvocabulary  %d words\n", cavs_ckpt_param_count(k), v ? cavs_vocab_size(v) : 0);
  if (ts->graphs_done) printf("interrupted %ld graphs into epoch %d\n", ts->graphs_done, ts->epoch + 1);
  printf("training    %d epochs done, data format %s, batch %d, optimizer %s lr %g, seed %llu\n", ts->epoch, ts->format,
         ts->batch, cavs_optim_name(ts->optim.kind), ts->optim.lr,
         (unsigned long long)ts->seed);
  if (ts->best >= 0) printf("best dev    %.4f (accuracy; dev loss for a model without a classifier)\n", ts->best);
  cavs_vocab_free(v);
  cavs_ckpt_free(k);
  return 0;
}

/* ---- gen ---- */

static int cmd_gen(int argc, char **argv) {
  if (argc < 2) die(1, "gen: usage: cavs gen toy|complete|random [--graphs N] [--leaves L] [--words W] [--seed S] [--dag] -o FILE");
  const char *kind = argv[1], *out = NULL;
  long graphs = 1000, leaves = 16, words = 24, classes = 5, vertices = 31;
  uint64_t seed = 1;
  int dag = 0;
  static const struct option lo[] = {{"graphs", 1, 0, 'n'}, {"leaves", 1, 0, 'l'}, {"words", 1, 0, 'w'},
                                     {"seed", 1, 0, 's'}, {"classes", 1, 0, 'c'}, {"output", 1, 0, 'o'},
                                     {"vertices", 1, 0, 'v'}, {"dag", 0, 0, 'g'},
                                     {0, 0, 0, 0}};
  optind = 2;
  int ch;
  while ((ch = getopt_long(argc, argv, "o:", lo, NULL)) != -1) {
    switch (ch) {
    case 'n': graphs = parse_long("graphs", optarg, 1, 10000000); break;
    case 'l': leaves = parse_long("leaves", optarg, 2, 1 << 20); break;
    case 'w': words = parse_long("words", optarg, 1, 1000000); break;
    case 's': seed = parse_u64("seed", optarg); break;
    case 'c': classes = parse_long("classes", optarg, 1, 1000000); break;
    case 'v': vertices = parse_long("vertices", optarg, 1, 1000000); break;
    case 'g': dag = 1; break;
    case 'o': out = optarg; break;
    default: exit(1);
    }
  }
  if (!out) die(1, "gen: -o FILE is required");
  char *tmp = fmt("%s.tmpXXXXXX", out);
  int fd = mkstemp(tmp);
  if (fd < 0) die(1, "cannot write '%s': %s", out, strerror(errno));
  mode_t mask = umask(0);
  umask(mask);
  fchmod(fd, 0666 & ~mask);
  FILE *f = fdopen(fd, "w");
  int rc;
  if (!strcmp(kind, "toy")) rc = cavs_gen_toy(f, (int)graphs, (int)leaves, (int)words, (uint64_t)seed);
  else if (!strcmp(kind, "complete")) rc = cavs_gen_complete(f, (int)graphs, (int)leaves, (int)words, (int)classes, (uint64_t)seed);
  else if (!strcmp(kind, "random"))
    rc = cavs_gen_random(f, (int)graphs, (int)vertices, (int)words, (int)classes, dag, (uint64_t)seed);
  else {
    fclose(f);
    unlink(tmp);
    die(1, "gen: unknown kind '%s' (toy, complete, random)", kind);
  }
  if (rc || fflush(f) || fsync(fileno(f)) || fclose(f) || rename(tmp, out)) {
    unlink(tmp);
    die(1, "cannot write '%s': %s", out, strerror(errno));
  }
  return 0;
}

static const char usage[] =
    "usage: cavs train MODEL.vf|MODEL.so --format FMT --train FILE [--dev FILE] [options]\n"
    "       cavs eval CKPT --data FILE [--format FMT] [--model MODEL.vf|MODEL.so]\n"
    "       cavs predict CKPT --data FILE [--format FMT] [--model MODEL.vf|MODEL.so]\n"
    "       cavs gen toy|complete|random [--graphs N] [--leaves L] [--vertices V] [--words W]\n"
    "                [--classes C] [--seed S] [--dag] -o FILE\n"
    "       cavs info CKPT\n"
    "train options:\n"
    "  --epochs N  --batch N  --optimizer sgd|adagrad|adam  --lr X  --clip X\n"
    "  --weight-decay X  --seed N  --dim NAME=VALUE  --save CKPT  --resume CKPT\n"
    "  --threads N  --max-memory SIZE  --log FILE  --quiet\n"
    "See cavs(1).\n";

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    fputs(usage, stderr);
    return 1;
  }
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(usage, stdout);
      return 0;
    }
  if (!strcmp(argv[1], "--version")) {
    printf("cavs %s\n", CAVS_VERSION);
    return 0;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "gen")) return cmd_gen(argc - 1, argv + 1);
  TrainOpts o = {.epochs = 10, .batch = 64, .threads = 2, .seed = 1,
                 .optim = {.kind = CAVS_ADAM, .lr = 1e-3}};
  const char *data = NULL, *format = NULL, *model_opt = NULL;
  static const struct option lo[] = {
      {"format", 1, 0, 'f'}, {"train", 1, 0, 't'}, {"dev", 1, 0, 'd'}, {"epochs", 1, 0, 'e'},
      {"batch", 1, 0, 'b'}, {"optimizer", 1, 0, 'O'}, {"lr", 1, 0, 'l'}, {"clip", 1, 0, 'c'},
      {"weight-decay", 1, 0, 'w'}, {"seed", 1, 0, 's'}, {"dim", 1, 0, 'D'}, {"save", 1, 0, 'S'},
      {"resume", 1, 0, 'r'}, {"threads", 1, 0, 'j'}, {"log", 1, 0, 'L'}, {"quiet", 0, 0, 'q'},
      {"data", 1, 0, 'x'}, {"model", 1, 0, 'M'}, {"max-memory", 1, 0, 'X'}, {0, 0, 0, 0}};
  optind = 2;
  int ch;
  const char *positional = NULL;
  while ((ch = getopt_long(argc, argv, "-", lo, NULL)) != -1) {
    switch (ch) {
    case 1:
      if (positional) die(1, "%s: unexpected argument '%s'", cmd, optarg);
      positional = optarg;
      break;
    case 'f': format = optarg; break;
    case 't': o.train = optarg; break;
    case 'd': o.dev = optarg; break;
    case 'x': data = optarg; break;
    case 'M': model_opt = optarg; break;
    case 'e': o.epochs = (int)parse_long("epochs", optarg, 1, 1000000); break;
    case 'b': o.batch = (int)parse_long("batch", optarg, 1, 1 << 20); o.set_batch = true; break;
    case 'j': o.threads = (int)parse_long("threads", optarg, 1, 1024); break;
    case 's': o.seed = parse_u64("seed", optarg); break;
    case 'l': o.optim.lr = parse_real("lr", optarg, 0, 1e30, true); o.set_lr = true; break;
    case 'c': o.optim.clip = parse_real("clip", optarg, 0, 1e30, false); o.set_clip = true; break;
    case 'w': o.optim.weight_decay = parse_real("weight-decay", optarg, 0, 1e6, false); o.set_wd = true; break;
    case 'X': cavs_set_memory_limit(parse_size("max-memory", optarg)); break;
    case 'O':
      o.set_kind = true;
      o.optim.kind = cavs_optim_kind(optarg);
      if (o.optim.kind < 0) {
        char names[128] = "";
        for (int k = 0; k < CAVS_OPTIM_COUNT; k++)
          snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", cavs_optim_name(k));
        die(1, "unknown optimizer '%s' (%s)", optarg, names);
      }
      break;
    case 'D':
      if (o.ndimset == 64) die(1, "too many --dim options");
      o.dimset[o.ndimset++] = optarg;
      break;
    case 'S': o.save = optarg; break;
    case 'r': o.resume = optarg; break;
    case 'L': o.log = optarg; break;
    case 'q': o.quiet = 1; break;
    default: fputs(usage, stderr); return 1;
    }
  }
  /* after `--`, getopt stops: what is left is the positional argument */
  for (; optind < argc; optind++) {
    if (positional) die(1, "%s: unexpected argument '%s'", cmd, argv[optind]);
    positional = argv[optind];
  }
  if (!o.set_lr) o.optim.lr = cavs_optim_default_lr(o.optim.kind);
  model_opts.threads = o.threads;
  if (!strcmp(cmd, "train")) {
    o.model = positional;
    o.format = format;
    return cmd_train(&o);
  }
  if (!strcmp(cmd, "eval") || !strcmp(cmd, "predict")) {
    return cmd_eval(positional, model_opt, data, format, o.batch, !strcmp(cmd, "predict"));
  }
  if (!strcmp(cmd, "info")) return cmd_info(positional);
  die(1, "unknown command '%s' (train, eval, predict, gen, info)", cmd);
}

/* ckpt.c: checkpoints. The format (all integers little-endian):
 *
 *   "CAVSCKPT" u32 version
 *   str model  str source_hash  str source_text  u32 precision
 *   u32 ndims   { str name  i64 value }
 *   u32 nwords  { str word }                       the vocabulary, in id order
 *   u32 nparams { str name  i64 rows  i64 cols  values[rows*cols] }
 *   i64 optimizer steps   u8 moments   [m1 values per parameter] [m2 values ...]
 *                                  the moment blocks the model held: 0, 1 or 2   (format 8)
 *   training state: i32 epoch  u64 rng  f64 best  u64 seed  i32 threads  i32 batch
 *                   str format  i32 kind  f64 lr clip weight_decay beta1 beta2 eps
 *                   i64 graphs_done                               (format 2 on)
 *                   i32 select  f64 lr_decay  i32 lr_step warmup patience since_best
 *                   best_epoch  u32 nfrozen { i32 param }            (format 3 on)
 *                   f64 momentum  i32 schedule  f64 lr_min  i32 cosine_epochs
 *                   f64 plateau_factor  i32 plateau_patience  f64 lr_now
 *                   f64 plateau_best  i32 plateau_bad                (format 4 on)
 *   u32 noptions { str name  f64 value }   the options as saved          (format 5 on)
 *   i32 lr_decay_start                                                   (format 6 on)
 *   u32 rows  u32 width  values[rows*width]   the carried state: row g what graph g of
 *                                the last minibatch left (cavs_model_carry_state; 0
 *                                rows when the model carries none)          (format 6 on)
 *   f64 bptt_vary                                                         (format 7 on)
 *   u32 bptt_state    text-bptt's chunks: 0 not said, 1 carried, 2 from zeros (format 9 on)
 *   str record        a line cavs train keeps, else "" (format 10 on): at an epoch's end
 *                     the --log record of the epoch the state ends where the log refused
 *                     it (a JSON object), what a resumed run writes into a log that lacks
 *                     it; inside an epoch (graphs_done > 0) the epoch's totals so far (a
 *                     JSON object), what the resumed run's line and record go on from
 *   u64 FNV-1a of every byte before it
 *
 * Values are in the model's precision. A str is u32 length + bytes. The file is written
 * whole by afile.c (an unnamed file in PATH's directory, flushed and renamed over PATH,
 * the directory fsync'ed): a crash leaves the old checkpoint or the new one, never a mix,
 * and any number of runs may save to one path at once.
 * Formats 1 (no graphs_done), 2 (no schedule, selection or frozen parameters) and 3 (no
 * momentum, schedule kind or schedule state), 4 (no options: a resumed run had the
 * model's defaults) and 5 (no carried state: a run resumed inside an epoch started its
 * streams from zeros), 6 (no bptt_vary: chunks of one length) and 7 (u8 has_moments, 0
 * or 1 for both blocks: an optimizer of one block wrote the second as zeros) and 8 (no
 * bptt_state: not said) and 9 (no record) are still read. */
#include "afile.h"
#include "cv.h"
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CKPT_MAGIC "CAVSCKPT"
#define CKPT_VERSION 10

/* ---- writing into a growing buffer ---- */

typedef struct Buf {
  unsigned char *p;
  size_t n, cap;
  bool oom;  /* a put did not fit: the save fails, with nothing written */
  bool lost; /* a copy from the backend's memory failed (the model says why): the same */
} Buf;

static void put(Buf *b, const void *data, size_t n) {
  if (b->oom) return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->n + n) cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  if (data) memcpy(b->p + b->n, data, n);
  b->n += n;
}
static void put_u32(Buf *b, uint32_t v) { put(b, &v, 4); }
static void put_i64(Buf *b, int64_t v) { put(b, &v, 8); }
static void put_f64(Buf *b, double v) { put(b, &v, 8); }
static void put_str(Buf *b, const char *s) {
  uint32_t n = s ? (uint32_t)strlen(s) : 0;
  put_u32(b, n);
  put(b, s ? s : "", n);
}

#define FNV_START 1469598103934665603ull
static uint64_t fnv64_more(uint64_t h, const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}
static uint64_t fnv64(const unsigned char *p, size_t n) { return fnv64_more(FNV_START, p, n); }

/* Packs parameter i of `flat`, a block with the parameters' layout (the parameters
 * themselves, or an optimizer moment), without the leading-dimension padding. */
static void put_param(Buf *b, cavs_model *m, const void *flat, int i) {
  const cavs_param_desc *p = &m->d->params[i];
  long rows = cv_lin(&p->rows, m->ctx.dims), cols = cv_lin(&p->cols, m->ctx.dims);
  long off = cv_lin(&p->col_off, m->ctx.dims), ld = m->pg_cols[p->group];
  const char *src = flat ? (const char *)flat + (m->pg_off[p->group] + (size_t)off) * m->esize : NULL;
  size_t row = (size_t)cols * m->esize;
  for (long r = 0; r < rows; r++) {
    /* room first, then the row straight from the backend's memory into it (zeros for a
       moment block the model does not hold) */
    size_t at = b->n;
    put(b, NULL, row);
    if (b->oom) continue;
    if (!flat) memset(b->p + at, 0, row);
    else if (!b->lost && m->be->download(m, b->p + at, src + (size_t)r * (size_t)ld * m->esize, row)) b->lost = true;
  }
}

/* The whole file at once, through afile.c: concurrent saves to one path all finish
 * (the last wins), a killed one leaves the old checkpoint and no file of its own. */
static int write_file_atomic(const char *path, const Buf *b, char *err, size_t errlen) {
  cv_afile a;
  if (cv_afile_open(&a, path, CV_AFILE_USER, err, errlen) || cv_afile_write(&a, b->p, b->n, err, errlen)) return -1;
  return cv_afile_commit(&a, err, errlen);
}

/* The header, dims, vocabulary, parameters and the optimizer's step and moments. */
static void put_model(Buf *b, cavs_model *m, const char *source, const cavs_vocab *v) {
  const cavs_desc *d = m->d;
  put(b, CKPT_MAGIC, 8);
  put_u32(b, CKPT_VERSION);
  put_str(b, d->name);
  put_str(b, d->source_hash);
  put_str(b, source);
  put_u32(b, (uint32_t)d->precision);
  put_u32(b, (uint32_t)d->ndims);
  for (int i = 0; i < d->ndims; i++) {
    put_str(b, d->dims[i].name);
    put_i64(b, m->ctx.dims[i]);
  }
  int nw = v ? cavs_vocab_size(v) : 0;
  put_u32(b, (uint32_t)nw);
  for (int i = 0; i < nw; i++) put_str(b, cavs_vocab_word(v, i));
  put_u32(b, (uint32_t)d->nparams);
  for (int i = 0; i < d->nparams; i++) {
    put_str(b, d->params[i].name);
    put_i64(b, cv_lin(&d->params[i].rows, m->ctx.dims));
    put_i64(b, cv_lin(&d->params[i].cols, m->ctx.dims));
    put_param(b, m, m->pflat, i);
  }
  put_i64(b, m->step);
  /* the blocks the model holds: none for SGD, m1 for momentum and Adagrad, both for
     Adam (cv_alloc_moments makes m1 first) */
  unsigned char nm = m->m2 ? 2 : m->m1 ? 1 : 0;
  put(b, &nm, 1);
  for (int i = 0; i < d->nparams && nm >= 1; i++) put_param(b, m, m->m1, i);
  for (int i = 0; i < d->nparams && nm == 2; i++) put_param(b, m, m->m2, i);
}

/* The training state, in the order the formats added it (the frozen parameters and the
 * options are the model's, the carried state its last minibatch's): where the carried
 * values lie in b, *at, and their count, the return. */
static size_t put_state(Buf *b, cavs_model *m, const cavs_train_state *ts, const char *record, size_t *at_out) {
  const cavs_desc *d = m->d;
  put_u32(b, (uint32_t)ts->epoch);
  put_i64(b, (int64_t)ts->rng);
  put_f64(b, ts->best);
  put_i64(b, (int64_t)ts->seed);
  put_u32(b, (uint32_t)ts->threads);
  put_u32(b, (uint32_t)ts->batch);
  put_str(b, ts->format);
  put_u32(b, (uint32_t)ts->optim.kind);
  put_f64(b, ts->optim.lr);
  put_f64(b, ts->optim.clip);
  put_f64(b, ts->optim.weight_decay);
  put_f64(b, ts->optim.beta1);
  put_f64(b, ts->optim.beta2);
  put_f64(b, ts->optim.eps);
  put_i64(b, ts->graphs_done);
  put_u32(b, (uint32_t)ts->select);
  put_f64(b, ts->lr_decay);
  put_u32(b, (uint32_t)ts->lr_step);
  put_u32(b, (uint32_t)ts->warmup);
  put_u32(b, (uint32_t)ts->patience);
  put_u32(b, (uint32_t)ts->since_best);
  put_u32(b, (uint32_t)ts->best_epoch);
  /* the frozen parameters (cavs_model_freeze: a group of one parameter each) */
  uint32_t nfrozen = 0;
  for (int i = 0; i < d->nparams; i++) nfrozen += m->frozen[d->params[i].group] != 0;
  put_u32(b, nfrozen);
  for (int i = 0; i < d->nparams; i++)
    if (m->frozen[d->params[i].group]) put_u32(b, (uint32_t)i);
  put_f64(b, ts->optim.momentum);
  put_u32(b, (uint32_t)ts->schedule);
  put_f64(b, ts->lr_min);
  put_u32(b, (uint32_t)ts->cosine_epochs);
  put_f64(b, ts->plateau_factor);
  put_u32(b, (uint32_t)ts->plateau_patience);
  put_f64(b, ts->lr_now);
  put_f64(b, ts->plateau_best);
  put_u32(b, (uint32_t)ts->plateau_bad);
  /* the options (a dropout's probability): a resumed run keeps what was set */
  put_u32(b, (uint32_t)d->noptions);
  for (int i = 0; i < d->noptions; i++) {
    put_str(b, d->options[i].name);
    put_f64(b, cavs_model_option(m, i));
  }
  put_u32(b, (uint32_t)ts->lr_decay_start);
  /* the carried state, so that a run stopped inside an epoch goes on from it */
  uint32_t crows = m->carry_state >= 0 ? (uint32_t)m->ncarry : 0;
  long cw = crows ? m->bw[m->carry_state] : 0;
  put_u32(b, crows);
  put_u32(b, (uint32_t)cw);
  size_t at = b->n, cbytes = (size_t)crows * (size_t)cw * m->esize;
  put(b, NULL, cbytes);
  if (!b->oom && !b->lost && cbytes && m->be->download(m, b->p + at, m->carry, cbytes)) b->lost = true;
  put_f64(b, ts->bptt_vary);
  put_u32(b, (uint32_t)ts->bptt_state);
  put_str(b, record);
  *at_out = at;
  return (size_t)crows * (size_t)cw;
}

/* Whether the n values at p, in the model's precision, are all finite */
static bool all_finite(const unsigned char *p, size_t n, size_t esize) {
  for (size_t i = 0; i < n; i++) {
    double x;
    if (esize == 8) memcpy(&x, p + 8 * i, 8);
    else {
      float f;
      memcpy(&f, p + 4 * i, 4);
      x = f;
    }
    if (!isfinite(x)) return false;
  }
  return true;
}

static const char *state_fault(const cavs_train_state *t);

/* A record a checkpoint keeps: one line of text, no NUL, at most CAVS_MAX_CKPT_RECORD
   bytes (what it says is the reader's to check: cavs train parses it as JSON) */
static bool record_fits(const char *s, size_t n) {
  return n <= CAVS_MAX_CKPT_RECORD && !memchr(s, '\n', n) && !memchr(s, 0, n);
}

int cavs_ckpt_save(const char *path, cavs_model *m, const char *source, const cavs_vocab *v,
                   const cavs_train_state *ts, char *err, size_t errlen) {
  return cavs_ckpt_save_record(path, m, source, v, ts, NULL, err, errlen);
}

int cavs_ckpt_save_record(const char *path, cavs_model *m, const char *source, const cavs_vocab *v,
                          const cavs_train_state *ts, const char *record, char *err, size_t errlen) {
  if (!source) source = m->d->source_text; /* the descriptor's own: the .vf it was made from */
  const char *fault = ts ? state_fault(ts) : NULL;
  if (!fault && record && !record_fits(record, strlen(record))) fault = "record (a line of at most 16 MiB)";
  if (fault) {
    snprintf(err, errlen, "cannot save '%s': a value of its %s is out of range (the checkpoint would not read back)",
             path, fault);
    return -1;
  }
  /* The values are read from the backend's memory once the work before has run, and
     not at all from a device that failed (a fault, a lost device): saved, they would
     replace the file with values no step made. */
  if (m->be->synchronize(m)) {
    snprintf(err, errlen, "cannot save '%s': %s", path, m->err);
    errno = EIO;
    return -1;
  }
  cavs_train_state z = {0};
  Buf b = {0};
  put_model(&b, m, source, v);
  size_t cat, cn = put_state(&b, m, ts ? ts : &z, record, &cat);
  if (b.lost) {
    free(b.p);
    snprintf(err, errlen, "cannot save '%s': %s", path, m->err);
    errno = EIO;
    return -1;
  }
  /* (reading refuses a carried state that is not finite too) */
  if (!b.oom && !all_finite((const unsigned char *)b.p + cat, cn, m->esize)) {
    free(b.p);
    snprintf(err, errlen, "cannot save '%s': the carried state holds a value that is not finite (the checkpoint "
             "would not read back)", path);
    return -1;
  }
  uint64_t sum = b.oom ? 0 : fnv64(b.p, b.n);
  put(&b, &sum, 8);
  if (b.oom) {
    free(b.p);
    snprintf(err, errlen, "cannot write '%s': out of memory", path);
    return -1;
  }
  int rc = write_file_atomic(path, &b, err, errlen);
  free(b.p);
  return rc;
}

/* ---- reading ---- */

typedef struct KParam {
  char *name;
  long rows, cols;
  bool frozen;
  size_t at; /* offset of the values in the file */
} KParam;

struct cavs_ckpt {
  unsigned char *data;
  size_t size;
  /* Opened (cavs_ckpt_open), not read whole: data is an anonymous mapping of the file's
     size whose pages hold what was read into them (the structure when opened, a
     parameter's rows when a model takes them: ck_load), the others never touched; fd
     the file, held open, and st what it was when its checksum was taken. -1: read. */
  int fd;
  struct stat st;
  uint64_t streamed; /* the checksum of the file's bytes, taken as it was streamed */
  char *path;
  char *model, *hash, *source;
  int precision;
  int ndims;
  char *dim_name[CAVS_MAX_DIMS];
  long dim_value[CAVS_MAX_DIMS];
  int nwords;
  char **words;
  int nparams;
  KParam *params;
  long steps;
  int nmoments; /* the blocks the file holds (0, 1 or 2) */
  size_t m1_at, m2_at;
  cavs_train_state ts;
  int noptions; /* format 5 on: the options' values as saved */
  char *opt_name[CAVS_MAX_OPTIONS];
  double opt_value[CAVS_MAX_OPTIONS];
  char *record;   /* format 10 on: the --log record of the state's epoch the log refused, or NULL */
  int carry_rows; /* format 6 on: the carried state, [carry_rows, carry_w] at carry_at */
  long carry_w;
  size_t carry_at;
};

typedef struct Rd {
  const unsigned char *p;
  size_t n, at;
  bool bad;
  bool oom;           /* bad because memory ran out, not the file: reported as such */
  const cavs_ckpt *k; /* whose bytes are read from its file as they are taken (opened), */
  size_t lo, hi;      /* a window [lo, hi) at a time */
} Rd;
/* An opened checkpoint's structure is read a window at a time, of at least this many
   bytes (what a window reads past a field, into the values that follow it, is at most
   this: the values of the other ranks' experts stay untouched but for a page) */
#define CK_AHEAD 4096

/* Whether the file is as it was when its checksum was taken: the same file (an open
   descriptor keeps it, whatever is renamed over its path), of the same size, neither
   written (mtime) nor changed in any way since (ctime, which no call sets back) */
static bool same_file(const cavs_ckpt *k) {
  struct stat now;
  return !fstat(k->fd, &now) && now.st_ino == k->st.st_ino && now.st_dev == k->st.st_dev &&
         now.st_size == k->st.st_size && now.st_mtim.tv_sec == k->st.st_mtim.tv_sec &&
         now.st_mtim.tv_nsec == k->st.st_mtim.tv_nsec && now.st_ctim.tv_sec == k->st.st_ctim.tv_sec &&
         now.st_ctim.tv_nsec == k->st.st_ctim.tv_nsec;
}

/* Bytes [at, at + n) of an opened checkpoint's file into its data (a read one has them
   all): false when they cannot be read whole. */
static bool ck_read(const cavs_ckpt *k, size_t at, size_t n) {
  if (k->fd < 0 || !n) return true;
  if (at > k->size || n > k->size - at) return false;
  for (size_t got = 0; got < n;) {
    ssize_t r = pread(k->fd, k->data + at + got, n - got, (off_t)(at + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += (size_t)r;
  }
  return true;
}
/* the same, and the file still the one whose checksum was taken */
static bool ck_load(const cavs_ckpt *k, size_t at, size_t n) {
  return k->fd < 0 || (ck_read(k, at, n) && same_file(k));
}

/* r's next n bytes in memory (n <= what is left): read, with what follows them up to
   CK_AHEAD, unless the window has them (the file checked once, after the parse) */
static bool ahead(Rd *r, size_t n) {
  if (!r->k || (r->at >= r->lo && r->at <= r->hi && n <= r->hi - r->at)) return true;
  size_t want = n > CK_AHEAD ? n : CK_AHEAD, left = r->n - r->at;
  if (want > left) want = left;
  if (!ck_read(r->k, r->at, want)) return false;
  r->lo = r->at, r->hi = r->at + want;
  return true;
}

static const void *take(Rd *r, size_t n) {
  if (r->bad || n > r->n - r->at || !ahead(r, n)) {
    r->bad = true;
    return NULL;
  }
  const void *p = r->p + r->at;
  r->at += n;
  return p;
}
/* past n bytes that are not read now (a parameter's values: read when applied) */
static void skip(Rd *r, size_t n) {
  if (r->bad || n > r->n - r->at) r->bad = true;
  else r->at += n;
}
/* the u32 at r's place, not taken (a string's length, checked against what get_str
   makes of it); 0 past the end */
static uint32_t peek_u32(Rd *r) {
  uint32_t v = 0;
  if (!r->bad && r->at + 4 <= r->n && ahead(r, 4)) memcpy(&v, r->p + r->at, 4);
  return v;
}
static uint32_t get_u32(Rd *r) {
  uint32_t v = 0;
  const void *p = take(r, 4);
  if (p) memcpy(&v, p, 4);
  return v;
}
static int64_t get_i64(Rd *r) {
  int64_t v = 0;
  const void *p = take(r, 8);
  if (p) memcpy(&v, p, 8);
  return v;
}
static double get_f64(Rd *r) {
  double v = 0;
  const void *p = take(r, 8);
  if (p) memcpy(&v, p, 8);
  return v;
}
static char *get_str(Rd *r) {
  uint32_t n = get_u32(r);
  const char *p = take(r, n);
  if (!p) return NULL;
  char *s = malloc((size_t)n + 1); /* (n is at most the file's size) */
  if (!s) {
    r->bad = r->oom = true;
    return NULL;
  }
  memcpy(s, p, n);
  s[n] = 0;
  return s;
}

void cavs_ckpt_free(cavs_ckpt *k) {
  if (!k) return;
  if (k->fd >= 0) {
    close(k->fd);
    if (k->data) munmap(k->data, k->size ? k->size : 1);
  } else {
    free(k->data);
  }
  free(k->path);
  free(k->model);
  free(k->hash);
  free(k->source);
  free(k->record);
  for (int i = 0; i < k->ndims; i++) free(k->dim_name[i]);
  for (int i = 0; i < k->nwords; i++) free(k->words ? k->words[i] : NULL);
  free(k->words);
  for (int i = 0; i < k->nparams; i++) free(k->params ? k->params[i].name : NULL);
  free(k->params);
  for (int i = 0; i < k->noptions; i++) free(k->opt_name[i]);
  free(k);
}

int cavs_is_identifier(const char *s) {
  if (!s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return 0;
  size_t n = 1;
  for (s++; *s; s++, n++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_'))
      return 0;
  return n <= CAVS_MAX_NAME;
}

/* A checkpoint can come from anyone: every string in it is held to what the code that
 * uses it expects (names become C symbols and cache entries, words vocabulary keys, the
 * source cavsc's input), every number to its range, every size to the file's. */
static bool no_nul(const char *s, size_t n) { return s && strlen(s) == n; }
/* What the loaders can make a token of: anything but a space or a line break. */
static bool word_ok(const char *s, size_t n) {
  return no_nul(s, n) && n > 0 && !strchr(s, ' ') && !strchr(s, '\n');
}
static bool hash_ok(const char *s) {
  if (!s || strlen(s) != 16) return false;
  for (; *s; s++)
    if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))) return false;
  return true;
}
static bool unit(double x) { return x >= 0 && x < 1; }
static bool nonneg(double x) { return isfinite(x) && x >= 0; }

/* A step of reading a checkpoint: false with the message in err when the file is not one
 * this reads. */
#define FAIL(...)                       \
  do {                                  \
    snprintf(err, errlen, __VA_ARGS__); \
    return false;                       \
  } while (0)

/* The file into memory, whole; NULL with the message in err. */
/* The file opened for reading, a regular file of at most CAVS_MAX_CKPT_BYTES (*st what
 * it is); -1 with the message in err. */
static int open_file(const char *path, struct stat *st, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
    return -1;
  }
  if (fstat(fd, st) || !S_ISREG(st->st_mode)) {
    snprintf(err, errlen, "'%s' is not a cavs checkpoint (not a regular file)", path);
    close(fd);
    return -1;
  }
  if ((uint64_t)st->st_size > CAVS_MAX_CKPT_BYTES) {
    snprintf(err, errlen, "'%s' is %lld bytes; checkpoints are at most %llu", path, (long long)st->st_size,
             (unsigned long long)CAVS_MAX_CKPT_BYTES);
    close(fd);
    return -1;
  }
  return fd;
}

static cavs_ckpt *slurp(const char *path, char *err, size_t errlen) {
  struct stat st;
  int fd = open_file(path, &st, err, errlen);
  if (fd < 0) return NULL;
  cavs_ckpt *k = calloc(1, sizeof *k);
  size_t cap = (size_t)st.st_size + 1; /* one more: a file that grew is read to its new size */
  if (k) k->fd = -1, k->data = malloc(cap);
  if (!k || !k->data) {
    snprintf(err, errlen, "out of memory reading '%s' (%lld bytes)", path, (long long)st.st_size);
    close(fd);
    if (k) free(k);
    errno = ENOMEM;
    return NULL;
  }
  for (;;) {
    ssize_t got = read(fd, k->data + k->size, cap - k->size);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    k->size += (size_t)got;
    if (k->size == cap) break;
  }
  close(fd);
  if (k->size == cap) {
    snprintf(err, errlen, "'%s' changed while it was read", path);
    cavs_ckpt_free(k);
    return NULL;
  }
  return k;
}

/* The file opened, not read: its checksum taken as it streams through a buffer of its
 * own, its bytes read into k->data only as they are taken (the structure, now; a
 * parameter's values, when a model takes them). NULL with the message in err. */
static cavs_ckpt *stream(const char *path, char *err, size_t errlen) {
  struct stat st;
  int fd = open_file(path, &st, err, errlen);
  if (fd < 0) return NULL;
  cavs_ckpt *k = calloc(1, sizeof *k);
  if (!k) {
    snprintf(err, errlen, "out of memory reading '%s'", path);
    close(fd);
    errno = ENOMEM;
    return NULL;
  }
  k->fd = fd, k->st = st;
  k->size = (size_t)k->st.st_size;
  /* (pages of zeros that take nothing until written: MAP_NORESERVE, as most stay so) */
  void *map = mmap(NULL, k->size ? k->size : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  size_t chunk = (size_t)1 << 20;
  unsigned char *buf = map == MAP_FAILED ? NULL : malloc(chunk);
  k->data = map == MAP_FAILED ? NULL : map;
  if (!buf) {
    snprintf(err, errlen, "out of memory reading '%s' (%zu bytes of address space)", path, k->size);
    cavs_ckpt_free(k);
    errno = ENOMEM;
    return NULL;
  }
  size_t at = 0, body = k->size >= 8 ? k->size - 8 : 0;
  uint64_t h = FNV_START;
  while (at < k->size) {
    size_t n = k->size - at < chunk ? k->size - at : chunk;
    ssize_t got = pread(fd, buf, n, (off_t)at);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (at < body) h = fnv64_more(h, buf, (size_t)got < body - at ? (size_t)got : body - at);
    at += (size_t)got;
  }
  free(buf);
  k->streamed = h;
  if (at != k->size || !same_file(k)) {
    snprintf(err, errlen, "'%s' changed while it was read", path);
    cavs_ckpt_free(k);
    return NULL;
  }
  return k;
}

/* The magic, the format version and the checksum; r then reads what they frame. */
static bool read_frame(cavs_ckpt *k, Rd *r, uint32_t *version, const char *path, char *err, size_t errlen) {
  if (k->size < 20) FAIL("'%s' is not a cavs checkpoint", path);
  if (!ck_load(k, 0, 12) || !ck_load(k, k->size - 8, 8)) FAIL("'%s' changed while it was read", path);
  if (memcmp(k->data, CKPT_MAGIC, 8)) FAIL("'%s' is not a cavs checkpoint", path);
  memcpy(version, k->data + 8, 4);
  if (*version < 1 || *version > CKPT_VERSION)
    FAIL("'%s' is checkpoint format %u; this cavs reads format %d", path, *version, CKPT_VERSION);
  uint64_t want, have = k->fd >= 0 ? k->streamed : fnv64(k->data, k->size - 8);
  memcpy(&want, k->data + k->size - 8, 8);
  if (want != have) FAIL("'%s' is damaged: its checksum does not match (truncated or modified)", path);
  *r = (Rd){k->data, k->size - 8, 12, false, false, k->fd >= 0 ? k : NULL, 0, 0};
  return true;
}

/* The model's name, hash, source, precision and dims. */
static bool read_model(cavs_ckpt *k, Rd *r, const char *path, char *err, size_t errlen) {
  k->model = get_str(r);
  k->hash = get_str(r);
  uint32_t slen = peek_u32(r);
  k->source = get_str(r);
  if (r->bad) FAIL("'%s' is damaged (bad structure)", path);
  /* the name becomes a C symbol and a cache entry: the language's identifier rule */
  if (!cavs_is_identifier(k->model)) FAIL("'%s' is damaged: the model name is not an identifier", path);
  if (!hash_ok(k->hash)) FAIL("'%s' is damaged: the source hash is not 16 hexadecimal digits", path);
  if (!no_nul(k->source, slen) || slen > CAVS_MAX_SOURCE_BYTES)
    FAIL("'%s' is damaged: the model source holds a NUL byte or is longer than %d bytes", path, CAVS_MAX_SOURCE_BYTES);
  k->precision = (int)get_u32(r);
  if (k->precision != CAVS_FLOAT && k->precision != CAVS_DOUBLE) FAIL("'%s' is damaged (precision)", path);
  uint32_t nd = get_u32(r);
  if (nd > CAVS_MAX_DIMS) FAIL("'%s' is damaged: %u dims (at most %d)", path, nd, CAVS_MAX_DIMS);
  k->ndims = (int)nd;
  for (int i = 0; i < k->ndims; i++) {
    k->dim_name[i] = get_str(r);
    int64_t v = get_i64(r);
    if (r->bad) break;
    if (!cavs_is_identifier(k->dim_name[i])) FAIL("'%s' is damaged: dim %d's name is not an identifier", path, i);
    for (int j = 0; j < i; j++)
      if (!strcmp(k->dim_name[i], k->dim_name[j])) FAIL("'%s' is damaged: dim %s appears twice", path, k->dim_name[i]);
    if (v < 1 || v > CAVS_MAX_DIM)
      FAIL("'%s' is damaged: dim %s is %lld (1..%ld)", path, k->dim_name[i], (long long)v, CAVS_MAX_DIM);
    k->dim_value[i] = (long)v;
  }
  return true;
}

static bool read_vocab(cavs_ckpt *k, Rd *r, const char *path, char *err, size_t errlen) {
  uint32_t nw = get_u32(r);
  if (nw > r->n / 4 || nw > CAVS_MAX_DIM) FAIL("'%s' is damaged (vocabulary size)", path);
  k->words = calloc((size_t)nw + 1, sizeof(char *));
  if (!k->words) {
    r->oom = true;
    FAIL("out of memory reading '%s'", path);
  }
  k->nwords = (int)nw;
  for (int i = 0; i < k->nwords && !r->bad; i++) {
    uint32_t wlen = peek_u32(r);
    k->words[i] = get_str(r);
    if (!r->bad && !word_ok(k->words[i], wlen))
      FAIL("'%s' is damaged: vocabulary word %d is empty or holds a NUL, a space or a line break", path, i);
  }
  return true;
}

/* The parameters and the optimizer's state: where their values are in the file. */
static bool read_params(cavs_ckpt *k, Rd *r, uint32_t version, const char *path, char *err, size_t errlen) {
  uint32_t np = get_u32(r);
  if (np > r->n / 4 || np > CAVS_MAX_PARAMS) FAIL("'%s' is damaged (parameter count)", path);
  k->params = calloc((size_t)np + 1, sizeof(KParam));
  if (!k->params) {
    r->oom = true;
    FAIL("out of memory reading '%s'", path);
  }
  k->nparams = (int)np;
  size_t es = k->precision == CAVS_DOUBLE ? 8 : 4, total = 0;
  for (int i = 0; i < k->nparams && !r->bad; i++) {
    KParam *p = &k->params[i];
    p->name = get_str(r);
    int64_t rows = get_i64(r), cols = get_i64(r);
    if (r->bad) break;
    if (!cavs_is_identifier(p->name)) FAIL("'%s' is damaged: parameter %d's name is not an identifier", path, i);
    /* each factor at most the file's size, so the product cannot overflow */
    if (rows < 1 || cols < 1 || (uint64_t)rows > r->n || (uint64_t)cols > r->n ||
        (uint64_t)rows * (uint64_t)cols > (r->n - r->at) / es)
      FAIL("'%s' is damaged (the shape of parameter %s)", path, p->name);
    p->rows = (long)rows;
    p->cols = (long)cols;
    p->at = r->at;
    skip(r, (size_t)rows * (size_t)cols * es);
    total += (size_t)rows * (size_t)cols * es; /* at most the file's size: no overflow */
  }
  k->steps = (long)get_i64(r);
  const unsigned char *has = take(r, 1);
  if (r->bad || k->steps < 0 || *has > (version >= 8 ? 2 : 1)) FAIL("'%s' is damaged (optimizer state)", path);
  k->nmoments = version >= 8 ? *has : 2 * *has; /* (format 7 and before: both or neither) */
  if (k->nmoments >= 1) {
    k->m1_at = r->at;
    skip(r, total);
  }
  if (k->nmoments == 2) {
    k->m2_at = r->at;
    skip(r, total);
  }
  return true;
}

/* The training state as formats 1 and 2 have it. */
static void read_state_v1(cavs_ckpt *k, Rd *r, uint32_t version) {
  cavs_train_state *t = &k->ts;
  t->epoch = (int)get_u32(r);
  t->rng = (uint64_t)get_i64(r);
  t->best = get_f64(r);
  t->seed = (uint64_t)get_i64(r);
  t->threads = (int)get_u32(r);
  t->batch = (int)get_u32(r);
  char *fmt = get_str(r);
  if (fmt && strlen(fmt) < sizeof t->format) snprintf(t->format, sizeof t->format, "%s", fmt);
  else r->bad = true;
  free(fmt);
  t->optim.kind = (int)get_u32(r);
  t->optim.lr = get_f64(r);
  t->optim.clip = get_f64(r);
  t->optim.weight_decay = get_f64(r);
  t->optim.beta1 = get_f64(r);
  t->optim.beta2 = get_f64(r);
  t->optim.eps = get_f64(r);
  if (version >= 2) t->graphs_done = (long)get_i64(r);
}

/* Format 3's schedule, selection and frozen parameters. */
static bool read_state_v3(cavs_ckpt *k, Rd *r, const char *path, char *err, size_t errlen) {
  cavs_train_state *t = &k->ts;
  t->select = (int)get_u32(r);
  t->lr_decay = get_f64(r);
  t->lr_step = (int)get_u32(r);
  t->warmup = (int)get_u32(r);
  t->patience = (int)get_u32(r);
  t->since_best = (int)get_u32(r);
  t->best_epoch = (int)get_u32(r);
  uint32_t nf = get_u32(r);
  if (!r->bad && nf > (uint32_t)k->nparams) FAIL("'%s' is damaged (frozen parameters)", path);
  for (uint32_t i = 0; i < nf && !r->bad; i++) {
    uint32_t p = get_u32(r);
    if (r->bad) break;
    if (p >= (uint32_t)k->nparams || k->params[p].frozen) FAIL("'%s' is damaged (frozen parameters)", path);
    k->params[p].frozen = true;
  }
  return true;
}

/* Format 4's momentum and the schedule with its state; before it, a decay is the step
 * schedule, and a plateau has no best yet. */
static void read_state_v4(cavs_ckpt *k, Rd *r, uint32_t version) {
  cavs_train_state *t = &k->ts;
  if (version < 4) {
    t->schedule = t->lr_decay > 0 && t->lr_decay < 1 ? CAVS_SCHED_STEP : CAVS_SCHED_CONSTANT;
    t->plateau_best = -1;
    return;
  }
  t->optim.momentum = get_f64(r);
  t->schedule = (int)get_u32(r);
  t->lr_min = get_f64(r);
  t->cosine_epochs = (int)get_u32(r);
  t->plateau_factor = get_f64(r);
  t->plateau_patience = (int)get_u32(r);
  t->lr_now = get_f64(r);
  t->plateau_best = get_f64(r);
  t->plateau_bad = (int)get_u32(r);
}

/* Format 5's options: each a name of the model's kind once, with a value of its kind (a
 * probability, or for `clip` a gradient-norm clip: what cavs_model_set_option takes);
 * which names the model has is checked when applied. */
static bool read_options(cavs_ckpt *k, Rd *r, uint32_t version, const char *path, char *err, size_t errlen) {
  if (version < 5) return true;
  uint32_t n = get_u32(r);
  if (r->bad) return true; /* (reported as bad structure) */
  if (n > CAVS_MAX_OPTIONS) FAIL("'%s' is damaged (options: %u, at most %d)", path, n, CAVS_MAX_OPTIONS);
  for (uint32_t i = 0; i < n; i++) {
    char *name = get_str(r);
    double v = get_f64(r);
    if (!name) return true;
    k->opt_name[k->noptions] = name;
    k->opt_value[k->noptions++] = v;
    if (!cavs_is_identifier(name) || !cavs_option_value_ok(cavs_option_kind_of(name), v))
      FAIL("'%s' is damaged (options)", path);
    for (int j = 0; j < k->noptions - 1; j++)
      if (!strcmp(k->opt_name[j], name)) FAIL("'%s' is damaged (options: %s twice)", path, name);
  }
  return true;
}

/* Format 6's first decay of the step schedule, and its carried state: at most a
 * minibatch's graphs (2^20) of a state no wider than a model's buffer can be, every
 * value finite; whether its width is the model's is checked when applied. Then format
 * 7's deviation of the chunk lengths, format 9's reading of the chunks and format 10's
 * log record. */
static bool read_carry(cavs_ckpt *k, Rd *r, uint32_t version, const char *path, char *err, size_t errlen) {
  if (version < 6) return true;
  k->ts.lr_decay_start = (int)get_u32(r); /* (checked with the schedule) */
  uint32_t rows = get_u32(r), w = get_u32(r);
  if (r->bad) return true; /* (reported as bad structure) */
  if (rows > CAVS_MAX_CARRIED || w > (1u << 28) || (rows && !w) || (!rows && w))
    FAIL("'%s' is damaged (carried state: %u rows of %u)", path, rows, w);
  size_t n = (size_t)rows * w, es = k->precision == CAVS_DOUBLE ? 8 : 4;
  const unsigned char *p = take(r, n * es);
  if (!p) return true;
  for (size_t i = 0; i < n; i++) {
    double x;
    if (es == 8) memcpy(&x, p + i * 8, 8);
    else {
      float f;
      memcpy(&f, p + i * 4, 4);
      x = f;
    }
    if (!isfinite(x)) FAIL("'%s' is damaged (carried state: a value that is not finite)", path);
  }
  k->carry_rows = (int)rows;
  k->carry_w = w;
  k->carry_at = (size_t)(p - k->data);
  if (version >= 7) k->ts.bptt_vary = get_f64(r); /* (checked with the schedule) */
  if (version >= 9) k->ts.bptt_state = (int)get_u32(r); /* (checked with the state) */
  if (version < 10) return true;
  uint32_t rn = peek_u32(r);
  char *rec = rn <= CAVS_MAX_CKPT_RECORD ? get_str(r) : NULL;
  if (!rec && rn <= CAVS_MAX_CKPT_RECORD) return true; /* (reported as bad structure, or memory) */
  if (!rec || !record_fits(rec, rn)) {
    free(rec);
    FAIL("'%s' is damaged (its log record: not one line of at most %d bytes)", path, CAVS_MAX_CKPT_RECORD);
  }
  if (*rec) k->record = rec;
  else free(rec);
  return true;
}

/* What is wrong with a training state, or NULL: every counter within what the command
 * line gives, or what a run can reach from it, so that going on from here cannot
 * overflow one (u32 fields read as int are already refused when negative); every rate
 * finite; the format a name cavs knows. Checked on reading (check_state) and before
 * saving (cavs_ckpt_save), so that no save replaces a file with one that reading
 * refuses. */
static const char *state_fault(const cavs_train_state *t) {
  const cavs_optim *o = &t->optim;
  if (t->epoch < 0 || t->epoch > CAVS_MAX_EPOCHS || t->threads < 0 || t->threads > 1024 || t->batch < 0 ||
      t->batch > (1 << 20) || t->graphs_done < 0 || t->graphs_done > CAVS_MAX_GRAPH_VERTICES ||
      !(t->best == -1 || nonneg(t->best)))
    return "training state";
  if (t->select < 0 || t->select > 3 || !(t->lr_decay >= 0 && t->lr_decay <= 1) || t->lr_step < 0 ||
      t->lr_step > 1000000 || t->warmup < 0 || t->warmup > (1 << 30) || t->patience < 0 || t->patience > 1000000 ||
      t->since_best < 0 || t->since_best > t->epoch || t->best_epoch < 0 || t->best_epoch > t->epoch)
    return "training schedule";
  /* format 4: a plateau's count is reset once past its patience, and is epochs */
  if (t->schedule < 0 || t->schedule >= CAVS_SCHED_COUNT || !nonneg(t->lr_min) || t->cosine_epochs < 0 ||
      t->cosine_epochs > CAVS_MAX_EPOCHS || !(t->plateau_factor >= 0 && t->plateau_factor < 1) ||
      t->plateau_patience < 0 || t->plateau_patience > 1000000 || !nonneg(t->lr_now) ||
      !(t->plateau_best == -1 || nonneg(t->plateau_best)) || t->plateau_bad < 0 ||
      t->plateau_bad > t->plateau_patience || t->plateau_bad > t->epoch || t->lr_decay_start < 0 ||
      t->lr_decay_start > 1000000)
    return "learning-rate schedule";
  if (!(t->bptt_vary >= 0 && t->bptt_vary <= CAVS_MAX_BPTT_VARY)) return "chunk lengths";
  /* (chunks of lengths that vary are read in carried streams alone) */
  if (t->bptt_state < CAVS_BPTT_UNSAID || t->bptt_state > CAVS_BPTT_RESET ||
      (t->bptt_state == CAVS_BPTT_RESET && t->bptt_vary > 0))
    return "reading of the chunks";
  int bptt;
  if (!memchr(t->format, 0, sizeof t->format) || (*t->format && !cv_format_named(t->format, &bptt)))
    return "data format";
  if (o->kind < 0 || o->kind >= CAVS_OPTIM_COUNT || !nonneg(o->lr) || !nonneg(o->clip) || !nonneg(o->weight_decay) ||
      !unit(o->beta1) || !unit(o->beta2) || !nonneg(o->eps) || !unit(o->momentum))
    return "optimizer settings";
  return NULL;
}

static bool check_state(const cavs_ckpt *k, const char *path, char *err, size_t errlen) {
  if (k->steps > CAVS_MAX_STEPS) FAIL("'%s' is damaged: %ld optimizer steps (at most %ld)", path, k->steps, CAVS_MAX_STEPS);
  const char *fault = state_fault(&k->ts);
  if (fault) FAIL("'%s' is damaged (%s)", path, fault);
  return true;
}
#undef FAIL

/* Reading checks everything before anything is used: a damaged or crafted file is
 * refused with what is wrong with it. */
static cavs_ckpt *parse(cavs_ckpt *k, const char *path, char *err, size_t errlen) {
  if (!k) return NULL;
  if (!(k->path = malloc(strlen(path) + 1))) {
    snprintf(err, errlen, "out of memory reading '%s'", path);
    cavs_ckpt_free(k);
    errno = ENOMEM;
    return NULL;
  }
  strcpy(k->path, path);
  Rd r = {0};
  uint32_t version;
  bool ok = read_frame(k, &r, &version, path, err, errlen) && read_model(k, &r, path, err, errlen) &&
            read_vocab(k, &r, path, err, errlen) && read_params(k, &r, version, path, err, errlen);
  if (ok) {
    read_state_v1(k, &r, version);
    ok = version < 3 || read_state_v3(k, &r, path, err, errlen);
  }
  if (ok) {
    read_state_v4(k, &r, version);
    ok = read_options(k, &r, version, path, err, errlen) && read_carry(k, &r, version, path, err, errlen);
  }
  if (ok) {
    if (r.bad || r.at != r.n) {
      snprintf(err, errlen, "'%s' is damaged (bad structure)", path);
      ok = false;
    }
  }
  if (ok) ok = check_state(k, path, err, errlen);
  /* (opened: what was parsed is the file whose checksum was taken, or the parse's
     failure is the change's) */
  if (k->fd >= 0 && !same_file(k)) {
    snprintf(err, errlen, "'%s' changed while it was read", path);
    ok = false;
  }
  /* (whatever the parse made of a string it could not hold: the memory's failure, not
     the file's) */
  if (!ok && r.oom) snprintf(err, errlen, "out of memory reading '%s'", path);
  if (!ok) {
    cavs_ckpt_free(k);
    errno = r.oom ? ENOMEM : errno;
    return NULL;
  }
  return k;
}

cavs_ckpt *cavs_ckpt_read(const char *path, char *err, size_t errlen) { return parse(slurp(path, err, errlen), path, err, errlen); }
cavs_ckpt *cavs_ckpt_open(const char *path, char *err, size_t errlen) { return parse(stream(path, err, errlen), path, err, errlen); }

const char *cavs_ckpt_model(const cavs_ckpt *k) { return k->model; }
int cavs_ckpt_carried(const cavs_ckpt *k, long *width) {
  if (width) *width = k->carry_w;
  return k->carry_rows;
}
const char *cavs_ckpt_source(const cavs_ckpt *k) { return k->source; }
const char *cavs_ckpt_record(const cavs_ckpt *k) { return k->record; }
const char *cavs_ckpt_hash(const cavs_ckpt *k) { return k->hash; }
int cavs_ckpt_precision(const cavs_ckpt *k) { return k->precision; }
const cavs_train_state *cavs_ckpt_state(const cavs_ckpt *k) { return &k->ts; }
int cavs_ckpt_ndims(const cavs_ckpt *k) { return k->ndims; }
int cavs_ckpt_noptions(const cavs_ckpt *k) { return k->noptions; }
const char *cavs_ckpt_option(const cavs_ckpt *k, int i, double *value) {
  if (i < 0 || i >= k->noptions) return NULL;
  if (value) *value = k->opt_value[i];
  return k->opt_name[i];
}
const char *cavs_ckpt_dim_name(const cavs_ckpt *k, int i) { return i >= 0 && i < k->ndims ? k->dim_name[i] : NULL; }
long cavs_ckpt_dim_value(const cavs_ckpt *k, int i) { return i >= 0 && i < k->ndims ? k->dim_value[i] : -1; }

int cavs_ckpt_moments(const cavs_ckpt *k, long *steps) {
  if (steps) *steps = k->steps;
  return k->nmoments;
}

long cavs_ckpt_param_count(const cavs_ckpt *k) {
  long n = 0;
  for (int i = 0; i < k->nparams; i++) n += k->params[i].rows * k->params[i].cols;
  return n;
}

cavs_vocab *cavs_ckpt_vocab(const cavs_ckpt *k) {
  cavs_vocab *v = cavs_vocab_new();
  if (!v) return NULL; /* (errno ENOMEM) */
  for (int i = 0; i < k->nwords; i++) {
    int id = cavs_vocab_id(v, k->words[i], strlen(k->words[i]), 1);
    if (id != i) {
      /* memory ran out (ENOMEM), or a damaged vocabulary (a duplicate word, EINVAL)
         cannot keep its ids */
      int e = id < 0 ? errno : EINVAL;
      cavs_vocab_free(v);
      errno = e;
      return NULL;
    }
  }
  return v;
}

int cavs_ckpt_dims(const cavs_ckpt *k, const cavs_desc *d, long *dims, char *err, size_t errlen) {
  if (k->ndims != d->ndims) {
    snprintf(err, errlen, "the checkpoint has %d dims, model '%s' has %d", k->ndims, d->name, d->ndims);
    return -1;
  }
  for (int i = 0; i < d->ndims; i++) {
    if (strcmp(k->dim_name[i], d->dims[i].name)) {
      snprintf(err, errlen, "the checkpoint's dim %d is '%s', the model's is '%s'", i, k->dim_name[i], d->dims[i].name);
      return -1;
    }
    dims[i] = k->dim_value[i];
  }
  return 0;
}

/* Parameter i's values (or a moment's) from the checkpoint's, the rows this process
   holds (a placed expert table's: its own experts') */
/* Parameter i's values, at byte `at` of the checkpoint, into `flat` (the parameters or
 * a moment): the rows the model holds (a placed expert table: its own experts'), read
 * from the file first when the checkpoint was opened. -1 with the message in err when
 * they cannot be. */
static int get_param(const cavs_ckpt *k, cavs_model *m, void *flat, int i, size_t at, char *err, size_t errlen) {
  const cavs_param_desc *p = &m->d->params[i];
  long rows = cv_lin(&p->rows, m->ctx.dims), cols = cv_lin(&p->cols, m->ctx.dims);
  long off = cv_lin(&p->col_off, m->ctx.dims), ld = m->pg_cols[p->group], a, b;
  cv_experts_rows_held(m, p->group, &a, &b);
  if (b > rows) b = rows;
  if (b <= a || cols <= 0) return 0;
  char *dst = (char *)flat + (m->pg_off[p->group] + (size_t)a * (size_t)ld + (size_t)off) * m->esize;
  size_t row = (size_t)cols * m->esize;
  at += (size_t)a * row;
  if (!ck_load(k, at, (size_t)(b - a) * row)) {
    snprintf(err, errlen, "'%s' changed since it was opened, or cannot be read (parameter %s)", k->path,
             p->name);
    return -1;
  }
  /* one copy: a copy a row waited for the device a row */
  if (m->be->upload2d(m, dst, (size_t)ld * m->esize, k->data + at, row, row, (size_t)(b - a))) {
    snprintf(err, errlen, "parameter %s: %s", p->name, m->err);
    errno = EIO; /* (the device's failure) */
    return -1;
  }
  return 0;
}

/* Whether the checkpoint is of model m as it is (name, source, precision, dims, every
 * parameter's name and shape); -1 with the message in err. */
static int check_fits(const cavs_ckpt *k, const cavs_model *m, char *err, size_t errlen) {
  const cavs_desc *d = m->d;
  if (strcmp(k->model, d->name)) {
    snprintf(err, errlen, "the checkpoint is of model '%s', not '%s'", k->model, d->name);
    return -1;
  }
  if (strcmp(k->hash, d->source_hash)) {
    snprintf(err, errlen, "the checkpoint was trained from another version of model '%s' (source hash %s, this one %s)",
             d->name, k->hash, d->source_hash);
    return -1;
  }
  if (k->precision != d->precision) {
    snprintf(err, errlen, "the checkpoint is in %s precision, the model in %s", k->precision == CAVS_DOUBLE ? "double" : "float",
             d->precision == CAVS_DOUBLE ? "double" : "float");
    return -1;
  }
  for (int i = 0; i < d->ndims; i++)
    if (i >= k->ndims || k->dim_value[i] != m->ctx.dims[i]) {
      snprintf(err, errlen, "dim %s is %ld in the checkpoint but %ld here", d->dims[i].name,
               i < k->ndims ? k->dim_value[i] : -1L, m->ctx.dims[i]);
      return -1;
    }
  if (k->nparams != d->nparams) {
    snprintf(err, errlen, "the checkpoint has %d parameters, the model %d", k->nparams, d->nparams);
    return -1;
  }
  for (int i = 0; i < d->nparams; i++) {
    long rows = cv_lin(&d->params[i].rows, m->ctx.dims), cols = cv_lin(&d->params[i].cols, m->ctx.dims);
    if (strcmp(k->params[i].name, d->params[i].name) || k->params[i].rows != rows || k->params[i].cols != cols) {
      snprintf(err, errlen, "parameter %d is %s[%ld,%ld] in the checkpoint but %s[%ld,%ld] in the model", i,
               k->params[i].name, k->params[i].rows, k->params[i].cols, d->params[i].name, rows, cols);
      return -1;
    }
  }
  return 0;
}

int cavs_ckpt_apply_weights(const cavs_ckpt *k, cavs_model *m, char *err, size_t errlen) {
  const cavs_desc *d = m->d;
  cv_ptables_free(m); /* inference's tables: of the parameters this replaces */
  if (check_fits(k, m, err, errlen)) return -1;
  for (int i = 0; i < d->nparams; i++)
    if (get_param(k, m, m->pflat, i, k->params[i].at, err, errlen)) return -1;
  for (int i = 0; i < d->nparams; i++) m->frozen[d->params[i].group] = 0;
  m->drop_seed = k->ts.seed; /* dropout draws as the run that saved it would */
  /* the options as saved (a format 4 checkpoint has none: the model's defaults stay) */
  for (int i = 0; i < k->noptions; i++)
    if (cavs_model_set_option(m, k->opt_name[i], k->opt_value[i])) {
      snprintf(err, errlen, "the checkpoint's options: %s", m->err);
      return -1;
    }
  return 0;
}

int cavs_ckpt_apply(const cavs_ckpt *k, cavs_model *m, char *err, size_t errlen) {
  const cavs_desc *d = m->d;
  if (cavs_ckpt_apply_weights(k, m, err, errlen)) return -1;
  /* frozen as they were when saved (and the others not) */
  for (int i = 0; i < d->nparams; i++) {
    if (!k->params[i].frozen) continue;
    int g = d->params[i].group;
    for (int j = 0; j < d->nparams; j++)
      if (j != i && d->params[j].group == g) {
        snprintf(err, errlen,
                 "parameter '%s' was frozen when the checkpoint was saved, but in this build of model '%s' it shares "
                 "its storage with '%s' (their products are merged) and cannot be frozen alone: build the model with "
                 "--no-merge, as it was built then",
                 d->params[i].name, d->name, d->params[j].name);
        return -1;
      }
    if (cavs_model_freeze(m, i, 1)) {
      snprintf(err, errlen, "%s", m->err);
      return -1;
    }
  }
  m->step = k->steps;
  cv_release_moments(m);
  if (k->nmoments) {
    if (cv_alloc_moments(m, k->nmoments)) {
      snprintf(err, errlen, "%s", m->err);
      return -1;
    }
    size_t a1 = k->m1_at, a2 = k->m2_at;
    for (int i = 0; i < d->nparams; i++) {
      size_t bytes = (size_t)k->params[i].rows * (size_t)k->params[i].cols * m->esize;
      if (get_param(k, m, m->m1, i, a1, err, errlen) ||
          (k->nmoments == 2 && get_param(k, m, m->m2, i, a2, err, errlen)))
        return -1;
      a1 += bytes;
      a2 += bytes;
    }
  }
  cv_experts_new_params(m); /* (copies of other processes' experts made before are stale now) */
  /* the carried state: the model carries from it (its one state of that width) */
  if (k->carry_rows) {
    if (cavs_model_carry_state(m, 1) || m->bw[m->carry_state] != k->carry_w) {
      snprintf(err, errlen, "the checkpoint carries a state of %ld values a graph, which model '%s' %s", k->carry_w,
               d->name, m->carry_state < 0 ? "cannot carry" : "does not scatter");
      return -1;
    }
    if (cavs_model_set_carried(m, k->data + k->carry_at, k->carry_rows)) {
      snprintf(err, errlen, "%s", cavs_model_error(m));
      return -1;
    }
  }
  return 0;
}

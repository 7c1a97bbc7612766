/* data.c: datasets read once and kept as graphs, the vocabulary that maps tokens to ids,
 * the loader that reads a file line by line for one of the formats of its table
 * (data_ptb.c, data_text.c, data_cgf.c), and the synthetic data of `cavs gen`. Every
 * parser is iterative, so depth is bounded by memory, not by the C stack; an error names
 * the file and line and leaves nothing half-loaded. */
#include "data.h"

#include <zlib.h>

#include <fcntl.h>
#include <float.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

/* A UTF-8 byte-order mark (what some editors put at the start of a text file) is not
 * part of the first line: it is dropped, and the line's columns count from after it. */
static size_t skip_bom(char *line, size_t n) {
  if (n < 3 || memcmp(line, "\xEF\xBB\xBF", 3)) return n;
  memmove(line, line + 3, n - 3 + 1); /* with getline's NUL */
  return n - 3;
}

/* ---- vocabulary: open addressing over interned strings ---- */

struct cavs_vocab {
  char **words;
  int n, cap;
  int *slots; /* ids, -1 empty */
  int nslots;
};

/* Every loader reports a failed growth as an error, with errno set to ENOMEM: the library
 * never aborts. */
bool cv_grow_array(void *p, size_t elem, size_t n) {
  size_t bytes;
  if (__builtin_mul_overflow(elem, n ? n : 1, &bytes)) return errno = ENOMEM, false;
  void *q = realloc(*(void **)p, bytes);
  if (!q) return errno = ENOMEM, false;
  *(void **)p = q;
  return true;
}

static unsigned vhash(const char *s, size_t n) {
  unsigned h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
  return h;
}

cavs_vocab *cavs_vocab_new(void) {
  cavs_vocab *v = calloc(1, sizeof *v);
  if (!v) return NULL;
  /* <eos> ends every `text` sentence */
  if (cavs_vocab_id(v, "<unk>", 5, 1) < 0 || cavs_vocab_id(v, "<eos>", 5, 1) < 0) {
    cavs_vocab_free(v);
    return NULL;
  }
  return v;
}

void cavs_vocab_free(cavs_vocab *v) {
  if (!v) return;
  for (int i = 0; i < v->n; i++) free(v->words[i]);
  free(v->words);
  free(v->slots);
  free(v);
}

int cavs_vocab_size(const cavs_vocab *v) { return v->n; }

const char *cavs_vocab_word(const cavs_vocab *v, int id) { return id >= 0 && id < v->n ? v->words[id] : NULL; }

int cavs_vocab_id(cavs_vocab *v, const char *w, size_t len, int add) {
  if (v->nslots) {
    for (unsigned h = vhash(w, len) & (unsigned)(v->nslots - 1);; h = (h + 1) & (unsigned)(v->nslots - 1)) {
      int id = v->slots[h];
      if (id < 0) break;
      if (strlen(v->words[id]) == len && !memcmp(v->words[id], w, len)) return id;
    }
  }
  if (!add) return 0; /* <unk> */
  if (v->n >= CAVS_MAX_DIM) return errno = ERANGE, -1; /* a vocabulary is a dim */
  if ((v->n + 1) * 2 > v->nslots) {
    int ns = v->nslots ? v->nslots * 2 : 1024;
    int *slots = NULL;
    if (!cv_grow_array(&slots, sizeof(int), (size_t)ns)) return -1;
    for (int i = 0; i < ns; i++) slots[i] = -1;
    for (int id = 0; id < v->n; id++) {
      unsigned h = vhash(v->words[id], strlen(v->words[id])) & (unsigned)(ns - 1);
      while (slots[h] >= 0) h = (h + 1) & (unsigned)(ns - 1);
      slots[h] = id;
    }
    free(v->slots);
    v->slots = slots;
    v->nslots = ns;
  }
  if (v->n == v->cap) {
    int cap = v->cap ? v->cap * 2 : 1024;
    if (!cv_grow_array(&v->words, sizeof(char *), (size_t)cap)) return -1;
    v->cap = cap;
  }
  char *copy = malloc(len + 1);
  if (!copy) return errno = ENOMEM, -1;
  memcpy(copy, w, len);
  copy[len] = 0;
  v->words[v->n] = copy;
  unsigned h = vhash(w, len) & (unsigned)(v->nslots - 1);
  while (v->slots[h] >= 0) h = (h + 1) & (unsigned)(v->nslots - 1);
  v->slots[h] = v->n;
  return v->n++;
}

/* ---- datasets ---- */


int cavs_dataset_count(const cavs_dataset *s) { return s->n; }
const cavs_graph *cavs_dataset_graph(const cavs_dataset *s, int i) { return &s->graphs[i]; }
long cavs_dataset_vertices(const cavs_dataset *s) { return s->nv; }

int cavs_dataset_max_feature(const cavs_dataset *s, int slot) {
  int mx = -1;
  for (long v = 0; v < s->nv && slot < s->nint; v++)
    if (s->feat[v * s->nint + slot] > mx) mx = s->feat[v * s->nint + slot];
  return mx;
}

void cavs_dataset_free(cavs_dataset *s) {
  if (!s) return;
  free(s->graphs);
  free(s->child);
  free(s->type);
  free(s->feat);
  free(s->real);
  free(s);
}


static int shape_of(const cavs_desc *d, const long *dims, Shape *sh, char *err, size_t errlen) {
  memset(sh, 0, sizeof *sh);
  sh->nint = d->nint;
  sh->word_slot = sh->label_slot = -1;
  for (int i = 0; i < d->ninputs; i++) {
    const cavs_input_desc *in = &d->inputs[i];
    if (in->kind == CAVS_IN_INDEX && sh->word_slot < 0) sh->word_slot = in->slot;
    if (in->kind == CAVS_IN_CLASS && sh->label_slot < 0) {
      sh->label_slot = in->slot;
      sh->nclass = dims ? cv_lin(&in->width, dims) : 0;
      /* a class range bound to the vocabulary is not known until the data is read */
      for (int k = 0; k < d->ndims; k++)
        if (in->width.c[k] && d->dims[k].kind == CAVS_DIM_VOCAB) sh->nclass = 0;
    }
  }
  sh->leaf_type = sh->inner_type = -1;
  for (int t = 0; t < d->nvertex; t++) {
    int kids = cv_type_children(d, t);
    if (kids > sh->maxc) sh->maxc = kids;
    if (kids == 0 && sh->leaf_type < 0) sh->leaf_type = t;
    if (kids > 0 && sh->inner_type < 0) sh->inner_type = t;
  }
  if (sh->inner_type < 0) sh->inner_type = 0;
  if (sh->leaf_type < 0) sh->leaf_type = sh->inner_type;
  sh->inner_children = d->nvertex ? cv_type_children(d, sh->inner_type) : 0;
  sh->inner_name = d->nvertex ? d->vertex[sh->inner_type].name : "";
  if (sh->maxc < 1) {
    snprintf(err, errlen, "model '%s' has no vertex block that takes children", d->name);
    return -1;
  }
  return 0;
}

int cv_type_children(const cavs_desc *d, int t) {
  return d->vertex[t].children + (d->vertex[t].edges ? CAVS_MAX_SET : 0);
}

int cv_add_vertex(cavs_dataset *s, long first, char *err, size_t errlen) {
  if (s->nv - first >= CAVS_MAX_GRAPH_VERTICES) {
    snprintf(err, errlen, "a graph with more than %ld vertices", (long)CAVS_MAX_GRAPH_VERTICES);
    return -1;
  }
  if (s->nv == s->capv) {
    long cap = s->capv ? s->capv * 2 : 4096;
    /* a dataset is held to the memory limit as a model is */
    size_t per = sizeof(int) * ((size_t)s->maxc + 1 + (size_t)(s->nint ? s->nint : 1)) + sizeof(float) * (size_t)s->realw,
           need;
    if (__builtin_mul_overflow(per, (size_t)cap, &need) || need > cavs_memory_limit()) {
      errno = ENOMEM;
      snprintf(err, errlen, "after %ld vertices the data needs more than the memory limit of %s (--max-memory)", s->nv,
               cv_bytes((char[CV_BYTES_LEN]){0}, cavs_memory_limit()));
      return -1;
    }
    if (!cv_grow_array(&s->child, sizeof(int) * (size_t)s->maxc, (size_t)cap) || !cv_grow_array(&s->type, sizeof(int), (size_t)cap) ||
        !cv_grow_array(&s->feat, sizeof(int) * (size_t)(s->nint ? s->nint : 1), (size_t)cap) ||
        (s->realw && !cv_grow_array(&s->real, sizeof(float) * (size_t)s->realw, (size_t)cap))) {
      snprintf(err, errlen, "out of memory after %ld vertices", s->nv);
      return -1;
    }
    s->capv = cap;
  }
  for (long j = 0; j < s->realw; j++) s->real[s->nv * s->realw + j] = 0;
  for (int k = 0; k < s->maxc; k++) s->child[s->nv * s->maxc + k] = -1;
  for (int k = 0; k < s->nint; k++) s->feat[s->nv * s->nint + k] = -1;
  s->type[s->nv] = 0;
  s->nv++;
  return 0;
}

int cv_add_graph(cavs_dataset *s, long first, char *err, size_t errlen) {
  if (s->n == s->cap) {
    if (s->cap >= INT_MAX / 2 || !cv_grow_array(&s->graphs, sizeof(cavs_graph), (size_t)(s->cap ? s->cap * 2 : 1024))) {
      snprintf(err, errlen, "out of memory after %d graphs", s->n);
      return -1;
    }
    s->cap = s->cap ? s->cap * 2 : 1024;
  }
  s->graphs[s->n++] = (cavs_graph){.n = (int)(s->nv - first), .maxc = s->maxc, .child = (int *)(intptr_t)first};
  return 0;
}

/* Graph arrays were grown while reading; point the graphs into them at the end. The
 * child stride shrinks first to the slots the data fills: a set's CAVS_MAX_SET are
 * mostly empty (a lattice's letter has a few words ending at it), and every pass over
 * a graph's children, the scheduler's each minibatch, reads the whole stride. It keeps
 * every named slot of the model (`named`: what code that grows a graph, as greedy
 * decoding does, may fill). Rows move to lower addresses only, in order: in place. */
static void fix_graphs(cavs_dataset *s, int named) {
  /* each graph's filled slots (cavs_graph.slots), and the most of any */
  int used = named > 1 ? named : 1;
  for (int i = 0; i < s->n; i++) {
    long first = (long)(intptr_t)s->graphs[i].child;
    int gs = 0;
    for (long v = first; v < first + s->graphs[i].n; v++)
      for (int k = s->maxc - 1; k >= gs; k--)
        if (s->child[v * s->maxc + k] >= 0) {
          gs = k + 1;
          break;
        }
    s->graphs[i].slots = gs;
    if (gs > used) used = gs;
  }
  if (used < s->maxc) {
    for (long v = 0; v < s->nv; v++)
      memmove(s->child + v * used, s->child + v * s->maxc, sizeof(int) * (size_t)used);
    s->maxc = used;
    int *shrunk = realloc(s->child, sizeof(int) * (size_t)used * (size_t)(s->nv ? s->nv : 1));
    if (shrunk) s->child = shrunk;
  }
  for (int i = 0; i < s->n; i++) {
    s->graphs[i].maxc = s->maxc;
    long first = (long)(intptr_t)s->graphs[i].child;
    s->graphs[i].child = s->child + first * s->maxc;
    s->graphs[i].type = s->type + first;
    s->graphs[i].feat = s->feat + first * s->nint;
    s->graphs[i].real = s->realw ? s->real + first * s->realw : NULL;
  }
}

static bool valid_utf8(const char *p, size_t n) {
  const unsigned char *s = (const unsigned char *)p;
  for (size_t i = 0, k; i < n; i += k)
    if (!(k = cv_utf8_len(s + i, n - i))) return false;
  return true;
}

/* The formats, by the name --format takes: one row each. */
static const CvFormat *const formats[] = {&cv_format_ptb, &cv_format_text, &cv_format_text_bptt, &cv_format_cgf};

/* A streamed file's index (cavs_stream): each graph's bytes in the file, its vertices and
 * a hash of the bytes; the largest value of each integer input. */
typedef struct Records {
  long n, cap;
  long *off;
  int *len, *nv;
  uint32_t *hash;
  int nint;
  int *maxf;
} Records;
static cavs_dataset *load_from(FILE *f, const char *path, const char *format, const cavs_desc *d,
                               const long *dims, cavs_vocab *v, int grow, char *err, size_t errlen, Records *rec);

const CvFormat *cv_format_named(const char *format, int *bptt) {
  if (!format) return NULL;
  *bptt = CV_BPTT;
  if (!strncmp(format, "text-bptt:", 10)) {
    const char *p = format + 10;
    long n = 0;
    if (!*p) return NULL;
    for (; *p; p++) {
      if (*p < '0' || *p > '9') return NULL;
      n = n * 10 + (*p - '0');
      if (n > CV_MAX_BPTT) return NULL;
    }
    if (n < 1) return NULL;
    *bptt = (int)n;
    return &cv_format_text_bptt;
  }
  for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
    if (!strcmp(format, formats[i]->name)) return formats[i];
  return NULL;
}

cavs_dataset *cavs_dataset_load(const char *path, const char *format, const cavs_desc *d, const long *dims,
                                cavs_vocab *v, int grow, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
    return NULL;
  }
  return load_from(f, path, format, d, dims, v, grow, err, errlen, NULL);
}

cavs_dataset *cavs_dataset_parse(const char *text, size_t len, const char *name, const char *format,
                                 const cavs_desc *d, const long *dims, cavs_vocab *v, int grow, char *err,
                                 size_t errlen) {
  if (!name) name = "<string>";
  static const char none[1] = "";
  FILE *f = fmemopen((void *)(len ? text : none), len, "r"); /* of no bytes: glibc >= 2.22 */
  if (!f) {
    snprintf(err, errlen, "cannot read '%s': %s", name, strerror(errno));
    return NULL;
  }
  return load_from(f, name, format, d, dims, v, grow, err, errlen, NULL);
}

static uint32_t fnv32(uint32_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u;
  return h;
}
#define FNV32_START 2166136261u

/* rec: the graph the last line closed recorded (its bytes [start, end) in the file,
 * hashed as h) and the scratch data set emptied for the next: a file streamed is read
 * once through, a graph at a time. 0, or -1 with a message. */
static int record(Records *rec, cavs_dataset *s, long start, long end, uint32_t h, const char *path, long lineno,
                  char *err, size_t errlen) {
  if (s->n != 1) {
    snprintf(err, errlen, "%s:%ld: error: %d graphs end on this line; a streamed file has one a record", path, lineno,
             s->n);
    return -1;
  }
  if (rec->n == rec->cap) {
    size_t cap = rec->cap ? 2 * (size_t)rec->cap : 1024, per = sizeof(long) + 2 * sizeof(int) + sizeof(uint32_t), need;
    if (__builtin_mul_overflow(per, cap, &need) || need > cavs_memory_limit() || rec->n >= INT_MAX / 2) {
      errno = ENOMEM;
      snprintf(err, errlen, "%s:%ld: error: the index of %ld graphs needs more than the memory limit", path, lineno,
               rec->n);
      return -1;
    }
    if (!cv_grow_array(&rec->off, sizeof(long), cap) || !cv_grow_array(&rec->len, sizeof(int), cap) ||
        !cv_grow_array(&rec->nv, sizeof(int), cap) || !cv_grow_array(&rec->hash, sizeof(uint32_t), cap)) {
      snprintf(err, errlen, "%s:%ld: error: out of memory indexing the file", path, lineno);
      return -1;
    }
    rec->cap = (long)cap;
  }
  if (end - start > INT_MAX) {
    snprintf(err, errlen, "%s:%ld: error: a graph of more than %d bytes", path, lineno, INT_MAX);
    return -1;
  }
  rec->off[rec->n] = start;
  rec->len[rec->n] = (int)(end - start);
  rec->nv[rec->n] = s->graphs[0].n;
  rec->hash[rec->n++] = h;
  for (long v = 0; v < s->nv; v++)
    for (int k = 0; k < rec->nint; k++)
      if (s->feat[v * s->nint + k] > rec->maxf[k]) rec->maxf[k] = s->feat[v * s->nint + k];
  s->n = 0, s->nv = 0;
  return 0;
}

/* The format --format names (with text-bptt:N's chunk length in *bptt), or NULL with
 * the message: an unknown name, a bad chunk length, a format of graphs running across
 * lines asked to be streamed. */
static const CvFormat *format_for(const char *format, bool streamed, int *bptt, char *err, size_t errlen) {
  const CvFormat *fm = cv_format_named(format, bptt);
  if (!fm) {
    char names[256] = "";
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
      snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", formats[i]->name);
    if (!strncmp(format, "text-bptt:", 10))
      snprintf(err, errlen, "data format '%.40s': the chunk length after text-bptt: must be a number from 1 to %d",
               format, CV_MAX_BPTT);
    else snprintf(err, errlen, "unknown data format '%.40s' (%s, text-bptt:N)", format, names);
    return NULL;
  }
  if (streamed && !fm->records) {
    snprintf(err, errlen, "data format %.40s cannot be streamed: its graphs run across lines (%s's)", format,
             fm->name);
    return NULL;
  }
  return fm;
}

/* The floats of real inputs a vertex has (0 for a model without), or -1 with the message
 * where there are some and the dims their widths need are not given. */
static long real_width(const cavs_desc *d, const long *dims, char *err, size_t errlen) {
  long realw = 0;
  for (int i = 0; i < d->ninputs; i++)
    if (d->inputs[i].kind == CAVS_IN_REAL) {
      if (!dims) {
        snprintf(err, errlen, "model '%s' has real inputs: its dims must be known to read data", d->name);
        return -1;
      }
      realw += cv_lin(&d->inputs[i].width, dims);
    }
  return realw;
}

/* The empty data set the lines are read into (and, streamed, the index's largest values
 * set to none yet), or NULL with the message. */
static cavs_dataset *empty_set(const Shape *sh, long realw, const char *path, Records *rec, char *err, size_t errlen) {
  cavs_dataset *s = calloc(1, sizeof *s);
  if (rec) {
    rec->nint = sh->nint;
    if ((rec->maxf = malloc(sizeof(int) * (size_t)(sh->nint ? sh->nint : 1))))
      for (int k = 0; k < sh->nint; k++) rec->maxf[k] = -1;
  }
  if (!s || (rec && !rec->maxf)) {
    free(s);
    errno = ENOMEM;
    snprintf(err, errlen, "out of memory reading '%s'", path);
    return NULL;
  }
  s->maxc = sh->maxc;
  s->nint = sh->nint;
  s->realw = realw;
  return s;
}

/* Each line of f, checked (no NUL byte, valid UTF-8; a first line's byte order mark
 * skipped) and handed to the format without its line break; with rec, each graph a line
 * closes recorded (its bytes in the file and their hash) and dropped. 0, or -1 with the
 * message in l->err. The format's end is the caller's. */
static int read_lines(FILE *f, const CvFormat *fm, CvLoad *l, void *state, Records *rec) {
  /* the vocabulary grows as we go; on error, new words stay (harmless: ids only grow) */
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  long lineno = 0, at = 0, start = 0;
  uint32_t h = FNV32_START;
  int rc = 0;
  while ((got = getline(&line, &cap, f)) >= 0) {
    lineno++;
    size_t n = (size_t)got, bom = n;
    if (lineno == 1) n = skip_bom(line, n);
    if (lineno == 1) start = at = (long)(bom - n); /* (the first graph's bytes begin after it) */
    if (rec) h = fnv32(h, line, n); /* (the line's bytes as in the file, line break and all) */
    at += (long)n;
    if (n && line[n - 1] == '\n') n--;
    if (n && line[n - 1] == '\r') n--;
    if (memchr(line, 0, n)) {
      snprintf(l->err, l->errlen, "%s:%ld: error: NUL byte", l->path, lineno);
      rc = -1;
      break;
    }
    if (!valid_utf8(line, n)) {
      snprintf(l->err, l->errlen, "%s:%ld: error: invalid UTF-8", l->path, lineno);
      rc = -1;
      break;
    }
    line[n] = 0;
    l->lineno = lineno;
    rc = fm->line(l, state, line, n);
    if (rc) break;
    if (rec && l->s->n) {
      if ((rc = record(rec, l->s, start, at, h, l->path, lineno, l->err, l->errlen))) break;
      start = at, h = FNV32_START;
    }
  }
  /* (getline's failed growth of the line is neither the end nor an error of the stream:
     the file was read as far as a line too long to hold, not to its end) */
  if (!rc && got < 0 && !feof(f) && !ferror(f)) {
    snprintf(l->err, l->errlen, "out of memory reading '%s' (line %ld)", l->path, lineno + 1);
    errno = ENOMEM;
    rc = -1;
  }
  free(line);
  return rc;
}

/* the loader of both, and of cavs_stream_open (rec: the graphs recorded, not kept):
 * reads f to its end and closes it */
static cavs_dataset *load_from(FILE *f, const char *path, const char *format, const cavs_desc *d,
                               const long *dims, cavs_vocab *v, int grow, char *err, size_t errlen, Records *rec) {
  Shape sh;
  int bptt = CV_BPTT;
  const CvFormat *fm = NULL;
  long realw = -1;
  cavs_dataset *s = NULL;
  if (shape_of(d, dims, &sh, err, errlen) || !(fm = format_for(format, rec != NULL, &bptt, err, errlen)) ||
      (realw = real_width(d, dims, err, errlen)) < 0 ||
      !(s = empty_set(&sh, fm->real ? realw : 0, path, rec, err, errlen))) {
    fclose(f);
    return NULL;
  }
  CvLoad l = {.s = s, .sh = &sh, .d = d, .dims = dims, .v = v, .grow = grow, .path = path, .err = err, .errlen = errlen,
              .bptt = bptt};
  void *state = NULL;
  if (fm->begin(&l, &state)) {
    fclose(f);
    cavs_dataset_free(s);
    snprintf(err, errlen, "out of memory reading '%s'", path);
    return NULL;
  }
  int rc = fm->end(&l, state, read_lines(f, fm, &l, state, rec));
  if (!rc && ferror(f)) {
    snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
    rc = -1;
  }
  fclose(f);
  if (!rc && (rec ? rec->n : s->n) == 0) {
    snprintf(err, errlen, "%s: error: no graphs in the file", path);
    rc = -1;
  }
  if (rc) {
    cavs_dataset_free(s);
    return NULL;
  }
  int named = 0;
  for (int t = 0; t < d->nvertex; t++)
    if (d->vertex[t].children > named) named = d->vertex[t].children;
  fix_graphs(s, named);
  return s;
}

/* ---- a file streamed: indexed once, its graphs read back a minibatch at a time ---- */

struct cavs_stream {
  char *path, *format;
  int fd;
  const cavs_desc *d;
  long dims[CAVS_MAX_DIMS];
  bool have_dims;
  cavs_vocab *v;
  Records rec;
  long vertices;
  long long size; /* the file's bytes when it was indexed */
};

void cavs_stream_close(cavs_stream *st) {
  if (!st) return;
  if (st->fd >= 0) close(st->fd);
  free(st->path), free(st->format);
  free(st->rec.off), free(st->rec.len), free(st->rec.nv), free(st->rec.hash), free(st->rec.maxf);
  free(st);
}

cavs_stream *cavs_stream_open(const char *path, const char *format, const cavs_desc *d, const long *dims,
                              cavs_vocab *v, int grow, char *err, size_t errlen) {
  cavs_stream *st = calloc(1, sizeof *st);
  if (!st || !(st->path = strdup(path)) || !(st->format = strdup(format))) {
    cavs_stream_close(st);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  st->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (st->fd < 0) {
    snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
    cavs_stream_close(st);
    return NULL;
  }
  st->d = d, st->v = v;
  if (dims) memcpy(st->dims, dims, sizeof(long) * (size_t)d->ndims), st->have_dims = true;
  /* the index: the file read once through (the descriptor kept for the reading back,
     a stream of its own for this pass) */
  FILE *f = fdopen(dup(st->fd), "rb");
  if (!f) {
    snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
    cavs_stream_close(st);
    return NULL;
  }
  cavs_dataset *scratch = load_from(f, path, format, d, dims ? st->dims : NULL, v, grow, err, errlen, &st->rec);
  if (!scratch) {
    cavs_stream_close(st);
    return NULL;
  }
  cavs_dataset_free(scratch);
  for (long i = 0; i < st->rec.n; i++) st->vertices += st->rec.nv[i];
  struct stat sb;
  if (fstat(st->fd, &sb)) {
    snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
    cavs_stream_close(st);
    return NULL;
  }
  st->size = (long long)sb.st_size;
  return st;
}

int cavs_stream_count(const cavs_stream *st) { return (int)st->rec.n; }
long cavs_stream_vertices(const cavs_stream *st) { return st->vertices; }
int cavs_stream_graph_vertices(const cavs_stream *st, int i) { return i >= 0 && i < st->rec.n ? st->rec.nv[i] : -1; }
int cavs_stream_max_feature(const cavs_stream *st, int slot) {
  return slot >= 0 && slot < st->rec.nint ? st->rec.maxf[slot] : -1;
}

cavs_dataset *cavs_stream_read(cavs_stream *st, const int *which, int n, char *err, size_t errlen) {
  size_t total = 0;
  for (int j = 0; j < n; j++) {
    if (which[j] < 0 || which[j] >= st->rec.n) {
      snprintf(err, errlen, "graph %d of '%s' asked: it has %ld", which[j], st->path, st->rec.n);
      return NULL;
    }
    total += (size_t)st->rec.len[which[j]] + 1;
  }
  char *buf = malloc(total ? total : 1);
  if (!buf) {
    snprintf(err, errlen, "out of memory reading '%s'", st->path);
    return NULL;
  }
  size_t pos = 0;
  for (int j = 0; j < n; j++) {
    int i = which[j], len = st->rec.len[i];
    for (int got = 0; got < len;) {
      ssize_t r = pread(st->fd, buf + pos + got, (size_t)(len - got), st->rec.off[i] + got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        snprintf(err, errlen, "cannot read '%s': %s", st->path, r < 0 ? strerror(errno) : "it is shorter than it was");
        free(buf);
        return NULL;
      }
      got += (int)r;
    }
    if (fnv32(FNV32_START, buf + pos, (size_t)len) != st->rec.hash[i]) {
      snprintf(err, errlen, "'%s' changed since it was read first (graph %d, at byte %ld, is not what it was)",
               st->path, i + 1, st->rec.off[i]);
      free(buf);
      return NULL;
    }
    pos += (size_t)len;
    if (!len || buf[pos - 1] != '\n') buf[pos++] = '\n'; /* (the file's last line, without one) */
  }
  cavs_dataset *s = cavs_dataset_parse(buf, pos, st->path, st->format, st->d, st->have_dims ? st->dims : NULL, st->v,
                                       0, err, errlen);
  free(buf);
  if (s && s->n != n) {
    snprintf(err, errlen, "'%s': %d graphs read back for %d", st->path, s->n, n);
    cavs_dataset_free(s);
    return NULL;
  }
  return s;
}

/* ---- a stream's index, carried to another process ----
 *
 * "CAVSIDX1", then in the machine's byte order: u64 the file's size, u64 the number of
 * graphs n, u32 the integer slots nint, nint i32 each slot's largest value, and n
 * records of u64 offset, u32 length, u32 vertices, u32 hash. The processes of one job
 * run one build on one kind of machine, so the order is theirs; what is read is still
 * checked, as anything read is (offsets within the file, counts within the bytes). */
static const char idx_magic[8] = "CAVSIDX1";
enum { IDX_HEAD = 8 + 8 + 8 + 4, IDX_REC = 8 + 4 + 4 + 4 };

static void put(char **p, const void *x, size_t n) {
  memcpy(*p, x, n);
  *p += n;
}
static void get(const char **p, void *x, size_t n) {
  memcpy(x, *p, n);
  *p += n;
}

size_t cavs_stream_index(const cavs_stream *st, void *buf, size_t cap) {
  size_t need = IDX_HEAD + 4 * (size_t)st->rec.nint + IDX_REC * (size_t)st->rec.n;
  if (!buf || cap < need) return need;
  char *p = buf;
  uint64_t size = (uint64_t)st->size, n = (uint64_t)st->rec.n;
  uint32_t nint = (uint32_t)st->rec.nint;
  put(&p, idx_magic, 8), put(&p, &size, 8), put(&p, &n, 8), put(&p, &nint, 4);
  for (int k = 0; k < st->rec.nint; k++) put(&p, &st->rec.maxf[k], 4);
  for (long i = 0; i < st->rec.n; i++) {
    uint64_t off = (uint64_t)st->rec.off[i];
    uint32_t len = (uint32_t)st->rec.len[i], nv = (uint32_t)st->rec.nv[i];
    put(&p, &off, 8), put(&p, &len, 4), put(&p, &nv, 4), put(&p, &st->rec.hash[i], 4);
  }
  return need;
}

/* The index's records into st, checked against the file's size and the model's slots */
static int index_read(cavs_stream *st, const char *idx, size_t n, int nint, char *err, size_t errlen) {
  const char *p = idx;
  uint64_t size, count;
  uint32_t slots;
  if (n < IDX_HEAD || memcmp(idx, idx_magic, 8)) {
    snprintf(err, errlen, "index of '%s': not a stream's index", st->path);
    return -1;
  }
  p += 8;
  get(&p, &size, 8), get(&p, &count, 8), get(&p, &slots, 4);
  if (size != (uint64_t)st->size) {
    snprintf(err, errlen, "'%s' is not the file that was indexed (%lld bytes, the index's %llu)", st->path,
             (long long)st->size, (unsigned long long)size);
    return -1;
  }
  if (slots != (uint32_t)nint || count > (uint64_t)INT_MAX || count == 0 ||
      (n - IDX_HEAD) / IDX_REC < count || n != IDX_HEAD + 4 * (size_t)slots + IDX_REC * (size_t)count) {
    snprintf(err, errlen, "index of '%s': its sizes do not add up (%llu graphs, %u slots, %zu bytes)", st->path,
             (unsigned long long)count, slots, n);
    return -1;
  }
  Records *r = &st->rec;
  r->n = r->cap = (long)count, r->nint = nint;
  r->off = malloc(sizeof(long) * (size_t)count), r->len = malloc(sizeof(int) * (size_t)count);
  r->nv = malloc(sizeof(int) * (size_t)count), r->hash = malloc(sizeof(uint32_t) * (size_t)count);
  r->maxf = malloc(sizeof(int) * (size_t)(nint ? nint : 1));
  if (!r->off || !r->len || !r->nv || !r->hash || !r->maxf) {
    errno = ENOMEM;
    snprintf(err, errlen, "out of memory reading the index of '%s'", st->path);
    return -1;
  }
  for (int k = 0; k < nint; k++) {
    get(&p, &r->maxf[k], 4);
    if (r->maxf[k] < -1 || r->maxf[k] >= CAVS_MAX_DIM) { /* (a vocabulary's size comes from it) */
      snprintf(err, errlen, "index of '%s': slot %d's largest value %d is outside -1..%ld", st->path, k, r->maxf[k],
               CAVS_MAX_DIM - 1);
      return -1;
    }
  }
  for (long i = 0; i < r->n; i++) {
    uint64_t off;
    uint32_t len, nv;
    get(&p, &off, 8), get(&p, &len, 4), get(&p, &nv, 4), get(&p, &r->hash[i], 4);
    if (off > size || len > size - off || len > INT_MAX || nv == 0 || nv > INT_MAX) {
      snprintf(err, errlen, "index of '%s': graph %ld lies outside the file or has no vertices", st->path, i + 1);
      return -1;
    }
    r->off[i] = (long)off, r->len[i] = (int)len, r->nv[i] = (int)nv;
    st->vertices += nv;
  }
  return 0;
}

cavs_stream *cavs_stream_open_index(const char *path, const char *format, const cavs_desc *d, const long *dims,
                                    cavs_vocab *v, const void *index, size_t n, char *err, size_t errlen) {
  Shape sh;
  int bptt;
  const CvFormat *fm = cv_format_named(format, &bptt);
  if (!fm || !fm->records) {
    snprintf(err, errlen, "data format %.40s cannot be streamed", format);
    return NULL;
  }
  if (shape_of(d, dims, &sh, err, errlen)) return NULL;
  cavs_stream *st = calloc(1, sizeof *st);
  if (!st || !(st->path = strdup(path)) || !(st->format = strdup(format))) {
    cavs_stream_close(st);
    errno = ENOMEM;
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  struct stat sb;
  st->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (st->fd < 0 || fstat(st->fd, &sb)) {
    snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
    cavs_stream_close(st);
    return NULL;
  }
  st->size = (long long)sb.st_size;
  st->d = d, st->v = v;
  if (dims) memcpy(st->dims, dims, sizeof(long) * (size_t)d->ndims), st->have_dims = true;
  if (index_read(st, index, n, sh.nint, err, errlen)) {
    cavs_stream_close(st);
    return NULL;
  }
  return st;
}

/* ---- synthetic data ---- */

static uint64_t gen_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A toy treebank with a learnable signal that needs composition, as SST does: words
 * w0..w(W-1) carry a polarity of -1, 0 or +1 (by id mod 3), except every seventh word,
 * a negator ("not") with polarity 0 that flips the polarity of the phrase it is merged
 * with on its right. A node's label is its phrase's polarity clamped to -2..2, shifted to
 * 0..4 (five classes, as SST). Trees are random binary trees of 2..maxleaves leaves. */
static void free_strings(char **txt, int n) {
  for (int i = 0; i < n; i++) free(txt[i]);
}

/* maxk: the most phrases a node merges (2: binary, the toy treebank; more: cavs_gen_nary,
 * whose merges of k > 2 phrases draw k and are written only then) */
static int gen_toy_k(FILE *out, int ntrees, int maxleaves, int nwords, int maxk, uint64_t seed) {
  uint64_t s = seed * 2654435761u + 1;
  int *pol = malloc(sizeof(int) * (size_t)(2 * maxleaves + 2));
  bool *neg = malloc(sizeof(bool) * (size_t)(2 * maxleaves + 2));
  char **txt = malloc(sizeof(char *) * (size_t)(2 * maxleaves + 2));
  if (!pol || !txt || !neg) goto oom;
  int q;
  for (int t = 0; t < ntrees; t++) {
    int n = 2 + (int)(gen_next(&s) % (uint64_t)(maxleaves - 1));
    for (int i = 0; i < n; i++) {
      int w = (int)(gen_next(&s) % (uint64_t)nwords);
      neg[i] = w % 7 == 6;
      pol[i] = neg[i] ? 0 : w % 3 == 0 ? -1 : w % 3 == 1 ? 1 : 0;
      size_t len = (size_t)snprintf(NULL, 0, "(%d w%d)", pol[i] + 2, w) + 1;
      txt[i] = malloc(len);
      if (!txt[i]) {
        free_strings(txt, i);
        goto oom;
      }
      snprintf(txt[i], len, "(%d w%d)", pol[i] + 2, w);
    }
    /* merge random neighbours (q of them) until one tree is left: a leading negator
       flips the polarity of the rest, which otherwise add up */
    for (int k = n; k > 1; k -= q - 1) {
      q = 2;
      if (maxk > 2) q = 2 + (int)(gen_next(&s) % (uint64_t)(maxk - 1));
      if (q > k) q = k;
      int i = (int)(gen_next(&s) % (uint64_t)(k - q + 1));
      int p = 0;
      size_t len = 16;
      for (int j = i + (neg[i] ? 1 : 0); j < i + q; j++) p += pol[j];
      if (neg[i]) p = -p;
      p = p < -2 ? -2 : p > 2 ? 2 : p;
      for (int j = i; j < i + q; j++) len += strlen(txt[j]) + 1;
      char *m = malloc(len);
      if (!m) {
        free_strings(txt, k);
        goto oom;
      }
      size_t at = (size_t)snprintf(m, len, "(%d", p + 2);
      for (int j = i; j < i + q; j++) {
        at += (size_t)snprintf(m + at, len - at, " %s", txt[j]);
        free(txt[j]);
      }
      snprintf(m + at, len - at, ")");
      txt[i] = m;
      pol[i] = p;
      neg[i] = false;
      for (int j = i + 1; j < k - q + 1; j++) {
        txt[j] = txt[j + q - 1];
        pol[j] = pol[j + q - 1];
        neg[j] = neg[j + q - 1];
      }
    }
    fprintf(out, "%s\n", txt[0]);
    free(txt[0]);
  }
  free(pol);
  free(neg);
  free(txt);
  return ferror(out) ? -1 : 0;
oom:
  free(pol);
  free(neg);
  free(txt);
  errno = ENOMEM;
  return -1;
}

int cavs_gen_toy(FILE *out, int ntrees, int maxleaves, int nwords, uint64_t seed) {
  return gen_toy_k(out, ntrees, maxleaves, nwords, 2, seed);
}

int cavs_gen_nary(FILE *out, int ntrees, int maxleaves, int nwords, int maxarity, uint64_t seed) {
  if (maxarity < 2 || maxarity > CAVS_MAX_SET) return errno = EINVAL, -1;
  return gen_toy_k(out, ntrees, maxleaves, nwords, maxarity, seed);
}

/* Complete binary trees with `leaves` leaves (rounded up to a power of two), as in
 * TensorFlow Fold's Tree-FC benchmark; random words, a random label at the root only. The
 * recursion is as deep as log2(leaves), at most 30. */
static void complete_subtree(FILE *out, int level, int nwords, uint64_t *s) {
  if (level == 0) {
    fprintf(out, "(-1 w%d)", (int)(gen_next(s) % (uint64_t)nwords));
    return;
  }
  fputs("(-1 ", out);
  complete_subtree(out, level - 1, nwords, s);
  fputc(' ', out);
  complete_subtree(out, level - 1, nwords, s);
  fputc(')', out);
}

int cavs_gen_complete(FILE *out, int ntrees, int leaves, int nwords, int nclass, uint64_t seed) {
  uint64_t s = seed * 2654435761u + 7;
  int top = 0;
  while ((1 << top) < leaves && top < 30) top++;
  for (int t = 0; t < ntrees; t++) {
    int lab = (int)(gen_next(&s) % (uint64_t)nclass);
    if (top == 0) {
      fprintf(out, "(%d w%d)\n", lab, (int)(gen_next(&s) % (uint64_t)nwords));
      continue;
    }
    fprintf(out, "(%d ", lab);
    complete_subtree(out, top - 1, nwords, &s);
    fputc(' ', out);
    complete_subtree(out, top - 1, nwords, &s);
    fputs(")\n", out);
  }
  return ferror(out) ? -1 : 0;
}

/* a word's fixed random key and spelling (from the word alone) */
static uint64_t word_key(int w, int salt) {
  uint64_t s = (uint64_t)w * 0x9e3779b97f4a7c15u + (uint64_t)salt;
  return gen_next(&s);
}

int cavs_gen_tagger(FILE *out, int nsent, int nwords, int nclass, int chars, uint64_t seed) {
  uint64_t s = seed * 2654435761u + 13;
  enum { MAXN = 60 };
  int w[MAXN], len[MAXN];
  for (int g = 0; g < nsent; g++) {
    int n = 10 + (int)(gen_next(&s) % (uint64_t)(MAXN - 10 + 1));
    for (int i = 0; i < n; i++) {
      w[i] = (int)(gen_next(&s) % (uint64_t)nwords);
      len[i] = 3 + (int)(word_key(w[i], 1) % 6);
    }
    /* vertices: fwd 0..n-1, bwd n..2n-1, tok 2n..3n-1, then each word's letters */
    fprintf(out, "graph\n");
    for (int dir = 0; dir < 2; dir++)
      for (int i = 0, at = 3 * n; i < n; at += chars ? len[i] : 0, i++) {
        int prev = dir ? (i + 1 < n ? n + i + 1 : -1) : i - 1;
        fprintf(out, "%d %s ", dir * n + i, dir ? "bwd" : "fwd");
        if (prev < 0) fputc('-', out);
        else fprintf(out, "%d", prev);
        if (chars) fprintf(out, " %d", at + len[i] - 1);
        fprintf(out, " ; word=%d\n", w[i]);
      }
    /* a word's tag is its own key, the word before's or the word after's, as the word
       says (a third of the words each): only a tagger that reads both ways learns it */
    for (int i = 0; i < n; i++) {
      int kind = (int)(word_key(w[i], 3) % 3), from = kind == 0 ? i : kind == 1 ? i - 1 : i + 1;
      int tag = from < 0 || from >= n ? 0 : (int)(word_key(w[from], 0) % (uint64_t)nclass);
      fprintf(out, "%d tok %d %d ; label=%d\n", 2 * n + i, i, n + i, tag);
    }
    for (int i = 0, at = 3 * n; chars && i < n; at += len[i], i++)
      for (int j = 0; j < len[i]; j++) {
        fprintf(out, "%d chr ", at + j);
        if (j) fprintf(out, "%d", at + j - 1);
        else fputc('-', out);
        fprintf(out, " ; char=%d\n", (int)(word_key(w[i], 2 + j) % 26));
      }
    fprintf(out, "end\n");
  }
  return ferror(out) ? -1 : 0;
}

int cavs_gen_translation(FILE *out, int npairs, int nwords, uint64_t seed) {
  uint64_t s = seed * 2654435761u + 19;
  enum { MAXN = 50 };
  int src[MAXN];
  for (int g = 0; g < npairs; g++) {
    int n = 10 + (int)(gen_next(&s) % (uint64_t)(MAXN - 10 + 1));
    for (int i = 0; i < n; i++) src[i] = (int)(gen_next(&s) % (uint64_t)nwords);
    /* the target: the source backwards, each word through a fixed random map to
       1..nwords (0 is the decoder's start) */
    fprintf(out, "graph\n");
    for (int i = 0; i < n; i++) {
      fprintf(out, "%d enc ", i);
      if (i) fprintf(out, "%d", i - 1);
      else fputc('-', out);
      fprintf(out, " ; src=%d\n", src[i]);
    }
    int prev = 0;
    for (int i = 0; i < n; i++) {
      int tgt = 1 + (int)(word_key(src[n - 1 - i], 7) % (uint64_t)nwords);
      fprintf(out, "%d dec ", n + i);
      if (i) fprintf(out, "%d -", n + i - 1);
      else fprintf(out, "- %d", n - 1);
      for (int k = 0; k < n; k++) fprintf(out, " %d", k);
      fprintf(out, " ; prev=%d next=%d\n", prev, tgt);
      prev = tgt;
    }
    fprintf(out, "end\n");
  }
  return ferror(out) ? -1 : 0;
}

int cavs_gen_lattice(FILE *out, int ngraphs, int nchars, int nwords, int nclass, uint64_t seed) {
  uint64_t s = seed * 2654435761u + 17;
  enum { MAXN = 80, MAXW = 3 * MAXN };
  int ch[MAXN], wb[MAXW], wl[MAXW], wid[MAXW], longest[MAXN];
  for (int g = 0; g < ngraphs; g++) {
    int n = 20 + (int)(gen_next(&s) % (uint64_t)(MAXN - 20 + 1)), nw = 0;
    for (int j = 0; j < n; j++) ch[j] = (int)(gen_next(&s) % (uint64_t)nchars), longest[j] = -1;
    /* at each position 0 to 3 words of 2, 3 or 4 letters start (each length at most
       once), as a lexicon's matches would; a word's id is its letters' */
    for (int b = 0; b < n; b++)
      for (int len = 2; len <= 4; len++) {
        if (b + len > n || gen_next(&s) % 2) continue;
        uint64_t h = 1469598103934665603ull;
        for (int j = b; j < b + len; j++) h = (h ^ (uint64_t)ch[j]) * 1099511628211ull;
        wb[nw] = b, wl[nw] = len, wid[nw] = (int)(h % (uint64_t)nwords);
        int e = b + len - 1;
        if (longest[e] < 0 || wl[longest[e]] < len) longest[e] = nw;
        nw++;
      }
    fprintf(out, "graph\n");
    for (int j = 0; j < n; j++) {
      /* a letter's tag: the key of the longest word that ends at it, else its own */
      int key = longest[j] >= 0 ? (int)(word_key(wid[longest[j]], 5) % (uint64_t)nclass)
                                : (int)(word_key(ch[j], 6) % (uint64_t)nclass);
      fprintf(out, "%d chr ", j);
      if (j) fprintf(out, "%d", j - 1);
      else fputc('-', out);
      for (int w = 0; w < nw; w++)
        if (wb[w] + wl[w] - 1 == j) fprintf(out, " %d", n + w);
      fprintf(out, " ; char=%d label=%d\n", ch[j], key);
    }
    for (int w = 0; w < nw; w++) fprintf(out, "%d wrd %d ; word=%d\n", n + w, wb[w], wid[w]);
    fprintf(out, "end\n");
  }
  return ferror(out) ? -1 : 0;
}

/* Random graphs for tests and benchmarks. Without `dag`: random binary trees of 1..maxv
 * vertices as ptb-tree lines, random words and labels on every node. With `dag`: cgf
 * graphs of vertex types `leaf` and `internal` (as dsl-examples/twotype.vf) where every
 * internal vertex takes two earlier vertices as children, so vertices have several
 * parents; features `word` and `label`. */
int cavs_gen_random(FILE *out, int ngraphs, int maxv, int nwords, int nclass, int dag, uint64_t seed) {
  uint64_t s = seed * 2654435761u + 11;
  for (int g = 0; g < ngraphs; g++) {
    int n = 1 + (int)(gen_next(&s) % (uint64_t)maxv);
    if (!dag) {
      /* a random tree: merge random neighbours, as cavs_gen_toy does */
      int leaves = (n + 1) / 2;
      char **txt = malloc(sizeof(char *) * (size_t)leaves);
      if (!txt) return -1;
      for (int i = 0; i < leaves; i++) {
        txt[i] = malloc(32);
        if (!txt[i]) {
          free_strings(txt, i);
          free(txt);
          return errno = ENOMEM, -1;
        }
        snprintf(txt[i], 32, "(%d w%d)", (int)(gen_next(&s) % (uint64_t)nclass), (int)(gen_next(&s) % (uint64_t)nwords));
      }
      for (int k = leaves; k > 1; k--) {
        int i = (int)(gen_next(&s) % (uint64_t)(k - 1));
        size_t len = strlen(txt[i]) + strlen(txt[i + 1]) + 16;
        char *m = malloc(len);
        if (!m) {
          free_strings(txt, k);
          free(txt);
          return errno = ENOMEM, -1;
        }
        snprintf(m, len, "(%d %s %s)", (int)(gen_next(&s) % (uint64_t)nclass), txt[i], txt[i + 1]);
        free(txt[i]);
        free(txt[i + 1]);
        txt[i] = m;
        for (int j = i + 1; j < k - 1; j++) txt[j] = txt[j + 1];
      }
      fprintf(out, "%s\n", txt[0]);
      free(txt[0]);
      free(txt);
      continue;
    }
    fprintf(out, "graph\n");
    int nleaves = n < 2 ? n : 2 + (int)(gen_next(&s) % (uint64_t)((n + 1) / 2));
    if (nleaves > n) nleaves = n;
    for (int v = 0; v < n; v++) {
      int label = (int)(gen_next(&s) % (uint64_t)nclass);
      if (v < nleaves) {
        fprintf(out, "%d leaf ; word=%d label=%d\n", v, (int)(gen_next(&s) % (uint64_t)nwords), label);
      } else {
        int a = (int)(gen_next(&s) % (uint64_t)v), b = (int)(gen_next(&s) % (uint64_t)v);
        fprintf(out, "%d internal %d %d ; label=%d\n", v, a, b, label);
      }
    }
    fprintf(out, "end\n");
  }
  return ferror(out) ? -1 : 0;
}

static locale_t c_numeric;
static pthread_once_t c_numeric_once = PTHREAD_ONCE_INIT;
static void c_numeric_make(void) { c_numeric = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0); }

double cv_strtod(const char *s, char **end) {
  (void)pthread_once(&c_numeric_once, c_numeric_make);
  /* without the locale object (out of memory), the thread's own: right unless the
     application changed LC_NUMERIC */
  locale_t old = c_numeric ? uselocale(c_numeric) : (locale_t)0;
  double x = strtod(s, end);
  if (old) uselocale(old);
  return x;
}

/* ---- pre-trained vectors ---- */

enum { VEC_LINE_MAX = 1 << 20 };

/* One line of a file read through zlib (gzread reads a .gz file, and passes any other
 * through as it is) into *line, grown to at most VEC_LINE_MAX + 2 bytes, without its
 * line break. Returns the bytes read, 0 at the end of the file, -1 on an error (errno,
 * or zlib's message in *why). *too_long: the line was longer (the rest is skipped);
 * *nul: it held a NUL byte. */
static ssize_t gz_line(gzFile f, char **line, size_t *cap, bool *too_long, bool *nul, const char **why) {
  size_t n = 0;
  *too_long = *nul = false;
  *why = NULL;
  for (;;) {
    if (*cap - n < 2) {
      size_t c = *cap ? *cap * 2 : 4096;
      if (c > VEC_LINE_MAX + 2) c = VEC_LINE_MAX + 2;
      if (c <= *cap) {
        *too_long = true;
        int ch;
        while ((ch = gzgetc(f)) >= 0 && ch != '\n') {}
        return (ssize_t)n;
      }
      char *l = realloc(*line, c);
      if (!l) return errno = ENOMEM, -1;
      *line = l;
      *cap = c;
    }
    int ch = gzgetc(f);
    if (ch < 0) {
      int e = Z_OK;
      const char *m = gzerror(f, &e);
      if (e != Z_OK && e != Z_BUF_ERROR) {
        *why = e == Z_ERRNO ? strerror(errno) : m;
        return -1;
      }
      (*line)[n] = 0;
      return (ssize_t)n;
    }
    if (ch == '\n') {
      (*line)[n] = 0;
      return (ssize_t)n + 1; /* counts the break: an empty line is not the end */
    }
    if (ch == 0) *nul = true;
    (*line)[n++] = (char)ch;
  }
}

typedef struct VecSpan {
  const char *p;
  size_t n;
} VecSpan;

static bool vec_number(const VecSpan *t, bool single, double *x) {
  char *end;
  *x = cv_strtod(t->p, &end);
  return end == t->p + t->n && t->n > 0 && isfinite(*x) && !(single && fabs(*x) > FLT_MAX);
}

/* A line "WORD x1 ... xcols" split: the numbers are the last cols fields, the word is
 * whatever comes before them, so that GloVe 840B's words with spaces in them (". . .")
 * read (no vocabulary word holds a space: they match none). A line whose fields after
 * the first are all numbers, but not cols of them, is of a file of another width. Sets
 * *w and *wl (0 for a blank line) and *nums (cols spans into *spans); 0, or -1 with the
 * message in err. */
static int vec_split(const char *line, long cols, bool single, VecSpan **spans, size_t *capspans, const char **w,
                     size_t *wl, const VecSpan **nums, const char *where, const char *pname, char *err, size_t errlen) {
  size_t nt = 0;
  for (const char *p = line; *p;) {
    while (*p == ' ' || *p == '\t' || *p == '\r') p++;
    if (!*p) break;
    size_t len = strcspn(p, " \t\r");
    if (nt == *capspans) {
      size_t c = *capspans ? *capspans * 2 : 512;
      VecSpan *s2 = realloc(*spans, c * sizeof *s2);
      if (!s2) {
        snprintf(err, errlen, "%s: error: out of memory", where);
        return -1;
      }
      *spans = s2;
      *capspans = c;
    }
    (*spans)[nt++] = (VecSpan){p, len};
    p += len;
  }
  const VecSpan *t = *spans;
  *wl = 0;
  if (nt == 0) return 0;
  size_t nnum = 0; /* fields read as numbers, counted from the right */
  double x;
  while (nnum < nt - 1 && vec_number(&t[nt - 1 - nnum], single, &x)) nnum++;
  char shown[CV_SHOWN];
  if (nnum == nt - 1 && nnum != (size_t)cols) {
    snprintf(err, errlen, "%s: error: '%s' has %zu numbers; '%s' is %ld wide", where, cv_shown(shown, t[0].p, t[0].n), nnum,
             pname, cols);
    return -1;
  }
  if (nnum < (size_t)cols) {
    const VecSpan *bad = &t[nt - 1 - nnum]; /* the last field that should be a number */
    snprintf(err, errlen, "%s:%ld: error: '%s' is not a finite number", where, (long)(bad->p - line) + 1,
             cv_shown(shown, bad->p, bad->n));
    return -1;
  }
  size_t first = nt - (size_t)cols;
  *w = t[0].p;
  *wl = (size_t)(t[first - 1].p + t[first - 1].n - t[0].p);
  *nums = &t[first];
  return 0;
}

/* word2vec's header, "COUNT DIM" on the first line, with DIM the table's width */
static bool vec_header(const char *line, long cols) {
  char *end;
  long a = strtol(line, &end, 10);
  if (end == line || a < 0 || (*end != ' ' && *end != '\t')) return false;
  long b = strtol(end, &end, 10);
  while (*end == ' ' || *end == '\t' || *end == '\r') end++;
  return !*end && b == cols;
}

/* One vectors file being read into a table: the table where the model keeps it (on the
 * device, perhaps) and its copy on the host, which the file changes and which goes back
 * only when the whole file was read without error; which rows got a vector. */
typedef struct VecLoad {
  cavs_model *m;
  const char *path, *pname;
  char *table, *host;
  unsigned char *got;
  long rows, cols, ld;
  size_t es;
  char *err;
  size_t errlen;
} VecLoad;

/* Every row of the table to the host copy (back: from it): 0, or -1 with the message */
static int vec_rows(VecLoad *l, bool back) {
  for (long r = 0; r < l->rows; r++) {
    char *t = l->table + (size_t)r * (size_t)l->ld * l->es, *h = l->host + (size_t)r * (size_t)l->cols * l->es;
    size_t n = (size_t)l->cols * l->es;
    if (back ? cavs_model_write(l->m, t, h, n) : cavs_model_read(l->m, h, t, n)) {
      snprintf(l->err, l->errlen, "%s: %s", l->path, cavs_model_error(l->m));
      return -1;
    }
  }
  return 0;
}

/* The file's lines into the host copy: a word of v's vocabulary (or <unk>) gets its row
 * set and marked; a first line "COUNT DIM" is word2vec's header. rep counts the vectors.
 * 0, or -1 with the message. */
static int vec_lines(VecLoad *l, gzFile f, cavs_vocab *v, cavs_vectors_report *rep) {
  char *line = NULL;
  size_t cap = 0, capspans = 0;
  VecSpan *spans = NULL;
  ssize_t len;
  long lineno = 0;
  int rc = 0;
  bool too_long, nul;
  const char *why;
  while ((len = gz_line(f, &line, &cap, &too_long, &nul, &why)) > 0) {
    lineno++;
    char where[64 + PATH_MAX];
    snprintf(where, sizeof where, "%s:%ld", l->path, lineno);
    if (too_long || nul) {
      snprintf(l->err, l->errlen, too_long ? "%s: error: a line longer than %d bytes" : "%s: error: a NUL byte", where,
               VEC_LINE_MAX);
      rc = -1;
      break;
    }
    if (lineno == 1) skip_bom(line, strlen(line));
    if (lineno == 1 && vec_header(line, l->cols)) continue;
    const char *w = NULL;
    size_t wl;
    const VecSpan *nums = NULL;
    if (vec_split(line, l->cols, l->es == 4, &spans, &capspans, &w, &wl, &nums, where, l->pname, l->err, l->errlen)) {
      rc = -1;
      break;
    }
    if (!wl) continue;
    rep->vectors++;
    int id = cavs_vocab_id(v, w, wl, 0);
    bool known = id > 0 || (wl == 5 && !memcmp(w, "<unk>", 5));
    if (!known || id >= l->rows) continue;
    char *row = l->host + (size_t)id * (size_t)l->cols * l->es;
    for (long k = 0; k < l->cols; k++) {
      double x;
      vec_number(&nums[k], l->es == 4, &x);
      if (l->es == 8) ((double *)row)[k] = x;
      else ((float *)row)[k] = (float)x;
    }
    l->got[id] = 1;
  }
  if (!rc && len < 0) {
    snprintf(l->err, l->errlen, "%s: %s", l->path, why ? why : strerror(errno));
    rc = -1;
  }
  free(spans);
  free(line);
  return rc;
}

int cavs_model_load_vectors_report(cavs_model *m, int param, const char *path, cavs_vocab *v, cavs_vectors_report *rep,
                                   char *err, size_t errlen) {
  const cavs_desc *d = cavs_model_desc(m);
  *rep = (cavs_vectors_report){0};
  if (errlen) *err = 0;
  if (param < 0 || param >= d->nparams) {
    snprintf(err, errlen, "%s: no parameter %d", path, param);
    return -1;
  }
  VecLoad l = {.m = m, .path = path, .pname = d->params[param].name, .es = d->precision == CAVS_DOUBLE ? 8 : 4,
               .err = err, .errlen = errlen};
  l.table = cavs_model_param(m, param, &l.rows, &l.cols, &l.ld);
  errno = 0;
  gzFile f = gzopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "%s: %s", path, errno ? strerror(errno) : "out of memory");
    return -1;
  }
  l.host = malloc((size_t)l.rows * (size_t)l.cols * l.es + 1);
  l.got = calloc((size_t)l.rows + 1, 1);
  int rc = l.host && l.got ? 0 : -1;
  if (rc) snprintf(err, errlen, "%s: out of memory for a copy of '%s'", path, l.pname);
  if (!rc) rc = vec_rows(&l, false);
  if (!rc) rc = vec_lines(&l, f, v, rep);
  if (!rc) rc = vec_rows(&l, true);
  /* the words of the vocabulary (<unk> and <eos> aside) the file had no vector for */
  for (long r = 0; !rc && r < l.rows; r++) {
    rep->found += l.got[r];
    if (l.got[r] || r < 2 || r >= cavs_vocab_size(v)) continue;
    if (rep->nsample < CAVS_VECTORS_SAMPLE) rep->sample[rep->nsample++] = (int)r;
    rep->missing++;
  }
  free(l.host);
  free(l.got);
  gzclose(f);
  return rc;
}

int cavs_model_load_vectors(cavs_model *m, int param, const char *path, cavs_vocab *v, long *found, char *err,
                            size_t errlen) {
  cavs_vectors_report r;
  int rc = cavs_model_load_vectors_report(m, param, path, v, &r, err, errlen);
  *found = rc ? 0 : r.found;
  return rc;
}

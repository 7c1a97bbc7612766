/* data.c: datasets read once and kept as graphs, and the vocabulary that maps tokens to
 * ids. Formats: `ptb-tree` (SST-style bracketed trees, a label on every node, tokens split
 * on ASCII space only: SST has tokens with U+00A0 inside) and `text` (one sentence a line,
 * each a chain whose vertex i reads token i and is labeled with token i+1, <eos> last).
 * Parsers are iterative (an explicit stack), so depth is bounded by memory, not by the C
 * stack; an error names the file and line and leaves nothing half-loaded. */
#include "cv.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- vocabulary: open addressing over interned strings ---- */

struct cavs_vocab {
  char **words;
  int n, cap;
  int *slots; /* ids, -1 empty */
  int nslots;
};

/* *p grown to n elements of elem bytes, in checked arithmetic; false (and *p as it was)
 * when that much memory cannot be had. Every loader reports that as an error, with
 * errno set to ENOMEM: the library never aborts. */
static bool grow_array(void *p, size_t elem, size_t n) {
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
    if (!grow_array(&slots, sizeof(int), (size_t)ns)) return -1;
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
    if (!grow_array(&v->words, sizeof(char *), (size_t)cap)) return -1;
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

struct cavs_dataset {
  cavs_graph *graphs;
  int n, cap;
  int maxc, nint;
  int *child, *type, *feat; /* all graphs' vertices, back to back */
  float *real;              /* [nv * realw] (cgf only) */
  long realw;
  long nv, capv;
};

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

/* What the loader needs to know of a model: where words and labels go, how many
 * children a vertex may have, which type a leaf and an inner vertex get. */
typedef struct Shape {
  int nint, word_slot, label_slot, maxc, leaf_type, inner_type;
  int inner_children;     /* children the inner vertices' block takes (at most maxc) */
  const char *inner_name; /* its name */
  long nclass; /* labels must be below this (0: unchecked) */
} Shape;

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
    if (d->vertex[t].children > sh->maxc) sh->maxc = d->vertex[t].children;
    if (d->vertex[t].children == 0 && sh->leaf_type < 0) sh->leaf_type = t;
    if (d->vertex[t].children > 0 && sh->inner_type < 0) sh->inner_type = t;
  }
  if (sh->inner_type < 0) sh->inner_type = 0;
  if (sh->leaf_type < 0) sh->leaf_type = sh->inner_type;
  sh->inner_children = d->nvertex ? d->vertex[sh->inner_type].children : 0;
  sh->inner_name = d->nvertex ? d->vertex[sh->inner_type].name : "";
  if (sh->maxc < 1) {
    snprintf(err, errlen, "model '%s' has no vertex block that takes children", d->name);
    return -1;
  }
  return 0;
}

/* A new vertex in the graph that began at vertex `first`; -1 with the message in err when
 * the graph would be too large or memory runs out. */
static int add_vertex(cavs_dataset *s, long first, char *err, size_t errlen) {
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
      snprintf(err, errlen, "after %ld vertices the data needs more than the memory limit of %.2f GiB (--max-memory)",
               s->nv, (double)cavs_memory_limit() / (double)(1 << 30));
      return -1;
    }
    if (!grow_array(&s->child, sizeof(int) * (size_t)s->maxc, (size_t)cap) || !grow_array(&s->type, sizeof(int), (size_t)cap) ||
        !grow_array(&s->feat, sizeof(int) * (size_t)(s->nint ? s->nint : 1), (size_t)cap) ||
        (s->realw && !grow_array(&s->real, sizeof(float) * (size_t)s->realw, (size_t)cap))) {
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

static int add_graph(cavs_dataset *s, long first, char *err, size_t errlen) {
  if (s->n == s->cap) {
    if (s->cap >= INT_MAX / 2 || !grow_array(&s->graphs, sizeof(cavs_graph), (size_t)(s->cap ? s->cap * 2 : 1024))) {
      snprintf(err, errlen, "out of memory after %d graphs", s->n);
      return -1;
    }
    s->cap = s->cap ? s->cap * 2 : 1024;
  }
  s->graphs[s->n++] = (cavs_graph){.n = (int)(s->nv - first), .maxc = s->maxc, .child = (int *)(intptr_t)first};
  return 0;
}

/* Graph arrays were grown while reading; point the graphs into them at the end. */
static void fix_graphs(cavs_dataset *s) {
  for (int i = 0; i < s->n; i++) {
    long first = (long)(intptr_t)s->graphs[i].child;
    s->graphs[i].child = s->child + first * s->maxc;
    s->graphs[i].type = s->type + first;
    s->graphs[i].feat = s->feat + first * s->nint;
    s->graphs[i].real = s->realw ? s->real + first * s->realw : NULL;
  }
}

static bool valid_utf8(const char *p, size_t n) {
  const unsigned char *s = (const unsigned char *)p;
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    size_t k = c < 0x80 ? 1 : (c >= 0xc2 && c <= 0xdf) ? 2 : (c >= 0xe0 && c <= 0xef) ? 3 : (c >= 0xf0 && c <= 0xf4) ? 4 : 0;
    if (!k || i + k > n) return false;
    for (size_t j = 1; j < k; j++)
      if ((s[i + j] & 0xc0) != 0x80) return false;
    /* overlong forms, surrogates, and code points above U+10FFFF */
    if ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] >= 0xa0) || (c == 0xf0 && s[i + 1] < 0x90) ||
        (c == 0xf4 && s[i + 1] >= 0x90))
      return false;
    i += k;
  }
  return true;
}

typedef struct Open {
  int label;
  int nchild;
  int word;
  long first_child; /* index into the pending child list */
} Open;

/* One bracketed tree: `(label token)` or `(label tree tree ...)`. */
/* The parser's stacks, kept across the lines of one file (no statics: loads may run in
 * several threads). */
typedef struct TreeScratch {
  Open *stack;
  long capstack;
  int *kids; /* children of the open nodes, back to back */
  long capkids;
} TreeScratch;

static int parse_tree(cavs_dataset *s, const Shape *sh, cavs_vocab *v, int add, const char *line, size_t len,
                      const char *path, long lineno, char *err, size_t errlen, TreeScratch *ts) {
  Open *stack = ts->stack;
  long capstack = ts->capstack;
  int *kids = ts->kids;
  long capkids = ts->capkids;
  long depth = 0, nkids = 0;
  long first = s->nv;
  size_t i = 0;
#define SAVE() (ts->stack = stack, ts->capstack = capstack, ts->kids = kids, ts->capkids = capkids)
#define FAIL(...)                                                                        \
  do {                                                                                   \
    int at_ = snprintf(err, errlen, "%s:%ld: error: ", path, lineno);                   \
    snprintf(err + at_, errlen > (size_t)at_ ? errlen - (size_t)at_ : 0, __VA_ARGS__);  \
    s->nv = first;                                                                       \
    SAVE();                                                                              \
    return -1;                                                                           \
  } while (0)
  while (i < len && line[i] == ' ') i++;
  if (i == len) FAIL("empty line");
  bool done = false;
  while (i < len) {
    char ch = line[i];
    if (ch == ' ') {
      i++;
      continue;
    }
    if (done) FAIL("text after the end of the tree at column %zu", i + 1);
    if (ch == '(') {
      i++;
      size_t a = i;
      while (i < len && line[i] != ' ' && line[i] != '(' && line[i] != ')') i++;
      char *end;
      long label = strtol(line + a, &end, 10);
      if (i == a || end != line + i) FAIL("expected a label after '(' at column %zu", a + 1);
      /* unbounded (no dims, or a class range that is the vocabulary): still an int */
      long hi = sh->nclass > 0 && sh->nclass <= INT_MAX ? sh->nclass - 1 : INT_MAX;
      if (label < -1 || label > hi)
        FAIL("label %ld at column %zu is out of range (0..%ld, or -1 for none)", label, a + 1, hi);
      if (depth == capstack) {
        if (!grow_array(&stack, sizeof(Open), (size_t)(capstack ? capstack * 2 : 64))) FAIL("out of memory at column %zu", a);
        capstack = capstack ? capstack * 2 : 64;
      }
      stack[depth++] = (Open){.label = (int)label, .word = -2, .first_child = nkids};
      continue;
    }
    if (ch == ')') {
      if (!depth) FAIL("unbalanced ')' at column %zu", i + 1);
      Open *o = &stack[depth - 1];
      if (o->word == -2 && o->nchild == 0) FAIL("empty node at column %zu", i + 1);
      if (o->nchild > sh->maxc)
        FAIL("a node with %d children at column %zu, but the model takes at most %d", o->nchild, i + 1, sh->maxc);
      /* every inner node gets one block, which may take fewer children than another */
      if (o->nchild > sh->inner_children)
        FAIL("a node with %d children at column %zu, but block '%s', which inner nodes get, takes %d", o->nchild,
             i + 1, sh->inner_name, sh->inner_children);
      char why[128];
      if (add_vertex(s, first, why, sizeof why)) FAIL("%s", why);
      long id = s->nv - 1;
      int *cp = s->child + id * s->maxc;
      for (int k = 0; k < o->nchild; k++) cp[k] = (int)(kids[o->first_child + k] - first);
      s->type[id] = o->nchild ? sh->inner_type : sh->leaf_type;
      if (sh->word_slot >= 0) s->feat[id * s->nint + sh->word_slot] = o->word >= 0 ? o->word : -1;
      if (sh->label_slot >= 0) s->feat[id * s->nint + sh->label_slot] = o->label;
      nkids = o->first_child;
      depth--;
      i++;
      if (depth) {
        if (nkids == capkids) {
          if (!grow_array(&kids, sizeof(int), (size_t)(capkids ? capkids * 2 : 256))) FAIL("out of memory at column %zu", i);
          capkids = capkids ? capkids * 2 : 256;
        }
        kids[nkids++] = id;
        stack[depth - 1].nchild++;
        if (stack[depth - 1].word != -2) FAIL("a node with both a word and children at column %zu", i);
      } else {
        done = true;
      }
      continue;
    }
    /* a token: the word of the innermost open node */
    if (!depth) FAIL("expected '(' at column %zu", i + 1);
    size_t a = i;
    while (i < len && line[i] != ' ' && line[i] != '(' && line[i] != ')') i++;
    Open *o = &stack[depth - 1];
    if (o->word != -2 || o->nchild) FAIL("a second token or a token after children at column %zu", a + 1);
    o->word = sh->word_slot >= 0 ? cavs_vocab_id(v, line + a, i - a, add) : -1;
    if (o->word < -1 || (sh->word_slot >= 0 && o->word < 0))
      FAIL("%s", cavs_vocab_size(v) >= CAVS_MAX_DIM ? "the vocabulary is full (16777216 words)" : "out of memory");
  }
  if (depth) FAIL("missing ')' at the end of the line (%ld open)", depth);
  if (!done) FAIL("no tree on this line");
  char why[128];
  if (add_graph(s, first, why, sizeof why)) FAIL("%s", why);
  SAVE();
  return 0;
#undef FAIL
#undef SAVE
}

static int parse_text(cavs_dataset *s, const Shape *sh, cavs_vocab *v, int add, const char *line, size_t len,
                      const char *path, long lineno, char *err, size_t errlen) {
  long first = s->nv;
  char why[128];
#define TEXT_FAIL(msg)                                                 \
  do {                                                                 \
    snprintf(err, errlen, "%s:%ld: error: %s", path, lineno, msg);   \
    s->nv = first;                                                     \
    return -1;                                                         \
  } while (0)
  int prev_word = -1;
  for (size_t i = 0; i < len;) {
    while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
    if (i == len) break;
    size_t a = i;
    while (i < len && line[i] != ' ' && line[i] != '\t') i++;
    int w = cavs_vocab_id(v, line + a, i - a, add);
    if (w < 0) TEXT_FAIL(cavs_vocab_size(v) >= CAVS_MAX_DIM ? "the vocabulary is full (16777216 words)" : "out of memory");
    if (s->nv > first && sh->label_slot >= 0) s->feat[(s->nv - 1) * s->nint + sh->label_slot] = w;
    if (add_vertex(s, first, why, sizeof why)) TEXT_FAIL(why);
    long id = s->nv - 1;
    if (id > first) s->child[id * s->maxc] = (int)(id - 1 - first);
    s->type[id] = sh->inner_type;
    if (sh->word_slot >= 0) s->feat[id * s->nint + sh->word_slot] = w;
    prev_word = w;
  }
  (void)prev_word;
  if (s->nv == first) {
    snprintf(err, errlen, "%s:%ld: error: empty line", path, lineno);
    return -1;
  }
  if (sh->label_slot >= 0) s->feat[(s->nv - 1) * s->nint + sh->label_slot] = 1; /* <eos> */
  if (add_graph(s, first, why, sizeof why)) TEXT_FAIL(why);
  return 0;
#undef TEXT_FAIL
}

/* ---- cgf: the generic graph format (man 5 cavs-data) ----
 *
 *   graph
 *   ID TYPE [CHILD|- ...] [; NAME=VALUE ...]      one line per vertex, IDs 0, 1, ... in order
 *   end
 *
 * TYPE names a vertex block; CHILD is another vertex's ID (any order: a DAG), `-` an empty
 * slot; VALUE is an integer for index and class inputs, comma-separated numbers for real
 * inputs. `#` starts a comment. A cycle is an error. */
typedef struct Cgf {
  const cavs_desc *d;
  const long *dims;
  long first;        /* first vertex of the open graph, or -1 */
  long first_line;
  int *pending;      /* scratch for the cycle check */
  long cappending;
  long *vline;       /* line of each vertex of the open graph */
  long capvline;
} Cgf;

static char *next_word(char **p) {
  while (**p == ' ' || **p == '\t') (*p)++;
  if (!**p) return NULL;
  char *w = *p;
  while (**p && **p != ' ' && **p != '\t') (*p)++;
  if (**p) *(*p)++ = 0;
  return w;
}

static int cgf_close(cavs_dataset *s, Cgf *c, const char *path, long lineno, char *err, size_t errlen) {
  long n = s->nv - c->first;
  if (n == 0) {
    snprintf(err, errlen, "%s:%ld: error: empty graph", path, c->first_line);
    return -1;
  }
  for (long v = 0; v < n; v++)
    for (int k = 0; k < s->maxc; k++) {
      int ch = s->child[(c->first + v) * s->maxc + k];
      if (ch >= n) {
        snprintf(err, errlen, "%s:%ld: error: vertex %ld: child %d is not in this graph (it has %ld vertices)", path,
                 c->vline[v], v, ch, n);
        return -1;
      }
    }
  /* Kahn from the leaves: whatever is left over lies on a cycle */
  if (n + 1 > c->cappending) {
    if (!grow_array(&c->pending, sizeof(int), (size_t)(3 * n + 3))) {
      snprintf(err, errlen, "%s:%ld: error: out of memory for a graph of %ld vertices", path, c->first_line, n);
      return -1;
    }
    c->cappending = n + 1;
  }
  int *pend = c->pending, *queue = c->pending + n + 1, *nparents = queue + n + 1;
  (void)nparents;
  const int *ch = s->child + c->first * s->maxc;
  long head = 0, tail = 0;
  for (long v = 0; v < n; v++) {
    pend[v] = 0;
    for (int k = 0; k < s->maxc; k++) pend[v] += ch[v * s->maxc + k] >= 0;
    if (!pend[v]) queue[tail++] = (int)v;
  }
  /* a parent's pending count drops when a child is done: walk parents by scanning is
     O(n * maxc) per done vertex in the worst case, so build the reverse edges once */
  long ne = 0;
  for (long v = 0; v < n * s->maxc; v++) ne += ch[v] >= 0;
  int *off = calloc((size_t)n + 1, sizeof(int)), *adj = malloc(sizeof(int) * (size_t)(ne + 1));
  int *fill = malloc(sizeof(int) * (size_t)(n + 1));
  if (!off || !adj || !fill) {
    free(off);
    free(adj);
    free(fill);
    errno = ENOMEM;
    snprintf(err, errlen, "%s:%ld: error: out of memory for a graph of %ld vertices", path, c->first_line, n);
    return -1;
  }
  for (long v = 0; v < n; v++)
    for (int k = 0; k < s->maxc; k++)
      if (ch[v * s->maxc + k] >= 0) off[ch[v * s->maxc + k] + 1]++;
  for (long v = 0; v < n; v++) off[v + 1] += off[v];
  memcpy(fill, off, sizeof(int) * (size_t)n);
  for (long v = 0; v < n; v++)
    for (int k = 0; k < s->maxc; k++)
      if (ch[v * s->maxc + k] >= 0) adj[fill[ch[v * s->maxc + k]]++] = (int)v;
  while (head < tail) {
    int v = queue[head++];
    for (int e = off[v]; e < off[v + 1]; e++)
      if (--pend[adj[e]] == 0) queue[tail++] = adj[e];
  }
  free(off);
  free(adj);
  free(fill);
  if (tail < n) {
    /* what is left waits on a cycle or on a vertex that does; following a child that is
       still waiting n times lands on the cycle itself */
    long v = 0;
    while (pend[v] == 0) v++;
    for (long step = 0; step < n; step++)
      for (int k = 0; k < s->maxc; k++) {
        int w = ch[v * s->maxc + k];
        if (w >= 0 && pend[w] > 0) {
          v = w;
          break;
        }
      }
    /* name the cycle by its smallest vertex: go round it once */
    long best = v, u = v;
    do {
      for (int k = 0; k < s->maxc; k++) {
        int w = ch[u * s->maxc + k];
        if (w >= 0 && pend[w] > 0) {
          u = w;
          break;
        }
      }
      if (u < best) best = u;
    } while (u != v && best >= 0 && ++tail < 2 * n + 2);
    v = best;
    snprintf(err, errlen, "%s:%ld: error: the graph has a cycle through vertex %ld", path, c->vline[v], v);
    return -1;
  }
  char why[128];
  if (add_graph(s, c->first, why, sizeof why)) {
    snprintf(err, errlen, "%s:%ld: error: %s", path, lineno, why);
    return -1;
  }
  c->first = -1;
  return 0;
}

static int cgf_line(cavs_dataset *s, Cgf *c, const Shape *sh, char *line, const char *path, long lineno, char *err,
                    size_t errlen) {
  const cavs_desc *d = c->d;
#define CGF_FAIL(...)                                                                    \
  do {                                                                                   \
    int at_ = snprintf(err, errlen, "%s:%ld: error: ", path, lineno);                   \
    snprintf(err + at_, errlen > (size_t)at_ ? errlen - (size_t)at_ : 0, __VA_ARGS__);  \
    return -1;                                                                           \
  } while (0)
  char *hash = strchr(line, '#');
  if (hash) *hash = 0;
  /* the features follow ';', with or without spaces around it */
  char *feats = strchr(line, ';');
  if (feats) *feats++ = 0;
  char *p = line;
  char *w = next_word(&p);
  if (!w) return 0; /* blank or comment */
  if (!strcmp(w, "graph")) {
    if (c->first >= 0) CGF_FAIL("'graph' inside a graph (missing 'end' for the graph at line %ld)", c->first_line);
    c->first = s->nv;
    c->first_line = lineno;
    return 0;
  }
  if (!strcmp(w, "end")) {
    if (c->first < 0) CGF_FAIL("'end' without 'graph'");
    return cgf_close(s, c, path, lineno, err, errlen);
  }
  if (c->first < 0) CGF_FAIL("expected 'graph', found '%s'", w);
  char *end;
  long id = strtol(w, &end, 10);
  if (*end || id != s->nv - c->first) CGF_FAIL("expected vertex %ld, found '%s' (vertices are numbered 0, 1, ... in order)", s->nv - c->first, w);
  char *tname = next_word(&p);
  if (!tname) CGF_FAIL("vertex %ld has no type", id);
  int type = -1;
  for (int t = 0; t < d->nvertex; t++)
    if (!strcmp(d->vertex[t].name, tname)) type = t;
  if (type < 0) CGF_FAIL("unknown vertex type '%s' (model '%s' has %d vertex blocks)", tname, d->name, d->nvertex);
  char why[128];
  if (add_vertex(s, c->first, why, sizeof why)) CGF_FAIL("%s", why);
  long v = s->nv - 1;
  s->type[v] = type;
  if (id + 1 > c->capvline) {
    if (!grow_array(&c->vline, sizeof(long), (size_t)(2 * (id + 1)))) CGF_FAIL("out of memory after %ld vertices", id);
    c->capvline = 2 * (id + 1);
  }
  c->vline[id] = lineno;
  int slot = 0;
  while ((w = next_word(&p))) {
    if (slot >= d->vertex[type].children) CGF_FAIL("vertex %ld: more than %d children for type '%s'", id, d->vertex[type].children, tname);
    if (strcmp(w, "-")) {
      long ch = strtol(w, &end, 10);
      if (*end || ch < 0 || ch > 1000000000L) CGF_FAIL("vertex %ld: '%s' is not a vertex number", id, w);
      s->child[v * s->maxc + slot] = (int)ch;
    }
    slot++;
  }
  p = feats ? feats : p + strlen(p);
  bool seen[64] = {false};
  while ((w = next_word(&p))) {
    char *eq = strchr(w, '=');
    if (!eq) CGF_FAIL("vertex %ld: expected NAME=VALUE, found '%s'", id, w);
    *eq = 0;
    int in = -1;
    for (int i = 0; i < d->ninputs; i++)
      if (!strcmp(d->inputs[i].name, w)) in = i;
    if (in < 0) CGF_FAIL("vertex %ld: model '%s' has no input '%s'", id, d->name, w);
    const cavs_input_desc *desc = &d->inputs[in];
    if (in < 64 && seen[in]) CGF_FAIL("vertex %ld: input '%s' given twice", id, w);
    if (in < 64) seen[in] = true;
    if (desc->kind == CAVS_IN_REAL) {
      long off = 0;
      for (int i = 0; i < in; i++)
        if (d->inputs[i].kind == CAVS_IN_REAL) off += cv_lin(&d->inputs[i].width, c->dims);
      long width = cv_lin(&desc->width, c->dims), k = 0;
      for (char *q = eq + 1; *q; k++) {
        double x = strtod(q, &end);
        if (end == q || !isfinite(x)) CGF_FAIL("vertex %ld: '%s' is not a number", id, q);
        /* graphs hold floats: a finite double beyond them would become an infinity */
        if (fabs(x) > FLT_MAX) CGF_FAIL("vertex %ld: %.*s is out of the range of a float", id, (int)(end - q), q);
        if (k >= width) CGF_FAIL("vertex %ld: more than %ld values for '%s'", id, width, w);
        s->real[v * s->realw + off + k] = (float)x;
        q = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') CGF_FAIL("vertex %ld: '%s' is not a number", id, end);
      }
      if (k != width) CGF_FAIL("vertex %ld: '%s' needs %ld values, found %ld", id, w, width, k);
      continue;
    }
    long x = strtol(eq + 1, &end, 10);
    long bound = c->dims ? cv_lin(&desc->width, c->dims) : 0;
    if (*end || eq[1] == 0) CGF_FAIL("vertex %ld: %s=%s is not an integer", id, w, eq + 1);
    /* unbounded (no dims, or a class range bound to the data): still an int */
    bool checked = bound > 0 && bound <= INT_MAX && !(desc->kind == CAVS_IN_CLASS && sh->nclass == 0);
    long hi = checked ? bound - 1 : INT_MAX;
    if (x < -1 || x > hi) CGF_FAIL("vertex %ld: %s=%ld is outside -1..%ld", id, w, x, hi);
    s->feat[v * s->nint + desc->slot] = (int)x;
  }
  /* children must name vertices of this graph, known once it ends; check what we can */
  (void)sh;
  return 0;
#undef CGF_FAIL
}

cavs_dataset *cavs_dataset_load(const char *path, const char *format, const cavs_desc *d, const long *dims,
                                cavs_vocab *v, int grow, char *err, size_t errlen) {
  Shape sh;
  if (shape_of(d, dims, &sh, err, errlen)) return NULL;
  bool tree = !strcmp(format, "ptb-tree"), cgf = !strcmp(format, "cgf");
  if (!tree && !cgf && strcmp(format, "text")) {
    snprintf(err, errlen, "unknown data format '%s' (ptb-tree, text, cgf)", format);
    return NULL;
  }
  long realw = 0;
  for (int i = 0; i < d->ninputs; i++)
    if (d->inputs[i].kind == CAVS_IN_REAL) {
      if (!dims) {
        snprintf(err, errlen, "model '%s' has real inputs: its dims must be known to read data", d->name);
        return NULL;
      }
      realw += cv_lin(&d->inputs[i].width, dims);
    }
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
    return NULL;
  }
  cavs_dataset *s = calloc(1, sizeof *s);
  if (!s) {
    fclose(f);
    errno = ENOMEM;
    snprintf(err, errlen, "out of memory reading '%s'", path);
    return NULL;
  }
  s->maxc = sh.maxc;
  s->nint = sh.nint;
  s->realw = cgf ? realw : 0;
  Cgf cg = {.d = d, .dims = dims, .first = -1};
  TreeScratch tsc = {0};
  /* the vocabulary grows as we go; on error, new words stay (harmless: ids only grow) */
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  long lineno = 0;
  int rc = 0;
  while ((got = getline(&line, &cap, f)) >= 0) {
    lineno++;
    size_t n = (size_t)got;
    if (n && line[n - 1] == '\n') n--;
    if (n && line[n - 1] == '\r') n--;
    if (memchr(line, 0, n)) {
      snprintf(err, errlen, "%s:%ld: error: NUL byte", path, lineno);
      rc = -1;
      break;
    }
    if (!valid_utf8(line, n)) {
      snprintf(err, errlen, "%s:%ld: error: invalid UTF-8", path, lineno);
      rc = -1;
      break;
    }
    line[n] = 0;
    rc = cgf ? cgf_line(s, &cg, &sh, line, path, lineno, err, errlen)
         : tree ? parse_tree(s, &sh, v, grow, line, n, path, lineno, err, errlen, &tsc)
                : parse_text(s, &sh, v, grow, line, n, path, lineno, err, errlen);
    if (rc) break;
  }
  if (!rc && cgf && cg.first >= 0) {
    snprintf(err, errlen, "%s:%ld: error: the graph that starts here has no 'end'", path, cg.first_line);
    rc = -1;
  }
  free(cg.pending);
  free(cg.vline);
  free(tsc.stack);
  free(tsc.kids);
  if (!rc && ferror(f)) {
    snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
    rc = -1;
  }
  free(line);
  fclose(f);
  if (!rc && s->n == 0) {
    snprintf(err, errlen, "%s: error: no graphs in the file", path);
    rc = -1;
  }
  if (rc) {
    cavs_dataset_free(s);
    return NULL;
  }
  fix_graphs(s);
  return s;
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

int cavs_gen_toy(FILE *out, int ntrees, int maxleaves, int nwords, uint64_t seed) {
  uint64_t s = seed * 2654435761u + 1;
  int *pol = malloc(sizeof(int) * (size_t)(2 * maxleaves + 2));
  bool *neg = malloc(sizeof(bool) * (size_t)(2 * maxleaves + 2));
  char **txt = malloc(sizeof(char *) * (size_t)(2 * maxleaves + 2));
  if (!pol || !txt || !neg) goto oom;
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
    /* merge random neighbours until one tree is left */
    for (int k = n; k > 1; k--) {
      int i = (int)(gen_next(&s) % (uint64_t)(k - 1));
      int p = neg[i] ? -pol[i + 1] : pol[i] + pol[i + 1];
      p = p < -2 ? -2 : p > 2 ? 2 : p;
      size_t len = strlen(txt[i]) + strlen(txt[i + 1]) + 16;
      char *m = malloc(len);
      if (!m) {
        free_strings(txt, k);
        goto oom;
      }
      snprintf(m, len, "(%d %s %s)", p + 2, txt[i], txt[i + 1]);
      free(txt[i]);
      free(txt[i + 1]);
      txt[i] = m;
      pol[i] = p;
      neg[i] = false;
      for (int j = i + 1; j < k - 1; j++) {
        txt[j] = txt[j + 1];
        pol[j] = pol[j + 1];
        neg[j] = neg[j + 1];
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

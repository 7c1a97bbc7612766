/* data_ptb.c: the `ptb-tree` format (cavs-data(5)): SST-style bracketed trees, one a
 * line, a label on every node, tokens split on ASCII space only (SST has tokens with
 * U+00A0 inside). Every node is a vertex; leaves get the first block without children,
 * inner nodes the first block with children. */
#include "data.h"

#include <errno.h>
#include <stdarg.h>

typedef struct Open {
  int label;
  int nchild;
  int word;
  long first_child; /* index into the pending child list */
} Open;

/* The parser's stacks, kept across the lines of one file (no statics: loads may run in
 * several threads). */
typedef struct TreeScratch {
  Open *stack;
  long capstack;
  int *kids; /* children of the open nodes, back to back */
  long capkids;
} TreeScratch;

/* One line's parse: where it is, and its open nodes. */
typedef struct Tree {
  cavs_dataset *s;
  const Shape *sh;
  TreeScratch *ts;
  long depth, nkids; /* open nodes; their children in ts->kids */
  long first;        /* the graph's first vertex */
  const char *path;
  long lineno;
  char *err;
  size_t errlen;
} Tree;

/* "PATH:LINE: error: ..." into err, the line's vertices dropped; returns -1. */
__attribute__((format(printf, 2, 3))) static int tree_fail(Tree *t, const char *fmt, ...) {
  int at = snprintf(t->err, t->errlen, "%s:%ld: error: ", t->path, t->lineno);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->err + at, t->errlen > (size_t)at ? t->errlen - (size_t)at : 0, fmt, ap);
  va_end(ap);
  t->s->nv = t->first;
  return -1;
}

/* "(LABEL" with line[*i] just past the '(': a node opened. */
static int open_node(Tree *t, const char *line, size_t len, size_t *i) {
  TreeScratch *ts = t->ts;
  size_t a = *i;
  while (*i < len && line[*i] != ' ' && line[*i] != '(' && line[*i] != ')') (*i)++;
  char *end;
  errno = 0;
  long label = strtol(line + a, &end, 10);
  if (*i == a || end != line + *i) return tree_fail(t, "expected a label after '(' at column %zu", a + 1);
  /* unbounded (no dims, or a class range that is the vocabulary): below the most any dim
     can be */
  const Shape *sh = t->sh;
  long hi = sh->nclass > 0 && sh->nclass <= CAVS_MAX_DIM ? sh->nclass - 1 : CAVS_MAX_DIM - 1;
  if (errno == ERANGE || label < -1 || label > hi)
    return tree_fail(t, "label %s at column %zu is out of range (0..%ld, or -1 for none)",
                     cv_shown((char[CV_SHOWN]){0}, line + a, *i - a), a + 1, hi);
  if (t->depth == ts->capstack) {
    long cap = ts->capstack ? ts->capstack * 2 : 64;
    if (!cv_grow_array(&ts->stack, sizeof(Open), (size_t)cap)) return tree_fail(t, "out of memory at column %zu", a);
    ts->capstack = cap;
  }
  ts->stack[t->depth++] = (Open){.label = (int)label, .word = -2, .first_child = t->nkids};
  return 0;
}

/* ")" at line[*i]: the innermost node made a vertex, a child of the node around it or
   the tree's root (*done). */
static int close_node(Tree *t, size_t *i, bool *done) {
  TreeScratch *ts = t->ts;
  const Shape *sh = t->sh;
  cavs_dataset *s = t->s;
  if (!t->depth) return tree_fail(t, "unbalanced ')' at column %zu", *i + 1);
  Open *o = &ts->stack[t->depth - 1];
  if (o->word == -2 && o->nchild == 0) return tree_fail(t, "empty node at column %zu", *i + 1);
  if (o->nchild > sh->maxc)
    return tree_fail(t, "a node with %d children at column %zu, but the model takes at most %d", o->nchild, *i + 1,
                     sh->maxc);
  /* every inner node gets one block, which may take fewer children than another */
  if (o->nchild > sh->inner_children)
    return tree_fail(t, "a node with %d children at column %zu, but block '%s', which inner nodes get, takes %d",
                     o->nchild, *i + 1, sh->inner_name, sh->inner_children);
  char why[128];
  if (cv_add_vertex(s, t->first, why, sizeof why)) return tree_fail(t, "%s", why);
  long id = s->nv - 1;
  int *cp = s->child + id * s->maxc;
  for (int k = 0; k < o->nchild; k++) cp[k] = (int)(ts->kids[o->first_child + k] - t->first);
  s->type[id] = o->nchild ? sh->inner_type : sh->leaf_type;
  if (sh->word_slot >= 0) s->feat[id * s->nint + sh->word_slot] = o->word >= 0 ? o->word : -1;
  if (sh->label_slot >= 0) s->feat[id * s->nint + sh->label_slot] = o->label;
  t->nkids = o->first_child;
  t->depth--;
  (*i)++;
  if (!t->depth) {
    *done = true;
    return 0;
  }
  if (t->nkids == ts->capkids) {
    long cap = ts->capkids ? ts->capkids * 2 : 256;
    if (!cv_grow_array(&ts->kids, sizeof(int), (size_t)cap)) return tree_fail(t, "out of memory at column %zu", *i);
    ts->capkids = cap;
  }
  ts->kids[t->nkids++] = (int)id;
  ts->stack[t->depth - 1].nchild++;
  if (ts->stack[t->depth - 1].word != -2) return tree_fail(t, "a node with both a word and children at column %zu", *i);
  return 0;
}

/* One bracketed tree: `(label token)` or `(label tree tree ...)`. */
static int parse_tree(cavs_dataset *s, const Shape *sh, cavs_vocab *v, int add, const char *line, size_t len,
                      const char *path, long lineno, char *err, size_t errlen, TreeScratch *ts) {
  Tree t = {.s = s, .sh = sh, .ts = ts, .first = s->nv, .path = path, .lineno = lineno, .err = err, .errlen = errlen};
  size_t i = 0;
  while (i < len && line[i] == ' ') i++;
  if (i == len) return tree_fail(&t, "empty line");
  bool done = false;
  while (i < len) {
    char ch = line[i];
    if (ch == ' ') {
      i++;
      continue;
    }
    if (done) return tree_fail(&t, "text after the end of the tree at column %zu", i + 1);
    if (ch == '(') {
      i++;
      if (open_node(&t, line, len, &i)) return -1;
      continue;
    }
    if (ch == ')') {
      if (close_node(&t, &i, &done)) return -1;
      continue;
    }
    /* a token: the word of the innermost open node */
    if (!t.depth) return tree_fail(&t, "expected '(' at column %zu", i + 1);
    size_t a = i;
    while (i < len && line[i] != ' ' && line[i] != '(' && line[i] != ')') i++;
    Open *o = &ts->stack[t.depth - 1];
    if (o->word != -2 || o->nchild) return tree_fail(&t, "a second token or a token after children at column %zu", a + 1);
    o->word = sh->word_slot >= 0 ? cavs_vocab_id(v, line + a, i - a, add) : -1;
    if (o->word < -1 || (sh->word_slot >= 0 && o->word < 0))
      return tree_fail(&t, "%s", cavs_vocab_size(v) >= CAVS_MAX_DIM ? "the vocabulary is full (16777216 words)" : "out of memory");
  }
  if (t.depth) return tree_fail(&t, "missing ')' at the end of the line (%ld open)", t.depth);
  if (!done) return tree_fail(&t, "no tree on this line");
  char why[128];
  if (cv_add_graph(s, t.first, why, sizeof why)) return tree_fail(&t, "%s", why);
  return 0;
}

static int ptb_begin(CvLoad *l, void **state) {
  (void)l;
  return (*state = calloc(1, sizeof(TreeScratch))) ? 0 : -1;
}

static int ptb_line(CvLoad *l, void *state, char *line, size_t len) {
  return parse_tree(l->s, l->sh, l->v, l->grow, line, len, l->path, l->lineno, l->err, l->errlen, state);
}

static int ptb_end(CvLoad *l, void *state, int rc) {
  (void)l;
  TreeScratch *ts = state;
  free(ts->stack);
  free(ts->kids);
  free(ts);
  return rc;
}

const CvFormat cv_format_ptb = {"ptb-tree", false, ptb_begin, ptb_line, ptb_end, true};

/* data_ptb.c: the `ptb-tree` format (cavs-data(5)): SST-style bracketed trees, one a
 * line, a label on every node, tokens split on ASCII space only (SST has tokens with
 * U+00A0 inside). Every node is a vertex; leaves get the first block without children,
 * inner nodes the first block with children. */
#include "data.h"

#include <errno.h>

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
      errno = 0;
      long label = strtol(line + a, &end, 10);
      if (i == a || end != line + i) FAIL("expected a label after '(' at column %zu", a + 1);
      /* unbounded (no dims, or a class range that is the vocabulary): below the most
         any dim can be */
      long hi = sh->nclass > 0 && sh->nclass <= CAVS_MAX_DIM ? sh->nclass - 1 : CAVS_MAX_DIM - 1;
      if (errno == ERANGE || label < -1 || label > hi)
        FAIL("label %s at column %zu is out of range (0..%ld, or -1 for none)", cv_shown((char[CV_SHOWN]){0}, line + a, i - a), a + 1, hi);
      if (depth == capstack) {
        if (!cv_grow_array(&stack, sizeof(Open), (size_t)(capstack ? capstack * 2 : 64))) FAIL("out of memory at column %zu", a);
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
      if (cv_add_vertex(s, first, why, sizeof why)) FAIL("%s", why);
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
          if (!cv_grow_array(&kids, sizeof(int), (size_t)(capkids ? capkids * 2 : 256))) FAIL("out of memory at column %zu", i);
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
  if (cv_add_graph(s, first, why, sizeof why)) FAIL("%s", why);
  SAVE();
  return 0;
#undef FAIL
#undef SAVE
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

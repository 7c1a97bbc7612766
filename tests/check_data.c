/* check_data.c: the data loaders (runtime/data.c), format by format, with good files
 * checked vertex by vertex and malformed ones checked for the exact error: NULL back, and
 * "FILE:LINE: error: ..." naming the line at fault. Models are the examples, compiled
 * once (in the parent process, by an unchecked fixture) and shared by every test. */
#include "engine.h"

#include <locale.h>

static const cavs_desc *TL, *LM, *TT; /* treelstm, lstm_lm, twotype */
static char g_dir[64];                /* this run's files */

/* a model of dsl-examples/ in float */
static const cavs_desc *model(const char *vf) { return load_model(vf, "float"); }

static void setup_models(void) {
  if (!TL) TL = model("treelstm.vf");
  if (!LM) LM = model("lstm_lm.vf");
  if (!TT) TT = model("twotype.vf");
}

static int slot_of(const cavs_desc *d, const char *input) {
  int i = find_input(d, input);
  ck_assert_msg(i >= 0, "model %s has no input %s", d->name, input);
  return d->inputs[i].slot;
}

static int type_of(const cavs_desc *d, const char *name) {
  for (int t = 0; t < d->nvertex; t++)
    if (!strcmp(d->vertex[t].name, name)) return t;
  ck_abort_msg("model %s has no vertex block %s", d->name, name);
  return -1;
}

/* dims: the defaults with V = 100 (every dim positive). */
static void dims_of(const cavs_desc *d, long *dims) {
  cavs_dims_default(d, dims);
  int v = find_dim(d, "V");
  ck_assert(v >= 0);
  dims[v] = 100;
  for (int i = 0; i < d->ndims; i++) ck_assert(dims[i] > 0);
}

static void file_path(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", g_dir, name); }

/* Writes `len` bytes to a file in g_dir and loads it. */
static cavs_dataset *load_bytes(const char *name, const char *data, size_t len, const char *format,
                                const cavs_desc *d, const long *dims, cavs_vocab *v, int grow, char *err,
                                size_t errlen) {
  char path[256];
  file_path(path, sizeof path, name);
  tu_write(path, data, len);
  err[0] = 0;
  return cavs_dataset_load(path, format, d, dims, v, grow, err, errlen);
}

static cavs_dataset *load_ok(const char *name, const char *data, size_t len, const char *format,
                             const cavs_desc *d, const long *dims, cavs_vocab *v, int grow) {
  char err[1024];
  cavs_dataset *s = load_bytes(name, data, len, format, d, dims, v, grow, err, sizeof err);
  ck_assert_msg(s != NULL, "%s failed to load: %s", name, err);
  return s;
}

/* The load fails with "PATH:LINE: error: ..." (line 0: "PATH: error: ...") containing `sub`. */
static void expect_error(const char *name, const char *data, size_t len, const char *format, const cavs_desc *d,
                         const long *dims, long line, const char *sub) {
  char err[1024], path[256], prefix[300];
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_bytes(name, data, len, format, d, dims, v, 1, err, sizeof err);
  file_path(path, sizeof path, name);
  cavs_vocab_free(v);
  unlink(path);
  bool loaded = s != NULL;
  cavs_dataset_free(s);
  ck_assert_msg(!loaded, "%s loaded, but should fail with line %ld: %s", name, line, sub);
  if (line > 0) snprintf(prefix, sizeof prefix, "%s:%ld: error: ", path, line);
  else snprintf(prefix, sizeof prefix, "%s: error: ", path);
  ck_assert_msg(!strncmp(err, prefix, strlen(prefix)), "%s: expected the prefix '%s', got '%s'", name, prefix, err);
  ck_assert_msg(strstr(err + strlen(prefix), sub) != NULL, "%s: expected '%s' in '%s'", name, sub, err);
}

static void expect_word(const cavs_vocab *v, int id, const char *word) {
  const char *w = cavs_vocab_word(v, id);
  ck_assert_msg(w && !strcmp(w, word), "id %d is '%s', expected '%s'", id, w ? w : "(none)", word);
}

/* A tree in post-order: children before parents, packed to the front, every vertex but
 * the last has exactly one parent, the last (the root) none; leaves carry a word, inner
 * vertices none (-1). */
static void check_tree(const cavs_graph *g, int nint, int word_slot) {
  int *parents = calloc((size_t)g->n, sizeof(int));
  for (int v = 0; v < g->n; v++) {
    bool gap = false;
    int nc = 0;
    for (int k = 0; k < g->maxc; k++) {
      int c = g->child[v * g->maxc + k];
      if (c < 0) {
        gap = true;
        continue;
      }
      ck_assert_msg(!gap, "vertex %d: child slot %d used after an empty one", v, k);
      ck_assert_msg(c < v, "vertex %d: child %d is not before its parent", v, c);
      parents[c]++;
      nc++;
    }
    int w = g->feat[v * nint + word_slot];
    if (nc) ck_assert_msg(w == -1, "inner vertex %d has word %d", v, w);
    else ck_assert_msg(w >= 2, "leaf %d has word %d", v, w);
  }
  for (int v = 0; v < g->n; v++)
    ck_assert_msg(parents[v] == (v == g->n - 1 ? 0 : 1), "vertex %d has %d parents", v, parents[v]);
  free(parents);
}

static void expect_children(const cavs_graph *g, int v, int c0, int c1) {
  ck_assert_int_eq(g->maxc, 2);
  ck_assert_msg(g->child[v * 2] == c0 && g->child[v * 2 + 1] == c1, "vertex %d: children %d %d, expected %d %d", v,
                g->child[v * 2], g->child[v * 2 + 1], c0, c1);
}

/* Same vertices, children, types and features; words compared through the vocabularies. */
static void expect_same(const cavs_dataset *a, const cavs_vocab *va, const cavs_dataset *b, const cavs_vocab *vb,
                        int nint, int word_slot) {
  ck_assert_int_eq(cavs_dataset_count(a), cavs_dataset_count(b));
  ck_assert_int_eq(cavs_dataset_vertices(a), cavs_dataset_vertices(b));
  for (int i = 0; i < cavs_dataset_count(a); i++) {
    const cavs_graph *x = cavs_dataset_graph(a, i), *y = cavs_dataset_graph(b, i);
    ck_assert_int_eq(x->n, y->n);
    ck_assert_int_eq(x->maxc, y->maxc);
    ck_assert(!memcmp(x->child, y->child, sizeof(int) * (size_t)(x->n * x->maxc)));
    ck_assert(!memcmp(x->type, y->type, sizeof(int) * (size_t)x->n));
    ck_assert(!memcmp(x->feat, y->feat, sizeof(int) * (size_t)(x->n * nint)));
    for (int v = 0; v < x->n; v++) {
      int w = x->feat[v * nint + word_slot];
      if (w >= 0) ck_assert_str_eq(cavs_vocab_word(va, w), cavs_vocab_word(vb, w));
    }
  }
  ck_assert_int_eq(cavs_vocab_size(va), cavs_vocab_size(vb));
}

#define S(lit) lit, sizeof(lit) - 1

/* ================= ptb-tree ================= */

static const char ptb_good[] = "(3 (2 a) (4 b))\n"
                               "(1 (2 (0 c) (3 a)) (-1 d))\n"
                               "(4 e)\n";

START_TEST(ptb_good_file) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TL, dims);
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("good.txt", S(ptb_good), "ptb-tree", TL, dims, v, 1);
  int nint = TL->nint, W = slot_of(TL, "word"), L = slot_of(TL, "label");
  ck_assert_int_eq(cavs_dataset_count(s), 3);
  ck_assert_int_eq(cavs_dataset_vertices(s), 3 + 5 + 1);
  /* ids in order of first appearance after <unk> and <eos> */
  ck_assert_int_eq(cavs_vocab_size(v), 7);
  const char *words[] = {"<unk>", "<eos>", "a", "b", "c", "d", "e"};
  for (int i = 0; i < 7; i++) expect_word(v, i, words[i]);
  static const struct {
    int n;
    int child[5][2];
    int word[5], label[5];
  } want[3] = {
      {3, {{-1, -1}, {-1, -1}, {0, 1}}, {2, 3, -1}, {2, 4, 3}},
      {5, {{-1, -1}, {-1, -1}, {0, 1}, {-1, -1}, {2, 3}}, {4, 2, -1, 5, -1}, {0, 3, 2, -1, 1}},
      {1, {{-1, -1}}, {6}, {4}},
  };
  for (int i = 0; i < 3; i++) {
    const cavs_graph *g = cavs_dataset_graph(s, i);
    ck_assert_int_eq(g->n, want[i].n);
    check_tree(g, nint, W);
    for (int x = 0; x < g->n; x++) {
      expect_children(g, x, want[i].child[x][0], want[i].child[x][1]);
      ck_assert_int_eq(g->feat[x * nint + W], want[i].word[x]);
      ck_assert_int_eq(g->feat[x * nint + L], want[i].label[x]);
      ck_assert_int_eq(g->type ? g->type[x] : 0, 0); /* treelstm has one vertex block */
    }
    ck_assert_ptr_null(g->real);
  }
  ck_assert_int_eq(cavs_dataset_max_feature(s, W), 6);
  ck_assert_int_eq(cavs_dataset_max_feature(s, L), 4);
  cavs_dataset_free(s);
  cavs_vocab_free(v);
}
END_TEST

/* With two vertex blocks, leaves get the block without children, inner vertices the other. */
START_TEST(ptb_two_types) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TT, dims);
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("types.txt", S(ptb_good), "ptb-tree", TT, dims, v, 1);
  int leaf = type_of(TT, "leaf"), inner = type_of(TT, "internal");
  const cavs_graph *g = cavs_dataset_graph(s, 1);
  ck_assert_int_eq(g->n, 5);
  int want[5] = {leaf, leaf, inner, leaf, inner};
  for (int x = 0; x < 5; x++) ck_assert_int_eq(g->type[x], want[x]);
  ck_assert_int_eq(cavs_dataset_graph(s, 2)->type[0], leaf);
  cavs_dataset_free(s);
  cavs_vocab_free(v);
}
END_TEST

/* SST has tokens with U+00A0 inside: split on ASCII space only. */
START_TEST(ptb_nbsp_token) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TL, dims);
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("nbsp.txt", S("(2 (1 a\xc2\xa0" "b) (3 a))\n"), "ptb-tree", TL, dims, v, 1);
  const cavs_graph *g = cavs_dataset_graph(s, 0);
  int W = slot_of(TL, "word");
  ck_assert_int_eq(g->n, 3);
  ck_assert_int_eq(cavs_vocab_size(v), 4);
  expect_word(v, g->feat[0 * TL->nint + W], "a\xc2\xa0" "b");
  expect_word(v, g->feat[1 * TL->nint + W], "a");
  cavs_dataset_free(s);
  cavs_vocab_free(v);
}
END_TEST

/* CRLF line endings (and no newline at the end) give the same graphs and words as LF. */
START_TEST(ptb_crlf) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TL, dims);
  cavs_vocab *va = cavs_vocab_new(), *vb = cavs_vocab_new(), *vc = cavs_vocab_new();
  cavs_dataset *a = load_ok("lf.txt", S(ptb_good), "ptb-tree", TL, dims, va, 1);
  cavs_dataset *b = load_ok("crlf.txt",
                            S("(3 (2 a) (4 b))\r\n"
                              "(1 (2 (0 c) (3 a)) (-1 d))\r\n"
                              "(4 e)\r\n"),
                            "ptb-tree", TL, dims, vb, 1);
  cavs_dataset *c = load_ok("noeol.txt",
                            S("(3 (2 a) (4 b))\n"
                              "(1 (2 (0 c) (3 a)) (-1 d))\r\n"
                              "(4 e)"),
                            "ptb-tree", TL, dims, vc, 1);
  expect_same(a, va, b, vb, TL->nint, slot_of(TL, "word"));
  expect_same(a, va, c, vc, TL->nint, slot_of(TL, "word"));
  cavs_dataset_free(a);
  cavs_dataset_free(b);
  cavs_dataset_free(c);
  cavs_vocab_free(va);
  cavs_vocab_free(vb);
  cavs_vocab_free(vc);
}
END_TEST

/* Evaluation data: a fixed vocabulary maps unknown words to <unk> (0). */
START_TEST(ptb_no_grow) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TL, dims);
  int W = slot_of(TL, "word");
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *tr = load_ok("train.txt", S("(3 (2 a) (4 b))\n"), "ptb-tree", TL, dims, v, 1);
  ck_assert_int_eq(cavs_vocab_size(v), 4);
  cavs_dataset *te = load_ok("test.txt", S("(3 (2 zzz) (4 (1 b) (1 a)))\n"), "ptb-tree", TL, dims, v, 0);
  ck_assert_int_eq(cavs_vocab_size(v), 4);
  const cavs_graph *g = cavs_dataset_graph(te, 0);
  ck_assert_int_eq(g->n, 5);
  expect_children(g, 3, 1, 2);
  expect_children(g, 4, 0, 3);
  ck_assert_int_eq(g->feat[0 * TL->nint + W], 0);
  ck_assert_int_eq(g->feat[1 * TL->nint + W], 3);
  ck_assert_int_eq(g->feat[2 * TL->nint + W], 2);
  cavs_dataset_free(tr);
  cavs_dataset_free(te);
  cavs_vocab_free(v);
}
END_TEST

/* Without dims, labels are not bounded. */
START_TEST(ptb_dims_null) {
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("nodims.txt", S("(7 (9 a) (3 b))\n"), "ptb-tree", TL, NULL, v, 1);
  const cavs_graph *g = cavs_dataset_graph(s, 0);
  int L = slot_of(TL, "label");
  ck_assert_int_eq(g->feat[0 * TL->nint + L], 9);
  ck_assert_int_eq(g->feat[2 * TL->nint + L], 7);
  cavs_dataset_free(s);
  cavs_vocab_free(v);
}
END_TEST

/* dims as cavs_ckpt_dims fills them, the model's ndims values and nothing after: only
 * those are read (with ASan or valgrind, a read past them is an error), and they still
 * bound the labels. */
START_TEST(ptb_dims_of_model_length) {
  long full[CAVS_MAX_DIMS];
  dims_of(TL, full);
  long *dims = malloc(sizeof(long) * (size_t)TL->ndims);
  memcpy(dims, full, sizeof(long) * (size_t)TL->ndims);
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("ndims.txt", S("(4 (0 a) (3 b))\n"), "ptb-tree", TL, dims, v, 1);
  ck_assert_int_eq(cavs_dataset_count(s), 1);
  cavs_dataset_free(s);
  cavs_vocab_free(v);
  expect_error("ndims_label.txt", S("(5 (0 a) (3 b))\n"), "ptb-tree", TL, dims, 1, "out of range");
  free(dims);
}
END_TEST

/* Trees far deeper than the C stack would allow a recursive parser: 100,000 levels,
 * leaning left, then leaning right. */
enum { DEEP = 100000 };

START_TEST(ptb_deep_left) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TL, dims);
  size_t cap = (size_t)DEEP * 10 + 64, n = 0;
  char *buf = malloc(cap);
  for (int i = 0; i < DEEP; i++) n += (size_t)sprintf(buf + n, "(1 ");
  n += (size_t)sprintf(buf + n, "(2 a)");
  for (int i = 0; i < DEEP; i++) n += (size_t)sprintf(buf + n, " (3 b))");
  n += (size_t)sprintf(buf + n, "\n");
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("deep-left.txt", buf, n, "ptb-tree", TL, dims, v, 1);
  free(buf);
  ck_assert_int_eq(cavs_dataset_count(s), 1);
  const cavs_graph *g = cavs_dataset_graph(s, 0);
  ck_assert_int_eq(g->n, 2 * DEEP + 1);
  ck_assert_int_eq(cavs_dataset_vertices(s), 2 * DEEP + 1);
  check_tree(g, TL->nint, slot_of(TL, "word"));
  /* a = 0; level k (from the bottom) is the inner vertex 2k with children 2k-2 and b = 2k-1 */
  expect_children(g, 0, -1, -1);
  for (int k = 1; k <= DEEP; k++) expect_children(g, 2 * k, 2 * k - 2, 2 * k - 1);
  ck_assert_int_eq(g->feat[(g->n - 1) * TL->nint + slot_of(TL, "label")], 1);
  cavs_dataset_free(s);
  cavs_vocab_free(v);
}
END_TEST

START_TEST(ptb_deep_right) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TL, dims);
  size_t cap = (size_t)DEEP * 12 + 64, n = 0;
  char *buf = malloc(cap);
  for (int i = 0; i < DEEP; i++) n += (size_t)sprintf(buf + n, "(1 (3 b) ");
  n += (size_t)sprintf(buf + n, "(2 a)");
  for (int i = 0; i < DEEP; i++) buf[n++] = ')';
  buf[n++] = '\n';
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("deep-right.txt", buf, n, "ptb-tree", TL, dims, v, 1);
  free(buf);
  const cavs_graph *g = cavs_dataset_graph(s, 0);
  ck_assert_int_eq(g->n, 2 * DEEP + 1);
  check_tree(g, TL->nint, slot_of(TL, "word"));
  /* the b leaves are 0..DEEP-1, a is DEEP, then the inner vertices from the bottom up */
  expect_children(g, DEEP + 1, DEEP - 1, DEEP);
  for (int k = 2; k <= DEEP; k++) expect_children(g, DEEP + k, DEEP - k, DEEP + k - 1);
  cavs_dataset_free(s);
  cavs_vocab_free(v);
}
END_TEST

typedef struct Bad {
  const char *name, *text;
  size_t len;
  long line; /* 0: the message names no line */
  const char *sub;
} Bad;

static const Bad ptb_bad[] = {
    {"missing-paren", S("(3 (2 a) (4 b))\n(3 (2 a) (4 b)\n"), 2, "missing ')'"},
    {"extra-paren", S("(3 (2 a) (4 b))\n(3 (2 a) (4 b)))\n"), 2, "text after the end of the tree at column 16"},
    {"close-first", S("(2 a)\n)\n"), 2, "unbalanced ')' at column 1"},
    {"label-range", S("(2 a)\n(2 b)\n(3 (7 c) (1 d))\n"), 3, "label 7"},
    {"label-range-crlf", S("(2 a)\r\n(2 (1 b) (5 c))\r\n"), 2, "out of range (0..4, or -1 for none)"},
    {"label-negative", S("(2 a)\n(-2 b)\n"), 2, "out of range"},
    {"label-word", S("(2 a)\n(x a)\n"), 2, "expected a label"},
    {"label-suffix", S("(2 a)\n(2x a)\n"), 2, "expected a label"},
    {"label-real", S("(2 a)\n(2 (1.5 a) (1 b))\n"), 2, "expected a label"},
    {"label-missing", S("(2 a)\n(2 () (1 b))\n"), 2, "expected a label"},
    {"empty-line", S("(2 a)\n\n(2 b)\n"), 2, "empty line"},
    {"blank-line", S("(2 a)\n(2 b)\n   \n(2 c)\n"), 3, "empty line"},
    {"empty-line-crlf", S("(2 a)\r\n\r\n(2 b)\r\n"), 2, "empty line"},
    {"invalid-utf8", S("(2 a)\n(2 b\xff)\n"), 2, "invalid UTF-8"},
    {"truncated-utf8", S("(2 a)\n(2 (1 b) (1 c\xc3))\n"), 2, "invalid UTF-8"},
    {"nul-byte", S("(2 a)\n(2 a\0b)\n"), 2, "NUL byte"},
    {"three-children", S("(2 a)\n(2 (1 a) (1 b) (1 c))\n"), 2, "3 children"},
    {"word-and-children", S("(2 a)\n(2 a (1 b))\n"), 2, "both a word and children"},
    {"children-then-word", S("(2 a)\n(2 (1 b) a)\n"), 2, "token after children"},
    {"two-words", S("(2 a b)\n"), 1, "a second token"},
    {"empty-node", S("(2 a)\n(2 (1 a) (1))\n"), 2, "empty node"},
    {"no-paren", S("(2 a)\nhello\n"), 2, "expected '('"},
    {"two-trees", S("(2 a) (2 b)\n"), 1, "text after the end of the tree"},
    {"empty-file", S(""), 0, "no graphs"},
};

START_TEST(ptb_errors) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TL, dims);
  const Bad *b = &ptb_bad[_i];
  char name[80];
  snprintf(name, sizeof name, "%s.txt", b->name);
  expect_error(name, b->text, b->len, "ptb-tree", TL, dims, b->line, b->sub);
}
END_TEST

/* Encodings that are not UTF-8 although their bytes have the right shape: an overlong
 * form, a UTF-16 surrogate, a code point above U+10FFFF (RFC 3629). */
static const Bad utf8_bad[] = {
    {"overlong", S("(2 a)\n(2 \xe0\x80\xaf)\n"), 2, "invalid UTF-8"},
    {"surrogate", S("(2 a)\n(2 \xed\xa0\x80)\n"), 2, "invalid UTF-8"},
    {"above-max", S("(2 a)\n(2 \xf4\x90\x80\x80)\n"), 2, "invalid UTF-8"},
};

START_TEST(ptb_utf8_strict) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TL, dims);
  const Bad *b = &utf8_bad[_i];
  char name[80];
  snprintf(name, sizeof name, "%s.txt", b->name);
  expect_error(name, b->text, b->len, "ptb-tree", TL, dims, b->line, b->sub);
}
END_TEST

/* The column in a label message is where the label starts (1-based, as elsewhere). */
START_TEST(ptb_label_column) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TL, dims);
  expect_error("label-col.txt", S("(7 a)\n"), "ptb-tree", TL, dims, 1, "label 7 at column 2 ");
}
END_TEST

/* Without dims (or when the class range is the vocabulary) a label is still below the
 * most a dim can be (2^24), so that the dim made from the data is one: 99999999999 was
 * cut to -1943132161 in the graph, and 4294967296 to 0 (found by tests/fuzz), and
 * 2147483647 overflowed the largest id plus one; a label past a long is named as
 * written, not as strtol clamps it (10^20 was 9223372036854775807). A UTF-8 byte-order
 * mark before the first tree is not part of it. */
START_TEST(ptb_label_int_range) {
  expect_error("big-label.txt", S("(2 a)\n(99999999999 (1 b))\n"), "ptb-tree", TL, NULL, 2,
               "label 99999999999 at column 2 is out of range (0..16777215, or -1 for none)");
  expect_error("huge-label.txt", S("(100000000000000000000 a)\n"), "ptb-tree", TL, NULL, 1,
               "label 100000000000000000000 at column 2 is out of range (0..16777215, or -1 for none)");
  expect_error("neg-label.txt", S("(-2 a)\n"), "ptb-tree", TL, NULL, 1,
               "label -2 at column 2 is out of range (0..16777215, or -1 for none)");
  expect_error("int-label.txt", S("(2147483647 a)\n"), "ptb-tree", TL, NULL, 1,
               "label 2147483647 at column 2 is out of range (0..16777215, or -1 for none)");
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("max-label.txt", S("(16777215 a)\n"), "ptb-tree", TL, NULL, v, 1);
  ck_assert_int_eq(cavs_dataset_graph(s, 0)->feat[slot_of(TL, "label")], 16777215);
  cavs_dataset_free(s);
  s = load_ok("bom.txt", S("\xef\xbb\xbf(1 (2 a) (3 b))\n(4 c)\n"), "ptb-tree", TL, NULL, v, 1);
  ck_assert_int_eq(cavs_dataset_count(s), 2);
  ck_assert_int_eq(cavs_dataset_graph(s, 0)->n, 3);
  cavs_dataset_free(s);
  /* only at the start of the file */
  expect_error("bom2.txt", S("(1 a)\n\xef\xbb\xbf(4 c)\n"), "ptb-tree", TL, NULL, 2, "expected '('");
  cavs_vocab_free(v);
}
END_TEST

/* Every inner node gets the first block with children; when that block takes fewer
 * children than another block of the model, a node with more is an error of the file
 * (found by tests/fuzz: the loader took it, and training failed later on the scheduler's
 * check that a child slot exists in the vertex's block). */
START_TEST(ptb_inner_block_children) {
  const cavs_desc *d = model(
      "model pc; dim H = 2; dim C = 3; dim V = vocab(w); input w : index[V]; input y : class[C];\n"
      "param emb[V,H], U[2H,H], Wc[H,C];\n"
      "pull { x = emb[w]; }\n"
      "vertex one (children 1) { h = tanh(pull() + gather(0)); scatter(h); push(h); }\n"
      "vertex two (children 2) { h = tanh(concat(gather(0), gather(1)) @ U); scatter(h); push(h); }\n"
      "push (h) { loss softmax_xent(h @ Wc, y); }\n");
  long dims[CAVS_MAX_DIMS];
  dims_of(d, dims);
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("one-child.txt", S("(1 (2 (0 a)))\n"), "ptb-tree", d, dims, v, 1);
  ck_assert_int_eq(cavs_dataset_vertices(s), 3);
  cavs_dataset_free(s);
  cavs_vocab_free(v);
  expect_error("two-children.txt", S("(1 (2 a))\n(1 (2 a) (0 b))\n"), "ptb-tree", d, dims, 2,
               "a node with 2 children at column 15, but block 'one', which inner nodes get, takes 1");
}
END_TEST

/* A block that takes its children as a set takes up to CAVS_MAX_SET of them from a
 * ptb-tree file (and cgf, after its named slots); one more is an error. */
START_TEST(set_children_limit) {
  const cavs_desc *t = model(
      "model st; dim H = 2; dim C = 3; dim V = vocab(w); input w : index[V]; input y : class[C];\n"
      "param emb[V,H], Wc[H,C];\n"
      "pull { x = emb[w]; }\n"
      "vertex node (children *) { h = tanh(pull() + sum(s in children: s)); scatter(h); push(h); }\n"
      "push (h) { loss softmax_xent(h @ Wc, y); }\n");
  long dims[CAVS_MAX_DIMS];
  dims_of(t, dims);
  char text[8192];
  size_t len = (size_t)snprintf(text, sizeof text, "(1");
  for (int k = 0; k < CAVS_MAX_SET; k++) len += (size_t)snprintf(text + len, sizeof text - len, " (2 w%d)", k);
  len += (size_t)snprintf(text + len, sizeof text - len, ")\n");
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("wide.txt", text, len, "ptb-tree", t, dims, v, 1);
  ck_assert_int_eq(cavs_dataset_vertices(s), CAVS_MAX_SET + 1);
  cavs_dataset_free(s);
  cavs_vocab_free(v);
  len -= 2; /* one more */
  len += (size_t)snprintf(text + len, sizeof text - len, " (2 w0))\n");
  char want[128];
  snprintf(want, sizeof want, "a node with %d children", CAVS_MAX_SET + 1);
  expect_error("wider.txt", text, len, "ptb-tree", t, dims, 1, want);
}
END_TEST

/* cavs_dataset_parse: the same graphs from a string as from a file of its bytes;
 * messages name the string; no bytes, no graphs. */
START_TEST(parse_from_string) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TL, dims);
  const char text[] = "(3 (2 good) (1 (0 not) (2 bad)))\n(1 (2 a) (3 film))\n";
  cavs_vocab *va = cavs_vocab_new(), *vb = cavs_vocab_new();
  cavs_dataset *a = load_ok("trees.txt", S(text), "ptb-tree", TL, dims, va, 1);
  char err[512] = "";
  cavs_dataset *b = cavs_dataset_parse(text, sizeof text - 1, "mine", "ptb-tree", TL, dims, vb, 1, err, sizeof err);
  ck_assert_msg(b != NULL, "%s", err);
  ck_assert_int_eq(cavs_dataset_count(a), cavs_dataset_count(b));
  for (int i = 0; i < cavs_dataset_count(a); i++) {
    const cavs_graph *x = cavs_dataset_graph(a, i), *y = cavs_dataset_graph(b, i);
    ck_assert_int_eq(x->n, y->n);
    ck_assert(!memcmp(x->child, y->child, sizeof(int) * (size_t)x->n * (size_t)x->maxc));
    ck_assert(!memcmp(x->feat, y->feat, sizeof(int) * (size_t)x->n * (size_t)TL->nint));
  }
  cavs_dataset_free(a);
  cavs_dataset_free(b);
  ck_assert_ptr_null(cavs_dataset_parse("(3 (2 good)\n", 12, "mine", "ptb-tree", TL, dims, vb, 1, err, sizeof err));
  ck_assert_msg(!strncmp(err, "mine:1:", 7), "%s", err);
  ck_assert_ptr_null(cavs_dataset_parse("", 0, NULL, "ptb-tree", TL, dims, vb, 1, err, sizeof err));
  ck_assert_msg(strstr(err, "<string>") && strstr(err, "no graphs"), "%s", err);
  cavs_vocab_free(va);
  cavs_vocab_free(vb);
}
END_TEST

/* ================= text ================= */

START_TEST(text_chain) {
  long dims[CAVS_MAX_DIMS];
  dims_of(LM, dims);
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("chain.txt", S("a b c\n"), "text", LM, dims, v, 1);
  int W = slot_of(LM, "word"), L = slot_of(LM, "next"), nint = LM->nint;
  ck_assert_int_eq(cavs_dataset_count(s), 1);
  const cavs_graph *g = cavs_dataset_graph(s, 0);
  ck_assert_int_eq(g->n, 3);
  ck_assert_int_eq(g->maxc, 1);
  int want_word[3] = {2, 3, 4}, want_next[3] = {3, 4, 1};
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(g->child[i], i - 1);
    ck_assert_int_eq(g->feat[i * nint + W], want_word[i]);
    ck_assert_int_eq(g->feat[i * nint + L], want_next[i]);
    ck_assert_int_eq(g->type ? g->type[i] : 0, 0);
  }
  expect_word(v, 2, "a");
  expect_word(v, 3, "b");
  expect_word(v, 4, "c");
  expect_word(v, 1, "<eos>");
  cavs_dataset_free(s);
  cavs_vocab_free(v);
}
END_TEST

/* text-bptt: the file as one stream, <eos> after each line, in chains of 35 tokens (N
 * with text-bptt:N), each labeled with the next token of the stream across lines and
 * chains, the last token unlabeled. 40 lines of "t<i> x" are 120 tokens: chains of 35,
 * 35, 35 and 15; of 50, 50 and 20; of 120; of one each. */
static void bptt_stream(const char *format, int chunk) {
  long dims[CAVS_MAX_DIMS];
  dims_of(LM, dims);
  cavs_vocab *v = cavs_vocab_new();
  char buf[1024];
  size_t n = 0;
  for (int i = 0; i < 40; i++) n += (size_t)snprintf(buf + n, sizeof buf - n, "t%d x\n", i % 7);
  cavs_dataset *s = load_ok("stream.txt", buf, n, format, LM, dims, v, 1);
  int W = slot_of(LM, "word"), L = slot_of(LM, "next"), nint = LM->nint;
  int chains = (120 + chunk - 1) / chunk;
  ck_assert_int_eq(cavs_dataset_count(s), chains);
  /* the stream, as the vocabulary numbers it */
  int tok[120], k = 0;
  for (int i = 0; i < 40; i++) {
    char w[8];
    snprintf(w, sizeof w, "t%d", i % 7);
    tok[k++] = cavs_vocab_id(v, w, strlen(w), 0);
    tok[k++] = cavs_vocab_id(v, "x", 1, 0);
    tok[k++] = 1; /* <eos> */
  }
  k = 0;
  for (int gi = 0; gi < chains; gi++) {
    const cavs_graph *g = cavs_dataset_graph(s, gi);
    ck_assert_int_eq(g->n, gi < chains - 1 ? chunk : 120 - chunk * (chains - 1));
    for (int i = 0; i < g->n; i++, k++) {
      ck_assert_int_eq(g->child[i], i - 1);
      ck_assert_int_eq(g->feat[i * nint + W], tok[k]);
      ck_assert_int_eq(g->feat[i * nint + L], k + 1 < 120 ? tok[k + 1] : -1);
    }
  }
  ck_assert_int_eq(k, 120);
  cavs_dataset_free(s);
  cavs_vocab_free(v);
}
START_TEST(text_bptt_stream) {
  bptt_stream("text-bptt", 35);
  bptt_stream("text-bptt:50", 50);
  bptt_stream("text-bptt:120", 120);
  bptt_stream("text-bptt:1", 1);
  bptt_stream("text-bptt:035", 35);
}
END_TEST

/* Several lines, runs of spaces and tabs, CRLF: one chain a line, the same either way. */
START_TEST(text_lines) {
  long dims[CAVS_MAX_DIMS];
  dims_of(LM, dims);
  cavs_vocab *va = cavs_vocab_new(), *vb = cavs_vocab_new();
  cavs_dataset *a = load_ok("lines.txt", S("a b c\nb a\nc\n"), "text", LM, dims, va, 1);
  cavs_dataset *b = load_ok("lines-crlf.txt", S("  a \t b   c \r\nb\ta\r\nc"), "text", LM, dims, vb, 1);
  ck_assert_int_eq(cavs_dataset_count(a), 3);
  ck_assert_int_eq(cavs_dataset_vertices(a), 6);
  const cavs_graph *g = cavs_dataset_graph(a, 1);
  int W = slot_of(LM, "word"), L = slot_of(LM, "next"), nint = LM->nint;
  ck_assert_int_eq(g->n, 2);
  ck_assert_int_eq(g->feat[0 * nint + W], 3);
  ck_assert_int_eq(g->feat[0 * nint + L], 2);
  ck_assert_int_eq(g->feat[1 * nint + L], 1);
  g = cavs_dataset_graph(a, 2);
  ck_assert_int_eq(g->n, 1);
  ck_assert_int_eq(g->child[0], -1);
  ck_assert_int_eq(g->feat[W], 4);
  ck_assert_int_eq(g->feat[L], 1);
  expect_same(a, va, b, vb, nint, W);
  cavs_dataset_free(a);
  cavs_dataset_free(b);
  cavs_vocab_free(va);
  cavs_vocab_free(vb);
}
END_TEST

START_TEST(text_no_grow) {
  long dims[CAVS_MAX_DIMS];
  dims_of(LM, dims);
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *tr = load_ok("lm-train.txt", S("a b\n"), "text", LM, dims, v, 1);
  cavs_dataset *te = load_ok("lm-test.txt", S("b zzz a\n"), "text", LM, dims, v, 0);
  ck_assert_int_eq(cavs_vocab_size(v), 4);
  const cavs_graph *g = cavs_dataset_graph(te, 0);
  int W = slot_of(LM, "word"), L = slot_of(LM, "next"), nint = LM->nint;
  int want_word[3] = {3, 0, 2}, want_next[3] = {0, 2, 1};
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(g->feat[i * nint + W], want_word[i]);
    ck_assert_int_eq(g->feat[i * nint + L], want_next[i]);
  }
  cavs_dataset_free(tr);
  cavs_dataset_free(te);
  cavs_vocab_free(v);
}
END_TEST

/* One line of a million tokens: a chain of a million vertices, in a few seconds. */
START_TEST(text_long_line) {
  enum { N = 1000000 };
  long dims[CAVS_MAX_DIMS];
  dims_of(LM, dims);
  char *buf = malloc((size_t)N * 8 + 16);
  size_t n = 0;
  for (int i = 0; i < N; i++) n += (size_t)sprintf(buf + n, i ? " w%d" : "w%d", i % 1000);
  buf[n++] = '\n';
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("long.txt", buf, n, "text", LM, dims, v, 1);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  free(buf);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  ck_assert_msg(secs < 5, "a million tokens took %.2f s", secs);
  ck_assert_int_eq(cavs_dataset_count(s), 1);
  ck_assert_int_eq(cavs_dataset_vertices(s), N);
  ck_assert_int_eq(cavs_vocab_size(v), 1002);
  const cavs_graph *g = cavs_dataset_graph(s, 0);
  ck_assert_int_eq(g->n, N);
  int W = slot_of(LM, "word"), L = slot_of(LM, "next"), nint = LM->nint;
  for (int i = 0; i < N; i++) {
    if (g->child[i] != i - 1) ck_abort_msg("vertex %d: child %d", i, g->child[i]);
    if (g->feat[i * nint + W] != 2 + i % 1000) ck_abort_msg("vertex %d: word %d", i, g->feat[i * nint + W]);
    int next = i + 1 < N ? g->feat[(i + 1) * nint + W] : 1;
    if (g->feat[i * nint + L] != next) ck_abort_msg("vertex %d: label %d, expected %d", i, g->feat[i * nint + L], next);
  }
  cavs_dataset_free(s);
  cavs_vocab_free(v);
}
END_TEST

static const Bad text_bad[] = {
    {"text-empty-line", S("a b\n\nc\n"), 2, "empty line"},
    {"text-blank-line", S("a b\nc\n \t \n"), 3, "empty line"},
    {"text-empty-line-crlf", S("a b\r\nc\r\n\r\nd\r\n"), 3, "empty line"},
    {"text-invalid-utf8", S("a b\nc \xfe d\n"), 2, "invalid UTF-8"},
    {"text-nul", S("a b\nc\0d\n"), 2, "NUL byte"},
    {"text-empty-file", S(""), 0, "no graphs"},
};

START_TEST(text_errors) {
  long dims[CAVS_MAX_DIMS];
  dims_of(LM, dims);
  const Bad *b = &text_bad[_i];
  char name[80];
  snprintf(name, sizeof name, "%s.txt", b->name);
  expect_error(name, b->text, b->len, "text", LM, dims, b->line, b->sub);
}
END_TEST

/* ================= cgf ================= */

static const char cgf_good[] = "# three graphs\r\n"
                               "graph\r\n"
                               "0 leaf ; word=5 label=2\r\n"
                               "1 leaf ; word=6\r\n"
                               "2 internal 0 1 ; label=4   # the root\r\n"
                               "end\r\n"
                               "\r\n"
                               "graph   # a DAG: vertex 0 has two parents\n"
                               "0\tleaf ; label=0 word=7\n"
                               "1 internal - 0\n"
                               "2 internal 0 1 ;\n"
                               "end\n"
                               "# children may come after their parent\n"
                               "graph\n"
                               "  0 internal 2 1 ; label=-1 word=-1\n"
                               "1 leaf ; word=99\n"
                               "2 leaf\n"
                               "end";

START_TEST(cgf_good_file) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TT, dims);
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("good.cgf", S(cgf_good), "cgf", TT, dims, v, 1);
  ck_assert_int_eq(cavs_vocab_size(v), 2); /* cgf features are ids, not words */
  int W = slot_of(TT, "word"), L = slot_of(TT, "label"), nint = TT->nint;
  int lf = type_of(TT, "leaf"), in = type_of(TT, "internal");
  ck_assert_int_ne(lf, in);
  ck_assert_int_eq(cavs_dataset_count(s), 3);
  ck_assert_int_eq(cavs_dataset_vertices(s), 9);
  static const struct {
    int child[3][2];
    int leaf[3], word[3], label[3];
  } want[3] = {
      {{{-1, -1}, {-1, -1}, {0, 1}}, {1, 1, 0}, {5, 6, -1}, {2, -1, 4}},
      {{{-1, -1}, {-1, 0}, {0, 1}}, {1, 0, 0}, {7, -1, -1}, {0, -1, -1}},
      {{{2, 1}, {-1, -1}, {-1, -1}}, {0, 1, 1}, {-1, 99, -1}, {-1, -1, -1}},
  };
  for (int i = 0; i < 3; i++) {
    const cavs_graph *g = cavs_dataset_graph(s, i);
    ck_assert_int_eq(g->n, 3);
    ck_assert_ptr_nonnull(g->type);
    for (int x = 0; x < 3; x++) {
      expect_children(g, x, want[i].child[x][0], want[i].child[x][1]);
      ck_assert_int_eq(g->type[x], want[i].leaf[x] ? lf : in);
      ck_assert_int_eq(g->feat[x * nint + W], want[i].word[x]);
      ck_assert_int_eq(g->feat[x * nint + L], want[i].label[x]);
    }
  }
  ck_assert_int_eq(cavs_dataset_max_feature(s, W), 99);
  ck_assert_int_eq(cavs_dataset_max_feature(s, L), 4);
  cavs_dataset_free(s);
  cavs_vocab_free(v);
}
END_TEST

/* A file streamed (cavs_stream) reads back, in any order asked, what loading it whole
 * gives, graph for graph and vertex for vertex: SST-like trees with a BOM and a CRLF,
 * text, and cgf with a comment and reals, the last line without its line break; the
 * vocabulary grows as a load's does, and the largest features are the load's. A graph
 * whose bytes changed after the index is refused, naming the file; text-bptt cannot be
 * streamed. */
static void same_graph(const cavs_graph *a, const cavs_graph *b, int nint, long realw) {
  ck_assert_int_eq(a->n, b->n);
  ck_assert_int_eq(a->maxc, b->maxc);
  for (int x = 0; x < a->n; x++) {
    for (int k = 0; k < a->maxc; k++) ck_assert_int_eq(a->child[x * a->maxc + k], b->child[x * b->maxc + k]);
    ck_assert_int_eq(a->type ? a->type[x] : 0, b->type ? b->type[x] : 0);
    for (int k = 0; k < nint; k++) ck_assert_int_eq(a->feat[x * nint + k], b->feat[x * nint + k]);
    for (long k = 0; k < realw; k++) ck_assert(a->real[x * realw + k] == b->real[x * realw + k]);
  }
}

static void stream_matches(const char *name, const char *data, size_t len, const char *format, const cavs_desc *d,
                           long realw) {
  long dims[CAVS_MAX_DIMS];
  dims_of(d, dims);
  char err[1024], path[256];
  cavs_vocab *v1 = cavs_vocab_new(), *v2 = cavs_vocab_new();
  cavs_dataset *whole = load_ok(name, data, len, format, d, dims, v1, 1);
  file_path(path, sizeof path, name);
  cavs_stream *st = cavs_stream_open(path, format, d, dims, v2, 1, err, sizeof err);
  ck_assert_msg(st != NULL, "%s: %s", name, err);
  int n = cavs_dataset_count(whole);
  ck_assert_int_eq(cavs_stream_count(st), n);
  ck_assert_int_eq(cavs_stream_vertices(st), cavs_dataset_vertices(whole));
  ck_assert_int_eq(cavs_vocab_size(v2), cavs_vocab_size(v1));
  for (int k = 0; k < d->nint; k++) ck_assert_int_eq(cavs_stream_max_feature(st, k), cavs_dataset_max_feature(whole, k));
  int *which = malloc(sizeof(int) * (size_t)n);
  for (int j = 0; j < n; j++) which[j] = (j * 7 + 3) % n; /* (a permutation when 7 and n are coprime) */
  cavs_dataset *part = cavs_stream_read(st, which, n, err, sizeof err);
  ck_assert_msg(part != NULL, "%s: %s", name, err);
  for (int j = 0; j < n; j++) {
    ck_assert_int_eq(cavs_stream_graph_vertices(st, which[j]), cavs_dataset_graph(whole, which[j])->n);
    same_graph(cavs_dataset_graph(part, j), cavs_dataset_graph(whole, which[j]), d->nint, realw);
  }
  cavs_dataset_free(part);
  /* its index carried to a stream of its own (another rank's): the same graphs, and
     the file not read through to open it */
  size_t ni = cavs_stream_index(st, NULL, 0);
  char *idx = malloc(ni), *bad = malloc(ni);
  ck_assert_uint_eq(cavs_stream_index(st, idx, ni), ni);
  cavs_vocab *v3 = cavs_vocab_new();
  for (int i = 0; i < cavs_vocab_size(v2); i++)
    ck_assert_int_eq(cavs_vocab_id(v3, cavs_vocab_word(v2, i), strlen(cavs_vocab_word(v2, i)), 1), i);
  cavs_stream *sti = cavs_stream_open_index(path, format, d, dims, v3, idx, ni, err, sizeof err);
  ck_assert_msg(sti != NULL, "%s: %s", name, err);
  ck_assert_int_eq(cavs_stream_count(sti), n);
  ck_assert_int_eq(cavs_stream_vertices(sti), cavs_dataset_vertices(whole));
  for (int k = 0; k < d->nint; k++) ck_assert_int_eq(cavs_stream_max_feature(sti, k), cavs_dataset_max_feature(whole, k));
  part = cavs_stream_read(sti, which, n, err, sizeof err);
  ck_assert_msg(part != NULL, "%s: %s", name, err);
  for (int j = 0; j < n; j++) {
    ck_assert_int_eq(cavs_stream_graph_vertices(sti, which[j]), cavs_dataset_graph(whole, which[j])->n);
    same_graph(cavs_dataset_graph(part, j), cavs_dataset_graph(whole, which[j]), d->nint, realw);
  }
  cavs_dataset_free(part);
  cavs_stream_close(sti);
  /* indexes that do not fit: short, not one, a graph past the file's end, another file */
  ck_assert_ptr_null(cavs_stream_open_index(path, format, d, dims, v3, idx, ni - 1, err, sizeof err));
  ck_assert_msg(strstr(err, "do not add up"), "%s", err);
  memcpy(bad, idx, ni);
  bad[0] = 'X';
  ck_assert_ptr_null(cavs_stream_open_index(path, format, d, dims, v3, bad, ni, err, sizeof err));
  ck_assert_msg(strstr(err, "not a stream's index"), "%s", err);
  memcpy(bad, idx, ni);
  memset(bad + ni - 20, 0x7f, 8); /* the last graph's offset */
  ck_assert_ptr_null(cavs_stream_open_index(path, format, d, dims, v3, bad, ni, err, sizeof err));
  ck_assert_msg(strstr(err, "outside the file"), "%s", err);
  if (d->nint) { /* a slot's largest value, which sizes a vocabulary */
    memcpy(bad, idx, ni);
    memset(bad + 28, 0x7f, 4);
    ck_assert_ptr_null(cavs_stream_open_index(path, format, d, dims, v3, bad, ni, err, sizeof err));
    ck_assert_msg(strstr(err, "largest value") && strstr(err, "outside -1.."), "%s", err);
  }
  ck_assert_ptr_null(cavs_stream_open_index(path, "text-bptt", d, dims, v3, idx, ni, err, sizeof err));
  ck_assert_msg(strstr(err, "cannot be streamed"), "%s", err);
  char *longer = malloc(len + 1);
  memcpy(longer, data, len);
  longer[len] = '\n';
  tu_write(path, longer, len + 1);
  ck_assert_ptr_null(cavs_stream_open_index(path, format, d, dims, v3, idx, ni, err, sizeof err));
  ck_assert_msg(strstr(err, "not the file that was indexed"), "%s", err);
  free(longer);
  /* the last graph's bytes made NULs: a stream that reads the file through refuses it,
     one opened from the index reads the other graphs and refuses that one when read */
  char *nul = malloc(len);
  memcpy(nul, data, len);
  size_t z = len - 2;
  while (z > 0 && nul[z - 1] != '\n') z--;
  memset(nul + z, 0, len - 1 - z);
  tu_write(path, nul, len);
  cavs_vocab *v4 = cavs_vocab_new();
  ck_assert_ptr_null(cavs_stream_open(path, format, d, dims, v4, 1, err, sizeof err));
  ck_assert_msg(strstr(err, "NUL"), "%s", err);
  cavs_vocab_free(v4);
  sti = cavs_stream_open_index(path, format, d, dims, v3, idx, ni, err, sizeof err);
  ck_assert_msg(sti != NULL, "%s: %s", name, err);
  int first = 0, last_g = n - 1;
  part = cavs_stream_read(sti, &first, 1, err, sizeof err);
  ck_assert_msg(part != NULL, "%s: %s", name, err);
  same_graph(cavs_dataset_graph(part, 0), cavs_dataset_graph(whole, 0), d->nint, realw);
  cavs_dataset_free(part);
  ck_assert_ptr_null(cavs_stream_read(sti, &last_g, 1, err, sizeof err));
  ck_assert_msg(strstr(err, "changed since it was read first"), "%s", err);
  cavs_stream_close(sti);
  free(nul), free(idx), free(bad);
  cavs_vocab_free(v3);
  tu_write(path, data, len);
  free(which);
  /* one byte of the last graph changed (the same length): that graph is refused */
  char *changed = malloc(len);
  memcpy(changed, data, len);
  size_t at = len - 1;
  while (changed[at] == '\n' || changed[at] == ')' || changed[at] == '\r') at--;
  changed[at] = changed[at] == '7' ? '8' : '7';
  tu_write(path, changed, len);
  int last = n - 1;
  ck_assert_ptr_null(cavs_stream_read(st, &last, 1, err, sizeof err));
  ck_assert_msg(strstr(err, path) && strstr(err, "changed since it was read first"), "%s", err);
  free(changed);
  cavs_stream_close(st);
  cavs_dataset_free(whole);
  cavs_vocab_free(v1);
  cavs_vocab_free(v2);
}

START_TEST(stream_reads_back_what_a_load_reads) {
  static const char ptb[] = "\xEF\xBB\xBF(3 (2 a) (4 (2 b) (3 c)))\n(1 (0 d) (2 e))\r\n(2 f)\n(4 (2 a) (1 (3 g) (2 h)))\n"
                            "(0 (1 b) (2 i))\n(3 j)\n(2 (2 k) (2 a))\n";
  stream_matches("s.txt", ptb, sizeof ptb - 1, "ptb-tree", TL, 0);
  static const char text[] = "the cat sat\nthe dog\na b c d e\nsat on the mat\nx\n";
  stream_matches("s.lm", text, sizeof text - 1, "text", LM, 0);
  stream_matches("s.cgf", S(cgf_good), "cgf", TT, 0);
  long dims[CAVS_MAX_DIMS];
  dims_of(LM, dims);
  char err[1024], path[256];
  file_path(path, sizeof path, "s.lm");
  tu_write(path, text, sizeof text - 1);
  cavs_vocab *v = cavs_vocab_new();
  ck_assert_ptr_null(cavs_stream_open(path, "text-bptt", LM, dims, v, 1, err, sizeof err));
  ck_assert_msg(strstr(err, "cannot be streamed"), "%s", err);
  cavs_vocab_free(v);
}
END_TEST

static const Bad cgf_bad[] = {
    {"cycle", S("# c\ngraph\n0 leaf\n1 internal 0 2\n2 internal 1 -\nend\n"), 4, "cycle through vertex 1"},
    {"self-loop", S("graph\n0 leaf\nend\ngraph\n0 leaf\n1 internal 1 0\nend\n"), 6, "cycle through vertex 1"},
    {"child-range", S("graph\n0 leaf\n1 internal 0 5\n2 internal 0 1\nend\n"), 3, "child 5 is not in this graph"},
    {"child-negative", S("graph\n0 leaf\n1 internal 0 -1\nend\n"), 3, "'-1' is not a vertex number"},
    {"child-word", S("graph\n0 leaf\n1 internal 0 x\nend\n"), 3, "'x' is not a vertex number"},
    {"unknown-type", S("graph\n0 leaf\n1 branch 0 0\nend\n"), 3, "unknown vertex type 'branch'"},
    {"no-type", S("graph\n0\nend\n"), 2, "vertex 0 has no type"},
    {"leaf-child", S("graph\n0 leaf\n1 leaf 0\nend\n"), 3, "more than 0 children for type 'leaf'"},
    {"three-children", S("graph\n0 leaf\n1 internal 0 0 0\nend\n"), 3, "more than 2 children for type 'internal'"},
    {"id-skipped", S("graph\n0 leaf\n2 leaf\nend\n"), 3, "expected vertex 1, found '2'"},
    {"id-first", S("graph\n1 leaf\nend\n"), 2, "expected vertex 0, found '1'"},
    {"id-word", S("graph\nzero leaf\nend\n"), 2, "expected vertex 0, found 'zero'"},
    {"unknown-input", S("graph\n0 leaf ; word=1 colour=3\nend\n"), 2, "has no input 'colour'"},
    {"not-name-value", S("graph\n0 leaf ; word\nend\n"), 2, "expected NAME=VALUE, found 'word'"},
    {"missing-end", S("# m\ngraph\n0 leaf\n"), 2, "has no 'end'"},
    {"graph-in-graph", S("graph\n0 leaf\nend\ngraph\n0 leaf\ngraph\n0 leaf\nend\n"), 6, "'graph' inside a graph"},
    {"end-alone", S("graph\n0 leaf\nend\nend\n"), 4, "'end' without 'graph'"},
    {"vertex-outside", S("# v\n0 leaf\n"), 2, "expected 'graph', found '0'"},
    {"empty-graph", S("graph\n0 leaf\nend\ngraph # none\nend\n"), 4, "empty graph"},
    {"feature-word", S("graph\n0 leaf ; word=abc\nend\n"), 2, "word=abc is not an integer"},
    {"feature-empty", S("graph\n0 leaf ; word=\nend\n"), 2, "is not an integer"},
    {"feature-suffix", S("graph\n0 leaf ; word=3x\nend\n"), 2, "word=3x is not an integer"},
    {"feature-real", S("graph\n0 leaf ; label=1.5\nend\n"), 2, "label=1.5 is not an integer"},
    {"word-range", S("graph\n0 leaf ; word=99\n1 leaf ; word=100\nend\n"), 3, "word=100 is outside -1..99"},
    {"label-range", S("graph\n0 leaf ; label=5\nend\n"), 2, "label=5 is outside -1..4"},
    {"word-negative", S("graph\n0 leaf ; word=-2\nend\n"), 2, "word=-2 is outside -1..99"},
    {"cgf-invalid-utf8", S("graph\n0 leaf # caf\xe9\nend\n"), 2, "invalid UTF-8"},
    {"cgf-nul", S("graph\n0 leaf\0\nend\n"), 2, "NUL byte"},
    {"cgf-crlf-line", S("graph\r\n0 leaf\r\n1 internal 0 7\r\nend\r\n"), 3, "child 7 is not in this graph"},
    {"cgf-comments-only", S("# nothing\n\n   # here\n"), 0, "no graphs"},
    {"cgf-empty-file", S(""), 0, "no graphs"},
};

START_TEST(cgf_errors) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TT, dims);
  const Bad *b = &cgf_bad[_i];
  char name[80];
  snprintf(name, sizeof name, "%s.cgf", b->name);
  expect_error(name, b->text, b->len, "cgf", TT, dims, b->line, b->sub);
}
END_TEST

/* The same for cgf features without dims. */
START_TEST(cgf_feature_int_range) {
  expect_error("big-word.cgf", S("graph\n0 leaf ; word=4294967296\nend\n"), "cgf", TT, NULL, 2,
               "word=4294967296 is outside -1..16777215");
  /* the largest int: its vocabulary (the largest id plus one) overflowed */
  expect_error("int-word.cgf", S("graph\n0 leaf ; word=2147483647\nend\n"), "cgf", TT, NULL, 2,
               "word=2147483647 is outside -1..16777215");
  expect_error("long-word.cgf", S("graph\n0 leaf ; word=100000000000000000000\nend\n"), "cgf", TT, NULL, 2,
               "word=100000000000000000000 is outside -1..16777215");
  expect_error("neg-label.cgf", S("graph\n0 leaf ; label=-2\nend\n"), "cgf", TT, NULL, 2,
               "label=-2 is outside -1..16777215");
}
END_TEST

/* A real feature is read as a double and kept as a float: one beyond FLT_MAX is an
 * error, not an infinity in the graph (found by tests/fuzz). */
/* a model with a real input of two values a vertex */
static const char real_vf[] = "model rf; dim H = 2; input f : real[H]; param U[H,H];\n"
                              "vertex v (children 1) { h = tanh(f + gather(0) @ U); scatter(h); push(h); }\n"
                              "push (h) { loss mse(h, f); }\n";

START_TEST(cgf_real_float_range) {
  const cavs_desc *d = model(real_vf);
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  expect_error("big.cgf", S("graph\n0 v ; f=1,2\nend\ngraph\n0 v ; f=2,1e39\nend\n"), "cgf", d, dims, 5,
               "vertex 0: 1e39 is out of the range of a float");
  expect_error("neg.cgf", S("graph\n0 v ; f=-1e300,0\nend\n"), "cgf", d, dims, 2,
               "vertex 0: -1e300 is out of the range of a float");
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("max.cgf", S("graph\n0 v ; f=3.4e38,-1e-45\nend\n"), "cgf", d, dims, v, 1);
  const cavs_graph *g = cavs_dataset_graph(s, 0);
  ck_assert(isfinite(g->real[0]) && g->real[0] > 3e38f);
  cavs_dataset_free(s);
  cavs_vocab_free(v);
}
END_TEST

/* Numbers are read in the "C" locale whatever the application set: under a German
 * LC_NUMERIC (built here with localedef into this run's directory, LOCPATH pointing at
 * it), strtod reads "0,5" as a half, and a cgf file's "0.5" must still be a half. */
START_TEST(cgf_reals_under_any_locale) {
  char locdir[128], cmd[512];
  snprintf(locdir, sizeof locdir, "%s/locales", g_dir);
  snprintf(cmd, sizeof cmd, "mkdir -p %s && localedef -i de_DE -f UTF-8 %s/de_DE.UTF-8 >/dev/null 2>&1", locdir, locdir);
  (void)system(cmd); /* localedef may exit 1 for warnings; the locale is checked below */
  setenv("LOCPATH", locdir, 1);
  ck_assert_msg(setlocale(LC_NUMERIC, "de_DE.UTF-8") != NULL, "no de_DE.UTF-8 from localedef in %s", locdir);
  ck_assert(strtod("0,5", NULL) == 0.5); /* the application's locale is German */
  const cavs_desc *d = model(real_vf);
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("de.cgf", S("graph\n0 v ; f=0.5,-2.25e1\nend\n"), "cgf", d, dims, v, 1);
  const cavs_graph *g = cavs_dataset_graph(s, 0);
  ck_assert(g->real[0] == 0.5f && g->real[1] == -22.5f);
  cavs_dataset_free(s);
  cavs_vocab_free(v);
  setlocale(LC_NUMERIC, "C");
}
END_TEST

/* ================= pre-trained vectors ================= */

static int param_of(const cavs_desc *d, const char *name) {
  for (int i = 0; i < d->nparams; i++)
    if (!strcmp(d->params[i].name, name)) return i;
  ck_abort_msg("model %s has no parameter %s", d->name, name);
  return -1;
}

/* Vectors go into the rows of the words the vocabulary has (a word2vec header and
 * words it lacks passed over), nothing else of the table changes, a malformed file
 * changes nothing at all; then, frozen, the table stays through training steps that
 * change the other parameters. */
START_TEST(vectors_load_and_freeze) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TL, dims);
  dims[find_dim(TL, "E")] = 4;
  dims[find_dim(TL, "H")] = 8;
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_ok("vec-trees.txt", S("(1 (2 w1) (3 w2))\n(0 (1 w3) (4 w4))\n"), "ptb-tree", TL, dims, v, 1);
  cavs_model *m = cavs_model_new(TL, dims, NULL, 0);
  ck_assert_ptr_nonnull(m);
  cavs_model_init(m, 3);
  int emb = param_of(TL, "emb"), wi = param_of(TL, "Wi");
  long rows, cols, ld;
  float *t = cavs_model_param(m, emb, &rows, &cols, &ld);
  ck_assert_int_eq(cols, 4);
  float *before = malloc(sizeof(float) * (size_t)(rows * ld));
  memcpy(before, t, sizeof(float) * (size_t)(rows * ld));
  char path[256], err[512];
  long found = -1;
  file_path(path, sizeof path, "vec.txt");
  const char good[] = "7 4\nw3 0.5 -1 2e-1 3\nnot-here 1 1 1 1\n\nw1\t-0.25 0 0 1e1\n";
  tu_write(path, good, strlen(good));
  ck_assert_msg(cavs_model_load_vectors(m, emb, path, v, &found, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(found, 2);
  int w1 = cavs_vocab_id(v, "w1", 2, 0), w3 = cavs_vocab_id(v, "w3", 2, 0);
  static const float want1[] = {-0.25f, 0, 0, 10}, want3[] = {0.5f, -1, 0.2f, 3};
  for (long r = 0; r < rows; r++)
    for (long j = 0; j < cols; j++) {
      float x = t[r * ld + j], w = r == w1 ? want1[j] : r == w3 ? want3[j] : before[r * ld + j];
      ck_assert_msg(x == w, "emb[%ld][%ld] = %g, want %g", r, j, x, w);
    }
  memcpy(before, t, sizeof(float) * (size_t)(rows * ld));
  static const struct {
    const char *text, *msg;
  } bad[] = {
      {"w2 1 2 3 4\nw4 1 2 3\n", ":2: error: 'w4' has 3 numbers; 'emb' is 4 wide"},
      {"w2 1 2 3 4\nw4 1 2 x 4\n", ":2:8: error: 'x' is not a finite number"},
      {"w2 1 2 3 nan\n", ":1:10: error: 'nan' is not a finite number"},
      {"w2 1 2 3 1e39\n", ":1:10: error: '1e39' is not a finite number"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    tu_write(path, bad[i].text, strlen(bad[i].text));
    ck_assert_int_eq(cavs_model_load_vectors(m, emb, path, v, &found, err, sizeof err), -1);
    ck_assert_msg(!strncmp(err, path, strlen(path)) && strstr(err, bad[i].msg), "%s: %s", bad[i].msg, err);
    ck_assert_msg(!memcmp(before, t, sizeof(float) * (size_t)(rows * ld)), "%s changed the table", bad[i].msg);
  }
  ck_assert_int_eq(cavs_model_freeze(m, wi, 1), -1); /* merged with Wo and Wu */
  ck_assert_int_eq(cavs_model_freeze(m, emb, 1), 0);
  long wr, wc, wld;
  float *W = cavs_model_param(m, wi, &wr, &wc, &wld);
  float w0 = W[0];
  const cavs_graph *gs[2] = {cavs_dataset_graph(s, 0), cavs_dataset_graph(s, 1)};
  cavs_optim opt = {.kind = CAVS_ADAM, .lr = 0.1};
  for (int step = 0; step < 3; step++) {
    cavs_stats st;
    ck_assert(cavs_model_forward(m, gs, 2, &st) == 0);
    cavs_model_backward(m);
    ck_assert(cavs_model_step(m, &opt) == 0);
  }
  ck_assert_msg(!memcmp(before, t, sizeof(float) * (size_t)(rows * ld)), "a frozen table changed");
  ck_assert(W[0] != w0);
  ck_assert_int_eq(cavs_model_freeze(m, emb, 0), 0); /* and thawed, it learns */
  cavs_stats st;
  ck_assert(cavs_model_forward(m, gs, 2, &st) == 0);
  cavs_model_backward(m);
  ck_assert(cavs_model_step(m, &opt) == 0);
  ck_assert(memcmp(before, t, sizeof(float) * (size_t)(rows * ld)));
  free(before);
  cavs_model_free(m);
  cavs_dataset_free(s);
  cavs_vocab_free(v);
}
END_TEST

/* Data that needs more memory than the limit is an error, with errno ENOMEM, not an
 * abort; the limit (cavs_set_memory_limit) makes this the same on every machine. */
START_TEST(loader_memory_limit) {
  const cavs_desc *d = model("model big; dim H = 2; input f : real[H]; param U[H,H];\n"
                             "vertex v (children 1) { h = tanh(f + gather(0) @ U); scatter(h); push(h); }\n"
                             "push (h) { loss mse(h, f); }\n");
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  dims[0] = 1 << 14; /* 64 KiB of real features a vertex: 256 MiB for the first 4096 */
  char path[256], err[1024];
  snprintf(path, sizeof path, "%s/big.cgf", g_dir);
  tu_write(path, "graph\n0 v\n1 v 0\nend\n", 20);
  cavs_set_memory_limit((size_t)64 << 20);
  cavs_vocab *v = cavs_vocab_new();
  errno = 0;
  cavs_dataset *s = cavs_dataset_load(path, "cgf", d, dims, v, 1, err, sizeof err);
  ck_assert_ptr_null(s);
  ck_assert_int_eq(errno, ENOMEM);
  ck_assert_msg(strstr(err, "big.cgf:2: error:") && strstr(err, "memory limit"), "%s", err);
  /* under a larger limit the same file loads */
  cavs_set_memory_limit((size_t)512 << 20);
  s = cavs_dataset_load(path, "cgf", d, dims, v, 1, err, sizeof err);
  ck_assert_msg(s != NULL, "%s", err);
  ck_assert_int_eq(cavs_dataset_vertices(s), 2);
  cavs_dataset_free(s);
  cavs_vocab_free(v);
  cavs_set_memory_limit(0);
}
END_TEST

/* A cycle error names a vertex on the cycle, not one that merely reaches it: 0 -> 1 <-> 2. */
START_TEST(cgf_cycle_vertex) {
  long dims[CAVS_MAX_DIMS];
  dims_of(TT, dims);
  const char text[] = "graph\n0 internal 1 -\n1 internal 2 -\n2 internal 1 -\nend\n";
  char err[1024], path[256];
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_bytes("cycle-tail.cgf", S(text), "cgf", TT, dims, v, 1, err, sizeof err);
  bool loaded = s != NULL;
  cavs_vocab_free(v);
  cavs_dataset_free(s);
  ck_assert(!loaded);
  file_path(path, sizeof path, "cycle-tail.cgf");
  long line = -1, vert = -1;
  const char *p = err + strlen(path);
  ck_assert_msg(sscanf(p, ":%ld: error: the graph has a cycle through vertex %ld", &line, &vert) == 2, "%s", err);
  ck_assert_msg(vert == 1 || vert == 2, "vertex %ld is not on the cycle: %s", vert, err);
  ck_assert_int_eq(line, vert + 2);
}
END_TEST

/* ================= formats ================= */

START_TEST(unknown_format) {
  char err[256];
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = load_bytes("fmt.txt", S("(2 a)\n"), "json", TL, NULL, v, 1, err, sizeof err);
  cavs_vocab_free(v);
  ck_assert_ptr_null(s);
  ck_assert_msg(strstr(err, "unknown data format 'json'") != NULL, "%s", err);
  /* text-bptt's chunk length: digits only, from 1 to 100000 */
  static const char *const bad[] = {"text-bptt:", "text-bptt:0", "text-bptt:-3", "text-bptt:+3", "text-bptt:3x",
                                    "text-bptt: 3", "text-bptt:100001", "text-bptt:99999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    v = cavs_vocab_new();
    s = load_bytes("fmt.txt", S("a b\n"), bad[i], LM, NULL, v, 1, err, sizeof err);
    cavs_vocab_free(v);
    ck_assert_msg(s == NULL && strstr(err, "must be a number from 1 to 100000"), "%s: %s", bad[i], err);
  }
  v = cavs_vocab_new();
  s = load_bytes("fmt.txt", S("a b\n"), "text-bptt:100000", LM, NULL, v, 1, err, sizeof err);
  cavs_vocab_free(v);
  ck_assert_msg(s != NULL && cavs_dataset_count(s) == 1, "%s", err);
  cavs_dataset_free(s);
}
END_TEST

START_TEST(missing_file) {
  char err[512], path[256];
  file_path(path, sizeof path, "no-such-file.txt");
  cavs_vocab *v = cavs_vocab_new();
  cavs_dataset *s = cavs_dataset_load(path, "ptb-tree", TL, NULL, v, 1, err, sizeof err);
  cavs_vocab_free(v);
  ck_assert_ptr_null(s);
  ck_assert_msg(strstr(err, "cannot open") && strstr(err, path), "%s", err);
}
END_TEST

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

int main(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/cavs-data-XXXXXX");
  if (!mkdtemp(g_dir)) {
    perror("mkdtemp");
    return 1;
  }
  Suite *s = suite_create("data");
  TCase *ptb = tcase_create("ptb-tree"), *text = tcase_create("text"), *cgf = tcase_create("cgf");
  TCase *all[] = {ptb, text, cgf};
  for (int i = 0; i < 3; i++) {
    tcase_add_unchecked_fixture(all[i], setup_models, NULL);
    tcase_set_timeout(all[i], 60);
    suite_add_tcase(s, all[i]);
  }
  tcase_add_test(ptb, ptb_good_file);
  tcase_add_test(ptb, ptb_two_types);
  tcase_add_test(ptb, ptb_nbsp_token);
  tcase_add_test(ptb, ptb_crlf);
  tcase_add_test(ptb, ptb_no_grow);
  tcase_add_test(ptb, ptb_dims_null);
  tcase_add_test(ptb, ptb_dims_of_model_length);
  tcase_add_test(ptb, ptb_deep_left);
  tcase_add_test(ptb, ptb_deep_right);
  tcase_add_loop_test(ptb, ptb_errors, 0, NELEM(ptb_bad));
  tcase_add_loop_test(ptb, ptb_utf8_strict, 0, NELEM(utf8_bad));
  tcase_add_test(ptb, ptb_label_column);
  tcase_add_test(ptb, ptb_inner_block_children);
  tcase_add_test(ptb, set_children_limit);
  tcase_add_test(ptb, ptb_label_int_range);
  tcase_add_test(ptb, unknown_format);
  tcase_add_test(ptb, parse_from_string);
  tcase_add_test(ptb, missing_file);
  tcase_add_test(text, text_chain);
  tcase_add_test(text, text_bptt_stream);
  tcase_add_test(text, text_lines);
  tcase_add_test(text, text_no_grow);
  tcase_add_test(text, text_long_line);
  tcase_add_loop_test(text, text_errors, 0, NELEM(text_bad));
  tcase_add_test(cgf, cgf_good_file);
  tcase_add_loop_test(cgf, cgf_errors, 0, NELEM(cgf_bad));
  tcase_add_test(cgf, cgf_cycle_vertex);
  tcase_add_test(cgf, cgf_feature_int_range);
  tcase_add_test(cgf, cgf_real_float_range);
  tcase_add_test(cgf, cgf_reals_under_any_locale);
  tcase_add_test(cgf, vectors_load_and_freeze);
  tcase_add_test(cgf, loader_memory_limit);
  tcase_add_test(cgf, stream_reads_back_what_a_load_reads);
  int failed = tu_run_suite(s);
  tu_rm_rf(g_dir); /* (its locales/ too: a flat removal left this run's locale behind) */
  return failed;
}

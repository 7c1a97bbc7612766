/* engine.h: test helpers for generated models. A model is built by `cavs build`, the one
 * way the project builds a model (cavsc, then the C compiler with the driver's flags, and
 * whatever make check adds through CAVS_MODEL_CFLAGS), and loaded with dlopen; graphs are
 * made in memory. */
#ifndef ENGINE_H
#define ENGINE_H

#include "cavs.h"
#include "testutil.h"

#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>

/* libcavs exports it for the tests (runtime/cv.h), not in cavs.h: every cell of every
 * per-row buffer and its gradient set to NaN, so that a pass reading a cell nothing
 * wrote shows. */
int cavs_model_poison(cavs_model *m);

/* Loads DIR/NAME.so and returns its NAME_desc. The object stays loaded for the life of
 * the test process. */
static inline const cavs_desc *open_model_kept(const char *so) {
  char sym[300];
  const char *base = strrchr(so, '/') + 1;
  snprintf(sym, sizeof sym, "%.*s_desc", (int)(strlen(base) - 3), base);
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(h != NULL, "dlopen: %s", dlerror());
  const cavs_desc *d = dlsym(h, sym);
  ck_assert_msg(d != NULL, "no %s in %s", sym, so);
  return d;
}

/* The same, and `dir`, which tu_tmpdir made, and its files go now. */
static inline const cavs_desc *open_model(const char *so, char *dir) {
  const cavs_desc *d = open_model_kept(so);
  tu_rmtree(dir);
  return d;
}

/* A model's entry in the suite's store ($CAVS_TEST_MODELS, tu_models_begin): the
 * directory named by a hash of what it is built from (the argument: a file of
 * dsl-examples/ or the source text, the same for the run of one suite), with a file
 * `key` that holds all of that, compared in full on a hit. */
static inline char *stored_model_key(const char *vf, const char *prec, const char *target, const char *extra,
                                     size_t *len) {
  const char *part[] = {vf, prec, target, extra ? extra : ""};
  size_t n = 0;
  for (int i = 0; i < 4; i++) n += strlen(part[i]) + 1;
  char *k = malloc(n), *p = k;
  ck_assert(k != NULL);
  for (int i = 0; i < 4; i++) p = memcpy(p, part[i], strlen(part[i]) + 1), p += strlen(part[i]) + 1;
  *len = n;
  return k;
}

/* The stored model's .so for `key` (its entry's directory is `entry`), or false */
static inline bool stored_model(const char *entry, const char *key, size_t klen, char *so, size_t solen) {
  char path[4500];
  snprintf(path, sizeof path, "%s/key", entry);
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  char *have = malloc(klen + 1);
  ck_assert(have != NULL);
  bool same = fread(have, 1, klen + 1, f) == klen && !memcmp(have, key, klen);
  free(have);
  fclose(f);
  snprintf(path, sizeof path, "%s/so", entry);
  f = same ? fopen(path, "r") : NULL;
  same = f && fgets(so, (int)solen, f) && *so;
  if (f) fclose(f);
  return same;
}

/* cavs build of `vf` (as load_model_with takes it) into `dir` (tu_tmpdir's): the path of
 * its .so into so[solen]. */
static inline void build_model_in(const char *dir, const char *vf, const char *prec, const char *target,
                                  const char *extra, char *so, size_t solen) {
  static int serial;
  char src[4300];
  size_t n = strlen(vf);
  if (n > 3 && !strcmp(vf + n - 3, ".vf") && !strchr(vf, '\n')) {
    snprintf(src, sizeof src, "%s/dsl-examples/%s", tu_env("TOP_SRCDIR", "."), vf);
  } else {
    snprintf(src, sizeof src, "%s/model%d.vf", dir, serial++);
    tu_write(src, vf, n);
  }
  char *argv[] = {(char *)tu_env("CAVS", "./cavs"), "build", "--precision", (char *)prec, "--target", (char *)target,
                  "-o", (char *)dir, src, (char *)extra, NULL};
  RunResult r = tu_run(NULL, argv, 120);
  ck_assert_msg(r.status == 0, "cavs build failed on %s:\n%s%s", vf, tu_tail(r.out, 1000), tu_tail(r.err, 1800));
  /* it prints DIR/NAME.so */
  snprintf(so, solen, "%.*s", (int)strcspn(r.out, "\n"), r.out);
  tu_free(&r);
}

/* Builds `vf` (a file of dsl-examples/, or source text when it does not end in .vf) at
 * `prec` for `target` ("c" or "cuda"), with `extra` (NULL, or one more option of cavs
 * build: an ablation) and returns its descriptor. Once in a run of a suite: its tests
 * build each example again and again (a dozen tests, each in a process of its own), so
 * the first build is kept in the suite's store (tu_models_begin) and the others load
 * it. A build goes to a directory of its own, renamed to the entry's name whole, so a
 * test killed while it built leaves no entry that another would read. */
static inline const cavs_desc *load_model_with(const char *vf, const char *prec, const char *target,
                                               const char *extra) {
  const char *store = getenv("CAVS_TEST_MODELS");
  char so[4400], entry[4400], path[4500];
  if (!store || !*store) {
    char *dir = tu_tmpdir();
    build_model_in(dir, vf, prec, target, extra, so, sizeof so);
    return open_model(so, dir);
  }
  size_t klen;
  char *key = stored_model_key(vf, prec, target, extra, &klen);
  uint64_t h = 14695981039346656037ull; /* FNV-1a */
  for (size_t i = 0; i < klen; i++) h = (h ^ (unsigned char)key[i]) * 1099511628211ull;
  snprintf(entry, sizeof entry, "%s/%016llx", store, (unsigned long long)h);
  if (!stored_model(entry, key, klen, so, sizeof so)) {
    char *dir = tu_tmpdir();
    build_model_in(dir, vf, prec, target, extra, so, sizeof so);
    const char *base = strrchr(so, '/');
    ck_assert(base != NULL);
    snprintf(path, sizeof path, "%s/key", dir);
    tu_write(path, key, klen);
    snprintf(path, sizeof path, "%s/so", dir);
    char stored[4500];
    snprintf(stored, sizeof stored, "%s%s", entry, base);
    tu_write(path, stored, strlen(stored));
    /* another test may have stored it first (rename fails: the directory is not
       empty): its entry is the same build, and this one goes */
    if (rename(dir, entry) == 0) {
      free(dir);
      free(key);
      return open_model_kept(stored);
    }
    int e = errno;
    tu_rmtree(dir);
    ck_assert_msg(stored_model(entry, key, klen, so, sizeof so), "%s: cannot store it in %s: %s", vf, entry,
                  strerror(e));
  }
  free(key);
  return open_model_kept(so);
}

static inline const cavs_desc *load_model_for(const char *vf, const char *prec, const char *target) {
  return load_model_with(vf, prec, target, NULL);
}

/* A model on the cpu backend, its parameters from `seed`. */
static inline cavs_model *new_model(const cavs_desc *d, const long *dims, uint64_t seed) {
  char err[256];
  cavs_model *m = cavs_model_new(d, dims, err, sizeof err);
  ck_assert_msg(m != NULL, "%s", err);
  cavs_model_init(m, seed);
  return m;
}

/* The same for the C target, which the cpu backend runs. */
static inline const cavs_desc *load_model(const char *vf, const char *prec) { return load_model_for(vf, prec, "c"); }

static inline int find_dim(const cavs_desc *d, const char *name) {
  for (int i = 0; i < d->ndims; i++)
    if (!strcmp(d->dims[i].name, name)) return i;
  return -1;
}

static inline int find_input(const cavs_desc *d, const char *name) {
  for (int i = 0; i < d->ninputs; i++)
    if (!strcmp(d->inputs[i].name, name)) return i;
  return -1;
}

/* A graph whose arrays the test owns. */
typedef struct TGraph {
  cavs_graph g;
  int child[4096], type[1024], feat[4096];
  float real[8192];
} TGraph;

static inline unsigned tg_rand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return (*s >> 16) & 0x7fff;
}

/* Random features for every vertex: each integer input gets a value in its range, or -1
 * with probability 1/5; real inputs get values in [-1, 1]. */
static inline void tg_features(TGraph *t, const cavs_desc *d, const long *dims, unsigned *seed) {
  for (int v = 0; v < t->g.n; v++) {
    for (int i = 0; i < d->ninputs; i++) {
      const cavs_input_desc *in = &d->inputs[i];
      long w = in->width.k;
      for (int k = 0; k < CAVS_MAX_DIMS; k++) w += (long)in->width.c[k] * dims[k];
      if (in->kind == CAVS_IN_REAL) {
        long off = 0;
        for (int j = 0; j < i; j++)
          if (d->inputs[j].kind == CAVS_IN_REAL) {
            long wj = d->inputs[j].width.k;
            for (int k = 0; k < CAVS_MAX_DIMS; k++) wj += (long)d->inputs[j].width.c[k] * dims[k];
            off += wj;
          }
        long tot = 0;
        for (int j = 0; j < d->ninputs; j++)
          if (d->inputs[j].kind == CAVS_IN_REAL) {
            long wj = d->inputs[j].width.k;
            for (int k = 0; k < CAVS_MAX_DIMS; k++) wj += (long)d->inputs[j].width.c[k] * dims[k];
            tot += wj;
          }
        for (long j = 0; j < w; j++) t->real[(size_t)v * tot + off + j] = (float)(tg_rand(seed) % 2001) / 1000.0f - 1.0f;
        continue;
      }
      int x = tg_rand(seed) % 5 == 0 ? -1 : (int)(tg_rand(seed) % w);
      t->feat[v * d->nint + in->slot] = x;
    }
  }
  t->g.feat = t->feat;
  t->g.real = t->real;
}

/* A random tree of n vertices with up to `arity` children each (children numbered before
 * parents, vertex n-1 the root); with `holes`, some child slots stay empty. Types: leaf
 * type for vertices without children when the model has two types. */
static inline void tg_tree(TGraph *t, int n, int arity, bool holes, unsigned *seed, int leaf_type,
                           int inner_type) {
  memset(t, 0, sizeof *t);
  t->g.n = n;
  t->g.maxc = arity;
  for (int i = 0; i < n * arity; i++) t->child[i] = -1;
  /* attach each vertex v < n-1 to a random later parent with a free slot */
  for (int v = 0; v < n - 1; v++) {
    for (int tries = 0; tries < 100; tries++) {
      int p = v + 1 + (int)(tg_rand(seed) % (unsigned)(n - 1 - v));
      int s = (int)(tg_rand(seed) % (unsigned)arity);
      if (t->child[p * arity + s] < 0) {
        t->child[p * arity + s] = v;
        break;
      }
    }
  }
  if (!holes) {
    /* pack children to the front (no holes) */
    for (int p = 0; p < n; p++) {
      int k = 0;
      for (int s = 0; s < arity; s++)
        if (t->child[p * arity + s] >= 0) t->child[p * arity + k++] = t->child[p * arity + s];
      for (; k < arity; k++) t->child[p * arity + k] = -1;
    }
  }
  for (int v = 0; v < n; v++) {
    bool leaf = true;
    for (int s = 0; s < arity; s++) leaf &= t->child[v * arity + s] < 0;
    t->type[v] = leaf ? leaf_type : inner_type;
  }
  t->g.child = t->child;
  t->g.type = t->type;
}

/* A random DAG: vertex v takes up to `arity` children among the vertices before it
 * (repeats allowed), so vertices have several parents and parents sit at uneven levels. */
static inline void tg_dag(TGraph *t, int n, int arity, unsigned *seed, int leaf_type, int inner_type) {
  memset(t, 0, sizeof *t);
  t->g.n = n;
  t->g.maxc = arity;
  for (int v = 0; v < n; v++) {
    int k = v < 2 ? 0 : (int)(tg_rand(seed) % (unsigned)(arity + 1));
    for (int s = 0; s < arity; s++) t->child[v * arity + s] = s < k ? (int)(tg_rand(seed) % (unsigned)v) : -1;
    t->type[v] = k ? inner_type : leaf_type;
  }
  t->g.child = t->child;
  t->g.type = t->type;
}

/* Children a set's vertex takes beyond what these graphs give it by default (up to 4, and
 * 3 after its named slots in tg_typed): check_random's Child-Sum sets take up to 8. */
static int tg_set_more;

/* Whether model d's vertex blocks name their children's types (`children a: T`, or a
 * typed set `children *: T`, which a model may name alone). */
static inline bool tg_typed_model(const cavs_desc *d) {
  for (int t = 0; t < d->nvertex; t++)
    if (d->vertex[t].slot_types || (d->vertex[t].edges && d->vertex[t].edge_type >= 0)) return true;
  return false;
}

/* A random graph of n vertices for a model whose slots are typed: vertex v takes a
 * random type; each of its slots (and 3 + tg_set_more for a type that takes a set), with
 * probability 4/5, a random earlier vertex of the slot's type (with `shared`, any; else
 * one no other slot has taken, when there is one). */
static inline void tg_typed(TGraph *t, const cavs_desc *d, int n, bool shared, unsigned *seed) {
  memset(t, 0, sizeof *t);
  int C = 1;
  for (int u = 0; u < d->nvertex; u++)
    if (d->vertex[u].children + (d->vertex[u].edges ? 3 + tg_set_more : 0) > C)
      C = d->vertex[u].children + (d->vertex[u].edges ? 3 + tg_set_more : 0);
  t->g.n = n;
  t->g.maxc = C;
  static unsigned char taken[1024];
  memset(taken, 0, sizeof taken);
  for (int v = 0; v < n; v++) {
    int ty = (int)(tg_rand(seed) % (unsigned)d->nvertex);
    t->type[v] = ty;
    for (int s = 0; s < C; s++) t->child[v * C + s] = -1;
    /* the named slots, then up to 3 (+ tg_set_more) children of a set */
    int slots = d->vertex[ty].children + (d->vertex[ty].edges ? 3 + tg_set_more : 0);
    for (int s = 0; s < slots; s++) {
      if (tg_rand(seed) % 5 == 0) continue;
      int want = s < d->vertex[ty].children ? d->vertex[ty].slot_types[s] : d->vertex[ty].edge_type, pick = -1, seen = 0;
      for (int u = 0; u < v; u++) /* reservoir: a uniform choice among the candidates */
        if (t->type[u] == want && (shared || !taken[u]) && tg_rand(seed) % (unsigned)++seen == 0) pick = u;
      if (pick >= 0) taken[pick] = 1;
      t->child[v * C + s] = pick;
    }
  }
  t->g.child = t->child;
  t->g.type = t->type;
}

/* What random graphs of model d take: the most children of any vertex type (at least 1),
 * the type for vertices without children and the type for the others (the same type
 * when the model has one; with two, the one that takes no children for leaves). */
static inline void tg_types(const cavs_desc *d, int *arity, int *leaf, int *inner) {
  *arity = 1, *leaf = 0, *inner = 0;
  for (int t = 0; t < d->nvertex; t++) {
    int kids = d->vertex[t].edges ? 4 + tg_set_more : d->vertex[t].children; /* a set: 4 (+ tg_set_more) */
    if (kids > *arity) *arity = kids;
    if (kids == 0) *leaf = t;
    else *inner = t;
  }
  if (d->nvertex == 1) *leaf = *inner = 0;
}

/* The minibatch on which two builds or two schedules of one model are compared: small
 * dims (every fixed dim 8 + 3i, every other 11) and, from a fixed seed, six random trees
 * of 5 to 40 vertices (every other one with empty child slots) and, with `dags`, two
 * random DAGs of 90 and 100 vertices, typed as tg_types says. Returns how many graphs;
 * gs[i] is &g[i].g. */
enum { TG_MINIBATCH = 8 };
/* tg_minibatch's graphs with every fixed dim `wide` + 3i (every other 11) */
static inline int tg_minibatch_wide(const cavs_desc *d, long *dims, TGraph g[TG_MINIBATCH],
                                    const cavs_graph *gs[TG_MINIBATCH], bool dags, int wide) {
  cavs_dims_default(d, dims);
  for (int i = 0; i < d->ndims; i++) dims[i] = d->dims[i].kind == CAVS_DIM_FIXED ? wide + 3 * i : 11;
  unsigned seed = 77;
  int arity, leaf, inner;
  tg_types(d, &arity, &leaf, &inner);
  int k_graphs = dags ? TG_MINIBATCH : 6;
  for (int k = 0; k < k_graphs; k++) {
    if (tg_typed_model(d)) tg_typed(&g[k], d, k < 6 ? 5 + 7 * k : 30 + 10 * k, k >= 6, &seed);
    else if (k < 6) tg_tree(&g[k], 5 + 7 * k, arity, k % 2, &seed, leaf, inner);
    else tg_dag(&g[k], 30 + 10 * k, arity, &seed, leaf, inner);
    tg_features(&g[k], d, dims, &seed);
    gs[k] = &g[k].g;
  }
  return k_graphs;
}
static inline int tg_minibatch(const cavs_desc *d, long *dims, TGraph g[TG_MINIBATCH],
                               const cavs_graph *gs[TG_MINIBATCH], bool dags) {
  return tg_minibatch_wide(d, dims, g, gs, dags, 8);
}

/* Tree-FC as the Cavs and Fold papers run it: a leaf's state is its word's embedding row
 * as it is, an inner vertex's h = tanh([h_0; h_1] W + b). Its product over the children
 * takes the leaves' rows as rows of the table (cavs_gemm_kids): each distinct word
 * multiplied once where a task has enough of them (check_engine's full trees), every row
 * in one product otherwise (check_gradcheck's small graphs, random trees). */
#define TG_TREEFC_WORDS                                                                                    \
  "model tfc_words; dim H = 4; dim C = 3; dim V = vocab(w);\n"                                             \
  "input w : index[V]; input y : class[C];\n"                                                              \
  "param emb[V,H], W[2H,H], b[H], Wc[H,C] init uniform(-1, 1);\n"                                          \
  "pull { x = emb[w]; }\n"                                                                                 \
  "vertex leaf (children 0) { scatter(pull()); }\n"                                                        \
  "vertex inner (children 2) { h = tanh(concat(gather(0), gather(1)) @ W + b); scatter(h); push(h); }\n" \
  "push (h) { loss softmax_xent(h @ Wc, y); }\n"

/* The gradient check's minibatch (check_gradcheck, check_random): TG_NGRAD small graphs at
 * small dims (fixed dims 2 to 4, the others 6). */
enum { TG_NGRAD = 3 };

static inline void tg_grad_dims(const cavs_desc *d, long *dims) {
  cavs_dims_default(d, dims);
  for (int i = 0; i < d->ndims; i++) dims[i] = d->dims[i].kind == CAVS_DIM_FIXED ? 2 + i % 3 : 6;
}

/* Trees with holes, a chain, and a DAG; all vertex types used. */
static inline void tg_grad_graphs(const cavs_desc *d, const long *dims, TGraph *g, unsigned seed) {
  if (tg_typed_model(d)) { /* two graphs whose vertices have one parent, one whose have several */
    for (int k = 0; k < TG_NGRAD; k++) {
      tg_typed(&g[k], d, 8 + 3 * k, k == 2, &seed);
      tg_features(&g[k], d, dims, &seed);
    }
    return;
  }
  int arity, leaf, inner;
  tg_types(d, &arity, &leaf, &inner);
  tg_tree(&g[0], 7, arity, true, &seed, leaf, inner);
  tg_tree(&g[1], 5, arity, false, &seed, leaf, inner);
  /* a DAG: 0 and 1 are leaves; 2 = (0, 1), 3 = (1, 0) [or (1) / (0)], 4 = (2, 3) */
  TGraph *t = &g[2];
  tg_tree(t, 5, arity, false, &seed, leaf, inner);
  for (int i = 0; i < 5 * arity; i++) t->child[i] = -1;
  t->child[2 * arity + 0] = 0;
  t->child[3 * arity + 0] = 1;
  if (arity > 1) {
    t->child[2 * arity + 1] = 1;
    t->child[3 * arity + 1] = 0;
    t->child[4 * arity + 1] = 3;
  }
  t->child[4 * arity + 0] = 2;
  /* a parent that reads one child twice: both slots' gradients must add up */
  if (arity > 1) t->child[3 * arity + 1] = 1;
  for (int v = 0; v < 5; v++) t->type[v] = v < 2 ? leaf : inner;
  for (int k = 0; k < TG_NGRAD; k++) tg_features(&g[k], d, dims, &seed);
}

/* A gradient check's start: m's parameters drawn (seed 7), then each moved by up to 0.5 (so
 * that no gradient is negligibly small), and its graphs in g and gs; the flat parameters
 * (np of them) */
static inline double *tg_grad_start(cavs_model *m, const cavs_desc *d, const long *dims, TGraph g[TG_NGRAD],
                                    const cavs_graph *gs[TG_NGRAD], size_t *np) {
  cavs_model_init(m, 7);
  double *p = cavs_model_params_flat(m, np);
  unsigned s = 99;
  for (size_t i = 0; i < *np; i++) p[i] += (double)(tg_rand(&s) % 2001) / 2000.0 - 0.5;
  tg_grad_graphs(d, dims, g, 1234);
  for (int k = 0; k < TG_NGRAD; k++) gs[k] = &g[k].g;
  return p;
}

#endif

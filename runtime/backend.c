/* backend.c: the registry of backends, and the entry points of generated code
 * (cavs_abi.h), each of which hands its work to the model's backend. */
#include "cv.h"
#include "cavs_paths.h"
#include "forms.h"
#include "moe.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

/* The CUDA backend is a module of its own (cavs-cuda.so, built when configure finds
 * nvcc), loaded the first time a model asks for it: a CPU-only build, or a machine
 * without the CUDA libraries, never links them. Which module is fixed by where this
 * libcavs is, never by the environment or an option: the one installed with it, or the
 * build tree's for the build tree's libcavs (what make check runs).
 *
 * CAVS_CUDA_EMULATED is the tests' build of libcavs (tests/libcavs-emu.la, never
 * installed): backend_cuda.cu compiled against the emulated CUDA runtime of tests/ is
 * linked into it, and the "cuda" row is that backend, with nothing to load. */
#if defined(CAVS_CUDA_EMULATED)
extern const cv_backend cv_backend_cuda;
static const cv_backend *cuda_module(char *msg, size_t len) { return &cv_backend_cuda; }
#elif defined(CAVS_CUDA_MODULE)
/* The directory this libcavs was loaded from (its real path), into dir */
static bool library_dir(char *dir, size_t cap) {
  Dl_info info;
  char real[PATH_MAX];
  if (!dladdr((void *)cavs_version, &info) || !info.dli_fname || !realpath(info.dli_fname, real)) return false;
  char *slash = strrchr(real, '/');
  if (!slash) return false;
  *slash = 0;
  int n = snprintf(dir, cap, "%s", real);
  return n > 0 && (size_t)n < cap;
}

/* The module for this libcavs, into p: the build tree's (runtime/cavs-cuda.so) when this
   is the build tree's libcavs (libtool keeps it in .libs); else cavs/cavs-cuda.so beside
   it (the pkglibdir of the prefix it is installed in, wherever that is now: a prefix
   changed since the build, a DESTDIR) when it is there; else the configured pkglibdir. */
static void module_path(char *p, size_t cap) {
  char dir[PATH_MAX], build[PATH_MAX];
  bool here = library_dir(dir, sizeof dir);
  if (here && realpath(CAVS_CFG_BUILDDIR "/.libs", build) && !strcmp(dir, build)) {
    snprintf(p, cap, "%s", CAVS_CFG_BUILDDIR "/runtime/cavs-cuda.so");
    return;
  }
  int n = here ? snprintf(p, cap, "%s/cavs/cavs-cuda.so", dir) : -1;
  if (n > 0 && (size_t)n < cap && !access(p, R_OK)) return;
  snprintf(p, cap, "%s", CAVS_CFG_PKGLIBDIR "/cavs-cuda.so");
}

static const cv_backend *cuda_module(char *msg, size_t len) {
  static const cv_backend *loaded;
  if (loaded) return loaded;
  char path[PATH_MAX + 32];
  module_path(path, sizeof path);
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(msg, len, "the CUDA backend cannot be loaded: %s", dlerror());
    return NULL;
  }
  loaded = dlsym(h, CV_BACKEND_CUDA_SYMBOL);
  if (!loaded)
    snprintf(msg, len, "the CUDA backend cannot be loaded: %s is not of this libcavs (it has no %s)", path,
             CV_BACKEND_CUDA_SYMBOL);
  return loaded;
}
#endif

static const cv_backend *cpu(char *msg, size_t len) { return &cv_backend_cpu; }

/* One row a backend, in the order `cavs_backend_name` lists them: a name, and how to
 * get its operations (NULL, with the reason in msg, when they cannot be had). */
static const struct {
  const char *name;
  const cv_backend *(*get)(char *msg, size_t len);
} backends[] = {
    {"cpu", cpu},
#if defined(CAVS_CUDA_MODULE) || defined(CAVS_CUDA_EMULATED)
    {"cuda", cuda_module},
#endif
};
enum { NBACKENDS = sizeof backends / sizeof *backends };

int cavs_backend_count(void) { return NBACKENDS; }

const char *cavs_version(void) { return CAVS_VERSION; }

const char *cavs_backend_name(int i) { return i >= 0 && i < NBACKENDS ? backends[i].name : NULL; }

const cv_backend *cv_backend_find(const char *name, char *msg, size_t len) {
  for (int i = 0; i < NBACKENDS; i++)
    if (!strcmp(name, backends[i].name)) return backends[i].get(msg, len);
  char list[256] = "";
  for (int i = 0; i < NBACKENDS; i++)
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", backends[i].name);
  if (!strcmp(name, "cuda"))
    snprintf(msg, len, "this libcavs was built without the CUDA backend (backends: %s)", list);
  else snprintf(msg, len, "unknown backend '%s' (backends: %s)", name, list);
  return NULL;
}

int cavs_backend_probe(const char *name, char *msg, size_t len) {
  const cv_backend *b = cv_backend_find(name, msg, len);
  return b ? b->probe(msg, len) : -1;
}

const char *cavs_model_backend(const cavs_model *m) { return m->be->name; }

void cavs_model_backend_stats(cavs_model *m, cavs_backend_stats *st, int reset) {
  if (st) *st = m->stats;
  if (reset) memset(&m->stats, 0, sizeof m->stats);
}

int cavs_model_read(cavs_model *m, void *host, const void *model_mem, size_t bytes) {
  if (m->be->synchronize(m) || m->be->download(m, host, model_mem, bytes)) return -1;
  return m->be->synchronize(m);
}

void *cavs_host_alloc(cavs_model *m, size_t bytes) {
  void *p = m->be->host_alloc ? m->be->host_alloc(bytes) : malloc(bytes ? bytes : 1);
  if (!p) errno = ENOMEM;
  return p;
}

void cavs_host_free(cavs_model *m, void *p) {
  if (m->be->host_free) m->be->host_free(p);
  else free(p);
}

int cavs_model_write(cavs_model *m, void *model_mem, const void *host, size_t bytes) {
  cv_ptables_free(m); /* made of parameters this may change */
  if (m->be->synchronize(m) || m->be->upload(m, model_mem, host, bytes)) return -1;
  return m->be->synchronize(m);
}

/* ---- the entry points of generated code ---- */

#define BE(c) ((c)->model->be)
/* A pass that failed (launch_failed: m->err says why) issues nothing more: what it
   would compute is thrown away, and computing it would read what the failed work never
   wrote (a mixture's slots after a failed routing or exchange). */
#define DEAD(c)                                                                            \
  do {                                                                                     \
    if ((c)->model->launch_failed) return;                                                 \
  } while (0)

void cavs_loop(cavs_ctx *c, cavs_cols f, int r0, int n, long width, int flags) {
  DEAD(c);
  BE(c)->loop(c, f, r0, n, width, flags);
}

void cavs_gemm(cavs_ctx *c, int ta, int tb, int m, int n, int k, double alpha, const void *a, long lda,
               const void *b, long ldb, double beta, void *cm, long ldc) {
  DEAD(c);
  BE(c)->gemm(c, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, cm, ldc);
}

void cv_gemms(cavs_ctx *c, const cv_gemm *g, int n) {
  DEAD(c);
  if (n <= 0) return;
  if (BE(c)->gemms) {
    BE(c)->gemms(c, g, n);
    return;
  }
  for (int i = 0; i < n; i++) {
    BE(c)->gemm(c, g[i].ta, g[i].tb, g[i].m, g[i].n, g[i].k, g[i].alpha, g[i].a, g[i].lda, g[i].b, g[i].ldb, g[i].beta,
                g[i].c, g[i].ldc);
    cv_gemm_act(c, &g[i]);
  }
}

#define GEMM_ACT(R, S)                                                                                                 \
  static void gemm_act_##S(const cv_gemm *g) {                                                                       \
    for (int i = 0; i < g->m; i++)                                                                                   \
      cv_act_row_##S(g->act, g->grad, (R *)g->c + (size_t)i * (size_t)g->ldc,                                        \
                     g->grad ? (const R *)g->y + (size_t)i * (size_t)g->ldy : NULL, g->n);                           \
  }
GEMM_ACT(float, f)
GEMM_ACT(double, d)

void cv_gemm_act(cavs_ctx *c, const cv_gemm *g) {
  if (g->act == CAVS_ACT_NONE) return;
  if (c->desc->precision == CAVS_DOUBLE) gemm_act_d(g);
  else gemm_act_f(g);
}

/* mv and mm through the backend's own gemm, for a backend without kernels of its own
 * for them (CUDA's: cuBLAS): row by row (a matrix-vector product and an outer product
 * per row), or one product over all rows where their matrices lie one after another
 * (ld the matrix's size). Pointers are to row 0. */
#define AT(p, r, ld) ((char *)(p) + ((size_t)(r) * (size_t)(ld)) * es)
static size_t esize_of(const cavs_ctx *c) { return c->desc->precision == CAVS_DOUBLE ? 8 : 4; }

static void by_gemm_rowmv_fwd(cavs_ctx *c, long a, long b, const void *x, long ldx, const void *m, long ldm, void *y, long ldy,
                    int r0, int n) {
  size_t es = esize_of(c);
  for (int r = r0; r < r0 + n; r++)
    cavs_gemm(c, CAVS_NO_TRANS, CAVS_NO_TRANS, 1, (int)b, (int)a, 1, AT(x, r, ldx), a, AT(m, r, ldm), b, 0,
              AT(y, r, ldy), b);
}

static void by_gemm_rowmv_bwd(cavs_ctx *c, long a, long b, const void *x, long ldx, const void *m, long ldm, const void *dy,
                    long lddy, void *dx, long lddx, void *dm, long lddm, int r0, int n) {
  size_t es = esize_of(c);
  for (int r = r0; r < r0 + n; r++) {
    /* dx [1, a] += dy [1, b] M^T; dM [a, b] += x^T dy */
    if (dx)
      cavs_gemm(c, CAVS_NO_TRANS, CAVS_TRANS, 1, (int)a, (int)b, 1, AT(dy, r, lddy), b, AT(m, r, ldm), b, 1,
                AT(dx, r, lddx), a);
    if (dm)
      cavs_gemm(c, CAVS_TRANS, CAVS_NO_TRANS, (int)a, (int)b, 1, 1, AT(x, r, ldx), a, AT(dy, r, lddy), b, 1,
                AT(dm, r, lddm), b);
  }
}

static void by_gemm_rowmm_fwd(cavs_ctx *c, long a, long b, long cc, const void *m, long ldm, const void *w, long ldw, void *y,
                    long ldy, int r0, int n) {
  size_t es = esize_of(c);
  if (n <= 0) return;
  if (cv_rows_stacked(a * b, ldm, a * cc, ldy, n))
    cavs_gemm(c, CAVS_NO_TRANS, CAVS_NO_TRANS, (int)(n * a), (int)cc, (int)b, 1, AT(m, r0, ldm), b, w, ldw, 0,
              AT(y, r0, ldy), cc);
  else
    for (int r = r0; r < r0 + n; r++)
      cavs_gemm(c, CAVS_NO_TRANS, CAVS_NO_TRANS, (int)a, (int)cc, (int)b, 1, AT(m, r, ldm), b, w, ldw, 0,
                AT(y, r, ldy), cc);
}

static void by_gemm_rowmm_bwd(cavs_ctx *c, long a, long b, long cc, const void *m, long ldm, const void *w, long ldw,
                    const void *dy, long lddy, void *dm, long lddm, void *dw, long lddw, int r0, int n) {
  size_t es = esize_of(c);
  if (n <= 0) return;
  /* dM [a, b] += dy [a, cc] W^T; dW [b, cc] += M^T dy, summed over the rows */
  if (dm && cv_rows_stacked(a * cc, lddy, a * b, lddm, n))
    cavs_gemm(c, CAVS_NO_TRANS, CAVS_TRANS, (int)(n * a), (int)b, (int)cc, 1, AT(dy, r0, lddy), cc, w, ldw, 1,
              AT(dm, r0, lddm), b);
  else if (dm)
    for (int r = r0; r < r0 + n; r++)
      cavs_gemm(c, CAVS_NO_TRANS, CAVS_TRANS, (int)a, (int)b, (int)cc, 1, AT(dy, r, lddy), cc, w, ldw, 1,
                AT(dm, r, lddm), b);
  if (dw && cv_rows_stacked(a * b, ldm, a * cc, lddy, n))
    cavs_gemm(c, CAVS_TRANS, CAVS_NO_TRANS, (int)b, (int)cc, (int)(n * a), 1, AT(m, r0, ldm), b, AT(dy, r0, lddy), cc, 1,
              dw, lddw);
  else if (dw)
    for (int r = r0; r < r0 + n; r++)
      cavs_gemm(c, CAVS_TRANS, CAVS_NO_TRANS, (int)b, (int)cc, (int)a, 1, AT(m, r, ldm), b, AT(dy, r, lddy), cc, 1, dw,
                lddw);
}
#undef AT

/* the backend's own where it has them, but under CAVS_ROWMAT_BY_GEMM */
#define OWN(c, f) (BE(c)->f && !((c)->model->ablate & CAVS_ROWMAT_BY_GEMM))
void cavs_rowmv_fwd(cavs_ctx *c, long a, long b, const void *x, long ldx, const void *m, long ldm, void *y, long ldy,
                    int r0, int n) {
  DEAD(c);
  if (OWN(c, rowmv_fwd)) BE(c)->rowmv_fwd(c, a, b, x, ldx, m, ldm, y, ldy, r0, n);
  else by_gemm_rowmv_fwd(c, a, b, x, ldx, m, ldm, y, ldy, r0, n);
}
void cavs_rowmv_bwd(cavs_ctx *c, long a, long b, const void *x, long ldx, const void *m, long ldm, const void *dy,
                    long lddy, void *dx, long lddx, void *dm, long lddm, int r0, int n) {
  DEAD(c);
  if (OWN(c, rowmv_bwd)) BE(c)->rowmv_bwd(c, a, b, x, ldx, m, ldm, dy, lddy, dx, lddx, dm, lddm, r0, n);
  else by_gemm_rowmv_bwd(c, a, b, x, ldx, m, ldm, dy, lddy, dx, lddx, dm, lddm, r0, n);
}
void cavs_rowmm_fwd(cavs_ctx *c, long a, long b, long cc, const void *m, long ldm, const void *w, long ldw, void *y,
                    long ldy, int r0, int n) {
  DEAD(c);
  if (OWN(c, rowmm_fwd)) BE(c)->rowmm_fwd(c, a, b, cc, m, ldm, w, ldw, y, ldy, r0, n);
  else by_gemm_rowmm_fwd(c, a, b, cc, m, ldm, w, ldw, y, ldy, r0, n);
}
void cavs_rowmm_bwd(cavs_ctx *c, long a, long b, long cc, const void *m, long ldm, const void *w, long ldw,
                    const void *dy, long lddy, void *dm, long lddm, void *dw, long lddw, int r0, int n) {
  DEAD(c);
  if (OWN(c, rowmm_bwd)) BE(c)->rowmm_bwd(c, a, b, cc, m, ldm, w, ldw, dy, lddy, dm, lddm, dw, lddw, r0, n);
  else by_gemm_rowmm_bwd(c, a, b, cc, m, ldm, w, ldw, dy, lddy, dm, lddm, dw, lddw, r0, n);
}
#undef OWN

void cavs_gemm_rows(cavs_ctx *c, const int *idx, int skip, int r0, int n, int form, int cols, int k, const void *x,
                    long ldx, const void *w, long ldw, void *y, long ldy) {
  DEAD(c);
  if (!BE(c)->open_rows && form == CAVS_PROD_Y_OPEN) form = CAVS_PROD_Y;
  if (!BE(c)->open_rows && form == CAVS_PROD_Y_CLOSE) {
    BE(c)->gemm_skip(c, skip, r0, n, CAVS_PROD_Y_ADD, cols, k, x, ldx, w, ldw, y, ldy);
    return;
  }
  BE(c)->gemm_rows(c, idx, skip, r0, n, form, cols, k, x, ldx, w, ldw, y, ldy);
}

/* The product tables of inference: table[V, k] w[k, cols] as [V, cols], made when as
   many rows as the table has went through the product since inference began (so that
   an evaluation smaller than the vocabulary never pays for it), up to 256 MiB each. */
enum { PTABLE_MAX = 256 << 20 };
void cv_ptables_free(cavs_model *m) {
  for (int i = 0; i < m->nptable; i++) m->be->release(m->ptable[i].mem);
  m->nptable = 0;
}

/* Table t allocated and made; false (and the product from then on, as in training) when
   it cannot be had */
static bool ptable_make(cavs_ctx *c, struct cv_ptable *t) {
  cavs_model *m = c->model;
  size_t bytes = (size_t)t->trows * (size_t)t->cols * m->esize;
  if (t->trows <= 0 || t->trows > INT_MAX || t->cols <= 0 || bytes / (size_t)t->cols / m->esize != (size_t)t->trows ||
      bytes > PTABLE_MAX || !(t->mem = m->be->alloc(m, bytes))) {
    t->rows = -1;
    m->alloc_why[0] = 0; /* not an error (a device that failed is the model's failure: the pass's end says it) */
    m->alloc_lost = false;
    return false;
  }
  BE(c)->gemm(c, CAVS_NO_TRANS, CAVS_NO_TRANS, (int)t->trows, t->cols, t->k, 1, t->table, t->ldt, t->w, t->ldw, 0,
              t->mem, t->cols);
  return true;
}

static struct cv_ptable *ptable_of(cavs_ctx *c, const void *table, long ldt, long trows, const void *w, long ldw,
                                   int cols, int k, int rows) {
  cavs_model *m = c->model;
  struct cv_ptable *t = NULL;
  for (int i = 0; i < m->nptable && !t; i++) {
    struct cv_ptable *q = &m->ptable[i];
    if (q->table == table && q->ldt == ldt && q->trows == trows && q->w == w && q->ldw == ldw && q->cols == cols &&
        q->k == k)
      t = q;
  }
  if (!t) {
    if (m->nptable == (int)(sizeof m->ptable / sizeof *m->ptable)) return NULL;
    t = &m->ptable[m->nptable++];
    *t = (struct cv_ptable){table, w, ldt, trows, ldw, 0, cols, k, NULL};
  }
  if (t->mem || t->rows < 0) return t->mem ? t : NULL;
  t->rows += rows;
  if (t->rows < trows) return NULL;
  /* a pass captured as a graph cannot allocate: made before the next pass */
  if (m->no_alloc) return NULL;
  return ptable_make(c, t) ? t : NULL;
}

void cv_ptables_ready(cavs_model *m) {
  for (int i = 0; i < m->nptable; i++) {
    struct cv_ptable *t = &m->ptable[i];
    if (!t->mem && t->rows >= t->trows) ptable_make(&m->ctx, t);
  }
}

void cavs_gemm_table(cavs_ctx *c, const int *idx, int skip, int r0, int n, int form, int cols, int k,
                     const void *table, long ldt, long trows, const void *x, long ldx, const void *w, long ldw,
                     void *y, long ldy) {
  DEAD(c);
  if (skip > n) skip = n;
  if (skip < 0) skip = 0;
  if (!BE(c)->open_rows && form == CAVS_PROD_Y_OPEN) form = CAVS_PROD_Y;
  bool y_form = form == CAVS_PROD_Y || form == CAVS_PROD_Y_INNER || form == CAVS_PROD_Y_OPEN;
  struct cv_ptable *t = table && !c->keep && y_form && trows <= INT_MAX
                            ? ptable_of(c, table, ldt, trows, w, ldw, cols, k, n - skip)
                            : NULL;
  if (!t) {
    /* x's rows the table's: each distinct one multiplied once, where the backend can */
    bool once = table && BE(c)->gemm_distinct && !(c->model->ablate & CAVS_NO_DEDUP);
    if (!once || !BE(c)->gemm_distinct(c, idx, skip, r0, n, form, cols, k, trows, x, ldx, w, ldw, y, ldy))
      BE(c)->gemm_rows(c, idx, skip, r0, n, form, cols, k, x, ldx, w, ldw, y, ldy);
    return;
  }
  /* the skipped rows as the product leaves them (cleared for CAVS_PROD_Y), then a row
     of the table for every row with an index and zeros for the others */
  if (form == CAVS_PROD_Y && skip) BE(c)->gemm_rows(c, idx, skip, r0, skip, form, cols, k, x, ldx, w, ldw, y, ldy);
  BE(c)->lookup_fwd(c, t->mem, cols, idx, y, ldy, r0 + skip, n - skip, cols);
}

void cavs_gemm_skip(cavs_ctx *c, int skip, int r0, int n, int form, int cols, int k, const void *x, long ldx,
                    const void *w, long ldw, void *y, long ldy) {
  DEAD(c);
  BE(c)->gemm_skip(c, skip, r0, n, form, cols, k, x, ldx, w, ldw, y, ldy);
}

/* cavs_gemm_kids's indices for rows [r0, r0 + n): for each slot s, at kidx + 2 s rows
   the index (`input`) of the slot's child where it is of type `type` with one (-1
   elsewhere) and at kidx + (2 s + 1) rows 0 where the child is of another type (-1
   elsewhere; a child of the type without an index has a zero row: neither). Bit s of
   the result: slot s is worth taking apart, its children of the type with an index
   KIDS_MIN rows at least (fewer: gemm_distinct would multiply each row anyway), and the
   rows of its other children in KIDS_RUNS runs at most (each run is a product of its
   own: on SST, whose upper levels mix leaves and inner vertices row by row, the runs
   cost more than the words multiplied once save; the rows of the type's children may
   fall anywhere, gemm_distinct sorting them by index). 0 where no slot is, or without
   memory: the caller then multiplies every row in one product. */
enum { KIDS_MIN = 32, KIDS_RUNS = 2 };
static unsigned kid_indices(cavs_ctx *c, int kids, int type, int input, int skip, int r0, int n) {
  cavs_model *m = c->model;
  if (type < 0 || type >= c->desc->nvertex || input < 0 || input >= c->desc->nint || kids > m->maxc ||
      kids > (int)(8 * sizeof(unsigned)) || m->rows <= 0)
    return 0;
  size_t need = 2 * (size_t)kids * (size_t)m->rows;
  if (need > m->capkidx) {
    int *p = realloc(m->kidx, need * sizeof(int));
    if (!p) return 0;
    m->kidx = p, m->capkidx = need;
  }
  int lo = m->type_r0[type], hi = lo + m->type_n[type];
  const int *word = m->iin[input]; /* (host memory: a device's inputs are copies) */
  unsigned has = 0;
  for (int s = 0; s < kids; s++) {
    int *idx = m->kidx + 2 * (size_t)s * (size_t)m->rows, *other = idx + m->rows;
    int words = 0, runs = 0;
    for (int r = r0; r < r0 + n; r++) {
      int ch = r < r0 + skip ? -1 : m->child[(size_t)r * (size_t)m->maxc + (size_t)s];
      bool table = ch >= lo && ch < hi;
      idx[r] = table && word[ch] >= 0 ? word[ch] : -1;
      other[r] = ch >= 0 && !table ? 0 : -1;
      words += idx[r] >= 0;
      runs += other[r] >= 0 && (r == r0 || other[r - 1] < 0);
    }
    if (words >= KIDS_MIN && runs <= KIDS_RUNS) has |= 1u << s;
  }
  return has;
}

void cavs_gemm_kids(cavs_ctx *c, int kids, int type, int input, int skip, int r0, int n, int form, int cols, int k,
                    const void *table, long ldt, long trows, const void *x, long ldx, const void *w, long ldw,
                    void *y, long ldy) {
  DEAD(c);
  cavs_model *m = c->model;
  if (skip > n) skip = n;
  if (skip < 0) skip = 0;
  bool y_form = form == CAVS_PROD_Y || form == CAVS_PROD_Y_INNER || form == CAVS_PROD_Y_ADD;
  unsigned has = 0;
  /* (a backend without distinct rows' products multiplies every row: the one product,
     as cavs_gemm_skip) */
  if (BE(c)->gemm_distinct && !(m->ablate & CAVS_NO_DEDUP) &&
      (y_form || form == CAVS_PROD_DX || form == CAVS_PROD_DW) && kids > 0 && k > 0)
    has = kid_indices(c, kids, type, input, skip, r0, n);
  if (!has) {
    /* no child of the type here (the upper levels): the one product over every slot */
    BE(c)->gemm_skip(c, skip, r0, n, form, cols, kids * k, x, ldx, w, ldw, y, ldy);
    return;
  }
  size_t es = m->esize;
  for (int s = 0; s < kids; s++) {
    /* slot s: x's columns [s k, (s + 1) k) (dx's, in CAVS_PROD_DX, where x is dy), w's
       rows [s k, (s + 1) k) (dW's in CAVS_PROD_DW); after the first, y is added to */
    int f = y_form && s ? CAVS_PROD_Y_ADD : form;
    const char *xs = (const char *)x + (form == CAVS_PROD_DX ? 0 : (size_t)s * (size_t)k * es);
    const char *ws = (const char *)w + (size_t)s * (size_t)k * (size_t)ldw * es;
    char *ys = (char *)y + (form == CAVS_PROD_DX ? (size_t)s * (size_t)k * es : 0);
    if (!(has >> s & 1)) {
      BE(c)->gemm_skip(c, skip, r0, n, f, cols, k, xs, ldx, ws, ldw, ys, ldy);
      continue;
    }
    const int *idx = m->kidx + 2 * (size_t)s * (size_t)m->rows, *other = idx + m->rows;
    /* the rows whose child is a looked-up row, each distinct one multiplied once (their
       x is that row: the child's state), then the others, added */
    cavs_gemm_table(c, idx, skip, r0, n, f, cols, k, table, ldt, trows, xs, ldx, ws, ldw, ys, ldy);
    BE(c)->gemm_rows(c, other, skip, r0, n, y_form ? CAVS_PROD_Y_ADD : f, cols, k, xs, ldx, ws, ldw, ys, ldy);
  }
}

/* A type whose gathered buffers are views of the state (scheduler.c, plan_views) copies
   nothing, and adds nothing back: its stages read the children's rows and add to their
   gradients in place. */
static bool viewed(const cavs_ctx *c) { return c->model->cur_type >= 0 && c->model->tview[c->model->cur_type]; }

/* Do the current type's gathered buffers go unread at its rows without children
   (cavs_gather_desc.view)? Then its gathers leave those rows, the first leaf_rows of a
   stage, as they are. */
static bool leaves_unread(const cavs_ctx *c) {
  int t = c->model->cur_type;
  if (t < 0) return false;
  const cavs_vertex_desc *v = &c->desc->vertex[t];
  for (int g = 0; g < v->ngathers; g++)
    if (!v->gathers[g].view) return false;
  return true;
}

/* Dropout's key of each row, from its vertex (queue[r]: the vertex of row r, as
 * number_rows left it), the seed and the step: made once a minibatch, by its first
 * dropout, so that models without one do not pay for them. */
static void cv_drop_keys(cavs_ctx *c) {
  cavs_model *m = c->model;
  if (m->rkey_ready) return;
  for (int r = 0; r < m->rows; r++) m->rkey[r] = cavs_drop_key(m->drop_seed, m->step, m->voff + m->queue[r]);
  m->rkey_ready = true;
}

static void no_dropout(cavs_ctx *c, const char *op) {
  if (!c->model->launch_failed) cv_fail(c->model, "%s() is not built for the %s backend yet", op, c->model->be->name);
  c->model->launch_failed = true;
}
/* p = 0 (an option at 0, an example's default): y = x and dx += dy, which is what the
 * masks compute then (every value kept, times 1), without drawing them. */
static void drop_copy(cavs_ctx *c, const void *src, long lds, void *dst, long ldd, long w, int r0, int n, int add) {
  size_t e = c->model->esize;
  cavs_copy_rows(c, (char *)dst + (size_t)r0 * (size_t)ldd * e, ldd, (const char *)src + (size_t)r0 * (size_t)lds * e,
                 lds, n, w, add);
}
void cavs_dropout_fwd(cavs_ctx *c, unsigned salt, double p, const void *x, long ldx, void *y, long ldy, long w, int r0,
                      int n) {
  DEAD(c);
  if (p == 0) {
    drop_copy(c, x, ldx, y, ldy, w, r0, n, 0);
    return;
  }
  if (c->keep) cv_drop_keys(c); /* (inference draws no mask) */
  if (BE(c)->dropout_fwd) BE(c)->dropout_fwd(c, salt, p, x, ldx, y, ldy, w, r0, n);
  else no_dropout(c, "dropout");
}
void cavs_dropout_bwd(cavs_ctx *c, unsigned salt, double p, const void *dy, long ldy, void *dx, long ldx, long w, int r0,
                      int n) {
  DEAD(c);
  if (p == 0) {
    drop_copy(c, dy, ldy, dx, ldx, w, r0, n, 1);
    return;
  }
  cv_drop_keys(c);
  if (BE(c)->dropout_bwd) BE(c)->dropout_bwd(c, salt, p, dy, ldy, dx, ldx, w, r0, n);
  else no_dropout(c, "dropout");
}
/* noise's draws come from the rows' keys that dropout's masks do (inference draws none) */
void cavs_noise_fwd(cavs_ctx *c, unsigned salt, const void *x, long ldx, void *y, long ldy, long w, int r0, int n) {
  DEAD(c);
  if (c->keep) cv_drop_keys(c);
  if (BE(c)->noise_fwd) BE(c)->noise_fwd(c, salt, x, ldx, y, ldy, w, r0, n);
  else no_dropout(c, "noise");
}
void cavs_noise_bwd(cavs_ctx *c, unsigned salt, const void *dy, long ldy, void *dx, long ldx, long w, int r0, int n) {
  DEAD(c);
  cv_drop_keys(c);
  if (BE(c)->noise_bwd) BE(c)->noise_bwd(c, salt, dy, ldy, dx, ldx, w, r0, n);
  else no_dropout(c, "noise");
}

/* Is any edge of rows [r0, r0 + n) left to copy, once the children at home in their
   edge's row (plan_homes) are left out? */
static bool edges_left(const cavs_ctx *c, int r0, int n) {
  const cavs_model *m = c->model;
  for (int e = c->eoff[r0]; e < c->eoff[r0 + n]; e++)
    if (!cv_at_home(m, m->echild[e], cv_edge_key(m, e))) return true;
  return false;
}
void cavs_echild_fwd(cavs_ctx *c, int state, void *dst, long ld, int r0, int n) {
  DEAD(c);
  if (edges_left(c, r0, n)) BE(c)->echild_fwd(c, state, dst, ld, r0, n);
}
void cavs_echild_bwd(cavs_ctx *c, int state, const void *src, long ld, int r0, int n) {
  DEAD(c);
  if (edges_left(c, r0, n)) BE(c)->echild_bwd(c, state, src, ld, r0, n);
}
void cavs_ebcast_fwd(cavs_ctx *c, const void *src, long lds, void *dst, long ldd, long w, int r0, int n) {
  DEAD(c);
  BE(c)->ebcast_fwd(c, src, lds, dst, ldd, w, r0, n);
}
void cavs_ebcast_bwd(cavs_ctx *c, void *dsrc, long lds, const void *ddst, long ldd, long w, int r0, int n) {
  DEAD(c);
  BE(c)->ebcast_bwd(c, dsrc, lds, ddst, ldd, w, r0, n);
}
void cavs_esum_fwd(cavs_ctx *c, const void *src, long lds, void *dst, long ldd, long w, int r0, int n) {
  DEAD(c);
  BE(c)->esum_fwd(c, src, lds, dst, ldd, w, r0, n);
}
void cavs_esum_bwd(cavs_ctx *c, void *dsrc, long lds, const void *ddst, long ldd, long w, int r0, int n) {
  DEAD(c);
  BE(c)->esum_bwd(c, dsrc, lds, ddst, ldd, w, r0, n);
}

/* Is anything left for the gather of slot k over rows [r0, r0 + n) to do, once the
   children at home there (plan_homes) are left out: a child to copy (or, with zeros, a
   slot without one to clear)? The host's arrays, so a backend launches nothing when
   every child stored itself. */
static bool gather_left(const cavs_ctx *c, int k, int r0, int n, bool zeros) {
  const cavs_model *m = c->model;
  if (!m->nhomes) return n > 0;
  for (int r = r0; r < r0 + n; r++) {
    int ch = m->child[(size_t)r * m->maxc + k];
    if (ch < 0 ? zeros : !cv_at_home(m, ch, (long)r * m->maxc + k)) return true;
  }
  return false;
}

void cavs_gather_fwd(cavs_ctx *c, int k, int state, void *dst, long ld, int r0, int n) {
  DEAD(c);
  if (viewed(c)) return;
  int skip = leaves_unread(c) ? c->leaf_rows : 0;
  if (skip > n) skip = n;
  if (gather_left(c, k, r0 + skip, n - skip, true)) BE(c)->gather_fwd(c, k, state, dst, ld, r0 + skip, n - skip);
}

/* (a viewed type's gradient is the state's, added to in place, but where the buffer's
   is set whole: then it stays in the buffer, and is added back as where it is copied) */
static bool grad_viewed(const cavs_ctx *c, int k) {
  if (!viewed(c)) return false;
  const cavs_vertex_desc *v = &c->desc->vertex[c->model->cur_type];
  for (int g = 0; g < v->ngathers; g++)
    if (v->gathers[g].slot == k) return c->desc->bufs[v->gathers[g].buf].grad == CAVS_GRAD;
  return true;
}
void cavs_gather_bwd(cavs_ctx *c, int k, int state, const void *src, long ld, int r0, int n) {
  DEAD(c);
  if (!grad_viewed(c, k) && gather_left(c, k, r0, n, false)) BE(c)->gather_bwd(c, k, state, src, ld, r0, n);
}

void cavs_lookup_fwd(cavs_ctx *c, const void *table, long ldt, const int *idx, void *dst, long ld, int r0, int n,
                     long width) {
  DEAD(c);
  BE(c)->lookup_fwd(c, table, ldt, idx, dst, ld, r0, n, width);
}

void cavs_lookup_bwd(cavs_ctx *c, void *dtable, long ldt, const int *idx, const void *src, long ld, int r0, int n,
                     long width) {
  DEAD(c);
  BE(c)->lookup_bwd(c, dtable, ldt, idx, src, ld, r0, n, width);
}

void cavs_copy_rows(cavs_ctx *c, void *dst, long ldd, const void *src, long lds, int n, long w, int add) {
  DEAD(c);
  BE(c)->copy_rows(c, dst, ldd, src, lds, n, w, add);
}

void cavs_xent_fwd(cavs_ctx *c, int loss, const void *z, long ld, const int *label, int r0, int n, long w) {
  DEAD(c);
  const cavs_desc *d = c->desc;
  int first = 0;
  while (first < d->nlosses && d->losses[first].kind != CAVS_LOSS_SOFTMAX_XENT) first++;
  if (loss == first) c->model->xent_z = z, c->model->xent_ld = ld, c->model->xent_w = w;
  BE(c)->xent_fwd(c, loss, z, ld, label, r0, n, w);
}

void cavs_xent_bwd(cavs_ctx *c, int loss, const void *z, long ld, const int *label, void *dz, long ldd, int r0,
                   int n, long w) {
  DEAD(c);
  BE(c)->xent_bwd(c, loss, z, ld, label, dz, ldd, r0, n, w);
}

void cavs_mse_fwd(cavs_ctx *c, int loss, const void *p, long ld, const void *t, long ldt, int r0, int n, long w) {
  DEAD(c);
  BE(c)->mse_fwd(c, loss, p, ld, t, ldt, r0, n, w);
}

void cavs_mse_bwd(cavs_ctx *c, int loss, const void *p, long ld, const void *t, long ldt, void *dp, long ldd,
                  int r0, int n, long w) {
  DEAD(c);
  BE(c)->mse_bwd(c, loss, p, ld, t, ldt, dp, ldd, r0, n, w);
}

/* A CUDA target's stage could not launch a kernel: the stage returns nothing, so the
 * model keeps the first such failure, and the forward pass (or step) reports it. Here,
 * not in the module: the generated code resolves it in libcavs, as its other calls. */
void cavs_cuda_launch_failed(cavs_ctx *c, const char *file, int line, int code) {
  DEAD(c);
  cavs_model *m = c->model;
  if (!m->launch_failed)
    snprintf(m->err, sizeof m->err, "cuda: a kernel launch failed (cudaError_t %d) in %s:%d", code, file, line);
  m->launch_failed = true;
}

void cavs_cuda_launched(cavs_ctx *c, const char *file, int line, int code) {
  c->model->stats.launches++;
  if (code) cavs_cuda_launch_failed(c, file, line, code);
}

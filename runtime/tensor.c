/* tensor.c: a model's memory. All parameters in one block with the groups (and the
 * parameters in them) pointing into it, as llm.c does; gradients in a second block of the
 * same layout; per-row buffers for the minibatch, grown to the largest minibatch seen and
 * never shrunk, so steady-state training allocates nothing. */
#include "cv.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

long cv_lin(const cavs_lin *l, const long *dims) {
  long v = l->k;
  for (int i = 0; i < CAVS_MAX_DIMS; i++) v += (long)l->c[i] * dims[i];
  return v;
}

int cv_fail(cavs_model *m, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->err, sizeof m->err, fmt, ap);
  va_end(ap);
  return -1;
}

void *cv_xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) {
    fprintf(stderr, "cavs: out of memory (%zu bytes)\n", n);
    abort();
  }
  return q;
}

void cavs_dims_default(const cavs_desc *d, long *dims) {
  for (int i = 0; i < CAVS_MAX_DIMS; i++) dims[i] = 0;
  for (int i = 0; i < d->ndims; i++) dims[i] = d->dims[i].kind == CAVS_DIM_FIXED ? d->dims[i].value : 0;
}

cavs_model *cavs_model_new(const cavs_desc *d, const long *dims, char *err, size_t errlen) {
  if (d->abi != CAVS_ABI_VERSION) {
    snprintf(err, errlen, "model '%s' was generated for libcavs ABI %d, this is ABI %d", d->name,
             d->abi, CAVS_ABI_VERSION);
    return NULL;
  }
  for (int i = 0; i < d->ndims; i++) {
    long v = dims ? dims[i] : (d->dims[i].kind == CAVS_DIM_FIXED ? d->dims[i].value : 0);
    if (v <= 0 || v > (1L << 28)) {
      snprintf(err, errlen, "dim %s %s", d->dims[i].name,
               v <= 0 ? "has no value (bind it from the data or with --dim)" : "is too large");
      return NULL;
    }
  }
  cavs_model *m = calloc(1, sizeof *m);
  if (!m) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  m->d = d;
  m->esize = d->precision == CAVS_DOUBLE ? 8 : 4;
  cavs_ctx *c = &m->ctx;
  c->desc = d;
  c->model = m;
  for (int i = 0; i < d->ndims; i++) c->dims[i] = dims ? dims[i] : d->dims[i].value;

  m->pg_off = calloc((size_t)d->npgroups + 1, sizeof(size_t));
  m->pg_rows = calloc((size_t)d->npgroups + 1, sizeof(long));
  m->pg_cols = calloc((size_t)d->npgroups + 1, sizeof(long));
  size_t total = 0;
  for (int g = 0; g < d->npgroups; g++) {
    m->pg_off[g] = total;
    m->pg_rows[g] = cv_lin(&d->pgroups[g].rows, c->dims);
    m->pg_cols[g] = cv_lin(&d->pgroups[g].cols, c->dims);
    total += (size_t)m->pg_rows[g] * (size_t)m->pg_cols[g];
    total = (total + 15) & ~(size_t)15; /* 64-byte aligned groups */
  }
  m->nflat = total;
  m->pflat = aligned_alloc(64, (total * m->esize + 63) & ~(size_t)63);
  m->gflat = aligned_alloc(64, (total * m->esize + 63) & ~(size_t)63);
  if (!m->pflat || !m->gflat) {
    snprintf(err, errlen, "out of memory for %zu parameters", total);
    cavs_model_free(m);
    return NULL;
  }
  memset(m->pflat, 0, total * m->esize);
  memset(m->gflat, 0, total * m->esize);
  m->param = calloc((size_t)d->npgroups + 1, sizeof(void *));
  m->pgrad = calloc((size_t)d->npgroups + 1, sizeof(void *));
  for (int g = 0; g < d->npgroups; g++) {
    m->param[g] = (char *)m->pflat + m->pg_off[g] * m->esize;
    m->pgrad[g] = (char *)m->gflat + m->pg_off[g] * m->esize;
  }
  c->param = m->param;
  c->pgrad = m->pgrad;
  m->touched = calloc((size_t)d->npgroups + 1, sizeof(int *));
  m->ntouched = calloc((size_t)d->npgroups + 1, sizeof(int));
  m->mark = calloc((size_t)d->npgroups + 1, sizeof(unsigned char *));
  for (int g = 0; g < d->npgroups; g++)
    if (d->pgroups[g].sparse_input >= 0) {
      m->touched[g] = calloc((size_t)m->pg_rows[g] + 1, sizeof(int));
      m->mark[g] = calloc((size_t)m->pg_rows[g] + 1, 1);
    }
  m->bw = calloc((size_t)d->nbufs + 1, sizeof(long));
  for (int b = 0; b < d->nbufs; b++) m->bw[b] = cv_lin(&d->bufs[b].width, c->dims);
  m->val = calloc((size_t)d->nbufs + 1, sizeof(void *));
  m->grad = calloc((size_t)d->nbufs + 1, sizeof(void *));
  c->val = m->val;
  c->grad = m->grad;
  m->loss = calloc((size_t)d->nlosses + 1, sizeof(cavs_loss_acc));
  c->loss = m->loss;
  m->iin = calloc((size_t)d->nint + 1, sizeof(int *));
  m->rin = calloc((size_t)d->nreal + 1, sizeof(void *));
  m->rw = calloc((size_t)d->nreal + 1, sizeof(long));
  for (int i = 0; i < d->ninputs; i++)
    if (d->inputs[i].kind == CAVS_IN_REAL) m->rw[d->inputs[i].slot] = cv_lin(&d->inputs[i].width, c->dims);
  c->iin = (const int **)m->iin;
  c->rin = (const void **)m->rin;
  m->maxc = 1;
  for (int v = 0; v < d->nvertex; v++)
    if (d->vertex[v].children > m->maxc) m->maxc = d->vertex[v].children;
  c->maxc = m->maxc;
  m->type_r0 = calloc((size_t)d->nvertex + 1, sizeof(int));
  m->type_n = calloc((size_t)d->nvertex + 1, sizeof(int));
  m->type_leaf = calloc((size_t)d->nvertex + 1, sizeof(int));
  c->loss_scale = 1;
  return m;
}

void cavs_model_free(cavs_model *m) {
  if (!m) return;
  const cavs_desc *d = m->d;
  for (int b = 0; b < d->nbufs; b++) {
    free(m->val[b]);
    free(m->grad ? m->grad[b] : NULL);
  }
  for (int i = 0; i < d->nint; i++) free(m->iin[i]);
  for (int i = 0; i < d->nreal; i++) free(m->rin[i]);
  free(m->val); free(m->grad); free(m->bw); free(m->loss);
  free(m->iin); free(m->rin); free(m->rw);
  free(m->pflat); free(m->gflat); free(m->m1); free(m->m2); free(m->spans);
  free(m->pg_off); free(m->pg_rows); free(m->pg_cols); free(m->param); free(m->pgrad);
  free(m->child); free(m->root); free(m->pushed); free(m->pred); free(m->gbase);
  free(m->type_r0); free(m->type_n); free(m->type_leaf);
  free(m->task_r0); free(m->task_n); free(m->task_type); free(m->task_leaf);
  free(m->level); free(m->row_of); free(m->pcount); free(m->padj); free(m->queue); free(m->vtype);
  free(m->count);
  for (int g = 0; g < d->npgroups; g++) {
    free(m->touched ? m->touched[g] : NULL);
    free(m->mark ? m->mark[g] : NULL);
  }
  free(m->touched);
  free(m->ntouched);
  free(m->mark);
  free(m);
}

int cv_grow_rows(cavs_model *m, int rows) {
  if (rows <= m->cap_rows) return 0;
  int cap = m->cap_rows ? m->cap_rows : 256;
  while (cap < rows) cap *= 2;
  const cavs_desc *d = m->d;
  for (int b = 0; b < d->nbufs; b++) {
    size_t bytes = (size_t)cap * (size_t)m->bw[b] * m->esize;
    free(m->val[b]);
    m->val[b] = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (d->bufs[b].grad) {
      free(m->grad[b]);
      m->grad[b] = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    }
    if (!m->val[b] || (d->bufs[b].grad && !m->grad[b])) return cv_fail(m, "out of memory for %d rows", rows);
  }
  for (int i = 0; i < d->nint; i++) m->iin[i] = cv_xrealloc(m->iin[i], sizeof(int) * (size_t)cap);
  for (int i = 0; i < d->nreal; i++)
    m->rin[i] = cv_xrealloc(m->rin[i], (size_t)cap * (size_t)m->rw[i] * m->esize);
  m->child = cv_xrealloc(m->child, sizeof(int) * (size_t)cap * (size_t)m->maxc);
  m->root = cv_xrealloc(m->root, (size_t)cap);
  m->pushed = cv_xrealloc(m->pushed, (size_t)cap);
  m->pred = cv_xrealloc(m->pred, sizeof(int) * (size_t)cap);
  m->cap_rows = cap;
  m->ctx.child = m->child;
  m->ctx.root = m->root;
  m->ctx.pushed = m->pushed;
  m->ctx.pred = m->pred;
  return 0;
}

const cavs_desc *cavs_model_desc(const cavs_model *m) { return m->d; }
const char *cavs_model_error(const cavs_model *m) { return m->err; }
long cavs_model_dim(const cavs_model *m, int dim) { return m->ctx.dims[dim]; }
void cavs_model_set_policy(cavs_model *m, int policy) { m->policy = policy; }

static void *param_at(cavs_model *m, void *const *base, int i, long *rows, long *cols, long *ld) {
  const cavs_param_desc *p = &m->d->params[i];
  long off = cv_lin(&p->col_off, m->ctx.dims);
  if (rows) *rows = cv_lin(&p->rows, m->ctx.dims);
  if (cols) *cols = cv_lin(&p->cols, m->ctx.dims);
  if (ld) *ld = m->pg_cols[p->group];
  return (char *)base[p->group] + (size_t)off * m->esize;
}

void *cavs_model_param(cavs_model *m, int i, long *rows, long *cols, long *ld) {
  return param_at(m, m->param, i, rows, cols, ld);
}

void *cavs_model_grad(cavs_model *m, int i, long *rows, long *cols, long *ld) {
  return param_at(m, m->pgrad, i, rows, cols, ld);
}

void *cavs_model_params_flat(cavs_model *m, size_t *count) {
  *count = m->nflat;
  return m->pflat;
}

void *cavs_model_grads_flat(cavs_model *m, size_t *count) {
  *count = m->nflat;
  return m->gflat;
}

/* ---- initialization: splitmix64, deterministic in the seed and the parameter order ---- */

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) { return (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0); }

void cavs_model_init(cavs_model *m, uint64_t seed) {
  const cavs_desc *d = m->d;
  uint64_t s = seed;
  for (int i = 0; i < d->nparams; i++) {
    const cavs_param_desc *p = &d->params[i];
    long rows, cols, ld;
    void *base = cavs_model_param(m, i, &rows, &cols, &ld);
    double lim = sqrt(6.0 / (double)(rows + cols));
    for (long r = 0; r < rows; r++)
      for (long j = 0; j < cols; j++) {
        double v = 0;
        switch (p->init) {
        case CAVS_INIT_ZEROS: v = 0; break;
        case CAVS_INIT_CONSTANT: v = p->a; break;
        case CAVS_INIT_UNIFORM: v = p->a + (p->b - p->a) * uniform01(&s); break;
        case CAVS_INIT_XAVIER: v = -lim + 2 * lim * uniform01(&s); break;
        case CAVS_INIT_NORMAL: {
          double u1 = uniform01(&s), u2 = uniform01(&s);
          if (u1 < 1e-300) u1 = 1e-300;
          v = p->a + p->b * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
          break;
        }
        }
        size_t at = (size_t)r * (size_t)ld + (size_t)j;
        if (m->esize == 8) ((double *)base)[at] = v;
        else ((float *)base)[at] = (float)v;
      }
  }
  free(m->m1);
  free(m->m2);
  m->m1 = m->m2 = NULL;
  m->step = 0;
}

/* optim.c: one optimizer step: weight decay, global gradient-norm clipping, then SGD,
 * Adagrad or Adam (with bias correction). Dense parameter blocks are updated whole;
 * lookup tables only in the rows the minibatch read (their other rows have a zero
 * gradient), which on SST saves updating 18,000 embedding rows to touch a few hundred. */
#include "cv.h"

#include <stdlib.h>
#include <string.h>

/* Before a backward pass: clear the gradient rows of the lookup tables left from the last
 * one, and list the rows this minibatch reads. */
void cv_sparse_reset(cavs_model *m) {
  const cavs_desc *d = m->d;
  for (int g = 0; g < d->npgroups; g++) {
    int slot = d->pgroups[g].sparse_input;
    if (slot < 0) continue;
    size_t row = (size_t)m->pg_cols[g] * m->esize;
    for (int i = 0; i < m->ntouched[g]; i++) {
      int r = m->touched[g][i];
      memset((char *)m->pgrad[g] + (size_t)r * row, 0, row);
      m->mark[g][r] = 0;
    }
    m->ntouched[g] = 0;
    const int *idx = m->iin[slot];
    for (int r = 0; r < m->rows; r++) {
      int id = idx[r];
      if (id < 0 || id >= m->pg_rows[g] || m->mark[g][id]) continue;
      m->mark[g][id] = 1;
      m->touched[g][m->ntouched[g]++] = id;
    }
  }
}

typedef struct Span {
  size_t off, len; /* in scalars, within the flat block */
} Span;

/* The parts of the flat block this step changes (in an array that only grows: a
 * steady-state step allocates nothing). */
static Span *spans(cavs_model *m, int *count) {
  const cavs_desc *d = m->d;
  int n = 0;
  for (int g = 0; g < d->npgroups; g++) n += d->pgroups[g].sparse_input >= 0 ? m->ntouched[g] : 1;
  if (n > m->capspans) return NULL; /* cavs_model_new made room for every group and row */
  Span *s = m->spans;
  n = 0;
  for (int g = 0; g < d->npgroups; g++) {
    size_t cols = (size_t)m->pg_cols[g];
    if (d->pgroups[g].sparse_input < 0) {
      s[n++] = (Span){m->pg_off[g], (size_t)m->pg_rows[g] * cols};
      continue;
    }
    for (int i = 0; i < m->ntouched[g]; i++)
      s[n++] = (Span){m->pg_off[g] + (size_t)m->touched[g][i] * cols, cols};
  }
  *count = n;
  return s;
}

#define STEP(T)                                                                            \
  do {                                                                                     \
    T *P = (T *)m->pflat, *G = (T *)m->gflat, *M1 = (T *)m->m1, *M2 = (T *)m->m2;           \
    double norm2 = 0, scale = 1;                                                           \
    for (int k = 0; k < ns; k++) {                                                         \
      T *p = P + sp[k].off, *g = G + sp[k].off;                                            \
      if (o->weight_decay)                                                                 \
        for (size_t i = 0; i < sp[k].len; i++) g[i] += (T)(o->weight_decay * p[i]);        \
      if (o->clip > 0)                                                                     \
        for (size_t i = 0; i < sp[k].len; i++) norm2 += (double)g[i] * g[i];               \
    }                                                                                      \
    if (o->clip > 0 && sqrt(norm2) > o->clip) scale = o->clip / sqrt(norm2);                \
    double c1 = 1 - pow(b1, (double)m->step), c2 = 1 - pow(b2, (double)m->step);            \
    T lr = (T)o->lr, sc = (T)scale;                                                        \
    for (int k = 0; k < ns; k++) {                                                         \
      T *p = P + sp[k].off, *g = G + sp[k].off, *m1 = M1 + sp[k].off, *m2 = M2 + sp[k].off;  \
      size_t len = sp[k].len;                                                              \
      switch (o->kind) {                                                                   \
      case CAVS_SGD:                                                                       \
        for (size_t i = 0; i < len; i++) p[i] -= lr * sc * g[i];                           \
        break;                                                                             \
      case CAVS_ADAGRAD:                                                                   \
        for (size_t i = 0; i < len; i++) {                                                 \
          T gi = sc * g[i];                                                                \
          m1[i] += gi * gi;                                                                \
          p[i] -= lr * gi / (T)(sqrt((double)m1[i]) + eps);                                \
        }                                                                                  \
        break;                                                                             \
      default: {                                                                           \
        T a1 = (T)b1, a2 = (T)b2, ic1 = (T)(1 / c1), ic2 = (T)(1 / c2), e = (T)eps;          \
        for (size_t i = 0; i < len; i++) {                                                 \
          T gi = sc * g[i];                                                                \
          m1[i] = a1 * m1[i] + (1 - a1) * gi;                                              \
          m2[i] = a2 * m2[i] + (1 - a2) * gi * gi;                                         \
          p[i] -= lr * (m1[i] * ic1) / (SQRT(m2[i] * ic2) + e);                              \
        }                                                                                  \
      }                                                                                    \
      }                                                                                    \
    }                                                                                      \
  } while (0)

static const struct {
  const char *name;
  double lr; /* the default learning rate */
} optims[] = {
    [CAVS_SGD] = {"sgd", 0.05},
    [CAVS_ADAGRAD] = {"adagrad", 0.05},
    [CAVS_ADAM] = {"adam", 1e-3},
};
_Static_assert(sizeof optims / sizeof *optims == CAVS_OPTIM_COUNT, "one row per optimizer");

const char *cavs_optim_name(int kind) { return kind >= 0 && kind < CAVS_OPTIM_COUNT ? optims[kind].name : NULL; }

int cavs_optim_kind(const char *name) {
  for (int k = 0; k < CAVS_OPTIM_COUNT; k++)
    if (!strcmp(name, optims[k].name)) return k;
  return -1;
}

double cavs_optim_default_lr(int kind) { return kind >= 0 && kind < CAVS_OPTIM_COUNT ? optims[kind].lr : 0; }

int cavs_model_step(cavs_model *m, const cavs_optim *o) {
  size_t n = m->nflat;
  if (!m->m1) {
    /* counted in the model's memory from the start, so this fits under the limit */
    m->m1 = calloc(n + 1, m->esize);
    m->m2 = calloc(n + 1, m->esize);
    if (!m->m1 || !m->m2) {
      free(m->m1);
      free(m->m2);
      m->m1 = m->m2 = NULL;
      return cv_fail_mem(m, "out of memory for the optimizer's state (%zu values)", 2 * n);
    }
  }
  m->step++;
  double b1 = o->beta1 ? o->beta1 : 0.9, b2 = o->beta2 ? o->beta2 : 0.999;
  double eps = o->eps ? o->eps : (o->kind == CAVS_ADAGRAD ? 1e-10 : 1e-8);
  int ns;
  Span *sp = spans(m, &ns);
  if (!sp) return cv_fail(m, "internal error: more optimizer spans than the model made room for");
  if (m->esize == 8) {
#define SQRT sqrt
    STEP(double);
#undef SQRT
  } else {
#define SQRT sqrtf
    STEP(float);
#undef SQRT
  }
  return 0;
}

/* optim.c: one optimizer step over the flat parameter block: weight decay, global
 * gradient-norm clipping, then SGD, Adagrad or Adam (with bias correction). */
#include "cv.h"

#include <stdlib.h>
#include <string.h>

#define STEP(T)                                                                            \
  do {                                                                                     \
    T *p = (T *)m->pflat, *g = (T *)m->gflat, *m1 = (T *)m->m1, *m2 = (T *)m->m2;           \
    double norm2 = 0;                                                                      \
    if (o->weight_decay)                                                                   \
      for (size_t i = 0; i < n; i++) g[i] += (T)(o->weight_decay * p[i]);                  \
    if (o->clip > 0) {                                                                     \
      for (size_t i = 0; i < n; i++) norm2 += (double)g[i] * g[i];                         \
      double norm = sqrt(norm2);                                                           \
      if (norm > o->clip)                                                                  \
        for (size_t i = 0; i < n; i++) g[i] *= (T)(o->clip / norm);                        \
    }                                                                                      \
    switch (o->kind) {                                                                     \
    case CAVS_SGD:                                                                         \
      for (size_t i = 0; i < n; i++) p[i] -= (T)(o->lr * g[i]);                            \
      break;                                                                               \
    case CAVS_ADAGRAD:                                                                     \
      for (size_t i = 0; i < n; i++) {                                                     \
        m1[i] += g[i] * g[i];                                                              \
        p[i] -= (T)(o->lr * g[i] / (sqrt((double)m1[i]) + eps));                           \
      }                                                                                    \
      break;                                                                               \
    default: {                                                                             \
      double c1 = 1 - pow(b1, (double)m->step), c2 = 1 - pow(b2, (double)m->step);          \
      for (size_t i = 0; i < n; i++) {                                                     \
        m1[i] = (T)(b1 * m1[i] + (1 - b1) * g[i]);                                         \
        m2[i] = (T)(b2 * m2[i] + (1 - b2) * g[i] * g[i]);                                  \
        p[i] -= (T)(o->lr * (m1[i] / c1) / (sqrt(m2[i] / c2) + eps));                      \
      }                                                                                    \
    }                                                                                      \
    }                                                                                      \
  } while (0)

void cavs_model_step(cavs_model *m, const cavs_optim *o) {
  size_t n = m->nflat;
  if (!m->m1) {
    m->m1 = calloc(n + 1, m->esize);
    m->m2 = calloc(n + 1, m->esize);
    if (!m->m1 || !m->m2) abort();
  }
  m->step++;
  double b1 = o->beta1 ? o->beta1 : 0.9, b2 = o->beta2 ? o->beta2 : 0.999;
  double eps = o->eps ? o->eps : (o->kind == CAVS_ADAGRAD ? 1e-10 : 1e-8);
  if (m->esize == 8) STEP(double);
  else STEP(float);
}

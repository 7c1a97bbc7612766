/* arith.h: the arithmetic every backend shares, one element at a time, so a value on
 * the CPU and on a GPU comes from the same formula: the optimizer updates, the loss
 * gradients, and the span an optimizer's element is in. (Which row and column a GPU
 * thread takes is cavs_cuda_cell, in cavs_abi.h: generated kernels use it too.) CAVS_HD functions (cavs_abi.h): the CPU backend calls them in its loops
 * (kernels.h), a CUDA backend in its kernels; the tests run them on the CPU. Written
 * once for float and once for double by CV_ARITH. */
#ifndef CV_ARITH_H
#define CV_ARITH_H

#include "cavs_abi.h"

/* The span of a flat index i among spans laid end to end (start[k] = where span k
 * begins in the concatenation, start[ns] = the total): the k with start[k] <= i <
 * start[k+1], by bisection. */
static inline CAVS_HD int cv_span_of(const size_t *start, int ns, size_t i) {
  int lo = 0, hi = ns; /* start[lo] <= i < start[hi] */
  while (hi - lo > 1) {
    int mid = lo + (hi - lo) / 2;
    if (start[mid] <= i) lo = mid;
    else hi = mid;
  }
  return lo;
}

/* Global-norm clipping: what the gradients are scaled by, given the sum of their squares
 * and the clip (0: none). On a GPU each thread of the update computes it from the norm
 * the device summed, so that the host need not read the norm back. */
static inline CAVS_HD double cv_clip_scale(double norm2, double clip) {
  return clip > 0 && sqrt(norm2) > clip ? clip / sqrt(norm2) : 1;
}

/* A moment that has decayed below the smallest normal number is taken as zero. A
 * parameter whose gradient stays zero (a dead unit, an expert that gets no rows) has its
 * moments multiplied by b1 (and b2, or mu) step after step: 0.9 of the smallest
 * subnormal rounds back to it, so without the flush such a moment sinks into the
 * subnormals in about 800 steps and stays there, and on an Intel Xeon an instruction
 * with a subnormal operand or result takes a microcode assist: a model's whole step
 * took 15 times as long from then on (bench/steps, bench/README). The flush changes an
 * update by at most about lr / e times the smallest normal number (1e-33 at Adam's
 * defaults), under a parameter's rounding unless the parameter is below about 1e-25.
 * Written as compares, so that the CPU's loops stay vector code and a GPU computes
 * the same values. */
#define CV_ARITH_FLUSH(R, S)                                                                     \
  static inline CAVS_HD R cv_flush_##S(R m) { return m < CV_ARITH_TINY_##S && m > -CV_ARITH_TINY_##S ? (R)0 : m; }

#define CV_ARITH(R, S)                                                                           \
  /* SGD: p -= lr g */                                                                          \
  static inline CAVS_HD void cv_sgd_##S(R *p, R g, R lr) { *p -= lr * g; }                       \
  /* Adagrad: the squares summed in m1 */                                                       \
  static inline CAVS_HD void cv_adagrad_##S(R *p, R *m1, R g, R lr, R e) {                    \
    *m1 += g * g;                                                                               \
    *p -= lr * g / (CV_ARITH_SQRT_##S(*m1) + e);                                                \
  }                                                                                             \
  /* Adam with bias correction: ic1 = 1/(1 - b1^t), ic2 = 1/(1 - b2^t) */                       \
  static inline CAVS_HD void cv_adam_##S(R *p, R *m1, R *m2, R g, R lr, R a1, R a2, R ic1, R ic2, \
                                         R e) {                                                 \
    *m1 = cv_flush_##S(a1 * *m1 + (1 - a1) * g);                                                \
    *m2 = cv_flush_##S(a2 * *m2 + (1 - a2) * g * g);                                            \
    *p -= lr * (*m1 * ic1) / (CV_ARITH_SQRT_##S(*m2 * ic2) + e);                                \
  }                                                                                             \
  /* Momentum (PyTorch's SGD, no dampening): the buffer in m1 */                               \
  static inline CAVS_HD void cv_momentum_##S(R *p, R *m1, R g, R lr, R mu) {                    \
    *m1 = cv_flush_##S(mu * *m1 + g);                                                           \
    *p -= lr * *m1;                                                                             \
  }                                                                                             \
  /* Nesterov (PyTorch's SGD with nesterov): a step along the gradient and the new buffer */   \
  static inline CAVS_HD void cv_nesterov_##S(R *p, R *m1, R g, R lr, R mu) {                    \
    *m1 = cv_flush_##S(mu * *m1 + g);                                                           \
    *p -= lr * (g + mu * *m1);                                                                  \
  }                                                                                             \
  /* AdamW: Adam's step and the decay wd of the parameter as it was, apart from g */           \
  static inline CAVS_HD void cv_adamw_##S(R *p, R *m1, R *m2, R g, R lr, R a1, R a2, R ic1, R ic2, \
                                          R e, R wd) {                                          \
    *m1 = cv_flush_##S(a1 * *m1 + (1 - a1) * g);                                                \
    *m2 = cv_flush_##S(a2 * *m2 + (1 - a2) * g * g);                                            \
    *p -= lr * ((*m1 * ic1) / (CV_ARITH_SQRT_##S(*m2 * ic2) + e) + wd * *p);                    \
  }                                                                                             \
  /* d(mean squared error)/dp of one element: scale = loss_scale * 2 / (count * width) */      \
  static inline CAVS_HD R cv_mse_grad_##S(R p, R t, double scale) {                            \
    return (R)(scale * ((double)p - (double)t));                                                \
  }

/* esum's cell (children as a set): row r's edges [eoff[r], eoff[r + 1]) at column j,
   added in edge order, on the CPU and in the CUDA kernel alike (the same bits) */
#define CV_ESUM(R, S)                                                                            \
  static inline CAVS_HD R cv_esum_cell_##S(const R *src, long lds, const int *eoff, long r, long j) { \
    R s = 0;                                                                                    \
    for (int e = eoff[r]; e < eoff[r + 1]; e++) s += src[(size_t)e * (size_t)lds + (size_t)j];  \
    return s;                                                                                   \
  }
CV_ESUM(float, f)
CV_ESUM(double, d)
#ifdef __cplusplus
static inline CAVS_HD float cv_esum_cell(const float *s, long l, const int *o, long r, long j) { return cv_esum_cell_f(s, l, o, r, j); }
static inline CAVS_HD double cv_esum_cell(const double *s, long l, const int *o, long r, long j) { return cv_esum_cell_d(s, l, o, r, j); }
#endif

#define CV_ARITH_SQRT_f sqrtf
#define CV_ARITH_SQRT_d sqrt
#define CV_ARITH_TINY_f 1.17549435e-38f         /* FLT_MIN */
#define CV_ARITH_TINY_d 2.2250738585072014e-308 /* DBL_MIN */
CV_ARITH_FLUSH(float, f)
CV_ARITH_FLUSH(double, d)
CV_ARITH(float, f)
CV_ARITH(double, d)

#endif

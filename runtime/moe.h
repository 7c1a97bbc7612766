/* moe.h: a mixture of experts' routing and arithmetic as every backend runs it, so that
 * the cpu backend (moe.c) and the cuda backend (backend_cuda.cu, which includes this
 * file) route the same rows to the same experts and compute the same values.
 *
 * A stage's routing: each row's K largest gate values (the lower index first among
 * equals, a NaN never over a number), the softmax of the kept values, and a counting
 * sort of the stage's K n choices by expert, stable in row order, which numbers its
 * slots so that each expert's are contiguous (moe.c's head comment). The cpu backend
 * runs cv_topk_route below; the cuda backend runs the rows' part (cv_topk_row, a GPU
 * thread a row) and the same counting sort in parallel on the device (backend_cuda.cu,
 * "routed on the device"), the same slots. The backward pass's gate gradient is a
 * row's work (CAVS_HD: a GPU thread's or a CPU loop's). */
#ifndef CV_MOE_H
#define CV_MOE_H

#include "cv.h"

#include <math.h>
#include <string.h>

/* The slots of rows [r0, r0 + n): those of the routings that grouped them, K a row. A
 * backward pass runs a stage over the forward's rows, but the push block's over those
 * with a label only (scheduler.c, target_rows), which may cut a routing's rows in two:
 * then the range is the whole of the routings that its rows were in, the others' slots'
 * gradients zero. */
static inline void cv_slot_range(const struct cv_route *rt, int K, int r0, int n, long *s0, long *sn) {
  if (n <= 0) {
    *s0 = (long)K * r0, *sn = 0;
    return;
  }
  long a = rt->rbeg[r0], b = rt->rend[r0 + n - 1];
  *s0 = (long)K * a, *sn = (long)K * (b - a);
}

/* The balancing loss's scale on the gate's gradient, bal X / N times the loss scale (0:
 * none), N the rows the forward pass routed */
static inline double cv_balance_scale(const struct cv_route *rt, long X, double bal, double loss_scale) {
  return bal > 0 && rt->aux_rows ? bal * (double)X / (double)rt->aux_rows * loss_scale : 0;
}
/* The balancing loss's summed probabilities: a stage's rows are cut into tiles of
 * CV_PSUM_ROWS (from its first row), each tile's probabilities summed in row order from
 * its first row's, and the tiles' sums added to the pass's in tile order. Both backends
 * add in this order (a GPU thread a tile and expert, then a thread an expert over the
 * tiles: n / CV_PSUM_ROWS additions in a row where a thread an expert over the rows was
 * n), so the loss has the same bits on either. */
enum { CV_PSUM_ROWS = 256 };

/* f[0..X): the share of the forward pass's slots each expert received */
static inline void cv_balance_shares(const struct cv_route *rt, int K, long X, double *f) {
  for (long j = 0; j < X; j++) f[j] = (double)rt->pcnt[j] / ((double)K * rt->aux_rows);
}

/* The dot product of two rows of w values (a slot's value and its row's gradient:
 * scomb's gradient of the kept weight): eight partial sums, each in column order, added
 * in one fixed order, so that a CPU's vector lanes compute it and a GPU thread gets the
 * same bits. */
#define CV_SLOT_DOT(R, S)                                                                                              \
  static inline CAVS_HD R cv_slot_dot_##S(const R *a, const R *b, long w) {                                          \
    R p0 = 0, p1 = 0, p2 = 0, p3 = 0, p4 = 0, p5 = 0, p6 = 0, p7 = 0;                                                 \
    long j = 0;                                                                                                      \
    for (; j + 8 <= w; j += 8) {                                                                                     \
      p0 += a[j] * b[j], p1 += a[j + 1] * b[j + 1], p2 += a[j + 2] * b[j + 2], p3 += a[j + 3] * b[j + 3];            \
      p4 += a[j + 4] * b[j + 4], p5 += a[j + 5] * b[j + 5], p6 += a[j + 6] * b[j + 6], p7 += a[j + 7] * b[j + 7];    \
    }                                                                                                                \
    R s = ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7));                                                         \
    for (; j < w; j++) s += a[j] * b[j];                                                                             \
    return s;                                                                                                        \
  }
CV_SLOT_DOT(float, f)
CV_SLOT_DOT(double, d)
#ifdef __cplusplus
static inline CAVS_HD float cv_slot_dot(const float *a, const float *b, long w) { return cv_slot_dot_f(a, b, w); }
static inline CAVS_HD double cv_slot_dot(const double *a, const double *b, long w) { return cv_slot_dot_d(a, b, w); }
#endif

/* An activation an expert's product applies as it stores (CAVS_ACT_*, cavs_emm_fwd's
 * act), and the gradient of its input from g, its output's, and y, its output
 * (cavs_emm_bwd's dx_act): the operations of the generated loop it stands for, in its
 * order (ops.def's FWD and DA rules, cv_sigmoid and cv_tanh as emit_c_prologue names
 * them; relu's rule `a > 0` is `y > 0`). */
#define CV_ACT(R, S, SIGMOID, TANH)                                                                                    \
  static inline CAVS_HD R cv_act_##S(int act, R a) {                                                                 \
    return act == CAVS_ACT_RELU ? (a > 0 ? a : 0) : act == CAVS_ACT_TANH ? TANH(a) : act == CAVS_ACT_SIGMOID ? SIGMOID(a) : a; \
  }                                                                                                                  \
  static inline CAVS_HD R cv_act_grad_##S(int act, R y, R g) {                                                       \
    return act == CAVS_ACT_RELU ? (y > 0 ? g : 0) : act == CAVS_ACT_TANH ? g * (1 - y * y)                           \
         : act == CAVS_ACT_SIGMOID ? g * y * (1 - y) : g;                                                            \
  }
CV_ACT(float, f, cavs_sigmoid_f, cavs_tanh_f)
CV_ACT(double, d, cavs_sigmoid_d, tanh)
/* The same over a row of n values, c = act(c), or with grad c = the input's gradient from
   c and y: a loop for each activation, which the compiler makes vector code of (one loop
   choosing the activation at each value, scalar code, made bench/moe-builds' moe2 epoch
   4-7% longer at 1 thread on a Zen 4 than the generated loop it stands for) */
#define CV_ACT_ROW(R, S, SIGMOID, TANH)                                                                                \
  static inline void cv_act_row_##S(int act, bool grad, R *restrict c, const R *restrict y, long n) {                \
    switch (act) {                                                                                                   \
    case CAVS_ACT_RELU:                                                                                              \
      if (grad)                                                                                                      \
        for (long j = 0; j < n; j++) c[j] = y[j] > 0 ? c[j] : 0;                                                     \
      else                                                                                                           \
        for (long j = 0; j < n; j++) c[j] = c[j] > 0 ? c[j] : 0;                                                     \
      break;                                                                                                         \
    case CAVS_ACT_TANH:                                                                                              \
      if (grad)                                                                                                      \
        for (long j = 0; j < n; j++) c[j] = c[j] * (1 - y[j] * y[j]);                                                \
      else                                                                                                           \
        for (long j = 0; j < n; j++) c[j] = TANH(c[j]);                                                              \
      break;                                                                                                         \
    case CAVS_ACT_SIGMOID:                                                                                           \
      if (grad)                                                                                                      \
        for (long j = 0; j < n; j++) c[j] = c[j] * y[j] * (1 - y[j]);                                                \
      else                                                                                                           \
        for (long j = 0; j < n; j++) c[j] = SIGMOID(c[j]);                                                           \
      break;                                                                                                         \
    default: break;                                                                                                  \
    }                                                                                                                \
  }
#ifndef __cplusplus /* (the cpu's: a GPU thread does a value) */
CV_ACT_ROW(float, f, cavs_sigmoid_f, cavs_tanh_f)
CV_ACT_ROW(double, d, cavs_sigmoid_d, tanh)
#endif
#ifdef __cplusplus
static inline CAVS_HD float cv_act(int act, float a) { return cv_act_f(act, a); }
static inline CAVS_HD double cv_act(int act, double a) { return cv_act_d(act, a); }
static inline CAVS_HD float cv_act_grad(int act, float y, float g) { return cv_act_grad_f(act, y, g); }
static inline CAVS_HD double cv_act_grad(int act, double y, double g) { return cv_act_grad_d(act, y, g); }
#endif

/* One row's routing, a CPU loop's or a GPU thread's work (the cuda backend routes on the
 * device, a thread a row): p = softmax(g[0..X)) in double (the balancing loss's), and
 * the row's K choices ch[0..K) (its experts of largest gate value, the lower index
 * first among equals, a NaN never taken over a number) with its kept weights wr (0 but
 * at the choices: the softmax of their gate values). */
#define CV_MOE_ROW(R, S)                                                                                               \
  static inline CAVS_HD void cv_full_softmax_##S(const R *g, long X, double *p) {                                    \
    double top = (double)g[0], z = 0;                                                                                \
    for (long j = 1; j < X; j++) top = (double)g[j] > top ? (double)g[j] : top;                                      \
    for (long j = 0; j < X; j++) z += p[j] = exp((double)g[j] - top);                                                \
    for (long j = 0; j < X; j++) p[j] /= z;                                                                          \
  }                                                                                                                  \
  static inline CAVS_HD void cv_topk_row_##S(int K, long X, const R *gr, R *wr, int *ch) {                           \
    for (long j = 0; j < X; j++) wr[j] = 0;                                                                          \
    for (int k = 0; k < K; k++) {                                                                                    \
      long best = -1;                                                                                                \
      for (long j = 0; j < X; j++) {                                                                                 \
        bool taken = false;                                                                                          \
        for (int q = 0; q < k && !taken; q++) taken = ch[q] == j;                                                    \
        if (!taken && (best < 0 || gr[j] > gr[best] || (isnan(gr[best]) && !isnan(gr[j])))) best = j;              \
      }                                                                                                              \
      ch[k] = (int)best;                                                                                             \
    }                                                                                                                \
    /* the softmax of the K kept values (the first is their largest) */                                              \
    double top = (double)gr[ch[0]], sum = 0, e[CV_MAX_K];                                                            \
    for (int k = 0; k < K; k++) sum += e[k] = exp((double)gr[ch[k]] - top);                                          \
    for (int k = 0; k < K; k++) wr[ch[k]] = (R)(e[k] / sum);                                                         \
  }
CV_MOE_ROW(float, f)
CV_MOE_ROW(double, d)
#ifdef __cplusplus
static inline CAVS_HD void cv_full_softmax(const float *g, long X, double *p) { cv_full_softmax_f(g, X, p); }
static inline CAVS_HD void cv_full_softmax(const double *g, long X, double *p) { cv_full_softmax_d(g, X, p); }
static inline CAVS_HD void cv_topk_row(int K, long X, const float *gr, float *wr, int *ch) {
  cv_topk_row_f(K, X, gr, wr, ch);
}
static inline CAVS_HD void cv_topk_row(int K, long X, const double *gr, double *wr, int *ch) {
  cv_topk_row_d(K, X, gr, wr, ch);
}
#endif

#define CV_MOE_ROUTING(R, S)                                                                                           \
  /* The routing of rows r0 .. r0+n-1, whose gate values g0 and kept weights w0 (row r0   \
     first, ld apart) are host memory: w0's rows written (0 but at a row's K choices),     \
     the route's arrays filled, its loads and the balancing loss's sums counted */         \
  static inline void cv_topk_route_##S(struct cv_route *rt, unsigned pass, int K, long X, double bal, const R *g0,   \
                                       long ldg, R *w0, long ldw, int r0, int n) {                                   \
    long *cnt = rt->cnt;                                                                                             \
    memset(cnt, 0, sizeof(long) * (size_t)(X + 1));                                                                  \
    if (rt->pass != pass) { /* the pass's first stage: the balancing loss's sums from 0 */                            \
      rt->pass = pass, rt->aux_rows = 0, rt->bal = bal, rt->nx_pass = X, rt->K = K;                                  \
      memset(rt->pcnt, 0, sizeof(long) * (size_t)X);                                                                 \
      memset(rt->psum, 0, sizeof(double) * (size_t)X);                                                               \
    }                                                                                                                \
    rt->stages++;                                                                                                    \
    for (int i = 0; i < n; i++) {                                                                                    \
      const R *gr = g0 + (size_t)i * (size_t)ldg;                                                                    \
      if (bal > 0) {                                                                                                 \
        double *p = rt->scr, *tsum = rt->scr + X; /* the row's softmax; its tile's sum */                            \
        cv_full_softmax_##S(gr, X, p);                                                                               \
        if (i % CV_PSUM_ROWS == 0) memcpy(tsum, p, sizeof(double) * (size_t)X);                                      \
        else                                                                                                         \
          for (long j = 0; j < X; j++) tsum[j] += p[j];                                                              \
        if (i % CV_PSUM_ROWS == CV_PSUM_ROWS - 1 || i == n - 1)                                                      \
          for (long j = 0; j < X; j++) rt->psum[j] += tsum[j];                                                       \
      }                                                                                                              \
      int *ch = rt->rslot + (size_t)K * (size_t)(r0 + i); /* the choices, for now; their slots below */              \
      cv_topk_row_##S(K, X, gr, w0 + (size_t)i * (size_t)ldw, ch);                                                   \
      for (int k = 0; k < K; k++) cnt[ch[k] + 1]++;                                                                  \
    }                                                                                                                \
    for (int r = r0; r < r0 + n; r++) rt->rbeg[r] = r0, rt->rend[r] = r0 + n;                                      \
    /* the balancing loss's sums over the pass: each expert's slots and gate probability */                          \
    if (bal > 0) {                                                                                                   \
      for (long j = 0; j < X; j++) rt->pcnt[j] += cnt[j + 1];                                                        \
      rt->aux_rows += n;                                                                                             \
    }                                                                                                                \
    for (long j = 0; j < X; j++) rt->load[j] += cnt[j + 1];                                                          \
    for (long j = 1; j <= X; j++) cnt[j] += cnt[j - 1]; /* cnt[e]: expert e's first slot past K r0 */                \
    long s0 = (long)K * r0;                                                                                          \
    for (int r = r0; r < r0 + n; r++)                                                                                \
      for (int k = 0; k < K; k++) {                                                                                  \
        int ex = rt->rslot[(size_t)K * (size_t)r + (size_t)k];                                                       \
        long s = s0 + cnt[ex]++;                                                                                     \
        rt->sexp[s] = ex;                                                                                            \
        rt->srow[s] = r;                                                                                             \
        rt->rslot[(size_t)K * (size_t)r + (size_t)k] = (int)s;                                                       \
      }                                                                                                              \
  }                                                                                                                  \
  /* Row r's gradient of the gate, added to dgr: the balancing loss's (scale != 0;         \
     dg_j += scale p_j (f_j - sum_e f_e p_e), p the softmax of the whole row, recomputed   \
     rather than kept so that a GPU thread needs no scratch), then the kept weights'       \
     softmax's (sl: the row's slots, sexp: each slot's expert) */                          \
  static inline CAVS_HD void cv_topk_bwd_row_##S(int K, long X, double scale, const double *f, const R *gr,          \
                                                 const R *wr, const R *dwr, R *dgr, const int *sl,                   \
                                                 const int *sexp) {                                                  \
    if (scale != 0) {                                                                                                \
      double top = (double)gr[0], z = 0, fp = 0;                                                                     \
      for (long j = 1; j < X; j++) top = (double)gr[j] > top ? (double)gr[j] : top;                                  \
      for (long j = 0; j < X; j++) z += exp((double)gr[j] - top);                                                    \
      for (long j = 0; j < X; j++) fp += f[j] * (exp((double)gr[j] - top) / z);                                      \
      for (long j = 0; j < X; j++) dgr[j] += (R)(scale * (exp((double)gr[j] - top) / z) * (f[j] - fp));              \
    }                                                                                                                \
    R dot = 0;                                                                                                       \
    for (int k = 0; k < K; k++) {                                                                                    \
      int ex = sexp[sl[k]];                                                                                          \
      dot += wr[ex] * dwr[ex];                                                                                       \
    }                                                                                                                \
    for (int k = 0; k < K; k++) {                                                                                    \
      int ex = sexp[sl[k]];                                                                                          \
      dgr[ex] += wr[ex] * (dwr[ex] - dot);                                                                           \
    }                                                                                                                \
  }

CV_MOE_ROUTING(float, f)
CV_MOE_ROUTING(double, d)
#ifdef __cplusplus
static inline void cv_topk_route(struct cv_route *rt, unsigned pass, int K, long X, double bal, const float *g0, long ldg,
                                 float *w0, long ldw, int r0, int n) {
  cv_topk_route_f(rt, pass, K, X, bal, g0, ldg, w0, ldw, r0, n);
}
static inline void cv_topk_route(struct cv_route *rt, unsigned pass, int K, long X, double bal, const double *g0, long ldg,
                                 double *w0, long ldw, int r0, int n) {
  cv_topk_route_d(rt, pass, K, X, bal, g0, ldg, w0, ldw, r0, n);
}
static inline CAVS_HD void cv_topk_bwd_row(int K, long X, double scale, const double *f, const float *gr, const float *wr,
                                           const float *dwr, float *dgr, const int *sl, const int *sexp) {
  cv_topk_bwd_row_f(K, X, scale, f, gr, wr, dwr, dgr, sl, sexp);
}
static inline CAVS_HD void cv_topk_bwd_row(int K, long X, double scale, const double *f, const double *gr, const double *wr,
                                           const double *dwr, double *dgr, const int *sl, const int *sexp) {
  cv_topk_bwd_row_d(K, X, scale, f, gr, wr, dwr, dgr, sl, sexp);
}
#endif

#endif

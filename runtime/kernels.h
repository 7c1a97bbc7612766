/* kernels.h: the CPU backend's kernels, written once and instantiated for float and for
 * double by backend_cpu.c (#define R, CV_NAME and CV_EXP, then #include). The row
 * kernels run over rows [r0, r0 + n) of the minibatch. The per-element formulas every
 * backend shares (optimizer updates, loss gradients) are arith.h's.
 *
 * The kernels that compute over every parameter or every row (the optimizer step, the
 * losses, the finiteness check, the gathers, lookups and row copies and their backward
 * sums) are CV_HOT (cv.h). */
#include "cv.h"

/* A child at home in this slot (hkey, plan_homes) stored itself there: nothing to copy
   forward, nothing to add back (its loops read the gradient there) */
CV_HOT static void CV_NAME(gather_fwd)(cavs_ctx *c, int k, int state, R *dst, long ld, int r0, int n) {
  const cavs_desc *d = c->desc;
  const R *S = (const R *)c->val[state];
  long w = cv_lin(&d->bufs[state].width, c->dims);
  for (int r = r0; r < r0 + n; r++) {
    int ch = c->child[(size_t)r * c->maxc + k];
    R *o = dst + (size_t)r * ld;
    if (ch < 0) memset(o, 0, sizeof(R) * (size_t)w);
    else if (!cv_at_home(c->model, ch, (long)r * c->maxc + k)) memcpy(o, S + (size_t)ch * w, sizeof(R) * (size_t)w);
  }
}

/* columns [j0, j1) of the state's (j1 < 0: all of them); two parents may share a child,
   so threads split this by columns, not rows */
CV_HOT static void CV_NAME(gather_bwd)(cavs_ctx *c, int k, int state, const R *src, long ld, int r0, int n, long j0,
                                       long j1) {
  const cavs_desc *d = c->desc;
  R *dS = (R *)c->grad[state];
  long w = cv_lin(&d->bufs[state].width, c->dims);
  if (j1 < 0) j1 = w;
  for (int r = r0; r < r0 + n; r++) {
    int ch = c->child[(size_t)r * c->maxc + k];
    if (ch < 0 || cv_at_home(c->model, ch, (long)r * c->maxc + k)) continue;
    const R *s = src + (size_t)r * ld;
    R *o = dS + (size_t)ch * w;
    for (long j = j0; j < j1; j++) o[j] += s[j];
  }
}

CV_HOT static void CV_NAME(lookup_fwd)(const R *table, long ldt, const int *idx, R *dst, long ld, int r0,
                                int n, long w) {
  for (int r = r0; r < r0 + n; r++) {
    R *o = dst + (size_t)r * ld;
    if (idx[r] < 0) memset(o, 0, sizeof(R) * (size_t)w);
    else memcpy(o, table + (size_t)idx[r] * ldt, sizeof(R) * (size_t)w);
  }
}

/* The same where the rows without an index are left as they are (CAVS_PROD_Y_OPEN's) */
CV_HOT static void CV_NAME(lookup_open)(const R *table, long ldt, const int *idx, R *dst, long ld, int r0, int n,
                                        long w) {
  for (int r = r0; r < r0 + n; r++)
    if (idx[r] >= 0) memcpy(dst + (size_t)r * ld, table + (size_t)idx[r] * ldt, sizeof(R) * (size_t)w);
}

/* The rows with an index added to, the others left as they are (cavs_gemm_kids's
   product added into another's: CAVS_PROD_Y_ADD over distinct rows) */
CV_HOT static void CV_NAME(lookup_add)(const R *table, long ldt, const int *idx, R *dst, long ld, int r0, int n,
                                       long w) {
  for (int r = r0; r < r0 + n; r++) {
    if (idx[r] < 0) continue;
    R *o = dst + (size_t)r * ld;
    const R *t = table + (size_t)idx[r] * ldt;
    for (long j = 0; j < w; j++) o[j] += t[j];
  }
}

CV_HOT static void CV_NAME(lookup_bwd)(R *dtable, long ldt, const int *idx, const R *src, long ld, int r0,
                                int n, long w) {
  for (int r = r0; r < r0 + n; r++) {
    if (idx[r] < 0) continue;
    const R *s = src + (size_t)r * ld;
    R *o = dtable + (size_t)idx[r] * ldt;
    for (long j = 0; j < w; j++) o[j] += s[j];
  }
}

/* Rows [r0, r0 + n) of src summed by slot into dst's rows, columns [0, w) of dst and
   src as given (a thread's block): row r into slot[r] (none where it is < 0), set by
   the slot's first row (first[slot[r]] == r) and added by the others, in row order. */
CV_HOT static void CV_NAME(sum_rows)(R *dst, long ldd, const int *slot, const int *first, const R *src, long ld,
                                     int r0, int n, long w) {
  for (int r = r0; r < r0 + n; r++) {
    int u = slot[r];
    if (u < 0) continue;
    const R *s = src + (size_t)r * ld;
    R *o = dst + (size_t)u * ldd;
    if (first[u] == r) memcpy(o, s, sizeof(R) * (size_t)w);
    else
      for (long j = 0; j < w; j++) o[j] += s[j];
  }
}

CV_HOT static void CV_NAME(copy_rows)(R *dst, long ldd, const R *src, long lds, int n, long w, int add) {
  for (int r = 0; r < n; r++) {
    R *o = dst + (size_t)r * ldd;
    const R *s = src + (size_t)r * lds;
    if (add)
      for (long j = 0; j < w; j++) o[j] += s[j];
    else
      memcpy(o, s, sizeof(R) * (size_t)w);
  }
}

/* Softmax cross-entropy of row z against label. The exponentials run in the model's
 * precision (the vectorizable cavs_exp_f in float): a language model's head has as many
 * columns as words, and this loop is most of its time. */
CV_INLINE R CV_NAME(row_max)(const R *z, long w) {
  R mx = z[0];
#pragma omp simd reduction(max : mx)
  for (long j = 1; j < w; j++) mx = z[j] > mx ? z[j] : mx;
  return mx;
}

CV_INLINE int CV_NAME(row_argmax)(const R *z, long w, R mx) {
  for (long j = 0; j < w; j++)
    if (z[j] == mx) return (int)j;
  return 0;
}

CV_INLINE R CV_NAME(sum_exp)(const R *z, long w, R mx) {
  R s = 0;
#pragma omp simd reduction(+ : s)
  for (long j = 0; j < w; j++) s += CV_EXP(z[j] - mx);
  return s;
}

/* A narrow head (a sentiment's 5 classes, a tagger's few tags) leaves a row's vector of 16
 * lanes mostly empty: its rows go in the lanes instead, XT at a time, the columns in a
 * tile transposed. Every row of such a head takes this path, a chunk's last rows too
 * (its empty lanes zeros): a row's loss and gradient have the same bits wherever it
 * lies. On the Tree-LSTM's 5 classes, the row at a time took 0.09 s more of a 4.2 s epoch
 * (Intel Xeon, bench/README "The narrow heads"). */
#ifndef CV_XT_DEFINED /* (this file is included once for each precision) */
#define CV_XT_DEFINED
enum { XT = 16, XT_COLS = 16 };
#endif

/* Rows [r, r + k) of z, k <= XT, as columns of t (t[j][i]: row r + i's column j), with
 * each row's max, the first column holding it, and the sum of exp(z - max); t's columns
 * become those exponentials. */
CV_INLINE void CV_NAME(xent_tile)(const R *z, long ld, int r, int k, long w, R t[XT_COLS][XT], R *mx, int *am, R *s) {
  for (long j = 0; j < w; j++)
    for (int i = 0; i < XT; i++) t[j][i] = i < k ? z[(size_t)(r + i) * ld + j] : 0;
#pragma omp simd
  for (int i = 0; i < XT; i++) mx[i] = t[0][i], am[i] = 0, s[i] = 0;
  for (long j = 1; j < w; j++)
#pragma omp simd
    for (int i = 0; i < XT; i++)
      if (t[j][i] > mx[i]) mx[i] = t[j][i], am[i] = (int)j; /* the first column at the max, as row_argmax */
  for (long j = 0; j < w; j++)
#pragma omp simd
    for (int i = 0; i < XT; i++) {
      t[j][i] = CV_EXP(t[j][i] - mx[i]);
      s[i] += t[j][i];
    }
}

/* xent_fwd's rows of a narrow head (dz NULL: the loss into *a, the predictions) or
 * xent_bwd's (their gradients into dz) */
CV_INLINE void CV_NAME(xent_narrow)(cavs_ctx *c, cavs_loss_acc *a, int loss, const R *z, long ld, const int *label,
                                    R *dz, long ldd, R scale, int r0, int n, long w) {
  R t[XT_COLS][XT], mx[XT], s[XT];
  int am[XT];
  for (int r = r0; r < r0 + n; r += XT) {
    int k = r0 + n - r < XT ? r0 + n - r : XT;
    CV_NAME(xent_tile)(z, ld, r, k, w, t, mx, am, s);
    for (int i = 0; i < k; i++) {
      int y = label[r + i];
      if (!c->pushed[r + i]) continue;
      if (dz) {
        if (y < 0) continue;
        R *g = dz + (size_t)(r + i) * ldd, q = scale / s[i];
        for (long j = 0; j < w; j++) g[j] += q * t[j][i];
        g[y] -= scale;
        continue;
      }
      if (loss == 0) c->pred[r + i] = am[i];
      if (y < 0) continue;
      a->sum += log((double)s[i]) + (double)mx[i] - (double)z[(size_t)(r + i) * ld + y];
      a->count++;
      a->correct += am[i] == y;
      if (c->root[r + i]) {
        a->root_count++;
        a->root_correct += am[i] == y;
      }
    }
  }
}

/* rows [r0, r0 + n) into *a (one chunk's sums: the caller adds the chunks in order) */
CV_HOT static void CV_NAME(xent_fwd)(cavs_ctx *c, cavs_loss_acc *a, int loss, const R *z, long ld, const int *label,
                                     int r0, int n, long w) {
  if (w <= XT_COLS) {
    CV_NAME(xent_narrow)(c, a, loss, z, ld, label, NULL, 0, 0, r0, n, w);
    return;
  }
  for (int r = r0; r < r0 + n; r++) {
    if (!c->pushed[r]) continue;
    const R *zr = z + (size_t)r * ld;
    R mx = CV_NAME(row_max)(zr, w);
    int am = CV_NAME(row_argmax)(zr, w, mx);
    if (loss == 0) c->pred[r] = am;
    if (label[r] < 0) continue;
    a->sum += log((double)CV_NAME(sum_exp)(zr, w, mx)) + (double)mx - (double)zr[label[r]];
    a->count++;
    a->correct += am == label[r];
    if (c->root[r]) {
      a->root_count++;
      a->root_correct += am == label[r];
    }
  }
}

CV_HOT static void CV_NAME(xent_bwd)(cavs_ctx *c, long count, const R *z, long ld, const int *label, R *dz, long ldd,
                                     int r0, int n, long w) {
  if (!count) return;
  R scale = (R)(c->loss_scale / (double)count);
  if (w <= XT_COLS) {
    CV_NAME(xent_narrow)(c, NULL, 0, z, ld, label, dz, ldd, scale, r0, n, w);
    return;
  }
  for (int r = r0; r < r0 + n; r++) {
    if (!c->pushed[r] || label[r] < 0) continue;
    const R *zr = z + (size_t)r * ld;
    R *g = dz + (size_t)r * ldd;
    R mx = CV_NAME(row_max)(zr, w);
    R k = scale / CV_NAME(sum_exp)(zr, w, mx);
#pragma omp simd
    for (long j = 0; j < w; j++) g[j] += k * CV_EXP(zr[j] - mx);
    g[label[r]] -= scale;
  }
}

CV_HOT static void CV_NAME(mse_fwd)(cavs_ctx *c, int loss, const R *p, long ld, const R *t, long ldt, int r0, int n,
                             long w) {
  cavs_loss_acc *a = &c->loss[loss];
  for (int r = r0; r < r0 + n; r++) {
    if (!c->pushed[r]) continue;
    double s = 0;
    for (long j = 0; j < w; j++) {
      double e = (double)p[(size_t)r * ld + j] - (double)t[(size_t)r * ldt + j];
      s += e * e;
    }
    a->sum += s / (double)w;
    a->count++;
    if (c->root[r]) a->root_count++;
  }
}

CV_HOT static void CV_NAME(mse_bwd)(cavs_ctx *c, int loss, const R *p, long ld, const R *t, long ldt, R *dp, long ldd,
                             int r0, int n, long w) {
  const cavs_loss_acc *a = &c->loss[loss];
  if (!a->count) return;
  double scale = c->loss_scale * 2.0 / ((double)cv_loss_count(c->model, loss) * (double)w);
  for (int r = r0; r < r0 + n; r++) {
    if (!c->pushed[r]) continue;
    for (long j = 0; j < w; j++)
      dp[(size_t)r * ldd + j] += CV_NAME(cv_mse_grad)(p[(size_t)r * ld + j], t[(size_t)r * ldt + j], scale);
  }
}

CV_HOT static long CV_NAME(first_bad)(const R *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(p[i])) return (long)i;
  return -1;
}

/* The squares of g[0..n) summed in double, in 16 lanes (element i in lane i mod 16),
 * then the lanes in order: the same sum every time, in vector instructions. One chain
 * of dependent additions took 4 cycles an element: 0.7 s of a 4.5 s epoch of a mixture
 * of 16 experts (2.3 million parameters) with --log or a clip (bench/README, "The
 * gradient's norm in lanes"). */
CV_HOT static double CV_NAME(sum_squares)(const R *g, size_t n) {
  double lane[16] = {0};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) lane[l] += (double)g[i + l] * g[i + l];
  for (int l = 0; i < n; i++, l++) lane[l] += (double)g[i] * g[i];
  double sum = 0;
  for (int l = 0; l < 16; l++) sum += lane[l];
  return sum;
}

/* The first part of an optimizer step: L2 weight decay added to the gradients, and their
 * squares summed (in double) when there is a clip or the norm is tracked. */
CV_HOT static double CV_NAME(decay_norm)(cavs_model *m, const cv_hyper *h, const cv_span *sp, int ns) {
  R *P = (R *)m->pflat, *G = (R *)m->gflat;
  double norm2 = 0, own = 0; /* (own: the last h->nown spans', placed experts') */
  for (int k = 0; k < ns; k++) {
    R *p = P + sp[k].off, *g = G + sp[k].off;
    if (h->l2)
      for (size_t i = 0; i < sp[k].len; i++) g[i] += (R)(h->l2 * p[i]);
    if (h->clip > 0 || h->norm) *(k < ns - h->nown ? &norm2 : &own) += CV_NAME(sum_squares)(g, sp[k].len);
  }
  /* every process's own experts', added in rank order: the same bits everywhere */
  if ((h->clip > 0 || h->norm) && h->own_norm2) norm2 += h->own_norm2(m, own);
  return norm2;
}

/* An optimizer step's scalars in the model's precision: the clip's scale, the bias
 * corrections, the rates */
typedef struct CV_NAME(step_k) {
  int kind;
  R sc, lr, e, mu, wd, a1, a2, ic1, ic2;
} CV_NAME(step_k);

/* The first part of a step: the weight decay and the norm (decay_norm), then the scalars */
static CV_NAME(step_k) CV_NAME(step_begin)(cavs_model *m, const cv_hyper *h, const cv_span *sp, int ns) {
  double norm2 = CV_NAME(decay_norm)(m, h, sp, ns);
  m->grad_norm2 = h->norm ? norm2 : -1;
  double c1 = 1 - pow(h->b1, (double)m->step), c2 = 1 - pow(h->b2, (double)m->step);
  return (CV_NAME(step_k)){.kind = h->kind, .sc = (R)cv_clip_scale(norm2, h->clip), .lr = (R)h->lr, .e = (R)h->eps,
                           .mu = (R)h->mu, .wd = (R)h->decoupled, .a1 = (R)h->b1, .a2 = (R)h->b2,
                           .ic1 = (R)(1 / c1), .ic2 = (R)(1 / c2)};
}

/* The update of the values [lo, hi) of the spans counted end to end, each gradient
 * zeroed as it is used: the next backward pass need not clear it. Each value's update
 * reads only its own value, gradient and moments, so the spans split anywhere give the
 * same bits (backend_cpu.c runs parts of them on its threads). */
CV_HOT static void CV_NAME(step_range)(cavs_model *m, const CV_NAME(step_k) *q, const cv_span *sp, int ns, size_t lo,
                                       size_t hi) {
  R *P = (R *)m->pflat, *G = (R *)m->gflat, *M1 = (R *)m->m1, *M2 = (R *)m->m2;
  R sc = q->sc, lr = q->lr, e = q->e, mu = q->mu, wd = q->wd, a1 = q->a1, a2 = q->a2, ic1 = q->ic1, ic2 = q->ic2;
  size_t at = 0; /* the first value of span k, counted end to end */
  for (int k = 0; k < ns && at < hi; at += sp[k].len, k++) {
    if (at + sp[k].len <= lo) continue;
    size_t a = lo > at ? lo - at : 0, len = (hi - at < sp[k].len ? hi - at : sp[k].len) - a;
    /* (a block the kind does not read may be absent: cv_moments_of) */
    R *p = P + sp[k].off + a, *g = G + sp[k].off + a, *m1 = M1 ? M1 + sp[k].off + a : NULL,
      *m2 = M2 ? M2 + sp[k].off + a : NULL;
    switch (q->kind) {
    case CAVS_SGD:
      for (size_t i = 0; i < len; i++) CV_NAME(cv_sgd)(&p[i], sc * g[i], lr), g[i] = 0;
      break;
    case CAVS_ADAGRAD:
      for (size_t i = 0; i < len; i++) CV_NAME(cv_adagrad)(&p[i], &m1[i], sc * g[i], lr, e), g[i] = 0;
      break;
    case CAVS_MOMENTUM:
      for (size_t i = 0; i < len; i++) CV_NAME(cv_momentum)(&p[i], &m1[i], sc * g[i], lr, mu), g[i] = 0;
      break;
    case CAVS_NESTEROV:
      for (size_t i = 0; i < len; i++) CV_NAME(cv_nesterov)(&p[i], &m1[i], sc * g[i], lr, mu), g[i] = 0;
      break;
    case CAVS_ADAMW:
      for (size_t i = 0; i < len; i++)
        CV_NAME(cv_adamw)(&p[i], &m1[i], &m2[i], sc * g[i], lr, a1, a2, ic1, ic2, e, wd), g[i] = 0;
      break;
    default:
      for (size_t i = 0; i < len; i++)
        CV_NAME(cv_adam)(&p[i], &m1[i], &m2[i], sc * g[i], lr, a1, a2, ic1, ic2, e), g[i] = 0;
    }
  }
}

/* moe.c: a mixture of experts (`moe(e in top(g, K): body)` in a .vf file): the routing
 * of a stage's rows to their K experts, grouped by expert, and the entry points of
 * generated code for the ops that read it (cavs_abi.h), with the CPU backend's kernels.
 *
 * The routing of route `id` over a stage's rows r0..r0+n-1 (cavs_topk_fwd): each row's
 * K experts of largest gate value (the lower index first among equals), in that order;
 * then a counting sort of those K n choices by expert, stable in row order, numbers the
 * slots K r0 .. K (r0 + n) - 1 so that each expert's are contiguous. Nothing of the data
 * moves: sexp[s] and srow[s] are slot s's expert and row, rslot[K r + k] row r's k-th
 * choice's slot. A slot value is a row of K n (each row's K slots side by side in a
 * buffer of K times the width): sbcast copies a row to its slots, emm multiplies each
 * expert's slots by its matrix in one product (no padding, no dropped row, nothing for
 * an expert without slots), erow reads its row of a table, scomb sums a row's slots
 * weighted by the gate. Every sum runs in a fixed order (a row's choices in order, an
 * expert's slots in row order), whatever the threads. The routing itself and the gate's
 * gradient are moe.h's, which the cuda backend runs too. */
#include "moe.h"
#include "backend.h"
#include "pool.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The route's arrays, for K slots a row of the minibatch's rows; NULL on failure. */
static struct cv_route *route_ready(cavs_ctx *c, int id, int K, long X) {
  cavs_model *m = c->model;
  if (id < 0 || id >= CV_MAX_ROUTES || K < 1 || K > CV_MAX_K || X < K || X > INT_MAX) {
    if (!m->launch_failed)
      cv_fail(m, "moe: route %d of %d experts, %d a row: %s", id, (int)X, K,
              X < K ? "fewer experts than a row's choices (top(GATE, K) needs K <= the gate's width)"
                    : "not a routing this libcavs can hold");
    m->launch_failed = true;
    return NULL;
  }
  struct cv_route *r = &m->route[id];
  size_t need = (size_t)K * (size_t)m->rows;
  if (need > INT_MAX) { /* (slots are numbered in int) */
    if (!m->launch_failed) cv_fail(m, "moe: minibatch too large (%zu slots)", need);
    m->launch_failed = true;
    return NULL;
  }
  if (need > (size_t)r->cap || X > r->nx || m->rows > r->caprows) {
    if (cv_grow(m, &r->sexp, sizeof(int), need) || cv_grow(m, &r->srow, sizeof(int), need) ||
        cv_grow(m, &r->rslot, sizeof(int), need) || cv_grow(m, &r->rbeg, sizeof(int), (size_t)m->rows) ||
        cv_grow(m, &r->rend, sizeof(int), (size_t)m->rows) || cv_grow(m, &r->cnt, sizeof(long), (size_t)X + 1) ||
        cv_grow(m, &r->load, sizeof(long), (size_t)X) || cv_grow(m, &r->scr, sizeof(double), 2 * (size_t)X) ||
        cv_grow(m, &r->pcnt, sizeof(long), (size_t)X) || cv_grow(m, &r->psum, sizeof(double), (size_t)X)) {
      m->launch_failed = true;
      return NULL;
    }
    if (X > r->nx) memset(r->load + r->nx, 0, sizeof(long) * (size_t)(X - r->nx));
    if (need > (size_t)r->cap) r->cap = (long)need;
    if (m->rows > r->caprows) r->caprows = m->rows;
    if (X > r->nx) r->nx = X;
  }
  return r;
}

/* The route's arrays, or NULL: the pass failed (saying why), so that the ops after a
   failed routing (the rest of the pass's are issued) read no slot */
static const struct cv_route *route_of(cavs_ctx *c, int id) {
  cavs_model *m = c->model;
  if (m->launch_failed) return NULL;
  if (id < 0 || id >= CV_MAX_ROUTES || !m->route[id].sexp) {
    if (!m->launch_failed) cv_fail(m, "moe: route %d read before its topk ran", id);
    m->launch_failed = true;
    return NULL;
  }
  return &m->route[id];
}

void cavs_slots(cavs_ctx *c, int route, int K, int r0, int n, int *s0, int *sn) {
  const struct cv_route *rt = route_of(c, route);
  long a = (long)K * r0, len = 0;
  if (rt) cv_slot_range(rt, K, r0, n, &a, &len);
  *s0 = (int)a, *sn = rt ? (int)len : 0;
}

/* ---- the CPU's kernels, in each precision ---- */

/* How many slots ahead scomb's backward asks for the scattered rows it will read: a
   slot's row of dy (1 KB at H = 256) and its cells of the kept weights and of their
   gradient (rows of 64 bytes at 16 experts). A slot's rows are far apart (1280 rows,
   160 slots an expert), and each was a miss to memory or the third-level cache: perf
   put a quarter of the kernel on the load of the weight's cell, and the kernel went
   from 0.18 to 0.13 s of bench/moe's moe16k2 epoch (a Zen 4). The kernels by rows
   (sbcast's backward, scomb) showed nothing from the same for their slots. */
enum { MOE_AHEAD = 4 };

#define MOE_KERNELS(R, S)                                                                                              \
  /* forward by slots: each slot's row copied in, the slots written in order (by rows,                                 \
     each row's K copies went to scattered slots); the slots of rows [r0, r0 + n) alone */                             \
  CV_HOT static void sbcast_fwd_##S(const struct cv_route *rt, const R *x, long ldx, R *s, long lds, long w, long s0,  \
                                    long sn, int r0, int n) {                                                          \
    for (long q = s0; q < s0 + sn; q++) {                                                                              \
      int r = rt->srow[q];                                                                                             \
      if (r >= r0 && r < r0 + n)                                                                                       \
        memcpy(s + (size_t)q * (size_t)lds, x + (size_t)r * (size_t)ldx, sizeof(R) * (size_t)w);                       \
    }                                                                                                                  \
  }                                                                                                                    \
  /* backward by rows: a row's K slots added to it in the order of its choices */                                      \
  CV_HOT static void sbcast_bwd_##S(const struct cv_route *rt, int K, R *x, long ldx, const R *s, long lds, long w,    \
                                    int r0, int n) {                                                                   \
    for (int r = r0; r < r0 + n; r++) {                                                                                \
      R *xr = x + (size_t)r * (size_t)ldx;                                                                             \
      for (int k = 0; k < K; k++) {                                                                                    \
        const R *sr = s + (size_t)rt->rslot[(size_t)K * (size_t)r + (size_t)k] * (size_t)lds;                          \
        for (long j = 0; j < w; j++) xr[j] += sr[j];                                                                   \
      }                                                                                                                \
    }                                                                                                                  \
  }                                                                                                                    \
  CV_HOT static void erow_##S(const struct cv_route *rt, R *t, long ldt, R *y, long ldy, long w, long s0, long sn,     \
                       bool bwd) {                                                                                     \
    for (long s = s0; s < s0 + sn; s++) {                                                                              \
      R *tr = t + (size_t)rt->sexp[s] * (size_t)ldt, *yr = y + (size_t)s * (size_t)ldy;                                \
      if (bwd)                                                                                                         \
        for (long j = 0; j < w; j++) tr[j] += yr[j];                                                                   \
      else                                                                                                             \
        memcpy(yr, tr, sizeof(R) * (size_t)w);                                                                         \
    }                                                                                                                  \
  }                                                                                                                    \
  CV_HOT static void scomb_fwd_##S(const struct cv_route *rt, int K, const R *v, long ldv, const R *wt, long ldw, R *y, \
                            long ldy, long w, int r0, int n) {                                                         \
    for (int r = r0; r < r0 + n; r++) {                                                                                \
      R *yr = y + (size_t)r * (size_t)ldy;                                                                             \
      const R *wr = wt + (size_t)r * (size_t)ldw;                                                                      \
      const int *sl = rt->rslot + (size_t)K * (size_t)r;                                                               \
      for (long j = 0; j < w; j++) yr[j] = 0;                                                                          \
      for (int k = 0; k < K; k++) {                                                                                    \
        const R *vr = v + (size_t)sl[k] * (size_t)ldv;                                                                 \
        R a = wr[rt->sexp[sl[k]]];                                                                                     \
        for (long j = 0; j < w; j++) yr[j] += a * vr[j];                                                               \
      }                                                                                                                \
    }                                                                                                                  \
  }                                                                                                                    \
  /* by slots, in order (v and dv are read and written in order, the gradient's rows                                   \
     in ascending order within each expert's slots; by rows the slots were scattered):                                 \
     each slot's gradient is its own, and each (row, expert) pair of dw is one slot's                                  \
     (a row's K experts are distinct), so any order of slots gives the same bits. The                                  \
     slots of rows [r0, r0 + n) alone: a backward over some of a routing's rows (the                                   \
     labeled ones) leaves the others' slots to cavs_scomb_bwd's clear. */                                              \
  CV_HOT static void scomb_bwd_##S(const struct cv_route *rt, const R *v, long ldv, const R *wt, long ldw,             \
                            const R *dy, long lddy, R *dv, long lddv, bool set, R *dw, long lddw, long w, long s0,     \
                            long sn, int r0, int n) {                                                                  \
    for (long q = s0; q < s0 + sn; q++) {                                                                              \
      int r = rt->srow[q], ex = rt->sexp[q];                                                                           \
      if (q + MOE_AHEAD < s0 + sn) { /* the gate cells and gradient row of a slot a few ahead */                       \
        size_t ra = (size_t)rt->srow[q + MOE_AHEAD], ea = (size_t)rt->sexp[q + MOE_AHEAD];                             \
        __builtin_prefetch(wt + ra * (size_t)ldw + ea);                                                                \
        if (dw) __builtin_prefetch(dw + ra * (size_t)lddw + ea, 1);                                                    \
        for (long j = 0; j < w; j += 64 / (long)sizeof(R)) __builtin_prefetch(dy + ra * (size_t)lddy + j);             \
      }                                                                                                                \
      if (r < r0 || r >= r0 + n) continue;                                                                             \
      const R *dyr = dy + (size_t)r * (size_t)lddy;                                                                    \
      if (dv) {                                                                                                        \
        R *dvr = dv + (size_t)q * (size_t)lddv, a = wt[(size_t)r * (size_t)ldw + (size_t)ex];                          \
        if (set)                                                                                                       \
          for (long j = 0; j < w; j++) dvr[j] = a * dyr[j];                                                            \
        else                                                                                                           \
          for (long j = 0; j < w; j++) dvr[j] += a * dyr[j];                                                           \
      }                                                                                                                \
      if (dw) dw[(size_t)r * (size_t)lddw + (size_t)ex] += cv_slot_dot_##S(dyr, v + (size_t)q * (size_t)ldv, w);       \
    }                                                                                                                  \
  }

MOE_KERNELS(float, f)
MOE_KERNELS(double, d)

/* an expert's activation over slots [s0, s0 + cnt): forward y = act(y), backward d =
   its input's gradient (moe.h) */
#define MOE_ACT_ROWS(R, S)                                                                                             \
  static void act_rows_##S(int act, R *y, long ldy, R *d, long ldd, long w, long s0, long cnt, bool bwd) {         \
    for (long s = s0; s < s0 + cnt; s++)                                                                             \
      if (bwd) cv_act_row_##S(act, true, d + (size_t)s * (size_t)ldd, y + (size_t)s * (size_t)ldy, w);               \
      else cv_act_row_##S(act, false, y + (size_t)s * (size_t)ldy, NULL, w);                                         \
  }
MOE_ACT_ROWS(float, f)
MOE_ACT_ROWS(double, d)

#define MOE_DBL(c) ((c)->desc->precision == CAVS_DOUBLE)

/* The slot kernels over the CPU backend's pool (at 2 threads they ran on one while
   the other waited: 0.6-0.7 s of a 2-thread epoch of bench/moe's moe16k2 on a Zen 4,
   timed in a build that clocked them, against 0.4-0.5 split). Those that write slots
   run in slot order and split by slots (sbcast's copies, erow's copies, scomb's
   gradient); those that write rows, by rows (sbcast's gradient, scomb); erow's
   backward, where an expert's slots add to its one row, is split by columns in blocks
   of 16, each column's sum in slot order. Every element is the same sum in the same
   order as on one thread. */
enum { MOE_SBCAST, MOE_EROW, MOE_SCOMB_FWD, MOE_SCOMB_BWD, MOE_ACT };
typedef struct MoeJob {
  int op, K, r0, n, parts, act;
  bool dbl, bwd, set;
  const struct cv_route *rt;
  void *x, *s, *dv, *dw;
  const void *v, *wt, *dy;
  long ldx, lds, ldv, ldw, lddy, lddv, lddw, w;
  long s0, sn; /* the slots of rows [r0, r0 + n) */
} MoeJob;

/* whether q runs over its slots in order (else over its rows, or erow's columns) */
static bool by_slots(const MoeJob *q) {
  return ((q->op == MOE_SBCAST || q->op == MOE_EROW) && !q->bwd) || q->op == MOE_SCOMB_BWD || q->op == MOE_ACT;
}

static void moe_part(void *arg, int i) {
  const MoeJob *q = arg;
  long a, cnt;
  if (q->op == MOE_EROW && q->bwd) { /* columns [a, a + cnt) of every slot */
    size_t es = q->dbl ? sizeof(double) : sizeof(float);
    cv_pool_share(q->w, q->parts, i, 16, &a, &cnt);
    if (cnt <= 0) return;
    char *t = (char *)q->x + (size_t)a * es, *y = (char *)q->s + (size_t)a * es;
    if (q->dbl) erow_d(q->rt, (double *)t, q->ldx, (double *)y, q->lds, cnt, q->s0, q->sn, true);
    else erow_f(q->rt, (float *)t, q->ldx, (float *)y, q->lds, cnt, q->s0, q->sn, true);
    return;
  }
  if (by_slots(q)) {
    cv_pool_share(q->sn, q->parts, i, 1, &a, &cnt);
    if (cnt <= 0) return;
    long s0 = q->s0 + a;
    switch (q->op) {
    case MOE_SBCAST:
      if (q->dbl) sbcast_fwd_d(q->rt, q->x, q->ldx, q->s, q->lds, q->w, s0, cnt, q->r0, q->n);
      else sbcast_fwd_f(q->rt, q->x, q->ldx, q->s, q->lds, q->w, s0, cnt, q->r0, q->n);
      break;
    case MOE_EROW:
      if (q->dbl) erow_d(q->rt, q->x, q->ldx, q->s, q->lds, q->w, s0, cnt, false);
      else erow_f(q->rt, q->x, q->ldx, q->s, q->lds, q->w, s0, cnt, false);
      break;
    case MOE_ACT:
      if (q->dbl) act_rows_d(q->act, q->x, q->ldx, q->dv, q->lddv, q->w, s0, cnt, q->bwd);
      else act_rows_f(q->act, q->x, q->ldx, q->dv, q->lddv, q->w, s0, cnt, q->bwd);
      break;
    default: /* MOE_SCOMB_BWD */
      if (q->dbl)
        scomb_bwd_d(q->rt, q->v, q->ldv, q->wt, q->ldw, q->dy, q->lddy, q->dv, q->lddv, q->set, q->dw, q->lddw, q->w,
                    s0, cnt, q->r0, q->n);
      else
        scomb_bwd_f(q->rt, q->v, q->ldv, q->wt, q->ldw, q->dy, q->lddy, q->dv, q->lddv, q->set, q->dw, q->lddw, q->w,
                    s0, cnt, q->r0, q->n);
    }
    return;
  }
  cv_pool_share(q->n, q->parts, i, 1, &a, &cnt);
  if (cnt <= 0) return;
  int r0 = q->r0 + (int)a, n = (int)cnt;
  if (q->op == MOE_SBCAST) {
    if (q->dbl) sbcast_bwd_d(q->rt, q->K, q->x, q->ldx, q->s, q->lds, q->w, r0, n);
    else sbcast_bwd_f(q->rt, q->K, q->x, q->ldx, q->s, q->lds, q->w, r0, n);
  } else { /* MOE_SCOMB_FWD */
    if (q->dbl) scomb_fwd_d(q->rt, q->K, q->v, q->ldv, q->wt, q->ldw, q->x, q->ldx, q->w, r0, n);
    else scomb_fwd_f(q->rt, q->K, q->v, q->ldv, q->wt, q->ldw, q->x, q->ldx, q->w, r0, n);
  }
}

/* q over the pool where there is enough of it (as the backend's row operations: 32768
   values), else here */
static void moe_run(cavs_ctx *c, MoeJob *q) {
  double t0 = cv_now();
  cv_pool *pool = cv_cpu_pool(c->model);
  cv_slot_range(q->rt, q->K, q->r0, q->n, &q->s0, &q->sn);
  long items = by_slots(q) ? q->sn : (long)q->n * q->K;
  q->dbl = MOE_DBL(c);
  q->parts = pool ? cv_pool_threads(pool) : 1;
  if (q->parts < 2 || items * q->w < 32768 || (q->op == MOE_EROW && q->bwd && q->w < 32)) {
    q->parts = 1;
    moe_part(q, 0);
  } else
    cv_pool_run(pool, moe_part, q, q->parts);
  c->model->stats.rows_seconds += cv_now() - t0;
}

#define MOE_CALL(c, name, ...)                                                                                        \
  do {                                                                                                               \
    double t0_ = cv_now();                                                                                           \
    if (MOE_DBL(c)) name##_d(__VA_ARGS__);                                                                           \
    else name##_f(__VA_ARGS__);                                                                                      \
    (c)->model->stats.rows_seconds += cv_now() - t0_;                                                                \
  } while (0)

/* the routing on the rows in place (moe.h) */
#define MOE_TOPK(R, S)                                                                                             \
  static void topk_fwd_##S(cavs_ctx *c, struct cv_route *rt, int K, long X, double bal, const R *g, long ldg, R *w,  \
                           long ldw, int r0, int n) {                                                                  \
    cv_topk_route_##S(rt, c->model->pass, K, X, bal, g + (size_t)r0 * (size_t)ldg, ldg, w + (size_t)r0 * (size_t)ldw, \
                      ldw, r0, n);                                                                                   \
  }                                                                                                                  \
  static void topk_bwd_##S(cavs_ctx *c, struct cv_route *rt, int K, long X, double bal, const R *g, long ldg,       \
                           const R *w, long ldw, const R *dw, long lddw, R *dg, long lddg, int r0, int n) {          \
    double scale = cv_balance_scale(rt, X, bal, c->loss_scale);                                                      \
    if (scale != 0) cv_balance_shares(rt, K, X, rt->scr);                                                            \
    for (int r = r0; r < r0 + n; r++)                                                                                \
      cv_topk_bwd_row_##S(K, X, scale, rt->scr, g + (size_t)r * (size_t)ldg, w + (size_t)r * (size_t)ldw,            \
                          dw + (size_t)r * (size_t)lddw, dg + (size_t)r * (size_t)lddg,                              \
                          rt->rslot + (size_t)K * (size_t)r, rt->sexp);                                              \
  }
MOE_TOPK(float, f)
MOE_TOPK(double, d)

static void cpu_topk_fwd(cavs_ctx *c, struct cv_route *rt, int K, long X, double bal, const void *g, long ldg, void *w,
                         long ldw, int r0, int n) {
  MOE_CALL(c, topk_fwd, c, rt, K, X, bal, g, ldg, w, ldw, r0, n);
}
static void cpu_topk_bwd(cavs_ctx *c, struct cv_route *rt, int K, long X, double bal, const void *g, long ldg,
                         const void *w, long ldw, const void *dw, long lddw, void *dg, long lddg, int r0, int n) {
  MOE_CALL(c, topk_bwd, c, rt, K, X, bal, g, ldg, w, ldw, dw, lddw, dg, lddg, r0, n);
}
static void cpu_sbcast(cavs_ctx *c, const struct cv_route *rt, int K, void *x, long ldx, void *s, long lds, long w,
                       int r0, int n, bool bwd) {
  MoeJob q = {.op = MOE_SBCAST, .K = K, .r0 = r0, .n = n, .bwd = bwd, .rt = rt, .x = x, .ldx = ldx, .s = s,
              .lds = lds, .w = w};
  moe_run(c, &q);
}
static void cpu_erow(cavs_ctx *c, const struct cv_route *rt, int K, void *t, long ldt, void *y, long ldy, long w,
                     int r0, int n, bool bwd) {
  MoeJob q = {.op = MOE_EROW, .K = K, .r0 = r0, .n = n, .bwd = bwd, .rt = rt, .x = t, .ldx = ldt, .s = y, .lds = ldy,
              .w = w};
  moe_run(c, &q);
}
static void cpu_scomb_fwd(cavs_ctx *c, const struct cv_route *rt, int K, const void *v, long ldv, const void *wt,
                          long ldw, void *y, long ldy, long w, int r0, int n) {
  MoeJob q = {.op = MOE_SCOMB_FWD, .K = K, .r0 = r0, .n = n, .rt = rt, .v = v, .ldv = ldv, .wt = wt, .ldw = ldw,
              .x = y, .ldx = ldy, .w = w};
  moe_run(c, &q);
}
static void cpu_scomb_bwd(cavs_ctx *c, const struct cv_route *rt, int K, const void *v, long ldv, const void *wt,
                          long ldw, const void *dy, long lddy, void *dv, long lddv, bool dv_set, void *dw, long lddw,
                          long w, int r0, int n) {
  MoeJob q = {.op = MOE_SCOMB_BWD, .K = K, .r0 = r0, .n = n, .set = dv_set, .rt = rt, .v = v, .ldv = ldv, .wt = wt,
              .ldw = ldw, .dy = dy, .lddy = lddy, .dv = dv, .lddv = lddv, .dw = dw, .lddw = lddw, .w = w};
  moe_run(c, &q);
}

static void cpu_act(cavs_ctx *c, const struct cv_route *rt, int K, int act, void *y, long ldy, void *d, long ldd,
                    long w, int r0, int n, bool bwd) {
  MoeJob q = {.op = MOE_ACT, .K = K, .r0 = r0, .n = n, .act = act, .bwd = bwd, .rt = rt, .x = y, .ldx = ldy, .dv = d,
              .lddv = ldd, .w = w};
  moe_run(c, &q);
}

const cv_moe_ops cv_moe_cpu = {
    .topk_fwd = cpu_topk_fwd,
    .topk_bwd = cpu_topk_bwd,
    .sbcast = cpu_sbcast,
    .erow = cpu_erow,
    .scomb_fwd = cpu_scomb_fwd,
    .scomb_bwd = cpu_scomb_bwd,
    .act = cpu_act,
};

/* ---- entry points ---- */

static const cv_moe_ops *moe_ops(cavs_ctx *c) {
  cavs_model *m = c->model;
  if (m->be->moe) return m->be->moe;
  if (!m->launch_failed) cv_fail(m, "a mixture of experts (moe) is not built for the %s backend yet", m->be->name);
  m->launch_failed = true;
  return NULL;
}

/* The backend's kernels and the route's arrays, or NULL (the pass failed, saying why) */
static const struct cv_route *moe_route(cavs_ctx *c, int route, const cv_moe_ops **o) {
  *o = moe_ops(c);
  return *o ? route_of(c, route) : NULL;
}

void cavs_topk_fwd(cavs_ctx *c, int route, int K, long X, double balance, const void *g, long ldg, void *w, long ldw,
                   int r0, int n) {
  const cv_moe_ops *o = moe_ops(c);
  struct cv_route *rt = o ? route_ready(c, route, K, X) : NULL;
  if (rt && n > 0) o->topk_fwd(c, rt, K, X, balance, g, ldg, w, ldw, r0, n);
}
void cavs_topk_bwd(cavs_ctx *c, int route, int K, long X, double balance, const void *g, long ldg, const void *w,
                   long ldw, const void *dw, long lddw, void *dg, long lddg, int r0, int n) {
  const cv_moe_ops *o;
  struct cv_route *rt = (struct cv_route *)moe_route(c, route, &o);
  if (rt && n > 0) o->topk_bwd(c, rt, K, X, balance, g, ldg, w, ldw, dw, lddw, dg, lddg, r0, n);
}

/* The pass's load-balancing losses: each routing's, bal X sum_e f_e P_e over the rows it
   routed (f_e the share of their slots expert e received, P_e their mean probability of
   e), whatever the tasks they ran in */
double cv_moe_aux(const cavs_model *m, bool *any) {
  double aux = 0;
  *any = false;
  for (int i = 0; i < CV_MAX_ROUTES; i++) {
    const struct cv_route *r = &m->route[i];
    if (r->pass != m->pass || !r->aux_rows) continue;
    double l = 0, N = (double)r->aux_rows;
    for (long j = 0; j < r->nx; j++) l += (double)r->pcnt[j] / (r->K * N) * (r->psum[j] / N);
    aux += r->bal * (double)r->nx_pass * l;
    *any = true;
  }
  return aux;
}
/* The route's balancing loss as the last forward pass ran it, or NULL */
static const struct cv_route *balanced(const cavs_model *m, int route) {
  if (!m || route < 0 || route >= CV_MAX_ROUTES || !m->have_batch) return NULL;
  const struct cv_route *r = &m->route[route];
  return r->pass == m->pass && r->aux_rows > 0 && r->bal > 0 ? r : NULL;
}

long cavs_model_balance(const cavs_model *m, int route, double *v, long cap) {
  if (!m || route < 0 || route >= CV_MAX_ROUTES || cap < 0 || (cap > 0 && !v)) return -1;
  const struct cv_route *r = balanced(m, route);
  if (!r) return 0;
  long X = r->nx_pass;
  if (cap >= 2 * X + 1) {
    v[0] = (double)r->aux_rows;
    for (long j = 0; j < X; j++) v[1 + j] = (double)r->pcnt[j], v[1 + X + j] = r->psum[j];
  }
  return X;
}

/* v's value as a count: a whole number from 0 to 2^53 (-1 otherwise) */
static long count_of(double v) {
  return v >= 0 && v <= 9007199254740992.0 && v == (double)(long)v ? (long)v : -1;
}

int cavs_model_set_balance(cavs_model *m, int route, const double *v, long X) {
  if (!m) return -1;
  struct cv_route *r = (struct cv_route *)balanced(m, route);
  if (!r)
    return cv_fail(m, "balance: routing %d ran no load-balancing loss in the last forward pass (or its backward pass ran)",
                   route);
  if (!v || X != r->nx_pass) return cv_fail(m, "balance: routing %d has %ld experts, not %ld", route, r->nx_pass, X);
  long rows = count_of(v[0]), slots = 0;
  if (rows < r->aux_rows)
    return cv_fail(m, "balance: routing %d: %.17g rows in all, not a count of at least the %ld this pass routed", route,
                   v[0], r->aux_rows);
  for (long j = 0; j < X; j++) {
    long c = count_of(v[1 + j]);
    double p = v[1 + X + j];
    if (c < r->pcnt[j])
      return cv_fail(m, "balance: routing %d, expert %ld: %.17g slots in all, not a count of at least the %ld here",
                     route, j, v[1 + j], r->pcnt[j]);
    if (!(p >= 0 && p <= (double)rows * (1 + 1e-9))) /* (a probability is at most 1) */
      return cv_fail(m, "balance: routing %d, expert %ld: a summed probability of %.17g over %ld rows", route, j, p,
                     rows);
    /* (K rows is at most 2^59 and c 2^53: the sum stops before it could overflow) */
    if ((slots += c) > (long)r->K * rows) break;
  }
  if (slots != (long)r->K * rows)
    return cv_fail(m, "balance: routing %d: the experts' slots do not add up to %d a row over %ld rows", route, r->K,
                   rows);
  r->aux_rows = rows;
  for (long j = 0; j < X; j++) r->pcnt[j] = (long)v[1 + j], r->psum[j] = v[1 + X + j];
  const cv_moe_ops *o = m->be->moe;
  return o && o->balance_set ? o->balance_set(m, r) : 0;
}

void cavs_sbcast_fwd(cavs_ctx *c, int route, int K, const void *x, long ldx, void *s, long lds, long w, int r0, int n) {
  const cv_moe_ops *o;
  const struct cv_route *rt = moe_route(c, route, &o);
  if (rt && n > 0) o->sbcast(c, rt, K, (void *)x, ldx, s, lds, w, r0, n, false);
}
void cavs_sbcast_bwd(cavs_ctx *c, int route, int K, void *dx, long lddx, const void *ds, long ldds, long w, int r0,
                     int n) {
  const cv_moe_ops *o;
  const struct cv_route *rt = moe_route(c, route, &o);
  if (rt && n > 0) o->sbcast(c, rt, K, dx, lddx, (void *)ds, ldds, w, r0, n, true);
}
void cavs_erow_fwd(cavs_ctx *c, int route, int K, const void *t, long ldt, void *y, long ldy, long w, int r0, int n) {
  const cv_moe_ops *o;
  const struct cv_route *rt = moe_route(c, route, &o);
  if (rt && n > 0) o->erow(c, rt, K, (void *)t, ldt, y, ldy, w, r0, n, false);
}
void cavs_erow_bwd(cavs_ctx *c, int route, int K, void *dt, long lddt, const void *dy, long lddy, long w, int r0,
                   int n) {
  const cv_moe_ops *o;
  const struct cv_route *rt = moe_route(c, route, &o);
  if (rt && n > 0 && dt) o->erow(c, rt, K, dt, lddt, (void *)dy, lddy, w, r0, n, true);
}
void cavs_scomb_fwd(cavs_ctx *c, int route, int K, long X, const void *v, long ldv, const void *wt, long ldw, void *y,
                    long ldy, long w, int r0, int n) {
  (void)X;
  const cv_moe_ops *o;
  const struct cv_route *rt = moe_route(c, route, &o);
  if (rt && n > 0) o->scomb_fwd(c, rt, K, v, ldv, wt, ldw, y, ldy, w, r0, n);
}
/* Slots [s0, s1) of dv zero (w values a slot, ld apart) */
static void zero_slots(cavs_ctx *c, void *dv, long lddv, long w, long s0, long s1) {
  cavs_model *m = c->model;
  if (s1 <= s0 || w <= 0) return;
  size_t es = m->esize;
  if (lddv == w) m->be->zero(m, (char *)dv + (size_t)s0 * (size_t)w * es, (size_t)(s1 - s0) * (size_t)w * es);
  else
    for (long s = s0; s < s1; s++) m->be->zero(m, (char *)dv + (size_t)s * (size_t)lddv * es, (size_t)w * es);
}

void cavs_scomb_bwd(cavs_ctx *c, int route, int K, long X, const void *v, long ldv, const void *wt, long ldw,
                    const void *dy, long lddy, void *dv, long lddv, int dv_set, void *dw, long lddw, long w, int r0,
                    int n) {
  (void)X;
  const cv_moe_ops *o;
  const struct cv_route *rt = moe_route(c, route, &o);
  if (!rt || n <= 0 || !(dv || dw)) return;
  if (dv && dv_set) {
    /* the slots of the routings' rows outside r0 .. r0 + n - 1 (a push block's backward
       over the labeled rows only): their gradient is zero, and nothing else writes it.
       Their slots lie anywhere in the routings' range (a routing numbers its slots by
       expert), so the whole range is cleared before the rows' own are set. */
    long s0, sn;
    cv_slot_range(rt, K, r0, n, &s0, &sn);
    if (s0 != (long)K * r0 || sn != (long)K * n) zero_slots(c, dv, lddv, w, s0, s0 + sn);
  }
  o->scomb_bwd(c, rt, K, v, ldv, wt, ldw, dy, lddy, dv, lddv, dv && dv_set, dw, lddw, w, r0, n);
}

static const char *at(const cavs_ctx *c, const void *p, long row, long ld) {
  return (const char *)p + (size_t)row * (size_t)ld * c->model->esize;
}

/* ---- expert parallelism: an expert's products on its own process ----
 *
 * A round (one emm of one process's pass, or nothing: a process that has finished its
 * pass): every process says what it runs (ep_head, gathered by all), then its slot
 * count for every expert (gathered by all, so that every process makes the same plan:
 * where each expert's rows run, replicas included), then sends the slots' rows (forward:
 * x; backward: x and dy side by side) to the processes that run them; the slots' order
 * already groups them by expert (a routing numbers its slots by expert). Each process
 * runs, for each distinct emm of the round and each expert whose rows it received, one
 * product over every process's rows of it (gathered in rank order), and sends the
 * results back (forward: y; backward: dx), adding x^T dy to its own gradient of the
 * expert. A round with no process running anything ends a pass's rounds.
 *
 * A process that fails alone (its memory: an exchange buffer over the memory limit, or
 * not given) must not leave the others in a collective it will never call: before
 * each collective that follows such work, every process says whether its part so far
 * went through (ep_agree, an allgather of a word), and all fail the round together.
 * A failure between rounds needs none: the failed process answers the others' rounds
 * as idle (cv_experts_drain). What the agreement leaves is the same on every process
 * (the tables placed, the replicas' copies marked current), so that a failed pass
 * leaves the processes' states alike. */
enum { EP_IDLE, EP_FWD, EP_BWD };
enum { EP_DX = 1, EP_DT = 2 };
typedef struct {
  int64_t kind, toff, dtoff, A, B, X, ldt, lddt, flags, pad;
} ep_head;
/* the exchange's host buffers; EP_HEADS and EP_SAY are made with the comm (their sizes
   are the processes'), so that what a round does before its first collective, and the
   agreement, cannot fail */
enum { EP_HEADS, EP_SEND, EP_RECV, EP_REPLY, EP_BACK, EP_WORK, EP_SAY };

/* expert e of X's process of N: the first expert of process q is ceil(q X / N) */
static inline long ep_first(long q, long X, int N) { return (q * X + N - 1) / N; }

/* buffer i, at least `bytes`: NULL on failure (out of memory, or past the memory limit
   with the model and its minibatch's rows, counted as cv_grow_rows counts them) */
static void *ep_buf(cavs_model *m, int i, size_t bytes) {
  struct cv_experts *ep = &m->ep;
  /* (a rank with nothing to send asks for 0 bytes: a buffer all the same, as NULL is a
     failure to its callers, which had failed the round without a message) */
  if (bytes == 0) bytes = 1;
  if (bytes > ep->cap[i]) {
    size_t need = bytes, rows = 0;
    bool over = false;
    for (int k = 0; k < 8; k++) over |= k != i && __builtin_add_overflow(need, ep->cap[k], &need);
    if (over || cavs_model_memory(m, m->cap_rows, NULL, &rows) || __builtin_add_overflow(need, rows, &need) ||
        __builtin_add_overflow(need, m->model_bytes, &need) || need > cavs_memory_limit())
      return cv_fail_mem(m, "the experts' exchange needs %s more, past the memory limit of %s with the model's %s "
                            "and the minibatch's (a smaller --batch, or raise --max-memory)",
                         cv_bytes((char[CV_BYTES_LEN]){0}, bytes - ep->cap[i]),
                         cv_bytes((char[CV_BYTES_LEN]){0}, cavs_memory_limit()),
                         cv_bytes((char[CV_BYTES_LEN]){0}, m->model_bytes)), NULL;
    if (cv_grow(m, &ep->buf[i], 1, bytes)) return NULL;
    ep->cap[i] = bytes;
  }
  return ep->buf[i];
}

/* dst[0..n) += src[0..n), in the model's precision */
static void ep_add(size_t es, void *dst, const void *src, long n) {
  if (es == 8)
    for (long v = 0; v < n; v++) ((double *)dst)[v] += ((const double *)src)[v];
  else
    for (long v = 0; v < n; v++) ((float *)dst)[v] += ((const float *)src)[v];
}

/* The rows, matrices and gradients the exchange reads and writes are the backend's; the
   exchange's buffers are the host's. On the cpu backend they are one memory and the
   rows go by memcpy; on another (a device's) they go through a staging buffer of the
   backend's (ep_dbuf): the backend's row copies gather them there, one download brings
   them to the host, and back the same way, with one upload. A copy to the host waits for
   the device's work before it (the backend's download), and the backend's release waits
   for work still reading a staging buffer it frees. */
static bool ep_on_host(const cavs_model *m) { return m->be == &cv_backend_cpu; }

static char *ep_dbuf(cavs_model *m, int i, size_t bytes) {
  struct cv_experts *ep = &m->ep;
  if (bytes <= ep->dcap[i]) return ep->dbuf[i];
  size_t cap = ep->dcap[i] ? ep->dcap[i] : 4096;
  while (cap < bytes && cap <= SIZE_MAX / 2) cap *= 2;
  m->be->release(ep->dbuf[i]);
  ep->dcap[i] = 0;
  if (cap < bytes || !(ep->dbuf[i] = m->be->alloc(m, cap))) {
    ep->dbuf[i] = NULL;
    cv_fail_mem(m, "out of %s memory staging the experts' rows", m->be->name);
    return NULL;
  }
  ep->dcap[i] = cap;
  return ep->dbuf[i];
}

/* bytes of the backend's memory to the host, and back (memcpy on the cpu backend) */
static int ep_read(cavs_model *m, void *host, const void *src, size_t bytes) { return m->be->download(m, host, src, bytes); }
static int ep_write(cavs_model *m, void *dst, const void *host, size_t bytes) { return m->be->upload(m, dst, host, bytes); }
/* In a pass, a copy that failed is the model's failure (the device's: the pass's end
   reports it), and the round goes on: the other processes wait for this one's part. */

/* A host buffer's rows and their place in the backend's memory: `host` itself on the
   cpu backend, else a staging buffer (EP_STAGE) as large, moved whole by ep_down and
   ep_up. */
enum { EP_STAGE, EP_DPROD };
typedef struct {
  cavs_ctx *c;
  char *host, *dev;
} ep_rows;
static int ep_rows_at(cavs_ctx *c, ep_rows *b, char *host, size_t bytes) {
  b->c = c, b->host = host, b->dev = host;
  if (!ep_on_host(c->model) && !(b->dev = ep_dbuf(c->model, EP_STAGE, bytes ? bytes : 1))) return -1;
  return 0;
}
/* n rows of w bytes of the model's, sp bytes apart, into the buffer at `at`, dp bytes
   apart (the backend's row copy, or memcpy); added to the model's rows instead, from the
   buffer (back: the buffer into the model's; add: added, else set) */
static void ep_move(ep_rows *b, size_t at, size_t dp, char *model, size_t sp, long n, size_t w, bool back, bool add) {
  cavs_model *m = b->c->model;
  size_t es = m->esize;
  if (n <= 0 || !w) return;
  if (!ep_on_host(m)) {
    if (back) m->be->copy_rows(b->c, model, (long)(sp / es), b->dev + at, (long)(dp / es), (int)n, (long)(w / es), add);
    else m->be->copy_rows(b->c, b->dev + at, (long)(dp / es), model, (long)(sp / es), (int)n, (long)(w / es), 0);
    return;
  }
  for (long j = 0; j < n; j++) {
    char *h = b->host + at + (size_t)j * dp, *r = model + (size_t)j * sp;
    if (!back) memcpy(h, r, w);
    else if (add) ep_add(es, r, h, (long)(w / es));
    else memcpy(r, h, w);
  }
}
/* the buffer's first bytes: to the host after ep_move's gathered them; to the backend
   before ep_move's scatter them */
static void ep_down(ep_rows *b, size_t bytes) {
  cavs_model *m = b->c->model;
  if (b->dev != b->host && bytes) (void)m->be->download(m, b->host, b->dev, bytes);
}
static void ep_up(ep_rows *b, size_t bytes) {
  cavs_model *m = b->c->model;
  if (b->dev != b->host && bytes) (void)m->be->upload(m, b->dev, b->host, bytes);
}

static bool ep_same_op(const ep_head *a, const ep_head *b) {
  return a->kind == b->kind && a->toff == b->toff && a->dtoff == b->dtoff && a->A == b->A && a->B == b->B &&
         a->X == b->X && a->ldt == b->ldt && a->lddt == b->lddt && a->flags == b->flags;
}

/* a head gathered from another process, checked before its numbers size anything */
static int ep_check_head(cavs_model *m, const ep_head *h, int p) {
  if (h->kind == EP_IDLE) return 0;
  size_t es = m->esize, nb = m->nflat * es;
  bool ok = (h->kind == EP_FWD || h->kind == EP_BWD) && h->A > 0 && h->B > 0 && h->X > 0 && h->X <= INT_MAX &&
            h->A <= INT_MAX / h->B && h->ldt >= h->A * h->B && (size_t)h->ldt <= nb / es &&
            (size_t)h->lddt <= nb / es && h->toff >= 0 && (size_t)h->toff % es == 0 &&
            (size_t)h->toff <= nb && (size_t)(h->X - 1) * (size_t)h->ldt + (size_t)(h->A * h->B) <= (nb - (size_t)h->toff) / es;
  if (ok && (h->flags & EP_DT))
    ok = h->dtoff >= 0 && (size_t)h->dtoff % es == 0 && h->lddt >= h->A * h->B && (size_t)h->dtoff <= nb &&
         (size_t)(h->X - 1) * (size_t)h->lddt + (size_t)(h->A * h->B) <= (nb - (size_t)h->dtoff) / es;
  return ok ? 0 : cv_fail(m, "expert exchange: process %d sent a round this model cannot run (another model?)", p);
}

static int ep_call(cavs_model *m, int rc, const char *what) {
  return rc ? cv_fail(m, "expert exchange failed (%s, error %d)", what, rc) : 0;
}

/* Every process's word on its part since the last collective (ok: it went through),
   before the next: 0 when every process's did, else -1 on every process, the failed
   one keeping its own message. */
static int ep_agree(cavs_model *m, bool ok) {
  struct cv_experts *ep = &m->ep;
  int64_t mine = ok ? 0 : 1, *said = ep->buf[EP_SAY];
  double t0 = cv_now();
  int rc = ep->comm.allgather(ep->comm.arg, &mine, sizeof mine, said);
  ep->stats.seconds += cv_now() - t0;
  if (!ok) return -1;
  if (ep_call(m, rc, "allgather of the processes' word")) return -1;
  for (int p = 0; p < ep->comm.size; p++)
    if (said[p]) return cv_fail(m, "expert exchange: process %d failed its part of the round (its own message says why)", p);
  return 0;
}

/* A round's plan, the same on every process (made from what every process said): each
   process's slot counts for each expert of its emm (cnt[p X + e], X the round's widest
   gate), the first process running each one's emm (lead[p]: they share products), and
   the replicas: nhot experts, replica i expert hot_e[i] of the emm led by hot_lead[i],
   whose rows after the first kown[i N + p] of process p's (the first half of every
   process's, in rank order) go to process rep[i] instead of the expert's own. */
enum { EP_MAX_REPLICAS = 8 };
typedef struct {
  int N;
  long X;
  const ep_head *heads;
  const int64_t *cnt;
  const int *lead;
  int nhot;
  int hot_lead[EP_MAX_REPLICAS], rep[EP_MAX_REPLICAS];
  long hot_e[EP_MAX_REPLICAS];
  long *kown; /* [EP_MAX_REPLICAS N] */
} ep_plan;

/* which replica process p's rows of expert e have (-1: none) */
static int ep_hot(const ep_plan *pl, int p, long e) {
  for (int i = 0; i < pl->nhot; i++)
    if (pl->lead[p] == pl->hot_lead[i] && e == pl->hot_e[i]) return i;
  return -1;
}

/* Process p's rows of expert e that go to process q: [*b, *b + *n) of them (in slot
   order) */
static void ep_portion(const ep_plan *pl, int p, long e, int q, long *b, long *n) {
  const ep_head *h = &pl->heads[p];
  long c = (long)pl->cnt[(size_t)p * (size_t)pl->X + (size_t)e];
  int i = ep_hot(pl, p, e);
  long keep = i >= 0 ? pl->kown[(size_t)i * (size_t)pl->N + (size_t)p] : c;
  *b = 0, *n = 0;
  if (e >= ep_first(q, h->X, pl->N) && e < ep_first(q + 1, h->X, pl->N)) *n = keep;
  else if (i >= 0 && q == pl->rep[i]) *b = keep, *n = c - keep;
}

/* The experts whose rows process p sends to process q, in the order it sends them: q's
   own (ascending), then those q holds a replica of, in the plan's order. Their number;
   out holds at most X + EP_MAX_REPLICAS. */
static long ep_order(const ep_plan *pl, int p, int q, long *out) {
  const ep_head *h = &pl->heads[p];
  long n = 0;
  if (h->kind == EP_IDLE) return 0;
  for (long e = ep_first(q, h->X, pl->N); e < ep_first(q + 1, h->X, pl->N); e++) out[n++] = e;
  for (int i = 0; i < pl->nhot; i++)
    if (pl->lead[p] == pl->hot_lead[i] && q == pl->rep[i]) out[n++] = pl->hot_e[i];
  return n;
}

/* The replicas, where the round is skewed: a process's load is its experts' rows times
   the product's A B (the backward pass's two products count twice). While the busiest
   process is above 5/4 of the mean, its heaviest expert not yet split has half of its
   rows moved to the least busy process, if that lowers the busiest load; at most
   EP_MAX_REPLICAS a round. */
static void ep_replicate(ep_plan *pl, double *load, double *eload) {
  int N = pl->N;
  long X = pl->X;
  for (int q = 0; q < N; q++) load[q] = 0;
  for (size_t i = 0; i < (size_t)N * (size_t)X; i++) eload[i] = 0; /* [lead][e] */
  double total = 0;
  for (int p = 0; p < N; p++) {
    const ep_head *h = &pl->heads[p];
    if (h->kind == EP_IDLE) continue;
    double w = (double)h->A * (double)h->B * (h->kind == EP_BWD ? 2 : 1);
    for (long e = 0; e < h->X; e++) {
      double l = w * (double)pl->cnt[(size_t)p * (size_t)X + (size_t)e];
      load[(int)(e * N / h->X)] += l; /* (its process: ep_first's inverse) */
      eload[(size_t)pl->lead[p] * (size_t)X + (size_t)e] += l;
      total += l;
    }
  }
  while (N > 1 && pl->nhot < EP_MAX_REPLICAS) {
    int hi = 0, lo = 0;
    for (int q = 1; q < N; q++) {
      if (load[q] > load[hi]) hi = q;
      if (load[q] < load[lo]) lo = q;
    }
    if (load[hi] <= 1.25 * total / N) return;
    double best = 0;
    int bl = -1;
    long be = -1;
    for (int p = 0; p < N; p++) {
      if (pl->heads[p].kind == EP_IDLE || pl->lead[p] != p) continue;
      long X1 = pl->heads[p].X;
      for (long e = ep_first(hi, X1, N); e < ep_first(hi + 1, X1, N); e++) {
        double l = eload[(size_t)p * (size_t)X + (size_t)e];
        if (l > best && ep_hot(pl, p, e) < 0) best = l, bl = p, be = e;
      }
    }
    if (bl < 0 || load[lo] + best / 2 >= load[hi]) return;
    int i = pl->nhot++;
    pl->hot_lead[i] = bl, pl->hot_e[i] = be, pl->rep[i] = lo;
    long R = 0, moved = 0;
    for (int p = 0; p < N; p++)
      if (pl->lead[p] == bl) R += (long)pl->cnt[(size_t)p * (size_t)X + (size_t)be];
    long keep = R - R / 2, before = 0;
    for (int p = 0; p < N; p++) {
      long *k = &pl->kown[(size_t)i * (size_t)N + (size_t)p];
      if (pl->lead[p] != bl) {
        *k = 0;
        continue;
      }
      long c = (long)pl->cnt[(size_t)p * (size_t)X + (size_t)be];
      *k = keep - before < 0 ? 0 : keep - before > c ? c : keep - before;
      before += c, moved += c - *k;
    }
    double l = R ? best * (double)moved / (double)R : 0;
    load[hi] -= l, load[lo] += l;
  }
}

/* ---- placed tables: an expert's matrix current on its owner alone ----
 *
 * Each expert table an emm reads (a parameter group [X, ldt] of its own) is placed the
 * first round it is seen (on every process in the same round: every process sees every
 * head): from then on expert e's owner alone steps its matrix (cv_experts_own), its
 * gradient is the owner's (a replica's added to it at the backward pass's end,
 * ep_home), and the other processes' copies go stale until cavs_model_expert_sync. A
 * replica's process is sent the owner's matrix before it runs it, where its copy is
 * older than the last step (ep_weights). A table that is not one whole group stays as
 * before placement: every process steps it, its gradient summed by the application. */

/* expert e of X's owner of N processes: ep_first's inverse */
static inline int ep_owner(long e, long X, int N) { return (int)(e * N / X); }

static void ep_release(cavs_model *m, struct cv_ep_table *t);
static void ep_restamp(cavs_model *m, struct cv_ep_table *t);

static struct cv_ep_table *ep_table(cavs_model *m, int64_t toff) {
  for (int i = 0; i < m->ep.ntab; i++)
    if (m->ep.tab[i].toff == toff) return &m->ep.tab[i];
  return NULL;
}

/* The expert tables the round's emms run over that are not placed yet, placed: on every
   process in the same round (the heads are every process's), made first and agreed on
   before any is placed, so that a process that could not make one leaves the tables as
   the others do */
static int ep_register(cavs_model *m, const ep_head *heads, const int *lead, int N) {
  struct cv_experts *ep = &m->ep;
  size_t es = m->esize;
  int n0 = ep->ntab, n = n0;
  bool ok = true;
  for (int p = 0; p < N; p++) {
    const ep_head *h = &heads[p];
    if (h->kind == EP_IDLE || lead[p] != p) continue;
    const struct cv_ep_table *had = ep_table(m, h->toff);
    for (int i = n0; i < n && !had; i++)
      if (ep->tab[i].toff == h->toff) had = &ep->tab[i];
    if (had && (had->X != h->X || had->ldt != h->ldt || had->ab != h->A * h->B)) /* (before it indexes stamps) */
      return cv_fail(m, "expert exchange: process %d sent a round over an expert table of another shape", p);
    if (had || n == CV_EP_TABLES) continue;
    int g = -1;
    for (int k = 0; k < m->d->npgroups; k++)
      if ((int64_t)(m->pg_off[k] * es) == h->toff && m->pg_rows[k] == h->X && m->pg_cols[k] == h->ldt &&
          m->d->pgroups[k].sparse_input < 0)
        g = k;
    if (g < 0) continue;
    struct cv_ep_table *t = &ep->tab[n++];
    size_t cells = (size_t)h->X * (size_t)N;
    *t = (struct cv_ep_table){.toff = h->toff, .X = h->X, .ldt = h->ldt, .ab = h->A * h->B, .group = g,
                              .stamp = ok ? malloc(sizeof(long) * cells) : NULL, .dirty = ok ? calloc(cells, 1) : NULL};
    if (!t->stamp || !t->dirty) ok = ok && !cv_fail_mem(m, "out of memory placing an expert table");
  }
  if (n == n0) return 0;
  if (ep_agree(m, ok)) {
    for (int i = n0; i < n; i++) free(ep->tab[i].stamp), free(ep->tab[i].dirty), ep->tab[i] = (struct cv_ep_table){0};
    return -1;
  }
  for (; ep->ntab < n; ep->ntab++) ep_release(m, &ep->tab[ep->ntab]); /* (every process places it in this round) */
  ep->placed = true;
  return 0;
}

/* the send and receive buffers of an exchange of sbytes[q] bytes to each q, rbytes[p]
   from each p */
static int ep_pair(cavs_model *m, int N, const size_t *sbytes, const size_t *rbytes, char **sendb, char **recvb) {
  size_t out = 0, in = 0;
  for (int q = 0; q < N; q++) out += sbytes[q], in += rbytes[q];
  *sendb = ep_buf(m, EP_SEND, out + 1), *recvb = ep_buf(m, EP_RECV, in + 1);
  return *sendb && *recvb ? 0 : -1;
}

/* The replicas' matrices from their owners, where a replica's copy is older than the
   last step; every process lists the same (the plan is every process's). send and
   recv: [N] scratch for the sizes. */
static int ep_weights(cavs_model *m, const ep_plan *pl, size_t *sbytes, size_t *rbytes) {
  struct cv_experts *ep = &m->ep;
  int N = pl->N, me = ep->comm.rank, n = 0;
  size_t es = m->esize;
  struct ship { struct cv_ep_table *t; long e; int o, q; } ship[EP_MAX_REPLICAS];
  for (int q = 0; q < N; q++) sbytes[q] = rbytes[q] = 0;
  for (int i = 0; i < pl->nhot; i++) {
    struct cv_ep_table *t = ep_table(m, pl->heads[pl->hot_lead[i]].toff);
    long e = pl->hot_e[i];
    int q = pl->rep[i];
    bool listed = false; /* (sent once, should it come twice) */
    for (int k = 0; k < n; k++) listed |= ship[k].t == t && ship[k].e == e && ship[k].q == q;
    if (!t || listed || q == ep_owner(e, t->X, N) || t->stamp[(size_t)e * (size_t)N + (size_t)q] == m->step) continue;
    ship[n++] = (struct ship){t, e, ep_owner(e, t->X, N), q};
    if (me == ship[n - 1].o) sbytes[q] += (size_t)t->ab * es;
    if (me == q) rbytes[ship[n - 1].o] += (size_t)t->ab * es;
  }
  char *sendb, *recvb;
  if (!n) return 0;
  if (ep_agree(m, !ep_pair(m, N, sbytes, rbytes, &sendb, &recvb))) return -1;
  /* to each process in rank order, its matrices in the list's order; likewise back */
  size_t at = 0;
  for (int q = 0; q < N; q++)
    for (int i = 0; i < n; i++)
      if (ship[i].o == me && ship[i].q == q) {
        const struct cv_ep_table *t = ship[i].t;
        (void)ep_read(m, sendb + at, (const char *)m->pflat + t->toff + (size_t)ship[i].e * (size_t)t->ldt * es,
                      (size_t)t->ab * es);
        at += (size_t)t->ab * es;
      }
  double t0 = cv_now();
  if (ep_call(m, ep->comm.alltoallv(ep->comm.arg, sendb, sbytes, recvb, rbytes), "alltoallv of the replicas' matrices"))
    return -1;
  ep->stats.seconds += cv_now() - t0;
  at = 0;
  for (int p = 0; p < N; p++)
    for (int i = 0; i < n; i++)
      if (ship[i].q == me && ship[i].o == p) {
        const struct cv_ep_table *t = ship[i].t;
        (void)ep_write(m, (char *)m->pflat + t->toff + (size_t)ship[i].e * (size_t)t->ldt * es, recvb + at,
                       (size_t)t->ab * es);
        at += (size_t)t->ab * es, ep->stats.matrices++;
      }
  /* (every process marks the same copies current, once they are) */
  for (int i = 0; i < n; i++) ship[i].t->stamp[(size_t)ship[i].e * (size_t)N + (size_t)ship[i].q] = m->step;
  return 0;
}

/* After a backward pass's rounds: each replica's gradient of a placed expert added to
   its owner's, in rank order, and zeroed where it was (a placed table's gradient is
   zero but at its owner's rows). */
static int ep_home(cavs_model *m) {
  struct cv_experts *ep = &m->ep;
  int N = ep->comm.size, me = ep->comm.rank;
  size_t es = m->esize;
  size_t *sbytes = ep_buf(m, EP_HEADS, sizeof(size_t) * 2 * (size_t)N), *rbytes;
  if (!sbytes) return -1;
  rbytes = sbytes + N;
  bool any = false;
  for (int q = 0; q < N; q++) sbytes[q] = rbytes[q] = 0;
  for (int i = 0; i < ep->ntab; i++) {
    const struct cv_ep_table *t = &ep->tab[i];
    for (long e = 0; e < t->X; e++)
      for (int q = 0; q < N; q++) {
        if (!t->dirty[(size_t)e * (size_t)N + (size_t)q]) continue;
        int o = ep_owner(e, t->X, N);
        any = true;
        if (q == me) sbytes[o] += (size_t)t->ab * es;
        if (o == me) rbytes[q] += (size_t)t->ab * es;
      }
  }
  char *sendb, *recvb;
  if (!any) return 0;
  if (ep_agree(m, !ep_pair(m, N, sbytes, rbytes, &sendb, &recvb))) return -1;
  size_t at = 0;
  for (int o = 0; o < N; o++)
    for (int i = 0; i < ep->ntab; i++) {
      const struct cv_ep_table *t = &ep->tab[i];
      for (long e = 0; e < t->X; e++) {
        if (!t->dirty[(size_t)e * (size_t)N + (size_t)me] || ep_owner(e, t->X, N) != o) continue;
        char *g = (char *)m->gflat + t->toff + (size_t)e * (size_t)t->ldt * es;
        (void)ep_read(m, sendb + at, g, (size_t)t->ab * es);
        m->be->zero(m, g, (size_t)t->ab * es);
        at += (size_t)t->ab * es, ep->stats.matrices++;
      }
    }
  double t0 = cv_now();
  int rc = ep_call(m, ep->comm.alltoallv(ep->comm.arg, sendb, sbytes, recvb, rbytes), "alltoallv of the replicas' gradients");
  ep->stats.seconds += cv_now() - t0;
  size_t in = 0;
  for (int q = 0; q < N; q++) in += rbytes[q];
  ep_rows got;
  if (!rc && ep_rows_at(&m->ctx, &got, recvb, in)) rc = -1;
  if (!rc) ep_up(&got, in);
  at = 0;
  for (int q = 0; q < N && !rc; q++)
    for (int i = 0; i < ep->ntab; i++) {
      const struct cv_ep_table *t = &ep->tab[i];
      for (long e = 0; e < t->X; e++) {
        if (!t->dirty[(size_t)e * (size_t)N + (size_t)q] || ep_owner(e, t->X, N) != me) continue;
        size_t ab = (size_t)t->ab * es;
        ep_move(&got, at, ab, (char *)m->gflat + t->toff + (size_t)e * (size_t)t->ldt * es, ab, 1, ab, true, true);
        at += ab;
      }
    }
  for (int i = 0; i < ep->ntab; i++) memset(ep->tab[i].dirty, 0, (size_t)ep->tab[i].X * (size_t)N);
  return rc;
}

/* A round's state, which its steps share (ep_round) */
typedef struct {
  cavs_ctx *c;
  cavs_model *m;
  struct cv_experts *ep;
  int N, me;
  size_t es;
  const ep_head *mine;
  ep_head *heads;
  const struct cv_route *rt;
  long s0, sn;
  const char *x, *dy;
  long ldx, lddy, ldy;
  char *y;
  bool set, active, bwd;
  long A, B, X;
  size_t rowout, backrow; /* bytes of a row this process sends, and of its result */
  /* scratch (EP_WORK): sizes [2 N], offsets [4 N]; loads [N + N X]; counts [X + N X];
     the plan's kown [EP_MAX_REPLICAS N], an expert order [X + EP_MAX_REPLICAS], lead [N] */
  size_t *sbytes, *rbytes, *inat, *repat, *cur, *backat;
  double *load, *eload;
  int64_t *seg, *cnt; /* (seg: this process's counts, then where each expert's slots start) */
  long *kown, *ord;
  int *lead;
  ep_plan pl;
  bool failed; /* ep_products ran out of memory */
} ep_round_st;

/* a collective's return code, its seconds counted */
static int ep_timed(ep_round_st *r, double t0, int rc, const char *what) {
  r->ep->stats.seconds += cv_now() - t0;
  return ep_call(r->m, rc, what);
}

/* 1. the scratch; every process's slot counts for every expert, checked; the plan (who
   leads each emm, the replicas); the tables placed, the replicas' matrices sent, the
   replicas whose gradient goes home after the pass marked */
static int ep_plan_round(ep_round_st *r) {
  cavs_model *m = r->m;
  int N = r->N;
  long X = r->X;
  enum { SB, RB, INAT, REPAT, CUR, BACKAT, NW };
  size_t need = sizeof(size_t) * NW * (size_t)N + sizeof(int) * (size_t)N +
                sizeof(long) * ((size_t)EP_MAX_REPLICAS * (size_t)N + (size_t)X + EP_MAX_REPLICAS) +
                sizeof(double) * ((size_t)N + (size_t)N * (size_t)X) + sizeof(int64_t) * (size_t)X * (size_t)(N + 1);
  size_t *w = ep_buf(m, EP_WORK, need);
  if (ep_agree(m, w)) return -1;
  r->sbytes = w + SB * N, r->rbytes = w + RB * N, r->inat = w + INAT * N, r->repat = w + REPAT * N;
  r->cur = w + CUR * N, r->backat = w + BACKAT * N;
  r->load = (double *)(w + NW * N), r->eload = r->load + N;
  r->seg = (int64_t *)(r->eload + (size_t)N * (size_t)X), r->cnt = r->seg + X;
  r->kown = (long *)(r->cnt + (size_t)N * (size_t)X), r->ord = r->kown + (size_t)EP_MAX_REPLICAS * (size_t)N;
  r->lead = (int *)(r->ord + X + EP_MAX_REPLICAS);
  for (long e = 0; e < X; e++) r->seg[e] = 0;
  for (long s = r->s0; r->active && s < r->s0 + r->sn; s++) r->seg[r->rt->sexp[s]]++;
  double t0 = cv_now();
  if (ep_timed(r, t0, r->ep->comm.allgather(r->ep->comm.arg, r->seg, sizeof(int64_t) * (size_t)X, r->cnt),
               "allgather of the counts"))
    return -1;
  for (int p = 0; p < N; p++) {
    long rows = 0;
    for (long e = 0; e < X; e++) {
      int64_t n = r->cnt[(size_t)p * (size_t)X + (size_t)e];
      if (n < 0 || n > INT_MAX - rows || (n && (r->heads[p].kind == EP_IDLE || e >= r->heads[p].X)))
        return cv_fail(m, "expert exchange: process %d sent a bad count", p);
      rows += (long)n;
    }
    r->lead[p] = p;
    for (int q = 0; q < p; q++)
      if (r->heads[p].kind != EP_IDLE && ep_same_op(&r->heads[q], &r->heads[p])) {
        r->lead[p] = q;
        break;
      }
  }
  r->pl = (ep_plan){.N = N, .X = X, .heads = r->heads, .cnt = r->cnt, .lead = r->lead, .kown = r->kown};
  ep_plan *pl = &r->pl;
  if (r->ep->comm.replicate) ep_replicate(pl, r->load, r->eload);
  if (ep_register(m, r->heads, r->lead, N) || ep_weights(m, pl, r->sbytes, r->rbytes)) return -1;
  for (int i = 0; i < pl->nhot; i++) {
    const ep_head *h = &r->heads[pl->hot_lead[i]];
    struct cv_ep_table *t = h->kind == EP_BWD && (h->flags & EP_DT) ? ep_table(m, h->toff) : NULL;
    if (t && pl->rep[i] != ep_owner(pl->hot_e[i], t->X, N)) t->dirty[(size_t)pl->hot_e[i] * (size_t)N + (size_t)pl->rep[i]] = 1;
  }
  return 0;
}

/* 2. the rows, to each process in the order ep_order gives: each slot's x (backward: x
   and dy side by side); this process's slots of expert e start at seg[e] (the slots run
   by expert). And what comes in from each process, and what goes back to it. */
static int ep_send_rows(ep_round_st *r) {
  cavs_model *m = r->m;
  struct cv_experts *ep = r->ep;
  const ep_plan *pl = &r->pl;
  int N = r->N, me = r->me;
  size_t es = r->es, rowout = r->rowout;
  /* (the buffer the results come back to is this one: made as large as either) */
  size_t sent = (rowout > r->backrow ? rowout : r->backrow) * (size_t)(r->active && r->sn ? r->sn : 1);
  char *sendb = ep_buf(m, EP_SEND, sent);
  ep_rows sb;
  if (!sendb || ep_rows_at(r->c, &sb, sendb, sent)) return ep_agree(m, false); /* (-1 on every process) */
  for (long e = 0, at = r->s0; e < r->X; e++) {
    long n = (long)r->seg[e];
    r->seg[e] = at, at += n;
  }
  size_t at = 0, sat = 0;
  for (int q = 0; q < N; q++) {
    long n = ep_order(pl, me, q, r->ord);
    size_t before = at;
    r->backat[q] = sat;
    for (long i = 0; i < n; i++) {
      long b, k;
      ep_portion(pl, me, r->ord[i], q, &b, &k);
      size_t sl = (size_t)((long)r->seg[r->ord[i]] + b);
      ep_move(&sb, at, rowout, (char *)r->x + sl * (size_t)r->ldx * es, (size_t)r->ldx * es, k, (size_t)r->A * es, false,
              false);
      if (r->bwd)
        ep_move(&sb, at + (size_t)r->A * es, rowout, (char *)r->dy + sl * (size_t)r->lddy * es, (size_t)r->lddy * es, k,
                (size_t)r->B * es, false, false);
      at += (size_t)k * rowout;
      int hot = ep_hot(pl, me, r->ord[i]);
      if (hot >= 0 && q == pl->rep[hot]) ep->stats.rows_replicated += k;
    }
    r->sbytes[q] = at - before;
    sat += rowout ? r->sbytes[q] / rowout * r->backrow : 0;
    long rows = rowout ? (long)(r->sbytes[q] / rowout) : 0;
    *(q == me ? &ep->stats.rows_here : &ep->stats.rows_out) += rows;
  }
  ep_down(&sb, at);
  size_t inb = 0, replyb = 0;
  for (int p = 0; p < N; p++) {
    const ep_head *h = &r->heads[p];
    long n = ep_order(pl, p, me, r->ord), rows = 0;
    for (long i = 0; i < n; i++) {
      long b, k;
      ep_portion(pl, p, r->ord[i], me, &b, &k);
      rows += k;
    }
    size_t rin = (size_t)(h->A + (h->kind == EP_BWD ? h->B : 0)) * es;
    size_t rout = (size_t)(h->kind == EP_FWD ? h->B : (h->flags & EP_DX) ? h->A : 0) * es;
    r->inat[p] = inb, r->repat[p] = replyb;
    r->rbytes[p] = (size_t)rows * rin;
    inb += r->rbytes[p], replyb += (size_t)rows * rout;
    if (p != me) ep->stats.rows_in += rows;
  }
  if (ep_agree(m, ep_buf(m, EP_RECV, inb ? inb : 1) && ep_buf(m, EP_REPLY, replyb ? replyb : 1))) return -1;
  double t0 = cv_now();
  return ep_timed(r, t0, ep->comm.alltoallv(ep->comm.arg, sendb, r->sbytes, ep->buf[EP_RECV], r->rbytes),
                  "alltoallv of the rows");
}

/* 3. the products here: for each distinct emm of the round and each expert whose rows
   come here (in the order they come), one product over every process's rows of it,
   gathered in rank order; the results into each process's reply, in the order its rows
   came (cur[q]: how many of q's came so far). Out of memory: r->failed, for the
   agreement before the results go back. */
static void ep_products(ep_round_st *r) {
  cavs_model *m = r->m;
  struct cv_experts *ep = r->ep;
  const ep_plan *pl = &r->pl;
  int N = r->N, me = r->me;
  size_t es = r->es;
  for (int p = 0; p < N; p++) r->cur[p] = 0;
  for (int p = 0; p < N; p++) {
    const ep_head *h = &r->heads[p];
    if (h->kind == EP_IDLE || r->lead[p] != p) continue;
    long a = h->A, b = h->B;
    bool hb = h->kind == EP_BWD, wdx = hb && (h->flags & EP_DX), wdt = hb && (h->flags & EP_DT);
    size_t rin = (size_t)(a + (hb ? b : 0)) * es, rout = (size_t)(hb ? (wdx ? a : 0) : b) * es;
    long n = ep_order(pl, p, me, r->ord);
    for (long i = 0; i < n; i++) {
      long e = r->ord[i], rows = 0, bq, k;
      for (int q = p; q < N; q++)
        if (r->lead[q] == p) ep_portion(pl, q, e, me, &bq, &k), rows += k;
      if (!rows) continue; /* an expert without rows costs nothing */
      char *xe = ep_buf(m, EP_BACK, (size_t)rows * (size_t)(2 * a + 2 * b) * es);
      if (!xe) {
        r->failed = true;
        return;
      }
      const char *recvb = ep->buf[EP_RECV];
      char *de = xe + (size_t)rows * (size_t)a * es, *oe = de + (size_t)rows * (size_t)b * es;
      long got = 0;
      for (int q = p; q < N; q++) {
        if (r->lead[q] != p) continue;
        ep_portion(pl, q, e, me, &bq, &k);
        for (long j = 0; j < k; j++) {
          const char *src = recvb + r->inat[q] + (r->cur[q] + (size_t)j) * rin;
          memcpy(xe + (size_t)(got + j) * (size_t)a * es, src, (size_t)a * es);
          if (hb) memcpy(de + (size_t)(got + j) * (size_t)b * es, src + (size_t)a * es, (size_t)b * es);
        }
        got += k;
      }
      const char *te = (const char *)m->pflat + (size_t)h->toff + (size_t)e * (size_t)h->ldt * es;
      /* (on a device: the rows up, the products there, the results down) */
      char *dxe = xe, *dde = de, *doe = oe;
      if (!ep_on_host(m)) {
        if (!(dxe = ep_dbuf(m, EP_DPROD, (size_t)rows * (size_t)(2 * a + 2 * b) * es))) {
          r->failed = true;
          return;
        }
        dde = dxe + (size_t)rows * (size_t)a * es, doe = dde + (size_t)rows * (size_t)b * es;
        (void)m->be->upload(m, dxe, xe, (size_t)rows * (size_t)(a + (hb ? b : 0)) * es);
      }
      if (!hb) cavs_gemm(r->c, CAVS_NO_TRANS, CAVS_NO_TRANS, (int)rows, (int)b, (int)a, 1, dxe, a, te, b, 0, doe, b);
      if (wdx) cavs_gemm(r->c, CAVS_NO_TRANS, CAVS_TRANS, (int)rows, (int)a, (int)b, 1, dde, b, te, b, 0, doe, a);
      if (wdt)
        cavs_gemm(r->c, CAVS_TRANS, CAVS_NO_TRANS, (int)a, (int)b, (int)rows, 1, dxe, a, dde, b, 1,
                  (char *)m->gflat + (size_t)h->dtoff + (size_t)e * (size_t)h->lddt * es, b);
      if (doe != oe && rout) (void)m->be->download(m, oe, doe, (size_t)rows * rout);
      got = 0;
      for (int q = p; q < N; q++) {
        if (r->lead[q] != p) continue;
        ep_portion(pl, q, e, me, &bq, &k);
        if (rout)
          memcpy((char *)ep->buf[EP_REPLY] + r->repat[q] + r->cur[q] * rout, oe + (size_t)got * rout, (size_t)k * rout);
        r->cur[q] += (size_t)k, got += k;
      }
    }
  }
}

/* 4. the results back: to each process its rows' results; from each, this process's,
   in the order they were sent to it, into y (set or added) */
static int ep_results(ep_round_st *r) {
  cavs_model *m = r->m;
  struct cv_experts *ep = r->ep;
  const ep_plan *pl = &r->pl;
  int N = r->N, me = r->me;
  size_t es = r->es, rowout = r->rowout, backrow = r->backrow;
  for (int q = 0; q < N; q++) {
    const ep_head *h = &r->heads[q];
    size_t rout = (size_t)(h->kind == EP_FWD ? h->B : (h->flags & EP_DX) ? h->A : 0) * es;
    size_t back = rowout ? r->sbytes[q] / rowout * backrow : 0;
    r->sbytes[q] = r->cur[q] * rout;
    r->rbytes[q] = back;
  }
  /* (the rows sent are done with: ep_send_rows made their buffer large enough) */
  char *backb = ep->buf[EP_SEND];
  if (ep_agree(m, !r->failed)) return -1;
  double t0 = cv_now();
  if (ep_timed(r, t0, ep->comm.alltoallv(ep->comm.arg, ep->buf[EP_REPLY], r->sbytes, backb, r->rbytes),
               "alltoallv of the results"))
    return -1;
  size_t in = 0;
  for (int q = 0; q < N; q++) in += r->rbytes[q];
  ep_rows bb;
  if (ep_rows_at(r->c, &bb, backb, in)) return -1;
  ep_up(&bb, in);
  for (int q = 0; r->active && backrow && q < N; q++) {
    long n = ep_order(pl, me, q, r->ord);
    size_t src = r->backat[q];
    for (long i = 0; i < n; i++) {
      long b, k;
      ep_portion(pl, me, r->ord[i], q, &b, &k);
      char *dst = r->y + (size_t)((long)r->seg[r->ord[i]] + b) * (size_t)r->ldy * es;
      ep_move(&bb, src, backrow, dst, (size_t)r->ldy * es, k, backrow, true, !r->set);
      src += (size_t)k * backrow;
    }
  }
  return 0;
}

/* One round. mine: this process's emm (kind EP_IDLE: none), over slots [s0, s0 + sn) of
   route rt: forward, y = x T_e at each slot; backward, dx = dy T_e^T (set or added)
   and, where e's rows are computed, dT_e += x^T dy. Returns 1 when no process ran
   anything (the pass's rounds are over), 0 after a round, -1 on failure (m->err says
   why). */
static int ep_round(cavs_ctx *c, const ep_head *mine, const struct cv_route *rt, long s0, long sn, const char *x,
                    long ldx, const char *dy, long lddy, char *y, long ldy, bool set) {
  cavs_model *m = c->model;
  struct cv_experts *ep = &m->ep;
  ep_round_st r = {.c = c, .m = m, .ep = ep, .N = ep->comm.size, .me = ep->comm.rank, .es = m->esize, .mine = mine,
                   .rt = rt, .s0 = s0, .sn = sn, .x = x, .dy = dy, .ldx = ldx, .lddy = lddy, .ldy = ldy, .y = y,
                   .set = set, .active = mine->kind != EP_IDLE, .bwd = mine->kind == EP_BWD, .A = mine->A,
                   .B = mine->B, .X = 1};
  r.heads = ep->buf[EP_HEADS]; /* (made with the comm) */
  double t0 = cv_now();
  if (ep_timed(&r, t0, ep->comm.allgather(ep->comm.arg, mine, sizeof *mine, r.heads), "allgather")) return -1;
  bool any = false;
  for (int p = 0; p < r.N; p++) {
    if (ep_check_head(m, &r.heads[p], p)) return -1;
    any |= r.heads[p].kind != EP_IDLE;
    if (r.heads[p].kind != EP_IDLE && r.heads[p].X > r.X) r.X = r.heads[p].X;
  }
  if (!any) return 1;
  ep->stats.rounds++;
  r.rowout = (size_t)(r.A + (r.bwd ? r.B : 0)) * r.es;
  r.backrow = (size_t)(r.bwd ? ((mine->flags & EP_DX) ? r.A : 0) : r.B) * r.es;
  if (ep_plan_round(&r) || ep_send_rows(&r)) return -1;
  ep_products(&r);
  return ep_results(&r) ? -1 : 0;
  return 0;
}

/* this process's emm, in rounds with every other's */
static void ep_emm(cavs_ctx *c, int kind, const struct cv_route *rt, long A, long B, long X, const void *x, long ldx,
                   const void *t, long ldt, const void *dy, long lddy, void *out, long ldout, bool set, void *dt,
                   long lddt, long s0, long sn) {
  cavs_model *m = c->model;
  size_t es = m->esize;
  ep_head h = {.kind = kind, .toff = (int64_t)((const char *)t - (const char *)m->pflat), .A = A, .B = B, .X = X,
               .ldt = ldt, .lddt = lddt, .dtoff = dt ? (int64_t)((const char *)dt - (const char *)m->gflat) : 0,
               .flags = (kind == EP_BWD && out ? EP_DX : 0) | (dt ? EP_DT : 0)};
  size_t nb = m->nflat * es;
  if ((const char *)t < (const char *)m->pflat || (size_t)h.toff >= nb ||
      (dt && ((char *)dt < (char *)m->gflat || (size_t)h.dtoff >= nb))) {
    cv_fail(m, "expert exchange: an expert's table outside the parameters");
    m->launch_failed = true;
  }
  /* a failed pass still answers the others' rounds (in the drain), so none waits; it
     issues nothing else (backend.c, DEAD) */
  if (m->launch_failed) return;
  if (ep_round(c, &h, rt, s0, sn, x, ldx, dy, lddy, out, ldout, set) < 0) m->launch_failed = true;
}

int cv_experts_drain(cavs_model *m, bool bwd) {
  if (!m->ep.on) return 0;
  ep_head idle = {.kind = EP_IDLE};
  int rc;
  bool failed = false;
  /* A round that failed failed on every process (ep_agree), and the processes that ran
     something in it run nothing more this pass: the rounds go on until every process
     is idle. (A second failure is the transport's own: a collective that fails again.) */
  for (int fails = 0; fails < 2 && (rc = ep_round(&m->ctx, &idle, NULL, 0, 0, NULL, 0, NULL, 0, NULL, 0, false)) != 1;)
    if (rc < 0) fails++, failed = true, m->launch_failed = true;
  /* (a process whose rounds failed has said so to none: it still sends its replicas'
     gradients, as the others expect) */
  if (bwd && ep_home(m)) failed = true, m->launch_failed = true;
  return failed ? -1 : 0;
}

void cv_experts_free(cavs_model *m) {
  for (int i = 0; i < 8; i++) free(m->ep.buf[i]), m->ep.buf[i] = NULL, m->ep.cap[i] = 0;
  for (int i = 0; i < 2; i++) m->be->release(m->ep.dbuf[i]), m->ep.dbuf[i] = NULL, m->ep.dcap[i] = 0;
  for (int i = 0; i < m->ep.ntab; i++) free(m->ep.tab[i].stamp), free(m->ep.tab[i].dirty);
  m->ep.ntab = 0;
  m->ep.placed = false;
}

int cv_experts_own(const cavs_model *m, int i, size_t *off, size_t *len) {
  if (i < 0 || i >= m->ep.ntab) return -1;
  const struct cv_ep_table *t = &m->ep.tab[i];
  int N = m->ep.comm.size, me = m->ep.comm.rank;
  long a = ep_first(me, t->X, N), b = ep_first(me + 1, t->X, N);
  *off = (size_t)t->toff / m->esize + (size_t)a * (size_t)t->ldt;
  *len = (size_t)(b - a) * (size_t)t->ldt;
  return t->group;
}

bool cv_experts_own_group(const cavs_model *m, int g, size_t *off, size_t *len) {
  for (int i = 0; i < m->ep.ntab; i++)
    if (m->ep.tab[i].group == g) return cv_experts_own(m, i, off, len) >= 0;
  return false;
}

void cv_experts_rows_held(const cavs_model *m, int g, long *a, long *b) {
  size_t off, len;
  *a = 0, *b = m->pg_rows[g];
  if (!m->ep.placed || !cv_experts_own_group(m, g, &off, &len) || m->pg_cols[g] <= 0) return;
  *a = (long)((off - m->pg_off[g]) / (size_t)m->pg_cols[g]);
  *b = *a + (long)(len / (size_t)m->pg_cols[g]);
}

/* table t's part of cv_experts_release */
static void ep_release(cavs_model *m, struct cv_ep_table *t) {
  int N = m->ep.comm.size, me = m->ep.comm.rank;
  char *arr[4] = {m->gflat, m->pflat, m->m1, m->m2};
  size_t row = (size_t)t->ldt * m->esize, a = (size_t)ep_first(me, t->X, N) * row,
         b = (size_t)ep_first(me + 1, t->X, N) * row, end = (size_t)t->X * row;
  /* the gradient's other rows are zero already (a replica's went home zeroed) but for
     what a pass before the placement left: zeroed where the backend gives nothing back,
     as the backward pass clears only this process's rows */
  for (int k = 0; k < 4; k++) {
    if (!arr[k]) continue;
    if (m->be->drop) {
      m->be->drop(arr[k], (size_t)t->toff, a);
      m->be->drop(arr[k], (size_t)t->toff + b, end - b);
    } else if (k == 0) {
      m->be->zero(m, arr[k] + t->toff, a);
      m->be->zero(m, arr[k] + t->toff + b, end - b);
    }
  }
  ep_restamp(m, t);
}

/* every process's record of the copies: each expert's owner's current, the others'
   given back */
static void ep_restamp(cavs_model *m, struct cv_ep_table *t) {
  int N = m->ep.comm.size;
  for (long e = 0; e < t->X; e++)
    for (int q = 0; q < N; q++) t->stamp[(size_t)e * (size_t)N + (size_t)q] = q == ep_owner(e, t->X, N) ? m->step : -1;
}

void cv_experts_release(cavs_model *m) {
  for (int i = 0; i < m->ep.ntab; i++) ep_release(m, &m->ep.tab[i]);
}

void cv_experts_new_params(cavs_model *m) {
  for (int i = 0; i < m->ep.ntab; i++) ep_restamp(m, &m->ep.tab[i]);
}

double cv_experts_norm2(cavs_model *m, double mine) {
  struct cv_experts *ep = &m->ep;
  int N = ep->comm.size;
  double *all = ep->buf[EP_SAY], sum = 0; /* (made with the comm) */
  if (ep_call(m, ep->comm.allgather(ep->comm.arg, &mine, sizeof mine, all), "allgather of the norms")) {
    ep->failed = true;
    return 0;
  }
  for (int p = 0; p < N; p++) sum += all[p];
  return sum;
}

int cavs_model_expert_placed(cavs_model *m, int i, size_t *off, size_t *count) {
  if (!m || i < 0) return -1;
  if (i < m->ep.ntab) {
    const struct cv_ep_table *t = &m->ep.tab[i];
    if (off) *off = (size_t)t->toff / m->esize;
    if (count) *count = (size_t)t->X * (size_t)t->ldt;
  }
  return m->ep.ntab;
}

/* Every placed expert's matrix, and its optimizer state, made its owner's on process
   root (-1: on every process): each process sends its own experts' rows to root (to
   every other), a table and an array (parameters, moments) at a time, through buffers
   of that size freed after (a checkpoint's gather must not leave the whole experts'
   size in the exchange's scratch). */
static int ep_share(cavs_model *m, int root) {
  struct cv_experts *ep = &m->ep;
  if (!ep->placed) return 0;
  int N = ep->comm.size, me = ep->comm.rank;
  if (root < -1 || root >= N) return cv_fail(m, "cavs_model_expert_gather: no process %d of %d", root, N);
  size_t es = m->esize;
  /* the moment blocks the model holds (none for SGD, one for momentum and Adagrad):
     every process steps with one optimizer, so all hold the same */
  char *arr[3] = {m->pflat, m->m1, m->m2};
  size_t *sbytes = ep_buf(m, EP_HEADS, sizeof(size_t) * 2 * (size_t)N), *rbytes;
  if (!sbytes) return -1;
  rbytes = sbytes + N;
  /* (a copy to the device that failed: the model's failure, said once every round is
     done, the other processes waiting for this one's part of each) */
  bool wrote = true;
  for (int a = 0; a < 3; a++)
    for (int i = 0; i < ep->ntab && arr[a]; i++) {
      const struct cv_ep_table *t = &ep->tab[i];
      size_t off, own, in = 0, row = (size_t)t->ldt * es;
      cv_experts_own(m, i, &off, &own);
      own *= es;
      for (int p = 0; p < N; p++) {
        size_t b = (size_t)(ep_first(p + 1, t->X, N) - ep_first(p, t->X, N)) * row;
        rbytes[p] = p == me || (root >= 0 && root != me) ? 0 : b, in += rbytes[p];
        sbytes[p] = p == me || (root >= 0 && p != root) ? 0 : own;
      }
      /* to root: the rows in place (on the cpu backend); to every other process, or from
         a device: a copy each */
      int others = 0;
      for (int q = 0; q < N; q++) others += sbytes[q] != 0;
      bool copy = others > 1 || (others && !ep_on_host(m));
      char *copies = copy ? malloc(own * (size_t)others) : NULL, *recvb = malloc(in + 1);
      bool ok = (!copy || copies) && recvb;
      if (!ok) cv_fail_mem(m, "out of memory gathering the experts");
      /* (read before the processes agree: a device that failed sends nothing to save) */
      if (ok && copies && ep_read(m, copies, arr[a] + off * es, own)) ok = false;
      if (ep_agree(m, ok)) {
        free(copies), free(recvb);
        return -1;
      }
      for (int k = 1; k < others && copies; k++) memcpy(copies + (size_t)k * own, copies, own);
      double t0 = cv_now();
      int rc = ep->comm.alltoallv(ep->comm.arg, copies ? copies : others ? arr[a] + off * es : recvb, sbytes, recvb, rbytes);
      ep->stats.seconds += cv_now() - t0;
      size_t at = 0;
      for (int p = 0; p < N && !rc; p++) {
        if (rbytes[p] && ep_write(m, arr[a] + t->toff + (size_t)ep_first(p, t->X, N) * row, recvb + at, rbytes[p]))
          wrote = false;
        at += rbytes[p];
      }
      free(copies), free(recvb);
      if (ep_call(m, rc, "alltoallv of the experts' matrices")) return -1;
    }
  if (!wrote) return -1;
  /* (every process marks the same copies current) */
  for (int i = 0; i < ep->ntab; i++)
    for (size_t k = 0; k < (size_t)ep->tab[i].X * (size_t)N; k++)
      if (root < 0 || (int)(k % (size_t)N) == root) ep->tab[i].stamp[k] = m->step;
  return 0;
}

int cavs_model_expert_sync(cavs_model *m) { return m ? ep_share(m, -1) : -1; }

int cavs_model_expert_gather(cavs_model *m, int root) {
  if (!m) return -1;
  /* (the comm's size: the placement's once placed, else the last one set) */
  if (root < 0 || (m->ep.comm.size > 0 && root >= m->ep.comm.size))
    return cv_fail(m, "cavs_model_expert_gather: no process %d of %d", root, m->ep.comm.size);
  return ep_share(m, root);
}

int cavs_model_expert_release(cavs_model *m) {
  if (!m) return -1;
  if (m->ep.placed) cv_experts_release(m);
  return 0;
}

/* The tables the descriptor names (cavs_pgroup_desc.experts) placed when the comm is
   first set, before any pass: every process places the same ones (the descriptor is
   every process's), and cavs_model_init or a checkpoint's parameters after it write
   this process's experts alone (cv_experts_own_group), so that no process ever holds
   the others'. A table the descriptor does not name is placed by the first round
   that runs over it (ep_register), as before. */
static int ep_place_described(cavs_model *m) {
  struct cv_experts *ep = &m->ep;
  if (ep->ntab) return 0;
  size_t es = m->esize, N = (size_t)ep->comm.size;
  int n = 0;
  for (int k = 0; k < m->d->npgroups && n < CV_EP_TABLES; k++) {
    if (!m->d->pgroups[k].experts || m->d->pgroups[k].sparse_input >= 0 || m->pg_rows[k] <= 0 || m->pg_cols[k] <= 0)
      continue;
    size_t cells = (size_t)m->pg_rows[k] * N;
    struct cv_ep_table *t = &ep->tab[n++];
    *t = (struct cv_ep_table){.toff = (int64_t)((size_t)m->pg_off[k] * es), .X = m->pg_rows[k], .ldt = m->pg_cols[k],
                              .ab = m->pg_cols[k], .group = k, .stamp = malloc(sizeof(long) * cells),
                              .dirty = calloc(cells, 1)};
    if (!t->stamp || !t->dirty) {
      for (int i = 0; i < n; i++) free(ep->tab[i].stamp), free(ep->tab[i].dirty), ep->tab[i] = (struct cv_ep_table){0};
      return cv_fail_mem(m, "out of memory placing an expert table");
    }
  }
  for (; ep->ntab < n; ep->ntab++) ep_release(m, &ep->tab[ep->ntab]);
  ep->placed = n > 0;
  return 0;
}

int cavs_model_set_expert_comm(cavs_model *m, const cavs_expert_comm *comm) {
  if (!m) return -1;
  if (!comm) { /* (a placement keeps its comm: steps and syncs use it) */
    m->ep.on = false;
    return 0;
  }
  if (comm->size < 1 || comm->size > 4096 || comm->rank < 0 || comm->rank >= comm->size || !comm->allgather ||
      !comm->alltoallv)
    return cv_fail(m, "expert parallelism: process %d of %d, or a collective missing", comm->rank, comm->size);
  if (m->ep.placed && (comm->rank != m->ep.comm.rank || comm->size != m->ep.comm.size))
    return cv_fail(m, "expert parallelism: the experts are placed on %d processes (this one %d), not %d (%d)",
                   m->ep.comm.size, m->ep.comm.rank, comm->size, comm->rank);
  /* what a round needs before its first collective, and the agreement's words: made
     here, so that nothing between two of a round's collectives fails unsaid */
  size_t N = (size_t)comm->size;
  if (!ep_buf(m, EP_HEADS, sizeof(ep_head) * N) || !ep_buf(m, EP_SAY, sizeof(double) * N)) return -1;
  m->ep.comm = *comm;
  m->ep.on = true;
  if (ep_place_described(m)) {
    m->ep.on = false;
    return -1;
  }
  return 0;
}

void cavs_model_expert_stats(cavs_model *m, cavs_expert_stats *s, int reset) {
  if (!m) return;
  if (s) *s = m->ep.stats;
  if (reset) memset(&m->ep.stats, 0, sizeof m->ep.stats);
}

/* an expert's products handed to the backend at a time (a list on the stack) */
enum { GEMMS_CHUNK = 64 };

void cavs_emm_fwd(cavs_ctx *c, int route, int K, long A, long B, const void *x, long ldx, const void *t, long ldt,
                  const void *bias, long ldb, void *y, long ldy, int add, int act, int r0, int n) {
  const struct cv_route *rt = moe_ops(c) ? route_of(c, route) : NULL;
  if (!rt || n <= 0) return;
  long s0, sn;
  cv_slot_range(rt, K, r0, n, &s0, &sn);
  const cv_moe_ops *o = moe_ops(c);
  if (bias && (c->model->ep.on || !o->emm_fwd)) {
    /* the bias rows first, then the product adds (the cpu's, and expert parallelism's
       rounds): the bits of the two operations the backend's grouped product is */
    cavs_erow_fwd(c, route, K, bias, ldb, y, ldy, B, r0, n);
    bias = NULL, add = 1;
  }
  if (c->model->ep.on) {
    ep_emm(c, EP_FWD, rt, A, B, rt->nx_pass, x, ldx, t, ldt, NULL, 0, y, ldy, !add, NULL, 0, s0, sn);
    if (act != CAVS_ACT_NONE) o->act(c, rt, K, act, y, ldy, NULL, 0, B, r0, n, false);
    return;
  }
  if (o->emm_fwd) { /* the backend's grouped product, from its own copy of the slots */
    o->emm_fwd(c, rt, K, A, B, x, ldx, t, ldt, bias, ldb, y, ldy, add != 0, act, s0, sn);
    c->model->route[route].products++;
    return;
  }
  /* one product per expert over its slots: none for an expert without; each writes its
     own slots, so they go to the backend as one list (cv_gemms), GEMMS_CHUNK at a time,
     each followed by the activation over its slots */
  cv_gemm g[GEMMS_CHUNK];
  int ng = 0;
  for (long s = s0, len; s < s0 + sn; s += len) {
    int ex = rt->sexp[s];
    for (len = 1; s + len < s0 + sn && rt->sexp[s + len] == ex; len++)
      ;
    g[ng++] = (cv_gemm){CAVS_NO_TRANS, CAVS_NO_TRANS, (int)len, (int)B, (int)A, 1, add ? 1 : 0,
                        at(c, x, s, ldx), at(c, t, ex, ldt), (void *)at(c, y, s, ldy), ldx, B, ldy, .act = act};
    c->model->route[route].products++;
    if (ng == GEMMS_CHUNK) cv_gemms(c, g, ng), ng = 0;
  }
  cv_gemms(c, g, ng);
}

/* cavs_emm_bwd's products where the backend has no grouped one, or over the ranks */
static void emm_bwd_products(cavs_ctx *c, int route, const struct cv_route *rt, int K, long A, long B,
                             const void *x, long ldx, const void *t, long ldt, const void *dy, long lddy, void *dx,
                             long lddx, int dx_set, int dx_act, void *dt, long lddt, int r0, int n, long s0, long sn) {
  if (c->model->ep.on) {
    ep_emm(c, EP_BWD, rt, A, B, rt->nx_pass, x, ldx, t, ldt, dy, lddy, dx, lddx, dx_set, dt, lddt, s0, sn);
    if (dx && dx_act != CAVS_ACT_NONE) moe_ops(c)->act(c, rt, K, dx_act, (void *)x, ldx, dx, lddx, A, r0, n, true);
    return;
  }
  /* (dx's slots, and dt's expert rows, are each one product's: one list, as forward) */
  cv_gemm g[GEMMS_CHUNK];
  int ng = 0;
  for (long s = s0, len; s < s0 + sn; s += len) {
    int ex = rt->sexp[s];
    for (len = 1; s + len < s0 + sn && rt->sexp[s + len] == ex; len++)
      ;
    /* dx += dy W_e^T (dx = with dx_set: every slot of the range is one expert's); dW_e +=
       x^T dy, over the expert's slots */
    c->model->route[route].products += (dx != NULL) + (dt != NULL);
    if (dx)
      g[ng++] = (cv_gemm){CAVS_NO_TRANS, CAVS_TRANS, (int)len, (int)A, (int)B, 1, dx_set ? 0 : 1,
                          at(c, dy, s, lddy), at(c, t, ex, ldt), (void *)at(c, dx, s, lddx), lddy, B, lddx,
                          .act = dx_act, .grad = true, .y = at(c, x, s, ldx), .ldy = ldx};
    if (dt)
      g[ng++] = (cv_gemm){CAVS_TRANS, CAVS_NO_TRANS, (int)A, (int)B, (int)len, 1, 1,
                          at(c, x, s, ldx), at(c, dy, s, lddy), (void *)at(c, dt, ex, lddt), ldx, lddy, B,
                          .act = CAVS_ACT_NONE};
    if (ng >= GEMMS_CHUNK - 1) cv_gemms(c, g, ng), ng = 0;
  }
  cv_gemms(c, g, ng);
}

void cavs_emm_bwd(cavs_ctx *c, int route, int K, long A, long B, const void *x, long ldx, const void *t, long ldt,
                  const void *dy, long lddy, void *dx, long lddx, int dx_set, int dx_act, void *dt, long lddt,
                  void *dbias, long lddb, int r0, int n) {
  const struct cv_route *rt = moe_ops(c) ? route_of(c, route) : NULL;
  if (!rt || n <= 0) return;
  long s0, sn;
  cv_slot_range(rt, K, r0, n, &s0, &sn);
  const cv_moe_ops *o = moe_ops(c);
  if (!c->model->ep.on && o->emm_bwd) {
    o->emm_bwd(c, rt, K, A, B, x, ldx, t, ldt, dy, lddy, dx, lddx, dx_set != 0, dx_act, dt, lddt, dbias, lddb, s0,
               sn);
    c->model->route[route].products += (dx != NULL) + (dt != NULL);
    return;
  }
  emm_bwd_products(c, route, rt, K, A, B, x, ldx, t, ldt, dy, lddy, dx, lddx, dx_set, dx_act, dt, lddt, r0, n, s0, sn);
  /* (the bias's gradient after the products, as cavs_erow_bwd ran after them) */
  if (dbias) cavs_erow_bwd(c, route, K, dbias, lddb, dy, lddy, B, r0, n);
}

void cv_routes_free(cavs_model *m) {
  for (int i = 0; i < CV_MAX_ROUTES; i++) {
    struct cv_route *r = &m->route[i];
    free(r->sexp), free(r->srow), free(r->rslot), free(r->cnt), free(r->load), free(r->rbeg), free(r->rend);
    free(r->scr), free(r->pcnt), free(r->psum);
    memset(r, 0, sizeof *r);
  }
  cv_experts_free(m);
}

int cavs_model_expert_load(cavs_model *m, int route, long *counts, int cap) {
  if (!m || route < 0 || cap < 0 || (cap > 0 && !counts)) return -1;
  if (route >= CV_MAX_ROUTES || !m->route[route].load) return 0;
  const struct cv_route *r = &m->route[route];
  for (long j = 0; j < r->nx && j < cap; j++) counts[j] = r->load[j];
  return (int)r->nx;
}

void cavs_model_expert_load_reset(cavs_model *m) {
  if (!m) return;
  for (int i = 0; i < CV_MAX_ROUTES; i++)
    if (m->route[i].load) memset(m->route[i].load, 0, sizeof(long) * (size_t)m->route[i].nx);
}

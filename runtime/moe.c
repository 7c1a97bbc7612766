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

#define MOE_KERNELS(R, S)                                                                                              \
  CV_HOT static void sbcast_##S(const struct cv_route *rt, int K, R *x, long ldx, R *s, long lds, long w, int r0, int n,   \
                         bool bwd) {                                                                                 \
    for (int r = r0; r < r0 + n; r++) {                                                                              \
      R *xr = x + (size_t)r * (size_t)ldx;                                                                           \
      for (int k = 0; k < K; k++) {                                                                                  \
        R *sr = s + (size_t)rt->rslot[(size_t)K * (size_t)r + (size_t)k] * (size_t)lds;                              \
        if (bwd)                                                                                                     \
          for (long j = 0; j < w; j++) xr[j] += sr[j];                                                               \
        else                                                                                                         \
          memcpy(sr, xr, sizeof(R) * (size_t)w);                                                                     \
      }                                                                                                              \
    }                                                                                                                \
  }                                                                                                                  \
  CV_HOT static void erow_##S(const struct cv_route *rt, int K, R *t, long ldt, R *y, long ldy, long w, int r0, int n,     \
                       bool bwd) {                                                                                   \
    long s0, sn;                                                                                                     \
    cv_slot_range(rt, K, r0, n, &s0, &sn);                                                                           \
    for (long s = s0; s < s0 + sn; s++) {                                                                            \
      R *tr = t + (size_t)rt->sexp[s] * (size_t)ldt, *yr = y + (size_t)s * (size_t)ldy;                              \
      if (bwd)                                                                                                       \
        for (long j = 0; j < w; j++) tr[j] += yr[j];                                                                 \
      else                                                                                                           \
        memcpy(yr, tr, sizeof(R) * (size_t)w);                                                                       \
    }                                                                                                                \
  }                                                                                                                  \
  CV_HOT static void scomb_fwd_##S(const struct cv_route *rt, int K, const R *v, long ldv, const R *wt, long ldw, R *y,    \
                            long ldy, long w, int r0, int n) {                                                       \
    for (int r = r0; r < r0 + n; r++) {                                                                              \
      R *yr = y + (size_t)r * (size_t)ldy;                                                                           \
      const R *wr = wt + (size_t)r * (size_t)ldw;                                                                    \
      const int *sl = rt->rslot + (size_t)K * (size_t)r;                                                             \
      for (long j = 0; j < w; j++) yr[j] = 0;                                                                        \
      for (int k = 0; k < K; k++) {                                                                                  \
        const R *vr = v + (size_t)sl[k] * (size_t)ldv;                                                               \
        R a = wr[rt->sexp[sl[k]]];                                                                                   \
        for (long j = 0; j < w; j++) yr[j] += a * vr[j];                                                             \
      }                                                                                                              \
    }                                                                                                                \
  }                                                                                                                  \
  CV_HOT static void scomb_bwd_##S(const struct cv_route *rt, int K, const R *v, long ldv, const R *wt, long ldw,          \
                            const R *dy, long lddy, R *dv, long lddv, bool set, R *dw, long lddw, long w, int r0,    \
                            int n) {                                                                                 \
    for (int r = r0; r < r0 + n; r++) {                                                                              \
      const R *dyr = dy + (size_t)r * (size_t)lddy, *wr = wt + (size_t)r * (size_t)ldw;                              \
      const int *sl = rt->rslot + (size_t)K * (size_t)r;                                                             \
      for (int k = 0; k < K; k++) {                                                                                  \
        int ex = rt->sexp[sl[k]];                                                                                    \
        const R *vr = v + (size_t)sl[k] * (size_t)ldv;                                                               \
        if (dv) {                                                                                                    \
          R *dvr = dv + (size_t)sl[k] * (size_t)lddv, a = wr[ex];                                                    \
          if (set)                                                                                                   \
            for (long j = 0; j < w; j++) dvr[j] = a * dyr[j];                                                        \
          else                                                                                                       \
            for (long j = 0; j < w; j++) dvr[j] += a * dyr[j];                                                       \
        }                                                                                                            \
        if (dw) dw[(size_t)r * (size_t)lddw + (size_t)ex] += cv_slot_dot_##S(dyr, vr, w);                          \
      }                                                                                                              \
    }                                                                                                                \
  }

MOE_KERNELS(float, f)
MOE_KERNELS(double, d)

#define MOE_DBL(c) ((c)->desc->precision == CAVS_DOUBLE)
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
  MOE_CALL(c, sbcast, rt, K, x, ldx, s, lds, w, r0, n, bwd);
}
static void cpu_erow(cavs_ctx *c, const struct cv_route *rt, int K, void *t, long ldt, void *y, long ldy, long w,
                     int r0, int n, bool bwd) {
  MOE_CALL(c, erow, rt, K, t, ldt, y, ldy, w, r0, n, bwd);
}
static void cpu_scomb_fwd(cavs_ctx *c, const struct cv_route *rt, int K, const void *v, long ldv, const void *wt,
                          long ldw, void *y, long ldy, long w, int r0, int n) {
  MOE_CALL(c, scomb_fwd, rt, K, v, ldv, wt, ldw, y, ldy, w, r0, n);
}
static void cpu_scomb_bwd(cavs_ctx *c, const struct cv_route *rt, int K, const void *v, long ldv, const void *wt,
                          long ldw, const void *dy, long lddy, void *dv, long lddv, bool dv_set, void *dw, long lddw,
                          long w, int r0, int n) {
  MOE_CALL(c, scomb_bwd, rt, K, v, ldv, wt, ldw, dy, lddy, dv, lddv, dv_set, dw, lddw, w, r0, n);
}

const cv_moe_ops cv_moe_cpu = {
    .topk_fwd = cpu_topk_fwd,
    .topk_bwd = cpu_topk_bwd,
    .sbcast = cpu_sbcast,
    .erow = cpu_erow,
    .scomb_fwd = cpu_scomb_fwd,
    .scomb_bwd = cpu_scomb_bwd,
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

void cavs_emm_fwd(cavs_ctx *c, int route, int K, long A, long B, const void *x, long ldx, const void *t, long ldt,
                  void *y, long ldy, int r0, int n) {
  const struct cv_route *rt = moe_ops(c) ? route_of(c, route) : NULL;
  if (!rt || n <= 0) return;
  long s0, sn;
  cv_slot_range(rt, K, r0, n, &s0, &sn);
  /* one product per expert over its slots: none for an expert without */
  for (long s = s0, len; s < s0 + sn; s += len) {
    int ex = rt->sexp[s];
    for (len = 1; s + len < s0 + sn && rt->sexp[s + len] == ex; len++)
      ;
    cavs_gemm(c, CAVS_NO_TRANS, CAVS_NO_TRANS, (int)len, (int)B, (int)A, 1, at(c, x, s, ldx), ldx, at(c, t, ex, ldt), B,
              0, (void *)at(c, y, s, ldy), ldy);
    c->model->route[route].products++;
  }
}

void cavs_emm_bwd(cavs_ctx *c, int route, int K, long A, long B, const void *x, long ldx, const void *t, long ldt,
                  const void *dy, long lddy, void *dx, long lddx, int dx_set, void *dt, long lddt, int r0, int n) {
  const struct cv_route *rt = moe_ops(c) ? route_of(c, route) : NULL;
  if (!rt || n <= 0) return;
  long s0, sn;
  cv_slot_range(rt, K, r0, n, &s0, &sn);
  for (long s = s0, len; s < s0 + sn; s += len) {
    int ex = rt->sexp[s];
    for (len = 1; s + len < s0 + sn && rt->sexp[s + len] == ex; len++)
      ;
    /* dx += dy W_e^T (dx = with dx_set: every slot of the range is one expert's); dW_e +=
       x^T dy, over the expert's slots */
    c->model->route[route].products += (dx != NULL) + (dt != NULL);
    if (dx)
      cavs_gemm(c, CAVS_NO_TRANS, CAVS_TRANS, (int)len, (int)A, (int)B, 1, at(c, dy, s, lddy), lddy, at(c, t, ex, ldt), B,
                dx_set ? 0 : 1, (void *)at(c, dx, s, lddx), lddx);
    if (dt)
      cavs_gemm(c, CAVS_TRANS, CAVS_NO_TRANS, (int)A, (int)B, (int)len, 1, at(c, x, s, ldx), ldx, at(c, dy, s, lddy),
                lddy, 1, (void *)at(c, dt, ex, lddt), B);
  }
}

void cv_routes_free(cavs_model *m) {
  for (int i = 0; i < CV_MAX_ROUTES; i++) {
    struct cv_route *r = &m->route[i];
    free(r->sexp), free(r->srow), free(r->rslot), free(r->cnt), free(r->load), free(r->rbeg), free(r->rend);
    free(r->scr), free(r->pcnt), free(r->psum);
    memset(r, 0, sizeof *r);
  }
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

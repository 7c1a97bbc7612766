/* scheduler.c: the batching scheduler and the phase order of a training step.
 *
 * For a minibatch of K graphs: level(v) = 0 without children, else 1 + the largest level
 * of its children (computed from the leaves up, without recursion, so any depth works).
 * Under BFS (and depth, the same) a task is every vertex of one type and one level
 * across the K graphs; agenda and frontier choose one type a step and take every ready
 * vertex of it (the policies, below), and what follows holds for them with "step" for
 * "level". Rows are
 * numbered type by type and, within a type, level by level: every task is a contiguous
 * row range, and so are all the rows of one type, which lets the eager and lazy phases
 * run over a type's rows in one call. Tasks run level by level (children first). All of
 * it is O(V) with counting sorts, in scratch arrays that only grow.
 *
 * Within a (type, level), rows are numbered from the top down so that a task's children
 * are consecutive rows wherever the structure allows: the roots first, then, task by
 * task from the highest level, row by row, each parent's children in slot order take
 * the next rows of their own (type, level). For chains and complete trees the children
 * of a task's rows are then one block of the level below, parent by parent, slot by
 * slot: the rows of the task's gathered buffer ([rows, C * width], slot k at column
 * k * width) read as one [C * rows, width] block of the state buffer, which a gather
 * needs to become a view. For a vertex with two parents the first one seen places it.
 * cavs_backend_stats counts the gathered rows and those in such blocks.
 *
 * Forward:  pull (the rows of the types that read it) -> eager (per type) -> path (per task) -> lazy (per type)
 *           -> push (all rows, losses).
 * Backward: the same in reverse; every parameter gradient of a type is formed after its
 *           path phase, as one product over all its rows.
 * CAVS_SERIAL runs every phase one row at a time: the baseline without batching. */
#include "cv.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The gathers' views. A vertex type's gathered buffers point at the state buffer itself
 * (and their gradients at its gradient), so that its gathers copy nothing, when cavsc
 * allows it (cavs_gather_desc.view: nothing touches them at a row without children)
 * and the rows allow it: for each gather, child `slot` of the type's i-th row with
 * children (its rows past the level-0 ones, which come first) is state row
 * base + i * step, step being the buffer's width in state rows. Its buffer's row r is
 * then state row base + (r - first) * step, at the gather's column: the pointer is the
 * state's moved by base * W - first * ld - off scalars, which is the same for every
 * gather into one buffer, and the rows of gathers into different buffers do not
 * overlap (a fused loop's pointers to two of them are restrict). On chains and on
 * minibatches of complete trees of one depth (the rows numbered top-down) every task of
 * a type is such a block, one after the other; elsewhere the type copies. The pointer
 * lies below the state buffer (children come first), where only rows at or past
 * `first` are ever reached through it: it is formed in integer arithmetic. */
enum { MAX_VIEWED = 16 };
static void plan_views(cavs_model *m) {
  const cavs_desc *d = m->d;
  int C = m->maxc;
  for (int t = 0; t < d->nvertex; t++) {
    const cavs_vertex_desc *v = &d->vertex[t];
    for (int g = 0; g < v->ngathers; g++) {
      int b = v->gathers[g].buf;
      if (b >= 0 && b < d->nbufs) m->cval[b] = m->val[b], m->cgrad[b] = m->grad[b];
    }
    m->tview[t] = 0;
    int first = m->type_r0[t] + m->type_leaf[t], end = m->type_r0[t] + m->type_n[t];
    bool ok = !(m->ablate & CAVS_NO_VIEWS) && v->ngathers > 0 && v->ngathers <= MAX_VIEWED && first < end;
    long delta[MAX_VIEWED], lo[MAX_VIEWED], hi[MAX_VIEWED], off[MAX_VIEWED];
    int src[MAX_VIEWED];
    for (int g = 0; ok && g < v->ngathers; g++) {
      const cavs_gather_desc *q = &v->gathers[g];
      int sb = q->src; /* the state it reads (checked when the model was made) */
      ok = q->view && q->slot >= 0 && q->slot < v->children && q->slot < C && q->buf >= 0 && q->buf < d->nbufs &&
           q->buf != sb && q->buf != d->push_buf && d->bufs[q->buf].grad != CAVS_GRAD_NONE;
      for (int u = 0; ok && u < d->nvertex; u++) ok = q->buf != d->vertex[u].state;
      if (!ok) break;
      long ld = m->bw[q->buf], W = m->bw[sb];
      src[g] = sb;
      off[g] = cv_lin(&q->off, m->ctx.dims);
      ok = W > 0 && ld % W == 0 && off[g] >= 0 && off[g] % W == 0 && off[g] + W <= ld;
      long step = ok ? ld / W : 0;
      int base = m->child[(size_t)first * C + q->slot];
      for (int r = first; ok && r < end; r++)
        ok = base >= 0 && m->child[(size_t)r * C + q->slot] == base + (long)(r - first) * step;
      if (!ok) break;
      delta[g] = (long)base * W - (long)first * ld - off[g];
      lo[g] = base;
      hi[g] = base + (long)(end - first - 1) * step;
      for (int h = 0; ok && h < g; h++)
        ok = v->gathers[h].buf == q->buf ? src[h] == sb && delta[h] == delta[g] && off[h] != off[g]
             : src[h] != sb || hi[g] < lo[h] || hi[h] < lo[g];
    }
    if (!ok) continue;
    for (int g = 0; g < v->ngathers; g++) {
      int b = v->gathers[g].buf;
      intptr_t by = (intptr_t)delta[g] * (intptr_t)m->esize;
      m->cval[b] = (void *)((uintptr_t)m->val[src[g]] + (uintptr_t)by);
      /* (a gradient the backward pass sets whole, CAVS_GRAD_WHOLE, stays in the buffer:
         set in the state's, it would overwrite what others added there; the gather
         adds it back, as where it copies: cavs_gather_bwd) */
      if (d->bufs[b].grad == CAVS_GRAD) m->cgrad[b] = (void *)((uintptr_t)m->grad[src[g]] + (uintptr_t)by);
    }
    m->tview[t] = 1;
    m->stats.gathered_viewed += (long)(end - first) * v->ngathers;
  }
}

/* Homes (cavsc's, emit.c: state_homes). A type with cavs_vertex_desc.homes = H stores
 * each row's state in its fused loops at the row and at home_val[k][r], k < H;
 * backward, it adds what it finds at each home_grad[k][r] to the state's gradient. A
 * row's homes are the columns of a parent's gathered row that the parent's gather would
 * copy it to, or the edge row of a parent's set that echild would copy it to: the first
 * H such reads, in the order of the types, then each type's gathers and its set, then
 * the rows, of the state its type writes, by a type whose gathered buffers are not
 * views (a view is the state itself). A home's key (hkey[k]: parent row * maxc + slot,
 * or cv_edge_key) tells the gathers and echild to copy nothing there and to add
 * nothing back. A home k not given (a root; a child whose parents all view; fewer
 * reads than homes) is a scratch row of the row's own that nothing reads, and a row of
 * zeros; reads past H copy as before. No row order is needed: on trees and chains
 * every child is at home, whatever the levels its parents mix. O(rows + edges). */
/* Row ch, read from state `src` where `key` says, at home there, at byte `at` of buffer b
   (and its gradient), if its type has a home left */
static void home(cavs_model *m, int ch, int src, long key, int b, size_t at) {
  if (ch < 0 || ch >= m->rows) return; /* (a carried state's row runs no loops) */
  const cavs_vertex_desc *cv = &m->d->vertex[m->vtype[m->queue[ch]]];
  if (cv->state != src) return;
  for (int k = 0; k < cv->homes; k++)
    if (m->hkey[k][ch] < 0) {
      m->hkey[k][ch] = key;
      m->hval[k][ch] = (char *)m->val[b] + at;
      m->hgrad[k][ch] = m->grad[b] ? (char *)m->grad[b] + at : m->hzero;
      m->stats.gathered_homed++;
      return;
    }
}

static void plan_homes(cavs_model *m) {
  if (!m->nhomes) return;
  const cavs_desc *d = m->d;
  int C = m->maxc;
  size_t step = (size_t)m->home_w * m->esize;
  /* (the carried states' rows too: a gather asks whether they are at home; they never
     are, running no loops) */
  for (int k = 0; k < m->nhomes; k++)
    for (int r = 0; r < m->rows + m->carry_in; r++) {
      m->hval[k][r] = (char *)m->hdump[k] + (size_t)r * step;
      m->hgrad[k][r] = m->hzero;
      m->hkey[k][r] = -1;
    }
  if (m->ablate & CAVS_NO_HOMES) return;
  for (int t = 0; t < d->nvertex; t++) {
    const cavs_vertex_desc *v = &d->vertex[t];
    if (m->tview[t]) continue;
    int first = m->type_r0[t] + m->type_leaf[t], end = m->type_r0[t] + m->type_n[t];
    for (int g = 0; g < v->ngathers; g++) {
      const cavs_gather_desc *q = &v->gathers[g];
      bool again = false; /* a slot gathered twice: the first gather has its homes */
      for (int h = 0; h < g; h++) again |= v->gathers[h].slot == q->slot;
      if (again || q->slot < 0 || q->slot >= v->children || q->slot >= C || q->buf < 0 || q->buf >= d->nbufs) continue;
      long ld = m->bw[q->buf], off = cv_lin(&q->off, m->ctx.dims);
      if (off < 0 || off + m->bw[q->src] > ld) continue;
      for (int r = first; r < end; r++)
        home(m, m->child[(size_t)r * C + q->slot], q->src, (long)r * C + q->slot, q->buf,
             ((size_t)r * (size_t)ld + (size_t)off) * m->esize);
    }
    /* the set's edges: edge e's row of the buffer echild fills */
    int eb = v->edge_buf;
    if (!v->edges || eb < 0 || eb >= d->nbufs || !m->has_edges) continue;
    long ld = m->bw[eb], off = cv_lin(&v->edge_off, m->ctx.dims);
    if (off < 0 || off + m->bw[v->edge_state] > ld) continue;
    for (int e = m->eoff[first]; e < m->eoff[end]; e++)
      home(m, m->echild[e], v->edge_state, cv_edge_key(m, e), eb, ((size_t)e * (size_t)ld + (size_t)off) * m->esize);
  }
}

/* ---- policies: which vertices make a task ----
 * Each fills vtask[v] (the vertex's task), task_type and task_level for tasks in the
 * order they run, children's tasks before their parents', and returns the count. Both
 * keep what the rows need: a type's vertices without children all in its first task
 * (they are ready from the start, and a task takes every ready vertex of its type). */

static int grow_tasks(cavs_model *m, int need) {
  if (need <= m->captask) return 0;
  size_t cap = (size_t)need * 2;
  if (cap > INT_MAX) cap = INT_MAX;
  if (cv_grow(m, &m->task_r0, sizeof(int), cap) || cv_grow(m, &m->task_n, sizeof(int), cap) ||
      cv_grow(m, &m->task_type, sizeof(int), cap) || cv_grow(m, &m->task_leaf, sizeof(int), cap) ||
      cv_grow(m, &m->task_level, sizeof(int), cap) || cv_grow(m, &m->task_cur, sizeof(int), cap))
    return -1;
  m->captask = (int)cap;
  return 0;
}

/* bfs and depth: a task per (level, type), level by level, type by type */
static int level_tasks(cavs_model *m, int N, int L) {
  int T = m->d->nvertex;
  if ((size_t)T * (size_t)L + 1 > (size_t)m->capcount) {
    if ((size_t)T * (size_t)L + 1 > INT_MAX) return cv_fail(m, "minibatch too deep (%d levels)", L);
    if (cv_grow(m, &m->count, sizeof(int), (size_t)T * (size_t)L + 1)) return -1;
    m->capcount = T * L + 1;
  }
  memset(m->count, 0, sizeof(int) * ((size_t)T * (size_t)L + 1));
  for (int v = 0; v < N; v++) m->count[m->vtype[v] * L + m->level[v]] = 1;
  int ntask = 0;
  for (int l = 0; l < L; l++)
    for (int t = 0; t < T; t++) {
      if (!m->count[t * L + l]) continue;
      if (grow_tasks(m, ntask + 1)) return -1;
      m->task_type[ntask] = t;
      m->task_level[ntask] = l;
      m->count[t * L + l] = ntask++;
    }
  for (int v = 0; v < N; v++) m->vtask[v] = m->count[m->vtype[v] * L + m->level[v]];
  m->nlevels = L;
  return ntask;
}

/* agenda and frontier: one type a step, every ready vertex of it. A type's ready
   vertices are a list through queue[] (free here), with their count, the sum of their
   levels and the largest urg; row_of[] counts a vertex's children not yet run. */
static int ready_tasks(cavs_model *m, int N) {
  const cavs_desc *d = m->d;
  int T = d->nvertex;
  long *head = m->tstate, *cnt = head + T, *rem = cnt + T, *hsum = rem + T, *umax = hsum + T;
  int *nxt = m->queue, *pending = m->row_of;
  bool frontier = m->policy == CAVS_FRONTIER;
  for (int t = 0; t < T; t++) head[t] = -1, cnt[t] = rem[t] = hsum[t] = 0, umax[t] = -1;
#define READY(v)                                                                                  \
  do {                                                                                            \
    int t_ = m->vtype[v];                                                                         \
    nxt[v] = (int)head[t_], head[t_] = v, cnt[t_]++, hsum[t_] += m->level[v];                    \
    if (frontier && m->urg[v] > umax[t_]) umax[t_] = m->urg[v]; /* (urg: frontier's alone) */  \
  } while (0)
  for (int v = 0; v < N; v++) {
    rem[m->vtype[v]]++;
    pending[v] = m->nkids[v];
    if (!pending[v]) READY(v);
  }
  int ntask = 0;
  for (int done = 0; done < N;) {
    int b = -1;
    if (m->policy == CAVS_FRONTIER) {
      /* Lemma 1: a type whose every vertex left is ready */
      for (int t = 0; t < T && b < 0; t++)
        if (cnt[t] && cnt[t] == rem[t]) b = t;
      if (b < 0)
        for (int t = 0; t < T; t++)
          if (cnt[t] && (b < 0 || umax[t] > umax[b] || (umax[t] == umax[b] && cnt[t] > cnt[b]))) b = t;
    } else
      for (int t = 0; t < T; t++)
        if (cnt[t] && (b < 0 || (double)hsum[t] / (double)cnt[t] < (double)hsum[b] / (double)cnt[b])) b = t;
    if (b < 0) return cv_fail(m, "internal error: no vertex ready with %d of %d run", done, N);
    if (grow_tasks(m, ntask + 1)) return -1;
    int v = (int)head[b];
    done += (int)cnt[b];
    rem[b] -= cnt[b];
    head[b] = -1, cnt[b] = hsum[b] = 0, umax[b] = -1;
    while (v >= 0) {
      int next = nxt[v];
      m->vtask[v] = ntask;
      for (int e = m->pcount[v]; e < m->pcount[v + 1]; e++)
        if (--pending[m->padj[e]] == 0) READY(m->padj[e]);
      v = next;
    }
    m->task_type[ntask] = b;
    m->task_level[ntask] = ntask;
    ntask++;
  }
#undef READY
  m->nlevels = ntask;
  return ntask;
}

/* Rows for the tasks: type by type, within a type task by task in the order they run,
 * the type's vertices without children first (all in its first task); within a task
 * from the top down (the header). task_cur[i] is the next free row of task i's
 * vertices with children, tstate[t] of type t's without. queue[r] is the vertex of row
 * r. A task's rows are all numbered before it is reached: its vertices are roots or
 * children of a later task's. */
/* A vertex without children, whose rows come first in its type (a first vertex that
   gathers a carried state is at level 0 but has a child: the carried row) */
#define LEAF(v) (m->level[v] == 0 && !m->vcar[v])
static int number_rows(cavs_model *m, int N, int ntask) {
  const cavs_desc *d = m->d;
  int T = d->nvertex, C = m->maxc;
  long *lcur = m->tstate;
  for (int i = 0; i < ntask; i++) m->task_n[i] = 0;
  for (int t = 0; t < T; t++) m->type_n[t] = m->type_leaf[t] = 0;
  for (int v = 0; v < N; v++) {
    m->task_n[m->vtask[v]]++;
    m->type_n[m->vtype[v]]++;
    m->type_leaf[m->vtype[v]] += LEAF(v);
  }
  for (int t = 0, acc = 0; t < T; t++) {
    m->type_r0[t] = acc;
    lcur[t] = acc;
    acc += m->type_n[t];
  }
  for (int i = 0; i < ntask; i++) {
    int t = m->task_type[i];
    m->task_r0[i] = (int)lcur[t];
    m->task_leaf[i] = lcur[t] == m->type_r0[t] ? m->type_leaf[t] : 0;
    m->task_cur[i] = m->task_r0[i] + m->task_leaf[i];
    lcur[t] += m->task_n[i];
  }
  for (int t = 0; t < T; t++) lcur[t] = m->type_r0[t];
  for (int v = 0; v < N; v++) {
    m->row_of[v] = -1;
    if (LEAF(v) && m->task_r0[m->vtask[v]] != m->type_r0[m->vtype[v]])
      return cv_fail(m, "internal error: a vertex without children outside its type's first task");
  }
#define NEXT_ROW(v) (LEAF(v) ? (int)lcur[m->vtype[v]]++ : m->task_cur[m->vtask[v]]++)
  /* the roots graph by graph, the largest graph first (gorder): the rows of a chain's
     k-th step are then the longer chains' first, so a task's children are a prefix of
     the task before it, one block, where every chain is its own graph */
  for (int i = 0; i < m->ngraphs; i++) {
    int g = m->gorder[i];
    for (int v = m->gbase[g]; v < m->gbase[g + 1]; v++)
      if (m->pcount[v + 1] == m->pcount[v]) {
        int r = NEXT_ROW(v);
        m->row_of[v] = r;
        m->queue[r] = v;
      }
  }
  for (int i = ntask - 1; i >= 0 && C > 0; i--) {
    int r0 = m->task_r0[i], n = m->task_n[i];
    for (int r = r0 + m->task_leaf[i]; r < r0 + n; r++)
      for (int e = m->kid_off[m->queue[r]]; e < m->kid_off[m->queue[r] + 1]; e++) {
        int ch = m->kids[e];
        if (m->row_of[ch] >= 0) continue;
        int rr = NEXT_ROW(ch);
        m->row_of[ch] = rr;
        m->queue[rr] = ch;
      }
  }
#undef NEXT_ROW
#undef LEAF
  return 0;
}

static int chunk_of(int l);
/* crow[c * T + t]: the first row of type t at the levels of chunk c or later (the eager
   phase's chunks beside the path tasks, below), c up to the last chunk + 1 */
static int chunk_rows(cavs_model *m, int ntask) {
  int T = m->d->nvertex, nc = m->nlevels ? chunk_of(m->nlevels - 1) + 2 : 1;
  if ((size_t)nc * (size_t)T > (size_t)m->capcrow) {
    if (cv_grow(m, &m->crow, sizeof(int), (size_t)nc * (size_t)T)) return -1;
    m->capcrow = nc * T;
  }
  for (int c = 0; c < nc; c++)
    for (int t = 0; t < T; t++) m->crow[c * T + t] = -1;
  for (int i = ntask - 1; i >= 0; i--) m->crow[chunk_of(m->task_level[i]) * T + m->task_type[i]] = m->task_r0[i];
  for (int t = 0; t < T; t++)
    for (int c = nc - 1; c >= 0; c--)
      if (m->crow[c * T + t] < 0)
        m->crow[c * T + t] = c == nc - 1 ? m->type_r0[t] + m->type_n[t] : m->crow[(c + 1) * T + t];
  return 0;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The slots of G worth reading: all of them, unless the model takes children as sets,
 * where cv_schedule found the last one filled (m->maxc) */
static int gmaxc(const cavs_model *m, const cavs_graph *G) {
  return m->has_edges && G->maxc > m->maxc ? m->maxc : G->maxc;
}

/* Does G's first vertex gather a carried state: a vertex without children, of a type
 * with a child slot 0 (its state, when carrying, the earlier pass's; checked against
 * the graph's other errors later) */
static bool carried(const cavs_model *m, const cavs_graph *G) {
  if (m->carry_state < 0 || G->n <= 0) return false;
  int t = G->type ? G->type[0] : 0;
  if (t < 0 || t >= m->d->nvertex || m->d->vertex[t].children < 1) return false;
  for (int s = 0; s < G->maxc; s++)
    if (G->child[s] >= 0) return false;
  return true;
}

/* cv_schedule's steps, in the order it takes them. Each returns 0, or -1 with the
 * model's error set. */

/* 1. A type that takes its children as a set takes as many as a graph gives: the child
 * array's stride grows to the last filled slot of any graph (not the graph's stride: a
 * data set's is CAVS_MAX_SET), and every pass over the children below goes as far. */
static int child_stride(cavs_model *m, const cavs_graph *const *graphs, int k) {
  int need = m->maxc_fixed;
  for (int g = 0; g < k; g++) {
    const cavs_graph *G = graphs[g];
    /* a data set's graph says how far its slots go (cavs_graph.slots: a slot past it is
       not read) */
    if (G->slots > 0 && G->slots <= G->maxc) {
      if (G->slots > need) need = G->slots;
      continue;
    }
    for (int v = 0; G->maxc > need && v < G->n; v++)
      for (int s = G->maxc - 1; s >= need; s--)
        if (G->child[(size_t)v * G->maxc + s] >= 0) {
          need = s + 1;
          break;
        }
  }
  if (need > CAVS_MAX_GRAPH_VERTICES) return cv_fail(m, "a graph with %d child slots a vertex", need);
  if (need > m->maxc && m->cap_rows && cv_grow(m, &m->child, sizeof(int) * (size_t)need, (size_t)m->cap_rows))
    return -1;
  m->maxc = m->ctx.maxc = need; /* (the array only grows) */
  m->ctx.child = m->child;
  return 0;
}

/* 2. The per-row buffers for N rows and the carried states (cavs_model_carry_state:
 * graph g's at row N + g), which check the memory the minibatch needs, scratch included,
 * before anything else is allocated; then the per-vertex arrays */
static int vertex_arrays(cavs_model *m, const cavs_graph *const *graphs, int k, int N) {
  int K = 0;
  for (int g = 0; g < k && g < m->ncarry; g++)
    if (carried(m, graphs[g])) K = g + 1;
  if (cv_grow_rows(m, N + K)) return -1;
  if (N > m->capv) {
    if (cv_grow(m, &m->level, sizeof(int), (size_t)N) || cv_grow(m, &m->row_of, sizeof(int), (size_t)N) ||
        cv_grow(m, &m->pcount, sizeof(int), (size_t)N + 1) || cv_grow(m, &m->queue, sizeof(int), (size_t)N) ||
        cv_grow(m, &m->vtype, sizeof(int), (size_t)N) || cv_grow(m, &m->vtask, sizeof(int), (size_t)N) ||
        cv_grow(m, &m->urg, sizeof(int), (size_t)N) || cv_grow(m, &m->nkids, sizeof(int), (size_t)N) ||
        cv_grow(m, &m->kid_off, sizeof(int), (size_t)N + 1) || cv_grow(m, &m->vcar, 1, (size_t)N))
      return -1;
    m->capv = N;
  }
  if (N) memset(m->vcar, 0, (size_t)N);
  for (int g = 0, b = 0; g < K; b += graphs[g++]->n)
    if (carried(m, graphs[g])) m->vcar[b] = 1;
  m->carry_in = K;
  return 0;
}

/* 3. Each vertex's type and children as a list (kids, in slot order), each checked
 * against its vertex block, and its parents in CSR form (pcount, padj), to walk from the
 * leaves up */
static int graph_edges(cavs_model *m, const cavs_graph *const *graphs, int k, int N) {
  const cavs_desc *d = m->d;
  long nedges = 0;
  for (int g = 0; g < k; g++) nedges += (long)graphs[g]->n * graphs[g]->maxc;
  if (nedges + 1 > m->capedges) {
    if (cv_grow(m, &m->padj, sizeof(int), (size_t)nedges + 1) || cv_grow(m, &m->kids, sizeof(int), (size_t)nedges + 1))
      return -1;
    m->capedges = nedges + 1;
  }
  memset(m->pcount, 0, sizeof(int) * ((size_t)N + 1));
  int base = 0, nkid = 0;
  for (int g = 0; g < k; g++) {
    const cavs_graph *G = graphs[g];
    for (int v = 0; v < G->n; v++) {
      int t = G->type ? G->type[v] : 0;
      if (t < 0 || t >= d->nvertex)
        return cv_fail(m, "graph %d, vertex %d: type %d is not a vertex block of '%s'", g, v, t, d->name);
      m->vtype[base + v] = t;
      m->nkids[base + v] = 0;
      m->kid_off[base + v] = nkid;
      for (int s = 0; s < gmaxc(m, G); s++) {
        int ch = G->child[(size_t)v * G->maxc + s];
        if (ch < 0) continue;
        if (ch >= G->n) return cv_fail(m, "graph %d, vertex %d: child %d is out of range", g, v, ch);
        if (s >= d->vertex[t].children && !d->vertex[t].edges)
          return cv_fail(m, "graph %d, vertex %d: a child in slot %d, but '%s' takes %d", g, v, s,
                         d->vertex[t].name, d->vertex[t].children);
        int et = d->vertex[t].edge_type, cty = G->type ? G->type[ch] : 0;
        if (d->vertex[t].edges && s >= d->vertex[t].children && et >= 0 && cty != et)
          return cv_fail(m, "graph %d, vertex %d: child %d is a '%s', but the children of '%s' are '%s'", g, v, ch,
                         cty >= 0 && cty < d->nvertex ? d->vertex[cty].name : "?", d->vertex[t].name,
                         d->vertex[et].name);
        const int *st = d->vertex[t].slot_types;
        int ct = G->type ? G->type[ch] : 0;
        if (st && s < d->vertex[t].children && ct != st[s]) {
          const char *cn = ct >= 0 && ct < d->nvertex ? d->vertex[ct].name : "?";
          return cv_fail(m, "graph %d, vertex %d: the child in slot '%s' is a '%s' (vertex %d), but '%s' takes a '%s' there",
                         g, v, d->vertex[t].slot_names ? d->vertex[t].slot_names[s] : "?", cn, ch, d->vertex[t].name,
                         d->vertex[st[s]].name);
        }
        m->pcount[base + ch + 1]++;
        m->nkids[base + v]++;
        m->kids[nkid++] = base + ch;
      }
    }
    base += G->n;
  }
  m->kid_off[N] = nkid;
  for (int i = 0; i < N; i++) m->pcount[i + 1] += m->pcount[i];
  /* fill: queue[] doubles as the fill cursor */
  for (int i = 0; i < N; i++) m->queue[i] = m->pcount[i];
  for (int v = 0; v < N; v++)
    for (int e = m->kid_off[v]; e < m->kid_off[v + 1]; e++) m->padj[m->queue[m->kids[e]]++] = v;
  return 0;
}

/* 4. Levels, leaves first (Kahn; queue[] is left in Kahn order, row_of[] holds the
 * number of children still pending), a cycle refused; *maxlevel, the highest. And in
 * the same walk, a lower bound: no schedule runs fewer tasks than, summed over the
 * types, the most vertices of the type on one path (they need tasks of their own, one
 * after the other; a task is of one type): at least the longest path. tcount[v * T + t],
 * the most vertices of type t on a path that ends at v, is final when v leaves the
 * queue, and is pushed to its parents then. */
static int levels(cavs_model *m, const cavs_graph *const *graphs, int k, int N, int *maxlevel) {
  int T0 = m->d->nvertex;
  if ((size_t)N * (size_t)T0 > (size_t)m->captcount) {
    if (cv_grow(m, &m->tcount, sizeof(int), (size_t)N * (size_t)T0)) return -1;
    m->captcount = (size_t)N * (size_t)T0;
  }
  if ((size_t)T0 * 5 + 1 > (size_t)m->captstate) {
    if (cv_grow(m, &m->tstate, sizeof(long), (size_t)T0 * 5 + 1)) return -1;
    m->captstate = T0 * 5 + 1;
  }
  long *best = m->tstate;
  for (int t = 0; t < T0; t++) best[t] = 0;
  memset(m->tcount, 0, sizeof(int) * (size_t)N * (size_t)T0);
  int head = 0, tail = 0;
  for (int v = 0; v < N; v++) {
    m->row_of[v] = m->nkids[v];
    m->level[v] = 0;
    if (!m->nkids[v]) m->queue[tail++] = v;
  }
  *maxlevel = 0;
  while (head < tail) {
    int v = m->queue[head++], *c = m->tcount + (size_t)v * (size_t)T0;
    if (++c[m->vtype[v]] > best[m->vtype[v]]) best[m->vtype[v]] = c[m->vtype[v]];
    for (int e = m->pcount[v]; e < m->pcount[v + 1]; e++) {
      int p = m->padj[e], *pc = m->tcount + (size_t)p * (size_t)T0;
      for (int t = 0; t < T0; t++) pc[t] = c[t] > pc[t] ? c[t] : pc[t];
      if (m->level[p] < m->level[v] + 1) m->level[p] = m->level[v] + 1;
      if (m->level[p] > *maxlevel) *maxlevel = m->level[p];
      if (--m->row_of[p] == 0) m->queue[tail++] = p;
    }
  }
  m->lower_bound = 0;
  for (int t = 0; t < T0; t++) m->lower_bound += (int)best[t];
  if (tail < N)
    for (int g = 0, base = 0; g < k; base += graphs[g++]->n)
      for (int v = 0; v < graphs[g]->n; v++)
        if (m->row_of[base + v] > 0) return cv_fail(m, "graph %d has a cycle through vertex %d", g, v);
  /* each vertex's longest path up to a root (the frontier policy's priority): the Kahn
     order backwards */
  if (m->policy == CAVS_FRONTIER)
    for (int i = N - 1; i >= 0; i--) {
      int v = m->queue[i], u = 0;
      for (int e = m->pcount[v]; e < m->pcount[v + 1]; e++)
        if (m->urg[m->padj[e]] + 1 > u) u = m->urg[m->padj[e]] + 1;
      m->urg[v] = u;
    }
  return 0;
}

/* 5. Where each graph's vertices begin (gbase), and the graphs by size (gorder), largest
 * first, in their order on ties */
static int graph_order(cavs_model *m, const cavs_graph *const *graphs, int k) {
  if (k + 1 > m->capgraphs) {
    if (cv_grow(m, &m->gbase, sizeof(int), (size_t)k + 1) || cv_grow(m, &m->gorder, sizeof(int), (size_t)k + 1) ||
        cv_grow(m, &m->gkey, sizeof(uint64_t), (size_t)k + 1))
      return -1;
    m->capgraphs = k + 1;
  }
  m->ngraphs = k;
  for (int g = 0, b = 0; g <= k; g++) {
    m->gbase[g] = b;
    if (g < k) b += graphs[g]->n;
  }
  for (int g = 0; g < k; g++) m->gkey[g] = (uint64_t)(INT_MAX - graphs[g]->n) << 32 | (uint64_t)g;
  qsort(m->gkey, (size_t)k, sizeof *m->gkey, cmp_u64);
  for (int i = 0; i < k; i++) m->gorder[i] = (int)(m->gkey[i] & 0xffffffffu);
  return 0;
}

/* 6. Under CAVS_SERIAL, each of the ntask tasks cut into single rows, from the last (a
 * task's pieces lie at or past it): N tasks, or -1 */
static int serial_tasks(cavs_model *m, int N, int ntask) {
  if (grow_tasks(m, N)) return -1;
  for (int i = ntask - 1, w = N; i >= 0; i--) {
    int r0 = m->task_r0[i], n = m->task_n[i], leaf = m->task_leaf[i], t = m->task_type[i], l = m->task_level[i];
    w -= n;
    for (int p = n - 1; p >= 0; p--) {
      m->task_r0[w + p] = r0 + p;
      m->task_n[w + p] = 1;
      m->task_leaf[w + p] = p < leaf;
      m->task_type[w + p] = t;
      m->task_level[w + p] = l;
    }
  }
  return N;
}

/* 7. The per-row arrays at the numbered rows: children as rows, roots, what pushes, and
 * the inputs, each index checked against its range and each real input's width read */
static int row_inputs(cavs_model *m, const cavs_graph *const *graphs, int k, int N) {
  const cavs_desc *d = m->d;
  int C = m->maxc;
  long *bound = m->tstate; /* (levels' scratch, reused) */
  if ((size_t)d->ninputs + 1 > (size_t)m->captstate) {
    if (cv_grow(m, &m->tstate, sizeof(long), (size_t)d->ninputs + 1)) return -1;
    m->captstate = d->ninputs + 1;
    bound = m->tstate;
  }
  long total_w = 0;
  for (int s = 0; s < d->nreal; s++) total_w += m->rw[s];
  for (int i = 0; i < d->ninputs; i++) bound[i] = d->inputs[i].kind == CAVS_IN_REAL ? 0 : cv_lin(&d->inputs[i].width, m->ctx.dims);
  for (int g = 0, base = 0; g < k; base += graphs[g++]->n) {
    const cavs_graph *G = graphs[g];
    for (int v = 0; v < G->n; v++) {
      int r = m->row_of[base + v];
      int t = m->vtype[base + v];
      for (int s = 0; s < C; s++) {
        int ch = s < G->maxc ? G->child[(size_t)v * G->maxc + s] : -1;
        m->child[(size_t)r * C + s] = ch < 0 ? -1 : m->row_of[base + ch];
      }
      if (m->vcar[base + v]) m->child[(size_t)r * C] = N + g; /* v = 0, its carried state */
      m->root[r] = m->pcount[base + v + 1] == m->pcount[base + v];
      m->pushed[r] = (unsigned char)d->vertex[t].pushes;
      for (int i = 0; i < d->ninputs; i++) {
        const cavs_input_desc *in = &d->inputs[i];
        if (in->kind == CAVS_IN_REAL) continue;
        int x = G->feat ? G->feat[(size_t)v * d->nint + in->slot] : -1;
        if (x < -1 || x >= bound[i])
          return cv_fail(m, "graph %d, vertex %d: input '%s' is %d, outside -1..%ld", g, v, in->name, x, bound[i] - 1);
        m->iin[in->slot][r] = x;
      }
      long off = 0;
      for (int i = 0; i < d->ninputs; i++) {
        const cavs_input_desc *in = &d->inputs[i];
        if (in->kind != CAVS_IN_REAL) continue;
        long w = m->rw[in->slot];
        for (long j = 0; j < w; j++) {
          double x = G->real ? G->real[(size_t)v * (size_t)total_w + (size_t)(off + j)] : 0;
          if (m->esize == 8) ((double *)m->rin[in->slot])[(size_t)r * (size_t)w + (size_t)j] = x;
          else ((float *)m->rin[in->slot])[(size_t)r * (size_t)w + (size_t)j] = (float)x;
        }
        off += w;
      }
    }
  }
  return 0;
}

/* 8. The edges of the types that take their children as a set, row by row */
static int edge_rows(cavs_model *m, int N) {
  const cavs_desc *d = m->d;
  int C = m->maxc;
  if (cv_grow(m, &m->eoff, sizeof(int), (size_t)N + 1)) return -1;
  long E = 0;
  for (int t = 0; t < d->nvertex; t++)
    for (int r = m->type_r0[t]; d->vertex[t].edges && r < m->type_r0[t] + m->type_n[t]; r++)
      for (int s = d->vertex[t].children; s < C; s++) E += m->child[(size_t)r * C + s] >= 0;
  if (E > INT_MAX) return cv_fail(m, "minibatch too large (%ld edges)", E);
  if (cv_grow_edges(m, E)) return -1;
  int e = 0;
  for (int t = 0; t < d->nvertex; t++)
    for (int r = m->type_r0[t]; r < m->type_r0[t] + m->type_n[t]; r++) {
      m->eoff[r] = e;
      for (int s = d->vertex[t].children; d->vertex[t].edges && s < C; s++) {
        int ch = m->child[(size_t)r * C + s];
        if (ch < 0) continue;
        m->eparent[e] = r;
        m->echild[e++] = ch;
      }
    }
  m->eoff[N] = e;
  m->nedges = E;
  m->stats.gathered_rows += E; /* a set's children are copied to their edges, never viewed */
  m->ctx.eoff = m->eoff;
  m->ctx.eparent = m->eparent;
  m->ctx.echild = m->echild;
  return 0;
}

/* 9. The gathers' layout, counted: a task's gathered rows are in place when its rows with
 * children (those past its first task_leaf) have every slot of their type filled and
 * child k of its i-th such row is row b + i * S + k, S its type's slots */
static void count_gathers(cavs_model *m) {
  int C = m->maxc;
  for (int i = 0; i < m->ntask; i++) {
    int r0 = m->task_r0[i] + m->task_leaf[i], n = m->task_n[i] - m->task_leaf[i];
    int S = m->d->vertex[m->task_type[i]].children;
    long have = 0;
    bool block = true;
    for (int r = r0; r < r0 + n; r++)
      for (int s = 0; s < S; s++) {
        int ch = m->child[(size_t)r * C + s];
        have += ch >= 0;
        if (ch < 0 || ch != m->child[(size_t)r0 * C] + (r - r0) * S + s) block = false;
      }
    m->stats.gathered_rows += have;
    if (block) m->stats.gathered_in_place += have;
  }
}

int cv_schedule(cavs_model *m, const cavs_graph *const *graphs, int k) {
  long total = 0;
  for (int g = 0; g < k; g++) {
    if (graphs[g]->n < 0) return cv_fail(m, "graph %d has a negative vertex count", g);
    total += graphs[g]->n;
  }
  if (total > CAVS_MAX_GRAPH_VERTICES) return cv_fail(m, "minibatch too large (%ld vertices)", total);
  int N = (int)total, maxlevel;
  if ((m->has_edges && child_stride(m, graphs, k)) || vertex_arrays(m, graphs, k, N) ||
      graph_edges(m, graphs, k, N) || levels(m, graphs, k, N, &maxlevel))
    return -1;
  int ntask = m->policy == CAVS_AGENDA || m->policy == CAVS_FRONTIER ? ready_tasks(m, N)
                                                                     : level_tasks(m, N, maxlevel + 1);
  if (graph_order(m, graphs, k) || ntask < 0 || number_rows(m, N, ntask) || chunk_rows(m, ntask)) return -1;
  if (m->policy == CAVS_SERIAL && (ntask = serial_tasks(m, N, ntask)) < 0) return -1;
  m->ntask = ntask;
  for (int r = 0; r < N; r++) m->pred[r] = -1;
  m->rows = N;
  m->ctx.rows = N;
  m->rkey_ready = false; /* dropout's keys, made when a dropout asks (cv_drop_keys) */
  if (row_inputs(m, graphs, k, N) || (m->has_edges && edge_rows(m, N))) return -1;
  count_gathers(m);
  plan_views(m);
  plan_homes(m);
  return 0;
}

/* A stage over rows [r0, r0 + n), whose first `leaf` rows have no children: in one call,
 * or under CAVS_SERIAL one call a row, so that one vertex at a time is the honest
 * baseline batching is measured against, in every phase (the path phase's tasks are cut
 * into single rows by cv_schedule already). */
static void stage(cavs_model *m, cavs_stage f, int r0, int n, int leaf, int type) {
  cavs_ctx *c = &m->ctx;
  if (m->launch_failed) return; /* (a failed pass issues nothing more: backend.c, DEAD) */
  m->cur_type = type;
  if (m->policy != CAVS_SERIAL) {
    c->leaf_rows = leaf;
    f(c, r0, n);
  } else
    for (int r = r0; r < r0 + n; r++) {
      c->leaf_rows = r - r0 < leaf;
      f(c, r, 1);
    }
  c->leaf_rows = 0;
  m->cur_type = -1;
}

/* ---- a pass as a list of steps ----
 *
 * A pass is first written down (cavs_plan_forward, cavs_plan_backward), then run (cavs_run_plan). With
 * overlap, the eager phase goes to stream 1 in chunks of levels, [0], [1], [2, 4),
 * [4, 8)..., and the path tasks on stream 0 wait for the chunk of their level with an
 * event: forward, the path tasks of level 0 run while the eager phase of the levels
 * above is still being computed; backward, the eager phase (and the parameter gradients
 * of the path products) of the levels at and above l runs once the path tasks down to
 * level l are done, beside the tasks below. The last steps of a pass wait for both
 * streams. A backend without streams runs the steps in order; the tests run them in
 * the two orders furthest apart that the events allow (enum cv_order), which is how a
 * missing event shows on a machine without a GPU. */

static int add(cavs_model *m, cv_op o) {
  if (m->nplan == m->capplan) {
    if (cv_grow(m, &m->plan, sizeof(cv_op), (size_t)m->capplan * 2 + 16)) return -1;
    m->capplan = m->capplan * 2 + 16;
  }
  o.on = m->nplan && m->plan[m->nplan - 1].kind == CV_STREAM ? m->plan[m->nplan - 1].arg
         : m->nplan                                       ? m->plan[m->nplan - 1].on
                                                          : 0;
  m->plan[m->nplan++] = o;
  return 0;
}
/* a stage of vertex type `type` (-1: the pull or push block) */
static int vrun(cavs_model *m, int type, cavs_stage f, int r0, int n, int leaf) {
  return f && n > 0 ? add(m, (cv_op){.kind = CV_STAGE, .f = f, .r0 = r0, .n = n, .leaf = leaf, .type = type}) : 0;
}
static int run(cavs_model *m, cavs_stage f, int r0, int n, int leaf) { return vrun(m, -1, f, r0, n, leaf); }
static int ctl(cavs_model *m, int kind, int arg) { return add(m, (cv_op){.kind = kind, .arg = arg}); }

/* The chunk of level l, and the first level of chunk c: [0], [1], [2, 4), [4, 8)... */
static int chunk_of(int l) {
  int c = 0;
  while (l) {
    l >>= 1;
    c++;
  }
  return c;
}
static int chunk_start(int c) { return c ? 1 << (c - 1) : 0; }
enum { EV_START = CV_EVENTS - 2, EV_END = CV_EVENTS - 1 };

/* every type's eager stage (fwd or bwd) over the rows of chunk c */
static int eager_chunk(cavs_model *m, int c, bool bwd) {
  const cavs_desc *d = m->d;
  int T = d->nvertex;
  for (int t = 0; t < T; t++) {
    int r0 = m->crow[c * T + t], r1 = m->crow[(c + 1) * T + t];
    if (vrun(m, t, bwd ? d->vertex[t].bwd_eager : d->vertex[t].fwd_eager, r0, r1 - r0,
             r0 == m->type_r0[t] ? m->type_leaf[t] : 0))
      return -1;
  }
  return 0;
}

/* The rows the push block's backward runs over, [*lo, *hi): where a loss has a target.
 * At a row whose every softmax_xent label is -1 the losses' gradient is zero, and so is
 * all the backward adds from it (to the pushed values' gradients, which start at zero,
 * and to the parameters'), so a minibatch labeled at its roots alone (Fold's Tree-FC
 * benchmark), whose roots are the last level's rows, runs its classifier's backward
 * products over those rows only. All the rows where a loss (a regression) has no such
 * label, or a load-balancing loss ran. The same rows, asked before a forward pass
 * (fwd), are all that pass's push block needs to run at when a backward pass follows
 * (cavs_model_set_targets_only). */
static void target_rows(const cavs_model *m, bool fwd, int *lo, int *hi) {
  const cavs_desc *d = m->d;
  int N = m->rows;
  *lo = 0, *hi = N;
  if (!d->nlosses) return;
  /* a mixture of experts' balancing loss has a gradient at every row it routed; before
     the forward pass, where the push block routes one, its loss covers every row */
  if (fwd ? d->push_routes : m->moe_balance) return;
  for (int l = 0; l < d->nlosses; l++)
    if (d->losses[l].kind != CAVS_LOSS_SOFTMAX_XENT) return;
  int a = N, b = 0;
  for (int l = 0; l < d->nlosses; l++) {
    const int *y = m->iin[d->inputs[d->losses[l].input].slot];
    int r = 0;
    while (r < a && y[r] < 0) r++;
    a = r < a ? r : a;
    r = N;
    while (r > b && y[r - 1] < 0) r--;
    b = r > b ? r : b;
  }
  *lo = a, *hi = a < b ? b : a;
}

/* The push block runs at the rows of the types that push and nowhere else, the pull
 * block at those of the types that read it (cavs_vertex_desc.reads_pull): the next run
 * of such rows from type *t on, [*r0, *r1) (a type's rows follow the previous type's),
 * or 0. The rows of a type that pushes nothing hold no pushed value (with the push
 * block reading the state in place, the state of a type that pushes none); a label
 * there is not read. Tree-FC's inner vertices read no word: the pull block wrote a row
 * of zeros at each and cleared its gradient there. */
enum { PUSHING, PULLING };
static bool of_kind(const cavs_desc *d, int kind, int t) {
  return kind == PUSHING ? d->vertex[t].pushes : d->vertex[t].reads_pull;
}
static int type_range(const cavs_model *m, int kind, int *t, int *r0, int *r1) {
  const cavs_desc *d = m->d;
  int T = d->nvertex;
  while (*t < T && !(of_kind(d, kind, *t) && m->type_n[*t])) ++*t;
  if (*t >= T) return 0;
  *r0 = *r1 = m->type_r0[*t];
  for (; *t < T && (of_kind(d, kind, *t) || !m->type_n[*t]); ++*t) *r1 = m->type_r0[*t] + m->type_n[*t];
  return 1;
}
static int push_range(const cavs_model *m, int *t, int *r0, int *r1) { return type_range(m, PUSHING, t, r0, r1); }

/* Whether the forward pass's push block runs task by task, right after the path task
 * of each task of a type that pushes, over that task's rows, instead of once over all
 * of them after the lazy phase. Where no type that pushes has a lazy phase (cavsc wrote
 * its lazy stages as NULL), a row's values are complete once its path task has run, and
 * the push block then reads a level's h while it is still in cache, instead of a whole
 * minibatch's out of memory: on the Tree-LSTM (Zen 5, 1 thread, a timer around each
 * product) h Wc took 0.016 s an epoch instead of 0.036, and the epoch 0.97 of its time
 * (bench/README, "Products of a few columns, the push block by task"). The backward
 * pass's stays one call before the path tasks: by task it read h out of memory all the
 * same (the forward pass wrote it long before), and its products over a task's rows
 * took 0.066 s an epoch against 0.047 over all of them. Not where the
 * push block routes a mixture of experts (one routing groups all of a pass's rows),
 * nor on a backend with streams (a GPU: a few launches a task more, for a value its
 * second-level cache holds either way). */
static bool push_by_task(const cavs_model *m) {
  const cavs_desc *d = m->d;
  if (!d->push_fwd || d->push_routes || m->be->stream) return false;
  for (int t = 0; t < d->nvertex; t++)
    if (d->vertex[t].pushes && (d->vertex[t].fwd_lazy || d->vertex[t].bwd_lazy)) return false;
  return true;
}

/* the push block's stage f over task i's rows within [lo, hi), where its type pushes */
static int push_task(cavs_model *m, cavs_stage f, int i, int lo, int hi) {
  if (!m->d->vertex[m->task_type[i]].pushes) return 0;
  int a = m->task_r0[i] > lo ? m->task_r0[i] : lo, b = m->task_r0[i] + m->task_n[i];
  b = b < hi ? b : hi;
  return b > a ? run(m, f, a, b - a, 0) : 0;
}

/* the pull block's stage f at its rows */
static int pull_stage(cavs_model *m, cavs_stage f) {
  for (int t = 0, r0, r1; type_range(m, PULLING, &t, &r0, &r1);)
    if (run(m, f, r0, r1 - r0, 0)) return -1;
  return 0;
}

int cavs_plan_forward(cavs_model *m) {
  const cavs_desc *d = m->d;
  int N = m->rows, T = d->nvertex;
  bool eager = !(m->ablate & CAVS_NO_EAGER), lazy = !(m->ablate & CAVS_NO_LAZY);
  bool two = m->overlap && m->nlevels > 1 && eager;
  int last = chunk_of(m->nlevels - 1);
  m->nplan = 0;
  m->plan_pass = 0;
  if (two) {
    if (ctl(m, CV_RECORD, EV_START) || ctl(m, CV_STREAM, 1) || ctl(m, CV_WAIT, EV_START)) return -1;
    if (pull_stage(m, d->pull_fwd)) return -1;
    for (int c = 0; c <= last; c++)
      if (eager_chunk(m, c, false) || ctl(m, CV_RECORD, c)) return -1;
    if (ctl(m, CV_STREAM, 0)) return -1;
  } else {
    if (pull_stage(m, d->pull_fwd)) return -1;
    for (int t = 0; t < T && eager; t++)
      if (vrun(m, t, d->vertex[t].fwd_eager, m->type_r0[t], m->type_n[t], m->type_leaf[t])) return -1;
  }
  /* the push block's rows (in training, where asked: only where a loss has a target) */
  int lo = 0, hi = N, r0, r1;
  if (m->targets_only && m->ctx.keep) target_rows(m, true, &lo, &hi);
  m->push_lo = lo, m->push_hi = hi;
  bool by_task = push_by_task(m);
  int waited = -1;
  for (int i = 0; i < m->ntask; i++) {
    int c = chunk_of(m->task_level[i]);
    const cavs_vertex_desc *v = &d->vertex[m->task_type[i]];
    if (two && c > waited && ctl(m, CV_WAIT, waited = c)) return -1;
    if ((!eager && vrun(m, m->task_type[i], v->fwd_eager, m->task_r0[i], m->task_n[i], m->task_leaf[i])) ||
        vrun(m, m->task_type[i], v->fwd_path, m->task_r0[i], m->task_n[i], m->task_leaf[i]) ||
        (!lazy && vrun(m, m->task_type[i], v->fwd_lazy, m->task_r0[i], m->task_n[i], m->task_leaf[i])) ||
        (by_task && push_task(m, d->push_fwd, i, lo, hi)))
      return -1;
  }
  if (two && waited < last && ctl(m, CV_WAIT, last)) return -1;
  for (int t = 0; t < T && lazy; t++)
    if (vrun(m, t, d->vertex[t].fwd_lazy, m->type_r0[t], m->type_n[t], m->type_leaf[t])) return -1;
  for (int t = 0; !by_task && d->push_fwd && push_range(m, &t, &r0, &r1);) {
    int a = r0 > lo ? r0 : lo, b = r1 < hi ? r1 : hi;
    if (b > a && run(m, d->push_fwd, a, b - a, 0)) return -1;
  }
  return 0;
}

int cavs_plan_backward(cavs_model *m) {
  const cavs_desc *d = m->d;
  int T = d->nvertex;
  /* the eager stages may run beside the path tasks only where they add to parameter
     gradients no other stage adds to (two streams adding to one would race) */
  bool eager = !(m->ablate & CAVS_NO_EAGER), lazy = !(m->ablate & CAVS_NO_LAZY);
  bool two = m->overlap && m->nlevels > 1 && eager;
  for (int t = 0; t < T; t++) two = two && d->vertex[t].eager_apart;
  m->nplan = 0;
  m->plan_pass = 1;
  int lo, hi, r0, r1;
  target_rows(m, false, &lo, &hi);
  /* (within the rows the forward pass ran it at) */
  lo = lo > m->push_lo ? lo : m->push_lo;
  hi = hi < m->push_hi ? hi : m->push_hi;
  for (int t = 0; d->push_bwd && push_range(m, &t, &r0, &r1);) {
    int a = r0 > lo ? r0 : lo, b = r1 < hi ? r1 : hi;
    if (b > a && run(m, d->push_bwd, a, b - a, 0)) return -1;
  }
  for (int t = 0; t < T && lazy; t++)
    if (vrun(m, t, d->vertex[t].bwd_lazy, m->type_r0[t], m->type_n[t], m->type_leaf[t])) return -1;
  for (int i = m->ntask - 1; i >= 0; i--) {
    const cavs_vertex_desc *v = &d->vertex[m->task_type[i]];
    if ((!lazy && vrun(m, m->task_type[i], v->bwd_lazy, m->task_r0[i], m->task_n[i], m->task_leaf[i])) ||
        vrun(m, m->task_type[i], v->bwd_path, m->task_r0[i], m->task_n[i], m->task_leaf[i]) ||
        (!eager && vrun(m, m->task_type[i], v->bwd_eager, m->task_r0[i], m->task_n[i], m->task_leaf[i])))
      return -1;
    int l = m->task_level[i];
    /* the tasks of levels l and up are done when this is the first of level l; every
       level has a task, so every chunk's first level comes */
    if (two && (i == 0 || m->task_level[i - 1] < l) && chunk_start(chunk_of(l)) == l) {
      int c = chunk_of(l);
      if (ctl(m, CV_RECORD, c) || ctl(m, CV_STREAM, 1) || ctl(m, CV_WAIT, c) || eager_chunk(m, c, true) ||
          ctl(m, CV_STREAM, 0))
        return -1;
    }
  }
  if (two) {
    if (ctl(m, CV_STREAM, 1) || ctl(m, CV_RECORD, EV_END) || ctl(m, CV_STREAM, 0) || ctl(m, CV_WAIT, EV_END))
      return -1;
  } else
    for (int t = 0; t < T && eager; t++)
      if (vrun(m, t, d->vertex[t].bwd_eager, m->type_r0[t], m->type_n[t], m->type_leaf[t])) return -1;
  return pull_stage(m, d->pull_bwd);
}

static void step_of(cavs_model *m, const cv_op *o) {
  const cv_backend *be = m->be;
  switch (o->kind) {
  case CV_STAGE: stage(m, o->f, o->r0, o->n, o->leaf, o->type); break;
  case CV_ZERO: be->zero(m, o->p, o->bytes); break;
  case CV_STREAM:
    if (be->stream) be->stream(m, o->arg);
    break;
  case CV_RECORD:
    if (be->record) be->record(m, o->arg);
    break;
  case CV_WAIT:
    if (be->wait) be->wait(m, o->arg);
    break;
  }
}

/* Run stream s's steps from *at until one waits for an event not yet recorded (1), the
 * end (0), or, when `until` >= 0, event `until` is recorded (0). */
static int advance(cavs_model *m, int s, int *at, bool *recorded, int until) {
  for (; at[s] < m->nplan; at[s]++) {
    const cv_op *o = &m->plan[at[s]];
    if (o->kind == CV_STREAM || o->on != s) continue;
    if (o->kind == CV_WAIT && !recorded[o->arg]) return 1;
    if (o->kind == CV_RECORD) {
      recorded[o->arg] = true;
      if (o->arg == until) {
        at[s]++;
        return 0;
      }
    } else if (o->kind != CV_WAIT)
      step_of(m, o);
  }
  return 0;
}

/* The parameter groups stage op o adds to (cavs_desc's flags), or NULL */
static const unsigned char *grads_of(const cavs_desc *d, const cv_op *o) {
  if (o->kind != CV_STAGE) return NULL;
  if (o->f == d->push_bwd) return d->push_grads;
  if (o->f == d->pull_bwd) return d->pull_grads;
  if (o->type < 0 || o->type >= d->nvertex) return NULL;
  const cavs_vertex_desc *v = &d->vertex[o->type];
  return o->f == v->bwd_lazy ? v->bwd_grads[0] : o->f == v->bwd_path ? v->bwd_grads[1]
       : o->f == v->bwd_eager ? v->bwd_grads[2] : NULL;
}

/* A backward plan's last step that adds to each group (grad_last; -1: none, or a
   backend whose steps run after they are issued, or run out of the order issued: the
   pass's end) */
static int grads_final_at(cavs_model *m) {
  const cavs_desc *d = m->d;
  if (!m->grad_last && !(m->grad_last = malloc(sizeof(int) * ((size_t)d->npgroups + 1))))
    return cv_fail_mem(m, "out of memory for the gradient hook");
  for (int g = 0; g < d->npgroups; g++) m->grad_last[g] = -1;
  if (m->be->stream || m->order != CV_ISSUED) return 0;
  for (int i = 0; i < m->nplan; i++) {
    const unsigned char *w = grads_of(d, &m->plan[i]);
    for (int g = 0; w && g < d->npgroups; g++)
      if (w[g]) m->grad_last[g] = i;
  }
  return 0;
}

static void grad_final(cavs_model *m, int g) {
  m->grad_hook(m->grad_arg, g, m->pgrad[g], (size_t)m->pg_rows[g] * (size_t)m->pg_cols[g]);
}

void cavs_model_set_grad_hook(cavs_model *m, cavs_grad_hook hook, void *arg) {
  if (m) m->grad_hook = hook, m->grad_arg = arg;
}

int cavs_run_plan(cavs_model *m) {
  const cv_backend *be = m->be;
  bool hook = m->grad_hook && m->plan_pass == 1;
  if (hook && grads_final_at(m)) return -1;
  if (m->order == CV_ISSUED || be->stream) {
    if (be->pass_begin && be->pass_begin(m, m->plan_pass)) return -1;
    for (int i = 0; i < m->nplan; i++) {
      step_of(m, &m->plan[i]);
      for (int g = 0; hook && g < m->d->npgroups; g++)
        if (m->grad_last[g] == i) grad_final(m, g);
      if (hook) m->grad_hook(m->grad_arg, -1, NULL, 0);
    }
    int rc = be->pass_end ? be->pass_end(m, m->plan_pass) : 0;
    for (int g = 0; hook && g < m->d->npgroups; g++)
      if (m->grad_last[g] < 0) grad_final(m, g);
    return rc;
  }
  /* one stream first, as far as the events let it; the other only until the event it
     waits for, then the first again */
  bool recorded[CV_EVENTS] = {0};
  int at[2] = {0, 0}, p = m->order == CV_MAIN_FIRST ? 0 : 1;
  for (;;) {
    if (!advance(m, p, at, recorded, -1)) {
      if (advance(m, !p, at, recorded, -1)) return cv_fail(m, "the plan deadlocks");
      for (int g = 0; hook && g < m->d->npgroups; g++) grad_final(m, g); /* (grad_last: all -1) */
      return 0;
    }
    int want = m->plan[at[p]].arg;
    if (advance(m, !p, at, recorded, want) || !recorded[want]) return cv_fail(m, "the plan deadlocks");
  }
}

/* Carried state: the last pass's states to rows [rows, rows + carry_in) of the state
 * buffer, where this pass's first vertices find them as their child 0 (cv_schedule) */
static void carry_in(cavs_model *m) {
  if (m->carry_state < 0 || !m->carry_in) return;
  long w = m->bw[m->carry_state];
  m->be->copy_rows(&m->ctx, (char *)m->val[m->carry_state] + (size_t)m->rows * (size_t)w * m->esize, w, m->carry,
                   w, m->carry_in, w, 0);
}

/* and this pass's: graph g's last vertex's state to row g of the carry */
static int carry_out(cavs_model *m) {
  if (m->carry_state < 0) return 0;
  int k = m->ngraphs;
  long w = m->bw[m->carry_state];
  size_t row = (size_t)w * m->esize;
  if (k > m->capcarry) { /* (what it held, this pass has read) */
    m->be->release(m->carry);
    m->capcarry = m->ncarry = 0;
    if (!(m->carry = m->be->alloc(m, (size_t)k * row))) return cv_fail_mem(m, "out of memory for the carried state");
    m->capcarry = k;
  }
  for (int g = 0; g < k; g++) {
    if (m->gbase[g + 1] == m->gbase[g]) { /* an empty graph: zeros for the next one there */
      m->be->zero(m, (char *)m->carry + (size_t)g * row, row);
      continue;
    }
    int r = m->row_of[m->gbase[g + 1] - 1];
    m->be->copy_rows(&m->ctx, (char *)m->carry + (size_t)g * row, w,
                     (const char *)m->val[m->carry_state] + (size_t)r * row, w, 1, w, 0);
  }
  m->ncarry = k;
  return 0;
}

int cavs_model_carry_state(cavs_model *m, int on) {
  const cavs_desc *d = m->d;
  if (on && m->carry_state >= 0) return 0; /* (on already: what it carries kept) */
  m->ncarry = 0;
  if (!on) {
    m->carry_state = -1;
    return 0;
  }
  int s = d->nvertex ? d->vertex[0].state : -1;
  for (int t = 0; t < d->nvertex; t++)
    if (d->vertex[t].state != s || s < 0)
      return cv_fail(m, "carried state: the vertex types of '%s' do not scatter one state (it needs a chain's)",
                     d->name);
  bool read = false;
  for (int t = 0; t < d->nvertex; t++)
    for (int g = 0; g < d->vertex[t].ngathers; g++)
      read |= d->vertex[t].gathers[g].slot == 0 && d->vertex[t].gathers[g].src == s;
  if (!read) return cv_fail(m, "carried state: no vertex of '%s' gathers its child 0", d->name);
  m->carry_state = s;
  return 0;
}

void cavs_model_reset_state(cavs_model *m) { m->ncarry = 0; }

int cavs_model_carried(const cavs_model *m, long *width) {
  if (width) *width = m->carry_state >= 0 ? m->bw[m->carry_state] : 0;
  return m->carry_state >= 0 ? m->ncarry : 0;
}

int cavs_model_read_carried(cavs_model *m, int first, int rows, void *host) {
  if (m->carry_state < 0 || first < 0 || rows < 0 || first > m->ncarry - rows)
    return cv_fail(m, "carried state: rows %d to %d asked of the %d it holds", first, first + rows,
                   m->carry_state < 0 ? 0 : m->ncarry);
  size_t row = (size_t)m->bw[m->carry_state] * m->esize;
  return rows ? m->be->download(m, host, (const char *)m->carry + (size_t)first * row, (size_t)rows * row) : 0;
}

int cavs_model_set_carried(cavs_model *m, const void *host, int rows) {
  if (m->carry_state < 0) return cv_fail(m, "carried state: model '%s' does not carry (cavs_model_carry_state)", m->d->name);
  if (rows < 0 || rows > CAVS_MAX_CARRIED)
    return cv_fail(m, "carried state: %d rows (0 to %d)", rows, CAVS_MAX_CARRIED);
  size_t row = (size_t)m->bw[m->carry_state] * m->esize;
  if (rows > m->capcarry) {
    m->be->release(m->carry);
    m->capcarry = m->ncarry = 0;
    if (!(m->carry = m->be->alloc(m, (size_t)rows * row))) return cv_fail_mem(m, "out of memory for the carried state");
    m->capcarry = rows;
  }
  if (rows && m->be->upload(m, m->carry, host, (size_t)rows * row)) {
    m->ncarry = 0; /* (what it holds is not the state given) */
    return -1;
  }
  m->ncarry = rows;
  return 0;
}

static int forward_pass(cavs_model *m, const cavs_graph *const *graphs, int k, cavs_stats *st);
/* errno of a pass that failed, as the step after it says it again (cavs.h: ENOMEM for
   memory, EIO for a device that failed, else 0) */
static int pass_errno(void) { return errno == ENOMEM || errno == EIO ? errno : 0; }

/* A pass with expert parallelism on ends with the rounds that answer the other
   processes' rows until every process has ended its pass (moe.c), whether it failed or
   not: a failed pass must not leave the others waiting. */
int cavs_model_forward(cavs_model *m, const cavs_graph *const *graphs, int k, cavs_stats *st) {
  int rc = forward_pass(m, graphs, k, st);
  if (cv_experts_drain(m, false)) rc = -1;
  /* however it failed (a graph refused, its rows past the memory limit), the step after
     it refuses: a step on the last pass's gradients, or on none, would still move the
     parameters (a momentum, Adam's moments) */
  if (rc) { /* (errno as the failure set it, though the pass ran on past it) */
    m->launch_failed = true;
    errno = m->fail_errno = m->fail_errno ? m->fail_errno : pass_errno();
  }
  return rc;
}

static int forward_pass(cavs_model *m, const cavs_graph *const *graphs, int k, cavs_stats *st) {
  const cavs_desc *d = m->d;
  m->have_batch = false;
  m->no_grads = false;
  /* A pass starts afresh: an earlier one that failed (out of memory in an exchange, a
     plan that could not be had) left nothing this one reads. The forward pass rewrites
     every row it reads, the backward pass clears what it adds to, and the step after a
     failed pass refused. (A device's own fault stays in its backend, whose schedule
     below refuses the pass: backend_cuda.cu's status.) */
  m->launch_failed = false, m->fail_errno = 0;
  m->kept = m->ctx.keep;
  m->pass++;
  double t0 = cv_now(), g0 = m->stats.grow_seconds;
  if (cv_schedule(m, graphs, k) || m->be->schedule(m)) return -1;
  memset(m->loss, 0, sizeof(cavs_loss_acc) * (size_t)d->nlosses);
  memset(m->loss_den, 0, sizeof(long) * (size_t)d->nlosses);
  cv_ptables_ready(m);
  if (cavs_plan_forward(m)) return -1;
  m->stats.schedule_seconds += cv_now() - t0 - (m->stats.grow_seconds - g0);
  carry_in(m);
  if (cavs_run_plan(m) || carry_out(m)) return -1;
  /* the losses and predictions are complete */
  if (m->be->synchronize(m) || m->launch_failed) return -1;
  double aux = cv_moe_aux(m, &m->moe_balance);
  if (st) {
    memset(st, 0, sizeof *st);
    for (int l = 0; l < d->nlosses; l++) {
      const cavs_loss_acc *a = &m->loss[l];
      if (a->count) st->loss += a->sum / (double)a->count;
      if (d->losses[l].kind != CAVS_LOSS_SOFTMAX_XENT) continue; /* a regression has no accuracy */
      st->count += a->count;
      st->correct += a->correct;
      st->root_count += a->root_count;
      st->root_correct += a->root_correct;
    }
    st->tasks = m->ntask;
    st->lower_bound = m->lower_bound;
    st->aux_loss = aux;
  }
  m->have_batch = true;
  return 0;
}

const cavs_loss_acc *cavs_model_losses(const cavs_model *m, int *n) {
  if (n) *n = m->d->nlosses;
  return m->loss;
}

int cavs_model_set_loss_counts(cavs_model *m, const long *counts) {
  const cavs_desc *d = m->d;
  for (int l = 0; l < d->nlosses && counts; l++)
    /* a count is a double's divisor: exact below 2^53 */
    if (counts[l] && (counts[l] < m->loss[l].count || counts[l] > (1L << 53)))
      return cv_fail(m, "loss %d: %ld rows in all, fewer than the %ld this pass counted, or past 2^53", l, counts[l],
                     m->loss[l].count);
  for (int l = 0; l < d->nlosses; l++) m->loss_den[l] = counts ? counts[l] : 0;
  return 0;
}

int cavs_model_set_vertex_offset(cavs_model *m, long first) {
  /* a vertex number of the whole minibatch: the rows of many parts, each at most
     CAVS_MAX_ROWS, fit a long many times over, but one of 2^53 would be no count */
  if (first < 0 || first > (1L << 53)) return cv_fail(m, "vertex offset %ld: not from 0 to 2^53", first);
  m->voff = first;
  return 0;
}

int cavs_model_root_class(const cavs_model *m, int g) {
  if (!m->have_batch || g < 0 || g >= m->ngraphs) return -1;
  for (int v = m->gbase[g + 1] - 1; v >= m->gbase[g]; v--) {
    int r = m->row_of[v];
    if (m->root[r]) return m->pred[r];
  }
  return -1;
}

/* The row of vertex v of graph g of the last minibatch, or -1. */
static int vertex_row(const cavs_model *m, int g, int v) {
  if (!m->have_batch || g < 0 || g >= m->ngraphs || v < 0 || v >= m->gbase[g + 1] - m->gbase[g]) return -1;
  return m->row_of[m->gbase[g] + v];
}

int cavs_model_vertex_class(const cavs_model *m, int g, int v) {
  int r = vertex_row(m, g, v);
  return r < 0 ? -1 : m->pred[r];
}

/* The first k values of row r of a per-row buffer (at base, ld scalars a row, in the
   backend's memory) into out, as doubles. */
static int read_row(cavs_model *m, const void *base, long ld, int r, long k, double *out) {
  unsigned char *host = malloc((size_t)k * m->esize);
  if (!host) return cv_fail_mem(m, "out of memory for a vertex's values");
  int rc = cavs_model_read(m, host, (const char *)base + (size_t)r * (size_t)ld * m->esize, (size_t)k * m->esize);
  for (long j = 0; !rc && j < k; j++) out[j] = m->esize == 8 ? ((double *)host)[j] : (double)((float *)host)[j];
  free(host);
  return rc;
}

long cavs_model_vertex_output(cavs_model *m, int g, int v, double *out, long n) {
  const cavs_desc *d = m->d;
  int b = d->push_buf, r = vertex_row(m, g, v);
  if (b < 0 || r < 0 || !m->pushed[r]) return -1;
  /* (in range: checked when the model was made) */
  long off = cv_lin(&d->push_off, m->ctx.dims), w = cv_lin(&d->push_width, m->ctx.dims);
  const char *at = (const char *)m->val[b] + (size_t)off * m->esize;
  if (out && n > 0 && read_row(m, at, m->bw[b], r, n < w ? n : w, out)) return -1;
  return w;
}

long cavs_model_vertex_value(cavs_model *m, int g, int v, const char *name, double *out, long n) {
  const cavs_desc *d = m->d;
  int r = vertex_row(m, g, v);
  if (r < 0 || !name) return cv_fail(m, "no vertex %d of graph %d in the last minibatch", v, g);
  int t = 0;
  while (t < d->nvertex && !(r >= m->type_r0[t] && r < m->type_r0[t] + m->type_n[t])) t++;
  const cavs_value_desc *x = NULL;
  for (int pass = 0; pass < 2 && !x; pass++) /* the vertex's block first, then pull and push */
    for (int i = 0; i < d->nvalues && !x; i++)
      if ((pass ? d->values[i].vertex < 0 : d->values[i].vertex == t) && !strcmp(d->values[i].name, name))
        x = &d->values[i];
  if (!x || x->buf < 0 || x->buf >= d->nbufs) return cv_fail(m, "no value '%s' stored per row at that vertex", name);
  if (x->kept && !m->kept) return cv_fail(m, "value '%s' is not kept in inference", name);
  if (x->vertex == -2 && !m->pushed[r])
    return cv_fail(m, "value '%s' is the push block's, and this vertex's type pushes nothing", name);
  if (x->vertex == -2 && (r < m->push_lo || r >= m->push_hi))
    return cv_fail(m, "value '%s' is the push block's, which the pass ran only where a loss has a target "
                      "(cavs_model_set_targets_only)", name);
  if (x->vertex == -1 && !d->vertex[t].reads_pull)
    return cv_fail(m, "value '%s' is the pull block's, which runs only at the types that read pull(), and this "
                      "vertex's type '%s' does not", name, d->vertex[t].name);
  if (x->vertex >= 0 && d->bufs[x->buf].inner && r < m->type_r0[t] + m->type_leaf[t])
    return cv_fail(m, "value '%s' is not computed at a vertex without children", name);
  long off = cv_lin(&x->off, m->ctx.dims), w = cv_lin(&x->width, m->ctx.dims), ld = m->bw[x->buf];
  if (off < 0 || w < 0 || off + w > ld) return cv_fail(m, "value '%s' lies outside its buffer", name);
  /* a dropout read in place (in range: checked when the model was made) */
  int b = x->buf, src;
  long at;
  if (cv_aliased(m, b, &src, &at)) b = src, off += at, ld = m->bw[src];
  /* a gathered buffer viewed in the state: through the view, which is in range at rows
     with children, the only rows it is read at (inner) */
  const char *base = (const char *)m->cval[b] + (size_t)off * m->esize;
  if (out && n > 0 && read_row(m, base, ld, r, n < w ? n : w, out)) return -1;
  return w;
}

long cavs_model_vertex_probs(cavs_model *m, int g, int v, double *out, long n) {
  int r = vertex_row(m, g, v);
  if (!m->xent_z || r < 0 || !m->pushed[r] || r < m->push_lo || r >= m->push_hi) return -1;
  long w = m->xent_w;
  if (!out || n <= 0) return w;
  double *z = malloc(sizeof *z * (size_t)w);
  if (!z) return cv_fail_mem(m, "out of memory for a vertex's probabilities"), -1;
  if (read_row(m, m->xent_z, m->xent_ld, r, w, z)) {
    free(z);
    return -1;
  }
  /* softmax in double, from the largest logit */
  double mx = -INFINITY, sum = 0;
  for (long j = 0; j < w; j++) mx = z[j] > mx ? z[j] : mx;
  for (long j = 0; j < w; j++) sum += exp(z[j] - mx);
  for (long j = 0; j < w && j < n; j++) out[j] = exp(z[j] - mx) / sum;
  free(z);
  return w;
}

static void backward_pass(cavs_model *m);
static void clear_grads(cavs_model *m);

void cavs_model_backward(cavs_model *m) {
  backward_pass(m);
  cv_experts_drain(m, true);
}

int cavs_model_expert_serve(cavs_model *m) {
  if (!m->ep.on) return cv_fail(m, "cavs_model_expert_serve: expert parallelism is off (cavs_model_set_expert_comm)");
  m->pass++;
  if (m->have_batch) clear_grads(m);
  /* (answering the others even when it cannot be a backward pass: none waits) */
  int rc = cv_experts_drain(m, true);
  if (!m->have_batch) return cv_fail(m, "cavs_model_expert_serve: no forward pass before it");
  return rc ? -1 : 0;
}

static void backward_pass(cavs_model *m) {
  if (!m->have_batch) return;
  if (!m->kept) {
    cv_fail(m, "a backward pass after a forward pass in inference (cavs_model_set_inference): it kept nothing to "
               "differentiate");
    m->no_grads = true;
    return;
  }
  m->pass++;
  clear_grads(m);
  /* a failure shows in the next call that returns a status (the step, a forward pass):
     the plan's (memory for its steps) through launch_failed */
  double t0 = cv_now();
  if (cavs_plan_backward(m)) m->launch_failed = true;
  m->stats.schedule_seconds += cv_now() - t0;
  if (!m->launch_failed && cavs_run_plan(m)) m->launch_failed = true;
  /* no wait for the device: the step after it is issued in order behind it, and whatever
     reads the gradients on the host waits first (cavs_model_read) */
}

bool cv_aliased(const cavs_model *m, int b, int *src, long *off) {
  const cavs_desc *d = m->d;
  for (int i = 0; i < d->naliases; i++) {
    const cavs_alias_desc *a = &d->aliases[i];
    if (a->buf != b) continue;
    if (m->ctx.keep && (a->opt >= 0 ? m->ctx.opt[a->opt] : a->p) != 0) return false;
    *src = a->src, *off = cv_lin(&a->off, m->ctx.dims);
    return true;
  }
  return false;
}

/* What a backward pass adds to, cleared before it */
static void clear_grads(cavs_model *m) {
  const cavs_desc *d = m->d;
  int N = m->rows;
  /* The gradients added to, cleared: a vertex type's own buffer at its rows alone, and
     one nothing touches at a row without children (inner) at its rows with children
     (SST: half the rows are leaves; the tagger's types a third of the rows each). A
     gathered buffer viewed in the state's is not used: its gradient is the state's. */
  for (int b = 0; b < d->nbufs; b++) {
    int src;
    long at;
    if (!m->grad[b] || d->bufs[b].grad == CAVS_GRAD_WHOLE || m->cgrad[b] != m->grad[b]) continue;
    if (cv_aliased(m, b, &src, &at)) continue; /* a dropout read in place: nothing adds to it */
    size_t r0 = 0, n = (size_t)(d->bufs[b].edge ? m->nedges : N), row = (size_t)m->bw[b] * m->esize;
    int v = d->bufs[b].vertex;
    if (!d->bufs[b].edge && v >= 0 && v < d->nvertex) {
      r0 = (size_t)m->type_r0[v] + (d->bufs[b].inner ? (size_t)m->type_leaf[v] : 0);
      n = (size_t)(m->type_r0[v] + m->type_n[v]) - r0;
    }
    if (!d->bufs[b].edge && v == -3) { /* the pull block's: at the rows it runs at */
      for (int t = 0, a, z; type_range(m, PULLING, &t, &a, &z);)
        m->be->zero(m, (char *)m->grad[b] + (size_t)a * row, (size_t)(z - a) * row);
      continue;
    }
    m->be->zero(m, (char *)m->grad[b] + r0 * row, n * row);
  }
  /* the carried states' rows, which the first vertices' gathers add to and nothing reads
     (no gradient flows into the earlier pass) */
  if (m->carry_state >= 0 && m->carry_in && m->grad[m->carry_state]) {
    size_t row = (size_t)m->bw[m->carry_state] * m->esize;
    m->be->zero(m, (char *)m->grad[m->carry_state] + (size_t)N * row, (size_t)m->carry_in * row);
  }
  /* a dense group's gradient, unless the last step zeroed it as it used it (at batch 1
     the clear was a pass over every parameter a step: 0.4 of 8 s an epoch at E=H=512) */
  for (int g = 0; g < d->npgroups; g++) {
    size_t off, len;
    /* (a placed expert table: this process's rows; the others' are zero, given back:
       cv_experts_release) */
    if (d->pgroups[g].sparse_input < 0 && !m->pg_clean[g]) {
      if (cv_experts_own_group(m, g, &off, &len)) m->be->zero(m, (char *)m->gflat + off * m->esize, len * m->esize);
      else m->be->zero(m, m->pgrad[g], (size_t)m->pg_rows[g] * (size_t)m->pg_cols[g] * m->esize);
    }
    m->pg_clean[g] = 0; /* this pass adds to it */
  }
  cv_sparse_reset(m);
}

/* whether the pull block ran at row r (type_range) */
static bool pull_row(const cavs_model *m, int r) {
  for (int t = 0, a, z; type_range(m, PULLING, &t, &a, &z);)
    if (r >= a && r < z) return true;
  return false;
}

int cavs_model_check_finite(cavs_model *m, int *graph, int *vertex, char *msg, size_t len) {
  const cavs_desc *d = m->d;
  *graph = *vertex = -1;
  for (int i = 0; i < d->nparams; i++) {
    long rows, cols, ld;
    const char *p = cavs_model_param(m, i, &rows, &cols, &ld);
    for (long r = 0; r < rows; r++) {
      long j = m->be->first_bad(m, p + (size_t)r * (size_t)ld * m->esize, (size_t)cols);
      if (j >= 0) {
        snprintf(msg, len, "parameter %s[%ld,%ld] is not finite", d->params[i].name, r, j);
        return -1;
      }
    }
  }
  if (!m->have_batch) return 0;
  /* the model's own values first, the state and push buffers (copies) last */
  for (int pass = 0; pass < 2; pass++)
    for (int b = 0; b < d->nbufs; b++) {
      bool shared = b == d->state_buf || b == d->push_buf;
      for (int t = 0; t < d->nvertex; t++) shared = shared || b == d->vertex[t].state;
      /* a view holds nothing of its own; an edge buffer's values are summed into its
         vertices' (esum), where a NaN shows */
      int src;
      long at;
      if (shared != (pass == 1) || m->cval[b] != m->val[b] || d->bufs[b].edge) continue;
      if (cv_aliased(m, b, &src, &at)) continue; /* a dropout read in place: its input is checked */
      /* a vertex type's buffer holds values at that type's rows alone, and an inner one
         only at those with children (the first type_leaf rows of its range have none) */
      int t = d->bufs[b].vertex, r0 = 0, r1 = m->rows;
      if (t >= 0 && t < d->nvertex) {
        r0 = m->type_r0[t] + (d->bufs[b].inner ? m->type_leaf[t] : 0);
        r1 = m->type_r0[t] + m->type_n[t];
      }
      for (int r = r0; r < r1; r++) {
        /* the push block's, not run there; the pull block's, not at a type that reads none */
        if (d->bufs[b].vertex == -2 && (!m->pushed[r] || r < m->push_lo || r >= m->push_hi)) continue;
        if (d->bufs[b].vertex == -3 && !pull_row(m, r)) continue;
        long j = m->be->first_bad(m, (const char *)m->val[b] + (size_t)r * (size_t)m->bw[b] * m->esize, (size_t)m->bw[b]);
        if (j < 0) continue;
        int g = 0, v = -1;
        for (g = 0; g < m->ngraphs && v < 0; g++)
          for (int k = m->gbase[g]; k < m->gbase[g + 1]; k++)
            if (m->row_of[k] == r) {
              v = k - m->gbase[g];
              break;
            }
        snprintf(msg, len, "value %s (column %ld) is not finite", d->bufs[b].name, j);
        *graph = g - 1;
        *vertex = v;
        return -1;
      }
    }
  return 0;
}

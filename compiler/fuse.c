/* fuse.c: two rewrites that cut the number of loops and products.
 *
 * Elementwise fusion: union-find over the edges between live elementwise nodes of one
 * class; each group becomes one loop (C; one kernel in the CUDA emitter to come) that keeps intermediate
 * values in registers. A union is refused when it would make the group depend on itself
 * through an outside node (a group runs as one step, so no input of it may need one of
 * its members), counting another group's inputs as each of its members' (depends_on).
 *
 * Product merging: products of one class that share their left operand (x @ Wi,
 * x @ Wf, ...) become one product against a parameter block whose column ranges are
 * those parameters, so the eager phase of the Tree-LSTM is one sgemm. A parameter joins
 * a block only if that product is its only use in the model (it can live in one place).
 * Products merge only with products a loss's gradient reaches alike (autodiff.c): one
 * without sends nothing back, and a merge runs backward whole or not at all. */
#include "cavsc.h"

#include <stdlib.h>
#include <string.h>

enum { FUSE_MAX_NODES = 2048 }; /* bitsets are n^2 bits; larger functions stay unfused */

static int find(int *parent, int x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

static bool is_ew(const IrNode *n) {
  return op_info[n->op].kind == OK_EW && n->type == T_ROW && n->uses > 0;
}

static bool has(const uint64_t *set, int x) { return set[x / 64] >> (x % 64) & 1; }

static int lowest(uint64_t b) { /* b's lowest bit set (b not 0) */
  int i = 0;
  while (!(b >> i & 1)) i++;
  return i;
}

/* Whether the union of two groups (members mu and mv) would wait on itself: a walk back
 * from its outside inputs through their operands, where a node in a group stands for all
 * its members, which run as one step after all their inputs (mem: each root's members;
 * seen: a bitset of n, stack: n). Each node's own operands alone missed two groups that
 * wait on each other: x / tanh(g) joining x's group while tanh(g)'s group read a slice
 * of x @ W (found by check_random). */
static bool depends_on(const IrFunc *f, int *parent, const uint64_t *mem, size_t words, const uint64_t *mu,
                       const uint64_t *mv, uint64_t *seen, int *stack) {
  int top = 0;
  for (size_t w = 0; w < words; w++) {
    seen[w] = mu[w] | mv[w];
    for (uint64_t b = seen[w]; b; b &= b - 1) stack[top++] = (int)(w * 64) + lowest(b);
  }
  while (top > 0) {
    int y = stack[--top];
    bool outside = !has(mu, y) && !has(mv, y);
    const IrNode *ny = &f->nodes[y];
    for (int k = 0; k < ny->nargs; k++) {
      int a = ny->args[k];
      if (has(seen, a)) {
        if (outside && (has(mu, a) || has(mv, a))) return true; /* it waits on the union */
        continue;
      }
      const uint64_t *ma = mem + (size_t)find(parent, a) * words; /* a's group, whole */
      for (size_t w = 0; w < words; w++) {
        uint64_t fresh = ma[w] & ~seen[w];
        seen[w] |= fresh;
        for (; fresh; fresh &= fresh - 1) stack[top++] = (int)(w * 64) + lowest(fresh);
      }
    }
  }
  return false;
}

static void fuse_groups(IrFunc *f, bool no_fuse) {
  int n = f->n;
  int *parent = xmalloc(sizeof(int) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) parent[i] = i;
  bool can_fuse = n <= FUSE_MAX_NODES && !no_fuse;
  size_t words = ((size_t)n + 63) / 64;
  /* members of each root, kept as a bitset for the legality check */
  uint64_t *mem = can_fuse ? xcalloc((size_t)n * words, sizeof(uint64_t)) : NULL;
  for (int i = 0; can_fuse && i < n; i++) mem[(size_t)i * words + (size_t)i / 64] |= 1ull << (i % 64);
  uint64_t *seen = can_fuse ? xcalloc(words + 1, sizeof(uint64_t)) : NULL;
  int *stack = can_fuse ? xcalloc((size_t)n + 1, sizeof(int)) : NULL;

  for (int v = 0; can_fuse && v < n; v++) {
    IrNode *nv = &f->nodes[v];
    if (!is_ew(nv)) continue;
    for (int j = 0; j < nv->nargs; j++) {
      int u = nv->args[j];
      IrNode *nu = &f->nodes[u];
      /* one row set a loop, and one width (a broadcast row of width 1 is an input) */
      if (!is_ew(nu) || nu->cls != nv->cls || nu->edge != nv->edge || nu->slot != nv->slot || !lin_eq(nu->width, nv->width)) continue;
      int gu = find(parent, u), gv = find(parent, v);
      if (gu == gv) continue;
      uint64_t *mu = mem + (size_t)gu * words, *mv = mem + (size_t)gv * words;
      /* legal iff no outside input of the union depends on a member of it */
      if (depends_on(f, parent, mem, words, mu, mv, seen, stack)) continue;
      parent[gu] = gv;
      for (size_t w = 0; w < words; w++) mv[w] |= mu[w];
    }
  }
  /* number the groups in order of their first member */
  int *gid = xmalloc(sizeof(int) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) gid[i] = -1;
  f->ngroups = 0;
  for (int i = 0; i < n; i++) {
    IrNode *ni = &f->nodes[i];
    ni->group = -1;
    if (!is_ew(ni)) continue;
    int r = find(parent, i);
    if (gid[r] < 0) gid[r] = f->ngroups++;
    ni->group = gid[r];
  }
  f->groups = arena_alloc(sizeof(Group) * (size_t)(f->ngroups + 1));
  for (int i = 0; i < n; i++) {
    IrNode *ni = &f->nodes[i];
    if (ni->group < 0) continue;
    Group *g = &f->groups[ni->group];
    if (!g->members) {
      g->members = arena_alloc(sizeof(int) * (size_t)n);
      g->width = ni->width;
      g->cls = ni->cls;
    }
    g->members[g->n++] = i;
  }
  free(parent);
  free(seen);
  free(stack);
  free(mem);
  free(gid);
}

/* How many product nodes, and other uses, each parameter has across the model. */
static void count_param_uses(const Model *m, int *mm_uses, int *other_uses) {
  int n;
  ParamUse *u = param_uses(m, &n);
  for (int k = 0; k < n; k++) {
    if (u[k].user->op == OP_MATMUL && u[k].arg == 1) mm_uses[u[k].param]++;
    else other_uses[u[k].param]++;
  }
  free(u);
}

/* Which nodes of a vertex function are zero at every vertex without children? Gathered
 * rows are, and so is what keeps a zero a zero (ops.def's ZERO: sums of such, products
 * with one, slices, tanh, relu, products against a matrix). A product whose left
 * operand is one skips the level-0 rows, the leaves: half of all rows in a binary tree.
 * Dropped there are only gradients that would flow to children that do not exist. One
 * pass in node order (operands come first): shared operands are looked at once. */
static void zero_at_leaves(IrFunc *f) {
  for (int i = 0; i < f->n; i++) {
    IrNode *n = &f->nodes[i];
    bool z = false;
    switch (op_info[n->op].zero) {
    case ZERO_NONE: break;
    case ZERO_LEAF: z = true; break;
    case ZERO_A: z = f->nodes[n->args[0]].zero_leaf; break;
    case ZERO_ANY:
      for (int j = 0; j < n->nargs; j++) z = z || f->nodes[n->args[j]].zero_leaf;
      break;
    case ZERO_ALL:
      z = n->nargs > 0;
      for (int j = 0; j < n->nargs; j++) z = z && f->nodes[n->args[j]].zero_leaf;
      break;
    }
    n->zero_leaf = z && f->kind == F_VERTEX && !n->edge && !n->slot; /* a vertex without children has no edges */
  }
}

/* Which nodes are dead at the leaves: every way from them to what the vertex scatters
 * or pushes passes through a product with a value zero at the leaves (a * b, b zero
 * there). In the Tree-LSTM, x @ Wf only meets f_k, and f_k only c_k, which is zero
 * where there is no child k: the forget gates' input projection matters only at rows
 * with a word and children, and SST has none (its internal vertices have no word).
 * The value there must be finite where anything reads it (a skipped product's rows are
 * zeroed, a fused loop's leaves' part stores 0: emit.c, dead_stored); its gradient
 * there is then 0 * finite. One pass in reverse node order (users come after). */
static void dead_at_leaves(IrFunc *f) {
  bool *live = xcalloc((size_t)f->n + 1, sizeof(bool));
  for (int i = f->n - 1; i >= 0; i--) {
    const IrNode *n = &f->nodes[i];
    if (op_info[n->op].kind == OK_SINK || f->kind != F_VERTEX) live[i] = true;
    /* a routing with a load-balancing loss: a loss of its gate at every routed row, the
       leaves' too (its weight the option `balance`, or a number not 0); not one whose
       mixture nothing reads, which autodiff's liveness left out everywhere (uses 0):
       its gate's operands, live here, were computed at the leaves and never stored */
    if (n->op == OP_TOPK && n->uses > 0 && (f->nodes[n->args[1]].ref || f->nodes[n->args[1]].cval != 0))
      live[i] = true;
    if (!live[i]) continue;
    for (int j = 0; j < n->nargs; j++) {
      /* a * b where the other factor is zero at the leaves: 0 there, whatever a is; the
         divisor of a quotient whose dividend is; and a row read only on its edges,
         which a vertex without children has none of */
      bool masked = (n->op == OP_MUL && n->nargs == 2 && f->nodes[n->args[1 - j]].zero_leaf) || n->op == OP_EBCAST ||
                    (n->op == OP_DIV && j == 1 && f->nodes[n->args[0]].zero_leaf); /* 0 / b */
      if (!masked) live[n->args[j]] = true;
    }
  }
  for (int i = 0; i < f->n; i++) f->nodes[i].dead_leaf = !live[i] && !f->nodes[i].edge && !f->nodes[i].slot;
  free(live);
}

static void merge_products(const Model *m, IrFunc *f, const int *mm_uses, const int *other_uses) {
  f->merges = arena_alloc(sizeof(MatMerge) * (size_t)(f->n + 1));
  f->nmerges = 0;
  for (int i = 0; i < f->n; i++) f->nodes[i].mm = -1;
  if (m->no_merge) return;
  for (int i = 0; i < f->n; i++) {
    IrNode *ni = &f->nodes[i];
    if (ni->op != OP_MATMUL || ni->uses == 0 || ni->mm >= 0) continue;
    int p = f->nodes[ni->args[1]].ref;
    if (mm_uses[p] != 1 || other_uses[p]) continue;
    MatMerge mg = {.left = ni->args[0], .cls = ni->cls};
    mg.members = arena_alloc(sizeof(int) * (size_t)f->n);
    for (int j = i; j < f->n; j++) {
      IrNode *nj = &f->nodes[j];
      /* one row set: products dead at the leaves go apart from the others */
      if (nj->op != OP_MATMUL || nj->uses == 0 || nj->mm >= 0 || nj->args[0] != mg.left ||
          nj->cls != mg.cls || nj->dead_leaf != ni->dead_leaf || nj->grad != ni->grad)
        continue;
      int q = f->nodes[nj->args[1]].ref;
      if (mm_uses[q] != 1 || other_uses[q]) continue;
      mg.members[mg.n++] = j;
      mg.cols = lin_add(mg.cols, m->params[q].cols);
    }
    if (mg.n < 2) continue;
    for (int k = 0; k < mg.n; k++) f->nodes[mg.members[k]].mm = f->nmerges;
    f->merges[f->nmerges++] = mg;
  }
}

/* The gather a product's left operand reads whole or in part (a slice of it), or -1;
 * *lo, *hi: the columns. */
static int gathered(const IrFunc *f, int x, Lin *lo, Lin *hi) {
  const IrNode *n = &f->nodes[x];
  if (n->op == OP_GATHER) {
    *lo = lin_const(0);
    *hi = n->width;
    return x;
  }
  if (n->op != OP_SLICE || f->nodes[n->args[0]].op != OP_GATHER) return -1;
  *lo = n->lo;
  *hi = n->hi;
  return n->args[0];
}

/* Stacked products: in a vertex function with C >= 2 children whose gathers are one
 * node each, a parameter used by exactly C products, product k reading the same
 * columns of gather(k), all of one class and alike at the leaves. */
static void stack_products(IrFunc *f, const int *mm_uses, const int *other_uses) {
  int C = f->children;
  if (f->kind != F_VERTEX || C < 2) return;
  int *gat = arena_alloc(sizeof(int) * (size_t)C);
  for (int k = 0; k < C; k++) gat[k] = -1;
  for (int i = 0; i < f->n; i++) {
    const IrNode *n = &f->nodes[i];
    if (n->op != OP_GATHER || n->uses == 0) continue;
    if (n->ref < 0 || n->ref >= C || gat[n->ref] >= 0) return; /* two of one child */
    gat[n->ref] = i;
  }
  for (int k = 0; k < C; k++)
    if (gat[k] < 0 || !lin_eq(f->nodes[gat[k]].width, f->nodes[gat[0]].width)) return; /* one stride */
  for (int i = 0; i < f->n; i++) {
    IrNode *ni = &f->nodes[i];
    if (ni->op != OP_MATMUL || ni->uses == 0 || ni->mm >= 0) continue;
    int p = f->nodes[ni->args[1]].ref;
    Lin lo0, hi0;
    if (mm_uses[p] != C || other_uses[p] || gathered(f, ni->args[0], &lo0, &hi0) != gat[0]) continue;
    MatMerge mg = {.left = ni->args[0], .cls = ni->cls, .cols = ni->width, .stack = C};
    mg.members = arena_alloc(sizeof(int) * (size_t)C);
    for (int k = 0; k < C; k++) mg.members[k] = -1;
    for (int j = 0; j < f->n; j++) {
      IrNode *nj = &f->nodes[j];
      Lin lo, hi;
      if (nj->op != OP_MATMUL || nj->uses == 0 || nj->mm >= 0 || f->nodes[nj->args[1]].ref != p ||
          nj->cls != ni->cls || nj->dead_leaf != ni->dead_leaf || nj->grad != ni->grad)
        continue;
      int g = gathered(f, nj->args[0], &lo, &hi);
      for (int k = 0; k < C; k++)
        if (g == gat[k] && lin_eq(lo, lo0) && lin_eq(hi, hi0) && mg.members[k] < 0) mg.members[k] = j;
    }
    bool all = true;
    for (int k = 0; k < C; k++) all = all && mg.members[k] >= 0;
    if (!all) continue;
    mg.n = C;
    for (int k = 0; k < C; k++) f->nodes[mg.members[k]].mm = f->nmerges;
    f->merges[f->nmerges++] = mg;
  }
}

void fuse(Model *m) {
  int nf;
  IrFunc **fs = model_funcs(m, &nf);
  int *mm_uses = xcalloc((size_t)m->nparams + 1, sizeof(int));
  int *other_uses = xcalloc((size_t)m->nparams + 1, sizeof(int));
  count_param_uses(m, mm_uses, other_uses);
  for (int k = 0; k < nf; k++) {
    zero_at_leaves(fs[k]);
    dead_at_leaves(fs[k]);
    fuse_groups(fs[k], m->no_fuse);
    merge_products(m, fs[k], mm_uses, other_uses);
    if (!m->no_merge) stack_products(fs[k], mm_uses, other_uses);
  }
  free(mm_uses);
  free(other_uses);
}

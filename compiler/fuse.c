/* fuse.c: two rewrites that cut the number of loops and products.
 *
 * Elementwise fusion: union-find over the edges between live elementwise nodes of one
 * class; each group becomes one loop (C; one kernel in the CUDA emitter to come) that keeps intermediate
 * values in registers. A union is refused when it would make the group depend on itself
 * through an outside node (a group runs as one step, so no input of it may need one of
 * its members): checked with transitive-dependency bitsets.
 *
 * Product merging: products of one class that share their left operand (x @ Wi,
 * x @ Wf, ...) become one product against a parameter block whose column ranges are
 * those parameters, so the eager phase of the Tree-LSTM is one sgemm. A parameter joins
 * a block only if that product is its only use in the model (it can live in one place). */
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

static void fuse_groups(IrFunc *f) {
  int n = f->n;
  int *parent = malloc(sizeof(int) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) parent[i] = i;
  bool can_fuse = n <= FUSE_MAX_NODES;
  size_t words = ((size_t)n + 63) / 64;
  uint64_t *reach = can_fuse ? calloc((size_t)n * words, sizeof(uint64_t)) : NULL;
  for (int i = 0; can_fuse && i < n; i++) {
    uint64_t *r = reach + (size_t)i * words;
    for (int j = 0; j < f->nodes[i].nargs; j++) {
      int a = f->nodes[i].args[j];
      uint64_t *ra = reach + (size_t)a * words;
      for (size_t w = 0; w < words; w++) r[w] |= ra[w];
      r[a / 64] |= 1ull << (a % 64);
    }
  }
  /* members of each root, kept as a bitset for the legality check */
  uint64_t *mem = can_fuse ? calloc((size_t)n * words, sizeof(uint64_t)) : NULL;
  for (int i = 0; can_fuse && i < n; i++) mem[(size_t)i * words + (size_t)i / 64] |= 1ull << (i % 64);

  for (int v = 0; can_fuse && v < n; v++) {
    IrNode *nv = &f->nodes[v];
    if (!is_ew(nv)) continue;
    for (int j = 0; j < nv->nargs; j++) {
      int u = nv->args[j];
      IrNode *nu = &f->nodes[u];
      if (!is_ew(nu) || nu->cls != nv->cls) continue;
      int gu = find(parent, u), gv = find(parent, v);
      if (gu == gv) continue;
      uint64_t *mu = mem + (size_t)gu * words, *mv = mem + (size_t)gv * words;
      /* legal iff no outside input of the union depends on a member of it */
      bool legal = true;
      for (int x = 0; x < n && legal; x++) {
        bool in_u = mu[x / 64] >> (x % 64) & 1, in_v = mv[x / 64] >> (x % 64) & 1;
        if (!in_u && !in_v) continue;
        const IrNode *nx = &f->nodes[x];
        for (int k = 0; k < nx->nargs && legal; k++) {
          int a = nx->args[k];
          bool a_in = (mu[a / 64] >> (a % 64) & 1) || (mv[a / 64] >> (a % 64) & 1);
          if (a_in) continue;
          const uint64_t *ra = reach + (size_t)a * words;
          for (size_t w = 0; w < words; w++)
            if (ra[w] & (mu[w] | mv[w])) legal = false;
        }
      }
      if (!legal) continue;
      parent[gu] = gv;
      for (size_t w = 0; w < words; w++) mv[w] |= mu[w];
    }
  }
  /* number the groups in order of their first member */
  int *gid = malloc(sizeof(int) * (size_t)(n + 1));
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
  free(reach);
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

static void merge_products(const Model *m, IrFunc *f, const int *mm_uses, const int *other_uses) {
  f->merges = arena_alloc(sizeof(MatMerge) * (size_t)(f->n + 1));
  f->nmerges = 0;
  for (int i = 0; i < f->n; i++) f->nodes[i].mm = -1;
  for (int i = 0; i < f->n; i++) {
    IrNode *ni = &f->nodes[i];
    if (ni->op != OP_MATMUL || ni->uses == 0 || ni->mm >= 0) continue;
    int p = f->nodes[ni->args[1]].ref;
    if (mm_uses[p] != 1 || other_uses[p]) continue;
    MatMerge mg = {.left = ni->args[0], .cls = ni->cls};
    mg.members = arena_alloc(sizeof(int) * (size_t)f->n);
    for (int j = i; j < f->n; j++) {
      IrNode *nj = &f->nodes[j];
      if (nj->op != OP_MATMUL || nj->uses == 0 || nj->mm >= 0 || nj->args[0] != mg.left ||
          nj->cls != mg.cls)
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

void fuse(Model *m) {
  int nf;
  IrFunc **fs = model_funcs(m, &nf);
  int *mm_uses = calloc((size_t)m->nparams + 1, sizeof(int));
  int *other_uses = calloc((size_t)m->nparams + 1, sizeof(int));
  count_param_uses(m, mm_uses, other_uses);
  for (int k = 0; k < nf; k++) {
    fuse_groups(fs[k]);
    merge_products(m, fs[k], mm_uses, other_uses);
  }
  free(mm_uses);
  free(other_uses);
}

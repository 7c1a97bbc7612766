/* vfgen.h: a deterministic generator of random, valid .vf programs (man/vf.5) for
 * tests/check_random.c. Everything is drawn from a splitmix64 stream seeded by the
 * program's number, so seed N is the same program on every machine and in every run.
 *
 * A program: two to four shape dims (H always; E, G sometimes, G at times without a
 * default; C the classes), a pull block (a lookup, real inputs, elementwise work), one or
 * two vertex blocks (children 0..3, sometimes 4..8, a set `children *` sometimes), each
 * reading its children through gather(k), per-child for loops, sums over the children
 * (sum(k in lo..hi: ...) and sum(s in children: ...)), loops in any block that are not
 * over the children (for j in 0..3 { z_j = zw[j*H:(j+1)*H]; }, j as a number, a name
 * local to an iteration, then sum(j in ..: ...) or concat), random expression DAGs over
 * those rows (products with params, shared params, the elementwise ops, unary minus,
 * slices, concat, sums, broadcast scores, scalars, param vectors, dropout (a number or
 * the option drop), noise, repeated subexpressions), a scatter and a push, and a push
 * block with softmax_xent and/or mse; sometimes a mixture of experts (a vertex block's or
 * the push block's; its balancing weight a number or the option balance, whose default
 * may be 0). Some models name their children's types: two types in named slots (`children
 * u0: a, u1: b`), a typed set (`children *: a`, one type a set of itself, or after slots:
 * `children v0: b, *: a`); there each type scatters a width of its own (the second type's
 * sometimes not the first's), gather(SLOT) and s are their type's width, and a type that
 * no slot names may scatter nothing (it pushes). Widths are linear forms over the dims,
 * kept exactly so that every shape the program states checks, written 2H, 2*H or H*2 (one
 * style a program); params are declared one or several a declaration, with init clauses
 * (identity for square matrices and tables of per-vertex matrices, constants for vectors;
 * zeros and constants for matrices and tables too where the program has no softmax and no
 * mixture, whose argmax and routing a tie would leave to the rounding); option clip and a
 * comment sometimes. The draws added after seed 1500's sweep (many children, those
 * loops, the constants, the option balance more often) come from a second stream, P->x;
 * loops nested in loops (vg_nest), added after seed 3100's, from a third, P->y; and from
 * a fourth, P->z, added when none of seeds 1-3500 reached cavsc's cavs_gemm_kids, a type
 * whose state is a looked-up row (the pull block's last value `xN = embM[word]` as it
 * is, a table of the type's width, new or one read before; the type scatters `pull()`,
 * or `x` of `x = pull();`): a leaf type where there is one, else either; and a product
 * over the children's rows that hold such rows, `concat(gather(0), .., gather(S-1)) @ W`
 * (every slot, in order) or `gather(0) @ W`, in another type's scatter (tanh or sigmoid
 * of a row plus it) or, where the type is the same or scatters nothing, in its push;
 * inline or named first (kwN), where others may read it too. Typed models: slot 0's type
 * is the table type. About one program in thirteen. From a fifth, P->w, added when cavsc
 * began to leave out the backward pass of what no loss reaches (about half of seeds
 * 1-1500 had a vertex block no loss read, whose backward then ran with zeros and now runs
 * not at all): half the push blocks' losses read h (`h @ W + ...`, W a new parameter
 * the rest of the expression cannot read: a term could cancel one read before). */
#ifndef VFGEN_H
#define VFGEN_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the PRNG ---- */
typedef struct VgRng {
  uint64_t s;
} VgRng;
static inline uint64_t vg_next(VgRng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static inline int vg_int(VgRng *r, int n) { return n <= 1 ? 0 : (int)(vg_next(r) % (uint64_t)n); }
/* true with probability p percent */
static inline bool vg_pct(VgRng *r, int p) { return vg_int(r, 100) < p; }

/* ---- a growing string ---- */
typedef struct VgStr {
  char *p;
  size_t n, cap;
} VgStr;
static inline void vg_puts(VgStr *s, const char *t) {
  size_t k = strlen(t);
  if (s->n + k + 1 > s->cap) {
    s->cap = (s->n + k + 1) * 2 + 256;
    s->p = realloc(s->p, s->cap);
    if (!s->p) abort();
  }
  memcpy(s->p + s->n, t, k + 1);
  s->n += k;
}
static inline void vg_printf(VgStr *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *buf = malloc((size_t)n + 1);
  if (!buf) abort();
  va_start(ap, fmt);
  vsnprintf(buf, (size_t)n + 1, fmt, ap);
  va_end(ap);
  vg_puts(s, buf);
  free(buf);
}

/* ---- widths: a linear form over the dims (H, E, G, C, X) and a constant ---- */
enum { VG_H, VG_E, VG_G, VG_C, VG_X, VG_HH, VG_NDIM };
static const char *const vg_dimname[VG_NDIM] = {"H", "E", "G", "C", "X", "HH"};
typedef struct VgW {
  int c[VG_NDIM], k;
} VgW;
static inline VgW vg_w(int h, int e, int g, int k) {
  VgW w = {{h, e, g, 0, 0, 0}, k};
  return w;
}
static inline VgW vg_dimw(int d) {
  VgW w = {{0}, 0};
  w.c[d] = 1;
  return w;
}
static inline bool vg_weq(VgW a, VgW b) { return !memcmp(&a, &b, sizeof a); }
static inline bool vg_wzero(VgW a) {
  for (int i = 0; i < VG_NDIM; i++)
    if (a.c[i]) return false;
  return a.k == 0;
}
static inline VgW vg_wadd(VgW a, VgW b) {
  for (int i = 0; i < VG_NDIM; i++) a.c[i] += b.c[i];
  a.k += b.k;
  return a;
}
static inline VgW vg_wsub(VgW a, VgW b) {
  for (int i = 0; i < VG_NDIM; i++) a.c[i] -= b.c[i];
  a.k -= b.k;
  return a;
}
/* one atom: a single dim, or the constant 1 */
static inline bool vg_wone_dim(VgW a, int *d) {
  int n = 0;
  for (int i = 0; i < VG_NDIM; i++) {
    if (a.c[i] == 1) *d = i, n++;
    else if (a.c[i]) return false;
  }
  return n == 1 && a.k == 0;
}
static inline bool vg_wscalar1(VgW a) {
  VgW one = {{0}, 1};
  return vg_weq(a, one);
}
/* how a coefficient is written: 2H, 2*H or H*2 (one style a program) */
static int vg_wstyle;
static inline void vg_wstr(VgW w, char *out, size_t n) {
  out[0] = 0;
  size_t len = 0;
  for (int i = 0; i < VG_NDIM; i++)
    if (w.c[i]) {
      if (w.c[i] == 1) len += (size_t)snprintf(out + len, n - len, "%s%s", len ? "+" : "", vg_dimname[i]);
      /* (2E+4 too: the dim term 2E plus 4, which cavsc once read as a number) */
      else if (vg_wstyle == 1) len += (size_t)snprintf(out + len, n - len, "%s%d*%s", len ? "+" : "", w.c[i], vg_dimname[i]);
      else if (vg_wstyle == 2) len += (size_t)snprintf(out + len, n - len, "%s%s*%d", len ? "+" : "", vg_dimname[i], w.c[i]);
      else len += (size_t)snprintf(out + len, n - len, "%s%d%s", len ? "+" : "", w.c[i], vg_dimname[i]);
    }
  if (w.k || !len) snprintf(out + len, n - len, "%s%d", len ? "+" : "", w.k);
}
/* a random part of w: 0 <= p <= w coefficient by coefficient (possibly zero or all) */
static inline VgW vg_wpart(VgRng *r, VgW w) {
  VgW p = {{0}, 0};
  for (int i = 0; i < VG_NDIM; i++) p.c[i] = vg_int(r, w.c[i] + 1);
  p.k = vg_int(r, w.k + 1);
  return p;
}

/* ---- the program under construction ---- */
enum { VG_MAXVAL = 96, VG_MAXPARAM = 400, VG_NAME = 48, VG_MAXINPUT = 8, VG_MAXSTR = 16, VG_MAXKIDS = 8 };

typedef struct VgVal {
  char name[VG_NAME];
  VgW w;
  bool family; /* members name_LO..name_HI (one per child, or a loop's): name_k in a loop */
  int lo, n;   /* a family's first member and how many */
} VgVal;

typedef struct VgParam {
  char name[16];
  VgW rows, cols;
  bool matrix;
  char extra[48]; /* " = 0.5" or "" */
  char shape[80]; /* for moe tables: the text of the shape */
  bool table;     /* a lookup table [V, w] or an expert table: never a product's operand */
} VgParam;

typedef struct VgInput {
  char name[16];
  int kind; /* 0 index, 1 class, 2 real */
  VgW w;
} VgInput;

typedef struct VgBlock {
  VgVal val[VG_MAXVAL];
  int nval;
  int children;     /* a vertex block's children, numbered or in named slots */
  bool set;         /* and a set: children *, or (typed) children *: T after any slots */
  VgW kidw[VG_MAXKIDS]; /* the width each slot gathers (the state, or its type's) */
  bool kuni;        /* every slot the same width: gather(k) in a loop over them */
  VgW setw;         /* the row s of sum(s in children: ...) */
  bool pull, push;  /* which block */
  const char *loopk;  /* inside sum(k in ..: ) or a for body: the loop var */
  int looplo, loophi; /* and its range */
  const char *setvar; /* inside sum(s in children: ): the child's row */
  bool in_moe;
  bool no_draw; /* dropout/noise not allowed here */
  char strs[VG_MAXSTR][512]; /* subexpressions written once: written again, verbatim */
  VgW strw[VG_MAXSTR];
  int nstr;
  int tmp;
} VgBlock;

typedef struct VgProg {
  VgRng r;
  VgRng x; /* the draws added since seed 1500's sweep: a program that draws none of them
              is the one it was */
  VgRng y; /* and since seed 3100's: loops nested in loops (vg_nest) */
  VgRng z; /* and since cavs_gemm_kids: a type whose state is a looked-up row, its
              children's rows multiplied (tpull, tprod in vg_program_flags) */
  VgRng w; /* and since cavsc computes gradients only where a loss reaches (autodiff.c):
              the push block's loss reading h */
  VgStr head, body;
  bool dim_on[VG_NDIM];
  VgParam param[VG_MAXPARAM];
  int nparam;
  VgInput input[VG_MAXINPUT];
  int ninput;
  VgW state; /* what every vertex block scatters */
  VgW pushw; /* what the pushing blocks push */
  VgW parts[4];
  int nparts; /* state = concat of parts */
  bool vocab_dim, has_pull, fixed_v;
  int pull_nval;
  VgVal pullv[16];
  int moe_blocks;       /* the one moe's block: set once */
  int nprod;            /* product dims declared */
  char prod[8][VG_NAME];
  int prod_a[8], prod_b[8];
  bool typed;   /* blocks name their children's types */
  char slot[2][VG_MAXKIDS][8];
  bool opt_drop; /* option drop declared */
  bool opt_balance; /* option balance declared */
  const char *balance_dflt; /* its default */
  bool tiefree;     /* no softmax and no moe: no argmax, no routing that a tie would
                       leave to the rounding, so matrices may be constants */
  bool balance; /* a load-balancing loss of a positive weight: batching changes it */
  bool draws;   /* dropout or noise: drawn values */
  int depth_max;
  int nexpr; /* a budget: the program's size */
} VgProg;

static inline void vg_expr(VgProg *P, VgBlock *b, VgW want, int depth, VgStr *o);

static inline VgParam *vg_newparam(VgProg *P) {
  if (P->nparam >= VG_MAXPARAM) abort(); /* a generator bug */
  return &P->param[P->nparam++];
}

static inline const char *vg_param_for(VgProg *P, VgW rows, VgW cols, bool matrix) {
  /* a param of that shape again (products merge, a shared weight) or a new one */
  int cand[VG_MAXPARAM], nc = 0;
  for (int i = 0; i < P->nparam; i++)
    if (!P->param[i].table && P->param[i].matrix == matrix && vg_weq(P->param[i].cols, cols) &&
        (!matrix || vg_weq(P->param[i].rows, rows)))
      cand[nc++] = i;
  if (nc && (vg_pct(&P->r, 35) || P->nparam >= VG_MAXPARAM - 8)) return P->param[cand[vg_int(&P->r, nc)]].name;
  VgParam *p = vg_newparam(P);
  P->nparam--;
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s%d", matrix ? "W" : "b", P->nparam);
  p->rows = rows, p->cols = cols, p->matrix = matrix;
  /* a constant only for vectors: a matrix of equal columns ties its row's logits, whose
     argmax then follows the rounding (batched and serial sum in other orders) */
  if (!matrix && vg_pct(&P->r, 10)) snprintf(p->extra, sizeof p->extra, " = 0.%d", 1 + vg_int(&P->r, 9));
  P->nparam++;
  return p->name;
}

/* A new matrix parameter that nothing has read (vg_param_for may hand out one read
   before, whose product a term could then cancel: h @ W + neg(h) @ W, logits that tie) */
static inline const char *vg_param_fresh(VgProg *P, VgW rows, VgW cols) {
  VgParam *p = vg_newparam(P);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "W%d", P->nparam - 1);
  p->rows = rows, p->cols = cols, p->matrix = true;
  return p->name;
}

/* The loss's expression of width w, read into a string first; h @ W + it where the
   fifth stream says (W new after the expression, which so cannot read it too) */
static inline void vg_loss_expr(VgProg *P, VgBlock *b, VgW w, int depth, VgStr *o) {
  bool h = vg_pct(&P->w, 50);
  VgStr e = {0};
  vg_expr(P, b, w, depth, &e);
  if (h) vg_printf(o, "h @ %s + ", vg_param_fresh(P, P->pushw, w));
  vg_puts(o, e.p);
  free(e.p);
}

static inline const char *vg_input(VgProg *P, int kind, VgW w, const char *name) {
  for (int i = 0; i < P->ninput; i++)
    if (P->input[i].kind == kind && vg_weq(P->input[i].w, w) && (!name || !strcmp(P->input[i].name, name)))
      return P->input[i].name;
  if (P->ninput >= VG_MAXINPUT) return NULL;
  if (kind == 2) {
    /* engine.h's TGraph holds 8192 real values: 100 vertices at tg_minibatch's dims
       (8 + 3i, so at most 20 here) */
    int cost = 0;
    for (int i = 0; i <= P->ninput; i++) {
      VgW x = i < P->ninput ? P->input[i].w : w;
      if (i < P->ninput && P->input[i].kind != 2) continue;
      for (int j = 0; j < VG_NDIM; j++) cost += (j == VG_HH ? 1000 : 20) * x.c[j];
      cost += x.k;
    }
    if (cost > 80) return NULL;
  }
  VgInput *in = &P->input[P->ninput];
  in->kind = kind, in->w = w;
  if (name) snprintf(in->name, sizeof in->name, "%s", name);
  else snprintf(in->name, sizeof in->name, "f%d", P->ninput);
  P->ninput++;
  return in->name;
}

/* The name that reads v here: v, or a family's member: name_k in a loop over k whose
 * range the family's members cover, else one drawn */
static inline void vg_ref(VgProg *P, const VgBlock *b, const VgVal *v, char *out, size_t n) {
  if (!v->family) snprintf(out, n, "%s", v->name);
  else if (b->loopk && v->lo <= b->looplo && b->loophi < v->lo + v->n) snprintf(out, n, "%s_%s", v->name, b->loopk);
  else snprintf(out, n, "%s_%d", v->name, v->lo + vg_int(&P->r, v->n));
}

/* a value of width w already in the block: a name, or a subexpression written before */
static inline bool vg_leaf(VgProg *P, VgBlock *b, VgW want, VgStr *o) {
  int cand[VG_MAXVAL], nc = 0;
  for (int i = 0; i < b->nval; i++)
    if (vg_weq(b->val[i].w, want)) cand[nc++] = i;
  if (nc) {
    char nm[VG_NAME + 16];
    vg_ref(P, b, &b->val[cand[vg_int(&P->r, nc)]], nm, sizeof nm);
    vg_puts(o, nm);
    return true;
  }
  return false;
}

static inline void vg_any_leaf(VgProg *P, VgBlock *b, VgW want, VgStr *o) {
  /* something of exactly that width, however it must be made */
  if (vg_leaf(P, b, want, o)) return;
  /* a child's row, a lookup, a real input, or a product of a value */
  if (b->setvar && vg_weq(want, b->setw)) {
    vg_puts(o, b->setvar);
    return;
  }
  if (b->nval && vg_pct(&P->r, 75)) {
    VgVal *v = &b->val[vg_int(&P->r, b->nval)];
    char nm[VG_NAME + 16];
    vg_ref(P, b, v, nm, sizeof nm);
    vg_printf(o, "(%s @ %s)", nm, vg_param_for(P, v->w, want, true));
    return;
  }
  const char *f = vg_input(P, 2, want, NULL);
  if (f) {
    vg_puts(o, f);
    return;
  }
  for (int i = 0; i < P->ninput; i++) /* no input to spare: a product of one */
    if (P->input[i].kind == 2 && vg_pct(&P->r, 50)) {
      vg_printf(o, "(%s @ %s)", P->input[i].name, vg_param_for(P, P->input[i].w, want, true));
      return;
    }
  /* or a lookup */
  VgParam *p = vg_newparam(P);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "emb%d", P->nparam - 1);
  p->cols = want, p->matrix = true, p->table = true;
  vg_input(P, 0, vg_w(0, 0, 0, 0), "word");
  vg_printf(o, "%s[word]", p->name);
}

static const VgW *vg_pick_width(VgProg *P) {
  static VgW w[16];
  int n = 0;
  w[n++] = vg_w(1, 0, 0, 0);
  w[n++] = vg_w(1, 0, 0, 0);
  w[n++] = vg_w(2, 0, 0, 0);
  w[n++] = vg_w(0, 0, 0, 1);
  w[n++] = vg_w(0, 0, 0, 2);
  w[n++] = vg_w(1, 0, 0, 1);
  if (P->dim_on[VG_E]) w[n++] = vg_w(0, 1, 0, 0), w[n++] = vg_w(1, 1, 0, 0), w[n++] = vg_w(0, 1, 0, 0);
  if (P->dim_on[VG_G]) w[n++] = vg_w(0, 0, 1, 0), w[n++] = vg_w(1, 0, 1, 0);
  if (P->dim_on[VG_HH]) w[n++] = vg_dimw(VG_HH);
  return &w[vg_int(&P->r, n)];
}

static inline void vg_sub(VgProg *P, VgBlock *b, VgW want, int depth, VgStr *o) {
  VgStr s = {0};
  vg_expr(P, b, want, depth, &s);
  vg_puts(o, s.p);
  /* keep it to be written again (common subexpressions) */
  if (s.n < 500 && s.n > 8 && b->nstr < VG_MAXSTR && vg_pct(&P->r, 30)) {
    snprintf(b->strs[b->nstr], sizeof b->strs[0], "%s", s.p);
    b->strw[b->nstr++] = want;
  }
  free(s.p);
}

static const char *const vg_scalars[] = {"0.5", "2", "0.25", "1.5", "3", "0.1"};

/* A child's row `row` (of width rw) made `want` wide: itself (times 0.5, when
   `halved` draws it), a slice of it, or a product with a param */
static inline void vg_state_row(VgProg *P, VgStr *o, const char *row, VgW rw, VgW want, bool halved) {
  VgRng *r = &P->r;
  VgW ex = vg_wsub(rw, want);
  bool ok = ex.k >= 0;
  for (int i = 0; i < VG_NDIM; i++) ok &= ex.c[i] >= 0;
  if (vg_weq(rw, want)) vg_printf(o, halved && !vg_pct(r, 50) ? "%s * 0.5" : "%s", row);
  else if (ok) {
    VgW lo = vg_wpart(r, ex);
    char l[64], h[64];
    vg_wstr(lo, l, sizeof l);
    vg_wstr(vg_wadd(lo, want), h, sizeof h);
    vg_printf(o, "%s[%s:%s]", row, l, h);
  } else {
    vg_printf(o, "(%s @ %s)", row, vg_param_for(P, rw, want, true));
  }
}

static inline void vg_expr(VgProg *P, VgBlock *b, VgW want, int depth, VgStr *o) {
  VgRng *r = &P->r;
  P->nexpr++;
  if (depth <= 0 || P->nexpr > 400 || vg_pct(r, 18)) {
    /* a subexpression written before, again */
    if (b->nstr && vg_pct(r, 25)) {
      int c[VG_MAXSTR], nc = 0;
      bool inside = b->loopk || b->setvar || b->in_moe || b->no_draw;
      for (int i = 0; i < b->nstr; i++)
        if (vg_weq(b->strw[i], want) &&
            !(inside && (strstr(b->strs[i], "sum(") || strstr(b->strs[i], "dropout(") || strstr(b->strs[i], "noise("))))
          c[nc++] = i;
      if (nc) {
        vg_printf(o, "(%s)", b->strs[c[vg_int(r, nc)]]);
        return;
      }
    }
    vg_any_leaf(P, b, want, o);
    return;
  }
  int d = depth - 1;
  char ws[64];
  for (;;) {
    switch (vg_int(r, P->dim_on[VG_HH] ? 25 : 22)) {
    case 22:
    case 23:
    case 24: { /* matrices per vertex: mv(x, M), mm(M, W) */
      int dd;
      if (vg_wone_dim(want, &dd) && dd == VG_H) {
        vg_puts(o, "mv(");
        vg_sub(P, b, vg_dimw(VG_H), d, o);
        vg_puts(o, ", ");
        vg_sub(P, b, vg_dimw(VG_HH), d, o);
        vg_puts(o, ")");
        return;
      }
      if (vg_wone_dim(want, &dd) && dd == VG_HH) {
        vg_puts(o, "mm(");
        vg_sub(P, b, vg_dimw(VG_HH), d, o);
        vg_printf(o, ", %s)", vg_param_for(P, vg_dimw(VG_H), vg_dimw(VG_H), true));
        return;
      }
      continue;
    }
    case 0:
    case 1: { /* a product */
      VgW a = *vg_pick_width(P);
      if (vg_pct(r, 30) && b->nval) a = b->val[vg_int(r, b->nval)].w;
      vg_puts(o, "(");
      vg_sub(P, b, a, d, o);
      vg_printf(o, " @ %s)", vg_param_for(P, a, want, true));
      return;
    }
    case 2: { /* products summed, and a bias: x @ W + y @ U + b */
      int n = 1 + vg_int(r, 3);
      vg_puts(o, "(");
      for (int i = 0; i < n; i++) {
        VgW a = *vg_pick_width(P);
        if (i) vg_puts(o, " + ");
        vg_sub(P, b, a, d, o);
        vg_printf(o, " @ %s", vg_param_for(P, a, want, true));
      }
      if (vg_pct(r, 60)) vg_printf(o, " + %s", vg_param_for(P, want, want, false));
      vg_puts(o, ")");
      return;
    }
    case 3:
    case 4: { /* an activation */
      static const char *const f[] = {"sigmoid(", "tanh(", "relu(", "neg(", "tanh(", "sigmoid(", "(-"};
      vg_puts(o, f[vg_int(r, 7)]); /* (-x): unary minus */
      vg_expr(P, b, want, d, o);
      vg_puts(o, ")");
      return;
    }
    case 5: { /* exp and log, kept in range */
      switch (vg_int(r, 5)) {
      case 0: vg_puts(o, "exp(tanh("); vg_expr(P, b, want, d, o); vg_puts(o, "))"); break;
      case 1: vg_puts(o, "exp(0.5 * sigmoid("); vg_expr(P, b, want, d, o); vg_puts(o, "))"); break;
      case 2: vg_puts(o, "log(1 + sigmoid("); vg_expr(P, b, want, d, o); vg_puts(o, "))"); break;
      case 3: vg_puts(o, "log(1 + exp(tanh("); vg_expr(P, b, want, d, o); vg_puts(o, ")))"); break;
      default: vg_puts(o, "log(2 + tanh("); vg_expr(P, b, want, d, o); vg_puts(o, "))"); break;
      }
      return;
    }
    case 6:
    case 7:
    case 8: { /* elementwise binary */
      static const char *const op[] = {" + ", " - ", " * ", " + ", " * "};
      vg_puts(o, "(");
      vg_sub(P, b, want, d, o);
      vg_puts(o, op[vg_int(r, 5)]);
      vg_sub(P, b, want, d, o);
      vg_puts(o, ")");
      return;
    }
    case 9: { /* with a param vector */
      vg_puts(o, "(");
      if (vg_pct(r, 30)) {
        vg_printf(o, "%s %s ", vg_param_for(P, want, want, false), vg_pct(r, 50) ? "*" : "-");
        vg_expr(P, b, want, d, o);
      } else {
        vg_expr(P, b, want, d, o);
        vg_printf(o, " %s %s", vg_pct(r, 50) ? "*" : "+", vg_param_for(P, want, want, false));
      }
      vg_puts(o, ")");
      return;
    }
    case 10: { /* a scalar */
      const char *c = vg_scalars[vg_int(r, 6)];
      vg_puts(o, "(");
      switch (vg_int(r, 5)) {
      case 0: vg_printf(o, "%s * ", c); vg_expr(P, b, want, d, o); break;
      case 1: vg_printf(o, "%s - ", c); vg_expr(P, b, want, d, o); break;
      case 2: vg_expr(P, b, want, d, o); vg_printf(o, " / %s", c); break;
      case 3: vg_expr(P, b, want, d, o); vg_printf(o, " + %s", c); break;
      default: vg_expr(P, b, want, d, o); vg_printf(o, " * %s", c); break;
      }
      vg_puts(o, ")");
      return;
    }
    case 11: { /* a division by something away from zero */
      vg_puts(o, "(");
      vg_expr(P, b, want, d, o);
      if (vg_pct(r, 50)) {
        vg_puts(o, " / (1.5 + sigmoid(");
        vg_expr(P, b, want, d, o);
        vg_puts(o, "))");
      } else if (vg_pct(r, 50)) {
        vg_puts(o, " / (1 + exp(tanh(");
        vg_expr(P, b, want, d, o);
        vg_puts(o, ")))");
      } else { /* by a score: a row of width 1 */
        vg_puts(o, " / (2 + tanh(");
        vg_expr(P, b, vg_w(0, 0, 0, 1), d, o);
        vg_puts(o, "))");
      }
      vg_puts(o, ")");
      return;
    }
    case 12: { /* a score broadcast over the columns */
      if (vg_wscalar1(want)) continue;
      vg_puts(o, "(");
      bool first = vg_pct(r, 50);
      if (first) {
        vg_expr(P, b, vg_w(0, 0, 0, 1), d, o);
        vg_puts(o, " * ");
      }
      if (vg_pct(r, 25)) vg_puts(o, vg_param_for(P, want, want, false));
      else vg_expr(P, b, want, d, o);
      if (!first) {
        vg_puts(o, vg_pct(r, 50) ? " * " : " + ");
        vg_expr(P, b, vg_w(0, 0, 0, 1), d, o);
      }
      vg_puts(o, ")");
      return;
    }
    case 13: { /* concat of two or three parts */
      VgW p1 = vg_wpart(r, want);
      if (vg_wzero(p1) || vg_weq(p1, want)) continue;
      VgW rest = vg_wsub(want, p1);
      vg_puts(o, "concat(");
      vg_sub(P, b, p1, d, o);
      VgW p2 = vg_wpart(r, rest);
      if (!vg_wzero(p2) && !vg_weq(p2, rest) && vg_pct(r, 40)) {
        vg_puts(o, ", ");
        vg_sub(P, b, p2, d, o);
        rest = vg_wsub(rest, p2);
      }
      vg_puts(o, ", ");
      vg_sub(P, b, rest, d, o);
      vg_puts(o, ")");
      return;
    }
    case 14:
    case 15: { /* a slice of something wider */
      VgW extra = *vg_pick_width(P);
      if (vg_pct(r, 30) && b->nval) { /* of a value in the block, where it is wide enough */
        VgVal *v = &b->val[vg_int(r, b->nval)];
        VgW ex = vg_wsub(v->w, want);
        bool ok = !vg_wzero(ex) && ex.k >= 0;
        for (int i = 0; i < VG_NDIM; i++) ok &= ex.c[i] >= 0;
        if (ok) {
          VgW lo = vg_wpart(r, ex);
          char l[64], h[64], nm[VG_NAME + 16];
          vg_wstr(lo, l, sizeof l);
          vg_wstr(vg_wadd(lo, want), h, sizeof h);
          vg_ref(P, b, v, nm, sizeof nm);
          vg_printf(o, "%s[%s:%s]", nm, l, h);
          return;
        }
      }
      VgW src = vg_wadd(want, extra);
      VgW lo = vg_wpart(r, extra);
      char l[64], h[64];
      vg_wstr(lo, l, sizeof l);
      vg_wstr(vg_wadd(lo, want), h, sizeof h);
      vg_puts(o, "(");
      vg_sub(P, b, src, d, o);
      vg_printf(o, ")[%s:%s]", l, h);
      return;
    }
    case 16: { /* sum(a, b, ...) */
      int n = 2 + vg_int(r, 2);
      vg_puts(o, "sum(");
      for (int i = 0; i < n; i++) {
        if (i) vg_puts(o, ", ");
        vg_sub(P, b, want, d, o);
      }
      vg_puts(o, ")");
      return;
    }
    case 17:
    case 18: { /* over the children */
      if (b->loopk || b->setvar || b->in_moe) continue;
      if (b->children > 0 && !(b->set && vg_pct(r, 50))) {
        int lo = 0, hi = b->children - 1;
        if (hi > 0 && vg_pct(r, 20)) lo = 1;
        vg_printf(o, "sum(k in %d..%d: ", lo, hi);
        b->loopk = "k", b->looplo = lo, b->loophi = hi;
        int save = b->nstr; /* a subexpression of the loop's reads k: not outside it */
        if (b->kuni && vg_pct(r, 50)) {
          vg_state_row(P, o, "gather(k)", b->kidw[0], want, true); /* a child's row */
        } else {
          vg_expr(P, b, want, d, o);
        }
        b->nstr = save;
        b->loopk = NULL;
        vg_puts(o, ")");
        return;
      }
      if (b->set) { /* a set */
        vg_puts(o, "sum(s in children: ");
        b->setvar = "s";
        bool nd = b->no_draw;
        b->no_draw = true;
        int save = b->nstr;
        if (vg_pct(r, 40)) vg_printf(o, "(s @ %s)", vg_param_for(P, b->setw, want, true));
        else vg_expr(P, b, want, d, o);
        b->nstr = save;
        b->no_draw = nd;
        b->setvar = NULL;
        vg_puts(o, ")");
        return;
      }
      continue;
    }
    case 19: { /* the child's row in a sum over a set */
      if (!b->setvar) continue;
      vg_state_row(P, o, "s", b->setw, want, false);
      return;
    }
    case 20: { /* dropout, noise */
      if (b->no_draw || b->in_moe || b->setvar || !vg_pct(r, 50)) continue;
      P->draws = true;
      if (vg_pct(r, 70)) {
        static const char *const p[] = {"0", "0.3", "0.5", "0.2", "drop"};
        vg_puts(o, "dropout(");
        vg_expr(P, b, want, d, o);
        int k = vg_int(r, 5);
        if (k == 4) P->opt_drop = true;
        vg_printf(o, ", %s)", p[k]);
      } else {
        vg_puts(o, "(0.5 * noise(");
        vg_expr(P, b, want, d, o);
        vg_puts(o, "))");
      }
      return;
    }
    case 21: { /* a pull block's value, a lookup, a real input */
      if (!b->pull && !b->push && P->has_pull && vg_pct(r, 60)) {
        int c[16], nc = 0;
        for (int i = 0; i < P->pull_nval; i++)
          if (vg_weq(P->pullv[i].w, want)) c[nc++] = i;
        if (nc) {
          int i = c[vg_int(r, nc)];
          if (i == P->pull_nval - 1 && vg_pct(r, 50)) vg_puts(o, "pull()");
          else vg_printf(o, "pull(%s)", P->pullv[i].name);
          return;
        }
      }
      if (vg_pct(r, 50)) {
        /* a lookup: a table of its own, or one of that width again */
        int c[VG_MAXPARAM], nc = 0;
        for (int i = 0; i < P->nparam; i++)
          if (P->param[i].table && P->param[i].rows.c[VG_X] == 0 && !P->param[i].shape[0] &&
              vg_weq(P->param[i].cols, want))
            c[nc++] = i;
        const char *name;
        if (nc && vg_pct(r, 50)) name = P->param[c[vg_int(r, nc)]].name;
        else {
          VgParam *p = vg_newparam(P);
          memset(p, 0, sizeof *p);
          snprintf(p->name, sizeof p->name, "emb%d", P->nparam - 1);
          p->cols = want, p->matrix = true, p->table = true;
          int dd = -1;
          if (vg_wone_dim(want, &dd) && dd == VG_HH && vg_pct(r, 50)) /* word matrices (MV-RNN) */
            snprintf(p->extra, sizeof p->extra, " init identity(1, 0.1)");
          else if (vg_pct(r, 50)) snprintf(p->extra, sizeof p->extra, " init uniform(-1, 1)");
          name = p->name;
        }
        vg_input(P, 0, vg_w(0, 0, 0, 0), "word");
        vg_printf(o, "%s[word]", name);
        return;
      }
      const char *f = vg_input(P, 2, want, NULL);
      if (!f) continue;
      vg_puts(o, f);
      return;
    }
    }
  }
  (void)ws;
}

/* name = expr; in block b, the name added to its values */
static inline void vg_assign(VgProg *P, VgBlock *b, VgStr *o, const char *indent, VgW w, int depth) {
  if (b->nval >= VG_MAXVAL) return;
  VgVal *v = &b->val[b->nval];
  snprintf(v->name, sizeof v->name, "t%d", b->tmp++);
  v->w = w;
  v->family = false;
  vg_printf(o, "%s%s = ", indent, v->name);
  vg_expr(P, b, w, depth, o);
  vg_puts(o, ";\n");
  b->nval++;
}

/* a value of the block; a family's members one per child */
static inline void vg_add(VgBlock *b, const char *name, VgW w, bool family) {
  if (b->nval >= VG_MAXVAL) return;
  VgVal *v = &b->val[b->nval++];
  snprintf(v->name, sizeof v->name, "%s", name);
  v->w = w;
  v->family = family;
  v->lo = 0, v->n = b->children;
}

/* a value named in block b; in the pull block, one that pull(NAME) reads too (and
   pull(), the last) */
static inline void vg_named(VgProg *P, VgBlock *b, const char *name, VgW w) {
  vg_add(b, name, w, false);
  if (b->pull && P->pull_nval < 16) {
    VgVal *v = &P->pullv[P->pull_nval++];
    snprintf(v->name, sizeof v->name, "%s", name);
    v->w = w;
  }
}

/* ` NAME = e;` in a loop's body (on its line), NAME then a value of block b */
static inline void vg_let(VgProg *P, VgBlock *b, VgStr *o, const char *name, VgW w, int depth) {
  vg_printf(o, " %s = ", name);
  vg_expr(P, b, w, depth, o);
  vg_puts(o, ";");
  vg_add(b, name, w, false);
}

/* A loop's members name_LO..name_LO+n-1 of width w, a value of block b (name_k in a
   later loop whose range they cover, else one drawn) */
static inline void vg_family(VgBlock *b, const char *name, VgW w, int lo, int n) {
  if (b->nval >= VG_MAXVAL) return;
  vg_add(b, name, w, true);
  b->val[b->nval - 1].lo = lo, b->val[b->nval - 1].n = n;
}

/* and, in the pull block, each a value that pull(NAME) reads */
static inline void vg_pulled(VgProg *P, const VgBlock *b, const char *name, VgW w, int lo, int n) {
  for (int i = lo; b->pull && i < lo + n && P->pull_nval < 16; i++) {
    VgVal *v = &P->pullv[P->pull_nval++];
    snprintf(v->name, sizeof v->name, "%s_%d", name, i);
    v->w = w;
  }
}

/* A loop that is not over the children, in any block (vf(5): `for` is a statement):
 *   [zwN = e;]  for j in LO..HI { [lN = e;] zN_j = e'; }  [tM = sum(j in LO..HI: ...);]
 * two to four members of one width w, each its iteration's: where a row (HI+1)w wide is
 * made first, its j-th part of w (an LSTM's gates, z[j*H:(j+1)*H]) with the bounds
 * written in j three ways; j as a number; a name local to the iteration. The members
 * are then values of the block, name_j in a later loop whose range they cover; a sum
 * over j or their concat sometimes follows. The pull block's caller leaves room in
 * pullv for all of it (six names at most). */
static inline void vg_loop(VgProg *P, VgBlock *b, VgStr *o, int depth) {
  VgRng *x = &P->x;
  int lo = vg_pct(x, 25), n = 2 + vg_int(x, 3), hi = lo + n - 1, id = b->tmp++, dd;
  VgW w = *vg_pick_width(P), wide = {{0}, 0};
  for (int i = 0; i <= hi; i++) wide = vg_wadd(wide, w);
  char ws[64], src[VG_NAME] = "", nm[16];
  vg_wstr(w, ws, sizeof ws);
  if (vg_pct(x, 60)) {
    snprintf(src, sizeof src, "zw%d", id);
    vg_printf(o, "  %s = ", src);
    vg_expr(P, b, wide, depth - 1, o);
    vg_puts(o, ";\n");
    vg_named(P, b, src, wide);
  }
  int save = b->nstr, nval = b->nval;
  b->loopk = "j", b->looplo = lo, b->loophi = hi;
  vg_printf(o, "  for j in %d..%d {", lo, hi);
  if (vg_pct(x, 35)) { /* the iteration's own name: gone after it */
    snprintf(nm, sizeof nm, "l%d", id);
    vg_let(P, b, o, nm, w, depth - 1);
  }
  vg_printf(o, " z%d_j = ", id);
  bool scaled = vg_pct(x, 30);
  if (scaled) vg_puts(o, "(");
  if (src[0]) {
    char a[80];
    snprintf(a, sizeof a, vg_wone_dim(w, &dd) && vg_pct(x, 50) ? "%s" : "(%s)", ws);
    static const char *const act[] = {"", "tanh(", "sigmoid(", ""};
    int f = vg_int(x, 4);
    vg_puts(o, act[f]);
    switch (vg_int(x, 3)) {
    case 0: vg_printf(o, "%s[j*%s:(j+1)*%s]", src, a, a); break;
    case 1: vg_printf(o, "%s[%s*j:%s*(j + 1)]", src, a, a); break;
    default: vg_printf(o, "%s[j*%s:j*%s+%s]", src, a, a, ws); break;
    }
    if (act[f][0]) vg_puts(o, ")");
    if (vg_pct(x, 50)) {
      vg_puts(o, vg_pct(x, 50) ? " + " : " * ");
      vg_expr(P, b, w, depth - 2, o);
    }
  } else {
    vg_expr(P, b, w, depth - 1, o);
  }
  if (scaled) vg_puts(o, lo ? ") * j" : vg_pct(x, 50) ? ") * (j + 1)" : ") / (1 + j)");
  vg_puts(o, "; }\n");
  b->loopk = NULL, b->nstr = save, b->nval = nval;
  snprintf(nm, sizeof nm, "z%d", id);
  vg_family(b, nm, w, lo, n);
  vg_pulled(P, b, nm, w, lo, n);
  if (vg_pct(x, 50)) {
    char t[VG_NAME];
    snprintf(t, sizeof t, "t%d", b->tmp++);
    VgW tw = w;
    vg_printf(o, "  %s = ", t);
    if (vg_pct(x, 30)) {
      vg_puts(o, "concat(");
      for (int i = lo; i <= hi; i++) vg_printf(o, "%s%s_%d", i > lo ? ", " : "", nm, i);
      vg_puts(o, ")");
      tw = wide;
      for (int i = 0; i < lo; i++) tw = vg_wsub(tw, w);
    } else {
      vg_printf(o, "sum(j in %d..%d: ", lo, hi);
      b->loopk = "j", b->looplo = lo, b->loophi = hi;
      if (vg_pct(x, 50)) vg_printf(o, "%s_j", nm);
      else vg_expr(P, b, w, depth - 1, o);
      b->loopk = NULL, b->nstr = save;
      vg_puts(o, ")");
    }
    vg_puts(o, ";\n");
    vg_named(P, b, t, tw);
  }
}

/* An integer written from the outer loop's i and the inner's j, to scale a row by:
 * (i + 1), (1 + i * j), (j - i) ... (the value a constant of each iteration) */
static inline const char *vg_ij(VgRng *y) {
  static const char *const f[] = {"(i + 1)", "(j + 1)", "(1 + i * j)", "(j - i)", "(2 * i + j + 1)", "(i + j)"};
  return f[vg_int(y, 6)];
}

/* Loops nested in a loop, in any block (vf(5): a name outlives the iterations of the
 * loops it names, from the innermost out, and is local to the first it does not name):
 *   for i in LO..HI {
 *     [wN = e(i);]                          the outer iteration's own
 *     for j in RANGE {                      LO2..HI2, LO2..i, i..HI2 or i..i + 1
 *       [lN_i = e;]                         named by the outer loop only: the inner
 *                                           iteration's own
 *       aN_j = e(i) op e(j) | e(j) * (i+j); named by the inner loop: the outer
 *                                           iteration's, read after the inner loop
 *       [nN_i_j = e;]                       named by both: the block's
 *     }
 *     rN_i = sum(j in RANGE: aN_j) [op e(i)] | concat(aN_LO2, .., aN_HI2) [@ W];
 *   }
 *   [tM = sum(i in LO..HI: rN_i);]
 * e(i) reads i: gather(i) where i ranges over the children, a family's member name_i,
 * wN; e(j) likewise name_j. rN's members are then the block's (name_i in a later
 * loop), and an nN_i_j or two. The pull block's caller leaves room in pullv (eight names
 * at most), its last the last assignment, as pull() reads. */
static inline void vg_nest(VgProg *P, VgBlock *b, VgStr *o, int depth) {
  VgRng *y = &P->y;
  int id = b->tmp++, nval = b->nval, save = b->nstr;
  bool kids = b->children >= 2 && b->kuni && vg_pct(y, 50); /* i over the children */
  int lo, hi; /* two to four outer iterations */
  if (kids) {
    int n = b->children < 4 ? b->children : 4;
    lo = vg_int(y, b->children - n + 1), hi = lo + n - 1;
  } else {
    lo = vg_pct(y, 25), hi = lo + 1 + vg_int(y, 3);
  }
  int kind = vg_int(y, 4), lo2 = 0, hi2 = 0; /* the inner range: fixed, LO2..i, i..HI2, i..i + 1 */
  char range[48];
  switch (kind) {
  case 0: lo2 = vg_int(y, 2), hi2 = lo2 + 1 + vg_int(y, 2); snprintf(range, sizeof range, "%d..%d", lo2, hi2); break;
  case 1: lo2 = vg_int(y, lo + 1), hi2 = hi; snprintf(range, sizeof range, "%d..i", lo2); break;
  case 2: lo2 = lo, hi2 = hi + vg_int(y, 2); snprintf(range, sizeof range, "i..%d", hi2); break;
  default: lo2 = lo, hi2 = hi + 1; snprintf(range, sizeof range, "i..i + 1"); break;
  }
  VgW w = *vg_pick_width(P), wr = w;
  char u[16] = "", nm[16], a[16], rn[16]; /* (not u0..: a typed block's slots) */
  snprintf(a, sizeof a, "a%d", id);
  snprintf(rn, sizeof rn, "r%d", id);
  vg_printf(o, "  for i in %d..%d {\n", lo, hi);
  b->loopk = "i", b->looplo = lo, b->loophi = hi;
  if (vg_pct(y, 35)) {
    snprintf(u, sizeof u, "w%d", id);
    vg_printf(o, "    %s = ", u);
    if (kids && vg_pct(y, 50)) vg_state_row(P, o, "gather(i)", b->kidw[0], w, false);
    else vg_expr(P, b, w, depth - 1, o);
    vg_puts(o, ";\n");
    vg_add(b, u, w, false);
  }
  int isave = b->nstr, ival = b->nval;
  vg_printf(o, "    for j in %s {", range);
  b->loopk = "j", b->looplo = lo2, b->loophi = hi2;
  if (vg_pct(y, 30)) {
    snprintf(nm, sizeof nm, "l%d_i", id);
    vg_let(P, b, o, nm, w, depth - 1);
  }
  vg_printf(o, " %s_j = ", a);
  if (vg_pct(y, 55)) {
    static const char *const op[] = {" * ", " + ", " - "};
    vg_puts(o, "(");
    vg_expr(P, b, w, depth - 1, o);
    vg_puts(o, ")");
    vg_puts(o, op[vg_int(y, 3)]);
    b->loopk = "i", b->looplo = lo, b->loophi = hi;
    if (kids && vg_pct(y, 50)) vg_state_row(P, o, "gather(i)", b->kidw[0], w, true);
    else if (u[0] && vg_pct(y, 50)) vg_puts(o, u);
    else {
      vg_puts(o, "(");
      vg_expr(P, b, w, depth - 2, o);
      vg_puts(o, ")");
    }
    b->loopk = "j", b->looplo = lo2, b->loophi = hi2;
  } else {
    vg_puts(o, "(");
    vg_expr(P, b, w, depth - 1, o);
    vg_printf(o, ") %s %s", vg_pct(y, 70) ? "*" : "+", vg_ij(y));
  }
  vg_puts(o, ";");
  bool both = vg_pct(y, 40);
  VgW wn = *vg_pick_width(P);
  if (both) {
    vg_printf(o, " n%d_i_j = ", id);
    vg_expr(P, b, wn, depth - 1, o);
    vg_puts(o, ";");
  }
  vg_puts(o, " }\n");
  b->nstr = isave, b->nval = ival; /* what the inner body wrote reads j */
  /* the inner loop's members that every outer iteration has */
  int flo = kind == 0 ? lo2 : kind == 1 ? lo2 : hi, fn = kind == 0 ? hi2 - lo2 + 1 : kind == 1 ? lo - lo2 + 1 : hi2 - hi + 1;
  if (kind != 3) vg_family(b, a, w, flo, fn);
  b->loopk = "i", b->looplo = lo, b->loophi = hi;
  vg_printf(o, "    %s_i = ", rn);
  if (kind == 0 && vg_pct(y, 30)) {
    vg_puts(o, "concat(");
    for (int j = lo2; j <= hi2; j++) vg_printf(o, "%s%s_%d", j > lo2 ? ", " : "", a, j);
    vg_puts(o, ")");
    VgW cw = {{0}, 0};
    for (int j = lo2; j <= hi2; j++) cw = vg_wadd(cw, w);
    wr = cw;
    if (vg_pct(y, 60)) wr = *vg_pick_width(P), vg_printf(o, " @ %s", vg_param_for(P, cw, wr, true));
  } else {
    vg_printf(o, "sum(j in %s: %s_j)", range, a);
    if (vg_pct(y, 50)) {
      vg_puts(o, vg_pct(y, 50) ? " * " : " + ");
      vg_puts(o, "(");
      vg_expr(P, b, w, depth - 2, o);
      vg_puts(o, ")");
    }
  }
  vg_puts(o, ";\n  }\n");
  b->loopk = NULL, b->nstr = save, b->nval = nval;
  /* after the loops: rN's members, and nN_i_j of an (i, j) every range has */
  vg_family(b, rn, wr, lo, hi - lo + 1);
  if (both) {
    for (int t = vg_int(y, 3); t > 0; t--) {
      int i = lo + vg_int(y, hi - lo + 1);
      int jlo = kind == 0 ? lo2 : kind == 1 ? lo2 : i, jhi = kind == 0 ? hi2 : kind == 1 ? i : kind == 2 ? hi2 : i + 1;
      int j = jlo + vg_int(y, jhi - jlo + 1);
      char n2[VG_NAME];
      snprintf(n2, sizeof n2, "n%d_%d_%d", id, i, j);
      vg_named(P, b, n2, wn);
    }
  }
  vg_pulled(P, b, rn, wr, lo, hi - lo + 1); /* the pull block's last: rN_HI */
  if (vg_pct(y, 40)) {
    char t[VG_NAME];
    snprintf(t, sizeof t, "t%d", b->tmp++);
    vg_printf(o, "  %s = sum(i in %d..%d: %s_i);\n", t, lo, hi, rn);
    vg_named(P, b, t, wr);
  }
}

/* a mixture of experts in block b: m = moe(e in top(gate, K): ...), of width of a dim */
static inline void vg_moe(VgProg *P, VgBlock *b, VgStr *o) {
  VgRng *r = &P->r;
  /* the input: a value whose width is one dim (H or E), made if need be */
  int din = VG_H, dout = vg_pct(r, 70) ? VG_H : (P->dim_on[VG_E] ? VG_E : VG_H), dmid = P->dim_on[VG_G] ? VG_G : VG_H;
  if (P->dim_on[VG_E] && vg_pct(r, 30)) din = VG_E;
  if (b->push && vg_pct(r, 40)) dout = VG_C;
  char hin[VG_NAME];
  snprintf(hin, sizeof hin, "m_in%d", b->tmp++);
  vg_printf(o, "  %s = ", hin);
  vg_expr(P, b, vg_dimw(din), 2, o);
  vg_puts(o, ";\n");
  /* product dims: din*dout, din*dmid, dmid*dout */
  char pd[3][VG_NAME];
  int pa[3] = {din, din, dmid}, pb[3] = {dout, dmid, dout};
  for (int i = 0; i < 3; i++) {
    int j;
    for (j = 0; j < P->nprod; j++)
      if (P->prod_a[j] == pa[i] && P->prod_b[j] == pb[i]) break;
    if (j == P->nprod) {
      P->prod_a[j] = pa[i], P->prod_b[j] = pb[i];
      snprintf(P->prod[j], sizeof P->prod[j], "%s%s", vg_dimname[pa[i]], vg_dimname[pb[i]]);
      P->nprod++;
    }
    snprintf(pd[i], sizeof pd[i], "%s", P->prod[j]);
  }
  int K = 1 + vg_int(r, 2);
  P->dim_on[VG_X] = true;
  /* expert tables */
  int base = P->nparam;
  for (int i = 0; i < 5; i++) {
    VgParam *p = vg_newparam(P);
    memset(p, 0, sizeof *p);
    p->table = true, p->matrix = true;
    snprintf(p->name, sizeof p->name, "T%d", base + i);
    const char *s = i == 0 ? pd[0] : i == 1 ? pd[1] : i == 2 ? pd[2] : vg_dimname[i == 3 ? dmid : dout];
    snprintf(p->shape, sizeof p->shape, "X,%s", s);
    snprintf(p->extra, sizeof p->extra, " init uniform(-1, 1)");
  }
  const char *T0 = P->param[base].name, *T1 = P->param[base + 1].name, *T2 = P->param[base + 2].name,
             *B1 = P->param[base + 3].name, *B2 = P->param[base + 4].name;
  VgStr g = {0};
  b->in_moe = true;
  vg_expr(P, b, vg_dimw(VG_X), 2, &g);
  b->in_moe = false;
  const char *gate = g.p;
  const char *top3 = "";
  if (vg_pct(r, 30)) top3 = ", 0";
  else if (vg_pct(r, 15)) {
    P->balance = true;
    if (vg_pct(r, 50)) top3 = ", balance", P->opt_balance = true, P->balance_dflt = "0.5"; /* read at run time */
    else top3 = ", 0.5";
  }
  /* the option more often, its default 0 too: a weight of 0, which batching cannot
     change, so that the serial checks run on a model that reads the option */
  if (!P->balance && vg_pct(&P->x, 40)) {
    static const char *const dflt[] = {"0.5", "1", "0"};
    top3 = ", balance", P->opt_balance = true, P->balance_dflt = dflt[vg_int(&P->x, 3)];
    P->balance = strcmp(P->balance_dflt, "0") != 0;
  }
  vg_printf(o, "  m%d = moe(e in top(%s, %d%s): ", b->tmp, gate, K, top3);
  switch (vg_int(r, 5)) {
  case 0: vg_printf(o, "%s @ %s[e]", hin, T0); break;
  case 1: vg_printf(o, "tanh(%s @ %s[e] + %s[e]) @ %s[e] + %s[e]", hin, T1, B1, T2, B2); break;
  case 2: vg_printf(o, "relu(%s @ %s[e]) @ %s[e]", hin, T1, T2); break;
  case 3: vg_printf(o, "sigmoid(%s @ %s[e]) * %s[e]", hin, T0, B2); break;
  default:
    vg_printf(o, "%s @ %s[e] + %s @ %s", hin, T0, hin, vg_param_for(P, vg_dimw(din), vg_dimw(dout), true));
    break;
  }
  vg_puts(o, ");\n");
  free(g.p);
  char nm[VG_NAME];
  snprintf(nm, sizeof nm, "m%d", b->tmp++);
  vg_add(b, nm, vg_dimw(dout), false);
}

/* An expression whose width the compiler can tell without the state's: one of the
 * children's rows alone (g_0 + g_0) cannot say what the state is (cavsc: "cannot tell
 * the width of the state"); a product or a slice somewhere in it does. */
static inline void vg_known(VgProg *P, VgBlock *b, VgW want, int depth, VgStr *o) {
  VgStr s = {0};
  vg_expr(P, b, want, depth, &s);
  /* known for sure: (... @ W), the last operator at the top a product */
  bool known = false;
  size_t n = strlen(s.p);
  if (n > 2 && s.p[0] == '(' && s.p[n - 1] == ')') {
    int dep = 0;
    char last = 0;
    bool whole = true;
    for (size_t i = 0; i < n; i++) {
      char c = s.p[i];
      if (c == '(' || c == '[') dep++;
      else if (c == ')' || c == ']') {
        dep--;
        if (dep == 0 && i + 1 < n) whole = false;
      } else if (dep == 1 && strchr("+-*/@", c)) last = c;
    }
    known = whole && last == '@';
  }
  if (known) vg_puts(o, s.p);
  else vg_printf(o, "(%s) @ %s", s.p, vg_param_for(P, want, want, true));
  free(s.p);
}

/* Writes program number `seed` into *out (malloc'd text). */
static inline char *vg_program_flags(uint64_t seed, bool *balance) {
  VgProg *P = calloc(1, sizeof *P);
  VgRng *r = &P->r;
  r->s = seed * 0x2545f4914f6cdd1dull + 17;
  P->x.s = seed * 0x9e3779b97f4a7c15ull + 1501;
  P->y.s = seed * 0xd1b54a32d192ed03ull + 3101;
  P->z.s = seed * 0x94d049bb133111ebull + 3501;
  P->w.s = seed * 0xbf58476d1ce4e5b9ull + 4001;
  vg_wstyle = vg_pct(r, 70) ? 0 : 1 + vg_int(r, 2);
  P->dim_on[VG_H] = true;
  P->dim_on[VG_E] = vg_pct(r, 50);
  P->dim_on[VG_G] = vg_pct(r, 25);
  P->dim_on[VG_C] = true;
  bool softmax = vg_pct(r, 75), mse = !softmax || vg_pct(r, 25);
  if (vg_pct(r, 12)) { /* matrices per vertex */
    P->dim_on[VG_HH] = true;
    P->prod_a[0] = VG_H, P->prod_b[0] = VG_H;
    snprintf(P->prod[0], sizeof P->prod[0], "HH");
    P->nprod = 1;
  }
  int depth = 2 + vg_int(r, 3);
  /* the state: parts concatenated */
  P->nparts = 1 + vg_int(r, 3);
  VgW st = {{0}, 0};
  for (int i = 0; i < P->nparts; i++) {
    VgW w = *vg_pick_width(P);
    if (i == 0 && vg_pct(r, 70)) w = vg_w(1, 0, 0, 0);
    P->parts[i] = w;
    st = vg_wadd(st, w);
  }
  P->state = st;
  P->pushw = *vg_pick_width(P);
  /* blocks: one or two vertex types */
  int ntypes = vg_pct(r, 30) ? 2 : 1;
  bool set = vg_pct(r, 20);
  /* typed: the blocks name their children's types, in slots (two types) or of a set
     (children *: T; one type, a set of itself, or two) */
  P->typed = ntypes == 2 ? vg_pct(r, set ? 60 : 35) : set && vg_pct(r, 40);
  int kids[2] = {0, 0}, settype[2] = {-1, -1}, slottype[2][VG_MAXKIDS] = {{0}};
  bool sets[2] = {set, false};
  kids[0] = set ? 0 : 1 + vg_int(r, 3);
  if (set && P->typed && vg_pct(r, 30)) kids[0] = 1 + vg_int(r, 2); /* slots, then the set */
  /* many children: 4 to 8 numbered or in slots, 3 to 6 slots before a set */
  if (!set && vg_pct(&P->x, 15)) kids[0] = 4 + vg_int(&P->x, 5);
  if (set && kids[0] && vg_pct(&P->x, 30)) kids[0] = 3 + vg_int(&P->x, 4);
  if (ntypes == 2) {
    kids[1] = kids[0], sets[1] = sets[0];
    if (vg_pct(r, 60)) kids[0] = 0, sets[0] = false; /* a leaf type */
  }
  /* each slot's and set's type; the width each type scatters: with types, each its own,
     and a type that no slot or set names may scatter nothing */
  VgW tstate[2] = {P->state, P->state};
  bool named[2] = {false, false}, scatters[2] = {true, true};
  if (P->typed) {
    for (int t = 0; t < ntypes; t++) {
      for (int k = 0; k < kids[t]; k++) named[slottype[t][k] = vg_int(r, ntypes)] = true;
      if (sets[t]) named[settype[t] = vg_int(r, ntypes)] = true;
    }
    if (ntypes == 2 && vg_pct(r, 50)) {
      tstate[1] = *vg_pick_width(P);
      if (vg_pct(r, 40)) tstate[1] = vg_wadd(tstate[1], *vg_pick_width(P));
    }
    for (int t = 0; t < ntypes; t++)
      if (!named[t] && vg_pct(r, 50)) scatters[t] = false;
  }
  int moe_at = vg_pct(r, 15) ? vg_int(r, ntypes + 1) : -1; /* ntypes: the push block */
  if (moe_at < 0 && vg_pct(&P->x, 8)) moe_at = vg_int(&P->x, ntypes + 1);
  if (moe_at >= 0 && moe_at < ntypes && sets[moe_at]) moe_at = ntypes;
  P->tiefree = !softmax && moe_at < 0;
  bool pull = vg_pct(r, 75);
  /* a type whose state is the pull block's last value, a lookup as it is (scatter(pull())
     or x = pull(); scatter(x)), and a product over the children's rows of that type side
     by side (concat(gather(0), .., gather(S-1)) @ W, or gather(0) @ W) in another's
     scatter or in its own push (cavsc's cavs_gemm_kids): tpull, tprod, or -1 */
  int tpull = -1, tprod = -1;
  if (pull && vg_pct(&P->z, 14)) {
    int leaf = -1;
    for (int t = 0; t < ntypes; t++)
      if (scatters[t] && (tpull < 0 || (!kids[t] && !sets[t] && leaf < 0))) {
        tpull = t;
        if (!kids[t] && !sets[t]) leaf = t;
      }
    if (tpull >= 0 && ntypes == 2 && leaf < 0 && scatters[0] && scatters[1]) tpull = vg_int(&P->z, 2);
    /* a type whose slot 0 holds the table type's states (typed: is that type) */
    for (int t = 0; tpull >= 0 && t < ntypes; t++)
      if (kids[t] && (P->typed ? slottype[t][0] == tpull : true) && (tprod < 0 || t != tpull)) tprod = t;
    if (tprod < 0) tpull = -1;
  }

  VgStr *o = &P->body;
  /* the pull block */
  if (pull) {
    VgBlock *b = calloc(1, sizeof *b);
    b->pull = true;
    vg_puts(o, "pull {\n");
    int n = 1 + vg_int(r, 3);
    for (int i = 0; i < n && P->pull_nval < 16; i++) {
      VgW w = *vg_pick_width(P);
      VgVal *v = &P->pullv[P->pull_nval++];
      snprintf(v->name, sizeof v->name, "x%d", i);
      v->w = w;
      vg_printf(o, "  %s = ", v->name);
      if (i == 0 || vg_pct(r, 40)) {
        /* a lookup to start with, as a model does */
        int save = b->nval;
        b->nval = 0;
        VgStr s = {0};
        VgParam *p = vg_newparam(P);
        memset(p, 0, sizeof *p);
        snprintf(p->name, sizeof p->name, "emb%d", P->nparam - 1);
        p->cols = w, p->matrix = true, p->table = true;
        vg_input(P, 0, vg_w(0, 0, 0, 0), "word");
        vg_printf(&s, "%s[word]", p->name);
        if (vg_pct(r, 40)) vg_printf(o, "tanh(%s)", s.p);
        else vg_puts(o, s.p);
        free(s.p);
        b->nval = save;
      } else {
        vg_expr(P, b, w, depth - 1, o);
      }
      vg_puts(o, ";\n");
      vg_add(b, v->name, w, false);
    }
    if (P->pull_nval + 6 <= 16 && vg_pct(&P->x, 25)) vg_loop(P, b, o, depth);
    if (P->pull_nval + 7 <= 16 && vg_pct(&P->y, 15)) vg_nest(P, b, o, depth);
    if (tpull >= 0 && P->pull_nval < 16) { /* the last value: a lookup, nothing around it */
      VgW w = tstate[tpull];
      int c[VG_MAXPARAM], nc = 0;
      for (int i = 0; i < P->nparam; i++)
        if (P->param[i].table && !P->param[i].shape[0] && vg_weq(P->param[i].cols, w)) c[nc++] = i;
      const char *name;
      if (nc && vg_pct(&P->z, 40)) name = P->param[c[vg_int(&P->z, nc)]].name; /* a table read twice */
      else {
        VgParam *p = vg_newparam(P);
        memset(p, 0, sizeof *p);
        snprintf(p->name, sizeof p->name, "emb%d", P->nparam - 1);
        p->cols = w, p->matrix = true, p->table = true;
        if (vg_pct(&P->z, 50)) snprintf(p->extra, sizeof p->extra, " init uniform(-1, 1)");
        name = p->name;
      }
      vg_input(P, 0, vg_w(0, 0, 0, 0), "word");
      VgVal *v = &P->pullv[P->pull_nval++];
      snprintf(v->name, sizeof v->name, "x%d", n);
      v->w = w;
      vg_printf(o, "  %s = %s[word];\n", v->name, name);
    } else tpull = tprod = -1;
    vg_puts(o, "}\n\n");
    P->has_pull = true;
    free(b);
  }
  /* the vertex blocks */
  static const char *const tname[2] = {"node", "inner"};
  bool pushes[2] = {true, ntypes == 2 ? vg_pct(r, 70) : true};
  if (ntypes == 2 && !pushes[1]) pushes[0] = true;
  if (ntypes == 2 && kids[0] == 0 && !sets[0] && vg_pct(r, 40)) pushes[0] = false, pushes[1] = true;
  for (int t = 0; t < ntypes; t++)
    if (!scatters[t]) pushes[t] = true; /* a block that only pushes */
  if (tprod >= 0 && tprod == tpull) pushes[tprod] = true; /* the product in its push */
  for (int t = 0; t < ntypes; t++) {
    VgBlock *b = calloc(1, sizeof *b);
    b->children = kids[t];
    b->set = sets[t];
    b->setw = settype[t] >= 0 ? tstate[settype[t]] : P->state;
    b->kuni = true;
    for (int k = 0; k < kids[t]; k++) {
      b->kidw[k] = P->typed ? tstate[slottype[t][k]] : P->state;
      b->kuni &= vg_weq(b->kidw[k], b->kidw[0]);
    }
    VgW own = tstate[t];
    const char *nm = P->typed ? (t ? "b" : "a") : ntypes == 2 ? (kids[t] == 0 && !sets[t] ? "leaf" : tname[t]) : "node";
    for (int k = 0; k < VG_MAXKIDS; k++) snprintf(P->slot[t][k], sizeof P->slot[t][k], "%c%d", t ? 'v' : 'u', k);
    if (P->typed && (kids[t] > 0 || sets[t])) {
      vg_printf(o, "vertex %s (children ", nm);
      for (int k = 0; k < kids[t]; k++)
        vg_printf(o, "%s%s: %s", k ? ", " : "", P->slot[t][k], slottype[t][k] ? "b" : "a");
      if (sets[t]) vg_printf(o, "%s*: %s", kids[t] ? ", " : "", settype[t] ? "b" : "a");
      vg_puts(o, ") {\n");
    } else if (sets[t]) vg_printf(o, "vertex %s (children *) {\n", nm);
    else vg_printf(o, "vertex %s (children %d) {\n", nm, kids[t]);
    bool px = false; /* x = pull(); */
    if (P->has_pull && vg_pct(r, 50)) {
      vg_puts(o, "  x = pull();\n");
      vg_add(b, "x", P->pullv[P->pull_nval - 1].w, false);
      px = true;
    }
    if (kids[t] > 0) {
      /* the children's rows: parts by a loop, or gathered one by one */
      int style = vg_int(r, 4);
      if (!b->kuni || (style == 0 && !vg_weq(b->kidw[0], P->state))) style = 1;
      if (style == 0) {
        vg_printf(o, "  for k in 0..%d { s = gather(k);", kids[t] - 1);
        VgW at = {{0}, 0};
        for (int i = 0; i < P->nparts; i++) {
          char l[64], h[64], n2[16];
          vg_wstr(at, l, sizeof l);
          vg_wstr(vg_wadd(at, P->parts[i]), h, sizeof h);
          snprintf(n2, sizeof n2, "p%d", i);
          if (P->nparts == 1) vg_printf(o, " %s_k = s;", n2);
          else vg_printf(o, " %s_k = s[%s:%s];", n2, l, h);
          vg_add(b, n2, P->parts[i], true);
          at = vg_wadd(at, P->parts[i]);
        }
        vg_puts(o, " }\n");
      } else if (style == 1) {
        for (int k = 0; k < kids[t]; k++) {
          if (P->typed && vg_pct(r, 60)) vg_printf(o, "  c%d = gather(%s);\n", k, P->slot[t][k]);
          else vg_printf(o, "  c%d = gather(%d);\n", k, k);
          char n2[16];
          snprintf(n2, sizeof n2, "c%d", k);
          vg_add(b, n2, b->kidw[k], false);
        }
      } else if (style == 2) {
        vg_printf(o, "  for k in 0..%d { g_k = gather(k); }\n", kids[t] - 1);
        vg_add(b, "g", b->kidw[0], true);
      } else { /* the children in the other order: an integer expression */
        vg_printf(o, "  for k in 0..%d { g_k = gather(%d - k); }\n", kids[t] - 1, kids[t] - 1);
        vg_add(b, "g", b->kidw[0], true);
      }
      /* a loop that computes per child */
      if (vg_pct(r, 40)) {
        VgW w = *vg_pick_width(P);
        vg_printf(o, "  for k in 0..%d { q_k = ", kids[t] - 1);
        b->loopk = "k", b->looplo = 0, b->loophi = kids[t] - 1;
        int save = b->nstr;
        vg_expr(P, b, w, depth - 1, o);
        b->loopk = NULL;
        b->nstr = save;
        vg_puts(o, "; }\n");
        vg_add(b, "q", w, true);
      }
    }
    /* the product over the children holding words (tprod), named here, inline or not,
       and where it goes: t's scatter, or its push where t scatters pull() or nothing */
    VgStr kp = {0};
    bool kpush = false;
    if (t == tprod) {
      kpush = t == tpull || !scatters[t];
      VgW cw = b->kidw[0], outw = kpush ? P->pushw : own;
      if (b->kuni && kids[t] > 1 && vg_pct(&P->z, 65)) {
        vg_puts(&kp, "concat(");
        for (int k = 0; k < kids[t]; k++) vg_printf(&kp, "%sgather(%d)", k ? ", " : "", k);
        vg_puts(&kp, ")");
        for (int k = 1; k < kids[t]; k++) cw = vg_wadd(cw, b->kidw[k]);
      } else vg_puts(&kp, "gather(0)");
      vg_printf(&kp, " @ %s", vg_param_for(P, cw, outw, true));
      if (vg_pct(&P->z, 40)) { /* a value of the block: others may read it too */
        char nm2[16];
        snprintf(nm2, sizeof nm2, "kw%d", b->tmp++);
        vg_printf(o, "  %s = %s;\n", nm2, kp.p);
        vg_add(b, nm2, outw, false);
        kp.n = 0, vg_puts(&kp, nm2);
      }
    }
    int n = 1 + vg_int(r, 4);
    if (vg_pct(&P->x, 15)) vg_loop(P, b, o, depth);
    if (vg_pct(&P->y, 12)) vg_nest(P, b, o, depth);
    for (int i = 0; i < n; i++) {
      VgW w = *vg_pick_width(P);
      if (vg_pct(r, 30)) w = own;
      vg_assign(P, b, o, "  ", w, depth);
    }
    if (moe_at == t) vg_moe(P, b, o);
    if (t == tpull) vg_puts(o, px && vg_pct(&P->z, 60) ? "  scatter(x);\n" : "  scatter(pull());\n");
    else if (t == tprod && !kpush) {
      vg_printf(o, "  scatter(%s", vg_pct(&P->z, 50) ? "tanh(" : "sigmoid(");
      vg_known(P, b, own, depth - 1, o); /* (the state's width told where the product's is not) */
      vg_printf(o, " + %s));\n", kp.p);
    } else if (scatters[t]) {
      vg_puts(o, "  scatter(");
      if ((kids[t] || sets[t]) && vg_pct(r, 50)) {
        /* the children's rows in it for sure */
        vg_puts(o, vg_pct(r, 50) ? "tanh(" : "sigmoid(");
        vg_known(P, b, own, depth - 1, o);
        if (sets[t] && (!kids[t] || vg_pct(r, 50)))
          vg_printf(o, " + sum(s in children: s @ %s))", vg_param_for(P, b->setw, own, true));
        else if (b->kuni && vg_pct(r, 50))
          vg_printf(o, " + sum(k in 0..%d: gather(k) @ %s))", kids[t] - 1, vg_param_for(P, b->kidw[0], own, true));
        else {
          vg_puts(o, " + concat(");
          VgW cw = {{0}, 0};
          for (int k = 0; k < kids[t]; k++) {
            if (P->typed && vg_pct(r, 50)) vg_printf(o, "%sgather(%s)", k ? ", " : "", P->slot[t][k]);
            else vg_printf(o, "%sgather(%d)", k ? ", " : "", k);
            cw = vg_wadd(cw, b->kidw[k]);
          }
          vg_printf(o, ") @ %s)", vg_param_for(P, cw, own, true));
        }
      } else {
        vg_known(P, b, own, depth, o);
      }
      vg_puts(o, ");\n");
    }
    if (pushes[t] && t == tprod && kpush) {
      vg_puts(o, "  push(");
      vg_known(P, b, P->pushw, depth - 1, o);
      vg_printf(o, " + %s);\n", kp.p);
    } else if (pushes[t]) {
      vg_puts(o, "  push(");
      vg_known(P, b, P->pushw, depth - 1, o);
      vg_puts(o, ");\n");
    }
    free(kp.p);
    vg_puts(o, "}\n\n");
    free(b);
  }
  /* the push block */
  {
    VgBlock *b = calloc(1, sizeof *b);
    b->push = true;
    vg_puts(o, "push (h) {\n");
    vg_add(b, "h", P->pushw, false);
    int n = vg_int(r, 3);
    if (vg_pct(&P->x, 20)) vg_loop(P, b, o, depth - 1);
    if (vg_pct(&P->y, 15)) vg_nest(P, b, o, depth - 1);
    for (int i = 0; i < n; i++) vg_assign(P, b, o, "  ", *vg_pick_width(P), depth - 1);
    if (moe_at == ntypes) vg_moe(P, b, o);
    if (softmax) {
      vg_input(P, 1, vg_dimw(VG_C), "y");
      vg_puts(o, "  loss softmax_xent(");
      /* (h read by the loss: the vertex blocks' backward passes run, which cavsc leaves
         out where no loss reaches them; a loss of inputs alone is drawn as often) */
      vg_loss_expr(P, b, vg_dimw(VG_C), depth - 1, o);
      vg_puts(o, ", y);\n");
    }
    if (mse && vg_pct(r, 30)) { /* two computed rows (a consistency loss: both get gradients) */
      VgW w = vg_pct(r, 30) ? P->pushw : *vg_pick_width(P);
      vg_puts(o, "  loss mse(");
      vg_expr(P, b, w, depth - 1, o);
      vg_puts(o, ", ");
      vg_expr(P, b, w, depth - 1, o);
      vg_puts(o, ");\n");
    } else if (mse) {
      VgW w = *vg_pick_width(P);
      if (vg_pct(r, 30)) w = P->pushw;
      /* an input target, second or (as mse(t, h)) first */
      bool first = vg_pct(r, 30);
      const char *t = vg_input(P, 2, w, "t");
      if (!t) t = vg_input(P, 2, w, NULL);
      for (int i = 0; !t && i < P->ninput; i++)
        if (P->input[i].kind == 2) t = P->input[i].name, w = P->input[i].w;
      if (!t) w = vg_w(1, 0, 0, 0), t = vg_input(P, 2, w, "t");
      if (!t) abort(); /* never: the budget always allows one of H */
      vg_puts(o, "  loss mse(");
      if (first) vg_printf(o, "%s, ", t);
      vg_loss_expr(P, b, w, depth - 1, o);
      vg_printf(o, first ? ");\n" : ", %s);\n", t);
    }
    vg_puts(o, "}\n");
    free(b);
  }
  /* the head: model, dims, options, inputs, params */
  VgStr *hd = &P->head;
  if (vg_pct(r, 30)) vg_printf(hd, "# random program %llu (tests/vfgen.h)\n", (unsigned long long)seed);
  vg_printf(hd, "model rnd%llu;\n", (unsigned long long)seed);
  bool has_word = false;
  for (int i = 0; i < P->ninput; i++) has_word |= P->input[i].kind == 0;
  /* declared dims: the ones any width names */
  vg_puts(hd, "dim H = 3;");
  if (P->dim_on[VG_E]) vg_puts(hd, " dim E = 2;");
  if (P->dim_on[VG_G]) vg_puts(hd, vg_pct(r, 30) ? " dim G;" : " dim G = 4;"); /* bound at run time */
  vg_puts(hd, " dim C = 3;");
  if (P->dim_on[VG_X]) vg_puts(hd, " dim X = 3;");
  for (int i = 0; i < P->nprod; i++)
    vg_printf(hd, " dim %s = %s * %s;", P->prod[i], vg_dimname[P->prod_a[i]], vg_dimname[P->prod_b[i]]);
  if (has_word) vg_puts(hd, vg_pct(r, 50) ? " dim V = vocab(word);" : " dim V = 5;");
  vg_puts(hd, "\n");
  if (P->opt_drop) vg_puts(hd, "option drop = 0.25;\n");
  if (P->opt_balance) vg_printf(hd, "option balance = %s;\n", P->balance_dflt);
  if (vg_pct(r, 10)) vg_puts(hd, "option clip = 5;\n"); /* training's clip: nothing here */
  for (int i = 0; i < P->ninput; i++) {
    char w[64];
    vg_wstr(P->input[i].w, w, sizeof w);
    const VgInput *in = &P->input[i];
    if (in->kind == 0) vg_printf(hd, "input %s : index[V];\n", in->name);
    else if (in->kind == 1) vg_printf(hd, "input %s : class[C];\n", in->name);
    else vg_printf(hd, "input %s : real[%s];\n", in->name, w);
  }
  /* each param an item and an init clause; items of one clause (or of a constant of their
     own) sometimes declared together: param a[H], b[H] = 0.5 init zeros; */
  char init_of[2][48] = {"", ""}; /* the declaration's clause; whether one is open */
  for (int i = 0; i < P->nparam; i++) {
    const VgParam *p = &P->param[i];
    char a[64], c[64], item[200], init[48] = "";
    vg_wstr(p->rows, a, sizeof a);
    vg_wstr(p->cols, c, sizeof c);
    bool own = false; /* an item's = N, which no clause changes */
    /* a matrix or a table as constants, where no tie can follow the rounding (the clause,
       or the item's own = N: in an item, the whole) */
    static const char *const ci[] = {" init zeros", " init constant(0.3)", " init constant(-0.2)", " = 0.5"};
    int cm = P->tiefree && !p->shape[0] && (p->matrix || p->table) && vg_pct(&P->x, 30) ? vg_int(&P->x, 4) : -1;
    if (p->shape[0]) snprintf(item, sizeof item, "%s[%s]", p->name, p->shape), snprintf(init, sizeof init, "%s", p->extra);
    else if (p->table) snprintf(item, sizeof item, "%s[V,%s]", p->name, c), snprintf(init, sizeof init, "%s", p->extra);
    else if (p->matrix) {
      static const char *const mi[] = {"", "", " init uniform(-1, 1)", " init normal(0, 0.5)", " init xavier",
                                       " init uniform(-0.5, 1)", " init normal(0.1, 1)", " init identity(1, 0.1)"};
      /* (a constant only where tiefree: vg_param_for) */
      int k = vg_int(r, 8);
      if (k == 7 && !vg_weq(p->rows, p->cols)) k = 4;
      snprintf(item, sizeof item, "%s[%s,%s]", p->name, a, c);
      snprintf(init, sizeof init, "%s", mi[k]);
    } else {
      static const char *const vi[] = {"", "", "", "", " init zeros", " init constant(0.2)", " init normal(0, 0.5)"};
      snprintf(item, sizeof item, "%s[%s]%s", p->name, c, p->extra);
      own = p->extra[0];
      if (!own) snprintf(init, sizeof init, "%s", vi[vg_int(r, 7)]);
      /* negative bounds and constants too */
      if (!own && vg_pct(&P->x, 15))
        snprintf(init, sizeof init, "%s", vg_pct(&P->x, 50) ? " init constant(-0.3)" : " init uniform(-0.5, 0.5)");
    }
    if (cm == 3) strcat(item, ci[3]), own = true;
    else if (cm >= 0) snprintf(init, sizeof init, "%s", ci[cm]);
    /* with the declaration open before it, where its clause is the same */
    if (init_of[1][0] && (own || !strcmp(init, init_of[0])) && vg_pct(r, 40)) {
      vg_printf(hd, ", %s", item);
      continue;
    }
    if (init_of[1][0]) vg_printf(hd, "%s;\n", init_of[0]);
    vg_printf(hd, "param %s", item);
    if (own) init[0] = 0;
    snprintf(init_of[0], sizeof init_of[0], "%s", init);
    init_of[1][0] = 1;
  }
  if (init_of[1][0]) vg_printf(hd, "%s;\n", init_of[0]);
  vg_puts(hd, "\n");
  vg_puts(hd, P->body.p);
  char *text = hd->p;
  if (balance) *balance = P->balance;
  free(P->body.p);
  free(P);
  return text;
}

#endif

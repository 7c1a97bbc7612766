/* sema.c: names, shapes and compile-time loops. Walks the AST once per block, unrolls
 * `for` and `sum(k in ..)`, checks every shape symbolically (widths are linear forms over
 * the dims, so the result holds for any binding), and builds the typed IR as it goes.
 *
 * The width of the state a vertex scatters is not written down by the user: gather(k)
 * reads it before the scatter defines it. A silent trial pass over the vertex blocks,
 * with gather's width unknown (TOP, compatible with everything), infers it first. When
 * the blocks name their children's types (`children prev: cell, word: chars`), each
 * type scatters a width of its own: trial passes, repeated while they learn a type's
 * width, give gather(prev) the width of what `cell` scatters. */
#include "cavsc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- a chained hash table from names to small records ---- */

typedef struct Entry Entry;
struct Entry {
  const char *key;
  int kind; /* Sym or, in scopes, unused */
  int index; /* global: index in its kind's array; scope: IR node */
  int depth; /* scope: loop nesting where it was defined */
  Loc loc;
  Entry *next;
};

typedef struct Table {
  Entry **b;
  int nb, n;
  Entry **order; /* insertion order, for pull slots and undo */
  int norder, caporder;
} Table;

static unsigned hash(const char *s) {
  unsigned h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

static Entry *tab_get(Table *t, const char *key) {
  if (!t->nb) return NULL;
  for (Entry *e = t->b[hash(key) & (unsigned)(t->nb - 1)]; e; e = e->next)
    if (!strcmp(e->key, key)) return e;
  return NULL;
}

static Entry *tab_put(Table *t, const char *key) {
  if (t->n * 2 >= t->nb) {
    int nb = t->nb ? t->nb * 2 : 64;
    Entry **b = xcalloc((size_t)nb, sizeof(Entry *));
    for (int i = 0; i < t->nb; i++)
      for (Entry *e = t->b[i], *next; e; e = next) {
        next = e->next;
        unsigned h = hash(e->key) & (unsigned)(nb - 1);
        e->next = b[h];
        b[h] = e;
      }
    free(t->b);
    t->b = b;
    t->nb = nb;
  }
  Entry *e = arena_alloc(sizeof(Entry));
  e->key = key;
  unsigned h = hash(key) & (unsigned)(t->nb - 1);
  e->next = t->b[h];
  t->b[h] = e;
  t->n++;
  t->order = vec_grow(t->order, &t->caporder, t->norder + 1, sizeof(Entry *));
  t->order[t->norder++] = e;
  return e;
}

static void tab_del(Table *t, Entry *x) {
  Entry **p = &t->b[hash(x->key) & (unsigned)(t->nb - 1)];
  while (*p != x) p = &(*p)->next;
  *p = x->next;
  t->n--;
}

static void tab_free(Table *t) {
  free(t->b);
  free(t->order);
  memset(t, 0, sizeof *t);
}

/* ---- context ---- */

enum { SYM_MODEL, SYM_DIM, SYM_OPTION, SYM_INPUT, SYM_PARAM, SYM_VERTEX };
static const char *sym_what[] = {"the model", "a dim", "an option", "an input", "a param", "a vertex block"};

typedef struct LoopVar {
  const char *name;
  long value;
} LoopVar;

typedef struct Ctx {
  Model *m;
  Decl *decls;
  long unrolled; /* statements and terms produced by loops in this block */
  Table globals;
  /* current block */
  IrFunc *f;
  Table scope;
  LoopVar loops[CV_MAX_NEST + 1];
  int nloops;
  int *param_node, *input_node; /* per-function caches of reference nodes */
  int scatter;
  Loc scatter_loc;
  int push;
  Loc push_loc;
  bool has_loss;
  Stmt *rest; /* statements after the current one, to tell "used before definition" */
  int *cse;   /* open-addressing table of node ids, for common subexpressions */
  int ncse, capcse;
  /* model-wide */
  bool state_known, pushed_known;
  /* typed (Model.typed): per vertex block, its slots' names and types, what it
     scatters (TOP until known) */
  const char ***vslot_name;
  int **vslot_type;
  Loc **vslot_loc;
  Lin *tstate;
  int cur_vi; /* the vertex block `block` runs */
  bool *vedges;   /* per vertex block: `children *` */
  int *vedge_type; /* its children's type (typed), else -1 */
  /* inside sum(s in children: e): s and the echild node it names */
  const char *edge_var;
  int edge_node;
  /* inside moe(e in top(g, K): body): e, and where the block's moe is */
  const char *moe_var;
  Loc moe_loc;
  Loc pushed_loc;
  const char *pushed_by;
} Ctx;

static const Lin TOP = {.k = INT32_MIN}; /* width not known yet (trial pass only) */
static bool is_top(Lin a) { return a.k == INT32_MIN; }

static const char *wstr(Ctx *c, Lin a) {
  if (is_top(a)) return "?";
  char buf[256];
  return arena_strdup(lin_str(c->m, a, buf, sizeof buf));
}

/* Quotes the source of an expression when it is short, else describes it by kind. */
static const char *what(const Node *n) {
  const char *s = diag_span(n->loc);
  return s ? arena_printf("'%s'", s) : "the expression";
}

/* Widths agree when equal, or when either is still unknown. */
static bool unify(Lin a, Lin b, Lin *out) {
  if (is_top(a)) *out = b;
  else if (is_top(b) || lin_eq(a, b)) *out = a;
  else return false;
  return true;
}

/* ---- IR construction ---- */

static unsigned node_hash(const IrNode *n) {
  unsigned h = 2166136261u;
#define MIX(v) h = (h ^ (unsigned)(v)) * 16777619u
  MIX(n->op);
  MIX(n->ref);
  MIX(n->nargs);
  for (int i = 0; i < n->nargs; i++) MIX(n->args[i]);
  uint64_t bits;
  memcpy(&bits, &n->cval, sizeof bits);
  MIX(bits);
  MIX(bits >> 32);
  MIX(n->lo.k);
  MIX(n->hi.k);
#undef MIX
  return h;
}

static bool node_same(const IrNode *a, const IrNode *b) {
  if (a->op != b->op || a->ref != b->ref || a->nargs != b->nargs || a->type != b->type ||
      !lin_eq(a->width, b->width) || !lin_eq(a->lo, b->lo) || !lin_eq(a->hi, b->hi) ||
      memcmp(&a->cval, &b->cval, sizeof a->cval))
    return false;
  for (int i = 0; i < a->nargs; i++)
    if (a->args[i] != b->args[i]) return false;
  return true;
}

/* Adds a node, or returns the existing node that computes the same value: `x @ Wf`
 * written once per forget gate is computed once. Statements (scatter, push, loss) are
 * never merged. */
static int add_node(Ctx *c, IrNode n) {
  /* (a dropout or a noise is a draw of its own at each call: `noise(a) + noise(a)` is two
     draws, not one twice) */
  bool pure = n.type != T_NONE && op_info[n.op].kind != OK_DROP;
  /* an op on an edge value reads every vertex row it takes on each edge (a lookup or a
     pull written inside sum(s in children: ...)) */
  bool on_edges = false;
  for (int j = 0; j < n.nargs && n.op != OP_ESUM && n.op != OP_EBCAST; j++)
    on_edges = on_edges || (n.args[j] >= 0 && c->f->nodes[n.args[j]].edge);
  for (int j = 0; on_edges && j < n.nargs; j++) {
    int a = n.args[j];
    if (a < 0 || c->f->nodes[a].type != T_ROW || c->f->nodes[a].edge) continue;
    int *one = arena_alloc(sizeof(int));
    one[0] = a;
    n.args[j] = add_node(c, (IrNode){.op = OP_EBCAST, .type = T_ROW, .width = c->f->nodes[a].width, .nargs = 1,
                                     .args = one, .loc = c->f->nodes[a].loc});
    if (n.args[j] < 0) return -1;
  }
  /* an op on a slot value (or an expert's product) reads every row it takes on each of
     the row's slots */
  bool on_slots = n.op == OP_EMM;
  for (int j = 0; j < n.nargs && n.op != OP_SCOMB && n.op != OP_SBCAST; j++)
    on_slots = on_slots || (n.args[j] >= 0 && c->f->nodes[n.args[j]].slot);
  for (int j = 0; on_slots && j < n.nargs; j++) {
    int a = n.args[j];
    if (a < 0 || c->f->nodes[a].type != T_ROW || c->f->nodes[a].slot) continue;
    int *one = arena_alloc(sizeof(int));
    one[0] = a;
    n.args[j] = add_node(c, (IrNode){.op = OP_SBCAST, .type = T_ROW, .width = c->f->nodes[a].width, .nargs = 1,
                                     .args = one, .loc = c->f->nodes[a].loc});
    if (n.args[j] < 0) return -1;
  }
  n.slot = n.op == OP_SBCAST || n.op == OP_EMM || n.op == OP_EROW;
  for (int j = 0; j < n.nargs && n.op != OP_SCOMB; j++)
    n.slot = n.slot || (n.args[j] >= 0 && c->f->nodes[n.args[j]].slot);
  /* per edge: echild, ebcast, and what reads an edge value but the sum over edges */
  n.edge = n.op == OP_ECHILD || n.op == OP_EBCAST;
  for (int j = 0; j < n.nargs && n.op != OP_ESUM && n.op != OP_EBCAST; j++)
    n.edge = n.edge || (n.args[j] >= 0 && c->f->nodes[n.args[j]].edge);
  if (pure && c->ncse * 2 >= c->capcse) {
    int cap = c->capcse ? c->capcse * 2 : 256;
    int *t = xmalloc(sizeof(int) * (size_t)cap);
    for (int i = 0; i < cap; i++) t[i] = -1;
    for (int i = 0; i < c->capcse; i++) {
      if (c->cse[i] < 0) continue;
      unsigned h = node_hash(&c->f->nodes[c->cse[i]]) & (unsigned)(cap - 1);
      while (t[h] >= 0) h = (h + 1) & (unsigned)(cap - 1);
      t[h] = c->cse[i];
    }
    free(c->cse);
    c->cse = t;
    c->capcse = cap;
  }
  unsigned h = 0;
  if (pure) {
    h = node_hash(&n) & (unsigned)(c->capcse - 1);
    for (; c->cse[h] >= 0; h = (h + 1) & (unsigned)(c->capcse - 1))
      if (node_same(&c->f->nodes[c->cse[h]], &n)) return c->cse[h];
  }
  int id = ir_add(c->f, n);
  if (pure && id >= 0) {
    c->cse[h] = id;
    c->ncse++;
  }
  return id;
}

static int mk(Ctx *c, Op op, Type type, Lin width, Loc loc, int nargs, const int *args) {
  IrNode n = {.op = op, .type = type, .width = width, .nargs = nargs, .loc = loc};
  if (nargs) {
    n.args = arena_alloc(sizeof(int) * (size_t)nargs);
    memcpy(n.args, args, sizeof(int) * (size_t)nargs);
  }
  return add_node(c, n);
}

/* Nodes whose identity depends on a field set after mk() go through here instead. */
static int mk_with(Ctx *c, IrNode n) { return add_node(c, n); }

static IrNode *node(Ctx *c, int id) { return &c->f->nodes[id]; }

static int mk_const(Ctx *c, double v, Loc loc) {
  return mk_with(c, (IrNode){.op = OP_CONST, .type = T_SCALAR, .cval = v, .loc = loc});
}

static int ref_param(Ctx *c, int p, Loc loc) {
  if (c->param_node[p] < 0) {
    int id = mk_with(c, (IrNode){.op = OP_PARAM, .type = T_PARAM, .ref = p, .loc = loc,
                                 .name = c->m->params[p].name});
    if (id < 0) return -1;
    c->param_node[p] = id;
  }
  return c->param_node[p];
}

static int ref_input(Ctx *c, int i, Loc loc) {
  if (c->input_node[i] < 0) {
    Input *in = &c->m->inputs[i];
    Type t = in->kind == IN_REAL ? T_ROW : T_INPUT;
    int id = mk_with(c, (IrNode){.op = OP_INPUT, .type = t, .ref = i, .loc = loc, .name = in->name,
                                 .width = in->kind == IN_REAL ? in->width : lin_const(0)});
    if (id < 0) return -1;
    c->input_node[i] = id;
  }
  return c->input_node[i];
}

/* ---- compile-time integers and dim expressions ---- */

static LoopVar *loop_var(Ctx *c, const char *name) {
  for (int i = c->nloops - 1; i >= 0; i--)
    if (!strcmp(c->loops[i].name, name)) return &c->loops[i];
  return NULL;
}

static bool eval_int(Ctx *c, const Node *n, long *out) {
  long a, b;
  switch (n->kind) {
  case N_NUM:
    if (!n->is_int) break;
    *out = n->ival;
    return true;
  case N_NAME: {
    LoopVar *v = loop_var(c, n->name);
    if (!v) break;
    *out = v->value;
    return true;
  }
  case N_NEG:
    if (!eval_int(c, n->a, &a)) return false;
    *out = -a;
    return true;
  case N_BINARY:
    if (n->op == '/' || n->op == '@') break;
    if (!eval_int(c, n->a, &a) || !eval_int(c, n->b, &b)) return false;
    *out = n->op == '+' ? a + b : n->op == '-' ? a - b : a * b;
    if (labs(*out) > 1000000000L) {
      error_at(n->loc, "integer constant too large");
      return false;
    }
    return true;
  default: break;
  }
  error_at(n->loc, "expected an integer constant, found %s", what(n));
  return false;
}

/* Whether n is an integer constant expression: integers and the enclosing loops'
 * variables with + - * and parentheses, no dim among them (what eval_int takes). */
static bool is_intexpr(Ctx *c, const Node *n) {
  switch (n->kind) {
  case N_NUM: return n->is_int;
  case N_NAME: return loop_var(c, n->name) != NULL;
  case N_NEG: return is_intexpr(c, n->a);
  case N_BINARY: return (n->op == '+' || n->op == '-' || n->op == '*') && is_intexpr(c, n->a) && is_intexpr(c, n->b);
  default: return false;
  }
}

/* Keeps coefficients far from int32 overflow (a width of 2^24 floats is already 64 MB
 * a row). */
static bool lin_in_range(Ctx *c, const Node *n, Lin l) {
  bool ok = labs((long)l.k) <= (1L << 24);
  for (int i = 0; i < CV_MAX_DIMS; i++) ok = ok && labs((long)l.c[i]) <= (1L << 24);
  if (!ok) error_at(n->loc, "dim expression %s is too large", what(n));
  return ok;
}

/* A dim expression: a linear form over the declared dims. The caller decides whether
 * it must be positive (shapes) or only non-negative (slice bounds). */
static bool eval_lin(Ctx *c, const Node *n, Lin *out) {
  Lin a, b;
  long k;
  switch (n->kind) {
  case N_NUM:
    if (!n->is_int) {
      error_at(n->loc, "dim expression must be an integer combination of dims, not %g", n->num);
      return false;
    }
    *out = lin_const(n->ival);
    return lin_in_range(c, n, *out);
  case N_DIMTERM:
  case N_NAME: {
    if (n->kind == N_NAME) {
      LoopVar *v = loop_var(c, n->name);
      if (v) {
        *out = lin_const(v->value);
        return true;
      }
    }
    Entry *e = tab_get(&c->globals, n->name);
    if (!e) {
      for (Decl *d = c->decls; d; d = d->next)
        if (d->kind == D_DIM && !strcmp(d->name, n->name)) {
          error_at(n->loc, "dim '%s' is used before its declaration", n->name);
          note_at(d->name_loc, "'%s' is declared here", n->name);
          return false;
        }
      error_at(n->loc, "unknown dim '%s'", n->name);
      return false;
    }
    if (e->kind != SYM_DIM) {
      error_at(n->loc, "'%s' is %s, not a dim", n->name, sym_what[e->kind]);
      return false;
    }
    *out = lin_dim(e->index, n->kind == N_DIMTERM ? n->ival : 1);
    return lin_in_range(c, n, *out);
  }
  case N_NEG:
    if (!eval_lin(c, n->a, &a)) return false;
    *out = lin_sub(lin_const(0), a);
    return true;
  case N_BINARY:
    if (n->op == '+' || n->op == '-') {
      if (!eval_lin(c, n->a, &a) || !eval_lin(c, n->b, &b)) return false;
      if (!lin_in_range(c, n->a, a) || !lin_in_range(c, n->b, b)) return false;
      *out = n->op == '+' ? lin_add(a, b) : lin_sub(a, b);
      return lin_in_range(c, n, *out);
    }
    if (n->op == '*') {
      /* one side must be an integer constant expression (vf(5)'s intexpr: (k+1)*H, the
         end of a loop's k-th slice, as well as 2*H and k*H) */
      const Node *kn = n->a, *ln = n->b;
      if (!is_intexpr(c, kn) && kn->kind != N_NUM) {
        kn = n->b;
        ln = n->a;
      }
      if (!is_intexpr(c, kn) && kn->kind != N_NUM) { /* (2.5*H: eval_int says why) */
        error_at(n->loc, "dim expression is not linear: only an integer may multiply a dim");
        return false;
      }
      if (!eval_int(c, kn, &k) || !eval_lin(c, ln, &a)) return false;
      /* the product too: 65536 * 65537H is not 65536H (int32 keeps the low bits) */
      bool big = labs(k) > (1L << 24) || !lin_in_range(c, ln, a) || labs(a.k * k) > (1L << 24);
      for (int i = 0; i < CV_MAX_DIMS; i++) big = big || labs(a.c[i] * k) > (1L << 24);
      if (big) {
        error_at(n->loc, "dim expression %s is too large", what(n));
        return false;
      }
      Lin r = lin_const(0);
      r.k = (int32_t)(a.k * k);
      for (int i = 0; i < CV_MAX_DIMS; i++) r.c[i] = (int32_t)(a.c[i] * k);
      *out = r;
      return true;
    }
    error_at(n->loc, "'%c' is not allowed in a dim expression (only +, - and integer *)", n->op);
    return false;
  default:
    error_at(n->loc, "expected a dim expression, found %s", what(n));
    return false;
  }
}

/* Shapes of params and inputs: a positive integer combination of dims. */
static bool eval_shape(Ctx *c, const Node *n, Lin *out) {
  if (!eval_lin(c, n, out)) return false;
  bool ok = !lin_is_zero(*out) && out->k >= 0;
  for (int i = 0; i < CV_MAX_DIMS; i++) ok = ok && out->c[i] >= 0;
  if (!ok) {
    error_at(n->loc, "shape %s is [%s], not a positive integer combination of dims", what(n),
             wstr(c, *out));
    return false;
  }
  return true;
}

/* A literal number, possibly negated (initializer arguments). */
static bool eval_number(Ctx *c, const Node *n, double *out) {
  (void)c;
  if (n->kind == N_NUM) {
    *out = n->num;
    return true;
  }
  if (n->kind == N_NEG && n->a->kind == N_NUM) {
    *out = -n->a->num;
    return true;
  }
  error_at(n->loc, "expected a number, found %s", what(n));
  return false;
}

/* ---- names in blocks ---- */

/* Inside `for k`, every `_k` component of a name is replaced by the iteration's value:
 * `h_k` -> `h_0`. Returns NULL when no component is a loop variable. *depth (where not
 * NULL) is the number of enclosing loops whose iteration the name is local to: a name
 * outlives the iterations of the loops it names from the innermost out, and stays local
 * to the first it does not name (`a_j` in `for k { for j { } }` is k's iteration's). */
static const char *loop_rename(Ctx *c, const char *name, int *depth) {
  if (!c->nloops || !strchr(name, '_')) return NULL;
  char buf[512];
  size_t len = 0;
  bool changed = false, named[CV_MAX_NEST + 1] = {false};
  const char *p = name;
  const char *us = strchr(p, '_');
  len = (size_t)(us - p);
  if (len >= sizeof buf) return NULL;
  memcpy(buf, p, len);
  p = us;
  while (*p == '_') {
    const char *start = p + 1;
    const char *end = strchr(start, '_');
    if (!end) end = start + strlen(start);
    char comp[256];
    size_t cl = (size_t)(end - start);
    if (cl >= sizeof comp) return NULL;
    memcpy(comp, start, cl);
    comp[cl] = 0;
    LoopVar *v = cl ? loop_var(c, comp) : NULL;
    int w = v ? snprintf(buf + len, sizeof buf - len, "_%ld", v->value)
              : snprintf(buf + len, sizeof buf - len, "_%s", comp);
    if (w < 0 || (size_t)w >= sizeof buf - len) return NULL;
    len += (size_t)w;
    changed |= v != NULL;
    if (v) named[v - c->loops] = true;
    p = end;
  }
  if (depth) {
    *depth = c->nloops;
    while (*depth > 0 && named[*depth - 1]) --*depth;
  }
  return changed ? arena_strdup(buf) : NULL;
}

static bool assigned_later(const Stmt *s, const char *name) {
  for (; s; s = s->next) {
    if (s->kind == S_ASSIGN && !strcmp(s->name, name)) return true;
    if (s->kind == S_FOR && assigned_later(s->body, name)) return true;
  }
  return false;
}

static int eval(Ctx *c, const Node *n);

/* Inside sum(s in children: e), s names the child's row; a row of the vertex that e
 * combines with it is read on each edge (add_node puts the ebcast in). */
static int eval_name(Ctx *c, const Node *n) {
  if (c->edge_var && !strcmp(n->name, c->edge_var) && !loop_var(c, n->name)) return c->edge_node;
  if (c->moe_var && !strcmp(n->name, c->moe_var) && !loop_var(c, n->name)) {
    error_at(n->loc, "'%s' names a row's expert: it only picks an expert's part of a param table, "
             "as %s @ W[%s] or b[%s]", n->name, "x", n->name, n->name);
    return -1;
  }
  LoopVar *v = loop_var(c, n->name);
  if (v) return mk_const(c, (double)v->value, n->loc);
  const char *renamed = loop_rename(c, n->name, NULL);
  Entry *e = tab_get(&c->scope, renamed ? renamed : n->name);
  if (e) return e->index;
  e = tab_get(&c->globals, n->name);
  if (e) {
    switch (e->kind) {
    case SYM_PARAM: return ref_param(c, e->index, n->loc);
    case SYM_INPUT: return ref_input(c, e->index, n->loc);
    case SYM_OPTION:
      error_at(n->loc, "'%s' is an option, set at run time: it can only be dropout's probability, dropout(ROW, %s)",
               n->name, n->name);
      return -1;
    default:
      error_at(n->loc, "'%s' is %s, not a value", n->name, sym_what[e->kind]);
      return -1;
    }
  }
  if (assigned_later(c->rest, n->name))
    error_at(n->loc, "'%s' is used before its definition", n->name);
  else
    error_at(n->loc, "unknown name '%s'", renamed ? renamed : n->name);
  /* Bind it to an error value so that later uses stay quiet. */
  Entry *x = tab_put(&c->scope, renamed ? renamed : n->name);
  x->index = -1;
  x->depth = -1; /* never reported as a redefinition */
  x->loc = n->loc;
  return -1;
}

static const char *op_spelling(int op) {
  switch (op) {
  case '+': return "+";
  case '-': return "-";
  case '*': return "*";
  case '/': return "/";
  default: return "@";
  }
}

/* An elementwise op on constants: the FOLD column of ops.def. */
static double fold(Op op, double a, double b) {
  cv_assert(op_info[op].kind == OK_EW);
  switch (op) {
#define X(id, sp, ar, kind, zero, value, f, da, db) \
  case OP_##id: return value;
#include "ops.def"
#undef X
  default: unreachable();
  }
}

/* Names the kind of an operand in a message; the caller quotes the name itself. */
static const char *describe(Ctx *c, int id) {
  IrNode *x = node(c, id);
  if (x->type == T_PARAM) {
    Param *p = &c->m->params[x->ref];
    if (p->rank == 2) return arena_printf("a param matrix [%s,%s]", wstr(c, p->rows), wstr(c, p->cols));
    return arena_printf("a param vector [%s]", wstr(c, p->cols));
  }
  if (x->type == T_INPUT)
    return c->m->inputs[x->ref].kind == IN_INDEX ? "an index input" : "a class input";
  if (x->type == T_SCALAR) return "a scalar";
  return arena_printf("a row [%s]", wstr(c, x->width));
}

/* Elementwise binary op with broadcasting of param vectors and scalars. */
static int elementwise2(Ctx *c, Op op, int a, int b, const Node *n, const Node *na, const Node *nb) {
  if (a < 0 || b < 0) return -1;
  IrNode *x = node(c, a), *y = node(c, b);
  if (x->type == T_SCALAR && y->type == T_SCALAR)
    return mk_const(c, fold(op, x->cval, y->cval), n->loc);
  const char *sp = op_spelling(n->op);
  Lin w = TOP;
  bool have_row = false, one = false;
  const IrNode *ops[2] = {x, y};
  const Node *srcs[2] = {na, nb};
  for (int i = 0; i < 2; i++) {
    const IrNode *o = ops[i];
    if (o->type == T_INPUT) {
      if (c->m->inputs[o->ref].kind == IN_INDEX)
        error_at(srcs[i]->loc, "%s is an index input: it selects rows (e.g. emb[%s]) and is not a value",
                 what(srcs[i]), c->m->inputs[o->ref].name);
      else
        error_at(srcs[i]->loc, "%s is a class input: it is a loss target (softmax_xent) and not a value",
                 what(srcs[i]));
      return -1;
    }
    if (o->type == T_PARAM && c->m->params[o->ref].rank == 2) {
      error_at(srcs[i]->loc, "%s is %s; only '@' takes a matrix", what(srcs[i]),
               describe(c, (int)(o - c->f->nodes)));
      return -1;
    }
  }
  for (int i = 0; i < 2; i++) {
    const IrNode *o = ops[i];
    Lin ow = o->type == T_ROW ? o->width : o->type == T_PARAM ? c->m->params[o->ref].cols : TOP;
    if (o->type == T_ROW) have_row = true;
    if (o->type == T_SCALAR) continue;
    /* a row of width 1 (a score) is broadcast over the other operand's columns */
    if (o->type == T_ROW && lin_eq(ow, lin_const(1))) {
      one = true;
      continue;
    }
    Lin u;
    if (!unify(w, ow, &u)) {
      error_at(n->loc, "shape mismatch in '%s': %s is [%s] but %s is [%s]", sp, what(na),
               wstr(c, w), what(nb), wstr(c, ow));
      return -1;
    }
    w = u;
  }
  if (!have_row) {
    error_at(n->loc, "'%s' needs a per-vertex operand: %s and %s are both parameters or constants",
             sp, what(na), what(nb));
    return -1;
  }
  if (one && is_top(w) && (x->type != T_ROW || !is_top(x->width)) && (y->type != T_ROW || !is_top(y->width)))
    w = lin_const(1);
  int args[2] = {a, b};
  return mk(c, op, T_ROW, w, n->loc, 2, args);
}

static int matmul(Ctx *c, int a, int b, const Node *n) {
  if (a < 0 || b < 0) return -1;
  IrNode *x = node(c, a), *w = node(c, b);
  if (w->type != T_PARAM || c->m->params[w->ref].rank != 2) {
    error_at(n->b->loc, "right operand of '@' must be a param matrix, but %s is %s", what(n->b),
             describe(c, b));
    return -1;
  }
  if (x->type != T_ROW) {
    error_at(n->a->loc, "left operand of '@' must be a per-vertex row, but %s is %s", what(n->a),
             describe(c, a));
    return -1;
  }
  Param *p = &c->m->params[w->ref];
  Lin u;
  if (!unify(x->width, p->rows, &u)) {
    error_at(n->loc, "shape mismatch in '@': %s is [%s] but '%s' is [%s,%s] (expects [%s])",
             what(n->a), wstr(c, x->width), p->name, wstr(c, p->rows), wstr(c, p->cols),
             wstr(c, p->rows));
    return -1;
  }
  int args[2] = {a, b};
  return mk(c, OP_MATMUL, T_ROW, p->cols, n->loc, 2, args);
}

static int require_row(Ctx *c, int id, const Node *n, const char *ctx);

/* Is n `T[e]`, e the expert variable of the moe being read? */
static bool expert_index(Ctx *c, const Node *n) {
  return n->kind == N_INDEX && c->moe_var && n->b->kind == N_NAME && !strcmp(n->b->name, c->moe_var) &&
         !loop_var(c, n->b->name);
}

/* The param table T of `T[e]`, whose rows are the experts: its index, or -1 (reported). */
static int expert_table(Ctx *c, const Node *n) {
  int t = eval(c, n->a);
  if (t < 0) return -1;
  IrNode *x = node(c, t);
  if (x->type != T_PARAM || c->m->params[x->ref].rank != 2) {
    error_at(n->a->loc, "'%s[%s]' needs a param table with a row per expert, but %s is %s",
             diag_span(n->a->loc) ? diag_span(n->a->loc) : "T", n->b->name, what(n->a), describe(c, t));
    return -1;
  }
  Param *p = &c->m->params[x->ref];
  Lin gw = node(c, c->f->route)->width;
  if (!is_top(gw) && !lin_eq(p->rows, gw)) {
    error_at(n->loc, "'%s' has [%s] rows, but the gate routes among [%s] experts: a table of experts has a row each",
             p->name, wstr(c, p->rows), wstr(c, gw));
    return -1;
  }
  return t;
}

/* x @ T[e]: the slot's row times its expert's matrix, row e of T [X, A * B] read as [A, B] */
static int expert_matmul(Ctx *c, const Node *n) {
  int a = eval(c, n->a), t = expert_table(c, n->b);
  if (a < 0 || t < 0) return -1;
  IrNode *x = node(c, a);
  const Param *p = &c->m->params[node(c, t)->ref];
  if (x->type != T_ROW) {
    error_at(n->a->loc, "left operand of '@' must be a per-vertex row, but %s is %s", what(n->a), describe(c, a));
    return -1;
  }
  int d = ir_product_dim(c->m, p->cols);
  if (d < 0) {
    error_at(n->b->loc, "'%s' holds a vector per expert ([%s] columns): an expert's matrix [A, B] is a row of "
             "a table [X, P] with 'dim P = A * B;'", p->name, wstr(c, p->cols));
    return -1;
  }
  const Dim *pd = &c->m->dims[d];
  Lin u;
  if (!unify(x->width, lin_dim(pd->fa, 1), &u)) {
    error_at(n->loc, "shape mismatch in '@': %s is [%s] but each expert's matrix in '%s' is [%s,%s]", what(n->a),
             wstr(c, x->width), p->name, c->m->dims[pd->fa].name, c->m->dims[pd->fb].name);
    return -1;
  }
  /* xavier for a table of experts' matrices: each [A, B] its own */
  if (p->init == INIT_XAVIER) c->m->params[node(c, t)->ref].init = INIT_XAVIER_ROWS;
  int args[2] = {a, t};
  return mk(c, OP_EMM, T_ROW, lin_dim(pd->fb, 1), n->loc, 2, args);
}

/* moe(e in top(g, K): body): each row routed to the K experts of largest gate g (the
 * lower index first among equals), body evaluated at each of its K slots with e the
 * slot's expert, the K results weighted by the softmax of their gate values and summed */
static int eval_moe(Ctx *c, const Node *n) {
  const Node *top = n->a;
  if (top->kind != N_CALL || strcmp(top->name, "top") || top->nargs < 2 || top->nargs > 3) {
    error_at(top->loc, "moe routes each row by 'top(GATE, K)' or 'top(GATE, K, BALANCE)': the K experts of largest GATE");
    return -1;
  }
  if (c->f->kind == F_PULL) {
    error_at(n->loc, "a mixture of experts in the pull block: write it in a vertex block or the push block");
    return -1;
  }
  if (c->f->edges) {
    error_at(n->loc, "a mixture of experts in a vertex block whose children are a set ('children *')");
    return -1;
  }
  if (c->moe_var || c->edge_var) {
    error_at(n->loc, "moe inside %s", c->moe_var ? "another moe" : "a sum over children");
    return -1;
  }
  if (c->f->route >= 0) {
    error_at(n->loc, "a second moe in one block: a block routes its rows once");
    note_at(c->moe_loc, "the first is here");
    return -1;
  }
  int g = require_row(c, eval(c, top->args[0]), top->args[0], "top");
  if (c->f->route >= 0) { /* the gate held a moe of its own: it took the block's one routing */
    error_at(c->moe_loc, "moe inside another moe's gate: a block routes its rows once");
    note_at(n->loc, "the outer moe is here");
    return -1;
  }
  long k;
  if (!eval_int(c, top->args[1], &k) || g < 0) return -1;
  Lin gw = node(c, g)->width;
  if (k < 1 || k > CV_MAX_CHILDREN || (!is_top(gw) && lin_is_const(gw) && k > gw.k)) {
    error_at(top->args[1]->loc, "top(GATE, %ld): K must be between 1 and %s", k,
             !is_top(gw) && lin_is_const(gw) && gw.k < CV_MAX_CHILDREN ? arena_printf("%d, the gate's width", gw.k)
                                                                       : arena_printf("%d", CV_MAX_CHILDREN));
    return -1;
  }
  /* the load-balancing loss's weight: a number, or the option `balance` */
  int bal;
  const Node *bn = top->nargs > 2 ? top->args[2] : NULL;
  Entry *oe = bn && bn->kind == N_NAME && !loop_var(c, bn->name) && !tab_get(&c->scope, bn->name)
                  ? tab_get(&c->globals, bn->name) : NULL;
  if (oe && oe->kind == SYM_OPTION) {
    if (c->m->options[oe->index].kind != OPT_BALANCE) {
      error_at(bn->loc, "'%s' is %s, not a load-balancing loss's weight (the option named 'balance' is one)", bn->name,
               c->m->options[oe->index].kind == OPT_CLIP ? "the model's gradient-norm clip" : "a dropout probability");
      return -1;
    }
    bal = mk_with(c, (IrNode){.op = OP_CONST, .type = T_SCALAR, .cval = c->m->options[oe->index].value,
                              .ref = oe->index + 1, .loc = bn->loc});
  } else {
    bal = bn ? eval(c, bn) : mk_const(c, 0, top->loc);
    if (bal < 0) return -1;
    if (node(c, bal)->op != OP_CONST || !(node(c, bal)->cval >= 0 && node(c, bal)->cval <= CV_MAX_CLIP)) {
      error_at(bn->loc, "top()'s load-balancing weight must be a number, 0 or more, or the option 'balance'");
      return -1;
    }
  }
  int *ga = arena_alloc(sizeof(int) * 2);
  ga[0] = g;
  ga[1] = bal;
  int route = mk_with(c, (IrNode){.op = OP_TOPK, .type = T_ROW, .width = gw, .ref = (int)k, .nargs = 2, .args = ga,
                                  .loc = top->loc});
  if (route < 0) return -1;
  c->f->route = route;
  c->f->route_k = (int)k;
  c->moe_loc = n->loc;
  c->moe_var = n->name;
  int t = require_row(c, eval(c, n->c), n->c, "moe");
  c->moe_var = NULL;
  if (t < 0) return -1;
  if (!node(c, t)->slot) { /* the same row at every slot: the weights sum to 1 */
    int *a = arena_alloc(sizeof(int));
    a[0] = t;
    t = mk_with(c, (IrNode){.op = OP_SBCAST, .type = T_ROW, .width = node(c, t)->width, .nargs = 1, .args = a,
                            .loc = n->loc});
    if (t < 0) return -1;
  }
  int args[2] = {t, route};
  return mk(c, OP_SCOMB, T_ROW, node(c, t)->width, n->loc, 2, args);
}

static int unary(Ctx *c, Op op, int a, const Node *n, const Node *na) {
  if (a < 0) return -1;
  IrNode *x = node(c, a);
  if (x->type == T_SCALAR) return mk_const(c, fold(op, x->cval, 0), n->loc);
  if (x->type != T_ROW) {
    error_at(na->loc, "'%s' takes a per-vertex row, but %s is %s", op_info[op].name, what(na),
             describe(c, a));
    return -1;
  }
  return mk(c, op, T_ROW, x->width, n->loc, 1, &a);
}

static int require_row(Ctx *c, int id, const Node *n, const char *ctx) {
  if (id < 0) return -1;
  if (node(c, id)->type != T_ROW) {
    error_at(n->loc, "%s takes a per-vertex row, but %s is %s", ctx, what(n), describe(c, id));
    return -1;
  }
  return id;
}

/* sum(s in children: e): e at every edge of the vertex, s the child's state row, a row
 * of the vertex read on each of its edges; summed over the edges (zero at a vertex
 * without children). */
static int eval_sum_children(Ctx *c, const Node *n) {
  if (c->f->kind != F_VERTEX || !c->f->edges) {
    error_at(n->loc, "sum(%s in children: ...) needs a vertex block with 'children *'", n->name);
    return -1;
  }
  if (c->edge_var) {
    error_at(n->loc, "sum over children inside another one");
    return -1;
  }
  Lin w = c->state_known ? c->m->state : TOP;
  if (c->m->typed) w = c->tstate[c->f->edge_type];
  int child = mk_with(c, (IrNode){.op = OP_ECHILD, .type = T_ROW, .width = w, .loc = n->loc, .name = n->name});
  if (child < 0) return -1;
  c->edge_var = n->name;
  c->edge_node = child;
  int t = require_row(c, eval(c, n->c), n->c, "sum over children");
  c->edge_var = NULL;
  if (t < 0) return -1;
  if (!node(c, t)->edge) { /* the same row on every edge: summed, its count of children times */
    int *a = arena_alloc(sizeof(int));
    a[0] = t;
    t = mk_with(c, (IrNode){.op = OP_EBCAST, .type = T_ROW, .width = node(c, t)->width, .nargs = 1, .args = a,
                            .loc = n->loc});
    if (t < 0) return -1;
  }
  int *args = arena_alloc(sizeof(int));
  args[0] = t;
  return mk_with(c, (IrNode){.op = OP_ESUM, .type = T_ROW, .width = node(c, t)->width, .nargs = 1, .args = args,
                             .loc = n->loc});
}

static int eval_sumfor(Ctx *c, const Node *n) {
  long lo, hi;
  if (!eval_int(c, n->a, &lo) || !eval_int(c, n->b, &hi)) return -1;
  if (hi < lo) {
    error_at(n->loc, "empty range %ld..%ld in sum", lo, hi);
    return -1;
  }
  if (hi - lo >= CV_MAX_UNROLL) {
    error_at(n->loc, "range %ld..%ld too long to unroll (at most %d)", lo, hi, CV_MAX_UNROLL);
    return -1;
  }
  if (c->nloops >= CV_MAX_NEST) {
    error_at(n->loc, "loops nested too deeply");
    return -1;
  }
  int acc = -1;
  bool bad = false;
  for (long k = lo; k <= hi; k++) {
    if (++c->unrolled > CV_MAX_UNROLLED) {
      error_at(n->loc, "loops unroll to more than %d statements and terms in all", CV_MAX_UNROLLED);
      return -1;
    }
    c->loops[c->nloops++] = (LoopVar){n->name, k};
    int t = eval(c, n->c);
    c->nloops--;
    if (t < 0) bad = true;
    if (bad) continue;
    if (acc < 0) acc = require_row(c, t, n->c, "sum");
    else acc = elementwise2(c, OP_ADD, acc, t, n, n->c, n->c);
    if (acc < 0) bad = true;
  }
  return bad ? -1 : acc;
}

/* concat(a, b, ...): the rows side by side, their width in range. */
static int eval_concat(Ctx *c, const Node *n) {
  if (n->nargs < 1) {
    error_at(n->loc, "'concat' needs at least one argument");
    return -1;
  }
  int *args = arena_alloc(sizeof(int) * (size_t)n->nargs);
  Lin w = lin_const(0);
  bool bad = false;
  for (int i = 0; i < n->nargs; i++) {
    args[i] = require_row(c, eval(c, n->args[i]), n->args[i], "concat");
    if (args[i] < 0) {
      bad = true;
      continue;
    }
    Lin aw = node(c, args[i])->width;
    w = is_top(w) || is_top(aw) ? TOP : lin_add(w, aw);
    /* every width stays in range, so that the sums the passes make of them do too */
    bool big = !is_top(w) && labs((long)w.k) > (1L << 24);
    for (int j = 0; !is_top(w) && j < CV_MAX_DIMS; j++) big = big || labs((long)w.c[j]) > (1L << 24);
    if (big) {
      error_at(n->loc, "concat() is too wide: its arguments add up to more than %ld of a dim", 1L << 24);
      return -1;
    }
  }
  if (bad) return -1;
  return mk(c, OP_CONCAT, T_ROW, w, n->loc, n->nargs, args);
}

/* sum(a, b, ...): the rows added, as a + b + ... */
static int eval_sum(Ctx *c, const Node *n) {
  if (n->nargs < 1) {
    error_at(n->loc, "'sum' needs at least one argument");
    return -1;
  }
  int acc = require_row(c, eval(c, n->args[0]), n->args[0], "sum");
  for (int i = 1; i < n->nargs; i++) {
    int t = eval(c, n->args[i]);
    if (acc < 0 || t < 0) {
      acc = -1;
      continue;
    }
    Node tmp = *n;
    tmp.op = '+';
    acc = elementwise2(c, OP_ADD, acc, t, &tmp, n->args[0], n->args[i]);
  }
  return acc;
}

/* gather(K) or gather(SLOT): a vertex's child's state. */
static int eval_gather(Ctx *c, const Node *n) {
  if (c->edge_var) {
    error_at(n->loc, "gather() inside sum(%s in children: ...): the child there is '%s'", c->edge_var, c->edge_var);
    return -1;
  }
  if (c->f->kind == F_VERTEX && c->f->edges && c->f->children == 0) {
    error_at(n->loc, "vertex '%s' takes its children as a set ('children *'): read them with sum(s in children: ...)",
             c->f->name);
    return -1;
  }
  if (c->f->kind != F_VERTEX) {
    error_at(n->loc, "gather() is only allowed in a vertex block");
    return -1;
  }
  if (n->nargs != 1) {
    error_at(n->loc, "'gather' takes 1 argument (the child), given %d", n->nargs);
    return -1;
  }
  long k = -1;
  const Node *arg = n->args[0];
  for (int s = 0; arg->kind == N_NAME && c->f->slot_name && s < c->f->children; s++)
    if (!strcmp(c->f->slot_name[s], arg->name)) k = s;
  if (k < 0 && c->f->slot_name && arg->kind == N_NAME && !tab_get(&c->scope, arg->name) &&
      !tab_get(&c->globals, arg->name) && !loop_var(c, arg->name)) {
    error_at(arg->loc, "vertex '%s' has no child slot '%s'", c->f->name, arg->name);
    return -1;
  }
  if (k < 0 && !eval_int(c, arg, &k)) return -1;
  if (k < 0 || k >= c->f->children) {
    if (c->f->children == 0)
      error_at(n->loc, "gather(%ld) in vertex '%s', which has no children", k, c->f->name);
    else
      error_at(n->loc, "gather(%ld) but vertex '%s' has children %d (valid: 0..%d)", k,
               c->f->name, c->f->children, c->f->children - 1);
    return -1;
  }
  Lin w = c->state_known ? c->m->state : TOP;
  /* (a slot of a type that never scatters, or scatters a width not known, is an
     error of its own: sema_run) */
  if (c->m->typed) w = c->tstate[c->f->slot_type[k]];
  return mk_with(c, (IrNode){.op = OP_GATHER, .type = T_ROW, .ref = (int)k, .loc = n->loc, .width = w});
}

/* dropout(x, P): P a number in [0, 1) or an option, read at run time. */
static int eval_dropout(Ctx *c, const Node *n) {
  if (n->nargs != 2) {
    error_at(n->loc, "'dropout' takes 2 arguments (a row and the probability of dropping), given %d", n->nargs);
    return -1;
  }
  if (c->edge_var) {
    error_at(n->loc, "dropout() inside sum(%s in children: ...): drop the sum, or a value before it", c->edge_var);
    return -1;
  }
  int a = require_row(c, eval(c, n->args[0]), n->args[0], "dropout");
  /* a named option: a constant the generated code reads at run time (cavs_ctx.opt),
     its default the value the passes see */
  const Node *pn = n->args[1];
  Entry *oe = pn->kind == N_NAME && !loop_var(c, pn->name) && !tab_get(&c->scope, pn->name)
                  ? tab_get(&c->globals, pn->name) : NULL;
  if (pn->kind == N_NAME && !oe && !loop_var(c, pn->name) && !tab_get(&c->scope, pn->name) &&
      !tab_get(&c->scope, loop_rename(c, pn->name, NULL) ? loop_rename(c, pn->name, NULL) : pn->name)) {
    error_at(pn->loc, "unknown option '%s' (declare it at the top: option %s = P;)", pn->name, pn->name);
    return -1;
  }
  if (oe && oe->kind == SYM_OPTION && c->m->options[oe->index].kind != OPT_DROPOUT) {
    error_at(pn->loc, "'%s' is %s, not a dropout probability", pn->name,
             c->m->options[oe->index].kind == OPT_CLIP ? "the model's gradient-norm clip" : "a load-balancing loss's weight");
    return -1;
  }
  int p = oe && oe->kind == SYM_OPTION
              ? mk_with(c, (IrNode){.op = OP_CONST, .type = T_SCALAR, .cval = c->m->options[oe->index].value,
                                    .ref = oe->index + 1, .loc = pn->loc})
              : eval(c, pn);
  if (a < 0 || p < 0) return -1;
  if (node(c, p)->op != OP_CONST || !(node(c, p)->cval >= 0 && node(c, p)->cval < 1)) {
    error_at(n->args[1]->loc, "dropout's probability must be a number in [0, 1)");
    return -1;
  }
  int args[2] = {a, p};
  return mk(c, OP_DROPOUT, T_ROW, node(c, a)->width, n->loc, 2, args);
}

/* noise(x): x times standard normal draws in training (Shazeer et al.'s noisy gate:
   g = h @ Wg + noise(softplus(h @ Wn))), 0 in inference. Its draws are keyed by vertex
   row as dropout's masks are: not over edges, nor inside a moe. */
static int eval_noise(Ctx *c, const Node *n) {
  if (n->nargs != 1) {
    error_at(n->loc, "'noise' takes 1 argument (a row, the draws' scale), given %d", n->nargs);
    return -1;
  }
  if (c->edge_var) {
    error_at(n->loc, "noise() inside sum(%s in children: ...): noise the sum, or a value before it", c->edge_var);
    return -1;
  }
  if (c->moe_var) {
    error_at(n->loc, "noise inside moe: noise the gate or the moe's input instead");
    return -1;
  }
  int a = require_row(c, eval(c, n->args[0]), n->args[0], "noise");
  if (a < 0) return -1;
  return mk(c, OP_NOISE, T_ROW, node(c, a)->width, n->loc, 1, &a);
}

static int eval_rmat(Ctx *c, const Node *n, bool mv);
static int eval_call(Ctx *c, const Node *n) {
  const char *f = n->name;
  /* the unary elementwise functions come from the op table */
  for (int op = 0; op < OP_COUNT; op++) {
    if (op_info[op].kind != OK_EW || op_info[op].arity != 1 || strcmp(op_info[op].name, f)) continue;
    if (n->nargs != 1) {
      error_at(n->loc, "'%s' takes 1 argument, given %d", f, n->nargs);
      return -1;
    }
    return unary(c, (Op)op, eval(c, n->args[0]), n, n->args[0]);
  }
  if (!strcmp(f, "concat")) return eval_concat(c, n);
  if (!strcmp(f, "sum")) return eval_sum(c, n);
  if (!strcmp(f, "gather")) return eval_gather(c, n);
  if (!strcmp(f, "top")) {
    error_at(n->loc, "top(GATE, K) routes rows only as a moe's range: moe(e in top(GATE, K): EXPR)");
    return -1;
  }
  if (!strcmp(f, "dropout") && c->moe_var) {
    error_at(n->loc, "dropout inside moe: drop the moe's input or its result instead");
    return -1;
  }
  if (!strcmp(f, "dropout")) return eval_dropout(c, n);
  if (!strcmp(f, "noise")) return eval_noise(c, n);
  if (!strcmp(f, "mv") || !strcmp(f, "mm")) return eval_rmat(c, n, !strcmp(f, "mv"));
  if (!strcmp(f, "softmax_xent") || !strcmp(f, "mse")) {
    error_at(n->loc, "'%s' is a loss: write 'loss %s(...);' in the push block", f, f);
    return -1;
  }
  error_at(n->loc, "unknown function '%s'", f);
  return -1;
}

/* mv(x, M): a row [A] times a matrix [A, B] per vertex, M a row whose width is a product
 * dim (`dim P = A * B`, row-major); mm(M, W): M [A, B] per vertex times a param [B, C],
 * a matrix [A, C] per vertex, whose width must be a declared product dim too. */
static int eval_rmat(Ctx *c, const Node *n, bool mv) {
  const char *f = mv ? "mv" : "mm";
  if (n->nargs != 2) {
    error_at(n->loc, "'%s' takes 2 arguments (%s), given %d", f,
             mv ? "a row and a matrix per vertex" : "a matrix per vertex and a param matrix", n->nargs);
    return -1;
  }
  int a = eval(c, n->args[0]), b = eval(c, n->args[1]);
  if (a < 0 || b < 0) return -1;
  int mat = mv ? b : a;
  const Node *mn = n->args[mv ? 1 : 0];
  if (require_row(c, mat, mn, mv ? "mv's second argument (the matrix)" : "mm's first argument (the matrix)") < 0)
    return -1;
  Model *m = c->m;
  Lin mw = node(c, mat)->width;
  int args[2] = {a, b};
  int p = is_top(mw) ? -1 : ir_product_dim(m, mw);
  if (!is_top(mw) && p < 0) {
    error_at(mn->loc, "%s: %s is a row [%s], not a matrix per vertex: its width must be a product dim (declare "
             "'dim P = A * B;' for an [A, B] matrix)", f, what(mn), wstr(c, mw));
    return -1;
  }
  if (mv) {
    if (require_row(c, a, n->args[0], "mv's first argument") < 0) return -1;
    if (p < 0) return mk(c, OP_MV, T_ROW, TOP, n->loc, 2, args);
    Lin ra = lin_dim(m->dims[p].fa, 1), u;
    if (!unify(node(c, a)->width, ra, &u)) {
      error_at(n->loc, "shape mismatch in mv: %s is [%s] but %s is a [%s, %s] matrix per vertex (expects [%s])",
               what(n->args[0]), wstr(c, node(c, a)->width), what(mn), m->dims[m->dims[p].fa].name,
               m->dims[m->dims[p].fb].name, m->dims[m->dims[p].fa].name);
      return -1;
    }
    return mk(c, OP_MV, T_ROW, lin_dim(m->dims[p].fb, 1), n->loc, 2, args);
  }
  IrNode *w = node(c, b);
  if (w->type != T_PARAM || m->params[w->ref].rank != 2) {
    error_at(n->args[1]->loc, "mm's second argument must be a param matrix, but %s is %s", what(n->args[1]),
             describe(c, b));
    return -1;
  }
  if (p < 0) return mk(c, OP_MM, T_ROW, TOP, n->loc, 2, args);
  const Param *pw = &m->params[w->ref];
  const char *an = m->dims[m->dims[p].fa].name, *bn = m->dims[m->dims[p].fb].name;
  if (!lin_eq(pw->rows, lin_dim(m->dims[p].fb, 1))) {
    error_at(n->loc, "shape mismatch in mm: %s is a [%s, %s] matrix per vertex but '%s' is [%s,%s] (expects [%s, ...])",
             what(mn), an, bn, pw->name, wstr(c, pw->rows), wstr(c, pw->cols), bn);
    return -1;
  }
  int q = -1;
  for (int i = 0; i < m->ndims; i++)
    if (m->dims[i].kind == DIM_PRODUCT && m->dims[i].fa == m->dims[p].fa && lin_eq(pw->cols, lin_dim(m->dims[i].fb, 1)))
      q = i;
  if (q < 0) {
    error_at(n->loc, "mm: %s times '%s' is a [%s, %s] matrix per vertex, whose width needs a product dim: declare "
             "'dim NAME = %s * %s;'", what(mn), pw->name, an, wstr(c, pw->cols), an, wstr(c, pw->cols));
    return -1;
  }
  return mk(c, OP_MM, T_ROW, lin_dim(q, 1), n->loc, 2, args);
}

static int eval_pull(Ctx *c, const Node *n) {
  if (c->f->kind != F_VERTEX) {
    error_at(n->loc, "pull() is only allowed in a vertex block");
    return -1;
  }
  if (!c->m->pull) {
    error_at(n->loc, "pull() but the model has no pull block");
    return -1;
  }
  int slot = -1;
  if (!n->name) {
    slot = c->m->npulls - 1;
    if (slot < 0) {
      error_at(n->loc, "pull() but the pull block defines no value");
      return -1;
    }
  } else {
    for (int i = 0; i < c->m->npulls; i++)
      if (!strcmp(c->m->pulls[i].name, n->name)) slot = i;
    if (slot < 0) {
      error_at(n->loc, "the pull block has no value named '%s'", n->name);
      return -1;
    }
  }
  IrNode *src = &c->m->pull->nodes[c->m->pulls[slot].node];
  if (src->type != T_ROW) {
    error_at(n->loc, "pull value '%s' is not a per-vertex row", c->m->pulls[slot].name);
    return -1;
  }
  return mk_with(c, (IrNode){.op = OP_PULL, .type = T_ROW, .ref = slot, .width = src->width,
                             .loc = n->loc});
}

/* A @ B, A + B, ...: the operands, then the operation; `... @ W[e]` is an expert's
   product (eval_moe's body) */
static int eval_binary(Ctx *c, const Node *n) {
  if (n->op == '@' && expert_index(c, n->b)) return expert_matmul(c, n);
  int a = eval(c, n->a), b = eval(c, n->b);
  switch (n->op) {
  case '+': return elementwise2(c, OP_ADD, a, b, n, n->a, n->b);
  case '-': return elementwise2(c, OP_SUB, a, b, n, n->a, n->b);
  case '*': return elementwise2(c, OP_MUL, a, b, n, n->a, n->b);
  case '/': return elementwise2(c, OP_DIV, a, b, n, n->a, n->b);
  case '@': return matmul(c, a, b, n);
  }
  unreachable();
}

/* F(NAME in ...: EXPR): sum over a range or the children, or moe over top(...) */
static int eval_for(Ctx *c, const Node *n) {
  const char *f = (const char *)n->args;
  if (n->op == 'm') {
    if (strcmp(f, "moe")) {
      error_at(n->loc, "'%s(%s in top(...): ...)': only 'moe' routes rows to experts", f, n->name);
      return -1;
    }
    return eval_moe(c, n);
  }
  if (!strcmp(f, "moe")) {
    error_at(n->loc, "moe takes 'top(GATE, K)', not a range or children: moe(%s in top(GATE, K): EXPR)", n->name);
    return -1;
  }
  if (strcmp(f, "sum")) {
    error_at(n->loc, "only 'sum' takes a range, not '%s'", f);
    return -1;
  }
  return n->op == 'c' ? eval_sum_children(c, n) : eval_sumfor(c, n);
}

/* ROW[LO:HI]: the bounds in range, the end past the start */
static int eval_slice(Ctx *c, const Node *n) {
  int a = require_row(c, eval(c, n->a), n->a, "slicing");
  Lin lo, hi;
  if (!eval_lin(c, n->b, &lo) || !eval_lin(c, n->c, &hi) || a < 0) return -1;
  Lin w = node(c, a)->width;
  if (lin_eq(lo, hi)) {
    error_at(n->loc, "empty slice [%s:%s]: the end must be past the start", wstr(c, lo), wstr(c, hi));
    return -1;
  }
  if (lin_le(hi, lo)) {
    error_at(n->loc, "slice [%s:%s] ends before it starts", wstr(c, lo), wstr(c, hi));
    return -1;
  }
  if (!lin_le(lin_const(0), lo) || !lin_le(lo, hi) || (!is_top(w) && !lin_le(hi, w))) {
    error_at(n->loc, "slice [%s:%s] is out of range for %s of width [%s]", wstr(c, lo), wstr(c, hi), what(n->a),
             wstr(c, w));
    return -1;
  }
  int *args = arena_alloc(sizeof(int));
  args[0] = a;
  return mk_with(c, (IrNode){.op = OP_SLICE, .type = T_ROW, .width = lin_sub(hi, lo), .nargs = 1, .args = args,
                             .lo = lo, .hi = hi, .loc = n->loc});
}

/* T[x]: a param matrix's row looked up by an index input, or T[e], the slot's expert's
   row of a table */
static int eval_index(Ctx *c, const Node *n) {
  if (expert_index(c, n)) {
    int t = expert_table(c, n);
    if (t < 0) return -1;
    return mk(c, OP_EROW, T_ROW, c->m->params[node(c, t)->ref].cols, n->loc, 1, &t);
  }
  int a = eval(c, n->a), b = eval(c, n->b);
  if (a < 0 || b < 0) return -1;
  IrNode *x = node(c, a), *y = node(c, b);
  if (x->type == T_ROW) {
    error_at(n->loc, "cannot index the row %s; take a slice, e.g. %s[0:H]", what(n->a),
             diag_span(n->a->loc) ? diag_span(n->a->loc) : "s");
    return -1;
  }
  if (x->type != T_PARAM || c->m->params[x->ref].rank != 2) {
    error_at(n->a->loc, "row lookup needs a param matrix, but %s is %s", what(n->a), describe(c, a));
    return -1;
  }
  if (y->type != T_INPUT || c->m->inputs[y->ref].kind != IN_INDEX) {
    error_at(n->b->loc, "row lookup needs an index input, but %s is %s", what(n->b), describe(c, b));
    return -1;
  }
  Param *p = &c->m->params[x->ref];
  Input *in = &c->m->inputs[y->ref];
  if (!lin_eq(p->rows, in->width)) {
    error_at(n->loc, "row lookup: '%s' has [%s] rows but '%s' indexes [%s]", p->name, wstr(c, p->rows), in->name,
             wstr(c, in->width));
    return -1;
  }
  int args[2] = {a, b};
  return mk(c, OP_LOOKUP, T_ROW, p->cols, n->loc, 2, args);
}

static int eval(Ctx *c, const Node *n) {
  if (c->nloops) c->unrolled++; /* a term a loop produces: counted against CV_MAX_UNROLLED */
  switch (n->kind) {
  case N_NUM: return mk_const(c, n->num, n->loc);
  case N_NAME: return eval_name(c, n);
  case N_DIMTERM:
    error_at(n->loc, "'%ld%s' is a dim expression, not a value", n->ival, n->name);
    return -1;
  case N_NEG: return unary(c, OP_NEG, eval(c, n->a), n, n->a);
  case N_BINARY: return eval_binary(c, n);
  case N_CALL: return eval_call(c, n);
  case N_SUMFOR: return eval_for(c, n);
  case N_PULL: return eval_pull(c, n);
  case N_SLICE: return eval_slice(c, n);
  case N_INDEX: return eval_index(c, n);
  }
  unreachable();
}

/* ---- statements ---- */

static void define(Ctx *c, const char *name, Loc loc, int id) {
  Entry *g = tab_get(&c->globals, name);
  if (g) {
    error_at(loc, "redefinition of '%s', which is %s", name, sym_what[g->kind]);
    note_at(g->loc, "'%s' was declared here", name);
    return;
  }
  Entry *e = tab_get(&c->scope, name);
  if (e) {
    if (e->depth >= 0) {
      error_at(loc, "redefinition of '%s'", name);
      note_at(e->loc, "previous definition of '%s' was here", name);
    }
    return;
  }
  if (loop_var(c, name)) {
    error_at(loc, "'%s' is a loop variable and cannot be assigned", name);
    return;
  }
  e = tab_put(&c->scope, name);
  e->index = id;
  e->loc = loc;
  /* names renamed by a loop (h_k -> h_0) outlive the iteration; others do not */
  e->depth = c->nloops;
  if (id >= 0 && !node(c, id)->name) node(c, id)->name = name;
}

static void stmts(Ctx *c, Stmt *s);

static void stmt_for(Ctx *c, Stmt *s) {
  long lo, hi;
  if (!eval_int(c, s->expr, &lo) || !eval_int(c, s->expr2, &hi)) return;
  if (hi < lo) {
    error_at(s->loc, "empty range %ld..%ld", lo, hi);
    return;
  }
  if (hi - lo >= CV_MAX_UNROLL) {
    error_at(s->loc, "range %ld..%ld too long to unroll (at most %d iterations)", lo, hi,
             CV_MAX_UNROLL);
    return;
  }
  if (c->nloops >= CV_MAX_NEST) {
    error_at(s->loc, "loops nested too deeply");
    return;
  }
  if (tab_get(&c->scope, s->name) || tab_get(&c->globals, s->name)) {
    error_at(s->name_loc, "loop variable '%s' hides a name already defined", s->name);
    return;
  }
  int errs = diag_count();
  for (long k = lo; k <= hi; k++) {
    if (++c->unrolled > CV_MAX_UNROLLED) {
      error_at(s->loc, "loops unroll to more than %d statements and terms in all", CV_MAX_UNROLLED);
      return;
    }
    int mark = c->scope.norder;
    c->loops[c->nloops++] = (LoopVar){s->name, k};
    stmts(c, s->body);
    c->nloops--;
    /* drop this iteration's local names; keep the renamed ones (depth reset to outer) */
    for (int i = mark; i < c->scope.norder; i++) {
      Entry *e = c->scope.order[i];
      if (e->depth > c->nloops) tab_del(&c->scope, e);
    }
    int keep = mark;
    for (int i = mark; i < c->scope.norder; i++) {
      Entry *e = c->scope.order[i];
      if (e->depth <= c->nloops) c->scope.order[keep++] = e;
    }
    c->scope.norder = keep;
    if (diag_count() != errs) break; /* one report per error, not one per iteration */
  }
}

/* NAME = EXPR; (in a loop's body, a name renamed to be seen after the loop) */
static void stmt_assign(Ctx *c, Stmt *s) {
  int depth;
  const char *renamed = loop_rename(c, s->name, &depth);
  int id = eval(c, s->expr);
  if (renamed) {
    /* visible after the loops it names: defined at the depth of the first it does not
       (the block's own where it names them all; an inner loop's `a_j` defined at the
       block's depth was a redefinition in the outer loop's next iteration) */
    int saved = c->nloops;
    c->nloops = depth;
    define(c, renamed, s->name_loc, id);
    c->nloops = saved;
  } else {
    define(c, s->name, s->name_loc, id);
  }
}

/* scatter(ROW); or push(ROW);: once each, in a vertex block */
static void stmt_out(Ctx *c, Stmt *s) {
  const char *what_ = s->kind == S_SCATTER ? "scatter" : "push";
  if (c->f->kind != F_VERTEX) {
    error_at(s->loc, "%s() is only allowed in a vertex block", what_);
    return;
  }
  int id = require_row(c, eval(c, s->expr), s->expr, s->kind == S_SCATTER ? "scatter()" : "push()");
  int *slot = s->kind == S_SCATTER ? &c->scatter : &c->push;
  Loc *sloc = s->kind == S_SCATTER ? &c->scatter_loc : &c->push_loc;
  if (*slot != -2) {
    error_at(s->loc, "%s() given twice in vertex '%s'", what_, c->f->name);
    note_at(*sloc, "the first %s() is here", what_);
    return;
  }
  *sloc = s->loc;
  if (id < 0) {
    *slot = -1;
    return;
  }
  *slot = mk(c, s->kind == S_SCATTER ? OP_SCATTER : OP_PUSH, T_NONE, lin_const(0), s->loc, 1, &id);
}

/* The target of a loss over the row a (width aw): softmax_xent's a class input of aw
   classes, mse's a row as wide. False after an error. */
static bool loss_target(Ctx *c, Stmt *s, bool xent, int a, int b) {
  IrNode *y = node(c, b);
  Lin aw = node(c, a)->width;
  if (xent) {
    if (y->type != T_INPUT || c->m->inputs[y->ref].kind != IN_CLASS) {
      error_at(s->args[1]->loc, "softmax_xent needs a class input as its target, but %s is %s", what(s->args[1]),
               describe(c, b));
      return false;
    }
    Lin cw = c->m->inputs[y->ref].width;
    if (!lin_eq(aw, cw)) {
      error_at(s->loc, "shape mismatch in softmax_xent: %s is [%s] but '%s' has [%s] classes", what(s->args[0]),
               wstr(c, aw), c->m->inputs[y->ref].name, wstr(c, cw));
      return false;
    }
    return true;
  }
  if (y->type != T_ROW) {
    error_at(s->args[1]->loc, "mse needs a row target (e.g. a real input), but %s is %s", what(s->args[1]),
             describe(c, b));
    return false;
  }
  if (!lin_eq(aw, y->width)) {
    error_at(s->loc, "shape mismatch in mse: %s is [%s] but %s is [%s]", what(s->args[0]), wstr(c, aw),
             what(s->args[1]), wstr(c, y->width));
    return false;
  }
  return true;
}

/* loss softmax_xent(ROW, CLASS); or loss mse(ROW, ROW);, in the push block */
static void stmt_loss(Ctx *c, Stmt *s) {
  if (c->f->kind != F_PUSH) {
    error_at(s->loc, "'loss' is only allowed in the push block");
    return;
  }
  bool xent = !strcmp(s->name, "softmax_xent");
  c->has_loss = true;
  if (!xent && strcmp(s->name, "mse")) {
    error_at(s->name_loc, "unknown loss '%s' (expected softmax_xent or mse)", s->name);
    return;
  }
  if (s->nargs != 2) {
    error_at(s->name_loc, "'%s' takes 2 arguments, given %d", s->name, s->nargs);
    return;
  }
  int a = require_row(c, eval(c, s->args[0]), s->args[0], s->name);
  int b = eval(c, s->args[1]);
  if (a < 0 || b < 0 || !loss_target(c, s, xent, a, b)) return;
  int args[2] = {a, b};
  mk(c, xent ? OP_XENT : OP_MSE, T_NONE, lin_const(0), s->loc, 2, args);
}

static void stmt(Ctx *c, Stmt *s) {
  c->rest = s->next;
  if (c->nloops) c->unrolled++; /* as eval's terms */
  switch (s->kind) {
  case S_ASSIGN: stmt_assign(c, s); return;
  case S_SCATTER:
  case S_PUSH: stmt_out(c, s); return;
  case S_LOSS: stmt_loss(c, s); return;
  case S_FOR: stmt_for(c, s); return;
  }
  unreachable();
}

static void stmts(Ctx *c, Stmt *s) {
  for (; s; s = s->next) stmt(c, s);
}

/* Runs one block into a fresh function. */
static IrFunc *block(Ctx *c, FuncKind kind, const Decl *d, int children) {
  IrFunc *f = ir_func(kind, kind == F_PULL ? "pull" : kind == F_PUSH ? "push" : d->name, d->loc);
  f->children = children;
  if (kind == F_VERTEX && c->vslot_name) {
    f->slot_name = c->vslot_name[c->cur_vi];
    f->slot_type = c->vslot_type[c->cur_vi];
  }
  f->edge_type = -1;
  if (kind == F_VERTEX && c->vedges) {
    f->edges = c->vedges[c->cur_vi];
    f->edge_type = c->vedge_type[c->cur_vi];
  }
  c->edge_var = NULL;
  c->f = f;
  tab_free(&c->scope);
  c->nloops = 0;
  c->scatter = c->push = -2;
  c->has_loss = false;
  c->unrolled = 0;
  free(c->cse);
  c->cse = NULL;
  c->ncse = c->capcse = 0;
  for (int i = 0; i < c->m->nparams; i++) c->param_node[i] = -1;
  for (int i = 0; i < c->m->ninputs; i++) c->input_node[i] = -1;
  if (kind == F_PUSH) {
    int id = mk(c, OP_PUSHARG, T_ROW, c->pushed_known ? c->m->pushed : TOP, d->name_loc, 0, NULL);
    define(c, d->name, d->name_loc, id);
  }
  stmts(c, d->body);
  return f;
}

/* ---- declarations ---- */

static bool declare(Ctx *c, const char *name, Loc loc, int kind, int index) {
  Entry *e = tab_get(&c->globals, name);
  if (e) {
    error_at(loc, "redefinition of '%s'", name);
    note_at(e->loc, "previous definition of '%s' was here (%s)", name, sym_what[e->kind]);
    return false;
  }
  e = tab_put(&c->globals, name);
  e->kind = kind;
  e->index = index;
  e->loc = loc;
  return true;
}

OptionKind option_kind(const char *name) {
  return strcmp(name, "clip") == 0 ? OPT_CLIP : strcmp(name, "balance") == 0 ? OPT_BALANCE : OPT_DROPOUT;
}
const char *option_value_error(OptionKind k, double v) {
  if (k == OPT_CLIP) return v >= 0 && v <= CV_MAX_CLIP ? NULL : "is the gradient-norm clip: its default must be a number, 0 (none) or more";
  if (k == OPT_BALANCE)
    return v >= 0 && v <= CV_MAX_CLIP ? NULL : "is a load-balancing loss's weight: its default must be a number, 0 (none) or more";
  return v >= 0 && v < 1 ? NULL : "is a dropout probability: its default must be a number in [0, 1)";
}

/* `option NAME = NUMBER;`: dropout's probability, set at run time, the default in
   [0, 1); `option clip = NUMBER;` the model's default gradient-norm clip */
static void decl_option(Ctx *c, Decl *d) {
  Model *m = c->m;
  if (m->noptions >= CV_MAX_OPTIONS) {
    error_at(d->name_loc, "too many options (at most %d)", CV_MAX_OPTIONS);
    return;
  }
  const Node *v = d->value;
  OptionKind k = option_kind(d->name);
  const char *why = v->kind == N_NUM ? option_value_error(k, v->num) : option_value_error(k, -1);
  if (why) {
    error_at(v->loc, "option '%s' %s", d->name, why);
    return;
  }
  if (!declare(c, d->name, d->name_loc, SYM_OPTION, m->noptions)) return;
  Option *o = &m->options[m->noptions++];
  o->name = d->name;
  o->kind = k;
  o->value = v->num;
  o->loc = d->name_loc;
}

static void decl_dim(Ctx *c, Decl *d) {
  Model *m = c->m;
  if (m->ndims >= CV_MAX_DIMS) {
    error_at(d->name_loc, "too many dims (at most %d)", CV_MAX_DIMS);
    return;
  }
  if (!declare(c, d->name, d->name_loc, SYM_DIM, m->ndims)) return;
  Dim *dim = &m->dims[m->ndims++];
  dim->name = d->name;
  dim->loc = d->name_loc;
  dim->kind = DIM_FREE;
  dim->input = -1;
  Node *v = d->value;
  if (!v) return;
  if (v->kind == N_NUM && v->is_int && v->ival > 0) {
    dim->kind = DIM_FIXED;
    dim->value = v->ival;
  } else if (v->kind == N_CALL && !strcmp(v->name, "vocab") && v->nargs == 1 &&
             v->args[0]->kind == N_NAME) {
    dim->kind = DIM_VOCAB;
    dim->input = -2; /* resolved once every input is declared */
    dim->value = (long)(intptr_t)v->args[0];
  } else if (v->kind == N_BINARY && v->op == '*' && v->a->kind == N_NAME && v->b->kind == N_NAME) {
    /* a product of two dims: the width of a per-vertex matrix */
    int f[2];
    const Node *fn[2] = {v->a, v->b};
    for (int k = 0; k < 2; k++) {
      Entry *e = tab_get(&c->globals, fn[k]->name);
      if (!e) {
        error_at(fn[k]->loc, "unknown dim '%s' (a product's factors are dims declared before it)", fn[k]->name);
        return;
      }
      if (e->kind != SYM_DIM) {
        error_at(fn[k]->loc, "'%s' is %s, not a dim", fn[k]->name, sym_what[e->kind]);
        return;
      }
      if (m->dims[e->index].kind == DIM_VOCAB) {
        error_at(fn[k]->loc, "dim '%s' is a product of dims, and '%s' is bound by the data (vocab): a factor must be "
                 "a fixed or free dim", d->name, fn[k]->name);
        return;
      }
      f[k] = e->index;
    }
    dim->kind = DIM_PRODUCT;
    dim->fa = f[0];
    dim->fb = f[1];
    long a = m->dims[f[0]].value, b = m->dims[f[1]].value;
    if (a > 0 && b > 0 && a * b > (1L << 24)) {
      error_at(v->loc, "dim '%s' = %ld * %ld is too large (at most 16777216)", d->name, a, b);
      return;
    }
    dim->value = a > 0 && b > 0 ? a * b : 0;
  } else {
    error_at(v->loc, "dim '%s' must be a positive integer, vocab(INPUT) or a product of two dims (A * B), not %s",
             d->name, what(v));
  }
}

static void decl_input(Ctx *c, Decl *d) {
  Model *m = c->m;
  Node *kn = d->value->a;
  InputKind kind;
  if (!strcmp(kn->name, "index")) kind = IN_INDEX;
  else if (!strcmp(kn->name, "class")) kind = IN_CLASS;
  else if (!strcmp(kn->name, "real")) kind = IN_REAL;
  else {
    error_at(kn->loc, "unknown input kind '%s' (expected index, class or real)", kn->name);
    return;
  }
  Lin w;
  if (!eval_shape(c, d->value->b, &w)) return;
  if (!declare(c, d->name, d->name_loc, SYM_INPUT, m->ninputs)) return;
  m->inputs = vec_grow(m->inputs, &m->capinputs, m->ninputs + 1, sizeof(Input));
  m->inputs[m->ninputs++] = (Input){.name = d->name, .kind = kind, .width = w, .loc = d->name_loc};
}

static void decl_param(Ctx *c, Decl *d) {
  Model *m = c->m;
  for (ParamItem *it = d->items; it; it = it->next) {
    Param p = {.name = it->name, .loc = it->loc};
    if (!eval_shape(c, it->d0, it->d1 ? &p.rows : &p.cols)) continue;
    if (it->d1 && !eval_shape(c, it->d1, &p.cols)) continue;
    p.rank = it->d1 ? 2 : 1;
    p.init = p.rank == 2 ? INIT_XAVIER : INIT_ZEROS;
    if (it->value) {
      if (!eval_number(c, it->value, &p.a)) continue;
      p.init = INIT_CONSTANT;
    } else if (d->init) {
      Node *in = d->init;
      const char *f = in->name;
      int want = -1;
      if (!strcmp(f, "xavier")) p.init = INIT_XAVIER, want = 0;
      else if (!strcmp(f, "zeros")) p.init = INIT_ZEROS, want = 0;
      else if (!strcmp(f, "constant")) p.init = INIT_CONSTANT, want = 1;
      else if (!strcmp(f, "uniform")) p.init = INIT_UNIFORM, want = 2;
      else if (!strcmp(f, "normal")) p.init = INIT_NORMAL, want = 2;
      else if (!strcmp(f, "identity")) p.init = INIT_IDENTITY, want = 2;
      if (want < 0) {
        error_at(in->loc, "unknown initializer '%s' (expected uniform, normal, xavier, identity, constant or zeros)", f);
        return;
      }
      if (in->nargs != want) {
        error_at(in->loc, "initializer '%s' takes %d argument%s, given %d", f, want,
                 want == 1 ? "" : "s", in->nargs);
        return;
      }
      if (want >= 1 && !eval_number(c, in->args[0], &p.a)) return;
      if (want >= 2 && !eval_number(c, in->args[1], &p.b)) return;
      if (p.init == INIT_UNIFORM && !(p.a < p.b)) {
        error_at(in->loc, "uniform(%g, %g): the low bound must be below the high bound", p.a, p.b);
        return;
      }
      if (p.init == INIT_NORMAL && !(p.b > 0)) {
        error_at(in->loc, "normal(%g, %g): the standard deviation must be positive", p.a, p.b);
        return;
      }
      if (p.init == INIT_XAVIER && p.rank != 2) {
        error_at(in->loc, "xavier needs a matrix, but '%s' is a vector", p.name);
        return;
      }
      if (p.init == INIT_IDENTITY) {
        /* a square matrix, or a table of square matrices, one a row */
        int q = p.rank == 2 ? ir_product_dim(m, p.cols) : -1;
        if (p.rank == 2 && !lin_eq(p.rows, p.cols) && q >= 0 && m->dims[q].fa == m->dims[q].fb)
          p.init = INIT_IDENTITY_ROWS;
        else if (p.rank != 2 || !lin_eq(p.rows, p.cols)) {
          error_at(in->loc, "identity needs a square matrix [A, A] or a table of them [N, P] with 'dim P = A * A;', "
                   "but '%s' is %s", p.name, p.rank == 2 ? "a matrix of another shape" : "a vector");
          return;
        }
        if (!(p.b >= 0)) {
          error_at(in->loc, "identity(%g, %g): the noise's standard deviation must not be negative", p.a, p.b);
          return;
        }
      }
    }
    if (!declare(c, it->name, it->loc, SYM_PARAM, m->nparams)) continue;
    /* parameters may sit side by side (merged products, their storage blocks): their
       columns together stay in range, as every width does */
    long k = p.cols.k, cs[CV_MAX_DIMS];
    for (int i = 0; i < CV_MAX_DIMS; i++) cs[i] = p.cols.c[i];
    for (int j = 0; j < m->nparams; j++) {
      k += m->params[j].cols.k;
      for (int i = 0; i < CV_MAX_DIMS; i++) cs[i] += m->params[j].cols.c[i];
    }
    bool big = k > (1L << 24);
    for (int i = 0; i < CV_MAX_DIMS; i++) big = big || cs[i] > (1L << 24);
    if (big) {
      error_at(it->loc, "the parameters are too large: with '%s', their columns add up to more than %ld "
               "of a dim", it->name, 1L << 24);
      continue;
    }
    m->params = vec_grow(m->params, &m->capparams, m->nparams + 1, sizeof(Param));
    m->params[m->nparams++] = p;
  }
}

static void push_width(Ctx *c, IrFunc *f, const Decl *push);
static Model *push_block(Ctx *c, Model *m, Decl *push);

/* The declarations before the blocks, in source order (blocks may then use any of
   them): the model's name, dims, options, inputs, parameters; the pull and push blocks
   found (a second one is an error) and the vertex blocks named and counted. */
static void sema_globals(Ctx *c, Decl *decls, Decl **pull, Decl **push, int *nvertex) {
  Model *m = c->m;
  for (Decl *d = decls; d; d = d->next) {
    switch (d->kind) {
    case D_MODEL:
      if (m->name) {
        error_at(d->loc, "the model is already named '%s'", m->name);
        continue;
      }
      /* the generated MODEL.h includes the runtime's cavs.h, and MODEL_desc is a cavs_desc */
      if (!strcmp(d->name, "cavs"))
        error_at(d->name_loc, "a model cannot be named 'cavs': its header, cavs.h, would hide the runtime's");
      if (declare(c, d->name, d->name_loc, SYM_MODEL, 0)) m->name = d->name;
      break;
    case D_DIM: decl_dim(c, d); break;
    case D_OPTION: decl_option(c, d); break;
    case D_INPUT: decl_input(c, d); break;
    case D_PARAM: decl_param(c, d); break;
    case D_PULL:
    case D_PUSH: {
      Decl **slot = d->kind == D_PULL ? pull : push;
      if (*slot) {
        error_at(d->loc, "a second %s block", d->kind == D_PULL ? "pull" : "push");
        note_at((*slot)->loc, "the first one is here");
        continue;
      }
      *slot = d;
      break;
    }
    case D_VERTEX:
      if (declare(c, d->name, d->name_loc, SYM_VERTEX, *nvertex)) (*nvertex)++;
      break;
    }
  }
  if (!m->name) {
    error_at(decls->loc, "missing 'model NAME;' declaration");
    m->name = "model";
  }
}

/* Each vocab(INPUT) dim: its index input, which must be index[DIM]. */
static void sema_vocab_dims(Ctx *c) {
  Model *m = c->m;
  for (int i = 0; i < m->ndims; i++) {
    Dim *dim = &m->dims[i];
    if (dim->kind != DIM_VOCAB) continue;
    Node *arg = (Node *)(intptr_t)dim->value;
    dim->value = 0;
    Entry *e = tab_get(&c->globals, arg->name);
    if (!e || e->kind != SYM_INPUT || m->inputs[e->index].kind != IN_INDEX) {
      const char *is = !e ? "not declared"
                       : e->kind != SYM_INPUT ? sym_what[e->kind]
                       : m->inputs[e->index].kind == IN_CLASS ? "a class input" : "a real input";
      error_at(arg->loc, "vocab() needs an index input, but '%s' is %s", arg->name, is);
      continue;
    }
    dim->input = e->index;
    if (!lin_eq(m->inputs[e->index].width, lin_dim(i, 1))) {
      error_at(m->inputs[e->index].loc, "'%s' takes its values from vocab(%s), so it must be index[%s]",
               dim->name, arg->name, dim->name);
    }
  }
}

/* The pull block and the values it leaves for the vertex blocks (its top-level names). */
static void sema_pull(Ctx *c, Decl *pull) {
  Model *m = c->m;
  m->pull = block(c, F_PULL, pull, 0);
  for (int i = 0; i < c->scope.norder; i++) {
    Entry *e = c->scope.order[i];
    if (e->depth != 0 || e->index < 0) continue;
    m->pulls = vec_grow(m->pulls, &m->cappulls, m->npulls + 1, sizeof(PullSlot));
    m->pulls[m->npulls++] = (PullSlot){e->key, e->index};
  }
}

/* The vertex blocks as declared: each one's children (a count, named typed slots, or a
   set), and the first block that types its children and the first that does not. */
typedef struct VertexDecls {
  int nv;
  int *children;
  Decl **decl;
  Loc *edge_loc; /* where a set names its children's type */
  const Decl *typed_by, *untyped_by;
} VertexDecls;

/* Named slots of vertex block d (its nv-th): their names, types and places in c's
   vslot_* arrays; false where there are too many. */
static bool vertex_slots(Ctx *c, const Decl *d, int nv, long *k) {
  for (const Slot *s = d->slots; s; s = s->next) ++*k;
  if (*k > CV_MAX_CHILDREN) {
    error_at(d->name_loc, "vertex '%s' has %ld child slots; at most %d", d->name, *k, CV_MAX_CHILDREN);
    return false;
  }
  const char **names = arena_alloc(sizeof(const char *) * (size_t)*k);
  int *types = arena_alloc(sizeof(int) * (size_t)*k);
  Loc *locs = arena_alloc(sizeof(Loc) * (size_t)*k);
  int i = 0;
  for (const Slot *s = d->slots; s; s = s->next, i++) {
    names[i] = s->name;
    locs[i] = s->type_loc;
    types[i] = 0;
    for (int j = 0; j < i; j++)
      if (!strcmp(names[j], s->name)) {
        error_at(s->loc, "child slot '%s' twice in vertex '%s'", s->name, d->name);
        note_at(locs[j], "the first one is here");
      }
    Entry *e = tab_get(&c->globals, s->type);
    if (!e)
      error_at(s->type_loc, "slot '%s' holds a '%s', but no vertex block is named '%s'", s->name, s->type, s->type);
    else if (e->kind != SYM_VERTEX)
      error_at(s->type_loc, "slot '%s' holds a '%s', which is %s, not a vertex block", s->name, s->type,
               sym_what[e->kind]);
    else
      types[i] = e->index;
  }
  c->vslot_name[nv] = names;
  c->vslot_type[nv] = types;
  c->vslot_loc[nv] = locs;
  return true;
}

/* Children counts or named slots of every vertex block (a name declared twice counts
   once, at its first declaration). */
static void vertex_decls(Ctx *c, Decl *decls, int nvertex, VertexDecls *v) {
  v->children = arena_alloc(sizeof(int) * (size_t)(nvertex + 1));
  v->decl = arena_alloc(sizeof(Decl *) * (size_t)(nvertex + 1));
  c->vslot_name = arena_alloc(sizeof(const char **) * (size_t)(nvertex + 1));
  c->vslot_type = arena_alloc(sizeof(int *) * (size_t)(nvertex + 1));
  c->vslot_loc = arena_alloc(sizeof(Loc *) * (size_t)(nvertex + 1));
  c->vedges = arena_alloc(sizeof(bool) * (size_t)(nvertex + 1));
  c->vedge_type = arena_alloc(sizeof(int) * (size_t)(nvertex + 1));
  v->edge_loc = arena_alloc(sizeof(Loc) * (size_t)(nvertex + 1));
  v->typed_by = v->untyped_by = NULL;
  int nv = 0;
  for (Decl *d = decls; d; d = d->next) {
    if (d->kind != D_VERTEX || tab_get(&c->globals, d->name)->loc.line != d->name_loc.line ||
        tab_get(&c->globals, d->name)->loc.col != d->name_loc.col)
      continue;
    long k = 0;
    c->vedges[nv] = d->star;
    c->vedge_type[nv] = -1;
    if (d->star) {
      c->vslot_name[nv] = NULL;
      c->vslot_type[nv] = NULL;
      if (d->star_type) {
        Entry *e = tab_get(&c->globals, d->star_type);
        if (!e)
          error_at(d->star_type_loc, "the children are '%s', but no vertex block is named '%s'", d->star_type,
                   d->star_type);
        else if (e->kind != SYM_VERTEX)
          error_at(d->star_type_loc, "the children are '%s', which is %s, not a vertex block", d->star_type,
                   sym_what[e->kind]);
        else
          c->vedge_type[nv] = e->index;
        v->edge_loc[nv] = d->star_type_loc;
        if (!v->typed_by) v->typed_by = d;
      } else if (!v->untyped_by)
        v->untyped_by = d;
      if (!d->slots) {
        v->children[nv] = 0;
        v->decl[nv++] = d;
        continue;
      }
    }
    if (d->slots) {
      if (!vertex_slots(c, d, nv, &k)) continue;
      if (!v->typed_by) v->typed_by = d;
    } else {
      if (!eval_int(c, d->value, &k)) continue;
      if (k < 0 || k > CV_MAX_CHILDREN) {
        error_at(d->value->loc, "children must be between 0 and %d, not %ld", CV_MAX_CHILDREN, k);
        continue;
      }
      c->vslot_name[nv] = NULL;
      c->vslot_type[nv] = NULL;
      if (k > 0 && !v->untyped_by) v->untyped_by = d;
    }
    v->children[nv] = (int)k;
    v->decl[nv++] = d;
  }
  v->nv = nv;
}

/* Typed children: what each type scatters, from trial passes while they learn a width
   (a type's may depend on what its children's types scatter); then each block for
   real, and the push block. */
static Model *typed_vertices(Ctx *c, const VertexDecls *v, Decl *push) {
  Model *m = c->m;
  int nv = v->nv;
  c->tstate = arena_alloc(sizeof(Lin) * (size_t)(nv + 1));
  bool *scat = arena_alloc(sizeof(bool) * (size_t)(nv + 1));
  for (int i = 0; i < nv; i++) c->tstate[i] = TOP;
  diag_silence(true);
  for (bool learnt = true; learnt;) {
    learnt = false;
    for (int i = 0; i < nv; i++) {
      if (!is_top(c->tstate[i])) continue;
      c->cur_vi = i;
      block(c, F_VERTEX, v->decl[i], v->children[i]);
      scat[i] = c->scatter != -2;
      if (c->scatter >= 0) {
        Lin w = c->f->nodes[c->f->nodes[c->scatter].args[0]].width;
        if (!is_top(w)) c->tstate[i] = w, learnt = true;
      }
    }
  }
  diag_silence(false);
  for (int i = 0; i < nv; i++) {
    for (int k = 0; k < v->children[i]; k++) {
      int t = c->vslot_type[i][k];
      if (!scat[t])
        error_at(c->vslot_loc[i][k], "slot '%s' holds a '%s', which never calls scatter()", c->vslot_name[i][k],
                 v->decl[t]->name);
    }
    if (c->vedges[i] && !scat[c->vedge_type[i]])
      error_at(v->edge_loc[i], "the children are '%s', which never calls scatter()", v->decl[c->vedge_type[i]]->name);
  }
  if (diag_count()) return m;
  m->vertex = arena_alloc(sizeof(IrFunc *) * (size_t)nv);
  for (int i = 0; i < nv; i++) {
    c->cur_vi = i;
    IrFunc *f = block(c, F_VERTEX, v->decl[i], v->children[i]);
    m->vertex[m->nvertex++] = f;
    f->scatters = c->scatter != -2;
    if (c->scatter >= 0) {
      Lin w = f->nodes[f->nodes[c->scatter].args[0]].width;
      if (is_top(c->tstate[i]))
        error_at(c->scatter_loc, "cannot tell the width of the state that '%s' scatters; "
                 "scatter a value of known width (e.g. a slice or a product)", f->name);
      else if (!lin_eq(w, c->tstate[i])) /* cannot happen: the same block, widths known */
        error_at(c->scatter_loc, "'%s' scatters [%s], not [%s]", f->name, wstr(c, w), wstr(c, c->tstate[i]));
      f->state = w;
    }
    push_width(c, f, push);
  }
  return push_block(c, m, push);
}

/* Untyped children: one state width for every block, from the first trial pass that
   learns it; then each block for real, and the push block. */
static Model *untyped_vertices(Ctx *c, const VertexDecls *v, Decl *push) {
  Model *m = c->m;
  int nv = v->nv;
  diag_silence(true);
  for (int i = 0; i < nv && !c->state_known; i++) {
    c->cur_vi = i;
    block(c, F_VERTEX, v->decl[i], v->children[i]);
    if (c->scatter >= 0) {
      Lin w = c->f->nodes[c->f->nodes[c->scatter].args[0]].width;
      if (!is_top(w)) {
        m->state = w;
        c->state_known = true;
      }
    }
  }
  diag_silence(false);

  m->vertex = arena_alloc(sizeof(IrFunc *) * (size_t)nv);
  const char *state_by = NULL;
  Loc state_loc = {0};
  for (int i = 0; i < nv; i++) {
    c->cur_vi = i;
    IrFunc *f = block(c, F_VERTEX, v->decl[i], v->children[i]);
    m->vertex[m->nvertex++] = f;
    f->scatters = true;
    if (c->scatter == -2) {
      error_at(v->decl[i]->name_loc, "vertex '%s' never calls scatter()", f->name);
    } else if (c->scatter >= 0) {
      Lin w = f->nodes[f->nodes[c->scatter].args[0]].width;
      if (!c->state_known) {
        error_at(c->scatter_loc, "cannot tell the width of the state that '%s' scatters; "
                 "scatter a value of known width (e.g. a slice or a product)", f->name);
      } else if (!lin_eq(w, m->state)) {
        error_at(c->scatter_loc, "scatter() width differs between vertex blocks: '%s' scatters [%s]",
                 f->name, wstr(c, w));
        if (state_by) note_at(state_loc, "but '%s' scatters [%s]", state_by, wstr(c, m->state));
        else note_at(v->decl[0]->name_loc, "children read the state as [%s] here and in other blocks", wstr(c, m->state));
      } else if (!state_by) {
        state_by = f->name;
        state_loc = c->scatter_loc;
      }
    }
    push_width(c, f, push);
  }
  return push_block(c, m, push);
}

static Model *sema_run(Ctx *c, Decl *decls, const char *path) {
  c->decls = decls;
  Model *m = arena_alloc(sizeof(Model));
  c->m = m;
  m->path = path;
  Loc top = {1, 1, 1, 1};

  if (!decls) {
    error_at(top, "no declarations: a model file starts with 'model NAME;'");
    return m;
  }
  Decl *pull = NULL, *push = NULL;
  int nvertex = 0;
  sema_globals(c, decls, &pull, &push, &nvertex);
  sema_vocab_dims(c);
  if (diag_count()) return m;

  c->param_node = arena_alloc(sizeof(int) * (size_t)(m->nparams + 1));
  c->input_node = arena_alloc(sizeof(int) * (size_t)(m->ninputs + 1));
  if (pull) sema_pull(c, pull);

  VertexDecls v;
  vertex_decls(c, decls, nvertex, &v);
  if (nvertex == 0) {
    error_at(decls->loc, "the model has no vertex block");
    return m;
  }
  if (v.typed_by && v.untyped_by) {
    error_at(v.untyped_by->value ? v.untyped_by->value->loc : v.untyped_by->name_loc,
             "vertex '%s' takes children of any type, but '%s' names its children's types",
             v.untyped_by->name, v.typed_by->name);
    note_at(v.typed_by->name_loc, "name them in every block that takes children: children NAME: TYPE, ...");
  }
  if (diag_count()) return m;
  m->typed = v.typed_by != NULL;
  if (m->typed) return typed_vertices(c, &v, push);
  c->vslot_name = NULL, c->vslot_type = NULL;
  return untyped_vertices(c, &v, push);
}

/* After vertex block f: the width it pushes, the same for every block. */
static void push_width(Ctx *c, IrFunc *f, const Decl *push) {
  Model *m = c->m;
  if (c->push >= 0) {
    Lin w = f->nodes[f->nodes[c->push].args[0]].width;
    if (!push) {
      error_at(c->push_loc, "push() but the model has no push block");
    } else if (!c->pushed_known) {
      m->pushed = w;
      c->pushed_known = true;
      c->pushed_loc = c->push_loc;
      c->pushed_by = f->name;
    } else if (!lin_eq(w, m->pushed)) {
      error_at(c->push_loc, "push() width differs between vertex blocks: '%s' pushes [%s]", f->name,
               wstr(c, w));
      note_at(c->pushed_loc, "but '%s' pushes [%s]", c->pushed_by, wstr(c, m->pushed));
    }
  }
}

/* The push block, after every vertex block. */
static Model *push_block(Ctx *c, Model *m, Decl *push) {
  if (diag_count()) return m; /* the push block's width depends on the vertex blocks */
  if (push) {
    if (!c->pushed_known && diag_count() == 0) {
      error_at(push->loc, "the push block is never fed: no vertex block calls push()");
      return m;
    }
    m->push = block(c, F_PUSH, push, 0);
    if (!c->has_loss) error_at(push->loc, "the push block has no 'loss' statement");
  }
  return m;
}

/* The context's tables go on every path out, errors included (IR lives in the arena). */
Model *sema(Decl *decls, const char *path) {
  Ctx ctx = {0};
  Model *m = sema_run(&ctx, decls, path);
  if (m && !diag_count()) ir_number_routes(m);
  tab_free(&ctx.scope);
  tab_free(&ctx.globals);
  free(ctx.cse);
  return m;
}

/* ir_read.c: reads back what `cavsc --dump=ir` prints, so that a dump can become a test
 * and the passes after sema can run on IR written by hand (`cavsc -o DIR model.ir`).
 * The text is line-oriented; a mistake is reported with its line and column like any
 * other input error. The result goes through ir_check, as sema's does. */
#include "cavsc.h"

#include <stdlib.h>
#include <string.h>

typedef struct Rd {
  const char *p, *line_start;
  int line;
  const char *vocab_of[CV_MAX_DIMS]; /* the input each vocab dim counts, by name */
  Model *m;
  IrFunc *f;
  long param_cols[CV_MAX_DIMS + 1]; /* the parameters' columns together (acc_add) */
  const char ***slot_tnames;         /* per vertex function: its slots' type names */
  int capslots;
  bool bad;
} Rd;

static Loc here(const Rd *r) {
  int col = (int)(r->p - r->line_start) + 1;
  return (Loc){r->line, col, r->line, col};
}

#define FAIL(r, ...)                 \
  do {                               \
    if (!(r)->bad) error_at(here(r), __VA_ARGS__); \
    (r)->bad = true;                 \
    return false;                    \
  } while (0)

static void spaces(Rd *r) {
  while (*r->p == ' ' || *r->p == '\t') r->p++;
}

static bool lit(Rd *r, const char *s) {
  spaces(r);
  size_t n = strlen(s);
  if (strncmp(r->p, s, n)) return false;
  r->p += n;
  return true;
}

static bool want(Rd *r, const char *s) {
  if (!lit(r, s)) FAIL(r, "expected '%s'", s);
  return true;
}

static const char *ident(Rd *r) {
  spaces(r);
  const char *a = r->p;
  while ((*r->p >= 'a' && *r->p <= 'z') || (*r->p >= 'A' && *r->p <= 'Z') || *r->p == '_' ||
         (r->p > a && *r->p >= '0' && *r->p <= '9'))
    r->p++;
  if (r->p == a) return NULL;
  char *s = arena_alloc((size_t)(r->p - a) + 1);
  memcpy(s, a, (size_t)(r->p - a));
  return s;
}

static bool integer(Rd *r, long *v) {
  spaces(r);
  char *end;
  *v = strtol(r->p, &end, 10);
  if (end == r->p) FAIL(r, "expected an integer");
  r->p = end;
  return true;
}

static bool number(Rd *r, double *v) {
  spaces(r);
  char *end;
  *v = strtod(r->p, &end);
  if (end == r->p) FAIL(r, "expected a number");
  r->p = end;
  return true;
}

static int dim_index(const Model *m, const char *name) {
  for (int i = 0; i < m->ndims; i++)
    if (!strcmp(m->dims[i].name, name)) return i;
  return -1;
}

/* Every coefficient of a width stays within this, as sema keeps them (so that the sums
 * the passes make of widths stay far from int32 overflow). */
#define LIN_MAX (1L << 24)

/* A width as lin_str prints it: 2H+E, H+3, 0. */
static bool lin(Rd *r, Lin *out) {
  long c[CV_MAX_DIMS + 1] = {0}; /* the dims' coefficients, then the constant */
  spaces(r);
  int sign = 1;
  for (;;) {
    long k = 1;
    bool have_k = *r->p >= '0' && *r->p <= '9';
    if (have_k && !integer(r, &k)) return false;
    const char *name = ident(r);
    int d = CV_MAX_DIMS;
    if (name) {
      d = dim_index(r->m, name);
      if (d < 0) FAIL(r, "unknown dim '%s'", name);
    } else if (!have_k) {
      FAIL(r, "expected a width");
    }
    if (k > LIN_MAX || labs(c[d] += sign * k) > LIN_MAX) FAIL(r, "width too large (at most %ld of a dim)", LIN_MAX);
    if (*r->p == '+') sign = 1;
    else if (*r->p == '-') sign = -1;
    else break;
    r->p++;
  }
  Lin l = lin_const(c[CV_MAX_DIMS]);
  for (int i = 0; i < CV_MAX_DIMS; i++) l.c[i] = (int32_t)c[i];
  *out = l;
  return true;
}

/* Sums of widths, what concat and merged products (fuse.c) make of them, must stay
 * within LIN_MAX too: add them up in `acc` (the coefficients, then the constant). */
static void acc_add(long *acc, Lin w) {
  for (int i = 0; i < CV_MAX_DIMS; i++) acc[i] += w.c[i];
  acc[CV_MAX_DIMS] += w.k;
}

static bool acc_in_range(const long *acc) {
  for (int i = 0; i <= CV_MAX_DIMS; i++)
    if (labs(acc[i]) > LIN_MAX) return false;
  return true;
}

static bool node_ref(Rd *r, int *id) {
  if (!want(r, "%")) return false;
  long v;
  if (!integer(r, &v)) return false;
  if (v < 0 || v >= r->f->n) FAIL(r, "%%%ld is not an earlier node", v);
  *id = (int)v;
  return true;
}

/* Every name of a model is declared once (sema guarantees it for .vf input). */
static bool fresh_name(Rd *r, const char *name) {
  const Model *m = r->m;
  bool dup = false;
  for (int i = 0; i < m->ndims; i++) dup |= !strcmp(m->dims[i].name, name);
  for (int i = 0; i < m->noptions; i++) dup |= !strcmp(m->options[i].name, name);
  for (int i = 0; i < m->ninputs; i++) dup |= !strcmp(m->inputs[i].name, name);
  for (int i = 0; i < m->nparams; i++) dup |= !strcmp(m->params[i].name, name);
  for (int i = 0; i < m->nvertex; i++) dup |= !strcmp(m->vertex[i]->name, name);
  if (dup) FAIL(r, "'%s' is declared twice", name);
  return true;
}

/* source PATH: the rest of the line, the .vf file the line numbers refer to */
static bool hdr_source(Rd *r) {
  Model *m = r->m;
  spaces(r);
  const char *a = r->p;
  while (*r->p && *r->p != '\n') r->p++;
  const char *e = r->p;
  while (e > a && (e[-1] == ' ' || e[-1] == '\r')) e--;
  char *s = arena_alloc((size_t)(e - a) + 1);
  memcpy(s, a, (size_t)(e - a));
  m->path = s;
  return true;
}

/* dim NAME [= N | = A * B | = vocab(INPUT)] */
static bool hdr_dim(Rd *r) {
  Model *m = r->m;
  if (m->ndims >= CV_MAX_DIMS) FAIL(r, "too many dims");
  Dim *d = &m->dims[m->ndims];
  d->name = ident(r);
  d->kind = DIM_FREE;
  d->input = -1;
  d->loc = here(r);
  if (!d->name) FAIL(r, "expected a dim name");
  if (!fresh_name(r, d->name)) return false;
  if (lit(r, "=")) {
    if (lit(r, "vocab(")) {
      const char *in = ident(r);
      if (!in || !want(r, ")")) FAIL(r, "expected vocab(INPUT)");
      d->kind = DIM_VOCAB;
      d->value = 0;
      d->input = -2;
      r->vocab_of[m->ndims] = in; /* resolved once the inputs are read */
    } else if ((spaces(r), (*r->p >= 'a' && *r->p <= 'z') || (*r->p >= 'A' && *r->p <= 'Z') || *r->p == '_')) {
      /* A * B: earlier dims, neither a vocab */
      int f[2];
      for (int k = 0; k < 2; k++) {
        const char *fname = ident(r);
        if (!fname || (k == 0 && !want(r, "*"))) FAIL(r, "expected a dim product A * B");
        f[k] = -1;
        for (int j = 0; j < m->ndims; j++)
          if (!strcmp(m->dims[j].name, fname)) f[k] = j;
        if (f[k] < 0 || m->dims[f[k]].kind == DIM_VOCAB) FAIL(r, "a product's factor must be an earlier dim, not a vocab");
      }
      d->kind = DIM_PRODUCT;
      d->fa = f[0];
      d->fb = f[1];
      long a = m->dims[f[0]].value, b = m->dims[f[1]].value;
      if (a > 0 && b > 0 && a * b > (1L << 24)) FAIL(r, "dim product too large");
      d->value = a > 0 && b > 0 ? a * b : 0;
    } else {
      d->kind = DIM_FIXED;
      spaces(r);
      Loc at = here(r);
      if (!integer(r, &d->value)) return false;
      /* as in a .vf: a positive integer literal of at most 9 digits (a product of two
         then cannot overflow) */
      if (d->value < 1 || d->value > 999999999L) {
        error_at(at, "dim '%s' must be between 1 and 999999999", d->name);
        r->bad = true;
        return false;
      }
    }
  }
  m->ndims++;
  return true;
}

/* option NAME = VALUE */
static bool hdr_option(Rd *r) {
  Model *m = r->m;
  if (m->noptions >= CV_MAX_OPTIONS) FAIL(r, "too many options");
  Option *o = &m->options[m->noptions];
  o->loc = here(r);
  o->name = ident(r);
  if (!o->name) FAIL(r, "expected an option name");
  if (!fresh_name(r, o->name) || !want(r, "=") || !number(r, &o->value)) return false;
  o->kind = option_kind(o->name);
  const char *bad = option_value_error(o->kind, o->value);
  if (bad) FAIL(r, "'%s' %s", o->name, bad);
  m->noptions++;
  return true;
}

/* input NAME : index|class|real [WIDTH] */
static bool hdr_input(Rd *r) {
  Model *m = r->m;
  Input in = {.loc = here(r)};
  in.name = ident(r);
  if (!in.name || !fresh_name(r, in.name) || !want(r, ":")) return false;
  const char *kind = ident(r);
  if (!kind) FAIL(r, "expected index, class or real");
  in.kind = !strcmp(kind, "index") ? IN_INDEX : !strcmp(kind, "class") ? IN_CLASS : IN_REAL;
  if (!want(r, "[") || !lin(r, &in.width) || !want(r, "]")) return false;
  m->inputs = vec_grow(m->inputs, &m->capinputs, m->ninputs + 1, sizeof(Input));
  m->inputs[m->ninputs++] = in;
  return true;
}

/* param NAME [ROWS, COLS] init KIND[(A[, B])] */
static bool hdr_param(Rd *r) {
  Model *m = r->m;
  Param p = {.loc = here(r)};
  p.name = ident(r);
  Lin a, b;
  if (!p.name || !fresh_name(r, p.name) || !want(r, "[") || !lin(r, &a)) return false;
  if (lit(r, ",")) {
    if (!lin(r, &b)) return false;
    p.rank = 2;
    p.rows = a;
    p.cols = b;
  } else {
    p.rank = 1;
    p.cols = a;
  }
  if (!want(r, "]") || !want(r, "init")) return false;
  const char *init = ident(r);
  static const char *names[] = {"zeros", "constant", "uniform", "normal", "xavier", "identity", "identity_rows", "xavier_rows"};
  int k = -1;
  for (int i = 0; init && i < 8; i++)
    if (!strcmp(init, names[i])) k = i;
  if (k < 0) FAIL(r, "unknown initializer");
  p.init = (InitKind)k;
  if (lit(r, "(")) {
    if (!number(r, &p.a)) return false;
    if (lit(r, ",") && !number(r, &p.b)) return false;
    if (!want(r, ")")) return false;
  }
  acc_add(r->param_cols, p.cols);
  if (!acc_in_range(r->param_cols)) FAIL(r, "the parameters' columns add up to more than %ld of a dim", LIN_MAX);
  m->params = vec_grow(m->params, &m->capparams, m->nparams + 1, sizeof(Param));
  m->params[m->nparams++] = p;
  return true;
}

static bool header_line(Rd *r, const char *kw) {
  Model *m = r->m;
  if (!strcmp(kw, "source")) return hdr_source(r);
  if (!strcmp(kw, "dim")) return hdr_dim(r);
  if (!strcmp(kw, "option")) return hdr_option(r);
  if (!strcmp(kw, "input")) return hdr_input(r);
  if (!strcmp(kw, "param")) return hdr_param(r);
  if (!strcmp(kw, "model")) {
    m->name = ident(r);
    if (!m->name) FAIL(r, "expected the model's name");
  } else if (!strcmp(kw, "typed")) {
    if (m->typed) FAIL(r, "'typed' twice");
    m->typed = true;
  } else if (!strcmp(kw, "state") || !strcmp(kw, "pushed")) {
    Lin w;
    if (!want(r, "[") || !lin(r, &w) || !want(r, "]")) return false;
    if (!strcmp(kw, "state")) m->state = w;
    else m->pushed = w;
  } else {
    FAIL(r, "unknown declaration '%s'", kw);
  }
  return true;
}

static int find_named(const char *name, int n, const char *(*get)(const Model *, int), const Model *m) {
  for (int i = 0; i < n; i++)
    if (!strcmp(get(m, i), name)) return i;
  return -1;
}
static const char *param_name(const Model *m, int i) { return m->params[i].name; }
static const char *input_name(const Model *m, int i) { return m->inputs[i].name; }
static const char *pull_name(const Model *m, int i) { return m->pulls[i].name; }

/* What follows a node's operation up to its type: a constant, a name, a child's number,
   or operands (%N, ...) with a slice's bounds or topk's k; the operands into args (room
   for MAX_ARGS), their count into *nargs. */
enum { MAX_ARGS = 64 };
static bool node_operands(Rd *r, IrNode *np, const char *op, int *args, int *nargs) {
  IrFunc *f = r->f;
  Model *m = r->m;
  IrNode n = *np;
  switch (n.op) {
  case OP_CONST:
    if (!number(r, &n.cval)) return false;
    if (lit(r, "option")) { /* `const 0.5 option p_drop`: dropout's p, read at run time */
      const char *name = ident(r);
      for (int i = 0; name && i < m->noptions; i++)
        if (!strcmp(m->options[i].name, name)) n.ref = i + 1;
      if (!n.ref) FAIL(r, "unknown option '%s'", name ? name : "");
    }
    break;
  case OP_PARAM:
  case OP_INPUT:
  case OP_PULL: {
    const char *name = ident(r);
    if (!name) FAIL(r, "expected a name");
    n.ref = n.op == OP_PARAM ? find_named(name, m->nparams, param_name, m)
          : n.op == OP_INPUT ? find_named(name, m->ninputs, input_name, m)
                             : find_named(name, m->npulls, pull_name, m);
    if (n.ref < 0) FAIL(r, "unknown %s '%s'", op, name);
    n.type = n.op == OP_PARAM ? T_PARAM : n.op == OP_INPUT ? T_INPUT : T_ROW;
    break;
  }
  case OP_GATHER: {
    long c;
    if (!integer(r, &c)) return false;
    n.ref = (int)c;
    break;
  }
  case OP_SLICE:
    if (!node_ref(r, &args[(*nargs)++]) || !want(r, "[") || !lin(r, &n.lo) || !want(r, ":") || !lin(r, &n.hi) ||
        !want(r, "]"))
      return false;
    break;
  case OP_TOPK: { /* `topk %g, %w k K`: the function's one routing */
    long k;
    if (!node_ref(r, &args[(*nargs)++]) || !want(r, ",") || !node_ref(r, &args[(*nargs)++]) || !want(r, "k") ||
        !integer(r, &k))
      return false;
    if (k < 1 || k > CV_MAX_CHILDREN) FAIL(r, "k must be between 1 and %d", CV_MAX_CHILDREN);
    if (f->route >= 0) FAIL(r, "a second topk in one function");
    n.ref = (int)k;
    f->route = f->n;
    f->route_k = (int)k;
    break;
  }
  case OP_PUSHARG:
  case OP_ECHILD: break;
  default:
    do {
      if (*nargs == MAX_ARGS) FAIL(r, "too many operands");
      if (!node_ref(r, &args[(*nargs)++])) return false;
    } while (lit(r, ","));
    break;
  }
  *np = n;
  return true;
}

/* A node's flags from its operands: on a set's edges (n->edge), on the routed slots
   (n->slot); and a concat's width checked in range. */
static bool node_flags(Rd *r, IrNode *n, const int *args, int nargs) {
  const IrFunc *f = r->f;
  if (n->op == OP_CONCAT) {
    long w[CV_MAX_DIMS + 1] = {0};
    for (int i = 0; i < nargs; i++) acc_add(w, f->nodes[args[i]].width);
    if (!acc_in_range(w)) FAIL(r, "concat's operands add up to more than %ld of a dim", LIN_MAX);
  }
  n->edge = n->op == OP_ECHILD || n->op == OP_EBCAST;
  for (int j = 0; j < nargs && n->op != OP_ESUM && n->op != OP_EBCAST; j++) n->edge = n->edge || f->nodes[args[j]].edge;
  n->slot = n->op == OP_SBCAST || n->op == OP_EMM || n->op == OP_EROW;
  for (int j = 0; j < nargs && n->op != OP_SCOMB; j++) n->slot = n->slot || f->nodes[args[j]].slot;
  return true;
}

/* "  %I = OP ... [: [W] | : scalar]   # line L [NAME]" or "  OP %a[, %b]   # line L" */
static bool node_line(Rd *r) {
  IrFunc *f = r->f;
  IrNode n = {.type = T_NONE};
  bool value = lit(r, "%");
  if (value) {
    long id;
    if (!integer(r, &id)) return false;
    if (id != f->n) FAIL(r, "expected node %%%d", f->n);
    if (!want(r, "=")) return false;
  }
  const char *op = ident(r);
  int k = -1;
  for (int i = 0; op && i < OP_COUNT; i++)
    if (!strcmp(op_info[i].name, op)) k = i;
  if (k < 0) FAIL(r, "unknown operation '%s'", op ? op : "");
  n.op = (Op)k;
  int args[MAX_ARGS], nargs = 0;
  if (!node_operands(r, &n, op, args, &nargs)) return false;
  if (lit(r, ":")) {
    if (lit(r, "scalar")) {
      n.type = T_SCALAR;
    } else {
      if (!want(r, "[") || !lin(r, &n.width) || !want(r, "]")) return false;
      n.type = T_ROW;
    }
  }
  if (value && n.type == T_NONE) FAIL(r, "a value needs a type");
  if (!want(r, "#") || !want(r, "line")) return false;
  long line;
  if (!integer(r, &line)) return false;
  n.loc = (Loc){(int)line, 1, (int)line, 1};
  n.name = ident(r);
  if (!node_flags(r, &n, args, nargs)) return false;
  if (nargs) {
    n.args = arena_alloc(sizeof(int) * (size_t)nargs);
    memcpy(n.args, args, sizeof(int) * (size_t)nargs);
    n.nargs = nargs;
  }
  return ir_add(f, n) >= 0;
}

static bool func_line(Rd *r) {
  Model *m = r->m;
  const char *kind = ident(r);
  if (!kind) FAIL(r, "expected pull, vertex or push");
  if (!strcmp(kind, "pull")) {
    if (m->pull || m->nvertex || m->push) FAIL(r, "the pull function comes once, first");
    m->pull = r->f = ir_func(F_PULL, "pull", here(r));
  } else if (!strcmp(kind, "push")) {
    if (m->push) FAIL(r, "a second push function");
    m->push = r->f = ir_func(F_PUSH, "push", here(r));
  } else if (!strcmp(kind, "vertex")) {
    if (m->push) FAIL(r, "vertex functions come before the push function");
    const char *name = ident(r);
    long children = 0;
    if (!name || !fresh_name(r, name) || !want(r, "children")) return false;
    if (!integer(r, &children)) return false;
    bool star = lit(r, "set");
    if (children < 0 || children > CV_MAX_CHILDREN) FAIL(r, "children must be between 0 and %d", CV_MAX_CHILDREN);
    r->f = ir_func(F_VERTEX, name, here(r));
    r->f->children = (int)children;
    r->f->edges = star;
    r->f->edge_type = -1;
    const char *of = NULL;
    if (star && m->typed && (!want(r, "of") || !(of = ident(r)))) return false;
    r->f->scatters = !m->typed;
    if (m->typed && lit(r, "state")) {
      if (!want(r, "[") || !lin(r, &r->f->state) || !want(r, "]")) return false;
      r->f->scatters = true;
    }
    /* the type names of its slots, then of its set's children: resolved at the end */
    if (m->nvertex + 1 > r->capslots) { /* in the arena, as the model is: nothing to free */
      int cap = r->capslots ? r->capslots * 2 : 8;
      const char ***t = arena_alloc(sizeof(const char **) * (size_t)cap);
      if (r->capslots) memcpy(t, r->slot_tnames, sizeof(const char **) * (size_t)r->capslots);
      r->slot_tnames = t;
      r->capslots = cap;
    }
    const char **tn = arena_alloc(sizeof(const char *) * (size_t)(children + 1));
    r->slot_tnames[m->nvertex] = tn;
    tn[children] = of;
    if (m->typed && children > 0) {
      if (!want(r, "slots")) return false;
      r->f->slot_name = arena_alloc(sizeof(const char *) * (size_t)children);
      r->f->slot_type = arena_alloc(sizeof(int) * (size_t)children);
      for (int k = 0; k < children; k++) {
        r->f->slot_name[k] = ident(r);
        if (!r->f->slot_name[k] || !want(r, ":") || !(tn[k] = ident(r))) FAIL(r, "expected a slot 'NAME:TYPE'");
        for (int j = 0; j < k; j++)
          if (!strcmp(r->f->slot_name[j], r->f->slot_name[k])) FAIL(r, "slot '%s' twice", r->f->slot_name[k]);
      }
    }
    m->vertex = xrealloc(m->vertex, sizeof(IrFunc *) * (size_t)(m->nvertex + 1));
    m->vertex[m->nvertex++] = r->f;
  } else {
    FAIL(r, "unknown function kind '%s'", kind);
  }
  return true;
}

/* "export NAME = %N" after the pull function's nodes: one of its values, by name */
static bool export_line(Rd *r) {
  Model *m = r->m;
  const char *name = ident(r);
  int id;
  bool ok = name && want(r, "=") && r->f && r->f->kind == F_PULL && node_ref(r, &id);
  for (int i = 0; ok && i < m->npulls; i++)
    if (!strcmp(m->pulls[i].name, name)) FAIL(r, "'%s' is exported twice", name);
  if (ok) {
    m->pulls = vec_grow(m->pulls, &m->cappulls, m->npulls + 1, sizeof(PullSlot));
    m->pulls[m->npulls++] = (PullSlot){name, id};
  } else if (!r->bad) {
    FAIL(r, "expected 'export NAME = %%N' after the pull function");
  }
  return ok;
}

/* After the last line, the names that may come before what they name: a vocab dim's
   input, the vertex functions a set's children and each slot hold (which must
   scatter). False after an error. */
static bool resolve_names(Rd *r) {
  Model *m = r->m;
  for (int i = 0; i < m->ndims; i++) {
    Dim *d = &m->dims[i];
    if (d->kind != DIM_VOCAB) continue;
    d->input = find_named(r->vocab_of[i], m->ninputs, input_name, m);
    if (d->input < 0) error_at(d->loc, "vocab() of an unknown input");
  }
  for (int v = 0; v < m->nvertex; v++)
    if (m->vertex[v]->edges && r->slot_tnames && r->slot_tnames[v][m->vertex[v]->children]) {
      const char *of = r->slot_tnames[v][m->vertex[v]->children];
      int t = -1;
      for (int u = 0; u < m->nvertex; u++)
        if (!strcmp(m->vertex[u]->name, of)) t = u;
      if (t < 0 || !m->vertex[t]->scatters) {
        error_at(m->vertex[v]->loc, "the children of '%s' are '%s', %s", m->vertex[v]->name, of,
                 t < 0 ? "which is no vertex function" : "which scatters nothing");
        return false;
      }
      m->vertex[v]->edge_type = t;
    }
  for (int v = 0; v < m->nvertex; v++)
    for (int k = 0; r->slot_tnames && m->vertex[v]->slot_type && k < m->vertex[v]->children; k++) {
      int t = -1;
      for (int u = 0; u < m->nvertex; u++)
        if (!strcmp(m->vertex[u]->name, r->slot_tnames[v][k])) t = u;
      if (t < 0 || !m->vertex[t]->scatters) {
        error_at(m->vertex[v]->loc, "slot '%s' of '%s' holds '%s', %s", m->vertex[v]->slot_name[k], m->vertex[v]->name,
                 r->slot_tnames[v][k], t < 0 ? "which is no vertex function" : "which scatters nothing");
        return false;
      }
      m->vertex[v]->slot_type[k] = t;
    }
  return true;
}

Model *ir_read(const char *path, const char *text, size_t len) {
  Rd r = {.p = text, .line_start = text, .line = 1};
  Model *m = arena_alloc(sizeof(Model));
  m->path = path;
  r.m = m;
  const char *end = text + len;
  while (r.p < end && !r.bad) {
    const char *eol = memchr(r.p, '\n', (size_t)(end - r.p));
    if (!eol) eol = end;
    r.line_start = r.p;
    spaces(&r);
    bool ok = true;
    if (r.p == eol) {
      /* blank */
    } else if (lit(&r, "func")) {
      ok = func_line(&r);
    } else if (lit(&r, "export")) {
      ok = export_line(&r);
    } else if (r.f) {
      ok = node_line(&r);
    } else {
      const char *kw = ident(&r);
      ok = kw && header_line(&r, kw);
      if (!kw && !r.bad) {
        error_at(here(&r), "expected a declaration");
        r.bad = true;
      }
    }
    if (ok && !r.bad) {
      spaces(&r);
      if (r.p != eol && !r.bad) {
        error_at(here(&r), "unexpected text at the end of the line");
        r.bad = true;
      }
    }
    r.p = eol + (eol < end);
    r.line++;
  }
  if (r.bad) return m;
  if (!m->name) {
    error_at((Loc){1, 1, 1, 1}, "no 'model NAME' line");
    return m;
  }
  if (!resolve_names(&r)) return m;
  /* pull() nodes take their width from the slot they read */
  for (int v = 0; v < m->nvertex; v++)
    for (int i = 0; i < m->vertex[v]->n; i++) {
      IrNode *n = &m->vertex[v]->nodes[i];
      if (n->op == OP_PULL) n->width = m->pull->nodes[m->pulls[n->ref].node].width;
    }
  ir_number_routes(m);
  return m;
}

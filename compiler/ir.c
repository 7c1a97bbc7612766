/* ir.c: the typed IR: symbolic widths (Lin), node construction, the verifier (ir_check,
 * run on the IR that sema built or ir_read read, before the passes), and the text printer
 * behind `cavsc --dump=ir`. */
#include "cavsc.h"

#include <stdlib.h>
#include <string.h>

const OpInfo op_info[OP_COUNT] = {
#define X(id, sp, ar, kind, zero, fold, f, da, db) [OP_##id] = {sp, ar, kind, zero, f, da, db},
#include "ops.def"
#undef X
};
_Static_assert(OP_COUNT == 36, "ops.def changed: its header says what else a new op needs");

/* ---- widths ---- */

Lin lin_const(long k) {
  Lin l = {0};
  l.k = (int32_t)k;
  return l;
}

Lin lin_dim(int dim, long coef) {
  Lin l = {0};
  l.c[dim] = (int32_t)coef;
  return l;
}

Lin lin_add(Lin a, Lin b) {
  a.k += b.k;
  for (int i = 0; i < CV_MAX_DIMS; i++) a.c[i] += b.c[i];
  return a;
}

Lin lin_scale(Lin a, int k) {
  a.k *= k;
  for (int i = 0; i < CV_MAX_DIMS; i++) a.c[i] *= k;
  return a;
}

Lin lin_sub(Lin a, Lin b) {
  a.k -= b.k;
  for (int i = 0; i < CV_MAX_DIMS; i++) a.c[i] -= b.c[i];
  return a;
}

bool lin_eq(Lin a, Lin b) { return memcmp(&a, &b, sizeof a) == 0; }

bool lin_is_zero(Lin a) { return lin_eq(a, lin_const(0)); }
bool lin_is_const(Lin a) { return lin_eq(a, lin_const(a.k)); }

/* Dims are positive integers, so a <= b for every binding exactly when no coefficient of
 * b - a is negative (take each dim large in turn) and the constant part is non-negative
 * once every dim is 1 (the smallest binding). */
bool lin_le(Lin a, Lin b) {
  Lin d = lin_sub(b, a);
  long at_one = d.k;
  for (int i = 0; i < CV_MAX_DIMS; i++) {
    if (d.c[i] < 0) return false;
    at_one += d.c[i];
  }
  return at_one >= 0;
}

const char *lin_str(const Model *m, Lin a, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < CV_MAX_DIMS; i++) {
    if (!a.c[i]) continue;
    const char *name = m && i < m->ndims ? m->dims[i].name : "?";
    const char *sign = a.c[i] < 0 ? "-" : len ? "+" : "";
    long c = a.c[i] < 0 ? -(long)a.c[i] : a.c[i];
    if (c == 1) len += (size_t)snprintf(buf + len, len < size ? size - len : 0, "%s%s", sign, name);
    else len += (size_t)snprintf(buf + len, len < size ? size - len : 0, "%s%ld%s", sign, c, name);
  }
  if (a.k || !len)
    snprintf(buf + len, len < size ? size - len : 0, len && a.k > 0 ? "+%d" : "%d", a.k);
  return buf;
}

/* ---- construction ---- */

void ir_number_routes(Model *m) {
  int nf, id = 0;
  IrFunc **fs = model_funcs(m, &nf);
  for (int i = 0; i < nf; i++) fs[i]->route_id = fs[i]->route >= 0 ? id++ : -1;
}

IrFunc *ir_func(FuncKind kind, const char *name, Loc loc) {
  IrFunc *f = arena_alloc(sizeof(IrFunc));
  f->kind = kind;
  f->name = name;
  f->loc = loc;
  f->route = f->route_id = -1;
  return f;
}

int ir_add(IrFunc *f, IrNode node) {
  if (f->n >= CV_MAX_NODES) {
    error_at(node.loc, "'%s' is too large after unrolling (more than %d operations)",
             f->name, CV_MAX_NODES);
    return -1;
  }
  f->nodes = vec_grow(f->nodes, &f->cap, f->n + 1, sizeof(IrNode));
  f->nodes[f->n] = node;
  return f->n++;
}

IrFunc **model_funcs(const Model *m, int *n) {
  IrFunc **fs = arena_alloc(sizeof(IrFunc *) * (size_t)(m->nvertex + 2));
  int k = 0;
  if (m->pull) fs[k++] = m->pull;
  for (int i = 0; i < m->nvertex; i++) fs[k++] = m->vertex[i];
  if (m->push) fs[k++] = m->push;
  *n = k;
  return fs;
}

ParamUse *param_uses(const Model *m, int *count) {
  int nf, n = 0, cap = 0;
  IrFunc **fs = model_funcs(m, &nf);
  ParamUse *u = NULL;
  for (int k = 0; k < nf; k++) {
    const IrFunc *f = fs[k];
    for (int i = 0; i < f->n; i++) {
      const IrNode *x = &f->nodes[i];
      if (x->uses == 0 && x->type != T_NONE) continue;
      for (int j = 0; j < x->nargs; j++) {
        const IrNode *a = &f->nodes[x->args[j]];
        if (a->op != OP_PARAM) continue;
        u = vec_grow(u, &cap, n + 1, sizeof(ParamUse));
        u[n++] = (ParamUse){f, x, j, a->ref};
      }
    }
  }
  *count = n;
  return u;
}

/* ---- verifier: the invariants every pass relies on ---- */

/* Two widths agree, written for the checks below. */
#define same(a, b) lin_eq((a), (b))

/* The language's identifier rule. Every name reaches the generated C (as part of a
 * symbol, in a string or a comment), so the verifier holds IR read from a file to it
 * too. */
bool ir_is_ident(const char *s) {
  if (!s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return false;
  for (s++; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_'))
      return false;
  return true;
}

#define check_ident(s, what)                                                              \
  do {                                                                                    \
    if (!ir_is_ident(s)) internal_error(__FILE__, __LINE__, "%s is not an identifier", what); \
  } while (0)

/* Node i's op, operand count and operands (each defined before it; an option's value
   read by dropout's p and topk's balancing weight alone). */
static void check_operands(const Model *m, const IrFunc *f, int i, const IrNode *n) {
  cv_assert(n->op >= 0 && n->op < OP_COUNT);
  if (n->name) check_ident(n->name, "a value's name");
  const OpInfo *oi = &op_info[n->op];
  if (oi->arity >= 0 && n->nargs != oi->arity)
    internal_error(__FILE__, __LINE__, "%s %%%d: %s takes %d operands, has %d", f->name, i,
                   oi->name, oi->arity, n->nargs);
  for (int j = 0; j < n->nargs; j++)
    if (n->args[j] < 0 || n->args[j] >= i)
      internal_error(__FILE__, __LINE__, "%s %%%d: operand %d is %%%d (not defined before)",
                     f->name, i, j, n->args[j]);
  /* an option's value exists only at run time: dropout's p alone reads one */
  for (int j = 0; j < n->nargs; j++)
    if (f->nodes[n->args[j]].op == OP_CONST && f->nodes[n->args[j]].ref)
      cv_assert((n->op == OP_DROPOUT || n->op == OP_TOPK) && j == 1 &&
                m->options[f->nodes[n->args[j]].ref - 1].kind == (n->op == OP_TOPK ? OPT_BALANCE : OPT_DROPOUT));
}

/* Whether node i runs per edge (per slot), and which operands it may read so. */
static void check_edge_slot(const IrFunc *f, int i, const IrNode *n) {
  /* per edge: echild and ebcast, and what reads an edge value but esum; only in a
     vertex function whose children are a set, and never a statement's operand */
  bool edge = n->op == OP_ECHILD || n->op == OP_EBCAST;
  for (int j = 0; j < n->nargs && n->op != OP_ESUM && n->op != OP_EBCAST; j++) edge = edge || f->nodes[n->args[j]].edge;
  cv_assert(n->edge == edge && (!edge || (f->kind == F_VERTEX && f->edges)));
  cv_assert(!(n->type == T_NONE && edge));
  /* per slot of a mixture of experts: sbcast, emm and erow, and what reads a slot
     value but scomb; after the function's topk, never a statement's operand */
  bool slot = n->op == OP_SBCAST || n->op == OP_EMM || n->op == OP_EROW;
  for (int j = 0; j < n->nargs && n->op != OP_SCOMB; j++) slot = slot || f->nodes[n->args[j]].slot;
  cv_assert(n->slot == slot && (!slot || (f->route >= 0 && i > f->route && !edge)));
  cv_assert(!(n->type == T_NONE && slot));
  /* an op on edge (slot) values runs over the edges (slots): each row operand is one
     too, a vertex row broadcast by ebcast (sbcast) first, never read at an edge's
     (slot's) index */
  for (int j = 0; j < n->nargs && edge && n->op != OP_EBCAST; j++)
    cv_assert(f->nodes[n->args[j]].type != T_ROW || f->nodes[n->args[j]].edge);
  for (int j = 0; j < n->nargs && slot && n->op != OP_SBCAST; j++)
    cv_assert(f->nodes[n->args[j]].type != T_ROW || f->nodes[n->args[j]].slot);
}

/* The ops of children as sets and of mixtures of experts; false for the rest. */
static bool check_route_op(const Model *m, const IrFunc *f, int i, const IrNode *n, const IrNode *a,
                           const IrNode *b) {
  const IrNode *gate = f->route >= 0 ? &f->nodes[f->route] : NULL;
  switch (n->op) {
  case OP_TOPK:
    cv_assert(f->route == i && f->kind != F_PULL && !f->edges && a->type == T_ROW && !a->slot);
    cv_assert(n->type == T_ROW && same(n->width, a->width) && n->ref == f->route_k);
    cv_assert(n->ref >= 1 && n->ref <= CV_MAX_CHILDREN && (!lin_is_const(a->width) || n->ref <= a->width.k));
    cv_assert(b->op == OP_CONST && b->cval >= 0 && b->cval <= CV_MAX_CLIP);
    return true;
  case OP_SBCAST: cv_assert(a->type == T_ROW && !a->slot && n->type == T_ROW && same(a->width, n->width)); return true;
  case OP_EMM: {
    /* a slot row [A] times its expert's [A, B]: row e of a table [X, A * B] */
    cv_assert(gate && a->type == T_ROW && a->slot && b->op == OP_PARAM && m->params[b->ref].rank == 2);
    cv_assert(same(m->params[b->ref].rows, gate->width));
    int p = ir_product_dim(m, m->params[b->ref].cols);
    cv_assert(p >= 0 && same(a->width, lin_dim(m->dims[p].fa, 1)) && n->type == T_ROW &&
              same(n->width, lin_dim(m->dims[p].fb, 1)));
    return true;
  }
  case OP_EROW:
    cv_assert(gate && a->op == OP_PARAM && m->params[a->ref].rank == 2 && same(m->params[a->ref].rows, gate->width));
    cv_assert(n->type == T_ROW && same(n->width, m->params[a->ref].cols));
    return true;
  case OP_SCOMB:
    cv_assert(a->type == T_ROW && a->slot && n->nargs == 2 && n->args[1] == f->route);
    cv_assert(n->type == T_ROW && same(n->width, a->width));
    return true;
  case OP_ECHILD:
    cv_assert(f->kind == F_VERTEX && f->edges && n->type == T_ROW);
    cv_assert(same(n->width, m->typed ? m->vertex[f->edge_type]->state : m->state));
    return true;
  case OP_EBCAST: cv_assert(a->type == T_ROW && !a->edge && n->type == T_ROW && same(a->width, n->width)); return true;
  case OP_ESUM: cv_assert(a->type == T_ROW && a->edge && n->type == T_ROW && same(a->width, n->width)); return true;
  case OP_DROPOUT: /* its masks are keyed by vertex row (cavs_ctx.rkey): not on edges or slots */
    cv_assert(a->type == T_ROW && !a->edge && !a->slot && n->type == T_ROW && same(a->width, n->width));
    cv_assert(b->op == OP_CONST && b->cval >= 0 && b->cval < 1);
    return true;
  case OP_NOISE: /* keyed as dropout's masks */
    cv_assert(a->type == T_ROW && !a->edge && !a->slot && n->type == T_ROW && same(a->width, n->width));
    return true;
  default: return false;
  }
}

/* Values read from outside the function (options, parameters, inputs, children, the
   pull block, the pushed row) and the statements; false for the rest. */
static bool check_io_op(const Model *m, const IrFunc *f, const IrNode *n, const IrNode *a, const IrNode *b,
                        int *nscatter, int *npush) {
  switch (n->op) {
  case OP_CONST: cv_assert(n->type == T_SCALAR && n->ref >= 0 && n->ref <= m->noptions); return true;
  case OP_PARAM: cv_assert(n->type == T_PARAM && n->ref >= 0 && n->ref < m->nparams); return true;
  case OP_INPUT:
    cv_assert(n->ref >= 0 && n->ref < m->ninputs);
    if (m->inputs[n->ref].kind == IN_REAL) cv_assert(n->type == T_ROW && same(n->width, m->inputs[n->ref].width));
    else cv_assert(n->type == T_INPUT);
    return true;
  case OP_GATHER:
    cv_assert(f->kind == F_VERTEX && n->ref >= 0 && n->ref < f->children);
    cv_assert(n->type == T_ROW && same(n->width, ir_child_width(m, f, n->ref)));
    return true;
  case OP_PULL:
    cv_assert(f->kind == F_VERTEX && m->pull && n->ref >= 0 && n->ref < m->npulls);
    cv_assert(n->type == T_ROW && same(n->width, m->pull->nodes[m->pulls[n->ref].node].width));
    return true;
  case OP_PUSHARG: cv_assert(f->kind == F_PUSH && n->type == T_ROW && same(n->width, m->pushed)); return true;
  case OP_SCATTER:
    cv_assert(f->kind == F_VERTEX && n->type == T_NONE && f->scatters);
    cv_assert(a->type == T_ROW && same(a->width, ir_state_width(m, f)));
    ++*nscatter;
    return true;
  case OP_PUSH:
    cv_assert(f->kind == F_VERTEX && n->type == T_NONE && m->push);
    cv_assert(a->type == T_ROW && same(a->width, m->pushed));
    ++*npush;
    return true;
  case OP_XENT:
    cv_assert(f->kind == F_PUSH && n->type == T_NONE && a->type == T_ROW);
    cv_assert(b->op == OP_INPUT && m->inputs[b->ref].kind == IN_CLASS && same(a->width, m->inputs[b->ref].width));
    return true;
  case OP_MSE:
    cv_assert(f->kind == F_PUSH && n->type == T_NONE && a->type == T_ROW && b->type == T_ROW);
    cv_assert(same(a->width, b->width));
    return true;
  default: return false;
  }
}

/* Products, lookups, concatenations, slices and the elementwise ops. */
static void check_value_op(const Model *m, const IrFunc *f, const IrNode *n, const IrNode *a, const IrNode *b) {
  const OpInfo *oi = &op_info[n->op];
  switch (n->op) {
  case OP_MATMUL: {
    cv_assert(b->op == OP_PARAM && m->params[b->ref].rank == 2 && a->type == T_ROW);
    cv_assert(same(a->width, m->params[b->ref].rows));
    cv_assert(n->type == T_ROW && same(n->width, m->params[b->ref].cols));
    break;
  }
  case OP_MV: {
    /* row [A] times a matrix [A, B] per vertex */
    cv_assert(a->type == T_ROW && b->type == T_ROW && n->type == T_ROW);
    int p = ir_product_dim(m, b->width);
    cv_assert(p >= 0 && same(a->width, lin_dim(m->dims[p].fa, 1)) && same(n->width, lin_dim(m->dims[p].fb, 1)));
    break;
  }
  case OP_MM: {
    /* a matrix [A, B] per vertex times a param [B, C]: [A, C] per vertex */
    cv_assert(a->type == T_ROW && b->op == OP_PARAM && m->params[b->ref].rank == 2 && n->type == T_ROW);
    int p = ir_product_dim(m, a->width), q = ir_product_dim(m, n->width);
    cv_assert(p >= 0 && q >= 0 && m->dims[p].fa == m->dims[q].fa);
    cv_assert(same(m->params[b->ref].rows, lin_dim(m->dims[p].fb, 1)) &&
              same(m->params[b->ref].cols, lin_dim(m->dims[q].fb, 1)));
    break;
  }
  case OP_LOOKUP:
    cv_assert(a->op == OP_PARAM && m->params[a->ref].rank == 2);
    cv_assert(b->op == OP_INPUT && m->inputs[b->ref].kind == IN_INDEX);
    cv_assert(same(m->params[a->ref].rows, m->inputs[b->ref].width));
    cv_assert(n->type == T_ROW && same(n->width, m->params[a->ref].cols));
    break;
  case OP_CONCAT: {
    Lin w = lin_const(0);
    cv_assert(n->nargs >= 1);
    for (int j = 0; j < n->nargs; j++) {
      cv_assert(f->nodes[n->args[j]].type == T_ROW);
      w = lin_add(w, f->nodes[n->args[j]].width);
    }
    cv_assert(n->type == T_ROW && same(n->width, w));
    break;
  }
  case OP_SLICE:
    cv_assert(a->type == T_ROW && n->type == T_ROW);
    cv_assert(lin_le(lin_const(0), n->lo) && lin_le(n->lo, n->hi) && !same(n->lo, n->hi) && lin_le(n->hi, a->width));
    cv_assert(same(n->width, lin_sub(n->hi, n->lo)));
    break;
  default:
    cv_assert(oi->kind == OK_EW && n->type == T_ROW);
    for (int j = 0; j < n->nargs; j++) {
      const IrNode *x = &f->nodes[n->args[j]];
      /* a row of width 1 broadcasts over the columns */
      if (x->type == T_ROW) cv_assert(same(x->width, n->width) || same(x->width, lin_const(1)));
      else if (x->type == T_PARAM) cv_assert(m->params[x->ref].rank == 1 && same(m->params[x->ref].cols, n->width));
      else cv_assert(x->type == T_SCALAR);
    }
    break;
  }
}

/* A vertex function's statements and children: one scatter (where it scatters), a push
   at most, its slots' types scattering and named once. */
static void check_vertex_func(const Model *m, const IrFunc *f, int nscatter, int npush) {
  cv_assert(nscatter == (f->scatters ? 1 : 0) && npush <= 1);
  cv_assert(m->typed || f->scatters);
  cv_assert(!m->typed == !f->slot_type || f->children == 0);
  cv_assert(!f->edges || !m->typed ||
            (f->edge_type >= 0 && f->edge_type < m->nvertex && m->vertex[f->edge_type]->scatters));
  for (int k = 0; f->slot_type && k < f->children; k++) {
    cv_assert(f->slot_type[k] >= 0 && f->slot_type[k] < m->nvertex && m->vertex[f->slot_type[k]]->scatters);
    check_ident(f->slot_name[k], "a child slot's name");
    for (int j = 0; j < k; j++) cv_assert(strcmp(f->slot_name[j], f->slot_name[k]));
  }
}

static void check_func(const Model *m, const IrFunc *f) {
  int nscatter = 0, npush = 0;
  for (int i = 0; i < f->n; i++) {
    const IrNode *n = &f->nodes[i];
    check_operands(m, f, i, n);
    check_edge_slot(f, i, n);
    const IrNode *a = n->nargs > 0 ? &f->nodes[n->args[0]] : NULL;
    const IrNode *b = n->nargs > 1 ? &f->nodes[n->args[1]] : NULL;
    if (!check_route_op(m, f, i, n, a, b) && !check_io_op(m, f, n, a, b, &nscatter, &npush))
      check_value_op(m, f, n, a, b);
  }
  if (f->kind == F_VERTEX) check_vertex_func(m, f, nscatter, npush);
}

Lin ir_child_width(const Model *m, const IrFunc *f, int k) {
  return m->typed && f->slot_type ? m->vertex[f->slot_type[k]]->state : m->state;
}
Lin ir_state_width(const Model *m, const IrFunc *f) { return m->typed ? f->state : m->state; }

int ir_product_dim(const Model *m, Lin w) {
  for (int i = 0; i < m->ndims; i++)
    if (m->dims[i].kind == DIM_PRODUCT && lin_eq(w, lin_dim(i, 1))) return i;
  return -1;
}

void ir_rmat_shape(const Model *m, const IrFunc *f, const IrNode *n, Lin *A, Lin *B, Lin *C) {
  const IrNode *mat = &f->nodes[n->args[n->op == OP_MV ? 1 : 0]];
  int p = ir_product_dim(m, mat->width);
  cv_assert(p >= 0);
  *A = lin_dim(m->dims[p].fa, 1);
  *B = lin_dim(m->dims[p].fb, 1);
  *C = n->op == OP_MM ? m->params[f->nodes[n->args[1]].ref].cols : lin_const(0);
}

void ir_check(const Model *m) {
  cv_assert(m->nvertex >= 1 && m->ndims <= CV_MAX_DIMS);
  check_ident(m->name, "the model's name");
  for (int i = 0; i < m->ndims; i++) {
    check_ident(m->dims[i].name, "a dim's name");
    const Dim *d = &m->dims[i];
    if (d->kind == DIM_PRODUCT)
      cv_assert(d->fa >= 0 && d->fa < i && d->fb >= 0 && d->fb < i && m->dims[d->fa].kind != DIM_VOCAB &&
                m->dims[d->fb].kind != DIM_VOCAB);
  }
  for (int i = 0; i < m->ninputs; i++) check_ident(m->inputs[i].name, "an input's name");
  for (int i = 0; i < m->nparams; i++) check_ident(m->params[i].name, "a parameter's name");
  for (int i = 0; i < m->npulls; i++) check_ident(m->pulls[i].name, "a pull slot's name");
  for (int v = 0; v < m->nvertex; v++) check_ident(m->vertex[v]->name, "a vertex type's name");
  for (int i = 0; i < m->npulls; i++)
    cv_assert(m->pull && m->pulls[i].node >= 0 && m->pulls[i].node < m->pull->n &&
              m->pull->nodes[m->pulls[i].node].type == T_ROW);
  if (m->push) {
    bool fed = false;
    for (int v = 0; v < m->nvertex; v++)
      for (int i = 0; i < m->vertex[v]->n; i++) fed |= m->vertex[v]->nodes[i].op == OP_PUSH;
    cv_assert(fed);
  }
  if (m->pull) check_func(m, m->pull);
  for (int i = 0; i < m->nvertex; i++) check_func(m, m->vertex[i]);
  if (m->push) check_func(m, m->push);
}

/* ---- printer ---- */

/* The shortest decimal that reads back as the same double. */
static const char *num(double v) {
  static char buf[4][40];
  static int k;
  k = (k + 1) % 4;
  for (int prec = 6; prec <= 17; prec++) {
    snprintf(buf[k], sizeof buf[k], "%.*g", prec, v);
    if (strtod(buf[k], NULL) == v) break;
  }
  return buf[k];
}

static const char *init_name[] = {"zeros", "constant", "uniform", "normal", "xavier", "identity", "identity_rows", "xavier_rows"};
static const char *input_kind[] = {"index", "class", "real"};

static void print_func(FILE *out, const Model *m, const IrFunc *f) {
  char w[128], lo[128], hi[128];
  if (f->kind == F_PULL) fprintf(out, "\nfunc pull\n");
  else if (f->kind == F_PUSH) fprintf(out, "\nfunc push\n");
  else {
    fprintf(out, "\nfunc vertex %s children %d", f->name, f->children);
    if (f->edges) fprintf(out, " set");
    if (f->edges && m->typed) fprintf(out, " of %s", m->vertex[f->edge_type]->name);
    if (m->typed && f->scatters) fprintf(out, " state [%s]", lin_str(m, f->state, w, sizeof w));
    for (int k = 0; m->typed && f->slot_type && k < f->children; k++)
      fprintf(out, "%s%s:%s", k ? " " : " slots ", f->slot_name[k], m->vertex[f->slot_type[k]]->name);
    fputc('\n', out);
  }
  for (int i = 0; i < f->n; i++) {
    const IrNode *n = &f->nodes[i];
    int col = 0;
    if (n->type == T_NONE) col = fprintf(out, "  %s", op_info[n->op].name);
    else col = fprintf(out, "  %%%d = %s", i, op_info[n->op].name);
    switch (n->op) {
    case OP_CONST:
      col += fprintf(out, " %s", num(n->cval));
      if (n->ref) col += fprintf(out, " option %s", m->options[n->ref - 1].name);
      break;
    case OP_PARAM: col += fprintf(out, " %s", m->params[n->ref].name); break;
    case OP_INPUT: col += fprintf(out, " %s", m->inputs[n->ref].name); break;
    case OP_GATHER: col += fprintf(out, " %d", n->ref); break;
    case OP_PULL: col += fprintf(out, " %s", m->pulls[n->ref].name); break;
    case OP_TOPK: col += fprintf(out, " %%%d, %%%d k %d", n->args[0], n->args[1], n->ref); break;
    case OP_SLICE:
      col += fprintf(out, " %%%d[%s:%s]", n->args[0], lin_str(m, n->lo, lo, sizeof lo),
                     lin_str(m, n->hi, hi, sizeof hi));
      break;
    default:
      for (int j = 0; j < n->nargs; j++) col += fprintf(out, "%s%%%d", j ? ", " : " ", n->args[j]);
      break;
    }
    if (n->type == T_ROW) col += fprintf(out, " : [%s]", lin_str(m, n->width, w, sizeof w));
    else if (n->type == T_SCALAR) col += fprintf(out, " : scalar");
    fprintf(out, "%*s# line %d", col < 40 ? 40 - col : 1, "", n->loc.line);
    if (n->name) fprintf(out, " %s", n->name);
    fputc('\n', out);
  }
}

void ir_print(FILE *out, const Model *m) {
  char a[128], b[128];
  fprintf(out, "model %s\n", m->name);
  /* the .vf file the `# line` comments refer to */
  if (m->path && !strchr(m->path, '\n')) fprintf(out, "source %s\n", m->path);
  for (int i = 0; i < m->ndims; i++) {
    const Dim *d = &m->dims[i];
    if (d->kind == DIM_FIXED) fprintf(out, "dim %s = %ld\n", d->name, d->value);
    else if (d->kind == DIM_VOCAB) fprintf(out, "dim %s = vocab(%s)\n", d->name, m->inputs[d->input].name);
    else if (d->kind == DIM_PRODUCT) fprintf(out, "dim %s = %s * %s\n", d->name, m->dims[d->fa].name, m->dims[d->fb].name);
    else fprintf(out, "dim %s\n", d->name);
  }
  for (int i = 0; i < m->noptions; i++) fprintf(out, "option %s = %s\n", m->options[i].name, num(m->options[i].value));
  for (int i = 0; i < m->ninputs; i++)
    fprintf(out, "input %s : %s[%s]\n", m->inputs[i].name, input_kind[m->inputs[i].kind],
            lin_str(m, m->inputs[i].width, a, sizeof a));
  for (int i = 0; i < m->nparams; i++) {
    const Param *p = &m->params[i];
    if (p->rank == 2)
      fprintf(out, "param %s[%s,%s] init %s", p->name, lin_str(m, p->rows, a, sizeof a),
              lin_str(m, p->cols, b, sizeof b), init_name[p->init]);
    else
      fprintf(out, "param %s[%s] init %s", p->name, lin_str(m, p->cols, a, sizeof a),
              init_name[p->init]);
    if (p->init == INIT_CONSTANT) fprintf(out, "(%s)", num(p->a));
    if (p->init == INIT_UNIFORM || p->init == INIT_NORMAL || p->init == INIT_IDENTITY || p->init == INIT_IDENTITY_ROWS) fprintf(out, "(%s, %s)", num(p->a), num(p->b));
    fputc('\n', out);
  }
  if (m->nvertex && !m->typed) fprintf(out, "state [%s]\n", lin_str(m, m->state, a, sizeof a));
  if (m->typed) fprintf(out, "typed\n");
  if (m->push) fprintf(out, "pushed [%s]\n", lin_str(m, m->pushed, a, sizeof a));
  if (m->pull) {
    print_func(out, m, m->pull);
    for (int i = 0; i < m->npulls; i++) fprintf(out, "  export %s = %%%d\n", m->pulls[i].name, m->pulls[i].node);
  }
  for (int i = 0; i < m->nvertex; i++) print_func(out, m, m->vertex[i]);
  if (m->push) print_func(out, m, m->push);
}

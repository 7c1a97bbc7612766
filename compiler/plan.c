/* plan.c: the memory plan and the schedule.
 *
 * Every live value gets a Place. Values read outside the step that computes them (or by
 * the backward pass) get a per-row buffer [rows of the minibatch, width]; values inside a
 * fused loop that nothing else reads stay in registers (their backward recomputes them
 * from the loop's inputs, which costs a few flops and saves a store and a load per
 * element). Views cost nothing: a slice is its parent at a column offset, pull() is the
 * pull block's buffer, a product of a merged group is a column range of the group's
 * output. Placement removes copies: the operands of a concat are computed straight into
 * their columns of it, the scattered value is computed straight into the state buffer
 * (scatter only records the row), and a value pushed by the only pushing vertex type is
 * computed straight into the push buffer. Gradients live at the same places in a parallel
 * set of buffers.
 *
 * The schedule: units (a fused group, a merged product, or one node with code of its
 * own) in a topological order that keeps source order where it can; each unit runs in
 * the phase of its class. */
#include "cavsc.h"

#include <stdlib.h>
#include <string.h>

static bool is_state(const Model *m, int b) {
  for (int v = 0; v < m->nvertex; v++)
    if (m->vertex[v]->state_buf == b) return true;
  return false;
}

static int add_buf(Model *m, const char *name, Lin width) {
  m->bufs = vec_grow(m->bufs, &m->capbufs, m->nbufs + 1, sizeof(Buf));
  m->bufs[m->nbufs] = (Buf){.name = name, .width = width, .vertex = -1};
  return m->nbufs++;
}

static void plan_params(Model *m) {
  for (int i = 0; i < m->nparams; i++) m->params[i].pgroup = -1;
  int nf;
  IrFunc **fs = model_funcs(m, &nf);
  for (int k = 0; k < nf; k++) {
    IrFunc *f = fs[k];
    for (int g = 0; g < f->nmerges; g++) {
      MatMerge *mg = &f->merges[g];
      if (mg->stack) continue; /* one parameter */
      m->pgroups = vec_grow(m->pgroups, &m->cappgroups, m->npgroups + 1, sizeof(PGroup));
      Lin off = lin_const(0);
      for (int j = 0; j < mg->n; j++) {
        Param *p = &m->params[f->nodes[f->nodes[mg->members[j]].args[1]].ref];
        p->pgroup = m->npgroups;
        p->col_off = off;
        off = lin_add(off, p->cols);
      }
      Param *p0 = &m->params[f->nodes[f->nodes[mg->members[0]].args[1]].ref];
      m->pgroups[m->npgroups++] = (PGroup){.rows = p0->rows, .cols = off};
    }
  }
  for (int i = 0; i < m->nparams; i++) {
    Param *p = &m->params[i];
    if (p->pgroup >= 0) continue;
    m->pgroups = vec_grow(m->pgroups, &m->cappgroups, m->npgroups + 1, sizeof(PGroup));
    p->pgroup = m->npgroups;
    p->col_off = lin_const(0);
    m->pgroups[m->npgroups++] = (PGroup){.rows = p->rank == 2 ? p->rows : lin_const(1), .cols = p->cols};
  }
}

/* Is node i a value that leaves its fused group (or has no group)? */
static bool leaves_group(const IrFunc *f, int i) {
  const IrNode *n = &f->nodes[i];
  if (n->group < 0) return true;
  for (int j = i + 1; j < f->n; j++) {
    const IrNode *u = &f->nodes[j];
    if (u->uses == 0 && u->type != T_NONE) continue;
    for (int k = 0; k < u->nargs; k++)
      if (u->args[k] == i && u->group != n->group) return true;
  }
  return false;
}

typedef struct FPlan {
  bool *own;   /* has (or shares by redirection) a buffer of its own making */
  int *redir;  /* placed inside this later node's buffer */
  Lin *roff;   /* at this column offset */
  int *rbuf;   /* placed straight into this model buffer (state, push) */
  int *mbuf;   /* per merge: its output buffer */
  bool stacked; /* a merge stacks its products (the children's gathered rows side by side) */
  Lin cw;       /* then: a child's width */
  int gbuf;     /* and the buffer of the children's rows */
} FPlan;

static Place row_place(const Model *m, int buf, Lin off) {
  return (Place){.kind = PL_ROW, .buf = buf, .off = off, .ld = m->bufs[buf].width};
}

static Place shift(Place p, Lin by) {
  p.off = lin_add(p.off, by);
  return p;
}

bool rule_uses(const char *rule, char v) {
  if (!rule) return false;
  for (const char *p = rule; *p; p++) {
    if (*p != v) continue;
    bool before = p > rule && (p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z'));
    bool after = p[1] == '_' || (p[1] >= 'a' && p[1] <= 'z') || (p[1] >= '0' && p[1] <= '9');
    if (!before && !after) return true;
  }
  return false;
}

void rule_needs(const IrFunc *f, int gi, bool *need) {
  const Group *g = &f->groups[gi];
  for (int k = 0; k < g->n; k++) {
    int x = g->members[k];
    const IrNode *n = &f->nodes[x];
    if (!n->grad) continue;
    for (int j = 0; j < n->nargs; j++) {
      const char *rule = j == 0 ? op_info[n->op].da : op_info[n->op].db;
      if (!f->nodes[n->args[j]].grad) continue;
      if (rule_uses(rule, 'y')) need[x] = true;
      for (int i = 0; i < n->nargs; i++)
        if (rule_uses(rule, i == 0 ? 'a' : 'b') && f->nodes[n->args[i]].group == gi) need[n->args[i]] = true;
    }
  }
}

/* The members of f's fused groups that the backward loop reads rather than computes
 * again: a sigmoid, tanh, exp or log a derivative rule needs (in the Tree-LSTM, the
 * five gates and tanh(c): six exponentials an element saved, for six stores forward and
 * six loads backward, which read fewer operands than the recomputation did). */
static void plan_keep(Model *m, IrFunc *f) {
  bool *need = arena_alloc(sizeof(bool) * (size_t)(f->n + 1));
  for (int gi = 0; gi < f->ngroups; gi++) rule_needs(f, gi, need);
  for (int i = 0; i < f->n; i++) {
    IrNode *x = &f->nodes[i];
    bool costly = x->op == OP_SIGMOID || x->op == OP_TANH || x->op == OP_EXP || x->op == OP_LOG;
    if (!need[i] || !costly || x->group < 0 || x->val.kind != PL_REG) continue;
    x->keep = true;
    const char *name = x->name ? arena_printf("%s_%s_kept", f->name, x->name) : arena_printf("%s_t%d_kept", f->name, i);
    x->kval = row_place(m, add_buf(m, name, x->width), lin_const(0));
  }
}

/* The operand of add z that a product b (the other operand) can add into
 * (IrNode.accum), or -1: z is an add in a fused group, b a product (an unstacked MATMUL
 * or an EMM) that z alone reads, the other operand a product or an expert's bias row
 * (MATMUL, EMM, EROW: a value computed into a buffer of its own, or a merged product's
 * columns) that z alone reads too, of the same width and kind of row, in a phase no
 * later than b's (its value is complete when b runs), and not zero or dead at the leaves
 * where b is not (b's rows there would add to rows nothing wrote), neither named in the
 * .vf. Of two products, the
 * later phase's adds into the earlier's (a path product into an eager one); in one
 * phase, the second operand into the first. */
static int accum_pair(const IrFunc *f, int z, int *into) {
  const IrNode *n = &f->nodes[z];
  if (n->op != OP_ADD || n->uses == 0 || n->group < 0 || n->type != T_ROW || n->args[0] == n->args[1]) return -1;
  for (int k = 1; k >= 0; k--) {
    int bi = n->args[k], ai = n->args[1 - k];
    const IrNode *b = &f->nodes[bi], *a = &f->nodes[ai];
    bool product = (b->op == OP_MATMUL && (b->mm < 0 || !f->merges[b->mm].stack)) || b->op == OP_EMM;
    bool value = (a->op == OP_MATMUL && (a->mm < 0 || !f->merges[a->mm].stack)) || a->op == OP_EMM || a->op == OP_EROW;
    if (!product || !value || b->uses != 1 || a->uses != 1 || b->type != T_ROW || a->type != T_ROW) continue;
    /* (a value the .vf names keeps its own row: cavs_model_vertex_value reads it) */
    if (a->name || b->name) continue;
    if (!lin_eq(a->width, b->width) || a->edge != b->edge || a->slot != b->slot || a->cls > b->cls) continue;
    if ((a->zero_leaf && !b->zero_leaf) || (a->dead_leaf && !b->dead_leaf)) continue;
    /* (of two products of one phase, the second adds into the first) */
    if (k == 0 && a->cls == b->cls && (a->op == OP_MATMUL || a->op == OP_EMM)) continue;
    *into = ai;
    return bi;
  }
  return -1;
}

/* The operand a of add z whose place z can be a view of (IrNode.same), or -1: z's other
 * operand adds into a's place (IrNode.accum, a product that is not merged), z is its
 * fused group's only member (its loop would copy a), it is not named (its own row is
 * what cavs_model_vertex_value reads) and what reads it reads it where it lies (no
 * scatter, push or concat, which would place it in a buffer of theirs), of a vertex or
 * push block, nothing of the three zero or dead at the leaves (the leaves' part of its
 * loop would write what a's place does not hold there). */
static int same_operand(const IrFunc *f, int z) {
  const IrNode *n = &f->nodes[z];
  if (n->op != OP_ADD || n->uses == 0 || n->group < 0 || f->groups[n->group].n != 1 || n->name || f->kind == F_PULL)
    return -1;
  int b = f->nodes[n->args[0]].accum ? n->args[0] : f->nodes[n->args[1]].accum ? n->args[1] : -1;
  if (b < 0 || f->nodes[b].mm >= 0) return -1;
  int a = f->nodes[b].accum_into;
  if (a != n->args[0] && a != n->args[1]) return -1;
  const IrNode *x[3] = {n, &f->nodes[a], &f->nodes[b]};
  for (int k = 0; k < 3; k++)
    if (x[k]->zero_leaf || x[k]->dead_leaf) return -1;
  for (int j = z + 1; j < f->n; j++) {
    const IrNode *u = &f->nodes[j];
    if (u->uses == 0 && u->type != T_NONE) continue;
    for (int k = 0; k < u->nargs; k++)
      if (u->args[k] == z && (op_info[u->op].kind == OK_SINK || op_info[u->op].kind == OK_CONCAT)) return -1;
  }
  return a;
}

/* The expert's product whose place activation z can be a view of (IrNode.act), or -1;
 * *sum the add between them (`act(h @ W[e] + b[e])`, the product adding into its bias
 * row: IrNode.accum) or -1. z (relu, tanh or sigmoid: a derivative written in its
 * output) is alone in its fused group but for that add, and is read once, as the left
 * operand of an expert's product, whose dx is then z's operand's gradient (its
 * derivative applied); the product and the add are read by nothing else, nothing of
 * the chain is named (cavs_model_vertex_value reads a named value's own row), and
 * --no-fuse (every elementwise op a loop of its own) folds nothing. */
static int act_product(const Model *m, const IrFunc *f, int z, int *sum) {
  const IrNode *n = &f->nodes[z];
  *sum = -1;
  if ((n->op != OP_RELU && n->op != OP_TANH && n->op != OP_SIGMOID) || m->no_fuse || f->kind == F_PULL)
    return -1;
  if (n->uses != 1 || n->group < 0 || n->name || !n->slot || n->type != T_ROW || n->zero_leaf || n->dead_leaf)
    return -1;
  bool read = false;
  for (int j = z + 1; j < f->n; j++) {
    const IrNode *u = &f->nodes[j];
    if (u->uses == 0 && u->type != T_NONE) continue;
    for (int k = 0; k < u->nargs; k++)
      if (u->args[k] == z) {
        if (u->op != OP_EMM || k != 0) return -1;
        read = true;
      }
  }
  int y = n->args[0], p = y;
  const IrNode *yn = &f->nodes[y];
  if (yn->op == OP_ADD) {
    int b = f->nodes[yn->args[0]].accum ? yn->args[0] : f->nodes[yn->args[1]].accum ? yn->args[1] : -1;
    if (b < 0 || f->nodes[b].op != OP_EMM || yn->group != n->group || yn->uses != 1 || yn->name) return -1;
    int a = f->nodes[b].accum_into;
    if ((a != yn->args[0] && a != yn->args[1]) || f->nodes[a].name) return -1;
    *sum = y, p = b;
  } else if (yn->op != OP_EMM || yn->accum || yn->uses != 1) {
    return -1;
  }
  if (!read || f->nodes[p].name || f->groups[n->group].n != (*sum >= 0 ? 2 : 1)) return -1;
  return p;
}

/* IrNode.accum over f; per merge, the merge its products add into, column for column
 * (all of its members or none), or -1 */
static void plan_accum(const Model *m, IrFunc *f, int *mto) {
  for (int i = 0; i < f->n; i++) f->nodes[i].accum = false;
  for (int g = 0; g < f->nmerges; g++) mto[g] = -1;
  for (int i = 0; i < f->n; i++) {
    f->nodes[i].same = f->nodes[i].folded = false;
    f->nodes[i].view = -1;
    f->nodes[i].act = 0;
  }
  for (int z = 0; z < f->n; z++) {
    int a, b = accum_pair(f, z, &a);
    if (b < 0) continue;
    f->nodes[b].accum = true;
    f->nodes[b].accum_into = a;
  }
  for (int g = 0; g < f->nmerges; g++) {
    const MatMerge *mg = &f->merges[g];
    int to = -1;
    bool all = !mg->stack;
    for (int k = 0; k < mg->n && all; k++) {
      const IrNode *b = &f->nodes[mg->members[k]];
      const IrNode *a = b->accum ? &f->nodes[b->accum_into] : NULL;
      if (!a || a->op != OP_MATMUL || a->mm < 0 || a->mm == g || (to >= 0 && a->mm != to)) all = false;
      else to = a->mm;
      all = all && f->merges[to].n == mg->n && f->merges[to].members[k] == b->accum_into;
    }
    if (all) mto[g] = to;
    for (int k = 0; k < mg->n && !all; k++) f->nodes[mg->members[k]].accum = false;
  }
  for (int z = 0; z < f->n; z++) {
    int a = same_operand(f, z);
    if (a >= 0) f->nodes[z].same = f->nodes[a].folded = true, f->nodes[z].view = a;
  }
  /* an activation applied by the product it reads: it and the add before it views of
     the place that product stores into (its bias row's, where it adds into one), which
     with its gradient is theirs */
  for (int z = 0; z < f->n; z++) {
    int sum, p = act_product(m, f, z, &sum);
    if (p < 0) continue;
    int place = f->nodes[p].accum ? f->nodes[p].accum_into : p;
    f->nodes[p].act = f->nodes[z].op;
    f->nodes[place].folded = true;
    if (sum >= 0) f->nodes[sum].same = f->nodes[sum].folded = true, f->nodes[sum].view = place;
    f->nodes[z].same = true, f->nodes[z].view = place;
  }
}

/* The push buffer, made when a vertex function first places a pushed value in it (see
 * plan_push_place): not a buffer of that function's type. */
static int push_buffer(Model *m) {
  if (m->push_buf < 0) {
    m->push_buf = add_buf(m, "push", m->pushed);
    m->bufs[m->push_buf].vertex = -2;
  }
  return m->push_buf;
}

/* plan_place's steps, over f's nodes with the plan fp: first the merged products'
 * buffers (and, where a merge stacks, the children's rows side by side, child k at k
 * times the state's width: read with the state's width as the stride, they are one
 * matrix of the children's rows, interleaved) */
static void place_merges(Model *m, IrFunc *f, FPlan *fp) {
  int *mto = arena_alloc(sizeof(int) * (size_t)(f->nmerges + 1));
  plan_accum(m, f, mto);
  /* a stacked product's output: the children's side by side; a merge that adds into
     another, that one's */
  fp->stacked = false;
  for (int g = 0; g < f->nmerges; g++) {
    const MatMerge *mg = &f->merges[g];
    Lin cols = mg->stack ? lin_scale(mg->cols, mg->stack) : mg->cols;
    fp->mbuf[g] = mto[g] >= 0 ? -1 : add_buf(m, arena_printf("%s_mm%d", f->name, g), cols);
    fp->stacked |= mg->stack > 0;
  }
  for (int g = 0; g < f->nmerges; g++)
    if (mto[g] >= 0) fp->mbuf[g] = fp->mbuf[mto[g]];
  fp->cw = f->kind == F_VERTEX && f->children ? ir_child_width(m, f, 0) : lin_const(0);
  fp->gbuf = fp->stacked ? add_buf(m, arena_printf("%s_children", f->name), lin_scale(fp->cw, f->children)) : -1;
}

/* which values have a buffer of their own making (or share one by redirection) */
static void place_owners(const Model *m, const IrFunc *f, FPlan *fp) {
  int n = f->n;
  for (int i = 0; i < n; i++) {
    const IrNode *x = &f->nodes[i];
    if (x->uses == 0 || x->type != T_ROW) continue;
    switch (op_info[x->op].kind) {
    case OK_GATHER:
    case OK_LOOKUP:
    case OK_EDGE:
    case OK_DROP:
    case OK_RMAT:
    case OK_MOE:
    case OK_CONCAT: fp->own[i] = !x->accum; break;
    case OK_GEMM: fp->own[i] = x->mm < 0 && !x->accum; break;
    case OK_EW: fp->own[i] = leaves_group(f, i) && !x->same; break;
    default: break;
    }
  }
  /* the pull block's values are read by the vertex functions */
  if (f->kind == F_PULL)
    for (int s = 0; s < m->npulls; s++) {
      int i = m->pulls[s].node;
      if (f->nodes[i].uses && op_info[f->nodes[i].op].kind == OK_EW) fp->own[i] = true;
    }
}

/* the operands of a concat computed in place, in its columns */
static void place_concats(const IrFunc *f, FPlan *fp) {
  int n = f->n;
  for (int q = 0; q < n; q++) {
    const IrNode *c = &f->nodes[q];
    if (c->op != OP_CONCAT || c->uses == 0) continue;
    Lin off = lin_const(0);
    for (int j = 0; j < c->nargs; j++) {
      int a = c->args[j];
      bool twice = false;
      for (int k = 0; k < c->nargs; k++) twice |= k != j && c->args[k] == a;
      bool unplaced = fp->own[a] && fp->redir[a] < 0 && fp->rbuf[a] < 0;
      if (unplaced && !twice && !(fp->stacked && f->nodes[a].op == OP_GATHER)) {
        fp->redir[a] = q;
        fp->roff[a] = off;
      }
      off = lin_add(off, f->nodes[a].width);
    }
  }
}

/* the values scattered and pushed written straight into the state and push buffers */
static void place_stores(Model *m, const IrFunc *f, FPlan *fp, int npushers) {
  int n = f->n;
  /* scatter writes the state buffer; push the push buffer. Scatters first: a value both
     scattered and pushed goes to the state, which the push block may read in place */
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < n; i++) {
      const IrNode *s = &f->nodes[i];
      if (s->op != (pass ? OP_PUSH : OP_SCATTER)) continue;
      int a = s->args[0];
      if (s->op == OP_PUSH && npushers != 1) continue;
      if (fp->stacked && f->nodes[a].op == OP_GATHER) continue;
      if (fp->own[a] && fp->redir[a] < 0 && fp->rbuf[a] < 0)
        fp->rbuf[a] = s->op == OP_SCATTER ? f->state_buf : push_buffer(m);
    }
}

/* each value's place: owners resolved backwards (redirect targets come later), then
 * views forwards */
static void place_values(Model *m, IrFunc *f, const FPlan *fp) {
  int n = f->n;
  /* owners, backwards ... */
  for (int i = n - 1; i >= 0; i--) {
    IrNode *x = &f->nodes[i];
    x->val.kind = PL_NONE;
    if (x->uses == 0 && x->type != T_NONE) continue;
    if (fp->stacked && x->op == OP_GATHER) x->val = row_place(m, fp->gbuf, lin_scale(fp->cw, x->ref));
    else if (fp->redir[i] >= 0) x->val = shift(f->nodes[fp->redir[i]].val, fp->roff[i]);
    else if (fp->rbuf[i] >= 0) x->val = row_place(m, fp->rbuf[i], lin_const(0));
    else if (fp->own[i]) {
      const char *name = x->name ? arena_printf("%s_%s", f->name, x->name) : arena_printf("%s_t%d", f->name, i);
      x->val = row_place(m, add_buf(m, name, x->width), lin_const(0));
    }
  }
  /* ... and views forwards */
  Lin zero = lin_const(0);
  for (int i = 0; i < n; i++) {
    IrNode *x = &f->nodes[i];
    if (x->uses == 0 && x->type != T_NONE) continue;
    if (x->val.kind != PL_NONE || (x->accum && x->mm < 0)) continue;
    if (x->same) { /* (at a's place: a is placed, or a view of what precedes it) */
      x->val = f->nodes[x->view].val;
      continue;
    }
    switch (x->op) {
    case OP_SLICE: x->val = shift(f->nodes[x->args[0]].val, x->lo); break;
    case OP_PULL: x->val = m->pull->nodes[m->pulls[x->ref].node].val; break;
    case OP_PUSHARG: x->val = row_place(m, m->push_buf, m->push_off); break;
    case OP_MATMUL: {
      const MatMerge *mg = &f->merges[x->mm];
      Place p = row_place(m, fp->mbuf[x->mm], zero);
      for (int k = 0; k < mg->n && mg->members[k] != i; k++)
        p.off = lin_add(p.off, f->nodes[mg->members[k]].width);
      x->val = p;
      break;
    }
    case OP_INPUT:
      if (x->type == T_ROW)
        x->val = (Place){.kind = PL_INPUT, .buf = x->ref, .off = zero, .ld = x->width};
      break;
    case OP_PARAM: {
      const Param *p = &m->params[x->ref];
      x->val = (Place){.kind = PL_PARAM, .buf = p->pgroup, .off = p->col_off, .ld = m->pgroups[p->pgroup].cols};
      break;
    }
    default:
      if (op_info[x->op].kind == OK_EW) x->val.kind = PL_REG;
      break;
    }
  }
}

/* what is left once every value has its place: products that add into another value,
 * the gradients' places, what is kept, and which rows each new buffer (from b0) holds */
static void place_finish(Model *m, IrFunc *f, int b0) {
  int n = f->n;
  /* a product that adds into another value: at that value's place (a merge's
     products are at its columns already) */
  for (int i = 0; i < n; i++)
    if (f->nodes[i].accum && f->nodes[i].mm < 0) f->nodes[i].val = f->nodes[f->nodes[i].accum_into].val;
  for (int i = 0; i < n; i++) {
    IrNode *x = &f->nodes[i];
    x->dval = x->val;
    if (x->grad && x->val.kind == PL_ROW) m->bufs[x->val.buf].grad = true;
  }
  plan_keep(m, f);
  for (int b = b0; b < m->nbufs && f->kind == F_VERTEX; b++)
    if (b != m->push_buf) m->bufs[b].vertex = f->index;
  /* the push block's buffers hold values at the rows of the types that push alone (the
     runtime runs it there) */
  for (int b = b0; b < m->nbufs && f->kind == F_PUSH; b++) m->bufs[b].vertex = -2;
  /* the pull block's, at the rows of the types that read it (the runtime runs it there) */
  for (int b = b0; b < m->nbufs && f->kind == F_PULL; b++) m->bufs[b].pull = true;
  /* a buffer holds edge rows or vertex rows, never both */
  for (int i = 0; i < n; i++) {
    const IrNode *x = &f->nodes[i];
    const Place *ps[2] = {&x->val, x->keep ? &x->kval : NULL};
    for (int k = 0; k < 2; k++) {
      if (!ps[k] || ps[k]->kind != PL_ROW) continue;
      Buf *b = &m->bufs[ps[k]->buf];
      cv_assert(ps[k]->buf >= b0 || !x->edge);
      if (x->edge) b->edge = true;
    }
  }
  for (int i = 0; i < n; i++) {
    const IrNode *x = &f->nodes[i];
    const Place *ps[2] = {&x->val, x->keep ? &x->kval : NULL};
    for (int k = 0; k < 2; k++) {
      if (!ps[k] || ps[k]->kind != PL_ROW) continue;
      cv_assert(ps[k]->buf >= b0 || !x->slot);
      if (x->slot) m->bufs[ps[k]->buf].slot = true;
    }
  }
  for (int i = 0; i < n; i++) {
    const IrNode *x = &f->nodes[i];
    if (x->val.kind == PL_ROW) cv_assert(m->bufs[x->val.buf].edge == x->edge && m->bufs[x->val.buf].slot == x->slot);
  }
  /* a buffer of slot values holds a row's K slots side by side, [rows, K * width]: slot
     s of the stage's rows [r0, r0 + n) is its row K r0 + s, read with the width (the
     places' ld, set above) as the stride; K r0 ... K (r0 + n) - 1 are the stage's */
  for (int b = b0; b < m->nbufs; b++)
    if (m->bufs[b].slot) m->bufs[b].width = lin_scale(m->bufs[b].width, f->route_k);
}

/* Where f's values live: buffers, places, what is kept for the backward pass. */
static void plan_place(Model *m, IrFunc *f, int npushers) {
  int n = f->n, b0 = m->nbufs;
  FPlan fp;
  fp.own = arena_alloc(sizeof(bool) * (size_t)(n + 1));
  fp.redir = arena_alloc(sizeof(int) * (size_t)(n + 1));
  fp.roff = arena_alloc(sizeof(Lin) * (size_t)(n + 1));
  fp.rbuf = arena_alloc(sizeof(int) * (size_t)(n + 1));
  fp.mbuf = arena_alloc(sizeof(int) * (size_t)(f->nmerges + 1));
  for (int i = 0; i < n; i++) fp.redir[i] = fp.rbuf[i] = -1;
  place_merges(m, f, &fp);
  place_owners(m, f, &fp);
  place_concats(f, &fp);
  place_stores(m, f, &fp, npushers);
  place_values(m, f, &fp);
  place_finish(m, f, b0);
}

/* Whether node x is a unit of its own: an op with code of its own (a product, a lookup,
   ...), or a scatter or push whose value was not computed in place */
static bool own_code(const Model *m, const IrFunc *f, const IrNode *x) {
  switch (op_info[x->op].kind) {
  case OK_GEMM: case OK_LOOKUP: case OK_CONCAT: case OK_GATHER: case OK_LOSS: case OK_EDGE: case OK_DROP: case OK_RMAT: case OK_MOE: return true;
  case OK_SINK: {
    const IrNode *a = &f->nodes[x->args[0]];
    int want = x->op == OP_SCATTER ? f->state_buf : m->push_buf;
    Lin at = x->op == OP_SCATTER ? lin_const(0) : m->push_off;
    return !(a->val.kind == PL_ROW && a->val.buf == want && lin_eq(a->val.off, at));
  }
  default: return false;
  }
}

/* f's units in source order into raw (room for f->n), each node's unit set: a fused
   group's or a merged product's at its first node, a node with code of its own; a value
   nothing uses and a view of its operand's place have none. Returns how many. */
static int raw_units(const Model *m, IrFunc *f, Unit *raw) {
  int *gunit = arena_alloc(sizeof(int) * (size_t)(f->ngroups + 1));
  int *munit = arena_alloc(sizeof(int) * (size_t)(f->nmerges + 1));
  for (int g = 0; g < f->ngroups; g++) gunit[g] = -1;
  for (int g = 0; g < f->nmerges; g++) munit[g] = -1;
  int nraw = 0;
  for (int i = 0; i < f->n; i++) {
    IrNode *x = &f->nodes[i];
    x->unit = -1;
    if (x->uses == 0 && x->type != T_NONE) continue;
    if (x->same) continue; /* (no loop: a view of its operand's place) */
    if (x->group >= 0) {
      if (gunit[x->group] < 0) {
        gunit[x->group] = nraw;
        raw[nraw++] = (Unit){U_GROUP, x->group, x->cls};
      }
      x->unit = gunit[x->group];
    } else if (x->op == OP_MATMUL && x->mm >= 0) {
      if (munit[x->mm] < 0) {
        munit[x->mm] = nraw;
        raw[nraw++] = (Unit){U_MATMUL, x->mm, x->cls};
      }
      x->unit = munit[x->mm];
    } else if (own_code(m, f, x)) {
      x->unit = nraw;
      raw[nraw++] = (Unit){U_NODE, i, x->cls};
    }
  }
  return nraw;
}

/* Whether raw unit u can run once the units marked done have: every operand of its
   nodes produced (prod: each node's producing unit; a concat's operands computed into
   its buffer among them, which keeps the dump readable), and a product that adds into
   a value after that value */
static bool unit_ready(const IrFunc *f, const int *prod, const bool *done, int u) {
  for (int i = 0; i < f->n; i++) {
    const IrNode *x = &f->nodes[i];
    if (x->unit != u) continue;
    /* an op on the routed slots reads the routing too, which no operand names: without
       it, a product's slots could run before the gate's topk (a group holding the gate's
       input and a later product, found by a helper's differential testing) */
    bool routed = f->route >= 0 && i != f->route &&
                  (x->slot || x->op == OP_SBCAST || x->op == OP_EMM || x->op == OP_EROW || x->op == OP_SCOMB);
    for (int j = 0; j <= x->nargs + 1; j++) {
      int a = j < x->nargs ? x->args[j] : j == x->nargs ? (x->accum ? x->accum_into : -1) : routed ? f->route : -1;
      int p = a >= 0 ? prod[a] : -1;
      if (p >= 0 && p != u && !done[p]) return false;
    }
  }
  return true;
}

/* f's execution units (fused groups, merged products, ops with code of their own) in
 * an order that respects their dependencies: of the units ready, the first in source
 * order, each time. */
static void plan_units(Model *m, IrFunc *f) {
  int n = f->n;
  f->units = arena_alloc(sizeof(Unit) * (size_t)(n + 1));
  Unit *raw = arena_alloc(sizeof(Unit) * (size_t)(n + 1));
  int nraw = raw_units(m, f, raw);
  /* producer unit of each node (views: their parent's) */
  int *prod = arena_alloc(sizeof(int) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    IrNode *x = &f->nodes[i];
    prod[i] = x->unit;
    if (x->unit < 0 && x->op == OP_SLICE) prod[i] = prod[x->args[0]];
    /* (a view of a's place is complete when the product that adds into it has run) */
    if (x->same && x->op == OP_ADD) prod[i] = prod[f->nodes[x->args[0]].accum ? x->args[0] : x->args[1]];
    else if (x->same) prod[i] = prod[x->args[0]]; /* (an activation: its product's, or its add's) */
  }
  bool *done = arena_alloc(sizeof(bool) * (size_t)(nraw + 1));
  for (int k = 0; k < nraw; k++)
    for (int u = 0; u < nraw; u++)
      if (!done[u] && unit_ready(f, prod, done, u)) {
        done[u] = true;
        f->units[f->nunits++] = raw[u];
        break;
      }
  cv_assert(f->nunits == nraw);
  /* renumber node->unit to the final order */
  int *final = arena_alloc(sizeof(int) * (size_t)(nraw + 1));
  for (int k = 0; k < f->nunits; k++)
    for (int u = 0; u < nraw; u++)
      if (raw[u].kind == f->units[k].kind && raw[u].index == f->units[k].index) final[u] = k;
  for (int i = 0; i < n; i++)
    if (f->nodes[i].unit >= 0) f->nodes[i].unit = final[f->nodes[i].unit];
}

/* Is concat node x made of values computed in place (no copy): each operand in x's
   buffer at its own columns? */
bool concat_in_place(const IrFunc *f, const IrNode *x) {
  Lin off = x->val.off;
  for (int k = 0; k < x->nargs; k++) {
    const IrNode *a = &f->nodes[x->args[k]];
    if (a->val.kind != PL_ROW || a->val.buf != x->val.buf || !lin_eq(a->val.off, off)) return false;
    off = lin_add(off, a->width);
  }
  return true;
}

/* Does nothing read or write buffer b of vertex function f at a row without children?
 * Then its rows there need not be written (a product's output is not cleared there, a
 * fused loop stores no zero there), a gather need not fill them, and a gathered buffer
 * may even be a view of the state buffer (the runtime points it at the children's rows
 * where they lie in one block: scheduler.c, plan_views), where those rows would show
 * another vertex's state. It holds if every value in b is zero or dead there (fuse.c)
 * and is a gather, a slice, a concat of values laid side by side where they are
 * (Tree-FC's), a product (which skips those rows: prod_code), a fused loop's member
 * (whose loop, split at the leaves, then stores nothing there: group_fwd_part) or a
 * member's kept value (neither part at the leaves stores or loads it); and every reader
 * is a fused loop (whose part at the leaves reads zero instead, or does not compute the
 * value: leaf_simpler), the left operand of a product (which skips those rows too), or
 * a slice or such a concat, or an ebcast (a row read on its edges only). Gradients follow the same uses, so they too are formed only
 * at rows with children. */
bool leaves_untouched(const IrFunc *f, int b) {
  if (f->kind != F_VERTEX) return false;
  int held = 0;
  for (int i = 0; i < f->n; i++) {
    const IrNode *x = &f->nodes[i];
    if (x->keep && x->kval.kind == PL_ROW && x->kval.buf == b) {
      if (!(x->zero_leaf || x->dead_leaf)) return false;
      held++;
    }
    if ((x->uses == 0 && x->type != T_NONE) || x->val.kind != PL_ROW || x->val.buf != b) continue;
    held++;
    bool kind = x->op == OP_GATHER || op_info[x->op].kind == OK_SLICE || x->op == OP_MATMUL ||
                (op_info[x->op].kind == OK_EW && x->group >= 0) || (x->op == OP_CONCAT && concat_in_place(f, x));
    if (!kind || !(x->zero_leaf || x->dead_leaf)) return false;
    for (int j = 0; j < f->n; j++) {
      const IrNode *u = &f->nodes[j];
      if (u->uses == 0 && u->type != T_NONE) continue;
      for (int a = 0; a < u->nargs; a++) {
        if (u->args[a] != i) continue;
        bool ok = op_info[u->op].kind == OK_SLICE || (op_info[u->op].kind == OK_EW && u->group >= 0) ||
                  (u->op == OP_MATMUL && a == 0) || (u->op == OP_CONCAT && concat_in_place(f, u)) ||
                  u->op == OP_EBCAST; /* which reads only rows with edges: with children */
        if (!ok) return false;
      }
    }
  }
  return held > 0;
}

/* Gradients set, not added to (IrNode.grad_set, IrNode.dx_set), and buffers that need
 * no clearing (Buf.grad_whole). A value's gradient may be set rather than added to by
 * the first write to it in the backward pass, where that write covers every row the
 * gradient is read at and the value has its columns of its buffer to itself:
 *   - a product, or a slice of a gather, whose every use is in one fused group gets its
 *     gradient from that group's backward loop alone, which covers every row of the
 *     type (at the leaves, a value zero or dead there is read by nothing: its buffer
 *     must then be one nothing touches at the leaves);
 *   - the left operand of a product whose dx is the first write to its gradient (the
 *     backward pass runs the lazy stage, then the path stage, then the eager one, each
 *     in reverse: plan_units's order) is set by that product (CAVS_PROD_DX_SET), and
 *     what comes after adds to it; at the rows with children only, where the product
 *     skips the leaves, in a buffer nothing touches at the leaves.
 * A buffer whose every gradient is such, side by side over its whole width, is written
 * whole before it is read: no clear, and a store instead of a load and a store. In the
 * Tree-LSTM that is the gates' pre-activations (their loop's), hs (its product's) and
 * the children's gathered rows (c_k the loop's, h_k the product [h_0;h_1] @ Uf's, then
 * hs's loop adds): 3H + H + 4H of the 8H + E floats a row the backward pass once
 * cleared. The same for an expert's product and row of a table (emm, erow: values of
 * their own, per slot), whose group's loop covers every slot of the stage's rows (in a
 * mixture of two-layer experts, the two bias rows', into which the products add:
 * plan_accum). A set into a gathered buffer holds only where the buffer is whole: the
 * runtime reads a gathered buffer as a view of the children's state (scheduler.c,
 * plan_views) only where it is cleared and added to, and a set there would overwrite
 * the state's gradient. So the new kinds of set (a slice's, a product's dx) are kept
 * only in buffers that end up whole. */

/* Is every use of gather g of f a slice of it? */
static bool only_sliced(const IrFunc *f, int g) {
  for (int j = g + 1; j < f->n; j++) {
    const IrNode *u = &f->nodes[j];
    if (u->uses == 0 && u->type != T_NONE) continue;
    for (int a = 0; a < u->nargs; a++)
      if (u->args[a] == g && op_info[u->op].kind != OK_SLICE) return false;
  }
  return true;
}

/* Does node i of f have its gradient's columns of its buffer to itself (no other
 * gradient of any block lies over them but, where it is a slice of a gather read only
 * through slices, that gather's: the union of its slices')? */
static bool region_alone(const Model *m, const IrFunc *f, int i) {
  const IrNode *x = &f->nodes[i];
  const Place *p = &x->dval;
  if (p->kind != PL_ROW || x->edge || x->slot || p->buf == f->state_buf || is_state(m, p->buf) ||
      p->buf == m->push_buf || !lin_eq(p->ld, m->bufs[p->buf].width))
    return false;
  int whole = op_info[x->op].kind == OK_SLICE && f->nodes[x->args[0]].op == OP_GATHER && only_sliced(f, x->args[0])
                  ? x->args[0]
                  : -1;
  int nf;
  IrFunc **fs = model_funcs(m, &nf);
  for (int k = 0; k < nf; k++) {
    const IrFunc *h = fs[k];
    for (int j = 0; j < h->n; j++) {
      const IrNode *y = &h->nodes[j];
      if ((h == f && (j == i || j == whole)) || (y->uses == 0 && y->type != T_NONE)) continue;
      if (y->dval.kind != PL_ROW || y->dval.buf != p->buf) continue;
      Lin yw = y->slot ? lin_scale(y->width, h->route_k) : y->width;
      bool apart = lin_eq(y->dval.ld, p->ld) && (lin_le(lin_add(y->dval.off, yw), p->off) ||
                                                 lin_le(lin_add(p->off, x->width), y->dval.off));
      if (!apart) return false;
    }
  }
  return true;
}

/* Unit u's place in f's backward pass (lower first): the lazy stage, then the path
   stage, then the eager one (scheduler.c), each in reverse */
static int bwd_rank(const IrFunc *f, int u) {
  Class c = f->units[u].cls;
  return (c == CLS_LAZY ? 0 : c == CLS_PATH ? 1 : 2) * (f->nunits + 1) + (f->nunits - 1 - u);
}

/* The left operands of product unit u of vertex function f (a merge's members share
   one; a stacked merge's read one child each), and whether the product skips the
   leaves (prod_code's rows: ROWS_WITH_CHILDREN); false where its rows are those of an
   index (a pulled lookup's), which the products of a vertex never set */
static bool product_lefts(const IrFunc *f, const Unit *un, int *left, int *nleft, bool *skips) {
  const IrNode *first;
  *nleft = 0;
  if (un->kind == U_MATMUL) {
    const MatMerge *mg = &f->merges[un->index];
    first = &f->nodes[mg->members[0]];
    if (mg->stack)
      for (int k = 0; k < mg->n; k++) left[(*nleft)++] = f->nodes[mg->members[k]].args[0];
    else left[(*nleft)++] = mg->left;
  } else {
    first = &f->nodes[un->index];
    left[(*nleft)++] = first->args[0];
  }
  for (int k = 0; k < *nleft; k++)
    if (f->nodes[left[k]].op == OP_PULL) return false; /* (a pull's gradient: every type's) */
  *skips = f->nodes[left[0]].zero_leaf || first->dead_leaf;
  return true;
}

/* Is the dx of product unit u of vertex function f the first write to the gradient of
   left operand L: is every other use of L in a unit that comes after u backward? */
static bool dx_first(const Model *m, const IrFunc *f, int u, int L) {
  const IrNode *x = &f->nodes[L];
  if (!x->grad || x->val.kind != PL_ROW || x->accum || x->keep || !region_alone(m, f, L)) return false;
  for (int j = 0; j < f->n; j++) {
    const IrNode *y = &f->nodes[j];
    if (y->accum && y->accum_into == L) return false; /* (its gradient is L's) */
    if (y->uses == 0 && y->type != T_NONE) continue;
    for (int a = 0; a < y->nargs; a++) {
      if (y->args[a] != L) continue;
      if (y->unit == u && y->op == OP_MATMUL && a == 0) continue;
      if (y->unit < 0 || y->unit == u || bwd_rank(f, y->unit) <= bwd_rank(f, u)) return false;
    }
  }
  return true;
}

/* Do regions (off[k], width[k]) tile [0, width) side by side, each once? */
static bool tile(const Lin *off, const Lin *w, int n, Lin width) {
  bool *used = arena_alloc(sizeof(bool) * (size_t)(n + 1));
  Lin at = lin_const(0);
  for (int done = 0; done < n; done++) {
    int k = 0;
    while (k < n && (used[k] || !lin_eq(off[k], at))) k++;
    if (k == n) return false;
    used[k] = true;
    at = lin_add(at, w[k]);
  }
  return lin_eq(at, width);
}

static bool whole_bufs(Model *m, IrFunc **fs, int nf, bool **fresh, bool **by_dx, bool **inner);
static void plan_grad_set(Model *m) {
  int nf;
  IrFunc **fs = model_funcs(m, &nf);
  /* which grad_set and dx_set are of the new kinds, kept only in whole buffers */
  bool **fresh = arena_alloc(sizeof(bool *) * (size_t)(nf + 1));
  /* the values whose gradient a product's dx sets, and whether only at rows with
     children */
  bool **by_dx = arena_alloc(sizeof(bool *) * (size_t)(nf + 1)), **inner = arena_alloc(sizeof(bool *) * (size_t)(nf + 1));
  for (int k = 0; k < nf; k++) {
    IrFunc *f = fs[k];
    fresh[k] = arena_alloc(sizeof(bool) * (size_t)(f->n + 1));
    by_dx[k] = arena_alloc(sizeof(bool) * (size_t)(f->n + 1));
    inner[k] = arena_alloc(sizeof(bool) * (size_t)(f->n + 1));
    for (int i = 0; i < f->n; i++) {
      IrNode *x = &f->nodes[i];
      bool slice = f->kind == F_VERTEX && op_info[x->op].kind == OK_SLICE && x->val.kind == PL_ROW &&
                   region_alone(m, f, i) && !x->keep;
      if ((x->op != OP_MATMUL && x->op != OP_EMM && x->op != OP_EROW && !slice) || !x->grad ||
          x->val.kind != PL_ROW || x->uses == 0 || x->accum || x->folded)
        continue;
      int group = -2, uses = 0;
      for (int j = i + 1; j < f->n; j++)
        for (int a = 0; a < f->nodes[j].nargs; a++) {
          if (f->nodes[j].args[a] != i) continue;
          uses++;
          if (group == -2) group = f->nodes[j].group;
          else if (group != f->nodes[j].group) group = -1;
        }
      /* (not a row of width 1 the group broadcasts: every column adds to it) */
      x->grad_set = uses == x->uses && group >= 0 && lin_eq(f->groups[group].width, x->width);
      fresh[k][i] = slice && x->grad_set;
      inner[k][i] = x->zero_leaf || x->dead_leaf;
    }
    /* the products' dx, first to write their left operands' gradients */
    for (int u = 0; f->kind == F_VERTEX && u < f->nunits; u++) {
      const Unit *un = &f->units[u];
      if (!(un->kind == U_MATMUL || (un->kind == U_NODE && f->nodes[un->index].op == OP_MATMUL))) continue;
      int left[CV_MAX_CHILDREN + 1], nleft;
      bool skips;
      /* (a product no loss reaches writes no dx: autodiff.c) */
      if (!f->nodes[un->kind == U_MATMUL ? f->merges[un->index].members[0] : un->index].grad) continue;
      if (!product_lefts(f, un, left, &nleft, &skips)) continue;
      bool ok = true;
      for (int q = 0; q < nleft && ok; q++) ok = dx_first(m, f, u, left[q]) && !by_dx[k][left[q]];
      if (!ok) continue;
      f->nodes[un->kind == U_MATMUL ? f->merges[un->index].members[0] : un->index].dx_set = true;
      for (int q = 0; q < nleft; q++) by_dx[k][left[q]] = true, inner[k][left[q]] = skips;
    }
  }
  /* a slot value read only as the left operand of an expert's product (emm) or as the
     values a row's slots combine (scomb): its gradient is that op's backward alone,
     which writes every slot of the routings it runs over (cavs_emm_bwd with beta 0,
     cavs_scomb_bwd setting them: moe.c) */
  for (int k = 0; k < nf; k++) {
    IrFunc *f = fs[k];
    for (int i = 0; i < f->n; i++) {
      IrNode *x = &f->nodes[i];
      if (!x->grad || !x->slot || x->val.kind != PL_ROW || x->uses != 1) continue;
      for (int j = i + 1; j < f->n; j++) {
        const IrNode *u = &f->nodes[j];
        if ((u->op == OP_EMM || u->op == OP_SCOMB) && u->args[0] == i && u->args[1] != i) x->grad_set = true;
      }
    }
  }
  /* which buffers are whole; the new kinds of set kept only where theirs is, until
     nothing changes (a product's dx into two buffers, one of them not whole, sets
     neither) */
  while (whole_bufs(m, fs, nf, fresh, by_dx, inner)) {
  }
}

/* Buf.grad_whole from the sets of plan_grad_set: every buffer whose set gradients tile
 * its columns and which has no other; then the new kinds of set dropped where their
 * buffer is not whole. True when it dropped one (the buffers must be decided again). */
static bool whole_bufs(Model *m, IrFunc **fs, int nf, bool **fresh, bool **by_dx, bool **inner) {
  int *nset = arena_alloc(sizeof(int) * (size_t)(m->nbufs + 1)), *at = arena_alloc(sizeof(int) * (size_t)(m->nbufs + 1));
  bool *other = arena_alloc(sizeof(bool) * (size_t)(m->nbufs + 1));
  bool *leaves = arena_alloc(sizeof(bool) * (size_t)(m->nbufs + 1)); /* a set skips the leaves */
  Lin **off = arena_alloc(sizeof(Lin *) * (size_t)(m->nbufs + 1)), **wid = arena_alloc(sizeof(Lin *) * (size_t)(m->nbufs + 1));
  for (int pass = 0; pass < 2; pass++)
    for (int k = 0; k < nf; k++) {
      const IrFunc *f = fs[k];
      for (int i = 0; i < f->n; i++) {
        const IrNode *x = &f->nodes[i];
        /* (a product that adds into a value has that value's gradient: counted there; a
           gather read only through slices has theirs) */
        if (!x->grad || x->dval.kind != PL_ROW || x->accum || x->folded) continue;
        if (x->op == OP_GATHER && f->kind == F_VERTEX && only_sliced(f, i)) continue;
        int b = x->dval.buf;
        if (!x->grad_set && !by_dx[k][i]) {
          other[b] = true;
          continue;
        }
        if (pass == 0) {
          nset[b]++;
          continue;
        }
        if (!off[b]) {
          off[b] = arena_alloc(sizeof(Lin) * (size_t)nset[b]);
          wid[b] = arena_alloc(sizeof(Lin) * (size_t)nset[b]);
        }
        /* (a slot value's buffer holds a row's K slots side by side) */
        off[b][at[b]] = x->dval.off;
        wid[b][at[b]++] = x->slot ? lin_scale(x->width, f->route_k) : x->width;
        /* (only the new kinds ask: a product's gradient its loop sets is set at the
           leaves by the loop's part there, or read there by nothing) */
        if ((fresh[k][i] || by_dx[k][i]) && inner[k][i]) leaves[b] = true;
      }
    }
  for (int b = 0; b < m->nbufs; b++) {
    int v = m->bufs[b].vertex;
    m->bufs[b].grad_whole = m->bufs[b].grad && !other[b] && !is_state(m, b) && b != m->push_buf && at[b] > 0 &&
                            tile(off[b], wid[b], at[b], m->bufs[b].width) &&
                            (!leaves[b] || (v >= 0 && v < m->nvertex && leaves_untouched(m->vertex[v], b)));
  }
  bool dropped = false;
  for (int k = 0; k < nf; k++) {
    IrFunc *f = fs[k];
    for (int i = 0; i < f->n; i++) {
      IrNode *x = &f->nodes[i];
      if (fresh[k][i] && !m->bufs[x->dval.buf].grad_whole) x->grad_set = fresh[k][i] = false, dropped = true;
    }
    for (int u = 0; f->kind == F_VERTEX && u < f->nunits; u++) {
      const Unit *un = &f->units[u];
      if (!(un->kind == U_MATMUL || (un->kind == U_NODE && f->nodes[un->index].op == OP_MATMUL))) continue;
      IrNode *first = &f->nodes[un->kind == U_MATMUL ? f->merges[un->index].members[0] : un->index];
      int left[CV_MAX_CHILDREN + 1], nleft;
      bool skips, all = true;
      if (!first->dx_set) continue;
      product_lefts(f, un, left, &nleft, &skips);
      for (int q = 0; q < nleft; q++) all &= m->bufs[f->nodes[left[q]].dval.buf].grad_whole;
      if (all) continue;
      first->dx_set = false;
      for (int q = 0; q < nleft; q++) by_dx[k][left[q]] = false;
      dropped = true;
    }
  }
  return dropped;
}

/* The rows the push block reads: the state itself where every type that pushes pushes
 * a value its scatter left in the state, at one column offset for all (a Tree-LSTM's h
 * in [c; h], a Tree-FC's h): the push block then reads h in place and adds its gradient
 * straight into the state's, with no copy either way and no buffer of pushed rows.
 * Only the rows of the types that push are read (the runtime runs the push block over
 * those alone), so a type that pushes nothing does not stop it. Elsewhere a buffer of
 * its own ([rows, pushed]), which each push copies to. */
static void plan_push_place(Model *m) {
  bool view = m->push_buf < 0 && !m->typed && m->state_buf >= 0 && !m->no_push_view;
  bool first = true;
  Lin off = lin_const(0);
  for (int v = 0; v < m->nvertex && view; v++) {
    const IrFunc *f = m->vertex[v];
    for (int i = 0; i < f->n && view; i++) {
      if (f->nodes[i].op != OP_PUSH) continue;
      const Place *p = &f->nodes[f->nodes[i].args[0]].val;
      view = p->kind == PL_ROW && p->buf == m->state_buf && lin_eq(p->ld, m->bufs[m->state_buf].width) &&
             (first || lin_eq(p->off, off));
      off = p->off;
      first = false;
    }
  }
  if (view && !first) {
    m->push_buf = m->state_buf;
    m->push_off = off;
  } else
    push_buffer(m);
}

void plan(Model *m) {
  plan_params(m);
  /* the state: one every type scatters, or with named slots one per type that scatters
     (only its rows hold values) */
  m->state_buf = m->typed ? -1 : add_buf(m, "state", m->state);
  for (int v = 0; v < m->nvertex; v++) {
    IrFunc *f = m->vertex[v];
    f->state_buf = !m->typed ? m->state_buf : f->scatters ? add_buf(m, arena_printf("%s_state", f->name), f->state) : -1;
    if (f->state_buf >= 0) m->bufs[f->state_buf].grad = true;
    if (m->typed && f->state_buf >= 0) m->bufs[f->state_buf].vertex = v;
  }
  m->push_buf = -1; /* made when needed: plan_push_place */
  m->push_off = lin_const(0);
  int npushers = 0;
  for (int v = 0; v < m->nvertex; v++) {
    IrFunc *f = m->vertex[v];
    f->index = v;
    for (int i = 0; i < f->n; i++) f->pushes |= f->nodes[i].op == OP_PUSH;
    npushers += f->pushes;
  }
  if (m->pull) plan_place(m, m->pull, npushers);
  for (int v = 0; v < m->nvertex; v++) plan_place(m, m->vertex[v], npushers);
  if (m->push) plan_push_place(m);
  if (m->pull) plan_units(m, m->pull);
  for (int v = 0; v < m->nvertex; v++) plan_units(m, m->vertex[v]);
  if (m->push) {
    plan_place(m, m->push, npushers);
    plan_units(m, m->push);
  }
  if (m->push_buf >= 0) m->bufs[m->push_buf].grad = true;
  plan_grad_set(m);
}

/* ---- cavsc --report ---- */

void report(FILE *out, const Model *m) {
  int nf;
  IrFunc **fs = model_funcs(m, &nf);
  char w[128];
  for (int k = 0; k < nf; k++) {
    const IrFunc *f = fs[k];
    if (f->kind == F_VERTEX) fprintf(out, "vertex %s (children %d)\n", f->name, f->children);
    else fprintf(out, "%s\n", f->kind == F_PULL ? "pull" : "push");
    fprintf(out, "  %-5s %-4s %-14s %-10s %-6s %-8s %s\n", "line", "node", "op", "name", "class", "group", "width");
    for (int i = 0; i < f->n; i++) {
      const IrNode *x = &f->nodes[i];
      if (x->uses == 0 && x->type != T_NONE) continue;
      if (x->op == OP_PARAM || x->op == OP_CONST || x->op == OP_INPUT) continue;
      char grp[32] = "-";
      if (x->group >= 0) snprintf(grp, sizeof grp, "g%d", x->group);
      else if (x->op == OP_MATMUL && x->mm >= 0) snprintf(grp, sizeof grp, "mm%d", x->mm);
      /* (a view of another value's place: = that value) */
      if (x->same) snprintf(grp, sizeof grp, "=%%%d", x->view);
      /* (a product added into another value's place: += that value) */
      if (x->accum)
        snprintf(grp + (x->mm >= 0 ? strlen(grp) : 0), sizeof grp - (x->mm >= 0 ? strlen(grp) : 0), "+=%%%d", x->accum_into);
      const char *opn = op_info[x->op].name;
      if (x->op == OP_MATMUL) opn = arena_printf("@ %s", f->nodes[x->args[1]].name);
      if (x->act) opn = arena_printf("%s %s", opn, op_info[x->act].name); /* (applied as it stores) */
      fprintf(out, "  %-5d %%%-3d %-14s %-10s %-6s %-8s %s\n", x->loc.line, i, opn,
              x->name ? x->name : "", cls_name(x->cls), grp,
              x->type == T_ROW ? arena_printf("[%s]", lin_str(m, x->width, w, sizeof w)) : "");
    }
    fprintf(out, "  schedule:");
    for (int u = 0; u < f->nunits; u++) {
      const Unit *un = &f->units[u];
      if (un->kind == U_GROUP) fprintf(out, " g%d", un->index);
      else if (un->kind == U_MATMUL) fprintf(out, " mm%d", un->index);
      else fprintf(out, " %%%d", un->index);
      fprintf(out, "(%s)", cls_name(un->cls));
    }
    fputc('\n', out);
    fprintf(out, "  backward:");
    for (int u = f->nunits - 1; u >= 0; u--) {
      const Unit *un = &f->units[u];
      if (un->kind == U_GROUP) fprintf(out, " g%d'(%s)", un->index, cls_name(un->cls));
      else if (un->kind == U_MATMUL) fprintf(out, " mm%d'(%s)", un->index, cls_name(un->cls));
      else fprintf(out, " %%%d'(%s)", un->index, cls_name(un->cls));
    }
    fprintf(out, "; parameter gradients (lazy, over all rows):");
    for (int i = 0; i < f->n; i++) {
      const IrNode *x = &f->nodes[i];
      if (x->op == OP_PARAM && x->uses) fprintf(out, " d%s", x->name);
    }
    fprintf(out, "\n\n");
  }
}

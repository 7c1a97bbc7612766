/* autodiff.c: symbolic differentiation, at compile time. The derivative of every op is
 * a rule in ops.def (DA, DB for elementwise ops; the structural ops' rules are the duals
 * listed below); this pass decides which nodes are live and which receive a gradient,
 * and --dump=ad prints, for every node in reverse order, the gradient statements the
 * emitters produce from those rules.
 *
 *   y = a @ W        da += dy @ W^T (in y's phase); dW += a^T dy (over all rows, lazily)
 *   y = W[idx]       dW[idx] += dy   (a sparse row update)
 *   y = concat(a..)  da += dy[:, off:off+w]   (free when `a` is placed inside y)
 *   y = s[lo:hi]     ds[:, lo:hi] += dy       (a view: free)
 *   y = gather(k)    dstate[child k] += dy    (gradients meet at a child by +=, so a
 *                                              vertex with several parents is right)
 *   per edge e (parent p, child k) of a `children *` vertex:
 *   y = echild       dstate[k] += dy[e]
 *   y = ebcast(a)    da[p] += dy[e]            (summed over p's edges)
 *   y = esum(a)      da[e] += dy[p]
 *   y = dropout(a, p)  da += dy * mask / (1 - p)   (training; in inference y = a)
 *   y = noise(a)       da += dy * z   (z the training pass's normal draws; in inference y = 0)
 *   a mixture of experts, per slot s (row r, expert e) of a row's K:
 *   w = topk(g)      dg[r, i] += w[i] (dw[r, i] - sum_j w[j] dw[r, j])   (i, j kept)
 *   y = sbcast(a)    da[r] += dy[s]            (summed over r's slots)
 *   y = emm(a, T)    da[s] += dy[s] T[e]^T; dT[e] += a[s]^T dy[s]   (T[e] = [A, B])
 *   y = erow(T)      dT[e] += dy[s]
 *   y = scomb(v, w)  dv[s] = w[r, e] dy[r]; dw[r, e] += dy[r] . v[s]
 *   y = mv(x, M)     dx += dy M^T, dM += x^T dy   (per row; M a matrix [A, B] per vertex)
 *   y = mm(M, W)     dM += dy W^T (per row); dW += M^T dy (summed over rows)
 *   scatter(x)       dx += dstate[this row]
 *   y = pull()       dpull[row] += dy;   push(x): dx += dpush[row]
 *   loss softmax_xent(z, t)   dz = (softmax(z) - onehot(t)) / labeled rows
 *   loss mse(p, t)            dp = 2 (p - t) / (rows * width); dt = -dp where t is
 *                             computed from parameters too (mse is symmetric)
 */
#include "cavsc.h"

#include <stdlib.h>
#include <string.h>

static void liveness(IrFunc *f) {
  for (int i = f->n - 1; i >= 0; i--) {
    IrNode *n = &f->nodes[i];
    bool sink = n->type == T_NONE;
    if (!sink && n->uses == 0) continue;
    for (int j = 0; j < n->nargs; j++) f->nodes[n->args[j]].uses++;
  }
}

/* Gradients flow to nodes that depend on something trainable or on another vertex. */
static void gradients(const Model *m, IrFunc *f) {
  for (int i = 0; i < f->n; i++) {
    IrNode *n = &f->nodes[i];
    switch (n->op) {
    case OP_PARAM:
    case OP_GATHER:
    case OP_ECHILD:
    case OP_PUSHARG: n->grad = true; break;
    case OP_PULL: n->grad = m->pull->nodes[m->pulls[n->ref].node].grad; break;
    case OP_CONST:
    case OP_INPUT: n->grad = false; break;
    default:
      if (n->type != T_ROW) break;
      for (int j = 0; j < n->nargs; j++)
        if (f->nodes[n->args[j]].grad) n->grad = true;
      break;
    }
  }
}

/* ---- what a loss's gradient reaches ----
 *
 * gradients() says which nodes depend on something trainable; a gradient also needs a
 * way from a loss back to the node. The losses start it (and a mixture's gate whose
 * load-balancing loss has a weight: a number other than 0, or an option's); it flows
 * back through every operand of a node it reached; a vertex's scatter passes it on where
 * a gather of that type's state (an edge's child, for a `children *` block) was
 * reached, its push where the push block's argument was, and the pull block's value
 * where a vertex's pull of it was. The state is read in any block, so the blocks are
 * walked again until nothing changes. A node no way reaches keeps its value and loses
 * its gradient: what it would have sent back is 0 (or NaN, where the values it
 * multiplies overflowed: a block the loss does not read, whose parameters then had NaN
 * gradients), and is not computed. */

typedef struct Reach {
  bool *state; /* per vertex type (the first alone where the model is untyped): a gather of it reached */
  bool push;   /* the push block's argument reached */
  bool *pull;  /* per pull slot: a vertex's pull of it reached */
} Reach;

static bool gradient_source(const IrFunc *f, const IrNode *n) {
  if (op_info[n->op].kind == OK_LOSS) return true;
  if (n->op != OP_TOPK) return false;
  const IrNode *w = &f->nodes[n->args[1]];
  return w->ref != 0 || w->cval != 0;
}

/* The vertex type whose state gather or echild node n of f reads (0 untyped) */
static int state_read(const Model *m, const IrFunc *f, const IrNode *n) {
  if (!m->typed) return 0;
  return n->op == OP_ECHILD ? f->edge_type : f->slot_type ? f->slot_type[n->ref] : 0;
}

/* One walk of f (vertex type vi, or -1), backward, marking what is reached in mark;
   true when it reached a state, the push or a pull slot that was not before. (IrFunc's
   index is plan.c's, later.) */
static bool reach_func(const Model *m, const IrFunc *f, int vi, bool *mark, Reach *r) {
  bool grew = false;
  for (int i = f->n - 1; i >= 0; i--) {
    const IrNode *n = &f->nodes[i];
    if (n->uses == 0 && n->type != T_NONE) continue; /* dead (liveness) */
    if (!mark[i])
      mark[i] = gradient_source(f, n) || (n->op == OP_SCATTER && r->state[m->typed ? vi : 0]) ||
                (n->op == OP_PUSH && r->push);
    if (f->kind == F_PULL)
      for (int k = 0; k < m->npulls && !mark[i]; k++) mark[i] = m->pulls[k].node == i && r->pull[k];
    if (!mark[i]) continue;
    for (int j = 0; j < n->nargs; j++) mark[n->args[j]] = true;
    bool *flag = n->op == OP_GATHER || n->op == OP_ECHILD ? &r->state[state_read(m, f, n)]
                 : n->op == OP_PUSHARG                     ? &r->push
                 : n->op == OP_PULL                        ? &r->pull[n->ref]
                                                           : NULL;
    if (flag && !*flag) *flag = grew = true;
  }
  return grew;
}

/* Every node's gradient kept only where a loss's reaches it (above) */
static void reach_losses(Model *m) {
  int nf;
  IrFunc **fs = model_funcs(m, &nf);
  Reach r = {xcalloc((size_t)m->nvertex + 1, sizeof(bool)), false, xcalloc((size_t)m->npulls + 1, sizeof(bool))};
  bool **mark = xcalloc((size_t)nf, sizeof(bool *));
  for (int k = 0; k < nf; k++) mark[k] = xcalloc((size_t)fs[k]->n + 1, sizeof(bool));
  for (bool grew = true; grew;) {
    grew = false;
    for (int k = 0; k < nf; k++) grew |= reach_func(m, fs[k], fs[k]->kind == F_VERTEX ? k - (m->pull != NULL) : -1, mark[k], &r);
  }
  for (int k = 0; k < nf; k++) {
    for (int i = 0; i < fs[k]->n; i++) fs[k]->nodes[i].grad &= mark[k][i];
    free(mark[k]);
  }
  free(mark);
  free(r.state);
  free(r.pull);
}

void autodiff(Model *m) {
  if (m->pull) gradients(m, m->pull);
  for (int i = 0; i < m->nvertex; i++) {
    liveness(m->vertex[i]);
    gradients(m, m->vertex[i]);
  }
  if (m->push) {
    liveness(m->push);
    gradients(m, m->push);
  }
  /* the pull block has no sinks of its own: its values live when a vertex reads them */
  if (m->pull) {
    for (int v = 0; v < m->nvertex; v++)
      for (int i = 0; i < m->vertex[v]->n; i++) {
        const IrNode *n = &m->vertex[v]->nodes[i];
        if (n->op == OP_PULL && n->uses) m->pull->nodes[m->pulls[n->ref].node].uses++;
      }
    liveness(m->pull);
  }
  reach_losses(m);
}

/* Substitutes g, y, a, b in a derivative rule with the given operand texts. */
const char *ad_rule(const char *rule, const char *g, const char *y, const char *a, const char *b) {
  char out[1024];
  size_t len = 0;
  for (const char *p = rule; *p && len < sizeof out - 64; p++) {
    bool word = (p == rule || !(p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z'))) &&
                !(p[1] == '_' || (p[1] >= 'a' && p[1] <= 'z') || (p[1] >= '0' && p[1] <= '9'));
    const char *sub = NULL;
    if (word && *p == 'g') sub = g;
    else if (word && *p == 'y') sub = y;
    else if (word && *p == 'a') sub = a;
    else if (word && *p == 'b') sub = b;
    if (sub) len += (size_t)snprintf(out + len, sizeof out - len, "%s", sub);
    else out[len++] = *p;
  }
  out[len] = 0;
  return arena_strdup(out);
}

/* A mixture's node's gradient rules (its routing, the slots' rows, the experts'
   products and rows) */
static void print_moe_ad(FILE *out, const IrNode *n, const IrNode *na, const IrNode *nb, const char *g, const char *y,
                         const char *a, const char *b) {
  switch (n->op) {
  case OP_TOPK:
    if (na->grad) fprintf(out, "  d%s[kept] += %s * (%s - sum(%s * %s))   (the %d kept)\n", a, y, g, y, g, n->ref);
    break;
  case OP_SBCAST:
    if (na->grad) fprintf(out, "  d%s[row of slot] += %s\n", a, g);
    break;
  case OP_EMM:
    if (na->grad) fprintf(out, "  d%s += %s @ %s[expert]^T   (per expert, its slots)\n", a, g, b);
    fprintf(out, "  d%s[expert] += %s^T @ %s   (per expert, its slots)\n", b, a, g);
    break;
  case OP_EROW: fprintf(out, "  d%s[expert] += %s   (summed over its slots)\n", a, g); break;
  default:
    if (na->grad) fprintf(out, "  d%s = %s[row, expert] * %s[row]\n", a, b, g);
    if (nb->grad) fprintf(out, "  d%s[row, expert] += %s[row] . %s\n", b, g, a);
    break;
  }
}

/* Node i's gradient rules, as "dX += ..." lines: where its gradient goes */
static void print_node_ad(FILE *out, const Model *m, const IrFunc *f, int i) {
  char lo[64], hi[64];
  const IrNode *n = &f->nodes[i];
  const OpInfo *oi = &op_info[n->op];
  char g[32], y[32], a[32], b[32];
  snprintf(g, sizeof g, "d%%%d", i);
  snprintf(y, sizeof y, "%%%d", i);
  if (n->nargs > 0) snprintf(a, sizeof a, "%%%d", n->args[0]);
  if (n->nargs > 1) snprintf(b, sizeof b, "%%%d", n->args[1]);
  const IrNode *na = n->nargs > 0 ? &f->nodes[n->args[0]] : NULL;
  const IrNode *nb = n->nargs > 1 ? &f->nodes[n->args[1]] : NULL;
  if (n->type == T_ROW && !n->grad) return; /* (no loss reaches it: it sends nothing back) */
  switch (oi->kind) {
  case OK_EW:
    if (!n->grad) break;
    if (na->grad) fprintf(out, "  d%s += %s\n", a, ad_rule(oi->da, g, y, a, b));
    if (nb && nb->grad) fprintf(out, "  d%s += %s%s\n", b, ad_rule(oi->db, g, y, a, b),
                                nb->type == T_PARAM ? "   (summed over rows)" : "");
    break;
  case OK_GEMM:
    if (na->grad) fprintf(out, "  d%s += %s @ %s^T\n", a, g, b);
    fprintf(out, "  d%s += %s^T @ %s   (over all rows)\n", b, a, g);
    break;
  case OK_LOOKUP: fprintf(out, "  d%s[%s] += %s\n", a, b, g); break;
  case OK_CONCAT:
    for (int j = 0, off = 0; j < n->nargs; j++) {
      const IrNode *x = &f->nodes[n->args[j]];
      if (x->grad) fprintf(out, "  d%%%d += %s[:, col %d of %d]\n", n->args[j], g, off, n->nargs);
      (void)x;
      off++;
    }
    break;
  case OK_SLICE:
    if (n->grad)
      fprintf(out, "  d%s[:, %s:%s] += %s\n", a, lin_str(m, n->lo, lo, sizeof lo),
              lin_str(m, n->hi, hi, sizeof hi), g);
    break;
  case OK_GATHER: fprintf(out, "  dstate[child %d] += %s\n", n->ref, g); break;
  case OK_RMAT:
    if (n->op == OP_MV) {
      if (na->grad) fprintf(out, "  d%s += %s @ %s^T   (per row: [A] = [B] [B, A])\n", a, g, b);
      if (nb->grad) fprintf(out, "  d%s += %s^T %s   (per row: the outer product [A, B])\n", b, a, g);
    } else {
      if (na->grad) fprintf(out, "  d%s += %s %s^T   (per row: [A, B] = [A, C] [C, B])\n", a, g, b);
      fprintf(out, "  d%s += %s^T %s   (summed over rows: [B, C])\n", b, a, g);
    }
    break;
  case OK_DROP:
    if (na->grad && n->op == OP_NOISE) fprintf(out, "  d%s += %s * z   (the forward pass's normal draws)\n", a, g);
    else if (na->grad) fprintf(out, "  d%s += %s * mask / (1 - %s)   (the forward pass's mask)\n", a, g, b);
    break;
  case OK_EDGE:
    if (n->op == OP_ECHILD) fprintf(out, "  dstate[child of edge] += %s\n", g);
    else if (na->grad && n->op == OP_EBCAST) fprintf(out, "  d%s[parent of edge] += %s\n", a, g);
    else if (na->grad) fprintf(out, "  d%s[each edge] += %s[parent]\n", a, g);
    break;
  case OK_MOE: print_moe_ad(out, n, na, nb, g, y, a, b); break;
  case OK_PULL: fprintf(out, "  dpull %s += %s\n", m->pulls[n->ref].name, g); break;
  case OK_PUSHARG: fprintf(out, "  dpush = %s\n", g); break;
  case OK_SINK:
    if (na->grad) fprintf(out, "  d%s += %s\n", a, n->op == OP_SCATTER ? "dstate" : "dpush");
    break;
  case OK_LOSS:
    if (n->op == OP_XENT) fprintf(out, "  d%s += (softmax(%s) - onehot(%s)) / labeled\n", a, a, b);
    else {
      if (na->grad) fprintf(out, "  d%s += 2 * (%s - %s) / count\n", a, a, b);
      if (nb->type == T_ROW && nb->grad) fprintf(out, "  d%s += 2 * (%s - %s) / count\n", b, b, a);
    }
    break;
  case OK_LEAF: break;
  }
}

static void print_func_ad(FILE *out, const Model *m, const IrFunc *f) {
  if (f->kind == F_VERTEX) fprintf(out, "\nfunc vertex %s: backward\n", f->name);
  else fprintf(out, "\nfunc %s: backward\n", f->kind == F_PULL ? "pull" : "push");
  for (int i = f->n - 1; i >= 0; i--)
    if (!(f->nodes[i].uses == 0 && f->nodes[i].type != T_NONE)) print_node_ad(out, m, f, i);
}

void ad_print(FILE *out, const Model *m) {
  if (m->push) print_func_ad(out, m, m->push);
  for (int i = m->nvertex - 1; i >= 0; i--) print_func_ad(out, m, m->vertex[i]);
  if (m->pull) print_func_ad(out, m, m->pull);
}

/* classify.c: every node of a vertex function is eager, path or lazy (Cavs, Prop. 2).
 *   path  = depends on a gather and feeds a scatter: must run task by task;
 *   eager = depends on no gather (params, pull values, constants): runs before the
 *           graph pass over all rows of the minibatch at once;
 *   lazy  = depends on a gather but feeds no scatter (what only push needs): runs after
 *           the graph pass over all rows at once.
 * A node both eager and lazy runs eagerly. The pull block is eager and the push block
 * lazy as a whole. Backward nodes take the class of the forward node they differentiate,
 * except parameter gradients, which are lazy: one product over all rows. */
#include "cavsc.h"

#include <stdlib.h>

const char *cls_name(Class c) {
  return c == CLS_EAGER ? "eager" : c == CLS_PATH ? "path" : "lazy";
}

static void func_classify(IrFunc *f) {
  for (int i = 0; i < f->n; i++) {
    IrNode *n = &f->nodes[i];
    /* an edge value depends on the children: it runs task by task, or lazily */
    n->dep_gather = n->op == OP_GATHER || n->op == OP_ECHILD || n->op == OP_EBCAST;
    for (int j = 0; j < n->nargs; j++) n->dep_gather |= f->nodes[n->args[j]].dep_gather;
  }
  for (int i = f->n - 1; i >= 0; i--) {
    IrNode *n = &f->nodes[i];
    if (n->op == OP_SCATTER) n->feeds_scatter = true;
    if (!n->feeds_scatter) continue;
    for (int j = 0; j < n->nargs; j++) f->nodes[n->args[j]].feeds_scatter = true;
  }
  for (int i = 0; i < f->n; i++) {
    IrNode *n = &f->nodes[i];
    if (f->kind == F_PULL) n->cls = CLS_EAGER;
    else if (f->kind == F_PUSH) n->cls = CLS_LAZY;
    else if (n->op == OP_PUSH) n->cls = CLS_LAZY;
    else if (!n->dep_gather) n->cls = CLS_EAGER;
    else n->cls = n->feeds_scatter ? CLS_PATH : CLS_LAZY;
  }
  /* a mixture of experts runs in one stage: its topk groups the stage's rows by expert
     for the slots that follow, so the routing, every slot value and the sum over slots
     take the latest class among them (and what reads them, a class at least that) */
  if (f->route < 0) return;
  bool *in = xcalloc((size_t)f->n + 1, sizeof(bool)), scat = false;
  Class rc = CLS_EAGER;
  for (int i = f->route; i < f->n; i++) {
    IrNode *n = &f->nodes[i];
    bool reads = false;
    for (int j = 0; j < n->nargs; j++) reads = reads || in[n->args[j]];
    in[i] = i == f->route || reads;
    scat = scat || (in[i] && n->feeds_scatter);
    if (i == f->route || n->slot || n->op == OP_SCOMB) rc = n->cls > rc ? n->cls : rc;
  }
  free(in);
  /* a lazy node may run task by task, an eager one too; a path one never lazily */
  if (rc == CLS_LAZY && scat) rc = CLS_PATH;
  for (int i = f->route; i < f->n; i++) {
    IrNode *n = &f->nodes[i];
    if (i == f->route || n->slot || n->op == OP_SCOMB) n->cls = rc;
    for (int j = 0; j < n->nargs && n->type != T_NONE; j++)
      if (f->nodes[n->args[j]].cls > n->cls && i > f->route) n->cls = f->nodes[n->args[j]].cls;
  }
}

void classify(Model *m) {
  if (m->pull) func_classify(m->pull);
  for (int i = 0; i < m->nvertex; i++) func_classify(m->vertex[i]);
  if (m->push) func_classify(m->push);
}

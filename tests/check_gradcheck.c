/* check_gradcheck.c: every gradient the generated code computes agrees with central
 * finite differences, in double precision: for one tiny model per operator, and for
 * every example model, on small random graphs that include vertices with a missing child
 * and a DAG in which vertices have two parents. Error measure per entry:
 * |analytic - numeric| / max(|analytic| + |numeric|, 1e-4), required below 1e-6. */
#include "engine.h"

static double loss_at(cavs_model *m, const cavs_graph *const *gs) {
  cavs_stats st;
  ck_assert_msg(cavs_model_forward(m, gs, TG_NGRAD, &st) == 0, "%s", cavs_model_error(m));
  return st.loss + st.aux_loss; /* (a mixture of experts' balancing loss is apart) */
}

static int ablations; /* cavs_model_set_ablations of the model checked */

/* set by labels_at_roots: the graphs' classes at their roots only */
static bool roots_only;

static double gradcheck(const cavs_desc *d) {
  long dims[CAVS_MAX_DIMS];
  tg_grad_dims(d, dims);
  char err[256];
  cavs_model *m = cavs_model_new(d, dims, err, sizeof err);
  ck_assert_msg(m != NULL, "%s", err);
  cavs_model_set_ablations(m, ablations);
  size_t np;
  static TGraph g[TG_NGRAD];
  const cavs_graph *gs[TG_NGRAD];
  double *p = tg_grad_start(m, d, dims, g, gs, &np);
  if (roots_only) /* a class only at each graph's root (its last vertex) */
    for (int k = 0; k < TG_NGRAD; k++)
      for (int v = 0; v + 1 < g[k].g.n; v++)
        for (int i = 0; i < d->ninputs; i++)
          if (d->inputs[i].kind == CAVS_IN_CLASS) g[k].feat[v * d->nint + d->inputs[i].slot] = -1;
  /* the buffers sized by a first pass, then every value and gradient made NaN: a cell
     the passes read without writing it (a gradient buffer not cleared because it is
     written whole, and a cell of it missed) makes the gradient NaN, in any build */
  loss_at(m, gs);
  ck_assert_int_eq(cavs_model_poison(m), 0);
  loss_at(m, gs);
  cavs_model_backward(m);
  double *grad = malloc(sizeof(double) * np);
  memcpy(grad, cavs_model_grads_flat(m, &np), sizeof(double) * np);
  double worst = 0, eps = 1e-5;
  int checked = 0, nonzero = 0;
  for (int i = 0; i < d->nparams; i++) {
    long rows, cols, ld;
    double *w = cavs_model_param(m, i, &rows, &cols, &ld);
    double *gw = grad + (w - p);
    for (long r = 0; r < rows; r++)
      for (long j = 0; j < cols; j++) {
        double *x = &w[r * ld + j], keep = *x;
        *x = keep + eps;
        double lp = loss_at(m, gs);
        *x = keep - eps;
        double lm = loss_at(m, gs);
        *x = keep;
        double num = (lp - lm) / (2 * eps), ana = gw[r * ld + j];
        double e = fabs(ana - num) / fmax(fabs(ana) + fabs(num), 1e-4);
        if (isnan(e)) e = INFINITY; /* (a NaN compares false: it would pass) */
        if (e > worst) worst = e;
        if (e > 1e-6)
          fprintf(stderr, "%s: %s[%ld,%ld] analytic %.10g numeric %.10g\n", d->name, d->params[i].name, r, j, ana, num);
        checked++;
        nonzero += fabs(ana) > 1e-6;
      }
  }
  /* the check means nothing if the gradients are all zero */
  ck_assert_msg(nonzero * 4 > checked, "%s: only %d of %d gradients are nonzero", d->name, nonzero, checked);
  free(grad);
  cavs_model_free(m);
  return worst;
}

#define HEAD                                                                                          \
  "dim H = 3; dim C = 3; dim V = 5;\n"                                                                \
  "input w : index[V]; input y : class[C];\n"                                                         \
  "param emb[V,H] init uniform(-1, 1); param W[H,H], U[H,H] init uniform(-1, 1);\n"                   \
  "param b[H] init uniform(-1, 1); param Wc[H,C] init uniform(-1, 1); param bc[C];\n"                 \
  "pull { x = emb[w]; }\n"
#define CELL(expr)                                                                                    \
  "vertex v (children 2) {\n  x = pull(); s0 = gather(0); s1 = gather(1);\n  h = " expr ";\n"           \
  "  scatter(h); push(h);\n}\npush (h) { loss softmax_xent(h @ Wc + bc, y); }\n"

static const struct {
  const char *name, *src;
} op_models[] = {
    {"add", "model op_add;\n" HEAD CELL("tanh(x + s0 + s1 @ W + b)")},
    {"sub", "model op_sub;\n" HEAD CELL("tanh(x - s0 @ W - s1 - b)")},
    {"mul", "model op_mul;\n" HEAD CELL("tanh(x * s0 + (s1 @ W) * b + x * 0.5)")},
    {"div", "model op_div;\n" HEAD CELL("tanh(x / (2 + sigmoid(s0)) + s1 @ W / 3)")},
    {"neg", "model op_neg;\n" HEAD CELL("tanh(-x + -(s0 @ W) - s1)")},
    {"sigmoid", "model op_sigmoid;\n" HEAD CELL("sigmoid(x + s0 @ W + s1 * 0.5)")},
    {"tanh", "model op_tanh;\n" HEAD CELL("tanh(x + (s0 + s1) @ W + b)")},
    {"relu", "model op_relu;\n" HEAD CELL("tanh(relu(x + s0 @ W + b) + s1)")},
    {"exp", "model op_exp;\n" HEAD CELL("tanh(exp(x * 0.5) * 0.1 + s0 @ W - s1)")},
    {"log", "model op_log;\n" HEAD CELL("tanh(log(1 + sigmoid(x + s0)) + s1 @ W)")},
    {"concat_slice", "model op_concat;\n" HEAD CELL("tanh(concat(x, s0)[1:H+1] @ W + concat(s1, x) @ concat_w)")
                         "param concat_w[2H,H] init uniform(-1, 1);\n"},
    {"sum", "model op_sum;\n" HEAD CELL("tanh(sum(x, s0, s1 @ W) + sum(k in 0..1: gather(k) @ U))")},
    {"matmul_chain", "model op_mm;\n" HEAD CELL("tanh((tanh(x @ W + b) @ U) * (s0 + 1) + s1 @ U)")},
    {"eager_lazy",
     "model op_el;\n" HEAD
     "vertex v (children 2) {\n  x = pull(); e = tanh(x @ W + b);\n"
     "  h = tanh(e * gather(0) + gather(1) @ U);\n  scatter(h); push(tanh(h @ U) + e);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc + bc, y); }\n"},
    {"mse",
     "model op_mse; dim H = 3; dim V = 5; dim T = 2;\n"
     "input w : index[V]; input t : real[T]; input f : real[H];\n"
     "param emb[V,H] init uniform(-1, 1); param W[H,H] init uniform(-1, 1); param Wo[H,T] init uniform(-1, 1);\n"
     "pull { x = emb[w]; z = x * f; }\n"
     "vertex v (children 2) { h = tanh(pull(z) + pull(x) + (gather(0) + gather(1)) @ W); scatter(h); push(h); }\n"
     "push (h) { loss mse(h @ Wo, t); }\n"},
    /* the target computed too: its gradient, -dp (it was none: the target stayed out of
       the gradient; found by a helper's random programs), on both sides of a product,
       one of them read by the prediction too */
    {"mse_both_computed",
     "model op_mse2; dim H = 3; dim T = 2;\n"
     "input t : real[T]; input f : real[H];\n"
     "param W[H,H] init uniform(-1, 1); param Wo[H,T], Wt[H,T] init uniform(-1, 1);\n"
     "vertex v (children 2) { h = tanh(f + (gather(0) + gather(1)) @ W); scatter(h); push(h); }\n"
     "push (h) { p = h @ Wo; loss mse(t * p, tanh(h @ Wt) + p); }\n"},
    {"mse_target_alone",
     "model op_mse3; dim H = 3;\n"
     "input t : real[H]; input f : real[H];\n"
     "param W[H,H] init uniform(-1, 1);\n"
     "vertex v (children 2) { h = tanh(f + (gather(0) + gather(1)) @ W); scatter(h); push(h); }\n"
     "push (h) { loss mse(t, h); }\n"},
    {"two_losses",
     "model op_2l; dim H = 3; dim V = 5; dim C = 3;\n"
     "input w : index[V]; input y : class[C]; input t : real[C];\n"
     "param emb[V,H] init uniform(-1, 1); param W[H,H] init uniform(-1, 1); param Wo[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children 2) { h = tanh(pull() + (gather(0) + gather(1)) @ W); scatter(concat(h, h)[0:H]); push(h); }\n"
     "push (h) { z = h @ Wo; loss softmax_xent(z, y); loss mse(z, t); }\n"},
    {"no_pull",
     "model op_np; dim H = 3; dim C = 3; input y : class[C]; input f : real[H];\n"
     "param W[H,H], Wc[H,C] init uniform(-1, 1); param b[H] init uniform(-1, 1);\n"
     "vertex v (children 2) { h = tanh(f + (gather(0) + gather(1)) @ W + b); scatter(h); push(h); }\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    {"three_children",
     "model op_3c; dim H = 3; dim C = 3; dim V = 5; input w : index[V]; input y : class[C];\n"
     "param emb[V,H], W[H,H], U[3H,H], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children 3) {\n  for k in 0..2 { s_k = gather(k); }\n"
     "  h = tanh(pull() @ W + sum(k in 0..2: s_k) * 0.5 + concat(s_0, s_1, s_2) @ U);\n"
     "  scatter(h); push(tanh(pull()) + h);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    /* masks drawn from the step and the vertex, the same in every forward pass here */
    {"dropout", "model op_drop;\n" HEAD CELL("tanh(dropout(x, 0.4) + dropout(s0 @ W, 0.3) + dropout(s1, 0.5) @ U)")},
    /* normal draws, the same in every forward pass here: a noise of a lookup, of a
       product, and one that a product reads */
    {"noise", "model op_noise;\n" HEAD CELL("tanh(noise(x) * 0.5 + noise(s0 @ W) + noise(s1) @ U + b)")},
    /* matrices per vertex: mm on a matrix with its own buffer (one product over all
       rows) and on a slice of the gathered state (row by row); mv with either operand
       from a child */
    {"per_vertex_matrices",
     "model op_rmat; dim H = 3; dim C = 3; dim V = 5; dim HH = H * H;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], wm[V,HH], W[H,H], M1[H,H], M2[H,H], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; X = wm[w]; }\n"
     "vertex v (children 2) {\n  for k in 0..1 { s_k = gather(k); a_k = s_k[0:H]; A_k = s_k[H:H+HH]; }\n"
     "  T = tanh(A_0 + pull(X));\n  P = mm(T, M1) + mm(A_1, M2);\n"
     "  a = tanh(mv(pull(x), T) + mv(a_1, A_0) @ W + mv(a_0, P));\n"
     "  scatter(concat(a, tanh(P))); push(a);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    /* the same on the edges of a set of children */
    {"per_vertex_matrices_on_edges",
     "model op_rmat_set; dim H = 3; dim C = 3; dim V = 5; dim HH = H * H;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], wm[V,HH], M1[H,H], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; X = wm[w]; }\n"
     "vertex v (children *) {\n"
     "  a = tanh(pull(x) + sum(s in children: mv(s[0:H], pull(X)) + mv(pull(x), mm(s[H:H+HH], M1))));\n"
     "  scatter(concat(a, tanh(pull(X) + sum(s in children: s[H:H+HH])))); push(a);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    /* rows of width 1 broadcast over the columns: a product's, a slice's, against a
       param vector, as a divisor; and a softmax over a set's scores (attention) */
    {"broadcast_width_one", "model op_b1;\n" HEAD
     CELL("tanh(x * tanh(s0 @ v1) + s1 / (2 + sigmoid(s0[0:1])) + exp(s1 @ v1 * 0.5) * b)")
     "param v1[H,1] init uniform(-1, 1);\n"},
    {"softmax_over_children",
     "model op_att; dim H = 3; dim C = 3; dim V = 5; input w : index[V]; input y : class[C];\n"
     "param emb[V,H], Wa[H,H], va[H,1], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children *) {\n  x = pull();\n"
     "  den = sum(s in children: exp(tanh(s @ Wa + x) @ va));\n"
     "  ctx = sum(s in children: exp(tanh(s @ Wa + x) @ va) * s) / (den + 1);\n"
     "  h = tanh(x + ctx); scatter(h); push(h);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    /* mixtures of experts: top 2 of 4 two-layer experts at every vertex (on the path),
       the gate's gradient through the kept weights; in the push block (lazy) with an
       eager gate; ties: a gate of two equal halves, so that every row's largest value
       has a twin (K = 3: both kept, and the third choice between twins, the lower index
       first) and the twins past the lower index never receive a row (K = 1) */
    {"moe_path",
     "model op_moe; dim H = 3; dim C = 3; dim V = 5; dim F = 2; dim X = 4; dim HF = H * F; dim FH = F * H;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], W[2H,H], Wg[H,X], W1[X,HF], b1[X,F], W2[X,FH], b2[X,H], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children 2) {\n  h = tanh(pull() + concat(gather(0), gather(1)) @ W);\n"
     "  m = moe(e in top(h @ Wg, 2): tanh(h @ W1[e] + b1[e]) @ W2[e] + b2[e]);\n"
     "  scatter(tanh(h + m)); push(h + m);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    /* an activation each product applies as it stores, its derivative applied by the
       next product's dx (plan.c's act_product): sigmoid without a bias on the path, relu
       with one in the push block */
    {"moe_act_in_product",
     "model op_moe_act; dim H = 3; dim C = 3; dim V = 5; dim F = 2; dim X = 4; dim HF = H * F; dim FH = F * H;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], W[2H,H], Wg[H,X], W1[X,HF], W2[X,FH], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children 2) {\n  h = tanh(pull() + concat(gather(0), gather(1)) @ W);\n"
     "  m = moe(e in top(h @ Wg, 2): sigmoid(h @ W1[e]) @ W2[e]);\n"
     "  scatter(tanh(h + m)); push(h + m);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    {"moe_act_in_product_push",
     "model op_moe_act2; dim H = 3; dim C = 3; dim V = 5; dim F = 4; dim X = 3; dim HF = H * F; dim FC = F * C;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], W[2H,H], Wg[H,X], W1[X,HF], b1[X,F], W2[X,FC] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children 2) { h = tanh(pull() + concat(gather(0), gather(1)) @ W); scatter(h); push(h); }\n"
     "push (h) { loss softmax_xent(moe(e in top(h @ Wg, 2): relu(h @ W1[e] + b1[e]) @ W2[e]), y); }\n"},
    /* Shazeer et al.'s noisy gate: the gate's values plus normal draws scaled by a
       softplus of a product of its own, through which Wn gets its gradient */
    {"moe_noisy_gate",
     "model op_moe_noisy; dim H = 3; dim C = 3; dim V = 5; dim F = 2; dim X = 4; dim HF = H * F; dim FH = F * H;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], W[2H,H], Wg[H,X], Wn[H,X], W1[X,HF], W2[X,FH], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children 2) {\n  h = tanh(pull() + concat(gather(0), gather(1)) @ W);\n"
     "  g = h @ Wg + noise(log(1 + exp(h @ Wn)));\n"
     "  m = moe(e in top(g, 2): tanh(h @ W1[e]) @ W2[e]);\n"
     "  scatter(tanh(h + m)); push(h + m);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    /* the gate's input in a group with a later product's input: the experts' product
       was once planned before the gate's topk ("route 0 read before its topk ran") */
    {"moe_gate_in_a_group",
     "model op_moe_order; dim H = 3; dim C = 3; dim X = 2; dim V = 5; dim HH = H * H;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], emb2[V,H], W[2H,H], A[H,H], U[H,H], Wg[H,X], T[X,HH], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; z = emb2[w]; }\n"
     "vertex v (children 2) {\n  x = pull(x);\n  a = tanh(x @ A);\n  m = moe(e in top(a @ Wg, 2): x @ T[e]);\n"
     "  scatter(tanh(pull(z) @ U + a + m + concat(gather(0), gather(1)) @ W)); push(a);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    {"moe_push",
     "model op_moe_push; dim H = 3; dim C = 3; dim V = 5; dim X = 3; dim HC = H * C;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], W[2H,H], Wg[H,X], E[X,HC], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children 2) { h = tanh(pull() + concat(gather(0), gather(1)) @ W); scatter(h); push(h); }\n"
     "push (h) { loss softmax_xent(moe(e in top(h @ Wg, 2): relu(h) @ E[e] + h @ Wc), y); }\n"},
    /* with the load-balancing loss (a number, and the option read at run time), on the
       path and in the push block, whose backward runs over the labeled rows only */
    {"moe_balance",
     "model op_moe_bal; dim H = 3; dim C = 3; dim X = 4; dim V = 5; dim HH = H * H;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], W[2H,H], Wg[H,X], E[X,HH], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children 2) {\n  h = tanh(pull() + concat(gather(0), gather(1)) @ W);\n"
     "  scatter(tanh(h + moe(e in top(h @ Wg, 2, 0.7): tanh(h @ E[e])))); push(h);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    {"moe_balance_option_push",
     "model op_moe_bal2; dim H = 3; dim C = 3; dim X = 4; dim V = 5; dim HC = H * C; option balance = 0.5;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], W[2H,H], Wg[H,X], E[X,HC] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children 2) { h = tanh(pull() + concat(gather(0), gather(1)) @ W); scatter(h); push(h); }\n"
     "push (h) { loss softmax_xent(moe(e in top(h @ Wg, 3, balance): h @ E[e]), y); }\n"},
    /* on the eager phase: the routing of every row of the type at once, from the pull
       block's value alone */
    {"moe_eager",
     "model op_moe_eager; dim H = 3; dim C = 3; dim X = 4; dim V = 5; dim HH = H * H;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], W[2H,H], Wg[H,X], E[X,HH], b[X,H], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children 2) {\n  m = moe(e in top(pull() @ Wg, 2, 0.2): tanh(pull() @ E[e] + b[e]));\n"
     "  h = tanh(m + concat(gather(0), gather(1)) @ W); scatter(h); push(h);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    {"moe_ties_k3",
     "model op_moe_t3; dim H = 3; dim C = 3; dim V = 5; dim G = 2; dim HH = H * H;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], W[2H,H], Wg[H,G], E[2G,HH], b[2G,H], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children 2) {\n  h = tanh(pull() + concat(gather(0), gather(1)) @ W);\n"
     "  m = moe(e in top(concat(h @ Wg, h @ Wg), 3): tanh(h @ E[e]) * b[e]);\n"
     "  scatter(tanh(h + m)); push(h + m);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    {"moe_ties_k1",
     "model op_moe_t1; dim H = 3; dim C = 3; dim V = 5; dim G = 2; dim HH = H * H;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], W[2H,H], Wg[H,G], E[2G,HH], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children 2) {\n  h = tanh(pull() + concat(gather(0), gather(1)) @ W);\n"
     "  scatter(tanh(h + moe(e in top(concat(h @ Wg, h @ Wg), 1): h @ E[e]))); push(h);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    /* the inner vertices' product over leaves that hold their word's row (too few rows
       here to take a slot's children apart: the one product, as every row multiplied;
       check_engine's dedup_of_children_holding_words holds the parts to it) */
    {"leaves_hold_their_words", TG_TREEFC_WORDS},
    {"leaf_type_without_push",
     "model op_lp; dim H = 3; dim C = 3; dim V = 5; input w : index[V]; input y : class[C];\n"
     "param emb[V,H], W[2H,H], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex leaf (children 0) { scatter(tanh(pull())); }\n"
     "vertex inner (children 2) { h = tanh(concat(gather(0), gather(1)) @ W); scatter(h); push(h); }\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    /* a fused loop's value dead at the leaves (it only meets s0, zero there) and read
       there by an op that runs over every row, an mm: the leaves' loop stores it as 0
       (it had left the rows unwritten, and dM was 0 times what they held: NaN here) */
    {"per_vertex_matrices_dead_at_leaves",
     "model op_rmat_dead; dim H = 3; dim C = 3; dim V = 5; dim HH = H * H;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], W[H,HH], M[H,H], Wq[HH,H], U[2H,H], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children 2) {\n  s0 = gather(0); s1 = gather(1);\n  m = mm(tanh(pull() @ W), M);\n"
     "  h = tanh(concat(s0, s1) @ U + (m @ Wq) * s0 + pull());\n  scatter(h); push(h);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
    /* the same for a gate: a mixture met only by s0, its gate dead at the leaves, which
       topk routes on at every row (dT was NaN) */
    {"moe_gate_dead_at_leaves",
     "model op_moe_dead; dim H = 3; dim C = 3; dim V = 5; dim X = 3;\n"
     "input w : index[V]; input y : class[C];\n"
     "param emb[V,H], Wg[H,X], T[X,H], U[2H,H], Wc[H,C] init uniform(-1, 1);\n"
     "pull { x = emb[w]; }\n"
     "vertex v (children 2) {\n  s0 = gather(0); s1 = gather(1);\n"
     "  m = moe(e in top(sigmoid(pull() @ Wg), 2): pull() * T[e]);\n"
     "  h = tanh(concat(s0, s1) @ U + m * s0 + pull());\n  scatter(h); push(h);\n}\n"
     "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
};

START_TEST(op_gradients) {
  const char *name = op_models[_i].name;
  const cavs_desc *d = load_model(op_models[_i].src, "double");
  double worst = gradcheck(d);
  ck_assert_msg(worst < 1e-6, "%s: worst relative error %.3g", name, worst);
}
END_TEST

static const char *examples[] = {"treelstm.vf", "treefc.vf", "lstm_lm.vf", "lstm_lm2.vf", "treegru.vf", "twotype.vf", "tagger.vf", "tagger_chars.vf", "childsum.vf", "lattice_lstm.vf", "lattice_gru.vf", "seq2seq.vf", "mvrnn.vf", "nary_treelstm.vf", "moe_lm.vf", "moe_tree.vf"};

/* mv and mm as a backend without kernels of its own runs them (CUDA's): row by row
 * through gemm, or one product where the rows' matrices lie one after another */
START_TEST(rowmat_by_gemm) {
  ablations = CAVS_ROWMAT_BY_GEMM;
  for (size_t i = 0; i < sizeof op_models / sizeof *op_models; i++) {
    if (strncmp(op_models[i].name, "per_vertex_matrices", 19)) continue;
    double worst = gradcheck(load_model(op_models[i].src, "double"));
    ck_assert_msg(worst < 1e-6, "%s, row by row: worst relative error %.3g", op_models[i].name, worst);
  }
  ablations = 0;
}
END_TEST

/* Labels at the roots alone (Fold's Tree-FC benchmark): the push block's backward runs
 * over the rows between the first and the last labeled one (scheduler.c target_rows),
 * the roots of the last level here, and the gradients are still every row's. */
START_TEST(labels_at_roots) {
  roots_only = true;
  static const char *const models[] = {"treefc.vf", "treelstm.vf", "twotype.vf"};
  for (int i = 0; i < 3; i++) {
    double worst = gradcheck(load_model(models[i], "double"));
    ck_assert_msg(worst < 1e-6, "%s, labels at the roots: worst relative error %.3g", models[i], worst);
  }
  roots_only = false;
}
END_TEST

START_TEST(example_gradients) {
  const cavs_desc *d = load_model(examples[_i], "double");
  double worst = gradcheck(d);
  ck_assert_msg(worst < 1e-6, "%s: worst relative error %.3g", examples[_i], worst);
}
END_TEST

int main(void) {
  Suite *s = suite_create("gradcheck");
  TCase *tc = tcase_create("ops");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, op_gradients, 0, (int)(sizeof op_models / sizeof *op_models));
  tcase_add_test(tc, rowmat_by_gemm);
  suite_add_tcase(s, tc);
  TCase *te = tcase_create("examples");
  tcase_set_timeout(te, 600);
  tcase_add_loop_test(te, example_gradients, 0, (int)(sizeof examples / sizeof *examples));
  tcase_add_test(te, labels_at_roots);
  suite_add_tcase(s, te);
  return tu_run_suite(s);
}

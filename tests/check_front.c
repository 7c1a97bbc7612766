/* check_front.c: the front end through its own API: widths, parsing, loops, and the
 * shape of the IR it builds for the example models. */
#include "cavsc.h"
#include "testutil.h"

static Model *compile_str(const char *src) {
  diag_init("test.vf", src, strlen(src));
  Decl *d = parse_source("test.vf", src, strlen(src));
  ck_assert_int_eq(diag_count(), 0);
  Model *m = sema(d, "test.vf");
  ck_assert_int_eq(diag_count(), 0);
  ir_check(m);
  return m;
}

/* The source stays alive while diagnostics may quote it: until the next file is read. */
static Model *compile_file(const char *name) {
  static char *src;
  char path[4096];
  snprintf(path, sizeof path, "%s/dsl-examples/%s", tu_env("TOP_SRCDIR", "."), name);
  free(src);
  src = tu_slurp(path, NULL);
  ck_assert_msg(src != NULL, "cannot read %s", path);
  return compile_str(src);
}

static int count_op(const IrFunc *f, Op op) {
  int n = 0;
  for (int i = 0; i < f->n; i++) n += f->nodes[i].op == op;
  return n;
}

static int dim_index(const Model *m, const char *name) {
  for (int i = 0; i < m->ndims; i++)
    if (!strcmp(m->dims[i].name, name)) return i;
  ck_abort_msg("no dim %s", name);
  return -1;
}

START_TEST(lin_order) {
  Lin h = lin_dim(0, 1), e = lin_dim(1, 1);
  ck_assert(lin_le(h, lin_add(h, h)));
  ck_assert(!lin_le(lin_add(h, h), h));
  ck_assert(!lin_le(h, e)); /* unrelated dims: not provable either way */
  ck_assert(!lin_le(e, h));
  ck_assert(lin_le(lin_const(0), h));
  ck_assert(lin_le(lin_const(1), h));  /* dims are at least 1 */
  ck_assert(!lin_le(lin_const(2), h)); /* but may be 1 */
  ck_assert(lin_eq(lin_sub(lin_add(h, e), e), h));
  char buf[64];
  Model m = {.ndims = 2};
  m.dims[0].name = "H";
  m.dims[1].name = "E";
  ck_assert_str_eq(lin_str(&m, lin_add(lin_add(h, h), e), buf, sizeof buf), "2H+E");
  ck_assert_str_eq(lin_str(&m, lin_add(h, lin_const(3)), buf, sizeof buf), "H+3");
  ck_assert_str_eq(lin_str(&m, lin_const(0), buf, sizeof buf), "0");
}
END_TEST

START_TEST(precedence) {
  const char *src = "model p; dim H = 2; param W[H,H];\n"
                    "vertex v (children 1) { s = gather(0); a = -s * 2 + s @ W / 3 - s; scatter(a); }\n";
  diag_init("p.vf", src, strlen(src));
  Decl *d = parse_source("p.vf", src, strlen(src));
  ck_assert_int_eq(diag_count(), 0);
  char *buf;
  size_t len;
  FILE *f = open_memstream(&buf, &len);
  ast_dump(f, d);
  fclose(f);
  ck_assert_msg(strstr(buf, "a = ((((-s) * 2) + ((s @ W) / 3)) - s);"), "%s", buf);
  free(buf);
}
END_TEST

/* The Tree-LSTM as DESIGN.md writes it: state [2H], pushed [H], nine distinct matrix
 * products in the cell (x @ Wf is shared by both forget gates). */
START_TEST(treelstm_ir) {
  Model *m = compile_file("treelstm.vf");
  int H = dim_index(m, "H"), E = dim_index(m, "E");
  ck_assert(lin_eq(m->state, lin_dim(H, 2)));
  ck_assert(lin_eq(m->pushed, lin_dim(H, 1)));
  ck_assert_int_eq(m->nvertex, 1);
  const IrFunc *f = m->vertex[0];
  ck_assert_int_eq(f->children, 2);
  ck_assert_int_eq(count_op(f, OP_GATHER), 2);
  ck_assert_int_eq(count_op(f, OP_SCATTER), 1);
  ck_assert_int_eq(count_op(f, OP_PUSH), 1);
  ck_assert_int_eq(count_op(f, OP_MATMUL), 9);
  ck_assert_int_eq(count_op(f, OP_PULL), 1);
  ck_assert_int_eq(count_op(m->pull, OP_LOOKUP), 1);
  ck_assert_int_eq(count_op(m->push, OP_XENT), 1);
  ck_assert(lin_eq(m->pull->nodes[m->pulls[0].node].width, lin_dim(E, 1)));
  /* bf = 1.0 only, the other biases zero, matrices xavier */
  for (int i = 0; i < m->nparams; i++) {
    const Param *p = &m->params[i];
    if (!strcmp(p->name, "bf")) ck_assert(p->init == INIT_CONSTANT && p->a == 1.0);
    else if (!strcmp(p->name, "emb")) ck_assert(p->init == INIT_UNIFORM && p->a == -0.05 && p->b == 0.05);
    else if (p->rank == 1) ck_assert_int_eq(p->init, INIT_ZEROS);
    else ck_assert_int_eq(p->init, INIT_XAVIER);
  }
  ck_assert(m->dims[dim_index(m, "V")].kind == DIM_VOCAB);
}
END_TEST

START_TEST(all_examples) {
  const char *names[] = {"treelstm.vf", "treefc.vf", "lstm_lm.vf", "lstm_lm2.vf", "treegru.vf", "twotype.vf", "tagger.vf", "tagger_chars.vf", "childsum.vf", "lattice_lstm.vf", "lattice_gru.vf", "seq2seq.vf", "mvrnn.vf", "nary_treelstm.vf", "moe_lm.vf", "moe_tree.vf"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    Model *m = compile_file(names[i]);
    ck_assert_msg(m->nvertex >= 1 && m->push != NULL, "%s", names[i]);
  }
  Model *m = compile_file("twotype.vf");
  ck_assert_int_eq(m->nvertex, 2);
  ck_assert_int_eq(m->vertex[0]->children + m->vertex[1]->children, 2);
}
END_TEST

/* `for` unrolls with `_k` names kept and iteration-local names dropped; sum(k in ..)
 * builds a chain of adds; widths may be any positive combination of dims. */
START_TEST(loops_and_sums) {
  Model *m = compile_str(
      "model n; dim H = 3; dim E = 2; dim C = 4; input y : class[C];\n"
      "param W[E+2H, H], Wc[H,C];\n"
      "vertex v (children 3) {\n"
      "  for k in 0..2 { t = gather(k); h_k = t[0:H]; e_k = t[H:H+E]; }\n"
      "  hs = sum(k in 0..2: h_k);\n"
      "  x = concat(e_0, hs, h_2) @ W;\n"
      "  scatter(concat(x, e_1));\n"
      "  push(hs * 0.5);\n"
      "}\n"
      "push (h) { loss softmax_xent(h @ Wc, y); }\n");
  const IrFunc *f = m->vertex[0];
  ck_assert_int_eq(count_op(f, OP_GATHER), 3);
  ck_assert_int_eq(count_op(f, OP_ADD), 2);
  ck_assert(lin_eq(m->state, lin_add(lin_dim(dim_index(m, "H"), 1), lin_dim(dim_index(m, "E"), 1))));
}
END_TEST

/* pull(name) picks a named value of the pull block; pull() the last one. */
START_TEST(pull_slots) {
  Model *m = compile_str(
      "model p; dim H = 3; dim V = vocab(w); input w : index[V]; input y : class[H];\n"
      "param A[V,H], B[V,H];\n"
      "pull { a = A[w]; b = B[w]; }\n"
      "vertex v (children 1) { s = gather(0); scatter(pull(a) + pull() + s); push(s); }\n"
      "push (h) { loss softmax_xent(h, y); }\n");
  ck_assert_int_eq(m->npulls, 2);
  ck_assert_str_eq(m->pulls[0].name, "a");
  ck_assert_str_eq(m->pulls[1].name, "b");
  const IrFunc *f = m->vertex[0];
  int refs[2], n = 0;
  for (int i = 0; i < f->n; i++)
    if (f->nodes[i].op == OP_PULL) refs[n++] = f->nodes[i].ref;
  ck_assert_int_eq(n, 2);
  ck_assert_int_eq(refs[0], 0);
  ck_assert_int_eq(refs[1], 1);
}
END_TEST

/* Constants fold; `1 - z` broadcasts a scalar. */
START_TEST(constants) {
  Model *m = compile_str(
      "model c; dim H = 2; input y : class[H];\n"
      "vertex v (children 1) { s = gather(0); z = sigmoid(s[0:H]); scatter((2 * 3 - 5) - z * exp(0)); push(z); }\n"
      "push (h) { loss softmax_xent(h, y); }\n");
  const IrFunc *f = m->vertex[0];
  bool found_one = false;
  for (int i = 0; i < f->n; i++)
    if (f->nodes[i].op == OP_CONST && f->nodes[i].cval == 1.0) found_one = true;
  ck_assert(found_one);
  ck_assert_int_eq(count_op(f, OP_SUB), 1);
  ck_assert_int_eq(count_op(f, OP_MUL), 1);
}
END_TEST

static const Param *param_named(const Model *m, const char *name) {
  for (int i = 0; i < m->nparams; i++)
    if (!strcmp(m->params[i].name, name)) return &m->params[i];
  ck_abort_msg("no param %s", name);
  return NULL;
}

/* A number with an exponent (1e-3) where a number goes; in a dim expression (brackets,
 * a dim declaration) `2E+1` is the dim term 2E plus 1 and `2e5` the dim term 2 e5, as
 * vf(5) says of dim terms: the lexer took them for the numbers 20 and 200000, and a
 * model with a dim named E or e (an embedding's width) and a width 2E+1 was refused. */
START_TEST(exponents_and_dim_terms) {
  Model *m = compile_str("model x; dim E = 4; dim e5 = 3; dim C = 3;\n"
                         "option p = 1e-1;\n"
                         "input f : real[E]; input y : class[C];\n"
                         "param U[2E+1,C], S[2E,C], V[E,2e5+1], Z[2e5+1,C];\n"
                         "param W[E,2E+1] init uniform(-1e-1, 2E-2);\n"
                         "vertex v (children 1) {\n"
                         "  h = tanh(f @ W + gather(0)) * 1e0; g = tanh(f @ V) @ Z * 25E-1;\n"
                         "  scatter(h); push(h @ U + h[1:2E+1] @ S + g);\n"
                         "}\n"
                         "push (h) { loss softmax_xent(h, y); }\n");
  int E = dim_index(m, "E"), e5 = dim_index(m, "e5");
  Lin twoE1 = lin_add(lin_dim(E, 2), lin_const(1)), twoe51 = lin_add(lin_dim(e5, 2), lin_const(1));
  ck_assert(lin_eq(param_named(m, "W")->cols, twoE1));
  ck_assert(lin_eq(param_named(m, "U")->rows, twoE1));
  ck_assert(lin_eq(param_named(m, "V")->cols, twoe51));
  ck_assert(lin_eq(param_named(m, "Z")->rows, twoe51));
  /* numbers outside: the initializer's bounds, the option, the vertex's constants */
  ck_assert_double_eq(param_named(m, "W")->a, -0.1);
  ck_assert_double_eq(param_named(m, "W")->b, 0.02);
  ck_assert_double_eq(m->options[0].value, 0.1);
  const IrFunc *f = m->vertex[0];
  int ones = 0, scaled = 0;
  for (int i = 0; i < f->n; i++) {
    ones += f->nodes[i].op == OP_CONST && f->nodes[i].cval == 1.0;
    scaled += f->nodes[i].op == OP_CONST && f->nodes[i].cval == 2.5;
  }
  ck_assert(ones >= 1 && scaled == 1);
}
END_TEST

/* A loop's j-th part of a row, z[j*H:(j+1)*H] (an LSTM's four gates from one product):
 * vf(5)'s dimterm is `intexpr * dimterm` either way round, an intexpr integers and loop
 * variables with + - * and parentheses; cavsc took only a number or a loop variable
 * there, and refused (j+1)*H, H*(j-1), j*2*H and a shape's (1+1)*2H as "not linear". */
START_TEST(loop_offsets) {
  Model *m = compile_str(
      "model o; dim H = 3; dim C = 4; input y : class[C]; input f : real[H];\n"
      "param W[H,(1+1)*2H], U[H,C];\n"
      "vertex v (children 1) {\n"
      "  z = f @ W;\n"
      "  for j in 0..3 { g_j = z[j*H:(j+1)*H]; }\n"
      "  for j in 1..2 { a_j = z[H*(j-1):(H)*(j + 1)]; }\n"
      "  for j in 0..1 { b_j = z[j*2*H+1:j*2H+(2-1)*(H+H)]; }\n"
      "  scatter(sigmoid(g_0) * tanh(g_3) + g_1 * g_2 + gather(0));\n"
      "  push(a_1[0:H] + a_2[H:2H] + b_1[0:H]);\n"
      "}\n"
      "push (h) { loss softmax_xent(h @ U, y); }\n");
  int H = dim_index(m, "H");
  ck_assert(lin_eq(param_named(m, "W")->cols, lin_dim(H, 4)));
  /* the slices in order, lo and hi as aH + b: g_0..g_3, a_1, a_2, b_0, b_1 (then push's) */
  static const int lo[8][2] = {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 0}, {1, 0}, {0, 1}, {2, 1}},
                   hi[8][2] = {{1, 0}, {2, 0}, {3, 0}, {4, 0}, {2, 0}, {3, 0}, {2, 0}, {4, 0}};
  const IrFunc *f = m->vertex[0];
  int k = 0;
  for (int i = 0; i < f->n && k < 8; i++)
    if (f->nodes[i].op == OP_SLICE) {
      ck_assert_msg(lin_eq(f->nodes[i].lo, lin_add(lin_dim(H, lo[k][0]), lin_const(lo[k][1]))) &&
                        lin_eq(f->nodes[i].hi, lin_add(lin_dim(H, hi[k][0]), lin_const(hi[k][1]))),
                    "slice %d", k);
      k++;
    }
  ck_assert_int_eq(k, 8);
}
END_TEST

static int count_named(const IrFunc *f, const char *name) {
  int n = 0;
  for (int i = 0; i < f->n; i++) n += f->nodes[i].name && !strcmp(f->nodes[i].name, name);
  return n;
}

/* Loops nested in loops: a name outlives the iterations of the loops it names, from the
 * innermost out, and is local to the first it does not name. In `for k { for j { } }`
 * a_j is k's iteration's (read after the inner loop, defined again in the next one), l_k
 * the inner iteration's, q_k_j the block's; an inner range may read the outer variable.
 * cavsc defined every renamed name at the block's depth, so that a_0 and l_0 were said
 * to be redefined (found by check_random's nested loops, vfgen.h vg_nest). */
START_TEST(nested_loops) {
  Model *m = compile_str(
      "model n; dim H = 3; dim C = 4; input y : class[C];\n"
      "param W[H,H], Wc[H,C];\n"
      "vertex v (children 2) {\n"
      "  for k in 0..1 {\n"
      "    s = gather(k) @ W;\n"
      "    for j in 0..2 { a_j = s * (j + 2); l_k = tanh(a_j); q_k_j = l_k * s; }\n"
      "    h_k = a_0 + a_1 * a_2;\n"
      "  }\n"
      "  for i in 0..1 { for j in i..i + 1 { t_i_j = h_i * (j + 2); } r_i = t_i_i; }\n"
      "  scatter(tanh(h_0 + h_1 + q_1_2 + q_0_0 + t_1_2 + r_0));\n"
      "  push(h_0);\n"
      "}\n"
      "push (h) { loss softmax_xent(h @ Wc, y); }\n");
  const IrFunc *f = m->vertex[0];
  ck_assert_int_eq(count_op(f, OP_MATMUL), 2);   /* s once an outer iteration */
  ck_assert_int_eq(count_named(f, "a_2"), 2);    /* each outer iteration's own */
  ck_assert_int_eq(count_named(f, "l_1"), 3);    /* each inner iteration's */
  ck_assert_int_eq(count_named(f, "q_1_2"), 1);
  ck_assert_int_eq(count_named(f, "t_1_2"), 1);
}
END_TEST

/* The Tree-LSTM's classes match the Cavs paper's Figure 7 and its cell fuses into one
 * loop: pull and the input projections eager (one merged product for all four gates),
 * the products with the children's states, the gates and the cell update on the path,
 * push and the head lazy. */
START_TEST(treelstm_classes) {
  Model *m = compile_file("treelstm.vf");
  autodiff(m);
  classify(m);
  fuse(m);
  plan(m);
  for (int i = 0; i < m->pull->n; i++)
    if (m->pull->nodes[i].uses) ck_assert_int_eq(m->pull->nodes[i].cls, CLS_EAGER);
  for (int i = 0; i < m->push->n; i++)
    if (m->push->nodes[i].uses || m->push->nodes[i].type == T_NONE) ck_assert_int_eq(m->push->nodes[i].cls, CLS_LAZY);
  const IrFunc *f = m->vertex[0];
  int cell_group = -1, eager_mm = 0, path_mm = 0;
  for (int i = 0; i < f->n; i++) {
    const IrNode *n = &f->nodes[i];
    if (!n->uses && n->type != T_NONE) continue;
    switch (n->op) {
    case OP_PULL: ck_assert_int_eq(n->cls, CLS_EAGER); break;
    case OP_MATMUL: {
      bool from_x = f->nodes[n->args[0]].op == OP_PULL;
      ck_assert_int_eq(n->cls, from_x ? CLS_EAGER : CLS_PATH);
      if (from_x) {
        /* x @ [Wi|Wo|Wu] merged; x @ Wf dead at the leaves (it only meets f_k, which
           only meets c_k, zero there), so apart: it runs over other rows */
        bool wf = !strcmp(f->nodes[n->args[1]].name, "Wf");
        ck_assert_int_eq(n->dead_leaf, wf);
        if (wf) ck_assert_int_lt(n->mm, 0);
        else ck_assert_int_eq(f->merges[n->mm].n, 3);
        eager_mm++;
      } else {
        path_mm++;
      }
      break;
    }
    case OP_SIGMOID:
    case OP_TANH:
    case OP_MUL:
      ck_assert_int_eq(n->cls, CLS_PATH);
      if (cell_group < 0) cell_group = n->group;
      ck_assert_msg(n->group == cell_group, "%%%d (%s) is in group %d, not the cell's %d", i,
                    op_info[n->op].name, n->group, cell_group);
      break;
    case OP_PUSH: ck_assert_int_eq(n->cls, CLS_LAZY); break;
    case OP_SCATTER:
    case OP_GATHER: ck_assert_int_eq(n->cls, CLS_PATH); break;
    default: break;
    }
  }
  ck_assert_int_eq(eager_mm, 4);
  ck_assert_int_eq(path_mm, 5);
  /* two eager products: x @ [Wi|Wo|Wu] and x @ Wf; the path: hs @ [Ui|Uo|Uu] and
     h_k @ Uf */
  int units[3] = {0};
  for (int u = 0; u < f->nunits; u++) units[f->units[u].cls]++;
  ck_assert_int_eq(units[CLS_EAGER], 2);
  /* the cell's forward is one loop, and so is its backward: the emitted code runs one
     forward and one backward loop function for the cell's group */
  char *hbuf, *cbuf;
  size_t hl, cl;
  FILE *h = open_memstream(&hbuf, &hl), *c = open_memstream(&cbuf, &cl);
  EmitOpts eo = {.prec = PREC_FLOAT, .cmdline = "test", .source_name = "treelstm.vf"};
  emit(m, &target_c, &eo, h, c);
  fclose(h);
  fclose(c);
  char fwd[64], bwd[64];
  snprintf(fwd, sizeof fwd, "cavs_loop(c, treelstm_tree_fwd_path_g%d,", cell_group);
  snprintf(bwd, sizeof bwd, "cavs_loop(c, treelstm_tree_bwd_path_g%d,", cell_group);
  int nf = 0, nb = 0;
  for (char *p = cbuf; (p = strstr(p, fwd)); p++) nf++;
  for (char *p = cbuf; (p = strstr(p, bwd)); p++) nb++;
  ck_assert_int_eq(nf, 1);
  ck_assert_int_eq(nb, 1);
  /* the forward loop writes its rows alone (split by rows over threads); the backward
     adds each row's share to the biases' gradients (split by columns) */
  char *call = strstr(cbuf, fwd), *end = call ? strchr(call, ';') : NULL;
  ck_assert_msg(end && strstr(call, "CAVS_LOOP_ROWS") && strstr(call, "CAVS_LOOP_ROWS") < end, "%.120s", call);
  call = strstr(cbuf, bwd), end = call ? strchr(call, ';') : NULL;
  ck_assert_msg(end && !memcmp(end - 4, ", 0)", 4), "%.120s", call);
  free(hbuf);
  free(cbuf);
}
END_TEST

/* The C a planned model emits, in one string (free it). */
static char *emitted(Model *m, const char *source) {
  char *hbuf, *cbuf;
  size_t hl, cl;
  FILE *h = open_memstream(&hbuf, &hl), *c = open_memstream(&cbuf, &cl);
  EmitOpts eo = {.prec = PREC_FLOAT, .cmdline = "test", .source_name = source};
  emit(m, &target_c, &eo, h, c);
  fclose(h);
  fclose(c);
  free(hbuf);
  return cbuf;
}

static int count_str(const char *s, const char *what) {
  int n = 0;
  for (const char *p = s; (p = strstr(p, what)); p++) n++;
  return n;
}

static Model *planned(Model *m) {
  autodiff(m);
  classify(m);
  fuse(m);
  plan(m);
  return m;
}

/* A forward loop whose exponentials come two deep (an LSTM cell's gates, then tanh of
 * the cell) runs in two column loops in training (emit.c, fwd_stages): the gates first,
 * kept, then the rest from what the first loop kept; inference runs the one loop. Not
 * where the second stage has no exponential, nor where it reads a value of the first
 * that is not kept (the sum `a` below, which only sigmoid's y is kept of), nor on the
 * CUDA target. */
START_TEST(exponentials_in_two_loops) {
  const char *fmt = "model k; dim H = 4; dim C = 3; dim V = vocab(w);\n"
                    "input w : index[V]; input y : class[C];\n"
                    "param emb[V,H], Wi[H,H], Wf[H,H], Wo[H,H], Wu[H,H], U[H,H], b[H], Wc[H,C] init uniform(-1, 1);\n"
                    "pull { x = emb[w]; }\n"
                    "vertex step (children 1) { s = gather(0); c0 = s[0:H]; h0 = s[H:2H]; x = pull();\n"
                    "  a = x @ Wi + h0 @ U + b; i = sigmoid(a); f = sigmoid(x @ Wf + h0 @ U + b);\n"
                    "  o = sigmoid(x @ Wo + h0 @ U + b); u = tanh(x @ Wu + h0 @ U + b);\n"
                    "  c = i * u + f * c0; h = %s; scatter(concat(c, h)); push(h); }\n"
                    "push (h) { loss softmax_xent(h @ Wc, y); }\n";
  static const struct {
    const char *h;
    int split;
  } cases[] = {{"o * tanh(c)", 2}, {"o * c", 0}, {"o * tanh(c + a)", 0}, {"o * tanh(c) + u", 2}};
  char src[2048];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    snprintf(src, sizeof src, fmt, cases[i].h);
    char *c = emitted(planned(compile_str(src)), "k.vf");
    ck_assert_msg(count_str(c, "/* the rest, from what the first loop kept */") == cases[i].split, "h = %s: %d", cases[i].h,
                  count_str(c, "/* the rest, from what the first loop kept */"));
    ck_assert_int_eq(count_str(c, "    if (!keep) {\n"), cases[i].split);
    free(c);
  }
}
END_TEST

/* Whether a parameter named `name` gets a gradient anywhere in m (a node of it that a
 * loss's gradient reaches) */
static bool param_trained(const Model *m, const char *name) {
  int nf;
  IrFunc **fs = model_funcs(m, &nf);
  for (int k = 0; k < nf; k++)
    for (int i = 0; i < fs[k]->n; i++) {
      const IrNode *n = &fs[k]->nodes[i];
      if (n->op == OP_PARAM && n->grad && !strcmp(m->params[n->ref].name, name)) return true;
    }
  return false;
}

/* A gradient only where a loss's reaches (autodiff.c, reach_losses): through the push
 * block's argument, the state the other blocks gather, the pull block's values; a block
 * nothing of which reaches a loss has no backward code (its parameters' gradients stay
 * 0, where they were NaN once its values overflowed: check_random, unread_block). */
START_TEST(gradients_where_a_loss_reaches) {
  const char *fmt = "model k; dim H = 4; dim C = 3; dim V = vocab(w);\n"
                    "input w : index[V]; input f : real[H]; input y : class[C];\n"
                    "param emb[V,H], Wl[H,H], U[2H,H], Wq[H,H], Wc[H,C] init uniform(-1, 1);\n"
                    "pull { x = emb[w]; }\n"
                    "vertex leaf (children 0) { h = tanh(pull() @ Wl); scatter(h); push(%s); }\n"
                    "vertex inner (children 2) { h = tanh(concat(gather(0), gather(1)) @ U); q = tanh(h @ Wq);\n"
                    "  scatter(h); push(%s); }\n"
                    "push (p) { loss softmax_xent(%s @ Wc, y); }\n";
  static const struct {
    const char *leaf, *inner, *loss;
    bool emb, wl, u, wq;
    int dw; /* the products' parameter gradients emitted (a lookup's is not one) */
  } cases[] = {
      {"h", "h", "p", true, true, true, false, 3},   /* q read by nothing */
      {"h", "q", "f", false, false, false, false, 1}, /* the loss reads an input alone */
      {"f", "q", "p", true, true, true, true, 4},    /* the leaves' h reach it through the state alone */
      {"h", "f", "p", true, true, false, false, 2},  /* the inner vertices' h: gathered by nothing that reaches it */
  };
  char src[2048];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    snprintf(src, sizeof src, fmt, cases[i].leaf, cases[i].inner, cases[i].loss);
    Model *m = planned(compile_str(src));
    ck_assert_msg(param_trained(m, "Wc"), "case %zu: Wc", i);
    ck_assert_msg(param_trained(m, "emb") == cases[i].emb, "case %zu: emb", i);
    ck_assert_msg(param_trained(m, "Wl") == cases[i].wl, "case %zu: Wl", i);
    ck_assert_msg(param_trained(m, "U") == cases[i].u, "case %zu: U", i);
    ck_assert_msg(param_trained(m, "Wq") == cases[i].wq, "case %zu: Wq", i);
    char *c = emitted(m, "k.vf");
    ck_assert_msg(count_str(c, "  dW += ") == cases[i].dw, "case %zu: %d parameter gradients", i, count_str(c, "  dW += "));
    free(c);
  }
  /* two products of one operand, x @ Wb first, only x @ Wa reaching the loss (its state
     gathered by nothing): not merged (fuse.c), which would run backward whole or not at
     all by the first's; Wa trained, Wb not, Wa's the one product gradient emitted */
  const char *apart = "model k; dim H = 4; dim C = 3; dim V = vocab(w);\n"
                      "input w : index[V]; input y : class[C];\n"
                      "param emb[V,H], Wa[H,H], Wb[H,H], Wc[H,C] init uniform(-1, 1);\n"
                      "pull { x = emb[w]; }\n"
                      "vertex leaf (children 0) { b = tanh(pull() @ Wb); a = tanh(pull() @ Wa); scatter(b); push(a); }\n"
                      "push (p) { loss softmax_xent(p @ Wc, y); }\n";
  Model *m = planned(compile_str(apart));
  ck_assert(param_trained(m, "Wa") && !param_trained(m, "Wb") && param_trained(m, "emb"));
  const IrFunc *f = m->vertex[0];
  int products = 0;
  for (int i = 0; i < f->n; i++)
    if (f->nodes[i].op == OP_MATMUL && f->nodes[i].uses) {
      ck_assert_msg(f->nodes[i].mm < 0, "the product of %s merged", f->nodes[f->nodes[i].args[1]].name);
      products++;
    }
  ck_assert_int_eq(products, 2);
  char *c = emitted(m, "k.vf");
  ck_assert_int_eq(count_str(c, "  dW += "), 2); /* (Wa's and Wc's) */
  free(c);
}
END_TEST

/* Tree-FC's leaves hold their word's row (scatter(pull()) of a lookup): the inner
 * vertices' product over their children is cavs_gemm_kids, forward and in both backward
 * products, each leaf a row of the table; not where a leaf's state is anything else (a
 * tanh of the row, a dropout's, before or after the pull), nor on the CUDA target
 * (its backend multiplies every row). */
START_TEST(children_holding_words) {
  const char *fmt = "model k; dim H = 4; dim C = 3; dim V = vocab(w); option p = 0;\n"
                    "input w : index[V]; input y : class[C];\n"
                    "param emb[V,H], W[2H,H], b[H], Wc[H,C] init uniform(-1, 1);\n"
                    "pull { x = %s; }\n"
                    "vertex leaf (children 0) { scatter(%s); }\n"
                    "vertex inner (children 2) { h = tanh(concat(gather(0), gather(1)) @ W + b); scatter(h); push(h); }\n"
                    "push (h) { loss softmax_xent(h @ Wc, y); }\n";
  static const struct {
    const char *pull, *leaf;
    int kids;
  } cases[] = {{"emb[w]", "pull()", 3}, {"emb[w]", "tanh(pull())", 0}, {"dropout(emb[w], p)", "pull()", 0},
               {"emb[w]", "dropout(pull(), p)", 0}};
  char src[2048];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    snprintf(src, sizeof src, fmt, cases[i].pull, cases[i].leaf);
    char *c = emitted(planned(compile_str(src)), "k.vf");
    ck_assert_msg(count_str(c, "cavs_gemm_kids(c, 2, 0, 0, ") == cases[i].kids, "%s / %s: %d calls", cases[i].pull,
                  cases[i].leaf, count_str(c, "cavs_gemm_kids("));
    if (cases[i].kids) {
      ck_assert_int_eq(count_str(c, "CAVS_PROD_Y_INNER, D_H, D_H, P[0], D_H, D_V,"), 1);
      ck_assert_int_eq(count_str(c, "CAVS_PROD_DX, D_H, D_H, P[0], D_H, D_V,"), 1);
      ck_assert_int_eq(count_str(c, "CAVS_PROD_DW, D_H, D_H, P[0], D_H, D_V,"), 1);
    }
    free(c);
  }
  /* a product added into a looked-up row's, which leaves the rows without a word for it
     to set by that row's index (CAVS_PROD_Y_CLOSE): cavs_gemm_rows, which takes the
     index, not cavs_gemm_kids, which does not (random program 442 of tests/vfgen.h: the
     rows left open read as they were, a loss that changed run to run); its dx and dW
     still a slot at a time */
  const char *closer = "model k; dim H = 4; dim C = 3; dim V = vocab(w);\n"
                       "input w : index[V]; input y : class[C];\n"
                       "param emb[V,H], W[2H,H], U[H,H], b[H], Wc[H,C] init uniform(-1, 1);\n"
                       "pull { x = emb[w]; }\n"
                       "vertex leaf (children 0) { scatter(pull()); }\n"
                       "vertex inner (children 2) { h = tanh(pull() @ U + concat(gather(0), gather(1)) @ W + b); "
                       "scatter(h); push(h); }\n"
                       "push (h) { loss softmax_xent(h @ Wc, y); }\n";
  char *cc = emitted(planned(compile_str(closer)), "k.vf");
  ck_assert_int_eq(count_str(cc, "CAVS_PROD_Y_OPEN"), 1);
  ck_assert_int_eq(count_str(cc, "cavs_gemm_rows(c, c->iin[0], c->leaf_rows, r0, n, CAVS_PROD_Y_CLOSE, D_H, 2*D_H,"), 1);
  ck_assert_int_eq(count_str(cc, "cavs_gemm_kids(c, 2, 0, 0, c->leaf_rows, r0, n, CAVS_PROD_DX,"), 1);
  ck_assert_int_eq(count_str(cc, "cavs_gemm_kids(c, 2, 0, 0, c->leaf_rows, r0, n, CAVS_PROD_DW,"), 1);
  ck_assert_int_eq(count_str(cc, "cavs_gemm_kids("), 2);
  free(cc);
  snprintf(src, sizeof src, fmt, "emb[w]", "pull()");
  char *hbuf, *cbuf;
  size_t hl, cl;
  FILE *h = open_memstream(&hbuf, &hl), *c = open_memstream(&cbuf, &cl);
  EmitOpts eo = {.prec = PREC_FLOAT, .cmdline = "test", .source_name = "k.vf"};
  emit(planned(compile_str(src)), &target_cuda, &eo, h, c);
  fclose(h);
  fclose(c);
  ck_assert_int_eq(count_str(cbuf, "cavs_gemm_kids("), 0);
  ck_assert_int_eq(count_str(cbuf, "cavs_gemm_skip("), 3);
  free(hbuf);
  free(cbuf);
}
END_TEST

/* The first product's node (an EMM) in f, and the activation node reading it (or its
   add) */
static int emm_node(const IrFunc *f, int k) {
  for (int i = 0; i < f->n; i++)
    if (f->nodes[i].uses && f->nodes[i].op == OP_EMM && k-- == 0) return i;
  return -1;
}

/* How many calls `call` in c have `what` among their arguments */
static int calls_with(const char *c, const char *call, const char *what) {
  int n = 0;
  for (const char *p = c; (p = strstr(p, call)); p++) {
    const char *end = strstr(p, ");");
    ck_assert(end != NULL);
    char *one = strndup(p, (size_t)(end - p));
    n += strstr(one, what) != NULL;
    free(one);
  }
  return n;
}

static Model *moe_body(const char *body, bool no_fuse) {
  char src[1024];
  snprintf(src, sizeof src,
           "model t; dim H = 3; dim C = 3; dim V = 5; dim F = 2; dim X = 4; dim HF = H * F; dim FH = F * H;\n"
           "input w : index[V]; input y : class[C];\n"
           "param emb[V,H], W[2H,H], Wg[H,X], W1[X,HF], b1[X,F], W2[X,FH], Wc[H,C];\n"
           "pull { x = emb[w]; }\n"
           "vertex v (children 2) {\n  h = tanh(pull() + concat(gather(0), gather(1)) @ W);\n"
           "  m = moe(e in top(h @ Wg, 2): %s);\n  scatter(tanh(h + m)); push(h + m);\n}\n"
           "push (h) { loss softmax_xent(h @ Wc, y); }\n",
           body);
  static char *keep; /* (diagnostics may quote the source until the next) */
  free(keep);
  keep = strdup(src);
  Model *m = compile_str(keep);
  m->no_fuse = no_fuse;
  return planned(m);
}

/* Two fused groups must not wait on each other: t1 / tanh(g) may not join t1's group
 * where tanh(g)'s group reads a slice of t1 @ W13, a product that waits on t1. fuse.c
 * checked each node's own operands only and made both unions, and plan failed its
 * assertion that the units have an order (seed 405 of check_random, shrunk). */
START_TEST(groups_wait_on_no_other) {
  Model *m = planned(compile_str(
      "model m1; dim H = 3; input t : real[H];\n"
      "param W13[H,4H], W14[H,H], W5[H,H];\n"
      "vertex node (children 1) {\n"
      "  g = gather(0); t1 = g - g;\n"
      "  scatter(sum(tanh(g), (t1 @ W13)[2H:3H], t1 / tanh(g)) @ W14);\n"
      "  push(g @ W5);\n"
      "}\n"
      "push (h) { loss mse(h, t); }\n"));
  const IrFunc *f = m->vertex[0];
  int sub = -1, div = -1;
  for (int i = 0; i < f->n; i++) {
    if (f->nodes[i].op == OP_SUB && sub < 0) sub = i;
    if (f->nodes[i].op == OP_DIV && div < 0) div = i;
  }
  ck_assert(sub >= 0 && div >= 0);
  /* t1's unit before the product's, the product's before the division's */
  int mm = -1;
  for (int i = 0; i < f->n; i++)
    if (f->nodes[i].op == OP_MATMUL && f->nodes[i].args[0] == sub) mm = i;
  ck_assert(mm >= 0);
  ck_assert_int_lt(f->nodes[sub].unit, f->nodes[mm].unit);
  ck_assert_int_lt(f->nodes[mm].unit, f->nodes[div].unit);
}
END_TEST

/* A mixture nothing reads is left out (autodiff's liveness), its load-balancing loss
 * with it: its gate's operand t2, read otherwise only by what is dead at the leaves
 * (g / (1 + exp(t2)), g zero there), is dead there too. fuse.c kept every routing with
 * a balance weight live at the leaves, and the leaves' loop computed t2 into a variable
 * it never used (-Wall -Werror refused the model: check_random's seed 3613, shrunk). */
START_TEST(unread_moe_keeps_no_gate) {
  Model *m = planned(compile_str(
      "model m1; dim H = 3; dim X = 3; dim HH = H * H; input t : real[H];\n"
      "param W5[H,H], W13[H,X], T9[X,HH], W14[H,H];\n"
      "vertex node (children 1) {\n"
      "  g = gather(0); t2 = tanh(t @ W5);\n"
      "  m5 = moe(e in top(t2 @ W13, 2, 0.5): t2 @ T9[e]);\n"
      "  scatter((g / (1 + exp(t2))) @ W14);\n"
      "  push(g @ W14);\n"
      "}\n"
      "push (h) { loss mse(h, t); }\n"));
  const IrFunc *f = m->vertex[0];
  int t2 = -1;
  for (int i = 0; i < f->n; i++)
    if (f->nodes[i].op == OP_TANH && t2 < 0) t2 = i;
  ck_assert(t2 >= 0);
  ck_assert(f->nodes[t2].dead_leaf);
}
END_TEST

/* An activation applied by the expert's product it reads (plan.c's act_product): the
 * product stores act(bias + x W_e) (cavs_emm_fwd's act), the activation and the add
 * before it are views of that place, and the product reading the activation applies
 * its derivative to its dx (cavs_emm_bwd's dx_act), which is the first product's
 * gradient: no loop of the hidden layer either way. Where, and where not. */
START_TEST(activation_in_products) {
  Model *m = planned(compile_file("moe_tree.vf"));
  const IrFunc *f = m->vertex[0];
  int p = emm_node(f, 0), q = emm_node(f, 1);
  ck_assert(p >= 0 && q > p);
  ck_assert_int_eq(f->nodes[p].act, OP_RELU);
  ck_assert_int_eq(f->nodes[q].act, 0);
  int z = f->nodes[q].args[0], r = f->nodes[p].accum_into;
  ck_assert_int_eq(f->nodes[z].op, OP_RELU);
  ck_assert(f->nodes[z].same && f->nodes[z].view == r && f->nodes[r].op == OP_EROW && f->nodes[r].folded);
  ck_assert(f->nodes[z].val.buf == f->nodes[p].val.buf && f->nodes[z].dval.buf == f->nodes[p].dval.buf);
  ck_assert_int_lt(f->nodes[z].unit, 0);
  ck_assert_int_lt(f->nodes[f->nodes[z].args[0]].unit, 0); /* (the add) */
  ck_assert(f->nodes[z].grad_set);
  char *c = emitted(m, "moe_tree.vf");
  /* the first product's forward, the second's backward */
  ck_assert_int_eq(count_str(c, "CAVS_ACT_RELU"), 2);
  ck_assert_int_eq(calls_with(c, "cavs_emm_fwd(", "CAVS_ACT_RELU"), 1);
  ck_assert_int_eq(calls_with(c, "cavs_emm_bwd(", "CAVS_ACT_RELU"), 1);
  free(c);

  /* without a bias: the product's own place */
  m = moe_body("sigmoid(h @ W1[e]) @ W2[e]", false);
  f = m->vertex[0], p = emm_node(f, 0), q = emm_node(f, 1), z = f->nodes[q].args[0];
  ck_assert_int_eq(f->nodes[p].act, OP_SIGMOID);
  ck_assert(f->nodes[z].same && f->nodes[z].view == p && f->nodes[p].folded && !f->nodes[p].accum);
  ck_assert(f->nodes[z].val.kind == PL_ROW && f->nodes[z].val.buf == f->nodes[p].val.buf);
  ck_assert_int_lt(f->nodes[z].unit, 0);
  /* tanh with the bias: the bias rows' place */
  m = moe_body("tanh(h @ W1[e] + b1[e]) @ W2[e]", false);
  f = m->vertex[0], p = emm_node(f, 0);
  ck_assert_int_eq(f->nodes[p].act, OP_TANH);
  ck_assert(f->nodes[p].accum && f->nodes[f->nodes[p].accum_into].folded);
  /* not: one read by the weighted sum rather than a product (the second's tanh; the
     first's sigmoid is), an activation whose rule is not only in its output, one with
     more in its group, and --no-fuse */
  m = moe_body("tanh(sigmoid(h @ W1[e]) @ W2[e])", false);
  f = m->vertex[0], p = emm_node(f, 0), q = emm_node(f, 1);
  ck_assert_int_eq(f->nodes[p].act, OP_SIGMOID);
  ck_assert_int_eq(f->nodes[q].act, 0);
  for (int i = 0; i < f->n; i++) ck_assert(!(f->nodes[i].op == OP_TANH && f->nodes[i].same));
  const char *nots[] = {"exp(h @ W1[e]) @ W2[e]", "relu(2 * (h @ W1[e])) @ W2[e]", "sigmoid(h @ W1[e]) @ W2[e]"};
  for (int k = 0; k < 3; k++) {
    m = moe_body(nots[k], k == 2);
    f = m->vertex[0];
    for (int i = 0; i < f->n; i++) {
      ck_assert_msg(f->nodes[i].act == 0, "%s: %%%d", nots[k], i);
      ck_assert_msg(!f->nodes[i].same || f->nodes[i].op == OP_ADD, "%s: %%%d", nots[k], i);
    }
  }
}
END_TEST

/* Products added in place (plan_accum): a product that an add alone reads, beside a
 * value the add alone reads, is computed into that value's place with beta = 1, and its
 * gradient is that value's. Where, and where not. */
START_TEST(products_added_in_place) {
  /* the Tree-LSTM: hs @ [Ui|Uo|Uu] into x @ [Wi|Wo|Wu], member for member; the stacked
     [h_0;h_1] @ Uf and x @ Wf stay apart (they are not one add's two operands) */
  Model *m = planned(compile_file("treelstm.vf"));
  const IrFunc *f = m->vertex[0];
  int added = 0;
  for (int i = 0; i < f->n; i++) {
    const IrNode *n = &f->nodes[i];
    if (!n->uses || n->op != OP_MATMUL) continue;
    const char *w = f->nodes[n->args[1]].name;
    ck_assert_msg(n->accum == (w[0] == 'U' && strcmp(w, "Uf") != 0), "%s", w);
    if (!n->accum) continue;
    const IrNode *a = &f->nodes[n->accum_into];
    ck_assert_int_eq(a->op, OP_MATMUL);
    ck_assert_int_eq(a->cls, CLS_EAGER);
    ck_assert_str_eq(f->nodes[a->args[1]].name + 1, w + 1); /* Wi for Ui ... */
    ck_assert(n->val.kind == PL_ROW && n->val.buf == a->val.buf && lin_eq(n->val.off, a->val.off));
    ck_assert(n->dval.buf == a->dval.buf && lin_eq(n->dval.off, a->dval.off));
    ck_assert(!n->grad_set && a->grad_set);
    added++;
  }
  ck_assert_int_eq(added, 3);
  /* x @ [Wi|Wo|Wu] leaves the rows without a word open, hs @ [Ui|Uo|Uu] sets them by
     the word's index (emit.c's open_closer): no clear, no read of it */
  char *c = emitted(m, "treelstm.vf");
  ck_assert_int_eq(count_str(c, "CAVS_PROD_Y_ADD"), 0);
  ck_assert_int_eq(count_str(c, "cavs_gemm_table(c, c->iin[0], 0, r0, n, CAVS_PROD_Y_OPEN, 3*D_H"), 1);
  ck_assert_int_eq(count_str(c, "cavs_gemm_rows(c, c->iin[0], c->leaf_rows, r0, n, CAVS_PROD_Y_CLOSE, 3*D_H"), 1);
  ck_assert_int_eq(count_str(c, "CAVS_PROD_Y_OPEN") + count_str(c, "CAVS_PROD_Y_CLOSE"), 2);
  free(c);
  /* the language model: the same, but h_prev @ Uf adds into x @ Wf, which writes its
     rows with children alone (CAVS_PROD_Y_INNER): it has none open to set */
  c = emitted(planned(compile_file("lstm_lm.vf")), "lstm_lm.vf");
  ck_assert_int_eq(count_str(c, "CAVS_PROD_Y_ADD"), 1);
  ck_assert_int_eq(count_str(c, "CAVS_PROD_Y_OPEN"), 1);
  ck_assert_int_eq(count_str(c, "CAVS_PROD_Y_CLOSE"), 1);
  free(c);
  /* Tree-FC: x + concat(...) @ W, x a lookup but no product: nothing opened */
  c = emitted(planned(compile_file("treefc.vf")), "treefc.vf");
  ck_assert_int_eq(count_str(c, "CAVS_PROD_Y_OPEN") + count_str(c, "CAVS_PROD_Y_CLOSE"), 0);
  free(c);

  /* a mixture of experts: each expert's product into its bias rows, run after them */
  m = planned(compile_file("moe_lm.vf"));
  f = m->push;
  added = 0;
  for (int i = 0; i < f->n; i++) {
    const IrNode *n = &f->nodes[i];
    if (!n->uses || n->op != OP_EMM) continue;
    ck_assert(n->accum);
    const IrNode *a = &f->nodes[n->accum_into];
    ck_assert_int_eq(a->op, OP_EROW);
    ck_assert(n->val.buf == a->val.buf && n->dval.buf == a->dval.buf);
    ck_assert_int_lt(a->unit, n->unit);
    added++;
  }
  ck_assert_int_eq(added, 2);
  /* ... each product given its bias table (the bias rows written by the product, not
     before it: cavs_emm_fwd's bias, add 0) and its gradient (cavs_emm_bwd's dbias),
     and no erow call of its own either way */
  c = emitted(m, "moe_lm.vf");
  int biased = 0, dbiased = 0;
  for (const char *p = c; (p = strstr(p, "cavs_emm_fwd(")); p++) {
    const char *end = strchr(p, '\n');
    ck_assert(end && end - p > 12);
    char *line = strndup(p, (size_t)(end - p));
    biased += strstr(line, ", 0, CAVS_ACT_") && !strstr(line, "NULL") && count_str(line, "P[") == 2;
    free(line);
  }
  for (const char *p = c; (p = strstr(p, "cavs_emm_bwd(")); p++) {
    const char *end = strstr(p, ");");
    ck_assert(end != NULL);
    char *call = strndup(p, (size_t)(end - p));
    dbiased += count_str(call, "PG[") == 2;
    free(call);
  }
  ck_assert_int_eq(biased, 2);
  ck_assert_int_eq(dbiased, 2);
  ck_assert_int_eq(count_str(c, "cavs_erow_fwd("), 0);
  ck_assert_int_eq(count_str(c, "cavs_erow_bwd("), 0);
  free(c);

  /* s @ U adds into x @ W (a merge's column); a named product keeps its row; of two
     path products, one zero at the leaves takes nothing from one that is not */
  m = planned(compile_str(
      "model r; dim H = 3; dim V = vocab(w); input w : index[V]; input y : class[H];\n"
      "param E[V,H], W[H,H], U[H,H], M[H,H], N[H,H], P[H,H], Q[H,H];\n"
      "pull { x = E[w]; }\n"
      "vertex v (children 1) {\n"
      "  x = pull(); s = gather(0);\n"
      "  g = tanh(x @ W + s @ U);\n"
      "  a = (s * 2) @ M;\n"
      "  k = tanh(x @ N + a);\n"
      "  q = tanh((s * s) @ P + (s + x) @ Q);\n"
      "  scatter(g + k + q); push(g);\n"
      "}\n"
      "push (h) { loss softmax_xent(h, y); }\n"));
  f = m->vertex[0];
  added = 0;
  for (int i = 0; i < f->n; i++) {
    const IrNode *n = &f->nodes[i];
    if (!n->uses || n->op != OP_MATMUL) continue;
    const char *w = f->nodes[n->args[1]].name;
    ck_assert_msg(n->accum == !strcmp(w, "U"), "%s", w);
    added += n->accum;
    if (n->accum) ck_assert_str_eq(f->nodes[f->nodes[n->accum_into].args[1]].name, "W");
  }
  ck_assert_int_eq(added, 1);
}
END_TEST

/* Gradients set by their first writer (plan.c, plan_grad_set), and the buffers that are
 * then not cleared. In the Tree-LSTM: hs by its merged product's dx, the children's h_k
 * by the stacked [h_0;h_1] @ Uf's (hs's loop adds after it), c_k by the cell's loop;
 * their buffers whole. Where a gather is read whole as well as sliced, nothing of it is
 * set: its buffer is cleared and added to, as before. */
START_TEST(gradients_set_by_their_first_writer) {
  Model *m = planned(compile_file("treelstm.vf"));
  const IrFunc *f = m->vertex[0];
  int sets = 0;
  for (int i = 0; i < f->n; i++) {
    const IrNode *n = &f->nodes[i];
    if (!n->uses) continue;
    if (n->op == OP_MATMUL && n->dx_set) {
      const IrNode *x = &f->nodes[n->args[0]];
      ck_assert_msg(x->name && (!strcmp(x->name, "hs") || !strcmp(x->name, "h_0")), "%s", x->name ? x->name : "?");
      ck_assert(m->bufs[x->dval.buf].grad_whole);
      sets++;
    }
    if (n->op == OP_SLICE) {
      /* c_k: the cell's loop alone; h_k: the product first, then hs's loop */
      ck_assert_msg(n->grad_set == (n->name[0] == 'c'), "%s", n->name);
      ck_assert(m->bufs[n->dval.buf].grad_whole);
    }
  }
  ck_assert_int_eq(sets, 2); /* (the stacked product is its first member's) */
  char *c = emitted(m, "treelstm.vf");
  ck_assert_int_eq(count_str(c, "CAVS_PROD_DX_SET"), 2);
  ck_assert_int_eq(count_str(c, "{\"tree_children\", {0, {0, 4}}, CAVS_GRAD_WHOLE"), 1);
  ck_assert_int_eq(count_str(c, "{\"tree_hs\", {0, {0, 1}}, CAVS_GRAD_WHOLE"), 1);
  free(c);

  m = planned(compile_str("model gw; dim H = 4; dim C = 3; input y : class[C]; input f : real[H];\n"
                          "param W[2H,H], U[H,H], Wc[H,C];\n"
                          "vertex node (children 1) { s = gather(0); a = s[0:H];\n"
                          "  h = tanh(f + s @ W + a @ U); scatter(concat(h, h)); push(h); }\n"
                          "push (p) { loss softmax_xent(p @ Wc, y); }\n"));
  f = m->vertex[0];
  for (int i = 0; i < f->n; i++) {
    const IrNode *n = &f->nodes[i];
    if (!n->uses) continue;
    ck_assert(!n->dx_set);
    if (n->op == OP_GATHER || n->op == OP_SLICE) {
      ck_assert(!n->grad_set);
      ck_assert(!m->bufs[n->dval.buf].grad_whole);
    }
  }
  c = emitted(m, "gw.vf");
  ck_assert_int_eq(count_str(c, "CAVS_PROD_DX_SET"), 0);
  free(c);
}
END_TEST

static int buf_named(const Model *m, const char *name) {
  for (int b = 0; b < m->nbufs; b++)
    if (!strcmp(m->bufs[b].name, name)) return b;
  return -1;
}

/* The push block reading the state in place (plan_push_place): where every type that
 * pushes pushes a value its scatter left in the state, at one offset, there is no buffer
 * of pushed rows and no copy either way; where not, a buffer of the push block's own. */
START_TEST(push_reads_state_in_place) {
  /* the Tree-LSTM: h at H in [c; h] */
  Model *m = planned(compile_file("treelstm.vf"));
  const IrFunc *f = m->vertex[0];
  ck_assert_int_eq(m->push_buf, m->state_buf);
  ck_assert_int_eq(buf_named(m, "push"), -1);
  int h = -1;
  for (int i = 0; i < f->n; i++)
    if (f->nodes[i].op == OP_PUSH) h = f->nodes[i].args[0];
  ck_assert_int_ge(h, 0);
  ck_assert(f->nodes[h].val.buf == m->state_buf && !lin_is_zero(f->nodes[h].val.off));
  ck_assert(lin_eq(m->push_off, f->nodes[h].val.off));
  for (int i = 0; i < m->push->n; i++)
    if (m->push->nodes[i].op == OP_PUSHARG)
      ck_assert(m->push->nodes[i].val.buf == m->state_buf && lin_eq(m->push->nodes[i].val.off, m->push_off));
  char *c = emitted(m, "treelstm.vf");
  ck_assert_int_eq(count_str(c, "  push */"), 0); /* no copy (the copies carry the op's name) */
  ck_assert_int_eq(count_str(c, "cavs_copy_rows("), 0);
  free(c);

  /* Tree-FC as the benchmark writes it: leaves push nothing, which does not stop it */
  static const char *treefc =
      "model t; dim H = 4; dim C = 3; dim V = vocab(w);\n"
      "input w : index[V]; input y : class[C];\n"
      "param E[V,H], W[2H,H], b[H], Wc[H,C];\n"
      "pull { x = E[w]; }\n"
      "vertex leaf (children 0) { x = pull(); scatter(x); }\n"
      "vertex inner (children 2) {\n"
      "  h = tanh(concat(gather(0), gather(1)) @ W + b);\n"
      "  scatter(h); push(h);\n"
      "}\n"
      "push (h) { loss softmax_xent(h @ Wc, y); }\n";
  m = planned(compile_str(treefc));
  ck_assert_int_eq(m->push_buf, m->state_buf);
  ck_assert(lin_is_zero(m->push_off));
  ck_assert_int_eq(buf_named(m, "push"), -1);
  /* the ablation: a buffer of the push block's, at its rows alone, and the copies */
  m = compile_str(treefc);
  m->no_push_view = true;
  planned(m);
  ck_assert_int_ne(m->push_buf, m->state_buf);
  ck_assert_int_eq(m->push_buf, buf_named(m, "push"));
  ck_assert_int_eq(m->bufs[m->push_buf].vertex, -2);
  c = emitted(m, "t.vf");
  ck_assert_int_eq(count_str(c, "  push */"), 2); /* the copy forward, its add backward */
  free(c);

  /* two types pushing h from different columns of the state; a type pushing a value
     that is not in the state: a buffer of pushed rows */
  static const char *apart[] = {
      "model t; dim H = 4; dim C = 3; dim V = vocab(w);\n"
      "input w : index[V]; input y : class[C];\n"
      "param E[V,H], W[H,H], Wc[H,C];\n"
      "pull { x = E[w]; }\n"
      "vertex a (children 0) { x = pull(); h = tanh(x @ W); scatter(concat(x, h)); push(h); }\n"
      "vertex b (children 1) { s = gather(0); h = tanh(s[0:H]); scatter(concat(h, s[H:2H])); push(h); }\n"
      "push (h) { loss softmax_xent(h @ Wc, y); }\n",
      "model t; dim H = 4; dim C = 3; dim V = vocab(w);\n"
      "input w : index[V]; input y : class[C];\n"
      "param E[V,H], W[H,C];\n"
      "pull { x = E[w]; }\n"
      "vertex a (children 1) { x = pull(); h = tanh(x + gather(0)); scatter(h); push(h * 2); }\n"
      "push (h) { loss softmax_xent(h @ W, y); }\n",
  };
  for (int k = 0; k < 2; k++) {
    m = planned(compile_str(apart[k]));
    ck_assert_msg(m->push_buf != m->state_buf && m->push_buf == buf_named(m, "push"), "case %d", k);
    ck_assert(lin_is_zero(m->push_off));
  }
}
END_TEST

/* What --dump=ir prints reads back into the same IR: dump, read, dump again. */
START_TEST(ir_round_trip) {
  const char *names[] = {"treelstm.vf", "treefc.vf", "lstm_lm.vf", "lstm_lm2.vf", "treegru.vf", "twotype.vf", "tagger.vf", "tagger_chars.vf", "childsum.vf", "lattice_lstm.vf", "lattice_gru.vf", "seq2seq.vf", "mvrnn.vf", "nary_treelstm.vf", "moe_lm.vf", "moe_tree.vf"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    Model *m = compile_file(names[i]);
    char *a, *b;
    size_t la, lb;
    FILE *f = open_memstream(&a, &la);
    ir_print(f, m);
    fclose(f);
    diag_init("dump.ir", a, la);
    Model *back = ir_read("dump.ir", a, la);
    ck_assert_msg(diag_count() == 0, "%s: the dump does not read back", names[i]);
    ir_check(back);
    f = open_memstream(&b, &lb);
    ir_print(f, back);
    fclose(f);
    ck_assert_msg(la == lb && !memcmp(a, b, la), "%s: the dump changes when read back:\n%s\n---\n%s", names[i], a, b);
    free(a);
    free(b);
  }
}
END_TEST

/* `option NAME = P;`: dropout's probability read at run time. The const node that holds
 * it names the option (ref) and is never merged with a literal of the same value; the
 * IR dump writes it and reads it back; every other use of the name is refused. */
START_TEST(options) {
  Model *m = compile_str("model o; dim H = 4; option p_in = 0.5; option p_out = 0;\n"
                         "input f : real[H];\n"
                         "vertex v (children 1) { a = dropout(f, p_in) + dropout(gather(0), 0.5);\n"
                         "  b = dropout(a, p_in); scatter(dropout(b, p_out)); }\n");
  ck_assert_int_eq(m->noptions, 2);
  ck_assert_str_eq(m->options[0].name, "p_in");
  ck_assert(m->options[0].value == 0.5 && m->options[1].value == 0);
  const IrFunc *f = m->vertex[0];
  int named[3] = {0}, drops = 0;
  for (int i = 0; i < f->n; i++) {
    const IrNode *n = &f->nodes[i];
    if (n->op != OP_DROPOUT) continue;
    const IrNode *p = &f->nodes[n->args[1]];
    ck_assert(p->op == OP_CONST && p->cval == (p->ref == 2 ? 0 : 0.5));
    named[p->ref]++;
    drops++;
  }
  ck_assert_int_eq(drops, 4);
  ck_assert_int_eq(named[0], 1); /* the literal 0.5, apart from p_in's default 0.5 */
  ck_assert_int_eq(named[1], 2);
  ck_assert_int_eq(named[2], 1);
  char *a, *b;
  size_t la, lb;
  FILE *o = open_memstream(&a, &la);
  ir_print(o, m);
  fclose(o);
  ck_assert_msg(strstr(a, "option p_in = 0.5\n") && strstr(a, "const 0.5 option p_in : scalar"), "%s", a);
  diag_init("o.ir", a, la);
  Model *back = ir_read("o.ir", a, la);
  ck_assert_int_eq(diag_count(), 0);
  ir_check(back);
  o = open_memstream(&b, &lb);
  ir_print(o, back);
  fclose(o);
  ck_assert_msg(la == lb && !memcmp(a, b, la), "%s\n---\n%s", a, b);
  free(a);
  free(b);
  /* `option clip = N;`: the model's gradient-norm clip, a number of its own kind */
  m = compile_str("model o; dim H = 4; option p = 0.5; option clip = 5;\ninput f : real[H];\n"
                  "vertex v (children 0) { scatter(dropout(f, p)); }\n");
  ck_assert_int_eq(m->noptions, 2);
  ck_assert(m->options[0].kind == OPT_DROPOUT && m->options[1].kind == OPT_CLIP && m->options[1].value == 5);
  /* refused: the name as a number, a default out of range, an option the IR lacks, the
     clip negative or a dropout's probability */
  const char *bad[] = {
      "model o; dim H = 4; option clip = -1; input f : real[H];\nvertex v (children 0) { scatter(f); }\n",
      "model o; dim H = 4; option clip = 0.5; input f : real[H];\nvertex v (children 0) { scatter(dropout(f, clip)); }\n",
      "model o; dim H = 4; option p = 0.5; input f : real[H];\nvertex v (children 0) { scatter(f * p); }\n",
      "model o; dim H = 4; option p = 1; input f : real[H];\nvertex v (children 0) { scatter(f); }\n",
      "model o; dim H = 4; option p = 0.5; input f : real[H];\nvertex v (children 0) { scatter(dropout(f, q)); }\n",
      "model o; dim H = 4; option p = 0.5; option p = 0.1; input f : real[H];\nvertex v (children 0) { scatter(f); }\n",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    diag_init("bad.vf", bad[i], strlen(bad[i]));
    Decl *d = parse_source("bad.vf", bad[i], strlen(bad[i]));
    if (diag_count() == 0) sema(d, "bad.vf");
    ck_assert_msg(diag_count() == 1, "bad %zu: %d errors", i, diag_count());
  }
  const char *ir = "model o\ndim H = 4\ninput f : real[H]\nstate [H]\nfunc vertex v children 0\n"
                   "  %0 = input f : [H]  # line 1\n  %1 = const 0.5 option p : scalar  # line 1\n";
  diag_init("bad.ir", ir, strlen(ir));
  ir_read("bad.ir", ir, strlen(ir));
  ck_assert_int_eq(diag_count(), 1);
}
END_TEST

/* A source whose vertex block computes `expr`. */
static char *with_expr(const char *expr) {
  const char *head = "model d; dim H = 2; dim C = 2; input y : class[C];\nvertex v (children 1) { x = gather(0); h = ";
  const char *tail = "; scatter(h); push(h); }\npush (h) { loss softmax_xent(h, y); }\n";
  char *src = malloc(strlen(head) + strlen(expr) + strlen(tail) + 1);
  sprintf(src, "%s%s%s", head, expr, tail);
  return src;
}

/* x + x + ... with n terms: a tree n - 1 deep (+ is left-associative). */
static char *chain(int n) {
  char *s = malloc(4 * (size_t)n + 1), *p = s;
  for (int i = 0; i < n; i++) p += sprintf(p, i ? " + x" : "x");
  return s;
}

/* An expression too deep for the passes after the parser is one error, in every parse a
 * process runs, not only its first (the compiler's in-process users parse many; found by
 * tests/fuzz), and one error however the cut expression goes on. */
START_TEST(too_deep_every_parse) {
  char *c = chain(300), *inner = chain(CV_MAX_NEST + 1);
  char *sliced = malloc(strlen(inner) + 64);
  sprintf(sliced, "(%s)[0:H] + x + x", inner);
  char *srcs[] = {with_expr(c), with_expr(c), with_expr(sliced), with_expr(sliced)};
  for (int i = 0; i < 4; i++) {
    diag_init("deep.vf", srcs[i], strlen(srcs[i]));
    int before = diag_count();
    parse_source("deep.vf", srcs[i], strlen(srcs[i]));
    ck_assert_msg(diag_count() - before == 1, "parse %d: %d errors", i, diag_count() - before);
  }
  for (int i = 0; i < 4; i++) free(srcs[i]);
  free(c);
  free(inner);
  free(sliced);
}
END_TEST

/* diag_init starts a new input: the errors of the last one are not counted. */
START_TEST(diag_init_resets_count) {
  const char *bad = "model b; dim H = 2 2;\n";
  diag_init("bad.vf", bad, strlen(bad));
  parse_source("bad.vf", bad, strlen(bad));
  ck_assert_int_gt(diag_count(), 0);
  Model *m = compile_file("treelstm.vf");
  ck_assert_int_eq(m->nvertex, 1);
}
END_TEST

/* IR written by hand keeps its widths in range as sema does: a coefficient, the
 * parameters' columns together (merged products put them side by side) and a concat's
 * operands together. Each of these overflowed int32 in lin_add (found by tests/fuzz). A fixed
 * dim is 1 to 999999999, as in a .vf (a larger one overflowed a product's long). */
START_TEST(ir_read_widths_in_range) {
  char cat[8192];
  int n = snprintf(cat, sizeof cat, "model m\ndim H = 1\ninput f : real[16777216H]\nstate [H]\n"
                                    "func vertex v children 1\n  %%0 = input f : [16777216H]  # line 1\n"
                                    "  %%1 = concat %%0");
  for (int i = 1; i < 64; i++) n += snprintf(cat + n, sizeof cat - (size_t)n, ", %%0");
  snprintf(cat + n, sizeof cat - (size_t)n, " : [H]  # line 1\n");
  char params[8192] = "model m\ndim H = 1\n";
  for (int i = 0; i < 130; i++)
    snprintf(params + strlen(params), sizeof params - strlen(params), "param W%d[H,16777216H] init xavier\n", i);
  const char *srcs[] = {"model m\ndim H = 2\ninput a : real[2000000000H+2000000000H]\n", params, cat,
                        "model m\ndim H = 9223372036854775807\ndim P = H * H\n", "model m\ndim H = 0\n",
                        "model m\ndim H = -3\n"};
  const char *what[] = {"the largest width", "the parameters' columns", "concat",
                        "a dim past 999999999 (its product overflowed long)", "a dim of 0", "a negative dim"};
  for (int i = 0; i < 6; i++) {
    diag_init("wide.ir", srcs[i], strlen(srcs[i]));
    ir_read("wide.ir", srcs[i], strlen(srcs[i]));
    ck_assert_msg(diag_count() == 1, "%s: %d errors", what[i], diag_count());
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("front");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, lin_order);
  tcase_add_test(tc, precedence);
  tcase_add_test(tc, treelstm_ir);
  tcase_add_test(tc, all_examples);
  tcase_add_test(tc, loops_and_sums);
  tcase_add_test(tc, pull_slots);
  tcase_add_test(tc, constants);
  tcase_add_test(tc, exponents_and_dim_terms);
  tcase_add_test(tc, loop_offsets);
  tcase_add_test(tc, nested_loops);
  tcase_add_test(tc, treelstm_classes);
  tcase_add_test(tc, products_added_in_place);
  tcase_add_test(tc, groups_wait_on_no_other);
  tcase_add_test(tc, children_holding_words);
  tcase_add_test(tc, exponentials_in_two_loops);
  tcase_add_test(tc, gradients_where_a_loss_reaches);
  tcase_add_test(tc, unread_moe_keeps_no_gate);
  tcase_add_test(tc, activation_in_products);
  tcase_add_test(tc, gradients_set_by_their_first_writer);
  tcase_add_test(tc, push_reads_state_in_place);
  tcase_add_test(tc, ir_round_trip);
  tcase_add_test(tc, options);
  tcase_add_test(tc, too_deep_every_parse);
  tcase_add_test(tc, diag_init_resets_count);
  tcase_add_test(tc, ir_read_widths_in_range);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}

/* check_reference.c: the generated binary Tree-LSTM (dsl-examples/treelstm.vf) against an
 * independent, hand-written C implementation of the same equations (Tai et al. 2015,
 * N-ary Tree-LSTM with N = 2), forward and backward, for one tree at a time:
 *
 *   x = emb[word] (zero row for word -1); (c_k, h_k) = child k's (c, h), zeros if absent
 *   hs = h_0 + h_1
 *   i = sigmoid(x Wi + hs Ui + bi);  f_k = sigmoid(x Wf + h_k Uf + bf)
 *   o = sigmoid(x Wo + hs Uo + bo);  u = tanh(x Wu + hs Uu + bu)
 *   c = i*u + f_0*c_0 + f_1*c_1;     h = o*tanh(c)
 *   logits = h Wc + bc;  loss = mean over labeled vertices of softmax cross-entropy
 *
 * Row vectors throughout (x is [E], Wi is [E,H]). The reference reads the parameters out
 * of the cavs model, keeps its own gradients, and is itself checked against central
 * finite differences of its own loss. Loss must agree to 1e-10 relative and every
 * gradient entry to 1e-9 relative to max(1, |value|) in double precision (1e-4 in
 * float). */
#include "engine.h"

enum { P_EMB, P_WI, P_WF, P_WO, P_WU, P_UI, P_UF, P_UO, P_UU, P_BI, P_BF, P_BO, P_BU, P_WC, P_BC, NPAR };
static const char *pnames[NPAR] = {"emb", "Wi", "Wf", "Wo", "Wu", "Ui", "Uf", "Uo", "Uu",
                                   "bi",  "bf", "bo", "bu", "Wc", "bc"};
enum { DE = 3, DH = 4, DC = 5, DV = 7 };

typedef struct Ref {
  int E, H, C, V;
  long size[NPAR];      /* entries, row-major dense */
  double *p[NPAR], *g[NPAR];
  int cavs_index[NPAR]; /* parameter index in the cavs model */
} Ref;

/* ---- reading a cavs parameter (either precision) ---- */

static double cavs_at(const cavs_desc *d, const void *base, long ld, long cols, long e) {
  long r = e / cols, j = e % cols;
  return d->precision == CAVS_DOUBLE ? ((const double *)base)[r * ld + j] : (double)((const float *)base)[r * ld + j];
}

static void ref_alloc(Ref *R, int E, int H, int C, int V) {
  memset(R, 0, sizeof *R);
  R->E = E, R->H = H, R->C = C, R->V = V;
  long sz[NPAR] = {(long)V * E, (long)E * H, (long)E * H, (long)E * H, (long)E * H, (long)H * H, (long)H * H,
                   (long)H * H, (long)H * H, H, H, H, H, (long)H * C, C};
  for (int i = 0; i < NPAR; i++) {
    R->size[i] = sz[i];
    R->p[i] = calloc((size_t)sz[i], sizeof(double));
    R->g[i] = calloc((size_t)sz[i], sizeof(double));
    R->cavs_index[i] = -1;
  }
}

static void ref_free(Ref *R) {
  for (int i = 0; i < NPAR; i++) free(R->p[i]), free(R->g[i]);
}

/* Copies the parameters out of the model, by name, checking their shapes. */
static void ref_load(Ref *R, cavs_model *m) {
  const cavs_desc *d = cavs_model_desc(m);
  for (int i = 0; i < NPAR; i++) {
    int idx = -1;
    for (int j = 0; j < d->nparams; j++)
      if (!strcmp(d->params[j].name, pnames[i])) idx = j;
    ck_assert_msg(idx >= 0, "no parameter %s in the model", pnames[i]);
    R->cavs_index[i] = idx;
    long rows, cols, ld;
    const void *w = cavs_model_param(m, idx, &rows, &cols, &ld);
    ck_assert_msg(rows * cols == R->size[i], "%s: %ldx%ld, expected %ld entries", pnames[i], rows, cols, R->size[i]);
    for (long e = 0; e < R->size[i]; e++) R->p[i][e] = cavs_at(d, w, ld, cols, e);
  }
  /* matrices must have the expected row count (vectors are [1,n] or [n,1]) */
  long rows, cols, ld;
  cavs_model_param(m, R->cavs_index[P_EMB], &rows, &cols, &ld);
  ck_assert(rows == R->V && cols == R->E);
  cavs_model_param(m, R->cavs_index[P_WI], &rows, &cols, &ld);
  ck_assert(rows == R->E && cols == R->H);
  cavs_model_param(m, R->cavs_index[P_UU], &rows, &cols, &ld);
  ck_assert(rows == R->H && cols == R->H);
  cavs_model_param(m, R->cavs_index[P_WC], &rows, &cols, &ld);
  ck_assert(rows == R->H && cols == R->C);
}

/* ---- the reference ---- */

static double sigm(double z) { return 1.0 / (1.0 + exp(-z)); }

/* y[0:n] += x[0:k] W, W [k, n] row-major */
static void vm_add(double *y, const double *x, const double *W, int k, int n) {
  for (int a = 0; a < k; a++)
    for (int b = 0; b < n; b++) y[b] += x[a] * W[a * n + b];
}
/* y[0:k] += dz[0:n] W^T */
static void vmt_add(double *y, const double *dz, const double *W, int k, int n) {
  for (int a = 0; a < k; a++)
    for (int b = 0; b < n; b++) y[a] += dz[b] * W[a * n + b];
}
/* G[k, n] += x^T dz */
static void outer_add(double *G, const double *x, const double *dz, int k, int n) {
  for (int a = 0; a < k; a++)
    for (int b = 0; b < n; b++) G[a * n + b] += x[a] * dz[b];
}

typedef struct Tree {
  int n;
  int child[2 * 64];
  int word[64], label[64];
} Tree;

/* Per-vertex activations. */
typedef struct Act {
  double *x, *hs, *i, *f0, *f1, *o, *u, *c, *tc, *h, *prob;
  double *dh, *dc; /* accumulated from parents and from the loss */
} Act;

/* Children before parents, by Kahn's algorithm (no recursion). */
static void topo_order(const Tree *t, int *order) {
  int indeg[64] = {0};
  /* indeg[v] = number of present children not yet placed */
  for (int v = 0; v < t->n; v++)
    for (int k = 0; k < 2; k++)
      if (t->child[v * 2 + k] >= 0) indeg[v]++;
  int queue[64], qh = 0, qt = 0, placed = 0;
  for (int v = 0; v < t->n; v++)
    if (!indeg[v]) queue[qt++] = v;
  while (qh < qt) {
    int v = queue[qh++];
    order[placed++] = v;
    for (int p = 0; p < t->n; p++)
      for (int k = 0; k < 2; k++)
        if (t->child[p * 2 + k] == v && --indeg[p] == 0) queue[qt++] = p;
  }
  ck_assert_msg(placed == t->n, "the test tree has a cycle");
}

/* Forward and (when `grad`) backward over one tree; returns the mean loss. Gradients
 * are zeroed first. */
static double ref_run(Ref *R, const Tree *t, int grad) {
  const int E = R->E, H = R->H, C = R->C, n = t->n;
  double **P = R->p, **G = R->g;
  Act a;
  double **fields[] = {&a.x, &a.hs, &a.i, &a.f0, &a.f1, &a.o, &a.u, &a.c, &a.tc, &a.h, &a.prob, &a.dh, &a.dc};
  for (size_t k = 0; k < sizeof fields / sizeof *fields; k++) *fields[k] = calloc((size_t)n * (E + H + C), sizeof(double));
  int order[64];
  topo_order(t, order);
  static const double zeros[256];
  ck_assert(H <= 256);
  int count = 0;
  for (int v = 0; v < n; v++) count += t->label[v] >= 0;
  double loss = 0;

  for (int s = 0; s < n; s++) {
    int v = order[s];
    double *x = a.x + v * E, *hs = a.hs + v * H;
    if (t->word[v] >= 0) memcpy(x, P[P_EMB] + (long)t->word[v] * E, sizeof(double) * E);
    const double *ck[2], *hk[2];
    for (int k = 0; k < 2; k++) {
      int ch = t->child[v * 2 + k];
      ck[k] = ch >= 0 ? a.c + ch * H : zeros;
      hk[k] = ch >= 0 ? a.h + ch * H : zeros;
    }
    for (int j = 0; j < H; j++) hs[j] = hk[0][j] + hk[1][j];
    double zi[256], zf0[256], zf1[256], zo[256], zu[256];
    memcpy(zi, P[P_BI], sizeof(double) * H);
    memcpy(zf0, P[P_BF], sizeof(double) * H);
    memcpy(zf1, P[P_BF], sizeof(double) * H);
    memcpy(zo, P[P_BO], sizeof(double) * H);
    memcpy(zu, P[P_BU], sizeof(double) * H);
    vm_add(zi, x, P[P_WI], E, H), vm_add(zi, hs, P[P_UI], H, H);
    vm_add(zf0, x, P[P_WF], E, H), vm_add(zf0, hk[0], P[P_UF], H, H);
    vm_add(zf1, x, P[P_WF], E, H), vm_add(zf1, hk[1], P[P_UF], H, H);
    vm_add(zo, x, P[P_WO], E, H), vm_add(zo, hs, P[P_UO], H, H);
    vm_add(zu, x, P[P_WU], E, H), vm_add(zu, hs, P[P_UU], H, H);
    for (int j = 0; j < H; j++) {
      double iv = sigm(zi[j]), f0 = sigm(zf0[j]), f1 = sigm(zf1[j]), ov = sigm(zo[j]), uv = tanh(zu[j]);
      double c = iv * uv + f0 * ck[0][j] + f1 * ck[1][j];
      a.i[v * H + j] = iv, a.f0[v * H + j] = f0, a.f1[v * H + j] = f1, a.o[v * H + j] = ov, a.u[v * H + j] = uv;
      a.c[v * H + j] = c;
      a.tc[v * H + j] = tanh(c);
      a.h[v * H + j] = ov * tanh(c);
    }
    /* the classifier */
    double z[256];
    memcpy(z, P[P_BC], sizeof(double) * C);
    vm_add(z, a.h + v * H, P[P_WC], H, C);
    double mx = z[0];
    for (int j = 1; j < C; j++) mx = fmax(mx, z[j]);
    double se = 0;
    for (int j = 0; j < C; j++) se += exp(z[j] - mx);
    for (int j = 0; j < C; j++) a.prob[v * C + j] = exp(z[j] - mx) / se;
    if (t->label[v] >= 0) loss += (mx + log(se)) - z[t->label[v]];
  }
  loss = count ? loss / count : 0;

  if (grad) {
    for (int i = 0; i < NPAR; i++) memset(G[i], 0, sizeof(double) * (size_t)R->size[i]);
    for (int s = n - 1; s >= 0; s--) {
      int v = order[s];
      const double *x = a.x + v * E, *hs = a.hs + v * H, *h = a.h + v * H;
      double *dh = a.dh + v * H, *dc = a.dc + v * H;
      if (t->label[v] >= 0) {
        double dz[256];
        for (int j = 0; j < C; j++) dz[j] = (a.prob[v * C + j] - (j == t->label[v])) / count;
        outer_add(G[P_WC], h, dz, H, C);
        for (int j = 0; j < C; j++) G[P_BC][j] += dz[j];
        vmt_add(dh, dz, P[P_WC], H, C);
      }
      int chv[2];
      const double *ck[2], *hk[2];
      for (int k = 0; k < 2; k++) {
        chv[k] = t->child[v * 2 + k];
        ck[k] = chv[k] >= 0 ? a.c + chv[k] * H : zeros;
        hk[k] = chv[k] >= 0 ? a.h + chv[k] * H : zeros;
      }
      double dzi[256], dzf0[256], dzf1[256], dzf[256], dzo[256], dzu[256], dck[2][256];
      for (int j = 0; j < H; j++) {
        double iv = a.i[v * H + j], f0 = a.f0[v * H + j], f1 = a.f1[v * H + j], ov = a.o[v * H + j],
               uv = a.u[v * H + j], tc = a.tc[v * H + j];
        double dov = dh[j] * tc;
        double dct = dc[j] + dh[j] * ov * (1 - tc * tc);
        double div = dct * uv, duv = dct * iv, df0 = dct * ck[0][j], df1 = dct * ck[1][j];
        dck[0][j] = dct * f0, dck[1][j] = dct * f1;
        dzi[j] = div * iv * (1 - iv);
        dzf0[j] = df0 * f0 * (1 - f0);
        dzf1[j] = df1 * f1 * (1 - f1);
        dzf[j] = dzf0[j] + dzf1[j];
        dzo[j] = dov * ov * (1 - ov);
        dzu[j] = duv * (1 - uv * uv);
      }
      outer_add(G[P_WI], x, dzi, E, H), outer_add(G[P_UI], hs, dzi, H, H);
      outer_add(G[P_WF], x, dzf, E, H), outer_add(G[P_UF], hk[0], dzf0, H, H), outer_add(G[P_UF], hk[1], dzf1, H, H);
      outer_add(G[P_WO], x, dzo, E, H), outer_add(G[P_UO], hs, dzo, H, H);
      outer_add(G[P_WU], x, dzu, E, H), outer_add(G[P_UU], hs, dzu, H, H);
      for (int j = 0; j < H; j++) {
        G[P_BI][j] += dzi[j], G[P_BF][j] += dzf[j], G[P_BO][j] += dzo[j], G[P_BU][j] += dzu[j];
      }
      if (t->word[v] >= 0) {
        double dx[256] = {0};
        vmt_add(dx, dzi, P[P_WI], E, H), vmt_add(dx, dzf, P[P_WF], E, H);
        vmt_add(dx, dzo, P[P_WO], E, H), vmt_add(dx, dzu, P[P_WU], E, H);
        for (int j = 0; j < E; j++) G[P_EMB][(long)t->word[v] * E + j] += dx[j];
      }
      double dhs[256] = {0};
      vmt_add(dhs, dzi, P[P_UI], H, H), vmt_add(dhs, dzo, P[P_UO], H, H), vmt_add(dhs, dzu, P[P_UU], H, H);
      for (int k = 0; k < 2; k++) {
        if (chv[k] < 0) continue;
        double *cdh = a.dh + chv[k] * H, *cdc = a.dc + chv[k] * H;
        for (int j = 0; j < H; j++) cdh[j] += dhs[j], cdc[j] += dck[k][j];
        vmt_add(cdh, k ? dzf1 : dzf0, P[P_UF], H, H);
      }
    }
  }
  for (size_t k = 0; k < sizeof fields / sizeof *fields; k++) free(*fields[k]);
  return loss;
}

/* The reference's gradients against central differences of its own loss. */
static void ref_selfcheck(Ref *R, const Tree *t) {
  ref_run(R, t, 1);
  double eps = 1e-5, worst = 0;
  int nonzero = 0, total = 0;
  for (int i = 0; i < NPAR; i++)
    for (long e = 0; e < R->size[i]; e++) {
      double keep = R->p[i][e];
      R->p[i][e] = keep + eps;
      double lp = ref_run(R, t, 0);
      R->p[i][e] = keep - eps;
      double lm = ref_run(R, t, 0);
      R->p[i][e] = keep;
      double num = (lp - lm) / (2 * eps), ana = R->g[i][e];
      double err = fabs(ana - num) / fmax(fabs(ana) + fabs(num), 1e-3);
      if (err > worst) worst = err;
      ck_assert_msg(err < 1e-6, "reference self-check: %s[%ld] analytic %.12g numeric %.12g", pnames[i], e, ana,
                    num);
      nonzero += fabs(ana) > 1e-7;
      total++;
    }
  ck_assert_msg(nonzero * 2 > total, "reference self-check: only %d of %d gradients nonzero", nonzero, total);
}

/* ---- driving cavs ---- */

static cavs_model *make_model(const char *prec) {
  const cavs_desc *d = load_model("treelstm.vf", prec);
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  int iE = find_dim(d, "E"), iH = find_dim(d, "H"), iC = find_dim(d, "C"), iV = find_dim(d, "V");
  ck_assert(iE >= 0 && iH >= 0 && iC >= 0 && iV >= 0);
  dims[iE] = DE, dims[iH] = DH, dims[iC] = DC, dims[iV] = DV;
  char err[256];
  cavs_model *m = cavs_model_new(d, dims, err, sizeof err);
  ck_assert_msg(m != NULL, "%s", err);
  cavs_model_init(m, 11);
  /* perturb every parameter (biases become nonzero), as check_gradcheck does */
  unsigned s = 99;
  for (int i = 0; i < d->nparams; i++) {
    long rows, cols, ld;
    void *w = cavs_model_param(m, i, &rows, &cols, &ld);
    for (long r = 0; r < rows; r++)
      for (long j = 0; j < cols; j++) {
        double dv = (double)(tg_rand(&s) % 2001) / 2000.0 - 0.5;
        if (d->precision == CAVS_DOUBLE) ((double *)w)[r * ld + j] += dv;
        else ((float *)w)[r * ld + j] += (float)dv;
      }
  }
  return m;
}

/* Runs cavs and the reference on `t`, compares loss and every gradient entry. */
static void compare(cavs_model *m, const Tree *t, double loss_tol, double grad_tol, int policy) {
  const cavs_desc *d = cavs_model_desc(m);
  static TGraph tg;
  memset(&tg, 0, sizeof tg);
  tg.g.n = t->n;
  tg.g.maxc = 2;
  memcpy(tg.child, t->child, sizeof(int) * 2 * (size_t)t->n);
  ck_assert(find_input(d, "word") >= 0 && find_input(d, "label") >= 0);
  int sw = d->inputs[find_input(d, "word")].slot, sl = d->inputs[find_input(d, "label")].slot;
  for (int v = 0; v < t->n; v++) {
    tg.feat[v * d->nint + sw] = t->word[v];
    tg.feat[v * d->nint + sl] = t->label[v];
  }
  tg.g.child = tg.child;
  tg.g.type = NULL;
  tg.g.feat = tg.feat;
  tg.g.real = NULL;
  const cavs_graph *gs[1] = {&tg.g};
  cavs_model_set_policy(m, policy);
  cavs_stats st;
  ck_assert_msg(cavs_model_forward(m, gs, 1, &st) == 0, "%s", cavs_model_error(m));
  cavs_model_backward(m);

  Ref R;
  ref_alloc(&R, DE, DH, DC, DV);
  ref_load(&R, m);
  double loss = ref_run(&R, t, 1);
  int count = 0;
  for (int v = 0; v < t->n; v++) count += t->label[v] >= 0;
  ck_assert_msg(st.count == count, "cavs counted %ld labeled vertices, expected %d", st.count, count);
  double lerr = fabs(st.loss - loss) / fmax(fabs(loss), 1e-300);
  ck_assert_msg(lerr < loss_tol, "%s policy %d n=%d: loss cavs %.17g reference %.17g (rel %.3g)", d->name, policy,
                t->n, st.loss, loss, lerr);
  double worst = 0;
  const char *wname = "";
  long wi = -1;
  int bad = 0;
  for (int i = 0; i < NPAR; i++) {
    long rows, cols, ld;
    const void *gw = cavs_model_grad(m, R.cavs_index[i], &rows, &cols, &ld);
    for (long e = 0; e < R.size[i]; e++) {
      double cg = cavs_at(d, gw, ld, cols, e), rg = R.g[i][e];
      double err = fabs(cg - rg) / fmax(1.0, fabs(rg));
      if (err > grad_tol && bad++ < 20)
        fprintf(stderr, "%s (%s, policy %d, n=%d): d%s[%ld,%ld] cavs %.17g reference %.17g (err %.3g)\n", d->name,
                d->precision == CAVS_DOUBLE ? "double" : "float", policy, t->n, pnames[i], e / cols, e % cols, cg,
                rg, err);
      if (err > worst) worst = err, wname = pnames[i], wi = e;
    }
  }
  ref_free(&R);
  ck_assert_msg(worst <= grad_tol, "n=%d policy %d: %d gradient entries differ; worst %s[%ld] error %.3g", t->n,
                policy, bad, wname, wi, worst);
}

/* ---- trees ---- */

static void tree_init(Tree *t, int n) {
  memset(t, 0, sizeof *t);
  t->n = n;
  for (int i = 0; i < 2 * n; i++) t->child[i] = -1;
  for (int v = 0; v < n; v++) t->word[v] = -1, t->label[v] = (v * 3 + 1) % DC;
}

/* 10 vertices: leaves 0..4 with words; 5 = (0,1), 6 = (-,2) (slot 0 missing),
 * 7 = (3,4), 8 = (5,6), 9 = (8,7) the root; vertex 6 is unlabeled. */
static void tree_mixed(Tree *t) {
  tree_init(t, 10);
  int words[5] = {3, 0, 6, 2, 5};
  for (int v = 0; v < 5; v++) t->word[v] = words[v];
  int ch[5][2] = {{0, 1}, {-1, 2}, {3, 4}, {5, 6}, {8, 7}};
  for (int v = 5; v < 10; v++) t->child[v * 2] = ch[v - 5][0], t->child[v * 2 + 1] = ch[v - 5][1];
  t->label[6] = -1;
}

START_TEST(mixed_tree_double) {
  cavs_model *m = make_model("double");
  Tree t;
  tree_mixed(&t);
  Ref R;
  ref_alloc(&R, DE, DH, DC, DV);
  ref_load(&R, m);
  ref_selfcheck(&R, &t);
  ref_free(&R);
  compare(m, &t, 1e-10, 1e-9, CAVS_BFS);
  compare(m, &t, 1e-10, 1e-9, CAVS_SERIAL);
  cavs_model_free(m);
}
END_TEST

START_TEST(single_leaf_double) {
  cavs_model *m = make_model("double");
  Tree t;
  tree_init(&t, 1);
  t.word[0] = 4;
  t.label[0] = 2;
  compare(m, &t, 1e-10, 1e-9, CAVS_BFS);
  compare(m, &t, 1e-10, 1e-9, CAVS_SERIAL);
  cavs_model_free(m);
}
END_TEST

/* 31 vertices leaning left: 0 a leaf; then leaf 2k-1 and 2k = (2k-2, 2k-1). One
 * internal vertex has a word, one vertex is unlabeled. */
static void tree_deep(Tree *t) {
  tree_init(t, 31);
  t->word[0] = 1;
  for (int k = 1; 2 * k < 31; k++) {
    t->word[2 * k - 1] = (k * 5) % DV;
    t->child[(2 * k) * 2] = 2 * k - 2;
    t->child[(2 * k) * 2 + 1] = 2 * k - 1;
  }
  t->word[12] = 6; /* an internal vertex with a word */
  t->label[17] = -1;
}

START_TEST(deep_tree_double) {
  cavs_model *m = make_model("double");
  Tree t;
  tree_deep(&t);
  Ref R;
  ref_alloc(&R, DE, DH, DC, DV);
  ref_load(&R, m);
  ref_selfcheck(&R, &t);
  ref_free(&R);
  compare(m, &t, 1e-10, 1e-9, CAVS_BFS);
  compare(m, &t, 1e-10, 1e-9, CAVS_SERIAL);
  cavs_model_free(m);
}
END_TEST

START_TEST(mixed_tree_float) {
  cavs_model *m = make_model("float");
  Tree t;
  tree_mixed(&t);
  compare(m, &t, 1e-4, 1e-4, CAVS_BFS);
  compare(m, &t, 1e-4, 1e-4, CAVS_SERIAL);
  cavs_model_free(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("reference");
  TCase *tc = tcase_create("treelstm");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, mixed_tree_double);
  tcase_add_test(tc, single_leaf_double);
  tcase_add_test(tc, deep_tree_double);
  tcase_add_test(tc, mixed_tree_float);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}

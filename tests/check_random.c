/* check_random.c: differential testing on random, valid .vf programs (tests/vfgen.h).
 * Each program, built in double, is checked
 *   - gradients against central finite differences (check_gradcheck's measure, on its
 *     graphs: trees with missing children and a DAG with shared children; every buffer
 *     poisoned with NaN between the sizing pass and the checked one);
 *   - batched scheduling (BFS, depth, agenda, frontier) against one vertex at a time
 *     (CAVS_SERIAL): the loss, the counts and every parameter gradient, on
 *     tg_minibatch's trees and DAGs;
 *   - the runtime ablations (no eager, no lazy, both, no views, no homes, no dedup,
 *     products of per-vertex matrices by gemm) against the default;
 *   - the build ablations (--no-fuse, --no-merge, --no-homes, --no-push-view) against
 *     the default build;
 *   - the CUDA target's MODEL.cu compiled by g++ under tests/cuda_host.h and run on the
 *     cpu backend (as check_cuda_host does) against the C target: every per-row buffer,
 *     values and gradients, the losses, predictions and parameter gradients.
 * The graphs are engine.h's, whose vertices take as many children as their block does
 * (up to 8) and, under a set, up to 8 (tg_set_more; other suites' up to 4).
 * Every build gets -Wall -Werror (and the sanitizers in a sanitizer build), so a
 * warning in generated code is a failure too. A program cavsc refuses is a failure:
 * the generator writes only programs vf(5) allows.
 *
 * The seeds: a fixed list (make check), or $CAVS_RANDOM_SEEDS, e.g. "1000-1999" or
 * "5,17,40-49". $CAVS_RANDOM_FILE=path.vf checks that file instead (a finding's
 * reproducer); $CAVS_RANDOM_KEEP=dir saves every failing program there as seed-N.vf;
 * `check_random --print N` prints program N. $CAVS_RANDOM_SKIP takes a comma list of
 * the checks to leave out (grad, serial, ablate, build, cuda). Deterministic: the
 * programs, the graphs and the parameters come from the seed alone. */
#include "cudatest.h"
#include "vfgen.h"

#include <ctype.h>

static uint64_t *seeds;
static int nseeds;
/* 13 and 59: typed sets (one after a slot, beside a mixture of experts) */
static const uint64_t fixed_seeds[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 59};

/* ---- failures, collected: one program can show several ---- */
static char fails[16384];
static int nfails;
static void __attribute__((format(printf, 1, 2))) rfail(const char *fmt, ...) {
  size_t n = strlen(fails);
  if (n > sizeof fails - 400) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(fails + n, sizeof fails - n - 2, fmt, ap);
  va_end(ap);
  strcat(fails, "\n");
  nfails++;
}

static bool skip(const char *what) {
  const char *s = getenv("CAVS_RANDOM_SKIP");
  return s && strstr(s, what);
}

/* ---- builds ---- */
static const char *model_cflags(void) { return tu_env("CAVS_MODEL_CFLAGS", "-Wall -Werror"); }

static const char *model_name(const char *src, char *out, size_t n) {
  const char *m = strstr(src, "model ");
  ck_assert(m != NULL);
  m += 6;
  size_t k = 0;
  while (k + 1 < n && (isalnum((unsigned char)m[k]) || m[k] == '_')) out[k] = m[k], k++;
  out[k] = 0;
  return out;
}

/* cavs build of src (C target, double) with `extra` (an ablation, or NULL): the
 * descriptor, or NULL with a failure recorded */
static const cavs_desc *build_c(const char *src, const char *extra) {
  char *dir = tu_tmpdir(), vf[4200], so[4400];
  snprintf(vf, sizeof vf, "%s/prog.vf", dir);
  tu_write(vf, src, strlen(src));
  setenv("CAVS_MODEL_CFLAGS", model_cflags(), 1);
  char *argv[] = {(char *)tu_env("CAVS", "./cavs"), "build", "--precision", "double", "--target", "c", "-o", dir, vf,
                  (char *)extra, NULL};
  RunResult r = tu_run(NULL, argv, 120);
  if (r.status != 0) {
    rfail("cavs build%s%s: status %d: %s", extra ? " " : "", extra ? extra : "", r.status, tu_tail(r.err, 1200));
    tu_free(&r);
    tu_rmtree(dir);
    return NULL;
  }
  snprintf(so, sizeof so, "%.*s", (int)strcspn(r.out, "\n"), r.out);
  tu_free(&r);
  return open_model(so, dir);
}

/* cavsc --target=cuda, then g++ under cuda_host.h (cudatest.h's load_host_cuda_with,
 * failures recorded) */
static const cavs_desc *build_cuda_host(const char *src) {
  const char *top = tu_env("TOP_SRCDIR", ".");
  char model[128];
  model_name(src, model, sizeof model);
  char *dir = tu_tmpdir(), vf[4200], cmd[16384], so[4400];
  snprintf(vf, sizeof vf, "%s/%s.vf", dir, model);
  tu_write(vf, src, strlen(src));
  char *gen[] = {(char *)tu_env("CAVSC", "./cavsc"), "--target=cuda", "--precision=double", "-o", dir, vf, NULL};
  RunResult r = tu_run(NULL, gen, 60);
  if (r.status != 0) {
    rfail("cavsc --target=cuda: status %d: %s", r.status, tu_tail(r.err, 1200));
    tu_free(&r);
    tu_rmtree(dir);
    return NULL;
  }
  tu_free(&r);
  snprintf(so, sizeof so, "%s/%s.so", dir, model);
  snprintf(cmd, sizeof cmd,
           "%s -x c++ -std=c++17 -O2 -ffp-contract=off -fPIC -shared %s -include %s/tests/cuda_host.h -I%s/tests "
           "-I%s/runtime -o %s %s/%s.cu",
           tu_env("CXX", "g++"), model_cflags(), top, top, top, so, dir, model);
  char *sh[] = {"/bin/sh", "-c", cmd, NULL};
  r = tu_run(NULL, sh, 180);
  if (r.status != 0) {
    rfail("g++ of the CUDA target under cuda_host.h: status %d: %s%s", r.status, tu_tail(r.out, 400),
         tu_tail(r.err, 1200));
    tu_free(&r);
    tu_rmtree(dir);
    return NULL;
  }
  tu_free(&r);
  return open_model(so, dir);
}

/* ---- gradients against finite differences (check_gradcheck.c) ---- */
static bool loss_at(cavs_model *m, const cavs_graph *const *gs, double *loss) {
  cavs_stats st;
  if (cavs_model_forward(m, gs, TG_NGRAD, &st) != 0) {
    rfail("gradcheck: forward failed: %s", cavs_model_error(m));
    return false;
  }
  *loss = st.loss + st.aux_loss;
  return true;
}

static void gradcheck(const cavs_desc *d) {
  long dims[CAVS_MAX_DIMS];
  tg_grad_dims(d, dims);
  char err[256];
  cavs_model *m = cavs_model_new(d, dims, err, sizeof err);
  if (!m) {
    rfail("gradcheck: cavs_model_new: %s", err);
    return;
  }
  size_t np;
  static TGraph g[TG_NGRAD];
  const cavs_graph *gs[TG_NGRAD];
  double *p = tg_grad_start(m, d, dims, g, gs, &np);
  double l0;
  if (!loss_at(m, gs, &l0)) goto out;
  ck_assert_int_eq(cavs_model_poison(m), 0);
  if (!loss_at(m, gs, &l0)) goto out;
  if (!isfinite(l0)) {
    rfail("gradcheck: loss %g", l0);
    goto out;
  }
  cavs_model_backward(m);
  double *grad = malloc(sizeof(double) * np);
  memcpy(grad, cavs_model_grads_flat(m, &np), sizeof(double) * np);
  /* a program whose values grow with the graphs' depth (nothing bounds them) can reach a
     loss whose rounding (1e-16 of it) over a step of 1e-5 is more than 1e-6 of a
     gradient: finite differences say nothing there (seed 394's 1.5e10). Only a cell read
     unwritten is still looked for: a NaN among the gradients. */
  if (fabs(l0) > 1e8) {
    for (size_t i = 0; i < np; i++)
      if (!isfinite(grad[i])) {
        rfail("gradcheck: gradient %zu is %g (loss %g)", i, grad[i], l0);
        break;
      }
    if (getenv("CAVS_RANDOM_VERBOSE")) fprintf(stderr, "  gradcheck: loss %g, too large to difference\n", l0);
    goto out_grad;
  }
  int bad = 0, checked = 0, nonzero = 0;
  double worst = 0;
  for (int i = 0; i < d->nparams; i++) {
    long rows, cols, ld;
    double *w = cavs_model_param(m, i, &rows, &cols, &ld);
    double *gw = grad + (w - p);
    for (long r = 0; r < rows; r++)
      for (long j = 0; j < cols; j++) {
        double *x = &w[r * ld + j], keep = *x, ana = gw[r * ld + j], best = INFINITY, num5 = 0, nums[3] = {0};
        /* the best of three steps: a kink (relu, a routing) crossed by one step, or
           rounding at the smallest, is not a wrong gradient */
        static const double eps[] = {1e-5, 1e-4, 1e-6};
        for (int e = 0; e < 3 && best > 1e-6; e++) {
          double lp, lm;
          *x = keep + eps[e];
          bool ok = loss_at(m, gs, &lp);
          *x = keep - eps[e];
          ok = ok && loss_at(m, gs, &lm);
          *x = keep;
          if (!ok) goto out_grad;
          double num = (lp - lm) / (2 * eps[e]);
          if (e == 0) num5 = num;
          /* the floor grows with the loss, whose rounding a difference divides by the step
             (a typed set of itself, its sums deep: loss 2126, a gradient of 2e-5 off by 2e-9 at
             every step) */
          double er = fabs(ana - num) / fmax(fabs(ana) + fabs(num), 1e-4 * fmax(1, fabs(l0)));
          if (isnan(er)) er = INFINITY;
          if (er < best) best = er;
          nums[e] = num;
          /* after the smallest step, the differences at 1e-5 and 1e-6 extrapolated
             (Richardson): each is off by h^2 f'''(x) / 6, which this cancels, where the
             loss bends so fast that no step both gets past that and stays above rounding
             (seed 3845: W5[1,1]'s gradient 0.0050690650, the differences 0.0050673086 at
             1e-5 and 0.0050690473 at 1e-6 converging on it as h^2, extrapolated
             0.0050690649). A wrong gradient stays as far from it. */
          if (e == 2) {
            double rich = (100 * nums[2] - nums[0]) / 99;
            er = fabs(ana - rich) / fmax(fabs(ana) + fabs(rich), 1e-4 * fmax(1, fabs(l0)));
            if (er < best) best = er;
          }
        }
        if (best > worst) worst = best;
        if (best > 1e-6 && bad++ < 4)
          rfail("gradcheck: %s[%ld,%ld]: analytic %.10g, numeric %.10g (relative error %.3g)", d->params[i].name, r, j,
               ana, num5, best);
        checked++;
        nonzero += fabs(ana) > 1e-6;
      }
  }
  if (bad > 4) rfail("gradcheck: %d of %d gradients wrong, worst %.3g", bad, checked, worst);
  if (getenv("CAVS_RANDOM_VERBOSE"))
    fprintf(stderr, "  gradcheck: %d entries, %d nonzero, worst %.3g, loss %.6g\n", checked, nonzero, worst, l0);
out_grad:
  free(grad);
out:
  cavs_model_free(m);
}

/* ---- two models on one minibatch: the loss, counts and every parameter gradient ---- */
/* values that overflowed alike in both runs: a recurrence that grows with the depth, on
   the minibatch's deeper graphs, gives inf and then NaN (inf - inf, 0 * inf) in the
   state, and NaN in the gradients behind it where a loss reads it (where none does,
   no gradient is computed: unread_block; seed 690 of a sweep, whose loss is finite,
   had every gradient into the vertex block NaN). The same non-finite cell agrees; a largest value is
   taken over the finite ones only (an inf there would pass every other cell). Nothing
   here was poisoned with NaN: an unwritten cell read is gradcheck's to find. */
static bool same_nonfinite(double x, double y) { return (isnan(x) && isnan(y)) || (isinf(x) && x == y); }

static double tol_diff = 1e-9;
static double worst_seen[8];

static void same_run(const char *what, cavs_model *a, cavs_model *b, const cavs_graph **gs, int k, bool tasks_differ,
                     int slot) {
  cavs_stats sa, sb;
  if (cavs_model_forward(a, gs, k, &sa) != 0) {
    rfail("%s: reference forward failed: %s", what, cavs_model_error(a));
    return;
  }
  if (cavs_model_forward(b, gs, k, &sb) != 0) {
    rfail("%s: forward failed: %s", what, cavs_model_error(b));
    return;
  }
  (void)tasks_differ;
  /* a program whose values overflow on the larger graphs (a recurrence that grows with
     the depth: seed 195) has nothing to compare */
  if (!isfinite(sa.loss)) {
    if (getenv("CAVS_RANDOM_VERBOSE")) fprintf(stderr, "  %s: the reference's loss is %g: not compared\n", what, sa.loss);
    return;
  }
  double rel = fabs(sa.loss - sb.loss) / fmax(fabs(sa.loss), 1e-300);
  if (!(rel <= tol_diff)) rfail("%s: loss %.15g vs %.15g", what, sa.loss, sb.loss);
  if (!(fabs(sa.aux_loss - sb.aux_loss) <= tol_diff * fmax(fabs(sa.aux_loss), 1e-12)))
    rfail("%s: balancing loss %.15g vs %.15g", what, sa.aux_loss, sb.aux_loss);
  if (sa.correct != sb.correct || sa.count != sb.count)
    rfail("%s: counts %ld/%ld vs %ld/%ld", what, (long)sa.correct, (long)sa.count, (long)sb.correct, (long)sb.count);
  cavs_model_backward(a);
  cavs_model_backward(b);
  const cavs_desc *d = a->d;
  double scale = 0;
  for (int i = 0; i < d->nparams; i++) {
    long rows, cols, ld;
    const double *ga = cavs_model_grad(a, i, &rows, &cols, &ld);
    for (long r = 0; r < rows; r++)
      for (long j = 0; j < cols; j++)
        if (isfinite(ga[r * ld + j])) scale = fmax(scale, fabs(ga[r * ld + j]));
  }
  /* a gradient that vanishes everywhere (logits that a parameter moves all alike, which
     softmax cancels) is rounding, summed in another order batched: below 1e-6 of the
     loss, gradients are compared as that much */
  double floor = 1e-6 * fmax(1, fabs(sa.loss));
  int bad = 0;
  double worst = rel;
  for (int i = 0; i < d->nparams; i++) {
    long rows, cols, lda, ldb;
    const double *ga = cavs_model_grad(a, i, &rows, &cols, &lda), *gb = cavs_model_grad(b, i, &rows, &cols, &ldb);
    for (long r = 0; r < rows; r++)
      for (long j = 0; j < cols; j++) {
        double x = ga[r * lda + j], y = gb[r * ldb + j];
        double e = fabs(x - y) / fmax(fmax(fabs(x), 1e-2 * scale), floor);
        if (isnan(e)) e = INFINITY;
        if (same_nonfinite(x, y)) e = 0;
        if (e > worst) worst = e;
        if (e > tol_diff && bad++ < 3) rfail("%s: gradient of %s[%ld,%ld]: %.15g vs %.15g", what, d->params[i].name, r, j, x, y);
      }
  }
  if (bad > 3) rfail("%s: %d gradients differ", what, bad);
  if (worst > worst_seen[slot]) worst_seen[slot] = worst;
}

static void batched_vs_serial(const cavs_desc *d, bool balance) {
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true);
  static const int pol[] = {CAVS_BFS, CAVS_DEPTH, CAVS_AGENDA, CAVS_FRONTIER};
  static const char *const pname[] = {"batched (bfs) vs serial", "depth vs serial", "agenda vs serial",
                                      "frontier vs serial"};
  /* a load-balancing loss is a mean over the rows routed together: each task's own */
  if (balance) return;
  for (int p = 0; p < 4; p++) {
    cavs_model *a = new_model(d, dims, 5), *b = new_model(d, dims, 5);
    cavs_model_set_policy(a, CAVS_SERIAL);
    cavs_model_set_policy(b, pol[p]);
    same_run(pname[p], a, b, gs, k, true, 0);
    cavs_model_free(a);
    cavs_model_free(b);
  }
}

static void runtime_ablations(const cavs_desc *d, bool balance) {
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(d, dims, g, gs, true);
  static const struct {
    int ab;
    const char *name;
    bool tasks;
  } ab[] = {{CAVS_NO_EAGER, "no-eager vs default", true},
            {CAVS_NO_LAZY, "no-lazy vs default", true},
            {CAVS_NO_EAGER | CAVS_NO_LAZY, "no-eager no-lazy vs default", true},
            {CAVS_NO_VIEWS, "no-views vs default", false},
            {CAVS_NO_HOMES, "no-homes (runtime) vs default", false},
            {CAVS_NO_DEDUP, "no-dedup vs default", false},
            {CAVS_ROWMAT_BY_GEMM, "rowmat-by-gemm vs default", false}};
  for (size_t i = 0; i < sizeof ab / sizeof *ab; i++) {
    if (balance && ab[i].tasks) continue;
    cavs_model *a = new_model(d, dims, 5), *b = new_model(d, dims, 5);
    cavs_model_set_ablations(b, ab[i].ab);
    same_run(ab[i].name, a, b, gs, k, false, 1);
    cavs_model_free(a);
    cavs_model_free(b);
  }
}

static void build_ablations(const char *src, const cavs_desc *ref) {
  const char *flags[] = {"--no-fuse", "--no-merge", "--no-homes", "--no-push-view"};
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  int k = tg_minibatch(ref, dims, g, gs, true);
  for (int f = 0; f < 4; f++) {
    const cavs_desc *d = build_c(src, flags[f]);
    if (!d) continue;
    cavs_model *a = new_model(ref, dims, 5), *b = new_model(d, dims, 5);
    char what[64];
    snprintf(what, sizeof what, "%s vs default", flags[f]);
    same_run(what, a, b, gs, k, false, 2);
    cavs_model_free(a);
    cavs_model_free(b);
  }
}

/* ---- the CUDA target's kernels on the cpu against the C target (check_cuda_host) ---- */
static bool cells_agree(const cavs_model *mc, const void *c, const void *u, long rows, long cols, long ld,
                        const char *what, double tol, double scale) {
  double least = tol * 1e-3;
  for (long r = 0; r < rows; r++)
    for (long j = 0; j < cols; j++) {
      double v = cv_test_at(mc, c, (size_t)(r * ld + j));
      if (isfinite(v)) scale = fmax(scale, fabs(v));
    }
  for (long r = 0; r < rows; r++)
    for (long j = 0; j < cols; j++) {
      double want = cv_test_at(mc, c, (size_t)(r * ld + j)), got = cv_test_at(mc, u, (size_t)(r * ld + j));
      /* (poison_bufs writes -7.25, not NaN: a NaN on both sides was computed) */
      if (!agree(want, got, tol) && !(fabs(want - got) <= least * scale) && !same_nonfinite(want, got)) {
        rfail("cuda-host vs C: %s[%ld, %ld]: C %.17g, CUDA %.17g", what, r, j, want, got);
        return false;
      }
    }
  return true;
}

static void cuda_buffers(const cavs_model *c, const cavs_model *u, bool grads) {
  const cavs_desc *d = c->d;
  for (int b = 0; b < d->nbufs; b++) {
    char what[300];
    snprintf(what, sizeof what, "%s of buffer %d (%s)", grads ? "gradient" : "value", b, d->bufs[b].name);
    if (!grads || c->grad[b])
      if (!cells_agree(c, grads ? c->grad[b] : c->val[b], grads ? u->grad[b] : u->val[b],
                       d->bufs[b].edge ? c->nedges : c->rows, c->bw[b], c->bw[b], what, 1e-12, 0))
        return;
  }
}

static void host_write(cavs_model *m, void *dst, const void *src, size_t bytes) {
  (void)m;
  memcpy(dst, src, bytes);
}

static void cuda_vs_c(const char *src, const cavs_desc *dc) {
  const cavs_desc *h = build_cuda_host(src);
  if (!h) return;
  static cavs_desc du;
  du = *h;
  if (du.target != CAVS_TARGET_CUDA) rfail("cuda-host: the CUDA target's descriptor says target %d", du.target);
  du.target = CAVS_TARGET_C;
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  cavs_model *mc, *mu;
  int k = cuda_and_c(dc, &du, dims, g, gs, &mc, &mu);
  /* every looked-up row multiplied on both sides: a word multiplied once leaves its
     rows' gradient at the word's first row (cavs_gemm_table: a pulled row's; and
     cavs_gemm_kids, which the CUDA target does not emit: a table type's state's and its
     gathered rows', none at a row without a word), the table's the same sum
     (runtime_ablations's no-dedup; check_cuda_host's streams) */
  cavs_model_set_ablations(mc, CAVS_NO_DEDUP);
  cavs_model_set_ablations(mu, CAVS_NO_DEDUP);
  cavs_stats sc, su;
  if (cavs_model_forward(mc, gs, k, &sc) != 0 || cavs_model_forward(mu, gs, k, &su) != 0) {
    rfail("cuda-host: a forward pass failed: %s / %s", cavs_model_error(mc), cavs_model_error(mu));
    goto out;
  }
  poison_bufs(mc, false, host_write);
  poison_bufs(mu, false, host_write);
  if (cavs_model_forward(mc, gs, k, &sc) != 0 || cavs_model_forward(mu, gs, k, &su) != 0) {
    rfail("cuda-host: a forward pass failed: %s / %s", cavs_model_error(mc), cavs_model_error(mu));
    goto out;
  }
  if (!isfinite(sc.loss)) goto out; /* overflowed: nothing to compare (same_run) */
  cuda_buffers(mc, mu, false);
  if (!agree(sc.loss, su.loss, 1e-12)) rfail("cuda-host vs C: loss: C %.17g, CUDA %.17g", sc.loss, su.loss);
  if (!agree(sc.aux_loss, su.aux_loss, 1e-12))
    rfail("cuda-host vs C: balancing loss: C %.17g, CUDA %.17g", sc.aux_loss, su.aux_loss);
  if (sc.count != su.count || sc.correct != su.correct || sc.tasks != su.tasks)
    rfail("cuda-host vs C: counts %ld/%ld/%d vs %ld/%ld/%d", (long)sc.correct, (long)sc.count, sc.tasks,
         (long)su.correct, (long)su.count, su.tasks);
  for (int r = 0; r < mc->rows; r++)
    if (mc->pred[r] != mu->pred[r]) {
      rfail("cuda-host vs C: prediction of row %d: C %d, CUDA %d", r, mc->pred[r], mu->pred[r]);
      break;
    }
  poison_bufs(mc, true, host_write);
  poison_bufs(mu, true, host_write);
  cavs_model_backward(mc);
  cavs_model_backward(mu);
  cuda_buffers(mc, mu, true);
  for (int i = 0; i < dc->nparams; i++) {
    long rows, cols, ld;
    const void *gc = cavs_model_grad(mc, i, &rows, &cols, &ld), *gu = cavs_model_grad(mu, i, &rows, &cols, &ld);
    char what[300];
    snprintf(what, sizeof what, "gradient of %s", dc->params[i].name);
    if (!cells_agree(mc, gc, gu, rows, cols, ld, what, 1e-12, 0)) break;
  }
out:
  cavs_model_free(mc);
  cavs_model_free(mu);
}

/* ---- one program ---- */
static void check_program(const char *src, const char *label, bool balance) {
  fails[0] = 0;
  nfails = 0;
  memset(worst_seen, 0, sizeof worst_seen);
  double t0 = (double)clock();
  const cavs_desc *d = build_c(src, NULL);
  if (d) {
    if (!skip("grad")) gradcheck(d);
    if (!skip("serial")) batched_vs_serial(d, balance);
    if (!skip("ablate")) runtime_ablations(d, balance);
    if (!skip("build")) build_ablations(src, d);
    if (!skip("cuda")) cuda_vs_c(src, d);
  }
  if (getenv("CAVS_RANDOM_VERBOSE"))
    fprintf(stderr, "%s: %d failures; worst serial %.3g, runtime ablations %.3g, build ablations %.3g (%.1fs cpu)\n",
            label, nfails, worst_seen[0], worst_seen[1], worst_seen[2], ((double)clock() - t0) / CLOCKS_PER_SEC);
  if (nfails) {
    const char *keep = getenv("CAVS_RANDOM_KEEP");
    if (keep && *keep) {
      char path[4200];
      snprintf(path, sizeof path, "%s/%s.vf", keep, label);
      FILE *f = fopen(path, "w");
      if (f) {
        fputs(src, f);
        fprintf(f, "\n/* %s */\n", fails);
        fclose(f);
      }
    }
    ck_abort_msg("%s: %.3000s", label, fails);
  }
}

START_TEST(random_program) {
  uint64_t seed = seeds[_i];
  bool balance;
  char *src = vg_program_flags(seed, &balance);
  char label[64];
  snprintf(label, sizeof label, "seed-%llu", (unsigned long long)seed);
  check_program(src, label, balance);
  free(src);
}
END_TEST

START_TEST(program_file) {
  const char *path = getenv("CAVS_RANDOM_FILE");
  size_t n;
  char *src = tu_slurp(path, &n);
  ck_assert_msg(src != NULL, "cannot read %s", path);
  const char *b = getenv("CAVS_RANDOM_BALANCE");
  check_program(src, "file", b && *b == '1');
  free(src);
}
END_TEST

/* A block no loss reads (the push block's loss reads an input alone) whose state
 * overflows on the deeper graphs (s * s * 1e300 from the third level up): its
 * parameters' gradients are 0, not NaN (0 times inf, where its backward pass ran:
 * seed 690 of a sweep), and the rest's agree with finite differences. */
START_TEST(unread_block) {
  const char *src = "model unread; dim H = 3; dim C = 3; dim V = 5;\n"
                    "input word : index[V]; input f : real[H]; input y : class[C];\n"
                    "param emb[V,H], W[H,H], Wc[H,C] init uniform(-1, 1);\n"
                    "pull { x = emb[word]; }\n"
                    "vertex a (children 2) { x = pull(); s = gather(0) + gather(1);\n"
                    "  h = s * s * 1e300 + x @ W + 1; scatter(h); push(h); }\n"
                    "push (h) { loss softmax_xent(f @ Wc, y); }\n";
  fails[0] = 0;
  nfails = 0;
  const cavs_desc *d = build_c(src, NULL);
  ck_assert_msg(d != NULL, "%s", fails);
  long dims[CAVS_MAX_DIMS];
  tg_grad_dims(d, dims);
  char err[256];
  cavs_model *m = cavs_model_new(d, dims, err, sizeof err);
  ck_assert_msg(m != NULL, "%s", err);
  size_t np;
  static TGraph g[TG_NGRAD];
  const cavs_graph *gs[TG_NGRAD];
  double *p = tg_grad_start(m, d, dims, g, gs, &np), loss;
  ck_assert(loss_at(m, gs, &loss) && isfinite(loss));
  int bg, bv;
  char why[256];
  ck_assert_msg(cavs_model_check_finite(m, &bg, &bv, why, sizeof why) != 0, "the state did not overflow");
  cavs_model_backward(m);
  const double *grad = cavs_model_grads_flat(m, &np);
  for (int i = 0; i < d->nparams; i++) {
    long rows, cols, ld;
    const double *w = cavs_model_param(m, i, &rows, &cols, &ld), *gw = grad + (w - p);
    bool unread = strcmp(d->params[i].name, "Wc") != 0;
    for (long r = 0; r < rows; r++)
      for (long j = 0; j < cols; j++)
        ck_assert_msg(isfinite(gw[r * ld + j]) && (!unread || gw[r * ld + j] == 0), "%s[%ld, %ld]: %g",
                      d->params[i].name, r, j, gw[r * ld + j]);
  }
  cavs_model_free(m);
  gradcheck(d);
  ck_assert_msg(nfails == 0, "%s", fails);
}
END_TEST

/* A product no loss reaches (the state `children *` never reads) whose left operand a
 * loss reaches another way: the product sends nothing back, so it is not the first to
 * write that operand's gradient (CAVS_PROD_DX_SET, plan.c): the push's product is, and
 * nothing reads the gradient unwritten (seed 26 of the sweep after the fifth stream:
 * every gradient before it NaN, read from the poisoned buffer). */
START_TEST(unread_product_sets_nothing) {
  const char *src = "model unread2; dim H = 3; dim C = 3; dim V = 5;\n"
                    "input word : index[V]; input y : class[C];\n"
                    "param emb[V,H], W1[H,H], W2[H,H], W3[H,H], Wc[H,C] init uniform(-1, 1);\n"
                    "vertex a (children *) { t1 = tanh(emb[word] @ W1); scatter(t1 @ W2); push((t1 + t1) @ W3); }\n"
                    "push (h) { loss softmax_xent(h @ Wc, y); }\n";
  check_program(src, "unread2", false);
}
END_TEST

/* "1-5,9,20-29" */
static void parse_seeds(const char *s) {
  size_t cap = 64;
  seeds = malloc(cap * sizeof *seeds);
  while (*s) {
    char *e;
    unsigned long long a = strtoull(s, &e, 10), b = a;
    if (e == s) break;
    s = e;
    if (*s == '-') b = strtoull(s + 1, &e, 10), s = e;
    for (unsigned long long x = a; x <= b; x++) {
      if ((size_t)nseeds == cap) seeds = realloc(seeds, (cap *= 2) * sizeof *seeds);
      seeds[nseeds++] = x;
    }
    if (*s == ',') s++;
  }
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--print")) {
    char *src = vg_program_flags(strtoull(argv[2], NULL, 10), NULL);
    fputs(src, stdout);
    free(src);
    return 0;
  }
  /* sets of up to 8 children (the Child-Sum Tree-LSTM's): a task's edges several of one
     vertex's */
  tg_set_more = 4;
  const char *env = getenv("CAVS_RANDOM_SEEDS");
  if (env && *env) parse_seeds(env);
  else {
    seeds = malloc(sizeof fixed_seeds);
    memcpy(seeds, fixed_seeds, sizeof fixed_seeds);
    /* (a checked build looks for memory errors, not numbers: two programs, each built
       six times, are its share of CI's time) */
    nseeds = tu_checked_build() ? 2 : (int)(sizeof fixed_seeds / sizeof *fixed_seeds);
  }
  Suite *s = suite_create("random");
  TCase *tc = tcase_create("programs");
  tcase_set_timeout(tc, 600);
  const char *file = getenv("CAVS_RANDOM_FILE");
  if (file && *file) tcase_add_test(tc, program_file);
  else tcase_add_loop_test(tc, random_program, 0, nseeds);
  if (!(file && *file) && !(env && *env)) {
    tcase_add_test(tc, unread_block);
    tcase_add_test(tc, unread_product_sets_nothing);
  }
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}

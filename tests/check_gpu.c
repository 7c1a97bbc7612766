/* check_gpu.c: the CUDA backend against the CPU backend, on a real GPU (`make
 * check-cuda`; not part of `make check`, and skipped, exit 77, where the cuda backend
 * cannot run: not built, no driver, no device).
 *
 * For every example model, and a dropout's and a noisy gate's (tests/drawn.h): the CUDA
 * target's code on the cuda backend and the C target's on the cpu backend, same dims,
 * same seed, same minibatch of random trees (and DAGs where the model has one vertex
 * type with children): the loss and every parameter gradient agree (relative 1e-5 in
 * double, 1e-3 in float); one vertex per task on the GPU gives what batching does, one
 * stream what two do, and a pass captured as a CUDA graph what one launched kernel by
 * kernel (a mixture of experts' first pass launched, the rest graphs); then `cavs
 * train` for two epochs on each device prints the same losses (1e-3), and a checkpoint
 * the GPU wrote evaluates on the CPU to the accuracy the GPU gives it. */
#include <unistd.h>

#include "cli.h"
#include "drawn.h"
#include "engine.h"

/* example files, and the text of drawn.h's two models (a dropout's masks and a noisy
   gate's draws, keyed as the cpu backend keys them) */
static const char *examples[] = {"treelstm.vf", "treefc.vf", "lstm_lm.vf", "treegru.vf", "twotype.vf", "moe_tree.vf",
                                 drop_src, noise_src};
enum { NEX = sizeof examples / sizeof *examples };

/* The model's parameters, or gradients, as doubles, read through cavs_model_read. */
static double *flat(cavs_model *m, bool grads, bool dbl, size_t *n) {
  const void *p = grads ? cavs_model_grads_flat(m, n) : cavs_model_params_flat(m, n);
  size_t es = dbl ? 8 : 4;
  void *raw = malloc(*n * es + 1);
  double *out = malloc(*n * sizeof *out + 1);
  ck_assert(raw && out);
  ck_assert_msg(cavs_model_read(m, raw, p, *n * es) == 0, "%s", cavs_model_error(m));
  for (size_t i = 0; i < *n; i++) out[i] = dbl ? ((double *)raw)[i] : (double)((float *)raw)[i];
  free(raw);
  return out;
}

static cavs_model *make_opts(const cavs_desc *d, const long *dims, const char *backend, int one_stream, int graphs) {
  char err[512];
  cavs_model_opts o = {.backend = backend, .one_stream = one_stream, .graphs = graphs};
  cavs_model *m = cavs_model_new_opts(d, dims, &o, err, sizeof err);
  ck_assert_msg(m != NULL, "%s: %s", backend, err);
  cavs_model_init(m, 5);
  return m;
}
static cavs_model *make(const cavs_desc *d, const long *dims, const char *backend) {
  return make_opts(d, dims, backend, 0, 0);
}

/* The same minibatch on two models: losses, then gradients, within tol. */
static void same_step(cavs_model *a, cavs_model *b, const cavs_graph *const *gs, int k, bool dbl, double tol,
                      const char *what) {
  cavs_stats sa, sb;
  ck_assert_msg(cavs_model_forward(a, gs, k, &sa) == 0, "%s", cavs_model_error(a));
  ck_assert_msg(cavs_model_forward(b, gs, k, &sb) == 0, "%s", cavs_model_error(b));
  ck_assert_msg(fabs(sa.loss - sb.loss) <= tol * fabs(sa.loss), "%s: loss %.10g vs %.10g", what, sa.loss, sb.loss);
  cavs_model_backward(a);
  cavs_model_backward(b);
  size_t n, nb;
  double *ga = flat(a, true, dbl, &n), *gb = flat(b, true, dbl, &nb);
  ck_assert_int_eq(n, nb);
  double scale = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ga[i]));
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(fabs(ga[i] - gb[i]) <= tol * fmax(fabs(ga[i]), 1e-2 * scale), "%s: gradient %zu: %.10g vs %.10g",
                  what, i, ga[i], gb[i]);
  free(ga);
  free(gb);
}

static void against_cpu(const char *file, const char *prec, double tol) {
  bool dbl = !strcmp(prec, "double");
  const cavs_desc *dc = load_model_for(file, prec, "c"), *dg = load_model_for(file, prec, "cuda");
  long dims[CAVS_MAX_DIMS];
  static TGraph g[TG_MINIBATCH];
  const cavs_graph *gs[TG_MINIBATCH];
  /* DAGs in double, as check_engine's batched-against-serial check */
  int k = tg_minibatch(dc, dims, g, gs, dbl);
  char what[300];
  const char *name = dc->name; /* (file may be a model's text) */
  cavs_model *cpu = make(dc, dims, "cpu"), *gpu = make(dg, dims, "cuda");
  snprintf(what, sizeof what, "%s (%s), cpu vs cuda", name, prec);
  same_step(cpu, gpu, gs, k, dbl, tol, what);
  /* the same parameters after a step on each. Adam's first update is lr u(s g), u(x) =
     x / (|x| + eps) (the moments' bias corrected, s the clip's scale): lr times g's sign
     where |s g| is well past eps, and there the parameters agree to tol. Where a gradient
     is near zero, its error (what same_step allowed: d) moves the update by up to lr
     (u(s (g + d)) - u(s (g - d))), u being increasing: the bound there. In float, where
     the device's products add in another order, a gradient 0 on one side can be 1e-9
     on the other, and the update's sign is rounding's. */
  cavs_optim o = {.kind = CAVS_ADAM, .lr = 1e-2, .clip = 1, .eps = 1e-8};
  size_t n;
  double *gc = flat(cpu, true, dbl, &n), gscale = 0, norm = 0;
  for (size_t i = 0; i < n; i++) gscale = fmax(gscale, fabs(gc[i])), norm += gc[i] * gc[i];
  double sc = fmin(1, o.clip / sqrt(norm));
  ck_assert(cavs_model_step(cpu, &o) == 0);
  ck_assert_msg(cavs_model_step(gpu, &o) == 0, "%s", cavs_model_error(gpu));
  double *pc = flat(cpu, false, dbl, &n), *pg = flat(gpu, false, dbl, &n);
  for (size_t i = 0; i < n; i++) {
    double d = tol * fmax(fabs(gc[i]), 1e-2 * gscale), hi = sc * (gc[i] + d), lo = sc * (gc[i] - d);
    double lim = tol * fmax(fabs(pc[i]), 1e-2) + o.lr * (hi / (fabs(hi) + o.eps) - lo / (fabs(lo) + o.eps));
    ck_assert_msg(fabs(pc[i] - pg[i]) <= lim, "%s: parameter %zu after a step: %.10g vs %.10g (gradient %.3g, of %.3g at most)",
                  what, i, pc[i], pg[i], gc[i], gscale);
  }
  free(gc);
  free(pc);
  free(pg);
  /* batched and one vertex a task, both on the GPU */
  cavs_model *a = make(dg, dims, "cuda"), *b = make(dg, dims, "cuda");
  cavs_model_set_policy(b, CAVS_SERIAL);
  snprintf(what, sizeof what, "%s (%s), batched vs serial on cuda", name, prec);
  same_step(a, b, gs, k, dbl, tol, what);
  cavs_model_free(a);
  cavs_model_free(b);
  /* two streams (the default) and one */
  a = make(dg, dims, "cuda");
  b = make_opts(dg, dims, "cuda", 1, 0);
  snprintf(what, sizeof what, "%s (%s), two streams vs one on cuda", name, prec);
  same_step(a, b, gs, k, dbl, tol, what);
  cavs_model_free(b);
  /* each pass as a CUDA graph: made, then updated in place for the same shape, then
     made again for another (a mixture of experts' first pass launched kernel by kernel,
     making its routes' arrays; the rest graphs, routed on the device) */
  b = make_opts(dg, dims, "cuda", 0, 1);
  snprintf(what, sizeof what, "%s (%s), CUDA graphs vs launches", name, prec);
  for (int round = 0; round < 3; round++) same_step(a, b, gs, round < 2 ? k : k - 1, dbl, tol, what);
  cavs_model_free(a);
  cavs_model_free(b);
  cavs_model_free(cpu);
  cavs_model_free(gpu);
}

START_TEST(examples_double) { against_cpu(examples[_i], "double", 1e-5); }
END_TEST

START_TEST(examples_float) { against_cpu(examples[_i], "float", 1e-3); }
END_TEST

/* The losses `cavs train` prints, epoch by epoch. */
static int losses(const char *out, double *l, int max) {
  int n = 0;
  for (const char *p = out; n < max && (p = strstr(p, "train loss ")); p++) l[n++] = atof(p + 11);
  return n;
}

START_TEST(train_on_each_device) {
  char *gen[] = {(char *)tu_env("CAVS", "./cavs"), "gen", "toy", "--graphs", "400", "--leaves", "12", "--words", "50",
                 "--seed", "3", "-o", path_in("toy.txt"), NULL};
  RunResult r = tu_run(NULL, gen, 60);
  ok(&r, "gen");
  tu_free(&r);
  double l[2][2];
  const char *dev[] = {"cpu", "cuda"}, *ck[] = {path_in("cpu.ckpt"), path_in("gpu.ckpt")};
  for (int d = 0; d < 2; d++) {
    r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("toy.txt"), "--dim", "E=32",
             "--dim", "H=32", "--epochs", "2", "--batch", "16", "--seed", "4", "--device", dev[d], "--save", ck[d], NULL);
    ok(&r, dev[d]);
    ck_assert_int_eq(losses(r.out, l[d], 2), 2);
    tu_free(&r);
  }
  for (int e = 0; e < 2; e++)
    ck_assert_msg(fabs(l[0][e] - l[1][e]) <= 1e-3 * fabs(l[0][e]), "epoch %d: cpu %.6f, cuda %.6f", e + 1, l[0][e],
                  l[1][e]);
  /* the GPU's checkpoint on the CPU: the accuracy the GPU gives it, up to two vertices
     (in float, a vertex whose two best classes are within the devices' last bits apart,
     nvcc contracting what the CPU does not, may go either way) */
  double acc[2];
  long count[2];
  for (int d = 0; d < 2; d++) {
    r = cavs("eval", ck[1], "--data", path_in("toy.txt"), "--device", dev[d], NULL);
    ok(&r, "eval");
    ck_assert(sscanf(strstr(r.out, "accuracy"), "accuracy %lf (all %ld", &acc[d], &count[d]) == 2);
    tu_free(&r);
  }
  ck_assert_int_eq(count[0], count[1]);
  ck_assert_msg(fabs(acc[0] - acc[1]) * (double)count[0] < 2.5, "cpu %.6f, cuda %.6f of %ld vertices", acc[0], acc[1],
                count[0]);
}
END_TEST

int main(void) {
  char why[512];
  if (cavs_backend_probe("cuda", why, sizeof why)) {
    /* where a GPU is known to be (its driver's device file, or bench/gpu-lent's
       CAVS_REQUIRE_GPU=1), the backend not loading is a failure, not a skip: a module
       built against a newer CUDA than the driver's, or a library missing, must not pass
       as "no GPU" in a session lent one for minutes */
    const char *req = getenv("CAVS_REQUIRE_GPU");
    if ((req && !strcmp(req, "1")) || access("/dev/nvidiactl", F_OK) == 0) {
      printf("check_gpu: a GPU is here (%s), but the cuda backend cannot run: %s\n",
             req && !strcmp(req, "1") ? "CAVS_REQUIRE_GPU=1" : "/dev/nvidiactl", why);
      return 1;
    }
    printf("check_gpu: skipped: %s\n", why);
    return 77;
  }
  if (cli_init("gpu")) return 1;
  Suite *s = suite_create("gpu");
  TCase *tc = tcase_create("against the cpu");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, examples_double, 0, NEX);
  tcase_add_loop_test(tc, examples_float, 0, NEX);
  tcase_add_test(tc, train_on_each_device);
  suite_add_tcase(s, tc);
  return tu_run_suite_shared(s, dir);
}

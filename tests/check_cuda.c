/* check_cuda.c: the CUDA target's output compiles and links. Every example model, at
 * both precisions, written fresh by `cavsc --target=cuda` and built by nvcc into a shared
 * object as `cavs build --target cuda` builds one, with every warning an error (the
 * kernels' and the host code's), then loaded here against libcavs: its descriptor says
 * the cuda target; also two models that take the target's rarer paths. Needs no GPU, only nvcc: without it (configure found none, or
 * --disable-cuda) the suite exits 77, which automake reports as skipped.
 *
 * What the kernels compute is checked without a GPU (and without nvcc) in
 * check_cuda_host: the same files compiled by g++ under cuda_host.h, each launch run
 * thread by thread on the CPU, against the C target's model. */
#include "cavs.h"
#include "testutil.h"

#include <dlfcn.h>

static const char *const models[] = {"treelstm", "treefc", "lstm_lm", "lstm_lm2", "treegru", "twotype", "tagger", "tagger_chars", "childsum", "lattice_lstm", "lattice_gru", "seq2seq", "mvrnn", "nary_treelstm"};
static const char *const precisions[] = {"float", "double"};

/* Two rarer paths: a model without dims or inputs (its descriptor's empty arrays), and a
 * backward kernel whose gradients may overlap (two slices of one buffer: atomic adds). */
static const struct {
  const char *name, *src;
} extra[] = {
    {"bare", "model bare;\nparam U[2,2] init uniform(-1, 1);\n"
             "vertex v (children 1) { h = tanh(gather(0) @ U + 1); scatter(h); }\n"},
    {"alias", "model alias; dim H = 4; dim C = 3; input y : class[C];\n"
              "param W[H,2H], Wc[H,C] init uniform(-1, 1); param b[H];\n"
              "vertex v (children 2) {\n  s = gather(0)[0:H] @ W;\n"
              "  h = tanh(s[0:H] * s[1:H+1] + b + gather(1)[0:H]);\n  scatter(concat(h, h)); push(h);\n}\n"
              "push (h) { loss softmax_xent(h @ Wc, y); }\n"},
};

/* cavsc --target=cuda on `vf` (a path, relative to `cwd`), then nvcc on what it wrote,
 * into MODEL.so, which is loaded. */
static void compiles(const char *cwd, const char *vf, const char *model, const char *prec) {
  char *dir = tu_tmpdir(), popt[64], cu[4400], inc[4400], so[4400], rpath[4400];
  snprintf(popt, sizeof popt, "--precision=%s", prec);
  char *gen[] = {(char *)tu_env("CAVSC", "./cavsc"), "--target=cuda", popt, "-o", dir, (char *)vf, NULL};
  RunResult r = tu_run(cwd, gen, 30);
  ck_assert_msg(r.status == 0, "%s: %s", vf, r.err);
  tu_free(&r);
  snprintf(cu, sizeof cu, "%s/%s.cu", dir, model);
  snprintf(so, sizeof so, "%s/%s.so", dir, model);
  snprintf(inc, sizeof inc, "-I%s/runtime", tu_env("TOP_SRCDIR", "."));
  /* the CUDA runtime shared, found beside nvcc's toolkit, as the driver links it */
  const char *nvcc_path = tu_env("NVCC", "nvcc"), *slash = strrchr(nvcc_path, '/');
  snprintf(rpath, sizeof rpath, "-rpath=%.*s/../lib64", slash ? (int)(slash - nvcc_path) : 1, slash ? nvcc_path : ".");
  /* the GPUs configure chose (NVCC_ARCH, as the module and the driver's models), so that
     what only compiles for some (double atomicAdd below sm_60) is compiled here too */
  char *nvcc[64] = {(char *)nvcc_path, "-shared", "-std=c++17", inc, "-Werror", "all-warnings", "-Xcompiler",
                    "-fPIC,-Wall,-Werror", "-cudart", "shared", "-Xlinker", rpath, "-o", so, cu};
  int k = 15;
  char *arch = strdup(tu_env("CAVS_NVCC_ARCH", ""));
  for (char *save = NULL, *w = strtok_r(arch, " ", &save); w && k < 63; w = strtok_r(NULL, " ", &save)) nvcc[k++] = w;
  nvcc[k] = NULL;
  r = tu_run(NULL, nvcc, 300);
  free(arch);
  ck_assert_msg(r.status == 0 && !*r.out && !*r.err, "nvcc %s (%s, status %d):\n%s%s", model, prec, r.status,
                tu_tail(r.out, 1500), tu_tail(r.err, 1500));
  tu_free(&r);
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(h != NULL, "dlopen: %s", dlerror());
  char sym[300];
  snprintf(sym, sizeof sym, "%s_desc", model);
  const cavs_desc *d = dlsym(h, sym);
  ck_assert_msg(d && d->target == CAVS_TARGET_CUDA && d->abi == CAVS_ABI_VERSION, "%s in %s", sym, so);
  ck_assert_int_eq(d->precision, strcmp(prec, "double") ? CAVS_FLOAT : CAVS_DOUBLE);
  /* and the cpu backend does not run it (this call is also what links libcavs, whose
     entry points the object's stages call) */
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  for (int i = 0; i < d->ndims; i++)
    if (dims[i] <= 0) dims[i] = 10;
  char err[512];
  ck_assert_ptr_null(cavs_model_new(d, dims, err, sizeof err));
  ck_assert_msg(strstr(err, "compiled for the cuda target"), "%s", err);
  tu_rmtree(dir);
}

START_TEST(examples_compile) {
  char vf[256];
  snprintf(vf, sizeof vf, "dsl-examples/%s.vf", models[_i / 2]);
  compiles(tu_env("TOP_SRCDIR", "."), vf, models[_i / 2], precisions[_i % 2]);
}
END_TEST

START_TEST(rare_paths_compile) {
  char *dir = tu_tmpdir(), vf[4400];
  snprintf(vf, sizeof vf, "%s/%s.vf", dir, extra[_i / 2].name);
  tu_write(vf, extra[_i / 2].src, strlen(extra[_i / 2].src));
  compiles(NULL, vf, extra[_i / 2].name, precisions[_i % 2]);
  tu_rmtree(dir);
}
END_TEST

int main(void) {
  if (!*tu_env("NVCC", "")) {
    puts("check_cuda: skipped: configure found no nvcc (or was given --disable-cuda)");
    return 77;
  }
  Suite *s = suite_create("cuda");
  TCase *tc = tcase_create("nvcc");
  tcase_set_timeout(tc, 600);
  /* every example (a literal 12 here left out lstm_lm2 and mvrnn once there were more) */
  tcase_add_loop_test(tc, examples_compile, 0, 2 * (int)(sizeof models / sizeof *models));
  tcase_add_loop_test(tc, rare_paths_compile, 0, 2 * 2);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}

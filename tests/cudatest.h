/* cudatest.h: helpers of the suites that run the CUDA target's code on the CPU:
 * check_cuda_host (its kernels, on the cpu backend's memory, under tests/cuda_host.h)
 * and check_cuda_emu (the cuda backend itself, on the emulated device of
 * tests/cuda_emu.h). A model's MODEL.cu compiled by the host C++ compiler under one of
 * those headers, and the comparison of two models' values cell by cell. */
#ifndef CUDATEST_H
#define CUDATEST_H

#include "engine.h"

#include "cv.h" /* the per-row buffers: the public API shows only what comes out of them */

/* cavsc --target=cuda on dsl-examples/MODEL.vf (or on `src`, the text of model MODEL),
 * then the host C++ compiler on MODEL.cu with tests/`header` force-included and the
 * flags every test model gets ($CAVS_MODEL_CFLAGS: -Wall -Werror and, in a sanitizer
 * build, the sanitizers); loaded as load_model loads the C target's. No fused
 * multiply-adds, as in the C target's build (-std=c11 implies -ffp-contract=off; g++
 * contracts where the machine has them): each value is then rounded as the C loop
 * rounds it. */
static inline const cavs_desc *load_host_cuda_with(const char *model, const char *src, const char *prec,
                                                   const char *header) {
  const char *top = tu_env("TOP_SRCDIR", ".");
  char *dir = tu_tmpdir(), popt[64], vf[4200], cmd[16384], so[4400];
  snprintf(popt, sizeof popt, "--precision=%s", prec);
  if (src) {
    snprintf(vf, sizeof vf, "%s/%s.vf", dir, model);
    tu_write(vf, src, strlen(src));
  } else {
    snprintf(vf, sizeof vf, "%s/dsl-examples/%s.vf", top, model);
  }
  char *gen[] = {(char *)tu_env("CAVSC", "./cavsc"), "--target=cuda", popt, "-o", dir, vf, NULL};
  RunResult r = tu_run(NULL, gen, 30);
  ck_assert_msg(r.status == 0, "cavsc --target=cuda %s: %s", vf, tu_tail(r.err, 1800));
  tu_free(&r);
  snprintf(so, sizeof so, "%s/%s.so", dir, model);
  snprintf(cmd, sizeof cmd,
           "%s -x c++ -std=c++17 -O2 -ffp-contract=off -fPIC -shared %s -include %s/tests/%s -I%s/tests -I%s/runtime "
           "-o %s %s/%s.cu",
           tu_env("CXX", "g++"), tu_env("CAVS_MODEL_CFLAGS", ""), top, header, top, top, so, dir, model);
  char *sh[] = {"/bin/sh", "-c", cmd, NULL};
  r = tu_run(NULL, sh, 120);
  ck_assert_msg(r.status == 0, "%s (status %d):\n%s%s", cmd, r.status, tu_tail(r.out, 800), tu_tail(r.err, 1800));
  tu_free(&r);
  return open_model(so, dir);
}

/* The C target's model dc and the CUDA target's du (its descriptor said C) on one
 * minibatch (tg_minibatch's, with DAGs): the graphs' count, the two models in *mc, *mu */
static inline int cuda_and_c(const cavs_desc *dc, const cavs_desc *du, long *dims, TGraph g[TG_MINIBATCH],
                             const cavs_graph *gs[TG_MINIBATCH], cavs_model **mc, cavs_model **mu) {
  int k = tg_minibatch(dc, dims, g, gs, true);
  *mc = new_model(dc, dims, 5), *mu = new_model(du, dims, 5);
  return k;
}

static inline double cv_test_at(const cavs_model *m, const void *p, size_t i) {
  return m->esize == 8 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

/* The reference value and the one under test, to `tol` relative (zero only to zero). */
static inline bool agree(double want, double got, double tol) {
  return fabs(want - got) <= tol * fmax(fabs(want), fabs(got));
}

/* rows x cols values at c and u (host memory, rows ld apart) agree, or the first that
 * does not is named: `what`[row, column], `ref` and `name` saying whose values they are.
 * Relative to each value, or (a sum whose terms cancel: its rounding is the terms', not
 * its own) to a thousandth of the matrix's largest; in float, to the largest at the same
 * tolerance (products of float operands summed in other orders, or one of them in
 * double, round apart by some hundred of its last places in values their terms cancel
 * to). The largest is `scale` where that is more (a matrix all of whose values are sums
 * that cancel: a parameter's gradient, against the model's largest). Rows where `skip` is
 * set are not compared (NULL: none). */
static inline void same_matrix_as(const cavs_model *mc, const void *c, const void *u, long rows, long cols, long ld,
                                  const char *what, double tol, const char *ref, const char *name,
                                  const unsigned char *skip, double scale) {
  double least = tol * (mc->esize == 4 ? 1 : 1e-3);
  for (long r = 0; r < rows; r++)
    for (long j = 0; j < cols; j++) scale = fmax(scale, fabs(cv_test_at(mc, c, (size_t)(r * ld + j))));
  for (long r = 0; r < rows; r++)
    for (long j = 0; j < cols && !(skip && skip[r]); j++) {
      double want = cv_test_at(mc, c, (size_t)(r * ld + j)), got = cv_test_at(mc, u, (size_t)(r * ld + j));
      if (!agree(want, got, tol) && !(tol > 0 && fabs(want - got) <= least * scale))
        ck_abort_msg("%s: %s[%ld, %ld]: %s %.17g, %s %.17g", mc->d->name, what, r, j, ref, want, name, got);
    }
}

/* Every value of a model's per-row buffers (grads: their gradients, where they have
 * them) set to one odd number, all the rows allocated, through `write` (a copy into the
 * model's memory): a cell a pass misses keeps it where the reference writes the cell. */
static inline void poison_bufs(cavs_model *m, bool grads, void (*write)(cavs_model *, void *, const void *, size_t)) {
  void **bufs = grads ? m->grad : m->val;
  for (int b = 0; b < m->d->nbufs; b++) {
    if (!bufs[b]) continue;
    size_t n = (size_t)(m->d->bufs[b].edge ? m->cap_edges : m->cap_rows) * (size_t)m->bw[b];
    char *host = malloc(n * m->esize + 1);
    ck_assert(host != NULL);
    for (size_t i = 0; i < n; i++) {
      if (m->esize == 8) ((double *)host)[i] = -7.25;
      else ((float *)host)[i] = -7.25f;
    }
    write(m, bufs[b], host, n * m->esize);
    free(host);
  }
}

#endif

/* install_app.c: an application built against the installed libcavs (check_install.sh):
 * its model (app.vf) compiled by the installed cavsc, its compile and link flags from
 * pkg-config. It builds four small trees in memory, trains on them for 60 steps and
 * fails unless the loss falls to a fifth; then it saves a checkpoint, loads it into a
 * second model and checks that both give the same loss. */
#include "app.h"
#include "cavs.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: install_app CKPT\n");
    return 2;
  }
  const cavs_desc *d = &app_desc;
  char err[512] = "";
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  cavs_model *m = cavs_model_new(d, dims, err, sizeof err);
  if (!m) {
    fprintf(stderr, "install_app: %s\n", err);
    return 1;
  }
  cavs_model_init(m, 7);
  /* four trees of three vertices: two leaves (words), a root whose class is whether the
     first word is odd; every vertex labeled with the root's class */
  /* the header's names for the columns of feat, which must be the descriptor's slots */
  int W = app_feat_word, L = app_feat_label;
  if (W != d->inputs[app_input_word].slot || L != d->inputs[app_input_label].slot || app_nfeat != d->nint) {
    fprintf(stderr, "install_app: the header's feat columns disagree with the descriptor\n");
    return 1;
  }
  static int child[4][6], feat[4][3 * app_nfeat];
  static cavs_graph g[4];
  const cavs_graph *gs[4];
  for (int t = 0; t < 4; t++) {
    int c[6] = {-1, -1, -1, -1, 0, 1};
    memcpy(child[t], c, sizeof c);
    for (int v = 0; v < 3; v++) {
      feat[t][v * app_nfeat + W] = v < 2 ? (t + v * 3) % 10 : -1;
      feat[t][v * app_nfeat + L] = t % 2;
    }
    g[t] = (cavs_graph){.n = 3, .maxc = 2, .child = child[t], .feat = feat[t]};
    gs[t] = &g[t];
  }
  cavs_optim opt = {.kind = CAVS_ADAM, .lr = 0.05};
  cavs_stats st;
  double first = 0, last = 0;
  for (int step = 0; step < 60; step++) {
    if (cavs_model_forward(m, gs, 4, &st)) {
      fprintf(stderr, "install_app: %s\n", cavs_model_error(m));
      return 1;
    }
    if (step == 0) first = st.loss;
    last = st.loss;
    cavs_model_backward(m);
    if (cavs_model_step(m, &opt)) {
      fprintf(stderr, "install_app: %s\n", cavs_model_error(m));
      return 1;
    }
  }
  printf("libcavs %s: loss %.4f -> %.4f\n", cavs_version(), first, last);
  int bad = !(last < first / 5);
  /* the trained parameters through a checkpoint (with the model's source, which the
     descriptor carries: NULL takes it; cavs eval compiles the model from it), into a
     model of their own */
  cavs_ckpt *k = NULL;
  cavs_model *m2 = NULL;
  cavs_stats st2;
  if (cavs_model_forward(m, gs, 4, &st) || cavs_ckpt_save(argv[1], m, NULL, NULL, NULL, err, sizeof err) ||
      !(k = cavs_ckpt_read(argv[1], err, sizeof err)) || !(m2 = cavs_model_new(d, dims, err, sizeof err)) ||
      cavs_ckpt_apply(k, m2, err, sizeof err) || cavs_model_forward(m2, gs, 4, &st2)) {
    fprintf(stderr, "install_app: %s\n", *err ? err : cavs_model_error(m));
    return 1;
  }
  cavs_ckpt_free(k);
  if (st2.loss != st.loss) {
    fprintf(stderr, "install_app: the checkpoint's model gives loss %.9g, the trained one %.9g\n", st2.loss, st.loss);
    bad = 1;
  }
  cavs_model_free(m2);
  cavs_model_free(m);
  return bad;
}

/* check_driver.c: the real `cavs` binary, as a user runs it: generate data, train, save,
 * evaluate, predict, resume bit for bit, refuse damaged or foreign checkpoints, honour
 * --dim, build a model into a directory, and the demo reaches the accuracy the README
 * states. */
#include "cavs.h"
#include "cli.h"
#include "driver.h" /* schedule.c's functions, compiled in */

#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <jansson.h>
#include <pty.h>
#include <zlib.h>
#include <sys/stat.h>

static void gen_data(void) {
  static bool done;
  if (done) return;
  RunResult r = cavs("gen", "toy", "--graphs", "1500", "--leaves", "12", "--words", "60", "--seed", "1", "-o",
                     path_in("train.txt"), NULL);
  ok(&r, "gen train");
  tu_free(&r);
  r = cavs("gen", "toy", "--graphs", "300", "--leaves", "12", "--words", "60", "--seed", "2", "-o", path_in("dev.txt"), NULL);
  ok(&r, "gen dev");
  tu_free(&r);
  done = true;
}

/* A --log file's records, a JSON object a line (jansson, as strictly as it reads any
 * JSON), in an array. */
static json_t *log_records(const char *path) {
  char *text = tu_slurp(path, NULL);
  ck_assert_ptr_nonnull(text);
  json_t *all = json_array();
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    json_error_t e;
    json_t *rec = json_loads(line, JSON_REJECT_DUPLICATES, &e);
    ck_assert_msg(json_is_object(rec), "%s: not a JSON object (%s): %s", path, e.text, line);
    json_array_append_new(all, rec);
  }
  free(text);
  return all;
}

#define TRAIN(...)                                                                                     \
  cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dev",   \
       path_in("dev.txt"), "--dim", "E=12", "--dim", "H=16", "--batch", "32", "--threads", "1", __VA_ARGS__)

/* train --precision double: the model built and trained in double, which the checkpoint
 * keeps: info names it, eval and a resume build the model in it without being told, and
 * a resume told float is refused. */
START_TEST(train_in_double) {
  gen_data();
  RunResult r = TRAIN("--epochs", "1", "--precision", "double", "--save", path_in("d.ckpt"), "--quiet", NULL);
  ok(&r, "train --precision double");
  tu_free(&r);
  r = cavs("info", path_in("d.ckpt"), NULL);
  ok(&r, "info");
  ck_assert_msg(strstr(r.out, ", double)") && strstr(r.out, "1 epoch done"), "%s", tu_tail(r.out, 1200));
  /* Adam's two moments, saved with the steps */
  ck_assert_msg(strstr(r.out, "steps, state two blocks of moments ("), "%s", tu_tail(r.out, 1200));
  tu_free(&r);
  r = cavs("eval", path_in("d.ckpt"), "--data", path_in("dev.txt"), NULL);
  ok(&r, "eval of a double checkpoint");
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--resume", path_in("d.ckpt"), "--save", path_in("d.ckpt"), "--quiet", NULL);
  ok(&r, "resume of a double checkpoint");
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--resume", path_in("d.ckpt"), "--precision", "float", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "the checkpoint is in double precision, the model in float"), "%s",
                tu_tail(r.err, 600));
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--precision", "half", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "--precision: 'half' is not float or double"), "%s", tu_tail(r.err, 600));
  tu_free(&r);
}
END_TEST

/* Two predictions that must be the same numbers: the same text where libcavs's own
   product runs every product (AVX-512: a row's product has the same bits wherever the
   row falls in a product, so an inference pass, which takes an embedding's product
   from a table made for the whole vocabulary, gives the training pass's bits);
   elsewhere (in AVX2 a product of under 64 rows goes to the BLAS) the BLAS's products
   round a row by where it falls in its tiles, and the numbers agree to the printed
   digits' rounding. The same lines and words either way. */
static bool same_predictions(const char *a, const char *b) {
  __builtin_cpu_init();
  const char *e = getenv("CAVS_GEMM");
  if (__builtin_cpu_supports("avx512f") && !(e && *e)) return !strcmp(a, b);
  while (*a && *b) {
    char *ea = (char *)a, *eb = (char *)b;
    double x = 0, y = 0;
    if (!isspace((unsigned char)*a) && !isspace((unsigned char)*b)) x = strtod(a, &ea), y = strtod(b, &eb);
    if (ea == a || eb == b) { /* a space, or not a number: the same character */
      if (*a != *b) return false;
      a++, b++;
      continue;
    }
    if (fabs(x - y) > 2e-5 * fabs(x) + 1e-6) return false;
    a = ea, b = eb;
  }
  return !*a && !*b;
}

START_TEST(train_save_eval_predict) {
  gen_data();
  RunResult r = TRAIN("--epochs", "3", "--lr", "0.01", "--save", path_in("a.ckpt"), "--log", path_in("a.log"), NULL);
  ok(&r, "train");
  ck_assert_msg(strstr(r.out, "epoch 3/3") && strstr(r.out, "dev loss"), "%s", tu_tail(r.out, 1800));
  /* plain lines, not a progress bar, when stdout is not a terminal */
  ck_assert_ptr_null(strchr(r.out, '\r'));
  /* the last epoch's dev accuracy, as printed, is what eval of the saved state says */
  const char *last = strstr(r.out, "epoch 3/3");
  double dev_acc = 0;
  ck_assert(sscanf(strstr(last, "dev loss"), "dev loss %*f acc %lf", &dev_acc) == 1);
  tu_free(&r);
  r = cavs("eval", path_in("a.ckpt"), "--data", path_in("dev.txt"), NULL);
  ok(&r, "eval");
  double acc = -1;
  ck_assert(sscanf(strstr(r.out, "accuracy"), "accuracy %lf", &acc) == 1);
  ck_assert_msg(fabs(acc - dev_acc) < 1e-4, "eval says %.4f, training printed %.4f", acc, dev_acc);
  ck_assert_msg(acc > 0.6, "accuracy %.3f after 3 epochs", acc);
  tu_free(&r);
  /* --json: one object on stdout, on one line, the same accuracy, per-class counts that
     add up */
  r = cavs("eval", path_in("a.ckpt"), "--data", path_in("dev.txt"), "--json", NULL);
  ok(&r, "eval --json");
  ck_assert_msg(r.out[0] == '{' && !strchr(r.out, '\n')[1], "%s", r.out);
  json_error_t e;
  json_t *j = json_loads(r.out, JSON_REJECT_DUPLICATES, &e);
  ck_assert_msg(json_is_object(j), "eval --json: %s\n%s", e.text, r.out);
  double jacc = json_real_value(json_object_get(j, "accuracy"));
  long vertices = (long)json_integer_value(json_object_get(j, "vertices")), sum_count = 0, sum_correct = 0;
  ck_assert_msg(fabs(jacc - acc) < 1e-4, "json %.6f, text %.4f", jacc, acc);
  size_t k;
  json_t *c, *classes = json_object_get(j, "classes");
  ck_assert_int_eq(json_array_size(classes), 5);
  json_array_foreach(classes, k, c) {
    long cnt = (long)json_integer_value(json_object_get(c, "count")), cor = (long)json_integer_value(json_object_get(c, "correct"));
    ck_assert(cor <= cnt);
    sum_count += cnt, sum_correct += cor;
  }
  ck_assert_int_eq(sum_count, vertices);
  ck_assert_msg(labs(sum_correct - lround(jacc * (double)vertices)) <= 1, "%ld of %ld", sum_correct, vertices);
  json_decref(j);
  tu_free(&r);
  ck_assert_msg(access(path_in("a.ckpt.best"), F_OK) == 0, "no best-on-dev checkpoint");
  /* one JSON object per epoch, a line each, the epochs in order; the steps' gradient
     norms (libcavs's against a reference: check_engine), their mean at most their largest */
  json_t *log = log_records(path_in("a.log")), *rec;
  ck_assert_int_eq(json_array_size(log), 3);
  json_array_foreach(log, k, rec) {
    ck_assert_int_eq(json_integer_value(json_object_get(rec, "epoch")), (long)k + 1);
    ck_assert(json_is_real(json_object_get(rec, "dev_acc")) && json_is_string(json_object_get(rec, "time")));
    double mean = json_real_value(json_object_get(rec, "grad_norm_mean")),
           most = json_real_value(json_object_get(rec, "grad_norm_max"));
    ck_assert_msg(mean > 0 && mean <= most && isfinite(most), "grad norms %g, %g", mean, most);
  }
  /* the last dev accuracy, exactly what training computed: the epoch line's, rounded */
  double logged = json_real_value(json_object_get(json_array_get(log, 2), "dev_acc"));
  ck_assert_msg(fabs(logged - dev_acc) <= 0.5e-4 + 1e-12, "log %.17g, printed %.4f", logged, dev_acc);
  json_decref(log);
  /* predict: one class per graph */
  r = cavs("predict", path_in("a.ckpt"), "--data", path_in("dev.txt"), NULL);
  ok(&r, "predict");
  int n = 0, cls;
  for (char *p = r.out; sscanf(p, "%d", &cls) == 1; p = strchr(p, '\n') + 1) {
    ck_assert(cls >= 0 && cls < 5);
    n++;
    if (!strchr(p, '\n')) break;
  }
  ck_assert_int_eq(n, 300);
  /* --all-nodes: a class for every vertex (every node of the tree, one '(' each), the
     root's last and the same as above */
  RunResult all = cavs("predict", path_in("a.ckpt"), "--data", path_in("dev.txt"), "--all-nodes", NULL);
  ok(&all, "predict --all-nodes");
  char *dev = tu_slurp(path_in("dev.txt"), NULL);
  char *line = all.out, *root = r.out, *tree = dev;
  for (int g = 0; g < 300; g++) {
    int nodes = 0, classes = 0, last = -2, off;
    for (char *t = tree; *t && *t != '\n'; t++) nodes += *t == '(';
    for (char *p = line; *p != '\n' && sscanf(p, "%d%n", &cls, &off) == 1; p += off) {
      ck_assert(cls >= 0 && cls < 5);
      last = cls;
      classes++;
    }
    ck_assert_msg(classes == nodes, "graph %d: %d classes for %d vertices", g, classes, nodes);
    ck_assert_int_eq(last, atoi(root));
    line = strchr(line, '\n') + 1, root = strchr(root, '\n') + 1, tree = strchr(tree, '\n') + 1;
  }
  free(dev);
  tu_free(&all);
  /* --vectors: the root's pushed vector a line (H = 16 numbers); with --all-nodes every
     vertex's, "GRAPH VERTEX x...", the root's the same numbers as above */
  RunResult vec = cavs("predict", path_in("a.ckpt"), "--data", path_in("dev.txt"), "--vectors", NULL);
  ok(&vec, "predict --vectors");
  RunResult allv = cavs("predict", path_in("a.ckpt"), "--data", path_in("dev.txt"), "--vectors", "--all-nodes", NULL);
  ok(&allv, "predict --vectors --all-nodes");
  int vlines = 0, off;
  double x;
  for (char *p = vec.out; *p; p = strchr(p, '\n') + 1, vlines++) {
    int k = 0;
    for (char *q = p; *q != '\n' && sscanf(q, "%lf%n", &x, &off) == 1; q += off) k++;
    ck_assert_int_eq(k, 16);
  }
  ck_assert_int_eq(vlines, 300);
  /* graph 0's root line among every vertex's: "0 V" with V its last vertex */
  char *first_root = strndup(vec.out, (size_t)(strchr(vec.out, '\n') - vec.out));
  char *p = allv.out, *hit = NULL;
  for (; *p; p = strchr(p, '\n') + 1) {
    int g0, v0;
    if (sscanf(p, "%d %d%n", &g0, &v0, &off) == 2 && g0 == 0) hit = p + off + 1;
    if (g0 != 0) break;
  }
  ck_assert(hit && !strncmp(hit, first_root, strlen(first_root)) && hit[strlen(first_root)] == '\n');
  free(first_root);
  /* --value h: the same lines as --vectors (h is what the Tree-LSTM pushes), and with
     --all-nodes too; a name the model does not store is an error, said once */
  RunResult hv = cavs("predict", path_in("a.ckpt"), "--data", path_in("dev.txt"), "--value", "h", NULL);
  ok(&hv, "predict --value h");
  ck_assert_msg(same_predictions(hv.out, vec.out), "--value h differs from --vectors");
  tu_free(&hv);
  hv = cavs("predict", path_in("a.ckpt"), "--data", path_in("dev.txt"), "--value", "h", "--all-nodes", NULL);
  ok(&hv, "predict --value h --all-nodes");
  ck_assert_msg(same_predictions(hv.out, allv.out), "--value h --all-nodes differs from --vectors --all-nodes");
  tu_free(&hv);
  hv = cavs("predict", path_in("a.ckpt"), "--data", path_in("dev.txt"), "--value", "o", NULL);
  ok(&hv, "predict --value o (a gate, kept for a backward pass)");
  int gates = 0;
  for (char *q = hv.out; *q != '\n' && sscanf(q, "%lf%n", &x, &off) == 1; q += off, gates++)
    ck_assert_msg(x >= 0 && x <= 1, "gate o = %g", x); /* a sigmoid's */
  ck_assert_int_eq(gates, 16);
  tu_free(&hv);
  hv = cavs("predict", path_in("a.ckpt"), "--data", path_in("dev.txt"), "--value", "nonesuch", NULL);
  ck_assert_int_eq(hv.status, 1);
  ck_assert_msg(strstr(hv.err, "no value 'nonesuch'"), "%s", hv.err);
  tu_free(&hv);
  tu_free(&vec);
  tu_free(&allv);
  /* --probs: the root's class probabilities a line, summing to 1, largest at the class
     predicted above */
  RunResult pr = cavs("predict", path_in("a.ckpt"), "--data", path_in("dev.txt"), "--probs", NULL);
  ok(&pr, "predict --probs");
  char *cl = r.out;
  int plines = 0;
  for (char *p = pr.out; *p; p = strchr(p, '\n') + 1, cl = strchr(cl, '\n') + 1, plines++) {
    double sum = 0, best = -1;
    int k = 0, arg = -1;
    for (char *q = p; *q != '\n' && sscanf(q, "%lf%n", &x, &off) == 1; q += off, k++) {
      ck_assert(x >= 0 && x <= 1);
      sum += x;
      if (x > best) best = x, arg = k;
    }
    ck_assert_int_eq(k, 5);
    ck_assert_msg(fabs(sum - 1) < 1e-4, "graph %d: probabilities sum to %g", plines, sum);
    ck_assert_int_eq(arg, atoi(cl));
  }
  ck_assert_int_eq(plines, 300);
  tu_free(&pr);
  tu_free(&r);
  r = cavs("info", path_in("a.ckpt"), NULL);
  ok(&r, "info");
  ck_assert_msg(strstr(r.out, "model       treelstm") && strstr(r.out, "3 epochs done"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
}
END_TEST

/* Each vertex's label in a ptb-tree line, in the order cavs numbers them (children
 * first, the root last: the order their brackets close); the count, at most max. */
static int ptb_labels(const char *line, int *labels, int max) {
  int stack[4096], depth = 0, n = 0;
  for (const char *p = line; *p && *p != '\n'; p++) {
    if (*p == '(' && depth < 4096) stack[depth++] = atoi(p + 1);
    if (*p == ')' && depth > 0 && n < max) labels[n++] = stack[--depth];
  }
  return n;
}

/* Rows by columns of counts, as eval --json's "confusion" holds them. */
static void expect_matrix(const json_t *j, const char *key, const long *want, int rows, int cols) {
  const json_t *m = json_object_get(j, key);
  ck_assert_msg(json_array_size(m) == (size_t)rows, "%s: %zu rows", key, json_array_size(m));
  for (int y = 0; y < rows; y++) {
    const json_t *row = json_array_get(m, (size_t)y);
    ck_assert_int_eq(json_array_size(row), cols);
    for (int p = 0; p < cols; p++)
      ck_assert_msg(json_integer_value(json_array_get(row, (size_t)p)) == want[y * cols + p], "%s[%d][%d] is %lld, the predictions say %ld",
                    key, y, p, (long long)json_integer_value(json_array_get(row, (size_t)p)), want[y * cols + p]);
  }
}

/* Precision, recall and F1 by class, their macro (over the classes labeled or
 * predicted) and weighted averages, and the accuracy, from a matrix counted here. */
static void expect_scores(const json_t *j, const char *prefix, const long *cm, int rows, int cols, const char *acc,
                          const char *count) {
  long total = 0, right = 0;
  double macro[3] = {0}, weighted[3] = {0};
  int present = 0;
  char key[64];
  snprintf(key, sizeof key, "%sclasses", prefix);
  const json_t *classes = json_object_get(j, key);
  ck_assert_int_eq(json_array_size(classes), rows);
  for (int k = 0; k < rows; k++) {
    long support = 0, predicted = 0, tp = cm[k * cols + k];
    for (int p = 0; p < cols; p++) support += cm[k * cols + p];
    for (int y = 0; y < rows; y++) predicted += cm[y * cols + k];
    total += support, right += tp;
    double pr = predicted ? (double)tp / (double)predicted : 0, re = support ? (double)tp / (double)support : 0;
    double f1 = pr + re > 0 ? 2 * pr * re / (pr + re) : 0, got[3];
    const json_t *c = json_array_get(classes, (size_t)k);
    ck_assert_int_eq(json_integer_value(json_object_get(c, "count")), support);
    ck_assert_int_eq(json_integer_value(json_object_get(c, "correct")), tp);
    ck_assert_int_eq(json_integer_value(json_object_get(c, "predicted")), predicted);
    const char *names[] = {"precision", "recall", "f1"};
    double want[3] = {pr, re, f1};
    for (int i = 0; i < 3; i++) {
      got[i] = json_real_value(json_object_get(c, names[i]));
      ck_assert_msg(fabs(got[i] - want[i]) < 1e-12, "%sclass %d %s %.17g, counted %.17g", prefix, k, names[i], got[i], want[i]);
      weighted[i] += (double)support * want[i];
      if (support || predicted) macro[i] += want[i];
    }
    present += support || predicted;
  }
  for (int i = 0; i < 3; i++) {
    const char *names[] = {"precision", "recall", "f1"};
    snprintf(key, sizeof key, "%smacro", prefix);
    double m = json_real_value(json_object_get(json_object_get(j, key), names[i]));
    snprintf(key, sizeof key, "%sweighted", prefix);
    double w = json_real_value(json_object_get(json_object_get(j, key), names[i]));
    ck_assert_msg(fabs(m - macro[i] / present) < 1e-12 && fabs(w - weighted[i] / (double)total) < 1e-12,
                  "%s %s: macro %.17g weighted %.17g", prefix, names[i], m, w);
  }
  ck_assert_int_eq(json_integer_value(json_object_get(j, count)), total);
  ck_assert_msg(fabs(json_real_value(json_object_get(j, acc)) - (double)right / (double)total) < 1e-12, "%s", acc);
}

/* cavs eval's confusion matrices, per-class precision, recall and F1, macro and weighted
 * averages, over all labeled vertices and the roots, five classes and SST's binary
 * setting, against an independent count: cavs predict --all-nodes's classes and the
 * data's own labels, tallied here. */
START_TEST(eval_scores_match_predictions) {
  gen_data();
  RunResult r = TRAIN("--epochs", "2", "--lr", "0.01", "--quiet", "--save", path_in("m.ckpt"), NULL);
  ok(&r, "train");
  tu_free(&r);
  RunResult pred = cavs("predict", path_in("m.ckpt"), "--data", path_in("dev.txt"), "--all-nodes", NULL);
  ok(&pred, "predict --all-nodes");
  char *data = tu_slurp(path_in("dev.txt"), NULL);
  long cm[25] = {0}, roots[25] = {0}, bin[6] = {0}, bin_roots[6] = {0};
  static const int merge[] = {0, 0, 2, 1, 1}; /* negative, positive; 2: neutral */
  const char *line = pred.out, *tree = data;
  for (int g = 0; g < 300; g++, line = strchr(line, '\n') + 1, tree = strchr(tree, '\n') + 1) {
    int labels[4096], n = ptb_labels(tree, labels, 4096), off, v = 0, p;
    for (const char *q = line; *q != '\n' && sscanf(q, "%d%n", &p, &off) == 1; q += off, v++) {
      ck_assert(v < n && p >= 0 && p < 5 && labels[v] >= 0 && labels[v] < 5);
      bool root = v == n - 1;
      cm[labels[v] * 5 + p]++;
      if (root) roots[labels[v] * 5 + p]++;
      if (labels[v] == 2) continue; /* the binary setting drops neutral labels */
      bin[merge[labels[v]] * 3 + merge[p]]++;
      if (root) bin_roots[merge[labels[v]] * 3 + merge[p]]++;
    }
    ck_assert_int_eq(v, n);
  }
  free(data);
  tu_free(&pred);
  for (int binary = 0; binary < 2; binary++) {
    r = cavs("eval", path_in("m.ckpt"), "--data", path_in("dev.txt"), "--json", binary ? "--binary" : NULL, NULL);
    ok(&r, binary ? "eval --json --binary" : "eval --json");
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e);
    ck_assert_msg(json_is_object(j), "%s: %s", e.text, r.out);
    int rows = binary ? 2 : 5, cols = binary ? 3 : 5;
    expect_matrix(j, "confusion", binary ? bin : cm, rows, cols);
    expect_matrix(j, "root_confusion", binary ? bin_roots : roots, rows, cols);
    expect_scores(j, "", binary ? bin : cm, rows, cols, "accuracy", "vertices");
    expect_scores(j, "root_", binary ? bin_roots : roots, rows, cols, "root_accuracy", "roots");
    ck_assert(!binary == !json_object_get(j, "binary"));
    json_decref(j);
    tu_free(&r);
  }
  /* the text: the same matrices and tables */
  r = cavs("eval", path_in("m.ckpt"), "--data", path_in("dev.txt"), "--binary", NULL);
  ok(&r, "eval --binary");
  char want[256];
  snprintf(want, sizeof want, "\n     neg %8ld %8ld %8ld\n     pos %8ld %8ld %8ld\n", bin[0], bin[1], bin[2], bin[3], bin[4],
           bin[5]);
  ck_assert_msg(strstr(r.out, "binary accuracy ") && strstr(r.out, want) && strstr(r.out, "\n   macro ") &&
                    strstr(r.out, "\nweighted "),
                "no %s in\n%s", want, r.out);
  tu_free(&r);
  /* --binary merges SST's five classes: a model of three is refused */
  r = cavs("gen", "complete", "--graphs", "20", "--leaves", "4", "--classes", "3", "-o", path_in("c3.txt"), NULL);
  ok(&r, "gen complete --classes 3");
  tu_free(&r);
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("c3.txt"), "--dim", "C=3", "--dim",
           "E=4", "--dim", "H=4", "--epochs", "1", "--quiet", "--threads", "1", "--save", path_in("c3.ckpt"), NULL);
  ok(&r, "train C=3");
  tu_free(&r);
  r = cavs("eval", path_in("c3.ckpt"), "--data", path_in("c3.txt"), "--binary", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "--binary: ") && strstr(r.err, "has 3"), "%s", r.err);
  tu_free(&r);
}
END_TEST

/* Plots LOG (text) into NAME.png: the run's result, the PNG checked when it succeeds and
 * absent when it fails. */
static RunResult plot_text(const char *name, const char *text) {
  char log[4400], png[4400];
  snprintf(log, sizeof log, "%s/%s.log", dir, name);
  snprintf(png, sizeof png, "%s/%s.png", dir, name);
  tu_write(log, text, strlen(text));
  RunResult r = cavs("plot", log, "-o", png, NULL);
  size_t n = 0;
  char *pic = tu_slurp(png, &n);
  if (!r.status)
    ck_assert_msg(pic && n > 1000 && !memcmp(pic, "\x89PNG\r\n\x1a\n", 8), "%s: not a PNG (%zu bytes)", name, n);
  else ck_assert_msg(!pic, "%s: a failed plot left a picture", name);
  free(pic);
  return r;
}

/* A plot killed while gnuplot draws (SIGTERM, SIGINT, SIGHUP) leaves nothing in $TMPDIR
 * and no picture, and dies of the signal; gnuplot here is a script first in $PATH that
 * says it started and sleeps. What a plot killed by SIGKILL left, the next plot removes,
 * but not the directory of a plot still drawing nor anything of the user's. */
static pid_t start_until(char *const argv[], const char *out, const char *ready);
static int run_and_signal(char *const argv[], const char *out, const char *ready, double secs, int sig);

/* `cavs plot` of k.log into png with the gnuplot in bin first in PATH and $TMPDIR ktmp:
   started (until gnuplot says "drawing" in k.out) when start, else run (and signalled
   with sig where it is not 0): the pid, or the exit status (128 + a signal's) */
static int plot_with(const char *bin, const char *png, bool start, int sig) {
  char *old_path = strdup(getenv("PATH")), *old_tmp = getenv("TMPDIR") ? strdup(getenv("TMPDIR")) : NULL, path[9000];
  snprintf(path, sizeof path, "%s:%s", path_in(bin), old_path);
  char *argv[] = {(char *)cavs_bin, "plot", path_in("k.log"), "-o", path_in(png), NULL};
  setenv("PATH", path, 1);
  setenv("TMPDIR", path_in("ktmp"), 1);
  int st;
  if (start) st = (int)start_until(argv, path_in("k.out"), "drawing");
  else if (sig) st = run_and_signal(argv, path_in("k.out"), "drawing", 0.1, sig);
  else {
    RunResult r = tu_run(NULL, argv, 60);
    st = r.status;
    tu_free(&r);
  }
  setenv("PATH", old_path, 1);
  if (old_tmp) setenv("TMPDIR", old_tmp, 1);
  else unsetenv("TMPDIR");
  free(old_path);
  free(old_tmp);
  return st;
}

/* The name of the one entry of dir whose name starts with a dot (malloc'ed) */
static char *hidden_entry(const char *dir) {
  DIR *d = opendir(dir);
  ck_assert(d);
  char *name = NULL;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      ck_assert_msg(!name, "two hidden entries in %s", dir);
      name = strdup(e->d_name);
    }
  closedir(d);
  ck_assert_msg(name, "no hidden entry in %s", dir);
  return name;
}

/* bin/gnuplot: a shell script of body */
static void fake_gnuplot(const char *bin, const char *body) {
  char script[9000], p[4200];
  snprintf(p, sizeof p, "%s", path_in(bin));
  ck_assert(mkdir(p, 0700) == 0);
  snprintf(script, sizeof script, "#!/bin/sh\n%s\n", body);
  snprintf(p + strlen(p), sizeof p - strlen(p), "/gnuplot");
  tu_write(p, script, strlen(script));
  ck_assert(chmod(p, 0700) == 0);
}

START_TEST(killed_plot_leaves_nothing) {
  const char *log = "{\"epoch\": 1, \"train_loss\": 0.5}\n{\"epoch\": 2, \"train_loss\": 0.25}\n";
  tu_write(path_in("k.log"), log, strlen(log));
  ck_assert(mkdir(path_in("ktmp"), 0700) == 0);
  char body[9000];
  snprintf(body, sizeof body, "echo $$ > '%s'\necho drawing >> '%s'\nexec sleep 60", path_in("gp.pid"),
           path_in("k.out"));
  fake_gnuplot("sleeps", body);
  fake_gnuplot("draws", "printf drawn > \"$(dirname \"$1\")/out.png\"");
  const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
  for (int i = 0; i < 3; i++) {
    int st = plot_with("sleeps", "k.png", false, sigs[i]);
    ck_assert_msg(st == 128 + sigs[i], "signal %d: exit %d", sigs[i], st);
    ck_assert_msg(entries(path_in("ktmp")) == 0, "signal %d: the temporary directory is left", sigs[i]);
    ck_assert(access(path_in("k.png"), F_OK) != 0);
  }
  /* SIGKILL: its directory is left (and gnuplot, stopped here) */
  ck_assert_int_eq(plot_with("sleeps", "k.png", false, SIGKILL), 128 + SIGKILL);
  char *pid = tu_slurp(path_in("gp.pid"), NULL);
  ck_assert(pid && kill((pid_t)atol(pid), SIGKILL) == 0);
  free(pid);
  ck_assert_int_eq(entries(path_in("ktmp")), 1);
  char *killed = hidden_entry(path_in("ktmp"));
  /* the user's: a directory named as mkdtemp named a plot's, a file in it, and a file */
  ck_assert(mkdir(path_in("ktmp/cavs-plot-Ab12Cd"), 0700) == 0);
  tu_write(path_in("ktmp/cavs-plot-Ab12Cd/mine"), "x", 1);
  tu_write(path_in("ktmp/notes"), "x", 1);
  /* a plot that draws on: the killed plot's directory is gone, the user's are not */
  pid_t live = (pid_t)plot_with("sleeps", "live.png", true, 0);
  ck_assert(live > 0);
  ck_assert_int_eq(entries(path_in("ktmp")), 3);
  char *drawing = hidden_entry(path_in("ktmp"));
  ck_assert_str_ne(drawing, killed);
  /* and one that draws while it does: the drawing one's is left */
  ck_assert_int_eq(plot_with("draws", "k.png", false, 0), 0);
  size_t n = 0;
  char *png = tu_slurp(path_in("k.png"), &n);
  ck_assert_msg(png && n == 5 && !memcmp(png, "drawn", 5), "the picture is not what gnuplot drew");
  free(png);
  ck_assert_int_eq(entries(path_in("ktmp")), 3);
  char *still = hidden_entry(path_in("ktmp"));
  ck_assert_str_eq(still, drawing);
  free(killed);
  free(drawing);
  free(still);
  ck_assert(kill(live, SIGTERM) == 0);
  int st;
  ck_assert(waitpid(live, &st, 0) == live && WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
  ck_assert_int_eq(entries(path_in("ktmp")), 2);
  ck_assert(access(path_in("ktmp/cavs-plot-Ab12Cd/mine"), F_OK) == 0 && access(path_in("ktmp/notes"), F_OK) == 0);
}
END_TEST

/* A run resumed from an earlier checkpoint (its .best, or the last one saved before a save
 * failed) logs again the epochs the log already has: cavs plot draws the history that
 * went on, each epoch's later record in place of the earlier, and says how many it left
 * out (the points gnuplot was given, read back from its data file by a gnuplot that
 * copies it). The log itself keeps every record. */
START_TEST(plot_draws_the_resumed_history) {
  gen_data();
  RunResult r = TRAIN("--epochs", "1", "--quiet", "--save", path_in("h.ckpt"), "--log", path_in("h.log"), NULL);
  ok(&r, "epoch 1");
  tu_free(&r);
  size_t n = 0;
  char *first = tu_slurp(path_in("h.ckpt"), &n);
  tu_write(path_in("h1.ckpt"), first, n);
  free(first);
  r = TRAIN("--epochs", "2", "--quiet", "--resume", path_in("h.ckpt"), "--save", path_in("h.ckpt"), "--log",
            path_in("h.log"), NULL);
  ok(&r, "epochs 2 and 3");
  tu_free(&r);
  /* back to epoch 1's checkpoint, at another rate */
  r = TRAIN("--epochs", "1", "--quiet", "--lr", "0.01", "--resume", path_in("h1.ckpt"), "--save", path_in("h1.ckpt"),
            "--log", path_in("h.log"), NULL);
  ok(&r, "epoch 2 again");
  tu_free(&r);
  json_t *recs = log_records(path_in("h.log"));
  ck_assert_int_eq((int)json_array_size(recs), 4);
  static const int epochs[] = {1, 2, 3, 2};
  for (int i = 0; i < 4; i++)
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(recs, (size_t)i), "epoch")), epochs[i]);
  char body[9000];
  snprintf(body, sizeof body, "cp \"$(dirname \"$1\")/data\" '%s' && printf drawn > \"$(dirname \"$1\")/out.png\"",
           path_in("drawn"));
  fake_gnuplot("copies", body);
  char *old_path = strdup(getenv("PATH")), path[9000];
  snprintf(path, sizeof path, "%s:%s", path_in("copies"), old_path);
  setenv("PATH", path, 1);
  r = cavs("plot", path_in("h.log"), "-o", path_in("h.png"), NULL);
  setenv("PATH", old_path, 1);
  free(old_path);
  ok(&r, "plot");
  ck_assert_msg(strstr(r.err, "note: 2 records not drawn: a later record went back to their epoch"), "%s", r.err);
  tu_free(&r);
  /* the rows drawn: epoch 1's record, then the last run's epoch 2 (its train loss and
     dev loss, to the digits %.17g keeps) */
  char *data = tu_slurp(path_in("drawn"), NULL);
  ck_assert_ptr_nonnull(data);
  static const int drawn[] = {0, 3};
  char *line = strtok(data, "\n");
  for (int i = 0; i < 2; i++, line = strtok(NULL, "\n")) {
    ck_assert_msg(line, "%d rows drawn", i);
    double v[6];
    ck_assert_int_eq(sscanf(line, "%lf %lf %lf %lf %lf %lf", v, v + 1, v + 2, v + 3, v + 4, v + 5), 6);
    json_t *rec = json_array_get(recs, (size_t)drawn[i]);
    ck_assert_double_eq(v[0], (double)epochs[drawn[i]]);
    ck_assert_double_eq(v[1], json_number_value(json_object_get(rec, "train_loss")));
    ck_assert_double_eq(v[3], json_number_value(json_object_get(rec, "dev_loss")));
  }
  ck_assert_msg(!line, "a third row drawn: %s", line);
  /* and the two runs' epoch 2 differ (the test would not see the wrong one drawn) */
  ck_assert_double_ne(json_number_value(json_object_get(json_array_get(recs, 1), "train_loss")),
                      json_number_value(json_object_get(json_array_get(recs, 3), "train_loss")));
  free(data);
  json_decref(recs);
}
END_TEST

/* cavs plot: the log's curves as a PNG (gnuplot draws it). The log is read as JSON (any
 * spacing, keys in any order, unknown keys passed over, a record over several lines);
 * what is not JSON, or a known field that is not a number or null, is named by its line
 * and leaves no picture behind. */
START_TEST(plot_a_log) {
  gen_data();
  RunResult r = TRAIN("--epochs", "2", "--quiet", "--log", path_in("p.log"), NULL);
  ok(&r, "train --log");
  tu_free(&r);
  r = cavs("plot", path_in("p.log"), "-o", path_in("p.png"), NULL);
  ok(&r, "plot");
  tu_free(&r);
  size_t n = 0;
  char *png = tu_slurp(path_in("p.png"), &n);
  ck_assert_msg(png && n > 1000 && !memcmp(png, "\x89PNG\r\n\x1a\n", 8), "not a PNG (%zu bytes)", n);
  free(png);
  /* gnuplot's files in $TMPDIR, removed after; a $TMPDIR the script could not quote as
     it is (a quote in it) is passed over for /tmp */
  char tmpenv[4500], *where = path_in("plots");
  ck_assert(mkdir(where, 0700) == 0);
  snprintf(tmpenv, sizeof tmpenv, "TMPDIR=%s", where);
  char *in_tmp[] = {tmpenv, NULL}, *quoted[] = {"TMPDIR=/tmp/it's", NULL};
  for (int k = 0; k < 2; k++) {
    r = cavs_env(k ? quoted : in_tmp, "plot", path_in("p.log"), "-o", path_in("p2.png"), NULL);
    ok(&r, "plot with TMPDIR");
    tu_free(&r);
    ck_assert_int_eq(entries(path_in("plots")), 0);
    ck_assert(access(path_in("p2.png"), F_OK) == 0 && unlink(path_in("p2.png")) == 0);
  }
  rmdir(path_in("plots"));
  char notdir[4500];
  snprintf(notdir, sizeof notdir, "TMPDIR=%s", path_in("p.log")); /* (a file: no directory there) */
  char *in_file[] = {notdir, NULL};
  r = cavs_env(in_file, "plot", path_in("p.log"), "-o", path_in("p2.png"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "plot: cannot create a directory in "), "%s", r.err);
  tu_free(&r);
  /* as jq prints a log: pretty, a key's order changed, numbers as integers, exponents
     and null, keys cavs never writes, escapes, and compact records between */
  r = plot_text("pretty", "{\n  \"train_loss\": 0.5,\n  \"epoch\": 1,\n  \"dev_loss\": null,\n"
                          "  \"notes\": {\"by\": \"a \\\"q\\\" \\u00e9\", \"tags\": [1, true, null]}\n}\n"
                          "{\"epoch\":2,\"train_loss\":4e-1,\"train_acc\":0.75,\"dev_acc\":null}\r\n\n"
                          "\t{ \"dev_root_acc\" : 1 , \"epoch\" : 3 , \"train_loss\" : 0.25 }\n");
  ok(&r, "plot a pretty-printed, reordered log");
  tu_free(&r);
  /* broken JSON, each named by its line (the third: two good records before) */
  static const char *const broken[][2] = {
      {"{\"epoch\": 3, \"train_loss\": 0.2,}\n", "string or '}' expected"},   /* a trailing comma */
      {"{\"epoch\": 3, \"time\": \"2024-01-01}\n{\"epoch\": 4}\n", "newline"}, /* an unterminated string */
      {"{\"epoch\": 3, \"train_loss\": NaN}\n", "invalid token near 'NaN'"},
      {"{\"epoch\": 3, \"train_loss\": Infinity}\n", "invalid token"},
      {"{\"epoch\": 3, \"epoch\": 4}\n", "duplicate"},
      {"{\"epoch\": 3, \"train_loss\": 0.2\n", "'}' expected"},
      {"{\"epoch\": 3, \"train_loss\": \"system('x')\"}\n", "\"train_loss\" is not a number or null"},
      {"{\"epoch\": null, \"train_loss\": 0.2}\n", "without a number for \"epoch\""},
      {"[3, 0.2]\n", "not a record"},
      {"epoch 3 loss 0.2\n", "expected near 'epoch'"},
  };
  for (size_t i = 0; i < sizeof broken / sizeof *broken; i++) {
    char *text = NULL;
    ck_assert(asprintf(&text, "{\"epoch\": 1, \"train_loss\": 0.5}\n{\"epoch\": 2,\n\"train_loss\": 0.4}\n%s",
                       broken[i][0]) > 0);
    r = plot_text("bad", text);
    ck_assert_msg(r.status == 1 && strstr(r.err, "bad.log:4:") && strstr(r.err, broken[i][1]),
                  "case %zu (%s): exit %d\n%s", i, broken[i][0], r.status, r.err);
    tu_free(&r);
    free(text);
  }
}
END_TEST

/* A model with a dim that is a product of two others (moe_tree's HF = H * F), resumed
 * without its dims given again: the checkpoint's, and the bytes of the run never
 * stopped; a factor given again must agree (a resume refused every such model unless
 * each factor was given again: the product, derived from factors not given, was 0). */
START_TEST(resume_derives_product_dims) {
  gen_data();
#define MOE(...)                                                                                           \
  cavs("train", model("moe_tree.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--threads", \
       "1", "--quiet", __VA_ARGS__, NULL)
  RunResult r = MOE("--dim", "E=6", "--dim", "H=8", "--dim", "F=4", "--epochs", "2", "--save", path_in("moe2.ckpt"));
  ok(&r, "2 epochs");
  tu_free(&r);
  r = MOE("--dim", "E=6", "--dim", "H=8", "--dim", "F=4", "--epochs", "1", "--save", path_in("moe1.ckpt"));
  ok(&r, "1 epoch");
  tu_free(&r);
  r = MOE("--epochs", "1", "--resume", path_in("moe1.ckpt"), "--save", path_in("moe1r.ckpt"));
  ok(&r, "resumed without its dims");
  tu_free(&r);
  size_t na = 0, nb = 0;
  char *a = tu_slurp(path_in("moe2.ckpt"), &na), *b = tu_slurp(path_in("moe1r.ckpt"), &nb);
  ck_assert(a && b);
  ck_assert_msg(na == nb && !memcmp(a, b, na), "the resumed run differs from the uninterrupted one");
  free(a);
  free(b);
  r = MOE("--dim", "H=8", "--epochs", "1", "--resume", path_in("moe1.ckpt"));
  ok(&r, "resumed with a factor given again");
  tu_free(&r);
  r = MOE("--dim", "H=9", "--epochs", "1", "--resume", path_in("moe1.ckpt"));
  ck_assert_msg(r.status == 1 && strstr(r.err, "dim H is 8 in the checkpoint, but --dim asks for 9"), "%d: %s", r.status,
                r.err);
  tu_free(&r);
#undef MOE
}
END_TEST

/* N epochs, or N/2 + resume + N/2: the same bytes. */
START_TEST(resume_is_bit_identical) {
  gen_data();
  RunResult r = TRAIN("--epochs", "4", "--quiet", "--save", path_in("full.ckpt"), NULL);
  ok(&r, "4 epochs");
  tu_free(&r);
  r = TRAIN("--epochs", "2", "--quiet", "--save", path_in("half.ckpt"), NULL);
  ok(&r, "2 epochs");
  tu_free(&r);
  r = TRAIN("--epochs", "2", "--quiet", "--resume", path_in("half.ckpt"), "--save", path_in("resumed.ckpt"), NULL);
  ok(&r, "resume 2 epochs");
  tu_free(&r);
  size_t na = 0, nb = 0;
  char *a = tu_slurp(path_in("full.ckpt"), &na), *b = tu_slurp(path_in("resumed.ckpt"), &nb);
  ck_assert(a && b);
  ck_assert_msg(na == nb && !memcmp(a, b, na), "the resumed run differs from the uninterrupted one");
  free(b);
  /* a resume continues the checkpoint's settings (dims, batch, optimizer) unless given */
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dev",
           path_in("dev.txt"), "--threads", "1", "--epochs", "2", "--quiet", "--resume", path_in("half.ckpt"), "--save",
           path_in("resumed2.ckpt"), NULL);
  ok(&r, "resume without flags");
  tu_free(&r);
  b = tu_slurp(path_in("resumed2.ckpt"), &nb);
  ck_assert_msg(na == nb && !memcmp(a, b, na), "a resume without repeating the flags differs");
  free(a);
  free(b);
}
END_TEST

/* Dropout's probability is kept by the checkpoint (format 5): 4 epochs at --dropout 0.3,
 * or 2 and a resume of 2 that does not repeat it, are the same bytes; a resume that
 * gives --dropout again gets what it gives (info says so), and a resume of a model
 * saved without dropout stays without. */
/* Files a and b (in the test's directory) hold the same bytes. */
static void same_bytes(const char *a, const char *b, const char *what) {
  size_t na = 0, nb = 0;
  char *pa = tu_slurp(path_in(a), &na), *pb = tu_slurp(path_in(b), &nb);
  ck_assert_msg(pa && pb, "%s: cannot read %s or %s", what, a, b);
  ck_assert_msg(na == nb && !memcmp(pa, pb, na), "%s", what);
  free(pa);
  free(pb);
}

static char *info_field(const char *ckpt, const char *key);

START_TEST(resume_keeps_dropout) {
  gen_data();
  RunResult r = TRAIN("--epochs", "4", "--quiet", "--dropout", "0.3", "--save", path_in("dfull.ckpt"), NULL);
  ok(&r, "4 epochs with dropout");
  tu_free(&r);
  r = TRAIN("--epochs", "2", "--quiet", "--dropout", "0.3", "--save", path_in("dhalf.ckpt"), NULL);
  ok(&r, "2 epochs with dropout");
  tu_free(&r);
  r = TRAIN("--epochs", "2", "--resume", path_in("dhalf.ckpt"), "--save", path_in("dres.ckpt"), NULL);
  ok(&r, "resume without --dropout");
  ck_assert_msg(strstr(r.out, "options: p_drop=0.3"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  same_bytes("dfull.ckpt", "dres.ckpt", "the resumed run with dropout differs from the uninterrupted one");
  char *v = info_field(path_in("dres.ckpt"), "options");
  ck_assert_msg(strstr(v, "p_drop=0.3"), "%s", v);
  free(v);
  r = TRAIN("--epochs", "1", "--quiet", "--dropout", "0.1", "--resume", path_in("dhalf.ckpt"), "--save",
            path_in("d01.ckpt"), NULL);
  ok(&r, "resume with --dropout 0.1");
  tu_free(&r);
  v = info_field(path_in("d01.ckpt"), "options");
  ck_assert_msg(strstr(v, "p_drop=0.1"), "%s", v);
  free(v);
  r = TRAIN("--epochs", "1", "--quiet", "--save", path_in("d0.ckpt"), NULL);
  ok(&r, "without dropout");
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--quiet", "--resume", path_in("d0.ckpt"), "--save", path_in("d0r.ckpt"), NULL);
  ok(&r, "resume without dropout");
  tu_free(&r);
  v = info_field(path_in("d0r.ckpt"), "options");
  ck_assert_msg(strstr(v, "p_drop=0") && !strstr(v, "p_drop=0."), "%s", v);
  free(v);
}
END_TEST

/* ---- the optimizers and the schedules of the rate ---- */

/* The schedules' rates, from the functions cavs train calls (driver/schedule.c, compiled
 * in), against the formulas: step and cosine by epoch, and plateau's cuts on a crafted
 * sequence of dev scores, higher better and lower better. */
START_TEST(schedule_formulas) {
  cavs_train_state t = {.optim = {.lr = 0.1}, .schedule = CAVS_SCHED_CONSTANT, .plateau_best = -1};
  for (int e = 1; e < 5; e++) ck_assert(sched_lr(&t, e) == 0.1);
  t.schedule = CAVS_SCHED_STEP, t.lr_decay = 0.5, t.lr_step = 2;
  const double steps[] = {0.1, 0.1, 0.05, 0.05, 0.025};
  for (int e = 1; e <= 5; e++) ck_assert_msg(sched_lr(&t, e) == steps[e - 1], "step, epoch %d: %.17g", e, sched_lr(&t, e));
  /* Zaremba et al.'s: 4 epochs at the rate, then halved every epoch */
  t.lr_step = 1, t.lr_decay_start = 4;
  const double zaremba[] = {0.1, 0.1, 0.1, 0.1, 0.05, 0.025, 0.0125};
  for (int e = 1; e <= 7; e++)
    ck_assert_msg(sched_lr(&t, e) == zaremba[e - 1], "step from 4, epoch %d: %.17g", e, sched_lr(&t, e));
  t.lr_step = 3, t.lr_decay_start = 1; /* after epoch 1, then every 3 */
  const double late[] = {0.1, 0.05, 0.05, 0.05, 0.025};
  for (int e = 1; e <= 5; e++)
    ck_assert_msg(sched_lr(&t, e) == late[e - 1], "step 3 from 1, epoch %d: %.17g", e, sched_lr(&t, e));
  t.lr_decay_start = 0;
  t.schedule = CAVS_SCHED_COSINE, t.lr_min = 0.001, t.cosine_epochs = 5;
  for (int e = 1; e <= 8; e++) {
    int k = e - 1 < 5 ? e - 1 : 5; /* held at the floor past the last epoch */
    double want = 0.001 + 0.5 * (0.1 - 0.001) * (1 + cos(M_PI * k / 5.0));
    ck_assert_msg(fabs(sched_lr(&t, e) - want) <= 1e-15 * want, "cosine, epoch %d: %.17g, not %.17g", e, sched_lr(&t, e), want);
  }
  ck_assert(sched_lr(&t, 1) == 0.1 && fabs(sched_lr(&t, 6) - 0.001) < 1e-18);
  /* plateau: patience 2, factor 0.5, floor 0.01, from 0.08; cut on the third epoch in a
     row without a better score, the count then starting again; at the floor, no cut */
  t = (cavs_train_state){.optim = {.lr = 0.08}, .schedule = CAVS_SCHED_PLATEAU, .plateau_factor = 0.5,
                         .plateau_patience = 2, .lr_min = 0.01, .plateau_best = -1};
  const double acc[] = {0.5, 0.6, 0.6, 0.55, 0.6, 0.7, 0.7, 0.7, 0.7, 0.65, 0.6, 0.6, 0.6, 0.6, 0.6};
  const double lr[] = {0.08, 0.08, 0.08, 0.08, 0.04, 0.04, 0.04, 0.04, 0.02, 0.02, 0.02, 0.01, 0.01, 0.01, 0.01};
  const int bad[] = {0, 0, 1, 2, 0, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0};
  for (int e = 0; e < 15; e++) {
    bool cut = sched_plateau(&t, acc[e], true);
    ck_assert_msg(cut == (e == 4 || e == 8 || e == 11), "plateau, epoch %d: %s", e + 1, cut ? "cut" : "no cut");
    ck_assert_msg(sched_lr(&t, e + 2) == lr[e] && t.plateau_bad == bad[e], "plateau after epoch %d: lr %.17g, count %d",
                  e + 1, sched_lr(&t, e + 2), t.plateau_bad);
  }
  ck_assert(t.plateau_best == 0.7);
  /* a loss: lower is better; patience 0 cuts on the first epoch that is not better */
  t = (cavs_train_state){.optim = {.lr = 1}, .schedule = CAVS_SCHED_PLATEAU, .plateau_factor = 0.1, .plateau_best = -1};
  const double loss[] = {1.0, 0.9, 0.95, 0.8, 0.8};
  const double lr2[] = {1, 1, 0.1, 0.1, 0.01};
  for (int e = 0; e < 5; e++) {
    sched_plateau(&t, loss[e], false);
    ck_assert_msg(fabs(sched_lr(&t, e + 2) - lr2[e]) < 1e-17, "plateau on a loss, after epoch %d: %.17g", e + 1,
                  sched_lr(&t, e + 2));
  }
  ck_assert(sched_kind("cosine") == CAVS_SCHED_COSINE && sched_kind("plateau") == CAVS_SCHED_PLATEAU &&
            sched_kind("linear") == -1);
}
END_TEST

/* Momentum, Nesterov and AdamW over 4 epochs, or 2 + a resume of 2 that repeats none of
 * their flags: the same bytes (parameters, the momentum buffer and the moments, the
 * schedule's state) and the same rate in every epoch's --log record. Nesterov on the
 * plateau schedule, which cuts the rate after epoch 2 (checked): the half run's
 * checkpoint must carry the cut rate; AdamW on a cosine over the 4 epochs. */
START_TEST(optimizers_resume_bit_identical) {
  gen_data();
  static const char *const runs[][12] = {
      {"--optimizer", "momentum", "--momentum", "0.8", "--lr", "0.05", NULL},
      {"--optimizer", "nesterov", "--lr", "0.05", "--schedule", "plateau", "--plateau-patience", "0", "--plateau-factor",
       "0.5", "--select", "root"},
      {"--optimizer", "adamw", "--lr", "0.02", "--weight-decay", "0.01", "--schedule", "cosine", "--cosine-epochs", "4",
       "--lr-min", "1e-3"},
  };
  for (int i = 0; i < 3; i++) {
    const char *const *a = runs[i];
#define A a[0], a[1], a[2], a[3], a[4], a[5], a[6] ? a[6] : "--quiet", a[7] ? a[7] : "--quiet", \
          a[8] ? a[8] : "--quiet", a[9] ? a[9] : "--quiet", a[10] ? a[10] : "--quiet", a[11] ? a[11] : "--quiet"
    char full[64], half[64], flog[64], hlog[64];
    snprintf(full, sizeof full, "o%d-full.ckpt", i);
    snprintf(half, sizeof half, "o%d-half.ckpt", i);
    snprintf(flog, sizeof flog, "o%d-full.log", i);
    snprintf(hlog, sizeof hlog, "o%d-half.log", i);
    RunResult r = TRAIN("--epochs", "4", "--quiet", A, "--save", path_in(full), "--log", path_in(flog), NULL);
    ok(&r, "4 epochs");
    tu_free(&r);
    r = TRAIN("--epochs", "2", "--quiet", A, "--save", path_in(half), "--log", path_in(hlog), NULL);
    ok(&r, "2 epochs");
    tu_free(&r);
#undef A
    /* the first run killed as it wrote a record: the resumed run drops the cut line,
       a long one too (past the 64 KiB read back at first: 100 KB of a record's text) */
    const char *torn = "{\"epoch\": 3, \"train_lo";
    size_t pad = i == 2 ? 100000 : 0;
    char said[128];
    snprintf(said, sizeof said, "its last line was cut off (%zu bytes", strlen(torn) + pad);
    if (i != 1) {
      FILE *lg = fopen(path_in(hlog), "a");
      ck_assert(lg && fputs(torn, lg) >= 0);
      for (size_t k = 0; k < pad; k++) ck_assert(fputc('x', lg) != EOF);
      ck_assert(fclose(lg) == 0);
    }
    /* ... or killed between a whole record and its line's end: the record is kept */
    struct stat ls;
    if (i == 1) ck_assert(stat(path_in(hlog), &ls) == 0 && truncate(path_in(hlog), ls.st_size - 1) == 0);
    r = TRAIN("--epochs", "2", "--quiet", "--resume", path_in(half), "--save", path_in(half), "--log", path_in(hlog), NULL);
    ok(&r, "resume 2 epochs");
    ck_assert_msg((i != 1) == (strstr(r.err, said) != NULL), "%s", r.err);
    tu_free(&r);
    size_t na = 0, nb = 0;
    char *x = tu_slurp(path_in(full), &na), *y = tu_slurp(path_in(half), &nb);
    ck_assert(x && y);
    ck_assert_msg(na == nb && !memcmp(x, y, na), "%s: the resumed run differs from the uninterrupted one", a[1]);
    free(x);
    free(y);
    json_t *lf = log_records(path_in(flog)), *lh = log_records(path_in(hlog));
    ck_assert_int_eq(json_array_size(lf), 4);
    ck_assert_int_eq(json_array_size(lh), 4);
    for (size_t e = 0; e < 4; e++) {
      json_t *rf = json_array_get(lf, e), *rh = json_array_get(lh, e);
      double lrf = json_real_value(json_object_get(rf, "lr")), lrh = json_real_value(json_object_get(rh, "lr"));
      ck_assert_msg(lrf == lrh, "%s, epoch %zu: lr %.17g, resumed %.17g", a[1], e + 1, lrf, lrh);
      ck_assert_str_eq(json_string_value(json_object_get(rh, "optimizer")), a[1]);
    }
    double lr1 = json_real_value(json_object_get(json_array_get(lf, 0), "lr"));
    double lr3 = json_real_value(json_object_get(json_array_get(lf, 2), "lr"));
    if (i == 1) ck_assert_msg(lr3 == lr1 / 2, "plateau: epoch 3's rate %.17g, not the first's cut (%g)", lr3, lr1);
    if (i == 2) /* the cosine's epoch 3: halfway down */
      ck_assert_msg(fabs(lr3 - (1e-3 + 0.5 * (0.02 - 1e-3))) < 1e-15, "cosine: epoch 3's rate %.17g", lr3);
    json_decref(lf);
    json_decref(lh);
  }
  RunResult r = cavs("info", path_in("o1-half.ckpt"), NULL);
  ok(&r, "info");
  ck_assert_msg(strstr(r.out, "optimizer nesterov lr 0.05 momentum 0.9") &&
                    strstr(r.out, "lr schedule plateau: factor 0.5, patience 0, floor 0; now lr "),
                "%s", r.out);
  tu_free(&r);
}
END_TEST

/* Whether the file at path holds exactly `what` */
static bool file_holds(const char *path, const char *what) {
  size_t n = 0;
  char *s = tu_slurp(path, &n);
  bool same = s && n == strlen(what) && !memcmp(s, what, n);
  free(s);
  return same;
}

/* Each option of the optimizers and the schedules belongs to some of them: given to
 * another, it is refused, as is a plateau with no dev set to watch. */
START_TEST(schedule_options_checked) {
  gen_data();
  static const struct {
    const char *args[4], *msg;
  } bad[] = {
      {{"--momentum", "0.5"}, "--momentum goes with --optimizer momentum or nesterov, not adam"},
      {{"--optimizer", "momentum", "--momentum", "1"}, "not a number above 0 and below 1"},
      {{"--schedule", "linear"}, "--schedule: 'linear' is not constant, step, cosine or plateau"},
      {{"--schedule", "cosine", "--lr-decay", "0.5"}, "--lr-decay goes with --schedule step, not cosine"},
      {{"--schedule", "step"}, "--schedule step needs --lr-decay"},
      {{"--cosine-epochs", "3"}, "--cosine-epochs goes with --schedule cosine, not constant"},
      {{"--schedule", "cosine", "--plateau-factor", "0.5"}, "go with --schedule plateau, not cosine"},
      {{"--lr-min", "0.1", "--schedule", "cosine"}, "--lr-min 0.1 is not below the rate, 0.001"},
  };
  /* (a log of an earlier run's, which a refused run leaves as it was: each option is
     checked before the log is opened) */
  const char *kept = "{\"epoch\": 1}\n";
  tu_write(path_in("kept.log"), kept, strlen(kept));
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    const char *const *a = bad[i].args;
    RunResult r = TRAIN("--epochs", "1", "--log", path_in("kept.log"), a[0], a[1], a[2] ? a[2] : "--quiet",
                        a[3] ? a[3] : "--quiet", NULL);
    ck_assert_msg(r.status == 1 && strstr(r.err, bad[i].msg), "case %zu: exit %d: %s", i, r.status, r.err);
    ck_assert_msg(file_holds(path_in("kept.log"), kept), "case %zu: the log was emptied", i);
    tu_free(&r);
  }
  RunResult r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--schedule",
                     "plateau", "--log", path_in("kept.log"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "--schedule plateau needs a --dev set"), "%s", r.err);
  ck_assert_msg(file_holds(path_in("kept.log"), kept), "the log was emptied");
  tu_free(&r);
}
END_TEST

/* The same with a frozen table, selection on root accuracy, a decaying rate, warm-up and
 * patience: the checkpoint carries them (format 3), so a resume that does not repeat
 * them goes on as the uninterrupted run did (a table no longer frozen, or another rate,
 * would make other bytes). */
START_TEST(resume_keeps_schedule_and_frozen) {
  gen_data();
#define SCHED                                                                                                   \
  "--freeze", "emb", "--select", "root", "--lr-decay", "0.5", "--lr-step", "1", "--lr-decay-start", "2", "--warmup", "3", \
      "--patience", "9"
  RunResult r = TRAIN("--epochs", "4", "--quiet", SCHED, "--save", path_in("sfull.ckpt"), NULL);
  ok(&r, "4 epochs");
  tu_free(&r);
  r = TRAIN("--epochs", "2", "--quiet", SCHED, "--save", path_in("shalf.ckpt"), NULL);
  ok(&r, "2 epochs");
  tu_free(&r);
#undef SCHED
  r = TRAIN("--epochs", "2", "--quiet", "--resume", path_in("shalf.ckpt"), "--save", path_in("sresumed.ckpt"), NULL);
  ok(&r, "resume 2 epochs");
  tu_free(&r);
  same_bytes("sfull.ckpt", "sresumed.ckpt", "the resumed run differs from the uninterrupted one");
  r = cavs("info", path_in("sresumed.ckpt"), NULL);
  ok(&r, "info");
  ck_assert_msg(strstr(r.out, "(root accuracy, epoch ") &&
                    strstr(r.out, "lr decay 0.5 every 1 epochs after epoch 2, warm-up 3"),
                "%s", r.out);
  tu_free(&r);
  /* another --select forgets the checkpoint's best, saying so */
  r = TRAIN("--epochs", "1", "--resume", path_in("shalf.ckpt"), "--select", "all", NULL);
  ok(&r, "resume with another --select");
  ck_assert_msg(strstr(r.out, "--select all: the best of the checkpoint's runs is forgotten"), "%s", r.out);
  tu_free(&r);
}
END_TEST

START_TEST(damaged_checkpoints_rejected) {
  gen_data();
  RunResult r = TRAIN("--epochs", "1", "--quiet", "--save", path_in("d.ckpt"), NULL);
  ok(&r, "train");
  tu_free(&r);
  size_t n;
  char *data = tu_slurp(path_in("d.ckpt"), &n);
  /* one flipped byte anywhere: the middle, the header, the checksum itself */
  size_t at[] = {n / 2, 9, n - 1, 100};
  for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
    data[at[i]] ^= 0x10;
    tu_write(path_in("bad.ckpt"), data, n);
    data[at[i]] ^= 0x10;
    r = cavs("eval", path_in("bad.ckpt"), "--data", path_in("dev.txt"), NULL);
    ck_assert_msg(r.status == 1, "flipped byte %zu: exit %d", at[i], r.status);
    ck_assert_msg(strstr(r.err, "bad.ckpt"), "%s", tu_tail(r.err, 1800));
    tu_free(&r);
  }
  tu_write(path_in("short.ckpt"), data, n / 3);
  r = cavs("eval", path_in("short.ckpt"), "--data", path_in("dev.txt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "damaged"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  tu_write(path_in("empty.ckpt"), "", 0);
  r = cavs("info", path_in("empty.ckpt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "not a cavs checkpoint"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  free(data);
}
END_TEST

START_TEST(wrong_model_rejected) {
  gen_data();
  RunResult r = cavs("train", model("treegru.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dim", "E=8",
                     "--dim", "H=8", "--epochs", "1", "--quiet", "--save", path_in("gru.ckpt"), NULL);
  ok(&r, "train treegru");
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--quiet", "--resume", path_in("gru.ckpt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "treegru") && strstr(r.err, "treelstm"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  /* the same model name from another source: refused by its hash, which is the
     tokens' (a comment or the layout changed is the same model) */
  char *src = tu_slurp(model("treelstm.vf"), NULL);
  char *changed = malloc(strlen(src) + 64);
  r = TRAIN("--epochs", "1", "--quiet", "--save", path_in("orig.ckpt"), NULL);
  ok(&r, "train");
  tu_free(&r);
  sprintf(changed, "# a comment\n\n%s\n// and another\n", src);
  tu_write(path_in("treelstm.vf"), changed, strlen(changed));
  r = cavs("train", path_in("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dim", "E=12",
           "--dim", "H=16", "--epochs", "1", "--quiet", "--resume", path_in("orig.ckpt"), NULL);
  ok(&r, "resume from a source with other comments");
  tu_free(&r);
  sprintf(changed, "%s\ndim Z = 3;\n", src);
  tu_write(path_in("treelstm.vf"), changed, strlen(changed));
  r = cavs("train", path_in("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dim", "E=12",
           "--dim", "H=16", "--epochs", "1", "--resume", path_in("orig.ckpt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "another version"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  free(src);
  free(changed);
}
END_TEST

/* --dropout P sets every option of the model (`option p_drop = 0;`, its dropouts' p)
 * and --option NAME=P one: 0 trains as the default does, byte for byte; 0.3 changes the
 * loss; and the checkpoints' source hash is the same, the model being the same. A model
 * without options refuses --dropout, saying so; a name it lacks or a value that is no
 * probability are refused too. */
static const char *const drop_vf =
    "model tdrop; dim E = 8; dim H = 8; dim C = 5; dim V = vocab(word);\n"
    "input word : index[V]; input label : class[C];\n"
    "option p_drop = 0;\n"
    "param emb[V,E] init uniform(-0.1, 0.1); param U[E,H], W[2H,H], Wc[H,C] init xavier; param bc[C];\n"
    "pull { x = emb[word]; }\n"
    "vertex tree (children 2) { h = tanh(dropout(pull(), p_drop) @ U + concat(gather(0), gather(1)) @ W);\n"
    "  scatter(h); push(h); }\n"
    "push (h) { loss softmax_xent(dropout(h, p_drop) @ Wc + bc, label); }\n";

static char *info_field(const char *ckpt, const char *key);

/* One epoch of the model in file vf (in the test's directory) with an optimizer and an
   option or none, saved to ckpt: its "train loss X"; its output must say `says` (unless
   NULL) */
static char *train_loss_of(const char *vf, const char *optimizer, const char *says, const char *ckpt, const char *opt,
                           const char *val) {
  RunResult r = cavs("train", path_in(vf), "--format", "ptb-tree", "--train", path_in("train.txt"), "--epochs", "1",
                     "--save", path_in(ckpt), "--optimizer", optimizer, opt, val, NULL);
  ok(&r, vf);
  const char *at = strstr(r.out, "train loss ");
  ck_assert_msg(at, "%s", tu_tail(r.out, 1800));
  char *loss = strndup(at, 11 + strcspn(at + 11, " \n"));
  if (says) ck_assert_msg(strstr(r.out, says), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  return loss;
}
static char *train_loss(const char *ckpt, const char *opt, const char *val) {
  return train_loss_of("tdrop.vf", "adam", opt ? "options: p_drop=" : NULL, ckpt, opt, val);
}

/* text-bptt:N: a language model's stream in chunks of N tokens (20 lines of 4 words and
 * <eos> are 100 tokens: 10 chains of 10), its epoch line a perplexity, the checkpoint's
 * format the same; a chunk length that is not a number from 1 to 100000 refused. */
START_TEST(bptt_chunk_length) {
  char text[512];
  size_t n = 0;
  for (int i = 0; i < 20; i++) n += (size_t)snprintf(text + n, sizeof text - n, "w%d a b c\n", i % 5);
  tu_write(path_in("lm.txt"), text, n);
  RunResult r = cavs("train", model("lstm_lm.vf"), "--format", "text-bptt:10", "--train", path_in("lm.txt"), "--dim",
                     "E=4", "--dim", "H=4", "--epochs", "1", "--threads", "1", "--save", path_in("lm.ckpt"), NULL);
  ok(&r, "text-bptt:10");
  ck_assert_msg(strstr(r.out, "10 training graphs (100 vertices)") && strstr(r.out, " ppl "), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  char *t = info_field(path_in("lm.ckpt"), "training");
  ck_assert_msg(strstr(t, "data format text-bptt:10,"), "%s", t);
  free(t);
  r = cavs("train", model("lstm_lm.vf"), "--format", "text-bptt:0", "--train", path_in("lm.txt"), "--epochs", "1",
           "--quiet", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "must be a number from 1 to 100000"), "%d %s", r.status,
                tu_tail(r.err, 1800));
  tu_free(&r);
}
END_TEST

/* --bptt-state: one stream (--batch 1) in chunks of 7 tokens, each chunk starting from
 * the state the one before left (carry, the default), evaluates as the whole stream as
 * one chain (text-bptt:100000, an independent reference: nothing to carry), token for
 * token: the same loss to float's rounding; with reset it does not. Training carries
 * by default and says so, and under reset says nothing; carry on a format whose graphs
 * do not continue one another is refused, and so is a word that is not carry or reset. */
/* The loss `cavs eval --json` gives of checkpoint ck on data: with --format fmt_ where
   not NULL, --batch batch, and --bptt-state state where not NULL */
static double ckpt_eval_loss(const char *ck, const char *data, const char *fmt_, const char *batch, const char *state) {
  char *argv[16] = {(char *)cavs_bin, "eval", (char *)ck, "--data", (char *)data, "--batch", (char *)batch, "--threads",
                    "1", "--json"};
  int n = 10;
  if (fmt_) argv[n++] = "--format", argv[n++] = (char *)fmt_;
  if (state) argv[n++] = "--bptt-state", argv[n++] = (char *)state;
  RunResult r = tu_run(NULL, argv, 300);
  ok(&r, fmt_ ? fmt_ : "eval");
  const char *at = strstr(r.out, "\"loss\":");
  ck_assert_msg(at, "%s", r.out);
  double loss = strtod(at + 7, NULL);
  tu_free(&r);
  return loss;
}
static double eval_loss(const char *fmt_, const char *batch, const char *state) {
  return ckpt_eval_loss(path_in("lmc.ckpt"), path_in("lmc.txt"), fmt_, batch, state);
}
START_TEST(bptt_state_carried) {
  char text[2048];
  size_t n = 0;
  for (int i = 0; i < 40; i++) n += (size_t)snprintf(text + n, sizeof text - n, "w%d a w%d b c\n", i % 7, i % 3);
  tu_write(path_in("lmc.txt"), text, n);
  RunResult r = cavs("train", model("lstm_lm.vf"), "--format", "text-bptt:7", "--train", path_in("lmc.txt"), "--dim",
                     "E=6", "--dim", "H=6", "--epochs", "3", "--batch", "4", "--lr", "0.02", "--threads", "1", "--save",
                     path_in("lmc.ckpt"), NULL);
  ok(&r, "carried training");
  ck_assert_msg(strstr(r.out, "state carried from chunk to chunk: 4 streams"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  double carried = eval_loss("text-bptt:7", "1", "carry"), whole = eval_loss("text-bptt:100000", "1", "carry");
  double reset = eval_loss("text-bptt:7", "1", "reset"), streams = eval_loss("text-bptt:7", "3", "carry");
  ck_assert_msg(fabs(carried - whole) <= 2e-5 * whole, "carried %.9g, the whole stream %.9g", carried, whole);
  ck_assert_msg(fabs(reset - whole) > 1e-3 * whole, "reset %.9g, the whole stream %.9g", reset, whole);
  /* three streams from zeros: each restarts once, unlike the one stream */
  ck_assert_msg(fabs(streams - whole) > 1e-5 * whole && fabs(streams - reset) > 1e-5 * whole, "%.9g %.9g %.9g",
                streams, whole, reset);
  r = cavs("train", model("lstm_lm.vf"), "--format", "text-bptt:7", "--train", path_in("lmc.txt"), "--dim", "E=6",
           "--dim", "H=6", "--epochs", "1", "--bptt-state", "reset", "--threads", "1", NULL);
  ok(&r, "reset training");
  ck_assert_msg(!strstr(r.out, "state carried"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  r = cavs("train", model("lstm_lm.vf"), "--format", "text", "--train", path_in("lmc.txt"), "--epochs", "1",
           "--bptt-state", "carry", "--quiet", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "do not continue one another"), "%d %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  r = cavs("train", model("lstm_lm.vf"), "--format", "text-bptt", "--train", path_in("lmc.txt"), "--epochs", "1",
           "--bptt-state", "keep", "--quiet", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "not carry or reset"), "%d %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
}
END_TEST

/* `option clip = N;`: the model's default gradient-norm clip. Without --clip a run
 * clips at N (the bytes of a run with --clip N), --clip 0 and --option clip=0 turn it
 * off (another run: 0.05 clips this model's gradients; with SGD, as Adam's steps hardly
 * change when every gradient is scaled), --dropout finds no dropout in it, and a
 * negative clip is refused. */
START_TEST(model_clip_option) {
  gen_data();
  static const char clip_vf[] =
      "model tclip; dim E = 8; dim H = 8; dim C = 5; dim V = vocab(word);\n"
      "input word : index[V]; input label : class[C];\n"
      "option clip = 0.05;\n"
      "param emb[V,E] init uniform(-0.1, 0.1); param U[E,H], W[2H,H], Wc[H,C] init xavier; param bc[C];\n"
      "pull { x = emb[word]; }\n"
      "vertex tree (children 2) { h = tanh(pull() @ U + concat(gather(0), gather(1)) @ W); scatter(h); push(h); }\n"
      "push (h) { loss softmax_xent(h @ Wc + bc, label); }\n";
  tu_write(path_in("tclip.vf"), clip_vf, strlen(clip_vf));
  char *dflt = train_loss_of("tclip.vf", "sgd", "gradient-norm clip 0.05, the model's", "c_default.ckpt", NULL, NULL),
       *given = train_loss_of("tclip.vf", "sgd", NULL, "c_given.ckpt", "--clip", "0.05"),
       *off = train_loss_of("tclip.vf", "sgd", NULL, "c_off.ckpt", "--clip", "0"),
       *off_opt = train_loss_of("tclip.vf", "sgd", "options: clip=0", "c_offopt.ckpt", "--option", "clip=0");
  ck_assert_str_eq(dflt, given);
  same_bytes("c_default.ckpt", "c_given.ckpt", "the model's clip trains otherwise than --clip 0.05");
  ck_assert_msg(strcmp(dflt, off), "clipping at 0.05 changes nothing here: %s", off);
  ck_assert_str_eq(off, off_opt);
  free(dflt), free(given), free(off), free(off_opt);
  char *t_on = info_field(path_in("c_default.ckpt"), "training"), *t_off = info_field(path_in("c_off.ckpt"), "training");
  ck_assert_msg(strstr(t_on, " clip 0.05,") && !strstr(t_off, "clip"), "%s / %s", t_on, t_off);
  free(t_on), free(t_off);
  struct {
    const char *opt, *val, *says;
  } bad[] = {{"--dropout", "0.3", "has no dropout option"}, {"--option", "clip=-1", "--option clip=-1"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    RunResult r = cavs("train", path_in("tclip.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"),
                       "--epochs", "1", "--quiet", bad[i].opt, bad[i].val, NULL);
    ck_assert_msg(r.status == 1 && strstr(r.err, bad[i].says), "%s %s: %d %s", bad[i].opt, bad[i].val, r.status,
                  tu_tail(r.err, 1800));
    tu_free(&r);
  }
}
END_TEST

/* A mixture of experts trains from the command line: each epoch's line says how its
 * slots spread over the experts (the least and most loaded one's share, the loads'
 * coefficient of variation), as --log records them; the load-balancing loss's weight is
 * an option (0 trains otherwise than the model's 0.01); more choices a vertex than
 * experts is an error saying so, not a crash. */
START_TEST(moe_trains_and_reports) {
  gen_data();
#define MOE(...)                                                                                           \
  cavs("train", model("moe_tree.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dim", "E=8", \
       "--dim", "H=8", "--dim", "F=4", "--batch", "32", "--threads", "1", "--epochs", "2", __VA_ARGS__)
  RunResult r = MOE("--log", path_in("moe.log"), "--save", path_in("moe.ckpt"), NULL);
  ok(&r, "train moe_tree");
  ck_assert_msg(strstr(r.out, "epoch 2/2 ") && strstr(r.out, "  experts 0."), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  json_t *recs = log_records(path_in("moe.log"));
  ck_assert_int_eq(json_array_size(recs), 2);
  for (size_t i = 0; i < 2; i++) {
    json_t *rec = json_array_get(recs, i);
    json_t *lo = json_object_get(rec, "expert_share_min"), *hi = json_object_get(rec, "expert_share_max"),
           *cv = json_object_get(rec, "expert_load_cv");
    ck_assert(json_array_size(lo) == 1 && json_array_size(hi) == 1 && json_array_size(cv) == 1);
    double a = json_number_value(json_array_get(lo, 0)), b = json_number_value(json_array_get(hi, 0)),
           v = json_number_value(json_array_get(cv, 0));
    /* 8 experts: the least loaded at most an eighth of the slots, the most at least */
    ck_assert_msg(a >= 0 && a <= 0.125 && b >= 0.125 && b <= 1 && v >= 0 && (v > 0) == (a < b), "%g %g %g", a, b, v);
  }
  json_decref(recs);
  char *loss[2];
  for (int k = 0; k < 2; k++) {
    r = k ? MOE("--option", "balance=0", NULL) : MOE(NULL);
    ok(&r, "train moe_tree");
    const char *at = strstr(r.out, "epoch 2/2  train loss ");
    ck_assert_msg(at, "%s", tu_tail(r.out, 1800));
    loss[k] = strndup(at, strcspn(at, "\n"));
    tu_free(&r);
  }
  ck_assert_msg(strcmp(loss[0], loss[1]), "balance 0 trains as 0.01 does: %s", loss[1]);
  free(loss[0]), free(loss[1]);
  r = MOE("--dim", "X=1", "--quiet", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "fewer experts than a row's choices"), "%d %s", r.status,
                tu_tail(r.err, 1800));
  tu_free(&r);
#undef MOE
}
END_TEST

START_TEST(dropout_option) {
  gen_data();
  tu_write(path_in("tdrop.vf"), drop_vf, strlen(drop_vf));
  char *l_default = train_loss("d_default.ckpt", NULL, NULL), *l0 = train_loss("d0.ckpt", "--dropout", "0"),
       *l3 = train_loss("d3.ckpt", "--dropout", "0.3"), *l3o = train_loss("d3o.ckpt", "--option", "p_drop=0.3");
  ck_assert_str_eq(l0, l_default);
  ck_assert_str_eq(l3, l3o);
  ck_assert_msg(strcmp(l0, l3), "--dropout 0.3 trains as 0 does: %s", l3);
  char *h0 = info_field(path_in("d0.ckpt"), "source hash"), *h3 = info_field(path_in("d3.ckpt"), "source hash");
  ck_assert_str_eq(h0, h3);
  free(l_default), free(l0), free(l3), free(l3o), free(h0), free(h3);
  /* refused */
  struct {
    const char *vf, *opt, *val, *says;
  } bad[] = {
      {"treegru.vf", "--dropout", "0.3", "has no dropout option"},
      {NULL, "--dropout", "1", "--dropout: '1'"},
      {NULL, "--dropout", "-0.1", "--dropout"},
      {NULL, "--option", "p_dorp=0.1", "no option 'p_dorp'"},
      {NULL, "--option", "p_drop=1.5", "probability"},
      {NULL, "--option", "p_drop", "NAME=P"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    RunResult r = cavs("train", bad[i].vf ? model(bad[i].vf) : path_in("tdrop.vf"), "--format", "ptb-tree", "--train",
                       path_in("train.txt"), "--epochs", "1", "--quiet", bad[i].opt, bad[i].val, NULL);
    ck_assert_msg(r.status == 1, "%s %s: status %d", bad[i].opt, bad[i].val, r.status);
    ck_assert_msg(strstr(r.err, bad[i].says), "%s %s: %s", bad[i].opt, bad[i].val, tu_tail(r.err, 1800));
    tu_free(&r);
  }
}
END_TEST

/* One epoch of `vf` with one --dim or two (dim2 may be NULL), saved to ckpt; cavs
 * info's report of it, with the parameters and the vocabulary it counts. */
static RunResult trained_info(const char *vf, const char *dim, const char *dim2, const char *ckpt, long *params,
                              long *words) {
  RunResult r = cavs("train", model(vf), "--format", "ptb-tree", "--train", path_in("train.txt"), "--epochs", "1",
                     "--quiet", "--save", path_in(ckpt), "--dim", dim, dim2 ? "--dim" : NULL, dim2, NULL);
  ok(&r, "train");
  tu_free(&r);
  r = cavs("info", path_in(ckpt), NULL);
  ok(&r, "info");
  ck_assert(sscanf(strstr(r.out, "parameters"), "parameters %ld", params) == 1);
  ck_assert(sscanf(strstr(r.out, "vocabulary"), "vocabulary %ld", words) == 1);
  return r;
}

/* --dim changes the parameter shapes: the count cavs info reports follows them. */
START_TEST(dim_overrides) {
  gen_data();
  long params = 0, words = 0;
  RunResult r = trained_info("treelstm.vf", "E=5", "H=7", "dims.ckpt", &params, &words);
  long E = 5, H = 7, C = 5;
  long want = words * E + 4 * E * H + 4 * H * H + 4 * H + H * C + C;
  ck_assert_int_eq(params, want);
  ck_assert_msg(strstr(r.out, " E=5 H=7 C=5 V="), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dim", "Q=5", NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "no dim 'Q'"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dim", "H=zero", NULL);
  ck_assert_int_eq(r.status, 1);
  tu_free(&r);
}
END_TEST

/* A product dim (mvrnn's HH = H * H) follows its factors, and cannot be set itself. */
START_TEST(product_dim_follows) {
  gen_data();
  long params = 0, words = 0;
  RunResult r = trained_info("mvrnn.vf", "H=3", NULL, "mv.ckpt", &params, &words);
  long H = 3, C = 5;
  /* emb, wmat; Wl, Wr, b; Ml, Mr; Wc, bc */
  ck_assert_int_eq(params, words * H + words * H * H + 2 * H * H + H + 2 * H * H + H * C + C);
  ck_assert_msg(strstr(r.out, " H=3 C=5 HH=9 V="), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  r = cavs("train", model("mvrnn.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dim", "HH=9", NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "dim HH is the product H * H; set its factors instead"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
}
END_TEST

/* What a user gets wrong: one line, naming the file, exit status 1. */
/* --device names the backend; the first line of the output says where the model runs
 * (predict's on standard error: its output is data); an unknown device is refused
 * before anything is read or written. */
/* Without --threads, what OMP_NUM_THREADS or OPENBLAS_NUM_THREADS say, else the
 * processors online; a value that is not a thread count is passed over. */
static void threads_shown(const char *omp, const char *openblas, long want) {
  if (omp) setenv("OMP_NUM_THREADS", omp, 1);
  else unsetenv("OMP_NUM_THREADS");
  if (openblas) setenv("OPENBLAS_NUM_THREADS", openblas, 1);
  else unsetenv("OPENBLAS_NUM_THREADS");
  RunResult r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dim",
                     "E=4", "--dim", "H=4", "--epochs", "1", NULL);
  ok(&r, "train without --threads");
  char line[64];
  snprintf(line, sizeof line, "device: cpu, %ld threads\n", want);
  ck_assert_msg(!strncmp(r.out, line, strlen(line)), "OMP_NUM_THREADS=%s OPENBLAS_NUM_THREADS=%s, want %ld: %s",
                omp ? omp : "(unset)", openblas ? openblas : "(unset)", want, tu_tail(r.out, 600));
  tu_free(&r);
}

START_TEST(threads_default_from_the_machine) {
  gen_data();
  const char *omp = getenv("OMP_NUM_THREADS"), *ob = getenv("OPENBLAS_NUM_THREADS");
  char *omp0 = omp ? strdup(omp) : NULL, *ob0 = ob ? strdup(ob) : NULL;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  threads_shown("3", "5", 3);
  threads_shown(NULL, "5", 5);
  threads_shown("0", "x", online < 1 ? 1 : online > 1024 ? 1024 : online);
  threads_shown(NULL, NULL, online < 1 ? 1 : online > 1024 ? 1024 : online);
  if (omp0) setenv("OMP_NUM_THREADS", omp0, 1);
  if (ob0) setenv("OPENBLAS_NUM_THREADS", ob0, 1);
  free(omp0);
  free(ob0);
}
END_TEST

/* Pre-trained vectors by word, kept fixed; a malformed file named with its line. */
START_TEST(init_and_freeze) {
  gen_data();
  const char *vec = "2 12\nw3 1 2 3 4 5 6 7 8 9 10 11 12\nabsent 1 1 1 1 1 1 1 1 1 1 1 1\n"
                    "w7 0 0 0 0 0 0 0 0 0 0 0 0.5\n";
  tu_write(path_in("vec.txt"), vec, strlen(vec));
  char init[512];
  snprintf(init, sizeof init, "emb=%s", path_in("vec.txt"));
  RunResult r = TRAIN("--epochs", "1", "--init", init, "--freeze", "emb", NULL);
  ok(&r, "train --init --freeze");
  ck_assert_msg(strstr(r.out, "init emb: 2 of the 60 words from "), "%s", tu_tail(r.out, 600));
  /* what did not match, a sample of it by id */
  ck_assert_msg(strstr(r.out, "(3 vectors); none for 58, e.g. "), "%s", tu_tail(r.out, 600));
  tu_free(&r);
  /* GloVe 840B: words with spaces in them (split from the right by the width; they
     match no vocabulary word), a byte-order mark, CR LF; and the same file gzipped */
  const char *glove = "\xef\xbb\xbfw3 1 2 3 4 5 6 7 8 9 10 11 12\r\n. . . 1 1 1 1 1 1 1 1 1 1 1 1\r\n"
                      "at name@domain.com 0 0 0 0 0 0 0 0 0 0 0 0\nw7 0 0 0 0 0 0 0 0 0 0 0 0.5\n";
  tu_write(path_in("g840.txt"), glove, strlen(glove));
  char cmd[9000];
  snprintf(cmd, sizeof cmd, "gzip -c '%s' > '%s'", path_in("g840.txt"), path_in("g840.txt.gz"));
  char *sh[] = {"/bin/sh", "-c", cmd, NULL};
  r = tu_run(NULL, sh, 60);
  ok(&r, "gzip");
  tu_free(&r);
  for (int gz = 0; gz < 2; gz++) {
    snprintf(init, sizeof init, "emb=%s", path_in(gz ? "g840.txt.gz" : "g840.txt"));
    r = TRAIN("--epochs", "1", "--quiet", "--init", init, "--freeze", "emb", "--save", path_in("g.ckpt"), NULL);
    ok(&r, gz ? "--init a .gz file" : "--init with spaces in words");
    tu_free(&r);
    /* the vectors are in the table: w3's row as given (frozen, so as trained) */
    r = cavs("predict", path_in("g.ckpt"), "--data", path_in("dev.txt"), "--all-nodes", "--value", "x", NULL);
    ok(&r, "predict --value x");
    ck_assert_msg(strstr(r.out, "1 2 3 4 5 6 7 8 9 10 11 12"), "%s: w3's vector not in the table:\n%s",
                  gz ? "gz" : "text", tu_tail(r.out, 600));
    tu_free(&r);
  }
  snprintf(init, sizeof init, "emb=%s", path_in("vec.txt"));
  /* a file of another width: named as such, not taken for words with spaces */
  tu_write(path_in("w13.txt"), "w3 1 2 3 4 5 6 7 8 9 10 11 12 13\n", 33);
  char init13[4500];
  snprintf(init13, sizeof init13, "emb=%s", path_in("w13.txt"));
  /* --init with --resume: refused, not passed over */
  r = TRAIN("--epochs", "1", "--quiet", "--save", path_in("ir.ckpt"), NULL);
  ok(&r, "train");
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--init", init, "--resume", path_in("ir.ckpt"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "--init starts a new model's tables"), "%s", tu_tail(r.err, 600));
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--init", init13, NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "w13.txt:1: error: 'w3' has 13 numbers; 'emb' is 12 wide"), "%s",
                tu_tail(r.err, 600));
  tu_free(&r);
  tu_write(path_in("vec.txt"), "w3 1 2\n", 7);
  r = TRAIN("--epochs", "1", "--init", init, NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "vec.txt:1: error: 'w3' has 2 numbers; 'emb' is 12 wide"), "%s", tu_tail(r.err, 600));
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--freeze", "Wi", NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "cannot be frozen alone"), "%s", tu_tail(r.err, 600));
  tu_free(&r);
}
END_TEST

/* The schedule and the stopping rule, on the program's own output: a learning rate of
 * 1e-30 changes no parameter, so the dev accuracy never improves after the first epoch
 * and --patience 2 stops after the third; --lr-decay halves the rate each epoch (the
 * log's lr, past the warm-up); --select root keeps the best root accuracy. */
START_TEST(schedules_and_stopping) {
  gen_data();
  RunResult r = TRAIN("--epochs", "10", "--lr", "1e-30", "--patience", "2", NULL);
  ok(&r, "train --patience");
  ck_assert_msg(strstr(r.out, "epoch 3/10") && !strstr(r.out, "epoch 4/10") &&
                    strstr(r.out, "stopping after epoch 3: no better dev accuracy in 2 epochs (best "),
                "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  r = TRAIN("--epochs", "3", "--lr", "0.1", "--lr-decay", "0.5", "--warmup", "3", "--select", "root", "--log",
            path_in("sched.log"), "--save", path_in("sched.ckpt"), NULL);
  ok(&r, "train --lr-decay --warmup --select root");
  double best_root = -1, root;
  for (char *p = r.out; (p = strstr(p, " root ")); p++)
    if (sscanf(p, " root %lf", &root) == 1 && root > best_root) best_root = root;
  tu_free(&r);
  json_t *log = log_records(path_in("sched.log"));
  const double lrs[] = {0.1, 0.05, 0.025};
  ck_assert_int_eq(json_array_size(log), 3);
  for (int e = 0; e < 3; e++) {
    json_t *rec = json_array_get(log, (size_t)e);
    double lr = json_real_value(json_object_get(rec, "lr"));
    ck_assert_msg(lr == lrs[e], "epoch %d: lr %.17g, not %g", e + 1, lr, lrs[e]);
    ck_assert_msg(!strncmp(json_string_value(json_object_get(rec, "time")), "20", 2), "epoch %d: no time", e + 1);
  }
  json_decref(log);
  r = cavs("info", path_in("sched.ckpt"), NULL);
  ok(&r, "info");
  double best = -1;
  ck_assert(strstr(r.out, "best dev") && sscanf(strstr(r.out, "best dev"), "best dev %lf", &best) == 1);
  ck_assert_msg(fabs(best - best_root) < 1e-4, "best %.4f, the best root accuracy printed %.4f", best, best_root);
  tu_free(&r);
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--patience", "2",
           NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "--patience needs a --dev set"), "%s", r.err);
  tu_free(&r);
}
END_TEST

START_TEST(device_named) {
  gen_data();
  RunResult r = TRAIN("--epochs", "1", "--device", "cpu", "--save", path_in("dev.ckpt"), NULL);
  ok(&r, "train --device cpu");
  ck_assert_msg(!strncmp(r.out, "device: cpu, 1 threads\n", 23), "%s", tu_tail(r.out, 600));
  tu_free(&r);
  r = cavs("eval", path_in("dev.ckpt"), "--data", path_in("dev.txt"), "--device", "cpu", NULL);
  ok(&r, "eval --device cpu");
  ck_assert_msg(!strncmp(r.out, "device: cpu", 11), "%s", tu_tail(r.out, 600));
  tu_free(&r);
  r = cavs("predict", path_in("dev.ckpt"), "--data", path_in("dev.txt"), NULL);
  ok(&r, "predict");
  int cls;
  ck_assert_msg(sscanf(r.out, "%d\n", &cls) == 1, "%s", tu_tail(r.out, 600));
  ck_assert_msg(strstr(r.err, "device: cpu"), "%s", tu_tail(r.err, 600));
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--device", "tpu", "--save", path_in("tpu.ckpt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "cavs: unknown device 'tpu' (devices: cpu"), "%s", tu_tail(r.err, 600));
  ck_assert_int_eq(access(path_in("tpu.ckpt"), F_OK), -1);
  tu_free(&r);
  /* CAVS_DEVICE stands for --device, which wins over it */
  char *env_tpu[] = {"CAVS_DEVICE=tpu", NULL};
  r = cavs_env(env_tpu, "eval", path_in("dev.ckpt"), "--data", path_in("dev.txt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "unknown device 'tpu'"), "%s", tu_tail(r.err, 600));
  tu_free(&r);
  r = cavs_env(env_tpu, "eval", path_in("dev.ckpt"), "--data", path_in("dev.txt"), "--device", "cpu", NULL);
  ok(&r, "eval --device cpu with CAVS_DEVICE=tpu");
  tu_free(&r);
  r = cavs("eval", path_in("dev.ckpt"), "--data", path_in("dev.txt"), "--device", "", NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "unknown device ''"), "%s", tu_tail(r.err, 600));
  tu_free(&r);
  /* cuda: refused here with the reason (not built, or no GPU), or, on a machine with
     both, the same training as on the CPU */
  r = TRAIN("--epochs", "1", "--device", "cuda", NULL);
  if (r.status) {
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "cavs: device 'cuda' cannot be used: "), "%s", tu_tail(r.err, 600));
  } else {
    ck_assert_msg(!strncmp(r.out, "device: cuda", 12), "%s", tu_tail(r.out, 600));
  }
  tu_free(&r);
}
END_TEST

/* A command line getopt cannot take is named in the program's voice, with the option a
 * typo was probably meant to be. */
START_TEST(option_typos_suggest) {
  gen_data();
  static const struct {
    const char *args[4], *want;
  } cases[] = {
      {{"train", "m.vf", "--epohcs", "3"}, "cavs: train: unknown option '--epohcs'; did you mean '--epochs'?\n"},
      {{"train", "m.vf", "--quiet=1"}, "cavs: train: option '--quiet' takes no value\n"},
      {{"train", "m.vf", "--epochs"}, "cavs: train: option '--epochs' needs a value\n"},
      {{"train", "m.vf", "--zzzzzzzz"}, "cavs: train: unknown option '--zzzzzzzz'\n"},
      {{"gen", "toy", "--grpahs", "3"}, "cavs: gen: unknown option '--grpahs'; did you mean '--graphs'?\n"},
      {{"build", "--presicion", "double", "m.vf"}, "cavs: build: unknown option '--presicion'; did you mean '--precision'?\n"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    RunResult r = cavs(cases[i].args[0], cases[i].args[1], cases[i].args[2], cases[i].args[3], NULL);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(!strcmp(r.err, cases[i].want), "%s: %s", cases[i].want, r.err);
    tu_free(&r);
  }
  char *argv[] = {(char *)tu_env("CAVSC", "./cavsc"), "--reprot", "m.vf", NULL};
  RunResult r = tu_run(NULL, argv, 60);
  ck_assert_int_eq(r.status, 1);
  ck_assert_str_eq(r.err, "cavsc: unknown option '--reprot'; did you mean '--report'?\n");
  tu_free(&r);
}
END_TEST

/* cavs help, cavs help COMMAND and cavs COMMAND --help print the table's rows: each of a
 * command's options with its meaning and default. Options take any unambiguous prefix
 * among their command's (getopt's rule, plot's too); commands are spelled in full; an
 * option of another command names the commands that take it. */
START_TEST(help_and_prefixes) {
  RunResult r = cavs("help", NULL), h;
  ok(&r, "help");
  const char *const cmds[] = {"train", "eval", "predict", "gen", "info", "plot", "build", "help"};
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    char want[64];
    snprintf(want, sizeof want, "\n  cavs %s ", cmds[i]);
    ck_assert_msg(strstr(r.out, want), "cavs help has no %s:\n%s", cmds[i], r.out);
  }
  h = cavs("--help", NULL);
  ck_assert_msg(h.status == 0 && !strcmp(h.out, r.out), "cavs --help is not cavs help");
  tu_free(&h);
  tu_free(&r);
  r = cavs("help", "train", NULL);
  ok(&r, "help train");
  ck_assert_msg(strstr(r.out, "usage: cavs train ") && strstr(r.out, "\n  --epochs N ") &&
                    strstr(r.out, "default: 10\n") && strstr(r.out, "\n  --optimizer sgd|adagrad|adam") &&
                    strstr(r.out, "\n  --quiet ") && !strstr(r.out, "--json") && !strstr(r.out, "--graphs"),
                "%s", r.out);
  const char *const same[][4] = {{"train", "--help"}, {"train", "m.vf", "--epochs", "--help"}, {"train", "--he"}, {"train", "-h"}};
  for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
    h = cavs(same[i][0], same[i][1], same[i][2], same[i][3], NULL);
    ck_assert_msg(h.status == 0 && !strcmp(h.out, r.out), "cavs %s %s differs from cavs help train", same[i][0], same[i][1]);
    tu_free(&h);
  }
  tu_free(&r);
  r = cavs("plot", "--help", NULL);
  ck_assert_msg(r.status == 0 && strstr(r.out, "\n  -o, --output FILE ") && !strstr(r.out, "--epochs N"), "%s", r.out);
  tu_free(&r);
  r = cavs("--ver", NULL);
  ck_assert_msg(r.status == 0 && !strncmp(r.out, "cavs ", 5), "cavs --ver: %d %s%s", r.status, r.out, r.err);
  tu_free(&r);
  static const struct {
    const char *args[4], *want;
  } bad[] = {
      {{"tr", "m.vf"}, "cavs: unknown command 'tr'; did you mean 'train'? (commands are spelled in full)\n"},
      {{"evaluate", "a.ckpt"}, "cavs: unknown command 'evaluate'; did you mean 'eval'? (commands are spelled in full)\n"},
      {{"help", "tr"}, "cavs: unknown command 'tr'; did you mean 'train'? (commands are spelled in full)\n"},
      {{"--v3rsion"}, "cavs: unknown option '--v3rsion'; did you mean '--version'?\n"},
      {{"eval", "a.ckpt", "--epochs", "3"}, "cavs: eval: option '--epochs' is not one of eval's: train takes it\n"},
      {{"info", "a.ckpt", "--batch=3"}, "cavs: info: option '--batch' is not one of info's: train, eval or predict takes it\n"},
      {{"predict", "a.ckpt", "--p", "bfs"}, "cavs: predict: option '--p' is ambiguous: '--policy' or another\n"},
      {{"plot", "p.log", "--out"}, "cavs: plot: option '--output' needs a value\n"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    r = cavs(bad[i].args[0], bad[i].args[1], bad[i].args[2], bad[i].args[3], NULL);
    ck_assert_msg(r.status == 1 && !strcmp(r.err, bad[i].want), "cavs %s %s: exit %d\n%s", bad[i].args[0],
                  bad[i].args[1] ? bad[i].args[1] : "", r.status, r.err);
    tu_free(&r);
  }
  /* prefixes: eval's --p is --policy (predict's --probs is not eval's), gen's --gra is
     --graphs, plot's --out is --output */
  gen_data();
  r = cavs("gen", "toy", "--gra", "3", "--out", path_in("toy3.txt"), NULL);
  ok(&r, "gen --gra 3 --out");
  tu_free(&r);
  char *three = tu_slurp(path_in("toy3.txt"), NULL);
  int lines = 0;
  for (char *p = three; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) lines++;
  ck_assert_int_eq(lines, 3);
  free(three);
  r = cavs("eval", path_in("nonesuch.ckpt"), "--data", path_in("dev.txt"), "--p", "nonesuch", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "--policy: 'nonesuch' is not"), "%s", r.err);
  tu_free(&r);
}
END_TEST

START_TEST(user_errors) {
  gen_data();
  RunResult r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("missing.txt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "missing.txt"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  const char *bad = "(2 (1 a) (3 b))\n(2 (1 a) (3 b)\n";
  tu_write(path_in("bad.txt"), bad, strlen(bad));
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("bad.txt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "bad.txt:2: error:"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  tu_write(path_in("broken.vf"), "model m;\ndim H = 4\n", strlen("model m;\ndim H = 4\n"));
  r = cavs("train", path_in("broken.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "broken.vf:2:"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  r = cavs("train", model("treelstm.vf"), "--format", "xml", "--train", path_in("train.txt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "unknown data format"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  /* divergence names the first value that is not finite: after a step certain to make
     one (whatever the machine's products round). The two graphs have the same input and
     different classes, so one of them is mispredicted whatever the initial Wc: its
     gradient is h (p - y) with h = 1e6 and |p - y| near 1, the step of 1e30 times that
     leaves Wc finite near 1e36, and the next forward's logits (1e6 times that) are not. */
  const char *dvg = "model dvg; dim H = 2; dim C = 2; input y : class[C]; input f : real[H];\n"
                    "param Wc[H,C] init uniform(-1, 1);\n"
                    "vertex v (children 1) { h = f * f + gather(0); scatter(h); push(h); }\n"
                    "push (h) { loss softmax_xent(h @ Wc, y); }\n";
  tu_write(path_in("dvg.vf"), dvg, strlen(dvg));
  const char *dvg_data = "graph\n0 v ; f=1e3,1e3 y=0\nend\ngraph\n0 v ; f=1e3,1e3 y=1\nend\n";
  tu_write(path_in("dvg.cgf"), dvg_data, strlen(dvg_data));
  r = cavs("train", path_in("dvg.vf"), "--format", "cgf", "--train", path_in("dvg.cgf"), "--epochs", "2", "--batch",
           "1", "--optimizer", "sgd", "--lr", "1e30", "--quiet", NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "is not finite") && (strstr(r.err, "of graph") || strstr(r.err, "parameter ")), "%s",
                tu_tail(r.err, 1800));
  tu_free(&r);
  /* ... while a value that overflows before any step names its vertex and graph, on any
     machine: 1e30 squared is not a float */
  const char *ovf = "model ovf; dim H = 2; dim C = 2; input y : class[C]; input f : real[H];\n"
                    "param Wc[H,C] init uniform(-1, 1);\n"
                    "vertex v (children 1) { h = f * f + gather(0); scatter(h); push(h); }\n"
                    "push (h) { loss softmax_xent(h @ Wc, y); }\n";
  tu_write(path_in("ovf.vf"), ovf, strlen(ovf));
  const char *ovf_data = "graph\n0 v ; f=1,1 y=0\n1 v 0 ; f=1,2 y=1\nend\n"
                         "graph\n0 v ; f=1,1 y=0\n1 v 0 ; f=2,1 y=1\n2 v 1 ; f=1e30,1 y=0\nend\n"
                         "graph\n0 v ; f=0,0 y=1\nend\n";
  tu_write(path_in("ovf.cgf"), ovf_data, strlen(ovf_data));
  r = cavs("train", path_in("ovf.vf"), "--format", "cgf", "--train", path_in("ovf.cgf"), "--epochs", "1", "--quiet", NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "is not finite") && strstr(r.err, "at vertex 2 of graph 2 of"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  r = cavs("frobnicate", NULL);
  ck_assert_int_eq(r.status, 1);
  tu_free(&r);
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--policy", "fifo",
           "--quiet", NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "--policy: 'fifo' is not bfs, depth, agenda, frontier or serial"), "%s",
                tu_tail(r.err, 1800));
  tu_free(&r);
  /* every policy trains (what each computes: check_engine) */
  const char *pol[] = {"depth", "agenda", "frontier"};
  for (int i = 0; i < 3; i++) {
    r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--policy", pol[i],
             "--epochs", "1", "--dim", "H=4", "--dim", "E=4", "--quiet", NULL);
    ck_assert_msg(r.status == 0, "--policy %s: %s", pol[i], tu_tail(r.err, 1800));
    tu_free(&r);
  }
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--save",
           "/nonexistent-dir/x.ckpt", "--epochs", "1", "--dim", "H=4", "--dim", "E=4", "--quiet", NULL);
  ck_assert_int_eq(r.status, 1);
  /* found before training starts, not after an epoch */
  ck_assert_msg(strstr(r.err, "--save /nonexistent-dir/x.ckpt: cannot write there"), "%s", tu_tail(r.err, 1800));
  ck_assert_ptr_null(strstr(r.out, "epoch"));
  tu_free(&r);
}
END_TEST

/* Numbers on the command line are whole and in range, everywhere: nothing is cut short
 * or wrapped around, and nothing starts with a batch of 0. */
START_TEST(numeric_options_strict) {
  gen_data();
  struct {
    const char *opt, *val;
  } bad[] = {
      {"--epochs", "0"}, {"--epochs", "3x"}, {"--epochs", "99999999999999999999"}, {"--epochs", ""},
      {"--batch", "0"}, {"--batch", "-4"}, {"--batch", "4294967297"}, {"--threads", "0"}, {"--threads", "1.5"},
      {"--seed", "-1"}, {"--seed", "18446744073709551616"}, {"--lr", "-0.1"}, {"--lr", "0"}, {"--lr", "nan"},
      {"--lr", "inf"}, {"--clip", "-1"}, {"--weight-decay", "-1e-3"}, {"--max-memory", "0"},
      {"--max-memory", "12Q"}, {"--dim", "H=0"}, {"--dim", "H=99999999999999999999"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    RunResult r = TRAIN(bad[i].opt, bad[i].val, "--epochs", "1", "--quiet", NULL);
    /* --epochs given twice: the bad one first, so the second cannot hide it */
    if (!strcmp(bad[i].opt, "--epochs")) {
      tu_free(&r);
      r = TRAIN("--quiet", bad[i].opt, bad[i].val, NULL);
    }
    ck_assert_msg(r.status == 1, "%s %s: exit %d\n%s", bad[i].opt, bad[i].val, r.status, tu_tail(r.err, 1800));
    ck_assert_msg(strstr(r.err, bad[i].opt + 2), "%s %s: %s", bad[i].opt, bad[i].val, tu_tail(r.err, 1800));
    tu_free(&r);
  }
  /* a value past the limit is told the limit */
  RunResult r = TRAIN("--epochs", "1", "--quiet", "--dim", "H=1000000000", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "an integer from 1 to 16777216"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--quiet", "--save", path_in("n.ckpt"), NULL);
  ok(&r, "train");
  tu_free(&r);
  const char *cmds[] = {"eval", "predict"};
  for (int i = 0; i < 2; i++) {
    r = cavs(cmds[i], path_in("n.ckpt"), "--data", path_in("dev.txt"), "--batch", "0", NULL);
    ck_assert_msg(r.status == 1 && strstr(r.err, "--batch"), "%s --batch 0: %d %s", cmds[i], r.status, tu_tail(r.err, 1800));
    tu_free(&r);
  }
  /* a batch above the old cap of 256 predicts every graph */
  r = cavs("predict", path_in("n.ckpt"), "--data", path_in("dev.txt"), "--batch", "1000", NULL);
  ok(&r, "predict --batch 1000");
  int lines = 0;
  for (const char *p = r.out; *p; p++) lines += *p == '\n';
  ck_assert_int_eq(lines, 300);
  tu_free(&r);
}
END_TEST

/* An output of a run never overwrites one of its inputs; --resume X --save X is the
 * one way to write over a file the run reads. A save that was killed leaves a
 * temporary file that the next save removes. */
/* An output named by a descriptor (/dev/stdout, /dev/fd/N, a link of the user's to one)
 * that the shell sent to a file, appending: the file is appended to, the same file (not
 * replaced by a new one without what it held), and a log's records through stdout stay
 * whole lines beside the epochs' own. */
static ino_t inode_of(const char *path) {
  struct stat st;
  ck_assert_msg(stat(path, &st) == 0, "%s: %s", path, strerror(errno));
  return st.st_ino;
}
static void shell(const char *cmd) {
  char *sh[] = {"/bin/sh", "-c", (char *)cmd, NULL};
  RunResult r = tu_run(NULL, sh, 120);
  ck_assert_msg(r.status == 0, "%s: exit %d %s", cmd, r.status, tu_tail(r.err, 1800));
  tu_free(&r);
}
START_TEST(outputs_to_descriptors) {
  gen_data();
  const char *head = "PRECIOUS\n";
  tu_write(path_in("d.txt"), head, strlen(head));
  ino_t ino = inode_of(path_in("d.txt"));
  unlink(path_in("out-link"));
  ck_assert(symlink("/dev/stdout", path_in("out-link")) == 0);
  char cmd[9000];
  const char *outs[] = {"/dev/stdout", "/proc/self/fd/1", path_in("out-link")};
  for (int i = 0; i < 3; i++) {
    snprintf(cmd, sizeof cmd, "'%s' gen toy --graphs %d --seed 1 -o '%s' >> '%s'", cavs_bin, 2 + i, outs[i],
             path_in("d.txt"));
    shell(cmd);
  }
  snprintf(cmd, sizeof cmd, "'%s' gen toy --graphs 4 --seed 1 -o /dev/fd/3 3>> '%s'", cavs_bin, path_in("d.txt"));
  shell(cmd);
  ck_assert_msg(inode_of(path_in("d.txt")) == ino, "d.txt was replaced");
  char *d = tu_slurp(path_in("d.txt"), NULL);
  int trees = 0;
  for (char *line = strtok(d + strlen(head), "\n"); line; line = strtok(NULL, "\n")) trees += line[0] == '(';
  ck_assert_msg(!strncmp(d, head, strlen(head)) && trees == 2 + 3 + 4 + 4, "d.txt: %d trees after %.20s", trees, d);
  free(d);
  /* a log through standard output, appended to a file, with the epochs' lines; and
     through another descriptor */
  const char *note = "{\"note\": 1}\n";
  for (int fd = 1; fd <= 3; fd += 2) {
    tu_write(path_in("l.txt"), note, strlen(note));
    ino = inode_of(path_in("l.txt"));
    snprintf(cmd, sizeof cmd,
             "'%s' train '%s' --format ptb-tree --train '%s' --dim E=8 --dim H=8 --epochs 3 --threads 1 --log "
             "/dev/fd/%d %d>> '%s'",
             cavs_bin, model("treelstm.vf"), path_in("dev.txt"), fd, fd, path_in("l.txt"));
    shell(cmd);
    ck_assert_msg(inode_of(path_in("l.txt")) == ino, "l.txt was replaced");
    char *l = tu_slurp(path_in("l.txt"), NULL);
    ck_assert_msg(l && !strncmp(l, note, strlen(note)), "--log /dev/fd/%d: what l.txt held is gone", fd);
    int recs = 0, epochs = 0;
    for (char *line = strtok(l, "\n"); line; line = strtok(NULL, "\n")) {
      if (line[0] != '{') {
        epochs += !strncmp(line, "epoch ", 6);
        continue;
      }
      json_error_t e;
      json_t *rec = json_loads(line, 0, &e);
      ck_assert_msg(json_is_object(rec), "l.txt: a torn record (%s): %s", e.text, line);
      recs += json_object_get(rec, "epoch") != NULL;
      json_decref(rec);
    }
    free(l);
    ck_assert_msg(recs == 3 && epochs == (fd == 1 ? 3 : 0), "--log /dev/fd/%d: %d records, %d epoch lines", fd, recs,
                  epochs);
  }
}
END_TEST

START_TEST(outputs_never_clobber_inputs) {
  gen_data();
  RunResult r = TRAIN("--epochs", "1", "--quiet", "--save", path_in("train.txt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "would overwrite") && strstr(r.err, "the --train data"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--quiet", "--log", path_in("dev.txt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "would overwrite"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--quiet", "--save", path_in("c.ckpt"), "--log", path_in("c.ckpt"), NULL);
  ck_assert_int_eq(r.status, 1);
  tu_free(&r);
  /* the --init vectors, as given, through a symbolic link and through a hard link; and
     the --train data through a hard link */
  const char *vec = "w3 1 2 3 4 5 6 7 8 9 10 11 12\n";
  tu_write(path_in("glove.txt"), vec, strlen(vec));
  unlink(path_in("glove-sym.txt"));
  unlink(path_in("glove-hard.txt"));
  unlink(path_in("train-hard.txt"));
  ck_assert(symlink(path_in("glove.txt"), path_in("glove-sym.txt")) == 0);
  ck_assert(link(path_in("glove.txt"), path_in("glove-hard.txt")) == 0);
  ck_assert(link(path_in("train.txt"), path_in("train-hard.txt")) == 0);
  char init[4500];
  snprintf(init, sizeof init, "emb=%s", path_in("glove.txt"));
  const char *opts[][2] = {{"--save", "glove.txt"}, {"--log", "glove.txt"}, {"--save", "glove-sym.txt"},
                           {"--log", "glove-hard.txt"}, {"--log", "train-hard.txt"}};
  for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
    r = TRAIN("--epochs", "1", "--quiet", "--init", init, opts[i][0], path_in(opts[i][1]), NULL);
    ck_assert_msg(r.status == 1 && strstr(r.err, "would overwrite"), "%s %s: exit %d %s", opts[i][0], opts[i][1], r.status,
                  tu_tail(r.err, 1800));
    ck_assert_msg(strstr(r.err, i == 4 ? "the --train data" : "the --init vectors"), "%s", tu_tail(r.err, 1800));
    tu_free(&r);
  }
  char *v = tu_slurp(path_in("glove.txt"), NULL);
  ck_assert_msg(!strcmp(v, vec), "the --init vectors were changed");
  free(v);
  /* the checkpoint resumed from is not where the best one goes */
  r = TRAIN("--epochs", "1", "--quiet", "--save", path_in("r.ckpt"), NULL);
  ok(&r, "train");
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--quiet", "--resume", path_in("r.ckpt.best"), "--save", path_in("r.ckpt"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "the checkpoint resumed from"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  /* cavs plot never draws over the log it reads, nor through a link to it */
  r = TRAIN("--epochs", "1", "--quiet", "--log", path_in("p.log"), NULL);
  ok(&r, "train --log");
  tu_free(&r);
  unlink(path_in("p-sym.log"));
  ck_assert(symlink(path_in("p.log"), path_in("p-sym.log")) == 0);
  char *log0 = tu_slurp(path_in("p.log"), NULL);
  for (int i = 0; i < 2; i++) {
    r = cavs("plot", path_in("p.log"), "-o", path_in(i ? "p-sym.log" : "p.log"), NULL);
    ck_assert_msg(r.status == 1 && strstr(r.err, "-o ") && strstr(r.err, "would overwrite") && strstr(r.err, "the log"),
                  "plot -o %d: exit %d %s", i, r.status, tu_tail(r.err, 1800));
    tu_free(&r);
  }
  char *log1 = tu_slurp(path_in("p.log"), NULL);
  ck_assert_msg(!strcmp(log0, log1), "the log was changed");
  free(log0);
  free(log1);
  /* and the data files are intact */
  r = TRAIN("--epochs", "1", "--quiet", "--save", path_in("c.ckpt"), NULL);
  ok(&r, "train after refusals");
  tu_free(&r);
  /* a file of the user's named as the earlier design named its temporary files */
  tu_write(path_in("c.ckpt.tmpbackup"), "notes", 5);
  r = TRAIN("--epochs", "1", "--quiet", "--resume", path_in("c.ckpt"), "--save", path_in("c.ckpt"), NULL);
  ok(&r, "resume and save over the same file");
  tu_free(&r);
  char *notes = tu_slurp(path_in("c.ckpt.tmpbackup"), NULL);
  ck_assert_msg(notes && !strcmp(notes, "notes"), "a file of the user's was removed by a save beside it");
  free(notes);
  r = cavs("info", path_in("c.ckpt"), NULL);
  ok(&r, "info");
  ck_assert_msg(strstr(r.out, "2 epochs done"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
}
END_TEST

/* Four runs saving to one path at once, each every epoch (the issue a user met: each
 * save removed the others' temporary files, and 8 runs of 12 died): all four finish, the
 * path holds a whole checkpoint of one of them, and nothing else is left. */
START_TEST(concurrent_saves_all_finish) {
  RunResult r = cavs("gen", "toy", "--graphs", "40", "--leaves", "6", "--words", "20", "--seed", "5", "-o",
                     path_in("small.txt"), NULL);
  ok(&r, "gen");
  tu_free(&r);
  char *ck = strdup(path_in("same.ckpt")), *data = strdup(path_in("small.txt")), *vf = strdup(model("treelstm.vf"));
  enum { RUNS = 4 };
  pid_t pids[RUNS];
  for (int k = 0; k < RUNS; k++) {
    char seed[16];
    snprintf(seed, sizeof seed, "%d", k + 1);
    char *argv[] = {(char *)cavs_bin, "train", vf, "--format", "ptb-tree", "--train", data, "--dim", "E=4", "--dim",
                    "H=4", "--batch", "8", "--epochs", "40", "--threads", "1", "--seed", seed, "--quiet", "--save", ck, NULL};
    pids[k] = fork();
    ck_assert(pids[k] >= 0);
    if (pids[k] == 0) {
      int null = open("/dev/null", O_WRONLY);
      if (null >= 0) dup2(null, 1);
      execv(argv[0], argv);
      _exit(127);
    }
  }
  for (int k = 0; k < RUNS; k++) {
    int st;
    ck_assert(waitpid(pids[k], &st, 0) == pids[k]);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "run %d of %d saving to one path: status %d", k + 1, RUNS, st);
  }
  r = cavs("info", ck, NULL);
  ok(&r, "info");
  ck_assert_msg(strstr(r.out, "40 epochs done"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  DIR *d = opendir(dir);
  struct dirent *e;
  while ((e = readdir(d))) ck_assert_msg(!strstr(e->d_name, "same.ckpt") || !strcmp(e->d_name, "same.ckpt"), "%s left", e->d_name);
  closedir(d);
  free(ck);
  free(data);
  free(vf);
}
END_TEST

/* A checkpoint of a --no-merge build with a parameter frozen whose storage the default
 * build merges with others': it evaluates and predicts on the default build (nothing is
 * frozen in evaluation), and a resume without --no-merge says that it needs it. */
START_TEST(frozen_no_merge_checkpoint) {
  gen_data();
  RunResult r = TRAIN("--epochs", "1", "--quiet", "--no-merge", "--freeze", "Wi", "--save", path_in("nm.ckpt"), NULL);
  ok(&r, "train --no-merge --freeze Wi");
  tu_free(&r);
  r = cavs("eval", path_in("nm.ckpt"), "--data", path_in("dev.txt"), NULL);
  ok(&r, "eval");
  ck_assert_msg(strstr(r.out, "accuracy"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  r = cavs("predict", path_in("nm.ckpt"), "--data", path_in("dev.txt"), NULL);
  ok(&r, "predict");
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--quiet", "--resume", path_in("nm.ckpt"), "--save", path_in("nm.ckpt"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "'Wi' was frozen") && strstr(r.err, "--no-merge"), "exit %d: %s", r.status,
                tu_tail(r.err, 1800));
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--quiet", "--no-merge", "--resume", path_in("nm.ckpt"), "--save", path_in("nm.ckpt"), NULL);
  ok(&r, "resume with --no-merge");
  tu_free(&r);
  r = cavs("info", path_in("nm.ckpt"), NULL);
  ck_assert_msg(r.status == 0 && strstr(r.out, "2 epochs done"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
}
END_TEST

/* `cavs gen complete`'s trees, as generated by default, train treefc.vf as it is (it has
 * two classes: the generator's default for complete trees). */
START_TEST(gen_complete_fits_treefc) {
  RunResult r = cavs("gen", "complete", "--graphs", "16", "--leaves", "8", "-o", path_in("fc.txt"), NULL);
  ok(&r, "gen complete");
  tu_free(&r);
  r = cavs("train", model("treefc.vf"), "--format", "ptb-tree", "--train", path_in("fc.txt"), "--dim", "H=8", "--epochs",
           "1", "--quiet", "--threads", "1", NULL);
  ok(&r, "train treefc.vf on cavs gen complete's default trees");
  tu_free(&r);
}
END_TEST

/* A language model (text data): the epoch line gives perplexities, exp of the losses it
 * prints, and no root accuracy (its roots are the last tokens of sentences); the log has
 * dev_ppl; .best follows the dev loss by default. */
START_TEST(language_model_perplexity) {
  static const char text[] = "the cat sat on the mat\nthe dog sat on the log\na cat and a dog\n"
                             "the mat and the log\non the mat the cat sat\n";
  tu_write(path_in("lm.txt"), text, strlen(text));
  RunResult r = cavs("train", model("lstm_lm.vf"), "--format", "text", "--train", path_in("lm.txt"), "--dev",
                     path_in("lm.txt"), "--dim", "E=8", "--dim", "H=8", "--epochs", "2", "--threads", "1", "--save",
                     path_in("lm.ckpt"), "--log", path_in("lm.log"), NULL);
  ok(&r, "train lstm_lm");
  const char *line = strstr(r.out, "epoch 2/2");
  ck_assert_msg(line, "%s", tu_tail(r.out, 1800));
  double tl, tp, dl, dp;
  ck_assert_msg(sscanf(line, "epoch 2/2  train loss %lf ppl %lf acc %*f  dev loss %lf ppl %lf acc", &tl, &tp, &dl, &dp) == 4,
                "%s", line);
  ck_assert_msg(fabs(tp - exp(tl)) <= 0.01 * tp && fabs(dp - exp(dl)) <= 0.01 * dp, "%s", line);
  ck_assert_msg(!strstr(line, "root"), "%s", line);
  tu_free(&r);
  char *log = tu_slurp(path_in("lm.log"), NULL);
  ck_assert_msg(log && strstr(log, "\"dev_ppl\"") && strstr(log, "\"dev_root_acc\": null"), "%s", log);
  free(log);
  r = cavs("info", path_in("lm.ckpt"), NULL);
  ck_assert_msg(r.status == 0 && strstr(r.out, "loss"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
}
END_TEST

/* Resuming keeps each optimizer setting that is not given again, one by one. */
START_TEST(resume_keeps_settings_not_given) {
  gen_data();
  RunResult r = TRAIN("--epochs", "1", "--quiet", "--optimizer", "sgd", "--lr", "0.02", "--clip", "5",
                      "--weight-decay", "0.001", "--save", path_in("s.ckpt"), NULL);
  ok(&r, "train sgd");
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--quiet", "--lr", "0.03", "--resume", path_in("s.ckpt"), "--save", path_in("s2.ckpt"), NULL);
  ok(&r, "resume with --lr");
  tu_free(&r);
  r = cavs("info", path_in("s2.ckpt"), NULL);
  ok(&r, "info");
  ck_assert_msg(strstr(r.out, "optimizer sgd lr 0.03"), "%s", tu_tail(r.out, 1800));
  ck_assert_msg(strstr(r.out, "steps, state none\n"), "%s", tu_tail(r.out, 1800)); /* SGD keeps none */
  tu_free(&r);
}
END_TEST

/* A model too large for memory is an error with status 2 before anything is
 * allocated, not a crash; so is a minibatch that would not fit. */
START_TEST(memory_limits) {
  gen_data();
  RunResult r = TRAIN("--epochs", "1", "--quiet", "--dim", "H=16000000", NULL);
  ck_assert_msg(r.status == 2, "exit %d: %s", r.status, tu_tail(r.err, 1800));
  ck_assert_msg(strstr(r.err, "memory limit"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--quiet", "--max-memory", "64K", NULL);
  ck_assert_msg(r.status == 2, "exit %d: %s", r.status, tu_tail(r.err, 1800));
  ck_assert_msg(strstr(r.err, "memory limit"), "%s", tu_tail(r.err, 1800));
  /* in the unit that shows the numbers, not "0.00 GiB" */
  ck_assert_msg(strstr(r.err, "limit of 64.00 KiB") && !strstr(r.err, "0.00 GiB"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--quiet", "--max-memory", "1M", NULL);
  ck_assert_msg(r.status == 2, "exit %d: %s", r.status, tu_tail(r.err, 1800));
  ck_assert_msg(strstr(r.err, "a minibatch of"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  r = TRAIN("--epochs", "1", "--quiet", "--max-memory", "1G", NULL);
  ok(&r, "train under 1G");
  tu_free(&r);
}
END_TEST

/* Starts cavs with argv, waits until its stdout holds `ready`, lets it run `secs` more,
 * sends `sig` and returns the exit status. */
/* argv started with its output to `out`, until `ready` is in it (at most a minute) */
static pid_t start_until(char *const argv[], const char *out, const char *ready) {
  unlink(out); /* what the last run printed must not look like this one is ready */
  pid_t pid = fork();
  ck_assert(pid >= 0);
  if (pid == 0) {
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 1);
    execv(argv[0], argv);
    _exit(127);
  }
  for (int i = 0; i < 6000; i++) {
    char *text = tu_slurp(out, NULL);
    bool seen = text && strstr(text, ready);
    free(text);
    if (seen) break;
    usleep(10000);
  }
  return pid;
}

static int run_and_signal(char *const argv[], const char *out, const char *ready, double secs, int sig) {
  pid_t pid = start_until(argv, out, ready);
  usleep((useconds_t)(secs * 1e6));
  kill(pid, sig);
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *info_field(const char *ckpt, const char *key) {
  RunResult r = cavs("info", ckpt, NULL);
  ok(&r, "info");
  const char *p = strstr(r.out, key);
  ck_assert_msg(p, "no '%s' in:\n%s", key, tu_tail(r.out, 1800));
  char *v = strndup(p, strcspn(p, "\n"));
  tu_free(&r);
  return v;
}

/* A plateau schedule resumed with a patience below the checkpoint's count of epochs
 * without a better dev metric, and stopped by SIGINT inside its first epoch: saved (it
 * was refused, "a value of its learning-rate schedule is out of range", the epoch's work
 * lost), the count at the new patience. */
START_TEST(plateau_resumed_with_less_patience) {
  gen_data();
  RunResult r = TRAIN("--epochs", "4", "--lr", "1e-30", "--schedule", "plateau", "--plateau-patience", "5", "--quiet",
                      "--save", path_in("pl.ckpt"), NULL);
  ok(&r, "four epochs without a better dev accuracy");
  tu_free(&r);
  char *e = info_field(path_in("pl.ckpt"), "lr schedule plateau");
  ck_assert_msg(strstr(e, ", 3 epochs since"), "%s", e);
  free(e);
  char *argv[] = {(char *)cavs_bin, "train", strdup(model("treelstm.vf")), "--format", "ptb-tree", "--train",
                  strdup(path_in("train.txt")), "--dev", strdup(path_in("dev.txt")), "--threads", "1", "--epochs",
                  "1000", "--schedule", "plateau", "--plateau-patience", "1", "--resume", strdup(path_in("pl.ckpt")),
                  "--save", strdup(path_in("pl2.ckpt")), NULL};
  int st = run_and_signal(argv, path_in("pl.out"), "resumed after epoch 4", 0, SIGINT);
  char *out = tu_slurp(path_in("pl.out"), NULL);
  ck_assert_msg(st == 130, "exit %d:\n%s", st, out ? out : "");
  free(out);
  e = info_field(path_in("pl2.ckpt"), "lr schedule plateau");
  int bad = -1;
  const char *p = strstr(e, " epochs since");
  ck_assert_msg(p && sscanf(p - 2, "%d", &bad) == 1 && bad >= 0 && bad <= 1 && strstr(e, "patience 1"), "%s", e);
  free(e);
  const int dup[] = {2, 6, 8, 18, 20};
  for (int i = 0; i < 5; i++) free(argv[dup[i]]);
}
END_TEST

/* SIGINT in the middle of an epoch: the step finishes, the state is saved and cavs
 * exits 130; resuming finishes that epoch in the same order, so that the result is the
 * bytes of a run never interrupted. Wherever the signal lands, this holds. */
START_TEST(sigint_saves_and_resumes_exactly) {
  gen_data();
  char epochs[16] = "1000";
  char *argv[] = {(char *)cavs_bin, "train", strdup(model("treelstm.vf")), "--format", "ptb-tree", "--train",
                  strdup(path_in("train.txt")), "--dev", strdup(path_in("dev.txt")), "--dim", "E=12", "--dim", "H=16",
                  "--batch", "32", "--threads", "1", "--epochs", epochs, "--save", strdup(path_in("int.ckpt")), NULL};
  int st = run_and_signal(argv, path_in("int.out"), "model treelstm", 0.3, SIGINT);
  ck_assert_msg(st == 130, "exit %d", st);
  char *e = info_field(path_in("int.ckpt"), "training");
  int done = -1;
  ck_assert(sscanf(e, "training %d epochs done", &done) == 1);
  free(e);
  ck_assert_msg(done >= 0 && done < 1000, "%d epochs done", done);
  /* finish the interrupted epoch; then the same number of epochs without a stop */
  RunResult r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dev",
                     path_in("dev.txt"), "--threads", "1", "--epochs", "1", "--quiet", "--resume", path_in("int.ckpt"),
                     "--save", path_in("int2.ckpt"), NULL);
  ok(&r, "resume");
  tu_free(&r);
  snprintf(epochs, sizeof epochs, "%d", done + 1);
  r = TRAIN("--epochs", epochs, "--quiet", "--save", path_in("whole.ckpt"), NULL);
  ok(&r, "uninterrupted");
  tu_free(&r);
  size_t na = 0, nb = 1;
  char *a = tu_slurp(path_in("whole.ckpt"), &na), *b = tu_slurp(path_in("int2.ckpt"), &nb);
  ck_assert_msg(na == nb && !memcmp(a, b, na), "interrupted after %d epochs and resumed: not the same bytes", done);
  free(a);
  free(b);
  free(argv[2]);
  free(argv[6]);
  free(argv[8]);
  free(argv[20]);
}
END_TEST

/* --save-every: the checkpoint saved inside the epochs too, every N minibatches or every
 * TIME, and the run goes on as if nothing was saved (the bytes of a run without it, at
 * the end); a run killed by SIGKILL (nothing of it runs) after a save inside an epoch
 * resumes from that save to the bytes of a run never stopped. Wherever the kill lands,
 * this holds; the checkpoint is inside an epoch unless the kill came in the moment after
 * one of the epochs' ends, and then holds its graphs done, a multiple of the 20 that
 * five minibatches take (an epoch's 375 minibatches of 4 are whole fives). Bad values and a missing --save are refused. */
START_TEST(save_every_resumes_after_a_kill) {
  gen_data();
  RunResult r = TRAIN("--epochs", "2", "--quiet", "--save", path_in("se.ckpt"), NULL);
  ok(&r, "without --save-every");
  tu_free(&r);
  static const char *const every[] = {"3", "0.01s"};
  for (int i = 0; i < 2; i++) {
    r = TRAIN("--epochs", "2", "--quiet", "--save", path_in("se2.ckpt"), "--save-every", every[i], NULL);
    ok(&r, every[i]);
    tu_free(&r);
    size_t na = 0, nb = 1;
    char *a = tu_slurp(path_in("se.ckpt"), &na), *b = tu_slurp(path_in("se2.ckpt"), &nb);
    ck_assert_msg(a && b && na == nb && !memcmp(a, b, na), "--save-every %s: not the bytes of a run without it",
                  every[i]);
    free(a), free(b);
  }
  char *argv[] = {(char *)cavs_bin, "train", strdup(model("treelstm.vf")), "--format", "ptb-tree", "--train",
                  strdup(path_in("train.txt")), "--dim", "E=12", "--dim", "H=16", "--batch", "4", "--threads", "1",
                  "--epochs", "1000", "--save", strdup(path_in("kill.ckpt")), "--save-every", "5", NULL};
  pid_t pid = start_until(argv, path_in("kill.out"), "model treelstm");
  bool saved = false;
  for (int i = 0; i < 12000 && !(saved = access(path_in("kill.ckpt"), F_OK) == 0); i++) usleep(5000);
  kill(pid, SIGKILL);
  int st;
  waitpid(pid, &st, 0);
  ck_assert_msg(saved && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "saved %d, status %d", saved, st);
  char *e = info_field(path_in("kill.ckpt"), "training");
  int done = -1;
  ck_assert(sscanf(e, "training %d epochs done", &done) == 1 && done >= 0 && done < 1000);
  free(e);
  RunResult in = cavs("info", path_in("kill.ckpt"), NULL);
  ok(&in, "info");
  const char *at = strstr(in.out, "saved ");
  long graphs = 0;
  if (at) ck_assert_msg(sscanf(at, "saved %ld graphs into epoch", &graphs) == 1 && graphs > 0 && graphs % 20 == 0,
                        "%s", in.out);
  tu_free(&in);
  /* finish the epoch killed (or the next); then the same number of epochs never stopped */
#define SMALL(...)                                                                                                   \
  cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dim", "E=12",      \
       "--dim", "H=16", "--batch", "4", "--threads", "1", "--quiet", __VA_ARGS__, NULL)
  r = SMALL("--epochs", "1", "--resume", path_in("kill.ckpt"), "--save", path_in("kill2.ckpt"));
  ok(&r, "resume");
  tu_free(&r);
  char epochs[16];
  snprintf(epochs, sizeof epochs, "%d", done + 1);
  r = SMALL("--epochs", epochs, "--save", path_in("never.ckpt"));
  ok(&r, "never stopped");
  tu_free(&r);
#undef SMALL
  size_t na = 0, nb = 1;
  char *a = tu_slurp(path_in("never.ckpt"), &na), *b = tu_slurp(path_in("kill2.ckpt"), &nb);
  ck_assert_msg(a && b && na == nb && !memcmp(a, b, na), "killed %ld graphs into epoch %d and resumed: not the same "
                "bytes", graphs, done + 1);
  free(a), free(b);
  /* refused before anything is written */
  static const char *const bad[] = {"0", "-2", "1e3", "0x10", "1.5", "2d", "0s", "1e9s", "3000h", "inf"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    r = TRAIN("--epochs", "1", "--save", path_in("every-bad.ckpt"), "--save-every", bad[i], NULL);
    ck_assert_msg(r.status == 1 && strstr(r.err, "--save-every: '") && strstr(r.err, "is not a count of minibatches"),
                  "%s: exit %d: %s", bad[i], r.status, r.err);
    tu_free(&r);
  }
  r = TRAIN("--epochs", "1", "--save-every", "10m", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "--save-every saves to --save CKPT, which is not given"), "%s", r.err);
  tu_free(&r);
  ck_assert(access(path_in("every-bad.ckpt"), F_OK) != 0);
  free(argv[2]), free(argv[6]), free(argv[18]);
}
END_TEST

/* --stream keeps a file's index in the cache (CAVS_CACHE/streams): a second run reads it
 * there instead of reading the file through, and trains the same bytes; an entry that is
 * damaged, or writable by others, is passed over with a warning (the file indexed again,
 * the same bytes); a file that changed is indexed again. */
static int stream_entries(void (*fn)(const char *path)) {
  char dir[4400];
  snprintf(dir, sizeof dir, "%s/streams", getenv("CAVS_CACHE"));
  DIR *d = opendir(dir);
  ck_assert_msg(d != NULL, "no %s", dir);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char p[4700];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (fn) fn(p);
    n++;
  }
  closedir(d);
  return n;
}
static void flip_byte(const char *p) {
  size_t n = 0;
  char *b = tu_slurp(p, &n);
  ck_assert(b && n > 100);
  b[n / 2] ^= 1;
  tu_write(p, b, n);
  free(b);
}
static void loosen(const char *p) { ck_assert_int_eq(chmod(p, 0666), 0); }
static void tighten(const char *p) { ck_assert_int_eq(chmod(p, 0600), 0); }

START_TEST(stream_index_cached) {
  gen_data();
  size_t nt = 0, nd = 0;
  char *t = tu_slurp(path_in("train.txt"), &nt), *dv = tu_slurp(path_in("dev.txt"), &nd);
  ck_assert(t && dv);
  tu_write(path_in("ctrain.txt"), t, nt), tu_write(path_in("cdev.txt"), dv, nd); /* (files no run indexed) */
  free(dv);
  int before = stream_entries(NULL);
#define CTRAIN(save)                                                                                                   \
  cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("ctrain.txt"), "--dev",               \
       path_in("cdev.txt"), "--dim", "E=12", "--dim", "H=16", "--batch", "32", "--threads", "1", "--epochs", "1",     \
       "--stream", "--save", path_in(save), NULL)
  RunResult r = CTRAIN("c1.ckpt");
  ok(&r, "indexed");
  ck_assert_msg(!strstr(r.out, "from the cache"), "%s", r.out);
  tu_free(&r);
  ck_assert_int_eq(stream_entries(NULL), before + 2);
  r = CTRAIN("c2.ckpt");
  ok(&r, "from the cache");
  ck_assert_msg(strstr(r.out, "streamed: the data's indexes from the cache"), "%s", r.out);
  tu_free(&r);
  same_bytes("c1.ckpt", "c2.ckpt", "the index from the cache trained otherwise");
  stream_entries(flip_byte);
  r = CTRAIN("c3.ckpt");
  ok(&r, "entries damaged");
  ck_assert_msg(strstr(r.err, "is not usable (damaged") && !strstr(r.out, "from the cache"), "%s%s", r.out, r.err);
  tu_free(&r);
  same_bytes("c1.ckpt", "c3.ckpt", "indexed again, trained otherwise");
  r = CTRAIN("c4.ckpt"); /* (written again) */
  ok(&r, "from the cache again");
  ck_assert_msg(strstr(r.out, "the data's indexes from the cache") && !*r.err, "%s%s", r.out, r.err);
  tu_free(&r);
  stream_entries(loosen);
  r = CTRAIN("c5.ckpt");
  ok(&r, "entries writable by others");
  ck_assert_msg(strstr(r.err, "writable by others") && !strstr(r.out, "from the cache"), "%s%s", r.out, r.err);
  tu_free(&r);
  same_bytes("c1.ckpt", "c5.ckpt", "indexed again past an unsafe cache, trained otherwise");
  stream_entries(tighten);
  /* the training file changed (a graph more): indexed again; the dev file's index, made
     from the same vocabulary, still comes from the cache */
  const char *nl = memchr(t, '\n', nt);
  ck_assert(nl != NULL);
  FILE *f = fopen(path_in("ctrain.txt"), "a");
  ck_assert(f != NULL);
  fwrite(t, 1, (size_t)(nl - t) + 1, f);
  fclose(f);
  free(t);
  r = CTRAIN("c6.ckpt");
  ok(&r, "a file changed");
  ck_assert_msg(strstr(r.out, "1501 training graphs") && strstr(r.out, "streamed: an index from the cache"), "%s",
                r.out);
  tu_free(&r);
#undef CTRAIN
}
END_TEST

/* --stream: the training file indexed and read back a minibatch at a time trains to the
 * bytes of the file loaded whole (the same graphs in the same order): the Tree-LSTM with a
 * dev set, two epochs or one and a resume, and the language model on text. A file whose
 * data is more than --max-memory fails to load and trains streamed; text-bptt, whose
 * chunks run across lines, is refused. */
START_TEST(stream_trains_as_loaded) {
  gen_data();
  RunResult r = TRAIN("--epochs", "2", "--quiet", "--save", path_in("ld.ckpt"), NULL);
  ok(&r, "loaded");
  tu_free(&r);
  r = TRAIN("--epochs", "2", "--quiet", "--stream", "--save", path_in("sd.ckpt"), NULL);
  ok(&r, "streamed");
  tu_free(&r);
  same_bytes("ld.ckpt", "sd.ckpt", "--stream trained otherwise than the file loaded");
  same_bytes("ld.ckpt.best", "sd.ckpt.best", "--stream's best is not the loaded run's");
  r = TRAIN("--epochs", "1", "--quiet", "--stream", "--save", path_in("s1.ckpt"), NULL);
  ok(&r, "streamed, epoch 1");
  tu_free(&r);
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dev",
           path_in("dev.txt"), "--threads", "1", "--epochs", "1", "--quiet", "--stream", "--resume", path_in("s1.ckpt"),
           "--save", path_in("s1.ckpt"), NULL);
  ok(&r, "streamed, resumed");
  tu_free(&r);
  same_bytes("ld.ckpt", "s1.ckpt", "--stream resumed trained otherwise");
  FILE *f = fopen(path_in("lines.txt"), "w");
  ck_assert(f != NULL);
  for (int i = 0; i < 400; i++) fprintf(f, "w%d a w%d b%s\n", i % 13, i % 7, i % 3 ? " c" : "");
  fclose(f);
  for (int streamed = 0; streamed < 2; streamed++) {
    r = cavs("train", model("lstm_lm.vf"), "--format", "text", "--train", path_in("lines.txt"), "--dim", "E=8", "--dim",
             "H=8", "--epochs", "2", "--batch", "16", "--threads", "1", "--quiet", "--save",
             path_in(streamed ? "lms.ckpt" : "lml.ckpt"), streamed ? "--stream" : NULL, NULL);
    ok(&r, "text");
    tu_free(&r);
  }
  same_bytes("lml.ckpt", "lms.ckpt", "--stream on text trained otherwise");
  /* 30000 trees of up to 31 vertices: more than 8 MiB loaded, a minibatch at a time streamed */
  r = cavs("gen", "toy", "--graphs", "30000", "--leaves", "16", "--words", "60", "--seed", "3", "-o", path_in("big.txt"),
           NULL);
  ok(&r, "gen big");
  tu_free(&r);
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("big.txt"), "--dim", "E=8",
           "--dim", "H=8", "--epochs", "1", "--threads", "1", "--quiet", "--max-memory", "8M", NULL);
  ck_assert_msg(r.status == 2 && strstr(r.err, "needs more than the memory limit of 8.00 MiB"), "%d %s", r.status,
                tu_tail(r.err, 1800));
  tu_free(&r);
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("big.txt"), "--dim", "E=8",
           "--dim", "H=8", "--epochs", "1", "--threads", "1", "--max-memory", "8M", "--stream", NULL);
  ok(&r, "streamed under --max-memory 8M");
  ck_assert_msg(strstr(r.out, "30000 training graphs ("), "%s", r.out);
  long big_streamed = r.maxrss;
  tu_free(&r);
  /* peak memory (the model built: no compiler in it): streamed, 20 times the graphs take
     the index's 24 bytes a graph more, where loaded they take the graphs themselves (here
     about 1 MiB against 11) */
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dim", "E=8",
           "--dim", "H=8", "--epochs", "1", "--threads", "1", "--max-memory", "8M", "--stream", NULL);
  ok(&r, "a small file streamed");
  long small_streamed = r.maxrss;
  tu_free(&r);
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("big.txt"), "--dim", "E=8",
           "--dim", "H=8", "--epochs", "1", "--threads", "1", NULL);
  ok(&r, "the big file loaded");
  long big_loaded = r.maxrss;
  tu_free(&r);
#if !defined(__SANITIZE_ADDRESS__) /* (AddressSanitizer keeps freed memory a while) */
  /* (a child's peak, ru_maxrss, counts the pages the test's process held when it forked:
     the kernel carries them over exec. Under valgrind those are some 100 MiB, more than
     any of these runs takes, so the three peaks read as one number and tell nothing:
     106276, 106268 and 106292 KiB on a Zen 5. valgrind preloads its libraries.) */
  const char *pre = getenv("LD_PRELOAD");
  if (!pre || !strstr(pre, "vgpreload"))
    ck_assert_msg(big_streamed - small_streamed < (big_loaded - small_streamed) / 3,
                  "streamed, peak memory grows with the file: %ld KiB for 30000 graphs, %ld for 1500 (loaded: %ld)",
                  big_streamed, small_streamed, big_loaded);
#endif
  r = cavs("train", model("lstm_lm.vf"), "--format", "text-bptt", "--train", path_in("lines.txt"), "--epochs", "1",
           "--stream", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "data format text-bptt cannot be streamed"), "%d %s", r.status,
                tu_tail(r.err, 1800));
  tu_free(&r);
  /* (the runs above streamed --dev too: their .best, the dev set's choice, is the loaded
     run's) eval --stream: the loaded evaluation's report, the counts by class included,
     in text and in JSON, but for its speed; predict refuses it */
  for (int json = 0; json < 2; json++) {
    RunResult a = cavs("eval", path_in("ld.ckpt"), "--data", path_in("dev.txt"), json ? "--json" : NULL, NULL);
    RunResult b = cavs("eval", path_in("ld.ckpt"), "--data", path_in("dev.txt"), "--stream", json ? "--json" : NULL, NULL);
    ok(&a, "eval"), ok(&b, "eval --stream");
    char *pa = json ? strstr(a.out, "\"graphs_per_s\"") : strstr(a.out, " graphs/s"),
         *pb = json ? strstr(b.out, "\"graphs_per_s\"") : strstr(b.out, " graphs/s");
    ck_assert(pa && pb);
    /* the report up to the speed (the number before it cut off too), and after it */
    char *sa = pa, *sb = pb;
    while (sa > a.out && sa[-1] != ' ' && sa[-1] != ',') sa--;
    while (sb > b.out && sb[-1] != ' ' && sb[-1] != ',') sb--;
    ck_assert_msg(sa - a.out == sb - b.out && !memcmp(a.out, b.out, (size_t)(sa - a.out)),
                  "eval --stream reports otherwise:\n%s\n%s", a.out, b.out);
    ck_assert_msg(!strcmp(strchr(pa, '\n') ? strchr(pa, '\n') : "", strchr(pb, '\n') ? strchr(pb, '\n') : ""),
                  "eval --stream: its counts differ:\n%s\n%s", a.out, b.out);
    ck_assert(json || strstr(a.out, "accuracy"));
    tu_free(&a), tu_free(&b);
  }
  r = cavs("predict", path_in("ld.ckpt"), "--data", path_in("dev.txt"), "--stream", NULL);
  ck_assert_msg(r.status != 0 && strstr(r.err, "--stream"), "%d %s", r.status, tu_tail(r.err, 600));
  tu_free(&r);
}
END_TEST

/* A language model trained on text-bptt:9 in 8 streams, with `vary` the --bptt-vary
 * (NULL: none) or, `reset`, each chunk from zeros, stopped by SIGINT inside an epoch and
 * resumed for one epoch into NAME2.ckpt (not told --bptt-vary or --bptt-state again: the
 * checkpoint keeps them), and the same run never interrupted into NAMEw.ckpt: the same
 * bytes. The epochs the stopped run had done. */
static int lm_stopped_and_resumed(const char *name, const char *vary, bool reset) {
  char txt[64], ckpt[64], again[64], whole[64], out[64];
  snprintf(txt, sizeof txt, "%s.txt", name);
  snprintf(ckpt, sizeof ckpt, "%s.ckpt", name);
  snprintf(again, sizeof again, "%s2.ckpt", name);
  snprintf(whole, sizeof whole, "%sw.ckpt", name);
  snprintf(out, sizeof out, "%s.out", name);
  FILE *f = fopen(path_in(txt), "w");
  ck_assert(f != NULL);
  for (int i = 0; i < 3000; i++) fprintf(f, "w%d a w%d b c%d\n", i % 11, i % 7, i % 5);
  fclose(f);
  char epochs[16] = "1000";
  /* (what each way of reading the chunks says before the first epoch) */
  const char *how = vary ? "--bptt-vary" : reset ? "--bptt-state" : NULL, *arg = vary ? vary : "reset";
  char *argv[] = {(char *)cavs_bin, "train", strdup(model("lstm_lm.vf")), "--format", "text-bptt:9", "--train",
                  strdup(path_in(txt)), "--dim", "E=8", "--dim", "H=8", "--batch", "8", "--threads", "1",
                  "--epochs", epochs, "--save", strdup(path_in(ckpt)), (char *)how, (char *)arg, NULL};
  int st = run_and_signal(argv, path_in(out), vary ? "cut afresh" : reset ? "parameters" : "state carried", 0.3, SIGINT);
  ck_assert_msg(st == 130, "exit %d", st);
  char *e = info_field(path_in(ckpt), "training");
  int done = -1;
  ck_assert(sscanf(e, "training %d epochs done", &done) == 1);
  free(e);
  ck_assert_msg(done >= 0 && done < 1000, "%d epochs done", done);
  RunResult r = cavs("train", model("lstm_lm.vf"), "--format", "text-bptt:9", "--train", path_in(txt), "--threads",
                     "1", "--epochs", "1", "--quiet", "--resume", path_in(ckpt), "--save", path_in(again), NULL);
  ok(&r, "resume");
  tu_free(&r);
  snprintf(epochs, sizeof epochs, "%d", done + 1);
  r = cavs("train", model("lstm_lm.vf"), "--format", "text-bptt:9", "--train", path_in(txt), "--dim", "E=8", "--dim",
           "H=8", "--batch", "8", "--threads", "1", "--epochs", epochs, "--quiet", "--save", path_in(whole), how, arg,
           NULL);
  ok(&r, "uninterrupted");
  tu_free(&r);
  same_bytes(whole, again, "the language model interrupted and resumed differs from the uninterrupted one");
  free(argv[2]);
  free(argv[6]);
  free(argv[18]);
  return done;
}

/* The same for a language model whose state is carried from chunk to chunk: the
 * checkpoint saved inside an epoch carries each stream's state (format 6), and the
 * resumed run goes on from it, to the bytes of a run never interrupted. */
START_TEST(sigint_resumes_carried_state_exactly) {
  lm_stopped_and_resumed("lmi", NULL, false);
  /* 8 streams (--batch) of c and h (2H): mid-epoch or at an epoch's end (no --dev, so
     nothing evaluated it away), the last minibatch's state */
  char *e = info_field(path_in("lmi.ckpt"), "carried");
  ck_assert_msg(strstr(e, "the state of 8 streams, 16 values each"), "%s", e);
  free(e);
  /* a checkpoint from inside an epoch goes on at its place in the epoch's order, which
     another chunk length, another batch (text-bptt's streams) or chunks shuffled
     (--bptt-state reset) move: refused, where the same format spelled otherwise is not;
     from an epoch's end (where the signal came between epochs) each goes on */
  RunResult r = cavs("info", path_in("lmi.ckpt"), NULL);
  ok(&r, "info");
  bool in = strstr(r.out, " graphs into epoch ") != NULL;
  tu_free(&r);
  const char *other[][4] = {{"text-bptt:10", "8", "on data of --format text-bptt:9", "carry"},
                            {"text-bptt:9", "4", "laid in streams for --batch 8", "carry"},
                            {"text-bptt:9", "8", "chunks laid in streams, the state carried: go on with --bptt-state carry",
                             "reset"},
                            {"text-bptt:09", "8", NULL, "carry"}};
  for (int k = 0; k < 4; k++) {
    r = cavs("train", model("lstm_lm.vf"), "--format", other[k][0], "--batch", other[k][1], "--train",
             path_in("lmi.txt"), "--threads", "1", "--epochs", "1", "--quiet", "--bptt-state", other[k][3], "--resume",
             path_in("lmi.ckpt"), NULL);
    if (in && other[k][2])
      ck_assert_msg(r.status == 1 && strstr(r.err, other[k][2]) && strstr(r.err, "saved inside epoch"), "%d %s",
                    r.status, tu_tail(r.err, 1800));
    else ok(&r, "resumed with another spelling of the format, or from an epoch's end");
    tu_free(&r);
  }
}
END_TEST

/* The same for chunks each from zeros, shuffled (--bptt-state reset): the checkpoint
 * keeps the reading (format 9), so that the resume goes on with it untold, and cavs eval
 * reads the data as the model was trained unless told otherwise. */
START_TEST(sigint_resumes_reset_chunks_exactly) {
  lm_stopped_and_resumed("lmr", NULL, true);
  char *e = info_field(path_in("lmr2.ckpt"), "chunks");
  ck_assert_msg(strstr(e, "shuffled, each from zeros (--bptt-state reset)"), "%s", e);
  free(e);
  double untold = ckpt_eval_loss(path_in("lmr2.ckpt"), path_in("lmr.txt"), NULL, "8", NULL),
         reset = ckpt_eval_loss(path_in("lmr2.ckpt"), path_in("lmr.txt"), NULL, "8", "reset"),
         carry = ckpt_eval_loss(path_in("lmr2.ckpt"), path_in("lmr.txt"), NULL, "8", "carry");
  ck_assert_msg(untold == reset && carry != reset, "eval untold %.17g, reset %.17g, carry %.17g", untold, reset, carry);
  /* a checkpoint of carried streams: eval carries untold */
  untold = ckpt_eval_loss(path_in("lmi2.ckpt"), path_in("lmi.txt"), NULL, "8", NULL);
  carry = ckpt_eval_loss(path_in("lmi2.ckpt"), path_in("lmi.txt"), NULL, "8", "carry");
  reset = ckpt_eval_loss(path_in("lmi2.ckpt"), path_in("lmi.txt"), NULL, "8", "reset");
  ck_assert_msg(untold == carry && carry != reset, "eval untold %.17g, carry %.17g, reset %.17g", untold, carry, reset);
}
END_TEST

/* --bptt-vary: the same, the chunks cut afresh each epoch; the checkpoint keeps the
 * deviation and the cut, drawn from the generator it keeps as the interrupted epoch
 * began, is the same. The same run in chunks of one length is another run. A checkpoint
 * that varies resumed with each chunk from zeros is refused, as is the option on chunks
 * not carried. */
START_TEST(sigint_resumes_varied_chunks_exactly) {
  int done = lm_stopped_and_resumed("lmv", "3", false);
  char *e = info_field(path_in("lmv.ckpt"), "chunks");
  ck_assert_msg(strstr(e, "deviation 3 (--bptt-vary)"), "%s", e);
  free(e);
  char epochs[16];
  snprintf(epochs, sizeof epochs, "%d", done + 1);
  RunResult r = cavs("train", model("lstm_lm.vf"), "--format", "text-bptt:9", "--train", path_in("lmv.txt"), "--dim",
                     "E=8", "--dim", "H=8", "--batch", "8", "--threads", "1", "--epochs", epochs, "--quiet", "--save",
                     path_in("lmvf.ckpt"), NULL);
  ok(&r, "chunks of one length");
  tu_free(&r);
  size_t na = 0, nb = 0;
  char *a = tu_slurp(path_in("lmvw.ckpt"), &na), *b = tu_slurp(path_in("lmvf.ckpt"), &nb);
  ck_assert_msg(na != nb || memcmp(a, b, na), "--bptt-vary 3 trained as chunks of one length");
  free(a);
  free(b);
  r = cavs("train", model("lstm_lm.vf"), "--format", "text-bptt:9", "--train", path_in("lmv.txt"), "--threads", "1",
           "--epochs", "1", "--quiet", "--bptt-state", "reset", "--resume", path_in("lmv.ckpt"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "--bptt-vary 3 (the checkpoint's): the chunks vary on text-bptt with the "
                                             "state carried (--bptt-state carry), not --bptt-state reset"),
                "%d %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  r = cavs("train", model("lstm_lm.vf"), "--format", "text", "--train", path_in("lmv.txt"), "--epochs", "1",
           "--bptt-vary", "2", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "--bptt-vary: the chunks vary on text-bptt with the state carried "
                                             "(--bptt-state carry), not format text"),
                "%d %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
}
END_TEST

/* bptt.c's cut, compiled in, on chains laid out as text-bptt loads them (50 chunks of 9
 * tokens and one of 4, back to back, two integer inputs a vertex): the streams partition
 * the tokens, each a contiguous run in order; every minibatch but the last holds one
 * chunk of every stream, all of the length drawn for it (a stream's last chunk may be
 * shorter); each chunk is a chain; the same generator cuts the same; and data that is
 * not chains back to back is refused. Then the draws: 0.95 around N, 0.05 around N/2. */
START_TEST(bptt_cut_partitions_the_stream) {
  enum { NG = 51, N = 9, NINT = 2 };
  long total = (NG - 1) * N + 4;
  int *child = malloc(sizeof(int) * (size_t)total), *type = calloc((size_t)total, sizeof(int)),
      *feat = malloc(sizeof(int) * NINT * (size_t)total);
  cavs_graph g[NG];
  const cavs_graph *gp[NG];
  for (long v = 0; v < total; v++) feat[v * NINT] = (int)v, feat[v * NINT + 1] = -1;
  for (int i = 0; i < NG; i++) {
    long first = (long)i * N;
    int n = i < NG - 1 ? N : 4;
    for (int k = 0; k < n; k++) child[first + k] = k - 1;
    g[i] = (cavs_graph){.n = n, .maxc = 1, .child = child + first, .type = type + first, .feat = feat + first * NINT,
                        .slots = 1};
    gp[i] = &g[i];
  }
  for (int batch = 1; batch <= 13; batch += 4) {
    BpttCut c = {0}, c2 = {0};
    uint64_t rng = 7, rng2 = 7;
    char why[256];
    ck_assert_int_eq(bptt_cut(&c, gp, NG, NINT, batch, 2.5, &rng, why, sizeof why), 0);
    ck_assert_int_eq(c.base, N);
    ck_assert_int_eq((c.n + batch - 1) / batch, c.nmb);
    long per = total / batch, extra = total % batch;
    for (int s = 0; s < batch; s++) {
      long next = s * per + (s < extra ? s : extra), end = next + per + (s < extra);
      for (int j = 0; j < c.nmb; j++) {
        ck_assert_msg(c.len[j] >= 5, "minibatch %d drawn at %d", j, c.len[j]);
        if (j < c.nmb - 1) ck_assert_int_eq(c.n - j * batch >= batch, 1);
        if (j * batch + s >= c.n || next >= end) continue;
        const cavs_graph *h = &c.g[j * batch + s];
        ck_assert_msg(h->feat[0] == next, "batch %d stream %d chunk %d starts at %d, not %ld", batch, s, j, h->feat[0],
                      next);
        ck_assert_int_eq(h->n, end - next < c.len[j] ? end - next : c.len[j]);
        for (int k = 0; k < h->n; k++) {
          ck_assert_int_eq(h->child[k], k - 1);
          ck_assert_int_eq(h->feat[k * NINT], next + k);
          ck_assert_ptr_eq(&h->type[k], type + next + k);
        }
        next += h->n;
      }
      ck_assert_msg(next == end, "batch %d stream %d: its tokens end at %ld, not %ld", batch, s, next, end);
    }
    ck_assert_int_eq(bptt_cut(&c2, gp, NG, NINT, batch, 2.5, &rng2, why, sizeof why), 0);
    ck_assert_int_eq(c2.n, c.n);
    ck_assert_int_eq(rng2, rng);
    for (int i = 0; i < c.n; i++) ck_assert(c2.g[i].n == c.g[i].n && c2.g[i].feat == c.g[i].feat);
    bptt_cut_free(&c);
    bptt_cut_free(&c2);
  }
  child[3 * N + 2] = 0; /* vertex 2 of chunk 3 points back past its parent */
  BpttCut c = {0};
  uint64_t rng = 7;
  char why[256];
  ck_assert_int_eq(bptt_cut(&c, gp, NG, NINT, 4, 2.5, &rng, why, sizeof why), -1);
  ck_assert_msg(strstr(why, "graph 3 of the data is not a chain"), "%s", why);
  child[3 * N + 2] = 1;
  g[5].feat += NINT; /* not where the chunk before ends */
  ck_assert_int_eq(bptt_cut(&c, gp, NG, NINT, 4, 2.5, &rng, why, sizeof why), -1);
  ck_assert_msg(strstr(why, "graph 5"), "%s", why);
  bptt_cut_free(&c);
  free(child);
  free(type);
  free(feat);
  /* 20000 draws around 35 with deviation 5, from one seed: how many came below 26 (0.95
     of the draws around 35, of which 3.6% fall there, and 0.05 around 17.5, of which
     95%: 1640, give or take 40) and the mean (0.95 * 35 + 0.05 * 17.5, less the
     truncation's half) */
  rng = 99;
  long half = 0;
  double sum = 0;
  for (int i = 0; i < 20000; i++) {
    int len = bptt_draw(&rng, 35, 5);
    ck_assert(len >= 5 && len <= BPTT_VARY_MAX);
    half += len < 26;
    sum += len;
  }
  ck_assert_msg(half > 1500 && half < 1780, "%ld of 20000 below 26", half);
  ck_assert_msg(sum / 20000 > 33.3 && sum / 20000 < 34, "mean %g", sum / 20000);
  /* short chunks: at least N itself */
  for (int i = 0; i < 100; i++) ck_assert_int_ge(bptt_draw(&rng, 3, 10), 3);
}
END_TEST

/* SIGKILL at any moment of `train --resume X --save X`, 50 times at moments drawn from
 * a fixed seed: X and X.best always load, epochs never go back, and what a killed save
 * leaves behind is gone after the next one. */
START_TEST(sigkill_never_tears_a_checkpoint) {
  gen_data();
  RunResult r = TRAIN("--epochs", "1", "--quiet", "--save", path_in("k.ckpt"), NULL);
  ok(&r, "first epoch");
  tu_free(&r);
  /* path_in's buffers are reused: the argument vector keeps copies */
  char *ck = strdup(path_in("k.ckpt"));
  char *argv[] = {(char *)cavs_bin, "train", strdup(model("treelstm.vf")), "--format", "ptb-tree", "--train",
                  strdup(path_in("train.txt")), "--dev", strdup(path_in("dev.txt")), "--threads", "1", "--epochs", "1000",
                  "--resume", ck, "--save", ck, NULL};
  uint64_t rng = 12345;
  int last = 1;
  for (int i = 0; i < 50; i++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    double delay = (double)(rng >> 40) / (double)(1ull << 24) * 0.25; /* 0 to 0.25 s into training */
    int st = run_and_signal(argv, path_in("k.out"), "model treelstm", delay, SIGKILL);
    ck_assert_msg(st == 128 + SIGKILL, "run %d: exit %d", i, st);
    char *e = info_field(path_in("k.ckpt"), "training");
    int done = -1;
    ck_assert(sscanf(e, "training %d epochs done", &done) == 1);
    free(e);
    ck_assert_msg(done >= last, "run %d: %d epochs done, %d before", i, done, last);
    last = done;
    r = cavs("info", path_in("k.ckpt.best"), NULL);
    ck_assert_msg(r.status == 0 || access(path_in("k.ckpt.best"), F_OK) != 0, "run %d: k.ckpt.best: %s", i, tu_tail(r.err, 1800));
    tu_free(&r);
  }
  fprintf(stderr, "sigkill: 50 kills, %d epochs reached\n", last);
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--threads", "1",
           "--epochs", "1", "--quiet", "--resume", path_in("k.ckpt"), "--save", path_in("k.ckpt"), NULL);
  ok(&r, "resume after the kills");
  tu_free(&r);
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "ls -a %s | grep -c 'k.ckpt.*cavs-tmp'", dir);
  FILE *p = popen(cmd, "r");
  int left = -1;
  ck_assert(p && fscanf(p, "%d", &left) == 1);
  pclose(p);
  ck_assert_msg(left <= 1, "%d temporary files left", left); /* .best's own may remain */
  free(ck);
  free(argv[2]);
  free(argv[6]);
  free(argv[8]);
}
END_TEST

/* A regression loss has no accuracy: none is printed, .best follows the dev loss; a
 * model with two losses reports each, and its accuracy is its classifier's. */
START_TEST(regression_and_two_losses) {
  FILE *f = fopen(path_in("reg.cgf"), "w");
  ck_assert_ptr_nonnull(f);
  for (int g = 0; g < 120; g++) {
    int a = g % 7, b = (g * 3) % 11;
    fprintf(f, "graph\n0 v ; w=%d t=%.3f y=%d\n1 v ; w=%d t=%.3f y=%d\n2 v 0 1 ; t=%.3f y=%d\nend\n", a,
            a / 10.0, a % 3, b, b / 10.0, b % 3, (a + b) / 20.0, (a + b) % 3);
  }
  fclose(f);
  const char *head = "dim H = 8; dim V = 12; dim C = 3;\ninput w : index[V]; input y : class[C]; input t : real[1];\n"
                     "param emb[V,H] init uniform(-0.5, 0.5); param W[H,H], Wo[H,1], Wc[H,C] init xavier;\n"
                     "pull { x = emb[w]; }\n"
                     "vertex v (children 2) { h = tanh(pull() + (gather(0) + gather(1)) @ W); scatter(h); push(h); }\n";
  char src[2048];
  snprintf(src, sizeof src, "model reg;\n%spush (h) { loss mse(h @ Wo, t); }\n", head);
  tu_write(path_in("reg.vf"), src, strlen(src));
  snprintf(src, sizeof src, "model both;\n%spush (h) { loss softmax_xent(h @ Wc, y); loss mse(h @ Wo, t); }\n", head);
  tu_write(path_in("both.vf"), src, strlen(src));
  RunResult r = cavs("train", path_in("reg.vf"), "--format", "cgf", "--train", path_in("reg.cgf"), "--dev",
                     path_in("reg.cgf"), "--epochs", "3", "--lr", "0.01", "--save", path_in("reg.ckpt"), "--log",
                     path_in("reg.log"), NULL);
  ok(&r, "train a regression");
  ck_assert_msg(strstr(r.out, "dev loss") && !strstr(r.out, "acc"), "%s", tu_tail(r.out, 1800));
  ck_assert_msg(strstr(r.out, "(best, saved)"), "the dev loss picks .best:\n%s", tu_tail(r.out, 1800));
  tu_free(&r);
  char *log = tu_slurp(path_in("reg.log"), NULL);
  ck_assert_msg(strstr(log, "\"dev_acc\": null") && strstr(log, "\"train_acc\": null"), "%s", log);
  free(log);
  ck_assert_int_eq(access(path_in("reg.ckpt.best"), F_OK), 0);
  r = cavs("eval", path_in("reg.ckpt.best"), "--data", path_in("reg.cgf"), NULL);
  ok(&r, "eval a regression");
  ck_assert_msg(strstr(r.out, "loss") && !strstr(r.out, "accuracy"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  /* a dev set without a label to score (a real input left out reads as 0, a target; a
     class as -1, none), by accuracy and by the classifier's loss: no metric, so no .best,
     no plateau's cut and no stop for --patience (its score of 0 had made the first epoch
     the best for good) */
  const char *nolab = "graph\n0 v ; w=1\n1 v ; w=2\n2 v 0 1\nend\n";
  tu_write(path_in("nolab.cgf"), nolab, strlen(nolab));
  snprintf(src, sizeof src, "model cls;\n%spush (h) { loss softmax_xent(h @ Wc, y); }\n", head);
  tu_write(path_in("cls.vf"), src, strlen(src));
  for (int k = 0; k < 2; k++) {
    r = cavs("train", path_in(k ? "cls.vf" : "both.vf"), "--format", "cgf", "--train", path_in("reg.cgf"), "--dev",
             path_in("nolab.cgf"), "--epochs", "3", "--schedule", "plateau", "--plateau-patience", "0", "--patience",
             "1", "--select", k ? "loss" : "all", "--save", path_in("nolab.ckpt"), NULL);
    ok(&r, "a dev set without a label");
    const char *says = "(no vertex of the dev set has a label to score: not a best)\n";
    const char *last = strstr(r.out, "epoch 3/3");
    ck_assert_msg(last && strstr(last, says) && !strstr(r.out, "(best") && !strstr(r.out, "lr cut"), "%s",
                  tu_tail(r.out, 1800));
    tu_free(&r);
    ck_assert_msg(access(path_in("nolab.ckpt.best"), F_OK) != 0, "a .best without a metric");
  }
  /* a dev loss that overflows ((3e38 Wt)^2 is not a float: the push block's values are
     not finite) is no best: the checkpoint and its .best had been replaced by files every
     reader refused; resumed, and a fresh run under the plateau schedule, whose best it
     had become too */
  const char *ovr = "model ovr; dim H = 8; dim V = 12; dim C = 3;\ninput w : index[V]; input y : class[C]; input t : real[1];\n"
                    "param emb[V,H] init uniform(-0.5, 0.5); param W[H,H], Wo[H,1], Wt[1,H] init xavier;\n"
                    "pull { x = emb[w]; }\n"
                    "vertex v (children 2) { h = tanh(pull() + (gather(0) + gather(1)) @ W); scatter(h);\n"
                    "  push(h + (t @ Wt) * (t @ Wt)); }\npush (h) { loss mse(h @ Wo, t); }\n";
  tu_write(path_in("ovr.vf"), ovr, strlen(ovr));
  const char *huge = "graph\n0 v ; w=1 t=3e38\n1 v ; w=2 t=0.1\n2 v 0 1 ; t=0.2\nend\n";
  tu_write(path_in("huge.cgf"), huge, strlen(huge));
  r = cavs("train", path_in("ovr.vf"), "--format", "cgf", "--train", path_in("reg.cgf"), "--dev", path_in("reg.cgf"),
           "--epochs", "2", "--save", path_in("ovr.ckpt"), "--quiet", NULL);
  ok(&r, "train before the dev loss overflows");
  tu_free(&r);
  size_t blen;
  char *best = tu_slurp(path_in("ovr.ckpt.best"), &blen);
  ck_assert_ptr_nonnull(best);
  r = cavs("train", path_in("ovr.vf"), "--format", "cgf", "--train", path_in("reg.cgf"), "--dev", path_in("huge.cgf"),
           "--epochs", "3", "--resume", path_in("ovr.ckpt"), "--save", path_in("ovr.ckpt"), NULL);
  ok(&r, "a dev loss that overflows");
  ck_assert_msg(strstr(r.out, "dev loss") && !strstr(r.out, "(best") &&
                    strstr(r.out, "(the dev metric is not finite: not a best)"),
                "%s", tu_tail(r.out, 1800));
  /* (inf - inf: a NaN with its sign bit set, which glibc prints "-nan") */
  ck_assert_msg(strstr(r.out, "dev loss nan ") && !strstr(r.out, "-nan"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  r = cavs("eval", path_in("ovr.ckpt"), "--data", path_in("huge.cgf"), NULL);
  ok(&r, "eval a loss that overflows");
  ck_assert_msg(strstr(r.out, "loss nan ") && !strstr(r.out, "-nan"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  size_t n;
  char *now = tu_slurp(path_in("ovr.ckpt.best"), &n);
  ck_assert_msg(now && n == blen && !memcmp(now, best, n), "the .best was replaced");
  free(now);
  free(best);
  r = cavs("train", path_in("ovr.vf"), "--format", "cgf", "--train", path_in("reg.cgf"), "--dev", path_in("huge.cgf"),
           "--epochs", "2", "--schedule", "plateau", "--save", path_in("huge.ckpt"), NULL);
  ok(&r, "a dev loss that overflows, plateau");
  tu_free(&r);
  ck_assert_int_eq(access(path_in("huge.ckpt.best"), F_OK), -1);
  const char *read_back[] = {"ovr.ckpt", "ovr.ckpt.best", "huge.ckpt"};
  for (int i = 0; i < 3; i++) {
    r = cavs("info", path_in(read_back[i]), NULL);
    ok(&r, read_back[i]);
    tu_free(&r);
  }
  r = cavs("train", path_in("both.vf"), "--format", "cgf", "--train", path_in("reg.cgf"), "--dev", path_in("reg.cgf"),
           "--epochs", "2", "--lr", "0.01", "--save", path_in("both.ckpt"), NULL);
  ok(&r, "train two losses");
  ck_assert_msg(strstr(r.out, "(softmax_xent ") && strstr(r.out, ", mse "), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
  r = cavs("eval", path_in("both.ckpt"), "--data", path_in("reg.cgf"), NULL);
  ok(&r, "eval two losses");
  double xent_acc = -1, acc = -2;
  const char *p = strstr(r.out, "(softmax_xent ");
  ck_assert_ptr_nonnull(p);
  ck_assert(sscanf(p, "(softmax_xent %*f acc %lf", &xent_acc) == 1);
  ck_assert(sscanf(strstr(r.out, "accuracy"), "accuracy %lf", &acc) == 1);
  /* the regression's rows do not dilute the classifier's accuracy */
  ck_assert_msg(fabs(acc - xent_acc) < 1e-9, "accuracy %.4f, the classifier's %.4f\n%s", acc, xent_acc, tu_tail(r.out, 1800));
  ck_assert_msg(strstr(r.out, "(all 360 vertices)"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
}
END_TEST

/* A model built by hand into a shared object trains too; its checkpoint then needs
 * --model to be evaluated (it carries no source). */
START_TEST(prebuilt_library) {
  gen_data();
  char src[4400], inc[4400], cmd[16384];
  snprintf(src, sizeof src, "%s/generated/treelstm.c", top);
  snprintf(inc, sizeof inc, "-I%s/runtime", top);
  snprintf(cmd, sizeof cmd, "%s -std=c11 -O2 -fPIC -shared %s %s -o %s", tu_env("CC", "cc"), inc, src, path_in("treelstm.so"));
  char *sh[] = {"/bin/sh", "-c", cmd, NULL};
  RunResult r = tu_run(NULL, sh, 120);
  ok(&r, "cc");
  tu_free(&r);
  r = cavs("train", path_in("treelstm.so"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dim", "E=8",
           "--dim", "H=8", "--epochs", "1", "--quiet", "--save", path_in("so.ckpt"), NULL);
  ok(&r, "train from a .so");
  tu_free(&r);
  r = cavs("eval", path_in("so.ckpt"), "--data", path_in("dev.txt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "--model"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  r = cavs("eval", path_in("so.ckpt"), "--data", path_in("dev.txt"), "--model", path_in("treelstm.so"), NULL);
  ok(&r, "eval with --model");
  ck_assert_msg(strstr(r.out, "accuracy"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
}
END_TEST

/* cavs build: cavsc's two files and the shared object, which loads and makes a model;
 * --emit-only writes what cavsc writes and nothing more; a bad model, option or flag
 * leaves nothing behind. */
/* The cuda target: cavsc's MODEL.cu compiled and linked by nvcc into an object that
 * loads here (no GPU is needed to load it) and says its target, which the cpu backend
 * refuses; an unknown target is an error. Without nvcc only the error is checked. */
START_TEST(build_for_cuda) {
  RunResult r = cavs("build", model("treelstm.vf"), "--target", "tpu", "-o", path_in("tpu"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "--target: 'tpu' is not c or cuda"), "%s", tu_tail(r.err, 600));
  tu_free(&r);
  ck_assert_int_eq(entries(path_in("tpu")), -1);
  if (!*tu_env("NVCC", "")) return; /* configure found no nvcc */
  char out[4400], so[4500];
  snprintf(out, sizeof out, "%s", path_in("cuda"));
  r = cavs("build", model("treelstm.vf"), "--target", "cuda", "-o", out, NULL);
  ok(&r, "build --target cuda");
  snprintf(so, sizeof so, "%s/treelstm.so\n", out);
  ck_assert_str_eq(r.out, so);
  tu_free(&r);
  char cu[4500];
  snprintf(cu, sizeof cu, "%s/treelstm.cu", out);
  ck_assert_int_eq(access(cu, F_OK), 0);
  ck_assert_int_eq(entries(out), 3);
  so[strlen(so) - 1] = 0;
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(h != NULL, "%s", dlerror());
  const cavs_desc *d = dlsym(h, "treelstm_desc");
  ck_assert_ptr_nonnull(d);
  ck_assert_int_eq(d->target, CAVS_TARGET_CUDA);
  long dims[CAVS_MAX_DIMS] = {0};
  cavs_dims_default(d, dims);
  for (int i = 0; i < d->ndims; i++)
    if (dims[i] <= 0) dims[i] = 10;
  char err[512];
  ck_assert_ptr_null(cavs_model_new(d, dims, err, sizeof err));
  ck_assert_msg(strstr(err, "compiled for the cuda target, which the cpu backend cannot run"), "%s", err);
  /* nvcc is given the GPUs $CAVS_NVCC_ARCH names in place of configure's: one it does not
     know fails the build (exit 2, nvcc's message naming it), and the build before is kept */
  char *old_gpu[] = {"CAVS_NVCC_ARCH=-gencode=arch=compute_10,code=sm_10", NULL};
  r = cavs_env(old_gpu, "build", model("treelstm.vf"), "--target", "cuda", "-o", out, NULL);
  ck_assert_msg(r.status == 2 && strstr(r.err, "compute_10"), "status %d: %s", r.status, tu_tail(r.err, 900));
  tu_free(&r);
  ck_assert_int_eq(access(so, F_OK), 0);
}
END_TEST

/* A program that fails, for the runs where $CAVS_TEST_FAIL says so, the flush (fsync) of
 * a file whose name ends in .so, or a rename onto one (EIO, EACCES); that kills the
 * process at that rename ("kill": a build killed midway, the header and the C renamed;
 * "killh": at a renameat onto a header, a cavsc killed between its code's and its header's);
 * or that fails that rename where the process does not hold the flock of the directory
 * it renames into ("lock": ENOLCK, found by trying the lock from a descriptor of its
 * own); or that fails the flush of any directory ("dirsync", EIO): preloaded into cavs
 * or cavsc. */
static const char *fail_shim =
    "#define _GNU_SOURCE\n#include <dlfcn.h>\n#include <errno.h>\n#include <fcntl.h>\n#include <signal.h>\n"
    "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <sys/file.h>\n#include <sys/stat.h>\n#include <unistd.h>\n"
    "static int ends(const char *p, const char *x) { size_t n = strlen(p), k = strlen(x); return n > k && !strcmp(p + n - k, x); }\n"
    "static int so(const char *p) { return ends(p, \".so\"); }\n"
    "static int on(const char *what) { const char *w = getenv(\"CAVS_TEST_FAIL\"); return w && !strcmp(w, what); }\n"
    "int fsync(int fd) {\n  char l[64], p[4096];\n  struct stat st;\n"
    "  if (on(\"dirsync\") && !fstat(fd, &st) && S_ISDIR(st.st_mode)) { errno = EIO; return -1; }\n  snprintf(l, sizeof l, \"/proc/self/fd/%d\", fd);\n"
    "  ssize_t n = readlink(l, p, sizeof p - 1);\n  if (n > 0 && on(\"fsync\")) {\n    p[n] = 0;\n"
    "    if (so(p)) { errno = EIO; return -1; }\n  }\n"
    "  return ((int (*)(int))dlsym(RTLD_NEXT, \"fsync\"))(fd);\n}\n"
    "int rename(const char *a, const char *b) {\n  if (on(\"rename\") && so(b)) { errno = EACCES; return -1; }\n"
    "  if (on(\"kill\") && so(b)) raise(SIGKILL);\n"
    "  if (on(\"lock\") && so(b)) {\n    char d[4096];\n    snprintf(d, sizeof d, \"%s\", b);\n"
    "    *strrchr(d, '/') = 0;\n    int fd = open(d, O_RDONLY | O_DIRECTORY), unheld = fd >= 0 && !flock(fd, LOCK_EX | LOCK_NB);\n"
    "    if (fd >= 0) close(fd);\n    if (unheld) { errno = ENOLCK; return -1; }\n  }\n"
    "  return ((int (*)(const char *, const char *))dlsym(RTLD_NEXT, \"rename\"))(a, b);\n}\n"
    "int renameat(int fa, const char *a, int fb, const char *b) {\n  if (on(\"killh\") && ends(b, \".h\")) raise(SIGKILL);\n"
    "  return ((int (*)(int, const char *, int, const char *))dlsym(RTLD_NEXT, \"renameat\"))(fa, a, fb, b);\n}\n";

/* The three files of `cavs build -o DIR` in `got` equal those in `want` (NAME.h, .c, .so) */
static void same_outputs(char *const got[3], char *const want[3], size_t const wlen[3], const char *when) {
  for (int i = 0; i < 3; i++) {
    size_t n;
    char *now = tu_slurp(got[i], &n);
    ck_assert_msg(now && n == wlen[i] && !memcmp(now, want[i], n), "%s: %s is not the earlier build's", when, got[i]);
    free(now);
  }
}

/* cavs build -o replaces its outputs as one set: where the flush of the new object fails,
 * or its rename (the last of the three), the earlier build's NAME.h, NAME.c and NAME.so
 * are all still there, unchanged (the two renamed before it put back), the failure said,
 * nothing else left in the directory. A build killed at that rename leaves a new header
 * beside the old object, and the next build into the directory puts the earlier set back
 * before anything else, even one of a model with a mistake. Then a build that succeeds
 * replaces all three, holding the directory's lock while it renames. What the user
 * writes after a kill is not undone; a journal that cannot be read is kept, with the
 * earlier files beside it.
 * (Through a preloaded library: not in a checked build, whose sanitizers or valgrind
 * come first in the process.) */
START_TEST(build_outputs_replaced_as_a_set) {
  if (tu_checked_build()) return;
  tu_write(path_in("shim.c"), fail_shim, strlen(fail_shim));
  char cmd[16384], pre[4500];
  snprintf(cmd, sizeof cmd, "%s -shared -fPIC -o %s %s -ldl", tu_env("CC", "cc"), path_in("shim.so"), path_in("shim.c"));
  char *sh[] = {"/bin/sh", "-c", cmd, NULL};
  RunResult r = tu_run(NULL, sh, 120);
  ok(&r, "cc of the shim");
  tu_free(&r);
  snprintf(pre, sizeof pre, "LD_PRELOAD=%s", path_in("shim.so"));
  r = cavs("build", model("treegru.vf"), "--precision", "double", "-o", path_in("set"), NULL);
  ok(&r, "the first build");
  tu_free(&r);
  char *files[3], *want[3];
  size_t wlen[3];
  const char *ext[] = {"h", "c", "so"};
  for (int i = 0; i < 3; i++) {
    char name[64];
    snprintf(name, sizeof name, "set/treegru.%s", ext[i]);
    files[i] = strdup(path_in(name));
    want[i] = tu_slurp(files[i], &wlen[i]);
    ck_assert_ptr_nonnull(want[i]);
  }
  const char *fail[][2] = {{"CAVS_TEST_FAIL=fsync", "flushing it to disk: "},
                           {"CAVS_TEST_FAIL=rename", "treegru.so': "}};
  for (int f = 0; f < 2; f++) {
    char *env[] = {pre, (char *)fail[f][0], NULL};
    r = cavs_env(env, "build", model("treegru.vf"), "--precision", "float", "-o", path_in("set"), NULL);
    ck_assert_msg(r.status == 1 && strstr(r.err, fail[f][1]) && strstr(r.err, strerror(f ? EACCES : EIO)),
                  "%s: exit %d: %s", fail[f][0], r.status, tu_tail(r.err, 1800));
    tu_free(&r);
    same_outputs(files, want, wlen, fail[f][0]);
    ck_assert_int_eq(entries(path_in("set")), 3);
  }
  char *killed[] = {pre, "CAVS_TEST_FAIL=kill", NULL};
  r = cavs_env(killed, "build", model("treegru.vf"), "--precision", "float", "-o", path_in("set"), NULL);
  ck_assert_msg(r.status == 128 + SIGKILL, "the killed build: exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  char *now = tu_slurp(files[0], NULL);
  ck_assert_msg(now && strcmp(now, want[0]), "the killed build had not renamed its header yet");
  free(now);
  const char *wrong = "model m;\ndim H = 4\n";
  tu_write(path_in("wrong.vf"), wrong, strlen(wrong));
  r = cavs("build", path_in("wrong.vf"), "-o", path_in("set"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "wrong.vf:2:10: error:"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  same_outputs(files, want, wlen, "after a build killed midway");
  ck_assert_int_eq(entries(path_in("set")), 3);
  char *env[] = {pre, "CAVS_TEST_FAIL=lock", NULL}; /* (failing nothing where the lock is held) */
  r = cavs_env(env, "build", model("treegru.vf"), "--precision", "float", "-o", path_in("set"), NULL);
  ok(&r, "the build after them");
  tu_free(&r);
  for (int i = 0; i < 2; i++) {
    char *now = tu_slurp(files[i], NULL);
    ck_assert_msg(now && strcmp(now, want[i]) && strstr(now, i ? "float" : "treegru"), "%s was not replaced", files[i]);
    free(now);
  }
  /* what is put in the directory after a build is killed is not undone: the killed
     build's header, written over by the user, stays theirs; its code, which nobody
     touched, goes back to the earlier build's */
  size_t clen;
  char *float_c = tu_slurp(files[1], &clen);
  ck_assert_ptr_nonnull(float_c);
  r = cavs_env(killed, "build", model("treegru.vf"), "--precision", "double", "-o", path_in("set"), NULL);
  ck_assert_int_eq(r.status, 128 + SIGKILL);
  tu_free(&r);
  const char *mine = "/* the user's own header */\n";
  tu_write(files[0], mine, strlen(mine));
  r = cavs("build", path_in("wrong.vf"), "-o", path_in("set"), NULL);
  ck_assert_int_eq(r.status, 1);
  tu_free(&r);
  now = tu_slurp(files[0], NULL);
  ck_assert_msg(now && !strcmp(now, mine), "the user's header was undone: %s", now ? now : "(gone)");
  free(now);
  now = tu_slurp(files[1], NULL);
  ck_assert_msg(now && strlen(now) == clen && !memcmp(now, float_c, clen), "the killed build's code was not undone");
  free(now);
  free(float_c);
  ck_assert_int_eq(entries(path_in("set")), 3);
  /* a journal that cannot be read: the killed build's directory, which holds the earlier
     files, is kept, with a warning (the user's header taken away first: no build
     replaces a file cavsc did not write) */
  ck_assert_int_eq(unlink(files[0]), 0);
  r = cavs_env(killed, "build", model("treegru.vf"), "--precision", "double", "-o", path_in("set"), NULL);
  ck_assert_int_eq(r.status, 128 + SIGKILL);
  tu_free(&r);
  DIR *dir = opendir(path_in("set"));
  ck_assert_ptr_nonnull(dir);
  char journal[4400] = "";
  for (struct dirent *de; (de = readdir(dir));)
    if (!strncmp(de->d_name, ".build", 6)) snprintf(journal, sizeof journal, "%s/%s/undo", path_in("set"), de->d_name);
  closedir(dir);
  ck_assert_msg(*journal && access(journal, F_OK) == 0, "no journal in the killed build's directory");
  tu_write(journal, "1 2 3\n", strlen("1 2 3\n"));
  r = cavs("build", path_in("wrong.vf"), "-o", path_in("set"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "journal") && strstr(r.err, "could not be carried out"), "%s",
                tu_tail(r.err, 1800));
  tu_free(&r);
  ck_assert_msg(entries(path_in("set")) == 4 && access(journal, F_OK) == 0, "the killed build's directory is gone");
  /* cavsc's own pair: where the code's rename is done but its directory's flush fails,
     the earlier code is put back beside the earlier header (the failure said) */
  char *by_cavsc[] = {(char *)tu_env("CAVSC", "./cavsc"), "--precision=double", "-o", path_in("pair"),
                      model("treegru.vf"), NULL};
  r = tu_run(NULL, by_cavsc, 60);
  ok(&r, "cavsc");
  tu_free(&r);
  for (int i = 0; i < 2; i++) {
    char name[64];
    snprintf(name, sizeof name, "pair/treegru.%s", ext[i]);
    free(files[i]), free(want[i]);
    files[i] = strdup(path_in(name));
    want[i] = tu_slurp(files[i], &wlen[i]);
    ck_assert_ptr_nonnull(want[i]);
  }
  by_cavsc[1] = "--precision=float";
  setenv("LD_PRELOAD", pre + strlen("LD_PRELOAD="), 1);
  setenv("CAVS_TEST_FAIL", "dirsync", 1);
  r = tu_run(NULL, by_cavsc, 60);
  unsetenv("LD_PRELOAD");
  unsetenv("CAVS_TEST_FAIL");
  ck_assert_msg(r.status == 1 && strstr(r.err, "directory could not be flushed to disk"), "cavsc, dirsync: exit %d: %s",
                r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  for (int i = 0; i < 2; i++) {
    size_t n;
    char *now = tu_slurp(files[i], &n);
    ck_assert_msg(now && n == wlen[i] && !memcmp(now, want[i], n), "%s is not the earlier pair's", files[i]);
    free(now);
  }
  ck_assert_int_eq(entries(path_in("pair")), 2);
  /* a cavsc killed between its two renames leaves its code beside the earlier header
     (another model's: two parameters' indices swapped), which it then refuses to be
     compiled with, until the next cavsc writes the pair again */
  size_t tlen;
  char *text = tu_slurp(model("treegru.vf"), &tlen), *at = text ? strstr(text, "bz[H], br[H], bn[H]") : NULL;
  ck_assert_ptr_nonnull(at);
  memcpy(at, "bn[H], br[H], bz[H]", strlen("bn[H], br[H], bz[H]"));
  tu_write(path_in("swapped.vf"), text, tlen);
  free(text);
  by_cavsc[4] = path_in("swapped.vf");
  setenv("LD_PRELOAD", pre + strlen("LD_PRELOAD="), 1);
  setenv("CAVS_TEST_FAIL", "killh", 1);
  r = tu_run(NULL, by_cavsc, 60);
  unsetenv("LD_PRELOAD");
  unsetenv("CAVS_TEST_FAIL");
  ck_assert_msg(r.status == 128 + SIGKILL, "cavsc, killh: exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  now = tu_slurp(files[0], NULL);
  ck_assert_msg(now && !strcmp(now, want[0]), "the killed cavsc renamed its header");
  free(now);
  snprintf(cmd, sizeof cmd, "%s -std=c11 -fsyntax-only -I%s/runtime %s", tu_env("CC", "cc"), top, files[1]);
  r = tu_run(NULL, sh, 120);
  ck_assert_msg(r.status != 0 && strstr(r.err, "treegru.h is not the header written with this file: run cavsc again"),
                "the mixed pair: exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  r = tu_run(NULL, by_cavsc, 60);
  ok(&r, "cavsc after the kill");
  tu_free(&r);
  r = tu_run(NULL, sh, 120);
  ok(&r, "cc of the pair written again");
  tu_free(&r);
  for (int i = 0; i < 3; i++) free(files[i]), free(want[i]);
}
END_TEST

/* tests/failio.c, built for the runs below: the shim that fails one call of a process's
   file output (its N-th write, fprintf, ...) with ENOSPC, and that traces the calls it
   counts into failio.out, so that a test picks the call it fails by what it is, not by
   a count that the next change of the code moves. NULL in a checked build, whose
   sanitizers or valgrind come first in the process. */
static const char *failio(void) {
  static char pre[4500];
  if (tu_checked_build()) return NULL;
  if (!pre[0]) {
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "%s -shared -fPIC -o %s %s/tests/failio.c -ldl", tu_env("CC", "cc"), path_in("failio.so"),
             top);
    char *sh[] = {"/bin/sh", "-c", cmd, NULL};
    RunResult r = tu_run(NULL, sh, 120);
    ok(&r, "cc of tests/failio.c");
    tu_free(&r);
    snprintf(pre, sizeof pre, "LD_PRELOAD=%s", path_in("failio.so"));
  }
  return pre;
}

/* The number of the k-th call named `call` after call number `after` (k from 1) whose
   file, as failio.out traced it, ends in `suffix` (on) or does not (!on); 0 where there
   is none. */
static long traced_file(const char *call, const char *suffix, bool on, int k, long after) {
  char *text = tu_slurp(path_in("failio.out"), NULL);
  ck_assert_ptr_nonnull(text);
  long found = 0;
  size_t ls = strlen(suffix);
  for (char *line = strtok(text, "\n"); line && !found; line = strtok(NULL, "\n")) {
    char name[64], file[4096] = "";
    long n;
    if (sscanf(line, "%*s %*d %ld %63s %4095s", &n, name, file) < 2 || n <= after || strcmp(name, call)) continue;
    size_t lf = strlen(file);
    bool ends = lf >= ls && !strcmp(file + lf - ls, suffix);
    if (ends == on && --k == 0) found = n;
  }
  free(text);
  return found;
}

/* The number of the k-th call named `call` among those failio.out traced (k from 1); 0
   where there is none. The trace is removed. */
static long traced(const char *call, int k) {
  long found = traced_file(call, "", true, k, 0);
  unlink(path_in("failio.out"));
  return found;
}

/* A disk that fills as cavs writes: the log keeps whole records only (a line the disk
 * took half of is cut off again; jansson's json_dumpf, which wrote a record in pieces,
 * let a failed piece by, and the run went on with a record with a hole in the log; a
 * cut that fails too is said, where the torn line had been left unsaid), a
 * plot's data file written in part is not drawn (it was, the failure unseen, and the
 * picture replaced), and the compile cache's failed write says what file and why (it
 * said "cannot write into" its build directory). Each exits non-zero (the cache's
 * failure, as its others, 2) with the file and the error. */
START_TEST(a_full_disk_tears_nothing) {
  const char *pre = failio();
  if (!pre) return;
  RunResult r = cavs("gen", "toy", "--graphs", "100", "--leaves", "8", "--seed", "3", "-o", path_in("fd.txt"), NULL);
  ok(&r, "gen");
  tu_free(&r);
  char out[4500];
  snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
  /* the log: its second line half written, then the disk full (the model built first:
     the log's lines are the run's only writes) */
#define FD_TRAIN(env)                                                                                             \
  cavs_env(env, "train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("fd.txt"), "--dim", "E=8", \
           "--dim", "H=8", "--batch", "25", "--epochs", "3", "--log", path_in("fd.log"), "--quiet", NULL)
  r = FD_TRAIN(NULL);
  ok(&r, "the model built");
  tu_free(&r);
  char *log_fault[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=write", "FAILIO_SHORT=1", "FAILIO_N=2", out, NULL};
  r = FD_TRAIN(log_fault);
  ck_assert_msg(r.status == 1 && strstr(r.err, "cannot write the log") && strstr(r.err, strerror(ENOSPC)),
                "the log's write failed: exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  size_t n = 0;
  char *text = tu_slurp(path_in("fd.log"), &n);
  ck_assert_msg(text && n > 0 && text[n - 1] == '\n', "the log's last line is torn: %s", text ? text : "(none)");
  free(text);
  json_t *recs = log_records(path_in("fd.log"));
  ck_assert_int_eq(json_array_size(recs), 1);
  json_decref(recs);
  unlink(path_in("failio.out"));
  /* and the part written not cut off again (the truncation fails too, a second fault):
     the torn line said, where it had been left unsaid */
  char *cut_fault[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=write,trunc", "FAILIO_SHORT=1", "FAILIO_N=2",
                       "FAILIO_ALSO=3", out, NULL};
  r = FD_TRAIN(cut_fault);
  ck_assert_msg(r.status == 1 && strstr(r.err, "cannot write the log") && strstr(r.err, "could not be cut off") &&
                    strstr(r.err, strerror(ENOSPC)),
                "the log's write and its cut failed: exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  unlink(path_in("failio.out"));
  /* a plot: the second line of its data file fails */
  const char *three = "{\"epoch\": 1, \"train_loss\": 1.5}\n{\"epoch\": 2, \"train_loss\": 1.25}\n"
                      "{\"epoch\": 3, \"train_loss\": 1.125}\n";
  tu_write(path_in("fd-plot.log"), three, strlen(three));
  tu_write(path_in("fd.png"), "the user's", 10);
  char *trace[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=stdio", "FAILIO_TRACE=1", out, NULL};
  r = cavs_env(trace, "plot", path_in("fd-plot.log"), "-o", path_in("fd-traced.png"), NULL);
  tu_free(&r);
  char nth[64];
  snprintf(nth, sizeof nth, "FAILIO_N=%ld", traced("vfprintf", 2));
  ck_assert_str_ne(nth, "FAILIO_N=0");
  char *plot_fault[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=stdio", nth, out, NULL};
  r = cavs_env(plot_fault, "plot", path_in("fd-plot.log"), "-o", path_in("fd.png"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "cannot write in") && strstr(r.err, strerror(ENOSPC)),
                "the plot's data file failed: exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  text = tu_slurp(path_in("fd.png"), &n);
  ck_assert_msg(text && n == 10 && !memcmp(text, "the user's", 10), "the picture was replaced");
  free(text);
  /* the compile cache: the entry's meta file fails (a fresh cache each run) */
  char cache1[4500], cache2[4500];
  snprintf(cache1, sizeof cache1, "CAVS_CACHE=%s", path_in("fd-cache1"));
  snprintf(cache2, sizeof cache2, "CAVS_CACHE=%s", path_in("fd-cache2"));
  char *cache_trace[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=stdio", "FAILIO_TRACE=1", out, cache1, NULL};
  r = FD_TRAIN(cache_trace);
  ok(&r, "the traced build");
  tu_free(&r);
  snprintf(nth, sizeof nth, "FAILIO_N=%ld", traced("vfprintf", 1));
  ck_assert_str_ne(nth, "FAILIO_N=0");
  char *cache_fault[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=stdio", nth, out, cache2, NULL};
  r = FD_TRAIN(cache_fault);
  ck_assert_msg(r.status == 2 && strstr(r.err, "/meta': ") && strstr(r.err, strerror(ENOSPC)),
                "the cache's meta file failed: exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
#undef FD_TRAIN
}
END_TEST

/* An epoch's --log record follows its checkpoint's save, and only a saved epoch has one:
 * a log the disk refuses (its second record) stops the run with exit 1 and that epoch in
 * the checkpoint (the record went first, and its failure lost the epoch), the record
 * kept in the checkpoint, which the resumed run writes (the log lacked it for good), its
 * own checkpoint then the bytes of a run nothing stopped (no record kept), and a save
 * that fails (the second epoch's checkpoint) leaves no record of its epoch, so that the
 * run resumed logs each epoch once (it logged the failed one twice). A resumed run that
 * cannot cut off its log's torn last line stops before it trains. */
START_TEST(a_log_refused_keeps_the_epoch) {
  const char *pre = failio();
  if (!pre) return;
  RunResult r = cavs("gen", "toy", "--graphs", "100", "--leaves", "8", "--seed", "3", "-o", path_in("lk.txt"), NULL);
  ok(&r, "gen");
  tu_free(&r);
  char out[4500], ck[4500], lg[4500];
  snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
  snprintf(ck, sizeof ck, "%s", path_in("lk.ckpt"));
  snprintf(lg, sizeof lg, "%s", path_in("lk.log"));
#define LK_TRAIN(env, epochs, ...)                                                                               \
  cavs_env(env, "train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("lk.txt"), "--dim", "E=8", \
           "--dim", "H=8", "--batch", "25", "--epochs", epochs, "--save", ck, "--log", lg, "--quiet", __VA_ARGS__)
  r = LK_TRAIN(NULL, "3", NULL);
  ok(&r, "the model built");
  tu_free(&r);
  unlink(ck), unlink(lg), unlink(path_in("failio.out"));
  char *trace[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=write", "FAILIO_TRACE=1", out, NULL};
  r = LK_TRAIN(trace, "3", NULL);
  ok(&r, "the traced run");
  tu_free(&r);
  json_t *whole = log_records(lg); /* (the records and checkpoint of a run that nothing stopped) */
  ck_assert_int_eq(json_array_size(whole), 3);
  size_t nwhole = 0;
  char *whole_ck = tu_slurp(ck, &nwhole);
  long log2 = traced_file("write", "/lk.log", true, 2, 0), log1 = traced_file("write", "/lk.log", true, 1, 0);
  long save2 = traced_file("write", "/lk.log", false, 1, log1);
  unlink(path_in("failio.out"));
  ck_assert_msg(log1 > 0 && log2 > save2 && save2 > log1, "the trace: log %ld, %ld, the save between %ld", log1, log2,
                save2);
  /* the log's second record refused: the second epoch saved */
  char nth[64];
  snprintf(nth, sizeof nth, "FAILIO_N=%ld", log2);
  /* the disk stays full: the checkpoint saved again with the record fails too, the
     record said lost, the epoch saved as it was */
  unlink(ck), unlink(lg);
  char *full_fault[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=write", nth, "FAILIO_STICKY=1", out, NULL};
  r = LK_TRAIN(full_fault, "3", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "cannot write the log") && strstr(r.err, "its record is lost"),
                "the log's write and the save after failed: exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  r = cavs("info", ck, NULL);
  ok(&r, "info");
  ck_assert_msg(strstr(r.out, "2 epochs done") && !strstr(r.out, "log record"), "%s", tu_tail(r.out, 1200));
  tu_free(&r);
  /* resumed, the run says what the log lacks, which nothing can give it back */
  r = LK_TRAIN(NULL, "1", "--resume", ck, NULL);
  ok(&r, "the run resumed after the record lost");
  ck_assert_msg(strstr(r.err, "has no record of epoch 2, which the checkpoint holds"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  unlink(ck), unlink(lg);
  char *log_fault[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=write", nth, out, NULL};
  r = LK_TRAIN(log_fault, "3", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "cannot write the log") && strstr(r.err, strerror(ENOSPC)) &&
                    strstr(r.err, "epoch 2 is saved, its record kept in"),
                "the log's write failed: exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  r = cavs("info", ck, NULL);
  ok(&r, "info");
  ck_assert_msg(strstr(r.out, "2 epochs done") && strstr(r.out, "the --log line of epoch 2"),
                "the second epoch or its record is not saved: %s", tu_tail(r.out, 1200));
  tu_free(&r);
  json_t *recs = log_records(lg);
  ck_assert_int_eq(json_array_size(recs), 1);
  json_decref(recs);
  /* the checkpoint kept the refused record: the resumed run writes it before its own
     (the log lacked epoch 2 for good), the same as the run that nothing stopped wrote */
  r = LK_TRAIN(NULL, "1", "--resume", ck, NULL);
  ok(&r, "the run resumed after the refused record");
  ck_assert_msg(strstr(r.err, "epoch 2's record, which the run before did not write, written from the checkpoint"),
                "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  recs = log_records(lg);
  ck_assert_int_eq(json_array_size(recs), 3);
  for (size_t i = 0; i < 3; i++) {
    json_t *got = json_array_get(recs, i), *want = json_array_get(whole, i);
    ck_assert_int_eq(json_integer_value(json_object_get(got, "epoch")), (long)i + 1);
    ck_assert_msg(json_equal(json_object_get(got, "train_loss"), json_object_get(want, "train_loss")) &&
                      json_equal(json_object_get(got, "grad_norm_max"), json_object_get(want, "grad_norm_max")),
                  "epoch %zu's record differs from the whole run's", i + 1);
  }
  json_decref(recs);
  json_decref(whole);
  /* and the checkpoint it wrote, the bytes of the run nothing stopped: no record in it */
  size_t nres = 0;
  char *res_ck = tu_slurp(ck, &nres);
  ck_assert_msg(whole_ck && res_ck && nres == nwhole && !memcmp(res_ck, whole_ck, nres),
                "the resumed run's checkpoint differs from the run nothing stopped");
  free(whole_ck), free(res_ck);
  /* a log that has the epoch: nothing added */
  r = LK_TRAIN(NULL, "1", "--resume", ck, NULL);
  ok(&r, "the run resumed after a whole log");
  ck_assert_msg(!strstr(r.err, "from the checkpoint"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  recs = log_records(lg);
  ck_assert_int_eq(json_array_size(recs), 4);
  json_decref(recs);
  /* the second epoch's save refused: no record of it, and the resumed run logs 2 and 3 */
  snprintf(nth, sizeof nth, "FAILIO_N=%ld", save2);
  unlink(ck), unlink(lg), unlink(path_in("failio.out"));
  char *save_fault[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=write", nth, out, NULL};
  r = LK_TRAIN(save_fault, "3", NULL);
  ck_assert_msg(r.status != 0 && strstr(r.err, strerror(ENOSPC)), "the save failed: exit %d: %s", r.status,
                tu_tail(r.err, 1800));
  tu_free(&r);
  r = LK_TRAIN(NULL, "2", "--resume", ck, NULL);
  ok(&r, "the resumed run");
  tu_free(&r);
  recs = log_records(lg);
  ck_assert_int_eq(json_array_size(recs), 3);
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(recs, (size_t)i), "epoch")), i + 1);
  json_decref(recs);
  /* a resumed run whose log ends in a torn line it cannot cut off (the truncation
     refused) stops before it trains, the log as it was: it went on, and its first
     record joined the torn line, a line that is not JSON */
  FILE *torn = fopen(lg, "a");
  ck_assert(torn && fputs("{\"epoch\": 4, \"train_lo", torn) >= 0 && fclose(torn) == 0);
  size_t n0 = 0, n1 = 0;
  char *was = tu_slurp(lg, &n0);
  char *cut_fault[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=trunc", "FAILIO_N=1", out, NULL};
  r = LK_TRAIN(cut_fault, "1", "--resume", ck, NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "cannot be cut off") && strstr(r.err, strerror(ENOSPC)),
                "the torn line's cut failed: exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  unlink(path_in("failio.out"));
  char *now = tu_slurp(lg, &n1);
  ck_assert_msg(was && now && n1 == n0 && !memcmp(was, now, n0), "the log changed");
  free(was);
  free(now);
#undef LK_TRAIN
}
END_TEST

/* The calls the last run counted, from the last "PROG PID calls=K" in failio.out
   (removed) */
static long failio_calls(void) {
  char *text = tu_slurp(path_in("failio.out"), NULL);
  ck_assert_ptr_nonnull(text);
  long k = 0;
  for (char *at = strstr(text, " calls="); at; at = strstr(at + 1, " calls=")) k = atol(at + 7);
  free(text);
  unlink(path_in("failio.out"));
  return k;
}

/* One run with its N-th allocation failed: it either did its work (0: what failed was
   harmless; `whole` checks what it wrote) or said it ran out of memory, in one line
   ("out of memory", status 2; or a file it could not open or write and why, status 1);
   never a crash, another status or another message (a damaged file) */
static void out_of_memory_said(char *const argv[], long n, bool (*whole)(void)) {
  char out[4500], nth[64];
  snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
  snprintf(nth, sizeof nth, "FAILIO_N=%ld", n);
  const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  char name[64];
  snprintf(name, sizeof name, "FAILIO_PROG=%s", prog);
  char *env[] = {(char *)failio(), name, "FAILIO_CALLS=malloc", nth, out, NULL};
  RunResult r = run_env(env, argv, 120);
  const char *nl = strchr(r.err, '\n');
  /* (cavs: 2, as cavs(1) says of memory, where a file's failure is 1; cavsc has no status of its own for it) */
  bool said = (r.status == 2 || (r.status == 1 && strcmp(prog, "cavs"))) &&
              (strstr(r.err, "out of memory") || strstr(r.err, strerror(ENOMEM))) && nl && !nl[1];
  ck_assert_msg((r.status == 0 && whole()) || said, "%s with allocation %ld failed: exit %d: %s", prog, n, r.status,
                tu_tail(r.err, 1800));
  tu_free(&r);
  unlink(path_in("failio.out"));
}

static bool info_whole(void) { return true; }

static char *oom_c, *oom_h; /* cavsc's treelstm.c and .h, from a run with memory */
static bool cavsc_whole(void) {
  char *c = tu_slurp(path_in("oom-out/treelstm.c"), NULL), *h = tu_slurp(path_in("oom-out/treelstm.h"), NULL);
  bool same = c && h && !strcmp(c, oom_c) && !strcmp(h, oom_h);
  free(c);
  free(h);
  return same;
}

/* the log's records, each whole (an object of the first's keys); -1 where one is not */
static long log_whole_records(void) {
  json_t *recs = log_records(path_in("oom.log")); /* (each line an object) */
  long n = (long)json_array_size(recs);
  for (size_t i = 0; i < json_array_size(recs); i++)
    if (json_object_size(json_array_get(recs, i)) != json_object_size(json_array_get(recs, 0))) n = -1;
  json_decref(recs);
  return n;
}

/* Memory running out (tests/failio.c failing one allocation, every one of a run in
 * turn): cavs info said a checkpoint was damaged where a string of its did not fit
 * (exit 1), and crashed where its vocabulary did not (cavs_ckpt_vocab went on with
 * none); cavsc crashed or wrote a model with a hole and exited 0 (open_memstream's
 * failed growth is not an error glibc reports; passes used blocks unchecked); a --log
 * record lost a key and the run went on (jansson 2.14's dump lets a key's failed write
 * by: the text is now read back). Each now exits 2 with "out of memory". */
/* A file the cavs command writes whole or not at all (afile.c), each allocation of a
 * `cavs gen -o` and the last 80 of a `cavs export` failed in turn: the file whole, or
 * "out of memory" (status 2) and no file. afile.c's failures left errno as its cleanup
 * left it, and gen and export exited 1, as for a disk's failure. */
static char *written_path, *written_bytes; /* the file, and what the run with memory wrote there */
static size_t written_len;
static bool written_whole(void) {
  size_t n = 0;
  char *now = tu_slurp(written_path, &n);
  bool same = now && n == written_len && !memcmp(now, written_bytes, n);
  free(now);
  return same;
}

/* argv's allocations from its `from_end`-th last (0: all) failed in turn; it writes out */
static void writes_out_of_memory(char *const argv[], const char *out, long from_end) {
  char fo[4500];
  snprintf(fo, sizeof fo, "FAILIO_OUT=%s", path_in("failio.out"));
  written_path = strdup(out);
  unlink(out);
  char *count[] = {(char *)failio(), "FAILIO_PROG=cavs", "FAILIO_CALLS=malloc", fo, NULL};
  RunResult r = run_env(count, argv, 60);
  ok(&r, argv[1]);
  tu_free(&r);
  written_bytes = tu_slurp(out, &written_len);
  ck_assert_ptr_nonnull(written_bytes);
  long n = failio_calls();
  ck_assert_int_gt(n, from_end);
  for (long k = from_end ? n - from_end : 1; k <= n; k++) {
    unlink(out);
    out_of_memory_said(argv, k, written_whole);
    ck_assert_msg(written_whole() || access(out, F_OK) != 0, "%s with allocation %ld failed left a part", argv[1], k);
  }
  free(written_bytes);
  free(written_path);
}

START_TEST(a_file_written_out_of_memory_is_said) {
  if (!failio()) return;
  char data[4400], ck[4400], npz[4400];
  snprintf(data, sizeof data, "%s", path_in("wo.txt"));
  snprintf(ck, sizeof ck, "%s", path_in("wo.ck"));
  snprintf(npz, sizeof npz, "%s", path_in("wo.npz"));
  char *gen[] = {(char *)cavs_bin, "gen", "toy", "--graphs", "20", "--leaves", "8", "--seed", "3", "-o", data, NULL};
  writes_out_of_memory(gen, data, 0);
  gen_data();
  RunResult r = TRAIN("--epochs", "1", "--save", ck, "--quiet", NULL);
  ok(&r, "train");
  tu_free(&r);
  char *export[] = {(char *)cavs_bin, "export", ck, "-o", npz, NULL};
  writes_out_of_memory(export, npz, 80);
}
END_TEST

/* The compile cache's entry is on the disk before its rename publishes it: its object,
 * its record and its directory flushed, in that order, before the rename (they were not:
 * a crash after it left an entry of empty files, which a load refused by its hash and
 * rebuilt). A flush the disk refuses publishes nothing and says which file (status 2). */
START_TEST(a_cache_entry_flushed_before_it_is_published) {
  const char *pre = failio();
  if (!pre) return;
  char data[4400], out[4500], cache1[4500], cache2[4500], nth[64];
  snprintf(data, sizeof data, "%s", path_in("cf.txt"));
  RunResult r = cavs("gen", "toy", "--graphs", "20", "--leaves", "8", "--seed", "3", "-o", data, NULL);
  ok(&r, "gen");
  tu_free(&r);
  snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
  snprintf(cache1, sizeof cache1, "CAVS_CACHE=%s", path_in("cf-cache1"));
  snprintf(cache2, sizeof cache2, "CAVS_CACHE=%s", path_in("cf-cache2"));
#define CF_TRAIN(env)                                                                                           \
  cavs_env(env, "train", model("treelstm.vf"), "--format", "ptb-tree", "--train", data, "--dim", "E=8", "--dim", \
           "H=8", "--epochs", "1", "--quiet", NULL)
  unlink(path_in("failio.out"));
  char *trace[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=sync,rename", "FAILIO_TRACE=1", out, cache1, NULL};
  r = CF_TRAIN(trace);
  ok(&r, "the traced build");
  tu_free(&r);
  long so = traced_file("fsync", "/model.so", true, 1, 0), meta = traced_file("fsync", "/meta", true, 1, so);
  long dir = meta ? traced_file("fsync", "", true, 1, meta) : 0, put = traced_file("rename", "", true, 1, meta);
  char *trail = tu_slurp(path_in("failio.out"), NULL);
  ck_assert_msg(so && meta && dir == meta + 1 && put == dir + 1 && strstr(trail, ".build.cavs-tmp-"),
                "the object's flush %ld, the record's %ld, the directory's %ld, the rename %ld:\n%s", so, meta, dir,
                put, trail);
  free(trail);
  /* the object's flush refused: no entry, the file named */
  snprintf(nth, sizeof nth, "FAILIO_N=%ld", so);
  char *fault[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=sync,rename", "FAILIO_ERR=EIO", nth, out, cache2,
                   NULL};
  r = CF_TRAIN(fault);
  ck_assert_msg(r.status == 2 && strstr(r.err, "/model.so': ") && strstr(r.err, strerror(EIO)),
                "the object's flush failed: exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  DIR *d = opendir(path_in("cf-cache2"));
  ck_assert_ptr_nonnull(d);
  for (struct dirent *e; (e = readdir(d));)
    ck_assert_msg(!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, "streams"),
                  "left in the cache: %s", e->d_name);
  closedir(d);
#undef CF_TRAIN
}
END_TEST

/* cavs plot with each of its allocations failed in turn: the picture drawn, or "out of
 * memory" (status 2) and no picture. jansson's parser takes a failed allocation for bad
 * text: the log was said to be "not JSON" (status 1). gnuplot is a script that draws. */
static bool plot_drawn(void) { return file_holds(path_in("m.png"), "drawn"); }

START_TEST(a_plot_out_of_memory_is_said) {
  if (!failio()) return;
  const char *log = "{\"epoch\": 1, \"optimizer\": \"adam\", \"lr\": 0.001, \"train_loss\": 0.69314718055994529, "
                    "\"losses\": [0.5, 0.25], \"dev_acc\": null, \"time\": \"2026-12-07T11:51:27Z\"}\n"
                    "{\"epoch\": 2, \"optimizer\": \"adam\", \"lr\": 0.001, \"train_loss\": 0.42, \"losses\": [0.3, "
                    "0.12], \"dev_acc\": 0.75, \"time\": \"2026-12-07T11:51:28Z\"}\n";
  char lg[4400], png[4400], out[4500], path[9000];
  snprintf(lg, sizeof lg, "%s", path_in("m.log"));
  snprintf(png, sizeof png, "%s", path_in("m.png"));
  snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
  tu_write(lg, log, strlen(log));
  fake_gnuplot("mdraws", "printf drawn > \"$(dirname \"$1\")/out.png\"");
  char *old_path = strdup(getenv("PATH"));
  snprintf(path, sizeof path, "%s:%s", path_in("mdraws"), old_path);
  setenv("PATH", path, 1);
  char *plot[] = {(char *)cavs_bin, "plot", lg, "-o", png, NULL};
  char *count[] = {(char *)failio(), "FAILIO_PROG=cavs", "FAILIO_CALLS=malloc", out, NULL};
  RunResult r = run_env(count, plot, 60);
  ok(&r, "plot");
  tu_free(&r);
  ck_assert(plot_drawn());
  long n = failio_calls();
  ck_assert_int_gt(n, 30);
  for (long k = 1; k <= n; k++) {
    unlink(png);
    out_of_memory_said(plot, k, plot_drawn);
    ck_assert_msg(plot_drawn() || access(png, F_OK) != 0, "plot with allocation %ld failed left a picture", k);
  }
  setenv("PATH", old_path, 1);
  free(old_path);
}
END_TEST

/* A resumed run whose log ends in a whole record without its line's end, each
 * allocation from the log's opening to the line's end failed in turn: the record is kept
 * (ended, or left as it was where the run stops), never cut off. jansson's parse, which
 * told a whole record from a torn one, allocated, and took a failed allocation for a
 * syntax error: the record was cut off as torn. */
START_TEST(a_whole_record_kept_as_memory_runs_out) {
  if (!failio()) return;
  char data[4400], ck[4400], ck2[4400], log[4400], out[4500], tl[4400];
  snprintf(data, sizeof data, "%s", path_in("wr.txt"));
  snprintf(ck, sizeof ck, "%s", path_in("wr.ck"));
  snprintf(ck2, sizeof ck2, "%s", path_in("wr2.ck"));
  snprintf(log, sizeof log, "%s", path_in("wr.log"));
  snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
  snprintf(tl, sizeof tl, "%s", model("treelstm.vf"));
  RunResult r = cavs("gen", "toy", "--graphs", "100", "--leaves", "8", "--seed", "3", "-o", data, NULL);
  ok(&r, "gen");
  tu_free(&r);
  char *first[] = {(char *)cavs_bin, "train", tl, "--format", "ptb-tree", "--train", data, "--dim", "E=8", "--dim",
                   "H=8", "--batch", "25", "--epochs", "2", "--threads", "1", "--save", ck, "--log", log, "--quiet", NULL};
  r = run_env(NULL, first, 120);
  ok(&r, "2 epochs");
  tu_free(&r);
  size_t n = 0;
  char *kept = tu_slurp(log, &n);
  ck_assert(kept && n > 2 && kept[n - 1] == '\n' && kept[n - 2] == '}');
  kept[--n] = 0; /* (killed between the record and its line's end) */
  char *resume[] = {(char *)cavs_bin, "train", tl, "--format", "ptb-tree", "--train", data, "--resume", ck, "--epochs",
                    "1", "--threads", "1", "--save", ck2, "--log", log, "--quiet", NULL};
  /* the calls numbered: allocations, the log's opening and its stream's writes */
  char *trace[] = {(char *)failio(), "FAILIO_PROG=cavs", "FAILIO_CALLS=malloc,open,stdio", "FAILIO_TRACE=1", out,
                   "OPENBLAS_NUM_THREADS=1", NULL};
  tu_write(log, kept, n);
  r = run_env(trace, resume, 120);
  ok(&r, "the traced resume");
  tu_free(&r);
  long opened = traced_file("fopen", "", true, 1, 0), ended = traced_file("fputc", "", true, 1, opened);
  unlink(path_in("failio.out"));
  ck_assert_msg(opened > 0 && ended > opened, "the log's opening (%ld) and line's end (%ld)", opened, ended);
  for (long k = opened; k <= ended + 1; k++) {
    char nth[64];
    snprintf(nth, sizeof nth, "FAILIO_N=%ld", k);
    char *env[] = {(char *)failio(), "FAILIO_PROG=cavs", "FAILIO_CALLS=malloc,open,stdio", nth, out,
                   "OPENBLAS_NUM_THREADS=1", NULL};
    tu_write(log, kept, n);
    unlink(ck2);
    r = run_env(env, resume, 120);
    size_t m = 0;
    char *now = tu_slurp(log, &m);
    ck_assert_msg(now && m >= n && !memcmp(now, kept, n), "call %ld failed (exit %d): the log's last record was cut: %s",
                  k, r.status, tu_tail(r.err, 1800));
    /* (a run that went on: the record's line ended, and the epoch's record after it) */
    ck_assert_msg(r.status != 0 || (m > n + 1 && now[n] == '\n' && now[m - 1] == '\n'), "call %ld: the log: %s", k,
                  now + n);
    ck_assert_msg(r.status == 0 || strstr(r.err, log), "call %ld failed: exit %d: %s", k, r.status, tu_tail(r.err, 1800));
    free(now);
    tu_free(&r);
    unlink(path_in("failio.out"));
  }
  free(kept);
}
END_TEST

/* memory_running_out_is_said's checkpoint: none, or one cavs info reads */
static bool ckpt_whole_or_none(void) {
  if (access(path_in("oom.ck"), F_OK)) return true;
  RunResult r = cavs("info", path_in("oom.ck"), NULL);
  bool whole = r.status == 0;
  tu_free(&r);
  return whole;
}

START_TEST(memory_running_out_is_said) {
  if (!failio()) return;
  unlink(path_in("failio.out"));
  /* (the paths copied: path_in's buffers are reused) */
  char out[4500], data[4400], ck[4400], log[4400], outdir[4400], tl[4400];
  snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
  snprintf(data, sizeof data, "%s", path_in("oom.txt"));
  snprintf(ck, sizeof ck, "%s", path_in("oom.ck"));
  snprintf(log, sizeof log, "%s", path_in("oom.log"));
  snprintf(outdir, sizeof outdir, "%s", path_in("oom-out"));
  snprintf(tl, sizeof tl, "%s", model("treelstm.vf"));
  RunResult r = cavs("gen", "toy", "--graphs", "100", "--leaves", "8", "--seed", "3", "-o", data, NULL);
  ok(&r, "gen");
  tu_free(&r);
  char *train[] = {(char *)cavs_bin, "train", tl, "--format", "ptb-tree", "--train",
                   data, "--dim", "E=8", "--dim", "H=8", "--batch", "25", "--epochs", "3",
                   "--save", ck, "--log", log, "--quiet", NULL};
  r = run_env(NULL, train, 300);
  ok(&r, "the model built");
  tu_free(&r);
  /* cavs info, every allocation */
  char *info[] = {(char *)cavs_bin, "info", ck, NULL};
  char *count[] = {(char *)failio(), "FAILIO_PROG=cavs", "FAILIO_CALLS=malloc", out, NULL};
  r = run_env(count, info, 60);
  ok(&r, "info");
  tu_free(&r);
  long n = failio_calls();
  ck_assert_int_gt(n, 20);
  for (long k = 1; k <= n; k++) out_of_memory_said(info, k, info_whole);
  /* cavsc, every allocation */
  char *cavsc[] = {(char *)tu_env("CAVSC", "./cavsc"), "-o", outdir, tl, NULL};
  r = run_env(NULL, cavsc, 60);
  ok(&r, "cavsc");
  tu_free(&r);
  oom_c = tu_slurp(path_in("oom-out/treelstm.c"), NULL);
  oom_h = tu_slurp(path_in("oom-out/treelstm.h"), NULL);
  ck_assert(oom_c && oom_h);
  char *cavsc_count[] = {(char *)failio(), "FAILIO_PROG=cavsc", "FAILIO_CALLS=malloc", out, NULL};
  r = run_env(cavsc_count, cavsc, 60);
  ok(&r, "cavsc counted");
  tu_free(&r);
  n = failio_calls();
  ck_assert_int_gt(n, 50);
  for (long k = 1; k <= n; k++) {
    unlink(path_in("oom-out/treelstm.c"));
    unlink(path_in("oom-out/treelstm.h"));
    out_of_memory_said(cavsc, k, cavsc_whole);
    ck_assert_msg(cavsc_whole() || entries(path_in("oom-out")) <= 0, "cavsc with allocation %ld failed left a file", k);
  }
  free(oom_c);
  free(oom_h);
  /* a checkpoint's save, the last allocations of a run of one epoch: exit 2 (it was 1,
     "cannot write", as for a disk's failure), the checkpoint whole or none */
  char *save_only[] = {(char *)cavs_bin, "train", tl, "--format", "ptb-tree", "--train", data, "--dim", "E=8", "--dim",
                       "H=8", "--batch", "25", "--epochs", "1", "--threads", "1", "--save", ck, "--quiet", NULL};
  char *count1[] = {(char *)failio(), "FAILIO_PROG=cavs", "FAILIO_CALLS=malloc", out, "OPENBLAS_NUM_THREADS=1", NULL};
  unlink(ck);
  r = run_env(count1, save_only, 120);
  ok(&r, "the counted save");
  tu_free(&r);
  n = failio_calls();
  ck_assert_int_gt(n, 60);
  for (long k = n - 60; k <= n; k++) {
    unlink(ck);
    out_of_memory_said(save_only, k, ckpt_whole_or_none);
    ck_assert_msg(ckpt_whole_or_none(), "a save with allocation %ld failed left a damaged checkpoint", k);
  }
  /* the log: the allocations from its first record's write to its third's, which make
     the second and the third (one thread, OpenBLAS's too: the same allocations run to
     run) */
  char *log_only[] = {(char *)cavs_bin, "train", tl, "--format", "ptb-tree", "--train", data, "--dim", "E=8", "--dim",
                      "H=8", "--batch", "25", "--epochs", "3", "--threads", "1", "--log", log, "--quiet", NULL};
  char *trace[] = {(char *)failio(),         "FAILIO_PROG=cavs", "FAILIO_CALLS=malloc,write", "FAILIO_TRACE=1", out,
                   "OPENBLAS_NUM_THREADS=1", NULL};
  unlink(log); /* (as each run below begins) */
  r = run_env(trace, log_only, 120);
  ok(&r, "the traced training");
  tu_free(&r);
  char *text = tu_slurp(path_in("failio.out"), NULL);
  ck_assert_ptr_nonnull(text);
  long first = traced("write", 1);
  tu_write(path_in("failio.out"), text, strlen(text));
  long second = traced("write", 2);
  tu_write(path_in("failio.out"), text, strlen(text));
  free(text);
  long third = traced("write", 3);
  ck_assert_msg(first > 0 && second > first && third > second, "the log's writes: %ld, %ld, %ld", first, second, third);
  for (long k = first + 1; k < third; k++) {
    if (k == second) continue; /* (the disk's failure: a_full_disk_tears_nothing) */
    char nth[64];
    snprintf(nth, sizeof nth, "FAILIO_N=%ld", k);
    char *env[] = {(char *)failio(), "FAILIO_PROG=cavs", "FAILIO_CALLS=malloc,write", nth, out, "OPENBLAS_NUM_THREADS=1",
                   NULL};
    unlink(log);
    r = run_env(env, log_only, 120);
    const char *nl = strchr(r.err, '\n');
    bool said = r.status == 2 && strstr(r.err, "out of memory") && nl && !nl[1];
    long whole = log_whole_records();
    ck_assert_msg((r.status == 0 && whole == 3) || (said && whole >= 0 && whole < 3),
                  "the log with call %ld failed: exit %d, %ld whole records: %s", k, r.status, whole,
                  tu_tail(r.err, 1800));
    tu_free(&r);
    unlink(path_in("failio.out"));
  }
}
END_TEST

/* The tests of the best epoch's saves: a toy treebank as both training and dev set (its
   loss falls from epoch to epoch, each the best), and a run of `epochs` over it saved to
   `save` (in the test's directory), with `resume` (or NULL) and env as cavs_env's. */
static RunResult best_train(char *const env[], const char *data, const char *epochs, const char *save,
                            const char *resume, bool quiet) {
  char train[4400], ck[4400], from[4400];
  snprintf(train, sizeof train, "%s", path_in(data));
  snprintf(ck, sizeof ck, "%s", path_in(save));
  snprintf(from, sizeof from, "%s", resume ? path_in(resume) : "");
  char *argv[40] = {(char *)cavs_bin, "train", (char *)model("treelstm.vf"), "--format", "ptb-tree", "--train", train,
                    "--dev", train, "--select", "loss", "--dim", "E=8", "--dim", "H=8", "--batch", "25", "--epochs",
                    (char *)epochs, "--threads", "1", "--save", ck};
  int n = 0;
  while (argv[n]) n++; /* (the rest of the array is zeros) */
  if (quiet) argv[n++] = "--quiet";
  if (resume) argv[n++] = "--resume", argv[n++] = from;
  argv[n] = NULL;
  return run_env(env, argv, 300);
}

/* The data, and the whole run of two epochs saved to `whole` */
static void best_whole(const char *data, const char *seed, const char *whole) {
  RunResult r = cavs("gen", "toy", "--graphs", "50", "--leaves", "8", "--seed", seed, "-o", path_in(data), NULL);
  ok(&r, "gen");
  tu_free(&r);
  r = best_train(NULL, data, "2", whole, NULL, false);
  ok(&r, "the run whole");
  ck_assert_msg(strstr(r.out, "(best, saved)"), "%s", tu_tail(r.out, 1800));
  tu_free(&r);
}

/* The "best dev" fields of a checkpoint and its .best name epochs `at` and `best_at` */
static void best_epochs(const char *ck, int at, int best_at) {
  char best[4500], want[32], want_best[32];
  snprintf(best, sizeof best, "%s.best", path_in(ck));
  snprintf(want, sizeof want, "epoch %d,", at);
  snprintf(want_best, sizeof want_best, "epoch %d,", best_at);
  char *in_ck = info_field(path_in(ck), "best dev"), *in_best = info_field(best, "best dev");
  ck_assert_msg(strstr(in_ck, want) && strstr(in_best, want_best),
                "not %s and %s: the checkpoint's best %s; its .best's %s", want, want_best, in_ck, in_best);
  free(in_ck);
  free(in_best);
}

/* A run stopped inside an epoch and resumed reports that epoch as a run never stopped
 * does: its line and --log record count the whole epoch, to the bit (the checkpoint keeps
 * the totals so far: train.c, totals_text). The stop is made deterministic: the fifth
 * save's rename refused (--save-every 3 with minibatches of 10: the fourth, 120 graphs
 * into the first epoch, stays on disk). A mixture of experts' model, whose record has
 * its experts' shares, counted over the whole epoch too. */
START_TEST(an_epoch_resumed_counts_it_whole) {
  const char *pre = failio();
  if (!pre) return;
  RunResult r = cavs("gen", "toy", "--graphs", "400", "--leaves", "8", "--seed", "3", "-o", path_in("rw.txt"), NULL);
  ok(&r, "gen");
  tu_free(&r);
  char ck[4500], lg[4500];
  snprintf(ck, sizeof ck, "%s", path_in("rw.ckpt"));
  snprintf(lg, sizeof lg, "%s", path_in("rw.log"));
#define RW_TRAIN(env, epochs, ...)                                                                                   \
  cavs_env(env, "train", model("moe_tree.vf"), "--format", "ptb-tree", "--train", path_in("rw.txt"), "--dim", "E=6",  \
           "--dim", "H=8", "--dim", "F=4", "--batch", "10", "--threads", "1", "--epochs", epochs, "--save", ck,       \
           "--log", lg, "--quiet", __VA_ARGS__)
  r = RW_TRAIN(NULL, "2", NULL);
  ok(&r, "the whole run");
  tu_free(&r);
  json_t *whole = log_records(lg);
  ck_assert_int_eq(json_array_size(whole), 2);
  unlink(ck), unlink(lg);
  char *fault[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=rename", "FAILIO_N=5", NULL};
  r = RW_TRAIN(fault, "2", "--save-every", "3", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "cannot write"), "the fifth save refused: exit %d: %s", r.status,
                tu_tail(r.err, 1800));
  tu_free(&r);
  r = cavs("info", ck, NULL);
  ok(&r, "info");
  ck_assert_msg(strstr(r.out, "saved 120 graphs into epoch 1") && strstr(r.out, "epoch 1's so far"), "%s",
                tu_tail(r.out, 1200));
  tu_free(&r);
  r = RW_TRAIN(NULL, "2", "--resume", ck, NULL);
  ok(&r, "resumed inside the first epoch");
  ck_assert_msg(!strstr(r.err, "totals"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  json_t *recs = log_records(lg);
  ck_assert_int_eq(json_array_size(recs), 2);
  static const char *const same[] = {"train_loss", "train_acc", "grad_norm_mean", "grad_norm_max",
                                     "expert_share_min", "expert_share_max", "expert_load_cv"};
  for (size_t i = 0; i < 2; i++)
    for (size_t f = 0; f < sizeof same / sizeof *same; f++) {
      json_t *got = json_object_get(json_array_get(recs, i), same[f]);
      json_t *want = json_object_get(json_array_get(whole, i), same[f]);
      char *g = json_dumps(got, JSON_ENCODE_ANY), *w = json_dumps(want, JSON_ENCODE_ANY);
      ck_assert_msg(want && json_equal(got, want), "epoch %zu's %s: %s, the whole run's %s", i + 1, same[f], g, w);
      free(g), free(w);
    }
  json_decref(recs);
  json_decref(whole);
#undef RW_TRAIN
}
END_TEST

/* An epoch that is the best is saved to CKPT.best before CKPT: CKPT written, then its
 * .best refused, recorded the epoch as the best where no file held it, and a resumed
 * run that found no better epoch replaced CKPT and lost that model for good. Now CKPT
 * refused after its .best leaves the .best ahead of it, and the run resumed trains that
 * epoch again to the same .best, byte for byte. An epoch whose .best is refused (the
 * first of its two saves) says "(best, not saved)", names the .best in its error, and
 * stops before its checkpoint is replaced: both files hold the epoch before, and the
 * run resumed from there ends as the whole run does. */
START_TEST(the_best_saved_before_the_checkpoint) {
  const char *pre = failio();
  if (!pre) return;
  char out[4500];
  snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
  char *trace[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=rename", "FAILIO_TRACE=1", out, NULL};
  best_whole("bb.txt", "3", "bbw.ckpt");
  RunResult r = best_train(trace, "bb.txt", "2", "bbt.ckpt", NULL, true);
  ok(&r, "the run traced");
  tu_free(&r);
  /* four saves, two an epoch, each put in place by one rename */
  ck_assert_int_eq(failio_calls(), 4);
  best_epochs("bbw.ckpt", 2, 2);
  /* (nth 4: the second epoch's checkpoint; nth 3: its .best) */
  for (int nth = 4; nth >= 3; nth--) {
    char n[16];
    snprintf(n, sizeof n, "FAILIO_N=%d", nth);
    char *fault[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=rename", n, out, NULL};
    r = best_train(fault, "bb.txt", "2", "bb.ckpt", NULL, false);
    const char *refused = nth == 4 ? "bb.ckpt'" : "bb.ckpt.best'";
    ck_assert_msg(r.status == 1 && strstr(r.err, strerror(ENOSPC)) && strstr(r.err, refused),
                  "the save of %s failed: exit %d: %s", refused, r.status, tu_tail(r.err, 1800));
    /* the epoch's line: its .best saved or not, whether the checkpoint's save then failed */
    const char *e2 = strstr(r.out, "epoch 2/2");
    ck_assert_msg(e2 && strstr(e2, nth == 4 ? "(best, saved)" : "(best, not saved)"), "nth %d: %s", nth,
                  tu_tail(r.out, 1800));
    tu_free(&r);
    unlink(path_in("failio.out"));
    /* the checkpoint's best behind its .best where the checkpoint's save failed; both
       the epoch before where the .best's did */
    best_epochs("bb.ckpt", 1, nth == 4 ? 2 : 1);
    r = best_train(NULL, "bb.txt", "1", "bb.ckpt", "bb.ckpt", true);
    ok(&r, "resumed");
    tu_free(&r);
    same_bytes("bbw.ckpt.best", "bb.ckpt.best", "the resumed run's .best is not the whole run's");
    same_bytes("bbw.ckpt", "bb.ckpt", "the resumed run is not the whole run");
    unlink(path_in("bb.ckpt"));
    unlink(path_in("bb.ckpt.best"));
  }
}
END_TEST

/* dir/name, in a buffer of its own for each of four calls */
static const char *dir_file(const char *dir, const char *name) {
  static char buf[4][4600];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

/* The files of one output directory (n of them), read whole, and their stat */
static void read_set(const char *dir, const char *const *names, int n, char **bytes, size_t *len, struct stat *st) {
  for (int i = 0; i < n; i++) {
    const char *p = dir_file(dir, names[i]);
    bytes[i] = tu_slurp(p, &len[i]);
    ck_assert_msg(bytes[i] && stat(p, &st[i]) == 0, "%s is missing", p);
  }
}

/* A run of `argv` (writing into dir) whose N-th counted call of `calls` fails and, with
   `also`, a later one too (0: every one after the N-th): refused with exit 1, and dir
   holds the n files it held, byte for byte, with their modes and modification times
   (one put back from a copy too), and nothing else. */
static void set_kept(char *const argv[], const char *prog, const char *calls, long nth, long also, const char *dir,
                     const char *const *names, int n) {
  char *was[3], *now[3];
  size_t wl[3], nl[3];
  struct stat ws[3], ns[3];
  for (int i = 0; i < n; i++) chmod(dir_file(dir, names[i]), 0640); /* (not the umask's: a copy must keep it) */
  read_set(dir, names, n, was, wl, ws);
  char p[64], c[64], k[64], a[64], out[4500];
  snprintf(p, sizeof p, "FAILIO_PROG=%s", prog);
  snprintf(c, sizeof c, "FAILIO_CALLS=%s", calls);
  snprintf(k, sizeof k, "FAILIO_N=%ld", nth);
  snprintf(a, sizeof a, also ? "FAILIO_ALSO=%ld" : "FAILIO_STICKY=1", also);
  snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
  char *env[] = {(char *)failio(), p, c, k, a, out, NULL};
  RunResult r = run_env(env, argv, 120);
  ck_assert_msg(r.status == 1 && strstr(r.err, strerror(ENOSPC)), "%s, %s %ld and %ld failed: exit %d: %s", prog,
                calls, nth, also, r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  read_set(dir, names, n, now, nl, ns);
  for (int i = 0; i < n; i++) {
    ck_assert_msg(nl[i] == wl[i] && !memcmp(now[i], was[i], wl[i]), "%s, %s %ld and %ld failed: %s/%s replaced", prog,
                  calls, nth, also, dir, names[i]);
    ck_assert_msg(ns[i].st_mode == ws[i].st_mode && ns[i].st_mtim.tv_sec == ws[i].st_mtim.tv_sec &&
                      ns[i].st_mtim.tv_nsec == ws[i].st_mtim.tv_nsec,
                  "%s, %s %ld and %ld failed: %s/%s put back with mode %o, modified at %lld.%09ld, not %o, %lld.%09ld",
                  prog, calls, nth, also, dir, names[i], (unsigned)ns[i].st_mode, (long long)ns[i].st_mtim.tv_sec,
                  ns[i].st_mtim.tv_nsec, (unsigned)ws[i].st_mode, (long long)ws[i].st_mtim.tv_sec,
                  ws[i].st_mtim.tv_nsec);
    free(was[i]), free(now[i]);
  }
  ck_assert_int_eq(entries(dir), n);
  unlink(path_in("failio.out"));
}

/* The Tree-LSTM with other code (a gate's input halved), as `name` in the scratch
   directory: the same model's outputs, other bytes */
static void other_treelstm(const char *name) {
  char *src = tu_slurp(model("treelstm.vf"), NULL);
  const char *cut = "i  = sigmoid(x @ Wi";
  char *at = src ? strstr(src, cut) : NULL;
  ck_assert_ptr_nonnull(at);
  char other[16384];
  int len = snprintf(other, sizeof other, "%.*si  = sigmoid(0.5 * x @ Wi%s", (int)(at - src), src, at + strlen(cut));
  ck_assert(len > 0 && len < (int)sizeof other);
  tu_write(path_in(name), other, (size_t)len);
  free(src);
}

/* Two faults among an output set's replacements: the earlier file's hard link refused
 * (a filesystem without hard links, a directory full), then the last rename. cavsc -o
 * and cavs build -o keep the earlier file by a copy where the link is refused, and
 * replace nothing where neither can be made (a disk full for the copy too): the
 * directory holds the earlier set whole. cavsc's failed header took the new code back
 * and left the earlier header beside no code (the earlier code lost), and build -o left
 * the new code beside the earlier header and library. */
START_TEST(a_refused_link_keeps_the_set) {
  if (!failio()) return;
  other_treelstm("kp.vf");
  const char *names[] = {"treelstm.h", "treelstm.c", "treelstm.so"};
  for (int w = 0; w < 2; w++) {
    bool build = w == 1;
    const char *prog = build ? "cavs" : "cavsc";
    char dir[4500], traced_dir[4520], kp[4500], tl[4500]; /* (path_in's and model()'s buffers are reused) */
    snprintf(kp, sizeof kp, "%s", path_in("kp.vf"));
    snprintf(tl, sizeof tl, "%s", model("treelstm.vf"));
    snprintf(dir, sizeof dir, "%s", path_in(build ? "kp-build" : "kp-cavsc"));
    snprintf(traced_dir, sizeof traced_dir, "%s-traced", dir);
    char *bin = (char *)(build ? cavs_bin : tu_env("CAVSC", "./cavsc"));
    char *first[] = {bin, "-o", dir, tl, NULL}, *first_build[] = {bin, "build", "-o", dir, tl, NULL};
    char *second[] = {bin, "-o", dir, kp, NULL}, *second_build[] = {bin, "build", "-o", dir, kp, NULL};
    char *traced_run[] = {bin, "-o", traced_dir, kp, NULL};
    char *traced_build[] = {bin, "build", "-o", traced_dir, kp, NULL};
    RunResult r = run_env(NULL, build ? first_build : first, 300);
    ok(&r, "the first set");
    tu_free(&r);
    /* the calls of a run that replaces nothing, traced: the last is the last rename */
    char p[64], out[4500];
    snprintf(p, sizeof p, "FAILIO_PROG=%s", prog);
    snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
    char *count[] = {(char *)failio(), p, "FAILIO_CALLS=link,rename", "FAILIO_TRACE=1", out, NULL};
    r = run_env(count, build ? traced_build : traced_run, 300);
    ok(&r, "the traced set");
    tu_free(&r);
    long keep = traced_file("linkat", "", true, 1, 0), last = failio_calls();
    ck_assert_msg(keep == 1 && last > 2, "%s: the first link %ld, the last call %ld", prog, keep, last);
    /* the link refused, the copy made, the last rename refused: the set put back */
    set_kept(build ? second_build : second, prog, "link,rename", 1, last, dir, names, build ? 3 : 2);
    /* the link refused, and every write after it (the copy's): nothing replaced */
    count[2] = "FAILIO_CALLS=link,write";
    r = run_env(count, build ? traced_build : traced_run, 300);
    ok(&r, "the traced set, again");
    tu_free(&r);
    keep = traced("linkat", 1);
    ck_assert_int_gt(keep, 0);
    set_kept(build ? second_build : second, prog, "link,write", keep, 0, dir, names, build ? 3 : 2);
  }
}
END_TEST

/* argv run with its counted calls nth and nth + 1 failing (failio's FAILIO_N and
   FAILIO_ALSO; prog and calls as FAILIO_PROG=... and FAILIO_CALLS=...), traced to
   failio.out */
static RunResult run_two_faults(char *const argv[], const char *prog, const char *calls, long nth) {
  char k[64], a[64], out[4500];
  snprintf(k, sizeof k, "FAILIO_N=%ld", nth);
  snprintf(a, sizeof a, "FAILIO_ALSO=%ld", nth + 1);
  snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
  char *env[] = {(char *)failio(), (char *)prog, (char *)calls, k, a, out, NULL};
  return run_env(env, argv, 300);
}

/* Two faults in cavs build -o: the last of the three renames refused, then the first
 * rename that puts an earlier file back. The message names the file left new and where
 * its earlier one is kept, byte for byte (it said only that the earlier files were kept
 * in a directory); the others are the earlier set's. The next build -o puts it back
 * and writes a whole set. */
START_TEST(a_refused_undo_is_said) {
  if (!failio()) return;
  other_treelstm("ku.vf");
  const char *names[] = {"treelstm.h", "treelstm.c", "treelstm.so"};
  char dir[4500], traced_dir[4520], ku[4500], tl[4500], out[4500];
  snprintf(dir, sizeof dir, "%s", path_in("ku-build"));
  snprintf(traced_dir, sizeof traced_dir, "%s-traced", dir);
  snprintf(ku, sizeof ku, "%s", path_in("ku.vf"));
  snprintf(tl, sizeof tl, "%s", model("treelstm.vf"));
  snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
  char *first[] = {(char *)cavs_bin, "build", "-o", dir, tl, NULL};
  char *second[] = {(char *)cavs_bin, "build", "-o", dir, ku, NULL};
  char *traced_run[] = {(char *)cavs_bin, "build", "-o", traced_dir, ku, NULL};
  RunResult r = run_env(NULL, first, 300);
  ok(&r, "the earlier set");
  tu_free(&r);
  /* (twice: the second, traced, replaces a set from the compile cache, as the run below) */
  char *trace[] = {(char *)failio(), "FAILIO_PROG=cavs", "FAILIO_CALLS=rename", "FAILIO_TRACE=1", out, NULL};
  for (int t = 0; t < 2; t++) {
    r = run_env(t ? trace : NULL, traced_run, 300);
    ok(&r, "the traced set");
    tu_free(&r);
  }
  long last = failio_calls();
  unlink(path_in("failio.out"));
  ck_assert_int_ge(last, 3);
  char *was[3], *now[3];
  size_t wl[3], nl[3];
  struct stat ws[3], ns[3];
  read_set(dir, names, 3, was, wl, ws);
  r = run_two_faults(second, "FAILIO_PROG=cavs", "FAILIO_CALLS=rename", last);
  unlink(path_in("failio.out"));
  const char *said = "' is the new build's; the earlier one is kept as '";
  const char *q = strstr(r.err, said);
  ck_assert_msg(r.status == 1 && strstr(r.err, "could not all be put back") && q && !strstr(q + 1, said),
                "renames %ld and %ld failed: exit %d: %s", last, last + 1, r.status, tu_tail(r.err, 1800));
  /* the file left new, and its earlier one's place */
  const char *n0 = q;
  while (n0 > r.err && n0[-1] != '\'') n0--;
  char left[4600], kept[4600];
  snprintf(left, sizeof left, "%.*s", (int)(q - n0), n0);
  q += strlen(said);
  snprintf(kept, sizeof kept, "%.*s", (int)strcspn(q, "'"), q);
  tu_free(&r);
  read_set(dir, names, 3, now, nl, ns);
  int news = 0;
  for (int i = 0; i < 3; i++) {
    bool same = nl[i] == wl[i] && !memcmp(now[i], was[i], wl[i]);
    if (strcmp(left, dir_file(dir, names[i]))) {
      ck_assert_msg(same, "%s is not the earlier one", names[i]);
      continue;
    }
    news++;
    ck_assert_msg(!same, "%s, said to be new, is the earlier one", left);
    size_t kl = 0;
    char *kb = tu_slurp(kept, &kl);
    ck_assert_msg(kb && kl == wl[i] && !memcmp(kb, was[i], kl), "the earlier %s is not kept as %s", names[i], kept);
    free(kb);
  }
  ck_assert_msg(news == 1, "'%s' is none of the set", left);
  for (int i = 0; i < 3; i++) free(was[i]), free(now[i]);
  /* the next build: the new set, whole, and nothing else */
  r = run_env(NULL, second, 300);
  ok(&r, "the set again");
  tu_free(&r);
  ck_assert_int_eq(entries(dir), 3);
  read_set(dir, names, 3, now, nl, ns);
  read_set(traced_dir, names, 3, was, wl, ws);
  for (int i = 0; i < 3; i++) {
    ck_assert_msg(nl[i] == wl[i] && !memcmp(now[i], was[i], wl[i]), "%s is not the new build's", names[i]);
    free(was[i]), free(now[i]);
  }
}
END_TEST

/* Two faults in cavsc -o: the pair failed after the code's rename (its directory not
 * flushed) or at the header's, and then the rename that puts the earlier code back. No
 * design keeps the pair then: the new code is left beside the earlier header, and the
 * message says so and where the earlier code is kept, byte for byte (it said only the
 * first failure, the earlier code under a temporary name that nothing named). The next
 * cavsc -o writes a whole pair and leaves nothing else. */
START_TEST(a_refused_put_back_is_said) {
  if (!failio()) return;
  other_treelstm("pb.vf");
  char dir[4500], pb[4500], tl[4500], out[4500];
  snprintf(dir, sizeof dir, "%s", path_in("pb-out"));
  snprintf(pb, sizeof pb, "%s", path_in("pb.vf"));
  snprintf(tl, sizeof tl, "%s", model("treelstm.vf"));
  snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
  char *bin = (char *)tu_env("CAVSC", "./cavsc");
  char *first[] = {bin, "-o", dir, tl, NULL}, *second[] = {bin, "-o", dir, pb, NULL};
  const char *names[] = {"treelstm.h", "treelstm.c"};
  for (int w = 0; w < 2; w++) {
    RunResult r = run_env(NULL, first, 300);
    ok(&r, "the earlier pair");
    tu_free(&r);
    /* the calls of a run that replaces the pair: renames (and flushes) */
    char *trace[] = {(char *)failio(), "FAILIO_PROG=cavsc", w ? "FAILIO_CALLS=sync,rename" : "FAILIO_CALLS=rename",
                     "FAILIO_TRACE=1", out, NULL};
    r = run_env(trace, second, 300);
    ok(&r, "the traced pair");
    tu_free(&r);
    /* the header's rename, or the code's directory flush after its rename; the next
       rename is the put-back */
    long nth = w ? traced_file("renameat", "", true, 1, 0) + 1 : traced("renameat", 2);
    unlink(path_in("failio.out"));
    ck_assert_int_gt(nth, 1);
    r = run_env(NULL, first, 300);
    ok(&r, "the earlier pair, again");
    tu_free(&r);
    char *was[2], *now[2];
    size_t wl[2], nl[2];
    struct stat ws[2], ns[2];
    read_set(dir, names, 2, was, wl, ws);
    r = run_two_faults(second, "FAILIO_PROG=cavsc", trace[2], nth);
    const char *q = strstr(r.err, "it is kept as '");
    ck_assert_msg(r.status == 1 && strstr(r.err, "could not be put back") && strstr(r.err, strerror(ENOSPC)) && q,
                  "%s %ld and %ld failed: exit %d: %s", trace[2], nth, nth + 1, r.status, tu_tail(r.err, 1800));
    q += strlen("it is kept as '");
    char kept[4600];
    snprintf(kept, sizeof kept, "%.*s", (int)strcspn(q, "'"), q);
    tu_free(&r);
    unlink(path_in("failio.out"));
    size_t kl = 0;
    char *kb = tu_slurp(kept, &kl);
    ck_assert_msg(kb && kl == wl[1] && !memcmp(kb, was[1], kl), "the earlier code is not kept as %s", kept);
    free(kb);
    read_set(dir, names, 2, now, nl, ns);
    ck_assert_msg(nl[0] == wl[0] && !memcmp(now[0], was[0], wl[0]), "%s: the earlier header replaced", trace[2]);
    ck_assert_msg(nl[1] != wl[1] || memcmp(now[1], was[1], wl[1]), "%s: the new code not in place", trace[2]);
    ck_assert_int_eq(entries(dir), 3);
    for (int i = 0; i < 2; i++) free(was[i]), free(now[i]);
    /* the next run: the new pair, whole, and nothing else */
    r = run_env(NULL, second, 300);
    ok(&r, "the pair again");
    tu_free(&r);
    ck_assert_int_eq(entries(dir), 2);
  }
}
END_TEST

/* Two faults in the compile cache: the built entry's publishing rename refused twice.
 * The third build is loaded (it was built and never loaded: the run was refused, exit 2,
 * the entry "not usable after building it" though in place). Refused every time, the
 * run says which rename failed and why, and leaves no build directory. */
START_TEST(a_refused_publish_builds_again) {
  const char *pre = failio();
  if (!pre) return;
  char out[4500];
  snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
  RunResult r = cavs("gen", "toy", "--graphs", "20", "--leaves", "4", "--seed", "3", "-o", path_in("pub.txt"), NULL);
  ok(&r, "the data");
  tu_free(&r);
  for (int w = 0; w < 2; w++) {
    char cache[4500], cache_env[4520];
    snprintf(cache, sizeof cache, "%s", path_in(w ? "pub-cache-1" : "pub-cache-0"));
    snprintf(cache_env, sizeof cache_env, "CAVS_CACHE=%s", cache);
    char *env[] = {(char *)pre, "FAILIO_PROG=cavs", "FAILIO_CALLS=rename", "FAILIO_N=1",
                   w ? "FAILIO_STICKY=1" : "FAILIO_ALSO=2", out, cache_env, NULL};
    r = cavs_env(env, "train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("pub.txt"), "--dim",
                 "E=8", "--dim", "H=8", "--epochs", "1", "--quiet", NULL);
    char *trace = tu_slurp(path_in("failio.out"), NULL);
    int faults = 0;
    for (char *at = trace ? strstr(trace, " fault=") : NULL; at; at = strstr(at + 1, " fault=")) faults++;
    free(trace);
    unlink(path_in("failio.out"));
    if (!w) {
      ok(&r, "two publishes refused");
      ck_assert_int_eq(faults, 2);
      ck_assert_int_eq(entries(cache), 1);
    } else {
      ck_assert_msg(r.status == 2 && strstr(r.err, "cannot put the built cache entry in place") &&
                        strstr(r.err, strerror(ENOSPC)),
                    "every publish refused: exit %d: %s", r.status, tu_tail(r.err, 1800));
      ck_assert_int_eq(entries(cache), 0);
    }
    tu_free(&r);
  }
}
END_TEST

/* cavs build -o's journal written in part (a disk filling up): refused with the error
 * the disk gave, the earlier set as it was (the part's errno, none, was said as "Input/
 * output error"). */
START_TEST(a_journal_written_in_part) {
  if (!failio()) return;
  other_treelstm("jp.vf");
  char dir[4500], jp[4500], out[4500];
  snprintf(dir, sizeof dir, "%s", path_in("jp-out"));
  snprintf(jp, sizeof jp, "%s", path_in("jp.vf"));
  snprintf(out, sizeof out, "FAILIO_OUT=%s", path_in("failio.out"));
  RunResult r = cavs("build", "-o", dir, model("treelstm.vf"), NULL);
  ok(&r, "the earlier set");
  tu_free(&r);
  const char *names[] = {"treelstm.h", "treelstm.c", "treelstm.so"};
  char *was[3], *now[3];
  size_t wl[3], nl[3];
  struct stat ws[3], ns[3];
  read_set(dir, names, 3, was, wl, ws);
  /* (the journal is the command's first write: cavsc and cc write theirs in children) */
  char *env[] = {(char *)failio(), "FAILIO_PROG=cavs", "FAILIO_CALLS=write", "FAILIO_SHORT=1", "FAILIO_N=1", out, NULL};
  r = cavs_env(env, "build", "-o", dir, jp, NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "keeping a journal") && strstr(r.err, strerror(ENOSPC)),
                "the journal written in part: exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  unlink(path_in("failio.out"));
  read_set(dir, names, 3, now, nl, ns);
  for (int i = 0; i < 3; i++) {
    ck_assert_msg(nl[i] == wl[i] && !memcmp(now[i], was[i], wl[i]), "%s replaced", names[i]);
    free(was[i]), free(now[i]);
  }
  ck_assert_int_eq(entries(dir), 3);
}
END_TEST

START_TEST(build_into_a_directory) {
  char out[4400], so[4500];
  snprintf(out, sizeof out, "%s", path_in("built/sub"));
  RunResult r = cavs("build", model("treegru.vf"), "--precision", "double", "-o", out, NULL);
  ok(&r, "build");
  snprintf(so, sizeof so, "%s/treegru.so\n", out);
  ck_assert_str_eq(r.out, so);
  tu_free(&r);
  ck_assert_int_eq(entries(out), 3);
  so[strlen(so) - 1] = 0;
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(h != NULL, "%s", dlerror());
  const cavs_desc *d = dlsym(h, "treegru_desc");
  ck_assert_ptr_nonnull(d);
  ck_assert_str_eq(d->name, "treegru");
  ck_assert_int_eq(d->precision, CAVS_DOUBLE);
  long dims[CAVS_MAX_DIMS] = {0};
  cavs_dims_default(d, dims);
  for (int i = 0; i < d->ndims; i++)
    if (dims[i] <= 0) dims[i] = 10; /* the vocabulary */
  char err[256];
  cavs_model *m = cavs_model_new(d, dims, err, sizeof err);
  ck_assert_msg(m != NULL, "%s", err);
  cavs_model_free(m);
  /* never over the model's own source: a model file named NAME.c (of model NAME), or
     NAME.h through a link; nothing of the build is left */
  char *src = tu_slurp(model("treegru.vf"), NULL);
  mkdir(path_in("own"), 0777);
  tu_write(path_in("own/treegru.c"), src, strlen(src));
  for (int i = 0; i < 2; i++) {
    const char *arg = path_in(i ? "own/link.vf" : "own/treegru.c");
    if (i) {
      unlink(path_in("own/treegru.c"));
      tu_write(path_in("own/treegru.h"), src, strlen(src));
      ck_assert(symlink(path_in("own/treegru.h"), arg) == 0);
    }
    r = cavs("build", arg, "-o", path_in("own"), NULL);
    ck_assert_msg(r.status == 1 && strstr(r.err, "it is the model's source"), "exit %d: %s", r.status, tu_tail(r.err, 1800));
    tu_free(&r);
    char *now = tu_slurp(path_in(i ? "own/treegru.h" : "own/treegru.c"), NULL);
    ck_assert_msg(now && !strcmp(now, src), "the model's source was written over");
    free(now);
    ck_assert_int_eq(entries(path_in("own")), i ? 2 : 1);
  }
  free(src);
  /* nor over a file of that name that cavsc or cavs build did not write (a user's own
     treegru.c, a library named treegru.so: text, or an ELF object of no such model),
     through cavs build and through cavsc; what they wrote before is replaced */
  mkdir(path_in("users"), 0777);
  const char *mine = "/* my own trainer */\nint main(void) { return 0; }\n";
  size_t elfn;
  char *elf = tu_slurp("/proc/self/exe", &elfn);
  ck_assert_ptr_nonnull(elf);
  const char *what[][2] = {{"users/treegru.c", "cavsc did not write"}, {"users/treegru.so", "cavs build did not write"},
                           {"users/treegru.so", "cavs build did not write"}};
  for (int i = 0; i < 3; i++) {
    if (i == 2) tu_write(path_in(what[i][0]), elf, elfn);
    else tu_write(path_in(what[i][0]), mine, strlen(mine));
    r = cavs("build", model("treegru.vf"), "-o", path_in("users"), NULL);
    ck_assert_msg(r.status == 1 && strstr(r.err, what[i][1]), "%s: exit %d: %s", what[i][0], r.status, tu_tail(r.err, 1800));
    tu_free(&r);
    size_t n;
    char *now = tu_slurp(path_in(what[i][0]), &n);
    ck_assert_msg(now && (i == 2 ? n == elfn && !memcmp(now, elf, n) : !strcmp(now, mine)), "%s was written over", what[i][0]);
    free(now);
    ck_assert_int_eq(entries(path_in("users")), 1);
    unlink(path_in(what[i][0]));
  }
  free(elf);
  tu_write(path_in("users/treegru.h"), mine, strlen(mine));
  char *by_cavsc[] = {(char *)tu_env("CAVSC", "./cavsc"), "-o", path_in("users"), model("treegru.vf"), NULL};
  r = tu_run(NULL, by_cavsc, 60);
  ck_assert_msg(r.status == 1 && strstr(r.err, "treegru.h': a file of that name is there that cavsc did not write"),
                "cavsc: exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  ck_assert_int_eq(entries(path_in("users")), 1);
  unlink(path_in("users/treegru.h"));
  for (int i = 0; i < 2; i++) { /* its own outputs: written, then replaced */
    r = cavs("build", model("treegru.vf"), "-o", path_in("users"), NULL);
    ok(&r, "build over its own outputs");
    tu_free(&r);
    ck_assert_int_eq(entries(path_in("users")), 3);
  }
  /* what a killed build left in the directory (named as the cache's builds are, its
     check digits right) is removed by the next; a directory of the user's is not */
  ck_assert(mkdir(path_in("users/.build.cavs-tmp-000000000001e465"), 0700) == 0 &&
            mkdir(path_in("users/build-python"), 0700) == 0);
  tu_write(path_in("users/.build.cavs-tmp-000000000001e465/treegru.c"), mine, strlen(mine));
  tu_write(path_in("users/build-python/notes"), mine, strlen(mine));
  r = cavs("build", model("treegru.vf"), "-o", path_in("users"), NULL);
  ok(&r, "build beside a killed build's leftover");
  tu_free(&r);
  ck_assert_int_eq(entries(path_in("users")), 4);
  ck_assert(access(path_in("users/build-python/notes"), F_OK) == 0);
  unlink(path_in("users/build-python/notes"));
  rmdir(path_in("users/build-python"));
  /* --emit-only: the very files cavsc writes, and no object */
  r = cavs("build", "--emit-only", model("treegru.vf"), "-o", path_in("emitted"), NULL);
  ok(&r, "build --emit-only");
  char want[4400];
  snprintf(want, sizeof want, "%s/treegru.c\n", path_in("emitted"));
  ck_assert_str_eq(r.out, want);
  tu_free(&r);
  char *argv[] = {(char *)tu_env("CAVSC", "./cavsc"), "-o", path_in("by-cavsc"), model("treegru.vf"), NULL};
  r = tu_run(NULL, argv, 60);
  ok(&r, "cavsc");
  tu_free(&r);
  ck_assert_int_eq(entries(path_in("emitted")), 2);
  const char *ext[] = {"c", "h"};
  for (int k = 0; k < 2; k++) {
    char a[4400], b[4400];
    snprintf(a, sizeof a, "%s/treegru.%s", path_in("emitted"), ext[k]);
    snprintf(b, sizeof b, "%s/treegru.%s", path_in("by-cavsc"), ext[k]);
    char *ta = tu_slurp(a, NULL), *tb = tu_slurp(b, NULL);
    ck_assert_msg(ta && tb && !strcmp(ta, tb), "%s differs from cavsc's %s", a, b);
    free(ta);
    free(tb);
  }
  /* a mistake in the model: cavsc's message, and no directory made */
  tu_write(path_in("wrong.vf"), "model m;\ndim H = 4\n", strlen("model m;\ndim H = 4\n"));
  r = cavs("build", path_in("wrong.vf"), "-o", path_in("never/made"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "wrong.vf:2:10: error:"), "%s", tu_tail(r.err, 1800));
  ck_assert_str_eq(r.out, "");
  tu_free(&r);
  ck_assert_int_eq(entries(path_in("never")), -1);
  /* nor anything in a directory that was there */
  r = cavs("build", path_in("wrong.vf"), "-o", out, NULL);
  ck_assert_int_eq(r.status, 1);
  tu_free(&r);
  ck_assert_int_eq(entries(out), 3);
  /* flags the C compiler refuses: status 2, and nothing left either */
  char *bad_flags[] = {"CAVS_MODEL_CFLAGS=--no-such-option", NULL};
  r = cavs_env(bad_flags, "build", model("treegru.vf"), "-o", path_in("never/made"), NULL);
  ck_assert_msg(r.status == 2 && strstr(r.err, "the C compiler failed"), "exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  ck_assert_int_eq(entries(path_in("never")), -1);
  /* options */
  const char *bad[][3] = {{"--frobnicate", NULL}, {"--precision", "half"}, {"-o", ""}, {NULL}};
  for (int i = 0; bad[i][0]; i++) {
    r = cavs("build", model("treegru.vf"), bad[i][0], bad[i][1], NULL);
    ck_assert_msg(r.status == 1 && *r.err, "build %s: exit %d %s", bad[i][0], r.status, tu_tail(r.err, 1800));
    ck_assert_str_eq(r.out, "");
    tu_free(&r);
  }
  r = cavs("build", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "usage: cavs build"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  r = cavs("build", model("treegru.vf"), model("treefc.vf"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "unexpected argument"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
}
END_TEST

/* The README's demo: the toy treebank and the Tree-LSTM, as `make demo` runs them. The
 * README states all-node accuracy above 0.90 and root accuracy above 0.70. */
START_TEST(demo_reaches_stated_accuracy) {
  RunResult r = cavs("gen", "toy", "--graphs", "4000", "--leaves", "16", "--words", "200", "--seed", "1", "-o",
                     path_in("demo-train.txt"), NULL);
  ok(&r, "gen");
  tu_free(&r);
  r = cavs("gen", "toy", "--graphs", "500", "--leaves", "16", "--words", "200", "--seed", "2", "-o", path_in("demo-dev.txt"),
           NULL);
  ok(&r, "gen");
  tu_free(&r);
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("demo-train.txt"), "--dev",
           path_in("demo-dev.txt"), "--dim", "E=64", "--dim", "H=64", "--epochs", "6", "--batch", "32", "--lr", "0.005",
           "--save", path_in("demo.ckpt"), NULL);
  ok(&r, "demo training");
  tu_free(&r);
  r = cavs("eval", path_in("demo.ckpt.best"), "--data", path_in("demo-dev.txt"), NULL);
  ok(&r, "demo eval");
  double acc = 0, root = 0;
  ck_assert(sscanf(strstr(r.out, "accuracy"), "accuracy %lf", &acc) == 1);
  ck_assert(sscanf(strstr(r.out, "root accuracy"), "root accuracy %lf", &root) == 1);
  fprintf(stderr, "demo: dev accuracy %.4f, root %.4f\n", acc, root);
  ck_assert_msg(acc > 0.90 && root > 0.70, "demo reached %.4f (root %.4f)", acc, root);
  tu_free(&r);
}
END_TEST

/* Trains `vf` (E = H = 32, 6 epochs, that batch and learning rate) on the files in the
 * test's directory, saves it, and returns what `cavs eval` says of its accuracy on dev. */
static double trained_accuracy(const char *vf, const char *format, const char *train, const char *dev,
                               const char *batch, const char *lr) {
  RunResult r = cavs("train", model(vf), "--format", format, "--train", path_in(train), "--dev", path_in(dev), "--dim",
                     "E=32", "--dim", "H=32", "--epochs", "6", "--batch", batch, "--lr", lr, "--save",
                     path_in("learns.ckpt"), "--quiet", NULL);
  ok(&r, vf);
  tu_free(&r);
  r = cavs("eval", path_in("learns.ckpt"), "--data", path_in(dev), NULL);
  ok(&r, "eval");
  double acc = 0;
  ck_assert(sscanf(strstr(r.out, "accuracy"), "accuracy %lf", &acc) == 1);
  tu_free(&r);
  return acc;
}

/* The BiLSTM tagger (typed child slots) on `cavs gen tagger` sentences: it learns tags
 * that depend on the word before or after (chance is 1/12; it reaches about 0.999
 * here); the sentences are 3n vertices of the shape cavs-data(5) describes. */
START_TEST(tagger_learns) {
  RunResult r = cavs("gen", "tagger", "--graphs", "1000", "--words", "100", "-o", path_in("tag-train.cgf"), NULL);
  ok(&r, "gen tagger");
  tu_free(&r);
  r = cavs("gen", "tagger", "--graphs", "100", "--words", "100", "--seed", "2", "-o", path_in("tag-dev.cgf"), NULL);
  ok(&r, "gen tagger");
  tu_free(&r);
  char *text = tu_slurp(path_in("tag-dev.cgf"), NULL);
  ck_assert(text && !strncmp(text, "graph\n0 fwd - ; word=", 21) && strstr(text, " tok ") && strstr(text, " bwd "));
  free(text);
  double acc = trained_accuracy("tagger.vf", "cgf", "tag-train.cgf", "tag-dev.cgf", "16", "0.02");
  ck_assert_msg(acc > 0.8, "the tagger reached %.4f", acc);
  r = cavs("gen", "tagger", "--chars", "--graphs", "2", "-o", path_in("tag-chars.cgf"), NULL);
  ok(&r, "gen tagger --chars");
  tu_free(&r);
  text = tu_slurp(path_in("tag-chars.cgf"), NULL);
  ck_assert(text && strstr(text, " chr - ; char=") && strstr(text, "\n1 fwd 0 "));
  free(text);
}
END_TEST

/* The cgf text of `src` with the decoder chain of graph g fed words[g] (prev= of each
 * dec vertex but the first: the word before it), written to dst. */
static void feed_words(const char *src, const char *dst, int **words, int ngraphs) {
  char *text = tu_slurp(src, NULL), *out = malloc(strlen(text) * 2 + 64), *o = out;
  ck_assert(text && out);
  int g = -1, step = 0;
  for (char *line = text, *nl; *line; line = nl) {
    nl = strchr(line, '\n');
    nl = nl ? nl + 1 : line + strlen(line);
    char *prev = strstr(line, "prev=");
    if (!strncmp(line, "graph", 5)) g++, step = 0;
    if (prev && prev < nl && strstr(line, " dec ") < nl && step++ > 0) {
      ck_assert(g >= 0 && g < ngraphs);
      char *end = prev + 5;
      while (*end >= '0' && *end <= '9') end++;
      o += sprintf(o, "%.*sprev=%d", (int)(prev - line), line, words[g][step - 2]);
      memcpy(o, end, (size_t)(nl - end));
      o += nl - end;
    } else {
      memcpy(o, line, (size_t)(nl - line));
      o += nl - line;
    }
  }
  tu_write(dst, out, (size_t)(o - out));
  free(text);
  free(out);
}

/* Whether the fed run's probabilities of words a and b at decoder step j of a graph
 * (`probs`: that graph's decoder rows, C values each) are a tie to float rounding: a
 * product of one row (a gemv) and of several (a gemm) may round differently, and so may
 * another machine's BLAS; only there may two runs pick different words. */
static bool near_tie(const double *probs, int C, int j, int a, int b) {
  if (a == b) return true;
  if (a < 0 || b < 0 || a >= C || b >= C) return false;
  /* printed to 6 digits: a tie differs by a few in the last */
  double pa = probs[j * C + a], pb = probs[j * C + b];
  return fabs(pa - pb) <= 1e-5 * fmax(pa, pb);
}

/* Runs argv with its standard error on a terminal (a pseudo-terminal), its standard
 * output into a file; returns the exit status, and what each received. */
static int run_stderr_on_pty(char *const argv[], char **tty, char **out) {
  int master = -1, slave = -1;
  ck_assert(openpty(&master, &slave, NULL, NULL, NULL) == 0);
  char *outp = strdup(path_in("pty.out"));
  pid_t pid = fork();
  ck_assert(pid >= 0);
  if (pid == 0) {
    close(master);
    int fd = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 1);
    dup2(slave, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  close(slave);
  size_t n = 0, cap = 1 << 16;
  char *buf = malloc(cap + 1);
  for (;;) { /* until the child's end of the terminal closes (EIO) */
    if (n == cap) buf = realloc(buf, (cap *= 2) + 1);
    ssize_t got = read(master, buf + n, cap - n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    n += (size_t)got;
  }
  buf[n] = 0;
  close(master);
  int st;
  waitpid(pid, &st, 0);
  *tty = buf;
  *out = tu_slurp(outp, NULL);
  free(outp);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* predict --greedy grows each decoder chain from the model's own words: fed those words
 * as its inputs instead (teacher forcing on its own output), the whole graph in one pass
 * predicts the same words at every step (but for ties to rounding: near_tie); grown in
 * batches of 5, whose graphs stop at different steps, the same words as one at a time;
 * --max-steps and --stop end the chains. */
START_TEST(greedy_decoding) {
  enum { G = 12 };
  RunResult r = cavs("gen", "translation", "--graphs", "300", "-o", path_in("tr.cgf"), NULL);
  ok(&r, "gen translation");
  tu_free(&r);
  r = cavs("gen", "translation", "--graphs", "12", "--seed", "2", "-o", path_in("tr-dev.cgf"), NULL);
  ok(&r, "gen translation");
  tu_free(&r);
  /* hardly trained (a trained one this small says one word over and over): its words
     depend on the word fed back, which is what is checked */
  r = cavs("train", model("seq2seq.vf"), "--format", "cgf", "--train", path_in("tr.cgf"), "--dim", "E=16", "--dim", "H=32",
           "--epochs", "1", "--lr", "0.000001", "--threads", "1", "--quiet", "--save", path_in("s2s.ckpt"), NULL);
  ok(&r, "train seq2seq");
  tu_free(&r);
  r = cavs("predict", path_in("s2s.ckpt"), "--data", path_in("tr-dev.cgf"), "--greedy", "prev", "--batch", "1", "--threads",
           "1", NULL);
  ok(&r, "predict --greedy");
  ck_assert_msg(strstr(r.err, "greedy decoding: 12 graphs, "), "%s", tu_tail(r.err, 1800));
  int *words[G], nwords[G];
  char *line = r.out;
  for (int g = 0; g < G; g++) {
    words[g] = malloc(sizeof(int) * 64);
    nwords[g] = 0;
    char *nl = strchr(line, '\n');
    ck_assert_msg(nl, "graph %d: no line", g);
    for (char *p = line, *e; p < nl; p = e) {
      long w = strtol(p, &e, 10);
      if (e == p) break;
      ck_assert(nwords[g] < 64 && w >= 0);
      words[g][nwords[g]++] = (int)w;
    }
    line = nl + 1;
  }
  ck_assert_msg(!*line, "more lines than graphs");
  char *first_out = strdup(r.out);
  tu_free(&r);
  feed_words(path_in("tr-dev.cgf"), path_in("tr-fed.cgf"), words, G);
  r = cavs("predict", path_in("s2s.ckpt"), "--data", path_in("tr-fed.cgf"), "--all-nodes", "--batch", "1", "--threads", "1",
           NULL);
  ok(&r, "predict --all-nodes");
  RunResult rp = cavs("predict", path_in("s2s.ckpt"), "--data", path_in("tr-fed.cgf"), "--all-nodes", "--probs", "--batch",
                      "1", "--threads", "1", NULL);
  ok(&rp, "predict --all-nodes --probs");
  /* each graph's line: every vertex's class; the decoder's are the last (the source
     comes first in these files), as many as the target has words; --probs: a line a
     vertex, "GRAPH VERTEX p0 ... p(C-1)" for the decoder's (C = seq2seq.vf's T, 128),
     "GRAPH VERTEX" for the encoder's, which push nothing */
  enum { C = 128 };
  static double probs[G][64 * C];
  line = r.out;
  char *pl = rp.out;
  for (int g = 0; g < G; g++) {
    char *nl = strchr(line, '\n');
    ck_assert(nl);
    int cls[512], n = 0;
    for (char *p = line, *e; p < nl && n < 512; p = e) {
      long c = strtol(p, &e, 10);
      if (e == p) break;
      cls[n++] = (int)c;
    }
    ck_assert_msg(nwords[g] >= 10 && nwords[g] <= 50 && n > nwords[g], "graph %d: %d words, %d vertices", g, nwords[g], n);
    for (int v = 0; v < n; v++) {
      char *e;
      ck_assert(strtol(pl, &e, 10) == g && strtol(e, &e, 10) == v);
      for (int k = 0; k < C && v >= n - nwords[g]; k++) probs[g][(v - (n - nwords[g])) * C + k] = strtod(e, &e);
      ck_assert_msg(*e == '\n', "graph %d vertex %d: not %d probabilities", g, v, C);
      pl = e + 1;
    }
    for (int j = 0; j < nwords[g]; j++)
      ck_assert_msg(near_tie(probs[g], C, j, cls[n - nwords[g] + j], words[g][j]), "graph %d step %d: greedy %d, fed its words %d",
                    g, j, words[g][j], cls[n - nwords[g] + j]);
    line = nl + 1;
  }
  tu_free(&r);
  tu_free(&rp);
  /* --max-steps 3: three words a line; --stop the first word: one */
  char stop[16];
  snprintf(stop, sizeof stop, "%d", words[0][0]);
  r = cavs("predict", path_in("s2s.ckpt"), "--data", path_in("tr-dev.cgf"), "--greedy", "prev", "--max-steps", "3",
           "--stop", stop, "--batch", "5", "--threads", "1", NULL);
  ok(&r, "predict --greedy --max-steps --stop");
  line = r.out;
  for (int g = 0; g < G; g++) {
    char *nl = strchr(line, '\n');
    ck_assert(nl);
    int n = 0, last = -1, got[3];
    bool same = true; /* the same words so far: the same inputs */
    for (char *p = line, *e; p < nl; p = e) {
      long w = strtol(p, &e, 10);
      if (e == p) break;
      ck_assert(n < 3);
      ck_assert_msg(!same || near_tie(probs[g], C, n, (int)w, words[g][n]), "graph %d step %d: %ld in a batch of 5, %d alone",
                    g, n, w, words[g][n]);
      same = same && w == words[g][n];
      got[n++] = last = (int)w;
    }
    ck_assert_msg(n >= 1 && (last == words[0][0] || n == 3), "graph %d: %d words", g, n);
    for (int j = 0; j < n - 1; j++) ck_assert(got[j] != words[0][0]);
    line = nl + 1;
  }
  tu_free(&r);
  r = cavs("predict", path_in("s2s.ckpt"), "--data", path_in("tr-dev.cgf"), "--greedy", "next", NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "no index input 'next' to feed its predictions back into"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  /* each step runs the whole graph again: the steps are bounded, and the bound says why */
  r = cavs("predict", path_in("s2s.ckpt"), "--data", path_in("tr-dev.cgf"), "--greedy", "prev", "--max-steps", "100000", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "at most 1000") && strstr(r.err, "whole graph"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  /* on a terminal, the steps are shown as they go (and cleared): the same words */
  char *argv[] = {(char *)cavs_bin, "predict", strdup(path_in("s2s.ckpt")), "--data", strdup(path_in("tr-dev.cgf")),
                  "--greedy", "prev", "--batch", "1", "--threads", "1", NULL};
  char *tty = NULL, *out = NULL;
  ck_assert_int_eq(run_stderr_on_pty(argv, &tty, &out), 0);
  ck_assert_msg(strstr(tty, "predict --greedy: graphs 1-1 of 12: step 1, 1 of them decoding"), "%s", tu_tail(tty, 1800));
  ck_assert_msg(strstr(tty, "greedy decoding: 12 graphs"), "%s", tu_tail(tty, 1800));
  ck_assert_msg(!strcmp(out, first_out), "the words differ on a terminal");
  free(first_out);
  free(tty);
  free(out);
  free(argv[2]);
  free(argv[4]);
  r = cavs("predict", path_in("s2s.ckpt"), "--data", path_in("tr-dev.cgf"), "--stop", "3", NULL);
  ck_assert_int_eq(r.status, 1);
  tu_free(&r);
  for (int g = 0; g < G; g++) free(words[g]);
}
END_TEST

/* The Child-Sum Tree-LSTM (children as a set) on `cavs gen nary` trees, whose nodes have
 * 2 to 4 children: it learns them (about 0.95 over all nodes here; the most common
 * label is 0.37 of the nodes, so 0.8 is well past guessing), and the binary Tree-LSTM
 * refuses them. */
START_TEST(childsum_learns) {
  RunResult r = cavs("gen", "nary", "--graphs", "2000", "--leaves", "12", "--words", "60", "-o", path_in("nary.txt"), NULL);
  ok(&r, "gen nary");
  tu_free(&r);
  r = cavs("gen", "nary", "--graphs", "300", "--leaves", "12", "--words", "60", "--seed", "2", "-o",
           path_in("nary-dev.txt"), NULL);
  ok(&r, "gen nary");
  tu_free(&r);
  double acc = trained_accuracy("childsum.vf", "ptb-tree", "nary.txt", "nary-dev.txt", "32", "0.01");
  ck_assert_msg(acc > 0.8, "the Child-Sum Tree-LSTM reached %.4f", acc);
  r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("nary.txt"), "--epochs", "1",
           "--quiet", NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "children") && strstr(r.err, "takes at most 2"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
}
END_TEST

/* cavs build --cached: the model built into the compile cache (the same entry training
 * uses: a second build finds it), the path of its model.so printed, which loads; not
 * with -o or --emit-only. */
START_TEST(build_cached) {
  RunResult r = cavs("build", "--cached", model("treefc.vf"), NULL);
  ok(&r, "build --cached");
  char so[4400];
  snprintf(so, sizeof so, "%s", r.out);
  tu_free(&r);
  ck_assert_msg(strlen(so) > 10 && so[strlen(so) - 1] == '\n', "%s", so);
  so[strlen(so) - 1] = 0;
  ck_assert_msg(!strncmp(so, getenv("CAVS_CACHE"), strlen(getenv("CAVS_CACHE"))) && strstr(so, "/model.so"), "%s", so);
  r = cavs("build", model("treefc.vf"), "--cached", NULL);
  ok(&r, "build --cached again");
  ck_assert_msg(!strncmp(r.out, so, strlen(so)), "%s", r.out);
  tu_free(&r);
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(h != NULL, "%s", dlerror());
  const cavs_desc *d = dlsym(h, "treefc_desc");
  ck_assert_ptr_nonnull(d);
  ck_assert_str_eq(d->name, "treefc");
  r = cavs("build", "--cached", "--emit-only", model("treefc.vf"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "--cached builds into the compile cache"), "%s", r.err);
  tu_free(&r);
}
END_TEST

/* ---- cavs export and --init-all: the files read back without cavs's own reader ---- */

#define TREEFC(...)                                                                                     \
  cavs("train", model("treefc.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dim", "H=8",  \
       "--dim", "C=5", "--batch", "32", "--threads", "1", "--quiet", __VA_ARGS__)

static uint64_t le(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* The model a checkpoint holds, as the library makes it from a build of treefc.vf (cavs
 * build, dlopen): what cavs export must have written, parameter by parameter. */
static cavs_model *treefc_from(const char *ckpt) {
  RunResult r = cavs("build", model("treefc.vf"), "-o", path_in("treefc-built"), NULL);
  ok(&r, "build treefc");
  tu_free(&r);
  void *h = dlopen(path_in("treefc-built/treefc.so"), RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(h != NULL, "%s", dlerror());
  const cavs_desc *d = dlsym(h, "treefc_desc");
  ck_assert_ptr_nonnull(d);
  char err[512];
  cavs_ckpt *k = cavs_ckpt_read(ckpt, err, sizeof err);
  ck_assert_msg(k != NULL, "%s", err);
  long dims[CAVS_MAX_DIMS] = {0};
  ck_assert_msg(cavs_ckpt_dims(k, d, dims, err, sizeof err) == 0, "%s", err);
  cavs_model *m = cavs_model_new(d, dims, err, sizeof err);
  ck_assert_msg(m != NULL, "%s", err);
  ck_assert_msg(cavs_ckpt_apply_weights(k, m, err, sizeof err) == 0, "%s", err);
  cavs_ckpt_free(k);
  return m;
}

/* Parameter i's rows equal the n bytes at p, row-major without the model's padding. */
static void same_values(cavs_model *m, int i, const unsigned char *p, uint64_t n) {
  long rows, cols, ld;
  const char *v = cavs_model_param(m, i, &rows, &cols, &ld);
  ck_assert_uint_eq(n, (uint64_t)(rows * cols * 4));
  for (long r = 0; r < rows; r++)
    ck_assert_msg(!memcmp(p + r * cols * 4, v + r * ld * 4, (size_t)cols * 4), "parameter %s, row %ld differs",
                  cavs_model_desc(m)->params[i].name, r);
}

/* The shape a parameter is exported as: [cols] for a vector, else [rows, cols]. */
static int want_shape(cavs_model *m, int i, long *shape) {
  long rows, cols;
  cavs_model_param(m, i, &rows, &cols, NULL);
  if (cavs_model_desc(m)->params[i].rank == 1) return shape[0] = cols, 1;
  return shape[0] = rows, shape[1] = cols, 2;
}

/* The metadata: the model's name, hash, precision and dims (a JSON object as a string). */
static void check_metadata(cavs_model *m, json_t *meta) {
  const cavs_desc *d = cavs_model_desc(m);
  ck_assert_str_eq(json_string_value(json_object_get(meta, "model")), "treefc");
  ck_assert_str_eq(json_string_value(json_object_get(meta, "source_hash")), d->source_hash);
  ck_assert_str_eq(json_string_value(json_object_get(meta, "precision")), "float");
  json_t *dims = json_loads(json_string_value(json_object_get(meta, "dims")), 0, NULL);
  ck_assert_ptr_nonnull(dims);
  ck_assert_int_eq(json_object_size(dims), d->ndims);
  for (int j = 0; j < d->ndims; j++)
    ck_assert_int_eq(json_integer_value(json_object_get(dims, d->dims[j].name)), cavs_model_dim(m, j));
  json_decref(dims);
}

/* safetensors by its specification: u64 header length, the JSON header (padded with
   spaces so the data is 8-byte aligned), each tensor's dtype, shape and offsets, the
   offsets covering the data exactly, every byte the model's. Returns the metadata. */
static json_t *check_safetensors(cavs_model *m, const char *path) {
  size_t len;
  unsigned char *f = (unsigned char *)tu_slurp(path, &len);
  ck_assert_ptr_nonnull(f);
  uint64_t n = le(f, 8);
  ck_assert(n % 8 == 0 && 8 + n <= len);
  json_error_t e;
  json_t *h = json_loadb((const char *)f + 8, n, JSON_REJECT_DUPLICATES, &e);
  ck_assert_msg(json_is_object(h), "%s: the header is not JSON: %s", path, e.text);
  const cavs_desc *d = cavs_model_desc(m);
  ck_assert_int_eq(json_object_size(h), d->nparams + 1);
  uint64_t at = 0;
  for (int i = 0; i < d->nparams; i++) {
    json_t *t = json_object_get(h, d->params[i].name), *shape = json_object_get(t, "shape"),
           *offs = json_object_get(t, "data_offsets");
    ck_assert_msg(t != NULL, "no tensor %s", d->params[i].name);
    ck_assert_str_eq(json_string_value(json_object_get(t, "dtype")), "F32");
    long want[2];
    int rank = want_shape(m, i, want);
    ck_assert_int_eq(json_array_size(shape), rank);
    for (int k = 0; k < rank; k++) ck_assert_int_eq(json_integer_value(json_array_get(shape, k)), want[k]);
    uint64_t b = (uint64_t)json_integer_value(json_array_get(offs, 0)), end = (uint64_t)json_integer_value(json_array_get(offs, 1));
    ck_assert_uint_eq(b, at); /* written in the model's order, one after another */
    same_values(m, i, f + 8 + n + b, end - b);
    at = end;
  }
  ck_assert_uint_eq(8 + n + at, len);
  json_t *meta = json_incref(json_object_get(h, "__metadata__"));
  check_metadata(m, meta);
  json_decref(h);
  free(f);
  return meta;
}

/* .npz by the zip and .npy specifications: stored entries NAME.npy, each CRC-32 right
   (zlib's), an .npy 1.0 header padded to 64 bytes, the model's bytes; then
   __metadata__.json, the same object as safetensors'; the directory and its end. */
static void check_npz(cavs_model *m, const char *path, json_t *meta) {
  size_t len;
  unsigned char *f = (unsigned char *)tu_slurp(path, &len);
  ck_assert_ptr_nonnull(f);
  const cavs_desc *d = cavs_model_desc(m);
  size_t at = 0;
  for (int i = 0; i <= d->nparams; i++) {
    unsigned char *h = f + at;
    ck_assert_uint_eq(le(h, 4), 0x04034b50);
    ck_assert_uint_eq(le(h + 8, 2), 0); /* stored */
    uint64_t size = le(h + 18, 4), nlen = le(h + 26, 2), xlen = le(h + 28, 2);
    ck_assert_uint_eq(size, le(h + 22, 4));
    unsigned char *data = h + 30 + nlen + xlen;
    ck_assert_uint_eq(crc32(0, data, (uInt)size), le(h + 14, 4));
    char name[300];
    snprintf(name, sizeof name, "%s", i < d->nparams ? d->params[i].name : "__metadata__");
    strcat(name, i < d->nparams ? ".npy" : ".json");
    ck_assert_uint_eq(nlen, strlen(name));
    ck_assert(!memcmp(h + 30, name, nlen));
    if (i == d->nparams) {
      json_t *j = json_loadb((const char *)data, size, 0, NULL);
      ck_assert_msg(json_equal(j, meta), "__metadata__.json is not the safetensors header's __metadata__");
      json_decref(j);
    } else {
      ck_assert(!memcmp(data, "\x93NUMPY\x01\x00", 8));
      uint64_t hlen = le(data + 8, 2);
      ck_assert_uint_eq((10 + hlen) % 64, 0);
      long want[2];
      char dict[200];
      if (want_shape(m, i, want) == 1) snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%ld,), }", want[0]);
      else snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%ld, %ld), }", want[0], want[1]);
      ck_assert_msg(!memcmp(data + 10, dict, strlen(dict)), "%s: %.*s", name, (int)hlen, data + 10);
      for (uint64_t k = strlen(dict); k + 1 < hlen; k++) ck_assert_int_eq(data[10 + k], ' ');
      ck_assert_int_eq(data[10 + hlen - 1], '\n');
      same_values(m, i, data + 10 + hlen, size - 10 - hlen);
    }
    at = (size_t)(data + size - f);
  }
  ck_assert_uint_eq(le(f + at, 4), 0x02014b50); /* the central directory */
  ck_assert_uint_eq(le(f + len - 22, 4), 0x06054b50);
  ck_assert_uint_eq(le(f + len - 12, 2), d->nparams + 1);
  ck_assert_uint_eq(le(f + len - 6, 4), at);
  free(f);
}

/* treefc trained an epoch into STEM.ckpt, exported to STEM.safetensors and STEM.npz
   (-o before the checkpoint, as options may come) */
static void treefc_exported(const char *stem) {
  char ckpt[64], st[64], npz[64];
  snprintf(ckpt, sizeof ckpt, "%s.ckpt", stem);
  snprintf(st, sizeof st, "%s.safetensors", stem);
  snprintf(npz, sizeof npz, "%s.npz", stem);
  gen_data();
  RunResult r = TREEFC("--epochs", "1", "--save", path_in(ckpt), NULL);
  ok(&r, "train treefc");
  tu_free(&r);
  r = cavs("export", path_in(ckpt), "-o", path_in(st), NULL);
  ok(&r, "export safetensors");
  ck_assert_msg(strstr(r.out, "5 parameters of model treefc") && strstr(r.out, "float32"), "%s", r.out);
  tu_free(&r);
  r = cavs("export", "-o", path_in(npz), path_in(ckpt), NULL);
  ok(&r, "export npz");
  tu_free(&r);
}

/* cavs export: every parameter by name, shape and bytes in both formats, read here by
 * their specifications with jansson and zlib alone; refused outputs. */
START_TEST(export_read_back) {
  treefc_exported("fc");
  cavs_model *m = treefc_from(path_in("fc.ckpt"));
  json_t *meta = check_safetensors(m, path_in("fc.safetensors"));
  check_npz(m, path_in("fc.npz"), meta);
  json_decref(meta);
  cavs_model_free(m);
  /* the same checkpoint, the same bytes */
  RunResult r = cavs("export", path_in("fc.ckpt"), "-o", path_in("fc2.npz"), NULL);
  ok(&r, "export again");
  tu_free(&r);
  size_t n1 = 0, n2 = 0;
  char *a = tu_slurp(path_in("fc.npz"), &n1), *b = tu_slurp(path_in("fc2.npz"), &n2);
  ck_assert(n1 == n2 && !memcmp(a, b, n1));
  free(a);
  free(b);
  /* never over the checkpoint, through a link named as an output is */
  ck_assert(symlink(path_in("fc.ckpt"), path_in("fc-link.npz")) == 0);
  static const struct { const char *out, *msg; } bad[] = {
      {"fc-link.npz", "would overwrite"}, {"fc.bin", "FILE.safetensors or FILE.npz"}, {NULL, "usage: cavs export"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    r = bad[i].out ? cavs("export", path_in("fc.ckpt"), "-o", path_in(bad[i].out), NULL) : cavs("export", path_in("fc.ckpt"), NULL);
    ck_assert_msg(r.status == 1 && strstr(r.err, bad[i].msg), "%s: exit %d: %s", bad[i].msg, r.status, r.err);
    tu_free(&r);
  }
  ck_assert_int_eq(access(path_in("fc.bin"), F_OK), -1);
}
END_TEST

/* --init-all: a model started from each format holds exactly those values (every
 * parameter frozen, one epoch, exported again: the same bytes); a file that does not
 * fit the model is refused by name and shape, and nothing is saved. */
START_TEST(init_all_round_trip) {
  treefc_exported("rt");
  RunResult r;
  size_t n0 = 0;
  char *want = tu_slurp(path_in("rt.safetensors"), &n0);
  static const char *const from[] = {"rt.safetensors", "rt.npz"};
  for (int i = 0; i < 2; i++) {
    r = TREEFC("--epochs", "1", "--seed", "7", "--init-all", path_in(from[i]), "--freeze", "emb", "--freeze", "W",
               "--freeze", "b", "--freeze", "Wc", "--freeze", "bc", "--save", path_in("rt2.ckpt"), NULL);
    ok(&r, from[i]);
    tu_free(&r);
    r = cavs("export", path_in("rt2.ckpt"), "-o", path_in("rt2.safetensors"), NULL);
    ok(&r, "export again");
    tu_free(&r);
    size_t n = 0;
    char *got = tu_slurp(path_in("rt2.safetensors"), &n);
    ck_assert_msg(n == n0 && !memcmp(got, want, n), "--init-all %s: the parameters are not the file's", from[i]);
    free(got);
  }
  free(want);
  /* another H: emb is [V, 8] in the file; the model's other dims and the message */
  r = cavs("train", model("treefc.vf"), "--format", "ptb-tree", "--train", path_in("train.txt"), "--dim", "H=4", "--dim",
           "C=5", "--epochs", "1", "--init-all", path_in("rt.npz"), "--save", path_in("rt3.ckpt"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "rt.npz: error: tensor 'emb' is [") &&
                    strstr(r.err, ", 8]; parameter emb of model treefc is [") && strstr(r.err, "H=4 C=5 V="),
                "exit %d: %s", r.status, r.err);
  tu_free(&r);
  ck_assert_int_eq(access(path_in("rt3.ckpt"), F_OK), -1);
  /* another model: the first parameter the file lacks */
  r = TRAIN("--epochs", "1", "--init-all", path_in("rt.safetensors"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "rt.safetensors: error: "), "exit %d: %s", r.status, r.err);
  tu_free(&r);
  r = TREEFC("--epochs", "1", "--init-all", path_in("rt.npz"), "--resume", path_in("rt.ckpt"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "--init-all starts a new model"), "exit %d: %s", r.status, r.err);
  tu_free(&r);
  r = TREEFC("--epochs", "1", "--init-all", path_in("rt.npz"), "--save", path_in("rt.npz"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "would overwrite"), "exit %d: %s", r.status, r.err);
  tu_free(&r);
}
END_TEST

int main(void) {
  if (cli_init("driver")) return 1;
  Suite *s = suite_create("driver");
  TCase *tc = tcase_create("driver");
  tcase_set_timeout(tc, 600);
  /* one process: the generated data and the compile cache are shared by the tests */
  tcase_add_test(tc, train_save_eval_predict);
  tcase_add_test(tc, resume_is_bit_identical);
  tcase_add_test(tc, resume_derives_product_dims);
  tcase_add_test(tc, resume_keeps_dropout);
  tcase_add_test(tc, moe_trains_and_reports);
  tcase_add_test(tc, resume_keeps_schedule_and_frozen);
  tcase_add_test(tc, schedule_formulas);
  tcase_add_test(tc, bptt_cut_partitions_the_stream);
  tcase_add_test(tc, optimizers_resume_bit_identical);
  tcase_add_test(tc, schedule_options_checked);
  tcase_add_test(tc, damaged_checkpoints_rejected);
  tcase_add_test(tc, wrong_model_rejected);
  tcase_add_test(tc, dim_overrides);
  tcase_add_test(tc, dropout_option);
  tcase_add_test(tc, model_clip_option);
  tcase_add_test(tc, bptt_chunk_length);
  tcase_add_test(tc, bptt_state_carried);
  tcase_add_test(tc, product_dim_follows);
  tcase_add_test(tc, greedy_decoding);
  tcase_add_test(tc, user_errors);
  tcase_add_test(tc, tagger_learns);
  tcase_add_test(tc, childsum_learns);
  tcase_add_test(tc, device_named);
  tcase_add_test(tc, threads_default_from_the_machine);
  tcase_add_test(tc, option_typos_suggest);
  tcase_add_test(tc, help_and_prefixes);
  tcase_add_test(tc, init_and_freeze);
  tcase_add_test(tc, train_in_double);
  tcase_add_test(tc, schedules_and_stopping);
  tcase_add_test(tc, plot_a_log);
  tcase_add_test(tc, killed_plot_leaves_nothing);
  tcase_add_test(tc, plot_draws_the_resumed_history);
  tcase_add_test(tc, eval_scores_match_predictions);
  tcase_add_test(tc, build_for_cuda);
  tcase_add_test(tc, numeric_options_strict);
  tcase_add_test(tc, outputs_never_clobber_inputs);
  tcase_add_test(tc, outputs_to_descriptors);
  tcase_add_test(tc, concurrent_saves_all_finish);
  tcase_add_test(tc, frozen_no_merge_checkpoint);
  tcase_add_test(tc, gen_complete_fits_treefc);
  tcase_add_test(tc, language_model_perplexity);
  tcase_add_test(tc, resume_keeps_settings_not_given);
  tcase_add_test(tc, memory_limits);
  tcase_add_test(tc, sigint_saves_and_resumes_exactly);
  tcase_add_test(tc, save_every_resumes_after_a_kill);
  tcase_add_test(tc, plateau_resumed_with_less_patience);
  tcase_add_test(tc, stream_trains_as_loaded);
  tcase_add_test(tc, stream_index_cached);
  tcase_add_test(tc, sigint_resumes_carried_state_exactly);
  tcase_add_test(tc, sigint_resumes_varied_chunks_exactly);
  tcase_add_test(tc, sigint_resumes_reset_chunks_exactly);
  tcase_add_test(tc, sigkill_never_tears_a_checkpoint);
  tcase_add_test(tc, regression_and_two_losses);
  tcase_add_test(tc, prebuilt_library);
  tcase_add_test(tc, build_into_a_directory);
  tcase_add_test(tc, build_outputs_replaced_as_a_set);
  tcase_add_test(tc, a_full_disk_tears_nothing);
  tcase_add_test(tc, a_log_refused_keeps_the_epoch);
  tcase_add_test(tc, an_epoch_resumed_counts_it_whole);
  tcase_add_test(tc, the_best_saved_before_the_checkpoint);
  tcase_add_test(tc, memory_running_out_is_said);
  tcase_add_test(tc, a_whole_record_kept_as_memory_runs_out);
  tcase_add_test(tc, a_plot_out_of_memory_is_said);
  tcase_add_test(tc, a_file_written_out_of_memory_is_said);
  tcase_add_test(tc, a_cache_entry_flushed_before_it_is_published);
  tcase_add_test(tc, a_refused_link_keeps_the_set);
  tcase_add_test(tc, a_refused_put_back_is_said);
  tcase_add_test(tc, a_refused_undo_is_said);
  tcase_add_test(tc, a_refused_publish_builds_again);
  tcase_add_test(tc, a_journal_written_in_part);
  tcase_add_test(tc, build_cached);
  tcase_add_test(tc, export_read_back);
  tcase_add_test(tc, init_all_round_trip);
  tcase_add_test(tc, demo_reaches_stated_accuracy);
  suite_add_tcase(s, tc);
  return tu_run_suite_shared(s, dir);
}

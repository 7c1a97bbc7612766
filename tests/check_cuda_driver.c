/* check_cuda_driver.c: `cavs train|eval --device cuda` end to end without a GPU:
 * tests/cavs-emu is the cavs command built against the tests' libcavs (whose cuda
 * backend is runtime/backend_cuda.cu on the emulated CUDA runtime of tests/cuda_emu.cc;
 * its models' MODEL.cu compiled by the host C++ compiler under tests/cuda_emu.h). Every
 * example trains two epochs in double on `cavs gen` data on the cuda device and on the
 * cpu device of ./cavs: the epoch lines and the --log agree to 1e-6, and the cuda
 * checkpoint evaluates on the cpu device to the dev loss the cuda run logged. Then the
 * device failing (an allocation, a kernel's fault, a copy in a save): exit status 2, one
 * line naming the call, every checkpoint already written left whole. And no environment variable makes
 * the installed cavs load another CUDA module than its own.
 *
 * On a GPU (`make check-cuda`, CAVS_CUDA_GPU=1), the cuda side is ./cavs itself on the
 * device: the same runs and comparisons for every example, without the cases that need
 * the emulator (its injected faults). */
#include "cli.h"

#include <jansson.h>
#include <math.h>

static const char *emu_bin;

static char *tu_slurp_ok(const char *path, size_t *n) {
  char *t = tu_slurp(path, n);
  ck_assert_msg(t != NULL, "cannot read %s", path);
  return t;
}


/* Runs `bin` with the NULL-terminated arguments. */
static RunResult run_bin(const char *bin, const char *const *args) {
  char *argv[64];
  int n = 0;
  argv[n++] = (char *)bin;
  for (int i = 0; args[i] && n < 63; i++) argv[n++] = (char *)args[i];
  argv[n] = NULL;
  return tu_run(NULL, argv, 600);
}

/* ---- the data sets: cavs gen's, and a text for the language model ---- */

static void gen(const char *const *args) {
  RunResult r = run_bin(cavs_bin, args);
  ok(&r, args[1]);
  tu_free(&r);
}

/* 60 sentences of 3-12 words over 30, from a fixed linear congruential sequence */
static void write_text(const char *path) {
  FILE *f = fopen(path, "w");
  ck_assert(f != NULL);
  unsigned long s = 7;
  for (int line = 0; line < 60; line++) {
    s = s * 6364136223846793005UL + 1442695040888963407UL;
    int n = 3 + (int)(s >> 60) % 10;
    for (int w = 0; w < n; w++) {
      s = s * 6364136223846793005UL + 1442695040888963407UL;
      fprintf(f, "%sw%lu", w ? " " : "", (s >> 33) % 30);
    }
    fputc('\n', f);
  }
  fclose(f);
}

START_TEST(make_data) {
  gen((const char *const[]){"gen", "toy", "--graphs", "120", "--leaves", "10", "--words", "40", "--seed", "3", "-o",
                            path_in("toy.txt"), NULL});
  gen((const char *const[]){"gen", "nary", "--graphs", "120", "--leaves", "10", "--words", "40", "--seed", "3", "-o",
                            path_in("nary.txt"), NULL});
  gen((const char *const[]){"gen", "tagger", "--graphs", "60", "--words", "60", "--seed", "3", "-o",
                            path_in("tagger.cgf"), NULL});
  gen((const char *const[]){"gen", "tagger", "--chars", "--graphs", "40", "--words", "60", "--seed", "3", "-o",
                            path_in("chars.cgf"), NULL});
  gen((const char *const[]){"gen", "lattice", "--graphs", "60", "--words", "80", "--seed", "3", "-o",
                            path_in("lattice.cgf"), NULL});
  gen((const char *const[]){"gen", "translation", "--graphs", "40", "--seed", "3", "-o", path_in("translation.cgf"),
                            NULL});
  write_text(path_in("lm.txt"));
}
END_TEST

/* Each example: its format, its data, and dims small enough for a test */
static const struct {
  const char *name, *format, *data, *dims[4];
} ex[] = {
    {"treelstm", "ptb-tree", "toy.txt", {"E=16", "H=16"}},
    {"treefc", "ptb-tree", "toy.txt", {"H=16", "C=5"}},
    {"lstm_lm", "text", "lm.txt", {"E=16", "H=16"}},
    {"lstm_lm2", "text", "lm.txt", {"E=16", "H=16"}},
    {"treegru", "ptb-tree", "toy.txt", {"E=16", "H=16"}},
    {"twotype", "ptb-tree", "toy.txt", {"E=16", "H=16"}},
    {"tagger", "cgf", "tagger.cgf", {"E=16", "H=16"}},
    {"tagger_chars", "cgf", "chars.cgf", {"E=16", "K=8", "Hc=8", "H=16"}},
    {"childsum", "ptb-tree", "nary.txt", {"E=16", "H=16"}},
    {"lattice_lstm", "cgf", "lattice.cgf", {"E=16", "W=16", "H=16"}},
    {"lattice_gru", "cgf", "lattice.cgf", {"E=16", "W=16", "H=16"}},
    {"seq2seq", "cgf", "translation.cgf", {"E=16", "H=16"}},
    {"mvrnn", "ptb-tree", "toy.txt", {"H=8"}},
    {"nary_treelstm", "ptb-tree", "toy.txt", {"E=16", "H=16"}},
    {"moe_tree", "ptb-tree", "toy.txt", {"E=16", "H=16", "F=8", "X=4"}},
    {"moe_lm", "text", "lm.txt", {"E=16", "H=16", "F=8", "X=4"}},
};
enum { NEX = sizeof ex / sizeof *ex };

/* `cavs train` of example i on `device` by `bin`: 2 epochs in double, the data its own
 * dev set, logged to and saved at NAME-DEVICE.log and .ckpt; with `dropout` (not NULL)
 * at that --dropout, as NAME-DEVICE-drop.log and .ckpt */
static RunResult train(const char *bin, int i, const char *device, const char *dropout) {
  char vf[4400], logp[4400], ckp[4400], tag[128];
  snprintf(vf, sizeof vf, "%s/dsl-examples/%s.vf", top, ex[i].name);
  snprintf(tag, sizeof tag, "%s-%s%s", ex[i].name, device, dropout ? "-drop" : "");
  snprintf(logp, sizeof logp, "%s/%s.log", dir, tag);
  snprintf(ckp, sizeof ckp, "%s/%s.ckpt", dir, tag);
  const char *args[48] = {"train", vf, "--format", ex[i].format, "--train", path_in(ex[i].data), "--dev",
                          path_in(ex[i].data), "--epochs", "2", "--batch", "16", "--seed", "4", "--precision",
                          "double", "--device", device, "--threads", "1", "--log", logp, "--save", ckp};
  int n = 24;
  for (int d = 0; d < 4 && ex[i].dims[d]; d++) args[n++] = "--dim", args[n++] = ex[i].dims[d];
  if (dropout) args[n++] = "--dropout", args[n++] = dropout;
  args[n] = NULL;
  return run_bin(bin, args);
}

/* The epoch lines of `out` up to their timing ("  1.2s"), each number in them within a
 * unit of its last printed place of the other's: what both devices print alike. */
static void same_epoch_lines(const char *name, const char *cpu, const char *cuda) {
  int lines = 0;
  for (const char *a = strstr(cpu, "epoch "), *b = strstr(cuda, "epoch "); a || b;
       a = strstr(a + 1, "\nepoch "), b = strstr(b + 1, "\nepoch "), lines++) {
    ck_assert_msg(a && b, "%s: the devices print different numbers of epoch lines:\ncpu:\n%s\ncuda:\n%s", name, cpu, cuda);
    a += *a == '\n', b += *b == '\n';
    char la[512], lb[512];
    snprintf(la, sizeof la, "%.*s", (int)strcspn(a, "\n"), a);
    snprintf(lb, sizeof lb, "%.*s", (int)strcspn(b, "\n"), b);
    char *sa, *sb, *ta = strtok_r(la, " ", &sa), *tb = strtok_r(lb, " ", &sb);
    for (; ta && tb; ta = strtok_r(NULL, " ", &sa), tb = strtok_r(NULL, " ", &sb)) {
      size_t n = strlen(ta);
      if (n > 1 && ta[n - 1] == 's' && strspn(ta, "0123456789.") == n - 1) break; /* the timing: the rest differs */
      char *ea, *eb;
      double va = strtod(ta, &ea), vb = strtod(tb, &eb);
      if (*ea || ea == ta) { /* a word */
        ck_assert_msg(!strcmp(ta, tb), "%s: '%s' where the cpu prints '%s'", name, tb, ta);
        continue;
      }
      const char *dot = strchr(ta, '.');
      double unit = dot ? pow(10, -(double)strlen(dot + 1)) : 1;
      ck_assert_msg(!*eb && fabs(va - vb) <= unit * 1.0001, "%s: cuda prints %s where the cpu prints %s", name, tb, ta);
    }
  }
  ck_assert_msg(lines == 2, "%s: %d epoch lines", name, lines);
}

static bool close_to(double want, double got, double tol) {
  return fabs(want - got) <= tol * fmax(1e-3, fmax(fabs(want), fabs(got)));
}

/* The same numbers, to 1e-6 relative, in every line of two --log files, but the times */
static void same_logs(const char *name, const char *cpu_log, const char *cuda_log) {
  json_error_t e;
  size_t la, lb;
  char *ta = tu_slurp_ok(cpu_log, &la), *tb = tu_slurp_ok(cuda_log, &lb);
  int lines = 0;
  for (char *sa, *sb, *a = strtok_r(ta, "\n", &sa), *b = strtok_r(tb, "\n", &sb); a || b;
       a = strtok_r(NULL, "\n", &sa), b = strtok_r(NULL, "\n", &sb), lines++) {
    ck_assert_msg(a && b, "%s: the logs have different numbers of lines", name);
    json_t *ja = json_loads(a, 0, &e), *jb = json_loads(b, 0, &e);
    ck_assert_msg(ja && jb && json_object_size(ja) == json_object_size(jb), "%s: %s\n%s", name, a, b);
    const char *key;
    json_t *va;
    json_object_foreach(ja, key, va) {
      json_t *vb = json_object_get(jb, key);
      ck_assert_msg(vb != NULL, "%s: the cuda log has no %s", name, key);
      if (!strcmp(key, "graphs_per_s") || !strcmp(key, "seconds") || !strcmp(key, "time")) continue;
      if (json_is_null(va)) {
        ck_assert_msg(json_is_null(vb), "%s: %s is null on the cpu only", name, key);
        continue;
      }
      if (json_is_string(va)) { /* the optimizer's and the schedule's names */
        ck_assert_msg(json_is_string(vb) && !strcmp(json_string_value(va), json_string_value(vb)), "%s: %s", name, key);
        continue;
      }
      if (json_is_array(va)) { /* a number a mixture of experts (expert_share_min, ...) */
        ck_assert_msg(json_is_array(vb) && json_array_size(va) == json_array_size(vb) && json_array_size(va) > 0, "%s: %s",
                      name, key);
        for (size_t i = 0; i < json_array_size(va); i++) {
          json_t *xa = json_array_get(va, i), *xb = json_array_get(vb, i);
          ck_assert_msg(json_is_number(xa) && json_is_number(xb), "%s: %s[%zu]", name, key, i);
          ck_assert_msg(close_to(json_number_value(xa), json_number_value(xb), 1e-6), "%s: %s[%zu]: cpu %.17g, cuda %.17g",
                        name, key, i, json_number_value(xa), json_number_value(xb));
        }
        continue;
      }
      ck_assert_msg(json_is_number(va) && json_is_number(vb), "%s: %s", name, key);
      ck_assert_msg(close_to(json_number_value(va), json_number_value(vb), 1e-6), "%s: %s: cpu %.17g, cuda %.17g",
                    name, key, json_number_value(va), json_number_value(vb));
    }
    json_decref(ja);
    json_decref(jb);
  }
  ck_assert_msg(lines == 2, "%s: %d log lines", name, lines);
  free(ta);
  free(tb);
}

/* The last number `key` of a --log */
static double last_logged(const char *log, const char *key) {
  size_t n;
  char *t = tu_slurp_ok(log, &n), *last = NULL;
  for (char *s, *l = strtok_r(t, "\n", &s); l; l = strtok_r(NULL, "\n", &s)) last = l;
  json_error_t e;
  json_t *j = last ? json_loads(last, 0, &e) : NULL;
  ck_assert_msg(j && json_is_number(json_object_get(j, key)), "%s: no %s", log, key);
  double v = json_number_value(json_object_get(j, key));
  json_decref(j);
  free(t);
  return v;
}

/* `cavs eval CKPT --json` by `bin` on `device`: its loss */
static double eval_loss(const char *bin, const char *ckpt, const char *data, const char *device) {
  const char *args[] = {"eval", ckpt, "--data", data, "--device", device, "--json", NULL};
  RunResult r = run_bin(bin, args);
  ok(&r, "eval");
  json_error_t e;
  json_t *j = json_loads(r.out, 0, &e);
  ck_assert_msg(j && json_is_number(json_object_get(j, "loss")), "%s", tu_tail(r.out, 1200));
  double v = json_number_value(json_object_get(j, "loss"));
  json_decref(j);
  tu_free(&r);
  return v;
}

START_TEST(trains_as_the_cpu) {
  RunResult c = train(cavs_bin, _i, "cpu", NULL), g = train(emu_bin, _i, "cuda", NULL);
  ok(&c, ex[_i].name);
  ok(&g, ex[_i].name);
  ck_assert_msg(strstr(g.out, "device: cuda"), "%s", tu_tail(g.out, 600));
  same_epoch_lines(ex[_i].name, c.out, g.out);
  char cl[4400], gl[4400], gk[4400];
  snprintf(cl, sizeof cl, "%s/%s-cpu.log", dir, ex[_i].name);
  snprintf(gl, sizeof gl, "%s/%s-cuda.log", dir, ex[_i].name);
  snprintf(gk, sizeof gk, "%s/%s-cuda.ckpt", dir, ex[_i].name);
  same_logs(ex[_i].name, cl, gl);
  /* the cuda checkpoint, on either device: the dev loss the cuda run logged last */
  double logged = last_logged(gl, "dev_loss");
  double on_cpu = eval_loss(cavs_bin, gk, path_in(ex[_i].data), "cpu");
  double on_cuda = eval_loss(emu_bin, gk, path_in(ex[_i].data), "cuda");
  ck_assert_msg(close_to(logged, on_cpu, 1e-6) && close_to(logged, on_cuda, 1e-6),
                "%s: logged %.17g; evaluated on the cpu %.17g, on cuda %.17g", ex[_i].name, logged, on_cpu, on_cuda);
  tu_free(&c);
  tu_free(&g);
  if (!strcmp(ex[_i].name, "seq2seq")) { /* greedy decoding: the same words on both devices */
    const char *args[] = {"predict", gk, "--data", path_in(ex[_i].data), "--greedy", "prev", "--device", NULL, NULL};
    args[7] = "cpu";
    c = run_bin(cavs_bin, args);
    args[7] = "cuda";
    g = run_bin(emu_bin, args);
    ok(&c, "predict --greedy on the cpu");
    ok(&g, "predict --greedy on cuda");
    const char *sc = strstr(c.err, "greedy decoding:"), *sg = strstr(g.err, "greedy decoding:");
    ck_assert_msg(*c.out && !strcmp(c.out, g.out) && sc && sg && !strcmp(sc, sg), "cpu:\n%s%s\ncuda:\n%s%s",
                  tu_tail(c.out, 600), tu_tail(c.err, 300), tu_tail(g.out, 600), tu_tail(g.err, 300));
    tu_free(&c);
    tu_free(&g);
  }
}
END_TEST

/* The examples with a dropout option, at --dropout 0.3: the masks are drawn alike on
 * both devices (a counter-based draw by seed, row and column), so the epoch lines and
 * logs agree as without dropout (on an H200: 2.5e-15 relative, 2026-11-26). */
static const char *const dropped[] = {"treelstm", "nary_treelstm", "tagger", "seq2seq", "moe_lm"};

START_TEST(dropout_as_the_cpu) {
  int i = 0;
  while (i < NEX && strcmp(ex[i].name, dropped[_i])) i++;
  ck_assert_msg(i < NEX, "no example %s", dropped[_i]);
  RunResult c = train(cavs_bin, i, "cpu", "0.3"), g = train(emu_bin, i, "cuda", "0.3");
  ok(&c, ex[i].name);
  ok(&g, ex[i].name);
  ck_assert_msg(strstr(g.out, "options: p_drop=0.3") && strstr(c.out, "options: p_drop=0.3"), "%s", tu_tail(g.out, 600));
  same_epoch_lines(ex[i].name, c.out, g.out);
  char cl[4400], gl[4400];
  snprintf(cl, sizeof cl, "%s/%s-cpu-drop.log", dir, ex[i].name);
  snprintf(gl, sizeof gl, "%s/%s-cuda-drop.log", dir, ex[i].name);
  same_logs(ex[i].name, cl, gl);
  tu_free(&c);
  tu_free(&g);
}
END_TEST

/* args (args[dev] the device's place) run by cavs on the cpu and by the emulated cavs on
   cuda: both succeed and print the same epoch lines */
static void cpu_and_cuda_alike(const char *name, const char **args, int dev) {
  args[dev] = "cpu";
  RunResult c = run_bin(cavs_bin, args);
  args[dev] = "cuda";
  RunResult g = run_bin(emu_bin, args);
  ok(&c, "on the cpu");
  ok(&g, "on the emulated cuda device");
  same_epoch_lines(name, c.out, g.out);
  tu_free(&c);
  tu_free(&g);
}

/* A minibatch whose sets have no edge (Child-Sum's trees one at a time, the first a
   lone leaf): the sum over edges reads none, from a set's buffer never made */
START_TEST(sets_without_edges) {
  char vf[4400], data[4400];
  snprintf(vf, sizeof vf, "%s/dsl-examples/childsum.vf", top);
  snprintf(data, sizeof data, "%s", path_in("leaf-first.txt"));
  const char *text = "(2 w1)\n(3 (1 w2) (4 w3))\n";
  tu_write(data, text, strlen(text));
  const char *args[] = {"train", vf, "--format", "ptb-tree", "--train", data, "--epochs", "2", "--batch", "1",
                        "--dim", "E=8", "--dim", "H=8", "--precision", "double", "--device", NULL, NULL};
  cpu_and_cuda_alike("childsum", args, 17);
}
END_TEST

/* --cuda-graphs with two mixtures of experts, one in a vertex type that the first
 * minibatch lacks and one in the push block: the pass that first has that type runs
 * kernel by kernel, making its routing's arrays, and the passes after are graphs; the
 * cpu's epoch lines. (A pass was captured once any routing had run, and the inner
 * type's first routing failed it: "first ran in a pass captured as a CUDA graph".) */
START_TEST(graphs_with_a_late_mixture) {
  char vf[4400], data[4400];
  snprintf(vf, sizeof vf, "%s", path_in("mix2.vf"));
  snprintf(data, sizeof data, "%s", path_in("mix2.cgf"));
  const char *model =
      "model mix2; dim H = 2; dim X = 4; dim HH = H * H; input label : class[H]; input f : real[H];\n"
      "param Wg[H,X], T[X,HH], Wp[H,X], P[X,HH], W[H,H];\n"
      "vertex r (children 1) { h = tanh(moe(e in top(gather(0) @ Wg, 2): f @ T[e])); scatter(h); push(h); }\n"
      "vertex l (children 0) { h = tanh(f @ W); scatter(h); push(h); }\n"
      "push (h) { loss softmax_xent(moe(e in top(h @ Wp, 2, 0.1): h @ P[e]), label); }\n";
  tu_write(vf, model, strlen(model));
  /* leaves alone but for one graph: in this seed's order, the first minibatches have
     no inner vertex */
  const char *text = "graph\n0 l ; label=1 f=0.3,0.1\nend\n"
                     "graph\n0 l ; label=0 f=-0.1,0.6\nend\n"
                     "graph\n0 l ; label=1 f=0.5,-0.2\nend\n"
                     "graph\n0 l ; label=0 f=0.7,0.4\nend\n"
                     "graph\n0 r 1 ; label=1 f=-0.8,-0.5\n1 l ; label=0 f=0.2,-0.4\nend\n";
  tu_write(data, text, strlen(text));
  const char *args[] = {"train", vf, "--format", "cgf", "--train", data, "--epochs", "2", "--batch", "1",
                        "--precision", "double", "--cuda-graphs", "--device", NULL, NULL};
  cpu_and_cuda_alike("two mixtures", args, 14);
}
END_TEST

/* ---- the device failing ---- */

/* Runs the emulated cavs with one variable of the emulator set */
static RunResult emu_with(const char *var, long n, const char *const *args) {
  char v[32];
  snprintf(v, sizeof v, "%ld", n);
  setenv(var, v, 1);
  RunResult r = run_bin(emu_bin, args);
  unsetenv(var);
  return r;
}

/* What a clean run of the emulated cavs asked of the device ($CAVS_EMU_COUNTS), its
 * standard output saying `says` where that is not NULL */
typedef struct {
  long kernels, copies, mallocs, graph_kernels;
} Counted;
static Counted counted_run(const char *const *args, const char *what, const char *says) {
  setenv("CAVS_EMU_COUNTS", path_in("counts"), 1);
  RunResult r = run_bin(emu_bin, args);
  unsetenv("CAVS_EMU_COUNTS");
  ok(&r, what);
  ck_assert_msg(!says || strstr(r.out, says), "%s: no \"%s\" in:\n%s", what, says, tu_tail(r.out, 1200));
  tu_free(&r);
  size_t n;
  char *text = tu_slurp_ok(path_in("counts"), &n);
  Counted c = {0};
  ck_assert_msg(sscanf(text, "%ld kernels %*d cublas %*d memsets %*d syncs %ld copies %ld mallocs %ld graph-kernels",
                       &c.kernels, &c.copies, &c.mallocs, &c.graph_kernels) == 4,
                "%s: %s", what, text);
  free(text);
  return c;
}

static void one_line_naming(const RunResult *r, const char *call);

/* Kernel n of a run of `epochs` epochs saving to ckpt faults in epoch 2: one line naming
 * the fault, epoch 1's line and not epoch 2's, epoch 1's checkpoint whole */
static void faults_in_epoch_2(const char *const *args, long n, const char *ckpt, int epochs) {
  RunResult r = emu_with("CAVS_EMU_FAIL_LAUNCH", n, args);
  one_line_naming(&r, "an illegal memory access");
  char one[32], two[32];
  snprintf(one, sizeof one, "epoch 1/%d", epochs);
  snprintf(two, sizeof two, "epoch 2/%d", epochs);
  ck_assert_msg(strstr(r.out, one) && !strstr(r.out, two), "kernel %ld faulting: %s", n, r.out);
  tu_free(&r);
  r = cavs("info", ckpt, NULL);
  ok(&r, "info of the checkpoint a failed run left");
  ck_assert_msg(strstr(r.out, "1 epoch done"), "%s", r.out);
  tu_free(&r);
}

/* The one line of stderr that a failure printed, naming `call` */
static void one_line_naming(const RunResult *r, const char *call) {
  ck_assert_msg(r->status == 2, "status %d: %s%s", r->status, tu_tail(r->out, 1200), tu_tail(r->err, 1800));
  size_t n = strlen(r->err);
  ck_assert_msg(n > 0 && r->err[n - 1] == '\n' && strchr(r->err, '\n') == r->err + n - 1 && strstr(r->err, call),
                "not one line naming %s: %s", call, tu_tail(r->err, 1800));
}


START_TEST(device_faults) {
  char vf[4400], toy[4400], clean[4400];
  snprintf(vf, sizeof vf, "%s/dsl-examples/treelstm.vf", top);
  snprintf(toy, sizeof toy, "%s", path_in("toy.txt")); /* (path_in's buffers are reused) */
  snprintf(clean, sizeof clean, "%s", path_in("clean.ckpt"));
  const char *base[] = {"train", vf, "--format", "ptb-tree", "--train", toy, "--dim", "E=16", "--dim",
                        "H=16", "--batch", "16", "--device", "cuda", "--seed", "5", "--epochs", "3", "--save"};
  enum { NB = sizeof base / sizeof *base };
  const char *args[NB + 8];
  memcpy(args, base, sizeof base);
  /* an allocation fails: nothing saved, nothing left behind */
  args[NB] = path_in("m.ckpt"), args[NB + 1] = NULL;
  RunResult r = emu_with("CAVS_EMU_FAIL_MALLOC", 3, args);
  one_line_naming(&r, "cudaMalloc");
  tu_free(&r);
  ck_assert_int_eq(access(path_in("m.ckpt"), F_OK), -1);
  /* every allocation failing in turn, on a slice of the data: those that come while a
     pass runs (its buffers grown) too, whose failure the step after it reports: out of
     memory, exit 2, in one line, and nothing saved */
  char small[4400];
  snprintf(small, sizeof small, "%s", path_in("small.txt"));
  size_t tn;
  char *trees = tu_slurp_ok(toy, &tn), *cut = trees;
  for (int i = 0; i < 64 && (cut = strchr(cut, '\n')); i++) cut++;
  ck_assert_ptr_nonnull(cut);
  tu_write(small, trees, (size_t)(cut - trees));
  free(trees);
  args[5] = small, args[NB] = path_in("s.ckpt"), args[NB + 1] = "--epochs", args[NB + 2] = "1", args[NB + 3] = NULL;
  long mallocs = counted_run(args, "clean run on the slice", NULL).mallocs;
  ck_assert_msg(mallocs > 10, "%ld allocations", mallocs);
  args[NB] = path_in("a.ckpt");
  for (long n = 1; n <= mallocs; n++) {
    r = emu_with("CAVS_EMU_FAIL_MALLOC", n, args);
    one_line_naming(&r, "out of memory");
    tu_free(&r);
    ck_assert_msg(access(path_in("a.ckpt"), F_OK) == -1, "allocation %ld failing: a checkpoint was saved", n);
  }
  /* with a dev set: the device lost in the last copy, the checkpoint's save after the
     .best's (check_driver the_best_saved_before_the_checkpoint); the epoch's line says
     the best was saved, the error names the checkpoint, which is left as it was */
  args[NB] = path_in("d.ckpt"), args[NB + 3] = "--dev", args[NB + 4] = small, args[NB + 5] = NULL;
  long dev_copies = counted_run(args, "clean run with a dev set", "(best, saved)").copies;
  size_t b0, b1;
  char *ck0 = tu_slurp_ok(path_in("d.ckpt"), &b0);
  r = emu_with("CAVS_EMU_FAIL_COPY", dev_copies, args);
  one_line_naming(&r, "d.ckpt'");
  ck_assert_msg(strstr(r.out, "epoch 1/1") && strstr(r.out, "(best, saved)") && !strstr(r.out, "(best, not saved)"),
                "%s", r.out);
  tu_free(&r);
  char *ck1 = tu_slurp_ok(path_in("d.ckpt"), &b1);
  ck_assert_msg(b0 == b1 && !memcmp(ck0, ck1, b0), "the checkpoint a failed save replaced changed");
  free(ck0);
  free(ck1);
  /* --cuda-graphs: a kernel of a captured pass faults as the graph runs it in epoch 2
     (three quarters of the way through the kernels the run ran, nearly all of them a
     graph's): the fault is reported, exit 2, epoch 1's checkpoint whole */
  args[NB] = path_in("g.ckpt"), args[NB + 2] = "2", args[NB + 3] = "--cuda-graphs", args[NB + 4] = NULL;
  Counted g = counted_run(args, "clean run with --cuda-graphs", NULL);
  ck_assert_msg(g.graph_kernels > 4 * g.kernels, "%ld kernels, %ld of graphs", g.kernels, g.graph_kernels);
  faults_in_epoch_2(args, (g.kernels + g.graph_kernels) * 3 / 4, path_in("g.ckpt"), 2);
  args[5] = toy;
  /* a clean run of one epoch: the kernels it launched (model setup and one epoch) */
  args[NB] = clean, args[NB + 1] = "--epochs", args[NB + 2] = "1", args[NB + 3] = NULL;
  Counted one = counted_run(args, "clean run", NULL);
  long launches = one.kernels, copies = one.copies;
  ck_assert_msg(launches > 100 && copies > 100, "%ld launches, %ld copies", launches, copies);
  /* the device lost in the first copy (a parameter's initial values on their way up):
     the copy is what is reported, not the allocations that fail after it as "out of
     memory"; nothing saved */
  args[NB] = path_in("u.ckpt"), args[NB + 1] = NULL;
  r = emu_with("CAVS_EMU_FAIL_COPY", 1, args);
  one_line_naming(&r, "cudaMemcpy2D: uncorrectable ECC error");
  ck_assert_msg(!strstr(r.err, "out of memory"), "%s", r.err);
  tu_free(&r);
  ck_assert_int_eq(access(path_in("u.ckpt"), F_OK), -1);
  args[NB] = clean, args[NB + 1] = "--epochs", args[NB + 2] = "1", args[NB + 3] = NULL;
  /* the device lost in the save's last copy (a parameter's row on its way to the file):
     the checkpoint there is left as it was, not replaced by one holding what the copy
     never brought */
  size_t n0, n1;
  char *before = tu_slurp_ok(clean, &n0);
  r = emu_with("CAVS_EMU_FAIL_COPY", copies, args);
  one_line_naming(&r, "cannot save");
  ck_assert_msg(strstr(r.err, "cudaMemcpy: uncorrectable ECC error"), "%s", r.err);
  tu_free(&r);
  char *after = tu_slurp_ok(clean, &n1);
  ck_assert_msg(n0 == n1 && !memcmp(before, after, n0), "the checkpoint a failed save replaced changed");
  free(before);
  free(after);
  /* a kernel faults in the middle of epoch 2: epoch 1's checkpoint stays, whole */
  args[NB] = path_in("e.ckpt"), args[NB + 1] = NULL;
  faults_in_epoch_2(args, launches * 3 / 2, path_in("e.ckpt"), 3);
  /* resumed, and failing at once (a kernel's fault, or the device lost in the first copy
     of the checkpoint's values to it): exit 2, the device's failure named, the
     checkpoint resumed from as it was */
  static const struct {
    const char *var, *says;
    long n;
  } at_once[] = {{"CAVS_EMU_FAIL_LAUNCH", "an illegal memory access", 5},
                 {"CAVS_EMU_FAIL_COPY", "uncorrectable ECC error", 1}};
  args[NB] = clean, args[NB + 1] = "--resume", args[NB + 2] = clean;
  args[NB + 3] = "--epochs", args[NB + 4] = "5", args[NB + 5] = NULL;
  for (int i = 0; i < 2; i++) {
    before = tu_slurp_ok(clean, &n0);
    r = emu_with(at_once[i].var, at_once[i].n, args);
    one_line_naming(&r, at_once[i].says);
    tu_free(&r);
    after = tu_slurp_ok(clean, &n1);
    ck_assert_msg(n0 == n1 && !memcmp(before, after, n0), "%s: the checkpoint resumed from changed", at_once[i].var);
    free(before);
    free(after);
  }
  /* nothing but the checkpoints and their .best beside the data */
  ck_assert_int_eq(access(path_in("e.ckpt.best"), F_OK), -1); /* (no --dev: no best) */
}
END_TEST

/* No variable of the environment makes the installed cavs load a CUDA module other than
 * its own: one that $CAVS_CUDA_MODULE named (until it was removed) never runs. */
START_TEST(no_module_from_the_environment) {
  char src[4400], so[4400], mark[4400];
  snprintf(src, sizeof src, "%s/evil.c", dir);
  snprintf(so, sizeof so, "%s/evil.so", dir);
  snprintf(mark, sizeof mark, "%s/evil-ran", dir);
  char text[4600];
  snprintf(text, sizeof text,
           "#include <stdio.h>\n__attribute__((constructor)) static void run(void) {\n"
           "  FILE *f = fopen(\"%s\", \"w\"); if (f) fclose(f);\n}\nint cv_backend_cuda_13;\n", /* (CV_BACKEND_CUDA_SYMBOL) */
           mark);
  tu_write(src, text, strlen(text));
  char *cc[] = {"/bin/sh", "-c", NULL, NULL};
  char cmd[9000];
  snprintf(cmd, sizeof cmd, "%s -shared -fPIC -o %s %s", tu_env("CC", "cc"), so, src);
  cc[2] = cmd;
  RunResult r = tu_run(NULL, cc, 60);
  ok(&r, cmd);
  tu_free(&r);
  char env[4500];
  snprintf(env, sizeof env, "CAVS_CUDA_MODULE=%s", so);
  char *envs[] = {env, NULL};
  r = cavs_env(envs, "train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("toy.txt"), "--dim",
               "E=8", "--dim", "H=8", "--epochs", "1", "--device", "cuda", NULL);
  ck_assert_msg(access(mark, F_OK) == -1, "the module $CAVS_CUDA_MODULE names ran: %s", tu_tail(r.err, 600));
  tu_free(&r);
}
END_TEST

int main(void) {
  if (cli_init("cuda_driver")) return 1;
  const char *gpu = getenv("CAVS_CUDA_GPU");
  bool on_gpu = gpu && !strcmp(gpu, "1");
  emu_bin = on_gpu ? cavs_bin : tu_env("CAVS_EMU", "./tests/cavs-emu");
  Suite *s = suite_create("cuda_driver");
  TCase *tc = tcase_create(on_gpu ? "cavs --device cuda on a GPU" : "cavs --device cuda on the emulator");
  tcase_set_timeout(tc, 900);
  tcase_add_test(tc, make_data); /* first: the others read what it writes */
  for (int i = 0; i < NEX; i++) /* (a checked build: a few, tests/testutil.h) */
    if (tu_example_checked(ex[i].name)) tcase_add_loop_test(tc, trains_as_the_cpu, i, i + 1);
  tu_add_examples(tc, dropout_as_the_cpu, dropped, sizeof dropped / sizeof *dropped);
  tcase_add_test(tc, sets_without_edges);
  tcase_add_test(tc, graphs_with_a_late_mixture);
  if (!on_gpu) tcase_add_test(tc, device_faults);
  tcase_add_test(tc, no_module_from_the_environment);
  suite_add_tcase(s, tc);
  return tu_run_suite_shared(s, dir);
}

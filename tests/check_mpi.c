/* check_mpi.c: cavs train under mpirun (data parallelism over Open MPI), two ranks on
 * this machine: the parameters after training equal one process's with the same
 * minibatches (to 1e-9 relative in double: only the order of the sums differs; 1e-4 in
 * float), on the Tree-LSTM (its table's gradient summed whole, dropout on, a last
 * minibatch of fewer graphs than ranks), the LSTM language model in text-bptt chunks (its
 * table's gradient as rows), the tagger with characters and seq2seq; checkpoints go on
 * across the number of ranks; the cuda backend's ranks (on the emulated device) equal
 * one process on the CPU; a killed rank ends the job with the last checkpoint
 * intact; ranks started differently, a minibatch smaller than the ranks and a rank that
 * cannot read its data are errors before training, with nothing written. In a build
 * without MPI (configure found no Open MPI, or a sanitizer or valgrind build), only that
 * cavs refuses to run as one of several processes. */
#include "cli.h"

#include <jansson.h>
#include <stdint.h>

static const char *mpirun;

/* mpirun -np 2 (with --oversubscribe: the machine may have fewer cores) running argv's
   words, NULL-terminated; root is let through (containers, CI) by Open MPI's two
   variables */
static RunResult mpi_env(const char *np, const char *first, ...) {
  char *argv[80];
  int n = 0;
  argv[n++] = (char *)mpirun;
  argv[n++] = "-np";
  argv[n++] = (char *)np;
  argv[n++] = "--oversubscribe";
  va_list ap;
  va_start(ap, first);
  for (const char *a = first; a && n < 79; a = va_arg(ap, const char *)) argv[n++] = (char *)a;
  va_end(ap);
  argv[n] = NULL;
  return tu_run(NULL, argv, 300);
}
#define MPI2(...) mpi_env("2", cavs_bin, __VA_ARGS__, NULL)
/* the same, the words after the program in an array */
static RunResult mpi_argv(const char *np, const char *bin, const char *const *args) {
  char *argv[80];
  int n = 0;
  argv[n++] = (char *)mpirun, argv[n++] = "-np", argv[n++] = (char *)np, argv[n++] = "--oversubscribe";
  argv[n++] = (char *)bin;
  for (int i = 0; args[i] && n < 79; i++) argv[n++] = (char *)args[i];
  argv[n] = NULL;
  return tu_run(NULL, argv, 300);
}

/* A parameter file as `cavs export` writes it (safetensors: a little-endian u64 header
   length, a JSON header naming each tensor's dtype and byte range, the bytes): the
   largest difference between a and b's parameters, each relative to b's largest
   magnitude. Both files must hold the same parameters, of the same shapes. */
static double worst_difference(const char *a_path, const char *b_path) {
  size_t la = 0, lb = 0;
  char *a = tu_slurp(a_path, &la), *b = tu_slurp(b_path, &lb);
  ck_assert_msg(a && b && la > 8 && lb > 8, "%s, %s: not read", a_path, b_path);
  uint64_t ha = 0, hb = 0;
  for (int i = 7; i >= 0; i--) ha = ha << 8 | (unsigned char)a[i], hb = hb << 8 | (unsigned char)b[i];
  ck_assert(ha < la - 8 && hb < lb - 8);
  json_error_t e;
  json_t *ja = json_loadb(a + 8, ha, 0, &e), *jb = json_loadb(b + 8, hb, 0, &e);
  ck_assert_msg(json_is_object(ja) && json_is_object(jb), "%s", e.text);
  double worst = 0;
  int tensors = 0;
  const char *name;
  json_t *ta;
  json_object_foreach(ja, name, ta) {
    if (!strcmp(name, "__metadata__")) continue;
    json_t *tb = json_object_get(jb, name);
    ck_assert_msg(tb, "%s: no %s", b_path, name);
    const char *dt = json_string_value(json_object_get(ta, "dtype"));
    ck_assert(dt && (!strcmp(dt, "F64") || !strcmp(dt, "F32")));
    ck_assert_str_eq(dt, json_string_value(json_object_get(tb, "dtype")));
    ck_assert(json_equal(json_object_get(ta, "shape"), json_object_get(tb, "shape")));
    size_t es = dt[1] == '6' ? 8 : 4;
    json_t *oa = json_object_get(ta, "data_offsets"), *ob = json_object_get(tb, "data_offsets");
    size_t a0 = (size_t)json_integer_value(json_array_get(oa, 0)), a1 = (size_t)json_integer_value(json_array_get(oa, 1));
    size_t b0 = (size_t)json_integer_value(json_array_get(ob, 0)), b1 = (size_t)json_integer_value(json_array_get(ob, 1));
    ck_assert(a1 - a0 == b1 - b0 && (a1 - a0) % es == 0 && 8 + ha + a1 <= la && 8 + hb + b1 <= lb);
    const char *pa = a + 8 + ha + a0, *pb = b + 8 + hb + b0;
    double big = 0, diff = 0;
    for (size_t i = 0; i < (a1 - a0) / es; i++) {
      double x, y;
      if (es == 8) {
        memcpy(&x, pa + i * 8, 8), memcpy(&y, pb + i * 8, 8);
      } else {
        float fx, fy;
        memcpy(&fx, pa + i * 4, 4), memcpy(&fy, pb + i * 4, 4);
        x = fx, y = fy;
      }
      ck_assert_msg(isfinite(x) && isfinite(y), "%s: not finite", name);
      if (fabs(y) > big) big = fabs(y);
      if (fabs(x - y) > diff) diff = fabs(x - y);
    }
    if (big > 0 && diff / big > worst) worst = diff / big;
    tensors++;
  }
  ck_assert_int_gt(tensors, 0);
  json_decref(ja), json_decref(jb);
  free(a), free(b);
  return worst;
}

/* the parameters of a checkpoint, exported to name.safetensors */
static const char *exported(const char *ckpt, const char *name) {
  static char out[2][4400];
  static int k;
  k ^= 1;
  snprintf(out[k], sizeof out[k], "%s/%s.safetensors", dir, name);
  RunResult r = cavs("export", ckpt, "-o", out[k], NULL);
  ok(&r, "export");
  tu_free(&r);
  return out[k];
}

/* the last record of a --log file, parsed */
static json_t *last_log(const char *log) {
  char *text = tu_slurp(log, NULL);
  ck_assert_ptr_nonnull(text);
  char *last = text, *nl;
  while ((nl = strchr(last, '\n')) && nl[1]) last = nl + 1;
  json_error_t e;
  json_t *rec = json_loads(last, JSON_DISABLE_EOF_CHECK, &e);
  ck_assert_msg(json_is_object(rec), "%s: %s", log, e.text);
  free(text);
  return rec;
}
/* its field's integer, or a number */
static double last_log_num(const char *log, const char *field, bool integer) {
  json_t *rec = last_log(log), *v = json_object_get(rec, field);
  ck_assert_msg(integer ? json_is_integer(v) : json_is_number(v), "%s: no %s '%s'", log, integer ? "integer" : "number",
                field);
  double x = json_number_value(v);
  json_decref(rec);
  return x;
}
static long last_log_int(const char *log, const char *field) { return (long)last_log_num(log, field, true); }
/* ...and the first number of a field that is an array of them */
static double last_log_first(const char *log, const char *field) {
  json_t *rec = last_log(log), *v = json_array_get(json_object_get(rec, field), 0);
  ck_assert_msg(json_is_number(v), "%s: no array of numbers '%s'", log, field);
  double x = json_number_value(v);
  json_decref(rec);
  return x;
}

/* The dev set under mpirun: each rank evaluates its part of every minibatch, the sums
   added up: the one process's dev loss (to rounding: the sums' order differs) and
   accuracy (the same counts) */
static void same_dev(const char *name, double tol) {
  char a[4400], b[4400];
  snprintf(a, sizeof a, "%s/%s.1.log", dir, name);
  snprintf(b, sizeof b, "%s/%s.2.log", dir, name);
  double la = last_log_num(a, "dev_loss", false), lb = last_log_num(b, "dev_loss", false);
  ck_assert_msg(fabs(la - lb) <= tol * fabs(la), "%s: dev loss %.17g, one process %.17g", name, lb, la);
  ck_assert_msg(last_log_num(a, "dev_acc", false) == last_log_num(b, "dev_acc", false), "%s: dev accuracy", name);
}

static void gen(const char *kind, const char *graphs, const char *seed, const char *out, const char *extra) {
  RunResult r = extra ? cavs("gen", kind, "--graphs", graphs, "--seed", seed, extra, "-o", path_in(out), NULL)
                      : cavs("gen", kind, "--graphs", graphs, "--seed", seed, "-o", path_in(out), NULL);
  ok(&r, "gen");
  tu_free(&r);
}

/* One process, then two ranks, the same command and --save; their parameters' worst
   relative difference. */
#define BOTH(name, ...)                                                                                 \
  do {                                                                                                  \
    RunResult one = cavs("train", __VA_ARGS__, "--threads", "1", "--quiet", "--save", path_in(name ".1"), \
                         "--log", path_in(name ".1.log"), NULL);                                        \
    ok(&one, name ": one process");                                                                      \
    tu_free(&one);                                                                                      \
    RunResult two = MPI2("train", __VA_ARGS__, "--threads", "1", "--quiet", "--save", path_in(name ".2"),  \
                         "--log", path_in(name ".2.log"));                                             \
    ok(&two, name ": two ranks");                                                                        \
    tu_free(&two);                                                                                      \
  } while (0)

/* two checkpoints' parameters (exported), b's worst relative difference from a's */
static double ckpt_difference(const char *a, const char *b) {
  char ea[4400];
  snprintf(ea, sizeof ea, "%s", exported(a, "a"));
  return worst_difference(exported(b, "b"), ea);
}

static double differ(const char *name) {
  char a[4400], b[4400];
  snprintf(a, sizeof a, "%s/%s.1", dir, name);
  snprintf(b, sizeof b, "%s/%s.2", dir, name);
  return ckpt_difference(a, b);
}

/* The Tree-LSTM, in double, with dropout (masks keyed by the whole minibatch's vertex
   numbers: the ranks draw the one process's), 33 graphs in minibatches of 32 (the last
   has one graph: one rank runs none of its own). Its table (62 words) is summed whole;
   the log says so, and that two ranks ran. And the same with the file streamed. */
START_TEST(treelstm_equals_one_process) {
  gen("toy", "300", "1", "toy.txt", NULL);
  gen("toy", "33", "3", "toy33.txt", NULL);
  BOTH("tree", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("toy.txt"), "--dev", path_in("toy33.txt"),
       "--dim", "E=12", "--dim", "H=16", "--batch", "32", "--epochs", "2", "--precision", "double", "--dropout", "0.3");
  double w = differ("tree");
  ck_assert_msg(w < 1e-9, "two ranks' parameters differ from one process's by %g", w);
  same_dev("tree", 1e-12);
  ck_assert_int_eq(last_log_int(path_in("tree.2.log"), "ranks"), 2);
  ck_assert_int_gt(last_log_int(path_in("tree.2.log"), "tables_whole"), 0);
  /* the training file streamed (--stream): rank 0 indexes it, and each rank reads only
     its part of a minibatch */
  BOTH("trees", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("toy.txt"), "--dev", path_in("toy33.txt"),
       "--dim", "E=12", "--dim", "H=16", "--batch", "32", "--epochs", "2", "--precision", "double", "--dropout", "0.3",
       "--stream");
  w = differ("trees");
  ck_assert_msg(w < 1e-9, "--stream: two ranks' parameters differ from one process's by %g", w);
  size_t na = 0, nb = 1;
  char *a = tu_slurp(path_in("tree.1"), &na), *b = tu_slurp(path_in("trees.1"), &nb);
  ck_assert_msg(a && b && na == nb && !memcmp(a, b, na), "one process: --stream trained otherwise than loaded");
  free(a), free(b);
  /* rank 1 opened the file with rank 0's index and vocabulary, not reading it through:
     the bits of two ranks that loaded it (checkpoints: the parameters and the words) */
  a = tu_slurp(path_in("tree.2"), &na), b = tu_slurp(path_in("trees.2"), &nb);
  ck_assert_msg(a && b && na == nb && !memcmp(a, b, na), "two ranks: --stream trained otherwise than loaded");
  free(a), free(b);
  BOTH("tree33", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("toy33.txt"), "--dim", "E=12", "--dim",
       "H=16", "--batch", "32", "--epochs", "3", "--precision", "double", "--dropout", "0.2");
  w = differ("tree33");
  ck_assert_msg(w < 1e-9, "with a rank without graphs: %g", w);
  /* in float: the order of the sums is all that differs, at float's precision */
  BOTH("treef", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("toy.txt"), "--dim", "E=12", "--dim",
       "H=16", "--batch", "32", "--epochs", "1");
  w = differ("treef");
  ck_assert_msg(w < 1e-4, "in float: %g", w);
}
END_TEST

/* The LSTM language model in text-bptt chunks, a vocabulary of 3000 words: each
   minibatch touches a few rows of its table, which go between the ranks as rows; and
   with the chunks cut afresh each epoch. */
START_TEST(lstm_lm_table_as_rows) {
  char *text = malloc(1 << 20);
  size_t n = 0;
  uint64_t s = 1;
  for (int line = 0; line < 300; line++) {
    int words = 3 + (int)(line % 9);
    for (int w = 0; w < words; w++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      n += (size_t)snprintf(text + n, 64, "%sw%u", w ? " " : "", (unsigned)(s >> 33) % 3000);
    }
    text[n++] = '\n';
  }
  tu_write(path_in("lm.txt"), text, n);
  free(text);
  BOTH("lm", model("lstm_lm.vf"), "--format", "text-bptt:10", "--train", path_in("lm.txt"), "--dev", path_in("lm.txt"),
       "--dim", "E=8", "--dim", "H=8", "--batch", "16", "--epochs", "1", "--precision", "double");
  double w = differ("lm");
  ck_assert_msg(w < 1e-9, "%g", w);
  same_dev("lm", 1e-12);
  ck_assert_int_gt(last_log_int(path_in("lm.2.log"), "tables_as_rows"), 0);
  /* chunks of lengths that vary (--bptt-vary): every rank cuts the same, each its places */
  BOTH("lmv", model("lstm_lm.vf"), "--format", "text-bptt:10", "--train", path_in("lm.txt"), "--dev", path_in("lm.txt"),
       "--dim", "E=8", "--dim", "H=8", "--batch", "16", "--epochs", "2", "--precision", "double", "--bptt-vary", "4");
  w = differ("lmv");
  ck_assert_msg(w < 1e-9, "--bptt-vary: %g", w);
  same_dev("lmv", 1e-12);
}
END_TEST

/* --grad-overlap: the dense gradients summed in buckets started during the backward
 * pass (MPI_Iallreduce, progressed between its steps) give the bits of the sums after
 * it, two ranks' sums being the same however started: the language model (its softmax's
 * bucket finished first, its table as rows), the Tree-LSTM with dropout and a dev set,
 * and with a rank whose part of the last minibatch is empty (its groups sent at the
 * end); and the log says time went to the sums inside the backward passes. */
static void overlap_same(const char *name, const char *const *args) {
  char plain[4400], over[4400], plog[4500], olog[4500];
  snprintf(plain, sizeof plain, "%s/%s.plain", dir, name), snprintf(over, sizeof over, "%s/%s.over", dir, name);
  snprintf(plog, sizeof plog, "%s.log", plain), snprintf(olog, sizeof olog, "%s.log", over);
  const char *argv[40];
  for (int pass = 0; pass < 2; pass++) {
    int n = 0;
    argv[n++] = "train";
    for (int i = 0; args[i]; i++) argv[n++] = args[i];
    argv[n++] = "--threads", argv[n++] = "1", argv[n++] = "--quiet", argv[n++] = "--save", argv[n++] = pass ? over : plain;
    argv[n++] = "--log", argv[n++] = pass ? olog : plog;
    if (pass) argv[n++] = "--grad-overlap";
    argv[n] = NULL;
    RunResult r = mpi_argv("2", cavs_bin, argv);
    ok(&r, name);
    tu_free(&r);
  }
  size_t na = 0, nb = 1;
  char *a = tu_slurp(plain, &na), *b = tu_slurp(over, &nb);
  ck_assert_msg(a && b && na == nb && !memcmp(a, b, na), "%s: --grad-overlap trained otherwise than without", name);
  free(a), free(b);
  ck_assert_msg(last_log_num(olog, "reduce_seconds_in_backward", false) > 0, "%s: no time in the backward passes", name);
  ck_assert_msg(last_log_num(plog, "reduce_seconds_in_backward", false) == 0, "%s: time in the backward passes", name);
}

/* A text for a language model: `lines` lines of `least` to `least` + 6 words drawn from
   `words` (w0, w1, ...), by an LCG from `seed` */
static void write_text(const char *name, int lines, int least, unsigned words, uint64_t seed) {
  char *text = malloc(1 << 16);
  size_t n = 0;
  uint64_t s = seed;
  for (int line = 0; line < lines; line++) {
    for (int k = 0; k < least + line % 7; k++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      n += (size_t)snprintf(text + n, 64, "%sw%u", k ? " " : "", (unsigned)(s >> 33) % words);
    }
    text[n++] = '\n';
  }
  tu_write(path_in(name), text, n);
  free(text);
}

START_TEST(overlap_sums_as_after) {
  gen("toy", "120", "5", "ovtoy.txt", NULL);
  gen("toy", "33", "6", "ovtoy33.txt", NULL);
  write_text("ovlm.txt", 120, 4, 500, 3);
  overlap_same("ovlm", (const char *const[]){model("lstm_lm.vf"), "--format", "text", "--train", path_in("ovlm.txt"), "--dim",
                                             "E=8", "--dim", "H=8", "--batch", "16", "--epochs", "1", "--precision", "double",
                                             NULL});
  overlap_same("ovtree", (const char *const[]){model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("ovtoy.txt"),
                                               "--dev", path_in("ovtoy33.txt"), "--dim", "E=12", "--dim", "H=16", "--batch",
                                               "32", "--epochs", "2", "--precision", "double", "--dropout", "0.3", NULL});
  overlap_same("ovtree33", (const char *const[]){model("treelstm.vf"), "--format", "ptb-tree", "--train",
                                                 path_in("ovtoy33.txt"), "--dim", "E=12", "--dim", "H=16", "--batch", "32",
                                                 "--epochs", "2", "--precision", "double", NULL});
}
END_TEST

START_TEST(tagger_and_seq2seq_equal_one_process) {
  gen("tagger", "200", "1", "tag.cgf", "--chars");
  BOTH("tag", model("tagger_chars.vf"), "--format", "cgf", "--train", path_in("tag.cgf"), "--batch", "16", "--epochs",
       "1", "--precision", "double");
  double w = differ("tag");
  ck_assert_msg(w < 1e-9, "tagger_chars: %g", w);
  gen("translation", "200", "1", "tr.cgf", NULL);
  BOTH("s2s", model("seq2seq.vf"), "--format", "cgf", "--train", path_in("tr.cgf"), "--dim", "E=16", "--dim", "H=32",
       "--batch", "16", "--epochs", "1", "--precision", "double");
  w = differ("s2s");
  ck_assert_msg(w < 1e-9, "seq2seq: %g", w);
}
END_TEST

/* A checkpoint goes on with another number of ranks: one epoch on two ranks then one on
   one process, and one epoch on one process then one on two, each equal to two epochs
   of one process. */
START_TEST(checkpoints_cross_the_number_of_ranks) {
  gen("toy", "300", "1", "toy.txt", NULL);
#define TREE(...)                                                                                                \
  "train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("toy.txt"), "--dim", "E=12", "--dim", \
      "H=16", "--batch", "32", "--precision", "double", "--threads", "1", "--quiet", __VA_ARGS__
  RunResult r = cavs(TREE("--epochs", "2", "--save", path_in("whole.ckpt")), NULL);
  ok(&r, "two epochs");
  tu_free(&r);
  r = MPI2(TREE("--epochs", "1", "--save", path_in("x.ckpt")));
  ok(&r, "epoch 1 on two ranks");
  tu_free(&r);
  r = cavs(TREE("--epochs", "1", "--resume", path_in("x.ckpt"), "--save", path_in("x.ckpt")), NULL);
  ok(&r, "epoch 2 on one");
  tu_free(&r);
  double w = ckpt_difference(path_in("whole.ckpt"), path_in("x.ckpt"));
  ck_assert_msg(w < 1e-9, "2 ranks then 1: %g", w);
  r = cavs(TREE("--epochs", "1", "--save", path_in("y.ckpt")), NULL);
  ok(&r, "epoch 1 on one");
  tu_free(&r);
  r = MPI2(TREE("--epochs", "1", "--resume", path_in("y.ckpt"), "--save", path_in("y.ckpt")));
  ok(&r, "epoch 2 on two ranks");
  tu_free(&r);
  w = ckpt_difference(path_in("whole.ckpt"), path_in("y.ckpt"));
  ck_assert_msg(w < 1e-9, "1 then 2 ranks: %g", w);
#undef TREE
}
END_TEST

/* Errors every rank meets before training, each with its message and nothing written:
   a minibatch smaller than the ranks; ranks started with different options (mpirun's
   MPMD form: one command line a rank); a rank that cannot read its data. */
START_TEST(errors_before_training) {
  gen("toy", "40", "1", "small.txt", NULL);
#define ARGS(lr, data)                                                                                         \
  cavs_bin, "train", model("treelstm.vf"), "--format", "ptb-tree", "--train", data, "--dim", "E=8", "--dim", "H=8", \
      "--threads", "1", "--lr", lr, "--save", path_in("never.ckpt")
  RunResult r = mpi_env("2", ARGS("0.001", path_in("small.txt")), "--batch", "1", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "--batch 1 is smaller than the 2 ranks"), "%d %s", r.status,
                tu_tail(r.err, 1500));
  tu_free(&r);
  r = mpi_env("1", ARGS("0.001", path_in("small.txt")), ":", "-np", "1", ARGS("0.002", path_in("small.txt")), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "the ranks differ in their command lines"), "%d %s", r.status,
                tu_tail(r.err, 1500));
  tu_free(&r);
  r = mpi_env("1", ARGS("0.001", path_in("small.txt")), ":", "-np", "1", ARGS("0.001", path_in("missing.txt")), NULL);
  ck_assert_msg(r.status != 0 && strstr(r.err, "rank 1: ") && strstr(r.err, "missing.txt"), "%d %s", r.status,
                tu_tail(r.err, 1500));
  tu_free(&r);
  ck_assert_msg(access(path_in("never.ckpt"), F_OK) != 0, "a checkpoint was written");
#undef ARGS
}
END_TEST

/* the pid of the cavs process of rank `rank` among the children of mpirun `parent`, or 0 */
static pid_t rank_pid(pid_t parent, int rank) {
  char want[64];
  snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
  DIR *d = opendir("/proc");
  struct dirent *e;
  pid_t found = 0;
  while (d && !found && (e = readdir(d))) {
    char path[300], *stat;
    pid_t pid = (pid_t)atol(e->d_name);
    if (pid <= 0) continue;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (!(stat = tu_slurp(path, NULL))) continue;
    char *close = strrchr(stat, ')');
    int ppid = 0;
    bool child = close && sscanf(close + 2, "%*c %d", &ppid) == 1 && ppid == parent;
    free(stat);
    if (!child) continue;
    size_t len;
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    char *env = tu_slurp(path, &len);
    for (size_t i = 0; env && i < len; i += strlen(env + i) + 1)
      if (!strcmp(env + i, want)) found = pid;
    free(env);
  }
  if (d) closedir(d);
  return found;
}

/* A job started in the background, its standard error to a scratch file (*fe, errp). */
static pid_t start_job(char *const argv[], char *errp, int *fe) {
  *fe = mkstemp(errp);
  ck_assert(*fe >= 0);
  pid_t pid = fork();
  ck_assert(pid >= 0);
  if (pid == 0) {
    dup2(*fe, 2);
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0), dup2(null, 1);
    execv(argv[0], argv);
    _exit(127);
  }
  return pid;
}

/* Waits until `path` exists (the first epoch's checkpoint), at most a minute. */
static bool wait_for(const char *path) {
  for (int i = 0; i < 6000; i++) {
    if (access(path, F_OK) == 0) return true;
    usleep(10000);
  }
  return false;
}

/* Waits for the job up to `limit` seconds (then kills it): whether it ended by itself,
   its status and the seconds it took. */
static bool wait_job(pid_t pid, double limit, int *st, double *secs) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pid_t w = 0;
  for (int i = 0; i < (int)(limit * 100) && w != pid; i++) {
    w = waitpid(pid, st, WNOHANG);
    if (w != pid) usleep(10000);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (w != pid) {
    kill(pid, SIGKILL);
    waitpid(pid, st, 0);
  }
  *secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  return w == pid;
}

/* Rank 1 killed (SIGKILL, as the kernel's OOM killer does) in the middle of training:
   the job ends within 10 s, not hanging, with a message naming the rank, and the
   checkpoint on disk is a complete one that resumes. */
START_TEST(killed_rank_ends_the_job) {
  gen("toy", "3000", "1", "many.txt", NULL);
  char *argv[] = {(char *)mpirun, "-np", "2", "--oversubscribe", (char *)cavs_bin, "train", model("treelstm.vf"),
                  "--format", "ptb-tree", "--train", path_in("many.txt"), "--dim", "E=16", "--dim", "H=16", "--batch", "4",
                  "--epochs", "1000", "--threads", "1", "--quiet", "--save", path_in("k.ckpt"), NULL};
  char errp[] = "/tmp/cavs-mpi-err-XXXXXX";
  int fe, st = 0;
  pid_t pid = start_job(argv, errp, &fe);
  /* a checkpoint written (the first epoch done), then rank 1 found and killed */
  pid_t victim = wait_for(path_in("k.ckpt")) ? rank_pid(pid, 1) : 0;
  for (int i = 0; i < 6000 && !victim; i++) {
    usleep(10000);
    victim = rank_pid(pid, 1);
  }
  ck_assert_msg(victim > 0, "no checkpoint, or no rank 1, after 60 s");
  ck_assert(kill(victim, SIGKILL) == 0);
  double secs;
  bool ended = wait_job(pid, 30, &st, &secs);
  char *err = tu_slurp(errp, NULL);
  close(fe), unlink(errp);
  ck_assert_msg(ended && secs < 10, "the job went on %.1f s after rank 1 was killed", secs);
  ck_assert_msg(!(WIFEXITED(st) && WEXITSTATUS(st) == 0), "the job ended well");
  ck_assert_msg(err && strstr(err, "rank 1"), "%s", tu_tail(err, 1500));
  free(err);
  RunResult r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("many.txt"), "--epochs",
                     "1", "--threads", "1", "--quiet", "--resume", path_in("k.ckpt"), NULL);
  ok(&r, "resume from the checkpoint left");
  tu_free(&r);
}
END_TEST

/* SIGTERM to mpirun in the middle of training (what a scheduler's time limit or ^C
   does): mpirun passes it to the ranks, which stop after the same step (the stop flag is
   summed with the losses), rank 0 saves and says so, and the job ends; resumed by two
   ranks, the run ends in the bytes of a run never interrupted, wherever the signal
   landed. */
START_TEST(sigterm_stops_every_rank_at_one_step) {
  gen("toy", "3000", "1", "many.txt", NULL);
  char *argv[] = {(char *)mpirun, "-np", "2", "--oversubscribe", (char *)cavs_bin, "train", model("treelstm.vf"),
                  "--format", "ptb-tree", "--train", path_in("many.txt"), "--dim", "E=8", "--dim", "H=8", "--batch", "16",
                  "--epochs", "1000", "--threads", "1", "--quiet", "--save", path_in("t.ckpt"), NULL};
  char errp[] = "/tmp/cavs-mpi-err-XXXXXX";
  int fe, st = 0;
  pid_t pid = start_job(argv, errp, &fe);
  ck_assert_msg(wait_for(path_in("t.ckpt")), "no checkpoint after 60 s");
  usleep(100000);
  ck_assert(kill(pid, SIGTERM) == 0);
  double secs;
  bool ended = wait_job(pid, 60, &st, &secs);
  char *err = tu_slurp(errp, NULL);
  close(fe), unlink(errp);
  ck_assert_msg(ended, "the job went on %.1f s after SIGTERM", secs);
  ck_assert_msg(err && strstr(err, "interrupted") && strstr(err, "rank 0"), "%s", tu_tail(err, 1500));
  free(err);
  RunResult r = cavs("info", path_in("t.ckpt"), NULL);
  ok(&r, "info");
  int done = -1;
  const char *at = strstr(r.out, "training ");
  ck_assert_msg(at && sscanf(at, "training %d epochs done", &done) == 1 && done >= 1, "%s", r.out);
  tu_free(&r);
  r = MPI2("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("many.txt"), "--epochs", "1",
           "--threads", "1", "--quiet", "--resume", path_in("t.ckpt"), "--save", path_in("t2.ckpt"));
  ok(&r, "resumed by two ranks");
  tu_free(&r);
  char epochs[16];
  snprintf(epochs, sizeof epochs, "%d", done + 1);
  r = MPI2("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("many.txt"), "--dim", "E=8", "--dim",
           "H=8", "--batch", "16", "--epochs", epochs, "--threads", "1", "--quiet", "--save", path_in("tw.ckpt"));
  ok(&r, "never interrupted");
  tu_free(&r);
  size_t na = 0, nb = 1;
  char *a = tu_slurp(path_in("tw.ckpt"), &na), *b = tu_slurp(path_in("t2.ckpt"), &nb);
  ck_assert_msg(a && b && na == nb && !memcmp(a, b, na), "stopped after %d epochs and resumed: not the same bytes",
                done);
  free(a), free(b);
}
END_TEST

/* A language model whose state is carried (text-bptt's streams), stopped by SIGTERM in
   the middle of an epoch on two ranks: rank 0's checkpoint holds every rank's streams
   (gathered in the order of their places), so that two ranks resume to the bytes of a
   run never stopped, and one process, which reads them all, to its numbers; a
   process stopped alone resumes on two ranks, each taking its places' rows. */
START_TEST(carried_state_crosses_the_ranks) {
  FILE *f = fopen(path_in("lmc.txt"), "w");
  ck_assert(f != NULL);
  for (int i = 0; i < 4000; i++) fprintf(f, "w%d a w%d b c%d\n", i % 11, i % 7, i % 5);
  fclose(f);
#define LM(...)                                                                                                     \
  "train", model("lstm_lm.vf"), "--format", "text-bptt:9", "--train", path_in("lmc.txt"), "--dim", "E=8", "--dim", \
      "H=8", "--batch", "8", "--precision", "double", "--threads", "1", "--quiet", __VA_ARGS__
  for (int np = 2; np >= 1; np--) {
    char ck[32], again[32], other[32], whole[32];
    snprintf(ck, sizeof ck, "c%d.ckpt", np);
    snprintf(again, sizeof again, "c%d-again.ckpt", np);
    snprintf(other, sizeof other, "c%d-other.ckpt", np);
    snprintf(whole, sizeof whole, "c%d-whole.ckpt", np);
    char *argv[] = {(char *)mpirun, "-np", "2", "--oversubscribe", (char *)cavs_bin, LM("--epochs", "1000", "--save",
                    strdup(path_in(ck))), NULL};
    char errp[] = "/tmp/cavs-mpi-err-XXXXXX";
    int fe, st = 0;
    pid_t pid = start_job(np == 2 ? argv : argv + 4, errp, &fe);
    ck_assert_msg(wait_for(path_in(ck)), "no checkpoint after 60 s");
    usleep(150000);
    ck_assert(kill(pid, SIGTERM) == 0);
    double secs;
    ck_assert_msg(wait_job(pid, 60, &st, &secs), "the job went on %.1f s after SIGTERM", secs);
    close(fe), unlink(errp);
    RunResult r = cavs("info", path_in(ck), NULL);
    ok(&r, "info");
    int done = -1;
    const char *at = strstr(r.out, "training ");
    ck_assert_msg(at && sscanf(at, "training %d epochs done", &done) == 1 && done >= 1, "%s", r.out);
    /* inside an epoch (else there is nothing to carry over, and this proves less) */
    if (strstr(r.out, " graphs into epoch "))
      ck_assert_msg(strstr(r.out, "the state of 8 streams"), "%d ranks' streams not all saved:\n%s", np, r.out);
    tu_free(&r);
    char epochs[16];
    snprintf(epochs, sizeof epochs, "%d", done + 1);
    /* the same number of ranks: the bytes of the run never stopped */
    r = np == 2 ? MPI2(LM("--epochs", epochs, "--save", path_in(whole)))
                : cavs(LM("--epochs", epochs, "--save", path_in(whole)), NULL);
    ok(&r, "never stopped");
    tu_free(&r);
    r = np == 2 ? MPI2(LM("--epochs", "1", "--resume", path_in(ck), "--save", path_in(again)))
                : cavs(LM("--epochs", "1", "--resume", path_in(ck), "--save", path_in(again)), NULL);
    ok(&r, "resumed");
    tu_free(&r);
    size_t na = 0, nb = 1;
    char *a = tu_slurp(path_in(whole), &na), *b = tu_slurp(path_in(again), &nb);
    ck_assert_msg(a && b && na == nb && !memcmp(a, b, na), "%d ranks, stopped after %d epochs and resumed: not the "
                  "same bytes", np, done);
    free(a), free(b);
    /* the other number: the numbers, but for the order of the sums */
    r = np == 2 ? cavs(LM("--epochs", "1", "--resume", path_in(ck), "--save", path_in(other)), NULL)
                : MPI2(LM("--epochs", "1", "--resume", path_in(ck), "--save", path_in(other)));
    ok(&r, "resumed by the other number");
    tu_free(&r);
    char wp[4400];
    snprintf(wp, sizeof wp, "%s", path_in(whole));
    double w = ckpt_difference(wp, path_in(other));
    ck_assert_msg(w < 1e-9, "stopped on %d, resumed on %d: %g", np, 3 - np, w);
    free(argv[25]);
  }
#undef LM
}
END_TEST

/* --save-every on two ranks: the ranks save inside the epochs together (every N
   minibatches, or when rank 0's clock says: they agree in the step's sums, else one rank
   would wait alone in the gather of the carried state) and go on to the bytes of a run
   without it; the language model's carried state and the experts placed on ranks (whose
   matrices come to rank 0 for each save and go back) included. */
START_TEST(save_every_on_the_ranks) {
  FILE *f = fopen(path_in("lms.txt"), "w");
  ck_assert(f != NULL);
  for (int i = 0; i < 3000; i++) fprintf(f, "w%d a w%d b c%d\n", i % 11, i % 7, i % 5);
  fclose(f);
  gen("toy", "300", "1", "stoy.txt", NULL);
  /* (path_in's and model's buffers are one each: copies) */
  char lms[4400], stoy[4400], ckpt[4400], lm_vf[4400], moe_vf[4400];
  snprintf(lms, sizeof lms, "%s", path_in("lms.txt"));
  snprintf(stoy, sizeof stoy, "%s", path_in("stoy.txt"));
  snprintf(ckpt, sizeof ckpt, "%s", path_in("se.ckpt"));
  snprintf(lm_vf, sizeof lm_vf, "%s", model("lstm_lm.vf"));
  snprintf(moe_vf, sizeof moe_vf, "%s", model("moe_tree.vf"));
  const char *const lm[] = {"train", lm_vf, "--format", "text-bptt:9", "--train", lms, "--dim", "E=8", "--dim", "H=8",
                            "--batch", "8", "--precision", "double", NULL};
  const char *const moe[] = {"train", moe_vf, "--format", "ptb-tree", "--train", stoy, "--dim", "E=6", "--dim", "H=8",
                             "--dim", "F=4", "--batch", "16", "--expert-parallel", NULL};
  const char *const *runs[] = {lm, moe};
  for (int m = 0; m < 2; m++) {
    static const char *const every[] = {NULL, "3", "0.001s"};
    char *first = NULL;
    size_t nfirst = 0;
    for (int e = 0; e < 3; e++) {
      const char *args[40];
      int n = 0;
      for (; runs[m][n]; n++) args[n] = runs[m][n];
      args[n++] = "--threads", args[n++] = "1", args[n++] = "--quiet", args[n++] = "--epochs", args[n++] = "2";
      args[n++] = "--save", args[n++] = ckpt;
      if (every[e]) args[n++] = "--save-every", args[n++] = every[e];
      args[n] = NULL;
      RunResult r = mpi_argv("2", cavs_bin, args);
      ok(&r, every[e] ? every[e] : "without --save-every");
      tu_free(&r);
      size_t nb = 0;
      char *b = tu_slurp(ckpt, &nb);
      ck_assert(b != NULL);
      if (!first) first = b, nfirst = nb;
      else {
        ck_assert_msg(nb == nfirst && !memcmp(first, b, nb), "%s --save-every %s: not the bytes of a run without it",
                      runs[m][1], every[e]);
        free(b);
      }
    }
    free(first);
  }
}
END_TEST

/* The cuda backend's ranks, on the emulated device (tests/cavs-emu: the cuda backend
   over tests/cuda_emu.cc, no GPU needed): the gradients staged through host memory
   (cavs_model_read, cavs_model_write), the dense allreduce and a table's rows; two
   ranks on the device equal one process on the CPU. */
START_TEST(cuda_ranks_on_the_emulator) {
  const char *emu = getenv("CAVS_EMU");
  ck_assert_msg(emu && access(emu, X_OK) == 0, "no tests/cavs-emu (CAVS_EMU)");
  gen("toy", "300", "1", "toy.txt", NULL);
  RunResult r = cavs("train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("toy.txt"), "--dim", "E=12",
                     "--dim", "H=16", "--batch", "32", "--epochs", "1", "--precision", "double", "--dropout", "0.3",
                     "--threads", "1", "--quiet", "--save", path_in("cpu.ckpt"), NULL);
  ok(&r, "one process on the cpu");
  tu_free(&r);
  r = mpi_env("2", emu, "train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("toy.txt"), "--dim",
              "E=12", "--dim", "H=16", "--batch", "32", "--epochs", "1", "--precision", "double", "--dropout", "0.3",
              "--threads", "1", "--quiet", "--device", "cuda", "--save", path_in("emu.ckpt"), "--log", path_in("emu.log"),
              NULL);
  ok(&r, "two ranks on the emulated cuda device");
  tu_free(&r);
  double w = ckpt_difference(path_in("cpu.ckpt"), path_in("emu.ckpt"));
  ck_assert_msg(w < 1e-9, "two cuda ranks against one cpu process: %g", w);
  /* the language model's table as rows, read and written a row at a time on the device */
  r = cavs("train", model("lstm_lm.vf"), "--format", "text-bptt:10", "--train", path_in("lm.txt"), "--dim", "E=8", "--dim",
           "H=8", "--batch", "16", "--epochs", "1", "--precision", "double", "--threads", "1", "--quiet", "--save",
           path_in("lmcpu.ckpt"), NULL);
  ok(&r, "the LM, one process on the cpu");
  tu_free(&r);
  r = mpi_env("2", emu, "train", model("lstm_lm.vf"), "--format", "text-bptt:10", "--train", path_in("lm.txt"), "--dim",
              "E=8", "--dim", "H=8", "--batch", "16", "--epochs", "1", "--precision", "double", "--threads", "1", "--quiet",
              "--device", "cuda", "--save", path_in("lmemu.ckpt"), "--log", path_in("lmemu.log"), NULL);
  ok(&r, "the LM, two ranks on the emulated cuda device");
  tu_free(&r);
  ck_assert_int_gt(last_log_int(path_in("lmemu.log"), "tables_as_rows"), 0);
  w = ckpt_difference(path_in("lmcpu.ckpt"), path_in("lmemu.ckpt"));
  ck_assert_msg(w < 1e-9, "the LM, two cuda ranks against one cpu process: %g", w);
}
END_TEST

/* --expert-parallel: each rank runs the products of its half of the experts over both
 * ranks' rows (MPI_Alltoallv), and the parameters after training equal one process's
 * (1e-9 in double: only the order of an expert's gradient sums differs), on the tree
 * with an expert layer at every vertex, with dropout and a last minibatch of one graph
 * (the rank without a graph answers the other's rows in place of its backward pass),
 * and on the language model with its layer in the push block; the log says rows went
 * between the ranks, some of them to a hot expert's replica (and none with
 * --no-expert-replicas, which equals one process too), and the experts' loads it
 * reports are one process's (and with a noisy gate, whose draws are one process's);
 * its checkpoint (every expert's matrices and moments
 * brought to rank 0) goes on in one process as one process's does; a clip's norm adds
 * every rank's experts; --grad-overlap trains the same bytes. The load-balancing loss
 * is on (its default weight, 0.01) in all of them: the ranks add up its sums before each
 * backward pass. */
START_TEST(experts_placed_equal_one_process) {
  gen("toy", "300", "1", "toy.txt", NULL);
  gen("toy", "33", "3", "toy33.txt", NULL);
  /* data parallelism alone, the balancing loss at 0.5: the ranks' sums added up, so its
     gradient on the gate is one process's (each rank's own was 0.35 off here) */
  BOTH("moed", model("moe_tree.vf"), "--format", "ptb-tree", "--train", path_in("toy33.txt"), "--dim", "E=12", "--dim",
       "H=16", "--dim", "F=8", "--batch", "16", "--epochs", "2", "--precision", "double", "--option", "balance=0.5");
  double w = differ("moed");
  ck_assert_msg(w < 1e-9, "the tree, balanced: two ranks' parameters differ from one process's by %g", w);
  BOTH("moet", model("moe_tree.vf"), "--format", "ptb-tree", "--train", path_in("toy33.txt"), "--dev", path_in("toy33.txt"),
       "--dim", "E=12", "--dim", "H=16", "--dim", "F=8", "--batch", "16", "--epochs", "2", "--precision", "double",
       "--option", "p_drop=0.2", "--expert-parallel");
  w = differ("moet");
  ck_assert_msg(w < 1e-9, "the tree, experts placed: two ranks' parameters differ from one process's by %g", w);
  /* the dev set evaluated with the experts placed (each rank holds its own): one
     process's loss and accuracy; rank 1 has no graph of the last minibatch (33 of 16),
     its pass on graph 0 answering rank 0's rows, counted for nothing */
  same_dev("moet", 1e-12);
  ck_assert_int_gt(last_log_int(path_in("moet.2.log"), "expert_rows_sent"), 0);
  ck_assert_int_gt(last_log_int(path_in("moet.2.log"), "expert_rounds"), 0);
  ck_assert_int_gt(last_log_int(path_in("moet.2.log"), "expert_rows_replicated"), 0);
  /* the experts' loads are one process's: the pass of the rank without a graph of the
     last minibatch (graph 0 again) is kept out of them */
  const char *lf[] = {"expert_share_min", "expert_share_max", "expert_load_cv"};
  for (int i = 0; i < 3; i++) {
    double l1 = last_log_first(path_in("moet.1.log"), lf[i]), l2 = last_log_first(path_in("moet.2.log"), lf[i]);
    ck_assert_msg(fabs(l1 - l2) <= 1e-12, "%s: one process %.17g, two ranks %.17g", lf[i], l1, l2);
  }
  /* its checkpoint, written by rank 0 after every expert's matrices and Adam moments
     came from their ranks, goes on in one process as one process's own does */
  for (int k = 1; k <= 2; k++) {
    RunResult r = cavs("train", model("moe_tree.vf"), "--format", "ptb-tree", "--train", path_in("toy33.txt"), "--dim",
                       "E=12", "--dim", "H=16", "--dim", "F=8", "--batch", "16", "--epochs", "1", "--precision",
                       "double", "--option", "p_drop=0.2", "--threads", "1", "--quiet",
                       "--resume", path_in(k == 1 ? "moet.1" : "moet.2"), "--save",
                       path_in(k == 1 ? "moet.1.more" : "moet.2.more"), NULL);
    ok(&r, "an epoch more in one process");
    tu_free(&r);
  }
  w = ckpt_difference(path_in("moet.1.more"), path_in("moet.2.more"));
  ck_assert_msg(w < 1e-9, "the tree, experts placed, then an epoch in one process: %g off one process's", w);
  /* and resumed by two ranks with the experts placed (each reads its own experts of the
     checkpoint alone): the one process's epoch more again */
  RunResult r2 = MPI2("train", model("moe_tree.vf"), "--format", "ptb-tree", "--train", path_in("toy33.txt"), "--dim",
                     "E=12", "--dim", "H=16", "--dim", "F=8", "--batch", "16", "--epochs", "1", "--precision", "double",
                     "--option", "p_drop=0.2", "--threads", "1", "--quiet", "--expert-parallel",
                     "--resume", path_in("moet.2"), "--save", path_in("moet.2.placed"));
  ok(&r2, "an epoch more on two ranks, the experts placed");
  tu_free(&r2);
  w = ckpt_difference(path_in("moet.1.more"), path_in("moet.2.placed"));
  ck_assert_msg(w < 1e-9, "the tree, resumed by two ranks with the experts placed: %g off one process's", w);
  /* without replicas: every expert's rows on its own rank */
  BOTH("moetn", model("moe_tree.vf"), "--format", "ptb-tree", "--train", path_in("toy33.txt"), "--dim", "E=12", "--dim",
       "H=16", "--dim", "F=8", "--batch", "16", "--epochs", "2", "--precision", "double", 
       "--expert-parallel", "--no-expert-replicas");
  w = differ("moetn");
  ck_assert_msg(w < 1e-9, "the tree, no replicas: two ranks' parameters differ from one process's by %g", w);
  ck_assert_int_eq(last_log_int(path_in("moetn.2.log"), "expert_rows_replicated"), 0);
  ck_assert_int_gt(last_log_int(path_in("moetn.2.log"), "expert_rows_sent"), 0);
  /* a rank with no row to route (its graph all leaves), without replicas: it asks for a
     send buffer of 0 bytes, and takes its part of the round all the same (it had failed
     the round with an empty message, found by a helper's differential testing) */
  const char *idle = "model idle; dim H = 2; dim X = 4; dim HH = H * H; input label : class[H]; input f : real[H];\n"
                     "param Wg[H,X], T[X,HH], W[H,H];\n"
                     "vertex r (children 1) { scatter(moe(e in top(gather(0) @ Wg, 2): f @ T[e])); }\n"
                     "vertex l (children 0) { scatter(f @ W); push(f); }\n"
                     "push (h) { loss softmax_xent(h, label); }\n";
  const char *idle_data = "graph\n0 r ; label=1 f=-0.8,-0.5\nend\ngraph\n0 l ; label=1 f=0.3,0.1\n1 l ; label=0\nend\n";
  tu_write(path_in("idle.vf"), idle, strlen(idle));
  tu_write(path_in("idle.cgf"), idle_data, strlen(idle_data));
  BOTH("idle", path_in("idle.vf"), "--format", "cgf", "--train", path_in("idle.cgf"), "--batch", "2", "--epochs", "2",
       "--precision", "double", "--expert-parallel", "--no-expert-replicas");
  w = differ("idle");
  ck_assert_msg(w < 1e-9, "a rank without rows, no replicas: two ranks' parameters differ from one process's by %g", w);
  write_text("moelm.txt", 60, 3, 200, 7);
  BOTH("moel", model("moe_lm.vf"), "--format", "text-bptt:8", "--train", path_in("moelm.txt"), "--dim", "E=8", "--dim",
       "H=8", "--dim", "F=6", "--batch", "6", "--epochs", "2", "--precision", "double", 
       "--clip", "0.05", "--expert-parallel");
  w = differ("moel");
  ck_assert_msg(w < 1e-9, "the language model, experts placed: two ranks' parameters differ from one process's by %g", w);
  ck_assert_int_gt(last_log_int(path_in("moel.2.log"), "expert_rows_sent"), 0);
  /* Shazeer et al.'s noisy gate (bench/moe_lm_noisy.vf; its Wn of zeros scales the
     draws by softplus(0) = log 2): the draws keyed by the whole minibatch's vertex
     numbers, so each rank draws for its rows what one process does, and routes them
     as it does */
  char noisy[4400];
  snprintf(noisy, sizeof noisy, "%s/bench/moe_lm_noisy.vf", top);
  BOTH("moen", noisy, "--format", "text-bptt:8", "--train", path_in("moelm.txt"), "--dim", "E=8", "--dim", "H=8", "--dim",
       "F=6", "--batch", "6", "--epochs", "2", "--precision", "double", "--expert-parallel");
  w = differ("moen");
  ck_assert_msg(w < 1e-9, "the noisy gate, experts placed: two ranks' parameters differ from one process's by %g", w);
  ck_assert_int_gt(last_log_int(path_in("moen.2.log"), "expert_rows_sent"), 0);
  /* with the dense gradients summed during the backward pass: the same bytes (the
     placed experts' tables left out of the buckets; the rank without a graph of the
     last minibatch answering rows, its groups sent at the end) */
  overlap_same("ovmoe", (const char *const[]){model("moe_tree.vf"), "--format", "ptb-tree", "--train", path_in("toy33.txt"),
                                              "--dim", "E=12", "--dim", "H=16", "--dim", "F=8", "--batch", "16",
                                              "--epochs", "2", "--precision", "double", 
                                              "--expert-parallel", NULL});
}
END_TEST

/* --expert-parallel on the cuda backend, on the emulated device (tests/cavs-emu): the
 * rows the ranks send and receive, the replicas' matrices and their gradients going
 * home, and the checkpoint's gather of every expert's matrices and moments, all staged
 * through host memory; a clip's norm adds each rank's own experts' squares. Two ranks
 * on the device equal one process on the cpu (1e-9 in double), on the tree with
 * dropout, a dev set, replicas and a last minibatch of one graph, and on the language
 * model with a clip; the tree's checkpoint goes on in one cpu process as the cpu's
 * own does. */
/* `train ARGS` as one process on the cpu (name.1, name.1.log), then as two ranks of
   tests/cavs-emu on the emulated cuda device with --expert-parallel (name.2,
   name.2.log); the second's parameters' worst relative difference from the first's */
static double cpu_then_emulated_experts(const char *emu, const char *name, const char *const *args) {
  char save[2][4400], log[2][4500];
  char *argv[64];
  for (int k = 0; k < 2; k++) {
    snprintf(save[k], sizeof save[k], "%s/%s.%d", dir, name, k + 1);
    snprintf(log[k], sizeof log[k], "%s/%s.%d.log", dir, name, k + 1);
    int n = 0;
    if (!k) argv[n++] = (char *)cavs_bin;
    argv[n++] = "train";
    for (int i = 0; args[i] && n < 50; i++) argv[n++] = (char *)args[i];
    argv[n++] = "--threads", argv[n++] = "1", argv[n++] = "--quiet";
    argv[n++] = "--save", argv[n++] = save[k], argv[n++] = "--log", argv[n++] = log[k];
    if (k) argv[n++] = "--device", argv[n++] = "cuda", argv[n++] = "--expert-parallel";
    argv[n] = NULL;
    RunResult r = k ? mpi_argv("2", emu, (const char *const *)argv) : tu_run(NULL, argv, 300);
    ok(&r, k ? "experts placed on two ranks' emulated devices" : "one process on the cpu");
    tu_free(&r);
  }
  return ckpt_difference(save[0], save[1]);
}

START_TEST(experts_placed_on_the_emulated_device) {
  const char *emu = getenv("CAVS_EMU");
  ck_assert_msg(emu && access(emu, X_OK) == 0, "no tests/cavs-emu (CAVS_EMU)");
  gen("toy", "33", "3", "toy33.txt", NULL);
  char toy[4400], text[4400], mtree[4400], mlm[4400];
  snprintf(toy, sizeof toy, "%s", path_in("toy33.txt"));
  snprintf(text, sizeof text, "%s", path_in("eclm.txt"));
  snprintf(mtree, sizeof mtree, "%s", model("moe_tree.vf"));
  snprintf(mlm, sizeof mlm, "%s", model("moe_lm.vf"));
  const char *tree[] = {mtree, "--format", "ptb-tree", "--train", toy, "--dim", "E=12", "--dim", "H=16", "--dim", "F=8",
                        "--batch", "16", "--precision", "double", "--option", "p_drop=0.2",
                        "--epochs", "2", "--dev", toy, NULL};
  double w = cpu_then_emulated_experts(emu, "ect", tree);
  ck_assert_msg(w < 1e-9, "the tree, experts placed on two cuda ranks: %g off one cpu process", w);
  ck_assert_int_gt(last_log_int(path_in("ect.2.log"), "expert_rows_sent"), 0);
  ck_assert_int_gt(last_log_int(path_in("ect.2.log"), "expert_rows_replicated"), 0);
  same_dev("ect", 1e-12);
  /* both checkpoints an epoch more in one cpu process (the moments too) */
  const char *more[40];
  int n = 0;
  for (; tree[n] && strcmp(tree[n], "--epochs"); n++) more[n] = tree[n];
  more[n++] = "--epochs", more[n++] = "1", more[n++] = "--threads", more[n++] = "1", more[n++] = "--quiet";
  for (int k = 0; k < 2; k++) {
    more[n] = "--resume", more[n + 1] = path_in(k ? "ect.2" : "ect.1");
    more[n + 2] = "--save", more[n + 3] = path_in(k ? "ect.2.more" : "ect.1.more"), more[n + 4] = NULL;
    char *argv[44];
    argv[0] = (char *)cavs_bin, argv[1] = "train";
    for (int i = 0; i <= n + 4; i++) argv[i + 2] = (char *)more[i];
    RunResult r = tu_run(NULL, argv, 300);
    ok(&r, "an epoch more in one cpu process");
    tu_free(&r);
  }
  w = ckpt_difference(path_in("ect.1.more"), path_in("ect.2.more"));
  ck_assert_msg(w < 1e-9, "the tree's checkpoint from two cuda ranks, an epoch more: %g off the cpu's", w);
  write_text("eclm.txt", 60, 3, 200, 7);
  const char *lm[] = {mlm, "--format", "text-bptt:8", "--train", text, "--dim", "E=8",
                      "--dim", "H=8", "--dim", "F=6", "--batch", "6", "--epochs", "2", "--precision", "double",
                      "--clip", "0.05", NULL};
  w = cpu_then_emulated_experts(emu, "ecl", lm);
  ck_assert_msg(w < 1e-9, "the language model, experts placed on two cuda ranks, clipped: %g off one cpu process", w);
  ck_assert_int_gt(last_log_int(path_in("ecl.2.log"), "expert_rows_sent"), 0);
}
END_TEST

/* Built without MPI: a launcher's environment of several processes is refused. */
START_TEST(without_mpi_refuses_ranks) {
  gen("toy", "40", "1", "small.txt", NULL);
  char *env[] = {"OMPI_COMM_WORLD_SIZE=2", NULL};
  RunResult r = cavs_env(env, "train", model("treelstm.vf"), "--format", "ptb-tree", "--train", path_in("small.txt"),
                         "--epochs", "1", "--threads", "1", "--save", path_in("never.ckpt"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "built without MPI") && strstr(r.err, "2 processes"), "%d %s", r.status,
                tu_tail(r.err, 1500));
  ck_assert(access(path_in("never.ckpt"), F_OK) != 0);
  tu_free(&r);
}
END_TEST

int main(void) {
  if (cli_init("mpi")) return 1;
  mpirun = getenv("MPIRUN");
  /* Open MPI refuses root unless told both of these (CI and containers run as root) */
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  Suite *s = suite_create("mpi");
  TCase *tc = tcase_create("mpi");
  tcase_set_timeout(tc, 600);
  if (mpirun && *mpirun) {
    tcase_add_test(tc, treelstm_equals_one_process);
    tcase_add_test(tc, lstm_lm_table_as_rows);
    tcase_add_test(tc, overlap_sums_as_after);
    tcase_add_test(tc, tagger_and_seq2seq_equal_one_process);
    tcase_add_test(tc, checkpoints_cross_the_number_of_ranks);
    tcase_add_test(tc, cuda_ranks_on_the_emulator);
    tcase_add_test(tc, experts_placed_equal_one_process);
    tcase_add_test(tc, experts_placed_on_the_emulated_device);
    tcase_add_test(tc, errors_before_training);
    tcase_add_test(tc, killed_rank_ends_the_job);
    tcase_add_test(tc, sigterm_stops_every_rank_at_one_step);
  tcase_add_test(tc, carried_state_crosses_the_ranks);
  tcase_add_test(tc, save_every_on_the_ranks);
  } else {
    tcase_add_test(tc, without_mpi_refuses_ranks);
  }
  suite_add_tcase(s, tc);
  return tu_run_suite_shared(s, dir);
}

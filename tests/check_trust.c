/* check_trust.c: files from someone else. A checkpoint crafted to run code or to write
 * outside the cache, a cache planted or opened up by another user, a broken cache entry,
 * and file names that would break out of the generated code's strings and comments:
 * each is refused with a message or handled, and none runs code or writes where it
 * should not. The checkpoints are made by editing a real one field by field and
 * recomputing its checksum, as an attacker would. */
#include "cavs.h"
#include "cli.h"

#include <dlfcn.h>
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <sys/file.h>
#include <zlib.h>

/* Every checkpoint this suite reads is read both ways, whole (cavs_ckpt_read) and
 * opened (cavs_ckpt_open: streamed for its checksum, its values read when applied),
 * which must refuse it with the same message or take it alike; the test goes on with
 * the one read whole. */
static cavs_ckpt *read_both(const char *path, char *err, size_t errlen) {
  char oerr[512] = "";
  cavs_ckpt *o = cavs_ckpt_open(path, oerr, sizeof oerr), *k = cavs_ckpt_read(path, err, errlen);
  ck_assert_msg(!o == !k, "%s: %s whole, %s opened (%s)", path, k ? "taken" : "refused", o ? "taken" : "refused",
                o ? err : oerr);
  if (!k) {
    ck_assert_msg(!strncmp(err, oerr, errlen - 1), "%s: refused whole: %s; opened: %s", path, err, oerr);
    return NULL;
  }
  ck_assert_str_eq(cavs_ckpt_model(o), cavs_ckpt_model(k));
  ck_assert_str_eq(cavs_ckpt_hash(o), cavs_ckpt_hash(k));
  ck_assert_str_eq(cavs_ckpt_source(o), cavs_ckpt_source(k));
  ck_assert_int_eq(cavs_ckpt_precision(o), cavs_ckpt_precision(k));
  ck_assert_int_eq(cavs_ckpt_param_count(o), cavs_ckpt_param_count(k));
  ck_assert_int_eq(cavs_ckpt_noptions(o), cavs_ckpt_noptions(k));
  ck_assert_int_eq(cavs_ckpt_carried(o, NULL), cavs_ckpt_carried(k, NULL));
  ck_assert_int_eq(cavs_ckpt_state(o)->epoch, cavs_ckpt_state(k)->epoch);
  cavs_ckpt_free(o);
  return k;
}
#define cavs_ckpt_read read_both

static void sh(const char *cmd) {
  char *argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
  RunResult r = tu_run(NULL, argv, 120);
  ck_assert_msg(r.status == 0, "%s: exit %d\n%s%s", cmd, r.status, tu_tail(r.out, 1800), tu_tail(r.err, 1800));
  tu_free(&r);
}

/* A small trained checkpoint, made once. */
static void base_ckpt(void) {
  static bool done;
  if (done) return;
  RunResult r = cavs("gen", "toy", "--graphs", "60", "--leaves", "6", "--words", "20", "--seed", "3", "-o",
                     path_in("data.txt"), NULL);
  ok(&r, "gen");
  tu_free(&r);
  char vf[4400];
  snprintf(vf, sizeof vf, "%s/dsl-examples/treelstm.vf", top);
  r = cavs("train", vf, "--format", "ptb-tree", "--train", path_in("data.txt"), "--dim", "E=4", "--dim", "H=4",
           "--epochs", "1", "--quiet", "--threads", "1", "--save", path_in("base.ckpt"), NULL);
  ok(&r, "train");
  tu_free(&r);
  done = true;
}

/* ---- editing a checkpoint as an attacker would (the layout is in ckpt.c) ---- */

typedef struct Ckpt {
  unsigned char *p;
  size_t n;
} Ckpt;

static uint32_t rd32(const Ckpt *k, size_t at) {
  uint32_t v;
  memcpy(&v, k->p + at, 4);
  return v;
}

/* Offset of field `which` of the header strings: 0 model, 1 hash, 2 source; 3 is the
 * byte after them (the precision). */
static size_t str_at(const Ckpt *k, int which) {
  size_t at = 12;
  for (int i = 0; i < which; i++) at += 4 + rd32(k, at);
  return at;
}

/* Replaces bytes [at, at+len) with `with` (wlen bytes) and recomputes the checksum. */
static void ck_splice(Ckpt *k, size_t at, size_t len, const void *with, size_t wlen) {
  size_t n = k->n - len + wlen;
  unsigned char *p = malloc(n);
  memcpy(p, k->p, at);
  memcpy(p + at, with, wlen);
  memcpy(p + at + wlen, k->p + at + len, k->n - at - len);
  free(k->p);
  k->p = p;
  k->n = n;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n - 8; i++) h = (h ^ p[i]) * 1099511628211ull;
  memcpy(p + n - 8, &h, 8);
}

static void set_str(Ckpt *k, int which, const char *s) {
  size_t at = str_at(k, which), old = 4 + rd32(k, at), n = strlen(s);
  unsigned char *f = malloc(4 + n);
  uint32_t len = (uint32_t)n;
  memcpy(f, &len, 4);
  memcpy(f + 4, s, n);
  ck_splice(k, at, old, f, 4 + n);
  free(f);
}

static Ckpt load_base(void) {
  base_ckpt();
  Ckpt k;
  k.p = (unsigned char *)tu_slurp(path_in("base.ckpt"), &k.n);
  return k;
}

static void save(const Ckpt *k, const char *name) { tu_write(path_in(name), (const char *)k->p, k->n); }

/* eval on a crafted checkpoint with a fresh cache: exit 1, the message, and no file in
 * the cache or beside it. */
static void refused(const char *name, const char *msg) {
  sh("rm -rf \"$CAVS_CACHE\"");
  RunResult r = cavs("eval", path_in(name), "--data", path_in("data.txt"), NULL);
  ck_assert_msg(r.status == 1, "%s: exit %d\n%s", name, r.status, tu_tail(r.err, 1800));
  ck_assert_msg(strstr(r.err, msg), "%s: expected '%s' in:\n%s", name, msg, tu_tail(r.err, 1800));
  ck_assert_msg(entries(getenv("CAVS_CACHE")) <= 0, "%s: something was written into the cache", name);
  ck_assert_msg(access(path_in("PWNED"), F_OK) != 0, "%s: the crafted checkpoint ran code", name);
  tu_free(&r);
}

START_TEST(crafted_model_name_runs_nothing) {
  Ckpt k = load_base();
  /* a name that, unescaped, closes the string in the descriptor and adds a constructor */
  char evil[1024];
  snprintf(evil, sizeof evil,
           "treelstm\";\n__attribute__((constructor)) static void p(void) { system(\"touch %s\"); }\n"
           "static const char *q = \"",
           path_in("PWNED"));
  set_str(&k, 0, evil);
  save(&k, "evil_name.ckpt");
  refused("evil_name.ckpt", "not an identifier");
  /* info reads the checkpoint too: it must say the same, not print the name */
  RunResult r = cavs("info", path_in("evil_name.ckpt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "not an identifier"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  /* the library refuses it as well, before anything else reads it */
  char err[512];
  ck_assert_ptr_null(cavs_ckpt_read(path_in("evil_name.ckpt"), err, sizeof err));
  free(k.p);
}
END_TEST

START_TEST(crafted_name_writes_nothing_outside) {
  Ckpt k = load_base();
  set_str(&k, 0, "../../escaped");
  save(&k, "dots.ckpt");
  refused("dots.ckpt", "not an identifier");
  ck_assert_int_eq(access(path_in("escaped"), F_OK), -1);
  char up[4400];
  snprintf(up, sizeof up, "%s/../escaped", dir);
  ck_assert_int_eq(access(up, F_OK), -1);
  const char *bad[] = {"", "1abc", "a-b", "a b", "a/b", "\xc3\xa9t\xc3\xa9"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    set_str(&k, 0, bad[i]);
    save(&k, "bad_name.ckpt");
    refused("bad_name.ckpt", "not an identifier");
  }
  free(k.p);
}
END_TEST

/* The source inside the checkpoint is the compiler's input: it is parsed and checked
 * before anything is written, and must define the model the checkpoint names. */
START_TEST(crafted_source_checked_first) {
  Ckpt k = load_base();
  set_str(&k, 2, "model treelstm;\ndim H = 4;\nthis is not a model\n");
  save(&k, "bad_source.ckpt");
  refused("bad_source.ckpt", "bad_source.ckpt (the model source in the checkpoint):3:");
  set_str(&k, 2, "model treelstm;\0 hidden");
  /* set_str stops at the NUL: write the length by hand to keep the hidden part */
  size_t at = str_at(&k, 2);
  const char src[] = "model treelstm;\0hidden";
  unsigned char f[4 + sizeof src - 1];
  uint32_t len = sizeof src - 1;
  memcpy(f, &len, 4);
  memcpy(f + 4, src, sizeof src - 1);
  ck_splice(&k, at, 4 + rd32(&k, at), f, sizeof f);
  save(&k, "nul_source.ckpt");
  refused("nul_source.ckpt", "NUL byte");
  /* a valid model of another name: compiled, never loaded */
  char other[4400];
  snprintf(other, sizeof other, "%s/dsl-examples/treegru.vf", top);
  char *src2 = tu_slurp(other, NULL);
  set_str(&k, 2, src2);
  save(&k, "other_source.ckpt");
  sh("rm -rf \"$CAVS_CACHE\"");
  RunResult r = cavs("eval", path_in("other_source.ckpt"), "--data", path_in("data.txt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "defines model 'treegru', not 'treelstm'"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  free(src2);
  free(k.p);
}
END_TEST

/* Every other field is held to its range: damaged, not a crash or a huge allocation. */
/* The checkpoint k0 with `width` bytes at `at` set to v (little-endian), its checksum
 * made right: read, it is refused as damaged, the message naming `msg`. */
static void field_refused(const Ckpt *k0, size_t at, int64_t v, int width, const char *msg, size_t i) {
  Ckpt k = {malloc(k0->n), k0->n};
  memcpy(k.p, k0->p, k0->n);
  unsigned char b[8];
  memcpy(b, &v, 8);
  ck_splice(&k, at, (size_t)width, b, (size_t)width);
  save(&k, "field.ckpt");
  char err[512];
  cavs_ckpt *c = cavs_ckpt_read(path_in("field.ckpt"), err, sizeof err);
  ck_assert_msg(c == NULL, "case %zu was accepted", i);
  ck_assert_msg(strstr(err, "damaged") && strstr(err, msg), "case %zu: %s", i, err);
  free(k.p);
}

START_TEST(crafted_fields_refused) {
  Ckpt k0 = load_base();
  size_t dims = str_at(&k0, 3) + 4; /* u32 precision, then u32 ndims */
  struct {
    size_t at;
    int64_t v;
    int width;
    const char *msg;
  } cases[] = {
      {str_at(&k0, 3), 7, 4, "precision"},
      {dims, 17, 4, "dims (at most"},
      /* the first dim's value: its name is a str after the count */
      {0, 0, 8, "dim"},
      {0, -5, 8, "dim"},
      {0, (int64_t)1 << 40, 8, "dim"},
      {1, 'x', 1, "hash"},
  };
  size_t first_val = dims + 4 + 4 + rd32(&k0, dims + 4);
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    if (cases[i].at == 0) cases[i].at = first_val;
    if (cases[i].at == 1) cases[i].at = str_at(&k0, 1) + 4; /* a byte of the hash */
    field_refused(&k0, cases[i].at, cases[i].v, cases[i].width, cases[i].msg, i);
  }
  /* a vocabulary word with a space in it: no loader makes one */
  size_t at = dims + 4;
  for (uint32_t i = 0, nd = rd32(&k0, dims); i < nd; i++) at += 4 + rd32(&k0, at) + 8;
  ck_assert_uint_gt(rd32(&k0, at), 2); /* the word count, then the first word */
  Ckpt k = {malloc(k0.n), k0.n};
  memcpy(k.p, k0.p, k0.n);
  ck_splice(&k, at + 4 + 4, 1, " ", 1);
  save(&k, "word.ckpt");
  char werr[512];
  ck_assert_ptr_null(cavs_ckpt_read(path_in("word.ckpt"), werr, sizeof werr));
  ck_assert_msg(strstr(werr, "vocabulary word 0"), "%s", werr);
  free(k.p);
  /* not a regular file: refused at once, never read until memory runs out */
  char err[512];
  ck_assert_ptr_null(cavs_ckpt_read("/dev/zero", err, sizeof err));
  ck_assert_msg(strstr(err, "not a regular file"), "%s", err);
  free(k0.p);
}
END_TEST

/* Format 4's tail of the training state: momentum 8, schedule 4, lr_min 8, cosine_epochs
 * 4, plateau_factor 8, plateau_patience 4, lr_now 8, plateau_best 8, plateau_bad 4. */
enum { V4_TAIL = 56 };
/* Format 5's options after it: base.ckpt's model (treelstm.vf) has one, p_drop: noptions
 * 4, the name 4 + 6, the value 8. */
enum { V5_TAIL = 4 + 4 + 6 + 8 };
/* Format 6's after them: the step schedule's first decay 4, the carried state (none in
   base.ckpt: rows 4 and width 4). */
enum { V6_CARRY = 8, V6_TAIL = 4 + V6_CARRY };
/* Format 7's after them: the deviation of the chunk lengths, 8. Then format 9's reading
   of text-bptt's chunks, 4, and format 10's log record (base.ckpt, trained without a
   --log, has none: its length 0, 4). */
enum { V7_TAIL = 8, V9_TAIL = 4, V10_TAIL = 4 };

static size_t steps_at(const Ckpt *k);
/* `cavs eval` of the checkpoint `name` on data.txt: an accuracy, exit 0 (an old format
   still evaluated) */
static void evaluates(const char *name) {
  RunResult r = cavs("eval", path_in(name), "--data", path_in("data.txt"), NULL);
  ck_assert_msg(r.status == 0 && strstr(r.out, "accuracy"), "%s: %s%s", name, r.out, r.err);
  tu_free(&r);
}

/* k as format `v` (below 10) has it: the version, without format 10's tail (the last
 * field before the checksum), below 9 without format 9's before it, and below 8 the
 * moments' byte has_moments, 1 for both blocks (base.ckpt's Adam holds both; format 8
 * writes the count, 2). The other fields that format lacks are the caller's to take out
 * (their places counted with V10_TAIL and V9_TAIL). */
static void old_version(Ckpt *k, uint32_t v) {
  ck_splice(k, k->n - 8 - V10_TAIL, V10_TAIL, "", 0);
  if (v < 9) ck_splice(k, k->n - 8 - V9_TAIL, V9_TAIL, "", 0);
  size_t at = steps_at(k) + 8;
  ck_assert_uint_eq(k->p[at], 2);
  unsigned char one = 1;
  if (v < 8) ck_splice(k, at, 1, &one, 1);
  ck_splice(k, 8, 4, &v, 4);
}

/* Format 3's tail of the training state (select, the schedule, the frozen parameters:
 * 36 bytes before format 4's when none is frozen) is checked like the rest; and a
 * format 2 checkpoint, which ends before it, is still read (select 0: not recorded). */
START_TEST(format_3_fields) {
  Ckpt k0 = load_base();
  size_t tail = k0.n - 8 - V10_TAIL - V9_TAIL - V7_TAIL - V6_TAIL - V5_TAIL - V4_TAIL - 36;
  ck_assert_uint_eq(rd32(&k0, 8), 10);
  ck_assert_uint_eq(rd32(&k0, tail + 32), 0); /* no frozen parameter */
  struct {
    size_t at, len;
    uint32_t with[2];
    size_t wlen;
    const char *msg;
  } cases[] = {
      {tail, 4, {7}, 4, "training schedule"},                    /* select */
      {tail + 4 + 8 + 12, 4, {0x80000000u}, 4, "training schedule"}, /* since_best < 0 */
      {tail + 32, 4, {1, 4000}, 8, "frozen parameters"},           /* past the parameters */
      {tail + 32, 4, {2, 0}, 8, "frozen parameters"}, /* one index missing: the next field's 0 read as a repeat */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    Ckpt k = {malloc(k0.n), k0.n};
    memcpy(k.p, k0.p, k0.n);
    ck_splice(&k, cases[i].at, cases[i].len, cases[i].with, cases[i].wlen);
    save(&k, "f3.ckpt");
    char err[512];
    ck_assert_msg(cavs_ckpt_read(path_in("f3.ckpt"), err, sizeof err) == NULL, "case %zu was accepted", i);
    ck_assert_msg(strstr(err, "damaged") && strstr(err, cases[i].msg), "case %zu: %s", i, err);
    free(k.p);
  }
  /* format 2: the version, and no tail */
  Ckpt k = {malloc(k0.n), k0.n};
  memcpy(k.p, k0.p, k0.n);
  uint32_t two = 2;
  ck_splice(&k, tail, 36 + V4_TAIL + V5_TAIL + V6_TAIL + V7_TAIL, "", 0);
  old_version(&k, two);
  save(&k, "v2.ckpt");
  char err[512];
  cavs_ckpt *c = cavs_ckpt_read(path_in("v2.ckpt"), err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  ck_assert_int_eq(cavs_ckpt_state(c)->select, 0);
  ck_assert_int_eq(cavs_ckpt_state(c)->epoch, 1);
  cavs_ckpt_free(c);
  evaluates("v2.ckpt");
  free(k.p);
  free(k0.p);
}
END_TEST

/* k0 with the field at `at` (8 bytes) set to v, saved as `name`: one that is read. */
static void field_set(const Ckpt *k0, size_t at, int64_t v, const char *name) {
  Ckpt k = {malloc(k0->n), k0->n};
  memcpy(k.p, k0->p, k0->n);
  ck_splice(&k, at, 8, &v, 8);
  save(&k, name);
  char err[512];
  cavs_ckpt *c = cavs_ckpt_read(path_in(name), err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  cavs_ckpt_free(c);
  free(k.p);
}

/* The bits of a double, to write where a checkpoint holds one. */
static int64_t bits(double x) {
  int64_t v;
  memcpy(&v, &x, 8);
  return v;
}

/* Format 4's tail (the momentum, the schedule and its state) is bounded like the rest,
 * and so is the kind of optimizer; a format 3 checkpoint, which ends before it, is still
 * read (its decay as the step schedule, no plateau best yet), and trained on. */
START_TEST(format_4_fields) {
  Ckpt k0 = load_base();
  size_t t4 = k0.n - 8 - V10_TAIL - V9_TAIL - V7_TAIL - V6_TAIL - V5_TAIL - V4_TAIL, kind = t4 - 36 - 8 - 48 - 4;
  ck_assert_uint_eq(rd32(&k0, 8), 10);
  ck_assert_uint_eq(rd32(&k0, kind), CAVS_ADAM);
  struct {
    size_t at;
    int64_t v;
    int width;
    const char *msg;
  } cases[] = {
      {kind, CAVS_OPTIM_COUNT, 4, "optimizer settings"},
      {t4, bits(1.0), 8, "optimizer settings"}, /* momentum */
      {t4, bits(NAN), 8, "optimizer settings"},
      {t4 + 8, CAVS_SCHED_COUNT, 4, "learning-rate schedule"},
      {t4 + 12, bits(-1), 8, "learning-rate schedule"}, /* lr_min */
      {t4 + 12, bits(INFINITY), 8, "learning-rate schedule"},
      {t4 + 20, CAVS_MAX_EPOCHS + 1L, 4, "learning-rate schedule"}, /* cosine_epochs */
      {t4 + 24, bits(1.0), 8, "learning-rate schedule"},            /* plateau_factor */
      {t4 + 32, 1000001, 4, "learning-rate schedule"},              /* plateau_patience */
      {t4 + 32, 0x80000000u, 4, "learning-rate schedule"},
      {t4 + 36, bits(NAN), 8, "learning-rate schedule"}, /* lr_now */
      {t4 + 44, bits(-0.5), 8, "learning-rate schedule"}, /* plateau_best */
      {t4 + 52, 1, 4, "learning-rate schedule"},          /* plateau_bad, past its patience (0) */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    field_refused(&k0, cases[i].at, cases[i].v, cases[i].width, cases[i].msg, i);
  /* the tail cut short */
  Ckpt k = {malloc(k0.n), k0.n};
  memcpy(k.p, k0.p, k0.n);
  ck_splice(&k, t4 + 52, 4 + V5_TAIL + V6_TAIL + V7_TAIL, "", 0);
  save(&k, "short.ckpt");
  char err[512];
  ck_assert_ptr_null(cavs_ckpt_read(path_in("short.ckpt"), err, sizeof err));
  ck_assert_msg(strstr(err, "bad structure"), "%s", err);
  /* format 3, with a decay: the tail gone, the version 3 */
  free(k.p);
  k = (Ckpt){malloc(k0.n), k0.n};
  memcpy(k.p, k0.p, k0.n);
  uint32_t three = 3;
  double half = 0.5;
  ck_splice(&k, t4, V4_TAIL + V5_TAIL + V6_TAIL + V7_TAIL, "", 0);
  ck_splice(&k, t4 - 36 + 4, 8, &half, 8); /* lr_decay, after select */
  old_version(&k, three);
  save(&k, "v3.ckpt");
  cavs_ckpt *c = cavs_ckpt_read(path_in("v3.ckpt"), err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  const cavs_train_state *t = cavs_ckpt_state(c);
  ck_assert(t->schedule == CAVS_SCHED_STEP && t->lr_decay == 0.5 && t->plateau_best == -1 && t->optim.momentum == 0);
  cavs_ckpt_free(c);
  char vf[4400];
  snprintf(vf, sizeof vf, "%s/dsl-examples/treelstm.vf", top);
  RunResult r = cavs("train", vf, "--format", "ptb-tree", "--train", path_in("data.txt"), "--epochs", "1", "--quiet",
                     "--threads", "1", "--resume", path_in("v3.ckpt"), "--save", path_in("v4.ckpt"), NULL);
  ok(&r, "resume from format 3");
  tu_free(&r);
  c = cavs_ckpt_read(path_in("v4.ckpt"), err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  ck_assert(cavs_ckpt_state(c)->schedule == CAVS_SCHED_STEP && cavs_ckpt_state(c)->epoch == 2);
  cavs_ckpt_free(c);
  /* a plateau best of 0 in a checkpoint of another schedule (an application's zeros) is
     not where a plateau begun on a resume starts: no dev loss is below 0, and every
     epoch would cut the rate */
  field_set(&k0, t4 + 44, bits(0), "zero-best.ckpt");
  r = cavs("train", vf, "--format", "ptb-tree", "--train", path_in("data.txt"), "--dev", path_in("data.txt"), "--epochs",
           "1", "--threads", "1", "--resume", path_in("zero-best.ckpt"), "--schedule", "plateau", "--select", "loss",
           "--plateau-patience", "0", NULL);
  ok(&r, "resume on a plateau");
  ck_assert_msg(!strstr(r.out, "lr cut"), "%s", r.out);
  tu_free(&r);
  free(k.p);
  free(k0.p);
}
END_TEST

/* Format 5's options: bounded and checked on read (a count past the most a model has,
 * a name that is not one, a value that is not a probability, a name twice), and applied
 * where they are read; a format 4 checkpoint, which has none, is still read and keeps
 * the model's defaults. */
START_TEST(format_5_options) {
  Ckpt k0 = load_base();
  size_t t5 = k0.n - 8 - V10_TAIL - V9_TAIL - V7_TAIL - V6_TAIL - V5_TAIL;
  ck_assert_uint_eq(rd32(&k0, 8), 10);
  ck_assert_uint_eq(rd32(&k0, t5), 1);
  ck_assert(!memcmp(k0.p + t5 + 8, "p_drop", 6));
  struct {
    size_t at;
    int64_t v;
    int width;
    const char *msg;
  } cases[] = {
      {t5, CAVS_MAX_OPTIONS + 1, 4, "options"},
      {t5 + 8 + 6, bits(1.0), 8, "options"},
      {t5 + 8 + 6, bits(-0.1), 8, "options"},
      {t5 + 8 + 6, bits(NAN), 8, "options"},
      {t5 + 8, '-' | 'd' << 8 | 'r' << 16 | 'o' << 24, 4, "options"}, /* "-drop": not a name */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    field_refused(&k0, cases[i].at, cases[i].v, cases[i].width, cases[i].msg, i);
  /* the option twice */
  Ckpt k = {malloc(k0.n + V5_TAIL), k0.n};
  memcpy(k.p, k0.p, k0.n);
  uint32_t two = 2;
  ck_splice(&k, t5 + 4, 0, k0.p + t5 + 4, V5_TAIL - 4);
  ck_splice(&k, t5, 4, &two, 4);
  save(&k, "twice.ckpt");
  char err[512];
  ck_assert_ptr_null(cavs_ckpt_read(path_in("twice.ckpt"), err, sizeof err));
  ck_assert_msg(strstr(err, "damaged") && strstr(err, "p_drop twice"), "%s", err);
  free(k.p);
  /* a value set, read back and applied to a model */
  double half = 0.5;
  k = (Ckpt){malloc(k0.n), k0.n};
  memcpy(k.p, k0.p, k0.n);
  ck_splice(&k, t5 + 8 + 6, 8, &half, 8);
  save(&k, "half.ckpt");
  cavs_ckpt *c = cavs_ckpt_read(path_in("half.ckpt"), err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  double v = -1;
  ck_assert_int_eq(cavs_ckpt_noptions(c), 1);
  ck_assert_str_eq(cavs_ckpt_option(c, 0, &v), "p_drop");
  ck_assert(v == 0.5 && cavs_ckpt_option(c, 1, &v) == NULL);
  cavs_ckpt_free(c);
  RunResult r = cavs("info", path_in("half.ckpt"), NULL);
  ck_assert_msg(r.status == 0 && strstr(r.out, "p_drop=0.5"), "%s%s", r.out, r.err);
  tu_free(&r);
  free(k.p);
  /* `clip`, a gradient-norm clip: 3 is of its kind (read; refused when applied to a
     model without the option), -1 is not */
  for (int neg = 0; neg < 2; neg++) {
    k = (Ckpt){malloc(k0.n), k0.n};
    memcpy(k.p, k0.p, k0.n);
    uint32_t four_chars = 4;
    double clip = neg ? -1 : 3;
    ck_splice(&k, t5 + 8 + 6, 8, &clip, 8);
    ck_splice(&k, t5 + 8, 6, "clip", 4);
    ck_splice(&k, t5 + 4, 4, &four_chars, 4);
    save(&k, "clip.ckpt");
    c = cavs_ckpt_read(path_in("clip.ckpt"), err, sizeof err);
    if (neg) ck_assert_msg(c == NULL && strstr(err, "damaged (options)"), "%s", err);
    else {
      ck_assert_msg(c != NULL, "%s", err);
      ck_assert_str_eq(cavs_ckpt_option(c, 0, &v), "clip");
      ck_assert(v == 3);
      cavs_ckpt_free(c);
      r = cavs("eval", path_in("clip.ckpt"), "--data", path_in("data.txt"), NULL);
      ck_assert_msg(r.status == 1 && strstr(r.err, "no option 'clip'"), "%s%s", r.out, r.err);
      tu_free(&r);
    }
    free(k.p);
  }
  /* format 4: no options */
  k = (Ckpt){malloc(k0.n), k0.n};
  memcpy(k.p, k0.p, k0.n);
  uint32_t four = 4;
  ck_splice(&k, t5, V5_TAIL + V6_TAIL + V7_TAIL, "", 0);
  old_version(&k, four);
  save(&k, "v4.ckpt");
  c = cavs_ckpt_read(path_in("v4.ckpt"), err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  ck_assert_int_eq(cavs_ckpt_noptions(c), 0);
  cavs_ckpt_free(c);
  evaluates("v4.ckpt");
  free(k.p);
  free(k0.p);
}
END_TEST

/* Where the optimizer's step count is: after the header, the dims, the vocabulary and
 * the parameters (float: 4 bytes a value). */
static size_t steps_at(const Ckpt *k) {
  size_t at = str_at(k, 3) + 4;
  uint32_t nd = rd32(k, at);
  at += 4;
  for (uint32_t i = 0; i < nd; i++) at += 4 + rd32(k, at) + 8;
  uint32_t nw = rd32(k, at);
  at += 4;
  for (uint32_t i = 0; i < nw; i++) at += 4 + rd32(k, at);
  uint32_t np = rd32(k, at);
  at += 4;
  for (uint32_t i = 0; i < np; i++) {
    at += 4 + rd32(k, at);
    int64_t rows, cols;
    memcpy(&rows, k->p + at, 8);
    memcpy(&cols, k->p + at + 8, 8);
    at += 16 + (size_t)(rows * cols) * 4;
  }
  return at;
}

/* Format 6's first decay of the step schedule, bounded, and its carried state: bounded
 * (rows, a width, both or neither), every value finite, no shorter than it says; one of
 * another width than the model's state refused when a resume applies it; a format 5
 * checkpoint, which has neither, still read. base.ckpt is in float. */
static Ckpt with_carry(const Ckpt *k0, uint32_t rows, uint32_t w, const float *vals, size_t nvals) {
  Ckpt k = {malloc(k0->n), k0->n};
  memcpy(k.p, k0->p, k0->n);
  size_t n = 8 + sizeof(float) * nvals;
  unsigned char *f = malloc(n);
  memcpy(f, &rows, 4);
  memcpy(f + 4, &w, 4);
  if (nvals) memcpy(f + 8, vals, sizeof(float) * nvals);
  ck_splice(&k, k0->n - 8 - V10_TAIL - V9_TAIL - V7_TAIL - V6_CARRY, V6_CARRY, f, n);
  free(f);
  return k;
}
START_TEST(format_6_carried_state) {
  Ckpt k0 = load_base();
  ck_assert_uint_eq(rd32(&k0, 8), 10);
  ck_assert_uint_eq(rd32(&k0, k0.n - 8 - V10_TAIL - V9_TAIL - V7_TAIL - V6_CARRY), 0);
  field_refused(&k0, k0.n - 8 - V10_TAIL - V9_TAIL - V7_TAIL - V6_TAIL, 1000001, 4, "learning-rate schedule", 99); /* lr_decay_start */
  float v[6] = {0.5f, -1, 2, 0.25f, 3, -4};
  struct {
    uint32_t rows, w;
    size_t nvals;
    bool nan;
    const char *msg;
  } cases[] = {
      {(1u << 20) + 1, 1, 0, false, "carried state"},
      {1, 0, 0, false, "carried state"},
      {0, 3, 0, false, "carried state"},
      {1, (1u << 28) + 1, 0, false, "carried state"},
      {2, 3, 6, true, "not finite"},
      {2, 3, 5, false, "bad structure"},
  };
  char err[512];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    float w[6];
    memcpy(w, v, sizeof w);
    if (cases[i].nan) w[4] = NAN;
    Ckpt k = with_carry(&k0, cases[i].rows, cases[i].w, w, cases[i].nvals);
    save(&k, "carry.ckpt");
    ck_assert_msg(cavs_ckpt_read(path_in("carry.ckpt"), err, sizeof err) == NULL, "case %zu was accepted", i);
    ck_assert_msg(strstr(err, "damaged") && strstr(err, cases[i].msg), "case %zu: %s", i, err);
    free(k.p);
  }
  /* read, but not the width of treelstm.vf's state (2H): a resume refuses it */
  Ckpt k = with_carry(&k0, 2, 3, v, 6);
  save(&k, "carry.ckpt");
  cavs_ckpt *c = cavs_ckpt_read(path_in("carry.ckpt"), err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  cavs_ckpt_free(c);
  char vf[4400];
  snprintf(vf, sizeof vf, "%s/dsl-examples/treelstm.vf", top);
  RunResult r = cavs("train", vf, "--format", "ptb-tree", "--train", path_in("data.txt"), "--epochs", "1", "--quiet",
                     "--threads", "1", "--resume", path_in("carry.ckpt"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "carries a state of 3 values a graph"), "%d %s", r.status,
                tu_tail(r.err, 1800));
  tu_free(&r);
  free(k.p);
  /* format 5: no carried state */
  k = (Ckpt){malloc(k0.n), k0.n};
  memcpy(k.p, k0.p, k0.n);
  uint32_t five = 5;
  ck_splice(&k, k0.n - 8 - V10_TAIL - V9_TAIL - V7_TAIL - V6_TAIL, V6_TAIL + V7_TAIL, "", 0);
  old_version(&k, five);
  save(&k, "v5.ckpt");
  c = cavs_ckpt_read(path_in("v5.ckpt"), err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  cavs_ckpt_free(c);
  evaluates("v5.ckpt");
  free(k.p);
  free(k0.p);
}
END_TEST

/* Format 7's deviation of the chunk lengths (--bptt-vary): finite, 0 to 10^6, or refused;
 * one within read back; a format 6 checkpoint, which has none, read as chunks of one
 * length. */
START_TEST(format_7_chunk_lengths) {
  Ckpt k0 = load_base();
  ck_assert_uint_eq(rd32(&k0, 8), 10);
  size_t at = k0.n - 8 - V10_TAIL - V9_TAIL - V7_TAIL;
  double bad[] = {-1, 1e6 * 2, NAN, INFINITY};
  char err[512];
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int64_t bits;
    memcpy(&bits, &bad[i], 8);
    field_refused(&k0, at, bits, 8, "chunk lengths", i);
  }
  Ckpt k = {malloc(k0.n), k0.n};
  memcpy(k.p, k0.p, k0.n);
  double good = 2.5;
  ck_splice(&k, at, 8, &good, 8);
  save(&k, "v7.ckpt");
  cavs_ckpt *c = cavs_ckpt_read(path_in("v7.ckpt"), err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  ck_assert(cavs_ckpt_state(c)->bptt_vary == 2.5);
  cavs_ckpt_free(c);
  /* format 6: the tail gone, the version 6; and it still evaluates */
  uint32_t six = 6;
  ck_splice(&k, at, V7_TAIL, "", 0);
  old_version(&k, six);
  save(&k, "v6.ckpt");
  c = cavs_ckpt_read(path_in("v6.ckpt"), err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  ck_assert(cavs_ckpt_state(c)->bptt_vary == 0);
  cavs_ckpt_free(c);
  evaluates("v6.ckpt");
  free(k.p);
  free(k0.p);
}
END_TEST

/* Format 8's count of moment blocks: 0 to 2, or refused (a format 7 file's has_moments
 * 0 or 1); an Adagrad run writes one block, and a run resumed from it, or from the same
 * Adam checkpoint as format 7 wrote it (has_moments 1, both blocks), goes on as from
 * the file it came from: the same epoch line and the same checkpoint after. */
START_TEST(format_8_moment_blocks) {
  Ckpt k0 = load_base();
  size_t at = steps_at(&k0) + 8;
  ck_assert_uint_eq(k0.p[at], 2); /* base.ckpt's Adam */
  field_refused(&k0, at, 3, 1, "optimizer state", 0);
  field_refused(&k0, at, 255, 1, "optimizer state", 1);
  Ckpt k = {malloc(k0.n), k0.n};
  memcpy(k.p, k0.p, k0.n);
  old_version(&k, 7);
  save(&k, "v7.ckpt");
  field_refused(&k, at, 2, 1, "optimizer state", 2); /* two blocks is 1 in format 7 */
  char vf[4400], err[512];
  snprintf(vf, sizeof vf, "%s/dsl-examples/treelstm.vf", top);
  char *line[3] = {NULL};
  const char *from[] = {"base.ckpt", "v7.ckpt", "ada.ckpt"}, *to[] = {"r8.ckpt", "r7.ckpt", "rada.ckpt"};
  RunResult r = cavs("train", vf, "--format", "ptb-tree", "--train", path_in("data.txt"), "--dim", "E=4", "--dim",
                     "H=4", "--epochs", "1", "--quiet", "--threads", "1", "--optimizer", "adagrad", "--save",
                     path_in("ada.ckpt"), NULL);
  ok(&r, "train with adagrad");
  tu_free(&r);
  Ckpt ka;
  ka.p = (unsigned char *)tu_slurp(path_in("ada.ckpt"), &ka.n);
  ck_assert_uint_eq(ka.p[steps_at(&ka) + 8], 1);
  free(ka.p);
  /* what cavs_ckpt_moments says of each: Adam's two (format 8 or 7), Adagrad's one */
  static const int blocks[] = {2, 2, 1};
  for (int i = 0; i < 3; i++) {
    cavs_ckpt *c = cavs_ckpt_read(path_in(from[i]), err, sizeof err);
    ck_assert_msg(c != NULL, "%s", err);
    long steps = -1;
    ck_assert_int_eq(cavs_ckpt_moments(c, &steps), blocks[i]);
    ck_assert_msg(steps > 0, "%s: %ld steps", from[i], steps);
    cavs_ckpt_free(c);
  }
  for (int i = 0; i < 3; i++) {
    r = cavs("train", vf, "--format", "ptb-tree", "--train", path_in("data.txt"), "--epochs", "1", "--threads", "1",
             "--resume", path_in(from[i]), "--save", path_in(to[i]), NULL);
    ok(&r, from[i]);
    char *e = strstr(r.out, "epoch 2"), *lr = e ? strstr(e, "  lr") : NULL;
    ck_assert_msg(lr, "%s", tu_tail(r.out, 1800));
    line[i] = strndup(e, (size_t)(lr - e)); /* (not the seconds after it) */
    tu_free(&r);
    cavs_ckpt *c = cavs_ckpt_read(path_in(to[i]), err, sizeof err);
    ck_assert_msg(c != NULL, "%s", err);
    cavs_ckpt_free(c);
  }
  ck_assert_msg(!strcmp(line[0], line[1]), "resumed from format 8: %s\nfrom format 7: %s", line[0], line[1]);
  /* Adagrad's one block read back: its second epoch is a straight run's */
  r = cavs("train", vf, "--format", "ptb-tree", "--train", path_in("data.txt"), "--dim", "E=4", "--dim", "H=4",
           "--epochs", "2", "--threads", "1", "--optimizer", "adagrad", NULL);
  ok(&r, "two epochs with adagrad");
  char *e = strstr(r.out, "epoch 2");
  ck_assert_msg(e && !strncmp(e, line[2], strlen(line[2])), "resumed: %s\nstraight: %s", line[2], tu_tail(r.out, 1800));
  tu_free(&r);
  size_t n8 = 0, n7 = 0;
  char *a = tu_slurp(path_in("r8.ckpt"), &n8), *b = tu_slurp(path_in("r7.ckpt"), &n7);
  ck_assert_msg(a && b && n8 == n7 && !memcmp(a, b, n8), "the checkpoints after the two resumes differ");
  free(a), free(b);
  for (int i = 0; i < 3; i++) free(line[i]);
  free(k.p);
  free(k0.p);
}
END_TEST

/* Format 9's reading of text-bptt's chunks: 0 (not said), 1 (carried) or 2 (from zeros),
 * and never 2 with chunks of lengths that vary, or refused; 2 read back; a format 8
 * checkpoint, which has none, read as not said, and still evaluated. */
START_TEST(format_9_chunk_reading) {
  Ckpt k0 = load_base();
  ck_assert_uint_eq(rd32(&k0, 8), 10);
  size_t at = k0.n - 8 - V10_TAIL - V9_TAIL;
  ck_assert_uint_eq(rd32(&k0, at), 0); /* (ptb-tree: not said) */
  static const int64_t bad[] = {3, 0xffffffff, 0x80000000};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) field_refused(&k0, at, bad[i], 4, "reading of the chunks", i);
  Ckpt k = {malloc(k0.n), k0.n};
  memcpy(k.p, k0.p, k0.n);
  uint32_t reset = CAVS_BPTT_RESET;
  ck_splice(&k, at, 4, &reset, 4);
  save(&k, "v9.ckpt");
  char err[512];
  cavs_ckpt *c = cavs_ckpt_read(path_in("v9.ckpt"), err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  ck_assert_int_eq(cavs_ckpt_state(c)->bptt_state, CAVS_BPTT_RESET);
  cavs_ckpt_free(c);
  double vary = 2.5; /* (with chunks that vary: refused) */
  int64_t bits;
  memcpy(&bits, &vary, 8);
  field_refused(&k, at - V7_TAIL, bits, 8, "reading of the chunks", 9);
  /* format 8: the tail gone, the version 8 */
  old_version(&k, 8);
  save(&k, "v8.ckpt");
  c = cavs_ckpt_read(path_in("v8.ckpt"), err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  ck_assert_int_eq(cavs_ckpt_state(c)->bptt_state, CAVS_BPTT_UNSAID);
  cavs_ckpt_free(c);
  evaluates("v8.ckpt");
  free(k.p);
  free(k0.p);
}
END_TEST

/* Format 10's log record: a line of text read back as it was written; one with a line
 * break or a NUL in it, or longer than CAVS_MAX_CKPT_RECORD (its length alone said),
 * refused as damaged (saving refuses to write one: check_engine); a format 9
 * checkpoint, which has none, read without one and still evaluated. */
START_TEST(format_10_log_record) {
  Ckpt k0 = load_base();
  ck_assert_uint_eq(rd32(&k0, 8), 10);
  size_t at = k0.n - 8 - V10_TAIL;
  ck_assert_uint_eq(rd32(&k0, at), 0); /* (trained without a --log: none) */
  char err[512];
  cavs_ckpt *c = cavs_ckpt_read(path_in("base.ckpt"), err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  ck_assert_ptr_null(cavs_ckpt_record(c));
  cavs_ckpt_free(c);
  static const struct {
    const char *text;
    size_t n;
    bool good;
  } recs[] = {{"{\"epoch\": 1, \"train_loss\": 0.5}", 31, true},
              {"{\"epoch\": 1}\n{\"epoch\": 9}", 25, false},
              {"{\"epoch\": 1\0}", 13, false}};
  for (int i = 0; i < 3; i++) {
    Ckpt k = {malloc(k0.n), k0.n};
    memcpy(k.p, k0.p, k0.n);
    unsigned char f[64];
    uint32_t len = (uint32_t)recs[i].n;
    memcpy(f, &len, 4);
    memcpy(f + 4, recs[i].text, recs[i].n);
    ck_splice(&k, at, 4, f, 4 + recs[i].n);
    save(&k, "v10.ckpt");
    c = cavs_ckpt_read(path_in("v10.ckpt"), err, sizeof err);
    if (recs[i].good) {
      ck_assert_msg(c != NULL, "%s", err);
      ck_assert_str_eq(cavs_ckpt_record(c), recs[i].text);
      cavs_ckpt_free(c);
    } else
      ck_assert_msg(c == NULL && strstr(err, "damaged (its log record"), "record %d: %s", i, c ? "read" : err);
    free(k.p);
  }
  /* a length past the bound, the bytes not there: refused by its length, nothing held */
  field_refused(&k0, at, CAVS_MAX_CKPT_RECORD + 1, 4, "its log record", 0);
  /* format 9: the tail gone, the version 9 */
  Ckpt k = {malloc(k0.n), k0.n};
  memcpy(k.p, k0.p, k0.n);
  old_version(&k, 9);
  save(&k, "v9r.ckpt");
  c = cavs_ckpt_read(path_in("v9r.ckpt"), err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  ck_assert_ptr_null(cavs_ckpt_record(c));
  cavs_ckpt_free(c);
  evaluates("v9r.ckpt");
  free(k.p);
  free(k0.p);
}
END_TEST

/* Counters at the ends of their types pass no more (a resume overflowed them, UBSan
 * said, and wrote a checkpoint that `cavs info` called damaged): each is bounded on
 * read, and at the bound itself, going on is refused or fails cleanly, and the
 * checkpoint resumed from is untouched. */
/* Where base.ckpt's epoch count is, from the end: checksum 8, format 9's, 7's, 6's and 5's tails, format
   4's, format 3's 36, graphs_done 8, six rates 48, the kind 4, the format "ptb-tree" 12,
   batch 4, threads 4, seed 8, best 8, rng 8: the epoch */
static size_t epoch_at(const Ckpt *k) { return k->n - 8 - V10_TAIL - V9_TAIL - V7_TAIL - V6_TAIL - V5_TAIL - V4_TAIL - 36 - 8 - 48 - 4 - 12 - 4 - 4 - 8 - 8 - 8 - 4; }

/* A checkpoint saved inside an epoch keeps that epoch's totals so far in the record's
 * place (cavs train's totals_text), which the resumed run's line and --log record go on
 * from. The text is the file's: base.ckpt made a checkpoint 20 graphs into epoch 2 with
 * a crafted text, resumed. A good one is taken (no note; its loss sum and seconds in the
 * record); each bad one is said, not used, and the run goes on, never a crash. */
static double resumed_with_totals(const Ckpt *k0, const char *text, const char *note) {
  Ckpt k = {malloc(k0->n), k0->n};
  memcpy(k.p, k0->p, k0->n);
  int64_t done = 20;
  ck_splice(&k, epoch_at(&k) + 4 + 8 + 8 + 8 + 4 + 4 + 12 + 4 + 48, 8, &done, 8);
  size_t n = strlen(text);
  unsigned char *f = malloc(4 + n);
  uint32_t len = (uint32_t)n;
  memcpy(f, &len, 4);
  memcpy(f + 4, text, n);
  ck_splice(&k, k.n - 8 - V10_TAIL, V10_TAIL, f, 4 + n);
  free(f);
  save(&k, "sofar.ckpt");
  free(k.p);
  RunResult r = cavs("info", path_in("sofar.ckpt"), NULL);
  ck_assert_msg(r.status == 0 && strstr(r.out, "saved 20 graphs into epoch 2") && strstr(r.out, "epoch 2's so far"),
                "%s%s", r.out, r.err);
  tu_free(&r);
  char vf[4400];
  snprintf(vf, sizeof vf, "%s/dsl-examples/treelstm.vf", top);
  unlink(path_in("sofar.log"));
  r = cavs("train", vf, "--format", "ptb-tree", "--train", path_in("data.txt"), "--epochs", "1", "--quiet", "--threads",
           "1", "--batch", "10", "--resume", path_in("sofar.ckpt"), "--log", path_in("sofar.log"), NULL);
  ck_assert_msg(r.status == 0, "%s: exit %d: %s", text, r.status, tu_tail(r.err, 1800));
  if (note) ck_assert_msg(strstr(r.err, "the totals of epoch 2 so far, not usable (") && strstr(r.err, note) &&
                              strstr(r.err, "count the graphs from 21 on"),
                          "%s: %s", text, tu_tail(r.err, 1800));
  else ck_assert_msg(!strstr(r.err, "totals"), "%s: %s", text, tu_tail(r.err, 1800));
  tu_free(&r);
  size_t ln = 0;
  char *log = tu_slurp(path_in("sofar.log"), &ln);
  double loss = NAN, secs = NAN;
  const char *at = log ? strstr(log, "\"train_loss\": ") : NULL, *sat = log ? strstr(log, "\"seconds\": ") : NULL;
  ck_assert_msg(at && sat && sscanf(at, "\"train_loss\": %lf", &loss) == 1 && sscanf(sat, "\"seconds\": %lf", &secs) == 1,
                "%s", log ? log : "no log");
  free(log);
  if (!note) ck_assert_msg(secs >= 100, "the record's seconds %g: not the 100 the text said before", secs);
  return loss;
}

#define SO_FAR(loss, counts, tail)                                                                                    \
  "{\"epoch_so_far\": 2, \"graphs\": 20, \"batches\": 2, \"loss_sum\": " loss ", \"counts\": " counts                 \
  ", \"losses\": [[30.0, 20, 10]], \"grad_norms\": [1.0, 0.75, 2], \"seconds\": 100.0, \"launches\": 3" tail "}"

START_TEST(totals_of_an_epoch_so_far) {
  Ckpt k0 = load_base();
  /* taken: the loss of 40 more graphs in 4 minibatches of 10, over 2 + 4 */
  double a = resumed_with_totals(&k0, SO_FAR("3.0", "[20, 10, 2, 1]", ", \"expert_loads\": []"), NULL);
  double b = resumed_with_totals(&k0, SO_FAR("15.0", "[20, 10, 2, 1]", ", \"expert_loads\": []"), NULL);
  ck_assert_msg(fabs((b - a) - 12.0 / 6) < 1e-9, "the loss so far taken in as %g, not 12 / 6", b - a);
  static const struct {
    const char *text, *why;
  } bad[] = {
      {"{", "not a JSON object"},
      {"[1, 2]", "not a JSON object"},
      {"{\"epoch_so_far\": 2, \"epoch_so_far\": 2}", "not a JSON object"},
      {"{\"epoch_so_far\": 3, \"graphs\": 20}", "not of this epoch"},
      {"{\"epoch_so_far\": 2, \"graphs\": 19}", "not of the graphs done"},
      {"{\"epoch_so_far\": 2, \"graphs\": 20, \"batches\": 21}", "its minibatches"},
      {SO_FAR("3.0", "[20, 10, 2]", ", \"expert_loads\": []"), "its structure"},
      {SO_FAR("3.0", "[20, 10, 2, 1]", ""), "its structure"},
      {SO_FAR("3.0", "[20, 21, 2, 1]", ", \"expert_loads\": []"), "its counts"},
      {SO_FAR("3.0", "[20, 10, -2, 1]", ", \"expert_loads\": []"), "its counts"},
      {SO_FAR("3.0", "[9223372036854775807, 10, 2, 1]", ", \"expert_loads\": []"), "its counts"},
      {SO_FAR("null", "[20, 10, 2, 1]", ", \"expert_loads\": []"), "its loss"},
      {SO_FAR("1e999", "[20, 10, 2, 1]", ", \"expert_loads\": []"), "not a JSON object"},
      {SO_FAR("3.0", "[20, 10, 2, 1]", ", \"expert_loads\": [[1, -2]]"), "its experts' loads"},
      {SO_FAR("3.0", "[20, 10, 2, 1]", ", \"expert_loads\": [[]]"), "its experts' loads"},
      {SO_FAR("3.0", "[20, 10, 2, 1]", ", \"expert_loads\": [], \"ranks\": [1]"), "its structure"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) resumed_with_totals(&k0, bad[i].text, bad[i].why);
  free(k0.p);
}
END_TEST
#undef SO_FAR

/* The data format a checkpoint records (the one --resume reads data in): a known name,
 * text-bptt's with a chunk length from 1 to 100000; anything else is damage. */
START_TEST(data_format_names) {
  Ckpt k0 = load_base();
  size_t at = epoch_at(&k0) + 4 + 8 + 8 + 8 + 4 + 4; /* the format's length, then its bytes */
  ck_assert_uint_eq(rd32(&k0, at), 8);
  ck_assert(!memcmp(k0.p + at + 4, "ptb-tree", 8));
  static const char *const names[] = {"text-bptt:20", "text-bptt", "cgf", "text-bptt:0", "text-bptt:x", "json"};
  for (int i = 0; i < 6; i++) {
    Ckpt k = {malloc(k0.n + 16), k0.n};
    memcpy(k.p, k0.p, k0.n);
    uint32_t len = (uint32_t)strlen(names[i]);
    ck_splice(&k, at + 4, 8, names[i], len);
    ck_splice(&k, at, 4, &len, 4);
    save(&k, "fmt.ckpt");
    char err[512];
    cavs_ckpt *c = cavs_ckpt_read(path_in("fmt.ckpt"), err, sizeof err);
    if (i < 3) {
      ck_assert_msg(c != NULL, "%s: %s", names[i], err);
      ck_assert_str_eq(cavs_ckpt_state(c)->format, names[i]);
      cavs_ckpt_free(c);
    } else
      ck_assert_msg(c == NULL && strstr(err, "damaged (data format)"), "%s: %s", names[i], c ? "read" : err);
    free(k.p);
  }
  free(k0.p);
}
END_TEST

START_TEST(crafted_counters_refused) {
  Ckpt k0 = load_base();
  size_t epoch = epoch_at(&k0), tail = k0.n - 8 - V10_TAIL - V9_TAIL - V7_TAIL - V6_TAIL - V5_TAIL - V4_TAIL - 36, steps = steps_at(&k0);
  ck_assert_uint_eq(rd32(&k0, epoch), 1); /* base.ckpt: one epoch done */
  int64_t st0;
  memcpy(&st0, k0.p + steps, 8);
  ck_assert_int_eq(st0, 1); /* 60 graphs, one minibatch of 64 */
  struct {
    size_t at;
    int64_t v;
    int width;
    const char *msg;
  } cases[] = {
      {epoch, 0x7fffffff, 4, "training state"},
      {epoch, CAVS_MAX_EPOCHS + 1L, 4, "training state"},
      {epoch + 4 + 8 + 8 + 8 + 4, 0x7fffffff, 4, "training state"}, /* batch */
      {tail + 4 + 8 + 12, 0x7fffffff, 4, "training schedule"},        /* since_best, past the epochs done */
      {tail + 4 + 8 + 12, 2, 4, "training schedule"},
      {tail + 4 + 8 + 4, 0x7fffffff, 4, "training schedule"}, /* patience */
      {steps, INT64_MAX, 8, "optimizer steps"},
      {steps, CAVS_MAX_STEPS + 1, 8, "optimizer steps"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    field_refused(&k0, cases[i].at, cases[i].v, cases[i].width, cases[i].msg, i);
  /* at the bounds: read, but a run that would pass them stops with a message */
  char vf[4400];
  snprintf(vf, sizeof vf, "%s/dsl-examples/treelstm.vf", top);
  for (int which = 0; which < 2; which++) {
    Ckpt k = {malloc(k0.n), k0.n};
    memcpy(k.p, k0.p, k0.n);
    if (which == 0) {
      uint32_t e = CAVS_MAX_EPOCHS;
      ck_splice(&k, epoch, 4, &e, 4);
    } else {
      int64_t n = CAVS_MAX_STEPS;
      ck_splice(&k, steps, 8, &n, 8);
    }
    save(&k, "edge.ckpt");
    RunResult r = cavs("info", path_in("edge.ckpt"), NULL);
    ok(&r, "info at the bound");
    tu_free(&r);
    r = cavs("train", vf, "--format", "ptb-tree", "--train", path_in("data.txt"), "--epochs", "1", "--quiet", "--threads",
             "1", "--resume", path_in("edge.ckpt"), "--save", path_in("edge.ckpt"), NULL);
    ck_assert_msg(r.status == 1, "bound %d: exit %d\n%s", which, r.status, tu_tail(r.err, 1800));
    ck_assert_msg(strstr(r.err, which ? "the most a model takes" : "the most a run takes"), "%s", tu_tail(r.err, 1800));
    tu_free(&r);
    size_t n = 0;
    char *now = tu_slurp(path_in("edge.ckpt"), &n);
    ck_assert_msg(now && n == k.n && !memcmp(now, k.p, n), "bound %d: the checkpoint resumed from was changed", which);
    free(now);
    free(k.p);
  }
  free(k0.p);
}
END_TEST

/* ---- the cache ---- */

static char *entry_dir(const char *cache) {
  DIR *d = opendir(cache);
  ck_assert_ptr_nonnull(d);
  struct dirent *e;
  char *found = NULL;
  while ((e = readdir(d)))
    if (strlen(e->d_name) == 64) {
      found = malloc(strlen(cache) + 70);
      sprintf(found, "%s/%s", cache, e->d_name);
    }
  closedir(d);
  ck_assert_msg(found, "no cache entry in %s", cache);
  return found;
}

static RunResult eval_base(void) { return cavs("eval", path_in("base.ckpt"), "--data", path_in("data.txt"), NULL); }

START_TEST(unsafe_cache_refused) {
  base_ckpt();
  const char *cache = getenv("CAVS_CACHE");
  sh("rm -rf \"$CAVS_CACHE\"");
  RunResult r = eval_base();
  ok(&r, "eval");
  tu_free(&r);
  struct stat st;
  ck_assert(stat(cache, &st) == 0);
  ck_assert_msg((st.st_mode & 0777) == 0700, "the cache was created %o", st.st_mode & 0777);
  /* open to others */
  sh("chmod 0777 \"$CAVS_CACHE\"");
  r = eval_base();
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "writable by others"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  sh("chmod 0700 \"$CAVS_CACHE\"");
  /* a symbolic link in place of the cache, or of an entry */
  char link[4400], env[4500];
  snprintf(link, sizeof link, "%s/linked-cache", dir);
  symlink(cache, link);
  snprintf(env, sizeof env, "CAVS_CACHE=%s", link);
  char *e1[] = {env, NULL};
  r = cavs_env(e1, "eval", path_in("base.ckpt"), "--data", path_in("data.txt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "symbolic link"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  char *entry = entry_dir(cache);
  char moved[4500];
  snprintf(moved, sizeof moved, "%s/elsewhere", dir);
  ck_assert(rename(entry, moved) == 0);
  ck_assert(symlink(moved, entry) == 0);
  r = eval_base();
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "symbolic link"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  unlink(entry);
  ck_assert(rename(moved, entry) == 0);
  /* a directory above the cache that others can write (and is not sticky) */
  char open_dir[4400];
  snprintf(open_dir, sizeof open_dir, "%s/open", dir);
  mkdir(open_dir, 0700);
  chmod(open_dir, 0777);
  snprintf(env, sizeof env, "CAVS_CACHE=%s/cache", open_dir);
  r = cavs_env(e1, "eval", path_in("base.ckpt"), "--data", path_in("data.txt"), NULL);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "directory above it") && strstr(r.err, "writable by others"), "%s", tu_tail(r.err, 1800));
  tu_free(&r);
  /* owned by someone else: only root can arrange that */
  if (geteuid() == 0) {
    ck_assert(chown(entry, 65534, 65534) == 0);
    r = eval_base();
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "belongs to user 65534"), "%s", tu_tail(r.err, 1800));
    tu_free(&r);
    ck_assert(chown(entry, 0, 0) == 0);
    ck_assert(chown(cache, 65534, 65534) == 0);
    r = eval_base();
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "belongs to user 65534"), "%s", tu_tail(r.err, 1800));
    tu_free(&r);
    ck_assert(chown(cache, 0, 0) == 0);
  } else {
    fprintf(stderr, "unsafe_cache_refused: not root, the foreign-owner case is skipped\n");
  }
  r = eval_base();
  ok(&r, "eval after the cache was made safe again");
  tu_free(&r);
  free(entry);
}
END_TEST

/* eval of the base checkpoint with the cache at `cache`: its exit status, and its
 * message must hold `msg` (when set). */
static void eval_cache_at(const char *cache, int status, const char *msg) {
  char env[4500];
  snprintf(env, sizeof env, "CAVS_CACHE=%s", cache);
  char *e1[] = {env, NULL};
  RunResult r = cavs_env(e1, "eval", path_in("base.ckpt"), "--data", path_in("data.txt"), NULL);
  ck_assert_msg(r.status == status && (!msg || strstr(r.err, msg)), "CAVS_CACHE=%s: exit %d, expected %d%s%s:\n%s",
                cache, r.status, status, msg ? " and " : "", msg ? msg : "", tu_tail(r.err, 1800));
  tu_free(&r);
}

/* A symbolic link on the way to the cache is followed each time the cache is opened, and
 * whoever owns it can point it elsewhere whenever they like: a link of another user's is
 * refused wherever it is met (in the path as given, or in the target of a link of ours),
 * and so is a directory of theirs holding a link of ours; a link of our own is followed.
 * Only root can make a link that belongs to someone else (lchown). */
START_TEST(foreign_link_above_cache_refused) {
  base_ckpt();
  char real[4400], mine[4400], cache[4600];
  snprintf(real, sizeof real, "%s", path_in("real"));
  snprintf(mine, sizeof mine, "%s", path_in("mine"));
  ck_assert(mkdir(real, 0700) == 0 && symlink(real, mine) == 0);
  snprintf(cache, sizeof cache, "%s/cache", mine);
  eval_cache_at(cache, 0, NULL);
  if (geteuid() != 0) {
    fprintf(stderr, "foreign_link_above_cache_refused: not root, the links of another user are skipped\n");
    return;
  }
  char theirs[4400], via[4400], foreign[4400], held[4500];
  snprintf(theirs, sizeof theirs, "%s", path_in("theirs"));
  snprintf(via, sizeof via, "%s", path_in("via-theirs"));
  snprintf(foreign, sizeof foreign, "%s", path_in("foreign"));
  snprintf(held, sizeof held, "%s/link", foreign);
  ck_assert(symlink(real, theirs) == 0 && lchown(theirs, 65534, 65534) == 0);
  ck_assert(symlink(theirs, via) == 0);
  ck_assert(mkdir(foreign, 0755) == 0 && symlink(real, held) == 0 && chown(foreign, 65534, 65534) == 0);
  snprintf(cache, sizeof cache, "%s/cache", theirs);
  eval_cache_at(cache, 1, "a symbolic link of user 65534");
  snprintf(cache, sizeof cache, "%s/cache", via);
  eval_cache_at(cache, 1, "a symbolic link of user 65534");
  snprintf(cache, sizeof cache, "%s/cache", held);
  eval_cache_at(cache, 1, "belongs to user 65534");
  /* the cache itself is still ours and usable through a path of our own */
  snprintf(cache, sizeof cache, "%s/cache", real);
  eval_cache_at(cache, 0, NULL);
}
END_TEST

/* A fresh cache holding the base checkpoint's model alone: the path of its entry
 * (malloc'ed), and eval's output in *good. */
static char *fresh_entry(char **good) {
  base_ckpt();
  sh("rm -rf \"$CAVS_CACHE\"");
  RunResult r = eval_base();
  ok(&r, "eval");
  *good = strdup(r.out);
  tu_free(&r);
  return entry_dir(getenv("CAVS_CACHE"));
}

/* Two eval outputs agree but for the speed at the end. */
static void same_eval(const char *a, const char *b) {
  const char *ea = strstr(a, "roots)"), *eb = strstr(b, "roots)");
  ck_assert_msg(ea && eb && ea - a == eb - b && !strncmp(a, b, (size_t)(ea - a)), "%s\nagainst\n%s", a, b);
}

/* An object swapped in the cache is never loaded: its hash does not match the one
 * recorded when it was built, so the entry is rebuilt. A deleted or truncated object is
 * rebuilt too, not an error forever. */
START_TEST(planted_or_broken_object_rebuilt) {
  const char *cache = getenv("CAVS_CACHE");
  char *good, *entry = fresh_entry(&good), cmd[16384];
  /* a shared object whose constructor leaves a mark */
  tu_write(path_in("plant.c"), "", 0);
  FILE *f = fopen(path_in("plant.c"), "w");
  fprintf(f, "#include <stdio.h>\n__attribute__((constructor)) static void p(void) { FILE *f = fopen(\"%s\", \"w\"); if (f) fclose(f); }\n",
          path_in("PLANTED"));
  fclose(f);
  snprintf(cmd, sizeof cmd, "%s -shared -fPIC -o '%s/model.so' '%s'", tu_env("CC", "cc"), entry, path_in("plant.c"));
  sh(cmd);
  RunResult r = eval_base();
  ok(&r, "eval with a planted object");
  same_eval(r.out, good);
  ck_assert_msg(access(path_in("PLANTED"), F_OK) != 0, "the planted object was loaded");
  tu_free(&r);
  /* deleted, truncated, its record deleted: each rebuilt */
  const char *breaks[] = {"rm '%s/model.so'", "truncate -s 100 '%s/model.so'", "rm '%s/meta'"};
  for (int i = 0; i < 3; i++) {
    snprintf(cmd, sizeof cmd, breaks[i], entry);
    sh(cmd);
    r = eval_base();
    ok(&r, breaks[i]);
    same_eval(r.out, good);
    tu_free(&r);
  }
  ck_assert_int_eq(entries(cache), 1); /* rebuilt in place, no leftovers */
  free(entry);
  free(good);
}
END_TEST

/* A broken entry that holds directories (and a link out of it) is removed whole and
 * rebuilt, not "Directory not empty" on every run; the link is removed, never followed. */
START_TEST(entry_with_subdirectory_rebuilt) {
  const char *cache = getenv("CAVS_CACHE");
  char *good, *entry = fresh_entry(&good), cmd[16384];
  mkdir(path_in("outside"), 0700);
  tu_write(path_in("outside/kept"), "kept\n", 5);
  snprintf(cmd, sizeof cmd,
           "rm '%s/model.so' && mkdir -p '%s/sub/deeper' && echo x > '%s/sub/deeper/file' && "
           "ln -s '%s' '%s/sub/out' && ln -s '%s' '%s/sub/deeper/outfile'",
           entry, entry, entry, path_in("outside"), entry, path_in("outside/kept"), entry);
  sh(cmd);
  RunResult r = eval_base();
  ok(&r, "eval with a subdirectory in the broken entry");
  same_eval(r.out, good);
  tu_free(&r);
  ck_assert_int_eq(entries(cache), 1);
  snprintf(cmd, sizeof cmd, "%s/sub", entry);
  ck_assert_msg(access(cmd, F_OK) != 0, "the entry was not rebuilt afresh");
  char *kept = tu_slurp(path_in("outside/kept"), NULL);
  ck_assert_msg(kept && !strcmp(kept, "kept\n"), "a link in the entry was followed");
  free(kept);
  /* what is not ours is left, and named (only root can give a file away) */
  if (geteuid() == 0) {
    snprintf(cmd, sizeof cmd, "rm '%s/model.so' && mkdir '%s/sub' && echo x > '%s/sub/theirs' && chown 65534 '%s/sub/theirs'",
             entry, entry, entry, entry);
    sh(cmd);
    r = eval_base();
    ck_assert_msg(r.status == 2 && strstr(r.err, "cannot remove the broken cache entry") &&
                      strstr(r.err, "/sub/theirs' belongs to user 65534"),
                  "exit %d: %s", r.status, tu_tail(r.err, 1800));
    tu_free(&r);
    snprintf(cmd, sizeof cmd, "%s/sub/theirs", entry);
    ck_assert_msg(access(cmd, F_OK) == 0, "another user's file was removed");
    ck_assert(chown(cmd, 0, 0) == 0);
    r = eval_base();
    ok(&r, "eval once the file is ours");
    tu_free(&r);
  }
  free(entry);
  free(good);
}
END_TEST

/* eval of the base checkpoint with `flag` added to the model's compiler flags: a build
 * of a new cache entry. */
static void eval_building(const char *flag) {
  char more[4096];
  snprintf(more, sizeof more, "CAVS_MODEL_CFLAGS=%s %s", tu_env("CAVS_MODEL_CFLAGS", ""), flag);
  char *e1[] = {more, NULL};
  RunResult r = cavs_env(e1, "eval", path_in("base.ckpt"), "--data", path_in("data.txt"), NULL);
  ok(&r, flag);
  tu_free(&r);
}

/* Whether `name` is in the cache (not followed when a link). */
static bool in_cache(const char *name) {
  char p[4500];
  snprintf(p, sizeof p, "%s/%s", getenv("CAVS_CACHE"), name);
  struct stat st;
  return lstat(p, &st) == 0;
}

/* A build killed midway leaves its build directory (named as afile.c names unfinished
 * files: ".build.cavs-tmp-" and 16 hexadecimal digits, the last 4 a check of the rest);
 * the next build of an entry removes it, since no process holds its lock. One whose lock
 * a live process holds (a build under way) stays until that process lets go, and so does
 * everything that is not a build directory of ours: another name (a user's build-python,
 * or what mkdtemp made of build-XXXXXX, which the sweep once took; the right form with
 * the wrong check digits), a file, a link, another user's directory. */
#define KILL1 ".build.cavs-tmp-000000000001e465" /* (cv_afile_temp_name("build", 1)) */
#define KILL2 ".build.cavs-tmp-000000000002df4c"
#define LIVE ".build.cavs-tmp-000000000003e0ff"
#define AFILE ".build.cavs-tmp-000000000004dbe6"
#define ALINK ".build.cavs-tmp-000000000005dd99"
#define THEM ".build.cavs-tmp-000000000006d880"
START_TEST(abandoned_builds_removed) {
  const char *cache = getenv("CAVS_CACHE");
  char *good;
  free(fresh_entry(&good));
  free(good);
  mkdir(path_in("elsewhere"), 0700);
  tu_write(path_in("elsewhere/kept"), "kept\n", 5);
  char cmd[16384];
  snprintf(cmd, sizeof cmd,
           "cd \"$CAVS_CACHE\" && mkdir " KILL1 " " KILL2 " " LIVE " build-Kill01 build-python "
           ".build.cavs-tmp-000000000001ffff && "
           "echo 'int x;' > " KILL1 "/treelstm.c && echo x > " KILL1 "/treelstm.h && "
           "echo partial > " KILL1 "/model.so && : > " KILL1 "/cc.err && mkdir " KILL2 "/sub && "
           "echo x > " LIVE "/treelstm.c && echo notes > build-python/notes && echo x > build-Kill01/x && "
           "echo x > " AFILE " && ln -s '%s' " ALINK,
           path_in("elsewhere"));
  sh(cmd);
  char live[4500];
  snprintf(live, sizeof live, "%s/" LIVE, cache);
  int lock = open(live, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ck_assert(lock >= 0 && flock(lock, LOCK_EX | LOCK_NB) == 0);
  if (geteuid() == 0) sh("cd \"$CAVS_CACHE\" && mkdir " THEM " && echo x > " THEM "/f && chown -R 65534 " THEM);
  eval_building("-DCAVS_TEST_ABANDONED_1");
  ck_assert_msg(!in_cache(KILL1) && !in_cache(KILL2), "an abandoned build directory was left");
  const char *stay[] = {LIVE "/treelstm.c", "build-Kill01/x", "build-python/notes", ".build.cavs-tmp-000000000001ffff",
                        AFILE, ALINK, THEM "/f"};
  for (size_t i = 0; i < sizeof stay / sizeof *stay - (geteuid() != 0); i++)
    ck_assert_msg(in_cache(stay[i]), "%s was removed", stay[i]);
  ck_assert(access(path_in("elsewhere/kept"), F_OK) == 0);
  /* its builder gone, the locked one goes at the next build */
  close(lock);
  eval_building("-DCAVS_TEST_ABANDONED_2");
  ck_assert_msg(!in_cache(LIVE), "a build directory nobody holds was left");
  sh("cd \"$CAVS_CACHE\" && rm -rf build-* .build.cavs-tmp-*");
}
END_TEST

/* eval of the base checkpoint whose model is built with `flag` added (a new entry), with
 * `env` (NAME=VALUE) set too: the run's status, its stderr in err (malloc'ed). */
static int eval_building_with(const char *flag, const char *env, char **err) {
  char more[4096];
  snprintf(more, sizeof more, "CAVS_MODEL_CFLAGS=%s %s", tu_env("CAVS_MODEL_CFLAGS", ""), flag);
  char *e[] = {more, (char *)env, NULL};
  RunResult r = cavs_env(e, "eval", path_in("base.ckpt"), "--data", path_in("data.txt"), NULL);
  int status = r.status;
  *err = strdup(r.err ? r.err : "");
  tu_free(&r);
  return status;
}

/* The cache's entries (names of 64 characters, links too), their paths in the order
 * readdir gives them, up to 8; how many. */
static int entry_paths(char found[8][4500]) {
  const char *cache = getenv("CAVS_CACHE");
  DIR *d = opendir(cache);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (strlen(e->d_name) == 64 && n < 8) snprintf(found[n++], 4500, "%s/%s", cache, e->d_name);
  closedir(d);
  return n;
}

static long long tree_sum;
static int add_file(const char *path, const struct stat *st, int flag, struct FTW *f) {
  (void)path, (void)f;
  if (flag == FTW_F && S_ISREG(st->st_mode)) tree_sum += (long long)st->st_blocks * 512;
  return 0;
}
/* The bytes the regular files under `path` take (links not followed), as the cache
 * counts them. */
static long long tree_bytes_of(const char *path) {
  tree_sum = 0;
  ck_assert(nftw(path, add_file, 16, FTW_PHYS) == 0);
  return tree_sum;
}

/* Sets the time a path (a link itself, not followed) was last changed to `ago` seconds
 * before now. */
static void age(const char *path, long ago) {
  struct timespec t[2];
  clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= ago;
  t[1] = t[0];
  ck_assert_msg(utimensat(AT_FDCWD, path, t, AT_SYMLINK_NOFOLLOW) == 0, "%s: %s", path, strerror(errno));
}

/* The entry among e[0..n) that is none of the paths given (NULL-terminated). */
static char *other_entry(char e[8][4500], int n, ...) {
  for (int i = 0; i < n; i++) {
    va_list ap;
    va_start(ap, n);
    bool seen = false;
    for (const char *p; (p = va_arg(ap, const char *));) seen = seen || !strcmp(p, e[i]);
    va_end(ap);
    if (!seen) return strdup(e[i]);
  }
  ck_abort_msg("no new entry");
  return NULL;
}

/* The cache kept within $CAVS_CACHE_MAX: once a build takes it past the limit, the
 * entries and indexes used least recently go, down to nine tenths of it (a load is a
 * use); never one used in the last minute, nor anything that is not an entry or index
 * of ours (a link named as an entry, a file or directory of another name). Within the
 * limit nothing goes; a limit that is not a size is refused before anything is built. */
START_TEST(cache_pruned_least_recent_first) {
  const char *cache = getenv("CAVS_CACHE");
  char *good, *a = fresh_entry(&good), *err, cmd[16384], e[8][4500];
  free(good);
  ck_assert_msg(eval_building_with("-DCAVS_TEST_PRUNE_B", "CAVS_CACHE_MAX=1G", &err) == 0, "%s", err);
  free(err);
  ck_assert_int_eq(entry_paths(e), 2);
  char *b = other_entry(e, 2, a, NULL);
  /* what is not the cache's own: a link named as an entry (to a directory elsewhere), a
     file and a directory of other names; and an old index of a streamed file */
  mkdir(path_in("pointed"), 0700);
  tu_write(path_in("pointed/kept"), "kept\n", 5);
  const char *z = "0000000000000000000000000000000000000000000000000000000000000000",
             *o = "1111111111111111111111111111111111111111111111111111111111111111",
             *t = "2222222222222222222222222222222222222222222222222222222222222222";
  snprintf(cmd, sizeof cmd,
           "cd \"$CAVS_CACHE\" && ln -s '%s' %s && echo mine > notes && mkdir -p other streams %s && "
           "echo x > other/file && echo x > %s/file && echo mine > streams/notes && "
           "echo mine > streams/4444444444444444444444444444444444444444444444444444444444444444 && "
           "printf 'cvsidx1\\nindex' > streams/%s",
           path_in("pointed"), z, o, o, t);
  sh(cmd);
  /* (the last the index; the others stay, a file of the user's named as an index but
     not one among them) */
  const char *others[] = {"0000000000000000000000000000000000000000000000000000000000000000", "notes", "other/file",
                          "other", "1111111111111111111111111111111111111111111111111111111111111111/file",
                          "1111111111111111111111111111111111111111111111111111111111111111", "streams/notes",
                          "streams/4444444444444444444444444444444444444444444444444444444444444444",
                          "streams/2222222222222222222222222222222222222222222222222222222222222222"};
  enum { NOTHERS = sizeof others / sizeof *others };
  for (size_t i = 0; i < NOTHERS; i++) {
    snprintf(cmd, sizeof cmd, "%s/%s", cache, others[i]);
    age(cmd, 3 * 3600);
  }
  /* b used two hours ago, a half an hour ago; a third entry of about a's size, built
     with room for two and a half: the index and b go, a stays */
  age(b, 2 * 3600), age(a, 1800);
  long long one = tree_bytes_of(a);
  snprintf(cmd, sizeof cmd, "CAVS_CACHE_MAX=%lld", one * 5 / 2);
  ck_assert_msg(eval_building_with("-DCAVS_TEST_PRUNE_C", cmd, &err) == 0, "%s", err);
  free(err);
  ck_assert_msg(access(b, F_OK) != 0, "the least recently used entry was kept past the limit");
  ck_assert_msg(!in_cache(others[NOTHERS - 1]), "an old index was kept past the limit");
  ck_assert_msg(access(a, F_OK) == 0, "an entry used more recently than another was pruned first");
  for (size_t i = 0; i < NOTHERS - 1; i++) ck_assert_msg(in_cache(others[i]), "%s was removed", others[i]);
  char *kept = tu_slurp(path_in("pointed/kept"), NULL);
  ck_assert_msg(kept && !strcmp(kept, "kept\n"), "a link named as an entry was followed");
  free(kept);
  int n = entry_paths(e);
  ck_assert_int_eq(n, 4); /* a, the new one, the link, the directory without a record */
  /* all old, then a loaded: with a limit of one byte, a new build removes every entry
     but a (used a moment ago) and itself */
  for (int i = 0; i < n; i++) age(e[i], 3600);
  RunResult r = eval_base();
  ok(&r, "eval");
  tu_free(&r);
  ck_assert_msg(eval_building_with("-DCAVS_TEST_PRUNE_D", "CAVS_CACHE_MAX=1", &err) == 0, "%s", err);
  free(err);
  ck_assert_msg(access(a, F_OK) == 0, "the entry loaded a moment ago was pruned");
  ck_assert_int_eq(entry_paths(e), 4); /* a, the new one, the link, the directory */
  /* all old again, but within the limit: nothing goes */
  for (int i = 0; i < 4; i++) age(e[i], 3600);
  ck_assert_msg(eval_building_with("-DCAVS_TEST_PRUNE_E", "CAVS_CACHE_MAX=64M", &err) == 0, "%s", err);
  free(err);
  ck_assert_int_eq(entry_paths(e), 5);
  /* a limit that is not a size */
  const char *bad[] = {"CAVS_CACHE_MAX=12X", "CAVS_CACHE_MAX=-1", "CAVS_CACHE_MAX=1.5", "CAVS_CACHE_MAX=nan"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    ck_assert_int_eq(eval_building_with("-DCAVS_TEST_PRUNE_F", bad[i], &err), 1);
    ck_assert_msg(strstr(err, "CAVS_CACHE_MAX is '") && strstr(err, "give the compile cache's size"), "%s: %s", bad[i],
                  err);
    free(err);
  }
  ck_assert_int_eq(entry_paths(e), 5);
  free(a);
  free(b);
}
END_TEST

/* `cavs cache`: where the cache is and what it holds; --prune prunes it as a build does,
 * --clear removes every entry and index and nothing else; both check the cache first
 * (an unsafe one is refused) and make none that is not there. */
START_TEST(cache_command) {
  const char *cache = getenv("CAVS_CACHE");
  char *good, *a = fresh_entry(&good), cmd[16384], e[8][4500];
  free(good);
  RunResult r = cavs("cache", NULL);
  ok(&r, "cache");
  snprintf(cmd, sizeof cmd, "cache: %s\nentries: 1, ", cache);
  ck_assert_msg(!strncmp(r.out, cmd, strlen(cmd)) && strstr(r.out, "\nindexes: 0, 0 B\nlimit: 2.0 GiB (the default"),
                "%s", r.out);
  tu_free(&r);
  /* an old index and an old entry, and what is not the cache's */
  const char *t = "3333333333333333333333333333333333333333333333333333333333333333";
  const char *u = "5555555555555555555555555555555555555555555555555555555555555555"; /* (the user's) */
  snprintf(cmd, sizeof cmd, "cd \"$CAVS_CACHE\" && mkdir -p streams && printf 'cvsidx1\\nindex' > streams/%s && "
           "echo mine > notes && echo mine > streams/%s && ln -s notes %s", t, u, t);
  sh(cmd);
  snprintf(cmd, sizeof cmd, "%s/streams/%s", cache, t);
  age(cmd, 3600), age(a, 3600);
  char user[4500], user_rel[100];
  snprintf(user, sizeof user, "%s/streams/%s", cache, u);
  snprintf(user_rel, sizeof user_rel, "streams/%s", u);
  age(user, 3600);
  char *within[] = {"CAVS_CACHE_MAX=1G", NULL}, *tiny[] = {"CAVS_CACHE_MAX=1", NULL};
  r = cavs_env(within, "cache", "--prune", NULL);
  ok(&r, "cache --prune within the limit");
  ck_assert_msg(strstr(r.out, "removed: 0 entries and 0 indexes, 0 B\n") && strstr(r.out, "limit: 1.0 GiB (CAVS_CACHE_MAX)"),
                "%s", r.out);
  tu_free(&r);
  r = cavs_env(tiny, "cache", "--prune", NULL);
  ok(&r, "cache --prune past the limit");
  ck_assert_msg(strstr(r.out, "removed: 1 entry and 1 index, ") && strstr(r.out, "entries: 0, 0 B\nindexes: 0, 0 B"),
                "%s", r.out);
  tu_free(&r);
  ck_assert(access(a, F_OK) != 0 && in_cache("notes") && in_cache(t) && in_cache(user_rel));
  /* built again, then cleared: used a moment ago, it goes all the same */
  r = eval_base();
  ok(&r, "eval");
  tu_free(&r);
  r = cavs("cache", "--clear", NULL);
  ok(&r, "cache --clear");
  ck_assert_msg(strstr(r.out, "removed: 1 entry and 0 indexes, ") && strstr(r.out, "entries: 0, 0 B"), "%s", r.out);
  tu_free(&r);
  ck_assert_int_eq(entry_paths(e), 1); /* the link */
  ck_assert(in_cache("notes") && in_cache(user_rel));
  r = cavs("cache", "--clear", "--prune", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "--prune or --clear, not both"), "%d %s", r.status, r.err);
  tu_free(&r);
  /* checked first */
  sh("chmod 0777 \"$CAVS_CACHE\"");
  r = cavs("cache", "--clear", NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "writable by others"), "%d %s", r.status, r.err);
  tu_free(&r);
  sh("chmod 0700 \"$CAVS_CACHE\"");
  ck_assert(in_cache("notes"));
  /* none there: none made */
  char env[4500];
  snprintf(env, sizeof env, "CAVS_CACHE=%s", path_in("no-cache"));
  char *none[] = {env, NULL};
  r = cavs_env(none, "cache", "--prune", NULL);
  ok(&r, "cache with no cache");
  ck_assert_msg(strstr(r.out, "(not made yet)"), "%s", r.out);
  tu_free(&r);
  ck_assert(access(path_in("no-cache"), F_OK) != 0);
  sh("cd \"$CAVS_CACHE\" && rm -f notes 3333333333333333333333333333333333333333333333333333333333333333 "
     "streams/5555555555555555555555555555555555555555555555555555555555555555");
  free(a);
}
END_TEST

/* The C compiler's flags are part of the key: a model built with more flags
 * ($CAVS_MODEL_CFLAGS) gets its own entry, and one whose flags fail leaves none. */
START_TEST(model_cflags_in_cache_key) {
  base_ckpt();
  const char *cache = getenv("CAVS_CACHE"), *flags = tu_env("CAVS_MODEL_CFLAGS", "");
  sh("rm -rf \"$CAVS_CACHE\"");
  RunResult r = eval_base();
  ok(&r, "eval");
  tu_free(&r);
  ck_assert_int_eq(entries(cache), 1);
  char more[4096];
  snprintf(more, sizeof more, "CAVS_MODEL_CFLAGS=%s -DCAVS_TEST_FLAG", flags);
  char *e1[] = {more, NULL};
  for (int i = 0; i < 2; i++) {
    r = cavs_env(e1, "eval", path_in("base.ckpt"), "--data", path_in("data.txt"), NULL);
    ok(&r, "eval with another flag");
    tu_free(&r);
    ck_assert_int_eq(entries(cache), 2); /* built the first time, reused the second */
  }
  snprintf(more, sizeof more, "CAVS_MODEL_CFLAGS=%s --no-such-option", flags);
  r = cavs_env(e1, "eval", path_in("base.ckpt"), "--data", path_in("data.txt"), NULL);
  ck_assert_msg(r.status == 2 && strstr(r.err, "the C compiler failed"), "exit %d: %s", r.status, tu_tail(r.err, 1800));
  tu_free(&r);
  ck_assert_int_eq(entries(cache), 2);
}
END_TEST

/* Models are compiled -march=native, so the CPU is part of the key: a cache shared by
 * machines of different CPUs never loads one's code on the other. The second CPU is a C
 * compiler that, when asked what -march=native means (the driver's -###), answers with
 * a feature more while the file second-cpu exists, and otherwise is the real one; its
 * path stays the same, since the compiler's name is in the key too. */
START_TEST(cpu_in_cache_key) {
  base_ckpt();
  const char *cache = getenv("CAVS_CACHE");
  sh("rm -rf \"$CAVS_CACHE\"");
  FILE *f = fopen(path_in("cc-two-cpus"), "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f,
          "#!/bin/sh\n"
          "case \" $* \" in *\" -### \"*) ;; *) exec %s \"$@\" ;; esac\n"
          ": > '%s'\n"
          "%s \"$@\" || exit\n"
          "if [ -e '%s' ]; then echo ' \"-mfeature-of-the-second-cpu\"' >&2; fi\n",
          tu_env("CC", "cc"), path_in("asked"), tu_env("CC", "cc"), path_in("second-cpu"));
  fclose(f);
  ck_assert(chmod(path_in("cc-two-cpus"), 0755) == 0);
  char env[4500];
  snprintf(env, sizeof env, "CC=%s", path_in("cc-two-cpus"));
  char *e1[] = {env, NULL};
  for (int run = 0; run < 3; run++) {
    if (run == 1) tu_write(path_in("second-cpu"), "", 0);
    if (run == 2) ck_assert(unlink(path_in("second-cpu")) == 0);
    RunResult r = cavs_env(e1, "eval", path_in("base.ckpt"), "--data", path_in("data.txt"), NULL);
    ok(&r, run == 1 ? "eval on the second CPU" : "eval on the first CPU");
    tu_free(&r);
    /* a new entry for the second CPU; the first CPU's reused when back on it */
    ck_assert_int_eq(entries(cache), (run ? 2 : 1));
  }
  ck_assert_msg(access(path_in("asked"), F_OK) == 0, "the compiler was never asked what -march=native means");
}
END_TEST

/* Without CAVS_CACHE: $XDG_CACHE_HOME/cavs, then $HOME/.cache/cavs, each made 0700. */
START_TEST(default_cache_is_per_user) {
  base_ckpt();
  char xdg[4500], home[4500];
  snprintf(xdg, sizeof xdg, "XDG_CACHE_HOME=%s/xdg", dir);
  snprintf(home, sizeof home, "HOME=%s/home", dir);
  mkdir(path_in("home"), 0700);
  char *e1[] = {"CAVS_CACHE", xdg, NULL};
  RunResult r = cavs_env(e1, "eval", path_in("base.ckpt"), "--data", path_in("data.txt"), NULL);
  ok(&r, "eval with XDG_CACHE_HOME");
  tu_free(&r);
  struct stat st;
  ck_assert(stat(path_in("xdg/cavs"), &st) == 0 && (st.st_mode & 0777) == 0700);
  ck_assert_int_eq(entries(path_in("xdg/cavs")), 1);
  char *e2[] = {"CAVS_CACHE", "XDG_CACHE_HOME", home, NULL};
  r = cavs_env(e2, "eval", path_in("base.ckpt"), "--data", path_in("data.txt"), NULL);
  ok(&r, "eval with HOME");
  tu_free(&r);
  ck_assert(stat(path_in("home/.cache/cavs"), &st) == 0 && (st.st_mode & 0777) == 0700);
  ck_assert(stat(path_in("home/.cache"), &st) == 0 && (st.st_mode & 0777) == 0700);
}
END_TEST

/* A file name can hold any byte: what cavsc writes of it into the generated C (a string
 * in the descriptor, the banner comment) is escaped, so the code compiles with warnings
 * as errors and the string reads back as the exact name. */
START_TEST(file_names_escaped_in_generated_code) {
  /* directories, so that the slashes between them close and open comments */
  const char *parts[] = {"ev*", "q\"\\?\?", "\n* int x = 1; ", "*z\t\x01\xff.vf"};
  char vf[4600];
  snprintf(vf, sizeof vf, "%s", dir);
  for (int i = 0; i < 4; i++) {
    size_t n = strlen(vf);
    snprintf(vf + n, sizeof vf - n, "/%s", parts[i]);
    if (i < 3) ck_assert(mkdir(vf, 0700) == 0);
  }
  ck_assert(strstr(vf, "*/") && strstr(vf, "/*") && strstr(vf, "?\?/"));
  char src[4400];
  snprintf(src, sizeof src, "%s/dsl-examples/treefc.vf", top);
  char *text = tu_slurp(src, NULL);
  tu_write(vf, text, strlen(text));
  free(text);
  char out[4400];
  snprintf(out, sizeof out, "%s/gen", dir);
  mkdir(out, 0700);
  char *argv[] = {(char *)tu_env("CAVSC", "./cavsc"), "-o", out, vf, NULL};
  RunResult r = tu_run(NULL, argv, 60);
  ck_assert_msg(r.status == 0, "cavsc: %s", tu_tail(r.err, 1800));
  tu_free(&r);
  char cmd[16384];
  snprintf(cmd, sizeof cmd, "%s -std=c11 -O2 -Wall -Werror -fPIC -shared -I'%s/runtime' '%s/treefc.c' -o '%s/treefc.so'",
           tu_env("CC", "cc"), top, out, out);
  sh(cmd);
  snprintf(cmd, sizeof cmd, "%s/treefc.so", out);
  void *h = dlopen(cmd, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(h != NULL, "%s", dlerror());
  const cavs_desc *d = dlsym(h, "treefc_desc");
  ck_assert_ptr_nonnull(d);
  ck_assert_str_eq(d->source, vf);
  ck_assert_str_eq(d->name, "treefc");
  /* the same through standard input and --source-name */
  snprintf(cmd, sizeof cmd, "'%s' --check --source-name 'x\"*/' - < '%s'", tu_env("CAVSC", "./cavsc"), src);
  sh(cmd);
}
END_TEST

/* ---- data and vector files from someone else: their bytes in messages ---- */

/* cavs train on a file that fails to load: exit 1, the message holds `want` (the file's
   control bytes as \xNN), and no control byte, C0 or C1, of the file reaches stderr. */
static void shown_escaped(const char *name, const char *text, const char *want, const char *const *args) {
  tu_write(path_in(name), text, strlen(text));
  const char *a[16];
  int n = 0;
  for (; args[n]; n++) a[n] = args[n];
  for (; n < 16; n++) a[n] = NULL;
  RunResult r = cavs("train", a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, want), "%s: expected exit 1 and '%s', got exit %d:\n%s", name, want, r.status,
                tu_tail(r.err, 1800));
  for (const unsigned char *p = (const unsigned char *)r.err; *p; p++)
    ck_assert_msg((*p >= 0x20 || *p == '\n') && *p != 0x7f && !(p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0),
                  "%s: a control byte 0x%02x reached stderr:\n%s", name, *p, r.err);
  tu_free(&r);
}

START_TEST(control_bytes_in_messages_escaped) {
  base_ckpt();
  char vf[4400];
  snprintf(vf, sizeof vf, "%s/dsl-examples/twotype.vf", top);
  const char *cgf[] = {vf, "--format", "cgf", "--train", path_in("esc.cgf"), "--epochs", "1", "--quiet", NULL};
  shown_escaped("esc.cgf", "graph\n0 \033[2Jleaf ; word=1\nend\n", "unknown vertex type '\\x1b[2Jleaf'", cgf);
  shown_escaped("esc.cgf", "graph\n0 leaf ; word=\0337\nend\n", "word=\\x1b7 is not an integer", cgf);
  shown_escaped("esc.cgf", "graph\n0 leaf ; w\302\233ord=1\nend\n", "has no input 'w\\xc2\\x9bord'", cgf);
  snprintf(vf, sizeof vf, "%s/dsl-examples/treelstm.vf", top);
  const char *ptb[] = {vf, "--format", "ptb-tree", "--train", path_in("esc.txt"), "--epochs", "1", "--quiet", NULL};
  shown_escaped("esc.txt", "(\v99999999999999999999 (2 a) (3 b))\n", "label \\x0b99999999999999999999 at column 2", ptb);
  /* pre-trained vectors: the word, and a field that is no number; printable UTF-8 kept */
  const char *vec[] = {vf, "--format", "ptb-tree", "--train", path_in("data.txt"), "--dim", "E=3", "--dim", "H=2",
                       "--epochs", "1", "--init", NULL, NULL};
  char init[4500];
  snprintf(init, sizeof init, "emb=%s", path_in("esc.vec"));
  vec[12] = init;
  shown_escaped("esc.vec", "caf\303\251\033]0;pwned\007 1 2\n", "'caf\303\251\\x1b]0;pwned\\x07' has 2 numbers", vec);
  shown_escaped("esc.vec", "w1 1 \033[31m 3\n", "'\\x1b[31m' is not a finite number", vec);
  /* --init's line of the words it found no vector for: the data's words, shown as
     messages show a file's bytes (cavs train exits 0 here: the report is on stdout) */
  const char *words = "(2 (2 w\033[31m) (3 caf\303\251\302\233))\n";
  tu_write(path_in("escw.txt"), words, strlen(words));
  tu_write(path_in("escw.vec"), "other 1 2 3\n", 12);
  snprintf(init, sizeof init, "emb=%s", path_in("escw.vec"));
  RunResult w = cavs("train", vf, "--format", "ptb-tree", "--train", path_in("escw.txt"), "--dim", "E=3", "--dim", "H=2",
                     "--epochs", "1", "--init", init, NULL);
  ck_assert_msg(w.status == 0 && strstr(w.out, "none for 2, e.g.") && strstr(w.out, "w\\x1b[31m") &&
                    strstr(w.out, "caf\303\251\\xc2\\x9b"),
                "--init's words: exit %d:\n%s\n%s", w.status, w.out, tu_tail(w.err, 1800));
  for (const unsigned char *p = (const unsigned char *)w.out; *p; p++)
    ck_assert_msg((*p >= 0x20 || *p == '\n' || *p == '\r') && *p != 0x7f && !(p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0),
                  "--init's words: a control byte 0x%02x reached stdout:\n%s", *p, w.out);
  tu_free(&w);
  /* a training log for cavs plot: jansson's message quotes it */
  const char *log = "{\"epoch\": 1, \"loss\": \033[31m}\n";
  tu_write(path_in("esc.log"), log, strlen(log));
  RunResult r = cavs("plot", path_in("esc.log"), "-o", path_in("esc.png"), NULL);
  ck_assert_msg(r.status == 1 && strstr(r.err, "esc.log:1:22: error: not JSON: ") && strstr(r.err, "\\x1b") &&
                    !strchr(r.err, '\033'),
                "cavs plot: exit %d:\n%s", r.status, r.err);
  tu_free(&r);
}
END_TEST

/* ---- parameter files from someone else: cavs train --init-all ---- */

/* treefc at H=2, C=5 on data.txt: emb [V, 2], W [4, 2], b [2], Wc [2, 5], bc [5] */
typedef struct FcT {
  const char *name, *dtype;
  int rank;
  long shape[2], b, e;
} FcT;
static FcT fc[5];
static long fc_data; /* the bytes of the five */

static void fc_layout(void) {
  static bool done;
  if (done) return;
  base_ckpt();
  char vf[4400];
  snprintf(vf, sizeof vf, "%s/dsl-examples/treefc.vf", top);
  RunResult r = cavs("train", vf, "--format", "ptb-tree", "--train", path_in("data.txt"), "--dim", "H=2", "--dim", "C=5",
                     "--epochs", "1", "--quiet", "--threads", "1", "--save", path_in("fc.ckpt"), NULL);
  ok(&r, "train treefc");
  tu_free(&r);
  r = cavs("export", path_in("fc.ckpt"), "-o", path_in("fc.safetensors"), NULL);
  ok(&r, "export");
  tu_free(&r);
  char *text = tu_slurp(path_in("fc.safetensors"), NULL);
  long V = 0;
  const char *emb = strstr(text + 8, "\"emb\":{\"dtype\":\"F32\",\"shape\":[");
  ck_assert(emb && sscanf(strchr(emb, '[') + 1, "%ld", &V) == 1 && V > 2);
  free(text);
  FcT t[5] = {{"emb", "F32", 2, {V, 2}, 0, 0}, {"W", "F32", 2, {4, 2}, 0, 0}, {"b", "F32", 1, {2}, 0, 0},
              {"Wc", "F32", 2, {2, 5}, 0, 0}, {"bc", "F32", 1, {5}, 0, 0}};
  long at = 0;
  for (int i = 0; i < 5; i++) {
    t[i].b = at;
    at = t[i].e = at + 4 * t[i].shape[0] * (t[i].rank == 2 ? t[i].shape[1] : 1);
  }
  memcpy(fc, t, sizeof fc);
  fc_data = at;
  done = true;
}

/* A safetensors header of the n tensors t, then `extra` (more entries) before its end. */
static char *st_header(const FcT *t, int n, const char *extra) {
  static char h[8192];
  int k = snprintf(h, sizeof h, "{");
  for (int i = 0; i < n; i++) {
    char shape[64];
    if (t[i].rank == 1) snprintf(shape, sizeof shape, "%ld", t[i].shape[0]);
    else snprintf(shape, sizeof shape, "%ld,%ld", t[i].shape[0], t[i].shape[1]);
    k += snprintf(h + k, sizeof h - k, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%ld,%ld]}", i ? "," : "",
                  t[i].name, t[i].dtype, shape, t[i].b, t[i].e);
  }
  snprintf(h + k, sizeof h - k, "%s}", extra);
  return h;
}

/* The file: the header's length (or hlen when not 0), the header, `data` bytes of 0.25f
   with a NaN at float `nan_at` (-1: none). */
static void st_write(const char *name, const char *header, long data, uint64_t hlen, long nan_at) {
  size_t n = strlen(header);
  unsigned char *f = calloc(1, 8 + n + (size_t)data + 1);
  uint64_t len = hlen ? hlen : n;
  for (int i = 0; i < 8; i++) f[i] = (unsigned char)(len >> (8 * i));
  memcpy(f + 8, header, n);
  for (long i = 0; i + 4 <= data; i += 4) {
    float x = i / 4 == nan_at ? NAN : 0.25f;
    memcpy(f + 8 + n + i, &x, 4);
  }
  tu_write(path_in(name), (const char *)f, 8 + n + (size_t)data);
  free(f);
}

/* train --init-all on the file: refused with FILE: error: and the message, no escape
   byte from the file on the terminal, nothing saved. */
static void init_refused(const char *name, const char *msg) {
  char vf[4400], want[300];
  snprintf(vf, sizeof vf, "%s/dsl-examples/treefc.vf", top);
  unlink(path_in("init.ckpt"));
  RunResult r = cavs("train", vf, "--format", "ptb-tree", "--train", path_in("data.txt"), "--dim", "H=2", "--dim", "C=5",
                     "--epochs", "1", "--quiet", "--threads", "1", "--init-all", path_in(name), "--save", path_in("init.ckpt"), NULL);
  snprintf(want, sizeof want, "%s: error: ", name);
  if (!msg) {
    ok(&r, name);
  } else {
    ck_assert_msg(r.status == 1 && strstr(r.err, want) && strstr(r.err, msg) && !strchr(r.err, '\033'),
                  "%s: expected '%s' (exit 1), got exit %d:\n%s", name, msg, r.status, tu_tail(r.err, 1800));
    ck_assert_msg(access(path_in("init.ckpt"), F_OK) != 0, "%s: a checkpoint was saved", name);
  }
  tu_free(&r);
}

/* safetensors: every length, offset, shape and dtype held to the file and the format. */
START_TEST(crafted_safetensors_refused) {
  fc_layout();
  FcT t[5];
  char extra[512];
  st_write("ok.safetensors", st_header(fc, 5, ""), fc_data, 0, -1);
  init_refused("ok.safetensors", NULL);
  st_write("big.safetensors", st_header(fc, 5, ""), fc_data, (uint64_t)1 << 40, -1);
  init_refused("big.safetensors", "header length (1099511627776) is past 100 MiB");
  st_write("past.safetensors", st_header(fc, 5, ""), fc_data, strlen(st_header(fc, 5, "")) + fc_data + 1, -1);
  init_refused("past.safetensors", "is past the end of the file");
  tu_write(path_in("short.safetensors"), "\x10\0\0", 3);
  init_refused("short.safetensors", "shorter than 8 bytes");
  st_write("array.safetensors", "[1, 2]", 0, 0, -1);
  init_refused("array.safetensors", "the safetensors header is not a JSON object");
  st_write("broken.safetensors", "{\"emb\": ", 0, 0, -1);
  init_refused("broken.safetensors", "the safetensors header is not a JSON object: ");
  memcpy(t, fc, sizeof t), t[1].b -= 4, t[1].e -= 4;
  st_write("overlap.safetensors", st_header(t, 5, ""), fc_data, 0, -1);
  init_refused("overlap.safetensors", "tensor 'W' starts at byte");
  memcpy(t, fc, sizeof t), t[4].b += 4, t[4].e += 4;
  st_write("gap.safetensors", st_header(t, 5, ""), fc_data + 4, 0, -1);
  init_refused("gap.safetensors", "where a gap would be");
  st_write("trailing.safetensors", st_header(fc, 5, ""), fc_data + 4, 0, -1);
  init_refused("trailing.safetensors", "the tensors hold");
  memcpy(t, fc, sizeof t), t[0].shape[0] = 1L << 62, t[0].shape[1] = 8;
  st_write("overflow.safetensors", st_header(t, 5, ""), fc_data, 0, -1);
  init_refused("overflow.safetensors", "do not hold a F32 tensor of its shape");
  memcpy(t, fc, sizeof t), t[2].shape[0] = -2;
  st_write("negative.safetensors", st_header(t, 5, ""), fc_data, 0, -1);
  init_refused("negative.safetensors", "its shape is not a list of integers");
  memcpy(t, fc, sizeof t), t[4].dtype = "BF16", t[4].e = t[4].b + 10;
  st_write("bf16.safetensors", st_header(t, 5, ""), fc_data - 10, 0, -1);
  init_refused("bf16.safetensors", "tensor 'bc' is BF16; cavs reads F32 and F64");
  memcpy(t, fc, sizeof t), t[4].dtype = "Q7";
  st_write("q7.safetensors", st_header(t, 5, ""), fc_data, 0, -1);
  init_refused("q7.safetensors", "unknown dtype 'Q7'");
  memcpy(t, fc, sizeof t), t[4].b = t[4].e, t[4].e = t[4].e - 20;
  st_write("reversed.safetensors", st_header(t, 5, ""), fc_data, 0, -1);
  init_refused("reversed.safetensors", "data_offsets is not [BEGIN, END]");
  snprintf(extra, sizeof extra, ",\"foo\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%ld,%ld]}", fc_data, fc_data + 4);
  st_write("extra.safetensors", st_header(fc, 5, extra), fc_data + 4, 0, -1);
  init_refused("extra.safetensors", "tensor 'foo' is no parameter of model treefc (emb, W, b, Wc, bc)");
  snprintf(extra, sizeof extra, ",\"\\u001b[2J\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%ld,%ld]}", fc_data, fc_data + 4);
  st_write("escape.safetensors", st_header(fc, 5, extra), fc_data + 4, 0, -1);
  init_refused("escape.safetensors", "tensor '\\x1b[2J' is no parameter");
  st_write("missing.safetensors", st_header(fc, 4, ""), fc[4].b, 0, -1);
  init_refused("missing.safetensors", "no tensor 'bc' (parameter bc [5] of model treefc, H=2 C=5 V=");
  st_write("nan.safetensors", st_header(fc, 5, ""), fc_data, 0, 3);
  init_refused("nan.safetensors", "tensor 'emb' holds a NaN at [1, 1]");
  st_write("meta.safetensors", st_header(fc, 5, ",\"__metadata__\":{\"a\":1}"), fc_data, 0, -1);
  init_refused("meta.safetensors", "__metadata__ is not an object of strings");
  /* a float64 too large for the float model */
  memcpy(t, fc, sizeof t), t[4].dtype = "F64", t[4].e = t[4].b + 40;
  st_write("huge.safetensors", st_header(t, 5, ""), fc_data + 20, 0, -1);
  {
    size_t n = 0;
    unsigned char *f = (unsigned char *)tu_slurp(path_in("huge.safetensors"), &n);
    double x = 1e300;
    memcpy(f + n - 40 + 8, &x, 8);
    tu_write(path_in("huge.safetensors"), (const char *)f, n);
    free(f);
  }
  init_refused("huge.safetensors", "tensor 'bc' holds 1e+300 at [1], past the range of float");
  ck_assert(symlink("/dev/zero", path_in("dev.safetensors")) == 0);
  init_refused("dev.safetensors", "not a regular file");
  /* a FIFO: refused, not waited on (nothing ever writes it) */
  ck_assert(mkfifo(path_in("fifo.safetensors"), 0600) == 0);
  init_refused("fifo.safetensors", "not a regular file");
  /* jansson's message quotes the header: shown escaped */
  st_write("ctl.safetensors", "{\033}", 0, 0, -1);
  init_refused("ctl.safetensors", "the safetensors header is not a JSON object: ");
  init_refused("ctl.safetensors", "\\x1b");
  /* a file of no tensors opens (and then lacks every parameter) */
  st_write("none.safetensors", "{}", 0, 0, -1);
  init_refused("none.safetensors", "no tensor 'emb'");
  /* an empty tensor where another begins, before or after it in the header: the order
     of the keys decides nothing */
  const char *z = "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
  snprintf(extra, sizeof extra, ",%s", z);
  st_write("empty-last.safetensors", st_header(fc, 5, extra), fc_data, 0, -1);
  init_refused("empty-last.safetensors", "tensor 'z' is no parameter of model treefc");
  char first[8192];
  snprintf(first, sizeof first, "{%s,%s", z, st_header(fc, 5, "") + 1);
  st_write("empty-first.safetensors", first, fc_data, 0, -1);
  init_refused("empty-first.safetensors", "tensor 'z' is no parameter of model treefc");
}
END_TEST

/* ---- .npz: a zip written here, entry by entry, with what each case breaks ---- */

typedef struct Zent {
  char name[64];
  unsigned char *data; /* the entry as stored (deflated for method 8) */
  size_t n, usize;
  uint32_t crc;
  int method, flags;
} Zent;

static void put_le(unsigned char *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* An .npy: magic, version 1.0, the dict padded to 64 bytes, `count` floats of 0.5. */
static size_t npy(unsigned char *out, const char *magic, const char *dict, long count, long hlen) {
  memcpy(out, magic, 8);
  size_t dn = strlen(dict), total = (10 + dn + 1 + 63) / 64 * 64;
  put_le(out + 8, hlen >= 0 ? (uint64_t)hlen : total - 10, 2);
  memcpy(out + 10, dict, dn);
  memset(out + 10 + dn, ' ', total - 10 - dn - 1);
  out[total - 1] = '\n';
  for (long i = 0; i < count; i++) memcpy(out + total + 4 * i, &(float){0.5f}, 4);
  return total + 4 * (size_t)count;
}

/* fc's five as stored entries, or deflated (raw deflate, as zip has it). */
static int fc_entries(Zent *z, bool deflated) {
  for (int i = 0; i < 5; i++) {
    char dict[128];
    long count = fc[i].shape[0] * (fc[i].rank == 2 ? fc[i].shape[1] : 1);
    if (fc[i].rank == 1) snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%ld,), }", fc[i].shape[0]);
    else snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%ld, %ld), }", fc[i].shape[0], fc[i].shape[1]);
    unsigned char *raw = malloc(256 + 4 * (size_t)count);
    size_t n = npy(raw, "\x93NUMPY\x01\x00", dict, count, -1);
    z[i] = (Zent){.data = raw, .n = n, .usize = n, .crc = (uint32_t)crc32(0, raw, (uInt)n)};
    snprintf(z[i].name, sizeof z[i].name, "%s.npy", fc[i].name);
    if (deflated) {
      z_stream s = {0};
      ck_assert(deflateInit2(&s, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) == Z_OK);
      unsigned char *out = malloc(deflateBound(&s, n));
      s.next_in = raw, s.avail_in = (uInt)n, s.next_out = out, s.avail_out = (uInt)deflateBound(&s, n);
      ck_assert(deflate(&s, Z_FINISH) == Z_STREAM_END);
      z[i].n = s.total_out, z[i].data = out, z[i].method = 8;
      deflateEnd(&s);
      free(raw);
    }
  }
  return 5;
}

/* The archive: local headers and data, the directory, its end (count as given when
   count >= 0, the directory's offset moved by dir_shift, local offsets by off_shift). */
static void zip_write(const char *name, const Zent *z, int n, long count, long dir_shift, long off_shift) {
  size_t cap = 1 << 16;
  for (int i = 0; i < n; i++) cap += z[i].n + 200;
  unsigned char *f = calloc(1, cap), *p = f;
  size_t *offs = calloc((size_t)n, sizeof *offs);
  for (int i = 0; i < n; i++) {
    offs[i] = (size_t)(p - f);
    put_le(p, 0x04034b50, 4), put_le(p + 4, 20, 2), put_le(p + 6, (uint64_t)z[i].flags, 2), put_le(p + 8, (uint64_t)z[i].method, 2);
    put_le(p + 14, z[i].crc, 4), put_le(p + 18, z[i].n, 4), put_le(p + 22, z[i].usize, 4), put_le(p + 26, strlen(z[i].name), 2);
    memcpy(p + 30, z[i].name, strlen(z[i].name));
    p += 30 + strlen(z[i].name);
    memcpy(p, z[i].data, z[i].n);
    p += z[i].n;
  }
  size_t dir = (size_t)(p - f);
  for (int i = 0; i < n; i++) {
    put_le(p, 0x02014b50, 4), put_le(p + 4, 20, 2), put_le(p + 6, 20, 2), put_le(p + 8, (uint64_t)z[i].flags, 2);
    put_le(p + 10, (uint64_t)z[i].method, 2), put_le(p + 16, z[i].crc, 4), put_le(p + 20, z[i].n, 4);
    put_le(p + 24, z[i].usize, 4), put_le(p + 28, strlen(z[i].name), 2), put_le(p + 42, offs[i] + (size_t)off_shift, 4);
    memcpy(p + 46, z[i].name, strlen(z[i].name));
    p += 46 + strlen(z[i].name);
  }
  put_le(p, 0x06054b50, 4), put_le(p + 8, count >= 0 ? (uint64_t)count : (uint64_t)n, 2);
  put_le(p + 10, count >= 0 ? (uint64_t)count : (uint64_t)n, 2), put_le(p + 12, (size_t)(p - f) - dir, 4);
  put_le(p + 16, dir + (size_t)dir_shift, 4);
  p += 22;
  tu_write(path_in(name), (const char *)f, (size_t)(p - f));
  free(offs);
  free(f);
}

static void free_entries(Zent *z, int n) {
  for (int i = 0; i < n; i++) free(z[i].data);
}

/* An .npz whose entry `which` (0: emb, 1: W, ...) is made anew from magic, dict and
   floats (and its header length when hlen >= 0). */
static void npz_with(const char *name, int which, const char *magic, const char *dict, long count, long hlen) {
  Zent z[5];
  fc_entries(z, false);
  free(z[which].data);
  z[which].data = malloc(256 + 4 * (size_t)(count > 0 ? count : 1) + 70000);
  z[which].n = z[which].usize = npy(z[which].data, magic, dict, count, hlen);
  z[which].crc = (uint32_t)crc32(0, z[which].data, (uInt)z[which].n);
  zip_write(name, z, 5, -1, 0, 0);
  free_entries(z, 5);
}

/* .npz: the zip's structure, its CRC-32s and methods, each .npy's header and size, and a
 * deflated entry that ends before or after the size its directory gives. */
START_TEST(crafted_npz_refused) {
  fc_layout();
  Zent z[6];
  int n = fc_entries(z, false);
  zip_write("ok.npz", z, n, -1, 0, 0);
  init_refused("ok.npz", NULL);
  z[1].crc ^= 1;
  zip_write("crc.npz", z, n, -1, 0, 0);
  init_refused("crc.npz", "entry 'W.npy' is damaged (its CRC-32 does not match)");
  z[1].crc ^= 1, z[1].method = 12;
  zip_write("method.npz", z, n, -1, 0, 0);
  init_refused("method.npz", "entry 'W.npy' is compressed by method 12");
  z[1].method = 0, z[1].flags = 1;
  zip_write("encrypted.npz", z, n, -1, 0, 0);
  init_refused("encrypted.npz", "entry 'W.npy' is encrypted");
  z[1].flags = 0;
  z[5] = z[1];
  zip_write("twice.npz", z, 6, -1, 0, 0);
  init_refused("twice.npz", "it holds tensor 'W' twice");
  zip_write("count.npz", z, n, 0xffff, 0, 0);
  init_refused("count.npz", "ZIP64 locator");
  zip_write("dirpast.npz", z, n, -1, 100000, 0);
  init_refused("dirpast.npz", "its directory lies past its end");
  zip_write("localpast.npz", z, n, -1, 0, 90000);
  init_refused("localpast.npz", "lies past the archive's entries");
  free_entries(z, n);
  tu_write(path_in("empty.npz"), "PK\x05\x06\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 22);
  init_refused("empty.npz", "no tensor 'emb'"); /* (a zip of no entries opens) */
  tu_write(path_in("text.npz"), "hello, not a zip at all: PK", 27);
  init_refused("text.npz", "not an .npz file (no zip directory at its end)");
  const char *w = "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 2), }";
  npz_with("magic.npz", 1, "\x93NUMPX\x01\x00", w, 8, -1);
  init_refused("magic.npz", "entry 'W.npy' is not an .npy array");
  npz_with("hlen.npz", 1, "\x93NUMPY\x01\x00", w, 8, 60000);
  init_refused("hlen.npz", "entry 'W.npy': its header length is past the entry's end");
  npz_with("fortran.npz", 1, "\x93NUMPY\x01\x00", "{'descr': '<f4', 'fortran_order': True, 'shape': (4, 2), }", 8, -1);
  init_refused("fortran.npz", "entry 'W.npy' is in Fortran order");
  npz_with("int.npz", 1, "\x93NUMPY\x01\x00", "{'descr': '<i8', 'fortran_order': False, 'shape': (4, 2), }", 16, -1);
  init_refused("int.npz", "entry 'W.npy' is of dtype '<i8'");
  npz_with("short.npz", 1, "\x93NUMPY\x01\x00", w, 7, -1);
  init_refused("short.npz", "entry 'W.npy' holds 28 bytes of data, not the 32");
  npz_with("key.npz", 1, "\x93NUMPY\x01\x00", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 2), 'x': 1, }", 8, -1);
  init_refused("key.npz", "entry 'W.npy' has no .npy header NumPy writes");
  npz_with("intkey.npz", 1, "\x93NUMPY\x01\x00", "{1: '<f4', 'fortran_order': False, 'shape': (4, 2), }", 8, -1);
  init_refused("intkey.npz", "entry 'W.npy' has no .npy header NumPy writes");
  npz_with("shape.npz", 1, "\x93NUMPY\x01\x00", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }", 8, -1);
  init_refused("shape.npz", "tensor 'W' is [2, 4]; parameter W of model treefc is [4, 2]");
  /* deflated: as np.savez_compressed writes; then a stream cut short, and one longer
     than its size (a zip bomb's way) */
  n = fc_entries(z, true);
  zip_write("deflated.npz", z, n, -1, 0, 0);
  init_refused("deflated.npz", NULL);
  z[0].n /= 2;
  zip_write("cut.npz", z, n, -1, 0, 0);
  init_refused("cut.npz", "entry 'emb.npy' does not inflate to the");
  free_entries(z, n);
  n = fc_entries(z, true);
  {
    /* emb's stream inflates to its .npy and 4096 bytes more; the directory says the .npy */
    unsigned char *raw = malloc(z[0].usize + 4096), *out = malloc(2 * (z[0].usize + 4096) + 1024);
    Zent plain[5];
    fc_entries(plain, false);
    memcpy(raw, plain[0].data, plain[0].n);
    memset(raw + plain[0].n, 0x41, 4096);
    z_stream s = {0};
    ck_assert(deflateInit2(&s, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    s.next_in = raw, s.avail_in = (uInt)(plain[0].n + 4096), s.next_out = out, s.avail_out = (uInt)(2 * (z[0].usize + 4096) + 1024);
    ck_assert(deflate(&s, Z_FINISH) == Z_STREAM_END);
    free(z[0].data);
    z[0].data = out, z[0].n = s.total_out;
    deflateEnd(&s);
    free(raw);
    free_entries(plain, 5);
  }
  zip_write("longer.npz", z, n, -1, 0, 0);
  init_refused("longer.npz", "entry 'emb.npy' does not inflate to the");
  free_entries(z, n);
}
END_TEST

int main(void) {
  if (cli_init("trust")) return 1;
  Suite *s = suite_create("trust");
  TCase *tc = tcase_create("trust");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, crafted_model_name_runs_nothing);
  tcase_add_test(tc, crafted_name_writes_nothing_outside);
  tcase_add_test(tc, crafted_source_checked_first);
  tcase_add_test(tc, crafted_fields_refused);
  tcase_add_test(tc, format_3_fields);
  tcase_add_test(tc, crafted_counters_refused);
  tcase_add_test(tc, format_4_fields);
  tcase_add_test(tc, data_format_names);
  tcase_add_test(tc, format_5_options);
  tcase_add_test(tc, format_6_carried_state);
  tcase_add_test(tc, format_7_chunk_lengths);
  tcase_add_test(tc, format_8_moment_blocks);
  tcase_add_test(tc, format_10_log_record);
  tcase_add_test(tc, totals_of_an_epoch_so_far);
  tcase_add_test(tc, format_9_chunk_reading);
  tcase_add_test(tc, unsafe_cache_refused);
  tcase_add_test(tc, foreign_link_above_cache_refused);
  tcase_add_test(tc, planted_or_broken_object_rebuilt);
  tcase_add_test(tc, entry_with_subdirectory_rebuilt);
  tcase_add_test(tc, abandoned_builds_removed);
  tcase_add_test(tc, cache_pruned_least_recent_first);
  tcase_add_test(tc, cache_command);
  tcase_add_test(tc, model_cflags_in_cache_key);
  tcase_add_test(tc, cpu_in_cache_key);
  tcase_add_test(tc, default_cache_is_per_user);
  tcase_add_test(tc, file_names_escaped_in_generated_code);
  tcase_add_test(tc, control_bytes_in_messages_escaped);
  tcase_add_test(tc, crafted_safetensors_refused);
  tcase_add_test(tc, crafted_npz_refused);
  suite_add_tcase(s, tc);
  return tu_run_suite_shared(s, dir);
}

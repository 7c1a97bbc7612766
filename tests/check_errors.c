/* check_errors.c: what a user who mistypes sees. Every tests/errors/NAME.vf is compiled
 * and cavsc's stderr must equal tests/errors/NAME.err exactly (caret line included), with
 * exit status 1 and no output file. Inputs too odd to keep as files (10 MB, 10,000-deep
 * nesting, unreadable paths) are made here. */
#include "testutil.h"

#include <dirent.h>

static const char *cavsc;
static char errdir[4096];
static char **cases;
static int ncases;

static int cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void load_cases(void) {
  DIR *d = opendir(errdir);
  if (!d) {
    fprintf(stderr, "cannot open %s\n", errdir);
    exit(1);
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n > 3 && !strcmp(e->d_name + n - 3, ".vf")) {
      cases = realloc(cases, sizeof(char *) * (size_t)(ncases + 1));
      cases[ncases++] = strdup(e->d_name);
    }
  }
  closedir(d);
  qsort(cases, (size_t)ncases, sizeof(char *), cmp);
}

START_TEST(error_case) {
  const char *name = cases[_i];
  char expect_path[8192], out_path[64];
  snprintf(expect_path, sizeof expect_path, "%s/%.*s.err", errdir, (int)strlen(name) - 3, name);
  char *expect = tu_slurp(expect_path, NULL);
  ck_assert_msg(expect != NULL, "%s has no .err file", name);
  char *tmp = tu_tmpdir();
  snprintf(out_path, sizeof out_path, "%.40s/out.txt", tmp);
  char *argv[] = {(char *)cavsc, "--dump=ir", "-o", out_path, (char *)name, NULL};
  RunResult r = tu_run(errdir, argv, 20);
  ck_assert_msg(r.status == 1, "%s: exit status %d, expected 1\n%s", name, r.status, r.err);
  ck_assert_msg(!strcmp(r.err, expect), "%s: stderr differs.\n--- expected\n%s--- got\n%s", name,
                expect, r.err);
  ck_assert_msg(access(out_path, F_OK) != 0, "%s: an output file was written", name);
  rmdir(tmp);
  free(tmp);
  free(expect);
  tu_free(&r);
}
END_TEST

START_TEST(at_least_thirty_cases) { ck_assert_int_ge(ncases, 30); }
END_TEST

/* Every example model compiles and dumps its IR. */
START_TEST(examples_compile) {
  const char *names[] = {"treelstm.vf", "treefc.vf", "lstm_lm.vf", "treegru.vf", "twotype.vf"};
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/dsl-examples", tu_env("TOP_SRCDIR", "."));
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    char *argv[] = {(char *)cavsc, "--dump=ir", (char *)names[i], NULL};
    RunResult r = tu_run(dir, argv, 20);
    ck_assert_msg(r.status == 0, "%s: exit %d\n%s", names[i], r.status, r.err);
    ck_assert_msg(strstr(r.out, "\nfunc vertex ") != NULL, "%s: no vertex function in the IR", names[i]);
    ck_assert_str_eq(r.err, "");
    tu_free(&r);
  }
}
END_TEST

/* Writes `data` as `name` in a fresh directory and compiles it there. */
static RunResult compile_text(const char *name, const char *data, size_t len, int limit) {
  char *dir = tu_tmpdir();
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  tu_write(path, data, len);
  char *argv[] = {(char *)cavsc, "--dump=ir", (char *)name, NULL};
  RunResult r = tu_run(dir, argv, limit);
  unlink(path);
  rmdir(dir);
  free(dir);
  return r;
}

static const char header[] =
    "model deep;\ndim H = 4;\ninput y : class[H];\nparam W[H,H];\n"
    "vertex v (children 1) {\n  s = gather(0);\n  h = ";
static const char footer[] = ";\n  scatter(h);\n  push(h);\n}\npush (h) { loss softmax_xent(h, y); }\n";

/* An expression nested 10,000 deep: a clear error, quickly, never a crash. */
START_TEST(deep_nesting) {
  const char *shapes[] = {"(", "sigmoid(", "-"};
  for (int k = 0; k < 3; k++) {
    size_t n = 10000, cap = sizeof header + sizeof footer + n * 16;
    char *buf = malloc(cap), *p = buf;
    p += sprintf(p, "%s", header);
    for (size_t i = 0; i < n; i++) p += sprintf(p, "%s", shapes[k]);
    p += sprintf(p, "s[0:H]");
    for (size_t i = 0; k < 2 && i < n; i++) *p++ = ')';
    p += sprintf(p, "%s", footer);
    RunResult r = compile_text("deep.vf", buf, (size_t)(p - buf), 10);
    ck_assert_msg(r.status == 1, "nesting '%s': status %d", shapes[k], r.status);
    ck_assert_msg(strstr(r.err, "deep.vf:7:") && strstr(r.err, "nested too deeply"), "%s", r.err);
    ck_assert_msg(r.secs < 5, "took %.1f s", r.secs);
    tu_free(&r);
    free(buf);
  }
}
END_TEST

/* A long flat sum is also bounded (the tree, not just the brackets). */
START_TEST(long_chain) {
  size_t n = 100000, cap = sizeof header + sizeof footer + n * 10;
  char *buf = malloc(cap), *p = buf;
  p += sprintf(p, "%s", header);
  p += sprintf(p, "s[0:H]");
  for (size_t i = 0; i < n; i++) p += sprintf(p, " + s[0:H]");
  p += sprintf(p, "%s", footer);
  RunResult r = compile_text("chain.vf", buf, (size_t)(p - buf), 10);
  ck_assert_msg(r.status == 1 && strstr(r.err, "nested too deeply"), "status %d\n%s", r.status, r.err);
  tu_free(&r);
  free(buf);
}
END_TEST

/* Each line uses the one before three times: 2^60 paths through 60 nodes. Compiling to
 * C looks at each node once (zero_at_leaves once walked every path). */
START_TEST(shared_operands) {
  char *dir = tu_tmpdir(), path[4200];
  snprintf(path, sizeof path, "%s/dag.vf", dir);
  char *buf = malloc(4096), *p = buf;
  p += sprintf(p, "model dag;\ndim H = 4;\ninput y : class[H];\nparam W[H,H];\n");
  p += sprintf(p, "vertex v (children 1) {\n  a0 = gather(0);\n");
  for (int i = 1; i < 60; i++) p += sprintf(p, "  a%d = a%d + a%d * a%d;\n", i, i - 1, i - 1, i - 1);
  p += sprintf(p, "  h = tanh(a59 @ W)%s", footer);
  tu_write(path, buf, (size_t)(p - buf));
  char *argv[] = {(char *)cavsc, "-o", dir, "dag.vf", NULL};
  RunResult r = tu_run(dir, argv, 10);
  ck_assert_msg(r.status == 0, "status %d\n%s", r.status, r.err);
  ck_assert_msg(r.secs < 5, "took %.1f s", r.secs);
  tu_free(&r);
  tu_rmtree(dir);
  free(buf);
}
END_TEST

/* 10 MB of source: a valid model with a huge vertex body compiles in seconds, and 10 MB
 * of garbage stops after 20 errors. */
START_TEST(ten_megabytes) {
  size_t target = 10u << 20, cap = target + 4096;
  char *buf = malloc(cap), *p = buf;
  p += sprintf(p, "%s", header);
  p += sprintf(p, "s[0:H];\n");
  for (long i = 0; (size_t)(p - buf) < target; i++) p += sprintf(p, "  t%ld = tanh(h) * 0.5;\n", i);
  p += sprintf(p, "  scatter(h);\n  push(h);\n}\npush (h) { loss softmax_xent(h, y); }\n");
  /* h = s[0:H];   (the header's `h = ` takes the first line) */
  RunResult r = compile_text("big.vf", buf, (size_t)(p - buf), 60);
  ck_assert_msg(r.status == 0, "status %d\n%.2000s", r.status, r.err);
  ck_assert_msg(r.secs < 20, "10 MB took %.1f s", r.secs);
  tu_free(&r);

  /* each line: a good declaration, then a broken one (bison reports an error only after
     three tokens have been accepted since the last) */
  p = buf;
  for (long i = 0; (size_t)(p - buf) < target; i++) p += sprintf(p, "dim d%ld = 1; dim = ( ];\n", i);
  r = compile_text("garbage.vf", buf, (size_t)(p - buf), 60);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "too many errors"), "%.2000s", r.err);
  ck_assert_msg(r.secs < 20, "10 MB of garbage took %.1f s", r.secs);
  tu_free(&r);
  free(buf);
}
END_TEST

START_TEST(missing_file) {
  char *argv[] = {(char *)cavsc, "--dump=ir", "/nonexistent/model.vf", NULL};
  RunResult r = tu_run(NULL, argv, 10);
  ck_assert_int_eq(r.status, 1);
  ck_assert_str_eq(r.err, "cavsc: error: cannot open '/nonexistent/model.vf': No such file or directory\n");
  tu_free(&r);
}
END_TEST

/* An output path that cannot be written: a clear error, status 1, nothing left behind. */
/* A dump's -o is the user's path: a link to a file writes the file and stays a link, a
 * FIFO is written to and stays one, an existing file keeps its mode, and a dump of
 * standard input never goes over the file standard input reads. */
static void sh_run(const char *cmd, int want) {
  char *sh[] = {"/bin/sh", "-c", (char *)cmd, NULL};
  RunResult r = tu_run(NULL, sh, 30);
  ck_assert_msg(r.status == want, "%s: exit %d %s", cmd, r.status, r.err);
  if (want) ck_assert_msg(strstr(r.err, "would overwrite the model it reads, standard input"), "%s", r.err);
  tu_free(&r);
}
START_TEST(dump_to_users_paths) {
  char model[4096];
  snprintf(model, sizeof model, "%s/dsl-examples/treelstm.vf", tu_env("TOP_SRCDIR", "."));
  char *own = tu_tmpdir(), notes[4300], link[4300], fifo[4300], got[4300], copy[4300], cmd[20000];
  snprintf(notes, sizeof notes, "%s/notes.txt", own);
  snprintf(link, sizeof link, "%s/link.ir", own);
  snprintf(fifo, sizeof fifo, "%s/p", own);
  snprintf(got, sizeof got, "%s/got", own);
  snprintf(copy, sizeof copy, "%s/m.vf", own);
  tu_write(notes, "notes\n", 6);
  ck_assert(chmod(notes, 0600) == 0 && symlink("notes.txt", link) == 0 && mkfifo(fifo, 0600) == 0);
  char *argv[] = {(char *)cavsc, "--dump=ir", "-o", link, model, NULL};
  RunResult r = tu_run(NULL, argv, 30);
  ck_assert_msg(r.status == 0, "%s", r.err);
  tu_free(&r);
  struct stat st;
  ck_assert_msg(lstat(link, &st) == 0 && S_ISLNK(st.st_mode), "the link was replaced");
  ck_assert_msg(stat(notes, &st) == 0 && (st.st_mode & 0777) == 0600, "mode %o", (unsigned)(st.st_mode & 0777));
  size_t n = 0;
  char *text = tu_slurp(notes, &n);
  ck_assert_msg(text && !strncmp(text, "model treelstm", 14), "%.40s", text ? text : "(none)");
  /* through a FIFO: what a reader gets is the same dump */
  snprintf(cmd, sizeof cmd, "cat '%s' > '%s' & '%s' --dump=ir -o '%s' '%s'; s=$?; wait; exit $s", fifo, got, cavsc, fifo,
           model);
  sh_run(cmd, 0);
  ck_assert_msg(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO was replaced");
  size_t gn = 0;
  char *gtext = tu_slurp(got, &gn);
  ck_assert_msg(gtext && gn == n && !memcmp(gtext, text, n), "the FIFO's reader got %zu bytes of %zu", gn, n);
  free(gtext);
  free(text);
  /* standard input the file -o names */
  size_t mlen = 0;
  char *mtext = tu_slurp(model, &mlen);
  tu_write(copy, mtext, mlen);
  snprintf(cmd, sizeof cmd, "'%s' --dump=ir - -o '%s' < '%s'", cavsc, copy, copy);
  sh_run(cmd, 1);
  char *now = tu_slurp(copy, &n);
  ck_assert_msg(now && n == mlen && !memcmp(now, mtext, n), "the model was overwritten");
  free(now);
  free(mtext);
  unlink(notes), unlink(link), unlink(fifo), unlink(got), unlink(copy), rmdir(own);
  free(own);
}
END_TEST

/* Two cavsc writing one directory's code at once, twenty times: the header and the code
 * are always one run's pair (each run's own, as two directories of their own hold
 * them), and no temporary file is left. */
static char *slurp_in(const char *d, const char *name) {
  char p[9000];
  snprintf(p, sizeof p, "%s/%s", d, name);
  return tu_slurp(p, NULL);
}
START_TEST(pair_written_as_one) {
  char model[4096];
  snprintf(model, sizeof model, "%s/dsl-examples/treelstm.vf", tu_env("TOP_SRCDIR", "."));
  char *own = tu_tmpdir(), src[2][4300], ref[2][4300], out[4300], cmd[20000];
  size_t mlen = 0;
  char *mtext = tu_slurp(model, &mlen);
  char *h[2], *c[2];
  for (int k = 0; k < 2; k++) { /* (two paths: two headers, their commands differ) */
    snprintf(src[k], sizeof src[k], "%s/m%d.vf", own, k);
    snprintf(ref[k], sizeof ref[k], "%s/ref%d", own, k);
    tu_write(src[k], mtext, mlen);
    char *argv[] = {(char *)cavsc, "-o", ref[k], src[k], NULL};
    RunResult r = tu_run(NULL, argv, 60);
    ck_assert_msg(r.status == 0, "%s", r.err);
    tu_free(&r);
    h[k] = slurp_in(ref[k], "treelstm.h"), c[k] = slurp_in(ref[k], "treelstm.c");
    ck_assert(h[k] && c[k]);
  }
  ck_assert(strcmp(h[0], h[1]) && strcmp(c[0], c[1]));
  snprintf(out, sizeof out, "%s/out", own);
  snprintf(cmd, sizeof cmd, "'%s' -o '%s' '%s' & '%s' -o '%s' '%s'; s=$?; wait $! && exit $s", cavsc, out, src[0], cavsc,
           out, src[1]);
  for (int round = 0; round < 20; round++) {
    char *sh[] = {"/bin/sh", "-c", cmd, NULL};
    RunResult r = tu_run(NULL, sh, 120);
    ck_assert_msg(r.status == 0, "round %d: %s", round, r.err);
    tu_free(&r);
    char *hh = slurp_in(out, "treelstm.h"), *cc = slurp_in(out, "treelstm.c");
    ck_assert(hh && cc);
    int k = !strcmp(hh, h[0]) ? 0 : 1;
    ck_assert_msg(!strcmp(hh, h[k]) && !strcmp(cc, c[k]), "round %d: the header of one run beside the code of another",
                  round);
    free(hh), free(cc);
  }
  DIR *d = opendir(out);
  ck_assert(d);
  struct dirent *e;
  int files = 0;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) files++;
  closedir(d);
  ck_assert_int_eq(files, 2);
  for (int k = 0; k < 2; k++) free(h[k]), free(c[k]);
  free(mtext);
  tu_rmtree(own);
}
END_TEST

START_TEST(unwritable_output) {
  char model[4096];
  snprintf(model, sizeof model, "%s/dsl-examples/treelstm.vf", tu_env("TOP_SRCDIR", "."));
  char *argv[] = {(char *)cavsc, "--dump=ir", "-o", "/nonexistent-dir/out.txt", model, NULL};
  RunResult r = tu_run(NULL, argv, 10);
  ck_assert_int_eq(r.status, 1);
  ck_assert_str_eq(r.err, "cavsc: error: cannot write '/nonexistent-dir/out.txt': No such file or directory\n");
  tu_free(&r);

  /* a directory we may not write into (root ignores permissions, so use /proc) */
  char *argv2[] = {(char *)cavsc, "--dump=ir", "-o", "/proc/out.txt", model, NULL};
  r = tu_run(NULL, argv2, 10);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(!strncmp(r.err, "cavsc: error: cannot write '/proc/out.txt': ", 44), "%s", r.err);
  tu_free(&r);

  /* a dump over the model it reads, through a link or not: refused, the model as it was */
  char *own = tu_tmpdir(), src[4300], via[4300];
  snprintf(src, sizeof src, "%s/m.vf", own);
  snprintf(via, sizeof via, "%s/via.vf", own);
  size_t mlen = 0;
  char *mtext = tu_slurp(model, &mlen);
  ck_assert(mtext != NULL);
  tu_write(src, mtext, mlen);
  ck_assert(symlink("m.vf", via) == 0);
  const char *outs[] = {src, via};
  for (int k = 0; k < 2; k++) {
    char *argv3[] = {(char *)cavsc, "--dump=ast", "-o", (char *)outs[k], src, NULL};
    r = tu_run(NULL, argv3, 10);
    ck_assert_msg(r.status == 1 && strstr(r.err, "would overwrite the model it reads"), "%d: %s", r.status, r.err);
    tu_free(&r);
    size_t n = 0;
    char *now = tu_slurp(src, &n);
    ck_assert_msg(now && n == mlen && !memcmp(now, mtext, n), "the model was overwritten");
    free(now);
  }
  free(mtext);
  unlink(via), unlink(src), rmdir(own);
  free(own);

  /* -o DIR for the C files: created with its parents, the files get the usual mode */
  char *top = tu_tmpdir(), cdir[4300], cfile[4400], xdir[4500];
  snprintf(cdir, sizeof cdir, "%s/build/deeper", top);
  char *argv4[] = {(char *)cavsc, "-o", cdir, model, NULL};
  mode_t old = umask(022);
  r = tu_run(NULL, argv4, 30);
  umask(old);
  ck_assert_msg(r.status == 0, "%s", r.err);
  snprintf(cfile, sizeof cfile, "%s/treelstm.c", cdir);
  struct stat st;
  ck_assert(stat(cfile, &st) == 0);
  ck_assert_int_eq(st.st_mode & 0777, 0644);
  tu_free(&r);
  /* a file in the way is an error */
  snprintf(xdir, sizeof xdir, "%s/x", cfile);
  char *argv5[] = {(char *)cavsc, "-o", xdir, model, NULL};
  r = tu_run(NULL, argv5, 30);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "is not a directory"), "%s", r.err);
  tu_free(&r);
  /* the code's name taken by a directory: an error, and the earlier header (one cavsc
     wrote: its banner) kept as it was (it was once replaced by the new one and then
     removed with it), no file left */
  char hfile[4400], marker[] = "/* treelstm.h: generated by cavsc 0.1, an earlier header */\n";
  snprintf(hfile, sizeof hfile, "%s/treelstm.h", cdir);
  FILE *hf = fopen(hfile, "w");
  ck_assert(hf && fputs(marker, hf) >= 0 && fclose(hf) == 0);
  ck_assert(unlink(cfile) == 0 && mkdir(cfile, 0755) == 0);
  r = tu_run(NULL, argv4, 30);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "treelstm.c': Is a directory"), "%s", r.err);
  char *kept = tu_slurp(hfile, NULL);
  ck_assert_msg(kept && !strcmp(kept, marker), "%s", kept ? kept : "(gone)");
  free(kept);
  tu_free(&r);
  int nfiles = 0;
  DIR *dd = opendir(cdir);
  ck_assert(dd);
  for (struct dirent *e; (e = readdir(dd));) nfiles += e->d_name[0] != '.';
  closedir(dd);
  ck_assert_int_eq(nfiles, 2); /* treelstm.h and the directory treelstm.c */
  tu_rmtree(top);

  /* and a good path gets the whole dump */
  char *dir = tu_tmpdir(), out[4200];
  snprintf(out, sizeof out, "%s/ir.txt", dir);
  char *argv3[] = {(char *)cavsc, "--dump=ir", "-o", out, model, NULL};
  r = tu_run(NULL, argv3, 10);
  ck_assert_int_eq(r.status, 0);
  char *text = tu_slurp(out, NULL);
  ck_assert_ptr_nonnull(text);
  ck_assert_msg(!strncmp(text, "model treelstm\n", 15), "%.100s", text);
  free(text);
  unlink(out);
  rmdir(dir);
  free(dir);
  tu_free(&r);
}
END_TEST

/* --target=c writes what no --target writes; --target=cuda the same header and MODEL.cu;
 * an unknown target is an error that names the targets there are, status 1, and nothing
 * is written, not even the directory. */
START_TEST(target_option) {
  char model[4096];
  snprintf(model, sizeof model, "%s/dsl-examples/treelstm.vf", tu_env("TOP_SRCDIR", "."));
  char *top = tu_tmpdir(), plain[4300], named[4300], bad[4300];
  snprintf(plain, sizeof plain, "%s/plain", top);
  snprintf(named, sizeof named, "%s/named", top);
  snprintf(bad, sizeof bad, "%s/bad", top);
  char *argv[] = {(char *)cavsc, "-o", plain, model, NULL};
  RunResult r = tu_run(NULL, argv, 30);
  ck_assert_msg(r.status == 0, "%s", r.err);
  tu_free(&r);
  char *argv2[] = {(char *)cavsc, "--target=c", "-o", named, model, NULL};
  r = tu_run(NULL, argv2, 30);
  ck_assert_msg(r.status == 0, "%s", r.err);
  tu_free(&r);
  const char *files[] = {"treelstm.h", "treelstm.c"};
  for (int k = 0; k < 2; k++) {
    char a[4400], b[4400];
    snprintf(a, sizeof a, "%s/%s", plain, files[k]);
    snprintf(b, sizeof b, "%s/%s", named, files[k]);
    char *ta = tu_slurp(a, NULL), *tb = tu_slurp(b, NULL);
    ck_assert_msg(ta && tb && !strcmp(ta, tb), "%s differs with --target=c", files[k]);
    free(ta);
    free(tb);
  }
  /* --target=cuda: the same header, MODEL.cu in place of MODEL.c */
  char cu[4300], a[4400], b[4400];
  snprintf(cu, sizeof cu, "%s/cuda", top);
  char *argv4[] = {(char *)cavsc, "--target=cuda", "-o", cu, model, NULL};
  r = tu_run(NULL, argv4, 30);
  ck_assert_msg(r.status == 0, "%s", r.err);
  tu_free(&r);
  snprintf(a, sizeof a, "%s/treelstm.h", plain);
  snprintf(b, sizeof b, "%s/treelstm.h", cu);
  char *ta = tu_slurp(a, NULL), *tb = tu_slurp(b, NULL);
  ck_assert_msg(ta && tb && !strcmp(ta, tb), "treelstm.h differs with --target=cuda");
  free(ta);
  free(tb);
  snprintf(a, sizeof a, "%s/treelstm.cu", cu);
  snprintf(b, sizeof b, "%s/treelstm.c", cu);
  ck_assert_msg(access(a, F_OK) == 0 && access(b, F_OK) != 0, "--target=cuda writes treelstm.cu, not treelstm.c");
  const char *names[] = {"CUDA", "xyz", ""};
  for (int k = 0; k < 3; k++) {
    char opt[64], want[128];
    snprintf(opt, sizeof opt, "--target=%s", names[k]);
    snprintf(want, sizeof want, "cavsc: error: unknown target '%s' (targets: c, cuda)\n", names[k]);
    char *argv3[] = {(char *)cavsc, opt, "-o", bad, model, NULL};
    r = tu_run(NULL, argv3, 30);
    ck_assert_int_eq(r.status, 1);
    ck_assert_str_eq(r.err, want);
    ck_assert_str_eq(r.out, "");
    ck_assert_msg(access(bad, F_OK) != 0, "%s: something was written", opt);
    tu_free(&r);
  }
  tu_rmtree(top);
}
END_TEST

/* IR read back: a broken line is an error with its position; the good dump compiles. */
START_TEST(ir_input) {
  const char *bad = "model m\ndim H = 4\nstate [2Q]\n";
  RunResult r = compile_text("bad.ir", bad, strlen(bad), 10);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "bad.ir:3:") && strstr(r.err, "unknown dim 'Q'"), "%s", r.err);
  tu_free(&r);
  const char *junk = "model m\nfunc vertex v children 1\n  %0 = gather 0 : [H] # line 1\n";
  r = compile_text("junk.ir", junk, strlen(junk), 10);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "junk.ir:3:"), "%s", r.err);
  tu_free(&r);
}
END_TEST

/* IR written by hand that reads a vertex row at an edge's or a mixture of experts' slot's
 * index (sema broadcasts it first, ebcast or sbcast), or drops out slot values (the masks
 * are keyed by vertex row): invalid IR, not a model whose code reads and writes past its
 * buffers. Each compiled before (found fuzzing the moe syntax). */
START_TEST(ir_rows_on_edges_and_slots) {
  /* each case: a head, one line %2 (edges) or %6 (slots), a tail */
  const char *edges[] = {"model m\ndim H = 2\ninput f : real[H]\nstate [H]\nfunc vertex v children 0 set\n"
                         "  %0 = input f : [H]  # line 1\n  %1 = echild : [H]  # line 1\n",
                         "  %3 = esum %2 : [H]  # line 1\n  scatter %3  # line 1\n"};
  const char *slots[] = {"model m\ndim H = 2\ndim X = 2\ninput f : real[H]\nparam Wg[H,X] init xavier\nstate [H]\n"
                         "func vertex v children 0\n  %0 = input f : [H]  # line 1\n  %1 = param Wg  # line 1\n"
                         "  %2 = matmul %0, %1 : [X]  # line 1\n  %3 = const 0 : scalar  # line 1\n"
                         "  %4 = topk %2, %3 k 1 : [X]  # line 1\n  %5 = sbcast %0 : [H]  # line 1\n",
                         "  %7 = scomb %6, %4 : [H]  # line 1\n  scatter %7  # line 1\n"};
  struct {
    const char **around, *line;
    int status;
  } cases[] = {
      {edges, "  %2 = mul %1, %1 : [H]  # line 1\n", 0},
      {edges, "  %2 = mul %0, %1 : [H]  # line 1\n", 1}, /* %0 a vertex row, read per edge */
      {slots, "  %6 = add %5, %5 : [H]  # line 1\n", 0},
      {slots, "  %6 = add %5, %0 : [H]  # line 1\n", 1},     /* %0 a vertex row, read per slot */
      {slots, "  %6 = dropout %5, %3 : [H]  # line 1\n", 1}, /* dropout on slots */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char buf[2048];
    size_t n = 0;
    const char *parts[] = {cases[i].around[0], cases[i].line, cases[i].around[1]};
    for (int k = 0; k < 3; k++) {
      size_t l = strlen(parts[k]);
      ck_assert(n + l < sizeof buf);
      memcpy(buf + n, parts[k], l);
      n += l;
    }
    RunResult r = compile_text("hand.ir", buf, n, 10);
    ck_assert_msg(r.status == cases[i].status, "case %zu: status %d, expected %d\n%s", i, r.status, cases[i].status,
                  r.err);
    if (cases[i].status) ck_assert_msg(strstr(r.err, "hand.ir: error: invalid IR"), "case %zu: %s", i, r.err);
    tu_free(&r);
  }
}
END_TEST

/* Odd bytes anywhere: a message with a position, never a crash. */
START_TEST(random_bytes) {
  unsigned seed = 12345;
  char buf[512];
  for (int t = 0; t < 300; t++) {
    size_t n = 1 + (size_t)(rand_r(&seed) % (int)sizeof buf);
    for (size_t i = 0; i < n; i++) {
      int k = rand_r(&seed) % 8;
      buf[i] = k == 0 ? (char)(rand_r(&seed) & 0xff) : "model v(){}[];:=+-*/@.2H#\n "[rand_r(&seed) % 27];
    }
    RunResult r = compile_text("fuzz.vf", buf, n, 10);
    ck_assert_msg(r.status == 0 || r.status == 1, "random input %d: status %d\n%s", t, r.status, r.err);
    if (r.status == 1) ck_assert_msg(strstr(r.err, "fuzz.vf:") || strstr(r.err, "cavsc: error"), "%s", r.err);
    tu_free(&r);
  }
}
END_TEST

int main(void) {
  cavsc = tu_env("CAVSC", "./cavsc");
  snprintf(errdir, sizeof errdir, "%s/tests/errors", tu_env("TOP_SRCDIR", "."));
  load_cases();
  Suite *s = suite_create("errors");
  TCase *tc = tcase_create("files");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, at_least_thirty_cases);
  tcase_add_loop_test(tc, error_case, 0, ncases);
  tcase_add_test(tc, examples_compile);
  suite_add_tcase(s, tc);
  TCase *tg = tcase_create("generated");
  tcase_set_timeout(tg, 300);
  tcase_add_test(tg, deep_nesting);
  tcase_add_test(tg, long_chain);
  tcase_add_test(tg, shared_operands);
  tcase_add_test(tg, ten_megabytes);
  tcase_add_test(tg, missing_file);
  tcase_add_test(tg, unwritable_output);
  tcase_add_test(tg, dump_to_users_paths);
  tcase_add_test(tg, pair_written_as_one);
  tcase_add_test(tg, target_option);
  tcase_add_test(tg, random_bytes);
  tcase_add_test(tg, ir_input);
  tcase_add_test(tg, ir_rows_on_edges_and_slots);
  suite_add_tcase(s, tg);
  return tu_run_suite(s);
}

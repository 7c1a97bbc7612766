/* testutil.h: helpers shared by the Check suites: run a program with a time limit and
 * capture what it prints, read whole files, find the source tree. */
#ifndef TESTUTIL_H
#define TESTUTIL_H

#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct RunResult {
  int status;   /* exit status, or 128 + signal, or -1 on timeout */
  double secs;  /* wall time */
  long maxrss;  /* its peak resident memory, KiB (its own or a waited-for child's) */
  char *out, *err;
} RunResult;

static inline const char *tu_env(const char *name, const char *fallback) {
  const char *v = getenv(name);
  return v && *v ? v : fallback;
}

/* A checked build: sanitizers (make check exports their flags as SAN_CFLAGS) or valgrind
 * (the test wrapper). Its tests are there for memory errors and undefined behaviour,
 * which the runtime's paths show on a few models as on all of them: a test that repeats
 * one comparison over every example (threads, policies, ablations, fault points) runs
 * over tu_example_checked's few there, and over all of them in the plain build, which
 * checks the numbers. Every example still runs once a suite in a checked build. CI runs
 * the plain and the two checked builds in its 90 minutes (.ci/run). */
static inline bool tu_checked_build(void) {
  return *tu_env("SAN_CFLAGS", "") || *tu_env("CAVS_TEST_WRAPPER", "");
}

/* Whether a checked build repeats a comparison on example `name`: a Tree-LSTM (lookup
 * tables), children as a set (edges), a language model (text, its state carried), attention
 * over an encoder (seq2seq), a lattice (a DAG), a mixture of experts; every example in the
 * plain build. */
static inline bool tu_example_checked(const char *name) {
  static const char *const few[] = {"treelstm", "childsum", "lstm_lm", "seq2seq", "lattice_lstm", "moe_tree"};
  if (!tu_checked_build()) return true;
  for (size_t i = 0; i < sizeof few / sizeof *few; i++)
    if (!strcmp(name, few[i])) return true;
  return false;
}

/* tcase_add_loop_test of `fn` for each index i of names[0..n) that tu_example_checked
 * keeps */
#define tu_add_examples(tc, fn, names, n)                                                   \
  do {                                                                                      \
    for (int tu_i_ = 0; tu_i_ < (int)(n); tu_i_++)                                         \
      if (tu_example_checked((names)[tu_i_])) tcase_add_loop_test(tc, fn, tu_i_, tu_i_ + 1); \
  } while (0)

static inline char *tu_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap + 1);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) buf = realloc(buf, (cap *= 2) + 1);
  }
  fclose(f);
  buf[n] = 0;
  if (len) *len = n;
  return buf;
}

static inline void tu_write(const char *path, const char *data, size_t len) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "cannot create %s: %s", path, strerror(errno));
  ck_assert(fwrite(data, 1, len, f) == len);
  fclose(f);
}

static inline char *tu_tmpdir(void) {
  char tmpl[] = "/tmp/cavs-test-XXXXXX";
  char *d = mkdtemp(tmpl);
  ck_assert(d != NULL);
  return strdup(d);
}

/* Runs argv[0] with argv in directory `cwd` (NULL: here), killing it after `limit`
 * seconds. Output is captured through temporary files (no pipe deadlock). */
static inline RunResult tu_run(const char *cwd, char *const argv[], int limit) {
  RunResult r = {0};
  char outp[] = "/tmp/cavs-out-XXXXXX", errp[] = "/tmp/cavs-err-XXXXXX";
  int fo = mkstemp(outp), fe = mkstemp(errp);
  ck_assert(fo >= 0 && fe >= 0);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pid_t pid = fork();
  ck_assert(pid >= 0);
  if (pid == 0) {
    dup2(fo, 1);
    dup2(fe, 2);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    if (cwd && chdir(cwd) != 0) _exit(126);
    execv(argv[0], argv);
    _exit(127);
  }
  int st = 0;
  struct rusage ru = {0};
  for (int waited = 0;; waited++) {
    pid_t w = wait4(pid, &st, WNOHANG, &ru);
    if (w == pid) break;
    if (waited >= limit * 100) {
      kill(pid, SIGKILL);
      wait4(pid, &st, 0, &ru);
      r.status = -1;
      break;
    }
    usleep(10000);
  }
  r.maxrss = ru.ru_maxrss;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  r.secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  if (r.status != -1) r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  close(fo);
  close(fe);
  r.out = tu_slurp(outp, NULL);
  r.err = tu_slurp(errp, NULL);
  unlink(outp);
  unlink(errp);
  return r;
}

/* Removes `dir` and what is in it, outside any test (no Check assert). */
static inline void tu_rm_rf(const char *dir) {
  pid_t pid = fork(); /* not tu_run: Check's asserts belong inside tests */
  if (pid == 0) {
    execl("/bin/rm", "rm", "-rf", dir, (char *)NULL);
    _exit(127);
  }
  if (pid > 0) waitpid(pid, NULL, 0);
}

/* The suite's store of built models (engine.h's load_model_with), $CAVS_TEST_MODELS: a
 * directory made for this run of the suite (NULL where it could not be: models are then
 * built for each load), which tu_models_end removes. */
static inline char *tu_models_begin(void) {
  char tmpl[] = "/tmp/cavs-models-XXXXXX";
  char *d = mkdtemp(tmpl);
  if (!d) return NULL;
  setenv("CAVS_TEST_MODELS", d, 1);
  return strdup(d);
}
static inline void tu_models_end(char *dir) {
  if (!dir) return;
  tu_rm_rf(dir);
  unsetenv("CAVS_TEST_MODELS");
  free(dir);
}

/* Runs a suite the way every check_*.c does; the exit status automake reads. */
static inline int tu_run_suite(Suite *s) {
  char *models = tu_models_begin();
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  tu_models_end(models);
  return failed ? 1 : 0;
}

/* A scratch directory for a suite that runs the cavs binary, with the compile cache
 * (CAVS_CACHE) inside it. */
static inline char *tu_scratch(const char *suite) {
  char tmpl[256];
  snprintf(tmpl, sizeof tmpl, "/tmp/cavs-%s-XXXXXX", suite);
  char *d = mkdtemp(tmpl);
  if (!d) return NULL;
  d = strdup(d);
  char cache[4400];
  snprintf(cache, sizeof cache, "%s/cache", d);
  setenv("CAVS_CACHE", cache, 1);
  return d;
}

/* Runs a suite whose tests share files (generated data, the compile cache) in this
 * process, then removes its scratch directory. */
static inline int tu_run_suite_shared(Suite *s, char *scratch) {
  char *models = tu_models_begin();
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  tu_models_end(models);
  tu_rm_rf(scratch);
  free(scratch);
  return failed ? 1 : 0;
}

/* The end of a program's output, at most n bytes: what a failure message quotes. Check
 * refuses messages over 4 kB, and where a suite runs unforked (tu_run_suite_shared) the
 * refusal ends the whole suite without naming the test; a sanitizer's report easily
 * passes that. */
static inline const char *tu_tail(const char *s, size_t n) {
  if (!s) return "(none)";
  size_t len = strlen(s);
  return len > n ? s + len - n : s;
}

static inline void tu_free(RunResult *r) {
  free(r->out);
  free(r->err);
}

/* Removes a directory tu_tmpdir made, and what is in it, and frees its name. */
static inline void tu_rmtree(char *dir) {
  char *argv[] = {"/bin/rm", "-rf", dir, NULL};
  RunResult r = tu_run(NULL, argv, 60);
  tu_free(&r);
  free(dir);
}

#endif

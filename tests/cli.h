/* cli.h: helpers for the suites that run the `cavs` binary as a user does (check_driver,
 * check_trust): a scratch directory with the compile cache in it, paths there and in the
 * examples, cavs run with a time limit (and, for one run, a changed environment), and
 * what a directory holds. */
#ifndef CLI_H
#define CLI_H

#include "testutil.h"

#include <dirent.h>

static const char *cavs_bin;
static char *dir;      /* scratch for this run */
static char top[4096]; /* the source tree */

/* Sets the three above; 0, or -1 when no scratch directory could be made. */
static inline int cli_init(const char *suite) {
  cavs_bin = tu_env("CAVS", "./cavs");
  snprintf(top, sizeof top, "%s", tu_env("TOP_SRCDIR", "."));
  dir = tu_scratch(suite);
  return dir ? 0 : -1;
}

/* Paths in rotating buffers: a caller that keeps one past eight more calls copies it. */
static inline char *path_in(const char *name) {
  static char buf[8][4400];
  static int k;
  k = (k + 1) % 8;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

static inline char *model(const char *name) {
  static char buf[4][4400];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/dsl-examples/%s", top, name);
  return buf[k];
}

/* Runs argv (argv[0] a path) with a time limit; env (or NULL) holds up to 8 NAME=VALUE
 * to set and NAME alone to unset, for this run only. */
static inline RunResult run_env(char *const env[], char *const argv[], int limit) {
  char *saved[8][2] = {{0}};
  int ns = 0;
  for (int i = 0; env && env[i] && ns < 8; i++, ns++) {
    char *eq = strchr(env[i], '=');
    saved[ns][0] = eq ? strndup(env[i], (size_t)(eq - env[i])) : strdup(env[i]);
    const char *old = getenv(saved[ns][0]);
    saved[ns][1] = old ? strdup(old) : NULL;
    if (eq) setenv(saved[ns][0], eq + 1, 1);
    else unsetenv(saved[ns][0]);
  }
  RunResult r = tu_run(NULL, argv, limit);
  for (int i = 0; i < ns; i++) {
    if (saved[i][1]) setenv(saved[i][0], saved[i][1], 1);
    else unsetenv(saved[i][0]);
    free(saved[i][0]);
    free(saved[i][1]);
  }
  return r;
}

/* Runs cavs with up to 31 arguments, NULL-terminated, and env as run_env's. */
static inline RunResult cavs_env(char *const env[], const char *first, ...) {
  char *argv[64];
  int n = 0;
  argv[n++] = (char *)cavs_bin;
  va_list ap;
  va_start(ap, first);
  for (const char *a = first; a && n < 63; a = va_arg(ap, const char *)) argv[n++] = (char *)a;
  va_end(ap);
  argv[n] = NULL;
  return run_env(env, argv, 300);
}
#define cavs(...) cavs_env(NULL, __VA_ARGS__)

/* Entries in a directory, "." and ".." aside; -1 when it does not exist. */
static inline int entries(const char *path) {
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

static inline void ok(RunResult *r, const char *what) {
  ck_assert_msg(r->status == 0, "%s: exit %d\n%s%s", what, r->status, tu_tail(r->out, 1800), tu_tail(r->err, 1800));
}

#endif

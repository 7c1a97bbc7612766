/* check_docs.c: every manual page renders without warnings, every example in the pages
 * that is a complete model compiles, and cavs(1) describes what `cavs --help` lists. */
#include "testutil.h"

static const char *pages[] = {"man/cavsc.1", "man/cavs.1", "man/libcavs.3", "man/vf.5", "man/cavs-data.5"};

START_TEST(pages_render) {
  const char *mandoc = tu_env("MANDOC", "");
  if (!*mandoc) {
    fprintf(stderr, "mandoc not found at configure time; skipping rendering\n");
    return;
  }
  for (size_t i = 0; i < sizeof pages / sizeof *pages; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", tu_env("TOP_SRCDIR", "."), pages[i]);
    char *lint[] = {(char *)mandoc, "-T", "lint", "-W", "warning", path, NULL};
    RunResult r = tu_run(NULL, lint, 20);
    ck_assert_msg(r.status == 0, "%s: mandoc -T lint says\n%s%s", pages[i], r.out, r.err);
    tu_free(&r);
    char *render[] = {(char *)mandoc, "-T", "markdown", path, NULL};
    r = tu_run(NULL, render, 20);
    ck_assert_int_eq(r.status, 0);
    ck_assert_msg(strstr(r.out, "NAME") && strstr(r.out, "DESCRIPTION"), "%s rendered to\n%.500s",
                  pages[i], r.out);
    tu_free(&r);
  }
}
END_TEST

/* The models in man/vf.5's EXAMPLES (each between `model` and the end of the literal
 * display) compile. */
START_TEST(page_examples_compile) {
  char path[4096];
  snprintf(path, sizeof path, "%s/man/vf.5", tu_env("TOP_SRCDIR", "."));
  char *page = tu_slurp(path, NULL);
  ck_assert_ptr_nonnull(page);
  int compiled = 0;
  for (char *p = page; (p = strstr(p, "\n.Bd -literal")); ) {
    char *start = strchr(p + 1, '\n') + 1, *end = strstr(start, "\n.Ed");
    ck_assert_ptr_nonnull(end);
    p = end;
    if (strncmp(start, "model ", 6)) continue;
    /* undo the roff escapes used in displays */
    char *src = malloc((size_t)(end - start) + 2), *q = src;
    for (char *s = start; s < end; s++) {
      if (s[0] == '\\' && s[1] == '&') { s++; continue; }
      if (s[0] == '\\' && s[1] == 'e') { *q++ = '\\'; s++; continue; }
      *q++ = *s;
    }
    *q++ = '\n';
    *q = 0; /* the failure message prints it */
    char *dir = tu_tmpdir(), file[4200];
    snprintf(file, sizeof file, "%s/example.vf", dir);
    tu_write(file, src, (size_t)(q - src));
    char *argv[] = {(char *)tu_env("CAVSC", "./cavsc"), "--dump=ir", file, NULL};
    RunResult r = tu_run(NULL, argv, 20);
    ck_assert_msg(r.status == 0, "example in vf.5 does not compile:\n%s\n%s", src, r.err);
    tu_free(&r);
    unlink(file);
    rmdir(dir);
    free(dir);
    free(src);
    compiled++;
  }
  ck_assert_int_ge(compiled, 1);
  free(page);
}
END_TEST

/* Trailing spaces of every line and trailing blank lines go; roff escapes are undone. */
static char *normalize(const char *in) {
  char *out = malloc(strlen(in) + 2), *q = out;
  for (const char *p = in; *p; p++) {
    if (p[0] == '\\' && p[1] == '&') { p++; continue; }
    if (p[0] == '\\' && p[1] == 'e') { *q++ = '\\'; p++; continue; }
    if (*p == '\n')
      while (q > out && q[-1] == ' ') q--;
    *q++ = *p;
  }
  while (q > out && (q[-1] == '\n' || q[-1] == ' ')) q--;
  *q = 0;
  return out;
}

/* cavsc(1) shows the Tree-LSTM's --report verbatim: it must be what cavsc prints now. */
START_TEST(report_in_manual_is_current) {
  char path[4096], model[4096];
  snprintf(path, sizeof path, "%s/man/cavsc.1", tu_env("TOP_SRCDIR", "."));
  snprintf(model, sizeof model, "%s/dsl-examples/treelstm.vf", tu_env("TOP_SRCDIR", "."));
  char *page = tu_slurp(path, NULL);
  ck_assert_ptr_nonnull(page);
  char *sec = strstr(page, "\n.Sh THE REPORT");
  ck_assert_msg(sec != NULL, "cavsc.1 has no THE REPORT section");
  char *start = strstr(sec, "\n.Bd -literal");
  ck_assert_ptr_nonnull(start);
  start = strchr(start + 1, '\n') + 1;
  char *end = strstr(start, "\n.Ed");
  ck_assert_ptr_nonnull(end);
  *end = 0;
  char *argv[] = {(char *)tu_env("CAVSC", "./cavsc"), "--report", model, NULL};
  RunResult r = tu_run(NULL, argv, 20);
  ck_assert_int_eq(r.status, 0);
  char *shown = normalize(start), *now = normalize(r.out);
  ck_assert_msg(!strcmp(shown, now), "cavsc.1's report differs from `cavsc --report`:\n%s\n---\n%s", shown, now);
  free(shown);
  free(now);
  free(page);
  tu_free(&r);
}
END_TEST

/* Every command and every long option that `cavs --help` lists has its entry in cavs(1). */
START_TEST(cavs_help_documented) {
  char path[4096];
  snprintf(path, sizeof path, "%s/man/cavs.1", tu_env("TOP_SRCDIR", "."));
  char *page = tu_slurp(path, NULL);
  ck_assert_ptr_nonnull(page);
  char *argv[] = {(char *)tu_env("CAVS", "./cavs"), "--help", NULL};
  RunResult r = tu_run(NULL, argv, 20);
  ck_assert_int_eq(r.status, 0);
  int commands = 0, options = 0;
  char word[64], want[80];
  for (const char *p = r.out; (p = strstr(p, "cavs ")); p += 5)
    if (sscanf(p + 5, "%63[a-z]", word) == 1) {
      snprintf(want, sizeof want, "\n.It Cm %s ", word);
      ck_assert_msg(strstr(page, want), "cavs.1 has no entry for the command '%s'", word);
      commands++;
    }
  for (const char *p = r.out; (p = strstr(p, "--")); p += 2)
    if (sscanf(p + 2, "%63[a-z-]", word) == 1) {
      snprintf(want, sizeof want, "Fl -%s", word);
      ck_assert_msg(strstr(page, want), "cavs.1 does not describe --%s", word);
      options++;
    }
  ck_assert_int_ge(commands, 6);
  ck_assert_int_ge(options, 20);
  tu_free(&r);
  free(page);
}
END_TEST

/* libcavs(3)'s example program compiles against the generated Tree-LSTM and runs. */
START_TEST(library_example_runs) {
  const char *top = tu_env("TOP_SRCDIR", "."), *build = tu_env("BUILDDIR", ".");
  char path[4096];
  snprintf(path, sizeof path, "%s/man/libcavs.3", top);
  char *page = tu_slurp(path, NULL);
  ck_assert_ptr_nonnull(page);
  char *start = NULL;
  for (char *p = page; (p = strstr(p, "\n.Bd -literal")); p++) {
    char *body = strchr(p + 1, '\n') + 1;
    if (!strncmp(body, "#include \"cavs.h\"\n#include \"treelstm.h\"", 39)) {
      start = body;
      break;
    }
  }
  ck_assert_msg(start != NULL, "libcavs.3 has no example program");
  char *end = strstr(start, "\n.Ed");
  ck_assert_ptr_nonnull(end);
  *end = 0;
  char *src = malloc(strlen(start) + 2), *q = src;
  for (char *p = start; *p; p++) {
    if (p[0] == '\\' && p[1] == '&') { p++; continue; }
    if (p[0] == '\\' && p[1] == 'e') { *q++ = '\\'; p++; continue; }
    *q++ = *p;
  }
  *q++ = '\n';
  *q = 0;
  char *dir = tu_tmpdir(), file[4200], cmd[16384];
  snprintf(file, sizeof file, "%s/prog.c", dir);
  tu_write(file, src, (size_t)(q - src));
  /* with the sanitizers libcavs needs their runtime, which the program must link first */
  snprintf(cmd, sizeof cmd,
           "%s %s -std=c11 -I%s/runtime -I%s/generated %s %s/generated/treelstm.c -L%s/.libs -lcavs -lm -o %s/prog && "
           "LD_LIBRARY_PATH=%s/.libs %s/prog",
           tu_env("CC", "cc"), tu_env("SAN_CFLAGS", ""), top, top, file, top, build, dir, build, dir);
  char *sh[] = {"/bin/sh", "-c", cmd, NULL};
  RunResult r = tu_run(NULL, sh, 120);
  ck_assert_msg(r.status == 0, "the example failed (%d):\n%s%s", r.status, r.out, r.err);
  tu_free(&r);
  tu_rmtree(dir);
  free(src);
  free(page);
}
END_TEST

/* Every function cavs.h declares (a line's `cavs_NAME(` after its return type) is in
 * libcavs(3)'s synopsis, `.Fn NAME`. */
START_TEST(library_functions_documented) {
  const char *top = tu_env("TOP_SRCDIR", ".");
  char path[4096];
  snprintf(path, sizeof path, "%s/runtime/cavs.h", top);
  char *h = tu_slurp(path, NULL);
  snprintf(path, sizeof path, "%s/man/libcavs.3", top);
  char *page = tu_slurp(path, NULL);
  ck_assert_ptr_nonnull(h);
  ck_assert_ptr_nonnull(page);
  int found = 0;
  for (char *line = h; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    if (*line == ' ' || *line == '/' || *line == '*' || *line == '#' || !strncmp(line, "typedef", 7)) continue;
    char *at = strstr(line, "cavs_"), *eol = strchr(line, '\n');
    if (!at || (eol && at > eol)) continue;
    char name[128];
    int n = 0;
    while (n < 127 && (at[n] == '_' || (at[n] >= 'a' && at[n] <= 'z') || (at[n] >= '0' && at[n] <= '9'))) {
      name[n] = at[n];
      n++;
    }
    name[n] = 0;
    if (at[n] != '(') continue;
    char want[160];
    snprintf(want, sizeof want, "\n.Fn %s ", name);
    ck_assert_msg(strstr(page, want), "libcavs.3's synopsis has no %s", name);
    found++;
  }
  ck_assert_int_ge(found, 60);
  free(h);
  free(page);
}
END_TEST

int main(void) {
  Suite *s = suite_create("docs");
  TCase *tc = tcase_create("man");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, pages_render);
  tcase_add_test(tc, page_examples_compile);
  tcase_add_test(tc, report_in_manual_is_current);
  tcase_add_test(tc, library_example_runs);
  tcase_add_test(tc, cavs_help_documented);
  tcase_add_test(tc, library_functions_documented);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}

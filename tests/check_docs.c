/* check_docs.c: every manual page renders without warnings, every example in the pages
 * that is a complete model compiles, and cavs(1) and the bash completion have every
 * command's options as the driver's one table (driver/options.def) has them. */
#include "testutil.h"

#include <dirent.h>

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

/* ... and through groff with every warning on, as Debian's man(1) runs it (-ww): a
 * warning there is text a reader loses (a SEE ALSO citation dropped whole, a table row
 * that does not fit). groff-base is one of bootstrap's packages. */
START_TEST(pages_render_in_groff) {
  for (size_t i = 0; i < sizeof pages / sizeof *pages; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", tu_env("TOP_SRCDIR", "."), pages[i]);
    char *groff[] = {"/usr/bin/groff", "-ww", "-mandoc", "-Tutf8", "-z", path, NULL};
    if (access(groff[0], X_OK)) {
      fprintf(stderr, "no %s: groff's warnings not checked\n", groff[0]);
      return;
    }
    RunResult r = tu_run(NULL, groff, 20);
    ck_assert_msg(r.status == 0 && !*r.err && !*r.out, "%s: groff -ww says\n%s%s", pages[i], r.out, r.err);
    tu_free(&r);
  }
}
END_TEST

/* The line that links an application is the same wherever it is shown (README,
 * cavsc(1), libcavs(3)), and cavs(1)'s FILES names every example model. */
START_TEST(one_link_line_every_example) {
  static const char line[] = "cc -O2 -I build app.c build/treelstm.c $(pkg-config --cflags --libs cavs) -lm";
  static const char *const where[] = {"README", "man/cavsc.1", "man/libcavs.3"};
  char path[4096];
  for (size_t i = 0; i < sizeof where / sizeof *where; i++) {
    snprintf(path, sizeof path, "%s/%s", tu_env("TOP_SRCDIR", "."), where[i]);
    char *text = tu_slurp(path, NULL);
    ck_assert_msg(text && strstr(text, line), "%s does not show the link line\n%s", where[i], line);
    free(text);
  }
  snprintf(path, sizeof path, "%s/man/cavs.1", tu_env("TOP_SRCDIR", "."));
  char *page = tu_slurp(path, NULL);
  char *files = page ? strstr(page, "\n.Sh FILES") : NULL;
  ck_assert_ptr_nonnull(files);
  snprintf(path, sizeof path, "%s/dsl-examples", tu_env("TOP_SRCDIR", "."));
  DIR *d = opendir(path);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (len < 4 || strcmp(e->d_name + len - 3, ".vf")) continue;
    char want[300];
    snprintf(want, sizeof want, " %s ", e->d_name);
    ck_assert_msg(strstr(files, want), "cavs(1)'s FILES does not name %s", e->d_name);
    n++;
  }
  closedir(d);
  ck_assert_int_ge(n, 12);
  free(page);
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

/* ---- cavs(1) and driver/cavs.bash against the driver's one table of options ---- */

/* driver/options.def: the commands, and each option with the commands that take it */
enum {
#define CMD(id, name, operands, summary) CMDI_##id,
#include "../driver/options.def"
  NCMD
};
enum {
#define CMD(id, name, operands, summary) C_##id = 1 << CMDI_##id,
#include "../driver/options.def"
  C_TOP = 1 << NCMD
};
static const char *const cmd_names[] = {
#define CMD(id, name, operands, summary) name,
#include "../driver/options.def"
};
static const struct {
  unsigned commands;
  char short_;
  const char *name, *arg;
} rows[] = {
#define OPT(id, commands, short_, name, arg, dflt, meaning) {commands, short_, name, arg},
#include "../driver/options.def"
};
enum { NROWS = sizeof rows / sizeof *rows };

/* The row of command c (NCMD: no command) that `flag` ("--epochs", "-o") names, or -1. */
static int row_of(int c, const char *flag) {
  for (int i = 0; i < NROWS; i++) {
    if (!((rows[i].commands >> c) & 1)) continue;
    if (flag[1] == '-' ? !strcmp(flag + 2, rows[i].name) : rows[i].short_ == flag[1] && !flag[2]) return i;
  }
  return -1;
}

/* The flags mdoc's Fl writes in [from, to): "Fl -a | -b" is --a and --b, "Fl o" is -o,
   up to the next macro; at most 64 into flags. */
static int flags_in(const char *from, const char *to, char flags[][80]) {
  int n = 0;
  for (const char *p = from; (p = strstr(p, "Fl ")) && p < to; p += 3) {
    if (p > from && p[-1] != ' ' && p[-1] != '.') continue;
    for (const char *w = p + 3; w < to && *w != '\n' && n < 64;) {
      int len = (int)strcspn(w, " \n");
      if (*w == '-' || (len == 1 && *w >= 'a' && *w <= 'z')) snprintf(flags[n++], 80, "-%.*s", len > 70 ? 70 : len, w);
      else if (len != 1 || *w != '|') break;
      w += len;
      w += strspn(w, " ");
    }
  }
  return n;
}

/* The part of the page from `start` to the first of `ends` after it (or the end). */
static const char *until(const char *start, const char *const *ends) {
  const char *end = start + strlen(start);
  for (int i = 0; ends[i]; i++) {
    const char *e = strstr(start + 1, ends[i]);
    if (e && e < end) end = e;
  }
  return end;
}

/* Each command's SYNOPSIS lists exactly its options in driver/options.def (cavs without
 * a command: --version and --help); each option of a command has its entry (an `.It`
 * line with `Fl -NAME`) in the command's item, where every entry is one of its options,
 * or in OPTIONS, where every entry is an option of train, eval, predict or of cavs
 * alone. An option added, removed or moved to another command on one side fails. */
START_TEST(options_match_manual) {
  char path[4096], flags[64][80];
  snprintf(path, sizeof path, "%s/man/cavs.1", tu_env("TOP_SRCDIR", "."));
  char *page = tu_slurp(path, NULL);
  ck_assert_ptr_nonnull(page);
  const char *syn = strstr(page, "\n.Sh SYNOPSIS"), *opts = strstr(page, "\n.Sh OPTIONS");
  const char *env = strstr(page, "\n.Sh ENVIRONMENT");
  ck_assert(syn && opts && env);
  static const char *const next_block[] = {"\n.Nm\n", "\n.Sh ", NULL}, *const next_item[] = {"\n.It Cm ", "\n.Sh ", NULL};
  const unsigned in_options = C_TRAIN | C_EVAL | C_PREDICT | C_TOP;
  for (int c = 0; c <= NCMD; c++) {
    const char *who = c < NCMD ? cmd_names[c] : "cavs without a command";
    bool listed[NROWS] = {false}, described[NROWS] = {false};
    char head[64];
    snprintf(head, sizeof head, c < NCMD ? "\n.Nm\n.Cm %s\n" : "\n.Nm\n.Fl -%s", c < NCMD ? cmd_names[c] : "version");
    const char *block = strstr(syn, head);
    ck_assert_msg(block && block < opts, "cavs.1's SYNOPSIS has no %s", who);
    int n = flags_in(block, until(block, next_block), flags);
    for (int k = 0; k < n; k++) {
      int r = row_of(c, flags[k]);
      ck_assert_msg(r >= 0, "cavs.1's SYNOPSIS of %s shows %s, which driver/options.def does not give it", who, flags[k]);
      listed[r] = true;
    }
    snprintf(head, sizeof head, "\n.It Cm %s ", c < NCMD ? cmd_names[c] : "");
    const char *item = c < NCMD ? strstr(page, head) : NULL, *item_end = item ? until(item, next_item) : NULL;
    ck_assert_msg(item || c == NCMD, "cavs.1 has no entry for the command '%s'", who);
    for (const char *p = item; p && (p = strstr(p, "\n.It ")) && p < item_end; p++) {
      n = flags_in(p + 4, strchr(p + 1, '\n'), flags);
      for (int k = 0; k < n; k++) {
        int r = row_of(c, flags[k]);
        ck_assert_msg(r >= 0, "cavs.1's entry of %s describes %s, which driver/options.def does not give it", who, flags[k]);
        described[r] = true;
      }
    }
    for (const char *p = opts; (p = strstr(p, "\n.It ")) && p < env; p++) {
      n = flags_in(p + 4, strchr(p + 1, '\n'), flags);
      for (int k = 0; k < n; k++) {
        bool known = false;
        for (int d = 0; d <= NCMD; d++) known |= (in_options >> d & 1) && row_of(d, flags[k]) >= 0;
        ck_assert_msg(known, "cavs.1's OPTIONS describes %s, which no command of driver/options.def has there", flags[k]);
        if (row_of(c, flags[k]) >= 0 && (in_options >> c & 1)) described[row_of(c, flags[k])] = true;
      }
    }
    for (int i = 0; i < NROWS; i++) {
      if (!((rows[i].commands >> c) & 1)) continue;
      ck_assert_msg(listed[i], "cavs.1's SYNOPSIS of %s lacks --%s, which driver/options.def gives it", who, rows[i].name);
      ck_assert_msg(described[i], "cavs.1 has no entry for --%s of %s (an .It with Fl -%s in its item or OPTIONS)",
                    rows[i].name, who, rows[i].name);
    }
  }
  free(page);
}
END_TEST

/* The words of the first `key='...'` after `after` in text, NUL-separated in out;
   NULL where there is none. */
static char *quoted(const char *text, const char *after, const char *key, char *out, size_t cap) {
  const char *p = strstr(text, after);
  if (!p) return NULL;
  char pat[64];
  snprintf(pat, sizeof pat, "%s='", key);
  p = strstr(p, pat);
  if (!p) return NULL;
  p += strlen(pat);
  size_t len = strcspn(p, "'");
  snprintf(out, cap, "%.*s", (int)(len < cap ? len : cap - 1), p);
  return out;
}

/* Whether the words of `list` (space-separated) are exactly the n in `want`, any order. */
static bool same_words(const char *list, const char *const *want, int n) {
  int found = 0;
  for (const char *w = list; *w; w += strspn(w, " ")) {
    size_t len = strcspn(w, " ");
    bool in = false;
    for (int i = 0; i < n; i++) in |= strlen(want[i]) == len && !strncmp(want[i], w, len);
    if (!in) return false;
    found++;
    w += len;
  }
  return found == n;
}

/* driver/cavs.bash, the bash completion: its commands, each command's options and each
 * option's choices (an ARG of words separated by '|') are the table's. */
START_TEST(completion_matches_table) {
  char path[4096], list[2048], head[64];
  snprintf(path, sizeof path, "%s/driver/cavs.bash", tu_env("TOP_SRCDIR", "."));
  char *text = tu_slurp(path, NULL);
  ck_assert_ptr_nonnull(text);
  ck_assert(quoted(text, "_cavs()", "commands", list, sizeof list));
  ck_assert_msg(same_words(list, cmd_names, NCMD), "cavs.bash's commands are '%s'", list);
  for (int c = 0; c < NCMD; c++) {
    const char *want[NROWS + 1];
    char names[NROWS + 1][40];
    int n = 0;
    for (int i = 0; i < NROWS; i++)
      if ((rows[i].commands >> c & 1) || !strcmp(rows[i].name, "help")) snprintf(names[n], 40, "--%s", rows[i].name), want[n] = names[n], n++;
    snprintf(head, sizeof head, "\n  %s) ", cmd_names[c]);
    ck_assert_msg(quoted(text, head, "opts", list, sizeof list), "cavs.bash has no options of %s", cmd_names[c]);
    ck_assert_msg(same_words(list, want, n), "cavs.bash's options of %s are not driver/options.def's: %s", cmd_names[c], list);
  }
  int with_choices = 0;
  for (int i = 0; i < NROWS; i++) {
    if (!rows[i].arg || !strchr(rows[i].arg, '|')) continue;
    char args[256], *save = NULL;
    const char *want[32];
    int n = 0;
    snprintf(args, sizeof args, "%s", rows[i].arg);
    for (char *w = strtok_r(args, "|", &save); w && n < 32; w = strtok_r(NULL, "|", &save)) want[n++] = w;
    snprintf(head, sizeof head, "\n  --%s) ", rows[i].name);
    ck_assert_msg(quoted(text, head, "choices", list, sizeof list), "cavs.bash offers no choices for --%s", rows[i].name);
    ck_assert_msg(same_words(list, want, n), "cavs.bash's choices for --%s are '%s', not %s", rows[i].name, list, rows[i].arg);
    with_choices++;
  }
  int lines = 0;
  for (const char *p = text; (p = strstr(p, ") choices='")); p++) lines++;
  ck_assert_msg(lines == with_choices, "cavs.bash offers choices for %d options, driver/options.def has %d", lines, with_choices);
  free(text);
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
  tcase_add_test(tc, pages_render_in_groff);
  tcase_add_test(tc, one_link_line_every_example);
  tcase_add_test(tc, page_examples_compile);
  tcase_add_test(tc, report_in_manual_is_current);
  tcase_add_test(tc, library_example_runs);
  tcase_add_test(tc, options_match_manual);
  tcase_add_test(tc, completion_matches_table);
  tcase_add_test(tc, library_functions_documented);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}

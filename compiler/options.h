/* options.h: what cavsc and cavs say about a command line getopt_long could not take (a
 * header of static functions: the two programs share no library). With opterr = 0,
 * getopt_long returns '?' and leaves the word in argv[optind - 1]; opt_complain says
 * which of four things went wrong, in the program's own voice, with the nearest option
 * where the word looks like a typo of one. */
#ifndef CAVS_OPTIONS_H
#define CAVS_OPTIONS_H

#include <getopt.h>
#include <stdio.h>
#include <string.h>

/* Edit distance, adjacent transpositions counting one, of two option names, or 99
   past 31 characters. */
static inline int opt_distance(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  if (n > 31 || m > 31) return 99;
  int d[32][32];
  for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= n; i++)
    for (size_t j = 1; j <= m; j++) {
      int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[n][m];
}

/* The message for word (as typed: "--epohcs", "--epochs=x", "-q"), to stderr, after
   "prog: " (and "cmd: " when cmd is not NULL). */
static inline void opt_complain(const char *prog, const char *cmd, const char *word, const struct option *lo) {
  char name[64];
  const char *w = word;
  while (*w == '-') w++;
  size_t len = strcspn(w, "=");
  if (len >= sizeof name) len = sizeof name - 1;
  memcpy(name, w, len);
  name[len] = 0;
  fprintf(stderr, "%s: %s%s", prog, cmd ? cmd : "", cmd ? ": " : "");
  int prefixed = 0;
  const char *exact = NULL, *near = NULL, *first = NULL;
  int best = 3; /* a typo is at most two edits away */
  for (const struct option *o = lo; word[0] == '-' && word[1] == '-' && o->name; o++) {
    if (!strcmp(o->name, name)) exact = o->name;
    if (len && !strncmp(o->name, name, len) && !prefixed++) first = o->name;
    int dist = opt_distance(name, o->name);
    if (dist < best) best = dist, near = o->name;
  }
  if (!exact && prefixed == 1) exact = first; /* getopt took the prefix: its value was wrong */
  if (exact && !strchr(w, '='))
    fprintf(stderr, "option '--%s' needs a value\n", exact);
  else if (exact)
    fprintf(stderr, "option '--%s' takes no value\n", exact);
  else if (prefixed > 1)
    fprintf(stderr, "option '%s' is ambiguous: '--%s' or another\n", word, first);
  else if (near)
    fprintf(stderr, "unknown option '%s'; did you mean '--%s'?\n", word, near);
  else if (word[0] == '-' && word[1] != '-' && optopt)
    fprintf(stderr, "option '-%c' is unknown or needs a value\n", optopt);
  else
    fprintf(stderr, "unknown option '%s'\n", word);
}

#endif

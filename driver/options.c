/* options.c: the command line's one table (options.def) put to work: each command's
 * getopt_long array built from the rows that name it, so that a command takes exactly
 * its options, each by any unambiguous prefix among them (getopt's rule, the same for
 * every command, plot's included); commands spelled in full; and the help, `cavs help
 * [COMMAND]` or `cavs COMMAND --help`, printed from the same rows. tests/check_docs holds
 * cavs(1) and driver/cavs.bash (the bash completion) to the table. */
#include "driver.h"
#include "options.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

typedef struct CommandRow {
  const char *name, *operands, *summary;
} CommandRow;

typedef struct OptionRow {
  unsigned commands;
  char short_;
  const char *name, *arg, *dflt, *meaning;
} OptionRow;

static const CommandRow commands[] = {
#define CMD(id, name, operands, summary) {name, operands, summary},
#include "options.def"
};

static const OptionRow options[] = {
#define OPT(id, cmds, short_, name, arg, dflt, meaning) {cmds, short_, name, arg, dflt, meaning},
#include "options.def"
};
enum { NOPTIONS = sizeof options / sizeof *options };

/* the row of an OPT_ id */
#define ROW(id) (&options[(id) - OPT_FIRST - 1])

/* cmd's own options, and --help, which every command takes */
static bool takes(const OptionRow *o, int cmd) { return (o->commands >> cmd) & 1 || o == ROW(OPT_HELP); }

int command_of(const char *name) {
  for (int c = 0; c < CMD_COUNT; c++)
    if (!strcmp(name, commands[c].name)) return c;
  return -1;
}

_Noreturn void unknown_command(const char *word) {
  int best = 3, near = -1; /* a typo is at most two edits away; or a prefix, either way */
  for (int c = 0; c < CMD_COUNT && *word; c++) {
    size_t n = strlen(commands[c].name), w = strlen(word);
    int d = !strncmp(commands[c].name, word, n < w ? n : w) ? 1 : opt_distance(word, commands[c].name);
    if (d < best) best = d, near = c;
  }
  if (near >= 0) die(1, "unknown command '%s'; did you mean '%s'? (commands are spelled in full)", word, commands[near].name);
  die(1, "unknown command '%s' (cavs help lists them)", word);
}

/* A command's getopt_long array and short options, built once. */
typedef struct Parser {
  struct option lo[NOPTIONS + 1];
  char shorts[2 * NOPTIONS + 2];
} Parser;

static const Parser *parser(int cmd) {
  static Parser ps[CMD_COUNT + 1];
  static bool made[CMD_COUNT + 1];
  Parser *p = &ps[cmd];
  if (made[cmd]) return p;
  int n = 0;
  char *s = p->shorts;
  *s++ = '-'; /* operands in order, returned as 1 */
  for (int i = 0; i < NOPTIONS; i++) {
    if (!takes(&options[i], cmd)) continue;
    p->lo[n++] = (struct option){options[i].name, options[i].arg ? required_argument : no_argument, NULL, OPT_FIRST + 1 + i};
    if (options[i].short_) *s++ = options[i].short_;
    if (options[i].short_ && options[i].arg) *s++ = ':';
  }
  made[cmd] = true;
  return p;
}

/* Which commands take the option `word` names exactly, as "train" or "train, eval or
   predict"; NULL when none does, or when cmd does (its value was wrong). */
static const char *owners(const char *word, int cmd) {
  const char *w = word + strspn(word, "-"), *names[CMD_COUNT];
  size_t len = strcspn(w, "=");
  int n = 0;
  for (int i = 0; i < NOPTIONS; i++)
    if (takes(&options[i], cmd) && strlen(options[i].name) == len && !strncmp(options[i].name, w, len)) return NULL;
  for (int c = 0; c < CMD_COUNT && word[1] == '-'; c++)
    for (int i = 0; i < NOPTIONS; i++)
      if ((options[i].commands >> c) & 1 && strlen(options[i].name) == len && !strncmp(options[i].name, w, len)) {
        names[n++] = commands[c].name;
        break;
      }
  char *who = NULL;
  for (int k = 0; k < n; k++) who = k ? fmt("%s%s%s", who, k + 1 < n ? ", " : " or ", names[k]) : xstrdup(names[k]);
  return who;
}

int next_option(int argc, char **argv, int cmd) {
  const Parser *p = parser(cmd);
  opterr = 0; /* opt_complain says what was wrong */
  int ch = getopt_long(argc, argv, p->shorts, p->lo, NULL);
  if (ch == '?') {
    const char *word = argv[optind - 1], *who = owners(word, cmd);
    const char *name = cmd == CMD_TOP ? NULL : commands[cmd].name;
    if (who && cmd != CMD_TOP) die(1, "%s: option '%.*s' is not one of %s's: %s takes it", name, (int)strcspn(word, "="), word, name, who);
    opt_complain("cavs", name, word, p->lo);
    exit(1);
  }
  for (int i = 0; ch > 1 && ch < OPT_FIRST && i < NOPTIONS; i++)
    if (options[i].short_ == ch && takes(&options[i], cmd)) ch = OPT_FIRST + 1 + i;
  if (ch == OPT_HELP) {
    print_help(stdout, cmd);
    exit(0);
  }
  return ch;
}

void help_if_asked(int argc, char **argv, int cmd) {
  for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      print_help(stdout, cmd);
      exit(0);
    }
}

/* "  -o, --output FILE" and its meaning, with the default, a line (the meaning on the
   next line past a long name). */
static void print_option(FILE *f, const OptionRow *o) {
  char head[96];
  const char *sp = o->arg ? " " : "", *arg = o->arg ? o->arg : "";
  if (o->short_) snprintf(head, sizeof head, "  -%c, --%s%s%s", o->short_, o->name, sp, arg);
  else snprintf(head, sizeof head, "  --%s%s%s", o->name, sp, arg);
  fprintf(f, strlen(head) < 26 ? "%-26s" : "%s\n%26s", head, "");
  fprintf(f, "%s%s%s\n", o->meaning, o->dflt ? "; default: " : "", o->dflt ? o->dflt : "");
}

void print_help(FILE *f, int cmd) {
  if (cmd == CMD_TOP) {
    fprintf(f, "usage: cavs COMMAND [options]\n\n");
    for (int c = 0; c < CMD_COUNT; c++)
      fprintf(f, "  cavs %s %s\n      %s\n", commands[c].name, commands[c].operands, commands[c].summary);
    fputc('\n', f);
  } else {
    fprintf(f, "usage: cavs %s %s\n%s\n\n", commands[cmd].name, commands[cmd].operands, commands[cmd].summary);
  }
  bool any = false;
  for (int i = 0; i < NOPTIONS; i++)
    if (takes(&options[i], cmd)) {
      if (!any) fprintf(f, "options:\n");
      any = true;
      print_option(f, &options[i]);
    }
  fprintf(f, "\nCommands are spelled in full; an option may be shortened to any prefix that no other\n"
             "option of its command shares (--epo 5), and takes its value as the next word or after\n"
             "'=' (--epochs=5). %sSee cavs(1).\n",
          cmd == CMD_TOP ? "'cavs help COMMAND' (or 'cavs COMMAND --help') lists a command's options. " : "");
}

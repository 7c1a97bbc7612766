/* main.c: the cavsc command. Options first, then the pipeline as a list of calls, as
 * QBE's main.c lists its passes: the verifier checks the IR sema built (or ir_read read)
 * before autodiff and the passes after it. */
#include "cavsc.h"
#include "afile.h"
#include "options.h"
#include "outputs.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage[] =
    "usage: cavsc [options] MODEL.vf|MODEL.ir|-\n"
    "  -o PATH            output directory for MODEL.h and MODEL.c or .cu (default: .);\n"
    "                     with --dump or --report, the file to write instead of stdout\n"
    "  --dump=STAGE       print the program after a stage: ast, ir, ad, cls, fuse\n"
    "                     (cls and fuse print the --report)\n"
    "  --report           print every node's class (eager, path, lazy) and fusion group\n"
    "  --precision=P      float (default) or double (for gradient checks)\n"
    "  --target=NAME      the code to write: c (default, MODEL.h and MODEL.c) or\n"
    "                     cuda (MODEL.h and MODEL.cu: a kernel per fused group)\n"
    "  --check            run every pass and write nothing: exit 0 when the model is valid\n"
    "  --no-fuse          ablation: every elementwise node a loop of its own\n"
    "  --no-merge         ablation: no products merged (shared left operand) or stacked\n"
    "  --no-homes         ablation: no cell stores its state where its parent gathers it\n"
    "  --no-push-view     ablation: the push block reads a buffer of pushed copies, not\n"
    "                     the state in place\n"
    "  --source-name=NAME the name messages and the generated code give the input\n"
    "                     (for '-', standard input)\n"
    "  --version          print the version and exit\n"
    "  --help             print this help and exit\n";

enum { DUMP_NONE, DUMP_AST, DUMP_IR, DUMP_AD, DUMP_REPORT };


/* Reads `path` whole; "-" is standard input. */
static char *read_file(const char *path, size_t *len) {
  bool in = !strcmp(path, "-");
  FILE *f = in ? stdin : fopen(path, "rb");
  if (!f) {
    error_plain("cannot open '%s': %s", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    error_plain("'%s' is a directory", path);
    fclose(f);
    return NULL;
  }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (!buf) {
      error_plain("out of memory reading '%s'", path);
      if (!in) fclose(f);
      return NULL;
    }
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap) break;
    if (cap >= (size_t)1 << 30) {
      error_plain("'%s' is larger than 1 GiB", path);
      free(buf);
      if (!in) fclose(f);
      return NULL;
    }
    cap *= 2;
    buf = realloc(buf, cap);
  }
  if (ferror(f)) {
    error_plain("cannot read '%s': %s", path, strerror(errno));
    free(buf);
    if (!in) fclose(f);
    return NULL;
  }
  if (!in) fclose(f);
  /* NUL-terminated as well, for the IR reader's strtol and strtod */
  char *t = realloc(buf, n + 1);
  if (!t) {
    error_plain("out of memory reading '%s'", path);
    free(buf);
    return NULL;
  }
  t[n] = 0;
  *len = n;
  return t;
}

/* The output directory, and the ones above it, created when missing (as mkdir -p). */
static bool make_dirs(const char *dir) {
  char *p = arena_strdup(dir);
  for (char *s = p + 1;; s++) {
    if (*s && *s != '/') continue;
    char c = *s;
    *s = 0;
    struct stat st;
    if (stat(p, &st) != 0 && mkdir(p, 0777) != 0 && errno != EEXIST) {
      error_plain("cannot create the output directory '%s': %s", p, strerror(errno));
      return false;
    }
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
      error_plain("'%s' is not a directory", p);
      return false;
    }
    *s = c;
    if (!c) return true;
  }
}

/* `data` for `path`, written whole but not yet in place (afile.c: an unnamed file in the
 * path's directory, so that a cavsc killed before its commit leaves nothing; where the
 * file system has none, a temporary name that the next write of the path removes). False
 * (said) when it could not be written. */
static bool write_begin(cv_afile *a, const char *path, int flags, const char *data, size_t len) {
  char err[1024];
  if (cv_afile_open(a, path, flags, err, sizeof err) || cv_afile_write(a, data, len, err, sizeof err)) {
    error_plain("%s", err);
    return false;
  }
  return true;
}

/* ... and put in place (flushed, renamed over the path, the directory flushed) */
static bool write_end(cv_afile *a) {
  char err[1024];
  if (cv_afile_commit(a, err, sizeof err)) {
    error_plain("%s", err);
    return false;
  }
  return true;
}

/* Whether `path` can be renamed over: absent, or not a directory (rename's EISDIR). */
static bool replaceable(const char *path) {
  struct stat st;
  if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    error_plain("cannot write '%s': %s", path, strerror(EISDIR));
    return false;
  }
  return true;
}

/* Writes `data` to `path` through a temporary file in the same directory and a rename,
 * so a reader never sees a half-written file and a failure leaves no file behind. */
/* A dump's -o is the user's path (afile.h's CV_AFILE_USER): a link to a file replaces
   the file and keeps the link, a FIFO, a device or standard output is written to, an
   existing file keeps its permissions; cavsc's own DIR/MODEL.h and .c are replaced as
   they are (write_outputs) */
static bool write_atomic(const char *path, const char *data, size_t len) {
  cv_afile a;
  return replaceable(path) && write_begin(&a, path, CV_AFILE_USER, data, len) && write_end(&a);
}

/* What the command line asks for */
typedef struct Cli {
  const char *out_path, *source_name, *input;
  int dump;
  bool check_only, no_fuse, no_merge, no_homes, no_push_view;
  Precision prec;
  const Target *target;
} Cli;

/* The options and the input file's name into *o: -1 to go on, else the status to exit
   with (--help and --version: 0; a bad option: 1, said) */
static int parse_args(int argc, char **argv, Cli *o) {
  *o = (Cli){.dump = DUMP_NONE, .prec = PREC_FLOAT, .target = &target_c};
  static const struct option longopts[] = {
      {"dump", required_argument, NULL, 'd'},
      {"report", no_argument, NULL, 'r'},
      {"precision", required_argument, NULL, 'p'},
      {"target", required_argument, NULL, 't'},
      {"check", no_argument, NULL, 'c'},
      {"no-fuse", no_argument, NULL, 'F'},
      {"no-merge", no_argument, NULL, 'M'},
      {"no-homes", no_argument, NULL, 'H'},
      {"no-push-view", no_argument, NULL, 'P'},
      {"source-name", required_argument, NULL, 'n'},
      {"version", no_argument, NULL, 'V'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  int ch;
  opterr = 0; /* opt_complain says what was wrong */
  while ((ch = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
    switch (ch) {
    case 'o': o->out_path = optarg; break;
    case 'd':
      if (!strcmp(optarg, "ast")) o->dump = DUMP_AST;
      else if (!strcmp(optarg, "ir")) o->dump = DUMP_IR;
      else if (!strcmp(optarg, "ad")) o->dump = DUMP_AD;
      else if (!strcmp(optarg, "cls") || !strcmp(optarg, "fuse")) o->dump = DUMP_REPORT;
      else {
        fprintf(stderr, "cavsc: error: unknown stage '%s' for --dump (ast, ir, ad, cls, fuse)\n", optarg);
        return 1;
      }
      break;
    case 'r': o->dump = DUMP_REPORT; break;
    case 'c': o->check_only = true; break;
    case 'F': o->no_fuse = true; break;
    case 'M': o->no_merge = true; break;
    case 'H': o->no_homes = true; break;
    case 'P': o->no_push_view = true; break;
    case 'n': o->source_name = optarg; break;
    case 'p':
      if (!strcmp(optarg, "float")) o->prec = PREC_FLOAT;
      else if (!strcmp(optarg, "double")) o->prec = PREC_DOUBLE;
      else {
        fprintf(stderr, "cavsc: error: unknown precision '%s' (float, double)\n", optarg);
        return 1;
      }
      break;
    case 't':
      o->target = target_find(optarg);
      if (!o->target) {
        fprintf(stderr, "cavsc: error: unknown target '%s' (targets: %s)\n", optarg, target_names());
        return 1;
      }
      break;
    case 'V': printf("cavsc %s\n", CAVSC_VERSION); return 0;
    case 'h': fputs(usage, stdout); return 0;
    case '?': opt_complain("cavsc", NULL, argv[optind - 1], longopts); return 1;
    default: fputs(usage, stderr); return 1;
    }
  }
  if (optind != argc - 1) {
    fputs(argc - optind > 1 ? "cavsc: error: more than one input file\n"
                            : "cavsc: error: no input file\n",
          stderr);
    fputs(usage, stderr);
    return 1;
  }
  o->input = argv[optind];
  if (o->check_only && (o->dump != DUMP_NONE || o->out_path)) {
    fputs("cavsc: error: --check writes nothing; it takes no -o, --dump or --report\n", stderr);
    return 1;
  }
  return -1;
}

/* The pipeline over a model (m: what sema built or ir_read read; is_ir: the latter),
   the dump or the code written to out (and the header to hout); false on an error,
   said */
static bool run_passes(const Cli *o, const char *path, const char *text, size_t len, bool is_ir, Decl *decls,
                       FILE *out, FILE *hout, Model **mp) {
  if (o->dump == DUMP_AST) {
    ast_dump(out, decls);
    return true;
  }
  Model *m = *mp = is_ir ? ir_read(path, text, len) : sema(decls, path);
  if (diag_count()) return false;
  cv_checking_user_ir = is_ir;
  ir_check(m);
  cv_checking_user_ir = false;
  if (o->dump == DUMP_IR) {
    ir_print(out, m);
    return true;
  }
  autodiff(m);
  classify(m);
  m->no_fuse = o->no_fuse;
  m->no_merge = o->no_merge;
  m->no_homes = o->no_homes;
  m->no_push_view = o->no_push_view;
  fuse(m);
  plan(m);
  if (o->check_only) {
    /* every pass has run and found nothing wrong */
  } else if (o->dump == DUMP_AD) ad_print(out, m);
  else if (o->dump == DUMP_REPORT) report(out, m);
  else {
    /* the options that shape the code, not where it was written: golden files stay the
       same whatever the output directory */
    const char *t = o->target == &target_c ? "" : arena_printf(" --target=%s", o->target->name);
    const char *p = o->prec == PREC_DOUBLE ? " --precision=double" : "";
    const char *a = arena_printf("%s%s%s%s", o->no_fuse ? " --no-fuse" : "", o->no_merge ? " --no-merge" : "",
                                 o->no_homes ? " --no-homes" : "", o->no_push_view ? " --no-push-view" : "");
    char *cmd = arena_printf("cavsc%s%s%s %s", t, p, a, path), *hcmd = arena_printf("cavsc%s%s %s", p, a, path);
    EmitOpts eo = {.prec = o->prec, .cmdline = cmd, .header_cmdline = hcmd, .source_name = path, .from_ir = is_ir};
    emit(m, o->target, &eo, hout, out);
  }
  return true;
}

/* Whether dir's last component is what the cavs command names its build directories
   (afile.c's temporary name for "build") */
static bool cavs_build_dir(const char *dir) {
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/') n--;
  size_t b = n;
  while (b > 0 && dir[b - 1] != '/') b--;
  char last[512];
  if (n - b >= sizeof last) return false;
  memcpy(last, dir + b, n - b);
  last[n - b] = 0;
  return cv_afile_is_temp(last, "build");
}

/* Whether `name` in dfd is another file than the one it was (`had`: there was one, as
   `before`), or one where there was none: a write_end's rename done, whatever it said. */
static bool replaced(int dfd, const char *name, bool had, const struct stat *before) {
  struct stat now;
  return fstatat(dfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
         (!had || now.st_dev != before->st_dev || now.st_ino != before->st_ino);
}

/* The earlier code, kept aside as `kept` while the new code (`cp`, `cf` in dfd) replaced
   it, back under its name after the pair failed. Where that rename fails too (a second
   fault) no design keeps the pair: the new code stays beside the earlier header (which
   it does not build against: it checks the header's stamp), and the message says where
   the earlier code is kept. */
static void put_back(int dfd, const char *kept, const char *cf, const char *cp) {
  if (renameat(dfd, kept, dfd, cf) == 0) return;
  error_plain("the earlier '%s' could not be put back (%s): it is kept as '%.*s%s', and '%s' is the new code, "
              "beside the earlier header",
              cp, strerror(errno), (int)(strlen(cp) - strlen(cf)), cp, kept, cp);
}

/* The header and the code into the locked directory dfd, as a pair: both written whole
   before either replaces its earlier file, and the earlier code kept under a temporary
   name until the header is in place too, so that a failure leaves the earlier pair as
   it was (a header whose rename failed: the code put back). Neither replaces a file
   cavsc did not write (the names are the model's, and a user's own NAME.c may be
   there), nor a directory: found before any rename. */
static bool write_pair(int dfd, const char *hp, const char *hf, const char *hbuf, size_t hlen, const char *cp,
                       const char *cf, const char *buf, size_t buflen) {
  char why[256];
  const char *bad = !cv_output_replaceable(hp, hf, NULL, why, sizeof why)   ? hp
                    : !cv_output_replaceable(cp, cf, NULL, why, sizeof why) ? cp
                                                                            : NULL;
  if (bad) {
    error_plain("cannot write '%s': %s", bad, why);
    return false;
  }
  cv_afile ha, ca;
  if (!write_begin(&ha, hp, 0, hbuf, hlen)) return false;
  if (!write_begin(&ca, cp, 0, buf, buflen)) {
    cv_afile_abort(&ha);
    return false;
  }
  /* (a name the next write of the code sweeps, if this process dies holding it) */
  char kept[512];
  cv_afile_new_temp_name(cf, kept, sizeof kept);
  struct stat h0, c0;
  bool had_h = fstatat(dfd, hf, &h0, AT_SYMLINK_NOFOLLOW) == 0;
  bool had_c = fstatat(dfd, cf, &c0, AT_SYMLINK_NOFOLLOW) == 0;
  /* The earlier code kept, or nothing replaced: without it a header failing after the
     code's rename would take the new code back and leave the earlier header beside no
     code at all, the earlier code lost (a link refused, then a rename: two faults). */
  int k = cv_afile_keep_aside(dfd, cf, dfd, kept);
  if (k < 0) {
    error_plain("cannot write '%s': keeping the earlier file while it is replaced: %s", cp, strerror(errno));
    cv_afile_abort(&ca);
    cv_afile_abort(&ha);
    return false;
  }
  bool has_kept = k == 1;
  if (!write_end(&ca)) {
    /* a failure after the code's rename (its directory not flushed) leaves the new code
       in place: the earlier taken back, as the header's failure below does */
    cv_afile_abort(&ha);
    bool moved = replaced(dfd, cf, had_c, &c0);
    if (moved && has_kept) put_back(dfd, kept, cf, cp);
    else if (moved && !had_c) unlinkat(dfd, cf, 0);
    else if (has_kept) unlinkat(dfd, kept, 0);
    return false;
  }
  if (!write_end(&ha)) {
    /* the header not renamed (the old one, or none, still there): the code taken back */
    bool moved = replaced(dfd, hf, had_h, &h0);
    if (!moved && has_kept) put_back(dfd, kept, cf, cp);
    else if (!moved) unlinkat(dfd, cf, 0);
    else if (has_kept) unlinkat(dfd, kept, 0);
    return false;
  }
  if (has_kept) unlinkat(dfd, kept, 0);
  return true;
}

/* What the passes wrote, to its place: a dump to -o's file or standard output, the code
   as DIR/MODEL.h and DIR/MODEL.c (or .cu); --check writes nothing */
static bool write_outputs(const Cli *o, const Model *m, const char *buf, size_t buflen, const char *hbuf,
                          size_t hlen) {
  if (o->check_only) return true;
  if (o->dump != DUMP_NONE) {
    /* (never over the model it read: `--dump=ir m.ir -o m.ir` would lose its comments;
       nor over the file standard input reads, `--dump=ir - -o m.vf < m.vf`) */
    struct stat si, so;
    bool in = o->input && !strcmp(o->input, "-");
    if (o->out_path && (in ? fstat(0, &si) == 0 && S_ISREG(si.st_mode) : o->input && stat(o->input, &si) == 0) &&
        stat(o->out_path, &so) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
      error_plain("-o %s would overwrite the model it reads, %s", o->out_path, in ? "standard input" : o->input);
      return false;
    }
    if (o->out_path) return write_atomic(o->out_path, buf, buflen);
    if (fwrite(buf, 1, buflen, stdout) != buflen || fflush(stdout) != 0) {
      error_plain("cannot write to standard output: %s", strerror(errno));
      return false;
    }
    return true;
  }
  const char *dir = o->out_path ? o->out_path : ".";
  if (!make_dirs(dir)) return false;
  char *hf = arena_printf("%s.h", m->name), *cf = arena_printf("%s.%s", m->name, o->target->ext);
  char *hp = arena_printf("%s/%s", dir, hf), *cp = arena_printf("%s/%s", dir, cf);
  /* One cavsc at a time writes a directory's code: another's renames between this one's
     two would leave its header beside this one's code (23 of 60 pairs of runs at once
     did). An exclusive flock(2) on the directory, which the kernel drops however the
     process ends; but not in a build directory of the cavs command's (driver/cache.c's
     lock_temp_dir), which that command holds locked, for itself alone, while it runs
     this cavsc: waiting for it would never end. */
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    error_plain("cannot open the output directory '%s': %s", dir, strerror(errno));
    return false;
  }
  if (!cavs_build_dir(dir))
    while (flock(dfd, LOCK_EX) < 0 && errno == EINTR) {}
  bool done = write_pair(dfd, hp, hf, hbuf, hlen, cp, cf, buf, buflen);
  close(dfd); /* (and the lock with it) */
  return done;
}

int main(int argc, char **argv) {
  Cli o;
  int rc = parse_args(argc, argv, &o);
  if (rc >= 0) return rc;
  size_t len;
  char *text = read_file(o.input, &len);
  if (!text) return 1;
  /* from here on every way out goes through `done`, which frees what was made */
  int status = 1;
  char *buf = NULL, *hbuf = NULL;
  size_t buflen = 0, hlen = 0;
  FILE *out = NULL, *hout = NULL;
  /* from here on the input is known by its name: its path, or what --source-name says */
  const char *path = o.source_name ? o.source_name : strcmp(o.input, "-") ? o.input : "<stdin>";
  diag_init(path, text, len);

  /* a .ir file is what --dump=ir printed: it enters the pipeline after sema; by its name,
     since the driver hands a model file to cavsc on standard input, named */
  size_t plen = strlen(path);
  bool is_ir = plen > 3 && !strcmp(path + plen - 3, ".ir");
  Decl *decls = NULL;
  if (!is_ir) {
    decls = parse_source(path, text, len);
    if (diag_count()) goto done;
  } else if (o.dump == DUMP_AST) {
    error_plain("--dump=ast needs a .vf file, not IR");
    goto done;
  }

  out = emit_hold(&buf, &buflen);
  hout = emit_hold(&hbuf, &hlen);
  Model *m = NULL;
  if (!run_passes(&o, path, text, len, is_ir, decls, out, hout, &m)) goto done;
  FILE *held[2] = {out, hout};
  out = hout = NULL;
  emit_unhold(held[0]);
  emit_unhold(held[1]);
  if (!write_outputs(&o, m, buf, buflen, hbuf, hlen)) goto done;
  status = 0;
done:
  if (out) fclose(out);
  if (hout) fclose(hout);
  free(buf);
  free(hbuf);
  free(text);
  return status;
}

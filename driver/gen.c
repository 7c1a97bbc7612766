/* gen.c: cavs gen, synthetic data sets (the generators are libcavs's cavs_gen_*),
 * written whole or not at all (afile.c). */
#include "afile.h"
#include "driver.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int cmd_gen(int argc, char **argv) {
  const char *kind = NULL, *out = NULL;
  long graphs = 1000, leaves = 16, words = 24, classes = 5, vertices = 31;
  uint64_t seed = 1;
  int dag = 0, chars = 0, arity = 4;
  bool words_given = false, classes_given = false;
  optind = 0;
  for (int ch; (ch = next_option(argc, argv, CMD_GEN)) != -1;) {
    switch (ch) {
    case 1:
      if (kind) die(1, "gen: unexpected argument '%s'", optarg);
      kind = optarg;
      break;
    case OPT_GRAPHS: graphs = parse_long("graphs", optarg, 1, 10000000); break;
    case OPT_LEAVES: leaves = parse_long("leaves", optarg, 2, 1 << 20); break;
    case OPT_WORDS: words = parse_long("words", optarg, 1, 1000000), words_given = true; break;
    case OPT_GEN_SEED: seed = parse_u64("seed", optarg); break;
    case OPT_CLASSES: classes = parse_long("classes", optarg, 1, 1000000), classes_given = true; break;
    case OPT_VERTICES: vertices = parse_long("vertices", optarg, 1, 1000000); break;
    case OPT_DAG: dag = 1; break;
    case OPT_CHARS: chars = 1; break;
    case OPT_ARITY: arity = (int)parse_long("arity", optarg, 2, CAVS_MAX_SET); break;
    case OPT_OUTPUT: out = optarg; break;
    }
  }
  if (optind < argc) {
    if (kind || optind + 1 < argc) die(1, "gen: unexpected argument '%s'", argv[optind + !kind]);
    kind = argv[optind];
  }
  if (!kind)
    die(1, "gen: usage: cavs gen toy|nary|complete|random|tagger|lattice|translation [options] -o FILE (cavs help gen)");
  if (!out) die(1, "gen: -o FILE is required");
  static const char *const kinds[] = {"toy", "translation", "lattice", "nary", "complete", "tagger", "random"};
  bool known = false;
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) known |= !strcmp(kind, kinds[i]);
  if (!known) die(1, "gen: unknown kind '%s' (toy, nary, complete, random, tagger, lattice, translation)", kind);
  check_output("o", out, NULL, NULL, 0);
  /* written whole or not at all (afile.c), through a stream of its own descriptor */
  cv_afile a;
  char err[1024];
  if (cv_afile_open(&a, out, CV_AFILE_USER, err, sizeof err)) die(file_status(errno), "%s", err);
  int fd = dup(a.fd);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    if (fd >= 0) close(fd);
    cv_afile_abort(&a);
    die(file_status(errno), "cannot write '%s': %s", out, strerror(errno));
  }
  int rc;
  if (!strcmp(kind, "toy")) rc = cavs_gen_toy(f, (int)graphs, (int)leaves, (int)words, (uint64_t)seed);
  else if (!strcmp(kind, "translation"))
    rc = cavs_gen_translation(f, (int)graphs, words_given ? (int)words : 30, (uint64_t)seed);
  else if (!strcmp(kind, "lattice"))
    rc = cavs_gen_lattice(f, (int)graphs, 30, words_given ? (int)words : 3000, classes_given ? (int)classes : 8,
                          (uint64_t)seed);
  else if (!strcmp(kind, "nary")) rc = cavs_gen_nary(f, (int)graphs, (int)leaves, (int)words, arity, (uint64_t)seed);
  else if (!strcmp(kind, "complete")) /* two classes by default, as treefc.vf has */
    rc = cavs_gen_complete(f, (int)graphs, (int)leaves, (int)words, classes_given ? (int)classes : 2, (uint64_t)seed);
  else if (!strcmp(kind, "tagger"))
    rc = cavs_gen_tagger(f, (int)graphs, words_given ? (int)words : 1000, classes_given ? (int)classes : 12, chars,
                         (uint64_t)seed);
  else rc = cavs_gen_random(f, (int)graphs, (int)vertices, (int)words, (int)classes, dag, (uint64_t)seed);
  int e = errno;
  if (fclose(f) && !rc) rc = -1, e = errno;
  if (rc) {
    cv_afile_abort(&a);
    die(file_status(e), "cannot write '%s': %s", out, strerror(e));
  }
  if (cv_afile_commit(&a, err, sizeof err)) die(file_status(errno), "%s", err);
  return 0;
}

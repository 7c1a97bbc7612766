/* main.c: the `cavs` command, a thin CLI over libcavs (as jq's main.c is over libjq):
 * the options, numbers parsed whole and in range, and the dispatch to a command.
 *
 *   cavs train MODEL.vf|MODEL.so --format F --train FILE [--dev FILE] [options]
 *   cavs eval CKPT --data FILE        cavs predict CKPT --data FILE
 *   cavs gen KIND [options] -o FILE                            cavs info CKPT
 *   cavs build MODEL.vf [--precision float|double] [--target c|cuda] [--emit-only] [-o DIR]
 *
 * Each command has its file (train.c, eval.c, gen.c; build is in build.c). A .vf model
 * is compiled through cavsc and the system C compiler into a shared object in the
 * compile cache (build.c, cache.c), then loaded. Exit status: 0 success, 1 user error,
 * 2 internal error or memory, 128 + the signal when SIGINT or SIGTERM stopped training. */
#include "driver.h"
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- numbers on the command line: whole, in range, never silently cut ---- */

long parse_long(const char *opt, const char *s, long lo, long hi) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end || errno == ERANGE || v < lo || v > hi)
    die(1, "--%s: '%s' is not an integer from %ld to %ld", opt, s, lo, hi);
  return v;
}

uint64_t parse_u64(const char *opt, const char *s) {
  char *end;
  errno = 0;
  uint64_t v = strtoull(s, &end, 10);
  /* strtoull takes "-1" as 2^64 - 1: only digits are a count */
  if (end == s || *end || errno == ERANGE || *s < '0' || *s > '9')
    die(1, "--%s: '%s' is not an integer from 0 to %llu", opt, s, (unsigned long long)UINT64_MAX);
  return v;
}

/* A finite real in [lo, hi]; with open_lo, lo itself is out. */
static double parse_real(const char *opt, const char *s, double lo, double hi, bool open_lo) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end || errno == ERANGE || !isfinite(v) || v < lo || v > hi || (open_lo && v == lo))
    die(1, "--%s: '%s' is not a number %s %g and at most %g", opt, s, open_lo ? "above" : "of at least", lo, hi);
  return v;
}

/* Bytes, with an optional binary suffix: 512M, 8G, 1T. */
static size_t parse_size(const char *opt, const char *s) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  double unit = 1;
  if (*end && !end[1]) {
    const char *u = strchr("KMGT", *end == 'k' ? 'K' : *end);
    if (u && *u) unit = (double)(1ull << (10 * (1 + (u - "KMGT"))));
    if (u && *u) end++;
  }
  if (end == s || *end || !isfinite(v) || v <= 0 || v * unit > 1e18)
    die(1, "--%s: '%s' is not a size (bytes, or with K, M, G or T)", opt, s);
  return (size_t)(v * unit);
}

static const char usage[] =
    "usage: cavs train MODEL.vf|MODEL.so --format FMT --train FILE [--dev FILE] [options]\n"
    "       cavs eval CKPT --data FILE [--format FMT] [--model MODEL.vf|MODEL.so] [--json]\n"
    "       cavs predict CKPT --data FILE [--format FMT] [--model MODEL.vf|MODEL.so] [--all-nodes] [--vectors|--probs|--value NAME]\n"
    "                [--greedy INPUT [--stop CLASS] [--max-steps N]]   (decoding: seq2seq.vf)\n"
    "       cavs gen toy|nary|complete|random|tagger|lattice|translation [--graphs N] [--leaves L]\n"
    "                [--vertices V] [--words W] [--classes C] [--arity A] [--seed S] [--dag] [--chars] -o FILE\n"
    "       cavs info CKPT\n"
    "       cavs plot LOG -o FILE.png   (a training --log's curves, drawn by gnuplot)\n"
    "       cavs build MODEL.vf [--precision float|double] [--target c|cuda] [--no-fuse] [--no-merge]\n"
    "                [--no-homes] [--emit-only] [-o DIR]\n"
    "train options:\n"
    "  --epochs N  --batch N  --optimizer sgd|adagrad|adam  --lr X  --clip X\n"
    "  --weight-decay X  --seed N  --dim NAME=VALUE  --save CKPT  --resume CKPT\n"
    "  --init PARAM=FILE (pre-trained vectors, GloVe or word2vec text)  --freeze PARAM\n"
    "  --lr-decay X  --lr-step N  --warmup N  --patience N  --select all|root|loss\n"
    "  --threads N  --max-memory SIZE  --log FILE  --quiet\n"
    "train, eval and predict: --device cpu|cuda (default: cuda where it can run, else cpu)\n"
    "  --one-stream (cuda: the eager phase does not overlap the path tasks)\n"
    "  --cuda-graphs (cuda: each pass captured as a CUDA graph, launched whole)\n"
    "  batching: --policy bfs|depth|agenda|frontier|serial\n"
    "  ablations: --no-eager  --no-lazy  --no-views  --no-fuse  --no-merge  --no-homes\n"
    "  --blas (cpu: every product through the BLAS, not libcavs's own AVX-512 sgemm)\n"
    "See cavs(1).\n";

/* long options without a letter of their own */
enum { OPT_FREEZE = 0x100, OPT_ALL_NODES, OPT_JSON, OPT_VECTORS, OPT_PROBS, OPT_LR_DECAY, OPT_LR_STEP, OPT_WARMUP, OPT_PATIENCE, OPT_SELECT, OPT_VALUE,
       OPT_GREEDY, OPT_STOP, OPT_MAX_STEPS, OPT_NO_HOMES };

/* The default --threads: what the environment asks of a numerical program
   (OMP_NUM_THREADS, then OPENBLAS_NUM_THREADS) when it is a whole number from 1 to 1024,
   else the processors online. */
static int default_threads(void) {
  static const char *const vars[] = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *v = getenv(vars[i]);
    char *end;
    if (!v || !*v) continue;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (!errno && !*end && n >= 1 && n <= 1024) return (int)n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > 1024 ? 1024 : (int)n;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    fputs(usage, stderr);
    return 1;
  }
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(usage, stdout);
      return 0;
    }
  if (!strcmp(argv[1], "--version")) {
    printf("cavs %s\n", CAVS_VERSION);
    return 0;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "gen")) return cmd_gen(argc - 1, argv + 1);
  if (!strcmp(cmd, "build")) return cmd_build(argc - 1, argv + 1);
  if (!strcmp(cmd, "plot")) return cmd_plot(argc - 1, argv + 1);
  TrainOpts o = {.epochs = 10, .batch = 64, .threads = default_threads(), .seed = 1,
                 .optim = {.kind = CAVS_ADAM, .lr = 1e-3}};
  const char *data = NULL, *format = NULL, *model_opt = NULL;
  static const struct option lo[] = {
      {"format", 1, 0, 'f'}, {"train", 1, 0, 't'}, {"dev", 1, 0, 'd'}, {"epochs", 1, 0, 'e'},
      {"batch", 1, 0, 'b'}, {"optimizer", 1, 0, 'O'}, {"lr", 1, 0, 'l'}, {"clip", 1, 0, 'c'},
      {"weight-decay", 1, 0, 'w'}, {"seed", 1, 0, 's'}, {"dim", 1, 0, 'D'}, {"save", 1, 0, 'S'},
      {"resume", 1, 0, 'r'}, {"threads", 1, 0, 'j'}, {"log", 1, 0, 'L'}, {"quiet", 0, 0, 'q'},
      {"data", 1, 0, 'x'}, {"model", 1, 0, 'M'}, {"max-memory", 1, 0, 'X'}, {"device", 1, 0, 'G'},
      {"one-stream", 0, 0, 'o'}, {"cuda-graphs", 0, 0, 'g'}, {"blas", 0, 0, 'B'}, {"init", 1, 0, 'I'},
      {"freeze", 1, 0, OPT_FREEZE}, {"all-nodes", 0, 0, OPT_ALL_NODES}, {"json", 0, 0, OPT_JSON},
      {"vectors", 0, 0, OPT_VECTORS}, {"probs", 0, 0, OPT_PROBS}, {"value", 1, 0, OPT_VALUE}, {"lr-decay", 1, 0, OPT_LR_DECAY},
      {"lr-step", 1, 0, OPT_LR_STEP}, {"warmup", 1, 0, OPT_WARMUP}, {"patience", 1, 0, OPT_PATIENCE},
      {"select", 1, 0, OPT_SELECT}, {"greedy", 1, 0, OPT_GREEDY}, {"stop", 1, 0, OPT_STOP},
      {"max-steps", 1, 0, OPT_MAX_STEPS},
      {"policy", 1, 0, 'P'}, {"no-eager", 0, 0, 'E'}, {"no-lazy", 0, 0, 'Z'}, {"no-views", 0, 0, 'W'}, {"no-fuse", 0, 0, 'F'},
      {"no-merge", 0, 0, 'N'}, {"no-homes", 0, 0, OPT_NO_HOMES}, {0, 0, 0, 0}};
  optind = 2;
  opterr = 0; /* opt_complain says what was wrong */
  int ch;
  const char *positional = NULL;
  bool all_nodes = false, json = false, vectors = false, probs = false;
  const char *value = NULL;
  GreedyOpts greedy = {.stop = -1};
  bool stop_set = false;
  while ((ch = getopt_long(argc, argv, "-", lo, NULL)) != -1) {
    switch (ch) {
    case 1:
      if (positional) die(1, "%s: unexpected argument '%s'", cmd, optarg);
      positional = optarg;
      break;
    case 'f': format = optarg; break;
    case 't': o.train = optarg; break;
    case 'd': o.dev = optarg; break;
    case 'x': data = optarg; break;
    case 'M': model_opt = optarg; break;
    case 'e': o.epochs = (int)parse_long("epochs", optarg, 1, 1000000); break;
    case 'b': o.batch = (int)parse_long("batch", optarg, 1, 1 << 20); o.set_batch = true; break;
    case 'G': model_opts.backend = optarg; break;
    case 'o': model_opts.one_stream = 1; break;
    case 'B': model_opts.blas = 1; break;
    case 'I':
      if (o.ninit == 8) die(1, "--init: at most 8");
      o.init[o.ninit++] = optarg;
      break;
    case OPT_ALL_NODES: all_nodes = true; break;
    case OPT_JSON: json = true; break;
    case OPT_VECTORS: vectors = true; break;
    case OPT_PROBS: probs = true; break;
    case OPT_VALUE: value = optarg; break;
    case OPT_GREEDY: greedy.input = optarg; break;
    case OPT_STOP: greedy.stop = (int)parse_long("stop", optarg, 0, 1 << 24); stop_set = true; break;
    case OPT_MAX_STEPS:
      if (strtol(optarg, NULL, 10) > GREEDY_MAX_STEPS)
        die(1, "--max-steps %s: at most %d (each step runs the whole graph again: n steps cost n^2/2 vertex evaluations)",
            optarg, GREEDY_MAX_STEPS);
      greedy.max_steps = (int)parse_long("max-steps", optarg, 1, GREEDY_MAX_STEPS);
      break;
    case OPT_LR_DECAY: o.lr_decay = parse_real("lr-decay", optarg, 0, 1, true); o.set_sched = true; break;
    case OPT_LR_STEP: o.lr_step = (int)parse_long("lr-step", optarg, 1, 1000000); o.set_sched = true; break;
    case OPT_WARMUP: o.warmup = (int)parse_long("warmup", optarg, 0, 1 << 30); o.set_sched = true; break;
    case OPT_PATIENCE: o.patience = (int)parse_long("patience", optarg, 1, 1000000); o.set_sched = true; break;
    case OPT_SELECT:
      if (!strcmp(optarg, "all")) o.select = SELECT_ALL;
      else if (!strcmp(optarg, "root")) o.select = SELECT_ROOT;
      else if (!strcmp(optarg, "loss")) o.select = SELECT_LOSS;
      else die(1, "--select: '%s' is not all, root or loss", optarg);
      break;
    case OPT_FREEZE:
      if (o.nfreeze == 8) die(1, "--freeze: at most 8");
      o.freeze[o.nfreeze++] = optarg;
      break;
    case 'g': model_opts.graphs = 1; break;
    case 'P':
      if (!strcmp(optarg, "bfs")) model_policy = CAVS_BFS;
      else if (!strcmp(optarg, "depth")) model_policy = CAVS_DEPTH;
      else if (!strcmp(optarg, "agenda")) model_policy = CAVS_AGENDA;
      else if (!strcmp(optarg, "frontier")) model_policy = CAVS_FRONTIER;
      else if (!strcmp(optarg, "serial")) model_policy = CAVS_SERIAL;
      else die(1, "--policy: '%s' is not bfs, depth, agenda, frontier or serial", optarg);
      break;
    case 'E': model_ablations |= CAVS_NO_EAGER; break;
    case 'Z': model_ablations |= CAVS_NO_LAZY; break;
    case 'W': model_ablations |= CAVS_NO_VIEWS; break;
    case 'F': build_ablations |= 1; break;
    case 'N': build_ablations |= 2; break;
    case OPT_NO_HOMES: build_ablations |= 4; break;
    case 'j': o.threads = (int)parse_long("threads", optarg, 1, 1024); break;
    case 's': o.seed = parse_u64("seed", optarg); break;
    case 'l': o.optim.lr = parse_real("lr", optarg, 0, 1e30, true); o.set_lr = true; break;
    case 'c': o.optim.clip = parse_real("clip", optarg, 0, 1e30, false); o.set_clip = true; break;
    case 'w': o.optim.weight_decay = parse_real("weight-decay", optarg, 0, 1e6, false); o.set_wd = true; break;
    case 'X': cavs_set_memory_limit(parse_size("max-memory", optarg)); break;
    case 'O':
      o.set_kind = true;
      o.optim.kind = cavs_optim_kind(optarg);
      if (o.optim.kind < 0) {
        char names[128] = "";
        for (int k = 0; k < CAVS_OPTIM_COUNT; k++)
          snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", cavs_optim_name(k));
        die(1, "unknown optimizer '%s' (%s)", optarg, names);
      }
      break;
    case 'D':
      if (o.ndimset == 64) die(1, "too many --dim options");
      o.dimset[o.ndimset++] = optarg;
      break;
    case 'S': o.save = optarg; break;
    case 'r': o.resume = optarg; break;
    case 'L': o.log = optarg; break;
    case 'q': o.quiet = 1; break;
    case '?': opt_complain("cavs", cmd, argv[optind - 1], lo); return 1;
    default: fputs(usage, stderr); return 1;
    }
  }
  /* after `--`, getopt stops: what is left is the positional argument */
  for (; optind < argc; optind++) {
    if (positional) die(1, "%s: unexpected argument '%s'", cmd, argv[optind]);
    positional = argv[optind];
  }
  if (!o.set_lr) o.optim.lr = cavs_optim_default_lr(o.optim.kind);
  model_opts.threads = o.threads;
  if (!strcmp(cmd, "train") || !strcmp(cmd, "eval") || !strcmp(cmd, "predict")) model_opts.backend = check_device(model_opts.backend);
  if (!strcmp(cmd, "train")) {
    o.model = positional;
    o.format = format;
    return cmd_train(&o);
  }
  if (!strcmp(cmd, "eval") || !strcmp(cmd, "predict")) {
    if (all_nodes && strcmp(cmd, "predict")) die(1, "%s: --all-nodes is an option of predict", cmd);
    if (json && strcmp(cmd, "eval")) die(1, "%s: --json is an option of eval", cmd);
    if ((vectors || probs) && strcmp(cmd, "predict")) die(1, "%s: --%s is an option of predict", cmd, vectors ? "vectors" : "probs");
    if (value && strcmp(cmd, "predict")) die(1, "%s: --value is an option of predict", cmd);
    if ((vectors != 0) + (probs != 0) + (value != NULL) > 1) die(1, "predict: one of --vectors, --probs and --value");
    if (greedy.input && strcmp(cmd, "predict")) die(1, "%s: --greedy is an option of predict", cmd);
    if ((stop_set || greedy.max_steps) && !greedy.input) die(1, "%s: --stop and --max-steps go with --greedy", cmd);
    if (greedy.input && (vectors || probs || value || all_nodes))
      die(1, "predict: --greedy prints the decoded words; it takes no --vectors, --probs, --value or --all-nodes");
    return cmd_eval(positional, model_opt, data, format, o.batch, !strcmp(cmd, "predict"), all_nodes, json, vectors,
                    probs, value, greedy.input ? &greedy : NULL);
  }
  if (!strcmp(cmd, "info")) return cmd_info(positional);
  die(1, "unknown command '%s' (train, eval, predict, gen, info, build, plot)", cmd);
}

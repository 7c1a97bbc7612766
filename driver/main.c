/* main.c: the `cavs` command, a thin CLI over libcavs (as jq's main.c is over libjq):
 * numbers parsed whole and in range, the options of train, eval, predict and info (the
 * table of every command's options is options.def, put to work by options.c), and the
 * dispatch to a command.
 *
 *   cavs train MODEL.vf|MODEL.so --format F --train FILE [--dev FILE] [options]
 *   cavs eval CKPT --data FILE        cavs predict CKPT --data FILE
 *   cavs gen KIND [options] -o FILE                            cavs info CKPT
 *   cavs build MODEL.vf [--precision float|double] [--target c|cuda] [--emit-only] [-o DIR]
 *   cavs plot LOG -o FILE.png                                  cavs help [COMMAND]
 *
 * Each command has its file (train.c, eval.c, gen.c, plot.c; build is in build.c). A .vf model
 * is compiled through cavsc and the system C compiler into a shared object in the
 * compile cache (build.c, cache.c), then loaded. Exit status: 0 success, 1 user error,
 * 2 internal error or memory, 128 + the signal when SIGINT or SIGTERM stopped training. */
#include "driver.h"
#include "dist.h"

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

/* A number above 0 and below 1. */
static double parse_fraction(const char *opt, const char *s) {
  double v = parse_real(opt, s, 0, 1, true);
  if (v == 1) die(1, "--%s: '%s' is not a number above 0 and below 1", opt, s);
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

/* --save-every: a count of minibatches, or a time with its unit (s, m or h), up to
   10^9 minibatches or 10^7 s (115 days) */
static void parse_save_every(TrainOpts *o, const char *s) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  const char *units = "smh";
  const char *u = *end && !end[1] ? strchr(units, *end) : NULL;
  static const double secs[] = {1, 60, 3600};
  bool digits = end > s && strspn(s, "0123456789.") == (size_t)(end - s); /* (not 1e3, 0x10, inf) */
  if (u && *u && digits && isfinite(v) && v > 0 && v * secs[u - units] <= 1e7) {
    o->save_secs = v * secs[u - units];
    return;
  }
  if (!*end && digits && v >= 1 && v <= 1e9 && v == (long)v) {
    o->save_steps = (long)v;
    return;
  }
  die(1, "--save-every: '%s' is not a count of minibatches (1 to 10^9) nor a time (90s, 30m, 2h; at most 10^7 s)", s);
}

/* The operands and options of train, eval, predict and info, as given. */
typedef struct RunArgs {
  TrainOpts o;
  const char *data, *format, *model, *positional, *value;
  bool all_nodes, vectors, probs, stop_set;
  EvalOpts eval;
  GreedyOpts greedy;
} RunArgs;

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

/* --policy NAME */
static int policy_of(const char *s) {
  static const char *const names[] = {[CAVS_BFS] = "bfs", [CAVS_DEPTH] = "depth", [CAVS_AGENDA] = "agenda",
                                      [CAVS_FRONTIER] = "frontier", [CAVS_SERIAL] = "serial"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (names[i] && !strcmp(s, names[i])) return (int)i;
  die(1, "--policy: '%s' is not bfs, depth, agenda, frontier or serial", s);
}

/* --optimizer NAME */
static int optimizer_of(const char *s) {
  int k = cavs_optim_kind(s);
  if (k >= 0) return k;
  char names[128] = "";
  for (int i = 0; i < CAVS_OPTIM_COUNT; i++)
    snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", cavs_optim_name(i));
  die(1, "unknown optimizer '%s' (%s)", s, names);
}

/* --schedule NAME */
static int schedule_of(const char *s) {
  int k = sched_kind(s);
  if (k < 0) die(1, "--schedule: '%s' is not constant, step, cosine or plateau", s);
  return k;
}

/* What the model runs with, for train, eval and predict alike. */
static bool model_option(int id, const char *arg) {
  switch (id) {
  case OPT_DEVICE: model_opts.backend = arg; break;
  case OPT_ONE_STREAM: model_opts.one_stream = 1; break;
  case OPT_CUDA_GRAPHS: model_opts.graphs = 1; break;
  case OPT_BLAS: model_opts.blas = 1; break;
  case OPT_POLICY: model_policy = policy_of(arg); break;
  case OPT_NO_EAGER: model_ablations |= CAVS_NO_EAGER; break;
  case OPT_NO_LAZY: model_ablations |= CAVS_NO_LAZY; break;
  case OPT_NO_VIEWS: model_ablations |= CAVS_NO_VIEWS; break;
  case OPT_NO_DEDUP: model_ablations |= CAVS_NO_DEDUP; break;
  case OPT_NO_FUSE: build_ablations |= 1; break;
  case OPT_NO_MERGE: build_ablations |= 2; break;
  case OPT_NO_HOMES: build_ablations |= 4; break;
  case OPT_NO_PUSH_VIEW: build_ablations |= 8; break;
  case OPT_MAX_MEMORY: cavs_set_memory_limit(parse_size("max-memory", arg)); break;
  case OPT_PRECISION:
    if (strcmp(arg, "float") && strcmp(arg, "double")) die(1, "--precision: '%s' is not float or double", arg);
    model_precision = arg;
    break;
  default: return false;
  }
  return true;
}

/* One option of train, eval or predict (next_option has held each to its commands). */
static void run_option(RunArgs *a, int id, const char *arg) {
  TrainOpts *o = &a->o;
  if (model_option(id, arg)) return;
  switch (id) {
  case OPT_FORMAT: a->format = arg; break;
  case OPT_TRAIN_FILE: o->train = arg; break;
  case OPT_DEV: o->dev = arg; break;
  case OPT_DATA: a->data = arg; break;
  case OPT_MODEL: a->model = arg; break;
  case OPT_EPOCHS: o->epochs = (int)parse_long("epochs", arg, 1, 1000000); break;
  case OPT_BATCH: o->batch = (int)parse_long("batch", arg, 1, 1 << 20), o->set_batch = true; break;
  case OPT_THREADS: o->threads = (int)parse_long("threads", arg, 1, 1024); break;
  case OPT_SEED: o->seed = parse_u64("seed", arg); break;
  case OPT_LR: o->optim.lr = parse_real("lr", arg, 0, 1e30, true), o->set_lr = true; break;
  case OPT_CLIP: o->optim.clip = parse_real("clip", arg, 0, 1e30, false), o->set_clip = true; break;
  case OPT_WEIGHT_DECAY: o->optim.weight_decay = parse_real("weight-decay", arg, 0, 1e6, false), o->set_wd = true; break;
  case OPT_OPTIMIZER: o->optim.kind = optimizer_of(arg), o->set_kind = true; break;
  case OPT_MOMENTUM: o->optim.momentum = parse_fraction("momentum", arg), o->set_momentum = true; break;
  case OPT_SCHEDULE: o->schedule = schedule_of(arg), o->set_sched = true; break;
  case OPT_LR_MIN: o->lr_min = parse_real("lr-min", arg, 0, 1e30, false), o->set_sched = true; break;
  case OPT_COSINE_EPOCHS: o->cosine_epochs = (int)parse_long("cosine-epochs", arg, 1, 1000000), o->set_sched = true; break;
  case OPT_PLATEAU_FACTOR: o->plateau_factor = parse_fraction("plateau-factor", arg), o->set_sched = true; break;
  case OPT_PLATEAU_PATIENCE:
    o->plateau_patience = (int)parse_long("plateau-patience", arg, 0, 1000000), o->set_sched = true;
    break;
  case OPT_LR_DECAY: o->lr_decay = parse_real("lr-decay", arg, 0, 1, true), o->set_sched = true; break;
  case OPT_LR_STEP: o->lr_step = (int)parse_long("lr-step", arg, 1, 1000000), o->set_sched = true; break;
  case OPT_LR_DECAY_START:
    o->lr_decay_start = (int)parse_long("lr-decay-start", arg, 1, 1000000), o->set_sched = true;
    break;
  case OPT_WARMUP: o->warmup = (int)parse_long("warmup", arg, 0, 1 << 30), o->set_sched = true; break;
  case OPT_PATIENCE: o->patience = (int)parse_long("patience", arg, 1, 1000000), o->set_sched = true; break;
  case OPT_BPTT_VARY: o->bptt_vary = parse_real("bptt-vary", arg, 0, CAVS_MAX_BPTT_VARY, false), o->set_vary = true; break;
  case OPT_BPTT_STATE:
    if (!strcmp(arg, "carry")) bptt_state = BPTT_CARRY;
    else if (!strcmp(arg, "reset")) bptt_state = BPTT_RESET;
    else die(1, "--bptt-state: '%s' is not carry or reset", arg);
    break;
  case OPT_SELECT:
    if (!strcmp(arg, "all")) o->select = SELECT_ALL;
    else if (!strcmp(arg, "root")) o->select = SELECT_ROOT;
    else if (!strcmp(arg, "loss")) o->select = SELECT_LOSS;
    else die(1, "--select: '%s' is not all, root or loss", arg);
    break;
  case OPT_DIM:
    if (o->ndimset == 64) die(1, "too many --dim options");
    o->dimset[o->ndimset++] = arg;
    break;
  case OPT_DROPOUT:
    o->dropout = parse_real("dropout", arg, 0, 1, false);
    if (o->dropout == 1) die(1, "--dropout: '%s' is not a probability from 0 to below 1", arg);
    break;
  case OPT_OPTION:
    if (o->noptset == 16) die(1, "too many --option options");
    o->optset[o->noptset++] = arg;
    break;
  case OPT_INIT:
    if (o->ninit == 8) die(1, "--init: at most 8");
    o->init[o->ninit++] = arg;
    break;
  case OPT_INIT_ALL: o->init_all = arg; break;
  case OPT_FREEZE:
    if (o->nfreeze == 8) die(1, "--freeze: at most 8");
    o->freeze[o->nfreeze++] = arg;
    break;
  case OPT_SAVE: o->save = arg; break;
  case OPT_SAVE_EVERY: o->save_steps = 0, o->save_secs = 0, parse_save_every(o, arg); break;
  case OPT_RESUME: o->resume = arg; break;
  case OPT_LOG: o->log = arg; break;
  case OPT_QUIET: o->quiet = 1; break;
  case OPT_STREAM: o->stream = true; break;
  case OPT_GRAD_OVERLAP: dist_overlap = true; break;
  case OPT_EXPERT_PARALLEL: dist_expert_parallel = true; break;
  case OPT_NO_EXPERT_REPLICAS: dist_expert_replicas = false; break;
  case OPT_JSON: a->eval.json = true; break;
  case OPT_BINARY: a->eval.binary = true; break;
  case OPT_ALL_NODES: a->all_nodes = true; break;
  case OPT_VECTORS: a->vectors = true; break;
  case OPT_PROBS: a->probs = true; break;
  case OPT_VALUE: a->value = arg; break;
  case OPT_GREEDY: a->greedy.input = arg; break;
  case OPT_STOP: a->greedy.stop = (int)parse_long("stop", arg, 0, 1 << 24), a->stop_set = true; break;
  case OPT_MAX_STEPS:
    if (strtol(arg, NULL, 10) > GREEDY_MAX_STEPS)
      die(1, "--max-steps %s: at most %d (each step runs the whole graph again: n steps cost n^2/2 vertex evaluations)",
          arg, GREEDY_MAX_STEPS);
    a->greedy.max_steps = (int)parse_long("max-steps", arg, 1, GREEDY_MAX_STEPS);
    break;
  default: die(2, "internal error at %s:%d: option %d has no handler", __FILE__, __LINE__, id);
  }
}

/* train, eval, predict and info: the options, then the command. */
static int run_command(int cmd, int argc, char **argv) {
  RunArgs a = {.o = {.epochs = 10, .batch = 64, .dropout = -1, .threads = default_threads(), .seed = 1,
                     .optim = {.kind = CAVS_ADAM, .lr = 1e-3}, .schedule = -1,
                     .plateau_patience = -1},
               .greedy = {.stop = -1}};
  const char *name = argv[0];
  optind = 0;
  for (int ch; (ch = next_option(argc, argv, cmd)) != -1;) {
    if (ch != 1) run_option(&a, ch, optarg);
    else if (a.positional) die(1, "%s: unexpected argument '%s'", name, optarg);
    else a.positional = optarg;
  }
  /* after `--`, getopt stops: what is left is the positional argument */
  for (; optind < argc; optind++) {
    if (a.positional) die(1, "%s: unexpected argument '%s'", name, argv[optind]);
    a.positional = argv[optind];
  }
  TrainOpts *o = &a.o;
  if (!o->set_lr) o->optim.lr = cavs_optim_default_lr(o->optim.kind);
  model_opts.threads = o->threads;
  if (cmd == CMD_INFO) return cmd_info(a.positional);
  model_opts.backend = check_device(model_opts.backend);
  if (cmd == CMD_TRAIN) {
    o->model = a.positional;
    o->format = a.format;
    return cmd_train(o);
  }
  if ((a.vectors != 0) + (a.probs != 0) + (a.value != NULL) > 1) die(1, "predict: one of --vectors, --probs and --value");
  if ((a.stop_set || a.greedy.max_steps) && !a.greedy.input) die(1, "predict: --stop and --max-steps go with --greedy");
  if (a.greedy.input && (a.vectors || a.probs || a.value || a.all_nodes))
    die(1, "predict: --greedy prints the decoded words; it takes no --vectors, --probs, --value or --all-nodes");
  a.eval.stream = o->stream;
  return cmd_eval(a.positional, a.model, a.data, a.format, o->batch, cmd == CMD_PREDICT, a.all_nodes, &a.eval,
                  a.vectors, a.probs, a.value, a.greedy.input ? &a.greedy : NULL);
}

/* `cavs --version`, `cavs --help`, and any prefix of them (--ver) */
static int top_options(int argc, char **argv) {
  optind = 0;
  for (int ch; (ch = next_option(argc, argv, CMD_TOP)) != -1;) {
    if (ch == OPT_VERSION) {
      printf("cavs %s\n", CAVS_VERSION);
      return 0;
    }
    if (ch == 1) unknown_command(optarg);
  }
  print_help(stderr, CMD_TOP);
  return 1;
}

/* `cavs help [COMMAND]` */
static int cmd_help(int argc, char **argv) {
  int about = CMD_TOP;
  optind = 0;
  for (int ch; (ch = next_option(argc, argv, CMD_HELP)) != -1;) {
    if (ch != 1) continue;
    if (about != CMD_TOP) die(1, "help: unexpected argument '%s'", optarg);
    about = command_of(optarg);
    if (about < 0) unknown_command(optarg);
  }
  if (optind < argc) die(1, "help: unexpected argument '%s'", argv[optind]);
  print_help(stdout, about);
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  json_watch();
  main_argc = argc, main_argv = (const char *const *)argv;
  if (argc < 2) {
    print_help(stderr, CMD_TOP);
    return 1;
  }
  int cmd = argv[1][0] == '-' ? CMD_TOP : command_of(argv[1]);
  if (cmd < 0) unknown_command(argv[1]);
  help_if_asked(argc, argv, cmd);
  switch (cmd) {
  case CMD_TOP: return top_options(argc, argv);
  case CMD_HELP: return cmd_help(argc - 1, argv + 1);
  case CMD_GEN: return cmd_gen(argc - 1, argv + 1);
  case CMD_BUILD: return cmd_build(argc - 1, argv + 1);
  case CMD_CACHE: return cmd_cache(argc - 1, argv + 1);
  case CMD_PLOT: return cmd_plot(argc - 1, argv + 1);
  case CMD_EXPORT: return cmd_export(argc - 1, argv + 1);
  default: return run_command(cmd, argc - 1, argv + 1);
  }
}

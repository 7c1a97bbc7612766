/* driver.h: what the files of the `cavs` command share; a section per file. Not
 * installed, not part of libcavs. Exit status throughout: 0 success, 1 user error, 2
 * internal error or memory, 128 + the signal when SIGINT or SIGTERM stopped training. */
#ifndef CAVS_DRIVER_H
#define CAVS_DRIVER_H

#include "cavs.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifndef CAVS_VERSION
#define CAVS_VERSION "0.2.0"
#endif

/* ---- util.c ---- */

extern const char *prog; /* "cavs": the start of every message */
/* called by die() before it exits: cavs train under mpirun ends every rank (dist.c) */
extern void (*die_hook)(int status);
/* "" or, under mpirun, "cavs: rank N: ": the start of a message that does not start with
   prog (a data file's file:line:col: error) */
extern const char *rank_tag;
/* the command line, as main() got it (cavs train under mpirun compares the ranks') */
extern int main_argc;
extern const char *const *main_argv;
/* how models are made: the backend (--device) and its threads (--threads) */
extern cavs_model_opts model_opts;
/* what --no-eager, --no-lazy and --policy ask of every model made (ablations) */
extern int model_ablations, model_policy;
/* train --precision, or a checkpoint's: what a model is built in (NULL: float) */
extern const char *model_precision;
/* what --no-fuse (1), --no-merge (2), --no-homes (4) and --no-push-view (8) ask of every
   model built from a .vf */
extern int build_ablations;

_Noreturn void die(int status, const char *fmt, ...);
/* exit(status), ending every rank under mpirun (die_hook): for a message already printed */
_Noreturn void quit(int status);
/* A failure reported by libcavs: status 2 when errno says memory ran out, else 1. */
_Noreturn void lib_die(const char *msg);
/* The exit status of a file that cannot be opened, read or written, by its errno: 2
   where memory ran out (ENOMEM), 1 (the user's to fix) for anything else: cavs(1) */
static inline int file_status(int e) { return e == ENOMEM ? 2 : 1; }
cavs_vocab *ckpt_vocab(const cavs_ckpt *k, const char *path);
double now(void);

/* The keep list: every block allocated here stays reachable until the command exits.
 * keep() adds one (and returns it); the x* functions and fmt() keep what they return. */
void *keep(void *p);
void *xmalloc(size_t n);
char *xstrdup(const char *s);
char *fmt(const char *f, ...);

/* A whole file, NUL-terminated and kept; NULL (errno set) when it cannot be opened. */
char *slurp(const char *path, size_t *len);
bool exists(const char *path);
/* Whether data format `f` is a language model's: text, text-bptt or text-bptt:N */
bool lm_format(const char *f);
/* --bptt-state: text-bptt's chunks carry the LSTM state from one to the next
   (stateful truncated BPTT, the default) or start from zeros */
enum { BPTT_DEFAULT, BPTT_CARRY, BPTT_RESET };
extern int bptt_state;
/* Whether a run on format `f` carries the state (dies for --bptt-state carry on a format
   whose graphs do not continue one another) */
bool carries(const char *f);
/* Without --bptt-state, text-bptt's chunks are read as a checkpoint's state says they
   were trained (format 9 on: from zeros, where the run was told reset) */
void bptt_as_saved(const cavs_train_state *cs);
/* The order of n chunks of one stream as `batch` streams side by side: stream s takes a
   contiguous run of the chunks (the first n % batch streams one more), and minibatch j
   (order[j * batch ...]) is the j-th chunk of every stream, so that graph g of a
   minibatch continues graph g of the one before (cavs_model_carry_state). Allocated. */
int *stream_order(int n, int batch);

/* ---- bptt.c: chunks of lengths that vary (--bptt-vary), and the generator of the
 * shuffles and the draws ---- */
uint64_t rng_next(uint64_t *s);
/* The lengths a chunk may be drawn at: at least 5 (N when the format's N is shorter), at
   most the longest text-bptt:N chunk */
enum { BPTT_VARY_MIN = 5, BPTT_VARY_MAX = 100000 };
/* A chunk length around n, as AWD-LSTM draws it: n with probability 0.95, else n / 2,
   plus a normal deviation of sd; truncated, and held to the bounds above. */
int bptt_draw(uint64_t *rng, int n, double sd);
/* An epoch's cut: its chunks, minibatch by minibatch (graph j * batch + s is stream s's
   j-th, and only the last minibatch has fewer than batch), the length each minibatch
   was drawn at, and N, the length of the data's chunks (the longest). */
typedef struct BpttCut {
  cavs_graph *g;
  int n, cap;
  int *len, nmb, capmb;
  int base;
  int *chain, chain_n; /* the child slots every chunk shares, for chain_n vertices */
} BpttCut;
/* The n graphs of a text-bptt data set (each `nint` integer inputs a vertex) cut again,
   by lengths drawn from *rng with deviation sd: 0, or -1 with why (graphs that are not
   chains back to back, or no memory). The graphs point into the data set's arrays. */
int bptt_cut(BpttCut *c, const cavs_graph *const *gs, int n, int nint, int batch, double sd, uint64_t *rng, char *why,
             size_t whylen);
void bptt_cut_free(BpttCut *c);

/* JSON (jansson): a real, or null where it is not finite; a value set in an object or
 * appended to an array (dies when memory ran out); an object written on one line of f
 * and flushed (and released), or die naming `what`. */
json_t *json_num(double x);
void json_set(json_t *obj, const char *key, json_t *v);
void json_push(json_t *arr, json_t *v);
char *json_text(const json_t *j, size_t flags);
/* json_loadb(text, n, flags, e), or die (status 2) where memory ran out as it parsed,
 * whatever it returned: jansson's parser tells no failed allocation from bad text. Its
 * allocations are watched from json_watch() on (main's first step). */
json_t *json_read(const char *text, size_t n, size_t flags, json_error_t *e);
void json_watch(void);
void json_write_line(json_t *obj, FILE *f, const char *what);
/* The same without dying: 0, or the write's errno (the line cut off again, or where that
   failed too, *cut_error its errno); obj released either way */
int json_put_line(json_t *obj, FILE *f, int *cut_error);

/* Dies unless `out` (the value of --opt) is a file this run may write: not a directory,
 * none of the n `inputs` (what[i] names each in the message), in a directory that
 * takes a new file. */
void check_output(const char *opt, const char *out, const char *const *inputs, const char *const *what, int n);

/* ---- options.c: the commands and their options, one table (options.def) ---- */

/* the commands, in the table's order; CMD_TOP: `cavs --OPTION` without one */
enum Command {
#define CMD(id, name, operands, summary) CMD_##id,
#include "options.def"
  CMD_COUNT,
  CMD_TOP = CMD_COUNT
};
/* a command as a bit of an option's mask */
enum {
#define CMD(id, name, operands, summary) C_##id = 1 << CMD_##id,
#include "options.def"
  C_TOP = 1 << CMD_COUNT
};
/* what next_option returns for each row: past every letter and getopt's 1 and '?' */
enum OptionId {
  OPT_FIRST = 0xff,
#define OPT(id, commands, short_, name, arg, dflt, meaning) OPT_##id,
#include "options.def"
};

/* The command named exactly so (commands take no abbreviation), or -1. */
int command_of(const char *name);
/* Dies: an unknown command, with the nearest one where the word looks like its typo. */
_Noreturn void unknown_command(const char *word);
/* The next option of `cmd` on the command line, getopt_long's way (any unambiguous
 * prefix of the command's options; the value as the next word or after '='): its
 * OPT_ id with optarg, 1 with optarg for an operand, -1 at the end (operands after `--`
 * from optind on). A word that is no option of `cmd` dies, said as opt_complain says
 * it, or naming the commands that take it; --help prints the command's help and exits
 * 0. Start a command line with optind = 0. */
int next_option(int argc, char **argv, int cmd);
/* `cavs help` (cmd CMD_TOP) or `cavs help COMMAND`: usage, summary, every option with
 * its meaning and default. */
void print_help(FILE *f, int cmd);
/* An argument that is exactly --help or -h, before any `--`: cmd's help, exit 0. */
void help_if_asked(int argc, char **argv, int cmd);

/* ---- main.c: numbers on the command line ---- */

long parse_long(const char *opt, const char *s, long lo, long hi);
uint64_t parse_u64(const char *opt, const char *s);

/* ---- build.c ---- */

typedef struct Loaded {
  const cavs_desc *desc;
  char *source; /* the .vf text, NULL for a prebuilt .so */
  char *name;
} Loaded;

/* --device NAME: dies unless a backend of that name can run here; returns it. For NULL
 * (no --device), the default: "cuda" where it can run, else NULL (the cpu). */
const char *check_device(const char *name);
/* "device: cpu, 2 threads": the first line of a command's output says where it runs */
void say_device(FILE *f, const cavs_model *m);
/* A model named on the command line: a .so loaded as given, else a .vf compiled. */
Loaded load_model_arg(const char *path);
/* The model whose source a checkpoint (read and checked whole) carries. */
Loaded load_from_ckpt(const cavs_ckpt *k, const char *ckpt_path);
/* argv[0] is "build" */
int cmd_build(int argc, char **argv);
int cmd_cache(int argc, char **argv);

/* ---- eval.c ---- */

/* A data file loaded, or streamed (cavs train --stream: indexed, read back a minibatch at
   a time); dies with the loader's message */
cavs_dataset *load_data(const char *path, const char *format, const cavs_desc *d, const long *dims, cavs_vocab *v,
                        int grow);
/* --stream's data, indexed or its index read from the cache (how many this run:
   streams_cached) */
extern int streams_cached;
cavs_stream *stream_data(const char *path, const char *format, const cavs_desc *d, const long *dims, cavs_vocab *v,
                         int grow);
/* Data an evaluation reads: loaded whole (set), or streamed (st: --stream, each
   minibatch read back from the file); one of the two */
typedef struct Data {
  cavs_dataset *set;
  cavs_stream *st;
} Data;
/* loaded, or with stream streamed (dies with the loader's message) */
Data open_data(const char *path, const char *format, const cavs_desc *d, const long *dims, cavs_vocab *v, bool stream);
void close_data(Data *s);
int data_count(const Data *s);
long data_vertices(const Data *s);
int data_graph_vertices(const Data *s, int i);
long data_max_feature(const Data *s, int slot);
/* graphs which[0..k) into gs: the set's, or read back from the stream into a data set
   returned for the caller to free (cavs_dataset_free) once it is done with them */
cavs_dataset *data_batch(Data *s, const int *which, int k, const cavs_graph **gs);

/* What a pass over data adds up to: the classification counts (softmax_xent losses) and
 * every loss on its own, so that a regression loss never enters an accuracy and a model
 * with several losses reports each. */
enum { MAX_LOSSES = 64 };
enum { MAX_ROUTES = 16 }; /* libcavs's routings a model may hold */
typedef struct Totals {
  double batch_loss; /* the minibatches' mean losses, summed (training) */
  int batches, nl;
  long count, correct, root_count, root_correct, graphs;
  double lsum[MAX_LOSSES];
  long lcount[MAX_LOSSES], lcorrect[MAX_LOSSES];
  double secs;
  double lr;      /* training: the learning rate of the last minibatch */
  long launches;  /* training: the backend's launches (cavs_backend_stats) */
  double reduce_secs; /* training under mpirun: this rank's time summing gradients, */
  double reduce_during; /* of it, the time spent during the backward passes (buckets
                           started and progressed: dist_backward_begin), */
  long tables_rows, tables_dense; /* its lookup tables' reductions as rows, and whole, */
  double reduce_bytes;            /* and the bytes it put into them */
  double norm_sum, norm_max; /* training with --log: the steps' global gradient norms, */
  long norms;                /* summed, the largest, and how many */
  struct Scores *scores; /* cavs eval: labels against predictions (metrics.c), or NULL */
  /* training, a model with a mixture of experts: per routing (up to MAX_ROUTES), the
     share of the epoch's slots its least and most loaded expert received, and the
     coefficient of variation of the experts' loads (0: even) */
  int routes;
  double load_min[MAX_ROUTES], load_max[MAX_ROUTES], load_cv[MAX_ROUTES];
  /* training with --expert-parallel: slot rows every rank sent to another (forward and
     backward, summed over the ranks), exchange rounds, and this rank's seconds in them */
  long ep_rows, ep_rounds, ep_replicated; /* (rows, sent or kept, run on a hot expert's replica) */
  long ep_matrices; /* experts' matrices sent to replicas, and their gradients home */
  double ep_secs;
} Totals;

void add_batch(Totals *t, const cavs_model *m, const cavs_stats *st, int k);
/* the same from a minibatch's statistics and its losses' sums, a[0..n) */
void add_sums(Totals *t, const cavs_stats *st, const cavs_loss_acc *a, int n, int k);
/* x, or a NaN without its sign (printed "nan", never "-nan") */
double unsigned_nan(double x);
/* loss l's mean over its rows, and the sum of the means */
double mean_loss(const Totals *t, int l);
double total_loss(const Totals *t);
double ratio(long a, long b);
bool has_accuracy(const cavs_desc *d);
void print_losses(FILE *f, const cavs_desc *d, const Totals *t);
/* A width or range of the descriptor (cavs_lin) in a model's dims. */
long model_lin(const cavs_model *m, cavs_lin l);
/* A forward pass over the whole dataset, `batch` graphs at a time; with carry, as
   `batch` streams whose state is carried (stream_order; the model is left carrying,
   from zeros). */
void evaluate(cavs_model *m, Data *s, int batch, bool carry, Totals *t);
/* The minibatches' order evaluate reads n graphs in (stream_order's when carried, else
   as they are), allocated; and evaluate over n graphs in a given order, `batch` a
   minibatch (a part of every minibatch, under mpirun), in at least `passes` forward
   passes (the last ones on the first graph, counted for nothing: every rank makes as
   many under --expert-parallel). */
int *eval_order(int n, int batch, bool carry);
void evaluate_order(cavs_model *m, Data *s, const int *order, int n, int batch, bool carry, int passes, Totals *t);
/* Carrying turned on (carry, and a model that can: cavs_model_carry_state; dies for one
   that cannot under --bptt-state carry), from zeros: whether it is. */
bool carry_on(cavs_model *m, bool carry);

/* predict prints each graph's root class, or with all_nodes every vertex's, a line a graph;
   with vectors, probs or a value name, those numbers instead */
struct GreedyOpts;
/* eval (predict false): json for --json, binary for --binary */
typedef struct EvalOpts {
  bool json, binary;
  bool stream; /* --stream: the data read a minibatch at a time */
} EvalOpts;
/* A checkpoint and a model made from it (its own source, or --model) holding its
 * parameters (cavs_ckpt_apply_weights), with its vocabulary: eval, predict, export. */
typedef struct CkptModel {
  cavs_ckpt *ck;
  Loaded L;
  cavs_model *m;
  cavs_vocab *v;
} CkptModel;
CkptModel open_ckpt(const char *path, const char *model);
int cmd_eval(const char *ckpt, const char *model, const char *data, const char *format, int batch, bool predict,
             bool all_nodes, const EvalOpts *eo, bool vectors, bool probs, const char *value,
             const struct GreedyOpts *greedy);
int cmd_info(const char *path);

/* ---- metrics.c: what a paper reports of a classifier ---- */

/* Labels against predictions over a set of vertices: per class those labeled with it
 * (support), predicted as it, and both (tp); the whole matrix (rows labels, columns
 * predictions) too where there are at most CONFUSION_MAX classes. */
enum { CONFUSION_MAX = 64 };
typedef struct Confusion {
  int rows, cols; /* the labels' classes; the predictions' (binary: neutral besides) */
  long total, *support, *tp, *predicted, *matrix;
} Confusion;

/* cavs eval's: the vertices of the first softmax_xent (its label input at `slot`) that
 * are labeled and have a prediction, all of them and the roots; with binary, SST's
 * five classes as negative (0-1) and positive (3-4), neutral labels (2) dropped. */
typedef struct Scores {
  bool binary;
  int slot;
  Confusion all, roots;
} Scores;
Scores *scores_new(int classes, int slot, bool binary);
/* a minibatch's k graphs, just run forward */
void scores_add(Scores *s, const cavs_model *m, const cavs_graph *const *gs, int k);
/* the vertices predicted right */
long scores_correct(const Confusion *c);
/* the matrices and the per-class table as text (at most 20 classes), or into an object */
void scores_print(FILE *f, const Scores *s);
void scores_json(json_t *o, const Scores *s);

/* ---- decode.c ---- */

/* predict --greedy INPUT [--stop CLASS] [--max-steps N]: each graph's decoder chain
   grown from the model's own predictions, INPUT the index input they are fed back
   into; stop -1: none, max_steps 0: the data's target length (100 without one). */
/* the most --max-steps: each step runs the whole graph again (n^2 / 2 vertex evaluations) */
enum { GREEDY_MAX_STEPS = 1000 };
typedef struct GreedyOpts {
  const char *input;
  int stop, max_steps;
} GreedyOpts;
int greedy_decode(cavs_model *m, const cavs_dataset *s, int batch, const GreedyOpts *o);

/* ---- train.c ---- */

typedef struct TrainOpts {
  const char *model, *format, *train, *dev, *save, *resume, *log;
  int epochs, batch, threads, quiet;
  uint64_t seed;
  cavs_optim optim;
  const char *dimset[64];
  int ndimset;
  /* --dropout P (every option; -1 when not given) and --option NAME=P, applied in
     that order: a new model or a resumed one, whose checkpoint does not keep them */
  double dropout;
  const char *optset[16];
  int noptset;
  /* the schedule: lr times lr_decay every lr_step epochs, ramped up over the first
     warmup minibatches; stop after `patience` epochs without a better dev metric
     (0: never); the metric .best and patience follow: enum Select */
  double lr_decay;
  int lr_step, lr_decay_start, warmup, patience, select;
  /* --schedule (enum cavs_schedule; -1 when not given) and its settings: cosine's and
     plateau's floor, the epochs of the cosine (0: to the run's last), plateau's factor
     and patience (-1 when not given) */
  int schedule;
  double lr_min;
  int cosine_epochs;
  double plateau_factor;
  int plateau_patience;
  double bptt_vary; /* --bptt-vary SD (0: chunks of the format's length) */
  /* --save-every: inside an epoch too, every save_steps minibatches (0: never) or every
     save_secs seconds of training (0: never) */
  long save_steps;
  double save_secs;
  bool stream;      /* --stream: the training file indexed and read a minibatch at a time */
  /* --init PARAM=FILE (pre-trained vectors, on a new model) and --freeze PARAM */
  const char *init[8], *freeze[8];
  int ninit, nfreeze;
  const char *init_all; /* --init-all FILE: every parameter from a safetensors or .npz file */
  /* given on the command line (else a resume keeps the checkpoint's) */
  bool set_kind, set_lr, set_clip, set_wd, set_momentum, set_batch, set_sched, set_vary;
} TrainOpts;

enum Select { SELECT_DEFAULT, SELECT_ALL, SELECT_ROOT, SELECT_LOSS };
int cmd_train(TrainOpts *o);

/* ---- schedule.c: the learning rate by epoch, from the state a checkpoint keeps ---- */

/* The rate of epoch `epoch` (1, 2, ...) before warm-up, by t's schedule from
   t->optim.lr. */
double sched_lr(const cavs_train_state *t, int epoch);
/* The plateau schedule after an epoch whose dev metric is `metric` (higher is better
   when `higher`): true when it cut the rate (t->lr_now). */
bool sched_plateau(cavs_train_state *t, double metric, bool higher);
/* The names --schedule takes, by enum cavs_schedule; -1 for another. */
int sched_kind(const char *name);
const char *sched_name(int kind);

/* ---- tensors.c: parameter files (safetensors, .npz) written and read ---- */

/* A tensor to write: float32 or float64, 1 or 2 dimensions, its bytes row-major. */
typedef struct Tensor {
  const char *name;
  bool f64;
  int rank;
  long shape[2];
  const void *data;
  size_t bytes;
} Tensor;
/* 1 for FILE.safetensors, 2 for FILE.npz, 0 for another name */
int tensors_format(const char *path);
/* The tensors, and the metadata (an object of strings), written whole to path in the
 * format its name says (afile.c); dies on failure. */
void tensors_write(const char *path, const Tensor *t, int n, json_t *meta);

/* A tensor of a file being read: what its header says, checked (the file is untrusted:
 * every size and place held to the file's and to the format's bounds). */
enum { TENSOR_MAX_RANK = 8 };
typedef struct TensorEntry {
  char *name, *shown; /* as in the file; as messages show it (escaped, cut) */
  char dtype[16];     /* as the file says it: F32, <f8 */
  bool real, f64, swap; /* float32 or float64 (what cavs reads); big-endian */
  int rank;
  int64_t shape[TENSOR_MAX_RANK];
  uint64_t count, bytes; /* elements; their bytes */
  /* where: safetensors, bytes at off; .npz, the entry at off, csize bytes (deflated or
     stored), usize uncompressed, skip of them the .npy header, crc its CRC-32 */
  uint64_t off, csize, usize, skip;
  bool zip, deflated;
  uint32_t crc;
} TensorEntry;
typedef struct TensorFile {
  const char *path;
  int fd;
  TensorEntry *e; /* sorted by name */
  int n, cap;
} TensorFile;
/* Bytes from a file as a message shows them (no control byte reaches the terminal:
 * runtime/shown.h's rule, whole UTF-8 characters past the C1 controls kept), at most 80
 * bytes of it; a new string, the caller's to free. */
char *shown(const char *s, size_t n);
/* The file's index, read and checked whole; dies with "FILE: error: ..." on anything
 * malformed, a tensor of a dtype other than float32 and float64 included. */
TensorFile *tensors_open(const char *path);
/* The tensor of that name, or NULL. */
const TensorEntry *tensors_find(const TensorFile *f, const char *name);
/* Its values into dst (count of them, float or double): dies on damage (an .npz
 * entry's CRC-32) and on a value that is not finite or not one in float's range. */
void tensors_read(const TensorFile *f, const TensorEntry *e, void *dst, bool f64);

/* ---- export.c ---- */

/* argv[0] is "export": cavs export CKPT -o FILE.safetensors|FILE.npz [--model MODEL] */
int cmd_export(int argc, char **argv);
/* train --init-all FILE: every parameter of m from the file, names and shapes exactly
 * the model's; nothing is written into m until all have been read. */
void init_all(cavs_model *m, const char *path);

/* ---- gen.c ---- */

/* argv[0] is "gen" */
int cmd_gen(int argc, char **argv);

/* ---- plot.c ---- */

/* argv[0] is "plot": cavs plot LOG -o FILE.png */
int cmd_plot(int argc, char **argv);

#endif

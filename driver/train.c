/* train.c: cavs train. Checks the outputs before anything runs, loads the model and the
 * data (a resume continues the checkpoint's settings unless they are given again), then
 * runs the epochs: shuffle, forward, backward, step, with a progress bar on a terminal,
 * a line per epoch, a JSON line per epoch in --log, and the checkpoints. SIGINT and
 * SIGTERM stop it between two steps, saved. */
#include "driver.h"
#include "dist.h"
#include "shown.h"
#include "afile.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* SIGINT or SIGTERM during training: the step under way finishes, the state is saved
 * (atomically, as always) and cavs exits with 128 + the signal. The handler only sets
 * this; a second signal gets the default action (SA_RESETHAND), which is safe: a
 * checkpoint is never torn. */
static volatile sig_atomic_t interrupted;
static void on_signal(int sig) { interrupted = sig; }

static void progress(int epoch, int epochs, long done, long total, double rate, double loss, double eta) {
  int width = 24, fill = total ? (int)((double)width * (double)done / (double)total) : width;
  char bar[64];
  for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '-';
  bar[width] = 0;
  int em = (int)(eta / 60), es = (int)eta % 60;
  fprintf(stdout, "\repoch %d/%d [%s] %ld/%ld graphs  %.0f graphs/s  loss %.3f  ETA %d:%02d ", epoch, epochs, bar,
          done, total, rate, loss, em, es);
  fflush(stdout);
}

static void apply_dims(const cavs_desc *d, long *dims, const TrainOpts *o) {
  for (int i = 0; i < o->ndimset; i++) {
    const char *eq = strchr(o->dimset[i], '=');
    if (!eq) die(1, "--dim takes NAME=VALUE, not '%s'", o->dimset[i]);
    int found = -1;
    for (int j = 0; j < d->ndims; j++)
      if (strlen(d->dims[j].name) == (size_t)(eq - o->dimset[i]) && !strncmp(d->dims[j].name, o->dimset[i], (size_t)(eq - o->dimset[i])))
        found = j;
    if (found < 0) die(1, "model '%s' has no dim '%.*s'", d->name, (int)(eq - o->dimset[i]), o->dimset[i]);
    char *end;
    errno = 0;
    long v = strtol(eq + 1, &end, 10);
    if (end == eq + 1 || *end || errno == ERANGE || v <= 0 || v > CAVS_MAX_DIM)
      die(1, "--dim %s: the value must be an integer from 1 to %ld (2^24)", o->dimset[i], CAVS_MAX_DIM);
    if (d->dims[found].kind == CAVS_DIM_VOCAB) die(1, "dim %s is bound by the data (vocab); it cannot be set", d->dims[found].name);
    if (d->dims[found].kind == CAVS_DIM_PRODUCT)
      die(1, "dim %s is the product %s * %s; set its factors instead", d->dims[found].name,
          d->dims[d->dims[found].a].name, d->dims[d->dims[found].b].name);
    dims[found] = v;
  }
  cavs_dims_derive(d, dims);
}

/* The learning rate of minibatch `step` (counted from the first of the run, resumes
   included) in `epoch`: the schedule's rate of the epoch (schedule.c), times
   (step + 1) / warmup over the first warmup minibatches. */
static double lr_at(const cavs_train_state *ts, int epoch, long step) {
  double lr = sched_lr(ts, epoch);
  if (ts->warmup > 0 && step < ts->warmup) lr *= (double)(step + 1) / (double)ts->warmup;
  return lr;
}

/* the parameter of d called name[0..len), or -1 */
static int param_named(const cavs_desc *d, const char *name, size_t len) {
  for (int i = 0; i < d->nparams; i++)
    if (strlen(d->params[i].name) == len && !memcmp(d->params[i].name, name, len)) return i;
  return -1;
}

/* A training run: what the steps of cmd_train share. */
typedef struct Run {
  TrainOpts *o;
  /* per routing: the slots this epoch's passes that counted for nothing (a rank without
     a graph of a minibatch runs graph 0 again) gave each expert, kept out of the loads */
  long *skip[MAX_ROUTES];
  int nskip[MAX_ROUTES];
  Loaded L;
  const cavs_desc *d;
  /* the checkpoint resumed from, or NULL; freed once applied to the model (its bytes
     are the whole model's parameters and moments: kept, every rank would hold them for
     the whole run), after which resumed, ck_noptions and ck_schedule say what was in it */
  cavs_ckpt *ck;
  bool resumed;
  int ck_noptions, ck_schedule;
  cavs_vocab *v;
  cavs_dataset *tr;
  Data devdata, *dev; /* the --dev data (loaded, or with --stream streamed), or NULL */
  /* --stream: the training file indexed, not loaded (tr NULL); the graphs of the step
     under way read from it into `part`, the minibatch's sizes in `sizes` until then */
  cavs_stream *st;
  cavs_dataset *part;
  cavs_graph *sizes;
  cavs_model *m;
  cavs_train_state ts;
  char *best_path;
  FILE *log;
  bool log_existed; /* a resumed run's log was there before it */
  /* the --log record of epoch ts.epoch that the log refused, which the checkpoint then
     keeps (cavs_ckpt_save_record; from --resume: the checkpoint's, until log_kept_record
     has written it); NULL otherwise */
  char *record;
  /* from --resume, a checkpoint saved inside an epoch: that epoch's totals so far (its
     record, totals_text), until run_epoch has read them; NULL otherwise */
  char *so_far;
  bool tty, with_acc;
  bool lm; /* a language model (text data, next-token labels): perplexity, not roots */
  bool carry; /* text-bptt's streams carry their state (--bptt-state): stream_order */
  int carry_n; /* under mpirun, carrying: the graphs of this rank's part of the last step */
  BpttCut cut; /* --bptt-vary: the epoch's chunks (else the data set's, in `order`) */
  const cavs_graph **chunks; /* (the data set's graphs, which it cuts again) */
  int n, select, last_epoch;
  long nbatches;
  int *order;
  const cavs_graph **gs;
  cavs_vectors_report found[8]; /* --init i: what it wrote into parameter inited[i] */
  int inited[8];
  /* --save-every TIME: when the last checkpoint was saved (now()); whether rank 0's
     clock says the next is due, and whether the ranks agreed it is (part_step) */
  double last_save;
  bool save_wish, save_due;
} Run;

/* What the run writes (--save, its .best, --log) may not be what it reads (the model,
 * the data, the --init vectors, the checkpoint resumed from, the log for --save and the
 * checkpoints for --log), through links too: found out before training, not after an
 * epoch. --save may be the checkpoint resumed from: that is how a run goes on. */
static void check_outputs(const TrainOpts *o, const char *best_path) {
  const char *in[16], *what[16];
  int n = 0;
  in[n] = o->model, what[n++] = "the model";
  in[n] = o->train, what[n++] = "the --train data";
  in[n] = o->dev, what[n++] = "the --dev data";
  for (int i = 0; i < o->ninit; i++) {
    const char *eq = strchr(o->init[i], '=');
    in[n] = eq ? eq + 1 : NULL, what[n++] = "the --init vectors";
  }
  in[n] = o->init_all, what[n++] = "the --init-all parameters";
  int common = n;
  if (o->save) {
    in[n] = o->log, what[n++] = "the --log file";
    check_output("save", o->save, in, what, n);
    /* .best is not what the run goes on from either */
    in[n] = o->resume, what[n++] = "the checkpoint resumed from";
    check_output("save", best_path, in, what, n);
  }
  if (o->log) {
    n = common;
    in[n] = o->resume, what[n++] = "the checkpoint resumed from";
    in[n] = o->save, what[n++] = "the --save checkpoint";
    in[n] = best_path, what[n++] = "the best checkpoint";
    check_output("log", o->log, in, what, n);
  }
}

/* --resume: the checkpoint, read before the model is built, in the checkpoint's
 * precision unless --precision is given (and resume_settings refuses another). Opened,
 * not read whole: its values are read when applied, only the rows the model holds (a
 * rank of --expert-parallel: none of the others' experts), and let go of after. */
static void read_resumed(Run *r) {
  char err[1024];
  errno = 0;
  r->ck = keep(cavs_ckpt_open(r->o->resume, err, sizeof err));
  if (!r->ck) die(errno == ENOMEM ? 2 : 1, "%s", err);
  if (!model_precision && cavs_ckpt_precision(r->ck) == CAVS_DOUBLE) model_precision = "double";
}

/* Do formats a and b cut the data into the same graphs (text-bptt is text-bptt:35, the
   length runtime/data.h's CV_BPTT gives it; a length may have leading zeros)? */
static bool same_format(const char *a, const char *b) {
  long n[2];
  for (int k = 0; k < 2; k++) {
    const char *f = k ? b : a;
    if (strncmp(f, "text-bptt", 9)) return !strcmp(a, b);
    n[k] = f[9] == ':' ? strtol(f + 10, NULL, 10) : f[9] ? -1 : 35;
  }
  return n[0] == n[1];
}

/* --resume: the checkpoint of this model (name and source) with the dims given again,
 * its dims into cd */
static void resume_dims(Run *r, long *cd) {
  TrainOpts *o = r->o;
  const cavs_desc *d = r->d;
  char err[1024];
  if (strcmp(cavs_ckpt_model(r->ck), d->name))
    die(1, "%s: the checkpoint is of model '%s', not '%s'", o->resume, cavs_ckpt_model(r->ck), d->name);
  if (strcmp(cavs_ckpt_hash(r->ck), d->source_hash))
    die(1, "%s: the checkpoint was trained from another version of model '%s' (source hash %s, %s is %s)", o->resume,
        d->name, cavs_ckpt_hash(r->ck), o->model, d->source_hash);
  if (cavs_ckpt_dims(r->ck, d, cd, err, sizeof err)) die(1, "%s: %s", o->resume, err);
  /* only the dims given on the command line must agree with the checkpoint */
  long asked[CAVS_MAX_DIMS] = {0};
  for (int j = 0; j < d->ndims; j++) asked[j] = -1;
  apply_dims(d, asked, o);
  for (int j = 0; j < d->ndims; j++)
    /* (a product follows its factors, which are compared: apply_dims derives it from
       them, 0 where one was not asked) */
    if (asked[j] >= 0 && d->dims[j].kind != CAVS_DIM_PRODUCT && asked[j] != cd[j])
      die(1, "%s: dim %s is %ld in the checkpoint, but --dim asks for %ld", o->resume, d->dims[j].name, cd[j], asked[j]);
}

/* A run stopped inside an epoch goes on at its graph graphs_done of the epoch's order:
 * of another format's graphs (text-bptt's chunks of another length), of the streams
 * another batch lays text-bptt's chunks in, or of the chunks read the other way
 * (shuffled, or laid in streams), that place is not where it stopped, and going on would
 * train some graphs twice and others not at all. Called with o's settings final. */
static void same_order(const TrainOpts *o, const cavs_train_state *cs) {
  if (cs->graphs_done <= 0) return;
  bool bptt = !strncmp(o->format, "text-bptt", 9);
  if (cs->format[0] && !same_format(cs->format, o->format))
    die(1, "%s: saved inside epoch %d, on data of --format %s: go on with that format (this one's graphs are "
           "others), or from an epoch's end",
        o->resume, cs->epoch + 1, cs->format);
  if (cs->batch > 0 && o->batch != cs->batch && bptt)
    die(1, "%s: saved inside epoch %d of text-bptt chunks laid in streams for --batch %d: go on with that batch, "
           "or from an epoch's end",
        o->resume, cs->epoch + 1, cs->batch);
  /* (chunks that vary are read in streams alone: choose_cut says so) */
  bool reset = bptt_state == BPTT_RESET;
  if (cs->bptt_state && bptt && !(o->bptt_vary > 0) && reset != (cs->bptt_state == CAVS_BPTT_RESET))
    die(1, "%s: saved inside epoch %d of text-bptt chunks %s: go on with --bptt-state %s, or from an epoch's end",
        o->resume, cs->epoch + 1, reset ? "laid in streams, the state carried" : "shuffled, each from zeros",
        reset ? "carry" : "reset");
}

/* --resume: the checkpoint checked against the model; its dims into dims (those given
 * again must agree), and the training settings not given again into o. */
static void resume_settings(Run *r, long *dims) {
  TrainOpts *o = r->o;
  long cd[CAVS_MAX_DIMS] = {0};
  resume_dims(r, cd);
  const cavs_train_state *cs = cavs_ckpt_state(r->ck);
  /* checked before an epoch runs: the run's last epoch must be one a checkpoint holds */
  if (o->epochs > CAVS_MAX_EPOCHS - cs->epoch)
    die(1, "%s: %d epochs are done; %d more would pass the most a run takes (%d)", o->resume, cs->epoch, o->epochs,
        CAVS_MAX_EPOCHS);
  cavs_optim c = cs->optim;
  if (o->set_kind) {
    c.kind = o->optim.kind;
    c.lr = cavs_optim_default_lr(c.kind); /* another optimizer: its own default rate */
  }
  if (o->set_lr) c.lr = o->optim.lr;
  if (o->set_clip) c.clip = o->optim.clip;
  if (o->set_wd) c.weight_decay = o->optim.weight_decay;
  if (o->set_momentum) c.momentum = o->optim.momentum;
  o->optim = c;
  if (!o->set_batch && cs->batch > 0) o->batch = cs->batch;
  /* the schedule and the selection (format 3 on: select is then 1..3) */
  if (cs->select && !o->set_sched) {
    o->lr_decay = cs->lr_decay;
    o->lr_step = cs->lr_step;
    o->lr_decay_start = cs->lr_decay_start;
    o->warmup = cs->warmup;
    o->patience = cs->patience;
    o->schedule = cs->schedule;
    o->lr_min = cs->lr_min;
    o->cosine_epochs = cs->cosine_epochs;
    o->plateau_factor = cs->plateau_factor;
    o->plateau_patience = cs->plateau_patience;
  }
  if (!o->set_vary) o->bptt_vary = cs->bptt_vary;
  bptt_as_saved(cs); /* (text-bptt's chunks read as before, unless told) */
  same_order(o, cs);
  memcpy(dims, cd, sizeof(long) * (size_t)r->d->ndims);
  r->v = ckpt_vocab(r->ck, o->resume);
}

/* --stream: the training file indexed. Under mpirun rank 0 alone reads it through, and
   sends the index and the vocabulary it grew to the other ranks, which then read only
   their graphs of each step: a file read once by the job, not once by every rank. */
static cavs_stream *stream_train(Run *r, const long *dims) {
  const TrainOpts *o = r->o;
  if (dist_size == 1) return stream_data(o->train, o->format, r->d, dims, r->v, r->ck == NULL);
  cavs_stream *st = NULL;
  char *idx = NULL, *words = NULL;
  size_t nidx = 0, nwords = 0;
  if (!dist_rank) {
    st = stream_data(o->train, o->format, r->d, dims, r->v, r->ck == NULL);
    nidx = cavs_stream_index(st, NULL, 0);
    idx = xmalloc(nidx);
    cavs_stream_index(st, idx, nidx);
    /* the words in id order, each ended by a NUL (data holds none) */
    for (int i = 0; i < cavs_vocab_size(r->v); i++) nwords += strlen(cavs_vocab_word(r->v, i)) + 1;
    char *w = words = xmalloc(nwords ? nwords : 1);
    for (int i = 0; i < cavs_vocab_size(r->v); i++) w = stpcpy(w, cavs_vocab_word(r->v, i)) + 1;
  }
  char *wv = dist_share(words, &nwords), *iv = dist_share(idx, &nidx);
  if (dist_rank) {
    int id = 0;
    for (size_t at = 0; at < nwords; id++) {
      size_t len = strnlen(wv + at, nwords - at);
      if (at + len == nwords || cavs_vocab_id(r->v, wv + at, len, 1) != id)
        die(1, "rank 0's vocabulary of '%s' does not extend this rank's (word %d)", o->train, id);
      at += len + 1;
    }
    char err[1024];
    errno = 0;
    if (!(st = cavs_stream_open_index(o->train, o->format, r->d, dims, r->v, iv, nidx, err, sizeof err)))
      die(errno == ENOMEM ? 2 : 1, "%s", err);
  }
  free(wv), free(iv);
  return st;
}

/* The training data's vertices, loaded or streamed. */
static long train_vertices(const Run *r) { return r->st ? cavs_stream_vertices(r->st) : cavs_dataset_vertices(r->tr); }

/* A new model's vocabulary dims: the tokens read, or for cgf, whose features are numbers
 * already, the largest id used plus one (the loaders bound ids below CAVS_MAX_DIM). */
static void vocab_dims(Run *r, long *dims) {
  const cavs_desc *d = r->d;
  for (int j = 0; j < d->ndims; j++) {
    if (d->dims[j].kind != CAVS_DIM_VOCAB) continue;
    dims[j] = cavs_vocab_size(r->v);
    if (!strcmp(r->o->format, "cgf")) {
      int slot = d->inputs[d->dims[j].input].slot;
      long mx = r->st ? cavs_stream_max_feature(r->st, slot) : cavs_dataset_max_feature(r->tr, slot);
      if (r->dev && data_max_feature(r->dev, slot) > mx) mx = data_max_feature(r->dev, slot);
      dims[j] = mx + 1 > 1 ? mx + 1 : 1;
    }
  }
}

/* The model made, and its state: the checkpoint's, or a new one initialized, with the
 * --init vectors; then --freeze. */
/* --dropout P: every dropout option of the model; then each --option NAME=V. A
 * checkpoint keeps them (format 5): a resumed run has the values it was saved with,
 * unless they are given again. */
static void set_options(cavs_model *m, const TrainOpts *o) {
  const cavs_desc *d = cavs_model_desc(m);
  if (o->dropout >= 0) {
    int ndrop = 0;
    for (int i = 0; i < d->noptions; i++) ndrop += d->options[i].kind == CAVS_OPTION_DROPOUT;
    if (!ndrop)
      die(1, "--dropout: model '%s' has no dropout option: its dropouts, if any, have a fixed probability (declare "
          "`option p_drop = P;` and write dropout(x, p_drop) to set it from the command line)", d->name);
    for (int i = 0; i < d->noptions; i++)
      if (d->options[i].kind == CAVS_OPTION_DROPOUT && cavs_model_set_option(m, d->options[i].name, o->dropout))
        die(1, "--dropout: %s", cavs_model_error(m));
  }
  for (int i = 0; i < o->noptset; i++) {
    const char *eq = strchr(o->optset[i], '=');
    if (!eq || eq == o->optset[i]) die(1, "--option takes NAME=P, not '%s'", o->optset[i]);
    char name[256], *end;
    snprintf(name, sizeof name, "%.*s", (int)(eq - o->optset[i]), o->optset[i]);
    errno = 0;
    double v = strtod(eq + 1, &end);
    if (end == eq + 1 || *end || errno == ERANGE || !(v >= 0 && v <= CAVS_MAX_CLIP))
      die(1, "--option %s: the value must be a number, 0 or more (a dropout's probability below 1)", o->optset[i]);
    if (cavs_model_set_option(m, name, v)) die(1, "--option: %s", cavs_model_error(m));
  }
}

static void make_model(Run *r, const long *dims) {
  TrainOpts *o = r->o;
  const cavs_desc *d = r->d;
  char err[1024];
  errno = 0;
  r->m = keep(cavs_model_new_opts(d, dims, &model_opts, err, sizeof err));
  if (!r->m) lib_die(err);
  /* --expert-parallel: the experts' tables placed before the parameters are made or
     read, so that a rank never holds the other ranks' experts (passes set the comm
     again around them) */
  dist_experts(r->m, true);
  dist_experts(r->m, false);
  cavs_model_set_policy(r->m, model_policy);
  cavs_model_set_ablations(r->m, model_ablations);
  /* its training passes run the push block where the losses have targets: the scores it
     keeps are at labeled vertices (scores_add), and the dev set's passes are inference */
  cavs_model_set_targets_only(r->m, 1);
  r->ts = (cavs_train_state){.rng = o->seed * 0x9e3779b97f4a7c15ull + 1, .best = -1, .seed = o->seed,
                             .threads = o->threads, .batch = o->batch, .optim = o->optim, .plateau_best = -1};
  snprintf(r->ts.format, sizeof r->ts.format, "%s", o->format);
  if (r->ck) {
    errno = 0; /* (the device failing, or memory running out, while applying: exit 2) */
    if (cavs_ckpt_apply(r->ck, r->m, err, sizeof err)) die(errno == ENOMEM || errno == EIO ? 2 : 1, "%s: %s", o->resume, err);
    const cavs_train_state *cs = cavs_ckpt_state(r->ck);
    r->ts.epoch = cs->epoch;
    r->ts.rng = cs->rng;
    r->ts.best = cs->best;
    r->ts.seed = cs->seed;
    r->ts.graphs_done = cs->graphs_done;
    r->ts.select = cs->select;
    r->ts.since_best = cs->since_best;
    r->ts.best_epoch = cs->best_epoch;
    /* the plateau's state (a new --lr restarts its rate there) */
    r->ts.lr_now = o->set_lr ? 0 : cs->lr_now;
    r->ts.plateau_best = cs->plateau_best;
    r->ts.plateau_bad = cs->plateau_bad;
    r->resumed = true, r->ck_noptions = cavs_ckpt_noptions(r->ck), r->ck_schedule = cs->schedule;
    /* (checked where it is used: log_kept_record, or inside an epoch totals_read) */
    const char *record = cavs_ckpt_record(r->ck);
    char **into = cs->graphs_done > 0 ? &r->so_far : &r->record;
    *into = record ? xstrdup(record) : NULL;
    cavs_ckpt_free(r->ck);
    r->ck = NULL;
  } else {
    cavs_model_init(r->m, o->seed);
    if (o->init_all) init_all(r->m, o->init_all);
  }
  /* the optimizer's moments now, against --max-memory, not after the first minibatch */
  errno = 0;
  if (cavs_model_reserve_optimizer(r->m, o->optim.kind)) lib_die(cavs_model_error(r->m));
  /* pre-trained vectors into a new model's tables (a resumed one has its own), then
     the parameters kept fixed */
  for (int i = 0; i < o->ninit && !r->resumed; i++) {
    const char *eq = strchr(o->init[i], '=');
    int p = eq ? param_named(d, o->init[i], (size_t)(eq - o->init[i])) : -1;
    if (!eq || !eq[1]) die(1, "--init: '%s' is not PARAM=FILE", o->init[i]);
    if (p < 0) die(1, "--init: model '%s' has no parameter '%.*s'", d->name, (int)(eq - o->init[i]), o->init[i]);
    if (cavs_model_load_vectors_report(r->m, p, eq + 1, r->v, &r->found[i], err, sizeof err)) die(1, "%s", err);
    r->inited[i] = p;
  }
  set_options(r->m, o);
  /* without --clip, the model's own (`option clip = N;`, as set or saved) */
  int k = cavs_option_find(d, "clip");
  if (!o->set_clip && k >= 0) r->ts.optim.clip = o->optim.clip = cavs_model_option(r->m, k);
  for (int i = 0; i < o->nfreeze; i++) {
    int p = param_named(d, o->freeze[i], strlen(o->freeze[i]));
    if (p < 0) die(1, "--freeze: model '%s' has no parameter '%s'", d->name, o->freeze[i]);
    if (cavs_model_freeze(r->m, p, 1)) die(1, "--freeze: %s", cavs_model_error(r->m));
  }
}

/* "init emb: 14021 of the 16580 words from glove.txt.gz (2.2M vectors); none for
   2559, e.g. foo, bar": what --init i matched, and a sample of what it did not */
static void say_init(const Run *r, int i) {
  const cavs_vectors_report *f = &r->found[i];
  printf("init %s: %ld of the %d words from %s (%ld vectors)", r->d->params[r->inited[i]].name, f->found,
         cavs_vocab_size(r->v) - 2, strchr(r->o->init[i], '=') + 1, f->vectors);
  if (f->missing) {
    printf("; none for %ld, e.g.", f->missing);
    /* (the words are the data's, anyone's: shown as a message shows a file's bytes) */
    for (int k = 0; k < f->nsample; k++) printf("%s %s", k ? "," : "", CV_SHOW(cavs_vocab_word(r->v, f->sample[k])));
  }
  printf("\n");
}

/* The first lines: where it runs, the model's size, the data, how far a resume is. */
static void say_start(const Run *r) {
  long nparams = 0;
  for (int i = 0; i < r->d->nparams; i++) {
    long rows, cols;
    cavs_model_param(r->m, i, &rows, &cols, NULL);
    nparams += rows * cols;
  }
  say_device(stdout, r->m);
  printf("model %s: %ld parameters; %d training graphs (%ld vertices)", r->d->name, nparams, r->n,
         train_vertices(r));
  if (r->resumed) printf("; resumed after epoch %d", r->ts.epoch);
  if (r->resumed && r->ts.graphs_done) printf(" and %ld graphs of the next", r->ts.graphs_done);
  printf("\n");
  if (streams_cached) printf("streamed: %s index%s from the cache\n", streams_cached > 1 ? "the data's" : "an",
                             streams_cached > 1 ? "es" : "");
  if (r->o->init_all) printf("init: every parameter from %s\n", r->o->init_all);
  if (r->o->dropout >= 0 || r->o->noptset || r->ck_noptions) {
    printf("options:");
    for (int i = 0; i < r->d->noptions; i++) printf(" %s=%g", r->d->options[i].name, cavs_model_option(r->m, i));
    printf("\n");
  }
  if (r->carry)
    printf("state carried from chunk to chunk: %d streams side by side, in order (--bptt-state reset: each chunk "
           "from zeros, shuffled)\n", r->o->batch);
  if (r->ts.bptt_vary > 0)
    printf("chunks cut afresh each epoch, each minibatch's length drawn around %d (deviation %g; --bptt-vary)\n",
           r->cut.base, r->ts.bptt_vary);
  int k = cavs_option_find(r->d, "clip");
  if (k >= 0 && !r->o->set_clip && cavs_model_option(r->m, k) > 0)
    printf("gradient-norm clip %g, the model's (option clip; --clip 0 turns it off)\n", cavs_model_option(r->m, k));
  for (int i = 0; i < r->o->ninit && !r->resumed; i++)
    say_init(r, i);
  fflush(stdout);
}

static const char *select_name(int select) {
  return select == SELECT_ROOT ? "root" : select == SELECT_ALL ? "all" : "loss";
}
static const char *select_metric(int select) {
  return select == SELECT_ROOT ? "root accuracy" : select == SELECT_ALL ? "accuracy" : "loss";
}

/* What picks .best: --select, else the checkpoint's, else by the model; a checkpoint's
 * best of another metric is forgotten. */
static void choose_selection(Run *r) {
  TrainOpts *o = r->o;
  /* a language model's best is by dev perplexity (the loss): its roots are the last
     tokens of sentences, and its accuracy is not what it is judged by */
  r->select = o->select != SELECT_DEFAULT ? o->select
              : r->ts.select             ? r->ts.select
              : r->with_acc && !r->lm    ? SELECT_ALL
                                         : SELECT_LOSS;
  if (r->select != SELECT_LOSS && !r->with_acc)
    die(1, "--select %s: model '%s' has no classifier", select_name(r->select), r->d->name);
  if (r->resumed && r->ts.best >= 0 && (r->ts.select ? r->ts.select != r->select : o->select != SELECT_DEFAULT)) {
    /* the checkpoint's best is another metric's (or one an older format did not name) */
    if (!o->quiet) printf("--select %s: the best of the checkpoint's runs is forgotten\n", select_name(r->select));
    r->ts.best = -1, r->ts.since_best = 0, r->ts.best_epoch = 0;
    r->ts.plateau_best = -1, r->ts.plateau_bad = 0;
  }
  r->ts.select = r->select;
  r->ts.patience = o->patience;
}

/* The schedule of the rate: --schedule, or step with --lr-decay, else constant (on a
 * resume, the checkpoint's unless one of the schedule's options is given), each of its
 * options held to the schedule it belongs to; into the training state, which the epochs
 * read it from and the checkpoint keeps. */
static void choose_schedule(Run *r) {
  TrainOpts *o = r->o;
  int s = o->schedule >= 0 ? o->schedule : o->lr_decay > 0 ? CAVS_SCHED_STEP : CAVS_SCHED_CONSTANT;
  const char *name = sched_name(s);
  if (o->set_sched) { /* a checkpoint's settings are its own schedule's */
    if (o->lr_decay > 0 && s != CAVS_SCHED_STEP) die(1, "--lr-decay goes with --schedule step, not %s", name);
    if (s == CAVS_SCHED_STEP && !(o->lr_decay > 0)) die(1, "--schedule step needs --lr-decay");
    if (o->lr_step && s != CAVS_SCHED_STEP) die(1, "--lr-step goes with --schedule step, not %s", name);
    if (o->lr_decay_start && s != CAVS_SCHED_STEP)
      die(1, "--lr-decay-start goes with --schedule step, not %s", name);
    if (o->cosine_epochs && s != CAVS_SCHED_COSINE) die(1, "--cosine-epochs goes with --schedule cosine, not %s", name);
    if ((o->plateau_factor || o->plateau_patience >= 0) && s != CAVS_SCHED_PLATEAU)
      die(1, "--plateau-factor and --plateau-patience go with --schedule plateau, not %s", name);
    if (o->lr_min && s != CAVS_SCHED_COSINE && s != CAVS_SCHED_PLATEAU)
      die(1, "--lr-min goes with --schedule cosine or plateau, not %s", name);
  }
  if (o->lr_min && o->lr_min >= o->optim.lr) die(1, "--lr-min %g is not below the rate, %g", o->lr_min, o->optim.lr);
  if (s == CAVS_SCHED_PLATEAU && !r->dev) die(1, "--schedule plateau needs a --dev set to watch");
  r->ts.schedule = s;
  r->ts.lr_decay = o->lr_decay;
  r->ts.lr_step = o->lr_step;
  r->ts.lr_decay_start = o->lr_decay_start;
  r->ts.warmup = o->warmup;
  r->ts.lr_min = o->lr_min;
  /* the cosine reaches its floor at the end of this run, unless told otherwise */
  r->ts.cosine_epochs = s != CAVS_SCHED_COSINE ? 0 : o->cosine_epochs ? o->cosine_epochs : r->last_epoch;
  r->ts.plateau_factor = s != CAVS_SCHED_PLATEAU ? 0 : o->plateau_factor ? o->plateau_factor : 0.1;
  r->ts.plateau_patience = s != CAVS_SCHED_PLATEAU ? 0 : o->plateau_patience >= 0 ? o->plateau_patience : 10;
  /* a plateau goes on from the checkpoint's own plateau only (an application's state of
     zeros would make 0 its best) */
  bool going_on = r->resumed && r->ck_schedule == CAVS_SCHED_PLATEAU;
  if (s != CAVS_SCHED_PLATEAU || !going_on) r->ts.lr_now = 0, r->ts.plateau_best = -1, r->ts.plateau_bad = 0;
  /* a patience given now below the checkpoint's count: the count at the new patience, so
     that the next epoch without a better metric cuts the rate (a state whose count is
     past its patience is no checkpoint's, and one saved inside the first epoch was
     refused) */
  if (r->ts.plateau_bad > r->ts.plateau_patience) r->ts.plateau_bad = r->ts.plateau_patience;
}

/* The checkpoint to also (when not NULL: the .best) and then to path; *also_saved
   whether also was written (the epoch's line says so) */
static int try_save(Run *r, const char *path, const char *also, bool *also_saved, char *err, size_t errlen) {
  *also_saved = false;
  errno = 0; /* (--expert-parallel: every expert's matrices from its rank to rank 0's,
                given back once written) */
  if (dist_size > 1 && cavs_model_expert_gather(r->m, 0)) lib_die(cavs_model_error(r->m));
  int rc = 0;
  /* rank 0 writes for all: their states are the same. The best first: a checkpoint that
     records an epoch as the best before CKPT.best holds it would, its .best refused,
     send a resumed run past it with its model nowhere once CKPT is replaced; CKPT
     refused after its .best only makes the resumed run train that epoch again, to the
     same bits and the same .best */
  for (int k = 0; k < 2 && !dist_rank && !rc; k++) {
    const char *p = k ? path : also;
    /* (a device that failed under the save, or the memory: exit 2, as in a step) */
    errno = 0;
    if (p && cavs_ckpt_save_record(p, r->m, r->L.source ? r->L.source : "", r->v, &r->ts, r->record, err, errlen))
      rc = errno == EIO || errno == ENOMEM ? 2 : 1;
    else if (p && !k) *also_saved = true;
  }
  if (dist_size > 1) cavs_model_expert_release(r->m);
  return rc;
}

/* A forward pass whose loss is not finite: the op and vertex that made it, or the loss. */
_Noreturn static void diverged(const Run *r, int epoch, int b, const cavs_stats *st) {
  char why[512];
  int bg, bv;
  if (cavs_model_check_finite(r->m, &bg, &bv, why, sizeof why)) {
    if (bg >= 0 && r->ts.bptt_vary > 0) /* (a chunk of the cut: where in the stream) */
      die(1, "epoch %d: %s at token %ld of %s; try a smaller --lr or --clip", epoch, why,
          (long)(r->cut.g[b + bg].type - r->chunks[0]->type) + bv + 1, r->o->train);
    if (bg >= 0)
      die(1, "epoch %d: %s at vertex %d of graph %d of %s; try a smaller --lr or --clip", epoch, why, bv,
          r->order[b + bg] + 1, r->o->train);
    die(1, "epoch %d: %s; try a smaller --lr or --clip", epoch, why);
  }
  die(1, "epoch %d: the loss is %g (diverged); try a smaller --lr or --clip", epoch, st->loss);
}

/* The step's global gradient norm into the epoch's (with --log, which tracks it). */
static void add_norm(Run *r, Totals *t) {
  if (!r->log) return;
  double n = cavs_model_grad_norm(r->m);
  if (n < 0) return;
  t->norm_sum += n, t->norms++;
  if (n > t->norm_max) t->norm_max = n;
}

/* --stream: graphs [lo, hi) of the minibatch at b of the epoch's order read from the
 * training file, in place of their sizes in r->gs (the last step's freed); a file that
 * changed under the run is an error. */
static void read_part(Run *r, int b, int lo, int hi) {
  if (!r->st) return;
  cavs_dataset_free(r->part);
  r->part = NULL;
  char err[1024];
  errno = 0;
  if (!(r->part = cavs_stream_read(r->st, r->order + b + lo, hi - lo, err, sizeof err))) die(errno == ENOMEM ? 2 : 1, "%s", err);
  for (int i = lo; i < hi; i++) r->gs[i] = cavs_dataset_graph(r->part, i - lo);
}

/* One process's step over the minibatch gs[0..k) (graphs b.. of the epoch's order):
 * forward, backward, the optimizer's step, added up in t. The signal that asks to stop
 * (0: none). */
static int whole_step(Run *r, int epoch, int b, int k, const cavs_optim *opt, Totals *t) {
  cavs_stats st;
  read_part(r, b, 0, k);
  errno = 0;
  if (cavs_model_forward(r->m, r->gs, k, &st)) lib_die(cavs_model_error(r->m));
  if (!isfinite(st.loss)) diverged(r, epoch, b, &st);
  cavs_model_backward(r->m);
  errno = 0;
  if (cavs_model_step(r->m, opt)) lib_die(cavs_model_error(r->m));
  add_batch(t, r->m, &st, k);
  add_norm(r, t);
  r->save_due = r->save_wish;
  return interrupted;
}

/* the model's scalars' size: 8 in double, else 4 */
static size_t es_of_model(void) { return model_precision && !strcmp(model_precision, "double") ? 8 : 4; }

/* memory a step uses and frees (xmalloc's keep list would grow with every step) */
static void *scratch(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) die(2, "out of memory");
  return p;
}

/* A loss's sums as the scheduler makes a minibatch's statistics of them (st->loss the
 * means summed, accuracy over the softmax_xent losses). */
static void stats_of(const cavs_desc *d, const cavs_loss_acc *a, cavs_stats *st) {
  memset(st, 0, sizeof *st);
  for (int l = 0; l < d->nlosses; l++) {
    if (a[l].count) st->loss += a[l].sum / (double)a[l].count;
    if (d->losses[l].kind != CAVS_LOSS_SOFTMAX_XENT) continue;
    st->count += a[l].count, st->correct += a[l].correct;
    st->root_count += a[l].root_count, st->root_correct += a[l].root_correct;
  }
}

static long *grow_longs(long *p, int n) {
  long *q = realloc(p, sizeof(long) * (size_t)(n > 0 ? n : 1));
  if (!q) die(2, "out of memory");
  return q;
}

/* Each routing's loads now into snap (grown to hold them), their numbers in n */
static void loads_now(Run *r, long **snap, int *n) {
  for (int k = 0; k < MAX_ROUTES; k++) {
    int X = cavs_model_expert_load(r->m, k, NULL, 0);
    n[k] = X > 0 ? X : 0;
    if (!n[k]) continue;
    snap[k] = grow_longs(snap[k], X);
    cavs_model_expert_load(r->m, k, snap[k], X);
  }
}

/* What a pass that counts for nothing added to the loads (before: loads_now's before
   it), added to r->skip */
static void loads_skip(Run *r, long **before, const int *nb) {
  long *after[MAX_ROUTES] = {0};
  int na[MAX_ROUTES];
  loads_now(r, after, na);
  for (int k = 0; k < MAX_ROUTES; k++) {
    if (na[k] > r->nskip[k]) {
      r->skip[k] = grow_longs(r->skip[k], na[k]);
      for (int e = r->nskip[k]; e < na[k]; e++) r->skip[k][e] = 0;
      r->nskip[k] = na[k];
    }
    for (int e = 0; e < na[k]; e++) r->skip[k][e] += after[k][e] - (e < nb[k] ? before[k][e] : 0);
    free(after[k]);
  }
}

/* A mixture of experts' load-balancing loss is not a sum over rows (cavs_model_balance):
 * each rank's part gives its own. So each rank says, for each routing, how many experts
 * its pass balanced (x[3k]), whether it balanced any (x[3k + 1]), summed over the
 * ranks with the losses' counts (no collective of its own; with the squares, which
 * show ranks that disagree); where some rank balanced
 * routing k, the ranks add their sums in one more and each gives the whole's back to
 * libcavs, so that the gradient on the gate is one process's, within the rounding of
 * the sums' order. A part that counts for nothing (none) adds zeros and keeps its own. */
enum { BALANCED = 3 * MAX_ROUTES, MAX_BALANCED = 1 << 20 };
static void balanced_experts(Run *r, bool none, long *x) {
  for (int k = 0; k < MAX_ROUTES; k++) {
    long X = none ? 0 : cavs_model_balance(r->m, k, NULL, 0);
    X = X > 0 ? X < MAX_BALANCED ? X : MAX_BALANCED : 0;
    x[3 * k] = X, x[3 * k + 1] = X > 0, x[3 * k + 2] = X * X;
  }
}
static void balance_whole(Run *r, bool none, const long *x) {
  long X[MAX_ROUTES], total = 0;
  for (int k = 0; k < MAX_ROUTES; k++) {
    long n = x[3 * k + 1];
    X[k] = n ? x[3 * k] / n : 0;
    if (X[k] * n != x[3 * k] || X[k] * X[k] * n != x[3 * k + 2] || X[k] >= MAX_BALANCED)
      die(1, "the ranks' passes disagree on the experts of routing %d, or it has %d or more", k, MAX_BALANCED);
    total += X[k] ? 2 * X[k] + 1 : 0;
  }
  if (!total) return;
  double *v = scratch(sizeof(double) * (size_t)total);
  long at = 0;
  for (int k = 0; k < MAX_ROUTES; k++) {
    if (!X[k]) continue;
    long mine = none ? 0 : cavs_model_balance(r->m, k, v + at, 2 * X[k] + 1);
    if (mine != X[k]) memset(v + at, 0, sizeof(double) * (size_t)(2 * X[k] + 1));
    at += 2 * X[k] + 1;
  }
  dist_sum_double(v, (int)total);
  at = 0;
  for (int k = 0; k < MAX_ROUTES; k++) {
    if (!X[k]) continue;
    errno = 0;
    if (!none && cavs_model_balance(r->m, k, NULL, 0) == X[k] && cavs_model_set_balance(r->m, k, v + at, X[k]))
      lib_die(cavs_model_error(r->m));
    at += 2 * X[k] + 1;
  }
  free(v);
}

/* The same step as one of dist_size ranks (mpirun): this rank's part of the minibatch
 * (dist_part: by vertices) forward; the losses' counts and sums, and whether a rank was
 * asked to stop, summed over the ranks; the backward pass divided by the whole's counts;
 * the gradients summed (dist_reduce_grads); the same step on every rank; the whole
 * minibatch's numbers in t. A rank without a graph of its own (a last minibatch of
 * fewer graphs than ranks) runs the first graph and sends zeros: every rank makes one
 * forward pass a step, as the dropout keys and the touched rows expect. */
static int part_step(Run *r, int epoch, int b, int k, const cavs_optim *opt, Totals *t) {
  const cavs_desc *d = r->d;
  int lo, hi, nl = d->nlosses;
  long before;
  if (r->carry) { /* a rank's graphs keep their places from minibatch to minibatch */
    lo = (int)((long)r->o->batch * dist_rank / dist_size), hi = (int)((long)r->o->batch * (dist_rank + 1) / dist_size);
    lo = lo < k ? lo : k, hi = hi < k ? hi : k, before = 0;
    for (int i = 0; i < lo; i++) before += r->gs[i]->n;
  } else dist_part(r->gs, k, &lo, &hi, &before);
  bool none = lo == hi;
  r->carry_n = hi - lo;
  if (none) lo = 0, hi = 1, before = 0;
  read_part(r, b, lo, hi); /* (only this rank's graphs, where the data is streamed) */
  long *lb[MAX_ROUTES] = {0};
  int nlb[MAX_ROUTES] = {0};
  if (none) loads_now(r, lb, nlb);
  cavs_stats st;
  errno = 0;
  dist_experts(r->m, true); /* (--expert-parallel: this step's passes place the experts) */
  if (cavs_model_set_vertex_offset(r->m, before) || cavs_model_forward(r->m, r->gs + lo, hi - lo, &st))
    lib_die(cavs_model_error(r->m));
  if (none) { /* (its routing counted for nothing too) */
    loads_skip(r, lb, nlb);
    for (int k = 0; k < MAX_ROUTES; k++) free(lb[k]);
  }
  int n;
  const cavs_loss_acc *a = cavs_model_losses(r->m, &n);
  /* the losses' counts, a stop asked for, each routing's experts where this part ran
     its balancing loss (BALANCED), and a save rank 0's clock says is due */
  long *lv = scratch(sizeof(long) * (size_t)(4 * nl + 2 + BALANCED));
  double *sums = scratch(sizeof(double) * (size_t)(nl + 1));
  for (int l = 0; l < nl; l++) {
    lv[4 * l] = none ? 0 : a[l].count, lv[4 * l + 1] = none ? 0 : a[l].correct;
    lv[4 * l + 2] = none ? 0 : a[l].root_count, lv[4 * l + 3] = none ? 0 : a[l].root_correct;
    sums[l] = none ? 0 : a[l].sum;
  }
  lv[4 * nl] = interrupted != 0;
  balanced_experts(r, none, lv + 4 * nl + 1);
  lv[4 * nl + 1 + BALANCED] = r->save_wish;
  sums[nl] = none ? 0 : isfinite(st.loss) ? 0 : 1; /* ranks whose part diverged */
  dist_sum_long(lv, 4 * nl + 2 + BALANCED);
  r->save_due = lv[4 * nl + 1 + BALANCED] > 0;
  dist_sum_double(sums, nl + 1);
  if (sums[nl] > 0) {
    if (!none && !isfinite(st.loss)) diverged(r, epoch, b + lo, &st);
    die(1, "epoch %d: the loss is not finite on another rank (diverged); try a smaller --lr or --clip", epoch);
  }
  cavs_loss_acc *whole = scratch(sizeof(cavs_loss_acc) * (size_t)nl);
  long *counts = scratch(sizeof(long) * (size_t)nl);
  for (int l = 0; l < nl; l++) {
    whole[l] = (cavs_loss_acc){.sum = sums[l], .count = lv[4 * l], .correct = lv[4 * l + 1],
                               .root_count = lv[4 * l + 2], .root_correct = lv[4 * l + 3]};
    counts[l] = lv[4 * l];
  }
  errno = 0;
  if (cavs_model_set_loss_counts(r->m, counts)) lib_die(cavs_model_error(r->m));
  balance_whole(r, none, lv + 4 * nl + 1);
  dist_backward_begin(r->m, es_of_model(), !none);
  if (none && dist_expert_parallel) {
    /* its pass counts for nothing, but its experts' gradients are the other ranks' rows'
       (cavs_model_expert_serve: cleared, then only those added) */
    errno = 0;
    if (cavs_model_expert_serve(r->m)) lib_die(cavs_model_error(r->m));
  } else cavs_model_backward(r->m);
  dist_experts(r->m, false);
  if (none && !dist_expert_parallel) { /* its pass counted for nothing */
    size_t count;
    void *g = cavs_model_grads_flat(r->m, &count);
    void *zero = scratch(count * es_of_model());
    memset(zero, 0, count * es_of_model());
    errno = 0;
    if (cavs_model_write(r->m, g, zero, count * es_of_model())) lib_die(cavs_model_error(r->m));
    free(zero);
  }
  errno = 0;
  if (dist_reduce_grads(r->m, es_of_model()) || cavs_model_step(r->m, opt)) lib_die(cavs_model_error(r->m));
  stats_of(d, whole, &st);
  add_sums(t, &st, whole, nl, k);
  add_norm(r, t);
  int stop = lv[4 * nl] ? (interrupted ? interrupted : SIGTERM) : 0;
  free(lv), free(sums), free(whole), free(counts);
  return stop;
}

/* Every SAME_EVERY steps and at the end of each epoch the ranks compare a hash of their
 * parameters: the same gradients and steps keep them the same bits, and a rank that
 * drifted (another BLAS, another CPU's kernels) is an error, not a quiet divergence. */
enum { SAME_EVERY = 256 };
static void same_params(Run *r, long step) {
  size_t count, es = es_of_model();
  char *p = cavs_model_params_flat(r->m, &count);
  /* the parameters but the placed experts' tables (--expert-parallel: each expert is
     its rank's alone, the others' rows given back), a piece at a time */
  enum { PIECE = 1 << 20 };
  char *host = scratch(PIECE * es);
  uint64_t h = dist_hash(0, NULL, 0);
  for (size_t at = 0; at < count;) {
    size_t end = count, off, n;
    for (bool past = true; past;) {
      past = false;
      for (int i = 0; i < cavs_model_expert_placed(r->m, i, &off, &n); i++)
        if (off <= at && at < off + n) at = off + n, past = true;
    }
    if (at >= count) break;
    for (int i = 0; i < cavs_model_expert_placed(r->m, i, &off, &n); i++)
      if (off > at && off < end) end = off;
    size_t k = end - at < PIECE ? end - at : PIECE;
    errno = 0;
    if (cavs_model_read(r->m, host, p + at * es, k * es)) lib_die(cavs_model_error(r->m));
    h = dist_hash(h, host, k * es);
    at += k;
  }
  free(host);
  dist_same(h, fmt("their parameters after step %ld (not the same bits: another CPU's or library's arithmetic on a "
                   "rank?)", step));
}

/* Under mpirun, carrying: each rank's rows of the carried state (the streams at its places
 * of the minibatch, [B * rank / N, B * (rank + 1) / N)) gathered, in rank order, which
 * is the places' order, into rank 0's model, which saves them (after an epoch, whose end
 * the next one does not go on from, or interrupted); every rank calls it. */
static void gather_carried(Run *r) {
  if (dist_size == 1 || !r->carry) return;
  long w;
  cavs_model_carried(r->m, &w);
  size_t row = (size_t)w * es_of_model(), total;
  char *mine = scratch((size_t)r->carry_n * row + 1);
  if (cavs_model_read_carried(r->m, 0, r->carry_n, mine)) lib_die(cavs_model_error(r->m));
  char *all = dist_gather(mine, (size_t)r->carry_n * row, &total);
  free(mine);
  if (!dist_rank && cavs_model_set_carried(r->m, all, (int)(total / (row ? row : 1)))) lib_die(cavs_model_error(r->m));
  free(all);
}

/* ... and given back, a checkpoint's state resumed under mpirun (saved by any number of
 * ranks, or by one process): each rank keeps the rows of its places. */
static void part_carried(Run *r) {
  if (dist_size == 1 || !r->carry) return;
  long w;
  int rows = cavs_model_carried(r->m, &w), B = r->o->batch;
  int lo = (int)((long)B * dist_rank / dist_size), hi = (int)((long)B * (dist_rank + 1) / dist_size);
  lo = lo < rows ? lo : rows, hi = hi < rows ? hi : rows;
  char *mine = scratch((size_t)(hi - lo) * (size_t)w * es_of_model() + 1);
  if (cavs_model_read_carried(r->m, lo, hi - lo, mine) || cavs_model_set_carried(r->m, mine, hi - lo))
    lib_die(cavs_model_error(r->m));
  free(mine);
}

/* One epoch's minibatches in their order: shuffled, or the streams side by side where the
 * state is carried (from zeros at the epoch's start, unless it is not fresh: an epoch
 * resumed in its middle goes on from the state its checkpoint carried, under mpirun each
 * rank from its places' rows: part_carried), the chunks cut afresh
 * with --bptt-vary (lengths drawn from the shuffling generator, which an interrupted
 * epoch's checkpoint keeps as the epoch began: the resumed epoch cuts the same). The
 * epoch's graphs: epoch_graph. */
static int epoch_order(Run *r, bool fresh) {
  int n = r->n;
  if (r->carry) {
    if (fresh) cavs_model_reset_state(r->m); /* (else the checkpoint's state goes on) */
    if (r->ts.bptt_vary > 0) {
      char why[256];
      if (bptt_cut(&r->cut, r->chunks, n, r->d->nint, r->o->batch, r->ts.bptt_vary, &r->ts.rng, why, sizeof why))
        die(1, "--bptt-vary: %s", why);
      return r->cut.n;
    }
    int *order = stream_order(n, r->o->batch);
    memcpy(r->order, order, sizeof(int) * (size_t)n);
    free(order);
    return n;
  }
  for (int i = 0; i < n; i++) r->order[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(rng_next(&r->ts.rng) % (uint64_t)(i + 1));
    int tmp = r->order[i];
    r->order[i] = r->order[j];
    r->order[j] = tmp;
  }
  return n;
}

static const cavs_graph *epoch_graph(const Run *r, int i) {
  if (r->st) { /* (the graph's size alone, until the step reads it: read_part) */
    r->sizes[i % r->o->batch] = (cavs_graph){.n = cavs_stream_graph_vertices(r->st, r->order[i])};
    return &r->sizes[i % r->o->batch];
  }
  return r->ts.bptt_vary > 0 ? &r->cut.g[i] : cavs_dataset_graph(r->tr, r->order[i]);
}

/* Routing k's loads over the epoch's training passes so far (under mpirun, every rank's
 * added up: every rank calls it), into *load (X longs, the caller's to free); X, the
 * experts' count, or 0 where the routing has not run (nor any after it). */
static int route_loads(Run *r, int k, long **load) {
  int X = cavs_model_expert_load(r->m, k, NULL, 0);
  if (dist_size > 1) { /* (a rank that ran none of it says 0: the others' count) */
    long x[3] = {X > 0 ? X : 0, X > 0, X > 0 ? (long)X * X : 0};
    dist_sum_long(x, 3);
    X = x[1] ? (int)(x[0] / x[1]) : 0;
    if ((long)X * x[1] != x[0] || (long)X * X * x[1] != x[2])
      die(1, "the ranks disagree on the experts of routing %d", k);
  }
  if (X <= 0) return 0;
  long *l = *load = xmalloc(sizeof(long) * (size_t)X);
  for (int e = 0; e < X; e++) l[e] = 0;
  cavs_model_expert_load(r->m, k, l, X);
  /* (what counted for nothing; a resumed epoch's loads before it, as negatives) */
  for (int e = 0; e < X && e < r->nskip[k]; e++) l[e] -= r->skip[k][e];
  if (dist_size > 1) dist_sum_long(l, X);
  return X;
}

/* How the epoch's training passes spread the slots of each mixture of experts over its
 * experts (under mpirun, every rank's added up): the least and most loaded expert's
 * share, and the loads' coefficient of variation. */
static void expert_loads(Run *r, Totals *t) {
  t->routes = 0;
  for (int k = 0; k < MAX_ROUTES; k++) {
    long *load;
    int X = route_loads(r, k, &load);
    if (X <= 0) break;
    double sum = 0, sq = 0, lo = -1, hi = 0;
    for (int e = 0; e < X; e++) {
      sum += (double)load[e];
      lo = lo < 0 || load[e] < lo ? (double)load[e] : lo;
      hi = load[e] > hi ? (double)load[e] : hi;
    }
    double mean = sum / X;
    for (int e = 0; e < X; e++) sq += ((double)load[e] - mean) * ((double)load[e] - mean);
    free(load);
    t->load_min[k] = sum > 0 ? lo / sum : 0;
    t->load_max[k] = sum > 0 ? hi / sum : 0;
    t->load_cv[k] = mean > 0 ? sqrt(sq / X) / mean : 0;
    t->routes = k + 1;
  }
}

/* What the epoch's own counters add to its totals t (a resumed epoch's hold what the run
 * before counted: totals_read): the seconds since start, under mpirun the time summing
 * gradients and its tables since `reduced`, the backend's launches, and with the experts
 * placed what moved (reset: those counters start again, at the epoch's end). Every rank
 * calls it. */
static void epoch_counters(Run *r, Totals *t, double start, const DistStats *reduced, bool reset) {
  t->secs += now() - start;
  t->reduce_secs += dist_stats.seconds - reduced->seconds;
  t->reduce_during += dist_stats.overlapped - reduced->overlapped;
  t->tables_rows += dist_stats.sparse_tables - reduced->sparse_tables;
  t->tables_dense += dist_stats.dense_tables - reduced->dense_tables;
  t->reduce_bytes += dist_stats.bytes - reduced->bytes;
  cavs_backend_stats bs;
  cavs_model_backend_stats(r->m, &bs, 0);
  t->launches += (long)bs.launches;
  if (dist_expert_parallel && dist_size > 1) {
    cavs_expert_stats es;
    cavs_model_expert_stats(r->m, &es, reset);
    long sent[4] = {es.rows_out, es.rounds, es.rows_replicated, es.matrices};
    dist_sum_long(sent, 4);
    t->ep_rows += sent[0], t->ep_rounds += sent[1] / dist_size, t->ep_replicated += sent[2], t->ep_secs += es.seconds;
    t->ep_matrices += sent[3];
  }
}

/* The totals of an epoch so far, which a checkpoint saved inside it keeps (in the place
 * of a refused log record, cavs_ckpt_save_record, which only an epoch's end has) so that
 * the resumed run's line and --log record count the whole epoch as a run never stopped
 * would, to the bit: a JSON object on one line, its sums as jansson writes reals (17
 * digits, which read back to the same double). u: the totals with the counters to now
 * (epoch_counters); loads[k]: routing k's X[k] loads so far, every rank's. */
static char *totals_text(int epoch, const Totals *u, long *const *loads, const int *X) {
  json_t *o = json_object();
  json_set(o, "epoch_so_far", json_integer(epoch));
  json_set(o, "graphs", json_integer(u->graphs));
  json_set(o, "batches", json_integer(u->batches));
  json_set(o, "loss_sum", json_num(u->batch_loss));
  long counts[4] = {u->count, u->correct, u->root_count, u->root_correct};
  json_t *c = json_array(), *ls = json_array(), *n = json_array();
  for (int i = 0; i < 4; i++) json_push(c, json_integer(counts[i]));
  json_set(o, "counts", c);
  for (int l = 0; l < u->nl; l++) {
    json_t *x = json_array();
    json_push(x, json_num(u->lsum[l]));
    json_push(x, json_integer(u->lcount[l]));
    json_push(x, json_integer(u->lcorrect[l]));
    json_push(ls, x);
  }
  json_set(o, "losses", ls);
  json_push(n, json_num(u->norm_sum));
  json_push(n, json_num(u->norm_max));
  json_push(n, json_integer(u->norms));
  json_set(o, "grad_norms", n);
  json_set(o, "seconds", json_num(u->secs));
  json_set(o, "launches", json_integer(u->launches));
  if (dist_size > 1) {
    json_t *d = json_array();
    double v[6] = {u->reduce_secs, u->reduce_during, (double)u->tables_rows, (double)u->tables_dense, u->reduce_bytes,
                   u->ep_secs};
    for (int i = 0; i < 6; i++) json_push(d, json_num(v[i]));
    long e[4] = {u->ep_rows, u->ep_rounds, u->ep_replicated, u->ep_matrices};
    for (int i = 0; i < 4; i++) json_push(d, json_integer(e[i]));
    json_set(o, "ranks", d);
  }
  json_t *el = json_array();
  for (int k = 0; k < MAX_ROUTES && X[k] > 0; k++) {
    json_t *x = json_array();
    for (int e = 0; e < X[k]; e++) json_push(x, json_integer(loads[k][e]));
    json_push(el, x);
  }
  json_set(o, "expert_loads", el);
  char *text = json_text(o, JSON_COMPACT);
  json_decref(o);
  return text;
}

/* The epoch so far into the checkpoint (o->save): the shuffling state the epoch began
 * with, the graphs done and their totals (totals_text; t, counted from start and
 * `reduced`), and under mpirun every rank's carried state gathered into rank 0's. A
 * signal's save, after which the run stops; --save-every's, after which the epoch goes
 * on as if nothing was saved. Every rank calls it. */
static void save_inside(Run *r, int epoch, int done, uint64_t rng_at_start, const Totals *t, double start,
                        const DistStats *reduced) {
  Totals u = *t;
  epoch_counters(r, &u, start, reduced, false);
  long *loads[MAX_ROUTES] = {0};
  int X[MAX_ROUTES] = {0};
  for (int k = 0; k < MAX_ROUTES && (X[k] = route_loads(r, k, &loads[k])) > 0; k++) {
  }
  char *text = totals_text(epoch, &u, loads, X);
  for (int k = 0; k < MAX_ROUTES; k++) free(loads[k]);
  uint64_t rng = r->ts.rng;
  long graphs_done = r->ts.graphs_done;
  r->ts.rng = rng_at_start, r->ts.graphs_done = done;
  /* (rank 0 holds every rank's streams after this, its own first: its next pass reads
     the rows of its places, the first, as it would have) */
  gather_carried(r);
  char err[1024];
  bool none;
  r->record = text; /* (inside an epoch a checkpoint keeps no log record: see log_record) */
  int rc = try_save(r, r->o->save, NULL, &none, err, sizeof err);
  r->record = NULL;
  free(text);
  if (rc) die(rc, "%s", err);
  r->ts.rng = rng, r->ts.graphs_done = graphs_done;
  r->last_save = now();
}

/* A long of a JSON array's element i within [0, max], or -1 */
static long json_count_at(const json_t *a, size_t i, long max) {
  const json_t *x = json_array_get(a, i);
  if (!json_is_integer(x)) return -1;
  json_int_t v = json_integer_value(x);
  return v >= 0 && v <= max ? (long)v : -1;
}

/* A finite double of a JSON array's element i (a real or an integer) into *v; false
   where it is not one */
static bool json_real_at(const json_t *a, size_t i, double *v) {
  const json_t *x = json_array_get(a, i);
  if (json_is_integer(x)) return *v = (double)json_integer_value(x), true;
  return json_is_real(x) && isfinite(*v = json_real_value(x));
}

/* (a count, however large, leaves room for what the rest of the epoch adds) */
#define MAX_TOTAL (1L << 62)

/* totals_read's sums and counts of o (its structure checked) into u: NULL, or what is
   wrong with them */
static const char *totals_sums(const json_t *o, Totals *u) {
  const json_t *c = json_object_get(o, "counts"), *ls = json_object_get(o, "losses"),
               *n = json_object_get(o, "grad_norms"), *d = json_object_get(o, "ranks"),
               *sec = json_object_get(o, "seconds"), *la = json_object_get(o, "launches"),
               *loss = json_object_get(o, "loss_sum");
  long cs[4];
  for (int i = 0; i < 4; i++) cs[i] = json_count_at(c, (size_t)i, MAX_TOTAL);
  u->count = cs[0], u->correct = cs[1], u->root_count = cs[2], u->root_correct = cs[3];
  if (cs[0] < 0 || cs[1] < 0 || cs[2] < 0 || cs[3] < 0 || cs[1] > cs[0] || cs[3] > cs[2]) return "its counts";
  u->nl = (int)json_array_size(ls);
  for (int l = 0; l < u->nl; l++) {
    const json_t *x = json_array_get(ls, (size_t)l);
    u->lcount[l] = json_count_at(x, 1, MAX_TOTAL), u->lcorrect[l] = json_count_at(x, 2, MAX_TOTAL);
    if (!json_is_array(x) || json_array_size(x) != 3 || !json_real_at(x, 0, &u->lsum[l]) || u->lcount[l] < 0 ||
        u->lcorrect[l] < 0 || u->lcorrect[l] > u->lcount[l])
      return "its losses";
  }
  u->norms = json_count_at(n, 2, u->batches);
  if (!json_real_at(n, 0, &u->norm_sum) || !json_real_at(n, 1, &u->norm_max) || u->norms < 0 || u->norm_sum < 0 ||
      u->norm_max < 0)
    return "its gradient norms";
  if (!json_is_number(sec) || !isfinite(u->secs = json_number_value(sec)) || u->secs < 0 || !json_is_integer(la) ||
      (u->launches = (long)json_integer_value(la)) < 0)
    return "its seconds or launches";
  if (!json_is_real(loss) || !isfinite(u->batch_loss = json_real_value(loss))) return "its loss";
  if (!d) return NULL;
  double v[6];
  long e[4];
  for (size_t i = 0; i < 6; i++)
    if (!json_real_at(d, i, &v[i]) || v[i] < 0 || v[i] > (double)MAX_TOTAL) return "its ranks' counters";
  for (size_t i = 0; i < 4; i++)
    if ((e[i] = json_count_at(d, 6 + i, MAX_TOTAL)) < 0) return "its ranks' counters";
  u->reduce_secs = v[0], u->reduce_during = v[1], u->tables_rows = (long)v[2], u->tables_dense = (long)v[3];
  u->reduce_bytes = v[4], u->ep_secs = v[5];
  u->ep_rows = e[0], u->ep_rounds = e[1], u->ep_replicated = e[2], u->ep_matrices = e[3];
  return NULL;
}

/* totals_read's expert loads (el, an array of at most MAX_ROUTES) into loads[k] (X[k]
   each, malloc'd): NULL, or what is wrong with them */
static const char *totals_loads(const json_t *el, long **loads, int *X) {
  for (int k = 0; k < (int)json_array_size(el); k++) {
    const json_t *x = json_array_get(el, (size_t)k);
    X[k] = json_is_array(x) ? (int)json_array_size(x) : 0;
    if (X[k] < 1 || X[k] > CAVS_MAX_DIM) return "its experts' loads";
    loads[k] = xmalloc(sizeof(long) * (size_t)X[k]);
    for (int e = 0; e < X[k]; e++)
      if ((loads[k][e] = json_count_at(x, (size_t)e, MAX_TOTAL)) < 0) return "its experts' loads";
  }
  return NULL;
}

/* The totals of the epoch a resumed run goes on with (`epoch`, `done` graphs of it
 * trained) from the checkpoint's text (totals_text), into t; loads of routing k into
 * r->skip[k] as negatives (rank 0's alone: expert_loads adds the ranks'). The text is
 * the file's, untrusted: every count within what `done` graphs can give, every sum
 * finite; NULL, or what is wrong with it. */
static const char *totals_read(Run *r, const char *text, int epoch, long done, Totals *t) {
  json_error_t je;
  json_t *o = json_read(text, strlen(text), JSON_REJECT_DUPLICATES, &je);
  const char *why = NULL;
  Totals u = {0};
  long *loads[MAX_ROUTES] = {0};
  int X[MAX_ROUTES] = {0};
  const json_t *ep = json_object_get(o, "epoch_so_far"), *g = json_object_get(o, "graphs"),
               *b = json_object_get(o, "batches"), *c = json_object_get(o, "counts"), *ls = json_object_get(o, "losses"),
               *n = json_object_get(o, "grad_norms"), *d = json_object_get(o, "ranks"),
               *el = json_object_get(o, "expert_loads");
  if (!json_is_object(o)) why = "not a JSON object";
  else if (!json_is_integer(ep) || json_integer_value(ep) != epoch) why = "not of this epoch";
  else if (!json_is_integer(g) || json_integer_value(g) != done) why = "not of the graphs done";
  else if (!json_is_integer(b) || json_integer_value(b) < 1 || json_integer_value(b) > done) why = "its minibatches";
  else if (!json_is_array(c) || json_array_size(c) != 4 || !json_is_array(ls) || !json_is_array(n) ||
           json_array_size(n) != 3 || !json_is_array(el) || json_array_size(el) > MAX_ROUTES ||
           (d && (!json_is_array(d) || json_array_size(d) != 10)))
    why = "its structure";
  else if (json_array_size(ls) != (size_t)(r->d->nlosses < MAX_LOSSES ? r->d->nlosses : MAX_LOSSES))
    why = "not the model's losses";
  else {
    u.graphs = done, u.batches = (int)json_integer_value(b);
    if (!(why = totals_sums(o, &u))) why = totals_loads(el, loads, X);
  }
  json_decref(o);
  if (!why) {
    *t = u;
    for (int k = 0; k < MAX_ROUTES && X[k] > 0 && !dist_rank; k++) {
      if (X[k] > r->nskip[k]) {
        r->skip[k] = grow_longs(r->skip[k], X[k]);
        for (int e = r->nskip[k]; e < X[k]; e++) r->skip[k][e] = 0;
        r->nskip[k] = X[k];
      }
      for (int e = 0; e < X[k]; e++) r->skip[k][e] -= loads[k][e];
    }
  }
  for (int k = 0; k < MAX_ROUTES; k++) free(loads[k]);
  return why;
}

/* --save-every: whether the checkpoint is due after minibatch `step` (counted from the
   run's first, resumes included, so that a resumed run saves where the run before
   would have); with a time, rank 0's clock says (the ranks agree in part_step) */
static bool save_wish(const Run *r, long step) {
  const TrainOpts *o = r->o;
  if (o->save_steps) return (step + 1) % o->save_steps == 0;
  return o->save_secs > 0 && !dist_rank && now() - r->last_save >= o->save_secs;
}

/* One epoch's minibatches (an interrupted epoch goes on where it stopped, in the same
 * order), added up in t. A signal stops it between two steps, saved; --save-every saves
 * between two steps and goes on. */
static void run_epoch(Run *r, int epoch, int first, Totals *t) {
  TrainOpts *o = r->o;
  uint64_t rng_at_start = r->ts.rng;
  bool going_on = epoch == first && r->ts.graphs_done > 0;
  int n = epoch_order(r, !going_on);
  if (going_on) part_carried(r);
  int b0 = going_on ? (int)(r->ts.graphs_done < n ? r->ts.graphs_done : n) : 0;
  r->ts.graphs_done = 0;
  cavs_model_backend_stats(r->m, NULL, 1);
  cavs_model_expert_load_reset(r->m);
  for (int k = 0; k < MAX_ROUTES; k++)
    for (int e = 0; e < r->nskip[k]; e++) r->skip[k][e] = 0;
  cavs_model_expert_stats(r->m, NULL, 1);
  /* a resumed epoch's totals so far, from the checkpoint (where it has them) */
  const char *why = going_on && r->so_far ? totals_read(r, r->so_far, epoch, b0, t) : NULL;
  if (going_on && (why || !r->so_far) && !dist_rank)
    fprintf(stderr, "%s: the checkpoint %s the totals of epoch %d so far%s%s%s: its line and record count the graphs "
            "from %d on\n", prog, why ? "holds" : "keeps", epoch, why ? ", not usable (" : " (saved by an older cavs)",
            why ? why : "", why ? ")" : "", b0 + 1);
  free(r->so_far);
  r->so_far = NULL;
  cavs_optim opt = o->optim;
  DistStats reduced = dist_stats;
  double start = now(), shown = 0;
  for (int b = b0; b < n; b += o->batch) {
    int k = 0;
    for (; k < o->batch && b + k < n; k++) r->gs[k] = epoch_graph(r, b + k);
    long step = (long)(epoch - 1) * r->nbatches + b / o->batch;
    double lr = lr_at(&r->ts, epoch, step);
    /* a chunk of another length than N: the rate scaled by it (AWD-LSTM's), so that a
       token weighs as much in a short chunk's mean loss as in a long one's */
    opt.lr = r->ts.bptt_vary > 0 ? lr * r->cut.len[b / o->batch] / r->cut.base : lr;
    r->save_wish = o->save && save_wish(r, step);
    int stop = dist_size > 1 ? part_step(r, epoch, b, k, &opt, t) : whole_step(r, epoch, b, k, &opt, t);
    t->lr = lr;
    if (dist_size > 1 && (step + 1) % SAME_EVERY == 0) same_params(r, step + 1);
    if (stop && b + k < n) {
      if (r->tty) printf("\r\033[K");
      if (o->save) save_inside(r, epoch, b + k, rng_at_start, t, start, &reduced); /* (the epoch so far) */
      if (dist_rank) { /* rank 0 says it */
      } else if (o->save)
        fprintf(stderr, "%s: interrupted after %d of the %d graphs of epoch %d; saved to %s (go on with --resume %s)\n",
                prog, b + k, n, epoch, o->save, o->save);
      else fprintf(stderr, "%s: interrupted in epoch %d; nothing saved (no --save)\n", prog, epoch);
      dist_end();
      exit(128 + stop);
    }
    /* (the epoch's last step: end_epoch saves) */
    if (r->save_due && b + k < n) save_inside(r, epoch, b + k, rng_at_start, t, start, &reduced);
    double el = now() - start;
    if (r->tty && (el - shown > 0.1 || b + k >= n)) {
      shown = el;
      double rate = (double)(b + k - b0) / (el > 0 ? el : 1e-9); /* (this run's graphs) */
      progress(epoch, r->last_epoch, b + k, n, rate, t->batch_loss / t->batches,
               (double)(n - b - k) / (rate > 0 ? rate : 1));
    }
  }
  epoch_counters(r, t, start, &reduced, true);
  expert_loads(r, t);
  if (r->tty) printf("\r\033[K");
}

/* The epoch's line on standard output. */
static void print_epoch(const Run *r, int epoch, const Totals *t, const Totals *dv, bool better, const char *unfit,
                        bool best_unsaved) {
  double tloss = unsigned_nan(t->batch_loss / (t->batches ? t->batches : 1));
  printf("epoch %d/%d  train loss %.4f", epoch, r->last_epoch, tloss);
  if (r->lm) printf(" ppl %.2f", exp(tloss));
  if (r->with_acc) printf(" acc %.4f", ratio(t->correct, t->count));
  if (r->dev) {
    printf("  dev loss %.4f", total_loss(dv));
    if (r->lm) printf(" ppl %.2f acc %.4f", exp(total_loss(dv)), ratio(dv->correct, dv->count));
    else if (r->with_acc) printf(" acc %.4f root %.4f", ratio(dv->correct, dv->count), ratio(dv->root_correct, dv->root_count));
    print_losses(stdout, r->d, dv);
  }
  printf("  lr %.3g  %.1fs  %.0f graphs/s", t->lr, t->secs, (double)t->graphs / t->secs);
  /* on a GPU, what a minibatch costs in launches (the CPU's are calls: see libcavs(3)) */
  if (!strcmp(cavs_model_backend(r->m), "cuda")) printf("  %.0f launches/batch", (double)t->launches / (t->batches ? t->batches : 1));
  if (dist_size > 1)
    printf("  %d ranks, %.2fs summing gradients (%.2fs of it in the backward passes)", dist_size, t->reduce_secs,
           t->reduce_during);
  if (dist_size > 1 && dist_expert_parallel)
    printf("  experts placed: %.0f rows/step to other ranks, %.0f on replicas, %.2fs exchanging",
           (double)t->ep_rows / (t->batches ? t->batches : 1), (double)t->ep_replicated / (t->batches ? t->batches : 1),
           t->ep_secs);
  /* a mixture of experts: its least and most loaded expert's share of the slots */
  for (int k = 0; k < t->routes; k++) {
    if (t->routes > 1) printf("  experts[%d]", k);
    else printf("  experts");
    printf(" %.3f-%.3f cv %.2f", t->load_min[k], t->load_max[k], t->load_cv[k]);
  }
  if (better && r->o->save) printf(best_unsaved ? "  (best, not saved)" : "  (best, saved)");
  else if (unfit) printf("  (%s: not a best)", unfit);
  putchar('\n');
  fflush(stdout);
}

/* The epoch's record in --log: a JSON object on one line (jansson), null where a value
 * does not exist (no dev set, or no classifier) or is not finite. */
static json_t *epoch_record(const Run *r, int epoch, const Totals *t, const Totals *dv) {
  json_t *o = json_object();
  json_set(o, "epoch", json_integer(epoch));
  json_set(o, "train_loss", json_num(t->batch_loss / (t->batches ? t->batches : 1)));
  json_set(o, "train_acc", r->with_acc ? json_num(ratio(t->correct, t->count)) : json_null());
  json_set(o, "dev_loss", r->dev ? json_num(total_loss(dv)) : json_null());
  bool dev_acc = r->dev && r->with_acc;
  json_set(o, "dev_acc", dev_acc ? json_num(ratio(dv->correct, dv->count)) : json_null());
  json_set(o, "dev_root_acc", dev_acc && !r->lm ? json_num(ratio(dv->root_correct, dv->root_count)) : json_null());
  if (r->lm) json_set(o, "dev_ppl", r->dev ? json_num(exp(total_loss(dv))) : json_null());
  if (r->dev && dv->nl > 1) {
    json_t *losses = json_array();
    for (int l = 0; l < dv->nl; l++)
      json_push(losses, json_num(mean_loss(dv, l)));
    json_set(o, "dev_losses", losses);
  }
  char when[32];
  time_t now_s = time(NULL);
  struct tm tm;
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now_s, &tm));
  /* the rate of the epoch's last minibatch (past the warm-up, the epoch's rate), by
     what optimizer and schedule */
  json_set(o, "lr", json_num(t->lr));
  json_set(o, "optimizer", json_string(cavs_optim_name(r->ts.optim.kind)));
  json_set(o, "schedule", json_string(sched_name(r->ts.schedule)));
  json_set(o, "graphs_per_s", json_num((double)t->graphs / t->secs));
  json_set(o, "seconds", json_num(t->secs));
  /* the gradient's global norm over the epoch's steps (before a clip): a spike shows in
     the largest long before the loss diverges */
  json_set(o, "grad_norm_mean", t->norms ? json_num(t->norm_sum / (double)t->norms) : json_null());
  json_set(o, "grad_norm_max", t->norms ? json_num(t->norm_max) : json_null());
  if (dist_size > 1) {
    json_set(o, "ranks", json_integer(dist_size));
    json_set(o, "reduce_seconds", json_num(t->reduce_secs));
    json_set(o, "reduce_seconds_in_backward", json_num(t->reduce_during));
    json_set(o, "tables_as_rows", json_integer(t->tables_rows));
    json_set(o, "tables_whole", json_integer(t->tables_dense));
    json_set(o, "reduce_bytes", json_num(t->reduce_bytes));
  }
  if (t->routes) { /* per mixture of experts: its loads' least and largest share, their cv */
    json_t *lo = json_array(), *hi = json_array(), *cv = json_array();
    for (int k = 0; k < t->routes; k++) {
      json_push(lo, json_num(t->load_min[k]));
      json_push(hi, json_num(t->load_max[k]));
      json_push(cv, json_num(t->load_cv[k]));
    }
    json_set(o, "expert_share_min", lo);
    json_set(o, "expert_share_max", hi);
    json_set(o, "expert_load_cv", cv);
  }
  if (dist_size > 1 && dist_expert_parallel) { /* what placing the experts moved */
    json_set(o, "expert_rows_sent", json_integer(t->ep_rows));
    json_set(o, "expert_rows_replicated", json_integer(t->ep_replicated));
    json_set(o, "expert_rounds", json_integer(t->ep_rounds));
    json_set(o, "expert_matrices_sent", json_integer(t->ep_matrices));
    json_set(o, "expert_exchange_seconds", json_num(t->ep_secs));
  }
  json_set(o, "time", json_string(when));
  return o;
}

/* The dev set evaluated: under mpirun each rank runs its places of every minibatch (as in
 * training, so that a carried state keeps its place) and the sums are added up, so that
 * every rank holds the whole's, and decides .best, the plateau and --patience alike. */
static void evaluate_dev(Run *r, Totals *dv) {
  int n = data_count(r->dev), B = r->o->batch;
  if (dist_size == 1) {
    evaluate(r->m, r->dev, B, r->carry, dv);
    return;
  }
  int *order = eval_order(n, B, r->carry), *mine = xmalloc(sizeof(int) * (size_t)(n ? n : 1)), k = 0;
  int lo = (int)((long)B * dist_rank / dist_size), hi = (int)((long)B * (dist_rank + 1) / dist_size);
  for (int b = 0; b < n; b += B)
    for (int i = lo; i < hi && b + i < n; i++) mine[k++] = order[b + i];
  /* (--expert-parallel: the passes place the experts as training's do, every rank
     making as many as the minibatches, rank 0's number) */
  dist_experts(r->m, true);
  evaluate_order(r->m, r->dev, mine, k, hi - lo, r->carry, dist_expert_parallel ? (n + B - 1) / B : 0, dv);
  dist_experts(r->m, false);
  free(order);
  free(mine);
  int nl = r->d->nlosses < MAX_LOSSES ? r->d->nlosses : MAX_LOSSES;
  long lv[5 + 2 * MAX_LOSSES] = {dv->count, dv->correct, dv->root_count, dv->root_correct, dv->graphs};
  double sums[MAX_LOSSES];
  for (int l = 0; l < nl; l++) lv[5 + l] = dv->lcount[l], lv[5 + nl + l] = dv->lcorrect[l], sums[l] = dv->lsum[l];
  dist_sum_long(lv, 5 + 2 * nl);
  dist_sum_double(sums, nl);
  dv->count = lv[0], dv->correct = lv[1], dv->root_count = lv[2], dv->root_correct = lv[3], dv->graphs = lv[4];
  dv->nl = nl;
  for (int l = 0; l < nl; l++) dv->lcount[l] = lv[5 + l], dv->lcorrect[l] = lv[5 + nl + l], dv->lsum[l] = sums[l];
}

/* The epoch's record into the log, after its checkpoint's save. A record the log refuses
 * (a full disk, a quota) stops the run (status 1) with the epoch saved; the checkpoint
 * is saved again with the record kept in it, which the resumed run writes into the log
 * (log_kept_record), unless that save fails too (the same full disk), which is said.
 * Kept only then: a checkpoint holds no record otherwise, so that it is the same bytes
 * whatever the log (a record's seconds and time differ run to run). */
static void log_record(Run *r, json_t *record) {
  const char *log = r->o->log, *ck = r->o->save;
  char *text = ck && dist_size == 1 ? json_text(record, 0) : NULL;
  int cut, e = json_put_line(record, r->log, &cut);
  if (!e) {
    free(text);
    return;
  }
  const char *torn = cut ? fmt("; the line written in part could not be cut off (%s): a run resumed cuts it off",
                               strerror(cut))
                         : "";
  /* (under mpirun a save is every rank's: the others are past it) */
  if (!ck || dist_size > 1) die(file_status(e), "cannot write the log '%s': %s%s", log, strerror(e), torn);
  char err[1024];
  bool none;
  free(r->record);
  r->record = text;
  int rc = try_save(r, ck, NULL, &none, err, sizeof err);
  if (rc)
    die(file_status(e), "cannot write the log '%s': %s%s; epoch %d is saved, its record is lost (%s)", log,
        strerror(e), torn, r->ts.epoch, err);
  die(file_status(e), "cannot write the log '%s': %s%s; epoch %d is saved, its record kept in %s for a run resumed "
      "from it to write", log, strerror(e), torn, r->ts.epoch, ck);
}

/* After an epoch: the dev set evaluated, the best so far (by dev accuracy over all
 * vertices for a classifier, else by dev loss, or what --select names), the epoch's line
 * and record, the checkpoints. True when training should stop (--patience). */
static bool end_epoch(Run *r, int epoch, const Totals *t) {
  TrainOpts *o = r->o;
  Totals dv = {0};
  if (r->dev) evaluate_dev(r, &dv);
  double metric = r->select == SELECT_ROOT ? ratio(dv.root_correct, dv.root_count)
                  : r->select == SELECT_ALL ? ratio(dv.correct, dv.count)
                                            : total_loss(&dv);
  /* a dev set without a label of what the metric scores has no metric (its 0 had made
     the first epoch the best for good; a NaN would make a plateau cut the rate) */
  long scored = r->select == SELECT_ROOT ? dv.root_count : r->select == SELECT_ALL ? dv.count : 0;
  for (int l = 0; r->select == SELECT_LOSS && l < dv.nl; l++) scored += dv.lcount[l];
  bool unscored = r->dev && scored == 0;
  if (unscored) metric = NAN;
  /* (a metric that is not finite, a dev loss that overflowed, is never the best: the
     checkpoint and its .best would be replaced by files no reader takes) */
  bool better = r->dev && isfinite(metric) &&
                (r->select != SELECT_LOSS ? metric > r->ts.best : r->ts.best < 0 || metric < r->ts.best);
  /* since_best is at most the epochs done (checkpoints are read so), which are bounded */
  if (better) r->ts.best = metric, r->ts.best_epoch = epoch, r->ts.since_best = 0;
  else if (!unscored) r->ts.since_best++; /* (--patience waits for a metric) */
  r->ts.epoch = epoch;
  bool cut = r->ts.schedule == CAVS_SCHED_PLATEAU && !unscored &&
             sched_plateau(&r->ts, metric, r->select != SELECT_LOSS);
  json_t *record = r->log ? epoch_record(r, epoch, t, &dv) : NULL;
  /* saved before the line is printed, which says whether it was */
  char err[1024];
  bool best_saved = false;
  int unsaved = o->save ? try_save(r, o->save, better ? r->best_path : NULL, &best_saved, err, sizeof err) : 0;
  r->last_save = now(); /* (--save-every TIME counts from here) */
  if (!o->quiet)
    print_epoch(r, epoch, t, &dv, better,
                unscored ? "no vertex of the dev set has a label to score"
                : r->dev && !isfinite(metric) ? "the dev metric is not finite" : NULL,
                !best_saved); /* ("(best, saved)": its .best, whether CKPT's save then failed) */
  if (unsaved) die(unsaved, "%s", err);
  /* the record after the save, of an epoch saved: the log holds the epochs a checkpoint
     holds (a save that failed logged an epoch that the resumed run ran and logged
     again), and a log the disk refuses stops the run with its epoch kept (written
     first, its failure lost the epoch's training) */
  if (record) log_record(r, record);
  if (cut && !o->quiet)
    printf("lr cut to %g: no better dev %s in %d epoch%s\n", r->ts.lr_now, select_metric(r->select),
           r->ts.plateau_patience + 1, r->ts.plateau_patience ? "s" : "");
  if (!o->patience || r->ts.since_best < o->patience || epoch >= r->last_epoch) return false;
  if (!o->quiet) {
    printf("stopping after epoch %d: no better dev %s in %d epochs", epoch, select_metric(r->select), r->ts.since_best);
    if (r->ts.best_epoch) printf(" (best %.4f, epoch %d)\n", r->ts.best, r->ts.best_epoch);
    else printf(" of this run\n");
  }
  return true;
}

/* --bptt-vary (or the checkpoint's): on text-bptt's carried streams only; the first cut
 * made to find the chunks' length N (and whether the data is chains), from a copy of the
 * generator, so that the first epoch draws its own. */
static void choose_cut(Run *r) {
  TrainOpts *o = r->o;
  r->ts.bptt_vary = o->bptt_vary;
  if (!(o->bptt_vary > 0)) return;
  if (!r->carry)
    die(1, "--bptt-vary%s: the chunks vary on text-bptt with the state carried (--bptt-state carry), not %s",
        o->set_vary ? "" : fmt(" %g (the checkpoint's)", o->bptt_vary),
        strncmp(o->format, "text-bptt", 9) ? fmt("format %s", o->format) : "--bptt-state reset");
  r->chunks = xmalloc(sizeof(cavs_graph *) * (size_t)(r->n ? r->n : 1));
  for (int i = 0; i < r->n; i++) r->chunks[i] = cavs_dataset_graph(r->tr, i);
  uint64_t rng = r->ts.rng;
  char why[256];
  if (bptt_cut(&r->cut, r->chunks, r->n, r->d->nint, o->batch, o->bptt_vary, &rng, why, sizeof why))
    die(1, "--bptt-vary: %s", why);
}

/* Under mpirun: every rank must run the same training, or the sums mean nothing. The
 * command line, the model's source, the data's size and the first parameters compared
 * (a hash each), and a minibatch big enough to give every rank a graph. Rank 0 alone
 * prints and writes. */
static void check_ranks(Run *r) {
  if (dist_size == 1) return;
  if (r->o->batch < dist_size)
    dist_die_all(1, fmt("--batch %d is smaller than the %d ranks: each needs a graph of a minibatch", r->o->batch,
                        dist_size));
  uint64_t h = dist_hash(0, NULL, 0);
  for (int i = 0; i < main_argc; i++) h = dist_hash(h, main_argv[i], strlen(main_argv[i]) + 1);
  dist_same(h, "their command lines (mpirun must start the same cavs train on every rank)");
  const char *src = r->L.source ? r->L.source : r->d->name;
  dist_same(dist_hash(dist_hash(0, NULL, 0), src, strlen(src)), "the model's source");
  long sizes[4] = {r->n, train_vertices(r), r->dev ? data_count(r->dev) : 0, r->dev ? data_vertices(r->dev) : 0};
  dist_same(dist_hash(dist_hash(0, NULL, 0), sizes, sizeof sizes), "their data (another --train or --dev file)");
  same_params(r, 0);
}

/* The options train needs, and the pairs it refuses */
static void check_train_opts(const TrainOpts *o) {
  if (!o->model) die(1, "train: no model (a .vf file or a built .so)");
  if (!o->train) die(1, "train: --train FILE is required");
  if (!o->format) die(1, "train: --format is required (ptb-tree, text, text-bptt, text-bptt:N, cgf)");
  if (o->epochs <= 0 || o->batch <= 0) die(1, "train: --epochs and --batch must be positive");
  if (o->init_all && o->resume)
    die(1, "train: --init-all starts a new model; --resume goes on from the checkpoint's parameters");
  if ((o->save_steps || o->save_secs > 0) && !o->save) die(1, "train: --save-every saves to --save CKPT, which is not given");
  if (o->ninit && o->resume) /* it was passed over without a word */
    die(1, "train: --init starts a new model's tables; --resume goes on from the checkpoint's");
}

/* The run's model, vocabulary and data: from the checkpoint resumed, else new; the
   model made at the dims the data and options give */
static void open_run(Run *r, long *dims) {
  TrainOpts *o = r->o;
  r->best_path = o->save ? fmt("%s.best", o->save) : NULL;
  check_outputs(o, r->best_path);
  if (o->resume) read_resumed(r);
  r->L = load_model_arg(o->model);
  r->d = r->L.desc;
  cavs_dims_default(r->d, dims);
  apply_dims(r->d, dims, o);
  if (o->resume) resume_settings(r, dims);
  else if (!(r->v = keep(cavs_vocab_new()))) die(2, "out of memory");
  if (o->stream) r->st = stream_train(r, dims);
  else r->tr = load_data(o->train, o->format, r->d, dims, r->v, r->ck == NULL);
  /* (with --stream the dev file too: each rank reads it through and indexes it) */
  if (o->dev) r->devdata = open_data(o->dev, o->format, r->d, dims, r->v, o->stream), r->dev = &r->devdata;
  if (!r->ck) vocab_dims(r, dims);
  if (o->patience && !r->dev) die(1, "--patience needs a --dev set to watch");
  r->n = r->st ? cavs_stream_count(r->st) : cavs_dataset_count(r->tr);
  make_model(r, dims);
}

/* Where the log's last line begins: the offset after its last newline before `size`
   (0: none), read back from the end 64 KiB at a time; -1 where a read fails. */
static off_t last_line_start(FILE *f, off_t size) {
  char buf[65536];
  for (off_t end = size; end > 0;) {
    off_t from = end > (off_t)sizeof buf ? end - (off_t)sizeof buf : 0;
    size_t want = (size_t)(end - from);
    if (fseeko(f, from, SEEK_SET) || fread(buf, 1, want, f) != want) return -1;
    for (size_t k = want; k > 0; k--)
      if (buf[k - 1] == '\n') return from + (off_t)k;
    end = from;
  }
  return 0;
}

/* Whether the log's line from `start` to `size` is a whole record: an object whose
   first brace closes at the line's end (outside its strings, blanks after it aside),
   read 64 KiB at a time; -1 where a read fails. A record the run before did not finish
   is a part of one, whose first brace is still open, however long the line (a record
   of many experts' shares runs past 64 KiB). Not a parse (json_read): that needs the
   whole line in memory, and a line too long to hold would stop the run, where this
   needs none. (jansson's parse alone cut a whole record off where memory ran out: it
   reported the failed allocation as a syntax error, "invalid token".) */
static int line_closed(FILE *f, off_t start, off_t size) {
  char buf[65536];
  long depth = -1; /* -1: before the first brace; 0: after its close */
  bool in_string = false, escaped = false;
  if (fseeko(f, start, SEEK_SET)) return -1;
  for (off_t at = start; at < size;) {
    size_t want = size - at > (off_t)sizeof buf ? sizeof buf : (size_t)(size - at);
    if (fread(buf, 1, want, f) != want) return -1;
    at += (off_t)want;
    for (size_t k = 0; k < want; k++) {
      char c = buf[k];
      bool blank = c == ' ' || c == '\t' || c == '\r';
      if (depth <= 0) {
        if (blank) continue;
        if (depth == 0 || c != '{') return 0; /* (text after the record, or none begun) */
        depth = 1;
      } else if (in_string) {
        if (escaped) escaped = false;
        else if (c == '\\') escaped = true;
        else if (c == '"') in_string = false;
      } else if (c == '"') in_string = true;
      else if (c == '{' || c == '[') depth++;
      else if (c == '}' || c == ']') depth--;
    }
  }
  return depth == 0;
}

/* A resumed run's log (f, of `size` bytes) whose last line has no end: the run before
   did not finish its record. A whole record whose line's end alone is missing (the disk
   filled, or the run was killed, between the two) is kept, its line ended; a part of
   one is cut off, so that the records appended next do not join it in a line that is
   not JSON. False where the line's end cannot be written; a cut refused stops the run
   here. */
static bool mend_log_end(FILE *f, const char *path, off_t size) {
  char last;
  if (fseeko(f, size - 1, SEEK_SET) || fread(&last, 1, 1, f) != 1 || last == '\n') return true;
  off_t start = last_line_start(f, size);
  int whole = start < 0 ? -1 : line_closed(f, start, size);
  if (whole < 0) return true; /* (unread: left as it is, as a FIFO is) */
  if (whole) {
    fseeko(f, 0, SEEK_END);
    return fputc('\n', f) != EOF && fflush(f) == 0;
  }
  /* (where the cut is refused the run stops here: its records appended after the torn
     line had joined the first of them to it, a line that is not JSON) */
  if (ftruncate(fileno(f), start))
    die(1, "--log %s: its last line, a record the run before did not finish, cannot be cut off: %s", path,
        strerror(errno));
  fprintf(stderr, "%s: --log %s: its last line was cut off (%jd bytes, a record the run before did not finish): "
          "dropped\n", prog, path, (intmax_t)(size - start));
  return true;
}

/* The log, new, or on a resume appended to: a last line the run before did not end (it
   was killed, or the disk was full, as it wrote it) is cut off first, so that the log
   stays a JSON record a line for what reads it (cavs plot); NULL with errno */
static FILE *open_log(const char *path, bool resumed, bool *existed) {
  struct stat st;
  *existed = false;
  /* standard output or error (what the shell sent there, a file appended to perhaps):
     written through the same stream as the epochs' lines, so that no line tears
     another, and never truncated (`--log /dev/stdout >> runs.txt` keeps the runs before) */
  int fd = cv_afile_descriptor(path);
  if (fd == 1 || fd == 2) return fd == 1 ? stdout : stderr;
  if (fd >= 0) { /* another descriptor of the caller's: appended to as it is */
    int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    FILE *f = dup >= 0 ? fdopen(dup, "a") : NULL;
    if (!f && dup >= 0) close(dup);
    return f;
  }
  if (!resumed) return fopen(path, "w");
  /* (a FIFO, say, is appended to as it was: opened for writing alone, nothing read) */
  if (stat(path, &st) || !S_ISREG(st.st_mode)) return fopen(path, "a");
  FILE *f = fopen(path, "a+");
  *existed = f != NULL;
  if (!f || fstat(fileno(f), &st) || !S_ISREG(st.st_mode) || st.st_size == 0) return f;
  if (!mend_log_end(f, path, st.st_size)) {
    fclose(f);
    return NULL;
  }
  fseeko(f, 0, SEEK_END);
  return f;
}

/* The epoch of a log's last record, the number its line begins with (`{"epoch": N`, as
   cavs train writes it); 0 for an empty log; -1 where the line is not such (written
   by another hand: nothing is added to it) or cannot be read. */
static long log_last_epoch(FILE *f) {
  struct stat st;
  char last, head[64];
  if (fflush(f) || fstat(fileno(f), &st)) return -1;
  if (st.st_size == 0) return 0;
  /* (a line not ended is one open_log could not read: left as it is) */
  if (fseeko(f, st.st_size - 1, SEEK_SET) || fread(&last, 1, 1, f) != 1 || last != '\n') return -1;
  off_t start = last_line_start(f, st.st_size - 1);
  if (start < 0 || fseeko(f, start, SEEK_SET)) return -1;
  size_t n = fread(head, 1, sizeof head - 1, f);
  head[n] = 0;
  const char *p = head + strspn(head, " \t");
  static const char key[] = "{\"epoch\":";
  if (strncmp(p, key, sizeof key - 1)) return -1;
  p += sizeof key - 1;
  p += strspn(p, " \t");
  long epoch = 0;
  int digits = 0;
  for (; *p >= '0' && *p <= '9' && digits < 10; p++, digits++) epoch = epoch * 10 + (*p - '0');
  if (!digits || !(*p == ',' || *p == '}' || *p == ' ')) return -1;
  return epoch;
}

/* A resumed run's log that lacks the epoch its checkpoint ends, whose record the log
   refused the run before (log_record): the checkpoint's copy (cavs_ckpt_save_record)
   written now, before this run's, so that the log holds every epoch the checkpoints
   hold. The copy is the file's, untrusted: written only as a JSON object of that epoch,
   through jansson. This run's checkpoints keep no record. A log that lacks the
   checkpoint's epoch with no record kept (a kill between the save and the log's write)
   is said. */
static void log_kept_record(Run *r) {
  char *text = r->record;
  r->record = NULL; /* (this run's checkpoints keep none) */
  if (!r->resumed || !r->log_existed || r->log == stdout || r->log == stderr) {
    free(text);
    return;
  }
  long last = log_last_epoch(r->log);
  fseeko(r->log, 0, SEEK_END);
  /* (the run before stopped between an epoch's save and its record, a moment, or was
     logged elsewhere: said, since the log cannot have them) */
  if (!text && last >= 0 && last < r->ts.epoch) {
    if (last == r->ts.epoch - 1)
      fprintf(stderr, "%s: --log %s: has no record of epoch %d, which the checkpoint holds (the run before stopped "
              "between saving it and logging it)\n", prog, r->o->log, r->ts.epoch);
    else
      fprintf(stderr, "%s: --log %s: has no record of epochs %ld to %d, which the checkpoint holds\n", prog,
              r->o->log, last + 1, r->ts.epoch);
  }
  if (!text) return;
  json_error_t e;
  json_t *rec = last >= 0 && last < r->ts.epoch ? json_read(text, strlen(text), 0, &e) : NULL;
  free(text);
  if (last < 0 || last >= r->ts.epoch) return;
  json_t *ep = json_is_object(rec) ? json_object_get(rec, "epoch") : NULL;
  if (!json_is_integer(ep) || json_integer_value(ep) != r->ts.epoch) {
    json_decref(rec);
    fprintf(stderr, "%s: --log %s: the checkpoint's record of epoch %d is not one: not written\n", prog, r->o->log,
            r->ts.epoch);
    return;
  }
  json_write_line(rec, r->log, fmt("the log '%s'", r->o->log));
  fprintf(stderr, "%s: --log %s: epoch %d's record, which the run before did not write, written from the "
          "checkpoint\n", prog, r->o->log, r->ts.epoch);
}

/* What the epochs need beside the model: the state carried or not, the chunks' cut, the
   ranks' agreement, the log, the minibatch's arrays, the order and schedule chosen */
static void ready_run(Run *r, bool norm) {
  TrainOpts *o = r->o;
  r->carry = carries(o->format);
  if (r->carry && cavs_model_carry_state(r->m, 1)) {
    if (bptt_state == BPTT_CARRY) lib_die(cavs_model_error(r->m));
    r->carry = false; /* a model that cannot (several states): each chunk from zeros */
  }
  if (!r->carry) cavs_model_carry_state(r->m, 0); /* (what a checkpoint carried, not used) */
  /* (kept in the checkpoint: cavs eval and a resume read the chunks as they were) */
  r->ts.bptt_state = strncmp(o->format, "text-bptt", 9) ? CAVS_BPTT_UNSAID : r->carry ? CAVS_BPTT_CARRY : CAVS_BPTT_RESET;
  choose_cut(r);
  check_ranks(r);
  r->with_acc = has_accuracy(r->d);
  r->lm = r->with_acc && lm_format(o->format);
  r->last_epoch = r->ts.epoch + o->epochs; /* resume_settings bounded it */
  /* the last of the options' checks before the log is opened: a run refused leaves a log
     of the same name as it was */
  choose_selection(r);
  choose_schedule(r);
  if (o->set_momentum && o->optim.kind != CAVS_MOMENTUM && o->optim.kind != CAVS_NESTEROV)
    die(1, "--momentum goes with --optimizer momentum or nesterov, not %s", cavs_optim_name(o->optim.kind));
  if (o->log) {
    r->log = open_log(o->log, r->resumed, &r->log_existed);
    if (!r->log) die(file_status(errno), "cannot write '%s': %s", o->log, strerror(errno));
  }
  log_kept_record(r);
  if (norm) cavs_model_track_grad_norm(r->m, 1); /* for the log's grad_norm fields */
  if (!o->quiet) say_start(r);
  /* under mpirun a rank's stdout is mpirun's pseudo-terminal, whatever mpirun's own is: lines */
  r->tty = isatty(1) && !o->quiet && dist_size == 1;
  r->order = xmalloc(sizeof(int) * (size_t)r->n);
  if (r->st) r->sizes = xmalloc(sizeof(cavs_graph) * (size_t)o->batch);
  r->gs = xmalloc(sizeof(cavs_graph *) * (size_t)o->batch);
}

/* The epochs, stopping early where end_epoch says (patience) or, after the epoch under
   way, at SIGINT or SIGTERM: then the process exits 128 + the signal */
static void train_epochs(Run *r) {
  TrainOpts *o = r->o;
  struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESETHAND};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  int first = r->ts.epoch + 1;
  r->nbatches = (r->n + o->batch - 1) / o->batch;
  r->last_save = now();
  for (int epoch = first; epoch <= r->last_epoch; epoch++) {
    Totals t = {0};
    run_epoch(r, epoch, first, &t);
    if (dist_size > 1) same_params(r, (long)epoch * r->nbatches);
    if (end_epoch(r, epoch, &t)) break;
    long stop = interrupted != 0;
    dist_sum_long(&stop, 1); /* the ranks stop together */
    if (stop && epoch < r->last_epoch) {
      if (!dist_rank)
        fprintf(stderr, "%s: interrupted after epoch %d%s\n", prog, epoch, o->save ? fmt("; saved to %s", o->save) : "");
      dist_end();
      exit(128 + (interrupted ? interrupted : SIGTERM));
    }
  }
}

static void close_run(Run *r) {
  if (r->log == stdout || r->log == stderr) fflush(r->log); /* (the process's own) */
  else if (r->log) fclose(r->log);
  free(r->order);
  free(r->gs);
  free(r->chunks);
  bptt_cut_free(&r->cut);
  dist_release(); /* (its buffers are the model's backend's) */
  for (int k = 0; k < MAX_ROUTES; k++) free(r->skip[k]);
  cavs_model_free(r->m);
  cavs_dataset_free(r->tr);
  cavs_dataset_free(r->part);
  cavs_stream_close(r->st);
  free(r->sizes);
  if (r->dev) close_data(r->dev);
  cavs_vocab_free(r->v);
  cavs_ckpt_free(r->ck);
  free(r->record);
  free(r->so_far);
}

int cmd_train(TrainOpts *o) {
  dist_start();
  /* (every rank keeps the gradients' norm for rank 0's log: with the experts placed,
     the norm is a sum over the ranks) */
  bool norm = o->log != NULL;
  if (dist_rank) o->quiet = true, o->log = NULL; /* rank 0 prints and writes */
  check_train_opts(o);
  Run r = {.o = o};
  long dims[CAVS_MAX_DIMS] = {0};
  open_run(&r, dims);
  ready_run(&r, norm);
  train_epochs(&r);
  close_run(&r);
  dist_end();
  return 0;
}

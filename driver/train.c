/* train.c: cavs train. Checks the outputs before anything runs, loads the model and the
 * data (a resume continues the checkpoint's settings unless they are given again), then
 * runs the epochs: shuffle, forward, backward, step, with a progress bar on a terminal,
 * a line per epoch, a JSON line per epoch in --log, and the checkpoints. SIGINT and
 * SIGTERM stop it between two steps, saved. */
#include "driver.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

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
    long v = strtol(eq + 1, &end, 10);
    if (*end || v <= 0 || v > (1L << 24)) die(1, "--dim %s: the value must be a positive integer", o->dimset[i]);
    if (d->dims[found].kind == CAVS_DIM_VOCAB) die(1, "dim %s is bound by the data (vocab); it cannot be set", d->dims[found].name);
    if (d->dims[found].kind == CAVS_DIM_PRODUCT)
      die(1, "dim %s is the product %s * %s; set its factors instead", d->dims[found].name,
          d->dims[d->dims[found].a].name, d->dims[d->dims[found].b].name);
    dims[found] = v;
  }
  cavs_dims_derive(d, dims);
}

/* The learning rate of minibatch `step` (counted from the first of the run, resumes
   included) in `epoch`: the base rate, times lr_decay once every lr_step epochs, times
   (step + 1) / warmup over the first warmup minibatches. */
static double lr_at(const TrainOpts *o, int epoch, long step) {
  double lr = o->optim.lr;
  if (o->lr_decay > 0 && o->lr_decay < 1) lr *= pow(o->lr_decay, (double)((epoch - 1) / (o->lr_step > 0 ? o->lr_step : 1)));
  if (o->warmup > 0 && step < o->warmup) lr *= (double)(step + 1) / (double)o->warmup;
  return lr;
}

/* the parameter of d called name[0..len), or -1 */
static int param_named(const cavs_desc *d, const char *name, size_t len) {
  for (int i = 0; i < d->nparams; i++)
    if (strlen(d->params[i].name) == len && !memcmp(d->params[i].name, name, len)) return i;
  return -1;
}

int cmd_train(TrainOpts *o) {
  if (!o->model) die(1, "train: no model (a .vf file or a built .so)");
  if (!o->train) die(1, "train: --train FILE is required");
  if (!o->format) die(1, "train: --format is required (ptb-tree, text, cgf)");
  if (o->epochs <= 0 || o->batch <= 0) die(1, "train: --epochs and --batch must be positive");
  char *best_path = o->save ? fmt("%s.best", o->save) : NULL;
  /* what --save may not write over (--resume it may: that is how a run goes on), then
     what --log may not */
  const char *inputs[] = {o->model, o->train, o->dev, o->log, o->resume, o->save, best_path};
  const char *what[] = {"the model", "the --train data", "the --dev data", "the --log file", "the checkpoint resumed from",
                        "the --save checkpoint", "the best checkpoint"};
  if (o->save) {
    check_output("save", o->save, inputs, what, 4);
    check_output("save", best_path, inputs, what, 4);
  }
  if (o->log) check_output("log", o->log, inputs + 4, what + 4, 3), check_output("log", o->log, inputs, what, 3);
  Loaded L = load_model_arg(o->model);
  const cavs_desc *d = L.desc;
  long dims[CAVS_MAX_DIMS] = {0};
  cavs_dims_default(d, dims);
  apply_dims(d, dims, o);
  cavs_ckpt *ck = NULL;
  cavs_vocab *v;
  char err[1024];
  if (o->resume) {
    ck = keep(cavs_ckpt_read(o->resume, err, sizeof err));
    if (!ck) die(1, "%s", err);
    if (strcmp(cavs_ckpt_model(ck), d->name))
      die(1, "%s: the checkpoint is of model '%s', not '%s'", o->resume, cavs_ckpt_model(ck), d->name);
    if (strcmp(cavs_ckpt_hash(ck), d->source_hash))
      die(1, "%s: the checkpoint was trained from another version of model '%s' (source hash %s, %s is %s)", o->resume,
          d->name, cavs_ckpt_hash(ck), o->model, d->source_hash);
    long cd[CAVS_MAX_DIMS] = {0};
    if (cavs_ckpt_dims(ck, d, cd, err, sizeof err)) die(1, "%s: %s", o->resume, err);
    /* only the dims given on the command line must agree with the checkpoint */
    long asked[CAVS_MAX_DIMS] = {0};
    for (int j = 0; j < d->ndims; j++) asked[j] = -1;
    apply_dims(d, asked, o);
    for (int j = 0; j < d->ndims; j++)
      if (asked[j] >= 0 && asked[j] != cd[j])
        die(1, "%s: dim %s is %ld in the checkpoint, but --dim asks for %ld", o->resume, d->dims[j].name, cd[j], asked[j]);
    /* the training settings continue too, unless given again */
    const cavs_train_state *cs = cavs_ckpt_state(ck);
    cavs_optim c = cs->optim;
    if (o->set_kind) {
      c.kind = o->optim.kind;
      c.lr = cavs_optim_default_lr(c.kind); /* another optimizer: its own default rate */
    }
    if (o->set_lr) c.lr = o->optim.lr;
    if (o->set_clip) c.clip = o->optim.clip;
    if (o->set_wd) c.weight_decay = o->optim.weight_decay;
    o->optim = c;
    if (!o->set_batch && cs->batch > 0) o->batch = cs->batch;
    /* the schedule and the selection (format 3 on: select is then 1..3) */
    if (cs->select && !o->set_sched) {
      o->lr_decay = cs->lr_decay;
      o->lr_step = cs->lr_step;
      o->warmup = cs->warmup;
      o->patience = cs->patience;
    }
    memcpy(dims, cd, sizeof(long) * (size_t)d->ndims);
    v = keep(cavs_ckpt_vocab(ck));
    if (!v) die(1, "%s: damaged vocabulary", o->resume);
  } else {
    v = keep(cavs_vocab_new());
  }
  cavs_dataset *tr = load_data(o->train, o->format, d, dims, v, ck == NULL);
  cavs_dataset *dev = o->dev ? load_data(o->dev, o->format, d, dims, v, 0) : NULL;
  /* a vocabulary dim counts the tokens read, or for cgf, whose features are numbers
     already, the ids used */
  if (!ck)
    for (int j = 0; j < d->ndims; j++) {
      if (d->dims[j].kind != CAVS_DIM_VOCAB) continue;
      dims[j] = cavs_vocab_size(v);
      if (!strcmp(o->format, "cgf")) {
        int mx = cavs_dataset_max_feature(tr, d->inputs[d->dims[j].input].slot);
        if (dev && cavs_dataset_max_feature(dev, d->inputs[d->dims[j].input].slot) > mx)
          mx = cavs_dataset_max_feature(dev, d->inputs[d->dims[j].input].slot);
        dims[j] = mx + 1 > 1 ? mx + 1 : 1;
      }
    }
  errno = 0;
  cavs_model *m = keep(cavs_model_new_opts(d, dims, &model_opts, err, sizeof err));
  if (!m) lib_die(err);
  cavs_model_set_policy(m, model_policy);
  cavs_model_set_ablations(m, model_ablations);
  cavs_train_state ts = {.rng = o->seed * 0x9e3779b97f4a7c15ull + 1, .best = -1, .seed = o->seed,
                         .threads = o->threads, .batch = o->batch, .optim = o->optim};
  const cavs_graph **gs = xmalloc(sizeof(cavs_graph *) * (size_t)o->batch);
  snprintf(ts.format, sizeof ts.format, "%s", o->format);
  if (ck) {
    if (cavs_ckpt_apply(ck, m, err, sizeof err)) die(1, "%s: %s", o->resume, err);
    const cavs_train_state *cs = cavs_ckpt_state(ck);
    ts.epoch = cs->epoch;
    ts.rng = cs->rng;
    ts.best = cs->best;
    ts.seed = cs->seed;
    ts.graphs_done = cs->graphs_done;
    ts.select = cs->select;
    ts.since_best = cs->since_best;
    ts.best_epoch = cs->best_epoch;
  } else {
    cavs_model_init(m, o->seed);
  }
  /* pre-trained vectors into a new model's tables (a resumed one has its own), then
     the parameters kept fixed */
  long found[8] = {0};
  int inited[8];
  for (int i = 0; i < o->ninit && !ck; i++) {
    const char *eq = strchr(o->init[i], '=');
    int p = eq ? param_named(d, o->init[i], (size_t)(eq - o->init[i])) : -1;
    if (!eq || !eq[1]) die(1, "--init: '%s' is not PARAM=FILE", o->init[i]);
    if (p < 0) die(1, "--init: model '%s' has no parameter '%.*s'", d->name, (int)(eq - o->init[i]), o->init[i]);
    if (cavs_model_load_vectors(m, p, eq + 1, v, &found[i], err, sizeof err)) die(1, "%s", err);
    inited[i] = p;
  }
  for (int i = 0; i < o->nfreeze; i++) {
    int p = param_named(d, o->freeze[i], strlen(o->freeze[i]));
    if (p < 0) die(1, "--freeze: model '%s' has no parameter '%s'", d->name, o->freeze[i]);
    if (cavs_model_freeze(m, p, 1)) die(1, "--freeze: %s", cavs_model_error(m));
  }
  FILE *log = NULL;
  if (o->log) {
    log = fopen(o->log, ck ? "a" : "w");
    if (!log) die(1, "cannot write '%s': %s", o->log, strerror(errno));
  }
  bool tty = isatty(1) && !o->quiet, with_acc = has_accuracy(d);
  int n = cavs_dataset_count(tr);
  int *order = xmalloc(sizeof(int) * (size_t)n);
  long nparams = 0;
  for (int i = 0; i < d->nparams; i++) {
    long r, c;
    cavs_model_param(m, i, &r, &c, NULL);
    nparams += r * c;
  }
  struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESETHAND};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  if (!o->quiet) {
    say_device(stdout, m);
    printf("model %s: %ld parameters; %d training graphs (%ld vertices)", d->name, nparams, n, cavs_dataset_vertices(tr));
    if (ck) printf("; resumed after epoch %d", ts.epoch);
    if (ck && ts.graphs_done) printf(" and %ld graphs of the next", ts.graphs_done);
    printf("\n");
    for (int i = 0; i < o->ninit && !ck; i++)
      printf("init %s: %ld of the %d words from %s\n", d->params[inited[i]].name, found[i], cavs_vocab_size(v) - 2,
             strchr(o->init[i], '=') + 1);
    fflush(stdout);
  }
  int first = ts.epoch + 1, last_epoch = ts.epoch + o->epochs;
  if (o->patience && !dev) die(1, "--patience needs a --dev set to watch");
  /* what picks .best: --select, else the checkpoint's, else by the model */
  int select = o->select != SELECT_DEFAULT ? o->select : ts.select ? ts.select : with_acc ? SELECT_ALL : SELECT_LOSS;
  if (select != SELECT_LOSS && !with_acc) die(1, "--select %s: model '%s' has no classifier", select == SELECT_ROOT ? "root" : "all", d->name);
  long nbatches = (n + o->batch - 1) / o->batch;
  int since_best = ts.since_best, best_epoch = ts.best_epoch;
  if (ck && ts.best >= 0 && (ts.select ? ts.select != select : o->select != SELECT_DEFAULT)) {
    /* the checkpoint's best is another metric's (or one an older format did not name) */
    if (!o->quiet) printf("--select %s: the best of the checkpoint's runs is forgotten\n",
                          select == SELECT_ROOT ? "root" : select == SELECT_ALL ? "all" : "loss");
    ts.best = -1, since_best = 0, best_epoch = 0;
  }
  ts.select = select;
  ts.lr_decay = o->lr_decay;
  ts.lr_step = o->lr_step;
  ts.warmup = o->warmup;
  ts.patience = o->patience;
  cavs_optim opt = o->optim;
  for (int epoch = first; epoch <= last_epoch; epoch++) {
    /* an interrupted epoch goes on where it stopped, in the same order */
    uint64_t rng_at_start = ts.rng;
    int b0 = epoch == first && ts.graphs_done > 0 ? (int)(ts.graphs_done < n ? ts.graphs_done : n) : 0;
    ts.graphs_done = 0;
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n - 1; i > 0; i--) {
      int j = (int)(rng_next(&ts.rng) % (uint64_t)(i + 1));
      int t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    Totals t = {0};
    cavs_model_backend_stats(m, NULL, 1);
    double start = now(), shown = 0;
    for (int b = b0; b < n; b += o->batch) {
      int k = 0;
      for (; k < o->batch && b + k < n; k++) gs[k] = cavs_dataset_graph(tr, order[b + k]);
      cavs_stats st;
      errno = 0;
    if (cavs_model_forward(m, gs, k, &st)) lib_die(cavs_model_error(m));
      if (!isfinite(st.loss)) {
        char why[512];
        int bg, bv;
        if (cavs_model_check_finite(m, &bg, &bv, why, sizeof why)) {
          if (bg >= 0)
            die(1, "epoch %d: %s at vertex %d of graph %d of %s; try a smaller --lr or --clip", epoch, why, bv,
                order[b + bg] + 1, o->train);
          die(1, "epoch %d: %s; try a smaller --lr or --clip", epoch, why);
        }
        die(1, "epoch %d: the loss is %g (diverged); try a smaller --lr or --clip", epoch, st.loss);
      }
      cavs_model_backward(m);
      errno = 0;
      opt.lr = lr_at(o, epoch, (long)(epoch - 1) * nbatches + b / o->batch);
      if (cavs_model_step(m, &opt)) lib_die(cavs_model_error(m));
      add_batch(&t, m, &st, k);
      if (interrupted && b + k < n) {
        /* the epoch so far: the shuffling state it began with and how far it got */
        ts.rng = rng_at_start;
        ts.graphs_done = b + k;
        if (tty) printf("\r\033[K");
        if (o->save && cavs_ckpt_save(o->save, m, L.source ? L.source : "", v, &ts, err, sizeof err)) die(1, "%s", err);
        if (o->save)
          fprintf(stderr, "%s: interrupted after %d of the %d graphs of epoch %d; saved to %s (go on with --resume %s)\n",
                  prog, b + k, n, epoch, o->save, o->save);
        else fprintf(stderr, "%s: interrupted in epoch %d; nothing saved (no --save)\n", prog, epoch);
        exit(128 + interrupted);
      }
      double el = now() - start;
      if (tty && (el - shown > 0.1 || b + k >= n)) {
        shown = el;
        double rate = (double)t.graphs / (el > 0 ? el : 1e-9);
        progress(epoch, last_epoch, t.graphs, n, rate, t.batch_loss / t.batches, (double)(n - t.graphs) / (rate > 0 ? rate : 1));
      }
    }
    t.secs = now() - start;
    cavs_backend_stats bs;
    cavs_model_backend_stats(m, &bs, 0);
    if (tty) printf("\r\033[K");
    Totals dv = {0};
    if (dev) evaluate(m, dev, o->batch, &dv);
    /* .best: by dev accuracy over all vertices for a classifier, else by dev loss, or
       what --select names */
    double acc = ratio(dv.correct, dv.count), racc = ratio(dv.root_correct, dv.root_count);
    double dloss = total_loss(&dv), tloss = t.batch_loss / (t.batches ? t.batches : 1);
    double metric = select == SELECT_ROOT ? racc : select == SELECT_ALL ? acc : dloss;
    bool better = dev && (select != SELECT_LOSS ? metric > ts.best : ts.best < 0 || metric < ts.best);
    if (better) ts.best = metric, best_epoch = epoch, since_best = 0;
    else since_best++;
    ts.epoch = epoch;
    ts.since_best = since_best;
    ts.best_epoch = best_epoch;
    if (!o->quiet) {
      printf("epoch %d/%d  train loss %.4f", epoch, last_epoch, tloss);
      if (with_acc) printf(" acc %.4f", ratio(t.correct, t.count));
      if (dev) {
        printf("  dev loss %.4f", dloss);
        if (with_acc) printf(" acc %.4f root %.4f", acc, racc);
        print_losses(stdout, d, &dv);
      }
      printf("  %.1fs  %.0f graphs/s", t.secs, (double)t.graphs / t.secs);
      /* on a GPU, what a minibatch costs in launches (the CPU's are calls: see libcavs(3)) */
      if (!strcmp(cavs_model_backend(m), "cuda")) printf("  %.0f launches/batch", (double)bs.launches / (t.batches ? t.batches : 1));
      printf("%s\n", better && o->save ? "  (best, saved)" : "");
      fflush(stdout);
    }
    if (log) {
      /* null where a value does not exist: no dev set, or no classifier */
      char ta[32] = "null", dl[32] = "null", da[32] = "null", dr[32] = "null";
      if (with_acc) snprintf(ta, sizeof ta, "%.6f", ratio(t.correct, t.count));
      if (dev) snprintf(dl, sizeof dl, "%.6f", dloss);
      if (dev && with_acc) snprintf(da, sizeof da, "%.6f", acc), snprintf(dr, sizeof dr, "%.6f", racc);
      fprintf(log, "{\"epoch\": %d, \"train_loss\": %.6f, \"train_acc\": %s, \"dev_loss\": %s, \"dev_acc\": %s, "
                   "\"dev_root_acc\": %s, ",
              epoch, tloss, ta, dl, da, dr);
      if (dev && dv.nl > 1) {
        fputs("\"dev_losses\": [", log);
        for (int l = 0; l < dv.nl; l++) fprintf(log, "%s%.6f", l ? ", " : "", dv.lcount[l] ? dv.lsum[l] / (double)dv.lcount[l] : 0);
        fputs("], ", log);
      }
      char when[32];
      time_t now_s = time(NULL);
      struct tm tm;
      strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now_s, &tm));
      fprintf(log, "\"lr\": %.6g, \"graphs_per_s\": %.1f, \"seconds\": %.3f, \"time\": \"%s\"}\n", opt.lr,
              (double)t.graphs / t.secs, t.secs, when);
      fflush(log);
    }
    if (o->save) {
      if (cavs_ckpt_save(o->save, m, L.source ? L.source : "", v, &ts, err, sizeof err)) die(1, "%s", err);
      if (better && cavs_ckpt_save(best_path, m, L.source ? L.source : "", v, &ts, err, sizeof err)) die(1, "%s", err);
    }
    if (o->patience && since_best >= o->patience && epoch < last_epoch) {
      if (!o->quiet) {
        printf("stopping after epoch %d: no better dev ", epoch);
        if (best_epoch) printf("%s in %d epochs (best %.4f, epoch %d)\n",
                               select == SELECT_ROOT ? "root accuracy" : select == SELECT_ALL ? "accuracy" : "loss",
                               since_best, ts.best, best_epoch);
        else printf("%s in %d epochs of this run\n",
                    select == SELECT_ROOT ? "root accuracy" : select == SELECT_ALL ? "accuracy" : "loss", since_best);
      }
      break;
    }
    if (interrupted && epoch < last_epoch) {
      fprintf(stderr, "%s: interrupted after epoch %d%s\n", prog, epoch, o->save ? fmt("; saved to %s", o->save) : "");
      exit(128 + interrupted);
    }
  }
  if (log) fclose(log);
  free(order);
  free(gs);
  cavs_model_free(m);
  cavs_dataset_free(tr);
  cavs_dataset_free(dev);
  cavs_vocab_free(v);
  cavs_ckpt_free(ck);
  return 0;
}

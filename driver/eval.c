/* eval.c: the commands that read a checkpoint (eval, predict, info), and what training
 * shares with them: loading a data file, and a pass over data that adds up the losses
 * and accuracies (Totals) and prints them. */
#include "driver.h"
#include "cache.h"

#include <errno.h>
#include <nettle/sha2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- data ---- */

cavs_dataset *load_data(const char *path, const char *format, const cavs_desc *d, const long *dims, cavs_vocab *v,
                        int grow) {
  char err[1024];
  errno = 0;
  cavs_dataset *s = keep(cavs_dataset_load(path, format, d, dims, v, grow, err, sizeof err));
  if (!s) {
    fprintf(stderr, "%s%s\n", rank_tag, err);
    quit(errno == ENOMEM ? 2 : 1);
  }
  return s;
}

/* ---- a streamed file's index, kept in the cache ----
 *
 * Indexing reads the whole file through (a large one: minutes). The index of a file that
 * has not changed since (its device, inode, size, modification and change times), read
 * in the same format for a model with the same inputs and dims, from the same
 * vocabulary, is kept in the cache (CAVS_CACHE/streams, a file named by the SHA-256 of
 * all that: cache_blob_put, whole or not at all) with the vocabulary the indexing left,
 * and read back instead. An entry is checked before anything of it is used: its key,
 * a SHA-256 of its bytes, its words (the vocabulary's in order, then new ones, each
 * once), the index against the file's size and the model's slots (as another rank's
 * index is), and each graph's bytes against their hash as they are read (as always). One
 * that fails a check is indexed again, with a warning; a cache that cannot be used only
 * costs the indexing. */
int streams_cached;

static const char sc_magic[8] = CACHE_STREAMS_MAGIC; /* (cache.h: what pruning checks) */
enum { SC_HEAD = 8 + 2 * SHA256_DIGEST_SIZE + 16 };

static void sc_field(struct sha256_ctx *c, const void *p, size_t n) {
  uint64_t len = n; /* (length first: no two lists of fields hash the same bytes) */
  sha256_update(c, sizeof len, (const uint8_t *)&len);
  sha256_update(c, n, p);
}

static void sc_key(const struct stat *sb, const char *format, const cavs_desc *d, const long *dims,
                   const cavs_vocab *v, int grow, uint8_t key[SHA256_DIGEST_SIZE]) {
  struct sha256_ctx c;
  sha256_init(&c);
  sc_field(&c, "cavs stream index 1", 19);
  long long id[7] = {(long long)sb->st_dev, (long long)sb->st_ino, (long long)sb->st_size,
                     (long long)sb->st_mtim.tv_sec, (long long)sb->st_mtim.tv_nsec, (long long)sb->st_ctim.tv_sec,
                     (long long)sb->st_ctim.tv_nsec};
  sc_field(&c, id, sizeof id);
  sc_field(&c, format, strlen(format));
  int shape[5] = {grow, d->ninputs, d->nint, d->nreal, dims != NULL};
  sc_field(&c, shape, sizeof shape);
  for (int i = 0; i < d->ninputs; i++) {
    int in[2] = {d->inputs[i].kind, d->inputs[i].slot};
    sc_field(&c, d->inputs[i].name, strlen(d->inputs[i].name));
    sc_field(&c, in, sizeof in);
  }
  if (dims) sc_field(&c, dims, sizeof(long) * (size_t)d->ndims);
  for (int i = 0; i < cavs_vocab_size(v); i++) sc_field(&c, cavs_vocab_word(v, i), strlen(cavs_vocab_word(v, i)));
  sha256_digest(&c, SHA256_DIGEST_SIZE, key);
}

/* The stream of an entry, its words added to v; NULL with err saying why (v untouched) */
static cavs_stream *sc_open(const unsigned char *b, size_t n, const uint8_t *key, const char *path, const char *format,
                            const cavs_desc *d, const long *dims, cavs_vocab *v, int grow, char *err, size_t errlen) {
  uint8_t sum[SHA256_DIGEST_SIZE];
  uint64_t nw, ni;
  if (n < SC_HEAD || memcmp(b, sc_magic, 8) || memcmp(b + 8, key, SHA256_DIGEST_SIZE)) {
    snprintf(err, errlen, "not an index of this file");
    return NULL;
  }
  struct sha256_ctx c;
  sha256_init(&c);
  sha256_update(&c, n - (8 + 2 * SHA256_DIGEST_SIZE), b + 8 + 2 * SHA256_DIGEST_SIZE);
  sha256_digest(&c, SHA256_DIGEST_SIZE, sum);
  memcpy(&nw, b + 8 + 2 * SHA256_DIGEST_SIZE, 8), memcpy(&ni, b + SC_HEAD - 8, 8);
  if (memcmp(sum, b + 8 + SHA256_DIGEST_SIZE, SHA256_DIGEST_SIZE) || nw > n - SC_HEAD || ni != n - SC_HEAD - nw ||
      (nw && b[SC_HEAD + nw - 1] != 0)) {
    snprintf(err, errlen, "damaged (its bytes are not what was written)");
    return NULL;
  }
  /* the words: this vocabulary's, in order, then the indexing's new ones, each once */
  const char *w = (const char *)b + SC_HEAD;
  int have = cavs_vocab_size(v), count = 0;
  cavs_vocab *fresh = cavs_vocab_new(); /* (the new words, after its own first ones) */
  bool ok = fresh != NULL;
  int base = ok ? cavs_vocab_size(fresh) : 0;
  for (size_t at = 0; ok && at < nw; count++) {
    size_t len = strlen(w + at);
    if (count < have) ok = !strcmp(w + at, cavs_vocab_word(v, count));
    else { /* (a word not in v: its lookup gives <unk>'s id, 0) */
      int id = cavs_vocab_id(v, w + at, len, 0);
      bool in_v = id >= 0 && !strcmp(cavs_vocab_word(v, id), w + at);
      ok = grow && len && !in_v && cavs_vocab_id(fresh, w + at, len, 1) == base + count - have;
    }
    at += len + 1;
  }
  cavs_vocab_free(fresh);
  if (!ok || count < have) {
    snprintf(err, errlen, "its vocabulary is not this one's");
    return NULL;
  }
  cavs_stream *st = cavs_stream_open_index(path, format, d, dims, v, w + nw, (size_t)ni, err, errlen);
  for (size_t at = 0, i = 0; st && at < nw; i++) {
    size_t len = strlen(w + at);
    if ((int)i >= have) cavs_vocab_id(v, w + at, len, 1); /* (checked above: it adds, as the next id) */
    at += len + 1;
  }
  return st;
}

/* the entry of a stream just indexed: the vocabulary's words and the index */
static void sc_put(const cavs_stream *st, const cavs_vocab *v, const uint8_t *key, const char *name) {
  uint64_t nw = 0, ni = cavs_stream_index(st, NULL, 0);
  for (int i = 0; i < cavs_vocab_size(v); i++) nw += strlen(cavs_vocab_word(v, i)) + 1;
  unsigned char *b = malloc(SC_HEAD + nw + ni);
  if (!b) return; /* (no entry: the next run indexes again) */
  memcpy(b, sc_magic, 8), memcpy(b + 8, key, SHA256_DIGEST_SIZE);
  memcpy(b + 8 + 2 * SHA256_DIGEST_SIZE, &nw, 8), memcpy(b + SC_HEAD - 8, &ni, 8);
  char *w = (char *)b + SC_HEAD;
  for (int i = 0; i < cavs_vocab_size(v); i++) w = stpcpy(w, cavs_vocab_word(v, i)) + 1;
  cavs_stream_index(st, b + SC_HEAD + nw, ni);
  struct sha256_ctx c;
  sha256_init(&c);
  sha256_update(&c, 16 + nw + ni, b + 8 + 2 * SHA256_DIGEST_SIZE);
  sha256_digest(&c, SHA256_DIGEST_SIZE, b + 8 + SHA256_DIGEST_SIZE);
  char err[1024];
  if (cache_blob_put("streams", name, b, SC_HEAD + nw + ni, err, sizeof err))
    fprintf(stderr, "%s%s: warning: the index of a streamed file not kept: %s\n", rank_tag, prog, err);
  free(b);
}

cavs_stream *stream_data(const char *path, const char *format, const cavs_desc *d, const long *dims, cavs_vocab *v,
                         int grow) {
  char err[1024], name[2 * SHA256_DIGEST_SIZE + 1];
  uint8_t key[SHA256_DIGEST_SIZE];
  struct stat sb;
  bool cached = !stat(path, &sb) && S_ISREG(sb.st_mode);
  if (cached) {
    sc_key(&sb, format, d, dims, v, grow, key);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(name + 2 * i, 3, "%02x", key[i]);
    /* (an entry is at most the words, each from the file or the vocabulary, and 24
       bytes a graph of at least one byte: 25 times the file, and room for the rest) */
    size_t vb = 0, n = 0;
    for (int i = 0; i < cavs_vocab_size(v); i++) vb += strlen(cavs_vocab_word(v, i)) + 1;
    size_t max = (size_t)sb.st_size > (SIZE_MAX - vb - 65536) / 26 ? SIZE_MAX : 26 * (size_t)sb.st_size + vb + 65536;
    unsigned char *b = cache_blob_get("streams", name, max, &n, err, sizeof err);
    cavs_stream *st = NULL;
    errno = 0;
    if (b && !(st = sc_open(b, n, key, path, format, d, dims, v, grow, err, sizeof err)))
      fprintf(stderr, "%s%s: warning: the cached index of '%s' is not usable (%s); indexing it again\n", rank_tag, prog,
              path, err);
    else if (!b && *err)
      fprintf(stderr, "%s%s: warning: %s; indexing '%s' without the cache\n", rank_tag, prog, err, path);
    cached = b || !*err; /* (an unsafe cache: not written to either) */
    free(b);
    if (st) {
      streams_cached++;
      return st;
    }
  }
  errno = 0;
  cavs_stream *st = cavs_stream_open(path, format, d, dims, v, grow, err, sizeof err);
  if (!st) {
    fprintf(stderr, "%s%s\n", rank_tag, err);
    quit(errno == ENOMEM ? 2 : 1);
  }
  if (cached) sc_put(st, v, key, name);
  return st;
}

Data open_data(const char *path, const char *format, const cavs_desc *d, const long *dims, cavs_vocab *v, bool stream) {
  Data s = {0};
  if (stream) s.st = stream_data(path, format, d, dims, v, 0);
  else s.set = load_data(path, format, d, dims, v, 0);
  return s;
}
void close_data(Data *s) {
  cavs_dataset_free(s->set);
  cavs_stream_close(s->st);
  s->set = NULL, s->st = NULL;
}
int data_count(const Data *s) { return s->st ? cavs_stream_count(s->st) : cavs_dataset_count(s->set); }
long data_vertices(const Data *s) { return s->st ? cavs_stream_vertices(s->st) : cavs_dataset_vertices(s->set); }
int data_graph_vertices(const Data *s, int i) {
  return s->st ? cavs_stream_graph_vertices(s->st, i) : cavs_dataset_graph(s->set, i)->n;
}
long data_max_feature(const Data *s, int slot) {
  return s->st ? cavs_stream_max_feature(s->st, slot) : cavs_dataset_max_feature(s->set, slot);
}
cavs_dataset *data_batch(Data *s, const int *which, int k, const cavs_graph **gs) {
  if (!s->st) {
    for (int i = 0; i < k; i++) gs[i] = cavs_dataset_graph(s->set, which[i]);
    return NULL;
  }
  char err[1024];
  errno = 0;
  cavs_dataset *part = cavs_stream_read(s->st, which, k, err, sizeof err);
  if (!part) die(errno == ENOMEM ? 2 : 1, "%s", err);
  for (int i = 0; i < k; i++) gs[i] = cavs_dataset_graph(part, i);
  return part;
}

/* A width or range of the descriptor in a model's dims. */
long model_lin(const cavs_model *m, cavs_lin l) {
  const cavs_desc *d = cavs_model_desc(m);
  long w = l.k;
  for (int j = 0; j < d->ndims; j++) w += (long)l.c[j] * cavs_model_dim(m, j);
  return w;
}

/* ---- a pass over data, added up ---- */

void add_sums(Totals *t, const cavs_stats *st, const cavs_loss_acc *a, int n, int k) {
  t->batch_loss += st->loss;
  t->batches++;
  t->count += st->count;
  t->correct += st->correct;
  t->root_count += st->root_count;
  t->root_correct += st->root_correct;
  t->graphs += k;
  t->nl = n < MAX_LOSSES ? n : MAX_LOSSES;
  for (int l = 0; l < t->nl; l++) {
    t->lsum[l] += a[l].sum;
    t->lcount[l] += a[l].count;
    t->lcorrect[l] += a[l].correct;
  }
}

void add_batch(Totals *t, const cavs_model *m, const cavs_stats *st, int k) {
  int n;
  const cavs_loss_acc *a = cavs_model_losses(m, &n);
  add_sums(t, st, a, n, k);
}

/* A NaN is printed without a sign: glibc writes "-nan" for the NaN an overflowing sum
   (inf - inf) leaves, which says nothing more than "nan". */
double unsigned_nan(double x) { return isnan(x) ? fabs(x) : x; }

double mean_loss(const Totals *t, int l) { return unsigned_nan(t->lcount[l] ? t->lsum[l] / (double)t->lcount[l] : 0); }

/* Over a whole dataset: each loss's mean over its rows, summed as a minibatch's is. */
double total_loss(const Totals *t) {
  double s = 0;
  for (int l = 0; l < t->nl; l++) s += mean_loss(t, l);
  return unsigned_nan(s);
}

double ratio(long a, long b) { return b ? (double)a / (double)b : 0; }

bool has_accuracy(const cavs_desc *d) {
  for (int l = 0; l < d->nlosses; l++)
    if (d->losses[l].kind == 0) return true;
  return false;
}

/* " (softmax_xent 0.4312 acc 0.8123, mse 0.0200)" for a model with several losses. */
void print_losses(FILE *f, const cavs_desc *d, const Totals *t) {
  if (t->nl < 2) return;
  fputs(" (", f);
  for (int l = 0; l < t->nl; l++) {
    bool xent = d->losses[l].kind == 0;
    fprintf(f, "%s%s %.4f", l ? ", " : "", xent ? "softmax_xent" : "mse", mean_loss(t, l));
    if (xent) fprintf(f, " acc %.4f", ratio(t->lcorrect[l], t->lcount[l]));
  }
  fputc(')', f);
}

/* The first softmax_xent loss's label input, or -1. */
static int first_xent_input(const cavs_desc *d) {
  for (int l = 0; l < d->nlosses; l++)
    if (d->losses[l].kind == CAVS_LOSS_SOFTMAX_XENT) return d->losses[l].input;
  return -1;
}

/* The minibatch of s's graphs from b on (batch of them, or what is left) into gs, run
   forward: how many. */
static int forward_batch(cavs_model *m, const cavs_dataset *s, int b, int batch, const cavs_graph **gs, cavs_stats *st) {
  int n = cavs_dataset_count(s), k = 0;
  for (; k < batch && b + k < n; k++) gs[k] = cavs_dataset_graph(s, b + k);
  errno = 0;
  if (cavs_model_forward(m, gs, k, st)) lib_die(cavs_model_error(m));
  return k;
}

bool carry_on(cavs_model *m, bool carry) {
  errno = 0;
  if (carry && cavs_model_carry_state(m, 1)) {
    if (bptt_state == BPTT_CARRY) lib_die(cavs_model_error(m));
    carry = false; /* a model that cannot (several states): each chunk from zeros */
  }
  if (carry) cavs_model_reset_state(m);
  return carry;
}

void evaluate_order(cavs_model *m, Data *s, const int *order, int n, int batch, bool carry, int passes, Totals *t) {
  Scores *scores = t->scores;
  memset(t, 0, sizeof *t);
  t->scores = scores;
  const cavs_graph **gs = xmalloc(sizeof(cavs_graph *) * (size_t)batch);
  carry = carry_on(m, carry);
  double start = now();
  cavs_model_set_inference(m, 1); /* no backward pass follows these */
  for (int b = 0; b < n; b += batch) {
    cavs_stats st;
    int k = b + batch <= n ? batch : n - b;
    cavs_dataset *part = data_batch(s, order + b, k, gs);
    errno = 0;
    if (cavs_model_forward(m, gs, k, &st)) lib_die(cavs_model_error(m));
    add_batch(t, m, &st, k);
    if (t->scores) scores_add(t->scores, m, gs, k);
    cavs_dataset_free(part);
    passes--;
  }
  /* passes every process makes (expert parallelism: each pass answers the others'
     rounds), on the first graph, counted for nothing */
  if (passes > 0 && carry) cavs_model_reset_state(m);
  for (; passes > 0 && data_count(s) > 0; passes--) {
    cavs_stats st;
    cavs_dataset *part = data_batch(s, (const int[]){0}, 1, gs);
    errno = 0;
    if (cavs_model_forward(m, gs, 1, &st)) lib_die(cavs_model_error(m));
    cavs_dataset_free(part);
  }
  cavs_model_set_inference(m, 0);
  if (carry) cavs_model_reset_state(m);
  t->secs = now() - start;
  free(gs);
}

int *eval_order(int n, int batch, bool carry) {
  if (carry) return stream_order(n, batch);
  int *order = xmalloc(sizeof(int) * (size_t)(n ? n : 1));
  for (int i = 0; i < n; i++) order[i] = i;
  return order;
}

void evaluate(cavs_model *m, Data *s, int batch, bool carry, Totals *t) {
  /* carried: the data as `batch` streams, each from zeros, its state carried from chunk
     to chunk (what training left is forgotten before, and what this leaves after) */
  int n = data_count(s), *order = eval_order(n, batch, carry);
  evaluate_order(m, s, order, n, batch, carry, 0, t);
  free(order);
}

/* ---- eval, predict, info ---- */

/* The model comes from the checkpoint's own source, or from --model (required for a
 * checkpoint trained from a prebuilt .so); cavs_ckpt_apply_weights checks that they
 * match. Only the weights: evaluation has no optimizer state to hold and nothing to
 * freeze (a checkpoint of a --no-merge build with a frozen parameter evaluates on the
 * default build). */
CkptModel open_ckpt(const char *path, const char *model) {
  CkptModel c = {0};
  char err[1024];
  errno = 0;
  c.ck = keep(cavs_ckpt_read(path, err, sizeof err));
  if (!c.ck) die(errno == ENOMEM ? 2 : 1, "%s", err);
  if (model) c.L = load_model_arg(model);
  else if (!*cavs_ckpt_source(c.ck))
    die(1, "%s: the checkpoint was trained from a built model library; name it with --model MODEL.so", path);
  else c.L = load_from_ckpt(c.ck, path);
  long dims[CAVS_MAX_DIMS] = {0};
  if (cavs_ckpt_dims(c.ck, c.L.desc, dims, err, sizeof err)) die(1, "%s: %s", path, err);
  errno = 0;
  c.m = keep(cavs_model_new_opts(c.L.desc, dims, &model_opts, err, sizeof err));
  if (!c.m) die(errno == ENOMEM ? 2 : 1, "%s: %s", path, err);
  cavs_model_set_policy(c.m, model_policy);
  cavs_model_set_ablations(c.m, model_ablations);
  errno = 0; /* (the device failing, or memory running out, while applying: exit 2) */
  if (cavs_ckpt_apply_weights(c.ck, c.m, err, sizeof err)) die(errno == ENOMEM || errno == EIO ? 2 : 1, "%s: %s", path, err);
  c.v = ckpt_vocab(c.ck, path);
  return c;
}

/* What eval reports of one pass: the totals, the first softmax_xent loss's mean (-1:
 * none), and the accuracies: the runtime's, or with --binary the binary setting's. */
typedef struct Report {
  const cavs_desc *d;
  Totals t;
  double xent;
  long correct, count, root_correct, root_count;
} Report;

/* eval --json: one object on one line (jansson) */
static void print_eval_json(const Report *r) {
  const Totals *t = &r->t;
  json_t *o = json_object();
  json_set(o, "graphs", json_integer(t->graphs));
  json_set(o, "loss", json_num(total_loss(t)));
  if (r->xent >= 0) json_set(o, "perplexity", json_num(exp(r->xent)));
  if (has_accuracy(r->d)) {
    json_set(o, "accuracy", json_num(ratio(r->correct, r->count)));
    json_set(o, "vertices", json_integer(r->count));
    json_set(o, "root_accuracy", json_num(ratio(r->root_correct, r->root_count)));
    json_set(o, "roots", json_integer(r->root_count));
    if (t->scores) scores_json(o, t->scores);
  }
  if (t->nl > 1) {
    json_t *losses = json_array();
    for (int l = 0; l < t->nl; l++) json_push(losses, json_num(mean_loss(t, l)));
    json_set(o, "losses", losses);
  }
  json_set(o, "graphs_per_s", json_num((double)t->graphs / t->secs));
  json_write_line(o, stdout, "the standard output");
}

static void print_eval_text(const Report *r, const char *format) {
  const Totals *t = &r->t;
  printf("graphs %ld  loss %.4f", t->graphs, total_loss(t));
  print_losses(stdout, r->d, t);
  if (r->xent >= 0 && lm_format(format)) printf("  perplexity %.2f", exp(r->xent));
  bool binary = t->scores && t->scores->binary;
  if (has_accuracy(r->d))
    printf("  %saccuracy %.4f (all %ld %svertices)  root accuracy %.4f (%ld %sroots)", binary ? "binary " : "",
           ratio(r->correct, r->count), r->count, binary ? "non-neutral " : "", ratio(r->root_correct, r->root_count),
           r->root_count, binary ? "non-neutral " : "");
  printf("  %.0f graphs/s\n", (double)t->graphs / t->secs);
  if (has_accuracy(r->d) && t->scores) scores_print(stdout, t->scores);
}

/* cavs eval: one pass over the data, counted by class where the model classifies */
static void run_eval(const CkptModel *c, Data *s, int batch, const char *format, const EvalOpts *eo) {
  Report r = {.d = c->L.desc, .xent = -1};
  const cavs_desc *d = r.d;
  int in = first_xent_input(d);
  /* a class input's range: its width in the model's dims */
  long classes = in >= 0 ? model_lin(c->m, d->inputs[in].width) : 0;
  if (eo->binary && classes != 5)
    die(1, "--binary: SST's binary setting merges five classes, 0-4; model '%s' %s", d->name,
        in < 0 ? "has no softmax_xent loss" : fmt("has %ld", classes));
  if (classes > 0 && classes <= 100000) r.t.scores = scores_new((int)classes, d->inputs[in].slot, eo->binary);
  evaluate(c->m, s, batch, carries(format), &r.t);
  /* the first softmax_xent loss's mean, as a perplexity (a language model's measure) */
  for (int l = 0; l < r.t.nl && r.xent < 0; l++)
    if (d->losses[l].kind == CAVS_LOSS_SOFTMAX_XENT) r.xent = mean_loss(&r.t, l);
  r.correct = r.t.correct, r.count = r.t.count, r.root_correct = r.t.root_correct, r.root_count = r.t.root_count;
  if (eo->binary) {
    const Scores *sc = r.t.scores;
    r.correct = scores_correct(&sc->all), r.count = sc->all.total;
    r.root_correct = scores_correct(&sc->roots), r.root_count = sc->roots.total;
  }
  if (eo->json) print_eval_json(&r);
  else print_eval_text(&r, format);
}

/* predict --value NAME: cavs_model_vertex_value in the shape of the other vectors */
static const char *value_name;
static long named_value(cavs_model *m, int g, int v, double *out, long n) {
  return cavs_model_vertex_value(m, g, v, value_name, out, n);
}

typedef long (*VertexGet)(cavs_model *, int, int, double *, long);

/* Graph g's numbers (number b in the file): the root's a line, or with all_nodes every
   vertex's as "GRAPH VERTEX x1 ... xn"; *vec (*width numbers) grows as needed. */
static void print_vectors(cavs_model *m, VertexGet get, const cavs_graph *gr, int g, int b, bool all_nodes, double **vec,
                          long *width) {
  for (int v = all_nodes ? 0 : -1; v < gr->n; v++) {
    int at = v;
    if (v < 0) {
      at = gr->n - 1;
      while (at > 0 && get(m, g, at, NULL, 0) < 0) at--;
    }
    long w = get(m, g, at, NULL, 0);
    if (w > *width) {
      free(*vec);
      *vec = xmalloc(sizeof **vec * (size_t)w);
      *width = w;
    }
    if (w > 0 && get(m, g, at, *vec, w) < 0) lib_die(cavs_model_error(m));
    if (all_nodes) printf("%d %d", b + g, v);
    for (long j = 0; j < w; j++) printf(j || all_nodes ? " %.6g" : "%.6g", (*vec)[j]);
    printf("\n");
    if (v < 0) break;
  }
}

/* cavs predict: a line a graph (or a vertex), of classes or, with vectors, probs or a
   value name, of numbers: what each vertex pushed, its class probabilities, a value */
static void run_predict(cavs_model *m, const cavs_dataset *s, int batch, bool all_nodes, bool vectors, bool probs,
                        const char *value) {
  int n = cavs_dataset_count(s);
  const cavs_graph **gs = xmalloc(sizeof *gs * (size_t)batch);
  long width = 0;
  double *vec = NULL;
  value_name = value;
  VertexGet get = value ? named_value : probs ? cavs_model_vertex_probs : cavs_model_vertex_output;
  /* inference keeps no gates for a backward pass: --value may ask for one */
  cavs_model_set_inference(m, value == NULL);
  for (int b = 0; b < n; b += batch) {
    cavs_stats st;
    int k = forward_batch(m, s, b, batch, gs, &st);
    /* a name the model does not store anywhere: said once, not a line of nothing a graph */
    if (value && b == 0 && k > 0) {
      bool any = false;
      for (int v = 0; v < gs[0]->n && !any; v++) any = get(m, 0, v, NULL, 0) >= 0;
      if (!any) lib_die(cavs_model_error(m));
    }
    for (int g = 0; g < k && (vectors || probs || value); g++) print_vectors(m, get, gs[g], g, b, all_nodes, &vec, &width);
    for (int g = 0; g < k && !vectors && !probs && !value; g++) {
      if (!all_nodes) {
        printf("%d\n", cavs_model_root_class(m, g));
        continue;
      }
      /* every vertex's class, in the graph's own vertex order */
      for (int v = 0; v < gs[g]->n; v++) printf("%s%d", v ? " " : "", cavs_model_vertex_class(m, g, v));
      printf("\n");
    }
  }
  free(gs);
  free(vec);
}

int cmd_eval(const char *ckpt, const char *model, const char *data, const char *format, int batch, bool predict,
             bool all_nodes, const EvalOpts *eo, bool vectors, bool probs, const char *value, const GreedyOpts *greedy) {
  if (!ckpt || !data) die(1, "%s: usage: cavs %s CKPT --data FILE", predict ? "predict" : "eval", predict ? "predict" : "eval");
  CkptModel c = open_ckpt(ckpt, model);
  if (!format) format = cavs_ckpt_state(c.ck)->format;
  bptt_as_saved(cavs_ckpt_state(c.ck));
  long dims[CAVS_MAX_DIMS] = {0};
  for (int i = 0; i < c.L.desc->ndims; i++) dims[i] = cavs_model_dim(c.m, i);
  if (eo->stream && predict) die(1, "--stream: for train and eval (predict reads its data whole)");
  Data s = open_data(data, format, c.L.desc, dims, c.v, eo->stream);
  /* a prediction's standard output is its data, and so is a JSON evaluation's */
  say_device(predict || eo->json ? stderr : stdout, c.m);
  if (greedy) {
    greedy_decode(c.m, s.set, batch, greedy);
  } else if (!predict) {
    run_eval(&c, &s, batch, format, eo);
  } else {
    run_predict(c.m, s.set, batch, all_nodes, vectors, probs, value);
  }
  close_data(&s);
  return 0;
}

/* cavs info: the cosine's and the plateau's settings, and where the plateau is */
static void info_schedule(const cavs_train_state *ts) {
  if (ts->schedule == CAVS_SCHED_COSINE)
    printf("lr schedule cosine to %g over %d epochs\n", ts->lr_min, ts->cosine_epochs);
  if (ts->schedule != CAVS_SCHED_PLATEAU) return;
  printf("lr schedule plateau: factor %g, patience %d, floor %g; now lr %g", ts->plateau_factor, ts->plateau_patience,
         ts->lr_min, sched_lr(ts, ts->epoch + 1));
  if (ts->plateau_best >= 0) printf(", best %.4f, %d epochs since it or the last cut", ts->plateau_best, ts->plateau_bad);
  printf("\n");
}

int cmd_info(const char *path) {
  if (!path) die(1, "info: usage: cavs info CKPT");
  char err[1024];
  errno = 0;
  cavs_ckpt *k = keep(cavs_ckpt_read(path, err, sizeof err));
  if (!k) die(errno == ENOMEM ? 2 : 1, "%s", err);
  const cavs_train_state *ts = cavs_ckpt_state(k);
  cavs_vocab *v = keep(cavs_ckpt_vocab(k)); /* (a damaged one: 0 words) */
  if (!v && errno == ENOMEM) die(2, "out of memory reading '%s'", path);
  printf("checkpoint  %s\nmodel       %s (source hash %s, %s)\n", path, cavs_ckpt_model(k), cavs_ckpt_hash(k),
         cavs_ckpt_precision(k) == CAVS_DOUBLE ? "double" : "float");
  printf("dims       ");
  for (int i = 0; i < cavs_ckpt_ndims(k); i++) printf(" %s=%ld", cavs_ckpt_dim_name(k, i), cavs_ckpt_dim_value(k, i));
  printf("\nparameters  %ld\nvocabulary  %d words\n", cavs_ckpt_param_count(k), v ? cavs_vocab_size(v) : 0);
  if (ts->graphs_done) printf("saved %ld graphs into epoch %d (interrupted, or --save-every)\n", ts->graphs_done, ts->epoch + 1);
  printf("training    %d epoch%s done, data format %s, batch %d, optimizer %s lr %g", ts->epoch,
         ts->epoch == 1 ? "" : "s", ts->format, ts->batch, cavs_optim_name(ts->optim.kind), ts->optim.lr);
  if (ts->optim.kind == CAVS_MOMENTUM || ts->optim.kind == CAVS_NESTEROV)
    printf(" momentum %g", ts->optim.momentum ? ts->optim.momentum : 0.9);
  if (ts->optim.weight_decay) printf(" weight decay %g", ts->optim.weight_decay);
  if (ts->optim.clip) printf(" clip %g", ts->optim.clip);
  printf(", seed %llu\n", (unsigned long long)ts->seed);
  long steps;
  int nm = cavs_ckpt_moments(k, &steps);
  printf("optimizer   %ld step%s, state %s", steps, steps == 1 ? "" : "s",
         nm ? (nm == 1 ? "one block of moments" : "two blocks of moments") : "none");
  if (nm) printf(" (%ld values each)", cavs_ckpt_param_count(k));
  printf("\n");
  static const char *const metric[] = {"the metric --select chose", "accuracy", "root accuracy", "loss"};
  if (ts->best >= 0) {
    printf("best dev    %.4f (%s", ts->best, metric[ts->select >= 0 && ts->select <= 3 ? ts->select : 0]);
    if (ts->best_epoch) printf(", epoch %d, %d epochs since", ts->best_epoch, ts->since_best);
    printf(")\n");
  }
  if (ts->lr_decay > 0 || ts->warmup || ts->patience) {
    int step = ts->lr_step ? ts->lr_step : 1;
    printf("schedule    lr decay %g every %d epochs", ts->lr_decay, step);
    if (ts->lr_decay_start && ts->lr_decay_start != step) printf(" after epoch %d", ts->lr_decay_start);
    printf(", warm-up %d minibatches, patience %d\n", ts->warmup, ts->patience);
  }
  info_schedule(ts);
  if (ts->bptt_vary > 0)
    printf("chunks      cut afresh each epoch, lengths drawn with deviation %g (--bptt-vary)\n", ts->bptt_vary);
  else if (ts->bptt_state == CAVS_BPTT_RESET)
    printf("chunks      shuffled, each from zeros (--bptt-state reset): cavs eval reads them so\n");
  long cw;
  int crows = cavs_ckpt_carried(k, &cw);
  if (crows) printf("carried     the state of %d streams, %ld values each (a resume goes on from it)\n", crows, cw);
  /* (its text is the file's: its size said, not its bytes, which may hold a terminal's
     escapes) */
  if (cavs_ckpt_record(k) && ts->graphs_done)
    printf("totals      %zu bytes: epoch %d's so far, for the resumed run's line and --log record\n",
           strlen(cavs_ckpt_record(k)), ts->epoch + 1);
  else if (cavs_ckpt_record(k))
    printf("log record  %zu bytes: the --log line of epoch %d, for a resumed run's log that lacks it\n",
           strlen(cavs_ckpt_record(k)), ts->epoch);
  if (cavs_ckpt_noptions(k)) {
    printf("options    ");
    for (int i = 0; i < cavs_ckpt_noptions(k); i++) {
      double val = 0;
      const char *name = cavs_ckpt_option(k, i, &val);
      printf(" %s=%g", name, val);
    }
    printf("\n");
  }
  cavs_vocab_free(v);
  cavs_ckpt_free(k);
  return 0;
}

/* dist.c: cavs train over MPI (see dist.h). Every collective here is called by every
 * rank in the same order, from the same point of the same step: the ranks hold the same
 * parameters, options and data, so they take the same branches; what could differ
 * (the model, the options, the data) is compared before training (train.c), and the
 * parameters every few hundred steps. */
#include "dist.h"

#include "driver.h"

#include <stdlib.h>
#include <string.h>

#ifdef CAVS_MPI
#include <mpi.h>
#endif

int dist_rank, dist_size = 1;
DistStats dist_stats;
bool dist_overlap = false;
bool dist_expert_parallel = false, dist_expert_replicas = true;

uint64_t dist_hash(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  if (!b) return 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* the number of processes a launcher started, from its environment (Open MPI's mpirun,
   or a PMI launcher: MPICH's, Slurm's), or 0 outside one */
static long launched(void) {
  const char *e = getenv("OMPI_COMM_WORLD_SIZE");
  if (!e) e = getenv("PMI_SIZE");
  return e ? strtol(e, NULL, 10) : 0;
}

void dist_part(const cavs_graph *const *gs, int k, int *lo, int *hi, long *before) {
  long total = 0;
  for (int i = 0; i < k; i++) total += gs[i]->n;
  /* rank q's part starts at the first graph whose vertices before it reach q/N of
     the whole; a graph is kept whole, and where there are graphs enough each part
     gets one (at least one left for each later rank) */
  int start[2] = {0, k};
  for (int e = 0; e < 2; e++) {
    int q = dist_rank + e;
    if (q == 0 || q == dist_size) {
      start[e] = q == 0 ? 0 : k;
      continue;
    }
    long prefix = 0;
    int i = 0;
    while (i < k && prefix * dist_size < (long)q * total) prefix += gs[i++]->n;
    if (k >= dist_size) {
      if (i < q) i = q;
      if (i > k - (dist_size - q)) i = k - (dist_size - q);
    }
    start[e] = i;
  }
  /* a part's bounds are computed alone, so they must agree with the neighbours': they
     do, as rank q's end is computed as rank q+1's start */
  *lo = start[0], *hi = start[1] > start[0] ? start[1] : start[0];
  *before = 0;
  for (int i = 0; i < *lo; i++) *before += gs[i]->n;
}

#ifndef CAVS_MPI

void dist_start(void) {
  if (launched() > 1)
    die(1, "this cavs is built without MPI (configure --enable-mpi, with Open MPI installed): it cannot train "
           "as one of %ld processes",
        launched());
}
void dist_end(void) {}
void dist_release(void) {}
void dist_sum_long(long *v, int n) { (void)v, (void)n; }
void dist_sum_double(double *v, int n) { (void)v, (void)n; }
void dist_same(uint64_t v, const char *what) { (void)v, (void)what; }
void dist_die_all(int status, const char *what) { die(status, "%s", what); }
void dist_backward_begin(cavs_model *m, size_t es, bool mine) { (void)m, (void)es, (void)mine; }
int dist_reduce_grads(cavs_model *m, size_t es) {
  (void)m, (void)es;
  return 0;
}
void *dist_share(void *buf, size_t *n) {
  (void)n;
  return buf;
}
void dist_experts(cavs_model *m, bool on) { (void)m, (void)on; }

void *dist_gather(const void *mine, size_t n, size_t *total) {
  void *all = malloc(n ? n : 1);
  if (!all) die(2, "out of memory");
  if (n) memcpy(all, mine, n);
  *total = n;
  return all;
}

#else

static bool started;
static MPI_Comm ep_world; /* (expert parallelism's, below, once ep_made) */
static bool ep_made;
static int *ep_counts;
/* the dense gradients' buffer, kept from step to step (a block of megabytes allocated a
   step would be mapped and faulted in a step) */
static char *pack;
static size_t cappack;
/* ...and the table rows' two, this rank's and every rank's; all three from
   cavs_host_alloc (pinned on the cuda backend, whose copies to and from them then run
   at the bus's rate) of the model they were made for */
static char *rows_mine, *rows_all;
static size_t cap_mine, cap_all;
/* ...and the buckets' (below) */
static char *bpack;
static size_t capb;
static cavs_model *host_of;

/* *p holding at least n bytes of m's host memory, kept from step to step */
static char *host_grow(cavs_model *m, char **p, size_t *cap, size_t n) {
  if (n <= *cap && host_of == m) return *p;
  if (*p) cavs_host_free(host_of, *p);
  *p = NULL, *cap = 0;
  host_of = m;
  if (!(*p = cavs_host_alloc(m, n))) die(2, "out of memory (%zu bytes of host memory for the gradients)", n);
  *cap = n;
  return *p;
}
static const char *prog_of_all = "cavs"; /* the message prefix of what every rank says */

static void abort_all(int status) {
  if (started && dist_size > 1) {
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
  }
}

/* an MPI call that failed (the communicator returns errors instead of aborting, so
   that the message is ours) */
static void check(int rc, const char *what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  die(1, "%s: %.*s", what, len, msg);
}

static void buckets_free(void);

void dist_release(void) {
  if (host_of) {
    cavs_host_free(host_of, pack), cavs_host_free(host_of, rows_mine), cavs_host_free(host_of, rows_all);
    cavs_host_free(host_of, bpack);
  }
  pack = rows_mine = rows_all = bpack = NULL, cappack = cap_mine = cap_all = capb = 0;
  host_of = NULL;
  buckets_free();
}

void dist_start(void) {
  if (!launched()) return;
  int rc = MPI_Init(NULL, NULL);
  if (rc != MPI_SUCCESS) die(1, "MPI_Init failed (%d)", rc);
  started = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check(MPI_Comm_rank(MPI_COMM_WORLD, &dist_rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &dist_size), "MPI_Comm_size");
  prog_of_all = prog;
  if (dist_size > 1) {
    prog = xstrdup(fmt("%s: rank %d", prog, dist_rank));
    rank_tag = xstrdup(fmt("%s: ", prog));
  }
  die_hook = abort_all;
}

void dist_end(void) {
  dist_release();
  if (!started) return;
  if (ep_made) MPI_Comm_free(&ep_world);
  ep_made = false;
  free(ep_counts), ep_counts = NULL;
  die_hook = NULL;
  MPI_Finalize();
  started = false;
}

void dist_sum_long(long *v, int n) {
  if (dist_size == 1 || n <= 0) return;
  check(MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_LONG, MPI_SUM, MPI_COMM_WORLD), "summing counts over the ranks");
}

void dist_sum_double(double *v, int n) {
  if (dist_size == 1 || n <= 0) return;
  check(MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "summing over the ranks");
}

void *dist_gather(const void *mine, size_t n, size_t *total) {
  int N = dist_size;
  if (n > INT32_MAX) die(1, "%zu bytes are too many for one gather", n);
  int len = (int)n, *counts = malloc(sizeof(int) * (size_t)N), *displ = malloc(sizeof(int) * (size_t)N);
  if (!counts || !displ) die(2, "out of memory");
  check(MPI_Gather(&len, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD), "gathering the sizes of the parts");
  long sum = 0;
  for (int q = 0; !dist_rank && q < N; q++) {
    displ[q] = (int)sum;
    sum += counts[q];
    if (sum > INT32_MAX) die(1, "%ld bytes are too many for one gather", sum);
  }
  char *all = malloc(dist_rank || !sum ? 1 : (size_t)sum);
  if (!all) die(2, "out of memory");
  check(MPI_Gatherv(mine, len, MPI_BYTE, all, counts, displ, MPI_BYTE, 0, MPI_COMM_WORLD), "gathering the parts");
  free(counts), free(displ);
  *total = dist_rank ? 0 : (size_t)sum;
  return all;
}

void *dist_share(void *buf, size_t *n) {
  if (dist_size == 1) return buf;
  unsigned long long len = *n;
  check(MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD), "sharing rank 0's bytes");
  char *p = buf;
  if (dist_rank && !(p = malloc(len ? (size_t)len : 1))) die(2, "out of memory");
  /* (in pieces an int counts) */
  for (size_t done = 0, step = (size_t)1 << 30; done < len; done += step) {
    size_t part = len - done < step ? (size_t)(len - done) : step;
    check(MPI_Bcast(p + done, (int)part, MPI_BYTE, 0, MPI_COMM_WORLD), "sharing rank 0's bytes");
  }
  *n = (size_t)len;
  return p;
}

/* An error every rank finds at once: rank 0 says it, and all end without an abort. */
_Noreturn static void die_all(int status, const char *what) {
  if (!dist_rank) fprintf(stderr, "%s: %s\n", prog_of_all, what);
  dist_end();
  exit(status);
}

void dist_die_all(int status, const char *what) {
  if (dist_size == 1) die(status, "%s", what);
  die_all(status, what);
}

void dist_same(uint64_t v, const char *what) {
  if (dist_size == 1) return;
  unsigned long long mm[2] = {v, ~v};
  check(MPI_Allreduce(MPI_IN_PLACE, mm, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD), "comparing the ranks");
  if (mm[0] != v || ~mm[1] != v) {
    /* every rank knows it: they all stop with the message, and rank 0's is the one
       that counts (the others end with the abort) */
    die_all(1, fmt("the ranks differ in %s", what));
  }
}

/* A lookup table's part of the reduction. */
typedef struct Table {
  int param;
  char *base; /* its gradient, in the model's memory */
  long rows, cols, ld;
  int n;           /* this rank's rows (cavs_model_touched_rows) */
  const int *mine;
  int *ids;        /* every rank's, rank 0's first: total */
  int *counts, *displ; /* [dist_size]: each rank's number of them, and where they start */
  long total;
  bool dense; /* its whole gradient in the dense allreduce instead of as rows */
} Table;

static void *alloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) die(2, "out of memory");
  return p;
}


/* Table t's rows, summed in rank order on every rank: every rank's rows gathered (after
   the union was touched: this rank's rows hold its own gradient, the others zero), each
   row summed starting from the first rank that has it, and written back. */
static int reduce_rows(cavs_model *m, Table *t, size_t es, MPI_Datatype type) {
  int N = dist_size;
  if (t->total > (long)INT32_MAX / (t->cols > 0 ? t->cols : 1)) die(1, "a table's touched rows overflow one gather");
  size_t rowb = (size_t)t->cols * es;
  char *mine = host_grow(m, &rows_mine, &cap_mine, rowb * (size_t)t->n);
  char *all = host_grow(m, &rows_all, &cap_all, rowb * (size_t)t->total);
  for (int i = 0; i < t->n; i++)
    if (cavs_model_read(m, mine + (size_t)i * rowb, t->base + (size_t)t->mine[i] * (size_t)t->ld * es, rowb))
      return -1;
  int *vcounts = alloc(sizeof(int) * (size_t)N), *vdispl = alloc(sizeof(int) * (size_t)N);
  for (int q = 0; q < N; q++) vcounts[q] = t->counts[q] * (int)t->cols, vdispl[q] = t->displ[q] * (int)t->cols;
  check(MPI_Allgatherv(mine, t->n * (int)t->cols, type, all, vcounts, vdispl, type, MPI_COMM_WORLD),
        "gathering a table's gradient rows");
  dist_stats.bytes += (double)t->n * (double)rowb;
  long *first = alloc(sizeof(long) * (size_t)t->rows); /* a row's first entry: its sum */
  for (long i = 0; i < t->total; i++) first[t->ids[i]] = -1;
  for (long i = 0; i < t->total; i++) {
    long f = first[t->ids[i]];
    if (f < 0) {
      first[t->ids[i]] = i;
      continue;
    }
    char *dst = all + (size_t)f * rowb, *src = all + (size_t)i * rowb;
    if (es == 8)
      for (long j = 0; j < t->cols; j++) ((double *)dst)[j] += ((const double *)src)[j];
    else
      for (long j = 0; j < t->cols; j++) ((float *)dst)[j] += ((const float *)src)[j];
  }
  int rc = 0;
  for (long i = 0; i < t->total && !rc; i++)
    if (first[t->ids[i]] == i)
      rc = cavs_model_write(m, t->base + (size_t)t->ids[i] * (size_t)t->ld * es, all + (size_t)i * rowb, rowb);
  free(first), free(vcounts), free(vdispl);
  return rc;
}

/* The bytes of the flat gradient block outside the tables sent as rows and the expert
   tables placed on the ranks (--expert-parallel: each rank's own experts' gradient is
   its own to step), [from, next), one span after another: `next` the start of the next
   such table at or after from (nb: none), *end its end. */
static size_t span_end(cavs_model *m, const Table *tab, int nt, const char *flat, size_t nb, size_t from, size_t es,
                       size_t *end) {
  size_t next = nb;
  *end = nb;
  for (int i = 0; i < nt; i++) {
    if (tab[i].dense) continue;
    size_t off = (size_t)(tab[i].base - flat), len = (size_t)tab[i].rows * (size_t)tab[i].ld * es;
    if (off < from || off >= next) continue;
    next = off, *end = off + len;
  }
  size_t off, count;
  for (int i = 0; i < cavs_model_expert_placed(m, i, &off, &count); i++) {
    if (off * es < from || off * es >= next) continue;
    next = off * es, *end = (off + count) * es;
  }
  return next;
}

/* the dense part of the flat block into pack (out) or back from it */
static int move_dense(cavs_model *m, const Table *tab, int nt, char *flat, size_t nb, size_t es, char *pack, bool out,
                      size_t *bytes) {
  size_t at = 0, from = 0, end;
  for (;;) {
    size_t next = span_end(m, tab, nt, flat, nb, from, es, &end);
    if (next > from) {
      if (out ? cavs_model_read(m, pack + at, flat + from, next - from) : cavs_model_write(m, flat + from, pack + at, next - from))
        return -1;
      at += next - from;
    }
    if (next >= nb) break;
    from = end;
  }
  *bytes = at;
  return 0;
}

/* ---- the dense gradients, summed while the backward pass goes on ----
 *
 * The dense parameter groups (not the lookup tables) fall into buckets by the part of
 * the backward pass whose stages finish them: the push block's (the first to run),
 * each vertex type's, the pull block's (the last), as the descriptor's flags say. A
 * bucket's MPI_Iallreduce starts once libcavs has said that each of its groups is
 * final (cavs_model_set_grad_hook: the group copied into the bucket's place in bpack)
 * and every bucket before it has started: every rank starts them in that one order,
 * whatever order its own part of the minibatch finishes them in (a rank whose part has
 * no vertex of a type finishes that type's groups only at the pass's end). Between the
 * pass's steps the hook calls MPI_Testall, which is what progresses Open MPI's
 * non-blocking collectives; dist_reduce_grads waits for the rest. */
typedef struct Bucket {
  int n, have;   /* its groups, and those that have come this pass */
  size_t count;  /* its scalars */
  size_t at;     /* its place in bpack, in scalars */
} Bucket;
static Bucket *bucket;
static int nbucket, next_bucket; /* (next_bucket: the first not started) */
static MPI_Request *req;
static int *bucket_of;          /* [group]: its bucket, -1 for a table */
static size_t *group_at, *group_n; /* [group]: its place in bpack and its scalars */
static char **group_grad;          /* [group]: its gradient, in the model's memory */
static bool *came;
static int ngroups;
static size_t bes;
static cavs_model *bmodel;
static int bplaced; /* (the expert tables placed when the buckets were made) */
static bool hooked;

static void buckets_free(void) {
  free(bucket), free(req), free(bucket_of), free(group_at), free(group_n), free(group_grad), free(came);
  bucket = NULL, req = NULL, bucket_of = NULL, group_at = group_n = NULL, group_grad = NULL, came = NULL;
  nbucket = ngroups = 0;
  bmodel = NULL;
}

/* The part of the backward pass that finishes group g: 0 the push block, 1 + t vertex
   type t, T + 1 the pull block (or nothing: the pass's end) */
static int phase_of(const cavs_desc *d, int g) {
  int T = d->nvertex, p = -1;
  if (d->push_grads && d->push_grads[g]) p = 0;
  for (int t = 0; t < T; t++)
    for (int s = 0; s < 3; s++)
      if (d->vertex[t].bwd_grads[s] && d->vertex[t].bwd_grads[s][g]) p = 1 + t;
  if ((d->pull_grads && d->pull_grads[g]) || p < 0) p = T + 1;
  return p;
}

static void buckets_make(cavs_model *m, size_t es) {
  const cavs_desc *d = cavs_model_desc(m);
  buckets_free();
  bmodel = m, bes = es, ngroups = d->npgroups;
  int np = d->nvertex + 2;
  bucket_of = alloc(sizeof(int) * (size_t)(ngroups + 1));
  group_at = alloc(sizeof(size_t) * (size_t)(ngroups + 1)), group_n = alloc(sizeof(size_t) * (size_t)(ngroups + 1));
  group_grad = alloc(sizeof(char *) * (size_t)(ngroups + 1));
  came = alloc(sizeof(bool) * (size_t)(ngroups + 1));
  bucket = alloc(sizeof(Bucket) * (size_t)np), req = alloc(sizeof(MPI_Request) * (size_t)np);
  /* each group's gradient: where its parameters' are, the one at its column 0 first */
  for (int g = 0; g < ngroups; g++) group_grad[g] = NULL, group_n[g] = 0;
  for (int i = 0; i < d->nparams; i++) {
    long rows, cols, ld;
    char *p = cavs_model_grad(m, i, &rows, &cols, &ld);
    int g = d->params[i].group;
    if (!group_grad[g] || p < group_grad[g]) group_grad[g] = p;
    group_n[g] = (size_t)rows * (size_t)ld;
  }
  /* an expert table placed on the ranks (--expert-parallel) is its owner's to step:
     not summed (nor copied into a bucket before its replicas' gradients come home) */
  size_t count, off, n;
  char *flat = cavs_model_grads_flat(m, &count);
  bplaced = cavs_model_expert_placed(m, 0, NULL, NULL);
  bool *placed = alloc(sizeof(bool) * (size_t)(ngroups + 1));
  for (int g = 0; g < ngroups; g++) {
    placed[g] = false;
    for (int i = 0; i < bplaced; i++) {
      cavs_model_expert_placed(m, i, &off, &n);
      if (group_grad[g] == flat + off * es && group_n[g] == n) placed[g] = true;
    }
  }
  size_t at = 0;
  for (int ph = 0; ph < np; ph++) {
    Bucket b = {.at = at};
    for (int g = 0; g < ngroups; g++) {
      if (d->pgroups[g].sparse_input >= 0 || placed[g] || phase_of(d, g) != ph) continue;
      bucket_of[g] = nbucket, group_at[g] = at, at += group_n[g];
      b.n++, b.count += group_n[g];
    }
    if (b.n && b.count > (size_t)INT32_MAX) die(1, "a bucket of %zu gradients overflows one allreduce", b.count);
    if (b.n) bucket[nbucket++] = b;
  }
  for (int g = 0; g < ngroups; g++)
    if (d->pgroups[g].sparse_input >= 0 || placed[g]) bucket_of[g] = -1;
  free(placed);
  host_grow(m, &bpack, &capb, at * es + 1);
}

/* the buckets whose groups have all come, in order, started */
static void buckets_start(void) {
  MPI_Datatype type = bes == 8 ? MPI_DOUBLE : MPI_FLOAT;
  while (next_bucket < nbucket && bucket[next_bucket].have == bucket[next_bucket].n) {
    Bucket *b = &bucket[next_bucket];
    check(MPI_Iallreduce(MPI_IN_PLACE, bpack + b->at * bes, (int)b->count, type, MPI_SUM, MPI_COMM_WORLD,
                         &req[next_bucket]),
          "summing the gradients over the ranks");
    dist_stats.bytes += (double)b->count * (double)bes;
    next_bucket++;
  }
}

/* group g's gradient into its bucket */
static void group_in(int g) {
  if (came[g] || bucket_of[g] < 0) return;
  came[g] = true;
  if (cavs_model_read(bmodel, bpack + group_at[g] * bes, group_grad[g], group_n[g] * bes))
    die(1, "%s", cavs_model_error(bmodel));
  bucket[bucket_of[g]].have++;
}

static void grad_hook(void *arg, int g, void *grad, size_t count) {
  (void)arg, (void)grad, (void)count;
  double t0 = now();
  if (g >= 0 && g < ngroups) {
    group_in(g);
    buckets_start();
  }
  int done;
  if (next_bucket > 0) check(MPI_Testall(next_bucket, req, &done, MPI_STATUSES_IGNORE), "summing the gradients over the ranks");
  dist_stats.overlapped += now() - t0;
  dist_stats.seconds += now() - t0;
}

void dist_backward_begin(cavs_model *m, size_t es, bool mine) {
  hooked = false;
  if (dist_size == 1 || !dist_overlap) return;
  if (bmodel != m || bes != es || bplaced != cavs_model_expert_placed(m, 0, NULL, NULL)) buckets_make(m, es);
  for (int b = 0; b < nbucket; b++) bucket[b].have = 0, req[b] = MPI_REQUEST_NULL;
  for (int g = 0; g < ngroups; g++) came[g] = false;
  next_bucket = 0;
  hooked = true;
  /* a rank whose part counts for nothing (its gradients zeroed after the pass) sends its
     groups at the end */
  cavs_model_set_grad_hook(m, mine ? grad_hook : NULL, NULL);
}

/* the buckets' sums, every group having come (those the pass did not say, now) */
static int buckets_finish(cavs_model *m) {
  for (int g = 0; g < ngroups; g++) group_in(g);
  buckets_start();
  check(MPI_Waitall(nbucket, req, MPI_STATUSES_IGNORE), "summing the gradients over the ranks");
  for (int g = 0; g < ngroups; g++)
    if (bucket_of[g] >= 0 && cavs_model_write(m, group_grad[g], bpack + group_at[g] * bes, group_n[g] * bes)) return -1;
  cavs_model_set_grad_hook(m, NULL, NULL);
  hooked = false;
  return 0;
}

int dist_reduce_grads(cavs_model *m, size_t es) {
  if (dist_size == 1) return 0;
  double t0 = now();
  const cavs_desc *d = cavs_model_desc(m);
  MPI_Datatype type = es == 8 ? MPI_DOUBLE : MPI_FLOAT;
  size_t count;
  char *flat = cavs_model_grads_flat(m, &count);
  size_t nb = count * es;
  int N = dist_size, nt = 0;
  Table *tab = alloc(sizeof(Table) * (size_t)d->nparams);
  /* the tables first: every rank's rows gathered, and the union made each rank's step's
     (new rows zeroed: nothing is summed into them yet) */
  for (int i = 0; i < d->nparams; i++) {
    const int *rows;
    int n = cavs_model_touched_rows(m, i, &rows);
    if (n < 0) continue;
    Table *t = &tab[nt++];
    *t = (Table){.param = i, .n = n, .mine = rows};
    t->base = cavs_model_grad(m, i, &t->rows, &t->cols, &t->ld);
    t->counts = alloc(sizeof(int) * (size_t)N), t->displ = alloc(sizeof(int) * (size_t)N);
    check(MPI_Allgather(&t->n, 1, MPI_INT, t->counts, 1, MPI_INT, MPI_COMM_WORLD), "gathering a table's row counts");
    for (int q = 0; q < N; q++) t->displ[q] = (int)t->total, t->total += t->counts[q];
    t->ids = alloc(sizeof(int) * (size_t)t->total);
    check(MPI_Allgatherv(t->mine, t->n, MPI_INT, t->ids, t->counts, t->displ, MPI_INT, MPI_COMM_WORLD),
          "gathering a table's rows");
    dist_stats.bytes += (double)t->n * sizeof(int);
    if (cavs_model_touch_rows(m, i, t->ids, (int)t->total)) return -1;
    /* as rows or whole, by the bytes each rank sends (in the flat block only: the dense
       allreduce is of that block) */
    size_t off = (size_t)(t->base - flat), len = (size_t)t->rows * (size_t)t->ld * es;
    t->dense = t->base >= flat && off + len <= nb && (double)t->total * (double)t->cols * (double)es >= (double)len;
    if (t->dense) dist_stats.dense_tables++;
    else dist_stats.sparse_tables++;
  }
  /* the dense part: every parameter's gradient but the tables sent as rows, in one
     buffer and one allreduce; or, where the buckets took the dense groups during the
     pass, the tables sent whole */
  size_t at = 0;
  bool buckets = hooked;
  if (buckets) {
    if (buckets_finish(m)) return -1;
    for (int i = 0; i < nt; i++)
      if (tab[i].dense) at += (size_t)tab[i].rows * (size_t)tab[i].ld * es;
    host_grow(m, &pack, &cappack, at + 1);
    at = 0;
    for (int i = 0; i < nt; i++) {
      size_t len = (size_t)tab[i].rows * (size_t)tab[i].ld * es;
      if (tab[i].dense && cavs_model_read(m, pack + at, tab[i].base, len)) return -1;
      at += tab[i].dense ? len : 0;
    }
  } else {
    host_grow(m, &pack, &cappack, nb);
    if (move_dense(m, tab, nt, flat, nb, es, pack, true, &at)) return -1;
  }
  /* (in pieces an int counts) */
  for (size_t done = 0, step = ((size_t)1 << 30) * es; done < at; done += step) {
    size_t len = at - done < step ? at - done : step;
    check(MPI_Allreduce(MPI_IN_PLACE, pack + done, (int)(len / es), type, MPI_SUM, MPI_COMM_WORLD),
          "summing the gradients over the ranks");
  }
  dist_stats.bytes += (double)at;
  if (buckets) {
    at = 0;
    for (int i = 0; i < nt; i++) {
      size_t len = (size_t)tab[i].rows * (size_t)tab[i].ld * es;
      if (tab[i].dense && cavs_model_write(m, tab[i].base, pack + at, len)) return -1;
      at += tab[i].dense ? len : 0;
    }
  } else if (move_dense(m, tab, nt, flat, nb, es, pack, false, &at))
    return -1;
  int rc = 0;
  for (int i = 0; i < nt; i++) {
    if (!rc && !tab[i].dense) rc = reduce_rows(m, &tab[i], es, type);
    free(tab[i].ids), free(tab[i].counts), free(tab[i].displ);
  }
  free(tab);
  dist_stats.seconds += now() - t0;
  return rc;
}

/* ---- expert parallelism: libcavs's two collectives (cavs_expert_comm) over a
   communicator of their own, so that their order never meets the gradients' ---- */
/* (ep_world, made by the first dist_experts; ep_counts, [4 N]: send counts and
   offsets, receive counts and offsets: above, with the other statics) */

static int ep_allgather(void *arg, const void *mine, size_t bytes, void *all) {
  (void)arg;
  if (bytes > INT32_MAX) return MPI_ERR_COUNT;
  return MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, ep_world);
}

static int ep_alltoallv(void *arg, const void *send, const size_t *sbytes, void *recv, const size_t *rbytes) {
  (void)arg;
  int N = dist_size, *sc = ep_counts, *sd = sc + N, *rc = sd + N, *rd = rc + N;
  size_t so = 0, ro = 0;
  for (int q = 0; q < N; q++) {
    /* (MPI counts in int: a round of more than 2 GiB is refused, not truncated) */
    if (sbytes[q] > INT32_MAX || rbytes[q] > INT32_MAX || so > INT32_MAX || ro > INT32_MAX) return MPI_ERR_COUNT;
    sc[q] = (int)sbytes[q], sd[q] = (int)so, rc[q] = (int)rbytes[q], rd[q] = (int)ro;
    so += sbytes[q], ro += rbytes[q];
  }
  if (so > INT32_MAX || ro > INT32_MAX) return MPI_ERR_COUNT;
  return MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, ep_world);
}

void dist_experts(cavs_model *m, bool on) {
  if (dist_size == 1 || !dist_expert_parallel) return;
  if (!ep_made) {
    check(MPI_Comm_dup(MPI_COMM_WORLD, &ep_world), "a communicator for the experts");
    ep_made = true;
    MPI_Comm_set_errhandler(ep_world, MPI_ERRORS_RETURN);
    ep_counts = alloc(sizeof(int) * 4 * (size_t)dist_size);
  }
  cavs_expert_comm c = {.rank = dist_rank, .size = dist_size, .allgather = ep_allgather, .alltoallv = ep_alltoallv,
                        .replicate = dist_expert_replicas};
  if (cavs_model_set_expert_comm(m, on ? &c : NULL)) die(1, "%s", cavs_model_error(m));
}

#endif

/* optim.c: the optimizers by name, and what a step changes: dense parameter blocks are
 * updated whole, lookup tables only in the rows the minibatch read (their other rows
 * have a zero gradient), which on SST saves updating 18,000 embedding rows to touch a
 * few hundred. The update itself (weight decay, global gradient-norm clipping, then
 * SGD, Adagrad, Adam, Momentum, Nesterov or AdamW) is the backend's `step`, from the
 * settings resolved here. */
#include "cv.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Before a backward pass: clear the gradient rows of the lookup tables left from the last
 * one, and list the rows this minibatch reads. */
void cv_sparse_reset(cavs_model *m) {
  const cavs_desc *d = m->d;
  for (int g = 0; g < d->npgroups; g++) {
    int slot = d->pgroups[g].sparse_input;
    if (slot < 0) continue;
    size_t row = (size_t)m->pg_cols[g] * m->esize;
    m->be->zero_rows(m, m->pgrad[g], row, m->touched[g], m->ntouched[g]);
    for (int i = 0; i < m->ntouched[g]; i++) m->mark[g][m->touched[g][i]] = 0;
    m->ntouched[g] = 0;
    const int *idx = m->iin[slot];
    for (int r = 0; r < m->rows; r++) {
      int id = idx[r];
      if (id < 0 || id >= m->pg_rows[g] || m->mark[g][id]) continue;
      m->mark[g][id] = 1;
      m->touched[g][m->ntouched[g]++] = id;
    }
  }
}

/* group g is an expert table placed on processes (moe.c: its rows stepped by their owners) */
static bool placed_group(const cavs_model *m, int g) {
  size_t off, len;
  for (int i = 0, pg; (pg = cv_experts_own(m, i, &off, &len)) >= 0; i++)
    if (pg == g) return true;
  return false;
}

static int by_row(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* The parts of the flat block this step changes (in an array that only grows: a
 * steady-state step allocates nothing); last, the *own spans of the experts placed on
 * processes that are this process's (an expert table's other rows are their owners').
 * A lookup table's rows in order: the norm of a clip sums the spans end to end, and
 * ranks that read the rows in different orders (each its own first, then the others',
 * dist.c) would clip by norms a bit apart and drift. */
static cv_span *spans(cavs_model *m, int *count, int *own) {
  const cavs_desc *d = m->d;
  int n = 0;
  for (int g = 0; g < d->npgroups; g++) n += m->frozen[g] ? 0 : d->pgroups[g].sparse_input >= 0 ? m->ntouched[g] : 1;
  if (n > m->capspans) return NULL; /* cavs_model_new made room for every group and row */
  cv_span *s = m->spans;
  n = 0;
  for (int g = 0; g < d->npgroups; g++) {
    size_t cols = (size_t)m->pg_cols[g];
    if (m->frozen[g] || (m->ep.placed && placed_group(m, g))) continue;
    if (d->pgroups[g].sparse_input < 0) {
      s[n++] = (cv_span){m->pg_off[g], (size_t)m->pg_rows[g] * cols};
      continue;
    }
    qsort(m->touched[g], (size_t)m->ntouched[g], sizeof(int), by_row);
    for (int i = 0; i < m->ntouched[g]; i++)
      s[n++] = (cv_span){m->pg_off[g] + (size_t)m->touched[g][i] * cols, cols};
  }
  *own = 0;
  size_t off, len;
  for (int i = 0, g; (g = cv_experts_own(m, i, &off, &len)) >= 0; i++) /* (one span for the group's one) */
    if (!m->frozen[g] && len) s[n++] = (cv_span){off, len}, ++*own;
  *count = n;
  return s;
}

/* The optimizers: each kind one update rule with one name (AdamW and Nesterov are kinds,
 * not flags on Adam and SGD: cavs.h says why). */
static const struct {
  const char *name;
  double lr; /* the default learning rate */
} optims[] = {
    [CAVS_SGD] = {"sgd", 0.05},
    [CAVS_ADAGRAD] = {"adagrad", 0.05},
    [CAVS_ADAM] = {"adam", 1e-3},
    [CAVS_MOMENTUM] = {"momentum", 0.01},
    [CAVS_NESTEROV] = {"nesterov", 0.01},
    [CAVS_ADAMW] = {"adamw", 1e-3},
};
_Static_assert(sizeof optims / sizeof *optims == CAVS_OPTIM_COUNT, "one row per optimizer");

const char *cavs_optim_name(int kind) { return kind >= 0 && kind < CAVS_OPTIM_COUNT ? optims[kind].name : NULL; }

int cavs_optim_kind(const char *name) {
  for (int k = 0; k < CAVS_OPTIM_COUNT; k++)
    if (!strcmp(name, optims[k].name)) return k;
  return -1;
}

double cavs_optim_default_lr(int kind) { return kind >= 0 && kind < CAVS_OPTIM_COUNT ? optims[kind].lr : 0; }

/* the lookup table parameter `param` is stored in: its group, or -1 */
static int table_group(const cavs_model *m, int param) {
  const cavs_desc *d = m->d;
  if (param < 0 || param >= d->nparams) return -1;
  int g = d->params[param].group;
  return d->pgroups[g].sparse_input >= 0 ? g : -1;
}

int cavs_model_touched_rows(const cavs_model *m, int param, const int **rows) {
  int g = table_group(m, param);
  if (g < 0) return -1;
  *rows = m->touched[g];
  return m->ntouched[g];
}

int cavs_model_touch_rows(cavs_model *m, int param, const int *rows, int n) {
  int g = table_group(m, param);
  if (g < 0) return cv_fail(m, "parameter %d is not a lookup table", param);
  for (int i = 0; i < n; i++)
    if (rows[i] < 0 || rows[i] >= m->pg_rows[g])
      return cv_fail(m, "row %d of lookup table '%s' is out of range (0 to %ld)", rows[i], m->d->params[param].name,
                     m->pg_rows[g] - 1);
  int first = m->ntouched[g];
  for (int i = 0; i < n; i++) {
    int id = rows[i];
    if (m->mark[g][id]) continue;
    m->mark[g][id] = 1;
    m->touched[g][m->ntouched[g]++] = id;
  }
  /* zero already (every row a step updates is zeroed, and reset clears the rows read),
     but the new rows' gradients are made sure of, in one call: the application adds to them */
  int added = m->ntouched[g] - first;
  return added ? m->be->zero_rows(m, m->pgrad[g], (size_t)m->pg_cols[g] * m->esize, m->touched[g] + first, added) : 0;
}

int cavs_model_freeze(cavs_model *m, int param, int frozen) {
  const cavs_desc *d = m->d;
  if (param < 0 || param >= d->nparams) return cv_fail(m, "no parameter %d", param);
  int g = d->params[param].group;
  for (int i = 0; i < d->nparams; i++)
    if (i != param && d->params[i].group == g)
      return cv_fail(m, "parameter '%s' shares its storage with '%s' (their products are merged): it cannot be frozen alone",
                     d->params[param].name, d->params[i].name);
  m->frozen[g] = frozen != 0;
  return 0;
}

int cv_moments_of(int kind) {
  switch (kind) {
  case CAVS_SGD: return 0;
  case CAVS_ADAGRAD:
  case CAVS_MOMENTUM:
  case CAVS_NESTEROV: return 1;
  default: return 2;
  }
}

int cv_alloc_moments(cavs_model *m, int n) {
  /* SGD's model holds none; a model that changes optimizer gets what the new one reads,
     zeroed, beside what it had */
  size_t bytes = (m->nflat + 1) * m->esize;
  void **blk[2] = {&m->m1, &m->m2};
  for (int i = 0; i < n && i < 2; i++) {
    if (*blk[i]) continue;
    size_t batch = 0, need;
    if (cv_minibatch_bytes(m, &batch) || __builtin_add_overflow(m->model_bytes, bytes, &need) ||
        __builtin_add_overflow(need, batch, &need) || need > cavs_memory_limit()) {
      char b1[CV_BYTES_LEN], b2[CV_BYTES_LEN], b3[CV_BYTES_LEN], b4[CV_BYTES_LEN];
      return cv_fail_mem(m,
                         "the optimizer's state (block %d of %d, %s) does not fit beside the model's %s and the "
                         "minibatch's %s under the memory limit of %s (raise --max-memory, or an optimizer with "
                         "less state: SGD keeps none, momentum and Adagrad one block)",
                         i + 1, n, cv_bytes(b1, bytes), cv_bytes(b2, m->model_bytes), cv_bytes(b3, batch),
                         cv_bytes(b4, cavs_memory_limit()));
    }
    if (!(*blk[i] = cv_alloc_zeroed(m, bytes)))
      return cv_fail_mem(m, "out of memory for the optimizer's state (%zu values)", (size_t)n * m->nflat);
    m->model_bytes += bytes;
  }
  return 0;
}

void cv_release_moments(cavs_model *m) {
  size_t bytes = (m->nflat + 1) * m->esize;
  void **blk[2] = {&m->m1, &m->m2};
  for (int i = 0; i < 2; i++) {
    if (!*blk[i]) continue;
    m->be->release(*blk[i]);
    *blk[i] = NULL;
    m->model_bytes -= bytes;
  }
}

int cavs_model_reserve_optimizer(cavs_model *m, int kind) {
  if (kind < 0 || kind >= CAVS_OPTIM_COUNT) return cv_fail(m, "no optimizer of kind %d", kind);
  return cv_alloc_moments(m, cv_moments_of(kind));
}

void *cv_alloc_zeroed(cavs_model *m, size_t bytes) {
  if (m->be->alloc_zeroed) return m->be->alloc_zeroed(m, bytes);
  void *p = m->be->alloc(m, bytes);
  if (p) m->be->zero(m, p, bytes);
  return p;
}

/* o with its defaults filled in, and its weight decay where its kind applies it */
static cv_hyper hyper(const cavs_optim *o) {
  bool decoupled = o->kind == CAVS_ADAMW;
  return (cv_hyper){
      .kind = o->kind,
      .lr = o->lr,
      .clip = o->clip,
      .l2 = decoupled ? 0 : o->weight_decay,
      .decoupled = decoupled ? o->weight_decay : 0,
      .b1 = o->beta1 ? o->beta1 : 0.9,
      .b2 = o->beta2 ? o->beta2 : 0.999,
      .eps = o->eps ? o->eps : (o->kind == CAVS_ADAGRAD ? 1e-10 : 1e-8),
      .mu = o->momentum ? o->momentum : 0.9,
  };
}

int cavs_model_track_grad_norm(cavs_model *m, int on) {
  m->track_norm = on != 0;
  return 0;
}

double cavs_model_grad_norm(cavs_model *m) {
  /* on the device until the step has run: the backend's synchronize brings it */
  if (m->norm_pending && m->be->synchronize(m)) return -1;
  return m->grad_norm2 >= 0 ? sqrt(m->grad_norm2) : -1;
}

int cavs_model_step(cavs_model *m, const cavs_optim *o) {
  if (m->launch_failed) { /* the passes': the message is in m->err, errno says it again */
    errno = m->fail_errno;
    return -1;
  }
  if (m->no_grads) { /* the backward pass refused (inference): the message is in m->err */
    m->no_grads = false;
    return -1;
  }
  if (o->kind < 0 || o->kind >= CAVS_OPTIM_COUNT) return cv_fail(m, "no optimizer of kind %d", o->kind);
  if (cv_alloc_moments(m, cv_moments_of(o->kind))) return -1;
  /* never reached by training (2^53 steps), but a counter read from a file is bounded
     and its increments checked */
  if (m->step >= CAVS_MAX_STEPS) return cv_fail(m, "the optimizer has taken %ld steps, the most a model takes", m->step);
  m->step++;
  cv_hyper h = hyper(o);
  h.norm = m->track_norm;
  m->grad_norm2 = -1, m->norm_pending = false;
  int ns;
  cv_span *sp = spans(m, &ns, &h.nown);
  if (!sp) return cv_fail(m, "internal error: more optimizer spans than the model made room for");
  if (m->ep.placed) h.own_norm2 = cv_experts_norm2;
  m->ep.failed = false;
  /* A backend's step fails before it updates anything (its memory for the spans, a
     failed pass before it: backend_cuda.cu): the count as it was, so that it can be
     taken again. The experts' norm exchange fails inside the update (the decay added,
     the parameters stepped with this process's norm): the count stays. */
  int rc = m->be->step(m, &h, sp, ns);
  if (m->ep.failed) return -1;
  if (rc) {
    m->step--;
    return -1;
  }
  /* the step zeroed the gradient of every span it updated: a dense group not frozen is
     clean for the next backward pass (a lookup table's touched rows are cleared there;
     a placed expert table's rows of other owners are zero here: a replica's gradient
     went home, zeroed, at the backward pass's end) */
  const cavs_desc *d = m->d;
  for (int g = 0; g < d->npgroups; g++) m->pg_clean[g] = !m->frozen[g] && d->pgroups[g].sparse_input < 0;
  /* the other processes' experts' rows given back (a replica's matrix, a sync's
     copies: none is current after the step) */
  if (m->ep.placed) cv_experts_release(m);
  return 0;
}

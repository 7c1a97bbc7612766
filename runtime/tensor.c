/* tensor.c: a model's memory. All parameters in one block with the groups (and the
 * parameters in them) pointing into it, as llm.c does; gradients in a second block of the
 * same layout; per-row buffers for the minibatch, grown to the largest minibatch seen and
 * never shrunk, so steady-state training allocates nothing. What kernels touch is the
 * backend's memory, allocated and filled through its operations (backend.h); the
 * schedule and the bookkeeping are host arrays. */
#include "cv.h"
#include "sgemm.h"

#include <errno.h>
#include <math.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Both read only the dims the width depends on, all below the model's ndims: callers pass
 * arrays filled that far (cavs_ckpt_dims, cavs eval), not always to CAVS_MAX_DIMS. */
long cv_lin(const cavs_lin *l, const long *dims) {
  long v = l->k;
  for (int i = 0; i < CAVS_MAX_DIMS; i++)
    if (l->c[i]) v += (long)l->c[i] * dims[i];
  return v;
}

int cv_lin_checked(const cavs_lin *l, const long *dims, long *out) {
  long v = l->k, t;
  for (int i = 0; i < CAVS_MAX_DIMS; i++)
    if (l->c[i] && (__builtin_mul_overflow((long)l->c[i], dims[i], &t) || __builtin_add_overflow(v, t, &v)))
      return -1;
  *out = v;
  return v < 0 ? -1 : 0;
}

int cv_fail(cavs_model *m, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->err, sizeof m->err, fmt, ap);
  va_end(ap);
  return -1;
}

/* " (what the backend said)" of a failed allocation, once, or "" */
static const char *alloc_why(cavs_model *m, char *buf, size_t len) {
  if (!m->alloc_why[0]) return "";
  snprintf(buf, len, " (%s)", m->alloc_why);
  m->alloc_why[0] = 0;
  return buf;
}

/* Whether the allocation that failed failed for the device (m->err says how, errno EIO) */
static bool alloc_lost(cavs_model *m) {
  if (!m->alloc_lost) return false;
  m->alloc_lost = false;
  m->alloc_why[0] = 0;
  cv_errno(m, EIO);
  return true;
}

int cv_fail_mem(cavs_model *m, const char *fmt, ...) {
  if (alloc_lost(m)) return -1;
  char why[sizeof m->alloc_why + 4];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(m->err, sizeof m->err, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof m->err) snprintf(m->err + n, sizeof m->err - (size_t)n, "%s", alloc_why(m, why, sizeof why));
  cv_errno(m, ENOMEM);
  return -1;
}

int cv_grow(cavs_model *m, void *p, size_t elem, size_t count) {
  size_t bytes;
  if (__builtin_mul_overflow(elem, count ? count : 1, &bytes)) return cv_fail_mem(m, "out of memory (a size overflows)");
  void *q = realloc(*(void **)p, bytes);
  if (!q) return cv_fail_mem(m, "out of memory (%zu bytes)", bytes);
  *(void **)p = q;
  return 0;
}

/* ---- memory: what a model and a minibatch need, known before anything is allocated ---- */

static size_t mem_limit;

void cavs_set_memory_limit(size_t bytes) { mem_limit = bytes; }

size_t cavs_memory_limit(void) {
  if (mem_limit) return mem_limit;
  /* the default: most of the machine's memory; past it an allocation would succeed (the
     kernel overcommits) and the process be killed later, when the pages are touched */
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || size <= 0) return (size_t)8 << 30;
  return (size_t)((double)pages * (double)size * 0.9);
}

/* A size in the unit that shows it ("512 bytes", "1.00 KiB", "2.50 GiB"): a limit of
   1K is not "0.00 GiB". Into buf, which it returns. */
const char *cv_bytes(char buf[CV_BYTES_LEN], size_t b) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (b < 1024) {
    snprintf(buf, CV_BYTES_LEN, "%zu bytes", b);
    return buf;
  }
  double x = (double)b / 1024;
  int u = 0;
  while (x >= 1024 && u < 3) x /= 1024, u++;
  snprintf(buf, CV_BYTES_LEN, "%.2f %s", x, units[u]);
  return buf;
}

/* Bytes per row of the minibatch: every buffer and its gradient, the inputs, the
 * children and flags, and the scheduler's scratch (about eight ints a vertex). */
static int row_bytes(const cavs_model *m, size_t *out) {
  const cavs_desc *d = m->d;
  size_t b = (size_t)m->maxc * sizeof(int) + 2 + sizeof(int) + (size_t)d->nint * sizeof(int) + 8 * sizeof(int) +
             sizeof(uint64_t);
  for (int i = 0; i < d->nbufs; i++) {
    size_t w;
    if (d->bufs[i].edge) continue; /* cv_grow_edges */
    if (__builtin_mul_overflow((size_t)m->bw[i], m->esize * (d->bufs[i].grad ? 2 : 1), &w) ||
        __builtin_add_overflow(b, w, &b))
      return -1;
  }
  for (int i = 0; i < d->nreal; i++) {
    size_t w;
    if (__builtin_mul_overflow((size_t)m->rw[i], m->esize, &w) || __builtin_add_overflow(b, w, &b)) return -1;
  }
  if (m->nhomes) {
    /* each home's pointers and key, and its scratch row */
    size_t w;
    if (__builtin_mul_overflow((size_t)m->home_w, m->esize, &w) ||
        __builtin_mul_overflow(w + 2 * sizeof(void *) + sizeof(long), (size_t)m->nhomes, &w) ||
        __builtin_add_overflow(b, w, &b))
      return -1;
  }
  *out = b;
  return 0;
}

int cavs_model_memory(const cavs_model *m, long rows, size_t *model_bytes, size_t *row_total) {
  size_t per;
  if (model_bytes) *model_bytes = m->model_bytes;
  if (rows < 0 || row_bytes(m, &per) || __builtin_mul_overflow(per, (size_t)rows, &per)) return -1;
  if (row_total) *row_total = per;
  return 0;
}

void cavs_dims_default(const cavs_desc *d, long *dims) {
  for (int i = 0; i < CAVS_MAX_DIMS; i++) dims[i] = 0;
  for (int i = 0; i < d->ndims; i++) dims[i] = d->dims[i].kind == CAVS_DIM_FIXED ? d->dims[i].value : 0;
  cavs_dims_derive(d, dims);
}

void cavs_dims_derive(const cavs_desc *d, long *dims) {
  /* factors come first, each at most CAVS_MAX_DIM (cavs_model_new checks): no overflow;
     a factor out of range (a bad descriptor) binds nothing */
  for (int i = 0; i < d->ndims && i < CAVS_MAX_DIMS; i++) {
    const cavs_dim_desc *x = &d->dims[i];
    if (x->kind != CAVS_DIM_PRODUCT) continue;
    bool ok = x->a >= 0 && x->a < i && x->b >= 0 && x->b < i;
    long a = ok ? dims[x->a] : 0, b = ok ? dims[x->b] : 0;
    dims[i] = a > 0 && b > 0 && a <= CAVS_MAX_DIM && b <= CAVS_MAX_DIM ? a * b : 0;
  }
}

/* The descriptor's version, and the indices the runtime follows in its vertex types (the
 * states the gathers read, the slots' types); false with the message in err. */
static bool vertex_types_ok(const cavs_desc *d, char *err, size_t errlen) {
  /* the version first: a descriptor of another ABI may not even have these fields where
     this one reads them (abi has been the first field from the start) */
  if (d->abi != CAVS_ABI_VERSION) {
    snprintf(err, errlen,
             "model '%s' was generated for libcavs ABI %d, but this libcavs is ABI %d: generate it again with "
             "this version's cavsc",
             d->abi >= 2 || d->abi == 1 ? d->name : "?", d->abi, CAVS_ABI_VERSION);
    return false;
  }
  for (int t = 0; t < d->nvertex; t++) {
    const cavs_vertex_desc *v = &d->vertex[t];
    bool ok = v->state >= -1 && v->state < d->nbufs && (d->state_buf < 0 || v->state == d->state_buf);
    for (int g = 0; ok && g < v->ngathers; g++) ok = v->gathers[g].src >= 0 && v->gathers[g].src < d->nbufs;
    ok = ok && v->homes >= 0 && v->homes <= CAVS_MAX_HOMES && (v->homes == 0 || v->state >= 0) &&
         (v->edge_buf == -1 || (v->edges && v->edge_buf >= 0 && v->edge_buf < d->nbufs && d->bufs[v->edge_buf].edge));
    for (int k = 0; ok && v->slot_types && k < v->children; k++)
      ok = v->slot_types[k] >= 0 && v->slot_types[k] < d->nvertex && d->vertex[v->slot_types[k]].state >= 0;
    if (ok && v->edges)
      ok = v->edge_state >= 0 && v->edge_state < d->nbufs &&
           (v->edge_type < 0 ? v->edge_state == d->state_buf
                             : v->edge_type < d->nvertex && d->vertex[v->edge_type].state == v->edge_state);
    if (!ok) {
      snprintf(err, errlen, "model '%s': vertex type %d's states or child slots are inconsistent", d->name, t);
      return false;
    }
  }
  return true;
}

/* The backend the options name (cpu by default), if it runs the model's target and
 * vertices and its device is there; NULL with the message in err. */
static const cv_backend *backend_for(const cavs_desc *d, const cavs_model_opts *o, char *err, size_t errlen) {
  const char *bname = o && o->backend && *o->backend ? o->backend : "cpu";
  const cv_backend *be = cv_backend_find(bname, err, errlen);
  if (!be) return NULL;
  /* before the probe: what the model can run on does not depend on the machine */
  if (d->target != be->target) {
    const char *t = d->target == CAVS_TARGET_CUDA ? "cuda" : "c";
    snprintf(err, errlen, "model '%s' was compiled for the %s target, which the %s backend cannot run (compile it with "
             "cavsc --target=%s)", d->name, t, be->name, be->target == CAVS_TARGET_CUDA ? "cuda" : "c");
    return NULL;
  }
  for (int t = 0; t < d->nvertex; t++)
    if (d->vertex[t].edges && !be->esum_fwd) {
      snprintf(err, errlen, "model '%s': vertex '%s' takes its children as a set (children *), which the %s backend "
               "does not run yet", d->name, d->vertex[t].name, be->name);
      return NULL;
    }
  return be->probe(err, errlen) ? NULL : be;
}

/* The options' defaults, and every dim bound (dims, or the fixed ones where dims is NULL;
 * products from their factors) into bound; false with the message in err. */
static bool dims_bound(const cavs_desc *d, const long *dims, long *bound, char *err, size_t errlen) {
  if (d->ndims < 0 || d->ndims > CAVS_MAX_DIMS) {
    snprintf(err, errlen, "model '%s' has %d dims (at most %d)", d->name, d->ndims, CAVS_MAX_DIMS);
    return false;
  }
  if (d->noptions < 0 || d->noptions > CAVS_MAX_OPTIONS) {
    snprintf(err, errlen, "model '%s' has %d options (at most %d)", d->name, d->noptions, CAVS_MAX_OPTIONS);
    return false;
  }
  for (int i = 0; i < d->noptions; i++)
    if (!d->options[i].name || d->options[i].kind != cavs_option_kind_of(d->options[i].name) ||
        !cavs_option_value_ok(d->options[i].kind, d->options[i].value)) {
      snprintf(err, errlen, "model '%s': option %s's default %g is not %s", d->name,
               d->options[i].name ? d->options[i].name : "(null)", d->options[i].value,
               d->options[i].kind == CAVS_OPTION_CLIP      ? "a gradient-norm clip (0 or more)"
               : d->options[i].kind == CAVS_OPTION_BALANCE ? "a loss's weight (0 or more)"
                                                           : "a dropout probability in [0, 1)");
      return false;
    }
  for (int i = 0; i < d->ndims; i++) {
    long v = dims ? dims[i] : (d->dims[i].kind == CAVS_DIM_FIXED ? d->dims[i].value : 0);
    if (d->dims[i].kind == CAVS_DIM_PRODUCT) {
      /* a product of earlier dims, already checked */
      if (d->dims[i].a < 0 || d->dims[i].a >= i || d->dims[i].b < 0 || d->dims[i].b >= i) {
        snprintf(err, errlen, "model '%s': dim %s is a product of dims that do not come before it", d->name,
                 d->dims[i].name);
        return false;
      }
      v = bound[d->dims[i].a] * bound[d->dims[i].b];
      if (v > CAVS_MAX_DIM) {
        snprintf(err, errlen, "dim %s = %s * %s = %ld is too large (at most 16777216)", d->dims[i].name,
                 d->dims[d->dims[i].a].name, d->dims[d->dims[i].b].name, v);
        return false;
      }
    }
    if (v <= 0 || v > CAVS_MAX_DIM) {
      snprintf(err, errlen, "dim %s %s", d->dims[i].name,
               v <= 0 ? "has no value (bind it from the data or with --dim)" : "is too large (at most 16777216)");
      return false;
    }
    bound[i] = v;
  }
  return true;
}

/* Every array is allocated (and checked) before the model is used; cavs_model_free can
 * take a model that failed half way. In the steps below, false: the message is in err
 * and errno says why, and the caller frees the model. */
#define NEW(p, n, what)                                                                   \
  do {                                                                                    \
    if (!((p) = calloc((size_t)(n) + 1, sizeof *(p)))) {                                  \
      snprintf(err, errlen, "out of memory (%s)", what);                                  \
      errno = ENOMEM;                                                                     \
      return false;                                                                       \
    }                                                                                     \
  } while (0)

/* The widths at these dims: the parameter groups' shapes and places in the flat blocks
 * (*total values), the buffers', the real inputs', the homes'; every index of the
 * descriptor's it follows checked, every size in checked arithmetic; and what the model
 * needs before a minibatch (parameters, gradients, the lookup tables' row lists, the
 * optimizer's *nspans spans) held to the memory limit. */
static bool lay_out(cavs_model *m, size_t *total, size_t *nspans, char *err, size_t errlen) {
  const cavs_desc *d = m->d;
  cavs_ctx *c = &m->ctx;
  NEW(m->pg_off, d->npgroups, "parameter groups");
  NEW(m->frozen, d->npgroups, "parameter groups");
  NEW(m->pg_clean, d->npgroups, "parameter groups");
  NEW(m->pg_rows, d->npgroups, "parameter groups");
  NEW(m->pg_cols, d->npgroups, "parameter groups");
  NEW(m->bw, d->nbufs, "buffers");
  NEW(m->rw, d->nreal, "inputs");
  size_t sparse_rows = 0;
  *total = 0, *nspans = 1;
  bool ok = true;
  for (int g = 0; g < d->npgroups && ok; g++) {
    size_t n;
    m->pg_off[g] = *total;
    ok = !cv_lin_checked(&d->pgroups[g].rows, c->dims, &m->pg_rows[g]) &&
         !cv_lin_checked(&d->pgroups[g].cols, c->dims, &m->pg_cols[g]) &&
         !__builtin_mul_overflow((size_t)m->pg_rows[g], (size_t)m->pg_cols[g], &n) &&
         !__builtin_add_overflow(*total, n + 15, total);
    *total &= ~(size_t)15; /* 64-byte aligned groups */
    if (d->pgroups[g].sparse_input >= 0) sparse_rows += (size_t)m->pg_rows[g], *nspans += (size_t)m->pg_rows[g];
    else (*nspans)++;
  }
  for (int b = 0; b < d->nbufs && ok; b++) ok = !cv_lin_checked(&d->bufs[b].width, c->dims, &m->bw[b]);
  /* the pushed columns lie in the push buffer (cavs_model_vertex_output reads them) */
  if (ok && d->push_buf >= 0) {
    long off = 0, w = 0;
    if (d->push_buf >= d->nbufs || cv_lin_checked(&d->push_off, c->dims, &off) ||
        cv_lin_checked(&d->push_width, c->dims, &w) || off < 0 || w < 0 || off + w > m->bw[d->push_buf]) {
      snprintf(err, errlen, "model '%s': its pushed rows lie outside their buffer", d->name);
      return false;
    }
  }
  /* a dropout read in place: its output's columns lie in its input's buffer */
  for (int i = 0; ok && i < d->naliases; i++) {
    const cavs_alias_desc *a = &d->aliases[i];
    long off = 0;
    if (a->buf < 0 || a->buf >= d->nbufs || a->src < 0 || a->src >= d->nbufs || a->buf == a->src ||
        a->opt < -1 || a->opt >= d->noptions || cv_lin_checked(&a->off, c->dims, &off) ||
        off > m->bw[a->src] - m->bw[a->buf] || (d->bufs[a->buf].grad != CAVS_GRAD_NONE && !d->bufs[a->src].grad)) {
      snprintf(err, errlen, "model '%s': a dropout read in place lies outside its input's buffer", d->name);
      return false;
    }
  }
  for (int t = 0; t < d->nvertex && ok; t++) {
    if (d->vertex[t].homes && m->bw[d->vertex[t].state] > m->home_w) m->home_w = m->bw[d->vertex[t].state];
    if (d->vertex[t].homes > m->nhomes) m->nhomes = d->vertex[t].homes;
  }
  for (int i = 0; i < d->ninputs && ok; i++)
    if (d->inputs[i].kind == CAVS_IN_REAL) ok = !cv_lin_checked(&d->inputs[i].width, c->dims, &m->rw[d->inputs[i].slot]);
  /* parameters and gradients; the lookup tables' row lists (the optimizer's moments are
     counted as they are made: cv_alloc_moments) */
  size_t bytes = 0;
  ok = ok && !__builtin_mul_overflow(*total, 2 * m->esize, &bytes) &&
       !__builtin_add_overflow(bytes, sparse_rows * (sizeof(int) + 1) + *nspans * 2 * sizeof(size_t), &bytes);
  if (!ok || bytes > cavs_memory_limit()) {
    if (ok)
      snprintf(err, errlen,
               "model '%s' needs %s for its parameters and gradients, more than the memory "
               "limit of %s (smaller dims, or raise the limit: --max-memory)",
               d->name, cv_bytes((char[CV_BYTES_LEN]){0}, bytes), cv_bytes((char[CV_BYTES_LEN]){0}, cavs_memory_limit()));
    else snprintf(err, errlen, "model '%s': its size overflows with these dims", d->name);
    errno = ENOMEM;
    return false;
  }
  m->model_bytes = bytes;
  return true;
}

/* The parameters' and gradients' flat blocks of `total` values (zeroed, on the backend),
 * each group's place in them, and the zero row a row without a home reads as its
 * home's gradient (homes, scheduler.c). */
static bool alloc_flat(cavs_model *m, size_t total, char *err, size_t errlen) {
  const cavs_desc *d = m->d;
  char why[sizeof m->alloc_why + 4];
  m->nflat = total;
  m->pflat = cv_alloc_zeroed(m, total * m->esize);
  m->gflat = cv_alloc_zeroed(m, total * m->esize);
  if (!m->pflat || !m->gflat) {
    bool lost = alloc_lost(m);
    if (lost) snprintf(err, errlen, "%s", m->err);
    else snprintf(err, errlen, "out of memory for %zu parameters%s", total, alloc_why(m, why, sizeof why));
    errno = lost ? EIO : ENOMEM;
    return false;
  }
  if (m->home_w) {
    if (!(m->hzero = m->be->alloc(m, (size_t)m->home_w * m->esize))) {
      bool lost = alloc_lost(m);
      if (lost) snprintf(err, errlen, "%s", m->err);
      else snprintf(err, errlen, "out of memory%s", alloc_why(m, why, sizeof why));
      errno = lost ? EIO : ENOMEM;
      return false;
    }
    m->be->zero(m, m->hzero, (size_t)m->home_w * m->esize);
  }
  NEW(m->param, d->npgroups, "parameter groups");
  NEW(m->pgrad, d->npgroups, "parameter groups");
  for (int g = 0; g < d->npgroups; g++) {
    m->param[g] = (char *)m->pflat + m->pg_off[g] * m->esize;
    m->pgrad[g] = (char *)m->gflat + m->pg_off[g] * m->esize;
  }
  m->ctx.param = m->param;
  m->ctx.pgrad = m->pgrad;
  return true;
}

/* The host arrays the passes and the steps index: the lookup tables' row lists, the
 * optimizer's `nspans` spans, the buffers', losses', inputs' and vertex types' tables,
 * the context's pointers into them. */
static bool alloc_tables(cavs_model *m, size_t nspans, char *err, size_t errlen) {
  const cavs_desc *d = m->d;
  cavs_ctx *c = &m->ctx;
  NEW(m->touched, d->npgroups, "lookup tables");
  NEW(m->ntouched, d->npgroups, "lookup tables");
  NEW(m->mark, d->npgroups, "lookup tables");
  for (int g = 0; g < d->npgroups; g++)
    if (d->pgroups[g].sparse_input >= 0) {
      NEW(m->touched[g], m->pg_rows[g], "lookup tables");
      NEW(m->mark[g], m->pg_rows[g], "lookup tables");
    }
  /* optim.c's spans ({offset, length} pairs): at most one a dense group and one a row of
     a lookup table */
  m->capspans = (int)(nspans < INT_MAX ? nspans : INT_MAX);
  if (!(m->spans = calloc(nspans, 2 * sizeof(size_t)))) {
    snprintf(err, errlen, "out of memory (optimizer)");
    errno = ENOMEM;
    return false;
  }
  NEW(m->val, d->nbufs, "buffers");
  NEW(m->grad, d->nbufs, "buffers");
  NEW(m->cval, d->nbufs, "buffers");
  NEW(m->cgrad, d->nbufs, "buffers");
  c->val = m->cval;
  c->grad = m->cgrad;
  NEW(m->loss, d->nlosses, "losses");
  NEW(m->loss_den, d->nlosses, "losses");
  c->loss = m->loss;
  NEW(m->iin, d->nint, "inputs");
  NEW(m->rin, d->nreal, "inputs");
  c->iin = (const int **)m->iin;
  c->rin = (const void **)m->rin;
  NEW(m->type_r0, d->nvertex, "vertex types");
  NEW(m->tview, d->nvertex, "vertex types");
  NEW(m->type_n, d->nvertex, "vertex types");
  NEW(m->type_leaf, d->nvertex, "vertex types");
  return true;
}
#undef NEW

cavs_model *cavs_model_new(const cavs_desc *d, const long *dims, char *err, size_t errlen) {
  return cavs_model_new_opts(d, dims, NULL, err, errlen);
}

cavs_model *cavs_model_new_opts(const cavs_desc *d, const long *dims, const cavs_model_opts *o, char *err,
                                size_t errlen) {
  if (!vertex_types_ok(d, err, errlen)) return NULL;
  const cv_backend *be = backend_for(d, o, err, errlen);
  long bound[CAVS_MAX_DIMS];
  if (!be || !dims_bound(d, dims, bound, err, errlen)) return NULL;
  cavs_model *m = calloc(1, sizeof *m);
  if (!m) {
    snprintf(err, errlen, "out of memory");
    errno = ENOMEM;
    return NULL;
  }
  m->d = d;
  m->be = be;
  m->esize = d->precision == CAVS_DOUBLE ? 8 : 4;
  m->grad_norm2 = -1; /* no step yet */
  m->carry_state = -1;
  cavs_ctx *c = &m->ctx;
  c->desc = d;
  c->model = m;
  for (int i = 0; i < d->ndims; i++) c->dims[i] = bound[i];
  for (int i = 0; i < d->noptions; i++) c->opt[i] = d->options[i].value;
  size_t total, nspans;
  if (!lay_out(m, &total, &nspans, err, errlen) || !alloc_flat(m, total, err, errlen) ||
      !alloc_tables(m, nspans, err, errlen)) {
    int e = errno;
    cavs_model_free(m);
    errno = e;
    return NULL;
  }
  c->keep = 1;
  m->cur_type = -1;
  m->maxc = 1;
  for (int v = 0; v < d->nvertex; v++) {
    if (d->vertex[v].children > m->maxc) m->maxc = d->vertex[v].children;
    m->has_edges = m->has_edges || d->vertex[v].edges;
  }
  m->maxc_fixed = m->maxc;
  c->maxc = m->maxc;
  c->loss_scale = 1;
  m->overlap = be->stream && !(o && o->one_stream);
  m->own_gemm = !(o && o->blas) && cv_sgemm_usable();
  m->small_gemm = !(o && o->blas) && cv_sgemm_small_usable();
  if (be->open(m, o)) {
    snprintf(err, errlen, "%s", m->err);
    cavs_model_free(m);
    return NULL;
  }
  return m;
}

void cavs_model_free(cavs_model *m) {
  if (!m) return;
  const cavs_desc *d = m->d;
  const cv_backend *be = m->be;
  cv_ptables_free(m);
  be->close(m);
  for (int b = 0; b < d->nbufs; b++) {
    be->release(m->val ? m->val[b] : NULL);
    be->release(m->grad ? m->grad[b] : NULL);
  }
  for (int i = 0; i < d->nint; i++) free(m->iin ? m->iin[i] : NULL);
  for (int i = 0; i < d->nreal; i++) free(m->rin ? m->rin[i] : NULL);
  free(m->val); free(m->grad); free(m->cval); free(m->cgrad); free(m->tview); free(m->bw); free(m->loss); free(m->loss_den);
  free(m->iin); free(m->rin); free(m->rw);
  be->release(m->pflat); be->release(m->gflat); be->release(m->m1); be->release(m->m2);
  be->release(m->hzero);
  be->release(m->carry);
  free(m->vcar);
  for (int k = 0; k < CAVS_MAX_HOMES; k++) {
    be->release(m->hdump[k]);
    free(m->hval[k]); free(m->hgrad[k]); free(m->hkey[k]);
  }
  free(m->spans);
  free(m->pg_off); free(m->frozen); free(m->pg_clean); free(m->pg_rows); free(m->pg_cols); free(m->param); free(m->pgrad);
  free(m->child); free(m->root); free(m->pushed); free(m->pred); free(m->gbase); free(m->gorder); free(m->gkey); free(m->xent_acc); free(m->kidx);
  free(m->type_r0); free(m->type_n); free(m->type_leaf);
  free(m->task_r0); free(m->task_n); free(m->task_type); free(m->task_leaf); free(m->task_level);
  free(m->task_cur); free(m->crow); free(m->tstate); free(m->vtask); free(m->urg); free(m->nkids); free(m->kid_off); free(m->kids); free(m->tcount);
  free(m->eoff); free(m->eparent); free(m->echild); free(m->rkey); free(m->rm_buf);
  cv_routes_free(m);
  free(m->plan); free(m->grad_last);
  free(m->level); free(m->row_of); free(m->pcount); free(m->padj); free(m->queue); free(m->vtype);
  free(m->count);
  for (int g = 0; g < d->npgroups; g++) {
    free(m->touched ? m->touched[g] : NULL);
    free(m->mark ? m->mark[g] : NULL);
  }
  free(m->touched);
  free(m->ntouched);
  free(m->mark);
  free(m);
}

/* Every per-row buffer (edge: every edge buffer) and its gradient made anew for `cap`
 * rows; -1 when one could not be had. */
static int alloc_bufs(cavs_model *m, bool edge, long cap) {
  const cavs_desc *d = m->d;
  for (int b = 0; b < d->nbufs; b++) {
    if ((bool)d->bufs[b].edge != edge) continue;
    size_t bytes = (size_t)cap * (size_t)m->bw[b] * m->esize;
    m->be->release(m->val[b]);
    m->val[b] = m->be->alloc(m, bytes);
    if (d->bufs[b].grad) {
      m->be->release(m->grad[b]);
      m->grad[b] = m->be->alloc(m, bytes);
    }
    m->cval[b] = m->val[b];
    m->cgrad[b] = m->grad[b];
    if (!m->val[b] || (d->bufs[b].grad && !m->grad[b])) return -1;
  }
  return 0;
}

/* The edge buffers (cavs_buf_desc.edge) for `edges` edges, grown by doubling; their
 * bytes and the rows' together held to the memory limit. */
/* The bytes an edge takes: its parent and child, and its row of each edge buffer. */
static size_t edge_bytes(const cavs_model *m) {
  const cavs_desc *d = m->d;
  size_t per = 2 * sizeof(int);
  for (int b = 0; b < d->nbufs; b++)
    if (d->bufs[b].edge) per += (size_t)m->bw[b] * m->esize * (d->bufs[b].grad ? 2 : 1);
  return per;
}

int cv_minibatch_bytes(const cavs_model *m, size_t *out) {
  size_t rows, edges;
  if (cavs_model_memory(m, m->cap_rows, NULL, &rows) || __builtin_mul_overflow(edge_bytes(m), (size_t)m->cap_edges, &edges) ||
      __builtin_add_overflow(rows, edges, out))
    return -1;
  return 0;
}

/* The bytes of m's rows as they are now (cap_rows of them); SIZE_MAX past a size_t */
static size_t rows_now(const cavs_model *m, size_t *rows) {
  if (cavs_model_memory(m, m->cap_rows, NULL, rows)) *rows = SIZE_MAX;
  return *rows;
}

/* Whether cap edges of per bytes fit under the limit beside the rows' bytes and the model */
static bool edges_fit(const cavs_model *m, size_t per, size_t rows, long cap) {
  size_t need;
  return !__builtin_mul_overflow(per, (size_t)cap, &need) && !__builtin_add_overflow(need, rows, &need) &&
         !__builtin_add_overflow(need, m->model_bytes, &need) && need <= cavs_memory_limit();
}

/* Whether cap rows fit under the limit beside the model */
static bool rows_fit(const cavs_model *m, long cap) {
  size_t need;
  return !cavs_model_memory(m, cap, NULL, &need) && !__builtin_add_overflow(need, m->model_bytes, &need) &&
         need <= cavs_memory_limit();
}

int cv_grow_edges(cavs_model *m, long edges) {
  if (edges <= m->cap_edges) return 0;
  double t0 = cv_now();
  long cap = m->cap_edges ? m->cap_edges : 256;
  while (cap < edges) cap *= 2;
  size_t per = edge_bytes(m), rows = 0;
  /* (the doubled capacity where it fits under the limit, else as many as the minibatch
     has: a minibatch that fits is not refused for the capacity's rounding) */
  if (!edges_fit(m, per, rows_now(m, &rows), cap)) cap = edges;
  if (!edges_fit(m, per, rows, cap))
    return cv_fail_mem(m, "a minibatch of %ld edges needs %s (%zu bytes an edge) besides its vertices' and the "
                       "model's, more than the memory limit of %s (a smaller --batch, or raise --max-memory)",
                       edges, cv_bytes((char[CV_BYTES_LEN]){0}, per * (size_t)edges), per,
                       cv_bytes((char[CV_BYTES_LEN]){0}, cavs_memory_limit()));
  if (alloc_bufs(m, true, cap)) {
    m->cap_edges = 0;
    return cv_fail_mem(m, "out of memory for %ld edges", edges);
  }
  if (cv_grow(m, &m->eparent, sizeof(int), (size_t)cap) || cv_grow(m, &m->echild, sizeof(int), (size_t)cap)) {
    m->cap_edges = 0;
    return -1;
  }
  m->cap_edges = cap;
  m->stats.grow_seconds += cv_now() - t0;
  return 0;
}

int cv_grow_rows(cavs_model *m, int rows) {
  if (rows <= m->cap_rows) return 0;
  double t0 = cv_now();
  long cap = m->cap_rows ? m->cap_rows : 256;
  while (cap < rows) cap *= 2;
  if (cap > INT_MAX) cap = rows;
  size_t per = 0;
  if (!rows_fit(m, cap)) cap = rows; /* (as for the edges: the minibatch's own, if they fit) */
  if (!rows_fit(m, cap)) {
    row_bytes(m, &per);
    return cv_fail_mem(m,
                   "a minibatch of %d vertices needs %s (%zu bytes a vertex) besides the model's %s, "
                   "more than the memory limit of %s (a smaller --batch, or raise --max-memory)",
                   rows, cv_bytes((char[CV_BYTES_LEN]){0}, per * (size_t)rows), per,
                   cv_bytes((char[CV_BYTES_LEN]){0}, m->model_bytes), cv_bytes((char[CV_BYTES_LEN]){0}, cavs_memory_limit()));
  }
  const cavs_desc *d = m->d;
  if (alloc_bufs(m, false, cap)) {
    m->cap_rows = 0; /* what is left is smaller than it says: grow all of it next time */
    return cv_fail_mem(m, "out of memory for %d rows", rows);
  }
  int fail = 0;
  for (int i = 0; i < d->nint; i++) fail |= cv_grow(m, &m->iin[i], sizeof(int), (size_t)cap);
  for (int i = 0; i < d->nreal; i++) fail |= cv_grow(m, &m->rin[i], (size_t)m->rw[i] * m->esize, (size_t)cap);
  fail |= cv_grow(m, &m->child, sizeof(int) * (size_t)m->maxc, (size_t)cap);
  fail |= cv_grow(m, &m->root, 1, (size_t)cap);
  fail |= cv_grow(m, &m->pushed, 1, (size_t)cap);
  fail |= cv_grow(m, &m->pred, sizeof(int), (size_t)cap);
  fail |= cv_grow(m, &m->rkey, sizeof(uint64_t), (size_t)cap);
  for (int k = 0; k < m->nhomes; k++) {
    fail |= cv_grow(m, &m->hval[k], sizeof(void *), (size_t)cap);
    fail |= cv_grow(m, &m->hgrad[k], sizeof(void *), (size_t)cap);
    fail |= cv_grow(m, &m->hkey[k], sizeof(long), (size_t)cap);
    m->be->release(m->hdump[k]);
    m->hdump[k] = NULL; /* (not released twice when an earlier grow failed) */
    if (!fail && !(m->hdump[k] = m->be->alloc(m, (size_t)cap * (size_t)m->home_w * m->esize)))
      fail = cv_fail_mem(m, "out of memory for %d rows", rows);
    m->ctx.home_val[k] = m->hval[k];
    m->ctx.home_grad[k] = m->hgrad[k];
  }
  m->ctx.rkey = m->rkey;
  m->ctx.child = m->child;
  m->ctx.root = m->root;
  m->ctx.pushed = m->pushed;
  m->ctx.pred = m->pred;
  if (fail) {
    m->cap_rows = 0;
    return -1;
  }
  m->cap_rows = (int)cap;
  m->stats.grow_seconds += cv_now() - t0;
  return 0;
}

const cavs_desc *cavs_model_desc(const cavs_model *m) { return m->d; }
const char *cavs_model_error(const cavs_model *m) { return m->err; }
long cavs_model_dim(const cavs_model *m, int dim) { return m->ctx.dims[dim]; }

int cavs_option_find(const cavs_desc *d, const char *name) {
  for (int i = 0; name && i < d->noptions; i++)
    if (!strcmp(d->options[i].name, name)) return i;
  return -1;
}
int cavs_model_set_option(cavs_model *m, const char *name, double value) {
  const cavs_desc *d = m->d;
  int k = cavs_option_find(d, name);
  if (k < 0) {
    if (!d->noptions) return cv_fail(m, "model '%s' has no option '%s' (it declares none)", d->name, name ? name : "");
    return cv_fail(m, "model '%s' has no option '%s' (it has %s%s)", d->name, name ? name : "", d->options[0].name,
                   d->noptions > 1 ? " and others: cavs_desc.options" : "");
  }
  if (d->options[k].kind == CAVS_OPTION_CLIP && !cavs_option_value_ok(CAVS_OPTION_CLIP, value))
    return cv_fail(m, "option %s is a gradient-norm clip: %g is not in [0, %g]", name, value, CAVS_MAX_CLIP);
  if (d->options[k].kind == CAVS_OPTION_BALANCE && !cavs_option_value_ok(CAVS_OPTION_BALANCE, value))
    return cv_fail(m, "option %s is a load-balancing loss's weight: %g is not in [0, %g]", name, value, CAVS_MAX_CLIP);
  if (d->options[k].kind == CAVS_OPTION_DROPOUT && !cavs_option_value_ok(CAVS_OPTION_DROPOUT, value))
    return cv_fail(m, "option %s is a dropout probability: %g is not in [0, 1)", name, value);
  m->ctx.opt[k] = value;
  return 0;
}
double cavs_model_option(const cavs_model *m, int k) { return m->ctx.opt[k]; }
double cv_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void cavs_model_set_policy(cavs_model *m, int policy) {
  if (policy >= CAVS_BFS && policy <= CAVS_FRONTIER) m->policy = policy;
}
void cavs_model_set_ablations(cavs_model *m, int flags) { m->ablate = flags; }

void cavs_model_set_targets_only(cavs_model *m, int on) { m->targets_only = on != 0; }

void cavs_model_set_inference(cavs_model *m, int on) {
  m->ctx.keep = !on;
  cv_ptables_free(m); /* the parameters may have changed since they were made */
}

int cavs_model_poison(cavs_model *m) {
  const cavs_desc *d = m->d;
  for (int b = 0; b < d->nbufs; b++) {
    size_t n = (size_t)(d->bufs[b].edge ? m->cap_edges : m->cap_rows) * (size_t)m->bw[b];
    unsigned char *nan = malloc(n * m->esize + 1);
    if (!nan) return cv_fail_mem(m, "out of memory");
    for (size_t i = 0; i < n; i++)
      if (m->esize == 8) ((double *)(void *)nan)[i] = NAN;
      else ((float *)(void *)nan)[i] = NAN;
    int rc = cavs_model_write(m, m->val[b], nan, n * m->esize);
    if (!rc && m->grad[b]) rc = cavs_model_write(m, m->grad[b], nan, n * m->esize);
    free(nan);
    if (rc) return -1;
  }
  return 0;
}

static void *param_at(cavs_model *m, void *const *base, int i, long *rows, long *cols, long *ld) {
  const cavs_param_desc *p = &m->d->params[i];
  long off = cv_lin(&p->col_off, m->ctx.dims);
  if (rows) *rows = cv_lin(&p->rows, m->ctx.dims);
  if (cols) *cols = cv_lin(&p->cols, m->ctx.dims);
  if (ld) *ld = m->pg_cols[p->group];
  return (char *)base[p->group] + (size_t)off * m->esize;
}

void *cavs_model_param(cavs_model *m, int i, long *rows, long *cols, long *ld) {
  return param_at(m, m->param, i, rows, cols, ld);
}

void *cavs_model_grad(cavs_model *m, int i, long *rows, long *cols, long *ld) {
  return param_at(m, m->pgrad, i, rows, cols, ld);
}

void *cavs_model_params_flat(cavs_model *m, size_t *count) {
  *count = m->nflat;
  return m->pflat;
}

void *cavs_model_grads_flat(cavs_model *m, size_t *count) {
  *count = m->nflat;
  return m->gflat;
}

/* ---- initialization: splitmix64, deterministic in the seed and the parameter order ---- */

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) { return (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0); }

/* Parameter p's value at (r, col), drawn from s (in row-major order: the same values on
   every backend and for any blocking of the rows) */
static double init_value(const cavs_param_desc *p, uint64_t *s, long r, long col, double lim, long side, long cols) {
  switch (p->init) {
  case CAVS_INIT_ZEROS: return 0;
  case CAVS_INIT_CONSTANT: return p->a;
  case CAVS_INIT_UNIFORM: return p->a + (p->b - p->a) * uniform01(s);
  case CAVS_INIT_XAVIER:
  case CAVS_INIT_XAVIER_ROWS: return -lim + 2 * lim * uniform01(s);
  case CAVS_INIT_NORMAL:
  case CAVS_INIT_IDENTITY:
  case CAVS_INIT_IDENTITY_ROWS: {
    double u1 = uniform01(s), u2 = uniform01(s);
    if (u1 < 1e-300) u1 = 1e-300;
    double z = sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
    if (p->init == CAVS_INIT_NORMAL) return p->a + p->b * z;
    if (p->init == CAVS_INIT_IDENTITY) return (col == r ? p->a : 0) + p->b * z;
    return (side * side == cols && col / side == col % side ? p->a : 0) + p->b * z;
  }
  }
  return 0;
}

/* XAVIER_ROWS: a row is a matrix [a, b], its columns the product dim a * b */
static double xavier_rows_lim(const cavs_model *m, const cavs_param_desc *p, double whole) {
  const cavs_desc *d = m->d;
  for (int i = 0; i < d->ndims && i < CAVS_MAX_DIMS; i++) {
    if (p->cols.c[i] != 1 || d->dims[i].kind != CAVS_DIM_PRODUCT) continue;
    long a = m->ctx.dims[d->dims[i].a], b = m->ctx.dims[d->dims[i].b];
    if (a > 0 && b > 0) return sqrt(6.0 / (double)(a + b));
  }
  return whole;
}

void cavs_model_init(cavs_model *m, uint64_t seed) {
  const cavs_desc *d = m->d;
  m->drop_seed = seed;
  cv_ptables_free(m);
  uint64_t s = seed;
  /* Values are made on the host and uploaded a block of rows at a time, one copy a
     block (a parameter's rows lie ld apart in its group's): a copy a row made the host
     wait for the device a row, 16 thousand times for SST's vocabulary. A row longer
     than the block goes up in pieces. Without the heap's block, a small one on the
     stack does (cavs_model_init cannot fail). */
  enum { BLOCK = 1 << 20 };
  union {
    double d[1024];
    float f[2048];
  } small;
  char *heap = malloc(BLOCK), *buf = heap ? heap : (char *)&small;
  size_t cap = heap ? BLOCK : sizeof small, es = m->esize;
  for (int i = 0; i < d->nparams; i++) {
    const cavs_param_desc *p = &d->params[i];
    long rows, cols, ld;
    char *base = cavs_model_param(m, i, &rows, &cols, &ld);
    double lim = sqrt(6.0 / (double)(rows + cols));
    if (p->init == CAVS_INIT_XAVIER_ROWS) lim = xavier_rows_lim(m, p, lim);
    long side = (long)sqrt((double)cols); /* IDENTITY_ROWS: a row is a side x side matrix */
    while (side * side > cols) side--;
    while ((side + 1) * (side + 1) <= cols) side++;
    if (rows <= 0 || cols <= 0) continue;
    size_t row = (size_t)cols * es;
    long per = row <= cap ? (long)(cap / row) : 0; /* whole rows a block */
    /* a placed table's rows of other processes' experts: their values drawn (every
       process draws the same sequence) but not written, their memory never touched */
    long held0, held1;
    cv_experts_rows_held(m, p->group, &held0, &held1);
    for (long r0 = 0; r0 < rows;) {
      long nr = per ? (rows - r0 < per ? rows - r0 : per) : 1;
      long piece = per ? cols : (long)(cap / es);
      for (long j0 = 0; j0 < cols; j0 += piece) {
        long len = cols - j0 < piece ? cols - j0 : piece;
        for (long r = r0; r < r0 + nr; r++)
          for (long j = j0; j < j0 + len; j++) {
            double v = init_value(p, &s, r, j, lim, side, cols);
            size_t at = (size_t)(r - r0) * (size_t)len + (size_t)(j - j0);
            if (es == 8) ((double *)buf)[at] = v;
            else ((float *)buf)[at] = (float)v;
          }
        long u0 = r0 > held0 ? r0 : held0, u1 = r0 + nr < held1 ? r0 + nr : held1;
        char *dst = base + ((size_t)u0 * (size_t)ld + (size_t)j0) * es, *src = buf + (size_t)(u0 - r0) * (size_t)len * es;
        /* (a failed copy is the model's failure, which the next pass reports) */
        if (u1 - u0 == 1) (void)m->be->upload(m, dst, src, (size_t)len * es);
        else if (u1 > u0)
          (void)m->be->upload2d(m, dst, (size_t)ld * es, src, (size_t)len * es, (size_t)len * es, (size_t)(u1 - u0));
      }
      r0 += nr;
    }
  }
  free(heap);
  cv_release_moments(m);
  m->step = 0;
  cv_experts_new_params(m); /* (a replica's copy made before is stale now) */
}

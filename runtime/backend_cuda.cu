/* backend_cuda.cu: the CUDA backend: a model's state in cudaMalloc'ed memory (no managed
 * memory), the products through cuBLAS, and kernels for the rest. Built as its own
 * module (cavs-cuda.so, when configure finds nvcc) that backend.c loads when a model
 * asks for "cuda", so a CPU-only build or install never links the CUDA libraries.
 *
 * Streams: a pass's stages go to two streams of the model's own (created blocking, so
 * that the legacy default stream, where the clears, copies and the optimizer step go, is
 * a barrier to both); the scheduler puts the eager phase on the second and orders the
 * two with the events here (backend.h, scheduler.c). cuBLAS is pointed at the stage's
 * stream before each product.
 *
 * The host waits for the device once a training step: in the forward pass's
 * `synchronize`, which reads the losses and predictions back (and a mixture of
 * experts' counts: its rows are routed on the device, below). Everything else the host
 * sends or fetches per minibatch goes through pinned buffers by copies on the stream
 * (the schedule, the rows zero_rows clears, the optimizer's spans), none of which
 * waits: a pinned buffer is written again only after the host has waited for the copy
 * that read it (Dev.busy), and the clip norm stays on the device. Allocations happen
 * only when a buffer grows. The per-element formulas and the thread-to-cell map are
 * arith.h's, the ones the CPU backend runs and the tests check on the CPU.
 *
 * Every CUDA and cuBLAS call is checked: a failure is recorded in the model (file, line,
 * CUDA's own message) and reported by the next call that returns a status (a forward
 * pass, a step); the library never exits. */
#include "arith.h"
#include "cv.h"
#include "forms.h"
#include "moe.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* every launch is CAVS_CUDA_LAUNCH (cavs_abi.h), blocks of CAVS_CUDA_BLOCK threads, or
   CAVS_CUDA_LAUNCH_THREADS (below) with fewer: the one construct of CUDA C++ that a host
   compiler cannot read, in a macro, so that the tests compile this file unchanged
   against their emulated CUDA (tests/cuda_emu.h, which defines both) */
enum { THREADS = CAVS_CUDA_BLOCK };

/* A launch of blocks of `threads` threads (at most THREADS): the losses' (loss_threads) */
#ifndef CAVS_CUDA_LAUNCH_THREADS
#define CAVS_CUDA_LAUNCH_THREADS(kernel, blocks, threads, stream) kernel<<<(blocks), (threads), 0, (stream)>>>
#endif

/* The backend's state of one model (m->bs). */
struct Dev {
  cublasHandle_t blas;
  bool failed;
  int errnum; /* errno for the failure (record) */
  cudaStream_t st[2]; /* a pass's two streams; ctx.stream is the current one */
  cudaEvent_t ev[CV_EVENTS];
  /* with graphs: each pass captured from stream 0 and launched whole; the executable
     graph of the last forward and backward pass, updated in place when the new one
     has its shape, else made again */
  bool graphs, capturing;
  cudaGraphExec_t exec[2];
  /* [nvertex]: a vertex type whose rows a pass ran kernel by kernel. A model that
     routes captures a pass only when every type with rows in it is one: a routing's
     arrays are made at its first stage, which a captured pass cannot do, and each type
     (its pull block's rows with it) runs its routings wherever it has rows */
  unsigned char *ran;
  /* the pinned buffers a copy issued since the host last waited may still read (PIN_*
     bits): written again only after a wait (pinned_for_host) */
  unsigned busy;
  /* the schedule: packed into one pinned host buffer and sent in one copy to one device
     buffer, both grown to the largest minibatch; the pointers point into the device's */
  size_t cap;
  char *pack_host, *pack_dev;
  int *child;
  unsigned char *root, *pushed;
  int *rowvert;               /* the vertex of each row (dropout's keys are drawn from it) */
  int *eoff, *eparent, *echild; /* a set's edges (cavs_ctx's, on the device) */
  /* each row's homes and their gradients (cavs_ctx's, on the device), and where each
     home is (plan_homes' keys) */
  void **hval[CAVS_MAX_HOMES], **hgrad[CAVS_MAX_HOMES];
  long *hkey[CAVS_MAX_HOMES];
  int **iin;  /* host array of device arrays, [nint] */
  void **rin; /* host array of device arrays, [nreal] */
  /* what a forward pass leaves for the host, in one device buffer (out_dev) read back
     in one copy into its pinned mirror by synchronize (fresh: a forward pass has not
     been read back yet): the sums and counts of each loss, then what the first
     classifier predicts at each row */
  char *out_dev, *out_host;
  size_t capout;
  bool fresh;
  double *sum;                        /* [nlosses] */
  unsigned long long *cnt;            /* [nlosses * 4]: count, correct, root_count, root_correct */
  int *pred;                          /* [rows] */
  /* the rows zero_rows clears, through pinned memory: each call of a pass its own part
     (from rows_at), the parts reused once the host has waited */
  int *rows, *rows_host;
  int caprows, rows_at;
  /* an optimizer step's spans (their offsets, then their starts in their
     concatenation), sent when they differ from the last step's; and the clip norm */
  int capspans, nspans_sent; /* -1: none sent */
  size_t *spans_dev, *spans_host, *spans_new;
  double *norm2, *norm2_host; /* (pinned: the tracked norm comes back with the step) */
  double *norm_parts;         /* decay_norm's sums, two a thread, [2 capparts] */
  size_t capparts;
  /* a mixture of experts (below): per route (K and X as it last ran: the schedule sizes
     it for a minibatch before a graph's pass), each row's choices and slots and each
     slot's expert ([cap] each), each row's routing's rows ([caprows]), a stage's rows'
     whole softmax ([caprows * capx], the balancing loss's), a stage's count per expert
     and, for its counting sort, per expert and tile of its choices ([tcap]), the
     pass's load and balancing counts (acc: [2 capx]) and summed probabilities
     ([capx]), read back by the forward pass's synchronize (pending) into acc_host
     (pinned), and the shares the balancing loss's gradient reads ([capx], made once a
     backward pass) */
  struct {
    int K;
    long X;
    int *rslot, *sexp, *ch;
    long cap;
    int *rb, *re;
    double *p;
    long caprows;
    int *cnt, *tcnt;
    long tcap;
    long long *acc;
    double *psum, *f;
    long long *acc_host;
    long capx;
    unsigned f_pass;
    bool f_made, pending;
  } route[CV_MAX_ROUTES];
};
enum { PIN_PACK = 1, PIN_ROWS = 2, PIN_SPANS = 4 };

static Dev *dev(cavs_model *m) { return (Dev *)m->bs; }

/* Where in this file a failure was found, after the message a user acts on ("cuda:
   cudaMalloc of 2088 bytes: out of memory (backend_cuda.cu:384)"): for a bug report, not
   in front of it, where a `file:line:` reads as a place in the user's own files. */
#define WHERE_FMT "(%s:%d)"
static const char *base_name(const char *file) {
  const char *slash = strrchr(file, '/');
  return slash ? slash + 1 : file;
}

/* The first failure, in the model's message, and what errno says of it when a call
   returns it (status): ENOMEM when the device's memory ran out, EIO for a device that
   failed (a fault, a lost device), EINVAL for a model the backend cannot run. */
static void record(cavs_model *m, int errnum, const char *file, int line, const char *fmt, ...) {
  Dev *d = dev(m);
  /* the pass issues nothing more, and the step after it refuses (as a pass that failed
     on the host: backend.c, DEAD; scheduler.c clears it at the next forward pass) */
  m->launch_failed = true;
  cv_errno(m, d && d->failed ? d->errnum : errnum);
  if (d && d->failed) return; /* the first failure is the one to report */
  if (d) d->errnum = errnum;
  char what[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  snprintf(m->err, sizeof m->err, "cuda: %s " WHERE_FMT, what, base_name(file), line);
  if (d) d->failed = true;
}

/* libcavs's own helpers are not exported to a module: this one says it in the model */
static int no_memory(cavs_model *m) {
  snprintf(m->err, sizeof m->err, "out of host memory (CUDA backend)");
  errno = ENOMEM;
  return -1;
}

/* -1 with errno saying what failed, once anything has: what a call returns */
static int status(const Dev *d) {
  if (!d->failed) return 0;
  errno = d->errnum;
  return -1;
}

/* The message names the call (the macro argument's text up to its parenthesis). A
   call's error is also the runtime's last error until cudaGetLastError reads it: read
   here, so that the next launch's check (CKL) does not blame itself for it, in this
   model or the next one the process makes. */
#define CK(m, call)                                                                         \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      (void)cudaGetLastError();                                                            \
      record((m), e_ == cudaErrorMemoryAllocation ? ENOMEM : EIO, __FILE__, __LINE__, "%.*s: %s",          \
             (int)strcspn(#call, "("), #call, cudaGetErrorString(e_));                                     \
    }                                                                                      \
  } while (0)
/* the same for an allocation, by its size (out of memory: what a user can change) */
#define CKA(m, call, bytes)                                                                 \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      (void)cudaGetLastError();                                                            \
      record((m), e_ == cudaErrorMemoryAllocation ? ENOMEM : EIO, __FILE__, __LINE__, "%.*s of %zu bytes: %s", \
             (int)strcspn(#call, "("), #call, (size_t)(bytes), cudaGetErrorString(e_));                     \
    }                                                                                      \
  } while (0)
/* (a product whose kernel failed to launch leaves the runtime's last error set too:
   read here, as CK does, so that the next launch's check does not blame itself) */
#define CKB(m, call)                                                                        \
  do {                                                                                     \
    cublasStatus_t s_ = (call);                                                            \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                      \
      (void)cudaGetLastError();                                                            \
      record((m), s_ == CUBLAS_STATUS_ALLOC_FAILED ? ENOMEM : EIO, __FILE__, __LINE__, "%.*s: %s",         \
             (int)strcspn(#call, "("), #call, cublasGetStatusString(s_));                                  \
    }                                                                                      \
  } while (0)
/* after a launch: counted, and checked */
#define CKL(m)                                                                              \
  do {                                                                                     \
    (m)->stats.launches++;                                                                 \
    CK(m, cudaGetLastError());                                                             \
  } while (0)

/* the grid over `cells` elements (UINT32_MAX past what a grid holds: the launch fails
   loudly), and the row and column of this thread among rows [r0, r0 + n) of width w */
static unsigned blocks(long cells) { return cavs_cuda_blocks(cells, 1, THREADS); }
__device__ static bool cell(long r0, long n, long w, long *r, long *j) {
  if (!cavs_cuda_cell(blockIdx.x, blockDim.x, threadIdx.x, n, w, r, j)) return false;
  *r += r0;
  return true;
}
static bool dbl(const cavs_ctx *c) { return c->desc->precision == CAVS_DOUBLE; }
/* the stream a stage issues to */
static cudaStream_t on(const cavs_ctx *c) { return (cudaStream_t)c->stream; }
static cavs_model *model(cavs_ctx *c) { return c->model; }

/* ---- identity ---- */

static int cuda_probe(char *msg, size_t len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(msg, len, "no CUDA device can be used: %s", cudaGetErrorString(e));
    return -1;
  }
  if (n == 0) {
    snprintf(msg, len, "no CUDA device on this machine");
    return -1;
  }
  if (len) *msg = 0;
  return 0;
}

static int cuda_open(cavs_model *m, const cavs_model_opts *o) {
  Dev *d = (Dev *)calloc(1, sizeof *d);
  if (!d) return no_memory(m);
  m->bs = d;
  const cavs_desc *ds = m->d;
  d->nspans_sent = -1;
  d->iin = (int **)calloc((size_t)ds->nint + 1, sizeof *d->iin);
  d->rin = (void **)calloc((size_t)ds->nreal + 1, sizeof *d->rin);
  d->ran = (unsigned char *)calloc((size_t)ds->nvertex + 1, 1);
  if (!d->iin || !d->rin || !d->ran) return no_memory(m);
  CKB(m, cublasCreate(&d->blas));
  for (int s = 0; s < 2; s++) CK(m, cudaStreamCreate(&d->st[s]));
  for (int e = 0; e < CV_EVENTS; e++) CK(m, cudaEventCreateWithFlags(&d->ev[e], cudaEventDisableTiming));
  m->ctx.stream = d->st[0];
  d->graphs = o && o->graphs;
  CK(m, cudaMalloc(&d->norm2, 2 * sizeof(double)));
  CK(m, cudaMallocHost(&d->norm2_host, sizeof(double)));
  return status(d);
}

static void cuda_close(cavs_model *m) {
  Dev *d = dev(m);
  (void)cudaDeviceSynchronize(); /* what was queued has run (or failed for good) before anything is freed */
  if (!d) return;
  for (int p = 0; p < 2; p++)
    if (d->exec[p]) cudaGraphExecDestroy(d->exec[p]);
  if (d->blas) cublasDestroy(d->blas);
  for (int e = 0; e < CV_EVENTS; e++)
    if (d->ev[e]) cudaEventDestroy(d->ev[e]);
  for (int s = 0; s < 2; s++)
    if (d->st[s]) cudaStreamDestroy(d->st[s]);
  cudaFreeHost(d->pack_host);
  cudaFree(d->pack_dev);
  cudaFreeHost(d->out_host);
  cudaFree(d->out_dev);
  cudaFreeHost(d->rows_host);
  cudaFree(d->rows);
  free(d->iin);
  free(d->rin);
  free(d->ran);
  free(d->spans_new);
  cudaFreeHost(d->spans_host);
  cudaFree(d->spans_dev);
  cudaFree(d->norm2);
  cudaFree(d->norm_parts);
  cudaFreeHost(d->norm2_host);
  for (int i = 0; i < CV_MAX_ROUTES; i++) {
    cudaFree(d->route[i].rslot);
    cudaFree(d->route[i].sexp);
    cudaFree(d->route[i].ch);
    cudaFree(d->route[i].rb);
    cudaFree(d->route[i].re);
    cudaFree(d->route[i].p);
    cudaFree(d->route[i].cnt);
    cudaFree(d->route[i].tcnt);
    cudaFree(d->route[i].acc);
    cudaFree(d->route[i].psum);
    cudaFree(d->route[i].f);
    cudaFreeHost(d->route[i].acc_host);
  }
  free(d);
  m->bs = NULL;
}

/* ---- memory ---- */

static void *cuda_alloc(cavs_model *m, size_t bytes) {
  void *p = NULL;
  /* cudaMalloc aligns to 256 bytes */
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e == cudaSuccess) return p;
  snprintf(m->alloc_why, sizeof m->alloc_why, "cudaMalloc of %zu bytes: %s", bytes, cudaGetErrorString(e));
  (void)cudaGetLastError(); /* said here (or not an error: inference's product tables), as CK does */
  /* not for want of memory: the device failed (a fault before, a lost device), which
     the model reports (its first failure), not "out of memory" */
  if (e != cudaErrorMemoryAllocation) {
    record(m, EIO, __FILE__, __LINE__, "%s", m->alloc_why);
    m->alloc_lost = true;
  }
  return NULL;
}
/* Work queued before may still use it (a memset of the model's making, the last pass's
   reads of the product tables), and cudaFree need not wait for it: wait first. Not in a
   training step: buffers are freed when they grow, and with the model. */
static void cuda_release(void *p) {
  if (!p) return;
  (void)cudaDeviceSynchronize(); /* (an error of queued work is the next checked call's) */
  cudaFree(p);
}
static void cuda_zero(cavs_model *m, void *p, size_t bytes) {
  CK(m, cudaMemsetAsync(p, 0, bytes, (cudaStream_t)m->ctx.stream));
}
/* A synchronous copy returns the errors of the work queued before it too (a kernel's
   fault): said in the model, by the copy's name, and never taken for a launch's. The
   result is this copy's: a model that failed before (its memory ran out) still copies. */
static int copied(cavs_model *m, cudaError_t e, const char *call) {
  if (e == cudaSuccess) return 0;
  (void)cudaGetLastError();
  record(m, e == cudaErrorMemoryAllocation ? ENOMEM : EIO, __FILE__, __LINE__, "%s: %s", call, cudaGetErrorString(e));
  return -1;
}
static int cuda_upload(cavs_model *m, void *dst, const void *src, size_t bytes) {
  return copied(m, cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}
static int cuda_download(cavs_model *m, void *dst, const void *src, size_t bytes) {
  return copied(m, cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}
/* pinned: a copy from or to it runs at the bus's rate, without the driver staging it
   through a pinned buffer of its own a piece at a time */
static void *cuda_host_alloc(size_t bytes) {
  void *p = NULL;
  return cudaMallocHost(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}
static void cuda_host_free(void *p) {
  if (p) (void)cudaFreeHost(p);
}
static int cuda_upload2d(cavs_model *m, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t rows) {
  return copied(m, cudaMemcpy2D(dst, dpitch, src, spitch, width, rows, cudaMemcpyHostToDevice), "cudaMemcpy2D");
}

/* The host waits for everything issued (both streams and the legacy one): the copies
   that read the pinned buffers have run, so they may be written again. */
static void wait_device(cavs_model *m) {
  Dev *d = dev(m);
  CK(m, cudaDeviceSynchronize());
  d->busy = 0;
  d->rows_at = 0;
}
/* Before the host writes the pinned buffers `pins`: a copy issued from one since the
   host last waited may not have run (it reads the bytes when it runs), so wait. In
   training a forward pass's synchronize comes between two uses of each: no wait. */
static void pinned_for_host(cavs_model *m, unsigned pins) {
  if (dev(m)->busy & pins) wait_device(m);
}

/* grows a device array to bytes (contents not kept). Work queued before may still read
   the old one (zero_rows' launch of the step before), and cudaFree need not wait for it
   (its documentation says it may synchronize, not that it does): wait first. Growth is
   rare: buffers only grow. */
static void regrow(cavs_model *m, void **p, size_t bytes) {
  if (*p) wait_device(m);
  cudaFree(*p);
  *p = NULL;
  CKA(m, cudaMalloc(p, bytes ? bytes : 1), bytes);
}
/* the same for a pinned host buffer (the copies that read it have run after a wait) */
static void regrow_pinned(cavs_model *m, void **p, size_t bytes) {
  if (*p) wait_device(m);
  cudaFreeHost(*p);
  *p = NULL;
  CKA(m, cudaMallocHost(p, bytes ? bytes : 1), bytes);
}

/* Rows rows[0..n) of a block of `row`-byte rows to zero: one launch, a thread a 4-byte
   word (rows of a float or double table are whole words). */
__global__ void zero_rows_k(unsigned *base, size_t words, const int *rows, int n) {
  long r, j;
  if (!cavs_cuda_cell(blockIdx.x, blockDim.x, threadIdx.x, n, (long)words, &r, &j)) return;
  base[(size_t)rows[r] * words + (size_t)j] = 0;
}

/* The rows go up by a copy on the stream from the pinned buffer's next free part: a
   pass clears several tables before the host waits. */
static int cuda_zero_rows(cavs_model *m, void *base, size_t row, const int *rows, int n) {
  Dev *d = dev(m);
  if (n <= 0) return 0;
  if (n > d->caprows - d->rows_at) {
    /* room for the parts of this pass so far and this one (the tables of the next pass
       then fit); growing waits, which frees every part */
    long need = (long)d->rows_at + n, cap = need > 2L * d->caprows ? need : 2L * d->caprows;
    if (cap > INT_MAX) return no_memory(m);
    d->caprows = 0; /* (nothing held while it grows: a failed growth leaves none) */
    regrow(m, (void **)&d->rows, sizeof(int) * (size_t)cap);
    regrow_pinned(m, (void **)&d->rows_host, sizeof(int) * (size_t)cap);
    if (d->failed) return status(d);
    d->caprows = (int)cap;
  }
  int *h = d->rows_host + d->rows_at, *dv = d->rows + d->rows_at;
  memcpy(h, rows, sizeof(int) * (size_t)n);
  d->rows_at += n;
  /* on the legacy stream: between passes, after both streams */
  CK(m, cudaMemcpyAsync(dv, h, sizeof(int) * (size_t)n, cudaMemcpyHostToDevice, 0));
  d->busy |= PIN_ROWS;
  size_t words = row / 4;
  CAVS_CUDA_LAUNCH(zero_rows_k, cavs_cuda_blocks(n, (long)words, THREADS), 0)((unsigned *)base, words, dv, n);
  CKL(m);
  return status(d);
}

/* Where each array of the schedule sits in the packed buffer: 16-byte aligned (every
   array's element size divides it), so that the copy is the schedule's bytes. */
enum { PACK_ALIGN = 16 };
static size_t place(size_t *at, size_t bytes) {
  size_t here = *at;
  *at += (bytes + PACK_ALIGN - 1) & ~(size_t)(PACK_ALIGN - 1);
  return here;
}

/* The bytes of what a forward pass leaves for the host (out_dev) for `rows` rows. */
static size_t out_bytes(const cavs_model *m, size_t rows) {
  size_t nl = (size_t)m->d->nlosses;
  return sizeof(double) * nl + sizeof(unsigned long long) * 4 * nl + sizeof(int) * rows;
}

/* a mixture of experts' routes (below) */
static void routes_sized(cavs_model *m);
static void route_stats_issue(cavs_model *m);
static void route_stats_read(cavs_model *m);

/* Where each of the minibatch's arrays lies in the one packed copy up (cuda_schedule):
   offsets into pack_host and pack_dev, and the whole's bytes. */
struct PackLayout {
  size_t N, E, NH; /* rows, edges, rows a home pointer array holds */
  size_t child, root, pushed, rowvert, eoff, eparent, echild;
  size_t hval[CAVS_MAX_HOMES], hgrad[CAVS_MAX_HOMES], hkey[CAVS_MAX_HOMES];
  size_t iin, rin, bytes;
};

static void pack_layout(const cavs_model *m, PackLayout *L) {
  const cavs_desc *ds = m->d;
  size_t N = (size_t)m->rows, at = 0;
  L->N = N;
  L->child = place(&at, sizeof(int) * N * (size_t)m->maxc), L->root = place(&at, N), L->pushed = place(&at, N);
  L->E = m->has_edges ? (size_t)m->nedges : 0, L->rowvert = place(&at, sizeof(int) * N);
  L->eoff = place(&at, m->has_edges ? sizeof(int) * (N + 1) : 0), L->eparent = place(&at, sizeof(int) * L->E),
  L->echild = place(&at, sizeof(int) * L->E);
  /* homes: the device pointers plan_homes wrote (into this backend's buffers), and the
     carried states' rows past the minibatch's, which a gather reads: never at home */
  L->NH = N + (size_t)m->carry_in;
  for (int k = 0; k < m->nhomes; k++) {
    L->hval[k] = place(&at, sizeof(void *) * L->NH);
    L->hgrad[k] = place(&at, sizeof(void *) * L->NH);
    L->hkey[k] = place(&at, sizeof(long) * L->NH);
  }
  L->iin = at;
  for (int i = 0; i < ds->nint; i++) place(&at, sizeof(int) * N);
  L->rin = at;
  for (int i = 0; i < ds->nreal; i++) place(&at, (size_t)m->rw[i] * m->esize * N);
  L->bytes = at;
}

/* The packed copy's buffers and the outputs' (losses, counts, predictions) grown to
   hold this minibatch's; false where the device could not (d->failed says why). */
static bool pack_room(cavs_model *m, const PackLayout *L) {
  Dev *d = dev(m);
  if (L->bytes > d->cap) {
    d->cap = 0;
    regrow_pinned(m, (void **)&d->pack_host, L->bytes);
    regrow(m, (void **)&d->pack_dev, L->bytes);
    if (d->failed) return false;
    d->cap = L->bytes;
  }
  if (out_bytes(m, L->N) > d->capout) {
    size_t bytes = out_bytes(m, (size_t)m->cap_rows);
    d->capout = 0;
    regrow(m, (void **)&d->out_dev, bytes);
    regrow_pinned(m, (void **)&d->out_host, bytes);
    if (d->failed) return false;
    d->capout = bytes;
  }
  size_t nl = (size_t)m->d->nlosses;
  d->sum = (double *)d->out_dev;
  d->cnt = (unsigned long long *)(d->out_dev + sizeof(double) * nl);
  d->pred = (int *)(d->out_dev + sizeof(double) * nl + sizeof(unsigned long long) * 4 * nl);
  return true;
}

/* The host's arrays into the pinned buffer, then one copy up; the inputs' device
   pointers set as they are placed. */
static void pack_up(cavs_model *m, const PackLayout *L) {
  Dev *d = dev(m);
  const cavs_desc *ds = m->d;
  size_t N = L->N, E = L->E, NH = L->NH;
  pinned_for_host(m, PIN_PACK);
  memcpy(d->pack_host + L->child, m->child, sizeof(int) * N * (size_t)m->maxc);
  memcpy(d->pack_host + L->root, m->root, N);
  memcpy(d->pack_host + L->pushed, m->pushed, N);
  memcpy(d->pack_host + L->rowvert, m->queue, sizeof(int) * N); /* number_rows: row r's vertex */
  if (m->has_edges) {
    memcpy(d->pack_host + L->eoff, m->eoff, sizeof(int) * (N + 1));
    if (E) { /* (a minibatch without edges has no edge arrays: memcpy from NULL is undefined) */
      memcpy(d->pack_host + L->eparent, m->eparent, sizeof(int) * E);
      memcpy(d->pack_host + L->echild, m->echild, sizeof(int) * E);
    }
  }
  for (int k = 0; k < m->nhomes; k++) {
    memcpy(d->pack_host + L->hval[k], m->hval[k], sizeof(void *) * NH);
    memcpy(d->pack_host + L->hgrad[k], m->hgrad[k], sizeof(void *) * NH);
    memcpy(d->pack_host + L->hkey[k], m->hkey[k], sizeof(long) * NH);
  }
  size_t o = L->iin;
  for (int i = 0; i < ds->nint; i++) {
    memcpy(d->pack_host + o, m->iin[i], sizeof(int) * N);
    d->iin[i] = (int *)(d->pack_dev + o);
    place(&o, sizeof(int) * N);
  }
  o = L->rin;
  for (int i = 0; i < ds->nreal; i++) {
    size_t bytes = (size_t)m->rw[i] * m->esize * N;
    memcpy(d->pack_host + o, m->rin[i], bytes);
    d->rin[i] = d->pack_dev + o;
    place(&o, bytes);
  }
  CK(m, cudaMemcpyAsync(d->pack_dev, d->pack_host, L->bytes, cudaMemcpyHostToDevice, 0));
  d->busy |= PIN_PACK;
}

/* The device copies' pointers, in the backend's record and in what generated code and
   the kernels read (cavs_ctx). */
static void pack_point(cavs_model *m, const PackLayout *L) {
  Dev *d = dev(m);
  d->child = (int *)(d->pack_dev + L->child);
  d->root = (unsigned char *)(d->pack_dev + L->root);
  d->pushed = (unsigned char *)(d->pack_dev + L->pushed);
  d->rowvert = (int *)(d->pack_dev + L->rowvert);
  d->eoff = (int *)(d->pack_dev + L->eoff);
  d->eparent = (int *)(d->pack_dev + L->eparent);
  d->echild = (int *)(d->pack_dev + L->echild);
  for (int k = 0; k < CAVS_MAX_HOMES; k++) {
    bool has = k < m->nhomes;
    d->hval[k] = has ? (void **)(d->pack_dev + L->hval[k]) : NULL;
    d->hgrad[k] = has ? (void **)(d->pack_dev + L->hgrad[k]) : NULL;
    d->hkey[k] = has ? (long *)(d->pack_dev + L->hkey[k]) : NULL;
  }
  cavs_ctx *c = &m->ctx;
  c->child = d->child;
  c->root = d->root;
  c->pushed = d->pushed;
  for (int k = 0; k < CAVS_MAX_HOMES; k++) {
    c->home_val[k] = d->hval[k];
    c->home_grad[k] = d->hgrad[k];
  }
  c->iin = (const int **)d->iin;
  c->rin = (const void **)d->rin;
  c->stream = d->st[0];
}

static int cuda_schedule(cavs_model *m) {
  Dev *d = dev(m);
  /* A pass after one that failed for want of the device's memory runs: that failure
     does not last (every buffer that could not grow says it holds nothing, and grows
     whole next time), once the device says, by a synchronize, that it has no fault of
     its own. Any other failure stays: the model can only be freed. */
  if (d->failed && d->errnum == ENOMEM && cudaDeviceSynchronize() == cudaSuccess &&
      cudaGetLastError() == cudaSuccess)
    d->failed = false;
  PackLayout L;
  pack_layout(m, &L);
  if (!pack_room(m, &L)) return status(d);
  pack_up(m, &L);
  pack_point(m, &L);
  size_t nl = (size_t)m->d->nlosses;
  if (L.N) CK(m, cudaMemsetAsync(d->pred, 0xff, sizeof(int) * L.N, 0)); /* -1 */
  if (nl) CK(m, cudaMemsetAsync(d->sum, 0, out_bytes(m, 0), 0));        /* the sums and counts */
  d->fresh = true;
  routes_sized(m);
  return status(d);
}

static void cuda_stream(cavs_model *m, int s) { m->ctx.stream = dev(m)->st[s]; }
static void cuda_record(cavs_model *m, int e) { CK(m, cudaEventRecord(dev(m)->ev[e], on(&m->ctx))); }
static void cuda_wait(cavs_model *m, int e) { CK(m, cudaStreamWaitEvent(on(&m->ctx), dev(m)->ev[e], 0)); }

/* Does the model route rows to experts: a table of experts, or a push block that
   routes (cavs_abi.h) */
static bool model_routes(const cavs_desc *ds) {
  if (ds->push_routes) return true;
  for (int k = 0; k < ds->npgroups; k++)
    if (ds->pgroups[k].experts) return true;
  return false;
}

/* Has every vertex type with rows in this minibatch run in a pass not captured (Dev.ran)?
   Those that had not are marked, for the pass that will run them so. */
static bool types_ran(cavs_model *m) {
  Dev *d = dev(m);
  bool all = true;
  for (int t = 0; t < m->d->nvertex; t++)
    if (m->type_n[t] > 0 && !d->ran[t]) all = false;
  if (!all)
    for (int t = 0; t < m->d->nvertex; t++) d->ran[t] |= m->type_n[t] > 0;
  return all;
}

/* A pass as a graph: everything the steps issue to stream 0, and to stream 1 once it
   waits for an event of stream 0 (each pass forks and joins it so), is captured, not
   run; then launched as one graph. Nothing in a pass's steps synchronizes with the
   host or uses the legacy stream (the clears before a pass and the step after it do,
   outside the capture). */
static int cuda_pass_begin(cavs_model *m, int pass) {
  Dev *d = dev(m);
  /* a model that routes runs a pass uncaptured where a type with rows in it has not
     run so before (types_ran: the first pass, and one with a type the passes before
     it lacked, whose routings may make their arrays), and always with experts placed
     on processes (each product a round of exchanges through the host) */
  d->capturing = d->graphs && !m->ep.on && (!model_routes(m->d) || types_ran(m));
  if (!d->capturing) return 0;
  m->ctx.stream = d->st[0];
  CK(m, cudaStreamBeginCapture(d->st[0], cudaStreamCaptureModeThreadLocal));
  m->no_alloc = true; /* (cudaMalloc would invalidate the capture) */
  return status(d);
}

static int cuda_pass_end(cavs_model *m, int pass) {
  Dev *d = dev(m);
  if (!d->capturing) return 0;
  d->capturing = false;
  cudaGraph_t g = NULL;
  m->no_alloc = false;
  CK(m, cudaStreamEndCapture(d->st[0], &g));
  if (!d->failed && d->exec[pass]) {
    cudaGraphExecUpdateResultInfo info;
    if (cudaGraphExecUpdate(d->exec[pass], g, &info) != cudaSuccess) {
      (void)cudaGetLastError(); /* a new shape: not an error */
      cudaGraphExecDestroy(d->exec[pass]);
      d->exec[pass] = NULL;
    }
  }
  if (!d->failed && !d->exec[pass]) CK(m, cudaGraphInstantiate(&d->exec[pass], g, 0));
  if (g) cudaGraphDestroy(g);
  if (!d->failed) CK(m, cudaGraphLaunch(d->exec[pass], d->st[0]));
  m->stats.launches += !d->failed;
  return status(d);
}

/* The one wait of a training step. After a forward pass, what it left for the host
   comes back first, in one copy into pinned memory issued before the wait. */
static int cuda_synchronize(cavs_model *m) {
  Dev *d = dev(m);
  const cavs_desc *ds = m->d;
  size_t nl = (size_t)ds->nlosses, bytes = d->fresh && nl && !d->failed ? out_bytes(m, (size_t)m->rows) : 0;
  if (bytes) CK(m, cudaMemcpyAsync(d->out_host, d->out_dev, bytes, cudaMemcpyDeviceToHost, 0));
  route_stats_issue(m);
  wait_device(m);
  route_stats_read(m);
  d->fresh = false;
  m->ctx.stream = d->st[0];
  if (m->norm_pending) m->grad_norm2 = d->failed ? -1 : *d->norm2_host, m->norm_pending = false;
  if (bytes && !d->failed) {
    const char *o = d->out_host;
    for (size_t l = 0; l < nl; l++) {
      double sum;
      unsigned long long cnt[4];
      memcpy(&sum, o + sizeof sum * l, sizeof sum);
      memcpy(cnt, o + sizeof sum * nl + sizeof cnt * l, sizeof cnt);
      cavs_loss_acc *a = &m->loss[l];
      a->sum = sum;
      a->count = (long)cnt[0];
      a->correct = (long)cnt[1];
      a->root_count = (long)cnt[2];
      a->root_correct = (long)cnt[3];
    }
    memcpy(m->pred, o + out_bytes(m, 0), sizeof(int) * (size_t)m->rows);
  }
  return status(d);
}

/* ---- products: row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T ---- */

template <typename R> __global__ void scale_rows(R *c, long ldc, int m, int n, R beta) {
  long row, col;
  if (cell(0, m, n, &row, &col)) c[row * ldc + col] *= beta;
}

static void cuda_gemm(cavs_ctx *c, int ta, int tb, int m, int n, int k, double alpha, const void *a, long lda,
                      const void *b, long ldb, double beta, void *cm, long ldc) {
  cavs_model *md = model(c);
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (dbl(c)) CAVS_CUDA_LAUNCH(scale_rows<double>, blocks((long)m * n), on(c))((double *)cm, ldc, m, n, beta);
    else CAVS_CUDA_LAUNCH(scale_rows<float>, blocks((long)m * n), on(c))((float *)cm, ldc, m, n, (float)beta);
    CKL(md);
    return;
  }
  cublasOperation_t A = ta == CAVS_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N, B = tb == CAVS_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N;
  Dev *d = dev(md);
  CKB(md, cublasSetStream(d->blas, on(c)));
  if (dbl(c))
    CKB(md, cublasDgemm(d->blas, B, A, n, m, k, &alpha, (const double *)b, (int)ldb, (const double *)a, (int)lda, &beta,
                        (double *)cm, (int)ldc));
  else {
    float al = (float)alpha, be = (float)beta;
    CKB(md, cublasSgemm(d->blas, B, A, n, m, k, &al, (const float *)b, (int)ldb, (const float *)a, (int)lda, &be,
                        (float *)cm, (int)ldc));
  }
  md->stats.gemm_calls++;
  md->stats.launches++;
  md->stats.gemm_flops += 2.0 * m * n * k;
}

static void zero_rows(cavs_ctx *c, void *y, long ldy, int a, int len, int cols) {
  size_t es = dbl(c) ? 8 : 4;
  if (len <= 0) return;
  CK(model(c), cudaMemset2DAsync((char *)y + (size_t)a * (size_t)ldy * es, (size_t)ldy * es, 0, (size_t)cols * es,
                                 (size_t)len, on(c)));
  model(c)->stats.launches++;
}

/* The runs of rows with and without an index are found on the host, in the scheduler's
   copy of the index input the device array mirrors. */
static const int *host_index(cavs_model *m, const int *idx) {
  for (int i = 0; i < m->d->nint; i++)
    if (dev(m)->iin[i] == idx) return m->iin[i];
  return NULL;
}

static void cuda_gemm_rows(cavs_ctx *c, const int *idx, int skip, int r0, int n, int form, int cols, int k, const void *x,
                           long ldx, const void *w, long ldw, void *y, long ldy) {
  const int *h = host_index(model(c), idx);
  /* a run of rows with a word is one product, up to two (the rows of a type: its leaves,
     which have words, then the rest); past that one product over all, zero rows
     included, so that the launches of a stage do not grow with its rows */
  if (h) cv_gemm_rows_with(cuda_gemm, zero_rows, c, h, skip, r0, n, form, cols, k, x, ldx, w, ldw, y, ldy, 2);
  else record(model(c), EINVAL, __FILE__, __LINE__, "a looked-up-row product on an array that is not an index input");
}

static void cuda_gemm_skip(cavs_ctx *c, int skip, int r0, int n, int form, int cols, int k, const void *x, long ldx,
                           const void *w, long ldw, void *y, long ldy) {
  cv_gemm_skip_with(cuda_gemm, zero_rows, c, skip, r0, n, form, cols, k, x, ldx, w, ldw, y, ldy);
}

/* ---- rows: gathers, lookups, copies; one thread a cell, every row of a task in one launch ---- */

/* The keys of the rows' homes (plan_homes), by value into a kernel: is row s at home
   where `key` says? */
struct Homes {
  const long *key[CAVS_MAX_HOMES];
};
__device__ static bool at_home(const Homes &h, int s, long key) {
  for (int k = 0; k < CAVS_MAX_HOMES; k++)
    if (h.key[k] && h.key[k][s] == key) return true;
  return false;
}
static Homes homes_of(cavs_model *m) {
  Homes h;
  for (int k = 0; k < CAVS_MAX_HOMES; k++) h.key[k] = dev(m)->hkey[k];
  return h;
}

/* dst[r] = src[sel(r)] (zero where sel is -1), or with bwd, src-side += dst-side; a
   child at home in slot k of row r (plan_homes: its loops stored it there and read the
   gradient there) is left alone */
template <typename R>
__global__ void gather(R *dst, long ld, const R *S, long w, const int *sel, long stride, int r0, int n, bool bwd,
                       Homes h, int k) {
  long r, j;
  if (!cell(r0, n, w, &r, &j)) return;
  int s = sel[r * stride];
  if (s >= 0 && at_home(h, s, r * stride + k)) return;
  if (!bwd) dst[r * ld + j] = s < 0 ? (R)0 : S[(long)s * w + j];
  else if (s >= 0) atomicAdd((R *)&S[(long)s * w + j], dst[r * ld + j]);
}

template <typename R>
static void launch_gather(cavs_ctx *c, R *rows, long ld, const R *S, long w, const int *sel, long stride, int r0, int n,
                          bool bwd, Homes h = Homes{}, int k = 0) {
  if (n <= 0 || w <= 0) return;
  CAVS_CUDA_LAUNCH(gather<R>, blocks((long)n * w), on(c))(rows, ld, S, w, sel, stride, r0, n, bwd, h, k);
  CKL(model(c));
}

/* The C target's loops run on the host: never on this backend (the targets must match),
   but the slot is filled */
static void cuda_loop(cavs_ctx *c, cavs_cols f, int r0, int n, long width, int flags) {
  record(model(c), EINVAL, __FILE__, __LINE__, "a C target's loop on the cuda backend");
}

static void cuda_gather_fwd(cavs_ctx *c, int k, int state, void *dst, long ld, int r0, int n) {
  long w = model(c)->bw[state];
  if (dbl(c))
    launch_gather<double>(c, (double *)dst, ld, (const double *)c->val[state], w, c->child + k, c->maxc, r0, n, false,
                          homes_of(model(c)), k);
  else
    launch_gather<float>(c, (float *)dst, ld, (const float *)c->val[state], w, c->child + k, c->maxc, r0, n, false,
                         homes_of(model(c)), k);
}

static void cuda_gather_bwd(cavs_ctx *c, int k, int state, const void *src, long ld, int r0, int n) {
  long w = model(c)->bw[state];
  if (dbl(c))
    launch_gather<double>(c, (double *)src, ld, (const double *)c->grad[state], w, c->child + k, c->maxc, r0, n, true,
                          homes_of(model(c)), k);
  else
    launch_gather<float>(c, (float *)src, ld, (const float *)c->grad[state], w, c->child + k, c->maxc, r0, n, true,
                         homes_of(model(c)), k);
}

/* ---- children as a set: a thread a cell of the edges (or rows) of a stage ---- */

/* the edges [e0, e0 + ne) of rows [r0, r0 + n), from the host's copy of eoff */
static void edges_of(cavs_ctx *c, int r0, int n, int *e0, int *ne) {
  *e0 = c->eoff[r0];
  *ne = c->eoff[r0 + n] - *e0;
}

/* per edge e, column j: echild copies the child's state row to the edge (backward adds
   it back, atomically: a child is in several sets), but for a child at home in the
   edge's row (its key: key0 + e, plan_homes); ebcast the parent's row */
template <typename R>
__global__ void edge_copy(R *edge, long lde, R *rows, long ldr, const int *sel, int e0, int ne, long w, bool bwd,
                          Homes h, long key0) {
  long e, j;
  if (!cell(e0, ne, w, &e, &j)) return;
  if (at_home(h, sel[e], key0 + e)) return;
  R *row = rows + (long)sel[e] * ldr;
  if (!bwd) edge[e * lde + j] = row[j];
  else atomicAdd(&row[j], edge[e * lde + j]);
}

/* esum: each row's edges added in edge order, as the CPU does (cv_esum_cell): the same
   bits; backward, the row's gradient to each of its edges */
template <typename R>
__global__ void esum_fwd(const R *src, long lds, R *dst, long ldd, const int *eoff, int r0, int n, long w) {
  long r, j;
  if (!cell(r0, n, w, &r, &j)) return;
  dst[r * ldd + j] = cv_esum_cell(src, lds, eoff, r, j);
}
template <typename R>
__global__ void esum_bwd(R *dsrc, long lds, const R *ddst, long ldd, const int *eparent, int e0, int ne, long w) {
  long e, j;
  if (!cell(e0, ne, w, &e, &j)) return;
  dsrc[e * lds + j] += ddst[(long)eparent[e] * ldd + j];
}

template <typename R>
static void launch_edge_copy(cavs_ctx *c, void *edge, long lde, void *rows, long ldr, const int *sel, int r0, int n,
                             long w, bool bwd, bool homes = false) {
  int e0, ne;
  edges_of(c, r0, n, &e0, &ne);
  if (ne <= 0 || w <= 0) return;
  cavs_model *m = model(c);
  Homes h = homes ? homes_of(m) : Homes{};
  CAVS_CUDA_LAUNCH(edge_copy<R>, blocks((long)ne * w), on(c))((R *)edge, lde, (R *)rows, ldr, sel, e0, ne, w, bwd, h,
                                                            cv_edge_key(m, 0));
  CKL(m);
}

static void cuda_echild_fwd(cavs_ctx *c, int state, void *dst, long ld, int r0, int n) {
  long w = model(c)->bw[state];
  if (dbl(c)) launch_edge_copy<double>(c, dst, ld, c->val[state], w, dev(model(c))->echild, r0, n, w, false, true);
  else launch_edge_copy<float>(c, dst, ld, c->val[state], w, dev(model(c))->echild, r0, n, w, false, true);
}
static void cuda_echild_bwd(cavs_ctx *c, int state, const void *src, long ld, int r0, int n) {
  long w = model(c)->bw[state];
  if (dbl(c))
    launch_edge_copy<double>(c, (void *)src, ld, c->grad[state], w, dev(model(c))->echild, r0, n, w, true, true);
  else launch_edge_copy<float>(c, (void *)src, ld, c->grad[state], w, dev(model(c))->echild, r0, n, w, true, true);
}
static void cuda_ebcast_fwd(cavs_ctx *c, const void *src, long lds, void *dst, long ldd, long w, int r0, int n) {
  if (dbl(c)) launch_edge_copy<double>(c, dst, ldd, (void *)src, lds, dev(model(c))->eparent, r0, n, w, false);
  else launch_edge_copy<float>(c, dst, ldd, (void *)src, lds, dev(model(c))->eparent, r0, n, w, false);
}
static void cuda_ebcast_bwd(cavs_ctx *c, void *dsrc, long lds, const void *ddst, long ldd, long w, int r0, int n) {
  if (dbl(c)) launch_edge_copy<double>(c, (void *)ddst, ldd, dsrc, lds, dev(model(c))->eparent, r0, n, w, true);
  else launch_edge_copy<float>(c, (void *)ddst, ldd, dsrc, lds, dev(model(c))->eparent, r0, n, w, true);
}
static void cuda_esum_fwd(cavs_ctx *c, const void *src, long lds, void *dst, long ldd, long w, int r0, int n) {
  if (n <= 0 || w <= 0) return;
  /* rows without an edge (a minibatch of leaves: no edge buffer, src is NULL plus a
     column's offset) still get their sum, 0, and read no edge: point at a buffer that is */
  int e0, ne;
  edges_of(c, r0, n, &e0, &ne);
  if (ne <= 0) src = dst, lds = ldd;
  if (dbl(c))
    CAVS_CUDA_LAUNCH(esum_fwd<double>, blocks((long)n * w), on(c))((const double *)src, lds, (double *)dst, ldd,
                                                                  dev(model(c))->eoff, r0, n, w);
  else
    CAVS_CUDA_LAUNCH(esum_fwd<float>, blocks((long)n * w), on(c))((const float *)src, lds, (float *)dst, ldd,
                                                                dev(model(c))->eoff, r0, n, w);
  CKL(model(c));
}
static void cuda_esum_bwd(cavs_ctx *c, void *dsrc, long lds, const void *ddst, long ldd, long w, int r0, int n) {
  int e0, ne;
  edges_of(c, r0, n, &e0, &ne);
  if (ne <= 0 || w <= 0) return;
  if (dbl(c))
    CAVS_CUDA_LAUNCH(esum_bwd<double>, blocks((long)ne * w), on(c))((double *)dsrc, lds, (const double *)ddst, ldd,
                                                                   dev(model(c))->eparent, e0, ne, w);
  else
    CAVS_CUDA_LAUNCH(esum_bwd<float>, blocks((long)ne * w), on(c))((float *)dsrc, lds, (const float *)ddst, ldd,
                                                                 dev(model(c))->eparent, e0, ne, w);
  CKL(model(c));
}

/* ---- dropout: the CPU's masks (cavs_drop_key of the row's vertex, the seed and the
   step; cavs_drop_keep), drawn in the kernel from the row's vertex, numbered in the whole
   minibatch (voff: cavs_model_set_vertex_offset) ---- */
template <typename R>
__global__ void dropout(const R *x, long ldx, R *y, long ldy, const int *rowvert, long voff, uint64_t seed, long step,
                        unsigned salt, double p, long w, int r0, int n, int keep, bool bwd) {
  long r, j;
  if (!cell(r0, n, w, &r, &j)) return;
  R scale = (R)(1.0 / (1.0 - p));
  bool kept = !keep || cavs_drop_keep(cavs_drop_key(seed, step, voff + rowvert[r]), salt, j, p);
  if (!bwd) y[r * ldy + j] = !keep ? x[r * ldx + j] : kept ? x[r * ldx + j] * scale : (R)0;
  else if (kept) y[r * ldy + j] += x[r * ldx + j] * scale; /* x: dy, y: dx */
}

/* noise: the CPU's draws (cavs_noise_z of the row's key), y = x z in training, 0 in
   inference; backward dx += dy z */
template <typename R>
__global__ void noise(const R *x, long ldx, R *y, long ldy, const int *rowvert, long voff, uint64_t seed, long step,
                      unsigned salt, long w, int r0, int n, int keep, bool bwd) {
  long r, j;
  if (!cell(r0, n, w, &r, &j)) return;
  R z = keep ? (R)cavs_noise_z(cavs_drop_key(seed, step, voff + rowvert[r]), salt, j) : (R)0;
  if (!bwd) y[r * ldy + j] = keep ? x[r * ldx + j] * z : (R)0;
  else y[r * ldy + j] += x[r * ldx + j] * z; /* x: dy, y: dx */
}

template <typename R>
static void launch_noise(cavs_ctx *c, unsigned salt, const void *x, long ldx, void *y, long ldy, long w, int r0, int n,
                         bool bwd) {
  if (n <= 0 || w <= 0) return;
  cavs_model *m = model(c);
  CAVS_CUDA_LAUNCH(noise<R>, blocks((long)n * w), on(c))((const R *)x, ldx, (R *)y, ldy, dev(m)->rowvert, m->voff,
                                                       m->drop_seed, m->step, salt, w, r0, n, bwd ? 1 : c->keep, bwd);
  CKL(m);
}
static void cuda_noise_fwd(cavs_ctx *c, unsigned salt, const void *x, long ldx, void *y, long ldy, long w, int r0,
                           int n) {
  if (dbl(c)) launch_noise<double>(c, salt, x, ldx, y, ldy, w, r0, n, false);
  else launch_noise<float>(c, salt, x, ldx, y, ldy, w, r0, n, false);
}
static void cuda_noise_bwd(cavs_ctx *c, unsigned salt, const void *dy, long ldy, void *dx, long ldx, long w, int r0,
                           int n) {
  if (dbl(c)) launch_noise<double>(c, salt, dy, ldy, dx, ldx, w, r0, n, true);
  else launch_noise<float>(c, salt, dy, ldy, dx, ldx, w, r0, n, true);
}

template <typename R>
static void launch_dropout(cavs_ctx *c, unsigned salt, double p, const void *x, long ldx, void *y, long ldy, long w, int r0,
                           int n, bool bwd) {
  if (n <= 0 || w <= 0) return;
  cavs_model *m = model(c);
  CAVS_CUDA_LAUNCH(dropout<R>, blocks((long)n * w), on(c))((const R *)x, ldx, (R *)y, ldy, dev(m)->rowvert, m->voff,
                                                         m->drop_seed, m->step, salt, p, w, r0, n, bwd ? 1 : c->keep,
                                                         bwd);
  CKL(m);
}
static void cuda_dropout_fwd(cavs_ctx *c, unsigned salt, double p, const void *x, long ldx, void *y, long ldy, long w,
                             int r0, int n) {
  if (dbl(c)) launch_dropout<double>(c, salt, p, x, ldx, y, ldy, w, r0, n, false);
  else launch_dropout<float>(c, salt, p, x, ldx, y, ldy, w, r0, n, false);
}
static void cuda_dropout_bwd(cavs_ctx *c, unsigned salt, double p, const void *dy, long ldy, void *dx, long ldx, long w,
                             int r0, int n) {
  if (dbl(c)) launch_dropout<double>(c, salt, p, dy, ldy, dx, ldx, w, r0, n, true);
  else launch_dropout<float>(c, salt, p, dy, ldy, dx, ldx, w, r0, n, true);
}

/* A lookup is a gather from the table by an index input, whose rows have the table's
   stride. */
template <typename R>
__global__ void lookup(R *dst, long ld, const R *T, long ldt, long w, const int *idx, int r0, int n, bool bwd) {
  long r, j;
  if (!cell(r0, n, w, &r, &j)) return;
  int s = idx[r];
  if (!bwd) dst[r * ld + j] = s < 0 ? (R)0 : T[(long)s * ldt + j];
  else if (s >= 0) atomicAdd((R *)&T[(long)s * ldt + j], dst[r * ld + j]);
}

static void launch_lookup(cavs_ctx *c, const void *table, long ldt, const int *idx, const void *rows, long ld, int r0,
                          int n, long w, bool bwd) {
  if (n <= 0 || w <= 0) return;
  if (dbl(c))
    CAVS_CUDA_LAUNCH(lookup<double>, blocks((long)n * w), on(c))((double *)rows, ld, (const double *)table, ldt, w, idx, r0, n, bwd);
  else CAVS_CUDA_LAUNCH(lookup<float>, blocks((long)n * w), on(c))((float *)rows, ld, (const float *)table, ldt, w, idx, r0, n, bwd);
  CKL(model(c));
}

static void cuda_lookup_fwd(cavs_ctx *c, const void *table, long ldt, const int *idx, void *dst, long ld, int r0, int n,
                            long width) {
  launch_lookup(c, table, ldt, idx, dst, ld, r0, n, width, false);
}

static void cuda_lookup_bwd(cavs_ctx *c, void *dtable, long ldt, const int *idx, const void *src, long ld, int r0,
                            int n, long width) {
  launch_lookup(c, dtable, ldt, idx, src, ld, r0, n, width, true);
}

template <typename R> __global__ void copy_rows(R *dst, long ldd, const R *src, long lds, int n, long w, int add) {
  long r, j;
  if (!cell(0, n, w, &r, &j)) return;
  if (add) dst[r * ldd + j] += src[r * lds + j];
  else dst[r * ldd + j] = src[r * lds + j];
}

static void cuda_copy_rows(cavs_ctx *c, void *dst, long ldd, const void *src, long lds, int n, long w, int add) {
  if (n <= 0 || w <= 0) return;
  if (dbl(c)) CAVS_CUDA_LAUNCH(copy_rows<double>, blocks((long)n * w), on(c))((double *)dst, ldd, (const double *)src, lds, n, w, add);
  else CAVS_CUDA_LAUNCH(copy_rows<float>, blocks((long)n * w), on(c))((float *)dst, ldd, (const float *)src, lds, n, w, add);
  CKL(model(c));
}

/* ---- mv and mm: a matrix per row (cavs_rowmv_*, cavs_rowmm_*), a launch or a product a
   call whatever the rows (row by row through cuBLAS, a call a row, MV-RNN's launches grew
   with its trees). A thread a cell, its sum in the order the CPU's loops take (mv), or
   one cuBLAS product where the rows' matrices lie one after another (mm, as
   backend.c's) ---- */

/* mv: y_r [1, b] = x_r [1, a] M_r [a, b], M_r row-major at M + r ldm */
template <typename R>
__global__ void rowmv_fwd_k(const R *x, long ldx, const R *M, long ldm, R *y, long ldy, long a, long b, int r0, int n) {
  long r, j;
  if (!cell(r0, n, b, &r, &j)) return;
  const R *xr = x + r * ldx, *mr = M + r * ldm;
  R s = 0;
  for (long i = 0; i < a; i++) s += xr[i] * mr[i * b + j];
  y[r * ldy + j] = s;
}
/* dx_r [1, a] += dy_r M_r^T (a thread a cell of dx) */
template <typename R>
__global__ void rowmv_dx_k(const R *M, long ldm, const R *dy, long lddy, R *dx, long lddx, long a, long b, int r0, int n) {
  long r, i;
  if (!cell(r0, n, a, &r, &i)) return;
  const R *g = dy + r * lddy, *mi = M + r * ldm + i * b;
  R s = 0;
  for (long j = 0; j < b; j++) s += g[j] * mi[j];
  dx[r * lddx + i] += s;
}
/* dM_r [a, b] += x_r^T dy_r (a thread a cell of dM) */
template <typename R>
__global__ void rowmv_dm_k(const R *x, long ldx, const R *dy, long lddy, R *dM, long lddm, long a, long b, int r0, int n) {
  long r, c;
  if (!cell(r0, n, a * b, &r, &c)) return;
  dM[r * lddm + c] += x[r * ldx + c / b] * dy[r * lddy + c % b];
}

/* mm: Y_r [a, cc] = M_r [a, b] W [b, cc] (a thread a cell of Y); backward dM_r += dY_r W^T
   (a cell of dM) and dW += sum over rows of M_r^T dY_r (a cell of dW, over every row) */
template <typename R>
__global__ void rowmm_fwd_k(const R *M, long ldm, const R *W, long ldw, R *Y, long ldy, long a, long b, long cc, int r0,
                            int n) {
  long r, c;
  if (!cell(r0, n, a * cc, &r, &c)) return;
  long p = c / cc, q = c % cc;
  const R *mp = M + r * ldm + p * b;
  R s = 0;
  for (long i = 0; i < b; i++) s += mp[i] * W[i * ldw + q];
  Y[r * ldy + c] = s;
}
template <typename R>
__global__ void rowmm_dm_k(const R *W, long ldw, const R *dY, long lddy, R *dM, long lddm, long a, long b, long cc, int r0,
                           int n) {
  long r, c;
  if (!cell(r0, n, a * b, &r, &c)) return;
  long p = c / b, i = c % b;
  const R *gp = dY + r * lddy + p * cc, *wi = W + i * ldw;
  R s = 0;
  for (long q = 0; q < cc; q++) s += gp[q] * wi[q];
  dM[r * lddm + c] += s;
}
template <typename R>
__global__ void rowmm_dw_k(const R *M, long ldm, const R *dY, long lddy, R *dW, long lddw, long a, long b, long cc, int r0,
                           int n) {
  long i, q;
  if (!cell(0, b, cc, &i, &q)) return;
  R s = 0;
  for (long r = r0; r < r0 + n; r++)
    for (long p = 0; p < a; p++) s += M[r * ldm + p * b + i] * dY[r * lddy + p * cc + q];
  dW[i * lddw + q] += s;
}

/* Each op at the model's precision R; pointers are to row 0. */
template <typename R>
static void rowmv_fwd_as(cavs_ctx *c, long a, long b, const void *x, long ldx, const void *m, long ldm, void *y, long ldy,
                         int r0, int n) {
  if (n <= 0 || b <= 0) return;
  CAVS_CUDA_LAUNCH(rowmv_fwd_k<R>, blocks((long)n * b), on(c))((const R *)x, ldx, (const R *)m, ldm, (R *)y, ldy, a, b, r0, n);
  CKL(model(c));
}
template <typename R>
static void rowmv_bwd_as(cavs_ctx *c, long a, long b, const void *x, long ldx, const void *m, long ldm, const void *dy,
                         long lddy, void *dx, long lddx, void *dm, long lddm, int r0, int n) {
  if (n <= 0 || a <= 0 || b <= 0) return;
  if (dx) {
    CAVS_CUDA_LAUNCH(rowmv_dx_k<R>, blocks((long)n * a), on(c))((const R *)m, ldm, (const R *)dy, lddy, (R *)dx, lddx, a, b,
                                                               r0, n);
    CKL(model(c));
  }
  if (dm) {
    CAVS_CUDA_LAUNCH(rowmv_dm_k<R>, blocks((long)n * a * b), on(c))((const R *)x, ldx, (const R *)dy, lddy, (R *)dm, lddm,
                                                                   a, b, r0, n);
    CKL(model(c));
  }
}
template <typename R>
static void rowmm_fwd_as(cavs_ctx *c, long a, long b, long cc, const void *m, long ldm, const void *w, long ldw, void *y,
                         long ldy, int r0, int n) {
  if (n <= 0 || a <= 0 || cc <= 0) return;
  if (cv_rows_stacked(a * b, ldm, a * cc, ldy, n)) {
    cuda_gemm(c, CAVS_NO_TRANS, CAVS_NO_TRANS, (int)(n * a), (int)cc, (int)b, 1, (const R *)m + (size_t)r0 * ldm, b, w, ldw,
              0, (R *)y + (size_t)r0 * ldy, cc);
    return;
  }
  CAVS_CUDA_LAUNCH(rowmm_fwd_k<R>, blocks((long)n * a * cc), on(c))((const R *)m, ldm, (const R *)w, ldw, (R *)y, ldy, a, b,
                                                                   cc, r0, n);
  CKL(model(c));
}
template <typename R>
static void rowmm_bwd_as(cavs_ctx *c, long a, long b, long cc, const void *m, long ldm, const void *w, long ldw,
                         const void *dy, long lddy, void *dm, long lddm, void *dw, long lddw, int r0, int n) {
  if (n <= 0 || a <= 0 || b <= 0 || cc <= 0) return;
  const R *M = (const R *)m, *W = (const R *)w, *G = (const R *)dy;
  if (dm && cv_rows_stacked(a * cc, lddy, a * b, lddm, n))
    cuda_gemm(c, CAVS_NO_TRANS, CAVS_TRANS, (int)(n * a), (int)b, (int)cc, 1, G + (size_t)r0 * lddy, cc, W, ldw, 1,
              (R *)dm + (size_t)r0 * lddm, b);
  else if (dm) {
    CAVS_CUDA_LAUNCH(rowmm_dm_k<R>, blocks((long)n * a * b), on(c))(W, ldw, G, lddy, (R *)dm, lddm, a, b, cc, r0, n);
    CKL(model(c));
  }
  if (dw && cv_rows_stacked(a * b, ldm, a * cc, lddy, n))
    cuda_gemm(c, CAVS_TRANS, CAVS_NO_TRANS, (int)b, (int)cc, (int)(n * a), 1, M + (size_t)r0 * ldm, b, G + (size_t)r0 * lddy,
              cc, 1, dw, lddw);
  else if (dw) {
    CAVS_CUDA_LAUNCH(rowmm_dw_k<R>, blocks(b * cc), on(c))(M, ldm, G, lddy, (R *)dw, lddw, a, b, cc, r0, n);
    CKL(model(c));
  }
}

static void cuda_rowmv_fwd(cavs_ctx *c, long a, long b, const void *x, long ldx, const void *m, long ldm, void *y,
                           long ldy, int r0, int n) {
  if (dbl(c)) rowmv_fwd_as<double>(c, a, b, x, ldx, m, ldm, y, ldy, r0, n);
  else rowmv_fwd_as<float>(c, a, b, x, ldx, m, ldm, y, ldy, r0, n);
}
static void cuda_rowmv_bwd(cavs_ctx *c, long a, long b, const void *x, long ldx, const void *m, long ldm, const void *dy,
                           long lddy, void *dx, long lddx, void *dm, long lddm, int r0, int n) {
  if (dbl(c)) rowmv_bwd_as<double>(c, a, b, x, ldx, m, ldm, dy, lddy, dx, lddx, dm, lddm, r0, n);
  else rowmv_bwd_as<float>(c, a, b, x, ldx, m, ldm, dy, lddy, dx, lddx, dm, lddm, r0, n);
}
static void cuda_rowmm_fwd(cavs_ctx *c, long a, long b, long cc, const void *m, long ldm, const void *w, long ldw, void *y,
                           long ldy, int r0, int n) {
  if (dbl(c)) rowmm_fwd_as<double>(c, a, b, cc, m, ldm, w, ldw, y, ldy, r0, n);
  else rowmm_fwd_as<float>(c, a, b, cc, m, ldm, w, ldw, y, ldy, r0, n);
}
static void cuda_rowmm_bwd(cavs_ctx *c, long a, long b, long cc, const void *m, long ldm, const void *w, long ldw,
                           const void *dy, long lddy, void *dm, long lddm, void *dw, long lddw, int r0, int n) {
  if (dbl(c)) rowmm_bwd_as<double>(c, a, b, cc, m, ldm, w, ldw, dy, lddy, dm, lddm, dw, lddw, r0, n);
  else rowmm_bwd_as<float>(c, a, b, cc, m, ldm, w, ldw, dy, lddy, dm, lddm, dw, lddw, r0, n);
}

/* ---- losses: one block a row, reductions in shared memory ---- */

/* A loss's block for rows of w columns: the fewest threads, a warp or more and a power
   of two (the reductions halve it), that hold a column each, up to THREADS. A 5-class
   head takes a warp, where a block of THREADS would leave 251 threads idle through the
   reductions' barriers (and the emulator of the tests switch to each of them). Fixed by
   w alone, so a row's sums are added in one order run to run. */
static unsigned loss_threads(long w) {
  unsigned t = 32;
  while (t < (unsigned)THREADS && (long)t < w) t *= 2;
  return t;
}

template <typename R> __device__ R block_max(R v, R *sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s && sh[threadIdx.x + s] > sh[threadIdx.x]) sh[threadIdx.x] = sh[threadIdx.x + s];
    __syncthreads();
  }
  R r = sh[0];
  __syncthreads();
  return r;
}

template <typename R> __device__ R block_sum(R v, R *sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  R r = sh[0];
  __syncthreads();
  return r;
}

__device__ float dev_exp(float x) { return cavs_exp_f(x); }
__device__ double dev_exp(double x) { return exp(x); }

/* the row's max, its first argmax, and the sum of exp(z - max) */
template <typename R> __device__ void softmax_stats(const R *z, long w, R *sh, R *mx, long *am, R *se) {
  R m = z[0];
  for (long j = threadIdx.x; j < w; j += blockDim.x) m = z[j] > m ? z[j] : m;
  *mx = block_max<R>(m, sh);
  R first = (R)w; /* the least index holding the max, as a value of R (w < 2^24 in float) */
  for (long j = threadIdx.x; j < w; j += blockDim.x)
    if (z[j] == *mx && (R)j < first) first = (R)j;
  *am = (long)-block_max<R>(-first, sh);
  R s = 0;
  for (long j = threadIdx.x; j < w; j += blockDim.x) s += dev_exp(z[j] - *mx);
  *se = block_sum<R>(s, sh);
}

template <typename R>
__global__ void xent_fwd(const R *z, long ld, const int *label, const unsigned char *pushed, const unsigned char *root,
                         int *pred, bool first, double *sum, unsigned long long *cnt, int r0, long w) {
  __shared__ R sh[THREADS];
  long r = r0 + blockIdx.x;
  if (!pushed[r]) return;
  const R *zr = z + r * ld;
  R mx, se;
  long am;
  softmax_stats<R>(zr, w, sh, &mx, &am, &se);
  if (threadIdx.x) return;
  if (first) pred[r] = (int)am;
  int y = label[r];
  if (y < 0) return;
  atomicAdd(sum, log((double)se) + (double)mx - (double)zr[y]);
  atomicAdd(&cnt[0], 1ull);
  atomicAdd(&cnt[1], (unsigned long long)(am == y));
  if (root[r]) {
    atomicAdd(&cnt[2], 1ull);
    atomicAdd(&cnt[3], (unsigned long long)(am == y));
  }
}

template <typename R>
__global__ void xent_bwd(const R *z, long ld, const int *label, const unsigned char *pushed, R *dz, long ldd, R scale,
                         int r0, long w) {
  __shared__ R sh[THREADS];
  long r = r0 + blockIdx.x;
  if (!pushed[r] || label[r] < 0) return;
  const R *zr = z + r * ld;
  R mx, se;
  long am;
  softmax_stats<R>(zr, w, sh, &mx, &am, &se);
  R k = scale / se;
  R *g = dz + r * ldd;
  for (long j = threadIdx.x; j < w; j += blockDim.x) {
    R v = g[j] + k * dev_exp(zr[j] - mx); /* as the CPU's: the label's share after the sum */
    if (j == label[r]) v -= scale;
    g[j] = v;
  }
}

static void cuda_xent_fwd(cavs_ctx *c, int loss, const void *z, long ld, const int *label, int r0, int n, long w) {
  if (n <= 0) return;
  Dev *d = dev(model(c));
  if (dbl(c))
    CAVS_CUDA_LAUNCH_THREADS(xent_fwd<double>, n, loss_threads(w), on(c))((const double *)z, ld, label, c->pushed, c->root, d->pred, loss == 0, d->sum + loss,
                                     d->cnt + 4 * loss, r0, w);
  else
    CAVS_CUDA_LAUNCH_THREADS(xent_fwd<float>, n, loss_threads(w), on(c))((const float *)z, ld, label, c->pushed, c->root, d->pred, loss == 0, d->sum + loss,
                                    d->cnt + 4 * loss, r0, w);
  CKL(model(c));
}

/* The counts of the forward pass are on the host since its synchronize. */
static void cuda_xent_bwd(cavs_ctx *c, int loss, const void *z, long ld, const int *label, void *dz, long ldd, int r0,
                          int n, long w) {
  const cavs_loss_acc *a = &c->loss[loss];
  if (n <= 0 || !a->count) return;
  double scale = c->loss_scale / (double)cv_loss_count(c->model, loss);
  if (dbl(c))
    CAVS_CUDA_LAUNCH_THREADS(xent_bwd<double>, n, loss_threads(w), on(c))((const double *)z, ld, label, c->pushed, (double *)dz, ldd, scale, r0, w);
  else CAVS_CUDA_LAUNCH_THREADS(xent_bwd<float>, n, loss_threads(w), on(c))((const float *)z, ld, label, c->pushed, (float *)dz, ldd, (float)scale, r0, w);
  CKL(model(c));
}

template <typename R>
__global__ void mse_fwd(const R *p, long ld, const R *t, long ldt, const unsigned char *pushed,
                        const unsigned char *root, double *sum, unsigned long long *cnt, int r0, long w) {
  __shared__ double sh[THREADS];
  long r = r0 + blockIdx.x;
  if (!pushed[r]) return;
  double s = 0;
  for (long j = threadIdx.x; j < w; j += blockDim.x) {
    double e = (double)p[r * ld + j] - (double)t[r * ldt + j];
    s += e * e;
  }
  s = block_sum<double>(s, sh);
  if (threadIdx.x) return;
  atomicAdd(sum, s / (double)w);
  atomicAdd(&cnt[0], 1ull);
  if (root[r]) atomicAdd(&cnt[2], 1ull);
}

template <typename R>
__global__ void mse_bwd(const R *p, long ld, const R *t, long ldt, const unsigned char *pushed, R *dp, long ldd,
                        double scale, int r0, int n, long w);

template <>
__global__ void mse_bwd<float>(const float *p, long ld, const float *t, long ldt, const unsigned char *pushed, float *dp,
                               long ldd, double scale, int r0, int n, long w) {
  long r, j;
  if (!cell(r0, n, w, &r, &j) || !pushed[r]) return;
  dp[r * ldd + j] += cv_mse_grad_f(p[r * ld + j], t[r * ldt + j], scale);
}

template <>
__global__ void mse_bwd<double>(const double *p, long ld, const double *t, long ldt, const unsigned char *pushed,
                                double *dp, long ldd, double scale, int r0, int n, long w) {
  long r, j;
  if (!cell(r0, n, w, &r, &j) || !pushed[r]) return;
  dp[r * ldd + j] += cv_mse_grad_d(p[r * ld + j], t[r * ldt + j], scale);
}

static void cuda_mse_fwd(cavs_ctx *c, int loss, const void *p, long ld, const void *t, long ldt, int r0, int n, long w) {
  if (n <= 0) return;
  Dev *d = dev(model(c));
  if (dbl(c))
    CAVS_CUDA_LAUNCH_THREADS(mse_fwd<double>, n, loss_threads(w), on(c))((const double *)p, ld, (const double *)t, ldt, c->pushed, c->root, d->sum + loss,
                                    d->cnt + 4 * loss, r0, w);
  else
    CAVS_CUDA_LAUNCH_THREADS(mse_fwd<float>, n, loss_threads(w), on(c))((const float *)p, ld, (const float *)t, ldt, c->pushed, c->root, d->sum + loss,
                                   d->cnt + 4 * loss, r0, w);
  CKL(model(c));
}

static void cuda_mse_bwd(cavs_ctx *c, int loss, const void *p, long ld, const void *t, long ldt, void *dp, long ldd,
                         int r0, int n, long w) {
  const cavs_loss_acc *a = &c->loss[loss];
  if (n <= 0 || !a->count) return;
  double scale = c->loss_scale * 2.0 / ((double)cv_loss_count(c->model, loss) * (double)w);
  if (dbl(c))
    CAVS_CUDA_LAUNCH(mse_bwd<double>, blocks((long)n * w), on(c))((const double *)p, ld, (const double *)t, ldt, c->pushed,
                                                      (double *)dp, ldd, scale, r0, n, w);
  else
    CAVS_CUDA_LAUNCH(mse_bwd<float>, blocks((long)n * w), on(c))((const float *)p, ld, (const float *)t, ldt, c->pushed,
                                                     (float *)dp, ldd, scale, r0, n, w);
  CKL(model(c));
}

/* ---- the optimizer: the spans laid end to end, one thread an element ---- */

/* The flat index of element i of the concatenated spans. */
__device__ size_t flat_at(const size_t *off, const size_t *start, int ns, size_t i) {
  int k = cv_span_of(start, ns, i);
  return off[k] + (i - start[k]);
}

/* The weight decay and the gradients' squared norm: each block takes NORM_CHUNK elements
   of the spans end to end, each of its threads every THREADS-th of them (consecutive
   threads, consecutive elements: the loads coalesce), and writes its two sums to
   parts[2 t], parts[2 t + 1] (the squares of spans own and after into the second:
   experts placed on processes, the last spans this process's own experts', whose sum
   the processes add up); norm_sum adds the parts up in a fixed order. So the norm has
   the same bits run to run, and the same on ranks whose spans differ only past the
   shared ones (the parts of the elements they do not share add zeros): atomicAdds, one
   an element on one address, had neither, and queued millions deep. */
enum { NORM_PER_THREAD = 64, NORM_CHUNK = THREADS * NORM_PER_THREAD };
template <typename R>
__global__ void decay_norm(R *P, R *G, const size_t *off, const size_t *start, int ns, double wd, double *parts,
                           int own) {
  size_t total = start[ns], i0 = (size_t)blockIdx.x * NORM_CHUNK + threadIdx.x;
  double sum[2] = {0, 0};
  for (size_t i = i0; i < i0 + NORM_CHUNK && i < total; i += THREADS) {
    int k = cv_span_of(start, ns, i);
    size_t f = off[k] + (i - start[k]);
    if (wd != 0) G[f] += (R)(wd * P[f]);
    sum[k >= own] += (double)G[f] * (double)G[f];
  }
  if (!parts) return;
  size_t t = (size_t)blockIdx.x * THREADS + threadIdx.x;
  parts[2 * t] = sum[0];
  parts[2 * t + 1] = sum[1];
}

/* norm2[0..1] = the sums of the n pairs of parts: one block, thread t adding parts t,
   t + THREADS, ... in order, then the threads' sums halved in a tree */
__global__ void norm_sum(const double *parts, size_t n, double *norm2) {
  __shared__ double s[2][THREADS];
  double a = 0, b = 0;
  for (size_t i = threadIdx.x; i < n; i += THREADS) a += parts[2 * i], b += parts[2 * i + 1];
  s[0][threadIdx.x] = a;
  s[1][threadIdx.x] = b;
  __syncthreads();
  for (unsigned h = THREADS / 2; h > 0; h /= 2) {
    if (threadIdx.x < h) s[0][threadIdx.x] += s[0][threadIdx.x + h], s[1][threadIdx.x] += s[1][threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) norm2[0] = s[0][0], norm2[1] = s[1][0];
}

template <typename R> struct Update {
  int kind;
  R lr, a1, a2, ic1, ic2, e, mu, wd;
  double clip;
};

/* norm2: the gradients' squares summed by decay_norm, with a clip (else NULL): each
   thread scales by what cv_clip_scale makes of it, as the CPU's step does once */
template <typename R>
__global__ void update(R *P, R *G, R *M1, R *M2, const size_t *off, const size_t *start, int ns,
                       const double *norm2, Update<R> u);

/* the element's update: arith.h's, as the CPU's step calls it */
#define CV_UPDATE(R, S)                                                                                   \
  template <>                                                                                             \
  __global__ void update<R>(R * P, R * G, R *M1, R *M2, const size_t *off, const size_t *start,             \
                            int ns, const double *norm2, Update<R> u) {                                   \
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;                                             \
    if (i >= start[ns]) return;                                                                           \
    size_t f = flat_at(off, start, ns, i);                                                                \
    R sc = norm2 ? (R)cv_clip_scale(*norm2, u.clip) : (R)1;                                               \
    R g = sc * G[f];                                                                                      \
    G[f] = 0; /* zeroed as it is used: the next backward pass need not clear it */                       \
    switch (u.kind) {                                                                                     \
    case CAVS_SGD: cv_sgd_##S(&P[f], g, u.lr); break;                                                     \
    case CAVS_ADAGRAD: cv_adagrad_##S(&P[f], &M1[f], g, u.lr, u.e); break;                                \
    case CAVS_MOMENTUM: cv_momentum_##S(&P[f], &M1[f], g, u.lr, u.mu); break;                             \
    case CAVS_NESTEROV: cv_nesterov_##S(&P[f], &M1[f], g, u.lr, u.mu); break;                             \
    case CAVS_ADAMW:                                                                                      \
      cv_adamw_##S(&P[f], &M1[f], &M2[f], g, u.lr, u.a1, u.a2, u.ic1, u.ic2, u.e, u.wd);                  \
      break;                                                                                              \
    default: cv_adam_##S(&P[f], &M1[f], &M2[f], g, u.lr, u.a1, u.a2, u.ic1, u.ic2, u.e);                  \
    }                                                                                                     \
  }
CV_UPDATE(float, f)
CV_UPDATE(double, d)

/* off, start: the step's spans on the device */
template <typename R>
static void step_as(cavs_model *m, const cv_hyper *h, const size_t *off, const size_t *start, int ns, size_t total) {
  Dev *d = dev(m);
  R *P = (R *)m->pflat, *G = (R *)m->gflat;
  bool norm = h->clip > 0 || h->norm;
  /* experts placed on processes: this process's own experts' squares summed apart, and
     the processes' sums added (a collective: the host waits for the squares) */
  bool own = norm && h->own_norm2;
  if (h->l2 || norm) {
    unsigned chunks = (unsigned)(((long)total + NORM_CHUNK - 1) / NORM_CHUNK);
    size_t nparts = (size_t)chunks * THREADS;
    if (norm && nparts > d->capparts) {
      regrow(m, (void **)&d->norm_parts, 2 * sizeof(double) * nparts);
      d->capparts = d->failed ? 0 : nparts;
      if (d->failed) return; /* (nothing updated: the step is done again whole) */
    }
    if (norm) CK(m, cudaMemsetAsync(d->norm2, 0, 2 * sizeof(double), 0));
    if (chunks && !d->failed) {
      CAVS_CUDA_LAUNCH(decay_norm<R>, chunks, 0)(P, G, off, start, ns, h->l2, norm ? d->norm_parts : NULL,
                                                  own ? ns - h->nown : ns);
      CKL(m);
      if (norm) CAVS_CUDA_LAUNCH(norm_sum, 1, 0)(d->norm_parts, nparts, d->norm2);
      CKL(m);
    }
  }
  if (own) { /* (every process calls the collective at every such step, failed or not) */
    double sums[2] = {0, 0};
    if (!d->failed) CK(m, cudaMemcpy(sums, d->norm2, sizeof sums, cudaMemcpyDeviceToHost));
    sums[0] += h->own_norm2(m, sums[1]);
    if (!d->failed) CK(m, cudaMemcpy(d->norm2, sums, sizeof(double), cudaMemcpyHostToDevice));
  }
  if (h->norm) { /* to the host behind the step (only when asked: a step's bytes down are
                    the losses and predictions); cuda_synchronize hands it to the model */
    CK(m, cudaMemcpyAsync(d->norm2_host, d->norm2, sizeof(double), cudaMemcpyDeviceToHost, 0));
    m->norm_pending = true;
  }
  double c1 = 1 - pow(h->b1, (double)m->step), c2 = 1 - pow(h->b2, (double)m->step);
  Update<R> u = {h->kind,   (R)h->lr, (R)h->b1, (R)h->b2, (R)(1 / c1), (R)(1 / c2), (R)h->eps,
                 (R)h->mu, (R)h->decoupled, h->clip};
  CAVS_CUDA_LAUNCH(update<R>, blocks((long)total), 0)(P, G, (R *)m->m1, (R *)m->m2, off, start, ns,
                                                     h->clip > 0 ? d->norm2 : NULL, u);
  CKL(m);
}

/* On the legacy stream, after both of the pass's streams; nothing waits for it (the
   next forward pass's synchronize does). */
static int cuda_step(cavs_model *m, const cv_hyper *hy, const cv_span *sp, int ns) {
  Dev *d = dev(m);
  if (d->failed) return status(d); /* (nothing updated with what a failed pass left) */
  if (d->capspans < m->capspans + 1) { /* once: room for as many spans as the model can have */
    size_t n = 2 * ((size_t)m->capspans + 1);
    regrow(m, (void **)&d->spans_dev, sizeof(size_t) * n);
    regrow_pinned(m, (void **)&d->spans_host, sizeof(size_t) * n);
    size_t *h = (size_t *)realloc(d->spans_new, sizeof(size_t) * n);
    if (!h) return no_memory(m);
    d->spans_new = h;
    if (d->failed) return status(d);
    d->capspans = m->capspans + 1;
    d->nspans_sent = -1;
  }
  /* the spans as offsets and starts in their concatenation, sent in one copy when they
     are not the last step's (a model without lookup tables: only the first step's) */
  size_t *h = d->spans_new, total = 0, bytes = sizeof(size_t) * 2 * ((size_t)ns + 1);
  for (int k = 0; k < ns; k++) {
    h[k] = sp[k].off;
    h[ns + 1 + k] = total;
    total += sp[k].len;
  }
  h[ns] = 0;
  h[2 * ns + 1] = total;
  if (ns != d->nspans_sent || memcmp(h, d->spans_host, bytes)) {
    pinned_for_host(m, PIN_SPANS);
    memcpy(d->spans_host, h, bytes);
    CK(m, cudaMemcpyAsync(d->spans_dev, d->spans_host, bytes, cudaMemcpyHostToDevice, 0));
    d->busy |= PIN_SPANS;
    d->nspans_sent = ns;
  }
  const size_t *off = d->spans_dev, *start = d->spans_dev + ns + 1;
  if (total) {
    if (m->esize == 8) step_as<double>(m, hy, off, start, ns, total);
    else step_as<float>(m, hy, off, start, ns, total);
  }
  return status(d);
}

/* The first non-finite value: checked on the host, a piece at a time (this runs only
   when a loss was not finite, to name the culprit). */
static long cuda_first_bad(cavs_model *m, const void *p, size_t n) {
  double buf[4096];
  size_t per = sizeof buf / m->esize;
  for (size_t at = 0; at < n; at += per) {
    size_t len = n - at < per ? n - at : per;
    if (cudaMemcpy(buf, (const char *)p + at * m->esize, len * m->esize, cudaMemcpyDeviceToHost) != cudaSuccess)
      return -1;
    for (size_t i = 0; i < len; i++) {
      double x = m->esize == 8 ? buf[i] : (double)((const float *)buf)[i];
      if (!isfinite(x)) return (long)(at + i);
    }
  }
  return -1;
}

/* ---- a mixture of experts: routed on the device ----
 *
 * A routed stage's rows are routed where their gate values are: a thread a row picks
 * its K experts and kept weights (moe.h's cv_topk_row, the cpu's code), a counting sort
 * of the choices in tiles numbers the slots (the cpu's stable counting sort, with the
 * same slots: topk_tile_k below), and the products
 * over each expert's slots are one grouped kernel a stage (emm_rows_k, emm_dw_k) that
 * finds the experts' runs of slots in the route's device arrays: nothing the host
 * must know, so a routed pass waits for nothing and can be captured as a graph. The
 * pass's loads and the balancing loss's counts and summed probabilities stay on the
 * device until the forward pass's synchronize reads them back with the losses. The
 * rest (sbcast, erow, scomb, the gate's gradient) are the kernels below, each cell
 * summed in the cpu's order. */

/* The route's device arrays for K slots a row of the minibatch's rows and X experts
   (grown before any of the pass's stages wrote them: the first stage of a pass sizes
   them for the whole minibatch; with graphs, the schedule sizes the routes seen) */
static bool route_room(cavs_model *m, int id, int K, long X) {
  Dev *d = dev(m);
  long need = (long)K * m->rows, rows = m->rows;
  if (need > d->route[id].cap) {
    d->route[id].cap = 0;
    regrow(m, (void **)&d->route[id].rslot, sizeof(int) * (size_t)need);
    regrow(m, (void **)&d->route[id].sexp, sizeof(int) * (size_t)need);
    regrow(m, (void **)&d->route[id].ch, sizeof(int) * (size_t)need);
    if (!d->failed) d->route[id].cap = need;
  }
  if (rows > d->route[id].caprows || X > d->route[id].capx) {
    long r = rows > d->route[id].caprows ? rows : d->route[id].caprows;
    long x = X > d->route[id].capx ? X : d->route[id].capx;
    d->route[id].caprows = 0;
    regrow(m, (void **)&d->route[id].rb, sizeof(int) * (size_t)r);
    regrow(m, (void **)&d->route[id].re, sizeof(int) * (size_t)r);
    regrow(m, (void **)&d->route[id].p, sizeof(double) * (size_t)r * (size_t)x);
    if (!d->failed) d->route[id].caprows = r;
  }
  if (X > d->route[id].capx) {
    d->route[id].capx = 0;
    regrow(m, (void **)&d->route[id].cnt, sizeof(int) * (size_t)X);
    regrow(m, (void **)&d->route[id].acc, sizeof(long long) * 2 * (size_t)X);
    regrow(m, (void **)&d->route[id].psum, sizeof(double) * (size_t)X);
    regrow(m, (void **)&d->route[id].f, sizeof(double) * (size_t)X);
    regrow_pinned(m, (void **)&d->route[id].acc_host, sizeof(long long) * 2 * (size_t)X + sizeof(double) * (size_t)X);
    if (!d->failed) d->route[id].capx = X;
  }
  long tiles = X * (long)cavs_cuda_blocks(need, 1, THREADS);
  if (tiles > d->route[id].tcap) {
    d->route[id].tcap = 0;
    regrow(m, (void **)&d->route[id].tcnt, sizeof(int) * (size_t)tiles);
    if (!d->failed) d->route[id].tcap = tiles;
  }
  return !d->failed && d->route[id].cap >= need && d->route[id].caprows >= rows && d->route[id].capx >= X &&
         d->route[id].tcap >= tiles;
}

/* Before a pass, outside a graph's capture: every route a pass has run, sized for this
   minibatch (a graph's pass cannot allocate) */
static void routes_sized(cavs_model *m) {
  Dev *d = dev(m);
  for (int id = 0; id < CV_MAX_ROUTES; id++)
    if (d->route[id].K > 0) route_room(m, id, d->route[id].K, d->route[id].X);
}

/* a thread a row: its choices and kept weights, and with the balancing loss its whole
   softmax (p: the stage's rows) */
template <typename R>
__global__ void topk_rows_k(int K, long X, const R *g, long ldg, R *w, long ldw, int *ch, double *p, int r0, int n) {
  long r, j;
  if (!cell(r0, n, 1, &r, &j)) return;
  const R *gr = g + r * ldg;
  cv_topk_row(K, X, gr, w + r * ldw, ch + (long)K * r);
  if (p) cv_full_softmax(gr, X, p + (r - r0) * X);
}
/* The stage's slots, numbered by a stable counting sort of its K n choices in parallel
 * (the cpu's slots: an expert's slots after the experts' before it, each expert's in
 * row order). The choices are cut into tiles of THREADS, a block a tile: each choice's
 * rank among its tile's choices of its expert before it, and each tile's count per
 * expert (topk_tile_k); a thread an expert then turns its T tiles' counts into where
 * its slots of each tile begin within its own, and counts its choices
 * (topk_count_k), adds to them where its slots begin, after the experts' before it
 * (topk_base_k); and a thread a choice takes its slot, its tile's start plus its rank
 * (topk_place_k). Every count is an integer, so the slots are the same in any order
 * the threads run; the work is K n THREADS / 2 comparisons in shared memory and X T
 * cells, where one thread an expert reading all the choices was X K n in X threads. */

/* a block a tile: each choice's rank within the tile (kept in rslot until placed) and
   the tile's count of each expert (tcnt[e T + t], every expert's written) */
__global__ void topk_tile_k(int K, long X, const int *ch, int *rslot, int *tcnt, long T, int r0, int n) {
  __shared__ int sh[THREADS];
  long t = blockIdx.x, q0 = (long)K * r0 + t * THREADS, nq = (long)K * n - t * THREADS;
  if (nq > THREADS) nq = THREADS;
  int i = (int)threadIdx.x;
  for (long e = i; e < X; e += blockDim.x) tcnt[e * T + t] = 0;
  sh[i] = i < nq ? ch[q0 + i] : -1;
  __syncthreads(); /* (the zeros above before the counts below) */
  if (i >= nq) return;
  int e = sh[i], rank = 0;
  bool last = true;
  for (int j = 0; j < i; j++) rank += sh[j] == e;
  for (int j = i + 1; j < nq && last; j++) last = sh[j] != e;
  rslot[q0 + i] = rank;
  if (last) tcnt[(long)e * T + t] = rank + 1;
}
/* a thread a tile of CV_PSUM_ROWS rows and an expert (with the balancing loss): the
   expert's probabilities at the tile's rows summed in row order, written over the
   tile's first row's (moe.h's order: the cpu's tile sums) */
__device__ static void psum_tile(long X, double *p, int n, long t, long e) {
  long i0 = t * CV_PSUM_ROWS, i1 = i0 + CV_PSUM_ROWS < n ? i0 + CV_PSUM_ROWS : n;
  double s = p[i0 * X + e];
  for (long i = i0 + 1; i < i1; i++) s += p[i * X + e];
  p[i0 * X + e] = s;
}
__global__ void psum_tile_k(long X, double *p, long PT, int n) {
  long t, e;
  if (cell(0, PT, X, &t, &e)) psum_tile(X, p, n, t, e);
}
/* expert e's c choices of the stage added to the pass's load and, with the balancing
   loss (p), to its slots and its summed probability, the PT tiles' sums (psum_tile's)
   in tile order as the cpu adds them */
__device__ static void stage_loads(long X, long e, int c, const double *p, long PT, long long *acc, double *psum) {
  acc[e] += c;
  if (!p) return;
  acc[X + e] += c;
  double s = psum[e];
  for (long t = 0; t < PT; t++) s += p[t * CV_PSUM_ROWS * X + e];
  psum[e] = s;
}
/* a thread an expert: its tiles' counts turned into where its slots of each tile begin
   among its own; its choices among the stage's counted; the pass's load (acc[e]) and,
   with the balancing loss, its slots (acc[X + e]) and summed probability, the PT tiles'
   sums of rows (psum_tile_k's) added in tile order as the cpu adds them */
__global__ void topk_count_k(long X, int *tcnt, long T, const double *p, long PT, int *cnt, long long *acc,
                             double *psum) {
  long e, j;
  if (!cell(0, X, 1, &e, &j)) return;
  int c = 0;
  for (long t = 0; t < T; t++) {
    int v = tcnt[e * T + t];
    tcnt[e * T + t] = c;
    c += v;
  }
  cnt[e] = c;
  stage_loads(X, e, c, p, PT, acc, psum);
}
/* a thread an expert: where its slots begin, after the experts' before it, added to its
   tiles' starts; and each row's routing's rows [rb, re), the rows shared among the
   threads */
__global__ void topk_base_k(int K, long X, const int *cnt, int *tcnt, long T, int *rb, int *re, int r0, int n) {
  long e, j;
  if (!cell(0, X, 1, &e, &j)) return;
  long s = (long)K * r0;
  for (long i = 0; i < e; i++) s += cnt[i];
  for (long t = 0; t < T; t++) tcnt[e * T + t] += (int)s;
  for (long r = r0 + e; r < r0 + n; r += X) rb[r] = r0, re[r] = r0 + n;
}
/* a thread a choice: its slot (rslot), and the slot's expert (sexp) */
__global__ void topk_place_k(int K, const int *ch, const int *tcnt, long T, int *rslot, int *sexp, int r0, int n) {
  long q, j;
  if (!cell((long)K * r0, (long)K * n, 1, &q, &j)) return;
  int e = ch[q];
  int s = tcnt[(long)e * T + (q - (long)K * r0) / THREADS] + rslot[q];
  rslot[q] = s;
  sexp[s] = e;
}

/* A small stage routed by one block, in one launch where the tiled path above takes
 * five or six: a tree's levels, whose stages are mostly small, and where a launch's few
 * microseconds of the host's are most of what a kernel of a few hundred rows costs. The
 * same arrays, with the same values: the threads take the rows' top K (and their
 * softmax) a row each in turn; then the choices in chunks of a block, in order, each
 * choice's rank among its expert's choices before it (its chunk's, counted in shared
 * memory, and cnt[e], the earlier chunks'); a thread an expert its loads, the tiles' sums
 * of probabilities added in tile order (psum_tile_k's and topk_count_k's order, which is
 * moe.h's), and where its slots begin (in tcnt[e]); a thread a choice its slot. A stable
 * counting sort's slots are unique, so they are the tiled path's. One block's work grows
 * with the stage where the tiled path's spreads, so a stage is routed so only while it
 * has at most route_one_block choices (16 chunks) and a thread at most 1024 experts'
 * gate values to rank (a row of 1024, or 4 rows of 256); bounds chosen, not yet measured
 * on a GPU (bench/counts gives the launches). */
enum { ROUTE_ONE_BLOCK = 16 * THREADS, ROUTE_ROW_WORK = 1024 };
static long route_one_block = ROUTE_ONE_BLOCK; /* (the tests set it to 0: the tiled path) */
static bool in_one_block(int K, long X, int n) {
  return (long)K * n <= route_one_block && (n + THREADS - 1) / THREADS * X <= ROUTE_ROW_WORK;
}
template <typename R>
__global__ void route_block_k(int K, long X, const R *g, long ldg, R *w, long ldw, int *ch, double *p, int *rslot,
                              int *sexp, int *cnt, int *start, long long *acc, double *psum, int *rb, int *re, int r0,
                              int n) {
  __shared__ int sh[THREADS];
  int i = (int)threadIdx.x, T = (int)blockDim.x;
  long q0 = (long)K * r0, nq = (long)K * n;
  for (long r = r0 + i; r < r0 + n; r += T) {
    const R *gr = g + r * ldg;
    cv_topk_row(K, X, gr, w + r * ldw, ch + (long)K * r);
    if (p) cv_full_softmax(gr, X, p + (r - r0) * X);
    rb[r] = r0, re[r] = r0 + n;
  }
  for (long e = i; e < X; e += T) cnt[e] = 0;
  __syncthreads(); /* (the choices and the zeros before the ranks) */
  for (long c0 = 0; c0 < nq; c0 += T) {
    long m = nq - c0 < T ? nq - c0 : T;
    sh[i] = i < m ? ch[q0 + c0 + i] : -1;
    __syncthreads();
    int e = sh[i], rank = 0;
    bool last = i < m;
    if (i < m) {
      for (int j = 0; j < i; j++) rank += sh[j] == e;
      for (int j = i + 1; j < m && last; j++) last = sh[j] != e;
      rank += cnt[e];
      rslot[q0 + c0 + i] = rank;
    }
    __syncthreads(); /* (every rank read cnt before the chunk's counts are added) */
    if (last) cnt[e] = rank + 1;
    __syncthreads();
  }
  long PT = p ? (n + CV_PSUM_ROWS - 1) / CV_PSUM_ROWS : 0;
  for (long q = i; q < PT * X; q += T) psum_tile(X, p, n, q / X, q % X); /* a tile of rows, an expert */
  __syncthreads();
  for (long e = i; e < X; e += T) {
    long b = q0;
    for (long j = 0; j < e; j++) b += cnt[j];
    start[e] = (int)b;
    stage_loads(X, e, cnt[e], p, PT, acc, psum);
  }
  __syncthreads();
  for (long q = q0 + i; q < q0 + nq; q += T) {
    int e = ch[q], s = start[e] + rslot[q];
    rslot[q] = s;
    sexp[s] = e;
  }
}

/* A stage's routing in one block (route_block_k), or in tiles (the five or six kernels
   above): p the rows' softmax for the balancing loss's sums, or NULL */
static void route_in_block(cavs_ctx *c, int id, int K, long X, const void *g, long ldg, void *w, long ldw, double *p,
                           int r0, int n) {
  cavs_model *m = model(c);
  auto *q = &dev(m)->route[id];
  if (dbl(c))
    CAVS_CUDA_LAUNCH(route_block_k<double>, 1, on(c))(K, X, (const double *)g, ldg, (double *)w, ldw, q->ch, p,
                                                      q->rslot, q->sexp, q->cnt, q->tcnt, q->acc, q->psum, q->rb,
                                                      q->re, r0, n);
  else
    CAVS_CUDA_LAUNCH(route_block_k<float>, 1, on(c))(K, X, (const float *)g, ldg, (float *)w, ldw, q->ch, p,
                                                     q->rslot, q->sexp, q->cnt, q->tcnt, q->acc, q->psum, q->rb, q->re,
                                                     r0, n);
  CKL(m);
}
static void route_tiled(cavs_ctx *c, int id, int K, long X, const void *g, long ldg, void *w, long ldw, double *p,
                        int r0, int n) {
  cavs_model *m = model(c);
  auto *q = &dev(m)->route[id];
  if (dbl(c))
    CAVS_CUDA_LAUNCH(topk_rows_k<double>, blocks(n), on(c))(K, X, (const double *)g, ldg, (double *)w, ldw, q->ch,
                                                            p, r0, n);
  else
    CAVS_CUDA_LAUNCH(topk_rows_k<float>, blocks(n), on(c))(K, X, (const float *)g, ldg, (float *)w, ldw, q->ch, p,
                                                           r0, n);
  CKL(m);
  long T = (long)blocks((long)K * n); /* the stage's tiles of choices */
  long PT = p ? (n + CV_PSUM_ROWS - 1) / CV_PSUM_ROWS : 0; /* and of rows, for the sums */
  CAVS_CUDA_LAUNCH(topk_tile_k, (unsigned)T, on(c))(K, X, q->ch, q->rslot, q->tcnt, T, r0, n);
  CKL(m);
  if (p) {
    CAVS_CUDA_LAUNCH(psum_tile_k, blocks(PT * X), on(c))(X, p, PT, n);
    CKL(m);
  }
  CAVS_CUDA_LAUNCH(topk_count_k, blocks(X), on(c))(X, q->tcnt, T, p, PT, q->cnt, q->acc, q->psum);
  CKL(m);
  CAVS_CUDA_LAUNCH(topk_base_k, blocks(X), on(c))(K, X, q->cnt, q->tcnt, T, q->rb, q->re, r0, n);
  CKL(m);
  CAVS_CUDA_LAUNCH(topk_place_k, blocks((long)K * n), on(c))(K, q->ch, q->tcnt, T, q->rslot, q->sexp, r0, n);
  CKL(m);
}

static void cuda_topk_fwd(cavs_ctx *c, cv_route *rt, int K, long X, double bal, const void *g, long ldg, void *w,
                          long ldw, int r0, int n) {
  cavs_model *m = model(c);
  Dev *d = dev(m);
  int id = (int)(rt - m->route);
  if (d->route[id].K != K || d->route[id].X != X) d->route[id].K = K, d->route[id].X = X;
  if (m->no_alloc && (d->route[id].cap < (long)K * m->rows || d->route[id].caprows < m->rows ||
                      d->route[id].capx < X)) {
    /* (a routing no pass ran before, in a graph's pass: this pass fails, not the model;
       the next pass's schedule sizes its arrays) */
    if (!m->launch_failed)
      snprintf(m->err, sizeof m->err,
               "cuda: a mixture of experts' routing %d first ran in a pass captured as a CUDA graph "
               "(--cuda-graphs), which cannot make its arrays; the next pass can " WHERE_FMT,
               id, base_name(__FILE__), __LINE__);
    m->launch_failed = true;
    return;
  }
  if (!route_room(m, id, K, X)) {
    m->launch_failed = true; /* the rest of the pass reads no slot (moe.c); the message is the record's */
    return;
  }
  /* the host's part: the pass's bookkeeping (as cv_topk_route's) and the rows' routings */
  if (rt->pass != m->pass) {
    rt->pass = m->pass, rt->aux_rows = 0, rt->bal = bal, rt->nx_pass = X, rt->K = K;
    CK(m, cudaMemsetAsync(d->route[id].acc, 0, sizeof(long long) * 2 * (size_t)X, on(c)));
    CK(m, cudaMemsetAsync(d->route[id].psum, 0, sizeof(double) * (size_t)X, on(c)));
  }
  rt->stages++;
  if (bal > 0) rt->aux_rows += n;
  for (int r = r0; r < r0 + n; r++) rt->rbeg[r] = r0, rt->rend[r] = r0 + n;
  d->route[id].pending = true;
  double *p = bal > 0 ? d->route[id].p : NULL;
  if (in_one_block(K, X, n)) route_in_block(c, id, K, X, g, ldg, w, ldw, p, r0, n);
  else route_tiled(c, id, K, X, g, ldg, w, ldw, p, r0, n);
  /* expert parallelism plans each round's exchange from the slots' experts, on the host
     (moe.c): the stage's, read back (a wait, as each round's exchange waits) */
  if (m->ep.on && !d->failed)
    CK(m, cudaMemcpy(rt->sexp + (long)K * r0, d->route[id].sexp + (long)K * r0, sizeof(int) * (size_t)K * (size_t)n,
                     cudaMemcpyDeviceToHost));
}

/* The forward pass's routings' counts, read back with its losses: issued before the
   synchronize's wait (stats_issue), read after it into the host's arrays (stats_read):
   each expert's load added to the route's, the balancing loss's counts and sums */
static void route_stats_issue(cavs_model *m) {
  Dev *d = dev(m);
  for (int id = 0; id < CV_MAX_ROUTES && !d->failed; id++) {
    if (!d->route[id].pending) continue;
    long X = d->route[id].X;
    CK(m, cudaMemcpyAsync(d->route[id].acc_host, d->route[id].acc, sizeof(long long) * 2 * (size_t)X,
                          cudaMemcpyDeviceToHost, 0));
    CK(m, cudaMemcpyAsync(d->route[id].acc_host + 2 * X, d->route[id].psum, sizeof(double) * (size_t)X,
                          cudaMemcpyDeviceToHost, 0));
  }
}
static void route_stats_read(cavs_model *m) {
  Dev *d = dev(m);
  for (int id = 0; id < CV_MAX_ROUTES; id++) {
    if (!d->route[id].pending) continue;
    d->route[id].pending = false;
    cv_route *rt = &m->route[id];
    long X = d->route[id].X;
    const long long *a = d->route[id].acc_host;
    if (d->failed || X > rt->nx) continue;
    for (long j = 0; j < X; j++) rt->load[j] += (long)a[j];
    if (rt->bal > 0) {
      for (long j = 0; j < X; j++) rt->pcnt[j] = (long)a[X + j];
      memcpy(rt->psum, a + 2 * X, sizeof(double) * (size_t)X);
    }
  }
}

/* a thread an expert: the share of the forward pass's slots it received (moe.h's
   cv_balance_shares, from the device's counts) */
__global__ void shares_k(int K, long X, const long long *acc, long rows, double *f) {
  long e, j;
  if (!cell(0, X, 1, &e, &j)) return;
  f[e] = (double)acc[X + e] / ((double)K * (double)rows);
}

/* a thread a row: the gate's gradient (moe.h) */
template <typename R>
__global__ void topk_bwd_k(int K, long X, double scale, const double *f, const R *g, long ldg, const R *w, long ldw,
                           const R *dw, long lddw, R *dg, long lddg, const int *rslot, const int *sexp, int r0, int n) {
  long r, j;
  if (!cell(r0, n, 1, &r, &j)) return;
  cv_topk_bwd_row(K, X, scale, f, g + r * ldg, w + r * ldw, dw + r * lddw, dg + r * lddg, rslot + (long)K * r, sexp);
}
template <typename R>
static void topk_bwd_as(cavs_ctx *c, int id, int K, long X, double scale, const void *g, long ldg, const void *w,
                        long ldw, const void *dw, long lddw, void *dg, long lddg, int r0, int n) {
  Dev *d = dev(model(c));
  CAVS_CUDA_LAUNCH(topk_bwd_k<R>, blocks(n), on(c))(K, X, scale, d->route[id].f, (const R *)g, ldg, (const R *)w, ldw,
                                                    (const R *)dw, lddw, (R *)dg, lddg, d->route[id].rslot,
                                                    d->route[id].sexp, r0, n);
  CKL(model(c));
}
static void cuda_topk_bwd(cavs_ctx *c, cv_route *rt, int K, long X, double bal, const void *g, long ldg, const void *w,
                          long ldw, const void *dw, long lddw, void *dg, long lddg, int r0, int n) {
  cavs_model *m = model(c);
  Dev *d = dev(m);
  int id = (int)(rt - m->route);
  if (X > d->route[id].capx) { /* (no forward pass routed it: moe.c refuses that first) */
    m->launch_failed = true;
    return;
  }
  double scale = cv_balance_scale(rt, X, bal, c->loss_scale);
  if (scale != 0 && (!d->route[id].f_made || d->route[id].f_pass != rt->pass)) {
    /* the forward pass's shares, once a backward pass, on its stream */
    CAVS_CUDA_LAUNCH(shares_k, blocks(X), on(c))(K, X, d->route[id].acc, rt->aux_rows, d->route[id].f);
    CKL(m);
    d->route[id].f_pass = rt->pass, d->route[id].f_made = true;
  }
  if (dbl(c)) topk_bwd_as<double>(c, id, K, X, scale, g, ldg, w, ldw, dw, lddw, dg, lddg, r0, n);
  else topk_bwd_as<float>(c, id, K, X, scale, g, ldg, w, ldw, dw, lddw, dg, lddg, r0, n);
}

/* The balancing loss's sums set on the host (cavs_model_set_balance: a part of a
   minibatch told the whole's, between its forward and backward passes, outside any
   capture): the shares the gate's gradient reads made from them, as shares_k makes
   them from the device's counts, and marked made for this pass */
static int cuda_balance_set(cavs_model *m, cv_route *rt) {
  Dev *d = dev(m);
  int id = (int)(rt - m->route);
  long X = rt->nx_pass;
  if (X > d->route[id].capx) { /* (no forward pass routed it on the device) */
    snprintf(m->err, sizeof m->err, "cuda: routing %d was not routed on the device " WHERE_FMT, id,
             base_name(__FILE__), __LINE__);
    return -1;
  }
  cv_balance_shares(rt, rt->K, X, rt->scr);
  CK(m, cudaMemcpyAsync(d->route[id].f, rt->scr, sizeof(double) * (size_t)X, cudaMemcpyHostToDevice, d->st[0]));
  wait_device(m); /* (rt->scr is the host's: the copy done before the host writes it again) */
  d->route[id].f_pass = rt->pass, d->route[id].f_made = !d->failed;
  return status(d);
}

/* ---- an expert's products, grouped: one launch a stage ----
 *
 * The slots of a stage's range are sorted by expert within each routing (a routing: a
 * forward stage's rows; a backward range may hold several, rb and re say where each
 * ends). A block of emm_rows_k takes EM consecutive slots and EN columns of the result
 * and, for each run of one expert's slots among them, multiplies those rows by that
 * expert's matrix (rows outside the run read as zeros and are not written): the extra
 * work is at most a block's per run boundary, as an expert's last partial tile costs in
 * a grouped product that pads each expert to whole tiles (MegaBlocks), and nothing is
 * padded or dropped. A block of emm_dw_k takes one expert and EM x EN of its matrix's
 * gradient and sums x^T dy over that expert's slots, found by a binary search in each
 * routing of the range, in slot order; an expert without slots writes nothing. Each
 * thread keeps a 4 x 4 tile of the block's 64 x 64 (EM x EN), the operands staged EK
 * deep in shared memory. Not yet run on a GPU: plain FP32 tiles, untuned. */
enum { EM = 64, EN = 64, EK = 16, ET = 16 /* threads a side: 16 x 16 = THREADS */ };
static_assert(ET * ET == THREADS, "the grouped products' tiles take a block's threads as ET x ET");

/* The block's EM x EN tile of C += A B over k in [k0, k1) (kk's operands from the
   loaders), accumulated in acc: the shared loops common to both kernels */
template <typename R> struct Tile {
  R a[EK][EM + 1], b[EK][EN + 1]; /* (a column apart: a warp's stores, k apart, in different banks) */
};
template <typename R> __device__ void tile_fma(const Tile<R> *t, R acc[4][4]) {
  int tx = threadIdx.x % ET, ty = threadIdx.x / ET;
  for (int kk = 0; kk < EK; kk++)
    for (int i = 0; i < 4; i++) {
      R ai = t->a[kk][ty + ET * i];
      for (int j = 0; j < 4; j++) acc[i][j] += ai * t->b[kk][tx + ET * j];
    }
}

/* y[s, j] (j < N) = (bias ? bias[e ldb + j] : add ? y[s, j] : 0) + sum_p x[s, p] B_e(p, j)
   over the range's slots s, e = sexp[s], p < Kd; B_e(p, j) = t[e ldt + p N + j], or with
   tb t[e ldt + j Kd + p] (the forward product x W_e with W_e [A, B]: N = B, Kd = A; dx =
   dy W_e^T: tb, N = A, Kd = B). The bias row read at the store is the one erow_fwd_k
   wrote before the product added, so the same bits in one launch, not two. With act,
   forward stores act of that, and dx (tb) the gradient of act's input from it, act's
   output at ya[s, j] (moe.h: the cpu's operations on the same values). */
template <typename R, bool TB>
__global__ void emm_rows_k(long N, long Kd, const R *x, long ldx, const R *t, long ldt, const R *bias, long ldb, R *y,
                           long ldy, bool add, int act, const R *ya, long ldya, const int *sexp, long s0, long sn,
                           long ntn) {
  __shared__ Tile<R> sh;
  long q = blockIdx.x, lo = s0 + q / ntn * EM, hi = lo + EM < s0 + sn ? lo + EM : s0 + sn, c0 = q % ntn * EN;
  int tx = threadIdx.x % ET, ty = threadIdx.x / ET;
  for (long a = lo, b; a < hi; a = b) {
    int e = sexp[a];
    for (b = a + 1; b < hi && sexp[b] == e; b++)
      ;
    const R *te = t + (long)e * ldt;
    R acc[4][4] = {};
    for (long k0 = 0; k0 < Kd; k0 += EK) {
      for (int l = threadIdx.x; l < EK * EM; l += blockDim.x) {
        int i = l / EK, kk = l % EK;
        long s = lo + i, k = k0 + kk;
        sh.a[kk][i] = s >= a && s < b && k < Kd ? x[s * ldx + k] : (R)0;
      }
      for (int l = threadIdx.x; l < EK * EN; l += blockDim.x) {
        int kk = TB ? l % EK : l / EN, jj = TB ? l / EK : l % EN;
        long k = k0 + kk, j = c0 + jj;
        sh.b[kk][jj] = k < Kd && j < N ? (TB ? te[j * Kd + k] : te[k * N + j]) : (R)0;
      }
      __syncthreads();
      tile_fma(&sh, acc);
      __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
      long s = lo + ty + ET * i;
      if (s < a || s >= b) continue;
      for (int jj = 0; jj < 4; jj++) {
        long j = c0 + tx + ET * jj;
        if (j >= N) continue;
        R v = bias ? bias[e * ldb + j] + acc[i][jj] : add ? y[s * ldy + j] + acc[i][jj] : acc[i][jj];
        y[s * ldy + j] = !act ? v : TB ? cv_act_grad(act, ya[s * ldya + j], v) : cv_act(act, v);
      }
    }
  }
}

/* The first slot of [lo, hi) whose expert is at least e (sorted there) */
__device__ static long first_of(const int *sexp, long lo, long hi, long e) {
  while (lo < hi) {
    long mid = lo + (hi - lo) / 2;
    if (sexp[mid] < e) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* dt[e ldt + i B + j] += sum_s x[s, i] dy[s, j] over expert e's slots of the range, in
   slot order; blocks: X experts, each ntm x ntn tiles of [A, B]. With dbias, the blocks of
   the first tile row also add dy's rows to dbias[e lddb + j] in slot order, from the
   staged tiles (the first row of threads, each its 4 columns): erow_bwd_k's sums, in its
   order, so its bits. */
template <typename R>
__global__ void emm_dw_k(long A, long B, const R *x, long ldx, const R *dy, long lddy, R *dt, long lddt, R *dbias,
                         long lddb, const int *sexp, const int *rb, const int *re, int K, long s0, long sn, long ntm,
                         long ntn) {
  __shared__ Tile<R> sh;
  long q = blockIdx.x, e = q / (ntm * ntn), r0 = q % (ntm * ntn) / ntn * EM, c0 = q % ntn * EN, any = 0;
  int tx = threadIdx.x % ET, ty = threadIdx.x / ET;
  R acc[4][4] = {}, bacc[4] = {};
  bool biased = dbias && r0 == 0 && ty == 0, started = false;
  for (long s = s0; s < s0 + sn;) {
    long row = s / K, lo = (long)K * rb[row], hi = (long)K * re[row];
    long a = first_of(sexp, lo, hi, e), b = first_of(sexp, a, hi, e + 1);
    any += b - a;
    for (long k0 = a; k0 < b; k0 += EK) {
      for (int l = threadIdx.x; l < EK * EM; l += blockDim.x) {
        int kk = l / EM, i = l % EM;
        long k = k0 + kk, col = r0 + i;
        sh.a[kk][i] = k < b && col < A ? x[k * ldx + col] : (R)0;
      }
      for (int l = threadIdx.x; l < EK * EN; l += blockDim.x) {
        int kk = l / EN, jj = l % EN;
        long k = k0 + kk, j = c0 + jj;
        sh.b[kk][jj] = k < b && j < B ? dy[k * lddy + j] : (R)0;
      }
      __syncthreads();
      tile_fma(&sh, acc);
      for (int kk = 0; biased && kk < EK && k0 + kk < b; kk++) {
        for (int jj = 0; jj < 4; jj++) {
          long j = c0 + tx + ET * jj;
          if (j >= B) continue;
          /* (from the row's value, read at the first slot, as erow_bwd_k and the cpu add) */
          if (!started) bacc[jj] = dbias[e * lddb + j];
          bacc[jj] += sh.b[kk][tx + ET * jj];
        }
        started = true;
      }
      __syncthreads();
    }
    s = hi > s ? hi : s + 1;
  }
  if (!any) return;
  if (biased)
    for (int jj = 0; jj < 4; jj++) {
      long j = c0 + tx + ET * jj;
      if (j < B) dbias[e * lddb + j] = bacc[jj];
    }
  R *de = dt + e * lddt;
  for (int i = 0; i < 4; i++) {
    long r = r0 + ty + ET * i;
    if (r >= A) continue;
    for (int jj = 0; jj < 4; jj++) {
      long j = c0 + tx + ET * jj;
      if (j < B) de[r * B + j] += acc[i][jj];
    }
  }
}

static long tiles(long n, long t) { return (n + t - 1) / t; }
template <typename R>
__global__ void erow_bwd_k(R *t, long ldt, const R *y, long ldy, long w, const int *sexp, const int *rb, const int *re,
                           int K, long X, long s0, long sn);

template <typename R>
static void emm_fwd_as(cavs_ctx *c, int id, long A, long B, const void *x, long ldx, const void *t, long ldt,
                       const void *bias, long ldb, void *y, long ldy, bool add, int act, long s0, long sn) {
  Dev *d = dev(model(c));
  long ntn = tiles(B, EN);
  CAVS_CUDA_LAUNCH((emm_rows_k<R, false>), cavs_cuda_blocks(tiles(sn, EM) * ntn, 1, 1), on(c))(
      B, A, (const R *)x, ldx, (const R *)t, ldt, (const R *)bias, ldb, (R *)y, ldy, add, act, (const R *)NULL, 0,
      d->route[id].sexp, s0, sn, ntn);
  CKL(model(c));
}
template <typename R>
static void emm_bwd_as(cavs_ctx *c, int id, int K, long X, long A, long B, const void *x, long ldx, const void *t,
                       long ldt, const void *dy, long lddy, void *dx, long lddx, bool dx_set, int dx_act, void *dt,
                       long lddt, void *dbias, long lddb, long s0, long sn) {
  Dev *d = dev(model(c));
  if (dx) {
    long ntn = tiles(A, EN);
    CAVS_CUDA_LAUNCH((emm_rows_k<R, true>), cavs_cuda_blocks(tiles(sn, EM) * ntn, 1, 1), on(c))(
        A, B, (const R *)dy, lddy, (const R *)t, ldt, (const R *)NULL, 0, (R *)dx, lddx, !dx_set, dx_act,
        (const R *)x, ldx, d->route[id].sexp, s0, sn, ntn);
    CKL(model(c));
  }
  if (dt) {
    long ntm = tiles(A, EM), ntn = tiles(B, EN);
    CAVS_CUDA_LAUNCH(emm_dw_k<R>, cavs_cuda_blocks(X * ntm * ntn, 1, 1), on(c))(
        A, B, (const R *)x, ldx, (const R *)dy, lddy, (R *)dt, lddt, (R *)dbias, lddb, d->route[id].sexp,
        d->route[id].rb, d->route[id].re, K, s0, sn, ntm, ntn);
    CKL(model(c));
  } else if (dbias) { /* (a frozen matrix, its bias trained: the bias's sums alone) */
    CAVS_CUDA_LAUNCH(erow_bwd_k<R>, blocks(X * B), on(c))((R *)dbias, lddb, (const R *)dy, lddy, B, d->route[id].sexp,
                                                        d->route[id].rb, d->route[id].re, K, X, s0, sn);
    CKL(model(c));
  }
}

/* forward, a thread a slot's cell: x's row to the slot; backward, a thread a row's cell:
   its slots' gradients added in slot order */
template <typename R>
__global__ void sbcast_fwd_k(const R *x, long ldx, R *s, long lds, long w, const int *rslot, int K, int r0, int n) {
  long q, j;
  if (!cell(0, (long)K * n, w, &q, &j)) return;
  s[(long)rslot[(long)K * r0 + q] * lds + j] = x[(r0 + q / K) * ldx + j];
}
template <typename R>
__global__ void sbcast_bwd_k(R *x, long ldx, const R *s, long lds, long w, const int *rslot, int K, int r0, int n) {
  long r, j;
  if (!cell(r0, n, w, &r, &j)) return;
  R a = x[r * ldx + j];
  for (int k = 0; k < K; k++) a += s[(long)rslot[(long)K * r + k] * lds + j];
  x[r * ldx + j] = a;
}
/* forward, a thread a slot's cell: its expert's row of the table */
template <typename R>
__global__ void erow_fwd_k(const R *t, long ldt, R *y, long ldy, long w, const int *sexp, long s0, long sn) {
  long q, j;
  if (!cell(0, sn, w, &q, &j)) return;
  y[(s0 + q) * ldy + j] = t[(long)sexp[s0 + q] * ldt + j];
}
/* backward, a thread an expert's cell: its slots' gradients added to it in slot order
   (moe.c's order, so the cpu's bits), its slots found in each routing of the range as
   emm_dw_k finds them. (It was a thread a column adding every slot in turn into the
   table: w threads, each a chain of sn dependent updates of global memory.) */
template <typename R>
__global__ void erow_bwd_k(R *t, long ldt, const R *y, long ldy, long w, const int *sexp, const int *rb, const int *re,
                           int K, long X, long s0, long sn) {
  long e, j;
  if (!cell(0, X, w, &e, &j)) return;
  R a = 0;
  bool any = false; /* (an expert without slots: its row not read, which a rank of
                       --expert-parallel may not hold, nor written) */
  for (long s = s0; s < s0 + sn;) {
    long row = s / K, lo = (long)K * rb[row], hi = (long)K * re[row];
    long b = first_of(sexp, lo, hi, e + 1);
    for (long u = first_of(sexp, lo, b, e); u < b; u++) {
      if (!any) a = t[e * ldt + j], any = true;
      a += y[u * ldy + j];
    }
    s = hi > s ? hi : s + 1;
  }
  if (any) t[e * ldt + j] = a;
}
/* a thread a row's cell: the sum of its slots' values, each weighted by its expert's
   kept gate weight, from 0 in slot order */
template <typename R>
__global__ void scomb_fwd_k(const R *v, long ldv, const R *wt, long ldw, R *y, long ldy, long w, const int *rslot,
                            const int *sexp, int K, int r0, int n) {
  long r, j;
  if (!cell(r0, n, w, &r, &j)) return;
  const int *sl = rslot + (long)K * r;
  R a = 0;
  for (int k = 0; k < K; k++) a += wt[r * ldw + sexp[sl[k]]] * v[(long)sl[k] * ldv + j];
  y[r * ldy + j] = a;
}
/* backward, one launch: a thread a slot's cell (dv, where not NULL: wd = w cells a
   slot, else 1), and the thread of each slot's first cell also its kept weight's
   gradient (dw: the slot's value's dot product with the row's gradient, moe.h's, as a
   thread a slot computed it in a launch of its own before). The K slots of a row have
   K experts, so no two threads add to one dw cell. */
template <typename R>
__global__ void scomb_bwd_k(const R *v, long ldv, const R *wt, long ldw, const R *dy, long lddy, R *dv, long lddv,
                            bool set, R *dw, long lddw, long w, long wd, const int *rslot, const int *sexp, int K,
                            int r0, int n) {
  long q, j;
  if (!cell(0, (long)K * n, wd, &q, &j)) return;
  long r = r0 + q / K;
  int s = rslot[(long)K * r0 + q];
  if (dv) {
    R g = wt[r * ldw + sexp[s]] * dy[r * lddy + j];
    dv[(long)s * lddv + j] = set ? g : dv[(long)s * lddv + j] + g;
  }
  if (dw && j == 0) dw[r * lddw + sexp[s]] += cv_slot_dot(dy + r * lddy, v + (long)s * ldv, w);
}

template <typename R>
static void sbcast_as(cavs_ctx *c, int id, int K, void *x, long ldx, void *s, long lds, long w, int r0, int n, bool bwd) {
  Dev *d = dev(model(c));
  if (w <= 0) return;
  if (bwd)
    CAVS_CUDA_LAUNCH(sbcast_bwd_k<R>, blocks((long)n * w), on(c))((R *)x, ldx, (const R *)s, lds, w, d->route[id].rslot,
                                                                 K, r0, n);
  else
    CAVS_CUDA_LAUNCH(sbcast_fwd_k<R>, blocks((long)K * n * w), on(c))((const R *)x, ldx, (R *)s, lds, w,
                                                                     d->route[id].rslot, K, r0, n);
  CKL(model(c));
}
template <typename R>
static void erow_as(cavs_ctx *c, const cv_route *rt, int id, int K, void *t, long ldt, void *y, long ldy, long w, int r0,
                    int n, bool bwd) {
  Dev *d = dev(model(c));
  long s0, sn;
  cv_slot_range(rt, K, r0, n, &s0, &sn);
  if (sn <= 0 || w <= 0) return;
  if (bwd)
    CAVS_CUDA_LAUNCH(erow_bwd_k<R>, blocks(d->route[id].X * w), on(c))((R *)t, ldt, (const R *)y, ldy, w,
                                                                      d->route[id].sexp, d->route[id].rb,
                                                                      d->route[id].re, K, d->route[id].X, s0, sn);
  else
    CAVS_CUDA_LAUNCH(erow_fwd_k<R>, blocks(sn * w), on(c))((const R *)t, ldt, (R *)y, ldy, w, d->route[id].sexp, s0, sn);
  CKL(model(c));
}
template <typename R>
static void scomb_fwd_as(cavs_ctx *c, int id, int K, const void *v, long ldv, const void *wt, long ldw, void *y, long ldy,
                         long w, int r0, int n) {
  Dev *d = dev(model(c));
  if (w <= 0) return;
  CAVS_CUDA_LAUNCH(scomb_fwd_k<R>, blocks((long)n * w), on(c))((const R *)v, ldv, (const R *)wt, ldw, (R *)y, ldy, w,
                                                              d->route[id].rslot, d->route[id].sexp, K, r0, n);
  CKL(model(c));
}
template <typename R>
static void scomb_bwd_as(cavs_ctx *c, int id, int K, const void *v, long ldv, const void *wt, long ldw, const void *dy,
                         long lddy, void *dv, long lddv, bool dv_set, void *dw, long lddw, long w, int r0, int n) {
  Dev *d = dev(model(c));
  if (w <= 0) dv = NULL;
  if (!dv && !dw) return;
  long wd = dv ? w : 1;
  CAVS_CUDA_LAUNCH(scomb_bwd_k<R>, blocks((long)K * n * wd), on(c))((const R *)v, ldv, (const R *)wt, ldw, (const R *)dy,
                                                                  lddy, (R *)dv, lddv, dv_set, (R *)dw, lddw, w, wd,
                                                                  d->route[id].rslot, d->route[id].sexp, K, r0, n);
  CKL(model(c));
}

static int route_id(cavs_ctx *c, const cv_route *rt) { return (int)(rt - model(c)->route); }

static void cuda_sbcast(cavs_ctx *c, const cv_route *rt, int K, void *x, long ldx, void *s, long lds, long w, int r0,
                        int n, bool bwd) {
  if (dbl(c)) sbcast_as<double>(c, route_id(c, rt), K, x, ldx, s, lds, w, r0, n, bwd);
  else sbcast_as<float>(c, route_id(c, rt), K, x, ldx, s, lds, w, r0, n, bwd);
}
static void cuda_erow(cavs_ctx *c, const cv_route *rt, int K, void *t, long ldt, void *y, long ldy, long w, int r0,
                      int n, bool bwd) {
  if (dbl(c)) erow_as<double>(c, rt, route_id(c, rt), K, t, ldt, y, ldy, w, r0, n, bwd);
  else erow_as<float>(c, rt, route_id(c, rt), K, t, ldt, y, ldy, w, r0, n, bwd);
}
static void cuda_scomb_fwd(cavs_ctx *c, const cv_route *rt, int K, const void *v, long ldv, const void *wt, long ldw,
                           void *y, long ldy, long w, int r0, int n) {
  if (dbl(c)) scomb_fwd_as<double>(c, route_id(c, rt), K, v, ldv, wt, ldw, y, ldy, w, r0, n);
  else scomb_fwd_as<float>(c, route_id(c, rt), K, v, ldv, wt, ldw, y, ldy, w, r0, n);
}
static void cuda_scomb_bwd(cavs_ctx *c, const cv_route *rt, int K, const void *v, long ldv, const void *wt, long ldw,
                           const void *dy, long lddy, void *dv, long lddv, bool dv_set, void *dw, long lddw, long w,
                           int r0, int n) {
  if (dbl(c)) scomb_bwd_as<double>(c, route_id(c, rt), K, v, ldv, wt, ldw, dy, lddy, dv, lddv, dv_set, dw, lddw, w, r0, n);
  else scomb_bwd_as<float>(c, route_id(c, rt), K, v, ldv, wt, ldw, dy, lddy, dv, lddv, dv_set, dw, lddw, w, r0, n);
}

static void cuda_emm_fwd(cavs_ctx *c, const cv_route *rt, int K, long A, long B, const void *x, long ldx, const void *t,
                         long ldt, const void *bias, long ldb, void *y, long ldy, bool add, int act, long s0, long sn) {
  if (sn <= 0 || A <= 0 || B <= 0) return;
  model(c)->stats.gemm_flops += 2.0 * (double)sn * (double)A * (double)B;
  if (dbl(c)) emm_fwd_as<double>(c, route_id(c, rt), A, B, x, ldx, t, ldt, bias, ldb, y, ldy, add, act, s0, sn);
  else emm_fwd_as<float>(c, route_id(c, rt), A, B, x, ldx, t, ldt, bias, ldb, y, ldy, add, act, s0, sn);
}
static void cuda_emm_bwd(cavs_ctx *c, const cv_route *rt, int K, long A, long B, const void *x, long ldx, const void *t,
                         long ldt, const void *dy, long lddy, void *dx, long lddx, bool dx_set, int dx_act, void *dt,
                         long lddt, void *dbias, long lddb, long s0, long sn) {
  if (sn <= 0 || A <= 0 || B <= 0) return;
  model(c)->stats.gemm_flops += 2.0 * (double)sn * (double)A * (double)B * ((dx != NULL) + (dt != NULL));
  if (dbl(c))
    emm_bwd_as<double>(c, route_id(c, rt), K, rt->nx_pass, A, B, x, ldx, t, ldt, dy, lddy, dx, lddx, dx_set, dx_act, dt,
                       lddt, dbias, lddb, s0, sn);
  else
    emm_bwd_as<float>(c, route_id(c, rt), K, rt->nx_pass, A, B, x, ldx, t, ldt, dy, lddy, dx, lddx, dx_set, dx_act, dt,
                      lddt, dbias, lddb, s0, sn);
}

/* an expert's activation over the slots, a thread a cell, where the products ran
   without it (expert parallelism's rounds): forward y = act(y), backward d = act's
   input's gradient from d and y (moe.h) */
template <typename R>
__global__ void act_k(int act, R *y, long ldy, R *d, long ldd, long w, long s0, long sn, bool bwd) {
  long q, j;
  if (!cell(0, sn, w, &q, &j)) return;
  long s = s0 + q;
  if (bwd) d[s * ldd + j] = cv_act_grad(act, y[s * ldy + j], d[s * ldd + j]);
  else y[s * ldy + j] = cv_act(act, y[s * ldy + j]);
}
template <typename R>
static void act_as(cavs_ctx *c, const cv_route *rt, int K, int act, void *y, long ldy, void *d, long ldd, long w,
                   int r0, int n, bool bwd) {
  long s0, sn;
  cv_slot_range(rt, K, r0, n, &s0, &sn);
  if (sn <= 0 || w <= 0) return;
  CAVS_CUDA_LAUNCH(act_k<R>, blocks(sn * w), on(c))(act, (R *)y, ldy, (R *)d, ldd, w, s0, sn, bwd);
  CKL(model(c));
}
static void cuda_act(cavs_ctx *c, const cv_route *rt, int K, int act, void *y, long ldy, void *d, long ldd, long w,
                     int r0, int n, bool bwd) {
  if (dbl(c)) act_as<double>(c, rt, K, act, y, ldy, d, ldd, w, r0, n, bwd);
  else act_as<float>(c, rt, K, act, y, ldy, d, ldd, w, r0, n, bwd);
}

static const cv_moe_ops cuda_moe = {
    cuda_topk_fwd,  cuda_topk_bwd, cuda_sbcast,  cuda_erow,    cuda_scomb_fwd,
    cuda_scomb_bwd, cuda_act,      cuda_emm_fwd, cuda_emm_bwd, cuda_balance_set,
};

/* What backend.c finds by name in this module. */
extern "C" const cv_backend cv_backend_cuda = {
    "cuda",
    "device memory, cuBLAS",
    CAVS_TARGET_CUDA,
    cuda_probe,
    cuda_open,
    cuda_close,
    cuda_alloc,
    cuda_release,
    cuda_zero,
    cuda_zero_rows,
    cuda_upload,
    cuda_download,
    cuda_upload2d,
    cuda_schedule,
    cuda_synchronize,
    cuda_gemm,
    cuda_gemm_rows,
    cuda_gemm_skip,
    NULL, /* gemm_distinct: every looked-up row multiplied */
    false, /* open_rows: rows without a word zeroed, the adding product one launch */
    cuda_loop,
    cuda_gather_fwd,
    cuda_gather_bwd,
    cuda_lookup_fwd,
    cuda_lookup_bwd,
    cuda_copy_rows,
    cuda_xent_fwd,
    cuda_xent_bwd,
    cuda_mse_fwd,
    cuda_mse_bwd,
    cuda_step,
    cuda_first_bad,
    cuda_stream,
    cuda_record,
    cuda_wait,
    cuda_pass_begin,
    cuda_pass_end,
    cuda_echild_fwd,
    cuda_echild_bwd,
    cuda_ebcast_fwd,
    cuda_ebcast_bwd,
    cuda_esum_fwd,
    cuda_esum_bwd,
    cuda_dropout_fwd,
    cuda_dropout_bwd,
    cuda_noise_fwd,
    cuda_noise_bwd,
    cuda_rowmv_fwd,
    cuda_rowmv_bwd,
    cuda_rowmm_fwd,
    cuda_rowmm_bwd,
    cuda_host_alloc,
    cuda_host_free,
    &cuda_moe,
    NULL, /* alloc_zeroed: cudaMalloc and a clear (device memory is not given back by page) */
    NULL, /* drop: expert parallelism runs on the cpu backend */
    NULL, /* gemms: one cuBLAS call after another on the stream */
};

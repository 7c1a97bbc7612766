/* backend.h: the backend seam of libcavs (private, not installed).
 *
 * A backend is where a model's state lives and where its arithmetic runs: one struct of
 * operations per backend (as ggml's ggml_backend_i, or QBE's Target), listed in the
 * registry of backend.c and chosen by name when a model is made (cavs_model_new_opts).
 * Everything a model owns that a kernel reads or writes (parameters, gradients,
 * optimizer moments, per-row buffers) is allocated, cleared, copied and freed through
 * these operations, so no file outside a backend touches backend memory. The scheduler
 * works in host arrays (the schedule: children, inputs, row flags); `schedule` hands a
 * minibatch's to the backend in one go (the CPU's reads them where they are).
 *
 * The compute operations take the arguments of the calls in cavs_abi.h that generated
 * code makes: backend.c's entry points forward each one to the model's backend.
 *
 * Adding a backend: one file in runtime/ that defines a cv_backend, one row in the
 * registry in backend.c (under the configure conditional that builds the file), and the
 * file in Makefile.am. A backend that needs libraries a CPU-only machine lacks is built
 * as a module, loaded by its registry row (as CUDA's is). */
#ifndef CV_BACKEND_H
#define CV_BACKEND_H

#include "cavs.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct cavs_model cavs_model;

/* Part of a flat parameter block (parameters, gradients, moments share one layout), in
 * scalars: the parts an optimizer step changes. */
typedef struct cv_span {
  size_t off, len;
} cv_span;

/* An optimizer step's settings as the backends take them (optim.c resolves them from a
 * cavs_optim): every default filled in, and weight decay split into what is added to the
 * gradient (l2: every kind but AdamW) and what is decoupled from it (decoupled: AdamW). */
typedef struct cv_hyper {
  int kind; /* enum cavs_optim_kind */
  double lr, clip, l2, decoupled;
  double b1, b2, eps; /* Adam, AdamW; eps Adagrad's too */
  double mu;          /* Momentum, Nesterov */
  int norm;           /* the gradients' global norm wanted without a clip too
                         (cavs_model_track_grad_norm): into m->grad_norm2 */
  /* experts placed on processes: the last nown spans are this process's own
     experts', whose squares, summed apart, own_norm2 adds over the processes (so that
     the norm, and its clip, are the whole model's and the same bits on each) */
  int nown;
  double (*own_norm2)(cavs_model *m, double mine);
} cv_hyper;

/* The CUDA module's table is named for this layout of cv_backend: a module built
   against another layout (a stale install) is refused when it is loaded, not called
   through the wrong slots. Bump the number when a slot is added, moved or changed, or
   when cavs_model (cv.h) or cv_hyper, which the module reads, change shape. */
#define cv_backend_cuda cv_backend_cuda_13
#define CV_BACKEND_CUDA_SYMBOL "cv_backend_cuda_13"

struct cv_moe_ops;
struct cv_gemm;
typedef struct cv_backend {
  const char *name;  /* what --device and cavs_model_opts.backend call it */
  const char *about; /* one line for the user: "host memory, OpenBLAS" */
  /* the cavsc target whose code runs on it (enum cavs_target): the C target's loops
     dereference state on the host, the CUDA target's launch kernels */
  int target;
  /* 0 when it can run on this machine; else -1 with the reason in msg */
  int (*probe)(char *msg, size_t len);
  /* a model is being made on it: apply the options (threads); -1 with the message in
     the model (cv_fail) */
  int (*open)(cavs_model *m, const cavs_model_opts *o);
  /* the model is being freed: release what open made (m->bs) */
  void (*close)(cavs_model *m);

  /* ---- memory ---- */
  /* 64-byte aligned, uninitialised; NULL on failure, and what failed in m->alloc_why
     when the backend can say more than "out of memory" (cudaMalloc's error), which the
     model's message then ends with (cv_fail_mem) */
  void *(*alloc)(cavs_model *m, size_t bytes);
  void (*release)(void *p);     /* NULL is fine */
  /* bytes at p to zero, in order with what the model has issued (on its current stream) */
  void (*zero)(cavs_model *m, void *p, size_t bytes);
  /* rows[0..n) of a block of rows of `row` bytes each, to zero (a lookup table's
     gradient rows a minibatch touched: hundreds of rows, one operation); -1 on failure */
  int (*zero_rows)(cavs_model *m, void *base, size_t row, const int *rows, int n);
  /* Host to backend, and backend to host, after what the model issued before: 0, or -1
     with the message in the model when the device failed (a fault of queued work, a
     lost device), the bytes at dst then not src's. A caller that keeps what it copied
     (a checkpoint) must check; one in a pass may leave it to the pass's end, which
     reports the model's failure. */
  int (*upload)(cavs_model *m, void *dst, const void *src, size_t bytes);
  int (*download)(cavs_model *m, void *dst, const void *src, size_t bytes);
  /* host to backend, `rows` rows of `width` bytes, their starts `spitch` apart on the
     host and `dpitch` in the backend's memory: one copy (a parameter's rows in its
     group, whose rows are wider), where one a row would wait for the device a row */
  int (*upload2d)(cavs_model *m, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows);
  /* the schedule of a minibatch is complete in the model's host arrays */
  int (*schedule)(cavs_model *m);
  /* every operation issued has finished (losses and predictions are readable in the
     model's host arrays); -1 with the message in the model when one of them failed */
  int (*synchronize)(cavs_model *m);

  /* ---- compute: the calls of cavs_abi.h, with the same arguments ---- */
  void (*gemm)(cavs_ctx *c, int ta, int tb, int m, int n, int k, double alpha, const void *a, long lda,
               const void *b, long ldb, double beta, void *cm, long ldc);
  void (*gemm_rows)(cavs_ctx *c, const int *idx, int skip, int r0, int n, int form, int cols, int k, const void *x,
                    long ldx, const void *w, long ldw, void *y, long ldy);
  void (*gemm_skip)(cavs_ctx *c, int skip, int r0, int n, int form, int cols, int k, const void *x, long ldx,
                    const void *w, long ldw, void *y, long ldy);
  /* optional (NULL: gemm_rows): cavs_gemm_table's product where x's rows are the
     table's (`trows` of them), each distinct row multiplied once; false where it did
     nothing (too few rows repeat, an index past trows, no memory): gemm_rows then */
  bool (*gemm_distinct)(cavs_ctx *c, const int *idx, int skip, int r0, int n, int form, int cols, int k, long trows,
                        const void *x, long ldx, const void *w, long ldw, void *y, long ldy);
  /* whether gemm_rows and gemm_distinct take CAVS_PROD_Y_OPEN and CAVS_PROD_Y_CLOSE
     (cv_gemm_rows_with does); false: backend.c hands them CAVS_PROD_Y (every row
     without an index zeroed) and CAVS_PROD_Y_ADD through gemm_skip instead, the same
     values in fewer calls where calls cost more than the clears */
  bool open_rows;
  void (*loop)(cavs_ctx *c, cavs_cols f, int r0, int n, long width, int flags); /* (cavs_loop's CAVS_LOOP_*) */
  void (*gather_fwd)(cavs_ctx *c, int k, int state, void *dst, long ld, int r0, int n);
  void (*gather_bwd)(cavs_ctx *c, int k, int state, const void *src, long ld, int r0, int n);
  void (*lookup_fwd)(cavs_ctx *c, const void *table, long ldt, const int *idx, void *dst, long ld, int r0, int n,
                     long width);
  void (*lookup_bwd)(cavs_ctx *c, void *dtable, long ldt, const int *idx, const void *src, long ld, int r0, int n,
                     long width);
  void (*copy_rows)(cavs_ctx *c, void *dst, long ldd, const void *src, long lds, int n, long w, int add);
  void (*xent_fwd)(cavs_ctx *c, int loss, const void *z, long ld, const int *label, int r0, int n, long w);
  void (*xent_bwd)(cavs_ctx *c, int loss, const void *z, long ld, const int *label, void *dz, long ldd, int r0,
                   int n, long w);
  void (*mse_fwd)(cavs_ctx *c, int loss, const void *p, long ld, const void *t, long ldt, int r0, int n, long w);
  void (*mse_bwd)(cavs_ctx *c, int loss, const void *p, long ld, const void *t, long ldt, void *dp, long ldd,
                  int r0, int n, long w);

  /* ---- whole-model operations ---- */
  /* One optimizer step over the spans of the flat blocks (m->pflat, gflat, m1, m2), -1
     with the message in the model when it failed: h->l2 weight decay, global-norm
     clipping, then h->kind's update with the step count in m->step, each gradient
     zeroed as the update uses it (the next backward pass then clears only what no step
     zeroed). */
  int (*step)(cavs_model *m, const cv_hyper *h, const cv_span *sp, int nspans);
  /* The index of the first NaN or infinity among n scalars of the model's precision at
     p, or -1. */
  long (*first_bad)(cavs_model *m, const void *p, size_t n);

  /* ---- streams (optional: NULL where everything runs in the order it is issued) ----
     A pass issues to stream 0 unless it says otherwise; the scheduler (scheduler.c)
     puts the eager phase on stream 1 and orders the two with events below CV_EVENTS,
     each recorded before it is waited for and used once a pass. */
  /* what is issued from now on goes to stream s (0 or 1) */
  void (*stream)(cavs_model *m, int s);
  /* event e marks everything issued to the current stream so far */
  void (*record)(cavs_model *m, int e);
  /* what is issued to the current stream from now on runs after event e */
  void (*wait)(cavs_model *m, int e);
  /* Around the steps of a pass (pass 0 forward, 1 backward), optional: the CUDA
     backend, asked for graphs, captures them and launches the graph; -1 with the
     message in the model when that failed */
  int (*pass_begin)(cavs_model *m, int pass);
  int (*pass_end)(cavs_model *m, int pass);

  /* ---- children as a set (`children *`; optional: a model with such a vertex is
     refused on a backend without them): the cavs_e* calls of cavs_abi.h ---- */
  void (*echild_fwd)(cavs_ctx *c, int state, void *dst, long ld, int r0, int n);
  void (*echild_bwd)(cavs_ctx *c, int state, const void *src, long ld, int r0, int n);
  void (*ebcast_fwd)(cavs_ctx *c, const void *src, long lds, void *dst, long ldd, long w, int r0, int n);
  void (*ebcast_bwd)(cavs_ctx *c, void *dsrc, long lds, const void *ddst, long ldd, long w, int r0, int n);
  void (*esum_fwd)(cavs_ctx *c, const void *src, long lds, void *dst, long ldd, long w, int r0, int n);
  void (*esum_bwd)(cavs_ctx *c, void *dsrc, long lds, const void *ddst, long ldd, long w, int r0, int n);
  /* dropout (optional: NULL fails the pass) */
  void (*dropout_fwd)(cavs_ctx *c, unsigned salt, double p, const void *x, long ldx, void *y, long ldy, long w, int r0,
                      int n);
  void (*dropout_bwd)(cavs_ctx *c, unsigned salt, double p, const void *dy, long ldy, void *dx, long ldx, long w, int r0,
                      int n);
  /* noise (optional: NULL fails the pass) */
  void (*noise_fwd)(cavs_ctx *c, unsigned salt, const void *x, long ldx, void *y, long ldy, long w, int r0, int n);
  void (*noise_bwd)(cavs_ctx *c, unsigned salt, const void *dy, long ldy, void *dx, long ldx, long w, int r0, int n);
  /* mv and mm of their own (optional: NULL runs backend.c's products row by row through
     gemm, which every backend has): the cavs_rowmv_* and cavs_rowmm_* calls */
  void (*rowmv_fwd)(cavs_ctx *c, long a, long b, const void *x, long ldx, const void *m, long ldm, void *y, long ldy,
                    int r0, int n);
  void (*rowmv_bwd)(cavs_ctx *c, long a, long b, const void *x, long ldx, const void *m, long ldm, const void *dy,
                    long lddy, void *dx, long lddx, void *dm, long lddm, int r0, int n);
  void (*rowmm_fwd)(cavs_ctx *c, long a, long b, long cc, const void *m, long ldm, const void *w, long ldw, void *y,
                    long ldy, int r0, int n);
  void (*rowmm_bwd)(cavs_ctx *c, long a, long b, long cc, const void *m, long ldm, const void *w, long ldw,
                    const void *dy, long lddy, void *dm, long lddm, void *dw, long lddw, int r0, int n);
  /* host memory that upload and download copy fastest from and to (optional: NULL is
     malloc and free): CUDA's pinned memory */
  void *(*host_alloc)(size_t bytes);
  void (*host_free)(void *p);
  /* a mixture of experts' kernels (optional: NULL fails the pass; moe.c), below */
  const struct cv_moe_ops *moe;
  /* ---- memory a process holds only in part (optional: NULL is alloc then zero, and
     nothing given back) ----
     alloc_zeroed: as alloc, but zero, and its pages taken from the system only as they
     are first written (the parameters, gradients and moments: a process that places
     the experts holds only its own experts' pages); drop: bytes [off, off + bytes) of a
     block alloc_zeroed made zeroed, the pages wholly inside them given back (moe.c:
     the other processes' experts) */
  void *(*alloc_zeroed)(cavs_model *m, size_t bytes);
  void (*drop)(void *block, size_t off, size_t bytes);
  /* ---- products with nothing between them (optional: NULL issues them one by one
     through gemm): none writes what another reads or writes (a mixture's experts, each
     over its own slots). The cpu backend runs them side by side on its threads, each
     on one, where a product split over the threads would spend as much in waiting
     and packing as in products (bench/README, "Experts side by side") ---- */
  void (*gemms)(cavs_ctx *c, const struct cv_gemm *g, int n);
} cv_backend;

/* One product of a list (gemms, cv_gemms): C = alpha op(A) op(B) + beta C, as gemm */
typedef struct cv_gemm {
  int ta, tb, m, n, k;
  double alpha, beta;
  const void *a, *b;
  void *c;
  long lda, ldb, ldc;
  /* then, with act (CAVS_ACT_*), C = act(C), or with grad C = act's input's gradient
     from C, its output's, and y [m, n], its output (moe.h's cv_act, cv_act_grad): an
     expert's activation on its rows while they are in the cache (cv_gemm_act) */
  int act;
  bool grad;
  const void *y;
  long ldy;
} cv_gemm;
/* the products of g[0..n), through the backend's gemms or one by one, each with its
   activation (host memory: the backends with gemms or none) */
void cv_gemms(cavs_ctx *c, const cv_gemm *g, int n);
/* g's activation on its C (host memory; nothing without act) */
void cv_gemm_act(cavs_ctx *c, const cv_gemm *g);

/* A mixture of experts' kernels over a stage's rows r0..r0+n-1 and their K slots each,
 * given the route's arrays (cv.h's struct cv_route; host memory). topk_fwd also fills
 * them, or (the cuda backend) routes on the device, filling only the host's rbeg and
 * rend and the pass's bookkeeping, and keeping the slots where its kernels read them;
 * it then has emm_fwd and emm_bwd. Without them the products (emm) go through the
 * backend's gemm, one an expert, from the host's arrays. */
struct cv_route;
typedef struct cv_moe_ops {
  void (*topk_fwd)(cavs_ctx *c, struct cv_route *rt, int K, long X, double balance, const void *g, long ldg, void *w,
                   long ldw, int r0, int n);
  void (*topk_bwd)(cavs_ctx *c, struct cv_route *rt, int K, long X, double balance, const void *g, long ldg,
                   const void *w, long ldw, const void *dw, long lddw, void *dg, long lddg, int r0, int n);
  /* forward, x's rows to their slots s; backward, the slots' gradients added to x's */
  void (*sbcast)(cavs_ctx *c, const struct cv_route *rt, int K, void *x, long ldx, void *s, long lds, long w, int r0,
                 int n, bool bwd);
  /* forward, each slot's expert's row of table t to y; backward, y's added to t's rows */
  void (*erow)(cavs_ctx *c, const struct cv_route *rt, int K, void *t, long ldt, void *y, long ldy, long w, int r0,
               int n, bool bwd);
  void (*scomb_fwd)(cavs_ctx *c, const struct cv_route *rt, int K, const void *v, long ldv, const void *wt, long ldw,
                    void *y, long ldy, long w, int r0, int n);
  /* (dv_set: dv's slots of the rows set, not added to) */
  void (*scomb_bwd)(cavs_ctx *c, const struct cv_route *rt, int K, const void *v, long ldv, const void *wt, long ldw,
                    const void *dy, long lddy, void *dv, long lddv, bool dv_set, void *dw, long lddw, long w, int r0,
                    int n);
  /* forward, y = act(y) at the slots of rows [r0, r0 + n); backward, d = the gradient of
     act's input from d, its output's, and y, its output (moe.h's cv_act, cv_act_grad):
     cavs_emm_*'s act where the products ran without it (expert parallelism's rounds) */
  void (*act)(cavs_ctx *c, const struct cv_route *rt, int K, int act, void *y, long ldy, void *d, long ldd, long w,
              int r0, int n, bool bwd);
  /* optional (NULL on the cpu): the products over the experts' slots [s0, s0 + sn) as
     one grouped operation, each slot's expert read where the backend keeps it: forward
     y (= or +=) x W_e, or y = bias_e + x W_e, then act; backward dx (= or +=) dy W_e^T
     (with dx_act, times its derivative at x), dW_e += x^T dy and dbias_e += dy (each may
     be NULL); cavs_emm_*'s (cavs_abi.h) */
  void (*emm_fwd)(cavs_ctx *c, const struct cv_route *rt, int K, long A, long B, const void *x, long ldx,
                  const void *t, long ldt, const void *bias, long ldb, void *y, long ldy, bool add, int act, long s0,
                  long sn);
  void (*emm_bwd)(cavs_ctx *c, const struct cv_route *rt, int K, long A, long B, const void *x, long ldx,
                  const void *t, long ldt, const void *dy, long lddy, void *dx, long lddx, bool dx_set, int dx_act,
                  void *dt, long lddt, void *dbias, long lddb, long s0, long sn);
  /* optional (NULL on the cpu, whose kernels read the host's counts): the route's
     balancing sums were set on the host (cavs_model_set_balance), between a forward pass
     and its backward pass: what the backward pass reads made the same; 0 or -1 (the
     message recorded) */
  int (*balance_set)(cavs_model *m, struct cv_route *rt);
} cv_moe_ops;
extern const cv_moe_ops cv_moe_cpu;
/* the CPU backend's threads of model m (pool.h), or NULL: one thread, or not the cpu */
struct cv_pool *cv_cpu_pool(const cavs_model *m);

enum { CV_EVENTS = 40 }; /* a pass's chunks (one a power of two of levels) and two more */

extern const cv_backend cv_backend_cpu;

/* The backend of that name in this build, loaded if it is a module; else NULL with the
 * reason in msg (an unknown name, a backend not built, a module that cannot load). */
const cv_backend *cv_backend_find(const char *name, char *msg, size_t len);

#endif

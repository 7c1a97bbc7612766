/* cv.h: libcavs internals shared by the runtime's files (not installed). */
#ifndef CV_H
#define CV_H

#include "backend.h"
#include "cavs.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>

/* libcavs is built for its architecture's baseline (configure.ac): a CPU kernel that
 * computes over every parameter or every row is CV_HOT, compiled also for AVX2 and
 * AVX-512, the version the processor can run chosen once when the library loads (GCC's
 * target_clones): kernels.h's, moe.c's. */
#ifndef CV_HOT
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && !defined(__cplusplus)
#define CV_HOT __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CV_HOT
#endif
#endif
/* A helper of CV_HOT kernels: inlined into each clone, so that it is compiled for the
   clone's instruction set (called, it would run the baseline's, SSE2 in a language
   model's softmax, where it was a fifth of the epoch). */
#ifndef CV_INLINE
#if defined(__GNUC__)
#define CV_INLINE static inline __attribute__((always_inline))
#else
#define CV_INLINE static inline
#endif
#endif

/* One step of a pass as the scheduler issues it (scheduler.c): a stage over rows, a
 * clear, or (with two streams) a switch of stream, an event recorded or waited for. */
enum cv_op_kind { CV_STAGE, CV_ZERO, CV_STREAM, CV_RECORD, CV_WAIT };
typedef struct cv_op {
  int kind;
  int on;          /* the stream it is issued to (the last CV_STREAM before it) */
  int arg;         /* the stream (CV_STREAM), the event (CV_RECORD, CV_WAIT) */
  cavs_stage f;    /* CV_STAGE: over rows [r0, r0 + n), the first `leaf` without children */
  int r0, n, leaf;
  int type;        /* CV_STAGE: the vertex type, or -1 */
  void *p;         /* CV_ZERO: bytes at p */
  size_t bytes;
} cv_op;

/* How a pass's two streams run when the backend has none (the tests' emulation of a
 * GPU's): in the order issued, or one stream as far ahead of the other as the events
 * allow, stream 0 first (the eager work as late as it may run) or stream 1 first (as
 * early as it may). */
enum cv_order { CV_ISSUED, CV_MAIN_FIRST, CV_SIDE_FIRST };

/* A mixture of experts' routing (moe.c): per slot (K a row of the minibatch's rows), its
 * expert and row; per row, its choices' slots; the experts' slot counts since
 * cavs_model_expert_load_reset; scratch */
enum { CV_MAX_ROUTES = 16, CV_MAX_K = 64 };
struct cv_route {
  int *sexp, *srow, *rslot;
  long cap; /* entries of each */
  int *rbeg, *rend; /* per row: the rows its routing grouped, [rbeg, rend) */
  double *scr;      /* [2 X] */
  /* the load-balancing loss of forward pass `pass`: its weight, the experts' count and
     K, each expert's slots and summed gate probability over the rows routed, the rows */
  unsigned pass;
  double bal;
  long nx_pass;
  int K;
  long *pcnt;
  double *psum;
  long aux_rows;
  int caprows;
  long nx;  /* experts that load and cnt hold */
  long stages;   /* the stages routed since the model was made (each a host wait on cuda) */
  long products; /* and the products over an expert's slots issued (emm's) */
  long *load, *cnt;
};
void cv_routes_free(cavs_model *m);
/* Expert parallelism (cavs_model_set_expert_comm; moe.c): the application's collectives
   (on: comm set), what they moved, and the exchange's buffers, grown only (buf[i] of
   cap[i] bytes) */
/* An expert table placed on the processes (an emm's param table [X, ldt], one parameter
   group): expert e's matrix (ab values at row e) is current on its owner alone, which
   steps it; stamp[e N + q] is the step (cavs_model.step) after which process q's copy
   was last made the owner's (a replica's weights are sent when older); dirty[e N + q]:
   q's copy gained a gradient in this backward pass (a replica's rows), to be sent home */
struct cv_ep_table {
  int64_t toff; /* in bytes, in the flat parameter block (and the gradient's) */
  long X, ldt, ab;
  int group;
  long *stamp;
  unsigned char *dirty;
};
enum { CV_EP_TABLES = 16 };
struct cv_experts {
  bool on;
  bool placed; /* tables are placed (and stay so: the comm is kept for steps and syncs) */
  bool failed; /* a step's collective (cv_experts_norm2) failed */
  cavs_expert_comm comm;
  cavs_expert_stats stats;
  void *buf[8];
  size_t cap[8];
  void *dbuf[2]; /* staging in the backend's memory (a device's: moe.c, ep_dbuf) */
  size_t dcap[2];
  int ntab;
  struct cv_ep_table tab[CV_EP_TABLES];
};
/* Rounds with no rows of this process's until every process has finished its pass
   (after each forward and backward pass with expert parallelism on), then after a
   backward pass (bwd) the replicas' gradients sent to their experts' owners: 0, or -1
   with the pass failed */
int cv_experts_drain(cavs_model *m, bool bwd);
/* The placed experts' spans of the flat block this process steps (its own experts'
   rows of each placed table): the group of placed table i, or -1 past the last; *off
   and *len its span here (len 0: no expert of it here) */
int cv_experts_own(const cavs_model *m, int i, size_t *off, size_t *len);
/* Whether parameter group g is a placed table, and then its span here as
   cv_experts_own's */
bool cv_experts_own_group(const cavs_model *m, int g, size_t *off, size_t *len);
/* The rows [*a, *b) of parameter group g this process holds: all of them but where g
   is a placed table (then its own experts') */
void cv_experts_rows_held(const cavs_model *m, int g, long *a, long *b);
/* What this process does not hold given back: every placed table's rows of the other
   processes' experts zeroed in the parameters, the gradient and the moments (their
   pages given back: cv_backend.drop) and their copies marked stale (on every process
   alike: it runs at the same points on each, when a table is placed and after each
   step), so that a replica's process is sent the owner's matrix */
void cv_experts_release(cavs_model *m);
/* After the parameters were made or read (cavs_model_init, a checkpoint), which write
   only each process's own experts of a placed table: every copy of another's marked
   stale, so that a replica is sent the owner's matrix (nothing given back: the rows
   these write are the process's own) */
void cv_experts_new_params(cavs_model *m);
/* The sum over the processes, in rank order, of each one's `mine` (the squares of its
   own experts' gradients, for a global-norm clip): every process calls it in the same
   step; on failure 0 with the model's error set and cv_experts_failed true */
double cv_experts_norm2(cavs_model *m, double mine);
void cv_experts_free(cavs_model *m);
/* The last forward pass's load-balancing losses (and whether any ran: *any) */
double cv_moe_aux(const cavs_model *m, bool *any);

struct cavs_model {
  const cavs_desc *d;
  const cv_backend *be; /* owns every buffer below that a kernel touches */
  void *bs;             /* the backend's own state (its streams, its copy of the schedule) */
  bool launch_failed;   /* a kernel of generated code did not launch, or a pass could not
                           be issued whole: m->err says why */
  int fail_errno;       /* what errno said of that failure (ENOMEM, EIO, else 0), for the
                           call after the pass that reports it: the step */
  cavs_backend_stats stats;
  cavs_ctx ctx;
  size_t esize; /* 4 (float) or 8 (double) */
  int policy;
  int ablate; /* enum cavs_ablation */
  char err[512];
  char alloc_why[160]; /* a backend's word on an allocation that failed (backend.h alloc) */
  /* that allocation failed because the device did (a fault, a lost device), not for
     want of memory: the device's failure is in err already (the first one), and is what
     the caller reports, with EIO */
  bool alloc_lost;
  /* parameters: one block, groups pointing into it */
  size_t nflat;
  void *pflat, *gflat;
  size_t *pg_off; /* per group: offset in scalars */
  long *pg_rows, *pg_cols;
  void **param, **pgrad;
  /* lookup tables: rows with a nonzero gradient (every other row's is zero) */
  int **touched;
  int *ntouched;
  unsigned char **mark;
  unsigned char *frozen; /* per parameter group: the optimizer leaves it as it is */
  /* per parameter group: its gradient is all zero (the step that used it zeroed it, in
     the same pass over it), so the next backward pass need not clear it */
  unsigned char *pg_clean;
  /* optimizer state; spans: scratch of optim.c */
  void *spans;
  int capspans;   /* allocated with the model: a step allocates nothing but Adam's moments */
  void *m1, *m2;
  long step;
  /* per-row buffers */
  int cap_rows;
  size_t model_bytes; /* parameters, gradients, the moment blocks held: counted against the limit */
  long *bw; /* widths */
  void **val, **grad; /* the buffers as allocated */
  /* what the stages see (ctx.val, ctx.grad): the buffers, but a gathered buffer of a
     type in tview points at its children's rows of the state buffer, and its gradient
     at theirs (cv_schedule: the gathers' views); cur_type is the type of the stage
     running (-1: none, or the pull or push block), whose gathers then copy nothing */
  void **cval, **cgrad;
  unsigned char *tview;
  int cur_type;
  /* homes (scheduler.c, plan_homes; cavs_ctx.home_val, home_grad), for k below nhomes
     (the most homes of a type; 0: no type has them): each row's k-th home and its
     gradient, in backend memory, [cap_rows]; hkey[k][r] = p * maxc + s where row r is
     at home in slot s of row p's gathered buffer (an edge e's key: cv_edge_key), else
     -1; hdump[k], [cap_rows, home_w], what a row without a k-th home stores its state
     to, which nothing reads (one for each k: a row's two stores never alias); hzero,
     [home_w], the zeros it reads as that home's gradient; home_w the widest state of a
     type with homes */
  void **hval[CAVS_MAX_HOMES], **hgrad[CAVS_MAX_HOMES];
  long *hkey[CAVS_MAX_HOMES];
  void *hdump[CAVS_MAX_HOMES], *hzero;
  long home_w;
  int nhomes;
  cavs_loss_acc *loss;
  /* [nlosses]: the rows each loss's mean divides by in the next backward pass
     (cavs_model_set_loss_counts: all ranks' rows); 0: this pass's own (loss[l].count) */
  long *loss_den;
  long voff; /* cavs_model_set_vertex_offset: the part's first vertex in the whole minibatch */
  /* carried state (cavs_model_carry_state): carry_state, the state buffer every vertex
     type scatters (-1: not carrying); carry, [capcarry, its width] in backend memory,
     row g the state graph g's last vertex left in the last pass, for its first ncarry
     graphs; carry_in, the rows of it this pass copied to state rows [rows, rows +
     carry_in), which its graphs' first vertices read as child 0 (vcar[v]: vertex v of
     the minibatch is such a first vertex) */
  int carry_state, ncarry, capcarry, carry_in;
  void *carry;
  unsigned char *vcar;
  /* the last step's squared global gradient norm (cavs_model_grad_norm), -1 when it
     computed none; a backend that keeps it on the device fills it in its synchronize,
     and norm_pending says one is on its way */
  double grad_norm2;
  bool track_norm, norm_pending;
  /* the minibatch */
  int rows, maxc;
  int *child;      /* [cap * maxc] */
  int **iin;       /* [nint][cap] */
  void **rin;      /* [nreal][cap * w] */
  long *rw;        /* real input widths */
  unsigned char *root, *pushed;
  int *pred;
  int *gbase, capgraphs, ngraphs; /* first vertex of each graph of the minibatch */
  int *gorder;     /* the graphs, largest first (number_rows numbers their roots so) */
  uint64_t *gkey;  /* (its sort keys) */
  int *type_r0, *type_n, *type_leaf; /* type_leaf: its rows without children, first in
                                        its range and all in its first task */
  int ntask, captask;
  int *task_r0, *task_n, *task_type, *task_leaf, *task_level, *task_cur;
  int nlevels;     /* distinct task_level values: levels (bfs, depth) or steps (agenda,
                      frontier), 0..nlevels-1, nondecreasing over the tasks */
  int lower_bound; /* the minibatch's longest path, in vertices */
  int *crow, capcrow; /* [chunk * T + t]: the first row of type t at the chunk's levels */
  /* cavs_gemm_kids's indices: per child slot, [rows] of the table child's index and
     [rows] of the others' (grown only) */
  int *kidx;
  size_t capkidx;
  long *tstate;           /* per type: the agenda and frontier policies' ready lists */
  int captstate;
  /* a pass as issued (scheduler.c): overlap puts the eager phase on a second stream,
     beside the path tasks (on by default where the backend has streams); order is how
     a backend without streams runs the two (tests) */
  cv_op *plan;
  int nplan, capplan;
  bool overlap;
  bool own_gemm;   /* the CPU backend's single-precision products through sgemm.c */
  bool small_gemm; /* its products of a few rows through cv_sgemm_small (AVX-512 or AVX2) */
  /* the last forward pass's logits of the first softmax_xent loss (generated code hands
     their buffer to cavs_xent_fwd): row r at xent_z + r * xent_ld, xent_w classes */
  const void *xent_z;
  long xent_ld, xent_w;
  unsigned pass; /* counts passes: the parameters do not change within one (the CPU
                    backend keeps packed parameters for the pass) */
  int order;
  int plan_pass; /* 0: the plan is a forward pass, 1: a backward one */
  /* cavs_model_set_grad_hook's: called as each group's gradient becomes final in a
     backward pass; grad_last[g], the plan step after which it is (-1: the pass's end) */
  cavs_grad_hook grad_hook;
  void *grad_arg;
  int *grad_last;
  /* scheduling scratch, grown only */
  int capv;
  long capedges;
  int *level, *row_of, *pcount, *padj, *queue, *vtype;
  int *vtask, *urg; /* a vertex's task; its longest path up to a root */
  int *nkids;       /* a vertex's children (cv_schedule, before rows are numbered) */
  int *kid_off, *kids; /* and which, in slot order: kids[kid_off[v] .. kid_off[v + 1]) */
  int *tcount;      /* [v * types + t]: the lower bound's counts */
  /* children as sets (`children *`): the edges, row by row (cavs_ctx.eoff); edge
     buffers hold cap_edges rows */
  int *eoff, *eparent, *echild;
  uint64_t *rkey; /* [cap_rows]: dropout's key of each row (cavs_ctx.rkey), made by the
                     first dropout of a minibatch (cv_drop_keys): rkey_ready */
  bool rkey_ready;
  void *rm_buf;   /* the CPU's mm: the rows' matrices packed into one, and its gradient */
  size_t rm_cap;
  uint64_t drop_seed; /* cavs_model_init's seed, or a checkpoint's */
  long nedges, cap_edges;
  int capeoff;
  int maxc_fixed; /* the most children of a vertex type that names them */
  bool has_edges; /* a type takes its children as a set */
  size_t captcount;
  int capcount;
  int *count;
  bool have_batch;
  bool no_grads; /* cavs_model_backward refused (the forward pass was in inference) */
  bool kept;     /* the last forward pass kept the values a backward pass reads */
  cavs_loss_acc *xent_acc; /* the CPU backend's softmax: a sum per chunk of rows, grown only */
  int capxent;
  /* inference's product tables (cavs_gemm_table): table w for a lookup table and a
     parameter, made once `rows` lookups went through the product; freed when inference
     is turned on or off (the parameters may have changed) */
  struct cv_ptable {
    const void *table, *w;
    long ldt, trows, ldw, rows;
    int cols, k;
    void *mem;
  } ptable[8];
  int nptable;
  /* the backend cannot allocate now (the CUDA backend captures a pass as a graph): a
     product table due is made before the next pass instead */
  bool no_alloc;
  struct cv_route route[CV_MAX_ROUTES];
  struct cv_experts ep;
  bool moe_balance; /* the last forward pass ran a load-balancing loss */
  bool targets_only; /* cavs_model_set_targets_only */
  int push_lo, push_hi; /* the rows the last forward pass ran the push block over (of the
                           types that push): all, or where a loss has a target */
};
/* inference's product tables, freed; those due made (before a pass) (backend.c) */
void cv_ptables_free(cavs_model *m);
void cv_ptables_ready(cavs_model *m);

/* The home key (cavs_model.hkey) of edge e of the minibatch: past every slot's */
static inline long cv_edge_key(const cavs_model *m, int e) { return (long)m->rows * m->maxc + e; }
/* Is row ch at home where `key` says (a slot of a gathered row, or an edge): did its
   loops store its state there, and will they read its gradient there? */
static inline bool cv_at_home(const cavs_model *m, int ch, long key) {
  for (int k = 0; k < m->nhomes; k++)
    if (m->hkey[k][ch] == key) return true;
  return false;
}

long cv_lin(const cavs_lin *l, const long *dims);
/* Is buffer b a dropout's output read at its input now (cavs_alias_desc: it keeps every
   value)? Then *src and *off say where. */
bool cv_aliased(const cavs_model *m, int b, int *src, long *off);
/* cv_lin in checked arithmetic: 0 and the value when it is in [0, LONG_MAX]. */
int cv_lin_checked(const cavs_lin *l, const long *dims, long *out);
/* *p grown to count elements of elem bytes, in checked arithmetic; on failure *p is
 * untouched and the message is in m->err (-1). */
int cv_grow(cavs_model *m, void *p, size_t elem, size_t count);
/* printf into m->err; returns -1 */
int cv_fail(cavs_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* the same for a failure to get memory: also sets errno to ENOMEM */
int cv_fail_mem(cavs_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A size in the unit that shows it ("512 bytes", "1.00 KiB", "2.50 GiB"), into buf. */
enum { CV_BYTES_LEN = 32 };
const char *cv_bytes(char buf[CV_BYTES_LEN], size_t b);

/* seconds on the monotonic clock (tensor.c) */
double cv_now(void);
/* scheduler.c */
int cv_schedule(cavs_model *m, const cavs_graph *const *graphs, int k);
/* The steps of the forward or backward pass of the scheduled minibatch into m->plan;
 * then run them (in m->order where the backend has no streams); -1 with the message
 * in m->err. Named cavs_ so that libcavs exports them, for the tests; not in cavs.h. */
int cavs_plan_forward(cavs_model *m);
int cavs_plan_backward(cavs_model *m);
int cavs_run_plan(cavs_model *m);
/* For the tests: every cell of every per-row buffer and its gradient, all the rows
 * allocated, set to NaN, so that a pass reading a cell nothing wrote shows (tensor.c). */
int cavs_model_poison(cavs_model *m);
/* optim.c */
void cv_sparse_reset(cavs_model *m);
/* The optimizer's state an optimizer of this kind reads: none (SGD), one block
 * (Adagrad's sums, momentum's buffer: m1) or two (Adam's moments: m1, m2) */
int cv_moments_of(int kind);
/* The first `n` moment blocks (cv_moments_of), zeroed, where the model lacks them,
 * each counted in m->model_bytes and so against the memory limit with the minibatch's
 * buffers as they are; -1 (message in m->err; errno ENOMEM past the limit) */
int cv_alloc_moments(cavs_model *m, int n);
/* Both blocks given back, and their bytes taken off m->model_bytes. */
void cv_release_moments(cavs_model *m);
/* bytes the backend zeroes, its pages taken as they are written where it can
   (cv_backend.alloc_zeroed); NULL on failure */
void *cv_alloc_zeroed(cavs_model *m, size_t bytes);
/* tensor.c */
int cv_grow_rows(cavs_model *m, int rows);
int cv_grow_edges(cavs_model *m, long edges);
/* The bytes of the minibatch buffers the model holds now (its rows' and its edges'); -1
   on overflow */
int cv_minibatch_bytes(const cavs_model *m, size_t *out);

/* errno for a failure of m (ENOMEM, EIO), kept as the pass's too: errno itself is not
   kept through what the pass runs after it (a successful call may change it), and the
   step after a failed pass says it again (optim.c) */
static inline void cv_errno(cavs_model *m, int e) {
  errno = e;
  if (!m->fail_errno) m->fail_errno = e;
}

/* The rows loss l's gradient divides by: cavs_model_set_loss_counts's, else the pass's */
static inline long cv_loss_count(const cavs_model *m, int l) { return m->loss_den[l] ? m->loss_den[l] : m->loss[l].count; }

#endif

/* cavs_abi.h: the contract between the code cavsc generates and libcavs: what a
 * generated MODEL.c includes, and all it includes of libcavs. An application includes
 * cavs.h (which includes this file for the descriptor types) and the generated MODEL.h.
 *
 * What is here: the model descriptor (cavs_desc and its parts, which cavsc writes as
 * static data), the context a stage runs in (cavs_ctx), the calls a stage makes into
 * the runtime (products, gathers, lookups, row copies, losses: the runtime hands each to
 * the model's backend), and the elementwise functions the fused loops inline. Every
 * kind, form and flag is a named enum, and generated code writes the names, never the
 * numbers.
 *
 * CAVS_ABI_VERSION changes whenever any of it changes in a way old generated code could
 * notice (a field moved, a call's meaning changed). A descriptor records the version it
 * was generated against (cavs_desc.abi); cavs_model_new refuses a mismatch with a message
 * that says to regenerate the model with this version's cavsc. */
#ifndef CAVS_ABI_H
#define CAVS_ABI_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 2: the contract moved out of cavs.h into this header; kinds and forms named.
 * 3: cavs_vertex_desc.eager_apart (the eager phase on a second stream); cavs_gemm_rows
 *    takes `skip`; cavs_buf_desc.grad is an enum cavs_grad_kind; cavs_loop.
 * 4: cavs_vertex_desc.gathers (gathered buffers the runtime may point at the state);
 *    cavs_desc.source_text;
 *    CAVS_PROD_Y_INNER; cavs_buf_desc.vertex and .inner; cavs_ctx.keep;
 *    cavs_desc.values.
 * 5: named, typed child slots (`children prev: fwd, w: chr`): each gather names the
 *    state buffer it reads, a type's own.
 * 6: CAVS_DIM_PRODUCT and cavs_dim_desc.a, .b; cavs_rowmv_*, cavs_rowmm_*.
 * 7: cavs_vertex_desc.homes, cavs_ctx.home_val and .home_grad (homes).
 * 8: cavs_vertex_desc.edge_buf and .edge_off (homes on a set's edges).
 * 9: up to CAVS_MAX_HOMES homes a row: cavs_vertex_desc.homes counts them, and
 *    cavs_ctx.home_val and .home_grad hold an array of each.
 * 10: cavs_desc.noptions and .options (`option NAME = P;`), cavs_ctx.opt: a dropout
 *    whose probability names an option reads c->opt[k].
 * 11: a mixture of experts: CAVS_INIT_XAVIER_ROWS, cavs_slots, cavs_topk_*, cavs_sbcast_*, cavs_emm_*, cavs_erow_*,
 *    cavs_scomb_*.
 * 12: cavs_vertex_desc.bwd_grads, cavs_desc.pull_grads and .push_grads: the parameter
 *    groups each backward stage adds to (a gradient is final after its last writer);
 *    cavs_emm_bwd's dx_set and cavs_scomb_bwd's dv_set (a slot gradient set whole).
 * 13: CAVS_PROD_Y_ADD; cavs_emm_fwd's add (a product added into the value it is summed
 *    with, in that value's place).
 * 14: cavs_desc.push_off and .push_width (the push block reading the state in place,
 *    push_buf == state_buf); the push block runs at the pushing types' rows alone, and
 *    its buffers and values say so (cavs_buf_desc.vertex and cavs_value_desc.vertex
 *    -2).
 * 15: cavs_desc.push_routes (cavs_model_set_targets_only narrows the push block's
 *    forward pass where it routes nothing).
 * 16: cavs_loop's last argument is flags (CAVS_LOOP_ALONE, as `alone` was, and
 *    CAVS_LOOP_ROWS: no cell written by two rows, so split by rows).
 * 17: cavs_pgroup_desc.experts (a mixture of experts' table, placed by expert
 *    parallelism as soon as the comm is set).
 * 18: cavs_desc.naliases and .aliases (a dropout read in place where it keeps every
 *    value); CAVS_INLINE.
 * 19: CAVS_PROD_DX_SET (a left operand's gradient set by its product, the first to
 *    write it, in a buffer the backward pass no longer clears).
 * 20: cavs_gemm_table takes every form but CAVS_PROD_Y_ADD, and its table is NULL where
 *    x's rows are not the table's (a dropout that drops): each distinct looked-up row
 *    may be multiplied once.
 * 21: cavs_emm_fwd's bias and cavs_emm_bwd's dbias (an expert's bias row, its erow,
 *    summed into its product where the product adds into it: one operation, not two).
 * 22: cavs_emm_fwd's act and cavs_emm_bwd's dx_act (CAVS_ACT_*: an activation applied
 *    by the product as it stores, its derivative by the next product's dx).
 * 23: cavs_vertex_desc.reads_pull (the pull block runs at the rows of the types that
 *    read it alone) and cavs_buf_desc.vertex -3 (the pull block's buffers).
 * 24: CAVS_PROD_Y_OPEN and CAVS_PROD_Y_CLOSE (a looked-up product's rows without a word
 *    left for the product that adds into it to set, not cleared and read back).
 * 25: cavs_noise_fwd and cavs_noise_bwd (noise(x): x times normal draws in training).
 * 26: cavs_gemm_kids (a product over gathered children, some of whose states are
 *    looked-up rows: each distinct one multiplied once); cavs_gemm_table takes
 *    CAVS_PROD_Y_ADD. */
#define CAVS_ABI_VERSION 26
enum { CAVS_MAX_DIMS = 16 };
/* the most homes a row has (cavs_vertex_desc.homes) */
enum { CAVS_MAX_HOMES = 2 };
/* the most options a model declares (cavs_desc.noptions) */
enum { CAVS_MAX_OPTIONS = 16 };

/* Elementwise functions of the fused loops, shared by the C and CUDA output. */
#ifdef __CUDACC__
#define CAVS_HD __host__ __device__
#else
#define CAVS_HD
#endif
/* Before a fused loop whose pointers cannot alias: vectorize without run-time checks
 * (GCC gives up on versioning past ten pointer pairs, and a Tree-LSTM cell has more). */
#if defined(__clang__)
#define CAVS_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define CAVS_IVDEP _Pragma("GCC ivdep")
#else
#define CAVS_IVDEP
#endif
/* A fused loop that keeps values for the backward pass is written once and inlined twice
 * with `keep` a constant (1 in training, 0 in inference): a store under a flag the
 * compiler cannot hoist becomes a masked store (vmaskmovps), far slower on AMD. */
#if defined(__GNUC__) || defined(__clang__)
#define CAVS_INLINE static inline __attribute__((always_inline))
#else
#define CAVS_INLINE static inline
#endif

/* exp in float without libm: 2^(x log2 e) split into an integer power n (built in the
 * exponent bits) and e^f, |f| <= ln2/2, by a degree-7 polynomial; f = x - n ln2 in two
 * steps (Cody and Waite), so the error stays within 1 ulp of expf over the whole range.
 * 2^n is applied as two factors 2^(n/2), so results below FLT_MIN come out subnormal as
 * libm's do, and above FLT_MAX as +Inf; -Inf gives 0, +Inf gives +Inf, NaN gives NaN.
 * Branch-free, so the compiler vectorizes the loops that call it (libm's expf and tanhf
 * are not): the clamp and the NaN test work on the bits with integer min and masks, as a
 * float `x < lo ? lo : x` lets GCC thread a path with a constant through the rest, and a
 * loop with control flow vectorizes only with AVX-512's masks. All arithmetic on the
 * bits is unsigned or in range: no overflow, whatever the input. Where the compiler
 * targets fused multiply-add (__FMA__: cavs build's -march=native on a CPU that has it)
 * the polynomial is seven of them, as nvcc makes it on CUDA: a third fewer instructions
 * in the loops that are mostly exponentials (the Tree-LSTM's fused loops 1.00 -> 0.90 s
 * an epoch on a Zen 3), still within 1 ulp (check_math, over every float); elsewhere
 * (libcavs itself, built for the baseline) a product and a sum each, as before. */
static inline CAVS_HD float cavs_exp_f(float x) {
  uint32_t keep = -(uint32_t)(x == x); /* all ones, or zero for a NaN */
  int32_t sx;
  uint32_t ux, bits;
  memcpy(&sx, &x, sizeof sx); /* memcpy, not a union: the vectorizer sees through it */
  memcpy(&ux, &x, sizeof ux);
  /* x = min(x, 100): as signed integers, positive floats order as their values, +Inf and
     a positive NaN above them, and every negative float below */
  sx = sx < 0x42c80000 ? sx : 0x42c80000;
  /* x = max(x, -104): as unsigned, negative floats order by magnitude above the positive */
  bits = (uint32_t)sx < 0xc2d00000u ? (uint32_t)sx : 0xc2d00000u;
  memcpy(&x, &bits, sizeof x); /* e^-104 rounds to 0 and e^100 to +Inf, as in expf */
  const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  float r = x * 1.44269504088896341f + magic;
  float fi = r - magic;
  float f = x - fi * 0.693359375f; /* ln 2 = 0.693359375 - 2.12194440e-4, the first exact */
  f = f + fi * 2.12194440e-4f;
  uint32_t ir, im, e1, e2;
  memcpy(&ir, &r, sizeof ir);
  memcpy(&im, &magic, sizeof im);
  uint32_t nb = ir - im + 256u; /* n + 256, in [106, 400] */
  uint32_t h = nb >> 1;         /* floor(n / 2) + 128 */
  e1 = (h - 1u) << 23;          /* 2^floor(n/2) */
  e2 = (nb - h - 1u) << 23;     /* 2^(n - floor(n/2)) */
  float s1, s2;
  memcpy(&s1, &e1, sizeof s1);
  memcpy(&s2, &e2, sizeof s2);
#if defined(__FMA__) && !defined(__CUDACC__)
  float p = __builtin_fmaf(f, 1.0f / 5040, 1.0f / 720);
  p = __builtin_fmaf(f, p, 1.0f / 120);
  p = __builtin_fmaf(f, p, 1.0f / 24);
  p = __builtin_fmaf(f, p, 1.0f / 6);
  p = __builtin_fmaf(f, p, 0.5f);
  p = __builtin_fmaf(f, p, 1.0f);
  p = __builtin_fmaf(f, p, 1.0f);
#else
  float p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 + f * (1.0f / 720 + f * (1.0f / 5040)))))));
#endif
  float y = p * s1 * s2;
  memcpy(&bits, &y, sizeof bits);
  bits = (bits & keep) | (ux & ~keep); /* a NaN comes back as it came */
  memcpy(&y, &bits, sizeof y);
  return y;
}
static inline CAVS_HD float cavs_sigmoid_f(float x) { return 1.0f / (1.0f + cavs_exp_f(-x)); }
/* Dropout's draws (splitmix64): a row's key from the seed, the step and the vertex's
 * index in the minibatch, and whether column j of node `salt` keeps its value with
 * probability 1 - p: the same on every backend, in every batching of one minibatch. */
static inline CAVS_HD uint64_t cavs_mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static inline CAVS_HD uint64_t cavs_drop_key(uint64_t seed, long step, long vertex) {
  return cavs_mix64(cavs_mix64(seed + cavs_mix64((uint64_t)step)) ^ (uint64_t)vertex);
}
static inline CAVS_HD int cavs_drop_keep(uint64_t key, unsigned salt, long j, double p) {
  uint64_t h = cavs_mix64(key ^ cavs_mix64(((uint64_t)salt << 32) ^ (uint64_t)j));
  return (double)(h >> 11) * (1.0 / 9007199254740992.0) >= p;
}
/* noise's draws: a standard normal value for column j of node `salt` at a row's key
 * (cavs_drop_key), by Box and Muller's transform of the two halves of one draw, in double
 * (u1 in (0, 1], so the logarithm is finite: |z| < 6.7): the same in every batching of
 * one minibatch, and on every backend up to the last bits of its log and cos. */
static inline CAVS_HD double cavs_noise_z(uint64_t key, unsigned salt, long j) {
  uint64_t h = cavs_mix64(key ^ cavs_mix64(((uint64_t)salt << 32) ^ (uint64_t)j));
  double u1 = ((double)(h >> 32) + 1.0) * (1.0 / 4294967296.0), u2 = (double)(h & 0xffffffffu) * (1.0 / 4294967296.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
static inline CAVS_HD float cavs_tanh_f(float x) { return 1.0f - 2.0f / (1.0f + cavs_exp_f(2.0f * x)); }
static inline CAVS_HD double cavs_sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

/* The cells of a CUDA target's fused kernel: one thread per row and column of the n
 * rows of a stage and the group's `width` columns, numbered row by row (consecutive
 * threads read consecutive columns, so a warp's loads coalesce), in blocks of
 * CAVS_CUDA_BLOCK threads on a one-dimensional grid. Plain C, so the CPU tests run the
 * arithmetic every kernel runs (tests/check_math.c). */
enum { CAVS_CUDA_BLOCK = 256 };
/* The blocks of a launch: 0 for no cells (a launch of none would fail: the stage skips
 * it). Past what a grid holds (2^31 - 1 blocks, some 5 * 10^11 cells, more values than a
 * GPU's memory) it gives UINT32_MAX, which the launch refuses and the check after it
 * reports, never a count that wrapped around. */
static inline CAVS_HD uint32_t cavs_cuda_blocks(long n, long width, uint32_t block) {
  if (n <= 0 || width <= 0 || block == 0) return 0;
  long max = 0x7fffffffL * (long)block; /* cells in the largest grid */
  if (width > max / n) return UINT32_MAX;
  long cells = n * width;
  return (uint32_t)((cells + block - 1) / block);
}
/* The cell of thread `thread` of block `block` (blocks of `block_dim` threads): its row
 * (0 to n-1, of the stage's rows) and column; 0 for a thread past the last cell. */
static inline CAVS_HD int cavs_cuda_cell(uint32_t block, uint32_t block_dim, uint32_t thread, long n, long width,
                                         long *row, long *col) {
  long k = (long)block * block_dim + thread;
  if (width <= 0 || k >= n * width) return 0;
  *row = k / width;
  *col = k - *row * width;
  return 1;
}

/* ---- the model descriptor, written by cavsc ---- */

/* A width or shape: k + sum_i c[i] * dims[i]. */
typedef struct cavs_lin {
  int k;
  int c[CAVS_MAX_DIMS];
} cavs_lin;

/* CAVS_DIM_PRODUCT: dims[a] * dims[b] (earlier dims, neither a vocab), bound by
 * cavs_dims_derive and by the model, never set: the width of a per-vertex matrix. */
enum cavs_dim_kind { CAVS_DIM_FIXED, CAVS_DIM_VOCAB, CAVS_DIM_FREE, CAVS_DIM_PRODUCT };
enum cavs_input_kind { CAVS_IN_INDEX, CAVS_IN_CLASS, CAVS_IN_REAL };
/* IDENTITY: a on the diagonal of a square matrix plus normal(0, b) noise; IDENTITY_ROWS
 * the same in every row read as a square matrix (cols = k * k) */
/* XAVIER_ROWS: xavier in each row read as a matrix [a, b] (cols a product dim a * b: a
 * mixture of experts' table of matrices), uniform in +-sqrt(6 / (a + b)) */
enum cavs_init { CAVS_INIT_ZEROS, CAVS_INIT_CONSTANT, CAVS_INIT_UNIFORM, CAVS_INIT_NORMAL, CAVS_INIT_XAVIER,
                 CAVS_INIT_IDENTITY, CAVS_INIT_IDENTITY_ROWS, CAVS_INIT_XAVIER_ROWS };
enum cavs_precision { CAVS_FLOAT, CAVS_DOUBLE };

typedef struct cavs_dim_desc {
  const char *name;
  int kind;
  long value; /* CAVS_DIM_FIXED: the default */
  int input;  /* CAVS_DIM_VOCAB: the index input it counts */
  int a, b;   /* CAVS_DIM_PRODUCT: the factors */
} cavs_dim_desc;

/* An option (`option NAME = P;` in the .vf): a value set at run time
 * (cavs_model_set_option, `cavs train --dropout`), not part of the model's identity;
 * `value` the default. CAVS_OPTION_DROPOUT: a dropout probability, in [0, 1).
 * CAVS_OPTION_CLIP (the option named `clip`): the model's default gradient-norm clip
 * for training (`cavs train` without --clip), in [0, CAVS_MAX_CLIP]; 0: none.
 * CAVS_OPTION_BALANCE (the option named `balance`): the weight of a mixture of experts'
 * load-balancing loss (top(g, K, balance)), in [0, CAVS_MAX_CLIP]. */
enum cavs_option_kind { CAVS_OPTION_DROPOUT, CAVS_OPTION_CLIP, CAVS_OPTION_BALANCE };
#define CAVS_MAX_CLIP 1e30
/* Whether `value` is one an option of this kind takes */
static inline int cavs_option_value_ok(int kind, double value) {
  return kind == CAVS_OPTION_CLIP || kind == CAVS_OPTION_BALANCE ? value >= 0 && value <= CAVS_MAX_CLIP
                                                                 : kind == CAVS_OPTION_DROPOUT && value >= 0 && value < 1;
}
/* The kind of the option named `name` */
static inline int cavs_option_kind_of(const char *name) {
  return strcmp(name, "clip") == 0 ? CAVS_OPTION_CLIP : strcmp(name, "balance") == 0 ? CAVS_OPTION_BALANCE : CAVS_OPTION_DROPOUT;
}
typedef struct cavs_option_desc {
  const char *name;
  int kind; /* enum cavs_option_kind */
  double value;
} cavs_option_desc;

typedef struct cavs_input_desc {
  const char *name;
  int kind;
  cavs_lin width; /* CAVS_IN_REAL: the row width; else the range of the values */
  int slot;       /* index among the integer inputs, or among the real inputs */
} cavs_input_desc;

typedef struct cavs_param_desc {
  const char *name;
  int rank;
  cavs_lin rows, cols;
  int group;       /* storage block */
  cavs_lin col_off;
  int init;
  double a, b;
} cavs_param_desc;

typedef struct cavs_pgroup_desc {
  cavs_lin rows, cols;
  int sparse_input; /* a lookup table read only through this integer input's slot: its
                       gradient and update touch only the rows a minibatch reads; -1 */
  int experts;      /* 1: a mixture of experts' table of matrices, one expert a row, read
                       only as an expert's product's matrix (emm) and the group's one
                       parameter: expert parallelism places it when the comm is set */
} cavs_pgroup_desc;

/* A per-row buffer's gradient: none; one the backward pass clears, then adds to; or one
 * it writes whole, each cell set before anything adds to it, which it does not clear. */
enum cavs_grad_kind { CAVS_GRAD_NONE, CAVS_GRAD, CAVS_GRAD_WHOLE };

typedef struct cavs_buf_desc {
  const char *name;
  cavs_lin width;
  int grad;   /* enum cavs_grad_kind */
  int vertex; /* the vertex type whose stages alone use it (only its rows hold values),
                 -2 (the push block's: values at the rows of the types that push alone),
                 -3 (the pull block's: values at the rows of the types that read it
                 alone, cavs_vertex_desc.reads_pull), or -1 (the state buffers) */
  int inner;  /* 1: nothing writes or reads it at a row without children */
  int edge;   /* 1: one row per edge (cavs_ctx.eoff), not per vertex */
} cavs_buf_desc;

/* A value the .vf names that is stored per row (cavs_model_vertex_value): block
 * `vertex`'s (-1: the pull block's; -2: the push block's, at the rows of the types that
 * push alone), columns [off, off + width)
 * of buffer `buf`; `kept`: a fused loop's member kept for its backward loop (not stored
 * in inference). */
typedef struct cavs_value_desc {
  const char *name;
  int vertex, buf;
  cavs_lin off, width;
  int kept;
} cavs_value_desc;

/* A dropout's output buffer `buf` that the stages read at its input, columns [off,
 * off + buf's width) of buffer `src`, whenever the dropout keeps every value: its
 * probability (option `opt`, or the literal `p` where opt is -1) is 0, or inference
 * (ctx.keep 0). Then nothing writes `buf` or its gradient: a named value there is read
 * at `src`, and its gradient is not cleared. */
typedef struct cavs_alias_desc {
  int buf, src;
  cavs_lin off;
  int opt;
  double p;
} cavs_alias_desc;

typedef struct cavs_ctx cavs_ctx;
/* Every stage runs over rows [r0, r0 + n) of the minibatch. */
typedef void (*cavs_stage)(cavs_ctx *c, int r0, int n);

/* A gather of a vertex type: child `slot`'s state row goes to buffer `buf` at column
 * `off`, rows with the buffer's width as their stride. `view`: 1 when nothing reads or
 * writes that buffer at a row without children (cavsc proves it), so the runtime may
 * point the buffer at the state buffer itself, with no copy, where the children's rows
 * lie in one block (cv_schedule); 0 where it must copy. */
typedef struct cavs_gather_desc {
  int slot, buf;
  cavs_lin off;
  int view;
  int src; /* the buffer it reads: the state of the child's type */
} cavs_gather_desc;

typedef struct cavs_vertex_desc {
  const char *name;
  int children;
  int pushes;
  cavs_stage fwd_eager, fwd_path, fwd_lazy;
  cavs_stage bwd_lazy, bwd_path, bwd_eager;
  /* 1 when bwd_eager adds to no parameter gradient that a backward path, lazy, pull or
     push stage of any type adds to: the runtime may then run it on a second stream,
     beside the path tasks still to come */
  int eager_apart;
  int ngathers;
  const cavs_gather_desc *gathers;
  /* the buffer its scatter writes (-1: it scatters nothing); and, where the blocks
     name their children's types (`children a: T`), each slot's name and the type of
     the child it holds (NULL otherwise: a child of any type) */
  int state;
  const char *const *slot_names;
  const int *slot_types;
  /* `children *` (or `children a: T, *: U`): any number of children past the named
     slots, each an edge; the type every such child must be (-1: any) and the state
     buffer the edges read */
  int edges, edge_type, edge_state;
  /* 0, or its fused loops write its whole state and store each row's at the row and
     at `homes` homes too (cavs_ctx.home_val[0 .. homes)), and its backward loops add the
     gradients at the homes (home_grad) to the state's: the runtime may then give a
     child a home in a parent's gathered row, whose gather copies nothing for it and
     adds nothing back. Two where two vertex types read the state (a tagger's chain
     step, read by the next step and by its word): a home for each. */
  int homes;
  /* `children *`: the buffer each edge's copy of its child's state goes to (echild; one
     row an edge) and at which column, so that a child may have its home there (-1:
     none) */
  int edge_buf;
  cavs_lin edge_off;
  /* per backward stage (bwd_lazy, bwd_path, bwd_eager), a flag a parameter group
     (cavs_desc.npgroups of them): 1 where the stage adds to the group's gradient */
  const unsigned char *bwd_grads[3];
  /* 1 when its stages read the pull block's values (pull()): the pull block runs, and
     its gradients are cleared, at the rows of such types alone (a tree's inner
     vertices that read no word looked up, and cleared the gradient of, a row of zeros
     each) */
  int reads_pull;
} cavs_vertex_desc;

enum cavs_loss_kind { CAVS_LOSS_SOFTMAX_XENT, CAVS_LOSS_MSE };

typedef struct cavs_loss_desc {
  int kind;  /* enum cavs_loss_kind */
  int input; /* target input */
} cavs_loss_desc;

/* What cavsc wrote the stages in: it decides the backends that can run them. */
enum cavs_target { CAVS_TARGET_C, CAVS_TARGET_CUDA };

typedef struct cavs_desc {
  int abi;
  int target; /* enum cavs_target */
  const char *name;
  const char *source;      /* the .vf file it was compiled from */
  const char *source_hash; /* FNV-1a of the source's tokens (not its comments or
                              layout), hex: the model's identity in a checkpoint */
  const char *source_text; /* the .vf text it was compiled from (NULL from IR) */
  int precision;
  int ndims;
  const cavs_dim_desc *dims;
  int noptions;
  const cavs_option_desc *options;
  int ninputs, nint, nreal;
  const cavs_input_desc *inputs;
  int nparams;
  const cavs_param_desc *params;
  int npgroups;
  const cavs_pgroup_desc *pgroups;
  int nbufs;
  const cavs_buf_desc *bufs;
  int state_buf, push_buf; /* state_buf: the state every type scatters, or -1 where
                              each has its own (cavs_vertex_desc.state) */
  /* the pushed rows: columns [push_off, push_off + push_width) of push_buf, which is
     state_buf itself where the push block reads the state in place (a Tree-LSTM's h in
     [c; h]); the push block runs at the rows of the types that push alone */
  cavs_lin push_off, push_width;
  /* 1: the push block routes a mixture of experts (whose balancing loss covers every row
     it routes, labeled or not) */
  int push_routes;
  int nvertex;
  const cavs_vertex_desc *vertex;
  int nlosses;
  const cavs_loss_desc *losses;
  cavs_stage pull_fwd, pull_bwd, push_fwd, push_bwd;
  int nvalues;
  const cavs_value_desc *values;
  /* the same flags for the pull and push blocks' backward stages */
  const unsigned char *pull_grads, *push_grads;
  int naliases;
  const cavs_alias_desc *aliases;
} cavs_desc;

/* ---- what a stage sees ---- */

typedef struct cavs_loss_acc {
  double sum;    /* loss summed over counted rows */
  long count;    /* rows counted (labeled) */
  long correct;  /* argmax == label (softmax_xent) */
  long root_count, root_correct;
} cavs_loss_acc;

struct cavs_ctx {
  const cavs_desc *desc;
  long dims[CAVS_MAX_DIMS];
  int rows;        /* rows in this minibatch */
  void **val;      /* per-row buffers, [rows, width] each */
  void **grad;     /* their gradients (NULL where none) */
  void **param;    /* parameter blocks */
  void **pgrad;    /* their gradients */
  const int *child; /* [rows * maxc]: the row of child k of row r, or -1 */
  int maxc;
  const int **iin;  /* integer inputs, [rows] each */
  const void **rin; /* real inputs, [rows, width] each */
  const unsigned char *root;   /* [rows]: 1 for a vertex without parents */
  const unsigned char *pushed; /* [rows]: 1 where the vertex's type calls push() */
  cavs_loss_acc *loss;       /* [nlosses] */
  int *pred;                 /* [rows]: argmax of the first softmax_xent, or -1 */
  double loss_scale;         /* multiplies every loss gradient (1: losses are means) */
  int leaf_rows;             /* the first leaf_rows rows of the current stage's range have
                                no children (level 0): values made only of gathered rows
                                are zero there */
  /* the edges (children of `children *` vertices), numbered row by row: row r's are
     [eoff[r], eoff[r + 1]), each with its parent's row and its child's (host memory;
     NULL in a model without such vertices) */
  const int *eoff, *eparent, *echild;
  /* [rows]: each row's dropout key, from the model's seed (cavs_model_init's, or a
     checkpoint's), the optimizer's step count and its vertex's place in the minibatch
     (cavs_drop_key), host memory */
  const uint64_t *rkey;
  int keep;                  /* 1: a forward pass stores the values its backward pass reads
                                rather than computes again (the C target's kept values);
                                0 in inference (cavs_model_set_inference) */
  /* [CAVS_MAX_HOMES][rows]: row r's k-th home, for a type with cavs_vertex_desc.homes
     > k: where its fused loops store its state as well as at the row (the columns of
     a parent's gathered row that its gather would fill, or a scratch row of its own
     that nothing reads), and where they read the gradient that parent added there
     (the same columns of the gathered buffer's gradient, or a row of zeros). In the
     backend's memory: a CUDA target's kernels are handed home_val[k] + r0. */
  void **home_val[CAVS_MAX_HOMES], **home_grad[CAVS_MAX_HOMES];
  /* [CAVS_MAX_OPTIONS]: the options' values (cavs_desc.options; their defaults until
     cavs_model_set_option sets one) */
  double opt[CAVS_MAX_OPTIONS];
  struct cavs_model *model;
  void *stream;              /* the backend's queue for what a stage launches (a CUDA
                                target's kernels: its cudaStream_t); NULL on the CPU */
};

/* ---- entry points for generated code ---- */

/* Each hands the work to the model's backend (the CPU's: OpenBLAS and row kernels). */

enum cavs_trans { CAVS_NO_TRANS, CAVS_TRANS };
/* The three products of a matrix multiply y = x w, over the rows of a stage. */
enum cavs_prod_form {
  CAVS_PROD_Y,  /* y = x w */
  CAVS_PROD_DX, /* dx += dy w^T */
  CAVS_PROD_DW, /* dw += x^T dy */
  CAVS_PROD_Y_INNER, /* y = x w at the rows past `skip` (cavs_gemm_skip, cavs_gemm_rows);
                        the first `skip` are left as they are: nothing reads them */
  CAVS_PROD_Y_ADD,   /* y += x w at the rows past `skip` and, in cavs_gemm_rows, with an
                        index; the others are left as they are (x is zero there) */
  CAVS_PROD_DX_SET,  /* dx = dy w^T: CAVS_PROD_DX where it is the first to write dx (its
                        buffer not cleared), at the same rows (the others, as there, are
                        left as they are: nothing reads them) */
  CAVS_PROD_Y_OPEN,  /* y = x w at the rows with an index (cavs_gemm_table, cavs_gemm_rows,
                        `skip` 0); the rows without one may be left as they are: a
                        CAVS_PROD_Y_CLOSE product over the same rows with the same index
                        writes them before anything reads y (or a backend zeroes them
                        here, as CAVS_PROD_Y does, and adds there) */
  CAVS_PROD_Y_CLOSE, /* that product, through cavs_gemm_rows with the open product's index:
                        at the rows past `skip`, y = x w where the index is < 0 and y += x
                        w where it is not; at the first `skip` (where x is zero), y = 0
                        where the index is < 0, the others left as they are */
};

/* C = alpha op(A) op(B) + beta C, row-major, in the descriptor's precision; ta and tb
 * are enum cavs_trans. */
void cavs_gemm(cavs_ctx *c, int ta, int tb, int m, int n, int k, double alpha, const void *a,
               long lda, const void *b, long ldb, double beta, void *cm, long ldc);
/* A product whose left operand is a looked-up row that is zero where idx[r] < 0 (a
 * vertex without a word): only the runs of rows with a word are multiplied. The first
 * `skip` rows count as rows without one (the product is dead at the vertices without
 * children, which come first: it matters only at rows with a word and children).
 *   CAVS_PROD_Y:  y = x w        (y zeroed on the other rows)
 *   CAVS_PROD_DX: y += x w^T     (x is dY, y is dX: the other rows' dX is never read)
 *   CAVS_PROD_DW: w += x^T y     (the parameter gradient; zero rows add nothing)
 * Pointers are to row 0; rows [r0, r0+n). */
void cavs_gemm_rows(cavs_ctx *c, const int *idx, int skip, int r0, int n, int form, int cols, int k, const void *x,
                    long ldx, const void *w, long ldw, void *y, long ldy);
/* cavs_gemm_rows's product (any form but CAVS_PROD_Y_CLOSE) where x is rows of a
 * parameter table looked up by idx (x = table[idx[r]], pulled as it is or through a
 * dropout that keeps every value: `trows` rows of k, ldt scalars apart; NULL where x's
 * rows are not the table's, and then it is cavs_gemm_rows). Rows with one index being
 * one row, the runtime may multiply each distinct index's row once: y = x w copied to
 * the index's rows; w += x^T y and dx += dy w^T over the sums of dy by index, dx's
 * added at the index's first row alone (the lookup's backward adds an index's rows up).
 * And for y = x w in inference (ctx.keep == 0) it may
 * look up rows of the product table w instead, made once the lookups since inference
 * began reach the table's size (the same numbers: each row is the same sum). */
void cavs_gemm_table(cavs_ctx *c, const int *idx, int skip, int r0, int n, int form, int cols, int k,
                     const void *table, long ldt, long trows, const void *x, long ldx, const void *w, long ldw,
                     void *y, long ldy);
/* cavs_gemm_skip's product (CAVS_PROD_Y, _Y_INNER, _Y_ADD, _DX or _DW) where x is the
 * gathered rows of child slots 0 .. kids-1 side by side, k columns each (w's rows
 * [s k, (s + 1) k) multiply slot s's columns; in CAVS_PROD_DX, y is dx, side by side
 * as x), and where a child of vertex type `type` has for its state the row of the
 * parameter table (`trows` rows of k, ldt scalars apart) at its integer input `input`,
 * as it is (zero where that is -1): the runtime may multiply each distinct such row once
 * (cavs_gemm_table's, a slot at a time), the products over the other children's rows
 * apart. The same numbers but for the order of the sums (the slots' products added one
 * to the other; an index's rows' dy summed first). Tree-FC's inner vertices whose
 * children are leaves holding their word's embedding: half the vertices of a complete
 * tree, and a minibatch's words repeat. */
void cavs_gemm_kids(cavs_ctx *c, int kids, int type, int input, int skip, int r0, int n, int form, int cols, int k,
                    const void *table, long ldt, long trows, const void *x, long ldx, const void *w, long ldw,
                    void *y, long ldy);
/* The same for a left operand built only from gathered rows (zero at a vertex without
 * children): its first `skip` rows are zero. */
void cavs_gemm_skip(cavs_ctx *c, int skip, int r0, int n, int form, int cols, int k, const void *x, long ldx,
                    const void *w, long ldw, void *y, long ldy);
/* A fused loop of the C target over rows [r0, r0+n) and columns [j0, j1). */
typedef void (*cavs_cols)(cavs_ctx *c, int r0, int n, long j0, long j1);
/* Runs f over rows [r0, r0+n) and columns [0, width): in column blocks on the backend's
 * threads where it has several (each column's cells, a vector parameter's gradient
 * included, are one thread's); in blocks of rows where `flags` has CAVS_LOOP_ROWS (no
 * cell the loop writes is written by another row: it adds to no vector parameter's
 * gradient, and a row's stores are its own rows' and its homes'), so that each thread
 * streams its own rows whole; or in one call where CAVS_LOOP_ALONE (the loop adds to
 * two gradients that may overlap). */
enum { CAVS_LOOP_ALONE = 1, CAVS_LOOP_ROWS = 2 };
void cavs_loop(cavs_ctx *c, cavs_cols f, int r0, int n, long width, int flags);
/* dst rows [r0, r0+n) = state rows of child k (zero where absent). */
/* The edges of rows [r0, r0+n) (`children *`): the child's state row to each edge of
 * the buffer at dst (echild); a row of src to each of its edges (ebcast); each row's
 * edges summed (esum, zero where it has none); backward, the gradients the other way,
 * added. Buffers are passed at their row 0, edge buffers at their edge 0. */
/* dropout(x, p) over rows [r0, r0+n): y = x * mask / (1 - p) with a mask drawn per row
 * (cavs_ctx.rkey), `salt` (the node) and column (cavs_drop_keep), y = x in inference;
 * backward dx += dy * mask / (1 - p). */
void cavs_dropout_fwd(cavs_ctx *c, unsigned salt, double p, const void *x, long ldx, void *y, long ldy, long w, int r0,
                      int n);
void cavs_dropout_bwd(cavs_ctx *c, unsigned salt, double p, const void *dy, long ldy, void *dx, long ldx, long w, int r0,
                      int n);
/* noise(x) over rows [r0, r0+n): y = x * z in training, z standard normal draws per row
 * (cavs_ctx.rkey), `salt` (the node) and column (cavs_noise_z); y = 0 in inference;
 * backward dx += dy * z. */
void cavs_noise_fwd(cavs_ctx *c, unsigned salt, const void *x, long ldx, void *y, long ldy, long w, int r0, int n);
void cavs_noise_bwd(cavs_ctx *c, unsigned salt, const void *dy, long ldy, void *dx, long ldx, long w, int r0, int n);
/* mv(x, M) over rows [r0, r0+n): y = x M, x [a], M an [a, b] matrix per row (row-major
 * in a row of width a*b, rows ldm apart); backward dx += dy M^T and dM += x^T dy (an
 * outer product), each skipped where its pointer is NULL. */
void cavs_rowmv_fwd(cavs_ctx *c, long a, long b, const void *x, long ldx, const void *m, long ldm, void *y, long ldy,
                    int r0, int n);
void cavs_rowmv_bwd(cavs_ctx *c, long a, long b, const void *x, long ldx, const void *m, long ldm, const void *dy,
                    long lddy, void *dx, long lddx, void *dm, long lddm, int r0, int n);
/* mm(M, W): y = M W per row, M [a, b], the parameter W [b, cc] (ldw), y [a, cc];
 * backward dM += dy W^T per row and dW += M^T dy summed over the rows. */
void cavs_rowmm_fwd(cavs_ctx *c, long a, long b, long cc, const void *m, long ldm, const void *w, long ldw, void *y,
                    long ldy, int r0, int n);
void cavs_rowmm_bwd(cavs_ctx *c, long a, long b, long cc, const void *m, long ldm, const void *w, long ldw,
                    const void *dy, long lddy, void *dm, long lddm, void *dw, long lddw, int r0, int n);
void cavs_echild_fwd(cavs_ctx *c, int state, void *dst, long ld, int r0, int n);
void cavs_echild_bwd(cavs_ctx *c, int state, const void *src, long ld, int r0, int n);
void cavs_ebcast_fwd(cavs_ctx *c, const void *src, long lds, void *dst, long ldd, long w, int r0, int n);
void cavs_ebcast_bwd(cavs_ctx *c, void *dsrc, long lds, const void *ddst, long ldd, long w, int r0, int n);
void cavs_esum_fwd(cavs_ctx *c, const void *src, long lds, void *dst, long ldd, long w, int r0, int n);
void cavs_esum_bwd(cavs_ctx *c, void *dsrc, long lds, const void *ddst, long ldd, long w, int r0, int n);
/* A mixture of experts (moe(e in top(g, K): body)), over the rows [r0, r0+n) and their K
 * slots each, K r0 .. K (r0 + n) - 1, which a slot value (a row of slot width per slot:
 * slot s at v + s * ld) holds. `route` names the routing (one per function that has a
 * moe, numbered in the model's order); X is the experts' count, the gate's width.
 * topk: w[r] = the softmax of g[r]'s K largest values (the lower index first among
 *   equals) at their columns, 0 elsewhere; and the rows' slots, grouped by expert
 *   (backward: dg += the softmax's gradient at the kept columns). With balance > 0, a
 *   load-balancing loss too (Switch Transformer's, over each stage's rows: balance X
 *   sum_e f_e P_e, f_e the share of the stage's slots expert e received and P_e the mean
 *   of softmax(g)_e over its rows, weighted by the stage's share of the pass's rows):
 *   its value in cavs_stats.aux_loss, its gradient added to dg;
 * sbcast: x[r] to each of r's slots (backward: the slots' gradients added to dx[r]);
 * emm: y[s] = x[s] times slot s's expert's matrix [a, b], row e of the table t (one
 *   product per expert over its slots; with add, y[s] += that; backward dx and dt, NULL
 *   where none; dx_set:
 *   dx is set, not added to, at every slot of the routings the rows were in);
 * erow: y[s] = row e of table t (backward: added to dt's row e);
 * scomb: y[r] = the sum over r's slots s of w[r, expert of s] v[s] (backward dv, dw;
 *   dv_set: dv set, not added to, at every slot of the routings the rows were in, zero
 *   at the slots of their rows outside r0 .. r0 + n - 1). */
/* The slots of rows [r0, r0 + n), [*s0, *s0 + *sn): K r0 .. K (r0 + n) - 1, or in a
 * backward pass over part of the rows a routing grouped, all of that routing's. */
void cavs_slots(cavs_ctx *c, int route, int K, int r0, int n, int *s0, int *sn);
void cavs_topk_fwd(cavs_ctx *c, int route, int K, long X, double balance, const void *g, long ldg, void *w, long ldw,
                   int r0, int n);
void cavs_topk_bwd(cavs_ctx *c, int route, int K, long X, double balance, const void *g, long ldg, const void *w,
                   long ldw, const void *dw, long lddw, void *dg, long lddg, int r0, int n);
void cavs_sbcast_fwd(cavs_ctx *c, int route, int K, const void *x, long ldx, void *s, long lds, long w, int r0, int n);
void cavs_sbcast_bwd(cavs_ctx *c, int route, int K, void *dx, long lddx, const void *ds, long ldds, long w, int r0,
                     int n);
/* An activation an expert's product applies as it stores (cavs_emm_fwd's act) and the
 * product reading its output applies the derivative of, written in that output, to the
 * gradient it computes (cavs_emm_bwd's dx_act): a fused group of the activation alone,
 * folded into the products (the generated loop's operations, in its order) */
enum { CAVS_ACT_NONE, CAVS_ACT_RELU, CAVS_ACT_TANH, CAVS_ACT_SIGMOID };
/* y = x W_e at each slot, or with add y += x W_e, or with a bias table (NULL: none) y =
 * bias_e + x W_e, bias_e its expert's row of the table [X, b] (as cavs_erow_fwd writes it
 * before a product that adds); then, with act, y = act(y). Backward dx (= with dx_set,
 * else +=) dy W_e^T, dW_e += x^T dy and dbias_e += dy, each where not NULL, the sums over
 * an expert's slots in slot order; with dx_act, x is that activation's output and dx
 * then its input's gradient: dx's slots are multiplied by its derivative at x (their
 * own, where not dx_set, must be zero: the activation's one reader is this product). */
void cavs_emm_fwd(cavs_ctx *c, int route, int K, long a, long b, const void *x, long ldx, const void *t, long ldt,
                  const void *bias, long ldb, void *y, long ldy, int add, int act, int r0, int n);
void cavs_emm_bwd(cavs_ctx *c, int route, int K, long a, long b, const void *x, long ldx, const void *t, long ldt,
                  const void *dy, long lddy, void *dx, long lddx, int dx_set, int dx_act, void *dt, long lddt,
                  void *dbias, long lddb, int r0, int n);
void cavs_erow_fwd(cavs_ctx *c, int route, int K, const void *t, long ldt, void *y, long ldy, long w, int r0, int n);
void cavs_erow_bwd(cavs_ctx *c, int route, int K, void *dt, long lddt, const void *dy, long lddy, long w, int r0,
                   int n);
void cavs_scomb_fwd(cavs_ctx *c, int route, int K, long X, const void *v, long ldv, const void *w, long ldw, void *y,
                    long ldy, long width, int r0, int n);
void cavs_scomb_bwd(cavs_ctx *c, int route, int K, long X, const void *v, long ldv, const void *w, long ldw,
                    const void *dy, long lddy, void *dv, long lddv, int dv_set, void *dw, long lddw, long width, int r0,
                    int n);
void cavs_gather_fwd(cavs_ctx *c, int k, int state, void *dst, long ld, int r0, int n);
/* dstate[child k of row r] += src[r] for r in [r0, r0+n). */
void cavs_gather_bwd(cavs_ctx *c, int k, int state, const void *src, long ld, int r0, int n);
/* dst[r] = table[idx[r]] (zero row for -1); the backward adds into the table's gradient. */
void cavs_lookup_fwd(cavs_ctx *c, const void *table, long ldt, const int *idx, void *dst, long ld,
                     int r0, int n, long width);
void cavs_lookup_bwd(cavs_ctx *c, void *dtable, long ldt, const int *idx, const void *src, long ld,
                     int r0, int n, long width);
/* dst[r, 0:w] (+)= src[r, 0:w]. */
void cavs_copy_rows(cavs_ctx *c, void *dst, long ldd, const void *src, long lds, int n, long w, int add);
void cavs_xent_fwd(cavs_ctx *c, int loss, const void *z, long ld, const int *label, int r0, int n, long w);
void cavs_xent_bwd(cavs_ctx *c, int loss, const void *z, long ld, const int *label, void *dz, long ldd,
                   int r0, int n, long w);
void cavs_mse_fwd(cavs_ctx *c, int loss, const void *p, long ld, const void *t, long ldt, int r0, int n, long w);
void cavs_mse_bwd(cavs_ctx *c, int loss, const void *p, long ld, const void *t, long ldt, void *dp,
                  long ldd, int r0, int n, long w);

/* A kernel launch of a CUDA target's stage failed (`code`, a cudaError_t, at `file`:`line`
 * of the generated MODEL.cu). A stage returns nothing, so it records the error, and
 * the forward pass or the step after the backward pass that ran it reports it. Implemented in libcavs (backend.c);
 * generated code calls it through CAVS_CUDA_CHECK_LAUNCH. */
void cavs_cuda_launch_failed(cavs_ctx *c, const char *file, int line, int code);
/* A kernel of a CUDA target's stage was launched, with status `code` (0: it launched):
 * counted in the backend's statistics (cavs_model_backend_stats), and a failure
 * recorded as cavs_cuda_launch_failed records it. CAVS_CUDA_CHECK_LAUNCH calls it. */
void cavs_cuda_launched(cavs_ctx *c, const char *file, int line, int code);


#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
/* The launch of a CUDA target's fused kernel on the stage's stream, written
 * `CAVS_CUDA_LAUNCH(kernel, blocks, stream)(args...)`: the one construct of MODEL.cu
 * that is not C++, kept in a macro so that a host C++ compiler can read the file too
 * (with a launch of its own that runs every thread of the grid on the CPU). */
#define CAVS_CUDA_LAUNCH(kernel, blocks, stream) kernel<<<(blocks), CAVS_CUDA_BLOCK, 0, (stream)>>>

/* After every kernel launch of a CUDA target's stage: counted, and a failure recorded. */
#define CAVS_CUDA_CHECK_LAUNCH(c) cavs_cuda_launched((c), __FILE__, __LINE__, (int)cudaGetLastError())

/* A gradient that several threads of one fused kernel add to: a vector parameter's
 * (summed over the rows) or one of two slices of a buffer that may overlap. `d[j] += x`
 * is an atomicAdd, so the kernel's statements are the C loop's, word for word. */
template <typename T> struct cavs_cuda_sum {
  T *p;
  struct cell {
    T *q;
    __device__ void operator+=(T x) const { atomicAdd(q, x); }
    /* a gradient only this thread writes (the first statement that writes it) */
    __device__ void operator=(T x) const { *q = x; }
  };
  __host__ __device__ cavs_cuda_sum(T *p) : p(p) {}
  __device__ cell operator[](long j) const { return cell{p + j}; }
};
#endif
#endif

/* cavs.h: the one installed header of libcavs, and the ABI that cavsc's generated code
 * is written against.
 *
 * A short tutorial. cavsc turns a model (man 5 vf) into C:
 *
 *     cavsc -o build dsl-examples/treelstm.vf     # build/treelstm.h, build/treelstm.c
 *
 * and an application trains it with libcavs:
 *
 *     #include "treelstm.h"
 *     long dims[CAVS_MAX_DIMS];
 *     cavs_dims_default(&treelstm_desc, dims);
 *     dims[treelstm_dim_V] = vocab_size;             // dims bound from the data
 *     char err[256];
 *     cavs_model *m = cavs_model_new(&treelstm_desc, dims, err, sizeof err);
 *     cavs_model_init(m, 42);                        // parameters from a seed
 *     cavs_optim opt = {.kind = CAVS_ADAM, .lr = 1e-3};
 *     for (each minibatch of graphs g[0..k-1]) {
 *       cavs_stats st;
 *       cavs_model_forward(m, g, k, &st);            // loss and accuracy in st
 *       cavs_model_backward(m);                      // gradients of every parameter
 *       cavs_model_step(m, &opt);                    // one optimizer update
 *     }
 *     cavs_model_free(m);
 *
 * A graph (cavs_graph) is a set of vertices, each with a type (the vertex block that
 * computes it), up to `children` ordered children (-1: absent, which gathers zeros),
 * integer features (index and class inputs, -1: none) and real features. Children are
 * vertex numbers within the same graph; any acyclic graph works, including DAGs where a
 * vertex has several parents.
 *
 * Ownership: the caller owns every cavs_graph and the arrays it points to; libcavs only
 * reads them during the call that receives them. A cavs_model owns its parameters,
 * gradients, optimizer state and minibatch buffers; cavs_model_free releases all of it.
 * Pointers returned by cavs_model_param() and cavs_model_grad() point into the model and
 * are valid until cavs_model_free(). Nothing is allocated per task; per minibatch, buffers
 * only grow (never shrink) to the largest minibatch seen.
 *
 * Threads: a model is used by one thread at a time; BLAS may use several
 * (cavs_set_threads).
 */
#ifndef CAVS_H
#define CAVS_H

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CAVS_ABI_VERSION 1
enum { CAVS_MAX_DIMS = 16 };

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

/* exp in float without libm: 2^(x log2 e) split into an integer power n (built in the
 * exponent bits) and e^f, |f| <= ln2/2, by a degree-7 polynomial; f = x - n ln2 in two
 * steps (Cody and Waite), so the error stays within 1 ulp of expf over the whole range.
 * 2^n is applied as two factors 2^(n/2), so results below FLT_MIN come out subnormal as
 * libm's do, and above FLT_MAX as +Inf; -Inf gives 0, +Inf gives +Inf, NaN gives NaN.
 * Branch-free, so the compiler vectorizes the loops that call it (libm's expf and tanhf
 * are not): the clamp and the NaN test work on the bits with integer min and masks, as a
 * float `x < lo ? lo : x` lets GCC thread a path with a constant through the rest, and a
 * loop with control flow vectorizes only with AVX-512's masks. All arithmetic on the
 * bits is unsigned or in range: no overflow, whatever the input. */
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
  float p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 + f * (1.0f / 720 + f * (1.0f / 5040)))))));
  float y = p * s1 * s2;
  memcpy(&bits, &y, sizeof bits);
  bits = (bits & keep) | (ux & ~keep); /* a NaN comes back as it came */
  memcpy(&y, &bits, sizeof y);
  return y;
}
static inline CAVS_HD float cavs_sigmoid_f(float x) { return 1.0f / (1.0f + cavs_exp_f(-x)); }
static inline CAVS_HD float cavs_tanh_f(float x) { return 1.0f - 2.0f / (1.0f + cavs_exp_f(2.0f * x)); }
static inline CAVS_HD double cavs_sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

/* ---- the model descriptor, written by cavsc ---- */

/* A width or shape: k + sum_i c[i] * dims[i]. */
typedef struct cavs_lin {
  int k;
  int c[CAVS_MAX_DIMS];
} cavs_lin;

enum cavs_dim_kind { CAVS_DIM_FIXED, CAVS_DIM_VOCAB, CAVS_DIM_FREE };
enum cavs_input_kind { CAVS_IN_INDEX, CAVS_IN_CLASS, CAVS_IN_REAL };
enum cavs_init { CAVS_INIT_ZEROS, CAVS_INIT_CONSTANT, CAVS_INIT_UNIFORM, CAVS_INIT_NORMAL, CAVS_INIT_XAVIER };
enum cavs_precision { CAVS_FLOAT, CAVS_DOUBLE };

typedef struct cavs_dim_desc {
  const char *name;
  int kind;
  long value; /* CAVS_DIM_FIXED: the default */
  int input;  /* CAVS_DIM_VOCAB: the index input it counts */
} cavs_dim_desc;

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
} cavs_pgroup_desc;

typedef struct cavs_buf_desc {
  const char *name;
  cavs_lin width;
  int grad; /* has a gradient buffer */
} cavs_buf_desc;

typedef struct cavs_ctx cavs_ctx;
/* Every stage runs over rows [r0, r0 + n) of the minibatch. */
typedef void (*cavs_stage)(cavs_ctx *c, int r0, int n);

typedef struct cavs_vertex_desc {
  const char *name;
  int children;
  int pushes;
  cavs_stage fwd_eager, fwd_path, fwd_lazy;
  cavs_stage bwd_lazy, bwd_path, bwd_eager;
} cavs_vertex_desc;

typedef struct cavs_loss_desc {
  int kind;  /* 0 softmax_xent, 1 mse */
  int input; /* target input */
} cavs_loss_desc;

typedef struct cavs_desc {
  int abi;
  const char *name;
  const char *source;      /* the .vf file it was compiled from */
  const char *source_hash; /* FNV-1a of the source text, hex */
  int precision;
  int ndims;
  const cavs_dim_desc *dims;
  int ninputs, nint, nreal;
  const cavs_input_desc *inputs;
  int nparams;
  const cavs_param_desc *params;
  int npgroups;
  const cavs_pgroup_desc *pgroups;
  int nbufs;
  const cavs_buf_desc *bufs;
  int state_buf, push_buf;
  int nvertex;
  const cavs_vertex_desc *vertex;
  int nlosses;
  const cavs_loss_desc *losses;
  cavs_stage pull_fwd, pull_bwd, push_fwd, push_bwd;
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
  struct cavs_model *model;
};

/* ---- entry points for generated code ---- */

/* C = alpha op(A) op(B) + beta C, row-major, in the descriptor's precision. */
void cavs_gemm(cavs_ctx *c, int ta, int tb, int m, int n, int k, double alpha, const void *a,
               long lda, const void *b, long ldb, double beta, void *cm, long ldc);
/* A product whose left operand is a looked-up row that is zero where idx[r] < 0 (a
 * vertex without a word): only the runs of rows with a word are multiplied.
 *   form 0: y = x w        (y zeroed on the other rows)
 *   form 1: y += x w^T     (x is dY, y is dX: the other rows' dX is never read)
 *   form 2: w += x^T y     (the parameter gradient; zero rows add nothing)
 * Pointers are to row 0; rows [r0, r0+n). */
void cavs_gemm_rows(cavs_ctx *c, const int *idx, int r0, int n, int form, int cols, int k, const void *x, long ldx,
                    const void *w, long ldw, void *y, long ldy);
/* The same for a left operand built only from gathered rows (zero at a vertex without
 * children): its first `skip` rows are zero. */
void cavs_gemm_skip(cavs_ctx *c, int skip, int r0, int n, int form, int cols, int k, const void *x, long ldx,
                    const void *w, long ldw, void *y, long ldy);
/* dst rows [r0, r0+n) = state rows of child k (zero where absent). */
void cavs_gather_fwd(cavs_ctx *c, int k, void *dst, long ld, int r0, int n);
/* dstate[child k of row r] += src[r] for r in [r0, r0+n). */
void cavs_gather_bwd(cavs_ctx *c, int k, const void *src, long ld, int r0, int n);
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

/* ---- the application's API ---- */

typedef struct cavs_model cavs_model;

typedef struct cavs_graph {
  int n;               /* vertices */
  int maxc;            /* slots per vertex in `child` */
  const int *child;    /* [n * maxc], vertex numbers in this graph, -1 = absent */
  const int *type;     /* [n], vertex block index; NULL: all 0 */
  const int *feat;     /* [n * nint]: integer inputs, in descriptor slot order */
  const float *real;   /* [n * total real width], in slot order; NULL if none */
} cavs_graph;

typedef struct cavs_stats {
  double loss;          /* mean over counted rows, summed over the model's losses */
  long count, correct;  /* all labeled vertices, of the softmax_xent losses (a
                           regression loss has no accuracy: cavs_model_losses) */
  long root_count, root_correct;
  int tasks;            /* path-phase tasks run */
} cavs_stats;

enum cavs_policy { CAVS_BFS = 0, CAVS_SERIAL = 1 };

void cavs_dims_default(const cavs_desc *d, long *dims);
cavs_model *cavs_model_new(const cavs_desc *d, const long *dims, char *err, size_t errlen);
void cavs_model_free(cavs_model *m);
void cavs_model_init(cavs_model *m, uint64_t seed);
/* The scheduling policy: BFS batching (default), or one vertex per task. */
void cavs_model_set_policy(cavs_model *m, int policy);
/* Forward pass over k graphs; returns 0, or -1 with a message in cavs_model_error(). */
int cavs_model_forward(cavs_model *m, const cavs_graph *const *graphs, int k, cavs_stats *st);
/* Backward pass of the last forward: fills every parameter gradient. */
void cavs_model_backward(cavs_model *m);
/* After a forward pass: 0 if every parameter and every value of the minibatch is finite;
 * else -1 with the first NaN or infinity named in msg (a parameter, or a value: buffers
 * are named after the .vf block and the name that computes them) and, for a value, the
 * graph (its index in the minibatch) and vertex in *graph and *vertex (else -1). */
int cavs_model_check_finite(cavs_model *m, int *graph, int *vertex, char *msg, size_t len);
const cavs_desc *cavs_model_desc(const cavs_model *m);
/* After a forward pass: the class predicted (argmax of the first softmax_xent) at the
 * root of graph g of the minibatch (its last vertex without a parent), or -1. */
int cavs_model_root_class(const cavs_model *m, int g);
/* After a forward pass: each loss of the model (in the order of desc->losses) summed
 * over the minibatch, *n of them; correct counts stay 0 for a regression loss. */
const cavs_loss_acc *cavs_model_losses(const cavs_model *m, int *n);
const char *cavs_model_error(const cavs_model *m);
long cavs_model_dim(const cavs_model *m, int dim);
/* Parameter i: its storage and gradient (row stride in *ld), in the model's precision. */
void *cavs_model_param(cavs_model *m, int i, long *rows, long *cols, long *ld);
void *cavs_model_grad(cavs_model *m, int i, long *rows, long *cols, long *ld);
/* All parameters as one block of `count` scalars (for checkpoints and optimizers). */
void *cavs_model_params_flat(cavs_model *m, size_t *count);
void *cavs_model_grads_flat(cavs_model *m, size_t *count);

/* Lookup tables (cavs_pgroup_desc.sparse_input) are updated lazily: only the rows the
 * minibatch read, with Adam's moments of the other rows left as they are (as sparse Adam
 * does elsewhere); weight decay applies to those rows too. */
enum cavs_optim_kind { CAVS_SGD, CAVS_ADAGRAD, CAVS_ADAM, CAVS_OPTIM_COUNT };
/* The optimizers by name ("sgd", "adagrad", "adam"), from one table in optim.c: a kind's
 * name (NULL for none), the kind of a name (-1 for none), a kind's default learning rate. */
const char *cavs_optim_name(int kind);
int cavs_optim_kind(const char *name);
double cavs_optim_default_lr(int kind);
typedef struct cavs_optim {
  int kind;
  double lr;
  double clip;         /* global gradient-norm clip; 0: none */
  double weight_decay; /* L2, added to the gradient */
  double beta1, beta2, eps; /* Adam (defaults 0.9, 0.999, 1e-8); Adagrad uses eps */
} cavs_optim;
/* -1 (message in cavs_model_error) only when the optimizer's state cannot be allocated. */
int cavs_model_step(cavs_model *m, const cavs_optim *o);

void cavs_set_threads(int n);
/* Memory: a model refuses to be made, and a minibatch to be run, when what it needs
 * (computed before anything is allocated) exceeds the limit: by default 90% of the
 * machine's physical memory, past which the kernel would let the allocation through and
 * kill the process when the pages are touched. */
void cavs_set_memory_limit(size_t bytes); /* 0: the default */
/* A function that fails for want of memory (over the limit, or an allocation that
 * failed) sets errno to ENOMEM: clear errno before the call and test it after a
 * failure to tell these failures from the others. */
size_t cavs_memory_limit(void);
/* What m takes: its parameters, gradients and optimizer state, and a minibatch of
 * `rows` vertices (every per-row buffer and the scheduler's scratch). -1 on overflow. */
int cavs_model_memory(const cavs_model *m, long rows, size_t *model_bytes, size_t *row_bytes);
/* Time spent in matrix products and the flops they did (2mnk each) since the last reset,
 * for benchmarks. */
void cavs_gemm_counters(double *seconds, double *flops, int reset);

/* ---- data ---- */

/* Token <-> id. Id 0 is <unk>, what unknown tokens map to when the vocabulary is not
 * allowed to grow (evaluation data); id 1 is <eos>, the label after a sentence's last
 * token in `text` data. */
typedef struct cavs_vocab cavs_vocab;
cavs_vocab *cavs_vocab_new(void);
void cavs_vocab_free(cavs_vocab *v);
int cavs_vocab_size(const cavs_vocab *v);
int cavs_vocab_id(cavs_vocab *v, const char *word, size_t len, int add);
const char *cavs_vocab_word(const cavs_vocab *v, int id);

/* A file of graphs, read once: format "ptb-tree", "text" or "cgf" (cavs-data(5)). Tokens go to the model's
 * first index input, labels to its first class input; leaves get the first vertex type
 * without children, inner vertices the first with children. `dims` (or NULL) bounds the
 * labels; as everywhere in libcavs, only its first d->ndims entries are read. New tokens are added to the vocabulary when `grow` is set. On error returns
 * NULL with "file:line: error: ..." in err. The dataset owns its graphs. */
typedef struct cavs_dataset cavs_dataset;
cavs_dataset *cavs_dataset_load(const char *path, const char *format, const cavs_desc *d, const long *dims,
                                cavs_vocab *v, int grow, char *err, size_t errlen);
int cavs_dataset_count(const cavs_dataset *s);
const cavs_graph *cavs_dataset_graph(const cavs_dataset *s, int i);
long cavs_dataset_vertices(const cavs_dataset *s);
/* The largest value of an integer input (by slot) over the dataset, or -1. */
int cavs_dataset_max_feature(const cavs_dataset *s, int slot);
void cavs_dataset_free(cavs_dataset *s);

/* ---- checkpoints ----
 * One file: magic, format version, the model's name, source text and hash, precision,
 * dims, vocabulary, parameters, optimizer state, training state, and a checksum over all
 * of it. Written to a temporary file in the same directory, flushed and renamed, so a
 * crash never leaves a torn checkpoint; reading checks everything before using any of it. */
typedef struct cavs_train_state {
  int epoch;          /* epochs completed */
  uint64_t rng;       /* the shuffling generator */
  double best;        /* best dev metric so far (accuracy; dev loss without a classifier), or -1 */
  uint64_t seed;
  int threads, batch;
  char format[32];    /* data format of the training file */
  cavs_optim optim;
  long graphs_done;   /* an interrupted epoch: the graphs of epoch+1 already trained on */
} cavs_train_state;

/* What a checkpoint may hold; anything beyond is refused as damaged. */
#define CAVS_MAX_CKPT_BYTES ((uint64_t)1 << 36)
#define CAVS_MAX_SOURCE_BYTES (64 << 20)
#define CAVS_MAX_DIM (1L << 24) /* a dim's value, also the largest vocabulary */
#define CAVS_MAX_PARAMS 65536
#define CAVS_MAX_NAME 255
#define CAVS_MAX_GRAPH_VERTICES (1L << 30) /* also the most vertices in one minibatch */
/* Names (models, dims, inputs, parameters) follow the .vf language's identifier rule:
 * [A-Za-z_][A-Za-z0-9_]*, at most CAVS_MAX_NAME bytes. 1 when s is one. */
int cavs_is_identifier(const char *s);

typedef struct cavs_ckpt cavs_ckpt;
int cavs_ckpt_save(const char *path, cavs_model *m, const char *source, const cavs_vocab *v,
                   const cavs_train_state *ts, char *err, size_t errlen);
cavs_ckpt *cavs_ckpt_read(const char *path, char *err, size_t errlen);
void cavs_ckpt_free(cavs_ckpt *k);
const char *cavs_ckpt_model(const cavs_ckpt *k);   /* model name */
const char *cavs_ckpt_source(const cavs_ckpt *k);  /* the .vf text it was trained from */
const char *cavs_ckpt_hash(const cavs_ckpt *k);
int cavs_ckpt_precision(const cavs_ckpt *k);
/* dims by name: fills dims[] in the order of d's dims; -1 on a mismatch (message in err) */
int cavs_ckpt_dims(const cavs_ckpt *k, const cavs_desc *d, long *dims, char *err, size_t errlen);
const cavs_train_state *cavs_ckpt_state(const cavs_ckpt *k);
/* The dims as saved: their number, and each one's name and value. */
int cavs_ckpt_ndims(const cavs_ckpt *k);
const char *cavs_ckpt_dim_name(const cavs_ckpt *k, int i);
long cavs_ckpt_dim_value(const cavs_ckpt *k, int i);
long cavs_ckpt_param_count(const cavs_ckpt *k);
/* A new vocabulary with the checkpoint's words, in their ids. */
cavs_vocab *cavs_ckpt_vocab(const cavs_ckpt *k);
/* Copies parameters and optimizer state into m after checking that they fit. */
int cavs_ckpt_apply(const cavs_ckpt *k, cavs_model *m, char *err, size_t errlen);

/* Synthetic data, as ptb-tree lines: a toy treebank with a learnable signal, and
 * complete binary trees (the Tree-FC benchmark). */
int cavs_gen_toy(FILE *out, int ntrees, int maxleaves, int nwords, uint64_t seed);
int cavs_gen_complete(FILE *out, int ntrees, int leaves, int nwords, int nclass, uint64_t seed);
/* Random trees (ptb-tree), or with dag, random DAGs in cgf with types leaf/internal. */
int cavs_gen_random(FILE *out, int ngraphs, int maxv, int nwords, int nclass, int dag, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif

/* cavs.h: libcavs for an application. (What cavsc's generated code is written against,
 * the descriptor types included, is cavs_abi.h, which this header includes.)
 *
 * A short tutorial. cavsc turns a model (man 5 vf) into C:
 *
 *     cavsc -o build dsl-examples/treelstm.vf     # build/treelstm.h, build/treelstm.c
 *
 * and an application trains it with libcavs:
 *
 *     #include "cavs.h"                              // the application's API
 *     #include "treelstm.h"                          // the model: treelstm_desc, its enums
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
 * Threads: a model is used by one thread at a time; its backend may use several
 * (cavs_model_opts.threads).
 */
#ifndef CAVS_H
#define CAVS_H

#include "cavs_abi.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the application's API ---- */

typedef struct cavs_model cavs_model;

typedef struct cavs_graph {
  int n;               /* vertices */
  int maxc;            /* slots per vertex in `child` */
  const int *child;    /* [n * maxc], vertex numbers in this graph, -1 = absent */
  const int *type;     /* [n], vertex block index; NULL: all 0 */
  const int *feat;     /* [n * nint]: integer inputs, in descriptor slot order */
  const float *real;   /* [n * total real width], in slot order; NULL if none */
  int slots;           /* 0, or at least the last slot any vertex fills, plus one (the
                          data sets set it: a model with children as a set then reads
                          no slot past it; 0: the scheduler finds it) */
} cavs_graph;

typedef struct cavs_stats {
  double loss;          /* mean over counted rows, summed over the model's losses */
  long count, correct;  /* all labeled vertices, of the softmax_xent losses (a
                           regression loss has no accuracy: cavs_model_losses) */
  long root_count, root_correct;
  int tasks;            /* path-phase tasks run */
  int lower_bound;      /* no policy runs fewer tasks: summed over the vertex types,
                           the most vertices of the type on one path (at least the
                           longest path) */
  double aux_loss;      /* the mixtures of experts' load-balancing losses (top(g, K, w)
                           with w > 0), not in `loss`: what the backward pass's
                           gradient adds to the loss's */
} cavs_stats;

/* How vertices are batched into tasks (cavs_model_set_policy). A task is vertices of
 * one type whose children have run. CAVS_BFS (the default) and CAVS_DEPTH (TensorFlow
 * Fold's name for it): every vertex of one type and one level (the longest path from a
 * vertex without children), level by level; CAVS_SERIAL: the same order, a vertex a
 * task; CAVS_AGENDA (DyNet's): all ready vertices of the type whose ready vertices have
 * the lowest mean level; CAVS_FRONTIER: all ready vertices of a type none of whose
 * vertices wait for anything (ED-Batch's Lemma 1: that choice begins a shortest
 * sequence), else of the type with the ready vertex furthest from a root (most ready
 * vertices on a tie). Types in index order on ties. */
enum cavs_policy { CAVS_BFS = 0, CAVS_SERIAL = 1, CAVS_DEPTH = 2, CAVS_AGENDA = 3, CAVS_FRONTIER = 4 };

void cavs_dims_default(const cavs_desc *d, long *dims);
/* Sets every product dim (`dim HH = H * H`) of dims to the product of its factors, 0
 * where a factor is unbound. cavs_dims_default does it too; so does cavs_model_new on
 * its own copy, so a caller that sets H after the defaults gets HH right. */
void cavs_dims_derive(const cavs_desc *d, long *dims);
cavs_model *cavs_model_new(const cavs_desc *d, const long *dims, char *err, size_t errlen);

/* The version of this libcavs ("0.1.0"), for an application to report or check. */
const char *cavs_version(void);

/* ---- backends ----
 * Where a model's state lives and its arithmetic runs, chosen when the model is made:
 * "cpu" (host memory, OpenBLAS for the products) and, in a build with the CUDA backend,
 * "cuda". cavs_model_new takes "cpu". */
int cavs_backend_count(void);
const char *cavs_backend_name(int i); /* i in [0, cavs_backend_count()), else NULL */
/* 0 when `name` is a backend of this build that can run on this machine; else -1 with
 * the reason in msg (an unknown name, one this build lacks, no device). */
int cavs_backend_probe(const char *name, char *msg, size_t len);
typedef struct cavs_model_opts {
  const char *backend; /* NULL or "": "cpu" */
  int threads;         /* the model's threads: on the CPU a pool of its own that runs the
                          products (split in blocks, OpenBLAS single-threaded inside each:
                          a model made with threads sets OpenBLAS's, the process's, to 1),
                          the fused loops and large clears; 0: one, and OpenBLAS's
                          threads left as they are */
  int one_stream;      /* 1: a backend with streams issues everything to one, so the eager
                          phase does not overlap the path tasks (an ablation); 0: it
                          overlaps where the backend can (CUDA) */
  int graphs;          /* 1: (CUDA) each pass is captured as a CUDA graph and launched
                          whole, the graph updated in place while its shape repeats */
  int blas;            /* 1: (CPU) every product through the BLAS, also where libcavs has
                          its own (single precision on a processor with AVX-512; the
                          environment variable CAVS_GEMM=blas does the same for the
                          process): an ablation, and a second opinion */
} cavs_model_opts;
cavs_model *cavs_model_new_opts(const cavs_desc *d, const long *dims, const cavs_model_opts *o, char *err,
                                size_t errlen);
const char *cavs_model_backend(const cavs_model *m);
/* What the backend did since the model was made or the last reset, for benchmarks: the
 * matrix products (calls, seconds, 2mnk flops each) and the launches: every kernel
 * launch and cuBLAS call on a GPU; on the CPU, each operation that would be one (a BLAS
 * call, a gather, a lookup, a row copy, a loss, a row clear; a fused loop of the C
 * target is not one, of the CUDA target it is). */
typedef struct cavs_backend_stats {
  long gemm_calls;
  double gemm_seconds, gemm_flops;
  long launches;
  /* where the rest of the time went, on the cpu backend (on cuda, whose calls return
     before the device is done, only the host's scheduling is timed): the row
     operations (gathers, scatters, lookups, row copies, losses), the fused loops, the
     clears, the optimizer steps, and the scheduler's own work (levels, rows, tasks, the
     passes' plans) */
  double rows_seconds, loop_seconds, zero_seconds, step_seconds, schedule_seconds;
  double gather_seconds; /* the part of rows_seconds that the gathers of children's rows
                            and their backward (the scatter-adds) took */
  /* the scheduler's layout: the rows gathered (a child's row read by its parent's task,
     one a slot), and of those the rows of tasks whose children are one block of rows,
     parent by parent and slot by slot (the task's gathered buffer read in place: a view
     would do, no copy), and of those the rows read in place, through a view of the
     state buffer, with no copy: every task of a type is such a block, one after the
     other, and the model's code allows it (cavs_gather_desc.view) */
  long gathered_rows, gathered_in_place, gathered_viewed;
  /* of the rows gathered, those at home in their parent's gathered row: the child's
     fused loops stored its state there (and read back the gradient the parent left
     there), so the gather copied nothing for it (cavs_vertex_desc.homes) */
  long gathered_homed;
  /* growing the per-row and per-edge buffers to a larger minibatch than any before (the
     first minibatches of a run; the pages the kernel zeroes): memory, not scheduling,
     so not in schedule_seconds */
  double grow_seconds;
} cavs_backend_stats;
void cavs_model_backend_stats(cavs_model *m, cavs_backend_stats *st, int reset);
void cavs_model_free(cavs_model *m);
void cavs_model_init(cavs_model *m, uint64_t seed);
/* The scheduling policy (enum cavs_policy; CAVS_BFS by default; another value is
 * ignored). */
void cavs_model_set_policy(cavs_model *m, int policy);
/* Ablations, to measure what a phase is worth: the eager phase run task by task, each
 * task's rows just before (forward) or after (backward) its path stage, instead of once
 * over all rows of a type (CAVS_NO_EAGER); the lazy phase task by task too
 * (CAVS_NO_LAZY). CAVS_ROWMAT_BY_GEMM: mv and mm row by row through the backend's gemm,
 * as on a backend without kernels of its own for them (the CPU's pack the rows into one
 * product). Same results but for the rounding of parameter gradients summed in
 * pieces. CAVS_NO_VIEWS: every gather copies its children's rows, even where they lie
 * in one block of the state buffer that a view would read in place. CAVS_NO_HOMES: no
 * child is given a home in its parent's gathered row, so every gather copies (the
 * children's loops still store their state at a scratch row: the same results, bit for
 * bit on trees and chains, at a little more than the cost of the copies alone).
 * CAVS_NO_DEDUP: a product of looked-up rows (x = emb[word], x @ W) multiplies every
 * row, where the CPU backend otherwise multiplies each distinct word of the stage once
 * and shares it out (the same sums but for their rounding). */
enum cavs_ablation { CAVS_NO_EAGER = 1, CAVS_NO_LAZY = 2, CAVS_NO_VIEWS = 4, CAVS_ROWMAT_BY_GEMM = 8,
                     CAVS_NO_HOMES = 16, CAVS_NO_DEDUP = 32 };
void cavs_model_set_ablations(cavs_model *m, int flags);
/* Inference (on != 0): forward passes compute the same values and losses but store
 * nothing only a backward pass would read (the gates a fused loop keeps for its
 * backward loop), and a product of looked-up rows (x = emb[word], x @ W) becomes, once
 * as many rows as the table has went through it, a lookup in the table emb @ W, made
 * once (up to 256 MiB); so they take less time. cavs_model_backward after such a pass
 * does nothing, and the next cavs_model_step fails with a message. Turning inference on
 * or off, cavs_model_write, cavs_model_init and loading a checkpoint drop those tables;
 * parameters changed through their pointers while it is on are not seen by them. Off
 * by default; `cavs eval`, `cavs predict` and the dev set's evaluation turn it on. */
void cavs_model_set_inference(cavs_model *m, int on);
/* Training passes that run the push block only where a loss has a target (on != 0): a
 * forward pass whose backward pass follows needs the push block's values only at the
 * rows that pass starts from, those with a class (softmax_xent's label >= 0). At the
 * others cavs_model_vertex_class and cavs_model_vertex_probs then give -1, and
 * cavs_model_vertex_value refuses the push block's values. The loss, the accuracies and
 * every gradient are the same. Only where every loss is a softmax_xent and the push
 * block routes no mixture of experts (whose balancing loss covers every row it routes);
 * passes in inference are not narrowed. Off by default; `cavs train` turns it on (a
 * minibatch labeled at its roots alone, Fold's Tree-FC benchmark, then runs its
 * classifier at the roots). */
void cavs_model_set_targets_only(cavs_model *m, int on);
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
/* After a forward pass: the class predicted at vertex v of graph g of the minibatch (as
 * the graph numbers its vertices), or -1 (no such vertex, or one without a prediction). */
int cavs_model_vertex_class(const cavs_model *m, int g, int v);
/* After a forward pass: the value vertex v of graph g pushed (what the push block read
 * from it: a Tree-LSTM's h), its first min(n, width) numbers into out (out may be
 * NULL). Returns the width, or -1 (no such vertex, one whose type does not push, a
 * model without a push block, or a failed read: cavs_model_error). */
long cavs_model_vertex_output(cavs_model *m, int g, int v, double *out, long n);
/* After a forward pass: the class probabilities at vertex v of graph g (the softmax of
 * the first softmax_xent loss's logits), the first min(n, classes) into out (out may be
 * NULL). Returns the number of classes, or -1 (no such vertex, one whose type does not
 * push, a model without a softmax_xent loss, or a failed read: cavs_model_error). */
long cavs_model_vertex_probs(cavs_model *m, int g, int v, double *out, long n);
/* After a forward pass: the value the .vf names `name` at vertex v of graph g (that
 * vertex's block's, else the pull or push block's), its first n entries into out (as
 * doubles; out may be NULL to ask the width). Returns the width, or -1: no such vertex,
 * no such value stored per row (one that lives only in a fused loop's registers, or a
 * name the block gives twice), one not computed at a vertex without children, the pull
 * block's at a vertex whose type does not read it (pull(): the pull block runs at the
 * rows of the types that do), the push block's at one whose type does not push, a
 * kept gate after a pass in inference, or a failed read (cavs_model_error says which). */
long cavs_model_vertex_value(cavs_model *m, int g, int v, const char *name, double *out, long n);
/* After a forward pass: each loss of the model (in the order of desc->losses) summed
 * over the minibatch, *n of them; correct counts stay 0 for a regression loss. */
const cavs_loss_acc *cavs_model_losses(const cavs_model *m, int *n);
/* Data parallelism: after a forward pass over one part of a minibatch, the rows each
 * loss counted over the whole minibatch (counts[l] for loss l, in the order of
 * desc->losses; 0, or counts NULL: the part's own count), so that the next backward
 * pass divides by them: the parts' gradients then sum to the whole minibatch's (each
 * loss a mean over all its rows). A count below the part's own is refused (-1, with a
 * message). The next forward pass forgets them. */
int cavs_model_set_loss_counts(cavs_model *m, const long *counts);
/* The same for a mixture of experts' load-balancing loss (top(g, K, balance) with a
 * weight above 0), which is not a sum over rows: weight X sum_e f_e P_e, f_e the share
 * of the K slots a row that expert e received and P_e the mean probability of e, over
 * the rows the pass routed. A part computes it from its own rows alone. So after the
 * forward pass over a part, read each routing's sums (`route` as in
 * cavs_model_expert_load): cavs_model_balance returns the experts' count X (0 where the
 * pass ran no balancing loss of that routing, -1 on bad arguments) and, where cap is at
 * least 2 X + 1, writes v[0] the rows routed, v[1 .. X] each expert's slots and
 * v[X + 1 .. 2 X] each expert's summed probability. Add them over the parts (a part
 * whose pass did not route adds zeros; counts are exact in a double to 2^53) and give
 * the sums to cavs_model_set_balance before the backward pass: the loss's gradient on
 * the gate is then the whole minibatch's share, and the parts' gradients sum to the
 * whole's, within the rounding of the sums' order. Refused (-1, with a message): a
 * routing this pass did not balance, the wrong X, or sums that cannot be the whole's
 * (fewer rows or slots than the part's own, slots that are not K a row, a probability
 * sum that is negative, above its rows or not finite), or a set after the backward pass.
 * The next forward pass forgets them. */
long cavs_model_balance(const cavs_model *m, int route, double *v, long cap);
int cavs_model_set_balance(cavs_model *m, int route, const double *v, long X);
/* Data parallelism: the forward passes from now on run a part of a minibatch whose first
 * vertex is vertex `first` of the whole (the whole's graphs' vertices numbered in order),
 * so that dropout draws at each vertex the mask the whole minibatch's pass draws there
 * (a mask is keyed by the seed, the step and the vertex's number). 0 (the default): the
 * pass is the whole. 0, or -1 with a message for a number below 0 or past 2^53. */
int cavs_model_set_vertex_offset(cavs_model *m, long first);
/* Data parallelism, overlapped: `hook` is called by every cavs_model_backward from now
 * on as each parameter group's gradient becomes final (once a group a pass: `count`
 * scalars at `grad`, group `group` of cavs_desc.pgroups, read with cavs_model_read), so
 * that its reduction over the processes may start while the pass goes on; and with
 * group -1 (grad NULL) between the pass's steps, for a little work of the caller's
 * (MPI_Test, which is what progresses a non-blocking collective). On the cpu backend a
 * group is final after the last of the pass's stages that adds to it has run
 * (cavs_desc's bwd_grads, pull_grads, push_grads); on a backend that runs the pass
 * asynchronously (cuda), every group once the pass is issued. A group nothing adds to
 * in a pass (zero) comes at its end. NULL: no hook (the default). */
typedef void (*cavs_grad_hook)(void *arg, int group, void *grad, size_t count);
void cavs_model_set_grad_hook(cavs_model *m, cavs_grad_hook hook, void *arg);
/* Carried state: stateful truncated backpropagation through time, for a language model
 * over a stream cut into chunks (one chain a chunk). On (on != 0), every forward pass
 * keeps, for each of its graphs g, the state the graph's last vertex scattered, and in
 * the next forward pass graph g's first vertex, when it has no children, gathers that
 * state as its child 0 instead of zeros: minibatch j + 1's graph g must then be the
 * chunk after minibatch j's graph g. No gradient flows back into the earlier pass
 * (truncated). A graph with no graph at its place in the last pass (the first pass, a
 * larger minibatch, after cavs_model_reset_state) starts from zeros. The model's vertex
 * types must scatter one state buffer, and one of them gather its child 0: 0, or -1
 * with a message. On again keeps the state; off (the default) forgets it.
 * cavs_ckpt_save keeps it and cavs_ckpt_apply turns carrying on with it, so a run
 * stopped between two minibatches goes on as it would have. */
int cavs_model_carry_state(cavs_model *m, int on);
/* The carried state forgotten: the next pass starts from zeros (at an epoch's or an
 * evaluation's start). */
void cavs_model_reset_state(cavs_model *m);
/* The carried state on the host, to move it between processes (cavs train under mpirun
 * gathers its ranks' parts into the checkpoint and gives each its part back): the rows
 * it holds (graphs of the last pass; 0 when the model does not carry) and a row's
 * values; rows [first, first + rows) copied into host ([rows, width], in the model's
 * precision); the state replaced by `rows` rows from host (at most CAVS_MAX_CARRIED;
 * the model must carry). 0, or -1 with a message. */
int cavs_model_carried(const cavs_model *m, long *width);
int cavs_model_read_carried(cavs_model *m, int first, int rows, void *host);
int cavs_model_set_carried(cavs_model *m, const void *host, int rows);
const char *cavs_model_error(const cavs_model *m);
long cavs_model_dim(const cavs_model *m, int dim);
/* Options (`option NAME = P;` in the .vf, cavs_desc.options): values the model reads at
 * run time, today dropout probabilities, that are not part of its identity (the source
 * hash a checkpoint records counts only the default). A new model holds the defaults.
 * cavs_option_find: the index of option `name` in d->options, or -1.
 * cavs_model_set_option: 0, or -1 with a message in cavs_model_error for a name the
 * model does not declare or a value outside [0, 1). The next forward pass uses it.
 * cavs_model_option: option k's value now (0 <= k < desc->noptions). */
int cavs_option_find(const cavs_desc *d, const char *name);
int cavs_model_set_option(cavs_model *m, const char *name, double value);
double cavs_model_option(const cavs_model *m, int k);
/* Parameter i: its storage and gradient (row stride in *ld), in the model's precision. */
void *cavs_model_param(cavs_model *m, int i, long *rows, long *cols, long *ld);
void *cavs_model_grad(cavs_model *m, int i, long *rows, long *cols, long *ld);
/* Those pointers are into the backend's memory: on the cpu backend, host memory an
 * application may read and write; on another (cuda), device memory, which it reads and
 * writes with these two: `bytes` from src to dst, one of them in the model's memory, the
 * other in the host's. 0, or -1 with a message in cavs_model_error(). */
int cavs_model_read(cavs_model *m, void *host, const void *model_mem, size_t bytes);
int cavs_model_write(cavs_model *m, void *model_mem, const void *host, size_t bytes);
/* Host memory for those copies: pinned (page-locked) on the cuda backend, where copies
 * from and to it run at the bus's rate (a pageable buffer is staged through the driver's
 * own a piece at a time); malloc's on the cpu. Free it with cavs_host_free on a model of
 * the same backend. NULL (errno ENOMEM) when it cannot be had. */
void *cavs_host_alloc(cavs_model *m, size_t bytes);
void cavs_host_free(cavs_model *m, void *p);
/* All parameters as one block of `count` scalars (for checkpoints and optimizers). */
void *cavs_model_params_flat(cavs_model *m, size_t *count);
void *cavs_model_grads_flat(cavs_model *m, size_t *count);

/* Lookup tables (cavs_pgroup_desc.sparse_input) are updated lazily: only the rows the
 * minibatch read, with the optimizer's state of the other rows (Adam's moments, the
 * momentum buffer) left as it is (as sparse Adam does elsewhere); weight decay applies
 * to those rows too.
 *
 * Momentum and Nesterov are kinds of their own, not a momentum field on SGD with a
 * nesterov flag: a kind is one update rule, one name in the table (what `cavs train
 * --optimizer` takes) and one default rate, there is no combination to refuse (Nesterov
 * without momentum), and a zero field keeps meaning "the default", as beta1's does. */
enum cavs_optim_kind {
  CAVS_SGD,      /* p -= lr g */
  CAVS_ADAGRAD,  /* s += g^2; p -= lr g / (sqrt(s) + eps) */
  CAVS_ADAM,     /* with bias correction (Kingma & Ba) */
  CAVS_MOMENTUM, /* heavy ball, as PyTorch's SGD: b = mu b + g; p -= lr b */
  CAVS_NESTEROV, /* as PyTorch's SGD with nesterov: b = mu b + g; p -= lr (g + mu b) */
  CAVS_ADAMW,    /* Adam with decoupled weight decay (Loshchilov & Hutter):
                    p -= lr (m^ / (sqrt(v^) + eps) + weight_decay p) */
  CAVS_OPTIM_COUNT
};
/* Adam's and AdamW's moments and the momentum buffer b are stored as zero where they fall
 * below the smallest normal number (a parameter whose gradient stays zero decays them
 * into the subnormals, which some processors compute on many times more slowly). */
/* The optimizers by name ("sgd", "adagrad", "adam", "momentum", "nesterov", "adamw"),
 * from one table in optim.c: a kind's name (NULL for none), the kind of a name (-1 for
 * none), a kind's default learning rate. */
const char *cavs_optim_name(int kind);
int cavs_optim_kind(const char *name);
double cavs_optim_default_lr(int kind);
/* A zero field is its default (weight_decay's and clip's: none), so an application that
 * sets what it uses and leaves the rest zero gets what this header says. */
typedef struct cavs_optim {
  int kind;
  double lr;
  double clip;         /* global gradient-norm clip; 0: none */
  double weight_decay; /* L2, added to the gradient before the clip; AdamW: decoupled
                          (the p term above, after the clip) */
  double beta1, beta2, eps; /* Adam, AdamW (defaults 0.9, 0.999, 1e-8); Adagrad uses eps */
  double momentum;          /* Momentum, Nesterov: mu, 0 to 1 (default 0.9) */
} cavs_optim;
/* -1 (message in cavs_model_error) only when the optimizer's state cannot be allocated
 * (errno ENOMEM past the memory limit: the step can be taken again once it fits). The
 * step uses the gradients up and leaves them zero (read them, with cavs_model_grad,
 * between the backward pass and the step). */
int cavs_model_step(cavs_model *m, const cavs_optim *o);
/* The state an optimizer of `kind` keeps, allocated now (zeroed where m lacks it; what m
 * holds is kept) and counted against the memory limit, as the first cavs_model_step with
 * that kind would: SGD none, Momentum, Nesterov and Adagrad one block as large as the
 * parameters, Adam and AdamW two. Call it before training to fail before the first
 * minibatch instead of at the first step. -1 (message; errno ENOMEM past the limit). */
int cavs_model_reserve_optimizer(cavs_model *m, int kind);
/* The global gradient norm the last step saw: the L2 norm over every gradient it used
 * (weight decay added, before the clip; a lookup table's rows the minibatch read), or -1
 * when it kept none: steps keep it after cavs_model_track_grad_norm(m, 1) (0 turns that
 * off; it costs a pass over the gradients where there is no clip to take it for, and on
 * the cuda backend 8 bytes down a step). On the cuda backend, reading it waits for the
 * step. */
int cavs_model_track_grad_norm(cavs_model *m, int on);
/* A mixture of experts' load: how many of the rows' slots (K a row) each expert of
 * routing `route` (the model's moe blocks in order: pull, vertex types, push) received
 * in the passes since cavs_model_expert_load_reset, into counts[0..cap); returns the
 * number of experts (0 for a routing that has not run), -1 on bad arguments. */
int cavs_model_expert_load(cavs_model *m, int route, long *counts, int cap);
void cavs_model_expert_load_reset(cavs_model *m);
/* Expert parallelism: the experts of every mixture of experts placed on `size`
 * processes (cavs train --expert-parallel under mpirun), expert e of X on process q when
 * ceil(q X / size) <= e < ceil((q + 1) X / size). Each forward and backward pass then
 * sends each slot's row to its expert's process, which runs one product per expert over
 * every process's rows of it and sends the results back. libcavs knows nothing of the
 * transport: the application gives it two collectives over its processes, each called
 * by every process the same number of times in the same order, and every process must
 * run the same sequence of passes (forward, then backward or cavs_model_expert_serve)
 * and steps: a process that has finished a pass goes on answering the others' rows
 * until all have (rounds with no rows of its own).
 *
 * An expert's matrices are its owner's: from the placement of an expert table (an
 * emm's [X, A * B] parameter: when the comm is first set, for every table the model's
 * descriptor names, so that cavs_model_init and cavs_ckpt_apply after it write only
 * this process's experts and never touch the others' memory; else at the first pass
 * that reads it), its gradient is added to on the owner only (a hot
 * expert's replica sends its gradient there at the backward pass's end) and
 * cavs_model_step updates expert e on its owner only (a global-norm clip adds the
 * owners' squares over the processes: every process must step with the same clip and
 * norm tracking). The application sums every other gradient over the processes (data
 * parallelism), but not the placed tables' (cavs_model_expert_placed says where they
 * are: each process holds its own experts' gradient only). A process holds only its
 * own experts: the other processes' rows of a placed table, in the parameters, the
 * gradient and the optimizer's moments, are zero, their memory given back to the
 * system, from the placement and after each step (a hot expert's replica holds its
 * copy from the round that sends it to the step). So before reading the whole
 * parameters (a checkpoint, a pass run alone with the comm set to NULL), call
 * cavs_model_expert_gather (one process reads them: only it holds them all, until the
 * next step or cavs_model_expert_release) or cavs_model_expert_sync (every process) on
 * every process; a pass with
 * the comm set needs neither. Returns an error code from a collective as a failed pass
 * ("expert exchange failed"). A process that fails its part of an exchange alone (its
 * exchange buffers, which the memory limit counts, past it) fails it on every process:
 * each process's pass returns -1, the failed one with its own message (errno ENOMEM)
 * and the others naming it, and none waits in a collective. On the cuda backend the exchange's rows and matrices are
 * staged through host memory, and the other processes' experts keep their device
 * memory (stale, their gradients zero). */
typedef struct cavs_expert_comm {
  int rank, size; /* this process, of size (1 to 4096) */
  /* `bytes` bytes from every process, in rank order, into all[size * bytes] */
  int (*allgather)(void *arg, const void *mine, size_t bytes, void *all);
  /* sbytes[q] bytes to process q, laid one after the other in rank order at send;
     rbytes[q] bytes from q likewise into recv (MPI_Alltoallv); 0 on success */
  int (*alltoallv)(void *arg, const void *send, const size_t *sbytes, void *recv, const size_t *rbytes);
  void *arg;
  /* 1: while a round's loads are skewed (the busiest process above 5/4 of the mean),
     the busiest's heaviest expert not yet split has half its rows run by the least
     busy process, on its copy of the expert (a replica), which adds to its own
     gradient of it (at most 8 experts a round) */
  int replicate;
} cavs_expert_comm;
/* comm copied (NULL: every product here, the default; experts already placed stay so,
 * with the comm kept for steps and syncs): 0, or -1 with a message for a size or rank
 * out of range (or not the placement's), a missing collective, a backend other than
 * the cpu's */
int cavs_model_set_expert_comm(cavs_model *m, const cavs_expert_comm *comm);
/* The expert tables placed so far (-1 for a bad argument); for i below that number,
 * table i's place in the flat parameter and gradient blocks (cavs_model_grads_flat):
 * *count scalars from scalar *off, the gradient of which is not to be summed over the
 * processes. */
int cavs_model_expert_placed(cavs_model *m, int i, size_t *off, size_t *count);
/* Every placed expert's matrices and optimizer state (Adam's moments) copied from its
 * owner to every other process, so that all hold the same whole model: a collective
 * (every process calls it at the same point). 0, or -1 with a message. */
int cavs_model_expert_sync(cavs_model *m);
/* The same to process root alone (the one that writes a checkpoint): the others keep
 * only their own. A collective; 0, or -1 with a message (root out of range). */
int cavs_model_expert_gather(cavs_model *m, int root);
/* What a gather or a sync brought given back at once, not at the next step: each
 * process's copies of the other processes' experts zeroed and their memory returned,
 * as after a step (after the checkpoint is written, so that the writer holds the whole
 * model only while it writes). Every process calls it at the same point (each keeps
 * the same record of which copies are current). 0, or -1 for a NULL model. */
int cavs_model_expert_release(cavs_model *m);
/* In place of a backward pass whose gradients would count for nothing (a process with
 * no graph of a minibatch): the gradients cleared as a backward pass clears them, then
 * the other processes' rows of its experts answered until their backward passes end.
 * 0, or -1 with a message. */
int cavs_model_expert_serve(cavs_model *m);
/* What expert parallelism moved since the last reset: exchange rounds, slot rows sent
 * to other processes (forward and backward), rows received from them and computed
 * here, rows kept here, rows run on a replica (sent or kept), the seconds spent in the
 * collectives, and the matrices sent to replicas and gradients sent home. */
typedef struct cavs_expert_stats {
  long rounds, rows_out, rows_in, rows_here;
  long rows_replicated; /* of rows_out and rows_here, those run on a hot expert's replica */
  double seconds;
  long matrices; /* an expert's matrix sent to its replica, or its gradient home from one */
} cavs_expert_stats;
void cavs_model_expert_stats(cavs_model *m, cavs_expert_stats *s, int reset);
double cavs_model_grad_norm(cavs_model *m);
/* Parameter `param` left as it is by every step from now (frozen 1) or updated again
 * (0): pre-trained embeddings kept fixed. A parameter that shares its storage with
 * others (merged products) cannot be frozen alone: -1, message in cavs_model_error. */
int cavs_model_freeze(cavs_model *m, int param, int frozen);
/* Lookup tables in data parallelism: a table's step updates only the rows the
 * minibatch read (lazily: Adam's moments of the others not decayed), so parts of one
 * minibatch run by separate models must each update the union of the parts' rows.
 * cavs_model_touched_rows: the rows of table `param` the last backward pass read (and
 * the next step updates), their number (*rows pointing at them, valid until the next
 * pass), or -1 for a parameter that is not a lookup table. cavs_model_touch_rows, after
 * the backward pass: rows the other parts read, added (each a zero gradient here until
 * the application sums the parts' gradients into it). 0, or -1 with a message: not a
 * lookup table, a row out of range. */
int cavs_model_touched_rows(const cavs_model *m, int param, const int **rows);
int cavs_model_touch_rows(cavs_model *m, int param, const int *rows, int n);

/* Memory: a model refuses to be made, and a minibatch to be run, when what it needs
 * (computed before anything is allocated) exceeds the limit: by default 90% of the
 * machine's physical memory, past which the kernel would let the allocation through and
 * kill the process when the pages are touched. */
void cavs_set_memory_limit(size_t bytes); /* 0: the default */
/* A function that fails for want of memory (over the limit, or an allocation that
 * failed, on the host or the device) sets errno to ENOMEM, and one that fails because
 * the device did (a kernel's fault, a lost GPU: the model can only be freed) to EIO:
 * clear errno before the call and test it after a failure to tell these failures from
 * the others. After ENOMEM the model is as usable as before the pass: the next forward
 * pass starts afresh (with memory freed, the limit raised or a smaller minibatch); what
 * the failed pass computed is gone (its backward pass does nothing, the step after it
 * returns -1 and changes nothing). A backward pass returns nothing: the step after it
 * reports its failure, errno as the failure set it. */
size_t cavs_memory_limit(void);
/* What m takes: its parameters, gradients and the optimizer state it holds (none until
 * a step or cavs_model_reserve_optimizer: a block for each moment its optimizer keeps),
 * and a minibatch of `rows` vertices (every per-row buffer and the scheduler's scratch).
 * -1 on overflow. */
int cavs_model_memory(const cavs_model *m, long rows, size_t *model_bytes, size_t *row_bytes);

/* ---- data ---- */

/* Token <-> id. Id 0 is <unk>, what unknown tokens map to when the vocabulary is not
 * allowed to grow (evaluation data); id 1 is <eos>, the label after a sentence's last
 * token in `text` data. */
typedef struct cavs_vocab cavs_vocab;
cavs_vocab *cavs_vocab_new(void); /* NULL, errno ENOMEM, when memory runs out */
void cavs_vocab_free(cavs_vocab *v);
int cavs_vocab_size(const cavs_vocab *v);
int cavs_vocab_id(cavs_vocab *v, const char *word, size_t len, int add);
const char *cavs_vocab_word(const cavs_vocab *v, int id);
/* Pre-trained vectors into lookup table `param` ([rows, cols]): a text file of lines
 * "WORD x1 ... xcols" (GloVe; word2vec's text format, whose first line "COUNT DIM" is
 * passed over), each word's vector into the row of its id in v (words v does not have
 * are passed over). *found: the rows written. On a malformed file -1 with
 * "path:line: error: ..." in err, and the table as it was. */
int cavs_model_load_vectors(cavs_model *m, int param, const char *path, cavs_vocab *v, long *found, char *err,
                            size_t errlen);
/* The same, saying what it found. The file may be gzip-compressed (read through zlib);
 * a line's numbers are its last cols fields and its word whatever comes before them
 * (GloVe 840B has words with spaces, which match no vocabulary word). */
#define CAVS_VECTORS_SAMPLE 8
typedef struct cavs_vectors_report {
  long vectors; /* lines with a vector */
  long found;   /* rows of the table written: words of v the file has a vector for */
  long missing; /* words of v (<unk> and <eos> aside) it has none for ... */
  int nsample;  /* ... the first of them, by id */
  int sample[CAVS_VECTORS_SAMPLE];
} cavs_vectors_report;
int cavs_model_load_vectors_report(cavs_model *m, int param, const char *path, cavs_vocab *v, cavs_vectors_report *r,
                                   char *err, size_t errlen);

/* A file of graphs, read once: format "ptb-tree", "text", "text-bptt" or "cgf" (cavs-data(5)). Tokens go to the model's
 * first index input, labels to its first class input; leaves get the first vertex type
 * without children, inner vertices the first with children. `dims` (or NULL) bounds the
 * labels; as everywhere in libcavs, only its first d->ndims entries are read. New tokens are added to the vocabulary when `grow` is set. On error returns
 * NULL with "file:line: error: ..." in err. The dataset owns its graphs. */
typedef struct cavs_dataset cavs_dataset;
cavs_dataset *cavs_dataset_load(const char *path, const char *format, const cavs_desc *d, const long *dims,
                                cavs_vocab *v, int grow, char *err, size_t errlen);
/* The same from len bytes in memory (a tree an application holds as text), named `name`
 * in messages ("<string>" when NULL); text is not kept. */
cavs_dataset *cavs_dataset_parse(const char *text, size_t len, const char *name, const char *format,
                                 const cavs_desc *d, const long *dims, cavs_vocab *v, int grow, char *err,
                                 size_t errlen);
int cavs_dataset_count(const cavs_dataset *s);
const cavs_graph *cavs_dataset_graph(const cavs_dataset *s, int i);
long cavs_dataset_vertices(const cavs_dataset *s);
/* The largest value of an integer input (by slot) over the dataset, or -1. */
int cavs_dataset_max_feature(const cavs_dataset *s, int slot);
void cavs_dataset_free(cavs_dataset *s);

/* A data file streamed, for data larger than memory: cavs_stream_open reads it once
 * through (growing the vocabulary when grow, checking every line as a load does) and
 * keeps only an index: each graph's place in the file, its vertices and a hash of its
 * bytes (24 bytes a graph). cavs_stream_read reads graphs which[0..n) back from the file
 * into a data set of their own, graph j being which[j], and fails, naming the file,
 * where a graph's bytes are not what they were. Formats whose graphs stand alone on
 * their lines (ptb-tree, text, cgf; not text-bptt). The descriptor, dims and vocabulary
 * must outlive the stream. */
typedef struct cavs_stream cavs_stream;
cavs_stream *cavs_stream_open(const char *path, const char *format, const cavs_desc *d, const long *dims,
                              cavs_vocab *v, int grow, char *err, size_t errlen);
int cavs_stream_count(const cavs_stream *st);
long cavs_stream_vertices(const cavs_stream *st);
/* graph i's vertices (-1 past the end), known without reading it */
int cavs_stream_graph_vertices(const cavs_stream *st, int i);
/* the largest value of an integer input (by slot) over the file, or -1 */
int cavs_stream_max_feature(const cavs_stream *st, int slot);
cavs_dataset *cavs_stream_read(cavs_stream *st, const int *which, int n, char *err, size_t errlen);
void cavs_stream_close(cavs_stream *st);
/* The index, to open the same file in another process without reading it through (the
 * ranks of a job: one indexes, the others read only their graphs): cavs_stream_index
 * returns the bytes it takes and writes them to buf when cap is enough;
 * cavs_stream_open_index opens path with such an index, checked (the file's size the
 * index's, every graph inside it, each slot's largest value a dim's) but not the file's bytes, which each read checks
 * against their hash as cavs_stream_read does. v must already hold the words of the
 * vocabulary that indexed the file, with the same ids. */
size_t cavs_stream_index(const cavs_stream *st, void *buf, size_t cap);
cavs_stream *cavs_stream_open_index(const char *path, const char *format, const cavs_desc *d, const long *dims,
                                    cavs_vocab *v, const void *index, size_t n, char *err, size_t errlen);

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
  /* the driver's schedule and selection (0 in checkpoints before format 3): which dev
     metric `best` is (1 accuracy, 2 root accuracy, 3 loss), the learning rate's decay
     and step, the warm-up, the patience and the epochs since the best (and its epoch) */
  int select;
  double lr_decay;
  int lr_step, warmup, patience, since_best, best_epoch;
  /* the learning-rate schedule (0 in checkpoints before format 4, which read as step
     when they have an lr_decay): enum cavs_schedule; cosine's and plateau's floor; the
     epochs cosine anneals over; plateau's factor and patience; and its state: the rate
     the next epoch runs at (before warm-up; 0: the base rate), its best dev metric (-1:
     none yet) and the epochs since it improved or the rate was cut */
  int schedule;
  double lr_min;
  int cosine_epochs;
  double plateau_factor;
  int plateau_patience;
  double lr_now, plateau_best;
  int plateau_bad;
  /* step: the epoch after which the first decay comes (0 in checkpoints before format
     6, and by default: lr_step) */
  int lr_decay_start;
  /* text-bptt with the state carried: the deviation of the chunk lengths cavs train
     draws each minibatch (--bptt-vary; 0, every chunk the format's length, in
     checkpoints before format 7 and by default) */
  double bptt_vary;
  /* text-bptt: how the chunks were read (0, not said, in checkpoints before format 9 and
     in a state that leaves it): CAVS_BPTT_CARRY, laid in streams with the state carried
     (--bptt-state carry, the default), or CAVS_BPTT_RESET, shuffled, each chunk from
     zeros. cavs eval reads a checkpoint's text-bptt data so unless told, and a resumed
     run goes on so. */
  int bptt_state;
} cavs_train_state;
enum { CAVS_BPTT_UNSAID = 0, CAVS_BPTT_CARRY = 1, CAVS_BPTT_RESET = 2 };
/* The schedules of a training run's rate by epoch e (1, 2, ...), base rate lr:
 * constant; step: lr * lr_decay^n, n = 0 up to epoch s = lr_decay_start (lr_step when
 * 0), then floor((e-1-s)/lr_step) + 1 (with s = lr_step: floor((e-1)/lr_step); Zaremba et
 * al.'s 4 epochs at the rate, then halved every epoch: s = 4, lr_step 1); cosine: lr_min + (lr - lr_min) *
 * (1 + cos(pi * min(e-1, T)/T)) / 2 over T = cosine_epochs (PyTorch's CosineAnnealingLR,
 * held at lr_min past T); plateau: the rate times plateau_factor (not below lr_min) after
 * more than plateau_patience epochs without a better dev metric (PyTorch's
 * ReduceLROnPlateau, threshold 0). cavs train applies them (cavs(1)); a checkpoint keeps
 * the settings and the state. */
enum cavs_schedule { CAVS_SCHED_CONSTANT, CAVS_SCHED_STEP, CAVS_SCHED_COSINE, CAVS_SCHED_PLATEAU, CAVS_SCHED_COUNT };

/* What a checkpoint may hold; anything beyond is refused as damaged. */
#define CAVS_MAX_CKPT_BYTES ((uint64_t)1 << 36)
#define CAVS_MAX_SOURCE_BYTES (64 << 20)
#define CAVS_MAX_SET 64 /* children a data file gives a vertex whose block takes them as a set */
#define CAVS_MAX_DIM (1L << 24) /* a dim's value, also the largest vocabulary */
#define CAVS_MAX_PARAMS 65536
#define CAVS_MAX_NAME 255
#define CAVS_MAX_CARRIED (1 << 20) /* rows of carried state: a minibatch's graphs */
#define CAVS_MAX_BPTT_VARY 1e6 /* cavs_train_state.bptt_vary, the most a checkpoint holds */
#define CAVS_MAX_GRAPH_VERTICES (1L << 30) /* also the most vertices in one minibatch */
/* Training counters, far below their types' ends so that going on from any checkpoint
 * cannot overflow them: the epochs of a run and its resumes together, and the
 * optimizer's steps (cavs_model_step fails past it; exact in a double). */
#define CAVS_MAX_EPOCHS (1 << 30)
#define CAVS_MAX_STEPS (1L << 53)
/* Names (models, dims, inputs, parameters) follow the .vf language's identifier rule:
 * [A-Za-z_][A-Za-z0-9_]*, at most CAVS_MAX_NAME bytes. 1 when s is one. */
int cavs_is_identifier(const char *s);

typedef struct cavs_ckpt cavs_ckpt;
int cavs_ckpt_save(const char *path, cavs_model *m, const char *source, const cavs_vocab *v,
                   const cavs_train_state *ts, char *err, size_t errlen);
/* cavs_ckpt_save with a record kept beside the state, one line of text that libcavs
 * stores and does not read. cavs train keeps there, at an epoch's end (graphs_done 0),
 * the line a training log holds for the epoch the state ends (its --log record, a JSON
 * object, where the log refused it), which a run resumed from the checkpoint writes into
 * a log that lacks it; inside an epoch (graphs_done above 0), that epoch's totals so far
 * (a JSON object), which the resumed run's line and record go on from. NULL: none. At
 * most CAVS_MAX_CKPT_RECORD bytes; saving refuses a longer one. */
#define CAVS_MAX_CKPT_RECORD (16 << 20)
int cavs_ckpt_save_record(const char *path, cavs_model *m, const char *source, const cavs_vocab *v,
                          const cavs_train_state *ts, const char *record, char *err, size_t errlen);
/* Reads a checkpoint whole into memory, checks its checksum and every field. */
cavs_ckpt *cavs_ckpt_read(const char *path, char *err, size_t errlen);
/* The same checks, without holding the parameters' values: the file is streamed once
 * for its checksum, its structure read, and each parameter's values read from it when
 * cavs_ckpt_apply or cavs_ckpt_apply_weights takes them, only the rows the model holds
 * (a process of expert parallelism: its own experts', cavs_model_set_expert_comm).
 * The file stays open until cavs_ckpt_free; an apply refuses it once it is not the
 * file whose checksum was taken (its size, modification or change time differ, or it
 * cannot be read: "changed since it was opened", the model's parameters then partly
 * applied). A file renamed over the path is not this one, and checkpoints are saved
 * so; a write in place that keeps the size within the file system's time step is not
 * seen. */
cavs_ckpt *cavs_ckpt_open(const char *path, char *err, size_t errlen);
void cavs_ckpt_free(cavs_ckpt *k);
const char *cavs_ckpt_model(const cavs_ckpt *k);   /* model name */
const char *cavs_ckpt_source(const cavs_ckpt *k);  /* the .vf text it was trained from */
const char *cavs_ckpt_hash(const cavs_ckpt *k);
int cavs_ckpt_precision(const cavs_ckpt *k);
/* dims by name: fills dims[] in the order of d's dims; -1 on a mismatch (message in err) */
int cavs_ckpt_dims(const cavs_ckpt *k, const cavs_desc *d, long *dims, char *err, size_t errlen);
const cavs_train_state *cavs_ckpt_state(const cavs_ckpt *k);
/* The record saved with it (cavs_ckpt_save_record; format 10 on), NULL when none: one
 * line of text, whose content is the file's, unchecked. */
const char *cavs_ckpt_record(const cavs_ckpt *k);
/* The dims as saved: their number, and each one's name and value. */
int cavs_ckpt_ndims(const cavs_ckpt *k);
const char *cavs_ckpt_dim_name(const cavs_ckpt *k, int i);
long cavs_ckpt_dim_value(const cavs_ckpt *k, int i);
/* The options' values as saved (format 5 on; a format 4 checkpoint has none): their
 * number, and option i's name, its value in *value (NULL past the end). */
int cavs_ckpt_noptions(const cavs_ckpt *k);
const char *cavs_ckpt_option(const cavs_ckpt *k, int i, double *value);
/* The carried state as saved (format 6 on; cavs_model_carry_state): its rows, one a
 * graph of the last minibatch (0: none), each of *width values (width may be NULL). */
int cavs_ckpt_carried(const cavs_ckpt *k, long *width);
long cavs_ckpt_param_count(const cavs_ckpt *k);
/* The optimizer's state saved: its blocks of moments (0 to 2, each a value for every
 * parameter value: cavs_model_reserve_optimizer says which kind keeps how many), and in
 * *steps (which may be NULL) the steps it has taken. */
int cavs_ckpt_moments(const cavs_ckpt *k, long *steps);
/* A new vocabulary with the checkpoint's words, in their ids; NULL with errno ENOMEM when
 * memory runs out, EINVAL when the words cannot keep their ids (one twice). */
cavs_vocab *cavs_ckpt_vocab(const cavs_ckpt *k);
/* Copies parameters and optimizer state into m after checking that they fit, and
 * freezes what was frozen when it was saved: what going on training needs. Both apply
 * the options as saved (cavs_model_set_option), which the caller may set again. */
int cavs_ckpt_apply(const cavs_ckpt *k, cavs_model *m, char *err, size_t errlen);
/* The parameters alone, after the same checks: no optimizer state (no memory for it),
 * nothing frozen. What evaluation and prediction need; it takes a checkpoint whatever
 * build of the model (merged products or not) saved it. */
int cavs_ckpt_apply_weights(const cavs_ckpt *k, cavs_model *m, char *err, size_t errlen);

/* Synthetic data, as ptb-tree lines: a toy treebank with a learnable signal, and
 * complete binary trees (the Tree-FC benchmark). */
int cavs_gen_toy(FILE *out, int ntrees, int maxleaves, int nwords, uint64_t seed);
int cavs_gen_complete(FILE *out, int ntrees, int leaves, int nwords, int nclass, uint64_t seed);
/* The toy treebank with nodes of 2 to maxarity children (at most CAVS_MAX_SET): a node
 * merges that many neighbouring phrases, a leading negator flipping the sum of the
 * others' polarities; for models that take children as a set (childsum.vf). */
int cavs_gen_nary(FILE *out, int ntrees, int maxleaves, int nwords, int maxarity, uint64_t seed);
/* Random trees (ptb-tree), or with dag, random DAGs in cgf with types leaf/internal. */
int cavs_gen_random(FILE *out, int ngraphs, int maxv, int nwords, int nclass, int dag, uint64_t seed);
/* Sentences of 10 to 60 words for dsl-examples/tagger.vf (cgf: fwd, bwd and tok
 * vertices; `word` on the first two, `label` on tok): each word has a fixed random key
 * in 0..nclass-1 and says, a third of the words each, whether its tag is its own key,
 * the word before's or the word after's (0 past either end); with `chars`, every word also
 * spelled as a chain of `chr` vertices (input `char`, 3 to 8 of 26 letters fixed per
 * word) that the fwd and bwd cells read in their slot `w`, as
 * dsl-examples/tagger_chars.vf takes them. */
int cavs_gen_tagger(FILE *out, int nsent, int nwords, int nclass, int chars, uint64_t seed);
/* Character lattices for dsl-examples/lattice_lstm.vf and lattice_gru.vf (cgf): 20 to 80
 * `chr` vertices in a chain (input `char`, one of nchars; `label`), and at each
 * position 0 to 3 words of 2, 3 or 4 letters starting there (`wrd`, input `word`: an id
 * below nwords hashed from its letters), each with the letter it starts at as its
 * child and a child of the letter it ends at; a letter's tag is a fixed random key
 * (below nclass) of the longest word ending at it, else of the letter itself. */
int cavs_gen_lattice(FILE *out, int ngraphs, int nchars, int nwords, int nclass, uint64_t seed);
/* Sentence pairs for dsl-examples/seq2seq.vf (cgf): a source of 10 to 50 words (`enc`
 * vertices in a chain, input `src` below nwords) and its translation, the source
 * backwards with each word through a fixed random map to 1..nwords (`dec` vertices in a
 * chain: the first takes the last `enc` in slot `start`, each takes every `enc` as its
 * set; `prev` the target word before, 0 at the start; `next` the target word). */
int cavs_gen_translation(FILE *out, int npairs, int nwords, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif

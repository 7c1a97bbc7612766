/* cavsc.h: the compiler's one internal header, one section per .c file, in pipeline
 * order (as chibicc.h and QBE's all.h). Nothing here is installed; the ABI that generated
 * code links against is runtime/cavs.h. */
#ifndef CAVSC_H
#define CAVSC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CAVSC_VERSION "0.2.0"

enum {
  CV_MAX_DIMS = 16,       /* dims a model may declare (a Lin holds one coefficient each) */
  CV_MAX_CHILDREN = 64,   /* largest `children N` */
  CV_MAX_OPTIONS = 16,    /* options a model may declare (cavs_abi.h's CAVS_MAX_OPTIONS) */
  CV_MAX_HOMES = 2,       /* homes a row's state is stored at (cavs_abi.h's CAVS_MAX_HOMES) */
  CV_MAX_NEST = 256,      /* expression / bracket nesting */
  CV_MAX_ERRORS = 20,     /* stop reporting after this many */
  CV_MAX_UNROLL = 65536,  /* iterations of one `for` */
  CV_MAX_UNROLLED = 1000000, /* iterations, statements and terms of all loops of one block */
  CV_MAX_NODES = 2000000, /* IR nodes of one function after unrolling */
};

/* ---- diag.c: source positions, diagnostics, arena ---- */

/* A span of source text: first and last character, 1-based, columns in bytes. */
typedef struct Loc {
  int line, col;
  int eline, ecol;
} Loc;

void diag_init(const char *path, const char *text, size_t len);
void error_at(Loc loc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void note_at(Loc loc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An error with no source position (missing file, unwritable output). */
void error_plain(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int diag_count(void);
const char *diag_span(Loc loc); /* source text of a short span, or NULL */
/* Silenced diagnostics are neither counted nor printed (sema's trial pass). */
void diag_silence(bool on);
extern bool cv_checking_user_ir; /* internal_error reports a user error while set */
_Noreturn void internal_error(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define unreachable() internal_error(__FILE__, __LINE__, "unreachable")
#define cv_assert(c)                                                                  \
  do {                                                                                \
    if (!(c)) internal_error(__FILE__, __LINE__, "assertion '%s' failed", #c);        \
  } while (0)

/* "cavsc: out of memory", status 2 */
_Noreturn void out_of_memory(void);
/* malloc, calloc and realloc, or out_of_memory: the passes' own blocks, freed by them */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
void *arena_alloc(size_t n); /* zeroed; freed at exit */
char *arena_strdup(const char *s);
char *arena_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Grow a vector of `*cap` elements of `elem` bytes to hold at least `need`. */
void *vec_grow(void *v, int *cap, int need, size_t elem);

/* ---- ast.c: the tree the parser builds ---- */

typedef enum {
  N_NUM,     /* number literal: num, is_int */
  N_NAME,    /* identifier: name */
  N_DIMTERM, /* `2H`: ival (coefficient), name */
  N_BINARY,  /* a op b: op is one of + - * / @ */
  N_NEG,     /* -a */
  N_CALL,    /* name(args) */
  N_SUMFOR,  /* sum(var in a..b : body): name=var, a, b, c=body */
  N_SLICE,   /* a[b:c] */
  N_INDEX,   /* a[b] */
  N_PULL,    /* pull() or pull(name) */
} NodeKind;

typedef struct Node Node;
struct Node {
  NodeKind kind;
  Loc loc;
  int op;
  const char *name;
  double num;
  long ival;
  bool is_int;
  Node *a, *b, *c;
  Node **args;
  int nargs, capargs;
  int depth; /* height of this subtree, bounded by CV_MAX_NEST */
};

typedef enum { S_ASSIGN, S_SCATTER, S_PUSH, S_LOSS, S_FOR } StmtKind;

typedef struct Stmt Stmt;
struct Stmt {
  StmtKind kind;
  Loc loc;
  const char *name; /* S_ASSIGN target, S_LOSS function, S_FOR variable */
  Loc name_loc;
  Node *expr, *expr2; /* S_FOR: range bounds */
  Node **args;        /* S_LOSS */
  int nargs;
  Stmt *body; /* S_FOR */
  Stmt *next;
};

typedef enum { D_MODEL, D_DIM, D_OPTION, D_INPUT, D_PARAM, D_PULL, D_VERTEX, D_PUSH } DeclKind;

typedef struct ParamItem ParamItem;
struct ParamItem {
  const char *name;
  Loc loc;
  Node *d0, *d1; /* d1 == NULL for a vector */
  Node *value;   /* `= NUMBER`, or NULL */
  ParamItem *next;
};

/* A named child slot of a vertex block: `children fwd: fcell, bwd: bcell` */
typedef struct Slot Slot;
struct Slot {
  const char *name, *type;
  Loc loc, type_loc;
  Slot *next;
};

typedef struct Decl Decl;
struct Decl {
  DeclKind kind;
  Loc loc;
  const char *name; /* model, dim, input, vertex name; push argument */
  Loc name_loc;
  Node *value;       /* D_DIM, D_OPTION default, D_INPUT shape `kind[dim]`, D_VERTEX children */
  Slot *slots;       /* D_VERTEX with named, typed children (value is then NULL) */
  bool star;         /* D_VERTEX `children *` or `children a: T, *`: the rest of its
                        children as a set (value NULL) */
  const char *star_type; /* `*: TYPE`, or NULL */
  Loc star_type_loc;
  ParamItem *items;  /* D_PARAM */
  Node *init;        /* D_PARAM trailing `init X` */
  Stmt *body;        /* blocks */
  Decl *next;
};

Node *ast_node(NodeKind kind, Loc loc);
Node *ast_binary(int op, Node *a, Node *b, Loc loc);
Node *ast_unary(NodeKind kind, Node *a, Loc loc);
void ast_push_arg(Node *call, Node *arg);
Stmt *ast_stmt(StmtKind kind, Loc loc);
Decl *ast_decl(DeclKind kind, Loc loc);
void ast_dump(FILE *out, const Decl *decls);
void ast_dump_expr(FILE *out, const Node *n);

/* ---- parse (lexer.l, parser.y) ---- */

/* Parses the whole buffer; returns the declarations in source order. Errors go through
 * error_at(); the caller checks diag_count(). */
Decl *parse_source(const char *path, const char *text, size_t len);

/* ---- ir.c: the typed IR ---- */

typedef enum {
#define X(id, sp, ar, kind, zero, fold, f, da, db) OP_##id,
#include "ops.def"
#undef X
  OP_COUNT
} Op;

typedef enum {
  OK_LEAF,    /* constant, parameter or input reference */
  OK_PULL,    /* value of the pull block at this vertex */
  OK_GATHER,  /* row scattered by child k */
  OK_PUSHARG, /* the push block's argument */
  OK_EW,      /* elementwise over a row, with broadcasting of vectors and scalars */
  OK_GEMM,    /* row @ param matrix */
  OK_LOOKUP,  /* row of a param matrix chosen by an index input */
  OK_CONCAT,
  OK_SLICE,
  OK_SINK, /* scatter, push */
  OK_LOSS,
  OK_DROP, /* dropout(x, p): x times a random mask / (1 - p) in training, x otherwise;
              noise(x): x times standard normal draws in training, 0 otherwise */
  OK_RMAT, /* products with a matrix per vertex, a row [A * B] read as [A, B] (a product
              dim's width): mv(x, M), row [A] times M -> [B]; mm(M, W), M times a
              param [B, C] -> [A, C] */
  OK_EDGE, /* children as a set (`children *`): echild, the child's state row per edge;
              ebcast, a vertex's row copied to each of its edges; esum, the sum over a
              vertex's edges (`sum(s in children: e)`) */
  OK_MOE,  /* a mixture of experts, moe(e in top(g, K): body): topk, the gate's top K
              softmax-renormalized (zeros elsewhere), which routes each row to K slots
              grouped by expert; sbcast, a row copied to its slots; emm, a slot row times
              its expert's matrix (a param table [X, A * B], row e the [A, B] matrix of
              expert e); erow, its expert's row of a param table [X, B]; scomb, each
              row's slots weighted by the gate and summed */
} OpKind;

/* Where an op's output is known to be zero. */
typedef enum {
  ZERO_NONE, /* nowhere */
  ZERO_LEAF, /* at the vertices without children */
  ZERO_A,    /* where operand a is */
  ZERO_ANY,  /* where any operand is */
  ZERO_ALL,  /* where every operand is */
} OpZero;

typedef struct OpInfo {
  const char *name;
  int arity;
  OpKind kind;
  OpZero zero;
  const char *fwd, *da, *db;
} OpInfo;
extern const OpInfo op_info[OP_COUNT];

/* A width: k + sum_i c[i] * dim_i, with every coefficient a non-negative integer. */
typedef struct Lin {
  int32_t k;
  int32_t c[CV_MAX_DIMS];
} Lin;

typedef enum {
  T_NONE,   /* statements (scatter, push, loss) */
  T_ROW,    /* one row of `width` per vertex */
  T_SCALAR, /* a constant */
  T_PARAM,  /* reference to a parameter */
  T_INPUT,  /* reference to an input */
} Type;

/* Where a value (or its gradient) lives, decided by plan.c: row r of it starts at
 * base[buf] + r * ld + off. */
typedef enum { PL_NONE, PL_ROW, PL_PARAM, PL_INPUT, PL_REG, PL_HOME } PlaceKind;
typedef struct Place {
  PlaceKind kind; /* PL_ROW: per-row buffer; PL_PARAM: param group; PL_INPUT: real input;
                     PL_REG: lives only inside its fused loop; PL_HOME (emit.c alone): a
                     row's state where a parent gathers it, buf its home k: row r at
                     cavs_ctx.home_val[k][r] + off (home_grad: its gradient) */
  int buf;
  Lin off, ld;
} Place;

typedef enum { CLS_EAGER, CLS_PATH, CLS_LAZY } Class;

typedef struct IrNode {
  Op op;
  Type type;
  Lin width;     /* T_ROW */
  int nargs;
  int *args;     /* node indices within the same function, all smaller than this one */
  double cval;   /* OP_CONST */
  int ref;       /* OP_PARAM, OP_INPUT: index; OP_GATHER: child; OP_PULL: pull slot;
                    OP_TOPK: K, the experts each row is routed to;
                    OP_CONST: 1 + the option whose run-time value it is (dropout's p
                    naming one; cval its default), 0 for a literal */
  bool edge;     /* one row per edge (a child of a `children *` vertex), not per vertex:
                    echild, ebcast and what is computed from them (not esum) */
  bool slot;     /* one row per routed slot (K per row) of the function's mixture of
                    experts: sbcast, emm, erow and what reads a slot value (not scomb) */
  Lin lo, hi;    /* OP_SLICE */
  const char *name; /* the .vf name bound to it, if any */
  Loc loc;
  /* filled by the passes after sema */
  Class cls;     /* classify.c */
  bool dep_gather, feeds_scatter;
  bool grad;     /* autodiff.c: a gradient flows to this node */
  int uses;      /* number of operand slots that read it */
  int group;     /* fuse.c: elementwise group, or -1 */
  int mm;        /* fuse.c: merged matrix product this MATMUL belongs to, or -1 */
  /* fuse.c, vertex functions: zero at every vertex without children (its value there is
     0 whatever the parameters), and dead there (its value there, finite, changes
     nothing the vertex scatters or pushes, and its gradient there is 0) */
  bool zero_leaf, dead_leaf;
  int unit;      /* plan.c: the execution unit that computes it */
  Place val, dval; /* plan.c */
  /* plan.c: a fused group's member that its backward loop needs and that costs more to
     compute again than to load (a sigmoid, tanh, exp or log): the forward loop keeps it
     in a buffer of its own */
  bool keep;
  Place kval;
  /* plan.c: a product whose every use is in one fused group, so that group's backward
     loop is the only writer of its gradient: it sets it (=) rather than add to it */
  bool grad_set;
  /* plan.c: a product (a MATMUL alone, or a merge's first member for the merge) whose
     dx is the first write to its left operand's gradient (every member's, stacked),
     over every row that gradient is read at, in a buffer the backward pass then need
     not clear: it sets it (CAVS_PROD_DX_SET, beta 0) and what comes after adds */
  bool dx_set;
  /* plan.c: a product (MATMUL, EMM) whose one use is an add `z = a + b` of a fused group
     whose other operand `accum_into` is a value of the same rows nothing else reads, on
     a buffer of its own, computed in an earlier phase or unit: the product adds into
     that value's place (beta = 1) instead of a buffer of its own, the group reads z
     there alone (one row, not two), and its gradient, the same as the other operand's,
     is that one's (one store backward, not two). The Tree-LSTM's hs @ [Ui|Uo|Uu] into
     x @ [Wi|Wo|Wu]; an expert's product into its bias row (emm into erow). */
  bool accum;
  int accum_into;
  /* plan.c: such an add `z = a + b` that is its fused group's only member, whose value
     would be a copy of a's place (where b has added into a): z is a view of that place
     instead, its group runs no loop either way, and its gradient is a's and b's (the
     gradient its readers write is the one the product and a's op read). The tail of a
     mixture's expert `... @ W2[e] + b2[e]`, a copy of every slot forward and back.
     `folded`: that a, whose place and gradient are z's. */
  bool same, folded;
  /* plan.c: a `same` node's place is node `view`'s (an add's: the value its product adds
     into; an activation's: see act) */
  int view;
  /* plan.c: an expert's product (EMM) whose value (with its bias row, where it adds into
     one) is read only by an activation (relu, tanh, sigmoid; its op here, else 0) that
     is alone in its fused group (but for that add) and is itself read only as the left
     operand of another expert's product: the product applies the activation as it
     stores (cavs_emm_fwd's act), the activation and the add are views of its place
     (same, folded: no loop either way), and the product that reads the activation's
     output multiplies the gradient it computes by the activation's derivative, written
     in that output (cavs_emm_bwd's dx_act), into that same place's gradient: the
     gradient of the product's value. A mixture's `relu(h @ W1[e] + b1[e]) @ W2[e]`:
     a pass over the slots forward and one backward fewer, and on cuda a launch each. */
  Op act;
} IrNode;

/* A fused elementwise group: one loop. Members in topological order. */
typedef struct Group {
  int *members;
  int n;
  Lin width;
  Class cls;
} Group;

/* Matrix products merged into one: with one left operand, against adjacent parameter
 * columns (stack 0); or, stacked, one parameter against the same columns of each child's
 * gathered row (member k reads gather(k); plan.c puts the gathers side by side in one
 * buffer, and the outputs too, so that the children's rows, interleaved, are one
 * matrix of stack * n rows: the Tree-LSTM's [h_0; h_1] @ Uf). */
typedef struct MatMerge {
  int left;     /* node of the shared left operand (stacked: member 0's) */
  int *members; /* MATMUL nodes, in column order (stacked: by child) */
  int n;
  Lin cols;     /* total (stacked: one member's) */
  Class cls;
  int stack;    /* stacked: the number of children (= n); else 0 */
} MatMerge;

/* One step of a function's schedule: an elementwise group, a merged product, or a
 * single node with its own code. */
typedef enum { U_GROUP, U_MATMUL, U_NODE } UnitKind;
typedef struct Unit {
  UnitKind kind;
  int index; /* group, merge or node */
  Class cls;
} Unit;

typedef enum { F_PULL, F_VERTEX, F_PUSH } FuncKind;

typedef struct IrFunc {
  FuncKind kind;
  const char *name;
  int children; /* F_VERTEX */
  bool edges;    /* F_VERTEX `children *`: any number of children past the `children`
                    named slots, read as a set through sum(s in children: ...) */
  int edge_type; /* edges, Model.typed: the vertex type of every child; else -1 */
  /* F_VERTEX with named slots (Model.typed): slot k's name and the vertex type of the
     child it holds; NULL otherwise */
  const char **slot_name;
  int *slot_type;
  bool scatters;  /* F_VERTEX: it calls scatter() (always, unless Model.typed) */
  Lin state;      /* F_VERTEX, Model.typed: the width it scatters */
  int state_buf;  /* plan.c: the buffer its scatter writes */
  IrNode *nodes;
  int n, cap;
  Loc loc;
  int index;    /* vertex type index (F_VERTEX) */
  Group *groups;
  int ngroups;
  MatMerge *merges;
  int nmerges;
  Unit *units;  /* in execution order */
  int nunits;
  bool pushes;
  /* a mixture of experts (at most one per function): the OP_TOPK node that routes, or
     -1; K; and the model-wide index of its routing (the runtime's arrays of it) */
  int route, route_k, route_id;
} IrFunc;

/* DIM_PRODUCT: `dim HH = H * H;`, the product of two earlier dims (neither a vocab): the
 * width of a per-vertex matrix [H, H] (mv, mm), while every width stays a linear form. */
typedef enum { DIM_FIXED, DIM_VOCAB, DIM_FREE, DIM_PRODUCT } DimKind;
typedef struct Dim {
  const char *name;
  DimKind kind;
  long value; /* DIM_FIXED default; DIM_PRODUCT: the default product, or 0 */
  int input;  /* DIM_VOCAB: the index input */
  int fa, fb; /* DIM_PRODUCT: the factors, earlier dims */
  Loc loc;
} Dim;

/* `option NAME = NUMBER;`: a value the runtime holds and the user may set (cavs train
 * --dropout, cavs_model_set_option), not part of the model's identity beyond its
 * default: a dropout probability, in [0, 1); or, the option named `clip`, the model's
 * default gradient-norm clip for training (cavs train without --clip), 0 or more; or,
 * the option named `balance`, the weight of a mixture of experts' load-balancing loss
 * (top(g, K, balance)), 0 or more
 * (cavs_abi.h's kinds, in the same order) */
typedef enum { OPT_DROPOUT, OPT_CLIP, OPT_BALANCE } OptionKind;
#define CV_MAX_CLIP 1e30
typedef struct Option {
  const char *name;
  OptionKind kind; /* option_kind(name) */
  double value;    /* the default */
  Loc loc;
} Option;
OptionKind option_kind(const char *name);
/* NULL, or what is wrong with `v` as the default of an option of kind k */
const char *option_value_error(OptionKind k, double v);

typedef enum { IN_INDEX, IN_CLASS, IN_REAL } InputKind;
typedef struct Input {
  const char *name;
  InputKind kind;
  Lin width; /* IN_REAL: row width; otherwise the range (a single dim) */
  int dim;   /* IN_INDEX, IN_CLASS: the dim bounding the value */
  Loc loc;
} Input;

/* identity(S, STD): S on the diagonal plus normal(0, STD) noise; INIT_IDENTITY for a
 * square matrix, INIT_IDENTITY_ROWS for a table whose every row is a square matrix (its
 * columns a product dim A * A: MV-RNN's word matrices). */
/* INIT_XAVIER_ROWS: xavier in each row of a table [X, A * B] read as a matrix [A, B] (a
 * mixture of experts' table of matrices: sema makes a table xavier so once emm reads it) */
typedef enum { INIT_ZEROS, INIT_CONSTANT, INIT_UNIFORM, INIT_NORMAL, INIT_XAVIER, INIT_IDENTITY, INIT_IDENTITY_ROWS, INIT_XAVIER_ROWS } InitKind;
typedef struct Param {
  const char *name;
  int rank; /* 1 (vector) or 2 (matrix) */
  Lin rows, cols; /* rank 1: cols only */
  InitKind init;
  double a, b;
  Loc loc;
  int pgroup;  /* plan.c: the storage block it lives in */
  Lin col_off; /* its first column there */
} Param;

/* Parameter storage: params merged by fuse.c sit side by side in one row-major block. */
typedef struct PGroup {
  Lin rows, cols;
} PGroup;

/* A per-row buffer: [rows of the minibatch, width]. */
typedef struct Buf {
  const char *name;
  Lin width;
  int vertex; /* the vertex type whose function made it (only its rows hold values), -2
                 (the push block's: the rows of the types that push), or -1 */
  bool edge;  /* one row per edge, not per vertex */
  bool pull;  /* the pull block's (vertex -1): values at the rows of the types that read it
                 alone, which the descriptor says as vertex -3 (cavs_buf_desc) */
  bool slot;  /* the K slots of a mixture of experts side by side in each row (plan.c) */
  bool grad;
  bool grad_whole; /* its gradient is written whole by the backward pass, each cell set
                      before anything adds to it: not cleared (plan.c) */
} Buf;

typedef struct PullSlot {
  const char *name;
  int node; /* in the pull function */
} PullSlot;

typedef struct Model {
  const char *name;
  const char *path;
  Dim dims[CV_MAX_DIMS];
  int ndims;
  Option options[CV_MAX_OPTIONS];
  int noptions;
  Input *inputs;
  int ninputs, capinputs;
  Param *params;
  int nparams, capparams;
  IrFunc *pull;  /* NULL without a pull block */
  IrFunc **vertex;
  int nvertex;
  IrFunc *push;  /* NULL without a push block */
  PullSlot *pulls;
  int npulls, cappulls;
  Lin state;     /* width every vertex function scatters (not Model.typed) */
  bool typed;    /* the vertex blocks name their children's types (`children a: T`):
                    each type scatters a width of its own into a buffer of its own, and
                    gather(a) reads T's; else one state that every block scatters */
  Lin pushed;    /* width every push() hands over */
  /* plan.c */
  PGroup *pgroups;
  int npgroups, cappgroups;
  Buf *bufs;
  int nbufs, capbufs;
  /* ablations (cavsc --no-fuse, --no-merge, --no-homes): every elementwise node a loop
     of its own; no products merged or stacked; no cell stores its state at its home */
  bool no_fuse, no_merge, no_homes, no_push_view;
  int state_buf, push_buf;
  Lin push_off; /* the pushed rows' columns in push_buf: nonzero where the push block reads
                   the state in place (plan.c: plan_push_place) */
  int *pull_buf; /* per pull slot: the buffer holding it */
} Model;

IrFunc *ir_func(FuncKind kind, const char *name, Loc loc);
/* IrFunc.route_id: the functions with a mixture of experts, numbered in execution order */
void ir_number_routes(Model *m);
bool ir_is_ident(const char *s); /* [A-Za-z_][A-Za-z0-9_]* */
int ir_add(IrFunc *f, IrNode node); /* returns the new node's index */
/* The width of child k's state as f gathers it, and of what f scatters. */
Lin ir_child_width(const Model *m, const IrFunc *f, int k);
Lin ir_state_width(const Model *m, const IrFunc *f);
/* The product dim (`dim HH = H * H`) that width w is exactly, or -1. */
int ir_product_dim(const Model *m, Lin w);
/* The shape of a per-vertex matrix product (mv, mm): its matrix operand is [A, B];
 * mm's parameter [B, C] (C is 0 for mv). */
void ir_rmat_shape(const Model *m, const IrFunc *f, const IrNode *n, Lin *A, Lin *B, Lin *C);
Lin lin_const(long k);
Lin lin_dim(int dim, long coef);
Lin lin_add(Lin a, Lin b);
/* a times k, 0 < k <= CV_MAX_CHILDREN (widths are at most 2^24 of a dim: no overflow) */
Lin lin_scale(Lin a, int k);
bool lin_eq(Lin a, Lin b);
bool lin_le(Lin a, Lin b); /* a <= b for every positive binding of the dims */
bool lin_is_zero(Lin a);
bool lin_is_const(Lin a); /* no dim in it */
Lin lin_sub(Lin a, Lin b); /* may have negative coefficients; check with lin_le first */
/* Writes `2H+E` style text into buf. */
const char *lin_str(const Model *m, Lin a, char *buf, size_t size);
void ir_check(const Model *m);
/* The model's functions in execution order: pull, vertex blocks, push. */
IrFunc **model_funcs(const Model *m, int *n);
/* A use of a parameter: operand `arg` of live node `user` in function f. */
typedef struct ParamUse {
  const IrFunc *f;
  const IrNode *user;
  int arg;
  int param;
} ParamUse;
/* Every use of a parameter in the model, how many in *n; the caller frees the array. */
ParamUse *param_uses(const Model *m, int *n);
void ir_print(FILE *out, const Model *m);

/* ---- ir_read.c: the text of ir_print, read back ---- */

Model *ir_read(const char *path, const char *text, size_t len);

/* ---- sema.c: names, shapes, unrolling; builds the IR ---- */

Model *sema(Decl *decls, const char *path);

/* ---- the passes after sema, in pipeline order ---- */

void autodiff(Model *m);  /* which nodes receive a gradient (the rules are in ops.def) */
void classify(Model *m);  /* eager | path | lazy for every node */
void fuse(Model *m);      /* elementwise groups (union-find), merged matrix products */
void plan(Model *m);      /* buffers, placements, units in execution order */
/* plan.c: is concat node x made of values computed in place (each operand in x's buffer
   at its own columns)? Does nothing read or write buffer b of vertex function f at a row
   without children (an `inner` buffer: its comment says when)? */
bool concat_in_place(const IrFunc *f, const IrNode *x);
bool leaves_untouched(const IrFunc *f, int b);
/* Does a derivative rule of ops.def mention the variable `v` ('a', 'b', 'y', 'g') as a
 * whole word? */
bool rule_uses(const char *rule, char v);
/* need[x] = true for each member x of fused group gi whose value a derivative rule of
 * the group reads (its own, through y, or its user's, through a or b) */
void rule_needs(const IrFunc *f, int gi, bool *need);
void report(FILE *out, const Model *m); /* `cavsc --report` */
void ad_print(FILE *out, const Model *m); /* `cavsc --dump=ad` */
const char *cls_name(Class c);

/* Substitutes the operand texts for g, y, a and b in a rule or body of ops.def. */
const char *ad_rule(const char *rule, const char *g, const char *y, const char *a, const char *b);

/* ---- emit.c: the emitter every target shares; emit_c.c, emit_cuda.c: the targets ---- */

typedef enum { PREC_FLOAT, PREC_DOUBLE } Precision;
typedef struct EmitOpts {
  Precision prec;
  const char *cmdline;
  const char *header_cmdline; /* MODEL.h's, without --target (the header is the same for
                                 every target); NULL: cmdline */
  const char *source_name;    /* as given on the command line */
  bool from_ir;               /* the input was IR (--dump=ir's), not a .vf file */
} EmitOpts;

typedef struct Target Target;

/* A dropout whose readers read its input where it is whenever it keeps every value (p
 * 0, or inference), so that it copies nothing then (emit.c, drop_aliases): per buffer,
 * the input's place; src -1 where none. */
typedef struct DropAlias {
  int src;  /* the input's buffer */
  Lin off;  /* its columns there */
  int opt;  /* the option that is the probability, or -1: the literal p */
  double p;
} DropAlias;

/* The emitter while it writes one model: what a target's hooks are handed. */
typedef struct Emit {
  const Model *m;
  const EmitOpts *o;
  const Target *t;
  FILE *out;   /* the source file, or where a target's hooks send the text for now */
  void *state; /* a target's own, from its prologue on */
  /* while a backward stage is written: marks[g] = 1 for each parameter block g whose
     gradient it names (emit_ptr sets them); NULL otherwise */
  unsigned char *pg_marks;
  /* and the marks of that stage alone (the descriptor's bwd_grads, pull_grads,
     push_grads): [nvertex][3] and the pull and push blocks', each [npgroups + 1] */
  unsigned char *pg_stage, **bwd_grads, *pull_grads, *push_grads;
  /* [nvertex]: 1 where the vertex type's backward eager stage names no parameter
     gradient that a backward path, lazy, pull or push stage names (emit() finds it) */
  unsigned char *eager_apart;
  /* [nvertex]: how many homes the type's fused loops store its whole state at (and
     read the gradients of) besides the row (emit.c, state_homes): 0 to CV_MAX_HOMES */
  unsigned char *homes;
  /* [nbufs]: the dropouts read in place (DropAlias); no_alias while a dropout's own
     call is written, which names both buffers as they are */
  DropAlias *alias;
  bool no_alias;
  /* the header's CAVS_MODEL_M_STAMP, which the code checks (emit_c_header) */
  unsigned long long stamp;
} Emit;

/* A stage whose text is held in memory until it closes, so that the functions it calls
 * (a C loop, a CUDA kernel), written straight to the file meanwhile, come first. */
typedef struct HeldFn {
  FILE *file; /* MODEL.c or MODEL.cu */
  FILE *fn;   /* the stage being written */
  char *text;
  size_t len;
  const char *name;
} HeldFn;
/* A stream into memory, *text (NUL-terminated, *len bytes) as written, once flushed or
 * closed; emit_unhold closes it, or ends the run with out_of_memory where a write failed
 * (not open_memstream, whose failed growth glibc lets by: the bytes dropped, no error
 * seen, and a failing fclose leaves no text at all: cavsc wrote a model with a hole, or
 * crashed, and exited 0) */
FILE *emit_hold(char **text, size_t *len);
void emit_unhold(FILE *f);
/* e->out becomes the held stage `name`; then the stage, closed, goes to the file */
void emit_hold_fn(Emit *e, HeldFn *h, const char *name);
void emit_release_fn(Emit *e, HeldFn *h);

/* A value, or its gradient, where plan.c placed it. */
typedef struct Ref {
  const Place *p;
  bool grad;
} Ref;

/* A pointer a fused loop sets for each row: `name[j]` is column j of the row. */
typedef struct LoopPtr {
  const char *name; /* a<N> read, d<N> gradient added to, o<N> written, g<N>_in gradient read,
                       h<N> written at home, hg<N> gradient read at home (h<N>_2,
                       hg<N>_2 at the second home) */
  bool write;
  Ref at;
} LoopPtr;

/* A fused group's loop over the rows r0..r0+n-1 and the group's columns. emit.c writes
 * its body between loop_open and loop_close, in C that a CUDA kernel can hold too: it
 * uses `R`, the cv_* functions, the column `j`, and `name[j]` of each pointer, set by
 * loop_open to the row being computed. */
typedef struct Loop {
  const IrFunc *f;
  int group;
  bool bwd;
  /* its rows: all of the stage's (LOOP_ALL), or, where the group is simpler at the
     vertices without children (some of what it reads or computes is zero or dead
     there: fuse.c), the stage's first c->leaf_rows (LOOP_LEAVES, a loop of its own
     without those) and the rest (LOOP_INNER) */
  int part;
  Lin width;      /* columns */
  bool may_alias; /* two gradient regions it adds to may overlap */
  LoopPtr *ptrs;  /* in the order to declare them */
  int nptrs;
  /* a forward loop in two stages (emit.c, fwd_stages; the C target alone): the body
     given is the first stage's, `second` the second's, each a column loop of its own
     in training, and `unsplit` the whole, the one loop of inference; NULL otherwise */
  char *second, *unsplit;
} Loop;

enum { LOOP_ALL, LOOP_LEAVES, LOOP_INNER };
/* The first row and the row count of a loop's part, as C expressions in r0, n and c. */
const char *loop_r0(const Loop *l);
const char *loop_n(const Loop *l);
/* The suffix of a part's function or kernel name: "_leaves" for LOOP_LEAVES. */
const char *loop_suffix(const Loop *l);
/* Is every cell the loop writes its row's alone: no two gradients it adds to may
   overlap, and it writes only per-row buffers' rows and homes (not a vector
   parameter's gradient, to which every row adds its share)? Then the C target's loop
   is split over threads by rows (CAVS_LOOP_ROWS). */
bool loop_rows_apart(const Loop *l);

/* The rows a product skips: none, the rows without children (the left operand is zero
 * there, or the product is dead there), the rows whose index input is -1 (a lookup of
 * no word), or both. */
typedef enum { ROWS_ALL, ROWS_WITH_CHILDREN, ROWS_WITH_INDEX, ROWS_WITH_INDEX_AND_CHILDREN } ProdRows;

/* A matrix product over the rows r0..r0+n-1, in the runtime's three forms:
 * 0: y = x W; 1: y += x W^T; 2: W += x^T y (summed over the rows). W is [k, cols]. */
typedef struct GemmCall {
  int form; /* 0: y = x W, 1: dx += dy W^T, 2: dW += x^T dy, 3: y = x W at the rows with
               children only (the others are read by nothing: left as they are), 4: y +=
               x W (the rows skipped left as they are: IrNode.accum), 5: dx = dy W^T
               (IrNode.dx_set), 6: 0 with the rows without a word left open for a 7,
               7: 4 that sets those rows (by `index`, the word's slot; emit.c's
               open_closer) */
  ProdRows rows;
  int index; /* ROWS_WITH_INDEX(_AND_CHILDREN): the integer input's slot */
  int stack; /* rows per vertex: a stacked product (MatMerge) over every child's row; 1 */
  Lin cols, k;
  Ref x, w, y;
  /* ROWS_WITH_INDEX(_AND_CHILDREN), every form but 4: the parameter table x's rows are
     looked up in (x = table[index], pulled as it is, or through a dropout) and its rows,
     or NULL; table_if, the C test under which x's rows are the table's ("1": always; a
     dropout's: where it keeps every value). The runtime may then multiply each distinct
     row once (training), or look up rows of table W (inference): cavs_gemm_table */
  const Place *table;
  Lin table_rows;
  const char *table_if;
  /* kids > 0: x is the gathered rows of child slots 0 .. kids-1 side by side, kid_k
     columns each, and a child of vertex type kid_type holds the row of `table` at its
     integer input kid_input as its state (emit.c, kid_table): cavs_gemm_kids */
  int kids, kid_type, kid_input;
  Lin kid_k;
} GemmCall;

/* A loss over the rows r0..r0+n-1, or its gradient (bwd: into a's gradient). */
typedef struct LossCall {
  Op op;          /* OP_XENT, OP_MSE */
  int index;      /* among the model's losses */
  const Place *a; /* the prediction */
  const Place *t; /* a row of targets, or NULL */
  int label;      /* the class input's slot, or -1 */
  Lin width;
  bool bwd;
} LossCall;

/* How one kind of output is written, as QBE's Target: emit.c decides what is computed,
 * in which order and with which comments; a target's hooks only write it. A target is
 * one file of hooks and one row in emit.c's table. */
struct Target {
  const char *name; /* --target=NAME */
  const char *ext;  /* of the source file: MODEL.ext */
  const char *abi;  /* its name in the descriptor (enum cavs_target of cavs_abi.h) */
  void (*header)(Emit *e, FILE *h); /* the whole MODEL.h */
  void (*prologue)(Emit *e);        /* the source file up to its first function */
  void (*fn_open)(Emit *e, const char *name, const char *what); /* a block's stage */
  void (*fn_close)(Emit *e);
  void (*loop_open)(Emit *e, const Loop *l);
  void (*loop_close)(Emit *e, const Loop *l);
  void (*gemm)(Emit *e, const GemmCall *g);
  /* child `child`'s state (a row of buffer `src`) into `state`; bwd: the gradient
     added back to it */
  void (*gather)(Emit *e, int child, int src, Ref state, bool bwd);
  /* rows of `table` chosen by the integer input in slot `index`; bwd: gradient rows added */
  void (*lookup)(Emit *e, Ref table, int index, Ref out, Lin width, bool bwd);
  void (*copy)(Emit *e, Ref to, Ref from, Lin width, bool add); /* `width` columns of each row */
  void (*loss)(Emit *e, const LossCall *l);
};
extern const Target target_c, target_cuda;
/* Hooks of the C target that the CUDA target shares: the header, the prologue (banner,
 * includes, R and the cv_* functions) and the calls into libcavs. */
void emit_c_header(Emit *e, FILE *h);
void emit_c_prologue(Emit *e);
void emit_c_gemm(Emit *e, const GemmCall *g);
void emit_c_gather(Emit *e, int child, int src, Ref state, bool bwd);
void emit_c_lookup(Emit *e, Ref table, int index, Ref out, Lin width, bool bwd);
void emit_c_copy(Emit *e, Ref to, Ref from, Lin width, bool add);
void emit_c_loss(Emit *e, const LossCall *l);
const Target *target_find(const char *name); /* NULL when there is none of that name */
const char *target_names(void);              /* "c, ...", for messages */

/* For the hooks: a width as an expression in the dims' values D_<dim>; a pointer to row
 * `row` of a place, into V, G (row buffers and their gradients), P, PG (parameter blocks
 * and theirs) or c->rin (real inputs), which fn_open binds; a place's leading dimension;
 * a file's banner comment (source and command, "do not edit"). */
const char *emit_lin(const Model *m, Lin l);
const char *emit_ptr(const Emit *e, Ref r, const char *row);
const char *emit_ld(const Emit *e, const Place *p);
void emit_banner(const Emit *e, FILE *o, const char *file);
/* Any bytes as a C string literal (quotes included) or as text safe inside a comment. */
const char *emit_c_string(const char *s);
const char *emit_c_string_n(const char *s, size_t n);
const char *emit_c_comment(const char *s);
/* Writes the header and the source of target t into memory streams. */
void emit(const Model *m, const Target *t, const EmitOpts *o, FILE *h, FILE *src);

#endif

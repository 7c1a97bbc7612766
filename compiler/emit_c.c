/* emit_c.c: the C target, MODEL.h and MODEL.c: readable C that links against libcavs.
 *
 * Only how things are written in C: the header, the source's banner and includes, a
 * stage as `static void MODEL_BLOCK_STAGE(cavs_ctx *c, int r0, int n)`, a fused group as
 * a `for` over the rows with a CAVS_IVDEP `for` over the columns inside, and each product,
 * gather, lookup, copy and loss as a call into libcavs. What is computed, in which order,
 * is emit.c's. The CUDA target (emit_cuda.c) shares the header, the prologue and the
 * calls. */
#include "cavsc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* An enum of named indices in the header; none for an empty list (C has no empty
 * enum: a model without dims or inputs is valid). */
static void header_enum(FILE *h, const char *M, const char *what, const char *kind, const char **names, int n) {
  if (!n) return;
  fprintf(h, "enum { /* %s */\n", what);
  for (int i = 0; i < n; i++) fprintf(h, "  %s_%s_%s = %d,\n", M, kind, names[i], i);
  fprintf(h, "};\n");
}

/* The header's declarations are held in memory and hashed (FNV-1a 64) into
 * CAVS_MODEL_M_STAMP, which the code checks when it is compiled (emit_c_prologue): a
 * header from another model, or from another version of this one (a cavsc killed
 * between its two renames leaves its new code beside the earlier header; a header
 * copied by hand), is a compile error, not an enum of parameters that silently names
 * other blocks. The banner is not hashed: the C and the CUDA code share one header,
 * whose declarations do not depend on the target or the precision. */
void emit_c_header(Emit *e, FILE *out) {
  const Model *m = e->m;
  const char *M = m->name;
  emit_banner(e, out, arena_printf("%s.h", M));
  char *text;
  size_t len;
  FILE *h = emit_hold(&text, &len);
  /* the ABI header only: an application includes cavs.h beside this */
  fprintf(h, "#ifndef CAVS_MODEL_%s_H\n#define CAVS_MODEL_%s_H\n\n#include \"cavs_abi.h\"\n\n", M, M);
  fprintf(h, "extern const cavs_desc %s_desc;\n\n", M);
  const char **names = arena_alloc(sizeof(char *) * (size_t)(m->ndims + m->ninputs + m->nparams + m->nvertex + 1));
  for (int i = 0; i < m->ndims; i++) names[i] = m->dims[i].name;
  header_enum(h, M, "dims", "dim", names, m->ndims);
  for (int i = 0; i < m->ninputs; i++) names[i] = m->inputs[i].name;
  header_enum(h, M, "inputs", "input", names, m->ninputs);
  /* an integer input's column in cavs_graph.feat, which holds M_nfeat a vertex */
  int nint = 0;
  for (int i = 0; i < m->ninputs; i++)
    if (m->inputs[i].kind != IN_REAL) names[nint++] = m->inputs[i].name;
  header_enum(h, M, "columns of cavs_graph.feat: feat[v * nfeat + column]", "feat", names, nint);
  if (nint) fprintf(h, "enum { %s_nfeat = %d };\n", M, nint);
  for (int i = 0; i < m->nparams; i++) names[i] = m->params[i].name;
  header_enum(h, M, "parameters", "param", names, m->nparams);
  for (int i = 0; i < m->nvertex; i++) names[i] = m->vertex[i]->name;
  header_enum(h, M, "vertex types", "vertex", names, m->nvertex);
  emit_unhold(h);
  unsigned long long s = 14695981039346656037ull;
  for (size_t i = 0; i < len; i++) s = (s ^ (unsigned char)text[i]) * 1099511628211ull;
  fwrite(text, 1, len, out);
  free(text);
  fprintf(out, "/* what the model's code checks it is compiled with: a hash of the declarations above */\n");
  fprintf(out, "#define CAVS_MODEL_%s_STAMP 0x%016llxu\n\n#endif\n", M, s);
  e->stamp = s;
}

/* The element type R and the math functions the bodies in ops.def call (cv_*): the
 * CUDA target's prologue too (nvcc has every one of them on the device). */
void emit_c_prologue(Emit *e) {
  FILE *c = e->out;
  bool dbl = e->o->prec == PREC_DOUBLE;
  emit_banner(e, c, arena_printf("%s.%s", e->m->name, e->t->ext));
  const char *M = e->m->name;
  fprintf(c, "#include \"%s.h\"\n\n", M);
  fprintf(c, "#if !defined(CAVS_MODEL_%s_STAMP) || CAVS_MODEL_%s_STAMP != 0x%016llxu\n", M, M, e->stamp);
  fprintf(c, "#error \"%s.h is not the header written with this file: run cavsc again\"\n#endif\n\n", M);
  fprintf(c, "#include <math.h>\n\n");
  fprintf(c, "typedef %s R;\n", dbl ? "double" : "float");
  fprintf(c, "#define cv_sigmoid cavs_sigmoid_%c\n#define cv_tanh %s\n#define cv_exp %s\n#define cv_log %s\n",
          dbl ? 'd' : 'f', dbl ? "tanh" : "cavs_tanh_f", dbl ? "exp" : "cavs_exp_f", dbl ? "log" : "logf");
}

/* A fused group's loop is a function of its own, called through cavs_loop (which splits
 * its columns over the backend's threads): it is written to the file while the stage
 * that calls it is held in memory, so that it comes first. */
typedef struct Held {
  char **text;
  size_t *len, cap;
} Held;

/* (a write it cannot take: 0, which sets the stream's error) */
static ssize_t held_write(void *c, const char *p, size_t n) {
  Held *h = c;
  if (n >= h->cap - *h->len) {
    size_t cap = h->cap;
    while (n >= cap - *h->len) {
      if (cap > SIZE_MAX / 2) return 0;
      cap *= 2;
    }
    char *t = realloc(*h->text, cap);
    if (!t) return 0;
    *h->text = t, h->cap = cap;
  }
  memcpy(*h->text + *h->len, p, n);
  *h->len += n;
  (*h->text)[*h->len] = 0;
  return (ssize_t)n;
}

FILE *emit_hold(char **text, size_t *len) {
  /* (in the arena, reachable however the run ends: a run that stops at its errors
     exits with the output's streams open, and LeakSanitizer took a malloc'd cookie,
     which only the stream held, for a leak) */
  Held *h = arena_alloc(sizeof *h);
  *h = (Held){text, len, 4096};
  *text = xmalloc(h->cap);
  **text = 0, *len = 0;
  FILE *f = fopencookie(h, "w", (cookie_io_functions_t){.write = held_write});
  if (!f) out_of_memory();
  return f;
}

void emit_unhold(FILE *f) {
  bool failed = ferror(f);
  if (fclose(f) || failed) out_of_memory();
}

void emit_hold_fn(Emit *e, HeldFn *h, const char *name) {
  h->fn = e->out = emit_hold(&h->text, &h->len);
  h->name = name;
}

void emit_release_fn(Emit *e, HeldFn *h) {
  fprintf(h->fn, "}\n");
  emit_unhold(h->fn);
  fwrite(h->text, 1, h->len, h->file);
  free(h->text);
  h->fn = NULL;
  h->text = NULL;
  e->out = h->file;
}

static void c_prologue(Emit *e) {
  HeldFn *s = arena_alloc(sizeof *s);
  s->file = e->out;
  e->state = s;
  emit_c_prologue(e);
}

/* the dims and the ctx's arrays, as every stage and loop function starts */
static void c_locals(const Emit *e, FILE *o) {
  for (int i = 0; i < e->m->ndims; i++)
    fprintf(o, "  const long D_%s = c->dims[%d];\n", e->m->dims[i].name, i);
  fprintf(o, "  R *const *V = (R *const *)c->val, *const *G = (R *const *)c->grad;\n");
  fprintf(o, "  R *const *P = (R *const *)c->param, *const *PG = (R *const *)c->pgrad;\n");
  fprintf(o, "  (void)V; (void)G; (void)P; (void)PG; (void)n; (void)r0;");
  for (int i = 0; i < e->m->ndims; i++) fprintf(o, " (void)D_%s;", e->m->dims[i].name);
  fputc('\n', o);
}

static void c_fn_open(Emit *e, const char *name, const char *what) {
  emit_hold_fn(e, e->state, name);
  fprintf(e->out, "\n/* %s */\nstatic void %s(cavs_ctx *c, int r0, int n) {\n", what, name);
  c_locals(e, e->out);
}

static void c_fn_close(Emit *e) { emit_release_fn(e, e->state); }

/* The call goes into the stage, the function into the file. The pointers are
 * `restrict` and the column loop CAVS_IVDEP unless two gradients the loop adds to may
 * overlap (GCC gives up versioning loops past 10 pointer pairs); then the loop runs in
 * one call, not split over threads (CAVS_LOOP_ALONE). A loop that writes no cell of
 * another row's (loop_rows_apart) is split over threads by rows (CAVS_LOOP_ROWS). */
/* Does forward loop l keep values for the backward pass (pointers k<node>)? Then it is
   written once as NAME_body, with `if (keep)` before each kept store, and NAME calls it
   with keep a constant (CAVS_INLINE, cavs_abi.h): one copy stores them, one does not. */
static bool loop_keeps(const Loop *l) {
  bool keeps = false;
  for (int i = 0; i < l->nptrs && !l->bwd; i++) keeps |= l->ptrs[i].write && l->ptrs[i].name[0] == 'k';
  return keeps;
}

static void c_loop_open(Emit *e, const Loop *l) {
  HeldFn *s = e->state;
  const char *name = arena_printf("%s_g%d%s", s->name, l->group, loop_suffix(l)), *width = emit_lin(e->m, l->width);
  fprintf(s->fn, "  cavs_loop(c, %s, %s, %s, %s, %s);\n", name, loop_r0(l), loop_n(l), width,
          l->may_alias ? "CAVS_LOOP_ALONE" : loop_rows_apart(l) ? "CAVS_LOOP_ROWS" : "0");
  FILE *o = e->out = s->file;
  char buf[256];
  fprintf(o, "\n/* %s, group g%d %s%s: rows [r0, r0 + n), columns [j0, j1) of [n, %s] */\n", s->name, l->group,
          l->bwd ? "backward" : "forward",
          l->part == LOOP_LEAVES ? " at the vertices without children" : l->part == LOOP_INNER ? " at the others" : "",
          lin_str(e->m, l->width, buf, sizeof buf));
  const char *rs = l->may_alias ? "" : "restrict ";
  if (loop_keeps(l))
    fprintf(o, "CAVS_INLINE void %s_body(cavs_ctx *c, int r0, int n, long j0, long j1, const int keep) {\n", name);
  else
    fprintf(o, "static void %s(cavs_ctx *c, int r0, int n, long j0, long j1) {\n", name);
  c_locals(e, o);
  fprintf(o, "  for (int r = r0; r < r0 + n; r++) {\n");
  for (int i = 0; i < l->nptrs; i++) {
    const LoopPtr *p = &l->ptrs[i];
    fprintf(o, "    %sR *%s%s = %s;\n", p->write ? "" : "const ", rs, p->name, emit_ptr(e, p->at, "r"));
  }
  if (l->unsplit) {
    /* in two stages (emit.c, fwd_stages): inference keeps nothing, and runs the one loop */
    fprintf(o, "    if (!keep) {\n      CAVS_IVDEP\n      for (long j = j0; j < j1; j++) {\n");
    for (const char *p = l->unsplit; *p;) {
      const char *nl = strchr(p, '\n');
      size_t len = nl ? (size_t)(nl - p) + 1 : strlen(p);
      fprintf(o, "  %.*s", (int)len, p);
      p += len;
    }
    fprintf(o, "      }\n      continue;\n    }\n    /* the exponentials that read no other, kept */\n");
  }
  if (!l->may_alias) fprintf(o, "    CAVS_IVDEP\n");
  fprintf(o, "    for (long j = j0; j < j1; j++) {\n");
}

static void c_loop_close(Emit *e, const Loop *l) {
  HeldFn *s = e->state;
  if (l->second) {
    fprintf(e->out, "    }\n    /* the rest, from what the first loop kept */\n");
    if (!l->may_alias) fprintf(e->out, "    CAVS_IVDEP\n");
    fprintf(e->out, "    for (long j = j0; j < j1; j++) {\n%s", l->second);
  }
  fprintf(e->out, "    }\n  }\n}\n");
  if (loop_keeps(l)) {
    const char *name = arena_printf("%s_g%d%s", s->name, l->group, loop_suffix(l));
    fprintf(e->out, "\nstatic void %s(cavs_ctx *c, int r0, int n, long j0, long j1) {\n", name);
    fprintf(e->out, "  if (c->keep) %s_body(c, r0, n, j0, j1, 1);\n", name);
    fprintf(e->out, "  else %s_body(c, r0, n, j0, j1, 0); /* inference: nothing kept */\n}\n", name);
  }
  e->out = s->fn;
}

/* enum cavs_prod_form of cavs_abi.h, by GemmCall.form */
static const char *const prod_form[] = {"CAVS_PROD_Y",       "CAVS_PROD_DX",     "CAVS_PROD_DW",
                                        "CAVS_PROD_Y_INNER", "CAVS_PROD_Y_ADD",  "CAVS_PROD_DX_SET",
                                        "CAVS_PROD_Y_OPEN",  "CAVS_PROD_Y_CLOSE"};

/* cavs_gemm over rows r0.. (row-major, BLAS argument order), or cavs_gemm_skip and
 * cavs_gemm_rows, which take row 0 and skip the rows themselves. */
void emit_c_gemm(Emit *e, const GemmCall *g) {
  const char *cols = emit_lin(e->m, g->cols), *k = emit_lin(e->m, g->k);
  const char *ws = emit_ptr(e, g->w, "0"), *wl = emit_ld(e, g->w.p);
  const char *xl = emit_ld(e, g->x.p), *yl = emit_ld(e, g->y.p);
  if (g->stack > 1) {
    /* every child's row: S rows a vertex, the leaves' first */
    cv_assert(g->rows == ROWS_WITH_CHILDREN);
    fprintf(e->out, "  cavs_gemm_skip(c, %d * c->leaf_rows, %d * r0, %d * n, %s, %s, %s, %s, %s,\n                 %s, %s, %s, %s);\n",
            g->stack, g->stack, g->stack, prod_form[g->form], cols, k, emit_ptr(e, g->x, "0"), xl, ws, wl,
            emit_ptr(e, g->y, "0"), yl);
    return;
  }
  if (g->kids) {
    /* x the children's gathered rows, those of type kid_type rows of the table */
    fprintf(e->out,
            "  cavs_gemm_kids(c, %d, %d, %d, %s, r0, n, %s, %s, %s, %s, %s, %s,\n                 %s, %s, %s, %s, "
            "%s, %s);\n",
            g->kids, g->kid_type, g->kid_input, g->rows == ROWS_WITH_CHILDREN ? "c->leaf_rows" : "0",
            prod_form[g->form], cols, emit_lin(e->m, g->kid_k), emit_ptr(e, (Ref){g->table, false}, "0"),
            emit_ld(e, g->table), emit_ld(e, &(Place){.ld = g->table_rows}), emit_ptr(e, g->x, "0"), xl, ws, wl,
            emit_ptr(e, g->y, "0"), yl);
    return;
  }
  if (g->table) {
    /* x = table[index]: each distinct row multiplied once (training), or, for y = x W,
       rows of table W looked up (inference); NULL where x's rows are not the table's */
    const char *t = emit_ptr(e, (Ref){g->table, false}, "0");
    if (strcmp(g->table_if, "1")) t = arena_printf("(%s ? %s : NULL)", g->table_if, t);
    fprintf(e->out,
            "  cavs_gemm_table(c, c->iin[%d], %s, r0, n, %s, %s, %s, %s, %s, %s,\n                  %s, %s, %s, %s, "
            "%s, %s);\n",
            g->index, g->rows == ROWS_WITH_INDEX_AND_CHILDREN ? "c->leaf_rows" : "0", prod_form[g->form], cols, k, t,
            emit_ld(e, g->table), emit_ld(e, &(Place){.ld = g->table_rows}), emit_ptr(e, g->x, "0"), xl, ws, wl,
            emit_ptr(e, g->y, "0"), yl);
    return;
  }
  if (g->form == 7) {
    /* the rows without a word, which the product added into left open, set by their index */
    fprintf(e->out, "  cavs_gemm_rows(c, c->iin[%d], %s, r0, n, %s, %s, %s, %s, %s,\n                 %s, %s, %s, %s);\n",
            g->index, g->rows == ROWS_WITH_CHILDREN ? "c->leaf_rows" : "0", prod_form[g->form], cols, k,
            emit_ptr(e, g->x, "0"), xl, ws, wl, emit_ptr(e, g->y, "0"), yl);
    return;
  }
  if (g->rows != ROWS_ALL) {
    const char *which = g->rows == ROWS_WITH_CHILDREN
                            ? "skip(c, c->leaf_rows"
                            : arena_printf("rows(c, c->iin[%d], %s", g->index,
                                           g->rows == ROWS_WITH_INDEX_AND_CHILDREN ? "c->leaf_rows" : "0");
    fprintf(e->out, "  cavs_gemm_%s, r0, n, %s, %s, %s, %s, %s,\n                 %s, %s, %s, %s);\n", which,
            prod_form[g->form], cols, k, emit_ptr(e, g->x, "0"), xl, ws, wl, emit_ptr(e, g->y, "0"), yl);
    return;
  }
  const char *xs = emit_ptr(e, g->x, "r0"), *ys = emit_ptr(e, g->y, "r0");
  const char *fmt = "  cavs_gemm(c, %s, %s, %s, %s, %s, 1, %s, %s,\n            %s, %s, %d, %s, %s);\n";
  const char *N = "CAVS_NO_TRANS", *T = "CAVS_TRANS";
  if (g->form == 0 || g->form == 4) fprintf(e->out, fmt, N, N, "n", cols, k, xs, xl, ws, wl, g->form == 4, ys, yl);
  else if (g->form == 1 || g->form == 5) fprintf(e->out, fmt, N, T, "n", k, cols, xs, xl, ws, wl, g->form == 1, ys, yl);
  else fprintf(e->out, fmt, T, N, k, cols, "n", xs, xl, ys, yl, 1, ws, wl);
}

void emit_c_gather(Emit *e, int child, int src, Ref state, bool bwd) {
  fprintf(e->out, "  cavs_gather_%s(c, %d, %d, %s, %s, r0, n);\n", bwd ? "bwd" : "fwd", child, src, emit_ptr(e, state, "0"),
          emit_ld(e, state.p));
}

void emit_c_lookup(Emit *e, Ref table, int index, Ref out, Lin width, bool bwd) {
  fprintf(e->out, "  cavs_lookup_%s(c, %s, %s, c->iin[%d], %s, %s, r0, n, %s);\n", bwd ? "bwd" : "fwd",
          emit_ptr(e, table, "0"), emit_ld(e, table.p), index, emit_ptr(e, out, "0"), emit_ld(e, out.p),
          emit_lin(e->m, width));
}

void emit_c_copy(Emit *e, Ref to, Ref from, Lin width, bool add) {
  fprintf(e->out, "  cavs_copy_rows(c, %s, %s, %s, %s, n, %s, %d);\n", emit_ptr(e, to, "r0"), emit_ld(e, to.p),
          emit_ptr(e, from, "r0"), emit_ld(e, from.p), emit_lin(e->m, width), add);
}

void emit_c_loss(Emit *e, const LossCall *l) {
  const char *a = emit_ptr(e, (Ref){l->a, false}, "0"), *al = emit_ld(e, l->a);
  const char *da = l->bwd ? arena_printf("%s, %s, ", emit_ptr(e, (Ref){l->a, true}, "0"), al) : "";
  const char *t = l->t ? arena_printf("%s, %s", emit_ptr(e, (Ref){l->t, false}, "0"), emit_ld(e, l->t))
                       : arena_printf("c->iin[%d]", l->label);
  fprintf(e->out, "  cavs_%s_%s(c, %d, %s, %s, %s, %sr0, n, %s);\n", l->op == OP_XENT ? "xent" : "mse",
          l->bwd ? "bwd" : "fwd", l->index, a, al, t, da, emit_lin(e->m, l->width));
}

const Target target_c = {
    .name = "c",
    .ext = "c",
    .abi = "CAVS_TARGET_C",
    .header = emit_c_header,
    .prologue = c_prologue,
    .fn_open = c_fn_open,
    .fn_close = c_fn_close,
    .loop_open = c_loop_open,
    .loop_close = c_loop_close,
    .gemm = emit_c_gemm,
    .gather = emit_c_gather,
    .lookup = emit_c_lookup,
    .copy = emit_c_copy,
    .loss = emit_c_loss,
};

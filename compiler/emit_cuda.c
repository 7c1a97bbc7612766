/* emit_cuda.c: the CUDA target, MODEL.h and MODEL.cu: the C target's output with every
 * fused group as a kernel.
 *
 * A stage is the same host function as in C (`static void MODEL_BLOCK_STAGE(cavs_ctx *c,
 * int r0, int n)`, same name, same order, same comments). A fused group becomes a
 * `__global__` kernel with one thread per row and column of the stage (cavs_cuda_cell in
 * cavs_abi.h, which the CPU tests run), holding the statements of the C loop's body as
 * emit.c writes them, launched on the model's stream and checked. The launch is written
 * through cavs_abi.h's CAVS_CUDA_LAUNCH, not `<<<...>>>`, so the file is also C++ a host
 * compiler reads (tests/cuda_host.h runs it on the CPU with a launch of its own). The
 * pointers of the ctx are device pointers: the stage reads the host arrays that hold
 * them and passes each kernel its rows' pointers and the dims, never dereferencing one.
 * Products, gathers, lookups, copies and losses are the C target's calls into libcavs,
 * whose CUDA backend runs them on the device.
 *
 * Kernels come before the host function that launches them: a stage's text is held in
 * memory until the stage closes, while its kernels go straight to the file. */
#include "cavsc.h"

#include <stdlib.h>
#include <string.h>

typedef struct Cuda {
  HeldFn h;   /* first: the stage, held until its kernels are out */
  FILE *body; /* a kernel's statements, as emit.c writes them for the C loop */
  char *body_text;
  size_t body_len;
} Cuda;

static void cuda_prologue(Emit *e) {
  Cuda *s = arena_alloc(sizeof *s);
  s->h.file = e->out;
  e->state = s;
  emit_c_prologue(e);
}

/* As the C target's, but nvcc warns of a pointer set and never used whatever (void)
 * says, so the declarations say [[maybe_unused]]. */
static void cuda_fn_open(Emit *e, const char *name, const char *what) {
  Cuda *s = e->state;
  emit_hold_fn(e, &s->h, name);
  FILE *o = e->out;
  fprintf(o, "\n/* %s */\nstatic void %s(cavs_ctx *c, int r0, int n) {\n", what, name);
  for (int i = 0; i < e->m->ndims; i++)
    fprintf(o, "  [[maybe_unused]] const long D_%s = c->dims[%d];\n", e->m->dims[i].name, i);
  fprintf(o, "  /* host arrays of device pointers */\n");
  fprintf(o, "  [[maybe_unused]] R *const *V = (R *const *)c->val, *const *G = (R *const *)c->grad;\n");
  fprintf(o, "  [[maybe_unused]] R *const *P = (R *const *)c->param, *const *PG = (R *const *)c->pgrad;\n");
}

static void cuda_fn_close(Emit *e) {
  emit_release_fn(e, &((Cuda *)e->state)->h);
}

/* Several threads add to a vector parameter's gradient (each row's share), and to one
 * place through two gradients that may overlap: those adds are atomic (cavs_cuda_sum). */
static bool atomic_ptr(const Loop *l, const LoopPtr *p) {
  return l->bwd && p->write && (l->may_alias || p->at.p->kind == PL_PARAM);
}

/* The type of a pointer in the kernel; `plain` without the atomic adds. */
static const char *ptr_type(const Loop *l, const LoopPtr *p, bool plain) {
  if (!plain && atomic_ptr(l, p)) return "cavs_cuda_sum<R> ";
  return arena_printf("%sR *%s", p->write ? "" : "const ", l->may_alias ? "" : "__restrict__ ");
}

static bool per_row(const LoopPtr *p) { return p->at.p->kind != PL_PARAM; }

/* A row's home (emit.c, PL_HOME): not a stride from the stage's first row but a pointer
 * of its own, from cavs_ctx.home_val (home_grad), which holds device pointers on the
 * CUDA backend: the kernel gets the array of its home from row r0 on and reads its
 * row's. */
static bool home_ptr(const LoopPtr *p) { return p->at.p->kind == PL_HOME; }
static const char *launch_arg(Emit *e, const LoopPtr *p, const char *r0) {
  if (!home_ptr(p)) return emit_ptr(e, p->at, r0);
  return arena_printf("c->home_%s[%d] + (%s)", p->at.grad ? "grad" : "val", p->at.p->buf, r0);
}

/* The launch goes into the stage; the kernel's head, and then its body (emit.c's
 * statements, caught in `body`), into the file. */
static void cuda_loop_open(Emit *e, const Loop *l) {
  Cuda *s = e->state;
  const Model *m = e->m;
  const char *name = arena_printf("%s_g%d%s", s->h.name, l->group, loop_suffix(l)), *width = emit_lin(m, l->width);
  const char *r0 = loop_r0(l), *n = loop_n(l);
  const char *dims = "";
  for (int i = 0; i < m->ndims; i++) dims = arena_printf("%s, D_%s", dims, m->dims[i].name);

  FILE *o = s->h.fn;
  fprintf(o, "  {\n    const uint32_t blocks = cavs_cuda_blocks(%s, %s, CAVS_CUDA_BLOCK); /* 0: no rows */\n", n, width);
  fprintf(o, "    if (blocks) {\n      CAVS_CUDA_LAUNCH(%s, blocks, (cudaStream_t)c->stream)(%s%s", name, n, dims);
  for (int i = 0; i < l->nptrs; i++) fprintf(o, ",\n          %s", launch_arg(e, &l->ptrs[i], r0));
  fprintf(o, ");\n      CAVS_CUDA_CHECK_LAUNCH(c);\n    }\n  }\n");

  char buf[256];
  FILE *k = s->h.file;
  fprintf(k, "\n/* %s, group g%d %s%s: a thread per row and column of [n, %s] */\n", s->h.name, l->group,
          l->bwd ? "backward" : "forward",
          l->part == LOOP_LEAVES ? " at the vertices without children" : l->part == LOOP_INNER ? " at the others" : "",
          lin_str(m, l->width, buf, sizeof buf));
  fprintf(k, "static __global__ void %s(int n", name);
  for (int i = 0; i < m->ndims; i++) fprintf(k, ", long D_%s", m->dims[i].name);
  for (int i = 0; i < l->nptrs; i++) {
    const LoopPtr *p = &l->ptrs[i];
    /* a row's pointer comes in at row r0, the kernel's row is NAME; a home as the rows'
       pointers from r0 on */
    if (home_ptr(p)) fprintf(k, ",\n    void *const *%s_r0", p->name);
    else fprintf(k, ",\n    %s%s%s", ptr_type(l, p, per_row(p)), p->name, per_row(p) ? "_r0" : "");
  }
  fprintf(k, ") {\n  long i, j; /* the row among the stage's, the column */\n");
  fprintf(k, "  if (!cavs_cuda_cell(blockIdx.x, blockDim.x, threadIdx.x, n, %s, &i, &j)) return;\n", width);
  for (int i = 0; i < l->nptrs; i++) {
    const LoopPtr *p = &l->ptrs[i];
    if (home_ptr(p))
      fprintf(k, "  %s%s = (R *)%s_r0[i]%s;\n", ptr_type(l, p, false), p->name, p->name,
              lin_is_zero(p->at.p->off) ? "" : arena_printf(" + %s", emit_lin(m, p->at.p->off)));
    else if (per_row(p))
      fprintf(k, "  %s%s = %s_r0 + (size_t)i * %s;\n", ptr_type(l, p, false), p->name, p->name, emit_ld(e, p->at.p));
  }
  s->body = e->out = emit_hold(&s->body_text, &s->body_len);
}

/* The body, indented for the kernel (in C it sits two loops deep), and the kernel's end. */
static void cuda_loop_close(Emit *e, const Loop *l) {
  Cuda *s = e->state;
  emit_unhold(s->body);
  for (char *line = s->body_text; *line;) {
    char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) + 1 : strlen(line);
    size_t cut = strncmp(line, "    ", 4) ? 0 : 4;
    fwrite(line + cut, 1, len - cut, s->h.file);
    line += len;
  }
  fprintf(s->h.file, "}\n");
  free(s->body_text);
  s->body = NULL;
  s->body_text = NULL;
  e->out = s->h.fn;
}

const Target target_cuda = {
    .name = "cuda",
    .ext = "cu",
    .abi = "CAVS_TARGET_CUDA",
    .header = emit_c_header,
    .prologue = cuda_prologue,
    .fn_open = cuda_fn_open,
    .fn_close = cuda_fn_close,
    .loop_open = cuda_loop_open,
    .loop_close = cuda_loop_close,
    .gemm = emit_c_gemm,
    .gather = emit_c_gather,
    .lookup = emit_c_lookup,
    .copy = emit_c_copy,
    .loss = emit_c_loss,
};

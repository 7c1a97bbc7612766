/* emit.c: what every target's output computes, in which order, with which comments.
 *
 * One function per block and stage, in a fixed order (pull, each vertex block, push;
 * forward stages, then backward), so `git diff generated/` reads well. Each statement
 * carries its .vf line and its shape. A fused group is one loop over rows and columns
 * with the elementwise bodies of ops.def; its backward loop recomputes the group's values
 * from its inputs, then walks the members in reverse applying the derivative rules.
 * Products skip the rows where their left operand is known to be zero. The file ends with
 * the model's descriptor. Widths are expressions in the dims (D_H, ...), bound when the
 * model is created, so one build serves every --dim.
 *
 * How each piece is written (a function's opening, a loop, a call into libcavs) is the
 * target's (struct Target in cavsc.h): emit_c.c for C, emit_cuda.c for CUDA. A new
 * target is a file of hooks and a row in `targets` below. */
#include "cavsc.h"

#include <stdlib.h>
#include <string.h>

const char *emit_lin(const Model *m, Lin l) {
  char buf[512];
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < CV_MAX_DIMS; i++) {
    if (!l.c[i]) continue;
    const char *sign = l.c[i] < 0 ? "-" : len ? "+" : "";
    long c = l.c[i] < 0 ? -(long)l.c[i] : l.c[i];
    if (c == 1) len += (size_t)snprintf(buf + len, sizeof buf - len, "%sD_%s", sign, m->dims[i].name);
    else len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%ld*D_%s", sign, c, m->dims[i].name);
  }
  if (l.k || !len) snprintf(buf + len, sizeof buf - len, len && l.k > 0 ? "+%d" : "%d", l.k);
  return arena_strdup(buf);
}

/* `(x)` unless x is a plain name or number */
static const char *paren(const char *x) {
  for (const char *p = x; *p; p++)
    if (*p == '+' || *p == '-' || *p == '*') return arena_printf("(%s)", x);
  return x;
}

static const char *wstr(const Model *m, Lin l) {
  char buf[256];
  return arena_strdup(lin_str(m, l, buf, sizeof buf));
}

static int int_slot(const Model *m, int input) {
  int k = 0;
  for (int i = 0; i < input; i++) k += m->inputs[i].kind != IN_REAL;
  return k;
}

static int real_slot(const Model *m, int input) {
  int k = 0;
  for (int i = 0; i < input; i++) k += m->inputs[i].kind == IN_REAL;
  return k;
}

/* The run-time test under which buffer b is read at its dropout's input (DropAlias),
   or NULL where it is read as it is */
static const char *alias_if(const Emit *e, int b) {
  if (!e->alias || e->no_alias || e->alias[b].src < 0) return NULL;
  const DropAlias *a = &e->alias[b];
  if (a->opt >= 0) return arena_printf("(c->opt[%d] == 0 || !c->keep)", a->opt);
  return a->p == 0 ? "1" : "!c->keep";
}

const char *emit_ptr(const Emit *e, Ref r, const char *row) {
  const Model *m = e->m;
  const Place *p = r.p;
  const char *off = lin_is_zero(p->off) ? "" : arena_printf(" + %s", paren(emit_lin(m, p->off)));
  switch (p->kind) {
  case PL_ROW: {
    const char *at = arena_printf("%s[%d] + (size_t)(%s) * %s%s", r.grad ? "G" : "V", p->buf, row,
                                  paren(emit_lin(m, p->ld)), off);
    const char *cond = alias_if(e, p->buf);
    if (!cond) return at;
    const DropAlias *a = &e->alias[p->buf];
    Place in = {PL_ROW, a->src, lin_add(a->off, p->off), m->bufs[a->src].width};
    const char *there = emit_ptr(e, (Ref){&in, r.grad}, row);
    return strcmp(cond, "1") ? arena_printf("(%s ? %s : %s)", cond, there, at) : there;
  }
  case PL_PARAM:
    if (r.grad && e->pg_marks) e->pg_marks[p->buf] = 1;
    if (r.grad && e->pg_stage) e->pg_stage[p->buf] = 1;
    return arena_printf("%s[%d]%s", r.grad ? "PG" : "P", p->buf, off);
  case PL_HOME: /* the row's home p->buf: where a parent gathers its state, or a scratch row */
    return arena_printf("(R *)c->home_%s[%d][%s]%s", r.grad ? "grad" : "val", p->buf, row, off);
  case PL_INPUT: /* p->buf is the input; real inputs have their own numbering */
    return arena_printf("(const R *)c->rin[%d] + (size_t)(%s) * %s", real_slot(m, p->buf), row,
                        paren(emit_lin(m, p->ld)));
  default: internal_error(__FILE__, __LINE__, "no pointer for a place of kind %d", p->kind);
  }
}

const char *emit_ld(const Emit *e, const Place *p) {
  const char *ld = paren(emit_lin(e->m, p->ld)), *cond = p->kind == PL_ROW ? alias_if(e, p->buf) : NULL;
  if (!cond) return ld;
  const char *there = paren(emit_lin(e->m, e->m->bufs[e->alias[p->buf].src].width));
  return !strcmp(there, ld) ? ld : strcmp(cond, "1") ? arena_printf("(%s ? %s : %s)", cond, there, ld) : there;
}

/* ---- text from outside the compiler ----
 * A file name, a command line or an IR file's `source` line can hold any byte. What the
 * emitter writes into the generated code from them goes through one of these two, so
 * that no input can end a comment or a string early and become code. */

/* Any bytes as a C string literal (with its quotes) or as text for a block comment.
 * Printable ASCII stays itself, except: in a string `"`, `\` and `?` are escaped (no
 * trigraphs) and every other byte is a three-digit octal escape (a shorter one could
 * run into a following digit); in a comment every other byte and `\` are shown as
 * \xNN, and `*` or `/` before `/` or `*`, and `?` before `?`, get a space after them,
 * so that nothing closes or nests the comment or makes a trigraph. */
static const char *escape_n(const char *s, size_t n, bool string, bool split) {
  char *out = arena_alloc(6 * n + 8), *p = out;
  if (string) *p++ = '"';
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i], next = i + 1 < n ? (unsigned char)s[i + 1] : 0;
    bool plain = ch >= 0x20 && ch < 0x7f && ch != '\\';
    if (string && (ch == '"' || ch == '\\' || ch == '?')) {
      *p++ = '\\';
      *p++ = (char)ch;
    } else if (!string && (((ch == '*' || ch == '/') && (next == '/' || next == '*')) || (ch == '?' && next == '?'))) {
      *p++ = (char)ch;
      *p++ = ' ';
    } else if (plain) {
      *p++ = (char)ch;
    } else {
      p += sprintf(p, string ? "\\%03o" : "\\x%02x", ch);
    }
    /* split: a literal a line of the text, adjacent literals on lines of their own */
    if (split && string && ch == '\n' && i + 1 < n) p += sprintf(p, "\"\n    \"");
  }
  if (string) *p++ = '"';
  *p = 0;
  return out;
}
static const char *escape(const char *s, bool string) { return escape_n(s, strlen(s), string, false); }
const char *emit_c_string(const char *s) { return escape(s, true); }

/* n bytes (any, NUL too) as adjacent C string literals, one a line of the text: a
 * model's source, readable in the output. */
const char *emit_c_string_n(const char *s, size_t n) { return s ? escape_n(s, n, true, true) : "\"\""; }
const char *emit_c_comment(const char *s) { return escape(s, false); }

void emit_banner(const Emit *e, FILE *o, const char *file) {
  fprintf(o, "/* %s: generated by cavsc %s from %s. Do not edit.\n", file, CAVSC_VERSION, emit_c_comment(e->o->source_name));
  fprintf(o, " * Command: %s */\n", emit_c_comment(e->o->cmdline));
}

static const char *src_comment(const Emit *e, const IrNode *n) {
  const char *base = strrchr(e->m->path, '/');
  base = base ? base + 1 : e->m->path;
  return arena_printf("%s:%d", emit_c_comment(base), n->loc.line);
}

static const char *node_label(const IrFunc *f, int i) {
  const IrNode *n = &f->nodes[i];
  return n->name ? n->name : arena_printf("%%%d", i);
}

/* ---- elementwise groups ---- */

static bool in_group(const IrFunc *f, int x, int g) { return f->nodes[x].group == g; }

/* The expression of operand x inside the loop of group g at column j. */
/* The part of a loop being written (enum LOOP_*): in LOOP_LEAVES, what is zero at the
 * vertices without children reads as 0, and what is dead there is not computed. */
static int part;

const char *loop_r0(const Loop *l) { return l->part == LOOP_INNER ? "(r0 + c->leaf_rows)" : "r0"; }
const char *loop_n(const Loop *l) {
  return l->part == LOOP_LEAVES ? "c->leaf_rows" : l->part == LOOP_INNER ? "(n - c->leaf_rows)" : "n";
}
const char *loop_suffix(const Loop *l) { return l->part == LOOP_LEAVES ? "_leaves" : ""; }

bool loop_rows_apart(const Loop *l) {
  if (l->may_alias) return false;
  for (int i = 0; i < l->nptrs; i++)
    if (l->ptrs[i].write && l->ptrs[i].at.p->kind != PL_ROW && l->ptrs[i].at.p->kind != PL_HOME) return false;
  return true;
}

/* Not read, computed or written in the leaves' part: zero or dead there; nor in any
 * part, a product added into another value's place (IrNode.accum: the add reads that
 * alone, and the gradient stored there is this one's too). */
static bool gone(const IrFunc *f, int x) {
  return (part == LOOP_LEAVES && (f->nodes[x].zero_leaf || f->nodes[x].dead_leaf)) || f->nodes[x].accum;
}

/* Does the leaves' part of a forward loop store member x, dead at the leaves (fuse.c), as
 * 0? Where anything reads its buffer there (not leaves_untouched: an mm, a topk, an
 * scomb, ... runs over every row of the stage), as a value zero there is: the readers
 * must find a finite value (its gradient there is 0, and their backward multiplies it
 * by that value), not what the buffer held before. */
static bool dead_stored(const IrFunc *f, int x) {
  const IrNode *n = &f->nodes[x];
  return n->dead_leaf && n->val.kind == PL_ROW && !leaves_untouched(f, n->val.buf);
}

/* An outside row of width 1 that group g (of another width) broadcasts over its columns. */
static bool broadcast(const IrFunc *f, int x, int g) {
  const IrNode *n = &f->nodes[x];
  return n->type == T_ROW && !in_group(f, x, g) && lin_eq(n->width, lin_const(1)) &&
         !lin_eq(f->groups[g].width, lin_const(1));
}

/* Operand x reads as 0 in this part of a loop: zero at the leaves, or a product added
 * into the other operand's place already (IrNode.accum). */
static bool reads_zero(const IrFunc *f, int x) {
  return (part == LOOP_LEAVES && f->nodes[x].zero_leaf) || f->nodes[x].accum;
}

static const char *operand(const IrFunc *f, int x, int g) {
  const IrNode *n = &f->nodes[x];
  if (reads_zero(f, x)) return "(R)0";
  if (in_group(f, x, g)) return arena_printf("v%d", x);
  if (n->type == T_SCALAR) return arena_printf("(R)%.17g", n->cval);
  return arena_printf("a%d[%s]", x, broadcast(f, x, g) ? "0" : "j");
}

/* Does group g's backward loop add to the gradient of a row it broadcasts? Every
 * column adds to that one cell: the loop runs whole (not split over threads), its adds
 * atomic on the GPU, as when gradients may alias. */
static bool broadcast_grad(const IrFunc *f, const Group *g, int gi) {
  for (int k = 0; k < g->n; k++) {
    const IrNode *m = &f->nodes[g->members[k]];
    for (int j = 0; j < m->nargs; j++)
      if (m->grad && f->nodes[m->args[j]].grad && broadcast(f, m->args[j], gi)) return true;
  }
  return false;
}

/* Do two written gradient regions of a backward loop overlap (two different slices of
 * one buffer)? Only then may the loop's pointers alias; otherwise they are `restrict`:
 * outputs never overlap inputs (a member cannot read a view of what the group itself
 * writes: fusion refuses such cycles), so the compiler may vectorize without run-time
 * alias checks. Column ranges are compared symbolically: disjoint when one provably
 * ends before the other starts. */
static bool grads_may_alias(const IrFunc *f, const Group *g, int gi) {
  const IrNode *seen[256];
  int n = 0;
  for (int k = 0; k < g->n; k++) {
    const IrNode *m = &f->nodes[g->members[k]];
    for (int j = 0; j < m->nargs; j++) {
      const IrNode *a = &f->nodes[m->args[j]];
      if (in_group(f, m->args[j], gi) || !a->grad || a->accum || (a->val.kind != PL_ROW && a->val.kind != PL_PARAM))
        continue;
      for (int i = 0; i < n; i++) {
        const Place *p = &seen[i]->val, *q = &a->val;
        if (p->kind != q->kind || p->buf != q->buf || seen[i] == a) continue;
        Lin pw = p->kind == PL_ROW ? seen[i]->width : lin_const(0), qw = q->kind == PL_ROW ? a->width : lin_const(0);
        if (p->kind == PL_PARAM) return true; /* two vectors in one group: keep it simple */
        if (!lin_le(lin_add(p->off, pw), q->off) && !lin_le(lin_add(q->off, qw), p->off)) return true;
      }
      if (n < 256) seen[n++] = a;
      else return true;
    }
  }
  return false;
}

/* Where the backward loop reads a member's value instead of computing it: the buffer
 * the forward loop kept it in (plan.c), or the one it lives in anyway; NULL. */
static const Place *loaded(const IrFunc *f, int x) {
  const IrNode *n = &f->nodes[x];
  return n->keep ? &n->kval : n->val.kind == PL_ROW ? &n->val : NULL;
}

/* How many homes member x of f's loops, a piece of the state, is also stored at (0: it
 * is not a piece of a state stored at home; Emit.homes, state_homes); its place at home
 * k: the same columns of that home's row; the names of the pointers there. */
static int at_home(const Emit *e, const IrFunc *f, int x) {
  const IrNode *n = &f->nodes[x];
  return f->kind == F_VERTEX && n->val.kind == PL_ROW && n->val.buf == f->state_buf ? e->homes[f->index] : 0;
}
static const Place *home_place(const IrFunc *f, int x, int k) {
  Place *p = arena_alloc(sizeof *p);
  *p = (Place){.kind = PL_HOME, .buf = k, .off = f->nodes[x].val.off, .ld = f->nodes[x].val.ld};
  return p;
}
static const char *home_name(const char *what, int x, int k) {
  return k ? arena_printf("%s%d_%d", what, x, k + 1) : arena_printf("%s%d", what, x);
}

/* The loop of group gi, with a pointer for every outside operand it reads (all of them
 * forward; `reads` backward), for the gradients it adds to, and for the values (forward)
 * or gradients (backward) of its members that live in buffers (and, for a piece of a
 * state stored at home, at the row's home too). */
static Loop group_loop(const Emit *e, const IrFunc *f, int gi, bool bwd, const bool *reads) {
  const Group *g = &f->groups[gi];
  Loop l = {.f = f, .group = gi, .bwd = bwd, .part = part, .width = g->width,
            .may_alias = bwd && (grads_may_alias(f, g, gi) || broadcast_grad(f, g, gi))};
  /* at most two a member (its kept or loaded value, and its value or gradient in a
     buffer) and two an outside operand (its value and its gradient), of which there
     are at most two a member */
  l.ptrs = arena_alloc(sizeof(LoopPtr) * (size_t)((6 + CV_MAX_HOMES) * g->n + 1));
  bool *seen = arena_alloc(sizeof(bool) * (size_t)f->n);
  for (int k = 0; k < g->n; k++) {
    const IrNode *n = &f->nodes[g->members[k]];
    for (int j = 0; j < n->nargs; j++) {
      int x = n->args[j];
      const IrNode *a = &f->nodes[x];
      if (in_group(f, x, gi) || seen[x] || a->type == T_SCALAR || gone(f, x)) continue;
      seen[x] = true;
      if (!reads || reads[x]) l.ptrs[l.nptrs++] = (LoopPtr){arena_printf("a%d", x), false, {&a->val, false}};
      if (bwd && a->grad && (a->val.kind == PL_ROW || a->val.kind == PL_PARAM))
        l.ptrs[l.nptrs++] = (LoopPtr){arena_printf("d%d", x), true, {&a->val, true}};
    }
  }
  for (int k = 0; k < g->n; k++) {
    int x = g->members[k];
    const IrNode *n = &f->nodes[x];
    /* the leaves' part writes a member zero there (as 0), not one dead there unless it
       is read there (dead_stored: as 0 too) */
    if (part == LOOP_LEAVES && ((n->dead_leaf && (bwd || !dead_stored(f, x))) || (bwd && n->zero_leaf))) continue;
    if (!bwd && n->keep && !gone(f, x)) l.ptrs[l.nptrs++] = (LoopPtr){arena_printf("k%d", x), true, {&n->kval, false}};
    if (bwd && loaded(f, x) && (!reads || reads[x]))
      l.ptrs[l.nptrs++] = (LoopPtr){arena_printf("k%d", x), false, {loaded(f, x), false}};
    if (n->val.kind != PL_ROW) continue;
    if (!bwd) l.ptrs[l.nptrs++] = (LoopPtr){arena_printf("o%d", x), true, {&n->val, false}};
    else if (n->grad) l.ptrs[l.nptrs++] = (LoopPtr){arena_printf("g%d_in", x), false, {&n->val, true}};
    for (int k = 0; k < at_home(e, f, x); k++)
      if (!bwd) l.ptrs[l.nptrs++] = (LoopPtr){home_name("h", x, k), true, {home_place(f, x, k), false}};
      else if (n->grad) l.ptrs[l.nptrs++] = (LoopPtr){home_name("hg", x, k), false, {home_place(f, x, k), true}};
  }
  return l;
}

static void group_header(const Emit *e, const IrFunc *f, const Group *g, int gi, const char *what) {
  fprintf(e->out, "  /* group g%d %s, [n, %s]:", gi, what, wstr(e->m, g->width));
  for (int k = 0; k < g->n; k++) {
    const IrNode *n = &f->nodes[g->members[k]];
    if (n->name) fprintf(e->out, " %s", n->name);
  }
  fprintf(e->out, " (lines");
  int last = -1;
  for (int k = 0; k < g->n; k++) {
    int l = f->nodes[g->members[k]].loc.line;
    if (l != last) fprintf(e->out, " %d", l);
    last = l;
  }
  fprintf(e->out, ") */\n");
}

/* Which members the backward loop must have: those a derivative rule reads, and, for
 * those it computes rather than loads, what they are computed from. NULL `need` computes
 * every member (the forward loop). */
static bool *group_needs(const IrFunc *f, const Group *g, int gi) {
  bool *need = arena_alloc(sizeof(bool) * (size_t)f->n);
  rule_needs(f, gi, need);
  for (int k = g->n - 1; k >= 0; k--) {
    int x = g->members[k];
    if (!need[x] || loaded(f, x)) continue;
    const IrNode *n = &f->nodes[x];
    for (int i = 0; i < n->nargs; i++)
      if (in_group(f, n->args[i], gi)) need[n->args[i]] = true;
  }
  return need;
}

/* An exponential's worth of work: what fills a loop's registers with constants. */
static bool heavy_op(int op) { return op == OP_SIGMOID || op == OP_TANH || op == OP_EXP || op == OP_LOG; }

/* Does a member outside `first` (the second stage) read member x of it? */
static bool stage_two_reads(const IrFunc *f, const Group *g, int gi, const bool *first, int x) {
  for (int k = 0; k < g->n; k++) {
    int y = g->members[k];
    const IrNode *n = &f->nodes[y];
    if (first[y] || gone(f, y)) continue;
    for (int i = 0; i < n->nargs; i++)
      if (n->args[i] == x && !reads_zero(f, x)) return true;
  }
  return false;
}

/* A forward loop in two stages (the C target, where a backward pass follows). An LSTM
 * cell's loop computes four or five gates, each an exponential, then tanh of the cell
 * from them: one loop of six exponentials, some two dozen pointers and the
 * exponential's constants, which x86-64's 16 general and 16 vector registers cannot
 * hold, and the loop spends its time reloading them from the stack (on a Zen 3 7.7 ns
 * a column against 5.1 in two loops, the data in the cache). Where the exponentials
 * come two deep, the first stage computes those that read no other (with what they are
 * computed from) and stores them where they are kept for the backward pass anyway, and
 * the second loads them from there, a row's worth just written, and computes the rest.
 * Only where at least two exponentials are in the first stage and one in the second
 * (not the GRU's loop: z and the candidate n each read none other, the reset gates
 * reach n through a product), and every value of the first that the second reads is
 * kept; NULL where the loop stays one (it does in inference too: nothing is kept). */
static const bool *fwd_stages(const Emit *e, const IrFunc *f, const Group *g, int gi) {
  if (e->t != &target_c) return NULL;
  int *depth = arena_alloc(sizeof(int) * (size_t)f->n);
  bool *first = arena_alloc(sizeof(bool) * (size_t)f->n);
  for (int k = 0; k < g->n; k++) { /* members come in the order they are computed */
    int x = g->members[k];
    const IrNode *n = &f->nodes[x];
    if (gone(f, x)) continue;
    for (int i = 0; i < n->nargs; i++)
      if (in_group(f, n->args[i], gi) && !reads_zero(f, n->args[i]) && depth[n->args[i]] > depth[x])
        depth[x] = depth[n->args[i]];
    depth[x] += heavy_op(n->op);
  }
  for (int k = g->n - 1; k >= 0; k--) {
    int x = g->members[k];
    const IrNode *n = &f->nodes[x];
    if (gone(f, x)) continue;
    if (heavy_op(n->op) && depth[x] == 1) first[x] = true;
    for (int i = 0; first[x] && i < n->nargs; i++)
      if (in_group(f, n->args[i], gi) && !reads_zero(f, n->args[i])) first[n->args[i]] = true;
  }
  int one = 0, two = 0;
  for (int k = 0; k < g->n; k++) {
    int x = g->members[k];
    const IrNode *n = &f->nodes[x];
    if (gone(f, x)) continue;
    if (heavy_op(n->op)) first[x] ? one++ : two++;
    if (first[x] && !n->keep && stage_two_reads(f, g, gi, first, x)) return NULL;
  }
  return one >= 2 && two >= 1 ? first : NULL;
}

/* The members computed: every one (`need` NULL, `first` NULL), those `need` marks (the
 * backward loop: the others loaded), or, for a forward loop in two stages (fwd_stages),
 * `first`'s (stage 1) or the others (stage 2, loading what it reads of stage 1's from
 * where stage 1 kept it). */
static void group_compute(const Emit *e, const IrFunc *f, const Group *g, int gi, const bool *need,
                          const bool *first, int stage) {
  for (int k = 0; k < g->n; k++) {
    int x = g->members[k];
    const IrNode *n = &f->nodes[x];
    if ((need && !need[x]) || gone(f, x) || (stage == 1 && !first[x])) continue;
    if (stage == 2 && first[x]) {
      if (stage_two_reads(f, g, gi, first, x)) fprintf(e->out, "      const R v%d = k%d[j];  /* kept by the first loop */\n", x, x);
      continue;
    }
    if (need && loaded(f, x)) {
      fprintf(e->out, "      const R v%d = k%d[j];", x, x);
      if (n->name) fprintf(e->out, "  /* %s */", n->name);
      fputc('\n', e->out);
      continue;
    }
    const char *a = operand(f, n->args[0], gi);
    const char *b = n->nargs > 1 ? operand(f, n->args[1], gi) : "";
    /* an add of what reads as 0 here is its other operand */
    const char *v = ad_rule(op_info[n->op].fwd, "", "", a, b);
    if (n->op == OP_ADD && reads_zero(f, n->args[1])) v = a;
    else if (n->op == OP_ADD && reads_zero(f, n->args[0])) v = b;
    fprintf(e->out, "      const R v%d = %s;", x, v);
    if (n->name) fprintf(e->out, "  /* %s */", n->name);
    fputc('\n', e->out);
  }
}

/* Does a pointer's name (`a9`, `g12_in`...) appear in the body, indexed? */
static bool uses_ptr(const char *body, const char *name) {
  size_t len = strlen(name);
  for (const char *p = body; (p = strstr(p, name)); p++) {
    bool start = p == body || !(p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') || (p[-1] >= '0' && p[-1] <= '9'));
    if (start && p[len] == '[') return true;
  }
  return false;
}

/* The loop around a body already written: only the pointers the body uses (the leaves'
 * part reads less), and nothing at all for an empty body. */
static void loop_around(Emit *e, Loop *l, char *body) {
  if (*body) {
    int k = 0;
    for (int i = 0; i < l->nptrs; i++)
      if (uses_ptr(body, l->ptrs[i].name) || (l->second && uses_ptr(l->second, l->ptrs[i].name)))
        l->ptrs[k++] = l->ptrs[i];
    l->nptrs = k;
    e->t->loop_open(e, l);
    fputs(body, e->out);
    e->t->loop_close(e, l);
  }
  free(body);
  free(l->second);
  free(l->unsplit);
}

/* Homes. A child's state is read by its parent's gather, which copies the child's state
 * row into the parent's gathered buffer (and, backward, adds the gradient there back to
 * the child's). Where vertex function f writes its whole state in fused loops, in place
 * (the scatter copies nothing: every column of the state buffer is the store of one
 * member of a loop), those loops store each row's state twice: at the row, and at its
 * home, cavs_ctx.home_val[r], the columns of the parent's gathered row that the gather
 * would have filled (the runtime's choice: scheduler.c, plan_homes; a scratch row where
 * it has none). The parent's gather then copies nothing for that child; backward, the
 * member's loop adds what the parent left at home_grad[r] to its gradient, and the
 * parent's gather adds nothing back. No row order is needed for it, so it holds for
 * any tree, chain or DAG; a store from registers replaces a copy through memory. A row
 * has up to CV_MAX_HOMES homes (state_homes), each stored and read the same way. */
static bool state_in_loops(const Model *m, const IrFunc *f) {
  int S = f->state_buf;
  if (m->no_homes || f->kind != F_VERTEX || S < 0 || S >= m->nbufs) return false;
  const IrNode *sc = NULL;
  for (int i = 0; i < f->n; i++)
    if (f->nodes[i].op == OP_SCATTER) sc = &f->nodes[i];
  if (!sc) return false;
  const IrNode *a = &f->nodes[sc->args[0]];
  Lin W = m->bufs[S].width;
  if (a->val.kind != PL_ROW || a->val.buf != S || !lin_is_zero(a->val.off) || !lin_eq(a->width, W)) return false;
  /* every value placed in the state: a view of it, a concat of what lies in place, or a
     fused loop's member, the members' columns disjoint and together the state's */
  const IrNode *stored[64];
  int ns = 0;
  Lin total = lin_const(0);
  for (int i = 0; i < f->n; i++) {
    const IrNode *x = &f->nodes[i];
    if ((x->uses == 0 && x->type != T_NONE) || x->val.kind != PL_ROW || x->val.buf != S) continue;
    if (op_info[x->op].kind == OK_SLICE || (x->op == OP_CONCAT && concat_in_place(f, x))) continue;
    if (op_info[x->op].kind != OK_EW || x->group < 0 || x->edge || x->slot || ns == 64) return false;
    for (int k = 0; k < ns; k++)
      if (!lin_le(lin_add(stored[k]->val.off, stored[k]->width), x->val.off) &&
          !lin_le(lin_add(x->val.off, x->width), stored[k]->val.off))
        return false;
    stored[ns++] = x;
    total = lin_add(total, x->width);
  }
  return ns > 0 && lin_eq(total, W);
}

static int gather_src(const Model *m, const IrFunc *f, int k);
static int edge_src(const Model *m, const IrFunc *f);
/* How many homes: as many as there are vertex types that read f's state through a
 * slot or a set (a tagger's chain step is read by the next step and by its word: a
 * home in each), at most CV_MAX_HOMES; none where the loops do not make the whole
 * state, or nothing reads it. */
static int state_homes(const Model *m, const IrFunc *f) {
  if (!state_in_loops(m, f)) return 0;
  int readers = 0;
  for (int t = 0; t < m->nvertex; t++) {
    const IrFunc *g = m->vertex[t];
    bool reads = g->edges && edge_src(m, g) == f->state_buf;
    for (int k = 0; k < g->children && !reads; k++) reads = gather_src(m, g, k) == f->state_buf;
    readers += reads;
  }
  return readers < CV_MAX_HOMES ? readers : CV_MAX_HOMES;
}

/* the buffer gather(k) of f reads: the state of the child's type */
static int gather_src(const Model *m, const IrFunc *f, int k) {
  return m->typed && f->slot_type ? m->vertex[f->slot_type[k]]->state_buf : m->state_buf;
}
/* the state buffer a `children *` vertex's edges read */
static int edge_src(const Model *m, const IrFunc *f) {
  return m->typed ? m->vertex[f->edge_type]->state_buf : m->state_buf;
}

/* Is group gi simpler at the vertices without children: does it read or compute a value
 * that is zero or dead there (fuse.c)? Then it runs as two loops, the leaves' without
 * those (the Tree-LSTM's leaves: no forget gates, no children's cells, no recurrent
 * products), and the rest. */
static bool leaf_simpler(const IrFunc *f, const Group *g) {
  if (f->kind != F_VERTEX) return false;
  for (int k = 0; k < g->n; k++) {
    const IrNode *n = &f->nodes[g->members[k]];
    if (n->zero_leaf || n->dead_leaf) return true;
    for (int j = 0; j < n->nargs; j++)
      if (f->nodes[n->args[j]].zero_leaf || f->nodes[n->args[j]].dead_leaf) return true;
  }
  return false;
}

/* The body of a forward loop: every member (stage 0), or one stage's (fwd_stages). */
static char *fwd_body(Emit *e, const IrFunc *f, const Group *g, int gi, const bool *first, int stage) {
  char *body;
  size_t len;
  FILE *saved = e->out, *o = e->out = emit_hold(&body, &len);
  group_compute(e, f, g, gi, NULL, first, stage);
  for (int k = 0; k < g->n; k++) {
    int x = g->members[k];
    const IrNode *n = &f->nodes[x];
    if (part == LOOP_LEAVES && n->dead_leaf && !dead_stored(f, x)) continue;
    if ((stage == 1 && !first[x]) || (stage == 2 && first[x])) continue;
    /* zero or dead there, stored as 0, unless nothing reads it there; a piece of the
       state at the row's home too, wherever it is stored at the row */
    if (n->val.kind == PL_ROW && !(gone(f, x) && leaves_untouched(f, n->val.buf))) {
      fprintf(o, gone(f, x) ? "      o%d[j] = 0;\n" : "      o%d[j] = v%d;\n", x, x);
      for (int k = 0; k < at_home(e, f, x); k++)
        fprintf(o, "      %s[j] = %s;  /* at home */\n", home_name("h", x, k), gone(f, x) ? "0" : arena_printf("v%d", x));
    }
    /* in the C target only where a backward pass follows (cavs_ctx.keep) */
    if (n->keep && !gone(f, x))
      fprintf(o, e->t == &target_c && !stage ? "      if (keep) k%d[j] = v%d;  /* kept for the backward loop */\n"
                                   : "      k%d[j] = v%d;  /* kept for the backward loop */\n",
              x, x);
  }
  emit_unhold(o);
  e->out = saved;
  return body;
}

static void group_fwd_part(Emit *e, const IrFunc *f, int gi) {
  const Group *g = &f->groups[gi];
  Loop l = group_loop(e, f, gi, false, NULL);
  char *body = fwd_body(e, f, g, gi, NULL, 0);
  const bool *first = fwd_stages(e, f, g, gi);
  if (first) {
    /* training runs the two stages (Loop.second); inference, which keeps nothing, the
       one loop */
    l.unsplit = body;
    l.second = fwd_body(e, f, g, gi, first, 2);
    body = fwd_body(e, f, g, gi, first, 1);
  }
  loop_around(e, &l, body);
}

/* A group's loop, or its two parts where it is simpler at the leaves. */
static void group_parts(Emit *e, const IrFunc *f, int gi, const char *what,
                        void (*one)(Emit *e, const IrFunc *f, int gi)) {
  const Group *g = &f->groups[gi];
  group_header(e, f, g, gi, what);
  if (!leaf_simpler(f, g)) {
    one(e, f, gi);
    return;
  }
  part = LOOP_LEAVES;
  one(e, f, gi);
  part = LOOP_INNER;
  one(e, f, gi);
  part = LOOP_ALL;
}

static void group_fwd(Emit *e, const IrFunc *f, int gi) { group_parts(e, f, gi, "forward", group_fwd_part); }

static void group_bwd_part(Emit *e, const IrFunc *f, int gi) {
  const Group *g = &f->groups[gi];
  bool *need = group_needs(f, g, gi);
  /* outside operands read by a recomputed member or by a derivative rule, and the
     members loaded rather than recomputed (the pointers the body does not use are
     dropped after it is written) */
  bool *reads = arena_alloc(sizeof(bool) * (size_t)f->n);
  for (int k = 0; k < g->n; k++) {
    const IrNode *n = &f->nodes[g->members[k]];
    bool load = loaded(f, g->members[k]) != NULL;
    reads[g->members[k]] = need[g->members[k]] && load;
    for (int i = 0; i < n->nargs; i++) {
      bool used = need[g->members[k]] && !load;
      for (int j = 0; j < n->nargs && n->grad; j++) {
        const char *rule = j == 0 ? op_info[n->op].da : op_info[n->op].db;
        if (f->nodes[n->args[j]].grad && rule_uses(rule, i == 0 ? 'a' : 'b')) used = true;
      }
      if (used && !in_group(f, n->args[i], gi)) reads[n->args[i]] = true;
    }
  }
  Loop l = group_loop(e, f, gi, true, reads);
  char *body;
  size_t len;
  FILE *saved = e->out, *o = e->out = emit_hold(&body, &len);
  group_compute(e, f, g, gi, need, NULL, 0);
  for (int k = 0; k < g->n; k++) {
    int x = g->members[k];
    const IrNode *n = &f->nodes[x];
    if (!n->grad || gone(f, x)) continue;
    if (n->val.kind == PL_ROW && at_home(e, f, x)) {
      fprintf(o, "      R g%d = g%d_in[j]", x, x);
      for (int k = 0; k < at_home(e, f, x); k++) fprintf(o, " + %s[j]", home_name("hg", x, k));
      fprintf(o, ";  /* and what the parents left at home */\n");
    } else if (n->val.kind == PL_ROW) fprintf(o, "      R g%d = g%d_in[j];\n", x, x);
    else fprintf(o, "      R g%d = 0;\n", x);
  }
  /* a gradient this loop alone writes (plan.c: grad_set) is set by its first statement;
     in the leaves' part, the gradients of what is zero or dead there are not formed: they
     are zero, or reach only children that do not exist */
  bool *set = arena_alloc(sizeof(bool) * (size_t)f->n);
  for (int k = g->n - 1; k >= 0; k--) {
    int x = g->members[k];
    const IrNode *n = &f->nodes[x];
    if (!n->grad || gone(f, x)) continue;
    const char *gs = arena_printf("g%d", x), *ys = arena_printf("v%d", x);
    const char *a = operand(f, n->args[0], gi);
    const char *b = n->nargs > 1 ? operand(f, n->args[1], gi) : "";
    for (int j = 0; j < n->nargs; j++) {
      int y = n->args[j];
      const IrNode *ny = &f->nodes[y];
      if (!ny->grad || gone(f, y)) continue;
      const char *rule = ad_rule(j == 0 ? op_info[n->op].da : op_info[n->op].db, gs, ys, a, b);
      if (in_group(f, y, gi)) fprintf(o, "      g%d += %s;\n", y, rule);
      else if (broadcast(f, y, gi) && ny->val.kind == PL_ROW)
        fprintf(o, "      d%d[0] += %s;  /* summed over columns */\n", y, rule);
      else if (ny->grad_set && !set[y]) {
        fprintf(o, "      d%d[j] = %s;  /* this loop alone writes it */\n", y, rule);
        set[y] = true;
      } else if (ny->val.kind == PL_ROW || ny->val.kind == PL_PARAM)
        fprintf(o, "      d%d[j] += %s;%s\n", y, rule, ny->val.kind == PL_PARAM ? "  /* summed over rows */" : "");
    }
  }
  /* the leaves' part drops statements, so a value or gradient may go unused there */
  for (int k = 0; k < g->n && part == LOOP_LEAVES; k++) {
    int x = g->members[k];
    if (gone(f, x)) continue;
    if (need[x]) fprintf(o, "      (void)v%d;\n", x);
    if (f->nodes[x].grad) fprintf(o, "      (void)g%d;\n", x);
  }
  emit_unhold(o);
  e->out = saved;
  loop_around(e, &l, body);
}

static void group_bwd(Emit *e, const IrFunc *f, int gi) {
  const Group *g = &f->groups[gi];
  bool any = false;
  for (int k = 0; k < g->n; k++) any |= f->nodes[g->members[k]].grad;
  if (any) group_parts(e, f, gi, "backward", group_bwd_part);
}

/* ---- products ---- */

typedef struct Prod {
  int left;
  const Place *x;     /* the left operand (stacked: every child's, ld one child's) */
  int stack;          /* stacked: rows per vertex (its children); else 1 */
  const char *label;  /* the left operand, as comments name it */
  const Place *out;   /* the product's output (all columns) */
  Place w;            /* the parameter block (all columns) */
  Lin k, cols;
  const char *what;
  bool left_grad;
  bool dead_leaf; /* the product is dead at the leaves (fuse.c) */
  int line;
} Prod;

static Prod product(const Emit *e, const IrFunc *f, const Unit *u) {
  const Model *m = e->m;
  Prod p = {0};
  p.stack = 1;
  if (u->kind == U_MATMUL && f->merges[u->index].stack) {
    /* row r's children are rows S r .. S r + S - 1 of the matrices with one child's
       width as their stride (plan.c laid the gathers and the outputs out so) */
    const MatMerge *mg = &f->merges[u->index];
    const IrNode *first = &f->nodes[mg->members[0]];
    Place *x = arena_alloc(sizeof *x), *out = arena_alloc(sizeof *out);
    *x = f->nodes[mg->left].val;
    x->ld = ir_child_width(m, f, 0);
    *out = first->val;
    out->ld = mg->cols;
    p.left = mg->left;
    p.x = x;
    p.out = out;
    p.stack = mg->stack;
    p.w = f->nodes[first->args[1]].val;
    p.cols = mg->cols;
    char names[512];
    size_t len = 0;
    for (int k = 0; k < mg->n; k++)
      len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", k ? ";" : "",
                              node_label(f, f->nodes[mg->members[k]].args[0]));
    p.label = arena_printf("[%s]", names);
    p.what = arena_printf("%s @ %s", p.label, f->nodes[first->args[1]].name);
    p.line = first->loc.line;
  } else if (u->kind == U_MATMUL) {
    const MatMerge *mg = &f->merges[u->index];
    const IrNode *first = &f->nodes[mg->members[0]];
    const Param *w = &m->params[f->nodes[first->args[1]].ref];
    p.left = mg->left;
    p.out = &first->val;
    p.w = (Place){.kind = PL_PARAM, .buf = w->pgroup, .off = lin_const(0), .ld = m->pgroups[w->pgroup].cols};
    p.cols = mg->cols;
    char names[512];
    size_t len = 0;
    for (int k = 0; k < mg->n; k++)
      len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", k ? "|" : "",
                              f->nodes[f->nodes[mg->members[k]].args[1]].name);
    p.what = arena_printf("%s @ [%s]", node_label(f, mg->left), names);
    p.line = first->loc.line;
  } else {
    const IrNode *n = &f->nodes[u->index];
    p.left = n->args[0];
    p.out = &n->val;
    p.w = f->nodes[n->args[1]].val;
    p.cols = n->width;
    p.what = arena_printf("%s @ %s", node_label(f, n->args[0]), f->nodes[n->args[1]].name);
    p.line = n->loc.line;
  }
  if (!p.x) p.x = &f->nodes[p.left].val;
  if (!p.label) p.label = node_label(f, p.left);
  p.k = f->nodes[p.left].width;
  p.dead_leaf = f->nodes[u->kind == U_MATMUL ? f->merges[u->index].members[0] : u->index].dead_leaf;
  p.left_grad = f->nodes[p.left].grad && f->nodes[p.left].val.kind == PL_ROW;
  return p;
}

/* The lookup the left operand is, pulled as it is (x = emb[word]) or through a dropout
 * (x = dropout(emb[word], p): a zero row stays zero, and in inference it is the lookup
 * itself); NULL. */
static const IrNode *pulled_lookup(const Emit *e, const IrFunc *f, int left) {
  const IrNode *x = &f->nodes[left];
  if (x->op != OP_PULL) return NULL;
  const IrFunc *pf = e->m->pull;
  const IrNode *src = &pf->nodes[e->m->pulls[x->ref].node];
  if (src->op == OP_DROPOUT) src = &pf->nodes[src->args[0]];
  return src->op == OP_LOOKUP ? src : NULL;
}

/* The int-input slot whose -1 entries make the left operand a zero row (a pulled
 * lookup), or -1. Products then skip those rows: on SST, the internal vertices, half of
 * all rows, have no word. */
static int zero_rows(const Emit *e, const IrFunc *f, int left) {
  const IrNode *src = pulled_lookup(e, f, left);
  return src ? int_slot(e->m, e->m->pull->nodes[src->args[1]].ref) : -1;
}

/* The parameter table the left operand is looked up in (a pulled lookup), its rows, and
 * the run-time test under which the operand's rows are the table's: always where the
 * pull is the lookup itself; through a dropout, where the dropout is read in place (it
 * keeps every value: DropAlias), and in inference (it copies its input); NULL. */
static const Place *lookup_table(const Emit *e, const IrFunc *f, const Place *x, int left, Lin *rows,
                                 const char **when) {
  const IrNode *src = pulled_lookup(e, f, left);
  if (!src) return NULL;
  const IrNode *t = &e->m->pull->nodes[src->args[0]];
  if (t->op != OP_PARAM || t->val.kind != PL_PARAM) return NULL;
  *rows = e->m->params[t->ref].rows;
  const IrFunc *pf = e->m->pull;
  bool dropped = pf->nodes[e->m->pulls[f->nodes[left].ref].node].op == OP_DROPOUT;
  const char *cond = dropped && x->kind == PL_ROW ? alias_if(e, x->buf) : NULL;
  *when = !dropped ? "1" : cond ? cond : "!c->keep";
  return &t->val;
}

/* The vertex type whose state is a looked-up row as it is: it scatters pull() where the
 * pull is a lookup of a parameter table with nothing between (no dropout): Tree-FC's
 * leaves, `scatter(x)` of `x = emb[word]`. Its index input's slot, the table and its
 * rows; -1 where no type is (the first such type where several are). */
static int table_type(const Emit *e, int *input, const Place **table, Lin *rows, Lin *cols) {
  const Model *m = e->m;
  for (int t = 0; t < m->nvertex && m->pull; t++) {
    const IrFunc *f = m->vertex[t];
    for (int i = 0; i < f->n; i++) {
      const IrNode *sc = &f->nodes[i];
      if (sc->op != OP_SCATTER) continue;
      const IrNode *x = &f->nodes[sc->args[0]];
      if (x->op != OP_PULL) break;
      const IrNode *src = &m->pull->nodes[m->pulls[x->ref].node];
      if (src->op != OP_LOOKUP) break;
      const IrNode *tn = &m->pull->nodes[src->args[0]];
      if (tn->op != OP_PARAM || tn->val.kind != PL_PARAM) break;
      *input = int_slot(m, m->pull->nodes[src->args[1]].ref);
      *table = &tn->val;
      *rows = m->params[tn->ref].rows;
      *cols = m->params[tn->ref].cols;
      return t;
    }
  }
  return -1;
}

/* Product p's gathered children where its left operand is child slots 0 .. S-1 side by
 * side (concat(gather(0), gather(1)), or gather(0) alone), each as wide as a state of
 * the table type (table_type): S, the slot's width in *k, the type and its input in
 * *type and *input, the table and its rows; 0 otherwise, and on every target but C's
 * (the CUDA backend multiplies every row: the one product). */
static int kid_table(const Emit *e, const IrFunc *f, const Prod *p, Lin *k, int *type, int *input,
                     const Place **table, Lin *rows) {
  if (strcmp(e->t->name, "c") || f->kind != F_VERTEX || p->stack != 1) return 0;
  const IrNode *l = &f->nodes[p->left];
  int kids = l->op == OP_GATHER ? 1 : l->op == OP_CONCAT ? l->nargs : 0;
  for (int s = 0; s < kids; s++) {
    const IrNode *g = l->op == OP_GATHER ? l : &f->nodes[l->args[s]];
    if (g->op != OP_GATHER || g->ref != s || !lin_eq(g->width, l->op == OP_GATHER ? l->width : f->nodes[l->args[0]].width))
      return 0;
  }
  Lin cols;
  if (!kids || (*type = table_type(e, input, table, rows, &cols)) < 0) return 0;
  *k = l->op == OP_GATHER ? l->width : f->nodes[l->args[0]].width;
  /* (the table's row is a whole state, as wide as a slot) */
  return lin_eq(cols, *k) ? kids : 0;
}

/* The first node added into a (IrNode.accum), or -1 */
static int first_adder(const IrFunc *f, int a) {
  for (int b = 0; b < f->n; b++)
    if (f->nodes[b].accum && f->nodes[b].accum_into == a) return b;
  return -1;
}

/* The product unit (a product, or a merge's first product) that adds into a first and
   may set the rows a product left open in a's columns (one that reads every row), or -1 */
static int closer_of(const Emit *e, const IrFunc *f, int a) {
  int b = first_adder(f, a);
  if (b < 0) return -1;
  const IrNode *bn = &f->nodes[b];
  if (bn->op != OP_MATMUL || (bn->mm >= 0 && f->merges[bn->mm].stack)) return -1;
  int u = bn->mm >= 0 ? f->merges[bn->mm].members[0] : b;
  /* a merge's later product (hs @ Uo of hs @ [Ui|Uo|Uu]) sets its columns where the
     merge's first closes the rows of its own */
  if (u != b && first_adder(f, f->nodes[u].accum_into) != u) return -1;
  return zero_rows(e, f, bn->mm >= 0 ? f->merges[bn->mm].left : bn->args[0]) < 0 ? u : -1;
}

/* The product that adds into product a's place (IrNode.accum; a merge's first member,
 * or a node) where a is y = x W with x a looked-up row, zero at the rows without a word,
 * and can leave those rows for the adding product to set (CAVS_PROD_Y_OPEN and
 * CAVS_PROD_Y_CLOSE) instead of clearing them for it to read back: a of a vertex, one
 * row a vertex, its rows all its own (neither it nor x dead or zero at the leaves), the
 * adding product one row a vertex and its left operand no lookup (its rows with a word
 * would be runs of their own); -1 otherwise. The Tree-LSTM's hs @ [Ui|Uo|Uu] for x @
 * [Wi|Wo|Wu]: SST's inner vertices, half the rows, have no word. */
static int open_closer(const Emit *e, const IrFunc *f, int a) {
  const IrNode *an = &f->nodes[a];
  if (f->kind != F_VERTEX || an->op != OP_MATMUL || an->dead_leaf) return -1;
  int left = an->mm >= 0 ? f->merges[an->mm].left : an->args[0];
  if ((an->mm >= 0 && f->merges[an->mm].stack) || f->nodes[left].zero_leaf || zero_rows(e, f, left) < 0) return -1;
  /* every column left open is set: each of a merge's products has a closer (x @ [Wz|Wn]
     with hs @ Uz and r @ Un added in, or x @ [Wi|Wo|Wu] with hs @ [Ui|Uo|Uu]); x @ [Wg|W2]
     with h @ Ug added into x @ Wg alone leaves W2's columns as it found them */
  if (an->mm >= 0)
    for (int i = 0; i < f->merges[an->mm].n; i++)
      if (closer_of(e, f, f->merges[an->mm].members[i]) < 0) return -1;
  return closer_of(e, f, a);
}

/* Which nodes of f are zero at every vertex without children (fuse.c). */
static const bool *zero_at_leaves(const IrFunc *f) {
  bool *z = arena_alloc(sizeof(bool) * (size_t)f->n);
  for (int i = 0; i < f->n; i++) z[i] = f->nodes[i].zero_leaf;
  return z;
}

/* A product in one of the runtime's three forms: 0: y = x W; 1: dx += dy W^T; 2: dW +=
 * x^T dy (over all rows). When the left operand is zero at the leaves or in the rows
 * without a word, or the product is dead at the leaves (fuse.c), those rows are
 * skipped: they stay zero, or add nothing. */
static void prod_code(Emit *e, const IrFunc *f, const bool *zero, const Unit *u, int form) {
  Prod p = product(e, f, u);
  if (form == 1 && !p.left_grad) return;
  /* a product without a gradient (no loss reaches it: autodiff.c; a merge's members
     have one alike, fuse.c) sends none to its operands */
  if (form != 0 && !f->nodes[u->kind == U_MATMUL ? f->merges[u->index].members[0] : u->index].grad) return;
  const Place *x = p.x;
  GemmCall g = {.form = form, .rows = ROWS_ALL, .index = -1, .cols = p.cols, .k = p.k, .stack = p.stack};
  bool leaves = f->kind == F_VERTEX && (zero[p.left] || p.dead_leaf);
  if (f->kind == F_VERTEX && zero[p.left]) g.rows = ROWS_WITH_CHILDREN;
  else if ((g.index = zero_rows(e, f, p.left)) >= 0) g.rows = leaves ? ROWS_WITH_INDEX_AND_CHILDREN : ROWS_WITH_INDEX;
  else if (leaves) g.rows = ROWS_WITH_CHILDREN;
  /* rows without children not written at all where nothing reads them there */
  if (form == 0 && (g.rows == ROWS_WITH_CHILDREN || g.rows == ROWS_WITH_INDEX_AND_CHILDREN) &&
      leaves_untouched(f, p.out->buf))
    g.form = 3;
  /* added into another value's place (IrNode.accum): y += x W, the rows skipped left as
     they are */
  int me = u->kind == U_MATMUL ? f->merges[u->index].members[0] : u->index;
  const IrNode *first = &f->nodes[me];
  bool accum = first->accum;
  if (form == 0 && accum) g.form = 4;
  /* the first to write the left operand's gradient, in a buffer not cleared: sets it */
  if (form == 1 && first->dx_set) g.form = 5;
  if (g.index >= 0 && p.stack == 1 && g.form != 4) g.table = lookup_table(e, f, x, p.left, &g.table_rows, &g.table_if);
  /* rows without a word left for the product that adds into this one to set (it reads
     the word's index for that) */
  bool opens = form == 0 && g.form == 0 && g.rows == ROWS_WITH_INDEX && p.stack == 1 && open_closer(e, f, me) >= 0;
  bool closes = form == 0 && accum && p.stack == 1 && open_closer(e, f, first->accum_into) == me;
  if (opens) g.form = 6;
  if (closes) {
    const IrNode *a = &f->nodes[first->accum_into];
    g.form = 7, g.index = zero_rows(e, f, a->mm >= 0 ? f->merges[a->mm].left : a->args[0]);
  }
  /* over gathered children some of which may be looked-up rows: each distinct one
     multiplied once (not where the product sets dx: the rows of an index past its first
     would be left as they were; nor where it closes the rows a looked-up row's product
     left open: it sets them by that product's index, which cavs_gemm_kids does not take) */
  if (g.index < 0 && g.form != 5 && g.form != 7 && (g.rows == ROWS_ALL || g.rows == ROWS_WITH_CHILDREN) &&
      (g.kids = kid_table(e, f, &p, &g.kid_k, &g.kid_type, &g.kid_input, &g.table, &g.table_rows)))
    g.table_if = "1";
  static const char *const fwd[] = {"", ", rows without children stay zero", ", rows without a word stay zero",
                                    ", rows without a word or children stay zero"};
  static const char *const input[] = {"", ", rows with children", ", rows with a word", ", rows with a word and children"};
  static const char *const param[] = {"over all rows", "over all rows with children", "over all rows with a word",
                                      "over all rows with a word and children"};
  const char *left = p.label;
  if (form == 0 && accum) {
    /* (what it adds into: a product, or merged products, named as their code is) */
    int into = first->accum_into;
    const IrNode *a = &f->nodes[into];
    const char *what = a->op != OP_MATMUL ? node_label(f, into)
                                         : product(e, f, &(Unit){a->mm >= 0 ? U_MATMUL : U_NODE, a->mm >= 0 ? a->mm : into, a->cls}).what;
    fprintf(e->out, "  /* line %d  %s: [n, %s], added into %s%s%s */\n", p.line, p.what, wstr(e->m, p.cols), what,
            input[g.rows], closes ? " (set at the rows without a word, which that left open)" : "");
  } else if (form == 0)
    fprintf(e->out, "  /* line %d  %s: [n, %s]%s */\n", p.line, p.what, wstr(e->m, p.cols),
            g.form == 3 ? (g.rows == ROWS_WITH_CHILDREN ? ", rows with children (nothing reads the others)"
                                                         : ", rows with children (nothing reads the others); rows "
                                                           "without a word stay zero")
            : opens ? ", rows without a word left open (the product added into it sets them)"
                    : fwd[g.rows]);
  else if (form == 1)
    fprintf(e->out, "  /* line %d  d%s %s d(%s) W^T%s%s */\n", p.line, left, g.form == 5 ? "=" : "+=", p.what,
            input[g.rows], g.form == 5 ? " (the first to write it)" : "");
  else fprintf(e->out, "  /* line %d  dW += %s^T d(%s), %s */\n", p.line, left, p.what, param[g.rows]);
  /* the operands in the runtime's names: y = x W, y += x W^T, W += x^T y */
  g.x = (Ref){form == 1 ? p.out : x, form == 1};
  g.w = (Ref){&p.w, form == 2};
  g.y = (Ref){form == 1 ? x : p.out, form != 0};
  e->t->gemm(e, &g);
}

/* ---- single nodes ---- */

static int loss_index(const IrFunc *f, int i) {
  int k = 0;
  for (int j = 0; j < i; j++) k += op_info[f->nodes[j].op].kind == OK_LOSS;
  return k;
}

/* An expert's bias row (erow) that its expert's product adds into (IrNode.accum, `... @
 * W[e] + b[e]`): the product writes it, bias row and all, in one operation
 * (cavs_emm_fwd's bias), and sums its gradient too (cavs_emm_bwd's dbias, from the
 * product's dy, which is the erow's gradient), so the erow itself emits nothing. */
static const IrNode *emm_bias(const IrFunc *f, const IrNode *n) {
  if (n->op != OP_EMM || !n->accum) return NULL;
  const IrNode *into = &f->nodes[n->accum_into];
  return into->op == OP_EROW ? into : NULL;
}
static bool erow_in_product(const IrFunc *f, int i) {
  for (int k = 0; k < f->n; k++)
    if (emm_bias(f, &f->nodes[k]) == &f->nodes[i]) return true;
  return false;
}

/* The runtime's name for activation op (an expert's product's IrNode.act, plan.c), or
 * for none */
static const char *act_name(Op op) {
  switch (op) {
  case OP_RELU: return "CAVS_ACT_RELU";
  case OP_TANH: return "CAVS_ACT_TANH";
  case OP_SIGMOID: return "CAVS_ACT_SIGMOID";
  default: return "CAVS_ACT_NONE";
  }
}
/* The activation a product's left operand is, where its producer applies it (a view of
   that product's place: plan.c's act_product): the product's dx is its operand's
   gradient, the derivative applied (cavs_emm_bwd's dx_act); else none */
static Op dx_act(const IrNode *a) {
  return a->same && (a->op == OP_RELU || a->op == OP_TANH || a->op == OP_SIGMOID) ? a->op : 0;
}

/* A mixture of experts' op over the stage's rows r0..r0+n-1 and their K slots each (the
 * runtime's routing `route`: which expert and row each slot has, grouped by expert). A
 * slot value's place has the slot's width as its stride: slot s at row s. Backward,
 * NULL for a gradient nothing takes. */
static void moe_code(Emit *e, const IrFunc *f, int i, bool bwd) {
  const Model *m = e->m;
  const IrNode *n = &f->nodes[i];
  const IrNode *a = &f->nodes[n->args[0]];
  const IrNode *b = n->nargs > 1 ? &f->nodes[n->args[1]] : NULL;
  const char *rk = arena_printf("%d, %d", f->route_id, f->route_k);
  const char *X = emit_lin(m, f->nodes[f->route].width);
#define P(node, g) emit_ptr(e, (Ref){&(node)->val, (g)}, "0"), emit_ld(e, &(node)->val)
#define GP(node)                                                                                          \
  ((node)->grad && ((node)->val.kind == PL_ROW || (node)->val.kind == PL_PARAM) ? emit_ptr(e, (Ref){&(node)->val, true}, "0") \
                                                                                : "NULL")
  switch (n->op) {
  case OP_TOPK: {
    /* the load-balancing loss's weight: a number, or the option's value at run time */
    const char *bal = b->ref ? arena_printf("c->opt[%d] /* %s */", b->ref - 1, m->options[b->ref - 1].name)
                             : arena_printf("%.17g", b->cval);
    if (!bwd)
      fprintf(e->out, "  cavs_topk_fwd(c, %s, %s, %s, %s, %s, %s, %s, r0, n);\n", rk, X, bal, P(a, false), P(n, false));
    else if (a->grad)
      fprintf(e->out, "  cavs_topk_bwd(c, %s, %s, %s, %s, %s, %s, %s,\n                %s, %s, %s, %s, r0, n);\n", rk, X, bal,
              P(a, false), P(n, false), emit_ptr(e, (Ref){&n->val, true}, "0"), emit_ld(e, &n->val),
              emit_ptr(e, (Ref){&a->val, true}, "0"), emit_ld(e, &a->val));
    return;
  }
  case OP_SBCAST:
    if (!bwd) fprintf(e->out, "  cavs_sbcast_fwd(c, %s, %s, %s, %s, %s, %s, r0, n);\n", rk, P(a, false), P(n, false), emit_lin(m, n->width));
    else if (a->grad && a->val.kind == PL_ROW)
      fprintf(e->out, "  cavs_sbcast_bwd(c, %s, %s, %s, %s, %s, %s, r0, n);\n", rk, P(a, true), P(n, true), emit_lin(m, n->width));
    return;
  case OP_EROW:
    if (erow_in_product(f, i)) {
      fprintf(e->out, "  /* (summed into its expert's product: cavs_emm_%s's %s) */\n", bwd ? "bwd" : "fwd", bwd ? "dbias" : "bias");
      return;
    }
    if (!bwd) fprintf(e->out, "  cavs_erow_fwd(c, %s, %s, %s, %s, %s, %s, r0, n);\n", rk, P(a, false), P(n, false), emit_lin(m, n->width));
    else fprintf(e->out, "  cavs_erow_bwd(c, %s, %s, %s, %s, %s, %s, r0, n);\n", rk, P(a, true), P(n, true), emit_lin(m, n->width));
    return;
  case OP_EMM: {
    Lin A, B;
    int d = ir_product_dim(m, m->params[b->ref].cols);
    A = lin_dim(m->dims[d].fa, 1);
    B = lin_dim(m->dims[d].fb, 1);
    const char *ab = arena_printf("%s, %s", emit_lin(m, A), emit_lin(m, B));
    /* (added into another value's place: IrNode.accum; a bias row's: emm_bias) */
    const IrNode *eb = emm_bias(f, n), *bt = eb ? &f->nodes[eb->args[0]] : NULL;
    /* (an activation applied as it stores: IrNode.act; its derivative on dx: dx_act) */
    if (!bwd)
      fprintf(e->out, "  cavs_emm_fwd(c, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %d, %s, r0, n);\n", rk, ab, P(a, false),
              P(b, false), bt ? emit_ptr(e, (Ref){&bt->val, false}, "0") : "NULL", bt ? emit_ld(e, &bt->val) : "0",
              P(n, false), bt ? 0 : n->accum, act_name(n->act));
    else
      fprintf(e->out, "  cavs_emm_bwd(c, %s, %s, %s, %s, %s, %s,\n               %s, %s, %s, %s, %d, %s, %s, %s, %s, %s, r0, n);\n", rk,
              ab, P(a, false), P(b, false), P(n, true),
              a->grad && a->val.kind == PL_ROW ? emit_ptr(e, (Ref){&a->val, true}, "0") : "NULL", emit_ld(e, &a->val),
              a->grad_set, act_name(dx_act(a)), GP(b), emit_ld(e, &b->val), bt ? GP(bt) : "NULL", bt ? emit_ld(e, &bt->val) : "0");
    return;
  }
  case OP_SCOMB:
    if (!bwd)
      fprintf(e->out, "  cavs_scomb_fwd(c, %s, %s, %s, %s, %s, %s, %s, %s, %s, r0, n);\n", rk, X, P(a, false), P(b, false),
              P(n, false), emit_lin(m, n->width));
    else
      fprintf(e->out, "  cavs_scomb_bwd(c, %s, %s, %s, %s, %s, %s, %s, %s,\n                 %s, %s, %d, %s, %s, %s, r0, n);\n",
              rk, X, P(a, false), P(b, false), P(n, true), a->grad && a->val.kind == PL_ROW ? emit_ptr(e, (Ref){&a->val, true}, "0") : "NULL",
              emit_ld(e, &a->val), a->grad_set, GP(b), emit_ld(e, &b->val), emit_lin(m, n->width));
    return;
  default: unreachable();
  }
#undef P
#undef GP
}

/* The salt of node i of f: the block and the node, which a dropout's mask and a noise's
   draws are keyed by beside the row and the column */
static unsigned drop_salt(const IrFunc *f, int i) {
  return (unsigned)((f->kind == F_PULL ? 0 : f->kind == F_PUSH ? 1 : 2 + f->index) * 100003 + i);
}

/* noise(x) forward, or its backward (dy to dx): x times normal draws of its row's key,
   the salt and the column (cavs_noise_z), in training; 0 in inference */
static void noise_code(Emit *e, const IrFunc *f, int i, bool bwd) {
  const IrNode *n = &f->nodes[i], *a = &f->nodes[n->args[0]];
  if (bwd && !a->grad) return;
  const IrNode *from = bwd ? n : a, *to = bwd ? a : n; /* backward: dy to dx */
  fprintf(e->out, "  cavs_noise_%s(c, %uu, %s, %s, %s, %s, %s, r0, n);\n", bwd ? "bwd" : "fwd", drop_salt(f, i),
          emit_ptr(e, (Ref){&from->val, bwd}, "0"), emit_ld(e, &from->val), emit_ptr(e, (Ref){&to->val, bwd}, "0"),
          emit_ld(e, &to->val), emit_lin(e->m, n->width));
}

/* dropout(x, p) forward, or its backward (dy to dx) */
static void dropout_code(Emit *e, const IrFunc *f, int i, bool bwd) {
  const Model *m = e->m;
  const IrNode *n = &f->nodes[i];
  const IrNode *a = n->nargs > 0 ? &f->nodes[n->args[0]] : NULL;
  const IrNode *b = n->nargs > 1 ? &f->nodes[n->args[1]] : NULL;
  /* the mask of a row is drawn from its vertex's key (cavs_ctx.rkey), this node (the
     salt: the block and the node) and the column: the same however rows are batched */
  if (bwd && !a->grad) return;
  unsigned salt = drop_salt(f, i);
  const IrNode *from = bwd ? n : a, *to = bwd ? a : n; /* backward: dy to dx */
  /* a named probability: the option's value at run time (cavs_ctx.opt) */
  const char *p = b->ref ? arena_printf("c->opt[%d] /* %s */", b->ref - 1, m->options[b->ref - 1].name)
                         : arena_printf("%.17g", b->cval);
  /* read in place where it keeps every value (drop_aliases): then nothing to do */
  const char *cond = n->val.kind == PL_ROW ? alias_if(e, n->val.buf) : NULL;
  if (cond && !strcmp(cond, "1")) return;
  e->no_alias = true;
  fprintf(e->out, "  %scavs_dropout_%s(c, %uu, %s, %s, %s, %s, %s, %s, r0, n);\n",
          cond ? arena_printf("if (%s) /* else its readers read its input */\n    ",
                              strcmp(cond, "!c->keep") ? arena_printf("!%s", cond) : "c->keep")
               : "",
          bwd ? "bwd" : "fwd",
          salt, p, emit_ptr(e, (Ref){&from->val, bwd}, "0"), emit_ld(e, &from->val),
          emit_ptr(e, (Ref){&to->val, bwd}, "0"), emit_ld(e, &to->val), emit_lin(m, n->width));
  e->no_alias = false;
}

/* mv(x, M) and mm(M, W): the runtime's row-by-row products */
static void rowmat_code(Emit *e, const IrFunc *f, int i, bool bwd) {
  const Model *m = e->m;
  const IrNode *n = &f->nodes[i];
  const IrNode *a = n->nargs > 0 ? &f->nodes[n->args[0]] : NULL;
  const IrNode *b = n->nargs > 1 ? &f->nodes[n->args[1]] : NULL;
  /* a matrix [A, B] per row (row-major in a row of a product dim's width): the
     runtime's row-by-row products; backward, every gradient in one call (NULL where
     an operand takes none) */
  Lin A, B, C;
  ir_rmat_shape(m, f, n, &A, &B, &C);
  const char *dims = n->op == OP_MV ? arena_printf("%s, %s", emit_lin(m, A), emit_lin(m, B))
                                    : arena_printf("%s, %s, %s", emit_lin(m, A), emit_lin(m, B), emit_lin(m, C));
  const char *ops = arena_printf("%s, %s, %s, %s", emit_ptr(e, (Ref){&a->val, false}, "0"), emit_ld(e, &a->val),
                                 emit_ptr(e, (Ref){&b->val, false}, "0"), emit_ld(e, &b->val));
  const char *fn = n->op == OP_MV ? "rowmv" : "rowmm";
  if (!bwd) {
    fprintf(e->out, "  cavs_%s_fwd(c, %s, %s, %s, %s, r0, n);\n", fn, dims, ops, emit_ptr(e, (Ref){&n->val, false}, "0"),
            emit_ld(e, &n->val));
  return;
  }
  const char *da = a->grad && a->val.kind == PL_ROW ? emit_ptr(e, (Ref){&a->val, true}, "0") : "NULL";
  const char *db = b->grad && (b->val.kind == PL_ROW || b->val.kind == PL_PARAM) ? emit_ptr(e, (Ref){&b->val, true}, "0") : "NULL";
  fprintf(e->out, "  cavs_%s_bwd(c, %s, %s,\n                %s, %s, %s, %s, %s, %s, r0, n);\n", fn, dims, ops,
          emit_ptr(e, (Ref){&n->val, true}, "0"), emit_ld(e, &n->val), da, emit_ld(e, &a->val), db, emit_ld(e, &b->val));
}

/* concat(...): each operand copied to its columns unless it was placed there */
static void concat_code(Emit *e, const IrFunc *f, int i, bool bwd) {
  const IrNode *n = &f->nodes[i];
  Lin off = lin_const(0);
  for (int k = 0; k < n->nargs; k++) {
    const IrNode *x = &f->nodes[n->args[k]];
    Place at = n->val;
    at.off = lin_add(at.off, off);
    bool placed = x->val.kind == PL_ROW && x->val.buf == at.buf && lin_eq(x->val.off, at.off);
    if (!placed && !bwd) e->t->copy(e, (Ref){&at, false}, (Ref){&x->val, false}, x->width, false);
    if (!placed && bwd && x->grad && x->val.kind == PL_ROW)
      e->t->copy(e, (Ref){&x->val, true}, (Ref){&at, true}, x->width, true);
    off = lin_add(off, x->width);
  }
}

/* scatter(x) and push(x): x copied to the state or the pushed columns */
static void copy_out_code(Emit *e, const IrFunc *f, int i, bool bwd) {
  const Model *m = e->m;
  const IrNode *n = &f->nodes[i];
  const IrNode *a = &f->nodes[n->args[0]];
  int buf = n->op == OP_SCATTER ? f->state_buf : m->push_buf;
  Place to = {.kind = PL_ROW, .buf = buf, .off = n->op == OP_SCATTER ? lin_const(0) : m->push_off,
              .ld = m->bufs[buf].width};
  if (!bwd) e->t->copy(e, (Ref){&to, false}, (Ref){&a->val, false}, a->width, false);
  else if (a->grad && a->val.kind == PL_ROW) e->t->copy(e, (Ref){&a->val, true}, (Ref){&to, true}, a->width, true);
}

static void node_code(Emit *e, const IrFunc *f, int i, bool bwd) {
  const Model *m = e->m;
  const IrNode *n = &f->nodes[i];
  const IrNode *a = n->nargs > 0 ? &f->nodes[n->args[0]] : NULL;
  const IrNode *b = n->nargs > 1 ? &f->nodes[n->args[1]] : NULL;
  /* a value without a gradient sends none back (no loss reaches it: autodiff.c) */
  if (bwd && n->type == T_ROW && !n->grad) return;
  fprintf(e->out, "  /* %s  %s%s%s */\n", src_comment(e, n), n->name ? n->name : "",
          n->name ? " = " : "", op_info[n->op].name);
  switch (n->op) {
  case OP_GATHER: e->t->gather(e, n->ref, gather_src(m, f, n->ref), (Ref){&n->val, bwd}, bwd); return;
  case OP_ECHILD:
    fprintf(e->out, "  cavs_echild_%s(c, %d, %s, %s, r0, n);\n", bwd ? "bwd" : "fwd", edge_src(m, f),
            emit_ptr(e, (Ref){&n->val, bwd}, "0"), emit_ld(e, &n->val));
    return;
  case OP_DROPOUT: dropout_code(e, f, i, bwd); return;
  case OP_NOISE: noise_code(e, f, i, bwd); return;
  case OP_MV:
  case OP_MM: rowmat_code(e, f, i, bwd); return;
  case OP_EBCAST:
  case OP_ESUM:
    /* ebcast: the vertex's row to each of its edges; esum: its edges' rows summed (the
       runtime's edge lists of rows r0..r0+n); backward, the gradients the other way */
    if (bwd && !a->grad) return;
    fprintf(e->out, "  cavs_%s_%s(c, %s, %s, %s, %s, %s, r0, n);\n", n->op == OP_EBCAST ? "ebcast" : "esum",
            bwd ? "bwd" : "fwd", emit_ptr(e, (Ref){&a->val, bwd}, "0"), emit_ld(e, &a->val),
            emit_ptr(e, (Ref){&n->val, bwd}, "0"), emit_ld(e, &n->val), emit_lin(m, n->width));
    return;
  case OP_LOOKUP:
    e->t->lookup(e, (Ref){&a->val, bwd}, int_slot(m, b->ref), (Ref){&n->val, bwd}, n->width, bwd);
    return;
  case OP_TOPK:
  case OP_SBCAST:
  case OP_EMM:
  case OP_EROW:
  case OP_SCOMB:
    moe_code(e, f, i, bwd);
    return;
  case OP_CONCAT: concat_code(e, f, i, bwd); return;
  case OP_SCATTER:
  case OP_PUSH: copy_out_code(e, f, i, bwd); return;
  case OP_XENT:
  case OP_MSE: {
    LossCall l = {.op = n->op, .index = loss_index(f, i), .a = &a->val, .width = a->width, .bwd = bwd};
    l.t = b->type == T_INPUT ? NULL : &b->val;
    l.label = b->type == T_INPUT ? int_slot(m, b->ref) : -1;
    if (!bwd || a->grad) e->t->loss(e, &l);
    /* mse's target, where it is computed from parameters too: its gradient is the
       prediction's negated, 2 (t - p) / (rows * width), the same call with the two
       swapped (cv_mse_grad(t, p) is exactly -cv_mse_grad(p, t)) */
    if (bwd && n->op == OP_MSE && b->type == T_ROW && b->grad) {
      LossCall lt = l;
      lt.a = &b->val, lt.t = &a->val;
      e->t->loss(e, &lt);
    }
    return;
  }
  default: internal_error(__FILE__, __LINE__, "no code for %s", op_info[n->op].name);
  }
}

/* Whether a unit runs over edge rows (a fused group, a product or a concat of edge
 * values): between edge_scope's braces r0 and n are the edges of the stage's rows. The
 * edge ops themselves (echild, ebcast, esum) take the vertex rows. */
static const IrNode *unit_first(const IrFunc *f, const Unit *u) {
  if (u->kind == U_GROUP) return &f->nodes[f->groups[u->index].members[0]];
  if (u->kind == U_MATMUL) return &f->nodes[f->merges[u->index].left];
  return &f->nodes[u->index];
}
static bool unit_on_edges(const IrFunc *f, const Unit *u) {
  const IrNode *x = unit_first(f, u);
  return x->edge && (u->kind != U_NODE || op_info[x->op].kind != OK_EDGE);
}
/* Likewise on the slots of a mixture of experts, the K of each row side by side: the
 * stage's are K r0 .. K (r0 + n) - 1. Its own ops take the vertex rows. */
static bool unit_on_slots(const IrFunc *f, const Unit *u) {
  const IrNode *x = unit_first(f, u);
  return x->slot && (u->kind != U_NODE || op_info[x->op].kind != OK_MOE);
}
/* scope 0: the stage's rows; 1: their edges; 2: their slots */
static int unit_scope(const IrFunc *f, const Unit *u) { return unit_on_edges(f, u) ? 1 : unit_on_slots(f, u) ? 2 : 0; }
static void edge_scope(Emit *e, const IrFunc *f, int *open, int want) {
  if (*open == want) return;
  if (*open) fputs("    }\n  }\n", e->out);
  if (want == 1)
    fputs("  { /* on the edges of rows [r0, r0 + n): they are rows [r0, r0 + n) of the edge buffers here */\n"
          "    const int e0_ = c->eoff[r0], en_ = c->eoff[r0 + n] - e0_;\n"
          "    {\n      const int r0 = e0_, n = en_;\n      (void)r0; (void)n;\n",
          e->out);
  else if (want == 2)
    fprintf(e->out, "  { /* on the %d slots of each of rows [r0, r0 + n): they are rows [r0, r0 + n) of the slot values here */\n"
                    "    int s0_, sn_;\n    cavs_slots(c, %d, %d, r0, n, &s0_, &sn_);\n"
                    "    {\n      const int r0 = s0_, n = sn_;\n      (void)r0; (void)n;\n",
            f->route_k, f->route_id, f->route_k);
  *open = want;
}

static void unit_code(Emit *e, const IrFunc *f, const bool *zero, const Unit *u, bool bwd) {
  if (u->kind == U_GROUP) {
    if (bwd) group_bwd(e, f, u->index);
    else group_fwd(e, f, u->index);
  } else if (u->kind == U_MATMUL || f->nodes[u->index].op == OP_MATMUL) {
    prod_code(e, f, zero, u, bwd ? 1 : 0);
  } else {
    node_code(e, f, u->index, bwd);
  }
}

/* ---- functions ---- */

/* One stage: the units of class `cls` (all units when cls < 0), in order forward and in
 * reverse backward; with `params`, then every parameter gradient of the block's products. */
static void stage(Emit *e, const IrFunc *f, const bool *zero, const char *name, const char *what, int cls, bool bwd,
                  bool params) {
  e->t->fn_open(e, name, what);
  int open = 0;
  if (!bwd) {
    for (int u = 0; u < f->nunits; u++)
      if (cls < 0 || f->units[u].cls == (Class)cls) {
        edge_scope(e, f, &open, unit_scope(f, &f->units[u]));
        unit_code(e, f, zero, &f->units[u], false);
      }
  } else {
    for (int u = f->nunits - 1; u >= 0; u--)
      if (cls < 0 || f->units[u].cls == (Class)cls) {
        edge_scope(e, f, &open, unit_scope(f, &f->units[u]));
        unit_code(e, f, zero, &f->units[u], true);
      }
    if (params)
      for (int u = 0; u < f->nunits; u++) {
        const Unit *un = &f->units[u];
        if (un->kind == U_MATMUL || (un->kind == U_NODE && f->nodes[un->index].op == OP_MATMUL)) {
          edge_scope(e, f, &open, unit_scope(f, un));
          prod_code(e, f, zero, un, 2);
        }
      }
  }
  edge_scope(e, f, &open, 0);
  e->t->fn_close(e);
}

static const char *fname(const Emit *e, const IrFunc *f, const char *stage_) {
  return arena_printf("%s_%s_%s", e->m->name, f->kind == F_VERTEX ? f->name : f->kind == F_PULL ? "pull" : "push", stage_);
}

/* Whether a vertex function has a lazy phase: a unit of code of that class (a push
   whose value lies where the push block reads it has none). Without, its lazy stages
   are not written and the descriptor's are NULL, which tells the runtime that the
   values of a type's rows are complete once its path task has run: the push block may
   then run right after it (scheduler.c, cavs_plan_forward). */
static bool has_lazy(const IrFunc *f) {
  for (int u = 0; u < f->nunits; u++)
    if (f->units[u].cls == CLS_LAZY) return true;
  return false;
}

/* ---- the descriptor ---- */

static void desc_lin(FILE *o, Lin l) {
  fprintf(o, "{%d, {", l.k);
  int last = CV_MAX_DIMS - 1;
  while (last > 0 && !l.c[last]) last--;
  for (int i = 0; i <= last; i++) fprintf(o, "%s%d", i ? ", " : "", l.c[i]);
  fprintf(o, "}}");
}

/* The integer-input slot of a parameter block that is only ever a lookup table indexed
 * by that one input, or -1. */
static int sparse_input(const Model *m, int group) {
  int slot = -1, n;
  ParamUse *u = param_uses(m, &n);
  for (int k = 0; k < n; k++) {
    if (m->params[u[k].param].pgroup != group) continue;
    int s = u[k].user->op == OP_LOOKUP && u[k].arg == 0 ? int_slot(m, u[k].f->nodes[u[k].user->args[1]].ref) : -1;
    if (s < 0 || (slot >= 0 && slot != s)) {
      slot = -1;
      break;
    }
    slot = s;
  }
  free(u);
  return slot;
}

/* Whether a parameter block is one mixture of experts' table alone: its one parameter,
 * as wide as the block, read only as the matrix of an expert's product (emm). */
static bool experts_table(const Model *m, int group) {
  int params = 0, n;
  for (int i = 0; i < m->nparams; i++)
    if (m->params[i].pgroup == group) {
      params++;
      if (!lin_is_zero(m->params[i].col_off) || !lin_eq(m->params[i].cols, m->pgroups[group].cols)) return false;
    }
  ParamUse *u = param_uses(m, &n);
  bool any = false, only = params == 1;
  for (int k = 0; k < n && only; k++) {
    if (m->params[u[k].param].pgroup != group) continue;
    any = true;
    only = u[k].user->op == OP_EMM && u[k].arg == 1;
  }
  free(u);
  return any && only;
}

static bool word_char(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '.'; }

/* The model's identity, which a checkpoint records: FNV-1a of the source's tokens, not
 * of its text, so that editing a comment or the layout keeps a checkpoint usable. The
 * text is hashed without its comments (# or // to the end of the line) and without
 * white space, but for one space where white space separates two characters of words
 * or numbers ("a b" is not "ab"; "a+b" is "a + b"). */
static unsigned long long model_hash(const char *s, size_t n) {
  unsigned long long h = 1469598103934665603ull;
  char last = 0; /* the last character hashed */
  bool gap = false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '#' || (c == '/' && i + 1 < n && s[i + 1] == '/')) {
      while (i < n && s[i] != '\n') i++;
      gap = true;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
      gap = true;
      continue;
    }
    if (gap && word_char(last) && word_char(c)) h = (h ^ (unsigned char)' ') * 1099511628211ull;
    gap = false;
    h = (h ^ (unsigned char)c) * 1099511628211ull;
    last = c;
  }
  return h;
}

/* The descriptor's kinds by their names in cavs_abi.h, indexed by the compiler's enums
 * (DimKind, InputKind, InitKind), which keep the same order. */
static const char *const dim_kind[] = {"CAVS_DIM_FIXED", "CAVS_DIM_VOCAB", "CAVS_DIM_FREE", "CAVS_DIM_PRODUCT"};
static const char *const input_kind[] = {"CAVS_IN_INDEX", "CAVS_IN_CLASS", "CAVS_IN_REAL"};
static const char *const init_kind[] = {"CAVS_INIT_ZEROS", "CAVS_INIT_CONSTANT", "CAVS_INIT_UNIFORM",
                                        "CAVS_INIT_NORMAL", "CAVS_INIT_XAVIER", "CAVS_INIT_IDENTITY",
                                        "CAVS_INIT_IDENTITY_ROWS", "CAVS_INIT_XAVIER_ROWS"};
_Static_assert(DIM_PRODUCT == 3 && IN_REAL == 2 && INIT_XAVIER_ROWS == 7, "one name per kind");

/* static const unsigned char NAME[] = {a flag a parameter group} */
static void grad_flags(const Emit *e, const char *name, const unsigned char *flags) {
  fprintf(e->out, "static const unsigned char %s[%d] = {", name, e->m->npgroups + 1);
  for (int g = 0; g < e->m->npgroups; g++) fprintf(e->out, "%s%d", g ? ", " : "", flags[g]);
  fprintf(e->out, "%s};\n", e->m->npgroups ? "" : "0");
}

/* descriptor's parts, in the order the generated file holds them: the dims and options */
static void desc_dims_options(const Emit *e) {
  const Model *m = e->m;
  FILE *c = e->out;
  fprintf(c, m->ndims ? "\nstatic const cavs_dim_desc dims[] = {\n" : "\nstatic const cavs_dim_desc dims[1] = {0};\n");
  for (int i = 0; i < m->ndims; i++)
    fprintf(c, "  {%s, %s, %ld, %d, %d, %d},\n", emit_c_string(m->dims[i].name), dim_kind[m->dims[i].kind],
            m->dims[i].value, m->dims[i].input, m->dims[i].kind == DIM_PRODUCT ? m->dims[i].fa : 0,
            m->dims[i].kind == DIM_PRODUCT ? m->dims[i].fb : 0);
  if (m->ndims) fprintf(c, "};\n");
  fprintf(c, m->noptions ? "static const cavs_option_desc options[] = {\n"
                         : "static const cavs_option_desc options[1] = {0};\n");
  for (int i = 0; i < m->noptions; i++)
    fprintf(c, "  {%s, %s, %.17g},\n", emit_c_string(m->options[i].name),
            m->options[i].kind == OPT_CLIP      ? "CAVS_OPTION_CLIP"
            : m->options[i].kind == OPT_BALANCE ? "CAVS_OPTION_BALANCE"
                                                : "CAVS_OPTION_DROPOUT", m->options[i].value);
  if (m->noptions) fprintf(c, "};\n");
}

/* the inputs: *nint index inputs and *nreal real ones */
static void desc_inputs(const Emit *e, int *nint_out, int *nreal_out) {
  const Model *m = e->m;
  FILE *c = e->out;
  fprintf(c, m->ninputs ? "static const cavs_input_desc inputs[] = {\n" : "static const cavs_input_desc inputs[1] = {0};\n");
  int nint = 0, nreal = 0;
  for (int i = 0; i < m->ninputs; i++) {
    const Input *in = &m->inputs[i];
    fprintf(c, "  {%s, %s, ", emit_c_string(in->name), input_kind[in->kind]);
    desc_lin(c, in->width);
    fprintf(c, ", %d},\n", in->kind == IN_REAL ? real_slot(m, i) : int_slot(m, i));
    if (in->kind == IN_REAL) nreal++;
    else nint++;
  }
  if (m->ninputs) fprintf(c, "};\n");
  *nint_out = nint, *nreal_out = nreal;
}

/* the parameters and their groups */
static void desc_params(const Emit *e) {
  const Model *m = e->m;
  FILE *c = e->out;
  fprintf(c, m->nparams ? "static const cavs_param_desc params[] = {\n" : "static const cavs_param_desc params[1] = {0};\n");
  for (int i = 0; i < m->nparams; i++) {
    const Param *p = &m->params[i];
    fprintf(c, "  {%s, %d, ", emit_c_string(p->name), p->rank);
    desc_lin(c, p->rank == 2 ? p->rows : lin_const(1));
    fputs(", ", c);
    desc_lin(c, p->cols);
    fprintf(c, ", %d, ", p->pgroup);
    desc_lin(c, p->col_off);
    fprintf(c, ", %s, %.17g, %.17g},\n", init_kind[p->init], p->a, p->b);
  }
  if (m->nparams) fprintf(c, "};\n");
  fprintf(c, m->npgroups ? "static const cavs_pgroup_desc pgroups[] = {\n" : "static const cavs_pgroup_desc pgroups[1] = {0};\n");
  for (int i = 0; i < m->npgroups; i++) {
    fputs("  {", c);
    desc_lin(c, m->pgroups[i].rows);
    fputs(", ", c);
    desc_lin(c, m->pgroups[i].cols);
    fprintf(c, ", %d, %d},\n", sparse_input(m, i), experts_table(m, i));
  }
  if (m->npgroups) fprintf(c, "};\n");
}

/* the per-row buffers */
static void desc_bufs(const Emit *e) {
  const Model *m = e->m;
  FILE *c = e->out;
  fprintf(c, "static const cavs_buf_desc bufs[] = {\n");
  for (int i = 0; i < m->nbufs; i++) {
    fprintf(c, "  {%s, ", emit_c_string(m->bufs[i].name));
    desc_lin(c, m->bufs[i].width);
    int v = m->bufs[i].vertex;
    fprintf(c, ", %s, %d, %d, %d},\n", m->bufs[i].grad_whole ? "CAVS_GRAD_WHOLE" : m->bufs[i].grad ? "CAVS_GRAD" : "CAVS_GRAD_NONE",
            m->bufs[i].pull ? -3 : v, v >= 0 && !m->bufs[i].edge && leaves_untouched(m->vertex[v], i), m->bufs[i].edge);
  }
  fprintf(c, "};\n");
}

/* each vertex type: its gathers and named slots, the parameter groups its backward
   stages add to, and its entry of vertex[] */
static void desc_vertices(const Emit *e) {
  const Model *m = e->m;
  FILE *c = e->out;
  /* each vertex type's gathers: where child k's row goes, and whether it may be a view */
  int *ngathers = arena_alloc(sizeof(int) * ((size_t)m->nvertex + 1));
  for (int i = 0; i < m->nvertex; i++) {
    const IrFunc *f = m->vertex[i];
    for (int x = 0; x < f->n; x++) {
      const IrNode *g = &f->nodes[x];
      if (g->op != OP_GATHER || g->uses == 0 || g->val.kind != PL_ROW) continue;
      if (!ngathers[i]) fprintf(c, "static const cavs_gather_desc %s[] = {\n", fname(e, f, "gathers"));
      fprintf(c, "  {%d, %d, ", g->ref, g->val.buf);
      desc_lin(c, g->val.off);
      fprintf(c, ", %d, %d},\n", leaves_untouched(f, g->val.buf), gather_src(m, f, g->ref));
      ngathers[i]++;
    }
    if (ngathers[i]) fprintf(c, "};\n");
    if (!f->slot_type || !f->children) continue;
    fprintf(c, "static const char *const %s[] = {", fname(e, f, "slot_names"));
    for (int k = 0; k < f->children; k++) fprintf(c, "%s%s", k ? ", " : "", emit_c_string(f->slot_name[k]));
    fprintf(c, "};\nstatic const int %s[] = {", fname(e, f, "slot_types"));
    for (int k = 0; k < f->children; k++) fprintf(c, "%s%d", k ? ", " : "", f->slot_type[k]);
    fprintf(c, "};\n");
  }
  /* the parameter groups each backward stage adds to */
  grad_flags(e, "pull_grads", e->pull_grads);
  grad_flags(e, "push_grads", e->push_grads);
  for (int i = 0; i < m->nvertex; i++)
    for (int s = 0; s < 3; s++) grad_flags(e, arena_printf("grads_%d_%d", i, s), e->bwd_grads[3 * i + s]);
  fprintf(c, "static const cavs_vertex_desc vertex[] = {\n");
  for (int i = 0; i < m->nvertex; i++) {
    const IrFunc *f = m->vertex[i];
    bool named = f->slot_type && f->children;
    /* the edge buffer its set's children are copied to (echild), for their homes */
    const IrNode *ec = NULL;
    for (int x = 0; x < f->n && f->edges && !ec; x++)
      if (f->nodes[x].op == OP_ECHILD && f->nodes[x].uses > 0 && f->nodes[x].val.kind == PL_ROW) ec = &f->nodes[x];
    fprintf(c, "  {%s, %d, %d, %s, %s, %s,\n   %s, %s, %s, %d, %d, %s,\n   %d, %s, %s, %d, %d, %d, %d, %d, ",
            emit_c_string(f->name), f->children, f->pushes, fname(e, f, "fwd_eager"), fname(e, f, "fwd_path"),
            has_lazy(f) ? fname(e, f, "fwd_lazy") : "NULL", has_lazy(f) ? fname(e, f, "bwd_lazy") : "NULL",
            fname(e, f, "bwd_path"), fname(e, f, "bwd_eager"),
            e->eager_apart[i], ngathers[i], ngathers[i] ? fname(e, f, "gathers") : "NULL", f->state_buf,
            named ? fname(e, f, "slot_names") : "NULL", named ? fname(e, f, "slot_types") : "NULL", f->edges,
            f->edges ? f->edge_type : -1, f->edges ? edge_src(m, f) : -1, e->homes[i], ec ? ec->val.buf : -1);
    desc_lin(c, ec ? ec->val.off : lin_const(0));
    /* whether its stages read the pull block (the push block reads none: sema) */
    bool reads_pull = false;
    for (int x = 0; x < f->n && !reads_pull; x++) reads_pull = f->nodes[x].op == OP_PULL && f->nodes[x].uses > 0;
    fprintf(c, ",\n   {grads_%d_0, grads_%d_1, grads_%d_2}, %d},\n", i, i, i, reads_pull);
  }
  fprintf(c, "};\n");
}

/* the push block's losses: how many */
static int desc_losses(const Emit *e) {
  const Model *m = e->m;
  FILE *c = e->out;
  int nlosses = 0;
  if (m->push)
    for (int i = 0; i < m->push->n; i++) nlosses += op_info[m->push->nodes[i].op].kind == OK_LOSS;
  fprintf(c, nlosses ? "static const cavs_loss_desc losses[] = {\n" : "static const cavs_loss_desc losses[1] = {0};\n");
  if (m->push)
    for (int i = 0; i < m->push->n; i++) {
      const IrNode *n = &m->push->nodes[i];
      if (op_info[n->op].kind != OK_LOSS) continue;
      const IrNode *t = &m->push->nodes[n->args[1]];
      fprintf(c, "  {%s, %d},\n", n->op == OP_XENT ? "CAVS_LOSS_SOFTMAX_XENT" : "CAVS_LOSS_MSE",
              t->op == OP_INPUT ? t->ref : -1);
    }
  if (nlosses) fprintf(c, "};\n");
  return nlosses;
}

/* the named values stored per row, by block: where a stage left them; how many */
static int desc_values(const Emit *e) {
  const Model *m = e->m;
  FILE *c = e->out;
  int nvalues = 0, nf;
  IrFunc **fs = model_funcs(m, &nf);
  for (int k = 0; k < nf; k++) {
    const IrFunc *f = fs[k];
    for (int i = 0; i < f->n; i++) {
      const IrNode *x = &f->nodes[i];
      if (!x->name || (x->uses == 0 && x->type != T_NONE) || x->edge || x->slot) continue; /* per vertex only */
      const Place *p = x->val.kind == PL_ROW ? &x->val : x->keep ? &x->kval : NULL;
      if (!p || p->kind != PL_ROW) continue;
      bool twice = false; /* a name given twice in the block (a loop's `s = gather(k)`): neither */
      for (int j = 0; j < f->n && !twice; j++)
        twice = j != i && f->nodes[j].name && !strcmp(f->nodes[j].name, x->name) &&
                !(f->nodes[j].uses == 0 && f->nodes[j].type != T_NONE);
      if (twice) continue;
      if (!nvalues) fprintf(c, "static const cavs_value_desc values[] = {\n");
      fprintf(c, "  {%s, %d, %d, ", emit_c_string(x->name),
              f->kind == F_VERTEX ? f->index : f->kind == F_PUSH ? -2 : -1, p->buf);
      desc_lin(c, p == &x->kval ? lin_const(0) : p->off);
      fputs(", ", c);
      desc_lin(c, x->width);
      fprintf(c, ", %d},\n", p == &x->kval);
      nvalues++;
    }
  }
  fprintf(c, nvalues ? "};\n" : "static const cavs_value_desc values[1] = {0};\n");
  return nvalues;
}

/* the dropouts read in place where they keep every value (drop_aliases); how many */
static int desc_aliases(const Emit *e) {
  const Model *m = e->m;
  FILE *c = e->out;
  int naliases = 0;
  for (int b = 0; b < m->nbufs; b++) {
    const DropAlias *a = &e->alias[b];
    if (a->src < 0) continue;
    if (!naliases++) fprintf(c, "static const cavs_alias_desc aliases[] = {\n");
    fprintf(c, "  {%d, %d, ", b, a->src);
    desc_lin(c, a->off);
    fprintf(c, ", %d, %.17g},\n", a->opt, a->opt >= 0 ? 0.0 : a->p);
  }
  fprintf(c, naliases ? "};\n" : "static const cavs_alias_desc aliases[1] = {0};\n");
  return naliases;
}

/* The model's descriptor (cavs_desc NAME_desc) and the tables it points to, in C that
 * C++ (the CUDA target's nvcc) compiles too: a const array with no entries still gets an
 * initializer. */
static void descriptor(const Emit *e) {
  const Model *m = e->m;
  FILE *c = e->out;
  extern const char *cv_source_text;
  extern size_t cv_source_len;
  int nint, nreal;
  desc_dims_options(e);
  desc_inputs(e, &nint, &nreal);
  desc_params(e);
  desc_bufs(e);
  desc_vertices(e);
  int nlosses = desc_losses(e);
  int nvalues = desc_values(e);
  int naliases = desc_aliases(e);
  fputc('\n', c);
  fprintf(c, "const cavs_desc %s_desc = {\n", m->name);
  fprintf(c, "  .abi = CAVS_ABI_VERSION,\n  .target = %s,\n", e->t->abi);
  fprintf(c, "  .name = %s,\n  .source = %s,\n", emit_c_string(m->name), emit_c_string(e->o->source_name));
  fprintf(c, "  .source_hash = \"%016llx\",\n", model_hash(cv_source_text, cv_source_len));
  /* the .vf text itself, so that a checkpoint an application saves carries it (what
     `cavs eval` compiles the model from); none from IR */
  fprintf(c, "  .source_text = %s,\n", e->o->from_ir ? "NULL" : emit_c_string_n(cv_source_text, cv_source_len));
  fprintf(c, "  .precision = %s,\n", e->o->prec == PREC_DOUBLE ? "CAVS_DOUBLE" : "CAVS_FLOAT");
  fprintf(c, "  .ndims = %d, .dims = dims,\n", m->ndims);
  fprintf(c, "  .noptions = %d, .options = options,\n", m->noptions);
  fprintf(c, "  .ninputs = %d, .nint = %d, .nreal = %d, .inputs = inputs,\n", m->ninputs, nint, nreal);
  fprintf(c, "  .nparams = %d, .params = params,\n", m->nparams);
  fprintf(c, "  .npgroups = %d, .pgroups = pgroups,\n", m->npgroups);
  fprintf(c, "  .nbufs = %d, .bufs = bufs,\n", m->nbufs);
  fprintf(c, "  .state_buf = %d, .push_buf = %d,\n", m->state_buf, m->push_buf);
  fputs("  .push_off = ", c);
  desc_lin(c, m->push_off);
  fputs(", .push_width = ", c);
  desc_lin(c, m->push ? m->pushed : lin_const(0));
  fprintf(c, ", .push_routes = %d,\n", m->push && m->push->route >= 0);
  fprintf(c, "  .nvertex = %d, .vertex = vertex,\n", m->nvertex);
  fprintf(c, "  .nlosses = %d, .losses = losses,\n", nlosses);
  fprintf(c, "  .pull_fwd = %s, .pull_bwd = %s,\n", m->pull ? fname(e, m->pull, "fwd") : "0",
          m->pull ? fname(e, m->pull, "bwd") : "0");
  fprintf(c, "  .push_fwd = %s, .push_bwd = %s,\n", m->push ? fname(e, m->push, "fwd") : "0",
          m->push ? fname(e, m->push, "bwd") : "0");
  fprintf(c, "  .nvalues = %d, .values = values,\n", nvalues);
  fprintf(c, "  .pull_grads = pull_grads, .push_grads = push_grads,\n");
  fprintf(c, "  .naliases = %d, .aliases = aliases,\n", naliases);
  fprintf(c, "};\n");
}

/* ---- targets ---- */

/* One row per target; the first is the default. */
static const Target *const targets[] = {&target_c, &target_cuda};
enum { NTARGETS = sizeof targets / sizeof *targets };

const Target *target_find(const char *name) {
  for (int i = 0; i < NTARGETS; i++)
    if (!strcmp(targets[i]->name, name)) return targets[i];
  return NULL;
}

const char *target_names(void) {
  const char *s = "";
  for (int i = 0; i < NTARGETS; i++) s = arena_printf("%s%s%s", s, i ? ", " : "", targets[i]->name);
  return s;
}

/* Dropouts read in place. A dropout that keeps every value (its probability 0, the
 * default of every example's option, or inference) is y = x: its copy forward, and its
 * gradient's add backward, are passes over memory that change nothing (a Tree-LSTM
 * epoch on SST: 0.3-0.5 of 8 s, bench/README). Where it is safe, its readers read x
 * where x is then, and add their gradients to x's: every pointer into y's buffer
 * becomes a test (alias_if) between the two places, and the dropout's own calls run
 * only where it may drop. Safe means: y fills a buffer of its own (no other value lies
 * there, and the pull nodes that read it across blocks only view it); everything that
 * reads y, there or through a pull, is the left operand of a product, whose calls take
 * any pointer and stride (a fused loop's CUDA kernel builds its rows' strides in); x
 * is a row value of another buffer, of whole rows; and x's gradient is added to, not
 * set, and cleared before the backward pass at every row y's is (the runtime clears
 * a block's buffer at its type's rows, an `inner` one at those with children only).
 * The runtime reads a named value of y, and skips y's gradient clear, by the same
 * test (cavs_desc.aliases). */
static bool all_rows(const Model *m, int b) {
  int v = m->bufs[b].vertex;
  return v < 0 || !leaves_untouched(m->vertex[v], b);
}
static void drop_aliases(Emit *e) {
  const Model *m = e->m;
  e->alias = arena_alloc(sizeof *e->alias * ((size_t)m->nbufs + 1));
  for (int b = 0; b < m->nbufs; b++) e->alias[b].src = -1;
  int nf;
  IrFunc **fs = model_funcs(m, &nf);
  for (int k = 0; k < nf; k++) {
    const IrFunc *f = fs[k];
    for (int i = 0; i < f->n; i++) {
      const IrNode *n = &f->nodes[i], *x = n->nargs == 2 ? &f->nodes[n->args[0]] : NULL;
      if (n->op != OP_DROPOUT || !x || n->uses == 0 || n->val.kind != PL_ROW || x->val.kind != PL_ROW) continue;
      int b = n->val.buf, a = x->val.buf;
      const Buf *yb = &m->bufs[b], *xb = &m->bufs[a];
      bool ok = a != b && lin_is_zero(n->val.off) && lin_eq(n->width, yb->width) && lin_eq(n->val.ld, yb->width) &&
                lin_eq(x->val.ld, xb->width) && b != m->state_buf && b != m->push_buf && !yb->edge && !yb->slot &&
                !xb->edge && !xb->slot && !yb->grad_whole && !n->keep;
      if (ok && n->grad)
        ok = x->grad && xb->grad && !xb->grad_whole && !n->grad_set && !x->grad_set &&
             (xb->vertex < 0 ? xb->vertex == -1 || xb->vertex == yb->vertex : xb->vertex == yb->vertex) &&
             (all_rows(m, a) || !all_rows(m, b));
      /* every value in y's buffer is y or a pull of it, and is read as a product's left
         operand alone */
      for (int g = 0; g < nf && ok; g++) {
        const IrFunc *h = fs[g];
        for (int j = 0; j < h->n && ok; j++) {
          const IrNode *v = &h->nodes[j];
          if (v->keep && v->kval.kind == PL_ROW && v->kval.buf == b) ok = false;
          if (v->val.kind != PL_ROW || v->val.buf != b) continue;
          if (!(v == n || (v->op == OP_PULL && h != f && f->kind == F_PULL && m->pulls[v->ref].node == i))) ok = false;
          for (int u = j + 1; u < h->n && ok; u++)
            for (int q = 0; q < h->nodes[u].nargs; q++)
              if (h->nodes[u].args[q] == j && !(h->nodes[u].op == OP_MATMUL && q == 0)) ok = false;
        }
      }
      if (!ok) continue;
      const IrNode *pr = &f->nodes[n->args[1]];
      e->alias[b] = (DropAlias){a, x->val.off, pr->ref ? pr->ref - 1 : -1, pr->cval};
    }
  }
}

void emit(const Model *m, const Target *t, const EmitOpts *o, FILE *h, FILE *src) {
  EmitOpts ho = *o;
  if (o->header_cmdline) ho.cmdline = o->header_cmdline;
  Emit he = {.m = m, .o = &ho, .t = t, .out = src}, e = {.m = m, .o = o, .t = t, .out = src};
  t->header(&he, h);
  e.stamp = he.stamp;
  drop_aliases(&e);
  t->prologue(&e);
  int nf;
  IrFunc **fs = model_funcs(m, &nf);
  /* the parameter gradients each backward stage names: those of every stage but the
     eager ones together, and each vertex type's eager one alone */
  size_t ng = (size_t)m->npgroups + 1;
  unsigned char *others = arena_alloc(ng), *eager = arena_alloc(ng * ((size_t)m->nvertex + 1));
  e.eager_apart = arena_alloc((size_t)m->nvertex + 1);
  e.bwd_grads = arena_alloc(sizeof *e.bwd_grads * (3 * (size_t)m->nvertex + 1));
  for (int t = 0; t < 3 * m->nvertex; t++) e.bwd_grads[t] = arena_alloc(ng);
  e.pull_grads = arena_alloc(ng), e.push_grads = arena_alloc(ng);
  e.homes = arena_alloc((size_t)m->nvertex + 1);
  for (int t = 0; t < m->nvertex; t++) {
    cv_assert(m->vertex[t]->index == t);
    e.homes[t] = state_homes(m, m->vertex[t]);
  }
  for (int k = 0; k < nf; k++) {
    const IrFunc *f = fs[k];
    const bool *z = zero_at_leaves(f);
    if (f->kind == F_PULL) {
      stage(&e, f, z, fname(&e, f, "fwd"), "pull block, forward: all rows", -1, false, false);
      e.pg_marks = others, e.pg_stage = e.pull_grads;
      stage(&e, f, z, fname(&e, f, "bwd"), "pull block, backward: all rows", -1, true, true);
    } else if (f->kind == F_PUSH) {
      stage(&e, f, z, fname(&e, f, "fwd"), "push block, forward: the rows of the types that push", -1, false, false);
      e.pg_marks = others, e.pg_stage = e.push_grads;
      stage(&e, f, z, fname(&e, f, "bwd"), "push block, backward: the rows of the types that push (where a loss has a target)", -1, true, true);
    } else {
      const char *v = f->name;
      int t = 0;
      while (t < m->nvertex && m->vertex[t] != f) t++;
      stage(&e, f, z, fname(&e, f, "fwd_eager"), arena_printf("vertex %s, eager phase: every row of the type at once", v), CLS_EAGER, false, false);
      stage(&e, f, z, fname(&e, f, "fwd_path"), arena_printf("vertex %s, path phase: one task (rows of one level)", v), CLS_PATH, false, false);
      if (has_lazy(f))
        stage(&e, f, z, fname(&e, f, "fwd_lazy"), arena_printf("vertex %s, lazy phase: every row of the type at once", v), CLS_LAZY, false, false);
      e.pg_marks = others, e.pg_stage = e.bwd_grads[3 * t];
      if (has_lazy(f))
        stage(&e, f, z, fname(&e, f, "bwd_lazy"), arena_printf("vertex %s, lazy phase backward", v), CLS_LAZY, true, false);
      e.pg_stage = e.bwd_grads[3 * t + 1];
      stage(&e, f, z, fname(&e, f, "bwd_path"), arena_printf("vertex %s, path phase backward: one task, in reverse order", v), CLS_PATH, true, false);
      e.pg_marks = eager + ng * (size_t)t, e.pg_stage = e.bwd_grads[3 * t + 2];
      stage(&e, f, z, fname(&e, f, "bwd_eager"), arena_printf("vertex %s, eager phase backward, then every parameter gradient of the type", v), CLS_EAGER, true, true);
    }
    e.pg_marks = NULL, e.pg_stage = NULL;
  }
  for (int t = 0; t < m->nvertex; t++) {
    e.eager_apart[t] = 1;
    for (size_t g = 0; g < ng; g++)
      if (eager[ng * (size_t)t + g] && others[g]) e.eager_apart[t] = 0;
  }
  descriptor(&e);
}

/* ast.c: constructors for the syntax tree and its text dump (`cavsc --dump=ast`). */
#include "cavsc.h"

#include <stdlib.h>

static int max2(int a, int b) { return a > b ? a : b; }

/* A node cut by check_depth: a number standing for a subtree that was too deep, marked by
 * an operator no other node has (the parser may still relabel it, as a slice). */
enum { OP_CUT = -1 };
static bool cut(const Node *n) { return n && n->op == OP_CUT; }

/* Every constructor bounds the height of the tree, so the recursive passes after the
 * parser never run deeper than CV_MAX_NEST, whatever the input. */
static void check_depth(Node *n) {
  if (n->depth > CV_MAX_NEST) {
    /* once per expression: a node above one already cut is too deep because of it (no
       state outside the tree, so every parse, not only a process's first, reports it) */
    bool below = cut(n) || cut(n->a) || cut(n->b) || cut(n->c);
    for (int i = 0; n->kind == N_CALL && i < n->nargs; i++) below |= cut(n->args[i]);
    if (!below) error_at(n->loc, "expression nested too deeply (more than %d levels)", CV_MAX_NEST);
    n->depth = CV_MAX_NEST;
    n->a = n->b = n->c = NULL;
    n->kind = N_NUM;
    n->op = OP_CUT;
    n->num = 0;
  }
}

Node *ast_node(NodeKind kind, Loc loc) {
  Node *n = arena_alloc(sizeof(Node));
  n->kind = kind;
  n->loc = loc;
  n->depth = 1;
  return n;
}

Node *ast_binary(int op, Node *a, Node *b, Loc loc) {
  Node *n = ast_node(N_BINARY, loc);
  n->op = op;
  n->a = a;
  n->b = b;
  n->depth = 1 + max2(a->depth, b->depth);
  check_depth(n);
  return n;
}

Node *ast_unary(NodeKind kind, Node *a, Loc loc) {
  Node *n = ast_node(kind, loc);
  n->a = a;
  n->depth = 1 + a->depth;
  check_depth(n);
  return n;
}

void ast_push_arg(Node *call, Node *arg) {
  if (call->nargs == call->capargs) {
    int cap = call->capargs ? call->capargs * 2 : 4;
    Node **args = arena_alloc(sizeof(Node *) * (size_t)cap);
    for (int i = 0; i < call->nargs; i++) args[i] = call->args[i];
    call->args = args;
    call->capargs = cap;
  }
  call->args[call->nargs++] = arg;
  call->depth = max2(call->depth, arg->depth + 1);
  check_depth(call);
}

Stmt *ast_stmt(StmtKind kind, Loc loc) {
  Stmt *s = arena_alloc(sizeof(Stmt));
  s->kind = kind;
  s->loc = loc;
  return s;
}

Decl *ast_decl(DeclKind kind, Loc loc) {
  Decl *d = arena_alloc(sizeof(Decl));
  d->kind = kind;
  d->loc = loc;
  return d;
}

/* ---- dump: an indented, parenthesised form that keeps every source line ---- */

void ast_dump_expr(FILE *out, const Node *n) {
  if (!n) {
    fputs("?", out);
    return;
  }
  switch (n->kind) {
  case N_NUM:
    if (n->is_int) fprintf(out, "%ld", n->ival);
    else fprintf(out, "%.9g", n->num);
    return;
  case N_NAME: fputs(n->name, out); return;
  case N_DIMTERM: fprintf(out, "%ld%s", n->ival, n->name); return;
  case N_BINARY:
    fputc('(', out);
    ast_dump_expr(out, n->a);
    fprintf(out, " %c ", n->op);
    ast_dump_expr(out, n->b);
    fputc(')', out);
    return;
  case N_NEG:
    fputs("(-", out);
    ast_dump_expr(out, n->a);
    fputc(')', out);
    return;
  case N_CALL:
    fprintf(out, "%s(", n->name);
    for (int i = 0; i < n->nargs; i++) {
      if (i) fputs(", ", out);
      ast_dump_expr(out, n->args[i]);
    }
    fputc(')', out);
    return;
  case N_SUMFOR:
    fprintf(out, "%s(%s in ", (const char *)n->args, n->name);
    if (n->op == 'c') {
      fputs("children: ", out);
      ast_dump_expr(out, n->c);
      fputc(')', out);
      return;
    }
    ast_dump_expr(out, n->a);
    if (n->op == 'm') {
      fputs(": ", out);
      ast_dump_expr(out, n->c);
      fputc(')', out);
      return;
    }
    fputs("..", out);
    ast_dump_expr(out, n->b);
    fputs(": ", out);
    ast_dump_expr(out, n->c);
    fputc(')', out);
    return;
  case N_SLICE:
    ast_dump_expr(out, n->a);
    fputc('[', out);
    ast_dump_expr(out, n->b);
    fputc(':', out);
    ast_dump_expr(out, n->c);
    fputc(']', out);
    return;
  case N_INDEX:
    ast_dump_expr(out, n->a);
    fputc('[', out);
    ast_dump_expr(out, n->b);
    fputc(']', out);
    return;
  case N_PULL: fprintf(out, "pull(%s)", n->name ? n->name : ""); return;
  }
  unreachable();
}

static void dump_stmts(FILE *out, const Stmt *s, int indent) {
  for (; s; s = s->next) {
    fprintf(out, "%*s", indent, "");
    switch (s->kind) {
    case S_ASSIGN:
      fprintf(out, "%s = ", s->name);
      ast_dump_expr(out, s->expr);
      break;
    case S_SCATTER:
    case S_PUSH:
      fputs(s->kind == S_SCATTER ? "scatter(" : "push(", out);
      ast_dump_expr(out, s->expr);
      fputc(')', out);
      break;
    case S_LOSS:
      fprintf(out, "loss %s(", s->name);
      for (int i = 0; i < s->nargs; i++) {
        if (i) fputs(", ", out);
        ast_dump_expr(out, s->args[i]);
      }
      fputc(')', out);
      break;
    case S_FOR:
      fprintf(out, "for %s in ", s->name);
      ast_dump_expr(out, s->expr);
      fputs("..", out);
      ast_dump_expr(out, s->expr2);
      fprintf(out, " {  # line %d\n", s->loc.line);
      dump_stmts(out, s->body, indent + 2);
      fprintf(out, "%*s}\n", indent, "");
      continue;
    }
    fprintf(out, ";  # line %d\n", s->loc.line);
  }
}

void ast_dump(FILE *out, const Decl *d) {
  for (; d; d = d->next) {
    switch (d->kind) {
    case D_MODEL: fprintf(out, "model %s;", d->name); break;
    case D_DIM:
      fprintf(out, "dim %s", d->name);
      if (d->value) {
        fputs(" = ", out);
        ast_dump_expr(out, d->value);
      }
      fputc(';', out);
      break;
    case D_OPTION:
      fprintf(out, "option %s = ", d->name);
      ast_dump_expr(out, d->value);
      fputc(';', out);
      break;
    case D_INPUT:
      fprintf(out, "input %s : ", d->name);
      ast_dump_expr(out, d->value);
      fputc(';', out);
      break;
    case D_PARAM:
      fputs("param ", out);
      for (const ParamItem *p = d->items; p; p = p->next) {
        fprintf(out, "%s[", p->name);
        ast_dump_expr(out, p->d0);
        if (p->d1) {
          fputs(", ", out);
          ast_dump_expr(out, p->d1);
        }
        fputc(']', out);
        if (p->value) {
          fputs(" = ", out);
          ast_dump_expr(out, p->value);
        }
        if (p->next) fputs(", ", out);
      }
      if (d->init) {
        fputs(" init ", out);
        ast_dump_expr(out, d->init);
      }
      fputc(';', out);
      break;
    case D_PULL:
    case D_VERTEX:
    case D_PUSH:
      if (d->kind == D_PULL) fputs("pull {", out);
      else if (d->kind == D_PUSH) fprintf(out, "push (%s) {", d->name);
      else {
        fprintf(out, "vertex %s (children ", d->name);
        if (d->value) ast_dump_expr(out, d->value);
        for (const Slot *s = d->slots; s; s = s->next) fprintf(out, "%s%s: %s", s == d->slots ? "" : ", ", s->name, s->type);
        if (d->star) fprintf(out, "%s*%s%s", d->slots ? ", " : "", d->star_type ? ": " : "", d->star_type ? d->star_type : "");
        fputs(") {", out);
      }
      fprintf(out, "  # line %d\n", d->loc.line);
      dump_stmts(out, d->body, 2);
      fputs("}\n", out);
      continue;
    }
    fprintf(out, "  # line %d\n", d->loc.line);
  }
}

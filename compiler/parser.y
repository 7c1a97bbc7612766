/* parser.y: the grammar of the .vf language (man/vf.5 has it in prose). Pure, with
 * locations; syntax errors name what was expected and what was found, and `error` rules
 * resynchronise at ';' and '}' so one typo does not hide the next. */
%define api.pure full
%define api.token.prefix {VF_}
%define parse.error custom
%locations
%expect 0
%param {yyscan_t scanner}
%parse-param {struct ParseOut *out}

%code requires {
#include "cavsc.h"
typedef void *yyscan_t;
#define YYLTYPE Loc
#define YYLTYPE_IS_DECLARED 1
#define YYLLOC_DEFAULT(Cur, Rhs, N)                                  \
  do {                                                               \
    if (N) {                                                         \
      (Cur).line = YYRHSLOC(Rhs, 1).line;                            \
      (Cur).col = YYRHSLOC(Rhs, 1).col;                              \
      (Cur).eline = YYRHSLOC(Rhs, N).eline;                          \
      (Cur).ecol = YYRHSLOC(Rhs, N).ecol;                            \
    } else {                                                         \
      (Cur).line = (Cur).eline = YYRHSLOC(Rhs, 0).eline;             \
      (Cur).col = (Cur).ecol = YYRHSLOC(Rhs, 0).ecol;                \
    }                                                                \
  } while (0)
/* The parser's stack may hold several entries per bracket level; the lexer bounds the
 * nesting (CV_MAX_NEST) well below this. */
#define YYMAXDEPTH 100000

struct LexState {
  int line, col;
  int depth;      /* open ( and [ */
  /* inside a dim expression: open [ (shapes, widths, slices), or a `dim` declaration up
     to its ';' (where `2E+1` is the dim term 2E plus 1, never the number 20) */
  int squares;
  bool in_dim;
  Loc *braces;    /* open { */
  int nbraces, capbraces;
  Loc comment;    /* start of the comment being skipped */
  Loc cur, prev;  /* the last two tokens */
  int cur_tok, prev_tok;
  int lex_error_line; /* line of the last lexical error: syntax errors there are noise */
  bool fatal;
};

struct ParseOut {
  Decl *head, *tail;
};
}

%code {
#include <string.h>
int yylex(YYSTYPE *yylval, YYLTYPE *yylloc, yyscan_t scanner);
struct LexState *yyget_extra(yyscan_t scanner);
char *yyget_text(yyscan_t scanner);
static void yyerror(Loc *loc, yyscan_t scanner, struct ParseOut *out, const char *msg);

static void add_decl(struct ParseOut *out, Decl *d) {
  if (out->tail) out->tail->next = d; else out->head = d;
  out->tail = d;
}

}

%union {
  Node *node;
  Stmt *stmt;
  Decl *decl;
  ParamItem *item;
  Slot *slot;
  char *str;
  double num;
  struct { long coef; char *name; } dimterm;
  struct { Stmt *head, *tail; } list;
}

%token END 0 "end of file"
%token MODEL "model" DIM "dim" OPTION "option" INPUT "input" PARAM "param" INIT "init"
%token PULL "pull" VERTEX "vertex" CHILDREN "children" PUSH "push"
%token SCATTER "scatter" LOSS "loss" FOR "for" IN "in" DOTDOT ".."
%token <str> IDENT "identifier"
%token <num> INT "integer" FLOAT "number"
%token <dimterm> DIMTERM "dim term"

%type <node> expr postfix primary call args initspec
%type <stmt> stmt
%type <list> stmts block
%type <item> pitem pitems
%type <slot> slot slots

%left '+' '-'
%left '*' '/' '@'
%precedence UMINUS

%%

file:
  %empty
| file decl
;

/* decl: one top-level declaration or block */
decl:
  MODEL IDENT ';'
    { Decl *d = ast_decl(D_MODEL, @$); d->name = $2; d->name_loc = @2; add_decl(out, d); }
| DIM IDENT ';'
    { Decl *d = ast_decl(D_DIM, @$); d->name = $2; d->name_loc = @2; add_decl(out, d); }
| DIM IDENT '=' expr ';'
    { Decl *d = ast_decl(D_DIM, @$); d->name = $2; d->name_loc = @2; d->value = $4;
      add_decl(out, d); }
| OPTION IDENT '=' expr ';'
    { Decl *d = ast_decl(D_OPTION, @$); d->name = $2; d->name_loc = @2; d->value = $4;
      add_decl(out, d); }
| INPUT IDENT ':' IDENT '[' expr ']' ';'
    { Decl *d = ast_decl(D_INPUT, @$); d->name = $2; d->name_loc = @2;
      Node *k = ast_node(N_INDEX, @4); Node *kn = ast_node(N_NAME, @4); kn->name = $4;
      k->a = kn; k->b = $6; d->value = k; add_decl(out, d); }
| PARAM pitems ';'
    { Decl *d = ast_decl(D_PARAM, @$); d->items = $2; add_decl(out, d); }
| PARAM pitems INIT initspec ';'
    { Decl *d = ast_decl(D_PARAM, @$); d->items = $2; d->init = $4; add_decl(out, d); }
| PULL block
    { Decl *d = ast_decl(D_PULL, @1); d->body = $2.head; add_decl(out, d); }
| VERTEX IDENT '(' CHILDREN expr ')' block
    { Decl *d = ast_decl(D_VERTEX, @2); d->name = $2; d->name_loc = @2; d->value = $5;
      d->body = $7.head; add_decl(out, d); }
| VERTEX IDENT '(' CHILDREN slots ')' block
    { Decl *d = ast_decl(D_VERTEX, @2); d->name = $2; d->name_loc = @2; d->slots = $5;
      d->body = $7.head; add_decl(out, d); }
| VERTEX IDENT '(' CHILDREN '*' ')' block
    { Decl *d = ast_decl(D_VERTEX, @2); d->name = $2; d->name_loc = @2; d->star = true;
      d->body = $7.head; add_decl(out, d); }
| VERTEX IDENT '(' CHILDREN '*' ':' IDENT ')' block
    { Decl *d = ast_decl(D_VERTEX, @2); d->name = $2; d->name_loc = @2; d->star = true;
      d->star_type = $7; d->star_type_loc = @7; d->body = $9.head; add_decl(out, d); }
| VERTEX IDENT '(' CHILDREN slots ',' '*' ':' IDENT ')' block
    { Decl *d = ast_decl(D_VERTEX, @2); d->name = $2; d->name_loc = @2; d->slots = $5; d->star = true;
      d->star_type = $9; d->star_type_loc = @9; d->body = $11.head; add_decl(out, d); }
| PUSH '(' IDENT ')' block
    { Decl *d = ast_decl(D_PUSH, @1); d->name = $3; d->name_loc = @3; d->body = $5.head;
      add_decl(out, d); }
| error ';'
| error '}'
;

/* pitems: pitem (',' pitem)* */
pitems:
  pitem             { $$ = $1; }
| pitems ',' pitem  { ParamItem *t = $1; while (t->next) t = t->next; t->next = $3; $$ = $1; }
;

/* pitem: IDENT '[' expr (',' expr)? ']' ('=' expr)? */
pitem:
  IDENT '[' expr ']'
    { $$ = arena_alloc(sizeof(ParamItem)); $$->name = $1; $$->loc = @1; $$->d0 = $3; }
| IDENT '[' expr ',' expr ']'
    { $$ = arena_alloc(sizeof(ParamItem)); $$->name = $1; $$->loc = @1; $$->d0 = $3;
      $$->d1 = $5; }
| IDENT '[' expr ']' '=' expr
    { $$ = arena_alloc(sizeof(ParamItem)); $$->name = $1; $$->loc = @1; $$->d0 = $3;
      $$->value = $6; }
| IDENT '[' expr ',' expr ']' '=' expr
    { $$ = arena_alloc(sizeof(ParamItem)); $$->name = $1; $$->loc = @1; $$->d0 = $3;
      $$->d1 = $5; $$->value = $8; }
;

/* slots: slot (',' slot)*, a slot `IDENT ':' IDENT` (its name, the vertex block of the
   child it holds) */
slots:
  slot            { $$ = $1; }
| slots ',' slot  { Slot *t = $1; while (t->next) t = t->next; t->next = $3; $$ = $1; }
;

slot:
  IDENT ':' IDENT
    { $$ = arena_alloc(sizeof(Slot)); $$->name = $1; $$->loc = @1; $$->type = $3; $$->type_loc = @3; }
;

/* initspec: IDENT | IDENT '(' args ')' */
initspec:
  IDENT      { $$ = ast_node(N_CALL, @$); $$->name = $1; }
| call       { $$ = $1; }
;

/* block: '{' stmt* '}' */
block:
  '{' stmts '}'  { $$ = $2; }
;

stmts:
  %empty       { $$.head = $$.tail = NULL; }
| stmts stmt   {
                 $$ = $1;
                 if ($2) {
                   if ($$.tail) $$.tail->next = $2; else $$.head = $2;
                   $$.tail = $2;
                 }
               }
;

/* stmt: assignment, scatter, push, loss, or a compile-time loop */
stmt:
  IDENT '=' expr ';'
    { $$ = ast_stmt(S_ASSIGN, @$); $$->name = $1; $$->name_loc = @1; $$->expr = $3; }
| SCATTER '(' expr ')' ';'
    { $$ = ast_stmt(S_SCATTER, @$); $$->expr = $3; }
| PUSH '(' expr ')' ';'
    { $$ = ast_stmt(S_PUSH, @$); $$->expr = $3; }
| LOSS call ';'
    { $$ = ast_stmt(S_LOSS, @$); $$->name = $2->name; $$->name_loc = @2;
      $$->args = $2->args; $$->nargs = $2->nargs; }
| FOR IDENT IN expr DOTDOT expr block
    { $$ = ast_stmt(S_FOR, @$); $$->loc.eline = @6.eline; $$->loc.ecol = @6.ecol;
      $$->name = $2; $$->name_loc = @2; $$->expr = $4; $$->expr2 = $6; $$->body = $7.head; }
| error ';'   { $$ = NULL; }
;

expr:
  expr '+' expr            { $$ = ast_binary('+', $1, $3, @$); }
| expr '-' expr            { $$ = ast_binary('-', $1, $3, @$); }
| expr '*' expr            { $$ = ast_binary('*', $1, $3, @$); }
| expr '/' expr            { $$ = ast_binary('/', $1, $3, @$); }
| expr '@' expr            { $$ = ast_binary('@', $1, $3, @$); }
| '-' expr %prec UMINUS    { $$ = ast_unary(N_NEG, $2, @$); }
| postfix
;

postfix:
  primary
/* ast_binary may have cut the node (too deep): it stays a number, not a slice */
| postfix '[' expr ':' expr ']'  { $$ = ast_binary(0, $1, $3, @$);
                                   if ($$->kind == N_BINARY) { $$->kind = N_SLICE; $$->c = $5; } }
| postfix '[' expr ']'           { $$ = ast_binary(0, $1, $3, @$);
                                   if ($$->kind == N_BINARY) $$->kind = N_INDEX; }
;

primary:
  IDENT       { $$ = ast_node(N_NAME, @$); $$->name = $1; }
| INT         { $$ = ast_node(N_NUM, @$); $$->num = $1; $$->is_int = true; $$->ival = (long)$1; }
| FLOAT       { $$ = ast_node(N_NUM, @$); $$->num = $1; }
| DIMTERM     { $$ = ast_node(N_DIMTERM, @$); $$->ival = $1.coef; $$->name = $1.name; }
| '(' expr ')'  { $$ = $2; }
| call
| PULL '(' ')'        { $$ = ast_node(N_PULL, @$); }
| PULL '(' IDENT ')'  { $$ = ast_node(N_PULL, @$); $$->name = $3; }
| IDENT '(' IDENT IN expr DOTDOT expr ':' expr ')'
    { $$ = ast_node(N_SUMFOR, @$); $$->op = 0; $$->name = $3; $$->a = $5; $$->b = $7;
      $$->c = $9; $$->args = (Node **)arena_strdup($1); $$->depth = $9->depth + 1;
      if ($$->depth > CV_MAX_NEST) { error_at(@$, "expression nested too deeply"); YYABORT; } }
| IDENT '(' IDENT IN expr ':' expr ')'
    { $$ = ast_node(N_SUMFOR, @$); $$->op = 'm'; $$->name = $3; $$->a = $5; $$->c = $7;
      $$->args = (Node **)arena_strdup($1); $$->depth = ($5->depth > $7->depth ? $5->depth : $7->depth) + 1;
      if ($$->depth > CV_MAX_NEST) { error_at(@$, "expression nested too deeply"); YYABORT; } }
| IDENT '(' IDENT IN CHILDREN ':' expr ')'
    { $$ = ast_node(N_SUMFOR, @$); $$->op = 'c'; $$->name = $3; $$->c = $7;
      $$->args = (Node **)arena_strdup($1); $$->depth = $7->depth + 1;
      if ($$->depth > CV_MAX_NEST) { error_at(@$, "expression nested too deeply"); YYABORT; } }
;

/* call: IDENT '(' (expr (',' expr)*)? ')' */
call:
  IDENT '(' ')'       { $$ = ast_node(N_CALL, @$); $$->name = $1; }
| IDENT '(' args ')'  { $$ = $3; $$->name = $1; $$->loc = @$; }
;

args:
  expr           { $$ = ast_node(N_CALL, @$); ast_push_arg($$, $1); }
| args ',' expr  { $$ = $1; ast_push_arg($$, $3); }
;

%%

static void yyerror(Loc *loc, yyscan_t scanner, struct ParseOut *out, const char *msg) {
  (void)out;
  if (yyget_extra(scanner)->fatal) return;
  error_at(*loc, "%s", msg);
}

/* Bison writes token aliases with their quotes: "identifier", ';'. The message reads
   better with the quotes of word-like names removed. */
static const char *token_name(yysymbol_kind_t s) {
  const char *n = yysymbol_name(s);
  if (n[0] == '"') {
    size_t len = strlen(n);
    return arena_printf("%.*s", (int)(len - 2), n + 1);
  }
  return n;
}

static bool is_keyword(yysymbol_kind_t s) {
  return s >= YYSYMBOL_MODEL && s <= YYSYMBOL_IN;
}

static int yyreport_syntax_error(const yypcontext_t *ctx, yyscan_t scanner,
                                 struct ParseOut *out) {
  (void)out;
  struct LexState *ls = yyget_extra(scanner);
  if (ls->fatal) return 0;
  yysymbol_kind_t la = yypcontext_token(ctx);
  Loc at = *yypcontext_location(ctx);
  if (ls->lex_error_line && at.line == ls->lex_error_line) return 0;
  yysymbol_kind_t exp[YYNTOKENS];
  int n = yypcontext_expected_tokens(ctx, exp, YYNTOKENS);
  bool want_semi = false, want_ident = false;
  for (int i = 0; i < n; i++) {
    want_semi |= !strcmp(yysymbol_name(exp[i]), "';'");
    want_ident |= exp[i] == YYSYMBOL_IDENT;
  }
  /* a keyword where a name belongs: `loss = ...`, `input = ...` */
  if (is_keyword(la) && want_ident) {
    error_at(at, "'%s' is a keyword and cannot be used as a name", token_name(la));
    return 0;
  }
  if (ls->prev_tok >= VF_MODEL && ls->prev_tok <= VF_IN && want_ident && ls->cur_tok == '=') {
    error_at(ls->prev, "'%.20s' is a keyword and cannot be used as a name",
             token_name((yysymbol_kind_t)(YYSYMBOL_MODEL + (ls->prev_tok - VF_MODEL))));
    return 0;
  }
  /* a statement that ends at a line break without its ';' */
  if (want_semi && la != YYSYMBOL_YYEOF && at.line > ls->prev.eline) {
    Loc end = {ls->prev.eline, ls->prev.ecol, ls->prev.eline, ls->prev.ecol};
    error_at(end, "expected ';' at the end of this line");
    return 0;
  }
  char buf[512];
  size_t len = 0;
  if (la == YYSYMBOL_YYEOF) {
    len += (size_t)snprintf(buf + len, sizeof buf - len, "unexpected end of file");
  } else if (la == YYSYMBOL_IDENT || la == YYSYMBOL_INT || la == YYSYMBOL_FLOAT ||
             la == YYSYMBOL_DIMTERM) {
    const char *text = yyget_text(scanner);
    len += (size_t)snprintf(buf + len, sizeof buf - len, "unexpected %s '%.40s'",
                            token_name(la), text);
  } else if (is_keyword(la)) {
    len += (size_t)snprintf(buf + len, sizeof buf - len, "unexpected keyword '%s'", token_name(la));
  } else {
    len += (size_t)snprintf(buf + len, sizeof buf - len, "unexpected %s", token_name(la));
  }
  if (n > 0 && n <= 5) {
    len += (size_t)snprintf(buf + len, sizeof buf - len, ", expected ");
    for (int i = 0; i < n && len < sizeof buf; i++) {
      const char *sep = i == 0 ? "" : i == n - 1 ? " or " : ", ";
      len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", sep, token_name(exp[i]));
    }
  }
  error_at(at, "%s", buf);
  return 0;
}

/* diag.c: gcc-style diagnostics with the source line and an underline, the internal
 * error exit, and the arena every compiler object lives in (freed only at exit, as
 * chibicc does: the compiler is a short-lived process). */
#include "cavsc.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *src_path;
static const char *src_text;
static size_t src_len;
static int nerrors;
static bool silenced;

/* The source text, for the hash in the generated descriptor. */
const char *cv_source_text;
size_t cv_source_len;

/* Starts the diagnostics of one input: its text, and no errors yet. */
void diag_init(const char *path, const char *text, size_t len) {
  nerrors = 0;
  silenced = false;
  cv_source_text = text;
  cv_source_len = len;
  src_path = path;
  src_text = text;
  src_len = len;
}

/* Start of line `line` (1-based) in the source, or NULL. Diagnostics are rare, so a
 * linear scan is fine. */
static const char *line_start(int line) {
  if (!src_text) return NULL;
  const char *p = src_text, *end = src_text + src_len;
  for (int l = 1; l < line; l++) {
    p = memchr(p, '\n', (size_t)(end - p));
    if (!p) return NULL;
    p++;
  }
  return p;
}

int diag_count(void) { return nerrors; }

/* Source bytes as a diagnostic shows them: a control byte other than a tab (C0, DEL, and
   the two bytes of a C1 control in UTF-8, 0xc2 0x80 to 0xc2 0x9f) becomes '?', byte
   for byte, so that the caret keeps its column and nothing in a source from someone
   else (a checkpoint's) acts on the terminal. */
static char *safe_text(const char *p, int n) {
  char *out = arena_printf("%.*s", n, p);
  n = (int)strlen(out); /* (up to a NUL byte in the source) */
  for (int i = 0; i < n; i++) {
    unsigned char c = (unsigned char)out[i];
    if (c == 0xc2 && i + 1 < n && (unsigned char)out[i + 1] >= 0x80 && (unsigned char)out[i + 1] < 0xa0)
      out[i] = out[i + 1] = '?', i++;
    else if ((c < 0x20 && c != '\t') || c == 0x7f)
      out[i] = '?';
  }
  return out;
}

/* The text of a short single-line span, for messages that quote the source. */
const char *diag_span(Loc loc) {
  if (loc.line != loc.eline || loc.ecol < loc.col || loc.ecol - loc.col > 40) return NULL;
  const char *p = line_start(loc.line);
  if (!p) return NULL;
  return safe_text(p + loc.col - 1, loc.ecol - loc.col + 1);
}

void diag_silence(bool on) { silenced = on; }

static void show_line(Loc loc) {
  const char *p = line_start(loc.line);
  if (!p) return;
  const char *end = src_text + src_len;
  const char *e = memchr(p, '\n', (size_t)(end - p));
  if (!e) e = end;
  if (e > p && e[-1] == '\r') e--;
  /* Long lines (a 10 MB single line) are cut around the column. */
  int len = (int)(e - p);
  int from = 0;
  if (len > 200 && loc.col > 100) from = loc.col - 100;
  int to = len < from + 200 ? len : from + 200;
  fprintf(stderr, "%5d | %s\n", loc.line, safe_text(p + from, to - from));
  fprintf(stderr, "      | ");
  int col = loc.col - 1;
  for (int i = from; i < col && i < to; i++) fputc(p[i] == '\t' ? '\t' : ' ', stderr);
  int last = loc.eline == loc.line ? loc.ecol - 1 : to - 1;
  if (last > to - 1) last = to - 1;
  fputc('^', stderr);
  for (int i = col + 1; i <= last; i++) fputc('~', stderr);
  fputc('\n', stderr);
}

static void vreport(const char *kind, Loc loc, const char *fmt, va_list ap) {
  fprintf(stderr, "%s:%d:%d: %s: ", src_path ? src_path : "cavsc", loc.line, loc.col, kind);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  show_line(loc);
}

void error_at(Loc loc, const char *fmt, ...) {
  if (silenced) return;
  nerrors++;
  if (nerrors > CV_MAX_ERRORS) {
    fprintf(stderr, "%s: too many errors, stopping\n", src_path);
    exit(1);
  }
  va_list ap;
  va_start(ap, fmt);
  vreport("error", loc, fmt, ap);
  va_end(ap);
}

void note_at(Loc loc, const char *fmt, ...) {
  if (silenced) return;
  va_list ap;
  va_start(ap, fmt);
  vreport("note", loc, fmt, ap);
  va_end(ap);
}

void error_plain(const char *fmt, ...) {
  nerrors++;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "cavsc: error: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* Set while IR written by hand (a .ir file) is checked: a broken invariant is then the
 * input's fault, not the compiler's. */
bool cv_checking_user_ir;

void internal_error(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (cv_checking_user_ir) {
    fprintf(stderr, "%s: error: invalid IR: ", src_path ? src_path : "cavsc");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
  }
  fprintf(stderr, "cavsc: internal error at %s:%d: ", file, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(2);
}

/* ---- memory ---- */

_Noreturn void out_of_memory(void) {
  fprintf(stderr, "cavsc: out of memory\n");
  exit(2);
}

void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) out_of_memory();
  return p;
}

void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) out_of_memory();
  return p;
}

void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) out_of_memory();
  return q;
}

typedef struct Chunk {
  struct Chunk *next;
  size_t used, size;
  _Alignas(16) unsigned char data[];
} Chunk;

static Chunk *arena;

void *arena_alloc(size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (!arena || arena->used + n > arena->size) {
    size_t size = n > (1u << 20) ? n : (1u << 20);
    Chunk *c = xmalloc(sizeof(Chunk) + size);
    c->next = arena;
    c->used = 0;
    c->size = size;
    arena = c;
  }
  void *p = arena->data + arena->used;
  arena->used += n;
  memset(p, 0, n);
  return p;
}

char *arena_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = arena_alloc(n);
  memcpy(p, s, n);
  return p;
}

char *arena_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = arena_alloc((size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(p, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return p;
}

/* Vectors grow by doubling and are never freed (they live as long as the process). */
void *vec_grow(void *v, int *cap, int need, size_t elem) {
  if (need <= *cap) return v;
  int c = *cap ? *cap : 8;
  while (c < need) c *= 2;
  void *p = xrealloc(v, (size_t)c * elem);
  memset((char *)p + (size_t)*cap * elem, 0, (size_t)(c - *cap) * elem);
  *cap = c;
  return p;
}

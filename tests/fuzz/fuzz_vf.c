/* fuzz_vf.c: libFuzzer target for cavsc's whole pipeline, in memory. The input is a .vf
 * file (or, built with -DFUZZ_IR, the text of `cavsc --dump=ir`), taken as main.c takes
 * it: parse, sema (or ir_read), the verifier, then every pass through emit_c into memory
 * streams, plus the AST dump and the --report and --dump=ad text. For a .vf input that
 * checks, the IR it builds must also print, read back (ir_read) and print again to the
 * same text, as tests/check_front.c requires of the examples.
 *
 * The compiler is written as a short-lived process, so the harness resets it by hand:
 *  - diag.c is included here, not linked, to reach its statics (error count, silence,
 *    arena) and to catch its exit(): exit(1) (a user error, e.g. "too many errors") ends
 *    the input, exit(2) (an internal error or out of memory) is a finding and aborts;
 *  - the other compiler files are built with alloc_track.h forced in, and every block
 *    they left allocated is freed after each input (the arena's chunks with them);
 *  - diagnostics go to a memory stream, printed only when the input is a finding (or
 *    always with FUZZ_VF_DIAG=1 in the environment); they must hold no control byte
 *    (C0 but the line break and the tab, DEL, C1 as UTF-8) whatever the input held. */
#include "alloc_track.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static jmp_buf fz_jmp;
static int fz_active;

/* diag.c's stderr: this input's diagnostics */
static FILE *fz_diag;
static char *fz_diag_buf;
static size_t fz_diag_len;

static void show_diagnostics(void) {
  if (!fz_diag) return;
  fflush(fz_diag);
  fwrite(fz_diag_buf, 1, fz_diag_len, stderr);
}

static _Noreturn void fail(const char *fmt, ...) {
  show_diagnostics();
  va_list ap;
  va_start(ap, fmt);
  fputs("fuzz_vf: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  abort();
}

static _Noreturn void fz_exit(int code) {
  if (fz_active && code == 1) longjmp(fz_jmp, 1);
  fail("the compiler exited with status %d", code);
}

#define exit(code) fz_exit(code)
#undef stderr
#define stderr fz_diag
#include "diag.c"
#undef stderr
#define stderr stderr
#undef exit

/* The harness's own memory is not the compiler's. */
#undef malloc
#undef calloc
#undef realloc
#undef free

#ifdef FUZZ_IR
#define PATH "fuzz.ir"
#else
#define PATH "fuzz.vf"
#endif

/* Memory streams open during one input, closed whatever way the input ends. */
static FILE *fz_f[2];
static char *fz_buf[2];
static size_t fz_len[2];

static FILE *stream(int i) {
  fz_f[i] = open_memstream(&fz_buf[i], &fz_len[i]);
  if (!fz_f[i]) abort();
  return fz_f[i];
}

static void close_streams(void) {
  for (int i = 0; i < 2; i++) {
    if (fz_f[i]) fclose(fz_f[i]);
    free(fz_buf[i]);
    fz_f[i] = NULL;
    fz_buf[i] = NULL;
    fz_len[i] = 0;
  }
}

/* ir_print into a fresh malloc'd buffer. */
static char *print_ir(const Model *m, size_t *len) {
  char *buf = NULL;
  FILE *f = open_memstream(&buf, len);
  if (!f) abort();
  ir_print(f, m);
  fclose(f);
  return buf;
}

#ifndef FUZZ_IR
/* What the compiler built must read back as the same IR. */
static void round_trip(const Model *m, const char *src, size_t srclen) {
  size_t la, lb;
  char *a = print_ir(m, &la);
  diag_init("round-trip.ir", a, la);
  Model *back = ir_read("round-trip.ir", a, la);
  if (diag_count()) fail("the IR of a valid model does not read back:\n%s", a);
  ir_check(back);
  char *b = print_ir(back, &lb);
  if (la != lb || memcmp(a, b, la)) fail("the IR changes when read back:\n%s\n---\n%s", a, b);
  free(a);
  free(b);
  diag_init(PATH, src, srclen);
}
#endif

static void compile(const char *text, size_t len, Precision prec) {
  diag_init(PATH, text, len);
#ifdef FUZZ_IR
  Model *m = ir_read(PATH, text, len);
  if (diag_count()) return;
  cv_checking_user_ir = true; /* a broken invariant in hand-written IR is a user error */
  ir_check(m);
  cv_checking_user_ir = false;
#else
  Decl *decls = parse_source(PATH, text, len);
  if (diag_count()) return;
  ast_dump(stream(0), decls);
  close_streams();
  Model *m = sema(decls, PATH);
  if (diag_count()) return;
  ir_check(m);
  round_trip(m, text, len);
#endif
  autodiff(m);
  classify(m);
  fuse(m);
  plan(m);
  report(stream(0), m);
  ad_print(stream(1), m);
  close_streams();
  EmitOpts eo = {.prec = prec, .cmdline = "cavsc " PATH, .source_name = PATH};
  emit(m, &target_c, &eo, stream(0), stream(1));
  close_streams();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* NUL-terminated, as main.c's read_file leaves it (the IR reader relies on it) */
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0;
  if (getenv("FUZZ_VF_DIAG")) {
    fz_diag = stderr;
  } else {
    fz_diag = open_memstream(&fz_diag_buf, &fz_diag_len);
    if (!fz_diag) abort();
  }
  if (!setjmp(fz_jmp)) {
    fz_active = 1;
    compile(text, size, size & 1 ? PREC_DOUBLE : PREC_FLOAT);
  }
  fz_active = 0;
  close_streams();
  /* reset diag.c and free everything the compiler allocated */
  ft_release_all();
  arena = NULL;
  nerrors = 0;
  silenced = false;
  cv_checking_user_ir = false;
  src_path = src_text = NULL;
  src_len = 0;
  cv_source_text = NULL;
  cv_source_len = 0;
  if (fz_diag != stderr) {
    /* no control byte of the input reaches the terminal through a diagnostic (diag.c's
       safe_text): only line breaks and tabs */
    fflush(fz_diag);
    for (size_t i = 0; i < fz_diag_len; i++) {
      unsigned char c = (unsigned char)fz_diag_buf[i];
      if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f ||
          (c == 0xc2 && i + 1 < fz_diag_len && (unsigned char)fz_diag_buf[i + 1] >= 0x80 &&
           (unsigned char)fz_diag_buf[i + 1] < 0xa0))
        fail("a control byte 0x%02x at byte %zu of the diagnostics", c, i);
    }
    fclose(fz_diag);
    free(fz_diag_buf);
    fz_diag_buf = NULL;
    fz_diag_len = 0;
  }
  fz_diag = NULL;
  free(text);
  return 0;
}

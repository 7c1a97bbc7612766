/* fuzz_tensors.c: libFuzzer target for the reader of parameter files, driver/tensors.c,
 * as `cavs train --init-all FILE` takes a file from someone else: tensors_open, then
 * tensors_read of every tensor of at most MAX_COUNT elements, into double and into float.
 * The input is a .safetensors file, or built with -DFUZZ_NPZ an .npz: the format goes by
 * the name, so the input is written to a file of that name in a directory of this
 * process's own (fuzz-tensors-PID under /dev/shm, else $TMPDIR or /tmp), the same for
 * every input.
 *
 * tensors.c belongs to the cavs command, which frees nothing (the keep list) and dies on
 * the first error. The harness gives it its own die() (the message kept, a longjmp back
 * here), xmalloc, fmt and keep; tensors.c is built with alloc_track.h forced in, and
 * jansson allocates through the same table, so that every block an input left behind is
 * freed after it, a die() halfway included; and with -Dopen=fuzz_open, so that the files
 * it opened are closed after it too.
 *
 * Checked (abort() otherwise):
 *  - a refusal is die(1) saying "FILE: error: ...", "FILE: cannot read: ..." or "cannot
 *    open ...", with no control byte (C0, DEL, C1 as UTF-8): the file's bytes are shown
 *    escaped. die(2) (out of memory) is a finding: the input is a few KB, and with
 *    -malloc_limit_mb libFuzzer reports a request for absurd memory itself;
 *  - the index: sorted by name without duplicates, tensors_find finds each entry; rank,
 *    count and bytes agree with the shape and dtype; a safetensors file's tensors tile
 *    the bytes after its header exactly; an .npz entry lies within the file and its .npy
 *    header and data make up its uncompressed size;
 *  - a read that succeeds gives finite values (in float's range, read as float); the
 *    float read takes no more than the double read, agrees with it (x_float ==
 *    (float)x_double), and refuses only for the same reason or a value past float's range;
 *  - the tensors of rank 1 and 2 that were read, written back with tensors_write to a
 *    .safetensors file and an .npz, open and read again: the same names, shapes, bytes.
 * FUZZ_VERBOSE=1 in the environment prints each verdict. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc_track.h" /* the harness's own blocks too: all of them freed after each input */
#include "driver.h"

#ifdef FUZZ_NPZ
#define SUFFIX ".npz"
#else
#define SUFFIX ".safetensors"
#endif

/* The elements a tensor may have to be read (init_all reads what the model's parameter
   takes, no more), and all of them together: a deflated entry of a few bytes can say
   megabytes, and an .npz can name the same one many times. */
enum { MAX_COUNT = 1 << 20, MAX_TOTAL = 1 << 22 };

static jmp_buf jump;
static int status; /* the last die()'s status and message */
static char msg[2048];
static char dir[200], in[256], back[2][256];
static int in_fd = -1;
static int fds[64], nfds; /* what tensors.c opened for this input */

/* a message as printed here: control bytes escaped */
static const char *esc(const char *s) {
  static char out[4 * sizeof msg + 1];
  char *p = out;
  for (const unsigned char *c = (const unsigned char *)s; *c && p < out + sizeof out - 5; c++)
    p += *c >= 0x20 && *c < 0x7f ? sprintf(p, "%c", *c) : sprintf(p, "\\x%02x", *c);
  *p = 0;
  return out;
}

/* d and the files in it, if it is a directory of ours */
static void remove_dir(const char *d) {
  struct stat st;
  DIR *dp = lstat(d, &st) || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ? NULL : opendir(d);
  for (struct dirent *e; dp && (e = readdir(dp));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(dirfd(dp), e->d_name, 0);
  if (dp) closedir(dp), rmdir(d);
}
static void cleanup(void) { remove_dir(dir); }

static _Noreturn void fail(const char *f, ...) {
  cleanup(); /* (libFuzzer leaves by _Exit: no atexit) */
  va_list ap;
  va_start(ap, f);
  fputs("fuzz_tensors: ", stderr);
  vfprintf(stderr, f, ap);
  fputc('\n', stderr);
  va_end(ap);
  abort();
}

/* ---- what tensors.c takes from the rest of the cavs command (util.c) ---- */

_Noreturn void die(int st, const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  vsnprintf(msg, sizeof msg, f, ap);
  va_end(ap);
  status = st;
  longjmp(jump, 1);
}
void *keep(void *p) { return p; } /* in alloc_track's table already */
void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) die(2, "out of memory");
  return p;
}
char *fmt(const char *f, ...) { /* (what tensors.c formats is short: a number, a place) */
  char buf[4096];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return strcpy(xmalloc(strlen(buf) + 1), buf);
}
void json_set(json_t *obj, const char *key, json_t *v) {
  if (json_object_set_new(obj, key, v)) die(2, "out of memory");
}
void json_push(json_t *arr, json_t *v) {
  if (json_array_append_new(arr, v)) die(2, "out of memory");
}
char *json_text(const json_t *j, size_t flags) { /* (util.c's reads the text back too) */
  char *text = json_dumps(j, flags);
  if (!text) die(2, "out of memory");
  return text;
}
json_t *json_read(const char *text, size_t n, size_t flags, json_error_t *e) { /* (util.c's: ft_malloc fails not) */
  return json_loadb(text, n, flags, e);
}
/* tensors.c's open(): the descriptor noted, to be closed after the input */
int fuzz_open(const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = flags & (O_CREAT | O_TMPFILE) ? (mode_t)va_arg(ap, int) : 0;
  va_end(ap);
  int fd = open(path, flags, mode);
  if (fd >= 0 && nfds == sizeof fds / sizeof *fds) fail("tensors.c opened more than %d files", nfds);
  if (fd >= 0) fds[nfds++] = fd;
  return fd;
}

/* ---- the calls, with die() caught: false (or NULL) when it died ---- */

static TensorFile *open_caught(const char *path) {
  status = 0;
  if (setjmp(jump)) return NULL;
  return tensors_open(path);
}
static bool read_caught(const TensorFile *f, const TensorEntry *e, void *dst, bool f64) {
  status = 0;
  if (setjmp(jump)) return false;
  tensors_read(f, e, dst, f64);
  return true;
}
static bool write_caught(const char *path, const Tensor *t, int n, json_t *meta) {
  status = 0;
  if (setjmp(jump)) return false;
  tensors_write(path, t, n, meta);
  return true;
}

static bool control_byte(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p < 0x20 || *p == 0x7f || (p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0)) return true;
  return false;
}

/* the last die() was a refusal of the input file, said as tensors.c says them */
static void check_refusal(const char *what) {
  size_t n = strlen(in);
  if (status != 1) fail("%s: die(%d): %s", what, status, esc(msg));
  if (strncmp(msg, "cannot open '", 13) &&
      (strncmp(msg, in, n) || (strncmp(msg + n, ": error: ", 9) && strncmp(msg + n, ": cannot read: ", 15))))
    fail("%s: a message that names no file: %s", what, esc(msg));
  if (control_byte(msg)) fail("%s: a control byte in the message: %s", what, esc(msg));
  if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "%s: %s\n", what, esc(msg));
}

static int by_place(const void *a, const void *b) {
  const TensorEntry *x = a, *y = b;
  return x->off != y->off ? (x->off < y->off ? -1 : 1) : x->bytes < y->bytes ? -1 : x->bytes > y->bytes;
}

/* the index of the input file, size bytes of data */
static void check_index(const TensorFile *f, const uint8_t *data, size_t size) {
  for (int i = 0; i < f->n; i++) {
    const TensorEntry *e = &f->e[i];
    if (i && strcmp(f->e[i - 1].name, e->name) >= 0)
      fail("entries '%s' and '%s' out of order, or one twice", f->e[i - 1].shown, e->shown);
    if (tensors_find(f, e->name) != e) fail("tensors_find('%s') finds another entry", e->shown);
    if (control_byte(e->shown) || control_byte(e->dtype))
      fail("'%s' (%s) is not shown escaped", esc(e->shown), esc(e->dtype));
    uint64_t count = 1, bytes;
    if (e->rank < 0 || e->rank > TENSOR_MAX_RANK) fail("'%s': rank %d", e->shown, e->rank);
    for (int k = 0; k < e->rank; k++)
      if (e->shape[k] < 0 || __builtin_mul_overflow(count, (uint64_t)e->shape[k], &count))
        fail("'%s': its shape", e->shown);
    if (!e->real || count != e->count || __builtin_mul_overflow(count, e->f64 ? 8u : 4u, &bytes) || bytes != e->bytes)
      fail("'%s': %s, count %llu, bytes %llu", e->shown, e->dtype, (unsigned long long)e->count,
           (unsigned long long)e->bytes);
#ifdef FUZZ_NPZ
    if (!e->zip || e->off > size || e->csize > size - e->off || (!e->deflated && e->csize != e->usize) ||
        e->skip < 10 || e->skip > e->usize || e->usize - e->skip != e->bytes)
      fail("'%s': off %llu, csize %llu, usize %llu, skip %llu, bytes %llu in a file of %zu", e->shown,
           (unsigned long long)e->off, (unsigned long long)e->csize, (unsigned long long)e->usize,
           (unsigned long long)e->skip, (unsigned long long)e->bytes, size);
#else
    if (e->zip || e->swap || e->skip) fail("'%s': read as a zip entry", e->shown);
#endif
  }
#ifndef FUZZ_NPZ
  /* the data after the header, tensor by tensor, to the end of the file */
  uint64_t at = 8;
  for (int k = 0; k < 8; k++) at += (uint64_t)data[k] << 8 * k;
  TensorEntry *s = malloc(sizeof *s * (size_t)f->n + 1);
  if (f->n) memcpy(s, f->e, sizeof *s * (size_t)f->n); /* (f->e is NULL for none) */
  qsort(s, (size_t)f->n, sizeof *s, by_place);
  for (int i = 0; i < f->n; at += s[i++].bytes)
    if (s[i].off != at)
      fail("'%s' at %llu, not %llu", s[i].shown, (unsigned long long)s[i].off, (unsigned long long)at);
  if (at != size) fail("the tensors end at %llu, the file at %zu", (unsigned long long)at, size);
#endif
}

/* The tensor read as double and as float; true with it in *t (to be written back) when
   both reads took it and it has 1 or 2 dimensions and a name tensors_write takes. */
static bool check_reads(const TensorFile *f, const TensorEntry *e, Tensor *t) {
  size_t n = (size_t)e->count;
  double *d = malloc(8 * n + 8);
  float *x = malloc(4 * n + 4);
  bool okd = read_caught(f, e, d, true);
  char dmsg[sizeof msg];
  if (!okd) {
    check_refusal("read as double");
    memcpy(dmsg, msg, sizeof msg);
  }
  bool okf = read_caught(f, e, x, false);
  if (!okf) check_refusal("read as float");
  bool range = !okf && strstr(msg, ", past the range of float");
  if (okf && !okd) fail("'%s': read as float, refused as double: %s", e->shown, esc(dmsg));
  if (!okd && !okf && strcmp(msg, dmsg) && !range)
    fail("'%s': refused as float for another reason: %s", e->shown, esc(msg));
  bool out = false; /* a value past float's range */
  for (size_t i = 0; okd && i < n; out |= !isfinite((float)d[i++]))
    if (!isfinite(d[i])) fail("'%s': %g at %zu read as double", e->shown, d[i], i);
  if (okd && !okf && !(range && out)) fail("'%s': refused as float, its values in range: %s", e->shown, esc(msg));
  for (size_t i = 0; okf && i < n; i++)
    if (!isfinite(x[i]) || x[i] != (float)d[i])
      fail("'%s': %g at %zu read as float, %g as double", e->shown, x[i], i, d[i]);
  bool ascii = !!strcmp(e->name, "__metadata__"); /* (json_set takes no key of bad UTF-8) */
  for (const char *c = e->name; *c; c++) ascii &= *c >= 0x20 && *c < 0x7f;
  if (!okd || (!okf && !e->f64) || e->rank < 1 || e->rank > 2 || !ascii) {
    free(d), free(x);
    return false;
  }
  *t = (Tensor){
      e->name, e->f64, e->rank, {(long)e->shape[0], e->rank > 1 ? (long)e->shape[1] : 0}, e->f64 ? (void *)d : x,
      e->bytes};
  return true;
}

/* t[0..n), in the order of their names, written to path and read back */
static void check_write_back(const char *path, const Tensor *t, int n) {
  json_t *meta = json_object();
  json_object_set_new(meta, "model", json_string("fuzz"));
  if (!write_caught(path, t, n, meta)) fail("tensors_write(%s): die(%d): %s", path, status, esc(msg));
  TensorFile *g = open_caught(path);
  if (!g) fail("%s as written does not open: %s", path, esc(msg));
  if (g->n != n) fail("%s: %d tensors written, %d read", path, n, g->n);
  for (int i = 0; i < n; i++) {
    const TensorEntry *e = &g->e[i];
    if (strcmp(e->name, t[i].name) || e->rank != t[i].rank || e->shape[0] != t[i].shape[0] ||
        (e->rank > 1 && e->shape[1] != t[i].shape[1]) || e->f64 != t[i].f64 || e->bytes != t[i].bytes)
      fail("%s: tensor %d written as '%s', read as '%s'", path, i, t[i].name, e->shown);
    void *v = malloc(e->bytes + 1);
    if (!read_caught(g, e, v, e->f64)) fail("%s: '%s' as written does not read: %s", path, e->shown, esc(msg));
    if (memcmp(v, t[i].data, t[i].bytes)) fail("%s: '%s' reads back other values", path, e->shown);
  }
}

/* The directory fuzz-tensors-PID, made after removing those of processes gone (a
   sanitizer's report leaves by _Exit: no atexit, no fail()). */
static void setup(void) {
  const char *tmp = getenv("TMPDIR"), *base = !access("/dev/shm", W_OK) ? "/dev/shm" : tmp && *tmp ? tmp : "/tmp";
  DIR *dp = opendir(base);
  for (struct dirent *e; dp && (e = readdir(dp));) {
    int pid;
    char c;
    if (sscanf(e->d_name, "fuzz-tensors-%d%c", &pid, &c) != 1 || pid <= 0 || !(kill(pid, 0) && errno == ESRCH))
      continue;
    snprintf(dir, sizeof dir, "%s/%s", base, e->d_name);
    remove_dir(dir);
  }
  if (dp) closedir(dp);
  snprintf(dir, sizeof dir, "%s/fuzz-tensors-%d", base, (int)getpid());
  remove_dir(dir); /* (left by a process of the same pid, long gone) */
  if (mkdir(dir, 0700)) fail("cannot make %s: %s", dir, strerror(errno));
  snprintf(in, sizeof in, "%s/in%s", dir, SUFFIX);
  snprintf(back[0], sizeof back[0], "%s/back.safetensors", dir);
  snprintf(back[1], sizeof back[1], "%s/back.npz", dir);
  in_fd = open(in, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (in_fd < 0) fail("cannot make %s: %s", in, strerror(errno));
  atexit(cleanup);
  json_set_alloc_funcs(ft_malloc, ft_free);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (in_fd < 0) setup();
  if (ftruncate(in_fd, 0) || pwrite(in_fd, data, size, 0) != (ssize_t)size) abort(); /* (a regular file: all at once) */
  TensorFile *f = open_caught(in);
  if (!f) {
    check_refusal("open");
  } else {
    if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "open: %d tensors\n", f->n);
    check_index(f, data, size);
    Tensor *t = malloc(sizeof *t * (size_t)f->n + 1);
    int n = 0;
    uint64_t total = 0;
    for (int i = 0; i < f->n; i++)
      if (f->e[i].count <= MAX_COUNT && (total += f->e[i].count) <= MAX_TOTAL) n += check_reads(f, &f->e[i], &t[n]);
    for (int k = 0; k < 2; k++) check_write_back(back[k], t, n);
  }
  while (nfds) close(fds[--nfds]);
  ft_release_all();
  return 0;
}

/* failio.c: an LD_PRELOAD shim that makes one call of a process's file output fail, for
 * the fault-injection tests of the disk (check_driver's, and a sweep by hand:
 * tests/README).
 *
 *   FAILIO_PROG   the program counted, by name ("cavs", "cavsc"; libtool's "lt-" prefix
 *                 ignored); unset, every program. Only the process that execs it is
 *                 counted: a child it forks (gnuplot, the C compiler) is not, until it
 *                 execs a program of that name itself.
 *   FAILIO_CALLS  the calls counted, a comma-separated list (default "all", which is
 *                 every one but malloc):
 *                   write   write, pwrite, writev, pwritev (to a regular file or a
 *                           block device, not descriptors 0-2)
 *                   sync    fsync, fdatasync
 *                   close   close (not of descriptors 0-2, nor of a pipe or socket)
 *                   rename  rename, renameat, renameat2
 *                   link    link, linkat
 *                   open    open, openat, creat for writing (O_WRONLY, O_RDWR, O_CREAT,
 *                           O_TRUNC or O_TMPFILE), fopen with a mode that writes
 *                   trunc   ftruncate, fallocate, posix_fallocate
 *                   stdio   fwrite, fputs, fputc, putc, fprintf, vfprintf, fflush,
 *                           fclose (not on stdin, stdout or stderr, nor on a memory
 *                           stream, which has no descriptor): glibc's streams
 *                           write through an internal write no shim can see, so the
 *                           failure is made at this level, the buffer dropped as a
 *                           failed write drops it
 *                   malloc  malloc, calloc, realloc, reallocarray, posix_memalign,
 *                           aligned_alloc, memalign, valloc, pvalloc, and mmap of
 *                           anonymous memory (ENOMEM; glibc's own calls of malloc, from
 *                           strdup or fopen, are counted too, its own mmap not)
 *   FAILIO_N      the counted call that fails (1 the first); 0 or unset, none
 *   FAILIO_ALSO   a second counted call that fails, after FAILIO_N (two faults: the
 *                 second in what undoes the first, or in what a fallback does)
 *   FAILIO_ERR    ENOSPC (the default) or EIO
 *   FAILIO_STICKY 1: every counted call after the N-th fails too (a disk that stays
 *                 full)
 *   FAILIO_SHORT  1: a failing write of more than one byte writes half and returns
 *                 that (as a disk filling up mid-write does); the next counted call
 *                 fails with the error. A failing fwrite writes what its stream held
 *                 and half its own bytes, then fails.
 *   FAILIO_OUT    a file each counted process appends one line to as it exits
 *                 normally: "PROG PID calls=K", and at the fault "PROG PID fault=N
 *                 CALL" (written at once, so a process that dies still records it)
 *   FAILIO_TRACE  1: a line "PROG PID N CALL" in FAILIO_OUT for every counted call,
 *                 and for a call on a descriptor (write, fsync, close) the file it
 *                 names after a space ("cavs 71 12 write /tmp/x/run.log")
 *
 * Built as a shared object: cc -shared -fPIC -o failio.so failio.c -ldl. Not for a
 * sanitizer's build (its own interceptors come first). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum { C_WRITE = 1, C_SYNC = 2, C_CLOSE = 4, C_RENAME = 8, C_LINK = 16, C_OPEN = 32, C_TRUNC = 64, C_STDIO = 128,
       C_MALLOC = 256, C_ALL = 255 };

static int classes;      /* what is counted; 0 before init or in a process not counted */
static long fail_at;     /* FAILIO_N */
static long fail_also;   /* FAILIO_ALSO */
static int fail_errno = ENOSPC;
static bool sticky, shortw, trace;
static pid_t owner; /* the process counted (a forked child is not) */
static atomic_long calls;
static atomic_bool failed, short_pending;
static char out_path[4096];
static char prog[256];
/* a shim's own call (dlsym, its record) is not counted; initial-exec, as the general
   model's first access may itself call malloc */
static _Thread_local int inside __attribute__((tls_model("initial-exec")));
/* inside fopen, whose own open is the same call (its malloc is counted) */
static _Thread_local int opening __attribute__((tls_model("initial-exec")));

static void record(const char *line) {
  if (!out_path[0]) return;
  int fd = (int)syscall(SYS_openat, AT_FDCWD, out_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!syscall(SYS_write, fd, line, strlen(line));
  syscall(SYS_close, fd);
}

static void at_exit_record(void) {
  if (!classes || getpid() != owner) return;
  char line[512];
  snprintf(line, sizeof line, "%s %ld calls=%ld\n", prog, (long)owner, (long)atomic_load(&calls));
  record(line);
}

static void not_counted(void) { classes = 0; }

__attribute__((constructor)) static void failio_init(void) {
  inside++;
  const char *name = program_invocation_short_name;
  if (!strncmp(name, "lt-", 3)) name += 3;
  snprintf(prog, sizeof prog, "%s", name);
  const char *want = getenv("FAILIO_PROG");
  bool counted = !want || !*want;
  for (const char *p = want; p && *p && !counted;) {
    size_t n = strcspn(p, ",");
    counted = n == strlen(name) && !strncmp(p, name, n);
    p += n + (p[n] == ',');
  }
  if (counted) {
    const char *c = getenv("FAILIO_CALLS");
    static const char *const names[] = {"write", "sync", "close", "rename", "link", "open", "trunc", "stdio", "malloc"};
    int set = 0;
    for (const char *p = c && *c ? c : "all"; *p;) {
      size_t n = strcspn(p, ",");
      if (n == 3 && !strncmp(p, "all", 3)) set |= C_ALL;
      for (int i = 0; i < 9; i++)
        if (n == strlen(names[i]) && !strncmp(p, names[i], n)) set |= 1 << i;
      p += n + (p[n] == ',');
    }
    const char *e = getenv("FAILIO_N");
    fail_at = e ? atol(e) : 0;
    e = getenv("FAILIO_ALSO");
    fail_also = e ? atol(e) : 0;
    e = getenv("FAILIO_ERR");
    fail_errno = e && !strcmp(e, "EIO") ? EIO : ENOSPC;
    e = getenv("FAILIO_STICKY");
    sticky = e && *e == '1';
    e = getenv("FAILIO_TRACE");
    trace = e && *e == '1';
    e = getenv("FAILIO_SHORT");
    shortw = e && *e == '1';
    e = getenv("FAILIO_OUT");
    if (e) snprintf(out_path, sizeof out_path, "%s", e);
    owner = getpid();
    classes = set;
    atexit(at_exit_record);
    pthread_atfork(NULL, NULL, not_counted);
  }
  inside--;
}

#define REAL(ret, name, args) \
  static ret(*real_##name) args; \
  if (!real_##name) { \
    inside++; \
    real_##name = (ret(*) args)dlsym(RTLD_NEXT, #name); \
    inside--; \
  }

static _Thread_local int traced_fd = -1; /* the descriptor of the call being counted */

/* Whether this call of class c fails: 0, or the errno to fail with (ENOSPC, EIO) */
static int fault(int c, const char *what) {
  if (!(classes & c) || inside) return 0;
  if (atomic_load(&short_pending) && atomic_exchange(&short_pending, false)) return fail_errno;
  long k = atomic_fetch_add(&calls, 1) + 1;
  if (trace) {
    char line[4600], file[4096] = "";
    inside++;
    if (traced_fd >= 0) {
      char link[64];
      snprintf(link, sizeof link, "/proc/self/fd/%d", traced_fd);
      ssize_t n = readlink(link, file + 1, sizeof file - 2);
      if (n > 0) file[0] = ' ', file[n + 1] = 0;
    }
    snprintf(line, sizeof line, "%s %ld %ld %s%s\n", prog, (long)owner, k, what, file);
    record(line);
    inside--;
  }
  if (fail_at <= 0 || k < fail_at) return 0;
  if (k > fail_at && !sticky && k != fail_also) return 0;
  if (k == fail_at || k == fail_also) {
    atomic_store(&failed, true);
    char line[512];
    inside++;
    snprintf(line, sizeof line, "%s %ld fault=%ld %s\n", prog, (long)owner, k, what);
    record(line);
    inside--;
  }
  return c == C_MALLOC ? ENOMEM : fail_errno;
}

/* fault() for a call on descriptor fd, whose file the trace names */
static int fault_on(int c, const char *what, int fd) {
  traced_fd = fd;
  int e = fault(c, what);
  traced_fd = -1;
  return e;
}

/* descriptors 0-2 and what is not a file on a disk (a pipe, a socket, a terminal) are
   not counted: a disk's faults are what this is for */
static bool std_fd(int fd) {
  struct stat st;
  return (fd >= 0 && fd <= 2) || fstat(fd, &st) || !(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode));
}
static bool std_stream(FILE *f) { return f == stdin || f == stdout || f == stderr; }

/* f's descriptor, or -1 (a memory stream), errno kept: glibc's fileno sets EBADF for a
   stream without one, which the shim's own look must not leave for the caller (an
   fclose of an fmemopen stream, after a failed allocation, left errno EBADF where cavs
   reads ENOMEM) */
static int stream_fd(FILE *f) {
  int e = errno, fd = fileno(f);
  errno = e;
  return fd;
}

/* A failing write's bytes: -1, or with FAILIO_SHORT half of them written first */
static ssize_t failed_write(int fd, const void *p, size_t n, int e) {
  if (shortw && n > 1 && !atomic_load(&short_pending)) {
    ssize_t w = syscall(SYS_write, fd, p, n / 2);
    if (w > 0) {
      atomic_store(&short_pending, true);
      return w;
    }
  }
  errno = e;
  return -1;
}

ssize_t write(int fd, const void *p, size_t n) {
  REAL(ssize_t, write, (int, const void *, size_t));
  int e = std_fd(fd) ? 0 : fault_on(C_WRITE, "write", fd);
  return e ? failed_write(fd, p, n, e) : real_write(fd, p, n);
}

ssize_t pwrite(int fd, const void *p, size_t n, off_t off) {
  REAL(ssize_t, pwrite, (int, const void *, size_t, off_t));
  int e = std_fd(fd) ? 0 : fault_on(C_WRITE, "pwrite", fd);
  if (e) return errno = e, -1;
  return real_pwrite(fd, p, n, off);
}

ssize_t pwrite64(int fd, const void *p, size_t n, off_t off) { return pwrite(fd, p, n, off); }

ssize_t writev(int fd, const struct iovec *v, int cnt) {
  REAL(ssize_t, writev, (int, const struct iovec *, int));
  int e = std_fd(fd) ? 0 : fault_on(C_WRITE, "writev", fd);
  if (e) return errno = e, -1;
  return real_writev(fd, v, cnt);
}

ssize_t pwritev(int fd, const struct iovec *v, int cnt, off_t off) {
  REAL(ssize_t, pwritev, (int, const struct iovec *, int, off_t));
  int e = std_fd(fd) ? 0 : fault_on(C_WRITE, "pwritev", fd);
  if (e) return errno = e, -1;
  return real_pwritev(fd, v, cnt, off);
}

int fsync(int fd) {
  REAL(int, fsync, (int));
  int e = fault_on(C_SYNC, "fsync", fd);
  if (e) return errno = e, -1;
  return real_fsync(fd);
}

int fdatasync(int fd) {
  REAL(int, fdatasync, (int));
  int e = fault_on(C_SYNC, "fdatasync", fd);
  if (e) return errno = e, -1;
  return real_fdatasync(fd);
}

/* A close that fails still closes (Linux always releases the descriptor). */
int close(int fd) {
  REAL(int, close, (int));
  int e = std_fd(fd) ? 0 : fault_on(C_CLOSE, "close", fd);
  int rc = real_close(fd);
  if (e) return errno = e, -1;
  return rc;
}

int rename(const char *a, const char *b) {
  REAL(int, rename, (const char *, const char *));
  int e = fault(C_RENAME, "rename");
  if (e) return errno = e, -1;
  return real_rename(a, b);
}

int renameat(int da, const char *a, int db, const char *b) {
  REAL(int, renameat, (int, const char *, int, const char *));
  int e = fault(C_RENAME, "renameat");
  if (e) return errno = e, -1;
  return real_renameat(da, a, db, b);
}

int renameat2(int da, const char *a, int db, const char *b, unsigned flags) {
  REAL(int, renameat2, (int, const char *, int, const char *, unsigned));
  int e = fault(C_RENAME, "renameat2");
  if (e) return errno = e, -1;
  return real_renameat2(da, a, db, b, flags);
}

int link(const char *a, const char *b) {
  REAL(int, link, (const char *, const char *));
  int e = fault(C_LINK, "link");
  if (e) return errno = e, -1;
  return real_link(a, b);
}

int linkat(int da, const char *a, int db, const char *b, int flags) {
  REAL(int, linkat, (int, const char *, int, const char *, int));
  int e = fault(C_LINK, "linkat");
  if (e) return errno = e, -1;
  return real_linkat(da, a, db, b, flags);
}

static bool writes(int flags) {
  return (flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC)) || (flags & O_TMPFILE) == O_TMPFILE;
}

static mode_t mode_arg(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *p, int flags, ...) {
  REAL(int, open, (const char *, int, ...));
  va_list ap;
  va_start(ap, flags);
  mode_t m = mode_arg(flags, ap);
  va_end(ap);
  int e = writes(flags) && !opening ? fault(C_OPEN, "open") : 0;
  if (e) return errno = e, -1;
  return real_open(p, flags, m);
}

int open64(const char *p, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t m = mode_arg(flags, ap);
  va_end(ap);
  return open(p, flags, m);
}

int openat(int d, const char *p, int flags, ...) {
  REAL(int, openat, (int, const char *, int, ...));
  va_list ap;
  va_start(ap, flags);
  mode_t m = mode_arg(flags, ap);
  va_end(ap);
  int e = writes(flags) && !opening ? fault(C_OPEN, "openat") : 0;
  if (e) return errno = e, -1;
  return real_openat(d, p, flags, m);
}

int openat64(int d, const char *p, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t m = mode_arg(flags, ap);
  va_end(ap);
  return openat(d, p, flags, m);
}

int creat(const char *p, mode_t m) { return open(p, O_CREAT | O_WRONLY | O_TRUNC, m); }
int creat64(const char *p, mode_t m) { return creat(p, m); }

static bool mode_writes(const char *m) { return strpbrk(m, "wa+") != NULL; }

FILE *fopen(const char *p, const char *m) {
  REAL(FILE *, fopen, (const char *, const char *));
  int e = mode_writes(m) ? fault(C_OPEN, "fopen") : 0;
  if (e) return errno = e, NULL;
  opening++;
  FILE *f = real_fopen(p, m);
  opening--;
  return f;
}

FILE *fopen64(const char *p, const char *m) { return fopen(p, m); }

int ftruncate(int fd, off_t n) {
  REAL(int, ftruncate, (int, off_t));
  int e = fault(C_TRUNC, "ftruncate");
  if (e) return errno = e, -1;
  return real_ftruncate(fd, n);
}

int ftruncate64(int fd, off_t n) { return ftruncate(fd, n); }

int fallocate(int fd, int mode, off_t off, off_t n) {
  REAL(int, fallocate, (int, int, off_t, off_t));
  int e = fault(C_TRUNC, "fallocate");
  if (e) return errno = e, -1;
  return real_fallocate(fd, mode, off, n);
}

int fallocate64(int fd, int mode, off_t off, off_t n) { return fallocate(fd, mode, off, n); }

int posix_fallocate(int fd, off_t off, off_t n) {
  REAL(int, posix_fallocate, (int, off_t, off_t));
  int e = fault(C_TRUNC, "posix_fallocate");
  if (e) return e;
  return real_posix_fallocate(fd, off, n);
}

int posix_fallocate64(int fd, off_t off, off_t n) { return posix_fallocate(fd, off, n); }

/* ---- stdio: the stream's buffer dropped and its error set, as a failed write leaves it ---- */

static int stdio_fault(FILE *f, const char *what) {
  if (!f || std_stream(f) || stream_fd(f) < 0) return 0; /* (a memory stream: no disk) */
  int e = fault(C_STDIO, what);
  if (e) {
    __fpurge(f);
    f->_flags |= 0x20; /* _IO_ERR_SEEN: ferror(f) from now on */
    errno = e;
  }
  return e;
}

size_t fwrite(const void *p, size_t size, size_t n, FILE *f) {
  REAL(size_t, fwrite, (const void *, size_t, size_t, FILE *));
  REAL(int, fflush, (FILE *));
  /* FAILIO_SHORT: what the stream holds and half of these bytes reach the file first */
  bool half = shortw && size * n > 1 && !inside && (classes & C_STDIO) && !std_stream(f) && stream_fd(f) > 2 && fail_at > 0 &&
              atomic_load(&calls) + 1 == fail_at;
  if (half) {
    inside++;
    real_fwrite(p, 1, size * n / 2, f);
    real_fflush(f);
    inside--;
  }
  if (stdio_fault(f, "fwrite")) return 0;
  return real_fwrite(p, size, n, f);
}

#undef fwrite_unlocked
size_t fwrite_unlocked(const void *p, size_t size, size_t n, FILE *f) { return fwrite(p, size, n, f); }

int fputs(const char *s, FILE *f) {
  REAL(int, fputs, (const char *, FILE *));
  if (stdio_fault(f, "fputs")) return EOF;
  return real_fputs(s, f);
}

int fputc(int c, FILE *f) {
  REAL(int, fputc, (int, FILE *));
  if (stdio_fault(f, "fputc")) return EOF;
  return real_fputc(c, f);
}

#undef putc
int putc(int c, FILE *f) { return fputc(c, f); }

int vfprintf(FILE *f, const char *fmt, va_list ap) {
  REAL(int, vfprintf, (FILE *, const char *, va_list));
  if (stdio_fault(f, "vfprintf")) return -1;
  return real_vfprintf(f, fmt, ap);
}

int fprintf(FILE *f, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vfprintf(f, fmt, ap);
  va_end(ap);
  return rc;
}

int __fprintf_chk(FILE *f, int flag, const char *fmt, ...) {
  (void)flag;
  va_list ap;
  va_start(ap, fmt);
  int rc = vfprintf(f, fmt, ap);
  va_end(ap);
  return rc;
}

int __vfprintf_chk(FILE *f, int flag, const char *fmt, va_list ap) {
  (void)flag;
  return vfprintf(f, fmt, ap);
}

int fflush(FILE *f) {
  REAL(int, fflush, (FILE *));
  if (stdio_fault(f, "fflush")) return EOF;
  return real_fflush(f);
}

int fclose(FILE *f) {
  REAL(int, fclose, (FILE *));
  int e = stdio_fault(f, "fclose");
  int rc = real_fclose(f); /* (the stream is freed either way) */
  if (e) return errno = e, EOF;
  return rc;
}

/* ---- memory ---- */

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

void *malloc(size_t n) {
  if (fault(C_MALLOC, "malloc")) return errno = ENOMEM, NULL;
  return __libc_malloc(n);
}

void *calloc(size_t a, size_t b) {
  if (fault(C_MALLOC, "calloc")) return errno = ENOMEM, NULL;
  return __libc_calloc(a, b);
}

void *realloc(void *p, size_t n) {
  if (fault(C_MALLOC, "realloc")) return errno = ENOMEM, NULL;
  return __libc_realloc(p, n);
}

void *reallocarray(void *p, size_t a, size_t b) {
  size_t n;
  if (__builtin_mul_overflow(a, b, &n)) return errno = ENOMEM, NULL;
  if (fault(C_MALLOC, "reallocarray")) return errno = ENOMEM, NULL;
  return __libc_realloc(p, n);
}

/* posix_memalign returns its error and leaves errno alone */
int posix_memalign(void **p, size_t align, size_t n) {
  REAL(int, posix_memalign, (void **, size_t, size_t));
  if (fault(C_MALLOC, "posix_memalign")) return ENOMEM;
  return real_posix_memalign(p, align, n);
}

void *aligned_alloc(size_t align, size_t n) {
  REAL(void *, aligned_alloc, (size_t, size_t));
  if (fault(C_MALLOC, "aligned_alloc")) return errno = ENOMEM, NULL;
  return real_aligned_alloc(align, n);
}

void *memalign(size_t align, size_t n) {
  if (fault(C_MALLOC, "memalign")) return errno = ENOMEM, NULL;
  return __libc_memalign(align, n);
}

void *valloc(size_t n) {
  if (fault(C_MALLOC, "valloc")) return errno = ENOMEM, NULL;
  return __libc_valloc(n);
}

void *pvalloc(size_t n) {
  if (fault(C_MALLOC, "pvalloc")) return errno = ENOMEM, NULL;
  return __libc_pvalloc(n);
}

/* anonymous memory only (a file's mapping is not an allocation); glibc's malloc, the
   loader and the threads' stacks map through calls of their own, not this one */
void *mmap(void *addr, size_t n, int prot, int flags, int fd, off_t off) {
  REAL(void *, mmap, (void *, size_t, int, int, int, off_t));
  int e = (flags & MAP_ANONYMOUS) && !(flags & MAP_FIXED) ? fault(C_MALLOC, "mmap") : 0;
  if (e) return errno = ENOMEM, MAP_FAILED;
  return real_mmap(addr, n, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t n, int prot, int flags, int fd, off_t off) { return mmap(addr, n, prot, flags, fd, off); }

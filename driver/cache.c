/* cache.c: the compile cache of the `cavs` command. A model's source text goes to cavsc
 * on its standard input, the C it writes to the system C compiler, and the shared object
 * into a directory named by a SHA-256 key of everything that shaped it; later runs load
 * that object instead of compiling again. Those two steps (cache_compile) are the one way
 * a model is built: `cavs build` runs them too, into a directory of the user's
 * (cache_build_into).
 *
 * Loading native code is where an attacker on the same machine would aim, so nothing in
 * the cache is trusted until checked (docs/DESIGN.md, "Untrusted input"):
 *   - the cache directory is a real directory (not a symbolic link), owned by the user
 *     running cavs and writable by nobody else, created 0700; the directories on the way
 *     to it are owned by root or the user and not writable by others unless sticky (as
 *     /tmp is), and so are the symbolic links on the way (whose owner could point them
 *     elsewhere);
 *   - entries and their files are opened without following symbolic links and checked
 *     the same way (owner, mode, a regular file);
 *   - each entry records the SHA-256 of its object, and the bytes that are hashed are the
 *     bytes that are loaded (dlopen through /proc/self/fd of the verified descriptor);
 *   - the model's name, which becomes a symbol name, must be an identifier;
 *   - an entry that is ours but incomplete (a killed build, a deleted or truncated
 *     object) is removed and rebuilt; one that is not safe is refused with a message.
 * Both compilers run from argument vectors (fork + execvp), never through a shell.
 * SHA-256 comes from nettle (Debian's libnettle): a key an attacker cannot collide, and
 * less code of our own than a hand-written hash. */
#include "cache.h"
#include "afile.h"
#include "outputs.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <nettle/sha2.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define META_MAGIC "cavs cache entry 1"

static _Noreturn void out_of_memory(void) {
  fputs("cavs: out of memory\n", stderr);
  exit(2);
}

static char *fmt(const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  char *s = NULL;
  if (vasprintf(&s, f, ap) < 0) s = NULL;
  va_end(ap);
  if (!s) out_of_memory();
  return s;
}

/* The extension of the source cavsc writes for the request's target: "c" or "cu". */
static const char *src_ext(const CacheReq *q) { return q->target && !strcmp(q->target, "cuda") ? "cu" : "c"; }

/* ---- hashing ---- */

static void hash_field(struct sha256_ctx *c, const void *p, size_t n) {
  /* length first, so that no two lists of fields hash the same bytes */
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)n >> (8 * i));
  sha256_update(c, 8, len);
  sha256_update(c, n, p);
}

static void hex(const unsigned char *d, char out[2 * SHA256_DIGEST_SIZE + 1]) {
  for (int i = 0; i < SHA256_DIGEST_SIZE; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

/* Reads a whole file opened by the caller (at most `max` bytes); NULL on error. */
static unsigned char *read_fd(int fd, size_t max, size_t *len) {
  size_t cap = 1 << 16, n = 0;
  unsigned char *buf = malloc(cap);
  if (!buf) return NULL;
  for (;;) {
    if (n == cap) {
      if (cap >= max) break;
      unsigned char *b = realloc(buf, cap *= 2);
      if (!b) break;
      buf = b;
    }
    ssize_t got = read(fd, buf + n, cap - n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    if (got == 0) {
      *len = n;
      return buf;
    }
    n += (size_t)got;
  }
  free(buf);
  return NULL;
}

static void hash_path(struct sha256_ctx *c, const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  size_t n = 0;
  unsigned char *data = fd >= 0 ? read_fd(fd, (size_t)1 << 30, &n) : NULL;
  if (fd >= 0) close(fd);
  hash_field(c, data ? data : (const unsigned char *)"", data ? n : 0);
  free(data);
}

static void hash_native(struct sha256_ctx *key, const CacheReq *q);

/* The key: the source, the versions of everything that turns it into code, cavsc's
 * precision, the C compiler and its flags, and the CPU that -march=native means here. */
static void cache_key(const CacheReq *q, char out[2 * SHA256_DIGEST_SIZE + 1]) {
  struct sha256_ctx c;
  sha256_init(&c);
  hash_field(&c, META_MAGIC, strlen(META_MAGIC));
  hash_field(&c, q->version, strlen(q->version));
  const char *prec = q->precision ? q->precision : "float", *target = src_ext(q);
  hash_field(&c, prec, strlen(prec));
  hash_field(&c, target, strlen(target));
  char abl[16];
  snprintf(abl, sizeof abl, "ablate %d", q->ablations);
  hash_field(&c, abl, strlen(abl));
  hash_field(&c, q->cc, strlen(q->cc));
  for (int i = 0; i < q->ncflags; i++) hash_field(&c, q->cflags[i], strlen(q->cflags[i]));
  hash_native(&c, q);
  /* a rebuilt compiler or runtime header (same version, in a development tree) must not
     reuse an old build: cavs_abi.h is what the generated code includes */
  for (int i = 0; i < 2; i++) {
    char *h = fmt("%s/%s", q->include, i ? "cavs_abi.h" : "cavs.h");
    hash_path(&c, h);
    free(h);
  }
  /* the compiler's own bytes: a path as given, or the first match in PATH */
  if (strchr(q->cavsc, '/')) {
    hash_path(&c, q->cavsc);
  } else {
    const char *path = getenv("PATH");
    char *dirs = fmt("%s", path ? path : "/usr/local/bin:/usr/bin:/bin");
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
      char *cand = fmt("%s/%s", *d ? d : ".", q->cavsc);
      bool found = access(cand, X_OK) == 0;
      if (found) hash_path(&c, cand);
      free(cand);
      if (found) break;
    }
    free(dirs);
  }
  hash_field(&c, q->text, q->len);
  unsigned char d[SHA256_DIGEST_SIZE];
  sha256_digest(&c, sizeof d, d);
  hex(d, out);
}

/* ---- running the compilers ---- */

/* Runs argv with `in` on its standard input (or nothing), its standard output and error
 * into the descriptor `out` when there is one (else cavs's own); returns its exit status,
 * 128 + signal, or -1 if it could not start. */
static int run(char *const argv[], const char *in, size_t inlen, int out) {
  int p[2] = {-1, -1};
  if (pipe2(p, O_CLOEXEC)) return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return -1;
  }
  if (pid == 0) {
    dup2(p[0], 0);
    if (out >= 0) {
      dup2(out, 1);
      dup2(out, 2);
    }
    execvp(argv[0], argv);
    _exit(127); /* the parent says what could not run */
  }
  close(p[0]);
  /* cavsc reads all of its input before it writes anything, so this cannot deadlock;
     SIGPIPE is ignored by the driver, so a child that exits early gives EPIPE here */
  for (size_t done = 0; in && done < inlen;) {
    ssize_t w = write(p[1], in + done, inlen - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += (size_t)w;
  }
  close(p[1]);
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int cache_check_source(const CacheReq *q, char *err, size_t errlen) {
  char *argv[] = {(char *)q->cavsc, "--check", "--source-name", (char *)q->name, "-", NULL};
  int st = run(argv, q->text, q->len, -1);
  if (st == 0) return 0;
  if (st == 1) {
    *err = 0;
    return 1;
  }
  if (st == 127 || st < 0) snprintf(err, errlen, "cannot run cavsc ('%s'); set CAVSC to its path", q->cavsc);
  else snprintf(err, errlen, "cavsc failed (status %d) on %s", st, q->name);
  return 2;
}

/* ---- the CPU a -march=native build is for ---- */

/* Whether the flag has the compiler build for the CPU it runs on. */
static bool native_flag(const char *f) {
  return !strcmp(f, "-march=native") || !strcmp(f, "-mcpu=native") || !strcmp(f, "-mtune=native");
}

/* Whether a word of the compiler driver's -### output names the CPU or one of its
 * features: gcc's -m options (-march=znver3 -mavx512f -mno-xop ... -mtune=znver3), and
 * the word after clang's -target-cpu, -tune-cpu and -target-feature (+avx512f). Paths,
 * versions and the working directory are left out: they are not the CPU's. */
static bool cpu_word(const char *w, const char *prev) {
  return !strncmp(w, "-m", 2) || (prev && (!strcmp(prev, "-target-cpu") || !strcmp(prev, "-tune-cpu") ||
                                           !strcmp(prev, "-target-feature")));
}

static int cmp_words(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Runs argv, a compiler driver asked what it would pass on (-###), and hashes into out
 * its exit status and the CPU words (cpu_word) of what it prints, sorted: the order is
 * nothing the drivers promise. */
static void hash_cpu_words(char *const argv[], unsigned char out[SHA256_DIGEST_SIZE]) {
  int fd = memfd_create("cavs-native", MFD_CLOEXEC);
  int st = fd >= 0 ? run(argv, NULL, 0, fd) : -1;
  size_t n = 0;
  unsigned char *said = fd >= 0 && lseek(fd, 0, SEEK_SET) == 0 ? read_fd(fd, (size_t)1 << 20, &n) : NULL;
  if (fd >= 0) close(fd);
  char *text = fmt("%.*s", said ? (int)n : 0, said ? (const char *)said : "");
  free(said);
  char **words = malloc(sizeof *words * (strlen(text) / 2 + 1)), *prev = NULL;
  if (!words) out_of_memory();
  size_t nw = 0;
  for (char *save = NULL, *w = strtok_r(text, " \t\r\n", &save); w; w = strtok_r(NULL, " \t\r\n", &save)) {
    size_t len = strlen(w);
    if (len >= 2 && w[0] == '"' && w[len - 1] == '"') w[len - 1] = 0, w++; /* gcc and clang quote some */
    if (cpu_word(w, prev)) words[nw++] = w;
    prev = w;
  }
  if (nw) qsort(words, nw, sizeof *words, cmp_words);
  struct sha256_ctx c;
  sha256_init(&c);
  char status[32];
  snprintf(status, sizeof status, "native: status %d", st);
  hash_field(&c, status, strlen(status));
  for (size_t i = 0; i < nw; i++) hash_field(&c, words[i], strlen(words[i]));
  sha256_digest(&c, SHA256_DIGEST_SIZE, out);
  free(words);
  free(text);
}

/* What the native flags among the request's mean on this machine, hashed into the key:
 * a cache in a home directory shared by machines of different CPUs (a cluster) must not
 * load one's AVX-512 code on another without it. The compiler driver expands
 * -march=native itself, so `cc FLAGS -### -E -x c /dev/null` says what it would pass on
 * (gcc and clang alike: the -m options, or -target-cpu and -target-feature), running
 * no compiler pass. Asked once a run for a given compiler and flags. Nothing is added
 * when no flag is native (nvcc's, for one). */
static void hash_native(struct sha256_ctx *key, const CacheReq *q) {
  static unsigned char memo_in[SHA256_DIGEST_SIZE], memo_out[SHA256_DIGEST_SIZE];
  static bool memo;
  char **argv = malloc(sizeof *argv * ((size_t)q->ncflags + 7));
  if (!argv) out_of_memory();
  int k = 0;
  argv[k++] = (char *)q->cc;
  for (int i = 0; i < q->ncflags; i++)
    if (native_flag(q->cflags[i])) argv[k++] = (char *)q->cflags[i];
  if (k > 1) {
    const char *probe[] = {"-###", "-E", "-x", "c", "/dev/null"};
    for (int i = 0; i < 5; i++) argv[k++] = (char *)probe[i];
    argv[k] = NULL;
    unsigned char in[SHA256_DIGEST_SIZE];
    struct sha256_ctx c;
    sha256_init(&c);
    for (int i = 0; i < k; i++) hash_field(&c, argv[i], strlen(argv[i]));
    sha256_digest(&c, sizeof in, in);
    if (!memo || memcmp(in, memo_in, sizeof in)) {
      hash_cpu_words(argv, memo_out);
      memcpy(memo_in, in, sizeof in);
      memo = true;
    }
    hash_field(key, memo_out, sizeof memo_out);
  }
  free(argv);
}

/* ---- checking what is on disk ---- */

/* Owned by us and writable by nobody else; `what` names it in the message. */
static int check_owner(const struct stat *st, const char *path, const char *what, char *err, size_t errlen) {
  if (st->st_uid != geteuid()) {
    snprintf(err, errlen,
             "refusing to use the cache: %s '%s' belongs to user %ld, not to you (user %ld); "
             "set CAVS_CACHE to a directory of your own",
             what, path, (long)st->st_uid, (long)geteuid());
    return -1;
  }
  if (st->st_mode & (S_IWGRP | S_IWOTH)) {
    snprintf(err, errlen,
             "refusing to use the cache: %s '%s' is writable by others (mode %04o); "
             "remove it, or run chmod go-w on it",
             what, path, (unsigned)(st->st_mode & 07777));
    return -1;
  }
  return 0;
}

/* A directory on the way to the cache `path`: owned by root or by us, and not writable by
 * others unless it is sticky (as /tmp is). */
static int check_above(const char *path, const char *dir, const struct stat *st, char *err, size_t errlen) {
  if (st->st_uid != 0 && st->st_uid != geteuid()) {
    snprintf(err, errlen,
             "refusing to use the cache '%s': the directory above it, '%s', belongs to user %ld; "
             "set CAVS_CACHE to a directory of your own",
             path, dir, (long)st->st_uid);
    return -1;
  }
  if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX)) {
    snprintf(err, errlen,
             "refusing to use the cache '%s': the directory above it, '%s', is writable by others "
             "(mode %04o); set CAVS_CACHE to a directory of your own",
             path, dir, (unsigned)(st->st_mode & 07777));
    return -1;
  }
  return 0;
}

/* Nobody else can rename the cache away, or point the way to it elsewhere, and put theirs
 * in its place. The directories above `path` are resolved here as the kernel resolves
 * them, a component at a time from the working directory or /: every symbolic link met,
 * in the path as given or in a link's target, must belong to root or to us (its owner can
 * replace it by another whenever they like), and every directory passed through
 * (check_above) is checked, those that hold a link included, the resolved ancestors
 * among them. The last component is the cache itself, which open_root checks. */
static int check_ancestors(const char *path, char *err, size_t errlen) {
  size_t n = strlen(path);
  while (n > 1 && path[n - 1] == '/') n--;
  while (n > 0 && path[n - 1] != '/') n--;
  char *rest; /* what is left to resolve */
  if (*path == '/') {
    rest = fmt("%.*s", (int)n, path);
  } else {
    char *cwd = getcwd(NULL, 0);
    if (!cwd) {
      snprintf(err, errlen, "cannot resolve the cache directory '%s': %s", path, strerror(errno));
      return -1;
    }
    rest = fmt("%s/%.*s", cwd, (int)n, path);
    free(cwd);
  }
  char *done = fmt("%s", ""); /* the directories resolved so far; "" is / */
  struct stat st;
  int rc = 0, links = 0;
  if (stat("/", &st)) {
    snprintf(err, errlen, "cannot inspect '/': %s", strerror(errno));
    rc = -1;
  } else {
    rc = check_above(path, "/", &st, err, errlen);
  }
  for (const char *p = rest; rc == 0;) {
    while (*p == '/') p++;
    if (!*p) break;
    size_t len = strcspn(p, "/");
    char *next = fmt("%s/%.*s", done, (int)len, p);
    p += len;
    if (!strcmp(next + strlen(done), "/.")) {
      free(next);
    } else if (!strcmp(next + strlen(done), "/..")) {
      free(next);
      char *up = strrchr(done, '/');
      if (up) *up = 0;
    } else if (lstat(next, &st)) {
      snprintf(err, errlen, "cannot inspect '%s': %s", next, strerror(errno));
      free(next);
      rc = -1;
    } else if (S_ISLNK(st.st_mode)) {
      char target[PATH_MAX + 1];
      ssize_t tlen = -1;
      if (st.st_uid != 0 && st.st_uid != geteuid())
        snprintf(err, errlen,
                 "refusing to use the cache '%s': the way to it goes through '%s', a symbolic link of user %ld "
                 "(who can point it elsewhere); set CAVS_CACHE to a directory of your own",
                 path, next, (long)st.st_uid);
      else if (++links > 40)
        snprintf(err, errlen, "cannot resolve the cache directory '%s': %s", path, strerror(ELOOP));
      else if ((tlen = readlink(next, target, sizeof target - 1)) < 0)
        snprintf(err, errlen, "cannot read the symbolic link '%s': %s", next, strerror(errno));
      free(next);
      if (tlen < 0) {
        rc = -1;
        break;
      }
      target[tlen] = 0;
      char *more = fmt("%s/%s", target, p);
      free(rest);
      p = rest = more;
      if (*target == '/') *done = 0;
    } else if (!S_ISDIR(st.st_mode)) {
      snprintf(err, errlen, "cannot use the cache directory '%s': '%s' is not a directory", path, next);
      free(next);
      rc = -1;
    } else {
      rc = check_above(path, next, &st, err, errlen);
      free(done);
      done = next;
    }
  }
  free(rest);
  free(done);
  return rc;
}

char *cache_root(void) {
  const char *e = getenv("CAVS_CACHE");
  if (e && *e) return fmt("%s", e);
  e = getenv("XDG_CACHE_HOME");
  if (e && *e == '/') return fmt("%s/cavs", e); /* the XDG spec ignores a relative one */
  e = getenv("HOME");
  if (e && *e == '/') return fmt("%s/.cache/cavs", e);
  struct passwd *pw = getpwuid(geteuid());
  struct stat st;
  if (pw && pw->pw_dir && *pw->pw_dir == '/' && stat(pw->pw_dir, &st) == 0 && S_ISDIR(st.st_mode) &&
      st.st_uid == geteuid())
    return fmt("%s/.cache/cavs", pw->pw_dir);
  /* a per-user name: checked like any other before it is used */
  return fmt("/tmp/cavs-%ld", (long)geteuid());
}

/* Creates the cache directory (and its parents, 0700) when missing, then checks it. */
static int open_root(const char *root, char *err, size_t errlen) {
  char *p = fmt("%s", root);
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(p, 0700) && errno != EEXIST) {
      snprintf(err, errlen, "cannot create the cache directory '%s': %s", p, strerror(errno));
      free(p);
      return -1;
    }
    *s = '/';
  }
  free(p);
  if (mkdir(root, 0700) && errno != EEXIST) {
    snprintf(err, errlen, "cannot create the cache directory '%s': %s", root, strerror(errno));
    return -1;
  }
  struct stat st;
  if (lstat(root, &st)) {
    snprintf(err, errlen, "cannot inspect the cache directory '%s': %s", root, strerror(errno));
    return -1;
  }
  if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode)) {
    snprintf(err, errlen,
             "refusing to use the cache: '%s' is %s, not a directory; set CAVS_CACHE to a directory of your own",
             root, S_ISLNK(st.st_mode) ? "a symbolic link" : "a file");
    return -1;
  }
  if (check_owner(&st, root, "the cache directory", err, errlen)) return -1;
  return check_ancestors(root, err, errlen);
}

/* Removes what the directory open as `dfd` (named `path` in messages; the descriptor is
 * closed) holds: files, symbolic links (never what they point to) and, `depth` levels
 * deep at most, directories, each opened without following links and emptied first.
 * Everything must be ours: what belongs to someone else is left, and named in err. */
static int empty_dir(int dfd, const char *path, int depth, char *err, size_t errlen) {
  DIR *d = fdopendir(dfd);
  if (!d) {
    snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
    close(dfd);
    return -1;
  }
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char *sub = fmt("%s/%s", path, e->d_name);
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW)) {
      snprintf(err, errlen, "cannot inspect '%s': %s", sub, strerror(errno));
      rc = -1;
    } else if (st.st_uid != geteuid()) {
      snprintf(err, errlen, "'%s' belongs to user %ld, not to you", sub, (long)st.st_uid);
      rc = -1;
    } else if (!S_ISDIR(st.st_mode)) {
      if (unlinkat(dirfd(d), e->d_name, 0)) {
        snprintf(err, errlen, "cannot remove '%s': %s", sub, strerror(errno));
        rc = -1;
      }
    } else if (depth <= 0) {
      snprintf(err, errlen, "cannot remove '%s': directories nested too deep", sub);
      rc = -1;
    } else {
      int sfd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sfd < 0) {
        snprintf(err, errlen, "cannot open '%s': %s", sub, strerror(errno));
        rc = -1;
      } else if ((rc = empty_dir(sfd, sub, depth - 1, err, errlen)) == 0 &&
                 unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR)) {
        snprintf(err, errlen, "cannot remove '%s': %s", sub, strerror(errno));
        rc = -1;
      }
    }
    free(sub);
  }
  closedir(d);
  return rc;
}

/* Removes a directory of ours and what it holds (empty_dir): a broken entry, a build
 * directory. 0 when it is gone (or was never there), else -1 with the reason in err. */
static int remove_tree(const char *path, char *err, size_t errlen) {
  int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    if (errno == ENOENT) return 0;
    snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(dfd, &st) || st.st_uid != geteuid()) {
    snprintf(err, errlen, "'%s' is not a directory of yours", path);
    close(dfd);
    return -1;
  }
  if (empty_dir(dfd, path, 16, err, errlen)) return -1;
  if (rmdir(path) && errno != ENOENT) {
    snprintf(err, errlen, "cannot remove '%s': %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

/* Opens `name` in the entry without following links and checks it is a regular file of
 * ours. Returns the descriptor, -2 when it does not exist, -1 (message set) otherwise. */
static int open_member(int dfd, const char *dir, const char *name, char *err, size_t errlen) {
  int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return -2;
    snprintf(err, errlen, "refusing to use the cache: cannot open '%s/%s' safely: %s", dir, name,
             errno == ELOOP ? "it is a symbolic link" : strerror(errno));
    return -1;
  }
  struct stat st;
  char *path = fmt("%s/%s", dir, name);
  int bad = fstat(fd, &st) != 0;
  if (!bad && !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "refusing to use the cache: '%s' is not a regular file", path);
    bad = 1;
  } else if (!bad) {
    bad = check_owner(&st, path, "the cache file", err, errlen) != 0;
  } else {
    snprintf(err, errlen, "cannot inspect '%s': %s", path, strerror(errno));
  }
  free(path);
  if (bad) {
    close(fd);
    return -1;
  }
  return fd;
}

/* What load_entry found: loaded; nothing there; ours but incomplete (rebuild it); not
 * safe to touch, or a model of another name (user errors); a build that does not load. */
enum { ENTRY_LOADED, ENTRY_MISSING, ENTRY_BROKEN, ENTRY_UNSAFE, ENTRY_FAILED };

/* Loads the entry `dir` if it is complete and verified. */
static int load_entry(const char *dir, const char *expect, const cavs_desc **desc, char **model, char *err,
                      size_t errlen) {
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    if (errno == ENOENT) return ENTRY_MISSING;
    snprintf(err, errlen, "refusing to use the cache entry '%s': %s", dir,
             errno == ELOOP || errno == ENOTDIR ? "it is a symbolic link or not a directory" : strerror(errno));
    return ENTRY_UNSAFE;
  }
  struct stat st;
  if (fstat(dfd, &st) || check_owner(&st, dir, "the cache entry", err, errlen)) {
    close(dfd);
    return ENTRY_UNSAFE;
  }
  int rc = ENTRY_BROKEN;
  char name[256], want[2 * SHA256_DIGEST_SIZE + 1], have[2 * SHA256_DIGEST_SIZE + 1];
  unsigned char *meta = NULL, *obj = NULL;
  size_t mlen = 0, olen = 0;
  int mfd = open_member(dfd, dir, "meta", err, errlen), ofd = -2;
  if (mfd == -1) rc = ENTRY_UNSAFE;
  if (mfd < 0) goto out;
  meta = read_fd(mfd, 4096, &mlen);
  /* "cavs cache entry 1\nname NAME\nsha256 HEX\n" */
  if (!meta || mlen >= 4096) goto out;
  meta[mlen] = 0;
  if (sscanf((char *)meta, META_MAGIC "\nname %255s\nsha256 %64s\n", name, want) != 2 || !cavs_is_identifier(name) ||
      strlen(want) != 2 * SHA256_DIGEST_SIZE)
    goto out;
  ofd = open_member(dfd, dir, "model.so", err, errlen);
  if (ofd == -1) rc = ENTRY_UNSAFE;
  if (ofd < 0) goto out;
  obj = read_fd(ofd, (size_t)1 << 30, &olen);
  if (!obj) goto out;
  unsigned char d[SHA256_DIGEST_SIZE];
  struct sha256_ctx c;
  sha256_init(&c);
  sha256_update(&c, olen, obj);
  sha256_digest(&c, sizeof d, d);
  hex(d, have);
  if (strcmp(have, want)) goto out; /* truncated or changed since it was built */
  if (expect && strcmp(expect, name)) {
    snprintf(err, errlen, "the source defines model '%s', not '%s'", name, expect);
    rc = ENTRY_UNSAFE;
    goto out;
  }
  /* load the very file that was hashed; the path is a fallback where /proc is missing
     (the directory is ours alone, checked above) */
  char fdpath[64];
  snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", ofd);
  char *so = fmt("%s/model.so", dir);
  void *lib = dlopen(access(fdpath, F_OK) == 0 ? fdpath : so, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(err, errlen, "cannot load '%s': %s", so, dlerror());
    free(so);
    rc = ENTRY_FAILED;
    goto out;
  }
  free(so);
  char *sym = fmt("%s_desc", name);
  *desc = dlsym(lib, sym);
  free(sym);
  if (!*desc) {
    snprintf(err, errlen, "the cached model '%s/model.so' has no symbol %s_desc", dir, name);
    rc = ENTRY_FAILED;
    goto out;
  }
  *model = fmt("%s", name);
  rc = ENTRY_LOADED;
  futimens(dfd, NULL); /* used now: what pruning the cache goes by (cache_prune) */
out:
  free(meta);
  free(obj);
  if (mfd >= 0) close(mfd);
  if (ofd >= 0) close(ofd);
  close(dfd);
  return rc;
}

/* The model's name: that of the one NAME.ext file cavsc wrote into dir; NULL where
   there is none, or with errno set where dir cannot be read. */
static char *find_src(const char *dir, const char *ext) {
  DIR *d = opendir(dir);
  if (!d) return NULL;
  char *name = NULL;
  struct dirent *e;
  size_t x = strlen(ext) + 1;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n > x && e->d_name[n - x] == '.' && !strcmp(e->d_name + n - x + 1, ext)) {
      name = fmt("%.*s", (int)(n - x), e->d_name);
      break;
    }
  }
  closedir(d);
  return name;
}

static void print_file(const char *path) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  size_t n = 0;
  unsigned char *s = fd >= 0 ? read_fd(fd, (size_t)1 << 20, &n) : NULL;
  if (fd >= 0) close(fd);
  if (s) fwrite(s, 1, n, stderr);
  free(s);
}

/* cavsc on the request's source, writing NAME.h and NAME.c (.cu) into dir: 0, 1 where
   cavsc said what is wrong with the model (err empty), 2 with err */
static int run_cavsc(const CacheReq *q, const char *dir, char *err, size_t errlen) {
  char *precf = NULL, *targf = NULL;
  char *argv[14];
  int k = 0;
  argv[k++] = (char *)q->cavsc;
  argv[k++] = "-o";
  argv[k++] = (char *)dir;
  argv[k++] = "--source-name";
  argv[k++] = (char *)q->name;
  if (q->precision) argv[k++] = precf = fmt("--precision=%s", q->precision);
  if (q->target) argv[k++] = targf = fmt("--target=%s", q->target);
  if (q->ablations & 1) argv[k++] = "--no-fuse";
  if (q->ablations & 2) argv[k++] = "--no-merge";
  if (q->ablations & 4) argv[k++] = "--no-homes";
  if (q->ablations & 8) argv[k++] = "--no-push-view";
  argv[k++] = "-";
  argv[k] = NULL;
  int st = run(argv, q->text, q->len, -1), rc = 0;
  if (st != 0) {
    rc = 2;
    if (st == 127 || st < 0) snprintf(err, errlen, "cannot run cavsc ('%s'); set CAVSC to its path", q->cavsc);
    else if (st == 1) *err = 0, rc = 1; /* cavsc has said what is wrong */
    else snprintf(err, errlen, "cavsc failed (status %d) on %s", st, q->name);
  }
  free(precf);
  free(targf);
  return rc;
}

/* The C (or CUDA) compiler on dir/NAME.c (.cu), writing dir/model.so; its messages, where
   it fails, copied to stderr. 0; 1 where the compiler cannot be run; 2 with err. */
static int compile_object(const CacheReq *q, const char *dir, const char *name, char *err, size_t errlen) {
  bool cuda = !strcmp(src_ext(q), "cu");
  char *csrc = fmt("%s/%s.%s", dir, name, src_ext(q)), *tso = fmt("%s/model.so", dir), *incf = fmt("-I%s", q->include),
       *ccerr = fmt("%s/cc.err", dir);
  char **argv = malloc(sizeof *argv * ((size_t)q->ncflags + 6));
  int rc = 2;
  if (!argv) {
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  int k = 0;
  argv[k++] = (char *)q->cc;
  for (int i = 0; i < q->ncflags; i++) argv[k++] = (char *)q->cflags[i];
  argv[k++] = incf;
  argv[k++] = csrc;
  argv[k++] = "-o";
  argv[k++] = tso;
  argv[k] = NULL;
  int efd = open(ccerr, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  int st = run(argv, NULL, 0, efd);
  if (efd >= 0) close(efd);
  if (st == 0) {
    unlink(ccerr);
    rc = 0;
  } else if (st == 127 || st < 0) {
    snprintf(err, errlen, "cannot run the %s compiler '%s'; set %s to one", cuda ? "CUDA" : "C", q->cc,
             cuda ? "NVCC" : "CC");
    rc = 1;
  } else {
    fprintf(stderr, "cavs: the %s compiler failed on the code cavsc generated from %s:\n", cuda ? "CUDA" : "C", q->name);
    print_file(ccerr);
    snprintf(err, errlen, "the %s compiler failed (status %d)", cuda ? "CUDA" : "C", st);
  }
out:
  free(csrc);
  free(tso);
  free(incf);
  free(ccerr);
  free(argv);
  return rc;
}

int cache_compile(const CacheReq *q, const char *dir, bool object, char **model, char *err, size_t errlen) {
  *err = 0;
  *model = NULL;
  int rc = run_cavsc(q, dir, err, errlen);
  if (rc) return rc;
  errno = 0;
  char *name = find_src(dir, src_ext(q));
  if (!name && errno) { /* (opendir's: memory run out, say) */
    snprintf(err, errlen, "cannot read %s: %s", dir, strerror(errno));
    return 2;
  }
  if (!name || !cavs_is_identifier(name)) {
    snprintf(err, errlen, "cavsc wrote no model C file into %s", dir);
    free(name);
    return 2;
  }
  if (q->expect && strcmp(q->expect, name)) {
    snprintf(err, errlen, "the source defines model '%s', not '%s'", name, q->expect);
    free(name);
    return 1;
  }
  if (object && (rc = compile_object(q, dir, name, err, errlen))) {
    free(name);
    return rc;
  }
  *model = name;
  return 0;
}

/* Removes `dir` and the directories above it, up to `made` (an ancestor of it, or itself,
 * that this process created): what cache_build_into made when its build fails. */
static void unmake_dirs(const char *dir, const char *made) {
  char *p = fmt("%s", dir);
  for (;;) {
    rmdir(p);
    char *slash = strrchr(p, '/');
    if (strlen(p) <= strlen(made) || !slash) break;
    *slash = 0;
  }
  free(p);
}

/* `path` (a file, or with O_DIRECTORY a directory) flushed to disk: 0, or errno. A
   filesystem that flushes no directory says EINVAL: nothing to wait for there. */
static int flush(const char *path, int flags) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | flags), e = 0;
  if (fd < 0) return errno;
  if (fsync(fd) && !(errno == EINVAL && (flags & O_DIRECTORY))) e = errno;
  close(fd);
  return e;
}

/* put_outputs's journal, in the build directory: a line "K DEV INO SIZE SEC NSEC FROM TO"
   for each output (FROM its name there, TO its name in DIR, DEV INO SIZE SEC NSEC the new
   file's device, inode, size and modification time, K 1 where DIR's earlier file is kept
   aside as old-I, I the line's index; 0 where there was none; -1 where it could not be
   kept) */
#define PUT_JOURNAL "undo"

/* Whether `s` may name a file of a journal: a name without a directory (no '/', not "." or
   ".."), of the characters a model's outputs are named with. */
static bool journal_name(const char *s) {
  if (!*s || !strcmp(s, ".") || !strcmp(s, "..") || strlen(s) > NAME_MAX) return false;
  for (; *s; s++)
    if (!(*s == '_' || *s == '.' || *s == '-' || (*s >= '0' && *s <= '9') || ((*s | 32) >= 'a' && (*s | 32) <= 'z')))
      return false;
  return true;
}

/* Whether st is the file a journal's line names by id: device, inode, size, modification
   time (seconds, nanoseconds) */
static bool same_id(const struct stat *st, const unsigned long long id[5]) {
  return (unsigned long long)st->st_dev == id[0] && (unsigned long long)st->st_ino == id[1] &&
         (unsigned long long)st->st_size == id[2] && (unsigned long long)st->st_mtim.tv_sec == id[3] &&
         (unsigned long long)st->st_mtim.tv_nsec == id[4];
}

/* Carries out the journal of the build directory `tfd` against DIR (`dfd`): where DIR's
   TO is still the new file (its device, inode, size and modification time: renamed
   there, and nothing put there or written since), DIR's earlier file is put back (K 1)
   or the new one removed (K 0: there was none); an output not renamed yet, one replaced
   or written since by someone else, and one whose earlier file could not be kept (K -1)
   are left as they are. Then the journal is removed. How a failed rename is undone
   (put_outputs), and what a build killed among its renames is undone by, the next
   `cavs build -o DIR` (cache_build_into, before its sweep: undo_puts). The directory is
   ours and was locked, but its journal is read as untrusted all the same: at most 3
   lines of plain names, or nothing is done. True where nothing is left to undo (no
   journal, or one carried out); false, the journal kept, where it cannot be read or a
   file cannot be put back: the directory, which holds the earlier files, must then be
   kept. With `left`, the journal's lines (bit i for line i) whose file could not be put
   back or removed: DIR's file still the new one, for the message to name. */
static bool undo_puts_left(int tfd, int dfd, unsigned *left) {
  int fd = openat(tfd, PUT_JOURNAL, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  char text[3 * (2 * NAME_MAX + 112) + 1];
  ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  int k[3], lines = 0, used = 0;
  unsigned long long id[3][5]; /* the new file's device, inode, size, seconds, nanoseconds */
  char from[3][NAME_MAX + 1], to[3][NAME_MAX + 1], *at = text, fmt_line[64];
  snprintf(fmt_line, sizeof fmt_line, "%%d %%llu %%llu %%llu %%llu %%llu %%%ds %%%ds%%n", NAME_MAX, NAME_MAX);
  if (n <= 0 || n == (ssize_t)sizeof text - 1) return false;
  text[n] = 0;
  for (char *nl; (nl = strchr(at, '\n')); at = nl + 1, lines++) {
    *nl = 0;
    if (lines == 3 ||
        sscanf(at, fmt_line, &k[lines], &id[lines][0], &id[lines][1], &id[lines][2], &id[lines][3], &id[lines][4],
               from[lines], to[lines], &used) != 8 ||
        at[used] || k[lines] < -1 || k[lines] > 1 || !journal_name(from[lines]) || !journal_name(to[lines]))
      return false;
  }
  if (*at) return false; /* a line torn: not a journal put_outputs finished writing */
  bool done = true;
  for (int i = 0; i < lines; i++) {
    struct stat st;
    if (fstatat(dfd, to[i], &st, AT_SYMLINK_NOFOLLOW) || !same_id(&st, id[i]))
      continue; /* not renamed there, or replaced or written since */
    char old[32];
    snprintf(old, sizeof old, "old-%d", i);
    if ((k[i] == 1 && renameat(tfd, old, dfd, to[i])) || (k[i] == 0 && unlinkat(dfd, to[i], 0))) {
      done = false;
      if (left) *left |= 1u << i;
    }
  }
  return done && unlinkat(tfd, PUT_JOURNAL, 0) == 0;
}
static bool undo_puts(int tfd, int dfd) { return undo_puts_left(tfd, dfd, NULL); }

/* Writes put_outputs's journal into `tfd` and flushes it (and the directory) to disk: 0,
   or errno. */
static int write_journal(int tfd, int n, const int *kept, char *const *a, char *const *b) {
  char text[3 * (2 * PATH_MAX + 112)];
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    struct stat st;
    if (stat(a[i], &st)) return errno;
    len += (size_t)snprintf(text + len, sizeof text - len, "%d %llu %llu %llu %llu %llu %s %s\n", kept[i],
                            (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                            (unsigned long long)st.st_size, (unsigned long long)st.st_mtim.tv_sec,
                            (unsigned long long)st.st_mtim.tv_nsec, strrchr(a[i], '/') + 1, strrchr(b[i], '/') + 1);
  }
  int fd = openat(tfd, PUT_JOURNAL, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600), e = 0;
  if (fd < 0) return errno;
  /* (a write the disk took part of goes on with the rest: the next says why it stops,
     where the part's errno, none, had been said as EIO) */
  for (size_t done = 0; done < len && !e;) {
    ssize_t w = write(fd, text + done, len - done);
    if (w > 0) done += (size_t)w;
    else if (w == 0 || errno != EINTR) e = w < 0 ? errno : EIO;
  }
  if (!e && fsync(fd)) e = errno;
  close(fd);
  if (!e && fsync(tfd) && errno != EINVAL) e = errno;
  return e;
}

/* cavs build -o's outputs, built in `tmp` (open as `tfd`), renamed over DIR's (open as
   `dfd`; n of them: from[i] and to[i] formatted with the directory, the model's name and
   the source's extension) as one set: each flushed to disk before any is renamed (a crash
   after a rename must find the file the compiler finished, not an empty one), the old
   ones kept aside (hard links in tmp, or copies where a link is refused:
   cv_afile_keep_aside; where neither can be made, nothing is renamed) and a journal of
   them written (write_journal) until
   all are in place, so that a rename failing midway puts back the ones already replaced,
   and a build killed midway has them put back by the next (undo_puts): DIR holds the old
   set or the new, never a header of one build beside the object of another. The
   directory flushed last. 0, or 1 with err set. */
static int put_outputs(int tfd, int dfd, const char *tmp, const char *dir, const char *name, const char *ext,
                       int n, const char *const *from, const char *const *to, bool *keep_tmp, char *err,
                       size_t errlen) {
  char *a[3], *b[3], *old[3];
  int kept[3], rc = 0, done = 0; /* kept: 1 aside, 0 there was none, -1 could not be */
  for (int i = 0; i < n; i++) {
    a[i] = fmt(from[i], tmp, name, ext);
    b[i] = fmt(to[i], dir, name, ext);
    old[i] = fmt("%s/old-%d", tmp, i);
    kept[i] = rc ? 0 : cv_afile_keep_aside(AT_FDCWD, b[i], AT_FDCWD, old[i]);
    /* (one that cannot be kept aside: nothing renamed, since a rename failing after its
       own would leave the earlier set beside it, its earlier file gone) */
    if (kept[i] < 0) {
      snprintf(err, errlen, "cannot write '%s': keeping the earlier file aside in %s: %s", b[i], tmp,
               strerror(errno));
      rc = 1;
    }
  }
  for (int i = 0; i < n && !rc; i++) {
    int e = flush(a[i], 0);
    if (e) {
      snprintf(err, errlen, "cannot write '%s': flushing it to disk: %s", b[i], strerror(e));
      rc = 1;
    }
  }
  int e = rc ? 0 : write_journal(tfd, n, kept, a, b);
  bool journaled = !rc && !e; /* (without it nothing is renamed: nothing to undo) */
  if (e) {
    snprintf(err, errlen, "cannot write '%s': keeping a journal in %s: %s", b[0], tmp, strerror(e));
    rc = 1;
  }
  for (; done < n && !rc; done++)
    if (rename(a[done], b[done])) {
      snprintf(err, errlen, "cannot write '%s': %s", b[done], strerror(errno));
      rc = 1;
      break;
    }
  /* (a journal of an earlier version may have K -1, one not kept aside: left new) */
  unsigned left = 0;
  if (rc && journaled && !undo_puts_left(tfd, dfd, &left)) {
    size_t at = strlen(err);
    snprintf(err + at, errlen - at, "; the earlier files could not all be put back (they are kept in %s)", tmp);
    /* which of DIR's files are the new build's: the user's to put back by hand */
    const char *sep = ": ";
    for (int i = 0; i < n; i++) {
      if (!(left & 1u << i)) continue;
      at = strlen(err);
      if (kept[i] == 1)
        snprintf(err + at, errlen - at, "%s'%s' is the new build's; the earlier one is kept as '%s'", sep, b[i],
                 old[i]);
      else snprintf(err + at, errlen - at, "%s'%s' is the new build's; there was none before", sep, b[i]);
      sep = ", and ";
    }
    *keep_tmp = true;
  }
  e = rc ? 0 : flush(dir, O_DIRECTORY);
  if (e) {
    snprintf(err, errlen,
             "wrote '%s' and the rest, but the directory could not be flushed to disk (%s): a crash may leave the "
             "files as they were before",
             b[n - 1], strerror(e));
    rc = 1;
  }
  /* all renamed (the directory flushed first, so that no crash finds the journal gone
     but the renames not made): the new set is the one to keep, and a crash that brought
     the journal back would undo a build that said it was done */
  if (done == n) {
    unlinkat(tfd, PUT_JOURNAL, 0);
    (void)!fsync(tfd);
  }
  for (int i = 0; i < n; i++) free(a[i]), free(b[i]), free(old[i]);
  return rc;
}

static void sweep(const char *root, const char *base, bool (*before)(int tfd, int dfd));

/* Makes `dir` and the directories above it that are missing (mode 0777 less the umask):
   0, with *made the first one made (malloc'ed; NULL where none was), or 1 with err set. */
static int make_dirs(const char *dir, char **made, char *err, size_t errlen) {
  char *p = fmt("%s", dir);
  int rc = 0;
  for (char *s = *p ? p + 1 : p;; s++) {
    if (*s && *s != '/') continue;
    char c = *s;
    *s = 0;
    if (mkdir(p, 0777) == 0) {
      if (!*made) *made = fmt("%s", p);
    } else if (errno != EEXIST) {
      snprintf(err, errlen, "cannot create the directory '%s': %s", p, strerror(errno));
      rc = 1;
      break;
    }
    *s = c;
    if (!c) break;
  }
  free(p);
  return rc;
}

/* Whether the n outputs to[i] (formatted with dir, the model's name and the source's
   extension) may be replaced: none is the model's own source (a model file named NAME.c,
   or a link to it), nor a file cavsc or cavs build did not write (a user's own NAME.c,
   say). 0, or 1 with err set: found before any is moved, so nothing is half done. */
static int outputs_replaceable(const CacheReq *q, const char *dir, const char *name, int n,
                               const char *const *to, char *err, size_t errlen) {
  struct stat in, out;
  char why[512];
  int rc = 0;
  for (int i = 0; i < n && !rc && q->input && stat(q->input, &in) == 0; i++) {
    char *b = fmt(to[i], dir, name, src_ext(q));
    if (stat(b, &out) == 0 && out.st_dev == in.st_dev && out.st_ino == in.st_ino) {
      snprintf(err, errlen, "cannot write '%s': it is the model's source, %s", b, q->input);
      rc = 1;
    }
    free(b);
  }
  for (int i = 0; i < n && !rc; i++) {
    char *b = fmt(to[i], dir, name, src_ext(q)), *base = strrchr(b, '/') + 1, *sym = fmt("%s_desc", name);
    if (!cv_output_replaceable(b, base, i == 2 ? sym : NULL, why, sizeof why)) {
      snprintf(err, errlen, "cannot write '%s': %s", b, why);
      rc = 1;
    }
    free(sym);
    free(b);
  }
  return rc;
}

/* Holds (how LOCK_EX) or lets go of (LOCK_UN) the flock on DIR, open as `dfd`, that
   keeps two writers of one directory apart: cavsc takes it around MODEL.h and MODEL.c,
   cavs build -o around the sweep of killed builds (whose journals it carries out) and
   around its checks and renames. Two builds into one directory put one set, then the
   other, never a header of one beside the object of the other. (A filesystem without
   locks, flock's ENOLCK, leaves them unordered: the build goes on, as cavsc's does.) */
static void dir_lock(int dfd, int how) {
  while (flock(dfd, how) < 0 && errno == EINTR) {}
}

int cache_build_into(const CacheReq *q, const char *dir, bool object, char **model, char *err, size_t errlen) {
  *err = 0;
  *model = NULL;
  int rc = 1, lock = -1, dfd = -1, n = object ? 3 : 2;
  bool keep_tmp = false; /* (it holds the earlier outputs a failed undo could not put back) */
  char *made = NULL, *tmp = NULL, *name = NULL, why[512];
  if (make_dirs(dir, &made, err, errlen)) goto out;
  if ((dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
    snprintf(err, errlen, "cannot open the directory '%s': %s", dir, strerror(errno));
    goto out;
  }
  /* built beside its place, so that a rename puts each file there whole, in a directory
     named and locked as the cache's builds are: what a killed build left there is
     removed by the next (sweep), and nothing else; what it had renamed into DIR is put
     back first (undo_puts) */
  dir_lock(dfd, LOCK_EX);
  sweep(dir, "build", undo_puts);
  dir_lock(dfd, LOCK_UN);
  lock = lock_temp_dir(dir, "build", &tmp, err, errlen);
  if (lock < 0) goto out;
  rc = cache_compile(q, tmp, object, &name, err, errlen);
  if (rc) goto out;
  const char *from[] = {"%s/%s.h", "%s/%s.%s", "%s/model.so"}, *to[] = {"%s/%s.h", "%s/%s.%s", "%s/%s.so"};
  dir_lock(dfd, LOCK_EX);
  rc = outputs_replaceable(q, dir, name, n, to, err, errlen);
  if (!rc) rc = put_outputs(lock, dfd, tmp, dir, name, src_ext(q), n, from, to, &keep_tmp, err, errlen);
  if (!rc) {
    *model = name;
    name = NULL;
  }
out:
  if (tmp && !keep_tmp) remove_tree(tmp, why, sizeof why); /* err says what failed, if anything did */
  if (lock >= 0) close(lock);
  if (dfd >= 0) close(dfd); /* (and its lock with it) */
  if (rc && made) unmake_dirs(dir, made);
  free(made);
  free(tmp);
  free(name);
  return rc;
}

/* ---- build directories ----
 *
 * An entry is built in root/.build.cavs-tmp-NNNNNNNNNNNNNNNN (afile.c's temporary names:
 * 12 random hexadecimal digits and 4 that check them, so that no directory of the
 * user's, whatever its name, passes for one: CAVS_CACHE may be a directory of theirs;
 * the build-XXXXXX of mkdtemp once took a user's build-python away) and renamed into
 * place, so a build killed midway leaves its directory behind. Its builder holds an
 * flock on the directory (an open descriptor of it) from just after its mkdir until it
 * is done, and the kernel
 * lets go of it when the process ends, however it ends. sweep_temp_dirs removes a build
 * directory only while holding that lock itself: never one whose builder is alive.
 * Between its mkdir and its builder's flock a directory is not locked yet, and a sweep
 * may remove it then; so the builder, once it holds the lock, checks that the name still
 * leads to the directory it locked, and makes another when it does not (lock_temp_dir).
 * A sweep that locked it first removed it before letting go, so the builder sees it gone;
 * from then on the lock keeps every sweep out. Abandoned is proved by the lock alone: no
 * age, no clock. `cavs build -o DIR` builds in DIR the same way, and `cavs plot` draws
 * in a directory of base "plot" in $TMPDIR (plot.c): what a SIGKILL left there is
 * removed by the next plot. */

/* A new locked directory's name in root (malloc'd; a collision costs a retry: mkdir is
   exclusive) */
static char *temp_dir_name(const char *root, const char *base) {
  char name[128];
  cv_afile_new_temp_name(base, name, sizeof name);
  return fmt("%s/%s", root, name);
}

/* Whether the descriptor and the name in dfd are the same file, a link not followed. */
static bool same_file(int fd, int dfd, const char *name) {
  struct stat a, b;
  return fstat(fd, &a) == 0 && fstatat(dfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

/* Removes the directories of `base` in root that no process holds, and nothing else: only
 * a directory (not a link) of ours named as lock_temp_dir names them (its check digits
 * right), emptied (empty_dir) and removed while this process holds its lock. What cannot
 * be removed is left. `before`, if given, is called first with each such directory and
 * root, both open (undo_puts: what a killed `cavs build -o` left half done), and where
 * it returns false the directory is left, with a warning. */
static void sweep(const char *root, const char *base, bool (*before)(int tfd, int dfd)) {
  DIR *d = opendir(root);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!cv_afile_is_temp(e->d_name, base)) continue;
    int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), fd2 = -1;
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_uid == geteuid() && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        same_file(fd, dirfd(d), e->d_name) && (fd2 = fcntl(fd, F_DUPFD_CLOEXEC, 0)) >= 0) {
      char *path = fmt("%s/%s", root, e->d_name), why[512];
      if (before && !before(fd, dirfd(d))) {
        fprintf(stderr, "cavs: warning: a killed build's journal in %s could not be carried out: the earlier files it "
                        "holds are left there\n", path);
        close(fd2);
      } else if (empty_dir(fd2, path, 16, why, sizeof why) == 0) {
        /* (empty_dir closes the descriptor it is given; `fd` keeps the lock until the end) */
        unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR);
      }
      free(path);
    }
    if (fd >= 0) close(fd);
  }
  closedir(d);
}

void sweep_temp_dirs(const char *root, const char *base) { sweep(root, base, NULL); }

/* Makes a directory of `base` in root and locks it (see above): returns the descriptor
 * that holds the lock and sets *tmp to the directory's path, or returns -1 with the
 * message in err. */
int lock_temp_dir(const char *root, const char *base, char **tmp, char *err, size_t errlen) {
  for (int attempt = 0; attempt < 16; attempt++) {
    char *t = temp_dir_name(root, base);
    if (mkdir(t, 0700)) {
      int e = errno;
      free(t);
      if (e == EEXIST) continue;
      snprintf(err, errlen, "cannot create a directory in '%s': %s", root, strerror(e));
      return -1;
    }
    int fd = open(t, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), locked = -1;
    if (fd < 0 && errno != ENOENT) {
      snprintf(err, errlen, "cannot open '%s': %s", t, strerror(errno));
      free(t);
      return -1;
    }
    while (fd >= 0 && (locked = flock(fd, LOCK_EX)) != 0 && errno == EINTR) continue;
    if (fd >= 0 && locked != 0) {
      snprintf(err, errlen, "cannot lock '%s': %s", t, strerror(errno));
      close(fd);
      rmdir(t);
      free(t);
      return -1;
    }
    if (fd >= 0 && same_file(fd, AT_FDCWD, t)) {
      *tmp = t;
      return fd;
    }
    /* a sweep removed it before it was locked: another */
    if (fd >= 0) close(fd);
    free(t);
  }
  snprintf(err, errlen, "cannot keep a temporary directory in '%s': each one made was removed at once", root);
  return -1;
}

/* Builds into a fresh directory beside the entry and renames it into place; first removes
 * the build directories that builds killed midway left (sweep_temp_dirs). */
static int build(const CacheReq *q, const char *root, const char *dir, char *err, size_t errlen) {
  sweep_temp_dirs(root, "build");
  char *tmp = NULL;
  int lock = lock_temp_dir(root, "build", &tmp, err, errlen);
  if (lock < 0) return 1;
  char *name = NULL, *tso = NULL, *metap = NULL, why[512];
  bool published = false;
  int rc = cache_compile(q, tmp, true, &name, err, errlen);
  if (rc) goto out;
  rc = 2;
  tso = fmt("%s/model.so", tmp);
  /* whatever the umask, nobody else may write what will be loaded (a later load refuses
     an object writable by others) */
  chmod(tso, 0755);
  /* record the object's hash: a later load checks the bytes it maps */
  int ofd = open(tso, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  size_t olen = 0;
  unsigned char *obj = ofd >= 0 ? read_fd(ofd, (size_t)1 << 30, &olen) : NULL;
  if (ofd >= 0) close(ofd);
  if (!obj) {
    snprintf(err, errlen, "cannot read the compiled model '%s'", tso);
    goto out;
  }
  unsigned char d[SHA256_DIGEST_SIZE];
  char digest[2 * SHA256_DIGEST_SIZE + 1];
  struct sha256_ctx c;
  sha256_init(&c);
  sha256_update(&c, olen, obj);
  sha256_digest(&c, sizeof d, d);
  free(obj);
  hex(d, digest);
  metap = fmt("%s/meta", tmp);
  int mfd = open(metap, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  FILE *mf = mfd >= 0 ? fdopen(mfd, "w") : NULL;
  int e = errno;
  if (!mf && mfd >= 0) close(mfd);
  /* (the stream closed however the writing went, and the first failure said) */
  bool written = mf && fprintf(mf, META_MAGIC "\nname %s\nsha256 %s\n", name, digest) >= 0 && !fflush(mf);
  if (mf && !written) e = errno;
  if (mf && fclose(mf) && written) written = false, e = errno;
  if (!written) {
    snprintf(err, errlen, "cannot write '%s': %s", metap, strerror(e ? e : EIO));
    goto out;
  }
  /* the object, the record and the directory that names them on the disk before the
     rename publishes them: a crash after it finds the entry whole, not an empty object
     that loads fail on (they would rebuild it, its hash refused, but a run should not
     have to). A flush refused is said as a write is (the entry not published) */
  const char *part = tso;
  e = flush(tso, 0);
  if (!e) part = metap, e = flush(metap, 0);
  if (!e) part = tmp, e = flush(tmp, O_DIRECTORY);
  if (e) {
    snprintf(err, errlen, "cannot write '%s': %s", part, strerror(e));
    goto out;
  }
  /* publish the whole directory at once; if another process won the race, keep its.
     Where the rename fails otherwise (a full disk), the reason is said if cache_load
     has no build left to try */
  published = rename(tmp, dir) == 0;
  if (!published && errno != EEXIST && errno != ENOTEMPTY)
    snprintf(err, errlen, "cannot put the built cache entry in place as '%s': %s", dir, strerror(errno));
  /* (the rename itself on the disk: the root flushed; a root that cannot be is left to
     the entry's hash, as before, since the entry is in place for this run) */
  if (published) (void)flush(root, O_DIRECTORY);
  rc = 0;
out:
  /* err says what failed; a directory left behind is not worth more. Removed before the
     lock is let go, and only when it was not renamed: the name may be another's by now */
  if (!published) remove_tree(tmp, why, sizeof why);
  close(lock);
  free(tmp);
  free(name);
  free(tso);
  free(metap);
  return rc;
}

/* ---- the cache kept within its size ---- */

/* The directories of cache_blob_put's kinds, whose files pruning may remove, and the
   bytes each such file starts with */
static const struct {
  const char *name, *magic;
} blob_kinds[] = {{"streams", CACHE_STREAMS_MAGIC}};

int cache_limit(long long *bytes, char *err, size_t errlen) {
  const char *e = getenv("CAVS_CACHE_MAX");
  *bytes = CACHE_MAX_DEFAULT;
  if (!e || !*e) return 0;
  char *end;
  errno = 0;
  double v = strtod(e, &end);
  double unit = *end == 'K' || *end == 'k' ? 1024.0 : *end == 'M' || *end == 'm' ? 1048576.0
              : *end == 'G' || *end == 'g' ? 1073741824.0 : 1.0;
  if (unit > 1) end++;
  /* (a finite, non-negative number below 2^62 bytes, whole where it is bytes) */
  if (end == e || *end || errno || !(v >= 0) || v * unit >= 4.6e18 || (unit == 1 && v != (double)(long long)v)) {
    snprintf(err, errlen, "CAVS_CACHE_MAX is '%.40s': give the compile cache's size in bytes, or with K, M or G "
             "(1G), 0 for no limit", e);
    return -1;
  }
  *bytes = (long long)(v * unit);
  return 0;
}

/* One thing pruning may remove: an entry (a directory) or a kind's file. */
typedef struct Item {
  char *path;
  bool dir;
  struct timespec used;
  long long bytes;
} Item;

/* The bytes the regular files of ours under the directory open as dfd take (its
   subdirectories `depth` levels deep, never through a link); the descriptor is closed. */
static long long tree_bytes(int dfd, int depth) {
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return 0;
  }
  long long n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    struct stat st;
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
        fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) || st.st_uid != geteuid())
      continue;
    if (S_ISREG(st.st_mode)) n += (long long)st.st_blocks * 512;
    else if (S_ISDIR(st.st_mode) && depth > 0) {
      int sfd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sfd >= 0) n += tree_bytes(sfd, depth - 1);
    }
  }
  closedir(d);
  return n;
}

/* Whether `name` is a cache entry's: 64 lowercase hexadecimal digits. */
static bool entry_name(const char *name) {
  return strlen(name) == 2 * SHA256_DIGEST_SIZE && strspn(name, "0123456789abcdef") == 2 * SHA256_DIGEST_SIZE;
}

static int older_first(const void *a, const void *b) {
  const Item *x = a, *y = b;
  if (x->used.tv_sec != y->used.tv_sec) return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
  if (x->used.tv_nsec != y->used.tv_nsec) return x->used.tv_nsec < y->used.tv_nsec ? -1 : 1;
  return strcmp(x->path, y->path);
}

/* Whether the entry open as dfd holds a record that cavs wrote (a regular file of ours
   that starts as every record does): a directory of that name without one is left. */
static bool has_record(int dfd) {
  int fd = openat(dfd, "meta", O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  char head[sizeof META_MAGIC];
  struct stat st;
  bool ok = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
            read(fd, head, sizeof head - 1) == (ssize_t)(sizeof head - 1) && !memcmp(head, META_MAGIC, sizeof head - 1);
  if (fd >= 0) close(fd);
  return ok;
}

/* Whether the file `name` of directory dfd starts with `magic` (a kind's file that cavs
   wrote: a file of the user's named as one is left) */
static bool starts_with(int dfd, const char *name, const char *magic) {
  int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  char head[64];
  size_t n = strlen(magic);
  bool ok = fd >= 0 && n < sizeof head && read(fd, head, n) == (ssize_t)n && !memcmp(head, magic, n);
  if (fd >= 0) close(fd);
  return ok;
}

/* What may be pruned in `dir` (the root: entries; a kind's directory: its files), added
   to items: directories of ours named as entries that hold a record of cavs's, or
   regular files of ours named as a kind's files are (64 hex digits) that start with its
   magic; never a link, a build under way, or anything of another name. */
static void collect(const char *dir, const char *magic, Item **items, int *n, int *cap) {
  bool entries = magic == NULL;
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    struct stat st;
    if (!entry_name(e->d_name) || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
        st.st_uid != geteuid() || !(entries ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode)))
      continue;
    long long bytes = (long long)st.st_blocks * 512;
    if (entries) {
      int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) continue;
      if (!has_record(fd)) {
        close(fd);
        continue;
      }
      bytes = tree_bytes(fd, 16);
    } else if (!starts_with(dirfd(d), e->d_name, magic))
      continue;
    if (*n == *cap) {
      *cap = *cap ? 2 * *cap : 64;
      Item *g = realloc(*items, sizeof **items * (size_t)*cap);
      if (!g) out_of_memory();
      *items = g;
    }
    (*items)[(*n)++] = (Item){fmt("%s/%s", dir, e->d_name), entries, st.st_mtim, bytes};
  }
  closedir(d);
}

/* Every entry and kind's file in root that pruning may remove, the least recently used
   first: how many, in *items (malloc'ed). */
static int items_of(const char *root, Item **items) {
  *items = NULL;
  int n = 0, cap = 0;
  collect(root, NULL, items, &n, &cap);
  for (size_t k = 0; k < sizeof blob_kinds / sizeof *blob_kinds; k++) {
    char *kd = fmt("%s/%s", root, blob_kinds[k].name);
    struct stat st;
    if (lstat(kd, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid())
      collect(kd, blob_kinds[k].magic, items, &n, &cap);
    free(kd);
  }
  if (n) qsort(*items, (size_t)n, sizeof **items, older_first);
  return n;
}

static void count_item(CacheUse *u, const Item *it, int sign) {
  if (it->dir) u->entries += sign, u->entry_bytes += sign * it->bytes;
  else u->indexes += sign, u->index_bytes += sign * it->bytes;
}

/* Removes items, the least recently used first, while they take more than `target`
   bytes: never `keep`, nor (with `recent`) one used in the last CACHE_RECENT_S seconds
   (a run may be between reading an entry's record and opening its object). What
   remains is counted in *u, what went in *gone. */
static void prune_to(Item *items, int n, long long target, const char *keep, bool recent, CacheUse *u, CacheUse *gone) {
  char why[512];
  long long total = 0;
  for (int i = 0; i < n; i++) total += items[i].bytes, count_item(u, &items[i], 1);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  for (int i = 0; i < n && total > target; i++) {
    if ((keep && !strcmp(items[i].path, keep)) || (recent && items[i].used.tv_sec > now.tv_sec - CACHE_RECENT_S))
      continue;
    if (items[i].dir ? remove_tree(items[i].path, why, sizeof why) == 0 : unlink(items[i].path) == 0) {
      total -= items[i].bytes;
      count_item(u, &items[i], -1);
      if (gone) count_item(gone, &items[i], 1);
    }
  }
}

static void free_items(Item *items, int n) {
  for (int i = 0; i < n; i++) free(items[i].path);
  free(items);
}

void cache_prune(const char *root, const char *keep) {
  long long limit;
  char why[512];
  if (cache_limit(&limit, why, sizeof why) || limit == 0) return;
  Item *items;
  int n = items_of(root, &items);
  long long total = 0;
  for (int i = 0; i < n; i++) total += items[i].bytes;
  /* down to nine tenths of the limit: not a prune at every build */
  CacheUse u = {0};
  if (total > limit) prune_to(items, n, limit - limit / 10, keep, true, &u, NULL);
  free_items(items, n);
}

int cache_tidy(int what, char **root, CacheUse *u, CacheUse *gone, long long *limit, char *err, size_t errlen) {
  *u = *gone = (CacheUse){0};
  *root = cache_root();
  if (cache_limit(limit, err, errlen)) return -1;
  struct stat st;
  if (lstat(*root, &st) && errno == ENOENT) return 1; /* (none yet: not made for asking) */
  if (open_root(*root, err, errlen)) return -1;
  Item *items;
  int n = items_of(*root, &items);
  long long total = 0;
  for (int i = 0; i < n; i++) total += items[i].bytes;
  if (what == CACHE_CLEAR) prune_to(items, n, -1, NULL, false, u, gone);
  else if (what == CACHE_PRUNE && *limit && total > *limit) prune_to(items, n, *limit - *limit / 10, NULL, true, u, gone);
  else prune_to(items, n, LLONG_MAX, NULL, true, u, NULL);
  free_items(items, n);
  return 0;
}

char *cache_entry(const CacheReq *q) {
  char *root = cache_root(), key[2 * SHA256_DIGEST_SIZE + 1];
  cache_key(q, key);
  char *dir = fmt("%s/%s", root, key);
  free(root);
  return dir;
}

int cache_load(const CacheReq *q, const cavs_desc **desc, char **model, char *err, size_t errlen) {
  *err = 0;
  long long limit;
  if (cache_limit(&limit, err, errlen)) return 1;
  char *root = cache_root();
  if (open_root(root, err, errlen)) {
    free(root);
    return 1;
  }
  char key[2 * SHA256_DIGEST_SIZE + 1];
  cache_key(q, key);
  char *dir = fmt("%s/%s", root, key);
  int rc = 2;
  /* three builds at most, each loaded after it (the third had been built and not
     loaded: two failed publishes, and the run was refused with an entry in place) */
  for (int attempt = 0; attempt < 4; attempt++) {
    int e = load_entry(dir, q->expect, desc, model, err, errlen);
    if (e == ENTRY_LOADED) {
      rc = 0;
      if (attempt > 0) cache_prune(root, dir); /* the cache grew by a build */
      break;
    }
    if (e == ENTRY_UNSAFE) {
      rc = 1;
      break;
    }
    if (e == ENTRY_FAILED) break;
    char why[1024];
    if (e == ENTRY_BROKEN && remove_tree(dir, why, sizeof why)) {
      snprintf(err, errlen, "cannot remove the broken cache entry '%s': %s", dir, why);
      break;
    }
    if (attempt == 3) break; /* (err says why the last build is not there) */
    *err = 0;
    rc = build(q, root, dir, err, errlen);
    if (rc) break;
    rc = 2;
    if (!*err) snprintf(err, errlen, "the cache entry '%s' was not usable after building it", dir);
  }
  free(dir);
  free(root);
  return rc;
}

/* ---- small files of other kinds (a streamed data file's index: eval.c) ---- */

/* root/KIND, created 0700 when missing, checked as the root is: *dir set, or -1 */
static int open_kind(const char *kind, char **dir, char *err, size_t errlen) {
  char *root = cache_root();
  int rc = open_root(root, err, errlen);
  *dir = fmt("%s/%s", root, kind);
  free(root);
  struct stat st;
  if (!rc && mkdir(*dir, 0700) && errno != EEXIST) {
    snprintf(err, errlen, "cannot create the cache directory '%s': %s", *dir, strerror(errno));
    rc = -1;
  }
  if (!rc && lstat(*dir, &st)) {
    snprintf(err, errlen, "cannot inspect the cache directory '%s': %s", *dir, strerror(errno));
    rc = -1;
  }
  if (!rc && (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode))) {
    snprintf(err, errlen, "refusing to use the cache: '%s' is not a directory", *dir);
    rc = -1;
  }
  if (!rc) rc = check_owner(&st, *dir, "the cache directory", err, errlen);
  if (rc) free(*dir), *dir = NULL;
  return rc;
}

unsigned char *cache_blob_get(const char *kind, const char *name, size_t max, size_t *n, char *err, size_t errlen) {
  char *dir;
  *err = 0;
  if (open_kind(kind, &dir, err, errlen)) return NULL;
  char *path = fmt("%s/%s", dir, name);
  free(dir);
  unsigned char *data = NULL;
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  struct stat st;
  if (fd < 0) {
    if (errno != ENOENT) snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
  } else if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "refusing to use '%s': not a regular file", path);
  } else if (!check_owner(&st, path, "the cache entry", err, errlen)) {
    if ((size_t)st.st_size > max) snprintf(err, errlen, "'%s' is larger than any entry (%lld bytes)", path, (long long)st.st_size);
    else if (!(data = read_fd(fd, max, n))) snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno ? errno : EIO));
    else futimens(fd, NULL); /* used now (cache_prune) */
  }
  if (fd >= 0) close(fd);
  free(path);
  return data;
}

int cache_blob_put(const char *kind, const char *name, const void *data, size_t n, char *err, size_t errlen) {
  char *dir;
  if (open_kind(kind, &dir, err, errlen)) return -1;
  char *path = fmt("%s/%s", dir, name);
  free(dir);
  /* whole or not at all, however many processes write it at once (afile.c) */
  cv_afile a;
  int rc = cv_afile_open(&a, path, 0, err, errlen);
  if (!rc && fchmod(a.fd, 0600)) { /* (whatever the umask: an entry others can write is refused) */
    snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
    cv_afile_abort(&a);
    rc = -1;
  }
  if (!rc && cv_afile_write(&a, data, n, err, errlen)) rc = -1; /* (aborted) */
  else if (!rc) rc = cv_afile_commit(&a, err, errlen);
  if (!rc) {
    char *root = cache_root();
    cache_prune(root, path);
    free(root);
  }
  free(path);
  return rc;
}

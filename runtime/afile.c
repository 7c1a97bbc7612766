/* afile.c: a file written whole or not at all, by any number of processes at once.
 *
 * The contents are written to a file no other process can see (O_TMPFILE: an inode in
 * the target's directory with no name), flushed, given a temporary name and renamed over
 * the target: a reader sees the old file or the new one, never a mix, and of two writers
 * the last to commit wins while both finish. A writer killed before its commit leaves
 * nothing behind, since its file never had a name.
 *
 * Where the filesystem has no O_TMPFILE (or /proc is missing, which linking the unnamed
 * inode needs), the contents carry the temporary name from the start, and a killed
 * writer leaves it behind. Such leftovers are removed by the next writer of the same
 * target, and only when they are provably ours and abandoned:
 *   - the name is "." BASE ".cavs-tmp-" and 16 hexadecimal digits whose last 4 check the
 *     rest against BASE, so that no file of the user's, whatever its name, passes for one
 *     (an earlier design removed every BASE.tmp?????? and took a user's notes with it);
 *   - it is a regular file of ours with one link;
 *   - no process holds it: every writer holds an exclusive flock(2) on its file from
 *     before the file is visible under its name (O_TMPFILE) or, in the named fallback,
 *     from right after creating it, and checks once it holds the lock that the name is
 *     still its file (a cleaner may have taken the instant between the two for a
 *     leftover: the writer then starts again under a new name). The kernel drops the lock
 *     when the writer dies, however it dies.
 * Nothing else is ever removed. */
#include "afile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TEMP_INFIX ".cavs-tmp-"
/* a base longer than this is cut in the temporary name, which must stay under NAME_MAX */
enum { BASE_KEEP = 200, RAND_HEX = 12, TAG_HEX = 4 };

static uint64_t fnv64(const char *s, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static unsigned tag_of(const char *base, size_t bl, const char *rnd) {
  uint64_t h = fnv64(base, bl, 1469598103934665603ull);
  h = fnv64("/", 1, h);
  return (unsigned)(fnv64(rnd, RAND_HEX, h) & 0xffff);
}

static size_t kept_len(const char *base) {
  size_t n = strlen(base);
  return n > BASE_KEEP ? BASE_KEEP : n;
}

void cv_afile_temp_name(const char *base, uint64_t bits, char *out, size_t outlen) {
  char rnd[RAND_HEX + 1];
  snprintf(rnd, sizeof rnd, "%012llx", (unsigned long long)(bits & 0xffffffffffffull));
  size_t bl = kept_len(base);
  snprintf(out, outlen, ".%.*s" TEMP_INFIX "%s%04x", (int)bl, base, rnd, tag_of(base, bl, rnd));
}

void cv_afile_new_temp_name(const char *base, char *out, size_t outlen) {
  uint64_t bits;
  if (getrandom(&bits, sizeof bits, GRND_NONBLOCK) != (ssize_t)sizeof bits) {
    static unsigned counter;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    bits = (uint64_t)t.tv_nsec ^ ((uint64_t)t.tv_sec << 20) ^ ((uint64_t)getpid() << 32) ^ ++counter;
  }
  cv_afile_temp_name(base, bits, out, outlen);
}

static bool is_hex(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}

bool cv_afile_is_temp(const char *name, const char *base) {
  size_t bl = kept_len(base), il = strlen(TEMP_INFIX);
  if (strlen(name) != 1 + bl + il + RAND_HEX + TAG_HEX || name[0] != '.' || strncmp(name + 1, base, bl) ||
      strncmp(name + 1 + bl, TEMP_INFIX, il))
    return false;
  const char *rnd = name + 1 + bl + il;
  if (!is_hex(rnd, RAND_HEX + TAG_HEX)) return false;
  return (unsigned)strtoul(rnd + RAND_HEX, NULL, 16) == tag_of(base, bl, rnd);
}

/* Removes the leftovers of killed writers of base in the directory dfd (see the top). */
static void remove_leftovers(int dfd, const char *base) {
  int d2 = dup(dfd);
  DIR *d = d2 >= 0 ? fdopendir(d2) : NULL;
  if (!d) {
    if (d2 >= 0) close(d2);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!cv_afile_is_temp(e->d_name, base)) continue;
    int fd = openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st, now;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && st.st_nlink == 1 &&
        flock(fd, LOCK_EX | LOCK_NB) == 0 && fstatat(dfd, e->d_name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
        now.st_dev == st.st_dev && now.st_ino == st.st_ino)
      unlinkat(dfd, e->d_name, 0);
    close(fd); /* and the lock with it */
  }
  closedir(d);
}

static void afile_free(cv_afile *a) {
  if (a->fd >= 0) close(a->fd);
  if (a->dfd >= 0) close(a->dfd);
  free(a->base);
  free(a->path);
  free(a->tmp);
  *a = (cv_afile){.fd = -1, .dfd = -1};
}

static int open_in_dir(cv_afile *a, const char *path, bool named, char *err, size_t errlen);

static int fail(cv_afile *a, int e, char *err, size_t errlen) {
  snprintf(err, errlen, "cannot write '%s': %s", a->path ? a->path : "?", strerror(e));
  cv_afile_abort(a);
  errno = e; /* (the caller's exit status may follow it: memory's is not a file's) */
  return -1;
}

/* The named fallback: a new file under a temporary name, locked, still ours once locked. */
static int open_named(cv_afile *a, mode_t mode) {
  char name[BASE_KEEP + 64];
  for (int attempt = 0; attempt < 100; attempt++) {
    cv_afile_new_temp_name(a->base, name, sizeof name);
    int fd = openat(a->dfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      return -1;
    }
    struct stat st, now;
    int rc;
    while ((rc = flock(fd, LOCK_EX)) < 0 && errno == EINTR) {}
    if (rc == 0 && fstat(fd, &st) == 0 && st.st_nlink > 0 && fstatat(a->dfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
        now.st_dev == st.st_dev && now.st_ino == st.st_ino) {
      a->fd = fd;
      a->tmp = strdup(name);
      if (a->tmp) return 0;
      unlinkat(a->dfd, name, 0);
      close(fd);
      errno = ENOMEM;
      return -1;
    }
    close(fd); /* taken for a leftover in the instant before the lock: again, anew */
  }
  errno = EEXIST;
  return -1;
}

/* Where the link p leads (its text, taken from p's directory where it is relative),
   malloc'd; NULL with *link false where p is no link, and with errno where it is one
   that could not be read */
static char *link_step(const char *p, bool *link) {
  struct stat st;
  *link = lstat(p, &st) == 0 && S_ISLNK(st.st_mode);
  if (!*link) return NULL;
  char text[4096];
  ssize_t n = readlink(p, text, sizeof text - 1);
  if (n < 0) return NULL;
  text[n] = 0;
  const char *slash = strrchr(p, '/');
  char *next = NULL;
  if (text[0] == '/' || !slash) next = strdup(text);
  else if (asprintf(&next, "%.*s/%s", (int)(slash - p), p, text) < 0) next = NULL;
  return next;
}

/* The end of a chain of links that leads nowhere yet (a save makes the file there);
   NULL with errno past 40 */
static char *dangling_end(const char *path) {
  char *p = strdup(path);
  for (int hop = 0; p && hop < 40; hop++) {
    bool link;
    char *next = link_step(p, &link);
    if (!link) return p;
    int e = errno;
    free(p);
    if (!next) {
      errno = e;
      return NULL;
    }
    p = next;
  }
  int e = p ? ELOOP : ENOMEM;
  free(p);
  errno = e;
  return NULL;
}

/* The descriptor a name stands for (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N
   and this process's /proc/PID/fd/N), as written or as a link of the user's says */
static int descriptor_named(const char *p) {
  if (!strcmp(p, "/dev/stdout")) return 1;
  if (!strcmp(p, "/dev/stderr")) return 2;
  char own[64];
  snprintf(own, sizeof own, "/proc/%ld/fd/", (long)getpid());
  const char *const dirs[] = {"/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/", own};
  for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
    size_t n = strlen(dirs[i]);
    if (strncmp(p, dirs[i], n) || !p[n] || strspn(p + n, "0123456789") != strlen(p + n) || strlen(p + n) > 9) continue;
    return atoi(p + n);
  }
  return -1;
}

int cv_afile_descriptor(const char *path) {
  char *p = strdup(path);
  int fd = -1;
  for (int hop = 0; p && hop < 40; hop++) {
    if ((fd = descriptor_named(p)) >= 0) break;
    bool link;
    char *next = link_step(p, &link); /* (NULL: no link, the chain's end) */
    free(p);
    p = next;
  }
  free(p);
  return fd >= 0 && fcntl(fd, F_GETFL) >= 0 ? fd : -1;
}

int cv_afile_target(const char *path, char **target, bool *direct, char *err, size_t errlen) {
  struct stat st;
  *target = NULL, *direct = false;
  /* a descriptor this process holds (standard output, which the shell may have sent to a
     file, appending): written to as it is, never a file replaced behind it */
  if (cv_afile_descriptor(path) >= 0) {
    *direct = true;
    if (!(*target = strdup(path))) {
      snprintf(err, errlen, "cannot write '%s': %s", path, strerror(ENOMEM));
      return -1;
    }
    return 0;
  }
  if (stat(path, &st) == 0) {
    if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
      *direct = true;
      *target = strdup(path);
    } else if (S_ISDIR(st.st_mode)) {
      snprintf(err, errlen, "cannot write '%s': it is a directory", path);
      return -1;
    } else if (!S_ISREG(st.st_mode)) {
      snprintf(err, errlen, "cannot write '%s': not a regular file (a %s)", path,
               S_ISBLK(st.st_mode) ? "block device" : S_ISSOCK(st.st_mode) ? "socket" : "special file");
      return -1;
    } else if (!(*target = realpath(path, NULL))) { /* (every link followed, the last one included) */
      snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
      return -1;
    } else if (faccessat(AT_FDCWD, *target, W_OK, AT_EACCESS) && errno == EACCES) {
      /* a file its owner made read-only is not replaced behind their back (the shell's
         `>` refuses it too; the directory's permission alone would let a rename by) */
      snprintf(err, errlen, "cannot write '%s': it is write-protected (%s)", path, strerror(EACCES));
      free(*target);
      *target = NULL;
      return -1;
    }
  } else if (errno == ENOENT) {
    *target = dangling_end(path); /* (a link to a file to be made, or no link) */
  } else {
    snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
    return -1;
  }
  if (!*target) {
    snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

int cv_afile_open(cv_afile *a, const char *path, int flags, char *err, size_t errlen) {
  *a = (cv_afile){.fd = -1, .dfd = -1};
  a->path = strdup(path);
  if (!a->path) {
    snprintf(err, errlen, "cannot write '%s': %s", path, strerror(ENOMEM));
    errno = ENOMEM;
    return -1;
  }
  char *target = NULL;
  if (flags & CV_AFILE_USER) {
    if (cv_afile_target(path, &target, &a->direct, err, errlen)) {
      int e = errno;
      cv_afile_abort(a);
      errno = e;
      return -1;
    }
    if (a->direct) { /* nothing to replace: written to as it is */
      int fd = cv_afile_descriptor(target); /* (its offset and O_APPEND shared) */
      a->fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : open(target, O_WRONLY | O_NOCTTY | O_CLOEXEC);
      free(target);
      return a->fd < 0 ? fail(a, errno, err, errlen) : 0;
    }
    struct stat st;
    if (stat(target, &st) == 0)
      a->keep = true, a->mode = st.st_mode & 0777, a->uid = (unsigned)st.st_uid, a->gid = (unsigned)st.st_gid;
    path = target;
  }
  int rc = open_in_dir(a, path, (flags & CV_AFILE_NAMED) != 0, err, errlen);
  free(target);
  return rc;
}

/* cv_afile_open's file in path's directory */
static int open_in_dir(cv_afile *a, const char *path, bool named, char *err, size_t errlen) {
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) return fail(a, EISDIR, err, errlen);
  a->base = strdup(base);
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  if (!a->base || !dir) {
    free(dir);
    return fail(a, ENOMEM, err, errlen);
  }
  a->dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  free(dir);
  if (a->dfd < 0) return fail(a, errno, err, errlen);
  remove_leftovers(a->dfd, a->base);
  if (!named && access("/proc/self/fd", X_OK) == 0) {
    a->fd = openat(a->dfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0666);
    if (a->fd >= 0 && flock(a->fd, LOCK_EX) == 0) return 0;
    if (a->fd >= 0) close(a->fd);
    a->fd = -1;
  }
  /* no O_TMPFILE here (EOPNOTSUPP, EISDIR on old kernels, ...): the named fallback */
  if (open_named(a, 0666)) return fail(a, errno, err, errlen);
  return 0;
}

int cv_afile_write(cv_afile *a, const void *p, size_t n, char *err, size_t errlen) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(a->fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return fail(a, w < 0 ? errno : ENOSPC, err, errlen);
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

int cv_afile_commit(cv_afile *a, char *err, size_t errlen) {
  if (a->direct) { /* (a pipe or a device: no file to flush or to put in place) */
    afile_free(a);
    return 0;
  }
  if (a->keep) {
    /* the replaced file's permissions; its owner and group where this process may give
       them (root, or a group of its own): where the group stays this process's, the old
       group's permissions are not handed to it */
    if ((uid_t)a->uid != geteuid()) /* (failing, the file is this process's, as one it makes) */
      (void)!fchown(a->fd, (uid_t)a->uid, (gid_t)-1);
    bool group = (gid_t)a->gid == getegid() || fchown(a->fd, (uid_t)-1, (gid_t)a->gid) == 0;
    if (fchmod(a->fd, (mode_t)a->mode & (group ? 0777 : 0707))) return fail(a, errno, err, errlen);
  }
  if (fsync(a->fd)) return fail(a, errno, err, errlen);
  if (!a->tmp) {
    /* give the unnamed file a temporary name (it is locked: no cleaner takes it) */
    char name[BASE_KEEP + 64], proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", a->fd);
    int rc = -1;
    for (int attempt = 0; attempt < 100 && rc; attempt++) {
      cv_afile_new_temp_name(a->base, name, sizeof name);
      rc = linkat(AT_FDCWD, proc, a->dfd, name, AT_SYMLINK_FOLLOW);
      if (rc && errno != EEXIST) break;
    }
    if (rc) return fail(a, errno, err, errlen);
    a->tmp = strdup(name);
    if (!a->tmp) {
      unlinkat(a->dfd, name, 0);
      return fail(a, ENOMEM, err, errlen);
    }
  }
  if (renameat(a->dfd, a->tmp, a->dfd, a->base)) return fail(a, errno, err, errlen);
  free(a->tmp);
  a->tmp = NULL;
  /* The rename itself, made durable. Where the directory cannot be flushed (EIO) the new
     file is in place but a crash may take the rename back, to the old file whole: the
     caller hears it, as of a save that failed (before, the failure went unreported and
     the save was said to be done). A filesystem that flushes no directory says EINVAL:
     nothing to wait for there. */
  if (fsync(a->dfd) && errno != EINVAL) {
    snprintf(err, errlen,
             "wrote '%s', but its directory could not be flushed to disk (%s): a crash may leave the file as it "
             "was before",
             a->path ? a->path : "?", strerror(errno));
    int e = errno;
    afile_free(a);
    errno = e;
    return -1;
  }
  afile_free(a);
  return 0;
}

void cv_afile_abort(cv_afile *a) {
  if (a->tmp && a->dfd >= 0) unlinkat(a->dfd, a->tmp, 0);
  afile_free(a);
}

/* The copy of cv_afile_keep_aside: `in` (open, regular, st its stat) into a new `kept`
   in tdfd, with its mode and times, flushed to disk (a crash after the replacement must
   find whole bytes to put back). 0, or -1 with errno set and nothing left under kept. */
static int copy_aside(int in, const struct stat *st, int tdfd, const char *kept) {
  int out = openat(tdfd, kept, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600), e = 0;
  if (out < 0) return -1;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = read(in, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n < 0) e = errno;
      break;
    }
    for (ssize_t at = 0; at < n && !e;) {
      ssize_t w = write(out, buf + at, (size_t)(n - at));
      if (w > 0) at += w;
      else if (w < 0 && errno != EINTR) e = errno;
      else if (w == 0) e = EIO;
    }
    if (e) break;
  }
  struct timespec times[2] = {st->st_atim, st->st_mtim};
  if (!e && fchmod(out, st->st_mode & 07777)) e = errno;
  if (!e && futimens(out, times)) e = errno;
  if (!e && fsync(out)) e = errno;
  if (close(out) && !e) e = errno;
  if (!e) return 0;
  unlinkat(tdfd, kept, 0);
  errno = e;
  return -1;
}

int cv_afile_keep_aside(int dfd, const char *name, int tdfd, const char *kept) {
  if (linkat(dfd, name, tdfd, kept, 0) == 0) return 1;
  if (errno == ENOENT) return 0;
  int e = errno;
  int in = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  struct stat st;
  if (in < 0) {
    if (errno == ENOENT) return 0; /* (gone between the two) */
    errno = e;
    return -1;
  }
  int rc = fstat(in, &st) == 0 && S_ISREG(st.st_mode) ? copy_aside(in, &st, tdfd, kept) : (errno = e, -1);
  e = errno;
  close(in);
  errno = e;
  return rc ? -1 : 1;
}

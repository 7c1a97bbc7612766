/* afile.h: a file written whole or not at all, by any number of processes at once
 * (afile.c). libcavs writes its checkpoints through it, and the `cavs` command, which
 * compiles afile.c in too, its generated data and its plots. Not installed. */
#ifndef CAVS_AFILE_H
#define CAVS_AFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cv_afile {
  int fd;      /* write the contents here */
  int dfd;     /* the directory the file goes into */
  char *base;  /* its name there */
  char *path;  /* as given, for messages */
  char *tmp;   /* the temporary name the contents carry while unfinished (named mode) */
  bool direct; /* a FIFO or a character device, written straight to (CV_AFILE_USER) */
  bool keep;   /* the file replaced: its permissions, owner and group (CV_AFILE_USER) */
  unsigned mode, uid, gid;
} cv_afile;

/* cv_afile_open's flags. NAMED: the fallback of filesystems without O_TMPFILE (the tests
 * take both ways). USER: a path a user gave (a checkpoint, a data set, a picture), not
 * one of cavs's own: its final symbolic links are followed (the file they lead to is
 * replaced, and the links stay), an existing file's permissions (and, where this process
 * may, owner and group) are the new file's, and a FIFO or a character device (a pipe,
 * /dev/stdout, /dev/null) is written straight to, as there is no file to replace; any
 * other file that is not a regular one is refused, and so is a file this process may
 * not write (its owner's `chmod a-w`), which a rename would otherwise replace. Without USER a link is replaced, not
 * followed (the compile cache's entries: a link planted there must not send a write
 * elsewhere). */
enum { CV_AFILE_NAMED = 1, CV_AFILE_USER = 2 };
/* Opens a new, empty file to become `path` when committed; path's directory must exist.
 * Removes what saves to `path` that were killed left behind (only files provably ours and
 * abandoned). Returns 0, or -1 with the message in err and errno set (as for write and
 * commit). */
int cv_afile_open(cv_afile *a, const char *path, int flags, char *err, size_t errlen);
/* Where a USER save to `path` goes: *target (malloc'd) the file it replaces or makes, its
 * final links followed, and *direct where that is a FIFO, a character device or a
 * descriptor of this process (cv_afile_descriptor; *target is then path). -1 with
 * the message in err for a directory or another file that is not a regular one, or a
 * chain of links too long; the `cavs` command checks its outputs with it before it works
 * (check_output). */
int cv_afile_target(const char *path, char **target, bool *direct, char *err, size_t errlen);
/* The descriptor `path` names, where it names one this process holds: /dev/stdout,
 * /dev/stderr, /dev/fd/N, /proc/self/fd/N (or /proc/PID/fd/N of this process), as
 * written or at the end of the user's links to it; else -1. A USER save there writes to
 * that descriptor (its duplicate: the same offset, appending where the shell's `>>`
 * opened it), never replacing the file the shell opened behind it. */
int cv_afile_descriptor(const char *path);
/* Writes n bytes; -1 with the message in err on failure (the file is then aborted). */
int cv_afile_write(cv_afile *a, const void *p, size_t n, char *err, size_t errlen);
/* Flushes the contents to disk and puts them at the path in one step (a reader sees the
 * old file or the new one; of two writers committing, the last wins), then makes that
 * durable. Frees a; -1 with the message in err, the path left as it was, or, where only
 * the last step failed (the directory not flushed), the new file in place but perhaps
 * not after a crash. */
int cv_afile_commit(cv_afile *a, char *err, size_t errlen);
/* Drops the file: nothing of it stays. Frees a; a freed or never opened one is left. */
void cv_afile_abort(cv_afile *a);

/* Whether `name` (a directory entry) is what a save of `base` names its unfinished
 * contents: "." base ".cavs-tmp-" and 16 hexadecimal digits, the last 4 a check of the
 * rest, so that no file of the user's is ever taken for one. For the tests. */
bool cv_afile_is_temp(const char *name, const char *base);
/* The temporary name for base with the 48 random bits given (the tests' fixed ones). */
void cv_afile_temp_name(const char *base, uint64_t bits, char *out, size_t outlen);
/* A new temporary name for base: random digits from the kernel, else from the clock and
   the process (a collision only costs a retry: such names are created exclusively); the
   compile cache's build directories are named so too. */
void cv_afile_new_temp_name(const char *base, char *out, size_t outlen);

/* Keeps the file `name` of directory dfd aside as `kept` in directory tdfd (both may be
 * AT_FDCWD, the names then paths) before something replaces it, so that a failure among
 * the replacements can put it back: a hard link, or where the link is refused (a
 * filesystem without hard links, a file with too many, a full directory) a copy with its
 * mode and times, flushed to disk. 1 kept, 0 where there is no such file, -1 with errno
 * set where it cannot be kept (nothing is then left under `kept`): the caller must then
 * replace nothing, or lose the earlier file if a later step fails. */
int cv_afile_keep_aside(int dfd, const char *name, int tdfd, const char *kept);

#endif

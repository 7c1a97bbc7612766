/* cache.h: the compile cache of the `cavs` command (cache.c): a model's source text in,
 * a loaded model descriptor out; and the build it runs, for `cavs build`. Not part of
 * libcavs: only the driver compiles models. */
#ifndef CAVS_CACHE_H
#define CAVS_CACHE_H

#include "cavs.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct CacheReq {
  const char *cavsc;   /* the compiler, a path or a name looked up in PATH */
  const char *include; /* the directory holding cavs.h */
  const char *cc;      /* the C compiler */
  const char *const *cflags;
  int ncflags;
  const char *version; /* of cavs: part of the key */
  const char *precision; /* cavsc's --precision (NULL: float): part of the key */
  const char *target;  /* cavsc's --target (NULL: c; "cuda": MODEL.cu, which `cc` is nvcc
                          for): part of the key */
  int ablations;       /* cavsc's --no-fuse (1), --no-merge (2), --no-homes (4) and
                          --no-push-view (8): part of the key */
  const char *text;    /* the model's source, handed to cavsc on its standard input */
  size_t len;
  const char *name;    /* what cavsc's messages and the generated code call the source */
  const char *expect;  /* when set, the model must have this name (or nothing is loaded) */
  const char *input;   /* the file the source was read from, if any: cache_build_into
                          never writes over it */
} CacheReq;

/* Where the cache lives: $CAVS_CACHE, $XDG_CACHE_HOME/cavs, $HOME/.cache/cavs, the
 * password database's home/.cache/cavs, else /tmp/cavs-UID. Freshly allocated. */
char *cache_root(void);

/* A temporary directory that a process killed midway may leave, and the next removes:
 * made in root, named by afile.c's temporary names for `base` (check digits no name of
 * the user's has) and locked (flock) by the descriptor returned, until it is closed or
 * the process ends: -1 with err said where none could be made; *tmp is its path
 * (malloc'ed). sweep_temp_dirs removes the directories of `base` in root that no process
 * holds, and nothing else (not a link, not another user's, not one whose maker lives). */
int lock_temp_dir(const char *root, const char *base, char **tmp, char *err, size_t errlen);
void sweep_temp_dirs(const char *root, const char *base);

/* Runs cavsc on the source without writing anything: 0 when the model is valid, else 1
 * (cavsc's messages went to stderr) or 2 (cavsc could not run; err says why). */
int cache_check_source(const CacheReq *q, char *err, size_t errlen);

/* How a model is built: cavsc on the source, into `dir` (a new, empty directory), then,
 * with `object`, the compiler on the NAME.c (NAME.cu for the cuda target) it wrote, into
 * dir/model.so. Returns 0 and sets *model to NAME (malloc'ed), or 1 or 2 as
 * cache_load does, with the message in err (empty when cavsc already printed it). */
int cache_compile(const CacheReq *q, const char *dir, bool object, char **model, char *err, size_t errlen);

/* What `cavs build` runs: the model compiled as cache_compile does, in a new directory
 * inside `dir` (created with its parents when missing), then NAME.h, NAME.c (or .cu) and, with
 * `object`, NAME.so renamed into `dir`. Returns as cache_compile does; when it fails,
 * nothing it made is left. */
int cache_build_into(const CacheReq *q, const char *dir, bool object, char **model, char *err, size_t errlen);

/* The directory of the cache entry the request names (it may not exist yet); its
 * model.so is what cache_load loads. Freshly allocated. */
char *cache_entry(const CacheReq *q);

/* Compiles the source into the cache unless a verified build is there, and loads it.
 * Returns 0 and sets *desc and *model (the model's name, malloc'ed), or returns 1 for
 * a user error (a bad model, an unsafe cache) or 2 for an internal one, with the
 * message in err (empty when cavsc already printed it). */
int cache_load(const CacheReq *q, const cavs_desc **desc, char **model, char *err, size_t errlen);

/* A small file of the cache's directory KIND (made 0700 when missing, and checked as the
 * cache is): its bytes (malloc'ed, *n of them, at most max), or NULL with err empty when
 * there is none, else with err saying why (not ours, writable by others, not a regular
 * file, larger than max, unreadable). */
unsigned char *cache_blob_get(const char *kind, const char *name, size_t max, size_t *n, char *err, size_t errlen);
/* Written whole or not at all (cv_afile: a reader sees the old bytes or the new ones,
 * whoever else writes it at once): 0, or -1 with err saying why. The bytes start with
 * their kind's magic (cache.c's blob_kinds: CACHE_STREAMS_MAGIC), by which pruning and
 * `cavs cache --clear` know the file for the cache's before they remove it. */
#define CACHE_STREAMS_MAGIC "cvsidx1\n"
int cache_blob_put(const char *kind, const char *name, const void *data, size_t n, char *err, size_t errlen);
/* The cache's size limit in bytes, $CAVS_CACHE_MAX (bytes, or a number with K, M or G;
 * 0: none), else CACHE_MAX_DEFAULT: 0, or -1 with err saying why it is malformed. */
#define CACHE_MAX_DEFAULT (2LL << 30)
#define CACHE_RECENT_S 60 /* an entry or file used this many seconds ago is never pruned */
int cache_limit(long long *bytes, char *err, size_t errlen);
/* Keeps the cache in `root` within its limit: while its entries (holding a record of
 * cavs's) and kinds' files (named by 64 hex digits) take more, removes the least recently
 * used (an entry's directory mtime is set at each load, a file's at each read) down to
 * nine tenths of it, never `keep` (a path) nor what was used in the last CACHE_RECENT_S
 * seconds, nor a link, a build under way or anything not of ours or of another name.
 * Called after a build and after a file is written. */
void cache_prune(const char *root, const char *keep);
/* What the cache holds that pruning may remove (cache_prune's entries and files). */
typedef struct CacheUse {
  int entries, indexes;
  long long entry_bytes, index_bytes;
} CacheUse;
enum { CACHE_LOOK, CACHE_PRUNE, CACHE_CLEAR };
/* `cavs cache`: the cache (*root, malloc'ed) checked as every load checks it, then with
 * CACHE_PRUNE pruned to nine tenths of *limit where it takes more (as after a build,
 * nothing used in the last minute removed), with CACHE_CLEAR every entry and file
 * removed; what it then holds in *u, what went in *gone. 0; 1 when there is no cache
 * directory (none is made); -1 with err saying why (a malformed $CAVS_CACHE_MAX, an
 * unsafe cache). */
int cache_tidy(int what, char **root, CacheUse *u, CacheUse *gone, long long *limit, char *err, size_t errlen);

#endif

/* build.c: from a model argument to a loaded model descriptor. A .vf (or a checkpoint's
 * embedded source) is compiled through cavsc and the system C compiler into the compile
 * cache (cache.c) and loaded from there; a .so is the user's own build, dlopen'ed as
 * given. Here too: where cavsc and cavs.h are found, and the C compiler's flags. */
#include "driver.h"
#include "cache.h"
#include "cavs_paths.h" /* the configured directories (Makefile.am) */

#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *exe_dir(void) {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return xstrdup(".");
  buf[n] = 0;
  char *slash = strrchr(buf, '/');
  if (slash) *slash = 0;
  return xstrdup(buf);
}

/* DIR/what or DIR/../what, where DIR holds this program (a build tree, where libtool
 * puts the real binary in .libs/): the first that exists, or NULL. */
static char *beside_exe(const char *what) {
  char *dir = exe_dir();
  const char *cands[] = {"%s/%s", "%s/../%s"};
  for (int i = 0; i < 2; i++) {
    char *p = fmt(cands[i], dir, what);
    if (exists(p)) return p;
    free(p);
  }
  return NULL;
}

/* cavsc and cavs.h: from the environment, beside this program, or where `make install`
 * put them. */
static const char *find_cavsc(void) {
  const char *e = getenv("CAVSC");
  if (e && *e) return e;
  char *p = beside_exe("cavsc");
  return p ? p : "cavsc";
}

static const char *find_include(void) {
  const char *e = getenv("CAVS_INCLUDE");
  if (e && *e) return e;
  char *h = beside_exe("runtime/cavs.h");
  if (!h) h = beside_exe("include/cavs.h"); /* PREFIX/bin/cavs: PREFIX/include, wherever it is now */
  if (h) {
    *strrchr(h, '/') = 0;
    return h;
  }
  if (exists(CAVS_CFG_SRCDIR "/runtime/cavs.h")) return CAVS_CFG_SRCDIR "/runtime";
  return CAVS_CFG_INCLUDEDIR;
}

/* The C compiler's flags for a model, the same for every build: these, then the words of
 * $CAVS_MODEL_CFLAGS (split at blanks, without quoting: the environment is the user's
 * own), which is how the tests add -Wall -Werror and the sanitizers. Every flag is part
 * of the cache key, so a build with other flags is never reused. */
/* -fno-trapping-math: no floating-point exception flag is ever read, and without it gcc
 * will not if-convert a comparison that may raise one, so a fused loop with a relu
 * (`v > 0 ? g : 0`) stays scalar with a branch taken half the time: bench/moe's dense
 * block 12.4 s an epoch against 11.3 with it (Zen 3). It changes no value (nothing is
 * reassociated or contracted). */
static const char *const base_cflags[] = {"-std=c11", "-O3", "-march=native", "-fno-trapping-math", "-fPIC", "-shared",
#ifdef CAVS_MODEL_NO_AVX512
                                          "-mno-avx512f", /* a --enable-valgrind build: valgrind has no AVX-512 */
#endif
};

/* nvcc's, for the cuda target: C++ as the generated .cu needs, a shared CUDA runtime (the
 * one the CUDA backend module uses too, so both see the same device pointers and the same
 * default stream), and the toolkit's library directory in the object's run path; then
 * the GPUs it is for (nvcc_arch: configure's NVCC_ARCH, whose PTX a newer GPU's driver
 * compiles when it loads it). Each is part of the cache key, as a C model's flags are. */
#ifndef CAVS_CUDA_HOME
#define CAVS_CUDA_HOME "/usr/local/cuda"
#endif
static const char *const nvcc_flags[] = {"-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared",
                                         "-Xlinker", "-rpath=" CAVS_CUDA_HOME "/lib64"};

#ifdef CAVS_DRIVER_EMULATED
/* tests/cavs-emu, the tests' build of this command (never installed), whose cuda backend
 * is backend_cuda.cu on the emulated CUDA runtime of tests/cuda_emu.h: a cuda-target
 * model is MODEL.cu compiled by the host C++ compiler under that header, as
 * check_cuda_emu compiles it (tests/cudatest.h), its CUDA calls resolved in the emulator
 * that tests/libcavs-emu holds. */
static const char *const emu_flags[] = {"-x", "c++", "-std=c++17", "-O2", "-ffp-contract=off", "-fPIC", "-shared",
                                        "-include", CAVS_CFG_SRCDIR "/tests/cuda_emu.h", "-I" CAVS_CFG_SRCDIR "/tests"};
#endif

/* `base`, then the words of `more` (split at blanks) */
static const char *const *flags_and(const char *const *base, int nbase, const char *more, int *n) {
  int k = 0;
  char *words = xstrdup(more ? more : "");
  const char **flags = xmalloc(sizeof *flags * (nbase + strlen(words) / 2 + 1));
  for (int i = 0; i < nbase; i++) flags[k++] = base[i];
  for (char *save = NULL, *w = strtok_r(words, " \t\n", &save); w; w = strtok_r(NULL, " \t\n", &save)) flags[k++] = w;
  *n = k;
  return flags;
}

/* `base`, then the words of $CAVS_MODEL_CFLAGS */
static const char *const *model_flags(const char *const *base, int nbase, int *n) {
  return flags_and(base, nbase, getenv("CAVS_MODEL_CFLAGS"), n);
}

/* nvcc's architecture flags: $CAVS_NVCC_ARCH, else configure's NVCC_ARCH */
static const char *nvcc_arch(void) {
  const char *e = getenv("CAVS_NVCC_ARCH");
#ifdef CAVS_NVCC_ARCH
  if (!e || !*e) e = CAVS_NVCC_ARCH;
#endif
  return e;
}

/* The target a model is built for: cuda for --device cuda, c for the rest. */
static const char *model_target(void) {
  return model_opts.backend && !strcmp(model_opts.backend, "cuda") ? "cuda" : NULL;
}

static CacheReq cache_req(const char *name, const char *text, size_t len, const char *expect, const char *target) {
  const char *cc = getenv("CC");
  int ncflags;
  const char *const *cflags = model_flags(base_cflags, (int)(sizeof base_cflags / sizeof *base_cflags), &ncflags);
  CacheReq q = {.cavsc = find_cavsc(), .include = find_include(), .cc = cc && *cc ? cc : "cc", .cflags = cflags,
                .ncflags = ncflags, .version = CAVS_VERSION, .text = text, .len = len, .name = name,
                .expect = expect, .target = target, .ablations = build_ablations, .precision = model_precision};
  if (target && !strcmp(target, "cuda")) {
    const char *nvcc = getenv("NVCC");
#ifdef CAVS_NVCC
    if (!nvcc || !*nvcc) nvcc = CAVS_NVCC;
#endif
    q.cc = nvcc && *nvcc ? nvcc : "nvcc";
    q.cflags = flags_and(nvcc_flags, (int)(sizeof nvcc_flags / sizeof *nvcc_flags), nvcc_arch(), &q.ncflags);
#ifdef CAVS_DRIVER_EMULATED
    q.cc = CAVS_EMU_CXX;
    q.cflags = model_flags(emu_flags, (int)(sizeof emu_flags / sizeof *emu_flags), &q.ncflags);
#endif
  }
  return q;
}

/* Compiles source text (which cavsc's messages call `name`) through the cache and loads
 * it; `expect`, when set, is the model name the text must define. */
static Loaded load_vf(const char *name, const char *text, size_t len, const char *expect) {
  Loaded L = {0};
  CacheReq q = cache_req(name, text, len, expect, model_target());
  char err[2048];
  int rc = cache_load(&q, &L.desc, &L.name, err, sizeof err);
  keep(L.name);
  if (rc) {
    if (*err) die(rc, "%s", err);
    quit(rc);
  }
  L.source = xmalloc(len + 1);
  memcpy(L.source, text, len);
  L.source[len] = 0;
  return L;
}

Loaded load_model_arg(const char *path) {
  size_t n = strlen(path);
  if (n > 3 && !strcmp(path + n - 3, ".so")) {
    Loaded L = {0};
    void *lib = dlopen(strchr(path, '/') ? path : fmt("./%s", path), RTLD_NOW | RTLD_LOCAL);
    if (!lib) die(1, "cannot load '%s': %s", path, dlerror());
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char *name = xstrdup(base);
    name[strlen(name) - 3] = 0;
    const char *prefix = "lib";
    if (!strncmp(name, prefix, 3) && !dlsym(lib, fmt("%s_desc", name))) name += 3;
    L.desc = dlsym(lib, fmt("%s_desc", name));
    if (!L.desc) die(1, "'%s' has no symbol %s_desc (build it from cavsc's MODEL.c)", path, name);
    L.name = name;
    return L;
  }
  size_t len;
  char *text = slurp(path, &len);
  if (!text) die(file_status(errno), "cannot open '%s': %s", path, strerror(errno));
  return load_vf(path, text, len, NULL);
}

/* For a checkpoint: the model's source is inside it. The checkpoint has been read and
 * checked whole; its source is parsed and checked by cavsc (which writes nothing) before
 * it is compiled, and it must define the model the checkpoint names. Nothing from the
 * file becomes a path: the cache entry is named by a hash. */
Loaded load_from_ckpt(const cavs_ckpt *k, const char *ckpt_path) {
  const char *src = cavs_ckpt_source(k);
  char *name = fmt("%s (the model source in the checkpoint)", ckpt_path);
  model_precision = cavs_ckpt_precision(k) == CAVS_DOUBLE ? "double" : NULL;
  CacheReq q = cache_req(name, src, strlen(src), cavs_ckpt_model(k), model_target());
  char err[2048];
  int rc = cache_check_source(&q, err, sizeof err);
  if (rc == 1) die(1, "%s: the checkpoint's model source does not compile", ckpt_path);
  if (rc) die(rc, "%s", err);
  return load_vf(name, src, strlen(src), cavs_ckpt_model(k));
}

/* ---- cavs build ---- */

/* cavs build --cached: the entry built (or found) and checked as any model a command
 * loads (cache_load), then its model.so's path printed, for a program that loads models
 * itself (the Python package, which checks the object against the entry's recorded
 * hash again before it loads it). */
static int build_cached(const CacheReq *q) {
  const cavs_desc *desc;
  char err[2048], *name = NULL;
  int rc = cache_load(q, &desc, &name, err, sizeof err);
  keep(name);
  if (rc) {
    if (*err) die(rc, "%s", err);
    quit(rc);
  }
  printf("%s/model.so\n", (char *)keep(cache_entry(q)));
  return 0;
}

/* The one way to build a model outside the cache (the tests and `make generated` use it):
 * cavsc's NAME.h and NAME.c and, unless --emit-only, NAME.so, compiled with the flags
 * and the compiler a cache entry gets, into -o DIR (default .). Prints the path of
 * NAME.so (NAME.c with --emit-only). */
int cmd_build(int argc, char **argv) {
  static const char usage[] = "build: usage: cavs build MODEL.vf [options] [-o DIR] (cavs help build)";
  const char *out = NULL, *prec = NULL, *model = NULL, *target = NULL;
  bool emit_only = false, cached = false;
  optind = 0;
  for (int ch; (ch = next_option(argc, argv, CMD_BUILD)) != -1;) {
    switch (ch) {
    case 1:
      if (model) die(1, "build: unexpected argument '%s'", optarg);
      model = optarg;
      break;
    case OPT_PRECISION:
      if (strcmp(optarg, "float") && strcmp(optarg, "double")) die(1, "--precision: '%s' is not float or double", optarg);
      prec = optarg;
      break;
    case OPT_TARGET:
      if (strcmp(optarg, "c") && strcmp(optarg, "cuda")) die(1, "--target: '%s' is not c or cuda", optarg);
      target = strcmp(optarg, "c") ? optarg : NULL;
      break;
    case OPT_EMIT_ONLY: emit_only = true; break;
    case OPT_CACHED: cached = true; break;
    case OPT_OUTPUT_DIR: out = optarg; break;
    case OPT_NO_FUSE: build_ablations |= 1; break;
    case OPT_NO_MERGE: build_ablations |= 2; break;
    case OPT_NO_HOMES: build_ablations |= 4; break;
    case OPT_NO_PUSH_VIEW: build_ablations |= 8; break;
    }
  }
  /* after `--`, getopt stops: what is left is the model */
  for (; optind < argc; optind++) {
    if (model) die(1, "build: unexpected argument '%s'", argv[optind]);
    model = argv[optind];
  }
  if (!model) die(1, "%s", usage);
  if (cached && (out || emit_only)) die(1, "build: --cached builds into the compile cache: no -o, no --emit-only");
  if (!out) out = ".";
  if (!*out) die(1, "build: -o needs a directory");
  size_t len;
  char *text = slurp(model, &len);
  if (!text) die(file_status(errno), "cannot open '%s': %s", model, strerror(errno));
  CacheReq q = cache_req(model, text, len, NULL, target);
  q.precision = prec;
  q.input = model;
  if (cached) return build_cached(&q);
  char err[2048], *name = NULL;
  int rc = cache_build_into(&q, out, !emit_only, &name, err, sizeof err);
  keep(name);
  if (rc) {
    if (*err) die(rc, "%s", err);
    quit(rc);
  }
  printf("%s/%s.%s\n", out, name, emit_only ? (target ? "cu" : "c") : "so");
  return 0;
}

const char *check_device(const char *name) {
  const char *env = getenv("CAVS_DEVICE");
  if (!name && env && *env) name = env; /* what make check pins: the same device anywhere */
  if (!name) {
    /* the default: cuda where this build has it and the machine a GPU, else cpu. Only
       a machine with NVIDIA's device files pays for loading the CUDA libraries to ask. */
    char why[512];
    bool built = false;
    for (int i = 0; i < cavs_backend_count(); i++) built |= !strcmp(cavs_backend_name(i), "cuda");
    return built && access("/dev/nvidiactl", F_OK) == 0 && !cavs_backend_probe("cuda", why, sizeof why) ? "cuda"
                                                                                                        : NULL;
  }
  bool known = false;
  char list[256] = "";
  for (int i = 0; i < cavs_backend_count(); i++) {
    known |= !strcmp(name, cavs_backend_name(i));
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", cavs_backend_name(i));
  }
  char why[512];
  if (!known && strcmp(name, "cuda")) die(1, "unknown device '%s' (devices: %s)", name, list);
  if (cavs_backend_probe(name, why, sizeof why)) die(1, "device '%s' cannot be used: %s", name, why);
  return name;
}

void say_device(FILE *f, const cavs_model *m) {
  fprintf(f, "device: %s", cavs_model_backend(m));
  if (model_opts.threads > 0 && !strcmp(cavs_model_backend(m), "cpu")) fprintf(f, ", %d threads", model_opts.threads);
  fputc('\n', f);
}

/* A size in bytes as people read it: 512 B, 1.5 KiB, 2.0 GiB. */
static const char *human(long long b) {
  static char buf[4][32];
  static int k;
  k = (k + 1) % 4;
  static const char *const unit[] = {"KiB", "MiB", "GiB", "TiB"};
  if (b < 1024) snprintf(buf[k], sizeof buf[k], "%lld B", b);
  else {
    double v = (double)b / 1024;
    int u = 0;
    while (v >= 1024 && u < 3) v /= 1024, u++;
    snprintf(buf[k], sizeof buf[k], "%.1f %s", v, unit[u]);
  }
  return buf[k];
}

/* `cavs cache [--prune|--clear]`: where the compile cache is and what it holds; with
 * --prune, pruned to $CAVS_CACHE_MAX as a build prunes it; with --clear, every entry and
 * index removed. */
int cmd_cache(int argc, char **argv) {
  int what = CACHE_LOOK;
  optind = 0;
  for (int ch; (ch = next_option(argc, argv, CMD_CACHE)) != -1;) {
    if (ch == 1) die(1, "cache: unexpected argument '%s'", optarg);
    int w = ch == OPT_PRUNE ? CACHE_PRUNE : CACHE_CLEAR;
    if (what != CACHE_LOOK && what != w) die(1, "cache: --prune or --clear, not both");
    what = w;
  }
  if (optind < argc) die(1, "cache: unexpected argument '%s'", argv[optind]);
  char *root, err[1024];
  CacheUse u, gone;
  long long limit;
  int rc = cache_tidy(what, &root, &u, &gone, &limit, err, sizeof err);
  keep(root);
  if (rc < 0) die(1, "%s", err);
  if (what != CACHE_LOOK)
    printf("removed: %d entr%s and %d ind%s, %s\n", gone.entries, gone.entries == 1 ? "y" : "ies", gone.indexes,
           gone.indexes == 1 ? "ex" : "exes", human(gone.entry_bytes + gone.index_bytes));
  printf("cache: %s%s\n", root, rc == 1 ? " (not made yet)" : "");
  printf("entries: %d, %s\n", u.entries, human(u.entry_bytes));
  printf("indexes: %d, %s\n", u.indexes, human(u.index_bytes));
  const char *e = getenv("CAVS_CACHE_MAX");
  if (!limit) printf("limit: none (CAVS_CACHE_MAX=%s)\n", e);
  else printf("limit: %s (%s)\n", human(limit), e && *e ? "CAVS_CACHE_MAX" : "the default; CAVS_CACHE_MAX sets it");
  return 0;
}

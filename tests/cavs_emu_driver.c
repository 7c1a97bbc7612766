/* cavs_emu_driver.c: linked into tests/cavs-emu alone, the cavs command whose cuda device
 * is the emulated one (never installed). What a test asks of the device comes through
 * the environment, read before main runs: $CAVS_EMU_ORDER (issued, main or side: how
 * queued work is ordered, cuda_emu_api.h), $CAVS_EMU_FAIL_MALLOC and
 * $CAVS_EMU_FAIL_LAUNCH and $CAVS_EMU_FAIL_COPY (the n-th cudaMalloc, kernel launch or
 * synchronous copy fails), $CAVS_EMU_COUNTS (a
 * file that the run's kernel launches are written to at exit). At exit, whatever
 * the emulator found wrong (a misuse of the API, a write past an allocation) is printed
 * and fails the run with status 70, whatever the command's own status was. */
#include "cuda_emu_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long env_long(const char *name) {
  const char *e = getenv(name);
  return e && *e ? strtol(e, NULL, 10) : 0;
}

static void report(void) {
  const char *path = getenv("CAVS_EMU_COUNTS");
  FILE *f = path && *path ? fopen(path, "w") : NULL;
  if (f) {
    cavs_emu_counts c;
    cavs_emu_counters(&c, 0);
    /* the kernels first (tests read them with atol), then what a GPU's own count of
       launches (cavs_backend_stats) also holds: products and memsets; the syncs, and the
       synchronous copies (what $CAVS_EMU_FAIL_COPY counts), the allocations (what
       $CAVS_EMU_FAIL_MALLOC counts), the kernels run as nodes of launched graphs
       (--cuda-graphs: $CAVS_EMU_FAIL_LAUNCH counts them, as launches) */
    fprintf(f, "%ld kernels %ld cublas %ld memsets %ld syncs %ld copies %ld mallocs %ld graph-kernels\n", c.launches,
            c.blas_calls, c.memsets, c.syncs, c.copies, c.mallocs, c.graph_kernel_nodes);
    fclose(f);
  }
  cavs_emu_check_bounds();
  const char *e = cavs_emu_errors();
  if (!e) return;
  fprintf(stderr, "cavs-emu: the emulated device found misuses:\n%s", e);
  fflush(stderr);
  _exit(70);
}

__attribute__((constructor)) static void setup(void) {
  const char *o = getenv("CAVS_EMU_ORDER");
  if (o && !strcmp(o, "main")) cavs_emu_set_order(CAVS_EMU_MAIN_FIRST);
  else if (o && !strcmp(o, "side")) cavs_emu_set_order(CAVS_EMU_SIDE_FIRST);
  cavs_emu_fail_malloc(env_long("CAVS_EMU_FAIL_MALLOC"));
  cavs_emu_fail_launch(env_long("CAVS_EMU_FAIL_LAUNCH"));
  cavs_emu_fail_copy(env_long("CAVS_EMU_FAIL_COPY"));
  atexit(report);
}

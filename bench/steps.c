/* bench/steps: what an optimizer step costs as a model's gradients stay zero. One
 * step with every dense gradient at 1e-3 gives the moments a value, then the gradients
 * are left zero (the step zeroes them) and the moments decay: Adam's first by 0.9 a
 * step, Momentum's by its mu. Without arith.h's flush they sink below the smallest
 * normal float after about 800 steps and stay there (0.9 of the smallest subnormal
 * rounds back to it); where the processor takes a microcode assist for a subnormal
 * operand (Intel), every step after that is slower. Prints the step's mean time over
 * blocks of steps, the CPU on every line. A parameter whose gradient stays zero is
 * what a dead unit or an expert that receives no rows gives a model in training.
 *   bench/steps [-k adam|adamw|momentum|nesterov] [-n STEPS] [-t THREADS] [MODEL]
 * MODEL: treelstm (default) or moe_lm, E=H=256 as generated. */
#include "cavs.h"
#include "../generated/moe_lm.h"
#include "../generated/treelstm.h"
#include "cpu_name.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  const char *kind = "adam";
  int steps = 2000, threads = 1, o;
  while ((o = getopt(argc, argv, "k:n:t:")) != -1) {
    if (o == 'k') kind = optarg;
    else if (o == 'n') steps = atoi(optarg);
    else if (o == 't') threads = atoi(optarg);
    else {
      fprintf(stderr, "usage: bench/steps [-k adam|adamw|momentum|nesterov] [-n STEPS] [-t THREADS] [MODEL]\n");
      return 1;
    }
  }
  const char *name = optind < argc ? argv[optind] : "treelstm";
  const cavs_desc *d = !strcmp(name, "moe_lm") ? &moe_lm_desc : !strcmp(name, "treelstm") ? &treelstm_desc : NULL;
  cavs_optim opt = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .momentum = 0.9};
  opt.kind = !strcmp(kind, "adam")       ? CAVS_ADAM
             : !strcmp(kind, "adamw")    ? CAVS_ADAMW
             : !strcmp(kind, "momentum") ? CAVS_MOMENTUM
             : !strcmp(kind, "nesterov") ? CAVS_NESTEROV
                                         : -1;
  if (!d || opt.kind < 0 || steps < 1 || threads < 1) {
    fprintf(stderr, "bench/steps: no model %s, or no optimizer %s, or a count below 1\n", name, kind);
    return 1;
  }
  if (opt.kind == CAVS_ADAMW) opt.weight_decay = 0.01;
  long dims[CAVS_MAX_DIMS];
  cavs_dims_default(d, dims);
  for (int k = 0; k < d->ndims; k++)
    if (dims[k] <= 0) dims[k] = 10000; /* a vocabulary's size, bound from data in training */
  char err[512], cpu[256];
  cavs_model_opts mo = {.threads = threads};
  cavs_model *m = cavs_model_new_opts(d, dims, &mo, err, sizeof err);
  if (!m) {
    fprintf(stderr, "bench/steps: %s\n", err);
    return 1;
  }
  cpu_name(cpu, sizeof cpu);
  size_t n = 0;
  float *g = cavs_model_grads_flat(m, &n);
  if (!g || cavs_model_reserve_optimizer(m, opt.kind)) {
    fprintf(stderr, "bench/steps: %s\n", cavs_model_error(m));
    return 1;
  }
  /* every gradient of the flat block (lookup tables' included: their rows are stepped
     only where a minibatch read them, so they take no part) */
  for (size_t i = 0; i < n; i++) g[i] = 1e-3f;
  printf("# bench/steps %s, %s, %zu values, %d thread(s); cpu: %s\n", name, kind, n, threads, cpu);
  printf("steps          ms a step\n");
  int block = steps < 100 ? steps : 100;
  double t0 = now();
  for (int s = 1; s <= steps; s++) {
    if (cavs_model_step(m, &opt)) {
      fprintf(stderr, "bench/steps: %s\n", cavs_model_error(m));
      return 1;
    }
    if (s % block == 0) {
      double t = now();
      printf("%5d-%-5d  %9.3f  [%s]\n", s - block + 1, s, 1e3 * (t - t0) / block, cpu);
      fflush(stdout);
      t0 = t;
    }
  }
  cavs_model_free(m);
  return 0;
}

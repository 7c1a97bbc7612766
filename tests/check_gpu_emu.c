/* check_gpu_emu.c: check_gpu's suite, whole, on the emulated device of tests/cuda_emu.h
 * (libcavs-emu), in `make check`: each model's CUDA code compiled by the host C++
 * compiler under that header (as check_cuda_emu loads it) in place of nvcc's object,
 * and `cavs train --device cuda` run by tests/cavs-emu. What check_gpu asserts is
 * check_cuda_emu's too; this runs check_gpu itself, so that a session lent a GPU, whose
 * time is short, does not find its check broken there (a model's text it cannot build,
 * a tolerance the emulator's exact arithmetic already misses). Skipped (77) in a checked
 * build, where check_cuda_emu repeats the comparisons. */
#include "cudatest.h"

/* load_model_for(file or text, prec, target) as check_gpu calls it: the cuda target's
   code for the emulator, by the model's name (a file of dsl-examples/, or the name its
   text declares) */
static const cavs_desc *emu_load(const char *vf, const char *prec, const char *target) {
  if (strcmp(target, "cuda")) return load_model_with(vf, prec, target, NULL);
  char name[64];
  size_t n = strlen(vf);
  bool file = n > 3 && !strcmp(vf + n - 3, ".vf");
  if (file) snprintf(name, sizeof name, "%.*s", (int)(n - 3), vf);
  else ck_assert_msg(sscanf(vf, "model %63[A-Za-z0-9_]", name) == 1, "no model's name in %s", vf);
  return load_host_cuda_with(name, file ? NULL : vf, prec, "cuda_emu.h");
}

#define load_model_for(vf, prec, target) emu_load(vf, prec, target)
#define main check_gpu_main
#include "check_gpu.c"
#undef main

int main(void) {
  if (tu_checked_build()) return 77;
  setenv("CAVS", tu_env("CAVS_EMU", "tests/cavs-emu"), 1);
  return check_gpu_main();
}

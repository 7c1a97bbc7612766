/* cuda_runtime.h for the emulated CUDA runtime of the tests (tests/cuda_emu.h): what
 * runtime/backend_cuda.cu includes, when tests/emu is first on the include path. */
#include "../cuda_emu.h"

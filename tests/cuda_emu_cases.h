/* cuda_emu_cases.h: the small CUDA programs of tests/cuda_emu_cases.cc, for the C of
 * check_cuda_emu. Those returning int return 1 (or 0 for emu_case_graph_update) when the
 * emulator answered as CUDA's documentation says; the void ones end in a fault. */
#ifndef CUDA_EMU_CASES_H
#define CUDA_EMU_CASES_H

#ifdef __cplusplus
extern "C" {
#endif

int emu_case_copy_kind(void);
int emu_case_copy_2d(void); /* cudaMemcpy2D: rows to their pitch, a too-narrow pitch, past the end */
int emu_case_gemm(double *c_out);
int emu_case_host_pointer_launch(void);
void emu_case_host_reads_device(void);
void emu_case_kernel_past_end(void);
void emu_case_kernel_after_free(void);
int emu_case_barriers(double *sum);
int emu_case_poison_until_sync(double *before, double *after);
int emu_case_graph_update(void);

#ifdef __cplusplus
}
#endif
#endif

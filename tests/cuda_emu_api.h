/* cuda_emu_api.h: what a test asks of the emulated CUDA device (tests/cuda_emu.cc), in
 * C: how its streams' work is ordered, what it counted, what it found wrong, what is
 * still allocated, and which call to fail on purpose. */
#ifndef CUDA_EMU_API_H
#define CUDA_EMU_API_H

#ifdef __cplusplus
extern "C" {
#endif

/* In what order queued work runs, when the host waits for it (a synchronization, a
 * synchronous copy). ISSUED: in the order it was issued, every stream's interleaved.
 * MAIN_FIRST and SIDE_FIRST: the ready work of the stream created first (the legacy
 * default stream before all) as far as its dependencies let it, or of the stream created
 * last: the two orders furthest apart that the events allow. */
enum cavs_emu_order { CAVS_EMU_ISSUED, CAVS_EMU_MAIN_FIRST, CAVS_EMU_SIDE_FIRST };
void cavs_emu_set_order(int order);

/* What the device was asked to do, counted since the last reset. */
typedef struct cavs_emu_counts {
  long launches;        /* kernels launched on a stream (not captured into a graph) */
  long graph_launches;  /* executable graphs launched */
  long graph_kernels;   /* kernels and products run as nodes of launched graphs */
  long blas_calls;      /* cuBLAS products issued to a stream (not captured) */
  long memsets;         /* cudaMemset* issued to a stream (not captured) */
  long bytes_htod, bytes_dtoh, bytes_dtod; /* by copies issued to a stream */
  long mallocs, frees;  /* cudaMalloc, cudaFree (of a pointer that is not NULL) */
  long host_mallocs, host_frees; /* cudaMallocHost, cudaFreeHost */
  long syncs;           /* host synchronizations: cudaDeviceSynchronize, cudaStreamSynchronize,
                           cudaEventSynchronize, and a cudaMemcpy (which waits for the device) */
  long copies;          /* synchronous copies between the host and the device (cudaMemcpy,
                           cudaMemcpy2D): what cavs_emu_fail_copy counts */
  long graph_kernel_nodes; /* the kernels among graph_kernels: what cavs_emu_fail_launch
                              counts beside launches */
} cavs_emu_counts;
void cavs_emu_counters(cavs_emu_counts *out, int reset);

/* With cavs_emu_log(1), each kernel launch, cuBLAS product, memset and copy issued to a
 * stream since the counters were last reset, in order (what a timing model needs: how
 * big each was). Off by default. */
enum { CAVS_EMU_OP_KERNEL, CAVS_EMU_OP_GEMM, CAVS_EMU_OP_MEMSET, CAVS_EMU_OP_COPY };
typedef struct cavs_emu_op {
  int kind;
  long a, b, c; /* a kernel: its threads; a product: m, n, k; a memset or copy: its bytes */
  const char *name; /* a kernel's, as its launch spells it ("topk_rows_k<float>"); else NULL */
} cavs_emu_op;
void cavs_emu_log(int on);
long cavs_emu_ops(const cavs_emu_op **ops);

/* Every misuse found since the last clear (a copy whose kind does not match its
 * pointers, host memory passed as device memory, a range past its allocation, ...),
 * one line each naming the call and its arguments; NULL when there was none. A fault
 * (a kernel, copy or host code touching memory it must not) ends the process with its
 * own message instead. */
const char *cavs_emu_errors(void);
void cavs_emu_clear_errors(void);
/* The slack of every live allocation (its bytes past the size asked for, up to the
 * allocation's 256-byte alignment) still as the emulator filled it: else a line in
 * the errors for each allocation written past its end. */
void cavs_emu_check_bounds(void);

/* Objects alive (device and pinned allocations, streams, events, cuBLAS handles,
 * graphs and executable graphs), and a line for each of them that is newer than
 * `since` (a value of cavs_emu_serial() taken earlier): what a model left behind. */
long cavs_emu_serial(void);
long cavs_emu_live(long since);
const char *cavs_emu_live_report(long since);

/* 1 when host code that touches device memory faults (everywhere but under valgrind,
 * which cannot follow the faults that open device memory to device work). */
int cavs_emu_host_faults(void);

/* Faults on purpose: the n-th cudaMalloc from now fails with cudaErrorMemoryAllocation,
 * the n-th kernel launch from now (or kernel node run by a launched graph: a kernel
 * captured into a graph counts each time the graph is launched, not when it is
 * captured) fails when it runs with cudaErrorIllegalAddress (a
 * sticky error, as a GPU's: what was queued is dropped, and the process's CUDA fails
 * from then on); the n-th synchronous copy between the host and the device (cudaMemcpy,
 * cudaMemcpy2D) from now fails with cudaErrorECCUncorrectable, sticky too (the device
 * lost in the middle of a copy: nothing is copied); 0 turns each off. */
void cavs_emu_fail_malloc(long n);
void cavs_emu_fail_launch(long n);
void cavs_emu_fail_copy(long n);

#ifdef __cplusplus
}
#endif
#endif

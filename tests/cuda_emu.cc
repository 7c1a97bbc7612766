/* cuda_emu.cc: an emulated CUDA device, runtime and cuBLAS for the tests, written from
 * NVIDIA's documentation of the calls cuda_emu.h declares, strict where a GPU is strict
 * (and where the documentation says the behaviour is not promised), so that
 * backend_cuda.cu and the CUDA target's kernels run on the CPU and their misuses of the
 * API show.
 *
 * Memory. Every cudaMalloc allocation is its own mapping: its bytes end against an
 * inaccessible page (the 256-byte alignment leaves at most 255 bytes between, filled
 * with a pattern that is checked), another sits before it, and the whole of it is
 * inaccessible to the host: device memory is readable only while the emulator runs
 * device work (a kernel, a copy, a product). A kernel, copy or product that reads past
 * an allocation, or anything that touches device memory from host code, faults, and
 * the fault handler names the allocation and the culprit before it aborts. New memory
 * is filled with NaNs (0xff bytes), so that a value read before it was written shows.
 * Freed memory stays mapped and inaccessible: a use after cudaFree faults too. Every
 * call checks its pointers: a copy whose kind does not match them, host memory given
 * as device memory (or the reverse), a range past its allocation, a pointer argument
 * of a launch that is not device memory, is an error recorded with the call and its
 * arguments (cavs_emu_errors) and returned as CUDA returns it.
 *
 * Order. Work issued to a stream is queued with what it must follow: the work before it
 * in its stream, the events it waits for, and the legacy default stream's implicit
 * synchronization (an operation on the legacy stream follows everything issued before
 * it on the blocking streams, and those follow the legacy stream's). It runs only when
 * the host waits for it (a synchronization, a synchronous copy), in the order the
 * emulator is told (cavs_emu_set_order): as issued, or one stream as far ahead of the
 * others as the dependencies allow. (Device memory is opened to the work and closed
 * again once a wait, not once an operation: the host cannot see the difference.) A
 * device-to-host copy into pinned memory leaves poison (NaNs) there until it runs; a
 * host-to-device copy from pinned memory that the host changes before the copy has run
 * is an error. cudaFree and cudaFreeHost do not synchronize (the documentation says they
 * may): freeing memory that queued work still uses is an error. A fault (an illegal
 * address) is sticky, as on a GPU: the context is lost, the work queued behind it is
 * dropped unrun, and every later call fails (cudaFree and cudaFreeHost still free, so
 * that a test sees what a model leaves).
 *
 * Capture and graphs. A stream being captured records nodes instead of queuing work,
 * streams joining through events recorded in it; calls that would synchronize, or use
 * the legacy stream, invalidate the capture (thread-local and global modes); a capture
 * ended with a stream not joined back fails. cudaGraphExecUpdate pairs nodes in the
 * order they were recorded and refuses what the documentation says it refuses (another
 * node count, type or dependency; a 2D memset whose shape changed; a copy whose memory
 * types changed). A launched graph's nodes are queued as work, in an order its edges
 * allow.
 *
 * Kernels. A grid runs block by block. A kernel whose threads share memory (a
 * __shared__ declaration, __syncthreads) runs each block's threads as fibers that meet
 * at every __syncthreads; a block whose threads do not all reach the same barrier is an
 * error. Other kernels call their threads one after another.
 *
 * cuBLAS. Column-major products with the documented checks of their arguments
 * (CUBLAS_STATUS_INVALID_VALUE for a negative size or a leading dimension below the
 * rows it spans), computed by a plain loop in double, the operands' extents checked
 * against their allocations.
 *
 * One host thread: the emulator does not lock. */
#include "cuda_emu.h"

#include <errno.h>
#include <execinfo.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define EMU_VALGRIND 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace {

enum { PAGE = 4096, ALIGN = 256, MAX_BLOCK = 1024, FIBER_STACK = 128 << 10 };
const unsigned char FILL = 0xff;  /* new memory: NaN as float and as double */
const unsigned char SLACK = 0xa5; /* the bytes of an allocation past its size */
const size_t MAX_ALLOC = (size_t)16 << 30;

/* ---- what went wrong ---- */

/* The emulator's state lives as long as the process (a device's does): every container
   is made once and never destroyed, so that nothing runs its destructor at exit while
   what it points to is still in use, and a leak checker sees everything it holds. */

std::string &errors = *new std::string;
long serial_now;
std::map<long, std::string> &live = *new std::map<long, std::string>; /* serial -> what it is */
std::vector<const void *> &handles_alive = *new std::vector<const void *>; /* events, graphs, executables */
bool alive(const void *h) { return h && std::find(handles_alive.begin(), handles_alive.end(), h) != handles_alive.end(); }
void forget(const void *h) { handles_alive.erase(std::find(handles_alive.begin(), handles_alive.end(), h)); }

std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char *f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

void violation(const std::string &what) {
  std::string line = "cuda emulator: " + what + "\n";
  errors += line;
  (void)!write(2, line.data(), line.size());
  if (getenv("CAVS_EMU_ABORT")) abort();
}

[[noreturn]] void fatal(const char *what) {
  (void)!write(2, "cuda emulator: ", 15);
  (void)!write(2, what, strlen(what));
  (void)!write(2, "\n", 1);
  void *bt[64];
  int n = backtrace(bt, 64);
  backtrace_symbols_fd(bt, n, 2);
  signal(SIGABRT, SIG_DFL);
  abort();
}

/* the last error (cudaGetLastError) and the sticky one, after which every call fails */
cudaError_t last_error = cudaSuccess, sticky = cudaSuccess;
cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess && !sticky) last_error = e;
  return e;
}

cavs_emu_counts counts;
/* with cavs_emu_log: what was issued to a stream since the counters' reset */
bool logging;
std::vector<cavs_emu_op> &oplog = *new std::vector<cavs_emu_op>;
void log_op(int kind, long a, long b = 0, long c = 0, const char *name = NULL) {
  if (logging) oplog.push_back({kind, a, b, c, name});
}
int order = CAVS_EMU_ISSUED;
long fail_malloc_at, fail_launch_at, fail_copy_at;

/* ---- memory ---- */

struct Alloc {
  long id;
  bool device, live;
  char *map;     /* the mapping (device: guard page, data pages, guard page) */
  size_t maplen;
  char *data;    /* device: the data pages */
  size_t datalen;
  char *base;    /* what the caller got */
  size_t size;   /* what it asked for */
};
std::map<uintptr_t, Alloc *> &allocs = *new std::map<uintptr_t, Alloc *>; /* by their mappings' starts */
/* Device work runs (device_open): an allocation it touches is opened to it then, by the
   fault handler (on_fault), and closed when the work stops; host code touching one
   faults for good. Under valgrind, which cannot follow such faults, device memory stays
   open: its guard pages alone catch what goes past an allocation. */
bool device_open, never_close;
enum { MAX_OPEN = 1 << 16 };
Alloc *opened[MAX_OPEN];
int nopened;

Alloc *alloc_at(const void *p) {
  auto it = allocs.upper_bound((uintptr_t)p);
  if (it == allocs.begin()) return nullptr;
  --it;
  Alloc *a = it->second;
  return (const char *)p < a->map + a->maplen ? a : nullptr;
}

void protect(Alloc *a, int prot) {
  if (never_close) return;
  if (a->device && a->live && mprotect(a->data, a->datalen, prot)) fatal("mprotect failed");
}
void open_device() { device_open = true; }
void close_device() {
  if (!device_open) return;
  for (int i = 0; i < nopened; i++) protect(opened[i], PROT_NONE);
  nopened = 0;
  device_open = false;
}

std::string describe(const Alloc *a) {
  return fmt("allocation #%ld (%zu bytes at %p, %s%s)", a->id, a->size, (void *)a->base,
             a->device ? "cudaMalloc" : "cudaMallocHost", a->live ? "" : a->device ? ", freed by cudaFree" : ", freed by cudaFreeHost");
}

/* Why [p, p + n) is not device memory a copy, kernel or product may use; "" when it is. */
std::string not_device(const void *p, size_t n) {
  if (!p) return "NULL";
  Alloc *a = alloc_at(p);
  if (!a) return "host memory";
  if (!a->device) return a->live ? "pinned host memory from cudaMallocHost (" + describe(a) + ")" : describe(a);
  if (!a->live) return "freed device memory: " + describe(a);
  const char *c = (const char *)p;
  if (c < a->base) return fmt("%zu bytes before the start of ", (size_t)(a->base - c)) + describe(a);
  size_t off = (size_t)(c - a->base);
  if (off >= a->size || n > a->size - off)
    return fmt("bytes [%zu, %zu) of ", off, off + n) + describe(a) + ", past its end";
  return "";
}
bool is_device(const void *p) {
  Alloc *a = alloc_at(p);
  return a && a->device;
}
/* host memory a copy may use: not device memory, live or freed, nor freed pinned memory */
std::string not_host(const void *p) {
  if (!p) return "NULL";
  Alloc *a = alloc_at(p);
  if (!a || (!a->device && a->live)) return "";
  return a->device ? "device memory: " + describe(a) : describe(a);
}

void fill_slack(Alloc *a) {
  memset(a->data, SLACK, (size_t)(a->base - a->data));
  memset(a->base + a->size, SLACK, (size_t)(a->data + a->datalen - a->base - a->size));
}
/* with device memory open */
void check_slack(Alloc *a, const char *when) {
  for (char *c = a->data; c < a->data + a->datalen; c++) {
    if (c == a->base) c += a->size;
    if (c < a->data + a->datalen && (unsigned char)*c != SLACK) {
      violation(fmt("%s: byte %ld of ", when, (long)(c - a->base)) + describe(a) +
                " was written: something wrote outside the allocation");
      return;
    }
  }
}

/* ---- work, streams, events ---- */

struct Range {
  const char *lo, *hi;
};
struct Op {
  long seq;
  int ord; /* its stream's: the legacy stream 0, the others in order of creation */
  std::vector<std::shared_ptr<Op>> deps;
  std::function<void()> run; /* empty: a marker (an event, a wait, a graph's end) */
  std::string what;
  std::vector<Range> uses;   /* the memory it reads or writes */
  bool done = false;
};
using OpP = std::shared_ptr<Op>;
std::vector<OpP> &pending = *new std::vector<OpP>; /* in the order issued */
long op_seq;
const Op *running;        /* the device work that runs now */
long run_block = -1, run_thread = -1;

struct Capture;
} // namespace

struct CUstream_st {
  long serial;
  int ord;
  OpP last;
  Capture *cap;
  std::vector<int> front; /* in a capture: the nodes its next node follows */
};
struct CUevent_st {
  long serial;
  OpP op;
  Capture *cap;
  std::vector<int> nodes;
};

namespace {
CUstream_st legacy_stream = {0, 0, nullptr, nullptr, {}};
std::vector<CUstream_st *> &streams = *new std::vector<CUstream_st *>; /* cudaStreamCreate's */
int stream_ords;

long new_serial(const std::string &what) {
  live[++serial_now] = what;
  return serial_now;
}

CUstream_st *stream_of(cudaStream_t s) { return s ? s : &legacy_stream; }
bool valid_stream(cudaStream_t s) { return !s || std::find(streams.begin(), streams.end(), s) != streams.end(); }

bool uses_overlap(const Op &o, const char *lo, const char *hi) {
  for (const Range &r : o.uses)
    if (r.lo < hi && lo < r.hi) return true;
  return false;
}

/* Runs queued work until every op of `targets` has run (all of it, with none): the ready
   op of the preferred stream first (enum cavs_emu_order), in the order issued within a
   stream. */
void run_until(const std::vector<OpP> &targets, bool all) {
  std::vector<Op *> need;
  if (all) {
    for (auto &o : pending) need.push_back(o.get());
  } else {
    std::vector<Op *> stack;
    for (auto &t : targets)
      if (t && !t->done) stack.push_back(t.get());
    std::vector<Op *> seen;
    while (!stack.empty()) {
      Op *o = stack.back();
      stack.pop_back();
      if (o->done || std::find(seen.begin(), seen.end(), o) != seen.end()) continue;
      seen.push_back(o);
      need.push_back(o);
      for (auto &d : o->deps) stack.push_back(d.get());
    }
    std::sort(need.begin(), need.end(), [](Op *a, Op *b) { return a->seq < b->seq; });
  }
  if (need.empty()) return;
  bool was_open = device_open;
  open_device();
  for (size_t left = need.size(); left; left--) {
    Op *best = nullptr;
    for (Op *o : need) {
      if (o->done) continue;
      bool ready = true;
      for (auto &d : o->deps) ready &= d->done;
      if (!ready) continue;
      bool better = !best || (order == CAVS_EMU_MAIN_FIRST && o->ord < best->ord) ||
                    (order == CAVS_EMU_SIDE_FIRST && o->ord > best->ord);
      if (better) best = o;
      if (order == CAVS_EMU_ISSUED) break;
    }
    if (!best) fatal("queued work waits for itself (a cycle of events)");
    running = best;
    if (best->run) best->run();
    running = nullptr;
    best->done = true;
    best->deps.clear();
    best->run = nullptr;
    if (sticky) break; /* a fault: the context is lost, and with it the rest of the queue */
  }
  if (!was_open) close_device();
  if (sticky) pending.clear();
  pending.erase(std::remove_if(pending.begin(), pending.end(), [](const OpP &o) { return o->done; }), pending.end());
}
void run_all() { run_until({}, true); }

/* ---- capture ---- */

enum { N_KERNEL, N_BLAS, N_MEMSET, N_MEMCPY, N_EMPTY };
struct Node {
  int kind;
  std::vector<int> deps;
  std::function<void()> run;
  std::string what;
  int ord;
  std::vector<Range> uses;
  /* what cudaGraphExecUpdate compares */
  const void *fn;
  bool memset2d;
  size_t pitch, width, height;
  int src_device, dst_device;
};
} // namespace

struct CUgraph_st {
  long serial;
  std::vector<Node> nodes;
};
struct CUgraphExec_st {
  long serial;
  std::vector<Node> nodes;
};

namespace {
struct Capture {
  CUgraph_st *g;
  CUstream_st *origin;
  int mode;
  bool invalid;
  std::vector<CUstream_st *> joined;
  std::vector<CUevent_st *> events;
};
Capture *capture; /* the one capture in progress */

/* A call that may synchronize, or allocates outside the stream order, while a capture
   is in progress in a mode that forbids it: the capture is invalidated */
bool unsafe_in_capture(const char *call) {
  if (!capture || capture->mode == cudaStreamCaptureModeRelaxed) return false;
  if (!capture->invalid)
    violation(fmt("%s during a stream capture: a call that may synchronize or allocate invalidates the capture", call));
  capture->invalid = true;
  return true;
}

struct Work {
  int kind;
  std::function<void()> run;
  std::string what;
  std::vector<Range> uses;
  const void *fn = nullptr;
  bool memset2d = false;
  size_t pitch = 0, width = 0, height = 0;
  int src_device = 0, dst_device = 0;
};

/* What `s` must follow besides its own last op: the legacy stream's implicit
   synchronization with the blocking streams. */
void implicit_deps(CUstream_st *s, std::vector<OpP> &deps) {
  if (s->last && !s->last->done) deps.push_back(s->last);
  if (s == &legacy_stream) {
    for (CUstream_st *b : streams)
      if (b->last && !b->last->done) deps.push_back(b->last);
  } else if (legacy_stream.last && !legacy_stream.last->done) {
    deps.push_back(legacy_stream.last);
  }
}

OpP queue(CUstream_st *s, std::vector<OpP> deps, Work w) {
  auto o = std::make_shared<Op>();
  o->seq = ++op_seq;
  o->ord = s->ord;
  o->deps = std::move(deps);
  o->run = std::move(w.run);
  o->what = std::move(w.what);
  o->uses = std::move(w.uses);
  pending.push_back(o);
  s->last = o;
  return o;
}

/* Work for stream s: captured into its capture, or queued. */
cudaError_t issue(CUstream_st *s, Work w, OpP *out = nullptr) {
  if (s->cap) {
    if (s->cap->invalid) return fail(cudaErrorStreamCaptureInvalidated);
    Node n;
    n.kind = w.kind;
    n.deps = s->front;
    n.run = std::move(w.run);
    n.what = std::move(w.what);
    n.ord = s->ord;
    n.uses = std::move(w.uses);
    n.fn = w.fn;
    n.memset2d = w.memset2d;
    n.pitch = w.pitch, n.width = w.width, n.height = w.height;
    n.src_device = w.src_device, n.dst_device = w.dst_device;
    s->cap->g->nodes.push_back(std::move(n));
    s->front = {(int)s->cap->g->nodes.size() - 1};
    return cudaSuccess;
  }
  if (s == &legacy_stream && capture && capture->mode != cudaStreamCaptureModeRelaxed) {
    if (!capture->invalid)
      violation(fmt("%s on the legacy default stream during a stream capture: it synchronizes with the captured "
                    "stream, which invalidates the capture",
                    w.what.c_str()));
    capture->invalid = true;
    return fail(cudaErrorStreamCaptureImplicit);
  }
  std::vector<OpP> deps;
  implicit_deps(s, deps);
  OpP o = queue(s, std::move(deps), std::move(w));
  if (out) *out = o;
  return cudaSuccess;
}

/* a marker in s's order (an event's record, a wait): no work */
OpP marker(CUstream_st *s, std::vector<OpP> extra, const char *what) {
  std::vector<OpP> deps;
  implicit_deps(s, deps);
  for (auto &e : extra)
    if (e && !e->done) deps.push_back(e);
  Work w;
  w.kind = N_EMPTY;
  w.what = what;
  return queue(s, std::move(deps), std::move(w));
}

/* ---- kernels ---- */

struct Kernel {
  std::string name;
  bool seen, shares, syncs;
};
std::map<const void *, Kernel> &kernels = *new std::map<const void *, Kernel>;
Kernel *kernel_now;

/* fibers: the threads of a block that share memory */
enum { F_RUN, F_BARRIER, F_DONE };
struct Fiber {
  void *sp;
  char *stack;
  int state;
  void *fake;
#if !defined(__x86_64__)
  ucontext_t uc;
#endif
};
Fiber *fibers;
int nfibers, fiber_now = -1;
void *main_sp;
const std::function<void()> *fiber_body;
#ifdef EMU_ASAN
const void *main_bottom;
size_t main_size;
#endif
#if !defined(__x86_64__)
ucontext_t main_uc;
#endif
} // namespace

#if defined(__x86_64__)
/* Saves the callee-saved registers, the SSE and x87 control words and the stack pointer
   at *save, and continues where `to` was saved (System V AMD64). A new fiber's stack is
   made to look saved (init_fiber): its return address is emu_fiber_start, which calls
   the function in r13 with the argument in r12. */
extern "C" void cavs_emu_switch(void **save, void *to);
extern "C" void cavs_emu_fiber_start(void);
asm(R"(
	.text
	.globl cavs_emu_switch
	.type cavs_emu_switch, @function
cavs_emu_switch:
	pushq %rbp
	pushq %rbx
	pushq %r12
	pushq %r13
	pushq %r14
	pushq %r15
	subq $8, %rsp
	stmxcsr (%rsp)
	fnstcw 4(%rsp)
	movq %rsp, (%rdi)
	movq %rsi, %rsp
	ldmxcsr (%rsp)
	fldcw 4(%rsp)
	addq $8, %rsp
	popq %r15
	popq %r14
	popq %r13
	popq %r12
	popq %rbx
	popq %rbp
	ret
	.size cavs_emu_switch, .-cavs_emu_switch
	.globl cavs_emu_fiber_start
	.type cavs_emu_fiber_start, @function
cavs_emu_fiber_start:
	movq %r12, %rdi
	callq *%r13
	ud2
	.size cavs_emu_fiber_start, .-cavs_emu_fiber_start
)");
#endif

namespace {
void fiber_main(void *);

void to_main(bool dying) {
  Fiber &f = fibers[fiber_now];
#ifdef EMU_ASAN
  __sanitizer_start_switch_fiber(dying ? nullptr : &f.fake, main_bottom, main_size);
#endif
#if defined(__x86_64__)
  cavs_emu_switch(&f.sp, main_sp);
#else
  swapcontext(&f.uc, &main_uc);
#endif
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(f.fake, &main_bottom, &main_size);
#endif
}

void to_fiber(int t) {
  fiber_now = t;
  threadIdx = {(unsigned)t, 0, 0};
  run_thread = t;
#ifdef EMU_ASAN
  void *fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, fibers[t].stack, FIBER_STACK);
#endif
#if defined(__x86_64__)
  cavs_emu_switch(&main_sp, fibers[t].sp);
#else
  swapcontext(&main_uc, &fibers[t].uc);
#endif
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  fiber_now = -1;
}

void fiber_main(void *) {
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &main_bottom, &main_size);
#endif
  (*fiber_body)();
  fibers[fiber_now].state = F_DONE;
  to_main(true);
  fatal("a finished fiber was resumed");
}

#if !defined(__x86_64__)
void fiber_main_uc(void) { fiber_main(nullptr); }
#endif

void init_fiber(Fiber &f) {
#ifdef EMU_ASAN
  __asan_unpoison_memory_region(f.stack, FIBER_STACK);
#endif
  f.state = F_RUN;
  f.fake = nullptr;
#if defined(__x86_64__)
  uintptr_t top = ((uintptr_t)f.stack + FIBER_STACK) & ~(uintptr_t)15;
  void **sp = (void **)(top - 16);
  *--sp = (void *)cavs_emu_fiber_start; /* after its ret, rsp is 16-byte aligned */
  *--sp = nullptr;                      /* rbp */
  *--sp = nullptr;                      /* rbx */
  *--sp = nullptr;                      /* r12: the argument */
  *--sp = (void *)fiber_main;           /* r13 */
  *--sp = nullptr;                      /* r14 */
  *--sp = nullptr;                      /* r15 */
  uint32_t mxcsr;
  uint16_t fpucw;
  __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
  __asm__ volatile("fnstcw %0" : "=m"(fpucw));
  char csr[8] = {0};
  memcpy(csr, &mxcsr, 4);
  memcpy(csr + 4, &fpucw, 2);
  memcpy(--sp, csr, sizeof csr);
  f.sp = sp;
#else
  getcontext(&f.uc);
  f.uc.uc_stack.ss_sp = f.stack;
  f.uc.uc_stack.ss_size = FIBER_STACK;
  f.uc.uc_link = nullptr;
  makecontext(&f.uc, fiber_main_uc, 0);
#endif
}

void ensure_fibers(int n) {
  if (!fibers) fibers = (Fiber *)calloc(MAX_BLOCK, sizeof *fibers);
  for (; nfibers < n; nfibers++) {
    char *m = (char *)mmap(nullptr, FIBER_STACK + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m, PAGE, PROT_NONE)) fatal("no memory for a fiber's stack");
    fibers[nfibers].stack = m + PAGE;
#ifdef EMU_VALGRIND
    VALGRIND_STACK_REGISTER(m + PAGE, m + PAGE + FIBER_STACK);
#endif
  }
}

void run_block_fibers(unsigned block, const std::function<void()> &body) {
  ensure_fibers((int)block);
  fiber_body = &body;
  for (unsigned t = 0; t < block; t++) init_fiber(fibers[t]);
  for (long barrier = 0;; barrier++) {
    int waiting = 0, ended = 0;
    for (unsigned t = 0; t < block; t++) {
      if (fibers[t].state == F_DONE) continue;
      fibers[t].state = F_RUN;
      to_fiber((int)t);
      if (fibers[t].state == F_BARRIER) waiting++;
      else ended++;
    }
    if (!waiting) break;
    if (ended)
      violation(fmt("%s, block %ld: %d threads reached __syncthreads number %ld and %d ended without it: a barrier "
                    "must be reached by every thread of the block",
                    running ? running->what.c_str() : "a kernel", run_block, waiting, barrier + 1, ended));
  }
}

void run_kernel(Kernel *k, unsigned long grid, unsigned block, const std::function<void()> &body, bool fault) {
  if (fault) { /* cavs_emu_fail_launch: the kernel faults, as one reading a bad address */
    sticky = last_error = cudaErrorIllegalAddress;
    return;
  }
  kernel_now = k;
  gridDim = {(unsigned)grid, 1, 1};
  blockDim = {block, 1, 1};
  bool together = !k->seen || k->shares || k->syncs;
  for (unsigned long b = 0; b < grid; b++) {
    blockIdx = {(unsigned)b, 0, 0};
    run_block = (long)b;
    if (together) {
      run_block_fibers(block, body);
    } else {
      for (unsigned t = 0; t < block; t++) {
        threadIdx = {t, 0, 0};
        run_thread = t;
        body();
      }
    }
  }
  k->seen = true;
  kernel_now = nullptr;
  run_block = run_thread = -1;
}

/* ---- faults ---- */

struct sigaction old_segv, old_bus;

void on_fault(int sig, siginfo_t *si, void *ctx) {
  const char *p = (const char *)si->si_addr;
  Alloc *a = alloc_at(p);
  if (a && a->device && a->live && device_open && p >= a->data && p < a->data + a->datalen && nopened < MAX_OPEN &&
      !mprotect(a->data, a->datalen, PROT_READ | PROT_WRITE)) { /* device work's: open it, and go on */
    opened[nopened++] = a;
    return;
  }
  if (!a) { /* not the emulator's: whoever handled it before */
    struct sigaction *old = sig == SIGSEGV ? &old_segv : &old_bus;
    sigaction(sig, old, nullptr);
    return;
  }
  std::string who = running ? running->what : "host code (not device work: device memory is the device's)";
  if (running && run_block >= 0) who += fmt(", block %ld thread %ld", run_block, run_thread);
  std::string where;
  if (!a->live) where = "freed memory: " + describe(a);
  else if (p < a->base) where = fmt("%zu bytes before the start of ", (size_t)(a->base - p)) + describe(a);
  else if (p >= a->base + a->size) where = fmt("byte %zu, past the end of ", (size_t)(p - a->base)) + describe(a);
  else where = fmt("byte %zu of ", (size_t)(p - a->base)) + describe(a);
  fatal(fmt("%s touched %p: %s", who.c_str(), (const void *)p, where.c_str()).c_str());
}

struct Init {
  Init() {
#ifdef EMU_VALGRIND
    never_close = RUNNING_ON_VALGRIND;
#endif
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
  }
} init;

/* ---- copies ---- */

const char *kind_name(int k) {
  static const char *const names[] = {"cudaMemcpyHostToHost", "cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost",
                                      "cudaMemcpyDeviceToDevice", "cudaMemcpyDefault"};
  return k >= 0 && k <= 4 ? names[k] : "an unknown cudaMemcpyKind";
}

/* A copy of `height` rows of `width` bytes, their starts `spitch` apart in the source and
   `dpitch` in the destination (cudaMemcpy2D, cudaMemcpy2DAsync); the 1D copies are one
   row. */
cudaError_t copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                   cudaMemcpyKind kind, cudaStream_t stream, bool async, const std::string &call) {
  if (sticky) return sticky;
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (!async && unsafe_in_capture(height > 1 ? "cudaMemcpy2D" : "cudaMemcpy")) return fail(cudaErrorStreamCaptureUnsupported);
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    violation(call + ": not a cudaMemcpyKind");
    return fail(cudaErrorInvalidMemcpyDirection);
  }
  if (height > 1 && (width > dpitch || width > spitch)) { /* as the runtime: a row must fit its pitch */
    violation(call + ": the width is more than a pitch");
    return fail(cudaErrorInvalidPitchValue);
  }
  if (width == 0 || height == 0) return cudaSuccess;
  if (!async && kind != cudaMemcpyHostToHost) counts.copies++;
  if (!async && kind != cudaMemcpyHostToHost && fail_copy_at > 0 && --fail_copy_at == 0) {
    run_all(); /* what was queued before it ran; the device is lost now */
    return sticky = last_error = cudaErrorECCUncorrectable;
  }
  size_t n = width * height, dext = (height - 1) * dpitch + width, sext = (height - 1) * spitch + width;
  bool ddev = is_device(dst), sdev = is_device(src);
  if (kind == cudaMemcpyDefault) kind = (cudaMemcpyKind)(sdev ? ddev ? 3 : 2 : ddev ? 1 : 0);
  bool want_d = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  bool want_s = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  std::string why_d = want_d ? not_device(dst, dext) : not_host(dst), why_s = want_s ? not_device(src, sext) : not_host(src);
  if (!why_d.empty() || !why_s.empty()) {
    violation(call + ": " + (why_d.empty() ? "" : "the destination is " + why_d) +
              (!why_d.empty() && !why_s.empty() ? "; " : "") + (why_s.empty() ? "" : "the source is " + why_s));
    return fail(cudaErrorInvalidValue);
  }
  /* the rows, from s to d */
  auto rows = [dpitch, spitch, width, height](char *d, const char *s) {
    for (size_t r = 0; r < height; r++) memmove(d + r * dpitch, s + r * spitch, width);
  };
  if (kind == cudaMemcpyHostToHost) { /* no device work, but in stream order */
    if (!async) run_all();
    rows((char *)dst, (const char *)src);
    return cudaSuccess;
  }
  Alloc *dh = want_d ? nullptr : alloc_at(dst), *sh = want_s ? nullptr : alloc_at(src);
  bool pinned_src = sh && !sh->device, pinned_dst = dh && !dh->device;
  Work w;
  w.kind = N_MEMCPY;
  w.what = call;
  w.src_device = want_s, w.dst_device = want_d;
  if (want_d) w.uses.push_back({(const char *)dst, (const char *)dst + dext});
  if (want_s) w.uses.push_back({(const char *)src, (const char *)src + sext});
  if (!want_s) { /* from the host */
    if (async && pinned_src) {
      /* read when it runs: the host must leave the bytes alone until then */
      auto seen = std::make_shared<std::vector<char>>(n);
      for (size_t r = 0; r < height; r++) memcpy(seen->data() + r * width, (const char *)src + r * spitch, width);
      std::string what = call;
      w.uses.push_back({(const char *)src, (const char *)src + sext});
      w.run = [dst, src, seen, what, dpitch, spitch, width, height] {
        for (size_t r = 0; r < height; r++)
          if (memcmp((const char *)src + r * spitch, seen->data() + r * width, width))
            violation(what + ": the host changed the pinned source before the copy ran: it must wait for the copy "
                             "(an event, a synchronization) before writing there again");
        for (size_t r = 0; r < height; r++) memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
      };
    } else { /* pageable memory is staged as the call returns: the rows, packed */
      auto staged = std::make_shared<std::vector<char>>(n);
      for (size_t r = 0; r < height; r++) memcpy(staged->data() + r * width, (const char *)src + r * spitch, width);
      w.run = [dst, staged, dpitch, width, height] {
        for (size_t r = 0; r < height; r++) memcpy((char *)dst + r * dpitch, staged->data() + r * width, width);
      };
    }
    counts.bytes_htod += (long)n;
    if (!stream_of(stream)->cap) log_op(CAVS_EMU_OP_COPY, (long)n);
  } else {
    if (!want_d && async && pinned_dst) {
      /* until it runs, the host reads poison there */
      for (size_t r = 0; r < height; r++) memset((char *)dst + r * dpitch, FILL, width);
      w.uses.push_back({(const char *)dst, (const char *)dst + dext});
    }
    w.run = [dst, src, rows] { rows((char *)dst, (const char *)src); };
    if (want_d) counts.bytes_dtod += (long)n;
    else counts.bytes_dtoh += (long)n;
    if (!stream_of(stream)->cap) log_op(CAVS_EMU_OP_COPY, (long)n);
  }
  CUstream_st *s = stream_of(stream);
  OpP op;
  cudaError_t e = issue(s, std::move(w), &op);
  if (e) return e;
  /* cudaMemcpy returns when the copy is done; a copy to pageable host memory too */
  bool wait = !async || (!want_d && !pinned_dst);
  if (wait && !s->cap) {
    counts.syncs++;
    run_until({op}, false);
  }
  return cudaSuccess;
}

cudaError_t copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t stream, bool async) {
  std::string call =
      async ? fmt("cudaMemcpyAsync(%p, %p, %zu, %s, stream %p)", dst, src, n, kind_name(kind), (void *)stream)
            : fmt("cudaMemcpy(%p, %p, %zu, %s)", dst, src, n, kind_name(kind));
  return copy2d(dst, n, src, n, n, 1, kind, stream, async, call);
}

cudaError_t memset_work(void *p, int value, size_t pitch, size_t width, size_t height, cudaStream_t stream,
                        const std::string &call, bool twod) {
  if (sticky) return sticky;
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (width == 0 || height == 0) return cudaSuccess;
  if (twod && height > 1 && width > pitch) {
    violation(call + ": the width is more than the pitch");
    return fail(cudaErrorInvalidValue);
  }
  size_t extent = (height - 1) * pitch + width;
  std::string why = not_device(p, extent);
  if (!why.empty()) {
    violation(call + ": the memory is " + why);
    return fail(cudaErrorInvalidValue);
  }
  Work w;
  w.kind = N_MEMSET;
  w.what = call;
  w.uses.push_back({(const char *)p, (const char *)p + extent});
  w.memset2d = twod && height > 1;
  w.pitch = pitch, w.width = width, w.height = height;
  w.run = [p, value, pitch, width, height] {
    for (size_t r = 0; r < height; r++) memset((char *)p + r * pitch, value, width);
  };
  CUstream_st *s = stream_of(stream);
  if (!s->cap) counts.memsets++, log_op(CAVS_EMU_OP_MEMSET, (long)(width * height));
  return issue(s, std::move(w));
}

/* ---- cuBLAS ---- */
} // namespace

struct cublasContext {
  long serial;
  cudaStream_t stream;
};

namespace {
std::vector<cublasContext *> &handles = *new std::vector<cublasContext *>;

const char *op_name(int o) { return o == CUBLAS_OP_N ? "N" : o == CUBLAS_OP_T ? "T" : o == CUBLAS_OP_C ? "C" : "?"; }

template <typename T>
cublasStatus_t gemm(const char *name, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                    const T *alpha, const T *A, int lda, const T *B, int ldb, const T *beta, T *C, int ldc) {
  std::string call = fmt("%s(handle %p, %s, %s, m %d, n %d, k %d, alpha %p, A %p, lda %d, B %p, ldb %d, beta %p, C "
                         "%p, ldc %d)",
                         name, (void *)h, op_name(ta), op_name(tb), m, n, k, (const void *)alpha, (const void *)A, lda,
                         (const void *)B, ldb, (const void *)beta, (const void *)C, ldc);
  if (!h || std::find(handles.begin(), handles.end(), h) == handles.end()) {
    violation(call + ": not a handle cublasCreate made");
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  auto valid_op = [](int o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T || o == CUBLAS_OP_C; };
  int arows = ta == CUBLAS_OP_N ? m : k, acols = ta == CUBLAS_OP_N ? k : m;
  int brows = tb == CUBLAS_OP_N ? k : n, bcols = tb == CUBLAS_OP_N ? n : k;
  std::string bad;
  if (!valid_op(ta) || !valid_op(tb)) bad = "transa or transb is not a cublasOperation_t";
  else if (m < 0 || n < 0 || k < 0) bad = "m, n or k is negative";
  else if (lda < std::max(1, arows)) bad = fmt("lda %d is less than max(1, %d), the rows of A", lda, arows);
  else if (ldb < std::max(1, brows)) bad = fmt("ldb %d is less than max(1, %d), the rows of B", ldb, brows);
  else if (ldc < std::max(1, m)) bad = fmt("ldc %d is less than max(1, m)", ldc);
  else if (!alpha || !beta) bad = "alpha or beta is NULL";
  if (!bad.empty()) {
    violation(call + ": CUBLAS_STATUS_INVALID_VALUE: " + bad);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (sticky) return CUBLAS_STATUS_EXECUTION_FAILED;
  /* the pointer mode is the host's: alpha and beta are read now, from host memory */
  if (is_device(alpha) || is_device(beta)) {
    violation(call + ": alpha or beta is device memory, and the handle's pointer mode is CUBLAS_POINTER_MODE_HOST");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  double al = (double)*alpha, be = (double)*beta;
  CUstream_st *s = stream_of(h->stream);
  if (!s->cap) counts.blas_calls++, log_op(CAVS_EMU_OP_GEMM, m, n, k);
  if (m == 0 || n == 0 || ((al == 0 || k == 0) && be == 1)) return CUBLAS_STATUS_SUCCESS;
  bool reads_ab = al != 0 && k > 0;
  auto extent = [](int rows, int cols, int ld) { return ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * sizeof(T); };
  std::string why;
  if (reads_ab && !(why = not_device(A, extent(arows, acols, lda))).empty()) why = "A is " + why;
  else if (reads_ab && !(why = not_device(B, extent(brows, bcols, ldb))).empty()) why = "B is " + why;
  else if (!(why = not_device(C, extent(m, n, ldc))).empty()) why = "C is " + why;
  if (!why.empty()) { /* the product would read or write where it must not: on a GPU, a fault */
    violation(call + ": " + why);
    sticky = last_error = cudaErrorIllegalAddress;
    pending.clear();
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  Work w;
  w.kind = N_BLAS;
  w.what = call;
  w.fn = (const void *)&gemm<T>;
  if (reads_ab) {
    w.uses.push_back({(const char *)A, (const char *)A + extent(arows, acols, lda)});
    w.uses.push_back({(const char *)B, (const char *)B + extent(brows, bcols, ldb)});
  }
  w.uses.push_back({(const char *)C, (const char *)C + extent(m, n, ldc)});
  /* C = alpha op(A) op(B) + beta C, column-major: element (i, j) of X at X[i + j ld];
     beta 0 does not read C (a NaN there is overwritten) */
  w.run = [=] {
    for (int j = 0; j < n; j++)
      for (int i = 0; i < m; i++) {
        double sum = 0;
        if (reads_ab)
          for (int p = 0; p < k; p++) {
            double a = ta == CUBLAS_OP_N ? (double)A[i + (size_t)p * lda] : (double)A[p + (size_t)i * lda];
            double b = tb == CUBLAS_OP_N ? (double)B[p + (size_t)j * ldb] : (double)B[j + (size_t)p * ldb];
            sum += a * b;
          }
        double r = al * sum;
        if (be != 0) r += be * (double)C[i + (size_t)j * ldc];
        C[i + (size_t)j * ldc] = (T)r;
      }
  };
  cudaError_t e = issue(s, std::move(w));
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

} // namespace

/* ---- the device side ---- */

cavs_emu_shared::cavs_emu_shared() {
  if (kernel_now) kernel_now->shares = true;
}

void __syncthreads(void) {
  if (!kernel_now) fatal("__syncthreads outside a kernel");
  kernel_now->syncs = true;
  if (fiber_now < 0) {
    if (blockDim.x == 1) return;
    fatal(fmt("%s called __syncthreads, which it did not in its first launch: the emulator ran its threads one "
              "after another (declare its __shared__ memory before any return, or run the kernel once first)",
              kernel_now->name.c_str())
              .c_str());
  }
  fibers[fiber_now].state = F_BARRIER;
  to_main(false);
}

void cavs_emu::launch(const char *name, const char *file, int line, const void *fn, unsigned long grid, unsigned block,
                      cudaStream_t stream, std::function<void()> body, const void *const *ptrs, int nptrs) {
  std::string what = fmt("kernel %s (%s:%d) <<<%lu, %u>>>", name, file, line, grid, block);
  if (sticky) return;
  if (!valid_stream(stream)) {
    violation(what + ": not a stream");
    fail(cudaErrorInvalidResourceHandle);
    return;
  }
  if (grid == 0 || grid > 0x7fffffffUL || block == 0 || block > MAX_BLOCK) {
    fail(cudaErrorInvalidConfiguration);
    return;
  }
  Work w;
  w.kind = N_KERNEL;
  w.fn = fn;
  for (int i = 0; i < nptrs; i++) {
    if (!ptrs[i]) continue;
    std::string why = not_device(ptrs[i], 1);
    if (!why.empty()) { /* on a GPU the kernel faults when it reads it */
      violation(fmt("%s: pointer argument %d (%p) is ", what.c_str(), i + 1, ptrs[i]) + why);
      sticky = last_error = cudaErrorIllegalAddress;
      pending.clear();
      return;
    }
    Alloc *a = alloc_at(ptrs[i]);
    w.uses.push_back({a->base, a->base + a->size});
  }
  Kernel *k = &kernels[fn];
  if (k->name.empty()) k->name = name;
  CUstream_st *s = stream_of(stream);
  bool fault = false;
  if (!s->cap) {
    counts.launches++;
    log_op(CAVS_EMU_OP_KERNEL, (long)grid * (long)block, 0, 0, name);
    fault = fail_launch_at > 0 && --fail_launch_at == 0;
  }
  w.what = what;
  w.run = [k, grid, block, body = std::move(body), fault] { run_kernel(k, grid, block, body, fault); };
  issue(s, std::move(w));
}

/* ---- the runtime API ---- */

extern "C" {

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define N(x)                                                                                                           \
  case x: return #x;
    N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation) N(cudaErrorInvalidConfiguration)
    N(cudaErrorInvalidDevicePointer) N(cudaErrorInvalidPitchValue) N(cudaErrorInvalidMemcpyDirection) N(cudaErrorNoDevice) N(cudaErrorECCUncorrectable)
    N(cudaErrorInvalidResourceHandle) N(cudaErrorIllegalState) N(cudaErrorIllegalAddress) N(cudaErrorLaunchFailure)
    N(cudaErrorNotSupported) N(cudaErrorStreamCaptureUnsupported) N(cudaErrorStreamCaptureInvalidated)
    N(cudaErrorStreamCaptureUnjoined) N(cudaErrorStreamCaptureIsolation) N(cudaErrorStreamCaptureImplicit)
    N(cudaErrorStreamCaptureWrongThread) N(cudaErrorGraphExecUpdateFailure) N(cudaErrorUnknown)
#undef N
  }
  return "unrecognized error code";
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorInvalidPitchValue: return "invalid pitch argument";
  case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
  case cudaErrorECCUncorrectable: return "uncorrectable ECC error encountered";
  case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
  case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
  case cudaErrorStreamCaptureUnjoined: return "capture was not joined back to the origin stream";
  case cudaErrorStreamCaptureImplicit:
    return "operation would make the legacy stream depend on a capturing blocking stream";
  case cudaErrorGraphExecUpdateFailure:
    return "the graph update was not performed because it included changes which violated constraints specific to "
           "instantiated graph update";
  default: return cudaGetErrorName(e);
  }
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  if (!sticky) last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t size) {
  if (!p) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (sticky) return sticky;
  if (unsafe_in_capture("cudaMalloc")) return fail(cudaErrorStreamCaptureUnsupported);
  counts.mallocs++;
  if (fail_malloc_at > 0 && --fail_malloc_at == 0) return fail(cudaErrorMemoryAllocation);
  if (size == 0) return cudaSuccess;
  if (size > MAX_ALLOC) return fail(cudaErrorMemoryAllocation);
  size_t rsize = (size + ALIGN - 1) & ~(size_t)(ALIGN - 1), datalen = (rsize + PAGE - 1) & ~(size_t)(PAGE - 1);
  char *m = (char *)mmap(nullptr, datalen + 2 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  Alloc *a = new Alloc{0, true, true, m, datalen + 2 * PAGE, m + PAGE, datalen, m + PAGE + datalen - rsize, size};
  if (mprotect(a->data, datalen, PROT_READ | PROT_WRITE)) fatal("mprotect failed");
  memset(a->base, FILL, size);
  fill_slack(a);
  protect(a, PROT_NONE);
  a->id = new_serial(fmt("cudaMalloc of %zu bytes", size));
  live[a->id] = "device " + describe(a);
  allocs[(uintptr_t)m] = a;
  *p = a->base;
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  if (!p) return sticky;
  if (unsafe_in_capture("cudaFree")) return fail(cudaErrorStreamCaptureUnsupported);
  Alloc *a = alloc_at(p);
  if (!a || !a->device || !a->live || a->base != p) {
    violation(fmt("cudaFree(%p): not a pointer cudaMalloc returned and cudaFree has not freed: ", p) +
              (a ? describe(a) : std::string("host memory")));
    return fail(cudaErrorInvalidValue);
  }
  for (auto &o : pending)
    if (uses_overlap(*o, a->base, a->base + a->size)) {
      violation(fmt("cudaFree(%p) of ", p) + describe(a) + " while " + o->what +
                ", issued before it, has not run: cudaFree need not wait for it (synchronize first)");
      run_until({o}, false);
    }
  counts.frees++;
  mprotect(a->data, a->datalen, PROT_READ);
  check_slack(a, fmt("cudaFree(%p)", p).c_str());
  mprotect(a->data, a->datalen, PROT_NONE); /* a later use faults */
  madvise(a->data, a->datalen, MADV_DONTNEED);
  a->live = false;
  live.erase(a->id);
  return sticky;
}

cudaError_t cudaMallocHost(void **p, size_t size) {
  if (!p) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (sticky) return sticky;
  if (unsafe_in_capture("cudaMallocHost")) return fail(cudaErrorStreamCaptureUnsupported);
  if (size > MAX_ALLOC) return fail(cudaErrorMemoryAllocation);
  counts.host_mallocs++;
  size_t len = ((size ? size : 1) + PAGE - 1) & ~(size_t)(PAGE - 1);
  char *m = (char *)mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  memset(m, FILL, len);
  Alloc *a = new Alloc{0, false, true, m, len, m, len, m, size};
  a->id = new_serial("");
  live[a->id] = "pinned " + describe(a);
  allocs[(uintptr_t)m] = a;
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
  if (!p) return sticky;
  if (unsafe_in_capture("cudaFreeHost")) return fail(cudaErrorStreamCaptureUnsupported);
  Alloc *a = alloc_at(p);
  if (!a || a->device || !a->live || a->base != p) {
    violation(fmt("cudaFreeHost(%p): not a pointer cudaMallocHost returned and cudaFreeHost has not freed", p));
    return fail(cudaErrorInvalidValue);
  }
  for (auto &o : pending)
    if (uses_overlap(*o, a->base, a->base + a->size)) {
      violation(fmt("cudaFreeHost(%p) of ", p) + describe(a) + " while " + o->what +
                ", issued before it, has not run (synchronize first)");
      run_until({o}, false);
    }
  counts.host_frees++;
  mprotect(a->map, a->maplen, PROT_NONE); /* a later use faults */
  madvise(a->map, a->maplen, MADV_DONTNEED);
  a->live = false;
  live.erase(a->id);
  return sticky;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  return copy(dst, src, count, kind, nullptr, false);
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  return copy(dst, src, count, kind, stream, true);
}
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                         enum cudaMemcpyKind kind) {
  return copy2d(dst, dpitch, src, spitch, width, height, kind, nullptr, false,
                fmt("cudaMemcpy2D(%p, pitch %zu, %p, pitch %zu, width %zu, height %zu, %s)", dst, dpitch, src, spitch,
                    width, height, kind_name(kind)));
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t stream) {
  return copy2d(dst, dpitch, src, spitch, width, height, kind, stream, true,
                fmt("cudaMemcpy2DAsync(%p, pitch %zu, %p, pitch %zu, width %zu, height %zu, %s, stream %p)", dst, dpitch,
                    src, spitch, width, height, kind_name(kind), (void *)stream));
}
cudaError_t cudaMemset(void *p, int value, size_t count) {
  if (unsafe_in_capture("cudaMemset")) return fail(cudaErrorStreamCaptureUnsupported);
  return memset_work(p, value, count, count, 1, nullptr, fmt("cudaMemset(%p, %d, %zu)", p, value, count), false);
}
cudaError_t cudaMemsetAsync(void *p, int value, size_t count, cudaStream_t stream) {
  return memset_work(p, value, count, count, 1, stream,
                     fmt("cudaMemsetAsync(%p, %d, %zu, stream %p)", p, value, count, (void *)stream), false);
}
cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int value, size_t width, size_t height, cudaStream_t stream) {
  return memset_work(p, value, pitch, width, height, stream,
                     fmt("cudaMemset2DAsync(%p, pitch %zu, %d, width %zu, height %zu, stream %p)", p, pitch, value,
                         width, height, (void *)stream),
                     true);
}

cudaError_t cudaStreamCreate(cudaStream_t *ps) {
  if (!ps) return fail(cudaErrorInvalidValue);
  if (sticky) return sticky;
  CUstream_st *s = new CUstream_st{0, ++stream_ords, nullptr, nullptr, {}};
  s->serial = new_serial(fmt("stream %d (cudaStreamCreate)", s->ord));
  streams.push_back(s);
  *ps = s;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s || !valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  if (s->cap) return fail(cudaErrorStreamCaptureUnsupported);
  /* its queued work still runs (as on a GPU), in the order it was issued */
  streams.erase(std::find(streams.begin(), streams.end(), s));
  live.erase(s->serial);
  delete s;
  return sticky;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (sticky) return sticky;
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  if (unsafe_in_capture("cudaStreamSynchronize")) return fail(cudaErrorStreamCaptureUnsupported);
  counts.syncs++;
  run_until({stream_of(s)->last}, false);
  return sticky;
}

cudaError_t cudaDeviceSynchronize(void) {
  if (sticky) return sticky;
  if (unsafe_in_capture("cudaDeviceSynchronize")) return fail(cudaErrorStreamCaptureUnsupported);
  counts.syncs++;
  run_all();
  cavs_emu_check_bounds();
  return sticky;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  if (!e) return fail(cudaErrorInvalidValue);
  if (sticky) return sticky;
  CUevent_st *ev = new CUevent_st{0, nullptr, nullptr, {}};
  ev->serial = new_serial("event (cudaEventCreate)");
  handles_alive.push_back(ev);
  *e = ev;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!alive(e)) return fail(cudaErrorInvalidResourceHandle);
  forget(e);
  if (capture)
    for (auto &x : capture->events)
      if (x == e) x = nullptr;
  live.erase(e->serial);
  delete e;
  return sticky;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  if (sticky) return sticky;
  if (!alive(e) || !valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  CUstream_st *s = stream_of(stream);
  if (s->cap) {
    e->op = nullptr;
    e->cap = s->cap;
    e->nodes = s->front;
    s->cap->events.push_back(e);
    return cudaSuccess;
  }
  if (s == &legacy_stream && capture && capture->mode != cudaStreamCaptureModeRelaxed) {
    capture->invalid = true;
    return fail(cudaErrorStreamCaptureImplicit);
  }
  e->cap = nullptr;
  e->op = marker(s, {}, "cudaEventRecord");
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int flags) {
  if (sticky) return sticky;
  if (!alive(e) || !valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  CUstream_st *s = stream_of(stream);
  if (e->cap) { /* an event of a capture: s joins it, or takes more of it */
    if (s->cap && s->cap != e->cap) return fail(cudaErrorStreamCaptureIsolation);
    if (!s->cap) {
      if (s == &legacy_stream) {
        e->cap->invalid = true;
        return fail(cudaErrorStreamCaptureImplicit);
      }
      s->cap = e->cap;
      s->front = e->nodes;
      e->cap->joined.push_back(s);
    } else {
      for (int n : e->nodes)
        if (std::find(s->front.begin(), s->front.end(), n) == s->front.end()) s->front.push_back(n);
    }
    return cudaSuccess;
  }
  if (s->cap) { /* work outside the capture cannot be waited for inside it */
    violation("cudaStreamWaitEvent: a captured stream waits for an event recorded outside the capture");
    s->cap->invalid = true;
    return fail(cudaErrorStreamCaptureIsolation);
  }
  if (s == &legacy_stream && capture && capture->mode != cudaStreamCaptureModeRelaxed) {
    capture->invalid = true;
    return fail(cudaErrorStreamCaptureImplicit);
  }
  marker(s, {e->op}, "cudaStreamWaitEvent");
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (sticky) return sticky;
  if (!alive(e)) return fail(cudaErrorInvalidResourceHandle);
  if (unsafe_in_capture("cudaEventSynchronize")) return fail(cudaErrorStreamCaptureUnsupported);
  counts.syncs++;
  run_until({e->op}, false);
  return sticky;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  if (sticky) return sticky;
  if (!stream || !valid_stream(stream)) return fail(stream ? cudaErrorInvalidResourceHandle : cudaErrorStreamCaptureUnsupported);
  if (stream->cap) return fail(cudaErrorIllegalState);
  if (capture) {
    violation("cudaStreamBeginCapture: the emulator captures one stream at a time");
    return fail(cudaErrorNotSupported);
  }
  CUgraph_st *g = new CUgraph_st{0, {}};
  g->serial = new_serial("graph (cudaStreamEndCapture)");
  handles_alive.push_back(g);
  capture = new Capture{g, stream, mode, false, {}, {}};
  stream->cap = capture;
  stream->front.clear();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pg) {
  if (!pg) return fail(cudaErrorInvalidValue);
  *pg = nullptr;
  if (!stream || !valid_stream(stream) || !stream->cap || stream->cap->origin != stream)
    return fail(cudaErrorIllegalState);
  Capture *c = stream->cap;
  std::vector<Node> &nodes = c->g->nodes;
  /* every stream that joined must have joined back: its last nodes among what the
     origin's next node would follow */
  std::vector<char> before(nodes.size(), 0);
  std::vector<int> stack(stream->front);
  while (!stack.empty()) {
    int n = stack.back();
    stack.pop_back();
    if (before[n]) continue;
    before[n] = 1;
    for (int d : nodes[n].deps) stack.push_back(d);
  }
  bool unjoined = false;
  for (CUstream_st *s : c->joined) {
    for (int n : s->front) unjoined |= !before[n];
    s->cap = nullptr;
    s->front.clear();
  }
  stream->cap = nullptr;
  stream->front.clear();
  for (CUevent_st *e : c->events)
    if (e) e->cap = nullptr;
  capture = nullptr;
  cudaError_t e = c->invalid ? cudaErrorStreamCaptureInvalidated : unjoined ? cudaErrorStreamCaptureUnjoined : cudaSuccess;
  if (unjoined && !c->invalid) violation("cudaStreamEndCapture: a stream that joined the capture was not joined back");
  if (e) {
    forget(c->g);
    live.erase(c->g->serial);
    delete c->g;
  } else {
    *pg = c->g;
  }
  delete c;
  return fail(e);
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *px, cudaGraph_t g, unsigned long long flags) {
  if (!px || !alive(g)) return fail(cudaErrorInvalidValue);
  if (sticky) return sticky;
  CUgraphExec_st *x = new CUgraphExec_st{0, g->nodes};
  x->serial = new_serial(fmt("executable graph of %zu nodes (cudaGraphInstantiate)", g->nodes.size()));
  handles_alive.push_back(x);
  *px = x;
  return cudaSuccess;
}

cudaError_t cudaGraphExecUpdate(cudaGraphExec_t x, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info) {
  if (!alive(x) || !alive(g)) return fail(cudaErrorInvalidValue);
  cudaGraphExecUpdateResult r = cudaGraphExecUpdateSuccess;
  if (x->nodes.size() != g->nodes.size()) r = cudaGraphExecUpdateErrorTopologyChanged;
  for (size_t i = 0; i < g->nodes.size() && r == cudaGraphExecUpdateSuccess; i++) {
    const Node &a = x->nodes[i], &b = g->nodes[i];
    if (a.kind != b.kind) r = cudaGraphExecUpdateErrorNodeTypeChanged;
    else if (a.deps != b.deps) r = cudaGraphExecUpdateErrorTopologyChanged;
    else if (a.kind == N_MEMSET && (a.memset2d || b.memset2d) &&
             (a.memset2d != b.memset2d || a.pitch != b.pitch || a.width != b.width || a.height != b.height))
      r = cudaGraphExecUpdateErrorParametersChanged; /* "for 2d memsets, only address and value" */
    else if (a.kind == N_MEMCPY && (a.src_device != b.src_device || a.dst_device != b.dst_device))
      r = cudaGraphExecUpdateErrorParametersChanged;
  }
  if (info) *info = {r, nullptr, nullptr};
  if (r != cudaGraphExecUpdateSuccess) return fail(cudaErrorGraphExecUpdateFailure);
  x->nodes = g->nodes;
  return sticky;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t stream) {
  if (sticky) return sticky;
  if (!alive(x)) return fail(cudaErrorInvalidValue);
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  CUstream_st *s = stream_of(stream);
  if (s->cap) {
    violation("cudaGraphLaunch into a capture: the emulator has no child graph nodes");
    return fail(cudaErrorNotSupported);
  }
  if (s == &legacy_stream && capture && capture->mode != cudaStreamCaptureModeRelaxed) {
    capture->invalid = true;
    return fail(cudaErrorStreamCaptureImplicit);
  }
  counts.graph_launches++;
  std::vector<OpP> first;
  implicit_deps(s, first);
  std::vector<OpP> ops;
  for (const Node &n : x->nodes) {
    auto o = std::make_shared<Op>();
    o->seq = ++op_seq;
    o->ord = n.ord;
    if (n.deps.empty()) o->deps = first;
    for (int d : n.deps) o->deps.push_back(ops[d]);
    /* a kernel node runs as a launch does: cavs_emu_fail_launch counts it (its work as
       captured, which counted nothing) */
    bool fault = n.kind == N_KERNEL && fail_launch_at > 0 && --fail_launch_at == 0;
    if (fault) o->run = [] { sticky = last_error = cudaErrorIllegalAddress; };
    else o->run = n.run;
    o->what = n.what + " (a node of a launched graph)";
    o->uses = n.uses;
    counts.graph_kernels += n.kind == N_KERNEL || n.kind == N_BLAS;
    counts.graph_kernel_nodes += n.kind == N_KERNEL;
    pending.push_back(o);
    ops.push_back(o);
  }
  marker(s, ops, "cudaGraphLaunch's end");
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  if (!alive(g)) return fail(cudaErrorInvalidValue);
  forget(g);
  live.erase(g->serial);
  delete g;
  return sticky;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
  if (!alive(x)) return fail(cudaErrorInvalidValue);
  forget(x);
  live.erase(x->serial); /* a launch still queued keeps copies of the nodes' work */
  delete x;
  return sticky;
}

/* ---- cuBLAS ---- */

cublasStatus_t cublasCreate(cublasHandle_t *h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  if (sticky) return CUBLAS_STATUS_NOT_INITIALIZED;
  cublasContext *c = new cublasContext{0, nullptr};
  c->serial = new_serial("cuBLAS handle (cublasCreate)");
  handles.push_back(c);
  *h = c;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
  auto it = std::find(handles.begin(), handles.end(), h);
  if (it == handles.end()) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!sticky && !capture) run_all(); /* "implicitly calls cudaDeviceSynchronize" */
  handles.erase(it);
  live.erase(h->serial);
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  if (std::find(handles.begin(), handles.end(), h) == handles.end()) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!valid_stream(s)) return CUBLAS_STATUS_INVALID_VALUE;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  default: return "CUBLAS_STATUS_UNKNOWN";
  }
}
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc) {
  return gemm<float>("cublasSgemm", h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
cublasStatus_t cublasDgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const double *alpha, const double *A, int lda, const double *B, int ldb, const double *beta,
                           double *C, int ldc) {
  return gemm<double>("cublasDgemm", h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- what the tests ask ---- */

void cavs_emu_set_order(int o) {
  run_all(); /* what was queued runs as it was going to */
  order = o;
}

void cavs_emu_counters(cavs_emu_counts *out, int reset) {
  if (out) *out = counts;
  if (reset) {
    memset(&counts, 0, sizeof counts);
    oplog.clear();
  }
}

void cavs_emu_log(int on) {
  logging = on;
  oplog.clear();
}
long cavs_emu_ops(const cavs_emu_op **ops) {
  *ops = oplog.data();
  return (long)oplog.size();
}

const char *cavs_emu_errors(void) { return errors.empty() ? nullptr : errors.c_str(); }
void cavs_emu_clear_errors(void) { errors.clear(); }

void cavs_emu_check_bounds(void) {
  bool was_open = device_open;
  open_device();
  for (auto &e : allocs)
    if (e.second->device && e.second->live) check_slack(e.second, "a bounds check");
  if (!was_open) close_device();
}

long cavs_emu_serial(void) { return serial_now; }
long cavs_emu_live(long since) {
  long n = 0;
  for (auto &e : live) n += e.first > since;
  return n;
}
const char *cavs_emu_live_report(long since) {
  static std::string r;
  r.clear();
  for (auto &e : live)
    if (e.first > since) r += "  " + e.second + "\n";
  return r.c_str();
}

int cavs_emu_host_faults(void) { return !never_close; }

void cavs_emu_fail_malloc(long n) { fail_malloc_at = n; }
void cavs_emu_fail_launch(long n) { fail_launch_at = n; }
void cavs_emu_fail_copy(long n) { fail_copy_at = n; }
}

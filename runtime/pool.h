/* pool.h: the CPU backend's threads (private, not installed).
 *
 * One pool per model made with more than one thread: the caller and threads - 1
 * workers. A job is `parts` calls f(arg, part); each thread, the caller included, claims
 * the next unclaimed part until none is left, so a worker that another process keeps
 * off its core costs nothing but its share: the caller takes it. The caller returns
 * when every part is done. Between jobs a worker spins for a few tens of microseconds
 * (the next job usually comes sooner), then sleeps on a condition variable.
 *
 * The products are split over the pool too (OpenBLAS runs single-threaded inside each
 * part), so the model's threads are one pool for everything: no second set of threads
 * competing for the cores. */
#ifndef CV_POOL_H
#define CV_POOL_H

typedef void (*cv_task)(void *arg, int part);
typedef struct cv_pool cv_pool;

/* A pool of `threads` (the caller counts as one), or NULL with errno set when threads
 * cannot be started; threads <= 1 gives NULL too (errno 0): run inline. */
cv_pool *cv_pool_new(int threads);
void cv_pool_free(cv_pool *p);
/* the caller and the workers */
int cv_pool_threads(const cv_pool *p);
/* f(arg, i) for every i in [0, parts), on the pool; returns when all are done */
void cv_pool_run(cv_pool *p, cv_task f, void *arg, int parts);
/* Part i of `parts` of len items: [*at, *at + *cnt) (*cnt 0: none), each part but the
 * last a whole number of blocks of `align` items */
static inline void cv_pool_share(long len, int parts, int i, long align, long *at, long *cnt) {
  long per = (len + parts - 1) / parts;
  per = (per + align - 1) / align * align;
  *at = (long)i * per;
  *cnt = *at >= len ? 0 : len - *at < per ? len - *at : per;
}

#endif

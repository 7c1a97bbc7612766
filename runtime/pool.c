/* pool.c: the CPU backend's threads (see pool.h). */
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

/* How long a worker looks for the next job before it sleeps: about 50 microseconds of
   pause instructions. */
enum { SPIN = 2000 };

struct cv_pool {
  int nworkers;
  pthread_t *th;
  pthread_mutex_t mu;
  pthread_cond_t wake;
  /* the job: f and arg are set and done cleared, then claim and gen name it */
  cv_task f;
  void *arg;
  /* the job's generation (bits 32-63), its number of parts (16-31) and its next
     unclaimed part (0-15), in one word: a claim is a compare-and-swap of all three, so
     a thread still looking at the last job reads that job's count with its index, and
     its swap fails once this job is out: it can never take a part of this one */
  atomic_ullong claim;
  atomic_uint gen;
  atomic_int done, sleeping;
  atomic_bool quit;
};

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* claim parts of job `gen` until none is left (or a later job is out: this one is done) */
static void work(cv_pool *p, unsigned gen) {
  for (;;) {
    unsigned long long v = atomic_load(&p->claim);
    unsigned idx = (unsigned)(v & 0xffff), parts = (unsigned)(v >> 16) & 0xffff;
    if ((unsigned)(v >> 32) != gen || idx >= parts) return;
    if (!atomic_compare_exchange_weak(&p->claim, &v, v + 1)) continue;
    /* a part of job gen was unclaimed, so the job is not done, and its caller sets no
       other job before it is: f and arg are still this job's */
    p->f(p->arg, (int)idx);
    atomic_fetch_add(&p->done, 1);
  }
}

static void *worker(void *arg) {
  cv_pool *p = arg;
  unsigned seen = atomic_load(&p->gen);
  for (;;) {
    int spins = 0;
    while (atomic_load(&p->gen) == seen && !atomic_load(&p->quit) && spins < SPIN) {
      relax();
      spins++;
    }
    if (atomic_load(&p->gen) == seen && !atomic_load(&p->quit)) {
      pthread_mutex_lock(&p->mu);
      atomic_fetch_add(&p->sleeping, 1);
      while (atomic_load(&p->gen) == seen && !atomic_load(&p->quit)) pthread_cond_wait(&p->wake, &p->mu);
      atomic_fetch_sub(&p->sleeping, 1);
      pthread_mutex_unlock(&p->mu);
    }
    if (atomic_load(&p->quit)) return NULL;
    seen = atomic_load(&p->gen);
    work(p, seen);
  }
}

cv_pool *cv_pool_new(int threads) {
  errno = 0;
  if (threads <= 1) return NULL;
  cv_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->th = calloc((size_t)threads - 1, sizeof *p->th);
  if (!p->th || pthread_mutex_init(&p->mu, NULL)) {
    free(p->th);
    free(p);
    errno = ENOMEM;
    return NULL;
  }
  if (pthread_cond_init(&p->wake, NULL)) {
    pthread_mutex_destroy(&p->mu);
    free(p->th);
    free(p);
    errno = ENOMEM;
    return NULL;
  }
  for (int i = 0; i < threads - 1; i++) {
    int e = pthread_create(&p->th[i], NULL, worker, p);
    if (e) {
      cv_pool_free(p);
      errno = e;
      return NULL;
    }
    p->nworkers++;
  }
  return p;
}

void cv_pool_free(cv_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->quit, true);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->nworkers; i++) pthread_join(p->th[i], NULL);
  pthread_cond_destroy(&p->wake);
  pthread_mutex_destroy(&p->mu);
  free(p->th);
  free(p);
}

int cv_pool_threads(const cv_pool *p) { return p ? p->nworkers + 1 : 1; }

void cv_pool_run(cv_pool *p, cv_task f, void *arg, int parts) {
  if (!p || parts <= 1 || parts > 0xffff) {
    for (int i = 0; i < parts; i++) f(arg, i);
    return;
  }
  /* the last job is done (its caller waited for it), so no worker holds a part of it */
  unsigned gen = atomic_load(&p->gen) + 1;
  p->f = f;
  p->arg = arg;
  atomic_store(&p->done, 0);
  atomic_store(&p->claim, (unsigned long long)gen << 32 | (unsigned long long)parts << 16);
  atomic_store(&p->gen, gen);
  if (atomic_load(&p->sleeping)) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
  }
  work(p, gen);
  /* the parts the workers claimed: short, since each claimed one when it was free */
  for (int spins = 0; atomic_load(&p->done) < parts; spins++) {
    if (spins < SPIN) relax();
    else sched_yield();
  }
}

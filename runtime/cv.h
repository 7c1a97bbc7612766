/* cv.h: libcavs internals shared by the runtime's files (not installed). */
#ifndef CV_H
#define CV_H

#include "backend.h"
#include "cavs.h"

#include <stdbool.h>
#include <stdio.h>

struct cavs_model {
  const cavs_desc *d;
  const cv_backend *be; /* owns every buffer below that a kernel touches */
  void *bs;             /* the backend's own state (its streams, its copy of the schedule) */
  bool launch_failed;   /* a kernel of generated code did not launch: m->err says where */
  cavs_backend_stats stats;
  cavs_ctx ctx;
  size_t esize; /* 4 (float) or 8 (double) */
  int policy;
  char err[512];
  /* parameters: one block, groups pointing into it */
  size_t nflat;
  void *pflat, *gflat;
  size_t *pg_off; /* per group: offset in scalars */
  long *pg_rows, *pg_cols;
  void **param, **pgrad;
  /* lookup tables: rows with a nonzero gradient (every other row's is zero) */
  int **touched;
  int *ntouched;
  unsigned char **mark;
  /* optimizer state; spans: scratch of optim.c */
  void *spans;
  int capspans;   /* allocated with the model: a step allocates nothing but Adam's moments */
  void *m1, *m2;
  long step;
  /* per-row buffers */
  int cap_rows;
  size_t model_bytes; /* parameters, gradients, optimizer state: counted against the limit */
  long *bw; /* widths */
  void **val, **grad;
  cavs_loss_acc *loss;
  /* the minibatch */
  int rows, maxc;
  int *child;      /* [cap * maxc] */
  int **iin;       /* [nint][cap] */
  void **rin;      /* [nreal][cap * w] */
  long *rw;        /* real input widths */
  unsigned char *root, *pushed;
  int *pred;
  int *gbase, capgraphs, ngraphs; /* first vertex of each graph of the minibatch */
  int *type_r0, *type_n, *type_leaf; /* type_leaf: its level-0 rows, first in its range */
  int ntask, captask;
  int *task_r0, *task_n, *task_type, *task_leaf;
  /* scheduling scratch, grown only */
  int capv;
  long capedges;
  int *level, *row_of, *pcount, *padj, *queue, *vtype;
  int capcount;
  int *count;
  bool have_batch;
};

long cv_lin(const cavs_lin *l, const long *dims);
/* cv_lin in checked arithmetic: 0 and the value when it is in [0, LONG_MAX]. */
int cv_lin_checked(const cavs_lin *l, const long *dims, long *out);
/* *p grown to count elements of elem bytes, in checked arithmetic; on failure *p is
 * untouched and the message is in m->err (-1). */
int cv_grow(cavs_model *m, void *p, size_t elem, size_t count);
/* printf into m->err; returns -1 */
int cv_fail(cavs_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* the same for a failure to get memory: also sets errno to ENOMEM */
int cv_fail_mem(cavs_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* scheduler.c */
int cv_schedule(cavs_model *m, const cavs_graph *const *graphs, int k);
/* optim.c */
void cv_sparse_reset(cavs_model *m);
/* Adam's or Adagrad's moments, zeroed, unless the model has them; -1 (message in m->err) */
int cv_alloc_moments(cavs_model *m);
/* tensor.c */
int cv_grow_rows(cavs_model *m, int rows);

#endif

/* dist.h: cavs train over MPI (data parallelism), the driver's side. libcavs knows
 * nothing of MPI: it gives a part of a minibatch the whole's loss counts, dropout masks
 * and table rows (cavs_model_set_loss_counts, cavs_model_set_vertex_offset,
 * cavs_model_touch_rows), and this file moves the numbers between the processes. Built
 * without MPI (configure found no Open MPI, or --disable-mpi), every function here is
 * the one process's: dist_size is 1 and nothing is linked. */
#ifndef DIST_H
#define DIST_H

#include "cavs.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern int dist_rank, dist_size; /* this process among dist_size; 0 of 1 without mpirun */

/* Under mpirun (Open MPI's or a PMI launcher's environment): MPI started, the ranks
 * known, messages of die() prefixed with the rank, and a die() on any rank ends them
 * all (MPI_Abort). Without MPI support under a launcher of several processes: exit 1
 * with a message. Elsewhere nothing. */
void dist_start(void);
/* MPI finished (before a normal exit of every rank); nothing without it */
void dist_end(void);
/* The host buffers the reductions keep, freed (before the model they were allocated
   for is: they are its backend's, pinned on cuda); dist_end does it too */
void dist_release(void);

/* Sums over the ranks, in place, the same result on every rank. */
void dist_sum_long(long *v, int n);
void dist_sum_double(double *v, int n);
/* Every rank's n bytes (n may differ), concatenated in rank order on rank 0: allocated,
 * *total its bytes (on other ranks 0, and the buffer empty). Called by every rank. */
void *dist_gather(const void *mine, size_t n, size_t *total);
/* Rank 0's *n bytes at buf to every rank: on rank 0 buf itself, on the others an
 * allocation of them (*n set); the caller frees what it returns. Called by every rank;
 * without MPI (or one rank) buf. */
void *dist_share(void *buf, size_t *n);
/* Dies on every rank, naming `what`, unless every rank passed the same value. */
void dist_same(uint64_t v, const char *what);
/* An error every rank finds at the same point (the same check of the same numbers):
 * rank 0 says it, and every rank ends with `status`, MPI finished, no abort. */
_Noreturn void dist_die_all(int status, const char *what);
/* FNV-1a of n bytes, folded into h (start with dist_hash(0, NULL, 0)). */
uint64_t dist_hash(uint64_t h, const void *p, size_t n);

/* A minibatch of k graphs split into dist_size parts by their vertices, in order: this
 * rank's part is graphs [*lo, *hi), the first *before vertices of the whole before it.
 * Each rank gets a graph when k >= dist_size. */
void dist_part(const cavs_graph *const *gs, int k, int *lo, int *hi, long *before);

/* After every rank's backward pass of its part: the parameters' gradients summed over
 * the ranks in place, the same bits on every rank. Dense parameters go in one
 * allreduce; a lookup table's gradient as the rows each rank touched (gathered, and
 * summed in rank order), or dense when that is fewer bytes; each rank's step then
 * updates the union of the rows (cavs_model_touch_rows). es: the model's scalar size
 * (4 or 8). 0, or -1 with a message in cavs_model_error. */
int dist_reduce_grads(cavs_model *m, size_t es);
/* Before each backward pass: with dist_overlap (cavs train --grad-overlap; off by
 * default: on one machine it has not been measured to hide anything), the dense groups' sums start while the pass runs,
 * each bucket of them (the push block's, each vertex type's, the pull block's) as soon
 * as the pass has finished it (cavs_model_set_grad_hook) and in one order on every
 * rank; dist_reduce_grads then waits for them and does the tables as above. `mine`
 * false: this rank's pass counts for nothing (its gradients are zeroed after it), so
 * its groups go at the end. Nothing with one process. */
void dist_backward_begin(cavs_model *m, size_t es, bool mine);
extern bool dist_overlap;

/* cavs train --expert-parallel: with `on`, the mixtures of experts' products of m's
 * passes placed on the ranks (cavs_model_set_expert_comm: MPI_Allgather and
 * MPI_Alltoallv over a communicator of their own); off, every product here (the
 * passes a rank runs alone: evaluation). Nothing without the option or with one
 * process. */
void dist_experts(cavs_model *m, bool on);
/* --expert-parallel; and, unless --no-expert-replicas, a round's hot expert's rows split
   with the least busy rank (cavs_expert_comm.replicate) */
extern bool dist_expert_parallel, dist_expert_replicas;

/* What the reductions of this run cost: seconds in them, and the bytes this rank put in
 * (its dense gradient buffer, its tables' row ids and rows; what the wire carries is
 * that times what MPI's algorithm makes of it, about 2 (N - 1) / N for an allreduce). */
typedef struct DistStats {
  double seconds;
  double overlapped; /* of seconds, those spent during backward passes (dist_backward_begin's
                        buckets started, progressed); the rest the rank waited after them */
  double bytes;
  long dense_tables, sparse_tables; /* table reductions sent dense, and as rows */
} DistStats;
extern DistStats dist_stats;

#endif

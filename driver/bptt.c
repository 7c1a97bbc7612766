/* bptt.c: text-bptt's chunks cut afresh each epoch at lengths that vary (cavs train
 * --bptt-vary), as Merity, Keskar and Socher's AWD-LSTM trains ("Regularizing and
 * optimizing LSTM language models", 2017): with chunks always N tokens long, the same
 * tokens always begin one, and a token at a chunk's start never passes its gradient
 * back; lengths that vary move the cuts from epoch to epoch.
 *
 * The data set's chains, back to back in its vertex arrays (text-bptt loads the stream
 * so), are read as one stream of V tokens, laid out as `batch` streams side by side:
 * stream s the V / batch tokens after s * (V / batch) (the first V % batch streams a
 * token more). Minibatch j is the j-th chunk of every stream, all of one length L_j
 * drawn for it, so that every stream ends in the last minibatch (the V % batch longer
 * ones alone in it when the others are done) and each stream keeps its place, which
 * the carried state needs. A chunk is a graph that points into the data set's arrays
 * (its words and labels in place, each token labeled with the one after it across the
 * cut, as the loader labeled it) and one shared chain of child slots: vertex k's child
 * is k - 1, the first has none (the carried state's row takes its place). */
#include "driver.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* uniform in (0, 1): never 0, so that its logarithm is finite */
static double unit_open(uint64_t *rng) { return ((double)(rng_next(rng) >> 11) + 0.5) * 0x1p-53; }

int bptt_draw(uint64_t *rng, int n, double sd) {
  double base = unit_open(rng) < 0.95 ? n : n / 2.0;
  double u1 = unit_open(rng), u2 = unit_open(rng);
  double x = base + sd * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2); /* Box and Muller */
  int lo = n < BPTT_VARY_MIN ? n : BPTT_VARY_MIN;
  if (!(x >= lo)) return lo;
  if (x >= BPTT_VARY_MAX) return BPTT_VARY_MAX;
  return (int)x; /* toward zero, as AWD-LSTM's int() */
}

/* Whether the n graphs are chains whose vertices lie back to back from the first's, with
 * no real inputs: what text-bptt loads, and all the cut can read as one stream. */
static bool chains_back_to_back(const cavs_graph *const *gs, int n, int nint, char *why, size_t whylen) {
  long at = 0;
  for (int i = 0; i < n; i++) {
    const cavs_graph *g = gs[i];
    bool ok = g->n >= 1 && g->maxc == gs[0]->maxc && g->maxc >= 1 && !g->real && g->type &&
              g->type == gs[0]->type + at && g->feat == gs[0]->feat + at * nint;
    for (int k = 0; ok && k < g->n; k++)
      for (int c = 0; c < g->maxc; c++) ok = ok && g->child[(long)k * g->maxc + c] == (c ? -1 : k - 1);
    if (!ok) {
      snprintf(why, whylen, "graph %d of the data is not a chain that goes on from the one before (text-bptt's are)", i);
      return false;
    }
    at += g->n;
  }
  return true;
}

/* the shared chain of child slots, for chunks of up to n vertices */
static bool chain_for(BpttCut *c, int n, int maxc) {
  if (n <= c->chain_n) return true;
  int *p = realloc(c->chain, sizeof(int) * (size_t)n * (size_t)maxc);
  if (!p) return false;
  c->chain = p;
  for (long k = 0; k < n; k++)
    for (int s = 0; s < maxc; s++) p[k * maxc + s] = s ? -1 : (int)k - 1;
  c->chain_n = n;
  return true;
}

/* room for one more of *n elements of `size` bytes at *p (*cap of them), doubled */
static bool room(void **p, int n, int *cap, size_t size) {
  if (n < *cap) return true;
  int grown = *cap ? 2 * *cap : 256;
  void *q = realloc(*p, size * (size_t)grown);
  if (!q) return false;
  *p = q, *cap = grown;
  return true;
}

int bptt_cut(BpttCut *c, const cavs_graph *const *gs, int n, int nint, int batch, double sd, uint64_t *rng, char *why,
             size_t whylen) {
  c->n = c->nmb = 0;
  c->base = 0;
  if (n <= 0 || batch <= 0) return 0;
  if (!chains_back_to_back(gs, n, nint, why, whylen)) return -1;
  long total = 0;
  for (int i = 0; i < n; i++) {
    total += gs[i]->n;
    if (gs[i]->n > c->base) c->base = gs[i]->n; /* the format's N (or the whole stream, if shorter) */
  }
  long per = total / batch, extra = total % batch, longest = per + (extra > 0);
  int maxc = gs[0]->maxc;
  for (long off = 0; off < longest;) {
    int len = bptt_draw(rng, c->base, sd);
    if (!room((void **)&c->len, c->nmb, &c->capmb, sizeof *c->len) || !chain_for(c, len, maxc)) goto oom;
    c->len[c->nmb++] = len;
    for (long s = 0; s < batch; s++) {
      long start = s * per + (s < extra ? s : extra), have = per + (s < extra) - off;
      if (have <= 0) continue; /* (a shorter stream, done: only in the last minibatch) */
      long v = start + off;
      cavs_graph g = {.n = (int)(have < len ? have : len), .maxc = maxc, .child = NULL, .type = gs[0]->type + v,
                      .feat = gs[0]->feat + v * nint, .real = NULL, .slots = gs[0]->slots};
      if (!room((void **)&c->g, c->n, &c->cap, sizeof *c->g)) goto oom;
      c->g[c->n++] = g;
    }
    off += len;
  }
  /* (the chain is final only now: realloc may have moved it) */
  for (int i = 0; i < c->n; i++) c->g[i].child = c->chain;
  return 0;
oom:
  snprintf(why, whylen, "out of memory cutting the chunks");
  return -1;
}

void bptt_cut_free(BpttCut *c) {
  free(c->g);
  free(c->len);
  free(c->chain);
  *c = (BpttCut){0};
}

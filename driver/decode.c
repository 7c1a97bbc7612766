/* decode.c: `cavs predict --greedy INPUT`, greedy decoding: a decoder chain grown a step
 * at a time from the model's own predictions, in place of the teacher forcing of
 * training (seq2seq.vf).
 *
 * Each graph of the data is cut at its first decoder step: the first vertex (in the
 * file's order) with INPUT set (>= 0) and no child of its own type in a named slot,
 * with everything it reads (its children, theirs, and so on: the encoder). Its type is
 * the decoder's. Then, for the graphs of a minibatch together: a forward pass; each
 * graph's newest decoder vertex's class (the argmax of its push block's softmax_xent)
 * is the next word; a graph is done when that is --stop's class or it has --max-steps
 * words; otherwise a vertex is appended: the decoder's type, the newest step in every
 * named slot of the decoder's type (untyped models: slot 0), the first step's set of
 * children (attention over the encoder) and its inputs, but INPUT = the word just
 * predicted and no class labels. Each step runs the whole graph again (n steps cost
 * n^2 / 2 vertex evaluations: a predict command's price for running unchanged
 * generated code), so --max-steps is at most GREEDY_MAX_STEPS, and on a terminal the
 * steps are shown as they go; the graphs of the minibatch grow in lockstep, so each
 * pass is batched as training is.
 *
 * Output: a line a graph, its words. Where the data carries the target chain (vertices
 * of the decoder's type, each in the named slot of the next), the number of steps
 * defaults to its length and the words are scored against its labels, position by
 * position (to standard error). */
#include "driver.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct Grow {
  cavs_graph g; /* the arrays below, n vertices */
  int *child, *type, *feat;
  float *real;
  int first, last;  /* the first and the newest decoder step */
  int *words, nwords, max;
  int *gold, ngold; /* the data's target labels, -1 where unlabeled */
} Grow;

static void *alloc_or_die(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  if (!p) die(2, "predict --greedy: out of memory");
  return p;
}

/* whether named slot k of type t holds the decoder's previous step */
static bool prev_slot(const cavs_desc *d, int t, int k) {
  const cavs_vertex_desc *v = &d->vertex[t];
  return v->slot_types ? v->slot_types[k] == t : k == 0;
}

/* Cuts graph `src` (number gi of the data) at its first decoder step, with room for
 * `max` more vertices; *gold the labels of the data's target chain. */
static void grow_init(Grow *w, const cavs_desc *d, const cavs_graph *src, int gi, const char *input, int in_slot,
                      int cls_slot, int rw, int max_steps) {
  int n = src->n, maxc = src->maxc, nint = d->nint;
  const int *st = src->type;
  int v0 = -1;
  for (int v = 0; v < n && v0 < 0; v++) {
    int t = st ? st[v] : 0;
    if (!src->feat || src->feat[(size_t)v * nint + in_slot] < 0) continue;
    bool chained = false;
    for (int k = 0; k < d->vertex[t].children && k < maxc; k++) {
      int c = src->child[(size_t)v * maxc + k];
      chained |= c >= 0 && (st ? st[c] : 0) == t && prev_slot(d, t, k);
    }
    if (!chained) v0 = v;
  }
  if (v0 < 0)
    die(1, "predict --greedy: graph %d has no first decoder step (a vertex with %s set and no step before it in a slot)",
        gi, input);
  int t0 = st ? st[v0] : 0;
  if (!d->vertex[t0].pushes)
    die(1, "predict --greedy: the decoder's vertices (type '%s') push nothing, so they predict no word", d->vertex[t0].name);
  /* what the first step reads, transitively, in the data's order */
  bool *keepv = alloc_or_die((size_t)n);
  int *stack = alloc_or_die(sizeof(int) * (size_t)n), sp = 0;
  keepv[v0] = true;
  stack[sp++] = v0;
  while (sp) {
    int v = stack[--sp];
    for (int k = 0; k < maxc; k++) {
      int c = src->child[(size_t)v * maxc + k];
      if (c >= 0 && !keepv[c]) keepv[c] = true, stack[sp++] = c;
    }
  }
  int *num = alloc_or_die(sizeof(int) * (size_t)n), kept = 0;
  for (int v = 0; v < n; v++) num[v] = keepv[v] ? kept++ : -1;
  /* the data's target chain: the decoder vertex holding the step before in a slot */
  int *next = alloc_or_die(sizeof(int) * (size_t)n);
  for (int v = 0; v < n; v++) next[v] = -1;
  for (int v = 0; v < n; v++) {
    int t = st ? st[v] : 0;
    if (t != t0) continue;
    for (int k = 0; k < d->vertex[t].children && k < maxc; k++) {
      int c = src->child[(size_t)v * maxc + k];
      if (c >= 0 && prev_slot(d, t, k) && next[c] < 0) next[c] = v;
    }
  }
  w->gold = alloc_or_die(sizeof(int) * (size_t)n);
  w->ngold = 0;
  for (int v = v0, hops = 0; v >= 0 && hops < n; v = next[v], hops++)
    w->gold[w->ngold++] = cls_slot >= 0 ? src->feat[(size_t)v * nint + cls_slot] : -1;
  /* without --max-steps: the target's length, or where the data has the first step
     only, 100 (and --stop, if given, ends it sooner) */
  w->max = max_steps > 0 ? max_steps : w->ngold > 1 ? w->ngold : 100;
  int cap = kept + w->max;
  w->child = alloc_or_die(sizeof(int) * (size_t)cap * (size_t)maxc);
  w->type = alloc_or_die(sizeof(int) * (size_t)cap);
  w->feat = alloc_or_die(sizeof(int) * (size_t)cap * (size_t)(nint ? nint : 1));
  w->real = rw ? alloc_or_die(sizeof(float) * (size_t)cap * (size_t)rw) : NULL;
  for (int v = 0; v < n; v++) {
    if (num[v] < 0) continue;
    int u = num[v];
    for (int k = 0; k < maxc; k++) {
      int c = src->child[(size_t)v * maxc + k];
      w->child[(size_t)u * maxc + k] = c >= 0 ? num[c] : -1;
    }
    w->type[u] = st ? st[v] : 0;
    if (nint) memcpy(w->feat + (size_t)u * nint, src->feat + (size_t)v * nint, sizeof(int) * (size_t)nint);
    if (rw) memcpy(w->real + (size_t)u * rw, src->real + (size_t)v * rw, sizeof(float) * (size_t)rw);
  }
  w->first = w->last = num[v0];
  w->words = alloc_or_die(sizeof(int) * (size_t)w->max);
  w->nwords = 0;
  w->g = (cavs_graph){.n = kept, .maxc = maxc, .child = w->child, .type = w->type, .feat = w->feat, .real = w->real};
  free(keepv);
  free(stack);
  free(num);
  free(next);
}

/* The next step after `word`: a copy of the first step reading it, chained to the last. */
static void grow_step(Grow *w, const cavs_desc *d, int in_slot, int word, int rw) {
  int u = w->g.n, f = w->first, maxc = w->g.maxc, nint = d->nint, t = w->type[f];
  for (int k = 0; k < maxc; k++)
    w->child[(size_t)u * maxc + k] = k < d->vertex[t].children ? (prev_slot(d, t, k) ? w->last : -1)
                                                                 : w->child[(size_t)f * maxc + k];
  w->type[u] = t;
  for (int j = 0; j < nint; j++) {
    const cavs_input_desc *in = NULL;
    for (int i = 0; i < d->ninputs; i++)
      if (d->inputs[i].kind != CAVS_IN_REAL && d->inputs[i].slot == j) in = &d->inputs[i];
    int x = w->feat[(size_t)f * nint + j];
    if (j == in_slot) x = word;
    else if (in && in->kind == CAVS_IN_CLASS) x = -1; /* nothing to score against */
    w->feat[(size_t)u * nint + j] = x;
  }
  if (rw) memcpy(w->real + (size_t)u * rw, w->real + (size_t)f * rw, sizeof(float) * (size_t)rw);
  w->last = u;
  w->g.n = u + 1;
}

static void grow_free(Grow *w) {
  free(w->child);
  free(w->type);
  free(w->feat);
  free(w->real);
  free(w->words);
  free(w->gold);
}

int greedy_decode(cavs_model *m, const cavs_dataset *s, int batch, const GreedyOpts *o) {
  const cavs_desc *d = cavs_model_desc(m);
  int in = -1;
  for (int i = 0; i < d->ninputs; i++)
    if (!strcmp(d->inputs[i].name, o->input)) in = i;
  if (in < 0 || d->inputs[in].kind != CAVS_IN_INDEX)
    die(1, "predict --greedy %s: the model has no index input '%s' to feed its predictions back into", o->input, o->input);
  int in_slot = d->inputs[in].slot, cls_slot = -1;
  long range = model_lin(m, d->inputs[in].width);
  for (int l = 0; l < d->nlosses && cls_slot < 0; l++)
    if (d->losses[l].kind == CAVS_LOSS_SOFTMAX_XENT) cls_slot = d->inputs[d->losses[l].input].slot;
  if (cls_slot < 0) die(1, "predict --greedy: the model has no softmax_xent loss, so its vertices predict no word");
  int rw = 0;
  for (int i = 0; i < d->ninputs; i++)
    if (d->inputs[i].kind == CAVS_IN_REAL) rw += (int)model_lin(m, d->inputs[i].width);
  int n = cavs_dataset_count(s);
  Grow *gw = alloc_or_die(sizeof(Grow) * (size_t)(batch > n ? (n ? n : 1) : batch));
  const cavs_graph **gs = alloc_or_die(sizeof(cavs_graph *) * (size_t)batch);
  int *act = alloc_or_die(sizeof(int) * (size_t)batch);
  long right = 0, scored = 0, steps = 0;
  bool tty = isatty(2);
  double shown = -1; /* the first pass is shown, then one every 0.1 s */
  cavs_model_set_inference(m, 1);
  for (int b = 0; b < n; b += batch) {
    int k = n - b < batch ? n - b : batch;
    for (int i = 0; i < k; i++) grow_init(&gw[i], d, cavs_dataset_graph(s, b + i), b + i, o->input, in_slot, cls_slot, rw,
                                     o->max_steps);
    int na = k;
    for (int i = 0; i < k; i++) act[i] = i;
    while (na > 0) {
      for (int i = 0; i < na; i++) gs[i] = &gw[act[i]].g;
      cavs_stats st;
      errno = 0;
      if (cavs_model_forward(m, gs, na, &st)) lib_die(cavs_model_error(m));
      steps++;
      if (tty && (shown < 0 || now() - shown > 0.1)) {
        shown = now();
        fprintf(stderr, "\rpredict --greedy: graphs %d-%d of %d: step %d, %d of them decoding\033[K", b + 1, b + k, n,
                gw[act[0]].nwords + 1, na);
      }
      int keepn = 0;
      for (int i = 0; i < na; i++) {
        Grow *w = &gw[act[i]];
        int word = cavs_model_vertex_class(m, i, w->last);
        if (word < 0) die(1, "predict --greedy: graph %d: the decoder step predicted no class", b + act[i]);
        w->words[w->nwords++] = word;
        bool done = word == o->stop || w->nwords >= w->max;
        if (!done && word >= range)
          die(1, "predict --greedy: graph %d: the predicted class %d is not a value of '%s' (0 to %ld)", b + act[i], word,
              o->input, range - 1);
        if (!done) {
          grow_step(w, d, in_slot, word, rw);
          act[keepn++] = act[i];
        }
      }
      na = keepn;
    }
    for (int i = 0; i < k; i++) {
      Grow *w = &gw[i];
      for (int j = 0; j < w->nwords; j++) printf(j ? " %d" : "%d", w->words[j]);
      printf("\n");
      for (int j = 0; j < w->ngold; j++) {
        if (w->gold[j] < 0) continue;
        scored++;
        right += j < w->nwords && w->words[j] == w->gold[j];
      }
      grow_free(w);
    }
  }
  cavs_model_set_inference(m, 0);
  if (tty) fprintf(stderr, "\r\033[K");
  if (scored)
    fprintf(stderr, "greedy decoding: %d graphs, %ld of %ld target words right (%.4f), %ld forward passes\n", n, right,
            scored, (double)right / (double)scored, steps);
  free(gw);
  free(gs);
  free(act);
  return 0;
}

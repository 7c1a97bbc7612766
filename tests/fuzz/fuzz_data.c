/* fuzz_data.c: libFuzzer target for one data loader of runtime/data.c, chosen at build
 * time: -DFORMAT='"ptb-tree"', '"text"' or '"cgf"'. The input is the data file. The
 * loader takes a path, so the input is written to a memfd and read back through
 * /proc/self/fd (no disk, nothing added to the library).
 *
 * Each input is loaded once per configuration below: models whose blocks and inputs
 * differ (the generated examples, and tests/fuzz/mix.vf compiled by tests/fuzz/run), with and
 * without dims, with a vocabulary that grows or a fixed one. A load that succeeds must
 * give graphs that training accepts: what cavs_model_forward (scheduler.c) checks before
 * it runs, checked here in the same terms; one that fails must say why, with none of the
 * file's control bytes in the message. FUZZ_VERBOSE=1 in the environment prints
 * what each load gave. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cavs.h"
#include "memfile.h"
#include "lstm_lm.h"
#include "mix.h"
#include "treelstm.h"
#include "twotype.h"

#ifndef FORMAT
#error "build with -DFORMAT='\"ptb-tree\"' (or text, cgf)"
#endif

typedef struct Config {
  const cavs_desc *d;
  int with_dims; /* else dims = NULL */
  int grow;      /* else a fixed vocabulary */
} Config;

static const Config configs[] = {
#if defined(FORMAT_TEXT)
    {&lstm_lm_desc, 0, 1},
    {&treelstm_desc, 1, 0},
    {&mix_desc, 1, 1},
#elif defined(FORMAT_CGF)
    {&twotype_desc, 1, 1},
    {&twotype_desc, 0, 1},
    {&mix_desc, 1, 1},
#else
    {&treelstm_desc, 1, 1},
    {&twotype_desc, 0, 0},
    {&mix_desc, 1, 1},
#endif
};

static long lin(const cavs_lin *l, const long *dims) {
  long v = l->k;
  for (int i = 0; i < CAVS_MAX_DIMS; i++) v += (long)l->c[i] * dims[i];
  return v;
}

#define CHECK(cond, ...)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      fprintf(stderr, "fuzz_data (%s, model %s, dims %s, grow %d): ", FORMAT, d->name,    \
              c->with_dims ? "given" : "NULL", c->grow);                                  \
      fprintf(stderr, __VA_ARGS__);                                                       \
      fputc('\n', stderr);                                                                \
      abort();                                                                            \
    }                                                                                     \
  } while (0)

/* What a loaded dataset promises: every graph one that cavs_model_forward accepts. */
static void check_dataset(const Config *c, const cavs_dataset *s, const long *dims, const cavs_vocab *v) {
  const cavs_desc *d = c->d;
  int maxc = 0;
  for (int t = 0; t < d->nvertex; t++)
    if (d->vertex[t].children > maxc) maxc = d->vertex[t].children;
  long total = 0;
  int n = cavs_dataset_count(s);
  CHECK(n > 0, "a dataset with no graphs");
  long realw = 0; /* real inputs are read from cgf only */
#ifdef FORMAT_CGF
  for (int i = 0; i < d->ninputs; i++)
    if (d->inputs[i].kind == CAVS_IN_REAL) realw += lin(&d->inputs[i].width, dims);
#endif
  int *state = NULL;
  for (int g = 0; g < n; g++) {
    const cavs_graph *G = cavs_dataset_graph(s, g);
    CHECK(G->n > 0, "graph %d has %d vertices", g, G->n);
    /* (a set's slots shrink to what the data fills; every named slot stays) */
    CHECK(G->maxc >= maxc && G->maxc >= 1, "graph %d: maxc %d, the model's largest block takes %d", g, G->maxc, maxc);
    CHECK(G->slots >= 0 && G->slots <= G->maxc, "graph %d: slots %d of %d", g, G->slots, G->maxc);
    for (int x = 0; x < G->n; x++)
      for (int k = G->slots; k < G->maxc; k++)
        CHECK(G->child[(size_t)x * (size_t)G->maxc + (size_t)k] < 0, "graph %d, vertex %d: slot %d past slots %d", g, x, k,
              G->slots);
    total += G->n;
    for (int x = 0; x < G->n; x++) {
      int t = G->type ? G->type[x] : 0;
      CHECK(t >= 0 && t < d->nvertex, "graph %d, vertex %d: type %d", g, x, t);
      for (int k = 0; k < G->maxc; k++) {
        int ch = G->child[(size_t)x * G->maxc + k];
        CHECK(ch >= -1 && ch < G->n, "graph %d, vertex %d: child %d", g, x, ch);
        CHECK(ch < 0 || k < d->vertex[t].children,
              "graph %d, vertex %d: a child in slot %d, but its block '%s' takes %d", g, x, k,
              d->vertex[t].name, d->vertex[t].children);
      }
      for (int i = 0; i < d->ninputs; i++) {
        const cavs_input_desc *in = &d->inputs[i];
        if (in->kind == CAVS_IN_REAL) continue;
        int f = G->feat[(size_t)x * d->nint + in->slot];
        CHECK(f >= -1, "graph %d, vertex %d: input %s is %d", g, x, in->name, f);
        /* the bound: a word id is below the vocabulary's size; with dims, a value is below
           its range unless that range is the vocabulary (cgf binds it from the data) */
        bool vocab_range = false;
        for (int k = 0; k < d->ndims; k++)
          if (in->width.c[k] && d->dims[k].kind == CAVS_DIM_VOCAB) vocab_range = true;
#ifndef FORMAT_CGF
        bool token = in->kind == CAVS_IN_INDEX;
        for (int j = 0; j < i; j++)
          if (d->inputs[j].kind == CAVS_IN_INDEX) token = false;
        if (token) CHECK(f < cavs_vocab_size(v), "graph %d, vertex %d: word id %d of %d", g, x, f, cavs_vocab_size(v));
#ifdef FORMAT_TEXT
        continue; /* labels are next-token ids, unchecked by design (man 5 cavs-data) */
#endif
#endif
        if (c->with_dims && !vocab_range) {
          long bound = lin(&in->width, dims);
          CHECK(f < bound, "graph %d, vertex %d: input %s is %d, outside -1..%ld", g, x, in->name, f, bound - 1);
        }
      }
      for (long j = 0; j < realw; j++)
        CHECK(isfinite(G->real[(size_t)x * (size_t)realw + (size_t)j]), "graph %d, vertex %d: real %ld", g, x, j);
    }
    /* acyclic: a depth-first search, iterative, 0 new, 1 on the stack, 2 done */
    state = realloc(state, sizeof(int) * 2 * (size_t)G->n);
    int *stack = state + G->n;
    memset(state, 0, sizeof(int) * (size_t)G->n);
    for (int root = 0; root < G->n; root++) {
      if (state[root]) continue;
      int sp = 0;
      stack[sp++] = root;
      state[root] = 1;
      while (sp) {
        int x = stack[sp - 1], next = -1;
        for (int k = 0; k < G->maxc && next < 0; k++) {
          int ch = G->child[(size_t)x * G->maxc + k];
          if (ch < 0) continue;
          CHECK(state[ch] != 1, "graph %d: a cycle through vertex %d", g, ch);
          if (!state[ch]) next = ch;
        }
        if (next < 0) {
          state[x] = 2;
          sp--;
        } else {
          state[next] = 1;
          stack[sp++] = next;
        }
      }
    }
  }
  free(state);
  CHECK(total == cavs_dataset_vertices(s), "%ld vertices in the graphs, %ld in the dataset", total,
        cavs_dataset_vertices(s));
  for (int slot = 0; slot <= d->nint; slot++) (void)cavs_dataset_max_feature(s, slot);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = mf_write("fuzz-data", data, size);
  for (size_t i = 0; i < sizeof configs / sizeof *configs; i++) {
    const Config *c = &configs[i];
    long dims[CAVS_MAX_DIMS] = {0};
    cavs_dims_default(c->d, dims);
    for (int k = 0; k < c->d->ndims; k++)
      if (c->d->dims[k].kind == CAVS_DIM_VOCAB) dims[k] = 50;
    cavs_vocab *v = cavs_vocab_new();
    if (!c->grow) {
      /* a fixed vocabulary, as for dev data: some of the seeds' words */
      static const char *words[] = {"w0", "w1", "w2", "w3", "w5", "w8", "w13", "the", "cat", "a"};
      for (size_t w = 0; w < sizeof words / sizeof *words; w++) cavs_vocab_id(v, words[w], strlen(words[w]), 1);
    }
    char err[256];
    err[0] = 0;
    cavs_dataset *s = cavs_dataset_load(path, FORMAT, c->d, c->with_dims ? dims : NULL, v, c->grow, err, sizeof err);
    if (s) {
      check_dataset(c, s, dims, v);
      cavs_dataset_free(s);
    } else {
      const cavs_desc *d = c->d;
      CHECK(err[0], "NULL without a message");
      /* the file's bytes shown escaped (cv_shown): no control byte, C0 or C1, reaches a
         terminal through the message */
      for (const unsigned char *p = (const unsigned char *)err; *p; p++)
        CHECK(*p >= 0x20 && *p != 0x7f && !(p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0),
              "a control byte 0x%02x at byte %d of the message: %s", *p == 0xc2 ? p[1] : *p, (int)(p - (const unsigned char *)err), err);
    }
    if (getenv("FUZZ_VERBOSE"))
      fprintf(stderr, "%s (dims %s, grow %d): %s\n", c->d->name, c->with_dims ? "given" : "NULL", c->grow,
              s ? "loaded" : err);
    cavs_vocab_free(v);
  }
  return 0;
}

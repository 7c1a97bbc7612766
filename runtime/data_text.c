/* data_text.c: the `text` format (cavs-data(5)): one sentence a line, each a chain whose
 * vertex i reads token i and is labeled with token i+1, <eos> last (a language model's
 * next-token targets). */
#include "data.h"

static int parse_text(cavs_dataset *s, const Shape *sh, cavs_vocab *v, int add, const char *line, size_t len,
                      const char *path, long lineno, char *err, size_t errlen) {
  long first = s->nv;
  char why[128];
#define TEXT_FAIL(msg)                                                 \
  do {                                                                 \
    snprintf(err, errlen, "%s:%ld: error: %s", path, lineno, msg);   \
    s->nv = first;                                                     \
    return -1;                                                         \
  } while (0)
  int prev_word = -1;
  for (size_t i = 0; i < len;) {
    while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
    if (i == len) break;
    size_t a = i;
    while (i < len && line[i] != ' ' && line[i] != '\t') i++;
    int w = cavs_vocab_id(v, line + a, i - a, add);
    if (w < 0) TEXT_FAIL(cavs_vocab_size(v) >= CAVS_MAX_DIM ? "the vocabulary is full (16777216 words)" : "out of memory");
    if (s->nv > first && sh->label_slot >= 0) s->feat[(s->nv - 1) * s->nint + sh->label_slot] = w;
    if (cv_add_vertex(s, first, why, sizeof why)) TEXT_FAIL(why);
    long id = s->nv - 1;
    if (id > first) s->child[id * s->maxc] = (int)(id - 1 - first);
    s->type[id] = sh->inner_type;
    if (sh->word_slot >= 0) s->feat[id * s->nint + sh->word_slot] = w;
    prev_word = w;
  }
  (void)prev_word;
  if (s->nv == first) {
    snprintf(err, errlen, "%s:%ld: error: empty line", path, lineno);
    return -1;
  }
  if (sh->label_slot >= 0) s->feat[(s->nv - 1) * s->nint + sh->label_slot] = 1; /* <eos> */
  if (cv_add_graph(s, first, why, sizeof why)) TEXT_FAIL(why);
  return 0;
#undef TEXT_FAIL
}

static int text_begin(CvLoad *l, void **state) {
  (void)l;
  *state = NULL; /* a line is a whole graph: nothing to keep between lines */
  return 0;
}

static int text_line(CvLoad *l, void *state, char *line, size_t len) {
  (void)state;
  return parse_text(l->s, l->sh, l->v, l->grow, line, len, l->path, l->lineno, l->err, l->errlen);
}

static int text_end(CvLoad *l, void *state, int rc) {
  (void)l, (void)state;
  return rc;
}

const CvFormat cv_format_text = {"text", false, text_begin, text_line, text_end, true};

/* The `text-bptt` format: the file as one stream of tokens, each line followed by
 * <eos>, cut into chains of CV_BPTT tokens, or N with `text-bptt:N` (CvLoad.bptt; the
 * last chain shorter), each vertex labeled
 * with the token after it in the stream, across lines and chains (the stream's last
 * token, with none after it, unlabeled): a language model trained as on PTB since
 * Zaremba et al. (2014), truncated back-propagation through time, each chain starting
 * from zero state. The chains of a minibatch are then of one length, so every task is
 * one step of all of them and every gather a view of the state (scheduler.c). */
typedef struct Bptt {
  long first; /* the open chain's first vertex, or -1 */
  int len;    /* its vertices */
} Bptt;

static int bptt_begin(CvLoad *l, void **state) {
  (void)l;
  Bptt *b = malloc(sizeof *b);
  if (!b) return -1;
  *b = (Bptt){-1, 0};
  *state = b;
  return 0;
}

/* token w of the stream: the label of the open chain's last vertex, then the open
   chain's next vertex, or the first of a new one (the full one closed) */
static int bptt_token(CvLoad *l, Bptt *b, int w) {
  cavs_dataset *s = l->s;
  const Shape *sh = l->sh;
  char why[128];
  if (b->first >= 0 && sh->label_slot >= 0) s->feat[(s->nv - 1) * s->nint + sh->label_slot] = w;
  if (b->first >= 0 && b->len == l->bptt) {
    if (cv_add_graph(s, b->first, why, sizeof why)) goto fail;
    b->first = -1;
  }
  if (b->first < 0) b->first = s->nv, b->len = 0;
  if (cv_add_vertex(s, b->first, why, sizeof why)) goto fail;
  long id = s->nv - 1;
  if (id > b->first) s->child[id * s->maxc] = (int)(id - 1 - b->first);
  s->type[id] = sh->inner_type;
  if (sh->word_slot >= 0) s->feat[id * s->nint + sh->word_slot] = w;
  b->len++;
  return 0;
fail:
  snprintf(l->err, l->errlen, "%s:%ld: error: %s", l->path, l->lineno, why);
  return -1;
}

static int bptt_line(CvLoad *l, void *state, char *line, size_t len) {
  Bptt *b = state;
  for (size_t i = 0; i <= len;) {
    while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
    size_t a = i;
    while (i < len && line[i] != ' ' && line[i] != '\t') i++;
    if (a == len && i == len) { /* the line's end: <eos>, a token of the stream too */
      if (bptt_token(l, b, 1)) return -1;
      break;
    }
    int w = cavs_vocab_id(l->v, line + a, i - a, l->grow);
    if (w < 0) {
      snprintf(l->err, l->errlen, "%s:%ld: error: %s", l->path, l->lineno,
               cavs_vocab_size(l->v) >= CAVS_MAX_DIM ? "the vocabulary is full (16777216 words)" : "out of memory");
      return -1;
    }
    if (bptt_token(l, b, w)) return -1;
  }
  return 0;
}

static int bptt_end(CvLoad *l, void *state, int rc) {
  Bptt *b = state;
  char why[128];
  if (!rc && b->first >= 0 && cv_add_graph(l->s, b->first, why, sizeof why)) {
    snprintf(l->err, l->errlen, "%s:%ld: error: %s", l->path, l->lineno, why);
    rc = -1;
  }
  free(b);
  return rc;
}

const CvFormat cv_format_text_bptt = {"text-bptt", false, bptt_begin, bptt_line, bptt_end, false};

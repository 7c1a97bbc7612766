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

const CvFormat cv_format_text = {"text", false, text_begin, text_line, text_end};

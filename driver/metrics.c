/* metrics.c: what a paper reports of a classifier, from the predictions cavs eval's
 * passes already make (cavs_model_vertex_class): labels against predictions counted
 * over every labeled vertex and over the roots, the confusion matrix, each class's
 * precision, recall and F1 with their macro and weighted averages, and SST's binary
 * setting (--binary): labels 0-1 negative, 3-4 positive, neutral (2) dropped; a
 * prediction merged the same way, a neutral one wrong, as Stanford's sentiment
 * evaluation counts it. Printed as text or set into eval --json's object. */
#include "driver.h"

#include <stdlib.h>
#include <string.h>

enum { NEGATIVE, POSITIVE, NEUTRAL }; /* the binary setting's classes */

static void confusion_init(Confusion *c, int rows, int cols) {
  c->rows = rows, c->cols = cols;
  c->support = xmalloc(sizeof(long) * (size_t)rows);
  c->tp = xmalloc(sizeof(long) * (size_t)rows);
  c->predicted = xmalloc(sizeof(long) * (size_t)cols);
  memset(c->support, 0, sizeof(long) * (size_t)rows);
  memset(c->tp, 0, sizeof(long) * (size_t)rows);
  memset(c->predicted, 0, sizeof(long) * (size_t)cols);
  if (rows > CONFUSION_MAX) return;
  c->matrix = xmalloc(sizeof(long) * (size_t)rows * (size_t)cols);
  memset(c->matrix, 0, sizeof(long) * (size_t)rows * (size_t)cols);
}

Scores *scores_new(int classes, int slot, bool binary) {
  Scores *s = xmalloc(sizeof *s);
  *s = (Scores){.binary = binary, .slot = slot};
  int rows = binary ? 2 : classes, cols = binary ? 3 : classes;
  confusion_init(&s->all, rows, cols);
  confusion_init(&s->roots, rows, cols);
  return s;
}

/* SST's five classes, two of them: 0-1 negative, 3-4 positive, 2 neutral (-1: none) */
static int merged(int c) { return c < 0 || c > 4 ? -1 : c <= 1 ? NEGATIVE : c == 2 ? NEUTRAL : POSITIVE; }

static void count(Confusion *c, int y, int p) {
  c->total++;
  c->support[y]++;
  c->predicted[p]++;
  c->tp[y] += y == p;
  if (c->matrix) c->matrix[(size_t)y * (size_t)c->cols + (size_t)p]++;
}

/* A minibatch's vertices: those labeled (in range; with binary, not neutral) that have a
   prediction, and of them the roots (no parent, as the runtime's root accuracy has it). */
void scores_add(Scores *s, const cavs_model *m, const cavs_graph *const *gs, int k) {
  const cavs_desc *d = cavs_model_desc(m);
  for (int g = 0; g < k; g++) {
    const cavs_graph *gr = gs[g];
    if (!gr->feat) continue;
    bool *parent = calloc((size_t)gr->n + 1, 1);
    if (!parent) die(2, "out of memory");
    for (size_t i = 0; gr->child && i < (size_t)gr->n * (size_t)gr->maxc; i++)
      if (gr->child[i] >= 0 && gr->child[i] < gr->n) parent[gr->child[i]] = true;
    for (int v = 0; v < gr->n; v++) {
      int y = gr->feat[(size_t)v * (size_t)d->nint + (size_t)s->slot], p = cavs_model_vertex_class(m, g, v);
      if (s->binary) y = merged(y) == NEUTRAL ? -1 : merged(y), p = merged(p);
      if (y < 0 || y >= s->all.rows || p < 0 || p >= s->all.cols) continue;
      count(&s->all, y, p);
      if (!parent[v]) count(&s->roots, y, p);
    }
    free(parent);
  }
}

/* ---- the scores ---- */

typedef struct Prf {
  double precision, recall, f1;
} Prf;

/* Class k's: a class never predicted has precision 0, one never labeled recall 0 (and
   F1 0 where both are), as scikit-learn's zero_division=0. */
static Prf prf(const Confusion *c, int k) {
  Prf s = {ratio(c->tp[k], c->predicted[k]), ratio(c->tp[k], c->support[k]), 0};
  if (s.precision + s.recall > 0) s.f1 = 2 * s.precision * s.recall / (s.precision + s.recall);
  return s;
}

/* The mean over the classes that were labeled or predicted (as scikit-learn's labels
   default), and the mean weighted by each class's support. */
static void averages(const Confusion *c, Prf *macro, Prf *weighted) {
  *macro = *weighted = (Prf){0};
  int present = 0;
  for (int k = 0; k < c->rows; k++) {
    Prf s = prf(c, k);
    double w = ratio(c->support[k], c->total);
    weighted->precision += w * s.precision, weighted->recall += w * s.recall, weighted->f1 += w * s.f1;
    if (!c->support[k] && !c->predicted[k]) continue;
    present++;
    macro->precision += s.precision, macro->recall += s.recall, macro->f1 += s.f1;
  }
  if (present) macro->precision /= present, macro->recall /= present, macro->f1 /= present;
}

long scores_correct(const Confusion *c) {
  long n = 0;
  for (int k = 0; k < c->rows; k++) n += c->tp[k];
  return n;
}

/* ---- as text ---- */

static const char *class_name(const Scores *s, int k) {
  static const char *const names[] = {"neg", "pos", "neutral"};
  static char buf[16];
  if (s->binary) return names[k];
  snprintf(buf, sizeof buf, "%d", k);
  return buf;
}

static void print_confusion(FILE *f, const Scores *s, const Confusion *c, const char *what) {
  fprintf(f, "%s: label (rows) by prediction (columns)\n%8s", what, "");
  for (int p = 0; p < c->cols; p++) fprintf(f, " %8s", class_name(s, p));
  fputc('\n', f);
  for (int y = 0; y < c->rows; y++) {
    fprintf(f, "%8s", class_name(s, y));
    for (int p = 0; p < c->cols; p++) fprintf(f, " %8ld", c->matrix[(size_t)y * (size_t)c->cols + (size_t)p]);
    fputc('\n', f);
  }
  fprintf(f, "%8s %9s %9s %9s %9s\n", "class", "precision", "recall", "f1", "support");
  for (int k = 0; k < c->rows; k++) {
    Prf p = prf(c, k);
    fprintf(f, "%8s %9.4f %9.4f %9.4f %9ld\n", class_name(s, k), p.precision, p.recall, p.f1, c->support[k]);
  }
  Prf macro, weighted;
  averages(c, &macro, &weighted);
  fprintf(f, "%8s %9.4f %9.4f %9.4f\n%8s %9.4f %9.4f %9.4f %9ld\n", "macro", macro.precision, macro.recall, macro.f1,
          "weighted", weighted.precision, weighted.recall, weighted.f1, c->total);
}

void scores_print(FILE *f, const Scores *s) {
  if (s->all.rows > 20) return;
  print_confusion(f, s, &s->all, fmt("all %ld %svertices", s->all.total, s->binary ? "non-neutral " : "labeled "));
  print_confusion(f, s, &s->roots, fmt("%ld %sroots", s->roots.total, s->binary ? "non-neutral " : "labeled "));
}

/* ---- as JSON ---- */

static json_t *prf_json(Prf p) {
  json_t *o = json_object();
  json_set(o, "precision", json_num(p.precision));
  json_set(o, "recall", json_num(p.recall));
  json_set(o, "f1", json_num(p.f1));
  return o;
}

/* "PREFIXclasses", "PREFIXmacro", "PREFIXweighted" and "PREFIXconfusion" */
static void confusion_json(json_t *o, const Confusion *c, const char *prefix) {
  json_t *classes = json_array();
  for (int k = 0; k < c->rows; k++) {
    json_t *e = prf_json(prf(c, k));
    json_set(e, "count", json_integer(c->support[k]));
    json_set(e, "correct", json_integer(c->tp[k]));
    json_set(e, "predicted", json_integer(c->predicted[k]));
    json_push(classes, e);
  }
  json_set(o, fmt("%sclasses", prefix), classes);
  Prf macro, weighted;
  averages(c, &macro, &weighted);
  json_set(o, fmt("%smacro", prefix), prf_json(macro));
  json_set(o, fmt("%sweighted", prefix), prf_json(weighted));
  if (!c->matrix) return;
  json_t *rows = json_array();
  for (int y = 0; y < c->rows; y++) {
    json_t *row = json_array();
    for (int p = 0; p < c->cols; p++) json_push(row, json_integer(c->matrix[(size_t)y * (size_t)c->cols + (size_t)p]));
    json_push(rows, row);
  }
  json_set(o, fmt("%sconfusion", prefix), rows);
}

void scores_json(json_t *o, const Scores *s) {
  if (s->binary) {
    json_t *b = json_object(), *cols = json_array();
    json_t *neg = json_array(), *pos = json_array(), *dropped = json_array();
    json_push(neg, json_integer(0)), json_push(neg, json_integer(1));
    json_push(pos, json_integer(3)), json_push(pos, json_integer(4));
    json_push(dropped, json_integer(2));
    for (int k = 0; k < 3; k++) json_push(cols, json_string(k == NEGATIVE ? "negative" : k == POSITIVE ? "positive" : "neutral"));
    json_set(b, "negative", neg);
    json_set(b, "positive", pos);
    json_set(b, "dropped", dropped);
    json_set(b, "columns", cols);
    json_set(o, "binary", b);
  }
  confusion_json(o, &s->all, "");
  confusion_json(o, &s->roots, "root_");
}

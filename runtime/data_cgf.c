/* data_cgf.c: the `cgf` format (cavs-data(5)), any acyclic graph with vertices of
 * several types and any of the model's inputs. */
#include "data.h"

#include <errno.h>
#include <float.h>

/* A file is a sequence of
 *
 *   graph
 *   ID TYPE [CHILD|- ...] [; NAME=VALUE ...]      one line per vertex, IDs 0, 1, ... in order
 *   end
 *
 * TYPE names a vertex block; CHILD is another vertex's ID (any order: a DAG), `-` an empty
 * slot; VALUE is an integer for index and class inputs, comma-separated numbers for real
 * inputs. `#` starts a comment. A cycle is an error. */
typedef struct Cgf {
  const cavs_desc *d;
  const long *dims;
  long first;        /* first vertex of the open graph, or -1 */
  long first_line;
  int *pending;      /* scratch for the cycle check */
  long cappending;
  long *vline;       /* line of each vertex of the open graph */
  long capvline;
} Cgf;

static char *next_word(char **p) {
  while (**p == ' ' || **p == '\t') (*p)++;
  if (!**p) return NULL;
  char *w = *p;
  while (**p && **p != ' ' && **p != '\t') (*p)++;
  if (**p) *(*p)++ = 0;
  return w;
}

/* Kahn's peeling from the leaves over the open graph's n vertices (children ch, maxc a
 * vertex): pend[v] is left at the number of v's children never done, queue holds the
 * vertices done in order. Returns how many were done (n when there is no cycle), or -1
 * without the memory for the reverse edges. */
static long peel(const int *ch, int maxc, long n, int *pend, int *queue) {
  long head = 0, tail = 0;
  for (long v = 0; v < n; v++) {
    pend[v] = 0;
    for (int k = 0; k < maxc; k++) pend[v] += ch[v * maxc + k] >= 0;
    if (!pend[v]) queue[tail++] = (int)v;
  }
  /* a parent's pending count drops when a child is done: walk parents by scanning is
     O(n * maxc) per done vertex in the worst case, so build the reverse edges once */
  long ne = 0;
  for (long v = 0; v < n * maxc; v++) ne += ch[v] >= 0;
  int *off = calloc((size_t)n + 1, sizeof(int)), *adj = malloc(sizeof(int) * (size_t)(ne + 1));
  int *fill = malloc(sizeof(int) * (size_t)(n + 1));
  if (!off || !adj || !fill) {
    free(off);
    free(adj);
    free(fill);
    errno = ENOMEM;
    return -1;
  }
  for (long v = 0; v < n; v++)
    for (int k = 0; k < maxc; k++)
      if (ch[v * maxc + k] >= 0) off[ch[v * maxc + k] + 1]++;
  for (long v = 0; v < n; v++) off[v + 1] += off[v];
  memcpy(fill, off, sizeof(int) * (size_t)n);
  for (long v = 0; v < n; v++)
    for (int k = 0; k < maxc; k++)
      if (ch[v * maxc + k] >= 0) adj[fill[ch[v * maxc + k]]++] = (int)v;
  while (head < tail) {
    int v = queue[head++];
    for (int e = off[v]; e < off[v + 1]; e++)
      if (--pend[adj[e]] == 0) queue[tail++] = adj[e];
  }
  free(off);
  free(adj);
  free(fill);
  return tail;
}

/* After peel() left `done` of n vertices done: the smallest vertex on a cycle. What is
 * left waits on a cycle or on a vertex that does; following a child that is still
 * waiting n times lands on the cycle itself, then once round it finds its smallest. */
static long on_cycle(const int *ch, int maxc, long n, const int *pend, long done) {
  long v = 0;
  while (pend[v] == 0) v++;
  for (long step = 0; step < n; step++)
    for (int k = 0; k < maxc; k++) {
      int w = ch[v * maxc + k];
      if (w >= 0 && pend[w] > 0) {
        v = w;
        break;
      }
    }
  long best = v, u = v;
  do {
    for (int k = 0; k < maxc; k++) {
      int w = ch[u * maxc + k];
      if (w >= 0 && pend[w] > 0) {
        u = w;
        break;
      }
    }
    if (u < best) best = u;
  } while (u != v && best >= 0 && ++done < 2 * n + 2);
  return best;
}

/* The open graph closed at `end` on line lineno: every child inside it, no cycle; then
 * added to the data set. 0, or -1 with the message. */
static int cgf_close(cavs_dataset *s, Cgf *c, const char *path, long lineno, char *err, size_t errlen) {
  long n = s->nv - c->first;
  if (n == 0) {
    snprintf(err, errlen, "%s:%ld: error: empty graph", path, c->first_line);
    return -1;
  }
  for (long v = 0; v < n; v++)
    for (int k = 0; k < s->maxc; k++) {
      int ch = s->child[(c->first + v) * s->maxc + k];
      if (ch >= n) {
        snprintf(err, errlen, "%s:%ld: error: vertex %ld: child %d is not in this graph (it has %ld vertices)", path,
                 c->vline[v], v, ch, n);
        return -1;
      }
    }
  if (n + 1 > c->cappending) {
    if (!cv_grow_array(&c->pending, sizeof(int), (size_t)(2 * n + 2))) {
      snprintf(err, errlen, "%s:%ld: error: out of memory for a graph of %ld vertices", path, c->first_line, n);
      return -1;
    }
    c->cappending = n + 1;
  }
  int *pend = c->pending, *queue = c->pending + n + 1;
  const int *ch = s->child + c->first * s->maxc;
  long done = peel(ch, s->maxc, n, pend, queue);
  if (done < 0) {
    snprintf(err, errlen, "%s:%ld: error: out of memory for a graph of %ld vertices", path, c->first_line, n);
    return -1;
  }
  if (done < n) {
    long v = on_cycle(ch, s->maxc, n, pend, done);
    snprintf(err, errlen, "%s:%ld: error: the graph has a cycle through vertex %ld", path, c->vline[v], v);
    return -1;
  }
  char why[128];
  if (cv_add_graph(s, c->first, why, sizeof why)) {
    snprintf(err, errlen, "%s:%ld: error: %s", path, lineno, why);
    return -1;
  }
  c->first = -1;
  return 0;
}

/* "PATH:LINE: error: ..." into err, and -1 from the function: each parser of a line
   below has path, lineno, err and errlen. */
#define CGF_FAIL(...)                                                                    \
  do {                                                                                   \
    int at_ = snprintf(err, errlen, "%s:%ld: error: ", path, lineno);                   \
    snprintf(err + at_, errlen > (size_t)at_ ? errlen - (size_t)at_ : 0, __VA_ARGS__);  \
    return -1;                                                                           \
  } while (0)

/* A vertex's ID (the word w), TYPE and children, p past the ID: the vertex added to s,
   its ID in *id. */
static int cgf_vertex(cavs_dataset *s, Cgf *c, char *w, char **p, long *id, const char *path, long lineno, char *err,
                      size_t errlen) {
  const cavs_desc *d = c->d;
  char *end;
  *id = strtol(w, &end, 10);
  if (*end || *id != s->nv - c->first)
    CGF_FAIL("expected vertex %ld, found '%s' (vertices are numbered 0, 1, ... in order)", s->nv - c->first, CV_SHOW(w));
  char *tname = next_word(p);
  if (!tname) CGF_FAIL("vertex %ld has no type", *id);
  int type = -1;
  for (int t = 0; t < d->nvertex; t++)
    if (!strcmp(d->vertex[t].name, tname)) type = t;
  if (type < 0) CGF_FAIL("unknown vertex type '%s' (model '%s' has %d vertex blocks)", CV_SHOW(tname), d->name, d->nvertex);
  char why[128];
  if (cv_add_vertex(s, c->first, why, sizeof why)) CGF_FAIL("%s", why);
  long v = s->nv - 1;
  s->type[v] = type;
  if (*id + 1 > c->capvline) {
    if (!cv_grow_array(&c->vline, sizeof(long), (size_t)(2 * (*id + 1)))) CGF_FAIL("out of memory after %ld vertices", *id);
    c->capvline = 2 * (*id + 1);
  }
  c->vline[*id] = lineno;
  int slot = 0;
  while ((w = next_word(p))) {
    if (slot >= cv_type_children(d, type))
      CGF_FAIL("vertex %ld: more than %d children for type '%s'", *id, cv_type_children(d, type), tname);
    if (strcmp(w, "-")) {
      long ch = strtol(w, &end, 10);
      if (*end || ch < 0 || ch > 1000000000L) CGF_FAIL("vertex %ld: '%s' is not a vertex number", *id, CV_SHOW(w));
      s->child[v * s->maxc + slot] = (int)ch;
    }
    slot++;
  }
  return 0;
}

/* Real input `in` (named w) of the last vertex (id): the comma-separated values q. */
static int cgf_reals(cavs_dataset *s, const Cgf *c, int in, long id, const char *w, char *q, const char *path,
                     long lineno, char *err, size_t errlen) {
  const cavs_desc *d = c->d;
  long off = 0, v = s->nv - 1;
  for (int i = 0; i < in; i++)
    if (d->inputs[i].kind == CAVS_IN_REAL) off += cv_lin(&d->inputs[i].width, c->dims);
  long width = cv_lin(&d->inputs[in].width, c->dims), k = 0;
  for (char *end; *q; k++) {
    double x = cv_strtod(q, &end);
    if (end == q || !isfinite(x)) CGF_FAIL("vertex %ld: '%s' is not a number", id, CV_SHOW(q));
    /* graphs hold floats: a finite double beyond them would become an infinity */
    if (fabs(x) > FLT_MAX)
      CGF_FAIL("vertex %ld: %s is out of the range of a float", id, cv_shown((char[CV_SHOWN]){0}, q, (size_t)(end - q)));
    if (k >= width) CGF_FAIL("vertex %ld: more than %ld values for '%s'", id, width, w);
    s->real[v * s->realw + off + k] = (float)x;
    q = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') CGF_FAIL("vertex %ld: '%s' is not a number", id, CV_SHOW(end));
  }
  if (k != width) CGF_FAIL("vertex %ld: '%s' needs %ld values, found %ld", id, w, width, k);
  return 0;
}

/* The last vertex's (id) inputs, the words of p: NAME=VALUE, each input at most once. */
static int cgf_inputs(cavs_dataset *s, const Cgf *c, const Shape *sh, long id, char *p, const char *path, long lineno,
                      char *err, size_t errlen) {
  const cavs_desc *d = c->d;
  long v = s->nv - 1;
  bool seen[64] = {false};
  for (char *w; (w = next_word(&p));) {
    char *eq = strchr(w, '=');
    if (!eq) CGF_FAIL("vertex %ld: expected NAME=VALUE, found '%s'", id, CV_SHOW(w));
    *eq = 0;
    int in = -1;
    for (int i = 0; i < d->ninputs; i++)
      if (!strcmp(d->inputs[i].name, w)) in = i;
    if (in < 0) CGF_FAIL("vertex %ld: model '%s' has no input '%s'", id, d->name, CV_SHOW(w));
    const cavs_input_desc *desc = &d->inputs[in];
    if (in < 64 && seen[in]) CGF_FAIL("vertex %ld: input '%s' given twice", id, w);
    if (in < 64) seen[in] = true;
    if (desc->kind == CAVS_IN_REAL) {
      if (cgf_reals(s, c, in, id, w, eq + 1, path, lineno, err, errlen)) return -1;
      continue;
    }
    errno = 0;
    char *end;
    long x = strtol(eq + 1, &end, 10);
    long bound = c->dims ? cv_lin(&desc->width, c->dims) : 0;
    if (*end || eq[1] == 0) CGF_FAIL("vertex %ld: %s=%s is not an integer", id, w, CV_SHOW(eq + 1));
    /* unbounded (no dims, or a range bound to the data, as a vocabulary is): an id below
       the most any dim can be, so that the dim made from it (the largest id plus one)
       is one */
    bool checked = bound > 0 && bound <= CAVS_MAX_DIM && !(desc->kind == CAVS_IN_CLASS && sh->nclass == 0);
    long hi = checked ? bound - 1 : CAVS_MAX_DIM - 1;
    if (errno == ERANGE || x < -1 || x > hi) CGF_FAIL("vertex %ld: %s=%s is outside -1..%ld", id, w, CV_SHOW(eq + 1), hi);
    s->feat[v * s->nint + desc->slot] = (int)x;
  }
  return 0;
}

/* One line: `graph`, `end` (the graph closed and checked), or a vertex. Children must
   name vertices of this graph, known once it ends (cgf_close). */
static int cgf_line(cavs_dataset *s, Cgf *c, const Shape *sh, char *line, const char *path, long lineno, char *err,
                    size_t errlen) {
  char *hash = strchr(line, '#');
  if (hash) *hash = 0;
  /* the inputs follow ';', with or without spaces around it */
  char *feats = strchr(line, ';');
  if (feats) *feats++ = 0;
  char *p = line;
  char *w = next_word(&p);
  if (!w) return 0; /* blank or comment */
  if (!strcmp(w, "graph")) {
    if (c->first >= 0) CGF_FAIL("'graph' inside a graph (missing 'end' for the graph at line %ld)", c->first_line);
    c->first = s->nv;
    c->first_line = lineno;
    return 0;
  }
  if (!strcmp(w, "end")) {
    if (c->first < 0) CGF_FAIL("'end' without 'graph'");
    return cgf_close(s, c, path, lineno, err, errlen);
  }
  if (c->first < 0) CGF_FAIL("expected 'graph', found '%s'", CV_SHOW(w));
  long id;
  if (cgf_vertex(s, c, w, &p, &id, path, lineno, err, errlen)) return -1;
  return cgf_inputs(s, c, sh, id, feats ? feats : p + strlen(p), path, lineno, err, errlen);
}
#undef CGF_FAIL

static int cgf_begin(CvLoad *l, void **state) {
  Cgf *c = calloc(1, sizeof *c);
  if (!c) return -1;
  c->d = l->d;
  c->dims = l->dims;
  c->first = -1;
  *state = c;
  return 0;
}

static int cgf_line_of(CvLoad *l, void *state, char *line, size_t len) {
  (void)len;
  return cgf_line(l->s, state, l->sh, line, l->path, l->lineno, l->err, l->errlen);
}

static int cgf_end(CvLoad *l, void *state, int rc) {
  Cgf *c = state;
  if (!rc && c->first >= 0) {
    snprintf(l->err, l->errlen, "%s:%ld: error: the graph that starts here has no 'end'", l->path, c->first_line);
    rc = -1;
  }
  free(c->pending);
  free(c->vline);
  free(c);
  return rc;
}

const CvFormat cv_format_cgf = {"cgf", true, cgf_begin, cgf_line_of, cgf_end, true};

/* data.h: what the data loaders share. data.c reads a file line by line and hands each
 * line to a format (data_ptb.c, data_text.c, data_cgf.c), which turns it into vertices and
 * graphs with the helpers below. A new format is one new file, one CvFormat and one row in
 * data.c's table. */
#ifndef CV_DATA_H
#define CV_DATA_H

#include "cv.h"
#include "shown.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

struct cavs_dataset {
  cavs_graph *graphs;
  int n, cap;
  int maxc, nint;
  int *child, *type, *feat; /* all graphs' vertices, back to back */
  float *real;              /* [nv * realw] (cgf only) */
  long realw;
  long nv, capv;
};

/* What the loader needs to know of a model: where words and labels go, how many
 * children a vertex may have, which type a leaf and an inner vertex get. */
typedef struct Shape {
  int nint, word_slot, label_slot, maxc, leaf_type, inner_type;
  int inner_children;     /* children the inner vertices' block takes (at most maxc) */
  const char *inner_name; /* its name */
  long nclass; /* labels must be below this (0: unchecked) */
} Shape;

/* One file being read, as a format's line function sees it. */
typedef struct CvLoad {
  cavs_dataset *s;
  const Shape *sh;
  const cavs_desc *d;
  const long *dims;
  cavs_vocab *v;
  int grow;         /* new tokens join the vocabulary */
  const char *path;
  long lineno;      /* of the line being read */
  char *err;        /* "FILE:LINE: error: ..." on failure */
  size_t errlen;
  int bptt;         /* text-bptt's chunk length (35, or N of "text-bptt:N") */
} CvLoad;

typedef struct CvFormat {
  const char *name;
  bool real;        /* reads the model's real inputs */
  /* per-file state in *state; -1 when it cannot be had */
  int (*begin)(CvLoad *l, void **state);
  /* one line, without its line break and NUL-terminated; -1 with the message in l->err */
  int (*line)(CvLoad *l, void *state, char *line, size_t len);
  /* after the last line (rc: 0 if every line was read, else -1): whatever is left open is
     an error; frees the state */
  int (*end)(CvLoad *l, void *state, int rc);
  /* each graph's lines stand alone, so that a graph can be read again from its lines
     (cavs_stream): not text-bptt's, whose chunks run across lines */
  bool records;
} CvFormat;

/* The chunks text-bptt cuts a stream into: 35 tokens by default (Zaremba et al.), N
 * with "text-bptt:N", N from 1 to CV_MAX_BPTT. */
enum { CV_BPTT = 35, CV_MAX_BPTT = 100000 };
/* The format named `format` ("text-bptt:N" is text-bptt, its N in *bptt), or NULL: an
 * unknown name, or an N that is not a number from 1 to CV_MAX_BPTT (digits only). */
const CvFormat *cv_format_named(const char *format, int *bptt);

extern const CvFormat cv_format_ptb, cv_format_text, cv_format_text_bptt, cv_format_cgf;

/* *p grown to n elements of elem bytes, in checked arithmetic; false (errno ENOMEM, *p as
 * it was) when that much memory cannot be had. */
bool cv_grow_array(void *p, size_t elem, size_t n);
/* A new vertex (all slots empty, features -1, reals 0) of the graph that began at vertex
 * `first`, and the end of that graph; -1 with a message (no FILE:LINE) in err. */
int cv_add_vertex(cavs_dataset *s, long first, char *err, size_t errlen);
/* the children a data file may give a vertex of type t: its slots, or CAVS_MAX_SET for a
 * block that takes them as a set */
int cv_type_children(const cavs_desc *d, int t);
/* strtod in the "C" locale, whatever locale the application has set (a German
   LC_NUMERIC would read "0.5" as 0 and stop at the point). */
double cv_strtod(const char *s, char **end);
int cv_add_graph(cavs_dataset *s, long first, char *err, size_t errlen);

#endif

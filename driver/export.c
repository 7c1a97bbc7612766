/* export.c: a model's parameters out to the Python world and back in. `cavs export
 * CKPT -o FILE.safetensors|FILE.npz` writes every parameter of a checkpoint by its .vf
 * name and shape (a vector [H] as [H], a matrix [R, C] as [R, C], row-major), float32 or
 * float64 as the model's precision, with the model's name, source hash, precision and
 * dims as metadata (tensors.c has the formats). `cavs train --init-all FILE` is the way
 * back: a new model's parameters from such a file, whoever wrote it, every name and shape
 * checked against the model before any value is used. */
#include "driver.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "[16, 5]", or "[16]" for a vector */
static char *shape_text(int rank, const int64_t *shape) {
  char *s = fmt("[");
  for (int k = 0; k < rank; k++) s = fmt("%s%s%lld", s, k ? ", " : "", (long long)shape[k]);
  return fmt("%s]", s);
}

/* Parameter i's shape as the formats give it: [cols] for a vector (rank 1), else [rows,
   cols]. */
static int param_shape(cavs_model *m, int i, int64_t *shape) {
  long rows, cols;
  cavs_model_param(m, i, &rows, &cols, NULL);
  if (cavs_model_desc(m)->params[i].rank == 1 && rows == 1) {
    shape[0] = cols;
    return 1;
  }
  shape[0] = rows, shape[1] = cols;
  return 2;
}

/* "H=16 C=5 V=62" */
static char *dims_text(const cavs_model *m) {
  const cavs_desc *d = cavs_model_desc(m);
  char *s = "";
  for (int j = 0; j < d->ndims; j++) s = fmt("%s%s%s=%ld", s, j ? " " : "", d->dims[j].name, cavs_model_dim(m, j));
  return s;
}

/* The metadata both formats carry: an object of strings, dims a JSON object in one. */
static json_t *metadata(const cavs_model *m) {
  const cavs_desc *d = cavs_model_desc(m);
  json_t *dims = json_object(), *meta = json_object();
  for (int j = 0; j < d->ndims; j++) json_set(dims, d->dims[j].name, json_integer(cavs_model_dim(m, j)));
  char *dims_json = json_text(dims, JSON_COMPACT);
  json_decref(dims);
  json_set(meta, "model", json_string(d->name));
  json_set(meta, "source_hash", json_string(d->source_hash));
  json_set(meta, "precision", json_string(d->precision == CAVS_DOUBLE ? "double" : "float"));
  json_set(meta, "dims", json_string(dims_json));
  json_set(meta, "cavs_version", json_string(CAVS_VERSION));
  free(dims_json);
  return meta;
}

/* Parameter i's values, dense and row-major in host memory (the model's rows may be
   wider: merged products share a block; on a GPU they are device memory). */
static void *param_values(cavs_model *m, int i, size_t *bytes) {
  long rows, cols, ld;
  char *p = cavs_model_param(m, i, &rows, &cols, &ld);
  size_t es = cavs_model_desc(m)->precision == CAVS_DOUBLE ? 8 : 4, row = (size_t)cols * es;
  char *host = xmalloc(row * (size_t)rows);
  for (long r = 0; r < rows; r++) {
    errno = 0;
    if (cavs_model_read(m, host + (size_t)r * row, p + (size_t)r * (size_t)ld * es, row)) lib_die(cavs_model_error(m));
  }
  *bytes = row * (size_t)rows;
  return host;
}

int cmd_export(int argc, char **argv) {
  const char *ckpt = NULL, *out = NULL, *model = NULL;
  optind = 0;
  for (int ch; (ch = next_option(argc, argv, CMD_EXPORT)) != -1;) {
    if (ch == 1 && ckpt) die(1, "export: unexpected argument '%s'", optarg);
    if (ch == 1) ckpt = optarg;
    if (ch == OPT_OUTPUT) out = optarg;
    if (ch == OPT_MODEL) model = optarg;
  }
  for (; optind < argc; optind++) {
    if (ckpt) die(1, "export: unexpected argument '%s'", argv[optind]);
    ckpt = argv[optind];
  }
  if (!ckpt || !out) die(1, "export: usage: cavs export CKPT -o FILE.safetensors|FILE.npz [--model MODEL] (cavs help export)");
  if (!tensors_format(out)) die(1, "-o %s: name the file FILE.safetensors or FILE.npz (the format goes by the name)", out);
  const char *in[] = {ckpt, model}, *what[] = {"the checkpoint", "the --model"};
  check_output("o", out, in, what, model ? 2 : 1);
  CkptModel c = open_ckpt(ckpt, model);
  const cavs_desc *d = c.L.desc;
  Tensor *t = xmalloc(sizeof *t * (size_t)d->nparams);
  long numbers = 0;
  for (int i = 0; i < d->nparams; i++) {
    int64_t shape[2];
    t[i] = (Tensor){.name = d->params[i].name, .f64 = d->precision == CAVS_DOUBLE, .rank = param_shape(c.m, i, shape)};
    for (int k = 0; k < t[i].rank; k++) t[i].shape[k] = (long)shape[k];
    t[i].data = param_values(c.m, i, &t[i].bytes);
    numbers += (long)(t[i].bytes / (t[i].f64 ? 8 : 4));
  }
  json_t *meta = metadata(c.m);
  tensors_write(out, t, d->nparams, meta);
  json_decref(meta);
  printf("%s: %d parameters of model %s (%ld numbers, %s; %s)\n", out, d->nparams, d->name, numbers,
         d->precision == CAVS_DOUBLE ? "float64" : "float32", dims_text(c.m));
  for (int i = 0; i < d->nparams; i++) free((void *)t[i].data);
  cavs_model_free(c.m);
  return 0;
}

/* ---- --init-all ---- */

/* The entry of f that is parameter i, its name and shape checked. */
static const TensorEntry *entry_for(const TensorFile *f, cavs_model *m, int i) {
  const cavs_desc *d = cavs_model_desc(m);
  const char *name = d->params[i].name;
  int64_t shape[2];
  int rank = param_shape(m, i, shape);
  const TensorEntry *e = tensors_find(f, name);
  if (!e)
    die(1, "%s: error: no tensor '%s' (parameter %s %s of model %s, %s)", f->path, name, name, shape_text(rank, shape),
        d->name, dims_text(m));
  bool same = e->rank == rank;
  for (int k = 0; k < rank && same; k++) same = e->shape[k] == shape[k];
  if (!same)
    die(1, "%s: error: tensor '%s' is %s; parameter %s of model %s is %s (%s)", f->path, name,
        shape_text(e->rank, e->shape), name, d->name, shape_text(rank, shape), dims_text(m));
  return e;
}

void init_all(cavs_model *m, const char *path) {
  const cavs_desc *d = cavs_model_desc(m);
  TensorFile *f = tensors_open(path);
  const TensorEntry **e = xmalloc(sizeof *e * (size_t)d->nparams);
  bool *used = xmalloc((size_t)f->n + 1);
  memset(used, 0, (size_t)f->n + 1);
  for (int i = 0; i < d->nparams; i++) {
    e[i] = entry_for(f, m, i);
    used[e[i] - f->e] = true;
  }
  for (int j = 0; j < f->n; j++) {
    if (used[j]) continue;
    char *names = "";
    for (int i = 0; i < d->nparams && i < 32; i++) names = fmt("%s%s%s", names, i ? ", " : "", d->params[i].name);
    die(1, "%s: error: tensor '%s' is no parameter of model %s (%s%s)", path, f->e[j].shown, d->name, names,
        d->nparams > 32 ? ", ..." : "");
  }
  /* every tensor read and checked first: an error leaves the model as it was */
  bool f64 = d->precision == CAVS_DOUBLE;
  size_t es = f64 ? 8 : 4;
  char **vals = xmalloc(sizeof *vals * (size_t)d->nparams);
  for (int i = 0; i < d->nparams; i++) {
    vals[i] = xmalloc((size_t)e[i]->count * es);
    tensors_read(f, e[i], vals[i], f64);
  }
  for (int i = 0; i < d->nparams; i++) {
    long rows, cols, ld;
    char *p = cavs_model_param(m, i, &rows, &cols, &ld);
    for (long r = 0; r < rows; r++) {
      errno = 0;
      if (cavs_model_write(m, p + (size_t)r * (size_t)ld * es, vals[i] + (size_t)r * (size_t)cols * es, (size_t)cols * es))
        lib_die(cavs_model_error(m));
    }
    free(vals[i]);
  }
  close(f->fd);
}

/* fuzz_vectors.c: libFuzzer target for cavs_model_load_vectors_report (runtime/data.c),
 * which reads pre-trained vectors (`cavs train --init PARAM=FILE`: GloVe or word2vec
 * text, gzipped or not) into a lookup table. The input is the file, written to a memfd
 * and read through /proc/self/fd as fuzz_data.c does.
 *
 * The table is treelstm's emb at E = 3 (float) and at E = 4 (the double build of the
 * same model is not linked: the loader's precision path is the element size, checked by
 * check_data), over a vocabulary of a few words. What a load promises:
 *   - failed: a message, with none of the file's control bytes in it (cv_shown), and
 *     the table exactly as it was;
 *   - loaded: every row the report counts as found holds finite values; every other
 *     row is as it was; found <= vectors, and the sample of missing words is in range. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cavs.h"
#include "memfile.h"
#include "treelstm.h"

static const char *path; /* the input's */

#define CHECK(cond, ...)                                \
  do {                                                  \
    if (!(cond)) {                                      \
      fprintf(stderr, "fuzz_vectors (E=%ld): ", E);     \
      fprintf(stderr, __VA_ARGS__);                     \
      fputc('\n', stderr);                              \
      abort();                                          \
    }                                                   \
  } while (0)

/* the table's rows, read out of the model (rows x cols floats) */
static float *table_of(cavs_model *m, int p, long *rows, long *cols) {
  long ld;
  char *t = cavs_model_param(m, p, rows, cols, &ld);
  float *out = malloc(sizeof(float) * (size_t)(*rows * *cols) + 1);
  if (!out) abort();
  for (long r = 0; r < *rows; r++)
    if (cavs_model_read(m, out + r * *cols, t + (size_t)r * (size_t)ld * 4, sizeof(float) * (size_t)*cols)) abort();
  return out;
}

static void load_once(long E) {
  /* the seeds' words and a few more: ids 2.. (0 is <unk>, 1 <eos>) */
  static const char *words[] = {"the", "cat", "w0", "w1", "w2", "caf\xc3\xa9", ",", "."};
  cavs_vocab *v = cavs_vocab_new();
  if (!v) abort();
  for (size_t i = 0; i < sizeof words / sizeof *words; i++) cavs_vocab_id(v, words[i], strlen(words[i]), 1);
  long dims[CAVS_MAX_DIMS] = {0};
  cavs_dims_default(&treelstm_desc, dims);
  for (int k = 0; k < treelstm_desc.ndims; k++) {
    const char *n = treelstm_desc.dims[k].name;
    if (!strcmp(n, "V")) dims[k] = cavs_vocab_size(v) + 2; /* (two rows no word has) */
    else if (!strcmp(n, "E")) dims[k] = E;
    else if (!strcmp(n, "H")) dims[k] = 2;
  }
  char err[512] = "";
  cavs_model *m = cavs_model_new(&treelstm_desc, dims, err, sizeof err);
  if (!m) { /* (the harness's own model: a build out of step with the runtime, say) */
    fprintf(stderr, "fuzz_vectors: cavs_model_new: %s\n", err);
    abort();
  }
  int p = -1;
  for (int i = 0; i < treelstm_desc.nparams; i++)
    if (!strcmp(treelstm_desc.params[i].name, "emb")) p = i;
  if (p < 0) abort();
  long rows, cols;
  float *before = table_of(m, p, &rows, &cols);
  cavs_vectors_report rep;
  err[0] = 0;
  int rc = cavs_model_load_vectors_report(m, p, path, v, &rep, err, sizeof err);
  float *after = table_of(m, p, &rows, &cols);
  if (getenv("FUZZ_VERBOSE"))
    fprintf(stderr, "E=%ld: %s (vectors %ld, found %ld)\n", E, rc ? err : "loaded", rep.vectors, rep.found);
  if (rc) {
    CHECK(err[0], "failed without a message");
    for (const unsigned char *c = (const unsigned char *)err; *c; c++)
      CHECK(*c >= 0x20 && *c != 0x7f && !(c[0] == 0xc2 && c[1] >= 0x80 && c[1] < 0xa0),
            "a control byte at byte %d of the message: %s", (int)(c - (const unsigned char *)err), err);
    CHECK(!memcmp(before, after, sizeof(float) * (size_t)(rows * cols)), "a failed load changed the table: %s", err);
  } else {
    long changed = 0;
    for (long r = 0; r < rows; r++) {
      bool same = !memcmp(before + r * cols, after + r * cols, sizeof(float) * (size_t)cols);
      changed += !same;
      for (long k = 0; k < cols; k++) CHECK(isfinite(after[r * cols + k]), "row %ld holds a value that is not finite", r);
    }
    CHECK(rep.found >= 0 && rep.found <= rep.vectors && rep.found <= rows, "found %ld of %ld vectors, %ld rows", rep.found,
          rep.vectors, rows);
    CHECK(changed <= rep.found, "%ld rows changed, %ld found", changed, rep.found);
    CHECK(rep.nsample >= 0 && rep.nsample <= CAVS_VECTORS_SAMPLE, "a sample of %d", rep.nsample);
    for (int i = 0; i < rep.nsample; i++)
      CHECK(rep.sample[i] >= 2 && rep.sample[i] < cavs_vocab_size(v), "sample %d is word %d", i, rep.sample[i]);
  }
  free(before);
  free(after);
  cavs_model_free(m);
  cavs_vocab_free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  path = mf_write("fuzz-vectors", data, size);
  load_once(3);
  load_once(4);
  return 0;
}

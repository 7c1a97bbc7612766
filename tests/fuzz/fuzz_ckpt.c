/* fuzz_ckpt.c: libFuzzer target for the checkpoint reader, cavs_ckpt_read and cavs_ckpt_open (runtime/ckpt.c),
 * and what the driver does with a checkpoint it has read: the accessors, cavs_ckpt_vocab,
 * cavs_ckpt_dims, and cavs_ckpt_apply_weights then cavs_ckpt_apply to a model of the matching name (treelstm unless the
 * checkpoint names another example), as `cavs eval` and `cavs train --resume` do.
 *
 * The file ends in an FNV-1a checksum of everything before it, and a file whose checksum
 * is wrong is rejected at once: the input is the checkpoint without those 8 bytes, and
 * the harness appends the right checksum (so seeds are checkpoints with their last 8
 * bytes cut; tests/fuzz/run makes them). The file goes through a memfd. FUZZ_VERBOSE=1 in
 * the environment prints how far each input got. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cavs.h"
#include "memfile.h"
#include "lstm_lm.h"
#include "treefc.h"
#include "treegru.h"
#include "treelstm.h"
#include "twotype.h"

/* Parameters a model built from a checkpoint's dims may have, in scalars: dims up to 2^28
 * each are valid, and the memory they ask for would be a finding of nothing but size. */
enum { MAX_SCALARS = 1 << 22 };

static uint64_t fnv64(const uint8_t *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* the input, then its checksum (little-endian, as the reader takes it) */
static const char *write_input(const uint8_t *data, size_t size) {
  const char *path = mf_write("fuzz-ckpt", data, size);
  uint64_t sum = fnv64(data, size);
  mf_put(&sum, 8, (off_t)size);
  return path;
}

static const cavs_desc *model_named(const char *name) {
  static const cavs_desc *const all[] = {&treelstm_desc, &treefc_desc, &lstm_lm_desc, &treegru_desc, &twotype_desc};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    if (!strcmp(all[i]->name, name)) return all[i];
  return &treelstm_desc;
}

static long lin(const cavs_lin *l, const long *dims) {
  long v = l->k;
  for (int i = 0; i < CAVS_MAX_DIMS; i++) v += (long)l->c[i] * dims[i];
  return v;
}

/* Small enough to build: every dim in 1..2^28 (cavs_model_new checks that too) and the
 * parameters within MAX_SCALARS. */
static int small_enough(const cavs_desc *d, const long *dims) {
  for (int i = 0; i < d->ndims; i++)
    if (dims[i] <= 0 || dims[i] > (1L << 28)) return 1; /* cavs_model_new says why */
  double total = 0;
  for (int g = 0; g < d->npgroups; g++) total += (double)lin(&d->pgroups[g].rows, dims) * (double)lin(&d->pgroups[g].cols, dims);
  return total <= MAX_SCALARS;
}

/* a message must say why, with none of the file's control bytes (C0, DEL, C1 in UTF-8) */
static void check_message(const char *err) {
  if (!err[0]) abort();
  for (const unsigned char *c = (const unsigned char *)err; *c; c++)
    if (*c < 0x20 || *c == 0x7f || (c[0] == 0xc2 && c[1] >= 0x80 && c[1] < 0xa0)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = write_input(data, size);
  char err[512];
  err[0] = 0;
  cavs_ckpt *k = cavs_ckpt_read(path, err, sizeof err);
  /* opened (cavs_ckpt_open: streamed, its values read when applied) it must be refused
     with the same message, or taken */
  char oerr[512];
  oerr[0] = 0;
  cavs_ckpt *o = cavs_ckpt_open(path, oerr, sizeof oerr);
  if (!k != !o || (!k && strcmp(err, oerr))) abort();
  int verbose = getenv("FUZZ_VERBOSE") != NULL;
  if (!k) {
    check_message(err);
    if (verbose) fprintf(stderr, "read: %s\n", err);
    return 0;
  }
  /* what `cavs info` prints */
  const char *strs[] = {cavs_ckpt_model(k), cavs_ckpt_source(k), cavs_ckpt_hash(k), cavs_ckpt_state(k)->format};
  size_t sink = 0;
  for (size_t i = 0; i < sizeof strs / sizeof *strs; i++) sink += strlen(strs[i]);
  sink += (size_t)cavs_ckpt_precision(k) + (size_t)cavs_ckpt_param_count(k);
  for (int i = 0; i < cavs_ckpt_ndims(k); i++) sink += strlen(cavs_ckpt_dim_name(k, i)) + (size_t)cavs_ckpt_dim_value(k, i);
  /* the log record a resume writes: one line, within its bound, or none */
  const char *rec = cavs_ckpt_record(k);
  if (rec && (!*rec || strchr(rec, '\n') || strlen(rec) > CAVS_MAX_CKPT_RECORD)) abort();
  sink += rec ? strlen(rec) : 0;
  cavs_vocab *v = cavs_ckpt_vocab(k);
  if (v) {
    for (int i = 0; i < cavs_vocab_size(v); i++) sink += strlen(cavs_vocab_word(v, i));
    cavs_vocab_free(v);
  }
  const cavs_desc *d = model_named(cavs_ckpt_model(k));
  long dims[CAVS_MAX_DIMS] = {0};
  err[0] = 0;
  if (!cavs_ckpt_dims(k, d, dims, err, sizeof err) && small_enough(d, dims)) {
    cavs_model *m = cavs_model_new(d, dims, err, sizeof err);
    if (m) {
      err[0] = 0;
      /* the weights alone (evaluation), then the whole state (a resume) */
      int rc = cavs_ckpt_apply_weights(k, m, err, sizeof err);
      if (verbose) fprintf(stderr, "weights to %s: %s\n", d->name, rc ? err : "ok");
      if (!rc) rc = cavs_ckpt_apply(k, m, err, sizeof err);
      if (verbose) fprintf(stderr, "apply to %s: %s\n", d->name, rc ? err : "ok");
      /* the opened checkpoint the same way: the same verdict and message, the same
         bytes applied */
      char e2[512];
      e2[0] = 0;
      cavs_model *m2 = cavs_model_new(d, dims, e2, sizeof e2);
      if (m2) {
        int rc2 = cavs_ckpt_apply_weights(o, m2, e2, sizeof e2);
        if (!rc2) rc2 = cavs_ckpt_apply(o, m2, e2, sizeof e2);
        if (!rc != !rc2 || (rc && strcmp(err, e2))) abort();
        if (rc) check_message(err);
      }
      if (!rc) {
        /* applied: the parameters are readable */
        size_t n, n2;
        const unsigned char *p = cavs_model_params_flat(m, &n);
        for (size_t i = 0; i < n * (d->precision == CAVS_DOUBLE ? 8 : 4); i += 64) sink += p[i];
        if (m2) {
          const unsigned char *p2 = cavs_model_params_flat(m2, &n2);
          if (n2 != n || memcmp(p, p2, n * (d->precision == CAVS_DOUBLE ? 8 : 4))) abort();
        }
      }
      cavs_model_free(m2);
      cavs_model_free(m);
    } else if (verbose) {
      fprintf(stderr, "model: %s\n", err);
    }
  } else if (verbose) {
    fprintf(stderr, "dims: %s\n", err[0] ? err : "too large to build");
  }
  cavs_ckpt_free(k);
  cavs_ckpt_free(o);
  volatile size_t keep = sink;
  (void)keep;
  return 0;
}

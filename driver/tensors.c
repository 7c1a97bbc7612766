/* tensors.c: parameter files as the rest of the world reads them: safetensors and
 * NumPy's .npz, written (cavs export) and read (cavs train --init-all).
 *
 *   safetensors   u64 N (little-endian), N bytes of JSON: {"__metadata__": {string:
 *                 string}, NAME: {"dtype": "F32", "shape": [R, C], "data_offsets":
 *                 [BEGIN, END]}, ...} padded with spaces to a multiple of 8 bytes, then
 *                 the tensors' bytes, row-major, little-endian, offsets counted from
 *                 the end of the header; together they cover that buffer exactly.
 *   .npz          a zip of NAME.npy files (stored, or deflated as np.savez_compressed
 *                 writes them), each an .npy: "\x93NUMPY", version, header length, a
 *                 Python dict literal {'descr': '<f4', 'fortran_order': False,
 *                 'shape': (R, C), } padded to a multiple of 64 bytes, the data.
 *
 * What cavs writes: the tensors in the model's order, float32 or float64 as the model's
 * precision; the metadata as safetensors' __metadata__ and, in an .npz, the same JSON
 * object as the entry __metadata__.json (np.load gives its bytes). The zip is the plain
 * kind (no ZIP64): at most 65,534 arrays and 4 GiB, past which .safetensors is the
 * format to use. Both are deterministic: the same parameters give the same bytes.
 *
 * What cavs reads is untrusted (docs/DESIGN.md, section 6): a regular file of at most
 * 64 GiB; every length, offset and count from it is held to the file's size and to
 * bounds of its own (a safetensors header of 100 MiB as the safetensors library's own,
 * a zip's central directory of 64 MiB, an .npy header of 64 KiB) in checked arithmetic
 * before anything is read through it; a deflated entry is inflated only up to the size
 * its directory entry gives (itself held to what the parameter needs before its data is
 * read), and its CRC-32 and end are checked. Nothing is read by position without such a
 * check, and nothing is written into a model until every tensor has been read. */
#include "afile.h"
#include "driver.h"
#include "shown.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

enum {
  MAX_ST_HEADER = 100 << 20,  /* a safetensors header (the safetensors library's bound) */
  MAX_ZIP_DIR = 64 << 20,     /* a zip's central directory */
  MAX_NPY_HEADER = 1 << 16,   /* an .npy header */
};
#define MAX_TENSOR_FILE ((uint64_t)1 << 36) /* 64 GiB, as a checkpoint */

/* ---- little-endian integers ---- */

static uint16_t get16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const unsigned char *p) { return (uint32_t)get16(p) | (uint32_t)get16(p + 2) << 16; }
static uint64_t get64(const unsigned char *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }
static void put16(unsigned char *p, uint32_t v) { p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8); }
static void put32(unsigned char *p, uint32_t v) { put16(p, v), put16(p + 2, v >> 16); }
static void put64(unsigned char *p, uint64_t v) { put32(p, (uint32_t)v), put32(p + 4, (uint32_t)(v >> 32)); }

/* ---- writing ---- */

/* The output: a file written whole (afile.c), and how far into it we are. */
typedef struct Out {
  cv_afile a;
  const char *path;
  uint64_t off;
} Out;

static void out_write(Out *o, const void *p, size_t n) {
  char err[1024];
  if (cv_afile_write(&o->a, p, n, err, sizeof err)) die(file_status(errno), "%s", err);
  o->off += n;
}

static const char *st_dtype(const Tensor *t) { return t->f64 ? "F64" : "F32"; }
static size_t esize(const Tensor *t) { return t->f64 ? 8 : 4; }

/* The safetensors header: metadata first, then each tensor with its place. */
static char *st_header(const Tensor *t, int n, json_t *meta, size_t *len) {
  json_t *h = json_object();
  json_set(h, "__metadata__", json_incref(meta));
  uint64_t at = 0;
  for (int i = 0; i < n; i++) {
    json_t *e = json_object(), *shape = json_array(), *offs = json_array();
    json_set(e, "dtype", json_string(st_dtype(&t[i])));
    for (int k = 0; k < t[i].rank; k++) json_push(shape, json_integer(t[i].shape[k]));
    json_set(e, "shape", shape);
    json_push(offs, json_integer((json_int_t)at));
    json_push(offs, json_integer((json_int_t)(at + t[i].bytes)));
    json_set(e, "data_offsets", offs);
    json_set(h, t[i].name, e);
    at += t[i].bytes;
  }
  char *text = keep(json_text(h, JSON_COMPACT | JSON_ENSURE_ASCII));
  json_decref(h);
  *len = strlen(text);
  return text;
}

static void write_safetensors(Out *o, const Tensor *t, int n, json_t *meta) {
  size_t len;
  char *text = st_header(t, n, meta, &len);
  size_t padded = (len + 7) / 8 * 8; /* 8 + padded: the data starts 8-byte aligned */
  unsigned char head[8];
  put64(head, padded);
  out_write(o, head, 8);
  out_write(o, text, len);
  out_write(o, "        ", padded - len);
  for (int i = 0; i < n; i++) out_write(o, t[i].data, t[i].bytes);
}

/* An .npy header for t (version 1.0), padded so that the data starts at a multiple of
   64 bytes, as NumPy writes it. */
static size_t npy_header(const Tensor *t, char *out, size_t cap) {
  char shape[64];
  if (t->rank == 1) snprintf(shape, sizeof shape, "(%ld,)", t->shape[0]);
  else snprintf(shape, sizeof shape, "(%ld, %ld)", t->shape[0], t->shape[1]);
  char dict[160];
  int dn = snprintf(dict, sizeof dict, "{'descr': '<f%zu', 'fortran_order': False, 'shape': %s, }", esize(t), shape);
  size_t total = (10 + (size_t)dn + 1 + 63) / 64 * 64; /* magic, version, length, dict, '\n' */
  if (total > cap) die(2, "internal error at %s:%d: .npy header too long", __FILE__, __LINE__);
  memcpy(out, "\x93NUMPY\x01\x00", 8);
  put16((unsigned char *)out + 8, (uint32_t)(total - 10));
  memcpy(out + 10, dict, (size_t)dn);
  memset(out + 10 + dn, ' ', total - 10 - (size_t)dn - 1);
  out[total - 1] = '\n';
  return total;
}

/* A zip entry's fixed fields, shared by its local header and its directory entry. */
typedef struct ZipEntry {
  char *name;
  uint32_t crc, size, offset;
} ZipEntry;

/* version 2.0, no flags, stored, 1980-01-01 00:00 (no clock: the same bytes every time) */
static void zip_fields(unsigned char *p, const ZipEntry *e) {
  put16(p, 20), put16(p + 2, 0), put16(p + 4, 0), put16(p + 6, 0), put16(p + 8, 0x21);
  put32(p + 10, e->crc), put32(p + 14, e->size), put32(p + 18, e->size);
  put16(p + 22, (uint32_t)strlen(e->name)), put16(p + 24, 0);
}

static void zip_entry(Out *o, ZipEntry *e, const void *head, size_t hlen, const void *data, size_t dlen) {
  if (strlen(e->name) > 0xffff) die(1, "%s: a tensor name longer than a zip entry's name can be (65,535 bytes)", o->path);
  if (o->off + 30 + strlen(e->name) + hlen + dlen > UINT32_MAX || hlen + dlen > UINT32_MAX)
    die(1, "%s: too large for an .npz without ZIP64 (4 GiB); write a .safetensors file instead", o->path);
  e->offset = (uint32_t)o->off;
  e->size = (uint32_t)(hlen + dlen);
  uLong crc = crc32(0, Z_NULL, 0);
  crc = crc32_z(crc, head, hlen);
  crc = crc32_z(crc, data, dlen);
  e->crc = (uint32_t)crc;
  unsigned char h[30];
  put32(h, 0x04034b50);
  zip_fields(h + 4, e);
  out_write(o, h, 30);
  out_write(o, e->name, strlen(e->name));
  out_write(o, head, hlen);
  out_write(o, data, dlen);
}

static void zip_directory(Out *o, const ZipEntry *e, int n) {
  uint64_t start = o->off;
  for (int i = 0; i < n; i++) {
    unsigned char h[46];
    put32(h, 0x02014b50);
    put16(h + 4, 20); /* made by: version 2.0, MS-DOS attributes */
    zip_fields(h + 6, &e[i]);
    put16(h + 32, 0), put16(h + 34, 0), put16(h + 36, 0), put32(h + 38, 0), put32(h + 42, e[i].offset);
    out_write(o, h, 46);
    out_write(o, e[i].name, strlen(e[i].name));
  }
  if (o->off > UINT32_MAX) die(1, "%s: too large for an .npz without ZIP64 (4 GiB); write a .safetensors file instead", o->path);
  unsigned char end[22];
  put32(end, 0x06054b50), put16(end + 4, 0), put16(end + 6, 0), put16(end + 8, (uint32_t)n), put16(end + 10, (uint32_t)n);
  put32(end + 12, (uint32_t)(o->off - start)), put32(end + 16, (uint32_t)start), put16(end + 20, 0);
  out_write(o, end, 22);
}

static void write_npz(Out *o, const Tensor *t, int n, json_t *meta) {
  if (n + 1 > 0xfffe) die(1, "%s: %d arrays are too many for an .npz without ZIP64; write a .safetensors file instead", o->path, n);
  ZipEntry *e = xmalloc(sizeof *e * (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    char head[256];
    size_t hlen = npy_header(&t[i], head, sizeof head);
    e[i].name = fmt("%s.npy", t[i].name);
    zip_entry(o, &e[i], head, hlen, t[i].data, t[i].bytes);
  }
  char *text = keep(json_text(meta, JSON_COMPACT | JSON_ENSURE_ASCII));
  e[n].name = "__metadata__.json";
  zip_entry(o, &e[n], "", 0, text, strlen(text));
  zip_directory(o, e, n + 1);
}

/* The format a file name asks for: 1 safetensors, 2 npz, 0 neither. */
int tensors_format(const char *path) {
  size_t n = strlen(path);
  if (n > 12 && !strcmp(path + n - 12, ".safetensors")) return 1;
  if (n > 4 && !strcmp(path + n - 4, ".npz")) return 2;
  return 0;
}

void tensors_write(const char *path, const Tensor *t, int n, json_t *meta) {
  int format = tensors_format(path);
  if (!format) die(1, "%s: name the file FILE.safetensors or FILE.npz (the format goes by the name)", path);
  for (int i = 0; i < n; i++)
    if (!strcmp(t[i].name, "__metadata__"))
      die(1, "%s: a parameter named __metadata__ cannot be written: the formats keep that name for the metadata", path);
  Out o = {.path = path};
  char err[1024];
  if (cv_afile_open(&o.a, path, CV_AFILE_USER, err, sizeof err)) die(file_status(errno), "%s", err);
  if (format == 1) write_safetensors(&o, t, n, meta);
  else write_npz(&o, t, n, meta);
  if (cv_afile_commit(&o.a, err, sizeof err)) die(file_status(errno), "%s", err);
}

/* ---- reading: the index ---- */

/* Bytes from a file as a message shows them (runtime/shown.h's rule), at most 80 bytes
   of it */
char *shown(const char *s, size_t n) {
  char *out = xmalloc(4 * 80 + 4);
  cv_quote(out, s, n, 80);
  return out;
}

/* A file's bytes at [off, off + n): all of them, or die. */
static void read_at(const TensorFile *f, void *buf, size_t n, uint64_t off) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(f->fd, (char *)buf + got, n - got, (off_t)(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) die(file_status(errno), "%s: cannot read: %s", f->path, strerror(errno));
    if (r == 0) die(1, "%s: error: the file ends early (it changed while being read?)", f->path);
    got += (size_t)r;
  }
}

/* The byte size of a safetensors dtype, 0 for one the format does not have. */
static int st_dtype_size(const char *s) {
  static const struct { const char *name; int size; } dt[] = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4}, {"I64", 8}, {"U64", 8}, {"F64", 8}};
  for (size_t i = 0; i < sizeof dt / sizeof *dt; i++)
    if (!strcmp(s, dt[i].name)) return dt[i].size;
  return 0;
}

/* count = product of the shape, bytes = count * size, both without overflow. */
static bool shape_bytes(TensorEntry *e, int size) {
  uint64_t c = 1;
  for (int k = 0; k < e->rank; k++)
    if (__builtin_mul_overflow(c, (uint64_t)e->shape[k], &c)) return false;
  e->count = c;
  return !__builtin_mul_overflow(c, (uint64_t)size, &e->bytes);
}

static TensorEntry *add_entry(TensorFile *f, const char *name, size_t len) {
  if (f->n == CAVS_MAX_PARAMS + 1) die(1, "%s: error: more than %d tensors", f->path, CAVS_MAX_PARAMS + 1);
  if (f->n == f->cap) {
    f->cap = f->cap ? 2 * f->cap : 64;
    TensorEntry *e = realloc(f->e, sizeof *e * (size_t)f->cap);
    if (!e) die(2, "out of memory");
    f->e = e;
  }
  TensorEntry *e = memset(&f->e[f->n++], 0, sizeof *f->e);
  if (memchr(name, 0, len)) die(1, "%s: error: a tensor name holds a NUL byte", f->path);
  e->name = xmalloc(len + 1);
  memcpy(e->name, name, len);
  e->name[len] = 0;
  e->shown = shown(name, len);
  return e;
}

/* One safetensors header entry NAME: {"dtype", "shape", "data_offsets"}. */
static void st_entry(TensorFile *f, const char *name, json_t *v) {
  TensorEntry *e = add_entry(f, name, strlen(name));
  json_t *dtype = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"), *offs = json_object_get(v, "data_offsets");
  if (!json_is_object(v) || !json_is_string(dtype) || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2)
    die(1, "%s: error: tensor '%s' is not {\"dtype\": ..., \"shape\": [...], \"data_offsets\": [BEGIN, END]}", f->path, e->shown);
  char q[4 * 80 + 4];
  snprintf(e->dtype, sizeof e->dtype, "%s", cv_quote(q, json_string_value(dtype), json_string_length(dtype), 80));
  int size = st_dtype_size(json_string_value(dtype));
  if (!size) die(1, "%s: error: tensor '%s' has the unknown dtype '%s'", f->path, e->shown, e->dtype);
  e->f64 = !strcmp(e->dtype, "F64");
  e->real = e->f64 || !strcmp(e->dtype, "F32");
  if (json_array_size(shape) > TENSOR_MAX_RANK) die(1, "%s: error: tensor '%s' has more than %d dimensions", f->path, e->shown, TENSOR_MAX_RANK);
  e->rank = (int)json_array_size(shape);
  for (int k = 0; k < e->rank; k++) {
    json_t *s = json_array_get(shape, (size_t)k);
    if (!json_is_integer(s) || json_integer_value(s) < 0)
      die(1, "%s: error: tensor '%s': its shape is not a list of integers of at least 0", f->path, e->shown);
    e->shape[k] = json_integer_value(s);
  }
  json_t *b = json_array_get(offs, 0), *end = json_array_get(offs, 1);
  if (!json_is_integer(b) || !json_is_integer(end) || json_integer_value(b) < 0 || json_integer_value(end) < json_integer_value(b))
    die(1, "%s: error: tensor '%s': data_offsets is not [BEGIN, END] with 0 <= BEGIN <= END", f->path, e->shown);
  e->off = (uint64_t)json_integer_value(b);
  if (!shape_bytes(e, size) || e->bytes != (uint64_t)json_integer_value(end) - e->off)
    die(1, "%s: error: tensor '%s': data_offsets [%lld, %lld] do not hold a %s tensor of its shape", f->path, e->shown,
        (long long)json_integer_value(b), (long long)json_integer_value(end), e->dtype);
}

/* by place, and at one place the empty tensors first: the order of the header's keys
   must not decide whether a file is taken */
static int by_offset(const void *a, const void *b) {
  const TensorEntry *x = a, *y = b;
  if (x->off != y->off) return x->off < y->off ? -1 : 1;
  return x->bytes < y->bytes ? -1 : x->bytes > y->bytes;
}

/* The header, then the data's layout: the tensors cover the buffer after the header
   exactly, one after another, as the format requires. */
static void open_safetensors(TensorFile *f, uint64_t size) {
  unsigned char head[8];
  if (size < 8) die(1, "%s: error: not a safetensors file (shorter than 8 bytes)", f->path);
  read_at(f, head, 8, 0);
  uint64_t n = get64(head);
  if (n > MAX_ST_HEADER || n > size - 8)
    die(1, "%s: error: not a safetensors file: its header length (%llu) is past %s", f->path, (unsigned long long)n,
        n > MAX_ST_HEADER ? "100 MiB" : "the end of the file");
  char *text = xmalloc((size_t)n + 1);
  read_at(f, text, (size_t)n, 8);
  text[n] = 0;
  json_error_t je;
  json_t *h = json_read(text, (size_t)n, JSON_REJECT_DUPLICATES, &je);
  if (!json_is_object(h))
    die(1, "%s: error: the safetensors header is not a JSON object%s%s", f->path, h ? "" : ": ",
        h ? "" : shown(je.text, strlen(je.text))); /* (jansson's text quotes the file) */
  const char *key;
  json_t *v;
  json_object_foreach(h, key, v) {
    if (strcmp(key, "__metadata__")) {
      st_entry(f, key, v);
      continue;
    }
    const char *mk;
    json_t *mv;
    if (!json_is_object(v)) die(1, "%s: error: __metadata__ is not an object of strings", f->path);
    json_object_foreach(v, mk, mv) if (!json_is_string(mv)) die(1, "%s: error: __metadata__ is not an object of strings", f->path);
  }
  json_decref(h);
  free(text);
  uint64_t data = 8 + n, at = 0;
  TensorEntry *sorted = xmalloc(sizeof *sorted * (size_t)(f->n ? f->n : 1));
  if (f->n) { /* (f->e is NULL for a file of no tensors) */
    memcpy(sorted, f->e, sizeof *sorted * (size_t)f->n);
    qsort(sorted, (size_t)f->n, sizeof *sorted, by_offset);
  }
  for (int i = 0; i < f->n; i++) {
    if (sorted[i].off != at)
      die(1, "%s: error: tensor '%s' starts at byte %llu of the data, where %s", f->path, sorted[i].shown,
          (unsigned long long)sorted[i].off, sorted[i].off < at ? "another tensor lies" : "a gap would be");
    at += sorted[i].bytes;
  }
  free(sorted);
  if (at != size - data)
    die(1, "%s: error: the tensors hold %llu bytes, but %llu follow the header", f->path, (unsigned long long)at,
        (unsigned long long)(size - data));
  for (int i = 0; i < f->n; i++) f->e[i].off += data;
}

/* The end of the central directory: where it is, its size and its entries (the ZIP64
   record where the plain one says to look there). */
static void zip_end(TensorFile *f, uint64_t size, uint64_t *dir, uint64_t *dirsize, uint64_t *count) {
  size_t tail = size < 22 + 0xffff ? (size_t)size : 22 + 0xffff;
  unsigned char *t = xmalloc(tail);
  read_at(f, t, tail, size - tail);
  long at = -1;
  for (long i = (long)tail - 22; i >= 0 && at < 0; i--)
    if (get32(t + i) == 0x06054b50 && (size_t)i + 22 + get16(t + i + 20) == tail) at = i;
  if (at < 0) die(1, "%s: error: not an .npz file (no zip directory at its end)", f->path);
  unsigned char *e = t + at;
  if (get16(e + 4) || get16(e + 6) || get16(e + 8) != get16(e + 10))
    die(1, "%s: error: a zip archive split over several disks", f->path);
  *count = get16(e + 10), *dirsize = get32(e + 12), *dir = get32(e + 16);
  uint64_t end = size - tail + (uint64_t)at;
  if (*count == 0xffff || *dirsize == 0xffffffff || *dir == 0xffffffff) {
    /* ZIP64: a locator just before, pointing at the 64-bit record */
    unsigned char loc[20], rec[56];
    if (end < 20) die(1, "%s: error: a damaged zip archive (no ZIP64 locator)", f->path);
    read_at(f, loc, 20, end - 20);
    uint64_t r = get64(loc + 8);
    if (get32(loc) != 0x07064b50 || r > end - 20 || end - 20 - r < 56)
      die(1, "%s: error: a damaged zip archive (its ZIP64 locator)", f->path);
    read_at(f, rec, 56, r);
    if (get32(rec) != 0x06064b50 || get32(rec + 16) || get32(rec + 20) || get64(rec + 24) != get64(rec + 32))
      die(1, "%s: error: a damaged zip archive (its ZIP64 record)", f->path);
    *count = get64(rec + 32), *dirsize = get64(rec + 40), *dir = get64(rec + 48);
    end = r;
  }
  free(t);
  if (*dir > end || *dirsize > end - *dir)
    die(1, "%s: error: a damaged zip archive (its directory lies past its end)", f->path);
  if (*dirsize > MAX_ZIP_DIR || *count > CAVS_MAX_PARAMS + 1)
    die(1, "%s: error: a zip archive of more than %d entries or a directory over 64 MiB", f->path, CAVS_MAX_PARAMS + 1);
}

/* A directory entry's ZIP64 extra field: the 64-bit values of those that say 0xffffffff,
   in the order usize, csize, offset. */
static void zip64_extra(TensorFile *f, const unsigned char *x, size_t xlen, uint64_t *usize, uint64_t *csize,
                        uint64_t *off) {
  uint64_t *want[3] = {usize, csize, off};
  for (size_t i = 0; i + 4 <= xlen;) {
    size_t id = get16(x + i), len = get16(x + i + 2), at = i + 4;
    if (len > xlen - at) break;
    if (id == 1)
      for (int k = 0; k < 3; k++) {
        if (*want[k] != 0xffffffff) continue;
        if (at + 8 > i + 4 + len) die(1, "%s: error: a damaged zip archive (a ZIP64 field)", f->path);
        *want[k] = get64(x + at);
        at += 8;
      }
    i += 4 + len;
  }
}

/* Input for an inflating entry: the next piece of its compressed bytes, when z has
   used up the last. false when there are none left. */
static bool feed(const TensorFile *f, const TensorEntry *e, z_stream *z, unsigned char *in, size_t cap, uint64_t *fed) {
  if (z->avail_in) return true;
  if (*fed == e->csize) return false;
  size_t k = e->csize - *fed < cap ? (size_t)(e->csize - *fed) : cap;
  read_at(f, in, k, e->off + *fed);
  *fed += k;
  z->next_in = in, z->avail_in = (uInt)k;
  return true;
}

/* A deflated entry's first n bytes into buf; with whole, the stream must end there. */
static void inflate_entry(const TensorFile *f, const TensorEntry *e, void *buf, size_t n, bool whole) {
  if (n > UINT32_MAX) die(1, "%s: error: entry '%s.npy' is too large to inflate (4 GiB)", f->path, e->shown);
  z_stream z = {0};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) die(2, "out of memory");
  unsigned char in[1 << 16], extra;
  uint64_t fed = 0;
  int rc = Z_OK;
  z.next_out = buf, z.avail_out = (uInt)n;
  while (z.avail_out && rc == Z_OK && feed(f, e, &z, in, sizeof in, &fed)) rc = inflate(&z, Z_NO_FLUSH);
  bool full = z.avail_out == 0, ended = rc == Z_STREAM_END;
  /* all of it read: the stream must end without another byte */
  z.next_out = &extra, z.avail_out = 1;
  while (whole && full && !ended && z.avail_out && rc == Z_OK && feed(f, e, &z, in, sizeof in, &fed))
    rc = inflate(&z, Z_NO_FLUSH), ended = rc == Z_STREAM_END && z.avail_out;
  inflateEnd(&z);
  if (!full || (whole && !ended))
    die(1, "%s: error: entry '%s.npy' does not inflate to the %llu bytes its directory says", f->path, e->shown,
        (unsigned long long)e->usize);
}

/* The first n bytes of entry e, uncompressed, into buf; with whole, n is the entry's
   size, and the entry must end there and match its CRC-32. */
static void entry_bytes(const TensorFile *f, const TensorEntry *e, void *buf, size_t n, bool whole) {
  if (e->deflated) inflate_entry(f, e, buf, n, whole);
  else read_at(f, buf, n, e->off);
  if (whole && crc32_z(crc32(0, Z_NULL, 0), buf, n) != e->crc)
    die(1, "%s: error: entry '%s.npy' is damaged (its CRC-32 does not match)", f->path, e->shown);
}

/* Python's repr of a string, a bool or a tuple of integers, as NumPy writes an .npy
   header: the few forms it uses, no more. */
typedef struct Lit {
  const char *p, *end;
} Lit;

static void lit_space(Lit *l) {
  while (l->p < l->end && (*l->p == ' ' || *l->p == '\n')) l->p++;
}
static bool lit_char(Lit *l, char c) {
  lit_space(l);
  if (l->p < l->end && *l->p == c) return l->p++, true;
  return false;
}
static bool lit_string(Lit *l, char *out, size_t cap) {
  lit_space(l);
  if (l->p >= l->end || (*l->p != '\'' && *l->p != '"')) return false;
  char q = *l->p++;
  size_t n = 0;
  for (*out = 0; l->p < l->end && *l->p != q; l->p++) {
    if (*l->p == '\\' || n + 1 >= cap) return false;
    out[n++] = *l->p, out[n] = 0;
  }
  return l->p < l->end && l->p++;
}
static bool lit_word(Lit *l, const char *w) {
  lit_space(l);
  size_t n = strlen(w);
  if ((size_t)(l->end - l->p) < n || memcmp(l->p, w, n)) return false;
  l->p += n;
  return true;
}
static bool lit_shape(Lit *l, TensorEntry *e) {
  if (!lit_char(l, '(')) return false;
  for (e->rank = 0; !lit_char(l, ')');) {
    lit_space(l);
    if (e->rank == TENSOR_MAX_RANK || l->p >= l->end || *l->p < '0' || *l->p > '9') return false;
    int64_t v = 0;
    for (; l->p < l->end && *l->p >= '0' && *l->p <= '9'; l->p++)
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *l->p - '0', &v)) return false;
    e->shape[e->rank++] = v;
    if (!lit_char(l, ',') && !(lit_space(l), l->p < l->end && *l->p == ')')) return false;
  }
  return true;
}

/* An .npy header's dict: descr, fortran_order and shape, each once. */
static void npy_dict(const TensorFile *f, TensorEntry *e, const char *text, size_t n) {
  Lit l = {text, text + n};
  char key[32], descr[64] = "";
  int seen = 0, fortran = 0;
  bool ok = lit_char(&l, '{');
  while (ok && !lit_char(&l, '}')) {
    ok = lit_string(&l, key, sizeof key) && lit_char(&l, ':');
    /* a key that is no string leaves key as it was: unset on the first */
    int bit = !ok ? 0 : !strcmp(key, "descr") ? 1 : !strcmp(key, "fortran_order") ? 2 : !strcmp(key, "shape") ? 4 : 0;
    ok = ok && bit && !(seen & bit);
    seen |= bit;
    if (ok && bit == 1) ok = lit_string(&l, descr, sizeof descr);
    if (ok && bit == 2) ok = lit_word(&l, "False") || (lit_word(&l, "True") && (fortran = 1));
    if (ok && bit == 4) ok = lit_shape(&l, e);
    ok = ok && (lit_char(&l, ',') || (lit_space(&l), l.p < l.end && *l.p == '}'));
  }
  lit_space(&l);
  if (!ok || seen != 7 || l.p != l.end)
    die(1, "%s: error: entry '%s.npy' has no .npy header NumPy writes ({'descr': ..., 'fortran_order': ..., 'shape': (...), })",
        f->path, e->shown);
  /* '<f4' and '<f8' as NumPy writes them on this machine; '>' swapped; '=' native */
  int size = 0;
  if ((descr[0] == '<' || descr[0] == '>' || descr[0] == '=') && descr[1] == 'f' && !descr[3])
    size = descr[2] == '4' ? 4 : descr[2] == '8' ? 8 : 0;
  char q[4 * 80 + 4];
  snprintf(e->dtype, sizeof e->dtype, "%s", cv_quote(q, descr, strlen(descr), 80));
  if (!size)
    die(1, "%s: error: entry '%s.npy' is of dtype '%s'; cavs reads float32 and float64 ('<f4', '<f8')", f->path, e->shown,
        e->dtype);
  e->real = true;
  e->f64 = size == 8;
  e->swap = descr[0] == '>';
  if (fortran && e->rank > 1)
    die(1, "%s: error: entry '%s.npy' is in Fortran order; save np.ascontiguousarray(a) instead", f->path, e->shown);
  if (!shape_bytes(e, size)) die(1, "%s: error: entry '%s.npy': its shape overflows", f->path, e->shown);
}

/* An entry's .npy header: magic, version, header length, the dict; the rest of the
   entry must be the data. */
static void npy_header_of(TensorFile *f, TensorEntry *e) {
  unsigned char pre[12];
  if (e->usize < 10) die(1, "%s: error: entry '%s.npy' is not an .npy array", f->path, e->shown);
  entry_bytes(f, e, pre, e->usize < 12 ? (size_t)e->usize : 12, false);
  if (memcmp(pre, "\x93NUMPY", 6) || pre[6] < 1 || pre[6] > 3)
    die(1, "%s: error: entry '%s.npy' is not an .npy array (version 1 to 3)", f->path, e->shown);
  uint64_t hlen = pre[6] == 1 ? get16(pre + 8) : e->usize >= 12 ? get32(pre + 8) : UINT64_MAX, start = pre[6] == 1 ? 10 : 12;
  if (hlen > MAX_NPY_HEADER || hlen > e->usize - start)
    die(1, "%s: error: entry '%s.npy': its header length is past %s", f->path, e->shown,
        hlen > MAX_NPY_HEADER ? "64 KiB" : "the entry's end");
  char *head = xmalloc((size_t)(start + hlen));
  entry_bytes(f, e, head, (size_t)(start + hlen), false);
  npy_dict(f, e, head + start, (size_t)hlen);
  free(head);
  e->skip = start + hlen;
  if (e->bytes != e->usize - e->skip)
    die(1, "%s: error: entry '%s.npy' holds %llu bytes of data, not the %llu its shape and dtype take", f->path, e->shown,
        (unsigned long long)(e->usize - e->skip), (unsigned long long)e->bytes);
}

/* One directory entry at d[*at], within d[0..n): the tensor it holds, or nothing for an
   entry that is no .npy (our __metadata__.json among them). */
static void zip_dir_entry(TensorFile *f, const unsigned char *d, size_t n, size_t *at, uint64_t dir) {
  const unsigned char *h = d + *at;
  if (n - *at < 46 || get32(h) != 0x02014b50) die(1, "%s: error: a damaged zip archive (its directory)", f->path);
  size_t nlen = get16(h + 28), xlen = get16(h + 30), clen = get16(h + 32);
  if (n - *at - 46 < nlen + xlen + clen) die(1, "%s: error: a damaged zip archive (its directory)", f->path);
  const char *name = (const char *)h + 46;
  *at += 46 + nlen + xlen + clen;
  if (nlen < 4 || memcmp(name + nlen - 4, ".npy", 4)) return;
  TensorEntry *e = add_entry(f, name, nlen - 4);
  int flags = get16(h + 8), method = get16(h + 10);
  uint64_t usize = get32(h + 24), csize = get32(h + 20), off = get32(h + 42);
  zip64_extra(f, h + 46 + nlen, xlen, &usize, &csize, &off);
  if (flags & 1) die(1, "%s: error: entry '%s.npy' is encrypted", f->path, e->shown);
  if (method != 0 && method != 8)
    die(1, "%s: error: entry '%s.npy' is compressed by method %d (cavs reads stored and deflated entries)", f->path,
        e->shown, method);
  if (method == 0 && csize != usize) die(1, "%s: error: entry '%s.npy' is stored, but its sizes differ", f->path, e->shown);
  unsigned char local[30];
  if (off > dir || dir - off < 30) die(1, "%s: error: entry '%s.npy' lies past the archive's entries", f->path, e->shown);
  read_at(f, local, 30, off);
  uint64_t data = off + 30 + get16(local + 26) + get16(local + 28);
  if (get32(local) != 0x04034b50 || data > dir || csize > dir - data)
    die(1, "%s: error: entry '%s.npy' lies past the archive's entries", f->path, e->shown);
  e->zip = true, e->deflated = method == 8;
  e->off = data, e->csize = csize, e->usize = usize, e->crc = get32(h + 16);
  npy_header_of(f, e);
}

static void open_npz(TensorFile *f, uint64_t size) {
  uint64_t dir, dirsize, count;
  zip_end(f, size, &dir, &dirsize, &count);
  unsigned char *d = xmalloc((size_t)dirsize);
  read_at(f, d, (size_t)dirsize, dir);
  size_t at = 0;
  for (uint64_t i = 0; i < count; i++) zip_dir_entry(f, d, (size_t)dirsize, &at, dir);
  free(d);
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const TensorEntry *)a)->name, ((const TensorEntry *)b)->name);
}

TensorFile *tensors_open(const char *path) {
  int format = tensors_format(path);
  if (!format) die(1, "%s: name the file FILE.safetensors or FILE.npz (the format goes by the name)", path);
  TensorFile *f = xmalloc(sizeof *f);
  /* (O_NONBLOCK: a FIFO is refused below, not waited on) */
  *f = (TensorFile){.path = path, .fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (f->fd < 0) die(file_status(errno), "cannot open '%s': %s", path, strerror(errno));
  struct stat st;
  if (fstat(f->fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > MAX_TENSOR_FILE)
    die(1, "%s: error: not a regular file of at most 64 GiB", path);
  if (format == 1) open_safetensors(f, (uint64_t)st.st_size);
  else open_npz(f, (uint64_t)st.st_size);
  keep(f->e);
  for (int i = 0; i < f->n; i++)
    if (!f->e[i].real)
      die(1, "%s: error: tensor '%s' is %s; cavs reads F32 and F64", path, f->e[i].shown, f->e[i].dtype);
  if (f->n) qsort(f->e, (size_t)f->n, sizeof *f->e, by_name);
  for (int i = 1; i < f->n; i++)
    if (!strcmp(f->e[i - 1].name, f->e[i].name)) die(1, "%s: error: it holds tensor '%s' twice", path, f->e[i].shown);
  return f;
}

const TensorEntry *tensors_find(const TensorFile *f, const char *name) {
  TensorEntry key = {.name = (char *)name};
  return f->n ? bsearch(&key, f->e, (size_t)f->n, sizeof *f->e, by_name) : NULL;
}

/* ---- reading: the data ---- */

/* "[3, 4]": where element i of e lies, for a message */
static char *where(const TensorEntry *e, uint64_t i) {
  char *out = xmalloc(24 * TENSOR_MAX_RANK + 4), *p = out;
  *p++ = '[';
  uint64_t stride = e->count;
  for (int k = 0; k < e->rank; k++) {
    stride /= (uint64_t)e->shape[k];
    p += sprintf(p, "%s%llu", k ? ", " : "", (unsigned long long)(i / stride));
    i %= stride;
  }
  strcpy(p, "]");
  return out;
}

void tensors_read(const TensorFile *f, const TensorEntry *e, void *dst, bool f64) {
  /* an .npz entry whole, checked, its data past its header; a safetensors tensor */
  uint64_t n = e->zip ? e->usize : e->bytes;
  unsigned char *raw = xmalloc((size_t)n);
  if (e->zip) entry_bytes(f, e, raw, (size_t)n, true);
  else read_at(f, raw, (size_t)n, e->off);
  const unsigned char *p = raw + e->skip;
  size_t es = e->f64 ? 8 : 4;
  for (uint64_t i = 0; i < e->count; i++, p += es) {
    unsigned char b[8];
    for (size_t k = 0; k < es; k++) b[k] = p[e->swap ? es - 1 - k : k];
    double x;
    float y;
    uint64_t u = es == 8 ? get64(b) : get32(b);
    if (es == 8) memcpy(&x, &u, 8);
    else memcpy(&y, &(uint32_t){(uint32_t)u}, 4), x = y;
    if (!isfinite(x) || (!f64 && !isfinite((float)x)))
      die(1, "%s: error: tensor '%s' holds %s at %s%s", f->path, e->shown, isfinite(x) ? fmt("%g", x) : isnan(x) ? "a NaN" : "an infinity",
          where(e, i), isfinite(x) ? ", past the range of float" : "");
    if (f64) ((double *)dst)[i] = x;
    else ((float *)dst)[i] = (float)x;
  }
  free(raw);
}

/* alloc_track.c: the table behind alloc_track.h (built without its macros). Open
 * addressing over the block addresses, with tombstones; rebuilt when it fills. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TOMB ((void *)1)

static void **tab;
static size_t cap, used, live; /* used: live + tombstones */

static size_t slot_of(const void *p) {
  uint64_t h = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
  return (size_t)(h >> 20) & (cap - 1);
}

static void put(void *p);

static void rebuild(size_t ncap) {
  void **old = tab;
  size_t ocap = cap;
  tab = calloc(ncap, sizeof *tab);
  if (!tab) abort();
  cap = ncap;
  used = live = 0;
  for (size_t i = 0; i < ocap; i++)
    if (old[i] && old[i] != TOMB) put(old[i]);
  free(old);
}

static void put(void *p) {
  if (!p) return;
  if ((used + 1) * 2 > cap) rebuild(cap && live * 4 < cap ? cap : (cap ? cap * 2 : 1024));
  size_t i = slot_of(p);
  while (tab[i] && tab[i] != TOMB) i = (i + 1) & (cap - 1);
  if (!tab[i]) used++;
  tab[i] = p;
  live++;
}

/* Removes p; false if it is not a tracked block. */
static int take(void *p) {
  if (!p || !cap) return 0;
  for (size_t i = slot_of(p); tab[i]; i = (i + 1) & (cap - 1))
    if (tab[i] == p) {
      tab[i] = TOMB;
      live--;
      return 1;
    }
  return 0;
}

void *ft_malloc(size_t n) {
  void *p = malloc(n);
  put(p);
  return p;
}

void *ft_calloc(size_t n, size_t size) {
  void *p = calloc(n, size);
  put(p);
  return p;
}

void *ft_realloc(void *p, size_t n) {
  take(p); /* a block from elsewhere is AddressSanitizer's to judge */
  void *q = realloc(p, n);
  if (q) put(q);
  else if (n) put(p); /* failed: p is still live */
  return q;
}

void ft_free(void *p) {
  take(p);
  free(p);
}

size_t ft_release_all(void) {
  size_t n = live;
  for (size_t i = 0; i < cap; i++)
    if (tab[i] && tab[i] != TOMB) free(tab[i]);
  if (cap) memset(tab, 0, cap * sizeof *tab);
  used = live = 0;
  return n;
}

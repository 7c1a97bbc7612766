/* alloc_track.h: forced (-include) into the compiler's sources when they are built for
 * the fuzz_vf target. The compiler never frees its memory (an arena and vectors that live
 * until exit: it is a short-lived process), so a fuzzer that runs it once per input would
 * grow without bound. Every malloc, calloc, realloc and free of the compiler goes through
 * a table of live blocks instead, and ft_release_all() frees what one input left behind.
 * Blocks are still ordinary malloc blocks: AddressSanitizer checks them as before. */
#ifndef ALLOC_TRACK_H
#define ALLOC_TRACK_H

#include <stdlib.h>
#include <string.h>

void *ft_malloc(size_t n);
void *ft_calloc(size_t n, size_t size);
void *ft_realloc(void *p, size_t n);
void ft_free(void *p);
/* Frees every block still live; returns how many there were. */
size_t ft_release_all(void);

#define malloc(n) ft_malloc(n)
#define calloc(n, size) ft_calloc(n, size)
#define realloc(p, n) ft_realloc(p, n)
#define free(p) ft_free(p)

#endif

/* memfile.h: a fuzz input as a file that the code under test opens by its path: a memfd,
 * reached through /proc/self/fd (no disk, nothing added to the library), emptied and
 * written again for each input. For the harnesses, one file each. */
#ifndef MEMFILE_H
#define MEMFILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static int mf_fd = -1;
static char mf_path[64];

/* size bytes at offset at of the file */
static void mf_put(const void *data, size_t size, off_t at) {
  for (size_t done = 0; done < size;) {
    ssize_t w = pwrite(mf_fd, (const char *)data + done, size - done, at + (off_t)done);
    if (w <= 0) abort();
    done += (size_t)w;
  }
}

/* The file (made on the first call, named name in /proc/self/fd's links) holding the
   input alone; returns its path. */
static const char *mf_write(const char *name, const uint8_t *data, size_t size) {
  if (mf_fd < 0) {
    mf_fd = memfd_create(name, 0);
    if (mf_fd < 0) abort();
    snprintf(mf_path, sizeof mf_path, "/proc/self/fd/%d", mf_fd);
  }
  if (ftruncate(mf_fd, 0)) abort();
  mf_put(data, size, 0);
  return mf_path;
}

#endif

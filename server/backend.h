/* Backends: one open storage endpoint (a local file or block device; later
 * a remote NBD server), shared by every table that names it.  Backends are
 * deduplicated by canonical name and refcounted; the ops are asynchronous in
 * shape: submit() takes a clone and completes it with clone_done(), inline
 * (file) or later from an I/O thread (remote).
 */
#ifndef NBDMAPPER_BACKEND_H
#define NBDMAPPER_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

struct clone;
struct backend;

struct backend_ops {
  const char *kind;                       /* "file" */
  void (*submit) (struct backend *be, struct clone *c);
  /* Extents of [offset, offset+len) in backend coordinates, reported
   * through fn in ascending, contiguous order.  Return 0 or -errno.
   */
  int (*extents) (struct backend *be, uint64_t offset, uint64_t len,
                  bool req_one, mapper_extent_fn fn, void *opaque);
  /* The backend's current size in bytes: tables are validated against
   * it at load (a file may have grown or shrunk since it was opened).
   */
  int (*get_size) (struct backend *be, uint64_t *size);
  void (*close) (struct backend *be);
};

struct backend {
  /* Read-only after open. */
  const struct backend_ops *ops;
  char *name;                   /* for people: realpath for files */
  char *key;                    /* identity: "file:DEV:INO", "blk:RDEV" */
  struct mapper_caps caps;      /* size, what it supports, block sizes */

  /* Protected by the backend registry lock (backend.c). */
  unsigned refs;
  struct backend *next;
};

/* backend.c: the registry. */
int backend_get (const char *spec, struct backend **out,
                 struct mapper_err *err);
void backend_put (struct backend *be);

/* backends/file.c */
struct stat;
int file_backend_key (const struct stat *st, char **key);
int file_backend_open (const char *path, const char *canonical,
                       const struct stat *st, struct backend **out,
                       struct mapper_err *err);

#endif /* NBDMAPPER_BACKEND_H */

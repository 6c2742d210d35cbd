/* Backends: one open storage endpoint (a local file or block device; later
 * a remote NBD server), shared by every table that names it.  Backends are
 * deduplicated by canonical name and refcounted; the ops are asynchronous in
 * shape: submit() takes a clone and completes it with clone_done(), inline
 * (file) or later from an I/O thread (remote).
 */
#ifndef NBDMAPPER_BACKEND_H
#define NBDMAPPER_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

struct clone;
struct backend;

struct backend_ops {
  const char *kind;                       /* "file", "nbd" */
  /* Local backends whose flush and FUA writes wait for a device: when a
   * request has several such clones, they run side by side on the local
   * pool (localpool.c) instead of one after the other.
   */
  bool device_wait;
  void (*submit) (struct backend *be, struct clone *c);
  /* Optional: the backend completes in the I/O loop (ioloop.c).  submit()
   * queues the clone with ioloop_submit(); start() is then called in the
   * loop thread.  io_req_run queues such clones first, as one batch.
   */
  void (*start) (struct backend *be, struct clone *c);
  /* Extents of [offset, offset+len) in backend coordinates, reported
   * through fn in ascending, contiguous order.  Return 0 or -errno.
   */
  int (*extents) (struct backend *be, uint64_t offset, uint64_t len,
                  bool req_one, mapper_extent_fn fn, void *opaque);
  /* The backend's current size in bytes: tables are validated against
   * it at load (a file may have grown or shrunk since it was opened).
   */
  int (*get_size) (struct backend *be, uint64_t *size);
  /* Optional: the backend's state as one line of text (connections...);
   * returns bytes needed (snprintf style).
   */
  size_t (*status) (struct backend *be, char *buf, size_t len);
  /* Optional: the latest error stamp (flush.c) of what the backend
   * reaches besides itself (a stacked device's own backends), so that a
   * flush skipping a clean stacked device still reports them.
   */
  uint64_t (*errseq) (struct backend *be);
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

  /* Flush bookkeeping (flush.c).  write_gen advances with completed writes
   * (write, zero, trim without native FUA); a flush that starts when
   * write_gen is G makes every write counted in G durable.
   */
  _Atomic uint64_t write_gen;
  /* write_gen as the most recently started flush saw it: a write need
   * only bump write_gen when it still equals this (read-mostly, so the
   * hot path does not bounce write_gen's cache line on every write).
   */
  _Atomic uint64_t started_gen;
  pthread_mutex_t flush_lock;   /* protects the fields below */
  pthread_cond_t flush_cond;    /* a flush finished */
  bool flush_running;
  uint64_t running_gen;         /* write_gen when the running flush began */
  uint64_t running_seq;         /* its number */
  uint64_t done_seq;            /* number of the last finished flush */
  uint64_t failed_seq;          /* number of the last failed flush */
  uint64_t flushed_gen;         /* covered by the last good flush */
  uint64_t lost_seq;            /* flushes up to this one were running
                                   when writes were lost: they fail */
  uint64_t nr_flushes;          /* flushes sent to the backend */
  /* The error clock's stamp of the last failed flush or lost write
   * (flush.c): observers that sampled the clock before it fail their
   * next flush once.
   */
  _Atomic uint64_t err_seq;
};

/* flush.c */
void backend_flush_init (struct backend *be);
void backend_flush_destroy (struct backend *be);
/* A connection to the backend dropped: acknowledged writes that were not
 * flushed may be gone, so the next flush covering it fails with EIO.
 */
void backend_writes_lost (struct backend *be);
/* The error clock now: an observer's starting point. */
uint64_t errseq_sample (void);
/* be's latest error stamp, including a stacked device's backends. */
uint64_t backend_errseq (struct backend *be);
/* A device dropped be at a swap: keep its errors for the device's
 * observers, whose flushes no longer reach it.
 */
void errseq_note_dropped (_Atomic uint64_t *dev_err, struct backend *be);
/* An observer flushed having sampled the clock at sample. */
void errseq_seen (_Atomic uint64_t *seen, uint64_t sample);

/* backend.c: the registry. */
int backend_get (const char *spec, struct backend **out,
                 struct mapper_err *err);
void backend_put (struct backend *be);
void backend_hold (struct backend *be);

/* backends/file.c */
struct stat;
int file_backend_key (const struct stat *st, char **key);
int file_backend_open (const char *path, const char *canonical,
                       const struct stat *st, struct backend **out,
                       struct mapper_err *err);

/* backends/device.c: "mapper:NAME", another device of this server. */
#define DEVICE_BACKEND_PREFIX "mapper:"
struct device;
int device_backend_open (const char *spec, struct backend **out,
                         struct mapper_err *err);
/* The device behind a device backend, or NULL for other kinds. */
struct device *device_backend_device (const struct backend *be);
/* backends/nbd.c: remote NBD servers, keyed by normalised URI. */
bool nbd_backend_is_uri (const char *spec);
int nbd_backend_normalize (const char *spec, char **uri,
                           struct mapper_err *err);
int nbd_backend_open (const char *uri, struct backend **out,
                      struct mapper_err *err);
/* Stop the host name resolver (engine_stop, after the I/O loop). */
void nbd_resolver_stop (void);

#endif /* NBDMAPPER_BACKEND_H */

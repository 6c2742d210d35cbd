/* SPDX-License-Identifier: BSD-3-Clause */
/* The backend API: everything a backend (server/backends/) sees of the
 * engine, as an nbdkit plugin sees <nbdkit-plugin.h>.  A backend
 * includes this and "util.h", never internal.h; this header compiles
 * alone.
 *
 * A backend is one open storage endpoint (a local file or block device,
 * a remote NBD server, another device of this server), shared by every
 * table that names it: the registry (backend.c) deduplicates backends by
 * key and refcounts them.  The ops are asynchronous in shape: submit()
 * takes a clone and completes it with clone_done(), inline (file) or
 * later from an I/O thread (remote).
 */
#ifndef NBDMAPPER_BACKEND_H
#define NBDMAPPER_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

struct backend;
struct device;
struct io_req;
struct ev_loop;

/* One piece of a request, addressed to one backend.  buf points into the
 * client's buffer (or is NULL for zero/trim/flush).  A backend reads be,
 * offset, len, buf, flags and op, and completes the clone exactly once
 * with clone_done; the fields marked "core" are the engine's.
 */
struct clone {
  struct io_req *req;           /* core: the request it is part of */
  struct backend *be;
  uint64_t offset;              /* backend coordinates, bytes */
  uint64_t len;
  char *buf;
  uint32_t flags;               /* MAPPER_FUA, MAPPER_MAY_TRIM, ... */
  enum io_op op;
  uint64_t seq;                 /* core: IO_FLUSH: the backend flush's no. */
  /* core: optional per-target completion hook (io_emit_end_io), see
   * target.h's clone_end_io_fn.
   */
  int (*end_io) (struct clone *c, void *ctx, uint64_t arg, int error);
  void *end_io_ctx;
  uint64_t end_io_arg;
  /* core: optional hook the request's waiter calls when end_io returned
   * CLONE_REMAP (io_emit_remap, target.h's clone_remap_fn); remap_due
   * says it is wanted.
   */
  int (*remap) (struct clone *c, void *ctx, uint64_t arg);
  bool remap_due;
  struct clone *retry_next;     /* core: io_req.retry list */
  struct clone *qnext;          /* core: io_req_run's local clones, then the
                                 * I/O loop's or local pool's queue */
};

/* A clone flag beyond the request's (engine.h's MAPPER_*): the target has
 * somewhere else to send the clone (a multipath's other paths), so a
 * backend that loses the connection carrying it, or has none, fails it
 * at once instead of holding it for a reconnection (Linux's
 * REQ_FAILFAST_TRANSPORT, which dm-mpath sets on its clones).
 */
#define CLONE_FAILFAST 0x10000

struct backend_ops {
  const char *kind;             /* "file", "nbd", "device": its kind's name */
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
  /* Optional: the device of this server the backend stacks on (a
   * "mapper:NAME" backend), for the core's walks of stacks: cycles
   * refused at load, the tables holding a device.  NULL for others.
   */
  struct device *(*lower_device) (struct backend *be);
  /* Optional: give up every clone of be whose end_io_ctx is owner (a
   * multipath target's path timed out): each completes with -EIO, and
   * only once nothing can write into its buffer any more (nbd: the
   * backend's connections are closed first, and the other clones on
   * them retried as after a lost connection).  Returns when they have
   * completed.  From any thread but the I/O loop's.
   */
  void (*abandon) (struct backend *be, void *owner);
  void (*close) (struct backend *be);
};

/* The flush bookkeeping of one backend, the core's (flush.c, whose
 * head comment is its specification): in struct backend so that a
 * completed write reaches it without a pointer, but no backend reads or
 * writes it.
 */
struct backend_flush {
  /* write_gen advances with completed writes (write, zero, trim
   * without native FUA); a flush that starts when write_gen is G makes
   * every write counted in G durable.
   */
  _Atomic uint64_t write_gen;
  /* write_gen as the most recently started flush saw it: a write need
   * only bump write_gen when it still equals this (read-mostly, so the
   * hot path does not bounce write_gen's cache line on every write).
   */
  _Atomic uint64_t started_gen;
  pthread_mutex_t lock;         /* protects the fields below */
  pthread_cond_t cond;          /* a flush finished */
  bool running;                 /* a flush is running */
  uint64_t running_gen;         /* write_gen when the running flush began */
  uint64_t running_seq;         /* its number */
  uint64_t done_seq;            /* number of the last finished flush */
  uint64_t failed_seq;          /* number of the last failed flush */
  uint64_t flushed_gen;         /* covered by the last good flush */
  uint64_t lost_seq;            /* flushes up to this one were running
                                   when writes were lost: they fail */
  uint64_t nr_flushes;          /* flushes sent to the backend */
  /* The error clock's stamp of the last failed flush or lost write:
   * observers that sampled the clock before it fail their next flush
   * once.
   */
  _Atomic uint64_t err_seq;
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

  /* The core's (flush.c), never a backend's. */
  struct backend_flush flush;
};

/* flush.c: c is done, with 0 or -errno; from any thread, exactly once.
 * The core counts the write or ends the flush on c->be (its flush
 * bookkeeping), then completes c's part of its request.
 */
void clone_done (struct clone *c, int error);

/* io.c: is c its request's only clone?  Then a backend may complete it
 * before its submit returns (waiting for a reply there) without holding
 * up another clone of the request.
 */
bool clone_alone (const struct clone *c);

/* flush.c: a connection to the backend dropped: acknowledged writes that
 * were not flushed may be gone, so the next flush covering it fails with
 * EIO.
 */
void backend_writes_lost (struct backend *be);

/* ioloop.c: for backends that complete in the I/O loop, the one thread
 * that owns every remote connection.
 */
struct ioloop_job {
  struct ioloop_job *next;
  /* Runs in the loop thread; error is -ESHUTDOWN if the loop stopped
   * (or could not start) before running it.
   */
  void (*fn) (struct ioloop_job *job, int error);
};
/* ops->submit of a loop backend: queue c; start() runs in the loop. */
void ioloop_submit (struct backend *be, struct clone *c);
void ioloop_queue_job (struct ioloop_job *job);
/* Queue job for the loop of generation gen if that loop still runs (it
 * never starts one); false if not, and the caller keeps the job.  For
 * threads that may outlive a loop.
 */
bool ioloop_post (struct ioloop_job *job, unsigned gen);
/* Run fn(arg) in the loop thread and wait; inline if no loop runs. */
void ioloop_call (void (*fn) (void *arg), void *arg);
/* In the loop thread: the loop, for the backend's own watchers. */
struct ev_loop *ioloop_ev (void);
/* Which loop runs now (bumped at each start): a backend re-adopts its
 * connections when it finds a new one.
 */
unsigned ioloop_generation (void);
bool ioloop_in_loop_thread (void);

/* A kind of backend, as qemu's protocol drivers are: the registry
 * (backend.c) asks each kind, in the order of backends/backends.def,
 * whether it claims a spec, and the first that does names the spec's
 * identity and opens it.  One per file under backends/, registered by
 * one line in backends.def; nothing else in the engine names a kind.
 */
struct backend_kind {
  /* Is spec (a table's <dev> word, not empty) this kind's?  Looks at
   * the text only.
   */
  bool (*claims) (const char *spec);
  /* The identity of what spec names, malloc'd in *key: specs with one
   * key are one backend, opened once and shared.  Keys of different
   * kinds never collide.  0, or -errno with err filled (naming spec).
   */
  int (*key) (const char *spec, char **key, struct mapper_err *err);
  /* Open spec, whose identity is key (the registry sets be->key).  May
   * take long (a remote backend connects): called without the
   * registry's lock.  0, or -errno with err filled (naming spec).
   */
  int (*open) (const char *spec, const char *key, struct backend **out,
               struct mapper_err *err);
  /* Optional: stop the kind's own threads, at engine_stop after the I/O
   * loop (a thread that starts on first use, so there is no start).
   */
  void (*stop) (void);
};

/* The device be stacks on (its lower_device op), or NULL. */
static inline struct device *
backend_lower_device (struct backend *be)
{
  return be->ops->lower_device ? be->ops->lower_device (be) : NULL;
}

/* How a table names another device of this server (stacking,
 * backends/stacked.c), as the core's messages about stacks spell it.
 */
#define DEVICE_BACKEND_PREFIX "mapper:"

#endif /* NBDMAPPER_BACKEND_H */

/* SPDX-License-Identifier: BSD-3-Clause */
/* Private declarations of the engine, grouped by defining file. */
#ifndef NBDMAPPER_INTERNAL_H
#define NBDMAPPER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "util.h"
#include "engine.h"
#include "backend.h"
#include "target.h"

extern const char *const io_op_name[];

/* A request in flight: lives on the submitting worker's stack.  Clone
 * descriptors go in the inline array, spilling to the heap only for very
 * wide fan-outs.
 */
#define IO_INLINE_CLONES 16
struct io_req {
  enum io_op op;
  uint32_t flags;
  _Atomic int pending;          /* clones not yet done, +1 while issuing */
  _Atomic int error;            /* first -errno wins */
  /* Clones whose end_io asked for a retry (CLONE_RETRY), pushed from any
   * thread, resubmitted by the waiter in io_req_run.
   */
  struct clone *_Atomic retry;
  struct clone *clones;
  size_t nr, cap;
  uint64_t start_ns;            /* io_req_start_ns(), 0 until asked */
  struct clone inline_clones[IO_INLINE_CLONES];
};

/* localpool.c: run a blocking local clone on a pool thread; false if it
 * cannot (the caller runs it inline).
 */
bool localpool_submit (struct clone *c);
void localpool_stop (void);

/* engine.c */
void mapper_log_io_req (const char *devname, const struct io_req *req,
                        uint64_t offset, uint64_t count);

/* ioloop.c: the thread owning every remote connection (the part for
 * backends is in backend.h).
 */
int ioloop_start (struct mapper_err *err);
void ioloop_stop (void);

/* plug.c: this thread is issuing a request's clones (io_req_run): from
 * io_plug_start to io_plug_finish, a submitter that batches may hold
 * clones back, having registered a callback with io_plug_add_cb, which
 * io_plug_finish runs.  Plugs nest; every finish runs every callback.
 */
struct io_plug_cb {
  struct io_plug_cb *next;
  void (*unplug) (struct io_plug_cb *cb);       /* send what was held */
};
void io_plug_start (void);
void io_plug_finish (void);
/* Register cb on this thread's plug: false if there is none (then send
 * at once).  At most once until the next finish: cb is a list link.
 */
bool io_plug_add_cb (struct io_plug_cb *cb);

/* io.c: the request/clone core. */
/* The request's side of clone_done (flush.c), after the backend's
 * bookkeeping: c is done and its request sees seen (0 or -errno); or
 * c's end_io asked for a retry (CLONE_RETRY): the waiter submits it
 * again.
 */
void io_req_clone_end (struct clone *c, int seen);
void io_req_clone_retry (struct clone *c);
/* Inline: every request on the hot path starts and ends with these. */
static inline void
io_req_init (struct io_req *req, enum io_op op, uint32_t flags)
{
  req->op = op;
  req->flags = flags;
  atomic_init (&req->pending, 1);      /* held while issuing */
  atomic_init (&req->error, 0);
  atomic_init (&req->retry, NULL);
  req->clones = req->inline_clones;
  req->nr = 0;
  req->cap = IO_INLINE_CLONES;
  req->start_ns = 0;
}
static inline void
io_req_release (struct io_req *req)
{
  if (req->clones != req->inline_clones)
    free (req->clones);
}
struct clone *io_req_new_clone (struct io_req *req);
int io_req_run (struct io_req *req);
/* The request failed while being mapped: its clones are never submitted.
 * Hooked clones still get their end_io (-ECANCELED), for the target's
 * accounting.
 */
void io_req_cancel (struct io_req *req);

/* flush.c */
void backend_flush_init (struct backend *be);
void backend_flush_destroy (struct backend *be);
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
/* Make every write completed on bes[0..n) so far durable: at most one
 * backend flush each, in parallel, shared with concurrent callers, none
 * for a clean backend.  0 or the first -errno.
 */
int io_flush_backends (struct backend *const *bes, size_t n);
/* The same, with each backend's own result in errs[0..n) (0 or -errno;
 * errs may be NULL), for an observer that last sampled the error clock
 * at seen (flush.c): also -EIO for a backend with a later error stamp.
 * seen UINT64_MAX: no observer, the flushes' own results only.
 */
int io_flush_backends_seen (struct backend *const *bes, size_t n, int *errs,
                            uint64_t seen);
/* A write-type clone completed on be, or failed there before a retry
 * elsewhere (clone_done, which is in flush.c: the completion every
 * backend calls keeps its bookkeeping).
 */
void flush_note_write (struct backend *be);

/* backend.c: the registry.  Open (or share) the backend spec names;
 * another reference to one held; drop one (the last closes it).
 */
int backend_get (const char *spec, struct backend **out,
                 struct mapper_err *err);
void backend_hold (struct backend *be);
void backend_put (struct backend *be);
/* engine_stop: each kind's stop hook (struct backend_kind). */
void backend_kinds_stop (void);

/* table.c */
DEFINE_VECTOR_TYPE (backend_vector, struct backend *);
/* What a table maps of a device it stacks on (a "mapper:NAME" backend):
 * the end of its furthest area and the OR of every area's offset and
 * length (for the block size), in bytes.
 */
struct stack_use {
  struct backend *be;
  uint64_t end;
  uint64_t align;
};
DEFINE_VECTOR_TYPE (stack_use_vector, struct stack_use);
struct table {
  /* Immutable once built. */
  char *origin;                 /* file name or "<string>", for messages */
  struct target *targets;       /* sorted by begin, contiguous from 0 */
  size_t nr_targets;
  /* ends[i] = targets[i].begin + len.  Over TABLE_INDEX_KEYS targets it
   * is also the leaf level of the lookup index: cache-line aligned and
   * padded with UINT64_MAX to a whole number of nodes.
   */
  uint64_t *ends;
  /* The lookup index's upper levels, root first: levels[l] holds nodes
   * of TABLE_INDEX_KEYS keys, one cache line each; key k of node n is
   * the largest end under its child k, node n * (TABLE_INDEX_KEYS + 1) + k
   * of the level below (ends below the last).  NULL and depth 0 when
   * ends is a single node.  One allocation, table.c.
   */
  uint64_t **levels;
  unsigned depth;
  unsigned nr_path_flushers;    /* targets whose type has .paths */
  unsigned nr_flush_hooks;      /* targets with a flush() hook */
  bool has_flush_failed;        /* some target has flush_failed() */
  bool read_only;               /* table_set_read_only: no writes */
  /* Set by a noflush suspend from before its presuspend until the
   * resume (target_noflush_suspending, dm_noflush_suspending).
   */
  _Atomic bool noflush_suspending;
  backend_vector backends;      /* distinct, each referenced once */
  /* While table_parse builds the table (NULL after): those of backends
   * that only target_get_backend_read_only asked for (no reference of
   * their own), left out of the write capabilities.  On the builder's
   * stack: a built table keeps no 24 bytes of it.
   */
  backend_vector *read_only_uses;
  /* Those of backends the engine flushes (and looks at the error stamps
   * of): all but the paths of targets that flush their own
   * (target_get_path).  No references of its own; the backends' array
   * itself (cap 0) when it is all of them in order (table_parse).
   */
  backend_vector flushed;
  stack_use_vector stack_uses;  /* one per device backend (stacking) */
  struct mapper_caps caps;

  /* The device whose live table this is, NULL while it is not live
   * (loaded, or replaced): where target_event sends the targets'
   * events.  Protected by table_event_lock (table.c).
   */
  struct device *device;
};
/* Keys in one node of the lookup index: one cache line. */
#define TABLE_INDEX_KEYS (64 / sizeof (uint64_t))
/* Index of the target containing byte offset off (< caps.size). */
size_t table_find_target (const struct table *t, uint64_t off);
/* The targets' suspend/resume/flush hooks (target.h), in table order. */
void table_presuspend (struct table *t);
void table_resume (struct table *t);
/* Each target's preresume, before t runs again or becomes live: 0, or
 * the first refusal (-errno, err names the target).
 */
int table_preresume (struct table *t, struct mapper_err *err);
void table_postsuspend (struct table *t);
/* device-slots.c: a target hook (postsuspend, resume, message) runs on
 * this thread for dev, dev->lock held; what names the command in the
 * busy reply.  Its target may wait without the locks meanwhile
 * (target_wait_begin).  Nested calls restore what was.
 */
struct device_hook {
  struct device *dev;
  const char *what, *was_what;
  bool unlocked, was_draining;
};
void device_hook_enter (struct device *dev, const char *what,
                        struct device_hook *saved);
void device_hook_leave (const struct device_hook *saved);
int table_flush_hooks (struct table *t, uint32_t flags);
int table_flush_paths (struct table *t);
/* Send t's events to dev from now on (NULL: nowhere), once an event
 * being raised on t is done.  t may be NULL.  The swap calls it under
 * dev->lock; device_free before freeing dev.
 */
void table_bind (struct table *t, struct device *dev);
/* The target types' start and stop hooks (engine_start/stop): 0 or
 * -errno with err filled, having stopped those it started.
 */
int target_types_start (struct mapper_err *err);
void target_types_stop (void);

/* device.c (the registry), device-slots.c, device-stack.c, device-info.c,
 * device-io.c: a device.
 */
struct device {
  /* Changed only by rename, under devices_lock, and read without it by
   * every message and log line: atomic, and the names it replaces stay
   * allocated until the device is freed (old_names).
   */
  char *_Atomic name;
  /* How a flush reaches the live table's backends, chosen at create and
   * read-only after: device_flush_backends, or for benchmarks
   * device_flush_per_target (-D mapper.flush_per_target=1).
   */
  int (*flush_backends) (struct table *t, uint64_t seen);

  /* The request path: a request counts itself in flight, then checks
   * suspended.  live changes only while suspended with in-flight == 0, so
   * a counted request can use it without a reference.
   */
  _Atomic unsigned inflight;
  _Atomic bool suspended;
  /* A suspend (or the swap of a resume or replace) waits for the
   * requests in flight with lock released: until it is done, what would
   * change the live table or the gate is refused (-EBUSY), as a command
   * that waited would hold the control export's lock meanwhile.  Under
   * lock.
   */
  bool draining;
  struct table *live;
  /* The live table's statistics (stats.c): NULL until its first
   * request or clear (then set once, by whichever comes first), replaced
   * or dropped by a swap (with nothing in flight); counting since the
   * device's first swap (the device region) and the last one (the
   * targets').
   */
  struct stats_set *_Atomic stats;
  uint64_t stats_since_dev, stats_since;

  /* Protected by lock: the inactive slot, and the two waits of the slots
   * (device-slots.c), each on a condition of its own so that neither
   * wakes the other's sleepers (dm's md->wait for the drain): requests
   * held at the gate while the device is suspended sleep on
   * waits->gate until a resume opens it (through request_wait: a stop or
   * their client's going gives them up), a suspender on waits->drain
   * until the last request in flight leaves.  The two conditions are
   * made by the first wait that needs one (NULL: nobody ever waited,
   * nobody to wake) and kept until the device goes: an idle device, or
   * one whose suspends never had to wait, costs a pointer, not 96 bytes.
   */
  pthread_mutex_t lock;
  struct device_waits *waits;
  struct table *inactive;
  _Atomic unsigned open_count;
  /* Backends stacking on this device (device_get_stacked): while 0, no
   * table holds it as mapper:NAME, and remove, rename and resume need not
   * look for one.
   */
  _Atomic unsigned stack_holders;

  /* Events (dm's md->eventq): event_nr counts the table swaps and the
   * targets' events (target_event), moving on under device_events_lock
   * (one for every device: waits are rare, and a waiter wakes for any
   * device's event and looks at its own), which waiters sleep on with
   * device_events_cond.  Not lock: a target thread raises events while
   * a suspend holds lock and waits for that thread.  Order: lock,
   * table_event_lock, device_events_lock.
   */
  _Atomic uint64_t event_nr;

  /* Backend errors (flush.c's errseq): the device's own observer, for
   * device_flush without a connection's, and the latest error stamp of
   * backends a swap dropped, which no flush reaches any more.
   */
  _Atomic uint64_t flush_seen;
  _Atomic uint64_t dropped_err;

  /* Lifetime: the registry holds one reference, each open connection and
   * each control command using the device one more.  Freed at the last
   * device_put.  uuid is protected by devices_lock, and so are changes
   * of removed; names replaced by rename stay allocated (old_names)
   * until the device is freed, so a name read without the lock stays
   * valid.
   */
  _Atomic unsigned refs;
  char *uuid;                   /* NULL: none */
  /* Out of the registry: set under devices_lock, and read without it by
   * a wait for events (device_wait_event, under device_events_lock), which a
   * remove then wakes.
   */
  _Atomic bool removed;
  char **old_names;
  size_t nr_old_names;
  /* The registry's hash chains (device.c), under devices_lock. */
  struct device *name_next, *uuid_next;
};
/* device-slots.c: the conditions of a device's slot waits (dev->waits). */
struct device_waits {
  pthread_cond_t gate, drain;
  /* While the device is draining: what waits without the locks
   * (device-slots.c's wait_unlock), for the busy reply; NULL: a drain
   * of the requests in flight.
   */
  const char *busy_what;
};
/* device-slots.c: dev->lock held: -EBUSY with err saying why (what
 * waits, or the drain) while a suspend or swap of dev drains or waits
 * without the locks, else 0.
 */
int device_busy_locked (struct device *dev, struct mapper_err *err);
/* device-info.c: the events' lock and condition, of every device. */
extern pthread_mutex_t device_events_lock;
extern pthread_cond_t device_events_cond;
/* device-slots.c: enter/exit the live table for a request (blocks while
 * suspended).  NULL: the request was given up while held
 * (mapper_request_abandoned): fail it with -ESHUTDOWN, without
 * device_exit.
 */
struct table *device_enter (struct device *dev);
void device_exit (struct device *dev);
/* device-stack.c */
/* The checks a table must pass to become dev's live table: no cycle, and
 * every device stacked on dev still finds what it maps.
 */
int device_check_new_live (struct device *dev, const struct table *t,
                           struct mapper_err *err);
/* -EBUSY naming the holders if another device's table stacks on dev
 * (what it would do to dev is in what, "removed"), else 0.
 */
int device_refuse_if_held (struct device *dev, const char *what,
                           struct mapper_err *err);
/* device-info.c: move the event counter on and wake device_wait_event
 * (dm's event_callback); any thread, without dev->lock.
 */
void device_event (struct device *dev);
/* device-io.c: flush the backends of t, a live table, for an observer
 * that last sampled the error clock at seen (UINT64_MAX: none, only the
 * flushes' own results): once per distinct backend, where a target that
 * can do without a backend whose flush failed (flush_failed) absorbs the
 * failure.
 */
int device_flush_backends (struct table *t, uint64_t seen);
/* flush-per-target.c: the same once per target, like dm before it
 * flushed each device once.  Benchmarks only (bench/bench-flush).
 */
int device_flush_per_target (struct table *t, uint64_t seen);

/* stats.c: a request's accounting, between its device_enter and
 * device_exit (a swap, which replaces the set, waits for both).
 */
struct stats_io {
  struct stats_set *set;
  struct stats_block *blk;      /* NULL: not counted */
  uint64_t t0;
};
void stats_io_start (struct stats_io *sio, struct device *dev,
                     const struct table *t);
/* It is a flush (device_flush, after stats_io_start). */
void stats_io_flush (struct stats_io *sio);
/* It touches targets [first, end) of the live table. */
void stats_io_targets (struct stats_io *sio, size_t first, size_t end);
void stats_io_end (struct stats_io *sio, enum io_op op, uint64_t offset,
                   uint64_t count, const struct table *t, size_t first,
                   size_t end);
/* The swap to t: stats_swap_prepare (t NULL: none) under dev->lock
 * before the drain, stats_swap in the window (nothing in flight),
 * stats_swap_done after the gate opened, dev->lock still held; done
 * alone (no swap made) frees what prepare made.
 */
struct stats_swap {
  struct stats_set *old, *s;
  bool lost;                    /* out of memory for s */
  bool installed;               /* s is dev->stats */
  uint64_t now;                 /* the swap's time */
};
void stats_swap_prepare (struct stats_swap *sw, const struct table *t);
void stats_swap (struct device *dev, struct stats_swap *sw);
void stats_swap_done (struct device *dev, struct stats_swap *sw);
void stats_free (struct device *dev);

/* extents.c: the walk's state (device_extents starts it). */
struct extent_walk {
  mapper_extent_fn fn;
  void *opaque;
  uint64_t next;                /* device offset expected next */
  uint64_t end;                 /* stop when reached */
  unsigned count;               /* extents reported so far */
  bool req_one;
  bool done;                    /* enough reported: stop walking */
};

#endif /* NBDMAPPER_INTERNAL_H */

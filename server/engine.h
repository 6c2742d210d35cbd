/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdmapper engine: named devices whose dm-style tables remap byte ranges
 * onto shared backends.  This is the engine's one public header; it knows
 * nothing of nbdkit.  Functions that can fail on input return 0 or -errno
 * and fill a struct mapper_err (like dm's ti->error).
 */
#ifndef NBDMAPPER_ENGINE_H
#define NBDMAPPER_ENGINE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MAPPER_VERSION_STRING PACKAGE_VERSION
#define MAPPER_SECTOR_SHIFT 9
#define MAPPER_SECTOR_SIZE (1u << MAPPER_SECTOR_SHIFT)
#define MAPPER_NAME_MAX 127      /* device names, like dm's DM_NAME_LEN - 1 */
#define MAPPER_RESERVED_NAME "control"

struct mapper_err {
  char msg[512];
};
/* util.c */
void mapper_err_set (struct mapper_err *err, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
/* strerror without the locale machinery (messages are English anyway):
 * glibc's strerror takes the locale lock, which under ASan in nbdkit
 * deadlocks p11-kit's exit handler.
 */
const char *mapper_strerror (int errnum);

struct table;
struct device;

/* What a request or one of its pieces (a clone) does. */
enum io_op { IO_READ, IO_WRITE, IO_ZERO, IO_TRIM, IO_FLUSH };

/* I/O flags (same meaning as nbdkit's). */
#define MAPPER_FUA        0x1
#define MAPPER_MAY_TRIM   0x2
#define MAPPER_FAST_ZERO  0x4
#define MAPPER_REQ_ONE    0x8

/* Extent types (same bits as NBD base:allocation). */
#define MAPPER_EXTENT_HOLE 0x1
#define MAPPER_EXTENT_ZERO 0x2
typedef int (*mapper_extent_fn) (void *opaque, uint64_t offset,
                                 uint64_t length, uint32_t type);

/* What a table (and so a device) can do, merged over its targets and
 * backends when the table is built.  Read-only afterwards.
 */
struct mapper_caps {
  uint64_t size;                /* bytes */
  bool can_write;
  bool can_flush;
  bool can_fua;                 /* honoured (natively or emulated) */
  bool can_trim;
  bool can_zero;
  bool can_fast_zero;
  bool can_extents;
  bool can_multi_conn;
  uint32_t block_min, block_pref, block_max;
};

/* engine.c */
typedef void (*mapper_log_fn) (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));
extern mapper_log_fn mapper_debug;   /* NULL: no debug output */
/* Events an administrator wants to see at the default verbosity (a
 * mirror leg failed, resync complete), one line each, from any thread,
 * as the kernel logs them for dmeventd.  NULL: not logged.
 */
extern mapper_log_fn mapper_log;
extern bool mapper_trace_io;         /* log each request's split */
/* Benchmarks only: devices created from now on flush like old dm. */
extern bool mapper_flush_per_target;
/* Benchmarks and tests only: remote requests never go inline (a worker
 * on a parked direct connection, server/backends/nbd-wire.c), always
 * through the I/O loop.
 */
extern bool mapper_inline_disabled;
const char *mapper_version (void);
/* Set by the server around the engine (the plugin): has the request the
 * calling thread serves been given up, because the server is stopping or
 * its client has gone?  0, or -ESHUTDOWN.  Waits that can hold a request
 * without bound (a suspended device, a delay target, a wait for an event)
 * ask every tenth of a second, and fail the request with -ESHUTDOWN when
 * told so: neither a stop nor a disconnect waits for a resume or a
 * delay.  Also called from the engine's own threads (a mirror's resync
 * held by a suspended device), where only a stop counts.  NULL: never.
 */
typedef int (*mapper_abandoned_fn) (void);
extern mapper_abandoned_fn mapper_request_abandoned;
/* Start the engine's threads (call after any fork: nbdkit .after_fork)
 * and stop them (nbdkit .cleanup).  0 or -errno.
 */
int engine_start (struct mapper_err *err);
void engine_stop (void);

/* backends/nbd.c: remote backends opened from now on use up to
 * connections connections each when the server allows multi-conn
 * (default 4), and fail a request with EIO when it could not be done
 * within timeout seconds (default 30).  0 keeps the current value.
 */
void engine_set_remote (unsigned connections, unsigned timeout);
/* backends/nbd.c: a worker waiting for an inline request's reply polls
 * for it (adaptively, nbd-wire.c) for up to max_us microseconds before
 * it sleeps; 0: never.  For backends opened from now on.  Default 64:
 * on a quiet 2-CPU machine it took QD1 latency from 0.92 / 0.88 of
 * nbdkit nbd's to 0.82 / 0.81 (bench/bench-qd1-poll); qemu's IOThreads'
 * 32 is shorter than a local 4K round trip there, and the window closes.
 */
#define REMOTE_POLL_MAX_US_DEFAULT 64
#define REMOTE_POLL_MAX_US_LIMIT 1000000
void engine_set_remote_poll (unsigned max_us);

/* table.c */
int table_parse (const char *text, const char *origin,
                 struct table **out, struct mapper_err *err);
int table_parse_file (const char *path, struct table **out,
                      struct mapper_err *err);
void table_free (struct table *t);
const struct mapper_caps *table_caps (const struct table *t);
/* Serve t read-only whatever its backends allow (dmsetup -r): writes,
 * zeroes and trims fail with EPERM.  Before t is loaded into a device.
 */
void table_set_read_only (struct table *t);
bool table_read_only (const struct table *t);   /* was it set so? */
size_t table_nr_targets (const struct table *t);
size_t table_nr_backends (const struct table *t);
/* "linear×2, striped" style one-line summary; returns bytes needed. */
size_t table_summary (const struct table *t, char *buf, size_t len);
/* The table in dmsetup table format (one line per target). */
size_t table_format (const struct table *t, char *buf, size_t len);
/* Each target's status (dmsetup status format, one line per target). */
size_t table_status (const struct table *t, char *buf, size_t len);

/* Devices: device.c (the registry, names, lifetime), device-slots.c
 * (load, suspend, resume, replace), device-stack.c (the stacking
 * checks), device-info.c (inspection, messages, events).
 */
int device_check_name (const char *name, struct mapper_err *err);
int device_create (const char *name, struct device **out,
                   struct mapper_err *err);
/* Refuse a table that would make dev stack on itself, directly or
 * through other devices ("mapper:NAME" backends): -ELOOP.
 */
int device_check_table (struct device *dev, const struct table *t,
                        struct mapper_err *err);
int device_load (struct device *dev, struct table *t);  /* takes t */
/* -EBUSY while another suspend, resume or replace of dev waits for its
 * requests in flight; else the flush's error (noflush: none).
 */
int device_suspend (struct device *dev, bool noflush);
/* -EBUSY with err filled while a suspend, or the swap of a resume or
 * replace, of dev waits for its requests in flight (what would change
 * its tables or name meanwhile is refused), else 0.
 */
int device_check_busy (struct device *dev, struct mapper_err *err);
/* The caller (this thread) holds an outer lock around its resumes and
 * replaces (the control export's), which fn(false) releases and
 * fn(true) takes again; NULL: none.  Their wait for the requests in
 * flight is then made without it: a request may wait for another
 * device's resume, which needs that lock (a device stacked on a
 * suspended one).  Meanwhile dev is busy (device_check_busy), and the
 * caller must refuse what would change it.
 */
void device_set_drain_unlock (void (*fn) (bool relock));
/* Swap in the inactive table (if any) and let requests in.  Refused,
 * changing nothing, if the inactive table would break a device stacked
 * on dev (device_check_holders) or the flush before the swap fails (the
 * device then runs on as it was, the new table still inactive).
 * device_resume_swapped: *swapped as for device_replace.
 */
int device_resume (struct device *dev, struct mapper_err *err);
int device_resume_swapped (struct device *dev, bool *swapped,
                           struct mapper_err *err);
/* Could the inactive table be resumed (the checks device_resume makes
 * before it changes anything)?  0 or -errno with err filled.
 */
int device_check_resume (struct device *dev, struct mapper_err *err);
/* Would t as dev's live table still hold every area that tables of
 * other devices stacked on dev ("mapper:NAME") map, at dev's block
 * size?  0, or -EBUSY naming the device and its area.
 */
int device_check_holders (struct device *dev, const struct table *t,
                          struct mapper_err *err);
/* The devices whose live or inactive table stacks on dev, their names
 * separated by tabs; malloc'd ("" for none), NULL if out of memory.
 */
char *device_holders (struct device *dev);
void device_destroy (struct device *dev);
struct device *device_lookup (const char *name);
size_t device_count (void);
struct device *device_nth (size_t i);       /* in creation order */
const char *device_name (const struct device *dev);
/* Snapshot of the live table's capabilities (false if none is live). */
bool device_get_caps (struct device *dev, struct mapper_caps *caps);
size_t device_summary (struct device *dev, char *buf, size_t len);
/* table_status of the live table ("" if none). */
size_t device_status (struct device *dev, char *buf, size_t len);
void device_open_count_add (struct device *dev, int delta);

/* Devices: the control plane (lifetime, inspection, changes). */
struct device_info {
  bool suspended;
  bool live, inactive;          /* table slots present */
  unsigned open_count;
  uint64_t event_nr;
  size_t nr_targets;            /* of the live table */
  uint64_t size;                /* of the live table, bytes */
  bool read_only;               /* the live table takes no writes */
  bool live_ro, inactive_ro;    /* table_set_read_only tables */
};
/* A counted reference to the named device (NULL if none); release with
 * device_put.  device_open_conn also counts an open connection, atomically
 * with the lookup, so remove can't race with an open.
 */
struct device *device_get (const char *name);
struct device *device_open_conn (const char *name);
void device_close_conn (struct device *dev);
void device_put (struct device *dev);
/* For a backend stacking on the named device ("mapper:NAME"):
 * device_get, also counting the device as held by a table until
 * device_put_stacked, so that remove, rename and resume look for the
 * tables stacking on it (device_check_holders).
 */
struct device *device_get_stacked (const char *name);
void device_put_stacked (struct device *dev);
/* Call fn on each device in creation order, under the registry lock
 * (fn must not create/remove/rename devices).  Stops at fn's nonzero.
 */
int device_foreach (int (*fn) (struct device *dev, void *opaque),
                    void *opaque);
int device_set_uuid (struct device *dev, const char *uuid,
                     struct mapper_err *err);
/* Snapshot of the uuid (malloc'd, NULL if none). */
char *device_uuid (struct device *dev);
void device_get_info (struct device *dev, struct device_info *info);
/* Remove from the registry.  -EBUSY while connections are open unless
 * force, which first swaps in an error table of the same size.
 */
int device_remove (struct device *dev, bool force, struct mapper_err *err);
int device_rename (struct device *dev, const char *newname,
                   struct mapper_err *err);
/* The check device_rename makes that another device's table does not
 * stack on dev (it would lose it): 0, or -EBUSY naming the holders.
 * For callers that must know before they change anything else (the
 * table file).
 */
int device_check_rename (struct device *dev, struct mapper_err *err);
/* Drop the inactive table. */
void device_clear (struct device *dev);
/* load + suspend + resume in one step: suspended only for the drain.
 * Refused, changing nothing, if t would break a device stacked on dev
 * or the flush before the swap fails.  -errno with *swapped true: t is
 * live, but the backends it dropped could not be flushed (writes to
 * them may be lost).  swapped may be NULL.
 */
int device_replace (struct device *dev, struct table *t, bool *swapped,
                    struct mapper_err *err);
/* The live (or inactive) table in dmsetup format, or the per-target
 * status (STATUSTYPE_INFO) lines; malloc'd, "" for an empty slot.
 * NULL with -errno in *r on failure.
 */
char *device_table_text (struct device *dev, bool inactive, int *r);
char *device_status_text (struct device *dev, int *r);
/* One line per backend of the live table, "NAME\tKIND\tSTATE" (the
 * state from the backend: connections for NBD, "open" for the others);
 * malloc'd, "" without a live table.
 */
char *device_backends_text (struct device *dev, int *r);
/* Route a message to the live target containing sector: 0,
 * MESSAGE_TABLE_CHANGED (the live table's text, device_table_text, is
 * not what it was: keep it where it is kept), or -errno with err filled
 * and nothing changed.  *reply: the target's reply, malloc'd.
 */
#define MESSAGE_TABLE_CHANGED 1
int device_message (struct device *dev, uint64_t sector, unsigned argc,
                    char **argv, char **reply, struct mapper_err *err);
/* Wait until the event counter passes event_nr (or timeout_ms passes,
 * -ETIMEDOUT; < 0 means forever).  *now: the counter on return.
 */
int device_wait_event (struct device *dev, uint64_t event_nr,
                       int64_t timeout_ms, uint64_t *now,
                       struct mapper_err *err);

/* stats.c: I/O statistics, as dm-stats keeps them: per device (region
 * 0) and per target of the live table (regions 1..N, tables of at most
 * MAPPER_STATS_MAX_TARGET_REGIONS targets), counted per thread on the
 * request path without a lock.  A region whose start and length a
 * reload keeps keeps its counts.
 */
enum mapper_stats_op {
  MAPPER_STATS_READ, MAPPER_STATS_WRITE, MAPPER_STATS_DISCARD,
  MAPPER_STATS_FLUSH, MAPPER_STATS_OPS
};
#define MAPPER_STATS_NR_BOUNDS 12
#define MAPPER_STATS_BUCKETS (MAPPER_STATS_NR_BOUNDS + 1)
#define MAPPER_STATS_MAX_TARGET_REGIONS 256
/* The histograms' upper bounds (a request of exactly a bound's time
 * falls in its bucket); the last bucket is everything slower.
 */
extern const uint64_t mapper_stats_bounds_ns[MAPPER_STATS_NR_BOUNDS];
/* Benchmarks only: devices swapping a table from now on keep none. */
extern bool mapper_stats_disabled;
struct mapper_stats_region {
  unsigned id;                  /* 0: the device, i: target i - 1 */
  uint64_t start, len;          /* bytes */
  const char *type;             /* "device" or the target's type */
  uint64_t interval_ns;         /* since created, reloaded or cleared */
  /* Per op (write zeroes counts as a write, trim as a discard; flushes
   * only in the device region and without bytes).
   */
  uint64_t ios[MAPPER_STATS_OPS], bytes[MAPPER_STATS_OPS];
  uint64_t ns[MAPPER_STATS_OPS];  /* the requests' times, summed */
  uint64_t in_progress;
  uint64_t io_ns, queue_ns;     /* /proc/diskstats' io_ticks, time_in_queue */
  bool has_histograms;          /* the device region */
  uint64_t hist[MAPPER_STATS_OPS][MAPPER_STATS_BUCKETS];
};
/* Call fn on region (-1: each region of dev, in order) with the
 * counters since the last clear; with clear, each counter then starts
 * again from the value reported.  0, fn's nonzero (which stops it), or
 * -errno with err filled: -ENXIO without a live table, -EINVAL for a
 * region dev does not have.  fn NULL: only check region.
 */
int device_stats (struct device *dev, long region, bool clear,
                  int (*fn) (const struct mapper_stats_region *r,
                             void *opaque),
                  void *opaque, struct mapper_err *err);

/* table.c: the target types built in. */
size_t target_type_count (void);
const char *target_type_info (size_t i, unsigned version[3]);

/* device-io.c: the request path.  Return 0 or -errno. */
int device_pread (struct device *dev, void *buf, uint32_t count,
                  uint64_t offset, uint32_t flags);
int device_pwrite (struct device *dev, const void *buf, uint32_t count,
                   uint64_t offset, uint32_t flags);
int device_zero (struct device *dev, uint32_t count, uint64_t offset,
                 uint32_t flags);
int device_trim (struct device *dev, uint32_t count, uint64_t offset,
                 uint32_t flags);
/* Flush as the device's own observer of backend errors (flush.c's
 * errseq): a failed backend flush or a lost remote write fails one
 * device_flush after it.
 */
int device_flush (struct device *dev, uint32_t flags);
/* Flush as the observer *seen, a client connection's, which starts at
 * device_errseq_sample() when it opens: its next flush fails with EIO
 * once after any error on the device's backends since it last flushed,
 * even one that another connection's flush already reported (every
 * connection open then hears of it, none opened later).  seen NULL:
 * only this flush's own result.
 */
int device_flush_errseq (struct device *dev, uint32_t flags,
                         _Atomic uint64_t *seen);
uint64_t device_errseq_sample (void);
/* The latest error stamp (flush.c's errseq) of dev's live backends and
 * of those its swaps dropped: what a flush of a device stacked on dev
 * must report although it finds dev clean.  Takes dev->lock.
 */
uint64_t device_errseq (struct device *dev);
int device_extents (struct device *dev, uint32_t count, uint64_t offset,
                    uint32_t flags, mapper_extent_fn fn, void *opaque);

#endif /* NBDMAPPER_ENGINE_H */

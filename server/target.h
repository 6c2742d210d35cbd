/* SPDX-License-Identifier: BSD-3-Clause */
/* The target API: everything a target (server/targets/) sees of the
 * engine, as dm's targets see <linux/device-mapper.h>.  A target
 * includes this and "util.h" (the utilities below every layer: macros,
 * number parsing, request_wait), never internal.h; this header
 * compiles alone.
 *
 * Targets in the device-mapper shape: the constructor parses and
 * validates everything, map() is arithmetic that emits clones pointing
 * into the caller's buffer, status() reprints the constructor line.
 */
#ifndef NBDMAPPER_TARGET_H
#define NBDMAPPER_TARGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

/* Opaque to targets: reached through the functions below. */
struct io_req;
struct clone;
struct backend;
struct extent_walk;

/* One cache line, built in place in the table's array and never moved,
 * so that a small private struct can live inside it
 * (target_private_alloc): a request on a cold wide table then misses
 * once per target, not twice.
 */
#define TARGET_PRIVATE_INLINE 24
struct target {
  /* Read-only after the table is built. */
  const struct target_type *type;
  struct table *table;          /* owner, for target_get_backend */
  uint64_t begin, len;          /* bytes, in device coordinates */
  void *private;                /* the target's own state */
  /* Storage for private, see target_private_alloc. */
  unsigned char private_inline[TARGET_PRIVATE_INLINE]
    __attribute__ ((aligned (8)));
} __attribute__ ((aligned (64)));
_Static_assert (sizeof (struct target) == 64, "struct target: one line");

enum status_type { STATUSTYPE_INFO, STATUSTYPE_TABLE };

/* A clone's completion hook (io_emit_end_io): ctx and arg are the
 * target's, given back as they were emitted.
 */
typedef int (*clone_end_io_fn) (struct clone *c, void *ctx, uint64_t arg,
                                int error);

/* One target type.  Adding one: its file under server/targets/, a line
 * in server/targets.def and one in server/Makefile.am.
 */
struct target_type {
  const char *name;
  unsigned version[3];
  /* Parse and validate argv; 0 or -errno with err filled (the message
   * names the argument; the table adds target, file and line).
   */
  int (*ctr) (struct target *ti, unsigned argc, char **argv,
              struct mapper_err *err);
  void (*dtr) (struct target *ti);
  /* Map [off, off+len) (target-relative bytes) of request req: call
   * io_emit() for each piece, with buf advanced (never copied).
   * 0 or -errno.
   */
  int (*map) (struct target *ti, struct io_req *req, uint64_t off,
              uint64_t len, char *buf);
  /* Extents of [off, off+len) (target-relative), via extent_walk_*. */
  int (*extents) (struct target *ti, struct extent_walk *w, uint64_t off,
                  uint64_t len);
  /* Print status (INFO) or the constructor arguments (TABLE) into buf
   * with EMIT; return bytes needed (snprintf style).  buf holds an empty
   * string on entry (when len > 0), so a status with nothing to say
   * returns 0.  NULL: never anything to say.
   */
  size_t (*status) (struct target *ti, enum status_type type,
                    char *buf, size_t len);
  /* Call fn for each backend the target uses. */
  int (*iterate_backends) (struct target *ti,
                           int (*fn) (struct target *ti, struct backend *be,
                                      void *data),
                           void *data);
  /* Optional hooks for targets that hold I/O back or fail it by state
   * (delay, flakey).  Flushes never pass through map(): a device flush
   * goes once to each distinct backend of the table (flush.c), so a
   * target that must delay or fail flushes says so in flush(), called
   * for every device flush before the backends are flushed; it may wait,
   * and an error fails the flush.  req is the flush's own request (no
   * clones), for per-request state such as its start time.
   */
  int (*flush) (struct target *ti, struct io_req *req);
  /* A suspend is starting (new requests are already held at the gate):
   * release any I/O being held back now, instead of letting the drain
   * wait for it (dm's presuspend).
   */
  void (*presuspend) (struct target *ti);
  /* The table became live on a device (resume), or stopped being live
   * (suspend, after in-flight requests drained; also before dtr), for
   * targets with background work (mirror resync) or state (delay).  Both
   * may be called more than once.
   */
  void (*resume) (struct target *ti);
  void (*postsuspend) (struct target *ti);
  /* Optional: a flush of backend be (one the target uses) failed.  Return
   * true if the target can do without it (a mirror with handle_errors
   * marks the leg failed), so the device's flush still succeeds.
   */
  bool (*flush_failed) (struct target *ti, struct backend *be);
  /* Optional: the table is about to become live or to run again
   * (resume, replace), with the device suspended: -errno with err filled
   * refuses the resume and nothing changes (dm's preresume: a crypt
   * target whose key was wiped).
   */
  int (*preresume) (struct target *ti, struct mapper_err *err);
  /* Optional: handle "message SECTOR WORDS..." addressed to this target
   * (dmsetup message), with the device's lock held (no suspend, resume
   * or other message meanwhile; I/O may be running unless the target
   * requires a suspended device); write any reply into reply/len
   * (snprintf style).  0, MESSAGE_TABLE_CHANGED (engine.h) when what
   * status TABLE prints changed (the table is saved again where it is
   * kept), or -errno with err filled and nothing changed.  Arguments may
   * be overwritten (a key's text, wiped).  NULL: the target takes no
   * messages.
   */
  int (*message) (struct target *ti, unsigned argc, char **argv,
                  char *reply, size_t len, struct mapper_err *err);
  /* Optional, for the type rather than a target: the engine's threads
   * start (engine_start, after any fork) and stop (engine_stop), for a
   * type's own threads (mirror's resync worker).  start: 0 or -errno
   * with err filled.  stop must be harmless without a start, or after
   * one that failed: engine_stop calls it whatever happened.
   */
  int (*start) (struct mapper_err *err);
  void (*stop) (void);
  /* Optional: the device that backend be of this target stacks on
   * (mapper:NAME) is about to get table t as its live table (the holder
   * checks of resume and replace, device-stack.c).  0 if the target can
   * live with it, else -EBUSY with err filled: the change is refused.
   * thin: t must still hold the thin's pool.  Under the locks of both
   * devices: only look at t (target_table_find).
   */
  int (*check_lower) (struct target *ti, struct backend *be,
                      const struct table *t, struct mapper_err *err);
  /* The target's backends are paths (target_get_path): its flush hook
   * makes their writes durable, for device flushes and for suspend's
   * flush alike (multipath).
   */
  bool paths;
};

/* --- constructors --------------------------------------------------- */

/* table.c: open (or share) the backend named by spec, check that
 * [start, start+len) bytes lies inside it, and register it in the
 * table's backend set.  The table holds the reference.
 */
int target_get_backend (struct target *ti, const char *spec,
                        uint64_t start, uint64_t len,
                        struct backend **out, struct mapper_err *err);

/* table.c: the same for a backend the target only ever reads (thin's
 * external origin): a read-only backend does not make the table
 * read-only, unless another target of the table writes to it.
 */
int target_get_backend_read_only (struct target *ti, const char *spec,
                                  uint64_t start, uint64_t len,
                                  struct backend **out,
                                  struct mapper_err *err);
/* table.c: target_get_backend for a backend the target flushes itself
 * (a multipath path, see target_type.paths): the table holds it, but
 * device flushes, suspend's flush and the error stamps (flush.c) leave
 * it to the target's flush hook.  A backend another target of the
 * table also gets with target_get_backend is flushed as usual.
 */
int target_get_path (struct target *ti, const char *spec, uint64_t start,
                     uint64_t len, struct backend **out,
                     struct mapper_err *err);

/* table.c: zeroed memory for the target's private struct (needing at
 * most 8-byte alignment), inside ti itself when it fits, else from
 * malloc.  NULL if out of memory.  Free it with target_private_free (ti,
 * p), which does nothing for the former.
 */
void *target_private_alloc (struct target *ti, size_t size);
void target_private_free (struct target *ti, void *p);

/* table.c: the constructor of targets that take no arguments. */
int target_ctr_no_args (struct target *ti, unsigned argc, char **argv,
                        struct mapper_err *err);

/* target.c: the argument reader (dm's dm_arg_set, dm_shift_arg,
 * dm_read_arg, dm_read_arg_group).  A constructor reads its arguments
 * in order from a target_args set over its argv; the readers fail with
 * -EINVAL and one message shape for every target.
 */
struct target_args {
  unsigned argc;                /* arguments not read yet */
  char **argv;
};
/* A number argument and its range, for target_read_arg: "invalid NAME
 * 'TEXT' (UNIT, MIN to MAX)" when it is not a number in the range.
 */
struct target_arg {
  const char *name;             /* "number of stripes", "up interval" */
  const char *unit;             /* "sectors", "seconds"; NULL: none */
  uint64_t min, max;
};
/* The next argument (consumed), or NULL if none is left. */
char *target_shift_arg (struct target_args *as);
/* The next argument as a number in arg's range.  0, or -EINVAL with err
 * filled; "missing NAME" when none is left.
 */
int target_read_arg (const struct target_arg *arg, struct target_args *as,
                     uint64_t *value, struct mapper_err *err);
/* The next argument as a sector count (an offset), in bytes.  0, or
 * -EINVAL with err filled: "NAME 'TEXT' is not a non-negative integer"
 * (or "overflows ...", parse_error_text).
 */
int target_read_sectors (const char *name, struct target_args *as,
                         uint64_t *bytes, struct mapper_err *err);
/* A counted group "<#args> <arg>...": the count (min to max) and then
 * that many arguments, moved from as into group.  what names the
 * arguments ("feature argument"): "invalid number of feature arguments
 * 'x' (0 to 11)", "2 feature arguments declared but 1 given".  last: the
 * group ends the line, so arguments left after it are counted against
 * the declared number too.  0 or -EINVAL with err filled.
 */
int target_read_group (const char *what, unsigned min, unsigned max,
                       bool last, struct target_args *as,
                       struct target_args *group, struct mapper_err *err);

/* target.c: put "PREFIX: " (printf style) before err's message (dm's
 * DM_MSG_PREFIX, for one level of a message: "leg 1", "table:3").
 */
void mapper_err_prefix (struct mapper_err *err, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

/* target.c: for targets whose state outlives one table (thin-pool's pool
 * object, shared by every reload of the pool device and by the thin
 * devices bound to it, as dm keys a pool by its device): a reference to
 * be of their own, beyond the table's (target_backend_put drops it; the
 * last reference closes the backend).
 */
void target_backend_hold (struct backend *be);
void target_backend_put (struct backend *be);
/* target.c: be's size in bytes.  0 or -errno. */
int target_backend_size (struct backend *be, uint64_t *size);
/* target.c: make every write completed on be so far durable (flush.c's
 * coalesced flush: nothing to do when be is clean).  0 or -errno.
 */
int target_flush_backend (struct backend *be);
/* Around a wait in a postsuspend, resume or message hook that I/O held
 * below the device may hold up (a thin pool's writes to a suspended
 * data device): the device's lock and the control export's are
 * released between the two, so that the resume of that lower device
 * can run, and what would change this device (its tables, gate, name,
 * another message) is refused as busy meanwhile: the hook finds it as
 * it left it.  Elsewhere (or nested) they do nothing.  The hook must
 * call target_wait_end before it returns.
 */
void target_wait_begin (struct target *ti);
void target_wait_end (struct target *ti);
/* target.c: be stacks on a device (mapper:NAME, target_get_backend): call
 * fn on each target of type type_name in that device's live table until
 * one returns nonzero (target_table_find),
 * under the device's lock (so the table cannot be swapped meanwhile: fn
 * takes a reference on whatever it keeps, and takes only leaf locks).
 * A thin target binds to its pool so (dm's dm_get_md + __pool_table_lookup).
 * fn's nonzero result, -ENODEV if be stacks on no device, -ENOENT if
 * no target of the live table (or its absence) made fn say so.
 */
int target_find_peer (struct backend *be, const char *type_name,
                      int (*fn) (struct target *peer, void *opaque),
                      void *opaque);
/* target.c: call fn on each target of type type_name in t until one
 * returns nonzero: that result, or -ENOENT.  The caller holds t
 * (check_lower's).
 */
int target_table_find (const struct table *t, const char *type_name,
                       int (*fn) (struct target *peer, void *opaque),
                       void *opaque);

/* --- status --------------------------------------------------------- */

/* target.c: dm's DMEMIT.  Append printf-style output at buf + used,
 * never past len, and return the new used, counting what did not fit
 * (snprintf style).  The text so far stays a string.
 */
size_t target_emit (char *buf, size_t len, size_t used, const char *fmt,
                    ...)
  __attribute__ ((format (printf, 4, 5)));
/* In a status() whose parameters are buf and len, with a local
 * size_t used = 0:  EMIT ("%u", n); ...; return used;
 */
#define EMIT(...) (used = target_emit (buf, len, used, __VA_ARGS__))

/* target.c: what targets may know of a backend and of their table. */
const char *backend_name (const struct backend *be);  /* for people */
/* Its size, capabilities and block sizes. */
const struct mapper_caps *backend_caps (const struct backend *be);
/* Give up be's clones whose end_io_ctx is owner (backend.h's abandon
 * op): false if be's kind cannot (local files and stacked devices,
 * whose clones complete where they are).
 */
bool backend_abandon (struct backend *be, void *owner);
/* The table's origin (file name), for log lines. */
const char *target_origin (const struct target *ti);

/* table.c: for targets: something an administrator waits for happened
 * (a mirror leg failed, resync is complete; dm_table_event).  Logs
 * "TARGET: device NAME: MESSAGE" through mapper_log, then raises an event
 * on the device whose live table ti's is (nbdmsetup wait returns); a
 * table that is not live raises none and is named by its origin.  From
 * any thread, even a completion (end_io) or the resync worker while a
 * suspend waits for it: it never takes dev->lock, only two short locks
 * of its own (table_event_lock, device_events_lock).
 */
void target_event (struct target *ti, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

/* --- I/O ------------------------------------------------------------ */

/* The client buffer at delta, or NULL for requests that carry none. */
static inline char *
buf_at (char *buf, uint64_t delta)
{
  return buf ? buf + delta : NULL;
}

/* io.c: for map(). */
int io_emit (struct io_req *req, struct backend *be, uint64_t offset,
             uint64_t len, char *buf);
bool io_req_is_read (const struct io_req *req);
enum io_op io_req_op (const struct io_req *req);
uint32_t io_req_flags (const struct io_req *req);   /* target.c */
/* Like io_emit, but clone_done() first calls end_io(c, ctx, arg, error)
 * (from whatever thread completes the clone: keep it short, never
 * block).  end_io returns the error the request should see (0 or
 * -errno), or CLONE_RETRY after pointing the clone elsewhere
 * (clone_retry): the thread waiting for the request then submits it
 * again, so a retry never runs on an I/O loop thread nor nests inside
 * the failed submit.  ctx and arg are the target's.  Never merged with
 * a neighbour.  A clone never submitted (the request failed while being
 * mapped) gets end_io(c, ..., -ECANCELED) and must not be retried then.
 */
#define CLONE_RETRY 1
/* end_io may also return CLONE_REMAP when it cannot choose where the
 * clone goes next without waiting (a multipath with no path left, queue
 * _if_no_path): the thread waiting for the request then calls the remap
 * hook given to io_emit_remap, which may block (request_wait) and
 * returns 0 after clone_retry, or the error the request should see.
 */
#define CLONE_REMAP 2
typedef int (*clone_remap_fn) (struct clone *c, void *ctx, uint64_t arg);
int io_emit_end_io (struct io_req *req, struct backend *be, uint64_t offset,
                    uint64_t len, char *buf, clone_end_io_fn end_io,
                    void *ctx, uint64_t arg);
/* io.c: io_emit_end_io with a remap hook (CLONE_REMAP).  The clone fails
 * fast: a remote backend that loses the connection carrying it, or has
 * none up, fails it at once rather than holding it for a reconnection,
 * since the target has somewhere else to send it.
 */
int io_emit_remap (struct io_req *req, struct backend *be, uint64_t offset,
                   uint64_t len, char *buf, clone_end_io_fn end_io,
                   clone_remap_fn remap, void *ctx, uint64_t arg);
/* target.c: for end_io.  Where the clone went (backend coordinates),
 * and, for CLONE_RETRY, where it goes next (its buffer, length and
 * operation stay) with the arg its next end_io gets.
 */
void clone_range (const struct clone *c, uint64_t *offset, uint64_t *len);
void clone_retry (struct clone *c, struct backend *be, uint64_t offset,
                  uint64_t arg);
/* io.c: for targets that must see or change data on its way (crypt,
 * flakey's corruption) or that do I/O of their own (mirror's resync):
 * one synchronous sub-request to be, issued and waited for inside map(),
 * so buf may be a bounce buffer reused as soon as this returns.  flags:
 * MAPPER_FUA (emulated where not native), MAPPER_MAY_TRIM (an IO_ZERO
 * that may punch a hole: clone's hydration and mirror's resync of a
 * source's holes).  0 or -errno.
 */
int io_sync (enum io_op op, struct backend *be, uint64_t offset,
             uint64_t len, char *buf, uint32_t flags);
/* The error a target's map, remap or flush hook returns for I/O it
 * holds through a noflush suspend rather than fail it (dm's
 * DM_MAPIO_REQUEUE: multipath with no path): device-io.c gives the
 * request back to the device's gate, out of the requests in flight the
 * suspend drains, and maps it again once resumed, on the table then
 * live.  Never reaches a client.
 */
#define MAPPER_EREQUEUE (-ERESTART)
/* table.c: ti's table is being suspended with noflush (from before its
 * presuspend until its resume): dm_noflush_suspending.
 */
bool target_noflush_suspending (const struct target *ti);
/* io.c: io_sync whose clone is owned by owner (its end_io_ctx, with no
 * hook): backend_abandon (be, owner) gives it up (-EIO; the backend lets
 * go of buf first) from another thread.  It does not fail fast: it
 * waits out a lost connection as io_sync's.  For a target's own I/O that
 * a stop must be able to give up (clone's hydration copies).
 */
int io_sync_owned (enum io_op op, struct backend *be, uint64_t offset,
                   uint64_t len, char *buf, uint32_t flags, void *owner);
/* io.c: CLOCK_MONOTONIC nanoseconds when the request first asked: delay
 * targets measure from it, so the pieces of one request delayed by
 * several targets wait for the longest delay, not the sum.
 */
uint64_t io_req_start_ns (struct io_req *req);
/* io.c: io_sync through a completion hook (its CLONE_RETRY and
 * CLONE_REMAP are not allowed), failing fast as io_emit_remap's clones:
 * for I/O of the target's own that backend_abandon must be able to give
 * up (multipath's probes and flushes: ctx is the owner).  0 or -errno.
 */
int io_sync_end_io (enum io_op op, struct backend *be, uint64_t offset,
                    uint64_t len, char *buf, clone_end_io_fn end_io,
                    void *ctx, uint64_t arg);
/* flush.c: io_flush_backends for be alone (flush.c's bookkeeping: none
 * when be is clean, shared with concurrent flushes, and counted, so the
 * client flush beside it skips be in turn), except that a backend flush
 * it starts is owned by owner (its clone's end_io_ctx, with no hook):
 * backend_abandon (be, owner) gives it up (-EIO, failing whoever shared
 * it, as any failed flush) from another thread, yet it does not fail
 * fast: it waits out a lost connection as a client's would.  A flush it
 * joins is not its own and is waited for.  For a flush that only a stop
 * gives up (clone's commit).  0 or -errno.
 */
int io_flush_backend_owned (struct backend *be, void *owner);

/* bounce.c: per-thread scratch buffers for transformed data (the
 * client's write buffer is const).  bounce_get returns at least len
 * bytes (4096-aligned), valid until the matching bounce_put; calls nest
 * (a stacked device may transform inside a transform).  NULL if out of
 * memory.
 */
char *bounce_get (size_t len);
void bounce_put (char *buf);

/* --- extents -------------------------------------------------------- */

/* extents.c: for extents(); coordinates are target-relative.  Return 0 or
 * -errno; after either, stop when extent_walk_done() says so.  A target
 * reports data (type 0) wherever it cannot tell, never an error: block
 * status fails only when the reply itself cannot be built.
 */
int extent_walk_add (struct extent_walk *w, struct target *ti,
                     uint64_t off, uint64_t len, uint32_t type);
/* The backend's extents of [be_off, be_off+len) as the target's
 * [off, off+len); where the backend fails or answers nothing, data.
 */
int extent_walk_backend (struct extent_walk *w, struct target *ti,
                         uint64_t off, struct backend *be,
                         uint64_t be_off, uint64_t len);
/* The same, except that a backend that fails or answers nothing returns
 * EXTENT_BACKEND_FAILED with the walk where it stopped (what it did
 * answer stays reported): the caller may ask another backend from
 * extent_walk_pos(), or report data with extent_walk_data().
 */
#define EXTENT_BACKEND_FAILED 1
int extent_walk_backend_try (struct extent_walk *w, struct target *ti,
                             uint64_t off, struct backend *be,
                             uint64_t be_off, uint64_t len);
/* Data (type 0) from where the walk is up to target offset end. */
int extent_walk_data (struct extent_walk *w, struct target *ti,
                      uint64_t end);
/* The target offset the walk reports next. */
uint64_t extent_walk_pos (const struct extent_walk *w,
                          const struct target *ti);
bool extent_walk_done (const struct extent_walk *w);
/* target.c: the client asked for one extent only (NBD_CMD_FLAG_REQ_ONE):
 * no need to read far ahead.
 */
bool extent_walk_req_one (const struct extent_walk *w);
/* target.c: for targets that query backends themselves (striped): the
 * backend's extents of [offset, offset+len), backend coordinates,
 * through fn in ascending, contiguous order.  0 or -errno.
 */
int backend_extents (struct backend *be, uint64_t offset, uint64_t len,
                     bool req_one, mapper_extent_fn fn, void *opaque);
/* extents.c: log that be failed (error < 0) or answered nothing (0) for
 * [offset, offset+len), reported as data.
 */
void extent_backend_failed (struct backend *be, uint64_t offset,
                            uint64_t len, int error);

/* crypt-xts.c: the crypt target's AES-XTS, "VAES" where the CPU runs
 * crypt-xts-vaes.c (VAES, VPCLMULQDQ, AVX-512F, and the OS saving the
 * ZMM state), else "VAES-256" where it runs crypt-xts-vaes256.c (VAES,
 * VPCLMULQDQ, AVX2, the YMM state), else "OpenSSL".
 * mapper_crypt_openssl (-D mapper.crypt_openssl=1) makes transforms
 * keyed from then on use OpenSSL's even there, mapper_crypt_vaes256
 * (-D mapper.crypt_vaes256=1) the 256-bit one where the 512-bit one
 * runs, so that tests and benchmarks can run each.
 */
extern bool mapper_crypt_openssl, mapper_crypt_vaes256;
const char *mapper_crypt_transform (void);

#endif /* NBDMAPPER_TARGET_H */

/* Targets in the device-mapper shape: the constructor parses and validates
 * everything, map() is arithmetic that emits clones pointing into the
 * caller's buffer, status() reprints the constructor line.
 */
#ifndef NBDMAPPER_TARGET_H
#define NBDMAPPER_TARGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

struct io_req;
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

struct target_type {
  const char *name;
  unsigned version[3];
  /* Parse and validate argv; 0 or -errno with err filled (the message
   * names the argument; the table adds file and line).
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
  /* Print status (INFO) or the constructor arguments (TABLE) into buf;
   * return bytes needed (snprintf style).
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
  /* Optional: handle "message SECTOR WORDS..." addressed to this target
   * (dmsetup message); write any reply into reply/len (snprintf style).
   * 0 or -errno with err filled.  NULL: the target takes no messages.
   */
  int (*message) (struct target *ti, unsigned argc, char **argv,
                  char *reply, size_t len, struct mapper_err *err);
};

/* targets/ */
extern const struct target_type linear_target;
extern const struct target_type striped_target;
extern const struct target_type zero_target;
extern const struct target_type error_target;
extern const struct target_type mirror_target;
extern const struct target_type delay_target;
extern const struct target_type flakey_target;
extern const struct target_type crypt_target;

/* table.c: for constructors.  Open (or share) the backend named by spec,
 * check that [start, start+len) bytes lies inside it, and register it in
 * the table's backend set.  The table holds the reference.
 */
int target_get_backend (struct target *ti, const char *spec,
                        uint64_t start, uint64_t len,
                        struct backend **out, struct mapper_err *err);

/* table.c: for constructors: zeroed memory for the target's private
 * struct (needing at most 8-byte alignment), inside ti itself when it
 * fits, else from malloc.  NULL if out of memory.  Free it with
 * target_private_free (ti, p), which does nothing for the former.
 */
void *target_private_alloc (struct target *ti, size_t size);
void target_private_free (struct target *ti, void *p);

/* table.c: for targets: something an administrator waits for happened
 * (a mirror leg failed, resync is complete; dm_table_event).  Logs
 * "TARGET: device NAME: MESSAGE" through mapper_log, then raises an event
 * on the device whose live table ti's is (nbdmsetup wait returns); a
 * table that is not live raises none and is named by its origin.  From
 * any thread, even a completion (end_io) or the resync worker while a
 * suspend waits for it: it never takes dev->lock, only two short locks
 * of its own (table_event_lock, dev->event_lock).
 */
void target_event (struct target *ti, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

/* table.c: the constructor of targets that take no arguments. */
int target_ctr_no_args (struct target *ti, unsigned argc, char **argv,
                        struct mapper_err *err);

/* table.c: for constructors: parse the <offset> argument s (sectors) into
 * bytes; 0, or -EINVAL with err filled ("offset 'x' is not ...").
 */
int target_parse_offset (const char *s, uint64_t *bytes,
                         struct mapper_err *err);

/* table.c: for constructors: check a counted group of optional arguments,
 * dm style "<#args> <arg>...": argv[0] (argc >= 1) is a number from 0 to
 * max equal to argc - 1.  0, or -EINVAL with err filled, naming the
 * arguments by what ("feature argument": "2 feature arguments declared
 * but 1 given").
 */
int target_count_args (unsigned argc, char **argv, unsigned max,
                       const char *what, struct mapper_err *err);

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
/* Like io_emit, but clone_done() first calls end_io(c, error) (from
 * whatever thread completes the clone: keep it short, never block).
 * end_io returns the error the request should see (0 or -errno), or
 * CLONE_RETRY after pointing the clone elsewhere (c->be, c->offset; never
 * c->buf, c->len, c->op): the thread waiting for the request then submits
 * it again, so a retry never runs on an I/O loop thread nor nests inside
 * the failed submit.  ctx and arg are the target's.  Never merged with a
 * neighbour.  A clone never submitted (the request failed while being
 * mapped) gets end_io(c, -ECANCELED) and must not be retried then.
 */
#define CLONE_RETRY 1
int io_emit_end_io (struct io_req *req, struct backend *be, uint64_t offset,
                    uint64_t len, char *buf,
                    int (*end_io) (struct clone *c, int error),
                    void *ctx, uint64_t arg);
enum io_op io_req_op (const struct io_req *req);
/* io.c: for extents(); coordinates are target-relative.  Return 0 or
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
/* For targets that query backends themselves (striped): log that be
 * failed (error < 0) or answered nothing (0) for [offset, offset+len),
 * reported as data.
 */
void extent_backend_failed (struct backend *be, uint64_t offset,
                            uint64_t len, int error);

#endif /* NBDMAPPER_TARGET_H */

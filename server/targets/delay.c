/* SPDX-License-Identifier: BSD-3-Clause */
/* delay <dev> <offset> <delay_ms>
 *       [<write_dev> <write_offset> <write_delay_ms>
 *        [<flush_dev> <flush_offset> <flush_delay_ms>]]
 *
 * dm-delay: reads, writes and flushes wait the given milliseconds, and
 * may go to different devices.  With 3 arguments writes and flushes use
 * the read class, with 6 flushes use the write class.  Writes include
 * zero and trim (dm counts discards and write-zeroes as writes).
 *
 * nbdkit workers are synchronous, so a delayed request simply waits in
 * its worker (map, or the flush hook) on a condition variable with a
 * deadline measured from the request's start: a request crossing several
 * delay targets waits for the longest delay, as dm's parallel bios would.
 * A suspend releases every waiter at once (presuspend), so it never waits
 * out a delay; resume lets delays apply again.  A waiter whose client has
 * gone, or on a server that is stopping, fails with ESHUTDOWN
 * (request_wait), so that neither waits out a delay either.
 *
 * Flushes: a device flush goes once to every backend of the table
 * (flush.c), never through map.  The flush hook makes it wait the flush
 * class's delay first.  dm sends the flush bio only to the flush device;
 * here the read and write devices are flushed as well, which is never
 * less safe.
 *
 * Message (ours; dm-delay has none): "delay <ms> [<write_ms>
 * [<flush_ms>]]" changes the delays at run time.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <strings.h>
#include <time.h>

#include "target.h"
#include "util.h"

enum { CLASS_READ, CLASS_WRITE, CLASS_FLUSH, NR_CLASSES };
/* The arguments of each class, as messages name them. */
static const char *const class_offset[NR_CLASSES] = {
  "offset", "write offset", "flush offset",
};
static const struct target_arg class_delay[NR_CLASSES] = {
  { "delay", "milliseconds", 0, UINT32_MAX },
  { "write delay", "milliseconds", 0, UINT32_MAX },
  { "flush delay", "milliseconds", 0, UINT32_MAX },
};

struct delay_class {
  /* Read-only after ctr. */
  struct backend *be;
  uint64_t start;               /* bytes into the backend */
  /* Set by ctr and by the "delay" message (under the lock, which wakes
   * the waiters to measure again); read without it by each request.
   */
  _Atomic uint32_t delay_ms;
};

struct delay {
  struct delay_class class[NR_CLASSES];
  unsigned argc;                /* 3, 6 or 9: for status */

  pthread_mutex_t lock;         /* protects the fields below */
  pthread_cond_t cond;          /* may_delay became false */
  bool may_delay;               /* false from presuspend to resume */
  unsigned waiting[NR_CLASSES]; /* requests waiting now (status) */
};

/* <dev> <offset> <delay_ms> of class cls, from as. */
static int
delay_class_ctr (struct target *ti, struct delay_class *c,
                 struct target_args *as, unsigned cls,
                 struct mapper_err *err)
{
  const char *dev = target_shift_arg (as);
  uint64_t ms;
  int r;

  if ((r = target_read_sectors (class_offset[cls], as, &c->start, err)) < 0 ||
      (r = target_read_arg (&class_delay[cls], as, &ms, err)) < 0)
    return r;
  c->delay_ms = ms;
  return target_get_backend (ti, dev, c->start, ti->len, &c->be, err);
}

static int
delay_ctr (struct target *ti, unsigned argc, char **argv,
           struct mapper_err *err)
{
  struct delay *dc;
  pthread_condattr_t attr;
  int r;

  if (argc != 3 && argc != 6 && argc != 9) {
    mapper_err_set (err, "expected 3, 6 or 9 arguments <dev> <offset> "
                    "<delay> [<write_dev> <write_offset> <write_delay> "
                    "[<flush_dev> <flush_offset> <flush_delay>]], got %u",
                    argc);
    return -EINVAL;
  }
  dc = calloc (1, sizeof *dc);
  if (dc == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  dc->argc = argc;
  /* Backends already taken belong to the table: it releases them. */
  for (unsigned cls = 0; cls < NR_CLASSES; cls++) {
    /* Missing classes repeat the last one given. */
    unsigned set = cls * 3 < argc ? cls : argc / 3 - 1;
    struct target_args as = { 3, &argv[set * 3] };

    r = delay_class_ctr (ti, &dc->class[cls], &as, cls, err);
    if (r < 0) {
      free (dc);
      return r;
    }
  }

  /* Deadlines are on the monotonic clock, like io_req_start_ns. */
  pthread_condattr_init (&attr);
  pthread_condattr_setclock (&attr, CLOCK_MONOTONIC);
  pthread_cond_init (&dc->cond, &attr);
  pthread_condattr_destroy (&attr);
  pthread_mutex_init (&dc->lock, NULL);
  dc->may_delay = true;
  ti->private = dc;
  return 0;
}

static void
delay_dtr (struct target *ti)
{
  struct delay *dc = ti->private;

  pthread_cond_destroy (&dc->cond);
  pthread_mutex_destroy (&dc->lock);
  free (dc);
}

/* Wait until the request's start + the class's delay, or a suspend.
 * -ESHUTDOWN: the request was given up meanwhile (its client has gone or
 * the server is stopping): a long delay holds neither up.
 */
static int
delay_wait (struct delay *dc, struct io_req *req, int cls)
{
  const _Atomic uint32_t *ms = &dc->class[cls].delay_ms;
  uint64_t deadline, asked = 0;
  int r = 0;

  if (atomic_load_explicit (ms, memory_order_relaxed) == 0)
    return 0;

  pthread_mutex_lock (&dc->lock);
  dc->waiting[cls]++;
  /* The deadline again after each wake-up: a message may change it. */
  while (r == 0 && dc->may_delay &&
         monotonic_ns () < (deadline = io_req_start_ns (req) +
                            (uint64_t) atomic_load (ms) * 1000000))
    r = request_wait (&dc->cond, &dc->lock, deadline, &asked);
  dc->waiting[cls]--;
  pthread_mutex_unlock (&dc->lock);
  return r;
}

static int
delay_map (struct target *ti, struct io_req *req, uint64_t off,
           uint64_t len, char *buf)
{
  struct delay *dc = ti->private;
  int cls = io_req_is_read (req) ? CLASS_READ : CLASS_WRITE;
  const struct delay_class *c = &dc->class[cls];
  int r = delay_wait (dc, req, cls);

  if (r < 0)
    return r;
  return io_emit (req, c->be, c->start + off, len, buf);
}

static int
delay_flush (struct target *ti, struct io_req *req)
{
  return delay_wait (ti->private, req, CLASS_FLUSH);
}

static void
delay_presuspend (struct target *ti)
{
  struct delay *dc = ti->private;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dc->lock);

  dc->may_delay = false;
  pthread_cond_broadcast (&dc->cond);
}

static void
delay_resume (struct target *ti)
{
  struct delay *dc = ti->private;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dc->lock);

  dc->may_delay = true;
}

/* Ours (dm-delay has no messages): "delay <ms> [<write_ms>
 * [<flush_ms>]]", one number per class the table gives (3, 6 or 9
 * arguments: 1, 2 or 3), checked as the table's are.  Requests waiting
 * now measure their wait again from their start.
 */
static int
delay_message (struct target *ti, unsigned argc, char **argv, char *reply,
               size_t len, struct mapper_err *err)
{
  struct delay *dc = ti->private;
  struct target_args as = { argc - 1, argv + 1 };
  unsigned given = dc->argc / 3;
  uint64_t ms[NR_CLASSES];
  int r;

  if (argc == 0 || strcasecmp (argv[0], "delay") != 0) {
    mapper_err_set (err, "unrecognised message '%s': delay takes 'delay "
                    "<ms>%s%s'", argc ? argv[0] : "",
                    given >= 2 ? " <write_ms>" : "",
                    given >= 3 ? " <flush_ms>" : "");
    return -EINVAL;
  }
  if (argc - 1 != given) {
    mapper_err_set (err, "delay: this table gives %u class%s of delay, so "
                    "%u number%s, got %u", given, given == 1 ? "" : "es",
                    given, given == 1 ? "" : "s", argc - 1);
    return -EINVAL;
  }
  for (unsigned cls = 0; cls < given; cls++)
    if ((r = target_read_arg (&class_delay[cls], &as, &ms[cls], err)) < 0) {
      mapper_err_prefix (err, "delay");
      return r;
    }
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dc->lock);
  /* Missing classes repeat the last one given, as in the table. */
  for (unsigned cls = 0; cls < NR_CLASSES; cls++)
    atomic_store (&dc->class[cls].delay_ms, ms[MIN (cls, given - 1)]);
  pthread_cond_broadcast (&dc->cond);
  return MESSAGE_TABLE_CHANGED;
}

static int
delay_extents (struct target *ti, struct extent_walk *w, uint64_t off,
               uint64_t len)
{
  struct delay *dc = ti->private;
  const struct delay_class *c = &dc->class[CLASS_READ];

  return extent_walk_backend (w, ti, off, c->be, c->start + off, len);
}

static size_t
delay_status (struct target *ti, enum status_type type, char *buf,
              size_t len)
{
  struct delay *dc = ti->private;
  size_t used = 0;

  if (type == STATUSTYPE_INFO) {
    /* dm: the requests of each class being delayed now. */
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dc->lock);
    EMIT ("%u %u %u", dc->waiting[CLASS_READ], dc->waiting[CLASS_WRITE],
          dc->waiting[CLASS_FLUSH]);
  }
  else {
    for (unsigned cls = 0; cls < dc->argc / 3; cls++) {
      const struct delay_class *c = &dc->class[cls];
      EMIT ("%s%s %" PRIu64 " %" PRIu32, cls ? " " : "", backend_name (c->be),
            c->start >> MAPPER_SECTOR_SHIFT, atomic_load (&c->delay_ms));
    }
  }
  return used;
}

static int
delay_iterate_backends (struct target *ti,
                        int (*fn) (struct target *, struct backend *, void *),
                        void *data)
{
  struct delay *dc = ti->private;

  for (unsigned cls = 0; cls < dc->argc / 3; cls++) {
    int r = fn (ti, dc->class[cls].be, data);
    if (r)
      return r;
  }
  return 0;
}

const struct target_type delay_target = {
  .name = "delay",
  .version = { 1, 4, 0 },
  .ctr = delay_ctr,
  .dtr = delay_dtr,
  .map = delay_map,
  .extents = delay_extents,
  .status = delay_status,
  .iterate_backends = delay_iterate_backends,
  .flush = delay_flush,
  .presuspend = delay_presuspend,
  .resume = delay_resume,
  .message = delay_message,
};

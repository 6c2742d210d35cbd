/* SPDX-License-Identifier: BSD-3-Clause */
/* The engine as a whole: its settings, its version, and starting and
 * stopping its threads.  The small utilities are in util.c.
 */
#include <config.h>

#include <inttypes.h>
#include <stdio.h>

#include "internal.h"

mapper_log_fn mapper_debug;
mapper_log_fn mapper_log;
mapper_abandoned_fn mapper_request_abandoned;
bool mapper_trace_io;
bool mapper_flush_per_target;
bool mapper_inline_disabled;

const char *const io_op_name[] = {
  [IO_READ] = "read", [IO_WRITE] = "write", [IO_ZERO] = "zero",
  [IO_TRIM] = "trim", [IO_FLUSH] = "flush",
};

const char *
mapper_version (void)
{
  return PACKAGE_VERSION;
}

/* The engine's subsystems, in start order; engine_stop stops them in
 * the reverse order (dm's _inits[] and _exits[]).  Those without a start
 * make their threads on first use (an idle server costs no thread) and
 * are stopped all the same.
 */
static const struct subsystem {
  int (*start) (struct mapper_err *err);        /* 0 or -errno, err filled */
  void (*stop) (void);
} subsystems[] = {
  /* Local flushes side by side: from the first request that needs it. */
  { NULL, localpool_stop },
  /* The backend kinds' own threads (the NBD host name resolver): they
   * post to the I/O loop, so they stop after it.
   */
  { NULL, backend_kinds_stop },
  /* The I/O loop owning remote connections: an idle thread until a
   * table names a remote backend.  Local backends complete inline.
   */
  { ioloop_start, ioloop_stop },
  /* The target types' threads (the mirror resync worker: now if a
   * live mirror needs it, else lazily when one does).  Their I/O may go
   * through the I/O loop and the local pool: they stop first.
   */
  { target_types_start, target_types_stop },
};

int
engine_start (struct mapper_err *err)
{
  size_t i;
  int r = 0;

  for (i = 0; i < ARRAY_SIZE (subsystems); i++)
    if (subsystems[i].start && (r = subsystems[i].start (err)) < 0)
      break;
  /* Undo what was started, not the one that failed. */
  if (r < 0)
    while (i-- > 0)
      subsystems[i].stop ();
  return r;
}

void
engine_stop (void)
{
  for (size_t i = ARRAY_SIZE (subsystems); i-- > 0; )
    subsystems[i].stop ();
}

/* -D mapper.io=1: one line per request showing how it was split. */
void
mapper_log_io_req (const char *devname, const struct io_req *req,
                   uint64_t offset, uint64_t count)
{
  char line[1024];
  size_t used;
  size_t i;

  used = snprintf (line, sizeof line, "%s: %s %" PRIu64 "+%" PRIu64
                   " -> %zu clone%s:", devname, io_op_name[req->op],
                   offset, count, req->nr, req->nr == 1 ? "" : "s");
  for (i = 0; i < req->nr && used < sizeof line; i++) {
    const struct clone *c = &req->clones[i];
    used += snprintf (line + used, sizeof line - used,
                      " [%s %" PRIu64 "+%" PRIu64 "]",
                      c->be->name, c->offset, c->len);
  }
  mapper_debug ("%s", line);
}

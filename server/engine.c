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

const char *const io_op_name[] = {
  [IO_READ] = "read", [IO_WRITE] = "write", [IO_ZERO] = "zero",
  [IO_TRIM] = "trim", [IO_FLUSH] = "flush",
};

const char *
mapper_version (void)
{
  return PACKAGE_VERSION;
}

int
engine_start (struct mapper_err *err)
{
  int r;

  /* The I/O loop owning remote connections (an idle thread until a
   * table names a remote backend), then the mirror resync worker: now if
   * a live mirror needs it, else lazily when one does.  Local backends
   * complete inline.
   */
  if ((r = ioloop_start (err)) < 0)
    return r;
  if ((r = mirror_resync_start (err)) < 0)
    ioloop_stop ();
  return r;
}

void
engine_stop (void)
{
  mirror_resync_stop ();
  ioloop_stop ();
  backend_kinds_stop ();
  localpool_stop ();
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

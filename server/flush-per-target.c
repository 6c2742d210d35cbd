/* SPDX-License-Identifier: BSD-3-Clause */
/* Benchmarks only (-D mapper.flush_per_target=1, bench/bench-flush): the
 * "before" of nbdmapper's flush, one uncoalesced backend flush per target
 * as dm did before it learnt to flush each device once.  A device created
 * in this mode flushes through device_flush_per_target instead of
 * device_flush_backends (device-io.c), chosen once at device_create: the
 * production flush path has no trace of it.
 */
#include <config.h>

#include <errno.h>

#include "internal.h"

static int
flush_one_raw (struct target *ti, struct backend *be, void *data)
{
  struct io_req *req = data;
  struct clone *c = io_req_new_clone (req);

  if (c == NULL)
    return -ENOMEM;
  *c = (struct clone) { .req = req, .be = be, .op = IO_FLUSH };
  return 0;
}

int
device_flush_per_target (struct table *t, uint64_t seen)
{
  for (size_t i = 0; i < t->nr_targets; i++) {
    struct target *ti = &t->targets[i];
    struct io_req req;
    int r = 0;

    if (ti->type->iterate_backends == NULL)
      continue;
    io_req_init (&req, IO_FLUSH, 0);
    r = ti->type->iterate_backends (ti, flush_one_raw, &req);
    if (r == 0)
      r = io_req_run (&req);
    io_req_release (&req);
    if (r < 0)
      return r;
  }
  /* The error stamps too, as io_flush_backends_seen looks at them for
   * device_flush_backends: a mode that moved the observer on without
   * looking would hide a lost write from the benchmark's client.
   */
  for (size_t i = 0; seen != UINT64_MAX && i < t->flushed.len; i++)
    if (backend_errseq (t->flushed.ptr[i]) > seen)
      return -EIO;
  return 0;
}

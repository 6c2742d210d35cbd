/* SPDX-License-Identifier: BSD-3-Clause */
/* The device entry points of the request path: a request enters the
 * device's live table (the gate, device_enter), each target it touches maps
 * its piece into clones (io.c), and the clones run; flush goes once to
 * each distinct backend of the table (flush.c); extents walk the targets
 * (extents.c).
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>

#include "internal.h"

struct uses_backend {
  struct backend *be;
  bool found;
};

static int
uses_backend_cb (struct target *ti, struct backend *be, void *data)
{
  struct uses_backend *u = data;

  if (be == u->be)
    u->found = true;
  return 0;
}

/* Flush bes[0..n) of table t.  A backend whose flush failed does not fail
 * the flush when every target using it can do without it (a mirror with
 * handle_errors drops the leg): the flush_failed hook, error path only.
 * A failed backend that no target lists (iterate_backends) fails the
 * flush: nothing vouches that the writes it took are durable elsewhere
 * (a mirror's log device once went unlisted, and its failed flush was
 * absorbed).
 */
static int
flush_table (struct table *t, struct backend *const *bes, size_t n,
             uint64_t seen)
{
  int inline_errs[IO_INLINE_CLONES];
  int *errs = inline_errs;
  bool found = false;
  int r;

  if (!t->has_flush_failed)
    return io_flush_backends_seen (bes, n, NULL, seen);
  if (n > ARRAY_SIZE (inline_errs) &&
      (errs = malloc (n * sizeof *errs)) == NULL)
    return -ENOMEM;
  r = io_flush_backends_seen (bes, n, errs, seen);
  for (size_t i = 0; r < 0 && i < n; i++) {
    if (errs[i] == 0)
      continue;
    bool claimed = false;

    found = true;
    for (size_t j = 0; j < t->nr_targets; j++) {
      struct target *ti = &t->targets[j];
      struct uses_backend u = { .be = bes[i] };

      if (ti->type->iterate_backends)
        ti->type->iterate_backends (ti, uses_backend_cb, &u);
      claimed |= u.found;
      if (u.found && (ti->type->flush_failed == NULL ||
                      !ti->type->flush_failed (ti, bes[i])))
        goto out;               /* r stands */
    }
    if (!claimed)
      goto out;                 /* r stands */
  }
  if (found)
    r = 0;                      /* every failure absorbed */
 out:
  if (errs != inline_errs)
    free (errs);
  return r;
}

/* FUA on backends without native FUA: flush each touched backend once. */
static int
emulate_fua (struct table *t, const struct io_req *req)
{
  struct backend *bes[IO_INLINE_CLONES];
  size_t n = 0;
  int r;

  for (size_t i = 0; i < req->nr; i++) {
    struct backend *be = req->clones[i].be;
    size_t j;

    if (be->caps.can_fua)
      continue;
    for (j = 0; j < n && bes[j] != be; j++)
      ;
    if (j < n)
      continue;
    if (n == ARRAY_SIZE (bes)) {
      if ((r = flush_table (t, bes, n, UINT64_MAX)) < 0)
        return r;
      n = 0;
    }
    bes[n++] = be;
  }
  return n ? flush_table (t, bes, n, UINT64_MAX) : 0;
}

static int
device_io_once (struct device *dev, enum io_op op, char *buf,
                uint32_t count, uint64_t offset, uint32_t flags)
{
  struct table *t = device_enter (dev);
  struct stats_io sio;
  struct io_req req;
  uint64_t pos, left;
  size_t i, first, end;
  int r;

  if (t == NULL)
    return -ESHUTDOWN;
  /* Never let a request beyond the live table reach a backend (the client
   * may have seen a bigger size before a reload).
   */
  if (offset > t->caps.size || count > t->caps.size - offset) {
    device_exit (dev);
    return op == IO_READ ? -EIO : -ENOSPC;
  }
  if (op != IO_READ && !t->caps.can_write) {
    device_exit (dev);
    return -EPERM;
  }

  stats_io_start (&sio, dev, t);
  io_req_init (&req, op, flags);
  first = end = i = count ? table_find_target (t, offset) : 0;
  for (pos = offset, left = count; left > 0; i++) {
    struct target *ti = &t->targets[i];
    uint64_t toff = pos - ti->begin;
    uint64_t n = MIN (left, ti->len - toff);

    r = ti->type->map (ti, &req, toff, n, buf_at (buf, pos - offset));
    if (r < 0) {
      io_req_cancel (&req);
      goto out;
    }
    pos += n;
    left -= n;
  }
  if (mapper_trace_io && mapper_debug)
    mapper_log_io_req (dev->name, &req, offset, count);

  stats_io_targets (&sio, first, end = i);
  r = io_req_run (&req);
  if (r == 0 && (flags & MAPPER_FUA))
    r = emulate_fua (t, &req);
 out:
  stats_io_end (&sio, op, offset, count, t, first, end);
  io_req_release (&req);
  device_exit (dev);
  return r;
}

/* A request a target held through a noflush suspend (MAPPER_EREQUEUE)
 * went out of the requests in flight: it waits at the gate for the
 * resume (device_enter), then is mapped again, whole, on the live table
 * (dm requeues the original request: what of it completed is done once
 * more, with the same data).
 */
static int
device_io (struct device *dev, enum io_op op, char *buf, uint32_t count,
           uint64_t offset, uint32_t flags)
{
  int r;

  while ((r = device_io_once (dev, op, buf, count, offset, flags)) ==
         MAPPER_EREQUEUE)
    ;
  return r;
}

int
device_pread (struct device *dev, void *buf, uint32_t count, uint64_t offset,
              uint32_t flags)
{
  return device_io (dev, IO_READ, buf, count, offset, flags & ~MAPPER_FUA);
}

int
device_pwrite (struct device *dev, const void *buf, uint32_t count,
               uint64_t offset, uint32_t flags)
{
  /* Backends only read from a write buffer. */
  return device_io (dev, IO_WRITE, (char *) buf, count, offset, flags);
}

int
device_zero (struct device *dev, uint32_t count, uint64_t offset,
             uint32_t flags)
{
  return device_io (dev, IO_ZERO, NULL, count, offset, flags);
}

int
device_trim (struct device *dev, uint32_t count, uint64_t offset,
             uint32_t flags)
{
  return device_io (dev, IO_TRIM, NULL, count, offset, flags);
}

uint64_t
device_errseq_sample (void)
{
  return errseq_sample ();
}

uint64_t
device_errseq (struct device *dev)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->lock);
  uint64_t e = atomic_load (&dev->dropped_err);

  if (dev->live)
    for (size_t i = 0; i < dev->live->flushed.len; i++)
      e = MAX (e, backend_errseq (dev->live->flushed.ptr[i]));
  return e;
}

int
device_flush_backends (struct table *t, uint64_t seen)
{
  /* Once per distinct backend, never once per target; paths are their
   * targets' (the flush hooks, before).
   */
  return flush_table (t, t->flushed.ptr, t->flushed.len, seen);
}

int
device_flush (struct device *dev, uint32_t flags)
{
  return device_flush_errseq (dev, flags, &dev->flush_seen);
}

static int
device_flush_once (struct device *dev, uint32_t flags,
                   _Atomic uint64_t *seen)
{
  struct table *t = device_enter (dev);
  uint64_t sample = errseq_sample ();
  uint64_t since = seen ? atomic_load (seen) : UINT64_MAX;
  struct stats_io sio;
  int r = 0;

  if (t == NULL)
    return -ESHUTDOWN;
  stats_io_start (&sio, dev, t);
  stats_io_flush (&sio);
  /* Targets that delay or fail flushes (delay, flakey) first. */
  if (t->nr_flush_hooks)
    r = table_flush_hooks (t, flags);
  if (r == 0)
    r = dev->flush_backends (t, since);
  /* Errors of backends a swap took out of the table: no flush reaches
   * them any more, but this observer has not heard of them.
   */
  if (r == 0 && atomic_load (&dev->dropped_err) > since)
    r = -EIO;
  /* Not for a flush to be mapped again (MAPPER_EREQUEUE): it has not
   * reported anything yet.
   */
  if (seen && r != MAPPER_EREQUEUE)
    errseq_seen (seen, sample);
  if (mapper_trace_io && mapper_debug)
    mapper_debug ("%s: flush -> %zu backend%s", dev->name, t->flushed.len,
                  t->flushed.len == 1 ? "" : "s");
  stats_io_end (&sio, IO_FLUSH, 0, 0, t, 0, 0);
  device_exit (dev);
  return r;
}

int
device_flush_errseq (struct device *dev, uint32_t flags,
                     _Atomic uint64_t *seen)
{
  int r;

  /* As device_io: a flush held through a noflush suspend. */
  while ((r = device_flush_once (dev, flags, seen)) == MAPPER_EREQUEUE)
    ;
  return r;
}

int
device_extents (struct device *dev, uint32_t count, uint64_t offset,
                uint32_t flags, mapper_extent_fn fn, void *opaque)
{
  struct table *t = device_enter (dev);
  struct extent_walk w = {
    .fn = fn, .opaque = opaque, .next = offset, .end = offset + count,
    .req_one = flags & MAPPER_REQ_ONE,
  };
  size_t i;
  int r = 0;

  if (t == NULL)
    return -ESHUTDOWN;
  if (offset > t->caps.size || count > t->caps.size - offset) {
    device_exit (dev);
    return -EIO;
  }
  for (i = count ? table_find_target (t, offset) : 0;
       w.next < w.end && !w.done; i++) {
    struct target *ti = &t->targets[i];
    uint64_t toff = w.next - ti->begin;
    uint64_t n = MIN (w.end - w.next, ti->len - toff);

    r = ti->type->extents (ti, &w, toff, n);
    if (r < 0) {
      /* Targets report data where they cannot tell (extents.c): this is
       * the reply itself failing (out of memory, say).  Report what is
       * known up to here; fail only when not even the first byte is.
       */
      if (w.next > offset)
        r = 0;
      break;
    }
  }
  device_exit (dev);
  return r;
}

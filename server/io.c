/* SPDX-License-Identifier: BSD-3-Clause */
/* The request/clone core: a request becomes clones (no data copy: each
 * points into the client's buffer), issued to their backends, then waited
 * for.  No global lock; the request and its clone descriptors live on the
 * worker's stack unless the fan-out is very wide.  The device entry points
 * that build requests from a table are in device-io.c, the extents walk
 * in extents.c.
 */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

uint64_t
io_req_start_ns (struct io_req *req)
{
  if (req->start_ns == 0)
    req->start_ns = monotonic_ns () + 1;
  return req->start_ns;
}

bool
io_req_is_read (const struct io_req *req)
{
  return req->op == IO_READ;
}

struct clone *
io_req_new_clone (struct io_req *req)
{
  if (req->nr == req->cap) {
    size_t cap = req->cap * 2;
    struct clone *p;

    if (req->clones == req->inline_clones) {
      p = malloc (cap * sizeof *p);
      if (p)
        memcpy (p, req->clones, req->nr * sizeof *p);
    }
    else
      p = realloc (req->clones, cap * sizeof *p);
    if (p == NULL)
      return NULL;
    req->clones = p;
    req->cap = cap;
  }
  return &req->clones[req->nr++];
}

int
io_emit_end_io (struct io_req *req, struct backend *be, uint64_t offset,
                uint64_t len, char *buf, clone_end_io_fn end_io,
                void *ctx, uint64_t arg)
{
  struct clone *c = io_req_new_clone (req);
  uint32_t flags = req->flags;

  if (c == NULL)
    return -ENOMEM;
  if (!be->caps.can_fua)
    flags &= ~MAPPER_FUA;       /* emulated after completion */
  *c = (struct clone) {
    .req = req, .be = be, .offset = offset, .len = len, .buf = buf,
    .flags = flags, .op = req->op,
    .end_io = end_io, .end_io_ctx = ctx, .end_io_arg = arg,
  };
  return 0;
}

int
io_emit_remap (struct io_req *req, struct backend *be, uint64_t offset,
               uint64_t len, char *buf, clone_end_io_fn end_io,
               clone_remap_fn remap, void *ctx, uint64_t arg)
{
  int r = io_emit_end_io (req, be, offset, len, buf, end_io, ctx, arg);

  if (r == 0) {
    req->clones[req->nr - 1].remap = remap;
    req->clones[req->nr - 1].flags |= CLONE_FAILFAST;
  }
  return r;
}

int
io_emit (struct io_req *req, struct backend *be, uint64_t offset,
         uint64_t len, char *buf)
{
  /* Extend the previous clone when this piece continues it on the same
   * backend (e.g. adjacent linear targets over one file).
   */
  if (req->nr > 0) {
    struct clone *c = &req->clones[req->nr - 1];
    if (c->be == be && c->end_io == NULL && c->offset + c->len == offset &&
        (buf == NULL ? c->buf == NULL : c->buf + c->len == buf)) {
      c->len += len;
      return 0;
    }
  }
  return io_emit_end_io (req, be, offset, len, buf, NULL, NULL, 0);
}

/* The request failed while being mapped: its clones are never submitted.
 * Hooked clones still get their end_io, for the target's accounting.
 */
void
io_req_cancel (struct io_req *req)
{
  for (size_t i = 0; i < req->nr; i++)
    if (req->clones[i].end_io)
      req->clones[i].end_io (&req->clones[i], req->clones[i].end_io_ctx,
                             req->clones[i].end_io_arg, -ECANCELED);
}

bool
clone_alone (const struct clone *c)
{
  return c->req->nr == 1;
}

enum io_op
io_req_op (const struct io_req *req)
{
  return req->op;
}

static void
futex_wait (_Atomic int *addr, int val)
{
  syscall (SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void
futex_wake (_Atomic int *addr)
{
  syscall (SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

void
io_req_clone_retry (struct clone *c)
{
  struct io_req *req = c->req;

  /* Hand it to the waiter: push, then change pending (the clone still
   * holds its count, so req stays alive) so that a futex_wait on the old
   * value returns.  The waiter takes the extra count back.
   */
  c->retry_next = atomic_load (&req->retry);
  while (!atomic_compare_exchange_weak (&req->retry, &c->retry_next, c))
    ;
  atomic_fetch_add (&req->pending, 1);
  futex_wake (&req->pending);
}

void
io_req_clone_end (struct clone *c, int seen)
{
  struct io_req *req = c->req;

  if (seen) {
    int expected = 0;
    assert (seen < 0);
    atomic_compare_exchange_strong (&req->error, &expected, seen);
  }
  /* After the decrement req may be gone (the waiter returns as soon as it
   * sees 0); the wake on its address is then at worst spurious.
   */
  if (atomic_fetch_sub (&req->pending, 1) == 1)
    futex_wake (&req->pending);
}

/* A local clone that waits for its device rather than for a memcpy. */
static bool
clone_blocks (const struct clone *c)
{
  return c->be->ops->device_wait &&
    (c->op == IO_FLUSH || (c->flags & MAPPER_FUA));
}

/* Issue every clone, then wait for all of them; 0 or the first -errno. */
int
io_req_run (struct io_req *req)
{
  struct clone *local = NULL, **tail = &local;
  size_t nr_blocking = 0;
  int v;

  /* Every clone is submitted exactly once below (retries add their own
   * count): count them all with one store rather than one atomic add
   * each.  Nothing has been issued yet, so nobody else looks at pending.
   */
  atomic_store_explicit (&req->pending, req->nr + 1, memory_order_relaxed);

  /* Remote clones first: plugged, the I/O loop takes them as one batch
   * with one wake-up (plug.c), and they are under way while the local
   * ones complete inline.  The local ones are chained (by qnext, unused
   * until the local pool queues them) as they are passed: once a remote
   * clone is submitted it is no longer ours to look at, as its end_io
   * may already have pointed it at a local backend for a retry, which
   * the retry list below submits.
   */
  io_plug_start ();
  for (size_t i = 0; i < req->nr; i++) {
    struct clone *c = &req->clones[i];
    if (c->be->ops->start)
      c->be->ops->submit (c->be, c);
    else {
      *tail = c;
      tail = &c->qnext;
    }
  }
  *tail = NULL;
  io_plug_finish ();
  /* Local clones that wait for a device (flush, FUA write): when there
   * are several, all but the last go to the local pool so that they wait
   * side by side; the rest complete inline here.  Only a flush or a FUA
   * request can have any (a clone has its request's op and at most its
   * flags).
   */
  if (req->op == IO_FLUSH || (req->flags & MAPPER_FUA))
    for (struct clone *c = local; c; c = c->qnext)
      nr_blocking += clone_blocks (c);
  for (struct clone *c = local, *next; c; c = next) {
    next = c->qnext;            /* the pool's queue reuses it */
    if (nr_blocking > 1 && clone_blocks (c)) {
      nr_blocking--;
      if (localpool_submit (c))
        continue;
    }
    c->be->ops->submit (c->be, c);
  }
  if (atomic_fetch_sub (&req->pending, 1) != 1)
    while ((v = atomic_load (&req->pending)) != 0) {
      struct clone *c = atomic_exchange (&req->retry, NULL);

      if (c == NULL) {
        futex_wait (&req->pending, v);
        continue;
      }
      /* Retries asked for by end_io hooks (a mirror read on another
       * leg): resubmitted from this thread, then their extra count
       * dropped.  The clone's own count keeps pending above 0 meanwhile.
       */
      while (c) {
        struct clone *next = c->retry_next;
        int e = 0;

        /* CLONE_REMAP: the target chooses where it goes from here, and
         * may wait for it (a multipath queueing with no path left).
         */
        if (c->remap_due) {
          c->remap_due = false;
          e = c->remap (c, c->end_io_ctx, c->end_io_arg);
        }
        if (e < 0)
          io_req_clone_end (c, e);
        else
          c->be->ops->submit (c->be, c);
        atomic_fetch_sub (&req->pending, 1);
        c = next;
      }
    }
  return atomic_load (&req->error);
}

int
io_sync_end_io (enum io_op op, struct backend *be, uint64_t offset,
                uint64_t len, char *buf, clone_end_io_fn end_io, void *ctx,
                uint64_t arg)
{
  struct io_req req;
  int r;

  io_req_init (&req, op, 0);
  r = io_emit_end_io (&req, be, offset, len, buf, end_io, ctx, arg);
  if (r == 0) {
    req.clones[0].flags |= CLONE_FAILFAST;
    r = io_req_run (&req);
  }
  io_req_release (&req);
  return r;
}

int
io_sync_owned (enum io_op op, struct backend *be, uint64_t offset,
               uint64_t len, char *buf, uint32_t flags, void *owner)
{
  struct io_req req;
  int r;

  io_req_init (&req, op, flags & (MAPPER_FUA | MAPPER_MAY_TRIM));
  r = io_emit (&req, be, offset, len, buf);
  if (r == 0) {
    /* backend_abandon (be, owner) finds it (no hook runs). */
    req.clones[0].end_io_ctx = owner;
    if (mapper_trace_io && mapper_debug)
      mapper_log_io_req ("  sub-request", &req, offset, len);
    r = io_req_run (&req);
  }
  /* FUA on a backend without it: flush that backend (see device_io). */
  if (r == 0 && (flags & MAPPER_FUA) && op != IO_READ && !be->caps.can_fua)
    r = io_flush_backends (&be, 1);
  io_req_release (&req);
  return r;
}

int
io_sync (enum io_op op, struct backend *be, uint64_t offset, uint64_t len,
         char *buf, uint32_t flags)
{
  return io_sync_owned (op, be, offset, len, buf, flags, NULL);
}

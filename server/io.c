/* The request path: a request becomes clones (no data copy: each points
 * into the client's buffer), issued to their backends, then waited for.
 * No global lock; the request and its clone descriptors live on the
 * worker's stack unless the fan-out is very wide.
 */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

/* How many extents one request reports at most (nbdkit accepts fewer than
 * asked as long as the first byte is covered); keeps a wide striped table
 * from turning one query into millions of lseeks.
 */
#define MAX_EXTENTS 4096

void
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

uint64_t
io_req_start_ns (struct io_req *req)
{
  if (req->start_ns == 0)
    req->start_ns = monotonic_ns () + 1;
  return req->start_ns;
}

void
io_req_release (struct io_req *req)
{
  if (req->clones != req->inline_clones)
    free (req->clones);
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
static void
io_req_cancel (struct io_req *req)
{
  for (size_t i = 0; i < req->nr; i++)
    if (req->clones[i].end_io)
      req->clones[i].end_io (&req->clones[i], req->clones[i].end_io_ctx,
                             req->clones[i].end_io_arg, -ECANCELED);
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
  size_t nr_blocking = 0;
  int v;

  /* Every clone is submitted exactly once below (retries add their own
   * count): count them all with one store rather than one atomic add
   * each.  Nothing has been issued yet, so nobody else looks at pending.
   */
  atomic_store_explicit (&req->pending, req->nr + 1, memory_order_relaxed);

  /* Remote clones first: plugged, the I/O loop takes them as one batch
   * with one wake-up (plug.c), and they are under way while the local
   * ones complete inline.
   */
  io_plug_start ();
  for (size_t i = 0; i < req->nr; i++) {
    struct clone *c = &req->clones[i];
    if (c->be->ops->start)
      c->be->ops->submit (c->be, c);
  }
  io_plug_finish ();
  /* Local clones that wait for a device (flush, FUA write): when there
   * are several, all but the last go to the local pool so that they wait
   * side by side; the rest complete inline here.  Only a flush or a FUA
   * request can have any (a clone has its request's op and at most its
   * flags).
   */
  if (req->op == IO_FLUSH || (req->flags & MAPPER_FUA))
    for (size_t i = 0; i < req->nr; i++)
      nr_blocking += clone_blocks (&req->clones[i]);
  for (size_t i = 0; i < req->nr; i++) {
    struct clone *c = &req->clones[i];
    if (c->be->ops->start)
      continue;
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
        c->be->ops->submit (c->be, c);
        atomic_fetch_sub (&req->pending, 1);
        c = next;
      }
    }
  return atomic_load (&req->error);
}

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
 */
static int
io_flush_table (struct table *t, struct backend *const *bes, size_t n,
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
    found = true;
    for (size_t j = 0; j < t->nr_targets; j++) {
      struct target *ti = &t->targets[j];
      struct uses_backend u = { .be = bes[i] };

      if (ti->type->iterate_backends)
        ti->type->iterate_backends (ti, uses_backend_cb, &u);
      if (u.found && (ti->type->flush_failed == NULL ||
                      !ti->type->flush_failed (ti, bes[i])))
        goto out;               /* r stands */
    }
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
io_emulate_fua (struct table *t, const struct io_req *req)
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
      if ((r = io_flush_table (t, bes, n, UINT64_MAX)) < 0)
        return r;
      n = 0;
    }
    bes[n++] = be;
  }
  return n ? io_flush_table (t, bes, n, UINT64_MAX) : 0;
}

int
io_sync (enum io_op op, struct backend *be, uint64_t offset, uint64_t len,
         char *buf, uint32_t flags)
{
  struct io_req req;
  int r;

  io_req_init (&req, op, flags & MAPPER_FUA);
  r = io_emit (&req, be, offset, len, buf);
  if (r == 0) {
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

static int
device_io (struct device *dev, enum io_op op, char *buf, uint32_t count,
           uint64_t offset, uint32_t flags)
{
  struct table *t = device_enter (dev);
  struct io_req req;
  uint64_t pos, left;
  size_t i;
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

  io_req_init (&req, op, flags);
  i = count ? table_find_target (t, offset) : 0;
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

  r = io_req_run (&req);
  if (r == 0 && (flags & MAPPER_FUA))
    r = io_emulate_fua (t, &req);
 out:
  io_req_release (&req);
  device_exit (dev);
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

/* The "before" of nbdmapper's flush: one uncoalesced backend flush per
 * target, as dm did before it learnt to flush each device once.  Only for
 * benchmarks (-D mapper.flush_per_target=1).
 */
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

static int
flush_per_target (struct table *t)
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
  return 0;
}

int
device_flush (struct device *dev, uint32_t flags)
{
  return device_flush_errseq (dev, flags, &dev->flush_seen);
}

int
device_flush_errseq (struct device *dev, uint32_t flags,
                     _Atomic uint64_t *seen)
{
  struct table *t = device_enter (dev);
  uint64_t sample = errseq_sample ();
  uint64_t since = seen ? atomic_load (seen) : UINT64_MAX;
  int r = 0;

  if (t == NULL)
    return -ESHUTDOWN;
  /* Targets that delay or fail flushes (delay, flakey) first. */
  if (t->nr_flush_hooks)
    r = table_flush_hooks (t, flags);
  if (r == 0) {
    if (mapper_flush_per_target) {
      r = flush_per_target (t);
      /* The error stamps too (io_flush_backends_seen does it below). */
      for (size_t i = 0; r == 0 && seen && i < t->backends.len; i++)
        if (backend_errseq (t->backends.ptr[i]) > since)
          r = -EIO;
    }
    else
      /* Once per distinct backend, never once per target. */
      r = io_flush_table (t, t->backends.ptr, t->backends.len, since);
  }
  /* Errors of backends a swap took out of the table: no flush reaches
   * them any more, but this observer has not heard of them.
   */
  if (r == 0 && atomic_load (&dev->dropped_err) > since)
    r = -EIO;
  if (seen)
    errseq_seen (seen, sample);
  if (mapper_trace_io && mapper_debug)
    mapper_debug ("%s: flush -> %zu backend%s", dev->name, t->backends.len,
                  t->backends.len == 1 ? "" : "s");
  device_exit (dev);
  return r;
}

/* --- extents --------------------------------------------------------- */

/* Block status must not fail where a read would: a client (nbdinfo --map,
 * qemu-img map, nbdcopy) gives up on the whole device when it does.  So a
 * range nothing can tell us about (an error target, a backend whose query
 * failed or answered nothing) is reported as data, type 0: "read it to
 * know", which is never wrong, while a hole or zeros claimed there would
 * be.  Block status fails only when the walk's own callback fails (the
 * reply cannot be built) or a target cannot run at all.
 */

bool
extent_walk_done (const struct extent_walk *w)
{
  return w->done;
}

uint64_t
extent_walk_pos (const struct extent_walk *w, const struct target *ti)
{
  return w->next - ti->begin;
}

int
extent_walk_add (struct extent_walk *w, struct target *ti, uint64_t off,
                 uint64_t len, uint32_t type)
{
  uint64_t doff = ti->begin + off;
  int r;

  if (w->done || len == 0)
    return 0;
  assert (doff == w->next);
  r = w->fn (w->opaque, doff, len, type);
  if (r < 0)
    return r;
  w->next = doff + len;
  /* r > 0: the caller has enough (a stacked device's walk feeding a
   * striped target's window, say).
   */
  if (r > 0 || w->req_one || ++w->count >= MAX_EXTENTS || w->next >= w->end)
    w->done = true;
  return 0;
}

int
extent_walk_data (struct extent_walk *w, struct target *ti, uint64_t end)
{
  uint64_t pos = extent_walk_pos (w, ti);

  if (w->done || pos >= end)
    return 0;
  return extent_walk_add (w, ti, pos, end - pos, 0);
}

void
extent_backend_failed (struct backend *be, uint64_t offset, uint64_t len,
                       int error)
{
  if (mapper_debug)
    mapper_debug ("extents: backend %s: [%" PRIu64 ", +%" PRIu64 ") %s: "
                  "reported as data", be->name, offset, len,
                  error < 0 ? strerror (-error) : "answered nothing");
}

struct extent_remap {
  struct extent_walk *w;
  struct target *ti;
  uint64_t delta;               /* target offset - backend offset */
  int fn_error;                 /* the walk's callback failed with it */
};

static int
extent_remap_cb (void *opaque, uint64_t offset, uint64_t length,
                 uint32_t type)
{
  struct extent_remap *m = opaque;
  int r = extent_walk_add (m->w, m->ti, offset + m->delta, length, type);

  if (r < 0) {
    m->fn_error = r;
    return r;
  }
  return m->w->done;            /* > 0: the backend may stop */
}

int
extent_walk_backend_try (struct extent_walk *w, struct target *ti,
                         uint64_t off, struct backend *be, uint64_t be_off,
                         uint64_t len)
{
  struct extent_remap m = { .w = w, .ti = ti, .delta = off - be_off };
  uint64_t from = ti->begin + off, want = from + len;
  int r;

  if (w->done || len == 0)
    return 0;
  assert (w->next == from);
  r = be->ops->extents (be, be_off, len, w->req_one, extent_remap_cb, &m);
  if (m.fn_error)
    return m.fn_error;
  if (r < 0 || w->next == from) {
    extent_backend_failed (be, be_off + (w->next - from), want - w->next, r);
    return EXTENT_BACKEND_FAILED;
  }
  /* A backend that answered for less than asked ends the walk: the
   * extents we report must stay contiguous, and the client asks again
   * from there.
   */
  if (w->next != want)
    w->done = true;
  return 0;
}

int
extent_walk_backend (struct extent_walk *w, struct target *ti, uint64_t off,
                     struct backend *be, uint64_t be_off, uint64_t len)
{
  int r = extent_walk_backend_try (w, ti, off, be, be_off, len);

  if (r == EXTENT_BACKEND_FAILED)
    r = extent_walk_data (w, ti, off + len);
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
      /* Targets report data where they cannot tell (see above): this is
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

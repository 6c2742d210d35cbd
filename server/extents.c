/* SPDX-License-Identifier: BSD-3-Clause */
/* The extents walk: targets report the extents of their ranges through
 * it (target.h), in device order and contiguous, and it hands them to the
 * caller's callback (device_extents in device-io.c) until enough are
 * reported.
 */
#include <config.h>

#include <assert.h>
#include <inttypes.h>
#include <string.h>

#include "internal.h"

/* How many extents one request reports at most (nbdkit accepts fewer than
 * asked as long as the first byte is covered); keeps a wide striped table
 * from turning one query into millions of lseeks.
 */
#define MAX_EXTENTS 4096

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

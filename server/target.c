/* SPDX-License-Identifier: BSD-3-Clause */
/* The target API's toolkit (target.h): the status emitter, the argument
 * reader, the error prefix, and the accessors through which targets see
 * the engine's private structs without their layout.  None of these is
 * on the read/write path: that stays in io.c.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* --- status --------------------------------------------------------- */

size_t
target_emit (char *buf, size_t len, size_t used, const char *fmt, ...)
{
  va_list ap;
  int n;

  va_start (ap, fmt);
  n = vsnprintf (used < len ? buf + used : NULL, used < len ? len - used : 0,
                 fmt, ap);
  va_end (ap);
  return used + (n > 0 ? n : 0);
}

/* --- backends and peers -------------------------------------------- */

void
target_backend_hold (struct backend *be)
{
  backend_hold (be);
}

void
target_backend_put (struct backend *be)
{
  backend_put (be);
}

int
target_backend_size (struct backend *be, uint64_t *size)
{
  return be->ops->get_size (be, size);
}

int
target_flush_backend (struct backend *be)
{
  return io_flush_backends (&be, 1);
}

int
target_table_find (const struct table *t, const char *type_name,
                   int (*fn) (struct target *peer, void *opaque),
                   void *opaque)
{
  for (size_t i = 0; t && i < t->nr_targets; i++) {
    int r;
    if (strcmp (t->targets[i].type->name, type_name) == 0 &&
        (r = fn (&t->targets[i], opaque)) != 0)
      return r;
  }
  return -ENOENT;
}

int
target_find_peer (struct backend *be, const char *type_name,
                  int (*fn) (struct target *peer, void *opaque),
                  void *opaque)
{
  struct device *dev = backend_lower_device (be);

  if (dev == NULL)
    return -ENODEV;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->lock);
  return target_table_find (dev->live, type_name, fn, opaque);
}

/* --- errors --------------------------------------------------------- */

void
mapper_err_prefix (struct mapper_err *err, const char *fmt, ...)
{
  char old[sizeof err->msg];
  size_t n;
  va_list ap;

  if (err == NULL)
    return;
  memcpy (old, err->msg, sizeof old);
  old[sizeof old - 1] = '\0';
  va_start (ap, fmt);
  vsnprintf (err->msg, sizeof err->msg, fmt, ap);
  va_end (ap);
  n = strlen (err->msg);
  snprintf (err->msg + n, sizeof err->msg - n, ": %s", old);
}

/* --- arguments ------------------------------------------------------ */

char *
target_shift_arg (struct target_args *as)
{
  if (as->argc == 0)
    return NULL;
  as->argc--;
  return *as->argv++;
}

int
target_read_arg (const struct target_arg *arg, struct target_args *as,
                 uint64_t *value, struct mapper_err *err)
{
  const char *s = target_shift_arg (as);
  uint64_t v;

  if (s == NULL) {
    mapper_err_set (err, "missing %s", arg->name);
    return -EINVAL;
  }
  if (parse_u64 (s, &v) < 0 || v < arg->min || v > arg->max) {
    mapper_err_set (err, "invalid %s '%s' (%s%s%" PRIu64 " to %" PRIu64 ")",
                    arg->name, s, arg->unit ? arg->unit : "",
                    arg->unit ? ", " : "", arg->min, arg->max);
    return -EINVAL;
  }
  *value = v;
  return 0;
}

int
target_read_sectors (const char *name, struct target_args *as,
                     uint64_t *bytes, struct mapper_err *err)
{
  const char *s = target_shift_arg (as);
  int r;

  if (s == NULL) {
    mapper_err_set (err, "missing %s", name);
    return -EINVAL;
  }
  if ((r = parse_sectors (s, bytes)) < 0) {
    mapper_err_set (err, "%s '%s' %s", name, s, parse_error_text (r));
    return -EINVAL;
  }
  return 0;
}

int
target_read_group (const char *what, unsigned min, unsigned max, bool last,
                   struct target_args *as, struct target_args *group,
                   struct mapper_err *err)
{
  const char *s = target_shift_arg (as);
  uint64_t n;

  if (s == NULL) {
    mapper_err_set (err, "missing number of %ss", what);
    return -EINVAL;
  }
  if (parse_u64 (s, &n) < 0 || n < min || n > max) {
    mapper_err_set (err, "invalid number of %ss '%s' (%u to %u)", what, s,
                    min, max);
    return -EINVAL;
  }
  if (n > as->argc || (last && n != as->argc)) {
    mapper_err_set (err, "%" PRIu64 " %s%s declared but %u given", n, what,
                    n == 1 ? "" : "s", as->argc);
    return -EINVAL;
  }
  *group = (struct target_args) { .argc = n, .argv = as->argv };
  as->argc -= n;
  as->argv += n;
  return 0;
}

/* --- what targets see of the engine's structs -------------------------- */

const char *
backend_name (const struct backend *be)
{
  return be->name;
}

const struct mapper_caps *
backend_caps (const struct backend *be)
{
  return &be->caps;
}

bool
backend_abandon (struct backend *be, void *owner)
{
  if (be->ops->abandon == NULL)
    return false;
  be->ops->abandon (be, owner);
  return true;
}

int
backend_extents (struct backend *be, uint64_t offset, uint64_t len,
                 bool req_one, mapper_extent_fn fn, void *opaque)
{
  return be->ops->extents (be, offset, len, req_one, fn, opaque);
}

const char *
target_origin (const struct target *ti)
{
  return ti->table->origin;
}

uint32_t
io_req_flags (const struct io_req *req)
{
  return req->flags;
}

void
clone_range (const struct clone *c, uint64_t *offset, uint64_t *len)
{
  *offset = c->offset;
  *len = c->len;
}

void
clone_retry (struct clone *c, struct backend *be, uint64_t offset,
             uint64_t arg)
{
  c->be = be;
  c->offset = offset;
  c->end_io_arg = arg;
  /* FUA as io_emit_end_io sets it, for the new backend: native where it
   * has it, else cleared and emulated after completion.  The first
   * backend's choice would make a write to a native-FUA backend that
   * was emitted for one without skip its FUA altogether.
   */
  c->flags &= ~MAPPER_FUA;
  if (be->caps.can_fua)
    c->flags |= c->req->flags & MAPPER_FUA;
}

bool
extent_walk_req_one (const struct extent_walk *w)
{
  return w->req_one;
}

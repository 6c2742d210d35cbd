/* Stacking: "mapper:NAME" in a table names another device of the same
 * server.  Its clones go straight into that device's request path, in
 * process and on the submitting thread (no NBD hop, no copy: the lower
 * device's clones point into the same client buffer).
 *
 * The lower device must have a live table when the upper table is
 * loaded: -ENXIO otherwise (the plugin then defers the upper table until
 * the lower one is loaded).
 * A flush of the upper device is a flush of the lower device, which
 * flushes its own backends through their write generations: a leaf
 * backend reached by several paths is flushed once.  Cycles are refused
 * by device_check_table before a table is loaded.
 */
#include <config.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct device_backend {
  struct backend be;
  struct device *dev;           /* read-only; a counted reference + open */
};

#define DB(be) ((struct device_backend *) (be))

static const struct backend_ops device_ops;

struct device *
device_backend_device (const struct backend *be)
{
  return be->ops == &device_ops ? DB (be)->dev : NULL;
}

static void
device_submit (struct backend *be, struct clone *c)
{
  struct device *dev = DB (be)->dev;
  uint32_t flags = c->flags & (MAPPER_FUA | MAPPER_MAY_TRIM | MAPPER_FAST_ZERO);
  int r;

  /* A clone is part of one NBD request, so it fits in 32 bits. */
  if (c->len > UINT32_MAX) {
    clone_done (c, -EINVAL);
    return;
  }
  switch (c->op) {
  case IO_READ:
    r = device_pread (dev, c->buf, c->len, c->offset, 0);
    break;
  case IO_WRITE:
    r = device_pwrite (dev, c->buf, c->len, c->offset, flags);
    break;
  case IO_ZERO:
    r = device_zero (dev, c->len, c->offset, flags);
    break;
  case IO_TRIM:
    r = device_trim (dev, c->len, c->offset, flags);
    break;
  case IO_FLUSH:
    /* Its own result only: the errors of the lower device's backends
     * reach the upper observer through device_be_errseq.
     */
    r = device_flush_errseq (dev, 0, NULL);
    break;
  default:
    abort ();
  }
  clone_done (c, r);
}

static int
device_be_extents (struct backend *be, uint64_t offset, uint64_t len,
                   bool req_one, mapper_extent_fn fn, void *opaque)
{
  return device_extents (DB (be)->dev, MIN (len, UINT32_MAX & ~511ULL),
                         offset, req_one ? MAPPER_REQ_ONE : 0, fn, opaque);
}

static int
device_get_size (struct backend *be, uint64_t *size)
{
  struct mapper_caps caps;

  if (!device_get_caps (DB (be)->dev, &caps))
    return -ENXIO;
  *size = caps.size;
  return 0;
}

/* The latest error stamp of the lower device's backends (live table and
 * those its swaps dropped), however deep: a flush of the upper device
 * that finds this backend clean must still report them.
 */
static uint64_t
device_be_errseq (struct backend *be)
{
  return device_errseq (DB (be)->dev);
}

static void
device_close (struct backend *be)
{
  struct device_backend *d = DB (be);

  atomic_fetch_sub (&d->dev->stack_holders, 1);
  device_put (d->dev);
  free (be->name);
  free (d);
}

static const struct backend_ops device_ops = {
  .kind = "device",
  .submit = device_submit,
  .extents = device_be_extents,
  .get_size = device_get_size,
  .errseq = device_be_errseq,
  .close = device_close,
};

static bool
device_claims (const char *spec)
{
  return strncmp (spec, DEVICE_BACKEND_PREFIX,
                  strlen (DEVICE_BACKEND_PREFIX)) == 0;
}

/* Keyed by the device's name as written. */
static int
device_key (const char *spec, char **key, struct mapper_err *err)
{
  if ((*key = strdup (spec)) == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  return 0;
}

static int
device_backend_open (const char *spec, const char *key,
                     struct backend **out, struct mapper_err *err)
{
  const char *name = spec + strlen (DEVICE_BACKEND_PREFIX);
  struct device_backend *d;
  struct mapper_caps caps;
  struct device *dev;

  if (*name == '\0') {
    mapper_err_set (err, "%s: missing device name after '%s'", spec,
                    DEVICE_BACKEND_PREFIX);
    return -EINVAL;
  }
  /* A reference: the device outlives anything done to it while a table
   * holds it.  Not an open count (those are client connections):
   * remove and rename find the holders themselves (device.c).
   */
  dev = device_get (name);
  if (dev == NULL) {
    mapper_err_set (err, "%s: no such device '%s' (not loaded: no table "
                    "for it, or tables stacking on each other in a cycle)",
                    spec, name);
    return -ENXIO;
  }
  if (!device_get_caps (dev, &caps)) {
    mapper_err_set (err, "%s: device '%s' has no live table (not loaded "
                    "yet, or this is its own table: a device cannot stack "
                    "on itself)", spec, name);
    device_put (dev);
    return -ENXIO;
  }
  d = calloc (1, sizeof *d);
  if (d == NULL || (d->be.name = strdup (spec)) == NULL) {
    free (d);
    device_put (dev);
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  d->dev = dev;
  atomic_fetch_add (&dev->stack_holders, 1);
  d->be.ops = &device_ops;
  d->be.caps = caps;
  /* The lower device honours FUA itself (natively or by flushing). */
  d->be.caps.can_flush = true;
  d->be.caps.can_fua = true;
  *out = &d->be;
  return 0;
}

const struct backend_kind device_backend_kind = {
  .name = "device",
  .claims = device_claims,
  .key = device_key,
  .open = device_backend_open,
};

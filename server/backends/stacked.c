/* SPDX-License-Identifier: BSD-3-Clause */
/* Stacking: "mapper:NAME" in a table names another device of the same
 * server.  Its clones go straight into that device's request path, in
 * process and on the submitting thread (no NBD hop, no copy: the lower
 * device's clones point into the same client buffer).
 *
 * A backend like the others, and a user of the engine's public API
 * (engine.h) like the plugin: it knows no more of a device than its
 * name.  The core learns which device a backend stacks on through the
 * lower_device op, to refuse cycles and to find the tables holding a
 * device (device.c).
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

#include "backend.h"
#include "util.h"

struct stacked_backend {
  struct backend be;
  struct device *dev;           /* read-only; from device_get_stacked */
};

#define SB(be) ((struct stacked_backend *) (be))

static void
stacked_submit (struct backend *be, struct clone *c)
{
  struct device *dev = SB (be)->dev;
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
     * reach the upper observer through stacked_errseq.
     */
    r = device_flush_errseq (dev, 0, NULL);
    break;
  default:
    abort ();
  }
  clone_done (c, r);
}

static int
stacked_extents (struct backend *be, uint64_t offset, uint64_t len,
                 bool req_one, mapper_extent_fn fn, void *opaque)
{
  return device_extents (SB (be)->dev, MIN (len, UINT32_MAX & ~511ULL),
                         offset, req_one ? MAPPER_REQ_ONE : 0, fn, opaque);
}

static int
stacked_get_size (struct backend *be, uint64_t *size)
{
  struct mapper_caps caps;

  if (!device_get_caps (SB (be)->dev, &caps))
    return -ENXIO;
  *size = caps.size;
  return 0;
}

/* The latest error stamp of the lower device's backends (live table and
 * those its swaps dropped), however deep: a flush of the upper device
 * that finds this backend clean must still report them.
 */
static uint64_t
stacked_errseq (struct backend *be)
{
  return device_errseq (SB (be)->dev);
}

static struct device *
stacked_lower_device (struct backend *be)
{
  return SB (be)->dev;
}

static void
stacked_close (struct backend *be)
{
  struct stacked_backend *sb = SB (be);

  device_put_stacked (sb->dev);
  free (be->name);
  free (sb);
}

static const struct backend_ops stacked_ops = {
  .kind = "device",
  .submit = stacked_submit,
  .extents = stacked_extents,
  .get_size = stacked_get_size,
  .errseq = stacked_errseq,
  .lower_device = stacked_lower_device,
  .close = stacked_close,
};

static bool
stacked_claims (const char *spec)
{
  return strncmp (spec, DEVICE_BACKEND_PREFIX,
                  strlen (DEVICE_BACKEND_PREFIX)) == 0;
}

/* Keyed by the device's name as written. */
static int
stacked_key (const char *spec, char **key, struct mapper_err *err)
{
  if ((*key = strdup (spec)) == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  return 0;
}

static int
stacked_open (const char *spec, const char *key, struct backend **out,
              struct mapper_err *err)
{
  const char *name = spec + strlen (DEVICE_BACKEND_PREFIX);
  struct stacked_backend *sb;
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
  dev = device_get_stacked (name);
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
    device_put_stacked (dev);
    return -ENXIO;
  }
  sb = calloc (1, sizeof *sb);
  if (sb == NULL || (sb->be.name = strdup (spec)) == NULL) {
    free (sb);
    device_put_stacked (dev);
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  sb->dev = dev;
  sb->be.ops = &stacked_ops;
  sb->be.caps = caps;
  /* The lower device honours FUA itself (natively or by flushing). */
  sb->be.caps.can_flush = true;
  sb->be.caps.can_fua = true;
  *out = &sb->be;
  return 0;
}

const struct backend_kind stacked_backend_kind = {
  .claims = stacked_claims,
  .key = stacked_key,
  .open = stacked_open,
};

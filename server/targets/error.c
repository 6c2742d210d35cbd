/* SPDX-License-Identifier: BSD-3-Clause */
/* error: every I/O fails with EIO (dm-error); block status says data. */
#include <config.h>

#include <errno.h>

#include "target.h"

static int
error_map (struct target *ti, struct io_req *req, uint64_t off,
           uint64_t len, char *buf)
{
  return -EIO;
}

/* Reads fail, so nothing here is a hole or zeros; but failing block
 * status would fail the whole map of the device (nbdinfo --map, qemu-img
 * map, nbdcopy): data, as for any range we cannot tell about.
 */
static int
error_extents (struct target *ti, struct extent_walk *w, uint64_t off,
               uint64_t len)
{
  return extent_walk_add (w, ti, off, len, 0);
}

const struct target_type error_target = {
  .name = "error",
  .version = { 1, 6, 0 },
  .ctr = target_ctr_no_args,
  .map = error_map,
  .extents = error_extents,
};

/* SPDX-License-Identifier: BSD-3-Clause */
/* zero: reads return zeros, writes are dropped (dm-zero). */
#include <config.h>

#include <errno.h>
#include <string.h>

#include "target.h"

static int
zero_map (struct target *ti, struct io_req *req, uint64_t off,
          uint64_t len, char *buf)
{
  if (io_req_is_read (req))
    memset (buf, 0, len);
  return 0;
}

static int
zero_extents (struct target *ti, struct extent_walk *w, uint64_t off,
              uint64_t len)
{
  return extent_walk_add (w, ti, off, len,
                          MAPPER_EXTENT_HOLE | MAPPER_EXTENT_ZERO);
}

const struct target_type zero_target = {
  .name = "zero",
  .version = { 1, 2, 0 },
  .ctr = target_ctr_no_args,
  .map = zero_map,
  .extents = zero_extents,
};

/* error: every I/O fails with EIO (dm-error). */
#include <config.h>

#include <errno.h>
#include <stdio.h>

#include "internal.h"

static int
error_map (struct target *ti, struct io_req *req, uint64_t off,
           uint64_t len, char *buf)
{
  return -EIO;
}

static int
error_extents (struct target *ti, struct extent_walk *w, uint64_t off,
               uint64_t len)
{
  return -EIO;
}

static size_t
error_status (struct target *ti, enum status_type type, char *buf,
              size_t len)
{
  return snprintf (buf, len, "%s", "");
}

const struct target_type error_target = {
  .name = "error",
  .version = { 1, 6, 0 },
  .ctr = target_ctr_no_args,
  .map = error_map,
  .extents = error_extents,
  .status = error_status,
};

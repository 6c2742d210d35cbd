/* SPDX-License-Identifier: BSD-3-Clause */
/* linear <dev> <offset>: one contiguous area of one backend. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>

#include "target.h"

struct linear {
  struct backend *be;
  uint64_t start;               /* bytes into the backend */
};

static int
linear_ctr (struct target *ti, unsigned argc, char **argv,
            struct mapper_err *err)
{
  struct target_args as = { argc, argv };
  struct linear *lc;
  const char *dev;
  uint64_t start;
  int r;

  if (argc != 2) {
    mapper_err_set (err, "expected 2 arguments <dev> <offset>, got %u", argc);
    return -EINVAL;
  }
  dev = target_shift_arg (&as);
  if ((r = target_read_sectors ("offset", &as, &start, err)) < 0)
    return r;
  lc = target_private_alloc (ti, sizeof *lc);
  if (lc == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  lc->start = start;
  r = target_get_backend (ti, dev, start, ti->len, &lc->be, err);
  if (r < 0) {
    target_private_free (ti, lc);
    return r;
  }
  ti->private = lc;
  return 0;
}

static void
linear_dtr (struct target *ti)
{
  target_private_free (ti, ti->private);
}

static int
linear_map (struct target *ti, struct io_req *req, uint64_t off,
            uint64_t len, char *buf)
{
  struct linear *lc = ti->private;

  return io_emit (req, lc->be, lc->start + off, len, buf);
}

static int
linear_extents (struct target *ti, struct extent_walk *w, uint64_t off,
                uint64_t len)
{
  struct linear *lc = ti->private;

  return extent_walk_backend (w, ti, off, lc->be, lc->start + off, len);
}

static size_t
linear_status (struct target *ti, enum status_type type, char *buf,
               size_t len)
{
  struct linear *lc = ti->private;
  size_t used = 0;

  if (type == STATUSTYPE_TABLE)
    EMIT ("%s %" PRIu64, backend_name (lc->be),
          lc->start >> MAPPER_SECTOR_SHIFT);
  return used;
}

static int
linear_iterate_backends (struct target *ti,
                         int (*fn) (struct target *, struct backend *, void *),
                         void *data)
{
  struct linear *lc = ti->private;

  return fn (ti, lc->be, data);
}

const struct target_type linear_target = {
  .name = "linear",
  .version = { 1, 4, 0 },
  .ctr = linear_ctr,
  .dtr = linear_dtr,
  .map = linear_map,
  .extents = linear_extents,
  .status = linear_status,
  .iterate_backends = linear_iterate_backends,
};

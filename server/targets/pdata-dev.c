/* SPDX-License-Identifier: BSD-3-Clause */
/* struct pd_blockdev over a backend: see pdata-dev.h. */
#include <config.h>

#include "target.h"
#include "util.h"
#include "pdata-dev.h"

static int
md_read (void *opaque, uint64_t offset, size_t len, void *buf)
{
  return io_sync (IO_READ, opaque, offset, len, buf, 0);
}

static int
md_write (void *opaque, uint64_t offset, size_t len, const void *buf)
{
  /* io_sync does not write through buf; its type is shared with reads. */
  return io_sync (IO_WRITE, opaque, offset, len, (char *) buf, 0);
}

static int
md_flush (void *opaque)
{
  return target_flush_backend (opaque);
}

const struct pd_blockdev_ops target_pd_blockdev_ops = {
  .read = md_read, .write = md_write, .flush = md_flush,
};

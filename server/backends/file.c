/* SPDX-License-Identifier: BSD-3-Clause */
/* Local files and block devices.  Requests complete inline in the
 * submitting worker: pread/pwrite loops straight into the client's buffer.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef HAVE_LINUX_FS_H
#include <linux/fs.h>
#endif

#include "backend.h"
#include "util.h"

struct file_backend {
  struct backend be;
  int fd;                       /* read-only after open */
  bool is_block;
  /* Cleared when the kernel says a method is unsupported, so we stop
   * trying it.  Relaxed: a stale true only costs one more failed call.
   */
  _Atomic bool can_punch, can_zero_range, can_fallocate, can_zeroout;
};

#define FB(be) ((struct file_backend *) (be))

/* Never written: the source of zeros for writing zeros. */
static char zero_page[64 * 1024];

static int
full_pread (int fd, char *buf, uint64_t len, uint64_t off)
{
  while (len > 0) {
    ssize_t r = pread (fd, buf, len, off);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (r == 0)                 /* truncated under us */
      return -EIO;
    buf += r, len -= r, off += r;
  }
  return 0;
}

static int
full_pwrite (int fd, const char *buf, uint64_t len, uint64_t off)
{
  while (len > 0) {
    ssize_t r = pwrite (fd, buf, len, off);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    buf += r, len -= r, off += r;
  }
  return 0;
}

static int
file_sync (struct file_backend *f)
{
  return fdatasync (f->fd) == -1 ? -errno : 0;
}

static bool
unsupported (int e)
{
  return e == EOPNOTSUPP || e == ENOSYS || e == ENOTTY || e == EINVAL;
}

/* Try fallocate(mode); 1 done, 0 not supported (flag cleared), -errno. */
static int
try_fallocate (struct file_backend *f, _Atomic bool *flag, int mode,
               uint64_t off, uint64_t len)
{
  if (!atomic_load_explicit (flag, memory_order_relaxed))
    return 0;
  if (fallocate (f->fd, mode, off, len) == 0)
    return 1;
  if (unsupported (errno)) {
    atomic_store_explicit (flag, false, memory_order_relaxed);
    return 0;
  }
  return -errno;
}

static int
file_zero (struct file_backend *f, struct clone *c)
{
  int r;

  if (c->flags & MAPPER_MAY_TRIM) {
    r = try_fallocate (f, &f->can_punch,
                       FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                       c->offset, c->len);
    if (r != 0)
      return r < 0 ? r : 0;
  }
  if (!f->is_block) {
    r = try_fallocate (f, &f->can_zero_range, FALLOC_FL_ZERO_RANGE,
                       c->offset, c->len);
    if (r != 0)
      return r < 0 ? r : 0;
    /* Punch, then allocate again: zeroed and still allocated. */
    if (atomic_load_explicit (&f->can_fallocate, memory_order_relaxed)) {
      r = try_fallocate (f, &f->can_punch,
                         FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                         c->offset, c->len);
      if (r < 0)
        return r;
      if (r > 0) {
        r = try_fallocate (f, &f->can_fallocate, 0, c->offset, c->len);
        if (r != 0)
          return r < 0 ? r : 0;
        /* A hole reads as zeros: the range is zeroed already. */
        return 0;
      }
    }
  }
#ifdef BLKZEROOUT
  /* The kernel may emulate BLKZEROOUT by writing: not "fast". */
  else if (!(c->flags & MAPPER_FAST_ZERO) &&
           atomic_load_explicit (&f->can_zeroout, memory_order_relaxed) &&
           ((c->offset | c->len) & (MAPPER_SECTOR_SIZE - 1)) == 0) {
    uint64_t range[2] = { c->offset, c->len };
    if (ioctl (f->fd, BLKZEROOUT, range) == 0)
      return 0;
    if (!unsupported (errno))
      return -errno;
    atomic_store_explicit (&f->can_zeroout, false, memory_order_relaxed);
  }
#endif

  if (c->flags & MAPPER_FAST_ZERO)
    return -ENOTSUP;

  for (uint64_t off = c->offset, len = c->len; len > 0; ) {
    uint64_t n = MIN (len, sizeof zero_page);
    r = full_pwrite (f->fd, zero_page, n, off);
    if (r < 0)
      return r;
    off += n, len -= n;
  }
  return 0;
}

static int
file_trim (struct file_backend *f, struct clone *c)
{
  int r = try_fallocate (f, &f->can_punch,
                         FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                         c->offset, c->len);
  return r < 0 ? r : 0;       /* trim is advisory */
}

static void
file_submit (struct backend *be, struct clone *c)
{
  struct file_backend *f = FB (be);
  int r = 0;

  switch (c->op) {
  case IO_READ:
    r = full_pread (f->fd, c->buf, c->len, c->offset);
    break;
  case IO_WRITE:
    r = full_pwrite (f->fd, c->buf, c->len, c->offset);
    break;
  case IO_ZERO:
    r = file_zero (f, c);
    break;
  case IO_TRIM:
    r = file_trim (f, c);
    break;
  case IO_FLUSH:
    r = file_sync (f);
    break;
  }
  if (r == 0 && (c->flags & MAPPER_FUA) && c->op != IO_FLUSH &&
      c->op != IO_READ)
    r = file_sync (f);
  clone_done (c, r);
}

static int
file_extents (struct backend *be, uint64_t offset, uint64_t len,
              bool req_one, mapper_extent_fn fn, void *opaque)
{
  struct file_backend *f = FB (be);
  uint64_t end = offset + len;
  int r;

  if (f->is_block) {
    r = fn (opaque, offset, len, 0);
    return r < 0 ? r : 0;
  }

  while (offset < end) {
    off_t data, hole;

    data = lseek (f->fd, offset, SEEK_DATA);
    if (data == -1) {
      if (errno != ENXIO)
        return -errno;
      data = end;               /* only a hole to the end of file */
    }
    if ((uint64_t) data > offset) {
      uint64_t n = MIN ((uint64_t) data, end) - offset;
      r = fn (opaque, offset, n, MAPPER_EXTENT_HOLE | MAPPER_EXTENT_ZERO);
      if (r)                    /* < 0 error, > 0 caller has enough */
        return r < 0 ? r : 0;
      offset += n;
      if (req_one || offset >= end)
        break;
    }
    hole = lseek (f->fd, offset, SEEK_HOLE);
    if (hole == -1)
      return -errno;
    {
      uint64_t n = MIN ((uint64_t) hole, end) - offset;
      if (n == 0)               /* raced with a write: call it data */
        n = end - offset;
      r = fn (opaque, offset, n, 0);
      if (r)
        return r < 0 ? r : 0;
      offset += n;
    }
    if (req_one)
      break;
  }
  return 0;
}

static int
file_get_size (struct backend *be, uint64_t *size)
{
  struct file_backend *f = FB (be);
  struct stat st;

#ifdef BLKGETSIZE64
  if (f->is_block)
    return ioctl (f->fd, BLKGETSIZE64, size) == -1 ? -errno : 0;
#endif
  if (fstat (f->fd, &st) == -1)
    return -errno;
  *size = st.st_size;
  return 0;
}

static void
file_close (struct backend *be)
{
  struct file_backend *f = FB (be);

  close (f->fd);
  free (be->name);
  free (f);
}

static const struct backend_ops file_ops = {
  .kind = "file",
  .device_wait = true,
  .submit = file_submit,
  .extents = file_extents,
  .get_size = file_get_size,
  .close = file_close,
};

/* A path: whatever the kinds before this one in backends.def leave. */
static bool
file_claims (const char *spec)
{
  return true;
}

/* Files are the same backend when they are the same inode, by whatever
 * path (symlink, hard link, another device node).
 */
static int
file_key (const char *spec, char **key, struct mapper_err *err)
{
  CLEANUP_FREE char *canonical = realpath (spec, NULL);
  struct stat st;
  int r;

  if (canonical == NULL || stat (canonical, &st) == -1) {
    r = -errno;
    mapper_err_set (err, "%s: %s", spec, mapper_strerror (errno));
    return r;
  }
  if (S_ISBLK (st.st_mode))
    r = asprintf (key, "blk:%ju", (uintmax_t) st.st_rdev);
  else if (S_ISREG (st.st_mode))
    r = asprintf (key, "file:%ju:%ju", (uintmax_t) st.st_dev,
                  (uintmax_t) st.st_ino);
  else {
    mapper_err_set (err, "%s: not a regular file or block device", spec);
    return -EINVAL;
  }
  if (r == -1) {
    mapper_err_set (err, "%s: out of memory", spec);
    return -ENOMEM;
  }
  return 0;
}

static int
file_open (const char *path, const char *key, struct backend **out,
           struct mapper_err *err)
{
  CLEANUP_FREE char *canonical = realpath (path, NULL);
  struct file_backend *f;
  struct stat st;
  bool readonly = false;
  int fd, r;

  if (canonical == NULL) {
    r = -errno;
    mapper_err_set (err, "%s: %s", path, mapper_strerror (errno));
    return r;
  }
  fd = open (canonical, O_RDWR | O_CLOEXEC);
  if (fd == -1 && (errno == EACCES || errno == EROFS || errno == EPERM)) {
    fd = open (canonical, O_RDONLY | O_CLOEXEC);
    readonly = true;
  }
  if (fd == -1) {
    r = -errno;
    mapper_err_set (err, "%s: %s", path, mapper_strerror (errno));
    return r;
  }
  if (fstat (fd, &st) == -1) {
    r = -errno;
    mapper_err_set (err, "%s: fstat: %s", path, mapper_strerror (errno));
    close (fd);
    return r;
  }
  if (!S_ISREG (st.st_mode) && !S_ISBLK (st.st_mode)) {
    mapper_err_set (err, "%s: not a regular file or block device", path);
    close (fd);
    return -EINVAL;
  }

  f = calloc (1, sizeof *f);
  if (f == NULL || (f->be.name = strdup (canonical)) == NULL) {
    free (f);
    close (fd);
    mapper_err_set (err, "%s: out of memory", path);
    return -ENOMEM;
  }
  f->fd = fd;
  f->is_block = S_ISBLK (st.st_mode);
  f->be.ops = &file_ops;
  f->be.caps.size = st.st_size;
#ifdef BLKGETSIZE64
  if (f->is_block && ioctl (fd, BLKGETSIZE64, &f->be.caps.size) == -1) {
    r = -errno;
    mapper_err_set (err, "%s: BLKGETSIZE64: %s", path, mapper_strerror (errno));
    file_close (&f->be);
    return r;
  }
#endif
  atomic_init (&f->can_punch, true);
  atomic_init (&f->can_zero_range, true);
  atomic_init (&f->can_fallocate, true);
  atomic_init (&f->can_zeroout, true);

  f->be.caps.can_write = !readonly;
  f->be.caps.can_flush = true;
  f->be.caps.can_fua = true;         /* write + fdatasync */
  f->be.caps.can_trim = true;
  f->be.caps.can_zero = true;
  f->be.caps.can_fast_zero = true;
  f->be.caps.can_extents = true;
  f->be.caps.can_multi_conn = true;  /* one fd: fdatasync covers all */
  f->be.caps.block_min = 1;
  f->be.caps.block_pref = 4096;
  f->be.caps.block_max = 0xffffffff;
  *out = &f->be;
  return 0;
}

const struct backend_kind file_backend_kind = {
  .claims = file_claims,
  .key = file_key,
  .open = file_open,
};

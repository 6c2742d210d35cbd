/* SPDX-License-Identifier: BSD-3-Clause */
/* dup-write.so: an LD_PRELOAD shim for bench-mirror's ceiling.
 *
 *   LD_PRELOAD=dup-write.so DUP_WRITE_FROM=LEG0 DUP_WRITE_TO=LEG1 \
 *       nbdkit ... mapper "0 N linear LEG0 0"
 *
 * Every pwrite into LEG0 (whatever path the server opened it by: the
 * file is matched by device and inode when it is opened) is followed by
 * the same pwrite, same buffer, offset and length, into LEG1, from the
 * same thread.  A linear device so served does what a 2-leg mirror must
 * do at least, one more copy into a leg's page cache, and nothing else: no
 * second clone, no hook, no mirror state.  Its CPU per request is the
 * ceiling measured where the mirror runs (the server's threads, its
 * buffers, the socket's traffic alongside), which a copy loop on its own
 * does not reproduce (bench/README.md, bench-mirror).
 *
 * Only the bench uses it; nothing in the server knows of it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static int (*real_open) (const char *, int, ...);
static int (*real_open64) (const char *, int, ...);
static int (*real_close) (int);
static ssize_t (*real_pwrite) (int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64) (int, const void *, size_t, off_t);

static dev_t from_dev;
static ino_t from_ino;
static int to_fd = -1;
/* Opened on LEG0 (several fds may be: each backend opens its own). */
#define MAX_FD 4096
static _Atomic bool is_from[MAX_FD];

static void __attribute__ ((constructor))
dup_write_init (void)
{
  const char *from = getenv ("DUP_WRITE_FROM");
  const char *to = getenv ("DUP_WRITE_TO");
  struct stat st;

  real_open = dlsym (RTLD_NEXT, "open");
  real_open64 = dlsym (RTLD_NEXT, "open64");
  real_close = dlsym (RTLD_NEXT, "close");
  real_pwrite = dlsym (RTLD_NEXT, "pwrite");
  real_pwrite64 = dlsym (RTLD_NEXT, "pwrite64");
  if (!real_open || !real_open64 || !real_close || !real_pwrite || !real_pwrite64) {
    fprintf (stderr, "dup-write: dlsym: %s\n", dlerror ());
    abort ();
  }
  if (from == NULL || to == NULL) {
    fprintf (stderr, "dup-write: set DUP_WRITE_FROM and DUP_WRITE_TO\n");
    abort ();
  }
  if (stat (from, &st) == -1) {
    perror (from);
    abort ();
  }
  from_dev = st.st_dev;
  from_ino = st.st_ino;
  to_fd = real_open (to, O_WRONLY | O_CLOEXEC);
  if (to_fd == -1) {
    perror (to);
    abort ();
  }
}

static int
note (int fd)
{
  struct stat st;

  if (fd >= 0 && fd < MAX_FD)
    is_from[fd] = fstat (fd, &st) == 0 && st.st_dev == from_dev &&
      st.st_ino == from_ino;
  return fd;
}

#define OPEN_WRAPPER(name, real)                                 \
  int                                                            \
  name (const char *path, int flags, ...)                        \
  {                                                              \
    mode_t mode = 0;                                             \
    if (flags & (O_CREAT | __O_TMPFILE)) {                       \
      va_list ap;                                                \
      va_start (ap, flags);                                      \
      mode = va_arg (ap, mode_t);                                \
      va_end (ap);                                               \
    }                                                            \
    return note (real (path, flags, mode));                      \
  }
OPEN_WRAPPER (open, real_open)
OPEN_WRAPPER (open64, real_open64)

static ssize_t
dup_pwrite (ssize_t (*real) (int, const void *, size_t, off_t), int fd,
            const void *buf, size_t len, off_t off)
{
  ssize_t r = real (fd, buf, len, off);

  if (r > 0 && fd >= 0 && fd < MAX_FD &&
      atomic_load_explicit (&is_from[fd], memory_order_relaxed) &&
      real (to_fd, buf, r, off) != r) {
    perror ("dup-write: pwrite");
    abort ();
  }
  return r;
}

int
close (int fd)
{
  if (fd >= 0 && fd < MAX_FD)
    is_from[fd] = false;
  return real_close (fd);
}

ssize_t
pwrite (int fd, const void *buf, size_t len, off_t off)
{
  return dup_pwrite (real_pwrite, fd, buf, len, off);
}

ssize_t
pwrite64 (int fd, const void *buf, size_t len, off_t off)
{
  return dup_pwrite (real_pwrite64, fd, buf, len, off);
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* The engine's small utilities (util.h): threads, clocks, the wait that
 * holds a request, errors, scope-bound cleanup, the vector's growth,
 * strict number parsing and streams for secrets.  Nothing here knows a device, a table, a
 * target or a backend.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "util.h"

_Static_assert ((uint64_t) MAPPER_MAX_SECTORS ==
                (uint64_t) INT64_MAX >> MAPPER_SECTOR_SHIFT,
                "MAPPER_MAX_SECTORS is the largest int64 size in sectors");

/* A thread of ours: it blocks every signal (they belong to nbdkit's
 * threads) and carries a name for ps/top/gdb.  0 or an errno.
 */
int
mapper_thread_create (pthread_t *thread, void *(*fn) (void *),
                      const char *name)
{
  return mapper_thread_create_arg (thread, fn, NULL, name);
}

int
mapper_thread_create_arg (pthread_t *thread, void *(*fn) (void *),
                          void *arg, const char *name)
{
  sigset_t all, old;
  int r;

  /* The new thread inherits the mask in force when it is created. */
  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  r = pthread_create (thread, NULL, fn, arg);
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (r == 0)
    pthread_setname_np (*thread, name);
  return r;
}

uint64_t
monotonic_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

__thread _Atomic bool *request_wait_cancel;

int
request_wait (pthread_cond_t *cond, pthread_mutex_t *lock, uint64_t deadline,
              uint64_t *asked)
{
  uint64_t now = monotonic_ns (), until;
  struct timespec ts;

  if (*asked == 0)
    *asked = now;
  else if (now - *asked >= REQUEST_WAIT_SLICE_NS) {
    /* Asked by elapsed time, not by timeouts: wake-ups for others on
     * the same condition variable must not postpone the question.  The
     * server's answer may take a system call: not under the lock.
     */
    int r = 0;

    *asked = now;
    if (request_wait_cancel && atomic_load (request_wait_cancel))
      return -ESHUTDOWN;
    if (mapper_request_abandoned) {
      pthread_mutex_unlock (lock);
      r = mapper_request_abandoned ();
      pthread_mutex_lock (lock);
    }
    if (r < 0)
      return -ESHUTDOWN;
  }
  until = *asked + REQUEST_WAIT_SLICE_NS;
  if (deadline && deadline < until)
    until = deadline;
  ts.tv_sec = until / 1000000000;
  ts.tv_nsec = until % 1000000000;
  /* Whatever the clock cond was made with. */
  pthread_cond_clockwait (cond, lock, CLOCK_MONOTONIC, &ts);
  return 0;
}

void
mapper_err_set (struct mapper_err *err, const char *fmt, ...)
{
  va_list ap;

  if (err == NULL)
    return;
  va_start (ap, fmt);
  vsnprintf (err->msg, sizeof err->msg, fmt, ap);
  va_end (ap);
}

const char *
mapper_strerror (int errnum)
{
  const char *s = strerrordesc_np (errnum);
  return s ? s : "Unknown error";
}

void
cleanup_free (void *ptr)
{
  free (*(void **) ptr);
}

void
cleanup_unlock (pthread_mutex_t **m)
{
  pthread_mutex_unlock (*m);
}

int
generic_vector_reserve (void **ptr, size_t *cap, size_t len, size_t n,
                        size_t itemsize)
{
  size_t want, newcap, bytes;
  void *p;

  if (__builtin_add_overflow (len, n, &want)) {
    errno = ENOMEM;
    return -1;
  }
  if (want <= *cap)
    return 0;
  newcap = *cap ? *cap : 4;
  while (newcap < want)
    if (__builtin_mul_overflow (newcap, 2, &newcap)) {
      errno = ENOMEM;
      return -1;
    }
  if (__builtin_mul_overflow (newcap, itemsize, &bytes)) {
    errno = ENOMEM;
    return -1;
  }
  p = realloc (*ptr, bytes);
  if (p == NULL)
    return -1;
  *ptr = p;
  *cap = newcap;
  return 0;
}

/* Strict unsigned decimal: digits only, no sign, no junk, no overflow. */
int
parse_u64 (const char *s, uint64_t *out)
{
  uint64_t v = 0;

  if (*s == '\0')
    return -EINVAL;
  for (; *s; s++) {
    if (*s < '0' || *s > '9')
      return -EINVAL;
    if (__builtin_mul_overflow (v, 10, &v) ||
        __builtin_add_overflow (v, (uint64_t) (*s - '0'), &v))
      return -ERANGE;
  }
  *out = v;
  return 0;
}

/* A sector count, returned in bytes; must fit in an NBD size (int64):
 * -EOVERFLOW past MAPPER_MAX_SECTORS, even if it fits in 64 bits.
 */
int
parse_sectors (const char *s, uint64_t *bytes)
{
  uint64_t sectors;
  int r = parse_u64 (s, &sectors);

  if (r == -ERANGE || (r == 0 && sectors > MAPPER_MAX_SECTORS))
    return -EOVERFLOW;
  if (r < 0)
    return r;
  *bytes = sectors << MAPPER_SECTOR_SHIFT;
  return 0;
}

/* Why parse_u64 or parse_sectors returned r, for error messages. */
const char *
parse_error_text (int r)
{
  if (r == -EOVERFLOW)
    return "overflows the largest NBD size: at most " MAPPER_MAX_SECTORS_TEXT
      " sectors (NBD sizes are below 2^63 bytes)";
  return r == -ERANGE ? "overflows 64 bits" : "is not a non-negative integer";
}


/* --- secret_stream ------------------------------------------------------ */

static ssize_t
secret_stream_write (void *cookie, const char *p, size_t n)
{
  struct secret_stream *s = cookie;

  if (n >= SIZE_MAX - 1 - s->len) {
    errno = ENOMEM;
    return 0;
  }
  if (s->len + n + 1 > s->cap) {
    size_t cap = MAX (MAX (s->cap * 2, s->len + n + 1), 256);
    char *b = malloc (cap);

    if (b == NULL)
      return 0;                 /* fopencookie: an error */
    if (s->buf) {
      memcpy (b, s->buf, s->len);
      explicit_bzero (s->buf, s->cap);
      free (s->buf);
    }
    s->buf = b;
    s->cap = cap;
  }
  memcpy (s->buf + s->len, p, n);
  s->len += n;
  s->buf[s->len] = '\0';
  return n;
}

FILE *
secret_stream_open (struct secret_stream *s)
{
  static const cookie_io_functions_t io = { .write = secret_stream_write };

  s->buf = NULL;
  s->len = s->cap = 0;
  s->fp = fopencookie (s, "w", io);
  if (s->fp && setvbuf (s->fp, s->io, _IOFBF, sizeof s->io) != 0) {
    fclose (s->fp);
    s->fp = NULL;
  }
  if (s->fp == NULL)
    errno = ENOMEM;
  return s->fp;
}

int
secret_stream_close (struct secret_stream *s, char **text, size_t *len)
{
  int r = fclose (s->fp) == EOF ? -1 : 0;

  s->fp = NULL;
  explicit_bzero (s->io, sizeof s->io);
  if (r == 0 && s->buf == NULL && (s->buf = calloc (1, 1)) == NULL)
    r = -1;
  if (r < 0 && s->buf) {
    explicit_bzero (s->buf, s->cap);
    free (s->buf);
    s->buf = NULL;
  }
  *text = s->buf;
  *len = r == 0 ? s->len : 0;
  s->buf = NULL;
  s->len = s->cap = 0;
  return r;
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* Small utilities for every layer of the engine and for targets: the
 * bottom of the include graph (nbdkit's common/include, common/utils).
 * Only the C library below it; it compiles alone.
 */
#ifndef NBDMAPPER_UTIL_H
#define NBDMAPPER_UTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vector.h"

#define ARRAY_SIZE(a) (sizeof (a) / sizeof ((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define DIV_ROUND_UP(n, d) (((n) + (d) - 1) / (d))
#define IS_POWER_OF_2(x) ((x) != 0 && ((x) & ((x) - 1)) == 0)

/* Scope-bound cleanup (nbdkit's cleanup.h). */
#define CLEANUP_FREE __attribute__ ((cleanup (cleanup_free)))
void cleanup_free (void *ptr);
#define ACQUIRE_LOCK_FOR_CURRENT_SCOPE(m) \
  __attribute__ ((cleanup (cleanup_unlock))) pthread_mutex_t *_lock_ = (m); \
  pthread_mutex_lock (_lock_)
void cleanup_unlock (pthread_mutex_t **m);

/* The value of hex digit c (either case), or -1 (nbdkit's hexdigit.h). */
static inline int
hex_digit (int c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* util.c */
uint64_t monotonic_ns (void);   /* CLOCK_MONOTONIC, nanoseconds */
/* A thread that blocks all signals, named NAME; 0 or an errno. */
int mapper_thread_create (pthread_t *thread, void *(*fn) (void *),
                          const char *name);
/* The same, fn called with arg. */
int mapper_thread_create_arg (pthread_t *thread, void *(*fn) (void *),
                              void *arg, const char *name);

/* util.c: one turn of a wait that holds a client request: wait on cond
 * (lock held, as for pthread_cond_wait) until woken or until deadline
 * (monotonic_ns, 0: none), at most one slice.  Once a slice has passed
 * since *asked (0 at the start of the wait), asks
 * mapper_request_abandoned (engine.h) first.  0: look at the condition
 * again; -ESHUTDOWN: give the request up.  The fast path never comes
 * here.
 */
#define REQUEST_WAIT_SLICE_NS (100 * 1000000ULL)
int request_wait (pthread_cond_t *cond, pthread_mutex_t *lock,
                  uint64_t deadline, uint64_t *asked);
/* Set by an engine thread around work that may be held the same way
 * (a mirror's resync through a suspended mapper:NAME leg): once *flag is
 * true, request_wait gives that work up as well.
 */
extern __thread _Atomic bool *request_wait_cancel;

/* The largest sector count (start, length, offset): its bytes must fit
 * in an NBD size, which nbdkit and libnbd hold in an int64_t (checked
 * against MAPPER_SECTOR_SHIFT in util.c).
 */
#define MAPPER_MAX_SECTORS 18014398509481983    /* INT64_MAX >> 9 */
#define MAPPER_STR_(x) #x
#define MAPPER_STR(x) MAPPER_STR_(x)
#define MAPPER_MAX_SECTORS_TEXT MAPPER_STR (MAPPER_MAX_SECTORS)

/* util.c: strict number parsing ("%llu%c" style). */
int parse_u64 (const char *s, uint64_t *out);
int parse_sectors (const char *s, uint64_t *bytes);  /* sectors -> bytes */
/* Why they failed with r: "overflows 64 bits", "overflows the largest
 * NBD size..." (parse_sectors) or "is not a non-negative integer", to
 * follow the argument in a message.
 */
const char *parse_error_text (int r);

/* util.c: open_memstream for text that may hold secrets (a table with
 * crypt keys, a reply to table --showkeys).  open_memstream leaves
 * copies of what was written in freed memory: each growth reallocs, and
 * stdio's buffer is freed unwiped.  Here the buffer grows by copying and
 * wiping the old one, and stdio's buffer is io[], wiped at close.  The
 * struct may live on the stack; s->fp is the stream to write.
 */
#define SECRET_STREAM_IO 4096
struct secret_stream {
  FILE *fp;
  char *buf;                    /* NUL-terminated */
  size_t len, cap;
  char io[SECRET_STREAM_IO];
};
/* s->fp, or NULL (ENOMEM; nothing to close). */
FILE *secret_stream_open (struct secret_stream *s);
/* Close s->fp: 0 and the text in *text (malloc'd, "" if nothing was
 * written; the caller wipes it before it frees it) and its length in
 * *len, or -1 (out of memory: what was written is wiped and freed,
 * *text NULL).
 */
int secret_stream_close (struct secret_stream *s, char **text, size_t *len);

#endif /* NBDMAPPER_UTIL_H */

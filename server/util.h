/* Small utilities for every layer of the engine and for targets: the
 * bottom of the include graph (nbdkit's common/include, common/utils).
 * Only the C library below it; it compiles alone.
 */
#ifndef NBDMAPPER_UTIL_H
#define NBDMAPPER_UTIL_H

#include <pthread.h>
#include <stdint.h>

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

/* engine.c */
uint64_t monotonic_ns (void);   /* CLOCK_MONOTONIC, nanoseconds */
/* A thread that blocks all signals, named NAME; 0 or an errno. */
int mapper_thread_create (pthread_t *thread, void *(*fn) (void *),
                          const char *name);

#endif /* NBDMAPPER_UTIL_H */

/* SPDX-License-Identifier: BSD-3-Clause */
/* bench-stats-cost: what the I/O statistics add to one request, without
 * fio, nbdkit or a socket: the engine's own request path alone, which
 * makes the difference as large as it can be relative to the rest.
 *
 *   bench-stats-cost [-t THREADS] [-n REQUESTS] [-r ROUNDS]
 *
 * THREADS [2] threads each run REQUESTS [1000000] 4K reads of a device
 * of 4 "zero" targets (a memset each), at offsets walking the device,
 * with statistics off (mapper_stats_disabled, as -D mapper.stats_off=1)
 * and on, in turns, ROUNDS [7] times; prints each round's nanoseconds
 * of CPU per request (the threads' CPU time, CLOCK_THREAD_CPUTIME_ID,
 * over all their requests: other load on the machine preempts a thread
 * without counting) and the medians' difference: the statistics' cost
 * per request, to set against the server's whole CPU time per request
 * that bench-stats prints.
 *
 * Built on demand: make -C bench bench-stats-cost.
 */
#include <config.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

static struct device *dev;
static long requests = 1000000;
static pthread_barrier_t barrier;

static uint64_t
cpu_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *
reader (void *p)
{
  static __thread char buf[4096];
  uint64_t *ns = p, t0;

  pthread_barrier_wait (&barrier);
  t0 = cpu_ns ();
  for (long i = 0; i < requests; i++)
    if (device_pread (dev, buf, sizeof buf, (uint64_t) (i & 4095) * 4096,
                      0) < 0)
      abort ();
  *ns = cpu_ns () - t0;
  return NULL;
}

static double
run (int threads, bool stats)
{
  struct mapper_err err = { "" };
  struct table *t;
  pthread_t th[64];
  uint64_t ns[64], sum = 0;

  /* A swap drops the set; the next request makes one unless off. */
  mapper_stats_disabled = !stats;
  if (table_parse ("0 8192 zero\n8192 8192 zero\n16384 8192 zero\n"
                   "24576 8192 zero\n", "bench", &t, &err) < 0 ||
      device_replace (dev, t, NULL, &err) < 0) {
    fprintf (stderr, "bench-stats-cost: %s\n", err.msg);
    exit (1);
  }
  pthread_barrier_init (&barrier, NULL, threads);
  for (int i = 0; i < threads; i++)
    pthread_create (&th[i], NULL, reader, &ns[i]);
  for (int i = 0; i < threads; i++) {
    pthread_join (th[i], NULL);
    sum += ns[i];
  }
  pthread_barrier_destroy (&barrier);
  return (double) sum / threads / requests;
}

static int
cmp (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return x < y ? -1 : x > y;
}

int
main (int argc, char *argv[])
{
  struct mapper_err err = { "" };
  int threads = 2, rounds = 7, opt;
  double off[64], on[64];

  while ((opt = getopt (argc, argv, "t:n:r:")) != -1)
    switch (opt) {
    case 't': threads = atoi (optarg); break;
    case 'n': requests = atol (optarg); break;
    case 'r': rounds = atoi (optarg); break;
    default:
      fprintf (stderr, "usage: bench-stats-cost [-t THREADS] [-n REQUESTS] "
               "[-r ROUNDS]\n");
      return 2;
    }
  if (threads < 1 || threads > 64 || rounds < 1 || rounds > 64 ||
      requests < 1) {
    fprintf (stderr, "bench-stats-cost: -t 1..64, -r 1..64, -n >= 1\n");
    return 2;
  }
  if (device_create ("bench", &dev, &err) < 0) {
    fprintf (stderr, "bench-stats-cost: %s\n", err.msg);
    return 1;
  }
  run (threads, true);          /* warm up */
  printf ("bench-stats-cost: %d threads x %ld 4K reads of zero targets\n",
          threads, requests);
  printf ("%-6s %14s %14s\n", "round", "off CPU ns/req", "on CPU ns/req");
  for (int r = 0; r < rounds; r++) {
    /* Alternate which goes first. */
    if (r % 2) {
      on[r] = run (threads, true);
      off[r] = run (threads, false);
    }
    else {
      off[r] = run (threads, false);
      on[r] = run (threads, true);
    }
    printf ("%-6d %14.1f %14.1f\n", r + 1, off[r], on[r]);
  }
  qsort (off, rounds, sizeof off[0], cmp);
  qsort (on, rounds, sizeof on[0], cmp);
  printf ("median %14.1f %14.1f   statistics: %+.1f ns per request\n",
          off[rounds / 2], on[rounds / 2], on[rounds / 2] - off[rounds / 2]);
  device_destroy (dev);
  return 0;
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* Flush bookkeeping (server/flush.c) against a backend whose flushes we
 * count and fail on demand: clean backends are not flushed, concurrent
 * flushes share one backend flush, failures poison the next flush once,
 * and a lost connection with unflushed writes fails the next flush.
 * Backends that wait for a device flush side by side (the local pool).
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "unit.h"

static _Atomic int nr_flushes;
static _Atomic int fail_next;           /* next backend flush fails EIO */
static _Atomic int slow;                /* complete flushes from a thread */

static _Atomic int slow_us = 50000;     /* how slow */
static _Atomic int lose_next;           /* writes lost before it completes */

static void *
late_completion (void *arg)
{
  struct clone *c = arg;
  int err = atomic_exchange (&fail_next, 0) ? -EIO : 0;

  usleep (atomic_load (&slow_us));
  if (atomic_exchange (&lose_next, 0))
    backend_writes_lost (c->be);
  clone_done (c, err);
  return NULL;
}

static void
test_submit (struct backend *be, struct clone *c)
{
  CHECK (c->op == IO_FLUSH);
  atomic_fetch_add (&nr_flushes, 1);
  if (atomic_load (&slow)) {
    pthread_t t;
    pthread_create (&t, NULL, late_completion, c);
    pthread_detach (t);
    return;
  }
  clone_done (c, atomic_exchange (&fail_next, 0) ? -EIO : 0);
}

static const struct backend_ops test_ops = {
  .kind = "test", .submit = test_submit,
};

/* A device that waits: its flush returns only once dev_want flushes are
 * in progress at the same time (or after 10 s, a failure: they ran one
 * after the other).  Records the threads used.
 */
enum { nr_devices = 4 };
static int dev_want = nr_devices;
static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dev_cond = PTHREAD_COND_INITIALIZER;
static int dev_running, dev_max_running, dev_timeouts;
static pthread_t dev_threads[nr_devices * 2];
static int dev_nr_threads;

static void
device_submit (struct backend *be, struct clone *c)
{
  struct timespec until;
  bool seen = false;

  CHECK (c->op == IO_FLUSH || (c->flags & MAPPER_FUA));
  clock_gettime (CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  pthread_mutex_lock (&dev_lock);
  for (int i = 0; i < dev_nr_threads; i++)
    seen |= pthread_equal (dev_threads[i], pthread_self ());
  if (!seen && dev_nr_threads < (int) ARRAY_SIZE (dev_threads))
    dev_threads[dev_nr_threads++] = pthread_self ();
  dev_running++;
  dev_max_running = MAX (dev_max_running, dev_running);
  pthread_cond_broadcast (&dev_cond);
  while (dev_max_running < dev_want)
    if (pthread_cond_timedwait (&dev_cond, &dev_lock, &until) == ETIMEDOUT) {
      dev_timeouts++;
      break;
    }
  dev_running--;
  pthread_mutex_unlock (&dev_lock);
  clone_done (c, 0);
}

static const struct backend_ops device_ops = {
  .kind = "test-device", .submit = device_submit, .device_wait = true,
};

static void
write_done (struct backend *be)
{
  flush_note_write (be);
}

/* A flush by observer *seen (a client connection: device_flush_errseq
 * does the same over a device's backends).
 */
static int
flush_as (struct backend *be, _Atomic uint64_t *seen)
{
  struct backend *bes[1] = { be };
  uint64_t sample = errseq_sample ();
  int r = io_flush_backends_seen (bes, 1, NULL, atomic_load (seen));

  errseq_seen (seen, sample);
  return r;
}

/* The observer most checks use: one connection. */
static _Atomic uint64_t conn1;

static int
flush1 (struct backend *be)
{
  return flush_as (be, &conn1);
}

static struct backend *shared_be;
static _Atomic int thread_errors;

static void *
flusher (void *arg)
{
  if (flush1 (shared_be) != 0)
    atomic_fetch_add (&thread_errors, 1);
  return NULL;
}

int
main (void)
{
  struct backend be = { .ops = &test_ops, .name = "test" };
  struct backend be2 = { .ops = &test_ops, .name = "test2" };
  struct backend *both[2] = { &be, &be2 };
  pthread_t th[8];

  atomic_init (&conn1, errseq_sample ());
  backend_flush_init (&be);
  backend_flush_init (&be2);

  /* Clean: nothing to flush. */
  CHECK (flush1 (&be) == 0 && nr_flushes == 0);
  write_done (&be);
  CHECK (flush1 (&be) == 0 && nr_flushes == 1);
  CHECK (flush1 (&be) == 0 && nr_flushes == 1);

  /* Only the dirty one of two. */
  write_done (&be2);
  CHECK (io_flush_backends (both, 2) == 0 && nr_flushes == 2);
  write_done (&be);
  write_done (&be2);
  CHECK (io_flush_backends (both, 2) == 0 && nr_flushes == 4);

  /* A failed flush fails, and fails the next one once, even when that
   * one would otherwise find nothing new to flush.
   */
  write_done (&be);
  fail_next = 1;
  CHECK (flush1 (&be) == -EIO);
  CHECK (flush1 (&be) == -EIO);
  CHECK (flush1 (&be) == 0);    /* retried for real: still dirty */
  CHECK (nr_flushes == 6);
  CHECK (flush1 (&be) == 0 && nr_flushes == 6);

  /* Lost connection: with unflushed writes the next flush fails once;
   * with none, nothing happens.
   */
  backend_writes_lost (&be);
  CHECK (flush1 (&be) == 0);
  write_done (&be);
  backend_writes_lost (&be);
  CHECK (flush1 (&be) == -EIO);
  CHECK (flush1 (&be) == 0);

  /* Every observer open at a loss fails its next flush once, whichever
   * flushes first (errseq); one that came later does not; a flush with
   * no observer (a suspend, FUA) gives its own result only.
   */
  {
    _Atomic uint64_t conn2, conn3;
    atomic_init (&conn2, errseq_sample ());
    write_done (&be);
    backend_writes_lost (&be);
    atomic_init (&conn3, errseq_sample ());
    CHECK (io_flush_backends (both, 1) == 0);
    CHECK (flush_as (&be, &conn2) == -EIO);
    CHECK (flush_as (&be, &conn2) == 0);
    CHECK (flush_as (&be, &conn3) == 0);
    CHECK (flush1 (&be) == -EIO);
    CHECK (flush1 (&be) == 0);
    /* A failed flush: it fails its sharer, and the next flush of every
     * observer once more (the failing one's included).
     */
    write_done (&be);
    fail_next = 1;
    CHECK (flush_as (&be, &conn3) == -EIO);
    CHECK (flush_as (&be, &conn3) == -EIO);
    CHECK (flush_as (&be, &conn3) == 0);
    CHECK (flush_as (&be, &conn2) == -EIO);
    CHECK (flush_as (&be, &conn2) == 0);
    CHECK (flush1 (&be) == -EIO);
    CHECK (flush1 (&be) == 0);
    /* Errors on a backend the observer does not flush are not its own
     * (another device's): they fail only the flushes that reach it.
     */
    write_done (&be2);
    backend_writes_lost (&be2);
    CHECK (flush_as (&be, &conn2) == 0);
    CHECK (flush1 (&be2) == -EIO);
    CHECK (flush1 (&be2) == 0);
  }

  /* A loss while a flush waits for an older one (a write completed
   * after that one started): the flush it then starts succeeds (a new
   * connection), but the write, acknowledged before the request, may be
   * gone: the observer must hear of it now, not at its next flush
   * (which fails once more, as after a flush that failed itself).
   */
  {
    _Atomic uint64_t conn_w;
    pthread_t t;

    atomic_init (&conn_w, errseq_sample ());
    write_done (&be);
    nr_flushes = 0;
    slow = 1;
    slow_us = 300000;
    lose_next = 1;
    shared_be = &be;
    pthread_create (&t, NULL, flusher, NULL);
    while (atomic_load (&nr_flushes) == 0)   /* that flush is running */
      usleep (1000);
    write_done (&be);                        /* after it started */
    CHECK (flush_as (&be, &conn_w) == -EIO);
    CHECK (flush_as (&be, &conn_w) == -EIO);
    CHECK (flush_as (&be, &conn_w) == 0);
    pthread_join (t, NULL);
    slow = 0;
    slow_us = 50000;
    thread_errors = 0;
    flush1 (&be);                            /* flusher's observer */
  }

  /* Eight concurrent flushes after one write share the backend flush. */
  slow = 1;
  shared_be = &be;
  write_done (&be);
  nr_flushes = 0;
  for (int i = 0; i < 8; i++)
    pthread_create (&th[i], NULL, flusher, NULL);
  for (int i = 0; i < 8; i++)
    pthread_join (th[i], NULL);
  CHECK (thread_errors == 0);
  CHECK (nr_flushes == 1);

  /* A write completing while a flush runs needs a new flush: a flush
   * that started before it does not cover it.
   */
  nr_flushes = 0;
  write_done (&be);
  {
    pthread_t t;
    pthread_create (&t, NULL, flusher, NULL);
    /* Once that flush has started: on a loaded machine a fixed sleep
     * could end before the thread ran, and then only one flush is
     * needed.
     */
    while (atomic_load (&nr_flushes) == 0)
      usleep (1000);
    write_done (&be);
    CHECK (flush1 (&be) == 0);  /* waits, then flushes again */
    pthread_join (t, NULL);
  }
  CHECK (nr_flushes == 2);

  /* A concurrent flush that fails fails everyone who shared it. */
  nr_flushes = 0;
  thread_errors = 0;
  write_done (&be);
  fail_next = 1;
  for (int i = 0; i < 4; i++)
    pthread_create (&th[i], NULL, flusher, NULL);
  for (int i = 0; i < 4; i++)
    pthread_join (th[i], NULL);
  CHECK (nr_flushes >= 1);
  CHECK (thread_errors >= 1);

  /* Devices that wait flush side by side, on as many threads: a flush
   * over four of them waits for the slowest, not for the sum.  Then the
   * same for one FUA write split over the four (striped, mirror legs).
   */
  {
    struct backend devs[nr_devices];
    struct backend *devp[nr_devices];
    struct io_req req;
    char buf[nr_devices * 512];

    for (int i = 0; i < nr_devices; i++) {
      devs[i] = (struct backend) { .ops = &device_ops, .name = "dev",
                                   .caps.can_fua = true };
      backend_flush_init (&devs[i]);
      devp[i] = &devs[i];
      write_done (&devs[i]);
    }
    /* First two devices: the pool gets one thread, which then waits
     * for work.  A pool that counted a thread it had already woken as
     * still idle would hand the next flush's three pool clones to that
     * one thread, one after the other.
     */
    dev_want = 2;
    CHECK (io_flush_backends (devp, 2) == 0);
    CHECK (dev_timeouts == 0 && dev_max_running == 2);
    usleep (100000);                    /* the pool thread goes idle */
    write_done (&devs[0]);
    write_done (&devs[1]);
    dev_want = nr_devices;
    dev_max_running = dev_nr_threads = 0;
    CHECK (io_flush_backends (devp, nr_devices) == 0);
    CHECK (dev_timeouts == 0);
    CHECK (dev_max_running == nr_devices);
    CHECK (dev_nr_threads == nr_devices);

    dev_max_running = dev_nr_threads = 0;
    memset (buf, 'x', sizeof buf);
    io_req_init (&req, IO_WRITE, MAPPER_FUA);
    for (int i = 0; i < nr_devices; i++)
      CHECK (io_emit (&req, devp[i], 0, 512, buf + i * 512) == 0);
    CHECK (io_req_run (&req) == 0);
    io_req_release (&req);
    CHECK (dev_timeouts == 0);
    CHECK (dev_max_running == nr_devices);
    CHECK (dev_nr_threads == nr_devices);
    for (int i = 0; i < nr_devices; i++)
      backend_flush_destroy (&devs[i]);
    localpool_stop ();
  }

  backend_flush_destroy (&be);
  backend_flush_destroy (&be2);
  UNIT_EXIT ();
}

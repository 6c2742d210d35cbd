/* SPDX-License-Identifier: BSD-3-Clause */
/* The local pool: a few threads that run blocking local clones so that a
 * request reaching several local devices waits for the slowest, not for
 * the sum.  Only clones that wait for a device are sent here: flushes
 * (fdatasync) and FUA writes, when one request has two or more of them
 * for backends whose ops say so (files and block devices).  Buffered
 * reads and writes are a memcpy into the page cache: handing them to
 * another thread would cost a wake-up and save nothing, so they stay
 * inline in the worker.
 *
 * The threads start on first use (never for a server whose requests do
 * not need them: an idle device costs no thread) up to LOCALPOOL_THREADS,
 * and engine_stop joins them.  A flush is already milliseconds of device
 * time and is coalesced per backend (flush.c), so one mutex here is not
 * on the read/write path.
 */
#include <config.h>

#include <stdbool.h>

#include "internal.h"

#define LOCALPOOL_THREADS 4

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static struct clone *head, **tail = &head;      /* FIFO, by qnext */
static pthread_t threads[LOCALPOOL_THREADS];
static unsigned nr_threads;     /* started */
static unsigned nr_idle;        /* waiting for work, or woken for it */
static unsigned nr_queued;      /* clones in the FIFO */
static bool stopping;

static __thread bool in_pool;

static void *
pool_thread (void *arg)
{
  struct clone *c;

  in_pool = true;
  pthread_mutex_lock (&lock);
  for (;;) {
    while (head == NULL && !stopping) {
      nr_idle++;
      pthread_cond_wait (&cond, &lock);
      nr_idle--;
    }
    if ((c = head) == NULL)
      break;                    /* stopping, nothing left */
    head = c->qnext;
    if (head == NULL)
      tail = &head;
    nr_queued--;
    pthread_mutex_unlock (&lock);
    c->be->ops->submit (c->be, c);      /* completes it: clone_done */
    pthread_mutex_lock (&lock);
  }
  pthread_mutex_unlock (&lock);
  return NULL;
}

bool
localpool_submit (struct clone *c)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&lock);

  /* A pool thread never waits for the pool (no deadlock by nesting). */
  if (in_pool || stopping)
    return false;
  /* A thread for every queued clone: an idle thread already woken for
   * an earlier clone still counts in nr_idle until it runs, so compare
   * with what is queued, not with zero.
   */
  if (nr_queued >= nr_idle && nr_threads < LOCALPOOL_THREADS) {
    if (mapper_thread_create (&threads[nr_threads], pool_thread,
                              "mapper-local") == 0)
      nr_threads++;
    else if (nr_threads == 0)
      return false;             /* the caller runs it inline */
  }
  c->qnext = NULL;
  *tail = c;
  tail = &c->qnext;
  nr_queued++;
  pthread_cond_signal (&cond);
  return true;
}

void
localpool_stop (void)
{
  unsigned n;

  pthread_mutex_lock (&lock);
  stopping = true;
  n = nr_threads;
  pthread_cond_broadcast (&cond);
  pthread_mutex_unlock (&lock);
  for (unsigned i = 0; i < n; i++)
    pthread_join (threads[i], NULL);
  pthread_mutex_lock (&lock);
  nr_threads = 0;
  stopping = false;
  pthread_mutex_unlock (&lock);
}

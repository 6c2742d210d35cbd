/* SPDX-License-Identifier: BSD-3-Clause */
/* multipathd's part of the multipath target, engine-wide: two threads
 * over every multipath target that has been resumed.
 *
 *   mapper-mpathw (the watchdog), every WATCH_NS: a path with requests
 *     in flight that has completed nothing for the table's path timeout
 *     is failed, and its requests are given up on it (backend_abandon:
 *     they complete with EIO once nothing can write into their buffers,
 *     and the target reissues them elsewhere), unless it is the last
 *     active path of a device that does not queue (mpath_fail_silent_path:
 *     there is nowhere to reissue them).  Also no_path_retry: no
 *     path for N checker intervals stops the queueing.  It never waits
 *     for I/O.
 *   mapper-mpathc (the path checker), every table's checker interval:
 *     reads a block of each path that failed by itself (not by
 *     fail_path) and reinstates it when it answers.  A probe of a dead
 *     path is given up by the watchdog after the path timeout, so one
 *     dead path never holds the others' probes for remote-timeout.
 *
 * Both start at the first multipath target's preresume after
 * engine_start (or at engine_start, for targets resumed before it), and
 * stop at engine_stop (within a tick).  A failure to start them refuses
 * that resume, or engine_start: no multipath runs without its watchdog.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "target.h"
#include "util.h"
#include "multipath.h"

#define WATCH_NS (20 * 1000000ULL)
#define CHECK_TICK_NS (50 * 1000000ULL)

static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t list_cond = PTHREAD_COND_INITIALIZER;
static struct mpath *list;
static bool engine_running, threads_running;
static bool checker_running;    /* the watchdog outlives the checker */
/* The checker could not start: the watchdog just started stops, and is
 * joined without list_lock.  Meanwhile the threads neither run nor may
 * start (start_threads_locked refuses), and engine_running is left to
 * engine_stop.
 */
static bool watch_abort;
static pthread_t watch_thread, check_thread;

/* list_lock held: sleep for ns (or until stopped). */
static void
tick (uint64_t ns)
{
  uint64_t until = monotonic_ns () + ns;
  struct timespec ts = { until / 1000000000, until % 1000000000 };

  pthread_cond_clockwait (&list_cond, &list_lock, CLOCK_MONOTONIC, &ts);
}

static void
watch_path (struct mpath *m, struct mpath_path *p, uint64_t now)
{
  uint64_t last, done;
  char why[64];

  if (atomic_load (&p->inflight) == 0) {
    p->busy_seen_ns = 0;
    return;
  }
  /* Silence is timed here, not by the requests (they read no clock):
   * from when this thread first saw the path busy, or last saw its
   * completions move, whichever is later; late by one tick at most.
   */
  done = atomic_load_explicit (&p->completions, memory_order_relaxed);
  if (p->busy_seen_ns == 0) {
    p->busy_seen_ns = now;
    p->progress_ns = now;
  }
  else if (done != p->seen_completions)
    p->progress_ns = now;
  p->seen_completions = done;
  last = p->progress_ns;
  if (last >= now || now - last < m->path_timeout_ns ||
      p->abandoned_mark == last)
    return;
  snprintf (why, sizeof why, "no reply for %" PRIu64 " ms",
            (now - last) / 1000000);
  /* nbdkit stopping (its quit pipe, which this thread sees): the last
   * path too, or its requests would hold the stop for remote-timeout.
   */
  if (mapper_request_abandoned && mapper_request_abandoned () < 0)
    mpath_fail_path (m, p, false, why);
  else if (!mpath_fail_silent_path (m, p, why)) {
    /* The last path, not queueing: left as it is, and looked at again
     * every tick (another path may come back, or queueing be turned on);
     * logged once per silence.
     */
    if (p->kept_mark != last && mapper_log)
      mapper_log ("multipath %s: path %s: %s, but it is the last active "
                  "path and the device does not queue: not failed, its "
                  "requests wait (remote-timeout)",
                  target_origin (m->ti), backend_name (p->be), why);
    p->kept_mark = last;
    return;
  }
  p->abandoned_mark = last;
  if (!backend_abandon (p->be, m) && mapper_debug)
    mapper_debug ("multipath %s: path %s: its requests cannot be given up "
                  "(%s); they complete where they are",
                  target_origin (m->ti), backend_name (p->be), why);
}

static void
watch (struct mpath *m, uint64_t now)
{
  bool stop = false;

  for (unsigned i = 0; i < m->nr_paths; i++)
    watch_path (m, &m->paths[i], now);
  /* no_path_retry: multipathd counts checker runs with no path. */
  pthread_mutex_lock (&m->lock);
  if (m->no_path_retry >= 0 && atomic_load (&m->nr_valid) == 0 &&
      !m->exhausted && m->queue_if_no_path && m->msg_queueing == 0 &&
      now - m->nopath_since_ns >= m->no_path_retry * m->checker_ns) {
    m->exhausted = true;
    mpath_update_queueing (m);
    stop = true;
  }
  pthread_mutex_unlock (&m->lock);
  if (stop)
    target_event (m->ti, "no path for %ld checker intervals "
                  "(no_path_retry): failing queued I/O", m->no_path_retry);
}

static void *
watch_worker (void *arg)
{
  pthread_mutex_lock (&list_lock);
  /* Until the checker has stopped: it may be in a probe to give up. */
  while ((engine_running && !watch_abort) || checker_running) {
    uint64_t now;

    tick (WATCH_NS);
    now = monotonic_ns ();
    for (struct mpath *m = list; m; m = m->next)
      watch (m, now);
  }
  pthread_mutex_unlock (&list_lock);
  return NULL;
}

/* The paths of m due for a probe, probed without the list's lock (m is
 * held by users).
 */
static void
check (struct mpath *m)
{
  for (unsigned i = 0; i < m->nr_paths && engine_running; i++) {
    struct mpath_path *p = &m->paths[i];
    uint64_t now = monotonic_ns ();

    if (!atomic_load (&m->live) || atomic_load (&p->active) ||
        atomic_load (&p->admin_failed) || now < p->next_check_ns)
      continue;
    p->next_check_ns = now + m->checker_ns;
    m->users++;
    pthread_mutex_unlock (&list_lock);
    if (mpath_probe (m, p) == 0)
      mpath_reinstate_path (m, p, true);
    else if (mapper_debug)
      mapper_debug ("multipath %s: path %s: the checker's probe failed",
                    target_origin (m->ti), backend_name (p->be));
    pthread_mutex_lock (&list_lock);
    m->users--;
    pthread_cond_broadcast (&list_cond);
  }
}

static void *
check_worker (void *arg)
{
  pthread_mutex_lock (&list_lock);
  while (engine_running) {
    tick (CHECK_TICK_NS);
    for (struct mpath *m = list; m && engine_running; m = m->next)
      check (m);
  }
  checker_running = false;
  pthread_cond_broadcast (&list_cond);
  pthread_mutex_unlock (&list_lock);
  return NULL;
}

/* list_lock held: start the threads if the engine runs and they do
 * not; 0 or -errno (neither then runs).
 */
static int
start_threads_locked (void)
{
  int e;

  /* Another start failed and is joining its watchdog: these threads
   * cannot be had now either (and a resume that took 0 here would run
   * without them).
   */
  if (watch_abort)
    return -EAGAIN;
  if (threads_running || !engine_running)
    return 0;
  if ((e = mapper_thread_create (&watch_thread, watch_worker,
                                 "mapper-mpathw")) != 0)
    return -e;
  checker_running = true;
  if ((e = mapper_thread_create (&check_thread, check_worker,
                                 "mapper-mpathc")) != 0) {
    checker_running = false;
    watch_abort = true;
    pthread_cond_broadcast (&list_cond);
    pthread_mutex_unlock (&list_lock);
    pthread_join (watch_thread, NULL);
    pthread_mutex_lock (&list_lock);
    watch_abort = false;
    return -e;
  }
  threads_running = true;
  return 0;
}

/* list_lock held: start_threads_locked, saying why it failed. */
static int
start_threads_err (struct mapper_err *err)
{
  int r = start_threads_locked ();

  if (r < 0)
    mapper_err_set (err, "cannot start the path checker and watchdog "
                    "threads: %s", mapper_strerror (-r));
  return r;
}

int
mpath_threads_ensure (struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&list_lock);

  return start_threads_err (err);
}

void
mpath_register (struct mpath *m)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&list_lock);

  /* The threads run (preresume, engine_start) or start at engine_start. */
  if (!m->registered) {
    m->registered = true;
    m->next = list;
    list = m;
  }
}

void
mpath_unregister (struct mpath *m)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&list_lock);

  if (!m->registered)
    return;
  /* The watchdog goes on watching m while the checker's probe of it
   * finishes (or is given up).
   */
  while (m->users)
    pthread_cond_wait (&list_cond, &list_lock);
  for (struct mpath **pp = &list; *pp; pp = &(*pp)->next)
    if (*pp == m) {
      *pp = m->next;
      break;
    }
  m->registered = false;
}

int
mpath_threads_start (struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&list_lock);
  int r;

  engine_running = true;
  /* None resumed yet: the first one's preresume starts them. */
  if (list == NULL)
    return 0;
  if ((r = start_threads_err (err)) < 0)
    mapper_err_prefix (err, "multipath");
  return r;
}

void
mpath_threads_stop (void)
{
  bool join;

  pthread_mutex_lock (&list_lock);
  engine_running = false;
  pthread_cond_broadcast (&list_cond);
  join = threads_running;
  threads_running = false;
  pthread_mutex_unlock (&list_lock);
  if (join) {
    /* The checker first: the watchdog gives its probe up if need be. */
    pthread_join (check_thread, NULL);
    pthread_join (watch_thread, NULL);
  }
}

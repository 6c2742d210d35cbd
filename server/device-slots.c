/* SPDX-License-Identifier: BSD-3-Clause */
/* A device's table slots (dm's live and inactive tables) and the request
 * gate in front of the live one: load fills the inactive slot, suspend
 * closes the gate and drains the requests in flight, resume swaps the
 * slots and opens the gate again, replace does all three with the device
 * suspended only for the drain.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

/* --- the request gate ------------------------------------------------ */

/* dev's wait conditions (dev->lock held), made by the first wait that
 * needs them; NULL if out of memory.  Wakers look under the same lock:
 * none, nobody waits.
 */
static struct device_waits *
waits_locked (struct device *dev)
{
  struct device_waits *w = dev->waits;

  if (w == NULL && (w = malloc (sizeof *w)) != NULL) {
    pthread_cond_init (&w->gate, NULL);   /* clockwait: CLOCK_MONOTONIC */
    pthread_cond_init (&w->drain, NULL);
    w->busy_what = NULL;
    dev->waits = w;
  }
  return w;
}

struct table *
device_enter (struct device *dev)
{
  uint64_t asked = 0;

  for (;;) {
    /* Count first, then look: a suspender sets suspended first, then
     * waits for the count.  Sequentially consistent, so one of the two
     * always sees the other.
     */
    atomic_fetch_add (&dev->inflight, 1);
    if (!atomic_load (&dev->suspended))
      return dev->live;
    device_exit (dev);

    /* Held until resume, which may never come: a request whose client
     * has gone, or on a server that is stopping, is given up instead
     * (and one that cannot wait for want of memory).
     */
    pthread_mutex_lock (&dev->lock);
    while (atomic_load (&dev->suspended)) {
      struct device_waits *w = waits_locked (dev);

      if (w == NULL || request_wait (&w->gate, &dev->lock, 0, &asked) < 0) {
        pthread_mutex_unlock (&dev->lock);
        return NULL;
      }
    }
    pthread_mutex_unlock (&dev->lock);
  }
}

void
device_exit (struct device *dev)
{
  if (atomic_fetch_sub (&dev->inflight, 1) == 1 &&
      atomic_load (&dev->suspended)) {
    /* The last one out wakes a waiting suspender (and only it: the
     * requests held at the gate wait for a resume).
     */
    pthread_mutex_lock (&dev->lock);
    if (dev->waits)
      pthread_cond_broadcast (&dev->waits->drain);
    pthread_mutex_unlock (&dev->lock);
  }
}

/* The outer lock this thread holds around a swap (the control export's,
 * device_set_drain_unlock): NULL, none.
 */
static __thread void (*drain_unlock) (bool relock);

void
device_set_drain_unlock (void (*fn) (bool relock))
{
  drain_unlock = fn;
}

/* --- waits without the locks ----------------------------------------- */

/* dev->lock held: release it and the outer lock (drain_unlock) for a
 * wait that I/O held below dev may hold up (a device it stacks on,
 * suspended, whose resume needs the outer lock).  Meanwhile dev is busy
 * (draining, busy_what says why): what would change it is refused, so
 * the caller finds it as it left it.  *was: draining before.
 */
struct busy_save { bool draining; const char *what; };

static void
wait_unlock (struct device *dev, const char *what, struct busy_save *was)
{
  struct device_waits *w = waits_locked (dev);

  /* Without memory for w, a refusal meanwhile says less (busy_what). */
  *was = (struct busy_save) { dev->draining, w ? w->busy_what : NULL };
  dev->draining = true;
  if (w)
    w->busy_what = what;
  pthread_mutex_unlock (&dev->lock);
  if (drain_unlock)
    drain_unlock (false);
}

/* Take them back, in the lock order (outer, then dev->lock). */
static void
wait_relock (struct device *dev, const struct busy_save *was)
{
  if (drain_unlock)
    drain_unlock (true);
  pthread_mutex_lock (&dev->lock);
  dev->draining = was->draining;
  if (dev->waits)
    dev->waits->busy_what = was->what;
}

/* The device whose postsuspend, resume or message hook runs on this
 * thread, dev->lock held (device_hook_enter), and a target's wait in it
 * (target_wait_begin).
 */
static __thread struct device *hook_dev;
static __thread const char *hook_what;
static __thread bool hook_unlocked;
static __thread struct busy_save hook_was;

void
device_hook_enter (struct device *dev, const char *what,
                   struct device_hook *saved)
{
  *saved = (struct device_hook) {
    .dev = hook_dev, .what = hook_what, .unlocked = hook_unlocked,
    .was_draining = hook_was.draining, .was_what = hook_was.what,
  };
  hook_dev = dev;
  hook_what = what;
  hook_unlocked = false;
}

void
device_hook_leave (const struct device_hook *saved)
{
  /* A target that began a wait and did not end it. */
  if (hook_unlocked)
    target_wait_end (NULL);
  hook_dev = saved->dev;
  hook_what = saved->what;
  hook_unlocked = saved->unlocked;
  hook_was = (struct busy_save) { saved->was_draining, saved->was_what };
}

void
target_wait_begin (struct target *ti)
{
  (void) ti;
  if (hook_dev == NULL || hook_unlocked)
    return;
  hook_unlocked = true;
  wait_unlock (hook_dev, hook_what, &hook_was);
}

void
target_wait_end (struct target *ti)
{
  (void) ti;
  if (!hook_unlocked)
    return;
  hook_unlocked = false;
  wait_relock (hook_dev, &hook_was);
}

/* Let requests in again on the live table (dev->lock held). */
static void
unsuspend_locked (struct device *dev)
{
  struct device_hook h;

  if (dev->live)
    atomic_store (&dev->live->noflush_suspending, false);
  device_hook_enter (dev, "resume", &h);
  table_resume (dev->live);     /* background work (mirror resync) */
  device_hook_leave (&h);
  atomic_store (&dev->suspended, false);
  if (dev->waits)
    pthread_cond_broadcast (&dev->waits->gate);
}

/* Wait for the requests in flight (dev->lock held, dev->draining set).
 * One of them may wait for another device's resume (a device stacked on
 * a suspended one holds it at that device's gate), and that resume
 * needs the caller's outer lock: the wait is made without it.  What
 * would change dev meanwhile is refused (dev->draining); the lock order
 * (outer lock, then dev->lock) is kept by taking the outer one back
 * with dev->lock released.
 */
/* One wait for the drain (dev->lock held): on waits->drain, or a short
 * sleep if there is no memory for it.
 */
static void
drain_wait (struct device *dev)
{
  struct device_waits *w = waits_locked (dev);

  if (w) {
    pthread_cond_wait (&w->drain, &dev->lock);
    return;
  }
  pthread_mutex_unlock (&dev->lock);
  nanosleep (&(struct timespec) { .tv_nsec = 1000000 }, NULL);
  pthread_mutex_lock (&dev->lock);
}

static void
drain_locked (struct device *dev)
{
  while (atomic_load (&dev->inflight) != 0) {
    if (drain_unlock == NULL) {
      drain_wait (dev);
      continue;
    }
    pthread_mutex_unlock (&dev->lock);
    drain_unlock (false);
    pthread_mutex_lock (&dev->lock);
    while (atomic_load (&dev->inflight) != 0)
      drain_wait (dev);
    pthread_mutex_unlock (&dev->lock);
    drain_unlock (true);
    pthread_mutex_lock (&dev->lock);
  }
}

/* Stop admitting requests and wait for those in flight, then (unless
 * noflush) make what they wrote durable.  A failed flush fails the
 * suspend and leaves the device as it was, running (dm's
 * __dm_suspend): a suspended device is one whose writes are known
 * durable.  Called with dev->lock held.
 */
static int
suspend_locked (struct device *dev, bool noflush)
{
  int r;

  if (atomic_load (&dev->suspended))
    return 0;
  atomic_store (&dev->suspended, true);
  /* Targets holding I/O back (delay) let it go now, so the drain below
   * does not wait for it; with noflush, I/O a target keeps queued
   * (multipath) goes back to the gate (MAPPER_EREQUEUE).
   */
  if (dev->live) {
    atomic_store (&dev->live->noflush_suspending, noflush);
    table_presuspend (dev->live);
  }
  dev->draining = true;
  drain_locked (dev);
  /* Background work (mirror resync) stops too: nothing writes the
   * table's backends until resume.  Still draining: a target's wait
   * there (a thin pool's for its writes to the data device) may be made
   * without the locks (target_wait_begin).
   */
  if (dev->live) {
    struct device_hook h;

    device_hook_enter (dev, "suspend (or swap)", &h);
    table_postsuspend (dev->live);
    device_hook_leave (&h);
  }
  if (noflush || dev->live == NULL) {
    dev->draining = false;
    return 0;
  }
  /* The flush too: a backend stacked on a suspended device holds it at
   * that device's gate until its resume.
   */
  {
    struct busy_save was;

    wait_unlock (dev, "suspend (or swap)", &was);
    r = io_flush_backends (dev->live->flushed.ptr, dev->live->flushed.len);
    if (r == 0)
      r = table_flush_paths (dev->live);  /* multipath's paths */
    wait_relock (dev, &was);
  }
  dev->draining = false;
  if (r < 0)
    unsuspend_locked (dev);
  return r;
}

/* Another suspend, resume or replace of dev waits for its requests in
 * flight (dev->lock held): -EBUSY and err says so.  The control export
 * runs suspend without its lock (a drain may wait for a lower device's
 * resume): what it would otherwise serialise is refused here.
 */
int
device_busy_locked (struct device *dev, struct mapper_err *err)
{
  const char *what = dev->waits ? dev->waits->busy_what : NULL;

  if (!dev->draining)
    return 0;
  if (err && what)
    mapper_err_set (err, "device '%s' is busy: its %s is waiting for I/O "
                    "held below it (a suspended or stalled device it "
                    "stacks on): retry once it is done", dev->name, what);
  else if (err)
    mapper_err_set (err, "device '%s': a suspend (or a swap) is waiting for "
                    "its %u request%s in flight: retry once it is done",
                    dev->name, atomic_load (&dev->inflight),
                    atomic_load (&dev->inflight) == 1 ? "" : "s");
  return -EBUSY;
}

int
device_suspend (struct device *dev, bool noflush)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->lock);
  int r = device_busy_locked (dev, NULL);

  return r < 0 ? r : suspend_locked (dev, noflush);
}

int
device_check_busy (struct device *dev, struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->lock);
  return device_busy_locked (dev, err);
}

/* --- the slots: load, resume, clear, replace ------------------------- */

int
device_check_resume (struct device *dev, struct mapper_err *err)
{
  struct table *t;

  /* The inactive slot changes only by control commands, which the
   * caller serialises: it stays what is checked here.
   */
  pthread_mutex_lock (&dev->lock);
  t = dev->inactive;
  pthread_mutex_unlock (&dev->lock);
  return t ? device_check_new_live (dev, t, err) : 0;
}

int
device_load (struct device *dev, struct table *t)
{
  struct table *old;

  /* Callers check first for the message; never build a cycle. */
  if (device_check_table (dev, t, NULL) < 0) {
    table_free (t);
    return -ELOOP;
  }

  pthread_mutex_lock (&dev->lock);
  old = dev->inactive;
  dev->inactive = t;
  pthread_mutex_unlock (&dev->lock);
  table_free (old);
  return 0;
}

/* The swap, under dev->lock: dev->live has just replaced old.  The
 * targets' events now reach dev from the live table only, and the swap
 * is an event itself.  sw was prepared for dev->live before the drain;
 * stats_swap_done follows once the gate is open.
 */
static void
live_swapped (struct device *dev, struct table *old, struct stats_swap *sw)
{
  table_bind (old, NULL);
  table_bind (dev->live, dev);
  stats_swap (dev, sw);
  device_event (dev);
}

/* The backends of old that new does not use: only their data needs an
 * explicit flush at a swap.  Shared ones stay covered by the clients'
 * own flushes, which go to the new table's backends (backends are
 * shared objects, so pointer equality is identity).
 */
static int
dropped_backends (const struct table *old, const struct table *new,
                  backend_vector *out)
{
  if (old == NULL)
    return 0;
  for (size_t i = 0; i < old->flushed.len; i++) {
    bool kept = false;
    for (size_t j = 0; j < new->flushed.len && !kept; j++)
      kept = old->flushed.ptr[i] == new->flushed.ptr[j];
    if (!kept && backend_vector_append (out, old->flushed.ptr[i]) == -1)
      return -ENOMEM;
  }
  return 0;
}

/* After a swap: make what the old table wrote to the backends the new
 * one no longer uses durable (the old table still holds them), since no
 * client flush reaches them any more.  Errors on them that the clients
 * would have been told of at their next flush stay the device's to tell
 * (device_flush_errseq).  0, or -errno with err filled: the swap stands.
 */
static int
flush_dropped (struct device *dev, backend_vector *dropped,
               struct table *old, struct mapper_err *err)
{
  int r = 0;

  if (dropped->len)
    r = io_flush_backends (dropped->ptr, dropped->len);
  /* The old table's paths (multipath), by their targets' own rule: the
   * new table may not flush them, or not for what the old one wrote.
   * Clean paths cost nothing.
   */
  if (r == 0 && old)
    r = table_flush_paths (old);
  for (size_t i = 0; i < dropped->len; i++)
    errseq_note_dropped (&dev->dropped_err, dropped->ptr[i]);
  backend_vector_reset (dropped);
  if (r < 0)
    mapper_err_set (err, "device '%s': the new table is live, but "
                    "flushing the backends it no longer uses failed: %s: "
                    "writes made to them through the old table may be lost",
                    dev->name, mapper_strerror (-r));
  return r;
}

int
device_resume_swapped (struct device *dev, bool *swapped,
                       struct mapper_err *err)
{
  backend_vector dropped = empty_vector;
  struct table *old = NULL;
  struct stats_swap sw;
  int r;

  if (swapped)
    *swapped = false;
  if ((r = device_check_resume (dev, err)) < 0)
    return r;

  pthread_mutex_lock (&dev->lock);
  if ((r = device_busy_locked (dev, err)) < 0) {
    pthread_mutex_unlock (&dev->lock);
    return r;
  }
  /* The table about to run may refuse (dm's preresume: a crypt key
   * wiped): the device then stays as it is, suspended or not.
   */
  if ((dev->inactive || dev->live) &&
      (r = table_preresume (dev->inactive ? dev->inactive : dev->live,
                            err)) < 0) {
    pthread_mutex_unlock (&dev->lock);
    mapper_err_prefix (err, "device '%s'", dev->name);
    return r;
  }
  stats_swap_prepare (&sw, dev->inactive);
  if (dev->inactive) {
    if (dropped_backends (dev->live, dev->inactive, &dropped) < 0) {
      pthread_mutex_unlock (&dev->lock);
      stats_swap_done (dev, &sw);
      backend_vector_reset (&dropped);
      mapper_err_set (err, "out of memory");
      return -ENOMEM;
    }
    /* Swap only with nothing in flight and what the live table wrote
     * durable: if that flush fails, the device carries on as it was and
     * the new table stays inactive (dm's do_resume).
     */
    if ((r = suspend_locked (dev, false)) < 0) {
      pthread_mutex_unlock (&dev->lock);
      stats_swap_done (dev, &sw);
      backend_vector_reset (&dropped);
      mapper_err_set (err, "device '%s': flush before the swap failed: %s: "
                      "the live table stays, the new one inactive",
                      dev->name, mapper_strerror (-r));
      return r;
    }
    old = dev->live;
    dev->live = dev->inactive;
    dev->inactive = NULL;
    live_swapped (dev, old, &sw);
    if (swapped)
      *swapped = true;
  }
  if (dev->live == NULL) {
    pthread_mutex_unlock (&dev->lock);
    stats_swap_done (dev, &sw);
    mapper_err_set (err, "device '%s' has no table to resume", dev->name);
    return -ENXIO;
  }
  unsuspend_locked (dev);
  stats_swap_done (dev, &sw);
  pthread_mutex_unlock (&dev->lock);
  r = flush_dropped (dev, &dropped, old, err);
  table_free (old);
  return r;
}

int
device_resume (struct device *dev, struct mapper_err *err)
{
  return device_resume_swapped (dev, NULL, err);
}

void
device_clear (struct device *dev)
{
  struct table *old;

  pthread_mutex_lock (&dev->lock);
  old = dev->inactive;
  dev->inactive = NULL;
  pthread_mutex_unlock (&dev->lock);
  table_free (old);
}

int
device_replace (struct device *dev, struct table *t, bool *swapped,
                struct mapper_err *err)
{
  struct table *old_live, *old_inactive;
  backend_vector dropped = empty_vector;
  struct stats_swap sw;
  uint64_t t0, t1;
  int r;

  if (swapped)
    *swapped = false;
  if ((r = device_check_new_live (dev, t, err)) < 0 ||
      (r = table_preresume (t, err)) < 0) {
    table_free (t);
    return r;
  }
  pthread_mutex_lock (&dev->lock);
  if ((r = device_busy_locked (dev, err)) < 0) {
    pthread_mutex_unlock (&dev->lock);
    table_free (t);
    return r;
  }
  if ((r = dropped_backends (dev->live, t, &dropped)) < 0) {
    pthread_mutex_unlock (&dev->lock);
    mapper_err_set (err, "out of memory");
    table_free (t);
    return r;
  }
  /* Make what is written to the dropped backends so far durable before
   * the window, so the flush that must follow the swap has little left
   * to do; if it fails, nothing changes.
   */
  if (dropped.len && !atomic_load (&dev->suspended)) {
    r = io_flush_backends (dropped.ptr, dropped.len);
    if (r < 0) {
      pthread_mutex_unlock (&dev->lock);
      mapper_err_set (err, "device '%s': flush before the swap failed: %s",
                      dev->name, mapper_strerror (-r));
      backend_vector_reset (&dropped);
      table_free (t);
      return r;
    }
  }
  /* Suspended only for the drain and the swap: what can be made or
   * summed outside the window is (stats_swap_prepare, stats_swap_done).
   */
  stats_swap_prepare (&sw, t);
  t0 = monotonic_ns ();
  suspend_locked (dev, true);   /* noflush: cannot fail */
  old_live = dev->live;
  old_inactive = dev->inactive;
  dev->live = t;
  dev->inactive = NULL;
  live_swapped (dev, old_live, &sw);
  if (swapped)
    *swapped = true;
  unsuspend_locked (dev);
  t1 = monotonic_ns ();
  stats_swap_done (dev, &sw);
  pthread_mutex_unlock (&dev->lock);
  /* Writes that went to backends the new table no longer uses are
   * durable before replace returns, or replace says they may not be.
   */
  r = flush_dropped (dev, &dropped, old_live, err);
  table_free (old_live);
  table_free (old_inactive);
  /* The suspended window, for bench/bench-reload (nbdkit -v). */
  if (mapper_debug)
    mapper_debug ("device %s: replace: suspended for %" PRIu64 " ns",
                  dev->name, t1 - t0);
  return r;
}

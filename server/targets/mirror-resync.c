/* SPDX-License-Identifier: BSD-3-Clause */
/* The mirror target's resync (mirror.h): one engine-wide worker thread
 * copying out-of-sync regions from leg 0 to the other legs while their
 * tables are live, and the fence that keeps writes off the region being
 * copied.  dm-raid1 gives this to dm-region-hash and dm-kcopyd.
 *
 * With "sync" (or no sync argument, as dm's core log) every region
 * starts out of sync and the worker copies leg 0 to the other legs
 * region by region, round robin between mirrors, backing off when
 * foreground I/O is seen.  The one region being copied is fenced off
 * from writes by two per-epoch writer counters (mirror_write_enter), so
 * once resync is over the write path touches no shared counter at all.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "target.h"
#include "util.h"
#include "mirror.h"

#define COPY_CHUNK (1024 * 1024)   /* resync I/O size */
#define THROTTLE_NS (20 * 1000 * 1000)  /* pause after a busy region */

/* --- the engine-wide worker --------------------------------------------- */

/* One thread for every mirror of every device, running only while some
 * live mirror has regions to copy (and the engine is started: nbdkit may
 * fork after tables are loaded).  resync_lock protects everything here
 * and each mirror's live/queued/next/next_region.
 */
static pthread_mutex_t resync_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t resync_cond = PTHREAD_COND_INITIALIZER;
static struct mirror *resync_list;      /* FIFO, head copied next */
static struct mirror *resync_current;   /* being copied (lock dropped) */
static struct mirror *live_logs;        /* live mirrors with a disk log */
static bool engine_running;
static bool worker_running;             /* thread exists, not yet joined */
static bool worker_exiting;             /* it has left its loop */
static pthread_t worker_thread;

static void *resync_worker (void *arg);

/* Start (or restart) the worker if there is work; resync_lock held. */
static int
kick_worker_locked (void)
{
  int e;

  if (!engine_running || resync_list == NULL)
    return 0;
  if (worker_running && !worker_exiting) {
    pthread_cond_broadcast (&resync_cond);
    return 0;
  }
  if (worker_running) {
    /* It is on its way out and needs no lock to finish. */
    pthread_join (worker_thread, NULL);
    worker_running = false;
  }
  e = mapper_thread_create (&worker_thread, resync_worker, "mapper-resync");
  if (e != 0)
    return -e;
  worker_running = true;
  worker_exiting = false;
  return 0;
}

static void
enqueue_locked (struct mirror *m)
{
  struct mirror **p;

  if (m->queued || !m->live || atomic_load (&m->all_in_sync) ||
      atomic_load (&m->resync_failed))
    return;
  for (p = &resync_list; *p; p = &(*p)->next)
    ;
  m->next = NULL;
  *p = m;
  m->queued = true;
}

static void
dequeue_locked (struct mirror *m)
{
  struct mirror **p;

  if (!m->queued)
    return;
  for (p = &resync_list; *p != m; p = &(*p)->next)
    ;
  *p = m->next;
  m->queued = false;
}

int
mirror_resync_start (struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&resync_lock);
  int r;

  engine_running = true;
  r = kick_worker_locked ();
  if (r < 0)
    mapper_err_set (err, "mirror: cannot start the resync thread: %s",
                    strerror (-r));
  return r;
}

void
mirror_resync_stop (void)
{
  bool join;

  pthread_mutex_lock (&resync_lock);
  engine_running = false;
  pthread_cond_broadcast (&resync_cond);
  join = worker_running;
  worker_running = false;
  pthread_mutex_unlock (&resync_lock);
  if (join)
    pthread_join (worker_thread, NULL);
  /* A clean stop: the live disk logs' last pass (as at a suspend), while
   * the I/O loop still runs for remote legs and logs.  No client is
   * left to write.
   */
  pthread_mutex_lock (&resync_lock);
  for (struct mirror *m = live_logs; m; m = m->live_next)
    mirror_log_clean_all (m);
  pthread_mutex_unlock (&resync_lock);
}

static void
sleep_ns (long ns)
{
  struct timespec ts = { .tv_sec = 0, .tv_nsec = ns };
  nanosleep (&ts, NULL);
}

static uint64_t
now_ns (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

/* --- holes -------------------------------------------------------------- */

/* The source leg's extents of a chunk, in target coordinates: where it
 * reads as zeroes the copy writes none (dm copies everything; here a
 * sparse source leaves the other legs sparse).
 */
struct extent {
  uint64_t off, len;
  bool zero;
};
struct extent_list {
  struct extent *e;
  size_t n, alloc;
  uint64_t base;                /* backend offset of target offset 0 */
  uint64_t end;                 /* backend coordinates: covered so far */
};

static int
collect_extent (void *opaque, uint64_t offset, uint64_t length, uint32_t type)
{
  struct extent_list *l = opaque;
  bool zero = (type & MAPPER_EXTENT_ZERO) != 0;

  if (offset != l->end || length == 0)
    return -1;                  /* not contiguous: stop, copy the rest */
  /* end moves only with the list: what is not in it is copied. */
  if (l->n && l->e[l->n - 1].zero == zero) {
    l->e[l->n - 1].len += length;
    l->end = offset + length;
    return 0;
  }
  if (l->n == l->alloc) {
    size_t a = l->alloc ? 2 * l->alloc : 16;
    struct extent *p = realloc (l->e, a * sizeof *p);
    if (p == NULL)
      return -1;
    l->e = p, l->alloc = a;
  }
  l->e[l->n++] = (struct extent) { offset - l->base, length, zero };
  l->end = offset + length;
  return 0;
}

/* Does leg i read as zeroes over target bytes [off, off+len)? */
static bool
leg_reads_zero (struct mirror *m, unsigned i, uint64_t off, uint64_t len)
{
  struct extent_list l = { .base = m->legs[i].start,
                           .end = m->legs[i].start + off };
  bool zero;

  if (!backend_caps (m->legs[i].be)->can_extents)
    return false;
  backend_extents (m->legs[i].be, l.end, len, false, collect_extent, &l);
  zero = l.end >= m->legs[i].start + off + len && l.n == 1 && l.e[0].zero;
  free (l.e);
  return zero;
}

static bool
leg_takes_sync (struct mirror *m, unsigned i)
{
  return !(atomic_load (&m->legs[i].errors) &
           (LEG_WRITE_ERR | LEG_SYNC_ERR | LEG_FLUSH_ERR));
}

/* Copy target bytes [off, off+n) (n <= COPY_CHUNK) from leg 0 to the
 * other healthy legs.  Where leg 0 reads as zeroes nothing is read: a
 * leg that reads as zeroes there too is left alone, another gets a zero
 * request that may trim (a file leg gets a hole).  0 or -errno (leg 0
 * failed, or -ESHUTDOWN).
 */
static int
copy_chunk (struct mirror *m, char *buf, uint64_t off, uint64_t n)
{
  struct extent_list l = { .base = m->legs[0].start,
                           .end = m->legs[0].start + off };
  struct extent whole = { off, n, false };
  struct extent *e = &whole;
  size_t ne = 1;
  int r = 0;

  if (backend_caps (m->legs[0].be)->can_extents) {
    backend_extents (m->legs[0].be, l.end, n, false, collect_extent, &l);
    /* What it did not answer is copied. */
    if (l.end < m->legs[0].start + off + n)
      collect_extent (&l, l.end, m->legs[0].start + off + n - l.end, 0);
    if (l.end >= m->legs[0].start + off + n)
      e = l.e, ne = l.n;
  }
  for (size_t k = 0; k < ne && r == 0; k++) {
    uint64_t eo = e[k].off, el = MIN (e[k].len, off + n - eo);

    if (e[k].zero) {
      atomic_fetch_add (&m->bytes_skipped, el);
      for (unsigned i = 1; i < m->nr_legs; i++) {
        int w;
        if (!leg_takes_sync (m, i) || leg_reads_zero (m, i, eo, el))
          continue;
        w = io_sync (IO_ZERO, m->legs[i].be, m->legs[i].start + eo, el,
                     NULL, MAPPER_MAY_TRIM);
        if (w == -ESHUTDOWN)
          r = w;
        else if (w < 0)
          mirror_mark_leg (m, i, LEG_SYNC_ERR, "failed a resync write");
      }
      continue;
    }
    r = io_sync (IO_READ, m->legs[0].be, m->legs[0].start + eo, el, buf, 0);
    if (r < 0) {
      if (r != -ESHUTDOWN)
        mirror_mark_leg (m, 0, LEG_READ_ERR, "failed a resync read");
      break;
    }
    /* Each leg its own request, so a failing leg is known by name. */
    for (unsigned i = 1; i < m->nr_legs; i++) {
      int w;
      if (!leg_takes_sync (m, i))
        continue;
      w = io_sync (IO_WRITE, m->legs[i].be, m->legs[i].start + eo, el, buf,
                   0);
      if (w == -ESHUTDOWN)
        r = w;                  /* not copied: not in sync */
      else if (w < 0)
        mirror_mark_leg (m, i, LEG_SYNC_ERR, "failed a resync write");
    }
  }
  free (l.e);
  return r;
}

/* Copy one region from leg 0 to the other healthy legs, with writes to it
 * fenced off.  0 or -errno (the source failed); -ESHUTDOWN: given up
 * because the server is stopping or the mirror is being suspended (a leg
 * on a suspended device holds the copy until then), which says nothing
 * about the legs.
 */
static int
copy_region (struct mirror *m, char *buf, uint64_t region)
{
  uint64_t start = region << m->region_shift;
  uint64_t end = MIN (start + m->region_size, m->len);
  uint64_t old;
  int r = 0;

  /* Fence: writers that counted themselves before the epoch flip are
   * waited for; those after it see recovering and wait for us.
   */
  atomic_store (&m->recovering, region);
  old = atomic_fetch_add (&m->epoch, 1) & 1;
  while (atomic_load (&m->writers[old]) != 0)
    sleep_ns (50 * 1000);

  for (uint64_t off = start; off < end && r == 0; off += COPY_CHUNK) {
    uint64_t n = MIN (COPY_CHUNK, end - off);

    if (atomic_load (&m->legs[0].errors)) {
      r = -EIO;
      break;
    }
    r = copy_chunk (m, buf, off, n);
  }

  if (r == 0) {
    atomic_fetch_add (&m->nr_copied, 1);
    atomic_fetch_or_explicit (&m->in_sync[region / 64], 1ULL << (region % 64),
                              memory_order_release);
    if (atomic_fetch_add (&m->nr_in_sync, 1) + 1 == m->nr_regions)
      atomic_store (&m->all_in_sync, true);
  }
  pthread_mutex_lock (&m->fence_lock);
  atomic_store (&m->recovering, NO_REGION);
  pthread_cond_broadcast (&m->fence_cond);
  pthread_mutex_unlock (&m->fence_lock);
  return r;
}

static void *
resync_worker (void *arg)
{
  char *buf = malloc (COPY_CHUNK);

  pthread_mutex_lock (&resync_lock);
  while (engine_running && resync_list && buf) {
    struct mirror *m = resync_list;
    uint64_t region, seen;
    int r;

    /* Next region out of sync, from where we left off. */
    for (region = m->next_region; region < m->nr_regions; region++)
      if (!region_in_sync (m, region))
        break;
    if (region == m->nr_regions) {
      dequeue_locked (m);
      continue;
    }
    m->next_region = region + 1;
    /* Round robin between mirrors, one region each. */
    dequeue_locked (m);
    resync_current = m;
    pthread_mutex_unlock (&resync_lock);

    seen = atomic_load (&m->fg_ios);
    request_wait_cancel = &m->stop_copy;
    r = copy_region (m, buf, region);
    /* Raised while resync_current is m: a swap waits for that
     * (postsuspend) before it unbinds the table, so they reach the
     * device the table is live on.  Each happens once: m is not queued
     * again after either.
     */
    if (r < 0 && r != -ESHUTDOWN) {
      atomic_store (&m->resync_failed, true);
      mirror_log_state (m, "resync stopped: the source leg failed");
      target_event (m->ti, "resync stopped: leg 0 %s (the source) failed, "
                    "%" PRIu64 "/%" PRIu64 " regions in sync",
                    backend_name (m->legs[0].be),
                    (uint64_t) atomic_load (&m->nr_in_sync), m->nr_regions);
    }
    else if (atomic_load (&m->all_in_sync)) {
      /* The disk log learns it before anyone is told. */
      mirror_log_clear_pass (m);
      mirror_log_state (m, "resync complete");
      target_event (m->ti, "resync complete, %" PRIu64 "/%" PRIu64
                    " regions in sync, %" PRIu64 " regions copied, %"
                    PRIu64 " bytes of holes skipped", m->nr_regions,
                    m->nr_regions,
                    (uint64_t) atomic_load (&m->nr_copied),
                    (uint64_t) atomic_load (&m->bytes_skipped));
    }
    else if (r == 0 && m->log && now_ns () - m->last_pass_ns >= 1000000000) {
      /* Progress survives a crash: at most a second of it is redone. */
      mirror_log_clear_pass (m);
      m->last_pass_ns = now_ns ();
    }
    /* The log passes above flush legs: given up as the copy is. */
    request_wait_cancel = NULL;
    /* Foreground I/O keeps priority: after a region that competed with
     * it, let it run alone for a while.
     */
    if (atomic_load (&m->fg_ios) != seen)
      sleep_ns (THROTTLE_NS);

    pthread_mutex_lock (&resync_lock);
    if (r == -ESHUTDOWN)
      m->next_region = region;  /* again, unless the engine stops first */
    resync_current = NULL;
    enqueue_locked (m);
    pthread_cond_broadcast (&resync_cond);
  }
  worker_exiting = true;
  pthread_cond_broadcast (&resync_cond);
  pthread_mutex_unlock (&resync_lock);
  free (buf);
  return NULL;
}

/* --- the write fence ---------------------------------------------------- */

void
mirror_fence_init (struct mirror *m)
{
  atomic_init (&m->recovering, NO_REGION);
  pthread_mutex_init (&m->fence_lock, NULL);
  pthread_cond_init (&m->fence_cond, NULL);
}

void
mirror_fence_destroy (struct mirror *m)
{
  pthread_cond_destroy (&m->fence_cond);
  pthread_mutex_destroy (&m->fence_lock);
}

/* Why it is safe (all seq_cst): a writer reads epoch E, counts itself in
 * writers[E&1], reads recovering, and reads epoch again.  If epoch is
 * still E, its count happened before the worker's next flip, so the
 * worker's wait on writers[E&1] that follows the flip includes it; if the
 * worker flipped before the writer's first read, the writer sees the
 * recovering region stored before that flip.
 */
unsigned
mirror_write_enter (struct mirror *m, uint64_t off, uint64_t len, unsigned n)
{
  uint64_t first = off >> m->region_shift;
  uint64_t last = (off + len - 1) >> m->region_shift;

  for (;;) {
    uint64_t e = atomic_load (&m->epoch), rec;

    atomic_fetch_add (&m->writers[e & 1], n);
    rec = atomic_load (&m->recovering);
    if (atomic_load (&m->epoch) == e &&
        (rec == NO_REGION || rec < first || rec > last))
      return e & 1;
    atomic_fetch_sub (&m->writers[e & 1], n);
    if (rec != NO_REGION && rec >= first && rec <= last) {
      pthread_mutex_lock (&m->fence_lock);
      while (atomic_load (&m->recovering) == rec)
        pthread_cond_wait (&m->fence_cond, &m->fence_lock);
      pthread_mutex_unlock (&m->fence_lock);
    }
  }
}

/* --- joining and leaving ------------------------------------------------ */

void
mirror_resync_resume (struct mirror *m)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&resync_lock);
  int r;

  if (!m->live && m->log) {
    m->live_next = live_logs;
    live_logs = m;
  }
  m->live = true;
  enqueue_locked (m);
  if ((r = kick_worker_locked ()) < 0 && mapper_debug)
    mapper_debug ("mirror %s: cannot start the resync thread: %s",
                  target_origin (m->ti), strerror (-r));
}

bool
mirror_resync_suspend (struct mirror *m)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&resync_lock);
  bool was_live = m->live;

  if (was_live && m->log) {
    struct mirror **p;
    for (p = &live_logs; *p != m; p = &(*p)->live_next)
      ;
    *p = m->live_next;
  }
  m->live = false;
  dequeue_locked (m);
  /* A copy held by a suspended device (a leg on mapper:NAME) would hold
   * this suspend, and the control commands behind it (that device's
   * resume too), until that device resumes: it gives up instead, and the
   * region stays out of sync.
   */
  atomic_store (&m->stop_copy, true);
  while (resync_current == m)
    pthread_cond_wait (&resync_cond, &resync_lock);
  atomic_store (&m->stop_copy, false);
  return was_live;
}

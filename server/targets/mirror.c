/* mirror core <#log_args> <region_size> [sync|nosync] <#legs>
 *        (<dev> <offset>){#legs} [<#features> handle_errors]
 *
 * dm-raid1 with the in-memory ("core") region log.  Writes go to every
 * leg in parallel from the client's buffer (one clone per leg, no copy).
 * Reads go to one in-sync leg, chosen by offset (1 MiB granules); a read
 * error is retried on another in-sync leg (the completion hook points the
 * clone there, the request's waiter resubmits it).  A leg that fails a
 * write is marked failed ('D'); with handle_errors the device keeps going
 * on the other legs (also through a failed flush, 'F'), without it the
 * write fails.  A failed leg stays failed until a reload replaces it.
 * Resync copies from leg 0 (dm's default mirror); if leg 0 fails before
 * it is done, resync stops and regions not yet in sync fail reads.
 * Events (target_event: logged, and nbdmsetup wait returns), as
 * dm-raid1 raises for dmeventd: a leg's first error of each kind, resync
 * complete, resync stopped.
 *
 * Resync: a bitmap of regions in sync, allocated at ctr.  With "sync" (or
 * no sync argument, as dm's core log) every region starts out of sync and
 * the engine-wide resync worker copies leg 0 to the other legs region by
 * region while the table is live, backing off when foreground I/O is
 * seen.  Reads of a region not yet in sync come from leg 0 only.  Writes
 * always go to every leg; the one region being copied is fenced off from
 * writes by two per-epoch writer counters (see mirror_write_enter), so
 * once resync is over the write path touches no shared counter at all.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "target.h"
#include "util.h"

#define MIRROR_MAX_LEGS 9          /* dm's MAX_NR_MIRRORS */
#define NO_REGION UINT64_MAX
#define READ_SPREAD_SHIFT 20       /* reads change leg every 1 MiB */
#define COPY_CHUNK (1024 * 1024)   /* resync I/O size */
#define THROTTLE_NS (20 * 1000 * 1000)  /* pause after a busy region */

/* Leg error bits, shown as dm's status characters F > D > S > R > A. */
enum { LEG_READ_ERR = 1, LEG_WRITE_ERR = 2, LEG_SYNC_ERR = 4, LEG_FLUSH_ERR = 8 };

enum sync_arg { SYNC_DEFAULT, SYNC_SYNC, SYNC_NOSYNC };

struct mirror_leg {
  struct backend *be;           /* read-only after ctr */
  uint64_t start;               /* bytes into the backend */
  _Atomic unsigned errors;      /* LEG_* bits */
};

struct mirror {
  /* Read-only after ctr. */
  struct target *ti;            /* for events and messages */
  uint64_t len;                 /* target length, bytes */
  uint64_t region_size;         /* bytes, a power of two */
  unsigned region_shift;
  uint64_t nr_regions;
  unsigned nr_legs;
  enum sync_arg sync;
  bool handle_errors;

  /* Legs that failed a write: a bit per leg, set once. */
  _Atomic unsigned failed_mask;

  /* Resync state.  in_sync: a bit per region, set (by the worker) once the
   * region is copied; never cleared.  all_in_sync turns true once, then the
   * I/O paths skip everything below.
   */
  _Atomic uint64_t *in_sync;
  _Atomic uint64_t nr_in_sync;
  _Atomic bool all_in_sync;
  _Atomic bool resync_failed;   /* source leg failed: no way to finish */
  _Atomic bool stop_copy;       /* postsuspend: give the copy up */
  _Atomic uint64_t fg_ios;      /* foreground requests while resyncing */

  /* Write fencing during resync (see mirror_write_enter). */
  _Atomic uint64_t recovering;  /* region being copied, or NO_REGION */
  _Atomic uint64_t epoch;
  _Atomic uint64_t writers[2];  /* clones in flight, by epoch parity */
  pthread_mutex_t fence_lock;   /* with fence_cond: writers waiting for */
  pthread_cond_t fence_cond;    /* recovering to move on */

  /* Protected by resync_lock. */
  bool live;                    /* table live: may resync */
  bool queued;                  /* on the resync list */
  struct mirror *next;
  uint64_t next_region;         /* where the worker looks next */

  struct mirror_leg legs[MIRROR_MAX_LEGS];
};

/* --- the engine-wide resync worker ----------------------------------- */

/* One thread for every mirror of every device, running only while some
 * live mirror has regions to copy (and the engine is started: nbdkit may
 * fork after tables are loaded).  resync_lock protects everything here
 * and each mirror's live/queued/next/next_region.
 */
static pthread_mutex_t resync_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t resync_cond = PTHREAD_COND_INITIALIZER;
static struct mirror *resync_list;      /* FIFO, head copied next */
static struct mirror *resync_current;   /* being copied (lock dropped) */
static bool engine_running;
static bool worker_running;             /* thread exists, not yet joined */
static bool worker_exiting;             /* it has left its loop */
static pthread_t worker_thread;

static void *resync_worker (void *arg);

static bool
region_in_sync (const struct mirror *m, uint64_t r)
{
  return atomic_load_explicit (&m->in_sync[r / 64], memory_order_acquire)
    & (1ULL << (r % 64));
}

/* Are all regions touching target bytes [off, off+len) in sync? */
static bool
range_in_sync (const struct mirror *m, uint64_t off, uint64_t len)
{
  uint64_t r, last;

  if (atomic_load_explicit (&m->all_in_sync, memory_order_acquire))
    return true;
  last = (off + len - 1) >> m->region_shift;
  for (r = off >> m->region_shift; r <= last; r++)
    if (!region_in_sync (m, r))
      return false;
  return true;
}

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

static int
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

static void
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
}

static size_t mirror_info (struct mirror *m, char *buf, size_t len);

static void
log_state (struct mirror *m, const char *what)
{
  char status[512];

  if (mapper_debug == NULL)
    return;
  mirror_info (m, status, sizeof status);
  mapper_debug ("mirror %s (%s): %s", target_origin (m->ti), what, status);
}

/* A leg's first error of a kind changes its status letter: an event, as
 * dm-raid1's fail_mirror raises (dm only with handle_errors; here in
 * both modes, since the status changed either way).
 */
static void
mark_leg (struct mirror *m, unsigned leg, unsigned bit, const char *what)
{
  if (!(atomic_fetch_or (&m->legs[leg].errors, bit) & bit)) {
    char msg[256];
    snprintf (msg, sizeof msg, "leg %u %s %s", leg,
              backend_name (m->legs[leg].be), what);
    log_state (m, msg);
    target_event (m->ti, "%s", msg);
  }
}

static void
sleep_ns (long ns)
{
  struct timespec ts = { .tv_sec = 0, .tv_nsec = ns };
  nanosleep (&ts, NULL);
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
    r = io_sync (IO_READ, m->legs[0].be, m->legs[0].start + off, n, buf, 0);
    if (r < 0) {
      if (r != -ESHUTDOWN)
        mark_leg (m, 0, LEG_READ_ERR, "failed a resync read");
      break;
    }
    /* Each leg its own request, so a failing leg is known by name. */
    for (unsigned i = 1; i < m->nr_legs; i++) {
      int e;
      if (atomic_load (&m->legs[i].errors) &
          (LEG_WRITE_ERR | LEG_SYNC_ERR | LEG_FLUSH_ERR))
        continue;
      e = io_sync (IO_WRITE, m->legs[i].be, m->legs[i].start + off, n, buf,
                   0);
      if (e == -ESHUTDOWN)
        r = e;                  /* not copied: not in sync */
      else if (e < 0)
        mark_leg (m, i, LEG_SYNC_ERR, "failed a resync write");
    }
  }

  if (r == 0) {
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
    request_wait_cancel = NULL;
    /* Raised while resync_current is m: a swap waits for that
     * (postsuspend) before it unbinds the table, so they reach the
     * device the table is live on.  Each happens once: m is not queued
     * again after either.
     */
    if (r < 0 && r != -ESHUTDOWN) {
      atomic_store (&m->resync_failed, true);
      log_state (m, "resync stopped: the source leg failed");
      target_event (m->ti, "resync stopped: leg 0 %s (the source) failed, "
                    "%" PRIu64 "/%" PRIu64 " regions in sync",
                    backend_name (m->legs[0].be),
                    (uint64_t) atomic_load (&m->nr_in_sync), m->nr_regions);
    }
    else if (atomic_load (&m->all_in_sync)) {
      log_state (m, "resync complete");
      target_event (m->ti, "resync complete, %" PRIu64 "/%" PRIu64
                    " regions in sync", m->nr_regions, m->nr_regions);
    }
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

/* Count n write clones of target bytes [off, off+len) in flight, waiting
 * while the region being copied overlaps them.  Returns the epoch parity
 * the clones must give back in mirror_write_exit.
 *
 * Why it is safe (all seq_cst): a writer reads epoch E, counts itself in
 * writers[E&1], reads recovering, and reads epoch again.  If epoch is
 * still E, its count happened before the worker's next flip, so the
 * worker's wait on writers[E&1] that follows the flip includes it; if the
 * worker flipped before the writer's first read, the writer sees the
 * recovering region stored before that flip.
 */
static unsigned
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

/* --- I/O ---------------------------------------------------------------- */

/* end_io_arg of a clone: the leg, legs already tried (reads), and for
 * writes during resync the epoch parity it was counted in.
 */
#define ARG_LEG(a) ((unsigned) ((a) & 0xff))
#define ARG_TRIED(a) ((unsigned) (((a) >> 8) & 0xffff))
#define ARG_COUNTED 0x1000000ULL
#define ARG_PARITY 0x2000000ULL
#define MAKE_ARG(leg, tried) ((uint64_t) (leg) | ((uint64_t) (tried) << 8))

static bool
leg_readable (struct mirror *m, unsigned i)
{
  return atomic_load_explicit (&m->legs[i].errors, memory_order_relaxed) == 0;
}

/* Leave leg out of writes (handle_errors); false if it was the last. */
static bool
drop_leg (struct mirror *m, unsigned leg)
{
  unsigned all = (1u << m->nr_legs) - 1;
  unsigned failed = atomic_fetch_or (&m->failed_mask, 1u << leg) | (1u << leg);

  return (failed & all) != all;
}

static int
mirror_write_end_io (struct clone *c, void *ctx, uint64_t arg, int error)
{
  struct mirror *m = ctx;
  unsigned leg = ARG_LEG (arg);

  if (arg & ARG_COUNTED)
    atomic_fetch_sub (&m->writers[!!(arg & ARG_PARITY)], 1);
  if (error == 0 || error == -ECANCELED)
    return error;

  mark_leg (m, leg, LEG_WRITE_ERR, "failed a write");
  /* Keep going while another leg has not failed: the last leg to fail
   * is the one that fails the request.
   */
  if (m->handle_errors && drop_leg (m, leg))
    return 0;
  return error;
}

static int
mirror_read_end_io (struct clone *c, void *ctx, uint64_t arg, int error)
{
  struct mirror *m = ctx;
  unsigned leg = ARG_LEG (arg);
  unsigned tried = ARG_TRIED (arg);
  uint64_t offset, len, toff;

  /* Given up (a leg on a suspended device, and the client gone or the
   * server stopping): no fault of the leg's, and nobody to retry for.
   * A write given up so stays a failed write: that leg missed it.
   */
  if (error == 0 || error == -ECANCELED || error == -ESHUTDOWN)
    return error;
  mark_leg (m, leg, LEG_READ_ERR, "failed a read");
  /* Another leg can only serve it where it is in sync. */
  clone_range (c, &offset, &len);
  toff = offset - m->legs[leg].start;
  if (!range_in_sync (m, toff, len))
    return error;
  for (unsigned i = 0; i < m->nr_legs; i++) {
    if ((tried & (1u << i)) || !leg_readable (m, i))
      continue;
    clone_retry (c, m->legs[i].be, m->legs[i].start + toff,
                 MAKE_ARG (i, tried | (1u << i)));
    return CLONE_RETRY;         /* io.c submits it again */
  }
  return error;
}

static bool
mirror_flush_failed (struct target *ti, struct backend *be)
{
  struct mirror *m = ti->private;
  bool ok = true;

  for (unsigned i = 0; i < m->nr_legs; i++)
    if (m->legs[i].be == be) {
      mark_leg (m, i, LEG_FLUSH_ERR, "failed a flush");
      ok &= m->handle_errors && drop_leg (m, i);
    }
  return ok;
}

static int
mirror_map (struct target *ti, struct io_req *req, uint64_t off,
            uint64_t len, char *buf)
{
  struct mirror *m = ti->private;
  bool synced = atomic_load_explicit (&m->all_in_sync, memory_order_acquire);
  unsigned i;
  int r;

  if (!synced)
    atomic_fetch_add_explicit (&m->fg_ios, 1, memory_order_relaxed);

  if (io_req_is_read (req)) {
    unsigned n = m->nr_legs;
    unsigned first;

    if (synced || range_in_sync (m, off, len))
      first = ((ti->begin + off) >> READ_SPREAD_SHIFT) % n;
    else
      n = 1, first = 0;         /* only leg 0 has the data yet */
    for (i = 0; i < n; i++) {
      unsigned leg = (first + i) % m->nr_legs;
      if (leg_readable (m, leg))
        return io_emit_end_io (req, m->legs[leg].be,
                               m->legs[leg].start + off, len, buf,
                               mirror_read_end_io, m,
                               MAKE_ARG (leg, 1u << leg));
    }
    /* Nothing healthy: try the first anyway, it may have recovered. */
    return io_emit_end_io (req, m->legs[first].be,
                           m->legs[first].start + off, len, buf,
                           mirror_read_end_io, m,
                           MAKE_ARG (first, 1u << first));
  }

  /* Writes, zeroes, trims: every leg, the same buffer.  With
   * handle_errors a leg that failed a write is left out (it is no longer
   * part of the mirror until a reload replaces it); without, every write
   * still goes to it and fails.
   */
  {
    unsigned skip = m->handle_errors ? atomic_load (&m->failed_mask) : 0;
    unsigned n = 0, emitted = 0;
    uint64_t arg = 0;

    for (i = 0; i < m->nr_legs; i++)
      n += !(skip & (1u << i));
    if (n == 0)
      return -EIO;
    if (!synced) {
      arg = ARG_COUNTED;
      if (mirror_write_enter (m, off, len, n))
        arg |= ARG_PARITY;
    }
    for (i = 0; i < m->nr_legs; i++) {
      if (skip & (1u << i))
        continue;
      /* The hook marks a leg that fails ('D') in either mode. */
      r = io_emit_end_io (req, m->legs[i].be, m->legs[i].start + off, len,
                          buf, mirror_write_end_io, m, arg | i);
      if (r < 0) {
        if (arg & ARG_COUNTED)
          atomic_fetch_sub (&m->writers[!!(arg & ARG_PARITY)], n - emitted);
        return r;
      }
      emitted++;
    }
  }
  return 0;
}

/* The first healthy leg that answers: any in-sync leg holds what reads
 * return; out of sync, only leg 0 does.  A leg that failed (a write it
 * missed, say) may hold stale holes: data where no healthy leg answers.
 */
static int
mirror_extents (struct target *ti, struct extent_walk *w, uint64_t off,
                uint64_t len)
{
  struct mirror *m = ti->private;
  unsigned n = range_in_sync (m, off, len) ? m->nr_legs : 1;
  uint64_t end = off + len;

  for (unsigned i = 0; i < n && !extent_walk_done (w); i++) {
    uint64_t pos = extent_walk_pos (w, ti);
    int r;

    if (!leg_readable (m, i))
      continue;
    r = extent_walk_backend_try (w, ti, pos, m->legs[i].be,
                                 m->legs[i].start + pos, end - pos);
    if (r != EXTENT_BACKEND_FAILED)
      return r;
  }
  return extent_walk_data (w, ti, end);
}

/* --- status ----------------------------------------------------------- */

static char
leg_status_char (struct mirror *m, unsigned i)
{
  unsigned e = atomic_load (&m->legs[i].errors);

  if (e & LEG_FLUSH_ERR)
    return 'F';
  if (e & LEG_WRITE_ERR)
    return 'D';
  if (e & LEG_SYNC_ERR)
    return 'S';
  if (e & LEG_READ_ERR)
    return 'R';
  return 'A';
}

/* dm: <#legs> <dev>... <in_sync>/<regions> 1 <A|D|S|R...> 1 core */
static size_t
mirror_info (struct mirror *m, char *buf, size_t len)
{
  char chars[MIRROR_MAX_LEGS + 1];
  size_t used = 0;

  EMIT ("%u", m->nr_legs);
  for (unsigned i = 0; i < m->nr_legs; i++) {
    EMIT (" %s", backend_name (m->legs[i].be));
    chars[i] = leg_status_char (m, i);
  }
  chars[m->nr_legs] = '\0';
  EMIT (" %" PRIu64 "/%" PRIu64 " 1 %s 1 core",
        (uint64_t) atomic_load (&m->nr_in_sync), m->nr_regions, chars);
  return used;
}

static size_t
mirror_status (struct target *ti, enum status_type type, char *buf,
               size_t len)
{
  struct mirror *m = ti->private;
  size_t used = 0;

  if (type == STATUSTYPE_INFO)
    return mirror_info (m, buf, len);

  EMIT ("core %d %" PRIu64 "%s %u", m->sync == SYNC_DEFAULT ? 1 : 2,
        m->region_size >> MAPPER_SECTOR_SHIFT,
        m->sync == SYNC_SYNC ? " sync"
        : m->sync == SYNC_NOSYNC ? " nosync" : "", m->nr_legs);
  for (unsigned i = 0; i < m->nr_legs; i++)
    EMIT (" %s %" PRIu64, backend_name (m->legs[i].be),
          m->legs[i].start >> MAPPER_SECTOR_SHIFT);
  if (m->handle_errors)
    EMIT (" 1 handle_errors");
  return used;
}

/* --- constructor -------------------------------------------------------- */

static void mirror_dtr (struct target *ti);

static const struct target_arg legs_arg = { "number of legs", NULL, 2,
                                            MIRROR_MAX_LEGS };

static int
mirror_ctr (struct target *ti, unsigned argc, char **argv,
            struct mapper_err *err)
{
  struct target_args as = { argc, argv }, log, features;
  struct mirror *m;
  uint64_t region, nlegs, words;
  const char *arg;
  int r;

  /* The log: core <#log_args> <region_size> [sync|nosync]. */
  if (argc < 2) {
    mapper_err_set (err, "expected core <#log_args> <region_size> [sync|"
                    "nosync] <#legs> <dev> <offset>..., got %u argument%s",
                    argc, argc == 1 ? "" : "s");
    return -EINVAL;
  }
  arg = target_shift_arg (&as);
  if (strcmp (arg, "core") != 0) {
    mapper_err_set (err, "log type '%s' is not supported (only 'core')", arg);
    return -EINVAL;
  }
  if ((r = target_read_group ("log argument", 1, 2, false, &as, &log,
                              err)) < 0 ||
      (r = target_read_sectors ("region size", &log, &region, err)) < 0)
    return r;
  region >>= MAPPER_SECTOR_SHIFT;
  if (region < 2 || !IS_POWER_OF_2 (region)) {
    mapper_err_set (err, "region size %" PRIu64 " sectors must be a power of "
                    "two, at least 2", region);
    return -EINVAL;
  }
  if (region > ti->len >> MAPPER_SECTOR_SHIFT) {
    mapper_err_set (err, "region size %" PRIu64 " sectors is larger than the "
                    "target (%" PRIu64 " sectors)", region,
                    ti->len >> MAPPER_SECTOR_SHIFT);
    return -EINVAL;
  }

  m = calloc (1, sizeof *m);
  if (m == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  m->ti = ti;
  m->len = ti->len;
  m->region_size = region << MAPPER_SECTOR_SHIFT;
  m->region_shift = __builtin_ctzll (m->region_size);
  m->nr_regions = (ti->len + m->region_size - 1) >> m->region_shift;
  atomic_init (&m->recovering, NO_REGION);
  pthread_mutex_init (&m->fence_lock, NULL);
  pthread_cond_init (&m->fence_cond, NULL);
  ti->private = m;

  if ((arg = target_shift_arg (&log)) != NULL) {
    if (strcmp (arg, "sync") == 0)
      m->sync = SYNC_SYNC;
    else if (strcmp (arg, "nosync") == 0)
      m->sync = SYNC_NOSYNC;
    else {
      mapper_err_set (err, "unrecognised log argument '%s' (expected sync "
                      "or nosync)", arg);
      goto einval;
    }
  }

  /* The legs: <#legs> (<dev> <offset>){#legs}. */
  if (as.argc == 0) {
    mapper_err_set (err, "missing <#legs>");
    goto einval;
  }
  if (target_read_arg (&legs_arg, &as, &nlegs, err) < 0)
    goto einval;
  if (as.argc < 2 * nlegs) {
    mapper_err_set (err, "%" PRIu64 " legs need %" PRIu64 " <dev> <offset> "
                    "arguments, got %u", nlegs, 2 * nlegs, as.argc);
    goto einval;
  }
  for (unsigned i = 0; i < nlegs; i++) {
    const char *dev = target_shift_arg (&as);
    uint64_t start;

    if (target_read_sectors ("offset", &as, &start, err) < 0) {
      mapper_err_prefix (err, "leg %u", i);
      goto einval;
    }
    m->legs[i].start = start;
    r = target_get_backend (ti, dev, start, ti->len, &m->legs[i].be, err);
    if (r < 0) {
      mapper_err_prefix (err, "leg %u", i);
      goto fail;
    }
    m->nr_legs = i + 1;
    for (unsigned j = 0; j < i; j++)
      if (m->legs[j].be == m->legs[i].be) {
        uint64_t s1 = m->legs[j].start, s2 = start;
        if (s1 < s2 + ti->len && s2 < s1 + ti->len) {
          mapper_err_set (err, "legs %u and %u overlap on %s", j, i,
                          backend_name (m->legs[i].be));
          goto einval;
        }
      }
  }

  /* Features: [<#features> handle_errors]. */
  if (as.argc > 0) {
    if (target_read_group ("feature argument", 0, UINT_MAX, false, &as,
                           &features, err) < 0)
      goto einval;
    while ((arg = target_shift_arg (&features)) != NULL) {
      if (strcmp (arg, "handle_errors") == 0)
        m->handle_errors = true;
      else {
        mapper_err_set (err, "unrecognised feature '%s'%s", arg,
                        strcmp (arg, "keep_log") == 0
                        ? " (keep_log needs a disk log; only core is "
                        "supported)" : " (expected handle_errors)");
        goto einval;
      }
    }
    if ((arg = target_shift_arg (&as)) != NULL) {
      mapper_err_set (err, "too many arguments: '%s' after the features",
                      arg);
      goto einval;
    }
  }

  /* The region log, proportionate to size / region size. */
  words = (m->nr_regions + 63) / 64;
  m->in_sync = calloc (words, sizeof *m->in_sync);
  if (m->in_sync == NULL) {
    mapper_err_set (err, "out of memory for %" PRIu64 " regions",
                    m->nr_regions);
    r = -ENOMEM;
    goto fail;
  }
  if (m->sync == SYNC_NOSYNC) {
    for (uint64_t i = 0; i < words; i++)
      atomic_init (&m->in_sync[i], UINT64_MAX);
    atomic_init (&m->nr_in_sync, m->nr_regions);
    atomic_init (&m->all_in_sync, true);
  }
  return 0;

 einval:
  r = -EINVAL;
 fail:
  mirror_dtr (ti);
  ti->private = NULL;
  return r;
}

static void
mirror_resume (struct target *ti)
{
  struct mirror *m = ti->private;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&resync_lock);
  int r;

  m->live = true;
  enqueue_locked (m);
  if ((r = kick_worker_locked ()) < 0 && mapper_debug)
    mapper_debug ("mirror %s: cannot start the resync thread: %s",
                  target_origin (ti), strerror (-r));
}

static void
mirror_postsuspend (struct target *ti)
{
  struct mirror *m = ti->private;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&resync_lock);

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
}

static void
mirror_dtr (struct target *ti)
{
  struct mirror *m = ti->private;

  if (m == NULL)
    return;
  mirror_postsuspend (ti);
  pthread_cond_destroy (&m->fence_cond);
  pthread_mutex_destroy (&m->fence_lock);
  free (m->in_sync);
  free (m);
}

static int
mirror_iterate_backends (struct target *ti,
                         int (*fn) (struct target *, struct backend *, void *),
                         void *data)
{
  struct mirror *m = ti->private;
  int r;

  for (unsigned i = 0; i < m->nr_legs; i++)
    if ((r = fn (ti, m->legs[i].be, data)) != 0)
      return r;
  return 0;
}

const struct target_type mirror_target = {
  .name = "mirror",
  .version = { 1, 14, 0 },
  .ctr = mirror_ctr,
  .dtr = mirror_dtr,
  .map = mirror_map,
  .extents = mirror_extents,
  .status = mirror_status,
  .iterate_backends = mirror_iterate_backends,
  .resume = mirror_resume,
  .postsuspend = mirror_postsuspend,
  .flush_failed = mirror_flush_failed,
  .start = mirror_resync_start,
  .stop = mirror_resync_stop,
};

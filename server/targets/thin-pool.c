/* SPDX-License-Identifier: BSD-3-Clause */
/* thin-pool <metadata dev> <data dev> <data block size> <low water mark>
 *           [<#features> <feature>...]
 *
 * dm-thin's pool target.  The device itself maps linearly onto the data
 * device (dm's pool_map), and the thin devices bound to it (thin.c) send
 * their data I/O through it as mapper:POOL, so that suspending the pool
 * holds theirs and a flush of any of them reaches the pool's flush hook,
 * which commits the metadata.  Features: skip_block_zeroing,
 * ignore_discard, no_discard_passdown, read_only, error_if_no_space.
 *
 * The metadata (server/pdata/thin-metadata.h, Linux's on-disk format) is
 * committed (the data device flushed first, then the metadata) when a
 * client flush or FUA write reaches the pool or one of its thin devices,
 * after each message, and at least every second otherwise by the
 * pool's own commit thread (from the type's start to its stop: one per
 * pool, so that a commit waiting for its pool holds up no other's).  A
 * commit that fails switches the pool read-only with needs_check set,
 * and every later flush fails: the writes since the last commit are
 * gone.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "target.h"
#include "util.h"
#include "thin.h"
#include "pdata-dev.h"

/* Cached 4 KiB metadata blocks per pool: 16 MiB, a million mappings'
 * leaves fit (pool_md_open).
 */
#define POOL_CACHE_BLOCKS 4096
#define COMMIT_PERIOD_NS 1000000000ULL

/* One thin-pool target (dm's pool_c): its table's arguments. */
struct pool_c {
  struct pool_c *next;          /* pool_cs, under pools_lock */
  struct pool *pool;
  struct backend *md_be, *data_be;
  uint32_t block_sectors;
  uint64_t low_water_blocks;
  uint64_t nr_blocks;
  struct pool_features pf;
};

/* Every pool object; each one's refs.  A leaf lock: taken under a pool
 * device's lock (target_find_peer) and under commit_rw (pool_resume),
 * and nothing is taken under it but a pool's lock.
 */
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pool *pools;
/* Every thin-pool target bound to a pool object (live, inactive, being
 * replaced), under pools_lock: the data devices their resume may bind.
 */
static struct pool_c *pool_cs;

/* --- events ------------------------------------------------------------- */

/* An event on the pool's live device (logged and nbdmsetup wait
 * returns), or only logged while no thin-pool target of it is live.
 */
static void
pool_event (struct pool *p, const char *msg)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&p->lock);

  if (p->ti)
    target_event (p->ti, "%s", msg);
  else if (mapper_log)
    mapper_log ("thin-pool: %s: %s", backend_name (p->md_be), msg);
}

static const char *
mode_name (enum pool_mode m)
{
  switch (m) {
  case PM_WRITE: return "write";
  case PM_OUT_OF_DATA_SPACE: return "out-of-data-space";
  case PM_READ_ONLY: return "read-only";
  case PM_FAIL: return "fail";
  }
  return "?";
}

static void
set_mode (struct pool *p, enum pool_mode m, const char *why)
{
  int old = atomic_exchange (&p->mode, m);
  char msg[512];

  if (old == (int) m)
    return;
  snprintf (msg, sizeof msg, "switching pool to %s mode%s%s", mode_name (m),
            why ? ": " : "", why ? why : "");
  pool_event (p, msg);
}

void
pool_md_failed (struct pool *p, const char *op, int r, const char *err)
{
  char why[PD_ERR_LEN + 128], aerr[PD_ERR_LEN] = "", last[PD_ERR_LEN] = "";

  /* The library's own line for calls that take no err (lookups,
   * inserts, allocations).
   */
  if (err == NULL || *err == '\0') {
    thin_md_last_error (p->md, last);
    err = last;
  }
  snprintf (why, sizeof why, "%s failed: %s", op,
            *err ? err : mapper_strerror (-r));
  atomic_store (&p->commit_failed, true);
  /* dm's abort_transaction: back to the last commit, needs_check set,
   * and no more changes until an administrator has checked it.
   */
  thin_md_abort (p->md, aerr);
  thin_md_set_needs_check (p->md);
  set_mode (p, PM_READ_ONLY, why);
}

/* --- commit --------------------------------------------------------- */

/* Out of data space, a commit may have freed blocks (discards, deletes):
 * back to write mode, and wake the queued writes (dm's
 * check_for_data_space).
 */
static void
space_freed (struct pool *p)
{
  uint64_t nfree = 0;

  if (thin_md_get_free_data_blocks (p->md, &nfree) < 0 || nfree == 0)
    return;
  set_mode (p, PM_WRITE, NULL);
  pthread_mutex_lock (&p->lock);
  p->space_gen++;
  pthread_cond_broadcast (&p->space_cond);
  pthread_mutex_unlock (&p->lock);
}

/* --- draining the fast path (struct pool's io_epoch) ----------------- */

void
pool_io_drained (struct pool *p)
{
  pthread_mutex_lock (&p->lock);
  pthread_cond_broadcast (&p->drain_cond);
  pthread_mutex_unlock (&p->lock);
}

/* Until slot s is empty: 0, or -EAGAIN if not wait, or once the pool
 * device is suspending (clones held at its gate complete only after the
 * resume, and whoever waits here may be what the resume waits for).
 */
static int
wait_slot (struct pool *p, unsigned s, bool wait)
{
  int r = 0;

  if (atomic_load (&p->io_count[s]) == 0)
    return 0;
  if (!wait)
    return -EAGAIN;
  pthread_mutex_lock (&p->lock);
  atomic_fetch_add (&p->drain_waiters, 1);
  while (atomic_load (&p->io_count[s]) != 0) {
    struct timespec ts;

    if (p->suspended) {
      r = -EAGAIN;
      break;
    }
    /* pool_io_exit wakes it; the slice only bounds a missed wake-up. */
    clock_gettime (CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 100000000;
    if (ts.tv_nsec >= 1000000000)
      ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait (&p->drain_cond, &p->lock, &ts);
  }
  atomic_fetch_sub (&p->drain_waiters, 1);
  pthread_mutex_unlock (&p->lock);
  return r;
}

/* Every fast-path clone that may have seen a mapping released before
 * this call is done: 0, or -EAGAIN (wait_slot).  Holds no lock of the
 * pool's but drain_lock while it waits: a clone may be held below (a
 * delay device, a remote data server) by nothing of ours.
 */
static int
pool_drain (struct pool *p, bool wait)
{
  uint64_t seq;
  int r = 0, s;

  if (wait)
    pthread_mutex_lock (&p->drain_lock);
  else if (pthread_mutex_trylock (&p->drain_lock) != 0)
    return -EAGAIN;
  /* A drain given up: its slot first (no new I/O counts there). */
  s = atomic_load (&p->drain_slot);
  if (s >= 0) {
    if ((r = wait_slot (p, s, wait)) < 0)
      goto out;
    atomic_store (&p->drain_slot, -1);
    atomic_store (&p->drained_seq, p->pending_seq);
  }
  /* The releases so far, read before the epoch moves on: every clone
   * that may have seen one of them counts in the old slot.
   */
  seq = atomic_load (&p->release_seq);
  if (seq != atomic_load (&p->drained_seq)) {
    s = atomic_fetch_add (&p->io_epoch, 1) & 1;
    p->pending_seq = seq;
    atomic_store (&p->drain_slot, s);
    if ((r = wait_slot (p, s, wait)) < 0)
      goto out;
    atomic_store (&p->drain_slot, -1);
    atomic_store (&p->drained_seq, seq);
  }
 out:
  pthread_mutex_unlock (&p->drain_lock);
  return r;
}

/* --- commit --------------------------------------------------------- */

/* commit_rw held exclusive. */
static int
commit_locked (struct pool *p)
{
  char err[PD_ERR_LEN] = "";
  int r = 0;

  if (atomic_load (&p->commit_failed))
    r = -EIO;
  /* Failed metadata (a lookup that could not read a block) fails the
   * commit even with nothing changed: the pool goes read-only.
   */
  else if (thin_md_changed (p->md) || thin_md_failed (p->md)) {
    /* Data first: a committed mapping never points at data that a
     * crash can still lose (dm's flush before commit).
     */
    r = target_flush_backend (p->data_be);
    if (r == 0) {
      r = thin_md_commit (p->md, err);
      if (r < 0)
        pool_md_failed (p, "metadata commit", r, err);
    }
  }
  return r;
}

/* How a commit may wait for the fast path to drain (pool_drain). */
enum commit_wait {
  COMMIT_TRY,                   /* not at all (postsuspend, messages) */
  COMMIT_WAIT,                  /* unless the pool device is suspending */
};

/* pool_commit, or -EAGAIN when it would have to wait longer than how
 * allows: the commit thread does it later.
 */
static int
pool_commit_how (struct pool *p, enum commit_wait how)
{
  int r;

  /* The first turn looks under the lock whether a drain is needed. */
  for (bool drain = false;; drain = true) {
    if (drain && (r = pool_drain (p, how != COMMIT_TRY)) < 0)
      return r;
    if (how == COMMIT_TRY) {
      if (pthread_rwlock_trywrlock (&p->commit_rw) != 0)
        return -EAGAIN;
    }
    else
      pthread_rwlock_wrlock (&p->commit_rw);
    /* Nothing to commit (or failed: commit_locked says so), or every
     * release drained: releases hold commit_rw shared, so none comes
     * before the commit.
     */
    if (atomic_load (&p->commit_failed) || !thin_md_changed (p->md) ||
        atomic_load (&p->release_seq) == atomic_load (&p->drained_seq))
      break;
    pthread_rwlock_unlock (&p->commit_rw);
  }
  r = commit_locked (p);
  pthread_rwlock_unlock (&p->commit_rw);
  if (r == 0 && pool_mode (p) == PM_OUT_OF_DATA_SPACE)
    space_freed (p);
  return r < 0 ? -EIO : 0;
}

int
pool_commit (struct pool *p)
{
  for (;;) {
    int r = pool_commit_how (p, COMMIT_WAIT);

    if (r != -EAGAIN)
      return r;
    /* Suspending: the drain completes after the resume. */
    if ((r = pool_wait_running (p)) < 0)
      return r;
  }
}

/* The commit threads, one per pool, once a second (dm's do_waker and
 * per-pool worker).  They run between the type's start and stop.
 */
static bool engine_up;          /* under pools_lock */

static void *
pool_committer (void *arg)
{
  struct pool *p = arg;

  pthread_mutex_lock (&p->lock);
  while (!p->committer_stop) {
    struct timespec ts;

    clock_gettime (CLOCK_MONOTONIC, &ts);
    ts.tv_sec += COMMIT_PERIOD_NS / 1000000000ULL;
    pthread_cond_timedwait (&p->commit_cond, &p->lock, &ts);
    if (p->committer_stop)
      break;
    pthread_mutex_unlock (&p->lock);
    /* Not while the pool device is suspending: its commit waits for the
     * resume (or its postsuspend did it).
     */
    if (!atomic_load (&p->commit_failed) && thin_md_changed (p->md))
      pool_commit_how (p, COMMIT_WAIT);
    pthread_mutex_lock (&p->lock);
  }
  pthread_mutex_unlock (&p->lock);
  return NULL;
}

/* Start p's commit thread if the engine is up (pools_lock held): 0 or
 * an errno.
 */
static int
committer_start_locked (struct pool *p)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&p->lock);
  int e;

  if (!engine_up || p->committer_running)
    return 0;
  e = mapper_thread_create_arg (&p->committer, pool_committer, p,
                                "mapper-thin");
  if (e == 0)
    p->committer_running = true;
  return e;
}

static int
committer_start (struct pool *p, struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&pools_lock);
  int e = committer_start_locked (p);

  if (e != 0)
    mapper_err_set (err, "cannot start the commit thread of the pool on "
                    "%s: %s", backend_name (p->md_be), mapper_strerror (e));
  return -e;
}

/* Stop p's commit thread and wait for it (holding no lock: its commit
 * may send an event, which takes the pool device's lock).
 */
static void
committer_stop (struct pool *p)
{
  pthread_t t;
  bool join;

  pthread_mutex_lock (&p->lock);
  join = p->committer_running;
  t = p->committer;
  p->committer_running = false;
  p->committer_stop = true;
  pthread_cond_broadcast (&p->commit_cond);
  pthread_mutex_unlock (&p->lock);
  if (join)
    pthread_join (t, NULL);
  pthread_mutex_lock (&p->lock);
  p->committer_stop = false;
  pthread_mutex_unlock (&p->lock);
}

/* Pools made before the engine started get their threads now. */
static int
pool_type_start (struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&pools_lock);

  engine_up = true;
  for (struct pool *p = pools; p; p = p->next) {
    int e = committer_start_locked (p);

    if (e != 0) {
      /* Those started stop with their pools (pool_free). */
      engine_up = false;
      mapper_err_set (err, "thin-pool: cannot start the commit thread of "
                      "the pool on %s: %s", backend_name (p->md_be),
                      mapper_strerror (e));
      return -e;
    }
  }
  return 0;
}

/* Stop every pool's commit thread, and commit each one last while the
 * I/O loop (a remote metadata or data device) still runs: the tables,
 * and thin_md_close, go later.  One pool at a time, holding a
 * reference, never pools_lock, while it waits.
 */
static void
pool_type_stop (void)
{
  pthread_mutex_lock (&pools_lock);
  engine_up = false;
  pthread_mutex_unlock (&pools_lock);
  for (struct pool *p = NULL, *next;; p = next) {
    pthread_mutex_lock (&pools_lock);
    next = p ? p->next : pools;
    if (next)
      next->refs++;
    pthread_mutex_unlock (&pools_lock);
    if (p)
      pool_put (p);
    if (next == NULL)
      return;
    committer_stop (next);
    if (!atomic_load (&next->commit_failed) && thin_md_changed (next->md))
      pool_commit_how (next, COMMIT_WAIT);
  }
}

/* --- data blocks ------------------------------------------------------ */

/* dm's metadata low water mark: a quarter of the metadata device, at
 * most 4 MiB.
 */
static uint64_t
metadata_threshold (struct pool *p)
{
  uint64_t total = p->pdev.size / 4096;

  return MIN (1024, total / 4);
}

static void
check_low_water (struct pool *p)
{
  uint64_t nfree, mfree;
  bool raise = false, mraise = false;
  char msg[256], mmsg[256];

  if (thin_md_get_free_data_blocks (p->md, &nfree) < 0 ||
      thin_md_get_free_metadata_blocks (p->md, &mfree) < 0)
    return;
  pthread_mutex_lock (&p->lock);
  if (nfree <= p->low_water_blocks && !p->low_water_raised) {
    p->low_water_raised = raise = true;
    snprintf (msg, sizeof msg, "reached low water mark for data device "
              "(%" PRIu64 " free blocks, mark %" PRIu64 "): sending event",
              nfree, p->low_water_blocks);
  }
  /* dm's metadata low water mark (the status's last field). */
  if (mfree <= metadata_threshold (p) && !p->meta_low_water_raised) {
    p->meta_low_water_raised = mraise = true;
    snprintf (mmsg, sizeof mmsg, "reached low water mark for metadata "
              "device (%" PRIu64 " free blocks, mark %" PRIu64 "): sending "
              "event", mfree, metadata_threshold (p));
  }
  pthread_mutex_unlock (&p->lock);
  if (raise)
    pool_event (p, msg);
  if (mraise)
    pool_event (p, mmsg);
}

int
pool_alloc_block (struct pool *p, uint64_t *block, uint64_t *gen)
{
  bool committed = false, error_if_no_space;
  int r;

  for (;;) {
    enum pool_mode m = pool_mode (p);

    if (m == PM_READ_ONLY || m == PM_FAIL)
      return -EIO;
    /* Before looking: a bind or commit from now on ends the wait. */
    pthread_mutex_lock (&p->lock);
    *gen = p->space_gen;
    error_if_no_space = p->pf.error_if_no_space;  /* a reload sets it */
    pthread_mutex_unlock (&p->lock);
    r = thin_md_alloc_data_block (p->md, block);
    if (r == 0) {
      check_low_water (p);
      return 0;
    }
    if (r != -ENOSPC) {
      pool_md_failed (p, "data block allocation", r, NULL);
      return -EIO;
    }
    /* Blocks released in this transaction come free at its commit (dm's
     * alloc_data_block commits once before giving up).
     */
    if (!committed) {
      committed = true;
      pthread_rwlock_unlock (&p->commit_rw);
      r = pool_commit_how (p, COMMIT_WAIT);
      pthread_rwlock_rdlock (&p->commit_rw);
      /* Suspending with I/O to drain: wait (holding no lock) for the
       * resume, which moves space_gen on, and try again.
       */
      if (r == -EAGAIN)
        return -EAGAIN;
      if (r < 0)
        return r;
      continue;
    }
    set_mode (p, PM_OUT_OF_DATA_SPACE, error_if_no_space
              ? "writes fail (error_if_no_space)"
              : "writes queue until the data device grows (reload the "
              "pool with a larger one), for 60 seconds at most");
    return error_if_no_space ? -ENOSPC : -EAGAIN;
  }
}

int
pool_wait_space (struct pool *p, uint64_t gen, uint64_t *deadline,
                 uint64_t *asked)
{
  int r = 0;

  if (*deadline == 0)
    *deadline = monotonic_ns () + POOL_NO_SPACE_TIMEOUT_NS;
  pthread_mutex_lock (&p->lock);
  while (p->space_gen == gen && r == 0) {
    if (monotonic_ns () >= *deadline)
      r = -ENOSPC;
    else
      r = request_wait (&p->space_cond, &p->lock, *deadline, asked);
  }
  pthread_mutex_unlock (&p->lock);
  return r;
}

bool
pool_suspended (struct pool *p)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&p->lock);

  return p->suspended;
}

int
pool_wait_running (struct pool *p)
{
  uint64_t asked = 0;
  int r = 0;

  pthread_mutex_lock (&p->lock);
  while (p->suspended && r == 0)
    r = request_wait (&p->space_cond, &p->lock, 0, &asked);
  pthread_mutex_unlock (&p->lock);
  return r;
}

pthread_mutex_t *
pool_cell (struct pool *p, uint64_t dev_id, uint64_t block)
{
  uint64_t h = (block ^ (dev_id << 40)) * 0x9e3779b97f4a7c15ULL;

  return &p->cells[h >> 56 & (POOL_CELLS - 1)];
}

/* --- pool objects ------------------------------------------------------ */

static void
pool_free (struct pool *p)
{
  char err[PD_ERR_LEN] = "";

  committer_stop (p);
  /* thin_md_close would commit what changed, but without flushing the
   * data device first.
   */
  if (p->md && !atomic_load (&p->commit_failed) && thin_md_changed (p->md))
    pool_commit_how (p, COMMIT_WAIT);
  if (p->md && thin_md_close (p->md, err) < 0 && mapper_log)
    mapper_log ("thin-pool: %s: closing the metadata failed: %s",
                backend_name (p->md_be), err);
  for (unsigned i = 0; i < POOL_CELLS; i++)
    pthread_mutex_destroy (&p->cells[i]);
  pthread_cond_destroy (&p->commit_cond);
  pthread_cond_destroy (&p->drain_cond);
  pthread_mutex_destroy (&p->drain_lock);
  pthread_rwlock_destroy (&p->commit_rw);
  pthread_cond_destroy (&p->space_cond);
  pthread_mutex_destroy (&p->lock);
  if (p->data_be)
    target_backend_put (p->data_be);
  target_backend_put (p->md_be);
  free (p);
}

void
pool_put (struct pool *p)
{
  struct pool **pp;

  pthread_mutex_lock (&pools_lock);
  if (--p->refs > 0) {
    pthread_mutex_unlock (&pools_lock);
    return;
  }
  for (pp = &pools; *pp != p; pp = &(*pp)->next)
    ;
  *pp = p->next;
  pthread_mutex_unlock (&pools_lock);
  /* Commits what changed since the last commit (thin_md_close). */
  pool_free (p);
}

int
pool_bind_peer (struct target *peer, void *opaque)
{
  struct pool_c *pc = peer->private;

  pthread_mutex_lock (&pools_lock);
  pc->pool->refs++;
  pthread_mutex_unlock (&pools_lock);
  *(struct pool **) opaque = pc->pool;
  return 1;                     /* found: stop */
}

int
pool_is_peer (struct target *peer, void *opaque)
{
  struct pool_c *pc = peer->private;

  return pc->pool == opaque;
}

/* A new pool object on pc's backends (pools_lock held). */
static int
pool_create (struct pool_c *pc, uint64_t md_size, struct mapper_err *err)
{
  char perr[PD_ERR_LEN] = "";
  struct thin_md_open_args a;
  pthread_rwlockattr_t rwa;
  pthread_condattr_t ca;
  struct pool *p;
  int r;

  p = calloc (1, sizeof *p);
  if (p == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  p->md_be = pc->md_be;
  p->pdev = (struct pd_blockdev) { .ops = &target_pd_blockdev_ops, .opaque = pc->md_be,
                                   .size = md_size };
  p->block_sectors = pc->block_sectors;
  p->block_bytes = (uint64_t) pc->block_sectors << MAPPER_SECTOR_SHIFT;
  a = (struct thin_md_open_args) {
    .dev = &p->pdev, .data_block_sectors = pc->block_sectors,
    .nr_data_blocks = pc->nr_blocks, .read_only = pc->pf.read_only,
    .cache_blocks = POOL_CACHE_BLOCKS,
  };
  r = thin_md_open (&a, &p->md, perr);
  if (r < 0) {
    mapper_err_set (err, "metadata device %s: %s", backend_name (pc->md_be),
                    *perr ? perr : mapper_strerror (-r));
    free (p);
    return r == -ENOMEM ? r : -EINVAL;
  }
  pthread_mutex_init (&p->lock, NULL);
  pthread_condattr_init (&ca);
  pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);
  pthread_cond_init (&p->space_cond, &ca);
  pthread_cond_init (&p->commit_cond, &ca);
  pthread_condattr_destroy (&ca);
  pthread_rwlockattr_init (&rwa);
  pthread_rwlockattr_setkind_np (&rwa,
                                 PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init (&p->commit_rw, &rwa);
  pthread_rwlockattr_destroy (&rwa);
  for (unsigned i = 0; i < POOL_CELLS; i++)
    pthread_mutex_init (&p->cells[i], NULL);
  pthread_mutex_init (&p->drain_lock, NULL);
  pthread_condattr_init (&ca);
  pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);
  pthread_cond_init (&p->drain_cond, &ca);
  pthread_condattr_destroy (&ca);
  atomic_init (&p->drain_slot, -1);
  target_backend_hold (pc->md_be);
  target_backend_hold (pc->data_be);
  p->data_be = pc->data_be;
  p->pf = pc->pf;
  p->low_water_blocks = pc->low_water_blocks;
  atomic_init (&p->mode, pc->pf.read_only ? PM_READ_ONLY : PM_WRITE);
  atomic_init (&p->discard_enabled, pc->pf.discard_enabled);
  atomic_init (&p->discard_passdown, pc->pf.discard_passdown);
  atomic_init (&p->zero_new_blocks, pc->pf.zero_new_blocks);
  p->refs = 1;
  p->next = pools;
  pools = p;
  pc->pool = p;
  return 0;
}

static int
data_in_use (struct pool_c *pc, struct pool *q, struct mapper_err *err)
{
  mapper_err_set (err, "data device %s is already the data device of the "
                  "pool on metadata device %s", backend_name (pc->data_be),
                  backend_name (q->md_be));
  return -EBUSY;
}

/* pools_lock held. */
static void
pool_c_link (struct pool_c *pc)
{
  pc->next = pool_cs;
  pool_cs = pc;
}

static void
pool_c_unlink (struct pool_c *pc)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&pools_lock);

  for (struct pool_c **pp = &pool_cs; *pp; pp = &(*pp)->next)
    if (*pp == pc) {
      *pp = pc->next;
      return;
    }
}

/* Find the pool on pc's metadata device, or make one: the checks dm's
 * pool_ctr and pool_preresume make, at load time here (resume cannot
 * fail).
 */
static int
pool_find_or_create (struct pool_c *pc, uint64_t md_size,
                     struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&pools_lock);
  struct pool *p = NULL;
  uint64_t blocks;

  /* The pool on this metadata device, if any, and none other on this
   * data device: neither bound there (a reload of a pool onto another's
   * data) nor named by a table of it that a resume binds (an inactive
   * one).  Two pools would allocate the same data blocks.
   */
  for (struct pool *q = pools; q; q = q->next)
    if (q->md_be == pc->md_be)
      p = q;
  for (struct pool *q = pools; q; q = q->next)
    if (q != p && q->data_be == pc->data_be)
      return data_in_use (pc, q, err);
  for (struct pool_c *c = pool_cs; c; c = c->next)
    if (c->pool != p && c->data_be == pc->data_be)
      return data_in_use (pc, c->pool, err);
  if (p == NULL) {
    int r = pool_create (pc, md_size, err);
    if (r == 0)
      pool_c_link (pc);
    return r;
  }

  if (p->block_sectors != pc->block_sectors) {
    mapper_err_set (err, "metadata device %s is in use by a pool with a "
                    "data block size of %" PRIu32 " sectors, not %" PRIu32,
                    backend_name (pc->md_be), p->block_sectors,
                    pc->block_sectors);
    return -EINVAL;
  }
  if (thin_md_get_data_dev_size (p->md, &blocks) == 0 &&
      pc->nr_blocks < blocks) {
    mapper_err_set (err, "the pool has %" PRIu64 " data blocks, this table "
                    "only %" PRIu64 ": a pool's data device cannot shrink",
                    blocks, pc->nr_blocks);
    return -EINVAL;
  }
  p->refs++;
  pc->pool = p;
  pool_c_link (pc);
  return 0;
}

/* --- the target ------------------------------------------------------- */

static int
pool_map (struct target *ti, struct io_req *req, uint64_t off, uint64_t len,
          char *buf)
{
  struct pool_c *pc = ti->private;

  return io_emit (req, pc->data_be, off, len, buf);
}

static int
pool_extents (struct target *ti, struct extent_walk *w, uint64_t off,
              uint64_t len)
{
  struct pool_c *pc = ti->private;

  return extent_walk_backend (w, ti, off, pc->data_be, off, len);
}

/* A flush of the pool device, or of a thin device (through mapper:POOL):
 * flush the data device and commit (REQ_PREFLUSH in dm).
 */
static int
pool_flush (struct target *ti, struct io_req *req)
{
  struct pool_c *pc = ti->private;

  return pool_commit (pc->pool);
}

/* Binding (dm's pool_preresume and __bind): the live table's data device,
 * size, features and low water mark.  Grows the data space map.
 */
static void
pool_resume (struct target *ti)
{
  struct pool_c *pc = ti->private;
  struct pool *p = pc->pool;
  char err[PD_ERR_LEN] = "", msg[PD_ERR_LEN + 64];
  uint64_t blocks = 0, nfree = 0, mfree = 0;
  int r = 0;

  /* commit_rw may be held by a commit flushing a data device that a
   * suspended device below holds up: wait without the locks.
   */
  if (pthread_rwlock_trywrlock (&p->commit_rw) != 0) {
    target_wait_begin (ti);
    pthread_rwlock_wrlock (&p->commit_rw);
  }
  if (p->data_be != pc->data_be) {
    struct backend *old = p->data_be;

    target_backend_hold (pc->data_be);
    /* Under pools_lock too: pool_find_or_create reads it so. */
    pthread_mutex_lock (&pools_lock);
    p->data_be = pc->data_be;
    pthread_mutex_unlock (&pools_lock);
    target_backend_put (old);
  }
  if (thin_md_get_data_dev_size (p->md, &blocks) == 0 &&
      pc->nr_blocks > blocks && !thin_md_failed (p->md) &&
      !pc->pf.read_only)
    r = thin_md_resize_data_dev (p->md, pc->nr_blocks, err);
  pthread_rwlock_unlock (&p->commit_rw);
  target_wait_end (ti);
  if (r < 0) {
    snprintf (msg, sizeof msg, "growing the data device to %" PRIu64
              " blocks", pc->nr_blocks);
    pool_md_failed (p, msg, r, err);
  }

  pthread_mutex_lock (&p->lock);
  p->ti = ti;
  p->suspended = false;
  p->pf = pc->pf;
  p->low_water_blocks = pc->low_water_blocks;
  atomic_store (&p->discard_enabled, pc->pf.discard_enabled);
  atomic_store (&p->discard_passdown, pc->pf.discard_passdown);
  atomic_store (&p->zero_new_blocks, pc->pf.zero_new_blocks);
  if (thin_md_get_free_data_blocks (p->md, &nfree) == 0 &&
      nfree > p->low_water_blocks)
    p->low_water_raised = false;
  if (thin_md_get_free_metadata_blocks (p->md, &mfree) == 0 &&
      mfree > metadata_threshold (p))
    p->meta_low_water_raised = false;
  p->space_gen++;
  pthread_cond_broadcast (&p->space_cond);
  pthread_mutex_unlock (&p->lock);

  if (atomic_load (&p->commit_failed) || thin_md_failed (p->md))
    set_mode (p, PM_READ_ONLY, NULL);
  else if (pc->pf.read_only)
    set_mode (p, PM_READ_ONLY, "read_only");
  else if (pool_mode (p) != PM_WRITE && nfree > 0)
    set_mode (p, PM_WRITE, NULL);
  check_low_water (p);
}

/* The bound target goes (its device removed, or its table replaced by
 * one that binds another target or none: the latter only without thin
 * holders, see thin_check_lower): no events to it any more, and nothing
 * waits for a resume of it.  The binding outlives a suspend: the
 * suspended table is still the device's.
 */
static void
pool_unbind (struct target *ti)
{
  struct pool_c *pc = ti->private;
  struct pool *p = pc->pool;

  pthread_mutex_lock (&p->lock);
  if (p->ti == ti) {
    p->ti = NULL;
    p->suspended = false;
    pthread_cond_broadcast (&p->space_cond);
  }
  pthread_mutex_unlock (&p->lock);
}

/* dm's pool_presuspend: from now until the resume, the thin devices'
 * writes to the data device wait, as the pool device's own requests do
 * at its gate (the ones in flight finish).
 */
static void
pool_presuspend (struct target *ti)
{
  struct pool_c *pc = ti->private;
  struct pool *p = pc->pool;

  pthread_mutex_lock (&p->lock);
  if (p->ti == ti) {
    p->suspended = true;
    pthread_cond_broadcast (&p->drain_cond);    /* wait_slot gives up */
  }
  pthread_mutex_unlock (&p->lock);
}

/* dm's pool_postsuspend flushes the pool's worker and commits: a
 * suspended pool sends nothing more to its data device, and is a
 * committed one.  The provisioning writes, copies and passdowns in
 * flight go to the data device directly, holding commit_rw shared:
 * they finish before the suspend does (and before its flush of the
 * data device), new ones see suspended under commit_rw and wait for the
 * resume.  The commit only if it needs no wait: fast-path clones a
 * drain waits for may be held at this device's gate; the commit thread
 * does it after the resume then.
 */
static void
pool_postsuspend (struct target *ti)
{
  struct pool_c *pc = ti->private;
  struct pool *p = pc->pool;
  bool bound;

  pthread_mutex_lock (&p->lock);
  bound = p->ti == ti;
  pthread_mutex_unlock (&p->lock);
  /* Those writes may be held by a data device below that is suspended
   * (or stalls), and its resume is a control command: the waits here,
   * and the commit's flush of the data device, without the locks.
   */
  target_wait_begin (ti);
  if (bound) {
    pthread_rwlock_wrlock (&p->commit_rw);
    pthread_rwlock_unlock (&p->commit_rw);
  }
  if (!atomic_load (&p->commit_failed) && thin_md_changed (p->md))
    pool_commit_how (p, COMMIT_TRY);
  target_wait_end (ti);
}

static void
pool_dtr (struct target *ti)
{
  struct pool_c *pc = ti->private;

  if (pc == NULL)
    return;
  if (pc->pool) {
    pool_c_unlink (pc);
    pool_unbind (ti);
    pool_put (pc->pool);
  }
  free (pc);
}

/* dm: <transaction id> <used meta>/<total meta> <used data>/<total data>
 * <held metadata root> ro|rw|out_of_data_space [no_]discard_passdown
 * [error|queue]_if_no_space needs_check|- <metadata low water mark>
 */
static size_t
pool_status (struct target *ti, enum status_type type, char *buf,
             size_t len)
{
  struct pool_c *pc = ti->private;
  struct pool *p = pc->pool;
  const struct pool_features *pf = &pc->pf;
  size_t used = 0;

  if (type == STATUSTYPE_INFO) {
    uint64_t tid = 0, mfree = 0, mtotal = 0, dfree = 0, dtotal = 0, held = 0;
    enum pool_mode m = pool_mode (p);

    if (m == PM_FAIL) {
      EMIT ("Fail");
      return used;
    }
    /* dm's pool_status says Error when it cannot tell. */
    if (thin_md_get_transaction_id (p->md, &tid) < 0 ||
        thin_md_get_free_metadata_blocks (p->md, &mfree) < 0 ||
        thin_md_get_metadata_dev_size (p->md, &mtotal) < 0 ||
        thin_md_get_free_data_blocks (p->md, &dfree) < 0 ||
        thin_md_get_data_dev_size (p->md, &dtotal) < 0 ||
        thin_md_get_metadata_snap (p->md, &held) < 0) {
      EMIT ("Error");
      return used;
    }
    EMIT ("%" PRIu64 " %" PRIu64 "/%" PRIu64 " %" PRIu64 "/%" PRIu64 " ",
          tid, mtotal - mfree, mtotal, dtotal - dfree, dtotal);
    if (held)
      EMIT ("%" PRIu64 " ", held);
    else
      EMIT ("- ");
    EMIT ("%s ", m == PM_OUT_OF_DATA_SPACE ? "out_of_data_space"
          : m == PM_READ_ONLY ? "ro" : "rw");
    if (!pf->discard_enabled)
      EMIT ("ignore_discard ");
    else if (pf->discard_passdown)
      EMIT ("discard_passdown ");
    else
      EMIT ("no_discard_passdown ");
    EMIT ("%s ", pf->error_if_no_space ? "error_if_no_space"
          : "queue_if_no_space");
    EMIT ("%s ", thin_md_needs_check (p->md) ? "needs_check" : "-");
    EMIT ("%" PRIu64, metadata_threshold (p));
    return used;
  }

  EMIT ("%s %s %" PRIu32 " %" PRIu64 " %u", backend_name (pc->md_be),
        backend_name (pc->data_be), pc->block_sectors, pc->low_water_blocks,
        !pf->zero_new_blocks + !pf->discard_enabled + !pf->discard_passdown
        + pf->read_only + pf->error_if_no_space);
  if (!pf->zero_new_blocks)
    EMIT (" skip_block_zeroing");
  if (!pf->discard_enabled)
    EMIT (" ignore_discard");
  if (!pf->discard_passdown)
    EMIT (" no_discard_passdown");
  if (pf->read_only)
    EMIT (" read_only");
  if (pf->error_if_no_space)
    EMIT (" error_if_no_space");
  return used;
}

/* --- messages --------------------------------------------------------- */

static int
read_dev_id (const char *what, const char *s, uint64_t *id,
             struct mapper_err *err)
{
  if (s == NULL) {
    mapper_err_set (err, "%s: missing device id", what);
    return -EINVAL;
  }
  if (parse_u64 (s, id) < 0 || *id > 0xffffff) {
    mapper_err_set (err, "%s: invalid device id '%s' (0 to 16777215)",
                    what, s);
    return -EINVAL;
  }
  return 0;
}

/* The library's errors, as a person reads them. */
static int
md_msg_error (struct pool *p, const char *what, int r, const char *perr,
              uint64_t id, uint64_t id2, struct mapper_err *err)
{
  switch (r) {
  case -EEXIST:
    mapper_err_set (err, "%s: device %" PRIu64 " already exists", what, id);
    break;
  case -ENODATA:
    mapper_err_set (err, "%s: device %" PRIu64 " does not exist", what,
                    id2 != UINT64_MAX ? id2 : id);
    r = -ENOENT;
    break;
  case -EBUSY:
    mapper_err_set (err, "%s: device %" PRIu64 " is open (a thin target "
                    "uses it): remove that device first", what, id);
    break;
  case -EROFS:
    mapper_err_set (err, "%s: the pool is read-only%s", what,
                    *perr ? ": " : "");
    if (*perr)
      mapper_err_prefix (err, "%s", perr);
    r = -EPERM;
    break;
  default:
    mapper_err_set (err, "%s: %s", what, *perr ? perr
                    : mapper_strerror (-r));
    break;
  }
  (void) p;
  return r;
}

static int pool_message_run (struct pool *p, const char *cmd, char **argv,
                             struct mapper_err *err);

static int
pool_message (struct target *ti, unsigned argc, char **argv, char *reply,
              size_t len, struct mapper_err *err)
{
  struct pool_c *pc = ti->private;
  struct pool *p = pc->pool;
  const char *cmd = argc ? argv[0] : "";
  unsigned want;
  int r;

  if (strcmp (cmd, "create_thin") == 0 || strcmp (cmd, "delete") == 0)
    want = 2;
  else if (strcmp (cmd, "create_snap") == 0 ||
           strcmp (cmd, "set_transaction_id") == 0)
    want = 3;
  else if (strcmp (cmd, "reserve_metadata_snap") == 0 ||
           strcmp (cmd, "release_metadata_snap") == 0)
    want = 1;
  else {
    mapper_err_set (err, "unrecognised message '%s' (expected create_thin, "
                    "create_snap, delete, set_transaction_id, "
                    "reserve_metadata_snap or release_metadata_snap)", cmd);
    return -EINVAL;
  }
  if (argc != want) {
    mapper_err_set (err, "%s takes %u argument%s, got %u", cmd, want - 1,
                    want == 2 ? "" : "s", argc - 1);
    return -EINVAL;
  }
  if (pool_mode (p) == PM_READ_ONLY || pool_mode (p) == PM_FAIL) {
    mapper_err_set (err, "%s: the pool is read-only%s", cmd,
                    atomic_load (&p->commit_failed)
                    ? " (a metadata operation failed: needs_check)" : "");
    return -EPERM;
  }
  /* Without the device's lock and the control export's: the reserve
   * waits for commit_rw and flushes the data device, and so may a
   * commit, which a data device below the pool that is suspended (or a
   * remote one that stalls) holds up until its resume, a control
   * command.  The pool device is busy meanwhile (no other message, no
   * new table).
   */
  target_wait_begin (ti);
  r = pool_message_run (p, cmd, argv, err);
  target_wait_end (ti);
  (void) reply, (void) len;
  return r;
}

/* pool_message's work, argv checked for its length. */
static int
pool_message_run (struct pool *p, const char *cmd, char **argv,
                  struct mapper_err *err)
{
  char perr[PD_ERR_LEN] = "";
  uint64_t id = 0, id2 = UINT64_MAX;
  int r;

  if (strcmp (cmd, "create_thin") == 0) {
    if ((r = read_dev_id (cmd, argv[1], &id, err)) < 0)
      return r;
    r = thin_md_create_thin (p->md, id, perr);
  }
  else if (strcmp (cmd, "create_snap") == 0) {
    if ((r = read_dev_id (cmd, argv[1], &id, err)) < 0 ||
        (r = read_dev_id (cmd, argv[2], &id2, err)) < 0)
      return r;
    /* -ENODATA here is the origin's; -EEXIST the new id's. */
    r = thin_md_create_snap (p->md, id, id2, perr);
  }
  else if (strcmp (cmd, "delete") == 0) {
    if ((r = read_dev_id (cmd, argv[1], &id, err)) < 0)
      return r;
    /* Not under commit_rw: that would wait behind a commit, and this
     * holds the control lock (below).  None of its blocks needs a
     * drain: the device is not open, so no clone of its own is in
     * flight, and a block it frees that an open volume's clone may
     * still reach lost that volume's mapping earlier, by a discard or
     * a break of sharing, whose own release a drain covers.
     */
    r = thin_md_delete (p->md, id, perr);
    if (r == 0)
      pool_released (p);
  }
  else if (strcmp (cmd, "set_transaction_id") == 0) {
    uint64_t cur = 0;
    if (parse_u64 (argv[1], &id) < 0 || parse_u64 (argv[2], &id2) < 0) {
      mapper_err_set (err, "set_transaction_id: invalid transaction id "
                      "'%s' (a non-negative integer)",
                      parse_u64 (argv[1], &id) < 0 ? argv[1] : argv[2]);
      return -EINVAL;
    }
    if ((r = thin_md_get_transaction_id (p->md, &cur)) < 0) {
      mapper_err_set (err, "set_transaction_id: cannot read the "
                      "transaction id: %s", mapper_strerror (-r));
      return r;
    }
    if (cur != id) {
      mapper_err_set (err, "set_transaction_id: the transaction id is %"
                      PRIu64 ", not %" PRIu64, cur, id);
      return -EINVAL;
    }
    r = thin_md_set_transaction_id (p->md, id, id2, perr);
    id2 = UINT64_MAX;
  }
  else if (strcmp (cmd, "reserve_metadata_snap") == 0) {
    /* It commits first: the data device must be flushed before, with no
     * mapping inserted in between.
     */
    pthread_rwlock_wrlock (&p->commit_rw);
    r = target_flush_backend (p->data_be);
    if (r == 0)
      r = thin_md_reserve_metadata_snap (p->md, perr);
    pthread_rwlock_unlock (&p->commit_rw);
  }
  else
    r = thin_md_release_metadata_snap (p->md, perr);

  if (r < 0 && *cmd == 'r' && *perr) {
    /* reserve_/release_metadata_snap: the library says it best. */
    mapper_err_set (err, "%s: %s", cmd, perr);
    return r;
  }
  if (r < 0) {
    int m = md_msg_error (p, cmd, r, perr, id, id2, err);
    if (r != -EEXIST && r != -ENODATA && r != -EBUSY && r != -EINVAL &&
        r != -ENOSPC && r != -EROFS)
      pool_md_failed (p, cmd, r, perr);
    return m;
  }
  /* dm commits after every message; if that would wait (for fast-path
   * I/O to drain, or for a write holding commit_rw), the pool's commit
   * thread does it once that is done.  Messages run under the control
   * lock, which a resume of the device holding that I/O (a suspended
   * data device) needs.
   */
  if ((r = pool_commit_how (p, COMMIT_TRY)) < 0 && r != -EAGAIN) {
    mapper_err_set (err, "%s: committing the metadata failed: the pool is "
                    "read-only now (needs_check)", cmd);
    return r;
  }
  check_low_water (p);
  return 0;
}

/* --- constructor ------------------------------------------------------ */

static const struct target_arg block_arg = { "data block size", "sectors",
                                             128, 2097152 };
static const struct target_arg low_water_arg = { "low water mark", "blocks",
                                                 0, UINT64_MAX };

static int
pool_ctr (struct target *ti, unsigned argc, char **argv,
          struct mapper_err *err)
{
  struct target_args as = { argc, argv }, features;
  const char *md_spec, *data_spec, *arg;
  uint64_t bs, lw, md_size;
  struct pool_c *pc;
  int r;

  if (argc < 4) {
    mapper_err_set (err, "expected <metadata dev> <data dev> <data block "
                    "size> <low water mark> [<#features> <feature>...], got "
                    "%u argument%s", argc, argc == 1 ? "" : "s");
    return -EINVAL;
  }
  md_spec = target_shift_arg (&as);
  data_spec = target_shift_arg (&as);
  if ((r = target_read_arg (&block_arg, &as, &bs, err)) < 0)
    return r;
  if (bs % 128 != 0) {
    mapper_err_set (err, "data block size %" PRIu64 " sectors is not a "
                    "multiple of 128 sectors (64 KiB)", bs);
    return -EINVAL;
  }
  if ((r = target_read_arg (&low_water_arg, &as, &lw, err)) < 0)
    return r;

  pc = calloc (1, sizeof *pc);
  if (pc == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  ti->private = pc;
  pc->block_sectors = bs;
  pc->low_water_blocks = lw;
  pc->pf = (struct pool_features) { .zero_new_blocks = true,
                                    .discard_enabled = true,
                                    .discard_passdown = true };
  if (as.argc > 0) {
    if ((r = target_read_group ("feature argument", 0, 5, true, &as,
                                &features, err)) < 0)
      goto fail;
    while ((arg = target_shift_arg (&features)) != NULL) {
      if (strcmp (arg, "skip_block_zeroing") == 0)
        pc->pf.zero_new_blocks = false;
      else if (strcmp (arg, "ignore_discard") == 0)
        pc->pf.discard_enabled = false;
      else if (strcmp (arg, "no_discard_passdown") == 0)
        pc->pf.discard_passdown = false;
      else if (strcmp (arg, "read_only") == 0)
        pc->pf.read_only = true;
      else if (strcmp (arg, "error_if_no_space") == 0)
        pc->pf.error_if_no_space = true;
      else {
        mapper_err_set (err, "unrecognised pool feature '%s' (expected "
                        "skip_block_zeroing, ignore_discard, "
                        "no_discard_passdown, read_only or "
                        "error_if_no_space)", arg);
        r = -EINVAL;
        goto fail;
      }
    }
  }

  pc->nr_blocks = ti->len / ((uint64_t) bs << MAPPER_SECTOR_SHIFT);
  if (pc->nr_blocks == 0) {
    mapper_err_set (err, "the pool (%" PRIu64 " sectors) is smaller than "
                    "one data block (%" PRIu64 " sectors)",
                    ti->len >> MAPPER_SECTOR_SHIFT, bs);
    r = -EINVAL;
    goto fail;
  }
  r = target_get_backend (ti, md_spec, 0, 0, &pc->md_be, err);
  if (r < 0) {
    mapper_err_prefix (err, "metadata device");
    goto fail;
  }
  r = target_get_backend (ti, data_spec, 0, ti->len, &pc->data_be, err);
  if (r < 0) {
    mapper_err_prefix (err, "data device");
    goto fail;
  }
  if (pc->md_be == pc->data_be) {
    mapper_err_set (err, "the metadata and data devices are the same (%s)",
                    md_spec);
    r = -EINVAL;
    goto fail;
  }
  if ((r = target_backend_size (pc->md_be, &md_size)) < 0) {
    mapper_err_set (err, "metadata device %s: cannot get its size: %s",
                    md_spec, mapper_strerror (-r));
    goto fail;
  }
  if (md_size < 2 * 4096) {
    mapper_err_set (err, "metadata device %s is too small (%" PRIu64
                    " bytes; a pool needs a few MiB)", md_spec, md_size);
    r = -EINVAL;
    goto fail;
  }
  if ((r = pool_find_or_create (pc, md_size & ~4095ULL, err)) < 0 ||
      (r = committer_start (pc->pool, err)) < 0)
    goto fail;
  return 0;

 fail:
  pool_dtr (ti);
  ti->private = NULL;
  return r;
}

static int
pool_iterate_backends (struct target *ti,
                       int (*fn) (struct target *, struct backend *, void *),
                       void *data)
{
  struct pool_c *pc = ti->private;
  int r = fn (ti, pc->md_be, data);

  return r ? r : fn (ti, pc->data_be, data);
}

const struct target_type thin_pool_target = {
  .name = "thin-pool",
  .version = { 1, 23, 0 },
  .ctr = pool_ctr,
  .dtr = pool_dtr,
  .map = pool_map,
  .extents = pool_extents,
  .status = pool_status,
  .iterate_backends = pool_iterate_backends,
  .flush = pool_flush,
  .presuspend = pool_presuspend,
  .resume = pool_resume,
  .postsuspend = pool_postsuspend,
  .message = pool_message,
  .start = pool_type_start,
  .stop = pool_type_stop,
};

/* SPDX-License-Identifier: BSD-3-Clause */
/* clone <metadata dev> <destination dev> <source dev> <region size>
 *       [<#features> [no_hydration] [no_discard_passdown]]
 *       [<#core args> [hydration_threshold N] [hydration_batch_size N]]
 *
 * dm-clone: the device shows the source (read-only) at once, copies it
 * region by region to the destination in the background (hydration),
 * and sends I/O of hydrated regions to the destination.  Which regions
 * are hydrated is kept in the metadata device in dm-clone's on-disk
 * format (server/pdata/clone-metadata.h).
 *
 * - A read of an unhydrated region is a clone to the source, of a
 *   hydrated one to the destination (no copy through the server).
 * - A write (or zero) to an unhydrated region copies that region first,
 *   in map(), unless it covers the whole region: then it goes straight
 *   to the destination and its completion marks the region hydrated.
 *   A region being copied or overwritten so is "busy" (dm's bio prison
 *   cell): a client write to it, and the background worker, wait.
 * - The workers (up to CLONE_WORKERS threads, while the table is live)
 *   copy the first unhydrated regions, hydration_batch_size contiguous
 *   ones at a time, at most hydration_threshold regions at once, as
 *   dm's do_hydration; ranges the source reports as holes or zeros are
 *   zeroed on the destination (MAY_TRIM: it stays sparse), not copied.
 * - Discards mark their whole regions hydrated and pass down to the
 *   destination unless no_discard_passdown; partial regions are left.
 *   In fail mode a discard of regions not all hydrated is ignored (dm).
 * - Commit (dm's commit_metadata): the regions hydrated since the last
 *   one are taken, the destination flushed, then those bits committed;
 *   so a committed region's copy is durable, and a client write ordered
 *   after its region's copy cannot be overwritten by a copy after a
 *   crash (the region is then either committed hydrated, or the write
 *   was never flushed).  On a client flush, after a FUA write to a
 *   region not committed hydrated, and once a second from worker 0.
 *
 * The state (struct clone_state) belongs to the metadata backend, not
 * to a table: a reload of the device with another clone table on the
 * same metadata (new core args) keeps the in-core bitmap and the busy
 * regions, as thin-pool keys its pool by its metadata device.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "target.h"
#include "util.h"
#include "pdata/clone-metadata.h"
#include "pdata-dev.h"

#define MIN_REGION_SECTORS 8ull           /* 4 KiB */
#define MAX_REGION_SECTORS 2097152ull     /* 1 GiB */
#define MAX_REGIONS (1ull << 32)
#define CLONE_WORKERS 4
#define COPY_CHUNK (4u << 20)
#define EXTENTS_WINDOW (256ull << 20)   /* asked for ahead (copy_range) */
#define COMMIT_PERIOD_NS 1000000000ULL
#define CLONE_CACHE_BLOCKS 256
/* A remove or a server stop waits this long for a commit (the last
 * one's included) before it gives up its destination flush: a
 * destination that stopped answering would otherwise hold it until the
 * remote request timeout.
 */
#define STOP_GRACE_NS (5 * COMMIT_PERIOD_NS)

struct clone_c;

/* One metadata device's clone (dm's struct clone minus its table). */
struct clone_state {
  struct clone_state *next;       /* states (states_lock) */
  unsigned refs;                  /* tables naming it (states_lock) */
  struct backend *md_be;          /* held */
  struct backend *dest_be;        /* the first table's: identity only */
  struct pd_blockdev pdev;
  struct clone_md *md;
  uint64_t len, region_bytes, region_sectors, nr_regions, nr_words;
  uint64_t nr_sum;                /* words of dirty_sum, commit_sum */

  pthread_mutex_t lock;           /* everything below */
  pthread_cond_t cond;            /* busy cleared, work, stop */
  uint64_t *map;                  /* hydrated (in core) */
  uint64_t *cmap;                 /* hydrated at the last commit */
  uint64_t *busy;                 /* being copied or overwritten */
  uint64_t *dirty;                /* hydrated since the last pre-commit */
  /* Which words of dirty have a bit set (bit w % 64 of word w / 64), as
   * dm-clone-metadata's dirty_words: a commit touches the words that
   * changed, not every word of the bitmap (three times over).
   */
  uint64_t *dirty_sum;
  uint64_t nr_dirty;              /* bits set in dirty */
  uint64_t nr_hydrated;
  unsigned hydrating;             /* regions the workers copy now */
  uint64_t cursor;                /* where the workers look next */
  bool done_reported;
  _Atomic bool failed;            /* metadata failed: Fail (map reads it
                                   * unlocked) */
  struct clone_c *bound;          /* the live target, while resumed */
  bool stop;                      /* workers: exit */
  bool final_commit;              /* ...worker 0 after a last commit */
  bool final_done;                /* it made that commit (or gave up) */
  bool stop_committed;            /* the engine's stop committed: the
                                   * dtr does not (the I/O loop is gone) */
  unsigned nr_workers;
  pthread_t workers[CLONE_WORKERS];
  _Atomic unsigned running;       /* workers that found themselves and
                                   * have not exited */
  _Atomic bool cancel;            /* workers' request_wait_cancel */
  uint64_t last_commit_ns;
  bool flushing;                  /* a commit's destination flush is out */
  bool md_io;                     /* a commit writes the metadata */
  struct backend *flush_be;       /* ...on this backend */
  _Atomic bool commit_cancel;     /* a stop gave commits up (until the
                                   * next start of the workers) */

  pthread_mutex_t commit_lock;    /* one commit at a time */
  uint64_t *commit_words;         /* the commit's snapshot of dirty... */
  uint64_t *commit_sum;           /* ...where commit_sum says (swapped
                                   * with dirty_sum at each commit) */
};

/* One clone target: its table's arguments and what messages change. */
struct clone_c {
  struct clone_state *s;
  struct target *ti;
  struct backend *md_be, *dest_be, *src_be;
  uint64_t region_sectors;
  bool no_discard_passdown;
  _Atomic bool hydration_enabled;
  _Atomic unsigned threshold, batch;
  char *args;                     /* the arguments after the region size */
};

static pthread_mutex_t states_lock = PTHREAD_MUTEX_INITIALIZER;
static struct clone_state *states;

static inline bool
bit_test (const uint64_t *m, uint64_t i)
{
  return __atomic_load_n (&m[i / 64], __ATOMIC_ACQUIRE) >> (i % 64) & 1;
}

static inline void
bit_set (uint64_t *m, uint64_t i)
{
  __atomic_fetch_or (&m[i / 64], 1ull << (i % 64), __ATOMIC_RELEASE);
}

static inline void
bit_clear (uint64_t *m, uint64_t i)
{
  __atomic_fetch_and (&m[i / 64], ~(1ull << (i % 64)), __ATOMIC_RELEASE);
}

/* --- metadata ----------------------------------------------------------- */

/* The metadata device's I/O (pdata-dev.c's, but owned by the state, the
 * opaque): a stop past its grace gives up a commit hung in it
 * (wait_workers, while md_io is set), as it gives up the destination's
 * flush.
 */
static int
md_read (void *opaque, uint64_t offset, size_t len, void *buf)
{
  struct clone_state *s = opaque;

  return io_sync_owned (IO_READ, s->md_be, offset, len, buf, 0, s);
}

static int
md_write (void *opaque, uint64_t offset, size_t len, const void *buf)
{
  struct clone_state *s = opaque;

  /* io_sync does not write through buf; its type is shared with reads. */
  return io_sync_owned (IO_WRITE, s->md_be, offset, len, (char *) buf, 0,
                        s);
}

static int
md_flush (void *opaque)
{
  struct clone_state *s = opaque;

  return io_flush_backend_owned (s->md_be, s);
}

static const struct pd_blockdev_ops clone_pd_ops = {
  .read = md_read, .write = md_write, .flush = md_flush,
};


/* The first word at or after *w whose bit is set in summary sum (nr_sum
 * words), into *w: false if there is none.
 */
static inline bool
sum_next (const uint64_t *sum, uint64_t nr_sum, uint64_t *w)
{
  uint64_t sw = *w / 64, m;

  if (sw >= nr_sum)
    return false;
  m = sum[sw] & (~0ull << (*w % 64));
  while (m == 0) {
    if (++sw >= nr_sum)
      return false;
    m = sum[sw];
  }
  *w = sw * 64 + __builtin_ctzll (m);
  return true;
}

/* Mark regions [r, r+n) hydrated (s->lock held). */
static void
mark_hydrated_locked (struct clone_state *s, uint64_t r, uint64_t n)
{
  for (uint64_t i = r; i < r + n; i++)
    if (!bit_test (s->map, i)) {
      bit_set (s->map, i);
      bit_set (s->dirty, i);
      s->dirty_sum[i / 4096] |= 1ull << (i / 64 % 64);
      s->nr_dirty++;
      s->nr_hydrated++;
    }
}

/* dm's commit_metadata: take what was hydrated so far, flush c's
 * destination, commit those bits.  0, or -EIO with the state failed, or
 * -ESHUTDOWN when a stop gave the flush up (nothing committed, those
 * regions dirty again).
 */
static int
clone_commit (struct clone_state *s, struct clone_c *c)
{
  char err[PD_ERR_LEN] = "";
  bool any = false, was, given_up;
  int r = 0;

  pthread_mutex_lock (&s->commit_lock);
  pthread_mutex_lock (&s->lock);
  /* Even when failed: worker 0 commits when this is a period old. */
  s->last_commit_ns = monotonic_ns ();
  if (s->failed) {
    pthread_mutex_unlock (&s->lock);
    pthread_mutex_unlock (&s->commit_lock);
    return -EIO;
  }
  /* Only the words that changed (dirty_sum), and nothing at all for a
   * clone that hydrated nothing since.
   */
  any = s->nr_dirty != 0;
  if (any) {
    uint64_t *t = s->commit_sum;

    for (uint64_t w = 0; sum_next (s->dirty_sum, s->nr_sum, &w); w++) {
      s->commit_words[w] = s->dirty[w];
      s->dirty[w] = 0;
    }
    s->commit_sum = s->dirty_sum;
    s->dirty_sum = t;
    memset (s->dirty_sum, 0, s->nr_sum * sizeof *s->dirty_sum);
  }
  s->nr_dirty = 0;
  pthread_mutex_unlock (&s->lock);
  if (!any)
    goto out;
  /* The copies (and overwrites) of those regions durable first: a
   * flush that s owns when it starts one, which a stop can give up
   * (backend_abandon, wait_workers), and that the flush bookkeeping
   * counts, so that the client flush beside a commit skips a clean
   * destination (one flush per backend, as dm's dest_dev_flushed).
   */
  pthread_mutex_lock (&s->lock);
  given_up = atomic_load (&s->commit_cancel);
  if (!given_up) {
    s->flushing = true;
    s->flush_be = c->dest_be;
  }
  pthread_mutex_unlock (&s->lock);
  if (!given_up) {
    r = io_flush_backend_owned (c->dest_be, s);
    pthread_mutex_lock (&s->lock);
    s->flushing = false;
    pthread_cond_broadcast (&s->cond);
    pthread_mutex_unlock (&s->lock);
    given_up = r < 0 && (r == -ESHUTDOWN || atomic_load (&s->commit_cancel));
  }
  if (given_up)
    goto give_up;
  if (r < 0) {
    snprintf (err, sizeof err, "flush of the destination: %s",
              mapper_strerror (-r));
    goto failed;
  }
  pthread_mutex_lock (&s->lock);
  s->md_io = true;
  pthread_mutex_unlock (&s->lock);
  for (uint64_t w = 0; r == 0 && sum_next (s->commit_sum, s->nr_sum, &w);
       w++)
    r = clone_md_set_bits (s->md, w, s->commit_words[w], err);
  if (r == 0)
    r = clone_md_commit (s->md, err);
  pthread_mutex_lock (&s->lock);
  s->md_io = false;
  pthread_cond_broadcast (&s->cond);
  pthread_mutex_unlock (&s->lock);
  if (r < 0 && atomic_load (&s->commit_cancel))
    goto md_given_up;
  if (r < 0)
    goto failed;
  pthread_mutex_lock (&s->lock);
  for (uint64_t w = 0; sum_next (s->commit_sum, s->nr_sum, &w); w++)
    s->cmap[w] |= s->commit_words[w];
  pthread_mutex_unlock (&s->lock);
 out:
  pthread_mutex_unlock (&s->commit_lock);
  return 0;
 give_up:
  /* Not a failure of the destination's (it may answer yet): nothing is
   * committed, and those regions are dirty again for the next commit (a
   * resume's), or copied again after a restart.
   */
  pthread_mutex_lock (&s->lock);
  for (uint64_t w = 0; sum_next (s->commit_sum, s->nr_sum, &w); w++) {
    s->nr_dirty += __builtin_popcountll (s->commit_words[w] & ~s->dirty[w]);
    s->dirty[w] |= s->commit_words[w];
    s->dirty_sum[w / 64] |= 1ull << (w % 64);
  }
  pthread_mutex_unlock (&s->lock);
  pthread_mutex_unlock (&s->commit_lock);
  return -ESHUTDOWN;
 md_given_up:
  /* A stop gave up the metadata's I/O: on the device, the last commit
   * (its superblock goes last, after a flush; blocks it may have written
   * are ones that commit does not use), or this one should a write it
   * gave up land after all.  In core, the metadata is half way through a
   * commit: nothing more is committed (fail mode, without the event: the
   * device is going, and nothing failed that it reported).
   */
  pthread_mutex_lock (&s->lock);
  s->failed = true;
  pthread_mutex_unlock (&s->lock);
  pthread_mutex_unlock (&s->commit_lock);
  if (mapper_log)
    mapper_log ("clone: %s: a stop gave up a metadata commit: %s",
                backend_name (s->md_be), *err ? err : mapper_strerror (-r));
  return -ESHUTDOWN;
 failed:
  /* Those regions stay hydrated in core (their data is on the
   * destination, or lost with the flush), but nothing more is committed.
   * Failed before commit_lock goes: a commit waiting for it would find
   * dirty empty (its bits were in this one) and report success.
   */
  pthread_mutex_lock (&s->lock);
  was = s->failed;
  s->failed = true;
  pthread_mutex_unlock (&s->lock);
  pthread_mutex_unlock (&s->commit_lock);
  if (!was)
    target_event (c->ti, "metadata commit failed: %s: switching to fail "
                  "mode", *err ? err : mapper_strerror (-r));
  return -EIO;
}

/* --- copying ------------------------------------------------------------ */

struct seg { uint64_t off, len; bool zero; };
struct segs { struct seg v[64]; unsigned n; };

static int
seg_fn (void *opaque, uint64_t offset, uint64_t length, uint32_t type)
{
  struct segs *ss = opaque;
  bool zero = (type & (MAPPER_EXTENT_HOLE | MAPPER_EXTENT_ZERO)) != 0;

  if (ss->n && ss->v[ss->n - 1].zero == zero &&
      ss->v[ss->n - 1].off + ss->v[ss->n - 1].len == offset) {
    ss->v[ss->n - 1].len += length;
    return 0;
  }
  if (ss->n == ARRAY_SIZE (ss->v))
    return 1;                   /* enough: the rest is asked again */
  ss->v[ss->n++] = (struct seg) { offset, length, zero };
  return 0;
}

/* Does ss (one extents answer) describe all of [off, off+n)? */
static bool
segs_cover (const struct segs *ss, uint64_t off, uint64_t n)
{
  return ss->n > 0 && ss->v[0].off <= off &&
    off + n <= ss->v[ss->n - 1].off + ss->v[ss->n - 1].len;
}

/* Copy [off, off+len) from the source to the destination, zeroing on the
 * destination what the source reports as holes or zeros (so a sparse
 * source leaves a sparse destination).  buf: COPY_CHUNK bytes.  Its I/O
 * is owned by s: a stop past its grace gives it up (wait_workers), so a
 * destination (or source) that stopped answering does not hold a remove
 * or the server's exit for the remote request timeout; a copy given up
 * fails (its regions are not hydrated).
 *
 * known (a worker's; NULL: none) keeps the last extents answer, asked
 * for EXTENTS_WINDOW ahead, for the next copies it covers: the source
 * does not change under a clone, and one query may cost its server a
 * walk to the next hole (tmpfs's SEEK_HOLE walks the page cache: asked
 * every 4 MiB of a large written file, that was the most of a source
 * nbdkit's CPU).
 */
static int
copy_range (struct clone_c *c, char *buf, uint64_t off, uint64_t len,
            struct segs *known)
{
  struct clone_state *s = c->s;
  const struct mapper_caps *dcaps = backend_caps (c->dest_be);
  uint64_t end = off + len;
  struct segs local, none;
  uint64_t window = known ? EXTENTS_WINDOW : 0;
  int r;

  if (known == NULL) {
    none.n = 0;
    known = &none;
  }
  while (off < end) {
    uint64_t n = MIN (end - off, (uint64_t) COPY_CHUNK), cend = off + n;
    struct segs *ss = known;

    if (!segs_cover (known, off, n)) {
      known->n = 0;
      r = backend_extents (c->src_be, off,
                           MAX (n, MIN (window, s->len - off)),
                           false, seg_fn, known);
      if (r < 0 || known->n == 0 || known->v[0].off > off) {
        /* No answer: all data, and nothing kept. */
        known->n = 0;
        local.n = 1;
        local.v[0] = (struct seg) { off, n, false };
        ss = &local;
      }
    }
    /* Never past cend: known goes on beyond this chunk (and the copy). */
    for (unsigned i = 0; i < ss->n && off < cend; i++) {
      uint64_t a = MAX (ss->v[i].off, off);
      uint64_t b = MIN (ss->v[i].off + ss->v[i].len, cend);

      if (a >= b)
        continue;
      if (ss->v[i].zero && dcaps->can_zero)
        r = io_sync_owned (IO_ZERO, c->dest_be, a, b - a, NULL,
                           MAPPER_MAY_TRIM, s);
      else if (ss->v[i].zero) {
        memset (buf, 0, b - a);
        r = io_sync_owned (IO_WRITE, c->dest_be, a, b - a, buf, 0, s);
      }
      else if ((r = io_sync_owned (IO_READ, c->src_be, a, b - a, buf, 0,
                                   s)) == 0)
        r = io_sync_owned (IO_WRITE, c->dest_be, a, b - a, buf, 0, s);
      if (r < 0)
        return r;
      off = b;
    }
  }
  return 0;
}

static void
region_range (struct clone_state *s, uint64_t r, uint64_t n, uint64_t *off,
              uint64_t *len)
{
  *off = r * s->region_bytes;
  *len = MIN ((r + n) * s->region_bytes, s->len) - *off;
}

/* --- the workers ---------------------------------------------------------- */

static void
report_done_locked (struct clone_state *s, struct clone_c *c)
{
  if (s->nr_hydrated == s->nr_regions && !s->done_reported) {
    s->done_reported = true;
    pthread_mutex_unlock (&s->lock);
    /* Complete only once committed: a failed commit raised its own
     * event (fail mode).
     */
    if (clone_commit (s, c) == 0)
      target_event (c->ti, "hydration complete: %" PRIu64 " regions",
                    s->nr_regions);
    pthread_mutex_lock (&s->lock);
  }
}

/* The next run of regions to hydrate (lock held): 0 regions if none. */
static uint64_t
next_run (struct clone_state *s, struct clone_c *c, uint64_t *start)
{
  unsigned threshold = atomic_load (&c->threshold);
  uint64_t max = MIN ((uint64_t) atomic_load (&c->batch),
                      threshold > s->hydrating ? threshold - s->hydrating : 0);
  uint64_t r, n;

  if (max == 0)
    return 0;
  for (unsigned pass = 0; pass < 2; pass++) {
    for (r = pass ? 0 : s->cursor; r < s->nr_regions; r++) {
      uint64_t w = r / 64;
      if (r % 64 == 0 && (s->map[w] | s->busy[w]) == ~0ull) {
        r += 63;
        continue;
      }
      if (!bit_test (s->map, r) && !bit_test (s->busy, r))
        break;
    }
    if (r < s->nr_regions)
      break;
  }
  if (r >= s->nr_regions)
    return 0;
  for (n = 1; n < max && r + n < s->nr_regions; n++)
    if (bit_test (s->map, r + n) || bit_test (s->busy, r + n))
      break;
  *start = r;
  return n;
}

/* Which state's worker this thread is (mapper_thread_create passes no
 * argument): its creator holds states_lock until workers[] is filled.
 */
static struct clone_state *
find_my_state (unsigned *me)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&states_lock);

  for (struct clone_state *s = states; s; s = s->next)
    for (unsigned i = 0; i < CLONE_WORKERS; i++)
      if (pthread_equal (s->workers[i], pthread_self ())) {
        *me = i;
        atomic_fetch_add (&s->running, 1);
        return s;
      }
  return NULL;
}

static void *
clone_worker (void *arg)
{
  char *buf = NULL;             /* only while there is copying to do */
  /* The source's extents, ahead: a table's own (a new table is new
   * workers, as they stop at postsuspend).
   */
  struct segs known = { .n = 0 };
  struct clone_state *s;
  unsigned me;

  if ((s = find_my_state (&me)) == NULL)
    return NULL;
  pthread_mutex_lock (&s->lock);
  while (!s->stop) {
    struct clone_c *c = s->bound;
    uint64_t r, n = 0, off, len, now = monotonic_ns ();
    struct timespec ts;
    int e;

    if (me == 0 && now - s->last_commit_ns >= COMMIT_PERIOD_NS) {
      pthread_mutex_unlock (&s->lock);
      clone_commit (s, c);
      pthread_mutex_lock (&s->lock);
      continue;
    }
    if (!s->failed && atomic_load (&c->hydration_enabled) &&
        s->nr_hydrated < s->nr_regions)
      n = next_run (s, c, &r);
    if (n > 0 && buf == NULL &&
        (buf = aligned_alloc (4096, COPY_CHUNK)) == NULL)
      n = 0;                    /* out of memory: try again later */
    if (n == 0) {
      /* Hydrated for good: only worker 0 (the periodic commit) stays,
       * without its copy buffer, so a hydrated clone costs one sleeping
       * thread, not four and 16 MiB.  stop_workers still joins the
       * others.
       */
      if (s->nr_hydrated == s->nr_regions) {
        if (me != 0)
          break;
        free (buf);
        buf = NULL;
      }
      clock_gettime (CLOCK_MONOTONIC, &ts);
      ts.tv_sec += 1;
      pthread_cond_timedwait (&s->cond, &s->lock, &ts);
      continue;
    }
    for (uint64_t i = r; i < r + n; i++)
      bit_set (s->busy, i);
    s->hydrating += n;
    s->cursor = r + n;
    pthread_mutex_unlock (&s->lock);

    region_range (s, r, n, &off, &len);
    request_wait_cancel = &s->cancel;
    e = copy_range (c, buf, off, len, &known);
    request_wait_cancel = NULL;

    pthread_mutex_lock (&s->lock);
    if (e == 0)
      mark_hydrated_locked (s, r, n);
    for (uint64_t i = r; i < r + n; i++)
      bit_clear (s->busy, i);
    s->hydrating -= n;
    pthread_cond_broadcast (&s->cond);
    if (e < 0 && e != -ESHUTDOWN && !s->stop) {
      /* dm stops hydrating on a copy error; client I/O goes on. */
      atomic_store (&c->hydration_enabled, false);
      pthread_mutex_unlock (&s->lock);
      target_event (c->ti, "hydration of regions %" PRIu64 "-%" PRIu64
                    " failed: %s: hydration disabled (enable_hydration "
                    "retries)", r, r + n - 1, mapper_strerror (-e));
      pthread_mutex_lock (&s->lock);
    }
    report_done_locked (s, c);
  }
  /* A stop that asked for it: the last commit, from here so that the
   * stopper can give it up (wait_workers) instead of waiting in it.
   */
  if (me == 0 && s->final_commit && s->bound) {
    struct clone_c *c = s->bound;

    pthread_mutex_unlock (&s->lock);
    clone_commit (s, c);
    pthread_mutex_lock (&s->lock);
    s->final_done = true;
  }
  atomic_fetch_sub (&s->running, 1);
  pthread_cond_broadcast (&s->cond);
  pthread_mutex_unlock (&s->lock);
  free (buf);
  return NULL;
}

/* Wait until s's workers have exited (their joins are then quick).
 * grace_ns: after that long, give up the commit in flight (its
 * destination flush or its metadata I/O: backend_abandon), any later
 * one, and the copies under way; 0: wait as long as it takes.
 */
static void
wait_workers (struct clone_state *s, uint64_t grace_ns)
{
  uint64_t deadline = grace_ns ? monotonic_ns () + grace_ns : 0;

  pthread_mutex_lock (&s->lock);
  while (atomic_load (&s->running) > 0) {
    uint64_t until = monotonic_ns () + 100000000;
    struct timespec ts;

    if (deadline && monotonic_ns () >= deadline) {
      atomic_store (&s->commit_cancel, true);
      if (s->flushing) {
        struct backend *be = s->flush_be;

        pthread_mutex_unlock (&s->lock);
        /* Again each turn: the flush may not have been sent yet. */
        backend_abandon (be, s);
        pthread_mutex_lock (&s->lock);
      }
      if (s->md_io) {
        pthread_mutex_unlock (&s->lock);
        backend_abandon (s->md_be, s);
        pthread_mutex_lock (&s->lock);
      }
      /* Copies under way (copy_range's I/O, s's): a hung write to the
       * destination or read from the source.  The bound target stays
       * through the stop.
       */
      if (s->hydrating > 0 && s->bound) {
        struct backend *dest = s->bound->dest_be, *src = s->bound->src_be;

        pthread_mutex_unlock (&s->lock);
        backend_abandon (dest, s);
        backend_abandon (src, s);
        pthread_mutex_lock (&s->lock);
      }
    }
    ts.tv_sec = until / 1000000000;
    ts.tv_nsec = until % 1000000000;
    pthread_cond_timedwait (&s->cond, &s->lock, &ts);
  }
  pthread_mutex_unlock (&s->lock);
}

/* Stop the workers of s (and wait for them); the bound target stays.
 * final: worker 0 commits once more before it exits (final_done says
 * whether it did).  grace_ns: see wait_workers.
 */
static void
stop_workers (struct clone_state *s, bool final, uint64_t grace_ns)
{
  pthread_t ws[CLONE_WORKERS];
  unsigned n;

  /* workers[] cleared before the joins free those ids: a thread started
   * for another state may get one again, and must not find itself here
   * (find_my_state; one still looking finds nothing and exits).
   */
  pthread_mutex_lock (&states_lock);
  pthread_mutex_lock (&s->lock);
  n = s->nr_workers;
  memcpy (ws, s->workers, sizeof ws);
  memset (s->workers, 0, sizeof s->workers);
  s->nr_workers = 0;
  s->stop = true;
  s->final_commit = final;
  s->final_done = false;
  atomic_store (&s->cancel, true);
  pthread_cond_broadcast (&s->cond);
  pthread_mutex_unlock (&s->lock);
  pthread_mutex_unlock (&states_lock);
  wait_workers (s, grace_ns);
  for (unsigned i = 0; i < n; i++)
    pthread_join (ws[i], NULL);
  pthread_mutex_lock (&s->lock);
  s->stop = false;
  s->final_commit = false;
  atomic_store (&s->cancel, false);
  pthread_mutex_unlock (&s->lock);
}

static bool engine_up;          /* between the type's start and stop */

/* Start s's workers (states_lock and s->lock held). */
static void
start_workers_locked (struct clone_state *s)
{
  s->last_commit_ns = monotonic_ns ();
  /* Commits given up at a stop are tried again from here on. */
  atomic_store (&s->commit_cancel, false);
  s->stop_committed = false;
  for (unsigned i = s->nr_workers; i < CLONE_WORKERS; i++) {
    /* workers[i] is set before the thread looks for itself: it waits
     * for states_lock, held here (find_my_state).
     */
    int e = mapper_thread_create (&s->workers[i], clone_worker,
                                  "mapper-clone");
    if (e != 0) {
      if (mapper_log)
        mapper_log ("clone: %s: cannot start a hydration thread: %s",
                    backend_name (s->md_be), mapper_strerror (e));
      break;
    }
    s->nr_workers++;
  }
}

/* Is c the target s runs for (with its workers, if running)? */
static bool
is_bound (struct clone_state *s, struct clone_c *c, bool running)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&s->lock);

  return s->bound == c && (!running || s->nr_workers > 0);
}

static void
clone_resume (struct target *ti)
{
  struct clone_c *c = ti->private;
  struct clone_state *s = c->s;
  bool up;

  if (is_bound (s, c, true))
    return;
  stop_workers (s, false, 0);   /* another table's (a replace) */
  pthread_mutex_lock (&states_lock);
  up = engine_up;
  pthread_mutex_lock (&s->lock);
  s->bound = c;
  if (up)
    start_workers_locked (s);
  pthread_mutex_unlock (&s->lock);
  pthread_mutex_unlock (&states_lock);
}

/* Stop c's workers and commit, then unbind c.  grace_ns: see
 * wait_workers (the commit is worker 0's, if it runs).
 */
static void
unbind (struct clone_c *c, uint64_t grace_ns)
{
  struct clone_state *s = c->s;
  bool done;

  if (!is_bound (s, c, false))
    return;
  stop_workers (s, true, grace_ns);
  pthread_mutex_lock (&s->lock);
  done = s->final_done || s->stop_committed;
  pthread_mutex_unlock (&s->lock);
  /* No worker ran (the engine not started) to commit. */
  if (!done)
    clone_commit (s, c);
  pthread_mutex_lock (&s->lock);
  s->bound = NULL;
  pthread_mutex_unlock (&s->lock);
}

/* dm's postsuspend commits: a suspended clone's hydrated regions are on
 * disk, and the next table (linear on the destination) may go.  As long
 * as that takes, as a suspend's flush of the backends does.
 */
static void
clone_postsuspend (struct target *ti)
{
  unbind (ti->private, 0);
}

/* Tables resumed before the engine started get their workers now. */
static int
clone_type_start (struct mapper_err *err)
{
  pthread_mutex_lock (&states_lock);
  engine_up = true;
  for (struct clone_state *s = states; s; s = s->next) {
    pthread_mutex_lock (&s->lock);
    if (s->bound && s->nr_workers == 0)
      start_workers_locked (s);
    pthread_mutex_unlock (&s->lock);
  }
  pthread_mutex_unlock (&states_lock);
  return 0;
}

/* Stop every clone's workers and commit, while the I/O loop (a remote
 * source or destination) still runs.
 */
static void
clone_type_stop (void)
{
  pthread_mutex_lock (&states_lock);
  engine_up = false;
  for (struct clone_state *s = states; s; s = s->next) {
    struct clone_c *c;

    s->refs++;
    pthread_mutex_unlock (&states_lock);
    /* Bounded: a destination that stopped answering does not hold the
     * server's exit for the remote request timeout.
     */
    stop_workers (s, true, STOP_GRACE_NS);
    pthread_mutex_lock (&s->lock);
    c = s->final_done ? NULL : s->bound;
    /* The tables' dtrs (after the I/O loop stopped) commit no more. */
    s->stop_committed = true;
    pthread_mutex_unlock (&s->lock);
    if (c)
      clone_commit (s, c);
    pthread_mutex_lock (&states_lock);
    s->refs--;
  }
  pthread_mutex_unlock (&states_lock);
}

/* --- states ------------------------------------------------------------- */

static void
state_free (struct clone_state *s)
{
  if (s->md)
    clone_md_close (s->md);
  free (s->map);
  free (s->cmap);
  free (s->busy);
  free (s->dirty);
  free (s->dirty_sum);
  free (s->commit_words);
  free (s->commit_sum);
  pthread_cond_destroy (&s->cond);
  pthread_mutex_destroy (&s->lock);
  pthread_mutex_destroy (&s->commit_lock);
  target_backend_put (s->md_be);
  free (s);
}

static void
state_put (struct clone_state *s)
{
  struct clone_state **pp;

  pthread_mutex_lock (&states_lock);
  if (--s->refs > 0) {
    pthread_mutex_unlock (&states_lock);
    return;
  }
  for (pp = &states; *pp != s; pp = &(*pp)->next)
    ;
  *pp = s->next;
  pthread_mutex_unlock (&states_lock);
  state_free (s);
}

/* The state of c's metadata device: found (same geometry) or made. */
static int
state_get (struct clone_c *c, uint64_t md_size, struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&states_lock);
  char perr[PD_ERR_LEN] = "";
  struct clone_md_open_args a;
  struct clone_state *s;
  pthread_condattr_t ca;
  int r;

  /* A failed state is not shared: a reload reopens the metadata at its
   * last commit (as dm's new clone does), which is how a clone leaves
   * fail mode once its metadata device works again.  The failed state
   * writes nothing more and goes with its last table.
   */
  for (s = states; s; s = s->next)
    if (s->md_be == c->md_be && !atomic_load (&s->failed)) {
      if (s->region_sectors != c->region_sectors ||
          s->len != c->ti->len) {
        mapper_err_set (err, "metadata device %s is in use by a clone of "
                        "%" PRIu64 " sectors with regions of %" PRIu64
                        " sectors", backend_name (c->md_be),
                        s->len >> MAPPER_SECTOR_SHIFT, s->region_sectors);
        return -EBUSY;
      }
      /* Its bitmap says what is on that destination, not another. */
      if (s->dest_be != c->dest_be) {
        mapper_err_set (err, "metadata device %s is in use by a clone onto "
                        "destination %s", backend_name (c->md_be),
                        backend_name (s->dest_be));
        return -EBUSY;
      }
      s->refs++;
      c->s = s;
      return 0;
    }

  s = calloc (1, sizeof *s);
  if (s == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  s->md_be = c->md_be;
  s->dest_be = c->dest_be;
  s->pdev = (struct pd_blockdev) { .ops = &clone_pd_ops, .opaque = s,
                                   .size = md_size };
  s->len = c->ti->len;
  s->region_sectors = c->region_sectors;
  s->region_bytes = c->region_sectors << MAPPER_SECTOR_SHIFT;
  s->nr_regions = DIV_ROUND_UP (s->len, s->region_bytes);
  s->nr_words = DIV_ROUND_UP (s->nr_regions, 64);
  s->nr_sum = DIV_ROUND_UP (s->nr_words, 64);
  pthread_mutex_init (&s->lock, NULL);
  pthread_mutex_init (&s->commit_lock, NULL);
  pthread_condattr_init (&ca);
  pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);
  pthread_cond_init (&s->cond, &ca);
  pthread_condattr_destroy (&ca);
  target_backend_hold (c->md_be);
  s->map = calloc (s->nr_words, 8);
  s->cmap = calloc (s->nr_words, 8);
  s->busy = calloc (s->nr_words, 8);
  s->dirty = calloc (s->nr_words, 8);
  s->commit_words = calloc (s->nr_words, 8);
  s->dirty_sum = calloc (s->nr_sum, 8);
  s->commit_sum = calloc (s->nr_sum, 8);
  if (!s->map || !s->cmap || !s->busy || !s->dirty || !s->commit_words ||
      !s->dirty_sum || !s->commit_sum) {
    mapper_err_set (err, "out of memory");
    state_free (s);
    return -ENOMEM;
  }
  a = (struct clone_md_open_args) {
    .dev = &s->pdev, .region_sectors = c->region_sectors,
    .target_sectors = s->len >> MAPPER_SECTOR_SHIFT,
    .cache_blocks = CLONE_CACHE_BLOCKS,
  };
  r = clone_md_open (&a, &s->md, perr);
  if (r == 0)
    r = clone_md_load (s->md, s->map, perr);
  if (r < 0) {
    mapper_err_set (err, "metadata device %s: %s", backend_name (c->md_be),
                    *perr ? perr : mapper_strerror (-r));
    state_free (s);
    return r == -ENOMEM ? r : -EINVAL;
  }
  for (uint64_t w = 0; w < s->nr_words; w++) {
    s->cmap[w] = s->map[w];
    s->nr_hydrated += __builtin_popcountll (s->map[w]);
  }
  s->done_reported = s->nr_hydrated == s->nr_regions;
  s->refs = 1;
  s->next = states;
  states = s;
  c->s = s;
  return 0;
}

/* --- constructor ---------------------------------------------------------- */

static void
clone_dtr (struct target *ti)
{
  struct clone_c *c = ti->private;

  if (c == NULL)
    return;
  if (c->s) {
    /* A live table's (a remove): bounded, as the server's stop. */
    unbind (c, STOP_GRACE_NS);
    state_put (c->s);
  }
  free (c->args);
  free (c);
}

static const struct target_arg region_arg = {
  "region size", "sectors", MIN_REGION_SECTORS, MAX_REGION_SECTORS
};
static const struct target_arg threshold_arg = {
  "hydration_threshold", "regions", 1, UINT32_MAX
};
static const struct target_arg batch_arg = {
  "hydration_batch_size", "regions", 1, UINT32_MAX
};

static int
parse_features (struct clone_c *c, struct target_args *as,
                struct mapper_err *err)
{
  struct target_args g;
  const char *arg;
  int r;

  if ((r = target_read_group ("feature argument", 0, 2, false, as, &g,
                              err)) < 0)
    return r;
  while ((arg = target_shift_arg (&g)) != NULL) {
    if (strcmp (arg, "no_hydration") == 0)
      atomic_store (&c->hydration_enabled, false);
    else if (strcmp (arg, "no_discard_passdown") == 0)
      c->no_discard_passdown = true;
    else {
      mapper_err_set (err, "unrecognised clone feature '%s' (expected "
                      "no_hydration or no_discard_passdown)", arg);
      return -EINVAL;
    }
  }
  return 0;
}

static int
parse_core_args (struct clone_c *c, struct target_args *as,
                 struct mapper_err *err)
{
  struct target_args g;
  const char *arg;
  uint64_t v;
  int r;

  if ((r = target_read_group ("core argument", 0, 4, true, as, &g,
                              err)) < 0)
    return r;
  if (g.argc % 2) {
    mapper_err_set (err, "core arguments come in pairs (<key> <value>), "
                    "got %u", g.argc);
    return -EINVAL;
  }
  while ((arg = target_shift_arg (&g)) != NULL) {
    if (strcmp (arg, "hydration_threshold") == 0) {
      if ((r = target_read_arg (&threshold_arg, &g, &v, err)) < 0)
        return r;
      atomic_store (&c->threshold, (unsigned) v);
    }
    else if (strcmp (arg, "hydration_batch_size") == 0) {
      if ((r = target_read_arg (&batch_arg, &g, &v, err)) < 0)
        return r;
      atomic_store (&c->batch, (unsigned) v);
    }
    else {
      mapper_err_set (err, "unrecognised core argument '%s' (expected "
                      "hydration_threshold or hydration_batch_size)", arg);
      return -EINVAL;
    }
  }
  return 0;
}

static int
clone_ctr (struct target *ti, unsigned argc, char **argv,
           struct mapper_err *err)
{
  struct target_args as = { argc, argv };
  const char *md_spec, *dest_spec, *src_spec;
  uint64_t region, md_size;
  struct clone_c *c;
  size_t alen = 1;
  int r;

  if (argc < 4) {
    mapper_err_set (err, "expected <metadata dev> <destination dev> <source "
                    "dev> <region size> [<#features> <feature>...] "
                    "[<#core args> <core arg>...], got %u argument%s", argc,
                    argc == 1 ? "" : "s");
    return -EINVAL;
  }
  md_spec = target_shift_arg (&as);
  dest_spec = target_shift_arg (&as);
  src_spec = target_shift_arg (&as);
  if ((r = target_read_arg (&region_arg, &as, &region, err)) < 0)
    return r;
  if (!IS_POWER_OF_2 (region)) {
    mapper_err_set (err, "region size %" PRIu64 " sectors is not a power "
                    "of 2", region);
    return -EINVAL;
  }
  c = calloc (1, sizeof *c);
  if (c == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  ti->private = c;
  c->ti = ti;
  c->region_sectors = region;
  atomic_store (&c->hydration_enabled, true);
  atomic_store (&c->threshold, 1);     /* dm's defaults */
  atomic_store (&c->batch, 1);
  for (unsigned i = 4; i < argc; i++)
    alen += strlen (argv[i]) + 1;
  if ((c->args = calloc (1, alen)) == NULL) {
    mapper_err_set (err, "out of memory");
    r = -ENOMEM;
    goto fail;
  }
  for (unsigned i = 4; i < argc; i++) {
    strcat (c->args, " ");
    strcat (c->args, argv[i]);
  }
  if (as.argc > 0 && (r = parse_features (c, &as, err)) < 0)
    goto fail;
  if (as.argc > 0 && (r = parse_core_args (c, &as, err)) < 0)
    goto fail;

  if (DIV_ROUND_UP (ti->len, region << MAPPER_SECTOR_SHIFT) > MAX_REGIONS) {
    mapper_err_set (err, "too many regions: %" PRIu64 " sectors in regions "
                    "of %" PRIu64 " (at most %llu regions: use larger "
                    "regions)", ti->len >> MAPPER_SECTOR_SHIFT, region,
                    MAX_REGIONS);
    r = -EINVAL;
    goto fail;
  }
  r = target_get_backend (ti, md_spec, 0, 0, &c->md_be, err);
  if (r < 0) {
    mapper_err_prefix (err, "metadata device");
    goto fail;
  }
  r = target_get_backend (ti, dest_spec, 0, ti->len, &c->dest_be, err);
  if (r < 0) {
    mapper_err_prefix (err, "destination device");
    goto fail;
  }
  r = target_get_backend_read_only (ti, src_spec, 0, ti->len, &c->src_be,
                                    err);
  if (r < 0) {
    mapper_err_prefix (err, "source device");
    goto fail;
  }
  if (c->md_be == c->dest_be || c->md_be == c->src_be ||
      c->dest_be == c->src_be) {
    mapper_err_set (err, "the metadata, destination and source devices must "
                    "be three different devices (%s, %s, %s)", md_spec,
                    dest_spec, src_spec);
    r = -EINVAL;
    goto fail;
  }
  if ((r = target_backend_size (c->md_be, &md_size)) < 0) {
    mapper_err_set (err, "metadata device %s: cannot get its size: %s",
                    md_spec, mapper_strerror (-r));
    goto fail;
  }
  if ((r = state_get (c, md_size & ~4095ULL, err)) < 0)
    goto fail;
  return 0;

 fail:
  clone_dtr (ti);
  ti->private = NULL;
  return r;
}

/* --- I/O ------------------------------------------------------------------ */

/* Wait until region r is not busy (s->lock held).  0 or -ESHUTDOWN. */
static int
wait_not_busy (struct clone_state *s, uint64_t r)
{
  uint64_t asked = 0;
  int e;

  while (bit_test (s->busy, r))
    if ((e = request_wait (&s->cond, &s->lock, 0, &asked)) < 0)
      return e;
  return 0;
}

/* Hydrate region r now, for a write that covers part of it (dm's
 * hydrate_bio_region).  0 or -errno.
 */
static int
hydrate_region (struct clone_c *c, uint64_t r)
{
  struct clone_state *s = c->s;
  uint64_t off, len;
  char *buf;
  int e;

  pthread_mutex_lock (&s->lock);
  if ((e = wait_not_busy (s, r)) < 0 || bit_test (s->map, r)) {
    pthread_mutex_unlock (&s->lock);
    return e;
  }
  bit_set (s->busy, r);
  pthread_mutex_unlock (&s->lock);

  region_range (s, r, 1, &off, &len);
  buf = bounce_get (MIN (len, (uint64_t) COPY_CHUNK));
  e = buf ? copy_range (c, buf, off, len, NULL) : -ENOMEM;
  if (buf)
    bounce_put (buf);

  pthread_mutex_lock (&s->lock);
  if (e == 0)
    mark_hydrated_locked (s, r, 1);
  bit_clear (s->busy, r);
  pthread_cond_broadcast (&s->cond);
  pthread_mutex_unlock (&s->lock);
  return e;
}

/* A whole-region overwrite of regions [r, r+n) completed: hydrated if it
 * succeeded; no longer busy either way.
 */
static int
overwrite_end_io (struct clone *cl, void *ctx, uint64_t arg, int error)
{
  struct clone_c *c = ctx;
  struct clone_state *s = c->s;
  uint64_t r = arg >> 24, n = arg & 0xffffff;

  pthread_mutex_lock (&s->lock);
  if (error == 0)
    mark_hydrated_locked (s, r, n);
  for (uint64_t i = r; i < r + n; i++)
    bit_clear (s->busy, i);
  pthread_cond_broadcast (&s->cond);
  pthread_mutex_unlock (&s->lock);
  return error;
}

static bool
range_in (const uint64_t *m, uint64_t r, uint64_t n)
{
  for (uint64_t i = r; i < r + n; i++)
    if (!bit_test (m, i))
      return false;
  return true;
}

/* Emit the reads of [off, off+len): each run of hydrated regions to the
 * destination, of unhydrated ones to the source.
 */
static int
map_read (struct clone_c *c, struct io_req *req, uint64_t off, uint64_t len,
          char *buf)
{
  struct clone_state *s = c->s;
  uint64_t end = off + len, pos = off;
  int e;

  while (pos < end) {
    uint64_t r = pos / s->region_bytes;
    bool h = bit_test (s->map, r);
    uint64_t next = (r + 1) * s->region_bytes;

    while (next < end && bit_test (s->map, next / s->region_bytes) == h)
      next += s->region_bytes;
    next = MIN (next, end);
    e = io_emit (req, h ? c->dest_be : c->src_be, pos, next - pos,
                 buf_at (buf, pos - off));
    if (e < 0)
      return e;
    pos = next;
  }
  return 0;
}

static int
map_discard (struct clone_c *c, struct io_req *req, uint64_t off,
             uint64_t len)
{
  struct clone_state *s = c->s;
  uint64_t rb = s->region_bytes;
  uint64_t first = DIV_ROUND_UP (off, rb);
  uint64_t last = (off + len == s->len) ? s->nr_regions : (off + len) / rb;
  uint64_t a, b;
  int e = 0;

  if (first >= last)
    return 0;                   /* no whole region: nothing (dm) */
  /* Fail mode (dm's process_discard_bio, mode >= read-only): regions
   * already hydrated pass down as ever; otherwise the discard is
   * ignored, neither marking a region that can never be committed nor
   * punching a destination whose region the source still backs.
   */
  if (s->failed && !range_in (s->map, first, last - first))
    return 0;
  pthread_mutex_lock (&s->lock);
  for (uint64_t r = first; r < last && e == 0; r++)
    if (!bit_test (s->map, r) && (e = wait_not_busy (s, r)) == 0)
      mark_hydrated_locked (s, r, 1);
  pthread_mutex_unlock (&s->lock);
  if (e < 0 || c->no_discard_passdown || !backend_caps (c->dest_be)->can_trim)
    return e;
  region_range (s, first, last - first, &a, &b);
  return io_emit (req, c->dest_be, a, b, NULL);
}

static int
clone_map (struct target *ti, struct io_req *req, uint64_t off, uint64_t len,
           char *buf)
{
  struct clone_c *c = ti->private;
  struct clone_state *s = c->s;
  enum io_op op = io_req_op (req);
  uint64_t rb = s->region_bytes, first, last, pos, end = off + len;
  bool fua = io_req_flags (req) & MAPPER_FUA, sync;
  int e;

  if (op == IO_READ)
    return map_read (c, req, off, len, buf);
  if (op == IO_TRIM)
    return map_discard (c, req, off, len);
  if (s->failed)
    return -EIO;                /* dm's fail mode */

  /* Writes and zeroes.  First the regions written in part: copied now,
   * waiting for none of ours while busy (so two requests never wait for
   * each other's regions).
   */
  first = off / rb;
  last = (end - 1) / rb;
  /* All hydrated (the map only gains bits, each once its region's copy
   * or overwrite completed): the destination's, without the lock.  A FUA
   * one may still need its regions committed (below).
   */
  if (!fua && range_in (s->map, first, last - first + 1))
    return io_emit (req, c->dest_be, off, len, buf);
  if (off % rb && (e = hydrate_region (c, first)) < 0)
    return e;
  if (end % rb && end != s->len && (last != first || off % rb == 0) &&
      (e = hydrate_region (c, last)) < 0)
    return e;

  /* Then the whole regions still unhydrated: all made busy at once, after
   * waiting (holding none) for those busy elsewhere.
   */
  pthread_mutex_lock (&s->lock);
  for (;;) {
    uint64_t busy_r = UINT64_MAX;
    for (uint64_t r = first; r <= last; r++)
      if (!bit_test (s->map, r) && bit_test (s->busy, r)) {
        busy_r = r;
        break;
      }
    if (busy_r == UINT64_MAX)
      break;
    if ((e = wait_not_busy (s, busy_r)) < 0) {
      pthread_mutex_unlock (&s->lock);
      return e;
    }
  }
  for (uint64_t r = first; r <= last; r++)
    if (!bit_test (s->map, r))
      bit_set (s->busy, r);
  /* A FUA write is durable only once its regions are committed
   * hydrated: one that touches a region not so is written here and
   * followed by a commit.
   */
  sync = fua && !range_in (s->cmap, first, last - first + 1);
  pthread_mutex_unlock (&s->lock);

  if (sync) {
    e = io_sync (op, c->dest_be, off, len, buf, io_req_flags (req));
    pthread_mutex_lock (&s->lock);
    for (uint64_t r = first; r <= last; r++)
      if (bit_test (s->busy, r) && !bit_test (s->map, r)) {
        if (e == 0)
          mark_hydrated_locked (s, r, 1);
        bit_clear (s->busy, r);
      }
    pthread_cond_broadcast (&s->cond);
    pthread_mutex_unlock (&s->lock);
    if (e == 0)
      e = clone_commit (s, c);
    return e;
  }

  /* Emit runs: hydrated regions plainly, the overwritten ones with the
   * completion that marks them.
   */
  for (pos = off; pos < end;) {
    uint64_t r = pos / rb, n = 1, next;
    bool over = bit_test (s->busy, r) && !bit_test (s->map, r);

    while (r + n <= last && n < 0xffffff &&
           (bit_test (s->busy, r + n) && !bit_test (s->map, r + n)) == over)
      n++;
    next = MIN ((r + n) * rb, end);
    if (over)
      e = io_emit_end_io (req, c->dest_be, pos, next - pos,
                          buf_at (buf, pos - off), overwrite_end_io, c,
                          r << 24 | n);
    else
      e = io_emit (req, c->dest_be, pos, next - pos, buf_at (buf, pos - off));
    if (e < 0) {
      /* The regions made busy above and not emitted yet are not being
       * overwritten after all (the emitted ones get their end_io).
       */
      pthread_mutex_lock (&s->lock);
      for (uint64_t i = r; i <= last; i++)
        if (bit_test (s->busy, i) && !bit_test (s->map, i))
          bit_clear (s->busy, i);
      pthread_cond_broadcast (&s->cond);
      pthread_mutex_unlock (&s->lock);
      return e;
    }
    pos = next;
  }
  return 0;
}

static int
clone_flush (struct target *ti, struct io_req *req)
{
  struct clone_c *c = ti->private;

  return clone_commit (c->s, c);
}

static int
clone_extents (struct target *ti, struct extent_walk *w, uint64_t off,
               uint64_t len)
{
  struct clone_c *c = ti->private;
  struct clone_state *s = c->s;
  uint64_t end = off + len, pos = off;
  int e;

  while (pos < end && !extent_walk_done (w)) {
    uint64_t r = pos / s->region_bytes;
    bool h = bit_test (s->map, r);
    uint64_t next = (r + 1) * s->region_bytes;

    while (next < end && bit_test (s->map, next / s->region_bytes) == h)
      next += s->region_bytes;
    next = MIN (next, end);
    e = extent_walk_backend (w, ti, pos, h ? c->dest_be : c->src_be, pos,
                             next - pos);
    if (e < 0)
      return e;
    pos = next;
  }
  return 0;
}

/* --- status and messages -------------------------------------------------- */

static size_t
clone_status (struct target *ti, enum status_type type, char *buf,
              size_t len)
{
  struct clone_c *c = ti->private;
  struct clone_state *s = c->s;
  size_t used = 0;

  if (type == STATUSTYPE_TABLE) {
    EMIT ("%s %s %s %" PRIu64 "%s", backend_name (c->md_be),
          backend_name (c->dest_be), backend_name (c->src_be),
          c->region_sectors, c->args);
    return used;
  }
  {
    uint64_t mused, mtotal, hydrated;
    unsigned hydrating;
    bool failed, nohyd = !atomic_load (&c->hydration_enabled);

    clone_md_usage (s->md, &mused, &mtotal);
    pthread_mutex_lock (&s->lock);
    hydrated = s->nr_hydrated;
    hydrating = s->hydrating;
    failed = s->failed;
    pthread_mutex_unlock (&s->lock);
    if (failed) {
      EMIT ("Fail");
      return used;
    }
    /* dm's: <metadata block size> <#used>/<#total metadata blocks>
     * <region size> <#hydrated>/<#total regions> <#hydrating regions>
     * <#features> <features>* <#core args> <core args>* <mode>
     */
    EMIT ("8 %" PRIu64 "/%" PRIu64 " %" PRIu64 " %" PRIu64 "/%" PRIu64
          " %u %u%s%s 4 hydration_threshold %u hydration_batch_size %u rw",
          mused, mtotal, c->region_sectors, hydrated, s->nr_regions,
          hydrating, (unsigned) nohyd + c->no_discard_passdown,
          nohyd ? " no_hydration" : "",
          c->no_discard_passdown ? " no_discard_passdown" : "",
          atomic_load (&c->threshold), atomic_load (&c->batch));
  }
  return used;
}

static int
clone_message (struct target *ti, unsigned argc, char **argv, char *reply,
               size_t len, struct mapper_err *err)
{
  struct clone_c *c = ti->private;
  const struct target_arg *arg = NULL;
  struct target_args as;
  uint64_t v;
  int r;

  if (argc >= 1 && (strcmp (argv[0], "enable_hydration") == 0 ||
                    strcmp (argv[0], "disable_hydration") == 0)) {
    if (argc != 1) {
      mapper_err_set (err, "%s takes no arguments, got %u", argv[0],
                      argc - 1);
      return -EINVAL;
    }
    atomic_store (&c->hydration_enabled, argv[0][0] == 'e');
  }
  else if (argc >= 1 && strcmp (argv[0], "hydration_threshold") == 0)
    arg = &threshold_arg;
  else if (argc >= 1 && strcmp (argv[0], "hydration_batch_size") == 0)
    arg = &batch_arg;
  else {
    mapper_err_set (err, "unrecognised message '%s' with %u argument%s "
                    "(expected enable_hydration, disable_hydration, "
                    "hydration_threshold N or hydration_batch_size N)",
                    argc ? argv[0] : "", argc ? argc - 1 : 0,
                    argc == 2 ? "" : "s");
    return -EINVAL;
  }
  if (arg) {
    if (argc != 2) {
      mapper_err_set (err, "%s takes 1 argument, got %u", argv[0], argc - 1);
      return -EINVAL;
    }
    as = (struct target_args) { 1, argv + 1 };
    if ((r = target_read_arg (arg, &as, &v, err)) < 0)
      return r;
    atomic_store (arg == &threshold_arg ? &c->threshold : &c->batch,
                  (unsigned) v);
  }
  pthread_mutex_lock (&c->s->lock);
  pthread_cond_broadcast (&c->s->cond);
  pthread_mutex_unlock (&c->s->lock);
  return 0;
}

static int
clone_iterate_backends (struct target *ti,
                        int (*fn) (struct target *, struct backend *, void *),
                        void *data)
{
  struct clone_c *c = ti->private;
  int r = fn (ti, c->md_be, data);

  if (r == 0)
    r = fn (ti, c->dest_be, data);
  return r ? r : fn (ti, c->src_be, data);
}

const struct target_type clone_target = {
  .name = "clone",
  .version = { 2, 0, 0 },
  .ctr = clone_ctr,
  .dtr = clone_dtr,
  .map = clone_map,
  .extents = clone_extents,
  .status = clone_status,
  .iterate_backends = clone_iterate_backends,
  .flush = clone_flush,
  .resume = clone_resume,
  .postsuspend = clone_postsuspend,
  .message = clone_message,
  .start = clone_type_start,
  .stop = clone_type_stop,
};

/* SPDX-License-Identifier: BSD-3-Clause */
/* I/O statistics, as dm-stats keeps them for dmstats: per device and per
 * target of the live table (dmstats create --regions), the counters of
 * /proc/diskstats and a latency histogram per operation.
 *
 * The request path takes no lock and writes no line another thread
 * writes: each thread counts in a block of its own (one per device it
 * serves, cache-line aligned), found through a small per-thread cache;
 * a reader sums the blocks.  Clearing writes no block either: it records
 * the sums as the region's base, which later reads subtract.  A block's
 * owner is a thread record that outlives the thread: a new thread takes
 * over a finished one's record, with its blocks (nbdkit starts worker
 * threads per connection), so the blocks of a device are at most one per
 * thread alive at the same time.
 *
 * The set of regions follows the live table: a swap (with nothing in
 * flight, so nothing counts meanwhile) builds a new set, carrying over
 * the device region and each target region whose start and length the
 * new table still has.  A device nothing has used since its swap has
 * no set: its first request (or clear) makes it.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

bool mapper_stats_disabled;

const uint64_t mapper_stats_bounds_ns[MAPPER_STATS_NR_BOUNDS] = {
  10000, 50000, 100000, 500000,                 /* 10 us .. 500 us */
  1000000, 5000000, 10000000, 50000000,         /* 1 ms .. 50 ms */
  100000000, 500000000, 1000000000, 5000000000, /* 100 ms .. 5 s */
};

/* A region's values in a block, as indices into one flat array: the
 * counters, the in-flight gauge, then (device region only) the
 * histograms.
 */
enum {
  V_IOS = 0,                    /* + op */
  V_BYTES = V_IOS + MAPPER_STATS_OPS,
  V_NS = V_BYTES + MAPPER_STATS_OPS,
  V_INFLIGHT = V_NS + MAPPER_STATS_OPS,
  V_FLUSHING = V_INFLIGHT + 1,  /* device only: flushes in V_INFLIGHT */
  V_TARGET = 16,                /* a target region: two lines */
  V_HIST = V_TARGET,            /* + op * buckets + bucket */
  V_DEVICE = V_HIST + MAPPER_STATS_OPS * MAPPER_STATS_BUCKETS,
  /* Where target t's values start: after the device's, line-aligned. */
  V_TARGETS = (V_DEVICE + 7) & ~7,
};

struct stats_thread;

struct stats_block {
  struct stats_block *next;     /* the set's list, under its lock */
  struct stats_thread *owner;
  _Atomic uint64_t v[] __attribute__ ((aligned (64)));
};

/* The sums of the blocks of sets a swap retired, and the base a clear
 * set, per value of one region.
 */
struct stats_region {
  uint64_t start, len;          /* bytes */
  const char *type;             /* "device" or the target type's name */
  uint64_t since_ns;            /* counting since (swap or clear) */
  uint64_t *carried, *base;     /* V_DEVICE or V_TARGET values each */
};

struct stats_set {
  uint64_t uid;                 /* never reused: the thread caches' key */
  pthread_mutex_t lock;         /* blocks */
  struct stats_block *blocks;
  size_t nr_targets;            /* target regions: 0 or the table's */
  /* The blocks hold values for each target region (more than one):
   * with a single target, which covers the device, its values are the
   * device region's but for flushes, which no target counts, and are
   * read from there (region_sum): a request writes one region's values.
   */
  bool target_values;
  size_t block_size;
  /* The device, then each target; then the regions' values. */
  struct stats_region regions[];
};

/* A thread's record: its cache of (set, block) pairs.  Never freed:
 * reused by a later thread (free list), with the cache, which stays
 * true of the record.
 */
#define STATS_CACHE 4
struct stats_thread {
  struct stats_thread *next_free;
  struct stats_thread *next_all;
  unsigned victim;
  struct {
    uint64_t uid;
    struct stats_block *blk;
  } cache[STATS_CACHE];
};

static pthread_mutex_t threads_lock = PTHREAD_MUTEX_INITIALIZER;
static struct stats_thread *free_threads, *all_threads;
static pthread_key_t thread_key;
static pthread_once_t thread_key_once = PTHREAD_ONCE_INIT;
static __thread struct stats_thread *stats_me;
static _Atomic uint64_t next_uid = 1;

static void
thread_gone (void *p)
{
  struct stats_thread *me = p;

  pthread_mutex_lock (&threads_lock);
  me->next_free = free_threads;
  free_threads = me;
  pthread_mutex_unlock (&threads_lock);
}

static void
make_key (void)
{
  if (pthread_key_create (&thread_key, thread_gone) != 0)
    thread_key = (pthread_key_t) -1;
}

static struct stats_thread *
thread_record (void)
{
  struct stats_thread *me;

  if (stats_me)
    return stats_me;
  pthread_once (&thread_key_once, make_key);
  if (thread_key == (pthread_key_t) -1)
    return NULL;
  pthread_mutex_lock (&threads_lock);
  if ((me = free_threads) != NULL)
    free_threads = me->next_free;
  else if ((me = calloc (1, sizeof *me)) != NULL) {
    me->next_all = all_threads;
    all_threads = me;
  }
  pthread_mutex_unlock (&threads_lock);
  if (me == NULL)
    return NULL;
  if (pthread_setspecific (thread_key, me) != 0) {
    thread_gone (me);
    return NULL;
  }
  return stats_me = me;
}

/* This thread's block of s: the first request of a thread on a device
 * (or after a swap) allocates it; NULL if out of memory (not counted).
 */
static __attribute__ ((noinline, cold)) struct stats_block *
block_slow (struct stats_set *s)
{
  struct stats_thread *me = thread_record ();
  struct stats_block *b;

  if (me == NULL)
    return NULL;
  pthread_mutex_lock (&s->lock);
  for (b = s->blocks; b && b->owner != me; b = b->next)
    ;
  if (b == NULL && (b = aligned_alloc (64, s->block_size)) != NULL) {
    memset (b, 0, s->block_size);
    b->owner = me;
    b->next = s->blocks;
    s->blocks = b;
  }
  pthread_mutex_unlock (&s->lock);
  if (b) {
    unsigned k = me->victim++ % STATS_CACHE;
    me->cache[k].uid = s->uid;
    me->cache[k].blk = b;
  }
  return b;
}

static inline struct stats_block *
block_of (struct stats_set *s)
{
  struct stats_thread *me = stats_me;

  if (me)
    for (unsigned k = 0; k < STATS_CACHE; k++)
      if (me->cache[k].uid == s->uid)
        return me->cache[k].blk;
  return block_slow (s);
}

/* Only the owner writes a block: a load and a store, no locked
 * instruction; readers see each value whole.
 */
static inline void
add (_Atomic uint64_t *p, uint64_t n)
{
  atomic_store_explicit (p, atomic_load_explicit (p, memory_order_relaxed)
                         + n, memory_order_relaxed);
}

static enum mapper_stats_op
op_of (enum io_op op)
{
  switch (op) {
  case IO_READ: return MAPPER_STATS_READ;
  case IO_TRIM: return MAPPER_STATS_DISCARD;
  case IO_FLUSH: return MAPPER_STATS_FLUSH;
  default: return MAPPER_STATS_WRITE;       /* write, write zeroes */
  }
}

static struct stats_set *install (struct device *dev, const struct table *t);

/* monotonic_ns, inline: twice per request. */
static inline uint64_t
now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The target regions' part of stats_io_end (more than one target). */
static __attribute__ ((noinline)) void
targets_end (struct stats_block *b, enum mapper_stats_op op,
             uint64_t offset, uint64_t count, const struct table *t,
             size_t first, size_t end, uint64_t ns)
{
  for (size_t i = first; i < end; i++) {
    const struct target *ti = &t->targets[i];
    _Atomic uint64_t *v = &b->v[V_TARGETS + i * V_TARGET];
    uint64_t lo = MAX (offset, ti->begin);
    uint64_t hi = MIN (offset + count, ti->begin + ti->len);

    add (&v[V_IOS + op], 1);
    add (&v[V_BYTES + op], hi - lo);
    add (&v[V_NS + op], ns);
    add (&v[V_INFLIGHT], -1);
  }
}

void
stats_io_start (struct stats_io *sio, struct device *dev,
                const struct table *t)
{
  struct stats_set *s = atomic_load_explicit (&dev->stats,
                                              memory_order_acquire);

  if (s == NULL)
    s = install (dev, t);
  sio->blk = s ? block_of (s) : NULL;
  if (sio->blk == NULL)
    return;
  sio->set = s;
  sio->t0 = now_ns ();
  add (&sio->blk->v[V_INFLIGHT], 1);
}

void
stats_io_flush (struct stats_io *sio)
{
  if (sio->blk)
    add (&sio->blk->v[V_FLUSHING], 1);
}

void
stats_io_targets (struct stats_io *sio, size_t first, size_t end)
{
  if (sio->blk == NULL || !sio->set->target_values)
    return;
  for (size_t i = first; i < end; i++)
    add (&sio->blk->v[V_TARGETS + i * V_TARGET + V_INFLIGHT], 1);
}

void
stats_io_end (struct stats_io *sio, enum io_op io_op, uint64_t offset,
              uint64_t count, const struct table *t, size_t first,
              size_t end)
{
  struct stats_block *b = sio->blk;
  enum mapper_stats_op op = op_of (io_op);
  uint64_t ns;
  unsigned k;

  if (b == NULL)
    return;
  ns = now_ns () - sio->t0;
  for (k = 0; k < MAPPER_STATS_NR_BOUNDS && ns > mapper_stats_bounds_ns[k];
       k++)
    ;
  add (&b->v[V_IOS + op], 1);
  add (&b->v[V_BYTES + op], count);
  add (&b->v[V_NS + op], ns);
  add (&b->v[V_HIST + op * MAPPER_STATS_BUCKETS + k], 1);
  add (&b->v[V_INFLIGHT], -1);
  if (op == MAPPER_STATS_FLUSH)
    add (&b->v[V_FLUSHING], -1);
  if (sio->set->target_values)
    targets_end (b, op, offset, count, t, first, end, ns);
}

/* --- sets: made at a device's first request (or clear) after a swap - */

static void
set_free (struct stats_set *s)
{
  struct stats_block *b, *next;

  if (s == NULL)
    return;
  for (b = s->blocks; b; b = next) {
    next = b->next;
    free (b);
  }
  pthread_mutex_destroy (&s->lock);
  free (s);
}

/* The number of target regions of t's set (0: too many targets). */
static size_t
target_regions (const struct table *t)
{
  return t->nr_targets <= MAPPER_STATS_MAX_TARGET_REGIONS ? t->nr_targets
    : 0;
}

/* The set of t's regions, counting since dev_since (the device region)
 * and since (the targets'); NULL if out of memory or off.
 */
static struct stats_set *
set_new (const struct table *t, uint64_t dev_since, uint64_t since)
{
  size_t nt = target_regions (t);
  size_t nregions = 1 + nt, nvalues = V_DEVICE + nt * V_TARGET;
  struct stats_set *s;
  uint64_t *v;

  if (mapper_stats_disabled)
    return NULL;
  s = calloc (1, sizeof *s + nregions * sizeof s->regions[0] +
              2 * nvalues * sizeof (uint64_t));
  if (s == NULL)
    return NULL;
  s->uid = atomic_fetch_add (&next_uid, 1);
  pthread_mutex_init (&s->lock, NULL);
  s->nr_targets = nt;
  s->target_values = nt > 1;
  s->block_size = offsetof (struct stats_block, v) +
    (s->target_values ? V_TARGETS + nt * V_TARGET : V_DEVICE) *
    sizeof (uint64_t);
  s->block_size = (s->block_size + 63) & ~(size_t) 63;
  v = (uint64_t *) &s->regions[nregions];
  for (size_t r = 0; r < nregions; r++) {
    struct stats_region *rg = &s->regions[r];
    size_t n = r ? V_TARGET : V_DEVICE;

    rg->start = r ? t->targets[r - 1].begin : 0;
    rg->len = r ? t->targets[r - 1].len : t->caps.size;
    rg->type = r ? t->targets[r - 1].type->name : "device";
    rg->since_ns = r ? since : dev_since;
    rg->carried = v;
    rg->base = v + n;
    v += 2 * n;
  }
  return s;
}

/* A device's first request or clear since the swap makes its set (an
 * idle device has none: no memory for 10,000 of them); the first of
 * several at once wins.  t is the live table, which cannot change
 * meanwhile (the caller is counted in flight, or holds dev->lock).
 */
static __attribute__ ((noinline)) struct stats_set *
install (struct device *dev, const struct table *t)
{
  struct stats_set *s = set_new (t, dev->stats_since_dev, dev->stats_since);
  struct stats_set *none = NULL;

  if (s == NULL)
    return NULL;
  if (!atomic_compare_exchange_strong (&dev->stats, &none, s)) {
    set_free (s);
    return none;
  }
  return s;
}

/* The sums of region r's values over s's blocks, carried included
 * (n values: V_DEVICE for the device, V_TARGET for a target).
 */
static void
region_sum (struct stats_set *s, size_t r, uint64_t *out, size_t n)
{
  size_t off = r == 0 || !s->target_values ? 0
    : V_TARGETS + (r - 1) * V_TARGET;
  /* The single target's values are the device's, less its flushes. */
  bool no_flush = r != 0 && !s->target_values;

  memcpy (out, s->regions[r].carried, n * sizeof *out);
  pthread_mutex_lock (&s->lock);
  for (struct stats_block *b = s->blocks; b; b = b->next)
    for (size_t i = 0; i < n; i++) {
      uint64_t v = atomic_load_explicit (&b->v[off + i],
                                         memory_order_relaxed);

      if (no_flush) {
        if (i == V_IOS + MAPPER_STATS_FLUSH ||
            i == V_BYTES + MAPPER_STATS_FLUSH ||
            i == V_NS + MAPPER_STATS_FLUSH || i > V_INFLIGHT)
          continue;
        if (i == V_INFLIGHT)
          v -= atomic_load_explicit (&b->v[V_FLUSHING],
                                     memory_order_relaxed);
      }
      out[i] += v;
    }
  pthread_mutex_unlock (&s->lock);
}

/* A swap's statistics in three steps, so that the suspended window holds
 * only a pointer store: the new set is allocated before the drain
 * (stats_swap_prepare), installed in the window (stats_swap), and the old
 * set's counts are carried into it and the old set freed once the gate
 * is open again (stats_swap_done, still under dev->lock, which readers
 * take: none sees the new set before its carried values are in).
 * Summing the old set's blocks reads lines every serving thread wrote,
 * on other CPUs: some 17 us under a QD64 load, which the window held.
 */
void
stats_swap_prepare (struct stats_swap *sw, const struct table *t)
{
  /* The intervals are set by stats_swap_done, from the swap's time. */
  sw->old = NULL;
  sw->s = t ? set_new (t, 0, 0) : NULL;
  sw->lost = t && sw->s == NULL;
  sw->installed = false;
  sw->now = 0;
}

void
stats_swap (struct device *dev, struct stats_swap *sw)
{
  struct stats_set *old = atomic_load (&dev->stats);
  uint64_t now = monotonic_ns ();

  if (dev->stats_since_dev == 0)
    dev->stats_since_dev = now;
  dev->stats_since = now;
  sw->now = now;
  sw->old = old;
  /* Nothing counted yet: the next request makes the set. */
  if (old == NULL)
    return;
  if (sw->s == NULL) {
    /* The old set's counts go with it: the device region counts again
     * from now, as its targets' do (its interval was that of counts
     * lost).
     */
    if (sw->lost && !mapper_stats_disabled && mapper_debug)
      mapper_debug ("device %s: statistics lost at the swap: out of memory",
                    dev->name);
    dev->stats_since_dev = now;
  }
  sw->installed = sw->s != NULL;
  atomic_store (&dev->stats, sw->s);
}

void
stats_swap_done (struct device *dev, struct stats_swap *sw)
{
  struct stats_set *old = sw->old, *s = sw->s;

  if (!sw->installed) {
    /* Not swapped, or nothing counted before the swap. */
    set_free (s);
    set_free (old);
    return;
  }
  /* What the old set counted goes on where the region still is: the
   * device always, a target region of the same start and length.  No
   * request writes old's blocks any more (they drained before the
   * swap), and requests since write only s's blocks, not these values.
   */
  for (size_t r = 0; r <= s->nr_targets; r++) {
    struct stats_region *rg = &s->regions[r];
    size_t n = r ? V_TARGET : V_DEVICE, o = 0;

    rg->since_ns = r ? sw->now : dev->stats_since_dev;
    if (r) {
      for (o = 1; o <= old->nr_targets; o++)
        if (old->regions[o].start == rg->start &&
            old->regions[o].len == rg->len)
          break;
      if (o > old->nr_targets)
        continue;
    }
    region_sum (old, o, rg->carried, n);
    memcpy (rg->base, old->regions[o].base, n * sizeof rg->base[0]);
    rg->since_ns = old->regions[o].since_ns;
  }
  set_free (old);
}

void
stats_free (struct device *dev)
{
  set_free (atomic_load (&dev->stats));
  atomic_store (&dev->stats, NULL);
}

/* --- reading ------------------------------------------------------- */

int
device_stats (struct device *dev, long region, bool clear,
              int (*fn) (const struct mapper_stats_region *r, void *opaque),
              void *opaque, struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->lock);
  struct stats_set *s = atomic_load (&dev->stats);
  struct mapper_stats_region out;
  uint64_t sum[V_DEVICE];
  size_t lo = 0, hi;
  int r = 0;

  /* Nothing counted since the swap.  A read or a check alone makes no
   * set (a monitor reading 10,000 idle devices would give each one, and
   * an idle device costs nothing): its regions are the live table's,
   * all zeros.  A clear needs the set, to start from.
   */
  if (s == NULL && dev->live && clear)
    s = install (dev, dev->live);
  if (s == NULL && (dev->live == NULL || clear || mapper_stats_disabled)) {
    if (dev->live == NULL) {
      mapper_err_set (err, "device '%s' has no live table", dev->name);
      return -ENXIO;
    }
    if (mapper_stats_disabled) {
      mapper_err_set (err, "device '%s': statistics are off "
                      "(-D mapper.stats_off=1)", dev->name);
      return -ENOTSUP;
    }
    mapper_err_set (err, "device '%s': no statistics: out of memory",
                    dev->name);
    return -ENOMEM;
  }
  hi = s ? s->nr_targets : target_regions (dev->live);
  if (region >= 0) {
    if ((size_t) region > hi) {
      if (hi)
        mapper_err_set (err, "device '%s' has no region %ld: regions are "
                        "0 (the device) to %zu (its targets)", dev->name,
                        region, hi);
      else
        mapper_err_set (err, "device '%s' has no region %ld: only region 0 "
                        "(the device)%s", dev->name, region,
                        dev->live->nr_targets > MAPPER_STATS_MAX_TARGET_REGIONS
                        ? ", its table has too many targets for one region "
                        "each" : "");
      return -EINVAL;
    }
    lo = hi = region;
  }
  if (fn == NULL)
    return 0;                   /* checked only */
  if (s == NULL) {
    /* Idle: zeros over the intervals since the swap. */
    const struct table *t = dev->live;
    uint64_t now = monotonic_ns ();

    for (size_t i = lo; i <= hi && r == 0; i++) {
      memset (&out, 0, sizeof out);
      out.id = i;
      out.start = i ? t->targets[i - 1].begin : 0;
      out.len = i ? t->targets[i - 1].len : t->caps.size;
      out.type = i ? t->targets[i - 1].type->name : "device";
      out.interval_ns = now - (i ? dev->stats_since : dev->stats_since_dev);
      out.has_histograms = i == 0;
      r = fn (&out, opaque);
    }
    return r;
  }
  for (size_t i = lo; i <= hi && r == 0; i++) {
    struct stats_region *rg = &s->regions[i];
    size_t n = i ? V_TARGET : V_DEVICE;
    uint64_t now = monotonic_ns ();
    uint64_t busy = 0;

    region_sum (s, i, sum, n);
    memset (&out, 0, sizeof out);
    out.id = i;
    out.start = rg->start;
    out.len = rg->len;
    out.type = rg->type;
    out.interval_ns = now - rg->since_ns;
    for (int op = 0; op < MAPPER_STATS_OPS; op++) {
      out.ios[op] = sum[V_IOS + op] - rg->base[V_IOS + op];
      out.bytes[op] = sum[V_BYTES + op] - rg->base[V_BYTES + op];
      out.ns[op] = sum[V_NS + op] - rg->base[V_NS + op];
      busy += out.ns[op];
    }
    /* The gauge is not a counter: never cleared, never based. */
    out.in_progress = sum[V_INFLIGHT];
    out.queue_ns = busy;
    /* The kernel's io_ticks is the time with anything in flight, which
     * needs a counter every request writes: this is the requests' time
     * capped at the interval, exact one request at a time, an upper
     * bound otherwise.
     */
    out.io_ns = MIN (busy, out.interval_ns);
    out.has_histograms = i == 0;
    if (i == 0)
      for (size_t k = 0; k < MAPPER_STATS_OPS * MAPPER_STATS_BUCKETS; k++)
        out.hist[k / MAPPER_STATS_BUCKETS][k % MAPPER_STATS_BUCKETS] =
          sum[V_HIST + k] - rg->base[V_HIST + k];
    r = fn (&out, opaque);
    /* Each counter is cleared at the value just reported: no request
     * counted in between is lost or counted twice.
     */
    if (clear) {
      memcpy (rg->base, sum, n * sizeof sum[0]);
      rg->since_ns = now;
    }
  }
  return r;
}

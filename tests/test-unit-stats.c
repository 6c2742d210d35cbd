/* SPDX-License-Identifier: BSD-3-Clause */
/* I/O statistics (stats.c): exact counts from many threads, over
 * several generations of threads (records and blocks taken over), per
 * target regions split by the request, histograms summing to the
 * counts, clears racing the I/O losing and doubling nothing, a reload
 * keeping the regions it keeps, no set (no allocation at all) for an
 * idle device even once read or checked, the device's interval after a
 * swap that lost the counts, and the errors: no table, a bad region,
 * statistics off.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"
#include "unit.h"
#include "unit-targets.h"

/* Every calloc (the engine's too: libmapper is linked in), counted, to
 * see that an idle device's statistics allocate nothing.  Not beside the
 * ASan or TSan runtime, which owns calloc (TSan's allocator aborts on a
 * block it did not hand out).
 */
#if !defined (__SANITIZE_ADDRESS__) && !defined (__SANITIZE_THREAD__)
#define COUNT_CALLOCS 1
extern void *__libc_calloc (size_t, size_t);
static atomic_size_t callocs;

void *
calloc (size_t n, size_t size)
{
  atomic_fetch_add (&callocs, 1);
  return __libc_calloc (n, size);
}
#endif

/* The regions device_stats reported, by id, added up (over clears). */
#define MAX_REGIONS 4
struct sums {
  size_t n;
  uint64_t ios[MAX_REGIONS][MAPPER_STATS_OPS];
  uint64_t bytes[MAX_REGIONS][MAPPER_STATS_OPS];
  uint64_t hist[MAX_REGIONS][MAPPER_STATS_OPS];
  uint64_t in_progress[MAX_REGIONS];
  uint64_t start[MAX_REGIONS], len[MAX_REGIONS];
  bool has_hist[MAX_REGIONS];
};

static int
add_region (const struct mapper_stats_region *r, void *opaque)
{
  struct sums *s = opaque;

  if (r->id >= MAX_REGIONS)
    return 0;
  s->n = MAX (s->n, r->id + 1);
  s->start[r->id] = r->start;
  s->len[r->id] = r->len;
  s->in_progress[r->id] = r->in_progress;
  s->has_hist[r->id] = r->has_histograms;
  for (int op = 0; op < MAPPER_STATS_OPS; op++) {
    s->ios[r->id][op] += r->ios[op];
    s->bytes[r->id][op] += r->bytes[op];
    for (int k = 0; k < MAPPER_STATS_BUCKETS; k++)
      s->hist[r->id][op] += r->hist[op][k];
  }
  return 0;
}

static int
copy_region (const struct mapper_stats_region *r, void *opaque)
{
  *(struct mapper_stats_region *) opaque = *r;
  return 0;
}

static struct sums
read_stats (struct device *dev, bool clear)
{
  struct mapper_err err = { "" };
  struct sums s = { 0 };
  int r = device_stats (dev, -1, clear, add_region, &s, &err);

  CHECKF (r == 0, "device_stats: %s", err.msg);
  return s;
}

#define THREADS 8
#define READS 2000
#define WRITES 500

struct worker {
  struct device *dev;
  int r;
};

/* Reads of 512 bytes in the first target, writes of 1024 bytes across
 * the boundary at 1 MiB (512 bytes each side), a trim and a flush.
 */
static void *
worker (void *p)
{
  struct worker *w = p;
  char buf[1024];

  for (int i = 0; i < READS && w->r == 0; i++)
    w->r = device_pread (w->dev, buf, 512, (uint64_t) (i % 2048) * 512, 0);
  for (int i = 0; i < WRITES && w->r == 0; i++)
    w->r = device_pwrite (w->dev, buf, 1024, 1048576 - 512, 0);
  if (w->r == 0)
    w->r = device_trim (w->dev, 4096, 1048576, 0);
  if (w->r == 0)
    w->r = device_flush (w->dev, 0);
  return NULL;
}

static void
run_workers (struct device *dev)
{
  pthread_t th[THREADS];
  struct worker w[THREADS];

  for (int i = 0; i < THREADS; i++) {
    w[i] = (struct worker) { dev, 0 };
    pthread_create (&th[i], NULL, worker, &w[i]);
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join (th[i], NULL);
    CHECK_EQ (w[i].r, 0);
  }
}

/* Counts after rounds of run_workers, nothing cleared. */
static void
check_counts (const struct sums *s, uint64_t rounds)
{
  uint64_t n = rounds * THREADS;

  CHECK_EQ (s->n, 3);
  CHECK_EQ (s->ios[0][MAPPER_STATS_READ], n * READS);
  CHECK_EQ (s->bytes[0][MAPPER_STATS_READ], n * READS * 512);
  CHECK_EQ (s->ios[1][MAPPER_STATS_READ], n * READS);
  CHECK_EQ (s->ios[2][MAPPER_STATS_READ], 0);
  CHECK_EQ (s->ios[0][MAPPER_STATS_WRITE], n * WRITES);
  CHECK_EQ (s->bytes[0][MAPPER_STATS_WRITE], n * WRITES * 1024);
  /* One write touching two targets counts once in each, with its part. */
  for (int r = 1; r <= 2; r++) {
    CHECK_EQ (s->ios[r][MAPPER_STATS_WRITE], n * WRITES);
    CHECK_EQ (s->bytes[r][MAPPER_STATS_WRITE], n * WRITES * 512);
  }
  CHECK_EQ (s->ios[2][MAPPER_STATS_DISCARD], n);
  CHECK_EQ (s->bytes[2][MAPPER_STATS_DISCARD], n * 4096);
  CHECK_EQ (s->ios[1][MAPPER_STATS_DISCARD], 0);
  CHECK_EQ (s->ios[0][MAPPER_STATS_FLUSH], n);
  CHECK_EQ (s->ios[1][MAPPER_STATS_FLUSH], 0);
  /* Every request falls in one bucket of its operation. */
  CHECK (s->has_hist[0] && !s->has_hist[1]);
  for (int op = 0; op < MAPPER_STATS_OPS; op++)
    CHECK_EQ (s->hist[0][op], s->ios[0][op]);
  for (int r = 0; r < 3; r++)
    CHECK_EQ (s->in_progress[r], 0);
}

/* Clears while the workers run: what each clear reported plus what is
 * left is every request, once.
 */
static _Atomic bool workers_done;

static void *
clearer (void *p)
{
  struct device *dev = p;
  struct sums *total = calloc (1, sizeof *total);

  while (!atomic_load (&workers_done)) {
    struct sums s = read_stats (dev, true);
    for (size_t r = 0; r < s.n; r++)
      for (int op = 0; op < MAPPER_STATS_OPS; op++) {
        total->ios[r][op] += s.ios[r][op];
        total->bytes[r][op] += s.bytes[r][op];
        total->hist[r][op] += s.hist[r][op];
      }
  }
  return total;
}

int
main (void)
{
  struct mapper_err err = { "" };
  struct device *dev;
  struct sums s;
  int r;

  CHECK_EQ (device_create ("st", &dev, &err), 0);
  /* No live table: nothing to show. */
  CHECK_EQ (device_stats (dev, -1, false, add_region, &s, &err), -ENXIO);
  CHECKF (strstr (err.msg, "no live table"), "%s", err.msg);

  device_load (dev, unit_parse ("0 2048 zero\n2048 2048 zero\n"));
  CHECK_EQ (device_resume (dev, &err), 0);
  s = read_stats (dev, false);
  CHECK_EQ (s.n, 3);
  CHECK_EQ (s.start[2], 1048576);
  CHECK_EQ (s.len[2], 1048576);
  CHECK_EQ (s.len[0], 2097152);
  /* An idle device keeps no set, even once read (10,000 of them), and
   * a read or a region check allocates none either.
   */
  CHECK (atomic_load (&dev->stats) == NULL);
  {
#ifdef COUNT_CALLOCS
    size_t before = atomic_load (&callocs);
#endif
    s = read_stats (dev, false);
    CHECK_EQ (s.n, 3);
    CHECK_EQ (s.len[1], 1048576);
    CHECK (s.has_hist[0] && !s.has_hist[1]);
    CHECK_EQ (device_stats (dev, 2, false, NULL, NULL, &err), 0);
    CHECK_EQ (device_stats (dev, 3, false, NULL, NULL, &err), -EINVAL);
    CHECKF (strstr (err.msg, "no region 3: regions are 0 (the device) to 2"),
            "%s", err.msg);
#ifdef COUNT_CALLOCS
    CHECK_EQ (atomic_load (&callocs), before);
#endif
  }
  CHECK (atomic_load (&dev->stats) == NULL);
  {
    char buf[512];
    CHECK_EQ (device_pread (dev, buf, sizeof buf, 0, 0), 0);
    CHECK (atomic_load (&dev->stats) != NULL);
    CHECK_EQ (device_replace (dev, unit_parse ("0 2048 zero\n2048 2048 zero\n"),
                              NULL, &err), 0);
    s = read_stats (dev, true);         /* back to 0 for what follows */
    CHECK_EQ (s.ios[0][MAPPER_STATS_READ], 1);
  }

  /* Three generations of threads: the later ones take over the
   * records (and blocks) of the earlier ones.
   */
  for (int round = 1; round <= 3; round++) {
    run_workers (dev);
    s = read_stats (dev, false);
    check_counts (&s, round);
  }

  /* Bad regions change nothing, even with clear. */
  r = device_stats (dev, 3, true, add_region, &s, &err);
  CHECK_EQ (r, -EINVAL);
  CHECKF (strstr (err.msg, "no region 3: regions are 0 (the device) to 2"),
          "%s", err.msg);
  s = read_stats (dev, false);
  check_counts (&s, 3);
  /* One region alone. */
  {
    struct sums one = { 0 };
    CHECK_EQ (device_stats (dev, 2, false, add_region, &one, &err), 0);
    CHECK_EQ (one.n, 3);
    CHECK_EQ (one.ios[2][MAPPER_STATS_DISCARD], 3 * THREADS);
    CHECK_EQ (one.ios[0][MAPPER_STATS_READ], 0);
  }

  /* A reload keeping the first target's start and length keeps its
   * counts and the device's; the second changed, and starts again.
   */
  CHECK_EQ (device_replace (dev, unit_parse ("0 2048 zero\n2048 1024 zero\n"
                                        "3072 1024 zero\n"), NULL, &err), 0);
  s = read_stats (dev, false);
  CHECK_EQ (s.n, 4);
  CHECK_EQ (s.ios[0][MAPPER_STATS_READ], 3 * THREADS * READS);
  CHECK_EQ (s.ios[1][MAPPER_STATS_READ], 3 * THREADS * READS);
  CHECK_EQ (s.ios[1][MAPPER_STATS_WRITE], 3 * THREADS * WRITES);
  CHECK_EQ (s.ios[2][MAPPER_STATS_WRITE], 0);
  CHECK_EQ (s.ios[0][MAPPER_STATS_FLUSH], 3 * THREADS);
  CHECK_EQ (device_replace (dev, unit_parse ("0 2048 zero\n2048 2048 zero\n"),
                            NULL, &err), 0);

  /* Clear: everything starts from 0, but in progress. */
  read_stats (dev, true);
  s = read_stats (dev, false);
  for (int op = 0; op < MAPPER_STATS_OPS; op++)
    for (int reg = 0; reg < 3; reg++)
      CHECK_EQ (s.ios[reg][op], 0);

  /* Clears racing the requests. */
  {
    pthread_t th;
    struct sums *total, rest;

    atomic_store (&workers_done, false);
    pthread_create (&th, NULL, clearer, dev);
    run_workers (dev);
    atomic_store (&workers_done, true);
    pthread_join (th, (void **) &total);
    rest = read_stats (dev, false);
    for (size_t reg = 0; reg < 3; reg++)
      for (int op = 0; op < MAPPER_STATS_OPS; op++) {
        total->ios[reg][op] += rest.ios[reg][op];
        total->bytes[reg][op] += rest.bytes[reg][op];
        total->hist[reg][op] += rest.hist[reg][op];
      }
    total->n = 3;
    total->has_hist[0] = true;
    check_counts (total, 1);
    free (total);
  }

  /* A single target covers the device: its region's values are read
   * from the device's (a request writes one region), less the flushes,
   * which no target counts, counted and in flight.  A reload keeping
   * it keeps its counts, one changing it starts it again.
   */
  {
    struct device *one;
    uint64_t n = THREADS;

    CHECK_EQ (device_create ("one", &one, &err), 0);
    device_load (one, unit_parse ("0 4096 zero\n"));
    CHECK_EQ (device_resume (one, &err), 0);
    run_workers (one);
    s = read_stats (one, false);
    CHECK_EQ (s.n, 2);
    CHECK_EQ (s.len[1], 2097152);
    for (int reg = 0; reg < 2; reg++) {
      CHECK_EQ (s.ios[reg][MAPPER_STATS_READ], n * READS);
      CHECK_EQ (s.bytes[reg][MAPPER_STATS_READ], n * READS * 512);
      CHECK_EQ (s.ios[reg][MAPPER_STATS_WRITE], n * WRITES);
      CHECK_EQ (s.bytes[reg][MAPPER_STATS_WRITE], n * WRITES * 1024);
      CHECK_EQ (s.ios[reg][MAPPER_STATS_DISCARD], n);
      CHECK_EQ (s.in_progress[reg], 0);
    }
    CHECK_EQ (s.ios[0][MAPPER_STATS_FLUSH], n);
    CHECK_EQ (s.ios[1][MAPPER_STATS_FLUSH], 0);
    CHECK (s.has_hist[0] && !s.has_hist[1]);
    CHECK_EQ (device_replace (one, unit_parse ("0 4096 zero\n"), NULL,
                              &err), 0);
    run_workers (one);
    s = read_stats (one, false);
    CHECK_EQ (s.ios[1][MAPPER_STATS_READ], 2 * n * READS);
    CHECK_EQ (s.ios[1][MAPPER_STATS_FLUSH], 0);
    CHECK_EQ (s.in_progress[1], 0);
    /* Two targets, then one again: the first region changed twice. */
    CHECK_EQ (device_replace (one, unit_parse ("0 2048 zero\n2048 2048 "
                                               "zero\n"), NULL, &err), 0);
    run_workers (one);
    CHECK_EQ (device_replace (one, unit_parse ("0 4096 zero\n"), NULL,
                              &err), 0);
    s = read_stats (one, false);
    CHECK_EQ (s.ios[0][MAPPER_STATS_READ], 3 * n * READS);
    CHECK_EQ (s.ios[1][MAPPER_STATS_READ], 0);
    run_workers (one);
    s = read_stats (one, false);
    CHECK_EQ (s.ios[0][MAPPER_STATS_READ], 4 * n * READS);
    CHECK_EQ (s.ios[1][MAPPER_STATS_READ], n * READS);
    CHECK_EQ (s.ios[1][MAPPER_STATS_WRITE], n * WRITES);
    CHECK_EQ (s.ios[0][MAPPER_STATS_FLUSH], 4 * n);
    CHECK_EQ (s.ios[1][MAPPER_STATS_FLUSH], 0);
    CHECK_EQ (s.in_progress[1], 0);
    /* A clear bases the target region as any other. */
    read_stats (one, true);
    s = read_stats (one, false);
    CHECK_EQ (s.ios[1][MAPPER_STATS_READ], 0);
    CHECK_EQ (s.ios[0][MAPPER_STATS_READ], 0);
    device_destroy (one);
  }

  /* Over MAPPER_STATS_MAX_TARGET_REGIONS targets: the device only. */
  {
    size_t n = MAPPER_STATS_MAX_TARGET_REGIONS + 1, len = 0;
    char *text = malloc (n * 32);
    uint64_t reads = read_stats (dev, false).ios[0][MAPPER_STATS_READ];

    for (size_t i = 0; i < n; i++)
      len += sprintf (text + len, "%zu 8 zero\n", i * 8);
    CHECK_EQ (device_replace (dev, unit_parse ("%s", text), NULL,
                              &err), 0);
    free (text);
    s = read_stats (dev, false);
    CHECK_EQ (s.n, 1);
    CHECK_EQ (s.ios[0][MAPPER_STATS_READ], reads);  /* kept */
    CHECK_EQ (device_stats (dev, 1, false, add_region, &s, &err), -EINVAL);
    CHECKF (strstr (err.msg, "too many targets"), "%s", err.msg);
  }

  /* A swap whose new set cannot be made (statistics off here; out of
   * memory in a server) loses the counts: the device region's interval
   * starts again at that swap, as its counts do.  It kept the time of
   * the first swap, so that rates were counts since the swap over a
   * longer interval.
   */
  {
    char buf[512];
    struct mapper_stats_region first = { 0 };
    uint64_t t0;

    CHECK_EQ (device_pread (dev, buf, sizeof buf, 0, 0), 0);
    CHECK (atomic_load (&dev->stats) != NULL);
    t0 = monotonic_ns ();
    mapper_stats_disabled = true;
    CHECK_EQ (device_replace (dev, unit_parse ("0 2048 zero\n"), NULL,
                              &err), 0);
    mapper_stats_disabled = false;
    CHECK (atomic_load (&dev->stats) == NULL);
    CHECK_EQ (device_stats (dev, 0, false, copy_region, &first, &err), 0);
    CHECK_EQ (first.ios[MAPPER_STATS_READ], 0);
    CHECKF (first.interval_ns <= monotonic_ns () - t0,
            "interval %" PRIu64 " ns is older than the swap",
            first.interval_ns);
  }

  /* Statistics off (the benchmark's "before"): from the next swap. */
  mapper_stats_disabled = true;
  CHECK_EQ (device_replace (dev, unit_parse ("0 2048 zero\n"), NULL, &err), 0);
  CHECK_EQ (device_stats (dev, -1, false, add_region, &s, &err), -ENOTSUP);
  CHECKF (strstr (err.msg, "statistics are off"), "%s", err.msg);
  {
    char buf[512];
    CHECK_EQ (device_pread (dev, buf, sizeof buf, 0, 0), 0);
  }
  mapper_stats_disabled = false;

  device_destroy (dev);
  UNIT_EXIT ();
}

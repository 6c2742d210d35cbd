/* SPDX-License-Identifier: BSD-3-Clause */
/* bench-thin-md: the thin-pool metadata layer (server/pdata/) alone, on a
 * sparse file: a million mappings with a bounded block cache.
 *
 *   bench-thin-md [-n MAPPINGS] [-c CACHE_BLOCKS] [-l LOOKUPS [200000]] FILE
 *
 * Maps MAPPINGS [1000000] blocks of one thin device (commits every
 * 65536), then reports: resident memory (VmRSS, and VmHWM the peak) with
 * the cache bounded to CACHE_BLOCKS [1024] 4 KiB blocks; the time of
 * create_snap (the snapshot shares the origin's tree: O(1) in the number
 * of mappings) and of the commit after it; find_block at random over all
 * the mappings (mostly cache misses, the file in the page cache) and
 * within 64 blocks (cache hits); the first writes to the origin after
 * the snapshot (each breaks sharing of a leaf); removing every mapping
 * of the origin (its leaves shared with the snapshot).  RESULT| lines for
 * bench/run.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pdata/thin-metadata.h"

static int fd;

static int
f_read (void *o, uint64_t off, size_t len, void *buf)
{
  (void) o;
  return pread (fd, buf, len, off) == (ssize_t) len ? 0 : -EIO;
}

static int
f_write (void *o, uint64_t off, size_t len, const void *buf)
{
  (void) o;
  return pwrite (fd, buf, len, off) == (ssize_t) len ? 0 : -EIO;
}

static int
f_flush (void *o)
{
  (void) o;
  return 0;          /* durability is not what is measured */
}

static const struct pd_blockdev_ops ops = { f_read, f_write, f_flush };

static double
now (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long
status_kb (const char *field)
{
  char line[256];
  long kb = -1;
  FILE *f = fopen ("/proc/self/status", "r");

  while (f && fgets (line, sizeof line, f))
    if (strncmp (line, field, strlen (field)) == 0)
      kb = strtol (line + strlen (field), NULL, 10);
  if (f)
    fclose (f);
  return kb;
}

#define DIE(...) do { fprintf (stderr, __VA_ARGS__); fputc ('\n', stderr); \
  exit (1); } while (0)

int
main (int argc, char **argv)
{
  uint64_t n = 1000000, lookups = 200000, b, d;
  size_t cache = 1024;
  struct thin_md *md;
  struct thin_md_dev *td;
  char err[PD_ERR_LEN];
  double t, t_ins, t_snap, t_commit, t_cold, t_hot, t_cow;
  uint64_t rng = 88172645463325252ull, sink = 0;
  bool shared;
  int c;

  while ((c = getopt (argc, argv, "n:c:l:")) != -1)
    switch (c) {
    case 'n': n = strtoull (optarg, NULL, 10); break;
    case 'c': cache = strtoull (optarg, NULL, 10); break;
    case 'l': lookups = strtoull (optarg, NULL, 10); break;
    default: DIE ("usage: bench-thin-md [-n N] [-c CACHE] [-l LOOKUPS] FILE");
    }
  if (optind != argc - 1)
    DIE ("usage: bench-thin-md [-n N] [-c CACHE] [-l LOOKUPS] FILE");
  fd = open (argv[optind], O_RDWR | O_CREAT | O_TRUNC, 0644);
  /* room for the mappings with their copies after the snapshot */
  if (fd == -1 || ftruncate (fd, (off_t) (n / 40 + 8192) * 4096) == -1)
    DIE ("%s: %s", argv[optind], strerror (errno));
  struct pd_blockdev bd = { &ops, NULL, (uint64_t) (n / 40 + 8192) * 4096 };
  struct thin_md_open_args a = {
    .dev = &bd, .data_block_sectors = 128, .nr_data_blocks = n + n / 8 + 1,
    .cache_blocks = cache,
  };

  printf ("baseline: VmRSS %ld KiB\n", status_kb ("VmRSS:"));
  if (thin_md_open (&a, &md, err) || thin_md_create_thin (md, 0, err) ||
      thin_md_dev_open (md, 0, &td, err))
    DIE ("%s", err);
  t = now ();
  for (uint64_t v = 0; v < n; v++) {
    if (thin_md_alloc_data_block (md, &b) || thin_md_insert_block (td, v, b)) {
      thin_md_last_error (md, err);
      DIE ("insert %llu: %s", (unsigned long long) v, err);
    }
    if ((v & 65535) == 65535 && thin_md_commit (md, err))
      DIE ("commit: %s", err);
  }
  if (thin_md_commit (md, err))
    DIE ("commit: %s", err);
  t_ins = now () - t;
  long rss = status_kb ("VmRSS:"), hwm = status_kb ("VmHWM:");
  printf ("%llu mappings: %.2f s (%.0f ns each), VmRSS %ld KiB, peak %ld KiB, "
          "cache %zu blocks = %zu KiB\n", (unsigned long long) n, t_ins,
          t_ins * 1e9 / n, rss, hwm, cache, cache * 4);

  t = now ();
  for (uint64_t i = 0; i < lookups; i++) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    if (thin_md_find_block (td, rng % n, &d, &shared))
      DIE ("lookup failed");
    sink += d;
  }
  t_cold = (now () - t) * 1e9 / lookups;
  t = now ();
  for (uint64_t i = 0; i < lookups; i++) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    if (thin_md_find_block (td, rng % 64, &d, &shared))
      DIE ("lookup failed");
    sink += d;
  }
  t_hot = (now () - t) * 1e9 / lookups;

  t = now ();
  if (thin_md_create_snap (md, 1, 0, err))
    DIE ("create_snap: %s", err);
  t_snap = now () - t;
  t = now ();
  if (thin_md_commit (md, err))
    DIE ("commit: %s", err);
  t_commit = now () - t;

  /* the first write to each of 1000 leaves after the snapshot */
  t = now ();
  for (uint64_t i = 0; i < 1000; i++) {
    uint64_t v = (i * 997) % n;
    if (thin_md_alloc_data_block (md, &b) || thin_md_insert_block (td, v, b))
      DIE ("cow insert failed");
  }
  t_cow = (now () - t) * 1e6 / 1000;
  if (thin_md_commit (md, err))
    DIE ("commit: %s", err);
  /* discard the whole origin: its leaves are shared with the snapshot */
  t = now ();
  if (thin_md_remove_range (td, 0, n))
    DIE ("remove_range failed");
  double t_remove = now () - t;
  t = now ();
  if (thin_md_commit (md, err))
    DIE ("commit: %s", err);
  printf ("remove_range of all %llu: %.2f s (%.0f ns each); commit %.1f ms\n",
          (unsigned long long) n, t_remove, t_remove * 1e9 / n,
          (now () - t) * 1e3);
  thin_md_dev_close (td);
  rss = status_kb ("VmRSS:");
  hwm = status_kb ("VmHWM:");
  if (thin_md_close (md, err))
    DIE ("close: %s", err);

  printf ("find_block: %.0f ns at random over %llu (cache misses), %.0f ns "
          "within 64 (hits)\n", t_cold, (unsigned long long) n, t_hot);
  printf ("create_snap: %.3f ms; the commit after it %.3f ms\n",
          t_snap * 1e3, t_commit * 1e3);
  printf ("first writes after the snapshot: %.1f us each (break sharing)\n",
          t_cow);
  printf ("at the end: VmRSS %ld KiB, peak %ld KiB (sink %llu)\n", rss, hwm,
          (unsigned long long) (sink & 1));
  printf ("RESULT|thin-md: create_snap with %llu mapped blocks, ms|-|%.3f|-|"
          "<100 ms|%s\n", (unsigned long long) n, t_snap * 1e3,
          t_snap < 0.1 ? "met" : "MISSED");
  printf ("RESULT|thin-md: peak RSS with %llu mappings, MiB (cache %zu "
          "blocks)|-|%.1f|-|bounded|-\n", (unsigned long long) n, cache,
          hwm / 1024.0);
  printf ("RESULT|thin-md: find_block ns, cache hit / miss|%.0f|%.0f|%.2f|-|-\n",
          t_hot, t_cold, t_cold / t_hot);
  return 0;
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* bench-clone-commit: what one clone commit costs on a large clone, the
 * engine alone (no nbdkit, no socket), for callgrind: how much of the
 * region bitmap a commit walks when only a few regions changed.
 *
 *   bench-clone-commit DIR [LOG2_REGIONS [CHANGED [COMMITS]]]
 *
 * A clone of 2^LOG2_REGIONS [28: 1 TiB] regions of 4 KiB over sparse
 * files made in DIR (metadata, destination, source; removed at the
 * end), no_hydration and the engine not started (no worker, so no
 * periodic commit): COMMITS [4] times, CHANGED [16] regions spread over
 * the device are overwritten whole and a flush commits them.  Prints the
 * commits' wall time; count instructions with
 *
 *   valgrind --tool=callgrind --toggle-collect=clone_commit \
 *     bench/bench-clone-commit DIR
 *
 * (only clone_commit and what it calls: the metadata's own writes
 * included).  Built by "make check", never run by it.
 */
#include <config.h>

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

static char paths[3][4096];

static void
sparse (int i, const char *dir, const char *name, uint64_t size)
{
  int fd;

  snprintf (paths[i], sizeof paths[i], "%s/%s", dir, name);
  fd = open (paths[i], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || ftruncate (fd, size) < 0) {
    perror (paths[i]);
    exit (1);
  }
  close (fd);
}

int
main (int argc, char *argv[])
{
  struct mapper_err err = { "" };
  unsigned shift = argc > 2 ? atoi (argv[2]) : 28;
  long changed = argc > 3 ? atol (argv[3]) : 16;
  long commits = argc > 4 ? atol (argv[4]) : 4;
  uint64_t regions, size, ns = 0;
  struct device *dev;
  struct table *t;
  char text[16384];
  static char buf[4096];

  if (argc < 2 || shift < 6 || shift > 30 || changed < 1 || commits < 1) {
    fprintf (stderr, "usage: bench-clone-commit DIR [LOG2_REGIONS (6-30) "
             "[CHANGED [COMMITS]]]\n");
    return 2;
  }
  regions = 1ULL << shift;
  size = regions * 4096;
  /* The bitset's array blocks (509 words each) twice over, and room. */
  sparse (0, argv[1], "md.img", (regions / 64 / 509 * 2 + 1024) * 4096);
  sparse (1, argv[1], "dest.img", size);
  sparse (2, argv[1], "src.img", size);
  snprintf (text, sizeof text, "0 %" PRIu64 " clone %s %s %s 8 1 "
            "no_hydration\n", size >> 9, paths[0], paths[1], paths[2]);
  if (device_create ("bench", &dev, &err) < 0 ||
      table_parse (text, "bench", &t, &err) < 0 ||
      device_replace (dev, t, NULL, &err) < 0) {
    fprintf (stderr, "bench-clone-commit: %s\n", err.msg);
    return 1;
  }
  memset (buf, 'x', sizeof buf);
  for (long c = 0; c < commits; c++) {
    uint64_t t0;

    for (long i = 0; i < changed; i++) {
      uint64_t r = (uint64_t) (c * changed + i) * 2654435761u % regions;
      if (device_pwrite (dev, buf, sizeof buf, r * 4096, 0) < 0)
        abort ();
    }
    t0 = monotonic_ns ();
    if (device_flush (dev, 0) < 0)
      abort ();
    ns += monotonic_ns () - t0;
  }
  printf ("bench-clone-commit: %" PRIu64 " regions (%" PRIu64 " GiB), %ld "
          "commits of %ld regions: %.3f ms per commit\n", regions,
          size >> 30, commits, changed, ns / 1e6 / commits);
  device_destroy (dev);
  for (int i = 0; i < 3; i++)
    unlink (paths[i]);
  return 0;
}

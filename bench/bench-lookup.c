/* SPDX-License-Identifier: BSD-3-Clause */
/* bench-lookup: the cost of finding a request's targets in a wide table,
 * for A/B comparisons without fio, nbdkit or the network.
 *
 *   bench-lookup [-n TARGETS] [-s SECTORS] [-l LOOKUPS] [-p POLLUTE_BYTES]
 *                [-r ROUNDS] [-m]
 *
 * Builds a table of TARGETS [100000] "zero" targets of SECTORS [20]
 * sectors each (bench-wide's shape), then times LOOKUPS [1000000]
 * table_find_target calls at random 4K-aligned offsets.  With -m the
 * targets are linear (over a sparse temporary file) and what is timed is
 * what device_io does before issuing a 4K read: the lookup, then each
 * target's map (struct target, the target's private data).
 *
 * Each lookup depends on the previous one (latency, as in a request, not
 * throughput) and is followed by writes to POLLUTE_BYTES [16384] of an
 * 8 MiB buffer, walked in turn, standing for the rest of a request's
 * memory traffic: the table is about as cold as in a server.  The same
 * loop without the lookup is timed too, the two in turns; the difference
 * per lookup is printed for ROUNDS [5] rounds and their median, after
 * one untimed pass that warms everything up.  -p 0: all hot.
 *
 * Built on demand: make -C bench bench-lookup.  Under
 * valgrind --tool=cachegrind the same program gives instructions and
 * cache misses per lookup (cg_annotate: table_find_target, called
 * LOOKUPS x (ROUNDS + 1) times).
 */
#include <config.h>

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define POLLUTE_AREA (8 << 20)
#define REQUEST 4096

static volatile uint64_t zero_mask;     /* 0, unknown to the compiler */
static volatile size_t sink;

static uint64_t
xorshift (uint64_t *s)
{
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* device_io's split of a REQUEST-byte read at off, without the I/O. */
static size_t
split (const struct table *t, uint64_t off, char *buf)
{
  struct io_req req;
  uint64_t pos = off, left = REQUEST;
  size_t n;

  io_req_init (&req, IO_READ, 0);
  for (size_t i = table_find_target (t, off); left > 0; i++) {
    struct target *ti = &t->targets[i];
    uint64_t toff = pos - ti->begin, len = MIN (left, ti->len - toff);

    if (ti->type->map (ti, &req, toff, len, buf + (pos - off)) < 0)
      abort ();
    pos += len;
    left -= len;
  }
  n = req.nr + (size_t) req.clones[0].offset;
  io_req_release (&req);
  return n;
}

/* One timed pass; with_lookup false times the pollution alone. */
static uint64_t
pass (const struct table *t, bool map, const uint64_t *offs,
      size_t nr_offs, size_t lookups, unsigned char *area, size_t pollute,
      bool with_lookup)
{
  static char buf[REQUEST];
  uint64_t dep = zero_mask, t0, t1;
  size_t r = 0, p = 0;

  t0 = monotonic_ns ();
  for (size_t i = 0; i < lookups; i++) {
    uint64_t off = offs[i % nr_offs] ^ (r & dep);

    if (!with_lookup)
      r = off;
    else if (map)
      r = split (t, off, buf);
    else
      r = table_find_target (t, off);
    /* Starts after the lookup, as a request's other work does. */
    p += r & dep;
    for (size_t j = 0; j < pollute; j += 64) {
      area[p]++;
      p = p + 64 < POLLUTE_AREA ? p + 64 : 0;
    }
  }
  t1 = monotonic_ns ();
  sink = r + p;
  return t1 - t0;
}

static int
cmp_double (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;

  return x < y ? -1 : x > y;
}

int
main (int argc, char *argv[])
{
  size_t ntargets = 100000, sectors = 20, lookups = 1000000;
  size_t pollute = 16384;
  unsigned rounds = 5;
  bool map = false;
  const size_t nr_offs = 1 << 16;
  uint64_t seed = 0x9e3779b97f4a7c15, *offs;
  char file[] = "/tmp/bench-lookup.XXXXXX";
  struct mapper_err err;
  struct table *t;
  unsigned char *area;
  double *ns;
  char *text, *p;
  uint64_t t0;
  int c, r;

  while ((c = getopt (argc, argv, "n:s:l:p:r:m")) != -1) {
    switch (c) {
    case 'n': ntargets = strtoull (optarg, NULL, 0); break;
    case 's': sectors = strtoull (optarg, NULL, 0); break;
    case 'l': lookups = strtoull (optarg, NULL, 0); break;
    case 'p': pollute = strtoull (optarg, NULL, 0); break;
    case 'r': rounds = strtoul (optarg, NULL, 0); break;
    case 'm': map = true; break;
    default: ntargets = 0;
    }
  }
  if (ntargets == 0 || sectors == 0 || rounds == 0 || optind < argc ||
      (uint64_t) ntargets * sectors * 512 < REQUEST) {
    fprintf (stderr, "usage: bench-lookup [-n TARGETS] [-s SECTORS] "
             "[-l LOOKUPS] [-p POLLUTE_BYTES] [-r ROUNDS] [-m]\n");
    return 1;
  }
  text = p = malloc (ntargets * (64 + strlen (file)) + 1);
  offs = malloc (nr_offs * sizeof *offs);
  area = calloc (1, POLLUTE_AREA);
  ns = calloc (rounds, sizeof *ns);
  if (!text || !offs || !area || !ns) {
    perror ("bench-lookup");
    return 1;
  }
  /* Linear's backing file, unlinked once the table has opened it. */
  if (map) {
    int fd = mkstemp (file);

    if (fd == -1 || ftruncate (fd, (off_t) ntargets * sectors * 512) == -1) {
      perror (file);
      if (fd >= 0)
        unlink (file);
      return 1;
    }
    close (fd);
  }
  for (size_t i = 0; i < ntargets; i++) {
    if (map)
      p += sprintf (p, "%zu %zu linear %s %zu\n", i * sectors, sectors, file,
                    i * sectors);
    else
      p += sprintf (p, "%zu %zu zero\n", i * sectors, sectors);
  }
  t0 = monotonic_ns ();
  r = table_parse (text, "<bench>", &t, &err);
  if (map)
    unlink (file);
  if (r < 0) {
    fprintf (stderr, "bench-lookup: %s\n", err.msg);
    return 1;
  }
  printf ("bench-lookup: %zu targets: table_parse %.1f ms\n", ntargets,
          (monotonic_ns () - t0) / 1e6);
  free (text);
  for (size_t i = 0; i < nr_offs; i++)
    offs[i] = xorshift (&seed) % (t->caps.size / REQUEST) * REQUEST;
  /* One untimed pass first: round 1's first pass would otherwise pay
   * for the area's page faults and everything else's first touch. */
  pass (t, map, offs, nr_offs, lookups, area, pollute, true);

  for (unsigned i = 0; i < rounds; i++) {
    uint64_t a, b;

    /* Alternate which pass goes first, so drift hits both alike. */
    if (i % 2 == 0) {
      a = pass (t, map, offs, nr_offs, lookups, area, pollute, false);
      b = pass (t, map, offs, nr_offs, lookups, area, pollute, true);
    }
    else {
      b = pass (t, map, offs, nr_offs, lookups, area, pollute, true);
      a = pass (t, map, offs, nr_offs, lookups, area, pollute, false);
    }

    ns[i] = ((double) b - (double) a) / lookups;
    printf ("  round %u: %.1f ns/%s (%.1f with, %.1f without)\n", i + 1,
            ns[i], map ? "split" : "lookup", (double) b / lookups,
            (double) a / lookups);
  }
  qsort (ns, rounds, sizeof *ns, cmp_double);
  printf ("bench-lookup: %zu targets of %zu sectors, pollute %zu bytes: "
          "median %.1f ns/%s\n", ntargets, sectors, pollute, ns[rounds / 2],
          map ? "split (lookup + map)" : "lookup");
  table_free (t);
  free (offs);
  free (area);
  free (ns);
  return 0;
}

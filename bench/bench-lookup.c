/* bench-lookup: the cost of table_find_target alone, for A/B comparisons
 * of the lookup on a wide table, without fio, nbdkit or the network.
 *
 *   bench-lookup [TARGETS [LOOKUPS [POLLUTE_BYTES [ROUNDS]]]]
 *
 * Builds a table of TARGETS [100000] "zero" targets of 20 sectors (the
 * shape bench-wide uses), then times LOOKUPS [1000000] lookups at random
 * offsets.  Each lookup depends on the previous one (latency, as in a
 * request, not throughput) and is followed by writes to POLLUTE_BYTES
 * [16384] of an 8 MiB buffer, walked in turn, standing for the rest of a
 * request's memory traffic (socket buffers, the 4K copy): the table is
 * as cold as it is in a server.  The same loop without the lookup is
 * timed too; the difference, per lookup, is printed for ROUNDS [5]
 * rounds and their median.  POLLUTE_BYTES=0: everything hot.
 *
 * Built on demand: make -C bench bench-lookup.  Under
 * valgrind --tool=cachegrind the same program gives instructions and
 * cache misses per lookup (cg_annotate, function table_find_target).
 */
#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define POLLUTE_AREA (8 << 20)

static volatile uint64_t zero_mask;     /* 0, unknown to the compiler */
static volatile size_t sink;

static uint64_t
now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t
xorshift (uint64_t *s)
{
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* One timed pass; with_lookup false times the pollution alone. */
static uint64_t
pass (const struct table *t, const uint64_t *offs, size_t nr_offs,
      size_t lookups, unsigned char *area, size_t pollute, bool with_lookup)
{
  uint64_t dep = zero_mask, t0, t1;
  size_t r = 0, p = 0;

  t0 = now_ns ();
  for (size_t i = 0; i < lookups; i++) {
    uint64_t off = offs[i % nr_offs] ^ (r & dep);

    if (with_lookup)
      r = table_find_target (t, off);
    else
      r = off;
    /* Starts after the lookup, as a request's other work does. */
    p += r & dep;
    for (size_t j = 0; j < pollute; j += 64) {
      area[p]++;
      p = p + 64 < POLLUTE_AREA ? p + 64 : 0;
    }
  }
  t1 = now_ns ();
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
  size_t ntargets = argc > 1 ? strtoull (argv[1], NULL, 0) : 100000;
  size_t lookups = argc > 2 ? strtoull (argv[2], NULL, 0) : 1000000;
  size_t pollute = argc > 3 ? strtoull (argv[3], NULL, 0) : 16384;
  unsigned rounds = argc > 4 ? strtoul (argv[4], NULL, 0) : 5;
  const size_t nr_offs = 1 << 16;
  uint64_t seed = 0x9e3779b97f4a7c15, *offs;
  struct mapper_err err;
  struct table *t;
  unsigned char *area;
  double *ns;
  char *text, *p;
  uint64_t t0;
  int r;

  if (ntargets == 0 || rounds == 0) {
    fprintf (stderr, "usage: bench-lookup [TARGETS [LOOKUPS "
             "[POLLUTE_BYTES [ROUNDS]]]]\n");
    return 1;
  }
  text = p = malloc (ntargets * 48 + 1);
  offs = malloc (nr_offs * sizeof *offs);
  area = calloc (1, POLLUTE_AREA);
  ns = calloc (rounds, sizeof *ns);
  if (!text || !offs || !area || !ns) {
    perror ("bench-lookup");
    return 1;
  }
  for (size_t i = 0; i < ntargets; i++)
    p += sprintf (p, "%zu 20 zero\n", i * 20);
  t0 = now_ns ();
  r = table_parse (text, "<bench>", &t, &err);
  if (r < 0) {
    fprintf (stderr, "bench-lookup: %s\n", err.msg);
    return 1;
  }
  printf ("bench-lookup: %zu targets: table_parse %.1f ms\n", ntargets,
          (now_ns () - t0) / 1e6);
  free (text);
  for (size_t i = 0; i < nr_offs; i++)
    offs[i] = xorshift (&seed) % t->caps.size;

  for (unsigned i = 0; i < rounds; i++) {
    uint64_t a = pass (t, offs, nr_offs, lookups, area, pollute, false);
    uint64_t b = pass (t, offs, nr_offs, lookups, area, pollute, true);

    ns[i] = ((double) b - (double) a) / lookups;
    printf ("  round %u: %.1f ns/lookup (%.1f with, %.1f without)\n", i + 1,
            ns[i], (double) b / lookups, (double) a / lookups);
  }
  qsort (ns, rounds, sizeof *ns, cmp_double);
  printf ("bench-lookup: %zu targets, pollute %zu bytes: median %.1f "
          "ns/lookup\n", ntargets, pollute, ns[rounds / 2]);
  table_free (t);
  free (offs);
  free (area);
  free (ns);
  return 0;
}

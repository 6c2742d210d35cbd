/* Unit tests: striped mapping math.  For 1..16 stripes and power-of-two
 * and other chunk sizes, write the whole device with odd-sized unaligned
 * requests and check every backing file byte for byte against an
 * independent model of the layout; read back with other splits; zero
 * ranges across chunk edges.
 */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "unit.h"

#define MAX_STRIPES 16
#define ROWS 4
#define SLACK 1300                /* bytes after each stripe's area */

struct config {
  unsigned n;                     /* stripes */
  uint64_t chunk;                 /* bytes */
  uint64_t lead;                  /* bytes of zero target before it */
  uint64_t len;                   /* bytes of the striped target */
  uint64_t start[MAX_STRIPES];    /* bytes into each backing file */
  uint64_t fsize[MAX_STRIPES];
  uint64_t seed;
  char *path[MAX_STRIPES];
  unsigned char *bg[MAX_STRIPES]; /* expected backing file contents */
  unsigned char *dev;             /* expected device contents */
};

/* Independent model: where target byte d lives. */
static void
model_locate (const struct config *c, uint64_t d, unsigned *stripe,
              uint64_t *off)
{
  uint64_t chunk_nr = d / c->chunk, in = d % c->chunk;

  *stripe = chunk_nr % c->n;
  *off = c->start[*stripe] + (chunk_nr / c->n) * c->chunk + in;
}

static void
model_store (struct config *c, uint64_t devoff, const unsigned char *buf,
             uint64_t len)
{
  for (uint64_t i = 0; i < len; i++) {
    uint64_t d = devoff + i;
    if (d < c->lead)
      continue;                   /* zero target: dropped */
    unsigned s;
    uint64_t off;
    model_locate (c, d - c->lead, &s, &off);
    c->bg[s][off] = buf ? buf[i] : 0;
    c->dev[d] = buf ? buf[i] : 0;
  }
}

static int
check_files (const struct config *c, const char *when)
{
  int bad = 0;

  for (unsigned s = 0; s < c->n; s++) {
    size_t size;
    char *got = unit_read_file (c->path[s], &size);
    if (got == NULL || size != c->fsize[s]) {
      fprintf (stderr, "stripes %u chunk %" PRIu64 " lead %" PRIu64
               ": %s: stripe %u: cannot read or size changed\n",
               c->n, c->chunk, c->lead, when, s);
      bad++;
    }
    else {
      long d = unit_first_diff (got, c->bg[s], size);
      if (d >= 0) {
        fprintf (stderr, "stripes %u chunk %" PRIu64 " (bytes) lead %" PRIu64
                 ": %s: stripe %u file offset %ld: got 0x%02x want 0x%02x\n",
                 c->n, c->chunk, c->lead, when, s, d,
                 (unsigned char) got[d], c->bg[s][d]);
        bad++;
      }
    }
    free (got);
  }
  return bad;
}

static int
read_back (struct device *dev, const struct config *c, const uint32_t *lens,
           size_t nlens, uint64_t first, const char *when)
{
  uint64_t size = c->lead + c->len;
  unsigned char *buf = malloc (size);
  uint64_t pos = 0;
  int bad = 0;

  /* An initial short piece shifts the alignment of the whole split. */
  for (size_t k = 0; pos < size; k++) {
    uint64_t n = k == 0 ? first : lens[k % nlens];
    int r;
    n = MIN (n, size - pos);
    if (n == 0)
      continue;
    r = device_pread (dev, buf + pos, n, pos, 0);
    if (r != 0) {
      fprintf (stderr, "stripes %u chunk %" PRIu64 ": %s: pread %" PRIu64
               "+%" PRIu64 " = %d\n", c->n, c->chunk, when, pos, n, r);
      bad++;
    }
    pos += n;
  }
  {
    long d = unit_first_diff (buf, c->dev, size);
    if (d >= 0) {
      fprintf (stderr, "stripes %u chunk %" PRIu64 " lead %" PRIu64
               ": %s: device offset %ld: got 0x%02x want 0x%02x\n",
               c->n, c->chunk, c->lead, when, d, buf[d], c->dev[d]);
      bad++;
    }
  }
  free (buf);
  return bad;
}

static void
run_config (unsigned n, uint64_t chunk_sectors, uint64_t lead_sectors)
{
  static const uint32_t wlens[] = { 1, 511, 513, 4097, 3, 1031, 65541, 2 };
  static const uint32_t rlens[] = { 4099, 7, 512, 1023, 2, 100003, 1 };
  struct config c = { .n = n, .chunk = chunk_sectors * 512,
                      .lead = lead_sectors * 512 };
  struct mapper_err err = { "" };
  struct table *t = NULL;
  struct device *dev = NULL;
  char *text, name[64];
  size_t used = 0, cap = 4096;
  uint64_t size, pos;
  unsigned char *buf;
  int bad = 0, r;

  c.len = (uint64_t) n * c.chunk * ROWS;
  c.seed = n * 100000 + chunk_sectors * 10 + lead_sectors;
  size = c.lead + c.len;
  c.dev = calloc (1, size);

  /* Backing files: non-zero, different start offsets per stripe and a
   * patterned background so stray writes show.
   */
  text = malloc (cap);
  if (lead_sectors)
    used += snprintf (text + used, cap - used, "0 %" PRIu64 " zero\n",
                      lead_sectors);
  used += snprintf (text + used, cap - used, "%" PRIu64 " %" PRIu64
                    " striped %u %" PRIu64, lead_sectors, c.len / 512, n,
                    chunk_sectors);
  for (unsigned s = 0; s < n; s++) {
    char fname[32];
    snprintf (fname, sizeof fname, "stripe%u", s);
    c.path[s] = strdup (unit_path (fname));
    c.start[s] = ((s * 7 + 1) % 11 + 1) * 512;
    c.fsize[s] = c.start[s] + c.len / n + SLACK;
    c.bg[s] = malloc (c.fsize[s]);
    unit_fill (c.bg[s], c.fsize[s], c.seed + 1000 + s, 0);
    unit_write_file (c.path[s], c.bg[s], c.fsize[s]);
    used += snprintf (text + used, cap - used, " %s %" PRIu64, c.path[s],
                      c.start[s] / 512);
  }
  used += snprintf (text + used, cap - used, "\n");
  if (used >= cap)
    UNIT_FATAL ("table text too long");
  /* The device initially reads the background. */
  for (uint64_t d = 0; d < c.len; d++) {
    unsigned s;
    uint64_t off;
    model_locate (&c, d, &s, &off);
    c.dev[c.lead + d] = c.bg[s][off];
  }

  snprintf (name, sizeof name, "striped-%u-%" PRIu64 "-%" PRIu64, n,
            chunk_sectors, lead_sectors);
  r = table_parse (text, name, &t, &err);
  CHECKF (r == 0, "%s: %s", name, err.msg);
  if (r != 0)
    goto out;
  CHECK (table_caps (t)->size == size);
  CHECK (table_nr_backends (t) == n);
  r = device_create (name, &dev, &err);
  CHECKF (r == 0, "%s", err.msg);
  if (r != 0) {
    table_free (t);
    goto out;
  }
  device_load (dev, t);
  r = device_resume (dev, &err);
  CHECKF (r == 0, "%s", err.msg);
  if (r != 0)
    goto out;

  /* Nothing written yet: reading gives the background. */
  bad += read_back (dev, &c, rlens, ARRAY_SIZE (rlens), size, "initial");

  /* Write the whole device (the first request spans the zero/striped
   * edge when there is a lead).
   */
  buf = malloc (65541);
  for (pos = 0, used = 0; pos < size; used++) {
    uint64_t len = MIN (wlens[used % ARRAY_SIZE (wlens)], size - pos);
    if (used == 0 && c.lead)
      len = MIN (c.lead + 700, size);
    unit_fill (buf, len, c.seed, pos);
    r = device_pwrite (dev, buf, len, pos, 0);
    if (r != 0) {
      fprintf (stderr, "%s: pwrite %" PRIu64 "+%" PRIu64 " = %d\n", name,
               pos, len, r);
      bad++;
    }
    model_store (&c, pos, buf, len);
    pos += len;
  }
  free (buf);
  bad += check_files (&c, "after writes");
  bad += read_back (dev, &c, rlens, ARRAY_SIZE (rlens), 1, "read split 1");
  bad += read_back (dev, &c, wlens, ARRAY_SIZE (wlens), 513,
                    "read split 2");
  bad += read_back (dev, &c, rlens, ARRAY_SIZE (rlens), size, "whole read");

  /* Zero ranges straddling chunk edges (and the whole first row). */
  {
    uint64_t ranges[][2] = {
      { c.lead + c.chunk - 1, 2 },
      { c.lead + 2 * c.chunk - 300, c.chunk + 600 },
      { c.lead + c.len / ROWS - 1, 3 },           /* row edge */
      { c.lead + 5, c.len / ROWS },
      { c.lead + c.len - 513, 513 },              /* device end */
      { 0, c.lead + 1 },
    };
    for (size_t k = 0; k < ARRAY_SIZE (ranges); k++) {
      uint64_t off = ranges[k][0], len = ranges[k][1];
      if (off >= size || len == 0)
        continue;
      len = MIN (len, size - off);
      r = device_zero (dev, len, off, k & 1 ? MAPPER_MAY_TRIM : 0);
      if (r != 0) {
        fprintf (stderr, "%s: zero %" PRIu64 "+%" PRIu64 " = %d\n", name,
                 off, len, r);
        bad++;
      }
      model_store (&c, off, NULL, len);
    }
    bad += check_files (&c, "after zero");
    bad += read_back (dev, &c, rlens, ARRAY_SIZE (rlens), 3, "after zero");
  }

  /* Beyond the end. */
  {
    char b2[2];
    CHECK (device_pread (dev, b2, 2, size - 1, 0) == -EIO);
    CHECK (device_pwrite (dev, b2, 2, size - 1, 0) == -ENOSPC);
    bad += check_files (&c, "after writes beyond the end");
  }

  if (bad) {
    fprintf (stderr, "FAILED: %s (table: %s)\n", name, text);
    unit_failures += bad;
  }
 out:
  if (dev)
    device_destroy (dev);
  for (unsigned s = 0; s < n; s++) {
    unlink (c.path[s]);
    free (c.path[s]);
    free (c.bg[s]);
  }
  free (c.dev);
  free (text);
}

/* The power-of-two fast paths and the general path must agree on a big
 * offset (no 32-bit truncation): a 2-row, 3-stripe device whose stripes
 * start deep inside sparse files.
 */
static void
test_big_offsets (void)
{
  static const uint64_t chunks[] = { 8, 7, 2048 };
  struct mapper_err err = { "" };

  for (size_t k = 0; k < ARRAY_SIZE (chunks); k++) {
    uint64_t chunk = chunks[k] * 512;
    uint64_t starts[3] = { (1ULL << 32) + 512, (1ULL << 33) - 1024,
                           5ULL << 30 };
    uint64_t len = 3 * chunk * 2;
    char *paths[3], *text;
    struct table *t;
    struct device *dev;
    unsigned char *buf = malloc (len), *back = malloc (chunk + 2);
    int r;

    for (int s = 0; s < 3; s++) {
      char fname[32];
      snprintf (fname, sizeof fname, "big%d", s);
      paths[s] = strdup (unit_path (fname));
      unit_write_file (paths[s], NULL, starts[s] + chunk * 2);
    }
    text = unit_sprintf ("0 %" PRIu64 " striped 3 %" PRIu64 " %s %" PRIu64
                         " %s %" PRIu64 " %s %" PRIu64 "\n", len / 512,
                         chunks[k], paths[0], starts[0] / 512, paths[1],
                         starts[1] / 512, paths[2], starts[2] / 512);
    r = table_parse (text, "big", &t, &err);
    CHECKF (r == 0, "%s", err.msg);
    if (r == 0) {
      CHECK (device_create ("big", &dev, &err) == 0);
      device_load (dev, t);
      CHECK (device_resume (dev, &err) == 0);
      unit_fill (buf, len, 77 + k, 0);
      CHECK (device_pwrite (dev, buf, len, 0, 0) == 0);
      /* Chunk 4 = stripe 1, row 1: file offset starts[1] + chunk. */
      {
        int fd = open (paths[1], O_RDONLY);
        CHECK (fd >= 0);
        CHECK (pread (fd, back, chunk, starts[1] + chunk) == (ssize_t) chunk);
        CHECK (memcmp (back, buf + 4 * chunk, chunk) == 0);
        close (fd);
      }
      /* Chunk 2 = stripe 2, row 0. */
      {
        int fd = open (paths[2], O_RDONLY);
        CHECK (pread (fd, back, chunk, starts[2]) == (ssize_t) chunk);
        CHECK (memcmp (back, buf + 2 * chunk, chunk) == 0);
        close (fd);
      }
      /* Read across the chunk 2/3 edge (stripe 2 row 0 -> stripe 0 row 1). */
      CHECK (device_pread (dev, back, chunk + 2, 3 * chunk - 1 - chunk / 2, 0)
             == 0);
      CHECK (memcmp (back, buf + 3 * chunk - 1 - chunk / 2, chunk + 2) == 0);
      device_destroy (dev);
    }
    for (int s = 0; s < 3; s++) {
      unlink (paths[s]);
      free (paths[s]);
    }
    free (text);
    free (buf);
    free (back);
  }
}

int
main (void)
{
  static const uint64_t chunks[] = { 1, 8, 128, 3, 5, 7 };

  unit_tmpdir ();
  for (unsigned n = 1; n <= MAX_STRIPES; n++)
    for (size_t k = 0; k < ARRAY_SIZE (chunks); k++) {
      run_config (n, chunks[k], 0);
      run_config (n, chunks[k], 3);
    }
  test_big_offsets ();
  UNIT_EXIT ();
}

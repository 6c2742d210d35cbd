/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: striped mapping math.  For 1..16 stripes and power-of-two
 * and other chunk sizes, write the whole device with odd-sized unaligned
 * requests and check every backing file byte for byte against an
 * independent model of the layout; read back with other splits; zero
 * ranges across chunk edges.
 *
 * Extents: the striped target merges one query per stripe into device
 * order; every answer must be exactly a reference built chunk by chunk
 * from the backing files' own SEEK_DATA/SEEK_HOLE, coalesced (one extent
 * per run of a type), at chunk edges, for partial (MAX_EXTENTS) replies,
 * REQ_ONE, stacked stripes and remote stripes that answer for less than
 * asked.
 */
#include <config.h>

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* --- extents ------------------------------------------------------------ */

#define XMAX_EXTENTS 4096         /* extents.c's MAX_EXTENTS */
#define HZ (MAPPER_EXTENT_HOLE | MAPPER_EXTENT_ZERO)

struct xt { uint64_t off, len; uint32_t type; };
struct xlist { size_t n, cap; struct xt *e; };

static void
xpush (struct xlist *l, uint64_t off, uint64_t len, uint32_t type,
       bool coalesce)
{
  if (len == 0)
    return;
  if (coalesce && l->n && l->e[l->n - 1].type == type &&
      l->e[l->n - 1].off + l->e[l->n - 1].len == off) {
    l->e[l->n - 1].len += len;
    return;
  }
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 64;
    l->e = realloc (l->e, l->cap * sizeof *l->e);
    if (l->e == NULL)
      UNIT_FATAL ("out of memory");
  }
  l->e[l->n++] = (struct xt) { off, len, type };
}

static int
xcollect (void *opaque, uint64_t off, uint64_t len, uint32_t type)
{
  xpush (opaque, off, len, type, false);
  return 0;
}

/* What the file says about [off, off+len), by lseek, into l at device
 * offset doff on: the reference, independent of the backends' code.
 */
static void
ref_file (int fd, uint64_t off, uint64_t len, uint64_t doff,
          struct xlist *l)
{
  uint64_t end = off + len;

  while (off < end) {
    off_t data = lseek (fd, off, SEEK_DATA), hole;
    uint64_t n;

    if (data == -1 && errno != ENXIO)
      UNIT_FATAL ("SEEK_DATA: %s", strerror (errno));
    if (data == -1 || (uint64_t) data >= end)
      data = end;
    if ((uint64_t) data > off) {
      n = data - off;
      xpush (l, doff, n, HZ, true);
      off += n, doff += n;
      continue;
    }
    hole = lseek (fd, off, SEEK_HOLE);
    if (hole == -1)
      UNIT_FATAL ("SEEK_HOLE: %s", strerror (errno));
    n = MIN ((uint64_t) hole, end) - off;
    xpush (l, doff, n, 0, true);
    off += n, doff += n;
  }
}

struct xdev {
  const char *name;
  unsigned n;
  uint64_t chunk, lead, len, size;   /* bytes */
  uint64_t start[32];
  int fd[32];
  struct device *dev;
  struct xlist ref;                  /* the whole device */
};

/* The reference for the whole device, chunk by chunk; the lead (zero
 * target) is its own extent: the walk does not merge across targets.
 */
static void
xdev_reference (struct xdev *x)
{
  x->ref.n = 0;
  if (x->lead)
    xpush (&x->ref, 0, x->lead, HZ, false);
  for (uint64_t c = 0; c * x->chunk < x->len; c++) {
    unsigned s = c % x->n;
    uint64_t row = c / x->n;
    /* The first piece of the striped target must not join the lead. */
    if (c == 0) {
      struct xlist one = { 0 };
      ref_file (x->fd[s], x->start[s], x->chunk, x->lead, &one);
      for (size_t i = 0; i < one.n; i++)
        xpush (&x->ref, one.e[i].off, one.e[i].len, one.e[i].type, i > 0);
      free (one.e);
      continue;
    }
    ref_file (x->fd[s], x->start[s] + row * x->chunk, x->chunk,
              x->lead + c * x->chunk, &x->ref);
  }
}

/* The reference clipped to [off, off+len). */
static void
xdev_expect (const struct xdev *x, uint64_t off, uint64_t len,
             struct xlist *want)
{
  size_t lo = 0, hi = x->ref.n;

  /* The first extent ending after off. */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (x->ref.e[mid].off + x->ref.e[mid].len <= off)
      lo = mid + 1;
    else
      hi = mid;
  }
  want->n = 0;
  for (size_t i = lo; i < x->ref.n && x->ref.e[i].off < off + len; i++) {
    const struct xt *e = &x->ref.e[i];
    uint64_t a = MAX (e->off, off), b = MIN (e->off + e->len, off + len);
    if (a < b)
      xpush (want, a, b - a, e->type, false);
    if (want->n > XMAX_EXTENTS)
      break;                      /* more than any reply holds */
  }
}

static int
xlist_diff (const struct xlist *got, const struct xlist *want, size_t upto)
{
  for (size_t i = 0; i < upto; i++)
    if (i >= got->n || i >= want->n || got->e[i].off != want->e[i].off ||
        got->e[i].len != want->e[i].len || got->e[i].type != want->e[i].type)
      return i;
  return -1;
}

static void
xprint (const char *what, const struct xlist *l, size_t around)
{
  size_t lo = around > 3 ? around - 3 : 0;
  fprintf (stderr, "  %s (%zu extents):", what, l->n);
  for (size_t i = lo; i < l->n && i < around + 4; i++)
    fprintf (stderr, " %" PRIu64 "+%" PRIu64 ":%u", l->e[i].off, l->e[i].len,
             l->e[i].type);
  fputc ('\n', stderr);
}

/* device_extents (off, len, flags) must be exactly the reference: all of
 * it, or its first extent with REQ_ONE, or its first XMAX_EXTENTS extents
 * when it has more.
 */
static int
xcheck (struct xdev *x, uint64_t off, uint64_t len, bool one)
{
  static struct xlist got, want;
  size_t upto;
  int r, d;

  got.n = 0;
  r = device_extents (x->dev, len, off, one ? MAPPER_REQ_ONE : 0, xcollect,
                      &got);
  xdev_expect (x, off, len, &want);
  upto = one ? 1 : MIN (want.n, XMAX_EXTENTS);
  d = xlist_diff (&got, &want, upto);
  if (r != 0 || got.n != upto || d >= 0) {
    fprintf (stderr, "%s: extents %" PRIu64 "+%" PRIu64 "%s: r=%d, got %zu "
             "extents, want %zu; first difference at %d\n", x->name, off,
             len, one ? " REQ_ONE" : "", r, got.n, upto, d);
    xprint ("got", &got, d >= 0 ? d : 0);
    xprint ("want", &want, d >= 0 ? d : 0);
    return 1;
  }
  return 0;
}

/* A client mapping the whole device: each request from where the last
 * reply ended; together exactly the reference.
 */
static int
xclient (struct xdev *x, uint64_t max_req)
{
  static struct xlist all, got;
  uint64_t pos = 0;
  int d;

  all.n = 0;
  while (pos < x->size) {
    uint64_t n = MIN (x->size - pos, max_req);
    got.n = 0;
    if (device_extents (x->dev, n, pos, 0, xcollect, &got) != 0 ||
        got.n == 0 || got.e[0].off != pos) {
      fprintf (stderr, "%s: client at %" PRIu64 ": no answer\n", x->name,
               pos);
      return 1;
    }
    for (size_t i = 0; i < got.n; i++)
      xpush (&all, got.e[i].off, got.e[i].len, got.e[i].type, false);
    pos = got.e[got.n - 1].off + got.e[got.n - 1].len;
  }
  /* Requests split extents the reference has whole: join those. */
  {
    static struct xlist joined;
    joined.n = 0;
    for (size_t i = 0; i < all.n; i++) {
      bool at_lead = x->lead && all.e[i].off == x->lead;
      xpush (&joined, all.e[i].off, all.e[i].len, all.e[i].type, !at_lead);
    }
    d = xlist_diff (&joined, &x->ref, MAX (joined.n, x->ref.n));
    if (d >= 0) {
      fprintf (stderr, "%s: whole-device map differs at extent %d\n",
               x->name, d);
      xprint ("got", &joined, d);
      xprint ("want", &x->ref, d);
      return 1;
    }
  }
  return 0;
}

/* Chunk edges (and +-1), the lead edge, row edges, the end; lengths from
 * one byte to the rest of the device, with and without REQ_ONE.
 */
static int
xcheck_edges (struct xdev *x)
{
  uint64_t nchunks = x->len / x->chunk, row = x->n * x->chunk;
  uint64_t lens[] = { 1, x->chunk - 1, x->chunk, x->chunk + 1,
                      2 * x->chunk + 7, row, row + x->chunk + 1,
                      3 * row - 1, 0 /* to the end */ };
  uint64_t stride = MAX (5, nchunks / 300);
  int bad = 0;

  for (uint64_t c = 0; c <= nchunks; c++) {
    /* Every edge of the first two and the last two rows, a few hundred
     * elsewhere.
     */
    if (c >= 2 * x->n && c + 2 * x->n < nchunks && c % stride)
      continue;
    for (int delta = -1; delta <= 1; delta++) {
      uint64_t off = x->lead + c * x->chunk + delta;
      if ((delta < 0 && off + 1 == 0) || off >= x->size)
        continue;
      for (size_t i = 0; i < ARRAY_SIZE (lens); i++) {
        uint64_t len = lens[i] ? lens[i] : x->size - off;
        if (len == 0)
          continue;
        len = MIN (len, x->size - off);
        bad += xcheck (x, off, len, false);
        bad += xcheck (x, off, len, true);
        if (bad > 5)
          return bad;
      }
    }
  }
  return bad;
}

static uint64_t
xrand (uint64_t *state)
{
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return *state >> 33;
}

/* The devices' tables: "file" stripes are the files, "stacked" ones
 * mapper:NAME devices over them (the nested walk answers through the
 * striped target's window), "remote" ones nbdkit file servers answering
 * at most maxlen bytes per query (nbdkit's blocksize filter): backends
 * that answer for less than asked.
 */
enum xvia { VIA_FILE, VIA_STACKED, VIA_REMOTE };

struct xsetup {
  pid_t servers[32];
  struct device *lows[32];
};

static void
xsetup_teardown (struct xsetup *su, unsigned n)
{
  for (unsigned s = 0; s < n; s++) {
    if (su->lows[s])
      device_destroy (su->lows[s]);
    if (su->servers[s] > 0)
      unit_stop_server (su->servers[s]);
  }
}

/* nbdkit in the foreground on sock; it writes pidf once it listens. */
static pid_t
xstart_server (const char *sock, const char *pidf, const char *path,
               uint64_t maxlen)
{
  pid_t pid;

  unlink (sock);
  unlink (pidf);
  pid = fork ();
  if (pid == -1)
    UNIT_FATAL ("fork: %s", strerror (errno));
  if (pid == 0) {
    char ml[64];
    snprintf (ml, sizeof ml, "maxlen=%" PRIu64, maxlen);
    execlp ("nbdkit", "nbdkit", "-f", "-U", sock, "-P", pidf,
            "--filter=blocksize", "file", path, ml, (char *) NULL);
    _exit (127);
  }
  for (int i = 0; i < 500 && access (pidf, F_OK) != 0; i++)
    usleep (10000);
  if (access (pidf, F_OK) != 0)
    UNIT_FATAL ("nbdkit on %s did not start", sock);
  return pid;
}

/* Striped over n files (chunk sectors, rows rows, lead sectors of zero
 * target first); fill(x, s, data) writes stripe s's data into its file.
 */
static void
xrun (const char *name, unsigned n, uint64_t chunk_sectors, uint64_t rows,
      uint64_t lead_sectors, enum xvia via, uint64_t maxlen,
      void (*fill) (struct xdev *x, unsigned s, int fd, uint64_t seed),
      uint64_t max_req)
{
  struct xdev x = { .name = name, .n = n, .chunk = chunk_sectors * 512,
                    .lead = lead_sectors * 512 };
  struct xsetup su;
  struct mapper_err err = { "" };
  char *text, *p;
  struct table *t;
  int bad = 0, r;

  char leadline[64] = "";

  memset (&su, 0, sizeof su);
  x.len = (uint64_t) n * x.chunk * rows;
  x.size = x.lead + x.len;
  if (lead_sectors)
    snprintf (leadline, sizeof leadline, "0 %" PRIu64 " zero\n",
              lead_sectors);
  text = unit_sprintf ("%s%" PRIu64 " %" PRIu64 " striped %u %" PRIu64,
                       leadline, lead_sectors, x.len / 512, n,
                       chunk_sectors);
  for (unsigned s = 0; s < n; s++) {
    char fname[32], lname[32];
    const char *path;

    snprintf (fname, sizeof fname, "x%u", s);
    path = unit_path (fname);
    x.start[s] = ((s * 5 + 2) % 7) * 512;
    unit_write_file (path, NULL, x.start[s] + x.len / n + 4096);
    x.fd[s] = open (path, O_RDWR | O_CLOEXEC);
    if (x.fd[s] == -1)
      UNIT_FATAL ("%s: %s", path, strerror (errno));
    fill (&x, s, x.fd[s], n * 1000 + chunk_sectors * 10 + s);
    if (via == VIA_FILE)
      p = unit_sprintf ("%s %s %" PRIu64, text, path, x.start[s] / 512);
    else if (via == VIA_STACKED) {
      char *low;
      snprintf (lname, sizeof lname, "%s-low%u", name, s);
      low = unit_sprintf ("0 %" PRIu64 " linear %s 0\n",
                          (x.start[s] + x.len / n) / 512, path);
      r = table_parse (low, lname, &t, &err);
      if (r < 0)
        UNIT_FATAL ("%s: %s", lname, err.msg);
      if (device_create (lname, &su.lows[s], &err) < 0)
        UNIT_FATAL ("%s: %s", lname, err.msg);
      device_load (su.lows[s], t);
      if (device_resume (su.lows[s], &err) < 0)
        UNIT_FATAL ("%s: %s", lname, err.msg);
      free (low);
      p = unit_sprintf ("%s mapper:%s %" PRIu64, text, lname,
                        x.start[s] / 512);
    }
    else {
      char sname[32], pname[32];
      const char *sock, *pidf;
      snprintf (sname, sizeof sname, "x%u.sock", s);
      snprintf (pname, sizeof pname, "x%u.pid", s);
      sock = unit_path (sname);
      pidf = unit_path (pname);
      su.servers[s] = xstart_server (sock, pidf, path, maxlen);
      p = unit_sprintf ("%s nbd+unix:///?socket=%s %" PRIu64, text, sock,
                        x.start[s] / 512);
    }
    free (text);
    text = p;
  }
  p = unit_sprintf ("%s\n", text);
  free (text);
  text = p;

  r = table_parse (text, name, &t, &err);
  CHECKF (r == 0, "%s: %s", name, err.msg);
  if (r == 0) {
    if (device_create (name, &x.dev, &err) < 0)
      UNIT_FATAL ("%s: %s", name, err.msg);
    device_load (x.dev, t);
    if (device_resume (x.dev, &err) < 0)
      UNIT_FATAL ("%s: %s", name, err.msg);
    xdev_reference (&x);
    bad += xclient (&x, max_req);
    if (max_req == UINT32_MAX)
      bad += xcheck_edges (&x);
    device_destroy (x.dev);
  }
  if (bad) {
    fprintf (stderr, "FAILED: %s: %s", name, text);
    unit_failures += bad;
  }
  xsetup_teardown (&su, n);
  for (unsigned s = 0; s < n; s++) {
    char fname[32];
    snprintf (fname, sizeof fname, "x%u", s);
    close (x.fd[s]);
    unlink (unit_path (fname));
  }
  free (x.ref.e);
  free (text);
}

static void
xpwrite (int fd, uint64_t off, uint64_t len, uint64_t seed)
{
  unsigned char buf[8192];

  while (len > 0) {
    size_t n = MIN (len, sizeof buf);
    unit_fill (buf, n, seed, off);
    buf[0] |= 1;                  /* never all zeros */
    if (pwrite (fd, buf, n, off) != (ssize_t) n)
      UNIT_FATAL ("pwrite: %s", strerror (errno));
    off += n, len -= n;
  }
}

/* Scattered writes of 1 byte to 3 chunks; stripe 1 all data, the last
 * stripe (of three or more) all hole, so that runs cross rows.
 */
static void
fill_scattered (struct xdev *x, unsigned s, int fd, uint64_t seed)
{
  uint64_t area = x->len / x->n, st = seed;

  if (s == 1) {
    xpwrite (fd, x->start[s], area, seed);
    return;
  }
  if (x->n >= 3 && s == x->n - 1)
    return;
  for (int k = 0; k < 6; k++) {
    uint64_t off = xrand (&st) % area;
    uint64_t len = 1 + xrand (&st) % (3 * x->chunk);
    xpwrite (fd, x->start[s] + off, MIN (len, area - off), seed + k);
  }
}

/* Stripe 0: every other 4K block data; the others holes.  Many more
 * extents than one reply holds.
 */
static void
fill_dense (struct xdev *x, unsigned s, int fd, uint64_t seed)
{
  uint64_t area = x->len / x->n;

  if (s != 0)
    return;
  for (uint64_t off = 0; off + 4096 <= area; off += 8192)
    xpwrite (fd, x->start[s] + off, 4096, seed);
}

/* All data or all hole per stripe, stripe 0 data: one extent per chunk
 * of stripe 0, then one hole run to the next row.
 */
static void
fill_stripe0 (struct xdev *x, unsigned s, int fd, uint64_t seed)
{
  if (s == 0)
    xpwrite (fd, x->start[s], x->len / x->n, seed);
}

static void
fill_none (struct xdev *x, unsigned s, int fd, uint64_t seed)
{
}

static void
test_extents (void)
{
  static const unsigned ns[] = { 1, 2, 3, 4, 5, 8, 16, 17, 20 };
  static const uint64_t chunks[] = { 1, 3, 8, 128 };
  bool have_nbdkit = system ("nbdkit --version >/dev/null 2>&1") == 0;
  char name[64];

  for (size_t i = 0; i < ARRAY_SIZE (ns); i++)
    for (size_t k = 0; k < ARRAY_SIZE (chunks); k++)
      for (uint64_t lead = 0; lead <= 3; lead += 3) {
        snprintf (name, sizeof name, "x-%u-%" PRIu64 "-%" PRIu64, ns[i],
                  chunks[k], lead);
        xrun (name, ns[i], chunks[k], 8, lead, VIA_FILE, 0, fill_scattered,
              UINT32_MAX);
      }
  xrun ("x-none", 3, 128, 64, 0, VIA_FILE, 0, fill_none, UINT32_MAX);
  xrun ("x-stripe0", 3, 8, 64, 3, VIA_FILE, 0, fill_stripe0, UINT32_MAX);
  /* More than one reply's worth: partial replies, whole and in small
   * requests.
   */
  xrun ("x-dense", 3, 1, 16384, 0, VIA_FILE, 0, fill_dense, UINT32_MAX);
  xrun ("x-dense-small", 3, 1, 16384, 3, VIA_FILE, 0, fill_dense, 100003);
  xrun ("x-stacked", 3, 8, 16, 3, VIA_STACKED, 0, fill_scattered,
        UINT32_MAX);
  xrun ("x-stacked-dense", 4, 3, 4096, 0, VIA_STACKED, 0, fill_dense,
        UINT32_MAX);
  if (have_nbdkit) {
    /* Each answer at most 12K (or one byte short of a chunk) of the
     * stripe's range.
     */
    xrun ("x-remote", 3, 8, 16, 3, VIA_REMOTE, 12288, fill_scattered,
          UINT32_MAX);
    xrun ("x-remote-odd", 2, 3, 16, 0, VIA_REMOTE, 1535, fill_scattered,
          UINT32_MAX);
  }
  else
    printf ("%s: remote extents skipped: no nbdkit\n", __FILE__);
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
  test_extents ();
  UNIT_EXIT ();
}

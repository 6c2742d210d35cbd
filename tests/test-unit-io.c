/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: the request path.  Splitting at every segment edge of a
 * table mixing linear (3 files), striped, zero and error targets, checked
 * against an in-memory model of the device and of the backing files;
 * zero/trim/flush/extents; requests beyond the end; suspend/resume and
 * table swaps; clones merged without copying.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <linux/fs.h>

#include "internal.h"
#include "unit.h"
#include "unit-targets.h"

#define S 512ULL                       /* sector */

/* --- capturing the engine's debug log ------------------------------------ */

static void
trace_on (void)
{
  mapper_debug = unit_capture_log;
  mapper_trace_io = true;
  unit_last_log[0] = '\0';
  unit_nr_logs = 0;
}

static void
trace_off (void)
{
  mapper_debug = NULL;
  mapper_trace_io = false;
}

/* --- extents collection -------------------------------------------------- */

#define MAX_EXT 16384
struct ext { uint64_t off, len; uint32_t type; };
struct ext_list { size_t n; bool overflow; struct ext e[MAX_EXT]; };

static int
collect_extent (void *opaque, uint64_t offset, uint64_t length,
                uint32_t type)
{
  struct ext_list *l = opaque;

  if (l->n == MAX_EXT) {
    l->overflow = true;
    return -ENOMEM;
  }
  l->e[l->n++] = (struct ext) { offset, length, type };
  return 0;
}

/* Type of the extent covering byte d, or -1. */
static int
ext_type_at (const struct ext_list *l, uint64_t d)
{
  for (size_t i = 0; i < l->n; i++)
    if (d >= l->e[i].off && d < l->e[i].off + l->e[i].len)
      return l->e[i].type;
  return -1;
}

/* Common shape checks: ascending, contiguous, non-empty, from offset,
 * within [offset, offset+count); whole range covered unless req_one.
 */
static bool
check_extent_shape (const struct ext_list *l, uint64_t offset,
                    uint64_t count, bool req_one, const char *what)
{
  uint64_t next = offset;
  bool ok = true;

  if (l->n == 0 || l->overflow) {
    fprintf (stderr, "%s: %zu extents%s\n", what, l->n,
             l->overflow ? " (overflow)" : "");
    return false;
  }
  if (req_one && l->n != 1) {
    fprintf (stderr, "%s: REQ_ONE gave %zu extents\n", what, l->n);
    ok = false;
  }
  for (size_t i = 0; i < l->n; i++) {
    const struct ext *e = &l->e[i];
    if (e->off != next || e->len == 0 || e->off + e->len > offset + count ||
        (e->type & ~(uint32_t) (MAPPER_EXTENT_HOLE | MAPPER_EXTENT_ZERO))) {
      fprintf (stderr, "%s: extent %zu is %" PRIu64 "+%" PRIu64 " type %u, "
               "expected to start at %" PRIu64 " and end by %" PRIu64 "\n",
               what, i, e->off, e->len, e->type, next, offset + count);
      ok = false;
      break;
    }
    next = e->off + e->len;
  }
  if (!req_one && ok && next != offset + count) {
    fprintf (stderr, "%s: extents end at %" PRIu64 ", not %" PRIu64 "\n",
             what, next, offset + count);
    ok = false;
  }
  return ok;
}

/* --- the mixed table and its model --------------------------------------- */

enum kind { K_FILE, K_ZERO, K_ERROR };
#define NFILES 3
#define FILE_SIZE (128 * S)

/* Segments in sectors; striped: 2 stripes, chunk 3: (C,1) (A,40). */
static const struct seg {
  uint64_t begin, len;
  enum kind kind;
  bool striped;
  int file;                     /* linear */
  uint64_t off;                 /* linear */
} segs[] = {
  {  0,  5, K_FILE,  false, 0,  7 },
  {  5,  8, K_FILE,  false, 1,  3 },
  { 13, 12, K_FILE,  true,  0,  0 },
  { 25,  4, K_ZERO,  false, 0,  0 },
  { 29,  6, K_FILE,  false, 2, 20 },
  { 35,  3, K_FILE,  false, 0, 60 },
  { 38,  4, K_FILE,  false, 0, 63 },   /* continues the previous in A */
  { 42,  2, K_ERROR, false, 0,  0 },
  { 44,  5, K_FILE,  false, 1, 30 },
};
#define DEV_SIZE (49 * S)
#define ERR_BEGIN (42 * S)
#define ERR_END (44 * S)
static const int stripe_file[2] = { 2, 0 };
static const uint64_t stripe_off[2] = { 1, 40 };   /* sectors */
#define CHUNK (3 * S)

static char *fpath[NFILES];
static int fd[NFILES];                  /* O_RDONLY, for direct checks */
static unsigned char *fexp[NFILES];     /* expected file contents */
static unsigned char mdev[DEV_SIZE];    /* expected device contents */
static uint64_t seed_counter = 100;

static enum kind
locate (uint64_t d, int *file, uint64_t *off)
{
  for (size_t i = 0; i < ARRAY_SIZE (segs); i++) {
    const struct seg *s = &segs[i];
    if (d >= s->begin * S && d < (s->begin + s->len) * S) {
      uint64_t t = d - s->begin * S;
      if (s->kind != K_FILE)
        return s->kind;
      if (s->striped) {
        uint64_t c = t / CHUNK;
        int st = c % 2;
        *file = stripe_file[st];
        *off = stripe_off[st] * S + (c / 2) * CHUNK + t % CHUNK;
      }
      else {
        *file = s->file;
        *off = s->off * S + t;
      }
      return K_FILE;
    }
  }
  abort ();
}

static bool
touches_error (uint64_t off, uint64_t len)
{
  return off < ERR_END && off + len > ERR_BEGIN;
}

/* The model after a successful write (buf) or zero (buf NULL). */
static void
model_store (uint64_t off, const unsigned char *buf, uint64_t len)
{
  for (uint64_t i = 0; i < len; i++) {
    int f;
    uint64_t o;
    if (locate (off + i, &f, &o) == K_FILE) {
      fexp[f][o] = buf ? buf[i] : 0;
      mdev[off + i] = buf ? buf[i] : 0;
    }
  }
}

/* After an operation whose effect is only partly defined (failed on the
 * error segment, fast zero refused): each mapped byte must hold either
 * its old value or the new one (buf, or 0 when buf is NULL); adopt it.
 * After a trim the contents are unspecified: adopt them unchecked.
 */
static int
model_resync_check (uint64_t off, const unsigned char *buf, uint64_t len,
                    const char *what, bool check)
{
  int bad = 0;

  for (uint64_t i = 0; i < len; i++) {
    int f;
    uint64_t o;
    unsigned char v, alt = buf ? buf[i] : 0;
    if (locate (off + i, &f, &o) != K_FILE)
      continue;
    if (pread (fd[f], &v, 1, o) != 1)
      UNIT_FATAL ("pread: %s", strerror (errno));
    if (check && v != mdev[off + i] && v != alt) {
      if (bad++ == 0)
        fprintf (stderr, "%s: device byte %" PRIu64 " (file %d offset %"
                 PRIu64 ") is 0x%02x, neither old 0x%02x nor new 0x%02x\n",
                 what, off + i, f, o, v, mdev[off + i], alt);
    }
    fexp[f][o] = v;
    mdev[off + i] = v;
  }
  return bad;
}

static int
model_resync (uint64_t off, const unsigned char *buf, uint64_t len,
              const char *what)
{
  return model_resync_check (off, buf, len, what, true);
}

static void
check_files (const char *when)
{
  for (int f = 0; f < NFILES; f++) {
    size_t size;
    char *got = unit_read_file (fpath[f], &size);
    CHECKF (got && size == FILE_SIZE, "%s: file %d", when, f);
    if (got && size == FILE_SIZE) {
      long d = unit_first_diff (got, fexp[f], FILE_SIZE);
      CHECKF (d == -1, "%s: file %d offset %ld: got 0x%02x want 0x%02x",
              when, f, d, d >= 0 ? (unsigned char) got[d] : 0,
              d >= 0 ? fexp[f][d] : 0);
    }
    free (got);
  }
}

static int
verify_range (struct device *dev, uint64_t off, uint64_t len,
              const char *what)
{
  unsigned char *buf = malloc (len + 1);
  int r = device_pread (dev, buf, len, off, 0);
  int bad = 0;

  if (r != 0) {
    fprintf (stderr, "%s: pread %" PRIu64 "+%" PRIu64 " = %d\n", what, off,
             len, r);
    bad++;
  }
  else {
    long d = unit_first_diff (buf, mdev + off, len);
    if (d >= 0) {
      fprintf (stderr, "%s: pread %" PRIu64 "+%" PRIu64 ": device offset %"
               PRIu64 " got 0x%02x want 0x%02x\n", what, off, len, off + d,
               buf[d], mdev[off + d]);
      bad++;
    }
  }
  free (buf);
  return bad;
}

static void
verify_all (struct device *dev, const char *when)
{
  unit_failures += verify_range (dev, 0, ERR_BEGIN, when);
  unit_failures += verify_range (dev, ERR_END, DEV_SIZE - ERR_END, when);
  check_files (when);
}

/* Write fresh pattern over [off, off+len) minus the error segment. */
static void
refill (struct device *dev, uint64_t off, uint64_t len)
{
  unsigned char buf[4096];
  uint64_t end = MIN (off + len, DEV_SIZE);

  while (off < end) {
    uint64_t n = MIN (end - off, sizeof buf);
    if (touches_error (off, 1)) {
      off = ERR_END;
      continue;
    }
    if (off < ERR_BEGIN)
      n = MIN (n, ERR_BEGIN - off);
    unit_fill (buf, n, seed_counter++, off);
    CHECK (device_pwrite (dev, buf, n, off, 0) == 0);
    model_store (off, buf, n);
    off += n;
  }
}

static uint64_t edges[64];
static size_t nr_edges;

static void
setup_mixed (struct device **devp)
{
  struct mapper_err err = { "" };
  struct table *t;
  char *text;
  int r;

  for (int f = 0; f < NFILES; f++) {
    char name[16];
    snprintf (name, sizeof name, "f%c", 'A' + f);
    fpath[f] = strdup (unit_path (name));
    fexp[f] = malloc (FILE_SIZE);
    unit_fill (fexp[f], FILE_SIZE, 10 + f, 0);
    unit_write_file (fpath[f], fexp[f], FILE_SIZE);
    fd[f] = open (fpath[f], O_RDONLY | O_CLOEXEC);
    if (fd[f] == -1)
      UNIT_FATAL ("open %s", fpath[f]);
  }
  text = unit_sprintf ("# mixed table\n"
                       "0 5 linear %s 7\n"
                       "5 8 linear %s 3\n"
                       "13 12 striped 2 3 %s 1 %s 40\n"
                       "25 4 zero\n"
                       "29 6 linear %s 20\n"
                       "35 3 linear %s 60\n"
                       "38 4 linear %s 63\n"
                       "42 2 error\n"
                       "44 5 linear %s 30\n",
                       fpath[0], fpath[1], fpath[2], fpath[0], fpath[2],
                       fpath[0], fpath[0], fpath[1]);
  r = table_parse (text, "mixed", &t, &err);
  free (text);
  if (r != 0)
    UNIT_FATAL ("mixed table: %s", err.msg);
  CHECK (table_caps (t)->size == DEV_SIZE);
  CHECK (table_nr_backends (t) == 3);
  if (device_create ("mixed", devp, &err) != 0)
    UNIT_FATAL ("%s", err.msg);
  CHECK (device_load (*devp, t) == 0);
  if (device_resume (*devp, &err) != 0)
    UNIT_FATAL ("%s", err.msg);

  /* The device initially shows the background. */
  for (uint64_t d = 0; d < DEV_SIZE; d++) {
    int f;
    uint64_t o;
    mdev[d] = locate (d, &f, &o) == K_FILE ? fexp[f][o] : 0;
  }

  /* Every segment edge, plus the striped segment's chunk edges. */
  for (size_t i = 0; i < ARRAY_SIZE (segs); i++) {
    edges[nr_edges++] = segs[i].begin * S;
    if (segs[i].striped)
      for (uint64_t c = CHUNK; c < segs[i].len * S; c += CHUNK)
        edges[nr_edges++] = segs[i].begin * S + c;
  }
  edges[nr_edges++] = DEV_SIZE;
}

static const uint32_t lens[] = { 1, 2, 511, 512, 513 };

static void
test_rw_edges (struct device *dev)
{
  unsigned char buf[1024], back[1024];

  verify_all (dev, "initial");
  for (size_t k = 0; k < nr_edges; k++)
    for (int delta = -1; delta <= 1; delta++)
      for (size_t l = 0; l < ARRAY_SIZE (lens); l++) {
        uint64_t off, len = lens[l];
        char what[128];
        int r;

        if (edges[k] == 0 && delta < 0)
          continue;
        off = edges[k] + delta;
        snprintf (what, sizeof what, "rw %" PRIu64 "+%" PRIu64, off, len);
        unit_fill (buf, len, seed_counter++, off);

        if (off + len > DEV_SIZE) {
          CHECKF (device_pwrite (dev, buf, len, off, 0) == -ENOSPC, "%s",
                  what);
          CHECKF (device_pread (dev, back, len, off, 0) == -EIO, "%s", what);
          continue;
        }
        r = device_pwrite (dev, buf, len, off, 0);
        if (touches_error (off, len)) {
          CHECKF (r == -EIO, "%s: pwrite = %d", what, r);
          unit_failures += model_resync (off, buf, len, what);
          r = device_pread (dev, back, len, off, 0);
          CHECKF (r == -EIO, "%s: pread = %d", what, r);
        }
        else {
          CHECKF (r == 0, "%s: pwrite = %d", what, r);
          if (r == 0)
            model_store (off, buf, len);
          unit_failures += verify_range (dev, off, len, what);
          /* A wider window, unaligned, around the edge. */
          if (off >= 700 && !touches_error (off - 700, len + 1400) &&
              off + len + 700 <= DEV_SIZE)
            unit_failures += verify_range (dev, off - 700, len + 1400, what);
        }
        /* FUA writes go the same way. */
        if (!touches_error (off, len)) {
          unit_fill (buf, len, seed_counter++, off);
          r = device_pwrite (dev, buf, len, off, MAPPER_FUA);
          CHECKF (r == 0, "%s: FUA pwrite = %d", what, r);
          if (r == 0)
            model_store (off, buf, len);
        }
      }
  verify_all (dev, "after edge writes");
}

static void
test_zero_trim_edges (struct device *dev)
{
  static const uint32_t zlens[] = { 1, 513, 1500 };
  static const uint32_t zflags[] = { 0, MAPPER_MAY_TRIM, MAPPER_FUA,
                                     MAPPER_MAY_TRIM | MAPPER_FUA };
  unsigned char back[2048];

  for (size_t k = 0; k < nr_edges; k++)
    for (int delta = -1; delta <= 1; delta++)
      for (size_t l = 0; l < ARRAY_SIZE (zlens); l++) {
        uint64_t off, len = zlens[l];
        char what[128];
        uint32_t flags = zflags[(k + l + delta + 1) % ARRAY_SIZE (zflags)];
        int r;

        if (edges[k] == 0 && delta < 0)
          continue;
        off = edges[k] + delta;
        if (off + len > DEV_SIZE) {
          CHECK (device_zero (dev, len, off, flags) == -ENOSPC);
          CHECK (device_trim (dev, len, off, 0) == -ENOSPC);
          continue;
        }

        /* zero */
        snprintf (what, sizeof what, "zero %" PRIu64 "+%" PRIu64 " flags %u",
                  off, len, flags);
        refill (dev, off >= 600 ? off - 600 : 0, len + 1200);
        r = device_zero (dev, len, off, flags);
        if (touches_error (off, len)) {
          CHECKF (r == -EIO, "%s: %d", what, r);
          unit_failures += model_resync (off, NULL, len, what);
        }
        else {
          CHECKF (r == 0, "%s: %d", what, r);
          if (r == 0)
            model_store (off, NULL, len);
          CHECK (device_pread (dev, back, len, off, 0) == 0);
          CHECKF (unit_is_zero (back, len), "%s: does not read back as zeros",
                  what);
          {
            uint64_t lo = off >= 600 ? off - 600 : 0;
            uint64_t hi = MIN (off + len + 600, DEV_SIZE);
            if (!touches_error (lo, hi - lo))
              unit_failures += verify_range (dev, lo, hi - lo, what);
          }
        }

        /* fast zero: 0 (and zeros) or -ENOTSUP */
        snprintf (what, sizeof what, "fast zero %" PRIu64 "+%" PRIu64, off,
                  len);
        refill (dev, off, len);
        r = device_zero (dev, len, off, MAPPER_FAST_ZERO | (flags & MAPPER_MAY_TRIM));
        if (touches_error (off, len)) {
          CHECKF (r == -EIO, "%s: %d", what, r);
          unit_failures += model_resync (off, NULL, len, what);
        }
        else {
          CHECKF (r == 0 || r == -ENOTSUP, "%s: %d", what, r);
          if (r == 0) {
            model_store (off, NULL, len);
            CHECK (device_pread (dev, back, len, off, 0) == 0);
            CHECKF (unit_is_zero (back, len), "%s: not zeros", what);
          }
          else
            unit_failures += model_resync (off, NULL, len, what);
        }

        /* trim: advisory; data afterwards is old or zero */
        snprintf (what, sizeof what, "trim %" PRIu64 "+%" PRIu64, off, len);
        refill (dev, off, len);
        r = device_trim (dev, len, off, flags & MAPPER_FUA);
        if (touches_error (off, len))
          CHECKF (r == -EIO, "%s: %d", what, r);
        else
          CHECKF (r == 0, "%s: %d", what, r);
        unit_failures += model_resync_check (off, NULL, len, what, false);
      }

  CHECK (device_flush (dev, 0) == 0);
  verify_all (dev, "after zero/trim");

  /* Whole-device zero (touches error) and the two halves. */
  CHECK (device_zero (dev, DEV_SIZE, 0, 0) == -EIO);
  unit_failures += model_resync (0, NULL, DEV_SIZE, "zero all");
  CHECK (device_zero (dev, ERR_BEGIN, 0, 0) == 0);
  model_store (0, NULL, ERR_BEGIN);
  CHECK (device_zero (dev, DEV_SIZE - ERR_END, ERR_END, MAPPER_MAY_TRIM) == 0);
  model_store (ERR_END, NULL, DEV_SIZE - ERR_END);
  verify_all (dev, "after zeroing everything");
  refill (dev, 0, DEV_SIZE);
  verify_all (dev, "after refill");
}

static void
test_extents_edges (struct device *dev)
{
  static struct ext_list l;
  uint32_t elens[] = { 1, 513, 4096, 0 /* to the end */ };

  for (size_t k = 0; k < nr_edges; k++)
    for (int delta = -1; delta <= 1; delta++)
      for (size_t i = 0; i < ARRAY_SIZE (elens); i++)
        for (int one = 0; one <= 1; one++) {
          uint64_t off, len;
          char what[128];
          int r;

          if (edges[k] == 0 && delta < 0)
            continue;
          off = edges[k] + delta;
          len = elens[i] ? elens[i] : DEV_SIZE - MIN (off, DEV_SIZE);
          snprintf (what, sizeof what, "extents %" PRIu64 "+%" PRIu64 "%s",
                    off, len, one ? " REQ_ONE" : "");
          l.n = 0;
          l.overflow = false;
          r = device_extents (dev, len, off, one ? MAPPER_REQ_ONE : 0,
                              collect_extent, &l);
          if (len == 0)
            continue;
          if (off + len > DEV_SIZE) {
            CHECKF (r == -EIO, "%s: %d", what, r);
            continue;
          }
          /* Extents go through an error target: reads fail there, so
           * it is data (never a hole), and block status never fails.
           */
          CHECKF (r == 0, "%s: %d", what, r);
          if (r != 0)
            continue;
          if (!check_extent_shape (&l, off, len, one, what)) {
            unit_failures++;
            continue;
          }
          for (size_t j = 0; j < l.n; j++) {
            const struct ext *e = &l.e[j];
            bool has_zero_seg = false;
            for (uint64_t d = e->off; d < e->off + e->len; d++) {
              int f;
              uint64_t o;
              if (locate (d, &f, &o) == K_ZERO)
                has_zero_seg = true;
            }
            CHECKF (!touches_error (e->off, e->len) || e->type == 0,
                    "%s: extent %" PRIu64 "+%" PRIu64 " over the error "
                    "target has type %u", what, e->off, e->len, e->type);
            CHECKF (!has_zero_seg ||
                    e->type == (MAPPER_EXTENT_HOLE | MAPPER_EXTENT_ZERO),
                    "%s: extent %" PRIu64 "+%" PRIu64 " over the zero target "
                    "has type %u", what, e->off, e->len, e->type);
            if (e->type & MAPPER_EXTENT_ZERO)
              CHECKF (unit_is_zero (mdev + e->off, e->len),
                      "%s: extent %" PRIu64 "+%" PRIu64 " reported zero but "
                      "holds data", what, e->off, e->len);
          }
        }
}

static void
test_beyond_end (struct device *dev)
{
  static struct ext_list l;
  unsigned char buf[4096] = { 1, 2, 3 };

  CHECK (device_pread (dev, buf, 2, DEV_SIZE - 1, 0) == -EIO);
  CHECK (device_pread (dev, buf, 1, DEV_SIZE, 0) == -EIO);
  CHECK (device_pread (dev, buf, 1, UINT64_MAX, 0) == -EIO);
  CHECK (device_pread (dev, buf, 4096, UINT64_MAX - 100, 0) == -EIO);
  CHECK (device_pread (dev, buf, 0, DEV_SIZE, 0) == 0);
  CHECK (device_pwrite (dev, buf, 2, DEV_SIZE - 1, 0) == -ENOSPC);
  CHECK (device_pwrite (dev, buf, 1, DEV_SIZE, 0) == -ENOSPC);
  CHECK (device_pwrite (dev, buf, 4096, DEV_SIZE - 1024, MAPPER_FUA)
         == -ENOSPC);
  CHECK (device_pwrite (dev, buf, 1, UINT64_MAX, 0) == -ENOSPC);
  CHECK (device_pwrite (dev, buf, 4096, UINT64_MAX - 100, 0) == -ENOSPC);
  CHECK (device_pwrite (dev, buf, 0, DEV_SIZE, 0) == 0);
  CHECK (device_zero (dev, 2, DEV_SIZE - 1, 0) == -ENOSPC);
  CHECK (device_zero (dev, 2, DEV_SIZE - 1, MAPPER_MAY_TRIM) == -ENOSPC);
  CHECK (device_trim (dev, 2, DEV_SIZE - 1, 0) == -ENOSPC);
  CHECK (device_trim (dev, 1, UINT64_MAX, 0) == -ENOSPC);
  CHECK (device_extents (dev, 2, DEV_SIZE - 1, 0, collect_extent, &l)
         == -EIO);
  CHECK (device_extents (dev, 1, UINT64_MAX, 0, collect_extent, &l) == -EIO);
  verify_all (dev, "after requests beyond the end");
}

/* Clones: adjacent pieces on one backend merge; the log shows it. */
static void
test_mixed_clones (struct device *dev)
{
  unsigned char buf[32 * S];

  trace_on ();
  /* 35..42: two linear targets, contiguous in file A: one clone. */
  CHECK (device_pread (dev, buf, 7 * S, 35 * S, 0) == 0);
  CHECKF (strstr (unit_last_log, "mixed: read 17920+3584 -> 1 clone:") != NULL,
          "%s", unit_last_log);
  CHECK (unit_nr_logs == 1);                 /* one line per request */
  /* 0..13: A then B: two clones. */
  CHECK (device_pread (dev, buf, 13 * S, 0, 0) == 0);
  CHECKF (strstr (unit_last_log, "-> 2 clones:") != NULL, "%s", unit_last_log);
  /* The zero target emits no clone; striped 12 sectors / chunk 3 = 4. */
  CHECK (device_pread (dev, buf, 16 * S, 13 * S, 0) == 0);
  CHECKF (strstr (unit_last_log, "-> 4 clones:") != NULL, "%s", unit_last_log);
  CHECK (device_pwrite (dev, buf, 4 * S, 25 * S, 0) == 0);   /* zero target */
  CHECKF (strstr (unit_last_log, "-> 0 clones") != NULL, "%s", unit_last_log);
  CHECK (device_flush (dev, 0) == 0);
  CHECKF (strstr (unit_last_log, "flush -> 3 backends") != NULL,
          "%s", unit_last_log);
  CHECK (device_pread (dev, buf, 3 * S, 41 * S, 0) == -EIO);
  trace_off ();
  verify_all (dev, "after clone tests");
}

/* 1024 contiguous linear targets over one file: one merged clone. */
static void
test_merge_1024 (void)
{
  struct mapper_err err = { "" };
  const uint64_t tsz = 2 * S, n = 1024, size = n * tsz;
  char *path = strdup (unit_path ("merge"));
  unsigned char *bg = malloc (size), *buf = malloc (size);
  struct device *dev;
  struct table *t;
  size_t cap = n * 200, used = 0;
  char *text = malloc (cap);
  int r;

  for (int pass = 0; pass < 2; pass++) {
    /* pass 0: target i at file offset i (contiguous);
     * pass 1: reversed (nothing can merge: 1024 clones, heap spill).
     */
    unit_fill (bg, size, 555 + pass, 0);
    unit_write_file (path, bg, size);
    used = 0;
    for (uint64_t i = 0; i < n; i++) {
      uint64_t fo = pass ? (n - 1 - i) * 2 : i * 2;
      used += snprintf (text + used, cap - used, "%" PRIu64 " 2 linear %s %"
                        PRIu64 "\n", i * 2, path, fo);
    }
    r = table_parse (text, "merge", &t, &err);
    CHECKF (r == 0, "%s", err.msg);
    if (r != 0)
      break;
    CHECK (table_nr_targets (t) == 1024);
    CHECK (table_nr_backends (t) == 1);
    CHECK (device_create ("merge", &dev, &err) == 0);
    device_load (dev, t);
    CHECK (device_resume (dev, &err) == 0);

    trace_on ();
    memset (buf, 0, size);
    CHECK (device_pread (dev, buf, size, 0, 0) == 0);
    if (pass == 0) {
      CHECKF (strstr (unit_last_log, "merge: read 0+1048576 -> 1 clone: [")
              != NULL, "%s", unit_last_log);
      CHECK (memcmp (buf, bg, size) == 0);
    }
    else {
      CHECKF (strstr (unit_last_log, "merge: read 0+1048576 -> 1024 clones:")
              != NULL, "%.200s", unit_last_log);
      for (uint64_t i = 0; i < n; i++)
        CHECK (memcmp (buf + i * tsz, bg + (n - 1 - i) * tsz, tsz) == 0);
    }
    /* A read over a middle, unaligned stretch. */
    CHECK (device_pread (dev, buf, 300 * tsz + 3, 100 * tsz - 1, 0) == 0);
    if (pass == 0) {
      CHECKF (strstr (unit_last_log, "-> 1 clone:") != NULL,
              "%s", unit_last_log);
      CHECK (memcmp (buf, bg + 100 * tsz - 1, 300 * tsz + 3) == 0);
    }
    /* Writes, zero, trim merge the same way. */
    unit_fill (buf, size, 999 + pass, 0);
    CHECK (device_pwrite (dev, buf, size, 0, 0) == 0);
    if (pass == 0)
      CHECKF (strstr (unit_last_log, "write 0+1048576 -> 1 clone:") != NULL,
              "%s", unit_last_log);
    {
      size_t fsize;
      char *got = unit_read_file (path, &fsize);
      CHECK (got && fsize == size);
      if (got && pass == 0)
        CHECK (memcmp (got, buf, size) == 0);
      if (got && pass == 1)
        for (uint64_t i = 0; i < n; i++)
          CHECK (memcmp (got + (n - 1 - i) * tsz, buf + i * tsz, tsz) == 0);
      free (got);
    }
    CHECK (device_zero (dev, size - 2, 1, 0) == 0);
    if (pass == 0)
      CHECKF (strstr (unit_last_log, "zero 1+1048574 -> 1 clone:") != NULL,
              "%s", unit_last_log);
    CHECK (device_trim (dev, size, 0, 0) == 0);
    if (pass == 0)
      CHECKF (strstr (unit_last_log, "trim 0+1048576 -> 1 clone:") != NULL,
              "%s", unit_last_log);
    CHECK (device_flush (dev, 0) == 0);
    CHECKF (strstr (unit_last_log, "flush -> 1 backend") != NULL,
            "%s", unit_last_log);
    trace_off ();
    device_destroy (dev);
  }
  free (text);
  free (bg);
  free (buf);
  unlink (path);
  free (path);
}

/* Sparse backing files: extents report holes where nothing was written,
 * in device coordinates (linear and striped remap the backend's answer).
 */
static void
test_sparse_extents (void)
{
  static struct ext_list l;
  struct mapper_err err = { "" };
  const uint64_t K = 1024;
  char *p1 = strdup (unit_path ("sparse1")), *p2 = strdup (unit_path ("sparse2"));
  char *text;
  struct table *t;
  struct device *dev;
  unsigned char buf[4096];
  uint64_t size;
  int r;

  unit_write_file (p1, NULL, 1024 * K);
  unit_write_file (p2, NULL, 1024 * K);
  /* [0,128K) linear p1 @4K; [128K,256K) striped 2 x 32K: p1 @512K,
   * p2 @256K; [256K,288K) zero.
   */
  text = unit_sprintf ("0 256 linear %s 8\n"
                       "256 256 striped 2 64 %s 1024 %s 512\n"
                       "512 64 zero\n", p1, p1, p2);
  r = table_parse (text, "sparse", &t, &err);
  free (text);
  CHECKF (r == 0, "%s", err.msg);
  if (r != 0)
    goto out;
  size = table_caps (t)->size;
  CHECK (size == 288 * K);
  CHECK (device_create ("sparse", &dev, &err) == 0);
  device_load (dev, t);
  CHECK (device_resume (dev, &err) == 0);

  /* Nothing written: all holes. */
  l.n = 0;
  CHECK (device_extents (dev, size, 0, 0, collect_extent, &l) == 0);
  if (check_extent_shape (&l, 0, size, false, "sparse empty"))
    for (size_t i = 0; i < l.n; i++)
      CHECKF (l.e[i].type == (MAPPER_EXTENT_HOLE | MAPPER_EXTENT_ZERO),
              "extent %" PRIu64 "+%" PRIu64 " type %u", l.e[i].off,
              l.e[i].len, l.e[i].type);
  else
    unit_failures++;

  /* Data at device 64K (file p1 68K) and device 160K (chunk 1: stripe 1
   * row 0 = p2 256K).
   */
  unit_fill (buf, sizeof buf, 4242, 0);
  CHECK (device_pwrite (dev, buf, 4096, 64 * K, 0) == 0);
  CHECK (device_pwrite (dev, buf, 4096, 160 * K, 0) == 0);
  l.n = 0;
  CHECK (device_extents (dev, size, 0, 0, collect_extent, &l) == 0);
  if (check_extent_shape (&l, 0, size, false, "sparse written")) {
    static const struct { uint64_t at; int type; } want[] = {
      { 0, 3 }, { 60 * 1024 + 4095, 3 },
      { 64 * 1024, 0 }, { 68 * 1024 - 1, 0 },
      { 68 * 1024, 3 }, { 127 * 1024, 3 },
      { 128 * 1024, 3 }, { 160 * 1024 - 1, 3 },
      { 160 * 1024, 0 }, { 164 * 1024 - 1, 0 },
      { 164 * 1024, 3 }, { 255 * 1024, 3 },
      { 256 * 1024, 3 }, { 288 * 1024 - 1, 3 },
    };
    for (size_t i = 0; i < ARRAY_SIZE (want); i++) {
      int ty = ext_type_at (&l, want[i].at);
      CHECKF (ty == want[i].type, "byte %" PRIu64 ": type %d, want %d",
              want[i].at, ty, want[i].type);
    }
  }
  else
    unit_failures++;

  /* REQ_ONE from 0: one hole extent, not into the data. */
  l.n = 0;
  CHECK (device_extents (dev, size, 0, MAPPER_REQ_ONE, collect_extent, &l)
         == 0);
  CHECK (l.n == 1);
  if (l.n == 1) {
    CHECK (l.e[0].off == 0 && l.e[0].len > 0 && l.e[0].len <= 64 * K);
    CHECK (l.e[0].type == (MAPPER_EXTENT_HOLE | MAPPER_EXTENT_ZERO));
  }
  /* An unaligned window inside the data. */
  l.n = 0;
  CHECK (device_extents (dev, 100, 64 * K + 7, 0, collect_extent, &l) == 0);
  if (check_extent_shape (&l, 64 * K + 7, 100, false, "window"))
    CHECK (l.n == 1 && l.e[0].type == 0);
  else
    unit_failures++;
  /* Zeroing with MAY_TRIM may punch the data back into a hole; any extent
   * claiming zeros must read as zeros.
   */
  CHECK (device_zero (dev, 4096, 64 * K, MAPPER_MAY_TRIM) == 0);
  l.n = 0;
  CHECK (device_extents (dev, size, 0, 0, collect_extent, &l) == 0);
  if (check_extent_shape (&l, 0, size, false, "after punch")) {
    for (size_t i = 0; i < l.n; i++)
      if (l.e[i].type & MAPPER_EXTENT_ZERO) {
        unsigned char *b = malloc (l.e[i].len);
        CHECK (device_pread (dev, b, l.e[i].len, l.e[i].off, 0) == 0);
        CHECKF (unit_is_zero (b, l.e[i].len), "extent %" PRIu64 "+%" PRIu64,
                l.e[i].off, l.e[i].len);
        free (b);
      }
    CHECK (ext_type_at (&l, 160 * K) == 0);
  }
  else
    unit_failures++;
  device_destroy (dev);
 out:
  unlink (p1);
  unlink (p2);
  free (p1);
  free (p2);
}

/* A query over very many pieces may stop early (nbdkit only needs the
 * first byte covered) but stays contiguous and in range.
 */
static void
test_many_extents (void)
{
  static struct ext_list l;
  struct mapper_err err = { "" };
  char *p1 = strdup (unit_path ("many1")), *p2 = strdup (unit_path ("many2"));
  char *text;
  struct table *t;
  struct device *dev;
  const uint64_t sectors = 20000;         /* 1-sector chunks: 20000 pieces */
  unsigned char buf[S];
  int r;

  unit_write_file (p1, NULL, sectors / 2 * S + 8 * S);
  unit_write_file (p2, NULL, sectors / 2 * S + 8 * S);
  text = unit_sprintf ("0 %" PRIu64 " striped 2 1 %s 8 %s 0\n", sectors,
                       p1, p2);
  r = table_parse (text, "many", &t, &err);
  free (text);
  CHECKF (r == 0, "%s", err.msg);
  if (r != 0)
    goto out;
  CHECK (device_create ("many", &dev, &err) == 0);
  device_load (dev, t);
  CHECK (device_resume (dev, &err) == 0);
  memset (buf, 7, sizeof buf);
  CHECK (device_pwrite (dev, buf, S, 9 * S, 0) == 0);   /* some data */

  l.n = 0;
  l.overflow = false;
  r = device_extents (dev, sectors * S - 3, 3, 0, collect_extent, &l);
  CHECK (r == 0);
  CHECK (!l.overflow);
  CHECK (l.n >= 1);
  {
    uint64_t next = 3;
    bool ok = true;
    for (size_t i = 0; i < l.n && ok; i++) {
      ok = l.e[i].off == next && l.e[i].len > 0 &&
           l.e[i].off + l.e[i].len <= sectors * S;
      next = l.e[i].off + l.e[i].len;
    }
    CHECKF (ok, "%zu extents not contiguous", l.n);
    CHECK (ext_type_at (&l, 9 * S) == 0);
    CHECK (ext_type_at (&l, 9 * S - 1) ==
           (MAPPER_EXTENT_HOLE | MAPPER_EXTENT_ZERO));
  }
  device_destroy (dev);
 out:
  unlink (p1);
  unlink (p2);
  free (p1);
  free (p2);
}

/* --- suspend / resume ---------------------------------------------------- */

static uint64_t
dev_size (struct device *dev)
{
  struct mapper_caps caps;
  if (!device_get_caps (dev, &caps))
    return UINT64_MAX;
  return caps.size;
}

struct reader {
  struct device *dev;
  const unsigned char *want;
  _Atomic bool stop;
  unsigned errors;
  _Atomic unsigned reads;
};

static void *
reader_thread (void *arg)
{
  struct reader *rd = arg;
  unsigned char buf[4096];

  while (!atomic_load (&rd->stop)) {
    int r = device_pread (rd->dev, buf, sizeof buf, 0, 0);
    if (r != 0 || memcmp (buf, rd->want, sizeof buf) != 0)
      rd->errors++;
    rd->reads++;
  }
  return NULL;
}

static void
test_suspend_resume (void)
{
  struct mapper_err err = { "" };
  char *pa = strdup (unit_path ("swapA")), *pb = strdup (unit_path ("swapB"));
  unsigned char *a = malloc (64 * S), *b = malloc (64 * S);
  unsigned char buf[8192];
  struct device *dev;
  struct table *t;
  int r;

  unit_fill (a, 64 * S, 31, 0);
  unit_fill (b, 64 * S, 32, 0);
  unit_write_file (pa, a, 64 * S);
  unit_write_file (pb, b, 64 * S);

  /* A fresh device has no table: resume fails, caps are unavailable. */
  CHECK (device_create ("fresh", &dev, &err) == 0);
  r = device_resume (dev, &err);
  CHECKF (r == -ENXIO || (r < 0 && r != -EINVAL), "resume without table: %d",
          r);
  CHECK (r < 0);
  CHECKF (strstr (err.msg, "fresh") != NULL, "%s", err.msg);
  CHECK (dev_size (dev) == UINT64_MAX);
  CHECK (device_suspend (dev, false) == 0);     /* already suspended */
  r = device_resume (dev, &err);
  CHECK (r < 0);
  /* A table loaded but never resumed is freed with the device. */
  t = unit_parse ("0 8 linear %s 0\n", pa);
  device_load (dev, t);
  CHECK (dev_size (dev) == UINT64_MAX);         /* inactive only */
  device_destroy (dev);

  /* load + resume, suspend + load + resume: the table changes. */
  CHECK (device_create ("swap", &dev, &err) == 0);
  device_load (dev, unit_parse ("0 8 linear %s 0\n", pa));
  CHECK (device_resume (dev, &err) == 0);
  CHECK (dev_size (dev) == 8 * S);
  CHECK (device_pread (dev, buf, 8 * S, 0, 0) == 0);
  CHECK (memcmp (buf, a, 8 * S) == 0);
  CHECK (device_pread (dev, buf, 1, 8 * S, 0) == -EIO);

  CHECK (device_suspend (dev, false) == 0);
  CHECK (device_suspend (dev, true) == 0);      /* idempotent */
  device_load (dev,
               unit_parse ("0 4 linear %s 0\n4 12 linear %s 0\n", pa, pb));
  CHECK (dev_size (dev) == 8 * S);              /* not live yet */
  CHECK (device_resume (dev, &err) == 0);
  CHECK (dev_size (dev) == 16 * S);
  CHECK (device_pread (dev, buf, 16 * S, 0, 0) == 0);
  CHECK (memcmp (buf, a, 4 * S) == 0);
  CHECK (memcmp (buf + 4 * S, b, 12 * S) == 0);

  /* Resume with nothing new loaded keeps the live table. */
  CHECK (device_suspend (dev, true) == 0);
  CHECK (device_resume (dev, &err) == 0);
  CHECK (dev_size (dev) == 16 * S);

  /* Load while live (dm reload), then resume: swapped.  Loading twice
   * replaces the inactive table.
   */
  device_load (dev, unit_parse ("0 2 linear %s 0\n", pb));
  device_load (dev, unit_parse ("0 6 linear %s 8\n", pb));
  CHECK (dev_size (dev) == 16 * S);
  CHECK (device_pread (dev, buf, 16 * S, 0, 0) == 0);
  CHECK (device_resume (dev, &err) == 0);
  CHECK (dev_size (dev) == 6 * S);
  CHECK (device_pread (dev, buf, 6 * S, 0, 0) == 0);
  CHECK (memcmp (buf, b + 8 * S, 6 * S) == 0);
  CHECK (device_pwrite (dev, buf, 7 * S, 0, 0) == -ENOSPC);

  /* Swaps under a concurrent reader: every read sees one whole table. */
  {
    struct reader rd = { .dev = dev, .want = a };
    pthread_t th;
    device_load (dev, unit_parse ("0 8 linear %s 0\n", pa));
    CHECK (device_resume (dev, &err) == 0);
    atomic_init (&rd.stop, false);
    CHECK (pthread_create (&th, NULL, reader_thread, &rd) == 0);
    for (int i = 0; i < 200; i++) {
      if (i & 1)
        device_load (dev, unit_parse ("0 8 linear %s 0\n", pa));
      else
        device_load (dev, unit_parse ("0 3 linear %s 0\n"
                                 "3 5 linear %s 3\n", pa, pa));
      CHECK (device_suspend (dev, i % 3 == 0) == 0);
      if (i % 2 == 0)
        usleep (100);
      CHECK (device_resume (dev, &err) == 0);
    }
    /* On a loaded machine the reader may not have run yet: let it read
     * before stopping it, so the check below means something.
     */
    while (atomic_load (&rd.reads) == 0)
      usleep (1000);
    atomic_store (&rd.stop, true);
    pthread_join (th, NULL);
    CHECKF (rd.reads > 0, "reader made no progress");
    CHECKF (rd.errors == 0, "%u of %u reads failed or saw wrong data",
            rd.errors, rd.reads);
  }
  device_destroy (dev);

  /* Grow the backing file, then reload to use the new space (online
   * resize: the backend is shared with the live table).
   */
  {
    char *pg = strdup (unit_path ("grow"));
    struct table *t2 = NULL;
    unit_write_file (pg, a, 8 * S);
    CHECK (device_create ("grow", &dev, &err) == 0);
    device_load (dev, unit_parse ("0 8 linear %s 0\n", pg));
    CHECK (device_resume (dev, &err) == 0);
    if (truncate (pg, 16 * S) == -1)
      UNIT_FATAL ("truncate: %s", strerror (errno));
    {
      char *text = unit_sprintf ("0 16 linear %s 0\n", pg);
      r = table_parse (text, "grow", &t2, &err);
      free (text);
    }
    CHECKF (r == 0, "reload after growing the backing file refused: %s",
            err.msg);
    if (r == 0) {
      CHECK (table_caps (t2)->size == 16 * S);
      CHECK (device_suspend (dev, false) == 0);
      device_load (dev, t2);
      CHECK (device_resume (dev, &err) == 0);
      CHECK (dev_size (dev) == 16 * S);
      CHECK (device_pwrite (dev, a, 8 * S, 8 * S, 0) == 0);
      CHECK (device_pread (dev, buf, 16 * S, 0, 0) == 0);
      CHECK (memcmp (buf, a, 8 * S) == 0 && memcmp (buf + 8 * S, a, 8 * S) == 0);
    }
    device_destroy (dev);
    unlink (pg);
    free (pg);
  }

  free (a);
  free (b);
  unlink (pa);
  unlink (pb);
  free (pa);
  free (pb);
}

/* A backing file that cannot be opened for writing (immutable, which
 * stops even root) is opened read-only and the device is read-only.
 */
static void
test_read_only (void)
{
  struct mapper_err err = { "" };
  char *pro = strdup (unit_path ("ro")), *prw = strdup (unit_path ("rw"));
  unsigned char *a = malloc (16 * S), buf[16 * S];
  struct mapper_caps caps;
  struct device *dev;
  struct table *t = NULL;
  char *text;
  int ifd, flags, r;

  unit_fill (a, 16 * S, 61, 0);
  unit_write_file (pro, a, 8 * S);
  unit_write_file (prw, a + 8 * S, 8 * S);
  ifd = open (pro, O_RDONLY | O_CLOEXEC);
  if (ifd == -1 || ioctl (ifd, FS_IOC_GETFLAGS, &flags) == -1 ||
      (flags |= FS_IMMUTABLE_FL, ioctl (ifd, FS_IOC_SETFLAGS, &flags)) == -1) {
    fprintf (stderr, "skipped the read-only backend test: cannot make %s "
             "immutable: %s\n", pro, strerror (errno));
    if (ifd >= 0)
      close (ifd);
    goto out;
  }
  text = unit_sprintf ("0 8 linear %s 0\n8 8 linear %s 0\n", pro, prw);
  r = table_parse (text, "ro", &t, &err);
  free (text);
  flags &= ~FS_IMMUTABLE_FL;
  if (ioctl (ifd, FS_IOC_SETFLAGS, &flags) == -1)
    UNIT_FATAL ("cannot clear the immutable flag of %s", pro);
  close (ifd);
  CHECKF (r == 0, "%s", err.msg);
  if (r != 0)
    goto out;
  CHECK (!table_caps (t)->can_write);
  CHECK (device_create ("ro", &dev, &err) == 0);
  device_load (dev, t);
  CHECK (device_resume (dev, &err) == 0);
  CHECK (device_get_caps (dev, &caps) && !caps.can_write);
  CHECK (device_pread (dev, buf, 16 * S, 0, 0) == 0);
  CHECK (memcmp (buf, a, 16 * S) == 0);
  memset (buf, 0xee, sizeof buf);
  CHECK (device_pwrite (dev, buf, 16 * S, 0, 0) == -EPERM);
  CHECK (device_pwrite (dev, buf, 1, 8 * S, 0) == -EPERM);
  CHECK (device_zero (dev, 16 * S, 0, 0) == -EPERM);
  CHECK (device_trim (dev, 16 * S, 0, 0) == -EPERM);
  CHECK (device_flush (dev, 0) == 0);
  CHECK (device_pread (dev, buf, 16 * S, 0, 0) == 0);
  CHECK (memcmp (buf, a, 16 * S) == 0);
  device_destroy (dev);
 out:
  unlink (pro);
  unlink (prw);
  free (pro);
  free (prw);
  free (a);
}

/* A table with no backends at all. */
static void
test_no_backends (void)
{
  struct mapper_err err = { "" };
  struct device *dev;
  unsigned char buf[1024];
  static struct ext_list l;

  CHECK (device_create ("nobe", &dev, &err) == 0);
  device_load (dev, unit_parse ("0 1 zero\n1 1 error\n"));
  CHECK (device_resume (dev, &err) == 0);
  memset (buf, 1, sizeof buf);
  CHECK (device_pread (dev, buf, 512, 0, 0) == 0);
  CHECK (unit_is_zero (buf, 512));
  CHECK (device_pwrite (dev, buf, 512, 0, MAPPER_FUA) == 0);
  CHECK (device_pread (dev, buf, 513, 0, 0) == -EIO);
  CHECK (device_pwrite (dev, buf, 1, 1023, 0) == -EIO);
  CHECK (device_zero (dev, 512, 0, MAPPER_FAST_ZERO) == 0);
  CHECK (device_flush (dev, 0) == 0);
  l.n = 0;
  CHECK (device_extents (dev, 512, 0, 0, collect_extent, &l) == 0);
  CHECK (l.n == 1 && l.e[0].off == 0 && l.e[0].len == 512 &&
         l.e[0].type == (MAPPER_EXTENT_HOLE | MAPPER_EXTENT_ZERO));
  l.n = 0;
  CHECK (device_extents (dev, 2, 511, 0, collect_extent, &l) == 0);
  CHECK (l.n == 2 && l.e[0].off == 511 && l.e[0].len == 1 &&
         l.e[1].off == 512 && l.e[1].len == 1 && l.e[1].type == 0);
  l.n = 0;
  CHECK (device_extents (dev, 1, 512, 0, collect_extent, &l) == 0);
  CHECK (l.n == 1 && l.e[0].off == 512 && l.e[0].len == 1 &&
         l.e[0].type == 0);
  CHECK (device_suspend (dev, false) == 0);
  CHECK (device_resume (dev, &err) == 0);
  device_destroy (dev);
}

/* --- a retry that moves a remote clone to a local backend ----------------- */

/* A remote backend (it has start) that fails every read in submit: the
 * worst timing of an I/O loop that fails a clone before the worker has
 * gone on to its local clones.  A mirror's end_io then points the clone
 * at a local leg (CLONE_RETRY): io_req_run must submit it there once,
 * from the retry list, and not a second time as if it had been local all
 * along.
 */
static int nr_local_submits;

static void
failing_remote_submit (struct backend *be, struct clone *c)
{
  clone_done (c, -EIO);
}

static void
failing_remote_start (struct backend *be, struct clone *c)
{
  abort ();                     /* never queued to the loop */
}

static void
counting_local_submit (struct backend *be, struct clone *c)
{
  /* A second submit is the bug: count it, but complete the clone only
   * once, so that the request still ends and the check below reports.
   */
  if (++nr_local_submits == 1)
    clone_done (c, 0);
}

static const struct backend_ops failing_remote_ops = {
  .kind = "test-remote", .submit = failing_remote_submit,
  .start = failing_remote_start,
};
static const struct backend_ops counting_local_ops = {
  .kind = "test-local", .submit = counting_local_submit,
};

static int
retry_on_local (struct clone *c, void *ctx, uint64_t arg, int error)
{
  if (error == 0 || arg)        /* arg: already retried */
    return error;
  clone_retry (c, ctx, c->offset, 1);
  return CLONE_RETRY;
}

static void
test_retry_remote_to_local (void)
{
  struct backend remote = { .ops = &failing_remote_ops, .name = "remote" };
  struct backend local = { .ops = &counting_local_ops, .name = "local" };
  static char buf[512];
  struct io_req req;

  backend_flush_init (&remote);
  backend_flush_init (&local);
  io_req_init (&req, IO_READ, 0);
  CHECK_EQ (io_emit_end_io (&req, &remote, 0, sizeof buf, buf,
                            retry_on_local, &local, 0), 0);
  CHECK_EQ (io_req_run (&req), 0);
  CHECKF (nr_local_submits == 1,
          "the retried clone was submitted %d times to the local backend",
          nr_local_submits);
  io_req_release (&req);
  backend_flush_destroy (&remote);
  backend_flush_destroy (&local);
}

int
main (void)
{
  struct device *dev;

  unit_tmpdir ();
  setup_mixed (&dev);
  test_rw_edges (dev);
  test_zero_trim_edges (dev);
  test_extents_edges (dev);
  test_beyond_end (dev);
  test_mixed_clones (dev);
  verify_all (dev, "end");
  device_destroy (dev);
  for (int f = 0; f < NFILES; f++) {
    close (fd[f]);
    free (fpath[f]);
    free (fexp[f]);
  }
  test_merge_1024 ();
  test_sparse_extents ();
  test_suspend_resume ();
  test_read_only ();
  test_many_extents ();
  test_no_backends ();
  test_retry_remote_to_local ();
  CHECK (device_count () == 0);
  UNIT_EXIT ();
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* striped <#stripes> <chunk_sectors> (<dev> <offset>)...: chunks laid out
 * round-robin over the stripes, with dm-stripe's rules.  Power-of-two
 * chunk sizes and stripe counts take a shift/mask fast path computed once
 * in the constructor; the general path is plain division.
 */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "target.h"
#include "util.h"

struct stripe {
  struct backend *be;
  uint64_t start;               /* bytes into the backend */
};

struct striped {
  uint32_t nr;                  /* stripes */
  int nr_shift;                 /* log2 (nr), or -1 */
  uint64_t chunk;               /* bytes */
  int chunk_shift;              /* log2 (chunk), or -1 */
  uint64_t stripe_len;          /* bytes on each stripe */
  struct stripe stripes[];
};

static int
ilog2_or_minus1 (uint64_t x)
{
  return IS_POWER_OF_2 (x) ? __builtin_ctzll (x) : -1;
}

static const struct target_arg nr_arg = { "number of stripes", NULL, 1,
                                          UINT32_MAX };
static const struct target_arg chunk_arg = { "chunk size", "sectors", 1,
                                             UINT32_MAX };

static int
striped_ctr (struct target *ti, unsigned argc, char **argv,
             struct mapper_err *err)
{
  uint64_t nr, chunk_sectors, sectors = ti->len >> MAPPER_SECTOR_SHIFT;
  struct target_args as = { argc, argv };
  struct striped *sc;
  int r;

  if (argc < 2) {
    mapper_err_set (err, "expected <#stripes> <chunk_sectors> "
                    "(<dev> <offset>)..., got %u argument%s",
                    argc, argc == 1 ? "" : "s");
    return -EINVAL;
  }
  if ((r = target_read_arg (&nr_arg, &as, &nr, err)) < 0 ||
      (r = target_read_arg (&chunk_arg, &as, &chunk_sectors, err)) < 0)
    return r;
  if (argc != 2 + 2 * nr) {
    mapper_err_set (err, "%" PRIu64 " stripes need %" PRIu64
                    " arguments, got %u", nr, 2 + 2 * nr, argc);
    return -EINVAL;
  }
  if (sectors % nr != 0) {
    mapper_err_set (err, "target length %" PRIu64 " not divisible by %"
                    PRIu64 " stripes", sectors, nr);
    return -EINVAL;
  }
  if ((sectors / nr) % chunk_sectors != 0) {
    mapper_err_set (err, "stripe length %" PRIu64 " not divisible by chunk "
                    "size %" PRIu64, sectors / nr, chunk_sectors);
    return -EINVAL;
  }

  sc = calloc (1, sizeof *sc + nr * sizeof sc->stripes[0]);
  if (sc == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  sc->nr = nr;
  sc->nr_shift = ilog2_or_minus1 (nr);
  sc->chunk = chunk_sectors << MAPPER_SECTOR_SHIFT;
  sc->chunk_shift = ilog2_or_minus1 (sc->chunk);
  sc->stripe_len = ti->len / nr;
  for (uint32_t i = 0; i < nr; i++) {
    const char *dev = target_shift_arg (&as);
    struct stripe *s = &sc->stripes[i];

    if ((r = target_read_sectors ("offset", &as, &s->start, err)) < 0) {
      mapper_err_prefix (err, "stripe %" PRIu32, i);
      free (sc);
      return r;
    }
    r = target_get_backend (ti, dev, s->start, sc->stripe_len, &s->be, err);
    if (r < 0) {
      /* Backends already taken belong to the table: it releases them. */
      free (sc);
      return r;
    }
  }
  ti->private = sc;
  return 0;
}

static void
striped_dtr (struct target *ti)
{
  free (ti->private);
}

/* The chunk number of byte offset x (target- or stripe-relative) and
 * where in that chunk x lies.
 */
static inline uint64_t
striped_chunk_of (const struct striped *sc, uint64_t x, uint64_t *in_chunk)
{
  if (sc->chunk_shift >= 0) {
    *in_chunk = x & (sc->chunk - 1);
    return x >> sc->chunk_shift;
  }
  *in_chunk = x % sc->chunk;
  return x / sc->chunk;
}

/* Stripe, row and offset in the chunk of target offset off. */
static inline void
striped_split (const struct striped *sc, uint64_t off, uint32_t *stripe,
               uint64_t *row, uint64_t *in_chunk)
{
  uint64_t chunk_nr = striped_chunk_of (sc, off, in_chunk);

  if (sc->nr_shift >= 0) {
    *stripe = chunk_nr & (sc->nr - 1);
    *row = chunk_nr >> sc->nr_shift;
  }
  else {
    *stripe = chunk_nr % sc->nr;
    *row = chunk_nr / sc->nr;
  }
}

/* Where target-relative byte off lands: stripe index and backend offset;
 * returns the bytes left in that chunk.
 */
static inline uint64_t
striped_locate (const struct striped *sc, uint64_t off, uint32_t *stripe,
                uint64_t *be_off)
{
  uint64_t row, in_chunk;

  striped_split (sc, off, stripe, &row, &in_chunk);
  *be_off = sc->stripes[*stripe].start + row * sc->chunk + in_chunk;
  return sc->chunk - in_chunk;
}

static int
striped_map (struct target *ti, struct io_req *req, uint64_t off,
             uint64_t len, char *buf)
{
  struct striped *sc = ti->private;
  uint64_t done = 0;

  while (done < len) {
    uint32_t stripe;
    uint64_t be_off, n;
    int r;

    n = MIN (len - done, striped_locate (sc, off + done, &stripe, &be_off));
    r = io_emit (req, sc->stripes[stripe].be, be_off, n, buf_at (buf, done));
    if (r < 0)
      return r;
    done += n;
  }
  return 0;
}

/* --- extents ----------------------------------------------------------
 *
 * Asking each chunk's backend about that chunk alone costs a backend
 * query (two lseeks, or a network round trip) per chunk, and at least one
 * extent per chunk: a reply then covered at most MAX_EXTENTS chunks (256
 * MiB of 64K chunks), and mapping a big sparse device took thousands of
 * times what it takes through linear.  Instead, each stripe's backend is
 * asked about all of that stripe the request covers, from where the
 * merge needs it on; the first extents of its answer are kept in a small
 * window (a cursor), asked again from where the window ends when the
 * merge gets there (or where a backend stopped answering: an NBD server
 * may answer for less than asked).  The windows are merged in device
 * order: a hole only where every chunk piece is one, adjacent pieces of
 * the same type coalesced into one extent.  A stretch where every stripe
 * keeps one type for several rows is crossed in one step, so a sparse
 * device costs one query per stripe per request, and a fragmented one
 * about one per extent of each stripe, as through linear.
 */

/* Extents held on the stack, over all stripes; beyond STRIPED_STACK
 * stripes the windows come from malloc, STRIPED_HEAP_WINDOW each.
 */
#define STRIPED_STACK 16
#define STRIPED_STACK_EXTENTS 128
#define STRIPED_HEAP_WINDOW 4

struct striped_ext {
  uint64_t end;                 /* stripe-relative, exclusive */
  uint32_t type;
};

/* A window of one stripe's answer: e[i..n) cover stripe bytes from
 * (at most) the next one needed, contiguously, up to e[n-1].end.
 */
struct striped_cursor {
  struct striped_ext *e;
  unsigned i, n;
};

struct striped_merge {
  const struct striped *sc;
  struct striped_cursor *cur;
  unsigned window;              /* entries per cursor */
  uint64_t end;                 /* target offset the request ends at */
  uint32_t end_stripe;          /* where its last byte lies */
  uint64_t end_row, end_in;
};

/* The target offset of stripe-relative offset q of stripe j. */
static inline uint64_t
striped_target_off (const struct striped *sc, uint32_t j, uint64_t q)
{
  uint64_t in_chunk, row = striped_chunk_of (sc, q, &in_chunk);

  return (row * sc->nr + j) * sc->chunk + in_chunk;
}

/* Where the request's part of stripe j ends (stripe-relative). */
static uint64_t
striped_need_end (const struct striped_merge *mg, uint32_t j)
{
  uint64_t row = mg->end_row;

  if (j == mg->end_stripe)
    return row * mg->sc->chunk + mg->end_in + 1;
  if (j < mg->end_stripe)
    row++;
  return row * mg->sc->chunk;
}

struct striped_fill {
  struct striped_cursor *c;
  unsigned window;
  uint64_t base;                /* the stripe's start in its backend */
  uint64_t next;                /* backend offset expected next */
};

static int
striped_fill_cb (void *opaque, uint64_t offset, uint64_t length,
                 uint32_t type)
{
  struct striped_fill *f = opaque;
  struct striped_cursor *c = f->c;

  type &= MAPPER_EXTENT_HOLE | MAPPER_EXTENT_ZERO;
  /* Not contiguous (which a backend must not do), or full: enough.  A
   * full window still takes more of its last type.
   */
  if (offset != f->next || length == 0 ||
      (c->n == f->window && c->e[c->n - 1].type != type))
    return 1;
  f->next = offset + length;
  if (c->n > 0 && c->e[c->n - 1].type == type)
    c->e[c->n - 1].end = f->next - f->base;
  else
    c->e[c->n++] = (struct striped_ext) { f->next - f->base, type };
  return 0;
}

/* The extent of stripe j covering stripe-relative offset q, asking the
 * backend once for the rest of the stripe's part of the request when the
 * window has none.
 */
static const struct striped_ext *
striped_cursor_at (struct striped_merge *mg, uint32_t j, uint64_t q)
{
  struct striped_cursor *c = &mg->cur[j];

  while (c->i < c->n && c->e[c->i].end <= q)
    c->i++;
  if (c->i == c->n) {
    const struct stripe *s = &mg->sc->stripes[j];
    uint64_t need = striped_need_end (mg, j);
    struct striped_fill f = {
      .c = c, .window = mg->window, .base = s->start, .next = s->start + q,
    };
    int r;

    assert (q < need);
    c->i = c->n = 0;
    r = backend_extents (s->be, s->start + q, need - q, false,
                         striped_fill_cb, &f);
    if (r < 0 || c->n == 0) {
      /* Data from where it stopped answering to the end of our part
       * (a full window gives up its last entry for that).
       */
      uint64_t from = c->n ? c->e[c->n - 1].end : q;
      extent_backend_failed (s->be, s->start + from, need - from, r);
      if (c->n == mg->window) {
        c->n--;
        from = c->n ? c->e[c->n - 1].end : q;
      }
      if (from < need)
        c->e[c->n++] = (struct striped_ext) { need, 0 };
    }
    /* What it said beyond our part needs no clipping: need maps to the
     * request's end or beyond, and striped_run caps what it returns
     * there.
     */
  }
  return &c->e[c->i];
}

/* Target bytes [pos, stop) are all of one type, *type: from pos, scan the
 * chunks in device order while each stripe's current extent covers its
 * whole chunk with that type.  The scan stops at the first chunk that
 * changes type or ends inside; when every stripe passes, stop is where
 * the first of them changes, possibly many rows on.  Each step costs at
 * most as many cursor looks as chunks it crosses, plus one.
 */
static uint64_t
striped_run (struct striped_merge *mg, uint64_t pos, uint32_t *type)
{
  const struct striped *sc = mg->sc;
  const struct striped_ext *e;
  uint64_t row, in_chunk, q, stop = UINT64_MAX;
  uint32_t s0, t;

  striped_split (sc, pos, &s0, &row, &in_chunk);
  q = row * sc->chunk + in_chunk;
  e = striped_cursor_at (mg, s0, q);
  t = *type = e->type;
  for (uint32_t k = 0; k < sc->nr; k++) {
    uint32_t j = s0 + k;
    uint64_t r = row, dpos;

    if (j >= sc->nr) {          /* wrapped: the next row */
      j -= sc->nr;
      r++;
    }
    if (k > 0) {
      dpos = (r * sc->nr + j) * sc->chunk;
      if (dpos >= mg->end)
        return mg->end;
      e = striped_cursor_at (mg, j, r * sc->chunk);
      if (e->type != t)
        return dpos;
    }
    if (e->end < (r + 1) * sc->chunk)   /* ends inside this chunk */
      return MIN (striped_target_off (sc, j, e->end), mg->end);
    stop = MIN (stop, striped_target_off (sc, j, e->end));
  }
  return MIN (stop, mg->end);
}

static int
striped_extents_merged (struct target *ti, struct extent_walk *w,
                        uint64_t off, uint64_t len,
                        struct striped_cursor *cur, struct striped_ext *ext,
                        unsigned window)
{
  struct striped *sc = ti->private;
  struct striped_merge mg = {
    .sc = sc, .cur = cur, .window = window, .end = off + len,
  };
  uint64_t pos = off, run_start = off;
  uint32_t run_type = 0;
  int r = 0;

  striped_split (sc, mg.end - 1, &mg.end_stripe, &mg.end_row, &mg.end_in);
  for (uint32_t j = 0; j < sc->nr; j++)
    cur[j] = (struct striped_cursor) { .e = &ext[(size_t) j * window] };

  while (pos < mg.end) {
    uint32_t type;
    uint64_t stop = striped_run (&mg, pos, &type);

    if (pos > run_start && type != run_type) {
      r = extent_walk_add (w, ti, run_start, pos - run_start, run_type);
      if (r < 0 || extent_walk_done (w))
        return r;
      run_start = pos;
    }
    run_type = type;
    pos = stop;
  }
  return extent_walk_add (w, ti, run_start, pos - run_start, run_type);
}

/* Chunk by chunk: only when the windows cannot be had (out of memory). */
static int
striped_extents_per_chunk (struct target *ti, struct extent_walk *w,
                           uint64_t off, uint64_t len)
{
  struct striped *sc = ti->private;
  uint64_t done = 0;

  while (done < len && !extent_walk_done (w)) {
    uint32_t stripe;
    uint64_t be_off, n;
    int r;

    n = MIN (len - done, striped_locate (sc, off + done, &stripe, &be_off));
    r = extent_walk_backend (w, ti, off + done, sc->stripes[stripe].be,
                             be_off, n);
    if (r < 0)
      return r;
    done += n;
  }
  return 0;
}

static int
striped_extents (struct target *ti, struct extent_walk *w, uint64_t off,
                 uint64_t len)
{
  struct striped *sc = ti->private;
  uint64_t in_chunk;

  striped_chunk_of (sc, off, &in_chunk);
  if (len == 0)
    return 0;
  /* Inside one chunk: one backend, nothing to merge. */
  if (len <= sc->chunk - in_chunk) {
    uint32_t stripe;
    uint64_t be_off;

    striped_locate (sc, off, &stripe, &be_off);
    return extent_walk_backend (w, ti, off, sc->stripes[stripe].be,
                                be_off, len);
  }
  if (sc->nr <= STRIPED_STACK) {
    struct striped_cursor cur[STRIPED_STACK];
    struct striped_ext ext[STRIPED_STACK_EXTENTS];
    unsigned window = STRIPED_STACK_EXTENTS / sc->nr;

    /* One extent wanted: no need to read far ahead. */
    if (extent_walk_req_one (w))
      window = MIN (window, 2);
    return striped_extents_merged (ti, w, off, len, cur, ext, window);
  }
  else {
    size_t n = sc->nr;
    struct striped_cursor *cur = malloc (n * sizeof *cur);
    struct striped_ext *ext = malloc (n * STRIPED_HEAP_WINDOW * sizeof *ext);
    int r;

    if (cur && ext)
      r = striped_extents_merged (ti, w, off, len, cur, ext,
                                  STRIPED_HEAP_WINDOW);
    else
      r = striped_extents_per_chunk (ti, w, off, len);
    free (cur);
    free (ext);
    return r;
  }
}

static size_t
striped_status (struct target *ti, enum status_type type, char *buf,
                size_t len)
{
  struct striped *sc = ti->private;
  size_t used = 0;
  uint32_t i;

  if (type == STATUSTYPE_INFO) {
    /* dm: <#stripes> <devs...> 1 <A per healthy stripe> */
    EMIT ("%" PRIu32, sc->nr);
    for (i = 0; i < sc->nr; i++)
      EMIT (" %s", backend_name (sc->stripes[i].be));
    EMIT (" 1 ");
    for (i = 0; i < sc->nr; i++)
      EMIT ("A");
  }
  else {
    EMIT ("%" PRIu32 " %" PRIu64, sc->nr, sc->chunk >> MAPPER_SECTOR_SHIFT);
    for (i = 0; i < sc->nr; i++)
      EMIT (" %s %" PRIu64, backend_name (sc->stripes[i].be),
            sc->stripes[i].start >> MAPPER_SECTOR_SHIFT);
  }
  return used;
}

static int
striped_iterate_backends (struct target *ti,
                          int (*fn) (struct target *, struct backend *,
                                     void *),
                          void *data)
{
  struct striped *sc = ti->private;

  for (uint32_t i = 0; i < sc->nr; i++) {
    int r = fn (ti, sc->stripes[i].be, data);
    if (r)
      return r;
  }
  return 0;
}

const struct target_type striped_target = {
  .name = "striped",
  .version = { 1, 6, 0 },
  .ctr = striped_ctr,
  .dtr = striped_dtr,
  .map = striped_map,
  .extents = striped_extents,
  .status = striped_status,
  .iterate_backends = striped_iterate_backends,
};

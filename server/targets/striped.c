/* striped <#stripes> <chunk_sectors> (<dev> <offset>)...: chunks laid out
 * round-robin over the stripes, with dm-stripe's rules.  Power-of-two
 * chunk sizes and stripe counts take a shift/mask fast path computed once
 * in the constructor; the general path is plain division.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

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

static int
striped_ctr (struct target *ti, unsigned argc, char **argv,
             struct mapper_err *err)
{
  uint64_t nr, chunk_sectors, sectors = ti->len >> MAPPER_SECTOR_SHIFT;
  struct striped *sc;
  int r;

  if (argc < 2) {
    mapper_err_set (err, "expected <#stripes> <chunk_sectors> "
                    "(<dev> <offset>)..., got %u argument%s",
                    argc, argc == 1 ? "" : "s");
    return -EINVAL;
  }
  if ((r = parse_u64 (argv[0], &nr)) < 0 || nr == 0 || nr > UINT32_MAX) {
    mapper_err_set (err, "invalid number of stripes '%s' (must be 1 to %"
                    PRIu32 ")", argv[0], UINT32_MAX);
    return -EINVAL;
  }
  if ((r = parse_u64 (argv[1], &chunk_sectors)) < 0 || chunk_sectors == 0 ||
      chunk_sectors > UINT32_MAX) {
    mapper_err_set (err, "invalid chunk size '%s' (sectors, must be 1 to %"
                    PRIu32 ")", argv[1], UINT32_MAX);
    return -EINVAL;
  }
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
    const char *dev = argv[2 + 2 * i], *off = argv[3 + 2 * i];
    struct stripe *s = &sc->stripes[i];

    if ((r = parse_sectors (off, &s->start)) < 0) {
      mapper_err_set (err, "stripe %" PRIu32 ": offset '%s' %s", i, off,
                      parse_error_text (r));
      free (sc);
      return -EINVAL;
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

/* Where target-relative byte off lands: stripe index and backend offset;
 * returns the bytes left in that chunk.
 */
static inline uint64_t
striped_locate (const struct striped *sc, uint64_t off, uint32_t *stripe,
                uint64_t *be_off)
{
  uint64_t chunk_nr, in_chunk, row;

  if (sc->chunk_shift >= 0) {
    chunk_nr = off >> sc->chunk_shift;
    in_chunk = off & (sc->chunk - 1);
  }
  else {
    chunk_nr = off / sc->chunk;
    in_chunk = off % sc->chunk;
  }
  if (sc->nr_shift >= 0) {
    *stripe = chunk_nr & (sc->nr - 1);
    row = chunk_nr >> sc->nr_shift;
  }
  else {
    *stripe = chunk_nr % sc->nr;
    row = chunk_nr / sc->nr;
  }
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

static int
striped_extents (struct target *ti, struct extent_walk *w, uint64_t off,
                 uint64_t len)
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

static size_t
striped_status (struct target *ti, enum status_type type, char *buf,
                size_t len)
{
  struct striped *sc = ti->private;
  size_t used;
  uint32_t i;

#define APPEND(...) \
  used += snprintf (used < len ? buf + used : NULL, \
                    used < len ? len - used : 0, __VA_ARGS__)
  used = 0;
  if (type == STATUSTYPE_INFO) {
    /* dm: <#stripes> <devs...> 1 <A per healthy stripe> */
    APPEND ("%" PRIu32, sc->nr);
    for (i = 0; i < sc->nr; i++)
      APPEND (" %s", sc->stripes[i].be->name);
    APPEND (" 1 ");
    for (i = 0; i < sc->nr; i++)
      APPEND ("A");
  }
  else {
    APPEND ("%" PRIu32 " %" PRIu64, sc->nr,
            sc->chunk >> MAPPER_SECTOR_SHIFT);
    for (i = 0; i < sc->nr; i++)
      APPEND (" %s %" PRIu64, sc->stripes[i].be->name,
              sc->stripes[i].start >> MAPPER_SECTOR_SHIFT);
  }
#undef APPEND
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

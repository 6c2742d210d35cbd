/* SPDX-License-Identifier: BSD-3-Clause */
/* server/pdata/clone-metadata.c (dm-clone's metadata) against a model:
 * random hydrations committed and reopened read back exactly (several
 * array blocks, a two-level bitset btree); a crash at any write of a
 * commit reopens at the old or the new commit, never between; each
 * block of the metadata damaged in turn either is refused with an error
 * naming the block (or the superblock's field) or, when the block is no
 * longer in use, opens with exactly the committed bits; a table of
 * another geometry is refused naming the field.  In memory.
 *
 *   CLONE_MD_SEED=N   replay one seed (printed at the start)
 */
#include <config.h>

#include "unit.h"

#include "pdata/clone-metadata.h"

#define MD_BLOCKS 512                   /* 2 MiB of metadata */
#define REGION_SECTORS 8
#define NR_REGIONS 200000               /* 3125 words: 7 array blocks */
#define TARGET_SECTORS ((uint64_t) NR_REGIONS * REGION_SECTORS - 3)
#define NR_WORDS ((NR_REGIONS + 63) / 64)

static uint64_t rng_state;

static uint64_t
rnd (uint64_t n)
{
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return n ? rng_state % n : 0;
}

/* --- memory as the metadata device; drops writes after limit ---------- */

struct mdev {
  struct pd_blockdev bd;
  uint8_t *data;
  long limit, writes;             /* limit -1: all */
};

static int
m_read (void *opaque, uint64_t off, size_t len, void *buf)
{
  struct mdev *d = opaque;
  memcpy (buf, d->data + off, len);
  return 0;
}

static int
m_write (void *opaque, uint64_t off, size_t len, const void *buf)
{
  struct mdev *d = opaque;

  if (d->limit >= 0 && d->writes++ >= d->limit)
    return 0;                     /* lost in the crash */
  memcpy (d->data + off, buf, len);
  return 0;
}

static int
m_flush (void *opaque)
{
  (void) opaque;
  return 0;
}

static const struct pd_blockdev_ops m_ops = {
  .read = m_read, .write = m_write, .flush = m_flush,
};

static void
mdev_init (struct mdev *d, uint8_t *data)
{
  d->bd = (struct pd_blockdev) { .ops = &m_ops, .opaque = d,
                                 .size = (uint64_t) MD_BLOCKS * 4096 };
  d->data = data;
  d->limit = -1;
  d->writes = 0;
}

static int
md_open (struct mdev *d, uint64_t region, uint64_t target,
         struct clone_md **md, char *err)
{
  struct clone_md_open_args a = {
    .dev = &d->bd, .region_sectors = region, .target_sectors = target,
    .cache_blocks = 16,
  };
  err[0] = '\0';
  return clone_md_open (&a, md, err);
}

/* Open and load; 0 with the words, or the error. */
static int
open_load (uint8_t *image, uint64_t *words, char *err)
{
  struct mdev d;
  struct clone_md *md;
  int r;

  mdev_init (&d, image);
  r = md_open (&d, REGION_SECTORS, TARGET_SECTORS, &md, err);
  if (r < 0)
    return r;
  r = clone_md_load (md, words, err);
  clone_md_close (md);
  return r;
}

/* One transaction of random hydrations into md and the model. */
static void
hydrate_some (struct clone_md *md, uint64_t *model, unsigned n)
{
  char err[PD_ERR_LEN];

  for (unsigned i = 0; i < n; i++) {
    uint64_t r = rnd (NR_REGIONS), end = r + 1 + rnd (100);

    if (end > NR_REGIONS)
      end = NR_REGIONS;
    while (r < end) {
      uint64_t bits = 0, w = r / 64;
      for (; r < end && r / 64 == w; r++)
        bits |= 1ull << (r % 64);
      CHECK_EQ (clone_md_set_bits (md, w, bits, err), 0);
      model[w] |= bits;
    }
  }
}

int
main (void)
{
  static uint64_t model[NR_WORDS], old[NR_WORDS], got[NR_WORDS];
  uint8_t *image = calloc (MD_BLOCKS, 4096);
  uint8_t *saved = malloc ((size_t) MD_BLOCKS * 4096);
  uint8_t *copy = malloc ((size_t) MD_BLOCKS * 4096);
  char err[PD_ERR_LEN];
  struct clone_md *md;
  struct mdev d;
  const char *seed = getenv ("CLONE_MD_SEED");
  unsigned crashes = 0, damaged_refused = 0, damaged_stale = 0;

  if (!image || !saved || !copy)
    UNIT_FATAL ("out of memory");
  rng_state = seed ? strtoull (seed, NULL, 10) : (uint64_t) time (NULL);
  if (rng_state == 0)
    rng_state = 1;
  printf ("CLONE_MD_SEED=%llu\n", (unsigned long long) rng_state);

  /* Format: every region unhydrated, and it reopens so. */
  mdev_init (&d, image);
  CHECK_EQ (md_open (&d, REGION_SECTORS, TARGET_SECTORS, &md, err), 0);
  CHECK_EQ (clone_md_nr_regions (md), NR_REGIONS);
  clone_md_close (md);
  CHECK_EQ (open_load (image, got, err), 0);
  CHECK (memcmp (got, model, sizeof got) == 0);

  /* Random transactions, reopened after each. */
  for (unsigned round = 0; round < 20; round++) {
    mdev_init (&d, image);
    CHECK_EQ (md_open (&d, REGION_SECTORS, TARGET_SECTORS, &md, err), 0);
    hydrate_some (md, model, 1 + rnd (50));
    CHECKF (clone_md_commit (md, err) == 0, "commit: %s", err);
    clone_md_close (md);
    memset (got, 0, sizeof got);
    CHECKF (open_load (image, got, err) == 0, "reopen: %s", err);
    CHECK (memcmp (got, model, sizeof got) == 0);
  }

  /* A crash at each write of a commit: the old or the new bits. */
  memcpy (old, model, sizeof old);
  memcpy (saved, image, (size_t) MD_BLOCKS * 4096);
  uint64_t seed_now = rng_state;
  for (long limit = 0;; limit++) {
    uint64_t try[NR_WORDS];
    long writes;

    memcpy (image, saved, (size_t) MD_BLOCKS * 4096);
    memcpy (try, old, sizeof try);
    mdev_init (&d, image);
    CHECK_EQ (md_open (&d, REGION_SECTORS, TARGET_SECTORS, &md, err), 0);
    rng_state = seed_now;         /* the same transaction each time */
    hydrate_some (md, try, 40);
    d.limit = limit;
    d.writes = 0;
    CHECK_EQ (clone_md_commit (md, err), 0);
    writes = d.writes;
    clone_md_close (md);
    memset (got, 0, sizeof got);
    CHECKF (open_load (image, got, err) == 0, "after a crash at write %ld: "
            "%s", limit, err);
    CHECKF (memcmp (got, old, sizeof got) == 0 ||
            memcmp (got, try, sizeof got) == 0,
            "crash at write %ld: neither the old nor the new commit", limit);
    crashes++;
    if (writes <= limit) {        /* nothing was dropped: done */
      CHECK (memcmp (got, try, sizeof got) == 0);
      memcpy (model, try, sizeof model);
      break;
    }
  }
  printf ("%u crash points\n", crashes);
  CHECK (crashes > 3);

  /* Damage each block in turn. */
  memcpy (saved, image, (size_t) MD_BLOCKS * 4096);
  for (unsigned b = 0; b < MD_BLOCKS; b++) {
    bool zero = true;
    char where[64];
    int r;

    for (unsigned i = 0; i < 4096 && zero; i++)
      zero = saved[b * 4096 + i] == 0;
    if (zero)
      continue;
    memcpy (copy, saved, (size_t) MD_BLOCKS * 4096);
    copy[b * 4096 + 24 + rnd (4000)] ^= 0x10;
    memset (got, 0, sizeof got);
    r = open_load (copy, got, err);
    if (r == 0) {
      /* a block the last commit no longer uses */
      CHECKF (memcmp (got, model, sizeof got) == 0, "block %u damaged: "
              "opened with other bits", b);
      damaged_stale++;
      continue;
    }
    snprintf (where, sizeof where, "metadata block %u ", b);
    CHECKF (strstr (err, where) || (b == 0 && strstr (err, "superblock")),
            "block %u damaged: the error does not name it: %s", b, err);
    damaged_refused++;
  }
  printf ("damaged blocks: %u refused naming the block, %u unused\n",
          damaged_refused, damaged_stale);
  CHECK (damaged_refused >= 8);   /* sb, sm index and bitmap, btree, 7 array */

  /* Another geometry. */
  mdev_init (&d, saved);
  CHECK_EQ (md_open (&d, 16, TARGET_SECTORS, &md, err), -EINVAL);
  CHECKF (strstr (err, "superblock: region size 8 sectors, table says 16"),
          "%s", err);
  CHECK_EQ (md_open (&d, REGION_SECTORS, 4096, &md, err), -EINVAL);
  CHECKF (strstr (err, "superblock: target size"), "%s", err);
  /* Not dm-clone's: thin's magic. */
  memcpy (copy, saved, (size_t) MD_BLOCKS * 4096);
  memcpy (copy + 32, "\x3a\x4d\x9c\x01\0\0\0\0", 8);
  mdev_init (&d, copy);
  CHECK_EQ (md_open (&d, REGION_SECTORS, TARGET_SECTORS, &md, err), -EINVAL);
  CHECKF (strstr (err, "superblock: bad magic 0x19c4d3a (not dm-clone"),
          "%s", err);

  free (image);
  free (saved);
  free (copy);
  UNIT_EXIT ();
}

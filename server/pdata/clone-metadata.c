/* SPDX-License-Identifier: BSD-3-Clause */
/* dm-clone metadata (dm-clone-metadata.c's format) over persistent-data:
 * the superblock and the region bitset, a dm-bitset, which is a dm-array
 * of little-endian 64-bit words (dm-array.c): a btree, array block index
 * -> block number (dm's "fully populated btree"), over array blocks of a
 * 24-byte header (csum, max_entries, nr_entries, value_size, blocknr)
 * and up to 509 packed words.  Every array block but the last is full.
 *
 * Locking: md->lock around everything; under it the block cache's own.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdata.h"
#include "clone-metadata.h"

#define CLONE_MAGIC 0x8af27f64ull
#define CLONE_VERSION 1u

/* superblock offsets (struct superblock_disk, packed) */
enum {
  SB_FLAGS = 4, SB_BLOCKNR = 8, SB_UUID = 16, SB_MAGIC = 32, SB_VERSION = 40,
  SB_SM_ROOT = 44, SB_REGION_SIZE = 172, SB_TARGET_SIZE = 180,
  SB_BITSET_ROOT = 188,
};

/* array blocks (struct array_block) */
enum {
  AB_MAX_ENTRIES = 4, AB_NR_ENTRIES = 8, AB_VALUE_SIZE = 12, AB_HEADER = 24,
};
#define WORD_SIZE 8
#define WORDS_PER_BLOCK ((PD_BLOCK_SIZE - AB_HEADER) / WORD_SIZE)   /* 509 */

struct clone_md {
  pthread_mutex_t lock;
  struct pd_tm tm;
  struct pd_value_type array_vt;
  struct pd_btree array;          /* array block index -> block */
  uint64_t region_sectors, target_sectors;
  uint64_t nr_regions, nr_words, nr_ablocks;
  uint64_t root;                  /* the bitset's (array's btree) root */
  bool changed;
  bool failed;
};

static void
copy_err (struct clone_md *md, char *err)
{
  pd_bm_copy_err (&md->tm.bm, err);
}

/* The array's btree values are array blocks: a copied node takes a
 * reference on each, a removed value drops one (dm-array's block_inc,
 * block_dec; the words themselves hold no references).
 */
static int
ablock_inc (void *context, const uint8_t *v)
{
  struct clone_md *md = context;
  return pd_tm_inc (&md->tm, pd_le64 (v));
}

static int
ablock_dec (void *context, const uint8_t *v)
{
  struct clone_md *md = context;
  return pd_tm_dec (&md->tm, pd_le64 (v));
}

/* Entries array block i holds. */
static uint32_t
ablock_entries (struct clone_md *md, uint64_t i)
{
  uint64_t left = md->nr_words - i * WORDS_PER_BLOCK;
  return left < WORDS_PER_BLOCK ? (uint32_t) left : WORDS_PER_BLOCK;
}

/* Read array block i (pinned), checking its header against the array. */
static int
read_ablock (struct clone_md *md, uint64_t i, uint64_t *nr,
             struct pd_block **out)
{
  uint8_t v[8];
  struct pd_block *b;
  int r;

  r = pd_btree_lookup (&md->array, md->root, i, v);
  if (r == -ENODATA)
    return pd_error (&md->tm.bm, EIO, "region bitset: array block %llu "
                     "missing from its btree (root %llu)",
                     (unsigned long long) i, (unsigned long long) md->root);
  if (r < 0)
    return r;
  *nr = pd_le64 (v);
  if ((r = pd_tm_read (&md->tm, *nr, PD_ARRAY_BLOCK, &b)) < 0)
    return r;
  if (pd_le32 (b->data + AB_VALUE_SIZE) != WORD_SIZE ||
      pd_le32 (b->data + AB_MAX_ENTRIES) != WORDS_PER_BLOCK ||
      pd_le32 (b->data + AB_NR_ENTRIES) != ablock_entries (md, i)) {
    r = pd_error (&md->tm.bm, EIO, "metadata block %llu (array block %llu "
                  "of the region bitset): value size %u, max_entries %u, "
                  "nr_entries %u; expected %u, %u, %u",
                  (unsigned long long) *nr, (unsigned long long) i,
                  pd_le32 (b->data + AB_VALUE_SIZE),
                  pd_le32 (b->data + AB_MAX_ENTRIES),
                  pd_le32 (b->data + AB_NR_ENTRIES), WORD_SIZE,
                  WORDS_PER_BLOCK, ablock_entries (md, i));
    pd_tm_put (&md->tm, b);
    return r;
  }
  *out = b;
  return 0;
}

/* dm_bitset_empty + dm_bitset_resize to nr_regions, all clear. */
static int
format_bitset (struct clone_md *md)
{
  int r;

  if ((r = pd_btree_empty (&md->array, &md->root)) < 0)
    return r;
  for (uint64_t i = 0; i < md->nr_ablocks; i++) {
    struct pd_block *b;
    uint8_t v[8];

    if ((r = pd_tm_new_block (&md->tm, PD_ARRAY_BLOCK, &b)) < 0)
      return r;
    pd_put32 (b->data + AB_MAX_ENTRIES, WORDS_PER_BLOCK);
    pd_put32 (b->data + AB_NR_ENTRIES, ablock_entries (md, i));
    pd_put32 (b->data + AB_VALUE_SIZE, WORD_SIZE);
    pd_put64 (v, b->nr);
    pd_tm_put (&md->tm, b);
    if ((r = pd_btree_insert (&md->array, &md->root, i, v, false,
                              NULL)) < 0)
      return r;
  }
  return 0;
}

static int
commit_locked (struct clone_md *md)
{
  uint8_t *buf;
  int r;

  buf = calloc (1, PD_BLOCK_SIZE);
  if (!buf)
    return pd_error (&md->tm.bm, ENOMEM, "superblock: out of memory");
  pd_put64 (buf + SB_MAGIC, CLONE_MAGIC);
  pd_put32 (buf + SB_VERSION, CLONE_VERSION);
  pd_put64 (buf + SB_REGION_SIZE, md->region_sectors);
  pd_put64 (buf + SB_TARGET_SIZE, md->target_sectors);
  pd_put64 (buf + SB_BITSET_ROOT, md->root);
  if ((r = pd_msm_commit (&md->tm, buf + SB_SM_ROOT)) < 0 ||
      (r = pd_tm_commit (&md->tm, PD_CLONE_SUPERBLOCK, buf, NULL)) < 0)
    goto out;
  md->changed = false;
 out:
  free (buf);
  if (r < 0)
    md->failed = true;
  return r;
}

static int
check_superblock (struct clone_md *md, const uint8_t *sb)
{
  struct pd_bm *bm = &md->tm.bm;
  uint32_t v = pd_le32 (sb + SB_VERSION);

  if (pd_le64 (sb + SB_MAGIC) != CLONE_MAGIC)
    return pd_error (bm, EINVAL, "superblock: bad magic 0x%llx (not dm-clone "
                     "metadata: 0x%llx)",
                     (unsigned long long) pd_le64 (sb + SB_MAGIC),
                     CLONE_MAGIC);
  if (v != CLONE_VERSION)
    return pd_error (bm, EINVAL, "superblock: metadata version %u not "
                     "supported (only %u)", v, CLONE_VERSION);
  if (pd_le64 (sb + SB_REGION_SIZE) != md->region_sectors)
    return pd_error (bm, EINVAL, "superblock: region size %llu sectors, "
                     "table says %llu",
                     (unsigned long long) pd_le64 (sb + SB_REGION_SIZE),
                     (unsigned long long) md->region_sectors);
  if (pd_le64 (sb + SB_TARGET_SIZE) != md->target_sectors)
    return pd_error (bm, EINVAL, "superblock: target size %llu sectors, "
                     "table says %llu",
                     (unsigned long long) pd_le64 (sb + SB_TARGET_SIZE),
                     (unsigned long long) md->target_sectors);
  return 0;
}

int
clone_md_open (const struct clone_md_open_args *a, struct clone_md **out,
               char *err)
{
  struct clone_md *md;
  struct pd_block *sb;
  uint8_t *raw = NULL;
  uint64_t dev_blocks = a->dev->size / PD_BLOCK_SIZE, need;
  int r;

  md = calloc (1, sizeof *md);
  if (!md) {
    if (err)
      snprintf (err, PD_ERR_LEN, "clone metadata: out of memory");
    return -ENOMEM;
  }
  pthread_mutex_init (&md->lock, NULL);
  md->region_sectors = a->region_sectors;
  md->target_sectors = a->target_sectors;
  md->nr_regions = (a->target_sectors + a->region_sectors - 1) /
    a->region_sectors;
  md->nr_words = (md->nr_regions + 63) / 64;
  md->nr_ablocks = (md->nr_words + WORDS_PER_BLOCK - 1) / WORDS_PER_BLOCK;
  md->array_vt = (struct pd_value_type) {
    .size = 8, .context = md, .inc = ablock_inc, .dec = ablock_dec,
    .name = "region bitset",
  };
  md->array = (struct pd_btree) { .tm = &md->tm, .vt = &md->array_vt };

  /* superblock, space map index and bitmap, the array's blocks and its
   * btree's nodes, twice over for a commit's shadows
   */
  need = 8 + 2 * (md->nr_ablocks + md->nr_ablocks / 100 + 2);
  if (dev_blocks < need) {
    if (err)
      snprintf (err, PD_ERR_LEN, "metadata device: %llu blocks of 4 KiB, too "
                "small for %llu regions (at least %llu)",
                (unsigned long long) dev_blocks,
                (unsigned long long) md->nr_regions,
                (unsigned long long) need);
    pthread_mutex_destroy (&md->lock);
    free (md);
    return -EINVAL;
  }
  if ((r = pd_bm_init (&md->tm.bm, a->dev, a->cache_blocks, false)) < 0) {
    if (err)
      snprintf (err, PD_ERR_LEN, "clone metadata: out of memory");
    pthread_mutex_destroy (&md->lock);
    free (md);
    return r;
  }
  raw = aligned_alloc (PD_BLOCK_SIZE, PD_BLOCK_SIZE);
  if (!raw) {
    r = pd_error (&md->tm.bm, ENOMEM, "clone metadata: out of memory");
    goto err;
  }
  r = a->dev->ops->read (a->dev->opaque, 0, PD_BLOCK_SIZE, raw);
  if (r < 0) {
    r = pd_error (&md->tm.bm, -r, "superblock: read failed: %s",
                  strerror (-r));
    goto err;
  }
  if (pd_all_zero (raw, PD_BLOCK_SIZE)) {
    /* dm's __format_metadata */
    if ((r = pd_msm_format (&md->tm, dev_blocks)) < 0 ||
        (r = format_bitset (md)) < 0 ||
        (r = commit_locked (md)) < 0)
      goto err;
  }
  else {
    /* The magic first: a device holding something else is named so,
     * not as a checksum mismatch.
     */
    if ((r = check_superblock (md, raw)) < 0)
      goto err;
    if ((r = pd_bm_read (&md->tm.bm, 0, PD_CLONE_SUPERBLOCK, &sb)) < 0)
      goto err;
    md->root = pd_le64 (sb->data + SB_BITSET_ROOT);
    r = pd_msm_open (&md->tm, sb->data + SB_SM_ROOT, dev_blocks);
    pd_bm_put (&md->tm.bm, sb);
    if (r < 0)
      goto err;
    pd_tm_end_transaction (&md->tm);
    if (md->root == 0 || md->root >= md->tm.sm.nr_blocks) {
      r = pd_error (&md->tm.bm, EIO, "superblock: bitset root %llu outside "
                    "the %llu metadata blocks", (unsigned long long) md->root,
                    (unsigned long long) md->tm.sm.nr_blocks);
      goto err;
    }
  }
  free (raw);
  *out = md;
  return 0;
 err:
  copy_err (md, err);
  free (raw);
  pd_msm_free (&md->tm.sm);
  pd_bm_destroy (&md->tm.bm);
  pthread_mutex_destroy (&md->lock);
  free (md);
  return r;
}

void
clone_md_close (struct clone_md *md)
{
  pd_msm_free (&md->tm.sm);
  pd_bm_destroy (&md->tm.bm);
  pthread_mutex_destroy (&md->lock);
  free (md);
}

uint64_t
clone_md_nr_regions (const struct clone_md *md)
{
  return md->nr_regions;
}

int
clone_md_load (struct clone_md *md, uint64_t *words, char *err)
{
  int r = 0;

  pthread_mutex_lock (&md->lock);
  for (uint64_t i = 0; i < md->nr_ablocks && r == 0; i++) {
    struct pd_block *b;
    uint64_t nr;
    uint32_t n = ablock_entries (md, i);

    if ((r = read_ablock (md, i, &nr, &b)) < 0)
      break;
    for (uint32_t j = 0; j < n; j++)
      words[i * WORDS_PER_BLOCK + j] =
        pd_le64 (b->data + AB_HEADER + WORD_SIZE * j);
    pd_tm_put (&md->tm, b);
  }
  if (r == 0 && md->nr_regions % 64) {
    uint64_t last = words[md->nr_words - 1];
    uint64_t past = ~0ull << (md->nr_regions % 64);
    if (last & past)
      r = pd_error (&md->tm.bm, EIO, "region bitset: bits set past the last "
                    "of the %llu regions (word %llu is 0x%016llx)",
                    (unsigned long long) md->nr_regions,
                    (unsigned long long) md->nr_words - 1,
                    (unsigned long long) last);
  }
  if (r < 0)
    copy_err (md, err);
  pthread_mutex_unlock (&md->lock);
  return r;
}

int
clone_md_set_bits (struct clone_md *md, uint64_t w, uint64_t bits, char *err)
{
  uint64_t i = w / WORDS_PER_BLOCK, nr, old;
  uint32_t j = w % WORDS_PER_BLOCK;
  struct pd_block *b;
  bool inc;
  int r;

  pthread_mutex_lock (&md->lock);
  if (md->failed) {
    r = pd_error (&md->tm.bm, EROFS, "clone metadata failed earlier: "
                  "read-only until reloaded");
    goto out;
  }
  if (w >= md->nr_words) {
    r = pd_error (&md->tm.bm, EINVAL, "region bitset: word %llu past the "
                  "last (%llu)", (unsigned long long) w,
                  (unsigned long long) md->nr_words);
    goto out;
  }
  if ((r = read_ablock (md, i, &nr, &b)) < 0)
    goto fail;
  old = pd_le64 (b->data + AB_HEADER + WORD_SIZE * j);
  pd_tm_put (&md->tm, b);
  if ((old | bits) == old)
    goto out;
  /* dm-array's shadow_ablock: copy the block unless this transaction made
   * it, and point the btree at the copy (the old block's reference went
   * with the shadowing, so keep_old).
   */
  if ((r = pd_tm_shadow (&md->tm, nr, PD_ARRAY_BLOCK, &b, &inc)) < 0)
    goto fail;
  pd_put64 (b->data + AB_HEADER + WORD_SIZE * j, old | bits);
  if (b->nr != nr) {
    uint8_t v[8];
    pd_put64 (v, b->nr);
    r = pd_btree_insert (&md->array, &md->root, i, v, true, NULL);
  }
  pd_tm_put (&md->tm, b);
  if (r < 0)
    goto fail;
  md->changed = true;
  goto out;
 fail:
  md->failed = true;
 out:
  if (r < 0)
    copy_err (md, err);
  pthread_mutex_unlock (&md->lock);
  return r;
}

int
clone_md_commit (struct clone_md *md, char *err)
{
  int r = 0;

  pthread_mutex_lock (&md->lock);
  if (md->failed)
    r = pd_error (&md->tm.bm, EROFS, "clone metadata failed earlier: "
                  "read-only until reloaded");
  else if (md->changed)
    r = commit_locked (md);
  if (r < 0)
    copy_err (md, err);
  pthread_mutex_unlock (&md->lock);
  return r;
}

void
clone_md_usage (struct clone_md *md, uint64_t *used, uint64_t *total)
{
  pthread_mutex_lock (&md->lock);
  *used = md->tm.sm.nr_allocated;
  *total = md->tm.sm.nr_blocks;
  pthread_mutex_unlock (&md->lock);
}

bool
clone_md_failed (struct clone_md *md)
{
  bool f;

  pthread_mutex_lock (&md->lock);
  f = md->failed;
  pthread_mutex_unlock (&md->lock);
  return f;
}

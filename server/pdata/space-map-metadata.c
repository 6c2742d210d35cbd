/* SPDX-License-Identifier: BSD-3-Clause */
/* The metadata space map (dm-space-map-metadata.c's on-disk format): the
 * reference count of every metadata block, as 2-bit entries in bitmap
 * blocks listed by one index block (metadata_space_map_root's
 * bitmap_root), counts above 2 in a ref count btree.
 *
 * dm updates these blocks through the transaction manager as it goes and
 * needs a recursion guard because changing the space map allocates from
 * it.  We keep the counts in memory instead (4 bytes per metadata block:
 * 1 MiB for a 1 GiB metadata device) and write them out at commit, when
 * the only blocks still to place are the space map's own: the ref count
 * tree is rebuilt when a count above 2 changed, every bitmap whose
 * entries changed moves to a new block (the last commit's copy must
 * survive until the new superblock is down), and so does the index.
 * Placing those changes other entries, so placement loops until no
 * changed bitmap is left unplaced (at most one round per bitmap).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pdata.h"

#define BIT_TEST(bits, b) ((bits)[(b) >> 3] & (1u << ((b) & 7)))
#define BIT_SET(bits, b) ((bits)[(b) >> 3] |= (uint8_t) (1u << ((b) & 7)))

static unsigned
entry_of (uint32_t count)
{
  return count > 3 ? 3 : count;
}

static void
set_count (struct pd_msm *sm, uint64_t b, uint32_t v)
{
  uint32_t old = sm->count[b];

  sm->count[b] = v;
  if (entry_of (old) != entry_of (v))
    sm->bitmap_dirty[b / PD_ENTRIES_PER_BITMAP] = 1;
  if (old > 2 || v > 2)
    sm->rc_dirty = true;
  if (old == 0 && v)
    sm->nr_allocated++;
  else if (old && v == 0) {
    sm->nr_allocated--;
    BIT_SET (sm->freed_bits, b);
    sm->nr_freed++;
  }
}

static int
alloc_arrays (struct pd_msm *sm, uint64_t nr_blocks)
{
  size_t bytes = (nr_blocks + 7) / 8;
  uint32_t *c = realloc (sm->count, nr_blocks * sizeof *c);
  uint8_t *n, *f;

  if (!c)
    return -ENOMEM;
  sm->count = c;
  n = realloc (sm->new_bits, bytes);
  if (!n)
    return -ENOMEM;
  sm->new_bits = n;
  f = realloc (sm->freed_bits, bytes);
  if (!f)
    return -ENOMEM;
  sm->freed_bits = f;
  if (nr_blocks > sm->nr_blocks) {
    size_t old_bytes = (sm->nr_blocks + 7) / 8;
    memset (c + sm->nr_blocks, 0,
            (nr_blocks - sm->nr_blocks) * sizeof *c);
    memset (n + old_bytes, 0, bytes - old_bytes);
    memset (f + old_bytes, 0, bytes - old_bytes);
    /* the partial byte at the old end was already zero past it */
  }
  return 0;
}

void
pd_msm_free (struct pd_msm *sm)
{
  free (sm->count);
  free (sm->new_bits);
  free (sm->freed_bits);
  free (sm->rc_blocks);
  memset (sm, 0, sizeof *sm);
}

int
pd_msm_extend (struct pd_tm *tm, uint64_t nr_blocks)
{
  struct pd_msm *sm = &tm->sm;
  uint64_t nb;
  int r;

  if (nr_blocks > PD_MAX_METADATA_BLOCKS)
    nr_blocks = PD_MAX_METADATA_BLOCKS;
  if (nr_blocks <= sm->nr_blocks)
    return 0;
  r = alloc_arrays (sm, nr_blocks);
  if (r < 0)
    return pd_error (&tm->bm, -r, "metadata space map: out of memory");
  /* The old last bitmap gains entries; new bitmaps are placed at commit. */
  if (sm->nr_blocks)
    sm->bitmap_dirty[(sm->nr_blocks - 1) / PD_ENTRIES_PER_BITMAP] = 1;
  nb = (nr_blocks + PD_ENTRIES_PER_BITMAP - 1) / PD_ENTRIES_PER_BITMAP;
  for (uint64_t i = sm->nr_bitmaps; i < nb; i++) {
    sm->bitmap_dirty[i] = 1;
    sm->index[i].blocknr = 0;
  }
  sm->nr_bitmaps = nb;
  sm->nr_blocks = nr_blocks;
  return 0;
}

int
pd_msm_format (struct pd_tm *tm, uint64_t nr_blocks)
{
  int r;

  pd_msm_free (&tm->sm);
  r = pd_msm_extend (tm, nr_blocks);
  if (r < 0)
    return r;
  set_count (&tm->sm, 0, 1);               /* the superblock */
  tm->sm.cursor = 1;
  tm->sm.rc_dirty = true;                  /* no tree yet: make one */
  return 0;
}

static int
load_rc (void *opaque, uint64_t key, const uint8_t *v)
{
  struct pd_tm *tm = opaque;
  uint32_t c = pd_le32 (v);

  if (key >= tm->sm.nr_blocks || tm->sm.count[key] != UINT32_MAX || c < 3)
    return pd_error (&tm->bm, EIO, "metadata space map: ref count tree "
                     "entry for block %llu (count %u) does not match its "
                     "bitmap", (unsigned long long) key, c);
  tm->sm.count[key] = c;
  return 0;
}

static int
note_rc_block (void *opaque, uint64_t b)
{
  struct pd_msm *sm = opaque;
  uint64_t *p = realloc (sm->rc_blocks, (sm->nr_rc_blocks + 1) * sizeof *p);

  if (!p)
    return -ENOMEM;
  sm->rc_blocks = p;
  p[sm->nr_rc_blocks++] = b;
  return 0;
}

static const struct pd_value_type rc_type = {
  .size = 4, .name = "metadata ref count tree",
};

int
pd_msm_open (struct pd_tm *tm, const uint8_t *root, uint64_t dev_blocks)
{
  struct pd_msm *sm = &tm->sm;
  struct pd_btree rc = { .tm = tm, .vt = &rc_type };
  uint64_t nr_blocks = pd_le64 (root);
  struct pd_block *blk;
  int r;

  pd_msm_free (sm);
  if (nr_blocks == 0 || nr_blocks > dev_blocks ||
      nr_blocks > PD_MAX_METADATA_BLOCKS)
    return pd_error (&tm->bm, EIO, "metadata space map: %llu blocks, the "
                     "device has %llu", (unsigned long long) nr_blocks,
                     (unsigned long long) dev_blocks);
  r = alloc_arrays (sm, nr_blocks);
  if (r < 0)
    return pd_error (&tm->bm, -r, "metadata space map: out of memory");
  sm->nr_blocks = nr_blocks;
  sm->nr_bitmaps = (nr_blocks + PD_ENTRIES_PER_BITMAP - 1) /
    PD_ENTRIES_PER_BITMAP;
  sm->index_block = pd_le64 (root + 16);
  sm->rc_root = pd_le64 (root + 24);

  r = pd_bm_read (&tm->bm, sm->index_block, PD_INDEX, &blk);
  if (r < 0)
    goto err;
  for (uint64_t i = 0; i < sm->nr_bitmaps; i++) {
    const uint8_t *e = blk->data + 16 + 16 * i;
    sm->index[i].blocknr = pd_le64 (e);
    sm->index[i].nr_free = pd_le32 (e + 8);
    sm->index[i].none_free_before = pd_le32 (e + 12);
  }
  pd_bm_put (&tm->bm, blk);

  for (uint64_t i = 0; i < sm->nr_bitmaps; i++) {
    uint64_t first = i * PD_ENTRIES_PER_BITMAP;
    uint64_t n = nr_blocks - first;
    if (n > PD_ENTRIES_PER_BITMAP)
      n = PD_ENTRIES_PER_BITMAP;
    r = pd_bm_read (&tm->bm, sm->index[i].blocknr, PD_BITMAP, &blk);
    if (r < 0)
      goto err;
    for (uint64_t j = 0; j < n; j++) {
      uint8_t byte = blk->data[PD_BITMAP_HEADER + j / 4];
      unsigned sh = (j % 4) * 2;
      unsigned v = ((byte >> sh) & 1) << 1 | ((byte >> (sh + 1)) & 1);
      sm->count[first + j] = v == 3 ? UINT32_MAX : v;
      if (v)
        sm->nr_allocated++;
    }
    pd_bm_put (&tm->bm, blk);
  }
  r = pd_btree_walk_nodes (&rc, sm->rc_root, load_rc, note_rc_block, tm, sm);
  if (r < 0)
    goto err;
  for (uint64_t b = 0; b < nr_blocks; b++)
    if (sm->count[b] == UINT32_MAX) {
      r = pd_error (&tm->bm, EIO, "metadata space map: block %llu has "
                    "count 3+ in its bitmap but no ref count tree entry",
                    (unsigned long long) b);
      goto err;
    }
  sm->cursor = 1;
  return 0;
 err:
  if (r == -ENOMEM)
    pd_error (&tm->bm, ENOMEM, "metadata space map: out of memory");
  pd_msm_free (sm);
  return r;
}

static int
msm_alloc (struct pd_tm *tm, uint64_t *out)
{
  struct pd_msm *sm = &tm->sm;

  for (int pass = 0; pass < 2; pass++) {
    uint64_t from = pass ? 1 : sm->cursor, to = pass ? sm->cursor : sm->nr_blocks;
    for (uint64_t b = from; b < to; b++)
      if (sm->count[b] == 0 && !BIT_TEST (sm->freed_bits, b)) {
        set_count (sm, b, 1);
        BIT_SET (sm->new_bits, b);
        sm->cursor = b + 1;
        *out = b;
        return 0;
      }
  }
  return pd_error (&tm->bm, ENOSPC, "metadata device full (%llu blocks)",
                   (unsigned long long) sm->nr_blocks);
}

uint32_t
pd_tm_count (struct pd_tm *tm, uint64_t b)
{
  return b < tm->sm.nr_blocks ? tm->sm.count[b] : 0;
}

int
pd_tm_inc (struct pd_tm *tm, uint64_t b)
{
  if (b >= tm->sm.nr_blocks || tm->sm.count[b] == 0 ||
      tm->sm.count[b] == UINT32_MAX - 1)
    return pd_error (&tm->bm, EIO, "metadata block %llu: reference to a "
                     "block that is %s", (unsigned long long) b,
                     b >= tm->sm.nr_blocks ? "beyond the space map" :
                     tm->sm.count[b] ? "referenced too often" : "free");
  set_count (&tm->sm, b, tm->sm.count[b] + 1);
  return 0;
}

int
pd_tm_dec (struct pd_tm *tm, uint64_t b)
{
  if (b >= tm->sm.nr_blocks || tm->sm.count[b] == 0)
    return pd_error (&tm->bm, EIO, "metadata block %llu: released but %s",
                     (unsigned long long) b,
                     b >= tm->sm.nr_blocks ? "beyond the space map" :
                     "already free");
  set_count (&tm->sm, b, tm->sm.count[b] - 1);
  return 0;
}

int
pd_tm_new_block (struct pd_tm *tm, enum pd_block_type type,
                 struct pd_block **out)
{
  uint64_t b;
  int r = msm_alloc (tm, &b);

  if (r < 0)
    return r;
  r = pd_bm_new (&tm->bm, b, type, out);
  if (r < 0) {
    set_count (&tm->sm, b, 0);
    return pd_error (&tm->bm, -r, "metadata block cache: out of memory");
  }
  return 0;
}

int
pd_tm_read (struct pd_tm *tm, uint64_t b, enum pd_block_type type,
            struct pd_block **out)
{
  return pd_bm_read (&tm->bm, b, type, out);
}

void
pd_tm_put (struct pd_tm *tm, struct pd_block *blk)
{
  pd_bm_put (&tm->bm, blk);
}

int
pd_tm_shadow (struct pd_tm *tm, uint64_t b, enum pd_block_type type,
              struct pd_block **out, bool *inc)
{
  struct pd_block *orig, *copy;
  uint32_t c = pd_tm_count (tm, b);
  int r;

  if (c == 0)
    return pd_error (&tm->bm, EIO, "metadata block %llu: in use but free in "
                     "the space map", (unsigned long long) b);
  r = pd_tm_read (tm, b, type, &orig);
  if (r < 0)
    return r;
  if (c == 1 && BIT_TEST (tm->sm.new_bits, b)) {
    pd_bm_dirty (&tm->bm, orig);
    *inc = false;
    *out = orig;
    return 0;
  }
  r = pd_tm_new_block (tm, type, &copy);
  if (r < 0) {
    pd_tm_put (tm, orig);
    return r;
  }
  memcpy (copy->data, orig->data, PD_BLOCK_SIZE);
  pd_put64 (copy->data + pd_blocknr_offset (type), copy->nr);
  pd_tm_put (tm, orig);
  *inc = c > 1;
  r = pd_tm_dec (tm, b);
  if (r < 0) {
    pd_tm_put (tm, copy);
    return r;
  }
  *out = copy;
  return 0;
}

void
pd_tm_end_transaction (struct pd_tm *tm)
{
  size_t bytes = (tm->sm.nr_blocks + 7) / 8;

  memset (tm->sm.new_bits, 0, bytes);
  memset (tm->sm.freed_bits, 0, bytes);
  tm->sm.nr_freed = 0;
}

int
pd_tm_commit (struct pd_tm *tm, enum pd_block_type type, const uint8_t *sb,
              uint8_t *committed)
{
  struct pd_block *b;
  int r;

  if ((r = pd_bm_flush (&tm->bm)) < 0)
    return r;
  if ((r = pd_bm_new (&tm->bm, 0, type, &b)) < 0)
    return pd_error (&tm->bm, -r, "superblock: out of memory");
  memcpy (b->data, sb, PD_BLOCK_SIZE);
  r = pd_bm_write_sync (&tm->bm, b);
  if (r == 0 && committed)
    memcpy (committed, b->data, PD_BLOCK_SIZE);
  pd_bm_put (&tm->bm, b);
  if (r == 0)
    pd_tm_end_transaction (tm);
  return r;
}

uint64_t
pd_tm_available (struct pd_tm *tm)
{
  return tm->sm.nr_blocks - tm->sm.nr_allocated - tm->sm.nr_freed;
}

static void
write_bitmap (struct pd_msm *sm, uint64_t i, uint8_t *data)
{
  uint64_t first = i * PD_ENTRIES_PER_BITMAP, n = sm->nr_blocks - first;
  uint32_t nr_free = 0, nfb = UINT32_MAX;

  if (n > PD_ENTRIES_PER_BITMAP)
    n = PD_ENTRIES_PER_BITMAP;
  for (uint64_t j = 0; j < n; j++) {
    unsigned v = entry_of (sm->count[first + j]);
    unsigned sh = (j % 4) * 2;
    /* bit 2j is the high bit of entry j, bit 2j+1 the low one */
    data[PD_BITMAP_HEADER + j / 4] |=
      (uint8_t) ((((v >> 1) & 1) << sh) | ((v & 1) << (sh + 1)));
    if (v == 0) {
      nr_free++;
      if (nfb == UINT32_MAX)
        nfb = (uint32_t) j;
    }
  }
  sm->index[i].nr_free = nr_free;
  sm->index[i].none_free_before = nfb == UINT32_MAX ? (uint32_t) n : nfb;
}

int
pd_msm_commit (struct pd_tm *tm, uint8_t *root)
{
  struct pd_msm *sm = &tm->sm;
  uint8_t placed[PD_MAX_METADATA_BITMAPS] = { 0 };
  struct pd_block *blk;
  uint64_t b;
  bool more;
  int r;

  if (sm->rc_dirty) {
    uint64_t *keys = NULL, *blocks;
    uint8_t *values = NULL;
    size_t n = 0, cap = 0, nr_blocks;

    for (size_t i = 0; i < sm->nr_rc_blocks; i++)
      if ((r = pd_tm_dec (tm, sm->rc_blocks[i])) < 0)
        return r;
    for (b = 0; b < sm->nr_blocks; b++) {
      if (sm->count[b] <= 2)
        continue;
      if (n == cap) {
        uint64_t *k;
        uint8_t *v;
        cap = cap ? 2 * cap : 256;
        k = realloc (keys, cap * sizeof *keys);
        v = k ? realloc (values, cap * 4) : NULL;
        if (k)
          keys = k;
        if (!v) {
          free (keys);
          free (values);
          return pd_error (&tm->bm, ENOMEM, "metadata space map: out of "
                           "memory");
        }
        values = v;
      }
      keys[n] = b;
      pd_put32 (values + 4 * n, sm->count[b]);
      n++;
    }
    r = pd_btree_build (tm, 4, keys, values, n, &sm->rc_root, &blocks,
                        &nr_blocks);
    free (keys);
    free (values);
    if (r < 0)
      return r;
    free (sm->rc_blocks);
    sm->rc_blocks = blocks;
    sm->nr_rc_blocks = nr_blocks;
    sm->rc_dirty = false;
  }

  if ((r = msm_alloc (tm, &b)) < 0)
    return r;
  if (sm->index_block && (r = pd_tm_dec (tm, sm->index_block)) < 0)
    return r;
  sm->index_block = b;

  do {
    more = false;
    for (uint64_t i = 0; i < sm->nr_bitmaps; i++) {
      if (!sm->bitmap_dirty[i] || placed[i])
        continue;
      if ((r = msm_alloc (tm, &b)) < 0)
        return r;
      if (sm->index[i].blocknr && (r = pd_tm_dec (tm, sm->index[i].blocknr)) < 0)
        return r;
      sm->index[i].blocknr = b;
      placed[i] = 1;
      more = true;
    }
  } while (more);
  /* Placing changed no count above 2: the ref count tree stands. */

  for (uint64_t i = 0; i < sm->nr_bitmaps; i++) {
    if (!placed[i])
      continue;
    r = pd_bm_new (&tm->bm, sm->index[i].blocknr, PD_BITMAP, &blk);
    if (r < 0)
      return pd_error (&tm->bm, -r, "metadata block cache: out of memory");
    write_bitmap (sm, i, blk->data);
    pd_bm_put (&tm->bm, blk);
    sm->bitmap_dirty[i] = 0;
  }
  r = pd_bm_new (&tm->bm, sm->index_block, PD_INDEX, &blk);
  if (r < 0)
    return pd_error (&tm->bm, -r, "metadata block cache: out of memory");
  for (uint64_t i = 0; i < sm->nr_bitmaps; i++) {
    uint8_t *e = blk->data + 16 + 16 * i;
    pd_put64 (e, sm->index[i].blocknr);
    pd_put32 (e + 8, sm->index[i].nr_free);
    pd_put32 (e + 12, sm->index[i].none_free_before);
  }
  pd_bm_put (&tm->bm, blk);

  memset (root, 0, PD_SM_ROOT_SIZE);
  pd_put64 (root, sm->nr_blocks);
  pd_put64 (root + 8, sm->nr_allocated);
  pd_put64 (root + 16, sm->index_block);
  pd_put64 (root + 24, sm->rc_root);
  return 0;
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* The data space map (dm-space-map-disk.c over dm-space-map-common.c):
 * 2-bit counts of data blocks in bitmap blocks, an index btree (bitmap
 * number -> block, free entries, none free before), counts above 2 in a
 * ref count btree; all of it metadata blocks changed through the
 * transaction manager, so a commit is only the root in the superblock.
 * A block freed in this transaction is not handed out again before the
 * commit (its data may still be what the last commit maps): an
 * allocation must find the block free in the last commit's bitmaps too.
 */
#include <errno.h>
#include <string.h>

#include "pdata.h"

static const struct pd_value_type index_type = {
  .size = 16, .name = "data space map index",
};
static const struct pd_value_type rc_type = {
  .size = 4, .name = "data space map ref count tree",
};

#define EPB PD_ENTRIES_PER_BITMAP

static unsigned
get_entry (const uint8_t *data, uint64_t j)
{
  uint8_t byte = data[PD_BITMAP_HEADER + j / 4];
  unsigned sh = (j % 4) * 2;

  return ((byte >> sh) & 1) << 1 | ((byte >> (sh + 1)) & 1);
}

static void
set_entry (uint8_t *data, uint64_t j, unsigned v)
{
  uint8_t *byte = &data[PD_BITMAP_HEADER + j / 4];
  unsigned sh = (j % 4) * 2;

  *byte = (uint8_t) ((*byte & ~(3u << sh)) |
                     ((v >> 1) & 1) << sh | (v & 1) << (sh + 1));
}

static void
decode_ie (const uint8_t *v, struct pd_index_entry *ie)
{
  ie->blocknr = pd_le64 (v);
  ie->nr_free = pd_le32 (v + 8);
  ie->none_free_before = pd_le32 (v + 12);
}

static void
encode_ie (uint8_t *v, const struct pd_index_entry *ie)
{
  pd_put64 (v, ie->blocknr);
  pd_put32 (v + 8, ie->nr_free);
  pd_put32 (v + 12, ie->none_free_before);
}

static int
load_ie (struct pd_dsm *sm, uint64_t root, uint64_t i,
         struct pd_index_entry *ie)
{
  struct pd_btree t = { .tm = sm->tm, .vt = &index_type };
  uint8_t v[16];
  int r = pd_btree_lookup (&t, root, i, v);

  if (r == -ENODATA)
    return pd_error (&sm->tm->bm, EIO, "data space map: no index entry for "
                     "bitmap %llu", (unsigned long long) i);
  if (r < 0)
    return r;
  decode_ie (v, ie);
  return 0;
}

static int
save_ie (struct pd_dsm *sm, uint64_t i, const struct pd_index_entry *ie)
{
  struct pd_btree t = { .tm = sm->tm, .vt = &index_type };
  uint8_t v[16];

  encode_ie (v, ie);
  return pd_btree_insert (&t, &sm->index_root, i, v, false, NULL);
}

static uint64_t
entries_in (uint64_t nr_blocks, uint64_t i)
{
  uint64_t n = nr_blocks - i * EPB;

  return n > EPB ? EPB : n;
}

int
pd_dsm_extend (struct pd_dsm *sm, uint64_t nr_blocks)
{
  uint64_t old_bitmaps = (sm->nr_blocks + EPB - 1) / EPB;
  uint64_t new_bitmaps = (nr_blocks + EPB - 1) / EPB;
  struct pd_index_entry ie;
  int r;

  if (nr_blocks <= sm->nr_blocks)
    return 0;
  if (old_bitmaps && sm->nr_blocks % EPB) {
    /* the last bitmap gains entries */
    uint64_t i = old_bitmaps - 1;
    if ((r = load_ie (sm, sm->index_root, i, &ie)) < 0)
      return r;
    ie.nr_free += (uint32_t) (entries_in (nr_blocks, i) -
                              entries_in (sm->nr_blocks, i));
    if ((r = save_ie (sm, i, &ie)) < 0)
      return r;
  }
  for (uint64_t i = old_bitmaps; i < new_bitmaps; i++) {
    struct pd_block *blk;
    if ((r = pd_tm_new_block (sm->tm, PD_BITMAP, &blk)) < 0)
      return r;
    ie.blocknr = blk->nr;
    ie.nr_free = (uint32_t) entries_in (nr_blocks, i);
    ie.none_free_before = 0;
    pd_tm_put (sm->tm, blk);
    if ((r = save_ie (sm, i, &ie)) < 0)
      return r;
  }
  sm->nr_blocks = nr_blocks;
  return 0;
}

int
pd_dsm_format (struct pd_dsm *sm, struct pd_tm *tm, uint64_t nr_blocks)
{
  struct pd_btree it = { .tm = tm, .vt = &index_type };
  struct pd_btree rt = { .tm = tm, .vt = &rc_type };
  int r;

  memset (sm, 0, sizeof *sm);
  sm->tm = tm;
  if ((r = pd_btree_empty (&it, &sm->index_root)) < 0 ||
      (r = pd_btree_empty (&rt, &sm->rc_root)) < 0)
    return r;
  return pd_dsm_extend (sm, nr_blocks);
}

int
pd_dsm_open (struct pd_dsm *sm, struct pd_tm *tm, const uint8_t *root)
{
  memset (sm, 0, sizeof *sm);
  sm->tm = tm;
  sm->nr_blocks = pd_le64 (root);
  sm->nr_allocated = pd_le64 (root + 8);
  sm->index_root = pd_le64 (root + 16);
  sm->rc_root = pd_le64 (root + 24);
  if (sm->nr_allocated > sm->nr_blocks)
    return pd_error (&tm->bm, EIO, "data space map: %llu blocks allocated "
                     "out of %llu", (unsigned long long) sm->nr_allocated,
                     (unsigned long long) sm->nr_blocks);
  pd_dsm_committed (sm);
  return 0;
}

void
pd_dsm_root (struct pd_dsm *sm, uint8_t *root)
{
  memset (root, 0, PD_SM_ROOT_SIZE);
  pd_put64 (root, sm->nr_blocks);
  pd_put64 (root + 8, sm->nr_allocated);
  pd_put64 (root + 16, sm->index_root);
  pd_put64 (root + 24, sm->rc_root);
}

void
pd_dsm_committed (struct pd_dsm *sm)
{
  sm->old_index_root = sm->index_root;
  sm->old_nr_blocks = sm->nr_blocks;
}

static int
check_block (struct pd_dsm *sm, uint64_t b)
{
  if (b >= sm->nr_blocks)
    return pd_error (&sm->tm->bm, EIO, "data block %llu: beyond the data "
                     "space map (%llu blocks)", (unsigned long long) b,
                     (unsigned long long) sm->nr_blocks);
  return 0;
}

static int
count_in (struct pd_dsm *sm, uint64_t index_root, uint64_t b,
          uint64_t *bitmap, uint32_t *count)
{
  struct pd_btree rt = { .tm = sm->tm, .vt = &rc_type };
  struct pd_index_entry ie;
  struct pd_block *blk;
  uint8_t v[4];
  unsigned e;
  int r;

  if ((r = load_ie (sm, index_root, b / EPB, &ie)) < 0)
    return r;
  if (bitmap)
    *bitmap = ie.blocknr;
  if ((r = pd_tm_read (sm->tm, ie.blocknr, PD_BITMAP, &blk)) < 0)
    return r;
  e = get_entry (blk->data, b % EPB);
  pd_tm_put (sm->tm, blk);
  if (e < 3) {
    *count = e;
    return 0;
  }
  r = pd_btree_lookup (&rt, sm->rc_root, b, v);
  if (r == -ENODATA)
    return pd_error (&sm->tm->bm, EIO, "data space map: block %llu has "
                     "count 3+ but no ref count tree entry",
                     (unsigned long long) b);
  if (r < 0)
    return r;
  *count = pd_le32 (v);
  return 0;
}

int
pd_dsm_count (struct pd_dsm *sm, uint64_t b, uint32_t *count)
{
  int r = check_block (sm, b);

  return r < 0 ? r : count_in (sm, sm->index_root, b, NULL, count);
}

static int
set_count (struct pd_dsm *sm, uint64_t b, uint32_t old, uint32_t v)
{
  struct pd_btree rt = { .tm = sm->tm, .vt = &rc_type };
  struct pd_index_entry ie;
  struct pd_block *blk;
  uint64_t j = b % EPB;
  uint8_t rv[4];
  bool inc;
  int r;

  if ((r = load_ie (sm, sm->index_root, b / EPB, &ie)) < 0)
    return r;
  if ((r = pd_tm_shadow (sm->tm, ie.blocknr, PD_BITMAP, &blk, &inc)) < 0)
    return r;
  set_entry (blk->data, j, v > 3 ? 3 : v);
  ie.blocknr = blk->nr;
  pd_tm_put (sm->tm, blk);
  if (v > 2) {
    pd_put32 (rv, v);
    if ((r = pd_btree_insert (&rt, &sm->rc_root, b, rv, false, NULL)) < 0)
      return r;
  }
  else if (old > 2 &&
           (r = pd_btree_remove (&rt, &sm->rc_root, b)) < 0)
    return r;
  if (old == 0 && v) {
    ie.nr_free--;
    sm->nr_allocated++;
    if (ie.none_free_before == j)
      ie.none_free_before = (uint32_t) j + 1;
  }
  else if (old && v == 0) {
    ie.nr_free++;
    sm->nr_allocated--;
    if (j < ie.none_free_before)
      ie.none_free_before = (uint32_t) j;
  }
  return save_ie (sm, b / EPB, &ie);
}

/* One reference more (+1) or less (-1). */
static int
change_count (struct pd_dsm *sm, uint64_t b, int delta)
{
  uint32_t c;
  int r = pd_dsm_count (sm, b, &c);

  if (r < 0)
    return r;
  if (delta > 0 ? c == UINT32_MAX : c == 0)
    return pd_error (&sm->tm->bm, EIO, "data block %llu: %s",
                     (unsigned long long) b, delta > 0 ?
                     "reference count overflow" : "released but already free");
  return set_count (sm, b, c, delta > 0 ? c + 1 : c - 1);
}

int
pd_dsm_inc (struct pd_dsm *sm, uint64_t b)
{
  return change_count (sm, b, 1);
}

int
pd_dsm_dec (struct pd_dsm *sm, uint64_t b)
{
  return change_count (sm, b, -1);
}

/* Free now and at the last commit?  (A bitmap not shadowed since then
 * is the last commit's.)
 */
static int
free_before (struct pd_dsm *sm, uint64_t b, uint64_t bitmap_now, bool *ok)
{
  struct pd_index_entry ie;
  struct pd_block *blk;
  int r;

  *ok = true;
  if (b >= sm->old_nr_blocks)
    return 0;
  if ((r = load_ie (sm, sm->old_index_root, b / EPB, &ie)) < 0)
    return r;
  if (ie.blocknr == bitmap_now)
    return 0;
  if ((r = pd_tm_read (sm->tm, ie.blocknr, PD_BITMAP, &blk)) < 0)
    return r;
  *ok = get_entry (blk->data, b % EPB) == 0;
  pd_tm_put (sm->tm, blk);
  return 0;
}

int
pd_dsm_new_block (struct pd_dsm *sm, uint64_t *out)
{
  uint64_t nr_bitmaps = (sm->nr_blocks + EPB - 1) / EPB;
  uint64_t start = sm->cursor < sm->nr_blocks ? sm->cursor : 0;
  int r;

  if (nr_bitmaps == 0)
    return -ENOSPC;               /* a data device of no whole block */

  for (uint64_t k = 0; k <= nr_bitmaps; k++) {
    uint64_t i = (start / EPB + k) % nr_bitmaps;
    uint64_t from = 0, n = entries_in (sm->nr_blocks, i);
    struct pd_index_entry ie;
    struct pd_block *blk;

    if ((r = load_ie (sm, sm->index_root, i, &ie)) < 0)
      return r;
    if (ie.nr_free == 0)
      continue;
    if (k == 0)
      from = start % EPB;
    if (from < ie.none_free_before)
      from = ie.none_free_before;
    if (k == nr_bitmaps)          /* back at the start: the part before */
      n = start % EPB;
    if ((r = pd_tm_read (sm->tm, ie.blocknr, PD_BITMAP, &blk)) < 0)
      return r;
    for (uint64_t j = from; j < n; j++) {
      uint64_t b = i * EPB + j;
      bool ok;
      if (get_entry (blk->data, j))
        continue;
      if ((r = free_before (sm, b, ie.blocknr, &ok)) < 0) {
        pd_tm_put (sm->tm, blk);
        return r;
      }
      if (!ok)
        continue;
      pd_tm_put (sm->tm, blk);
      if ((r = set_count (sm, b, 0, 1)) < 0)
        return r;
      sm->cursor = b + 1;
      *out = b;
      return 0;
    }
    pd_tm_put (sm->tm, blk);
  }
  return -ENOSPC;
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* The block manager (dm-block-manager.c): 4 KiB metadata blocks over a
 * struct pd_blockdev, through a cache bounded to cache_blocks entries
 * (LRU among the unpinned ones; a caller holding more pins than that
 * overflows it briefly rather than fail).  Every block read from the
 * device is validated for the type the caller expects: checksum with the
 * type's salt, its own block number, and for btree nodes a header that
 * cannot lead an access out of the block.  Dirty blocks are checksummed
 * when written; a dirty block is never one of the last commit (the
 * transaction manager shadows those), so eviction may write it early.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdata.h"

static const uint32_t type_xor[PD_NR_TYPES] = {
  [PD_SUPERBLOCK] = PD_SUPERBLOCK_CSUM_XOR,
  [PD_BTREE_NODE] = PD_BTREE_CSUM_XOR,
  [PD_BITMAP] = PD_BITMAP_CSUM_XOR,
  [PD_INDEX] = PD_INDEX_CSUM_XOR,
  [PD_CLONE_SUPERBLOCK] = PD_CLONE_SUPERBLOCK_CSUM_XOR,
  [PD_ARRAY_BLOCK] = PD_ARRAY_CSUM_XOR,
};
static const char *const type_name[PD_NR_TYPES] = {
  [PD_SUPERBLOCK] = "superblock",
  [PD_BTREE_NODE] = "btree node",
  [PD_BITMAP] = "space map bitmap",
  [PD_INDEX] = "space map index",
  [PD_CLONE_SUPERBLOCK] = "superblock",
  [PD_ARRAY_BLOCK] = "array block",
};

int
pd_error (struct pd_bm *bm, int e, const char *fmt, ...)
{
  va_list ap;

  pthread_mutex_lock (&bm->err_lock);
  va_start (ap, fmt);
  vsnprintf (bm->err, sizeof bm->err, fmt, ap);
  va_end (ap);
  pthread_mutex_unlock (&bm->err_lock);
  return -e;
}

int
pd_validate (struct pd_bm *bm, uint64_t nr, const uint8_t *data,
             enum pd_block_type type)
{
  uint32_t csum = pd_checksum (data + 4, PD_BLOCK_SIZE - 4, type_xor[type]);

  if (csum != pd_le32 (data))
    return pd_error (bm, EIO, "metadata block %llu (%s): checksum mismatch "
                     "(0x%08x on disk, 0x%08x computed)",
                     (unsigned long long) nr, type_name[type],
                     pd_le32 (data), csum);
  if (pd_le64 (data + pd_blocknr_offset (type)) != nr)
    return pd_error (bm, EIO, "metadata block %llu (%s): block number field "
                     "says %llu", (unsigned long long) nr, type_name[type],
                     (unsigned long long)
                     pd_le64 (data + pd_blocknr_offset (type)));
  if (type == PD_BTREE_NODE) {
    uint32_t flags = pd_le32 (data + 4), n = pd_le32 (data + 16);
    uint32_t max = pd_le32 (data + 20), vs = pd_le32 (data + 24);
    const uint8_t *keys = data + PD_NODE_HEADER;

    if (flags != PD_INTERNAL_NODE && flags != PD_LEAF_NODE)
      return pd_error (bm, EIO, "metadata block %llu (btree node): flags %u "
                       "neither internal nor leaf", (unsigned long long) nr,
                       flags);
    if (vs == 0 || vs > PD_BLOCK_SIZE || max == 0 || max % 3 != 0 ||
        PD_NODE_HEADER + (uint64_t) (8 + vs) * max > PD_BLOCK_SIZE)
      return pd_error (bm, EIO, "metadata block %llu (btree node): "
                       "max_entries %u with value size %u does not fit",
                       (unsigned long long) nr, max, vs);
    if (n > max)
      return pd_error (bm, EIO, "metadata block %llu (btree node): "
                       "nr_entries %u > max_entries %u",
                       (unsigned long long) nr, n, max);
    for (uint32_t i = 1; i < n; i++)
      if (pd_le64 (keys + 8 * i) <= pd_le64 (keys + 8 * (i - 1)))
        return pd_error (bm, EIO, "metadata block %llu (btree node): keys "
                         "out of order at entry %u",
                         (unsigned long long) nr, i);
  }
  return 0;
}

int
pd_bm_init (struct pd_bm *bm, const struct pd_blockdev *dev,
            size_t cache_blocks, bool read_only)
{
  size_t h = 64;

  memset (bm, 0, sizeof *bm);
  bm->dev = dev;
  bm->nr_blocks = dev->size / PD_BLOCK_SIZE;
  bm->read_only = read_only;
  /* A btree operation pins a path and a few siblings per tree it
   * touches (mapping, data space map): below this the bound would be
   * overflowed on every operation.
   */
  bm->max_cached = cache_blocks < 64 ? 64 : cache_blocks;
  while (h < 2 * bm->max_cached)
    h <<= 1;
  bm->hash = calloc (h, sizeof *bm->hash);
  if (!bm->hash)
    return -ENOMEM;
  bm->hash_mask = h - 1;
  bm->lru.next = bm->lru.prev = &bm->lru;
  pthread_mutex_init (&bm->lock, NULL);
  pthread_mutex_init (&bm->err_lock, NULL);
  return 0;
}

static size_t
hash_of (struct pd_bm *bm, uint64_t nr)
{
  return (nr * 0x9e3779b97f4a7c15ull >> 20) & bm->hash_mask;
}

static void
lru_unlink (struct pd_block *b)
{
  b->prev->next = b->next;
  b->next->prev = b->prev;
  b->prev = b->next = NULL;
}

static void
lru_append (struct pd_bm *bm, struct pd_block *b)
{
  b->prev = bm->lru.prev;
  b->next = &bm->lru;
  bm->lru.prev->next = b;
  bm->lru.prev = b;
}

static void
hash_unlink (struct pd_bm *bm, struct pd_block *b)
{
  struct pd_block **p = &bm->hash[hash_of (bm, b->nr)];

  while (*p != b)
    p = &(*p)->hnext;
  *p = b->hnext;
}

static struct pd_block *
lookup (struct pd_bm *bm, uint64_t nr)
{
  struct pd_block *b;

  for (b = bm->hash[hash_of (bm, nr)]; b; b = b->hnext)
    if (b->nr == nr)
      return b;
  return NULL;
}

/* Checksum and write one block (lock held). */
static int
write_block (struct pd_bm *bm, struct pd_block *b)
{
  int r;

  if (bm->read_only)
    return pd_error (bm, EROFS, "metadata block %llu: write to read-only "
                     "metadata", (unsigned long long) b->nr);
  pd_put64 (b->data + pd_blocknr_offset (b->type), b->nr);
  pd_put32 (b->data, pd_checksum (b->data + 4, PD_BLOCK_SIZE - 4,
                                  type_xor[b->type]));
  r = bm->dev->ops->write (bm->dev->opaque, b->nr * PD_BLOCK_SIZE,
                           PD_BLOCK_SIZE, b->data);
  if (r < 0) {
    atomic_store (&bm->io_failed, true);
    return pd_error (bm, -r, "metadata block %llu: write failed: %s",
                     (unsigned long long) b->nr, strerror (-r));
  }
  b->dirty = false;
  bm->nr_dirty--;
  return 0;
}

/* Block buffers come 16 to an aligned 64 KiB chunk: one aligned_alloc
 * per 4 KiB block costs glibc about as much again in padding.
 */
#define BUFS_PER_CHUNK 16

static uint8_t *
get_buf (struct pd_bm *bm)
{
  uint8_t *buf;

  if (!bm->free_bufs) {
    void **chunks = realloc (bm->chunks, (bm->nr_chunks + 1) * sizeof *chunks);
    uint8_t *c;

    if (!chunks)
      return NULL;
    bm->chunks = chunks;
    c = aligned_alloc (PD_BLOCK_SIZE, BUFS_PER_CHUNK * PD_BLOCK_SIZE);
    if (!c)
      return NULL;
    chunks[bm->nr_chunks++] = c;
    for (int i = BUFS_PER_CHUNK - 1; i >= 0; i--) {
      uint8_t *p = c + (size_t) i * PD_BLOCK_SIZE;
      memcpy (p, &bm->free_bufs, sizeof (void *));
      bm->free_bufs = p;
    }
  }
  buf = bm->free_bufs;
  memcpy (&bm->free_bufs, buf, sizeof (void *));
  return buf;
}

static void
put_buf (struct pd_bm *bm, uint8_t *buf)
{
  memcpy (buf, &bm->free_bufs, sizeof (void *));
  bm->free_bufs = buf;
}

static void
free_entry (struct pd_bm *bm, struct pd_block *b)
{
  hash_unlink (bm, b);
  if (b->prev)
    lru_unlink (b);
  bm->nr_cached--;
  put_buf (bm, b->data);
  free (b);
}

/* An entry for nr, evicting the oldest unpinned block if full. */
static int
get_entry (struct pd_bm *bm, uint64_t nr, struct pd_block **out)
{
  struct pd_block *b;

  if (bm->nr_cached >= bm->max_cached && bm->lru.next != &bm->lru) {
    b = bm->lru.next;
    if (b->dirty) {
      int r = write_block (bm, b);
      if (r < 0)
        return r;
    }
    hash_unlink (bm, b);
    lru_unlink (b);
  }
  else {
    b = calloc (1, sizeof *b);
    if (!b)
      return -ENOMEM;
    b->data = get_buf (bm);
    if (!b->data) {
      free (b);
      return -ENOMEM;
    }
    bm->nr_cached++;
  }
  b->nr = nr;
  b->pins = 1;
  b->dirty = b->validated = false;
  b->hnext = bm->hash[hash_of (bm, nr)];
  bm->hash[hash_of (bm, nr)] = b;
  *out = b;
  return 0;
}

int
pd_bm_read (struct pd_bm *bm, uint64_t nr, enum pd_block_type type,
            struct pd_block **out)
{
  struct pd_block *b;
  int r;

  pthread_mutex_lock (&bm->lock);
  if (nr >= bm->nr_blocks) {
    r = pd_error (bm, EIO, "metadata block %llu (%s): beyond the end of the "
                  "metadata device (%llu blocks)", (unsigned long long) nr,
                  type_name[type], (unsigned long long) bm->nr_blocks);
    goto out;
  }
  b = lookup (bm, nr);
  if (b) {
    if (b->pins++ == 0)
      lru_unlink (b);
  }
  else {
    r = get_entry (bm, nr, &b);
    if (r < 0)
      goto out;
    r = bm->dev->ops->read (bm->dev->opaque, nr * PD_BLOCK_SIZE,
                            PD_BLOCK_SIZE, b->data);
    if (r < 0) {
      atomic_store (&bm->io_failed, true);
      free_entry (bm, b);
      r = pd_error (bm, -r, "metadata block %llu: read failed: %s",
                    (unsigned long long) nr, strerror (-r));
      goto out;
    }
  }
  /* A cached block is trusted only as the type it was checked as (or
   * made as): a damaged pointer to a block of another kind must fail
   * here, not be read with the wrong layout.
   */
  if (!b->validated || b->type != type) {
    if (b->dirty && b->type != type) {
      r = pd_error (bm, EIO, "metadata block %llu: is a %s, expected a %s",
                    (unsigned long long) nr, type_name[b->type],
                    type_name[type]);
      goto unpin;
    }
    r = pd_validate (bm, nr, b->data, type);
    if (r < 0)
      goto unpin;
    b->type = type;
    b->validated = true;
  }
  *out = b;
  r = 0;
  goto out;
 unpin:
  if (--b->pins == 0) {
    if (b->dirty)
      lru_append (bm, b);
    else
      free_entry (bm, b);        /* do not keep bytes that failed */
  }
 out:
  pthread_mutex_unlock (&bm->lock);
  return r;
}

int
pd_bm_new (struct pd_bm *bm, uint64_t nr, enum pd_block_type type,
           struct pd_block **out)
{
  struct pd_block *b;
  int r = 0;

  pthread_mutex_lock (&bm->lock);
  b = lookup (bm, nr);
  if (b) {
    if (b->pins++ == 0)
      lru_unlink (b);
  }
  else if ((r = get_entry (bm, nr, &b)) < 0)
    goto out;
  memset (b->data, 0, PD_BLOCK_SIZE);
  b->type = type;
  b->validated = true;
  if (!b->dirty) {
    b->dirty = true;
    bm->nr_dirty++;
  }
  *out = b;
 out:
  pthread_mutex_unlock (&bm->lock);
  return r;
}

void
pd_bm_dirty (struct pd_bm *bm, struct pd_block *b)
{
  pthread_mutex_lock (&bm->lock);
  if (!b->dirty) {
    b->dirty = true;
    bm->nr_dirty++;
  }
  pthread_mutex_unlock (&bm->lock);
}

void
pd_bm_put (struct pd_bm *bm, struct pd_block *b)
{
  pthread_mutex_lock (&bm->lock);
  if (--b->pins == 0) {
    if (bm->nr_cached > bm->max_cached && !b->dirty)
      free_entry (bm, b);
    else
      lru_append (bm, b);
  }
  pthread_mutex_unlock (&bm->lock);
}

int
pd_bm_flush (struct pd_bm *bm)
{
  int r = 0;

  pthread_mutex_lock (&bm->lock);
  for (size_t i = 0; i <= bm->hash_mask && bm->nr_dirty; i++)
    for (struct pd_block *b = bm->hash[i]; b; b = b->hnext)
      if (b->dirty && (r = write_block (bm, b)) < 0)
        goto out;
  r = bm->dev->ops->flush (bm->dev->opaque);
  if (r < 0) {
    atomic_store (&bm->io_failed, true);
    r = pd_error (bm, -r, "metadata device: flush failed: %s", strerror (-r));
  }
 out:
  pthread_mutex_unlock (&bm->lock);
  return r;
}

void
pd_bm_copy_err (struct pd_bm *bm, char *err)
{
  if (!err)
    return;
  pthread_mutex_lock (&bm->err_lock);
  snprintf (err, PD_ERR_LEN, "%s", bm->err);
  pthread_mutex_unlock (&bm->err_lock);
}

bool
pd_all_zero (const uint8_t *p, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (p[i])
      return false;
  return true;
}

int
pd_bm_write_sync (struct pd_bm *bm, struct pd_block *b)
{
  int r;

  pthread_mutex_lock (&bm->lock);
  if (!b->dirty) {
    b->dirty = true;
    bm->nr_dirty++;
  }
  r = write_block (bm, b);
  if (r == 0) {
    r = bm->dev->ops->flush (bm->dev->opaque);
    if (r < 0) {
      atomic_store (&bm->io_failed, true);
      r = pd_error (bm, -r, "metadata device: flush failed: %s",
                    strerror (-r));
    }
  }
  pthread_mutex_unlock (&bm->lock);
  return r;
}

void
pd_bm_drop_dirty (struct pd_bm *bm)
{
  pthread_mutex_lock (&bm->lock);
  for (size_t i = 0; i <= bm->hash_mask; i++) {
    struct pd_block *b = bm->hash[i], *next;
    for (; b; b = next) {
      next = b->hnext;
      if (b->dirty) {
        b->dirty = false;
        bm->nr_dirty--;
        if (b->pins == 0)
          free_entry (bm, b);
        else
          b->validated = false;
      }
    }
  }
  pthread_mutex_unlock (&bm->lock);
}

void
pd_bm_destroy (struct pd_bm *bm)
{
  if (!bm->hash)
    return;
  for (size_t i = 0; i <= bm->hash_mask; i++) {
    struct pd_block *b = bm->hash[i], *next;
    for (; b; b = next) {
      next = b->hnext;
      free (b);
    }
  }
  for (size_t i = 0; i < bm->nr_chunks; i++)
    free (bm->chunks[i]);
  free (bm->chunks);
  free (bm->hash);
  bm->hash = NULL;
  pthread_mutex_destroy (&bm->lock);
  pthread_mutex_destroy (&bm->err_lock);
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* persistent-data: the private header of server/pdata/ (Linux's
 * drivers/md/persistent-data in its on-disk format, our own code).
 *
 *   block manager    4 KiB blocks over struct pd_blockdev, a bounded LRU
 *                    cache, crc32c checksums with dm's per-type salts and
 *                    validation of every block read from the device;
 *   transaction mgr  shadowing: a block of the last commit is never
 *                    written before the next superblock, it is copied;
 *   space maps       the metadata one (counts held in memory, written in
 *                    dm's format at commit) and the disk one (data blocks:
 *                    bitmaps, index btree, ref count btree, all through
 *                    the transaction manager);
 *   btrees           dm's node format, insert with splits, remove with
 *                    rebalancing, value types with inc/dec.
 *
 * Only libc and this directory's headers: the layer knows nothing of the
 * engine.  Not thread-safe by itself: thin-metadata.c holds one rwlock
 * around it; the block cache has its own mutex because lookups under the
 * shared lock still move blocks in and out of the cache.
 */
#ifndef NBDMAPPER_PDATA_H
#define NBDMAPPER_PDATA_H

#include <endian.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "thin-metadata.h"

#define PD_BLOCK_SIZE 4096
#define PD_BLOCK_SECTORS 8
#define PD_MAX_DEPTH 16           /* a btree deeper than this is damaged */

/* Checksum salts (dm-thin-metadata.c, dm-btree-internal.h,
 * dm-space-map-common.c).
 */
#define PD_SUPERBLOCK_CSUM_XOR 160774u
#define PD_BTREE_CSUM_XOR 121107u
#define PD_BITMAP_CSUM_XOR 240779u
#define PD_INDEX_CSUM_XOR 160478u
/* dm-clone-metadata.c, dm-array.c */
#define PD_CLONE_SUPERBLOCK_CSUM_XOR 257649492u
#define PD_ARRAY_CSUM_XOR 595846735u

enum pd_block_type {
  PD_SUPERBLOCK, PD_BTREE_NODE, PD_BITMAP, PD_INDEX,
  PD_CLONE_SUPERBLOCK, PD_ARRAY_BLOCK,  /* dm-clone's (clone-metadata.c) */
  PD_NR_TYPES
};

/* Where a block keeps its own number: at byte 8 for every kind but
 * dm-array's blocks, whose header puts it after their three counts.
 */
static inline unsigned
pd_blocknr_offset (enum pd_block_type type)
{
  return type == PD_ARRAY_BLOCK ? 16 : 8;
}

/* crc32c.c: Linux's crc32c (~0 seed, no final inversion) ^ xor. */
uint32_t pd_checksum (const void *data, size_t len, uint32_t xor);

static inline uint32_t pd_le32 (const void *p)
{ uint32_t v; __builtin_memcpy (&v, p, 4); return le32toh (v); }
static inline uint64_t pd_le64 (const void *p)
{ uint64_t v; __builtin_memcpy (&v, p, 8); return le64toh (v); }
static inline void pd_put32 (void *p, uint32_t v)
{ v = htole32 (v); __builtin_memcpy (p, &v, 4); }
static inline void pd_put64 (void *p, uint64_t v)
{ v = htole64 (v); __builtin_memcpy (p, &v, 8); }

/* --- block-manager.c ------------------------------------------------- */

struct pd_block {
  uint64_t nr;
  uint8_t *data;                  /* PD_BLOCK_SIZE bytes */
  struct pd_block *hnext;         /* hash chain */
  struct pd_block *prev, *next;   /* LRU list (unpinned blocks only) */
  unsigned pins;
  bool dirty;
  bool validated;                 /* data checked as type */
  enum pd_block_type type;
};

struct pd_bm {
  const struct pd_blockdev *dev;
  uint64_t nr_blocks;             /* read-only after init */
  bool read_only;
  pthread_mutex_t lock;           /* protects everything below */
  size_t max_cached, nr_cached;
  struct pd_block **hash;
  size_t hash_mask;
  struct pd_block lru;            /* sentinel: next is the oldest */
  void **chunks;                  /* block buffers, allocated 16 at a time */
  size_t nr_chunks;
  void *free_bufs;                /* unused buffers, linked through their
                                   * first bytes */
  size_t nr_dirty;
  /* A read, write or flush of the device failed: set under lock, read
   * without (thin-metadata.c's is_failed: no more changes or commits).
   */
  atomic_bool io_failed;
  pthread_mutex_t err_lock;       /* protects err: readers fail too */
  char err[PD_ERR_LEN];           /* the last error, one line */
};

int pd_bm_init (struct pd_bm *bm, const struct pd_blockdev *dev,
                size_t cache_blocks, bool read_only);
void pd_bm_destroy (struct pd_bm *bm);
/* Read (from cache or device, validating as type), pinned. */
int pd_bm_read (struct pd_bm *bm, uint64_t nr, enum pd_block_type type,
                struct pd_block **out);
/* A block the caller will fill: zeroed, dirty, pinned, no device read. */
int pd_bm_new (struct pd_bm *bm, uint64_t nr, enum pd_block_type type,
               struct pd_block **out);
void pd_bm_dirty (struct pd_bm *bm, struct pd_block *b);
void pd_bm_put (struct pd_bm *bm, struct pd_block *b);
/* Write every dirty block (checksummed), then flush the device. */
int pd_bm_flush (struct pd_bm *bm);
/* Write one block now (the superblock, last) and flush. */
int pd_bm_write_sync (struct pd_bm *bm, struct pd_block *b);
/* Abort: forget every dirty block. */
void pd_bm_drop_dirty (struct pd_bm *bm);
/* Copy bm->err into err (PD_ERR_LEN bytes; err may be NULL). */
void pd_bm_copy_err (struct pd_bm *bm, char *err);
/* Is the block (or any n bytes) all zero: a device never formatted? */
bool pd_all_zero (const uint8_t *p, size_t n);
/* Record an error message (printf-like) in bm->err; returns -e. */
int pd_error (struct pd_bm *bm, int e, const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));
/* Check a block's bytes as type (checksum, blocknr, header sanity). */
int pd_validate (struct pd_bm *bm, uint64_t nr, const uint8_t *data,
                 enum pd_block_type type);

/* --- space-map-metadata.c: counts of metadata blocks ----------------- */

/* Bitmap blocks: a 16-byte header, then 2-bit counts. */
#define PD_BITMAP_HEADER 16
#define PD_ENTRIES_PER_BITMAP ((PD_BLOCK_SIZE - PD_BITMAP_HEADER) * 4)
#define PD_MAX_METADATA_BITMAPS 255
#define PD_MAX_METADATA_BLOCKS \
  ((uint64_t) PD_MAX_METADATA_BITMAPS * PD_ENTRIES_PER_BITMAP)
#define PD_SM_ROOT_SIZE 128

struct pd_index_entry {
  uint64_t blocknr;
  uint32_t nr_free;
  uint32_t none_free_before;
};

struct pd_msm {
  uint64_t nr_blocks;
  uint64_t nr_allocated;
  uint32_t *count;                /* nr_blocks counts */
  uint8_t *new_bits;              /* allocated in this transaction */
  uint8_t *freed_bits;            /* freed in this transaction */
  uint64_t nr_freed;              /* how many: free, but not before commit */
  uint64_t cursor;                /* where the next search starts */
  uint64_t nr_bitmaps;
  struct pd_index_entry index[PD_MAX_METADATA_BITMAPS];
  uint8_t bitmap_dirty[PD_MAX_METADATA_BITMAPS];
  uint64_t index_block;
  uint64_t rc_root;               /* ref count btree (counts > 2) */
  uint64_t *rc_blocks;            /* its nodes, to free at rebuild */
  size_t nr_rc_blocks;
  bool rc_dirty;
};

/* --- the transaction manager: blocks, counts and shadows ------------- */

struct pd_tm {
  struct pd_bm bm;
  struct pd_msm sm;
};

int pd_msm_open (struct pd_tm *tm, const uint8_t *root, uint64_t dev_blocks);
int pd_msm_format (struct pd_tm *tm, uint64_t nr_blocks);
void pd_msm_free (struct pd_msm *sm);
int pd_msm_commit (struct pd_tm *tm, uint8_t *root);   /* fills the root */
/* Grow to nr_blocks (capped): new bitmaps, counts 0. */
int pd_msm_extend (struct pd_tm *tm, uint64_t nr_blocks);

uint32_t pd_tm_count (struct pd_tm *tm, uint64_t b);
/* Blocks that can be allocated before the commit. */
uint64_t pd_tm_available (struct pd_tm *tm);
int pd_tm_inc (struct pd_tm *tm, uint64_t b);
int pd_tm_dec (struct pd_tm *tm, uint64_t b);
/* A new block, count 1, zeroed in the cache and pinned. */
int pd_tm_new_block (struct pd_tm *tm, enum pd_block_type type,
                     struct pd_block **out);
/* A writable copy of block b: b itself if made in this transaction and
 * not shared, else a new block (b's count drops by one).  *inc: b was
 * shared, so the copy's children must be incremented.
 */
int pd_tm_shadow (struct pd_tm *tm, uint64_t b, enum pd_block_type type,
                  struct pd_block **out, bool *inc);
int pd_tm_read (struct pd_tm *tm, uint64_t b, enum pd_block_type type,
                struct pd_block **out);
void pd_tm_put (struct pd_tm *tm, struct pd_block *blk);
/* The transaction ended (commit done or aborted). */
void pd_tm_end_transaction (struct pd_tm *tm);
/* Commit: every dirty block written and flushed before the superblock
 * that points to them, then the superblock (sb, a whole block of type
 * type, checksummed here) written and flushed, then the transaction
 * ends.  committed (may be NULL) gets the superblock as written.
 */
int pd_tm_commit (struct pd_tm *tm, enum pd_block_type type,
                  const uint8_t *sb, uint8_t *committed);

/* --- btree.c --------------------------------------------------------- */

#define PD_NODE_HEADER 32
#define PD_INTERNAL_NODE 1u
#define PD_LEAF_NODE 2u

struct pd_value_type {
  uint32_t size;                  /* bytes of a leaf value */
  void *context;
  /* Another reference to the value (its node was copied), or one less
   * (removed, replaced, node freed).  NULL: plain data.
   */
  int (*inc) (void *context, const uint8_t *value);
  int (*dec) (void *context, const uint8_t *value);
  const char *name;               /* for messages: "mapping tree" */
};

struct pd_btree {
  struct pd_tm *tm;
  const struct pd_value_type *vt;
};

int pd_btree_empty (struct pd_btree *t, uint64_t *root);
/* 0 and the value, -ENODATA if absent, or an error. */
int pd_btree_lookup (struct pd_btree *t, uint64_t root, uint64_t key,
                     void *value);
/* The first key >= key: 0 with *found_key and value, or -ENODATA. */
int pd_btree_lookup_ge (struct pd_btree *t, uint64_t root, uint64_t key,
                        uint64_t *found_key, void *value);
/* Insert or replace; a replaced value is dec'd unless keep_old. */
int pd_btree_insert (struct pd_btree *t, uint64_t *root, uint64_t key,
                     const void *value, bool keep_old, bool *inserted);
/* Remove (the value is dec'd); -ENODATA if absent. */
int pd_btree_remove (struct pd_btree *t, uint64_t *root, uint64_t key);
/* Drop one reference to a whole tree (dm_btree_del). */
int pd_btree_del (struct pd_btree *t, uint64_t root);
/* Visit the entries with begin <= key < end in key order; fn returns
 * nonzero to stop (that value is returned).
 */
int pd_btree_scan (struct pd_btree *t, uint64_t root, uint64_t begin,
                   uint64_t end,
                   int (*fn) (void *opaque, uint64_t key, const uint8_t *v),
                   void *opaque);
int pd_btree_highest (struct pd_btree *t, uint64_t root, uint64_t *key);
/* Visit every leaf entry in key order (fn, when not NULL) and every
 * node (node_fn, when not NULL); a callback's nonzero return stops.
 * Shared nodes are visited once per reference.
 */
int pd_btree_walk_nodes (struct pd_btree *t, uint64_t root,
                         int (*fn) (void *opaque, uint64_t key,
                                    const uint8_t *v),
                         int (*node_fn) (void *node_opaque, uint64_t b),
                         void *opaque, void *node_opaque);
uint32_t pd_btree_max_entries (uint32_t value_size);
/* Build a tree bottom-up from sorted entries (used by the metadata space
 * map's ref count tree); blocks: the nodes, for freeing later.
 */
int pd_btree_build (struct pd_tm *tm, uint32_t value_size,
                    const uint64_t *keys, const uint8_t *values, size_t n,
                    uint64_t *root, uint64_t **blocks, size_t *nr_blocks);

/* --- space-map-disk.c: the data space map ---------------------------- */

struct pd_dsm {
  struct pd_tm *tm;
  uint64_t nr_blocks;
  uint64_t nr_allocated;
  uint64_t index_root;            /* btree: bitmap index -> index entry */
  uint64_t rc_root;               /* btree: block -> le32 count (> 2) */
  uint64_t old_index_root;        /* at the last commit */
  uint64_t old_nr_blocks;
  uint64_t cursor;
};

int pd_dsm_format (struct pd_dsm *sm, struct pd_tm *tm, uint64_t nr_blocks);
int pd_dsm_open (struct pd_dsm *sm, struct pd_tm *tm, const uint8_t *root);
void pd_dsm_root (struct pd_dsm *sm, uint8_t *root);
void pd_dsm_committed (struct pd_dsm *sm);
int pd_dsm_extend (struct pd_dsm *sm, uint64_t nr_blocks);
int pd_dsm_count (struct pd_dsm *sm, uint64_t b, uint32_t *count);
int pd_dsm_inc (struct pd_dsm *sm, uint64_t b);
int pd_dsm_dec (struct pd_dsm *sm, uint64_t b);
int pd_dsm_new_block (struct pd_dsm *sm, uint64_t *b);

#endif /* NBDMAPPER_PDATA_H */

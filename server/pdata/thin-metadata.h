/* SPDX-License-Identifier: BSD-3-Clause */
/* Thin-pool metadata in Linux's on-disk format (dm-thin-metadata.c's
 * layout: superblock, metadata and data space maps, device details tree,
 * two-level mapping tree, metadata snapshots), over persistent-data
 * (block manager with checksums, transaction manager with shadowing,
 * btrees, space maps) in server/pdata/.  Compiles alone; knows nothing of
 * the engine: I/O goes through struct pd_blockdev.  Thread-safe: every
 * function may be called from any thread (one lock inside, lookups
 * shared, changes exclusive).
 */
#ifndef NBDMAPPER_PDATA_THIN_METADATA_H
#define NBDMAPPER_PDATA_THIN_METADATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The metadata device: byte offsets, 4096-byte aligned blocks. */
struct pd_blockdev_ops {
  int (*read) (void *opaque, uint64_t offset, size_t len, void *buf);
  int (*write) (void *opaque, uint64_t offset, size_t len, const void *buf);
  int (*flush) (void *opaque);            /* all writes so far durable */
};
struct pd_blockdev {
  const struct pd_blockdev_ops *ops;
  void *opaque;
  uint64_t size;                          /* bytes */
};
/* Errors: functions return 0 or -errno; where a person must be told why,
 * err (a char[PD_ERR_LEN]) holds one line naming the place
 * ("metadata block 17: checksum mismatch", "superblock: data block size
 * 128 sectors, table says 256").
 */
#define PD_ERR_LEN 256

struct thin_md;          /* one pool's metadata (dm_pool_metadata) */
struct thin_md_dev;      /* an open thin device (dm_thin_device) */

struct thin_md_open_args {
  const struct pd_blockdev *dev;  /* kept, not copied: valid until close */
  uint32_t data_block_sectors;   /* the table's; must match an existing sb */
  uint64_t nr_data_blocks;       /* data device size in blocks: grows the
                                  * data space map; smaller than the
                                  * metadata's is an error */
  bool read_only;                /* never write (pool read_only feature) */
  size_t cache_blocks;           /* bound on cached 4 KiB metadata blocks */
};
/* Open, formatting when the superblock block is all zeros (as dm does). */
int thin_md_open (const struct thin_md_open_args *a, struct thin_md **out,
                  char *err);
/* Commit (if writable and changed) and free. */
int thin_md_close (struct thin_md *md, char *err);

/* Make everything changed since the last commit durable: write the dirty
 * shadowed blocks, flush, write the superblock, flush (dm's
 * __commit_transaction).  The caller flushes the *data* device first.
 * Failed metadata (thin_md_failed) fails it, -EROFS, even with nothing
 * changed.
 */
int thin_md_commit (struct thin_md *md, char *err);
/* Drop the changes since the last commit (dm's dm_pool_abort_metadata). */
int thin_md_abort (struct thin_md *md, char *err);
/* Changes not yet committed? */
bool thin_md_changed (struct thin_md *md);

/* Devices (message handlers).  -EEXIST, -ENODATA (no such id), -EBUSY
 * (delete of an open device), -ENOSPC (metadata full), -EINVAL (id over
 * 2^24-1), -EROFS (read-only / failed metadata).
 */
int thin_md_create_thin (struct thin_md *md, uint64_t dev_id, char *err);
int thin_md_create_snap (struct thin_md *md, uint64_t dev_id,
                         uint64_t origin_id, char *err);
int thin_md_delete (struct thin_md *md, uint64_t dev_id, char *err);
int thin_md_get_transaction_id (struct thin_md *md, uint64_t *id);
int thin_md_set_transaction_id (struct thin_md *md, uint64_t old_id,
                                uint64_t new_id, char *err);
int thin_md_reserve_metadata_snap (struct thin_md *md, char *err);
int thin_md_release_metadata_snap (struct thin_md *md, char *err);
/* The held metadata snapshot's block number, 0 if none (status's
 * <held metadata root>).
 */
int thin_md_get_metadata_snap (struct thin_md *md, uint64_t *block);

/* Open / close a thin device (the thin target's constructor / dtr).
 * -ENODATA when the id does not exist.
 */
int thin_md_dev_open (struct thin_md *md, uint64_t dev_id,
                      struct thin_md_dev **out, char *err);
void thin_md_dev_close (struct thin_md_dev *td);

/* Mappings.  find: 0 with *data_block and *shared (the block is shared
 * with a snapshot or origin: a write must break sharing first), or
 * -ENODATA when unmapped.
 */
int thin_md_find_block (struct thin_md_dev *td, uint64_t vblock,
                        uint64_t *data_block, bool *shared);
/* The first mapped run in [begin, end): *vbegin.. *vend map to
 * consecutive data blocks from *data_begin with one shared value.
 * -ENODATA if none.  For extents and multi-block requests.
 */
int thin_md_find_mapped_range (struct thin_md_dev *td, uint64_t begin,
                               uint64_t end, uint64_t *vbegin,
                               uint64_t *vend, uint64_t *data_begin,
                               bool *shared);
/* Map vblock to data_block (a block from thin_md_alloc_data_block, whose
 * reference the mapping takes over), replacing and releasing any old
 * mapping.
 */
int thin_md_insert_block (struct thin_md_dev *td, uint64_t vblock,
                          uint64_t data_block);
/* Unmap [begin, end), releasing the data blocks (freed when no one else
 * shares them).
 */
int thin_md_remove_range (struct thin_md_dev *td, uint64_t begin,
                          uint64_t end);
/* A free data block, reference count 1, not reused before commit if
 * released.  -ENOSPC when none.
 */
int thin_md_alloc_data_block (struct thin_md *md, uint64_t *block);
/* thin status: mapped blocks and the highest mapped vblock (-ENODATA if
 * none).
 */
int thin_md_dev_mapped_count (struct thin_md_dev *td, uint64_t *count);
int thin_md_dev_highest_mapped (struct thin_md_dev *td, uint64_t *vblock);

/* Pool status and resize. */
int thin_md_get_free_data_blocks (struct thin_md *md, uint64_t *n);
int thin_md_get_data_dev_size (struct thin_md *md, uint64_t *blocks);
int thin_md_get_free_metadata_blocks (struct thin_md *md, uint64_t *n);
int thin_md_get_metadata_dev_size (struct thin_md *md, uint64_t *blocks);
int thin_md_resize_data_dev (struct thin_md *md, uint64_t nr_blocks,
                             char *err);
/* needs_check: the superblock flag (set when the metadata was found
 * damaged at run time; cleared by thin_check --clear-needs-check-flag).
 */
bool thin_md_needs_check (struct thin_md *md);
int thin_md_set_needs_check (struct thin_md *md);
/* After an I/O or checksum error inside the metadata, the md refuses
 * further changes (-EROFS) until reopened: the pool goes read-only.
 */
bool thin_md_failed (struct thin_md *md);

/* Extensions to the first contract (see thin-api-changes.md). */

/* The message of the last error inside the metadata (for the functions
 * above that take no err: lookups, inserts, allocations), one line
 * naming the block; "" if none.
 */
void thin_md_last_error (struct thin_md *md, char *err);

/* Every device, committed or not, in dev id order (what thin_dump would
 * show after a commit).  fn returns nonzero to stop the walk.
 */
struct thin_md_dev_info {
  uint64_t dev_id;
  uint64_t mapped_blocks;
  uint64_t transaction_id;
  uint32_t creation_time;
  uint32_t snapshotted_time;
};
int thin_md_list_devices (struct thin_md *md,
                          int (*fn) (void *opaque,
                                     const struct thin_md_dev_info *info),
                          void *opaque);
/* The superblock's time (raised by each snapshot). */
uint32_t thin_md_get_time (struct thin_md *md);

/* Drop the reference of a block from thin_md_alloc_data_block that was
 * never inserted (its data write failed): free again, not reused before
 * the commit.
 */
int thin_md_release_data_block (struct thin_md *md, uint64_t block);
/* dm's dm_pool_inc_data_range / dm_pool_dec_data_range and
 * dm_pool_block_is_shared (data block reference count > 1), for discard
 * passdown as dm-thin does it: inc the run's data blocks, remove the
 * mappings, pass down only the blocks not shared, dec the run.  The
 * shared flag of the find functions is dm's __snapshotted_since, a test
 * of time: true may be "was shared once", false is never wrong about
 * snapshots, but a held metadata snapshot is not a device and can still
 * hold a block: use block_is_shared under an inc before a passdown.
 */
int thin_md_inc_data_range (struct thin_md *md, uint64_t begin,
                            uint64_t end);
int thin_md_dec_data_range (struct thin_md *md, uint64_t begin,
                            uint64_t end);
int thin_md_block_is_shared (struct thin_md *md, uint64_t block,
                             bool *shared);

#endif /* NBDMAPPER_PDATA_THIN_METADATA_H */

/* SPDX-License-Identifier: BSD-3-Clause */
/* dm-clone metadata in Linux's on-disk format (dm-clone-metadata.c's
 * layout): a superblock (magic 0x8af27f64, version 1, the metadata space
 * map's root, region size and target size in sectors, the bitset's
 * root) and the region bitset, a dm-bitset: a dm-array of 64-bit words
 * (bit i of word w is region 64 w + i, 1 = hydrated) whose blocks are
 * the values of a btree keyed by array block index.  Over
 * persistent-data (server/pdata/); knows nothing of the engine.
 *
 * The caller keeps the in-core bitmap (the target answers every request
 * from it); this layer holds the committed one and what the next commit
 * adds.  Thread-safe: one mutex inside.
 */
#ifndef NBDMAPPER_PDATA_CLONE_METADATA_H
#define NBDMAPPER_PDATA_CLONE_METADATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "thin-metadata.h"      /* struct pd_blockdev, PD_ERR_LEN */

struct clone_md;

struct clone_md_open_args {
  const struct pd_blockdev *dev;  /* kept, not copied: valid until close */
  uint64_t region_sectors;        /* the table's; must match the sb's */
  uint64_t target_sectors;        /* likewise */
  size_t cache_blocks;            /* bound on cached 4 KiB blocks */
};

/* Open, formatting when the superblock block is all zeros (as dm does):
 * every region unhydrated.  Damage, or sizes that differ from the
 * table's, are refused with err naming the block or the field.
 */
int clone_md_open (const struct clone_md_open_args *a, struct clone_md **out,
                   char *err);
/* Free (without a commit: the caller commits what is durable). */
void clone_md_close (struct clone_md *md);

uint64_t clone_md_nr_regions (const struct clone_md *md);
/* The committed bitmap: DIV_ROUND_UP (nr_regions, 64) words; the bits
 * past nr_regions are 0.
 */
int clone_md_load (struct clone_md *md, uint64_t *words, char *err);
/* Mark the regions of word w set in bits hydrated in the next commit. */
int clone_md_set_bits (struct clone_md *md, uint64_t w, uint64_t bits,
                       char *err);
/* Write what changed, flush, the superblock, flush (dm's
 * __metadata_commit).  The caller flushed the destination first.
 */
int clone_md_commit (struct clone_md *md, char *err);
/* Metadata blocks in use and in all (status). */
void clone_md_usage (struct clone_md *md, uint64_t *used, uint64_t *total);
/* A write or a commit failed: no more changes (-EROFS) until reopened. */
bool clone_md_failed (struct clone_md *md);

#endif /* NBDMAPPER_PDATA_CLONE_METADATA_H */

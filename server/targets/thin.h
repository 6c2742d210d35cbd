/* SPDX-License-Identifier: BSD-3-Clause */
/* What the thin-pool target (thin-pool.c) and the thin target (thin.c)
 * share: the pool object, dm-thin.c's struct pool.
 *
 * A pool object outlives the tables that name it.  It is keyed by its
 * metadata backend (backends are shared objects: every table naming the
 * same metadata device gets the same one), so a reload of the pool
 * device finds the pool its previous table made, and is referenced by
 * every thin-pool target built on it (live, inactive, being replaced)
 * and by every thin target bound to it.  The pool object holds
 * references of its own to the metadata backend and to the data backend
 * of the thin-pool target bound last (the live one: resume binds it).
 */
#ifndef NBDMAPPER_TARGETS_THIN_H
#define NBDMAPPER_TARGETS_THIN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "target.h"
#include "util.h"
#include "pdata/thin-metadata.h"

/* The table's features (dm's struct pool_features). */
struct pool_features {
  bool zero_new_blocks;         /* not skip_block_zeroing */
  bool discard_enabled;         /* not ignore_discard */
  bool discard_passdown;        /* not no_discard_passdown */
  bool read_only;
  bool error_if_no_space;
};

/* dm's pool modes (status: rw, out_of_data_space, ro; Fail). */
enum pool_mode {
  PM_WRITE,
  PM_OUT_OF_DATA_SPACE,
  PM_READ_ONLY,
  PM_FAIL,
};

/* dm's no_space_timeout: queued writes fail after this. */
#define POOL_NO_SPACE_TIMEOUT_NS (60 * 1000000000ULL)
/* Locks a write takes to provision or break sharing of a block, by a
 * hash of (device, block): two writes to one unprovisioned block never
 * allocate twice (dm's bio prison, as lock striping).
 */
#define POOL_CELLS 256

struct pool {
  /* The pools list (thin-pool.c), under its lock. */
  struct pool *next;
  unsigned refs;
  struct backend *md_be;        /* own reference; the key */

  /* Read-only after creation. */
  struct pd_blockdev pdev;      /* over md_be */
  struct thin_md *md;
  uint32_t block_sectors;
  uint64_t block_bytes;

  /* Protected by lock: the binding to the live thin-pool target, and the
   * wait for space.  space_gen moves on at every bind (a reload may have
   * grown the data device).
   */
  pthread_mutex_t lock;
  pthread_cond_t space_cond;
  struct target *ti;            /* the live thin-pool target, or NULL */
  struct pool_features pf;
  uint64_t low_water_blocks;
  bool low_water_raised;
  bool meta_low_water_raised;  /* the metadata low water mark's */
  uint64_t space_gen;
  /* The pool device is suspending or suspended (presuspend until the
   * next bind): new provisioning, copies and discards, which go to the
   * data device directly, wait for the resume as the pool device's own
   * I/O does (space_cond).
   */
  bool suspended;

  /* Read on the request path without lock. */
  _Atomic int mode;             /* enum pool_mode */
  _Atomic bool commit_failed;   /* sticky: every later flush fails */
  _Atomic bool discard_enabled, discard_passdown, zero_new_blocks;

  /* Metadata changes that must land in one transaction with the data
   * they describe (allocate, write the block, insert the mapping) hold
   * it shared; a commit (flush the data device, then commit the
   * metadata) holds it exclusive, so that no mapping it commits points
   * at data the flush did not cover and no allocated block is committed
   * without its mapping.  Writer-preferring: commits are not starved.
   * data_be changes only under it exclusive (bind).
   */
  pthread_rwlock_t commit_rw;
  struct backend *data_be;      /* own reference; the bound target's */

  pthread_mutex_t cells[POOL_CELLS];
};

/* thin-pool.c, for thin.c. */
/* Bind to the pool of peer, a live thin-pool target (target_find_peer's
 * callback): *(struct pool **) opaque takes a reference.  Returns 1.
 */
int pool_bind_peer (struct target *peer, void *opaque);
void pool_put (struct pool *p);
/* target_table_find's callback: 1 if peer is a thin-pool target of
 * pool opaque.
 */
int pool_is_peer (struct target *peer, void *opaque);
/* Flush the data device and commit the metadata if it changed; coalesced
 * (a flush finding the metadata committed has nothing to commit).  -EIO
 * once any commit of the pool failed: a flush is never reported durable
 * after acknowledged writes may have been lost.
 */
int pool_commit (struct pool *p);
/* A new data block for a write, commit_rw held shared (dropped and taken
 * again while waiting for space).  0, -ENOSPC (error_if_no_space, the
 * wait timed out), -ESHUTDOWN, -EIO.
 */
int pool_alloc_block (struct pool *p, uint64_t *block);
/* A metadata operation failed: switch to read-only (dm's
 * metadata_operation_failed).
 */
void pool_md_failed (struct pool *p, const char *op, int r, const char *err);
pthread_mutex_t *pool_cell (struct pool *p, uint64_t dev_id, uint64_t block);
/* Wait while the pool device is suspended (struct pool's suspended),
 * holding no pool lock.  0, or -ESHUTDOWN (request_wait gave up).
 */
int pool_wait_running (struct pool *p);
static inline enum pool_mode
pool_mode (struct pool *p)
{
  return atomic_load_explicit (&p->mode, memory_order_relaxed);
}

#endif /* NBDMAPPER_TARGETS_THIN_H */

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
  /* The pool's own commit thread (dm's per-pool worker and waker): a
   * commit that waits for this pool (a drain, commit_rw held by a write
   * to a slow data device) holds up no other pool's.
   */
  pthread_cond_t commit_cond;   /* CLOCK_MONOTONIC; committer_stop */
  pthread_t committer;
  bool committer_running, committer_stop;

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
   * data_be changes only under it exclusive and pools_lock (bind).
   */
  pthread_rwlock_t commit_rw;
  struct backend *data_be;      /* own reference; the bound target's */

  pthread_mutex_t cells[POOL_CELLS];

  /* In-flight I/O of the thin devices' fast path (dm's deferred set):
   * a read or write of a mapped block looks the mapping up and sends a
   * clone to the data block with no lock held, so a discard (or a
   * delete, or a write breaking sharing) may release the block under
   * it.  A released block is handed out again only after a commit
   * (space-map-disk.c), and a commit that follows a release first waits
   * until every such clone that may have seen the old mapping is done:
   * otherwise its late write would land in, or its late read return,
   * the data of the volume the block went to next.
   *
   * Each fast-path lookup and its clone count in io_count[epoch & 1]
   * (pool_io_enter, pool_io_exit from the clone's end_io).  A drain
   * (thin-pool.c's pool_drain) moves the epoch on, so that new I/O
   * counts in the other slot, and waits for the old slot to empty.
   * Drains are serialised (drain_lock) and never move the epoch while
   * the other slot is still draining (drain_slot), so every counted I/O
   * older than a drain is in the slot it waits for.  Nothing on the fast
   * path takes a lock: two atomic additions and a load per clone.
   *
   * Releases are counted (release_seq, commit_rw held shared), and a
   * drain publishes the count it read before moving the epoch once its
   * slot is empty (drained_seq): a commit (commit_rw exclusive: no
   * release meanwhile) needs no drain when the two are equal.  A flag
   * cleared when a drain starts would tell a concurrent commit that
   * nothing is undrained before that drain has even moved the epoch.
   */
  _Atomic uint64_t io_epoch;
  _Atomic uint64_t io_count[2];
  _Atomic unsigned drain_waiters;       /* under lock: in wait_slot */
  _Atomic uint64_t release_seq; /* releases of data blocks so far */
  _Atomic uint64_t drained_seq; /* under drain_lock: releases drained */
  uint64_t pending_seq;         /* under drain_lock: drain_slot's */
  _Atomic int drain_slot;       /* a slot being drained, or -1 */
  pthread_mutex_t drain_lock;
  pthread_cond_t drain_cond;    /* under lock; pool_io_exit wakes it */
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
 * again for a commit that may free some).  0, -EAGAIN (none free,
 * queue_if_no_space, or that commit must wait for a resume: drop every
 * lock, pool_wait_space (gen), and try again), -ENOSPC
 * (error_if_no_space), -ESHUTDOWN, -EIO.
 */
int pool_alloc_block (struct pool *p, uint64_t *block, uint64_t *gen);
/* Wait, holding no pool lock, until a bind or a commit that frees space
 * moves space_gen on from gen: 0; -ENOSPC once *deadline (set at the
 * first call: dm's no_space_timeout) has passed; -ESHUTDOWN.
 */
int pool_wait_space (struct pool *p, uint64_t gen, uint64_t *deadline,
                     uint64_t *asked);
/* A metadata operation failed: switch to read-only (dm's
 * metadata_operation_failed).
 */
void pool_md_failed (struct pool *p, const char *op, int r, const char *err);
pthread_mutex_t *pool_cell (struct pool *p, uint64_t dev_id, uint64_t block);
/* Wait while the pool device is suspended (struct pool's suspended),
 * holding no pool lock.  0, or -ESHUTDOWN (request_wait gave up).
 */
int pool_wait_running (struct pool *p);
/* Suspending or suspended (under lock): a write to the data device
 * that found it so, commit_rw held shared, drops its locks and waits
 * (the pool's postsuspend waits for those that did not).
 */
bool pool_suspended (struct pool *p);
static inline enum pool_mode
pool_mode (struct pool *p)
{
  return atomic_load_explicit (&p->mode, memory_order_relaxed);
}

/* The last fast-path I/O of a slot a drain waits for is done. */
void pool_io_drained (struct pool *p);

/* A fast-path lookup and the clone it sends end (the clone's end_io). */
static inline void
pool_io_exit (struct pool *p, unsigned slot)
{
  if (atomic_fetch_sub (&p->io_count[slot], 1) == 1 &&
      atomic_load (&p->drain_waiters) != 0)
    pool_io_drained (p);
}

/* Before a fast-path lookup: the slot its I/O counts in until
 * pool_io_exit.  The epoch is read again after counting: a drain that
 * moved it meanwhile may have found the old slot empty already.
 */
static inline unsigned
pool_io_enter (struct pool *p)
{
  for (;;) {
    uint64_t e = atomic_load (&p->io_epoch);

    atomic_fetch_add (&p->io_count[e & 1], 1);
    if (atomic_load (&p->io_epoch) == e)
      return e & 1;
    pool_io_exit (p, e & 1);
  }
}

/* Data blocks may have been released (by the caller, commit_rw held
 * shared, after releasing them): the next commit drains first.
 */
static inline void
pool_released (struct pool *p)
{
  atomic_fetch_add (&p->release_seq, 1);
}

#endif /* NBDMAPPER_TARGETS_THIN_H */

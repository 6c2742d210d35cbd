/* SPDX-License-Identifier: BSD-3-Clause */
/* The mirror target's private header: its state, shared by the target
 * (mirror.c: constructor, I/O, status, events) and the resync worker
 * with the write fence (mirror-resync.c), as dm-raid1 shares its state
 * with dm-region-hash and dm-kcopyd.
 */
#ifndef NBDMAPPER_MIRROR_H
#define NBDMAPPER_MIRROR_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "target.h"

#define MIRROR_MAX_LEGS 9          /* dm's MAX_NR_MIRRORS */
#define NO_REGION UINT64_MAX

/* Leg error bits, shown as dm's status characters F > D > S > R > A. */
enum { LEG_READ_ERR = 1, LEG_WRITE_ERR = 2, LEG_SYNC_ERR = 4, LEG_FLUSH_ERR = 8 };

enum sync_arg { SYNC_DEFAULT, SYNC_SYNC, SYNC_NOSYNC };

/* Log device error bits, shown as dm's disk log status D (a write
 * failed) and F (a flush failed); A when none.
 */
enum { LOG_WRITE_ERR = 1, LOG_FLUSH_ERR = 2 };

/* The disk log (mirror-log.c), dm-log's "disk" type: dm's on-disk
 * format on the log device, a clean bit per region; a region's bit is
 * made durable as dirty before the first write to it goes out, and set
 * clean again by a clear pass once its writes drained and a flush of
 * the legs covered them.
 */
struct mirror_log {
  /* Read-only after ctr. */
  struct backend *be;
  uint64_t size;                /* bytes of the log area, whole blocks */
  uint32_t block;               /* I/O unit of the log device */
  bool block_on_error;          /* an unloggable write fails */
  bool merged;                  /* resume has re-read the bits */
  bool fresh;                   /* ctr: a new log (nothing to merge) */
  bool changed;                 /* ctr: the header is to be written at
                                 * resume */

  /* The log area's image: dm's header, then the clean bits at byte
   * LOG_OFFSET (little-endian bit order).  Changed only under lock
   * (with __atomic builtins), read without it by the write path.
   */
  unsigned char *buf;
  pthread_mutex_t lock;         /* the image, writing, want */
  pthread_cond_t idle;          /* writing turned false */
  bool writing;                 /* a write of the log is in flight */
  uint64_t *want;               /* regions waiting for the next mark */
  size_t nwant, awant;
  pthread_mutex_t pass_lock;    /* one clear pass at a time */
  /* Per region: writes started (above PENDING_BITS) and clones in flight
   * (below), so a clear pass knows no write came or went since it
   * looked.
   */
  _Atomic uint64_t *wstate;
  uint64_t *seen;               /* wstate at the last pass (pass_lock) */
  _Atomic unsigned errors;      /* LOG_* bits */
  uint64_t dirty_at_load;       /* regions the log said dirty (after a
                                 * crash: what is resynced) */
  _Atomic uint64_t marks;       /* bits made dirty on the device */
  _Atomic uint64_t clears;      /* bits made clean on the device */
};
#define LOG_PENDING_BITS 24
#define LOG_PENDING_MASK ((1ULL << LOG_PENDING_BITS) - 1)
#define LOG_STARTED (1ULL << LOG_PENDING_BITS)

struct mirror_leg {
  struct backend *be;           /* read-only after ctr */
  uint64_t start;               /* bytes into the backend */
  _Atomic unsigned errors;      /* LEG_* bits */
};

struct mirror {
  /* Read-only after ctr. */
  struct target *ti;            /* for events and messages */
  uint64_t len;                 /* target length, bytes */
  uint64_t region_size;         /* bytes, a power of two */
  unsigned region_shift;
  uint64_t nr_regions;
  unsigned nr_legs;
  enum sync_arg sync;
  bool handle_errors;
  struct mirror_log *log;       /* NULL: the core log */

  /* Read balancing (dm-raid1's choose_mirror): reads of in-sync regions
   * stay on one leg for MIN_READS reads, then move to the next healthy
   * one.
   */
  _Atomic uint64_t reads;

  /* Legs that failed a write: a bit per leg, set once. */
  _Atomic unsigned failed_mask;

  /* Resync state.  in_sync: a bit per region, set (by the worker) once the
   * region is copied; never cleared.  all_in_sync turns true once, then the
   * I/O paths skip everything below.
   */
  _Atomic uint64_t *in_sync;
  _Atomic uint64_t nr_in_sync;
  _Atomic bool all_in_sync;
  _Atomic bool resync_failed;   /* source leg failed: no way to finish */
  _Atomic bool stop_copy;       /* postsuspend: give the copy up */
  _Atomic uint64_t fg_ios;      /* foreground requests while resyncing */
  _Atomic uint64_t nr_copied;   /* regions the resync copied */
  _Atomic uint64_t bytes_skipped; /* of them, holes not copied */

  /* Write fencing during resync (mirror-resync.c, mirror_write_enter). */
  _Atomic uint64_t recovering;  /* region being copied, or NO_REGION */
  _Atomic uint64_t epoch;
  _Atomic uint64_t writers[2];  /* clones in flight, by epoch parity */
  pthread_mutex_t fence_lock;   /* with fence_cond: writers waiting for */
  pthread_cond_t fence_cond;    /* recovering to move on */

  /* Protected by the resync worker's lock (mirror-resync.c). */
  bool live;                    /* table live: may resync */
  bool queued;                  /* on the resync list */
  struct mirror *next;
  struct mirror *live_next;     /* live and with a disk log: the stop's
                                 * last clear pass */
  uint64_t next_region;         /* where the worker looks next */
  uint64_t last_pass_ns;        /* the worker's last log clear pass */

  struct mirror_leg legs[MIRROR_MAX_LEGS];
};

static inline bool
region_in_sync (const struct mirror *m, uint64_t r)
{
  return atomic_load_explicit (&m->in_sync[r / 64], memory_order_acquire)
    & (1ULL << (r % 64));
}

/* Are all regions touching target bytes [off, off+len) in sync? */
static inline bool
range_in_sync (const struct mirror *m, uint64_t off, uint64_t len)
{
  uint64_t r, last;

  if (atomic_load_explicit (&m->all_in_sync, memory_order_acquire))
    return true;
  last = (off + len - 1) >> m->region_shift;
  for (r = off >> m->region_shift; r <= last; r++)
    if (!region_in_sync (m, r))
      return false;
  return true;
}

/* mirror.c */
/* Set error bit on leg; its first error of that kind raises an event. */
void mirror_mark_leg (struct mirror *m, unsigned leg, unsigned bit,
                      const char *what);
/* Log the status line with what happened (debug). */
void mirror_log_state (struct mirror *m, const char *what);

/* mirror-log.c: the disk log.  mirror_log_ctr opens "<log dev>", reads
 * and checks the header (refusing a damaged one) and fills m->in_sync
 * from the clean bits; m's sync argument, regions and in_sync are set.
 * mirror_log_write_enter counts a write of n clones over target bytes
 * [off, off+len) in and, for a region still clean, makes its dirty bit
 * durable first (0, or -EIO with block_on_error when that failed); the
 * clones count themselves out with mirror_log_write_exit.
 * mirror_log_clear_pass cleans the bits of in-sync regions with no write
 * since it looked, after flushing the legs.  mirror_log_resume re-reads
 * the bits once, when the table first goes live.
 */
int mirror_log_ctr (struct mirror *m, const char *dev, bool block_on_error,
                    struct mapper_err *err);
void mirror_log_resume (struct mirror *m);
void mirror_log_free (struct mirror *m);
int mirror_log_write_enter (struct mirror *m, uint64_t off, uint64_t len,
                            unsigned n);
void mirror_log_write_exit (struct mirror *m, uint64_t off, uint64_t len,
                            unsigned n);
void mirror_log_clear_pass (struct mirror *m);
/* The pass at a suspend or a stop, writes drained: every in-sync dirty
 * region with no write in flight, whether used since the last pass or
 * not.
 */
void mirror_log_clean_all (struct mirror *m);
/* A device flush of the log device failed: status F, an event. */
void mirror_log_flush_failed (struct mirror *m);
char mirror_log_status_char (struct mirror *m);

/* mirror-resync.c: the engine-wide resync worker (the type's start and
 * stop hooks), a mirror joining it (its table is live) and leaving it
 * (not live, or freed: waits for a copy of its region to end).
 */
int mirror_resync_start (struct mapper_err *err);
void mirror_resync_stop (void);
void mirror_resync_resume (struct mirror *m);
/* false if m was not live */
bool mirror_resync_suspend (struct mirror *m);
/* The write fence: init/destroy with the mirror.  A write of n clones
 * of target bytes [off, off+len) counts itself in with
 * mirror_write_enter (waiting while the region being copied overlaps
 * it), and each clone out with mirror_write_exit (the parity enter
 * returned).  Only while resyncing: once all_in_sync, writes skip both.
 */
void mirror_fence_init (struct mirror *m);
void mirror_fence_destroy (struct mirror *m);
unsigned mirror_write_enter (struct mirror *m, uint64_t off, uint64_t len,
                             unsigned n);
static inline void
mirror_write_exit (struct mirror *m, unsigned parity, unsigned n)
{
  atomic_fetch_sub (&m->writers[parity], n);
}

#endif /* NBDMAPPER_MIRROR_H */

/* SPDX-License-Identifier: BSD-3-Clause */
/* Thin-pool metadata (dm-thin-metadata.c's format and semantics) over
 * persistent-data: the superblock, the two-level mapping tree (dev id ->
 * subtree root; vblock -> data block << 24 | time), the device details
 * tree, the data and metadata space maps, metadata snapshots.
 *
 * Locking: md->lock, a rwlock: lookups (find_block, find_mapped_range,
 * the status getters) take it shared, everything that changes the
 * metadata exclusive.  Below it the block cache has its own mutex.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdata.h"
#include "thin-metadata.h"

#define THIN_MAGIC 27022010ull
#define THIN_VERSION 2u
#define NEEDS_CHECK_FLAG 1u
#define MAX_DEV_ID ((1ull << 24) - 1)
#define DETAILS_SIZE 24

/* superblock offsets (struct thin_disk_superblock) */
enum {
  SB_FLAGS = 4, SB_BLOCKNR = 8, SB_UUID = 16, SB_MAGIC = 32, SB_VERSION = 40,
  SB_TIME = 44, SB_TRANS_ID = 48, SB_HELD_ROOT = 56, SB_DATA_SM = 64,
  SB_META_SM = 192, SB_MAPPING_ROOT = 320, SB_DETAILS_ROOT = 328,
  SB_DATA_BLOCK_SIZE = 336, SB_META_BLOCK_SIZE = 340, SB_META_NR_BLOCKS = 344,
  SB_COMPAT = 352, SB_COMPAT_RO = 356, SB_INCOMPAT = 360,
};

struct thin_md_dev {
  struct thin_md *md;
  struct thin_md_dev *next;       /* md->devs */
  uint64_t id;
  uint64_t root;                  /* its mapping subtree */
  unsigned open_count;
  bool changed;                   /* details to write at commit */
  bool gone;                      /* its creation was aborted */
  uint64_t mapped_blocks;
  uint64_t transaction_id;
  uint32_t creation_time;
  uint32_t snapshotted_time;
};

struct thin_md {
  pthread_rwlock_t lock;
  struct pd_tm tm;
  struct pd_dsm dsm;
  struct pd_value_type bottom_vt, top_vt, details_vt;
  struct pd_btree bottom, top, details;
  bool read_only;                 /* read-only after init */
  uint32_t data_block_sectors;    /* read-only after init */
  atomic_bool failed;
  /* Why it failed (the first failure's error line; under the lock
   * exclusive, or the first fail(), which sets it once): later refusals
   * quote it.
   */
  char fail_why[PD_ERR_LEN];
  bool changed;
  /* the superblock, as it will be committed */
  uint32_t flags;
  uint8_t uuid[16];
  uint32_t time;
  uint64_t trans_id;
  uint64_t held_root;
  uint64_t root;                  /* mapping tree */
  uint64_t details_root;
  uint8_t committed[PD_BLOCK_SIZE];  /* the last committed superblock */
  struct thin_md_dev *devs;       /* open or changed devices */
};

#define RDLOCK(md) pthread_rwlock_rdlock (&(md)->lock)
#define WRLOCK(md) pthread_rwlock_wrlock (&(md)->lock)
#define UNLOCK(md) pthread_rwlock_unlock (&(md)->lock)

static void
copy_err (struct thin_md *md, char *err)
{
  pd_bm_copy_err (&md->tm.bm, err);
}

/* A failure inside the metadata: it may be half changed, so no more
 * changes until reopened (or aborted and reloaded).  That includes a
 * full metadata device (-ENOSPC), as in dm; -ENODATA is an answer.
 */
static int
fail (struct thin_md *md, int r)
{
  if (r < 0 && r != -ENODATA && !atomic_exchange (&md->failed, true))
    copy_err (md, md->fail_why);
  return r;
}

/* Failed: by fail(), or by an I/O error of the block manager that no
 * caller reported as one (a commit must not succeed after it).
 */
static bool
is_failed (struct thin_md *md)
{
  return atomic_load (&md->failed) || atomic_load (&md->tm.bm.io_failed);
}

/* Is a change allowed now? */
static int
writable (struct thin_md *md, char *err)
{
  int r = 0;

  if (md->read_only)
    r = pd_error (&md->tm.bm, EROFS, "thin-pool metadata is read-only");
  else if (is_failed (md)) {
    /* The block manager's own line, for a failure fail() never saw. */
    if (md->fail_why[0] == '\0')
      copy_err (md, md->fail_why);
    r = pd_error (&md->tm.bm, EROFS, "thin-pool metadata failed earlier "
                  "(%s): read-only until reloaded", md->fail_why);
  }
  if (r)
    copy_err (md, err);
  return r;
}

/* dm keeps a reserve of metadata blocks (__set_metadata_reserve: a
 * tenth of the device, at most 4096 blocks) so that a pool whose
 * metadata is nearly full can still commit what it has: a change that
 * allocates is refused with -ENOSPC, the metadata is not failed.  At
 * least 16 blocks: a commit places the space map's index and bitmaps,
 * and maybe a ref count tree and a path of the details tree.
 */
static uint64_t
metadata_reserve (struct thin_md *md)
{
  uint64_t r = md->tm.sm.nr_blocks / 10;

  return r > 4096 ? 4096 : r < 16 ? 16 : r;
}

static int
metadata_low (struct thin_md *md, char *err)
{
  uint64_t avail = pd_tm_available (&md->tm);

  if (avail >= metadata_reserve (md))
    return 0;
  pd_error (&md->tm.bm, ENOSPC, "metadata space low: %llu of %llu blocks "
            "free, %llu kept for the commit (resize the metadata device)",
            (unsigned long long) avail,
            (unsigned long long) md->tm.sm.nr_blocks,
            (unsigned long long) metadata_reserve (md));
  copy_err (md, err);
  return -ENOSPC;
}

/* writable, and room to change */
static int
can_change (struct thin_md *md, char *err)
{
  int r = writable (md, err);

  return r < 0 ? r : metadata_low (md, err);
}

/* --- value types ---------------------------------------------------- */

static int
bottom_inc (void *context, const uint8_t *v)
{
  struct thin_md *md = context;
  return pd_dsm_inc (&md->dsm, pd_le64 (v) >> 24);
}

static int
bottom_dec (void *context, const uint8_t *v)
{
  struct thin_md *md = context;
  return pd_dsm_dec (&md->dsm, pd_le64 (v) >> 24);
}

static int
top_inc (void *context, const uint8_t *v)
{
  struct thin_md *md = context;
  return pd_tm_inc (&md->tm, pd_le64 (v));
}

static int
top_dec (void *context, const uint8_t *v)
{
  struct thin_md *md = context;
  return pd_btree_del (&md->bottom, pd_le64 (v));
}

static void
init_trees (struct thin_md *md)
{
  md->bottom_vt = (struct pd_value_type) {
    .size = 8, .context = md, .inc = bottom_inc, .dec = bottom_dec,
    .name = "mapping tree",
  };
  md->top_vt = (struct pd_value_type) {
    .size = 8, .context = md, .inc = top_inc, .dec = top_dec,
    .name = "device mapping tree",
  };
  md->details_vt = (struct pd_value_type) {
    .size = DETAILS_SIZE, .name = "device details tree",
  };
  md->bottom = (struct pd_btree) { .tm = &md->tm, .vt = &md->bottom_vt };
  md->top = (struct pd_btree) { .tm = &md->tm, .vt = &md->top_vt };
  md->details = (struct pd_btree) { .tm = &md->tm, .vt = &md->details_vt };
}

/* --- superblock ------------------------------------------------------ */

static void
fill_superblock (struct thin_md *md, uint8_t *sb, bool with_sms)
{
  memset (sb, 0, PD_BLOCK_SIZE);
  pd_put32 (sb + SB_FLAGS, md->flags);
  memcpy (sb + SB_UUID, md->uuid, 16);
  pd_put64 (sb + SB_MAGIC, THIN_MAGIC);
  pd_put32 (sb + SB_VERSION, THIN_VERSION);
  pd_put32 (sb + SB_TIME, md->time);
  pd_put64 (sb + SB_TRANS_ID, md->trans_id);
  pd_put64 (sb + SB_MAPPING_ROOT, md->root);
  pd_put64 (sb + SB_DETAILS_ROOT, md->details_root);
  pd_put32 (sb + SB_DATA_BLOCK_SIZE, md->data_block_sectors);
  pd_put32 (sb + SB_META_BLOCK_SIZE, PD_BLOCK_SECTORS);
  pd_put64 (sb + SB_META_NR_BLOCKS, md->tm.sm.nr_blocks);
  if (with_sms) {
    pd_put64 (sb + SB_HELD_ROOT, md->held_root);
    pd_dsm_root (&md->dsm, sb + SB_DATA_SM);
  }
}

static void
load_superblock_fields (struct thin_md *md, const uint8_t *sb)
{
  md->flags = pd_le32 (sb + SB_FLAGS);
  memcpy (md->uuid, sb + SB_UUID, 16);
  md->time = pd_le32 (sb + SB_TIME);
  md->trans_id = pd_le64 (sb + SB_TRANS_ID);
  md->held_root = pd_le64 (sb + SB_HELD_ROOT);
  md->root = pd_le64 (sb + SB_MAPPING_ROOT);
  md->details_root = pd_le64 (sb + SB_DETAILS_ROOT);
}

static void
encode_details (uint8_t *v, const struct thin_md_dev *td)
{
  pd_put64 (v, td->mapped_blocks);
  pd_put64 (v + 8, td->transaction_id);
  pd_put32 (v + 16, td->creation_time);
  pd_put32 (v + 20, td->snapshotted_time);
}

static void
decode_details (const uint8_t *v, struct thin_md_dev_info *info)
{
  info->mapped_blocks = pd_le64 (v);
  info->transaction_id = pd_le64 (v + 8);
  info->creation_time = pd_le32 (v + 16);
  info->snapshotted_time = pd_le32 (v + 20);
}

/* dm's __commit_transaction: the changed details, the space maps, every
 * dirty block, flush, the superblock, flush.
 */
static int
commit_locked (struct thin_md *md)
{
  struct thin_md_dev **p;
  uint8_t *buf;
  int r;

  if (!md->changed)
    return 0;
  for (p = &md->devs; *p;) {
    struct thin_md_dev *td = *p;
    if (td->changed && !td->gone) {
      uint8_t v[DETAILS_SIZE];
      encode_details (v, td);
      r = pd_btree_insert (&md->details, &md->details_root, td->id, v,
                           false, NULL);
      if (r < 0)
        return fail (md, r);
      td->changed = false;
    }
    if (td->open_count == 0) {
      *p = td->next;
      free (td);
    }
    else
      p = &td->next;
  }
  buf = malloc (PD_BLOCK_SIZE);
  if (!buf)
    return fail (md, pd_error (&md->tm.bm, ENOMEM, "superblock: out of "
                               "memory"));
  fill_superblock (md, buf, true);
  if ((r = pd_msm_commit (&md->tm, buf + SB_META_SM)) < 0)
    goto out;
  pd_put64 (buf + SB_META_NR_BLOCKS, md->tm.sm.nr_blocks);
  if ((r = pd_tm_commit (&md->tm, PD_SUPERBLOCK, buf, md->committed)) < 0)
    goto out;
  pd_dsm_committed (&md->dsm);
  md->changed = false;
 out:
  free (buf);
  return fail (md, r);
}

static int
check_superblock (struct thin_md *md, const uint8_t *sb,
                  const struct thin_md_open_args *a)
{
  struct pd_bm *bm = &md->tm.bm;
  uint32_t v = pd_le32 (sb + SB_VERSION);
  uint32_t incompat = pd_le32 (sb + SB_INCOMPAT);
  uint32_t compat_ro = pd_le32 (sb + SB_COMPAT_RO);

  if (pd_le64 (sb + SB_MAGIC) != THIN_MAGIC)
    return pd_error (bm, EINVAL, "superblock: bad magic %llu (not thin-pool "
                     "metadata)", (unsigned long long) pd_le64 (sb + SB_MAGIC));
  if (v < 1 || v > THIN_VERSION)
    return pd_error (bm, EINVAL, "superblock: version %u not supported", v);
  if (incompat)
    return pd_error (bm, EINVAL, "superblock: unsupported incompatible "
                     "features 0x%x", incompat);
  if (compat_ro && !a->read_only)
    return pd_error (bm, EINVAL, "superblock: features 0x%x allow read-only "
                     "use only", compat_ro);
  if (pd_le32 (sb + SB_META_BLOCK_SIZE) != PD_BLOCK_SECTORS)
    return pd_error (bm, EINVAL, "superblock: metadata block size %u sectors, "
                     "expected %u", pd_le32 (sb + SB_META_BLOCK_SIZE),
                     PD_BLOCK_SECTORS);
  if (pd_le32 (sb + SB_DATA_BLOCK_SIZE) != a->data_block_sectors)
    return pd_error (bm, EINVAL, "superblock: data block size %u sectors, "
                     "table says %u", pd_le32 (sb + SB_DATA_BLOCK_SIZE),
                     a->data_block_sectors);
  return 0;
}

/* Load the space maps and fields from a committed superblock. */
static int
load (struct thin_md *md, const uint8_t *sb)
{
  int r;

  load_superblock_fields (md, sb);
  if ((r = pd_msm_open (&md->tm, sb + SB_META_SM, md->tm.bm.nr_blocks)) < 0)
    return r;
  if ((r = pd_dsm_open (&md->dsm, &md->tm, sb + SB_DATA_SM)) < 0)
    return r;
  pd_tm_end_transaction (&md->tm);
  memcpy (md->committed, sb, PD_BLOCK_SIZE);
  md->changed = false;
  return 0;
}

static int
format (struct thin_md *md, const struct thin_md_open_args *a)
{
  int r;

  if (a->read_only)
    return pd_error (&md->tm.bm, EROFS, "superblock: empty metadata device, "
                     "and read-only: cannot format it");
  md->flags = 0;
  memset (md->uuid, 0, 16);
  md->time = 0;
  md->trans_id = 0;
  md->held_root = 0;
  if ((r = pd_msm_format (&md->tm, md->tm.bm.nr_blocks)) < 0 ||
      (r = pd_dsm_format (&md->dsm, &md->tm, a->nr_data_blocks)) < 0 ||
      (r = pd_btree_empty (&md->top, &md->root)) < 0 ||
      (r = pd_btree_empty (&md->details, &md->details_root)) < 0)
    return r;
  md->changed = true;
  return commit_locked (md);
}

int
thin_md_open (const struct thin_md_open_args *a, struct thin_md **out,
              char *err)
{
  struct thin_md *md;
  struct pd_block *sb;
  uint8_t *raw = NULL;
  int r;

  if (a->dev->size < 16 * PD_BLOCK_SIZE) {
    if (err)
      snprintf (err, PD_ERR_LEN, "metadata device: %llu bytes, too small "
                "(at least 64 KiB)", (unsigned long long) a->dev->size);
    return -EINVAL;
  }
  md = calloc (1, sizeof *md);
  if (!md) {
    if (err)
      snprintf (err, PD_ERR_LEN, "thin-pool metadata: out of memory");
    return -ENOMEM;
  }
  {
    /* Lookups come from every request: a reader-preferring lock would
     * starve the commits.
     */
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init (&attr);
    pthread_rwlockattr_setkind_np (&attr,
                                   PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init (&md->lock, &attr);
    pthread_rwlockattr_destroy (&attr);
  }
  md->read_only = a->read_only;
  md->data_block_sectors = a->data_block_sectors;
  init_trees (md);
  if ((r = pd_bm_init (&md->tm.bm, a->dev, a->cache_blocks,
                       a->read_only)) < 0) {
    if (err)
      snprintf (err, PD_ERR_LEN, "thin-pool metadata: out of memory");
    free (md);
    return r;
  }

  raw = aligned_alloc (PD_BLOCK_SIZE, PD_BLOCK_SIZE);
  if (!raw) {
    r = pd_error (&md->tm.bm, ENOMEM, "thin-pool metadata: out of memory");
    goto err;
  }
  r = a->dev->ops->read (a->dev->opaque, 0, PD_BLOCK_SIZE, raw);
  if (r < 0) {
    r = pd_error (&md->tm.bm, -r, "superblock: read failed: %s",
                  strerror (-r));
    goto err;
  }
  if (pd_all_zero (raw, PD_BLOCK_SIZE)) {
    if ((r = format (md, a)) < 0)
      goto err;
  }
  else {
    if ((r = pd_bm_read (&md->tm.bm, 0, PD_SUPERBLOCK, &sb)) < 0)
      goto err;
    r = check_superblock (md, sb->data, a);
    if (r == 0)
      r = load (md, sb->data);
    pd_bm_put (&md->tm.bm, sb);
    if (r < 0)
      goto err;
    if (a->nr_data_blocks < md->dsm.nr_blocks) {
      r = pd_error (&md->tm.bm, EINVAL, "data device: %llu blocks, smaller "
                    "than the %llu the metadata maps",
                    (unsigned long long) a->nr_data_blocks,
                    (unsigned long long) md->dsm.nr_blocks);
      goto err;
    }
    if (!a->read_only &&
        (a->nr_data_blocks > md->dsm.nr_blocks ||
         md->tm.bm.nr_blocks > md->tm.sm.nr_blocks)) {
      /* the devices grew (dm's resize on load) */
      if ((r = pd_dsm_extend (&md->dsm, a->nr_data_blocks)) < 0 ||
          (r = pd_msm_extend (&md->tm, md->tm.bm.nr_blocks)) < 0)
        goto err;
      md->changed = md->tm.sm.nr_blocks != pd_le64 (md->committed + SB_META_SM) ||
        a->nr_data_blocks != pd_le64 (md->committed + SB_DATA_SM);
      if ((r = commit_locked (md)) < 0)
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
  pthread_rwlock_destroy (&md->lock);
  free (md);
  return r;
}

int
thin_md_close (struct thin_md *md, char *err)
{
  int r = 0;

  if (!md->read_only && !is_failed (md) && md->changed) {
    WRLOCK (md);
    r = commit_locked (md);
    UNLOCK (md);
    if (r < 0)
      copy_err (md, err);
  }
  while (md->devs) {
    struct thin_md_dev *td = md->devs;
    md->devs = td->next;
    free (td);
  }
  pd_msm_free (&md->tm.sm);
  pd_bm_destroy (&md->tm.bm);
  pthread_rwlock_destroy (&md->lock);
  free (md);
  return r;
}

int
thin_md_commit (struct thin_md *md, char *err)
{
  int r;

  WRLOCK (md);
  /* Failed metadata fails every commit, changed or not: the caller
   * would report durable what the last commit may not hold.
   */
  r = md->changed || is_failed (md) ? writable (md, err) : 0;
  if (r == 0 && (r = commit_locked (md)) < 0)
    copy_err (md, err);
  UNLOCK (md);
  return r;
}

int
thin_md_abort (struct thin_md *md, char *err)
{
  uint8_t *sb;
  int r = 0;

  WRLOCK (md);
  if (md->read_only || !md->changed)
    goto out;
  sb = malloc (PD_BLOCK_SIZE);
  if (!sb) {
    r = pd_error (&md->tm.bm, ENOMEM, "thin-pool metadata: out of memory");
    goto out;
  }
  memcpy (sb, md->committed, PD_BLOCK_SIZE);
  pd_bm_drop_dirty (&md->tm.bm);
  r = load (md, sb);
  free (sb);
  if (r < 0) {
    fail (md, r);
    goto out;
  }
  /* Open devices take their committed state back. */
  for (struct thin_md_dev **p = &md->devs; *p;) {
    struct thin_md_dev *td = *p;
    uint8_t d[DETAILS_SIZE], rv[8];
    struct thin_md_dev_info info;

    r = pd_btree_lookup (&md->details, md->details_root, td->id, d);
    if (r == 0)
      r = pd_btree_lookup (&md->top, md->root, td->id, rv);
    if (r == 0) {
      td->root = pd_le64 (rv);
      decode_details (d, &info);
      td->mapped_blocks = info.mapped_blocks;
      td->transaction_id = info.transaction_id;
      td->creation_time = info.creation_time;
      td->snapshotted_time = info.snapshotted_time;
      td->gone = false;
    }
    else
      td->gone = true;
    td->changed = false;
    r = 0;
    if (td->open_count == 0) {
      *p = td->next;
      free (td);
    }
    else
      p = &td->next;
  }
 out:
  if (r < 0)
    copy_err (md, err);
  UNLOCK (md);
  return r;
}

bool
thin_md_changed (struct thin_md *md)
{
  bool c;

  RDLOCK (md);
  c = md->changed;
  UNLOCK (md);
  return c;
}

/* --- devices --------------------------------------------------------- */

static struct thin_md_dev *
find_td (struct thin_md *md, uint64_t id)
{
  for (struct thin_md_dev *td = md->devs; td; td = td->next)
    if (td->id == id && !td->gone)
      return td;
  return NULL;
}

/* The device's td (existing or loaded from the details tree), not
 * opened: -ENODATA when there is no such device.
 */
static int
get_td (struct thin_md *md, uint64_t id, struct thin_md_dev **out)
{
  struct thin_md_dev *td = find_td (md, id);
  struct thin_md_dev_info info;
  uint8_t v[DETAILS_SIZE], rv[8];
  int r;

  if (td) {
    *out = td;
    return 0;
  }
  r = pd_btree_lookup (&md->details, md->details_root, id, v);
  if (r < 0)
    return r;
  r = pd_btree_lookup (&md->top, md->root, id, rv);
  if (r == -ENODATA)
    r = pd_error (&md->tm.bm, EIO, "device %llu: has details but no mapping "
                  "tree", (unsigned long long) id);
  if (r < 0)
    return r;
  td = calloc (1, sizeof *td);
  if (!td)
    return pd_error (&md->tm.bm, ENOMEM, "thin-pool metadata: out of memory");
  decode_details (v, &info);
  td->md = md;
  td->id = id;
  td->root = pd_le64 (rv);
  td->mapped_blocks = info.mapped_blocks;
  td->transaction_id = info.transaction_id;
  td->creation_time = info.creation_time;
  td->snapshotted_time = info.snapshotted_time;
  td->next = md->devs;
  md->devs = td;
  *out = td;
  return 0;
}

static int
check_new_id (struct thin_md *md, uint64_t id, char *err)
{
  struct thin_md_dev *td;
  int r;

  if (id > MAX_DEV_ID) {
    pd_error (&md->tm.bm, EINVAL, "device id %llu: over the maximum %llu",
              (unsigned long long) id, MAX_DEV_ID);
    copy_err (md, err);
    return -EINVAL;
  }
  r = get_td (md, id, &td);
  if (r == 0) {
    pd_error (&md->tm.bm, EEXIST, "device %llu: already exists",
              (unsigned long long) id);
    r = -EEXIST;
  }
  else if (r == -ENODATA)
    return 0;
  else
    fail (md, r);
  copy_err (md, err);
  return r;
}

static int
new_td (struct thin_md *md, uint64_t id, uint64_t root,
        struct thin_md_dev **out)
{
  struct thin_md_dev *td = calloc (1, sizeof *td);

  if (!td)
    return pd_error (&md->tm.bm, ENOMEM, "thin-pool metadata: out of memory");
  td->md = md;
  td->id = id;
  td->root = root;
  td->changed = true;
  td->transaction_id = md->trans_id;
  td->creation_time = td->snapshotted_time = md->time;
  td->next = md->devs;
  md->devs = td;
  *out = td;
  return 0;
}

int
thin_md_create_thin (struct thin_md *md, uint64_t dev_id, char *err)
{
  struct thin_md_dev *td;
  uint64_t root;
  uint8_t v[8];
  int r;

  WRLOCK (md);
  if ((r = can_change (md, err)) < 0 || (r = check_new_id (md, dev_id, err)) < 0)
    goto out;
  if ((r = pd_btree_empty (&md->bottom, &root)) < 0)
    goto failed;
  pd_put64 (v, root);
  if ((r = pd_btree_insert (&md->top, &md->root, dev_id, v, false, NULL)) < 0)
    goto failed;
  md->changed = true;
  if ((r = new_td (md, dev_id, root, &td)) < 0)
    goto failed;
  goto out;
 failed:
  fail (md, r);
  copy_err (md, err);
 out:
  UNLOCK (md);
  return r;
}

int
thin_md_create_snap (struct thin_md *md, uint64_t dev_id, uint64_t origin_id,
                     char *err)
{
  struct thin_md_dev *origin, *td;
  uint8_t v[8];
  int r;

  WRLOCK (md);
  if ((r = can_change (md, err)) < 0 || (r = check_new_id (md, dev_id, err)) < 0)
    goto out;
  r = get_td (md, origin_id, &origin);
  if (r == -ENODATA) {
    pd_error (&md->tm.bm, ENODATA, "origin device %llu: does not exist",
              (unsigned long long) origin_id);
    copy_err (md, err);
    goto out;
  }
  if (r < 0)
    goto failed;
  /* the snapshot shares the origin's whole tree: one more reference */
  if ((r = pd_tm_inc (&md->tm, origin->root)) < 0)
    goto failed;
  pd_put64 (v, origin->root);
  if ((r = pd_btree_insert (&md->top, &md->root, dev_id, v, false, NULL)) < 0)
    goto failed;
  md->changed = true;
  md->time++;
  if ((r = new_td (md, dev_id, origin->root, &td)) < 0)
    goto failed;
  origin->changed = true;
  origin->snapshotted_time = md->time;
  td->mapped_blocks = origin->mapped_blocks;
  td->snapshotted_time = md->time;
  goto out;
 failed:
  fail (md, r);
  copy_err (md, err);
 out:
  UNLOCK (md);
  return r;
}

int
thin_md_delete (struct thin_md *md, uint64_t dev_id, char *err)
{
  struct thin_md_dev *td, **p;
  int r;

  WRLOCK (md);
  if ((r = writable (md, err)) < 0)
    goto out;
  r = get_td (md, dev_id, &td);
  if (r == -ENODATA) {
    pd_error (&md->tm.bm, ENODATA, "device %llu: does not exist",
              (unsigned long long) dev_id);
    copy_err (md, err);
    goto out;
  }
  if (r < 0)
    goto failed;
  if (td->open_count) {
    r = pd_error (&md->tm.bm, EBUSY, "device %llu: is open",
                  (unsigned long long) dev_id);
    copy_err (md, err);
    goto out;
  }
  for (p = &md->devs; *p != td; p = &(*p)->next)
    ;
  *p = td->next;
  free (td);
  md->changed = true;
  r = pd_btree_remove (&md->details, &md->details_root, dev_id);
  if (r < 0 && r != -ENODATA)   /* not committed yet: no details */
    goto failed;
  if ((r = pd_btree_remove (&md->top, &md->root, dev_id)) < 0)
    goto failed;
  goto out;
 failed:
  fail (md, r);
  copy_err (md, err);
 out:
  UNLOCK (md);
  return r;
}

int
thin_md_get_transaction_id (struct thin_md *md, uint64_t *id)
{
  RDLOCK (md);
  *id = md->trans_id;
  UNLOCK (md);
  return 0;
}

int
thin_md_set_transaction_id (struct thin_md *md, uint64_t old_id,
                            uint64_t new_id, char *err)
{
  int r;

  WRLOCK (md);
  if ((r = writable (md, err)) < 0)
    goto out;
  if (md->trans_id != old_id) {
    r = pd_error (&md->tm.bm, EINVAL, "transaction id is %llu, not %llu",
                  (unsigned long long) md->trans_id,
                  (unsigned long long) old_id);
    copy_err (md, err);
    goto out;
  }
  md->trans_id = new_id;
  md->changed = true;
 out:
  UNLOCK (md);
  return r;
}

/* dm's __reserve_metadata_snap: commit, then a copy of the superblock
 * (without space maps) holding one more reference to both trees.
 */
int
thin_md_reserve_metadata_snap (struct thin_md *md, char *err)
{
  struct pd_block *copy;
  int r;

  WRLOCK (md);
  if ((r = can_change (md, err)) < 0)
    goto out;
  if (md->held_root) {
    r = pd_error (&md->tm.bm, EBUSY, "a metadata snapshot is already held "
                  "(block %llu): release it first",
                  (unsigned long long) md->held_root);
    copy_err (md, err);
    goto out;
  }
  if ((r = commit_locked (md)) < 0)
    goto failed;
  if ((r = pd_tm_new_block (&md->tm, PD_SUPERBLOCK, &copy)) < 0)
    goto failed;
  fill_superblock (md, copy->data, false);
  pd_put64 (copy->data + SB_BLOCKNR, copy->nr);
  md->held_root = copy->nr;
  pd_tm_put (&md->tm, copy);
  md->changed = true;
  if ((r = pd_tm_inc (&md->tm, md->root)) < 0 ||
      (r = pd_tm_inc (&md->tm, md->details_root)) < 0)
    goto failed;
  goto out;
 failed:
  fail (md, r);
  copy_err (md, err);
 out:
  UNLOCK (md);
  return r;
}

int
thin_md_release_metadata_snap (struct thin_md *md, char *err)
{
  struct pd_block *copy;
  uint64_t held, mroot, droot;
  int r;

  WRLOCK (md);
  if ((r = writable (md, err)) < 0)
    goto out;
  held = md->held_root;
  if (!held) {
    r = pd_error (&md->tm.bm, EINVAL, "no metadata snapshot held: nothing "
                  "to release");
    copy_err (md, err);
    goto out;
  }
  if ((r = pd_tm_read (&md->tm, held, PD_SUPERBLOCK, &copy)) < 0)
    goto failed;
  mroot = pd_le64 (copy->data + SB_MAPPING_ROOT);
  droot = pd_le64 (copy->data + SB_DETAILS_ROOT);
  pd_tm_put (&md->tm, copy);
  md->held_root = 0;
  md->changed = true;
  if ((r = pd_btree_del (&md->top, mroot)) < 0 ||
      (r = pd_btree_del (&md->details, droot)) < 0 ||
      (r = pd_tm_dec (&md->tm, held)) < 0)
    goto failed;
  goto out;
 failed:
  fail (md, r);
  copy_err (md, err);
 out:
  UNLOCK (md);
  return r;
}

int
thin_md_get_metadata_snap (struct thin_md *md, uint64_t *block)
{
  RDLOCK (md);
  *block = md->held_root;
  UNLOCK (md);
  return 0;
}

int
thin_md_dev_open (struct thin_md *md, uint64_t dev_id,
                  struct thin_md_dev **out, char *err)
{
  struct thin_md_dev *td;
  int r;

  WRLOCK (md);
  r = get_td (md, dev_id, &td);
  if (r == 0) {
    td->open_count++;
    *out = td;
  }
  else {
    if (r == -ENODATA)
      pd_error (&md->tm.bm, ENODATA, "device %llu: does not exist",
                (unsigned long long) dev_id);
    else
      fail (md, r);
    copy_err (md, err);
  }
  UNLOCK (md);
  return r;
}

void
thin_md_dev_close (struct thin_md_dev *td)
{
  struct thin_md *md = td->md;

  WRLOCK (md);
  if (--td->open_count == 0 && !td->changed) {
    struct thin_md_dev **p;
    for (p = &md->devs; *p != td; p = &(*p)->next)
      ;
    *p = td->next;
    free (td);
  }
  UNLOCK (md);
}

/* --- mappings -------------------------------------------------------- */

static int
decode_mapping (struct thin_md_dev *td, uint64_t vblock, const uint8_t *v,
                uint64_t *data_block, bool *shared)
{
  struct thin_md *md = td->md;
  uint64_t bt = pd_le64 (v);

  *data_block = bt >> 24;
  *shared = td->snapshotted_time > (uint32_t) (bt & 0xffffff);
  if (*data_block >= md->dsm.nr_blocks)
    return fail (md, pd_error (&md->tm.bm, EIO, "device %llu block %llu: "
                               "maps data block %llu, beyond the data "
                               "device (%llu blocks)",
                               (unsigned long long) td->id,
                               (unsigned long long) vblock,
                               (unsigned long long) *data_block,
                               (unsigned long long) md->dsm.nr_blocks));
  return 0;
}

int
thin_md_find_block (struct thin_md_dev *td, uint64_t vblock,
                    uint64_t *data_block, bool *shared)
{
  struct thin_md *md = td->md;
  uint8_t v[8];
  int r;

  RDLOCK (md);
  if (td->gone)
    r = -ENODATA;
  else if ((r = pd_btree_lookup (&md->bottom, td->root, vblock, v)) == 0)
    r = decode_mapping (td, vblock, v, data_block, shared);
  else
    fail (md, r);
  UNLOCK (md);
  return r;
}

struct range_scan {
  struct thin_md_dev *td;
  bool started;
  uint64_t vbegin, vend, data_begin;
  bool shared;
  int err;
};

static int
range_fn (void *opaque, uint64_t key, const uint8_t *v)
{
  struct range_scan *s = opaque;
  uint64_t data;
  bool shared;
  int r = decode_mapping (s->td, key, v, &data, &shared);

  if (r < 0) {
    s->err = r;
    return 1;
  }
  if (!s->started) {
    s->started = true;
    s->vbegin = key;
    s->vend = key + 1;
    s->data_begin = data;
    s->shared = shared;
    return 0;
  }
  if (key != s->vend || data != s->data_begin + (key - s->vbegin) ||
      shared != s->shared)
    return 1;
  s->vend++;
  return 0;
}

int
thin_md_find_mapped_range (struct thin_md_dev *td, uint64_t begin,
                           uint64_t end, uint64_t *vbegin, uint64_t *vend,
                           uint64_t *data_begin, bool *shared)
{
  struct thin_md *md = td->md;
  struct range_scan s = { .td = td };
  int r;

  if (begin >= end)
    return -ENODATA;
  RDLOCK (md);
  if (td->gone) {
    UNLOCK (md);
    return -ENODATA;
  }
  r = pd_btree_scan (&md->bottom, td->root, begin, end, range_fn, &s);
  UNLOCK (md);
  if (s.err)
    return s.err;
  if (r < 0)
    return fail (md, r);
  if (!s.started)
    return -ENODATA;
  *vbegin = s.vbegin;
  *vend = s.vend;
  *data_begin = s.data_begin;
  *shared = s.shared;
  return 0;
}

/* Before changing a device's subtree: shadow the top-level path to its
 * entry, so that a top-level node shared with a metadata snapshot is
 * copied first and the copy's reference to the subtree root counted (dm
 * goes through both levels top-down in one insert).
 */
static int
shadow_top (struct thin_md_dev *td)
{
  struct thin_md *md = td->md;
  uint8_t v[8];

  pd_put64 (v, td->root);
  return pd_btree_insert (&md->top, &md->root, td->id, v, true, NULL);
}

/* The device's subtree root moved: point the top-level tree at it (the
 * old root's reference went with the shadowing, so keep_old).
 */
static int
set_root (struct thin_md_dev *td, uint64_t root)
{
  if (root == td->root)
    return 0;
  td->root = root;
  return shadow_top (td);
}

int
thin_md_insert_block (struct thin_md_dev *td, uint64_t vblock,
                      uint64_t data_block)
{
  struct thin_md *md = td->md;
  uint64_t root = td->root;
  bool inserted;
  uint8_t v[8];
  int r;

  WRLOCK (md);
  if ((r = can_change (md, NULL)) < 0)
    goto out;
  if (td->gone || data_block >= md->dsm.nr_blocks || data_block >> 40) {
    r = pd_error (&md->tm.bm, EINVAL, "device %llu: cannot map block %llu to "
                  "data block %llu", (unsigned long long) td->id,
                  (unsigned long long) vblock,
                  (unsigned long long) data_block);
    goto out;
  }
  md->changed = true;
  pd_put64 (v, data_block << 24 | (md->time & 0xffffff));
  r = shadow_top (td);
  if (r == 0)
    r = pd_btree_insert (&md->bottom, &root, vblock, v, false, &inserted);
  if (r == 0)
    r = set_root (td, root);
  if (r < 0) {
    fail (md, r);
    goto out;
  }
  if (inserted)
    td->mapped_blocks++;
  td->changed = true;
 out:
  UNLOCK (md);
  return r;
}

int
thin_md_remove_range (struct thin_md_dev *td, uint64_t begin, uint64_t end)
{
  struct thin_md *md = td->md;
  uint64_t root = td->root, key;
  uint8_t v[8];
  int r, low = 0;

  WRLOCK (md);
  if ((r = writable (md, NULL)) < 0 || td->gone)
    goto out;
  while (begin < end) {
    r = pd_btree_lookup_ge (&md->bottom, root, begin, &key, v);
    if (r == -ENODATA || (r == 0 && key >= end)) {
      r = 0;
      break;
    }
    if (r == 0 && (low = metadata_low (md, NULL)) < 0)
      break;                      /* what is removed so far stays so */
    if (r == 0 && !md->changed)
      md->changed = true;
    if (r == 0 && root == td->root)
      r = shadow_top (td);        /* first removal */
    if (r == 0)
      r = pd_btree_remove (&md->bottom, &root, key);
    if (r < 0)
      break;
    td->mapped_blocks--;
    td->changed = true;
    begin = key + 1;
  }
  if (r == 0)
    r = set_root (td, root);
  fail (md, r);
  if (r == 0)
    r = low;
 out:
  UNLOCK (md);
  return r;
}

int
thin_md_alloc_data_block (struct thin_md *md, uint64_t *block)
{
  int r;

  WRLOCK (md);
  if ((r = can_change (md, NULL)) == 0) {
    r = pd_dsm_new_block (&md->dsm, block);
    if (r == 0)
      md->changed = true;
    else if (r == -ENOSPC)
      pd_error (&md->tm.bm, ENOSPC, "data device full (%llu blocks)",
                (unsigned long long) md->dsm.nr_blocks);
    else
      fail (md, r);
  }
  UNLOCK (md);
  return r;
}

int
thin_md_dev_mapped_count (struct thin_md_dev *td, uint64_t *count)
{
  RDLOCK (td->md);
  *count = td->gone ? 0 : td->mapped_blocks;
  UNLOCK (td->md);
  return 0;
}

int
thin_md_dev_highest_mapped (struct thin_md_dev *td, uint64_t *vblock)
{
  struct thin_md *md = td->md;
  int r;

  RDLOCK (md);
  r = td->gone ? -ENODATA : pd_btree_highest (&md->bottom, td->root, vblock);
  UNLOCK (md);
  return fail (md, r);
}

/* --- pool status ----------------------------------------------------- */

int
thin_md_get_free_data_blocks (struct thin_md *md, uint64_t *n)
{
  RDLOCK (md);
  *n = md->dsm.nr_blocks - md->dsm.nr_allocated;
  UNLOCK (md);
  return 0;
}

int
thin_md_get_data_dev_size (struct thin_md *md, uint64_t *blocks)
{
  RDLOCK (md);
  *blocks = md->dsm.nr_blocks;
  UNLOCK (md);
  return 0;
}

int
thin_md_get_free_metadata_blocks (struct thin_md *md, uint64_t *n)
{
  RDLOCK (md);
  *n = md->tm.sm.nr_blocks - md->tm.sm.nr_allocated;
  UNLOCK (md);
  return 0;
}

int
thin_md_get_metadata_dev_size (struct thin_md *md, uint64_t *blocks)
{
  RDLOCK (md);
  *blocks = md->tm.sm.nr_blocks;
  UNLOCK (md);
  return 0;
}

int
thin_md_resize_data_dev (struct thin_md *md, uint64_t nr_blocks, char *err)
{
  int r;

  WRLOCK (md);
  if ((r = can_change (md, err)) < 0)
    goto out;
  if (nr_blocks < md->dsm.nr_blocks) {
    r = pd_error (&md->tm.bm, EINVAL, "data device: cannot shrink from %llu "
                  "to %llu blocks", (unsigned long long) md->dsm.nr_blocks,
                  (unsigned long long) nr_blocks);
    copy_err (md, err);
    goto out;
  }
  if (nr_blocks == md->dsm.nr_blocks)
    goto out;
  md->changed = true;
  if ((r = pd_dsm_extend (&md->dsm, nr_blocks)) < 0) {
    fail (md, r);
    copy_err (md, err);
  }
 out:
  UNLOCK (md);
  return r;
}

bool
thin_md_needs_check (struct thin_md *md)
{
  bool b;

  RDLOCK (md);
  b = md->flags & NEEDS_CHECK_FLAG;
  UNLOCK (md);
  return b;
}

/* Written at once into the committed superblock: the metadata may be
 * too damaged for another commit.
 */
int
thin_md_set_needs_check (struct thin_md *md)
{
  struct pd_block *sb;
  int r = 0;

  WRLOCK (md);
  md->flags |= NEEDS_CHECK_FLAG;
  if (md->read_only) {
    r = -EROFS;
    goto out;
  }
  if (pd_le32 (md->committed + SB_FLAGS) & NEEDS_CHECK_FLAG)
    goto out;
  if ((r = pd_bm_new (&md->tm.bm, 0, PD_SUPERBLOCK, &sb)) < 0)
    goto out;
  pd_put32 (md->committed + SB_FLAGS,
            pd_le32 (md->committed + SB_FLAGS) | NEEDS_CHECK_FLAG);
  memcpy (sb->data, md->committed, PD_BLOCK_SIZE);
  r = pd_bm_write_sync (&md->tm.bm, sb);
  pd_bm_put (&md->tm.bm, sb);
 out:
  UNLOCK (md);
  return r;
}

bool
thin_md_failed (struct thin_md *md)
{
  return is_failed (md);
}

void
thin_md_last_error (struct thin_md *md, char *err)
{
  copy_err (md, err);
}

uint32_t
thin_md_get_time (struct thin_md *md)
{
  uint32_t t;

  RDLOCK (md);
  t = md->time;
  UNLOCK (md);
  return t;
}

struct dev_list {
  struct thin_md_dev_info *v;
  size_t n, cap;
};

static int
list_add (struct dev_list *l, const struct thin_md_dev_info *info)
{
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    struct thin_md_dev_info *v = realloc (l->v, cap * sizeof *v);
    if (!v)
      return -ENOMEM;
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = *info;
  return 0;
}

static int
details_fn (void *opaque, uint64_t key, const uint8_t *v)
{
  struct thin_md_dev_info info = { .dev_id = key };

  decode_details (v, &info);
  return list_add (opaque, &info) < 0 ? -ENOMEM : 0;
}

static int
cmp_info (const void *a, const void *b)
{
  const struct thin_md_dev_info *x = a, *y = b;
  return x->dev_id < y->dev_id ? -1 : x->dev_id > y->dev_id;
}

int
thin_md_list_devices (struct thin_md *md,
                      int (*fn) (void *, const struct thin_md_dev_info *),
                      void *opaque)
{
  struct dev_list l = { 0 };
  int r;

  RDLOCK (md);
  r = pd_btree_walk_nodes (&md->details, md->details_root, details_fn, NULL,
                           &l, NULL);
  for (struct thin_md_dev *td = md->devs; r == 0 && td; td = td->next) {
    struct thin_md_dev_info info = {
      .dev_id = td->id, .mapped_blocks = td->mapped_blocks,
      .transaction_id = td->transaction_id,
      .creation_time = td->creation_time,
      .snapshotted_time = td->snapshotted_time,
    };
    size_t i;
    if (td->gone)
      continue;
    for (i = 0; i < l.n && l.v[i].dev_id != td->id; i++)
      ;
    if (i < l.n)
      l.v[i] = info;
    else
      r = list_add (&l, &info);
  }
  UNLOCK (md);
  if (r == 0 && l.n) {
    qsort (l.v, l.n, sizeof *l.v, cmp_info);
    for (size_t i = 0; i < l.n && r == 0; i++)
      r = fn (opaque, &l.v[i]);
  }
  free (l.v);
  return r < 0 && r != -ENOMEM ? fail (md, r) : r;
}

/* --- data block references (discard passdown, failed writes) --------- */

static int
data_range (struct thin_md *md, uint64_t begin, uint64_t end, bool inc)
{
  int r;

  WRLOCK (md);
  if ((r = inc ? can_change (md, NULL) : writable (md, NULL)) < 0)
    goto out;
  if (begin > end || end > md->dsm.nr_blocks) {
    r = pd_error (&md->tm.bm, EINVAL, "data blocks %llu-%llu: beyond the "
                  "data device (%llu blocks)", (unsigned long long) begin,
                  (unsigned long long) end,
                  (unsigned long long) md->dsm.nr_blocks);
    goto out;
  }
  for (uint64_t b = begin; b < end && r == 0; b++) {
    uint32_t c;
    if ((r = pd_dsm_count (&md->dsm, b, &c)) < 0)
      break;
    if (!inc && c == 0) {
      /* the caller's mistake, not damage: change nothing more */
      r = pd_error (&md->tm.bm, EINVAL, "data block %llu: released but "
                    "not in use", (unsigned long long) b);
      goto out;
    }
    md->changed = true;
    r = inc ? pd_dsm_inc (&md->dsm, b) : pd_dsm_dec (&md->dsm, b);
  }
  fail (md, r);
 out:
  UNLOCK (md);
  return r;
}

int
thin_md_release_data_block (struct thin_md *md, uint64_t block)
{
  return data_range (md, block, block + 1, false);
}

int
thin_md_inc_data_range (struct thin_md *md, uint64_t begin, uint64_t end)
{
  return data_range (md, begin, end, true);
}

int
thin_md_dec_data_range (struct thin_md *md, uint64_t begin, uint64_t end)
{
  return data_range (md, begin, end, false);
}

int
thin_md_block_is_shared (struct thin_md *md, uint64_t block, bool *shared)
{
  uint32_t c;
  int r;

  RDLOCK (md);
  r = pd_dsm_count (&md->dsm, block, &c);
  UNLOCK (md);
  if (r < 0)
    return fail (md, r);
  *shared = c > 1;
  return 0;
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* thin <pool dev> <dev id> [<external origin dev>]
 *
 * dm-thin's thin target: a virtual device of the pool on mapper:POOL
 * (thin-pool.c), whose blocks are provisioned from the pool's data
 * device on first write.
 *
 * - Reads look each run of blocks up (the metadata library's cache,
 *   under its shared lock) and emit one clone per mapped run to
 *   mapper:POOL at the data block's offset, pointing into the client's
 *   buffer; unmapped runs read as zeros, or from the external origin
 *   (same offsets; zeros past its end).
 * - A write to a mapped, unshared block is a clone too.  A write to an
 *   unprovisioned block, or to one shared with a snapshot, is done in
 *   map() (io_sync), under the block's cell lock: allocate a data block;
 *   fill what the write does not cover (a copy of the shared block or of
 *   the external origin, else zeros unless skip_block_zeroing); write;
 *   insert the mapping.  Those writes go to the pool's data backend
 *   directly, so that none waits on the pool device's gate while it
 *   holds the pool's commit lock shared.
 * - Write zeroes: unmapped blocks without an external origin already
 *   read as zeros and stay unprovisioned.
 * - Discard unmaps whole blocks, and passes the data blocks that nothing
 *   else references (another volume, a held metadata snapshot) down to
 *   the data device unless ignore_discard or no_discard_passdown.
 * - A FUA write is done synchronously and commits the pool's metadata,
 *   and so does a flush (thin_flush).
 * - Extents: unprovisioned runs are holes (without an external origin,
 *   the origin's extents there), so copies of a thin volume stay sparse.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "target.h"
#include "util.h"
#include "thin.h"

struct thin_c {
  struct pool *pool;
  struct backend *pool_be;      /* mapper:POOL */
  struct backend *origin_be;    /* NULL: none */
  uint64_t origin_size;
  uint64_t dev_id;
  struct thin_md_dev *td;
};

#define COPY_CHUNK (1024 * 1024)

/* A lookup failed (not "unmapped"): the metadata is damaged or cannot
 * be read, and the pool goes read-only (dm's metadata_operation_failed).
 */
static int
lookup_failed (struct thin_c *tc, int r)
{
  pool_md_failed (tc->pool, "mapping lookup", r, NULL);
  return -EIO;
}

/* --- reads ------------------------------------------------------------ */

/* Unmapped [pos, end) of a read: the origin's data, or zeros. */
static int
read_unmapped (struct thin_c *tc, struct io_req *req, uint64_t off,
               uint64_t pos, uint64_t end, char *buf)
{
  if (tc->origin_be && pos < tc->origin_size) {
    uint64_t oend = MIN (end, tc->origin_size);
    int r = io_emit (req, tc->origin_be, pos, oend - pos, buf + (pos - off));
    if (r < 0)
      return r;
    pos = oend;
  }
  if (pos < end)
    memset (buf + (pos - off), 0, end - pos);
  return 0;
}

/* A fast-path clone is done (struct pool's io_epoch). */
static int
thin_io_done (struct clone *c, void *ctx, uint64_t slot, int error)
{
  pool_io_exit (ctx, slot);
  (void) c;
  return error;
}

static int
thin_read (struct thin_c *tc, struct io_req *req, uint64_t off, uint64_t len,
           char *buf)
{
  struct pool *p = tc->pool;
  const uint64_t bs = p->block_bytes;
  uint64_t pos = off, end = off + len;
  uint64_t vend = DIV_ROUND_UP (end, bs);

  while (pos < end) {
    uint64_t vb, ve, db, run_end;
    bool shared;
    /* Counted from before the lookup until the clone is done. */
    unsigned slot = pool_io_enter (p);
    int r;

    r = thin_md_find_mapped_range (tc->td, pos / bs, vend, &vb, &ve, &db,
                                   &shared);
    if (r < 0)
      pool_io_exit (p, slot);
    if (r == -ENODATA)
      return read_unmapped (tc, req, off, pos, end, buf);
    if (r < 0)
      return lookup_failed (tc, r);
    if (vb * bs > pos) {
      if ((r = read_unmapped (tc, req, off, pos, vb * bs, buf)) < 0) {
        pool_io_exit (p, slot);
        return r;
      }
      pos = vb * bs;
    }
    run_end = MIN (end, ve * bs);
    r = io_emit_end_io (req, tc->pool_be, db * bs + (pos - vb * bs),
                        run_end - pos, buf + (pos - off), thin_io_done, p,
                        slot);
    if (r < 0) {
      pool_io_exit (p, slot);
      return r;
    }
    pos = run_end;
  }
  return 0;
}

/* --- provisioning ----------------------------------------------------- */

/* Copy [from, from+len) of src to [to, to+len) of dst. */
static int
copy_range (struct backend *src, uint64_t from, struct backend *dst,
            uint64_t to, uint64_t len)
{
  char *b = bounce_get (MIN (len, COPY_CHUNK));
  int r = 0;

  if (b == NULL)
    return -ENOMEM;
  while (len > 0 && r == 0) {
    uint64_t n = MIN (len, COPY_CHUNK);
    r = io_sync (IO_READ, src, from, n, b, 0);
    if (r == 0)
      r = io_sync (IO_WRITE, dst, to, n, b, 0);
    from += n, to += n, len -= n;
  }
  bounce_put (b);
  return r;
}

/* Fill [boff, boff+len) of the new data block nb (in block bytes) with
 * what vblock read before the write: the old shared block old (mapped),
 * the external origin, or zeros (zero_new_blocks).
 */
static int
fill_new_block (struct thin_c *tc, struct backend *data, uint64_t vblock,
                bool mapped, uint64_t old, uint64_t nb, uint64_t boff,
                uint64_t len)
{
  const uint64_t bs = tc->pool->block_bytes;
  uint64_t vpos = vblock * bs + boff;

  if (len == 0)
    return 0;
  if (mapped)
    return copy_range (data, old * bs + boff, data, nb * bs + boff, len);
  if (tc->origin_be && vpos < tc->origin_size) {
    uint64_t n = MIN (len, tc->origin_size - vpos);
    int r = copy_range (tc->origin_be, vpos, data, nb * bs + boff, n);
    if (r < 0)
      return r;
    boff += n, len -= n;
    if (len == 0)
      return 0;
  }
  if (!atomic_load (&tc->pool->zero_new_blocks))
    return 0;
  return io_sync (IO_ZERO, data, nb * bs + boff, len, NULL, 0);
}

/* The piece [boff, boff+len) of vblock of a write (op IO_WRITE, buf) or
 * write zeroes (IO_ZERO) that cannot go straight to a mapped unshared
 * block: provision or break sharing (dm's provision_block and
 * break_sharing), under the block's cell so that concurrent writes to it
 * do it once.
 */
static int
thin_provision (struct thin_c *tc, enum io_op op, uint64_t vblock,
                uint64_t boff, uint64_t len, char *buf)
{
  struct pool *p = tc->pool;
  const uint64_t bs = p->block_bytes;
  pthread_mutex_t *cell = pool_cell (p, tc->dev_id, vblock);
  uint64_t old = 0, nb, gen, deadline = 0, asked = 0;
  bool shared = false, mapped;
  int r;

 again:
  if ((r = pool_wait_running (p)) < 0)
    return r;
  pthread_mutex_lock (cell);
  pthread_rwlock_rdlock (&p->commit_rw);
  if (pool_suspended (p)) {
    /* Suspended since pool_wait_running: its postsuspend waits for
     * this lock's holders, and nothing goes to the data device now.
     */
    pthread_rwlock_unlock (&p->commit_rw);
    pthread_mutex_unlock (cell);
    goto again;
  }
  r = thin_md_find_block (tc->td, vblock, &old, &shared);
  if (r < 0 && r != -ENODATA) {
    r = lookup_failed (tc, r);
    goto out;
  }
  mapped = r == 0;
  if (mapped && !shared) {
    /* Another write provisioned it while this one waited for the cell
     * (commit_rw shared: no commit, so no reuse, before it is done).
     */
    r = io_sync (op, p->data_be, old * bs + boff, len, buf, 0);
    goto out;
  }
  if (!mapped && op == IO_ZERO && tc->origin_be == NULL) {
    r = 0;                      /* reads as zeros already */
    goto out;
  }
  r = pool_alloc_block (p, &nb, &gen);
  if (r == -EAGAIN) {
    /* Queued for space: wait holding no cell (it would hold up every
     * block hashed to it) and no commit_rw (a reload binds under it).
     * Another write may provision the block meanwhile: look again.
     */
    pthread_rwlock_unlock (&p->commit_rw);
    pthread_mutex_unlock (cell);
    if ((r = pool_wait_space (p, gen, &deadline, &asked)) < 0)
      return r;
    goto again;
  }
  if (r < 0)
    goto out;
  /* The rest of the block, unless the write covers it. */
  r = fill_new_block (tc, p->data_be, vblock, mapped, old, nb, 0, boff);
  if (r == 0)
    r = fill_new_block (tc, p->data_be, vblock, mapped, old, nb, boff + len,
                        bs - boff - len);
  if (r == 0)
    r = io_sync (op, p->data_be, nb * bs + boff, len, buf, 0);
  if (r < 0) {
    /* The data did not land: give the block back, unmapped. */
    int rr = thin_md_release_data_block (p->md, nb);
    if (rr < 0)
      pool_md_failed (p, "releasing a data block", rr, NULL);
    goto out;
  }
  r = thin_md_insert_block (tc->td, vblock, nb);
  if (r < 0) {
    pool_md_failed (p, "inserting a mapping", r, NULL);
    r = -EIO;
  }
  else if (mapped)
    /* The shared block lost a reference: if the sharer is deleted
     * before the commit, it is free, and fast-path reads of it may
     * still be in flight.
     */
    pool_released (p);

 out:
  pthread_rwlock_unlock (&p->commit_rw);
  pthread_mutex_unlock (cell);
  return r;
}

/* Writes and write zeroes, block by block.  FUA: every piece here, then
 * a commit (dm commits for a FUA bio when the device changed).
 */
static int
thin_write (struct thin_c *tc, struct io_req *req, enum io_op op,
            uint64_t off, uint64_t len, char *buf)
{
  struct pool *p = tc->pool;
  const uint64_t bs = p->block_bytes;
  uint32_t flags = io_req_flags (req);
  bool fua = flags & MAPPER_FUA;
  uint64_t pos = off, end = off + len;
  int r;

  while (pos < end) {
    uint64_t vb = pos / bs, boff = pos - vb * bs;
    uint64_t n = MIN (end - pos, bs - boff), db;
    char *pbuf = buf_at (buf, pos - off);
    bool shared;
    /* Counted from before the lookup (struct pool's io_epoch). */
    unsigned slot = pool_io_enter (p);

    r = thin_md_find_block (tc->td, vb, &db, &shared);
    if (r < 0 && r != -ENODATA) {
      pool_io_exit (p, slot);
      return lookup_failed (tc, r);
    }
    if (r == 0 && !shared && !fua) {
      /* ... until the clone is done. */
      r = io_emit_end_io (req, tc->pool_be, db * bs + boff, n, pbuf,
                          thin_io_done, p, slot);
      if (r < 0)
        pool_io_exit (p, slot);
    }
    else if (r == 0 && !shared) {
      r = io_sync (op, tc->pool_be, db * bs + boff, n, pbuf, 0);
      pool_io_exit (p, slot);
    }
    else {
      pool_io_exit (p, slot);
      if (pool_mode (p) == PM_READ_ONLY || pool_mode (p) == PM_FAIL)
        r = -EIO;
      else
        r = thin_provision (tc, op, vb, boff, n, pbuf);
    }
    if (r < 0)
      return r;
    pos += n;
  }
  return fua ? pool_commit (p) : 0;
}

/* --- discard ---------------------------------------------------------- */

/* Unmap [vb, ve), mapped to data blocks from db on, and trim on the data
 * device the blocks nothing else references: not another volume, nor a
 * held metadata snapshot, whose tree the removal shadows (dm's
 * process_discard_cell_passdown: hold the run's blocks, remove, ask the
 * space map, pass down, let go).  Passdown errors are not the client's:
 * the data is unmapped either way.
 */
static int
discard_passdown (struct thin_c *tc, uint64_t vb, uint64_t ve, uint64_t db)
{
  struct thin_md *md = tc->pool->md;
  const uint64_t bs = tc->pool->block_bytes, de = db + (ve - vb);
  uint64_t run = de;
  int r;

  if ((r = thin_md_inc_data_range (md, db, de)) < 0)
    return r;
  r = thin_md_remove_range (tc->td, vb, ve);
  for (uint64_t d = db; r == 0 && d <= de; d++) {
    bool shared = true;
    if (d < de && (r = thin_md_block_is_shared (md, d, &shared)) < 0)
      break;
    if (!shared && run == de)
      run = d;                  /* a run of unshared blocks starts */
    else if (shared && run < de) {
      io_sync (IO_TRIM, tc->pool->data_be, run * bs, (d - run) * bs, NULL,
               0);
      run = de;
    }
  }
  if (thin_md_dec_data_range (md, db, de) < 0 && r == 0)
    r = -EIO;
  return r;
}

static int
thin_discard (struct thin_c *tc, uint64_t off, uint64_t len)
{
  struct pool *p = tc->pool;
  const uint64_t bs = p->block_bytes;
  uint64_t b = DIV_ROUND_UP (off, bs), e = (off + len) / bs;
  int r = 0;

  /* Partial blocks stay as they are: a discard is advisory. */
  if (!atomic_load (&p->discard_enabled) || b >= e)
    return 0;
  if (pool_mode (p) == PM_READ_ONLY || pool_mode (p) == PM_FAIL)
    return -EIO;
  /* Shared: a block released here cannot be reused (that needs a
   * commit) before its passdown is done; suspended meanwhile, wait
   * (thin_provision).
   */
  for (;;) {
    if ((r = pool_wait_running (p)) < 0)
      return r;
    pthread_rwlock_rdlock (&p->commit_rw);
    if (!pool_suspended (p))
      break;
    pthread_rwlock_unlock (&p->commit_rw);
  }
  while (b < e) {
    uint64_t vb, ve, db;
    bool shared;

    r = thin_md_find_mapped_range (tc->td, b, e, &vb, &ve, &db, &shared);
    if (r == -ENODATA) {
      r = 0;
      break;
    }
    if (r == 0)
      r = atomic_load (&p->discard_passdown)
        ? discard_passdown (tc, vb, ve, db)
        : thin_md_remove_range (tc->td, vb, ve);
    if (r < 0) {
      pool_md_failed (p, "removing mappings", r, NULL);
      r = -EIO;
      break;
    }
    /* The next commit waits for fast-path I/O to them first. */
    pool_released (p);
    b = ve;
  }
  pthread_rwlock_unlock (&p->commit_rw);
  return r;
}

static int
thin_map (struct target *ti, struct io_req *req, uint64_t off, uint64_t len,
          char *buf)
{
  struct thin_c *tc = ti->private;

  if (pool_mode (tc->pool) == PM_FAIL)
    return -EIO;
  switch (io_req_op (req)) {
  case IO_READ:
    return thin_read (tc, req, off, len, buf);
  case IO_WRITE:
    return thin_write (tc, req, IO_WRITE, off, len, buf);
  case IO_ZERO:
    return thin_write (tc, req, IO_ZERO, off, len, NULL);
  case IO_TRIM:
    return thin_discard (tc, off, len);
  default:
    return -EINVAL;
  }
}

/* A flush of the thin device commits the pool (dm: a REQ_PREFLUSH bio
 * to a thin device waits for the pool's commit).  Not left to the flush
 * of mapper:POOL that follows: provisioning writes go to the data
 * backend directly, so that backend may look clean to the thin table's
 * flush.
 */
static int
thin_flush (struct target *ti, struct io_req *req)
{
  struct thin_c *tc = ti->private;

  return pool_commit (tc->pool);
}

/* A new table for the pool device must keep this thin's pool: a
 * thin-pool on another metadata device is another pool, whose data
 * device the thin's clones through mapper:POOL would then reach at
 * offsets of this pool's blocks (dm keys pools by device and refuses
 * such a table at load).
 */
static int
thin_check_lower (struct target *ti, struct backend *be,
                  const struct table *t, struct mapper_err *err)
{
  struct thin_c *tc = ti->private;

  if (be != tc->pool_be ||
      target_table_find (t, "thin-pool", pool_is_peer, tc->pool) > 0)
    return 0;
  mapper_err_set (err, "thin volume %" PRIu64 " of the pool on metadata "
                  "device %s needs that pool on %s, and the new table has "
                  "no thin-pool on that metadata device: remove the thin "
                  "devices first", tc->dev_id, backend_name (tc->pool->md_be),
                  backend_name (be));
  return -EBUSY;
}

/* --- extents ---------------------------------------------------------- */

static int
extents_unmapped (struct thin_c *tc, struct extent_walk *w,
                  struct target *ti, uint64_t pos, uint64_t end)
{
  int r;

  if (tc->origin_be && pos < tc->origin_size) {
    uint64_t oend = MIN (end, tc->origin_size);
    r = extent_walk_backend (w, ti, pos, tc->origin_be, pos, oend - pos);
    if (r < 0 || extent_walk_done (w))
      return r;
    pos = oend;
  }
  if (pos >= end)
    return 0;
  return extent_walk_add (w, ti, pos, end - pos,
                          MAPPER_EXTENT_HOLE | MAPPER_EXTENT_ZERO);
}

static int
thin_extents (struct target *ti, struct extent_walk *w, uint64_t off,
              uint64_t len)
{
  struct thin_c *tc = ti->private;
  const uint64_t bs = tc->pool->block_bytes;
  uint64_t pos = off, end = off + len, vend = DIV_ROUND_UP (end, bs);
  int r = 0;

  while (pos < end && !extent_walk_done (w)) {
    uint64_t vb, ve, db, run_end;
    bool shared;

    r = thin_md_find_mapped_range (tc->td, pos / bs, vend, &vb, &ve, &db,
                                   &shared);
    if (r == -ENODATA)
      return extents_unmapped (tc, w, ti, pos, end);
    if (r < 0)
      return extent_walk_data (w, ti, end);
    if (vb * bs > pos) {
      r = extents_unmapped (tc, w, ti, pos, vb * bs);
      if (r < 0 || extent_walk_done (w))
        return r;
      pos = vb * bs;
    }
    run_end = MIN (end, ve * bs);
    r = extent_walk_add (w, ti, pos, run_end - pos, 0);
    if (r < 0)
      return r;
    pos = run_end;
  }
  return r;
}

/* --- status ----------------------------------------------------------- */

/* dm: <nr mapped sectors> <highest mapped sector>, "-" if none; Fail. */
static size_t
thin_status (struct target *ti, enum status_type type, char *buf,
             size_t len)
{
  struct thin_c *tc = ti->private;
  size_t used = 0;

  if (type == STATUSTYPE_INFO) {
    uint64_t mapped = 0, highest = 0;
    int r;

    if (pool_mode (tc->pool) == PM_FAIL) {
      EMIT ("Fail");
      return used;
    }
    /* dm's thin_status says Error when it cannot tell (a mapping tree
     * block that does not read back), "-" only when nothing is mapped.
     */
    if (thin_md_dev_mapped_count (tc->td, &mapped) < 0 ||
        ((r = thin_md_dev_highest_mapped (tc->td, &highest)) < 0 &&
         r != -ENODATA)) {
      EMIT ("Error");
      return used;
    }
    EMIT ("%" PRIu64 " ", mapped * tc->pool->block_sectors);
    if (r == 0)
      EMIT ("%" PRIu64, (highest + 1) * tc->pool->block_sectors - 1);
    else
      EMIT ("-");
    return used;
  }
  EMIT ("%s %" PRIu64, backend_name (tc->pool_be), tc->dev_id);
  if (tc->origin_be)
    EMIT (" %s", backend_name (tc->origin_be));
  return used;
}

/* --- constructor ------------------------------------------------------ */

static void
thin_dtr (struct target *ti)
{
  struct thin_c *tc = ti->private;

  if (tc == NULL)
    return;
  if (tc->td)
    thin_md_dev_close (tc->td);
  if (tc->pool)
    pool_put (tc->pool);
  free (tc);
}

static const struct target_arg dev_id_arg = { "device id", NULL, 0,
                                              0xffffff };

static int
thin_ctr (struct target *ti, unsigned argc, char **argv,
          struct mapper_err *err)
{
  struct target_args as = { argc, argv };
  char perr[PD_ERR_LEN] = "";
  const char *pool_spec, *origin_spec;
  struct thin_c *tc;
  int r;

  if (argc < 2 || argc > 3) {
    mapper_err_set (err, "expected <pool dev> <dev id> [<external origin "
                    "dev>], got %u argument%s", argc, argc == 1 ? "" : "s");
    return -EINVAL;
  }
  pool_spec = target_shift_arg (&as);
  if (strncmp (pool_spec, "mapper:", 7) != 0) {
    mapper_err_set (err, "pool device '%s' is not a device of this server "
                    "(mapper:POOL, whose table is a thin-pool)", pool_spec);
    return -EINVAL;
  }
  tc = calloc (1, sizeof *tc);
  if (tc == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  ti->private = tc;
  if ((r = target_read_arg (&dev_id_arg, &as, &tc->dev_id, err)) < 0)
    goto fail;
  origin_spec = target_shift_arg (&as);

  /* The pool device: a holder of it (it cannot be removed under us),
   * and its live thin-pool target's pool object.
   */
  r = target_get_backend (ti, pool_spec, 0, 0, &tc->pool_be, err);
  if (r < 0) {
    mapper_err_prefix (err, "pool device");
    goto fail;
  }
  r = target_find_peer (tc->pool_be, "thin-pool", pool_bind_peer,
                        &tc->pool);
  if (r < 0) {
    mapper_err_set (err, "pool device %s has no live thin-pool target",
                    pool_spec);
    r = -EINVAL;
    goto fail;
  }
  if (pool_mode (tc->pool) == PM_FAIL) {
    mapper_err_set (err, "pool %s is in fail mode", pool_spec);
    r = -EIO;
    goto fail;
  }
  r = thin_md_dev_open (tc->pool->md, tc->dev_id, &tc->td, perr);
  if (r == -ENODATA) {
    mapper_err_set (err, "pool %s has no thin device %" PRIu64 " (create it "
                    "with: nbdmsetup message %s 0 create_thin %" PRIu64 ")",
                    pool_spec, tc->dev_id, pool_spec + 7, tc->dev_id);
    r = -EINVAL;
    goto fail;
  }
  if (r < 0) {
    mapper_err_set (err, "pool %s: thin device %" PRIu64 ": %s", pool_spec,
                    tc->dev_id, *perr ? perr : mapper_strerror (-r));
    goto fail;
  }
  if (origin_spec) {
    r = target_get_backend_read_only (ti, origin_spec, 0, 0, &tc->origin_be,
                                      err);
    if (r < 0) {
      mapper_err_prefix (err, "external origin");
      goto fail;
    }
    if (tc->origin_be == tc->pool_be || tc->origin_be == tc->pool->data_be) {
      mapper_err_set (err, "the external origin %s is the pool's own "
                      "device", origin_spec);
      r = -EINVAL;
      goto fail;
    }
    if ((r = target_backend_size (tc->origin_be, &tc->origin_size)) < 0) {
      mapper_err_set (err, "external origin %s: cannot get its size: %s",
                      origin_spec, mapper_strerror (-r));
      goto fail;
    }
  }
  return 0;

 fail:
  thin_dtr (ti);
  ti->private = NULL;
  return r;
}

static int
thin_iterate_backends (struct target *ti,
                       int (*fn) (struct target *, struct backend *, void *),
                       void *data)
{
  struct thin_c *tc = ti->private;
  int r = fn (ti, tc->pool_be, data);

  if (r == 0 && tc->origin_be)
    r = fn (ti, tc->origin_be, data);
  return r;
}

const struct target_type thin_target = {
  .name = "thin",
  .version = { 1, 23, 0 },
  .ctr = thin_ctr,
  .dtr = thin_dtr,
  .map = thin_map,
  .extents = thin_extents,
  .status = thin_status,
  .iterate_backends = thin_iterate_backends,
  .flush = thin_flush,
  .check_lower = thin_check_lower,
};

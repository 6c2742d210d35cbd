/* SPDX-License-Identifier: BSD-3-Clause */
/* mirror core <#log_args> <region_size> [sync|nosync] <#legs>
 *        (<dev> <offset>){#legs} [<#features> handle_errors]
 *
 * dm-raid1 with the in-memory ("core") region log.  Writes go to every
 * leg in parallel from the client's buffer (one clone per leg, no copy).
 * Reads go to one in-sync leg, chosen by offset (1 MiB granules); a read
 * error is retried on another in-sync leg (the completion hook points the
 * clone there, the request's waiter resubmits it).  A leg that fails a
 * write is marked failed ('D'); with handle_errors the device keeps going
 * on the other legs (also through a failed flush, 'F'), without it the
 * write fails.  A failed leg stays failed until a reload replaces it.
 * Resync copies from leg 0 (dm's default mirror); if leg 0 fails before
 * it is done, resync stops and regions not yet in sync fail reads.
 * Events (target_event: logged, and nbdmsetup wait returns), as
 * dm-raid1 raises for dmeventd: a leg's first error of each kind, resync
 * complete, resync stopped.
 *
 * Resync: a bitmap of regions in sync, allocated at ctr.  With "sync" (or
 * no sync argument, as dm's core log) every region starts out of sync and
 * the engine-wide resync worker (mirror-resync.c) copies leg 0 to the
 * other legs while the table is live.  Reads of a region not yet in sync
 * come from leg 0 only.  Writes always go to every leg, through the
 * worker's write fence while it runs.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "target.h"
#include "util.h"
#include "mirror.h"

#define MIN_READS 128              /* dm-raid1: reads per leg in turn */

static size_t mirror_info (struct mirror *m, char *buf, size_t len);

void
mirror_log_state (struct mirror *m, const char *what)
{
  char status[512];

  if (mapper_debug == NULL)
    return;
  mirror_info (m, status, sizeof status);
  mapper_debug ("mirror %s (%s): %s", target_origin (m->ti), what, status);
}

/* A leg's first error of a kind changes its status letter: an event, as
 * dm-raid1's fail_mirror raises (dm only with handle_errors; here in
 * both modes, since the status changed either way).
 */
void
mirror_mark_leg (struct mirror *m, unsigned leg, unsigned bit,
                 const char *what)
{
  if (!(atomic_fetch_or (&m->legs[leg].errors, bit) & bit)) {
    char msg[256];
    snprintf (msg, sizeof msg, "leg %u %s %s", leg,
              backend_name (m->legs[leg].be), what);
    mirror_log_state (m, msg);
    target_event (m->ti, "%s", msg);
  }
}

/* --- I/O ---------------------------------------------------------------- */

/* end_io_arg of a clone: the leg, legs already tried (reads), and for
 * writes during resync the epoch parity it was counted in.
 */
#define ARG_LEG(a) ((unsigned) ((a) & 0xff))
#define ARG_TRIED(a) ((unsigned) (((a) >> 8) & 0xffff))
#define ARG_COUNTED 0x1000000ULL
#define ARG_PARITY 0x2000000ULL
#define ARG_LOGGED 0x4000000ULL    /* counted in the disk log's wstate */
#define MAKE_ARG(leg, tried) ((uint64_t) (leg) | ((uint64_t) (tried) << 8))

static bool
leg_readable (struct mirror *m, unsigned i)
{
  return atomic_load_explicit (&m->legs[i].errors, memory_order_relaxed) == 0;
}

/* Leave leg out of writes (handle_errors); false if it was the last. */
static bool
drop_leg (struct mirror *m, unsigned leg)
{
  unsigned all = (1u << m->nr_legs) - 1;
  unsigned failed = atomic_fetch_or (&m->failed_mask, 1u << leg) | (1u << leg);

  return (failed & all) != all;
}

static int
mirror_write_end_io (struct clone *c, void *ctx, uint64_t arg, int error)
{
  struct mirror *m = ctx;
  unsigned leg = ARG_LEG (arg);

  if (arg & ARG_COUNTED)
    mirror_write_exit (m, !!(arg & ARG_PARITY), 1);
  if (error != 0 && error != -ECANCELED) {
    mirror_mark_leg (m, leg, LEG_WRITE_ERR, "failed a write");
    /* Keep going while another leg has not failed: the last leg to fail
     * is the one that fails the request.
     */
    if (m->handle_errors && drop_leg (m, leg))
      error = 0;
  }
  /* Out of the disk log's count only once the leg is marked: a clear
   * pass that sees the write gone sees the failure too.
   */
  if (arg & ARG_LOGGED) {
    uint64_t offset, len;
    clone_range (c, &offset, &len);
    mirror_log_write_exit (m, offset - m->legs[leg].start, len, 1);
  }
  return error;
}

static int
mirror_read_end_io (struct clone *c, void *ctx, uint64_t arg, int error)
{
  struct mirror *m = ctx;
  unsigned leg = ARG_LEG (arg);
  unsigned tried = ARG_TRIED (arg);
  uint64_t offset, len, toff;

  /* Given up (a leg on a suspended device, and the client gone or the
   * server stopping): no fault of the leg's, and nobody to retry for.
   * A write given up so stays a failed write: that leg missed it.
   */
  if (error == 0 || error == -ECANCELED || error == -ESHUTDOWN)
    return error;
  mirror_mark_leg (m, leg, LEG_READ_ERR, "failed a read");
  /* Another leg can only serve it where it is in sync. */
  clone_range (c, &offset, &len);
  toff = offset - m->legs[leg].start;
  if (!range_in_sync (m, toff, len))
    return error;
  for (unsigned i = 0; i < m->nr_legs; i++) {
    if ((tried & (1u << i)) || !leg_readable (m, i))
      continue;
    clone_retry (c, m->legs[i].be, m->legs[i].start + toff,
                 MAKE_ARG (i, tried | (1u << i)));
    return CLONE_RETRY;         /* io.c submits it again */
  }
  return error;
}

static bool
mirror_flush_failed (struct target *ti, struct backend *be)
{
  struct mirror *m = ti->private;
  bool ok = true;

  for (unsigned i = 0; i < m->nr_legs; i++)
    if (m->legs[i].be == be) {
      mirror_mark_leg (m, i, LEG_FLUSH_ERR, "failed a flush");
      ok &= m->handle_errors && drop_leg (m, i);
    }
  /* The log's flush failed (dm-log's fail_log_device: status F): what it
   * holds may not be durable, and no leg stands in for it.
   */
  if (m->log && m->log->be == be) {
    mirror_log_flush_failed (m);
    ok = false;
  }
  return ok;
}

static int
mirror_map (struct target *ti, struct io_req *req, uint64_t off,
            uint64_t len, char *buf)
{
  struct mirror *m = ti->private;
  bool synced = atomic_load_explicit (&m->all_in_sync, memory_order_acquire);
  unsigned i;
  int r;

  if (!synced)
    atomic_fetch_add_explicit (&m->fg_ios, 1, memory_order_relaxed);

  if (io_req_is_read (req)) {
    unsigned n = m->nr_legs;
    unsigned first;

    if (synced || range_in_sync (m, off, len))
      first = (atomic_fetch_add_explicit (&m->reads, 1, memory_order_relaxed)
               / MIN_READS) % n;
    else
      n = 1, first = 0;         /* only leg 0 has the data yet */
    for (i = 0; i < n; i++) {
      unsigned leg = (first + i) % m->nr_legs;
      if (leg_readable (m, leg))
        return io_emit_end_io (req, m->legs[leg].be,
                               m->legs[leg].start + off, len, buf,
                               mirror_read_end_io, m,
                               MAKE_ARG (leg, 1u << leg));
    }
    /* Nothing healthy: try the first anyway, it may have recovered. */
    return io_emit_end_io (req, m->legs[first].be,
                           m->legs[first].start + off, len, buf,
                           mirror_read_end_io, m,
                           MAKE_ARG (first, 1u << first));
  }

  /* Writes, zeroes, trims: every leg, the same buffer.  With
   * handle_errors a leg that failed a write is left out (it is no longer
   * part of the mirror until a reload replaces it); without, every write
   * still goes to it and fails.
   */
  {
    unsigned skip = m->handle_errors ? atomic_load (&m->failed_mask) : 0;
    unsigned n = 0, emitted = 0;
    uint64_t arg = 0;

    for (i = 0; i < m->nr_legs; i++)
      n += !(skip & (1u << i));
    if (n == 0)
      return -EIO;
    /* The disk log first: the regions' dirty bits are durable before
     * any clone goes out.
     */
    if (m->log) {
      if ((r = mirror_log_write_enter (m, off, len, n)) < 0)
        return r;
      arg |= ARG_LOGGED;
    }
    if (!synced) {
      arg |= ARG_COUNTED;
      if (mirror_write_enter (m, off, len, n))
        arg |= ARG_PARITY;
    }
    for (i = 0; i < m->nr_legs; i++) {
      if (skip & (1u << i))
        continue;
      /* The hook marks a leg that fails ('D') in either mode. */
      r = io_emit_end_io (req, m->legs[i].be, m->legs[i].start + off, len,
                          buf, mirror_write_end_io, m, arg | i);
      if (r < 0) {
        if (arg & ARG_COUNTED)
          mirror_write_exit (m, !!(arg & ARG_PARITY), n - emitted);
        if (arg & ARG_LOGGED)
          mirror_log_write_exit (m, off, len, n - emitted);
        return r;
      }
      emitted++;
    }
  }
  return 0;
}

/* The first healthy leg that answers: any in-sync leg holds what reads
 * return; out of sync, only leg 0 does.  A leg that failed (a write it
 * missed, say) may hold stale holes: data where no healthy leg answers.
 */
static int
mirror_extents (struct target *ti, struct extent_walk *w, uint64_t off,
                uint64_t len)
{
  struct mirror *m = ti->private;
  unsigned n = range_in_sync (m, off, len) ? m->nr_legs : 1;
  uint64_t end = off + len;

  for (unsigned i = 0; i < n && !extent_walk_done (w); i++) {
    uint64_t pos = extent_walk_pos (w, ti);
    int r;

    if (!leg_readable (m, i))
      continue;
    r = extent_walk_backend_try (w, ti, pos, m->legs[i].be,
                                 m->legs[i].start + pos, end - pos);
    if (r != EXTENT_BACKEND_FAILED)
      return r;
  }
  return extent_walk_data (w, ti, end);
}

/* --- status ----------------------------------------------------------- */

static char
leg_status_char (struct mirror *m, unsigned i)
{
  unsigned e = atomic_load (&m->legs[i].errors);

  if (e & LEG_FLUSH_ERR)
    return 'F';
  if (e & LEG_WRITE_ERR)
    return 'D';
  if (e & LEG_SYNC_ERR)
    return 'S';
  if (e & LEG_READ_ERR)
    return 'R';
  return 'A';
}

/* dm: <#legs> <dev>... <in_sync>/<regions> 1 <A|D|S|R...> then the
 * log's: "1 core", or "3 disk <log dev> <A|D|F>".
 */
static size_t
mirror_info (struct mirror *m, char *buf, size_t len)
{
  char chars[MIRROR_MAX_LEGS + 1];
  size_t used = 0;

  EMIT ("%u", m->nr_legs);
  for (unsigned i = 0; i < m->nr_legs; i++) {
    EMIT (" %s", backend_name (m->legs[i].be));
    chars[i] = leg_status_char (m, i);
  }
  chars[m->nr_legs] = '\0';
  EMIT (" %" PRIu64 "/%" PRIu64 " 1 %s",
        (uint64_t) atomic_load (&m->nr_in_sync), m->nr_regions, chars);
  if (m->log)
    EMIT (" 3 disk %s %c", backend_name (m->log->be),
          mirror_log_status_char (m));
  else
    EMIT (" 1 core");
  return used;
}

static size_t
mirror_status (struct target *ti, enum status_type type, char *buf,
               size_t len)
{
  struct mirror *m = ti->private;
  size_t used = 0;

  if (type == STATUSTYPE_INFO)
    return mirror_info (m, buf, len);

  if (m->log)
    EMIT ("disk %d %s", 2 + (m->sync != SYNC_DEFAULT) +
          m->log->block_on_error, backend_name (m->log->be));
  else
    EMIT ("core %d", 1 + (m->sync != SYNC_DEFAULT));
  EMIT (" %" PRIu64 "%s%s %u", m->region_size >> MAPPER_SECTOR_SHIFT,
        m->sync == SYNC_SYNC ? " sync"
        : m->sync == SYNC_NOSYNC ? " nosync" : "",
        m->log && m->log->block_on_error ? " block_on_error" : "",
        m->nr_legs);
  for (unsigned i = 0; i < m->nr_legs; i++)
    EMIT (" %s %" PRIu64, backend_name (m->legs[i].be),
          m->legs[i].start >> MAPPER_SECTOR_SHIFT);
  if (m->handle_errors)
    EMIT (" 1 handle_errors");
  return used;
}

/* --- constructor -------------------------------------------------------- */

static void mirror_dtr (struct target *ti);

static const struct target_arg legs_arg = { "number of legs", NULL, 2,
                                            MIRROR_MAX_LEGS };

static int
mirror_ctr (struct target *ti, unsigned argc, char **argv,
            struct mapper_err *err)
{
  struct target_args as = { argc, argv }, log, features;
  struct mirror *m;
  uint64_t region, nlegs, words;
  const char *arg, *log_dev = NULL;
  bool disk, block_on_error = false;
  int r;

  /* The log: core <#log_args> <region_size> [sync|nosync], or
   * disk <#log_args> <log dev> <region_size> [sync|nosync]
   * [block_on_error].
   */
  if (argc < 2) {
    mapper_err_set (err, "expected core|disk <#log_args> [<log dev>] "
                    "<region_size> [sync|nosync] <#legs> <dev> <offset>..., "
                    "got %u argument%s", argc, argc == 1 ? "" : "s");
    return -EINVAL;
  }
  arg = target_shift_arg (&as);
  disk = strcmp (arg, "disk") == 0;
  if (!disk && strcmp (arg, "core") != 0) {
    mapper_err_set (err, "log type '%s' is not supported (expected core or "
                    "disk)", arg);
    return -EINVAL;
  }
  if ((r = target_read_group ("log argument", 1 + disk, 2 + 2 * disk, false,
                              &as, &log, err)) < 0)
    return r;
  if (disk)
    log_dev = target_shift_arg (&log);
  if ((r = target_read_sectors ("region size", &log, &region, err)) < 0)
    return r;
  region >>= MAPPER_SECTOR_SHIFT;
  if (region < 2 || !IS_POWER_OF_2 (region)) {
    mapper_err_set (err, "region size %" PRIu64 " sectors must be a power of "
                    "two, at least 2", region);
    return -EINVAL;
  }
  if (region > ti->len >> MAPPER_SECTOR_SHIFT) {
    mapper_err_set (err, "region size %" PRIu64 " sectors is larger than the "
                    "target (%" PRIu64 " sectors)", region,
                    ti->len >> MAPPER_SECTOR_SHIFT);
    return -EINVAL;
  }

  m = calloc (1, sizeof *m);
  if (m == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  m->ti = ti;
  m->len = ti->len;
  m->region_size = region << MAPPER_SECTOR_SHIFT;
  m->region_shift = __builtin_ctzll (m->region_size);
  m->nr_regions = (ti->len + m->region_size - 1) >> m->region_shift;
  mirror_fence_init (m);
  ti->private = m;

  while ((arg = target_shift_arg (&log)) != NULL) {
    if (m->sync == SYNC_DEFAULT && !block_on_error &&
        strcmp (arg, "sync") == 0)
      m->sync = SYNC_SYNC;
    else if (m->sync == SYNC_DEFAULT && !block_on_error &&
             strcmp (arg, "nosync") == 0)
      m->sync = SYNC_NOSYNC;
    else if (disk && !block_on_error && strcmp (arg, "block_on_error") == 0)
      block_on_error = true;
    else {
      mapper_err_set (err, "unrecognised log argument '%s' (expected %s)",
                      arg, disk ? "[sync|nosync] [block_on_error]"
                      : "sync or nosync");
      goto einval;
    }
  }

  /* The legs: <#legs> (<dev> <offset>){#legs}. */
  if (as.argc == 0) {
    mapper_err_set (err, "missing <#legs>");
    goto einval;
  }
  if (target_read_arg (&legs_arg, &as, &nlegs, err) < 0)
    goto einval;
  if (as.argc < 2 * nlegs) {
    mapper_err_set (err, "%" PRIu64 " legs need %" PRIu64 " <dev> <offset> "
                    "arguments, got %u", nlegs, 2 * nlegs, as.argc);
    goto einval;
  }
  for (unsigned i = 0; i < nlegs; i++) {
    const char *dev = target_shift_arg (&as);
    uint64_t start;

    if (target_read_sectors ("offset", &as, &start, err) < 0) {
      mapper_err_prefix (err, "leg %u", i);
      goto einval;
    }
    m->legs[i].start = start;
    r = target_get_backend (ti, dev, start, ti->len, &m->legs[i].be, err);
    if (r < 0) {
      mapper_err_prefix (err, "leg %u", i);
      goto fail;
    }
    m->nr_legs = i + 1;
    for (unsigned j = 0; j < i; j++)
      if (m->legs[j].be == m->legs[i].be) {
        uint64_t s1 = m->legs[j].start, s2 = start;
        if (s1 < s2 + ti->len && s2 < s1 + ti->len) {
          mapper_err_set (err, "legs %u and %u overlap on %s", j, i,
                          backend_name (m->legs[i].be));
          goto einval;
        }
      }
  }

  /* Features: [<#features> handle_errors]. */
  if (as.argc > 0) {
    if (target_read_group ("feature argument", 0, UINT_MAX, false, &as,
                           &features, err) < 0)
      goto einval;
    while ((arg = target_shift_arg (&features)) != NULL) {
      if (strcmp (arg, "handle_errors") == 0)
        m->handle_errors = true;
      else {
        mapper_err_set (err, "unrecognised feature '%s'%s", arg,
                        strcmp (arg, "keep_log") == 0
                        ? " (keep_log is not supported)"
                        : " (expected handle_errors)");
        goto einval;
      }
    }
    if ((arg = target_shift_arg (&as)) != NULL) {
      mapper_err_set (err, "too many arguments: '%s' after the features",
                      arg);
      goto einval;
    }
  }

  /* The region log, proportionate to size / region size. */
  words = (m->nr_regions + 63) / 64;
  m->in_sync = calloc (words, sizeof *m->in_sync);
  if (m->in_sync == NULL) {
    mapper_err_set (err, "out of memory for %" PRIu64 " regions",
                    m->nr_regions);
    r = -ENOMEM;
    goto fail;
  }
  if (log_dev) {
    if ((r = mirror_log_ctr (m, log_dev, block_on_error, err)) < 0)
      goto fail;
  }
  else if (m->sync == SYNC_NOSYNC) {
    for (uint64_t i = 0; i < words; i++)
      atomic_init (&m->in_sync[i], UINT64_MAX);
    atomic_init (&m->nr_in_sync, m->nr_regions);
    atomic_init (&m->all_in_sync, true);
  }
  return 0;

 einval:
  r = -EINVAL;
 fail:
  mirror_dtr (ti);
  ti->private = NULL;
  return r;
}

static void
mirror_resume (struct target *ti)
{
  mirror_log_resume (ti->private);
  mirror_resync_resume (ti->private);
}

/* dm's periodic clear of the regions whose writes are done, at each
 * device flush: what a flush made durable on the legs may be clean in
 * the log.
 */
static int
mirror_flush (struct target *ti, struct io_req *req)
{
  mirror_log_clear_pass (ti->private);
  return 0;
}

/* dm's postsuspend: the disk log's last clear pass (disk_flush), the
 * writes having drained, so that a clean stop leaves nothing to resync.
 * Only a table that was live: one that never was (a reload's, cleared)
 * shares the log with the live table, whose bits these are not.
 */
static void
mirror_postsuspend (struct target *ti)
{
  struct mirror *m = ti->private;

  if (mirror_resync_suspend (m) && m->log)
    mirror_log_clean_all (m);
}

static void
mirror_dtr (struct target *ti)
{
  struct mirror *m = ti->private;

  if (m == NULL)
    return;
  mirror_resync_suspend (m);
  mirror_fence_destroy (m);
  mirror_log_free (m);
  free (m->in_sync);
  free (m);
}

static int
mirror_iterate_backends (struct target *ti,
                         int (*fn) (struct target *, struct backend *, void *),
                         void *data)
{
  struct mirror *m = ti->private;
  int r;

  for (unsigned i = 0; i < m->nr_legs; i++)
    if ((r = fn (ti, m->legs[i].be, data)) != 0)
      return r;
  /* The disk log is one of the device's backends too: flushed once with
   * the legs, and its failed flush is the target's to judge
   * (flush_failed: status F).
   */
  return m->log ? fn (ti, m->log->be, data) : 0;
}

const struct target_type mirror_target = {
  .name = "mirror",
  .version = { 1, 14, 0 },
  .ctr = mirror_ctr,
  .dtr = mirror_dtr,
  .map = mirror_map,
  .extents = mirror_extents,
  .status = mirror_status,
  .iterate_backends = mirror_iterate_backends,
  .resume = mirror_resume,
  .postsuspend = mirror_postsuspend,
  .flush = mirror_flush,
  .flush_failed = mirror_flush_failed,
  .start = mirror_resync_start,
  .stop = mirror_resync_stop,
};

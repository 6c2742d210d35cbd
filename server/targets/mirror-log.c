/* SPDX-License-Identifier: BSD-3-Clause */
/* The mirror target's disk log (mirror.h): dm-log's "disk" type.
 *
 *   mirror disk <#log_args> <log dev> <region_size> [sync|nosync]
 *          [block_on_error] <#legs> ...
 *
 * On the log device, dm-log's format: a header in sector 0 (le32 magic
 * "MiRr" 0x4D695272, le32 version 2, le64 nr_regions) and from sector 2
 * (LOG_OFFSET) the clean bits, one per region, in little-endian bit
 * order, in whole 32-bit words; the area is rounded up to the device's
 * block size.  A log of R regions needs 1024 + 4 * ceil(R / 32) bytes,
 * rounded so.  nbdmapper also records the region size (le64 sectors) at
 * byte 16, which dm leaves zero and never reads: a log written for
 * another region size says nothing about these regions and is
 * re-initialised (every region out of sync).
 *
 * What the bits mean is dm's: a clean region is in sync on every leg; a
 * dirty one may differ and is resynced at the next load.
 *
 * - Before the first write to a clean region goes out, its bit is made
 *   dirty on the device (a FUA write of the log blocks holding it):
 *   writers of that region wait for it, writers of dirty regions never
 *   take the log's lock (dm-region-hash's mark before write).  One log
 *   write is in flight at a time; the writers that need a mark while it
 *   is have theirs made by the next one, all together (dm marks a batch
 *   of bios' regions with one log flush).
 * - Bits are cleared lazily (dm's clear_region, then flush): a clear pass
 *   (at each device flush, and as resync progresses) takes the in-sync
 *   dirty regions with no write in flight and none since the previous
 *   pass (a per-region count of writes started, next to the count in
 *   flight), flushes the legs, and cleans those that saw no write start
 *   or end meanwhile, then writes the log blocks that changed (FUA).  A
 *   write that started before the legs' flush but had not completed
 *   keeps its region dirty.  A region written between two passes stays
 *   dirty at the second: a region in use is not cleaned only to be
 *   marked again by its next write (one FUA log write per write when
 *   the client flushes often).  At a suspend (postsuspend, once the
 *   writes drained) and when the server stops, a last pass cleans every
 *   in-sync region, in use lately or not (dm's postsuspend disk_flush):
 *   a clean stop leaves nothing to resync at the next start.
 * - While any leg has failed (a write, a resync write or a flush), no bit
 *   is cleared: those regions must be resynced when the leg is replaced
 *   (dm's RH_NOSYNC).
 *
 * The race between a writer and a clear pass: the writer counts itself
 * into the region's state, then reads the bit; the pass sets the bit,
 * then reads the state again and puts the bit back if it changed (all
 * seq_cst).  Either the pass sees the writer (and the bit stays dirty),
 * or the writer sees the bit set and takes the lock, behind the pass,
 * and marks the region again.
 *
 * Loading (dm's disk_resume): the header is checked at the constructor
 * (a damaged one is refused, naming the device); a "sync" or "nosync"
 * argument makes a new log (all out of sync, or all in sync), as dm's
 * does; regions beyond the header's nr_regions (the device grew) are
 * out of sync.  When the table goes live (resume) the bits are read
 * again and anything dirty there is dirty here too: a table loaded
 * while an older one on the same log was live misses none of its marks.
 * A header that changed (a new log, another region count or size) is
 * written then too, never by the constructor (dm's disk_resume): the
 * older table, still live meanwhile, keeps the log it depends on.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "target.h"
#include "util.h"
#include "mirror.h"

#define MIRROR_MAGIC 0x4D695272        /* dm-log.c: "MiRr" */
#define MIRROR_DISK_VERSION 2
#define LOG_OFFSET 1024                /* bytes: dm's LOG_OFFSET, 2 sectors */
#define HDR_REGION_SIZE 16             /* ours: region size, le64 sectors */

static uint32_t
get_le32 (const unsigned char *p)
{
  return p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16
    | (uint32_t) p[3] << 24;
}

static uint64_t
get_le64 (const unsigned char *p)
{
  return get_le32 (p) | (uint64_t) get_le32 (p + 4) << 32;
}

static void
put_le32 (unsigned char *p, uint32_t v)
{
  for (int i = 0; i < 4; i++)
    p[i] = v >> (8 * i);
}

static void
put_le64 (unsigned char *p, uint64_t v)
{
  put_le32 (p, v);
  put_le32 (p + 4, v >> 32);
}

static unsigned char *
bit_byte (struct mirror_log *l, uint64_t r)
{
  return &l->buf[LOG_OFFSET + r / 8];
}

static bool
bit_clean (struct mirror_log *l, uint64_t r)
{
  return __atomic_load_n (bit_byte (l, r), __ATOMIC_SEQ_CST) & (1u << (r % 8));
}

/* Under l->lock. */
static void
set_clean (struct mirror_log *l, uint64_t r)
{
  __atomic_fetch_or (bit_byte (l, r), (unsigned char) (1u << (r % 8)),
                     __ATOMIC_SEQ_CST);
}

static void
set_dirty (struct mirror_log *l, uint64_t r)
{
  __atomic_fetch_and (bit_byte (l, r), (unsigned char) ~(1u << (r % 8)),
                      __ATOMIC_SEQ_CST);
}

/* A log device error: its first of a kind changes the log's status
 * letter, an event as dm's fail_log_device raises.
 */
static void
log_failed (struct mirror *m, unsigned bit, int error)
{
  struct mirror_log *l = m->log;

  if (!(atomic_fetch_or (&l->errors, bit) & bit)) {
    char msg[256];
    snprintf (msg, sizeof msg, "log device %s failed a %s: %s",
              backend_name (l->be), bit == LOG_FLUSH_ERR ? "flush" : "write",
              mapper_strerror (-error));
    mirror_log_state (m, msg);
    target_event (m->ti, "%s", msg);
  }
}

/* Write bytes [off, off+len) of the image (whole blocks) durably; copy
 * is the image's bytes, or NULL to take them from the image.  Under
 * l->lock.
 */
static int
log_write (struct mirror *m, uint64_t off, uint64_t len,
           const unsigned char *copy)
{
  struct mirror_log *l = m->log;
  char *b = bounce_get (len);
  int r;

  if (b == NULL)
    return -ENOMEM;
  memcpy (b, copy ? copy : l->buf + off, len);
  r = io_sync (IO_WRITE, l->be, off, len, b, MAPPER_FUA);
  bounce_put (b);
  if (r < 0 && r != -ESHUTDOWN)
    log_failed (m, LOG_WRITE_ERR, r);
  return r;
}

static void begin_write (struct mirror_log *l);
static void end_write (struct mirror_log *l);

int
mirror_log_ctr (struct mirror *m, const char *dev, bool block_on_error,
                struct mapper_err *err)
{
  struct mirror_log *l;
  uint64_t size, bits, rsize = m->region_size >> MAPPER_SECTOR_SHIFT;
  uint64_t valid, nr, hdr_rsize, dirty = 0;
  uint32_t magic, version;
  bool fresh = false, changed;
  int r;

  l = calloc (1, sizeof *l);
  if (l == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  m->log = l;
  pthread_mutex_init (&l->lock, NULL);
  pthread_cond_init (&l->idle, NULL);
  pthread_mutex_init (&l->pass_lock, NULL);
  l->block_on_error = block_on_error;

  /* Its size first (any length is a valid area), then the area the log
   * needs, registered as what the table uses of it.
   */
  if ((r = target_get_backend (m->ti, dev, 0, 0, &l->be, err)) < 0) {
    mapper_err_prefix (err, "log device");
    return r;
  }
  if ((r = target_backend_size (l->be, &size)) < 0) {
    mapper_err_set (err, "log device %s: cannot get its size: %s", dev,
                    mapper_strerror (-r));
    return r;
  }
  bits = DIV_ROUND_UP (m->nr_regions, 32) * 4;
  l->block = MAX (backend_caps (l->be)->block_min, 512u);
  l->size = DIV_ROUND_UP (LOG_OFFSET + bits, l->block) * l->block;
  if (size < l->size) {
    mapper_err_set (err, "log device %s too small: %" PRIu64 " bytes, a "
                    "log of %" PRIu64 " regions needs %" PRIu64, dev, size,
                    m->nr_regions, l->size);
    return -EINVAL;
  }
  if ((r = target_get_backend (m->ti, dev, 0, l->size, &l->be, err)) < 0) {
    mapper_err_prefix (err, "log device");
    return r;
  }
  if (!backend_caps (l->be)->can_write) {
    mapper_err_set (err, "log device %s is read-only", dev);
    return -EINVAL;
  }
  l->buf = calloc (1, l->size);
  l->wstate = calloc (m->nr_regions, sizeof *l->wstate);
  l->seen = calloc (m->nr_regions, sizeof *l->seen);
  if (l->buf == NULL || l->wstate == NULL || l->seen == NULL) {
    mapper_err_set (err, "out of memory for a log of %" PRIu64 " regions",
                    m->nr_regions);
    return -ENOMEM;
  }
  r = io_sync (IO_READ, l->be, 0, l->size, (char *) l->buf, 0);
  if (r < 0) {
    mapper_err_set (err, "log device %s: cannot read the log: %s", dev,
                    mapper_strerror (-r));
    return r;
  }

  /* The header.  A device of zeroes is a new log (dm's magic check);
   * anything else that is not a mirror log, or another version, is
   * refused: it may be something else's data.  "sync" and "nosync"
   * make a new log whatever was there, as dm's do.
   */
  magic = get_le32 (l->buf);
  version = get_le32 (l->buf + 4);
  nr = get_le64 (l->buf + 8);
  hdr_rsize = get_le64 (l->buf + HDR_REGION_SIZE);
  if (m->sync != SYNC_DEFAULT)
    fresh = true;
  else if (magic == 0 && version == 0 && nr == 0 && hdr_rsize == 0)
    fresh = true;
  else if (magic != MIRROR_MAGIC) {
    mapper_err_set (err, "log device %s: not a mirror log (magic 0x%08"
                    PRIx32 " in sector 0, expected 0x%08x); a 'sync' log "
                    "argument re-initialises it", dev, magic, MIRROR_MAGIC);
    return -EINVAL;
  }
  else {
    if (version == 1)
      version = 2;              /* dm: the same, on little-endian hosts */
    if (version != MIRROR_DISK_VERSION) {
      mapper_err_set (err, "log device %s: disk log version %" PRIu32
                      " is not supported (expected %d)", dev, version,
                      MIRROR_DISK_VERSION);
      return -EINVAL;
    }
    if (nr > (size - LOG_OFFSET) * 8) {
      mapper_err_set (err, "log device %s: damaged header: %" PRIu64
                      " regions, the device holds bits for %" PRIu64, dev,
                      nr, (size - LOG_OFFSET) * 8);
      return -EINVAL;
    }
    if (hdr_rsize != 0 && hdr_rsize != rsize) {
      if (mapper_log)
        mapper_log ("mirror: %s: log device %s was written for regions of "
                    "%" PRIu64 " sectors, now %" PRIu64 ": re-initialised, "
                    "every region out of sync", target_origin (m->ti), dev,
                    hdr_rsize, rsize);
      fresh = true;
    }
  }
  valid = fresh ? 0 : MIN (nr, m->nr_regions);
  changed = fresh || nr != m->nr_regions || hdr_rsize != rsize;
  if (fresh)
    memset (l->buf + LOG_OFFSET, 0, l->size - LOG_OFFSET);
  for (uint64_t i = valid; i < m->nr_regions; i++)
    if (m->sync == SYNC_NOSYNC)
      set_clean (l, i);
    else
      set_dirty (l, i);
  /* Bits past the last region: clear (dm clears them too). */
  for (uint64_t i = m->nr_regions; LOG_OFFSET + i / 8 < l->size; i++)
    set_dirty (l, i);
  memset (l->buf, 0, LOG_OFFSET);
  put_le32 (l->buf, MIRROR_MAGIC);
  put_le32 (l->buf + 4, MIRROR_DISK_VERSION);
  put_le64 (l->buf + 8, m->nr_regions);
  put_le64 (l->buf + HDR_REGION_SIZE, rsize);

  /* The resync starts from the clean bits. */
  for (uint64_t i = 0; i < m->nr_regions; i++)
    if (bit_clean (l, i))
      atomic_fetch_or (&m->in_sync[i / 64], 1ULL << (i % 64));
    else
      dirty++;
  l->dirty_at_load = dirty;
  atomic_store (&m->nr_in_sync, m->nr_regions - dirty);
  atomic_store (&m->all_in_sync, dirty == 0);
  if (mapper_debug)
    mapper_debug ("mirror %s: disk log %s: %s, %" PRIu64 "/%" PRIu64
                  " regions dirty (to resync)", target_origin (m->ti), dev,
                  fresh ? "new log" : "loaded", dirty, m->nr_regions);

  /* A changed header (a new log, another region count or size) is
   * written at resume, not here (dm's disk_resume): the live table this
   * one may replace still marks its regions on this log, in its layout,
   * and must not find the header changed under it while it runs; a table
   * never resumed changes nothing on the device.
   */
  l->fresh = fresh;
  l->changed = changed;
  return 0;
}

void
mirror_log_resume (struct mirror *m)
{
  struct mirror_log *l = m->log;
  unsigned char *disk;
  uint64_t n = 0;
  int e = 0;

  if (l == NULL || l->merged)
    return;
  l->merged = true;
  /* A re-initialised log's bits on the device are another layout's (or
   * were asked to be forgotten: sync, nosync): nothing to merge.
   */
  if (l->fresh)
    goto write;
  disk = malloc (l->size);
  if (disk == NULL ||
      (e = io_sync (IO_READ, l->be, 0, l->size, (char *) disk, 0)) < 0) {
    /* Marks an older table made since the ctr read the log are unknown:
     * every region is resynced rather than one skipped after a crash.
     */
    free (disk);
    disk = NULL;
    if (mapper_log)
      mapper_log ("mirror %s: disk log %s: cannot read it again at resume "
                  "(%s): every region resyncs", target_origin (m->ti),
                  backend_name (l->be), mapper_strerror (e ? -e : ENOMEM));
  }
  pthread_mutex_lock (&l->lock);
  for (uint64_t r = 0; r < m->nr_regions; r++)
    if (bit_clean (l, r) &&
        (!disk || !(disk[LOG_OFFSET + r / 8] & (1u << (r % 8))))) {
      set_dirty (l, r);
      atomic_fetch_and (&m->in_sync[r / 64], ~(1ULL << (r % 64)));
      atomic_fetch_sub (&m->nr_in_sync, 1);
      atomic_store (&m->all_in_sync, false);
      n++;
    }
  pthread_mutex_unlock (&l->lock);
  l->dirty_at_load += n;
  free (disk);
  if (n && mapper_debug)
    mapper_debug ("mirror %s: disk log %s: %" PRIu64 " more regions dirty "
                  "at resume", target_origin (m->ti), backend_name (l->be),
                  n);
 write:
  /* The table this one replaced is suspended: the header is this one's
   * now.  A failure is the log's D (an event), as dm's disk_resume.
   */
  if (l->changed) {
    pthread_mutex_lock (&l->lock);
    begin_write (l);
    if (log_write (m, 0, l->size, NULL) == 0)
      l->changed = false;
    else if (mapper_log)
      mapper_log ("mirror %s: disk log %s: cannot write the log's new "
                  "header at resume", target_origin (m->ti),
                  backend_name (l->be));
    end_write (l);
    pthread_mutex_unlock (&l->lock);
  }
}

void
mirror_log_free (struct mirror *m)
{
  struct mirror_log *l = m->log;

  if (l == NULL)
    return;
  pthread_mutex_destroy (&l->lock);
  pthread_cond_destroy (&l->idle);
  pthread_mutex_destroy (&l->pass_lock);
  free (l->want);
  free (l->buf);
  free (l->wstate);
  free (l->seen);
  free (l);
  m->log = NULL;
}

static bool
want_add (struct mirror_log *l, uint64_t r)
{
  for (size_t i = 0; i < l->nwant; i++)
    if (l->want[i] == r)
      return true;
  if (l->nwant == l->awant) {
    size_t a = l->awant ? 2 * l->awant : 16;
    uint64_t *p = realloc (l->want, a * sizeof *p);
    if (p == NULL)
      return false;
    l->want = p, l->awant = a;
  }
  l->want[l->nwant++] = r;
  return true;
}

/* Wait until no log write is in flight, then own the next one (l->lock
 * held, dropped meanwhile).
 */
static void
begin_write (struct mirror_log *l)
{
  while (l->writing)
    pthread_cond_wait (&l->idle, &l->lock);
  l->writing = true;
}

static void
end_write (struct mirror_log *l)
{
  l->writing = false;
  pthread_cond_broadcast (&l->idle);
}

/* Make region r dirty on the device, if it is still clean: with every
 * region other writers are waiting to have marked.
 */
static int
mark_region (struct mirror *m, uint64_t r)
{
  struct mirror_log *l = m->log;
  uint64_t *list, lo = UINT64_MAX, hi = 0;
  unsigned char *img;
  size_t n;
  int e;

  pthread_mutex_lock (&l->lock);
  while (l->writing && bit_clean (l, r)) {
    /* The write in flight may not have r: the next one will. */
    want_add (l, r);
    pthread_cond_wait (&l->idle, &l->lock);
  }
  if (!bit_clean (l, r)) {
    pthread_mutex_unlock (&l->lock);
    return 0;
  }
  if (!want_add (l, r)) {
    pthread_mutex_unlock (&l->lock);
    return -ENOMEM;
  }
  list = l->want, n = l->nwant;
  l->want = NULL, l->nwant = l->awant = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t b = (LOG_OFFSET + list[i] / 8) / l->block * l->block;
    lo = MIN (lo, b);
    hi = MAX (hi, b + l->block);
  }
  /* The image changes only once the device has it: writers that read
   * the bits without the lock must not go ahead before that.
   */
  img = malloc (hi - lo);
  if (img == NULL) {
    free (list);
    pthread_mutex_unlock (&l->lock);
    return -ENOMEM;
  }
  memcpy (img, l->buf + lo, hi - lo);
  for (size_t i = 0; i < n; i++)
    img[LOG_OFFSET + list[i] / 8 - lo] &= ~(1u << (list[i] % 8));
  l->writing = true;
  pthread_mutex_unlock (&l->lock);

  e = log_write (m, lo, hi - lo, img);

  pthread_mutex_lock (&l->lock);
  if (e == 0 || !l->block_on_error)
    for (size_t i = 0; i < n; i++)
      set_dirty (l, list[i]);
  if (e == 0)
    atomic_fetch_add (&l->marks, n);
  end_write (l);
  pthread_mutex_unlock (&l->lock);
  free (img);
  free (list);
  /* With block_on_error, the others of the batch find their bits still
   * clean and try again themselves.
   */
  return e == 0 || !l->block_on_error ? 0 : -EIO;
}

int
mirror_log_write_enter (struct mirror *m, uint64_t off, uint64_t len,
                        unsigned n)
{
  struct mirror_log *l = m->log;
  uint64_t first = off >> m->region_shift;
  uint64_t last = (off + len - 1) >> m->region_shift;
  int e = 0;

  for (uint64_t r = first; r <= last; r++)
    atomic_fetch_add (&l->wstate[r], LOG_STARTED + n);
  for (uint64_t r = first; r <= last && e == 0; r++)
    if (bit_clean (l, r))
      e = mark_region (m, r);
  if (e < 0)
    for (uint64_t r = first; r <= last; r++)
      atomic_fetch_sub (&l->wstate[r], n);
  return e;
}

void
mirror_log_write_exit (struct mirror *m, uint64_t off, uint64_t len,
                       unsigned n)
{
  uint64_t first = off >> m->region_shift;
  uint64_t last = (off + len - 1) >> m->region_shift;

  for (uint64_t r = first; r <= last; r++)
    atomic_fetch_sub (&m->log->wstate[r], n);
}

struct candidate {
  uint64_t region, state;
};

/* The clear pass.  all: every in-sync dirty region with no write in
 * flight, whether or not one came since the last pass (a suspended
 * table's, whose writes have drained: dm's postsuspend disk_flush).
 */
static void
clear_pass (struct mirror *m, bool all)
{
  struct mirror_log *l = m->log;
  struct candidate *c = NULL;
  size_t n = 0, alloc = 0;
  uint64_t lo = UINT64_MAX, hi = 0, cleared = 0;
  int e;

  if (l == NULL)
    return;
  pthread_mutex_lock (&l->pass_lock);
  for (unsigned i = 0; i < m->nr_legs; i++)
    if (atomic_load (&m->legs[i].errors) &
        (LEG_WRITE_ERR | LEG_SYNC_ERR | LEG_FLUSH_ERR))
      goto out;

  /* In-sync dirty regions with no write in flight, and none started or
   * ended since the last pass.
   */
  for (uint64_t r = 0; r < m->nr_regions; r++) {
    uint64_t s;

    if (r % 8 == 0 && __atomic_load_n (bit_byte (l, r), __ATOMIC_RELAXED) ==
        0xff && r + 8 <= m->nr_regions) {
      r += 7;
      continue;
    }
    if (bit_clean (l, r) || !region_in_sync (m, r))
      continue;
    s = atomic_load (&l->wstate[r]);
    if (s != l->seen[r]) {
      l->seen[r] = s;           /* in use: not this time */
      if (!all)
        continue;
    }
    if (s & LOG_PENDING_MASK)
      continue;
    if (n == alloc) {
      struct candidate *p;
      alloc = alloc ? 2 * alloc : 64;
      p = realloc (c, alloc * sizeof *c);
      if (p == NULL)
        goto out;
      c = p;
    }
    c[n].region = r;
    c[n++].state = s;
  }
  if (n == 0)
    goto out;

  /* What those regions' completed writes left in the legs' caches.  A
   * leg that fails it may have lost them: marked, so that no later pass
   * (whose flush may succeed) cleans them (given up, -ESHUTDOWN or
   * -ECANCELED, says nothing of the leg).
   */
  for (unsigned i = 0; i < m->nr_legs; i++)
    if ((e = target_flush_backend (m->legs[i].be)) < 0) {
      if (e != -ESHUTDOWN && e != -ECANCELED)
        mirror_mark_leg (m, i, LEG_FLUSH_ERR, "failed a flush");
      goto out;
    }

  pthread_mutex_lock (&l->lock);
  begin_write (l);
  for (size_t i = 0; i < n; i++) {
    uint64_t r = c[i].region, byte = LOG_OFFSET + r / 8;

    set_clean (l, r);
    if (atomic_load (&l->wstate[r]) != c[i].state) {
      set_dirty (l, r);         /* a write came (or went) meanwhile */
      continue;
    }
    lo = MIN (lo, byte / l->block * l->block);
    hi = MAX (hi, byte / l->block * l->block + l->block);
    cleared++;
  }
  if (cleared) {
    /* Written from a copy, without the lock: writers of these regions
     * find them clean, and wait for this write to mark them again.
     */
    unsigned char *img = malloc (hi - lo);
    if (img) {
      memcpy (img, l->buf + lo, hi - lo);
      pthread_mutex_unlock (&l->lock);
      if (log_write (m, lo, hi - lo, img) == 0)
        atomic_fetch_add (&l->clears, cleared);
      pthread_mutex_lock (&l->lock);
      free (img);
    }
    else
      for (size_t i = 0; i < n; i++)
        set_dirty (l, c[i].region);     /* as they are on the device */
  }
  end_write (l);
  pthread_mutex_unlock (&l->lock);

 out:
  pthread_mutex_unlock (&l->pass_lock);
  free (c);
}

void
mirror_log_flush_failed (struct mirror *m)
{
  log_failed (m, LOG_FLUSH_ERR, -EIO);
}

void
mirror_log_clear_pass (struct mirror *m)
{
  clear_pass (m, false);
}

void
mirror_log_clean_all (struct mirror *m)
{
  clear_pass (m, true);
}

char
mirror_log_status_char (struct mirror *m)
{
  unsigned e = atomic_load (&m->log->errors);

  return e & LOG_FLUSH_ERR ? 'F' : e & LOG_WRITE_ERR ? 'D' : 'A';
}

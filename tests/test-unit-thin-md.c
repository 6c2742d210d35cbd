/* SPDX-License-Identifier: BSD-3-Clause */
/* server/pdata/ (thin-pool metadata in dm's on-disk format) against a
 * model, with thin-provisioning-tools as the oracle: after every commit of
 * a random workload (devices, writes, discards, snapshots of snapshots,
 * deletes, aborts) thin_check is clean and thin_dump shows exactly the
 * model's devices and mappings; thin_delta shows a snapshot's
 * differences; metadata made by thin_restore is read back exactly; a
 * crash at any write of a commit reopens at a commit; damaged blocks give
 * an error naming the block.  Plain files as the metadata device.
 *
 *   THIN_MD_SEED=N   replay one seed (printed at the start)
 */
#include <config.h>

#include "unit.h"

#include <stdatomic.h>
#include <sched.h>
#include <sys/wait.h>
#include <time.h>

#include "pdata/thin-metadata.h"
#include "pdata/pdata.h"

#define MD_BLOCKS 4096            /* 16 MiB metadata files */
#define DATA_BLOCKS 50000         /* over three data space map bitmaps */
#define BLOCK_SECTORS 128
#define MAXDEV 48
#define NVB 2500                  /* vblocks per device in the model */

static uint64_t rng_state;

/* unit_path's buffers rotate: keep the paths a test holds. */
static const char *
path_of (const char *name)
{
  static char paths[32][256];
  static unsigned n;

  if (n == 32)
    UNIT_FATAL ("path_of: too many paths");
  snprintf (paths[n], sizeof paths[n], "%s", unit_path (name));
  return paths[n++];
}

static uint64_t
rnd (uint64_t n)
{
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return n ? rng_state % n : 0;
}

/* --- a file as the metadata device; optionally drops writes after N ---- */

struct fdev {
  struct pd_blockdev bd;
  int fd;
  long limit;                     /* writes allowed, -1: all */
  long writes;
  int fail_reads;                 /* test EIO from the device */
};

static int
fdev_read (void *opaque, uint64_t off, size_t len, void *buf)
{
  struct fdev *d = opaque;

  if (d->fail_reads)
    return -EIO;
  return pread (d->fd, buf, len, off) == (ssize_t) len ? 0 : -EIO;
}

static int
fdev_write (void *opaque, uint64_t off, size_t len, const void *buf)
{
  struct fdev *d = opaque;

  if (d->limit >= 0 && d->writes++ >= d->limit)
    return 0;                     /* lost in the crash */
  return pwrite (d->fd, buf, len, off) == (ssize_t) len ? 0 : -EIO;
}

static int
fdev_flush (void *opaque)
{
  (void) opaque;
  return 0;
}

static const struct pd_blockdev_ops fdev_ops = {
  .read = fdev_read, .write = fdev_write, .flush = fdev_flush,
};

static void
fdev_open (struct fdev *d, const char *path)
{
  struct stat st;

  memset (d, 0, sizeof *d);
  d->fd = open (path, O_RDWR | O_CLOEXEC);
  if (d->fd == -1 || fstat (d->fd, &st) == -1)
    UNIT_FATAL ("%s: %s", path, strerror (errno));
  d->bd = (struct pd_blockdev) { .ops = &fdev_ops, .opaque = d,
                                 .size = st.st_size };
  d->limit = -1;
}

static struct thin_md *
md_open (struct fdev *d, const char *path, size_t cache, char *err, int *rp)
{
  struct thin_md_open_args a = {
    .dev = &d->bd, .data_block_sectors = BLOCK_SECTORS,
    .nr_data_blocks = DATA_BLOCKS, .cache_blocks = cache,
  };
  struct thin_md *md = NULL;

  fdev_open (d, path);
  *rp = thin_md_open (&a, &md, err);
  return *rp == 0 ? md : NULL;
}

/* --- the model ---------------------------------------------------------- */

struct mdev {
  bool exists;
  uint64_t mapped, trans;
  uint32_t ctime, stime;
  uint64_t data[NVB];             /* data block + 1, 0: unmapped */
  uint32_t time[NVB];
};

struct model {
  struct mdev dev[MAXDEV];
  uint32_t time;
  uint64_t trans_id;
};

/* nr_data: a metadata snapshot's superblock has no space maps (dm wipes
 * them), so thin_dump --metadata-snap shows 0 data blocks.  shared: the
 * library's form, a shared flag instead of the time.
 */
static void
model_text (const struct model *m, FILE *f, unsigned nr_data, bool shared)
{
  fprintf (f, "superblock time=%u transaction=%llu data_block_size=%u "
           "nr_data_blocks=%u\n", m->time, (unsigned long long) m->trans_id,
           BLOCK_SECTORS, nr_data);
  for (int i = 0; i < MAXDEV; i++) {
    const struct mdev *d = &m->dev[i];
    if (!d->exists)
      continue;
    fprintf (f, "device %d mapped=%llu transaction=%llu creation=%u snap=%u\n",
             i, (unsigned long long) d->mapped, (unsigned long long) d->trans,
             d->ctime, d->stime);
    for (int v = 0; v < NVB; v++) {
      if (!d->data[v])
        continue;
      fprintf (f, "%d %llu ", v, (unsigned long long) d->data[v] - 1);
      if (shared)
        fprintf (f, "%s\n", d->stime > d->time[v] ? "s" : "-");
      else
        fprintf (f, "%u\n", d->time[v]);
    }
  }
}

/* While a metadata snapshot is held, the blocks it maps stay in use. */
static const struct model *held_model;

static uint64_t
model_used (const struct model *m)
{
  static uint8_t used[DATA_BLOCKS];
  uint64_t n = 0;

  memset (used, 0, sizeof used);
  for (const struct model *x = m; x; x = x == m ? held_model : NULL)
    for (int i = 0; i < MAXDEV; i++)
      for (int v = 0; x->dev[i].exists && v < NVB; v++)
        if (x->dev[i].data[v] && !used[x->dev[i].data[v] - 1]++)
          n++;
  return n;
}

/* The damage test expects the workload helpers to fail. */
static bool expect_errors;
#define WCHECKF(cond, ...) do { if (!expect_errors) CHECKF (cond, __VA_ARGS__); } while (0)

/* --- the tools ---------------------------------------------------------- */

static bool have_tools;

static int
run (const char *cmd)
{
  int st = system (cmd);
  return WIFEXITED (st) ? WEXITSTATUS (st) : -1;
}

static unsigned long long
attr (const char *line, const char *name)
{
  char key[64];
  const char *p;

  snprintf (key, sizeof key, " %s=\"", name);
  p = strstr (line, key);
  return p ? strtoull (p + strlen (key), NULL, 10) : ~0ull;
}

/* thin_dump's XML in the model's text form. */
static void
dump_text (const char *xml, FILE *out)
{
  char line[1024];
  FILE *f = fopen (xml, "r");

  if (!f)
    UNIT_FATAL ("%s: %s", xml, strerror (errno));
  while (fgets (line, sizeof line, f)) {
    if (strstr (line, "<superblock"))
      fprintf (out, "superblock time=%llu transaction=%llu data_block_size=%llu "
               "nr_data_blocks=%llu\n", attr (line, "time"),
               attr (line, "transaction"), attr (line, "data_block_size"),
               attr (line, "nr_data_blocks"));
    else if (strstr (line, "<device"))
      fprintf (out, "device %llu mapped=%llu transaction=%llu creation=%llu "
               "snap=%llu\n", attr (line, "dev_id"),
               attr (line, "mapped_blocks"), attr (line, "transaction"),
               attr (line, "creation_time"), attr (line, "snap_time"));
    else if (strstr (line, "<range_mapping"))
      for (unsigned long long k = 0; k < attr (line, "length"); k++)
        fprintf (out, "%llu %llu %llu\n", attr (line, "origin_begin") + k,
                 attr (line, "data_begin") + k, attr (line, "time"));
    else if (strstr (line, "<single_mapping"))
      fprintf (out, "%llu %llu %llu\n", attr (line, "origin_block"),
               attr (line, "data_block"), attr (line, "time"));
  }
  fclose (f);
}

static bool quiet;                /* a mismatch may be expected */

static bool
same_files (const char *a, const char *b, const char *what)
{
  char cmd[1024];

  snprintf (cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
  if (run (cmd) == 0)
    return true;
  if (quiet)
    return false;
  fprintf (stderr, "%s: differs:\n", what);
  snprintf (cmd, sizeof cmd, "diff '%s' '%s' | head -20 >&2", a, b);
  run (cmd);
  return false;
}

/* thin_check clean (no errors, no leaks) on path. */
static bool
check_clean (const char *path, const char *what)
{
  char cmd[1024];
  size_t n;
  char *log;
  bool ok;

  snprintf (cmd, sizeof cmd, "thin_check '%s' > '%s' 2>&1", path,
            unit_path ("check.log"));
  ok = run (cmd) == 0;
  log = unit_read_file (unit_path ("check.log"), &n);
  if (log) {
    log = realloc (log, n + 1);
    log[n] = '\0';
    if (strstr (log, "leak") || strstr (log, "rror") || strstr (log, "bad"))
      ok = false;
    if (!ok)
      fprintf (stderr, "%s: thin_check %s:\n%s", what, path, log);
    free (log);
  }
  return ok;
}

/* thin_dump (of the metadata snapshot if snap) equals the model. */
static bool
dump_equals (const char *path, const struct model *m, bool snap,
             const char *what)
{
  char cmd[1024];
  FILE *f;

  snprintf (cmd, sizeof cmd, "thin_dump %s '%s' > '%s' 2>&1",
            snap ? "--metadata-snap" : "", path, unit_path ("dump.xml"));
  if (run (cmd) != 0) {
    fprintf (stderr, "%s: thin_dump failed\n", what);
    run ("cat >&2 " "\"$(ls -d /tmp/nbdmapper-unit-*/dump.xml | head -1)\"");
    return false;
  }
  f = fopen (unit_path ("dump.txt"), "w");
  dump_text (unit_path ("dump.xml"), f);
  fclose (f);
  f = fopen (unit_path ("model.txt"), "w");
  model_text (m, f, snap ? 0 : DATA_BLOCKS, false);
  fclose (f);
  return same_files (unit_path ("model.txt"), unit_path ("dump.txt"), what);
}

/* --- the library's view against the model ---------------------------- */

static int
list_fn (void *opaque, const struct thin_md_dev_info *info)
{
  FILE *f = opaque;
  fprintf (f, "device %llu mapped=%llu transaction=%llu creation=%u snap=%u\n",
           (unsigned long long) info->dev_id,
           (unsigned long long) info->mapped_blocks,
           (unsigned long long) info->transaction_id, info->creation_time,
           info->snapshotted_time);
  return 0;
}

/* Everything the library shows, in the model's text form (times from the
 * shared flag are checked separately; here the model's time is printed
 * for mapped blocks whose data agrees).
 */
static void
library_text (struct thin_md *md, FILE *f, uint64_t nvb)
{
  struct dev_list { struct thin_md_dev_info v[MAXDEV * 4]; int n; };
  FILE *devs = tmpfile ();
  char line[256];

  fprintf (f, "superblock time=%u transaction=", thin_md_get_time (md));
  {
    uint64_t t, nb;
    thin_md_get_transaction_id (md, &t);
    thin_md_get_data_dev_size (md, &nb);
    fprintf (f, "%llu data_block_size=%u nr_data_blocks=%llu\n",
             (unsigned long long) t, BLOCK_SECTORS, (unsigned long long) nb);
  }
  thin_md_list_devices (md, list_fn, devs);
  rewind (devs);
  while (fgets (line, sizeof line, devs)) {
    unsigned long long id = strtoull (line + 7, NULL, 10);
    struct thin_md_dev *td;
    uint64_t b = 0, vb, ve, db;
    bool shared;
    char err[PD_ERR_LEN];

    fputs (line, f);
    if (thin_md_dev_open (md, id, &td, err) != 0) {
      fprintf (f, "open failed: %s\n", err);
      continue;
    }
    while (thin_md_find_mapped_range (td, b, nvb, &vb, &ve, &db,
                                      &shared) == 0) {
      for (uint64_t v = vb; v < ve; v++) {
        uint64_t d;
        bool s;
        if (thin_md_find_block (td, v, &d, &s) != 0 || d != db + (v - vb) ||
            s != shared)
          fprintf (f, "find_block %llu disagrees with find_mapped_range\n",
                   (unsigned long long) v);
        fprintf (f, "%llu %llu %s\n", (unsigned long long) v,
                 (unsigned long long) (db + v - vb), shared ? "s" : "-");
      }
      b = ve;
    }
    thin_md_dev_close (td);
  }
  fclose (devs);
}

static bool
library_equals (struct thin_md *md, const struct model *m, const char *what)
{
  FILE *f = fopen (unit_path ("lib.txt"), "w");
  bool ok;
  uint64_t free_blocks;

  library_text (md, f, NVB);
  fclose (f);
  f = fopen (unit_path ("modellib.txt"), "w");
  model_text (m, f, DATA_BLOCKS, true);
  fclose (f);
  ok = same_files (unit_path ("modellib.txt"), unit_path ("lib.txt"), what);
  thin_md_get_free_data_blocks (md, &free_blocks);
  if (!quiet)
    CHECKF (free_blocks == DATA_BLOCKS - model_used (m),
          "%s: %llu free data blocks, the model has %llu", what,
          (unsigned long long) free_blocks,
          (unsigned long long) (DATA_BLOCKS - model_used (m)));
  return ok && free_blocks == DATA_BLOCKS - model_used (m);
}

/* --- workload steps (library and model together) ---------------------- */

static void
do_create (struct thin_md *md, struct model *m, int id)
{
  char err[PD_ERR_LEN];
  int r = thin_md_create_thin (md, id, err);

  CHECKF (r == 0, "create_thin %d: %s", id, err);
  m->dev[id] = (struct mdev) { .exists = true, .trans = m->trans_id,
                               .ctime = m->time, .stime = m->time };
}

static void
do_snap (struct thin_md *md, struct model *m, int id, int origin)
{
  char err[PD_ERR_LEN];
  int r = thin_md_create_snap (md, id, origin, err);

  CHECKF (r == 0, "create_snap %d of %d: %s", id, origin, err);
  m->time++;
  m->dev[id] = m->dev[origin];
  m->dev[id].trans = m->trans_id;
  m->dev[id].ctime = m->dev[id].stime = m->time;
  m->dev[origin].stime = m->time;
}

static void
do_write (struct thin_md *md, struct model *m, int id, int vb, int len)
{
  struct thin_md_dev *td;
  char err[PD_ERR_LEN];

  if (thin_md_dev_open (md, id, &td, err) != 0) {
    WCHECKF (0, "dev_open %d: %s", id, err);
    return;
  }
  for (int v = vb; v < vb + len && v < NVB; v++) {
    uint64_t b;
    int r = thin_md_alloc_data_block (md, &b);
    if (r == -ENOSPC)
      break;
    WCHECKF (r == 0, "alloc: %d", r);
    r = thin_md_insert_block (td, v, b);
    if (r) {
      thin_md_last_error (md, err);
      WCHECKF (r == 0, "insert %d/%d: %s", id, v, err);
      break;
    }
    if (!m->dev[id].data[v])
      m->dev[id].mapped++;
    m->dev[id].data[v] = b + 1;
    m->dev[id].time[v] = m->time;
  }
  thin_md_dev_close (td);
}

static void
do_discard (struct thin_md *md, struct model *m, int id, int vb, int len)
{
  struct thin_md_dev *td;
  char err[PD_ERR_LEN];
  int r;

  if (thin_md_dev_open (md, id, &td, err) != 0) {
    WCHECKF (0, "dev_open %d: %s", id, err);
    return;
  }
  r = thin_md_remove_range (td, vb, vb + len);
  thin_md_last_error (md, err);
  WCHECKF (r == 0, "remove_range %d %d+%d: %s", id, vb, len, err);
  for (int v = vb; v < vb + len && v < NVB; v++)
    if (m->dev[id].data[v]) {
      m->dev[id].data[v] = 0;
      m->dev[id].mapped--;
    }
  thin_md_dev_close (td);
}

static void
do_delete (struct thin_md *md, struct model *m, int id)
{
  char err[PD_ERR_LEN];
  int r = thin_md_delete (md, id, err);

  CHECKF (r == 0, "delete %d: %s", id, err);
  m->dev[id].exists = false;
}

static bool
commit_and_check (struct thin_md *md, const char *path, struct model *m,
                  struct model *committed, const char *what)
{
  char err[PD_ERR_LEN];
  int r = thin_md_commit (md, err);
  bool ok = true;

  CHECKF (r == 0, "%s: commit: %s", what, err);
  *committed = *m;
  if (have_tools) {
    ok = check_clean (path, what) && ok;
    ok = dump_equals (path, m, false, what) && ok;
  }
  ok = library_equals (md, m, what) && ok;
  CHECKF (ok, "%s: metadata differs from the model", what);
  return ok;
}

static int
random_existing (const struct model *m)
{
  int n = 0, pick;

  for (int i = 0; i < MAXDEV; i++)
    n += m->dev[i].exists;
  if (!n)
    return -1;
  pick = (int) rnd (n);
  for (int i = 0; i < MAXDEV; i++)
    if (m->dev[i].exists && pick-- == 0)
      return i;
  return -1;
}

static int
random_free_id (const struct model *m)
{
  for (int tries = 0; tries < 100; tries++) {
    int id = (int) rnd (MAXDEV);
    if (!m->dev[id].exists)
      return id;
  }
  return -1;
}

/* --- tests -------------------------------------------------------------- */

static struct model m, committed;

static void
new_metadata (const char *path)
{
  unit_write_file (path, NULL, (size_t) MD_BLOCKS * PD_BLOCK_SIZE);
}

/* New, empty metadata at path, opened; the model emptied. */
static struct thin_md *
fresh (const char *path, struct fdev *d, size_t cache)
{
  char err[PD_ERR_LEN];
  struct thin_md *md;
  int r;

  new_metadata (path);
  md = md_open (d, path, cache, err, &r);
  CHECKF (md, "open %s: %s", path, err);
  memset (&m, 0, sizeof m);
  return md;
}

static void
finish (struct thin_md *md, struct fdev *d)
{
  char err[PD_ERR_LEN];

  CHECKF (thin_md_close (md, err) == 0, "close: %s", err);
  close (d->fd);
}

/* Snapshots of snapshots ten deep, each level writing over part of what
 * it shares; then deleting from the middle and the ends.
 */
static void
test_chain (void)
{
  const char *path = path_of ("chain.md");
  struct fdev d;
  struct thin_md *md;

  md = fresh (path, &d, 128);
  if (!md)
    return;
  do_create (md, &m, 0);
  do_write (md, &m, 0, 0, 600);
  commit_and_check (md, path, &m, &committed, "chain base");
  for (int level = 1; level <= 10; level++) {
    do_snap (md, &m, level, level - 1);
    do_write (md, &m, level, level * 37, 50);
    do_write (md, &m, level - 1, level * 53, 20);
    do_discard (md, &m, level, level * 11, 7);
  }
  commit_and_check (md, path, &m, &committed, "chain ten deep");
  do_delete (md, &m, 5);
  do_delete (md, &m, 0);
  commit_and_check (md, path, &m, &committed, "chain deletes");
  for (int level = 1; level <= 10; level++)
    if (m.dev[level].exists)
      do_delete (md, &m, level);
  commit_and_check (md, path, &m, &committed, "chain all deleted");
  {
    uint64_t n;
    thin_md_get_free_data_blocks (md, &n);
    CHECK_EQ (n, DATA_BLOCKS);
  }
  finish (md, &d);
}

/* Errors with their messages, changing nothing. */
static void
test_errors (void)
{
  const char *path = path_of ("errors.md");
  struct fdev d;
  char err[PD_ERR_LEN];
  struct thin_md *md;
  struct thin_md_dev *td;
  uint64_t t;

  md = fresh (path, &d, 64);
  if (!md)
    return;
  do_create (md, &m, 1);
  CHECK_EQ (thin_md_create_thin (md, 1, err), -EEXIST);
  CHECKF (strstr (err, "device 1: already exists"), "%s", err);
  CHECK_EQ (thin_md_create_thin (md, 1 << 24, err), -EINVAL);
  CHECKF (strstr (err, "over the maximum"), "%s", err);
  CHECK_EQ (thin_md_create_snap (md, 2, 7, err), -ENODATA);
  CHECKF (strstr (err, "origin device 7"), "%s", err);
  CHECK_EQ (thin_md_delete (md, 9, err), -ENODATA);
  CHECK_EQ (thin_md_dev_open (md, 9, &td, err), -ENODATA);
  CHECK_EQ (thin_md_dev_open (md, 1, &td, err), 0);
  CHECK_EQ (thin_md_delete (md, 1, err), -EBUSY);
  CHECKF (strstr (err, "device 1: is open"), "%s", err);
  CHECK_EQ (thin_md_find_block (td, 5, &t, &(bool) { 0 }), -ENODATA);
  CHECK_EQ (thin_md_dev_highest_mapped (td, &t), -ENODATA);
  thin_md_dev_close (td);
  CHECK_EQ (thin_md_set_transaction_id (md, 3, 4, err), -EINVAL);
  CHECKF (strstr (err, "transaction id is 0, not 3"), "%s", err);
  CHECK_EQ (thin_md_set_transaction_id (md, 0, 4, err), 0);
  m.trans_id = 4;
  CHECK_EQ (thin_md_release_metadata_snap (md, err), -EINVAL);
  CHECK_EQ (thin_md_resize_data_dev (md, 10, err), -EINVAL);
  CHECKF (strstr (err, "cannot shrink"), "%s", err);
  commit_and_check (md, path, &m, &committed, "errors");
  CHECK_EQ (thin_md_close (md, err), 0);
  close (d.fd);

  /* The table's block size must match the superblock's. */
  {
    struct thin_md_open_args a = {
      .dev = &d.bd, .data_block_sectors = 256,
      .nr_data_blocks = DATA_BLOCKS, .cache_blocks = 64,
    };
    fdev_open (&d, path);
    CHECK_EQ (thin_md_open (&a, &md, err), -EINVAL);
    CHECKF (strstr (err, "superblock: data block size 128 sectors, table "
                    "says 256"), "%s", err);
    a.data_block_sectors = BLOCK_SECTORS;
    a.nr_data_blocks = DATA_BLOCKS - 1;
    CHECK_EQ (thin_md_open (&a, &md, err), -EINVAL);
    CHECKF (strstr (err, "smaller than"), "%s", err);
    close (d.fd);
  }
}

/* Failed metadata fails every later commit, with nothing changed too (a
 * flush must not say durable), quoting the first failure, never nested.
 */
static void
test_failed_commit (void)
{
  const char *path = path_of ("failed.md");
  struct fdev d;
  char err[PD_ERR_LEN], err2[PD_ERR_LEN];
  struct thin_md *md;
  struct thin_md_dev *td;
  uint64_t t, b;
  int r;

  md = fresh (path, &d, 64);
  if (!md)
    return;
  CHECK_EQ (thin_md_create_thin (md, 1, err), 0);
  CHECK_EQ (thin_md_dev_open (md, 1, &td, err), 0);
  CHECK_EQ (thin_md_alloc_data_block (md, &b), 0);
  CHECK_EQ (thin_md_insert_block (td, 0, b), 0);
  thin_md_dev_close (td);
  CHECKF (thin_md_commit (md, err) == 0, "%s", err);
  finish (md, &d);

  /* Reopened: nothing cached, and the device stops reading. */
  md = md_open (&d, path, 64, err, &r);
  CHECKF (md, "open %s: %s", path, err);
  if (!md)
    return;
  CHECK_EQ (thin_md_dev_open (md, 1, &td, err), 0);
  d.fail_reads = 1;
  CHECK_EQ (thin_md_find_block (td, 0, &t, &(bool) { 0 }), -EIO);
  CHECK (thin_md_failed (md));
  CHECK (!thin_md_changed (md));
  CHECK_EQ (thin_md_commit (md, err), -EROFS);
  CHECKF (strstr (err, "failed earlier (metadata block ") &&
          strstr (err, "read failed"), "%s", err);
  CHECK_EQ (thin_md_commit (md, err2), -EROFS);
  CHECKF (strcmp (err, err2) == 0, "%s, then %s", err, err2);
  thin_md_dev_close (td);
  d.fail_reads = 0;
  thin_md_close (md, err);
  close (d.fd);
}

/* Data block references outside mappings: a released block (its write
 * failed) and dm-thin's discard passdown (inc, unmap, is_shared, dec).
 */
static void
test_data_refs (void)
{
  const char *path = path_of ("refs.md");
  struct fdev d;
  char err[PD_ERR_LEN];
  struct thin_md *md;
  struct thin_md_dev *td;
  uint64_t b, b0, b1, n0, n;
  bool shared;

  md = fresh (path, &d, 64);
  if (!md)
    return;
  thin_md_get_free_data_blocks (md, &n0);
  CHECK_EQ (thin_md_alloc_data_block (md, &b), 0);
  thin_md_get_free_data_blocks (md, &n);
  CHECK_EQ (n, n0 - 1);
  CHECK_EQ (thin_md_release_data_block (md, b), 0);
  thin_md_get_free_data_blocks (md, &n);
  CHECK_EQ (n, n0);
  CHECK_EQ (thin_md_release_data_block (md, b), -EINVAL);
  thin_md_last_error (md, err);
  CHECKF (strstr (err, "released but not in use"), "%s", err);
  CHECK (!thin_md_failed (md));
  /* not handed out again before the commit */
  CHECK_EQ (thin_md_alloc_data_block (md, &n), 0);
  CHECK (n != b);
  CHECK_EQ (thin_md_release_data_block (md, n), 0);

  do_create (md, &m, 1);
  do_write (md, &m, 1, 0, 10);
  do_snap (md, &m, 2, 1);
  do_write (md, &m, 1, 20, 1);
  b0 = m.dev[1].data[0] - 1;
  b1 = m.dev[1].data[20] - 1;
  CHECK_EQ (thin_md_dev_open (md, 1, &td, err), 0);
  CHECK_EQ (thin_md_inc_data_range (md, b0, b0 + 1), 0);
  CHECK_EQ (thin_md_inc_data_range (md, b1, b1 + 1), 0);
  CHECK_EQ (thin_md_remove_range (td, 0, 1), 0);
  CHECK_EQ (thin_md_remove_range (td, 20, 21), 0);
  thin_md_dev_close (td);
  m.dev[1].data[0] = m.dev[1].data[20] = 0;
  m.dev[1].mapped -= 2;
  CHECK_EQ (thin_md_block_is_shared (md, b0, &shared), 0);
  CHECK (shared);                /* device 2 maps it */
  CHECK_EQ (thin_md_block_is_shared (md, b1, &shared), 0);
  CHECK (!shared);               /* only our passdown reference */
  CHECK_EQ (thin_md_dec_data_range (md, b0, b0 + 1), 0);
  CHECK_EQ (thin_md_dec_data_range (md, b1, b1 + 1), 0);
  commit_and_check (md, path, &m, &committed, "data refs");
  finish (md, &d);
}

/* Read-only use, the needs_check flag, growing the data device. */
static void
test_modes (void)
{
  const char *path = path_of ("modes.md");
  const char *empty = path_of ("modes-empty.md");
  struct fdev d;
  char err[PD_ERR_LEN], cmd[1024];
  int r;
  struct thin_md *md;
  struct thin_md_dev *td;
  uint64_t b, n, used;
  bool shared;
  struct thin_md_open_args a = {
    .dev = &d.bd, .data_block_sectors = BLOCK_SECTORS,
    .nr_data_blocks = DATA_BLOCKS, .cache_blocks = 64, .read_only = true,
  };

  md = fresh (path, &d, 64);
  if (!md)
    return;
  do_create (md, &m, 1);
  do_write (md, &m, 1, 0, 100);
  commit_and_check (md, path, &m, &committed, "modes");
  CHECK_EQ (thin_md_close (md, err), 0);
  close (d.fd);

  /* read-only: lookups work, changes are refused, the file is untouched */
  fdev_open (&d, path);
  d.limit = 0;
  CHECK_EQ (thin_md_open (&a, &md, err), 0);
  if (md) {
    CHECK_EQ (thin_md_dev_open (md, 1, &td, err), 0);
    CHECK_EQ (thin_md_find_block (td, 5, &b, &shared), 0);
    CHECK_EQ (b, m.dev[1].data[5] - 1);
    CHECK_EQ (thin_md_alloc_data_block (md, &b), -EROFS);
    CHECK_EQ (thin_md_insert_block (td, 7, 0), -EROFS);
    thin_md_dev_close (td);
    CHECK_EQ (thin_md_create_thin (md, 2, err), -EROFS);
    CHECKF (strstr (err, "read-only"), "%s", err);
    CHECK_EQ (thin_md_set_needs_check (md), -EROFS);
    CHECK_EQ (thin_md_close (md, err), 0);
  }
  CHECK_EQ (d.writes, 0);
  close (d.fd);
  new_metadata (empty);
  fdev_open (&d, empty);
  CHECK_EQ (thin_md_open (&a, &md, err), -EROFS);
  CHECKF (strstr (err, "empty metadata device, and read-only"), "%s", err);
  close (d.fd);

  /* needs_check: set at once in the committed superblock; thin_check
   * --clear-needs-check-flag clears it
   */
  md = md_open (&d, path, 64, err, &r);
  CHECK (md && !thin_md_needs_check (md));
  if (!md)
    return;
  CHECK_EQ (thin_md_set_needs_check (md), 0);
  CHECK (thin_md_needs_check (md));
  {
    /* on disk already: a second, read-only reader sees it */
    struct fdev d2;
    struct thin_md *md2;
    fdev_open (&d2, path);
    a.dev = &d2.bd;
    CHECK_EQ (thin_md_open (&a, &md2, err), 0);
    CHECK (md2 && thin_md_needs_check (md2));
    if (md2)
      CHECK_EQ (thin_md_close (md2, err), 0);
    close (d2.fd);
    a.dev = &d.bd;
  }
  CHECK_EQ (thin_md_close (md, err), 0);
  close (d.fd);
  snprintf (cmd, sizeof cmd, "thin_check --clear-needs-check-flag '%s' "
            "> /dev/null 2>&1", path);
  CHECK_EQ (run (cmd), 0);
  md = md_open (&d, path, 64, err, &r);
  CHECK (md && !thin_md_needs_check (md));

  /* growing the data device, over a bitmap boundary: every new block can
   * be allocated, and the tools agree
   */
  if (md) {
    CHECK_EQ (thin_md_resize_data_dev (md, 4 * 16320 + 5, err), 0);
    CHECK_EQ (thin_md_commit (md, err), 0);
    thin_md_get_data_dev_size (md, &n);
    CHECK_EQ (n, 4 * 16320 + 5);
    used = 0;
    while (thin_md_alloc_data_block (md, &b) == 0)
      used++;
    CHECK_EQ (used, 4 * 16320 + 5 - 100);
    CHECK_EQ (thin_md_abort (md, err), 0);
    CHECK_EQ (thin_md_close (md, err), 0);
    close (d.fd);
    if (have_tools) {
      CHECK (check_clean (path, "resized"));
      snprintf (cmd, sizeof cmd, "thin_dump '%s' | grep -q "
                "'nr_data_blocks=\"%d\"'", path, 4 * 16320 + 5);
      CHECK_EQ (run (cmd), 0);
    }
  }
  /* a data device of no whole block: nothing to allocate, no crash */
  {
    struct fdev d0;
    struct thin_md *md0;
    const char *zero = path_of ("modes-zero.md");
    struct thin_md_open_args z = {
      .dev = &d0.bd, .data_block_sectors = BLOCK_SECTORS,
      .nr_data_blocks = 0, .cache_blocks = 64,
    };
    new_metadata (zero);
    fdev_open (&d0, zero);
    CHECK_EQ (thin_md_open (&z, &md0, err), 0);
    if (md0) {
      CHECK_EQ (thin_md_alloc_data_block (md0, &b), -ENOSPC);
      thin_md_last_error (md0, err);
      CHECKF (strstr (err, "data device full (0 blocks)"), "%s", err);
      finish (md0, &d0);
    }
  }
  /* a bigger data device at open grows the space map too */
  a.read_only = false;
  a.nr_data_blocks = 5 * 16320;
  fdev_open (&d, path);
  CHECK_EQ (thin_md_open (&a, &md, err), 0);
  if (md) {
    thin_md_get_free_data_blocks (md, &n);
    CHECK_EQ (n, 5 * 16320 - 100);
    CHECK_EQ (thin_md_close (md, err), 0);
  }
  close (d.fd);
  if (have_tools)
    CHECK (check_clean (path, "grown at open"));
}

/* Hundreds of devices: the top-level and details trees get internal
 * nodes, and deleting most of them rebalances and shrinks those trees.
 */
static int
count_fn (void *opaque, const struct thin_md_dev_info *info)
{
  uint8_t *alive = opaque;

  if (info->dev_id >= 4000 || !alive[info->dev_id] ||
      info->mapped_blocks != info->dev_id % 3)
    return -EIO;
  alive[info->dev_id] = 2;
  return 0;
}

static void
test_many_devices (void)
{
  const char *path = path_of ("many.md");
  static uint8_t alive[4000];
  struct fdev d;
  char err[PD_ERR_LEN], cmd[1024];
  struct thin_md *md;
  struct thin_md_dev *td;
  uint64_t b, free0, n;
  int nalive = 0;

  md = fresh (path, &d, 64);
  if (!md)
    return;
  thin_md_get_free_data_blocks (md, &free0);
  for (int i = 0; i < 700; i++) {
    int id = (int) ((i * 2654435761u) % 4000);
    if (alive[id])
      continue;
    CHECKF (thin_md_create_thin (md, id, err) == 0, "create %d: %s", id, err);
    CHECK_EQ (thin_md_dev_open (md, id, &td, err), 0);
    for (int k = 0; k < id % 3; k++) {
      CHECK_EQ (thin_md_alloc_data_block (md, &b), 0);
      CHECK_EQ (thin_md_insert_block (td, k * 1000, b), 0);
    }
    thin_md_dev_close (td);
    alive[id] = 1;
    nalive++;
  }
  for (int round = 0; round < 4; round++) {
    CHECK_EQ (thin_md_commit (md, err), 0);
    if (have_tools) {
      CHECK (check_clean (path, "many devices"));
      snprintf (cmd, sizeof cmd, "test \"$(thin_dump '%s' | grep -c '<device ')\" "
                "= %d", path, nalive);
      CHECKF (run (cmd) == 0, "thin_dump does not show %d devices", nalive);
    }
    for (int id = 0; id < 4000; id++)
      if (alive[id])
        alive[id] = 1;
    CHECK_EQ (thin_md_list_devices (md, count_fn, alive), 0);
    for (int id = 0; id < 4000; id++)
      CHECKF (alive[id] != 1, "device %d not listed", id);
    /* delete about 60% of what is left, in a scattered order */
    for (int id = round; id < 4000; id += 1 + (id % 2)) {
      if (!alive[id] || rnd (5) < 2)
        continue;
      CHECKF (thin_md_delete (md, id, err) == 0, "delete %d: %s", id, err);
      alive[id] = 0;
      nalive--;
    }
  }
  for (int id = 0; id < 4000; id++)
    if (alive[id])
      CHECKF (thin_md_delete (md, id, err) == 0, "delete %d: %s", id, err);
  CHECK_EQ (thin_md_commit (md, err), 0);
  thin_md_get_free_data_blocks (md, &n);
  CHECK_EQ (n, free0);
  if (have_tools)
    CHECK (check_clean (path, "many devices, all deleted"));
  finish (md, &d);
}

/* A nearly full metadata device: as dm, a reserve is kept for the
 * commit, so changes are refused with -ENOSPC and a message while the
 * metadata stays sound: what was done commits, clean, and deleting a
 * device makes room again.
 */
static void
test_metadata_full (void)
{
  const char *path = path_of ("full.md");
  struct fdev d;
  char err[PD_ERR_LEN];
  int r = 0, v;
  struct thin_md *md;
  struct thin_md_dev *td;
  uint64_t b;

  unit_write_file (path, NULL, 40 * PD_BLOCK_SIZE);
  md = md_open (&d, path, 64, err, &r);
  CHECKF (md, "open: %s", err);
  if (!md)
    return;
  memset (&m, 0, sizeof m);
  do_create (md, &m, 1);
  do_create (md, &m, 2);
  do_write (md, &m, 2, 0, 300);
  commit_and_check (md, path, &m, &committed, "metadata nearly full");
  CHECK_EQ (thin_md_dev_open (md, 1, &td, err), 0);
  for (v = 0; v < NVB; v++) {
    if ((r = thin_md_alloc_data_block (md, &b)) != 0)
      break;
    if ((r = thin_md_insert_block (td, v, b)) != 0) {
      CHECK_EQ (thin_md_release_data_block (md, b), 0);
      break;
    }
    m.dev[1].data[v] = b + 1;
    m.dev[1].mapped++;
  }
  CHECK_EQ (r, -ENOSPC);
  thin_md_last_error (md, err);
  CHECKF (strstr (err, "metadata space low: ") &&
          strstr (err, "of 40 blocks free, 16 kept for the commit"),
          "%s", err);
  CHECK (!thin_md_failed (md));
  CHECK_EQ (thin_md_create_thin (md, 3, err), -ENOSPC);
  CHECKF (strstr (err, "metadata space low"), "%s", err);
  CHECK (v > 10);
  thin_md_dev_close (td);
  commit_and_check (md, path, &m, &committed, "metadata full, committed");
  /* deleting frees blocks, after the commit they can be used again */
  do_delete (md, &m, 2);
  commit_and_check (md, path, &m, &committed, "metadata full, deleted");
  do_create (md, &m, 3);
  do_write (md, &m, 3, 0, 50);
  commit_and_check (md, path, &m, &committed, "metadata room again");
  finish (md, &d);
}

/* Lookups from several threads while another changes and commits. */
struct reader_arg {
  struct thin_md *md;
  atomic_bool *stop;
  atomic_int started;
  long lookups, errors;
};

static void *
reader (void *p)
{
  struct reader_arg *a = p;
  struct thin_md_dev *td;
  char err[PD_ERR_LEN];
  uint64_t x = (uint64_t) (uintptr_t) p | 1, b, vb, ve;
  bool shared;

  if (thin_md_dev_open (a->md, 1, &td, err) != 0) {
    a->errors++;
    atomic_store (&a->started, 1);
    return NULL;
  }
  while (!atomic_load (a->stop)) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    /* blocks below 500 are mapped for good, the rest come and go */
    if (thin_md_find_block (td, x % 500, &b, &shared) != 0)
      a->errors++;
    if (thin_md_find_mapped_range (td, x % 2000, 2000, &vb, &ve, &b,
                                   &shared) == 0 && ve <= vb)
      a->errors++;
    a->lookups++;
    atomic_store (&a->started, 1);
  }
  thin_md_dev_close (td);
  return NULL;
}

static void
test_threads (void)
{
  const char *path = path_of ("threads.md");
  struct fdev d;
  char err[PD_ERR_LEN];
  struct thin_md *md;
  pthread_t th[3];
  struct reader_arg ra[3];
  atomic_bool stop = false;

  md = fresh (path, &d, 64);
  if (!md)
    return;
  do_create (md, &m, 1);
  do_write (md, &m, 1, 0, 500);
  for (int i = 0; i < 3; i++) {
    ra[i] = (struct reader_arg) { .md = md, .stop = &stop };
    pthread_create (&th[i], NULL, reader, &ra[i]);
  }
  for (int i = 0; i < 3; i++)
    while (atomic_load (&ra[i].started) == 0)
      sched_yield ();
  for (int round = 0; round < 40; round++) {
    do_write (md, &m, 1, 500 + (int) rnd (1500), 1 + (int) rnd (100));
    do_discard (md, &m, 1, 500 + (int) rnd (1500), (int) rnd (200));
    if (round % 8 == 0)
      do_snap (md, &m, 2 + round / 8, 1);
    CHECK_EQ (thin_md_commit (md, err), 0);
  }
  atomic_store (&stop, true);
  for (int i = 0; i < 3; i++) {
    pthread_join (th[i], NULL);
    CHECKF (ra[i].errors == 0 && ra[i].lookups > 0, "reader %d: %ld errors "
            "in %ld lookups", i, ra[i].errors, ra[i].lookups);
  }
  commit_and_check (md, path, &m, &committed, "threads");
  finish (md, &d);
}

/* The random workload, checked at every commit. */
static void
test_random (void)
{
  const char *path = path_of ("random.md");
  struct fdev d;
  char err[PD_ERR_LEN];
  int r, commits = 0;
  struct thin_md *md;

  md = fresh (path, &d, 64);
  if (!md)
    return;
  committed = m;
  for (int step = 0; step < 3000 && commits < 30 && !unit_failures; step++) {
    int op = (int) rnd (100), id;
    char what[64];

    if (op < 6 && (id = random_free_id (&m)) >= 0)
      do_create (md, &m, id);
    else if (op < 12 && (id = random_free_id (&m)) >= 0 &&
             random_existing (&m) >= 0)
      do_snap (md, &m, id, random_existing (&m));
    else if (op < 60 && (id = random_existing (&m)) >= 0)
      do_write (md, &m, id, (int) rnd (NVB), 1 + (int) rnd (60));
    else if (op < 75 && (id = random_existing (&m)) >= 0)
      do_discard (md, &m, id, (int) rnd (NVB), 1 + (int) rnd (300));
    else if (op < 80 && (id = random_existing (&m)) >= 0)
      do_delete (md, &m, id);
    else if (op < 81) {
      CHECK_EQ (thin_md_set_transaction_id (md, m.trans_id, m.trans_id + 1,
                                            err), 0);
      m.trans_id++;
    }
    else if (op < 84) {
      /* abort: back to the last commit */
      CHECK_EQ (thin_md_abort (md, err), 0);
      m = committed;
      snprintf (what, sizeof what, "abort at step %d", step);
      CHECKF (library_equals (md, &m, what), "%s", what);
    }
    else if (op < 88) {
      snprintf (what, sizeof what, "commit %d at step %d", ++commits, step);
      commit_and_check (md, path, &m, &committed, what);
    }
  }
  commit_and_check (md, path, &m, &committed, "random: end");
  CHECK_EQ (thin_md_close (md, err), 0);
  close (d.fd);

  /* reopened: the same */
  md = md_open (&d, path, 64, err, &r);
  CHECKF (md, "reopen: %s", err);
  if (md) {
    CHECKF (library_equals (md, &m, "random: reopened"), "reopened");
    thin_md_close (md, err);
  }
  close (d.fd);
}

/* A metadata snapshot stays readable by thin_dump --metadata-snap while
 * the pool goes on changing, and releasing it leaks nothing.
 */
static void
test_metadata_snap (void)
{
  const char *path = path_of ("msnap.md");
  struct fdev d;
  char err[PD_ERR_LEN];
  uint64_t held;
  struct thin_md *md;
  static struct model at_snap;

  md = fresh (path, &d, 64);
  if (!md)
    return;
  do_create (md, &m, 3);
  do_write (md, &m, 3, 0, 400);
  do_create (md, &m, 4);
  do_write (md, &m, 4, 100, 100);
  CHECK_EQ (thin_md_reserve_metadata_snap (md, err), 0);
  at_snap = m;
  held_model = &at_snap;
  CHECK_EQ (thin_md_reserve_metadata_snap (md, err), -EBUSY);
  CHECKF (strstr (err, "already held"), "%s", err);
  thin_md_get_metadata_snap (md, &held);
  CHECK (held != 0);
  do_write (md, &m, 3, 50, 100);
  do_discard (md, &m, 4, 0, 150);
  do_snap (md, &m, 5, 3);
  do_write (md, &m, 5, 0, 10);
  commit_and_check (md, path, &m, &committed, "with metadata snapshot");
  if (have_tools)
    CHECKF (dump_equals (path, &at_snap, true, "--metadata-snap"),
            "metadata snapshot");
  CHECK_EQ (thin_md_release_metadata_snap (md, err), 0);
  held_model = NULL;
  thin_md_get_metadata_snap (md, &held);
  CHECK_EQ (held, 0);
  commit_and_check (md, path, &m, &committed, "metadata snapshot released");
  finish (md, &d);
}

/* thin_delta between a snapshot and its origin: the origin's writes
 * after the snapshot, and nothing else.
 */
static void
test_delta (void)
{
  const char *path = path_of ("delta.md");
  struct fdev d;
  char err[PD_ERR_LEN], cmd[1024], line[512];
  struct thin_md *md;
  FILE *f;
  static bool differs[NVB], seen[NVB];

  if (!have_tools)
    return;
  md = fresh (path, &d, 64);
  if (!md)
    return;
  do_create (md, &m, 1);
  do_write (md, &m, 1, 0, 1000);
  do_snap (md, &m, 2, 1);
  do_write (md, &m, 1, 100, 10);
  do_write (md, &m, 1, 500, 1);
  do_discard (md, &m, 1, 700, 5);
  do_write (md, &m, 1, 1500, 3);       /* right only */
  commit_and_check (md, path, &m, &committed, "delta");
  CHECK_EQ (thin_md_close (md, err), 0);
  close (d.fd);

  for (int v = 0; v < NVB; v++)
    differs[v] = m.dev[1].data[v] != m.dev[2].data[v];
  snprintf (cmd, sizeof cmd, "thin_delta --snap1 2 --snap2 1 '%s' > '%s' 2>&1",
            path, unit_path ("delta.xml"));
  CHECK_EQ (run (cmd), 0);
  f = fopen (unit_path ("delta.xml"), "r");
  while (f && fgets (line, sizeof line, f)) {
    unsigned long long b = attr (line, "begin"), n = attr (line, "length");
    bool diff = strstr (line, "<different") || strstr (line, "<left_only") ||
      strstr (line, "<right_only");
    if (b == ~0ull || n == ~0ull || !diff)
      continue;
    for (unsigned long long v = b; v < b + n && v < NVB; v++)
      seen[v] = true;
  }
  if (f)
    fclose (f);
  for (int v = 0; v < NVB; v++)
    CHECKF (seen[v] == differs[v], "thin_delta: block %d %s", v,
            differs[v] ? "not reported" : "reported but the same");
}

/* Metadata written by thin_restore from a generated XML: the library reads
 * every mapping and device detail, and changes to it stay clean.
 */
static void
test_restore (void)
{
  const char *path = path_of ("restore.md");
  const char *xml = path_of ("restore.xml");
  struct fdev d;
  char err[PD_ERR_LEN], cmd[1024];
  int r;
  struct thin_md *md;
  FILE *f;
  uint64_t next = 0;

  if (!have_tools)
    return;
  memset (&m, 0, sizeof m);
  m.time = 7;
  m.trans_id = 42;
  for (int id = 0; id < 8; id++) {
    struct mdev *dv = &m.dev[id * 5];
    dv->exists = true;
    dv->trans = id + 1;
    dv->ctime = id;
    dv->stime = id + (id & 1);
    for (int v = 0; v < NVB; v += 1 + (int) rnd (4)) {
      int run_len = 1 + (int) rnd (30);
      for (int k = 0; k < run_len && v < NVB; k++, v++) {
        dv->data[v] = ++next;
        dv->time[v] = (uint32_t) rnd (8);
        dv->mapped++;
      }
    }
  }
  f = fopen (xml, "w");
  fprintf (f, "<superblock uuid=\"\" time=\"%u\" transaction=\"%llu\" "
           "flags=\"0\" version=\"2\" data_block_size=\"%u\" "
           "nr_data_blocks=\"%u\">\n", m.time,
           (unsigned long long) m.trans_id, BLOCK_SECTORS, DATA_BLOCKS);
  for (int id = 0; id < MAXDEV; id++) {
    struct mdev *dv = &m.dev[id];
    if (!dv->exists)
      continue;
    fprintf (f, "  <device dev_id=\"%d\" mapped_blocks=\"%llu\" "
             "transaction=\"%llu\" creation_time=\"%u\" snap_time=\"%u\">\n",
             id, (unsigned long long) dv->mapped,
             (unsigned long long) dv->trans, dv->ctime, dv->stime);
    for (int v = 0; v < NVB; v++)
      if (dv->data[v])
        fprintf (f, "    <single_mapping origin_block=\"%d\" "
                 "data_block=\"%llu\" time=\"%u\"/>\n", v,
                 (unsigned long long) dv->data[v] - 1, dv->time[v]);
    fprintf (f, "  </device>\n");
  }
  fprintf (f, "</superblock>\n");
  fclose (f);
  new_metadata (path);
  snprintf (cmd, sizeof cmd, "thin_restore -i '%s' -o '%s' > /dev/null", xml,
            path);
  CHECK_EQ (run (cmd), 0);

  md = md_open (&d, path, 64, err, &r);
  CHECKF (md, "open restored: %s", err);
  if (!md)
    return;
  CHECKF (library_equals (md, &m, "restored"), "restored metadata");
  /* and ours on top of theirs */
  do_snap (md, &m, 1, 0);
  do_write (md, &m, 0, 10, 20);
  do_discard (md, &m, 5, 0, 100);
  do_delete (md, &m, 10);
  commit_and_check (md, path, &m, &committed, "restored, changed");
  finish (md, &d);
}

/* A crash during a commit: every write after the Nth is lost.  Reopened,
 * the metadata is one of the two commits, and clean.
 */
static void
test_crash (void)
{
  const char *path = path_of ("crash.md");
  const char *copy = path_of ("crash-copy.md");
  static struct model before, after;
  struct fdev d;
  char err[PD_ERR_LEN], cmd[1024];
  int r, seen_before = 0, seen_after = 0;
  struct thin_md *md;
  long total;

  md = fresh (path, &d, 64);
  if (!md)
    return;
  do_create (md, &m, 1);
  do_write (md, &m, 1, 0, 800);
  do_snap (md, &m, 2, 1);
  CHECK_EQ (thin_md_commit (md, err), 0);
  before = m;
  CHECK_EQ (thin_md_close (md, err), 0);
  close (d.fd);
  snprintf (cmd, sizeof cmd, "cp '%s' '%s'", path, copy);

  /* The second transaction: big enough for the 64-block cache to write
   * dirty blocks out before the commit.  Cut after n writes, for n from 0
   * to past the last (about 60 cut points).
   */
  total = -1;
  for (long n = 0, step = 1;; n += step) {
    int ok_before, ok_after;

    CHECK_EQ (run (cmd), 0);
    md = md_open (&d, copy, 64, err, &r);
    if (!md)
      break;
    d.limit = n;
    m = before;
    do_write (md, &m, 1, 300, 300);
    do_discard (md, &m, 2, 0, 200);
    do_delete (md, &m, 2);
    for (int id = 3; id < 6; id++) {
      do_create (md, &m, id);
      do_write (md, &m, id, 0, 2400);
    }
    r = thin_md_commit (md, err);
    CHECKF (r == 0, "commit: %s", err);
    after = m;
    total = d.writes;
    if (n == 0)
      step = total / 60 + 1;
    thin_md_close (md, NULL);      /* nothing left to commit */
    close (d.fd);

    md = md_open (&d, copy, 64, err, &r);
    CHECKF (md, "crash after %ld writes: reopen: %s", n, err);
    if (!md)
      break;
    quiet = true;
    ok_before = library_equals (md, &before, "crash (before?)");
    quiet = false;
    ok_after = !ok_before && library_equals (md, &after, "crash (after?)");
    thin_md_close (md, NULL);
    close (d.fd);
    CHECKF (ok_before || ok_after, "crash after %ld of %ld writes: neither "
            "commit", n, total);
    seen_before += ok_before;
    seen_after += ok_after;
    if (have_tools)
      CHECKF (check_clean (copy, "crash"), "crash after %ld writes", n);
    if (n > total || unit_failures)
      break;
    if (n + step > total && n < total)
      step = total - n;            /* the cut just before the superblock */
    else if (n == total)
      step = 1;
  }
  CHECK (seen_before > 0);
  CHECK (seen_after > 0);
  printf ("crash: %d cut points gave the old commit, %d the new one "
          "(%ld writes)\n", seen_before, seen_after, total);
}

/* Damage: random bytes in one block of each kind, then in several: open
 * or the first use of the block fails with a message naming it.
 */
static void
test_damage (void)
{
  const char *path = path_of ("damage.md");
  const char *copy = path_of ("damage-copy.md");
  struct fdev d;
  char err[PD_ERR_LEN], cmd[1024];
  int r;
  struct thin_md *md;
  uint8_t sb[PD_BLOCK_SIZE], blk[PD_BLOCK_SIZE];
  struct { const char *what; uint64_t b; } targets[8];
  int nt = 0;

  md = fresh (path, &d, 64);
  if (!md)
    return;
  do_create (md, &m, 1);
  do_write (md, &m, 1, 0, 2000);
  do_snap (md, &m, 2, 1);
  do_write (md, &m, 2, 0, 100);
  CHECK_EQ (thin_md_commit (md, err), 0);
  CHECK_EQ (thin_md_close (md, err), 0);

  /* find a block of each kind from the superblock */
  CHECK_EQ (pread (d.fd, sb, sizeof sb, 0), (ssize_t) sizeof sb);
  targets[nt++] = (typeof (targets[0])) { "superblock", 0 };
  targets[nt++] = (typeof (targets[0])) { "metadata space map index",
                                          pd_le64 (sb + 192 + 16) };
  CHECK_EQ (pread (d.fd, blk, sizeof blk, pd_le64 (sb + 192 + 16) * 4096),
            4096);
  targets[nt++] = (typeof (targets[0])) { "metadata space map bitmap",
                                          pd_le64 (blk + 16) };
  targets[nt++] = (typeof (targets[0])) { "device mapping tree root",
                                          pd_le64 (sb + 320) };
  targets[nt++] = (typeof (targets[0])) { "device details root",
                                          pd_le64 (sb + 328) };
  targets[nt++] = (typeof (targets[0])) { "data space map index root",
                                          pd_le64 (sb + 64 + 16) };
  /* a leaf of device 1's mapping tree: the top-level root is a leaf; its
   * first value is device 1's subtree root, an internal node (2000
   * mappings); its first child a leaf.
   */
  CHECK_EQ (pread (d.fd, blk, sizeof blk, pd_le64 (sb + 320) * 4096), 4096);
  {
    uint64_t sub = pd_le64 (blk + 32 + 8 * pd_le32 (blk + 20));
    CHECK_EQ (pread (d.fd, blk, sizeof blk, sub * 4096), 4096);
    targets[nt++] = (typeof (targets[0])) { "mapping leaf",
                                            pd_le64 (blk + 32 + 8 * pd_le32 (blk + 20)) };
  }
  close (d.fd);

  expect_errors = true;
  for (int t = 0; t <= nt; t++) {
    char want[64];
    bool named = false;
    int64_t which[8];
    int nw = 0;

    snprintf (cmd, sizeof cmd, "cp '%s' '%s'", path, copy);
    CHECK_EQ (run (cmd), 0);
    fdev_open (&d, copy);
    for (int k = 0; k < nt; k++) {
      if (t < nt && k != t)
        continue;
      which[nw++] = targets[k].b;
      for (int i = 0; i < 16; i++) {
        uint8_t x = (uint8_t) (1 + rnd (255));
        off_t off = targets[k].b * 4096 + (off_t) rnd (4096);
        uint8_t c;
        CHECK_EQ (pread (d.fd, &c, 1, off), 1);
        c ^= x;
        CHECK_EQ (pwrite (d.fd, &c, 1, off), 1);
      }
    }
    close (d.fd);

    md = md_open (&d, copy, 64, err, &r);
    if (md) {
      /* open did not need the block: using everything must reach it */
      FILE *f = fopen (unit_path ("dmg.txt"), "w");
      struct thin_md_dev *td;
      library_text (md, f, NVB);
      fclose (f);
      thin_md_last_error (md, err);
      if (err[0] == '\0' && thin_md_dev_open (md, 1, &td, err) == 0) {
        do_write (md, &m, 1, 0, 1);
        thin_md_dev_close (td);
        thin_md_last_error (md, err);
      }
      if (err[0] == '\0')
        thin_md_create_thin (md, 20, err);
      r = thin_md_failed (md) ? -EIO : 0;
      if (err[0] == '\0') {
        thin_md_commit (md, err);
        r = thin_md_failed (md) ? -EIO : 0;
      }
      thin_md_close (md, NULL);
    }
    close (d.fd);
    for (int k = 0; k < nw; k++) {
      snprintf (want, sizeof want, "block %lld", (long long) which[k]);
      if (strstr (err, want) || (which[k] == 0 && strstr (err, "superblock")))
        named = true;
    }
    CHECKF (r == -EIO || r == -EINVAL, "damaged %s: r = %d (%s)",
            t < nt ? targets[t].what : "all", r, err);
    CHECKF (named, "damaged %s (block %lld): message names no damaged "
            "block: %s", t < nt ? targets[t].what : "all",
            (long long) which[0], err);
    printf ("damaged %s: %s\n", t < nt ? targets[t].what : "all", err);
  }
  expect_errors = false;

  /* Damage with a valid checksum: the node's header and contents are
   * checked too.  kind: 0 nr_entries over max, 1 wrong value size, 2 keys
   * out of order, 3 a child pointing at its own node (a loop), 4 a child
   * beyond the device, 5 flags neither leaf nor internal.
   */
  {
    static const char *const reason[] = {
      "nr_entries", "value size", "out of order", "deeper than",
      "beyond the end", "neither internal nor leaf",
    };
    uint64_t sub, leaf;

    fdev_open (&d, path);
    CHECK_EQ (pread (d.fd, blk, sizeof blk, pd_le64 (sb + 320) * 4096), 4096);
    sub = pd_le64 (blk + 32 + 8 * pd_le32 (blk + 20));
    CHECK_EQ (pread (d.fd, blk, sizeof blk, sub * 4096), 4096);
    leaf = pd_le64 (blk + 32 + 8 * pd_le32 (blk + 20));
    close (d.fd);
    expect_errors = true;
    for (int kind = 0; kind < 6; kind++) {
      uint64_t b = kind == 3 || kind == 4 ? sub : leaf;
      uint8_t *n = blk;
      char want[64];

      snprintf (cmd, sizeof cmd, "cp '%s' '%s'", path, copy);
      CHECK_EQ (run (cmd), 0);
      fdev_open (&d, copy);
      CHECK_EQ (pread (d.fd, n, 4096, b * 4096), 4096);
      switch (kind) {
      case 0: pd_put32 (n + 16, pd_le32 (n + 20) + 1); break;
      case 1: pd_put32 (n + 24, 7); break;
      case 2: {
        uint64_t k0 = pd_le64 (n + 32), k1 = pd_le64 (n + 40);
        pd_put64 (n + 32, k1);
        pd_put64 (n + 40, k0);
        break;
      }
      case 3: pd_put64 (n + 32 + 8 * pd_le32 (n + 20), b); break;
      case 4: pd_put64 (n + 32 + 8 * pd_le32 (n + 20), 1ull << 40); break;
      case 5: pd_put32 (n + 4, 3); break;
      }
      pd_put32 (n, pd_checksum (n + 4, 4092, PD_BTREE_CSUM_XOR));
      CHECK_EQ (pwrite (d.fd, n, 4096, b * 4096), 4096);
      close (d.fd);
      md = md_open (&d, copy, 64, err, &r);
      err[0] = '\0';
      if (md) {
        FILE *f = fopen (unit_path ("dmg.txt"), "w");
        library_text (md, f, NVB);
        fclose (f);
        thin_md_last_error (md, err);
        CHECKF (thin_md_failed (md), "damage %d: not failed", kind);
        CHECK_EQ (thin_md_create_thin (md, 30, NULL), -EROFS);
        thin_md_close (md, NULL);
      }
      close (d.fd);
      snprintf (want, sizeof want, "block %llu", (unsigned long long) b);
      CHECKF (kind == 4 ? strstr (err, "block 1099511627776") != NULL :
              strstr (err, want) != NULL, "damage %d: %s", kind, err);
      CHECKF (strstr (err, reason[kind]), "damage %d: %s", kind, err);
      printf ("damaged node, kind %d: %s\n", kind, err);
    }
    expect_errors = false;
  }

  /* Random bytes in random blocks, many times: never a crash, and a
   * failure always says why.
   */
  expect_errors = true;
  for (int round = 0; round < 40; round++) {
    snprintf (cmd, sizeof cmd, "cp '%s' '%s'", path, copy);
    CHECK_EQ (run (cmd), 0);
    fdev_open (&d, copy);
    for (int k = 0, nb = 1 + (int) rnd (4); k < nb; k++) {
      off_t off = (off_t) rnd (64) * 4096 + (off_t) rnd (4096);
      uint8_t c = (uint8_t) rnd (256);
      CHECK_EQ (pwrite (d.fd, &c, 1, off), 1);
    }
    close (d.fd);
    md = md_open (&d, copy, 64, err, &r);
    if (!md)
      CHECKF (err[0] && (r == -EIO || r == -EINVAL), "r %d: %s", r, err);
    else {
      FILE *f = fopen (unit_path ("dmg.txt"), "w");
      library_text (md, f, NVB);
      fclose (f);
      do_write (md, &m, 1, (int) rnd (NVB), 50);
      do_discard (md, &m, 2, (int) rnd (NVB), 50);
      r = thin_md_commit (md, err);
      if (thin_md_failed (md)) {
        thin_md_last_error (md, err);
        CHECKF (strstr (err, "block") || strstr (err, "space map") ||
                strstr (err, "superblock"), "no place named: %s", err);
      }
      thin_md_close (md, NULL);
    }
    close (d.fd);
  }
  expect_errors = false;
}

int
main (void)
{
  const char *seed = getenv ("THIN_MD_SEED");

  rng_state = seed ? strtoull (seed, NULL, 10) : (uint64_t) time (NULL);
  if (!rng_state)
    rng_state = 1;
  printf ("THIN_MD_SEED=%llu\n", (unsigned long long) rng_state);
  setenv ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin", 1);
  have_tools = run ("thin_check -V > /dev/null 2>&1") == 0;
  if (!have_tools) {
    fprintf (stderr, "thin_check not installed "
             "(thin-provisioning-tools): skipped\n");
    return 77;
  }
  test_errors ();
  test_failed_commit ();
  test_chain ();
  test_data_refs ();
  test_modes ();
  test_threads ();
  test_metadata_full ();
  test_many_devices ();
  test_metadata_snap ();
  test_delta ();
  test_restore ();
  test_random ();
  test_crash ();
  test_damage ();
  UNIT_EXIT ();
}

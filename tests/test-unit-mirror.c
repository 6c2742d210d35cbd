/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: the mirror target and stacking ("mapper:NAME").
 *
 *  - every invalid mirror table refused with EINVAL and a message naming
 *    the place and the argument; valid tables round-trip through
 *    table_format;
 *  - writes reach every leg, reads come back, status is dm's;
 *  - a leg that dies (a stacked device reloaded to an error table):
 *    reads retried on the other leg, writes kept going with
 *    handle_errors (status D), failed without it;
 *  - resync of a "sync" mirror with foreground writes racing it: legs
 *    byte-identical and equal to the model at the end; reads during
 *    resync only see leg 0's data;
 *  - events (nbdmsetup wait) and their log lines: a leg's first error
 *    of each kind, resync complete, resync stopped; none from a table
 *    replaced while it resynced, and no crash however often it is;
 *  - stacking cycles refused (self, A -> B -> A); a flush of a mirror
 *    over two stacked devices on one file flushes that file once;
 *  - extents from the first healthy leg that answers, data when none
 *    does.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "unit.h"

#define S 512ULL
#define LEG_SECTORS 2048ULL             /* 1 MiB legs */
#define LEG_SIZE (LEG_SECTORS * S)

static char *A, *B, *C;                 /* leg files */
static char *L;                         /* a disk log */

/* --- helpers ---------------------------------------------------------- */

static struct device *
mkdev (const char *name, const char *text)
{
  struct mapper_err err = { "" };
  struct device *dev;
  struct table *t;

  if (device_create (name, &dev, &err) < 0)
    UNIT_FATAL ("device_create %s: %s", name, err.msg);
  if (table_parse (text, name, &t, &err) < 0)
    UNIT_FATAL ("table for %s: %s", name, err.msg);
  if (device_load (dev, t) < 0 || device_resume (dev, &err) < 0)
    UNIT_FATAL ("load %s: %s", name, err.msg);
  return dev;
}

static void
reload (struct device *dev, const char *text)
{
  struct mapper_err err = { "" };
  struct table *t;

  if (table_parse (text, device_name (dev), &t, &err) < 0)
    UNIT_FATAL ("table for %s: %s", device_name (dev), err.msg);
  if (device_load (dev, t) < 0 || device_resume (dev, &err) < 0)
    UNIT_FATAL ("reload %s: %s", device_name (dev), err.msg);
}

/* Swap text in as dev's live table behind the control plane's back,
 * skipping the checks that protect the devices stacked on dev (the
 * holder check refuses a shrink under them): for the defensive paths
 * of a target whose leg stops answering as if it had.
 */
static void
force_live (struct device *dev, const char *text)
{
  struct mapper_err err = { "" };
  struct table *t, *old;

  if (table_parse (text, device_name (dev), &t, &err) < 0)
    UNIT_FATAL ("table for %s: %s", device_name (dev), err.msg);
  CHECK_EQ (device_suspend (dev, false), 0);
  pthread_mutex_lock (&dev->lock);
  old = dev->live;
  dev->live = t;
  table_bind (old, NULL);
  table_bind (t, dev);
  pthread_mutex_unlock (&dev->lock);
  table_free (old);
  if (device_resume (dev, &err) < 0)
    UNIT_FATAL ("resume %s: %s", device_name (dev), err.msg);
}

static uint64_t
event_nr (struct device *dev)
{
  struct device_info info;

  device_get_info (dev, &info);
  return info.event_nr;
}

/* Has a line with want been logged (mapper_log)? */
#define CHECK_LOGGED(want) \
  CHECKF (unit_event_logged (want), "no '%s' in the log:\n%s", want, \
          unit_events)

static void
status_of (struct device *dev, char *buf, size_t len)
{
  device_status (dev, buf, len);
  buf[strcspn (buf, "\n")] = '\0';
}

/* Parse "0 2048 mirror <args>" expecting failure with errno and a message
 * containing want.
 */
static void
bad (const char *args, int want_errno, const char *want)
{
  CLEANUP_FREE char *text = unit_sprintf ("0 %llu mirror %s\n", LEG_SECTORS,
                                          args);
  struct mapper_err err = { "" };
  struct table *t = NULL;
  int r = table_parse (text, "bad.table", &t, &err);

  CHECKF (r == -want_errno, "%s: got %d (%s), want -%d", args, r, err.msg,
          want_errno);
  CHECKF (strstr (err.msg, want) != NULL, "%s: message '%s' lacks '%s'",
          args, err.msg, want);
  CHECKF (strncmp (err.msg, "bad.table:1: mirror: ", 21) == 0,
          "%s: message '%s' does not name the place", args, err.msg);
  if (r == 0)
    table_free (t);
}

static void
good (const char *args, const char *want_format)
{
  CLEANUP_FREE char *text = unit_sprintf ("0 %llu mirror %s\n", LEG_SECTORS,
                                          args);
  CLEANUP_FREE char *want = unit_sprintf ("0 %llu mirror %s\n", LEG_SECTORS,
                                          want_format ? want_format : args);
  struct mapper_err err = { "" };
  struct table *t;
  char buf[4096];

  if (table_parse (text, "good.table", &t, &err) < 0) {
    CHECKF (0, "%s: %s", args, err.msg);
    return;
  }
  table_format (t, buf, sizeof buf);
  CHECKF (strcmp (buf, want) == 0, "format '%s', want '%s'", buf, want);
  table_free (t);
}

/* --- constructor -------------------------------------------------------- */

/* A 4 KiB log device starting with the n bytes of head. */
static void
write_log (const char *path, const char *head, size_t n)
{
  char buf[4096] = "";

  memcpy (buf, head, n);
  unit_write_file (path, buf, sizeof buf);
}

static void
test_ctr (void)
{
  CLEANUP_FREE char *two = unit_sprintf ("2 %s 0 %s 0", A, B);
  char args[4096];

#define BAD(err, msg, ...) do { \
    snprintf (args, sizeof args, __VA_ARGS__); bad (args, err, msg); \
  } while (0)

  BAD (EINVAL, "expected core", "core");
  BAD (EINVAL, "log type 'clustered-disk' is not supported (expected core "
       "or disk)", "clustered-disk 2 %s 64 %s", L, two);
  BAD (EINVAL, "invalid number of log arguments '1' (2 to 4)", "disk 1 64 %s",
       two);
  BAD (EINVAL, "invalid number of log arguments '5' (2 to 4)",
       "disk 5 %s 64 sync block_on_error x %s", L, two);
  BAD (EINVAL, "unrecognised log argument 'fast' (expected [sync|nosync] "
       "[block_on_error])", "disk 3 %s 64 fast %s", L, two);
  BAD (EINVAL, "unrecognised log argument 'sync' (expected [sync|nosync] "
       "[block_on_error])", "disk 4 %s 64 block_on_error sync %s", L, two);
  BAD (EINVAL, "unrecognised log argument 'block_on_error' (expected sync "
       "or nosync)", "core 2 64 block_on_error %s", two);
  BAD (ENOENT, "log device: /nonexistent", "disk 2 /nonexistent 64 %s", two);
  /* 32 regions: 1024 bytes of header and 4 of bits, in 512-byte blocks. */
  unit_write_file (L, NULL, 1024);
  {
    char want[4096];
    snprintf (want, sizeof want, "log device %s too small: 1024 bytes, a log "
              "of 32 regions needs 1536", L);
    BAD (EINVAL, want, "disk 2 %s 64 %s", L, two);
  }
  /* A damaged header is refused unless sync says to start again. */
  write_log (L, "JUNK", 4);
  BAD (EINVAL, "not a mirror log (magic 0x4b4e554a in sector 0, expected "
       "0x4d695272); a 'sync' log argument re-initialises it",
       "disk 2 %s 64 %s", L, two);
  write_log (L, "rRiM\7\0\0\0", 8);
  BAD (EINVAL, "disk log version 7 is not supported (expected 2)",
       "disk 2 %s 64 %s", L, two);
  BAD (EINVAL, "invalid number of log arguments 'x' (1 to 2)", "core x 64 %s",
       two);
  BAD (EINVAL, "invalid number of log arguments '0' (1 to 2)", "core 0 %s",
       two);
  BAD (EINVAL, "invalid number of log arguments '3' (1 to 2)",
       "core 3 64 sync x %s", two);
  BAD (EINVAL, "2 log arguments declared but 1 given", "core 2 64");
  BAD (EINVAL, "region size '-1'", "core 1 -1 %s", two);
  BAD (EINVAL, "region size 0 sectors must be a power of two",
       "core 1 0 %s", two);
  BAD (EINVAL, "region size 1 sectors must be a power of two",
       "core 1 1 %s", two);
  BAD (EINVAL, "region size 96 sectors must be a power of two",
       "core 1 96 %s", two);
  BAD (EINVAL, "larger than the target", "core 1 4096 %s", two);
  BAD (EINVAL, "unrecognised log argument 'fast'", "core 2 64 fast %s", two);
  BAD (EINVAL, "missing <#legs>", "core 2 64 sync");
  BAD (EINVAL, "invalid number of legs '1' (2 to 9)", "core 1 64 1 %s 0", A);
  BAD (EINVAL, "invalid number of legs '0' (2 to 9)", "core 1 64 0");
  BAD (EINVAL, "invalid number of legs '10' (2 to 9)",
       "core 1 64 10 %s 0 %s 0", A, B);
  BAD (EINVAL, "invalid number of legs 'two' (2 to 9)",
       "core 1 64 two %s 0 %s 0", A, B);
  BAD (EINVAL, "3 legs need 6 <dev> <offset> arguments, got 4",
       "core 1 64 3 %s 0 %s 0", A, B);
  BAD (EINVAL, "2 legs need 4 <dev> <offset> arguments, got 3",
       "core 1 64 2 %s 0 %s", A, B);
  BAD (EINVAL, "leg 1: offset 'x'", "core 1 64 2 %s 0 %s x", A, B);
  BAD (EINVAL, "leg 1: ", "core 1 64 2 %s 0 %s 1", A, B);  /* beyond end */
  BAD (ENOENT, "leg 1: /nonexistent", "core 1 64 2 %s 0 /nonexistent 0", A);
  BAD (EINVAL, "legs 0 and 1 overlap", "core 1 64 2 %s 0 %s 100", C, C);
  BAD (EINVAL, "unrecognised feature 'foo'", "core 1 64 %s 1 foo", two);
  BAD (EINVAL, "keep_log", "core 1 64 %s 1 keep_log", two);
  BAD (EINVAL, "2 feature arguments declared but 1 given",
       "core 1 64 %s 2 handle_errors", two);
  BAD (EINVAL, "invalid number of feature arguments 'x'",
       "core 1 64 %s x handle_errors", two);
  BAD (EINVAL, "too many arguments: 'extra'",
       "core 1 64 %s 1 handle_errors extra", two);
  BAD (EINVAL, "too many arguments: '0'", "core 1 64 %s 0 0", two);
#undef BAD

  /* Round trips, dm's spelling. */
  snprintf (args, sizeof args, "core 1 64 %s", two);
  good (args, NULL);
  snprintf (args, sizeof args, "core 2 1024 nosync %s 1 handle_errors", two);
  good (args, NULL);
  snprintf (args, sizeof args, "core 2 8 sync 3 %s 0 %s 0 %s 2048", A, B, C);
  good (args, NULL);
  snprintf (args, sizeof args, "disk 3 %s 64 sync %s", L, two);
  good (args, NULL);
  /* That table was never resumed, so it wrote nothing (the header is
   * written at resume, dm's disk_resume): L still holds version 7.
   */
  snprintf (args, sizeof args, "disk 2 %s 64 %s", L, two);
  bad (args, EINVAL, "disk log version 7 is not supported");
  write_log (L, "", 0);           /* zeroes: a new log */
  good (args, NULL);
  snprintf (args, sizeof args, "disk 4 %s 64 nosync block_on_error %s 1 "
            "handle_errors", L, two);
  good (args, NULL);
  {
    char want[4096];
    snprintf (args, sizeof args, "core 1 64 %s 0", two);
    snprintf (want, sizeof want, "core 1 64 %s", two);
    good (args, want);              /* zero features: nothing to print */
  }
}

/* --- I/O -------------------------------------------------------------- */

static void
check_file (const char *path, const unsigned char *want, size_t len,
            const char *what)
{
  size_t size;
  CLEANUP_FREE char *got = unit_read_file (path, &size);
  long d;

  if (got == NULL || size < len) {
    CHECKF (0, "%s: cannot read %s", what, path);
    return;
  }
  d = unit_first_diff (got, want, len);
  CHECKF (d == -1, "%s: %s differs at byte %ld", what, path, d);
}

static void
test_io (void)
{
  CLEANUP_FREE char *text =
    unit_sprintf ("0 %llu mirror core 2 64 nosync 2 %s 0 %s 0\n",
                  LEG_SECTORS, A, B);
  CLEANUP_FREE unsigned char *model = malloc (LEG_SIZE);
  CLEANUP_FREE unsigned char *buf = malloc (LEG_SIZE);
  struct device *dev;
  char st[1024], want[1024];

  unit_write_file (A, NULL, LEG_SIZE);
  unit_write_file (B, NULL, LEG_SIZE);
  dev = mkdev ("m", text);
  unit_fill (model, LEG_SIZE, 7, 0);
  /* Unaligned pieces, and one request for the lot. */
  CHECK_EQ (device_pwrite (dev, model, LEG_SIZE, 0, 0), 0);
  CHECK_EQ (device_pwrite (dev, model + 777, 5000, 777, MAPPER_FUA), 0);
  check_file (A, model, LEG_SIZE, "leg A");
  check_file (B, model, LEG_SIZE, "leg B");
  for (uint64_t off = 0; off < LEG_SIZE; off += 65536 + 3) {
    uint32_t n = MIN (70000, LEG_SIZE - off);
    memset (buf, 0, n);
    CHECK_EQ (device_pread (dev, buf, n, off, 0), 0);
    CHECKF (memcmp (buf, model + off, n) == 0, "read at %" PRIu64, off);
  }
  CHECK_EQ (device_zero (dev, 4096, 8192, 0), 0);
  CHECK_EQ (device_trim (dev, 4096, 16384, 0), 0);
  CHECK_EQ (device_flush (dev, 0), 0);
  CHECK_EQ (device_pread (dev, buf, 4096, 8192, 0), 0);
  CHECK (unit_is_zero (buf, 4096));
  snprintf (want, sizeof want, "0 %llu mirror 2 %s %s 32/32 1 AA 1 core",
            LEG_SECTORS, A, B);
  status_of (dev, st, sizeof st);
  CHECKF (strcmp (st, want) == 0, "status '%s', want '%s'", st, want);
  device_destroy (dev);
}

/* Reads are balanced over the in-sync legs as dm-raid1's choose_mirror
 * does: MIN_READS (128) reads on one leg, then the next, wherever they
 * are (reads of one hot block are shared too); writes go to both.
 */
static void
test_read_spread (void)
{
  CLEANUP_FREE char *D = strdup (unit_path ("d.img"));
  CLEANUP_FREE char *text =
    unit_sprintf ("0 %llu mirror core 1 64 2 %s 0 %s 0\n",
                  2 * LEG_SECTORS, C, D);
  CLEANUP_FREE char *want0 = NULL, *want1 = NULL, *want0d = NULL;
  char buf[4096];
  struct device *dev;

  unit_write_file (C, NULL, 2 * LEG_SIZE);
  unit_write_file (D, NULL, 2 * LEG_SIZE);
  /* Default sync, and the engine (resync worker) not started yet: every
   * region out of sync, so only leg 0 may serve reads, even at 1 MiB.
   */
  dev = mkdev ("spread", text);
  mapper_debug = unit_capture_log;
  mapper_trace_io = true;
  want0 = unit_sprintf ("read 0+4096 -> 1 clone: [%s 0+4096]", C);
  want1 = unit_sprintf ("read %llu+4096 -> 1 clone: [%s %llu+4096]",
                        LEG_SIZE, D, LEG_SIZE);
  CHECK_EQ (device_pread (dev, buf, 4096, LEG_SIZE, 0), 0);
  CHECKF (strstr (unit_last_log, C) && !strstr (unit_last_log, D),
          "log '%s'", unit_last_log);
  device_destroy (dev);

  free (text);
  text = unit_sprintf ("0 %llu mirror core 2 64 nosync 2 %s 0 %s 0\n",
                       2 * LEG_SECTORS, C, D);
  dev = mkdev ("spread", text);
  want0d = unit_sprintf ("read 0+4096 -> 1 clone: [%s 0+4096]", D);
  for (int i = 0; i < 128; i++) {
    CHECK_EQ (device_pread (dev, buf, 4096, 0, 0), 0);
    CHECKF (strstr (unit_last_log, want0),
            "read %d: log '%s', want '%s'", i, unit_last_log, want0);
  }
  CHECK_EQ (device_pread (dev, buf, 4096, 0, 0), 0);
  CHECKF (strstr (unit_last_log, want0d),
          "log '%s', want '%s'", unit_last_log, want0d);
  CHECK_EQ (device_pread (dev, buf, 4096, LEG_SIZE, 0), 0);
  CHECKF (strstr (unit_last_log, want1),
          "log '%s', want '%s'", unit_last_log, want1);
  CHECK_EQ (device_pwrite (dev, buf, 4096, 0, 0), 0);
  CHECKF (strstr (unit_last_log, "-> 2 clones"), "log '%s'", unit_last_log);
  mapper_debug = NULL;
  mapper_trace_io = false;
  device_destroy (dev);
}

/* A leg dies: legs are lowA (a stacked device over file A, reloaded to an
 * error table to kill it) and file B.
 */
static void
test_leg_failure (bool handle_errors)
{
  CLEANUP_FREE char *lowA = unit_sprintf ("0 %llu linear %s 0\n",
                                          LEG_SECTORS, A);
  CLEANUP_FREE char *dead = unit_sprintf ("0 %llu error\n", LEG_SECTORS);
  CLEANUP_FREE char *text =
    unit_sprintf ("0 %llu mirror core 2 64 nosync 2 mapper:lowA 0 %s 0%s\n",
                  LEG_SECTORS, B, handle_errors ? " 1 handle_errors" : "");
  CLEANUP_FREE unsigned char *model = malloc (LEG_SIZE);
  CLEANUP_FREE unsigned char *buf = malloc (LEG_SIZE);
  struct device *low, *dev;
  char st[1024], want[1024];

  unit_write_file (A, NULL, LEG_SIZE);
  unit_write_file (B, NULL, LEG_SIZE);
  unit_fill (model, LEG_SIZE, 11, 0);
  low = mkdev ("lowA", lowA);
  dev = mkdev ("m", text);
  CHECK_EQ (device_pwrite (dev, model, LEG_SIZE, 0, 0), 0);
  unit_events_clear ();

  reload (low, dead);
  CHECK_EQ (event_nr (dev), 1);         /* nothing failed on m yet */
  /* Offset 0 reads from leg 0 first (reads change leg every 1 MiB): the
   * error is retried on leg 1 and the client never sees it.
   */
  memset (buf, 0, 65536);
  CHECK_EQ (device_pread (dev, buf, 65536, 0, 0), 0);
  CHECK (memcmp (buf, model, 65536) == 0);
  snprintf (want, sizeof want, "0 %llu mirror 2 mapper:lowA %s 32/32 1 RA "
            "1 core", LEG_SECTORS, B);
  status_of (dev, st, sizeof st);
  CHECKF (strcmp (st, want) == 0, "status '%s', want '%s'", st, want);
  /* Each first error of a kind is an event, in both modes. */
  CHECK_EQ (event_nr (dev), 2);
  CHECK_LOGGED ("mirror: device m: leg 0 mapper:lowA failed a read\n");

  /* Writes: kept going on B with handle_errors, failed without. */
  unit_fill (model, 65536, 12, 0);
  CHECK_EQ (device_pwrite (dev, model, 65536, 0, 0),
            handle_errors ? 0 : -EIO);
  CHECK_EQ (device_pwrite (dev, model, 65536, 0, 0),
            handle_errors ? 0 : -EIO);
  snprintf (want, sizeof want, "0 %llu mirror 2 mapper:lowA %s 32/32 1 DA "
            "1 core", LEG_SECTORS, B);
  status_of (dev, st, sizeof st);
  CHECKF (strcmp (st, want) == 0, "status '%s', want '%s'", st, want);
  CHECK_EQ (event_nr (dev), 3);         /* one for two failed writes */
  CHECK_LOGGED ("mirror: device m: leg 0 mapper:lowA failed a write\n");
  CHECK_EQ (device_pread (dev, buf, 65536, 0, 0), 0);
  CHECK (memcmp (buf, model, 65536) == 0);
  check_file (B, model, 65536, "surviving leg");

  device_destroy (dev);
  device_destroy (low);
}

/* A leg's flush fails (its writes may be lost: backend_writes_lost, as a
 * remote backend does when its connection drops): with handle_errors the
 * device flush succeeds and the leg shows F, then is left out of writes;
 * without, the flush fails.
 */
static void
test_flush_failure (bool handle_errors)
{
  CLEANUP_FREE char *text =
    unit_sprintf ("0 %llu mirror core 2 64 nosync 2 %s 0 %s 0%s\n",
                  LEG_SECTORS, A, B, handle_errors ? " 1 handle_errors" : "");
  CLEANUP_FREE unsigned char *data = malloc (65536);
  struct device *dev;
  struct backend *legB;
  char st[1024], want[1024];

  unit_write_file (A, NULL, LEG_SIZE);
  unit_write_file (B, NULL, LEG_SIZE);
  dev = mkdev ("m", text);
  legB = dev->live->backends.ptr[1];
  unit_fill (data, 65536, 3, 0);
  CHECK_EQ (device_pwrite (dev, data, 65536, 0, 0), 0);
  backend_writes_lost (legB);
  unit_events_clear ();
  CHECK_EQ (device_flush (dev, 0), handle_errors ? 0 : -EIO);
  snprintf (want, sizeof want, "0 %llu mirror 2 %s %s 32/32 1 AF 1 core",
            LEG_SECTORS, A, B);
  status_of (dev, st, sizeof st);
  CHECKF (strcmp (st, want) == 0, "status '%s', want '%s'", st, want);
  CHECK_EQ (event_nr (dev), 2);
  {
    CLEANUP_FREE char *line =
      unit_sprintf ("mirror: device m: leg 1 %s failed a flush\n", B);
    CHECK_LOGGED (line);
  }
  /* With handle_errors the leg is out: new writes reach A only. */
  unit_fill (data, 65536, 4, 0);
  CHECK_EQ (device_pwrite (dev, data, 65536, 65536, 0), 0);
  CHECK_EQ (device_flush (dev, 0), 0);
  {
    size_t size;
    CLEANUP_FREE char *b = unit_read_file (B, &size);
    CHECK (b != NULL);
    if (b)
      CHECK_EQ (memcmp (b + 65536, data, 65536) != 0, handle_errors);
  }
  device_destroy (dev);
}

/* --- resync ---------------------------------------------------------- */

struct writer_arg {
  struct device *dev;
  unsigned char *model;
  _Atomic bool stop;
  unsigned nr;
};

static void *
writer (void *p)
{
  struct writer_arg *w = p;
  unsigned seed = 1;

  while (!atomic_load (&w->stop)) {
    uint64_t off = (rand_r (&seed) % (LEG_SIZE / 512)) * 512 + rand_r (&seed) % 512;
    uint32_t n = 1 + rand_r (&seed) % 20000;
    unsigned char data[20000];
    if (off + n > LEG_SIZE)
      n = LEG_SIZE - off;
    unit_fill (data, n, w->nr + 100, off);
    /* The model is written by this thread only. */
    if (device_pwrite (w->dev, data, n, off, 0) != 0)
      fprintf (stderr, "writer: write failed\n"), exit (1);
    memcpy (w->model + off, data, n);
    w->nr++;
  }
  return NULL;
}

static bool
wait_in_sync (struct device *dev, const char *want_frac)
{
  char st[1024];

  /* A bound so a hang fails instead of blocking the suite. */
  for (int i = 0; i < 60000; i++) {
    status_of (dev, st, sizeof st);
    if (strstr (st, want_frac))
      return true;
    usleep (1000);
  }
  fprintf (stderr, "resync never finished: %s\n", st);
  return false;
}

static void
test_resync (void)
{
  /* Region 32 sectors: 64 regions, each copy raced by writes (and so
   * throttled: resync pauses after a region that met foreground I/O). */
  CLEANUP_FREE char *text =
    unit_sprintf ("0 %llu mirror core 2 32 sync 3 %s 0 %s 0 %s 0\n",
                  LEG_SECTORS, A, B, C);
  CLEANUP_FREE unsigned char *model = malloc (LEG_SIZE);
  CLEANUP_FREE unsigned char *buf = malloc (LEG_SIZE);
  struct writer_arg w = { 0 };
  struct mapper_err err;
  struct device *dev;
  pthread_t thr;
  char st[1024];
  uint64_t now;

  unit_fill (model, LEG_SIZE, 21, 0);
  unit_write_file (A, model, LEG_SIZE);
  unit_fill (buf, LEG_SIZE, 22, 0);
  unit_write_file (B, buf, LEG_SIZE);     /* stale garbage */
  unit_write_file (C, NULL, LEG_SIZE);
  dev = mkdev ("m", text);

  /* Not started: nothing copied, reads see leg 0 everywhere. */
  status_of (dev, st, sizeof st);
  CHECKF (strstr (st, " 0/64 1 AAA 1 core") != NULL, "status '%s'", st);
  for (uint64_t off = 0; off < LEG_SIZE; off += 131072) {
    CHECK_EQ (device_pread (dev, buf, 131072, off, 0), 0);
    CHECKF (memcmp (buf, model + off, 131072) == 0, "read at %" PRIu64, off);
  }

  w.dev = dev;
  w.model = model;
  unit_events_clear ();
  CHECK_EQ (pthread_create (&thr, NULL, writer, &w), 0);
  CHECK_EQ (engine_start (&err), 0);
  /* Done when the event says so (not later: the status is all in sync
   * by then), and logged.
   */
  CHECK_EQ (device_wait_event (dev, 1, 60000, &now, &err), 0);
  CHECK_EQ (now, 2);
  status_of (dev, st, sizeof st);
  CHECKF (strstr (st, " 64/64 1 AAA 1 core") != NULL, "status '%s'", st);
  CHECK_LOGGED ("mirror: device m: resync complete, 64/64 regions in sync, "
                "64 regions copied, 0 bytes of holes skipped\n");
  atomic_store (&w.stop, true);
  pthread_join (thr, NULL);
  CHECK_EQ (device_flush (dev, 0), 0);
  check_file (A, model, LEG_SIZE, "resync leg A");
  check_file (B, model, LEG_SIZE, "resync leg B");
  check_file (C, model, LEG_SIZE, "resync leg C");
  CHECK_EQ (device_pread (dev, buf, LEG_SIZE, 0, 0), 0);
  CHECK (memcmp (buf, model, LEG_SIZE) == 0);

  /* A reload replacing a leg resyncs it; the old table's resync state
   * goes with it.
   */
  unit_write_file (C, NULL, LEG_SIZE);
  reload (dev, text);
  CHECK_EQ (device_wait_event (dev, 3, 60000, &now, &err), 0);
  CHECK (wait_in_sync (dev, " 64/64 1 AAA 1 core"));
  check_file (C, model, LEG_SIZE, "replaced leg C");

  /* Replaced over and over while it resyncs: each swap stops the old
   * table's resync and drops it while the worker may be raising an event
   * on it (ASan would tell).  The last table's completion is an event;
   * the dropped ones raise none after it.  e is read before the status:
   * a completion after it moves the counter past e.
   */
  for (int i = 0; i < 50; i++)
    reload (dev, text);
  for (;;) {
    uint64_t e = event_nr (dev);
    status_of (dev, st, sizeof st);
    if (strstr (st, " 64/64 1 AAA 1 core"))
      break;
    if (device_wait_event (dev, e, 60000, &now, &err) < 0) {
      CHECKF (0, "no event: %s", err.msg);
      break;
    }
  }
  {
    uint64_t e = event_nr (dev);
    CHECK_EQ (device_wait_event (dev, e, 200, &now, &err), -ETIMEDOUT);
  }

  /* Destroyed in the middle of a resync. */
  unit_write_file (C, NULL, LEG_SIZE);
  reload (dev, text);
  device_destroy (dev);
  engine_stop ();
  fprintf (stderr, "resync: %u foreground writes raced it\n", w.nr);
}

/* Leg 0, the resync source, is dead before resync starts: the failed
 * read is one event, resync stopping another, both logged.
 */
static void
test_resync_stopped (void)
{
  CLEANUP_FREE char *lowA = unit_sprintf ("0 %llu linear %s 0\n",
                                          LEG_SECTORS, A);
  CLEANUP_FREE char *dead = unit_sprintf ("0 %llu error\n", LEG_SECTORS);
  CLEANUP_FREE char *text =
    unit_sprintf ("0 %llu mirror core 2 64 sync 2 mapper:lowA 0 %s 0\n",
                  LEG_SECTORS, B);
  struct mapper_err err = { "" };
  struct device *low, *dev;
  char st[1024], want[1024];
  uint64_t now = 0;

  low = mkdev ("lowA", lowA);
  dev = mkdev ("m", text);
  reload (low, dead);
  unit_events_clear ();
  CHECK_EQ (engine_start (&err), 0);
  for (uint64_t e = 1; e < 3; e = now)
    if (device_wait_event (dev, e, 60000, &now, &err) < 0) {
      CHECKF (0, "event %" PRIu64 ": %s", e + 1, err.msg);
      break;
    }
  CHECK_EQ (event_nr (dev), 3);
  snprintf (want, sizeof want, "0 %llu mirror 2 mapper:lowA %s 0/32 1 RA "
            "1 core", LEG_SECTORS, B);
  status_of (dev, st, sizeof st);
  CHECKF (strcmp (st, want) == 0, "status '%s', want '%s'", st, want);
  CHECK_LOGGED ("mirror: device m: leg 0 mapper:lowA failed a resync read\n");
  CHECK_LOGGED ("mirror: device m: resync stopped: leg 0 mapper:lowA (the "
                "source) failed, 0/32 regions in sync\n");
  device_destroy (dev);
  device_destroy (low);
  engine_stop ();
}

/* --- stacking ----------------------------------------------------------- */

static void
test_stacking (void)
{
  CLEANUP_FREE char *lo = unit_sprintf ("0 %llu linear %s 0\n", LEG_SECTORS / 2, C);
  CLEANUP_FREE char *lo2 = unit_sprintf ("0 %llu linear %s %llu\n",
                                         LEG_SECTORS / 2, C, LEG_SECTORS / 2);
  CLEANUP_FREE char *top =
    unit_sprintf ("0 %llu mirror core 1 64 2 mapper:lo 0 mapper:lo2 0\n",
                  LEG_SECTORS / 2);
  CLEANUP_FREE unsigned char *data = malloc (LEG_SIZE);
  struct device *l1, *l2, *t;
  struct mapper_err err = { "" };
  struct table *tab;
  struct backend *leaf;
  uint64_t before;

  unit_write_file (C, NULL, LEG_SIZE);
  l1 = mkdev ("lo", lo);
  l2 = mkdev ("lo2", lo2);
  t = mkdev ("top", top);

  /* A flush of the top flushes the one leaf file once. */
  leaf = l1->live->backends.ptr[0];
  unit_fill (data, 65536, 5, 0);
  CHECK_EQ (device_pwrite (t, data, 65536, 4096, 0), 0);
  before = leaf->flush.nr_flushes;
  CHECK_EQ (device_flush (t, 0), 0);
  CHECK_EQ (leaf->flush.nr_flushes - before, 1);
  CHECK_EQ (device_flush (t, 0), 0);      /* clean: none */
  CHECK_EQ (leaf->flush.nr_flushes - before, 1);
  {
    size_t size;
    CLEANUP_FREE char *f = unit_read_file (C, &size);
    CHECK (f && memcmp (f + 4096, data, 65536) == 0);
    CHECK (f && memcmp (f + LEG_SIZE / 2 + 4096, data, 65536) == 0);
  }

  /* Self-reference and a cycle through another device: refused, and the
   * devices keep their tables.
   */
  CHECK_EQ (table_parse ("0 1024 linear mapper:lo2 0\n", "lo.table", &tab,
                         &err), 0);
  CHECK_EQ (device_check_table (l2, tab, &err), -ELOOP);
  CHECKF (strstr (err.msg, "mapper:lo2: device 'lo2' cannot stack on itself"),
          "message '%s'", err.msg);
  CHECK_EQ (device_load (l2, tab), -ELOOP);   /* takes (frees) tab */

  CHECK_EQ (table_parse ("0 1024 linear mapper:top 0\n", "lo.table", &tab,
                         &err), 0);
  CHECK_EQ (device_check_table (l1, tab, &err), -ELOOP);
  CHECKF (strstr (err.msg, "mapper:top: stacking cycle: lo -> top -> lo"),
          "message '%s'", err.msg);
  table_free (tab);
  CHECK_EQ (device_pread (t, data, 4096, 0, 0), 0);

  /* Unknown and unloaded devices. */
  CHECK_EQ (table_parse ("0 8 linear mapper:nope 0\n", "x.table", &tab, &err),
            -ENXIO);
  CHECKF (strstr (err.msg, "x.table:1: linear: mapper:nope: no such device"),
          "message '%s'", err.msg);
  CHECK_EQ (table_parse ("0 8 linear mapper: 0\n", "x.table", &tab, &err),
            -EINVAL);
  CHECKF (strstr (err.msg, "missing device name"), "message '%s'", err.msg);
  CHECK_EQ (table_parse ("0 2048 linear mapper:lo 0\n", "x.table", &tab, &err),
            -EINVAL);
  CHECKF (strstr (err.msg, "beyond the end"), "message '%s'", err.msg);

  device_destroy (t);
  device_destroy (l2);
  device_destroy (l1);
}

/* --- extents ------------------------------------------------------------ */

struct xmap { int n; uint64_t off[8], len[8]; uint32_t type[8]; };

static int
xmap_add (void *opaque, uint64_t off, uint64_t len, uint32_t type)
{
  struct xmap *m = opaque;

  if (m->n && m->type[m->n - 1] == type &&
      m->off[m->n - 1] + m->len[m->n - 1] == off) {
    m->len[m->n - 1] += len;
    return 0;
  }
  if (m->n == 8)
    return -ENOMEM;
  m->off[m->n] = off, m->len[m->n] = len, m->type[m->n] = type;
  m->n++;
  return 0;
}

/* The mirror's map must be: data at [d, d+dlen) (dlen 0: all data) and
 * holes around it.
 */
static void
check_map_at (int line, struct device *dev, uint64_t d, uint64_t dlen,
              const char *what)
{
  struct xmap m = { 0 };
  int r = device_extents (dev, LEG_SIZE, 0, 0, xmap_add, &m);
  bool ok;

  if (dlen == 0)
    ok = m.n == 1 && m.type[0] == 0 && m.len[0] == LEG_SIZE;
  else if (d == 0)
    ok = m.n == 2 && m.type[0] == 0 && m.len[0] == dlen &&
      m.type[1] == 3 && m.len[1] == LEG_SIZE - dlen;
  else
    ok = m.n == 3 && m.type[0] == 3 && m.len[0] == d && m.type[1] == 0 &&
      m.len[1] == dlen && m.type[2] == 3 &&
      m.off[2] + m.len[2] == LEG_SIZE;
  if (r != 0 || !ok) {
    fprintf (stderr, "test-unit-mirror.c:%d: %s: r=%d, map:", line, what, r);
    for (int i = 0; i < m.n; i++)
      fprintf (stderr, " %" PRIu64 "+%" PRIu64 ":%u", m.off[i], m.len[i],
               m.type[i]);
    fputc ('\n', stderr);
    unit_failures++;
  }
}
#define check_map(dev, d, dlen, what) \
  check_map_at (__LINE__, dev, d, dlen, what)

/* Extents come from the first healthy leg that answers: a leg whose
 * query fails (its stacked device was shrunk under it) is skipped, a
 * failed leg too; none left: data.  The legs differ on purpose (nosync)
 * to show which one answered.
 */
static void
test_extents (void)
{
  CLEANUP_FREE char *X = strdup (unit_path ("x.img"));
  CLEANUP_FREE char *Y = strdup (unit_path ("y.img"));
  CLEANUP_FREE char *lowx = unit_sprintf ("0 %llu linear %s 0\n",
                                          LEG_SECTORS, X);
  CLEANUP_FREE char *lowy = unit_sprintf ("0 %llu linear %s 0\n",
                                          LEG_SECTORS, Y);
  CLEANUP_FREE char *text =
    unit_sprintf ("0 %llu mirror core 2 64 nosync 2 mapper:lowX 0 "
                  "mapper:lowY 0 1 handle_errors\n", LEG_SECTORS);
  unsigned char buf[65536];
  struct device *lx, *ly, *dev;
  int fd;

  unit_write_file (X, NULL, LEG_SIZE);
  unit_write_file (Y, NULL, LEG_SIZE);
  unit_fill (buf, sizeof buf, 21, 0);
  fd = open (X, O_WRONLY);
  CHECK (fd >= 0 && pwrite (fd, buf, 65536, 0) == 65536);
  close (fd);
  fd = open (Y, O_WRONLY);
  CHECK (fd >= 0 && pwrite (fd, buf, 65536, 262144) == 65536);
  close (fd);
  lx = mkdev ("lowX", lowx);
  ly = mkdev ("lowY", lowy);
  dev = mkdev ("mx", text);

  check_map (dev, 0, 65536, "both legs up: leg 0");
  /* Leg 0's device shrunk (forced: the control plane refuses it): its
   * query fails (beyond its end), leg 1 answers.
   */
  force_live (lx, "0 8 zero\n");
  check_map (dev, 262144, 65536, "leg 0 fails extents: leg 1");
  /* Both fail: data, not an error. */
  force_live (ly, "0 8 zero\n");
  check_map (dev, 0, 0, "both legs fail extents");
  /* Leg 0 back, but failed by a write (handle_errors drops it): its
   * stale holes must not be reported; leg 1 answers.
   */
  force_live (lx, lowx);
  force_live (ly, lowy);
  check_map (dev, 0, 65536, "both back");
  reload (lx, "0 2048 error\n");
  /* Into leg 1's data, so that its map keeps its shape. */
  CHECK_EQ (device_pwrite (dev, buf, 512, 262144, 0), 0);   /* leg 0: D */
  reload (lx, lowx);
  check_map (dev, 262144, 65536, "leg 0 failed a write: leg 1");

  device_destroy (dev);
  device_destroy (lx);
  device_destroy (ly);
  unlink (X);
  unlink (Y);
}

int
main (void)
{
  mapper_log = unit_capture_events;
  A = strdup (unit_path ("a.img"));
  B = strdup (unit_path ("b.img"));
  C = strdup (unit_path ("c.img"));
  L = strdup (unit_path ("log.img"));
  unit_write_file (A, NULL, LEG_SIZE);
  unit_write_file (B, NULL, LEG_SIZE);
  unit_write_file (C, NULL, 2 * LEG_SIZE);

  test_ctr ();
  test_io ();
  test_read_spread ();
  test_leg_failure (true);
  test_leg_failure (false);
  test_flush_failure (true);
  test_flush_failure (false);
  test_resync ();
  test_resync_stopped ();
  test_stacking ();
  test_extents ();
  free (A);
  free (B);
  free (C);
  free (L);
  UNIT_EXIT ();
}

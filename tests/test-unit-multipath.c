/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: the multipath target over local paths.  Every bad table
 * argument is refused with a message naming it; the table prints as
 * dm-mpath's and parses back; the selectors choose as dm's do (two
 * files with different contents tell which path a read went to); a path
 * that fails (a mapper:NAME error device) is failed and the I/O goes to
 * another path, of the same group then the next; with no path left I/O
 * fails at once, or waits with queue_if_no_path until a path is
 * reinstated or fail_if_no_path; messages change what status says, and
 * bad ones change nothing; a flush covers the writes of a failed path
 * with a flush on another.  The engine is not started: no path checker
 * runs, so nothing here depends on time.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "unit.h"
#include "unit-targets.h"
#include "targets/multipath.h"

#define S 512ULL
#define FILE_SECTORS 256

static char *A, *B, *C;
static int dev_nr;

static void
setup (void)
{
  unsigned char *buf = malloc (FILE_SECTORS * S);

  unit_fill (buf, FILE_SECTORS * S, 1, 0);
  unit_write_file (unit_path ("a"), buf, FILE_SECTORS * S);
  unit_fill (buf, FILE_SECTORS * S, 2, 0);
  unit_write_file (unit_path ("b"), buf, FILE_SECTORS * S);
  unit_write_file (unit_path ("c"), NULL, FILE_SECTORS * S / 2);
  free (buf);
  A = realpath (unit_path ("a"), NULL);
  B = realpath (unit_path ("b"), NULL);
  C = realpath (unit_path ("c"), NULL);
  if (!A || !B || !C)
    UNIT_FATAL ("realpath: %s", strerror (errno));
}

#define MP "multipath"
#define BAD(p1, p2, ...) UNIT_FAIL (EINVAL, 1, MP, p1, p2, __VA_ARGS__)

static void
test_bad_tables (void)
{
  BAD ("expected <#features>", "got no arguments", "0 256 multipath");
  BAD ("invalid number of feature arguments 'x' (0 to 9)", NULL,
       "0 256 multipath x");
  BAD ("2 feature arguments declared but 1 given", NULL,
       "0 256 multipath 2 queue_if_no_path");
  BAD ("unrecognised multipath feature 'bogus'", NULL,
       "0 256 multipath 1 bogus 0 1 1 round-robin 0 1 0 %s", A);
  BAD ("missing no_path_retry", NULL,
       "0 256 multipath 1 no_path_retry 0 1 1 round-robin 0 1 0 %s", A);
  BAD ("invalid no_path_retry 'x' (checker intervals, 0 to 1000000)", NULL,
       "0 256 multipath 2 no_path_retry x 0 1 1 round-robin 0 1 0 %s", A);
  BAD ("invalid path_timeout_msecs '5' (milliseconds, 10 to 3600000)", NULL,
       "0 256 multipath 2 path_timeout_msecs 5 0 1 1 round-robin 0 1 0 %s",
       A);
  BAD ("invalid checker_interval_msecs '0'", NULL,
       "0 256 multipath 2 checker_interval_msecs 0 0 1 1 round-robin 0 1 0 "
       "%s", A);
  BAD ("invalid failback 'sometimes' (immediate or manual)", NULL,
       "0 256 multipath 2 failback sometimes 0 1 1 round-robin 0 1 0 %s", A);
  BAD ("invalid failback '' (immediate or manual)", NULL,
       "0 256 multipath 1 failback 0 1 1 round-robin 0 1 0 %s", A);
  BAD ("feature 'retain_attached_hw_handler' needs a hardware handler", NULL,
       "0 256 multipath 1 retain_attached_hw_handler 0 1 1 round-robin 0 1 "
       "0 %s", A);
  BAD ("missing number of hardware handler arguments", NULL,
       "0 256 multipath 0");
  BAD ("hardware handler 'alua' is not supported (only 0: none)", NULL,
       "0 256 multipath 0 1 alua 1 1 round-robin 0 1 0 %s", A);
  BAD ("missing number of priority groups", NULL, "0 256 multipath 0 0");
  BAD ("invalid number of priority groups 'x' (0 to 64)", NULL,
       "0 256 multipath 0 0 x");
  BAD ("invalid number of priority groups '65' (0 to 64)", NULL,
       "0 256 multipath 0 0 65 1");
  BAD ("missing initial priority group", NULL, "0 256 multipath 0 0 1");
  BAD ("invalid initial priority group '0' (1 to 1)", NULL,
       "0 256 multipath 0 0 1 0 round-robin 0 1 0 %s", A);
  BAD ("invalid initial priority group '2' (1 to 1)", NULL,
       "0 256 multipath 0 0 1 2 round-robin 0 1 0 %s", A);
  BAD ("invalid initial priority group '1' (0 to 0)", NULL,
       "0 256 multipath 0 0 0 1");
  BAD ("priority group 1: missing path selector", NULL,
       "0 256 multipath 0 0 1 1");
  BAD ("priority group 1: unknown path selector 'fastest' (round-robin, "
       "queue-length or service-time)", NULL,
       "0 256 multipath 0 0 1 1 fastest 0 1 0 %s", A);
  BAD ("priority group 1: invalid number of selector arguments '1' (0 to 0)",
       NULL, "0 256 multipath 0 0 1 1 round-robin 1 x 1 0 %s", A);
  BAD ("priority group 1: missing number of paths", NULL,
       "0 256 multipath 0 0 1 1 round-robin 0");
  BAD ("priority group 1: invalid number of paths '0' (1 to 64)", NULL,
       "0 256 multipath 0 0 1 1 round-robin 0 0 0");
  BAD ("priority group 1: invalid number of path arguments '2' (0 to 1)",
       NULL, "0 256 multipath 0 0 1 1 round-robin 0 1 2 %s 1 1", A);
  BAD ("priority group 1: invalid number of path arguments '3' (0 to 2)",
       NULL, "0 256 multipath 0 0 1 1 service-time 0 1 3 %s 1 1 1", A);
  BAD ("priority group 1: 2 paths of 1 argument each need 4 words, got 2",
       NULL, "0 256 multipath 0 0 1 1 round-robin 0 2 1 %s 1", A);
  BAD ("priority group 1: path 1 (", "): invalid repeat count '0' (1 to "
       "1000000)", "0 256 multipath 0 0 1 1 round-robin 0 1 1 %s 0", A);
  BAD ("priority group 1: path 2 (", "): invalid relative throughput '101' "
       "(0 to 100)", "0 256 multipath 0 0 1 1 service-time 0 2 2 %s 1 1 "
       "%s 1 101", A, B);
  BAD ("priority group 1: path ", " is given twice",
       "0 256 multipath 0 0 1 1 round-robin 0 2 0 %s %s", A, A);
  BAD ("size 128 sectors differs from path ", "(256 sectors): every path "
       "must reach the same storage",
       "0 128 multipath 0 0 1 1 round-robin 0 2 0 %s %s", A, C);
  UNIT_FAIL (ENOENT, 1, MP, "priority group 1: path 1 (/nonexistent/x): "
             "/nonexistent/x: No such file", NULL,
             "0 256 multipath 0 0 1 1 round-robin 0 1 0 /nonexistent/x");
  BAD ("beyond the end of the device", NULL,
       "0 512 multipath 0 0 1 1 round-robin 0 1 0 %s", A);
  BAD ("too many arguments: 'extra' after the last priority group", NULL,
       "0 256 multipath 0 0 1 1 round-robin 0 1 0 %s extra", A);
  BAD ("priority group 2: unknown path selector 'bogus'", NULL,
       "0 256 multipath 0 0 2 1 round-robin 0 1 0 %s bogus", A);
}

/* text prints as want, and want parses back to itself. */
static void
check_format_at (int srcline, const char *text, const char *want)
{
  struct table *t = unit_parse_at (srcline, "%s", text);

  if (t == NULL)
    return;
  unit_check_format_at (srcline, t, want);
  table_free (t);
  if ((t = unit_parse_at (srcline, "%s", want)) != NULL) {
    unit_check_format_at (srcline, t, want);
    table_free (t);
  }
}

static void
test_format (void)
{
  char *in, *want;

#define FMT(i, w) do { in = i; want = w; \
    check_format_at (__LINE__, in, want); free (in); free (want); } while (0)
  FMT (unit_sprintf ("0 256 multipath 0 0 1 1 round-robin 0 2 0 %s %s",
                     A, B),
       unit_sprintf ("0 256 multipath 0 0 1 1 round-robin 0 2 1 %s 1 %s 1\n",
                     A, B));
  FMT (unit_sprintf ("0 256 multipath 3 queue_if_no_path path_timeout_msecs "
                     "500 0 2 2 queue-length 0 1 0 %s service-time 0 1 1 "
                     "%s 3", A, B),
       unit_sprintf ("0 256 multipath 3 queue_if_no_path path_timeout_msecs "
                     "500 0 2 2 queue-length 0 1 1 %s 1 service-time 0 1 2 "
                     "%s 3 1\n", A, B));
  /* no_path_retry N queues (multipathd); 0 fails at once.  Either way
   * queue_if_no_path adds nothing, and is not printed.
   */
  FMT (unit_sprintf ("0 256 multipath 6 no_path_retry 5 failback immediate "
                     "checker_interval_msecs 200 0 1 1 round-robin 0 1 1 %s "
                     "7", A),
       unit_sprintf ("0 256 multipath 6 no_path_retry 5 "
                     "checker_interval_msecs 200 failback immediate 0 1 1 "
                     "round-robin 0 1 1 %s 7\n", A));
  FMT (unit_sprintf ("0 256 multipath 3 no_path_retry 5 queue_if_no_path 0 "
                     "1 1 round-robin 0 1 0 %s", A),
       unit_sprintf ("0 256 multipath 2 no_path_retry 5 0 1 1 round-robin 0 "
                     "1 1 %s 1\n", A));
  FMT (unit_sprintf ("0 256 multipath 3 queue_if_no_path no_path_retry 0 0 "
                     "1 1 round-robin 0 1 0 %s", A),
       unit_sprintf ("0 256 multipath 2 no_path_retry 0 0 1 1 round-robin 0 "
                     "1 1 %s 1\n", A));
  FMT (unit_sprintf ("0 256 multipath 2 failback manual 0 0 0"),
       unit_sprintf ("0 256 multipath 0 0 0 0\n"));
#undef FMT
}

/* Every combination of features and selector (with each number of path
 * arguments) prints as a table that parses back to the same text: what
 * nbdmsetup table prints and tables=DIR saves loads back as it ran.
 * Each feature set also keeps what it does: the printed table queues,
 * or not, as the given one did (status's queue_io with no path).
 */
static void
test_round_trip (void)
{
  static const char *const features[] = {
    "", "queue_if_no_path", "no_path_retry 0", "no_path_retry 4",
    "queue_if_no_path no_path_retry 0", "no_path_retry 2 queue_if_no_path",
    "path_timeout_msecs 1000", "path_timeout_msecs 250",
    "checker_interval_msecs 300", "failback immediate", "failback manual",
    "queue_if_no_path no_path_retry 6 path_timeout_msecs 40 "
    "checker_interval_msecs 50 failback immediate",
  };
  static const char *const groups[] = {
    "round-robin 0 2 0 %s %s", "round-robin 0 2 1 %s 3 %s 1",
    "queue-length 0 2 0 %s %s", "queue-length 0 2 1 %s 1 %s 1",
    "service-time 0 2 0 %s %s", "service-time 0 2 1 %s 2 %s 1",
    "service-time 0 2 2 %s 1 0 %s 1 100",
  };

  char *d;

  unit_write_file (unit_path ("d"), NULL, FILE_SECTORS * S);
  if ((d = realpath (unit_path ("d"), NULL)) == NULL)
    UNIT_FATAL ("realpath: %s", strerror (errno));
  for (size_t f = 0; f < ARRAY_SIZE (features); f++)
    for (size_t g = 0; g < ARRAY_SIZE (groups); g++)
      for (unsigned ng = 1; ng <= 2; ng++) {
        char *pg = unit_sprintf (groups[g], A, B);
        char *pg2 = unit_sprintf ("service-time 0 1 0 %s", d);
        unsigned nwords = 0;
        char *text, buf1[4096], buf2[4096];
        struct table *t1, *t2;

        for (const char *w = features[f]; *w; w++)
          nwords += (w == features[f] || w[-1] == ' ') && *w != ' ';
        text = unit_sprintf ("0 256 multipath %u %s 0 %u %u %s%s%s", nwords,
                             features[f], ng, ng, pg, ng == 2 ? " " : "",
                             ng == 2 ? pg2 : "");
        t1 = unit_parse ("%s", text);
        if (t1 == NULL)
          goto next;
        table_format (t1, buf1, sizeof buf1);
        t2 = unit_parse ("%s", buf1);
        if (t2 != NULL) {
          table_format (t2, buf2, sizeof buf2);
          CHECKF (strcmp (buf1, buf2) == 0, "\n    table: %s\n    prints: "
                  "%s    which prints: %s", text, buf1, buf2);
          CHECKF (atomic_load (&((struct mpath *) t1->targets[0].private)
                               ->queueing) ==
                  atomic_load (&((struct mpath *) t2->targets[0].private)
                               ->queueing), "table %s queues, or not, "
                  "unlike what it prints: %s", text, buf1);
          table_free (t2);
        }
        table_free (t1);
      next:
        free (text);
        free (pg);
        free (pg2);
      }
  free (d);
}

static struct device *
mp_dev (const char *fmt, ...)
{
  char name[32], *text;
  va_list ap;
  struct device *dev;

  va_start (ap, fmt);
  if (vasprintf (&text, fmt, ap) == -1)
    UNIT_FATAL ("out of memory");
  va_end (ap);
  snprintf (name, sizeof name, "mp%d", dev_nr++);
  dev = unit_device (name, unit_parse ("%s", text));
  free (text);
  return dev;
}

static const char *
status (struct device *dev)
{
  static char buf[4096];

  device_status (dev, buf, sizeof buf);
  return buf;
}

#define CHECK_STATUS(dev, ...) do { \
    char *_f = unit_sprintf (__VA_ARGS__); \
    char *_w = unit_sprintf ("0 256 multipath %s\n", _f); \
    free (_f); \
    CHECKF (strcmp (status (dev), _w) == 0, "\n    got:  %s\n    want: %s", \
            status (dev), _w); \
    free (_w); } while (0)

/* The first sector read from dev: which file's it is ('A', 'B', '?'). */
static char
read_from (struct device *dev, int *error)
{
  unsigned char buf[S], a[S], b[S];

  unit_fill (a, S, 1, 0);
  unit_fill (b, S, 2, 0);
  *error = device_pread (dev, buf, S, 0, 0);
  if (*error)
    return 'E';
  return memcmp (buf, a, S) == 0 ? 'A' : memcmp (buf, b, S) == 0 ? 'B' : '?';
}

static void
expect_reads_at (int srcline, struct device *dev, const char *want)
{
  char got[64];
  int e, i;

  for (i = 0; want[i] && i < 63; i++)
    got[i] = read_from (dev, &e);
  got[i] = '\0';
  if (strcmp (got, want) != 0) {
    fprintf (stderr, "test-unit-multipath.c:%d: reads went to %s, not %s\n",
             srcline, got, want);
    unit_failures++;
  }
}
#define expect_reads(dev, want) expect_reads_at (__LINE__, dev, want)

/* A message to dev's target at sector 0: unit_message, err.msg its
 * error.
 */
static int
msg (struct device *dev, const char *words, struct mapper_err *err)
{
  return unit_message (dev, 0, words, err->msg, sizeof err->msg);
}

static void
test_selectors (void)
{
  struct device *dev;

  /* round-robin: each path repeat_count requests in turn. */
  dev = mp_dev ("0 256 multipath 0 0 1 1 round-robin 0 2 0 %s %s", A, B);
  expect_reads (dev, "ABABAB");
  device_destroy (dev);
  dev = mp_dev ("0 256 multipath 0 0 1 1 round-robin 0 2 1 %s 2 %s 1", A,
                B);
  expect_reads (dev, "AABAABAAB");
  device_destroy (dev);
  /* queue-length and service-time: idle paths tie, and the first (or
   * the faster) wins every time.
   */
  dev = mp_dev ("0 256 multipath 0 0 1 1 queue-length 0 2 0 %s %s", A, B);
  expect_reads (dev, "AAAA");
  CHECK_STATUS (dev, "2 0 0 0 1 1 A 0 2 1 %s A 0 0 %s A 0 0", A, B);
  device_destroy (dev);
  dev = mp_dev ("0 256 multipath 0 0 1 1 service-time 0 2 2 %s 1 1 %s 1 5",
                A, B);
  expect_reads (dev, "BBBB");
  CHECK_STATUS (dev, "2 0 0 0 1 1 A 0 2 2 %s A 0 0 1 %s A 0 0 5", A, B);
  device_destroy (dev);
}

/* A path that fails (an error device) and its I/O going elsewhere. */
static void
test_failover (void)
{
  struct device *e = unit_device ("e", unit_parse ("0 256 error"));
  struct device *dev;
  unsigned char buf[4 * S], want[4 * S];
  int r;

  /* One group: the failed path is skipped from then on. */
  dev = mp_dev ("0 256 multipath 0 0 1 1 round-robin 0 2 0 mapper:e %s", A);
  expect_reads (dev, "AAAA");
  CHECK_STATUS (dev, "2 0 0 0 1 1 A 0 2 0 mapper:e F 1 %s A 0", A);
  device_destroy (dev);

  /* Two groups: the next one takes over, and status says which is
   * active.
   */
  dev = mp_dev ("0 256 multipath 0 0 2 1 round-robin 0 1 0 mapper:e "
                "round-robin 0 1 0 %s", A);
  expect_reads (dev, "AA");
  CHECK_STATUS (dev, "2 0 0 0 2 2 E 0 1 0 mapper:e F 1 A 0 1 0 %s A 0", A);
  /* Writes too, and a flush: the failed path's (failed) write is
   * covered by a flush on the other path.
   */
  unit_fill (want, sizeof want, 9, 0);
  CHECK_EQ (device_pwrite (dev, want, sizeof want, 8 * S, 0), 0);
  CHECK_EQ (device_flush (dev, 0), 0);
  CHECK (device_pread (dev, buf, sizeof buf, 8 * S, 0) == 0);
  CHECK (memcmp (buf, want, sizeof buf) == 0);
  device_destroy (dev);

  /* No path left and no queueing: EIO at once. */
  dev = mp_dev ("0 256 multipath 0 0 1 1 round-robin 0 1 0 mapper:e");
  expect_reads (dev, "E");
  r = device_pread (dev, buf, S, 0, 0);
  CHECK_EQ (r, -EIO);
  /* A write that went to no path needs no flush. */
  CHECK_EQ (device_pwrite (dev, buf, S, 0, 0), -EIO);
  CHECK_EQ (device_flush (dev, 0), 0);
  CHECK_STATUS (dev, "2 0 0 0 1 1 E 0 1 0 mapper:e F 1");
  device_destroy (dev);
  /* One that reached a path that failed, with no other path to flush:
   * the flush fails.
   */
  dev = mp_dev ("0 256 multipath 0 0 1 1 round-robin 0 1 0 mapper:e");
  CHECK_EQ (device_pwrite (dev, buf, S, 0, 0), -EIO);
  CHECK_EQ (device_flush (dev, 0), -EIO);
  CHECK_STATUS (dev, "2 0 0 0 1 1 E 0 1 0 mapper:e F 1");
  device_destroy (dev);
  device_destroy (e);
}

struct reader {
  struct device *dev;
  int r;
  char from;
};

static void *
reader (void *arg)
{
  struct reader *rd = arg;

  rd->from = read_from (rd->dev, &rd->r);
  return NULL;
}

/* "VERB PATH" to dev's target, which must take it. */
static void
path_msg_at (int srcline, struct device *dev, const char *verb,
             const char *path)
{
  struct mapper_err err;
  char *m = unit_sprintf ("%s %s", verb, path);
  int r = msg (dev, m, &err);

  if (r != 0) {
    fprintf (stderr, "test-unit-multipath.c:%d: %s: %d (%s)\n", srcline, m,
             r, err.msg);
    unit_failures++;
  }
  free (m);
}
#define path_msg(dev, verb, path) path_msg_at (__LINE__, dev, verb, path)

/* dev has no path and queues: a read waits, and completes from path
 * (file from) once reinstate_path brings it back.  It cannot have
 * completed before: there was no path.
 */
static void
read_waits_for (struct device *dev, const char *path, char from)
{
  struct reader rd = { .dev = dev };
  pthread_t t;

  CHECK_EQ (pthread_create (&t, NULL, reader, &rd), 0);
  path_msg (dev, "reinstate_path", path);
  pthread_join (t, NULL);
  CHECK_EQ (rd.r, 0);
  CHECK_EQ (rd.from, from);
}

/* queue_if_no_path: a read waits for a path (reinstate_path) or until
 * queueing stops (fail_if_no_path).  Either way it cannot have completed
 * before the message: there was no path.
 */
static void
test_queueing (void)
{
  struct mapper_err err;
  struct device *dev;
  struct reader rd;
  pthread_t t;

  dev = mp_dev ("0 256 multipath 1 queue_if_no_path 0 1 1 round-robin 0 1 0 "
                "%s", A);
  path_msg (dev, "fail_path", A);
  CHECK_STATUS (dev, "2 1 0 0 1 1 E 0 1 0 %s F 1", A);
  read_waits_for (dev, A, 'A');

  path_msg (dev, "fail_path", A);
  rd = (struct reader) { .dev = dev };
  CHECK_EQ (pthread_create (&t, NULL, reader, &rd), 0);
  CHECK_EQ (msg (dev, "fail_if_no_path", &err), MESSAGE_TABLE_CHANGED);
  pthread_join (t, NULL);
  CHECK_EQ (rd.r, -EIO);
  CHECK_STATUS (dev, "2 0 0 0 1 1 E 0 1 0 %s F 2", A);
  device_destroy (dev);
}

static void
test_messages (void)
{
  struct device *dev;
  struct mapper_err err;
  char before[4096];
  static const struct {
    const char *words, *phrase;
  } bad[] = {
    { "", "missing message" },
    { "bogus", "unrecognised multipath message 'bogus'" },
    { "fail_path", "fail_path takes 1 argument, got 0" },
    { "fail_path a b", "fail_path takes 1 argument, got 2" },
    { "fail_path /nowhere", "fail_path: no path '/nowhere' in this target" },
    { "reinstate_path x", "reinstate_path: no path 'x' in this target" },
    { "switch_group 0", "switch_group: invalid priority group '0' (1 to 2)" },
    { "switch_group 3", "switch_group: invalid priority group '3' (1 to 2)" },
    { "disable_group x", "disable_group: invalid priority group 'x'" },
    { "enable_group", "enable_group takes 1 argument, got 0" },
    { "queue_if_no_path 1", "queue_if_no_path takes no argument, got 1" },
    { "fail_if_no_path x y", "fail_if_no_path takes no argument, got 2" },
  };

  dev = mp_dev ("0 256 multipath 0 0 2 1 round-robin 0 1 0 %s round-robin 0 "
                "1 0 %s", A, B);
  expect_reads (dev, "A");
  snprintf (before, sizeof before, "%s", status (dev));
  /* Refused, and neither the table nor the paths' state changed. */
  for (size_t i = 0; i < ARRAY_SIZE (bad); i++) {
    unit_message_refused (dev, 0, bad[i].words, EINVAL, bad[i].phrase);
    CHECKF (strcmp (status (dev), before) == 0, "'%s' changed status: %s",
            bad[i].words, status (dev));
  }

  /* switch_group: the next I/O goes to group 2. */
  CHECK_EQ (msg (dev, "switch_group 2", &err), 0);
  expect_reads (dev, "BB");
  CHECK_STATUS (dev, "2 0 0 0 2 2 E 0 1 0 %s A 0 A 0 1 0 %s A 0", A, B);
  /* Group 2's path fails (by message): group 1 takes over. */
  path_msg (dev, "fail_path", B);
  expect_reads (dev, "A");
  CHECK_STATUS (dev, "2 0 0 0 2 1 A 0 1 0 %s A 0 E 0 1 0 %s F 1", A, B);
  /* reinstate_path: dm does not fail back by itself (manual failback). */
  path_msg (dev, "reinstate_path", B);
  expect_reads (dev, "A");
  /* disable_group: bypassed while another group has a path. */
  CHECK_EQ (msg (dev, "disable_group 1", &err), 0);
  expect_reads (dev, "B");
  CHECK_STATUS (dev, "2 0 0 0 2 2 D 0 1 0 %s A 0 A 0 1 0 %s A 1", A, B);
  CHECK_EQ (msg (dev, "enable_group 1", &err), 0);
  CHECK_STATUS (dev, "2 0 0 0 2 2 E 0 1 0 %s A 0 A 0 1 0 %s A 1", A, B);
  /* queue_if_no_path shows in the table. */
  CHECK_EQ (msg (dev, "queue_if_no_path", &err), MESSAGE_TABLE_CHANGED);
  {
    int r;
    char *buf = device_table_text (dev, false, &r);
    char *want = unit_sprintf ("0 256 multipath 1 queue_if_no_path 0 2 2 "
                               "round-robin 0 1 1 %s 1 round-robin 0 1 1 %s "
                               "1\n", A, B);
    CHECKF (buf && strcmp (buf, want) == 0, "table: %s", buf);
    free (want);
    free (buf);
  }
  device_destroy (dev);
}

/* dev's table as nbdmsetup table prints it. */
static char *
table_text (struct device *dev)
{
  int r;
  char *t = device_table_text (dev, false, &r);

  if (t == NULL)
    UNIT_FATAL ("device_table_text: %d", r);
  return t;
}

/* queue_if_no_path and fail_if_no_path under no_path_retry N: the
 * queue mode until a path comes back (multipathd sets dm's flag again
 * from no_path_retry then); the table, what is saved, does not change,
 * so what it prints loads back as the same table and a restart does
 * what no_path_retry says.  Without no_path_retry, the message is the
 * table's feature (test_messages).
 */
/* A queue_if_no_path / fail_if_no_path message under no_path_retry:
 * taken (0, not MESSAGE_TABLE_CHANGED), and the table as it was.
 */
static void
queue_message_at (int srcline, struct device *dev, const char *words)
{
  struct mapper_err err;
  char *want = table_text (dev), *got;
  int r = msg (dev, words, &err);

  got = table_text (dev);
  if (r != 0 || strcmp (got, want) != 0) {
    fprintf (stderr, "test-unit-multipath.c:%d: %s: %d (%s), table %s"
             "    was %s", srcline, words, r, err.msg, got, want);
    unit_failures++;
  }
  free (got);
  free (want);
}
#define queue_message(dev, words) queue_message_at (__LINE__, dev, words)

static void
test_queue_messages (void)
{
  struct device *dev;
  char *want, *got;

  /* no_path_retry 0: no path fails at once; queue_if_no_path queues. */
  dev = mp_dev ("0 256 multipath 2 no_path_retry 0 0 1 1 round-robin 0 1 0 "
                "%s", A);
  queue_message (dev, "queue_if_no_path");
  path_msg (dev, "fail_path", A);
  CHECK_STATUS (dev, "2 1 0 0 1 1 E 0 1 0 %s F 1", A);
  read_waits_for (dev, A, 'A');
  /* The path came back: no_path_retry 0 again, no queueing. */
  path_msg (dev, "fail_path", A);
  expect_reads (dev, "E");
  CHECK_STATUS (dev, "2 0 0 0 1 1 E 0 1 0 %s F 2", A);
  device_destroy (dev);

  /* no_path_retry 5 queues; fail_if_no_path fails, until a path is
   * back.
   */
  dev = mp_dev ("0 256 multipath 2 no_path_retry 5 0 1 1 round-robin 0 1 0 "
                "%s", A);
  want = table_text (dev);
  queue_message (dev, "fail_if_no_path");
  path_msg (dev, "fail_path", A);
  CHECK_STATUS (dev, "2 0 0 0 1 1 E 0 1 0 %s F 1", A);
  expect_reads (dev, "E");
  path_msg (dev, "reinstate_path", A);
  path_msg (dev, "fail_path", A);
  CHECK_STATUS (dev, "2 1 0 0 1 1 E 0 1 0 %s F 2", A);
  device_destroy (dev);
  /* What it printed loads back as itself. */
  dev = mp_dev ("%s", want);
  got = table_text (dev);
  CHECKF (strcmp (got, want) == 0, "table %s loads back as %s", want, got);
  free (got);
  device_destroy (dev);
  free (want);
}

/* Group switching as dm's choose_pgpath: the group switch_group (or
 * the table's initial group) names is used once; one with no path then
 * is not kept for later, so a path of it coming back fails nothing back
 * (manual failback).
 */
static void
test_next_group (void)
{
  struct mapper_err err;
  struct device *dev;

  /* The initial group has no path at the first I/O. */
  dev = mp_dev ("0 256 multipath 0 0 2 1 round-robin 0 1 0 %s round-robin 0 "
                "1 0 %s", A, B);
  path_msg (dev, "fail_path", A);
  expect_reads (dev, "BB");
  path_msg (dev, "reinstate_path", A);
  expect_reads (dev, "BB");
  CHECK_STATUS (dev, "2 0 0 0 2 2 E 0 1 0 %s A 1 A 0 1 0 %s A 0", A, B);
  /* switch_group to a group with no path. */
  path_msg (dev, "fail_path", A);
  CHECK_EQ (msg (dev, "switch_group 1", &err), 0);
  expect_reads (dev, "BB");
  path_msg (dev, "reinstate_path", A);
  expect_reads (dev, "BB");
  CHECK_STATUS (dev, "2 0 0 0 2 2 E 0 1 0 %s A 2 A 0 1 0 %s A 0", A, B);
  /* One with a path: taken. */
  CHECK_EQ (msg (dev, "switch_group 1", &err), 0);
  expect_reads (dev, "AA");
  device_destroy (dev);
}

static int
count_extent (void *opaque, uint64_t offset, uint64_t len, uint32_t type)
{
  (*(unsigned *) opaque)++;
  return 0;
}

/* Block status is a query: it leaves round-robin's turn alone (reads
 * still alternate), and answers from the current group's path.
 */
static void
test_extents_query (void)
{
  struct device *dev;
  char got[9];
  unsigned n = 0;
  int e;

  dev = mp_dev ("0 256 multipath 0 0 1 1 round-robin 0 2 0 %s %s", A, B);
  for (int i = 0; i < 8; i++) {
    got[i] = read_from (dev, &e);
    CHECK_EQ (device_extents (dev, S, 0, 0, count_extent, &n), 0);
  }
  got[8] = '\0';
  CHECKF (strcmp (got, "ABABABAB") == 0, "reads between block status "
          "queries went to %s", got);
  CHECK (n >= 8);
  device_destroy (dev);
}

int
main (void)
{
  setup ();
  test_bad_tables ();
  test_format ();
  test_round_trip ();
  test_selectors ();
  test_failover ();
  test_queueing ();
  test_messages ();
  test_queue_messages ();
  test_next_group ();
  test_extents_query ();
  free (A);
  free (B);
  free (C);
  UNIT_EXIT ();
}

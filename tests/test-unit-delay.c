/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: the delay target.  Every malformed table refused with its
 * message; status round trips for the 3-, 6- and 9-argument forms; reads,
 * writes, zero and trim reach the right device at the right offset; and
 * the semantics of holding I/O back, checked by ordering, never by time:
 * a request delayed by an hour is seen waiting (status), a suspend lets it
 * go at once (the test would hang otherwise; alarm() turns a hang into a
 * failure), and after resume requests are held again; a held request
 * given up (mapper_request_abandoned) fails with ESHUTDOWN; the message
 * "delay" refuses bad forms and lets a held request go at a new delay.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "unit.h"
#include "unit-targets.h"

#define S 512ULL
#define HOUR "3600000"                    /* a delay no test waits out */

static char *R, *W, *F;                   /* read, write, flush devices */

static void
setup (void)
{
  unsigned char *buf = malloc (256 * S);

  /* Real paths: status prints the backends' canonical names. */
  unit_fill (buf, 256 * S, 1, 0);
  unit_write_file (unit_path ("read"), buf, 256 * S);
  unit_fill (buf, 256 * S, 2, 0);
  unit_write_file (unit_path ("write"), buf, 256 * S);
  unit_write_file (unit_path ("flush"), NULL, 64 * S);
  free (buf);
  R = realpath (unit_path ("read"), NULL);
  W = realpath (unit_path ("write"), NULL);
  F = realpath (unit_path ("flush"), NULL);
  if (!R || !W || !F)
    UNIT_FATAL ("realpath: %s", strerror (errno));
}

static void
test_bad_tables (void)
{
  static const unsigned bad_argc[] = { 0, 1, 2, 4, 5, 7, 8, 10, 12 };

  for (size_t i = 0; i < ARRAY_SIZE (bad_argc); i++) {
    char args[1024] = "", want[64];
    for (unsigned j = 0; j < bad_argc[i]; j++) {
      const char *a[] = { R, "0", "0" };
      strcat (args, " ");
      strcat (args, a[j % 3]);
    }
    snprintf (want, sizeof want, "got %u", bad_argc[i]);
    UNIT_FAIL (EINVAL, 1, "delay", "expected 3, 6 or 9 arguments", want,
               "0 8 delay%s\n", args);
  }
  /* The example: 4 arguments. */
  UNIT_FAIL (EINVAL, 2, "delay", "expected 3, 6 or 9", "got 4",
             "0 8 zero\n8 8 delay %s 0 10 %s\n", R, W);

  /* Numbers, per class. */
  UNIT_FAIL (EINVAL, 1, "delay", "offset 'x'", "not a non-negative integer",
             "0 8 delay %s x 0\n", R);
  UNIT_FAIL (EINVAL, 1, "delay", "offset '-1'", NULL,
             "0 8 delay %s -1 0\n", R);
  UNIT_FAIL (EINVAL, 1, "delay", "offset '18446744073709551615'", "overflows",
             "0 8 delay %s 18446744073709551615 0\n", R);
  UNIT_FAIL (EINVAL, 1, "delay", "delay '1.5'", "milliseconds",
             "0 8 delay %s 0 1.5\n", R);
  UNIT_FAIL (EINVAL, 1, "delay", "delay '4294967296'", NULL,
             "0 8 delay %s 0 4294967296\n", R);
  UNIT_FAIL (EINVAL, 1, "delay", "delay '10ms'", NULL, "0 8 delay %s 0 10ms\n",
             R);
  UNIT_FAIL (EINVAL, 1, "delay", "write offset 'y'", NULL,
             "0 8 delay %s 0 0 %s y 0\n", R, W);
  UNIT_FAIL (EINVAL, 1, "delay", "write delay '-3'", NULL,
             "0 8 delay %s 0 0 %s 0 -3\n", R, W);
  UNIT_FAIL (EINVAL, 1, "delay", "flush offset '1e3'", NULL,
             "0 8 delay %s 0 0 %s 0 0 %s 1e3 0\n", R, W, F);
  UNIT_FAIL (EINVAL, 1, "delay", "flush delay ''", NULL,
             "0 8 delay %s 0 0 %s 0 0 %s 0 ''\n", R, W, F);

  /* Devices: missing, and areas beyond the end, in each class. */
  UNIT_FAIL (ENOENT, 1, "delay", "nonexistent", NULL,
             "0 8 delay %s/nonexistent 0 0\n", unit_tmpdir ());
  UNIT_FAIL (ENOENT, 1, "delay", "nonexistent", NULL,
             "0 8 delay %s 0 0 %s/nonexistent 0 0\n", R, unit_tmpdir ());
  UNIT_FAIL (ENOENT, 1, "delay", "nonexistent", NULL,
             "0 8 delay %s 0 0 %s 0 0 %s/nonexistent 0 0\n", R, W,
             unit_tmpdir ());
  UNIT_FAIL (EINVAL, 1, "delay", "beyond the end", R, "0 8 delay %s 249 0\n",
             R);
  UNIT_FAIL (EINVAL, 1, "delay", "beyond the end", W,
             "0 8 delay %s 0 0 %s 249 0\n", R, W);
  UNIT_FAIL (EINVAL, 1, "delay", "beyond the end", F,
             "0 8 delay %s 0 0 %s 0 0 %s 57 0\n", R, W, F);
  /* Any later line's error leaves nothing behind either. */
  UNIT_FAIL (EINVAL, 3, "delay", "expected 3, 6 or 9", NULL,
             "0 8 delay %s 0 0 %s 0 0 %s 0 0\n8 8 delay %s 8 5\n"
             "16 8 delay %s\n", R, W, F, R, R);
}

static void
test_format (void)
{
  struct table *t;
  char *want;

  t = unit_parse ("0 8 delay %s 3 100\n", R);
  want = unit_sprintf ("0 8 delay %s 3 100\n", R);
  if (t) {
    unit_check_format (t, want);
    CHECK (strcmp (unit_status (t, 0, STATUSTYPE_INFO), "0 0 0") == 0);
    CHECK (table_nr_backends (t) == 1);
    table_free (t);
  }
  free (want);

  t = unit_parse ("0 8 delay %s 3 100 %s 7 0\n8 4 delay %s 0 0 %s 1 2 %s 5 "
                  "4294967295\n", R, W, R, W, F);
  want = unit_sprintf ("0 8 delay %s 3 100 %s 7 0\n8 4 delay %s 0 0 %s 1 2 "
                       "%s 5 4294967295\n", R, W, R, W, F);
  if (t) {
    unit_check_format (t, want);
    CHECK (table_nr_backends (t) == 3);
    table_free (t);
  }
  free (want);
}

/* Reads from the read device, writes (and zero, trim) to the write
 * device, each at its own offset.
 */
static void
test_mapping (void)
{
  unsigned char buf[8 * S], want[8 * S], *disk;
  struct device *dev;

  dev = unit_device ("map", unit_parse ("0 8 delay %s 10 0 %s 20 0\n", R, W));
  CHECK (device_pread (dev, buf, 8 * S, 0, 0) == 0);
  unit_fill (want, 8 * S, 1, 10 * S);
  CHECK (memcmp (buf, want, 8 * S) == 0);

  unit_fill (want, 3 * S + 7, 77, 0);
  CHECK (device_pwrite (dev, want, 3 * S + 7, 5, MAPPER_FUA) == 0);
  disk = unit_read_at (W, 20 * S + 5, 3 * S + 7);
  CHECK (memcmp (disk, want, 3 * S + 7) == 0);
  free (disk);
  /* The read device is untouched. */
  disk = unit_read_at (R, 10 * S, 8 * S);
  unit_fill (want, 8 * S, 1, 10 * S);
  CHECK (memcmp (disk, want, 8 * S) == 0);
  free (disk);

  CHECK (device_zero (dev, 2 * S, S, 0) == 0);
  disk = unit_read_at (W, 21 * S, 2 * S);
  CHECK (unit_is_zero (disk, 2 * S));
  free (disk);
  CHECK (device_trim (dev, S, 4 * S, 0) == 0);
  CHECK (device_flush (dev, 0) == 0);
  device_destroy (dev);

  /* 3-argument form: everything on one device. */
  dev = unit_device ("one", unit_parse ("0 8 delay %s 100 0\n", W));
  unit_fill (want, 8 * S, 78, 0);
  CHECK (device_pwrite (dev, want, 8 * S, 0, 0) == 0);
  CHECK (device_pread (dev, buf, 8 * S, 0, 0) == 0);
  CHECK (memcmp (buf, want, 8 * S) == 0);
  disk = unit_read_at (W, 100 * S, 8 * S);
  CHECK (memcmp (disk, want, 8 * S) == 0);
  free (disk);
  device_destroy (dev);
}

/* --- holding I/O back -------------------------------------------------- */

struct op {
  struct device *dev;
  enum io_op op;
  int result;
  unsigned char buf[4 * 512];
  _Atomic bool done;
};

static void *
op_thread (void *arg)
{
  struct op *o = arg;

  switch (o->op) {
  case IO_READ:
    o->result = device_pread (o->dev, o->buf, sizeof o->buf, 0, 0);
    break;
  case IO_WRITE:
    o->result = device_pwrite (o->dev, o->buf, sizeof o->buf, 0, 0);
    break;
  case IO_ZERO:
    o->result = device_zero (o->dev, sizeof o->buf, 0, 0);
    break;
  case IO_FLUSH:
    o->result = device_flush (o->dev, 0);
    break;
  default:
    abort ();
  }
  atomic_store (&o->done, true);
  return NULL;
}

/* Wait until the delay target's status is want ("reads writes flushes
 * being delayed"): proof that the request reached the delay and waits.
 */
static void
wait_status (struct device *dev, const char *want)
{
  for (;;) {
    const char *s;
    pthread_mutex_lock (&dev->lock);
    s = unit_status (dev->live, 0, STATUSTYPE_INFO);
    if (strcmp (s, want) == 0) {
      pthread_mutex_unlock (&dev->lock);
      return;
    }
    pthread_mutex_unlock (&dev->lock);
    usleep (1000);
  }
}

/* Start op on dev, see it held by the delay, release it by suspending;
 * it must succeed.  The device is resumed afterwards.
 */
static void
held_then_released (struct device *dev, enum io_op op, const char *status)
{
  struct mapper_err err = { "" };
  struct op o = { .dev = dev, .op = op };
  pthread_t th;

  atomic_init (&o.done, false);
  unit_fill (o.buf, sizeof o.buf, 5, 0);
  if (pthread_create (&th, NULL, op_thread, &o) != 0)
    UNIT_FATAL ("pthread_create");
  wait_status (dev, status);
  CHECK (!atomic_load (&o.done));
  /* The suspend returns only once the request is out: it must not wait
   * an hour.
   */
  CHECK (device_suspend (dev, false) == 0);
  pthread_join (th, NULL);
  CHECKF (o.result == 0, "%s: %s", io_op_name[op], strerror (-o.result));
  pthread_mutex_lock (&dev->lock);
  CHECK (strcmp (unit_status (dev->live, 0, STATUSTYPE_INFO), "0 0 0") == 0);
  pthread_mutex_unlock (&dev->lock);
  CHECK (device_resume (dev, &err) == 0);
}

static void
test_suspend_releases (void)
{
  unsigned char want[4 * 512], *disk;
  struct device *dev;

  /* Hour-long delays for every class, each class on its own device. */
  dev = unit_device ("held", unit_parse ("0 16 delay %s 0 " HOUR " %s 0 " HOUR
                                         " %s 0 " HOUR "\n", R, W, F));
  held_then_released (dev, IO_READ, "1 0 0");
  held_then_released (dev, IO_WRITE, "0 1 0");
  unit_fill (want, sizeof want, 5, 0);
  disk = unit_read_at (W, 0, sizeof want);
  CHECK (memcmp (disk, want, sizeof want) == 0);    /* written, not lost */
  free (disk);
  held_then_released (dev, IO_ZERO, "0 1 0");
  disk = unit_read_at (W, 0, sizeof want);
  CHECK (unit_is_zero (disk, sizeof want));
  free (disk);
  held_then_released (dev, IO_FLUSH, "0 0 1");
  /* After each resume the next request was held again (the status
   * showed it), so resume re-enabled the delay.  Once more, twice over:
   * suspend/resume cycles don't wear it out.
   */
  held_then_released (dev, IO_READ, "1 0 0");
  held_then_released (dev, IO_READ, "1 0 0");
  device_destroy (dev);

  /* A 3-argument table delays writes and flushes with the read class. */
  dev = unit_device ("held3", unit_parse ("0 16 delay %s 0 " HOUR "\n", W));
  held_then_released (dev, IO_WRITE, "0 1 0");
  held_then_released (dev, IO_FLUSH, "0 0 1");
  device_destroy (dev);

  /* A 6-argument table delays flushes with the write class. */
  dev = unit_device ("held6", unit_parse ("0 16 delay %s 0 0 %s 0 " HOUR "\n",
                                          R, W));
  held_then_released (dev, IO_FLUSH, "0 0 1");
  device_destroy (dev);

  /* A reload (resume with a new table) also releases the old table's
   * delayed requests: the swap suspends first.
   */
  {
    struct mapper_err err = { "" };
    struct op o = { .op = IO_READ };
    pthread_t th;

    dev = unit_device ("reload", unit_parse ("0 16 delay %s 0 " HOUR "\n", R));
    o.dev = dev;
    atomic_init (&o.done, false);
    if (pthread_create (&th, NULL, op_thread, &o) != 0)
      UNIT_FATAL ("pthread_create");
    wait_status (dev, "1 0 0");
    device_load (dev, unit_parse ("0 16 linear %s 0\n", R));
    CHECK (device_resume (dev, &err) == 0);
    pthread_join (th, NULL);
    CHECK (o.result == 0);
    unit_fill (want, sizeof want, 1, 0);
    CHECK (memcmp (o.buf, want, sizeof want) == 0);
    device_destroy (dev);
  }
}

/* Zero delays never wait: with a zero read delay and an hour's write
 * delay, reads complete while a write is held.
 */
static void
test_zero_delay (void)
{
  unsigned char buf[S], want[S];
  struct mapper_err err = { "" };
  struct device *dev;
  struct op o = { .op = IO_WRITE };
  pthread_t th;

  dev = unit_device ("zero", unit_parse ("0 16 delay %s 0 0 %s 0 " HOUR "\n",
                                         R, W));
  o.dev = dev;
  atomic_init (&o.done, false);
  if (pthread_create (&th, NULL, op_thread, &o) != 0)
    UNIT_FATAL ("pthread_create");
  wait_status (dev, "0 1 0");
  for (int i = 0; i < 100; i++) {
    CHECK (device_pread (dev, buf, S, i % 16 * S, 0) == 0);
    unit_fill (want, S, 1, i % 16 * S);
    CHECK (memcmp (buf, want, S) == 0);
  }
  CHECK (!atomic_load (&o.done));
  CHECK (device_suspend (dev, true) == 0);
  pthread_join (th, NULL);
  CHECK (o.result == 0);
  CHECK (device_resume (dev, &err) == 0);
  device_destroy (dev);
}

/* mapper_request_abandoned, as the plugin sets it: gives up once told. */
static _Atomic bool abandon;

static int
abandoned_hook (void)
{
  return atomic_load (&abandon) ? -ESHUTDOWN : 0;
}

/* A request held by an hour's delay whose client has gone, or on a
 * server that is stopping, fails with -ESHUTDOWN instead of waiting the
 * hour (nothing reaches the backend), for every class; the delay itself
 * is not worn out: the next request is held again.
 */
static void
test_given_up (void)
{
  static const struct { enum io_op op; const char *status; } held[] = {
    { IO_READ, "1 0 0" }, { IO_WRITE, "0 1 0" }, { IO_FLUSH, "0 0 1" },
  };
  unsigned char *disk;
  struct device *dev;

  mapper_request_abandoned = abandoned_hook;
  unit_write_file (unit_path ("given-up"), NULL, 64 * S);
  dev = unit_device ("given-up", unit_parse ("0 16 delay %s 0 " HOUR " %s 0 "
                                             HOUR "\n", R,
                                             unit_path ("given-up")));
  for (size_t i = 0; i < ARRAY_SIZE (held); i++) {
    struct op o = { .dev = dev, .op = held[i].op };
    pthread_t th;

    atomic_init (&o.done, false);
    unit_fill (o.buf, sizeof o.buf, 9, 0);
    if (pthread_create (&th, NULL, op_thread, &o) != 0)
      UNIT_FATAL ("pthread_create");
    wait_status (dev, held[i].status);
    atomic_store (&abandon, true);
    pthread_join (th, NULL);
    atomic_store (&abandon, false);
    CHECKF (o.result == -ESHUTDOWN, "%s: %s", io_op_name[held[i].op],
            strerror (-o.result));
    pthread_mutex_lock (&dev->lock);
    CHECK (strcmp (unit_status (dev->live, 0, STATUSTYPE_INFO), "0 0 0") == 0);
    pthread_mutex_unlock (&dev->lock);
  }
  disk = unit_read_at (unit_path ("given-up"), 0, 16 * S);
  CHECK (unit_is_zero (disk, 16 * S));          /* the write never landed */
  free (disk);
  held_then_released (dev, IO_READ, "1 0 0");
  device_destroy (dev);
  mapper_request_abandoned = NULL;
}

/* The message "delay" (ours): each bad form refused with the table as it
 * was; a good one changes the table's delays, and a request held by an
 * hour's delay is let go by a message setting 0 (it measures its wait
 * again), without a suspend.
 */
static void
test_message (void)
{
  static const struct { const char *words, *want; } bad[] = {
    { "delay", "this table gives 2 classes of delay, so 2 numbers, got 0" },
    { "delay 1", "so 2 numbers, got 1" },
    { "delay 1 2 3", "so 2 numbers, got 3" },
    { "delay x 1", "delay: invalid delay 'x' (milliseconds, 0 to" },
    { "delay 1 -1", "delay: invalid write delay '-1'" },
    { "delay 1 4294967296", "delay: invalid write delay '4294967296'" },
    { "slow 1 2", "unrecognised message 'slow': delay takes 'delay <ms> "
      "<write_ms>'" },
    { "", "unrecognised message ''" },
  };
  struct device *dev;
  struct op o = { .op = IO_READ };
  char msg[256], *want;
  pthread_t th;

  dev = unit_device ("message", unit_parse ("0 16 delay %s 0 " HOUR " %s 0 "
                                            HOUR "\n", R, W));
  for (size_t i = 0; i < ARRAY_SIZE (bad); i++)
    unit_message_refused (dev, 0, bad[i].words, EINVAL, bad[i].want);

  o.dev = dev;
  atomic_init (&o.done, false);
  if (pthread_create (&th, NULL, op_thread, &o) != 0)
    UNIT_FATAL ("pthread_create");
  wait_status (dev, "1 0 0");
  CHECK (!atomic_load (&o.done));
  /* The read's class only: the write delay stays an hour. */
  CHECK (unit_message (dev, 0, "delay 0 " HOUR, msg, sizeof msg) ==
         MESSAGE_TABLE_CHANGED);
  pthread_join (th, NULL);              /* an hour, without the message */
  CHECKF (o.result == 0, "%s", strerror (-o.result));
  want = unit_sprintf ("%s 0 0 %s 0 " HOUR, R, W);
  CHECKF (strstr (unit_table_text (dev), want) != NULL, "%s",
          unit_table_text (dev));
  free (want);
  /* Flushes follow the write class, as in the table: still held. */
  held_then_released (dev, IO_FLUSH, "0 0 1");
  CHECK (unit_message (dev, 0, "DELAY 7 9", msg, sizeof msg) ==
         MESSAGE_TABLE_CHANGED);
  want = unit_sprintf ("%s 0 7 %s 0 9", R, W);
  CHECKF (strstr (unit_table_text (dev), want) != NULL, "%s",
          unit_table_text (dev));
  free (want);
  device_destroy (dev);
}

int
main (void)
{
  /* A delay that is not released would hang the test: fail instead. */
  alarm (120);
  setup ();
  test_bad_tables ();
  test_format ();
  test_mapping ();
  test_suspend_releases ();
  test_zero_delay ();
  test_given_up ();
  test_message ();
  free (R);
  free (W);
  free (F);
  UNIT_EXIT ();
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: the flakey target.  Every table dm-flakey refuses is
 * refused here with its message (up + down = 0, corrupt_bio_byte w with
 * drop_writes, duplicated and conflicting features, wrong feature
 * counts...); status prints the features as dm does; and what each
 * feature does while down, checked against the backing file; extents
 * while down say data where reads fail or are corrupted.  "Always
 * up" is down_interval 0 and "always down" up_interval 0, so nothing here
 * depends on time.
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

#define S 512ULL
#define FILE_SECTORS 256
#define SEED 3

static char *A, *B;
static int dev_nr;

static void
setup (void)
{
  unsigned char *buf = malloc (FILE_SECTORS * S);

  unit_fill (buf, FILE_SECTORS * S, SEED, 0);
  unit_write_file (unit_path ("a"), buf, FILE_SECTORS * S);
  unit_write_file (unit_path ("b"), NULL, FILE_SECTORS * S);
  free (buf);
  A = realpath (unit_path ("a"), NULL);
  B = realpath (unit_path ("b"), NULL);
  if (!A || !B)
    UNIT_FATAL ("realpath: %s", strerror (errno));
}

/* Put back the original contents of A. */
static void
reset_a (void)
{
  unsigned char *buf = malloc (FILE_SECTORS * S);

  unit_fill (buf, FILE_SECTORS * S, SEED, 0);
  unit_write_file (A, buf, FILE_SECTORS * S);
  free (buf);
}

static void
test_bad_tables (void)
{
  /* Argument counts. */
  UNIT_FAIL (EINVAL, 1, "flakey", "expected <dev> <offset> <up_interval>",
             "got 0 arguments", "0 8 flakey\n");
  UNIT_FAIL (EINVAL, 1, "flakey", "got 3 arguments", NULL,
             "0 8 flakey %s 0 1\n", A);
  /* Numbers. */
  UNIT_FAIL (EINVAL, 1, "flakey", "offset 'x'", NULL, "0 8 flakey %s x 1 1\n",
             A);
  UNIT_FAIL (EINVAL, 1, "flakey", "offset '18446744073709551615'",
             "overflows", "0 8 flakey %s 18446744073709551615 1 1\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "invalid up interval '-1'", NULL,
             "0 8 flakey %s 0 -1 1\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "invalid up interval '4294967296'", NULL,
             "0 8 flakey %s 0 4294967296 1\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "invalid down interval '1s'", NULL,
             "0 8 flakey %s 0 1 1s\n", A);
  /* up + down = 0, and its overflow. */
  UNIT_FAIL (EINVAL, 1, "flakey", "total (up + down) interval is zero", NULL,
             "0 8 flakey %s 0 0 0\n", A);
  UNIT_FAIL (EINVAL, 2, "flakey", "interval is zero", NULL,
             "0 8 zero\n8 8 flakey %s 0 0 0 1 drop_writes\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "interval overflow", NULL,
             "0 8 flakey %s 0 4294967295 1\n", A);

  /* Feature counts. */
  UNIT_FAIL (EINVAL, 1, "flakey", "invalid number of feature arguments 'x'",
             NULL, "0 8 flakey %s 0 0 1 x\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "invalid number of feature arguments '12'",
             "0 to 11", "0 8 flakey %s 0 0 1 12 %s\n", A,
             "error_reads error_reads error_reads error_reads error_reads "
             "error_reads error_reads error_reads error_reads error_reads "
             "error_reads error_reads");
  UNIT_FAIL (EINVAL, 1, "flakey", "2 feature arguments declared but 1 given",
             NULL, "0 8 flakey %s 0 0 1 2 drop_writes\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "1 feature argument declared but 2 given",
             NULL, "0 8 flakey %s 0 0 1 1 drop_writes error_reads\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "0 feature arguments declared but 1 given",
             NULL, "0 8 flakey %s 0 0 1 0 drop_writes\n", A);
  /* corrupt_bio_byte counts as 5 arguments. */
  UNIT_FAIL (EINVAL, 1, "flakey", "corrupt_bio_byte requires 4 parameters",
             NULL, "0 8 flakey %s 0 0 1 1 corrupt_bio_byte\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "corrupt_bio_byte requires 4 parameters",
             NULL, "0 8 flakey %s 0 0 1 4 corrupt_bio_byte 1 r 0\n", A);

  /* Unknown, duplicated and conflicting features. */
  UNIT_FAIL (EINVAL, 1, "flakey", "unknown feature 'drop_reads'", NULL,
             "0 8 flakey %s 0 0 1 1 drop_reads\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "unknown feature 'random_read_corrupt'",
             NULL, "0 8 flakey %s 0 0 1 2 random_read_corrupt 5\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "feature error_reads duplicated", NULL,
             "0 8 flakey %s 0 0 1 2 error_reads ERROR_READS\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "feature drop_writes duplicated", NULL,
             "0 8 flakey %s 0 0 1 2 drop_writes drop_writes\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "feature error_writes duplicated", NULL,
             "0 8 flakey %s 0 0 1 2 error_writes error_writes\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "feature corrupt_bio_byte duplicated", NULL,
             "0 8 flakey %s 0 0 1 10 corrupt_bio_byte 1 r 0 0 "
             "corrupt_bio_byte 2 r 0 0\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey",
             "feature drop_writes conflicts with feature error_writes", NULL,
             "0 8 flakey %s 0 0 1 2 error_writes drop_writes\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey",
             "feature error_writes conflicts with feature drop_writes", NULL,
             "0 8 flakey %s 0 0 1 2 drop_writes error_writes\n", A);

  /* corrupt_bio_byte's parameters. */
  UNIT_FAIL (EINVAL, 1, "flakey", "invalid byte number '0'", NULL,
             "0 8 flakey %s 0 0 1 5 corrupt_bio_byte 0 r 0 0\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "invalid byte number '4294967296'", NULL,
             "0 8 flakey %s 0 0 1 5 corrupt_bio_byte 4294967296 r 0 0\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "invalid direction 'rw'", "(r or w)",
             "0 8 flakey %s 0 0 1 5 corrupt_bio_byte 1 rw 0 0\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "invalid value '256'", "0 to 255",
             "0 8 flakey %s 0 0 1 5 corrupt_bio_byte 1 r 256 0\n", A);
  UNIT_FAIL (EINVAL, 1, "flakey", "invalid flags mask '-1'", NULL,
             "0 8 flakey %s 0 0 1 5 corrupt_bio_byte 1 r 0 -1\n", A);

  /* The incompatible combinations, in either order. */
  UNIT_FAIL (EINVAL, 1, "flakey", "drop_writes is incompatible with "
             "corrupt_bio_byte with the WRITE flag set", NULL,
             "0 8 flakey %s 0 0 1 6 drop_writes corrupt_bio_byte 1 w 0 0\n",
             A);
  UNIT_FAIL (EINVAL, 1, "flakey", "drop_writes is incompatible", NULL,
             "0 8 flakey %s 0 0 1 6 corrupt_bio_byte 1 W 0 0 drop_writes\n",
             A);
  UNIT_FAIL (EINVAL, 1, "flakey", "error_writes is incompatible with "
             "corrupt_bio_byte with the WRITE flag set", NULL,
             "0 8 flakey %s 0 0 1 6 error_writes corrupt_bio_byte 1 w 0 0\n",
             A);
  UNIT_FAIL (EINVAL, 1, "flakey", "error_reads is incompatible with "
             "corrupt_bio_byte with the READ flag set", NULL,
             "0 8 flakey %s 0 0 1 6 corrupt_bio_byte 1 r 0 0 error_reads\n",
             A);

  /* The device. */
  UNIT_FAIL (ENOENT, 1, "flakey", "nonexistent", NULL,
             "0 8 flakey %s/nonexistent 0 0 1\n", unit_tmpdir ());
  UNIT_FAIL (EINVAL, 1, "flakey", "beyond the end", NULL,
             "0 8 flakey %s %d 0 1\n", A, FILE_SECTORS - 7);
  /* Features are checked before the device is looked up (as dm does). */
  UNIT_FAIL (EINVAL, 1, "flakey", "unknown feature", NULL,
             "0 8 flakey %s/nonexistent 0 0 1 1 x\n", unit_tmpdir ());
}

/* status TABLE as dm prints it: no features means error_reads and
 * error_writes; names lowercase; dm's order.
 */
static void
test_format (void)
{
  static const struct { const char *in, *out; } cases[] = {
    { "0 1", "0 1 2 error_reads error_writes" },
    { "5 7 0", "5 7 2 error_reads error_writes" },
    { "1 0 1 DROP_writes", "1 0 1 drop_writes" },
    { "0 1 1 error_writes", "0 1 1 error_writes" },
    { "0 1 2 error_writes error_reads", "0 1 2 error_reads error_writes" },
    { "0 1 2 drop_writes error_reads", "0 1 2 error_reads drop_writes" },
    { "0 1 5 corrupt_bio_byte 32 R 1 0", "0 1 5 corrupt_bio_byte 32 r 1 0" },
    { "3 4 6 corrupt_bio_byte 4294967295 w 255 131072 error_reads",
      "3 4 6 error_reads corrupt_bio_byte 4294967295 w 255 131072" },
    { "0 1 6 drop_writes corrupt_bio_byte 1 r 0 0",
      "0 1 6 drop_writes corrupt_bio_byte 1 r 0 0" },
    { "4294967294 1 0", "4294967294 1 2 error_reads error_writes" },
  };

  for (size_t i = 0; i < ARRAY_SIZE (cases); i++) {
    char *text = unit_sprintf ("0 8 flakey %s 3 %s\n", A, cases[i].in);
    char *want = unit_sprintf ("0 8 flakey %s 3 %s\n", A, cases[i].out);

    unit_check_roundtrip (text, want);
    free (text);
    free (want);
  }
}

/* A device: flakey over A at sector 8 for sectors 0-63, then linear over
 * A at 100 for 64-79 (never flakey).
 */
static struct device *
flakey_dev (const char *updown_features)
{
  char name[32];

  reset_a ();
  snprintf (name, sizeof name, "f%d", dev_nr++);
  return unit_device (name, unit_parse ("0 64 flakey %s 8 %s\n"
                                        "64 16 linear %s 100\n",
                                        A, updown_features, A));
}

/* A's bytes [off, off+len) must be the original (or, for changed,
 * differ from the original exactly where changed says).
 */
static void
check_a_at (int srcline, uint64_t off, size_t len, const unsigned char *want)
{
  unsigned char *disk = unit_read_at (A, off, len);
  unsigned char *orig = malloc (len);
  long d;

  unit_fill (orig, len, SEED, off);
  d = unit_first_diff (disk, want ? want : orig, len);
  if (d >= 0) {
    fprintf (stderr, "test-unit-flakey.c:%d: A at %" PRIu64 "+%zu differs "
             "at byte %ld\n", srcline, off, len, d);
    unit_failures++;
  }
  free (disk);
  free (orig);
}
#define check_a(off, len, want) check_a_at (__LINE__, off, len, want)

static void
test_up (void)
{
  unsigned char buf[16 * S], want[16 * S];
  struct device *dev;

  /* Always up: every feature is dormant. */
  dev = flakey_dev ("1 0 2 error_reads error_writes");
  CHECK (device_pread (dev, buf, 16 * S, 0, 0) == 0);
  unit_fill (want, 16 * S, SEED, 8 * S);
  CHECK (memcmp (buf, want, 16 * S) == 0);
  unit_fill (want, 3 * S, 9, 0);
  CHECK (device_pwrite (dev, want, 3 * S, S + 1, 0) == 0);
  check_a (9 * S + 1, 3 * S, want);
  CHECK (device_zero (dev, S, 20 * S, 0) == 0);
  CHECK (device_trim (dev, S, 30 * S, 0) == 0);
  CHECK (device_flush (dev, 0) == 0);
  device_destroy (dev);

  /* The clock starts at load: an hour up then an hour down is up now,
   * whenever the table is made.
   */
  dev = flakey_dev ("3600 3600");
  CHECK (device_pread (dev, buf, S, 0, 0) == 0);
  CHECK (device_flush (dev, 0) == 0);
  device_destroy (dev);
}

static void
test_down_default (void)
{
  unsigned char buf[16 * S], want[16 * S];
  struct device *dev;

  /* No features: everything fails, nothing is written. */
  for (int i = 0; i < 2; i++) {
    dev = flakey_dev (i ? "0 1 0" : "0 1");
    unit_fill (want, 4 * S, 11, 0);
    CHECK (device_pread (dev, buf, S, 0, 0) == -EIO);
    CHECK (device_pwrite (dev, want, 4 * S, 0, 0) == -EIO);
    CHECK (device_pwrite (dev, want, 4 * S, 0, MAPPER_FUA) == -EIO);
    CHECK (device_zero (dev, 4 * S, 0, 0) == -EIO);
    CHECK (device_trim (dev, 4 * S, 0, 0) == -EIO);
    CHECK (device_flush (dev, 0) == -EIO);
    check_a (0, FILE_SECTORS * S, NULL);
    /* The linear target after it is unaffected. */
    CHECK (device_pread (dev, buf, 16 * S, 64 * S, 0) == 0);
    unit_fill (want, 16 * S, SEED, 100 * S);
    CHECK (memcmp (buf, want, 16 * S) == 0);
    /* A request crossing into the flakey part fails as a whole. */
    CHECK (device_pread (dev, buf, 2 * S, 63 * S, 0) == -EIO);
    device_destroy (dev);
  }
}

static void
test_drop_writes (void)
{
  unsigned char buf[16 * S], want[16 * S];
  struct device *dev;

  dev = flakey_dev ("0 5 1 drop_writes");
  unit_fill (want, 16 * S, 12, 0);
  CHECK (device_pwrite (dev, want, 16 * S, 3, 0) == 0);
  CHECK (device_pwrite (dev, want, 5, 40 * S, MAPPER_FUA) == 0);
  CHECK (device_zero (dev, 8 * S, 0, 0) == 0);
  CHECK (device_zero (dev, 8 * S, 0, MAPPER_MAY_TRIM) == 0);
  CHECK (device_trim (dev, 8 * S, 0, 0) == 0);
  CHECK (device_flush (dev, 0) == 0);
  check_a (0, FILE_SECTORS * S, NULL);            /* all dropped */
  /* Reads work and show the old data. */
  CHECK (device_pread (dev, buf, 16 * S, 0, 0) == 0);
  unit_fill (want, 16 * S, SEED, 8 * S);
  CHECK (memcmp (buf, want, 16 * S) == 0);
  /* A write crossing into the linear target: only that part lands. */
  unit_fill (want, 2 * S, 13, 0);
  CHECK (device_pwrite (dev, want, 2 * S, 63 * S, 0) == 0);
  check_a (71 * S, S, NULL);
  check_a (100 * S, S, want + S);
  device_destroy (dev);

  /* With error_reads too. */
  dev = flakey_dev ("0 5 2 drop_writes error_reads");
  CHECK (device_pwrite (dev, want, 2 * S, 0, 0) == 0);
  CHECK (device_pread (dev, buf, S, 0, 0) == -EIO);
  check_a (0, FILE_SECTORS * S, NULL);
  device_destroy (dev);
}

static void
test_error_writes_reads (void)
{
  unsigned char buf[16 * S], want[16 * S];
  struct device *dev;

  dev = flakey_dev ("0 5 1 error_writes");
  unit_fill (want, 4 * S, 14, 0);
  CHECK (device_pwrite (dev, want, 4 * S, 0, 0) == -EIO);
  CHECK (device_zero (dev, 4 * S, 0, 0) == -EIO);
  CHECK (device_trim (dev, 4 * S, 0, 0) == -EIO);
  CHECK (device_flush (dev, 0) == -EIO);
  CHECK (device_pread (dev, buf, 16 * S, 0, 0) == 0);
  unit_fill (want, 16 * S, SEED, 8 * S);
  CHECK (memcmp (buf, want, 16 * S) == 0);
  check_a (0, FILE_SECTORS * S, NULL);
  device_destroy (dev);

  dev = flakey_dev ("0 5 1 error_reads");
  CHECK (device_pread (dev, buf, S, 0, 0) == -EIO);
  unit_fill (want, 4 * S, 15, 0);
  CHECK (device_pwrite (dev, want, 4 * S, 7, 0) == 0);    /* writes pass */
  check_a (8 * S + 7, 4 * S, want);
  CHECK (device_flush (dev, 0) == 0);
  device_destroy (dev);
}

static void
test_corrupt (void)
{
  unsigned char buf[16 * S], want[16 * S], copy[16 * S];
  struct device *dev;

  /* Reads: byte 5 of each read's part in this target becomes 'A'. */
  dev = flakey_dev ("0 5 5 corrupt_bio_byte 5 r 65 0");
  CHECK (device_pread (dev, buf, 1000, 10, 0) == 0);
  unit_fill (want, 1000, SEED, 8 * S + 10);
  want[4] = 'A';
  CHECK (memcmp (buf, want, 1000) == 0);
  check_a (0, FILE_SECTORS * S, NULL);            /* only what is read */
  /* Shorter than 5 bytes: untouched. */
  CHECK (device_pread (dev, buf, 4, 0, 0) == 0);
  unit_fill (want, 4, SEED, 8 * S);
  CHECK (memcmp (buf, want, 4) == 0);
  /* Counted per target: a read from sector 62 to 66 is corrupted at
   * byte 5 of the flakey part only (the linear part is not flakey).
   */
  CHECK (device_pread (dev, buf, 4 * S, 62 * S, 0) == 0);
  unit_fill (want, 2 * S, SEED, 70 * S);
  unit_fill (want + 2 * S, 2 * S, SEED, 100 * S);
  want[4] = 'A';
  CHECK (memcmp (buf, want, 4 * S) == 0);
  /* Writes pass unchanged. */
  unit_fill (want, 2 * S, 16, 0);
  CHECK (device_pwrite (dev, want, 2 * S, 0, 0) == 0);
  check_a (8 * S, 2 * S, want);
  device_destroy (dev);

  /* Writes: the data written has byte 1 = 0; the client's buffer is not
   * touched; reads are not corrupted.
   */
  dev = flakey_dev ("0 5 5 corrupt_bio_byte 1 w 0 0");
  unit_fill (want, 3 * S, 17, 0);
  memcpy (copy, want, 3 * S);
  CHECK (device_pwrite (dev, want, 3 * S, S, 0) == 0);
  CHECK (memcmp (want, copy, 3 * S) == 0);
  copy[0] = 0;
  check_a (9 * S, 3 * S, copy);
  CHECK (device_pread (dev, buf, 3 * S, S, 0) == 0);
  CHECK (memcmp (buf, copy, 3 * S) == 0);
  /* FUA writes too, and zero carries no data: plain zeros. */
  unit_fill (want, S, 18, 0);
  memcpy (copy, want, S);
  CHECK (device_pwrite (dev, want, S, 20 * S, MAPPER_FUA) == 0);
  copy[0] = 0;
  check_a (28 * S, S, copy);
  CHECK (device_zero (dev, S, 30 * S, 0) == 0);
  memset (copy, 0, S);
  check_a (38 * S, S, copy);
  device_destroy (dev);

  /* The flags mask: REQ_FUA (1 << 17) only corrupts FUA writes. */
  dev = flakey_dev ("0 5 5 corrupt_bio_byte 2 w 66 131072");
  unit_fill (want, S, 19, 0);
  memcpy (copy, want, S);
  CHECK (device_pwrite (dev, want, S, 0, 0) == 0);
  check_a (8 * S, S, copy);
  CHECK (device_pwrite (dev, want, S, S, MAPPER_FUA) == 0);
  copy[1] = 66;
  check_a (9 * S, S, copy);
  device_destroy (dev);

  /* Byte 700: in the middle, at the very end, or beyond a short write. */
  dev = flakey_dev ("0 5 5 corrupt_bio_byte 700 w 9 0");
  unit_fill (want, 3 * S, 21, 0);
  memcpy (copy, want, 3 * S);
  CHECK (device_pwrite (dev, want, 3 * S, 0, 0) == 0);
  copy[699] = 9;
  check_a (8 * S, 3 * S, copy);
  unit_fill (want, 700, 22, 0);
  memcpy (copy, want, 700);
  CHECK (device_pwrite (dev, want, 700, 10 * S, 0) == 0);
  copy[699] = 9;
  check_a (18 * S, 700, copy);
  unit_fill (want, 699, 23, 0);
  CHECK (device_pwrite (dev, want, 699, 20 * S, 0) == 0);
  check_a (28 * S, 699, want);
  device_destroy (dev);

  /* REQ_OP_WRITE (1) in the mask of a read corruption never matches. */
  dev = flakey_dev ("0 5 5 corrupt_bio_byte 1 r 0 1");
  CHECK (device_pread (dev, buf, S, 0, 0) == 0);
  unit_fill (want, S, SEED, 8 * S);
  CHECK (memcmp (buf, want, S) == 0);
  device_destroy (dev);

  /* corrupt r with drop_writes: reads corrupted, writes dropped. */
  dev = flakey_dev ("0 5 6 drop_writes corrupt_bio_byte 3 r 1 0");
  unit_fill (want, S, 20, 0);
  CHECK (device_pwrite (dev, want, S, 0, 0) == 0);
  check_a (0, FILE_SECTORS * S, NULL);
  CHECK (device_pread (dev, buf, S, 0, 0) == 0);
  unit_fill (want, S, SEED, 8 * S);
  want[2] = 1;
  CHECK (memcmp (buf, want, S) == 0);
  device_destroy (dev);
}

/* Extents over a sparse file: while down, ranges whose reads fail or
 * come back corrupted are data, never the hole the file has; otherwise
 * the file's answer.  Block status itself never fails.
 */
static int
first_extent (void *opaque, uint64_t off, uint64_t len, uint32_t type)
{
  int *t = opaque;

  if (*t == -1)
    *t = type;
  else if ((uint32_t) *t != type)
    *t = -2;                      /* more than one type */
  return 0;
}

static void
test_extents (void)
{
  static const struct { const char *args; int type; } cases[] = {
    { "1 0", 3 },                                   /* always up */
    { "0 1", 0 },                                   /* down: reads fail */
    { "0 5 1 error_reads", 0 },
    { "0 5 2 drop_writes error_reads", 0 },
    { "0 5 1 drop_writes", 3 },
    { "0 5 1 error_writes", 3 },
    { "0 5 5 corrupt_bio_byte 1 r 7 0", 0 },
    { "0 5 5 corrupt_bio_byte 1 w 7 0", 3 },
    /* Only requests with the write bit: reads are never corrupted. */
    { "0 5 5 corrupt_bio_byte 1 r 7 1", 3 },
  };
  unsigned char buf[S];

  for (size_t i = 0; i < ARRAY_SIZE (cases); i++) {
    char name[32];
    struct device *dev;
    int type = -1, r;

    snprintf (name, sizeof name, "fx%zu", i);
    dev = unit_device (name, unit_parse ("0 64 flakey %s 0 %s\n", B,
                                         cases[i].args));
    r = device_extents (dev, 64 * S, 0, 0, first_extent, &type);
    CHECKF (r == 0 && type == cases[i].type,
            "flakey %s: extents r=%d type %d, want %d", cases[i].args, r,
            type, cases[i].type);
    /* What a read says agrees: zeros where a hole is claimed. */
    r = device_pread (dev, buf, S, 5 * S, 0);
    if (cases[i].type == 3)
      CHECKF (r == 0 && unit_is_zero (buf, S), "flakey %s: read r=%d",
              cases[i].args, r);
    else
      CHECKF (r != 0 || !unit_is_zero (buf, S),
              "flakey %s: reads zeros where data is claimed",
              cases[i].args);
    device_destroy (dev);
  }
}

struct reader {
  struct device *dev;
  _Atomic bool stop;
};

static void *
reader_thread (void *arg)
{
  struct reader *rd = arg;
  unsigned char buf[512];

  while (!atomic_load (&rd->stop))
    device_pread (rd->dev, buf, sizeof buf, 0, 0);   /* up or down */
  return NULL;
}

/* The message "intervals" (ours): bad forms refused with the table and
 * the behaviour as they were; good ones change the cycle at once, also
 * while requests run (a reader thread, for ThreadSanitizer); the linear
 * target after it takes no message.
 */
static void
test_message (void)
{
  static const struct { const char *words, *want; } bad[] = {
    { "intervals", "intervals: expected <up_interval> <down_interval>, got "
      "0 arguments" },
    { "intervals 1", "got 1 argument" },
    { "intervals 1 2 3", "got 3 arguments" },
    { "intervals x 1", "intervals: invalid up interval 'x' (seconds, 0 to "
      "4294967295)" },
    { "intervals 1 -1", "intervals: invalid down interval '-1'" },
    { "intervals 0 0", "intervals: total (up + down) interval is zero" },
    { "intervals 4294967295 1", "intervals: interval overflow: up "
      "4294967295 + down 1 seconds exceeds 4294967295" },
    { "up 1 2", "unrecognised message 'up': flakey takes 'intervals "
      "<up_interval> <down_interval>'" },
  };
  struct device *dev = flakey_dev ("3600 0 1 error_reads");
  struct reader rd = { .dev = dev };
  unsigned char buf[S];
  char msg[256];
  pthread_t th;

  atomic_init (&rd.stop, false);
  if (pthread_create (&th, NULL, reader_thread, &rd) != 0)
    UNIT_FATAL ("pthread_create");
  CHECK (device_pread (dev, buf, S, 0, 0) == 0);
  for (int i = 0; i < 100; i++) {
    CHECK (unit_message (dev, 0, "intervals 0 3600", msg, sizeof msg) ==
           MESSAGE_TABLE_CHANGED);
    CHECK (device_pread (dev, buf, S, 0, 0) == -EIO);
    CHECK (unit_message (dev, 63, "intervals 3600 0", msg, sizeof msg) ==
           MESSAGE_TABLE_CHANGED);
    CHECK (device_pread (dev, buf, S, 0, 0) == 0);
  }
  atomic_store (&rd.stop, true);
  pthread_join (th, NULL);

  CHECK (unit_message (dev, 0, "intervals 0 60", msg, sizeof msg) ==
         MESSAGE_TABLE_CHANGED);
  CHECKF (strstr (unit_table_text (dev), " 8 0 60 1 error_reads") != NULL,
          "%s", unit_table_text (dev));
  for (size_t i = 0; i < ARRAY_SIZE (bad); i++) {
    unit_message_refused (dev, 0, bad[i].words, EINVAL, bad[i].want);
    CHECK (device_pread (dev, buf, S, 0, 0) == -EIO);     /* still down */
  }
  unit_message_refused (dev, 64, "intervals 1 1", ENOTSUP,
                        "target 'linear' at sector 64 does not accept "
                        "messages");
  device_destroy (dev);
}

int
main (void)
{
  setup ();
  test_bad_tables ();
  test_format ();
  test_up ();
  test_down_default ();
  test_drop_writes ();
  test_error_writes_reads ();
  test_corrupt ();
  test_extents ();
  test_message ();
  free (A);
  free (B);
  UNIT_EXIT ();
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: table parsing (every bad-table case), table_format round
 * trips, capabilities, backend sharing, the lookup index, device names.
 */
#include <config.h>

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "unit.h"
#include "unit-targets.h"

#define ORIGIN UNIT_ORIGIN
#define FILE_SECTORS 2048                 /* backing files are 1 MiB */
#define SENTINEL UNIT_SENTINEL

static char *A, *B, *A_LINK, *A_HARD, *DIR_PATH, *FIFO, *MISSING, *SMALL;
static char *A_REAL, *B_REAL;

#define expect_fail(text, want, line, p1, p2) \
  unit_expect_fail_at (__LINE__, text, want, line, NULL, p1, p2)
#define parse_ok(text) unit_parse ("%s", text)

/* UNIT_FAIL without a target name in the prefix. */
#define FAIL_FMT(want, line, p1, p2, ...) \
  UNIT_FAIL (want, line, NULL, p1, p2, __VA_ARGS__)

static void
setup (void)
{
  char *buf = malloc (FILE_SECTORS * 512);

  unit_tmpdir ();
  A = strdup (unit_path ("a"));
  B = strdup (unit_path ("b"));
  A_LINK = strdup (unit_path ("a-link"));
  A_HARD = strdup (unit_path ("a-hard"));
  DIR_PATH = strdup (unit_path ("dir"));
  FIFO = strdup (unit_path ("fifo"));
  MISSING = strdup (unit_path ("missing"));
  SMALL = strdup (unit_path ("small"));
  unit_fill (buf, FILE_SECTORS * 512, 1, 0);
  unit_write_file (A, buf, FILE_SECTORS * 512);
  unit_write_file (B, NULL, FILE_SECTORS * 512);
  unit_write_file (SMALL, buf, 1000);             /* not a sector multiple */
  free (buf);
  if (symlink (A, A_LINK) == -1 || link (A, A_HARD) == -1 ||
      mkdir (DIR_PATH, 0755) == -1 || mkfifo (FIFO, 0644) == -1)
    UNIT_FATAL ("setup: %s", strerror (errno));
  A_REAL = realpath (A, NULL);
  B_REAL = realpath (B, NULL);
  if (!A_REAL || !B_REAL)
    UNIT_FATAL ("realpath: %s", strerror (errno));
}

static void
teardown (void)
{
  free (A); free (B); free (A_LINK); free (A_HARD); free (DIR_PATH);
  free (FIFO); free (MISSING); free (SMALL); free (A_REAL); free (B_REAL);
}

/* --- bad tables ---------------------------------------------------------- */

static void
test_structure_errors (void)
{
  /* Empty: no targets at all; the message has no line number. */
  expect_fail ("", EINVAL, 0, "empty", NULL);
  expect_fail ("\n\n\n", EINVAL, 0, "empty", NULL);
  expect_fail ("# only a comment\n   \n\t# another\r\n\n", EINVAL, 0,
               "empty", NULL);

  /* Too few words. */
  expect_fail ("0 8\n", EINVAL, 1, "expected <start> <length> <target>",
               "got 2 words");
  expect_fail ("0 8 zero\n8\n", EINVAL, 2, "got 1 word", NULL);

  /* First target not at 0. */
  expect_fail ("8 8 zero\n", EINVAL, 1, "first target must start at sector 0",
               "not 8");
  expect_fail ("# comment\n\n1 8 zero\n", EINVAL, 3, "first target", NULL);

  /* Gap, overlap (line numbers count comments and blank lines). */
  expect_fail ("0 8 zero\n9 8 zero\n", EINVAL, 2, "gap", "ends at sector 8");
  expect_fail ("0 8 zero\n# c\n\n8 8 zero\n17 1 zero\n", EINVAL, 5, "gap",
               "sector 17");
  expect_fail ("0 8 zero\n7 8 zero\n", EINVAL, 2, "overlaps",
               "ends at sector 8");
  expect_fail ("0 8 zero\n0 8 zero\n", EINVAL, 2, "overlaps", NULL);
  expect_fail ("0 8 zero\n8 8 zero\n4 4 zero\n", EINVAL, 3, "overlaps",
               "ends at sector 16");

  /* Unknown target. */
  expect_fail ("0 8 zero\n8 8 snapshot a b\n", EINVAL, 2,
               "unknown target type 'snapshot'", NULL);
  expect_fail ("0 8 Linear x 0\n", EINVAL, 1, "unknown target type", NULL);

  /* Length 0. */
  expect_fail ("0 0 zero\n", EINVAL, 1, "length is 0", NULL);
  expect_fail ("0 8 zero\n8 0 zero\n", EINVAL, 2, "length is 0", NULL);
}

static void
test_argument_counts (void)
{
  FAIL_FMT (EINVAL, 1, "linear: ", "expected 2 arguments", "0 8 linear %s\n",
            A);
  FAIL_FMT (EINVAL, 1, "linear: ", "got 3", "0 8 linear %s 0 0\n", A);
  expect_fail ("0 8 linear\n", EINVAL, 1, "linear: ", "got 0");
  expect_fail ("0 8 zero\n8 8 zero 1\n", EINVAL, 2, "zero: ",
               "takes no arguments");
  expect_fail ("0 8 error x\n", EINVAL, 1, "error: ", "takes no arguments");
  /* striped: too few / too many. */
  expect_fail ("0 8 striped\n", EINVAL, 1, "striped: ", "got 0 arguments");
  expect_fail ("0 8 striped 2\n", EINVAL, 1, "striped: ", "got 1 argument");
  FAIL_FMT (EINVAL, 1, "striped: ", "2 stripes need 6 arguments, got 4",
            "0 8 striped 2 4 %s 0\n", A);
  FAIL_FMT (EINVAL, 1, "striped: ", "2 stripes need 6 arguments, got 5",
            "0 8 striped 2 4 %s 0 %s\n", A, B);
  FAIL_FMT (EINVAL, 1, "striped: ", "2 stripes need 6 arguments, got 7",
            "0 8 striped 2 4 %s 0 %s 0 %s\n", A, B, A);
  FAIL_FMT (EINVAL, 1, "striped: ", "1 stripes need 4 arguments, got 6",
            "0 8 striped 1 4 %s 0 %s 0\n", A, B);
}

static void
test_numbers (void)
{
  static const struct { const char *s, *phrase; } bad[] = {
    { "-1", "is not a non-negative integer" },
    { "abc", "is not a non-negative integer" },
    { "10x", "is not a non-negative integer" },
    { "+8", "is not a non-negative integer" },
    { "0x10", "is not a non-negative integer" },
    { "1.5", "is not a non-negative integer" },
    { "18446744073709551616", "overflows" },
    { "99999999999999999999999", "overflows" },
    { "18446744073709551615", "overflows" },   /* fits u64; not in bytes */
  };

  for (size_t i = 0; i < ARRAY_SIZE (bad); i++) {
    const char *s = bad[i].s, *p = bad[i].phrase;
    char want[128];

    /* start (on line 2: a bad number must be reported as such, not as
     * a gap or a wrong first target)
     */
    snprintf (want, sizeof want, "start '%s'", s);
    FAIL_FMT (EINVAL, 2, want, p, "0 8 zero\n%s 8 zero\n", s);
    FAIL_FMT (EINVAL, 1, want, p, "%s 8 zero\n", s);
    /* length */
    snprintf (want, sizeof want, "length '%s'", s);
    FAIL_FMT (EINVAL, 1, want, p, "0 %s zero\n", s);
    FAIL_FMT (EINVAL, 3, want, p, "0 8 zero\n\n8 %s error\n", s);
    /* linear offset */
    snprintf (want, sizeof want, "offset '%s'", s);
    FAIL_FMT (EINVAL, 1, want, p, "0 8 linear %s %s\n", A, s);
    /* striped stripe offset */
    snprintf (want, sizeof want, "stripe 1: offset '%s'", s);
    FAIL_FMT (EINVAL, 1, want, p, "0 8 striped 2 4 %s 0 %s %s\n", A, B, s);
    /* striped #stripes and chunk size */
    snprintf (want, sizeof want, "invalid number of stripes '%s'", s);
    FAIL_FMT (EINVAL, 1, want, NULL, "0 8 striped %s 4 %s 0\n", s, A);
    snprintf (want, sizeof want, "invalid chunk size '%s'", s);
    FAIL_FMT (EINVAL, 1, want, NULL, "0 8 striped 1 %s %s 0\n", s, A);
  }

  /* Largest accepted sector count: INT64_MAX >> 9. */
  {
    struct table *t = parse_ok ("0 18014398509481983 zero\n");
    if (t) {
      CHECK (table_caps (t)->size == 18014398509481983ULL * 512);
      table_free (t);
    }
    expect_fail ("0 18014398509481984 zero\n", EINVAL, 1,
                 "length '18014398509481984'", NULL);
  }

  /* Past it, even within 64 bits (2^63 - 1 sectors): the message says
   * what the limit is.
   */
  {
    static const char *const big[] = {
      "18014398509481984", "9223372036854775807", "18446744073709551615",
      "18446744073709551616",
    };
    const char *limit = "overflows the largest NBD size: at most "
      "18014398509481983 sectors";
    char want[128];

    for (size_t i = 0; i < ARRAY_SIZE (big); i++) {
      snprintf (want, sizeof want, "length '%s'", big[i]);
      FAIL_FMT (EINVAL, 1, want, limit, "0 %s zero\n", big[i]);
      snprintf (want, sizeof want, "start '%s'", big[i]);
      FAIL_FMT (EINVAL, 2, want, limit, "0 8 zero\n%s 8 zero\n", big[i]);
      snprintf (want, sizeof want, "offset '%s'", big[i]);
      FAIL_FMT (EINVAL, 1, want, limit, "0 8 linear %s %s\n", A, big[i]);
    }
    expect_fail ("0 18014398509481983 zero\n18014398509481983 1 zero\n",
                 EINVAL, 2, "start 18014398509481983 + length 1 overflows "
                 "the maximum device size", "a device ends at sector "
                 "18014398509481983 at most");
  }

  /* start + length beyond the largest device size. */
  expect_fail ("0 18014398509481983 zero\n18014398509481983 1 zero\n",
               EINVAL, 2, "overflows the maximum device size", NULL);
  expect_fail ("0 9007199254740992 zero\n"
               "9007199254740992 9007199254740992 error\n",
               EINVAL, 2, "overflows the maximum device size", NULL);
  /* Overflow is reported before "first target must start at 0". */
  expect_fail ("18014398509481983 18014398509481983 zero\n",
               EINVAL, 1, "overflows the maximum device size", NULL);

  /* Striped sizes that do not fit 32 bits. */
  FAIL_FMT (EINVAL, 1, "invalid chunk size '4294967296'", NULL,
            "0 8 striped 1 4294967296 %s 0\n", A);
  FAIL_FMT (EINVAL, 1, "invalid number of stripes '4294967296'", NULL,
            "0 8 striped 4294967296 4 %s 0\n", A);
}

static void
test_backend_errors (void)
{
  /* Missing backend: the path is in the message. */
  FAIL_FMT (ENOENT, 1, MISSING, "No such file", "0 8 linear %s 0\n",
            MISSING);
  FAIL_FMT (ENOENT, 2, MISSING, "linear: ",
            "0 8 linear %s 0\n8 8 linear %s 0\n", A, MISSING);
  FAIL_FMT (ENOENT, 1, MISSING, "striped: ",
            "0 16 striped 2 4 %s 0 %s 0\n", A, MISSING);
  /* Missing parent directory. */
  {
    char *p = unit_sprintf ("%s/nodir/x", unit_tmpdir ());
    FAIL_FMT (ENOENT, 1, p, NULL, "0 8 linear %s 0\n", p);
    free (p);
  }

  /* Not a regular file or block device: a FIFO. */
  FAIL_FMT (EINVAL, 1, FIFO, "not a regular file or block device",
            "0 8 linear %s 0\n", FIFO);
  /* A directory: refused, naming the path (open(O_RDWR) fails with
   * EISDIR before the file type is checked, so accept either).
   */
  {
    char *s = unit_sprintf ("0 8 linear %s 0\n", DIR_PATH);
    struct table *t = SENTINEL;
    struct mapper_err err = { "" };
    int fds = unit_count_fds ();
    int r = table_parse (s, ORIGIN, &t, &err);

    CHECKF (r == -EISDIR || r == -EINVAL, "r=%d", r);
    CHECK (t == SENTINEL);
    CHECKF (strncmp (err.msg, ORIGIN ":1: ", strlen (ORIGIN ":1: ")) == 0,
            "%s", err.msg);
    CHECKF (strstr (err.msg, DIR_PATH) != NULL, "%s", err.msg);
    CHECKF (strstr (err.msg, "not a regular file or block device") ||
            strstr (err.msg, "Is a directory"), "%s", err.msg);
    CHECK (unit_count_fds () == fds);
    free (s);
  }
  /* Empty path cannot be written in a table (it would not be a word). */

  /* Unreadable backend: only meaningful when not root. */
  if (geteuid () != 0) {
    char *p = strdup (unit_path ("unreadable"));
    unit_write_file (p, NULL, 4096);
    chmod (p, 0);
    FAIL_FMT (EACCES, 1, p, "Permission denied", "0 8 linear %s 0\n", p);
    chmod (p, 0644);
    free (p);
  }

  /* Area beyond the backend's end. */
  FAIL_FMT (EINVAL, 1, A, "beyond the end of the device",
            "0 2049 linear %s 0\n", A);
  FAIL_FMT (EINVAL, 1, "beyond the end", "2048 sectors",
            "0 8 linear %s 2041\n", A);
  FAIL_FMT (EINVAL, 1, "beyond the end", NULL,
            "0 8 linear %s 18014398509481983\n", A);
  /* A 1000-byte file holds one whole sector only. */
  FAIL_FMT (EINVAL, 1, "beyond the end", NULL, "0 2 linear %s 0\n", SMALL);
  FAIL_FMT (EINVAL, 2, "beyond the end", NULL,
            "0 8 linear %s 0\n8 1 linear %s 1\n", A, SMALL);
  /* Striped: each stripe gets length/#stripes. */
  FAIL_FMT (EINVAL, 1, B, "beyond the end",
            "0 16 striped 2 4 %s 0 %s 2041\n", A, B);
  FAIL_FMT (EINVAL, 1, "beyond the end", NULL,
            "0 4098 striped 1 2 %s 0\n", A);

  /* The edge itself is fine. */
  {
    char *s = unit_sprintf ("0 8 linear %s 2040\n8 1 linear %s 0\n", A, SMALL);
    struct table *t = parse_ok (s);
    if (t) {
      CHECK (table_caps (t)->size == 9 * 512);
      CHECK (table_nr_backends (t) == 2);
      table_free (t);
    }
    free (s);
  }
}

static void
test_striped_errors (void)
{
  FAIL_FMT (EINVAL, 1, "striped: ", "invalid number of stripes '0'",
            "0 8 striped 0 4\n");
  FAIL_FMT (EINVAL, 1, "striped: ", "invalid chunk size '0'",
            "0 8 striped 1 0 %s 0\n", A);
  FAIL_FMT (EINVAL, 1, "striped: ", "not divisible by 2 stripes",
            "0 9 striped 2 1 %s 0 %s 0\n", A, B);
  FAIL_FMT (EINVAL, 2, "striped: ", "not divisible by 3 stripes",
            "0 8 zero\n8 10 striped 3 1 %s 0 %s 0 %s 100\n", A, B, A);
  FAIL_FMT (EINVAL, 1, "striped: ", "stripe length 6 not divisible by chunk",
            "0 12 striped 2 4 %s 0 %s 0\n", A, B);
  FAIL_FMT (EINVAL, 1, "striped: ", "not divisible by chunk size 3",
            "0 8 striped 1 3 %s 0\n", A);
}

/* A bad table sharing a backend with a live table must not close it. */
static void
test_failure_keeps_shared_backends (void)
{
  int fds0 = unit_count_fds ();
  char *good = unit_sprintf ("0 8 linear %s 0\n", A);
  struct table *t = parse_ok (good);
  int fds1 = unit_count_fds ();

  CHECK (fds1 == fds0 + 1);
  FAIL_FMT (EINVAL, 2, "beyond the end", NULL,
            "0 8 linear %s 0\n8 8 linear %s 2045\n", A, A);
  FAIL_FMT (EINVAL, 1, "beyond the end", NULL,
            "0 16 striped 2 4 %s 0 %s 2045\n", A, B);
  FAIL_FMT (EINVAL, 3, "unknown target", NULL,
            "0 8 linear %s 0\n8 8 linear %s 0\n16 8 nosuch\n", A, B);
  CHECK (unit_count_fds () == fds1);
  if (t) {
    /* Still usable: a second table shares the same backend. */
    struct table *t2 = parse_ok (good);
    CHECK (unit_count_fds () == fds1);
    table_free (t2);
    CHECK (unit_count_fds () == fds1);
    table_free (t);
  }
  CHECK (unit_count_fds () == fds0);
  free (good);
}

static void
test_parse_file (void)
{
  struct table *t = SENTINEL;
  struct mapper_err err = { "" };
  const char *p = unit_path ("table.txt");
  char *prefix;
  int r;

  r = table_parse_file (unit_path ("no-such-table"), &t, &err);
  CHECK (r == -ENOENT);
  CHECK (t == SENTINEL);
  CHECKF (strstr (err.msg, "no-such-table") != NULL, "%s", err.msg);

  unit_write_file (p, "0 8 zero\n\n8 8 bogus\n", 20);
  r = table_parse_file (p, &t, &err);
  CHECK (r == -EINVAL);
  CHECK (t == SENTINEL);
  prefix = unit_sprintf ("%s:3: ", p);
  CHECKF (strncmp (err.msg, prefix, strlen (prefix)) == 0, "%s", err.msg);
  free (prefix);

  unit_write_file (p, "0 8 zero\n\0\n", 11);
  r = table_parse_file (p, &t, &err);
  CHECK (r == -EINVAL);
  CHECK (t == SENTINEL);
  CHECKF (strstr (err.msg, "NUL") != NULL, "%s", err.msg);

  unit_write_file (p, "0 8 zero\n8 8 error", 18);    /* no final newline */
  r = table_parse_file (p, &t, &err);
  CHECK (r == 0);
  if (r == 0) {
    CHECK (table_nr_targets (t) == 2);
    CHECK (table_caps (t)->size == 16 * 512);
    table_free (t);
  }
}

/* --- good tables --------------------------------------------------------- */

/* table_format into exactly-sized and short buffers: snprintf semantics. */
static void
check_format_truncation (const struct table *t, const char *full)
{
  size_t need = strlen (full);
  char *buf = malloc (need + 16);

  for (size_t len = 0; len <= need + 2; len++) {
    size_t n;
    memset (buf, '@', need + 16);
    n = table_format (t, len ? buf : NULL, len);
    CHECKF (n == need, "len %zu: returned %zu, want %zu", len, n, need);
    CHECKF (unit_first_diff (buf + len, "@@@@@@@@@@@@@@", 14) == -1,
            "len %zu: wrote beyond the buffer", len);
    if (len > 0) {
      size_t got = strnlen (buf, len);
      CHECKF (got == MIN (need, len - 1), "len %zu: not NUL-terminated at "
              "%zu (strnlen %zu)", len, MIN (need, len - 1), got);
      CHECKF (strncmp (buf, full, MIN (need, len - 1)) == 0,
              "len %zu: '%.*s' not a prefix of the table", len,
              (int) MIN (need, len - 1), buf);
    }
  }
  free (buf);
}

static char *
format_alloc (const struct table *t)
{
  size_t need = table_format (t, NULL, 0);
  char *buf = malloc (need + 1);
  CHECK (table_format (t, buf, need + 1) == need);
  return buf;
}

static void
test_good_tables (void)
{
  char *text, *want, *f1, *f2;
  struct table *t, *t2;

  /* Comments, blank lines, CRLF, tabs, trailing comments, no final
   * newline.
   */
  text = unit_sprintf ("# a comment\n"
                       "\n"
                       "   \t \r\n"
                       "0 8 linear %s 0   # trailing comment\r\n"
                       "\t8\t8\tzero\t#another\r\n"
                       "  # indented comment\n"
                       "16 4 error\r\n"
                       "20 16 striped 2 4 %s 8 %s 16 #x\n"
                       "36 2 linear %s 2046", A, A_LINK, B, B);
  t = parse_ok (text);
  if (t) {
    const struct mapper_caps *c = table_caps (t);
    CHECK (c->size == 38 * 512);
    CHECK (c->can_write && c->can_flush && c->can_trim && c->can_zero);
    CHECK (c->block_min == 1);
    CHECK (table_nr_targets (t) == 5);
    CHECK (table_nr_backends (t) == 2);
    want = unit_sprintf ("0 8 linear %s 0\n8 8 zero\n16 4 error\n"
                         "20 16 striped 2 4 %s 8 %s 16\n36 2 linear %s 2046\n",
                         A_REAL, A_REAL, B_REAL, B_REAL);
    f1 = format_alloc (t);
    CHECKF (strcmp (f1, want) == 0, "got:\n%s\nwant:\n%s", f1, want);
    check_format_truncation (t, f1);
    /* Round trip. */
    t2 = parse_ok (f1);
    if (t2) {
      f2 = format_alloc (t2);
      CHECKF (strcmp (f1, f2) == 0, "round trip:\n%s\nvs\n%s", f1, f2);
      CHECK (table_caps (t2)->size == c->size);
      CHECK (table_nr_targets (t2) == 5);
      CHECK (table_nr_backends (t2) == 2);
      free (f2);
      table_free (t2);
    }
    {
      char sum[256];
      size_t n = table_summary (t, sum, sizeof sum);
      CHECK (n == strlen (sum));
      CHECKF (strstr (sum, "linear") && strstr (sum, "striped") &&
              strstr (sum, "zero") && strstr (sum, "error"), "%s", sum);
    }
    free (want);
    free (f1);
    table_free (t);
  }
  free (text);

  /* A single-target table with nothing but zero. */
  t = parse_ok ("0 1 zero");
  if (t) {
    f1 = format_alloc (t);
    CHECK (strcmp (f1, "0 1 zero\n") == 0);
    check_format_truncation (t, f1);
    CHECK (table_caps (t)->size == 512);
    CHECK (table_nr_backends (t) == 0);
    free (f1);
    table_free (t);
  }

  /* Many stripes: round trip and truncation. */
  {
    char *s = unit_sprintf ("0 64 striped 8 8 %s 0 %s 8 %s 16 %s 24 %s 0 "
                            "%s 8 %s 16 %s 24\n", A, A, A, A, B, B, B, B);
    t = parse_ok (s);
    if (t) {
      CHECK (table_nr_backends (t) == 2);
      f1 = format_alloc (t);
      check_format_truncation (t, f1);
      t2 = parse_ok (f1);
      if (t2) {
        f2 = format_alloc (t2);
        CHECK (strcmp (f1, f2) == 0);
        free (f2);
        table_free (t2);
      }
      free (f1);
      table_free (t);
    }
    free (s);
  }
}

static void
test_distinct_backends (void)
{
  int fds0 = unit_count_fds ();
  char *s;
  struct table *t;

  /* 1024 linear targets over one file: one backend, one descriptor. */
  {
    size_t cap = 1024 * 200, used = 0;
    char *big = malloc (cap);
    for (int i = 0; i < 1024; i++)
      used += snprintf (big + used, cap - used, "%d 2 linear %s %d\n",
                        2 * i, A, 2 * (1023 - i));
    t = parse_ok (big);
    if (t) {
      CHECK (table_nr_targets (t) == 1024);
      CHECK (table_nr_backends (t) == 1);
      CHECK (table_caps (t)->size == 2048 * 512);
      CHECK (unit_count_fds () == fds0 + 1);
      table_free (t);
    }
    free (big);
  }

  /* The same file through a symlink and a non-canonical path. */
  s = unit_sprintf ("0 8 linear %s 0\n8 8 linear %s 8\n"
                    "16 8 linear %s/../%s/a 16\n",
                    A, A_LINK, unit_tmpdir (), strrchr (unit_tmpdir (), '/') + 1);
  t = parse_ok (s);
  if (t) {
    CHECK (table_nr_backends (t) == 1);
    CHECK (unit_count_fds () == fds0 + 1);
    table_free (t);
  }
  free (s);

  /* Two files; striped naming the same file in two stripes. */
  s = unit_sprintf ("0 8 linear %s 0\n8 24 striped 3 4 %s 0 %s 4 %s 8\n",
                    A, B, A_LINK, B);
  t = parse_ok (s);
  if (t) {
    CHECK (table_nr_backends (t) == 2);
    CHECK (unit_count_fds () == fds0 + 2);
    table_free (t);
  }
  free (s);

  /* Two tables naming the same file share the one open backend. */
  {
    char *s1 = unit_sprintf ("0 8 linear %s 0\n", A);
    char *s2 = unit_sprintf ("0 8 linear %s 8\n", A_LINK);
    struct table *t1 = parse_ok (s1), *t2 = parse_ok (s2);
    CHECK (unit_count_fds () == fds0 + 1);
    table_free (t1);
    CHECK (unit_count_fds () == fds0 + 1);
    table_free (t2);
    CHECK (unit_count_fds () == fds0);
    free (s1);
    free (s2);
  }

  /* The same file through a hard link is still the same file (dm
   * identifies backing devices by device number, not by path).
   */
  s = unit_sprintf ("0 8 linear %s 0\n8 8 linear %s 8\n", A, A_HARD);
  t = parse_ok (s);
  if (t) {
    CHECKF (table_nr_backends (t) == 1,
            "hard link counted as a distinct backend: %zu backends",
            table_nr_backends (t));
    table_free (t);
  }
  free (s);

  CHECK (unit_count_fds () == fds0);
}

/* --- lookup ------------------------------------------------------------- */

static uint64_t lookup_seed = 0x2545f4914f6cdd1dULL;

static uint64_t
lookup_rand (void)
{
  lookup_seed ^= lookup_seed << 13;
  lookup_seed ^= lookup_seed >> 7;
  lookup_seed ^= lookup_seed << 17;
  return lookup_seed;
}

/* The reference: the first target whose end is beyond off, by a plain
 * scan of the targets themselves (neither ends nor the index).
 */
static size_t
scan_find (const struct table *t, uint64_t off)
{
  size_t i = 0;

  while (off >= t->targets[i].begin + t->targets[i].len)
    i++;
  return i;
}

/* n zero targets of random lengths: mostly a few sectors, some long, a
 * few huge, so that nodes hold every mix.
 */
static struct table *
random_table (size_t n)
{
  char *text = malloc (n * 64 + 1), *p = text;
  uint64_t start = 0;
  struct table *t;

  if (text == NULL)
    UNIT_FATAL ("out of memory");
  for (size_t i = 0; i < n; i++) {
    unsigned kind = lookup_rand () % 100;
    uint64_t len = 1 + lookup_rand () % (kind < 60 ? 8 : kind < 90 ? 1000 :
                                         kind < 99 ? 1 << 20 : 1ULL << 31);

    p += sprintf (p, "%" PRIu64 " %" PRIu64 " zero\n", start, len);
    start += len;
  }
  t = parse_ok (text);
  free (text);
  return t;
}

/* table_find_target must give the same answer as a scan, for every
 * target boundary and the offsets either side of it, and for random
 * offsets, on tables whose sizes straddle the index's node and level
 * sizes (8 keys, 9 children: 8, 72, 648, 5832 targets fill 1-4 levels).
 */
static void
test_lookup (void)
{
  static const size_t sizes[] = {
    1, 2, 7, 8, 9, 63, 64, 65, 71, 72, 73, 511, 647, 648, 649, 4096,
    5831, 5832, 5833, 100000,
  };

  for (size_t s = 0; s < ARRAY_SIZE (sizes); s++) {
    size_t n = sizes[s];
    size_t nr_random = n <= 1000 ? 20000 : n <= 5833 ? 2000 : 1000;

    for (int rep = 0; rep < (n <= 5833 ? 3 : 1); rep++) {
      struct table *t = random_table (n);
      unsigned bad = 0;
      uint64_t size;

      if (t == NULL)
        continue;
      size = t->caps.size;
      CHECK_EQ (table_nr_targets (t), n);
      /* Small tables have no index and keep ends unpadded; the index's
       * nodes are whole cache lines.
       */
      if (n <= TABLE_INDEX_KEYS)
        CHECK (t->depth == 0 && t->levels == NULL);
      else {
        CHECK (t->depth >= 1);
        CHECK ((uintptr_t) t->ends % 64 == 0);
        for (unsigned l = 0; l < t->depth; l++)
          CHECK ((uintptr_t) t->levels[l] % 64 == 0);
      }

#define EXPECT(off, want) do { \
  uint64_t _off = (off); size_t _want = (want); \
  size_t _got = table_find_target (t, _off); \
  if (_got != _want && bad++ < 5) { \
    fprintf (stderr, "test-unit-table.c:%d: %zu targets: offset %" PRIu64 \
             ": table_find_target %zu, expected %zu\n", __LINE__, n, _off, \
             _got, _want); \
    unit_failures++; } } while (0)
      for (size_t i = 0; i < n; i++) {
        uint64_t b = t->targets[i].begin, e = b + t->targets[i].len;

        /* Contiguous targets: the scan's answer in [b, e) is i. */
        CHECK_EQ (b, i ? t->targets[i - 1].begin + t->targets[i - 1].len
                  : 0);
        if (n <= 1000) {
          CHECK_EQ (scan_find (t, b), i);
          CHECK_EQ (scan_find (t, e - 1), i);
        }
        if (i > 0)
          EXPECT (b - 1, i - 1);
        EXPECT (b, i);
        EXPECT (b + 1, i);
        EXPECT (e - 1, i);
        if (i + 1 < n)
          EXPECT (e, i + 1);
      }
      for (size_t j = 0; j < nr_random; j++) {
        uint64_t off = lookup_rand () % size;
        EXPECT (off, scan_find (t, off));
      }
#undef EXPECT
      table_free (t);
    }
  }
}

/* Targets are one aligned cache line each, a small private struct
 * (linear's) inside it; a bigger one is allocated.
 */
static void
test_target_layout (void)
{
  char *s = unit_sprintf ("0 8 linear %s 0\n8 8 zero\n16 8 linear %s 8\n",
                          A, B);
  struct table *t = parse_ok (s);
  struct target ti = { 0 };
  void *p;

  free (s);
  if (t) {
    CHECK ((uintptr_t) t->targets % 64 == 0);
    CHECK (t->targets[0].private == t->targets[0].private_inline);
    CHECK (t->targets[2].private == t->targets[2].private_inline);
    table_free (t);
  }
  p = target_private_alloc (&ti, TARGET_PRIVATE_INLINE);
  CHECK (p == ti.private_inline);
  target_private_free (&ti, p);
  p = target_private_alloc (&ti, TARGET_PRIVATE_INLINE + 1);
  CHECK (p != NULL && p != ti.private_inline);
  CHECK (unit_is_zero (p, TARGET_PRIVATE_INLINE + 1));
  target_private_free (&ti, p);
}

/* --- device names and the registry -------------------------------------- */

static void
expect_bad_name (int srcline, const char *name, int want, const char *phrase)
{
  struct mapper_err err = { "" };
  struct device *dev = (struct device *) (uintptr_t) 0x5e57;
  size_t n = device_count ();
  int r = device_check_name (name, &err);

  if (r != -want || (phrase && strstr (err.msg, phrase) == NULL)) {
    fprintf (stderr, "test-unit-table.c:%d: device_check_name: r=%d "
             "msg: %s\n", srcline, r, err.msg);
    unit_failures++;
  }
  r = device_create (name, &dev, &err);
  if (r != -want || dev != (struct device *) (uintptr_t) 0x5e57 ||
      device_count () != n) {
    fprintf (stderr, "test-unit-table.c:%d: device_create accepted a bad "
             "name: r=%d\n", srcline, r);
    unit_failures++;
    if (r == 0)
      device_destroy (dev);
  }
}

static void
test_device_names (void)
{
  struct mapper_err err = { "" };
  char name[256];
  struct device *d1 = NULL, *d2 = NULL, *d3 = NULL;
  int r;

  CHECK (device_check_name ("good", &err) == 0);
  CHECK (device_check_name ("a.b-c_d:e@f+g~h", &err) == 0);
  CHECK (device_check_name ("with space", &err) == 0);
  CHECK (device_check_name ("...", &err) == 0);
  CHECK (device_check_name ("controlx", &err) == 0);
  CHECK (device_check_name ("Control", &err) == 0);
  CHECK (device_check_name ("\xc3\xa9t\xc3\xa9", &err) == 0);   /* UTF-8 */

  expect_bad_name (__LINE__, "", EINVAL, "empty");
  expect_bad_name (__LINE__, "a/b", EINVAL, "'/'");
  expect_bad_name (__LINE__, "/", EINVAL, "'/'");
  expect_bad_name (__LINE__, "ab/", EINVAL, "'/'");
  expect_bad_name (__LINE__, "a\nb", EINVAL, "control character 0x0a");
  expect_bad_name (__LINE__, "\tab", EINVAL, "control character 0x09");
  expect_bad_name (__LINE__, "ab\x1f", EINVAL, "control character 0x1f");
  expect_bad_name (__LINE__, "ab\x7f", EINVAL, "control character 0x7f");
  /* UTF-8: every length of sequence, up to U+10FFFF. */
  CHECK (device_check_name ("\xc2\xa0\xe2\x82\xac\xf0\x9f\x98\x80", &err)
         == 0);                 /* U+00A0 U+20AC U+1F600 */
  CHECK (device_check_name ("\xed\x9f\xbf\xee\x80\x80", &err) == 0);
  CHECK (device_check_name ("\xf4\x8f\xbf\xbf", &err) == 0);  /* U+10FFFF */
  /* C1 controls (U+0080..U+009F), written as UTF-8. */
  expect_bad_name (__LINE__, "a\xc2\x80", EINVAL, "U+0080 at byte 1");
  expect_bad_name (__LINE__, "ab\xc2\x85", EINVAL, "U+0085 at byte 2");
  expect_bad_name (__LINE__, "\xc2\x9f", EINVAL, "U+009F at byte 0");
  /* Not UTF-8: lone and stray bytes, truncated sequences, overlongs,
   * surrogates, beyond U+10FFFF.
   */
  expect_bad_name (__LINE__, "a\xff" "b", EINVAL, "not valid UTF-8 at byte 1");
  expect_bad_name (__LINE__, "a\xfe", EINVAL, "not valid UTF-8");
  expect_bad_name (__LINE__, "\x80", EINVAL, "not valid UTF-8 at byte 0");
  expect_bad_name (__LINE__, "ab\xbf", EINVAL, "at byte 2 (0xbf)");
  expect_bad_name (__LINE__, "\xc3", EINVAL, "not valid UTF-8");
  expect_bad_name (__LINE__, "\xc3x", EINVAL, "not valid UTF-8");
  expect_bad_name (__LINE__, "\xe2\x82", EINVAL, "not valid UTF-8");
  expect_bad_name (__LINE__, "\xf0\x9f\x98", EINVAL, "not valid UTF-8");
  expect_bad_name (__LINE__, "\xc0\xaf", EINVAL, "not valid UTF-8");   /* '/' */
  expect_bad_name (__LINE__, "\xc1\xbf", EINVAL, "not valid UTF-8");
  expect_bad_name (__LINE__, "\xc0\x80", EINVAL, "not valid UTF-8");   /* NUL */
  expect_bad_name (__LINE__, "\xe0\x80\xaf", EINVAL, "not valid UTF-8");
  expect_bad_name (__LINE__, "\xe0\x9f\xbf", EINVAL, "not valid UTF-8");
  expect_bad_name (__LINE__, "\xf0\x8f\xbf\xbf", EINVAL, "not valid UTF-8");
  expect_bad_name (__LINE__, "\xed\xa0\x80", EINVAL, "not valid UTF-8");
  expect_bad_name (__LINE__, "\xed\xbf\xbf", EINVAL, "not valid UTF-8");
  expect_bad_name (__LINE__, "\xf4\x90\x80\x80", EINVAL, "not valid UTF-8");
  expect_bad_name (__LINE__, "\xf5\x80\x80\x80", EINVAL, "not valid UTF-8");
  expect_bad_name (__LINE__, "\xf8\x88\x80\x80\x80", EINVAL,
                   "not valid UTF-8");
  expect_bad_name (__LINE__, "control", EINVAL, "reserved");
  expect_bad_name (__LINE__, ".", EINVAL, NULL);
  expect_bad_name (__LINE__, "..", EINVAL, NULL);

  /* Length: 127 bytes is the maximum. */
  memset (name, 'n', sizeof name);
  name[127] = '\0';
  CHECK (device_check_name (name, &err) == 0);
  r = device_create (name, &d1, &err);
  CHECK (r == 0);
  if (r == 0) {
    CHECK (device_lookup (name) == d1);
    CHECK (strcmp (device_name (d1), name) == 0);
    device_destroy (d1);
    CHECK (device_lookup (name) == NULL);
  }
  name[127] = 'n';
  name[128] = '\0';
  expect_bad_name (__LINE__, name, ENAMETOOLONG, "127");
  name[200] = '\0';
  expect_bad_name (__LINE__, name, ENAMETOOLONG, NULL);

  /* Registry: create, duplicate, lookup, order, destroy, re-create. */
  CHECK (device_count () == 0);
  CHECK (device_create ("dev1", &d1, &err) == 0);
  CHECK (device_create ("dev2", &d2, &err) == 0);
  d3 = (struct device *) (uintptr_t) 0x5e57;
  r = device_create ("dev1", &d3, &err);
  CHECK (r == -EEXIST);
  CHECK (d3 == (struct device *) (uintptr_t) 0x5e57);
  CHECKF (strstr (err.msg, "dev1") && strstr (err.msg, "exists"), "%s",
          err.msg);
  CHECK (device_count () == 2);
  CHECK (device_nth (0) == d1);
  CHECK (device_nth (1) == d2);
  CHECK (device_nth (2) == NULL);
  CHECK (device_lookup ("dev1") == d1);
  CHECK (device_lookup ("dev2") == d2);
  CHECK (device_lookup ("dev") == NULL);
  CHECK (device_lookup ("dev11") == NULL);
  {
    struct mapper_caps caps;
    CHECK (!device_get_caps (d1, &caps));     /* no table yet */
  }
  device_destroy (d1);
  CHECK (device_count () == 1);
  CHECK (device_nth (0) == d2);
  CHECK (device_lookup ("dev1") == NULL);
  CHECK (device_create ("dev1", &d1, &err) == 0);
  CHECK (device_nth (1) == d1);
  CHECK (device_create ("dev2", &d3, &err) == -EEXIST);
  device_destroy (d1);
  device_destroy (d2);
  CHECK (device_count () == 0);
}

int
main (void)
{
  setup ();
  test_structure_errors ();
  test_argument_counts ();
  test_numbers ();
  test_backend_errors ();
  test_striped_errors ();
  test_failure_keeps_shared_backends ();
  test_parse_file ();
  test_good_tables ();
  test_distinct_backends ();
  test_lookup ();
  test_target_layout ();
  test_device_names ();
  teardown ();
  UNIT_EXIT ();
}

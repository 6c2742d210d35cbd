/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: the small shared helpers of util.h and the target toolkit
 * of target.h, each on its own:
 *  - ARRAY_SIZE, MIN/MAX, DIV_ROUND_UP, IS_POWER_OF_2 at their edges;
 *  - hex_digit against the C library for every byte value;
 *  - ACQUIRE_LOCK_FOR_CURRENT_SCOPE releases at the end of the scope;
 *  - the vector: append, remove, reset, and a reservation that would
 *    overflow;
 *  - target_emit / EMIT (dm's DMEMIT): exact text, truncation that keeps
 *    a string, the size needed counted past the end;
 *  - the argument reader (dm's dm_shift_arg, dm_read_arg,
 *    dm_read_arg_group): values at and past each end of a range, what
 *    is not a number, missing arguments, groups that end the line or
 *    not, each with its exact message and what it consumed;
 *  - mapper_err_prefix: nesting, a message that fills the buffer.
 */
#include <config.h>

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "target.h"
#include "util.h"
#include "unit.h"

#define CHECK_STR(got, want) \
  CHECKF (strcmp ((got), (want)) == 0, "got '%s', want '%s'", (got), (want))

static void
test_macros (void)
{
  int a[7];
  uint64_t x = 5, y = 9;

  CHECK_EQ (ARRAY_SIZE (a), 7);
  CHECK_EQ (MIN (x, y), 5);
  CHECK_EQ (MAX (x, y), 9);
  CHECK_EQ (MIN (-1, 2), -1);
  CHECK_EQ (MAX (-1, -2), -1);
  CHECK_EQ (DIV_ROUND_UP (0, 512), 0);
  CHECK_EQ (DIV_ROUND_UP (1, 512), 1);
  CHECK_EQ (DIV_ROUND_UP (512, 512), 1);
  CHECK_EQ (DIV_ROUND_UP (513, 512), 2);
  CHECK (DIV_ROUND_UP ((uint64_t) 1 << 62, 3) == ((uint64_t) 1 << 62) / 3 + 1);
  CHECK (!IS_POWER_OF_2 (0));
  CHECK (IS_POWER_OF_2 (1));
  CHECK (IS_POWER_OF_2 (2));
  CHECK (!IS_POWER_OF_2 (3));
  CHECK (IS_POWER_OF_2 (4096));
  CHECK (!IS_POWER_OF_2 (4097));
  CHECK (IS_POWER_OF_2 ((uint64_t) 1 << 63));
  CHECK (!IS_POWER_OF_2 (((uint64_t) 1 << 63) + 1));
  CHECK (!IS_POWER_OF_2 (UINT64_MAX));
}

static void
test_hex_digit (void)
{
  for (int c = 0; c < 256; c++) {
    char s[2] = { (char) c, '\0' };
    int want = isxdigit (c) ? (int) strtol (s, NULL, 16) : -1;

    CHECKF (hex_digit (c) == want, "hex_digit (%d) = %d, want %d", c,
            hex_digit (c), want);
  }
  CHECK_EQ (hex_digit (EOF), -1);
}

static pthread_mutex_t scope_lock = PTHREAD_MUTEX_INITIALIZER;

static void
locked_scope (int *held)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&scope_lock);

  *held = pthread_mutex_trylock (&scope_lock);
}

static void
test_lock_scope (void)
{
  int held = 0;

  locked_scope (&held);
  CHECK_EQ (held, EBUSY);                       /* locked inside */
  CHECK_EQ (pthread_mutex_trylock (&scope_lock), 0);   /* free after */
  pthread_mutex_unlock (&scope_lock);
  {
    CLEANUP_FREE char *p = strdup ("freed at the end of this scope");
    CHECK (p != NULL);                  /* the sanitizer build sees leaks */
  }
}

DEFINE_VECTOR_TYPE (int_vector, int);

static void
test_vector (void)
{
  int_vector v = empty_vector;

  for (int i = 0; i < 100; i++)
    CHECK (int_vector_append (&v, i) == 0);
  CHECK_EQ (v.len, 100);
  CHECK (v.cap >= 100);
  int_vector_remove (&v, 0);
  int_vector_remove (&v, 50);           /* was 51 */
  int_vector_remove (&v, v.len - 1);    /* was 99 */
  CHECK_EQ (v.len, 97);
  CHECK_EQ (v.ptr[0], 1);
  CHECK_EQ (v.ptr[49], 50);
  CHECK_EQ (v.ptr[50], 52);
  CHECK_EQ (v.ptr[96], 98);
  errno = 0;
  CHECK (int_vector_reserve (&v, SIZE_MAX) == -1);
  CHECK_EQ (errno, ENOMEM);
  CHECK_EQ (v.len, 97);                 /* unchanged by the failure */
  int_vector_reset (&v);
  CHECK (v.ptr == NULL && v.len == 0 && v.cap == 0);
}

/* A status() written as targets write theirs. */
static size_t
fake_status (char *buf, size_t len, unsigned n)
{
  size_t used = 0;

  EMIT ("%u", n);
  for (unsigned i = 0; i < n; i++)
    EMIT (" leg%u", i);
  EMIT (" %s", "end");
  return used;
}

static void
test_emit (void)
{
  char buf[64];
  size_t n;

  /* Fits. */
  n = fake_status (buf, sizeof buf, 3);
  CHECK_STR (buf, "3 leg0 leg1 leg2 end");
  CHECK_EQ (n, strlen ("3 leg0 leg1 leg2 end"));
  /* Exactly: the terminator is the last byte. */
  memset (buf, 'X', sizeof buf);
  n = fake_status (buf, 21, 3);
  CHECK_EQ (n, 20);
  CHECK_STR (buf, "3 leg0 leg1 leg2 end");
  /* One short: truncated, still a string, the size needed counted on. */
  memset (buf, 'X', sizeof buf);
  n = fake_status (buf, 20, 3);
  CHECK_EQ (n, 20);
  CHECK_STR (buf, "3 leg0 leg1 leg2 en");
  CHECK_EQ (buf[20], 'X');              /* nothing written past len */
  /* Truncated in the middle of a piece, later pieces still counted. */
  memset (buf, 'X', sizeof buf);
  n = fake_status (buf, 5, 3);
  CHECK_EQ (n, 20);
  CHECK_STR (buf, "3 le");
  CHECK_EQ (buf[5], 'X');
  /* No buffer at all: only the count (how table_print asks). */
  CHECK_EQ (fake_status (NULL, 0, 9), strlen ("9") + 9 * 5 + 4);
  /* Nothing emitted: the caller's empty string stays. */
  buf[0] = '\0';
  CHECK_EQ (target_emit (buf, sizeof buf, 0, "%s", ""), 0);
  CHECK_STR (buf, "");
  /* Appending at used >= len writes nothing. */
  memset (buf, 'X', sizeof buf);
  CHECK_EQ (target_emit (buf, 4, 4, "abc"), 7);
  CHECK_EQ (target_emit (buf, 4, 9, "abc"), 12);
  CHECK_EQ (buf[0], 'X');
  CHECK_EQ (buf[4], 'X');
}

/* --- the argument reader ------------------------------------------------ */

#define NARGS(...) (sizeof ((char *[]) { __VA_ARGS__ }) / sizeof (char *))
#define ARGS(...) \
  ((struct target_args) { NARGS (__VA_ARGS__), (char *[]) { __VA_ARGS__ } })

static void
test_shift_arg (void)
{
  struct target_args as = ARGS ("a", "b");

  CHECK_STR (target_shift_arg (&as), "a");
  CHECK_EQ (as.argc, 1);
  CHECK_STR (target_shift_arg (&as), "b");
  CHECK (target_shift_arg (&as) == NULL);
  CHECK (target_shift_arg (&as) == NULL);
  CHECK_EQ (as.argc, 0);
}

/* target_read_arg of the single argument s with arg: want_r, and the
 * value or the message.
 */
static void
read_one (const struct target_arg *arg, char *s, int want_r,
          uint64_t want_value, const char *want_msg)
{
  struct target_args as = { 1, (char *[]) { s, "next" } };
  struct mapper_err err = { "untouched" };
  uint64_t v = 12345;
  int r = target_read_arg (arg, &as, &v, &err);

  CHECKF (r == want_r, "'%s': r = %d, want %d (%s)", s, r, want_r, err.msg);
  CHECK_EQ (as.argc, 0);                /* consumed, good or bad */
  CHECK_STR (as.argv[0], "next");
  if (want_r == 0) {
    CHECK_EQ (v, want_value);
    CHECK_STR (err.msg, "untouched");
  }
  else {
    CHECK_EQ (v, 12345);                /* untouched on failure */
    CHECK_STR (err.msg, want_msg);
  }
}

static void
test_read_arg (void)
{
  static const struct target_arg chunk = { "chunk size", "sectors", 1,
                                           UINT32_MAX };
  static const struct target_arg value = { "value", NULL, 0, 255 };
  static const struct target_arg any = { "iv_offset", "sectors", 0,
                                         UINT64_MAX };
  const char *chunk_msg = "invalid chunk size '%s' (sectors, 1 to 4294967295)";
  static char *bad_chunks[] = {
    "0", "4294967296", "-1", "+1", "1x", "x", "", " 1", "0x10", "1.5",
    "18446744073709551616",
  };
  char want[128];

  read_one (&chunk, "1", 0, 1, NULL);
  read_one (&chunk, "4294967295", 0, UINT32_MAX, NULL);
  read_one (&chunk, "0008", 0, 8, NULL);
  for (size_t i = 0; i < ARRAY_SIZE (bad_chunks); i++) {
    snprintf (want, sizeof want, chunk_msg, bad_chunks[i]);
    read_one (&chunk, bad_chunks[i], -EINVAL, 0, want);
  }
  read_one (&value, "0", 0, 0, NULL);
  read_one (&value, "255", 0, 255, NULL);
  read_one (&value, "256", -EINVAL, 0, "invalid value '256' (0 to 255)");
  read_one (&any, "18446744073709551615", 0, UINT64_MAX, NULL);
  read_one (&any, "18446744073709551616", -EINVAL, 0,
            "invalid iv_offset '18446744073709551616' (sectors, 0 to "
            "18446744073709551615)");

  /* Nothing left. */
  {
    struct target_args as = { 0, NULL };
    struct mapper_err err;
    uint64_t v;

    CHECK_EQ (target_read_arg (&chunk, &as, &v, &err), -EINVAL);
    CHECK_STR (err.msg, "missing chunk size");
  }
}

static void
test_read_sectors (void)
{
  static const struct { char *s; int r; uint64_t bytes; const char *msg; }
  cases[] = {
    { "0", 0, 0, NULL },
    { "8", 0, 4096, NULL },
    { "18014398509481983", 0, 18014398509481983ULL * 512, NULL },
    { "18014398509481984", -EINVAL, 0, "write offset '18014398509481984' "
      "overflows the largest NBD size: at most 18014398509481983 sectors "
      "(NBD sizes are below 2^63 bytes)" },
    { "99999999999999999999", -EINVAL, 0, "write offset "
      "'99999999999999999999' overflows the largest NBD size: at most "
      "18014398509481983 sectors (NBD sizes are below 2^63 bytes)" },
    { "y", -EINVAL, 0, "write offset 'y' is not a non-negative integer" },
    { "-8", -EINVAL, 0, "write offset '-8' is not a non-negative integer" },
  };

  for (size_t i = 0; i < ARRAY_SIZE (cases); i++) {
    struct target_args as = { 2, (char *[]) { cases[i].s, "next" } };
    struct mapper_err err = { "untouched" };
    uint64_t bytes = 1;
    int r = target_read_sectors ("write offset", &as, &bytes, &err);

    CHECKF (r == cases[i].r, "'%s': r = %d (%s)", cases[i].s, r, err.msg);
    CHECK_EQ (as.argc, 1);
    CHECK_STR (as.argv[0], "next");
    if (cases[i].r == 0)
      CHECK (bytes == cases[i].bytes);
    else
      CHECK_STR (err.msg, cases[i].msg);
  }
  {
    struct target_args as = { 0, NULL };
    struct mapper_err err;
    uint64_t bytes;

    CHECK_EQ (target_read_sectors ("offset", &as, &bytes, &err), -EINVAL);
    CHECK_STR (err.msg, "missing offset");
  }
}

/* target_read_group over as (a copy): want_r, what is left, the group,
 * or the message.
 */
static void
read_group (struct target_args as, unsigned min, unsigned max, bool last,
            int want_r, unsigned want_n, unsigned want_left,
            const char *want_msg)
{
  struct target_args group = { 99, NULL };
  struct mapper_err err = { "untouched" };
  char **start = as.argv;
  int r = target_read_group ("feature argument", min, max, last, &as, &group,
                             &err);

  CHECKF (r == want_r, "%s: r = %d, want %d (%s)",
          start ? start[0] : "(none)", r, want_r, err.msg);
  if (want_r == 0) {
    CHECK_EQ (group.argc, want_n);
    CHECK (group.argv == start + 1);    /* the words after the count */
    CHECK_EQ (as.argc, want_left);
    CHECK (as.argv == start + 1 + want_n);
    CHECK_STR (err.msg, "untouched");
  }
  else
    CHECK_STR (err.msg, want_msg);
}

static void
test_read_group (void)
{
  read_group (ARGS ("0"), 0, 11, true, 0, 0, 0, NULL);
  read_group (ARGS ("2", "a", "b"), 0, 11, true, 0, 2, 0, NULL);
  read_group (ARGS ("1", "a", "b"), 0, 11, false, 0, 1, 1, NULL);
  read_group (ARGS ("1", "a", "b"), 0, 11, true, -EINVAL, 0, 0,
              "1 feature argument declared but 2 given");
  read_group (ARGS ("0", "a"), 0, 11, true, -EINVAL, 0, 0,
              "0 feature arguments declared but 1 given");
  read_group (ARGS ("2", "a"), 0, 11, false, -EINVAL, 0, 0,
              "2 feature arguments declared but 1 given");
  read_group (ARGS ("2", "a"), 0, 11, true, -EINVAL, 0, 0,
              "2 feature arguments declared but 1 given");
  read_group (ARGS ("12"), 0, 11, true, -EINVAL, 0, 0,
              "invalid number of feature arguments '12' (0 to 11)");
  read_group (ARGS ("0", "a"), 1, 2, false, -EINVAL, 0, 0,
              "invalid number of feature arguments '0' (1 to 2)");
  read_group (ARGS ("x", "a"), 0, 11, true, -EINVAL, 0, 0,
              "invalid number of feature arguments 'x' (0 to 11)");
  read_group (ARGS ("4294967296"), 0, UINT32_MAX, true, -EINVAL, 0, 0,
              "invalid number of feature arguments '4294967296' (0 to "
              "4294967295)");
  read_group ((struct target_args) { 0, NULL }, 0, 11, true, -EINVAL, 0, 0,
              "missing number of feature arguments");
}

static void
test_err_prefix (void)
{
  struct mapper_err err;

  mapper_err_set (&err, "offset 'x' is not a non-negative integer");
  mapper_err_prefix (&err, "leg %u", 1);
  CHECK_STR (err.msg, "leg 1: offset 'x' is not a non-negative integer");
  mapper_err_prefix (&err, "%s", "mirror");
  mapper_err_prefix (&err, "%s:%d", "t.table", 3);
  CHECK_STR (err.msg, "t.table:3: mirror: leg 1: offset 'x' is not a "
             "non-negative integer");

  /* A full buffer: cut at its end, still a string. */
  memset (err.msg, 'm', sizeof err.msg - 1);
  err.msg[sizeof err.msg - 1] = '\0';
  mapper_err_prefix (&err, "p");
  CHECK_EQ (strlen (err.msg), sizeof err.msg - 1);
  CHECK (strncmp (err.msg, "p: mmm", 6) == 0);
  /* A prefix longer than the buffer. */
  {
    char big[2 * sizeof err.msg];
    memset (big, 'P', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    mapper_err_set (&err, "why");
    mapper_err_prefix (&err, "%s", big);
    CHECK_EQ (strlen (err.msg), sizeof err.msg - 1);
    CHECK_EQ (err.msg[0], 'P');
  }
  mapper_err_prefix (NULL, "nothing to prefix");
}

/* secret_stream: what was written, in order, whatever the sizes (within
 * and beyond its stdio buffer, many growths); "" when nothing was; its
 * stdio buffer wiped at close.  (That no freed block keeps a copy is
 * test-nbdmsetup-persist-faults.sh's, which can watch free.)
 */
static void
test_secret_stream (void)
{
  struct secret_stream s;
  char *text, *want = malloc (200000), piece[5000];
  size_t len, wlen = 0;

  if (want == NULL)
    UNIT_FATAL ("out of memory");
  CHECK (secret_stream_open (&s) != NULL);
  CHECK_EQ (secret_stream_close (&s, &text, &len), 0);
  CHECK (text && *text == '\0' && len == 0);
  free (text);

  CHECK (secret_stream_open (&s) != NULL);
  for (size_t i = 0, n; wlen < 190000; i++, wlen += n) {
    n = (i * 797) % sizeof piece;
    for (size_t j = 0; j < n; j++)
      piece[j] = 'a' + (i + j) % 26;
    if (i % 3)
      fwrite (piece, 1, n, s.fp);
    else
      fprintf (s.fp, "%.*s", (int) n, piece);
    memcpy (want + wlen, piece, n);
  }
  want[wlen] = '\0';
  CHECK_EQ (secret_stream_close (&s, &text, &len), 0);
  CHECK_EQ (len, wlen);
  CHECK (text && strcmp (text, want) == 0);
  for (size_t i = 0; i < sizeof s.io; i++)
    CHECK_EQ (s.io[i], 0);
  free (text);
  free (want);
}

int
main (void)
{
  test_macros ();
  test_hex_digit ();
  test_lock_scope ();
  test_vector ();
  test_emit ();
  test_shift_arg ();
  test_read_arg ();
  test_read_sectors ();
  test_read_group ();
  test_err_prefix ();
  test_secret_stream ();
  UNIT_EXIT ();
}

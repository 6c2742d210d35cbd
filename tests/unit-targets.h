/* SPDX-License-Identifier: BSD-3-Clause */
/* Helpers shared by the unit tests of the delay, flakey and crypt
 * targets: refused tables (errno, message, nothing changed, no fd
 * leaked), accepted tables, status text, devices over a table.
 * Include after internal.h and unit.h.
 */
#ifndef NBDMAPPER_UNIT_TARGETS_H
#define NBDMAPPER_UNIT_TARGETS_H

#define UNIT_ORIGIN "tbl"
#define UNIT_SENTINEL ((struct table *) (uintptr_t) 0x5e57)

/* table_parse(text) must fail with -want_errno and a message starting
 * "tbl:LINE: TARGET: " ("tbl:LINE: " without a target; "tbl: " and no
 * line named when line is 0) and containing each non-NULL phrase; *out
 * stays untouched and no descriptor leaks.
 */
__attribute__ ((unused))
static void
unit_expect_fail_at (int srcline, const char *text, int want_errno, int line,
                     const char *target, const char *phrase1,
                     const char *phrase2)
{
  struct table *t = UNIT_SENTINEL;
  struct mapper_err err;
  char prefix[256];
  int fds = unit_count_fds ();
  bool ok = true;
  int r;

  memset (err.msg, 'X', sizeof err.msg);
  err.msg[sizeof err.msg - 1] = '\0';
  r = table_parse (text, UNIT_ORIGIN, &t, &err);
#define SUB(cond) do { if (!(cond)) { ok = false; \
  fprintf (stderr, "%s:%d: failed: %s\n", __BASE_FILE__, srcline, #cond); } \
  } while (0)
  SUB (r == -want_errno);
  SUB (t == UNIT_SENTINEL);
  if (line > 0 && target)
    snprintf (prefix, sizeof prefix, "%s:%d: %s: ", UNIT_ORIGIN, line, target);
  else if (line > 0)
    snprintf (prefix, sizeof prefix, "%s:%d: ", UNIT_ORIGIN, line);
  else
    snprintf (prefix, sizeof prefix, "%s: ", UNIT_ORIGIN);
  SUB (strncmp (err.msg, prefix, strlen (prefix)) == 0);
  if (line <= 0) {              /* about the whole table: no line named */
    snprintf (prefix, sizeof prefix, "%s:1", UNIT_ORIGIN);
    SUB (strstr (err.msg, prefix) == NULL);
  }
  if (phrase1)
    SUB (strstr (err.msg, phrase1) != NULL);
  if (phrase2)
    SUB (strstr (err.msg, phrase2) != NULL);
  SUB (unit_count_fds () == fds);
#undef SUB
  if (!ok) {
    fprintf (stderr, "    table: %s\n    got r=%d (%s), msg: %s\n", text, r,
             r < 0 ? strerror (-r) : "success", err.msg);
    unit_failures++;
    if (r == 0 && t != UNIT_SENTINEL)
      table_free (t);
  }
}
/* UNIT_FAIL (errno, line, target, phrase1, phrase2, fmt, ...) */
#define UNIT_FAIL(want, line, target, p1, p2, ...) do { \
  char *_s = unit_sprintf (__VA_ARGS__); \
  unit_expect_fail_at (__LINE__, _s, want, line, target, p1, p2); \
  free (_s); } while (0)

/* Parse a table that must be accepted; NULL (counted as a failure) if
 * not.
 */
__attribute__ ((unused, format (printf, 2, 3)))
static struct table *
unit_parse_at (int srcline, const char *fmt, ...)
{
  struct mapper_err err = { "" };
  struct table *t = NULL;
  va_list ap;
  char *text;
  int r;

  va_start (ap, fmt);
  if (vasprintf (&text, fmt, ap) == -1)
    UNIT_FATAL ("out of memory");
  va_end (ap);
  r = table_parse (text, UNIT_ORIGIN, &t, &err);
  if (r != 0) {
    fprintf (stderr, "%s:%d: table refused: %s\n    table: %s\n", __BASE_FILE__,
             srcline, err.msg, text);
    unit_failures++;
    t = NULL;
  }
  free (text);
  return t;
}
#define unit_parse(...) unit_parse_at (__LINE__, __VA_ARGS__)

/* The status of target i (a static buffer). */
__attribute__ ((unused))
static const char *
unit_status (struct table *t, size_t i, enum status_type type)
{
  static char buf[4096];
  struct target *ti = &t->targets[i];
  size_t n;

  /* As the table hands it to status(): an empty string. */
  buf[0] = '\0';
  n = ti->type->status ? ti->type->status (ti, type, buf, sizeof buf) : 0;

  if (n >= sizeof buf)
    UNIT_FATAL ("status too long");
  return buf;
}

/* The table's dmsetup table text must be want (a whole table). */
__attribute__ ((unused))
static void
unit_check_format_at (int srcline, struct table *t, const char *want)
{
  char buf[8192];

  table_format (t, buf, sizeof buf);
  if (strcmp (buf, want) != 0) {
    fprintf (stderr, "%s:%d: table_format:\n    got:  %s    want: %s",
             __BASE_FILE__, srcline, buf, want);
    unit_failures++;
  }
}
#define unit_check_format(t, want) unit_check_format_at (__LINE__, t, want)

/* Table text must be accepted and print as want (a whole table), with
 * an empty INFO status for its first target; and want must parse back
 * to itself.
 */
__attribute__ ((unused))
static void
unit_check_roundtrip_at (int srcline, const char *text, const char *want)
{
  struct table *t = unit_parse_at (srcline, "%s", text);
  const char *info;

  if (t == NULL)
    return;
  unit_check_format_at (srcline, t, want);
  info = unit_status (t, 0, STATUSTYPE_INFO);
  if (strcmp (info, "") != 0) {
    fprintf (stderr, "%s:%d: INFO status not empty: %s\n", __BASE_FILE__,
             srcline, info);
    unit_failures++;
  }
  table_free (t);
  t = unit_parse_at (srcline, "%s", want);
  if (t) {
    unit_check_format_at (srcline, t, want);
    table_free (t);
  }
}
#define unit_check_roundtrip(text, want) \
  unit_check_roundtrip_at (__LINE__, text, want)

/* A live device named name over table t (taken). */
__attribute__ ((unused))
static struct device *
unit_device (const char *name, struct table *t)
{
  struct mapper_err err = { "" };
  struct device *dev;

  if (t == NULL)
    UNIT_FATAL ("%s: no table", name);
  if (device_create (name, &dev, &err) < 0)
    UNIT_FATAL ("device_create %s: %s", name, err.msg);
  device_load (dev, t);
  if (device_resume (dev, &err) < 0)
    UNIT_FATAL ("device_resume %s: %s", name, err.msg);
  return dev;
}

/* message DEV SECTOR WORDS... (words: separated by spaces, at most 8):
 * device_message's result, err's text in msg.
 */
__attribute__ ((unused))
static int
unit_message (struct device *dev, uint64_t sector, const char *words,
              char *msg, size_t len)
{
  struct mapper_err err = { "" };
  char copy[1024], *argv[8], *reply = NULL, *save = NULL;
  unsigned argc = 0;
  int r;

  snprintf (copy, sizeof copy, "%s", words);
  for (char *w = strtok_r (copy, " ", &save); w && argc < 8;
       w = strtok_r (NULL, " ", &save))
    argv[argc++] = w;
  r = device_message (dev, sector, argc, argv, &reply, &err);
  free (reply);
  snprintf (msg, len, "%s", err.msg);
  return r;
}

/* dev's live table as text (keys shown), valid until the next call. */
__attribute__ ((unused))
static const char *
unit_table_text (struct device *dev)
{
  static char *text;
  int r = 0;

  free (text);
  text = device_table_text (dev, false, &r);
  if (text == NULL)
    UNIT_FATAL ("device_table_text: %s", strerror (-r));
  return text;
}

/* message DEV SECTOR WORDS must fail with want_errno, its message
 * containing want, and leave dev's live table as it was.
 */
#define unit_message_refused(dev, sector, words, want_errno, want) \
  unit_message_refused_at (__LINE__, dev, sector, words, want_errno, want)
__attribute__ ((unused))
static void
unit_message_refused_at (int srcline, struct device *dev, uint64_t sector,
                         const char *words, int want_errno, const char *want)
{
  char *before = strdup (unit_table_text (dev)), msg[256];
  int r = unit_message (dev, sector, words, msg, sizeof msg);

  if (r != -want_errno || strstr (msg, want) == NULL ||
      strcmp (unit_table_text (dev), before) != 0) {
    fprintf (stderr, "%s:%d: message '%s': %d '%s', expected %d '%s'%s\n",
             __FILE__, srcline, words, r, msg, -want_errno, want,
             strcmp (unit_table_text (dev), before) ? ", table changed" : "");
    unit_failures++;
  }
  free (before);
}

/* Read size bytes at off of path into a malloc'd buffer. */
__attribute__ ((unused))
static unsigned char *
unit_read_at (const char *path, uint64_t off, size_t size)
{
  unsigned char *buf = malloc (size ? size : 1);
  int fd = open (path, O_RDONLY | O_CLOEXEC);

  if (buf == NULL || fd == -1 || pread (fd, buf, size, off) != (ssize_t) size)
    UNIT_FATAL ("read %s: %s", path, strerror (errno));
  close (fd);
  return buf;
}

#endif

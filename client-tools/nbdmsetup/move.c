/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdmsetup move NAME DEST: what lvm2's pvmove does, for one device,
 * made of the server's atomic operations (nbdmsetup(8), MOVING A DEVICE):
 *
 *  1. replace: every target of NAME's live table becomes a two-leg
 *     mirror, leg 0 the target's own area (the source), leg 1 the same
 *     sectors of DEST (target i at START on DEST: the targets are laid
 *     out on DEST as they are on the device, so DEST needs the device's
 *     size).  Writes go to both legs from then on; the server's resync
 *     copies leg 0 to leg 1 in the background, with or without this
 *     tool.  handle_errors: a DEST that fails a write is dropped from
 *     the mirror and the volume carries on, on the source.
 *  2. wait: status (regions in sync, the legs' health letters) and wait
 *     (the mirror's "resync complete" event), a progress line.
 *  3. finish: load the linear table on DEST (one line, 0 SIZE linear
 *     DEST 0) into the inactive slot, suspend (I/O held, in-flight
 *     requests drained, both legs flushed), check status again (every
 *     region in sync, both legs 'A': nothing written since the check
 *     can have missed DEST), resume (the linear table goes live).  If
 *     the check fails: clear, resume, and the mirror goes on.
 *
 * No state of its own: where a move is comes from the server's live
 * table, which tables=DIR keeps over a restart (a core log resyncs from
 * the start then).  A live table whose every line is a two-leg mirror
 * with leg 1 on one device at the line's own START is a move to that
 * device (what step 1 makes): --resume (or the same command again) goes
 * on from step 2, or step 3 if the device is suspended with a table
 * loaded (the tool was killed there); --abort loads the source table,
 * the legs 0 as linear lines, and resumes it.  The source has every
 * write until the end of step 3, so an abort loses nothing.
 *
 * SIGINT, SIGTERM and SIGHUP are held for the whole command and looked
 * at between steps: an interrupt never leaves the device suspended, and
 * during step 2 it leaves the mirror live (the copy goes on).
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto.h"
#include "nbdmsetup.h"

/* lvm2's default mirror_region_size: 512 KiB. */
#define DEFAULT_REGION_SECTORS 1024
/* How long one wait for the resync's event lasts: the progress line's
 * update interval, and how late an interrupt may be seen.
 */
#define POLL_MS 1000

/* One line of the live table: a linear (the source) or a move's mirror. */
struct seg {
  uint64_t start, len;
  char *src;                    /* linear's device, mirror's leg 0 */
  uint64_t src_off;
  char *dst;                    /* mirror's leg 1 (at start), clone's
                                   destination; NULL: linear */
  char *log;                    /* mirror's log words, "core 2 1024 sync" */
  char *meta;                   /* clone's metadata device; NULL: mirror */
};

struct move {
  struct conn *c;
  const char *name;
  struct seg *segs;
  size_t n;
  bool mirror;                  /* the live table is a move's mirror */
  bool clone;                   /* ... or a clone (one line) */
  const char *dst;              /* the mirror's leg 1, the clone's
                                   destination (in segs) */
  char *moved_to;               /* the move ended: DEST (malloc'd) */
  uint64_t size;                /* sectors */
  bool suspended, inactive, read_only;
  uint64_t event_nr;
};

static sigset_t held;

/* Whether one of the held signals came (and take it). */
static bool
interrupted (void)
{
  sigset_t pending;
  struct timespec zero = { 0, 0 };

  if (sigpending (&pending) == -1)
    return false;
  if (!sigismember (&pending, SIGINT) && !sigismember (&pending, SIGTERM) &&
      !sigismember (&pending, SIGHUP))
    return false;
  while (sigtimedwait (&held, NULL, &zero) > 0)
    ;
  return true;
}

static char *
xstrdup (const char *s)
{
  char *r = strdup (s);

  if (r == NULL)
    die ("out of memory");
  return r;
}

static char *
xasprintf (const char *fmt, ...) __attribute__ ((format (printf, 1, 2)));
static char *
xasprintf (const char *fmt, ...)
{
  va_list ap;
  char *r;
  int n;

  va_start (ap, fmt);
  n = vasprintf (&r, fmt, ap);
  va_end (ap);
  if (n < 0)
    die ("out of memory");
  return r;
}

/* Append to a malloc'd string. */
static void
append (char **s, const char *more)
{
  char *r = xasprintf ("%s%s", *s ? *s : "", more);

  free (*s);
  *s = r;
}

static bool
parse_u64 (const char *s, uint64_t *v)
{
  char *end;

  if (*s < '0' || *s > '9')
    return false;
  errno = 0;
  *v = strtoull (s, &end, 10);
  return errno == 0 && *end == '\0';
}

/* Split a table or status line into its words (malloc'd array of
 * pointers into a malloc'd copy: free (w[0]) and free (w)).
 */
static size_t
split_words (const char *line, char ***out)
{
  char *copy = xstrdup (line), *save = NULL, *p;
  size_t n = 0, cap = 16;
  char **w = malloc (cap * sizeof *w);

  if (w == NULL)
    die ("out of memory");
  for (p = strtok_r (copy, " \t", &save); p; p = strtok_r (NULL, " \t", &save)) {
    if (n + 1 == cap && (w = realloc (w, (cap *= 2) * sizeof *w)) == NULL)
      die ("out of memory");
    w[n++] = p;
  }
  if (n == 0)
    free (copy);
  w[n] = NULL;
  *out = w;
  return n;
}

static void
free_words (char **w, size_t n)
{
  if (n)
    free (w[0]);
  free (w);
}

/* One table line as a segment; NULL: why it is neither a linear nor a
 * move's mirror (malloc'd).
 */
static char *
parse_seg (const char *line, struct seg *s)
{
  char **w;
  size_t n = split_words (line, &w), i;
  uint64_t nlog, nlegs, off1;
  char *why = NULL;

  memset (s, 0, sizeof *s);
  if (n < 3 || !parse_u64 (w[0], &s->start) || !parse_u64 (w[1], &s->len)) {
    why = xasprintf ("malformed table line '%s'", line);
    goto out;
  }
  if (strcmp (w[2], "linear") == 0) {
    if (n != 5 || !parse_u64 (w[4], &s->src_off))
      why = xasprintf ("malformed linear line '%s'", line);
    else
      s->src = xstrdup (w[3]);
    goto out;
  }
  if (strcmp (w[2], "clone") == 0) {
    /* clone META DEST SRC REGION [...]: dm-clone's devices are whole
     * devices, from sector 0.
     */
    if (n < 7)
      why = xasprintf ("malformed clone line '%s'", line);
    else {
      s->meta = xstrdup (w[3]);
      s->dst = xstrdup (w[4]);
      s->src = xstrdup (w[5]);
    }
    goto out;
  }
  if (strcmp (w[2], "mirror") != 0) {
    why = xasprintf ("a %s target has no one source area to copy: move "
                     "moves linear targets (and resumes its own mirrors)",
                     w[2]);
    goto out;
  }
  /* mirror LOGTYPE #LOG LOG... 2 DEV0 OFF0 DEV1 START [1 handle_errors] */
  if (n < 5 || !parse_u64 (w[4], &nlog) || nlog > n - 5)
    goto not_ours;
  i = 5 + nlog;
  if (i + 5 > n || !parse_u64 (w[i], &nlegs) || nlegs != 2 ||
      !parse_u64 (w[i + 2], &s->src_off) || !parse_u64 (w[i + 4], &off1) ||
      off1 != s->start)
    goto not_ours;
  if (!(i + 5 == n ||
        (i + 7 == n && strcmp (w[i + 5], "1") == 0 &&
         strcmp (w[i + 6], "handle_errors") == 0)))
    goto not_ours;
  s->src = xstrdup (w[i + 1]);
  s->dst = xstrdup (w[i + 3]);
  for (size_t j = 3; j < i; j++) {
    append (&s->log, w[j]);
    if (j + 1 < i)
      append (&s->log, " ");
  }
  goto out;

 not_ours:
  why = xasprintf ("a mirror that is not a move's (two legs, the second "
                   "at the line's own start)");
 out:
  free_words (w, n);
  return why;
}

static void
free_segs (struct move *m)
{
  for (size_t i = 0; i < m->n; i++) {
    free (m->segs[i].src);
    free (m->segs[i].dst);
    free (m->segs[i].log);
    free (m->segs[i].meta);
  }
  free (m->segs);
  m->segs = NULL;
  m->n = 0;
}

/* Read NAME's info and live table into m. */
static void
read_state (struct move *m)
{
  const char *args[1] = { m->name };
  uint16_t status;
  char *p = call_status (m->c, PROTO_CMD_INFO, 0, 1, args, &status);
  struct row *rows;
  size_t n;

  if (status != PROTO_OK)
    die ("move %s: %s", m->name, *p ? p : proto_status_name (status));
  n = split_rows (p, &rows);
  if (n != 1 || rows[0].n < 10)
    die ("move %s: info: malformed response", m->name);
  m->suspended = strcmp (rows[0].f[1], "SUSPENDED") == 0;
  if (strcmp (rows[0].f[2], "1") != 0)
    die ("move %s: the device has no live table: there is nothing to move",
         m->name);
  m->inactive = strcmp (rows[0].f[3], "1") == 0;
  if (!parse_u64 (rows[0].f[5], &m->event_nr))
    die ("move %s: info: malformed event number", m->name);
  m->read_only = strcmp (rows[0].f[9], "1") == 0;
  free (rows);
  free (p);

  free_segs (m);
  p = call_flags (m->c, PROTO_CMD_TABLE, 0, 1, args);
  n = split_rows (p, &rows);
  m->segs = calloc (n ? n : 1, sizeof *m->segs);
  if (m->segs == NULL)
    die ("out of memory");
  m->size = 0;
  for (size_t i = 0; i < n; i++) {
    struct seg *s = &m->segs[i];
    char *why;

    if (rows[i].n < 2 || !*rows[i].f[1])
      die ("move %s: the device has no live table: there is nothing to move",
           m->name);
    if ((why = parse_seg (rows[i].f[1], s)) != NULL)
      die ("move %s: line %zu (%s): %s", m->name, i + 1, rows[i].f[1], why);
    m->n = i + 1;
    m->size = s->start + s->len;
    if ((s->dst != NULL) != (m->segs[0].dst != NULL) ||
        (s->dst && strcmp (s->dst, m->segs[0].dst) != 0))
      die ("move %s: line %zu (%s): its table mixes linear lines and a "
           "move's mirrors, or mirrors to different devices: not a table "
           "move makes", m->name, i + 1, rows[i].f[1]);
  }
  m->clone = m->n && m->segs[0].meta;
  m->mirror = m->n && m->segs[0].dst && !m->clone;
  m->dst = m->n ? m->segs[0].dst : NULL;
  if (m->clone && (m->n != 1 || m->segs[0].start != 0))
    die ("move %s: a clone line in a table of %zu lines: not a table move "
         "makes", m->name, m->n);
  free (rows);
  free (p);
}

/* Is the device spelled dest by the user the one the server calls
 * canonical?  The server makes local paths absolute and resolves their
 * links (realpath): so does this, for a server on this machine.
 */
static bool
same_dev (const char *dest, const char *canonical)
{
  char *r;
  bool same;

  if (strcmp (dest, canonical) == 0)
    return true;
  if (strstr (dest, "://") || strncmp (dest, "mapper:", 7) == 0 ||
      (r = realpath (dest, NULL)) == NULL)
    return false;
  same = strcmp (r, canonical) == 0;
  free (r);
  return same;
}

/* DEST as the server is to open it: a relative path is relative to the
 * user's directory, not the server's.
 */
static char *
dest_for_server (const char *dest)
{
  char cwd[PATH_MAX];

  if (*dest == '/' || strstr (dest, "://") || strncmp (dest, "mapper:", 7) == 0)
    return xstrdup (dest);
  if (getcwd (cwd, sizeof cwd) == NULL)
    die ("move: %s: a relative path, and the current directory: %s", dest,
         strerror (errno));
  return xasprintf ("%s/%s", cwd, dest);
}

/* The mirror's log words for a target of len sectors: a region no
 * larger than the target (the mirror's rule), a power of two.
 */
static char *
log_words (uint64_t len, uint64_t region)
{
  while (region > len)
    region >>= 1;
  if (opts.log == NULL || strcmp (opts.log, "core") == 0)
    return xasprintf ("core 2 %" PRIu64 " sync", region);
  /* dm's disk log: disk 3 LOGDEV REGION sync. */
  {
    char *dev = dest_for_server (opts.log);
    char *r = xasprintf ("disk 3 %s %" PRIu64 " sync", dev, region);
    free (dev);
    return r;
  }
}

/* A disk log's words with or without "sync": "disk 3 DEV R sync" makes
 * the mirror start its log anew (every region out of sync: the table
 * that starts a copy onto an empty leg must), "disk 2 DEV R" loads the
 * log as it is on DEV.  A table saved (tables=DIR) with "sync" would
 * start the copy from zero at every restart, so once the mirror with
 * "sync" is live the move replaces it with the same mirror without
 * (disk_log_settle).  Other words are returned as they are.
 */
static char *
log_form (const char *words, bool sync)
{
  char **w;
  size_t n = split_words (words, &w);
  char *r = n >= 4 && strcmp (w[0], "disk") == 0
    ? (sync ? xasprintf ("disk 3 %s %s sync", w[2], w[3])
            : xasprintf ("disk 2 %s %s", w[2], w[3]))
    : xstrdup (words);

  free_words (w, n);
  return r;
}

/* Are a move's log words (log_words) those of the live mirror (the
 * server's spelling of the log device), a disk log with or without
 * "sync" alike?
 */
static bool
same_log (const char *want_words, const char *have_words)
{
  char *want = log_form (want_words, true), *have = log_form (have_words, true);
  char **a, **b;
  size_t na = split_words (want, &a), nb = split_words (have, &b);
  bool same = na == nb;

  free (want);
  free (have);

  for (size_t i = 0; same && i < na; i++)
    same = strcmp (a[i], b[i]) == 0 ||
      (i == 2 && strcmp (a[0], "disk") == 0 && same_dev (a[i], b[i]));
  free_words (a, na);
  free_words (b, nb);
  return same;
}

static uint64_t
region_sectors (void)
{
  uint64_t r;

  if (opts.region_size == NULL)
    return DEFAULT_REGION_SECTORS;
  if (!parse_u64 (opts.region_size, &r) || r < 2 || (r & (r - 1)) ||
      r > (UINT64_C (1) << 40))
    die ("move --region-size: '%s' is not a power of two of at least 2 "
         "sectors", opts.region_size);
  return r;
}

/* The clone method's table: one linear line at sector 0 of its device
 * becomes a clone of that device.
 */
static char *
clone_table (const struct move *m, const char *dst)
{
  const struct seg *s = &m->segs[0];

  if (m->n != 1 || s->src_off != 0)
    die ("move --method clone %s: dm-clone copies whole devices from their "
         "sector 0: the table must be one linear target at offset 0, not "
         "%zu line%s%s (use --method mirror)", m->name, m->n,
         m->n == 1 ? "" : "s", m->n == 1 ? " at an offset" : "");
  if (opts.metadata == NULL)
    die ("move --method clone %s: --metadata FILE is missing (the regions "
         "hydrated are kept there: zeros, or a clone's own of this move)",
         m->name);
  return xasprintf ("0 %" PRIu64 " clone %s %s %s %" PRIu64 "\n", s->len,
                    opts.metadata, dst, s->src, region_sectors ());
}

/* The tables of a move: the mirror (from the source lines, to dst), the
 * source (the legs 0 as linear lines), the final linear on dst.
 */
static char *
mirror_table (const struct move *m, const char *dst, bool sync)
{
  uint64_t region = region_sectors ();
  char *t = NULL;

  /* dm's disk log is a whole device for one mirror. */
  if (opts.log && strcmp (opts.log, "core") != 0 && m->n > 1 && !m->mirror)
    die ("move %s --log %s: a disk log serves one mirror, and the table has "
         "%zu targets: use --log core", m->name, opts.log, m->n);
  for (size_t i = 0; i < m->n; i++) {
    const struct seg *s = &m->segs[i];
    char *words = s->log ? xstrdup (s->log) : log_words (s->len, region);
    char *log = log_form (words, sync), *line;

    if (s->len < 2)
      die ("move %s: line %zu is %" PRIu64 " sector long: a mirror's region "
           "is at least 2", m->name, i + 1, s->len);
    line = xasprintf ("%" PRIu64 " %" PRIu64 " mirror %s 2 %s %" PRIu64
                      " %s %" PRIu64 " 1 handle_errors\n", s->start, s->len,
                      log, s->src, s->src_off, dst, s->start);
    append (&t, line);
    free (line);
    free (log);
    free (words);
  }
  return t;
}

static char *step (struct move *m, unsigned cmd, const char *table,
                   const char *left);

/* After a mirror with a disk log's "sync" went live (the copy started
 * anew onto DEST): the same mirror without "sync", so that what
 * tables=DIR saves, and a restart loads, goes on from the log.  A crash
 * before this leaves "sync": the copy starts again, never skips.
 */
static void
disk_log_settle (struct move *m, const char *dst)
{
  char *t;

  if (opts.log == NULL || strcmp (opts.log, "core") == 0)
    return;
  t = mirror_table (m, dst, false);
  free (step (m, PROTO_CMD_REPLACE, t, "the mirror copies; a restart "
              "before this step copies from the start"));
  free (t);
}

static char *
source_table (const struct move *m)
{
  char *t = NULL;

  for (size_t i = 0; i < m->n; i++) {
    const struct seg *s = &m->segs[i];
    char *line = xasprintf ("%" PRIu64 " %" PRIu64 " linear %s %" PRIu64 "\n",
                            s->start, s->len, s->src, s->src_off);
    append (&t, line);
    free (line);
  }
  return t;
}

static char *
final_table (const struct move *m)
{
  return xasprintf ("0 %" PRIu64 " linear %s 0\n", m->size, m->dst);
}

/* Is the live table already the final one on dest (a move that ended,
 * or a device on dest from the start)?
 */
static bool
on_dest (const struct move *m, const char *dest)
{
  for (size_t i = 0; i < m->n; i++)
    if (m->segs[i].dst || !same_dev (dest, m->segs[i].src) ||
        m->segs[i].src_off != m->segs[i].start)
      return false;
  return m->n > 0;
}

/* The request, or die naming the step and what it left. */
static char *
step (struct move *m, unsigned cmd, const char *table, const char *left)
{
  const char *args[2] = { m->name, table };
  uint16_t status;
  uint32_t flags = m->read_only && table ? PROTO_F_READONLY : 0;
  char *p = call_status (m->c, cmd, flags, table ? 2 : 1, args, &status);

  if (status != PROTO_OK)
    die ("move %s: %s: %s (%s)", m->name, proto_cmd_name (cmd),
         *p ? p : proto_status_name (status), left);
  return p;
}

/* The mirror's progress and health, from status. */
struct progress {
  uint64_t in_sync, regions;
  char bad[512];                /* a leg that is not 'A': what to say */
};

static void
read_progress (struct move *m, struct progress *pr)
{
  const char *args[1] = { m->name };
  char *p = call_flags (m->c, PROTO_CMD_STATUS, 0, 1, args);
  struct row *rows;
  size_t n = split_rows (p, &rows);

  pr->in_sync = pr->regions = 0;
  pr->bad[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    char **w;
    size_t nw = rows[i].n >= 2 ? split_words (rows[i].f[1], &w) : 0;
    uint64_t legs, a, b;
    char *slash;

    /* START LEN clone 8 USED/TOTAL REGION HYDRATED/REGIONS ..., or
     * Fail.
     */
    if (m->clone) {
      if (nw >= 4 && strcmp (w[2], "clone") == 0 &&
          strcmp (w[3], "Fail") == 0) {
        snprintf (pr->bad, sizeof pr->bad, "the clone failed (status Fail: "
                  "a metadata or destination error, see the server's log)");
        pr->regions = 1;
      }
      else if (nw < 7 || strcmp (w[2], "clone") != 0 ||
               (slash = strchr (w[6], '/')) == NULL ||
               (*slash = '\0', !parse_u64 (w[6], &a)) ||
               !parse_u64 (slash + 1, &b))
        die ("move %s: status line %zu is not a clone's: '%s' (the table "
             "changed under the move?)", m->name, i + 1,
             rows[i].n >= 2 ? rows[i].f[1] : "");
      else {
        pr->in_sync += a;
        pr->regions += b;
      }
      free_words (w, nw);
      continue;
    }
    /* START LEN mirror 2 DEV0 DEV1 IN_SYNC/REGIONS 1 HEALTH ... */
    if (nw < 9 || strcmp (w[2], "mirror") != 0 || !parse_u64 (w[3], &legs) ||
        legs != 2 || (slash = strchr (w[6], '/')) == NULL)
      die ("move %s: status line %zu is not a two-leg mirror's: '%s' (the "
           "table changed under the move?)", m->name, i + 1,
           rows[i].n >= 2 ? rows[i].f[1] : "");
    *slash = '\0';
    if (!parse_u64 (w[6], &a) || !parse_u64 (slash + 1, &b) ||
        strlen (w[8]) != 2)
      die ("move %s: malformed mirror status '%s'", m->name, rows[i].f[1]);
    pr->in_sync += a;
    pr->regions += b;
    /* The first unhealthy leg, but a source's over a DEST's of an
     * earlier line: --abort must not miss that the source did.
     */
    for (int leg = 0; leg < 2; leg++) {
      char h = w[8][leg];
      const char *what = h == 'D' ? "failed a write" : h == 'F'
        ? "failed a flush" : h == 'S' ? "failed the resync"
        : h == 'R' ? "failed a read" : "is not healthy";
      if (h == 'A' || (pr->bad[0] && (leg == 1 ||
                                      strncmp (pr->bad, "the source", 10) == 0)))
        continue;
      snprintf (pr->bad, sizeof pr->bad, "%s %s (leg %d, '%c', line %zu)",
                leg ? "DEST" : "the source", what, leg, h, i + 1);
    }
    free_words (w, nw);
  }
  free (rows);
  free (p);
}

/* The progress line: in place on a terminal, else a line when it
 * changed.
 */
static void
show_progress (struct move *m, const struct progress *pr)
{
  static uint64_t shown = UINT64_MAX;
  bool tty = isatty (STDOUT_FILENO);
  double pct = pr->regions ? 100.0 * pr->in_sync / pr->regions : 100;

  if (!tty && pr->in_sync == shown)
    return;
  shown = pr->in_sync;
  printf ("%smove %s: %" PRIu64 "/%" PRIu64 " regions %s (%.1f%%)%s",
          tty ? "\r" : "", m->name, pr->in_sync, pr->regions,
          m->clone ? "hydrated" : "in sync", pct,
          tty ? "" : "\n");
  fflush (stdout);
}

static void
end_progress_line (void)
{
  if (isatty (STDOUT_FILENO))
    putchar ('\n');
}

/* The notes after a message once the mirror is live. */
static const char *
resume_note (struct move *m)
{
  static char note[512];

  if (m->clone)
    snprintf (note, sizeof note, "%s stays on the clone to %s, which the "
              "server goes on hydrating (after a restart too): 'nbdmsetup "
              "move --resume %s' finishes the move", m->name, m->dst,
              m->name);
  else
    snprintf (note, sizeof note, "%s stays on the mirror to %s, which the "
              "server goes on copying (after a restart, %s): 'nbdmsetup move "
              "--resume %s' finishes the move, 'nbdmsetup move --abort %s' "
              "returns to the source", m->name, m->dst,
              m->n && m->segs[0].log && strncmp (m->segs[0].log, "disk ", 5)
              == 0 ? "where its disk log says" : "from the start",
              m->name, m->name);
  return note;
}

/* The table just loaded goes live at the resume after this suspend (no
 * write in flight while the caller checks the mirror again); a refused
 * suspend clears it and dies, the device as it was.
 */
static void
suspend_loaded (struct move *m, const char *verb, const char *left)
{
  uint16_t status;
  const char *args[1] = { m->name };
  char *p;

  if (m->suspended)
    return;
  p = call_status (m->c, PROTO_CMD_SUSPEND, 0, 1, args, &status);
  if (status != PROTO_OK) {
    free (step (m, PROTO_CMD_CLEAR, NULL, left));
    die ("%s %s: suspend: %s (%s)", verb, m->name,
         *p ? p : proto_status_name (status), left);
  }
  free (p);
}

/* Step 3; false if the mirror was not ready (it is live again). */
static bool
finish (struct move *m)
{
  char *final = final_table (m);
  struct progress pr;
  char left[256], *dst;

  snprintf (left, sizeof left, "%s is on the %s still", m->name,
            m->clone ? "clone" : "mirror");
  free (step (m, PROTO_CMD_LOAD, final, left));
  free (final);
  suspend_loaded (m, "move", left);
  read_progress (m, &pr);
  if (pr.in_sync == pr.regions && !pr.bad[0]) {
    snprintf (left, sizeof left, "%s is suspended with the linear table on "
              "%s loaded: 'nbdmsetup move --resume %s' retries", m->name,
              m->dst, m->name);
    free (step (m, PROTO_CMD_RESUME, NULL, left));
    /* What went live: another move of the same device (one left
     * running, say) may have cleared the slot in between, and the
     * resume then released the mirror.
     */
    dst = xstrdup (m->dst);
    read_state (m);
    if (!m->mirror && !m->clone) {
      if (!on_dest (m, dst))
        die ("move %s: the live table is neither the move's nor the linear "
             "table on %s (changed by someone else?)", m->name, dst);
      m->moved_to = dst;
      return true;
    }
    free (dst);
    return false;
  }
  snprintf (left, sizeof left, "%s is suspended on the %s: 'nbdmsetup "
            "move --resume %s' retries", m->name,
            m->clone ? "clone" : "mirror", m->name);
  free (step (m, PROTO_CMD_CLEAR, NULL, left));
  free (step (m, PROTO_CMD_RESUME, NULL, left));
  m->suspended = false;
  return false;
}

/* Step 2 then 3, until the linear table on DEST is live. */
static void
wait_and_finish (struct move *m)
{
  struct progress pr;

  for (;;) {
    char ev[32], ms[32];
    const char *args[3] = { m->name, ev, ms };
    double saved = opts.timeout;
    uint16_t status;
    char *p;

    if (m->suspended) {
      /* Killed in step 3: the check decides. */
      die_note = resume_note (m);
      if (finish (m))
        break;
      continue;
    }
    die_note = NULL;
    read_state (m);
    if (!m->mirror && !m->clone)
      die ("move %s: the live table is no longer the move's mirror (changed "
           "by someone else?)", m->name);
    die_note = resume_note (m);
    read_progress (m, &pr);
    show_progress (m, &pr);
    if (pr.bad[0]) {
      bool source = strncmp (pr.bad, "the source", 10) == 0;
      end_progress_line ();
      die_note = NULL;
      die ("move %s: %s: the move cannot finish (%s stays on the mirror%s: "
           "%s)", m->name, pr.bad, m->name,
           source ? "" : ", whose copy to DEST has stopped", source
           ? "see nbdmsetup status; 'nbdmsetup move --abort' refuses a "
           "source that missed writes" : "once DEST works, 'nbdmsetup move "
           "--resume' copies it all again; 'nbdmsetup move --abort' returns "
           "to the source");
    }
    if (pr.in_sync == pr.regions) {
      end_progress_line ();
      if (finish (m))
        break;
      continue;
    }
    if (interrupted ()) {
      end_progress_line ();
      die ("move %s: interrupted", m->name);
    }
    /* The resync's event, or POLL_MS: the reply within POLL_MS plus the
     * usual time.
     */
    snprintf (ev, sizeof ev, "%" PRIu64, m->event_nr);
    snprintf (ms, sizeof ms, "%d", POLL_MS);
    opts.timeout = POLL_MS / 1000.0;
    p = call_status (m->c, PROTO_CMD_WAIT, 0, 3, args, &status);
    opts.timeout = saved;
    if (status != PROTO_OK && status != PROTO_ERR_TIMEDOUT)
      die ("move %s: wait: %s", m->name, *p ? p : proto_status_name (status));
    free (p);
  }
  die_note = NULL;
  printf ("move %s: done: %s is on %s (0 %" PRIu64 " linear %s 0)\n",
          m->name, m->name, m->moved_to, m->size, m->moved_to);
  free (m->moved_to);
  m->moved_to = NULL;
}

static void
start (struct move *m, const char *dest)
{
  bool clone = opts.method && strcmp (opts.method, "clone") == 0;
  char *dst = dest_for_server (dest);
  char *t = clone ? clone_table (m, dst) : mirror_table (m, dst, true);
  char *left = xasprintf ("nothing changed: %s is on its table still",
                          m->name);
  uint64_t regions = 0, region = region_sectors ();

  if (m->suspended)
    die ("move %s: the device is suspended: resume it first (the copy "
         "runs while it is live)", m->name);
  if (m->inactive)
    die ("move %s: the device has an inactive table (nbdmsetup table "
         "--inactive %s): the move loads its last table there: clear it "
         "first (nbdmsetup clear %s)", m->name, m->name, m->name);
  if (interrupted ())
    die ("move %s: interrupted (%s)", m->name, left);
  /* The mirrors' legs 1 are DEST at the lines' own starts: another
   * line's source on DEST is copied over (the server checks the legs of
   * one mirror, not of different lines).
   */
  for (size_t i = 0; !clone && i < m->n; i++)
    if (same_dev (dest, m->segs[i].src))
      die ("move %s: line %zu is on %s already: the move lays the device "
           "out on DEST at its own offsets, over that line's data (%s)",
           m->name, i + 1, m->segs[i].src, left);
  for (size_t i = 0; i < m->n; i++) {
    uint64_t r = region;
    while (!clone && r > m->segs[i].len)    /* the mirror's cap */
      r >>= 1;
    regions += (m->segs[i].len + r - 1) / r;
  }
  printf ("move %s: %s %zu target%s (%" PRIu64 " regions) to %s\n",
          m->name, clone ? "cloning" : "mirroring", m->n,
          m->n == 1 ? "" : "s", regions, dst);
  fflush (stdout);
  free (step (m, PROTO_CMD_REPLACE, t, left));
  if (!clone)
    disk_log_settle (m, dst);
  free (left);
  free (t);
  free (dst);
}

/* Only a source that missed writes is no place to go back to. */
static bool
source_missed_writes (const struct progress *pr)
{
  return strncmp (pr->bad, "the source failed a write", 25) == 0 ||
    strncmp (pr->bad, "the source failed a flush", 25) == 0;
}

static void
do_abort (struct move *m)
{
  struct progress pr;
  char *t, left[256];

  if (m->clone)
    die ("move --abort %s: a clone move writes to DEST only: %s misses every "
         "write since the move began, so going back would lose them; finish "
         "it ('nbdmsetup move --resume %s'), or use --method mirror, which "
         "can go back, next time", m->name, m->segs[0].src, m->name);
  if (!m->mirror)
    die ("move --abort %s: the device is not being moved (its live table is "
         "not a move's mirror)", m->name);
  read_progress (m, &pr);
  if (source_missed_writes (&pr))
    die ("move --abort %s: %s: it may miss writes that DEST has; not "
         "returning to it (nbdmsetup status %s)", m->name, pr.bad, m->name);
  t = source_table (m);
  snprintf (left, sizeof left, "%s is on the mirror still", m->name);
  free (step (m, PROTO_CMD_LOAD, t, left));
  /* As finish does: suspended (no write in flight), the source checked
   * again, then the swap: a source failing between the first check and
   * the resume would otherwise be gone back to with writes missed.
   */
  suspend_loaded (m, "move --abort", left);
  read_progress (m, &pr);
  if (source_missed_writes (&pr)) {
    free (step (m, PROTO_CMD_CLEAR, NULL, left));
    free (step (m, PROTO_CMD_RESUME, NULL, left));
    die ("move --abort %s: %s: it may miss writes that DEST has; not "
         "returning to it (%s)", m->name, pr.bad, left);
  }
  free (step (m, PROTO_CMD_RESUME, NULL, left));
  printf ("move %s: aborted: %s is back on its source table\n", m->name,
          m->name);
  free (t);
}

void
run_move (struct conn *c, const struct verb *v, int argc, char **argv)
{
  struct move m = { .c = c, .name = argv[0] };
  const char *dest = argc == 2 ? argv[1] : NULL;
  bool resume = opts.given & O_RESUME, abort_ = opts.given & O_ABORT;
  sigset_t old;

  if (resume && abort_)
    die ("move: --resume and --abort: give one of them");
  if (abort_ && dest)
    die ("move --abort: NAME only (the source comes from the live table)");
  if (!resume && !abort_ && dest == NULL)
    die ("move %s: DEST missing (or --resume, --abort: see nbdmsetup --help)",
         m.name);
  if (abort_ && (opts.given & (O_LOG | O_REGION_SIZE | O_METHOD | O_METADATA)))
    die ("move --abort: --log, --region-size, --method and --metadata are "
         "for starting a move");
  if (opts.method && strcmp (opts.method, "mirror") != 0 &&
      strcmp (opts.method, "clone") != 0)
    die ("move --method: '%s' is neither mirror nor clone", opts.method);
  if (opts.metadata && !(opts.method && strcmp (opts.method, "clone") == 0))
    die ("move --metadata: for --method clone (the mirror's log is --log)");
  if (opts.log && opts.method && strcmp (opts.method, "clone") == 0)
    die ("move --log: for --method mirror (the clone's metadata is "
         "--metadata)");
  (void) region_sectors ();     /* a bad one before anything */

  sigemptyset (&held);
  sigaddset (&held, SIGINT);
  sigaddset (&held, SIGTERM);
  sigaddset (&held, SIGHUP);
  sigprocmask (SIG_BLOCK, &held, &old);

  read_state (&m);
  if (abort_)
    do_abort (&m);
  else if (!m.mirror && !m.clone) {
    if (dest == NULL)
      die ("move --resume %s: the device is not being moved (its live table "
           "is not a move's mirror)", m.name);
    if (on_dest (&m, dest))
      printf ("move %s: %s is on %s already\n", m.name, m.name, dest);
    else {
      start (&m, dest);
      wait_and_finish (&m);
    }
  }
  else {
    if (dest && !same_dev (dest, m.dst))
      die ("move %s: the device is being moved to %s, not %s: 'nbdmsetup "
           "move --resume %s' goes on with that move%s", m.name, m.dst, dest,
           m.name, m.clone ? "" : ", --abort ends it");
    if (opts.method && strcmp (opts.method, m.clone ? "clone" : "mirror"))
      die ("move %s: the move under way is a %s, not a %s: 'nbdmsetup move "
           "--resume %s' goes on with it", m.name,
           m.clone ? "clone" : "mirror", opts.method, m.name);
    if (m.clone && opts.metadata && !same_dev (opts.metadata, m.segs[0].meta))
      die ("move %s: the clone under way keeps its metadata on %s, not %s: "
           "'nbdmsetup move --resume %s' goes on with it", m.name,
           m.segs[0].meta, opts.metadata, m.name);
    if (m.mirror && (opts.given & (O_LOG | O_REGION_SIZE)))
      for (size_t i = 0; i < m.n; i++) {
        char *want = log_words (m.segs[i].len, region_sectors ());
        if (!same_log (want, m.segs[i].log))
          die ("move %s: the move under way has the log '%s' on line %zu, "
               "not '%s': 'nbdmsetup move --resume %s' goes on with it",
               m.name, m.segs[i].log, i + 1, want, m.name);
        free (want);
      }
    if (m.mirror && !m.suspended) {
      struct progress pr;
      read_progress (&m, &pr);
      if (pr.bad[0] && !(strncmp (pr.bad, "the source", 10) == 0)) {
        /* A DEST that failed: a fresh mirror copies it all again. */
        char *t = mirror_table (&m, m.dst, true);
        printf ("move %s: %s: copying again from the start\n", m.name,
                pr.bad);
        free (step (&m, PROTO_CMD_REPLACE, t, "the mirror is as it was"));
        disk_log_settle (&m, m.dst);
        free (t);
      }
    }
    wait_and_finish (&m);
  }
  free_segs (&m);
  sigprocmask (SIG_SETMASK, &old, NULL);
}

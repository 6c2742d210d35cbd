/* SPDX-License-Identifier: BSD-3-Clause */
/* Tiny unit-test helpers.  Every helper here and in unit-targets.h is
 * named unit_* (UNIT_* for macros); the assertions are CHECK, CHECKF and
 * CHECK_EQ, which count a failure and go on, and UNIT_EXIT ends main.
 */
#ifndef NBDMAPPER_UNIT_H
#define NBDMAPPER_UNIT_H
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int unit_failures;
#define CHECK(cond) do { if (!(cond)) { \
  fprintf (stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
  unit_failures++; } } while (0)
/* CHECK with a printf-style explanation printed on failure. */
#define CHECKF(cond, ...) do { if (!(cond)) { \
  fprintf (stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
  fprintf (stderr, __VA_ARGS__); fputc ('\n', stderr); \
  unit_failures++; } } while (0)
/* Integer equality, printing both sides on failure. */
#define CHECK_EQ(a, b) do { \
  long long _a = (long long) (a), _b = (long long) (b); \
  if (_a != _b) { \
    fprintf (stderr, "%s:%d: CHECK failed: %s == %s (%lld != %lld)\n", \
             __FILE__, __LINE__, #a, #b, _a, _b); \
    unit_failures++; } } while (0)
#define UNIT_EXIT() do { if (unit_failures) { \
  fprintf (stderr, "%d check(s) failed\n", unit_failures); return 1; } \
  return 0; } while (0)
/* Stop at once (setup failures): nothing sensible can follow. */
#define UNIT_FATAL(...) do { \
  fprintf (stderr, "%s:%d: fatal: ", __FILE__, __LINE__); \
  fprintf (stderr, __VA_ARGS__); fputc ('\n', stderr); \
  unit_cleanup (); exit (1); } while (0)

/* --- a scratch directory under $TMPDIR or /tmp, removed at exit ------- */

static char unit_dir[128];

__attribute__ ((unused))
static void
unit_rm_rf (const char *path)
{
  struct stat st;
  DIR *d;
  struct dirent *e;

  if (lstat (path, &st) == -1)
    return;
  if (!S_ISDIR (st.st_mode)) {
    unlink (path);
    return;
  }
  chmod (path, 0700);
  d = opendir (path);
  if (d) {
    while ((e = readdir (d)) != NULL) {
      char sub[4096];
      if (strcmp (e->d_name, ".") == 0 || strcmp (e->d_name, "..") == 0)
        continue;
      snprintf (sub, sizeof sub, "%s/%s", path, e->d_name);
      unit_rm_rf (sub);
    }
    closedir (d);
  }
  rmdir (path);
}

__attribute__ ((unused))
static void
unit_cleanup (void)
{
  if (unit_dir[0]) {
    unit_rm_rf (unit_dir);
    unit_dir[0] = '\0';
  }
}

/* Create the scratch directory (once); returns its path. */
__attribute__ ((unused))
static const char *
unit_tmpdir (void)
{
  if (unit_dir[0] == '\0') {
    /* Under TMPDIR: tests/unit-run.sh's scratch directory, whose
     * processes (servers named there) must be gone at the end.
     */
    const char *t = getenv ("TMPDIR");
    if (t == NULL || *t == '\0' ||
        (size_t) snprintf (unit_dir, sizeof unit_dir,
                           "%s/nbdmapper-unit-XXXXXX", t) >= sizeof unit_dir)
      strcpy (unit_dir, "/tmp/nbdmapper-unit-XXXXXX");
    if (mkdtemp (unit_dir) == NULL) {
      perror ("mkdtemp");
      exit (1);
    }
    atexit (unit_cleanup);
  }
  return unit_dir;
}

/* Path of name inside the scratch directory, in a static rotating buffer
 * (8 live results).
 */
__attribute__ ((unused))
static const char *
unit_path (const char *name)
{
  static char bufs[8][256];
  static unsigned n;
  char *p = bufs[n++ % 8];

  snprintf (p, sizeof bufs[0], "%s/%s", unit_tmpdir (), name);
  return p;
}

/* --- servers ----------------------------------------------------------- */

/* The process is gone, or a zombie (it has closed its sockets and files;
 * a daemon's parent, init, may be slow to reap it).  Reaps it if it is
 * our child.
 */
__attribute__ ((unused))
static bool
unit_gone (pid_t pid)
{
  char path[64], st[512], *p;
  FILE *f;
  bool zombie = false;

  if (waitpid (pid, NULL, WNOHANG) == pid)
    return true;
  if (kill (pid, 0) == -1 && errno == ESRCH)
    return true;
  snprintf (path, sizeof path, "/proc/%d/stat", (int) pid);
  f = fopen (path, "r");
  if (f == NULL)
    return true;
  if (fgets (st, sizeof st, f) && (p = strrchr (st, ')')) != NULL)
    zombie = p[1] == ' ' && p[2] == 'Z';
  fclose (f);
  return zombie;
}

/* Stop a server (our child or a daemon) with SIGTERM and wait until it
 * is gone.  One still there unit_stop_wait (10) s later hangs at exit: it
 * is killed with SIGKILL and the test fails (as tests/functions.sh's
 * stop_server).
 */
__attribute__ ((unused)) static int unit_stop_wait = 10;
__attribute__ ((unused))
static void
unit_stop_server (pid_t pid)
{
  if (kill (pid, SIGTERM) == -1)
    return;
  for (int i = 0; i < unit_stop_wait * 10; i++) {
    if (unit_gone (pid))
      return;
    usleep (100000);
  }
  fprintf (stderr, "pid %d did not exit within %d s of SIGTERM: "
           "killed with SIGKILL\n", (int) pid, unit_stop_wait);
  kill (pid, SIGKILL);
  while (!unit_gone (pid))
    usleep (10000);
  unit_failures++;
}

/* --- files ------------------------------------------------------------- */

/* Create (truncate) a file of size bytes holding data (or a sparse file
 * if data is NULL).
 */
__attribute__ ((unused))
static void
unit_write_file (const char *path, const void *data, size_t size)
{
  int fd = open (path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

  if (fd == -1)
    UNIT_FATAL ("%s: %s", path, strerror (errno));
  if (data) {
    const char *p = data;
    size_t left = size;
    while (left > 0) {
      ssize_t r = write (fd, p, left);
      if (r <= 0)
        UNIT_FATAL ("write %s: %s", path, strerror (errno));
      p += r, left -= r;
    }
  }
  else if (ftruncate (fd, size) == -1)
    UNIT_FATAL ("ftruncate %s: %s", path, strerror (errno));
  close (fd);
}

/* Read the whole file into a malloc'd buffer; *size set.  NULL on error. */
__attribute__ ((unused))
static char *
unit_read_file (const char *path, size_t *size)
{
  struct stat st;
  char *buf;
  int fd = open (path, O_RDONLY | O_CLOEXEC);
  size_t done = 0;

  if (fd == -1)
    return NULL;
  if (fstat (fd, &st) == -1) {
    close (fd);
    return NULL;
  }
  buf = malloc (st.st_size ? st.st_size : 1);
  if (buf == NULL)
    UNIT_FATAL ("out of memory");
  while (done < (size_t) st.st_size) {
    ssize_t r = pread (fd, buf + done, st.st_size - done, done);
    if (r <= 0) {
      free (buf);
      close (fd);
      return NULL;
    }
    done += r;
  }
  close (fd);
  *size = st.st_size;
  return buf;
}

/* Open file descriptors of this process (leak detector for backends). */
__attribute__ ((unused))
static int
unit_count_fds (void)
{
  DIR *d = opendir ("/proc/self/fd");
  struct dirent *e;
  int n = 0;

  if (d == NULL)
    return -1;
  while ((e = readdir (d)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir (d);
  return n - 1;                 /* the DIR's own descriptor */
}

/* --- patterns ------------------------------------------------------------ */

/* A byte that depends on (seed, position) in a way that makes misplaced
 * data stand out.
 */
__attribute__ ((unused))
static inline unsigned char
unit_pattern (uint64_t seed, uint64_t pos)
{
  uint64_t x = (pos + 1) * 0x9e3779b97f4a7c15ULL ^ (seed * 0xbf58476d1ce4e5b9ULL);
  x ^= x >> 31;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 29;
  return (unsigned char) x;
}

__attribute__ ((unused))
static void
unit_fill (void *buf, size_t len, uint64_t seed, uint64_t pos)
{
  unsigned char *p = buf;
  for (size_t i = 0; i < len; i++)
    p[i] = unit_pattern (seed, pos + i);
}

/* Index of the first differing byte, or -1 if equal. */
__attribute__ ((unused))
static long
unit_first_diff (const void *a, const void *b, size_t len)
{
  const unsigned char *x = a, *y = b;
  for (size_t i = 0; i < len; i++)
    if (x[i] != y[i])
      return (long) i;
  return -1;
}

__attribute__ ((unused))
static bool
unit_is_zero (const void *buf, size_t len)
{
  const unsigned char *p = buf;
  for (size_t i = 0; i < len; i++)
    if (p[i])
      return false;
  return true;
}

/* For mapper_debug: keeps the last line logged and counts the lines. */
__attribute__ ((unused)) static char unit_last_log[8192];
__attribute__ ((unused)) static unsigned unit_nr_logs;

__attribute__ ((unused, format (printf, 1, 2)))
static void
unit_capture_log (const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (unit_last_log, sizeof unit_last_log, fmt, ap);
  va_end (ap);
  unit_nr_logs++;
}

/* For mapper_log, which any thread may call: keeps every line (up to
 * the buffer's size), newline-separated.
 */
__attribute__ ((unused)) static char unit_events[65536];
__attribute__ ((unused)) static pthread_mutex_t unit_events_lock =
  PTHREAD_MUTEX_INITIALIZER;

__attribute__ ((unused, format (printf, 1, 2)))
static void
unit_capture_events (const char *fmt, ...)
{
  va_list ap;
  size_t used;

  pthread_mutex_lock (&unit_events_lock);
  used = strlen (unit_events);
  if (used + 2 < sizeof unit_events) {
    /* Room for the newline after the line, and the NUL. */
    va_start (ap, fmt);
    vsnprintf (unit_events + used, sizeof unit_events - used - 1, fmt, ap);
    va_end (ap);
    strcat (unit_events, "\n");
  }
  pthread_mutex_unlock (&unit_events_lock);
}

/* Has a line containing s been captured? */
__attribute__ ((unused))
static bool
unit_event_logged (const char *s)
{
  bool r;

  pthread_mutex_lock (&unit_events_lock);
  r = strstr (unit_events, s) != NULL;
  pthread_mutex_unlock (&unit_events_lock);
  return r;
}

__attribute__ ((unused))
static void
unit_events_clear (void)
{
  pthread_mutex_lock (&unit_events_lock);
  unit_events[0] = '\0';
  pthread_mutex_unlock (&unit_events_lock);
}

/* asprintf that cannot fail (for building table texts). */
__attribute__ ((unused, format (printf, 1, 2)))
static char *
unit_sprintf (const char *fmt, ...)
{
  va_list ap;
  char *s;

  va_start (ap, fmt);
  if (vasprintf (&s, fmt, ap) == -1)
    UNIT_FATAL ("out of memory");
  va_end (ap);
  return s;
}

#endif

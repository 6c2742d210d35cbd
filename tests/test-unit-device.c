/* SPDX-License-Identifier: BSD-3-Clause */
/* Engine control plane: reference counts across remove, rename (old
 * names stay valid), replace (event, tables, data path), remove --force
 * (error table for open clients), clear, info, table/status text, wait
 * with timeout, events from targets (target_event: only from the live
 * table, logged), message routing, held requests and waits given up
 * (mapper_request_abandoned), a drain and a held request side by side
 * (their wait conditions made by the first wait, none for an idle device),
 * the benchmarks' flush per target, targets registry.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <unistd.h>

#include "internal.h"
#include "unit.h"

static struct table *
parse (const char *text)
{
  struct mapper_err err = { "" };
  struct table *t;

  if (table_parse (text, "unit", &t, &err) < 0)
    UNIT_FATAL ("table_parse: %s", err.msg);
  return t;
}

struct waiter {
  struct device *dev;
  uint64_t after, now;
  int r;
};

static void *
wait_thread (void *p)
{
  struct waiter *w = p;
  struct mapper_err err;

  w->r = device_wait_event (w->dev, w->after, 10000, &w->now, &err);
  return NULL;
}

/* Reads the device's name without the registry lock, as every message
 * does: a wait that times out names the device.
 */
static void *
name_reader_thread (void *p)
{
  struct waiter *w = p;
  struct mapper_err err;

  for (int i = 0; i < 20; i++)
    if (device_wait_event (w->dev, w->after, 1, &w->now, &err) !=
        -ETIMEDOUT || strstr (err.msg, "timed out") == NULL)
      w->r = -1;
  return NULL;
}

static uint64_t
event_nr (struct device *dev)
{
  struct device_info info;

  device_get_info (dev, &info);
  return info.event_nr;
}

/* A target's event (target_event) goes to the device whose live table
 * it is, logged first through mapper_log; a table that is not live, only
 * loaded or not loaded at all, raises none and is named by its origin.
 */
static void
test_target_events (void)
{
  struct mapper_err err = { "" };
  struct device *dev;
  struct table *t;
  uint64_t now;

  mapper_log = unit_capture_events;
  unit_events_clear ();
  CHECK_EQ (device_create ("ev", &dev, &err), 0);
  device_load (dev, parse ("0 2048 zero\n"));
  CHECK_EQ (device_resume (dev, &err), 0);
  CHECK_EQ (event_nr (dev), 1);

  target_event (&dev->live->targets[0], "something %d happened", 42);
  CHECK_EQ (event_nr (dev), 2);
  CHECKF (unit_event_logged ("zero: device ev: something 42 happened\n"),
          "log '%s'", unit_events);
  CHECK_EQ (device_wait_event (dev, 1, 0, &now, &err), 0);
  CHECK_EQ (now, 2);

  /* It wakes a waiter. */
  {
    struct waiter w = { .dev = dev, .after = 2 };
    pthread_t th;
    pthread_create (&th, NULL, wait_thread, &w);
    target_event (&dev->live->targets[0], "wake up");
    pthread_join (th, NULL);
    CHECK_EQ (w.r, 0);
    CHECK_EQ (w.now, 3);
  }

  /* Not live: nothing raised, while parsed and while inactive; once
   * resumed it is the device's.
   */
  t = parse ("0 8 zero\n");
  target_event (&t->targets[0], "parsed");
  CHECK_EQ (event_nr (dev), 3);
  CHECKF (unit_event_logged ("zero: unit (not live): parsed\n"),
          "log '%s'", unit_events);
  device_load (dev, t);
  target_event (&t->targets[0], "inactive");
  CHECK_EQ (event_nr (dev), 3);
  CHECK_EQ (device_wait_event (dev, 3, 0, &now, &err), -ETIMEDOUT);
  CHECK_EQ (device_resume (dev, &err), 0);
  CHECK_EQ (event_nr (dev), 4);         /* the swap */
  target_event (&t->targets[0], "live now");
  CHECK_EQ (event_nr (dev), 5);
  CHECKF (unit_event_logged ("zero: device ev: live now\n"),
          "log '%s'", unit_events);

  /* Without a log hook the event still counts. */
  mapper_log = NULL;
  target_event (&t->targets[0], "quiet");
  CHECK_EQ (event_nr (dev), 6);
  device_destroy (dev);          /* unbinds the live table (table_free asserts) */
}

/* mapper_request_abandoned, as the plugin sets it: counts the questions
 * and gives up once told to.
 */
static _Atomic unsigned asked;
static _Atomic bool abandon;

static int
abandoned_hook (void)
{
  atomic_fetch_add (&asked, 1);
  return atomic_load (&abandon) ? -ESHUTDOWN : 0;
}

struct reader {
  struct device *dev;
  char buf[512];
  int r;
};

static void *
read_thread (void *p)
{
  struct reader *rd = p;

  rd->r = device_pread (rd->dev, rd->buf, sizeof rd->buf, 0, 0);
  return NULL;
}

/* Wait until a held request has asked the hook: it is waiting. */
static void
wait_asked (void)
{
  while (atomic_load (&asked) == 0)
    usleep (1000);
}

/* A request held by a suspended device, and a wait for an event without
 * a timeout, give up with -ESHUTDOWN once the hook says the server is
 * stopping or the client has gone (else a stop would wait for a resume
 * that never comes); until then a resume still releases them normally.
 * The fast path never asks.
 */
static void
test_given_up (const char *f)
{
  struct mapper_err err = { "" };
  struct device *dev;
  struct reader rd;
  uint64_t now;
  pthread_t th;
  char line[256], buf[512];

  mapper_request_abandoned = abandoned_hook;
  snprintf (line, sizeof line, "0 2048 linear %s 0\n", f);
  CHECK_EQ (device_create ("held", &dev, &err), 0);
  device_load (dev, parse (line));
  CHECK_EQ (device_resume (dev, &err), 0);
  for (int i = 0; i < 1000; i++)
    CHECK_EQ (device_pread (dev, buf, sizeof buf, 0, 0), 0);
  CHECK_EQ (atomic_load (&asked), 0);

  /* Held, then resumed: the read completes. */
  rd = (struct reader) { .dev = dev };
  CHECK_EQ (device_suspend (dev, false), 0);
  pthread_create (&th, NULL, read_thread, &rd);
  wait_asked ();
  CHECK_EQ (device_resume (dev, &err), 0);
  pthread_join (th, NULL);
  CHECK_EQ (rd.r, 0);

  /* Held, then given up: -ESHUTDOWN, and the device is still suspended
   * and whole (a resume serves the next request).
   */
  atomic_store (&asked, 0);
  rd = (struct reader) { .dev = dev };
  CHECK_EQ (device_suspend (dev, false), 0);
  pthread_create (&th, NULL, read_thread, &rd);
  wait_asked ();
  atomic_store (&abandon, true);
  pthread_join (th, NULL);
  CHECK_EQ (rd.r, -ESHUTDOWN);

  /* An event wait without a timeout: given up too. */
  CHECK_EQ (device_wait_event (dev, 1000, -1, &now, &err), -ESHUTDOWN);
  CHECK (strstr (err.msg, "device 'held': wait given up"));
  /* ... but one with a timeout still times out, abandoned or not, and an
   * event that has happened is reported at once.
   */
  CHECK_EQ (device_wait_event (dev, 1000, 0, &now, &err), -ETIMEDOUT);
  CHECK_EQ (device_wait_event (dev, 0, -1, &now, &err), 0);

  atomic_store (&abandon, false);
  CHECK_EQ (device_resume (dev, &err), 0);
  CHECK_EQ (device_pread (dev, buf, sizeof buf, 0, 0), 0);
  device_destroy (dev);
  mapper_request_abandoned = NULL;
}

/* The two waits of a suspend side by side: a request in flight on "up"
 * (held below it, at the gate of the suspended "low" it stacks on) keeps
 * a suspend of "up" draining, while a request that comes after the
 * suspend began is held at the gate of "up".  The in-flight one leaving
 * ends the drain, so the suspend completes while the held one stays held;
 * the resume of "up" lets it through.  Each thread asks the hook under a
 * name of its own, to tell which one waits where.
 */
static __thread int asker = -1;
static _Atomic unsigned asked_by[2];

static int
abandoned_by_hook (void)
{
  if (asker >= 0)
    atomic_fetch_add (&asked_by[asker], 1);
  return 0;
}

struct named_reader {
  struct reader rd;
  int name;                     /* index into asked_by */
  _Atomic bool done;
};

static void *
named_read_thread (void *p)
{
  struct named_reader *nr = p;

  asker = nr->name;
  read_thread (&nr->rd);
  atomic_store (&nr->done, true);
  return NULL;
}

struct suspender {
  struct device *dev;
  int r;
  _Atomic bool done;
};

static void *
suspend_thread (void *p)
{
  struct suspender *s = p;

  s->r = device_suspend (s->dev, true);
  atomic_store (&s->done, true);
  return NULL;
}

static void
test_drain_and_gate (const char *f)
{
  struct mapper_err err = { "" };
  struct device *low, *up;
  struct device_info info;
  struct named_reader a = { .rd.r = 1, .name = 0 };
  struct named_reader b = { .rd.r = 1, .name = 1 };
  struct suspender s = { .r = 1 };
  pthread_t ta, tb, ts;
  char line[256];
  unsigned seen;

  mapper_request_abandoned = abandoned_by_hook;
  snprintf (line, sizeof line, "0 2048 linear %s 0\n", f);
  CHECK_EQ (device_create ("low", &low, &err), 0);
  device_load (low, parse (line));
  CHECK_EQ (device_resume (low, &err), 0);
  CHECK_EQ (device_create ("up", &up, &err), 0);
  device_load (up, parse ("0 2048 linear mapper:low 0\n"));
  CHECK_EQ (device_resume (up, &err), 0);

  /* a: in flight on up, held at low's gate. */
  CHECK_EQ (device_suspend (low, false), 0);
  a.rd.dev = up;
  pthread_create (&ta, NULL, named_read_thread, &a);
  while (atomic_load (&asked_by[0]) == 0)
    usleep (1000);

  /* The suspend of up drains: it waits for a. */
  s.dev = up;
  pthread_create (&ts, NULL, suspend_thread, &s);
  do {
    usleep (1000);
    device_get_info (up, &info);
  } while (!info.suspended);

  /* b: held at up's gate. */
  b.rd.dev = up;
  pthread_create (&tb, NULL, named_read_thread, &b);
  while (atomic_load (&asked_by[1]) == 0)
    usleep (1000);
  CHECK (!atomic_load (&s.done) && !atomic_load (&a.done));

  /* low resumes: a completes, the drain ends, the suspend with it; b
   * stays held (it still asks) until up resumes.
   */
  CHECK_EQ (device_resume (low, &err), 0);
  pthread_join (ta, NULL);
  CHECK_EQ (a.rd.r, 0);
  pthread_join (ts, NULL);
  CHECK_EQ (s.r, 0);
  seen = atomic_load (&asked_by[1]);
  while (atomic_load (&asked_by[1]) == seen)
    usleep (1000);
  CHECK (!atomic_load (&b.done));
  device_get_info (up, &info);
  CHECK (info.suspended);
  CHECK_EQ (device_resume (up, &err), 0);
  pthread_join (tb, NULL);
  CHECK_EQ (b.rd.r, 0);
  /* Both waited: the first wait made the conditions, kept after. */
  CHECK (low->waits != NULL && up->waits != NULL);

  device_destroy (up);
  device_destroy (low);
  mapper_request_abandoned = NULL;
}

/* -D mapper.flush_per_target=1 (benchmarks): a device created in the
 * mode flushes once per target, not once per distinct backend, and still
 * reports a write lost below it to each observer once.  Counted on
 * "lower", whose own flushes say "lower: flush" (-D mapper.io=1): three
 * targets of "pert" stacked on it flush it three times, dirty or not;
 * "perb", created with the mode off, once when dirty and not when clean.
 */
static _Atomic unsigned lower_flushes;

static void
count_lower_flushes (const char *fmt, ...)
{
  char line[256];
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (line, sizeof line, fmt, ap);
  va_end (ap);
  if (strncmp (line, "lower: flush ->", 15) == 0)
    atomic_fetch_add (&lower_flushes, 1);
}

static void
test_flush_per_target (const char *f)
{
  static const char upper[] =
    "0 512 linear mapper:lower 0\n"
    "512 512 linear mapper:lower 512\n"
    "1024 1024 linear mapper:lower 1024\n";
  struct mapper_err err = { "" };
  struct device *lower, *pert, *perb;
  char line[256];

  snprintf (line, sizeof line, "0 2048 linear %s 0\n", f);
  CHECK_EQ (device_create ("lower", &lower, &err), 0);
  device_load (lower, parse (line));
  CHECK_EQ (device_resume (lower, &err), 0);
  mapper_flush_per_target = true;
  CHECK_EQ (device_create ("pert", &pert, &err), 0);
  mapper_flush_per_target = false;     /* chosen at create: pert keeps it */
  device_load (pert, parse (upper));
  CHECK_EQ (device_resume (pert, &err), 0);
  CHECK_EQ (device_create ("perb", &perb, &err), 0);
  device_load (perb, parse (upper));
  CHECK_EQ (device_resume (perb, &err), 0);

  mapper_debug = count_lower_flushes;
  mapper_trace_io = true;
  CHECK_EQ (device_pwrite (perb, "x", 1, 0, 0), 0);
  atomic_store (&lower_flushes, 0);
  CHECK_EQ (device_flush (perb, 0), 0);
  CHECK_EQ (atomic_load (&lower_flushes), 1);
  atomic_store (&lower_flushes, 0);
  CHECK_EQ (device_flush (perb, 0), 0);
  CHECK_EQ (atomic_load (&lower_flushes), 0);
  atomic_store (&lower_flushes, 0);
  CHECK_EQ (device_flush (pert, 0), 0);
  CHECK_EQ (atomic_load (&lower_flushes), 3);
  mapper_trace_io = false;
  mapper_debug = NULL;

  /* A write lost below: the next flush of each observer fails once. */
  for (int i = 0; i < 2; i++) {
    struct device *dev = i == 0 ? pert : perb;
    _Atomic uint64_t seen;

    atomic_init (&seen, device_errseq_sample ());
    CHECK_EQ (device_pwrite (dev, "y", 1, 0, 0), 0);
    backend_writes_lost (lower->live->backends.ptr[0]);
    CHECKF (device_flush_errseq (dev, 0, &seen) == -EIO, "%s",
            device_name (dev));
    CHECKF (device_flush_errseq (dev, 0, &seen) == 0, "%s",
            device_name (dev));
  }

  device_destroy (pert);
  device_destroy (perb);
  device_destroy (lower);
}

int
main (void)
{
  struct mapper_err err = { "" };
  struct device_info info;
  struct device *dev, *ref, *other;
  char line[256], buf[4096], *text, *reply = NULL;
  const char *f = unit_path ("f.img");
  uint64_t now;
  unsigned v[3];
  int r;

  /* A held request never given up would hang the test: fail instead. */
  alarm (120);
  unit_write_file (f, NULL, 1 << 20);

  /* create: suspended, no table; load + resume: live, event 1. */
  CHECK_EQ (device_create ("d", &dev, &err), 0);
  device_get_info (dev, &info);
  CHECK (info.suspended && !info.live && !info.inactive);
  snprintf (line, sizeof line, "0 2048 linear %s 0\n", f);
  device_load (dev, parse (line));
  device_get_info (dev, &info);
  CHECK (info.inactive && !info.live);
  text = device_table_text (dev, true, &r);
  CHECK (text && strcmp (text, line) == 0);
  free (text);
  CHECK_EQ (device_resume (dev, &err), 0);
  device_get_info (dev, &info);
  CHECK (!info.suspended && info.live && !info.inactive);
  CHECK_EQ (info.event_nr, 1);
  CHECK_EQ (info.size, 1 << 20);
  /* An idle device costs its name and its table: no wait conditions
   * (its resume's drain had nothing to wait for), and a table that
   * flushes each of its backends keeps no list of them of its own.
   */
  CHECK (dev->waits == NULL);
  CHECK (dev->live->flushed.ptr == dev->live->backends.ptr &&
         dev->live->flushed.len == 1);

  /* clear drops only the inactive slot. */
  device_load (dev, parse ("0 8 zero\n"));
  device_clear (dev);
  device_get_info (dev, &info);
  CHECK (info.live && !info.inactive);

  /* replace: new table live, event bumped, data path works. */
  snprintf (line, sizeof line, "0 1024 linear %s 0\n1024 1024 linear %s "
            "1024\n", f, f);
  CHECK_EQ (device_replace (dev, parse (line), NULL, &err), 0);
  device_get_info (dev, &info);
  CHECK_EQ (info.event_nr, 2);
  CHECK_EQ (info.nr_targets, 2);
  CHECK_EQ (device_pwrite (dev, "abc", 3, 524288, 0), 0);
  CHECK_EQ (device_pread (dev, buf, 3, 524288, 0), 0);
  CHECK (memcmp (buf, "abc", 3) == 0);
  text = device_status_text (dev, &r);
  CHECK (text && strncmp (text, "0 1024 linear", 13) == 0);
  free (text);

  /* wait: times out without an event, wakes on one. */
  CHECK_EQ (device_wait_event (dev, 2, 10, &now, &err), -ETIMEDOUT);
  CHECK (strstr (err.msg, "timed out"));
  {
    struct waiter w = { .dev = dev, .after = 2 };
    pthread_t th;
    pthread_create (&th, NULL, wait_thread, &w);
    CHECK_EQ (device_replace (dev, parse ("0 2048 zero\n"), NULL, &err), 0);
    pthread_join (th, NULL);
    CHECK_EQ (w.r, 0);
    CHECK_EQ (w.now, 3);
  }
  CHECK_EQ (device_wait_event (dev, 0, 0, &now, &err), 0);

  /* message: no target takes one. */
  CHECK_EQ (device_message (dev, 0, 1, (char *[]) { "x", NULL }, &reply,
                            &err), -ENOTSUP);
  CHECK (strstr (err.msg, "does not accept messages"));
  CHECK_EQ (device_message (dev, 99999, 1, (char *[]) { "x", NULL },
                            &reply, &err), -EINVAL);
  CHECK (strstr (err.msg, "beyond the end"));

  /* rename: the old name pointer stays valid; lookups follow; a thread
   * naming the device meanwhile reads one name or the other.
   */
  const char *oldname = device_name (dev);
  CHECK_EQ (device_create ("e", &other, &err), 0);
  CHECK_EQ (device_rename (dev, "e", &err), -EEXIST);
  CHECK_EQ (device_rename (dev, "bad/name", &err), -EINVAL);
  {
    struct waiter w = { .dev = dev, .after = 1000 };
    pthread_t th;
    pthread_create (&th, NULL, name_reader_thread, &w);
    usleep (5000);
    CHECK_EQ (device_rename (dev, "d2", &err), 0);
    pthread_join (th, NULL);
    CHECK_EQ (w.r, 0);
  }
  CHECK (strcmp (oldname, "d") == 0);
  CHECK (strcmp (device_name (dev), "d2") == 0);
  CHECK (device_get ("d") == NULL);
  ref = device_get ("d2");
  CHECK (ref == dev);
  device_put (ref);

  /* uuid: unique. */
  CHECK_EQ (device_set_uuid (dev, "U1", &err), 0);
  CHECK_EQ (device_set_uuid (other, "U1", &err), -EEXIST);
  CHECK_EQ (device_set_uuid (other, "a b", &err), -EINVAL);

  /* remove: busy while open; --force gives the open client EIO and the
   * device lives on until the last reference goes.
   */
  ref = device_open_conn ("d2");
  CHECK (ref == dev);
  CHECK_EQ (device_remove (dev, false, &err), -EBUSY);
  CHECK (strstr (err.msg, "open by 1 connection"));
  CHECK_EQ (device_remove (dev, true, &err), 0);
  CHECK (device_get ("d2") == NULL);
  CHECK_EQ (device_pread (ref, buf, 512, 0, 0), -EIO);
  text = device_table_text (ref, false, &r);
  CHECK (text && strcmp (text, "0 2048 error\n") == 0);
  free (text);
  CHECK_EQ (device_wait_event (ref, 100, -1, &now, &err), -ENOENT);
  device_close_conn (ref);            /* frees it (ASan/valgrind would tell) */

  /* remove of an idle device wakes a wait for its events (which holds a
   * reference, as a control command does).
   */
  {
    struct waiter w = { .dev = device_get ("e"), .after = 1000 };
    pthread_t th;
    CHECK (w.dev == other);
    pthread_create (&th, NULL, wait_thread, &w);
    usleep (10000);             /* most likely waiting by now */
    CHECK_EQ (device_remove (other, false, &err), 0);
    pthread_join (th, NULL);
    CHECK_EQ (w.r, -ENOENT);
    device_put (w.dev);
  }
  CHECK (device_get ("e") == NULL);
  CHECK_EQ (device_count (), 0);

  /* The name and uuid indexes, past several rehashes: every device is
   * found by name, renames move the key, uuids stay unique, and removal
   * in any order leaves nothing behind.
   */
  {
    enum { N = 3000 };
    static struct device *devs[N];
    char name[64], uuid[64];

    for (int i = 0; i < N; i++) {
      snprintf (name, sizeof name, "scale-%d", i);
      CHECK_EQ (device_create (name, &devs[i], &err), 0);
      if (i % 3 == 0) {
        snprintf (uuid, sizeof uuid, "UUID-%d", i);
        CHECK_EQ (device_set_uuid (devs[i], uuid, &err), 0);
      }
    }
    CHECK_EQ (device_count (), N);
    CHECK_EQ (device_create ("scale-1234", &dev, &err), -EEXIST);
    CHECK_EQ (device_set_uuid (devs[1], "UUID-3", &err), -EEXIST);
    CHECK_EQ (device_set_uuid (devs[3], "UUID-3", &err), 0);   /* same */
    CHECK_EQ (device_set_uuid (devs[3], "UUID-new", &err), 0);
    CHECK_EQ (device_set_uuid (devs[1], "UUID-3", &err), 0);   /* freed */
    CHECK_EQ (device_rename (devs[7], "renamed-7", &err), 0);
    CHECK (device_lookup ("scale-7") == NULL);
    CHECK (device_lookup ("renamed-7") == devs[7]);
    CHECK_EQ (device_rename (devs[8], "renamed-7", &err), -EEXIST);
    for (int i = 0; i < N; i++) {
      if (i == 7)
        continue;
      snprintf (name, sizeof name, "scale-%d", i);
      CHECKF (device_lookup (name) == devs[i], "%s", name);
    }
    /* Odd ones first, then the rest from the front. */
    for (int i = 1; i < N; i += 2)
      device_destroy (devs[i]);
    CHECK (device_lookup ("scale-1") == NULL);
    CHECK (device_lookup ("scale-2") == devs[2]);
    CHECK_EQ (device_create ("x", &dev, &err), 0);
    CHECK_EQ (device_set_uuid (dev, "UUID-3", &err), 0);  /* 1 is gone */
    device_destroy (dev);
    for (int i = 0; i < N; i += 2)
      device_destroy (devs[i]);
    CHECK_EQ (device_count (), 0);
    CHECK (device_lookup ("scale-0") == NULL);
  }

  test_target_events ();
  test_given_up (f);
  test_drain_and_gate (f);
  test_flush_per_target (f);

  /* targets registry. */
  CHECK (target_type_count () >= 4);
  CHECK (strcmp (target_type_info (0, v), "linear") == 0);
  CHECK (target_type_info (target_type_count (), v) == NULL);

  unit_cleanup ();
  UNIT_EXIT ();
}

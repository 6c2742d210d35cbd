/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit test: a multipath whose watchdog and path checker threads cannot
 * start is not resumed.  pthread_create is made to fail (EAGAIN, as at
 * a thread limit) for the first resume after engine_start: the resume
 * fails naming the threads, the device stays without a live table, and
 * a later resume, with threads to be had, works.  Its own program: the
 * threads start once per engine.
 *
 * Then the watchdog starts but the checker does not: the watchdog is
 * stopped and joined without the threads' lock.  Meanwhile (in that
 * join, made here to run them) another resume must not succeed without
 * the threads, and an engine_stop must stay stopped: no thread may
 * start after it.
 */
#include <config.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "unit.h"
#include "unit-targets.h"

#define S 512ULL

static _Atomic bool no_threads;
static _Atomic unsigned refused;
/* > 0: pthread_create calls to let through before failing one. */
static _Atomic int fail_after;
static _Atomic unsigned created;
/* Run in the next pthread_join (the aborted watchdog's). */
static void (*in_join) (void);

/* The process's pthread_create, failing while no_threads is set. */
int
pthread_create (pthread_t *thread, const pthread_attr_t *attr,
                void *(*fn) (void *), void *arg)
{
  static int (*next) (pthread_t *, const pthread_attr_t *,
                      void *(*) (void *), void *);

  if (atomic_load (&no_threads) ||
      (atomic_load (&fail_after) > 0 &&
       atomic_fetch_sub (&fail_after, 1) == 1)) {
    atomic_fetch_add (&refused, 1);
    return EAGAIN;
  }
  if (next == NULL &&
      (next = (int (*) (pthread_t *, const pthread_attr_t *,
                        void *(*) (void *), void *))
       dlsym (RTLD_NEXT, "pthread_create")) == NULL)
    return ENOSYS;
  atomic_fetch_add (&created, 1);
  return next (thread, attr, fn, arg);
}

int
pthread_join (pthread_t thread, void **ret)
{
  static int (*next) (pthread_t, void **);
  void (*fn) (void) = in_join;

  in_join = NULL;
  if (fn)
    fn ();
  if (next == NULL &&
      (next = (int (*) (pthread_t, void **))
       dlsym (RTLD_NEXT, "pthread_join")) == NULL)
    return ENOSYS;
  return next (thread, ret);
}

static char *path_a;
static int other_r;
static struct mapper_err other_err;

/* Load and resume a one-path multipath device NAME. */
static struct device *
mpath_device (const char *name, int *r, struct mapper_err *err)
{
  char *text = unit_sprintf ("0 256 multipath 0 0 1 1 round-robin 0 1 0 %s",
                             path_a);
  struct device *dev;
  struct table *t;

  CHECK_EQ (table_parse (text, "mp.table", &t, err), 0);
  CHECK_EQ (device_create (name, &dev, err), 0);
  CHECK_EQ (device_load (dev, t), 0);
  *r = device_resume (dev, err);
  free (text);
  return dev;
}

static struct device *other;

static void
resume_other (void)
{
  other = mpath_device ("other", &other_r, &other_err);
}

static void
stop_engine (void)
{
  engine_stop ();
}

/* A new engine; a multipath's resume in which the watchdog starts and
 * the checker does not, fn running while the watchdog is joined: the
 * resume fails.
 */
static struct device *
checker_fails (void (*fn) (void))
{
  struct mapper_err err = { "" };
  struct device *dev;
  int r;

  CHECK_EQ (engine_start (&err), 0);
  atomic_store (&fail_after, 2);
  in_join = fn;
  dev = mpath_device ("mp", &r, &err);
  CHECK_EQ (r, -EAGAIN);
  CHECK (in_join == NULL);
  return dev;
}

int
main (void)
{
  struct mapper_err err = { "" };
  struct device_info info;
  struct device *dev;
  struct table *t;
  static unsigned char file[256 * S];
  unsigned char buf[S];
  char *a, *text;
  int r;

  unit_fill (file, sizeof file, 4, 0);
  unit_write_file (unit_path ("a"), file, sizeof file);
  a = realpath (unit_path ("a"), NULL);
  if (a == NULL)
    UNIT_FATAL ("realpath");
  CHECK_EQ (engine_start (&err), 0);

  text = unit_sprintf ("0 256 multipath 0 0 1 1 round-robin 0 1 0 %s", a);
  CHECK_EQ (table_parse (text, "mp.table", &t, &err), 0);
  CHECK_EQ (device_create ("mp", &dev, &err), 0);
  CHECK_EQ (device_load (dev, t), 0);
  atomic_store (&no_threads, true);
  r = device_resume (dev, &err);
  atomic_store (&no_threads, false);
  CHECK_EQ (r, -EAGAIN);
  CHECK (atomic_load (&refused) > 0);
  CHECKF (strstr (err.msg, "device 'mp': multipath target at sector 0: "
                  "cannot start the path checker and watchdog threads: ")
          != NULL, "error: %s", err.msg);
  device_get_info (dev, &info);
  CHECK (!info.live);
  CHECK (info.inactive);

  /* Threads to be had: the same table resumes, and serves. */
  CHECK_EQ (device_resume (dev, &err), 0);
  device_get_info (dev, &info);
  CHECK (info.live);
  CHECK_EQ (device_pread (dev, buf, S, 0, 0), 0);
  CHECK (memcmp (buf, file, S) == 0);
  device_destroy (dev);
  engine_stop ();

  /* The checker cannot start; a resume meanwhile is refused too. */
  path_a = a;
  dev = checker_fails (resume_other);
  CHECKF (other_r == -EAGAIN, "a resume while the watchdog is joined: %d "
          "(0: it runs without the threads)", other_r);
  CHECKF (strstr (other_err.msg, "cannot start the path checker and "
                  "watchdog threads") != NULL, "error: %s", other_err.msg);
  device_get_info (other, &info);
  CHECK (!info.live);
  device_destroy (other);
  /* Both start now. */
  r = atomic_load (&created);
  CHECK_EQ (device_resume (dev, &err), 0);
  CHECK_EQ ((int) atomic_load (&created), r + 2);
  device_destroy (dev);
  engine_stop ();

  /* The checker cannot start, and the engine stops meanwhile: it stays
   * stopped (a resume starts no thread nobody would join).
   */
  dev = checker_fails (stop_engine);
  r = atomic_load (&created);
  other = mpath_device ("other", &other_r, &other_err);
  CHECK_EQ (other_r, 0);
  CHECKF ((int) atomic_load (&created) == r, "%u threads started after "
          "engine_stop", atomic_load (&created) - r);
  device_destroy (other);
  device_destroy (dev);
  free (text);
  free (a);
  UNIT_EXIT ();
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit test: a multipath whose watchdog and path checker threads cannot
 * start is not resumed.  pthread_create is made to fail (EAGAIN, as at
 * a thread limit) for the first resume after engine_start: the resume
 * fails naming the threads, the device stays without a live table, and
 * a later resume, with threads to be had, works.  Its own program: the
 * threads start once per engine.
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

/* The process's pthread_create, failing while no_threads is set. */
int
pthread_create (pthread_t *thread, const pthread_attr_t *attr,
                void *(*fn) (void *), void *arg)
{
  static int (*next) (pthread_t *, const pthread_attr_t *,
                      void *(*) (void *), void *);

  if (atomic_load (&no_threads)) {
    atomic_fetch_add (&refused, 1);
    return EAGAIN;
  }
  if (next == NULL &&
      (next = (int (*) (pthread_t *, const pthread_attr_t *,
                        void *(*) (void *), void *))
       dlsym (RTLD_NEXT, "pthread_create")) == NULL)
    return ENOSYS;
  return next (thread, attr, fn, arg);
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
  free (text);
  free (a);
  UNIT_EXIT ();
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* Inspecting a device (its capabilities, info, table and status text,
 * backends), routing a message to a target of its live table, and its
 * events (dm's event counter and wait).
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

bool
device_get_caps (struct device *dev, struct mapper_caps *caps)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->lock);
  if (dev->live == NULL)
    return false;
  *caps = dev->live->caps;
  return true;
}

size_t
device_summary (struct device *dev, char *buf, size_t len)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->lock);
  int n;

  if (dev->live == NULL)
    return snprintf (buf, len, "no table");
  n = snprintf (buf, len, "%" PRIu64 " bytes: ", dev->live->caps.size);
  if (n < 0)
    return 0;
  return n + table_summary (dev->live, (size_t) n < len ? buf + n : NULL,
                            (size_t) n < len ? len - n : 0);
}

size_t
device_status (struct device *dev, char *buf, size_t len)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->lock);

  if (dev->live == NULL) {
    if (len)
      buf[0] = '\0';
    return 0;
  }
  return table_status (dev->live, buf, len);
}

void
device_get_info (struct device *dev, struct device_info *info)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->lock);

  info->suspended = atomic_load (&dev->suspended);
  info->live = dev->live != NULL;
  info->inactive = dev->inactive != NULL;
  info->open_count = atomic_load (&dev->open_count);
  info->event_nr = atomic_load (&dev->event_nr);
  info->nr_targets = dev->live ? dev->live->nr_targets : 0;
  info->size = dev->live ? dev->live->caps.size : 0;
  info->read_only = dev->live && !dev->live->caps.can_write;
  info->live_ro = dev->live && dev->live->read_only;
  info->inactive_ro = dev->inactive && dev->inactive->read_only;
}

static char *
slot_text (struct device *dev, bool inactive, enum status_type type, int *r)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->lock);
  const struct table *t = inactive ? dev->inactive : dev->live;
  size_t n;
  char *buf;

  if (t == NULL) {
    buf = strdup ("");
    goto out;
  }
  n = type == STATUSTYPE_TABLE ? table_format (t, NULL, 0)
    : table_status (t, NULL, 0);
  buf = malloc (n + 1);
  if (buf) {
    if (type == STATUSTYPE_TABLE)
      table_format (t, buf, n + 1);
    else
      table_status (t, buf, n + 1);
  }
 out:
  if (buf == NULL)
    *r = -ENOMEM;
  return buf;
}

char *
device_table_text (struct device *dev, bool inactive, int *r)
{
  return slot_text (dev, inactive, STATUSTYPE_TABLE, r);
}

char *
device_status_text (struct device *dev, int *r)
{
  return slot_text (dev, false, STATUSTYPE_INFO, r);
}

char *
device_backends_text (struct device *dev, int *r)
{
  struct backend **bes = NULL;
  size_t nr = 0, len = 0;
  char *buf = NULL;
  FILE *fp;

  /* Take references under the lock, ask the backends without it: an NBD
   * backend's state comes from the I/O loop thread.
   */
  pthread_mutex_lock (&dev->lock);
  if (dev->live) {
    nr = table_nr_backends (dev->live);
    bes = malloc (nr * sizeof *bes + 1);
    if (bes == NULL) {
      pthread_mutex_unlock (&dev->lock);
      *r = -ENOMEM;
      return NULL;
    }
    for (size_t i = 0; i < nr; i++) {
      bes[i] = dev->live->backends.ptr[i];
      backend_hold (bes[i]);
    }
  }
  pthread_mutex_unlock (&dev->lock);

  fp = open_memstream (&buf, &len);
  for (size_t i = 0; fp && i < nr; i++) {
    char state[512] = "open";
    if (bes[i]->ops->status)
      bes[i]->ops->status (bes[i], state, sizeof state);
    fprintf (fp, "%s\t%s\t%s\n", bes[i]->name, bes[i]->ops->kind, state);
  }
  for (size_t i = 0; i < nr; i++)
    backend_put (bes[i]);
  free (bes);
  if (fp == NULL || fclose (fp) == EOF) {
    free (buf);
    *r = -ENOMEM;
    return NULL;
  }
  return buf;
}

int
device_message (struct device *dev, uint64_t sector, unsigned argc,
                char **argv, char **reply, struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->lock);
  struct device_hook h;
  struct target *ti;
  char buf[4096] = "";
  int r;

  if (dev->live == NULL) {
    mapper_err_set (err, "device '%s' has no live table", dev->name);
    return -ENXIO;
  }
  /* A message (a crypt key wiped) must not change the table under the
   * requests a suspend is waiting for.
   */
  if ((r = device_busy_locked (dev, err)) < 0)
    return r;
  if (sector >= dev->live->caps.size >> MAPPER_SECTOR_SHIFT) {
    mapper_err_set (err, "sector %" PRIu64 " is beyond the end of device "
                    "'%s' (%" PRIu64 " sectors)", sector, dev->name,
                    dev->live->caps.size >> MAPPER_SECTOR_SHIFT);
    return -EINVAL;
  }
  ti = &dev->live->targets[table_find_target (dev->live,
                                              sector << MAPPER_SECTOR_SHIFT)];
  if (ti->type->message == NULL) {
    mapper_err_set (err, "target '%s' at sector %" PRIu64 " does not "
                    "accept messages", ti->type->name,
                    ti->begin >> MAPPER_SECTOR_SHIFT);
    return -ENOTSUP;
  }
  /* Its target may wait without the locks (target_wait_begin). */
  device_hook_enter (dev, "message", &h);
  r = ti->type->message (ti, argc, argv, buf, sizeof buf, err);
  device_hook_leave (&h);
  if (r < 0)
    return r;
  *reply = strdup (buf);
  if (*reply == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  return r;
}

/* One lock and condition for every device's events (the waits use
 * pthread_cond_clockwait on CLOCK_MONOTONIC, whatever the condition's
 * clock): a device costs no 88 bytes of them, and a waiter woken by
 * another device's event looks at its own counter and sleeps again.
 */
pthread_mutex_t device_events_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t device_events_cond = PTHREAD_COND_INITIALIZER;

void
device_event (struct device *dev)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&device_events_lock);

  atomic_fetch_add (&dev->event_nr, 1);
  pthread_cond_broadcast (&device_events_cond);
}

int
device_wait_event (struct device *dev, uint64_t event_nr,
                   int64_t timeout_ms, uint64_t *now,
                   struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&device_events_lock);
  uint64_t deadline = 0, asked = 0;

  /* A timeout past the clock's range (some 500 years) is none. */
  if (timeout_ms >= 0 &&
      (__builtin_mul_overflow ((uint64_t) timeout_ms, 1000000, &deadline) ||
       __builtin_add_overflow (deadline, monotonic_ns (), &deadline)))
    deadline = 0;
  while (atomic_load (&dev->event_nr) <= event_nr &&
         !atomic_load (&dev->removed) &&
         !(deadline && monotonic_ns () >= deadline))
    /* Without a timeout too: not past a stop or the client's going. */
    if (request_wait (&device_events_cond, &device_events_lock, deadline,
                      &asked) < 0) {
      *now = atomic_load (&dev->event_nr);
      mapper_err_set (err, "device '%s': wait given up: the server is "
                      "stopping or the client has gone", dev->name);
      return -ESHUTDOWN;
    }
  *now = atomic_load (&dev->event_nr);
  if (*now > event_nr)
    return 0;
  if (atomic_load (&dev->removed)) {
    mapper_err_set (err, "device '%s' was removed", dev->name);
    return -ENOENT;
  }
  mapper_err_set (err, "device '%s': timed out waiting for an event after "
                  "%" PRIu64 " (now %" PRIu64 ")", dev->name, event_nr, *now);
  return -ETIMEDOUT;
}

/* Named devices: the registry, live + inactive table slots, suspend (drain
 * in-flight requests) and resume (swap the slots atomically).
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

DEFINE_VECTOR_TYPE (device_vector, struct device *);

/* Protects the registry (not the devices in it).  Taken when devices are
 * created, removed, listed or looked up at connection open: never per
 * request.
 */
static pthread_mutex_t devices_lock = PTHREAD_MUTEX_INITIALIZER;
static device_vector devices;          /* in creation order */

int
device_check_name (const char *name, struct mapper_err *err)
{
  size_t len = strlen (name);

  if (len == 0) {
    mapper_err_set (err, "device name is empty");
    return -EINVAL;
  }
  if (len > MAPPER_NAME_MAX) {
    mapper_err_set (err, "device name '%.32s...' is %zu bytes, longer than "
                    "%d", name, len, MAPPER_NAME_MAX);
    return -ENAMETOOLONG;
  }
  for (const unsigned char *p = (const unsigned char *) name; *p; p++) {
    if (*p == '/') {
      mapper_err_set (err, "device name '%s' contains '/'", name);
      return -EINVAL;
    }
    if (*p < 0x20 || *p == 0x7f) {
      mapper_err_set (err, "device name contains control character 0x%02x "
                      "at byte %zu", *p, (size_t) (p - (const unsigned char *) name));
      return -EINVAL;
    }
  }
  if (strcmp (name, ".") == 0 || strcmp (name, "..") == 0) {
    mapper_err_set (err, "device name '%s' is not allowed", name);
    return -EINVAL;
  }
  if (strcmp (name, MAPPER_RESERVED_NAME) == 0) {
    mapper_err_set (err, "device name '%s' is reserved for the control "
                    "export", name);
    return -EINVAL;
  }
  return 0;
}

static struct device *
lookup_locked (const char *name)
{
  for (size_t i = 0; i < devices.len; i++)
    if (strcmp (devices.ptr[i]->name, name) == 0)
      return devices.ptr[i];
  return NULL;
}

struct device *
device_lookup (const char *name)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);
  return lookup_locked (name);
}

size_t
device_count (void)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);
  return devices.len;
}

struct device *
device_nth (size_t i)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);
  return i < devices.len ? devices.ptr[i] : NULL;
}

/* A new device has no table and is suspended, as a dm device created
 * without one: load + resume make it live.
 */
int
device_create (const char *name, struct device **out, struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);
  struct device *dev;
  int r;

  if ((r = device_check_name (name, err)) < 0)
    return r;
  if (lookup_locked (name)) {
    mapper_err_set (err, "device '%s' already exists", name);
    return -EEXIST;
  }
  dev = calloc (1, sizeof *dev);
  if (dev == NULL || (dev->name = strdup (name)) == NULL ||
      device_vector_append (&devices, dev) == -1) {
    if (dev)
      free (dev->name);
    free (dev);
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  pthread_mutex_init (&dev->lock, NULL);
  pthread_cond_init (&dev->cond, NULL);
  atomic_init (&dev->inflight, 0);
  atomic_init (&dev->suspended, true);
  atomic_init (&dev->open_count, 0);
  *out = dev;
  return 0;
}

void
device_destroy (struct device *dev)
{
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);
    for (size_t i = 0; i < devices.len; i++)
      if (devices.ptr[i] == dev) {
        device_vector_remove (&devices, i);
        break;
      }
    if (devices.len == 0)
      device_vector_reset (&devices);
  }
  table_free (dev->live);
  table_free (dev->inactive);
  pthread_cond_destroy (&dev->cond);
  pthread_mutex_destroy (&dev->lock);
  free (dev->name);
  free (dev);
}

const char *
device_name (const struct device *dev)
{
  return dev->name;
}

/* --- the request gate ------------------------------------------------ */

struct table *
device_enter (struct device *dev)
{
  for (;;) {
    /* Count first, then look: a suspender sets suspended first, then
     * waits for the count.  Sequentially consistent, so one of the two
     * always sees the other.
     */
    atomic_fetch_add (&dev->inflight, 1);
    if (!atomic_load (&dev->suspended))
      return dev->live;
    device_exit (dev);

    pthread_mutex_lock (&dev->lock);
    while (atomic_load (&dev->suspended))
      pthread_cond_wait (&dev->cond, &dev->lock);
    pthread_mutex_unlock (&dev->lock);
  }
}

void
device_exit (struct device *dev)
{
  if (atomic_fetch_sub (&dev->inflight, 1) == 1 &&
      atomic_load (&dev->suspended)) {
    /* The last one out wakes a waiting suspender. */
    pthread_mutex_lock (&dev->lock);
    pthread_cond_broadcast (&dev->cond);
    pthread_mutex_unlock (&dev->lock);
  }
}

/* Stop admitting requests and wait for those in flight.  Called with
 * dev->lock held.
 */
static int
suspend_locked (struct device *dev, bool noflush)
{
  if (atomic_load (&dev->suspended))
    return 0;
  atomic_store (&dev->suspended, true);
  /* Targets holding I/O back (delay) let it go now, so the drain below
   * does not wait for it.
   */
  if (dev->live)
    table_presuspend (dev->live);
  while (atomic_load (&dev->inflight) != 0)
    pthread_cond_wait (&dev->cond, &dev->lock);
  if (!noflush && dev->live)
    return io_flush_backends (dev->live->backends.ptr,
                              dev->live->backends.len);
  return 0;
}

int
device_suspend (struct device *dev, bool noflush)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->lock);
  return suspend_locked (dev, noflush);
}

int
device_load (struct device *dev, struct table *t)
{
  struct table *old;

  pthread_mutex_lock (&dev->lock);
  old = dev->inactive;
  dev->inactive = t;
  pthread_mutex_unlock (&dev->lock);
  table_free (old);
  return 0;
}

int
device_resume (struct device *dev, struct mapper_err *err)
{
  struct table *old = NULL;

  pthread_mutex_lock (&dev->lock);
  if (dev->inactive) {
    /* Swap only with nothing in flight. */
    suspend_locked (dev, false);
    old = dev->live;
    dev->live = dev->inactive;
    dev->inactive = NULL;
    dev->event_nr++;
  }
  if (dev->live == NULL) {
    pthread_mutex_unlock (&dev->lock);
    mapper_err_set (err, "device '%s' has no table to resume", dev->name);
    return -ENXIO;
  }
  table_resume (dev->live);
  atomic_store (&dev->suspended, false);
  pthread_cond_broadcast (&dev->cond);
  pthread_mutex_unlock (&dev->lock);
  table_free (old);
  return 0;
}

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

void
device_open_count_add (struct device *dev, int delta)
{
  atomic_fetch_add (&dev->open_count, delta);
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* Named devices: the registry (creation order, hash indexes by name and
 * by uuid), names and uuids, each device's lifetime (references, open
 * connections), rename and remove.  A device's table slots and the
 * request gate are in device-slots.c, the stacking checks in
 * device-stack.c, inspection and events in device-info.c, the request
 * entry points in device-io.c.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

DEFINE_VECTOR_TYPE (device_vector, struct device *);

/* Protects the registry (not the devices in it) and each device's name
 * and uuid.  Taken when devices are created, removed, listed or looked up
 * at connection open: never per request.  Recursive so device_foreach
 * callbacks may use the accessors that take it.  Order: devices_lock
 * before any dev->lock.
 *
 * The backend registry lock (backend.c) is never held while a backend is
 * opened or closed, so it nests inside these and never around them.
 */
static pthread_mutex_t devices_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static device_vector devices;          /* in creation order */

/* The code point of the UTF-8 sequence at p, and its length; 0 if it
 * is not valid (truncated, overlong, a surrogate, above U+10FFFF).
 */
static size_t
utf8_decode (const unsigned char *p, uint32_t *cp)
{
  size_t n;
  uint32_t min;

  if (p[0] < 0x80) {
    *cp = p[0];
    return 1;
  }
  if ((p[0] & 0xe0) == 0xc0)
    n = 2, min = 0x80, *cp = p[0] & 0x1f;
  else if ((p[0] & 0xf0) == 0xe0)
    n = 3, min = 0x800, *cp = p[0] & 0x0f;
  else if ((p[0] & 0xf8) == 0xf0)
    n = 4, min = 0x10000, *cp = p[0] & 0x07;
  else
    return 0;                   /* a continuation byte, or 0xf8..0xff */
  for (size_t i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80)  /* also stops at the NUL */
      return 0;
    *cp = *cp << 6 | (p[i] & 0x3f);
  }
  if (*cp < min || *cp > 0x10ffff || (*cp >= 0xd800 && *cp <= 0xdfff))
    return 0;
  return n;
}

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
  /* NBD export names are UTF-8: a name must be valid UTF-8 (shortest
   * form, no surrogates, at most U+10FFFF) without C0 or C1 controls.
   */
  for (const unsigned char *s = (const unsigned char *) name, *p = s; *p; ) {
    size_t at = p - s, n;
    uint32_t cp;

    if (*p == '/') {
      mapper_err_set (err, "device name '%s' contains '/'", name);
      return -EINVAL;
    }
    if ((n = utf8_decode (p, &cp)) == 0) {
      mapper_err_set (err, "device name is not valid UTF-8 at byte %zu "
                      "(0x%02x)", at, *p);
      return -EINVAL;
    }
    if (cp < 0x20 || cp == 0x7f) {
      mapper_err_set (err, "device name contains control character 0x%02x "
                      "at byte %zu", (unsigned) cp, at);
      return -EINVAL;
    }
    if (cp >= 0x80 && cp <= 0x9f) {
      mapper_err_set (err, "device name contains control character U+%04X "
                      "at byte %zu", (unsigned) cp, at);
      return -EINVAL;
    }
    p += n;
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

/* Hash indexes over the registry by name and by uuid, so create, open
 * and rename stay O(1) with 10,000 devices (a linear scan made creating
 * n devices O(n^2)).  Chained through the devices themselves (name_next,
 * uuid_next): no allocation per device.  Protected by devices_lock.
 */
struct dev_index {
  struct device **buckets;
  size_t nbuckets;              /* 0 or a power of 2 */
  size_t n;
  bool by_uuid;
};
static struct dev_index by_name = { .by_uuid = false };
static struct dev_index by_uuid = { .by_uuid = true };

static uint64_t
hash_string (const char *s)
{
  uint64_t h = 0xcbf29ce484222325ULL;   /* FNV-1a */

  for (; *s; s++)
    h = (h ^ (unsigned char) *s) * 0x100000001b3ULL;
  return h;
}

static const char *
index_key (const struct dev_index *ix, const struct device *dev)
{
  return ix->by_uuid ? dev->uuid : dev->name;
}

static struct device **
index_next (const struct dev_index *ix, struct device *dev)
{
  return ix->by_uuid ? &dev->uuid_next : &dev->name_next;
}

static struct device *
index_find (const struct dev_index *ix, const char *key)
{
  if (ix->nbuckets == 0)
    return NULL;
  for (struct device *d = ix->buckets[hash_string (key) & (ix->nbuckets - 1)];
       d; d = *index_next (ix, d))
    if (strcmp (index_key (ix, d), key) == 0)
      return d;
  return NULL;
}

static void
index_link (struct dev_index *ix, struct device *dev, struct device **buckets,
            size_t nbuckets)
{
  size_t b = hash_string (index_key (ix, dev)) & (nbuckets - 1);

  *index_next (ix, dev) = buckets[b];
  buckets[b] = dev;
}

/* Make room for one more entry (load factor <= 1): 0 or -ENOMEM. */
static int
index_reserve (struct dev_index *ix)
{
  size_t nb = ix->nbuckets ? ix->nbuckets * 2 : 64;
  struct device **buckets;

  if (ix->n + 1 <= ix->nbuckets)
    return 0;
  buckets = calloc (nb, sizeof *buckets);
  if (buckets == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < ix->nbuckets; i++) {
    struct device *d = ix->buckets[i], *next;
    for (; d; d = next) {
      next = *index_next (ix, d);
      index_link (ix, d, buckets, nb);
    }
  }
  free (ix->buckets);
  ix->buckets = buckets;
  ix->nbuckets = nb;
  return 0;
}

/* Callers index_reserve first, so this cannot fail. */
static void
index_add (struct dev_index *ix, struct device *dev)
{
  index_link (ix, dev, ix->buckets, ix->nbuckets);
  ix->n++;
}

static void
index_del (struct dev_index *ix, struct device *dev)
{
  struct device **pp;

  if (ix->nbuckets == 0)
    return;
  pp = &ix->buckets[hash_string (index_key (ix, dev)) & (ix->nbuckets - 1)];
  for (; *pp; pp = index_next (ix, *pp))
    if (*pp == dev) {
      *pp = *index_next (ix, dev);
      ix->n--;
      break;
    }
}

static void
index_reset (struct dev_index *ix)
{
  free (ix->buckets);
  ix->buckets = NULL;
  ix->nbuckets = ix->n = 0;
}

static struct device *
lookup_locked (const char *name)
{
  return index_find (&by_name, name);
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
      index_reserve (&by_name) < 0 ||
      device_vector_append (&devices, dev) == -1) {
    if (dev)
      free (dev->name);
    free (dev);
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  pthread_mutex_init (&dev->lock, NULL);
  /* Selected once: the production flush never looks at the mode. */
  dev->flush_backends = mapper_flush_per_target ? device_flush_per_target
    : device_flush_backends;
  atomic_init (&dev->event_nr, 0);
  atomic_init (&dev->inflight, 0);
  atomic_init (&dev->suspended, true);
  atomic_init (&dev->open_count, 0);
  atomic_init (&dev->stack_holders, 0);
  atomic_init (&dev->refs, 1);  /* the registry's */
  atomic_init (&dev->removed, false);
  atomic_init (&dev->flush_seen, errseq_sample ());
  atomic_init (&dev->dropped_err, 0);
  index_add (&by_name, dev);
  *out = dev;
  return 0;
}

/* Out of the registry; called with devices_lock held. */
static void
unregister_locked (struct device *dev)
{
  /* From the end: unload removes the newest first. */
  for (size_t i = devices.len; i-- > 0; )
    if (devices.ptr[i] == dev) {
      device_vector_remove (&devices, i);
      break;
    }
  index_del (&by_name, dev);
  if (dev->uuid)
    index_del (&by_uuid, dev);
  if (devices.len == 0) {
    /* Nothing left allocated (leak checkers, a fresh start). */
    device_vector_reset (&devices);
    index_reset (&by_name);
    index_reset (&by_uuid);
  }
  atomic_store (&dev->removed, true);
}

static void
device_free (struct device *dev)
{
  /* A target thread raising an event on dev is done, and none will. */
  table_bind (dev->live, NULL);
  table_free (dev->live);
  table_free (dev->inactive);
  stats_free (dev);
  if (dev->waits) {
    pthread_cond_destroy (&dev->waits->drain);
    pthread_cond_destroy (&dev->waits->gate);
    free (dev->waits);
  }
  pthread_mutex_destroy (&dev->lock);
  for (size_t i = 0; i < dev->nr_old_names; i++)
    free (dev->old_names[i]);
  free (dev->old_names);
  free (dev->uuid);
  free (dev->name);
  free (dev);
}

void
device_put (struct device *dev)
{
  if (dev && atomic_fetch_sub (&dev->refs, 1) == 1)
    device_free (dev);
}

/* Unregister and drop the registry's reference (whoever still holds one
 * keeps the device alive until device_put).
 */
void
device_destroy (struct device *dev)
{
  bool was_registered;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);
    was_registered = !atomic_load (&dev->removed);
    if (was_registered)
      unregister_locked (dev);
  }
  if (was_registered)
    device_put (dev);
}

const char *
device_name (const struct device *dev)
{
  return dev->name;
}

void
device_open_count_add (struct device *dev, int delta)
{
  atomic_fetch_add (&dev->open_count, delta);
}

struct device *
device_get (const char *name)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);
  struct device *dev = lookup_locked (name);

  if (dev)
    atomic_fetch_add (&dev->refs, 1);
  return dev;
}

struct device *
device_open_conn (const char *name)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);
  struct device *dev = lookup_locked (name);

  if (dev) {
    atomic_fetch_add (&dev->refs, 1);
    atomic_fetch_add (&dev->open_count, 1);
  }
  return dev;
}

void
device_close_conn (struct device *dev)
{
  atomic_fetch_sub (&dev->open_count, 1);
  device_put (dev);
}

struct device *
device_get_stacked (const char *name)
{
  struct device *dev = device_get (name);

  if (dev)
    atomic_fetch_add (&dev->stack_holders, 1);
  return dev;
}

void
device_put_stacked (struct device *dev)
{
  atomic_fetch_sub (&dev->stack_holders, 1);
  device_put (dev);
}

int
device_foreach (int (*fn) (struct device *dev, void *opaque), void *opaque)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);

  for (size_t i = 0; i < devices.len; i++) {
    int r = fn (devices.ptr[i], opaque);
    if (r)
      return r;
  }
  return 0;
}

int
device_set_uuid (struct device *dev, const char *uuid,
                 struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);
  size_t len = strlen (uuid);
  struct device *other;
  char *copy;

  if (len == 0 || len > MAPPER_NAME_MAX) {
    mapper_err_set (err, "uuid must be 1 to %d bytes, got %zu",
                    MAPPER_NAME_MAX, len);
    return -EINVAL;
  }
  for (const unsigned char *p = (const unsigned char *) uuid; *p; p++)
    if (*p <= 0x20 || *p >= 0x7f) {
      mapper_err_set (err, "uuid contains byte 0x%02x at %zu: only "
                      "printable ASCII without spaces", *p,
                      (size_t) (p - (const unsigned char *) uuid));
      return -EINVAL;
    }
  other = index_find (&by_uuid, uuid);
  if (other && other != dev) {
    mapper_err_set (err, "uuid '%s' is already used by device '%s'",
                    uuid, other->name);
    return -EEXIST;
  }
  copy = strdup (uuid);
  if (copy == NULL ||
      (!atomic_load (&dev->removed) && index_reserve (&by_uuid) < 0)) {
    free (copy);
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  if (dev->uuid && !atomic_load (&dev->removed))
    index_del (&by_uuid, dev);
  free (dev->uuid);
  dev->uuid = copy;
  if (!atomic_load (&dev->removed))
    index_add (&by_uuid, dev);
  return 0;
}

char *
device_uuid (struct device *dev)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);
  return dev->uuid ? strdup (dev->uuid) : NULL;
}

int
device_remove (struct device *dev, bool force, struct mapper_err *err)
{
  unsigned open;
  int r;

  /* Even forced: the holder's table would lose its device, and the
   * next start from tables=DIR would refuse it.
   */
  if ((r = device_refuse_if_held (dev, "removed", err)) < 0)
    return r;
  open = atomic_load (&dev->open_count);
  if (open > 0 && !force) {
    mapper_err_set (err, "device '%s' is open by %u connection%s: "
                    "disconnect them or use --force", dev->name, open,
                    open == 1 ? "" : "s");
    return -EBUSY;
  }
  if (open > 0) {
    /* Connected clients get EIO from now on instead of reaching the
     * backends of a device that no longer exists.
     */
    /* A device without a table gets a one-sector error table too, so
     * requests its clients have waiting (flush) are released.
     */
    struct device_info info;
    char text[64];
    struct table *t;

    device_get_info (dev, &info);
    snprintf (text, sizeof text, "0 %" PRIu64 " error\n",
              MAX (info.size >> MAPPER_SECTOR_SHIFT, (uint64_t) 1));
    if ((r = table_parse (text, "<remove --force>", &t, err)) < 0)
      return r;
    if ((r = device_replace (dev, t, NULL, err)) < 0)
      return r;
  }
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);
    if (atomic_load (&dev->removed)) {
      mapper_err_set (err, "device '%s' is already removed", dev->name);
      return -ENOENT;
    }
    /* Checked again under the lock: device_open counts under it too. */
    if (!force && atomic_load (&dev->open_count) > 0) {
      mapper_err_set (err, "device '%s' was opened meanwhile: "
                      "disconnect it or use --force", dev->name);
      return -EBUSY;
    }
    unregister_locked (dev);
  }
  /* Wake event waiters so they see the removal. */
  pthread_mutex_lock (&device_events_lock);
  pthread_cond_broadcast (&device_events_cond);
  pthread_mutex_unlock (&device_events_lock);
  device_put (dev);
  return 0;
}

int
device_check_rename (struct device *dev, struct mapper_err *err)
{
  return device_refuse_if_held (dev, "renamed", err);
}

int
device_rename (struct device *dev, const char *newname,
               struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);
  char **names;
  char *copy;
  int r;

  if ((r = device_check_name (newname, err)) < 0)
    return r;
  if (atomic_load (&dev->removed)) {
    mapper_err_set (err, "device '%s' was removed", dev->name);
    return -ENOENT;
  }
  if (lookup_locked (newname)) {
    mapper_err_set (err, "device '%s' already exists", newname);
    return -EEXIST;
  }
  /* A table stacked on it names it (mapper:NAME) and would lose it at
   * the next load from tables=DIR.
   */
  if ((r = device_refuse_if_held (dev, "renamed", err)) < 0)
    return r;
  names = realloc (dev->old_names, (dev->nr_old_names + 1) * sizeof *names);
  if (names == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  dev->old_names = names;
  copy = strdup (newname);
  if (copy == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  /* Readers without the lock may still hold the old pointer. */
  index_del (&by_name, dev);
  dev->old_names[dev->nr_old_names++] = dev->name;
  dev->name = copy;
  index_add (&by_name, dev);   /* same count: no reserve needed */
  return 0;
}

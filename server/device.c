/* Named devices: the registry, live + inactive table slots, suspend (drain
 * in-flight requests) and resume (swap the slots atomically).
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
  pthread_cond_init (&dev->cond, NULL);
  pthread_mutex_init (&dev->event_lock, NULL);
  {
    /* Wait timeouts are intervals: immune to clock changes. */
    pthread_condattr_t attr;
    pthread_condattr_init (&attr);
    pthread_condattr_setclock (&attr, CLOCK_MONOTONIC);
    pthread_cond_init (&dev->event_cond, &attr);
    pthread_condattr_destroy (&attr);
  }
  atomic_init (&dev->event_nr, 0);
  atomic_init (&dev->inflight, 0);
  atomic_init (&dev->suspended, true);
  atomic_init (&dev->open_count, 0);
  atomic_init (&dev->stack_holders, 0);
  atomic_init (&dev->refs, 1);  /* the registry's */
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
  dev->removed = true;
}

static void
device_free (struct device *dev)
{
  /* A target thread raising an event on dev is done, and none will. */
  table_bind (dev->live, NULL);
  table_free (dev->live);
  table_free (dev->inactive);
  pthread_cond_destroy (&dev->event_cond);
  pthread_mutex_destroy (&dev->event_lock);
  pthread_cond_destroy (&dev->cond);
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
    was_registered = !dev->removed;
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

uint64_t
device_errseq_sample (void)
{
  return errseq_sample ();
}

uint64_t
device_errseq (struct device *dev)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->lock);
  uint64_t e = atomic_load (&dev->dropped_err);

  if (dev->live)
    for (size_t i = 0; i < dev->live->backends.len; i++)
      e = MAX (e, backend_errseq (dev->live->backends.ptr[i]));
  return e;
}

/* --- the request gate ------------------------------------------------ */

struct table *
device_enter (struct device *dev)
{
  uint64_t asked = 0;

  for (;;) {
    /* Count first, then look: a suspender sets suspended first, then
     * waits for the count.  Sequentially consistent, so one of the two
     * always sees the other.
     */
    atomic_fetch_add (&dev->inflight, 1);
    if (!atomic_load (&dev->suspended))
      return dev->live;
    device_exit (dev);

    /* Held until resume, which may never come: a request whose client
     * has gone, or on a server that is stopping, is given up instead.
     */
    pthread_mutex_lock (&dev->lock);
    while (atomic_load (&dev->suspended))
      if (request_wait (&dev->cond, &dev->lock, 0, &asked) < 0) {
        pthread_mutex_unlock (&dev->lock);
        return NULL;
      }
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

/* Let requests in again on the live table (dev->lock held). */
static void
unsuspend_locked (struct device *dev)
{
  table_resume (dev->live);     /* background work (mirror resync) */
  atomic_store (&dev->suspended, false);
  pthread_cond_broadcast (&dev->cond);
}

/* Stop admitting requests and wait for those in flight, then (unless
 * noflush) make what they wrote durable.  A failed flush fails the
 * suspend and leaves the device as it was, running (dm's
 * __dm_suspend): a suspended device is one whose writes are known
 * durable.  Called with dev->lock held.
 */
static int
suspend_locked (struct device *dev, bool noflush)
{
  int r;

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
  /* Background work (mirror resync) stops too: nothing writes the
   * table's backends until resume.
   */
  if (dev->live)
    table_postsuspend (dev->live);
  if (noflush || dev->live == NULL)
    return 0;
  r = io_flush_backends (dev->live->backends.ptr, dev->live->backends.len);
  if (r < 0)
    unsuspend_locked (dev);
  return r;
}

int
device_suspend (struct device *dev, bool noflush)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->lock);
  return suspend_locked (dev, noflush);
}

/* Deep enough for any sane stack; bounds the walk if something is off. */
#define MAX_STACK_DEPTH 16

/* Does t reach top through device backends?  path[0..depth) are the
 * device names walked so far, for the message.
 */
static int
check_stack (struct device *top, const struct table *t, const char **path,
             unsigned depth, struct mapper_err *err)
{
  for (size_t i = 0; i < t->backends.len; i++) {
    struct device *lower = backend_lower_device (t->backends.ptr[i]);
    int r = 0;

    if (lower == NULL)
      continue;
    if (lower == top) {
      char chain[1024] = "";
      size_t used = 0;
      for (unsigned j = 0; j < depth && used < sizeof chain; j++)
        used += snprintf (chain + used, sizeof chain - used, "%s -> ",
                          path[j]);
      if (depth == 1)
        mapper_err_set (err, "%s%s: device '%s' cannot stack on itself",
                        DEVICE_BACKEND_PREFIX, top->name, top->name);
      else
        mapper_err_set (err, "%s%s: stacking cycle: %s%s",
                        DEVICE_BACKEND_PREFIX, path[1], chain, top->name);
      return -ELOOP;
    }
    if (depth >= MAX_STACK_DEPTH) {
      mapper_err_set (err, "%s%s: devices stacked more than %d deep",
                      DEVICE_BACKEND_PREFIX, lower->name, MAX_STACK_DEPTH);
      return -ELOOP;
    }
    /* Both of its tables: the inactive one may be resumed later.  Locks
     * are taken top-down, the order every path that nests them uses.
     */
    path[depth] = lower->name;
    pthread_mutex_lock (&lower->lock);
    if (lower->live)
      r = check_stack (top, lower->live, path, depth + 1, err);
    if (r == 0 && lower->inactive)
      r = check_stack (top, lower->inactive, path, depth + 1, err);
    pthread_mutex_unlock (&lower->lock);
    if (r < 0)
      return r;
  }
  return 0;
}

int
device_check_table (struct device *dev, const struct table *t,
                    struct mapper_err *err)
{
  const char *path[MAX_STACK_DEPTH + 1] = { dev->name };

  return check_stack (dev, t, path, 1, err);
}

/* --- stacking: the tables that hold a device ---------------------- */

/* Called for each table ht of another device that stacks on lower, with
 * what it maps of it; nonzero stops the walk.
 */
typedef int (*holder_fn) (struct device *holder, bool inactive,
                          const struct table *ht,
                          const struct stack_use *u, void *opaque);

/* Walk the live and inactive tables of every other device, under
 * devices_lock and, one at a time, each device's lock (the documented
 * order).  Control-plane only: O(devices) when lower is held at all.
 */
static int
foreach_holder (struct device *lower, holder_fn fn, void *opaque)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);
  int r = 0;

  if (atomic_load (&lower->stack_holders) == 0)
    return 0;
  for (size_t i = 0; i < devices.len && r == 0; i++) {
    struct device *d = devices.ptr[i];
    const struct table *slots[2];

    if (d == lower)
      continue;
    pthread_mutex_lock (&d->lock);
    slots[0] = d->live;
    slots[1] = d->inactive;
    for (int s = 0; s < 2 && r == 0; s++)
      for (size_t j = 0; slots[s] && j < slots[s]->stack_uses.len && r == 0;
           j++) {
        const struct stack_use *u = &slots[s]->stack_uses.ptr[j];
        if (backend_lower_device (u->be) == lower)
          r = fn (d, s == 1, slots[s], u, opaque);
      }
    pthread_mutex_unlock (&d->lock);
  }
  return r;
}

struct holders_text {
  FILE *fp;
  unsigned n;
  bool names_only;
  struct device *last;          /* names_only: the last one named */
};

static int
holders_text_one (struct device *holder, bool inactive,
                  const struct table *ht, const struct stack_use *u,
                  void *opaque)
{
  struct holders_text *h = opaque;

  if (h->names_only) {
    /* Once per device, whose live and inactive tables may both hold. */
    if (holder == h->last)
      return 0;
    h->last = holder;
    fprintf (h->fp, "%s%s", h->n ? "\t" : "", holder->name);
  }
  else
    fprintf (h->fp, "%s'%s'%s", h->n ? ", " : "", holder->name,
             inactive ? " (its inactive table)" : "");
  h->n++;
  return 0;
}

/* The holders of dev as "'up', 'x' (its inactive table)", or with
 * names_only as "up\tx"; malloc'd ("" for none), NULL if out of memory.
 * *n: how many.
 */
static char *
holders_text (struct device *dev, bool names_only, unsigned *n)
{
  struct holders_text h = { .names_only = names_only };
  char *buf = NULL;
  size_t len = 0;

  h.fp = open_memstream (&buf, &len);
  if (h.fp == NULL)
    return NULL;
  foreach_holder (dev, holders_text_one, &h);
  if (fclose (h.fp) == EOF) {
    free (buf);
    return NULL;
  }
  if (n)
    *n = h.n;
  return buf;
}

char *
device_holders (struct device *dev)
{
  return holders_text (dev, true, NULL);
}

/* -EBUSY naming the holders if another device's table stacks on dev
 * (what it would do to dev is in what, "removed"), else 0.
 */
static int
refuse_if_held (struct device *dev, const char *what, struct mapper_err *err)
{
  unsigned n = 0;
  char *text = holders_text (dev, false, &n);

  if (text == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  if (n > 0) {
    mapper_err_set (err, "device '%s' is in use by device%s %s as "
                    DEVICE_BACKEND_PREFIX "%s: it cannot be %s until %s "
                    "reloaded without it or removed", dev->name,
                    n == 1 ? "" : "s", text, dev->name, what,
                    n == 1 ? "that table is" : "those tables are");
    free (text);
    return -EBUSY;
  }
  free (text);
  return 0;
}

struct holder_check {
  struct device *lower;
  const struct table *t;
  struct mapper_err *err;
};

static int
holder_check_one (struct device *holder, bool inactive,
                  const struct table *ht, const struct stack_use *u,
                  void *opaque)
{
  struct holder_check *hc = opaque;
  const struct mapper_caps *c = &hc->t->caps;

  if (u->end > c->size) {
    mapper_err_set (hc->err, "device '%s' maps " DEVICE_BACKEND_PREFIX
                    "%s up to sector %" PRIu64 " in its %s table, but the "
                    "new table of '%s' has only %" PRIu64 " sectors: "
                    "reload '%s' first", holder->name, hc->lower->name,
                    u->end >> MAPPER_SECTOR_SHIFT,
                    inactive ? "inactive" : "live", hc->lower->name,
                    c->size >> MAPPER_SECTOR_SHIFT, holder->name);
    return -EBUSY;
  }
  if ((u->align & (c->block_min - 1)) != 0) {
    mapper_err_set (hc->err, "device '%s' maps areas of "
                    DEVICE_BACKEND_PREFIX "%s in its %s table that are not "
                    "aligned to the new table's minimum block size (%"
                    PRIu32 " bytes): reload '%s' first", holder->name,
                    hc->lower->name, inactive ? "inactive" : "live",
                    c->block_min, holder->name);
    return -EBUSY;
  }
  /* Aligned areas are not enough: the holder takes requests as small
   * as its own minimum block size and passes them on as they are.  Its
   * table's is that of the device backend, from when that was opened
   * (shared by every table naming mapper:NAME, so a reload of the holder
   * that keeps mapper:NAME keeps it too).
   */
  if (c->block_min > ht->caps.block_min) {
    mapper_err_set (hc->err, "device '%s' takes requests of %" PRIu32
                    " byte%s and up (its %s table's minimum block size) "
                    "and passes them to " DEVICE_BACKEND_PREFIX "%s, but "
                    "the new table of '%s' needs %" PRIu32 ": remove '%s', "
                    "or reload it without " DEVICE_BACKEND_PREFIX "%s, "
                    "first", holder->name, ht->caps.block_min,
                    ht->caps.block_min == 1 ? "" : "s",
                    inactive ? "inactive" : "live", hc->lower->name,
                    hc->lower->name, c->block_min, holder->name,
                    hc->lower->name);
    return -EBUSY;
  }
  /* The same for writes: the holder would pass them on to get EPERM. */
  if (ht->caps.can_write && !c->can_write) {
    mapper_err_set (hc->err, "device '%s' writes to " DEVICE_BACKEND_PREFIX
                    "%s (its %s table is writable), but the new table of "
                    "'%s' is read-only: remove '%s', or reload it without "
                    DEVICE_BACKEND_PREFIX "%s, first", holder->name,
                    hc->lower->name, inactive ? "inactive" : "live",
                    hc->lower->name, holder->name, hc->lower->name);
    return -EBUSY;
  }
  return 0;
}

int
device_check_holders (struct device *dev, const struct table *t,
                      struct mapper_err *err)
{
  struct holder_check hc = { .lower = dev, .t = t, .err = err };

  return foreach_holder (dev, holder_check_one, &hc);
}

/* The checks a table must pass to become dev's live table: no cycle, and
 * every device stacked on dev still finds what it maps.
 */
static int
check_new_live (struct device *dev, const struct table *t,
                struct mapper_err *err)
{
  int r = device_check_table (dev, t, err);

  if (r == 0)
    r = device_check_holders (dev, t, err);
  return r;
}

int
device_check_resume (struct device *dev, struct mapper_err *err)
{
  struct table *t;

  /* The inactive slot changes only by control commands, which the
   * caller serialises: it stays what is checked here.
   */
  pthread_mutex_lock (&dev->lock);
  t = dev->inactive;
  pthread_mutex_unlock (&dev->lock);
  return t ? check_new_live (dev, t, err) : 0;
}

int
device_load (struct device *dev, struct table *t)
{
  struct table *old;

  /* Callers check first for the message; never build a cycle. */
  if (device_check_table (dev, t, NULL) < 0) {
    table_free (t);
    return -ELOOP;
  }

  pthread_mutex_lock (&dev->lock);
  old = dev->inactive;
  dev->inactive = t;
  pthread_mutex_unlock (&dev->lock);
  table_free (old);
  return 0;
}

/* The swap, under dev->lock: dev->live has just replaced old.  The
 * targets' events now reach dev from the live table only, and the swap
 * is an event itself.
 */
static void
live_swapped (struct device *dev, struct table *old)
{
  table_bind (old, NULL);
  table_bind (dev->live, dev);
  device_event (dev);
}

/* The backends of old that new does not use: only their data needs an
 * explicit flush at a swap.  Shared ones stay covered by the clients'
 * own flushes, which go to the new table's backends (backends are
 * shared objects, so pointer equality is identity).
 */
static int
dropped_backends (const struct table *old, const struct table *new,
                  backend_vector *out)
{
  if (old == NULL)
    return 0;
  for (size_t i = 0; i < old->backends.len; i++) {
    bool kept = false;
    for (size_t j = 0; j < new->backends.len && !kept; j++)
      kept = old->backends.ptr[i] == new->backends.ptr[j];
    if (!kept && backend_vector_append (out, old->backends.ptr[i]) == -1)
      return -ENOMEM;
  }
  return 0;
}

/* After a swap: make what the old table wrote to the backends the new
 * one no longer uses durable (the old table still holds them), since no
 * client flush reaches them any more.  Errors on them that the clients
 * would have been told of at their next flush stay the device's to tell
 * (device_flush_errseq).  0, or -errno with err filled: the swap stands.
 */
static int
flush_dropped (struct device *dev, backend_vector *dropped,
               struct mapper_err *err)
{
  int r = 0;

  if (dropped->len)
    r = io_flush_backends (dropped->ptr, dropped->len);
  for (size_t i = 0; i < dropped->len; i++)
    errseq_note_dropped (&dev->dropped_err, dropped->ptr[i]);
  backend_vector_reset (dropped);
  if (r < 0)
    mapper_err_set (err, "device '%s': the new table is live, but "
                    "flushing the backends it no longer uses failed: %s: "
                    "writes made to them through the old table may be lost",
                    dev->name, mapper_strerror (-r));
  return r;
}

int
device_resume_swapped (struct device *dev, bool *swapped,
                       struct mapper_err *err)
{
  backend_vector dropped = empty_vector;
  struct table *old = NULL;
  int r;

  if (swapped)
    *swapped = false;
  if ((r = device_check_resume (dev, err)) < 0)
    return r;

  pthread_mutex_lock (&dev->lock);
  if (dev->inactive) {
    if (dropped_backends (dev->live, dev->inactive, &dropped) < 0) {
      pthread_mutex_unlock (&dev->lock);
      backend_vector_reset (&dropped);
      mapper_err_set (err, "out of memory");
      return -ENOMEM;
    }
    /* Swap only with nothing in flight and what the live table wrote
     * durable: if that flush fails, the device carries on as it was and
     * the new table stays inactive (dm's do_resume).
     */
    if ((r = suspend_locked (dev, false)) < 0) {
      pthread_mutex_unlock (&dev->lock);
      backend_vector_reset (&dropped);
      mapper_err_set (err, "device '%s': flush before the swap failed: %s: "
                      "the live table stays, the new one inactive",
                      dev->name, mapper_strerror (-r));
      return r;
    }
    old = dev->live;
    dev->live = dev->inactive;
    dev->inactive = NULL;
    live_swapped (dev, old);
    if (swapped)
      *swapped = true;
  }
  if (dev->live == NULL) {
    pthread_mutex_unlock (&dev->lock);
    mapper_err_set (err, "device '%s' has no table to resume", dev->name);
    return -ENXIO;
  }
  unsuspend_locked (dev);
  pthread_mutex_unlock (&dev->lock);
  r = flush_dropped (dev, &dropped, err);
  table_free (old);
  return r;
}

int
device_resume (struct device *dev, struct mapper_err *err)
{
  return device_resume_swapped (dev, NULL, err);
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
device_open_count_add (struct device *dev, int delta)
{
  atomic_fetch_add (&dev->open_count, delta);
}

/* --- control plane: lifetime ------------------------------------------ */

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
  if (copy == NULL || (!dev->removed && index_reserve (&by_uuid) < 0)) {
    free (copy);
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  if (dev->uuid && !dev->removed)
    index_del (&by_uuid, dev);
  free (dev->uuid);
  dev->uuid = copy;
  if (!dev->removed)
    index_add (&by_uuid, dev);
  return 0;
}

char *
device_uuid (struct device *dev)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&devices_lock);
  return dev->uuid ? strdup (dev->uuid) : NULL;
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
}

int
device_remove (struct device *dev, bool force, struct mapper_err *err)
{
  unsigned open;
  int r;

  /* Even forced: the holder's table would lose its device, and the
   * next start from tables=DIR would refuse it.
   */
  if ((r = refuse_if_held (dev, "removed", err)) < 0)
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
    if (dev->removed) {
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
  pthread_mutex_lock (&dev->event_lock);
  pthread_cond_broadcast (&dev->event_cond);
  pthread_mutex_unlock (&dev->event_lock);
  device_put (dev);
  return 0;
}

int
device_check_rename (struct device *dev, struct mapper_err *err)
{
  return refuse_if_held (dev, "renamed", err);
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
  if (dev->removed) {
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
  if ((r = refuse_if_held (dev, "renamed", err)) < 0)
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

void
device_clear (struct device *dev)
{
  struct table *old;

  pthread_mutex_lock (&dev->lock);
  old = dev->inactive;
  dev->inactive = NULL;
  pthread_mutex_unlock (&dev->lock);
  table_free (old);
}

int
device_replace (struct device *dev, struct table *t, bool *swapped,
                struct mapper_err *err)
{
  struct table *old_live, *old_inactive;
  backend_vector dropped = empty_vector;
  uint64_t t0, t1;
  int r;

  if (swapped)
    *swapped = false;
  if ((r = check_new_live (dev, t, err)) < 0) {
    table_free (t);
    return r;
  }
  pthread_mutex_lock (&dev->lock);
  if ((r = dropped_backends (dev->live, t, &dropped)) < 0) {
    pthread_mutex_unlock (&dev->lock);
    mapper_err_set (err, "out of memory");
    table_free (t);
    return r;
  }
  /* Make what is written to the dropped backends so far durable before
   * the window, so the flush that must follow the swap has little left
   * to do; if it fails, nothing changes.
   */
  if (dropped.len && !atomic_load (&dev->suspended)) {
    r = io_flush_backends (dropped.ptr, dropped.len);
    if (r < 0) {
      pthread_mutex_unlock (&dev->lock);
      mapper_err_set (err, "device '%s': flush before the swap failed: %s",
                      dev->name, mapper_strerror (-r));
      backend_vector_reset (&dropped);
      table_free (t);
      return r;
    }
  }
  /* Suspended only for the drain. */
  t0 = monotonic_ns ();
  suspend_locked (dev, true);   /* noflush: cannot fail */
  old_live = dev->live;
  old_inactive = dev->inactive;
  dev->live = t;
  dev->inactive = NULL;
  live_swapped (dev, old_live);
  if (swapped)
    *swapped = true;
  unsuspend_locked (dev);
  t1 = monotonic_ns ();
  pthread_mutex_unlock (&dev->lock);
  /* Writes that went to backends the new table no longer uses are
   * durable before replace returns, or replace says they may not be.
   */
  r = flush_dropped (dev, &dropped, err);
  table_free (old_live);
  table_free (old_inactive);
  /* The suspended window, for bench/bench-reload (nbdkit -v). */
  if (mapper_debug)
    mapper_debug ("device %s: replace: suspended for %" PRIu64 " ns",
                  dev->name, t1 - t0);
  return r;
}

/* --- control plane: inspection ---------------------------------------- */

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
  struct target *ti;
  char buf[4096] = "";
  int r;

  if (dev->live == NULL) {
    mapper_err_set (err, "device '%s' has no live table", dev->name);
    return -ENXIO;
  }
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
  r = ti->type->message (ti, argc, argv, buf, sizeof buf, err);
  if (r < 0)
    return r;
  *reply = strdup (buf);
  if (*reply == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  return 0;
}

void
device_event (struct device *dev)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->event_lock);

  atomic_fetch_add (&dev->event_nr, 1);
  pthread_cond_broadcast (&dev->event_cond);
}

int
device_wait_event (struct device *dev, uint64_t event_nr,
                   int64_t timeout_ms, uint64_t *now,
                   struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&dev->event_lock);
  uint64_t deadline = 0, asked = 0;

  /* A timeout past the clock's range (some 500 years) is none. */
  if (timeout_ms >= 0 &&
      (__builtin_mul_overflow ((uint64_t) timeout_ms, 1000000, &deadline) ||
       __builtin_add_overflow (deadline, monotonic_ns (), &deadline)))
    deadline = 0;
  while (atomic_load (&dev->event_nr) <= event_nr && !dev->removed &&
         !(deadline && monotonic_ns () >= deadline))
    /* Without a timeout too: not past a stop or the client's going. */
    if (request_wait (&dev->event_cond, &dev->event_lock, deadline,
                      &asked) < 0) {
      *now = atomic_load (&dev->event_nr);
      mapper_err_set (err, "device '%s': wait given up: the server is "
                      "stopping or the client has gone", dev->name);
      return -ESHUTDOWN;
    }
  *now = atomic_load (&dev->event_nr);
  if (*now > event_nr)
    return 0;
  if (dev->removed) {
    mapper_err_set (err, "device '%s' was removed", dev->name);
    return -ENOENT;
  }
  mapper_err_set (err, "device '%s': timed out waiting for an event after "
                  "%" PRIu64 " (now %" PRIu64 ")", dev->name, event_nr, *now);
  return -ETIMEDOUT;
}

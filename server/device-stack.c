/* SPDX-License-Identifier: BSD-3-Clause */
/* Stacking ("mapper:NAME" backends, backends/stacked.c): the checks that
 * keep devices stacked on each other sound.  A table may not make its
 * device stack on itself, directly or through others (check_stack), and
 * a device that other devices' tables stack on (its holders) may not
 * change under them: not lose the areas they map, grow its block size
 * past theirs, turn read-only under a writable holder, be removed or be
 * renamed (the holders' tables name it).
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

/* --- cycles ---------------------------------------------------------- */

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

/* --- holders: the tables of other devices stacked on one ------------- */

/* Called for each table ht of another device that stacks on lower, with
 * what it maps of it; nonzero stops the walk.
 */
typedef int (*holder_fn) (struct device *holder, bool inactive,
                          const struct table *ht,
                          const struct stack_use *u, void *opaque);

struct holder_walk {
  struct device *lower;
  holder_fn fn;
  void *opaque;
};

static int
holder_walk_one (struct device *d, void *opaque)
{
  struct holder_walk *hw = opaque;
  const struct table *slots[2];
  int r = 0;

  if (d == hw->lower)
    return 0;
  pthread_mutex_lock (&d->lock);
  slots[0] = d->live;
  slots[1] = d->inactive;
  for (int s = 0; s < 2 && r == 0; s++)
    for (size_t j = 0; slots[s] && j < slots[s]->stack_uses.len && r == 0;
         j++) {
      const struct stack_use *u = &slots[s]->stack_uses.ptr[j];
      if (backend_lower_device (u->be) == hw->lower)
        r = hw->fn (d, s == 1, slots[s], u, hw->opaque);
    }
  pthread_mutex_unlock (&d->lock);
  return r;
}

/* Walk the live and inactive tables of every other device, under the
 * registry lock (device_foreach) and, one at a time, each device's lock
 * (the documented order).  Control-plane only: O(devices) when lower is
 * held at all.
 */
static int
foreach_holder (struct device *lower, holder_fn fn, void *opaque)
{
  struct holder_walk hw = { .lower = lower, .fn = fn, .opaque = opaque };

  if (atomic_load (&lower->stack_holders) == 0)
    return 0;
  return device_foreach (holder_walk_one, &hw);
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

int
device_refuse_if_held (struct device *dev, const char *what,
                       struct mapper_err *err)
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
  /* What the holder's targets themselves need of it (thin: its pool). */
  for (size_t i = 0; i < ht->nr_targets; i++) {
    struct target *ti = &ht->targets[i];
    int r;
    if (ti->type->check_lower &&
        (r = ti->type->check_lower (ti, u->be, hc->t, hc->err)) < 0) {
      mapper_err_prefix (hc->err, "device '%s' (its %s table)", holder->name,
                         inactive ? "inactive" : "live");
      return r;
    }
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

int
device_check_new_live (struct device *dev, const struct table *t,
                       struct mapper_err *err)
{
  int r = device_check_table (dev, t, err);

  if (r == 0)
    r = device_check_holders (dev, t, err);
  return r;
}

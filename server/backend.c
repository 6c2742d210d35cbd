/* SPDX-License-Identifier: BSD-3-Clause */
/* The backend registry: backends are shared by every table that names
 * them, keyed by identity (struct backend_kind's key), and closed when
 * the last table using them is freed.  Only table build/free come here,
 * never the I/O path.  It names no kind: it asks the list of them
 * (backends/backends.def), as qemu's bdrv_find_protocol does.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Protects the list and every backend's refs and next. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct backend *registry;

static void backend_close (struct backend *be);

/* The registry entry for key, with a new reference; NULL if none. */
static struct backend *
registry_find_locked (const char *key)
{
  for (struct backend *be = registry; be; be = be->next)
    if (strcmp (be->key, key) == 0) {
      be->refs++;
      return be;
    }
  return NULL;
}

/* The kinds, in the order they are asked (backends/backends.def). */
#define BACKEND(name) extern const struct backend_kind name##_backend_kind;
#include "backends/backends.def"
#undef BACKEND

static const struct backend_kind *const kinds[] = {
#define BACKEND(name) &name##_backend_kind,
#include "backends/backends.def"
#undef BACKEND
};

/* The first kind that claims spec, or NULL. */
static const struct backend_kind *
kind_of (const char *spec)
{
  for (size_t i = 0; i < ARRAY_SIZE (kinds); i++)
    if (kinds[i]->claims (spec))
      return kinds[i];
  return NULL;
}

int
backend_get (const char *spec, struct backend **out, struct mapper_err *err)
{
  CLEANUP_FREE char *key = NULL;
  const struct backend_kind *kind;
  struct backend *be, *other;
  int r;

  if (*spec == '\0') {
    mapper_err_set (err, "empty device path");
    return -EINVAL;
  }
  if ((kind = kind_of (spec)) == NULL) {
    mapper_err_set (err, "%s: not a device this server can open", spec);
    return -EINVAL;
  }

  /* The identity of what spec names: one backend per identity. */
  if ((r = kind->key (spec, &key, err)) < 0)
    return r;

  pthread_mutex_lock (&registry_lock);
  be = registry_find_locked (key);
  pthread_mutex_unlock (&registry_lock);
  if (be) {
    *out = be;
    return 0;
  }

  /* Opened without the lock: a remote backend connects here (up to
   * remote-timeout), and a stacked one looks its device up
   * (devices_lock); neither may stall every other table's build and
   * free meanwhile.
   */
  r = kind->open (spec, key, &be, err);
  if (r < 0) {
    /* Someone may have opened it meanwhile (a server that takes one
     * client refuses a second): share theirs.
     */
    pthread_mutex_lock (&registry_lock);
    be = registry_find_locked (key);
    pthread_mutex_unlock (&registry_lock);
    if (be == NULL)
      return r;
    *out = be;
    return 0;
  }
  be->key = key;
  key = NULL;
  backend_flush_init (be);
  be->refs = 1;

  pthread_mutex_lock (&registry_lock);
  other = registry_find_locked (be->key);
  if (other == NULL) {
    be->next = registry;
    registry = be;
  }
  pthread_mutex_unlock (&registry_lock);
  if (other) {
    /* Someone opened the same backend meanwhile: share theirs. */
    backend_close (be);
    be = other;
  }
  *out = be;
  return 0;
}

/* Another reference to a backend the caller already holds one to. */
void
backend_hold (struct backend *be)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry_lock);

  be->refs++;
}

/* Close a backend out of the registry (no lock held: closing a stacked
 * device's backend may free that device's tables, which put theirs).
 */
static void
backend_close (struct backend *be)
{
  free (be->key);
  backend_flush_destroy (be);
  be->ops->close (be);
}

void
backend_put (struct backend *be)
{
  struct backend **p;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry_lock);
    if (--be->refs > 0)
      return;
    for (p = &registry; *p != be; p = &(*p)->next)
      ;
    *p = be->next;
  }
  backend_close (be);
}

void
backend_kinds_stop (void)
{
  for (size_t i = 0; i < ARRAY_SIZE (kinds); i++)
    if (kinds[i]->stop)
      kinds[i]->stop ();
}

/* The backend registry: backends are shared by every table that names
 * them, keyed by canonical name, and closed when the last table using
 * them is freed.  Only table build/free come here, never the I/O path.
 */
#include <config.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

int
backend_get (const char *spec, struct backend **out, struct mapper_err *err)
{
  CLEANUP_FREE char *canonical = NULL;
  CLEANUP_FREE char *key = NULL;
  enum { KIND_DEVICE, KIND_NBD, KIND_FILE } kind;
  struct backend *be, *other;
  struct stat st;
  int r;

  if (*spec == '\0') {
    mapper_err_set (err, "empty device path");
    return -EINVAL;
  }

  /* The identity of what spec names: one backend per identity. */
  if (strncmp (spec, DEVICE_BACKEND_PREFIX,
               strlen (DEVICE_BACKEND_PREFIX)) == 0) {
    /* Another device of this server (stacking): keyed by its name. */
    kind = KIND_DEVICE;
    key = strdup (spec);
    if (key == NULL) {
      mapper_err_set (err, "out of memory");
      return -ENOMEM;
    }
  }
  else if (nbd_backend_is_uri (spec)) {
    /* Remote: the same normalised URI is the same backend. */
    kind = KIND_NBD;
    if ((r = nbd_backend_normalize (spec, &key, err)) < 0)
      return r;
  }
  else {
    /* Local files are the same backend when they are the same inode, by
     * whatever path (symlink, hard link, another device node).
     */
    kind = KIND_FILE;
    canonical = realpath (spec, NULL);
    if (canonical == NULL || stat (canonical, &st) == -1) {
      r = -errno;
      mapper_err_set (err, "%s: %s", spec, mapper_strerror (errno));
      return r;
    }
    if ((r = file_backend_key (&st, &key)) < 0) {
      mapper_err_set (err, "%s: not a regular file or block device", spec);
      return r;
    }
  }

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
  switch (kind) {
  case KIND_DEVICE: r = device_backend_open (spec, &be, err); break;
  case KIND_NBD: r = nbd_backend_open (key, &be, err); break;
  case KIND_FILE: r = file_backend_open (spec, canonical, &st, &be, err);
    break;
  }
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

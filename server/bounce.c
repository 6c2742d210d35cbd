/* SPDX-License-Identifier: BSD-3-Clause */
/* Per-thread bounce buffers, the one exception to clone-without-copy:
 * targets that transform data (crypt, flakey's corruption of writes)
 * cannot touch the client's write buffer (it is const), so they build
 * the transformed copy here.
 *
 * Each worker thread owns a small stack of buffers (a stacked device may
 * transform inside a transform), each grown as needed and kept for the
 * thread's next request, freed by a pthread key destructor when the thread
 * exits (nbdkit's workers end with their connection).  Never per device:
 * an idle table owns none.  No lock: only the owning thread touches them.
 */
#include <config.h>

#include <pthread.h>
#include <stdlib.h>

#include "internal.h"

#define BOUNCE_LEVELS 4          /* nesting depth served from the cache */
#define BOUNCE_ALIGN 4096

struct bounce_level {
  char *buf;
  size_t cap;
};

struct bounce_thread {
  unsigned depth;               /* bounce_get calls not yet put */
  struct bounce_level level[BOUNCE_LEVELS];
};

static pthread_once_t bounce_once = PTHREAD_ONCE_INIT;
static pthread_key_t bounce_key;
static __thread struct bounce_thread *bounce_self;

static void
bounce_thread_free (void *p)
{
  struct bounce_thread *bt = p;

  for (unsigned i = 0; i < BOUNCE_LEVELS; i++)
    free (bt->level[i].buf);
  free (bt);
}

static void
bounce_key_create (void)
{
  /* Fails only when the process is out of keys; then buffers are simply
   * not freed at thread exit (bounce_self still works).
   */
  if (pthread_key_create (&bounce_key, bounce_thread_free) != 0 &&
      mapper_debug)
    mapper_debug ("bounce: pthread_key_create failed: buffers will leak "
                  "at thread exit");
}

static struct bounce_thread *
bounce_thread (void)
{
  if (bounce_self == NULL) {
    pthread_once (&bounce_once, bounce_key_create);
    bounce_self = calloc (1, sizeof *bounce_self);
    if (bounce_self)
      pthread_setspecific (bounce_key, bounce_self);
  }
  return bounce_self;
}

/* len rounded up to the alignment (aligned_alloc wants a multiple). */
static char *
bounce_alloc (size_t len, size_t *cap)
{
  size_t n;

  if (__builtin_add_overflow (len, BOUNCE_ALIGN - 1, &n))
    return NULL;
  n &= ~(size_t) (BOUNCE_ALIGN - 1);
  if (n == 0)
    n = BOUNCE_ALIGN;
  *cap = n;
  return aligned_alloc (BOUNCE_ALIGN, n);
}

char *
bounce_get (size_t len)
{
  struct bounce_thread *bt = bounce_thread ();
  struct bounce_level *l;

  if (bt == NULL)
    return NULL;
  if (bt->depth >= BOUNCE_LEVELS) {
    /* Deeper than any sane stack of devices: not cached. */
    size_t cap;
    char *p = bounce_alloc (len, &cap);
    if (p)
      bt->depth++;
    return p;
  }
  l = &bt->level[bt->depth];
  if (l->cap < len) {
    /* Contents need not survive: free first, never realloc. */
    free (l->buf);
    l->cap = 0;
    l->buf = bounce_alloc (len, &l->cap);
    if (l->buf == NULL) {
      l->cap = 0;
      return NULL;
    }
  }
  bt->depth++;
  return l->buf;
}

void
bounce_put (char *buf)
{
  struct bounce_thread *bt = bounce_self;

  if (bt == NULL || bt->depth == 0)
    abort ();                   /* put without get */
  bt->depth--;
  if (bt->depth >= BOUNCE_LEVELS)
    free (buf);
}

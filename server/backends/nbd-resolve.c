/* SPDX-License-Identifier: BSD-3-Clause */
/* Host names, off the loop.  libnbd looks the host of an nbd:// or
 * nbds:// URI up with a blocking getaddrinfo inside nbd_aio_connect_uri.
 * For a URI whose host is a name, that call runs in the resolver thread,
 * which hands the handle (its TCP connect under way, non-blocking) to
 * the loop: a slow or dead DNS server delays that backend's
 * reconnections, never the loop and every other backend with it.
 *
 * The thread starts at the first lookup and stops at engine_stop (the
 * kind's stop, after the loop).  A lookup outlives what asked for it
 * when it must: it carries its own copy of the URI and the loop's
 * generation, and is freed by whoever holds it last.
 */
#include <config.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "nbd-internal.h"

/* A connection's handle being made by the resolver thread. */
struct lookup {
  struct ioloop_job job;        /* first: lookup_done, in the loop */
  struct lookup *next;          /* the resolver's queue */
  unsigned gen;                 /* the loop waiting for it */
  unsigned index;
  char *uri;                    /* its own copy: the backend may go first */
  struct nbd_handle *h;         /* the resolver's, then the loop's: or NULL */
  /* Loop thread only. */
  struct nbd_conn *conn;        /* NULL once the backend is closed */
  bool wanted;                  /* false once the attempt is over */
};

static pthread_mutex_t resolver_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t resolver_cond = PTHREAD_COND_INITIALIZER;
static struct lookup *lookups, **lookups_tail = &lookups;
static pthread_t resolver;
static bool resolver_running, resolver_stopping;

static void
lookup_free (struct lookup *lk)
{
  if (lk->h)
    nbd_close (lk->h);
  free (lk->uri);
  free (lk);
}

static void *
resolver_thread (void *arg)
{
  struct lookup *lk;
  char why[256];

  pthread_mutex_lock (&resolver_lock);
  for (;;) {
    while (lookups == NULL && !resolver_stopping)
      pthread_cond_wait (&resolver_cond, &resolver_lock);
    if ((lk = lookups) == NULL)
      break;                            /* stopping, nothing left */
    lookups = lk->next;
    if (lookups == NULL)
      lookups_tail = &lookups;
    if (resolver_stopping) {            /* its loop has stopped already */
      lookup_free (lk);
      continue;
    }
    pthread_mutex_unlock (&resolver_lock);
    lk->h = nbd_connect_handle (lk->uri, lk->index, why, sizeof why);
    if (lk->h == NULL)
      LOG ("%s: connection %u: connect: %s", lk->uri, lk->index, why);
    if (!ioloop_post (&lk->job, lk->gen))
      lookup_free (lk);                 /* that loop is gone */
    pthread_mutex_lock (&resolver_lock);
  }
  pthread_mutex_unlock (&resolver_lock);
  return NULL;
}

/* The kind's stop (engine_stop, after ioloop_stop): waits for a lookup
 * under way.
 */
void
nbd_resolver_stop (void)
{
  pthread_mutex_lock (&resolver_lock);
  if (!resolver_running) {
    pthread_mutex_unlock (&resolver_lock);
    return;
  }
  resolver_stopping = true;
  pthread_cond_broadcast (&resolver_cond);
  pthread_mutex_unlock (&resolver_lock);
  pthread_join (resolver, NULL);
  pthread_mutex_lock (&resolver_lock);
  resolver_running = resolver_stopping = false;
  pthread_mutex_unlock (&resolver_lock);
}

static void
lookup_done (struct ioloop_job *job, int error)
{
  struct lookup *lk = (struct lookup *) job;
  struct nbd_conn *conn = lk->conn;

  /* The loop stopped before running this (conn is stale then), or the
   * backend was closed: nobody wants the handle.
   */
  if (error || conn == NULL) {
    lookup_free (lk);
    return;
  }
  conn->lookup = NULL;
  /* Unwanted: the attempt is over (timed out, retired...), and conn has
   * its own timer for the next one.
   */
  if (lk->wanted) {
    if ((conn->h = lk->h) == NULL)
      nbd_conn_retry_later (conn);      /* the resolver logged why */
    else {
      lk->h = NULL;
      nbd_conn_check (conn);
      nbd_pump (conn->nb);
    }
  }
  lookup_free (lk);
}

int
nbd_lookup_start (struct nbd_conn *conn)
{
  struct lookup *lk = calloc (1, sizeof *lk);
  int r = 0;

  if (lk == NULL || (lk->uri = strdup (conn->nb->be.name)) == NULL) {
    free (lk);
    return -1;
  }
  lk->job.fn = lookup_done;
  lk->gen = conn->nb->attached_gen;
  lk->index = conn->index;
  lk->conn = conn;
  lk->wanted = true;

  pthread_mutex_lock (&resolver_lock);
  if (!resolver_running) {
    r = mapper_thread_create (&resolver, resolver_thread, "mapper-resolve");
    resolver_running = r == 0;
  }
  if (r == 0) {
    lk->next = NULL;
    *lookups_tail = lk;
    lookups_tail = &lk->next;
    pthread_cond_signal (&resolver_cond);
  }
  pthread_mutex_unlock (&resolver_lock);
  if (r != 0) {
    LOG ("%s: resolver thread: %s", conn->nb->be.name, mapper_strerror (r));
    lookup_free (lk);
    return -1;
  }
  conn->lookup = lk;
  return 0;
}

void
nbd_lookup_give_up (struct nbd_conn *conn)
{
  if (conn->lookup)
    conn->lookup->wanted = false;
}

void
nbd_lookup_forget (struct nbd_conn *conn)
{
  if (conn->lookup)
    conn->lookup->conn = NULL;
}

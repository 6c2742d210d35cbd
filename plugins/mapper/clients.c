/* SPDX-License-Identifier: BSD-3-Clause */
/* The connection registry behind nbdmsetup clients (clients.h).
 *
 * nbdkit 1.32 tells a plugin, in the connection's thread: the peer's
 * address (nbdkit_peer_name: IP and port over TCP, nothing more for a
 * Unix socket), and for a Unix socket the peer's credentials
 * (nbdkit_peer_uid / nbdkit_peer_pid, SO_PEERCRED taken by nbdkit:
 * the plugin never sees the socket), and whether the connection uses
 * TLS (nbdkit_is_tls).
 */
#include <config.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "engine.h"
#include "clients.h"

/* A worker thread's count of the connection's requests: written by that
 * thread only, summed by clients_print.
 */
struct client_slot {
  struct client_slot *next;     /* the client's list, under its lock */
  _Atomic uint64_t inflight;
  _Atomic uint64_t requests;
} __attribute__ ((aligned (64)));

struct client {
  struct client *next, *prev;   /* the registry, under clients_lock */
  uint64_t uid;                 /* never reused: the threads' key */
  struct device *dev;           /* NULL: control */
  const char *family;           /* "tcp", "unix" or "unknown" */
  char peer[INET6_ADDRSTRLEN + 64];
  bool tls;
  struct timespec since;        /* CLOCK_REALTIME */
  pthread_mutex_t lock;         /* slots */
  struct client_slot *slots;
};

static pthread_mutex_t clients_lock = PTHREAD_MUTEX_INITIALIZER;
static struct client *first, *last;
static _Atomic uint64_t next_uid = 1;

/* The slot of the connection this thread last served (nbdkit's worker
 * threads each serve one connection): keyed by the client's uid, not
 * its address, which a later connection may get.
 */
static __thread uint64_t my_uid;
static __thread struct client_slot *my_slot;

static void
describe_peer (struct client *c)
{
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  char addr[INET6_ADDRSTRLEN];

  c->family = "unknown";
  strcpy (c->peer, "-");
  memset (&ss, 0, sizeof ss);
  if (nbdkit_peer_name ((struct sockaddr *) &ss, &len) == -1)
    return;                     /* -s, or a socket nbdkit cannot name */
  switch (ss.ss_family) {
  case AF_INET: case AF_INET6: {
    bool v6 = ss.ss_family == AF_INET6;
    struct sockaddr_in *sin = (struct sockaddr_in *) &ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *) &ss;
    if (inet_ntop (ss.ss_family, v6 ? (void *) &sin6->sin6_addr
                   : (void *) &sin->sin_addr, addr, sizeof addr)) {
      c->family = "tcp";
      snprintf (c->peer, sizeof c->peer, v6 ? "[%s]:%u" : "%s:%u", addr,
                (unsigned) ntohs (v6 ? sin6->sin6_port : sin->sin_port));
    }
    break;
  }
  case AF_UNIX: {
    int64_t uid = nbdkit_peer_uid (), pid = nbdkit_peer_pid ();
    c->family = "unix";
    if (uid >= 0 && pid >= 0)
      snprintf (c->peer, sizeof c->peer, "uid=%" PRIi64 ",pid=%" PRIi64,
                uid, pid);
    else if (uid >= 0)
      snprintf (c->peer, sizeof c->peer, "uid=%" PRIi64, uid);
    break;
  }
  default:
    break;
  }
}

struct client *
client_open (struct device *dev)
{
  struct client *c = calloc (1, sizeof *c);

  if (c == NULL) {
    nbdkit_error ("calloc: %s", mapper_strerror (errno));
    return NULL;
  }
  c->uid = atomic_fetch_add (&next_uid, 1);
  c->dev = dev;
  describe_peer (c);
  c->tls = nbdkit_is_tls () == 1;
  clock_gettime (CLOCK_REALTIME, &c->since);
  pthread_mutex_init (&c->lock, NULL);

  pthread_mutex_lock (&clients_lock);
  c->prev = last;
  if (last)
    last->next = c;
  else
    first = c;
  last = c;
  pthread_mutex_unlock (&clients_lock);
  return c;
}

void
client_close (struct client *c)
{
  struct client_slot *s, *next;

  if (c == NULL)
    return;
  pthread_mutex_lock (&clients_lock);
  if (c->prev)
    c->prev->next = c->next;
  else
    first = c->next;
  if (c->next)
    c->next->prev = c->prev;
  else
    last = c->prev;
  pthread_mutex_unlock (&clients_lock);
  for (s = c->slots; s; s = next) {
    next = s->next;
    free (s);
  }
  pthread_mutex_destroy (&c->lock);
  free (c);
}

/* The owner's add: a load and a store, no locked instruction. */
static inline void
add (_Atomic uint64_t *p, uint64_t n)
{
  atomic_store_explicit (p, atomic_load_explicit (p, memory_order_relaxed)
                         + n, memory_order_relaxed);
}

struct client_slot *
client_request_start (struct client *c)
{
  struct client_slot *s = my_slot;

  if (c == NULL)
    return NULL;
  if (my_uid != c->uid) {
    /* This thread's first request on the connection. */
    s = aligned_alloc (64, sizeof *s);
    if (s == NULL)
      return NULL;              /* not counted */
    memset (s, 0, sizeof *s);
    pthread_mutex_lock (&c->lock);
    s->next = c->slots;
    c->slots = s;
    pthread_mutex_unlock (&c->lock);
    my_uid = c->uid;
    my_slot = s;
  }
  add (&s->inflight, 1);
  return s;
}

void
client_request_end (struct client_slot *s)
{
  if (s == NULL)
    return;
  add (&s->inflight, -1);
  add (&s->requests, 1);
}

void
clients_print (FILE *out, bool all, struct device *dev)
{
  pthread_mutex_lock (&clients_lock);
  for (struct client *c = first; c; c = c->next) {
    uint64_t inflight = 0, requests = 0;

    if (!all && c->dev != dev)
      continue;
    pthread_mutex_lock (&c->lock);
    for (struct client_slot *s = c->slots; s; s = s->next) {
      inflight += atomic_load_explicit (&s->inflight, memory_order_relaxed);
      requests += atomic_load_explicit (&s->requests, memory_order_relaxed);
    }
    pthread_mutex_unlock (&c->lock);
    fprintf (out, "%s\t%s\t%s\t%d\t%lld.%09ld\t%" PRIu64 "\t%" PRIu64 "\n",
             c->dev ? device_name (c->dev) : MAPPER_RESERVED_NAME,
             c->family, c->peer, c->tls, (long long) c->since.tv_sec,
             c->since.tv_nsec, inflight, requests);
  }
  pthread_mutex_unlock (&clients_lock);
}

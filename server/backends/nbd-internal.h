/* SPDX-License-Identifier: BSD-3-Clause */
/* The NBD backend's private header: its state and what its files
 * (backends/nbd*.c) call of each other.
 *
 *   nbd.c          the backend: its ops, opening, and the commands it
 *                  issues (splitting, completion, deadlines);
 *   nbd-conn.c     its connections: handshakes, reconnection with
 *                  back-off, what a lost connection takes with it;
 *   nbd-wire.c     the transmission phase spoken on the socket itself
 *                  (plaintext connections without structured replies);
 *   nbd-resolve.c  the resolver thread: host names looked up off the
 *                  I/O loop;
 *   nbd-uri.c      NBD URIs: recognised and normalised (one key per
 *                  export).
 *
 * Everything here is the I/O loop thread's (or the backend owner's when
 * no loop runs) unless a comment says otherwise.
 */
#ifndef NBDMAPPER_NBD_INTERNAL_H
#define NBDMAPPER_NBD_INTERNAL_H

#include <semaphore.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ev.h>
#include <libnbd.h>

#include "backend.h"
#include "util.h"

#define LOG(...) do { if (mapper_debug) mapper_debug (__VA_ARGS__); } while (0)

#define BACKOFF_MIN 0.05        /* seconds before the first reconnect */
#define BACKOFF_MAX 1.0
#define MAX_PAYLOAD (32u << 20) /* split reads/writes above this */
#define MAX_NOPAYLOAD (1u << 30) /* and zero/trim above this */
#define ZERO_BUF (4u << 20)     /* zeros written when the server can't zero */
#define INLINE_CALM 32          /* requests alone before inline again */
#ifndef SPILL
#define SPILL 32                /* commands on a connection before the next */
#endif

struct nbd_backend;
struct nbd_conn;
struct nbd_wire;
struct lookup;

/* One clone (or extents query) in the loop's hands.  Loop thread only. */
struct nbd_cmd {
  struct nbd_cmd *next, *prev;  /* on a connection's or the wait list */
  struct nbd_backend *nb;
  struct nbd_conn *conn;        /* while issued */
  struct clone *c;              /* a clone, or */
  struct nbd_extents *x;        /* an extents query */
  ev_tstamp deadline;
  unsigned parts;               /* libnbd commands not completed (+1 issuing) */
  int error;                    /* first -errno of a part */
  bool lost;                    /* a part saw the connection go */
  uint64_t ack_mark;            /* IO_FLUSH: nb->ack_clock when sent */
};

struct cmd_list {
  struct nbd_cmd *head, *tail;
  unsigned len;
};

enum conn_state { CONN_DOWN, CONN_CONNECTING, CONN_UP };

/* Who may touch a direct connection's socket (the ownership protocol,
 * nbd-wire.c's header comment).  Not direct: always OWN_LOOP.
 */
enum conn_owner {
  OWN_LOOP,                     /* the loop's: watched, as before */
  OWN_PARKED,                   /* idle, unwatched: a worker may take it */
  OWN_WORKER,                   /* a worker's request is on it */
  OWN_BROKEN,                   /* a worker gave it up: the loop drops it */
};

struct nbd_conn {
  struct nbd_backend *nb;       /* read-only */
  unsigned index;               /* read-only */
  /* Loop thread only (or the owner of the backend when no loop runs). */
  struct nbd_handle *h;         /* NULL when down */
  enum conn_state state;
  ev_io io;                     /* h's fd, events from nbd_aio_get_direction
                                 * (or, direct, from wire) */
  struct nbd_wire *wire;        /* direct (nbd-wire.c) while up, or NULL */
  ev_timer timer;               /* down: back-off; connecting: deadline */
  double backoff;
  bool lost;                    /* a command saw the connection go */
  bool retired;                 /* multi-conn lost (keep_only): never reopened */
  struct lookup *lookup;        /* the resolver is making h, or NULL */
  struct cmd_list inflight;

  /* The ownership protocol (nbd-wire.c).  owner: any thread, atomics
   * only.  inline_fd is set by the loop before it parks the connection
   * (published by that store), read by the worker that takes it.  The
   * broken_* fields are the worker's until it queues broken_job, the
   * loop's from then on.
   */
  _Atomic int owner;            /* enum conn_owner */
  _Atomic bool drop_wanted;     /* the loop wants it closed (abandon,
                                 * keep_only) while a worker holds it */
  _Atomic bool broken_queued;   /* broken_job queued, not yet run */
  const char *drop_why;         /* the loop's, before drop_wanted */
  int inline_fd;
  struct ioloop_job broken_job;
  struct clone *broken_clone;   /* the worker's clone, for the loop to
                                 * retry or fail as a lost command */
  bool broken_timeout;          /* it got no reply by its deadline */
  ev_tstamp broken_deadline;    /* its clone's (ev_time), kept on retry */
  char broken_why[160];
};

/* Adaptive polling of inline replies (nbd-wire.c): one per backend. */
struct wire_poll {
  uint32_t max_ns;              /* read-only after open; 0: never poll */
  _Atomic uint32_t ns;          /* the window now, 0 to max_ns */
  _Atomic uint64_t polled;      /* replies waited for by polling first */
  _Atomic uint64_t caught;      /* of them, complete within the window */
};

/* What the first handshake promised; a reconnection must keep it, except
 * multi-conn: without it the backend goes on with one connection.
 */
struct nbd_export {
  int64_t size;
  bool read_only, flush, fua, trim, zero, fast_zero, multi_conn, extents;
  uint32_t block_min, block_pref, block_max;
};

struct nbd_backend {
  struct backend be;            /* first: the engine sees this */

  /* Read-only after open.  The normalised URI is be.name (and be.key). */
  unsigned nr_conns;
  double timeout;               /* seconds */
  bool lookup;                  /* the URI's host is a name: nbd-resolve.c */
  struct nbd_export ex;
  uint64_t max_payload;         /* per libnbd read/write command */

  /* Loop thread only (the owner of the backend when no loop runs). */
  struct nbd_handle *probe;     /* the open-time connection, until adopted */
  unsigned attached_gen;        /* loop generation watchers belong to */
  struct nbd_conn *conns;
  struct cmd_list waiting;      /* commands waiting for a connection */
  struct nbd_cmd *free_cmds;
  /* Commands waiting or issued; read by workers (nbd_try_inline). */
  _Atomic unsigned outstanding;
  ev_timer tick;                /* request deadlines, while outstanding */
  ev_timer idle_check;          /* parked connections: has the server
                                 * gone? (nothing watches them) */
  ev_prepare flush;             /* direct connections: send what this
                                 * turn of the loop queued (on_flush) */
  ev_tstamp down_since;         /* no connection up since, or 0 */
  bool single;                  /* multi-conn lost: one connection left */
  uint64_t nr_losses, nr_retries, nr_timeouts;
  /* Which acknowledged writes a lost connection may take with it: the
   * clock counts write replies (not FUA) on every connection; writes up
   * to flushed_ack were covered by a successful flush (sent after
   * them), those up to lost_ack are already reported lost.  A
   * connection lost with nothing after both loses nothing new: one
   * outage of the server, whose connections go one after the other, is
   * one loss, not one per connection.
   */
  _Atomic uint64_t ack_clock, flushed_ack; /* also inline workers' */
  uint64_t lost_ack;

  /* Inline requests (any thread, atomics): want says the loop found
   * every up connection held by workers while commands waited, so the
   * next worker to hand one back queues pump_job (once: pump_queued).
   */
  _Atomic bool want, pump_queued;
  _Atomic bool park;            /* a request could have gone inline: the
                                 * loop parks idle direct connections
                                 * (while deep is 0) */
  _Atomic bool inline_busy;     /* a worker's request is inline now */
  _Atomic unsigned deep;        /* requests still to come alone before
                                 * one goes inline (INLINE_CALM after one
                                 * came with another in flight) */
  struct ioloop_job pump_job;
  _Atomic uint64_t nr_inline;   /* requests done inline */
  struct wire_poll poll;        /* their reply waits (nbd_wire_inline) */
};

#define NB(be) ((struct nbd_backend *) (be))

/* An extents query: the worker asking (nbd_extents) waits on done while
 * the loop runs it as a command.
 */
struct nbd_extents {
  struct ioloop_job job;
  struct nbd_backend *nb;
  uint64_t offset, len;
  bool req_one;
  sem_t done;
  int error;
  uint32_t *entries;            /* (length, flags) pairs, loop-owned until done */
  size_t nr, cap;
};

/* Command lists. */
static inline void
list_append (struct cmd_list *l, struct nbd_cmd *cmd)
{
  cmd->next = NULL;
  cmd->prev = l->tail;
  if (l->tail)
    l->tail->next = cmd;
  else
    l->head = cmd;
  l->tail = cmd;
  l->len++;
}

static inline void
list_remove (struct cmd_list *l, struct nbd_cmd *cmd)
{
  if (cmd->prev)
    cmd->prev->next = cmd->next;
  else
    l->head = cmd->next;
  if (cmd->next)
    cmd->next->prev = cmd->prev;
  else
    l->tail = cmd->prev;
  l->len--;
}

/* nbd.c: the command is finished for good (its clone or extents query
 * completes with error).
 */
void nbd_cmd_complete (struct nbd_cmd *cmd, int error);
/* One part of cmd got its reply (error: an errno or 0). */
void nbd_part_done (struct nbd_cmd *cmd, int error);
/* Issue waiting commands while a connection is up. */
void nbd_pump (struct nbd_backend *nb);
/* A worker's attempt to run clone c inline (nbd-wire.c's ownership
 * protocol): true if c is taken care of (done, or handed to the loop).
 */
bool nbd_try_inline (struct nbd_backend *nb, struct clone *c);

/* nbd-conn.c */
/* A handle for connection index, connecting to uri (the TCP or Unix
 * connect under way, non-blocking; a host name is looked up first, with
 * a blocking getaddrinfo).  NULL with the reason in why[len].  From any
 * thread (the resolver, a table load's probe).
 */
struct nbd_handle *nbd_connect_handle (const char *uri, unsigned index,
                                       char *why, size_t len);
/* What the handshake on h promised (any thread, h its owner's). */
void nbd_read_export (struct nbd_handle *h, struct nbd_export *ex);
bool nbd_conn_dead (struct nbd_conn *conn);
/* Watch conn's fd for what libnbd waits for. */
void nbd_conn_update_io (struct nbd_conn *conn);
/* Close conn (why: for the log); its commands wait for another
 * connection, or fail if they are flushes or past their deadline.
 */
void nbd_conn_drop (struct nbd_conn *conn, const char *why);
/* conn is down: try again after its back-off. */
void nbd_conn_retry_later (struct nbd_conn *conn);
/* After libnbd ran on conn: notice death or the end of the handshake. */
void nbd_conn_check (struct nbd_conn *conn);
bool nbd_any_up (struct nbd_backend *nb);
void nbd_close_handle (struct nbd_conn *conn, bool graceful);
/* The backend's connections adopted by the current loop (attach). */
void nbd_conns_attach (struct nbd_backend *nb);
/* The loop wants conn (up): true if it is the loop's now (taken back
 * from the parked state), false if a worker holds it.
 */
bool nbd_conn_claim (struct nbd_conn *conn);
/* The loop is done with conn for now: park it if it is direct and
 * idle, else watch what it waits for.
 */
void nbd_conn_settle (struct nbd_conn *conn);
/* The loop wants conn closed (why: for the log): now if it can claim
 * it, else when the worker holding it hands it back.
 */
void nbd_conn_drop_soon (struct nbd_conn *conn, const char *why);
/* If conn is parked: has its server closed it (or sent anything)?  Then
 * the loop takes it back and reads what came at once (a closed
 * connection is down when this returns), watched again if it stays.
 */
void nbd_conn_check_parked (struct nbd_conn *conn);
/* Worker side: take a parked connection of nb (NULL if none), hand it
 * back after a normal exchange, or give it up broken (why; c, if not
 * NULL, to be retried or failed by the loop as a command lost with the
 * connection, until deadline, the ev_time () its inline attempt had:
 * timed_out, it is past).
 */
struct nbd_conn *nbd_conn_take (struct nbd_backend *nb);
void nbd_conn_release (struct nbd_conn *conn);
void nbd_conn_give_up (struct nbd_conn *conn, struct clone *c,
                       ev_tstamp deadline, bool timed_out, const char *why);

/* nbd-wire.c: the transmission phase on the socket (loop thread). */
/* May h's connection go direct (plaintext, simple replies only)? */
bool nbd_wire_eligible (struct nbd_handle *h);
struct nbd_wire *nbd_wire_new (struct nbd_handle *h);
void nbd_wire_free (struct nbd_wire *w);
/* Queue one request of cmd (sent by nbd_wire_io); 0 or -ENOMEM.
 * flags: LIBNBD_CMD_FLAG_* (the protocol's values).
 */
int nbd_wire_issue (struct nbd_wire *w, struct nbd_cmd *cmd, enum io_op op,
                    uint16_t flags, char *buf, uint64_t offset,
                    uint64_t len);
/* Receive (EV_READ) and send what is queued: NULL, or why the
 * connection failed (in why[whylen]).  Replies complete their parts.
 */
const char *nbd_wire_io (struct nbd_wire *w, int revents, char *why,
                         size_t whylen);
bool nbd_wire_want_write (const struct nbd_wire *w);
int nbd_wire_fd (const struct nbd_wire *w);
bool nbd_wire_has_unsent (const struct nbd_wire *w);
/* Nothing queued, nothing awaited, nothing half read: may be parked. */
bool nbd_wire_idle (const struct nbd_wire *w);
/* A worker's inline exchange on the parked socket fd: one request, its
 * reply (a read's data straight into buf), by deadline (monotonic_ns),
 * polling for the reply first as poll says (and adapting it).
 * The reply's errno (0: success), or -1 with why the connection failed
 * in why[whylen] (also once *drop is seen true while it waits), or
 * -ETIMEDOUT.
 */
int nbd_wire_inline (int fd, enum io_op op, uint16_t flags, char *buf,
                     uint64_t offset, uint32_t len, uint64_t deadline,
                     const _Atomic bool *drop, struct wire_poll *poll,
                     char *why, size_t whylen);

/* nbd-resolve.c: make conn's handle in the resolver thread (the URI's
 * host is a name); 0, or -1 (try again later).  The handle comes back
 * through the loop, to nbd_conn_check.
 */
int nbd_lookup_start (struct nbd_conn *conn);
/* conn's attempt is over (timed out, retired): the handle the resolver
 * is making for it is not wanted.
 */
void nbd_lookup_give_up (struct nbd_conn *conn);
/* conn is about to be freed (the backend closes): the lookup's handle
 * goes nowhere.
 */
void nbd_lookup_forget (struct nbd_conn *conn);
/* The kind's stop (engine_stop, after the I/O loop). */
void nbd_resolver_stop (void);

/* nbd-uri.c: NBD URIs (any thread). */
bool nbd_backend_is_uri (const char *spec);
/* The normalised URI, malloc'd in *uri: the backend's key. */
int nbd_backend_normalize (const char *spec, char **uri,
                           struct mapper_err *err);
/* Is the host of this normalised TCP URI a name rather than an
 * address (so that connecting looks it up)?
 */
bool nbd_uri_host_is_name (const char *uri);

#endif /* NBDMAPPER_NBD_INTERNAL_H */

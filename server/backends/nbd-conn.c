/* SPDX-License-Identifier: BSD-3-Clause */
/* The NBD backend's connections (up to remote-connections per backend
 * when the server allows multi-conn).  Each is down, connecting or up;
 * the I/O loop watches its fd and its timer (back-off while down, the
 * handshake's deadline while connecting).
 *
 * A dropped connection is reopened with back-off; its commands go back
 * to the backend's wait list, to be issued again on whichever connection
 * comes up first (nbd.c), except flushes, whose writes may be gone, and
 * fail-fast clones (CLONE_FAILFAST: a multipath's), which fail at once.
 * Every lost connection may have lost acknowledged writes:
 * backend_writes_lost() makes the next flush fail.  A reconnection must
 * keep what the first handshake promised (size, capabilities, block
 * sizes), except multi-conn: without it the backend goes on with one
 * connection.
 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "nbd-internal.h"

static const char *const conn_state_name[] = {
  [CONN_DOWN] = "down", [CONN_CONNECTING] = "connecting", [CONN_UP] = "up",
};

/* A handle for connection index, connecting to uri (the TCP or Unix
 * connect under way, non-blocking; a host name is looked up first, with
 * a blocking getaddrinfo).  NULL with the reason in why[len].
 *
 * Only connection 0 (the one probed at open) asks for structured
 * replies, which block status needs.  The others don't: libnbd 1.14
 * reads a structured data chunk in four recv calls and a simple read
 * reply in two, in the loop thread, for every read.  Reads and writes
 * go to them first (pick_conn).
 */
struct nbd_handle *
nbd_connect_handle (const char *uri, unsigned index, char *why, size_t len)
{
  struct nbd_handle *h = nbd_create ();
  char name[32];

  snprintf (name, sizeof name, "mapper-nbd-c%u", index);
  if (h == NULL ||
      nbd_set_handle_name (h, name) == -1 ||
      nbd_set_uri_allow_local_file (h, true) == -1 ||
      nbd_set_pread_initialize (h, false) == -1 ||
      (index == 0
       ? nbd_add_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION)
       : nbd_set_request_structured_replies (h, false)) == -1 ||
      nbd_aio_connect_uri (h, uri) == -1) {
    const char *e = nbd_get_error ();
    snprintf (why, len, "%s", e ? e : "unknown error");
    nbd_close (h);                      /* NULL is fine */
    return NULL;
  }
  return h;
}

void
nbd_read_export (struct nbd_handle *h, struct nbd_export *ex)
{
  int64_t v;

  ex->size = nbd_get_size (h);
  ex->read_only = nbd_is_read_only (h) == 1;
  ex->flush = nbd_can_flush (h) == 1;
  ex->fua = nbd_can_fua (h) == 1;
  ex->trim = nbd_can_trim (h) == 1;
  ex->zero = nbd_can_zero (h) == 1;
  ex->fast_zero = nbd_can_fast_zero (h) == 1;
  ex->multi_conn = nbd_can_multi_conn (h) == 1;
  ex->extents = nbd_can_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
  v = nbd_get_block_size (h, LIBNBD_SIZE_MINIMUM);
  ex->block_min = v > 0 ? v : 1;
  v = nbd_get_block_size (h, LIBNBD_SIZE_PREFERRED);
  ex->block_pref = v > 0 ? v : 4096;
  v = nbd_get_block_size (h, LIBNBD_SIZE_MAXIMUM);
  ex->block_max = v > 0 ? v : 0xffffffff;
}

/* Does a new handshake keep every promise the first one made? */
static const char *
export_changed (const struct nbd_backend *nb, const struct nbd_export *now)
{
  const struct nbd_export *was = &nb->ex;

  if (now->size < was->size)
    return "the export shrank";
  if (now->read_only && !was->read_only)
    return "the export became read-only";
  if ((was->flush && !now->flush) || (was->fua && !now->fua) ||
      (was->trim && !now->trim) || (was->zero && !now->zero) ||
      (was->fast_zero && !now->fast_zero) ||
      (was->extents && !now->extents))
    return "the export lost a capability";
  if (now->block_min > was->block_min || now->block_max < nb->max_payload)
    return "the export's block size limits changed";
  return NULL;
}

bool
nbd_conn_dead (struct nbd_conn *conn)
{
  return nbd_aio_is_dead (conn->h) || nbd_aio_is_closed (conn->h);
}

void
nbd_conn_update_io (struct nbd_conn *conn)
{
  struct ev_loop *l = ioloop_ev ();
  unsigned dir;
  /* Direct: the wire's copy (nbd_aio_get_fd takes the handle's lock). */
  int fd = conn->wire ? nbd_wire_fd (conn->wire) : nbd_aio_get_fd (conn->h);
  int events;

  if (conn->wire) {
    /* Direct: always reading (a reply, or the server going); writing
     * when the socket was full.  What this turn of the loop queued goes
     * out before it polls again, all in one send (on_flush).
     */
    events = EV_READ;
    if (nbd_wire_want_write (conn->wire))
      events |= EV_WRITE;
    else if (nbd_wire_has_unsent (conn->wire) &&
             !ev_is_active (&conn->nb->flush))
      ev_prepare_start (l, &conn->nb->flush);
  }
  else {
    dir = nbd_aio_get_direction (conn->h);
    events = ((dir & LIBNBD_AIO_DIRECTION_READ) ? EV_READ : 0) |
      ((dir & LIBNBD_AIO_DIRECTION_WRITE) ? EV_WRITE : 0);
  }

  if (fd == -1 || events == 0) {
    ev_io_stop (l, &conn->io);
    return;
  }
  if (ev_is_active (&conn->io) && conn->io.fd == fd &&
      conn->io.events == events)
    return;
  ev_io_stop (l, &conn->io);
  ev_io_set (&conn->io, fd, events);
  ev_io_start (l, &conn->io);
}

void
nbd_close_handle (struct nbd_conn *conn, bool graceful)
{
  if (conn->h == NULL)
    return;
  if (graceful && nbd_aio_is_ready (conn->h))
    nbd_aio_disconnect (conn->h, 0);
  else {
    /* The fd may be shared with a process forked since (nbdkit --run):
     * shut the socket down so the server sees the end.
     */
    int fd = nbd_aio_get_fd (conn->h);
    if (fd >= 0)
      shutdown (fd, SHUT_RDWR);
  }
  nbd_close (conn->h);
  conn->h = NULL;
  nbd_wire_free (conn->wire);   /* the requests on it are conn->inflight's */
  conn->wire = NULL;
}

void
nbd_conn_retry_later (struct nbd_conn *conn)
{
  struct ev_loop *l = ioloop_ev ();

  conn->state = CONN_DOWN;
  nbd_lookup_give_up (conn);            /* this attempt is over */
  ev_timer_stop (l, &conn->timer);
  if (conn->retired)
    return;
  ev_timer_set (&conn->timer, conn->backoff, 0);
  ev_timer_start (l, &conn->timer);
  conn->backoff = conn->backoff ? MIN (conn->backoff * 2, BACKOFF_MAX)
    : BACKOFF_MIN;
}

bool
nbd_any_up (struct nbd_backend *nb)
{
  for (unsigned i = 0; i < nb->nr_conns; i++)
    if (nb->conns[i].state == CONN_UP)
      return true;
  return false;
}

/* Close conn; its commands go back to the wait list, except flushes
 * (the writes they cover may be gone: never retried into a success) and
 * commands past their deadline, which fail with EIO.
 */
void
nbd_conn_drop (struct nbd_conn *conn, const char *why)
{
  struct nbd_backend *nb = conn->nb;
  struct ev_loop *l = ioloop_ev ();
  ev_tstamp now = ev_now (l);
  bool was_up = conn->state == CONN_UP;
  struct nbd_cmd *cmd;

  /* libnbd's last error says why only when the handle died; after a
   * timeout it is whatever call failed last on this thread.
   */
  const char *error = conn->h && nbd_conn_dead (conn) ? nbd_get_error ()
    : NULL;

  LOG ("%s: connection %u %s -> down: %s%s%s", nb->be.name, conn->index,
       conn_state_name[conn->state], why, error ? ": " : "",
       error ? error : "");
  ev_io_stop (l, &conn->io);
  nbd_close_handle (conn, false);
  /* Down from now on: nbd_any_up below must not count this connection, or
   * the last one to go never starts down_since, and requests wait out
   * their whole timeout instead of failing at once while reconnects
   * fail (they fail without a nbd_conn_drop when connect(2) does at once,
   * e.g. ENETUNREACH).
   */
  conn->state = CONN_DOWN;
  conn->lost = false;
  if (was_up) {
    nb->nr_losses++;
    /* Any connection's acknowledged writes, not only this one's: a lost
     * connection may be a restarted server, which lost them all, and the
     * others may be found dead only after a flush on a new connection
     * (to the new server) has "covered" their writes.
     */
    if (nb->ack_clock > MAX (nb->flushed_ack, nb->lost_ack)) {
      nb->lost_ack = nb->ack_clock;
      backend_writes_lost (&nb->be);
    }
  }
  while ((cmd = conn->inflight.head) != NULL) {
    list_remove (&conn->inflight, cmd);
    cmd->conn = NULL;
    /* A fail-fast clone goes elsewhere at once (its multipath). */
    if ((cmd->c && (cmd->c->op == IO_FLUSH ||
                    (cmd->c->flags & CLONE_FAILFAST))) ||
        now >= cmd->deadline) {
      if (now >= cmd->deadline)
        nb->nr_timeouts++;
      nbd_cmd_complete (cmd, -EIO);
    }
    else {
      nb->nr_retries++;
      list_append (&nb->waiting, cmd);
    }
  }
  if (!nbd_any_up (nb) && nb->down_since == 0)
    nb->down_since = now;
  nbd_conn_retry_later (conn);
}

/* The server no longer allows multi-conn: a flush on one connection
 * need not cover writes made on another, so carry on with keep alone.
 * The others are closed for good: their commands are retried on keep,
 * and the writes acknowledged on them count as lost (nbd_conn_drop), so the
 * next flush fails once.  When keep is not connection 0, extents report
 * data from then on (nbd_pump).
 */
static void
keep_only (struct nbd_conn *keep)
{
  struct nbd_backend *nb = keep->nb;

  LOG ("%s: the server no longer allows multi-conn: connection %u only "
       "from now on", nb->be.name, keep->index);
  nb->single = true;
  for (unsigned i = 0; i < nb->nr_conns; i++) {
    struct nbd_conn *conn = &nb->conns[i];

    if (conn == keep)
      continue;
    conn->retired = true;
    if (conn->h)
      nbd_conn_drop_soon (conn, "no multi-conn");
    else
      nbd_conn_retry_later (conn);      /* stops its timer */
  }
}

static void
conn_up (struct nbd_conn *conn)
{
  struct nbd_backend *nb = conn->nb;
  struct nbd_export now;
  const char *why;

  nbd_read_export (conn->h, &now);
  if (conn->index > 0)
    now.extents = nb->ex.extents;       /* connection 0's to give */
  if ((why = export_changed (nb, &now)) != NULL) {
    LOG ("%s: connection %u: reconnected, but %s: not using it",
         nb->be.name, conn->index, why);
    ev_io_stop (ioloop_ev (), &conn->io);
    nbd_close_handle (conn, true);
    nbd_conn_retry_later (conn);
    return;
  }
  if (nb->nr_conns > 1 && !nb->single && !now.multi_conn)
    keep_only (conn);
  ev_timer_stop (ioloop_ev (), &conn->timer);
  conn->state = CONN_UP;
  conn->backoff = BACKOFF_MIN;
  nb->down_since = 0;
  /* Plaintext and simple replies: speak the transmission phase on the
   * socket (nbd-wire.c); without memory for it, through libnbd.
   */
  if (nbd_wire_eligible (conn->h))
    conn->wire = nbd_wire_new (conn->h);
  LOG ("%s: connection %u -> up%s", nb->be.name, conn->index,
       conn->wire ? " (direct)" : "");
  nbd_conn_settle (conn);
}

/* After libnbd ran on conn: notice death or the end of the handshake. */
void
nbd_conn_check (struct nbd_conn *conn)
{
  if (nbd_conn_dead (conn) || conn->lost)
    nbd_conn_drop (conn, conn->state == CONN_UP ? "connection lost"
               : "connect failed");
  else if (conn->state == CONN_CONNECTING && nbd_aio_is_ready (conn->h))
    conn_up (conn);
  else
    nbd_conn_update_io (conn);
}

/* A direct connection's I/O (events, or 0: send what is queued). */
static void
wire_io (struct nbd_conn *conn, int revents)
{
  char why[128];

  /* libnbd never runs on a direct socket: only a reply can lose it. */
  if (nbd_wire_io (conn->wire, revents, why, sizeof why))
    nbd_conn_drop (conn, why);
  else if (conn->lost)
    nbd_conn_drop (conn, "connection lost");
  else
    nbd_conn_settle (conn);
}

static void
on_io (struct ev_loop *l, ev_io *w, int revents)
{
  struct nbd_conn *conn = w->data;

  if (conn->wire) {
    wire_io (conn, revents);
    nbd_pump (conn->nb);
    return;
  }
  if (revents & EV_READ)
    nbd_aio_notify_read (conn->h);
  if ((revents & EV_WRITE) && !nbd_conn_dead (conn))
    nbd_aio_notify_write (conn->h);
  nbd_conn_check (conn);
  nbd_pump (conn->nb);
}

static void
conn_connect (struct nbd_conn *conn)
{
  struct nbd_backend *nb = conn->nb;
  struct ev_loop *l = ioloop_ev ();

  if (nb->lookup) {
    /* A lookup that timed out may still be running: one at a time. */
    if (conn->lookup || nbd_lookup_start (conn) == -1) {
      nbd_conn_retry_later (conn);
      return;
    }
  }
  else {
    char why[256];
    conn->h = nbd_connect_handle (nb->be.name, conn->index, why, sizeof why);
    if (conn->h == NULL) {
      LOG ("%s: connection %u: connect: %s", nb->be.name, conn->index, why);
      nbd_conn_retry_later (conn);
      return;
    }
  }
  conn->state = CONN_CONNECTING;
  LOG ("%s: connection %u -> connecting%s", nb->be.name, conn->index,
       conn->h ? "" : " (looking the host up)");
  /* The handshake (and the lookup) has the same deadline as a request. */
  ev_timer_stop (l, &conn->timer);
  ev_timer_set (&conn->timer, nb->timeout, 0);
  ev_timer_start (l, &conn->timer);
  if (conn->h)
    nbd_conn_check (conn);
}

static void
on_conn_timer (struct ev_loop *l, ev_timer *w, int revents)
{
  struct nbd_conn *conn = w->data;

  if (conn->state == CONN_DOWN)
    conn_connect (conn);
  else if (conn->state == CONN_CONNECTING)
    nbd_conn_drop (conn, "handshake timed out");
  nbd_pump (conn->nb);
}

/* Before the loop polls: send what its turn queued on direct
 * connections, one send per connection for all of it.  Until nothing is
 * left, since a connection lost here sends its commands to the others
 * (and a prepare watcher started now would run only after the poll).
 */
static void
on_flush (struct ev_loop *l, ev_prepare *w, int revents)
{
  struct nbd_backend *nb = w->data;
  bool again;

  do {
    again = false;
    for (unsigned i = 0; i < nb->nr_conns; i++) {
      struct nbd_conn *conn = &nb->conns[i];
      if (conn->wire && nbd_wire_has_unsent (conn->wire) &&
          !nbd_wire_want_write (conn->wire)) {
        wire_io (conn, 0);
        again = true;
      }
    }
    if (again)
      nbd_pump (nb);
  } while (again);
  ev_prepare_stop (l, w);
}

/* The backend is adopted by the current loop (attach, nbd.c): watchers,
 * the probe handle as connection 0, the other connections opened now.
 */
void
nbd_conns_attach (struct nbd_backend *nb)
{
  struct ev_loop *l = ioloop_ev ();
  int own;

  ev_prepare_init (&nb->flush, on_flush);
  nb->flush.data = nb;
  for (unsigned i = 0; i < nb->nr_conns; i++) {
    struct nbd_conn *conn = &nb->conns[i];

    ev_io_init (&conn->io, on_io, -1, 0);
    conn->io.data = conn;
    ev_timer_init (&conn->timer, on_conn_timer, 0, 0);
    conn->timer.data = conn;
    /* A lookup from an earlier loop is its resolver's to free. */
    conn->lookup = NULL;
    /* A worker's (or its broken_job's): they hand it over.  Parked, or
     * given up while the last loop stopped: ours again.
     */
    own = atomic_load (&conn->owner);
    if (own == OWN_WORKER ||
        (own == OWN_BROKEN && atomic_load (&conn->broken_queued)))
      continue;
    if (own == OWN_PARKED &&
        !atomic_compare_exchange_strong (&conn->owner, &own, OWN_LOOP))
      continue;                 /* a worker took it just now */
    if (own == OWN_BROKEN) {
      /* Its job failed as the last loop stopped: drop it now (a loss). */
      atomic_store (&conn->owner, OWN_LOOP);
      nbd_conn_drop (conn, conn->broken_why);
      continue;
    }
    if (i == 0 && nb->probe) {
      conn->h = nb->probe;
      nb->probe = NULL;
      conn->state = CONN_CONNECTING;  /* nbd_conn_check makes it up */
      nbd_conn_check (conn);
    }
    else if (own != OWN_BROKEN && conn->h && conn->state == CONN_UP &&
             nbd_aio_is_ready (conn->h))
      nbd_conn_settle (conn);           /* kept over a loop restart */
    else {
      nbd_close_handle (conn, false);
      conn->backoff = 0;        /* connect now */
      nbd_conn_retry_later (conn);
    }
  }
  if (!nbd_any_up (nb) && nb->down_since == 0)
    nb->down_since = ev_now (l);
}

/* --- the ownership protocol (nbd-wire.c's header comment) ------------ */

bool
nbd_conn_claim (struct nbd_conn *conn)
{
  int own = OWN_PARKED;

  if (atomic_load (&conn->owner) == OWN_LOOP)
    return true;
  if (!atomic_compare_exchange_strong (&conn->owner, &own, OWN_LOOP))
    return false;
  nbd_conn_update_io (conn);    /* watched again */
  return true;
}

void
nbd_conn_settle (struct nbd_conn *conn)
{
  if (conn->wire && atomic_load_explicit (&conn->nb->park,
                                          memory_order_relaxed) &&
      atomic_load_explicit (&conn->nb->deep, memory_order_relaxed) == 0 &&
      conn->state == CONN_UP && !conn->lost &&
      conn->inflight.len == 0 && nbd_wire_idle (conn->wire) &&
      atomic_load (&conn->owner) == OWN_LOOP) {
    /* Unwatched from now on: a worker's exchange on it must not wake
     * the loop (libev drops the fd from epoll at its next event).
     */
    ev_io_stop (ioloop_ev (), &conn->io);
    conn->inline_fd = nbd_wire_fd (conn->wire);
    atomic_store (&conn->owner, OWN_PARKED);
  }
  else
    nbd_conn_update_io (conn);
}

void
nbd_conn_check_parked (struct nbd_conn *conn)
{
  int own = OWN_PARKED;
  char byte;
  ssize_t r;

  /* Taken as a worker would (no watcher restarted for a look). */
  if (!atomic_compare_exchange_strong (&conn->owner, &own, OWN_LOOP))
    return;
  r = recv (conn->inline_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r == -1 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    atomic_store (&conn->owner, OWN_PARKED);    /* nothing: still idle */
  else {
    /* EOF, an error or data: read it now, as the watcher would at the
     * loop's next turn, so that a status asked for now (status_run)
     * does not count a connection its server has closed as up.  wire_io
     * drops it or settles it (watched again, or parked).
     */
    wire_io (conn, EV_READ);
  }
}

void
nbd_conn_drop_soon (struct nbd_conn *conn, const char *why)
{
  /* Stored before trying to claim it, as a worker hands it back before
   * looking at drop_wanted: one of the two sees the other.
   */
  conn->drop_why = why;
  atomic_store (&conn->drop_wanted, true);
  if (nbd_conn_claim (conn)) {
    atomic_store (&conn->drop_wanted, false);
    nbd_conn_drop (conn, why);
  }
}

struct nbd_conn *
nbd_conn_take (struct nbd_backend *nb)
{
  /* The order pick_conn fills them in, connection 0 last. */
  for (unsigned k = 1; k <= nb->nr_conns; k++) {
    struct nbd_conn *conn = &nb->conns[k < nb->nr_conns ? k : 0];
    int own = OWN_PARKED;

    if (atomic_load_explicit (&conn->owner, memory_order_relaxed) !=
        OWN_PARKED ||
        !atomic_compare_exchange_strong (&conn->owner, &own, OWN_WORKER))
      continue;
    if (atomic_load (&conn->drop_wanted)) {
      nbd_conn_give_up (conn, NULL, 0, false, conn->drop_why);
      continue;
    }
    return conn;
  }
  return NULL;
}

void
nbd_conn_release (struct nbd_conn *conn)
{
  struct nbd_backend *nb = conn->nb;
  int own = OWN_PARKED;

  atomic_store (&conn->owner, OWN_PARKED);
  /* After the store (see nbd_conn_drop_soon and pick_conn). */
  if (atomic_load (&conn->drop_wanted) &&
      atomic_compare_exchange_strong (&conn->owner, &own, OWN_WORKER))
    nbd_conn_give_up (conn, NULL, 0, false, conn->drop_why);
  if (atomic_load (&nb->want) && !atomic_exchange (&nb->pump_queued, true))
    ioloop_queue_job (&nb->pump_job);
}

void
nbd_conn_give_up (struct nbd_conn *conn, struct clone *c,
                  ev_tstamp deadline, bool timed_out, const char *why)
{
  conn->broken_clone = c;
  conn->broken_deadline = deadline;
  conn->broken_timeout = timed_out;
  snprintf (conn->broken_why, sizeof conn->broken_why, "%s", why);
  atomic_store (&conn->broken_queued, true);
  atomic_store (&conn->owner, OWN_BROKEN);
  ioloop_queue_job (&conn->broken_job);
}

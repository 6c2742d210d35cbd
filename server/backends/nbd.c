/* SPDX-License-Identifier: BSD-3-Clause */
/* Remote backends: an NBD server (nbd://, nbds://, nbd+unix://,
 * nbds+unix:// URIs) reached with libnbd's asynchronous API.
 *
 * The backend is opened with one synchronous connection (the probe) that
 * learns the export's size and capabilities for table validation.  From
 * the first request on, the I/O loop thread (ioloop.c) owns every handle:
 * it adopts the probe as connection 0 and opens the others (up to
 * remote-connections when the server allows multi-conn).  Only the loop
 * thread calls libnbd on an adopted handle; completion callbacks only
 * record results and complete clones, never call libnbd.
 *
 * Faults: a dropped connection is reopened with back-off; its commands go
 * back to the backend's wait list and are issued again on whichever
 * connection comes up first, until their deadline (remote-timeout after
 * they were submitted), then fail with EIO.  A command that gets no reply
 * by its deadline means a stalled server: that connection is dropped
 * (libnbd must let go of the client's buffer), the command fails with
 * EIO, the others are retried.  Every lost connection may have lost
 * acknowledged writes: backend_writes_lost() makes the next flush fail.
 *
 * This file: the backend's ops, its opening and the commands it issues.
 * Connections are in nbd-conn.c, host name lookups off the loop in
 * nbd-resolve.c, URIs in nbd-uri.c (see nbd-internal.h).
 */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <semaphore.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "nbd-internal.h"

/* engine_set_remote, engine_set_remote_poll; read when a backend is
 * opened.
 */
static unsigned opt_connections = 4;
static unsigned opt_timeout = 30;
static unsigned opt_poll_max_us = REMOTE_POLL_MAX_US_DEFAULT;

void
engine_set_remote (unsigned connections, unsigned timeout)
{
  if (connections)
    opt_connections = connections;
  if (timeout)
    opt_timeout = timeout;
}

void
engine_set_remote_poll (unsigned max_us)
{
  opt_poll_max_us = max_us;
}

/* --- errors ---------------------------------------------------------- */

/* libnbd / server errno -> one nbdkit passes on (it maps the rest to
 * EINVAL, which would mislead).
 */
static int
map_errno (int e)
{
  switch (e) {
  case EPERM: case EIO: case ENOMEM: case EINVAL: case ENOSPC:
  case EOVERFLOW: case ENOTSUP: case ESHUTDOWN:
    return -e;
  case EROFS:
    return -EPERM;
  default:
    return -EIO;
  }
}

/* Errors that say the connection (not the request) failed. */
static bool
connection_error (int e)
{
  return e == ENOTCONN || e == ESHUTDOWN || e == ECONNRESET || e == EPIPE;
}

/* --- completing commands --------------------------------------------- */

static void cmd_free (struct nbd_cmd *cmd);

/* The command is finished for good: tell its owner. */
void
nbd_cmd_complete (struct nbd_cmd *cmd, int error)
{
  struct nbd_backend *nb = cmd->nb;

  nb->outstanding--;
  if (cmd->c) {
    struct clone *c = cmd->c;
    cmd_free (cmd);
    clone_done (c, error);
  }
  else {
    struct nbd_extents *x = cmd->x;
    cmd_free (cmd);
    x->error = error;
    sem_post (&x->done);
  }
}

static struct nbd_cmd *
cmd_alloc (struct nbd_backend *nb)
{
  struct nbd_cmd *cmd = nb->free_cmds;

  if (cmd)
    nb->free_cmds = cmd->next;
  else if ((cmd = malloc (sizeof *cmd)) == NULL)
    return NULL;
  memset (cmd, 0, sizeof *cmd);
  cmd->nb = nb;
  return cmd;
}

static void
cmd_free (struct nbd_cmd *cmd)
{
  cmd->next = cmd->nb->free_cmds;
  cmd->nb->free_cmds = cmd;
}

/* *p = max (*p, v), any thread. */
static void
atomic_max (_Atomic uint64_t *p, uint64_t v)
{
  uint64_t was = atomic_load (p);

  while (was < v && !atomic_compare_exchange_weak (p, &was, v))
    ;
}

/* The reply to c came (error: its result), on a connection or inline:
 * account for what the backend now holds unflushed (see ack_clock).  A
 * failed write may have written part: it counts too.  ack_mark: a
 * flush's ack_clock when it was sent.
 */
static void
count_reply (struct nbd_backend *nb, const struct clone *c, int error,
             uint64_t ack_mark)
{
  switch (c->op) {
  case IO_WRITE: case IO_ZERO: case IO_TRIM:
    if (error || !(c->flags & MAPPER_FUA))
      atomic_fetch_add (&nb->ack_clock, 1);
    break;
  case IO_FLUSH:
    if (error == 0)
      atomic_max (&nb->flushed_ack, ack_mark);
    break;
  default:
    break;
  }
}

static void
note_reply (struct nbd_cmd *cmd)
{
  if (cmd->c)
    count_reply (cmd->nb, cmd->c, cmd->error, cmd->ack_mark);
}

/* Each part's reply, from libnbd's completion callback (part_done, which
 * runs under the handle lock: no libnbd calls here) or from a direct
 * connection's (nbd-wire.c).  A part lost with its connection leaves the
 * command on the connection's list for nbd_conn_drop to retry.
 */
void
nbd_part_done (struct nbd_cmd *cmd, int error)
{
  if (error && connection_error (error))
    cmd->lost = true;
  else if (error && cmd->error == 0)
    cmd->error = map_errno (error);
  if (--cmd->parts == 0) {
    if (!cmd->lost) {
      list_remove (&cmd->conn->inflight, cmd);
      note_reply (cmd);
      nbd_cmd_complete (cmd, cmd->error);
    }
    else                        /* e.g. ESHUTDOWN: the server is going */
      cmd->conn->lost = true;
  }
}

static int
part_done (void *opaque, int *error)
{
  nbd_part_done (opaque, *error);
  return 1;
}

static int
extent_cb (void *opaque, const char *metacontext, uint64_t offset,
           uint32_t *entries, size_t nr_entries, int *error)
{
  struct nbd_extents *x = opaque;

  if (strcmp (metacontext, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0)
    return 0;
  if (x->nr + nr_entries > x->cap) {
    size_t cap = x->cap ? x->cap : 64;
    uint32_t *p;
    while (cap < x->nr + nr_entries)
      cap *= 2;
    p = realloc (x->entries, cap * sizeof *p);
    if (p == NULL) {
      *error = ENOMEM;
      return -1;
    }
    x->entries = p;
    x->cap = cap;
  }
  memcpy (&x->entries[x->nr], entries, nr_entries * sizeof *entries);
  x->nr += nr_entries;
  return 0;
}

/* --- issuing --------------------------------------------------------- */

static const char *zeros;       /* ZERO_BUF bytes of read-only zeros */
static pthread_once_t zeros_once = PTHREAD_ONCE_INIT;

static void
zeros_init (void)
{
  /* Untouched anonymous pages all map the kernel's zero page. */
  void *p = mmap (NULL, ZERO_BUF, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS,
                  -1, 0);
  zeros = p == MAP_FAILED ? NULL : p;
}

/* The NBD request for the part of c at delta: its op (a zero the server
 * can't do is a write of zeros), flags and buffer.
 */
static void
part_request (const struct nbd_backend *nb, const struct clone *c,
              uint64_t delta, enum io_op *opp, uint32_t *flagsp, char **bufp)
{
  enum io_op op = c->op;
  char *buf = c->buf ? c->buf + delta : NULL;
  uint32_t flags = (c->flags & MAPPER_FUA) ? LIBNBD_CMD_FLAG_FUA : 0;

  if (op == IO_ZERO && !nb->ex.zero) {  /* emulated: write zeros */
    op = IO_WRITE;
    buf = (char *) zeros;
  }
  else if (op == IO_ZERO)
    flags |= ((c->flags & MAPPER_MAY_TRIM) ? 0 : LIBNBD_CMD_FLAG_NO_HOLE) |
      ((c->flags & MAPPER_FAST_ZERO) ? LIBNBD_CMD_FLAG_FAST_ZERO : 0);
  else if (op == IO_READ || op == IO_FLUSH)
    flags = 0;
  *opp = op;
  *flagsp = flags;
  *bufp = buf;
}

/* Issue one command for [off, off+len) of cmd; cookie or -1 (a direct
 * connection's: 0 or -1, the errno in *direct_error).
 */
static int64_t
issue_part (struct nbd_conn *conn, struct nbd_cmd *cmd, uint64_t delta,
            uint64_t len, int *direct_error)
{
  nbd_completion_callback cb = { .callback = part_done, .user_data = cmd };
  struct nbd_handle *h = conn->h;
  struct clone *c = cmd->c;
  enum io_op op;
  uint32_t flags;
  char *buf;
  uint64_t offset = c->offset + delta;

  part_request (cmd->nb, c, delta, &op, &flags, &buf);
  if (conn->wire) {
    int r = nbd_wire_issue (conn->wire, cmd, op, flags, buf, offset, len);
    *direct_error = -r;
    return r ? -1 : 0;
  }

  switch (op) {
  case IO_READ:
    return nbd_aio_pread (h, buf, len, offset, cb, flags);
  case IO_WRITE:
    return nbd_aio_pwrite (h, buf, len, offset, cb, flags);
  case IO_ZERO:
    return nbd_aio_zero (h, len, offset, cb, flags);
  case IO_TRIM:
    return nbd_aio_trim (h, len, offset, cb, flags);
  case IO_FLUSH:
    return nbd_aio_flush (h, cb, flags);
  }
  abort ();
}

static uint64_t
part_max (struct nbd_backend *nb, const struct clone *c)
{
  switch (c->op) {
  case IO_READ: case IO_WRITE:
    return nb->max_payload;
  case IO_ZERO:
    return nb->ex.zero ? MAX_NOPAYLOAD : MIN (nb->max_payload, ZERO_BUF);
  default:
    return MAX_NOPAYLOAD;
  }
}

/* Issue cmd on conn (which is up), split in parts no bigger than the
 * server takes.  The command may complete at once.
 */
static void
cmd_issue (struct nbd_conn *conn, struct nbd_cmd *cmd)
{
  struct nbd_handle *h = conn->h;
  uint64_t delta, len, max;
  int64_t cookie = 0;
  int direct_error = 0;

  cmd->conn = conn;
  cmd->parts = 1;               /* held while issuing */
  cmd->error = 0;
  cmd->lost = false;
  /* A flush covers the writes whose replies came before it is sent. */
  cmd->ack_mark = cmd->nb->ack_clock;
  list_append (&conn->inflight, cmd);

  if (cmd->x && conn->wire) {
    /* Never: block status is connection 0's, which is direct only
     * without structured replies, so without block status.  All data.
     */
    cmd->x->nr = 0;
  }
  else if (cmd->x) {
    struct nbd_extents *x = cmd->x;
    nbd_extent_callback ecb = { .callback = extent_cb, .user_data = x };
    nbd_completion_callback cb = { .callback = part_done, .user_data = cmd };

    x->nr = 0;
    cmd->parts++;
    cookie = nbd_aio_block_status (h, x->len, x->offset, ecb, cb,
                                   x->req_one ? LIBNBD_CMD_FLAG_REQ_ONE : 0);
    if (cookie == -1)
      cmd->parts--;
  }
  else {
    len = cmd->c->op == IO_FLUSH ? 1 : cmd->c->len;
    max = part_max (cmd->nb, cmd->c);
    for (delta = 0; delta < len; delta += max) {
      cmd->parts++;
      cookie = issue_part (conn, cmd, delta, MIN (max, len - delta),
                           &direct_error);
      if (cookie == -1) {
        cmd->parts--;
        break;
      }
    }
  }
  if (cookie == -1 && conn->wire) {
    if (cmd->error == 0)
      cmd->error = map_errno (direct_error);
  }
  else if (cookie == -1) {
    int e = nbd_get_errno ();
    if (nbd_conn_dead (conn) || connection_error (e))
      cmd->lost = true;
    else if (cmd->error == 0) {
      LOG ("%s: %s", cmd->nb->be.name, nbd_get_error ());
      cmd->error = map_errno (e ? e : EIO);
    }
  }
  if (--cmd->parts == 0 && !cmd->lost) {
    list_remove (&conn->inflight, cmd);
    note_reply (cmd);
    nbd_cmd_complete (cmd, cmd->error);
  }
  if (cmd->lost)
    nbd_conn_drop (conn, "connection lost while sending");
  else
    nbd_conn_settle (conn);
}

/* Where cmd goes, or NULL.  An extents query: connection 0, the one
 * that asks for structured replies (see nbd_connect_handle).  Reads and
 * writes: the first up connection with fewer than SPILL commands issued,
 * else the least busy one, taking connection 0 last.  Filling one
 * connection before the next keeps the batches per socket (and per
 * server wake-up) large; the others take the overflow of deep queues.
 */
static struct nbd_conn *
pick_conn (struct nbd_backend *nb, const struct nbd_cmd *cmd)
{
  struct nbd_conn *best = NULL;
  bool held = false;

  if (cmd->x)
    return nb->conns[0].state == CONN_UP && nbd_conn_claim (&nb->conns[0])
      ? &nb->conns[0] : NULL;
  for (int pass = 0; pass < 2; pass++) {
    for (unsigned k = 1; k <= nb->nr_conns; k++) {
      struct nbd_conn *conn = &nb->conns[k < nb->nr_conns ? k : 0];
      if (conn->state != CONN_UP)
        continue;
      if (!nbd_conn_claim (conn)) {     /* a worker's, inline */
        held = true;
        continue;
      }
      /* Connection 0 through libnbd only when no direct one is about
       * to come back: a worker's request there takes one round trip.
       */
      if (held && conn->wire == NULL)
        continue;
      if (conn->inflight.len < SPILL)
        return conn;
      if (best == NULL || conn->inflight.len < best->inflight.len)
        best = conn;
    }
    if (best || !held)
      break;
    /* Every up connection is a worker's: the first handed back pumps
     * (nbd_conn_release).  Look again after saying so, as one may have
     * come back before the worker could see it.
     */
    atomic_store (&nb->want, true);
    held = false;
  }
  return best;
}

/* Issue waiting commands while a connection is up; when the backend has
 * been down for longer than the timeout, fail them at once.
 */
void
nbd_pump (struct nbd_backend *nb)
{
  struct nbd_cmd *cmd;
  struct nbd_conn *conn;

  while ((cmd = nb->waiting.head) != NULL) {
    conn = pick_conn (nb, cmd);
    if (conn == NULL && cmd->x && nbd_any_up (nb)) {
      /* Connection 0 is down, the others can't do block status: the
       * answer is "all data", which is never wrong.
       */
      list_remove (&nb->waiting, cmd);
      cmd->x->nr = 0;
      nbd_cmd_complete (cmd, 0);
      continue;
    }
    if (conn == NULL) {
      /* No connection up: a fail-fast clone fails now (its multipath
       * sends it elsewhere), the others wait out the timeout.
       */
      if (nb->down_since &&
          ((cmd->c && (cmd->c->flags & CLONE_FAILFAST)) ||
           ev_now (ioloop_ev ()) - nb->down_since >= nb->timeout)) {
        list_remove (&nb->waiting, cmd);
        nb->nr_timeouts++;
        nbd_cmd_complete (cmd, -EIO);
        continue;
      }
      return;
    }
    list_remove (&nb->waiting, cmd);
    cmd_issue (conn, cmd);
  }
}

/* --- deadlines and adoption by the loop ------------------------------ */

/* Request deadlines: fail waiting commands past theirs; a connection
 * with an issued command past its deadline is stalled: drop it.
 */
static void
on_tick (struct ev_loop *l, ev_timer *w, int revents)
{
  struct nbd_backend *nb = w->data;
  ev_tstamp now = ev_now (l);
  struct nbd_cmd *cmd, *next;

  if (nb->outstanding == 0) {
    ev_timer_stop (l, w);
    return;
  }
  for (cmd = nb->waiting.head; cmd; cmd = next) {
    next = cmd->next;
    if (now >= cmd->deadline) {
      list_remove (&nb->waiting, cmd);
      nb->nr_timeouts++;
      LOG ("%s: request timed out waiting for a connection", nb->be.name);
      nbd_cmd_complete (cmd, -EIO);
    }
  }
  for (unsigned i = 0; i < nb->nr_conns; i++) {
    struct nbd_conn *conn = &nb->conns[i];
    for (cmd = conn->inflight.head; cmd; cmd = cmd->next)
      if (now >= cmd->deadline) {
        nbd_conn_drop (conn, "request timed out (server stalled)");
        break;
      }
  }
  nbd_pump (nb);
}

/* Parked connections are not watched (nbd-wire.c): now and then, look
 * whether their server closed them or sent something, so that a server
 * restarted while the backend is idle is reconnected to at once, as
 * when the loop watched them (a reconnection's checks, its log).
 */
static void
on_idle_check (struct ev_loop *l, ev_timer *w, int revents)
{
  struct nbd_backend *nb = w->data;

  for (unsigned i = 0; i < nb->nr_conns; i++)
    nbd_conn_check_parked (&nb->conns[i]);
}

/* Adopt the backend in the current loop: its request deadlines, and
 * its connections (nbd_conns_attach).
 */
static void
attach (struct nbd_backend *nb)
{
  double period = MIN (1.0, nb->timeout / 4);

  nb->attached_gen = ioloop_generation ();
  ev_timer_init (&nb->tick, on_tick, period, period);
  nb->tick.data = nb;
  ev_timer_init (&nb->idle_check, on_idle_check, period, period);
  nb->idle_check.data = nb;
  ev_timer_start (ioloop_ev (), &nb->idle_check);
  nbd_conns_attach (nb);
}

static void
track (struct nbd_backend *nb, struct nbd_cmd *cmd)
{
  struct ev_loop *l = ioloop_ev ();

  if (nb->attached_gen != ioloop_generation ())
    attach (nb);
  cmd->deadline = ev_now (l) + nb->timeout;
  if (nb->outstanding++ == 0 && !ev_is_active (&nb->tick))
    ev_timer_start (l, &nb->tick);
  list_append (&nb->waiting, cmd);
  nbd_pump (nb);
}

/* ops->start: in the loop thread, for each clone queued by nbd_submit. */
static void
nbd_start (struct backend *be, struct clone *c)
{
  struct nbd_backend *nb = NB (be);
  struct nbd_cmd *cmd = cmd_alloc (nb);

  if (cmd == NULL) {
    clone_done (c, -ENOMEM);
    return;
  }
  cmd->c = c;
  track (nb, cmd);
}

/* --- inline requests (nbd-wire.c's ownership protocol) -------------- */

/* A worker gave conn up (nbd_conn_give_up): drop it as if its clone had
 * been in flight on it, which retries the clone elsewhere or fails it
 * exactly as any command lost with its connection (a flush, a fail-fast
 * clone, one past its deadline: EIO), and counts the loss.
 */
static void
broken_run (struct ioloop_job *job, int error)
{
  struct nbd_conn *conn = (struct nbd_conn *)
    ((char *) job - offsetof (struct nbd_conn, broken_job));
  struct nbd_backend *nb = conn->nb;
  struct clone *c = conn->broken_clone;
  struct nbd_cmd *cmd;
  struct ev_loop *l;

  conn->broken_clone = NULL;
  if (error) {          /* the loop stopped: the next attach drops conn */
    atomic_store (&conn->broken_queued, false);
    if (c)
      clone_done (c, error);
    return;
  }
  l = ioloop_ev ();
  if (nb->attached_gen != ioloop_generation ())
    attach (nb);                /* leaves conn alone: broken_queued */
  atomic_store (&conn->broken_queued, false);
  atomic_store (&conn->owner, OWN_LOOP);
  atomic_store (&conn->drop_wanted, false);
  if (c && (cmd = cmd_alloc (nb)) == NULL)
    clone_done (c, -ENOMEM);
  else if (c) {
    cmd->c = c;
    cmd->conn = conn;
    /* Its deadline is the one it had inline (submitted then: a retry
     * gets no more time than through the loop); timed out, it is past
     * now (the worker's clock is not ev_now's), so it fails as on_tick's
     * do.
     */
    cmd->deadline = conn->broken_timeout ? 0 : conn->broken_deadline;
    if (nb->outstanding++ == 0 && !ev_is_active (&nb->tick))
      ev_timer_start (l, &nb->tick);
    list_append (&conn->inflight, cmd);
  }
  nbd_conn_drop (conn, conn->broken_why);
  nbd_pump (nb);
}

/* A worker handed a connection back while commands waited (want). */
static void
pump_run (struct ioloop_job *job, int error)
{
  struct nbd_backend *nb = (struct nbd_backend *)
    ((char *) job - offsetof (struct nbd_backend, pump_job));

  atomic_store (&nb->pump_queued, false);
  if (error || nb->attached_gen != ioloop_generation ())
    return;
  atomic_store (&nb->want, false);
  nbd_pump (nb);
}

bool
nbd_try_inline (struct nbd_backend *nb, struct clone *c)
{
  uint64_t len = c->op == IO_FLUSH ? 0 : c->len, ack_mark;
  struct nbd_conn *conn;
  enum io_op op;
  uint32_t flags;
  char *buf, why[128];
  uint64_t deadline;
  unsigned deep;
  int r, error;

  if (mapper_inline_disabled || ioloop_in_loop_thread ())
    return false;
  /* Only while this backend has one request at a time.  Several are the
   * loop's to pipeline: on one connection, one send and one recv carry
   * many of them, and the backend is woken once for them all, where
   * each inline request costs a round trip and a wake-up of a backend
   * thread of its own, and holds a connection the loop cannot use; and
   * parking connections between requests costs the loop an epoll_ctl
   * each time.  At iodepth 64 the loop's count of commands falls to 0
   * now and then (nbdkit's workers are all between requests, or a
   * request is on its way to the loop), so one look is not enough: once
   * a clone comes with another in flight (any clone, inline or not), the
   * next INLINE_CALM must come alone before one goes inline again, and
   * the loop parks no connection meanwhile (nbd_conn_settle).  A hint:
   * a worker may go inline while another's clone is on its way to the
   * loop, but no reset of the count is lost (compare-and-swap).
   */
  if (atomic_load_explicit (&nb->outstanding, memory_order_relaxed) ||
      atomic_load_explicit (&nb->inline_busy, memory_order_relaxed))
    goto deep_queue;
  /* One request on the socket, the worker waiting for its reply: only
   * for a clone that is its request's only one (others would wait
   * behind it), in one part, and not a multipath's (its path timeout
   * abandons what the loop holds).
   */
  if ((c->flags & CLONE_FAILFAST) || len > part_max (nb, c) ||
      !clone_alone (c))
    return false;
  if (atomic_exchange (&nb->inline_busy, true))
    goto deep_queue;
  deep = atomic_load_explicit (&nb->deep, memory_order_relaxed);
  if (deep > 0) {
    atomic_compare_exchange_strong_explicit (&nb->deep, &deep, deep - 1,
                                             memory_order_relaxed,
                                             memory_order_relaxed);
    atomic_store (&nb->inline_busy, false);
    return false;
  }
  if ((conn = nbd_conn_take (nb)) == NULL) {
    atomic_store (&nb->inline_busy, false);
    /* From now on the loop parks idle connections (nbd_conn_settle):
     * until a request could go inline, parking would only cost the
     * loop an epoll_ctl per request.
     */
    if (!atomic_load_explicit (&nb->park, memory_order_relaxed))
      atomic_store (&nb->park, true);
    return false;
  }
  part_request (nb, c, 0, &op, &flags, &buf);
  /* As the loop's cmd->deadline: remote-timeout from now (one clock
   * read; ev_time's only if the loop takes the clone over).
   */
  deadline = monotonic_ns () + (uint64_t) (nb->timeout * 1e9);
  /* A flush covers the writes whose replies came before it is sent. */
  ack_mark = atomic_load (&nb->ack_clock);
  r = nbd_wire_inline (conn->inline_fd, op, flags, buf, c->offset, len,
                       deadline, &conn->drop_wanted, &nb->poll,
                       why, sizeof why);
  if (r == -ETIMEDOUT || r == -1 || connection_error (r)) {
    /* The log says which path saw it: "... (inline)". */
    char msg[sizeof why + 16];
    uint64_t now = monotonic_ns ();

    snprintf (msg, sizeof msg, "%s (inline)",
              r == -ETIMEDOUT ? "request timed out (server stalled)"
              : r == -1 ? why
              : "connection lost");     /* e.g. ESHUTDOWN: the server goes */
    /* Before the loop has c: once c is done the backend may go. */
    atomic_store (&nb->inline_busy, false);
    nbd_conn_give_up (conn, c,
                      ev_time () + (deadline > now ? deadline - now : 0) / 1e9,
                      r == -ETIMEDOUT, msg);
  }
  else {
    error = r ? map_errno (r) : 0;
    count_reply (nb, c, error, ack_mark);
    atomic_fetch_add_explicit (&nb->nr_inline, 1, memory_order_relaxed);
    /* Before c completes: then the backend may be closed. */
    atomic_store (&nb->inline_busy, false);
    nbd_conn_release (conn);
    clone_done (c, error);
  }
  return true;

 deep_queue:
  if (atomic_load_explicit (&nb->deep, memory_order_relaxed) != INLINE_CALM)
    atomic_store_explicit (&nb->deep, INLINE_CALM, memory_order_relaxed);
  return false;
}

/* --- the backend ops ------------------------------------------------- */

static void
nbd_submit (struct backend *be, struct clone *c)
{
  struct nbd_backend *nb = NB (be);

  /* What needs no server round trip completes here, in the worker. */
  switch (c->op) {
  case IO_TRIM:
    if (!nb->ex.trim) {          /* advisory: nothing to do */
      clone_done (c, 0);
      return;
    }
    break;
  case IO_FLUSH:
    if (!nb->ex.flush) {         /* the server has no cache to flush */
      clone_done (c, 0);
      return;
    }
    break;
  case IO_ZERO:
    if ((c->flags & MAPPER_FAST_ZERO) && !nb->ex.fast_zero) {
      clone_done (c, -ENOTSUP);
      return;
    }
    if (!nb->ex.zero) {
      pthread_once (&zeros_once, zeros_init);
      if (zeros == NULL) {
        clone_done (c, -ENOMEM);
        return;
      }
    }
    break;
  default:
    break;
  }
  if (c->len == 0 && c->op != IO_FLUSH) {
    clone_done (c, 0);
    return;
  }
  if (nbd_try_inline (nb, c))
    return;
  ioloop_submit (be, c);
}

static void
extents_job (struct ioloop_job *job, int error)
{
  struct nbd_extents *x = (struct nbd_extents *) job;
  struct nbd_cmd *cmd;

  if (error || (cmd = cmd_alloc (x->nb)) == NULL) {
    x->error = error ? error : -ENOMEM;
    sem_post (&x->done);
    return;
  }
  cmd->x = x;
  track (x->nb, cmd);
}

static int
nbd_extents (struct backend *be, uint64_t offset, uint64_t len,
             bool req_one, mapper_extent_fn fn, void *opaque)
{
  struct nbd_backend *nb = NB (be);
  struct nbd_extents x = {
    .job.fn = extents_job, .nb = nb, .offset = offset,
    .len = MIN (len, (uint64_t) UINT32_MAX & ~(uint64_t) 0xfff),
    .req_one = req_one,
  };
  uint64_t pos = offset, end = offset + x.len;
  int r = 0;

  if (!nb->ex.extents || len == 0) {
    r = fn (opaque, offset, len, 0);        /* all data */
    return r < 0 ? r : 0;
  }
  sem_init (&x.done, 0, 0);
  ioloop_queue_job (&x.job);
  while (sem_wait (&x.done) == -1 && errno == EINTR)
    ;
  sem_destroy (&x.done);
  if (x.error == 0) {
    for (size_t i = 0; i + 1 < x.nr && pos < end; i += 2) {
      uint64_t n = MIN ((uint64_t) x.entries[i], end - pos);
      if (n == 0)
        break;
      r = fn (opaque, pos, n, x.entries[i + 1] &
              (MAPPER_EXTENT_HOLE | MAPPER_EXTENT_ZERO));
      if (r)
        break;
      pos += n;
    }
    if (r == 0 && pos == offset)        /* nothing useful: call it data */
      r = fn (opaque, offset, x.len, 0);
    if (r > 0)
      r = 0;
  }
  else
    r = x.error;
  free (x.entries);
  return r;
}

static int
nbd_get_size_op (struct backend *be, uint64_t *size)
{
  *size = NB (be)->be.caps.size;
  return 0;
}

/* This thread is the loop nb's connections belong to.  Not so in
 * another loop's generation, nor in the caller's thread, where
 * ioloop_call runs its function when no loop runs: their watchers
 * were a stopped loop's.
 */
static bool
in_own_loop (struct nbd_backend *nb)
{
  return nb->attached_gen == ioloop_generation () && ioloop_in_loop_thread ();
}

struct status_call {
  struct nbd_backend *nb;
  char *buf;
  size_t len, used;
};

static void
status_run (void *arg)
{
  struct status_call *s = arg;
  struct nbd_backend *nb = s->nb;
  unsigned up = 0, usable = 0;
  bool attached = in_own_loop (nb);
  int n;

  for (unsigned i = 0; i < nb->nr_conns; i++) {
    /* A parked connection is not watched (nbd-wire.c): look now whether
     * its server is still there, not at the next idle check.
     */
    if (attached)
      nbd_conn_check_parked (&nb->conns[i]);
    up += nb->conns[i].state == CONN_UP;
    usable += !nb->conns[i].retired;
  }
  if (nb->attached_gen == 0) /* never used: only the probe */
    up = nb->probe && nbd_aio_is_ready (nb->probe);
  n = snprintf (s->buf, s->len, "%u/%u connections up", up, usable);
  if (up == 0 && nb->down_since && nb->attached_gen == ioloop_generation ())
    n += snprintf (s->buf + MIN ((size_t) n, s->len),
                   s->len - MIN ((size_t) n, s->len),
                   " (down for %.1fs, reconnecting)",
                   ev_time () - nb->down_since);
  n += snprintf (s->buf + MIN ((size_t) n, s->len),
                 s->len - MIN ((size_t) n, s->len),
                 ", %u requests outstanding, %" PRIu64 " connections lost, %"
                 PRIu64 " retries, %" PRIu64 " timeouts, %" PRIu64 " inline"
                 " (%" PRIu64 " polled, %" PRIu64 " caught, window %u us)",
                 (unsigned) nb->outstanding, nb->nr_losses, nb->nr_retries,
                 nb->nr_timeouts, (uint64_t) atomic_load (&nb->nr_inline),
                 (uint64_t) atomic_load (&nb->poll.polled),
                 (uint64_t) atomic_load (&nb->poll.caught),
                 (unsigned) atomic_load (&nb->poll.ns) / 1000);
  s->used = n;
}

static size_t
nbd_status (struct backend *be, char *buf, size_t len)
{
  struct status_call s = { .nb = NB (be), .buf = buf, .len = len };

  ioloop_call (status_run, &s);
  return s.used;
}

struct abandon_call {
  struct nbd_backend *nb;
  void *owner;
};

static bool
owned (const struct nbd_cmd *cmd, const void *owner)
{
  return cmd->c && cmd->c->end_io_ctx == owner;
}

/* In the loop: close the connections first (libnbd then lets go of the
 * buffers of their commands: the late reply of a read must never land in
 * a client buffer reissued elsewhere and completed), which puts their
 * commands back on the wait list; then fail owner's, the others are
 * issued again as after any lost connection.  Every connection goes, not
 * only those carrying owner's commands: the others reach the same server
 * over the same network, and one that lived through a cut link may sit
 * on a backed-off retransmission for seconds once the link is back,
 * stalling the path again as soon as it is reinstated.
 */
static void
abandon_run (void *arg)
{
  struct abandon_call *a = arg;
  struct nbd_backend *nb = a->nb;
  struct nbd_cmd *cmd, *next;

  /* Never used by this loop (or no loop runs): nothing is issued. */
  if (!in_own_loop (nb))
    return;
  for (unsigned i = 0; i < nb->nr_conns; i++)
    if (nb->conns[i].state == CONN_UP)
      nbd_conn_drop_soon (&nb->conns[i], "abandoned by its target "
                          "(a multipath path timeout, a clone's stop)");
  for (cmd = nb->waiting.head; cmd; cmd = next) {
    next = cmd->next;
    if (owned (cmd, a->owner)) {
      list_remove (&nb->waiting, cmd);
      nb->nr_timeouts++;
      nbd_cmd_complete (cmd, -EIO);
    }
  }
  nbd_pump (nb);
}

static void
nbd_abandon (struct backend *be, void *owner)
{
  struct abandon_call a = { .nb = NB (be), .owner = owner };

  ioloop_call (abandon_run, &a);
}

static void
detach_run (void *arg)
{
  struct nbd_backend *nb = arg;
  bool attached = in_own_loop (nb);

  assert (nb->outstanding == 0);
  for (unsigned i = 0; i < nb->nr_conns; i++) {
    struct nbd_conn *conn = &nb->conns[i];
    int own = atomic_exchange (&conn->owner, OWN_LOOP);
    /* Idle: no worker holds one, no broken_job is queued (it was queued
     * before its clone completed, so it ran before this).  One given up
     * while the last loop stopped (its job failed) is closed here.
     */
    assert (own != OWN_WORKER && !atomic_load (&conn->broken_queued));
    (void) own;
    if (attached) {
      ev_io_stop (ioloop_ev (), &conn->io);
      ev_timer_stop (ioloop_ev (), &conn->timer);
      nbd_lookup_forget (conn);         /* conn is about to be freed */
    }
    nbd_close_handle (conn, true);
  }
  if (attached) {
    ev_timer_stop (ioloop_ev (), &nb->tick);
    ev_timer_stop (ioloop_ev (), &nb->idle_check);
    ev_prepare_stop (ioloop_ev (), &nb->flush);
  }
  if (nb->probe) {
    nbd_aio_disconnect (nb->probe, 0);
    nbd_close (nb->probe);
    nb->probe = NULL;
  }
}

static void
nbd_close_op (struct backend *be)
{
  struct nbd_backend *nb = NB (be);
  struct nbd_cmd *cmd;

  ioloop_call (detach_run, nb);
  while ((cmd = nb->free_cmds) != NULL) {
    nb->free_cmds = cmd->next;
    free (cmd);
  }
  LOG ("%s: closed", nb->be.name);
  free (nb->conns);
  free (nb->be.name);
  free (nb);
}

static const struct backend_ops nbd_ops = {
  .kind = "nbd",
  .submit = nbd_submit,
  .start = nbd_start,
  .extents = nbd_extents,
  .get_size = nbd_get_size_op,
  .status = nbd_status,
  .abandon = nbd_abandon,
  .close = nbd_close_op,
};

/* --- opening --------------------------------------------------------- */

/* The probe: a blocking connect bounded by the timeout. */
static struct nbd_handle *
probe_connect (const char *uri, double timeout, struct mapper_err *err)
{
  char why[sizeof err->msg];
  struct nbd_handle *h = nbd_connect_handle (uri, 0, why, sizeof why);
  ev_tstamp deadline = ev_time () + timeout;

  if (h == NULL) {
    mapper_err_set (err, "%s: %s", uri, why);
    return NULL;
  }
  while (!nbd_aio_is_ready (h)) {
    ev_tstamp left = deadline - ev_time ();
    int r;
    if (nbd_aio_is_dead (h) || nbd_aio_is_closed (h))
      goto err;
    if (left <= 0) {
      mapper_err_set (err, "%s: connect: timed out after %gs", uri, timeout);
      nbd_close (h);
      return NULL;
    }
    r = nbd_poll (h, (int) (left * 1000) + 1);
    if (r == -1)
      goto err;
  }
  return h;

 err:
  mapper_err_set (err, "%s: %s", uri, nbd_get_error ());
  nbd_close (h);
  return NULL;
}

/* open of the kind: the URI as normalised (the key) is what we use. */
static int
nbd_backend_open (const char *spec, const char *uri, struct backend **out,
                  struct mapper_err *err)
{
  struct nbd_backend *nb;
  struct nbd_handle *h;
  struct nbd_export ex;

  h = probe_connect (uri, opt_timeout, err);
  if (h == NULL)
    return -EIO;
  nbd_read_export (h, &ex);
  if (ex.size < 0) {
    mapper_err_set (err, "%s: cannot get size: %s", uri, nbd_get_error ());
    nbd_close (h);
    return -EIO;
  }

  nb = calloc (1, sizeof *nb);
  if (nb == NULL || (nb->be.name = strdup (uri)) == NULL) {
    free (nb);
    nbd_close (h);
    mapper_err_set (err, "%s: out of memory", uri);
    return -ENOMEM;
  }
  nb->ex = ex;
  nb->probe = h;
  nb->timeout = opt_timeout;
  nb->poll.max_ns = opt_poll_max_us * 1000;
  nb->lookup = nbd_uri_host_is_name (uri);
  nb->nr_conns = ex.multi_conn ? opt_connections : 1;
  nb->max_payload = MIN ((uint64_t) MAX_PAYLOAD, ex.block_max);
  if (nb->max_payload < ex.block_min)
    nb->max_payload = ex.block_min;
  nb->conns = calloc (nb->nr_conns, sizeof *nb->conns);
  if (nb->conns == NULL) {
    free (nb->be.name);
    free (nb);
    nbd_close (h);
    mapper_err_set (err, "%s: out of memory", uri);
    return -ENOMEM;
  }
  nb->pump_job.fn = pump_run;
  for (unsigned i = 0; i < nb->nr_conns; i++) {
    nb->conns[i].nb = nb;
    nb->conns[i].index = i;
    nb->conns[i].broken_job.fn = broken_run;
    nb->conns[i].state = CONN_DOWN;
    nb->conns[i].backoff = BACKOFF_MIN;
  }

  nb->be.ops = &nbd_ops;
  nb->be.caps = (struct mapper_caps) {
    .size = ex.size,
    .can_write = !ex.read_only,
    .can_flush = true,               /* no-op when the server has none */
    .can_fua = ex.fua,               /* else the engine flushes */
    .can_trim = true,                /* no-op when the server has none */
    .can_zero = true,                /* written when the server can't */
    .can_fast_zero = ex.zero && ex.fast_zero,
    .can_extents = true,             /* all data when the server can't */
    /* Every client connection shares this backend's connections, and a
     * flush on one of them covers all (one connection, or multi-conn).
     */
    .can_multi_conn = true,
    .block_min = ex.block_min,
    .block_pref = ex.block_pref,
    .block_max = 0xffffffff,         /* split here as the server needs */
  };
  LOG ("%s: size %" PRIi64 "%s, %u connection%s; flush=%d fua=%d trim=%d "
       "zero=%d fast_zero=%d extents=%d multi_conn=%d block=%u/%u/%u",
       uri, ex.size, ex.read_only ? " read-only" : "", nb->nr_conns,
       nb->nr_conns == 1 ? "" : "s", ex.flush, ex.fua, ex.trim, ex.zero,
       ex.fast_zero, ex.extents, ex.multi_conn, ex.block_min, ex.block_pref,
       ex.block_max);
  *out = &nb->be;
  return 0;
}

const struct backend_kind nbd_backend_kind = {
  .claims = nbd_backend_is_uri,
  .key = nbd_backend_normalize,
  .open = nbd_backend_open,
  .stop = nbd_resolver_stop,
};

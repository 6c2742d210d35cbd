/* SPDX-License-Identifier: BSD-3-Clause */
/* The NBD backend's transmission phase spoken directly on a connection's
 * socket, once libnbd has done the handshake ("direct" connections).
 *
 * Why: libnbd 1.14 sends a write's header and payload in two send calls,
 * reads every reply header with its own recv and wants one poll per
 * reply.  Here requests queued in one turn of the I/O loop go out in one
 * sendmsg (headers and write payloads as one iovec, straight from the
 * client's buffers), and replies are read with as few recv calls as the
 * protocol allows without copying: while no read is in flight every
 * reply is a 16-byte header, so all of them are read at once; a read's
 * data is read straight into the client's buffer together with the next
 * reply's header (one recvmsg per read reply).  Nothing is ever read
 * past the header of a read reply, so no read data is copied.
 *
 * Only plaintext connections without structured replies are direct
 * (nbd_wire_eligible): TLS stays libnbd's, and so does connection 0,
 * which asks for structured replies (block status).  libnbd keeps the
 * handle: it is in its ready state and never touched on the socket
 * again (no command goes through it) until it is closed; a graceful
 * close lets it send NBD_CMD_DISC, which it can since nothing of ours is
 * half sent then (the backend is idle).
 *
 * Faults are the connection's (nbd-conn.c): a failed send or recv, the
 * server closing, or a reply that breaks the protocol (bad magic, an
 * unknown cookie) make nbd_wire_io return why, and the caller drops the
 * connection; its commands are retried elsewhere exactly as with libnbd.
 * Deadlines are the backend's (on_tick in nbd.c).
 *
 * Inline requests.  At queue depth 1 the hand-over to the loop and back
 * costs more than the request: a worker wakes the loop (ev_async), the
 * loop sends, polls, reads and wakes the worker (futex).  So a request
 * that is alone in its client request (clone_alone, one part, not a
 * multipath's) may be sent by its worker itself on an idle direct
 * connection, which then waits for its reply in poll() and reads it
 * (nbd_wire_inline, nbd_try_inline in nbd.c): send, poll, receive, and
 * no other thread woken.  Only while the backend has no other request
 * in flight, and had none with the last INLINE_CALM (nb->deep): deeper
 * queues are the loop's, which pipelines them.  Who may touch a direct connection's socket,
 * libnbd handle and wire is conn->owner (enum conn_owner, atomics):
 *
 *   OWN_LOOP    the loop's, as described above; its EV_READ watcher on.
 *   OWN_PARKED  nobody's.  The loop parks a connection when it is up,
 *               not lost, has no command in flight and its wire is idle
 *               (nbd_conn_settle), after stopping its watcher, so that
 *               the worker's traffic never wakes the loop.  inline_fd is
 *               set before the store that parks it.  Only once a request
 *               could have gone inline (nb->park): before, parking would
 *               cost the loop an epoll_ctl per request for nothing; and
 *               not while the backend's queue is deep (nb->deep), when
 *               no request goes inline.
 *   OWN_WORKER  one worker's, taken by compare-and-swap from PARKED
 *               (nbd_conn_take).  It sends one request with a cookie of
 *               its own, and reads exactly its reply; on success it
 *               stores PARKED (nbd_conn_release) before it completes the
 *               clone, so nothing of the backend is touched after the
 *               clone is done (a close may follow at once).
 *   OWN_BROKEN  the worker gave it up (nbd_conn_give_up): a fault, an
 *               error reply that means the server is going (ESHUTDOWN),
 *               or no reply by remote-timeout.  Its clone goes with it
 *               to the loop in conn->broken_job, which takes the
 *               connection back and drops it as if the clone had been
 *               in flight on it (nbd.c's broken_run): the clone is
 *               retried elsewhere, by the deadline it had inline
 *               (remote-timeout after the worker sent it, not after the
 *               loop took it over), or fails as any lost command
 *               (flushes, fail-fast clones, timeouts: EIO), and the loss
 *               counts for lost-write detection.  Nothing was left half
 *               read: no late reply can land in a buffer reissued
 *               elsewhere.
 *
 * The loop takes a parked connection back by compare-and-swap
 * (nbd_conn_claim, restarting its watcher) whenever it wants it:
 * pick_conn for a command, abandon, keep_only, a new loop generation
 * (nbd_conns_attach), the backend's close.  It never touches a
 * connection it could not claim.  When every up connection is a
 * worker's and commands wait, it sets nb->want and looks once more; a
 * worker hands back with a store and then reads want (both seq_cst, so
 * one of the two sees the other), and queues nb->pump_job.  Likewise
 * the loop wanting a worker's connection closed (abandon, keep_only)
 * sets drop_wanted and then tries to claim it; the worker reads it
 * after taking or handing back, and while it waits for its reply once
 * every REQUEST_WAIT_SLICE_NS (wait_fd: an abandon must not wait out a
 * hung server's remote-timeout), and gives the connection up instead.
 * Flush ordering is as on the loop's path: a flush (inline or not)
 * covers the writes counted in nb->ack_clock when it is sent, and an
 * inline write is counted when its reply comes, before its clone
 * completes; a write still inline is not yet acknowledged, so no flush
 * has to cover it.  ioloop_stop comes only when nothing is in flight,
 * so never while a worker holds a connection; a broken_job the stopping
 * loop failed leaves the connection BROKEN, and the next attach drops
 * it.  An idle parked connection is not watched: a server that closed
 * it is seen by the next request on it, which is then retried, or by
 * the loop's look at parked connections (nbd_conn_check_parked: every
 * min(1 s, remote-timeout / 4), and at once for a status, which must
 * not count a closed connection as up).
 *
 * Adaptive polling (remote-poll-max-us, after qemu's AioContext polling
 * of its poll-max-ns, poll-grow, poll-shrink).  A worker asleep in
 * poll() on an idle vCPU costs a sleep and a wake-up per reply, which at
 * queue depth 1 can cost more than the request.  So before it sleeps,
 * the worker polls for the reply for a while: a poll is one
 * recvmsg(MSG_DONTWAIT) into the reply's buffers, the very call that
 * reads the reply when it has come (no extra call when it has), then a
 * look at drop_wanted (an abandon is seen at once, without waiting for a
 * slice) and at the clock; the window never runs past the request's
 * deadline.  When the window is over without a whole reply, the worker
 * sleeps in wait_fd as before.  The window (struct wire_poll) is the
 * backend's, not a connection's: its connections lead to one server and
 * a worker takes whichever is parked; workers update it with plain
 * atomic stores (it is a hint: the last one wins).  It starts at 0 and
 * adapts after each reply, from how long after the request's send it
 * was complete (took):
 *   - took <= window: caught while polling, no change;
 *   - window < took <= max: missed, but would be worth catching: the
 *     window doubles (from 0, to POLL_START_NS), up to max;
 *   - took > max: too slow for polling to pay: the window halves, and
 *     below POLL_START_NS it is 0, so a slow server soon costs no CPU
 *     (and never reopens it: that takes a reply within max, which
 *     sleeping replies rarely are then).
 * max is remote-poll-max-us (0: never poll, nothing changes; default
 * REMOTE_POLL_MAX_US_DEFAULT, engine.h).  The status counts replies
 * polled for and those caught.  The send side does not poll: an inline
 * request goes out in one non-blocking sendmsg, and only a write larger
 * than the socket's buffer waits (POLLOUT), for longer than any window;
 * the worker's wait for the client's next request is nbdkit's own.
 */
#include <config.h>

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <endian.h>

#include "nbd-internal.h"

/* The NBD protocol (doc/proto.md of the NBD project). */
#define NBD_REQUEST_MAGIC      0x25609513
#define NBD_SIMPLE_REPLY_MAGIC 0x67446698
#define NBD_REQUEST_SIZE       28
#define NBD_REPLY_SIZE         16
#define NBD_CMD_READ           0
#define NBD_CMD_WRITE          1
#define NBD_CMD_FLUSH          3
#define NBD_CMD_TRIM           4
#define NBD_CMD_WRITE_ZEROES   6
/* Its command flags are libnbd's LIBNBD_CMD_FLAG_* (the same values). */

#define WIRE_IOV 64             /* iovec entries per sendmsg */
#define WIRE_RBUF (NBD_REPLY_SIZE * 64) /* reply headers per recv */
#define NO_SLOT UINT32_MAX
/* An inline request's cookie: one request at a time on the socket, so
 * any other cookie in its reply is a fault.  Its low half is never a
 * slot (at most 1 << 24 of them).
 */
#define INLINE_COOKIE UINT64_C (0x696e6c69ffffffff)

/* One NBD request awaiting its reply (or still being sent). */
struct wire_req {
  struct nbd_cmd *cmd;          /* NULL: free */
  char *buf;                    /* read: where the data lands; write: what goes */
  uint32_t len;                 /* payload length of a read or write */
  uint32_t next;                /* send queue or free list */
  uint32_t gen;                 /* in the cookie: a stale one is caught */
  uint16_t type;
  bool sending;                 /* on the send queue */
  unsigned char hdr[NBD_REQUEST_SIZE];
};

struct nbd_wire {
  int fd;
  struct wire_req *slots;       /* indexed by the cookie's low half */
  uint32_t nr_slots, free;
  uint32_t send_head, send_tail;
  size_t sent;                  /* bytes of send_head already sent */
  bool blocked;                 /* the socket is full: wait for EV_WRITE */
  unsigned awaiting;            /* replies awaited (sent or not) */
  unsigned reads;               /* of them, reads sent in full: only
                                 * their replies can carry data */
  /* Receiving: rbuf holds rlen bytes of reply headers; rcur (or
   * NO_SLOT) is the read whose data is coming, rdone bytes of it so far.
   */
  uint32_t rcur, rdone;
  size_t rlen;
  unsigned char rbuf[WIRE_RBUF];
};

bool
nbd_wire_eligible (struct nbd_handle *h)
{
  return nbd_get_tls_negotiated (h) == 0 &&
    nbd_get_structured_replies_negotiated (h) == 0 &&
    nbd_aio_get_fd (h) >= 0;
}

struct nbd_wire *
nbd_wire_new (struct nbd_handle *h)
{
  struct nbd_wire *w = calloc (1, sizeof *w);

  if (w == NULL)
    return NULL;
  w->fd = nbd_aio_get_fd (h);
  w->free = w->send_head = w->send_tail = w->rcur = NO_SLOT;
  return w;
}

void
nbd_wire_free (struct nbd_wire *w)
{
  if (w) {
    free (w->slots);
    free (w);
  }
}

bool
nbd_wire_want_write (const struct nbd_wire *w)
{
  return w->blocked;
}

int
nbd_wire_fd (const struct nbd_wire *w)
{
  return w->fd;
}

bool
nbd_wire_has_unsent (const struct nbd_wire *w)
{
  return w->send_head != NO_SLOT;
}

bool
nbd_wire_idle (const struct nbd_wire *w)
{
  return w->send_head == NO_SLOT && w->awaiting == 0 && w->rlen == 0 &&
    w->rcur == NO_SLOT && !w->blocked;
}

static uint32_t
slot_alloc (struct nbd_wire *w)
{
  uint32_t i;

  if (w->free == NO_SLOT) {
    uint32_t n = w->nr_slots ? w->nr_slots * 2 : 64;
    struct wire_req *s;
    if (n > (1u << 24) || (s = realloc (w->slots, n * sizeof *s)) == NULL)
      return NO_SLOT;
    memset (&s[w->nr_slots], 0, (n - w->nr_slots) * sizeof *s);
    for (i = n; i-- > w->nr_slots; ) {
      s[i].next = w->free;
      w->free = i;
    }
    w->slots = s;
    w->nr_slots = n;
  }
  i = w->free;
  w->free = w->slots[i].next;
  return i;
}

static void
slot_free (struct nbd_wire *w, uint32_t i)
{
  struct wire_req *r = &w->slots[i];

  r->cmd = NULL;
  r->gen++;
  r->next = w->free;
  w->free = i;
}

static void
put_be16 (unsigned char *p, uint16_t v)
{
  v = htobe16 (v);
  memcpy (p, &v, 2);
}

static void
put_be32 (unsigned char *p, uint32_t v)
{
  v = htobe32 (v);
  memcpy (p, &v, 4);
}

static void
put_be64 (unsigned char *p, uint64_t v)
{
  v = htobe64 (v);
  memcpy (p, &v, 8);
}

static uint32_t
get_be32 (const unsigned char *p)
{
  uint32_t v;

  memcpy (&v, p, 4);
  return be32toh (v);
}

static uint64_t
get_be64 (const unsigned char *p)
{
  uint64_t v;

  memcpy (&v, p, 8);
  return be64toh (v);
}

/* A request's header in hdr; its NBD command type. */
static uint16_t
put_request (unsigned char *hdr, enum io_op op, uint16_t flags,
             uint64_t cookie, uint64_t offset, uint64_t len)
{
  uint16_t type;

  switch (op) {
  case IO_READ:
    type = NBD_CMD_READ;
    break;
  case IO_WRITE:
    type = NBD_CMD_WRITE;
    break;
  case IO_ZERO:
    type = NBD_CMD_WRITE_ZEROES;
    break;
  case IO_TRIM:
    type = NBD_CMD_TRIM;
    break;
  case IO_FLUSH:
  default:
    type = NBD_CMD_FLUSH;
    offset = 0;
    len = 0;
    break;
  }
  put_be32 (hdr, NBD_REQUEST_MAGIC);
  put_be16 (hdr + 4, flags);
  put_be16 (hdr + 6, type);
  put_be64 (hdr + 8, cookie);
  put_be64 (hdr + 16, offset);
  put_be32 (hdr + 24, len);
  return type;
}

int
nbd_wire_issue (struct nbd_wire *w, struct nbd_cmd *cmd, enum io_op op,
                uint16_t flags, char *buf, uint64_t offset, uint64_t len)
{
  uint32_t i = slot_alloc (w);
  struct wire_req *r;
  uint16_t type;

  if (i == NO_SLOT)
    return -ENOMEM;
  r = &w->slots[i];
  r->cmd = cmd;
  r->buf = buf;
  r->len = op == IO_READ || op == IO_WRITE ? len : 0;
  r->type = type = put_request (r->hdr, op, flags,
                                (uint64_t) r->gen << 32 | i, offset, len);
  r->sending = true;
  r->next = NO_SLOT;
  if (w->send_tail == NO_SLOT)
    w->send_head = i;
  else
    w->slots[w->send_tail].next = i;
  w->send_tail = i;
  w->awaiting++;
  return 0;
}

/* Send what is queued, as much as the socket takes.  NULL, or why the
 * connection failed.
 */
static const char *
wire_send (struct nbd_wire *w, char *why, size_t whylen)
{
  while (w->send_head != NO_SLOT) {
    struct iovec iov[WIRE_IOV];
    struct msghdr msg = { .msg_iov = iov };
    size_t skip = w->sent, want = 0;
    uint32_t i;
    int n = 0;
    ssize_t r, sent;

    /* Headers and write payloads, skipping what was sent already. */
    for (i = w->send_head; i != NO_SLOT && n + 2 <= WIRE_IOV;
         i = w->slots[i].next) {
      struct wire_req *q = &w->slots[i];
      size_t plen = q->type == NBD_CMD_WRITE ? q->len : 0;

      if (skip < NBD_REQUEST_SIZE) {
        iov[n].iov_base = q->hdr + skip;
        iov[n].iov_len = NBD_REQUEST_SIZE - skip;
        want += iov[n++].iov_len;
        skip = 0;
      }
      else
        skip -= NBD_REQUEST_SIZE;
      if (plen) {
        iov[n].iov_base = q->buf + skip;
        iov[n].iov_len = plen - skip;
        want += iov[n++].iov_len;
      }
      skip = 0;
    }
    msg.msg_iovlen = n;
    r = sendmsg (w->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        w->blocked = true;
        return NULL;
      }
      snprintf (why, whylen, "send: %s", strerror (errno));
      return why;
    }
    /* Unlink what is sent in full. */
    sent = r;
    r += w->sent;
    while (w->send_head != NO_SLOT) {
      struct wire_req *q = &w->slots[w->send_head];
      size_t total = NBD_REQUEST_SIZE +
        (q->type == NBD_CMD_WRITE ? q->len : 0);
      if ((size_t) r < total)
        break;
      r -= total;
      q->sending = false;
      w->reads += q->type == NBD_CMD_READ;
      w->send_head = q->next;
    }
    if (w->send_head == NO_SLOT)
      w->send_tail = NO_SLOT;
    w->sent = r;
    if ((size_t) sent < want && w->send_head != NO_SLOT) {
      /* A short send: the socket is full. */
      w->blocked = true;
      return NULL;
    }
  }
  w->blocked = false;
  return NULL;
}

/* The NBD error in a reply -> errno. */
static int
nbd_errno (uint32_t e)
{
  switch (e) {
  case 1: return EPERM;
  case 5: return EIO;
  case 12: return ENOMEM;
  case 22: return EINVAL;
  case 28: return ENOSPC;
  case 75: return EOVERFLOW;
  case 95: return ENOTSUP;
  case 108: return ESHUTDOWN;
  default: return EINVAL;       /* as the protocol says */
  }
}

/* The request in slot i got its reply (error: an errno or 0). */
static void
req_done (struct nbd_wire *w, uint32_t i, int error)
{
  struct nbd_cmd *cmd = w->slots[i].cmd;

  if (w->slots[i].type == NBD_CMD_READ)
    w->reads--;
  w->awaiting--;
  slot_free (w, i);
  nbd_part_done (cmd, error);
}

static const char *
bad_magic (const unsigned char *p, char *why, size_t whylen)
{
  snprintf (why, whylen, "bad reply magic 0x%08x (expected 0x%08x)",
            get_be32 (p), NBD_SIMPLE_REPLY_MAGIC);
  return why;
}

static const char *
unknown_cookie (uint64_t cookie, char *why, size_t whylen)
{
  snprintf (why, whylen, "reply to an unknown request (cookie 0x%016llx)",
            (unsigned long long) cookie);
  return why;
}

/* Parse the reply header in rbuf[0..16): NULL, or the protocol error. */
static const char *
parse_reply (struct nbd_wire *w, const unsigned char *p, char *why,
             size_t whylen)
{
  uint64_t cookie = get_be64 (p + 8);
  uint32_t i = cookie & 0xffffffff, error = get_be32 (p + 4);
  struct wire_req *r;

  if (get_be32 (p) != NBD_SIMPLE_REPLY_MAGIC)
    return bad_magic (p, why, whylen);
  if (i >= w->nr_slots || (r = &w->slots[i])->cmd == NULL ||
      r->gen != cookie >> 32)
    return unknown_cookie (cookie, why, whylen);
  if (r->sending) {
    /* Answered before it was read in full (a write rejected early):
     * the protocol still wants its payload read by the server, but one
     * that answers early is usually about to close.  The connection
     * goes as a lost one and the write is retried, rather than be
     * reported failed on a connection whose state is in doubt.
     */
    snprintf (why, whylen, "reply to a request still being sent "
              "(cookie 0x%016llx, error %u)", (unsigned long long) cookie,
              get_be32 (p + 4));
    return why;
  }
  if (r->type == NBD_CMD_READ && error == 0 && r->len > 0) {
    w->rcur = i;                /* the data follows */
    w->rdone = 0;
    return NULL;
  }
  req_done (w, i, error ? nbd_errno (error) : 0);
  return NULL;
}

/* Read what the socket has: NULL, or why the connection failed. */
static const char *
wire_recv (struct nbd_wire *w, char *why, size_t whylen)
{
  for (;;) {
    struct iovec iov[2];
    struct msghdr msg = { .msg_iov = iov };
    size_t want, off;
    ssize_t r;

    if (w->rcur != NO_SLOT) {
      /* A read's data, into the client's buffer, then the next header. */
      struct wire_req *q = &w->slots[w->rcur];
      iov[0].iov_base = q->buf + w->rdone;
      iov[0].iov_len = q->len - w->rdone;
      iov[1].iov_base = w->rbuf;
      iov[1].iov_len = w->awaiting > 1 ? NBD_REPLY_SIZE : 0;
      msg.msg_iovlen = iov[1].iov_len ? 2 : 1;
      want = iov[0].iov_len + iov[1].iov_len;
    }
    else {
      /* Headers only: as many as can come while no read data can. */
      if (w->awaiting == 0)
        want = NBD_REPLY_SIZE - w->rlen; /* nothing due: notice EOF */
      else if (w->reads == 0)
        want = MIN ((size_t) WIRE_RBUF,
                    (size_t) w->awaiting * NBD_REPLY_SIZE) - w->rlen;
      else
        want = NBD_REPLY_SIZE - w->rlen;
      iov[0].iov_base = w->rbuf + w->rlen;
      iov[0].iov_len = want;
      msg.msg_iovlen = 1;
    }
    r = recvmsg (w->fd, &msg, MSG_DONTWAIT);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return NULL;
      snprintf (why, whylen, "recv: %s", strerror (errno));
      return why;
    }
    if (r == 0) {
      snprintf (why, whylen, "the server closed the connection");
      return why;
    }
    if (w->rcur != NO_SLOT) {
      size_t data = MIN ((size_t) r, iov[0].iov_len);
      w->rdone += data;
      w->rlen = r - data;       /* header bytes after the data */
      if (w->rdone == w->slots[w->rcur].len) {
        uint32_t i = w->rcur;
        w->rcur = NO_SLOT;
        req_done (w, i, 0);
      }
    }
    else
      w->rlen += r;
    if (w->rlen && w->awaiting == 0) {
      snprintf (why, whylen, "a reply no request asked for");
      return why;
    }
    /* Every whole header in rbuf. */
    for (off = 0; w->rcur == NO_SLOT && w->rlen - off >= NBD_REPLY_SIZE;
         off += NBD_REPLY_SIZE)
      if (parse_reply (w, w->rbuf + off, why, whylen))
        return why;
    if (w->rcur != NO_SLOT && w->rlen != off) {
      /* Never: nothing is read past a read reply's header. */
      snprintf (why, whylen, "internal error: read data in the header buffer");
      return why;
    }
    memmove (w->rbuf, w->rbuf + off, w->rlen - off);
    w->rlen -= off;
    /* Drained, or nothing more is due (the server closing is seen at
     * the next EV_READ): level-triggered, no recv just for EAGAIN.
     */
    if ((size_t) r < want || (w->awaiting == 0 && w->rlen == 0))
      return NULL;
  }
}

const char *
nbd_wire_io (struct nbd_wire *w, int revents, char *why, size_t whylen)
{
  if ((revents & EV_READ) && wire_recv (w, why, whylen))
    return why;
  if (((revents & EV_WRITE) || !w->blocked) && w->send_head != NO_SLOT &&
      wire_send (w, why, whylen))
    return why;
  return NULL;
}

/* --- inline requests (a worker's, on a parked connection) ------------ */

/* The first window, and the smallest: below it, polling is off. */
#define POLL_START_NS 4000

/* The reply took took_ns after the request was sent, polled for window
 * ns first: adapt the backend's window (see "Adaptive polling" above).
 * Workers race here; the window is a hint, the last store wins.
 */
static void
poll_adapt (struct wire_poll *poll, uint32_t window, uint64_t took_ns)
{
  uint32_t next;

  if (took_ns <= window)
    return;                     /* caught: as it should be */
  if (took_ns > poll->max_ns)   /* too slow to catch: poll less */
    next = window / 2 < POLL_START_NS ? 0 : window / 2;
  else                          /* just missed: poll longer */
    next = MIN (poll->max_ns,
                window ? (uint64_t) window * 2 : POLL_START_NS);
  if (next != window)
    atomic_store_explicit (&poll->ns, next, memory_order_relaxed);
}

/* Wait until fd is ready for events or deadline (monotonic_ns) passes: 0,
 * -ETIMEDOUT, or -1 with why.  In slices of REQUEST_WAIT_SLICE_NS, after
 * each of which it looks at *drop: the loop wanting the connection closed
 * (an abandon: a clone's stop, keep_only) cannot reach a worker asleep
 * in poll, and a hung server would keep it there up to remote-timeout.
 * Given up, the connection and its clone go to the loop as after any
 * fault (nbd_conn_give_up), where the abandon finds the clone.
 */
static int
wait_fd (int fd, short events, uint64_t deadline, const _Atomic bool *drop,
         char *why, size_t whylen)
{
  for (;;) {
    struct pollfd p = { .fd = fd, .events = events };
    uint64_t now = monotonic_ns ();
    int r;

    if (now >= deadline)
      return -ETIMEDOUT;
    /* Rounded up: a last part-millisecond is slept, not spun. */
    r = poll (&p, 1,
              (int) ((MIN (deadline - now, REQUEST_WAIT_SLICE_NS) + 999999)
                     / 1000000));
    if (r > 0)
      return 0;                 /* ready, or HUP/ERR: the call says */
    if (r == 0 && atomic_load (drop)) {
      snprintf (why, whylen, "the connection is wanted closed");
      return -1;
    }
    if (r == -1 && errno != EINTR) {
      snprintf (why, whylen, "poll: %s", strerror (errno));
      return -1;
    }
  }
}

/* iov[] for what is left of hdr[hlen] then buf[blen] after done bytes;
 * the number of entries.
 */
static size_t
iov_from (struct iovec *iov, unsigned char *hdr, size_t hlen, char *buf,
          size_t blen, size_t done)
{
  if (done < hlen) {
    iov[0] = (struct iovec) { hdr + done, hlen - done };
    iov[1] = (struct iovec) { buf, blen };
    return blen ? 2 : 1;
  }
  iov[0] = (struct iovec) { buf + (done - hlen), blen - (done - hlen) };
  return 1;
}

int
nbd_wire_inline (int fd, enum io_op op, uint16_t flags, char *buf,
                 uint64_t offset, uint32_t len, uint64_t deadline,
                 const _Atomic bool *drop, struct wire_poll *poll,
                 char *why, size_t whylen)
{
  unsigned char hdr[NBD_REQUEST_SIZE], rep[NBD_REPLY_SIZE];
  uint16_t type = put_request (hdr, op, flags, INLINE_COOKIE, offset, len);
  size_t plen = type == NBD_CMD_WRITE ? len : 0;
  size_t dlen = type == NBD_CMD_READ ? len : 0;
  size_t done = 0, total = NBD_REQUEST_SIZE + plen;
  struct iovec iov[2];
  struct msghdr msg = { .msg_iov = iov };
  uint32_t error = 0, window = 0;
  uint64_t sent = 0, poll_end = 0;
  bool parsed = false, polling = false;
  ssize_t r;
  int w;

  /* The request: header and payload in one send, unless the socket is
   * full.
   */
  while (done < total) {
    msg.msg_iovlen = iov_from (iov, hdr, NBD_REQUEST_SIZE, buf, plen, done);
    r = sendmsg (fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r >= 0) {
      done += r;
      continue;
    }
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      snprintf (why, whylen, "send: %s", strerror (errno));
      return -1;
    }
    if ((w = wait_fd (fd, POLLOUT, deadline, drop, why, whylen)) != 0)
      return w;
  }

  /* The reply: its header and a read's data in one recv when they have
   * come.  Nothing else can come on the socket: this is its only
   * request.  Polled for first (a recv that finds nothing) while the
   * window lasts, then waited for in poll().
   */
  if (poll->max_ns) {
    sent = monotonic_ns ();
    window = atomic_load_explicit (&poll->ns, memory_order_relaxed);
    if (window) {
      polling = true;
      /* The window is far shorter than remote-timeout (>= 1 s), but a
       * deadline is a deadline.
       */
      poll_end = MIN (sent + window, deadline);
      atomic_fetch_add_explicit (&poll->polled, 1, memory_order_relaxed);
    }
  }
  done = 0;
  total = NBD_REPLY_SIZE + dlen;
  while (done < total) {
    if (!polling &&
        (w = wait_fd (fd, POLLIN, deadline, drop, why, whylen)) != 0)
      return w;
    msg.msg_iovlen = iov_from (iov, rep, NBD_REPLY_SIZE, buf,
                               total - NBD_REPLY_SIZE, done);
    r = recvmsg (fd, &msg, MSG_DONTWAIT);
    if (r == -1) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        /* Nothing yet.  An abandon is seen at once while polling. */
        if (polling && atomic_load_explicit (drop, memory_order_relaxed)) {
          snprintf (why, whylen, "the connection is wanted closed");
          return -1;
        }
        if (polling && monotonic_ns () >= poll_end)
          polling = false;      /* the window is over: sleep */
        continue;
      }
      if (errno == EINTR)
        continue;
      snprintf (why, whylen, "recv: %s", strerror (errno));
      return -1;
    }
    if (r == 0) {
      snprintf (why, whylen, "the server closed the connection");
      return -1;
    }
    done += r;
    if (!parsed && done >= NBD_REPLY_SIZE) {
      parsed = true;
      if (get_be32 (rep) != NBD_SIMPLE_REPLY_MAGIC) {
        bad_magic (rep, why, whylen);
        return -1;
      }
      if (get_be64 (rep + 8) != INLINE_COOKIE) {
        unknown_cookie (get_be64 (rep + 8), why, whylen);
        return -1;
      }
      error = get_be32 (rep + 4);
      if (error)
        total = NBD_REPLY_SIZE;         /* no data follows an error */
    }
    if (done > total) {
      snprintf (why, whylen, "a reply no request asked for");
      return -1;
    }
  }
  if (poll->max_ns) {
    if (polling)
      atomic_fetch_add_explicit (&poll->caught, 1, memory_order_relaxed);
    poll_adapt (poll, window, monotonic_ns () - sent);
  }
  return error ? nbd_errno (error) : 0;
}

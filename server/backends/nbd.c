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
 * Host names: libnbd looks the host of an nbd:// or nbds:// URI up with
 * a blocking getaddrinfo inside nbd_aio_connect_uri.  For a URI whose
 * host is a name, that call runs in the resolver thread, which hands the
 * handle (its TCP connect under way, non-blocking) to the loop: a slow
 * or dead DNS server delays that backend's reconnections, never the
 * loop and every other backend with it.
 */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <ev.h>
#include <libnbd.h>

#include "internal.h"

#define LOG(...) do { if (mapper_debug) mapper_debug (__VA_ARGS__); } while (0)

/* engine_set_remote; read when a backend is opened. */
static unsigned opt_connections = 4;
static unsigned opt_timeout = 30;

#define BACKOFF_MIN 0.05        /* seconds before the first reconnect */
#define BACKOFF_MAX 1.0
#define MAX_PAYLOAD (32u << 20) /* split reads/writes above this */
#define MAX_NOPAYLOAD (1u << 30) /* and zero/trim above this */
#define ZERO_BUF (4u << 20)     /* zeros written when the server can't zero */
#ifndef SPILL
#define SPILL 32                /* commands on a connection before the next */
#endif

struct nbd_backend;
struct nbd_conn;

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
static const char *const conn_state_name[] = {
  [CONN_DOWN] = "down", [CONN_CONNECTING] = "connecting", [CONN_UP] = "up",
};

struct nbd_conn {
  struct nbd_backend *nb;       /* read-only */
  unsigned index;               /* read-only */
  /* Loop thread only (or the owner of the backend when no loop runs). */
  struct nbd_handle *h;         /* NULL when down */
  enum conn_state state;
  ev_io io;                     /* h's fd, events from nbd_aio_get_direction */
  ev_timer timer;               /* down: back-off; connecting: deadline */
  double backoff;
  bool lost;                    /* a command saw the connection go */
  bool retired;                 /* multi-conn lost (keep_only): never reopened */
  struct lookup *lookup;        /* the resolver is making h, or NULL */
  struct cmd_list inflight;
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

  /* Read-only after open. */
  char *uri;                    /* normalised; also be.name and be.key */
  unsigned nr_conns;
  double timeout;               /* seconds */
  bool lookup;                  /* the URI's host is a name: see lookup_start */
  struct nbd_export ex;
  uint64_t max_payload;         /* per libnbd read/write command */

  /* Loop thread only (the owner of the backend when no loop runs). */
  struct nbd_handle *probe;     /* the open-time connection, until adopted */
  unsigned attached_gen;        /* loop generation watchers belong to */
  struct nbd_conn *conns;
  struct cmd_list waiting;      /* commands waiting for a connection */
  struct nbd_cmd *free_cmds;
  unsigned outstanding;         /* commands waiting or issued */
  ev_timer tick;                /* request deadlines, while outstanding */
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
  uint64_t ack_clock, flushed_ack, lost_ack;
};

#define NB(be) ((struct nbd_backend *) (be))

void
engine_set_remote (unsigned connections, unsigned timeout)
{
  if (connections)
    opt_connections = connections;
  if (timeout)
    opt_timeout = timeout;
}

/* --- command lists --------------------------------------------------- */

static void
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

static void
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

/* --- extents queries (worker side in nbd_extents) -------------------- */

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

/* --- completing commands --------------------------------------------- */

static void cmd_free (struct nbd_cmd *cmd);

/* The command is finished for good: tell its owner. */
static void
cmd_complete (struct nbd_cmd *cmd, int error)
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

/* A command's reply came: account for what the backend now holds
 * unflushed (see ack_clock).  A failed write may
 * have written part: it counts too.
 */
static void
note_reply (struct nbd_cmd *cmd)
{
  struct nbd_backend *nb = cmd->nb;
  struct clone *c = cmd->c;

  if (c == NULL)
    return;
  switch (c->op) {
  case IO_WRITE: case IO_ZERO: case IO_TRIM:
    if (cmd->error || !(c->flags & MAPPER_FUA))
      nb->ack_clock++;
    break;
  case IO_FLUSH:
    if (cmd->error == 0)
      nb->flushed_ack = MAX (nb->flushed_ack, cmd->ack_mark);
    break;
  default:
    break;
  }
}

/* libnbd completion callback for each part (runs under the handle lock:
 * no libnbd calls here).  A part lost with its connection leaves the
 * command on the connection's list for conn_drop to retry.
 */
static int
part_done (void *opaque, int *error)
{
  struct nbd_cmd *cmd = opaque;

  if (*error && connection_error (*error))
    cmd->lost = true;
  else if (*error && cmd->error == 0)
    cmd->error = map_errno (*error);
  if (--cmd->parts == 0) {
    if (!cmd->lost) {
      list_remove (&cmd->conn->inflight, cmd);
      note_reply (cmd);
      cmd_complete (cmd, cmd->error);
    }
    else                        /* e.g. ESHUTDOWN: the server is going */
      cmd->conn->lost = true;
  }
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

/* Issue one libnbd command for [off, off+len) of cmd; cookie or -1. */
static int64_t
issue_part (struct nbd_handle *h, struct nbd_cmd *cmd, uint64_t delta,
            uint64_t len)
{
  nbd_completion_callback cb = { .callback = part_done, .user_data = cmd };
  struct nbd_backend *nb = cmd->nb;
  struct clone *c = cmd->c;
  uint32_t fua = (c->flags & MAPPER_FUA) ? LIBNBD_CMD_FLAG_FUA : 0;

  switch (c->op) {
  case IO_READ:
    return nbd_aio_pread (h, c->buf + delta, len, c->offset + delta, cb, 0);
  case IO_WRITE:
    return nbd_aio_pwrite (h, c->buf + delta, len, c->offset + delta, cb,
                           fua);
  case IO_ZERO:
    if (!nb->ex.zero)           /* emulated: write zeros */
      return nbd_aio_pwrite (h, zeros, len, c->offset + delta, cb, fua);
    return nbd_aio_zero (h, len, c->offset + delta, cb,
                         fua |
                         ((c->flags & MAPPER_MAY_TRIM) ? 0
                          : LIBNBD_CMD_FLAG_NO_HOLE) |
                         ((c->flags & MAPPER_FAST_ZERO)
                          ? LIBNBD_CMD_FLAG_FAST_ZERO : 0));
  case IO_TRIM:
    return nbd_aio_trim (h, len, c->offset + delta, cb, fua);
  case IO_FLUSH:
    return nbd_aio_flush (h, cb, 0);
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

static void conn_drop (struct nbd_conn *conn, const char *why);
static void conn_update_io (struct nbd_conn *conn);
static bool any_up (struct nbd_backend *nb);
static void conn_retry_later (struct nbd_conn *conn);
static void conn_check (struct nbd_conn *conn);

static bool
conn_dead (struct nbd_conn *conn)
{
  return nbd_aio_is_dead (conn->h) || nbd_aio_is_closed (conn->h);
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

  cmd->conn = conn;
  cmd->parts = 1;               /* held while issuing */
  cmd->error = 0;
  cmd->lost = false;
  /* A flush covers the writes whose replies came before it is sent. */
  cmd->ack_mark = cmd->nb->ack_clock;
  list_append (&conn->inflight, cmd);

  if (cmd->x) {
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
      cookie = issue_part (h, cmd, delta, MIN (max, len - delta));
      if (cookie == -1) {
        cmd->parts--;
        break;
      }
    }
  }
  if (cookie == -1) {
    int e = nbd_get_errno ();
    if (conn_dead (conn) || connection_error (e))
      cmd->lost = true;
    else if (cmd->error == 0) {
      LOG ("%s: %s", cmd->nb->uri, nbd_get_error ());
      cmd->error = map_errno (e ? e : EIO);
    }
  }
  if (--cmd->parts == 0 && !cmd->lost) {
    list_remove (&conn->inflight, cmd);
    note_reply (cmd);
    cmd_complete (cmd, cmd->error);
  }
  if (cmd->lost)
    conn_drop (conn, "connection lost while sending");
  else
    conn_update_io (conn);
}

/* Where cmd goes, or NULL.  An extents query: connection 0, the one
 * that asks for structured replies (see connect_handle).  Reads and writes:
 * the first up connection with fewer than SPILL commands issued, else
 * the least busy one, taking connection 0 last.  Filling one connection
 * before the next keeps the batches per socket (and per server wake-up)
 * large; the others take the overflow of deep queues.
 */
static struct nbd_conn *
pick_conn (struct nbd_backend *nb, const struct nbd_cmd *cmd)
{
  struct nbd_conn *best = NULL;

  if (cmd->x)
    return nb->conns[0].state == CONN_UP ? &nb->conns[0] : NULL;
  for (unsigned k = 1; k <= nb->nr_conns; k++) {
    struct nbd_conn *conn = &nb->conns[k < nb->nr_conns ? k : 0];
    if (conn->state != CONN_UP)
      continue;
    if (conn->inflight.len < SPILL)
      return conn;
    if (best == NULL || conn->inflight.len < best->inflight.len)
      best = conn;
  }
  return best;
}

/* Issue waiting commands while a connection is up; when the backend has
 * been down for longer than the timeout, fail them at once.
 */
static void
pump (struct nbd_backend *nb)
{
  struct nbd_cmd *cmd;
  struct nbd_conn *conn;

  while ((cmd = nb->waiting.head) != NULL) {
    conn = pick_conn (nb, cmd);
    if (conn == NULL && cmd->x && any_up (nb)) {
      /* Connection 0 is down, the others can't do block status: the
       * answer is "all data", which is never wrong.
       */
      list_remove (&nb->waiting, cmd);
      cmd->x->nr = 0;
      cmd_complete (cmd, 0);
      continue;
    }
    if (conn == NULL) {
      if (nb->down_since &&
          ev_now (ioloop_ev ()) - nb->down_since >= nb->timeout) {
        list_remove (&nb->waiting, cmd);
        nb->nr_timeouts++;
        cmd_complete (cmd, -EIO);
        continue;
      }
      return;
    }
    list_remove (&nb->waiting, cmd);
    cmd_issue (conn, cmd);
  }
}

/* --- connections ----------------------------------------------------- */

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
static struct nbd_handle *
connect_handle (const char *uri, unsigned index, char *why, size_t len)
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

static void
read_export (struct nbd_handle *h, struct nbd_export *ex)
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

static void
conn_update_io (struct nbd_conn *conn)
{
  struct ev_loop *l = ioloop_ev ();
  unsigned dir = nbd_aio_get_direction (conn->h);
  int fd = nbd_aio_get_fd (conn->h);
  int events = ((dir & LIBNBD_AIO_DIRECTION_READ) ? EV_READ : 0) |
    ((dir & LIBNBD_AIO_DIRECTION_WRITE) ? EV_WRITE : 0);

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

/* --- host name lookups, off the loop -------------------------------- */

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

/* The host in the authority [auth, end) ("[user@]host[:port]"); *port
 * is where ":port" starts, or end.  An IPv6 host keeps its brackets.
 */
static const char *
authority_host (const char *auth, const char *end, const char **port)
{
  const char *host = memchr (auth, '@', end - auth);
  const char *p;

  host = host ? host + 1 : auth;
  p = host[0] == '[' ? memchr (host, ']', end - host) : host;
  p = p ? memchr (p, ':', end - p) : NULL;
  *port = p ? p : end;
  return host;
}

/* Is the host of this normalised TCP URI a name rather than an address? */
static bool
uri_host_is_name (const char *uri)
{
  const char *auth = strstr (uri, "://"), *end, *host, *port;
  char name[256];
  struct in_addr a;

  if (auth == NULL || memmem (uri, auth - uri, "+unix", 5))
    return false;
  auth += 3;
  end = auth + strcspn (auth, "/?");
  host = authority_host (auth, end, &port);
  if (*host == '[')
    return false;                       /* an IPv6 address */
  if ((size_t) (port - host) >= sizeof name)
    return true;
  memcpy (name, host, port - host);
  name[port - host] = '\0';
  return inet_pton (AF_INET, name, &a) != 1;
}

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
    lk->h = connect_handle (lk->uri, lk->index, why, sizeof why);
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
static void
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
      conn_retry_later (conn);          /* the resolver logged why */
    else {
      lk->h = NULL;
      conn_check (conn);
      pump (conn->nb);
    }
  }
  lookup_free (lk);
}

/* Have the resolver make conn's handle; 0, or -1 (try again later). */
static int
lookup_start (struct nbd_conn *conn)
{
  struct lookup *lk = calloc (1, sizeof *lk);
  int r = 0;

  if (lk == NULL || (lk->uri = strdup (conn->nb->uri)) == NULL) {
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
    LOG ("%s: resolver thread: %s", conn->nb->uri, mapper_strerror (r));
    lookup_free (lk);
    return -1;
  }
  conn->lookup = lk;
  return 0;
}

static void
close_handle (struct nbd_conn *conn, bool graceful)
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
}

static void
conn_retry_later (struct nbd_conn *conn)
{
  struct ev_loop *l = ioloop_ev ();

  conn->state = CONN_DOWN;
  if (conn->lookup)
    conn->lookup->wanted = false;       /* this attempt is over */
  ev_timer_stop (l, &conn->timer);
  if (conn->retired)
    return;
  ev_timer_set (&conn->timer, conn->backoff, 0);
  ev_timer_start (l, &conn->timer);
  conn->backoff = conn->backoff ? MIN (conn->backoff * 2, BACKOFF_MAX)
    : BACKOFF_MIN;
}

static bool
any_up (struct nbd_backend *nb)
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
static void
conn_drop (struct nbd_conn *conn, const char *why)
{
  struct nbd_backend *nb = conn->nb;
  struct ev_loop *l = ioloop_ev ();
  ev_tstamp now = ev_now (l);
  bool was_up = conn->state == CONN_UP;
  struct nbd_cmd *cmd;

  /* libnbd's last error says why only when the handle died; after a
   * timeout it is whatever call failed last on this thread.
   */
  const char *error = conn->h && conn_dead (conn) ? nbd_get_error () : NULL;

  LOG ("%s: connection %u %s -> down: %s%s%s", nb->uri, conn->index,
       conn_state_name[conn->state], why, error ? ": " : "",
       error ? error : "");
  ev_io_stop (l, &conn->io);
  close_handle (conn, false);
  /* Down from now on: any_up below must not count this connection, or
   * the last one to go never starts down_since, and requests wait out
   * their whole timeout instead of failing at once while reconnects
   * fail (they fail without a conn_drop when connect(2) does at once,
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
    if ((cmd->c && cmd->c->op == IO_FLUSH) || now >= cmd->deadline) {
      if (now >= cmd->deadline)
        nb->nr_timeouts++;
      cmd_complete (cmd, -EIO);
    }
    else {
      nb->nr_retries++;
      list_append (&nb->waiting, cmd);
    }
  }
  if (!any_up (nb) && nb->down_since == 0)
    nb->down_since = now;
  conn_retry_later (conn);
}

/* The server no longer allows multi-conn: a flush on one connection
 * need not cover writes made on another, so carry on with keep alone.
 * The others are closed for good: their commands are retried on keep,
 * and the writes acknowledged on them count as lost (conn_drop), so the
 * next flush fails once.  When keep is not connection 0, extents report
 * data from then on (pump).
 */
static void
keep_only (struct nbd_conn *keep)
{
  struct nbd_backend *nb = keep->nb;

  LOG ("%s: the server no longer allows multi-conn: connection %u only "
       "from now on", nb->uri, keep->index);
  nb->single = true;
  for (unsigned i = 0; i < nb->nr_conns; i++) {
    struct nbd_conn *conn = &nb->conns[i];

    if (conn == keep)
      continue;
    conn->retired = true;
    if (conn->h)
      conn_drop (conn, "no multi-conn");
    else
      conn_retry_later (conn);  /* stops its timer */
  }
}

static void
conn_up (struct nbd_conn *conn)
{
  struct nbd_backend *nb = conn->nb;
  struct nbd_export now;
  const char *why;

  read_export (conn->h, &now);
  if (conn->index > 0)
    now.extents = nb->ex.extents;       /* connection 0's to give */
  if ((why = export_changed (nb, &now)) != NULL) {
    LOG ("%s: connection %u: reconnected, but %s: not using it",
         nb->uri, conn->index, why);
    ev_io_stop (ioloop_ev (), &conn->io);
    close_handle (conn, true);
    conn_retry_later (conn);
    return;
  }
  if (nb->nr_conns > 1 && !nb->single && !now.multi_conn)
    keep_only (conn);
  ev_timer_stop (ioloop_ev (), &conn->timer);
  conn->state = CONN_UP;
  conn->backoff = BACKOFF_MIN;
  nb->down_since = 0;
  LOG ("%s: connection %u -> up", nb->uri, conn->index);
  conn_update_io (conn);
}

/* After libnbd ran on conn: notice death or the end of the handshake. */
static void
conn_check (struct nbd_conn *conn)
{
  if (conn_dead (conn) || conn->lost)
    conn_drop (conn, conn->state == CONN_UP ? "connection lost"
               : "connect failed");
  else if (conn->state == CONN_CONNECTING && nbd_aio_is_ready (conn->h))
    conn_up (conn);
  else
    conn_update_io (conn);
}

static void
on_io (struct ev_loop *l, ev_io *w, int revents)
{
  struct nbd_conn *conn = w->data;

  if (revents & EV_READ)
    nbd_aio_notify_read (conn->h);
  if ((revents & EV_WRITE) && !conn_dead (conn))
    nbd_aio_notify_write (conn->h);
  conn_check (conn);
  pump (conn->nb);
}

static void
conn_connect (struct nbd_conn *conn)
{
  struct nbd_backend *nb = conn->nb;
  struct ev_loop *l = ioloop_ev ();

  if (nb->lookup) {
    /* A lookup that timed out may still be running: one at a time. */
    if (conn->lookup || lookup_start (conn) == -1) {
      conn_retry_later (conn);
      return;
    }
  }
  else {
    char why[256];
    conn->h = connect_handle (nb->uri, conn->index, why, sizeof why);
    if (conn->h == NULL) {
      LOG ("%s: connection %u: connect: %s", nb->uri, conn->index, why);
      conn_retry_later (conn);
      return;
    }
  }
  conn->state = CONN_CONNECTING;
  LOG ("%s: connection %u -> connecting%s", nb->uri, conn->index,
       conn->h ? "" : " (looking the host up)");
  /* The handshake (and the lookup) has the same deadline as a request. */
  ev_timer_stop (l, &conn->timer);
  ev_timer_set (&conn->timer, nb->timeout, 0);
  ev_timer_start (l, &conn->timer);
  if (conn->h)
    conn_check (conn);
}

static void
on_conn_timer (struct ev_loop *l, ev_timer *w, int revents)
{
  struct nbd_conn *conn = w->data;

  if (conn->state == CONN_DOWN)
    conn_connect (conn);
  else if (conn->state == CONN_CONNECTING)
    conn_drop (conn, "handshake timed out");
  pump (conn->nb);
}

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
      LOG ("%s: request timed out waiting for a connection", nb->uri);
      cmd_complete (cmd, -EIO);
    }
  }
  for (unsigned i = 0; i < nb->nr_conns; i++) {
    struct nbd_conn *conn = &nb->conns[i];
    for (cmd = conn->inflight.head; cmd; cmd = cmd->next)
      if (now >= cmd->deadline) {
        conn_drop (conn, "request timed out (server stalled)");
        break;
      }
  }
  pump (nb);
}

/* Adopt the backend in the current loop: watchers, the probe handle as
 * connection 0, the other connections opened now.
 */
static void
attach (struct nbd_backend *nb)
{
  struct ev_loop *l = ioloop_ev ();
  double period = MIN (1.0, nb->timeout / 4);

  nb->attached_gen = ioloop_generation ();
  ev_timer_init (&nb->tick, on_tick, period, period);
  nb->tick.data = nb;
  for (unsigned i = 0; i < nb->nr_conns; i++) {
    struct nbd_conn *conn = &nb->conns[i];

    ev_io_init (&conn->io, on_io, -1, 0);
    conn->io.data = conn;
    ev_timer_init (&conn->timer, on_conn_timer, 0, 0);
    conn->timer.data = conn;
    /* A lookup from an earlier loop is its resolver's to free. */
    conn->lookup = NULL;
    if (i == 0 && nb->probe) {
      conn->h = nb->probe;
      nb->probe = NULL;
      conn->state = CONN_CONNECTING;  /* conn_check makes it up */
      conn_check (conn);
    }
    else if (conn->h && conn->state == CONN_UP && nbd_aio_is_ready (conn->h))
      conn_update_io (conn);    /* kept over a loop restart */
    else {
      close_handle (conn, false);
      conn->backoff = 0;        /* connect now */
      conn_retry_later (conn);
    }
  }
  if (!any_up (nb) && nb->down_since == 0)
    nb->down_since = ev_now (l);
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
  pump (nb);
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
  int n;

  for (unsigned i = 0; i < nb->nr_conns; i++) {
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
                 PRIu64 " retries, %" PRIu64 " timeouts",
                 nb->outstanding, nb->nr_losses, nb->nr_retries,
                 nb->nr_timeouts);
  s->used = n;
}

static size_t
nbd_status (struct backend *be, char *buf, size_t len)
{
  struct status_call s = { .nb = NB (be), .buf = buf, .len = len };

  ioloop_call (status_run, &s);
  return s.used;
}

static void
detach_run (void *arg)
{
  struct nbd_backend *nb = arg;
  bool attached = nb->attached_gen == ioloop_generation () &&
    ioloop_in_loop_thread ();

  assert (nb->outstanding == 0);
  for (unsigned i = 0; i < nb->nr_conns; i++) {
    struct nbd_conn *conn = &nb->conns[i];
    if (attached) {
      ev_io_stop (ioloop_ev (), &conn->io);
      ev_timer_stop (ioloop_ev (), &conn->timer);
      if (conn->lookup)
        conn->lookup->conn = NULL;      /* conn is about to be freed */
    }
    close_handle (conn, true);
  }
  if (attached)
    ev_timer_stop (ioloop_ev (), &nb->tick);
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
  LOG ("%s: closed", nb->uri);
  free (nb->conns);
  free (nb->be.name);
  free (nb->uri);
  free (nb);
}

static const struct backend_ops nbd_ops = {
  .kind = "nbd",
  .submit = nbd_submit,
  .start = nbd_start,
  .extents = nbd_extents,
  .get_size = nbd_get_size_op,
  .status = nbd_status,
  .close = nbd_close_op,
};

/* --- opening --------------------------------------------------------- */

/* The probe: a blocking connect bounded by the timeout. */
static struct nbd_handle *
probe_connect (const char *uri, double timeout, struct mapper_err *err)
{
  char why[sizeof err->msg];
  struct nbd_handle *h = connect_handle (uri, 0, why, sizeof why);
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
  read_export (h, &ex);
  if (ex.size < 0) {
    mapper_err_set (err, "%s: cannot get size: %s", uri, nbd_get_error ());
    nbd_close (h);
    return -EIO;
  }

  nb = calloc (1, sizeof *nb);
  if (nb == NULL || (nb->uri = strdup (uri)) == NULL ||
      (nb->be.name = strdup (uri)) == NULL) {
    if (nb) {
      free (nb->uri);
      free (nb);
    }
    nbd_close (h);
    mapper_err_set (err, "%s: out of memory", uri);
    return -ENOMEM;
  }
  nb->ex = ex;
  nb->probe = h;
  nb->timeout = opt_timeout;
  nb->lookup = uri_host_is_name (uri);
  nb->nr_conns = ex.multi_conn ? opt_connections : 1;
  nb->max_payload = MIN ((uint64_t) MAX_PAYLOAD, ex.block_max);
  if (nb->max_payload < ex.block_min)
    nb->max_payload = ex.block_min;
  nb->conns = calloc (nb->nr_conns, sizeof *nb->conns);
  if (nb->conns == NULL) {
    free (nb->be.name);
    free (nb->uri);
    free (nb);
    nbd_close (h);
    mapper_err_set (err, "%s: out of memory", uri);
    return -ENOMEM;
  }
  for (unsigned i = 0; i < nb->nr_conns; i++) {
    nb->conns[i].nb = nb;
    nb->conns[i].index = i;
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

/* --- URIs ------------------------------------------------------------ */

static const char *const schemes[] = {
  "nbd://", "nbds://", "nbd+unix://", "nbds+unix://",
};

bool
nbd_backend_is_uri (const char *spec)
{
  for (size_t i = 0; i < ARRAY_SIZE (schemes); i++)
    if (strncasecmp (spec, schemes[i], strlen (schemes[i])) == 0)
      return true;
  return false;
}

static int
hexval (int c)
{
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Percent-decode s[0..n) into a new string; NULL on a bad escape. */
static char *
decode (const char *s, size_t n)
{
  char *out = malloc (n + 1), *p = out;

  if (out == NULL)
    return NULL;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '%') {
      int hi, lo;
      if (i + 2 >= n) {
        free (out);
        return NULL;
      }
      hi = hexval (s[i + 1]);
      lo = hexval (s[i + 2]);
      if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
        free (out);
        return NULL;
      }
      *p++ = hi << 4 | lo;
      i += 2;
    }
    else
      *p++ = s[i];
  }
  *p = '\0';
  return out;
}

static void
encode (FILE *fp, const char *s)
{
  for (const unsigned char *p = (const unsigned char *) s; *p; p++)
    if (*p <= 0x20 || *p >= 0x7f || strchr ("%&#?;=\"'<>\\", *p))
      fprintf (fp, "%%%02X", *p);
    else
      fputc (*p, fp);
}

static int
cmp_params (const void *a, const void *b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

/* A local path in a query parameter, made absolute: nbdkit changes
 * directory when it daemonizes, and two spellings of one socket are one
 * backend.
 */
static char *
absolute_path (const char *path)
{
  char *r = realpath (path, NULL);
  char cwd[PATH_MAX];

  if (r)
    return r;
  if (path[0] == '/')
    return strdup (path);
  if (getcwd (cwd, sizeof cwd) == NULL)
    return NULL;
  if (asprintf (&r, "%s/%s", cwd, path) == -1)
    return NULL;
  return r;
}

DEFINE_VECTOR_TYPE (param_vector, char *);

int
nbd_backend_normalize (const char *spec, char **out, struct mapper_err *err)
{
  const char *rest, *auth, *auth_end, *path, *path_end, *query;
  CLEANUP_FREE char *scheme = NULL;
  param_vector params = empty_vector;
  char *text = NULL;
  size_t size = 0;
  bool is_unix, has_socket = false;
  FILE *fp = NULL;
  int r = -EINVAL;

  rest = strstr (spec, "://");
  scheme = strndup (spec, rest - spec);
  if (scheme == NULL)
    goto oom;
  for (char *p = scheme; *p; p++)
    *p = *p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p;
  is_unix = strstr (scheme, "+unix") != NULL;
  if (strchr (spec, '#')) {
    mapper_err_set (err, "%s: NBD URI must not have a fragment ('#')", spec);
    goto out;
  }
  auth = rest + 3;
  auth_end = auth + strcspn (auth, "/?");
  path = auth_end;
  path_end = path + strcspn (path, "?");
  query = *path_end == '?' ? path_end + 1 : NULL;

  fp = open_memstream (&text, &size);
  if (fp == NULL)
    goto oom;
  fprintf (fp, "%s://", scheme);
  if (is_unix) {
    /* Only a user name (for TLS): "nbds+unix://alice@/?socket=..." */
    const char *at = memchr (auth, '@', auth_end - auth);
    if (auth_end != (at ? at + 1 : auth)) {
      mapper_err_set (err, "%s: %s URI takes no host (use ?socket=PATH)",
                      spec, scheme);
      goto out;
    }
    fwrite (auth, 1, auth_end - auth, fp);
  }
  else {
    const char *port, *host = authority_host (auth, auth_end, &port);
    if (host == auth_end) {
      mapper_err_set (err, "%s: %s URI needs a host", spec, scheme);
      goto out;
    }
    fwrite (auth, 1, host - auth, fp);          /* user@, as written */
    for (const char *p = host; p < port; p++)
      fputc (*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p, fp);
    if (auth_end - port > 1 &&
        !(auth_end - port == 6 && memcmp (port, ":10809", 6) == 0))
      fwrite (port, 1, auth_end - port, fp);
  }
  if (path == path_end)
    fputc ('/', fp);
  else
    fwrite (path, 1, path_end - path, fp);

  /* Query parameters, sorted, local paths absolute. */
  for (const char *q = query; q && *q; ) {
    size_t n = strcspn (q, "&");
    const char *eq = memchr (q, '=', n);
    char *param;

    if (n > 0) {
      size_t klen = eq ? (size_t) (eq - q) : n;
      if ((klen == 6 && strncmp (q, "socket", 6) == 0) ||
          (klen == 12 && strncmp (q, "tls-psk-file", 12) == 0) ||
          (klen == 16 && strncmp (q, "tls-certificates", 16) == 0)) {
        CLEANUP_FREE char *value = eq ? decode (eq + 1, q + n - eq - 1) : NULL;
        CLEANUP_FREE char *abs = NULL;
        FILE *pf;
        size_t psize;

        if (value == NULL || *value == '\0') {
          mapper_err_set (err, "%s: bad or empty value for '%.*s'", spec,
                          (int) klen, q);
          goto out;
        }
        if ((abs = absolute_path (value)) == NULL)
          goto oom;
        param = NULL;
        pf = open_memstream (&param, &psize);
        if (pf == NULL)
          goto oom;
        fprintf (pf, "%.*s=", (int) klen, q);
        encode (pf, abs);
        if (fclose (pf) == EOF)
          goto oom;
        if (klen == 6)
          has_socket = true;
      }
      else if ((param = strndup (q, n)) == NULL)
        goto oom;
      if (param_vector_append (&params, param) == -1) {
        free (param);
        goto oom;
      }
    }
    q += n;
    if (*q == '&')
      q++;
  }
  if (is_unix && !has_socket) {
    mapper_err_set (err, "%s: %s URI needs ?socket=PATH", spec, scheme);
    goto out;
  }
  if (params.len > 1)
    qsort (params.ptr, params.len, sizeof *params.ptr, cmp_params);
  for (size_t i = 0; i < params.len; i++)
    fprintf (fp, "%c%s", i == 0 ? '?' : '&', params.ptr[i]);
  if (fclose (fp) == EOF) {
    fp = NULL;
    goto oom;
  }
  fp = NULL;
  *out = text;
  text = NULL;
  r = 0;
  goto out;

 oom:
  mapper_err_set (err, "%s: out of memory", spec);
  r = -ENOMEM;
 out:
  if (fp)
    fclose (fp);
  free (text);
  for (size_t i = 0; i < params.len; i++)
    free (params.ptr[i]);
  param_vector_reset (&params);
  return r;
}

const struct backend_kind nbd_backend_kind = {
  .name = "nbd",
  .claims = nbd_backend_is_uri,
  .key = nbd_backend_normalize,
  .open = nbd_backend_open,
  .stop = nbd_resolver_stop,
};

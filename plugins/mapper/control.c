/* SPDX-License-Identifier: BSD-3-Clause */
/* The control export: transport and authentication.  A client reads the
 * HELLO (nonce) at offset 0, writes one request at offset 0, FLUSHes to
 * execute it and reads the response at offset 0.  Here: the control-key,
 * who may control without one (Unix peers by uid), the HELLO, and the
 * checks every request passes (its HMAC tag over the connection's nonce,
 * a sequence number above the last) before control-cmds.c runs it.  See
 * proto/PROTOCOL.md.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "engine.h"
#include "util.h"
#include "control-internal.h"

#define MIN_SIZE(a, b) ((a) < (b) ? (a) : (b))

/* Read-only after config_complete. */
static uint8_t *key;            /* NULL: no key, Unix peers by uid */
static size_t keylen;

struct control_conn {
  pthread_mutex_t lock;         /* protects everything below */
  uint8_t nonce[PROTO_NONCE_LEN];
  uint64_t last_seq;            /* highest sequence number accepted */
  char *denied;                 /* non-NULL: why this peer may not control */
  uint8_t *req;                 /* grows only as written */
  size_t req_len, req_cap;
  uint8_t *rsp;                 /* the last response (or the HELLO) */
  size_t rsp_len;
};

/* --- configuration ----------------------------------------------------- */

int
control_config (const char *k, const char *value)
{
  char errmsg[256];

  if (strcmp (k, "control-key") != 0)
    return 0;
  if (key) {
    nbdkit_error ("control-key given twice");
    return -1;
  }
  if (proto_read_key (value, &key, &keylen, errmsg, sizeof errmsg) == -1) {
    nbdkit_error ("control-key: %s", errmsg);
    return -1;
  }
  return 1;
}

int
control_config_complete (void)
{
  return persist_check_dir ();
}

void
control_unload (void)
{
  if (key)
    OPENSSL_cleanse (key, keylen);
  free (key);
  persist_unload ();
}

void
free_secret (char *s)
{
  if (s)
    OPENSSL_cleanse (s, strlen (s));
  free (s);
}

/* free_secret for n bytes (a response, a request: binary). */
static void
free_secret_n (void *p, size_t n)
{
  if (p)
    OPENSSL_cleanse (p, n);
  free (p);
}

/* --- requests --------------------------------------------------------- */

/* Decode, authenticate and run the request in c->req; leave the response
 * in c->rsp.  Called with c->lock held.
 */
static void
execute (struct control_conn *c)
{
  struct proto_request req = { 0 };
  struct reply rp = { PROTO_OK };
  struct secret_stream out;     /* a reply may hold keys (--showkeys) */
  char errmsg[256];
  uint8_t *msg;
  size_t msglen;
  int st;

  rp.out = secret_stream_open (&out);
  if (rp.out == NULL) {
    nbdkit_error ("control: secret_stream_open: %s",
                  mapper_strerror (errno));
    return;
  }
  if (c->denied) {
    reply_fail (&rp, EACCES, "%s", c->denied);
    goto respond;
  }
  if (c->req_len == 0) {
    reply_fail (&rp, EPROTO, "no request written before FLUSH");
    goto respond;
  }
  st = proto_decode_request (c->req, c->req_len, &req, errmsg,
                             sizeof errmsg);
  if (st != PROTO_OK) {
    rp.status = st;
    fputs (errmsg, rp.out);
    goto respond;
  }
  if (key && !proto_check_tag (c->req, c->req_len, key, keylen, c->nonce)) {
    reply_fail (&rp, EACCES, "request %" PRIu64 ": bad HMAC tag: wrong "
                "key (control-key) or altered message", req.seq);
    goto respond;
  }
  if (req.seq <= c->last_seq) {
    reply_fail (&rp, EACCES, "sequence number %" PRIu64 " is not above the "
                "last one (%" PRIu64 "): replayed or reordered request "
                "refused", req.seq, c->last_seq);
    goto respond;
  }
  c->last_seq = req.seq;
  rp.flags = req.flags;
  control_run (&rp, &req);

 respond:
  if (secret_stream_close (&out, &rp.text, &rp.len) == -1) {
    rp.text = strdup ("out of memory building the response");
    rp.len = rp.text ? strlen (rp.text) : 0;
    rp.status = PROTO_ERR_NOMEM;
  }
  if (rp.len > PROTO_MAX_MSG - PROTO_RSP_HDR) {
    free_secret_n (rp.text, rp.len);
    rp.text = strdup ("response is larger than the 16 MiB maximum");
    rp.len = rp.text ? strlen (rp.text) : 0;
    rp.status = PROTO_ERR_TOOBIG;
  }
  if (rp.status != PROTO_OK)
    nbdkit_debug ("control: %s: %s", proto_status_name (rp.status),
                  rp.text ? rp.text : "");
  if (proto_encode_response (rp.status, req.seq, rp.text, rp.len,
                             &msg, &msglen) == 0) {
    free_secret_n (c->rsp, c->rsp_len);
    c->rsp = msg;
    c->rsp_len = msglen;
  }
  /* A reply may hold keys too (table --showkeys); secret_stream left no
   * other copy.
   */
  free_secret_n (rp.text, rp.len);
  /* Requests may carry crypt keys (a table, "key set"): wiped, not just
   * freed.
   */
  for (uint32_t i = 0; req.args && i < req.nargs; i++)
    OPENSSL_cleanse (req.args[i], strlen (req.args[i]));
  proto_request_free (&req);
  /* The next request starts afresh; idle connections keep no buffer. */
  free_secret_n (c->req, c->req_cap);
  c->req = NULL;
  c->req_len = c->req_cap = 0;
}

/* --- the export -------------------------------------------------------- */

bool
control_is_export (const char *name)
{
  return name && strcmp (name, MAPPER_RESERVED_NAME) == 0;
}

struct control_conn *
control_open (int readonly)
{
  struct control_conn *c = calloc (1, sizeof *c);
  uint8_t hello[PROTO_NONCE_LEN + 1];

  if (c == NULL) {
    nbdkit_error ("control: calloc: %s", mapper_strerror (errno));
    return NULL;
  }
  pthread_mutex_init (&c->lock, NULL);
  if (RAND_bytes (c->nonce, sizeof c->nonce) != 1) {
    nbdkit_error ("control: RAND_bytes failed");
    goto err;
  }
  if (key == NULL) {
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof ss;
    int64_t uid = -1;

    /* Only a Unix socket tells who the peer is (SO_PEERCRED). */
    if (nbdkit_peer_name ((struct sockaddr *) &ss, &sslen) == 0 &&
        ss.ss_family == AF_UNIX)
      uid = nbdkit_peer_uid ();
    bool deny = false;
    if (uid < 0 || uid == (uid_t) -1) {
      deny = true;
      c->denied = strdup ("control over TCP needs a key: start the server "
                          "with control-key=FILE and use nbdmsetup --key, "
                          "or connect over the Unix socket");
    }
    else if (uid != 0 && uid != (int64_t) geteuid ()) {
      deny = true;
      if (asprintf (&c->denied, "control refused for uid %" PRIi64 ": only "
                    "root and the server's user (uid %u) may control "
                    "without control-key=FILE", uid,
                    (unsigned) geteuid ()) == -1)
        c->denied = NULL;
    }
    /* Fail closed: no message, no connection. */
    if (deny && c->denied == NULL) {
      nbdkit_error ("control: out of memory");
      goto err;
    }
    if (c->denied)
      nbdkit_debug ("control: %s", c->denied);
  }
  /* HELLO: key-required flag, then the nonce. */
  hello[0] = key ? PROTO_HELLO_KEY_REQUIRED : 0;
  memcpy (hello + 1, c->nonce, PROTO_NONCE_LEN);
  if (proto_encode_response (PROTO_OK, 0, (const char *) hello, sizeof hello,
                             &c->rsp, &c->rsp_len) == -1) {
    nbdkit_error ("control: out of memory");
    goto err;
  }
  return c;

 err:
  pthread_mutex_destroy (&c->lock);
  free (c->denied);
  free (c);
  return NULL;
}

void
control_close (struct control_conn *c)
{
  pthread_mutex_destroy (&c->lock);
  free (c->denied);
  /* A request written but never flushed, the last response. */
  free_secret_n (c->req, c->req_cap);
  free_secret_n (c->rsp, c->rsp_len);
  free (c);
}

int64_t
control_get_size (struct control_conn *c)
{
  return PROTO_MAX_MSG;
}

int
control_pread (struct control_conn *c, void *buf, uint32_t count,
               uint64_t offset)
{
  pthread_mutex_lock (&c->lock);
  memset (buf, 0, count);
  if (offset < c->rsp_len)
    memcpy (buf, c->rsp + offset, MIN_SIZE (count, c->rsp_len - offset));
  pthread_mutex_unlock (&c->lock);
  return 0;
}

int
control_pwrite (struct control_conn *c, const void *buf, uint32_t count,
                uint64_t offset)
{
  uint64_t end;

  if (__builtin_add_overflow (offset, (uint64_t) count, &end) ||
      end > PROTO_MAX_MSG) {
    nbdkit_error ("control: write beyond the %u MiB message maximum",
                  PROTO_MAX_MSG >> 20);
    nbdkit_set_error (EFBIG);
    return -1;
  }
  pthread_mutex_lock (&c->lock);
  if (end > c->req_cap) {
    /* Grow only as written: exactly to the end of this write.  Not
     * realloc: a block it moves keeps the key it may hold.
     */
    uint8_t *p = malloc (end);
    if (p == NULL) {
      pthread_mutex_unlock (&c->lock);
      nbdkit_error ("control: malloc: %s", mapper_strerror (errno));
      nbdkit_set_error (ENOMEM);
      return -1;
    }
    if (c->req)
      memcpy (p, c->req, c->req_len);
    free_secret_n (c->req, c->req_cap);
    c->req = p;
    c->req_cap = end;
  }
  if (offset > c->req_len)
    memset (c->req + c->req_len, 0, offset - c->req_len);
  memcpy (c->req + offset, buf, count);
  if (end > c->req_len)
    c->req_len = end;
  pthread_mutex_unlock (&c->lock);
  return 0;
}

int
control_flush (struct control_conn *c)
{
  pthread_mutex_lock (&c->lock);
  execute (c);
  pthread_mutex_unlock (&c->lock);
  return 0;
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdmapper control protocol: strict, bounds-checked encode/decode and
 * HMAC-SHA256 tags.  Every length read from the wire is checked against
 * what is left before it is used.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include "proto.h"

/* Domain separation: a tag for this protocol can't be a tag for another. */
static const char tag_domain[] = "nbdmapper-control-v1";

static const char *const cmd_names[] = {
  [PROTO_CMD_HELLO] = "hello", [PROTO_CMD_VERSION] = "version",
  [PROTO_CMD_LIST] = "ls", [PROTO_CMD_CREATE] = "create",
  [PROTO_CMD_LOAD] = "load", [PROTO_CMD_CLEAR] = "clear",
  [PROTO_CMD_SUSPEND] = "suspend", [PROTO_CMD_RESUME] = "resume",
  [PROTO_CMD_REPLACE] = "replace", [PROTO_CMD_REMOVE] = "remove",
  [PROTO_CMD_RENAME] = "rename", [PROTO_CMD_INFO] = "info",
  [PROTO_CMD_TABLE] = "table", [PROTO_CMD_STATUS] = "status",
  [PROTO_CMD_MESSAGE] = "message", [PROTO_CMD_TARGETS] = "targets",
  [PROTO_CMD_WAIT] = "wait", [PROTO_CMD_STATS] = "stats",
  [PROTO_CMD_CLIENTS] = "clients",
};

static const char *const status_names[] = {
  [PROTO_OK] = "ok", [PROTO_ERR_INVALID] = "invalid argument",
  [PROTO_ERR_NOENT] = "no such device", [PROTO_ERR_EXIST] = "already exists",
  [PROTO_ERR_BUSY] = "device busy", [PROTO_ERR_DENIED] = "access denied",
  [PROTO_ERR_PROTO] = "protocol error", [PROTO_ERR_TOOBIG] = "too big",
  [PROTO_ERR_IO] = "I/O error", [PROTO_ERR_NOMEM] = "out of memory",
  [PROTO_ERR_TIMEDOUT] = "timed out", [PROTO_ERR_NOTSUP] = "not supported",
  [PROTO_ERR_VERSION] = "unsupported protocol version",
  [PROTO_ERR_STATE] = "wrong device state",
};

const char *
proto_cmd_name (unsigned cmd)
{
  return cmd <= PROTO_CMD_MAX ? cmd_names[cmd] : "unknown";
}

const char *
proto_status_name (unsigned status)
{
  return status <= PROTO_ERR_MAX ? status_names[status] : "unknown error";
}

enum proto_status
proto_status_of_errno (int err)
{
  switch (err < 0 ? -err : err) {
  case 0: return PROTO_OK;
  case ENOENT: case ENODEV: return PROTO_ERR_NOENT;
  case EEXIST: return PROTO_ERR_EXIST;
  case EBUSY: return PROTO_ERR_BUSY;
  case EACCES: case EPERM: return PROTO_ERR_DENIED;
  case EPROTO: case EBADMSG: return PROTO_ERR_PROTO;
  case EFBIG: case E2BIG: case EMSGSIZE: return PROTO_ERR_TOOBIG;
  case EIO: case ENOSPC: case ESHUTDOWN: return PROTO_ERR_IO;
  case ENOMEM: return PROTO_ERR_NOMEM;
  case ETIMEDOUT: return PROTO_ERR_TIMEDOUT;
  case ENOTSUP: case ENOSYS: return PROTO_ERR_NOTSUP;
  case ENXIO: return PROTO_ERR_STATE;
  default: return PROTO_ERR_INVALID;
  }
}

static void
set_err (char *errmsg, size_t errlen, const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));
static void
set_err (char *errmsg, size_t errlen, const char *fmt, ...)
{
  va_list ap;

  if (errmsg == NULL || errlen == 0)
    return;
  va_start (ap, fmt);
  vsnprintf (errmsg, errlen, fmt, ap);
  va_end (ap);
}

static void put16 (uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = v; }
static void
put32 (uint8_t *p, uint32_t v)
{
  p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}
static void
put64 (uint8_t *p, uint64_t v)
{
  put32 (p, v >> 32);
  put32 (p + 4, (uint32_t) v);
}
static uint16_t get16 (const uint8_t *p) { return (p[0] << 8) | p[1]; }
static uint32_t
get32 (const uint8_t *p)
{
  return ((uint32_t) p[0] << 24) | ((uint32_t) p[1] << 16) |
    ((uint32_t) p[2] << 8) | p[3];
}
static uint64_t
get64 (const uint8_t *p)
{
  return ((uint64_t) get32 (p) << 32) | get32 (p + 4);
}

/* HMAC-SHA256 over domain || nonce || msg with the tag field as zeros. */
static int
compute_tag (const uint8_t *msg, size_t len, const uint8_t *key,
             size_t keylen, const uint8_t nonce[PROTO_NONCE_LEN],
             uint8_t out[PROTO_TAG_LEN])
{
  static const uint8_t zeros[PROTO_TAG_LEN];
  EVP_MAC *mac;
  EVP_MAC_CTX *ctx = NULL;
  OSSL_PARAM params[2];
  size_t outl = 0;
  int r = -1;

  if (len < PROTO_REQ_HDR)
    return -1;
  mac = EVP_MAC_fetch (NULL, "HMAC", NULL);
  if (mac == NULL)
    return -1;
  ctx = EVP_MAC_CTX_new (mac);
  params[0] = OSSL_PARAM_construct_utf8_string (OSSL_MAC_PARAM_DIGEST,
                                                (char *) "SHA256", 0);
  params[1] = OSSL_PARAM_construct_end ();
  if (ctx &&
      EVP_MAC_init (ctx, key, keylen, params) &&
      EVP_MAC_update (ctx, (const uint8_t *) tag_domain,
                      sizeof tag_domain - 1) &&
      EVP_MAC_update (ctx, nonce, PROTO_NONCE_LEN) &&
      EVP_MAC_update (ctx, msg, 32) &&
      EVP_MAC_update (ctx, zeros, PROTO_TAG_LEN) &&
      EVP_MAC_update (ctx, msg + PROTO_REQ_HDR, len - PROTO_REQ_HDR) &&
      EVP_MAC_final (ctx, out, &outl, PROTO_TAG_LEN) &&
      outl == PROTO_TAG_LEN)
    r = 0;
  EVP_MAC_CTX_free (ctx);
  EVP_MAC_free (mac);
  return r;
}

int
proto_encode_request (unsigned cmd, uint32_t flags, uint64_t seq,
                      unsigned nargs, const char *const *args,
                      const uint8_t *key, size_t keylen,
                      const uint8_t nonce[PROTO_NONCE_LEN],
                      uint8_t **out, size_t *outlen,
                      char *errmsg, size_t errlen)
{
  size_t total = PROTO_REQ_HDR;
  uint8_t *msg, *p;

  if (nargs > PROTO_MAX_ARGS) {
    set_err (errmsg, errlen, "too many arguments (%u, at most %d)",
             nargs, PROTO_MAX_ARGS);
    return -1;
  }
  for (unsigned i = 0; i < nargs; i++) {
    size_t n = strlen (args[i]);
    if (n > PROTO_MAX_MSG || (total += 4 + n) > PROTO_MAX_MSG) {
      set_err (errmsg, errlen, "request is larger than the %u MiB maximum",
               PROTO_MAX_MSG >> 20);
      return -1;
    }
  }
  msg = calloc (1, total);
  if (msg == NULL) {
    set_err (errmsg, errlen, "out of memory");
    return -1;
  }
  put32 (msg, PROTO_REQ_MAGIC);
  put16 (msg + 4, PROTO_VERSION);
  put16 (msg + 6, cmd);
  put32 (msg + 8, total);
  put32 (msg + 12, flags);
  put64 (msg + 16, seq);
  put32 (msg + 24, nargs);
  p = msg + PROTO_REQ_HDR;
  for (unsigned i = 0; i < nargs; i++) {
    size_t n = strlen (args[i]);
    put32 (p, n);
    memcpy (p + 4, args[i], n);
    p += 4 + n;
  }
  if (key && compute_tag (msg, total, key, keylen, nonce, msg + 32) == -1) {
    set_err (errmsg, errlen, "HMAC-SHA256 failed");
    free (msg);
    return -1;
  }
  *out = msg;
  *outlen = total;
  return 0;
}

int
proto_decode_request (const uint8_t *msg, size_t len,
                      struct proto_request *req,
                      char *errmsg, size_t errlen)
{
  uint32_t magic, total, nargs;
  uint16_t version;
  const uint8_t *p, *end;
  char **args = NULL;
  char *strings = NULL, *s;

  if (len < PROTO_REQ_HDR) {
    set_err (errmsg, errlen, "truncated request: %zu bytes, the header "
             "alone is %d", len, PROTO_REQ_HDR);
    return PROTO_ERR_PROTO;
  }
  magic = get32 (msg);
  if (magic != PROTO_REQ_MAGIC) {
    set_err (errmsg, errlen, "not a control request (magic 0x%08x, "
             "expected 0x%08x)", magic, PROTO_REQ_MAGIC);
    return PROTO_ERR_PROTO;
  }
  version = get16 (msg + 4);
  if (version != PROTO_VERSION) {
    set_err (errmsg, errlen, "protocol version %u not supported (this "
             "server speaks version %d)", version, PROTO_VERSION);
    return PROTO_ERR_VERSION;
  }
  total = get32 (msg + 8);
  if (total > PROTO_MAX_MSG) {
    set_err (errmsg, errlen, "request length %u is over the %u MiB "
             "maximum", total, PROTO_MAX_MSG >> 20);
    return PROTO_ERR_TOOBIG;
  }
  if (total < PROTO_REQ_HDR || total > len) {
    set_err (errmsg, errlen, "truncated request: header says %u bytes, "
             "%zu written", total, len);
    return PROTO_ERR_PROTO;
  }
  if (get32 (msg + 12) & ~PROTO_F_ALL) {
    set_err (errmsg, errlen, "unknown request flags 0x%x",
             get32 (msg + 12) & ~PROTO_F_ALL);
    return PROTO_ERR_PROTO;
  }
  if (get32 (msg + 28) != 0) {
    set_err (errmsg, errlen, "reserved header field is not zero");
    return PROTO_ERR_PROTO;
  }
  nargs = get32 (msg + 24);
  if (nargs > PROTO_MAX_ARGS || (size_t) nargs * 4 > total - PROTO_REQ_HDR) {
    set_err (errmsg, errlen, "argument count %u does not fit in a %u byte "
             "request", nargs, total);
    return PROTO_ERR_PROTO;
  }
  /* One allocation for the strings: at most the payload plus a NUL each. */
  args = calloc (nargs + 1, sizeof *args);
  strings = malloc (total - PROTO_REQ_HDR + nargs + 1);
  if (args == NULL || strings == NULL) {
    free (args);
    free (strings);
    set_err (errmsg, errlen, "out of memory");
    return PROTO_ERR_NOMEM;
  }
  p = msg + PROTO_REQ_HDR;
  end = msg + total;
  s = strings;
  for (uint32_t i = 0; i < nargs; i++) {
    uint32_t n;
    if (end - p < 4) {
      set_err (errmsg, errlen, "argument %u: truncated length", i + 1);
      goto bad;
    }
    n = get32 (p);
    p += 4;
    if ((size_t) (end - p) < n) {
      set_err (errmsg, errlen, "argument %u: length %u runs past the end "
               "of the request", i + 1, n);
      goto bad;
    }
    if (memchr (p, '\0', n)) {
      set_err (errmsg, errlen, "argument %u contains a NUL byte", i + 1);
      goto bad;
    }
    memcpy (s, p, n);
    s[n] = '\0';
    args[i] = s;
    s += n + 1;
    p += n;
  }
  if (p != end) {
    set_err (errmsg, errlen, "%zu bytes of junk after the last argument",
             (size_t) (end - p));
    goto bad;
  }
  req->version = version;
  req->cmd = get16 (msg + 6);
  req->flags = get32 (msg + 12);
  req->seq = get64 (msg + 16);
  memcpy (req->tag, msg + 32, PROTO_TAG_LEN);
  req->nargs = nargs;
  req->args = args;
  if (nargs == 0)
    free (strings);
  return PROTO_OK;

 bad:
  free (args);
  free (strings);
  return PROTO_ERR_PROTO;
}

void
proto_request_free (struct proto_request *req)
{
  if (req->args) {
    free (req->nargs ? req->args[0] : NULL);
    free (req->args);
  }
  req->args = NULL;
}

bool
proto_check_tag (const uint8_t *msg, size_t len, const uint8_t *key,
                 size_t keylen, const uint8_t nonce[PROTO_NONCE_LEN])
{
  uint8_t want[PROTO_TAG_LEN];

  if (len < PROTO_REQ_HDR ||
      compute_tag (msg, len, key, keylen, nonce, want) == -1)
    return false;
  return CRYPTO_memcmp (want, msg + 32, PROTO_TAG_LEN) == 0;
}

int
proto_encode_response (unsigned status, uint64_t seq, const char *payload,
                       size_t payload_len, uint8_t **out, size_t *outlen)
{
  uint8_t *msg;

  if (payload_len > PROTO_MAX_MSG - PROTO_RSP_HDR)
    return -1;
  msg = malloc (PROTO_RSP_HDR + payload_len);
  if (msg == NULL)
    return -1;
  put32 (msg, PROTO_RSP_MAGIC);
  put16 (msg + 4, PROTO_VERSION);
  put16 (msg + 6, status);
  put32 (msg + 8, PROTO_RSP_HDR + payload_len);
  put32 (msg + 12, 0);
  put64 (msg + 16, seq);
  if (payload_len)
    memcpy (msg + PROTO_RSP_HDR, payload, payload_len);
  *out = msg;
  *outlen = PROTO_RSP_HDR + payload_len;
  return 0;
}

int
proto_decode_response_header (const uint8_t *msg, size_t len,
                              uint16_t *status, uint64_t *seq,
                              uint32_t *total, char *errmsg, size_t errlen)
{
  if (len < PROTO_RSP_HDR) {
    set_err (errmsg, errlen, "truncated response");
    return -1;
  }
  if (get32 (msg) != PROTO_RSP_MAGIC) {
    set_err (errmsg, errlen, "not an nbdmapper control export (no response "
             "magic at offset 0)");
    return -1;
  }
  if (get16 (msg + 4) != PROTO_VERSION) {
    set_err (errmsg, errlen, "server speaks control protocol version %u, "
             "this client %d", get16 (msg + 4), PROTO_VERSION);
    return -1;
  }
  *status = get16 (msg + 6);
  *total = get32 (msg + 8);
  *seq = get64 (msg + 16);
  if (*total < PROTO_RSP_HDR || *total > PROTO_MAX_MSG) {
    set_err (errmsg, errlen, "response length %u out of range", *total);
    return -1;
  }
  return 0;
}

int
proto_read_key (const char *path, uint8_t **key, size_t *keylen,
                char *errmsg, size_t errlen)
{
  struct stat st;
  uint8_t *buf;
  ssize_t n;
  int fd;

  fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd == -1) {
    set_err (errmsg, errlen, "key file %s: %s", path, strerror (errno));
    return -1;
  }
  if (fstat (fd, &st) == -1) {
    set_err (errmsg, errlen, "key file %s: %s", path, strerror (errno));
    close (fd);
    return -1;
  }
  if (!S_ISREG (st.st_mode)) {
    set_err (errmsg, errlen, "key file %s is not a regular file", path);
    close (fd);
    return -1;
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    set_err (errmsg, errlen, "key file %s is accessible by group or others "
             "(mode %04o): chmod 600 it", path,
             (unsigned) (st.st_mode & 07777));
    close (fd);
    return -1;
  }
  if (st.st_size < PROTO_KEY_MIN || st.st_size > 4096) {
    set_err (errmsg, errlen, "key file %s is %lld bytes: a key must be "
             "%d to 4096 bytes", path, (long long) st.st_size,
             PROTO_KEY_MIN);
    close (fd);
    return -1;
  }
  buf = malloc (st.st_size);
  if (buf == NULL) {
    set_err (errmsg, errlen, "out of memory");
    close (fd);
    return -1;
  }
  n = read (fd, buf, st.st_size);
  close (fd);
  if (n != st.st_size) {
    set_err (errmsg, errlen, "key file %s: short read", path);
    OPENSSL_cleanse (buf, st.st_size);
    free (buf);
    return -1;
  }
  *key = buf;
  *keylen = n;
  return 0;
}

/* Mask the key (second argument) of crypt lines, as dmsetup does without
 * --showkeys: hex digits become zeros; a keyring reference (":...")
 * names no secret and is kept.
 */
void
proto_mask_crypt_keys (char *text)
{
  char *line = text;

  while (*line) {
    char *end = strchr (line, '\n');
    char *words[5];
    size_t lens[5];
    int n = 0;

    if (end == NULL)
      end = line + strlen (line);
    for (char *p = line; p < end && n < 5; ) {
      while (p < end && (*p == ' ' || *p == '\t'))
        p++;
      if (p == end)
        break;
      words[n] = p;
      while (p < end && *p != ' ' && *p != '\t')
        p++;
      lens[n] = p - words[n];
      n++;
    }
    if (n == 5 && lens[2] == 5 && strncmp (words[2], "crypt", 5) == 0 &&
        words[4][0] != ':' && words[4][0] != '-')
      memset (words[4], '0', lens[4]);
    line = *end ? end + 1 : end;
  }
}

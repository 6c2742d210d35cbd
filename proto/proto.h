/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdmapper control protocol: message layout, encode/decode, HMAC tags.
 * Shared by the plugin's control export, nbdmsetup and the fuzz harness.
 * See PROTOCOL.md for the wire format; this header is its C mirror.
 */
#ifndef NBDMAPPER_PROTO_H
#define NBDMAPPER_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PROTO_VERSION      1
#define PROTO_REQ_MAGIC    0x4e424d51u   /* "NBMQ" */
#define PROTO_RSP_MAGIC    0x4e424d50u   /* "NBMP" */
#define PROTO_MAX_MSG      (16u << 20)   /* also the control export's size */
#define PROTO_REQ_HDR      64
#define PROTO_RSP_HDR      24
#define PROTO_TAG_LEN      32
#define PROTO_NONCE_LEN    32
#define PROTO_MAX_ARGS     4096
#define PROTO_KEY_MIN      32

enum proto_cmd {
  PROTO_CMD_HELLO = 0,          /* response only: the connection's nonce */
  PROTO_CMD_VERSION = 1,
  PROTO_CMD_LIST = 2,
  PROTO_CMD_CREATE = 3,
  PROTO_CMD_LOAD = 4,
  PROTO_CMD_CLEAR = 5,
  PROTO_CMD_SUSPEND = 6,
  PROTO_CMD_RESUME = 7,
  PROTO_CMD_REPLACE = 8,
  PROTO_CMD_REMOVE = 9,
  PROTO_CMD_RENAME = 10,
  PROTO_CMD_INFO = 11,
  PROTO_CMD_TABLE = 12,
  PROTO_CMD_STATUS = 13,
  PROTO_CMD_MESSAGE = 14,
  PROTO_CMD_TARGETS = 15,
  PROTO_CMD_WAIT = 16,
  PROTO_CMD_MAX = 16,
};

/* Request flags. */
#define PROTO_F_NOFLUSH   0x1
#define PROTO_F_FORCE     0x2
#define PROTO_F_INACTIVE  0x4
#define PROTO_F_SHOWKEYS  0x8
#define PROTO_F_BACKENDS  0x10
#define PROTO_F_READONLY  0x40
#define PROTO_F_ALL       0x5f

/* HELLO payload flags. */
#define PROTO_HELLO_KEY_REQUIRED 0x1

enum proto_status {
  PROTO_OK = 0,
  PROTO_ERR_INVALID = 1,        /* bad argument, name, table */
  PROTO_ERR_NOENT = 2,          /* no such device */
  PROTO_ERR_EXIST = 3,          /* name already in use */
  PROTO_ERR_BUSY = 4,           /* device open (remove without --force) */
  PROTO_ERR_DENIED = 5,         /* authentication / access refused */
  PROTO_ERR_PROTO = 6,          /* malformed message */
  PROTO_ERR_TOOBIG = 7,         /* message or response over the maximum */
  PROTO_ERR_IO = 8,             /* backend I/O error (flush on suspend) */
  PROTO_ERR_NOMEM = 9,
  PROTO_ERR_TIMEDOUT = 10,      /* wait --timeout expired */
  PROTO_ERR_NOTSUP = 11,        /* unknown command, target has no message */
  PROTO_ERR_VERSION = 12,       /* unsupported protocol version */
  PROTO_ERR_STATE = 13,         /* wrong state: nothing to resume, ... */
  PROTO_ERR_MAX = 13,
};

struct proto_request {
  uint16_t version;
  uint16_t cmd;
  uint32_t flags;
  uint64_t seq;
  uint8_t tag[PROTO_TAG_LEN];
  uint32_t nargs;
  /* Decoded: args[i] points into the caller's buffer copy, NUL-terminated
   * by the decoder (it works on a private copy).
   */
  char **args;
};

struct proto_response {
  uint16_t status;
  uint64_t seq;
  uint32_t len;                 /* payload bytes */
  const char *payload;          /* points into the decoded buffer */
};

const char *proto_cmd_name (unsigned cmd);
const char *proto_status_name (unsigned status);
enum proto_status proto_status_of_errno (int err);

/* Encode a request into a malloc'd buffer (*out, *outlen).  If key is
 * non-NULL the tag is computed over nonce.  0, or -1 with errmsg set.
 */
int proto_encode_request (unsigned cmd, uint32_t flags, uint64_t seq,
                          unsigned nargs, const char *const *args,
                          const uint8_t *key, size_t keylen,
                          const uint8_t nonce[PROTO_NONCE_LEN],
                          uint8_t **out, size_t *outlen,
                          char *errmsg, size_t errlen);

/* Decode and validate msg[0..len).  On success *req owns a private copy
 * (free with proto_request_free).  On failure returns a proto_status and
 * fills errmsg; *req is untouched.
 */
int proto_decode_request (const uint8_t *msg, size_t len,
                          struct proto_request *req,
                          char *errmsg, size_t errlen);
void proto_request_free (struct proto_request *req);

/* Check the HMAC tag of an encoded request msg[0..len) (its tag field is
 * treated as zero).  Constant-time.  true if it matches.
 */
bool proto_check_tag (const uint8_t *msg, size_t len,
                      const uint8_t *key, size_t keylen,
                      const uint8_t nonce[PROTO_NONCE_LEN]);

/* Encode a response header + payload into buf (malloc'd). */
int proto_encode_response (unsigned status, uint64_t seq,
                           const char *payload, size_t payload_len,
                           uint8_t **out, size_t *outlen);
/* Decode a response header from msg[0..len) (len >= PROTO_RSP_HDR);
 * *total is the whole message length.  0, or -1 with errmsg.
 */
int proto_decode_response_header (const uint8_t *msg, size_t len,
                                  uint16_t *status, uint64_t *seq,
                                  uint32_t *total,
                                  char *errmsg, size_t errlen);

/* Key file: at least PROTO_KEY_MIN bytes, not readable by group or
 * others.  0, or -1 with errmsg.
 */
int proto_read_key (const char *path, uint8_t **key, size_t *keylen,
                    char *errmsg, size_t errlen);

/* Table text (dmsetup format, in place): replace the key (fifth word)
 * of every crypt line by as many '0's, as dmsetup does without
 * --showkeys.  Keyring references (":...") and "-" are kept.
 */
void proto_mask_crypt_keys (char *text);

#endif /* NBDMAPPER_PROTO_H */

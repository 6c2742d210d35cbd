/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests of the wire format: encode/decode round trip, HMAC tags
 * (right key, wrong key, wrong nonce, altered byte), strict decoding,
 * response header, key file checks, crypt key masking.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto.h"

static int failures;
#define CHECK(c) do { if (!(c)) { \
  fprintf (stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
  failures++; } } while (0)

static void
write_key (const char *path, size_t len, mode_t mode)
{
  int fd = open (path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  char buf[64];

  memset (buf, 'k', sizeof buf);
  if (fd == -1 || write (fd, buf, len) != (ssize_t) len) {
    perror (path);
    exit (1);
  }
  close (fd);
  chmod (path, mode);
}

int
main (void)
{
  const uint8_t key[32] = "0123456789abcdef0123456789abcdef";
  const uint8_t key2[32] = "0123456789abcdef0123456789abcdeX";
  uint8_t nonce[PROTO_NONCE_LEN] = { 1, 2, 3 }, nonce2[PROTO_NONCE_LEN] = { 9 };
  const char *args[] = { "dev", "", "0 8 zero\n" };
  struct proto_request req;
  char err[256];
  uint8_t *msg, *rsp, *k;
  size_t len, rlen, klen;
  uint16_t st;
  uint64_t seq;
  uint32_t total;

  CHECK (proto_encode_request (PROTO_CMD_CREATE, PROTO_F_FORCE, 7, 3, args,
                               key, sizeof key, nonce, &msg, &len,
                               err, sizeof err) == 0);
  CHECK (len == 64 + 4 + 3 + 4 + 0 + 4 + 9);
  CHECK (proto_decode_request (msg, len, &req, err, sizeof err) == PROTO_OK);
  CHECK (req.cmd == PROTO_CMD_CREATE && req.flags == PROTO_F_FORCE &&
         req.seq == 7 && req.nargs == 3);
  CHECK (strcmp (req.args[0], "dev") == 0 && req.args[1][0] == '\0' &&
         strcmp (req.args[2], "0 8 zero\n") == 0 && req.args[3] == NULL);
  proto_request_free (&req);

  CHECK (proto_check_tag (msg, len, key, sizeof key, nonce));
  CHECK (!proto_check_tag (msg, len, key2, sizeof key2, nonce));
  CHECK (!proto_check_tag (msg, len, key, sizeof key, nonce2));
  msg[len - 1] ^= 1;
  CHECK (!proto_check_tag (msg, len, key, sizeof key, nonce));
  msg[len - 1] ^= 1;
  msg[17] ^= 1;                 /* the sequence number is covered */
  CHECK (!proto_check_tag (msg, len, key, sizeof key, nonce));
  msg[17] ^= 1;

  /* Strict decoding: every short prefix is refused with a message. */
  for (size_t n = 0; n < len; n++) {
    err[0] = '\0';
    CHECK (proto_decode_request (msg, n, &req, err, sizeof err) != PROTO_OK);
    CHECK (err[0] != '\0');
  }
  msg[5] = 2;
  CHECK (proto_decode_request (msg, len, &req, err, sizeof err) ==
         PROTO_ERR_VERSION);
  CHECK (strstr (err, "version 2"));
  free (msg);

  /* Responses. */
  CHECK (proto_encode_response (PROTO_ERR_NOENT, 42, "no", 2, &rsp,
                                &rlen) == 0);
  CHECK (proto_decode_response_header (rsp, rlen, &st, &seq, &total,
                                       err, sizeof err) == 0);
  CHECK (st == PROTO_ERR_NOENT && seq == 42 && total == 26);
  CHECK (memcmp (rsp + 24, "no", 2) == 0);
  rsp[0] = 0;
  CHECK (proto_decode_response_header (rsp, rlen, &st, &seq, &total,
                                       err, sizeof err) == -1);
  CHECK (strstr (err, "not an nbdmapper control export"));
  free (rsp);
  CHECK (strcmp (proto_status_name (PROTO_ERR_BUSY), "device busy") == 0);
  CHECK (proto_status_of_errno (-EEXIST) == PROTO_ERR_EXIST);

  /* Key files. */
  char dir[] = "/tmp/nbdmapper-proto-XXXXXX", path[64];
  CHECK (mkdtemp (dir) != NULL);
  snprintf (path, sizeof path, "%s/key", dir);
  write_key (path, 40, 0600);
  CHECK (proto_read_key (path, &k, &klen, err, sizeof err) == 0 && klen == 40);
  free (k);
  write_key (path, 40, 0640);
  CHECK (proto_read_key (path, &k, &klen, err, sizeof err) == -1);
  CHECK (strstr (err, "group or others"));
  write_key (path, 31, 0600);
  CHECK (proto_read_key (path, &k, &klen, err, sizeof err) == -1);
  CHECK (strstr (err, "31 bytes"));
  unlink (path);
  rmdir (dir);

  /* crypt keys masked, other lines untouched. */
  char t[] = "0 8 crypt aes-xts-plain64 00112233aabb 0 /dev/x 0\n"
    "8 8 linear /dev/y 0\n"
    "16 8 crypt aes-cbc-essiv:sha256 :32:logon:k 0 /dev/z 0\n"
    "24 8 crypt  aes  abcd 0 /dev/w 0";
  proto_mask_crypt_keys (t);
  CHECK (strcmp (t, "0 8 crypt aes-xts-plain64 000000000000 0 /dev/x 0\n"
                 "8 8 linear /dev/y 0\n"
                 "16 8 crypt aes-cbc-essiv:sha256 :32:logon:k 0 /dev/z 0\n"
                 "24 8 crypt  aes  0000 0 /dev/w 0") == 0);

  if (failures) {
    fprintf (stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  return 0;
}

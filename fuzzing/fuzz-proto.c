/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz harness for the control-protocol decoder.
 *
 * With clang's libFuzzer:
 *   clang -g -O1 -fsanitize=fuzzer,address -DWITH_LIBFUZZER -I.. -I../proto \
 *     fuzz-proto.c ../proto/proto.c -lcrypto -o fuzz-proto
 *   ./fuzz-proto corpus-proto
 * Without it (make check), replay.c replays the files named on the command line.
 * Checks: no crash, every refusal has a message, and an accepted request
 * re-encodes to the same bytes (the decoder accepts only what the
 * encoder produces).
 */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  static const uint8_t key[32] = "0123456789abcdef0123456789abcdef";
  static const uint8_t nonce[PROTO_NONCE_LEN];
  struct proto_request req;
  char errmsg[256] = "";
  uint8_t *again;
  size_t len;
  uint16_t status;
  uint64_t seq;
  uint32_t total;
  int st;

  st = proto_decode_request (data, size, &req, errmsg, sizeof errmsg);
  if (st != PROTO_OK) {
    if (errmsg[0] == '\0') {
      fprintf (stderr, "decode refused (%d) without a message\n", st);
      abort ();
    }
  }
  else {
    proto_check_tag (data, size, key, sizeof key, nonce);
    if (proto_encode_request (req.cmd, req.flags, req.seq, req.nargs,
                              (const char *const *) req.args, NULL, 0,
                              nonce, &again, &len, errmsg,
                              sizeof errmsg) == 0) {
      /* Same bytes, apart from the tag (not recomputed without a key). */
      if (len > size || memcmp (again, data, 32) != 0 ||
          memcmp (again + 64, data + 64, len - 64) != 0) {
        fprintf (stderr, "accepted request does not re-encode\n");
        abort ();
      }
      free (again);
    }
    proto_request_free (&req);
  }
  proto_decode_response_header (data, size, &status, &seq, &total,
                                errmsg, sizeof errmsg);
  return 0;
}

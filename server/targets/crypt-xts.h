/* SPDX-License-Identifier: BSD-3-Clause */
/* The transform of the crypt target: AES-XTS (IEEE P1619, dm-crypt's
 * xts(aes)) over encryption sectors with dm-crypt's plain, plain64 and
 * plain64be IVs, built on OpenSSL, with a pool of cipher contexts keyed
 * once and shared by the threads using it.  No I/O here: the target
 * (crypt.c) moves the data, this turns plaintext into ciphertext and
 * back; tests/test-unit-crypt.c checks it alone against OpenSSL's XTS.
 */
#ifndef NBDMAPPER_CRYPT_XTS_H
#define NBDMAPPER_CRYPT_XTS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>

#include "target.h"

#define XTS_MAX_KEY 64          /* bytes: AES-256-XTS */
#define XTS_MAX_SECTOR 4096
#define XTS_SLOTS 64            /* cipher contexts per transform */

enum xts_iv_mode { XTS_IV_PLAIN, XTS_IV_PLAIN64, XTS_IV_PLAIN64BE };

/* The contexts of one slot, used by one thread at a time (busy).
 * Batched (small sectors): AES-ECB, padding off, K1 for the data and K2
 * for the tweaks; otherwise AES-XTS with the whole key and no tweak
 * context.
 */
enum xts_ctx { XTS_CTX_ENC, XTS_CTX_DEC, XTS_CTX_TWEAK, XTS_CTX_NR };
struct xts_slot {
  _Atomic bool busy;
  EVP_CIPHER_CTX *ctx[XTS_CTX_NR];      /* created on first use */
};

struct crypt_xts {
  /* Set by the caller in a zeroed struct before xts_init (iv_offset: at
   * any time before the first xts_convert); read-only after.
   */
  unsigned char key[XTS_MAX_KEY];       /* K1 (data) || K2 (tweak) */
  size_t key_size;                      /* bytes: 32 or 64 */
  uint32_t sector_size;                 /* a power of two, 512 to 4096 */
  enum xts_iv_mode iv_mode;
  bool iv_large_sectors;                /* IVs count sector_size units */
  uint64_t iv_offset;                   /* 512-byte sectors */

  /* Set by xts_init. */
  bool batched;                 /* sector_size <= XTS_BATCH_MAX_SECTOR */
  unsigned sector_shift;        /* log2 (sector_size / 512) */
  EVP_CIPHER *cipher;           /* AES-*-ECB if batched, else AES-*-XTS */
  struct xts_slot slots[XTS_SLOTS];
};

/* Check the key (its size, and that OpenSSL's XTS takes it) and key the
 * first slot, so that a transform that is set up can convert.  0 or
 * -errno with err filled; either way xts_destroy undoes it.
 */
int xts_init (struct crypt_xts *x, struct mapper_err *err);
/* Free the contexts and wipe the key (the struct itself is the
 * caller's).
 */
void xts_destroy (struct crypt_xts *x);
/* En/decrypt len bytes (whole sectors) from in to out (may be equal);
 * off is the target offset (bytes) of in[0], which gives the IVs.  From
 * any number of threads at once.  0 or -errno.
 */
int xts_convert (struct crypt_xts *x, bool enc, uint64_t off,
                 const char *in, char *out, uint64_t len);

#endif /* NBDMAPPER_CRYPT_XTS_H */

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

#include <endian.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <openssl/evp.h>

#include "target.h"

#define XTS_MAX_KEY 64          /* bytes: AES-256-XTS */
#define XTS_MAX_SECTOR 4096
#define XTS_SLOTS 64            /* cipher contexts per transform */
#define XTS_IV_SIZE 16
#define XTS_MAX_ROUNDS 14       /* AES-256 */

/* The VAES transforms (crypt-xts-vaes.c on 512-bit registers,
 * crypt-xts-vaes256.c on 256-bit ones) are compiled on x86-64 with a
 * compiler that has their intrinsics; each runs where the CPU has them.
 */
#if defined __x86_64__ && (defined __clang__ || __GNUC__ >= 10)
#define XTS_HAVE_VAES 1
#else
#define XTS_HAVE_VAES 0
#endif

enum xts_iv_mode { XTS_IV_PLAIN, XTS_IV_PLAIN64, XTS_IV_PLAIN64BE };
/* Which transform converts: OpenSSL's (contexts), or a VAES one (round
 * keys in rk).
 */
enum xts_kind { XTS_KIND_OPENSSL, XTS_KIND_VAES, XTS_KIND_VAES256 };
enum xts_rk { XTS_RK_ENC, XTS_RK_DEC, XTS_RK_TWEAK };

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
  enum xts_kind kind;           /* VAES: no OpenSSL context */
  unsigned rounds;              /* VAES: 10 or 14 */
  /* VAES: round keys, K1 forward and inverse, K2 forward. */
  unsigned char rk[3][XTS_MAX_ROUNDS + 1][16];
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

/* The IV of the sector at target offset toff (bytes). */
static inline void
xts_iv (const struct crypt_xts *x, uint64_t toff, unsigned char *iv)
{
  uint64_t sector = (toff >> MAPPER_SECTOR_SHIFT) + x->iv_offset;

  if (x->iv_large_sectors)
    sector >>= x->sector_shift;
  memset (iv, 0, XTS_IV_SIZE);
  switch (x->iv_mode) {
  case XTS_IV_PLAIN:
    sector = htole64 (sector & 0xffffffff);
    memcpy (iv, &sector, sizeof sector);
    break;
  case XTS_IV_PLAIN64:
    sector = htole64 (sector);
    memcpy (iv, &sector, sizeof sector);
    break;
  case XTS_IV_PLAIN64BE:
    sector = htobe64 (sector);
    memcpy (iv + XTS_IV_SIZE - sizeof sector, &sector, sizeof sector);
    break;
  }
}

/* The transform x converts with: "VAES", "VAES-256" or "OpenSSL"
 * (mapper_crypt_transform's names).
 */
const char *xts_name (const struct crypt_xts *x);

/* Zero the 16 SSE registers, all that code built for the x86-64
 * baseline uses: what crypt-xts.c's xts_tweak_xor leaves there (the last
 * tweak of each lane), and the key schedule's keys on a CPU without AVX
 * (crypt-xts-keys.c), cleared before any call could save them (a lazily
 * bound call's resolver saves the vector state on the stack) and so that
 * a thread does not keep them past a key wipe.
 */
static inline void
xts_clear_xmm (void)
{
#ifdef __x86_64__
#define XTS_X(n) "pxor %%xmm" #n ", %%xmm" #n "\n\t"
  __asm__ volatile (XTS_X (0) XTS_X (1) XTS_X (2) XTS_X (3) XTS_X (4)
                    XTS_X (5) XTS_X (6) XTS_X (7) XTS_X (8) XTS_X (9)
                    XTS_X (10) XTS_X (11) XTS_X (12) XTS_X (13) XTS_X (14)
                    XTS_X (15)
                    ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5",
                    "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
                    "xmm12", "xmm13", "xmm14", "xmm15", "memory");
#undef XTS_X
#endif
}

/* crypt-xts-keys.c: the round keys from x->key (sets rounds, rk), for
 * both VAES transforms; the stack below the caller's frame overwritten
 * (where a VAES conversion spilled tweaks and keys); every vector
 * register zeroed, zmm0-31 (AVX-512 only) or as many as this CPU has.
 */
void xts_vaes_keys (struct crypt_xts *x);
void xts_stack_wipe (void);
void xts_clear_zmm (void);
void xts_clear_vectors (void);

/* crypt-xts-vaes.c: whether this CPU runs it; a conversion as
 * xts_convert's, which cannot fail.
 */
bool xts_vaes_usable (void);
void xts_vaes_convert (const struct crypt_xts *x, bool enc, uint64_t toff,
                       const char *in, char *out, uint64_t len);

/* crypt-xts-vaes256.c: the same on 256-bit registers, for CPUs with VAES
 * and AVX2 but not AVX-512 (Zen 3, Alder Lake): whether this CPU runs
 * it; a conversion (keys from xts_vaes_keys).
 */
bool xts_vaes256_usable (void);
void xts_vaes256_convert (const struct crypt_xts *x, bool enc, uint64_t toff,
                          const char *in, char *out, uint64_t len);

#endif /* NBDMAPPER_CRYPT_XTS_H */

/* SPDX-License-Identifier: BSD-3-Clause */
/* The XTS transform of the crypt target (crypt-xts.h): the pool of
 * cipher contexts and XTS itself, OpenSSL's per sector or batched from
 * AES-ECB (see "Whole sectors, two ways" below); where the CPU has VAES
 * and AVX-512, crypt-xts-vaes.c instead (about twice as fast as either,
 * bench/bench-xts), and no OpenSSL context; with VAES and AVX2 but no
 * AVX-512, crypt-xts-vaes256.c.
 *
 * Keys: the binary key and every cipher context made from it are wiped
 * (OPENSSL_cleanse, EVP_CIPHER_CTX_free) by xts_destroy, the XTS tweaks
 * derived from it as soon as a conversion is done with them.
 */
#include <config.h>

#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "target.h"
#include "util.h"
#include "crypt-xts.h"

#define XTS_BATCH (16 * 1024)        /* bytes per XTS batch (xts_batched) */
#define XTS_BATCH_MAX_SECTOR 1024    /* larger sectors: OpenSSL's XTS */
#define XTS_BLOCK 16

bool mapper_crypt_openssl;
bool mapper_crypt_vaes256;

/* The transform a key set up now gets: the fastest this CPU runs, but
 * as the two switches say (tests and benchmarks run each one).
 */

static enum xts_kind
xts_kind_now (void)
{
  if (mapper_crypt_openssl)
    return XTS_KIND_OPENSSL;
  if (!mapper_crypt_vaes256 && xts_vaes_usable ())
    return XTS_KIND_VAES;
  return xts_vaes256_usable () ? XTS_KIND_VAES256 : XTS_KIND_OPENSSL;
}

static const char *const xts_kind_names[] = {
  [XTS_KIND_OPENSSL] = "OpenSSL", [XTS_KIND_VAES] = "VAES",
  [XTS_KIND_VAES256] = "VAES-256",
};

const char *
mapper_crypt_transform (void)
{
  return xts_kind_names[xts_kind_now ()];
}

const char *
xts_name (const struct crypt_xts *x)
{
  return xts_kind_names[x->kind];
}

/* Each thread's first choice of slot (0: not chosen yet). */
static _Atomic unsigned xts_next_hint;
static __thread unsigned xts_hint;

/* Key a fresh context: encrypting or decrypting data (ECB: with K1, the
 * key's first half; XTS: with the whole key), or encrypting IVs into
 * tweaks (ECB with K2).
 */
static EVP_CIPHER_CTX *
xts_new_ctx (const struct crypt_xts *x, enum xts_ctx which)
{
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new ();
  const unsigned char *key = x->key;

  if (which == XTS_CTX_TWEAK)
    key += x->key_size / 2;
  if (ctx && (EVP_CipherInit_ex2 (ctx, x->cipher, key, NULL,
                                  which != XTS_CTX_DEC, NULL) != 1 ||
              (x->batched && EVP_CIPHER_CTX_set_padding (ctx, 0) != 1))) {
    EVP_CIPHER_CTX_free (ctx);
    ctx = NULL;
  }
  return ctx;
}

/* OpenSSL refuses some XTS keys (two identical halves, where XTS is
 * weak); its AES-ECB does not know they are halves, so ask its XTS,
 * whichever way sectors will be encrypted.
 */
static int
xts_check_key (const struct crypt_xts *x, struct mapper_err *err)
{
  const char *name = x->key_size == 32 ? "AES-128-XTS" : "AES-256-XTS";
  EVP_CIPHER *xts = EVP_CIPHER_fetch (NULL, name, NULL);
  EVP_CIPHER_CTX *ctx;
  int r = 0;

  if (xts == NULL) {
    mapper_err_set (err, "OpenSSL has no %s", name);
    return -ENOTSUP;
  }
  ctx = EVP_CIPHER_CTX_new ();
  if (ctx == NULL) {
    mapper_err_set (err, "out of memory");
    r = -ENOMEM;
  }
  else if (EVP_CipherInit_ex2 (ctx, xts, x->key, NULL, 1, NULL) != 1) {
    mapper_err_set (err, "key refused by OpenSSL %s (are its two halves "
                    "identical?)", name);
    r = -EINVAL;
  }
  EVP_CIPHER_CTX_free (ctx);    /* wipes the key schedule */
  EVP_CIPHER_free (xts);
  return r;
}

void
xts_destroy (struct crypt_xts *x)
{
  for (size_t i = 0; i < XTS_SLOTS; i++)
    for (size_t j = 0; j < XTS_CTX_NR; j++) {
      EVP_CIPHER_CTX_free (x->slots[i].ctx[j]);  /* wipes the key schedule */
      x->slots[i].ctx[j] = NULL;
    }
  EVP_CIPHER_free (x->cipher);
  x->cipher = NULL;
  OPENSSL_cleanse (x->key, sizeof x->key);
  OPENSSL_cleanse (x->rk, sizeof x->rk);
}

int
xts_init (struct crypt_xts *x, struct mapper_err *err)
{
  const char *cipher_name;
  int r;

  if (x->key_size != 32 && x->key_size != 64) {
    mapper_err_set (err, "key of %zu bits is not valid for aes-xts (256 bits "
                    "for AES-128-XTS or 512 bits for AES-256-XTS)",
                    x->key_size * 8);
    return -EINVAL;
  }
  if ((r = xts_check_key (x, err)) < 0)
    return r;
  x->sector_shift = __builtin_ctz (x->sector_size) - MAPPER_SECTOR_SHIFT;
  x->kind = xts_kind_now ();
  if (x->kind != XTS_KIND_OPENSSL) {
    xts_vaes_keys (x);
    return 0;
  }
  x->batched = x->sector_size <= XTS_BATCH_MAX_SECTOR;
  if (x->batched)
    cipher_name = x->key_size == 32 ? "AES-128-ECB" : "AES-256-ECB";
  else
    cipher_name = x->key_size == 32 ? "AES-128-XTS" : "AES-256-XTS";
  x->cipher = EVP_CIPHER_fetch (NULL, cipher_name, NULL);
  if (x->cipher == NULL) {
    mapper_err_set (err, "OpenSSL has no %s", cipher_name);
    return -ENOTSUP;
  }
  /* Key the first slot now: a transform that is set up can convert. */
  for (size_t j = 0; j < (x->batched ? XTS_CTX_NR : XTS_CTX_TWEAK); j++)
    if ((x->slots[0].ctx[j] = xts_new_ctx (x, j)) == NULL) {
      mapper_err_set (err, "cannot key OpenSSL %s", cipher_name);
      return -ENOMEM;
    }
  return 0;
}

/* A free slot, or NULL when every one is taken (more threads than
 * slots): found without a lock, each thread starting at its own slot.
 */
static struct xts_slot *
xts_slot_get (struct crypt_xts *x)
{
  unsigned first;

  if (xts_hint == 0)
    xts_hint = atomic_fetch_add (&xts_next_hint, 1) + 1;
  first = xts_hint - 1;
  for (unsigned k = 0; k < XTS_SLOTS; k++) {
    struct xts_slot *s = &x->slots[(first + k) % XTS_SLOTS];
    bool expected = false;

    if (!atomic_load_explicit (&s->busy, memory_order_relaxed) &&
        atomic_compare_exchange_strong (&s->busy, &expected, true))
      return s;
  }
  return NULL;
}

static void
xts_slot_put (struct xts_slot *s)
{
  atomic_store (&s->busy, false);
}

/* Whole sectors, two ways.
 *
 * OpenSSL's XTS (xts_sectors) needs one call per sector to set its IV,
 * and that call (its parameter machinery) costs about as much as the AES
 * of a 512-byte sector: half the time went there.  So small sectors are
 * done in batches (xts_batched), XTS (IEEE P1619; dm-crypt's xts(aes))
 * built from AES-ECB.  For a data unit (sector) with IV v, block j:
 *
 *   T_0 = E_K2(v),  T_j = T_{j-1} * x  in GF(2^128) (little-endian, 0x87)
 *   C_j = E_K1(P_j ^ T_j) ^ T_j,   P_j = D_K1(C_j ^ T_j) ^ T_j
 *
 * Sector sizes are multiples of 16 bytes: no ciphertext stealing.  A
 * batch of XTS_BATCH bytes costs two ECB calls: every sector's IV
 * through E_K2 at once, then the whole batch through K1 (AES-NI
 * pipelines ECB), with the tweaks expanded and XORed in before and XORed
 * again after; small enough that its data and tweaks stay in L1 between
 * the passes.  Those passes cost more than OpenSSL's XTS, which hides
 * its tweak arithmetic behind the AES, so from 2048-byte sectors up its
 * per-sector call is the cheaper way.  (One thread, AES-NI, AES-256, a
 * 128K request: 512-byte sectors 35 us per sector, 23-26 batched;
 * 1024-byte 25-26, 22-24; 2048-byte 21-22, 24-28; 4096-byte 19, 26-32.)
 */

/* A 16-byte block as two 64-bit numbers, [0] from its bytes 0-7 and [1]
 * from bytes 8-15, little-endian (P1619's order).  GCC/clang vector
 * extensions: SSE2 on x86-64, portable code elsewhere.
 */
typedef uint64_t xts_block __attribute__ ((vector_size (XTS_BLOCK)));

static inline xts_block
xts_load (const unsigned char *p)
{
  xts_block v;

  memcpy (&v, p, sizeof v);
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
  v = (xts_block) { le64toh (v[0]), le64toh (v[1]) };
#endif
  return v;
}

static inline void
xts_store (unsigned char *p, xts_block v)
{
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
  v = (xts_block) { htole64 (v[0]), htole64 (v[1]) };
#endif
  memcpy (p, &v, sizeof v);
}

/* T * x in GF(2^128): both halves shift left one bit; the top bit of the
 * low half carries into the high half, the top bit of the high half
 * folds back into the low one as x^7 + x^2 + x + 1 (0x87).  One 32-bit
 * shuffle moves each half's top word into the other half's lane, and an
 * arithmetic shift spreads its top bit over it (pshufd, psrad: as
 * OpenSSL's XTS does it).
 */
typedef int32_t xts_words __attribute__ ((vector_size (XTS_BLOCK)));
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define XTS_TOPS 3, 3, 1, 1             /* the words holding each top bit */
#else
#define XTS_TOPS 2, 2, 0, 0
#endif
#if defined __clang__ || __GNUC__ >= 12
#define XTS_SHUFFLE(v) __builtin_shufflevector ((v), (v), XTS_TOPS)
#else
#define XTS_SHUFFLE(v) __builtin_shuffle ((v), (xts_words) { XTS_TOPS })
#endif

static inline xts_block
xts_double (xts_block t)
{
  xts_block carry = (xts_block) (XTS_SHUFFLE ((xts_words) t) >> 31);

  return (t << 1) ^ (carry & (xts_block) { 0x87, 1 });
}

/* Each tweak needs the one before: a chain of several cycles per block.
 * Walking XTS_LANES sectors side by side overlaps their chains.
 */
#define XTS_LANES 4             /* = the unroll pragmas below */

static inline __attribute__ ((always_inline)) void
xts_tweak_xor_lanes (unsigned lanes, const unsigned char (*t0)[XTS_IV_SIZE],
                     size_t ss, const unsigned char *in, unsigned char *out,
                     unsigned char *tw)
{
  xts_block t[XTS_LANES];

  /* Unrolled, so that t[] lives in registers. */
#pragma GCC unroll 4
  for (unsigned l = 0; l < lanes; l++)
    t[l] = xts_load (t0[l]);
  for (size_t j = 0; j < ss; j += XTS_BLOCK) {
    xts_block d[XTS_LANES];

    /* All loads before any store: the lanes are sectors apart, and a
     * load behind a store to the same address modulo 4K waits for it.
     */
#pragma GCC unroll 4
    for (unsigned l = 0; l < lanes; l++)
      d[l] = xts_load (in + l * ss + j) ^ t[l];
#pragma GCC unroll 4
    for (unsigned l = 0; l < lanes; l++) {
      xts_store (out + l * ss + j, d[l]);
      xts_store (tw + l * ss + j, t[l]);
      t[l] = xts_double (t[l]);
    }
  }
}

/* For nsec sectors of ss bytes, t0[k] the first tweak of sector k: every
 * block's tweak into tw, and out = in ^ tweaks.
 */
static void
xts_tweak_xor (const unsigned char (*t0)[XTS_IV_SIZE], size_t nsec,
               size_t ss, const unsigned char *in, unsigned char *out,
               unsigned char *tw)
{
  size_t k = 0;

  for (; k + XTS_LANES <= nsec; k += XTS_LANES)
    xts_tweak_xor_lanes (XTS_LANES, &t0[k], ss, in + k * ss, out + k * ss,
                         tw + k * ss);
  for (; k < nsec; k++)
    xts_tweak_xor_lanes (1, &t0[k], ss, in + k * ss, out + k * ss,
                         tw + k * ss);
}

/* buf ^= tw, n bytes (a multiple of XTS_BLOCK). */
static void
xts_xor (unsigned char *buf, const unsigned char *tw, size_t n)
{
  for (size_t i = 0; i < n; i += XTS_BLOCK) {
    xts_block a, b;

    memcpy (&a, buf + i, sizeof a);
    memcpy (&b, tw + i, sizeof b);
    a ^= b;
    memcpy (buf + i, &a, sizeof a);
  }
}

/* OpenSSL's XTS, one call per sector (ctx: the AES-XTS context). */
static int
xts_sectors (const struct crypt_xts *x, EVP_CIPHER_CTX *ctx, int enc,
             uint64_t toff, const char *in, char *out, uint64_t len)
{
  unsigned char iv[XTS_IV_SIZE];

  for (uint64_t done = 0; done < len; done += x->sector_size) {
    int outl;

    xts_iv (x, toff + done, iv);       /* not secret */
    if (EVP_CipherInit_ex2 (ctx, NULL, NULL, iv, enc, NULL) != 1 ||
        EVP_CipherUpdate (ctx, (unsigned char *) out + done, &outl,
                          (const unsigned char *) in + done,
                          x->sector_size) != 1)
      return -EIO;
  }
  return 0;
}

/* XTS from ECB, XTS_BATCH bytes at a time (data: AES-ECB with K1 for
 * the direction wanted; tweak: AES-ECB encrypting with K2).
 */
static int
xts_batched (const struct crypt_xts *x, EVP_CIPHER_CTX *data,
             EVP_CIPHER_CTX *tweak, uint64_t toff, const char *in, char *out,
             uint64_t len)
{
  const uint32_t ss = x->sector_size;
  const size_t tw_len = MIN (len, XTS_BATCH);
  unsigned char t0[XTS_BATCH / MAPPER_SECTOR_SIZE][XTS_IV_SIZE];
  unsigned char *tw = (unsigned char *) bounce_get (tw_len);
  int r = 0;

  if (tw == NULL)
    return -ENOMEM;
  for (uint64_t done = 0, n; done < len; done += n) {
    const unsigned char *src = (const unsigned char *) in + done;
    unsigned char *dst = (unsigned char *) out + done;
    size_t nsec;
    int outl;

    n = MIN (len - done, XTS_BATCH);
    nsec = n / ss;
    for (size_t k = 0; k < nsec; k++)
      xts_iv (x, toff + done + k * ss, t0[k]);
    if (EVP_EncryptUpdate (tweak, t0[0], &outl, t0[0],
                           nsec * XTS_IV_SIZE) != 1 ||
        (size_t) outl != nsec * XTS_IV_SIZE) {
      r = -EIO;
      break;
    }
    xts_tweak_xor (t0, nsec, ss, src, dst, tw);
    if (EVP_CipherUpdate (data, dst, &outl, dst, n) != 1 ||
        (size_t) outl != n) {
      r = -EIO;
      break;
    }
    xts_xor (dst, tw, n);
  }
  /* The tweaks come from K2: don't leave them lying around. */
  xts_clear_xmm ();
  OPENSSL_cleanse (tw, tw_len);
  OPENSSL_cleanse (t0, sizeof t0);
  bounce_put ((char *) tw);
  return r;
}

/* The slot's context (or the caller's temporary one), keyed on first
 * use.
 */
static EVP_CIPHER_CTX *
xts_ctx_get (const struct crypt_xts *x, EVP_CIPHER_CTX **ctxs,
             enum xts_ctx which)
{
  if (ctxs[which] == NULL)
    ctxs[which] = xts_new_ctx (x, which);
  return ctxs[which];
}

int
xts_convert (struct crypt_xts *x, bool enc, uint64_t toff, const char *in,
             char *out, uint64_t len)
{
  struct xts_slot *s;
  EVP_CIPHER_CTX *tmp[XTS_CTX_NR] = { NULL };  /* more threads than slots */
  EVP_CIPHER_CTX **ctxs;
  EVP_CIPHER_CTX *data, *tweak = NULL;
  int r;

  switch (x->kind) {
  case XTS_KIND_VAES:
    xts_vaes_convert (x, enc, toff, in, out, len);
    return 0;
  case XTS_KIND_VAES256:
    xts_vaes256_convert (x, enc, toff, in, out, len);
    return 0;
  case XTS_KIND_OPENSSL:
    break;
  }
  s = xts_slot_get (x);
  ctxs = s ? s->ctx : tmp;
  data = xts_ctx_get (x, ctxs, enc ? XTS_CTX_ENC : XTS_CTX_DEC);
  if (x->batched)
    tweak = xts_ctx_get (x, ctxs, XTS_CTX_TWEAK);
  if (data == NULL || (x->batched && tweak == NULL))
    r = -ENOMEM;
  else if (x->batched)
    r = xts_batched (x, data, tweak, toff, in, out, len);
  else
    r = xts_sectors (x, data, enc, toff, in, out, len);
  if (s)
    xts_slot_put (s);
  for (size_t j = 0; j < XTS_CTX_NR; j++)
    EVP_CIPHER_CTX_free (tmp[j]);
  return r;
}


/* crypt <cipher> <key> <iv_offset> <dev> <offset> [<#opt_params> <opt>...]
 *
 * dm-crypt with OpenSSL: the bytes on the backend are exactly what Linux
 * writes for the same table.  Ciphers: aes-xts-plain64, aes-xts-plain,
 * aes-xts-plain64be (or the capi:xts(aes)-IVMODE spelling), with a 256-
 * or 512-bit hex key (AES-128-XTS or AES-256-XTS).  Options:
 * allow_discards, sector_size:<512..4096>, iv_large_sectors, and dm's
 * performance hints same_cpu_crypt, submit_from_crypt_cpus,
 * no_read_workqueue, no_write_workqueue (accepted, meaningless here).
 *
 * Each encryption sector of sector_size bytes is one XTS data unit whose
 * IV is its sector number in 512-byte units counted from the target's
 * start, plus iv_offset (with iv_large_sectors: in sector_size units):
 * plain is that number's low 32 bits little-endian, plain64 all 64 bits
 * little-endian, plain64be big-endian at the end, zero-padded to 16 bytes.
 *
 * Data paths (the one exception to clone-without-copy):
 *   - reads: ciphertext straight into the client's buffer, decrypted in
 *     place; a partial sector at either end is read and decrypted in a
 *     sector buffer on the stack and the wanted bytes copied out;
 *   - writes and zeros: encrypted into the thread's bounce buffer
 *     (bounce.c; the client's buffer is const) and written from there, in
 *     chunks of at most CRYPT_CHUNK; a partial sector at either end is
 *     read, decrypted, patched, encrypted and written back under a lock on
 *     that sector, so that concurrent partial writes to different bytes
 *     of one sector don't lose each other;
 *   - zero writes encrypted zeros, never a hole (a hole would decrypt to
 *     garbage); fast zero is refused (ENOTSUP);
 *   - trim goes down only with allow_discards, shrunk to whole sectors so
 *     that no byte outside the trimmed range is lost;
 *   - extents: all data (ciphertext holes don't read as zeros);
 *   - the XTS itself: OpenSSL's, one call per sector, except that
 *     sectors of up to 1024 bytes are done many at a time, XTS built
 *     from AES-ECB with the tweaks in another bounce buffer (xts_batched:
 *     OpenSSL's cost per call was half the time for 512-byte sectors).
 * The transform needs to see the data, so this target does its backend
 * I/O itself, synchronously inside map (io_sync), not through clones.
 *
 * Keys: the hex key in the table text is overwritten as soon as it is
 * decoded; the binary key and every cipher context made from it are
 * wiped (OPENSSL_cleanse, EVP_CIPHER_CTX_free) when the table is freed,
 * the XTS tweaks derived from it as soon as a request is done with them.
 * status TABLE prints the key, like dm; hiding it is the caller's job
 * (dmsetup table shows it only with --showkeys).
 */
#include <config.h>

#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "internal.h"

#define CRYPT_CHUNK (1024 * 1024)   /* bytes encrypted per bounce write */
#define CRYPT_BATCH (16 * 1024)      /* bytes per XTS batch (xts_batched) */
#define CRYPT_BATCH_MAX_SECTOR 1024  /* larger sectors: OpenSSL's XTS */
#define CRYPT_MAX_SECTOR 4096
#define CRYPT_SLOTS 64               /* cipher contexts per target */
#define CRYPT_MAX_OPTS 8
#define XTS_IV_SIZE 16
#define XTS_BLOCK 16

enum iv_mode { IV_PLAIN, IV_PLAIN64, IV_PLAIN64BE };
static const char *const iv_mode_name[] = { "plain", "plain64", "plain64be" };

/* The cipher contexts keyed once for this target, used by one thread
 * at a time (busy).  Found without a lock: each thread starts at its own
 * slot.  Batched (small sectors): AES-ECB, padding off, K1 for the data
 * and K2 for the tweaks; otherwise AES-XTS with the whole key and no
 * CTX_TWEAK.
 */
enum crypt_ctx { CTX_ENC, CTX_DEC, CTX_TWEAK, CTX_NR };

struct crypt_slot {
  _Atomic bool busy;
  EVP_CIPHER_CTX *ctx[CTX_NR];  /* created on first use */
};

struct crypt {
  /* Read-only after ctr. */
  struct backend *be;
  uint64_t start;               /* bytes into the backend */
  uint64_t iv_offset;           /* 512-byte sectors */
  char *cipher_string;          /* as given, for status */
  bool batched;                 /* sector_size <= CRYPT_BATCH_MAX_SECTOR */
  EVP_CIPHER *cipher;           /* AES-*-ECB if batched, else AES-*-XTS */
  enum iv_mode iv_mode;
  uint32_t sector_size;
  unsigned sector_shift;        /* log2 (sector_size / 512) */
  bool iv_large_sectors, allow_discards;
  bool same_cpu_crypt, submit_from_crypt_cpus;
  bool no_read_workqueue, no_write_workqueue;
  size_t key_size;              /* bytes: K1 (data) || K2 (tweak) */
  unsigned char key[64];        /* wiped in dtr */

  struct crypt_slot slots[CRYPT_SLOTS];
};

/* Each thread's first choice of slot (0: not chosen yet). */
static _Atomic unsigned crypt_next_hint;
static __thread unsigned crypt_hint;

/* Partial-sector read-modify-write is serialised per backend sector
 * through one of these, picked by hash.  Only unaligned writes take one.
 */
#define RMW_LOCKS 64
static pthread_mutex_t rmw_locks[RMW_LOCKS] = {
#define L4 PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, \
  PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER
#define L16 L4, L4, L4, L4
  L16, L16, L16, L16
#undef L16
#undef L4
};

static pthread_mutex_t *
rmw_lock (const struct backend *be, uint64_t be_off)
{
  uint64_t h = ((uintptr_t) be ^ (be_off >> 9)) * 0x9e3779b97f4a7c15ULL;

  return &rmw_locks[h >> 58];
}

/* --- constructor ------------------------------------------------------- */

/* Decode the hex key into cc->key, then overwrite the text (as dm does)
 * whatever happens, so it never lingers in the table's copy.
 */
static int
crypt_take_key (struct crypt *cc, char *hex, struct mapper_err *err)
{
  size_t len = strlen (hex);
  int r = 0;

  if (hex[0] == ':')
    mapper_err_set (err, "kernel keyring keys (':...') are not supported: "
                    "give the key in hex"), r = -EINVAL;
  else if (strcmp (hex, "-") == 0)
    mapper_err_set (err, "no key ('-'): aes-xts needs one"), r = -EINVAL;
  else if (len % 2)
    mapper_err_set (err, "key has an odd number of hex digits (%zu)", len),
      r = -EINVAL;
  else if (len / 2 > sizeof cc->key)
    mapper_err_set (err, "key of %zu bits is too long (aes-xts takes 256 or "
                    "512 bits)", len * 4), r = -EINVAL;
  else {
    for (size_t i = 0; i < len; i += 2) {
      int hi = hex_digit (hex[i]), lo = hex_digit (hex[i + 1]);
      if (hi < 0 || lo < 0) {
        mapper_err_set (err, "key is not hexadecimal (character %zu)",
                        i + (hi >= 0) + 1);
        r = -EINVAL;
        break;
      }
      cc->key[i / 2] = hi << 4 | lo;
    }
    cc->key_size = len / 2;
  }
  memset (hex, '0', len);
  return r;
}

/* cipher[:keycount]-chainmode-ivmode[:ivopts], or capi:xts(aes)-ivmode. */
static int
crypt_parse_cipher (struct crypt *cc, const char *spec,
                    struct mapper_err *err)
{
  CLEANUP_FREE char *copy = strdup (spec);
  char *cipher, *chain, *iv, *ivopts, *p;

  if (copy == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  if (strncmp (copy, "capi:", 5) == 0) {
    iv = strrchr (copy + 5, '-');
    if (iv == NULL) {
      mapper_err_set (err, "cipher '%s': IV mode missing", spec);
      return -EINVAL;
    }
    *iv++ = '\0';
    if (strcmp (copy + 5, "xts(aes)") != 0) {
      mapper_err_set (err, "cipher '%s' is not supported (only xts(aes))",
                      copy + 5);
      return -EINVAL;
    }
  }
  else {
    cipher = copy;
    chain = strchr (cipher, '-');
    if (chain)
      *chain++ = '\0';
    iv = chain ? strchr (chain, '-') : NULL;
    if (iv)
      *iv++ = '\0';
    if ((p = strchr (cipher, ':')) != NULL) {
      *p++ = '\0';
      if (strcmp (p, "1") != 0) {
        mapper_err_set (err, "cipher '%s': key count '%s' is not supported "
                        "(only 1)", spec, p);
        return -EINVAL;
      }
    }
    if (strcmp (cipher, "aes") != 0) {
      mapper_err_set (err, "unknown cipher '%s' (supported: aes)", cipher);
      return -EINVAL;
    }
    if (chain == NULL || strcmp (chain, "xts") != 0) {
      mapper_err_set (err, "chain mode '%s' is not supported (supported: "
                      "xts)", chain ? chain : "cbc");
      return -EINVAL;
    }
    if (iv == NULL) {
      mapper_err_set (err, "cipher '%s': IV mode required", spec);
      return -EINVAL;
    }
  }
  if ((ivopts = strchr (iv, ':')) != NULL)
    *ivopts++ = '\0';
  for (size_t i = 0; i < ARRAY_SIZE (iv_mode_name); i++)
    if (strcmp (iv, iv_mode_name[i]) == 0) {
      if (ivopts) {
        mapper_err_set (err, "IV mode %s takes no options (':%s')", iv,
                        ivopts);
        return -EINVAL;
      }
      cc->iv_mode = i;
      cc->cipher_string = strdup (spec);
      if (cc->cipher_string == NULL) {
        mapper_err_set (err, "out of memory");
        return -ENOMEM;
      }
      return 0;
    }
  mapper_err_set (err, "unknown IV mode '%s' (supported: plain, plain64, "
                  "plain64be)", iv);
  return -EINVAL;
}

static int
crypt_parse_opts (struct target *ti, struct crypt *cc, unsigned argc,
                  char **argv, struct mapper_err *err)
{
  int r;

  if (argc == 0)
    return 0;
  r = target_count_args (argc, argv, CRYPT_MAX_OPTS, "optional parameter",
                         err);
  if (r < 0)
    return r;
  for (unsigned i = 1; i < argc; i++) {
    const char *o = argv[i];
    uint64_t ss;

    if (strcasecmp (o, "allow_discards") == 0)
      cc->allow_discards = true;
    else if (strcasecmp (o, "same_cpu_crypt") == 0)
      cc->same_cpu_crypt = true;
    else if (strcasecmp (o, "submit_from_crypt_cpus") == 0)
      cc->submit_from_crypt_cpus = true;
    else if (strcasecmp (o, "no_read_workqueue") == 0)
      cc->no_read_workqueue = true;
    else if (strcasecmp (o, "no_write_workqueue") == 0)
      cc->no_write_workqueue = true;
    else if (strcasecmp (o, "iv_large_sectors") == 0)
      cc->iv_large_sectors = true;
    else if (strncasecmp (o, "sector_size:", 12) == 0) {
      if (parse_u64 (o + 12, &ss) < 0 || ss < 512 || ss > CRYPT_MAX_SECTOR ||
          !IS_POWER_OF_2 (ss)) {
        mapper_err_set (err, "invalid sector_size '%s' (a power of two from "
                        "512 to %d)", o + 12, CRYPT_MAX_SECTOR);
        return -EINVAL;
      }
      if (ti->len % ss) {
        mapper_err_set (err, "target length %" PRIu64 " sectors is not a "
                        "multiple of sector_size %" PRIu64,
                        ti->len >> MAPPER_SECTOR_SHIFT, ss);
        return -EINVAL;
      }
      cc->sector_size = ss;
      cc->sector_shift = __builtin_ctz (ss) - MAPPER_SECTOR_SHIFT;
    }
    else if (strncasecmp (o, "integrity:", 10) == 0) {
      mapper_err_set (err, "optional parameter '%s' is not supported", o);
      return -EINVAL;
    }
    else {
      mapper_err_set (err, "unknown optional parameter '%s' (allow_discards, "
                      "sector_size:<bytes>, iv_large_sectors, ...)", o);
      return -EINVAL;
    }
  }
  return 0;
}

/* Key a fresh context: encrypting or decrypting data (ECB: with K1, the
 * key's first half; XTS: with the whole key), or encrypting IVs into
 * tweaks (ECB with K2).
 */
static EVP_CIPHER_CTX *
crypt_new_ctx (const struct crypt *cc, enum crypt_ctx which)
{
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new ();
  const unsigned char *key = cc->key;

  if (which == CTX_TWEAK)
    key += cc->key_size / 2;
  if (ctx && (EVP_CipherInit_ex2 (ctx, cc->cipher, key, NULL,
                                  which != CTX_DEC, NULL) != 1 ||
              (cc->batched && EVP_CIPHER_CTX_set_padding (ctx, 0) != 1))) {
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
crypt_check_key (const struct crypt *cc, struct mapper_err *err)
{
  const char *name = cc->key_size == 32 ? "AES-128-XTS" : "AES-256-XTS";
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
  else if (EVP_CipherInit_ex2 (ctx, xts, cc->key, NULL, 1, NULL) != 1) {
    mapper_err_set (err, "key refused by OpenSSL %s (are its two halves "
                    "identical?)", name);
    r = -EINVAL;
  }
  EVP_CIPHER_CTX_free (ctx);    /* wipes the key schedule */
  EVP_CIPHER_free (xts);
  return r;
}

static void
crypt_free (struct crypt *cc)
{
  for (size_t i = 0; i < CRYPT_SLOTS; i++)
    for (size_t j = 0; j < CTX_NR; j++)
      EVP_CIPHER_CTX_free (cc->slots[i].ctx[j]);  /* wipes the key schedule */
  EVP_CIPHER_free (cc->cipher);
  free (cc->cipher_string);
  OPENSSL_cleanse (cc->key, sizeof cc->key);
  free (cc);
}

static int
crypt_ctr (struct target *ti, unsigned argc, char **argv,
           struct mapper_err *err)
{
  struct mapper_err key_err;
  struct crypt *cc;
  const char *cipher_name;
  int key_r = 0, r;

  cc = calloc (1, sizeof *cc);
  if (cc == NULL) {
    if (argc >= 2)
      memset (argv[1], '0', strlen (argv[1]));
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  /* The key first, whatever else is wrong, so its text is wiped. */
  if (argc >= 2)
    key_r = crypt_take_key (cc, argv[1], &key_err);
  if (argc < 5) {
    mapper_err_set (err, "expected <cipher> <key> <iv_offset> <dev> <offset> "
                    "[<#opt_params> <opt_params>...], got %u argument%s",
                    argc, argc == 1 ? "" : "s");
    r = -EINVAL;
    goto err;
  }
  cc->sector_size = MAPPER_SECTOR_SIZE;
  /* dm reads the optional parameters first (sector_size matters below). */
  if ((r = crypt_parse_opts (ti, cc, argc - 5, &argv[5], err)) < 0)
    goto err;
  if ((r = crypt_parse_cipher (cc, argv[0], err)) < 0)
    goto err;
  if (key_r < 0) {
    *err = key_err;
    r = key_r;
    goto err;
  }
  if (cc->key_size != 32 && cc->key_size != 64) {
    mapper_err_set (err, "key of %zu bits is not valid for aes-xts (256 bits "
                    "for AES-128-XTS or 512 bits for AES-256-XTS)",
                    cc->key_size * 8);
    r = -EINVAL;
    goto err;
  }
  if ((r = crypt_check_key (cc, err)) < 0)
    goto err;
  cc->batched = cc->sector_size <= CRYPT_BATCH_MAX_SECTOR;
  if (cc->batched)
    cipher_name = cc->key_size == 32 ? "AES-128-ECB" : "AES-256-ECB";
  else
    cipher_name = cc->key_size == 32 ? "AES-128-XTS" : "AES-256-XTS";
  cc->cipher = EVP_CIPHER_fetch (NULL, cipher_name, NULL);
  if (cc->cipher == NULL) {
    mapper_err_set (err, "OpenSSL has no %s", cipher_name);
    r = -ENOTSUP;
    goto err;
  }
  /* Key the first slot now: a table that loads can do I/O. */
  for (size_t j = 0; j < (cc->batched ? CTX_NR : CTX_TWEAK); j++)
    if ((cc->slots[0].ctx[j] = crypt_new_ctx (cc, j)) == NULL) {
      mapper_err_set (err, "cannot key OpenSSL %s", cipher_name);
      r = -ENOMEM;
      goto err;
    }
  if (parse_u64 (argv[2], &cc->iv_offset) < 0) {
    mapper_err_set (err, "iv_offset '%s' is not a non-negative integer",
                    argv[2]);
    r = -EINVAL;
    goto err;
  }
  if (cc->iv_offset & ((cc->sector_size >> MAPPER_SECTOR_SHIFT) - 1)) {
    mapper_err_set (err, "iv_offset %" PRIu64 " is not a multiple of "
                    "sector_size %" PRIu32 " (%" PRIu32 " sectors)",
                    cc->iv_offset, cc->sector_size,
                    cc->sector_size >> MAPPER_SECTOR_SHIFT);
    r = -EINVAL;
    goto err;
  }
  if ((r = target_parse_offset (argv[4], &cc->start, err)) < 0)
    goto err;
  if (cc->start & (cc->sector_size - 1)) {
    mapper_err_set (err, "offset %" PRIu64 " is not a multiple of "
                    "sector_size %" PRIu32 " (%" PRIu32 " sectors)",
                    cc->start >> MAPPER_SECTOR_SHIFT, cc->sector_size,
                    cc->sector_size >> MAPPER_SECTOR_SHIFT);
    r = -EINVAL;
    goto err;
  }
  r = target_get_backend (ti, argv[3], cc->start, ti->len, &cc->be, err);
  if (r < 0)
    goto err;
  ti->private = cc;
  return 0;

 err:
  crypt_free (cc);
  return r;
}

static void
crypt_dtr (struct target *ti)
{
  crypt_free (ti->private);
}

/* --- the transform --------------------------------------------------- */

static struct crypt_slot *
crypt_slot_get (struct crypt *cc)
{
  unsigned first;

  if (crypt_hint == 0)
    crypt_hint = atomic_fetch_add (&crypt_next_hint, 1) + 1;
  first = crypt_hint - 1;
  for (unsigned k = 0; k < CRYPT_SLOTS; k++) {
    struct crypt_slot *s = &cc->slots[(first + k) % CRYPT_SLOTS];
    bool expected = false;

    if (!atomic_load_explicit (&s->busy, memory_order_relaxed) &&
        atomic_compare_exchange_strong (&s->busy, &expected, true))
      return s;
  }
  return NULL;
}

static void
crypt_slot_put (struct crypt_slot *s)
{
  atomic_store (&s->busy, false);
}

static void
crypt_iv (const struct crypt *cc, uint64_t toff, unsigned char *iv)
{
  uint64_t sector = (toff >> MAPPER_SECTOR_SHIFT) + cc->iv_offset;

  if (cc->iv_large_sectors)
    sector >>= cc->sector_shift;
  memset (iv, 0, XTS_IV_SIZE);
  switch (cc->iv_mode) {
  case IV_PLAIN:
    sector = htole64 (sector & 0xffffffff);
    memcpy (iv, &sector, sizeof sector);
    break;
  case IV_PLAIN64:
    sector = htole64 (sector);
    memcpy (iv, &sector, sizeof sector);
    break;
  case IV_PLAIN64BE:
    sector = htobe64 (sector);
    memcpy (iv + XTS_IV_SIZE - sizeof sector, &sector, sizeof sector);
    break;
  }
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
 * batch of CRYPT_BATCH bytes costs two ECB calls: every sector's IV
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
xts_sectors (const struct crypt *cc, EVP_CIPHER_CTX *ctx, int enc,
             uint64_t toff, const char *in, char *out, uint64_t len)
{
  unsigned char iv[XTS_IV_SIZE];

  for (uint64_t done = 0; done < len; done += cc->sector_size) {
    int outl;

    crypt_iv (cc, toff + done, iv);       /* not secret */
    if (EVP_CipherInit_ex2 (ctx, NULL, NULL, iv, enc, NULL) != 1 ||
        EVP_CipherUpdate (ctx, (unsigned char *) out + done, &outl,
                          (const unsigned char *) in + done,
                          cc->sector_size) != 1)
      return -EIO;
  }
  return 0;
}

/* XTS from ECB, CRYPT_BATCH bytes at a time (data: AES-ECB with K1 for
 * the direction wanted; tweak: AES-ECB encrypting with K2).
 */
static int
xts_batched (const struct crypt *cc, EVP_CIPHER_CTX *data,
             EVP_CIPHER_CTX *tweak, uint64_t toff, const char *in, char *out,
             uint64_t len)
{
  const uint32_t ss = cc->sector_size;
  const size_t tw_len = MIN (len, CRYPT_BATCH);
  unsigned char t0[CRYPT_BATCH / MAPPER_SECTOR_SIZE][XTS_IV_SIZE];
  unsigned char *tw = (unsigned char *) bounce_get (tw_len);
  int r = 0;

  if (tw == NULL)
    return -ENOMEM;
  for (uint64_t done = 0, n; done < len; done += n) {
    const unsigned char *src = (const unsigned char *) in + done;
    unsigned char *dst = (unsigned char *) out + done;
    size_t nsec;
    int outl;

    n = MIN (len - done, CRYPT_BATCH);
    nsec = n / ss;
    for (size_t k = 0; k < nsec; k++)
      crypt_iv (cc, toff + done + k * ss, t0[k]);
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
  OPENSSL_cleanse (tw, tw_len);
  OPENSSL_cleanse (t0, sizeof t0);
  bounce_put ((char *) tw);
  return r;
}

/* The slot's context (or the caller's temporary one), keyed on first
 * use.
 */
static EVP_CIPHER_CTX *
crypt_ctx (const struct crypt *cc, EVP_CIPHER_CTX **ctxs,
           enum crypt_ctx which)
{
  if (ctxs[which] == NULL)
    ctxs[which] = crypt_new_ctx (cc, which);
  return ctxs[which];
}

/* En/decrypt len bytes (whole sectors) from in to out (may be equal):
 * target offset toff.  0 or -errno.
 */
static int
crypt_convert (struct crypt *cc, int enc, uint64_t toff, const char *in,
               char *out, uint64_t len)
{
  struct crypt_slot *s = crypt_slot_get (cc);
  EVP_CIPHER_CTX *tmp[CTX_NR] = { NULL };  /* more threads than slots */
  EVP_CIPHER_CTX **ctxs = s ? s->ctx : tmp;
  EVP_CIPHER_CTX *data, *tweak = NULL;
  int r;

  data = crypt_ctx (cc, ctxs, enc ? CTX_ENC : CTX_DEC);
  if (cc->batched)
    tweak = crypt_ctx (cc, ctxs, CTX_TWEAK);
  if (data == NULL || (cc->batched && tweak == NULL))
    r = -ENOMEM;
  else if (cc->batched)
    r = xts_batched (cc, data, tweak, toff, in, out, len);
  else
    r = xts_sectors (cc, data, enc, toff, in, out, len);
  if (s)
    crypt_slot_put (s);
  for (size_t j = 0; j < CTX_NR; j++)
    EVP_CIPHER_CTX_free (tmp[j]);
  return r;
}

/* --- I/O ---------------------------------------------------------------- */

/* Read [off, off+len) (target bytes) into buf. */
static int
crypt_read (struct crypt *cc, uint64_t off, uint64_t len, char *buf)
{
  const uint64_t ss = cc->sector_size, end = off + len;
  uint64_t pos = off, mid_end = end & ~(ss - 1);
  char sector[CRYPT_MAX_SECTOR];
  int r;

  /* A partial sector at the start (perhaps also the end). */
  if (pos & (ss - 1)) {
    uint64_t sec = pos & ~(ss - 1), n = MIN (end, sec + ss) - pos;

    if ((r = io_sync (IO_READ, cc->be, cc->start + sec, ss, sector, 0)) < 0 ||
        (r = crypt_convert (cc, 0, sec, sector, sector, ss)) < 0)
      return r;
    memcpy (buf, sector + (pos - sec), n);
    pos += n;
  }
  /* Whole sectors: in place in the client's buffer. */
  if (mid_end > pos) {
    char *p = buf + (pos - off);

    if ((r = io_sync (IO_READ, cc->be, cc->start + pos, mid_end - pos, p,
                      0)) < 0 ||
        (r = crypt_convert (cc, 0, pos, p, p, mid_end - pos)) < 0)
      return r;
    pos = mid_end;
  }
  /* A partial sector at the end. */
  if (pos < end) {
    if ((r = io_sync (IO_READ, cc->be, cc->start + pos, ss, sector, 0)) < 0 ||
        (r = crypt_convert (cc, 0, pos, sector, sector, ss)) < 0)
      return r;
    memcpy (buf + (pos - off), sector, end - pos);
  }
  return 0;
}

/* Replace bytes [in_off, in_off+n) of the sector at target offset sec by
 * src (NULL: zeros): read, decrypt, patch, encrypt, write, serialised
 * with other partial writes to the same sector.
 */
static int
crypt_rmw (struct crypt *cc, uint32_t flags, uint64_t sec, uint64_t in_off,
           uint64_t n, const char *src)
{
  const uint64_t ss = cc->sector_size;
  pthread_mutex_t *lock = rmw_lock (cc->be, cc->start + sec);
  char sector[CRYPT_MAX_SECTOR];
  int r;

  pthread_mutex_lock (lock);
  if ((r = io_sync (IO_READ, cc->be, cc->start + sec, ss, sector, 0)) == 0 &&
      (r = crypt_convert (cc, 0, sec, sector, sector, ss)) == 0) {
    if (src)
      memcpy (sector + in_off, src, n);
    else
      memset (sector + in_off, 0, n);
    if ((r = crypt_convert (cc, 1, sec, sector, sector, ss)) == 0)
      r = io_sync (IO_WRITE, cc->be, cc->start + sec, ss, sector, flags);
  }
  pthread_mutex_unlock (lock);
  OPENSSL_cleanse (sector, ss);   /* plaintext */
  return r;
}

/* Write [off, off+len) from src (NULL: zeros). */
static int
crypt_write (struct crypt *cc, uint32_t flags, uint64_t off, uint64_t len,
             const char *src)
{
  const uint64_t ss = cc->sector_size, end = off + len;
  uint64_t pos = off, mid_end = end & ~(ss - 1);
  int r;

  if (pos & (ss - 1)) {
    uint64_t sec = pos & ~(ss - 1), n = MIN (end, sec + ss) - pos;

    if ((r = crypt_rmw (cc, flags, sec, pos - sec, n, src)) < 0)
      return r;
    pos += n;
  }
  while (pos < mid_end) {
    uint64_t n = MIN (mid_end - pos, CRYPT_CHUNK);
    char *b = bounce_get (n);

    if (b == NULL)
      return -ENOMEM;
    if (src)
      r = crypt_convert (cc, 1, pos, src + (pos - off), b, n);
    else {
      memset (b, 0, n);
      r = crypt_convert (cc, 1, pos, b, b, n);
    }
    if (r == 0)
      r = io_sync (IO_WRITE, cc->be, cc->start + pos, n, b, flags);
    bounce_put (b);
    if (r < 0)
      return r;
    pos += n;
  }
  if (pos < end)
    return crypt_rmw (cc, flags, pos, 0, end - pos,
                      src ? src + (pos - off) : NULL);
  return 0;
}

static int
crypt_map (struct target *ti, struct io_req *req, uint64_t off,
           uint64_t len, char *buf)
{
  struct crypt *cc = ti->private;
  uint64_t ss = cc->sector_size, first, last;

  switch (req->op) {
  case IO_READ:
    return crypt_read (cc, off, len, buf);
  case IO_WRITE:
    return crypt_write (cc, req->flags, off, len, buf);
  case IO_ZERO:
    /* Encrypted zeros must be written: never fast. */
    if (req->flags & MAPPER_FAST_ZERO)
      return -ENOTSUP;
    return crypt_write (cc, req->flags, off, len, NULL);
  case IO_TRIM:
    if (!cc->allow_discards)
      return 0;                 /* trim is advisory: dm ignores it */
    first = (off + ss - 1) & ~(ss - 1);
    last = (off + len) & ~(ss - 1);
    if (first >= last)
      return 0;
    return io_emit (req, cc->be, cc->start + first, last - first, NULL);
  case IO_FLUSH:
    break;
  }
  abort ();                     /* flushes never come through map */
}

static int
crypt_extents (struct target *ti, struct extent_walk *w, uint64_t off,
               uint64_t len)
{
  /* A hole in the ciphertext is not zeros in the plaintext. */
  return extent_walk_add (w, ti, off, len, 0);
}

static size_t
crypt_status (struct target *ti, enum status_type type, char *buf,
              size_t len)
{
  struct crypt *cc = ti->private;
  unsigned nr;
  size_t used = 0;

#define APPEND(...) \
  used += snprintf (used < len ? buf + used : NULL, \
                    used < len ? len - used : 0, __VA_ARGS__)
  if (type == STATUSTYPE_INFO)
    return snprintf (buf, len, "%s", "");
  APPEND ("%s ", cc->cipher_string);
  for (size_t i = 0; i < cc->key_size; i++)
    APPEND ("%02x", cc->key[i]);
  APPEND (" %" PRIu64 " %s %" PRIu64, cc->iv_offset, cc->be->name,
          cc->start >> MAPPER_SECTOR_SHIFT);
  /* dm's order. */
  nr = cc->allow_discards + cc->same_cpu_crypt + cc->submit_from_crypt_cpus +
    cc->no_read_workqueue + cc->no_write_workqueue +
    (cc->sector_size != MAPPER_SECTOR_SIZE) + cc->iv_large_sectors;
  if (nr) {
    APPEND (" %u", nr);
    if (cc->allow_discards)
      APPEND (" allow_discards");
    if (cc->same_cpu_crypt)
      APPEND (" same_cpu_crypt");
    if (cc->submit_from_crypt_cpus)
      APPEND (" submit_from_crypt_cpus");
    if (cc->no_read_workqueue)
      APPEND (" no_read_workqueue");
    if (cc->no_write_workqueue)
      APPEND (" no_write_workqueue");
    if (cc->sector_size != MAPPER_SECTOR_SIZE)
      APPEND (" sector_size:%" PRIu32, cc->sector_size);
    if (cc->iv_large_sectors)
      APPEND (" iv_large_sectors");
  }
#undef APPEND
  return used;
}

static int
crypt_iterate_backends (struct target *ti,
                        int (*fn) (struct target *, struct backend *, void *),
                        void *data)
{
  struct crypt *cc = ti->private;

  return fn (ti, cc->be, data);
}

const struct target_type crypt_target = {
  .name = "crypt",
  .version = { 1, 23, 0 },
  .ctr = crypt_ctr,
  .dtr = crypt_dtr,
  .map = crypt_map,
  .extents = crypt_extents,
  .status = crypt_status,
  .iterate_backends = crypt_iterate_backends,
};

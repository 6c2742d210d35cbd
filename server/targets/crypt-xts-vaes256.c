/* SPDX-License-Identifier: BSD-3-Clause */
/* AES-XTS with VAES on 256-bit registers (crypt-xts.h): the crypt
 * target's transform on x86-64 CPUs that have VAES, VPCLMULQDQ and AVX2
 * but not AVX-512 (AMD Zen 3, Intel Alder Lake and later client CPUs),
 * where the 512-bit transform (crypt-xts-vaes.c) cannot run and
 * OpenSSL's takes about twice as long (bench/bench-xts).
 *
 * The same one pass as crypt-xts-vaes.c, two AES blocks per instruction:
 * per 256 bytes, 8 registers of 2 blocks, their tweaks derived from the
 * first register's in registers (t x^2i, no chain of dependent
 * multiplications), the tweak XOR folded into the first and last
 * AddRoundKey, the sectors' first tweaks 16 at a time.  AVX2 has 16
 * vector registers and no double shift or ternary logic, so a tweak
 * multiple takes 6 ops (crypt-xts-vaes.c's 4) and the compiler spills
 * some of the round keys and tweaks: they stay secrets there, as in
 * crypt-xts-vaes.c (its header comment): the key arrays are wiped, then
 * the stack the conversion ran on (xts_stack_wipe), and before that
 * every vector register (VZEROALL: ymm0-15 are all this code can use).
 * The round keys are xts_vaes_keys's (AES-NI); tests/test-unit-crypt.c
 * checks every output against OpenSSL's AES-XTS (-D
 * mapper.crypt_vaes256=1 runs this transform where the 512-bit one would).
 */
#include <config.h>

#include <stdlib.h>

#include <openssl/crypto.h>

#include "target.h"
#include "util.h"
#include "crypt-xts.h"

#if XTS_HAVE_VAES

#include <immintrin.h>

#define XTS256_TARGET __attribute__ ((target ("aes,avx2,vaes,vpclmulqdq")))
#define XTS256_CHUNK 256        /* bytes per group of 8 registers */
#define XTS256_BATCH 16         /* sectors whose first tweaks go together */

bool
xts_vaes256_usable (void)
{
  __builtin_cpu_init ();
  /* GCC's and clang's runtimes report AVX2, VAES and VPCLMULQDQ only
   * where XGETBV says the OS saves the YMM state.
   */
  return __builtin_cpu_supports ("aes") &&
    __builtin_cpu_supports ("avx2") &&
    __builtin_cpu_supports ("vaes") &&
    __builtin_cpu_supports ("vpclmulqdq");
}

/* Each 128-bit lane of t times x^s in GF(2^128) (P1619: little-endian,
 * x^128 = x^7 + x^2 + x + 1), the counts per 64-bit word (sv, and rv =
 * 64 - sv: one call can multiply each lane by a power of its own),
 * 0 <= s <= 32, XORed with e.  The lane shifts left by s as 128 bits:
 * each word shifted, the low word's top s bits carried into the high
 * word (a byte shift of the lane), and the high word's top s bits, H,
 * folded back into the low word as H * 0x87, a carry-less product of
 * under 40 bits, so no second reduction.
 */
XTS256_TARGET static inline __m256i
xts256_mul_xv (__m256i t, __m256i sv, __m256i rv, __m256i poly, __m256i e)
{
  __m256i top = _mm256_srlv_epi64 (t, rv);      /* 0 where rv = 64 */
  __m256i sh = _mm256_or_si256 (_mm256_sllv_epi64 (t, sv),
                                _mm256_bslli_epi128 (top, 8));
  __m256i fold = _mm256_clmulepi64_epi128 (top, poly, 0x01);

  return _mm256_xor_si256 (_mm256_xor_si256 (sh, fold), e);
}

/* xts256_mul_xv with one count s, 1 <= s <= 32, for every word, in the
 * shifts' immediate forms.
 */
XTS256_TARGET static inline __m256i
xts256_mul_x (__m256i t, unsigned s, __m256i poly, __m256i e)
{
  __m256i top = _mm256_srli_epi64 (t, 64 - s);
  __m256i sh = _mm256_or_si256 (_mm256_slli_epi64 (t, s),
                                _mm256_bslli_epi128 (top, 8));
  __m256i fold = _mm256_clmulepi64_epi128 (top, poly, 0x01);

  return _mm256_xor_si256 (_mm256_xor_si256 (sh, fold), e);
}

/* ROUNDS (10 or 14, a constant where this is inlined) of AES over 8
 * registers, k the round keys, after the first AddRoundKey (the
 * caller's), kl[i] register i's last round key (k[rounds] ^ its tweak).
 */
XTS256_TARGET static inline __attribute__ ((always_inline)) void
xts256_aes8 (__m256i *d, const __m256i *k, const __m256i *kl,
             unsigned rounds, bool enc)
{
#pragma GCC unroll 14
  for (unsigned r = 1; r < rounds; r++)
#pragma GCC unroll 8
    for (unsigned i = 0; i < 8; i++)
      d[i] = enc ? _mm256_aesenc_epi128 (d[i], k[r])
        : _mm256_aesdec_epi128 (d[i], k[r]);
#pragma GCC unroll 8
  for (unsigned i = 0; i < 8; i++)
    d[i] = enc ? _mm256_aesenclast_epi128 (d[i], kl[i])
      : _mm256_aesdeclast_epi128 (d[i], kl[i]);
}

/* The first tweaks, E_K2 (IV), of sectors toff, toff + ss, ... (nreg
 * registers, a constant where this is inlined: 2 * nreg sectors, those
 * past nsec computed for sector 0 again), into ft (2 * nreg of 16
 * bytes): several independent chains of AES rounds side by side.
 */
XTS256_TARGET static inline __attribute__ ((always_inline)) void
xts256_first_tweaks (const struct crypt_xts *x, const __m256i *kt,
                     unsigned rounds, uint64_t toff, size_t nsec,
                     unsigned nreg, __m256i *ft)
{
  unsigned char iv[XTS256_BATCH][XTS_IV_SIZE] __attribute__ ((aligned (32)));

  for (size_t k = 0; k < 2 * nreg; k++)
    xts_iv (x, toff + (k < nsec ? k : 0) * x->sector_size, iv[k]);
#pragma GCC unroll 8
  for (unsigned i = 0; i < nreg; i++)
    ft[i] = _mm256_xor_si256 (_mm256_load_si256 ((const __m256i *)
                                                 iv[2 * i]), kt[0]);
#pragma GCC unroll 14
  for (unsigned r = 1; r < rounds; r++)
#pragma GCC unroll 8
    for (unsigned i = 0; i < nreg; i++)
      ft[i] = _mm256_aesenc_epi128 (ft[i], kt[r]);
#pragma GCC unroll 8
  for (unsigned i = 0; i < nreg; i++)
    ft[i] = _mm256_aesenclast_epi128 (ft[i], kt[rounds]);
}

XTS256_TARGET static inline __attribute__ ((always_inline)) void
xts256_run (const struct crypt_xts *x, bool enc, unsigned rounds,
            uint64_t toff, const unsigned char *in, unsigned char *out,
            uint64_t len)
{
  const size_t ss = x->sector_size;
  const __m256i poly = _mm256_set1_epi64x (0x87);
  /* Lane j of a sector's first register: its first tweak times x^j. */
  const __m256i sv0 = _mm256_set_epi64x (1, 1, 0, 0);
  const __m256i rv0 = _mm256_set_epi64x (63, 63, 64, 64);
  const __m256i zero = _mm256_setzero_si256 ();
  __m256i k[XTS_MAX_ROUNDS + 1], kt[XTS_MAX_ROUNDS + 1];
  __m256i k0l;                  /* k[0] ^ k[rounds] */
  __m256i ft[XTS256_BATCH / 2]; /* the batch's first tweaks */

  for (unsigned r = 0; r <= rounds; r++) {
    k[r] = _mm256_broadcastsi128_si256 (_mm_loadu_si128 ((const __m128i *)
               x->rk[enc ? XTS_RK_ENC : XTS_RK_DEC][r]));
    kt[r] = _mm256_broadcastsi128_si256 (_mm_loadu_si128 ((const __m128i *)
                x->rk[XTS_RK_TWEAK][r]));
  }
  k0l = _mm256_xor_si256 (k[0], k[rounds]);
  for (uint64_t done = 0; done < len; ) {
    size_t nsec = MIN ((len - done) / ss, XTS256_BATCH);

    /* As many registers as the sectors need: a 4K request of 512-byte
     * sectors (8) does not pay for 16.
     */
    if (nsec <= 2)
      xts256_first_tweaks (x, kt, rounds, toff + done, nsec, 1, ft);
    else if (nsec <= 8)
      xts256_first_tweaks (x, kt, rounds, toff + done, nsec, 4, ft);
    else
      xts256_first_tweaks (x, kt, rounds, toff + done, nsec,
                           XTS256_BATCH / 2, ft);
    for (size_t s = 0; s < nsec; s++) {
      /* Blocks 0 and 1 of the sector: T, T x. */
      __m256i t = _mm256_broadcastsi128_si256 (_mm_load_si128
                                               ((const __m128i *) ft + s));

      t = xts256_mul_xv (t, sv0, rv0, poly, zero);
      for (size_t c = 0; c < ss; c += XTS256_CHUNK, done += XTS256_CHUNK) {
        /* Register i's tweak, blocks 2i and 2i+1, t x^(2i), XORed with
         * the last round key: that register's last round key.
         */
        __m256i twl[8], d[8];

        twl[0] = _mm256_xor_si256 (t, k[rounds]);
#pragma GCC unroll 7
        for (unsigned i = 1; i < 8; i++)
          twl[i] = xts256_mul_x (t, 2 * i, poly, k[rounds]);
        /* in ^ tweak ^ k[0], as in ^ (tweak ^ k[rounds]) ^ k0l. */
#pragma GCC unroll 8
        for (unsigned i = 0; i < 8; i++)
          d[i] = _mm256_xor_si256 (_mm256_xor_si256
                                   (_mm256_loadu_si256 ((const __m256i *)
                                                        (in + done + 32 * i)),
                                    twl[i]), k0l);
        xts256_aes8 (d, k, twl, rounds, enc);
#pragma GCC unroll 8
        for (unsigned i = 0; i < 8; i++)
          _mm256_storeu_si256 ((__m256i *) (out + done + 32 * i), d[i]);
        if (c + XTS256_CHUNK < ss)
          t = xts256_mul_x (t, 16, poly, zero);
      }
    }
  }
  /* Round keys and tweaks: not left in registers (before the calls
   * below: see crypt-xts-vaes.c's xts_clear_vectors), nor on the stack.
   */
  _mm256_zeroall ();
  OPENSSL_cleanse (k, sizeof k);
  OPENSSL_cleanse (kt, sizeof kt);
  OPENSSL_cleanse (&k0l, sizeof k0l);
  OPENSSL_cleanse (ft, sizeof ft);
}

/* One function per direction and key size, so that the rounds are
 * unrolled with constants.
 */
#define XTS256_VARIANT(name, enc, rounds)                               \
  XTS256_TARGET static void                                             \
  name (const struct crypt_xts *x, uint64_t toff,                       \
        const unsigned char *in, unsigned char *out, uint64_t len)      \
  {                                                                     \
    xts256_run (x, (enc), (rounds), toff, in, out, len);                \
  }
XTS256_VARIANT (xts256_enc10, true, 10)
XTS256_VARIANT (xts256_dec10, false, 10)
XTS256_VARIANT (xts256_enc14, true, 14)
XTS256_VARIANT (xts256_dec14, false, 14)
#undef XTS256_VARIANT

void
xts_vaes256_convert (const struct crypt_xts *x, bool enc, uint64_t toff,
                     const char *in, char *out, uint64_t len)
{
  const unsigned char *i = (const unsigned char *) in;
  unsigned char *o = (unsigned char *) out;

  if (x->rounds == 10)
    (enc ? xts256_enc10 : xts256_dec10) (x, toff, i, o, len);
  else
    (enc ? xts256_enc14 : xts256_dec14) (x, toff, i, o, len);
  xts_stack_wipe ();            /* the spilled tweaks and keys */
}

#else /* !XTS_HAVE_VAES */

bool
xts_vaes256_usable (void)
{
  return false;
}

/* Never called: not usable. */
void
xts_vaes256_convert (const struct crypt_xts *x, bool enc, uint64_t toff,
                     const char *in, char *out, uint64_t len)
{
  (void) x, (void) enc, (void) toff, (void) in, (void) out, (void) len;
  abort ();
}

#endif

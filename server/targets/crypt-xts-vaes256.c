/* SPDX-License-Identifier: BSD-3-Clause */
/* AES-XTS with VAES on 256-bit registers (crypt-xts.h): the crypt
 * target's transform on x86-64 CPUs that have VAES, VPCLMULQDQ and AVX2
 * but not AVX-512 (AMD Zen 3, Intel Alder Lake and later client CPUs),
 * where the 512-bit transform (crypt-xts-vaes.c) cannot run and
 * OpenSSL's takes about twice as long (bench/bench-xts).
 *
 * The same one pass as crypt-xts-vaes.c (crypt-xts-vaes-run.h), two AES
 * blocks per instruction: per 256 bytes, 8 registers of 2 blocks, the
 * sectors' first tweaks 16 at a time.  This file has what is the 256-bit
 * width's own.  AVX2 has 16 vector registers and no double shift or
 * ternary logic, so a tweak multiple takes 6 ops (crypt-xts-vaes.c's 4)
 * and the compiler spills some of the round keys and tweaks: they stay
 * secrets there, as in crypt-xts-vaes.c (its header comment): the key
 * arrays are wiped, then the stack the conversion ran on
 * (xts_stack_wipe), and before that every vector register (VZEROALL:
 * ymm0-15 are all this code can use).
 * The round keys are xts_vaes_keys's (crypt-xts-keys.c, AES-NI and
 * SSE2 only, as everything this transform calls); tests/test-unit-crypt.c
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

bool
xts_vaes256_usable (void)
{
  __builtin_cpu_init ();
  /* GCC's and clang's runtimes report AVX2 (and VPCLMULQDQ) only where
   * XGETBV says the OS saves the YMM state; VAES from CPUID alone, so
   * that asking for avx2 is what makes the XCR0 check.
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

/* crypt-xts-vaes-run.h's primitives on 256-bit registers, 2 blocks each. */
#define XV_VEC __m256i
#define XV_BLOCKS 2
#define XV_BATCH 16
#define XV_TARGET XTS256_TARGET
#define XV_(name) xts_vaes256_##name
#define XV_CONVERT xts_vaes256_convert
/* The plain operations, as the intrinsics are named at this width. */
#define xv_load(p) _mm256_loadu_si256 ((const __m256i *) (p))
#define xv_loada(p) _mm256_load_si256 ((const __m256i *) (p))
#define xv_store(p, v) _mm256_storeu_si256 ((__m256i *) (p), (v))
#define xv_zero _mm256_setzero_si256
#define xv_xor _mm256_xor_si256
#define xv_aesenc _mm256_aesenc_epi128
#define xv_aesdec _mm256_aesdec_epi128
#define xv_aesenclast _mm256_aesenclast_epi128
#define xv_aesdeclast _mm256_aesdeclast_epi128
#define XV_INLINE XTS256_TARGET static inline __attribute__ ((always_inline))

XV_INLINE __m256i
xv_bcast (const unsigned char *p)
{
  return _mm256_broadcastsi128_si256 (_mm_loadu_si128 ((const __m128i *) p));
}

XV_INLINE __m256i
xv_xor3 (__m256i a, __m256i b, __m256i c)
{
  return _mm256_xor_si256 (_mm256_xor_si256 (a, b), c);
}

/* xts256_mul_xv needs nothing of t but t. */
XV_INLINE __m256i
xv_swap (__m256i t)
{
  return t;
}

/* One count s for every word.  (Unlike crypt-xts-vaes.c's xts_mul_x,
 * the shifts' immediate forms measured no faster here: bench-xts, 3
 * runs each alternating, 14.1-15.2 against 14.4-14.5 us per 128K.)
 */
XV_INLINE __m256i
xv_mul_x (__m256i t, __m256i ts, unsigned s, __m256i e)
{
  (void) ts;
  return xts256_mul_xv (t, _mm256_set1_epi64x (s),
                        _mm256_set1_epi64x (64 - s),
                        _mm256_set1_epi64x (0x87), e);
}

/* Lane j: T x^j. */
XV_INLINE __m256i
xv_lanes (const unsigned char *T)
{
  const __m256i sv0 = _mm256_set_epi64x (1, 1, 0, 0);
  const __m256i rv0 = _mm256_set_epi64x (63, 63, 64, 64);

  return xts256_mul_xv (xv_bcast (T), sv0, rv0, _mm256_set1_epi64x (0x87),
                        xv_zero ());
}

/* ymm0-15: all that code compiled for AVX2 can use (not zmm16-31). */
XV_INLINE void
xv_clear (void)
{
  _mm256_zeroall ();
}

#include "crypt-xts-vaes-run.h"

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

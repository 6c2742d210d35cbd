/* SPDX-License-Identifier: BSD-3-Clause */
/* AES-XTS with VAES and AVX-512 (crypt-xts.h): the crypt target's
 * transform on x86-64 CPUs that have them, four AES blocks per
 * instruction, the tweaks computed in registers.
 *
 * Why not OpenSSL: OpenSSL 3.0 has no VAES XTS (it came in 3.2), and its
 * AES-NI XTS needs one EVP call per sector to set the IV, which costs as
 * much as the sector's AES; the ECB-batched XTS of crypt-xts.c avoids
 * that call but makes three passes over the data (tweaks out, ECB, tweaks
 * in), as many instructions as the AES itself (callgrind: 1.1 of 2.5
 * instructions per byte).  Here one pass (crypt-xts-vaes-run.h, shared
 * with the 256-bit transform of crypt-xts-vaes256.c): per 512 bytes, 8
 * registers of 4 blocks each, their tweaks derived from the sector's
 * first one in registers, 15 VAES rounds over the 8 (enough independent
 * work to fill the pipeline), the tweak XORed on both sides (folded into
 * the first and last AddRoundKey), the sectors' first tweaks 32 at a
 * time.  This file has what is the 512-bit width's own: the CPU check,
 * the tweak multiplication, clearing the registers.  Where the time goes (Zen 4, where a 512-bit VAES round takes a cycle): of
 * 150-160 cycles per 512 bytes of AES-256, 112 are the AES rounds; the
 * tweak multiplications take most of the rest.  The AES is the CPU's;
 * the key schedule (crypt-xts-keys.c) is the standard AES-NI one
 * (Intel's AES-NI white paper), and tests/test-unit-crypt.c checks every
 * output against OpenSSL's AES-XTS.
 *
 * Keys: the round keys live in the transform (wiped by xts_destroy) and,
 * broadcast, in a stack array of each conversion, wiped when it ends, as
 * are the tweaks.  Those arrays are not all: over 40 live zmm values do not
 * fit in 32 registers, and the compiler spills tweaks (and could spill
 * round keys) to slots of its own that C cannot name; so once a
 * conversion returns, the stack it ran on is overwritten
 * (xts_stack_wipe); and before it returns, every vector register is
 * zeroed (xts_clear_zmm: crypt-xts-keys.c says why), as after the key
 * schedule.  test-unit-crypt looks for leftovers in both.
 */
#include <config.h>

#include <stdlib.h>

#include <openssl/crypto.h>

#include "target.h"
#include "util.h"
#include "crypt-xts.h"

#if XTS_HAVE_VAES

#include <immintrin.h>

#define XTS_VAES_TARGET \
  __attribute__ ((target ("aes,avx512f,avx512vbmi2,vaes,vpclmulqdq")))


/* The CPU's features, and the OS's: GCC's and clang's runtimes report
 * AVX-512F only if OSXSAVE is set and XGETBV says the OS saves the SSE,
 * AVX, opmask and ZMM state (libgcc's get_available_features tests
 * (XCR0 & 0xe6) == 0xe6; compiler-rt's the same bits), so that asking
 * for avx512f is the XCR0 check too.  The instructions used (512-bit
 * forms only, EVEX on zmm) need no AVX512VL or BW.  The functions below are
 * the only ones compiled for these features (target attributes, no
 * -m flag for the file); xts_iv, inlined into them, is also compiled
 * plainly for its other callers.
 */
bool
xts_vaes_usable (void)
{
  __builtin_cpu_init ();
  /* VBMI2 (the double shift, VPSHLDQ) came with VAES in every CPU that
   * has either (Ice Lake, Zen 4 and later).
   */
  return __builtin_cpu_supports ("aes") &&
    __builtin_cpu_supports ("avx512f") &&
    __builtin_cpu_supports ("avx512vbmi2") &&
    __builtin_cpu_supports ("vaes") &&
    __builtin_cpu_supports ("vpclmulqdq");
}

/* --- tweaks -------------------------------------------------------------- */

/* Each 128-bit lane of t times x^s in GF(2^128) (P1619: little-endian,
 * x^128 = x^7 + x^2 + x + 1), 0 <= s <= 32, XORed with e (for free: a
 * ternary op does the last XOR).  The lane shifts left by s as 128 bits:
 * a double shift of each 64-bit word with the lane's other word (ts: t
 * with the words of each lane swapped, one op for all the multiples of
 * one t) gives the high word whole, and the low word shifted with the
 * high word's top s bits, H, in its bottom bits; x^128 folds H back as
 * H * 0x87, H being there already, H * 0x86 is the rest, a carry-less
 * product of under 40 bits, so no second reduction.  The shift counts
 * are per 64-bit word (sv, and rv = 64 - sv), so that one call can also
 * multiply each lane by a power of its own.  4 ops, where the shifts,
 * the carry moved across and the fold with 0x87 took 5, and the XOR of
 * e one more.  (Shifts and XORs alone, H << 1 ^ H << 2 ^ H << 7 for the
 * carry-less product, are 9 ops, and slower: about 14.0 us per 128K, against
 * 11.8; the double shift without VBMI2, 12.6.)
 */
XTS_VAES_TARGET static inline __m512i
xts_mul_xv (__m512i t, __m512i ts, __m512i sv, __m512i rv, __m512i poly,
            __m512i e)
{
  __m512i sh = _mm512_shldv_epi64 (t, ts, sv);  /* t where sv = 0 */
  __m512i h = _mm512_srlv_epi64 (t, rv);        /* 0 where rv = 64 */
  /* The high word's H times 0x86, into the lane's low word. */
  __m512i fold = _mm512_clmulepi64_epi128 (h, poly, 0x01);

  return _mm512_ternarylogic_epi64 (sh, fold, e, 0x96);         /* ^ ^ */
}

/* xts_mul_xv with one count s for every word, in the shifts' immediate
 * forms: given constant count vectors, GCC 12 still emits the variable
 * forms with the counts loaded from memory, 2-3% slower (bench-xts).
 */
XTS_VAES_TARGET static inline __m512i
xts_mul_x (__m512i t, __m512i ts, unsigned s, __m512i poly, __m512i e)
{
  return _mm512_ternarylogic_epi64 (_mm512_shldi_epi64 (t, ts, s),
                                    _mm512_clmulepi64_epi128
                                    (_mm512_srli_epi64 (t, 64 - s), poly,
                                     0x01), e, 0x96);
}

/* Each lane's 64-bit words swapped: the ts of xts_mul_x. */
XTS_VAES_TARGET static inline __m512i
xts_swap_words (__m512i t)
{
  return _mm512_shuffle_epi32 (t, _MM_PERM_BADC);
}

/* --- the cipher ------------------------------------------------------- */

/* crypt-xts-vaes-run.h's primitives on 512-bit registers, 4 blocks each. */
#define XV_VEC __m512i
#define XV_BLOCKS 4
/* In batches of 32 the 8 chains of first tweaks run side by side at the
 * AES units' throughput, and the stalls are 8 times rarer: 11% faster
 * than one register just before its 4 sectors.
 */
#define XV_BATCH 32
#define XV_TARGET XTS_VAES_TARGET
#define XV_(name) xts_vaes_##name
#define XV_CONVERT xts_vaes_convert
/* The plain operations, as the intrinsics are named at this width. */
#define xv_load(p) _mm512_loadu_si512 (p)
#define xv_loada(p) _mm512_load_si512 (p)
#define xv_store(p, v) _mm512_storeu_si512 ((p), (v))
#define xv_zero _mm512_setzero_si512
#define xv_xor _mm512_xor_si512
#define xv_aesenc _mm512_aesenc_epi128
#define xv_aesdec _mm512_aesdec_epi128
#define xv_aesenclast _mm512_aesenclast_epi128
#define xv_aesdeclast _mm512_aesdeclast_epi128
#define XV_INLINE XTS_VAES_TARGET static inline __attribute__ ((always_inline))

XV_INLINE __m512i
xv_bcast (const unsigned char *p)
{
  return _mm512_broadcast_i32x4 (_mm_loadu_si128 ((const __m128i *) p));
}

/* One ternary logic op: the AES units' ports are the loop's bottleneck,
 * and every other vector op there competes for them.
 */
XV_INLINE __m512i
xv_xor3 (__m512i a, __m512i b, __m512i c)
{
  return _mm512_ternarylogic_epi64 (a, b, c, 0x96);
}

XV_INLINE __m512i
xv_swap (__m512i t)
{
  return xts_swap_words (t);
}

XV_INLINE __m512i
xv_mul_x (__m512i t, __m512i ts, unsigned s, __m512i e)
{
  return xts_mul_x (t, ts, s, _mm512_set1_epi64 (0x86), e);
}

/* Lane j: T x^j. */
XV_INLINE __m512i
xv_lanes (const unsigned char *T)
{
  const __m512i sv0 = _mm512_set_epi64 (3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i rv0 = _mm512_set_epi64 (61, 61, 62, 62, 63, 63, 64, 64);
  __m512i t = xv_bcast (T);

  return xts_mul_xv (t, xts_swap_words (t), sv0, rv0,
                     _mm512_set1_epi64 (0x86), xv_zero ());
}

XV_INLINE void
xv_clear (void)
{
  xts_clear_zmm ();
}

#include "crypt-xts-vaes-run.h"

#else /* !XTS_HAVE_VAES */

bool
xts_vaes_usable (void)
{
  return false;
}

/* Never called: not usable. */
void
xts_vaes_convert (const struct crypt_xts *x, bool enc, uint64_t toff,
                  const char *in, char *out, uint64_t len)
{
  (void) x, (void) enc, (void) toff, (void) in, (void) out, (void) len;
  abort ();
}

#endif

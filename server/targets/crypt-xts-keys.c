/* SPDX-License-Identifier: BSD-3-Clause */
/* What the VAES transforms (crypt-xts-vaes.c on 512-bit registers,
 * crypt-xts-vaes256.c on 256-bit ones) share and what must run on every
 * CPU either runs on: the AES-NI key schedule (the standard one, from
 * Intel's AES-NI white paper), and the wipes of what a conversion leaves
 * behind, in vector registers and on the stack (crypt-xts-vaes.c's header
 * comment says why each).  Only AES-NI and SSE2 here, or instructions
 * chosen by what this CPU has: the 512-bit transform's register wipe
 * (zmm16-31) once ran after every key schedule, an undefined instruction
 * on the CPUs the 256-bit transform is for.
 */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "target.h"
#include "util.h"
#include "crypt-xts.h"

#if XTS_HAVE_VAES

#include <immintrin.h>

#define XTS_KEY_TARGET __attribute__ ((target ("aes,sse2")))

/* Zero every vector register: the round keys and tweaks a function
 * leaves in them would stay there (zmm16-31 are seldom used by other
 * code) for as long as the thread lives, past a key wipe, and be saved
 * to the stack by the next lazily bound call (the dynamic linker's
 * resolver saves the whole vector state), where no wipe reaches.  Before
 * any call through the PLT, then (this one is direct, and its callers
 * hold nothing in vector registers across it: the ABI has them all
 * call-clobbered).  VZEROALL clears zmm0-15 whole; zmm16-31 one by one.
 */
#define XTS_Z(n) "vpxord %%zmm" #n ", %%zmm" #n ", %%zmm" #n "\n\t"
__attribute__ ((target ("avx512f"), noinline)) void
xts_clear_zmm (void)
{
  __asm__ volatile ("vzeroall\n\t"
                    XTS_Z (16) XTS_Z (17) XTS_Z (18) XTS_Z (19)
                    XTS_Z (20) XTS_Z (21) XTS_Z (22) XTS_Z (23)
                    XTS_Z (24) XTS_Z (25) XTS_Z (26) XTS_Z (27)
                    XTS_Z (28) XTS_Z (29) XTS_Z (30) XTS_Z (31)
                    ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5",
                    "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
                    "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17",
                    "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23",
                    "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29",
                    "xmm30", "xmm31");
}
#undef XTS_Z

/* The same where there is no AVX-512: VZEROALL clears ymm0-15 whole
 * (what AVX2 code, glibc's memcpy among it, can use); without AVX,
 * xts_clear_xmm (crypt-xts.h) the sixteen that SSE code can use.
 */
__attribute__ ((target ("avx"), noinline)) static void
xts_clear_ymm (void)
{
  __asm__ volatile ("vzeroall" ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4",
                    "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                    "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}

/* Not inlined: the one place that chooses (tests/test-crypt-isa.sh
 * checks that only it reaches xts_clear_zmm, after a CPU check).
 */
__attribute__ ((noinline)) void
xts_clear_vectors (void)
{
  __builtin_cpu_init ();
  if (__builtin_cpu_supports ("avx512f"))
    xts_clear_zmm ();
  else if (__builtin_cpu_supports ("avx"))
    xts_clear_ymm ();
  else
    xts_clear_xmm ();
}

/* --- key schedule (FIPS-197 via AESKEYGENASSIST) ------------------------ */

/* w ^= w << 32 ^ w << 64 ^ w << 96: each word XORed with all before it. */
XTS_KEY_TARGET static inline __m128i
xts_key_prefix (__m128i w)
{
  w = _mm_xor_si128 (w, _mm_slli_si128 (w, 4));
  w = _mm_xor_si128 (w, _mm_slli_si128 (w, 4));
  return _mm_xor_si128 (w, _mm_slli_si128 (w, 4));
}

#define XTS_KEYGEN(w, rcon) _mm_aeskeygenassist_si128 ((w), (rcon))

XTS_KEY_TARGET static void
xts_expand_128 (const unsigned char *key, __m128i *rk)
{
  __m128i k = _mm_loadu_si128 ((const __m128i *) key);

  rk[0] = k;
#define STEP(i, rcon)                                                   \
  k = _mm_xor_si128 (xts_key_prefix (k),                                \
                     _mm_shuffle_epi32 (XTS_KEYGEN (k, rcon), 0xff));   \
  rk[i] = k
  STEP (1, 0x01); STEP (2, 0x02); STEP (3, 0x04); STEP (4, 0x08);
  STEP (5, 0x10); STEP (6, 0x20); STEP (7, 0x40); STEP (8, 0x80);
  STEP (9, 0x1b); STEP (10, 0x36);
#undef STEP
}

XTS_KEY_TARGET static void
xts_expand_256 (const unsigned char *key, __m128i *rk)
{
  __m128i a = _mm_loadu_si128 ((const __m128i *) key);
  __m128i b = _mm_loadu_si128 ((const __m128i *) (key + 16));

  rk[0] = a;
  rk[1] = b;
  /* Even round keys: RotWord+SubWord+rcon of the last word (0xff);
   * odd ones: SubWord alone (0xaa, rcon 0).
   */
#define STEP(i, rcon)                                                   \
  a = _mm_xor_si128 (xts_key_prefix (a),                                \
                     _mm_shuffle_epi32 (XTS_KEYGEN (b, rcon), 0xff));   \
  rk[i] = a;                                                            \
  if ((i) + 1 < 15) {                                                   \
    b = _mm_xor_si128 (xts_key_prefix (b),                              \
                       _mm_shuffle_epi32 (XTS_KEYGEN (a, 0), 0xaa));    \
    rk[(i) + 1] = b;                                                    \
  }
  STEP (2, 0x01); STEP (4, 0x02); STEP (6, 0x04); STEP (8, 0x08);
  STEP (10, 0x10); STEP (12, 0x20); STEP (14, 0x40);
#undef STEP
}

/* The equivalent inverse cipher's keys (FIPS-197 5.3.5), for AESDEC. */
XTS_KEY_TARGET static void
xts_inverse_keys (const __m128i *rk, unsigned rounds, __m128i *dk)
{
  dk[0] = rk[rounds];
  for (unsigned i = 1; i < rounds; i++)
    dk[i] = _mm_aesimc_si128 (rk[rounds - i]);
  dk[rounds] = rk[0];
}

XTS_KEY_TARGET void
xts_vaes_keys (struct crypt_xts *x)
{
  const size_t half = x->key_size / 2;
  __m128i rk[XTS_MAX_ROUNDS + 1], dk[XTS_MAX_ROUNDS + 1];

  x->rounds = half == 16 ? 10 : 14;
  if (half == 16)
    xts_expand_128 (x->key, rk);
  else
    xts_expand_256 (x->key, rk);
  xts_inverse_keys (rk, x->rounds, dk);
  memcpy (x->rk[XTS_RK_ENC], rk, sizeof rk);
  memcpy (x->rk[XTS_RK_DEC], dk, sizeof dk);
  if (half == 16)
    xts_expand_128 (x->key + half, rk);
  else
    xts_expand_256 (x->key + half, rk);
  memcpy (x->rk[XTS_RK_TWEAK], rk, sizeof rk);
  xts_clear_vectors ();         /* memcpy's too */
  OPENSSL_cleanse (rk, sizeof rk);
  OPENSSL_cleanse (dk, sizeof dk);
}

/* Overwrite the stack below the caller's frame, where the function it
 * called last ran: the xts_vaes_* frames (about 3K with GCC 12; twice as
 * much wiped, for other compilers and the sanitizers' redzones), and
 * crypt-xts-vaes256.c's (smaller).  Not inlined, so that buf is a frame
 * of its own at the depth of the one before.
 */
#define XTS_STACK_WIPE 8192
__attribute__ ((noinline)) void
xts_stack_wipe (void)
{
  unsigned char buf[XTS_STACK_WIPE];

  OPENSSL_cleanse (buf, sizeof buf);
}

#else /* !XTS_HAVE_VAES */

/* Never called: no VAES transform is usable. */
void
xts_vaes_keys (struct crypt_xts *x)
{
  (void) x;
  abort ();
}

void
xts_stack_wipe (void)
{
  abort ();
}

void
xts_clear_zmm (void)
{
  abort ();
}

void
xts_clear_vectors (void)
{
  abort ();
}

#endif

/* SPDX-License-Identifier: BSD-3-Clause */
/* The VAES transforms' one pass over the data (crypt-xts.h), written
 * once for both register widths, as Linux's aes-xts-avx-x86_64.S is:
 * crypt-xts-vaes.c includes it for 512-bit registers, crypt-xts-vaes256.c
 * for 256-bit ones, each after defining
 *
 *   XV_VEC          the vector type (__m512i, __m256i)
 *   XV_BLOCKS       AES blocks per register (4, 2)
 *   XV_BATCH        sectors whose first tweaks are computed together
 *   XV_TARGET       the function attribute enabling the instructions
 *   XV_(name)       the name of this width's copy of a function here
 *   XV_CONVERT      the name of its conversion (crypt-xts.h)
 *
 * and these, each a few instructions (always inlined):
 *
 *   xv_bcast (p)             16 bytes at p in every lane
 *   xv_load (p), xv_store (p, v)    unaligned; xv_loada (p) aligned
 *   xv_xor (a, b), xv_xor3 (a, b, c)
 *   xv_aesenc, xv_aesdec, xv_aesenclast, xv_aesdeclast (d, k)
 *   xv_swap (t)              what xv_mul_x needs of t besides t (its
 *                            words swapped, or t)
 *   xv_mul_x (t, ts, s, e)   each lane of t times x^s, 1 <= s <= 32,
 *                            XORed with e
 *   xv_lanes (T)             the first register of a sector: lane j its
 *                            first tweak T (16 bytes) times x^j
 *   xv_zero (), xv_clear ()  a zero; every vector register it may use zeroed
 *
 * Per XV_CHUNK bytes (8 registers of XV_BLOCKS blocks): register i's
 * tweaks derived from the chunk's first register t as t x^(XV_BLOCKS i),
 * independent of each other (no chain of dependent multiplications);
 * 8 registers through the AES rounds side by side (enough independent
 * work to fill the pipeline); the tweak XORed on both sides, folded
 * into the first AddRoundKey (in ^ (tweak ^ k[last]) ^ (k[0] ^ k[last]))
 * and the last (AESENCLAST with k[last] ^ tweak).  The sectors' first
 * tweaks, E_K2 (IV), XV_BATCH at a time: one register per sector group
 * just before its sectors was a chain of 15 dependent AES rounds that
 * the sectors' own work could not overlap, and a store-forwarding stall
 * (IVs stored as words, loaded as one register): 18% of the 512-bit
 * transform's time (bench-xts, 128K, against constant tweaks).
 *
 * Round keys (broadcast) and tweaks are secrets: the arrays holding them
 * are wiped, every vector register zeroed before the calls that wipe
 * them (crypt-xts-keys.c's xts_clear_zmm says why), and the caller
 * overwrites the stack where the compiler spilled others
 * (xts_stack_wipe).
 */

#define XV_CHUNK (8 * (int) sizeof (XV_VEC))   /* bytes per 8 registers */

/* ROUNDS (10 or 14, a constant where this is inlined) of AES over 8
 * registers, k the round keys (encryption or inverse), after the first
 * AddRoundKey, which the caller has done, and with kl[i] as register
 * i's last round key (k[rounds] ^ its tweak).
 */
XV_TARGET static inline __attribute__ ((always_inline)) void
XV_(aes8) (XV_VEC *d, const XV_VEC *k, const XV_VEC *kl, unsigned rounds,
           bool enc)
{
#pragma GCC unroll 14
  for (unsigned r = 1; r < rounds; r++)
#pragma GCC unroll 8
    for (unsigned i = 0; i < 8; i++)
      d[i] = enc ? xv_aesenc (d[i], k[r]) : xv_aesdec (d[i], k[r]);
#pragma GCC unroll 8
  for (unsigned i = 0; i < 8; i++)
    d[i] = enc ? xv_aesenclast (d[i], kl[i]) : xv_aesdeclast (d[i], kl[i]);
}

/* The first tweaks of sectors toff, toff + ss, ... (nreg registers, a
 * constant where this is inlined: XV_BLOCKS * nreg sectors, those past
 * nsec computed for sector 0 again), into ft (XV_BLOCKS * nreg of 16
 * bytes).
 */
XV_TARGET static inline __attribute__ ((always_inline)) void
XV_(first_tweaks) (const struct crypt_xts *x, const XV_VEC *kt,
                   unsigned rounds, uint64_t toff, size_t nsec,
                   unsigned nreg, XV_VEC *ft)
{
  unsigned char iv[XV_BATCH][XTS_IV_SIZE]
    __attribute__ ((aligned (sizeof (XV_VEC))));

  for (size_t k = 0; k < XV_BLOCKS * nreg; k++)
    xts_iv (x, toff + (k < nsec ? k : 0) * x->sector_size, iv[k]);
#pragma GCC unroll 8
  for (unsigned i = 0; i < nreg; i++)
    ft[i] = xv_xor (xv_loada (iv[XV_BLOCKS * i]), kt[0]);
#pragma GCC unroll 14
  for (unsigned r = 1; r < rounds; r++)
#pragma GCC unroll 8
    for (unsigned i = 0; i < nreg; i++)
      ft[i] = xv_aesenc (ft[i], kt[r]);
#pragma GCC unroll 8
  for (unsigned i = 0; i < nreg; i++)
    ft[i] = xv_aesenclast (ft[i], kt[rounds]);
}

XV_TARGET static inline __attribute__ ((always_inline)) void
XV_(run) (const struct crypt_xts *x, bool enc, unsigned rounds,
          uint64_t toff, const unsigned char *in, unsigned char *out,
          uint64_t len)
{
  const size_t ss = x->sector_size;
  XV_VEC k[XTS_MAX_ROUNDS + 1], kt[XTS_MAX_ROUNDS + 1];
  XV_VEC k0l;                   /* k[0] ^ k[rounds] */
  XV_VEC ft[XV_BATCH / XV_BLOCKS];      /* the batch's first tweaks */
  const XV_VEC zero = xv_zero ();

  for (unsigned r = 0; r <= rounds; r++) {
    k[r] = xv_bcast (x->rk[enc ? XTS_RK_ENC : XTS_RK_DEC][r]);
    kt[r] = xv_bcast (x->rk[XTS_RK_TWEAK][r]);
  }
  k0l = xv_xor (k[0], k[rounds]);
  for (uint64_t done = 0; done < len; ) {
    size_t nsec = MIN ((len - done) / ss, XV_BATCH);

    /* Only as many registers as the sectors need, in three sizes: a
     * 4K request (8 sectors of 512 bytes) does not pay for XV_BATCH.
     */
    if (nsec <= XV_BLOCKS)
      XV_(first_tweaks) (x, kt, rounds, toff + done, nsec, 1, ft);
    else if (nsec <= 8)
      XV_(first_tweaks) (x, kt, rounds, toff + done, nsec, 8 / XV_BLOCKS,
                         ft);
    else
      XV_(first_tweaks) (x, kt, rounds, toff + done, nsec,
                         XV_BATCH / XV_BLOCKS, ft);
    for (size_t s = 0; s < nsec; s++) {
      XV_VEC t = xv_lanes ((const unsigned char *) ft + 16 * s);

      for (size_t c = 0; c < ss; c += XV_CHUNK, done += XV_CHUNK) {
        const XV_VEC ts = xv_swap (t);
        /* Register i's tweak XORed with the last round key, which makes
         * it that register's last round key (aes8).
         */
        XV_VEC twl[8], d[8];

        twl[0] = xv_xor (t, k[rounds]);
#pragma GCC unroll 7
        for (unsigned i = 1; i < 8; i++)
          twl[i] = xv_mul_x (t, ts, XV_BLOCKS * i, k[rounds]);
#pragma GCC unroll 8
        for (unsigned i = 0; i < 8; i++)
          d[i] = xv_xor3 (xv_load (in + done + sizeof (XV_VEC) * i), twl[i],
                          k0l);
        XV_(aes8) (d, k, twl, rounds, enc);
#pragma GCC unroll 8
        for (unsigned i = 0; i < 8; i++)
          xv_store (out + done + sizeof (XV_VEC) * i, d[i]);
        if (c + XV_CHUNK < ss)          /* the next chunk's first tweak */
          t = xv_mul_x (t, ts, 8 * XV_BLOCKS, zero);
      }
    }
  }
  /* Round keys and tweaks: not left in registers, nor on the stack. */
  xv_clear ();
  OPENSSL_cleanse (k, sizeof k);
  OPENSSL_cleanse (kt, sizeof kt);
  OPENSSL_cleanse (&k0l, sizeof k0l);
  OPENSSL_cleanse (ft, sizeof ft);
}

/* One function per direction and key size, so that the rounds are
 * unrolled with constants.
 */
#define XV_VARIANT(name, enc, rounds)                                   \
  XV_TARGET static void                                                 \
  XV_(name) (const struct crypt_xts *x, uint64_t toff,                  \
             const unsigned char *in, unsigned char *out, uint64_t len) \
  {                                                                     \
    XV_(run) (x, (enc), (rounds), toff, in, out, len);                  \
  }
XV_VARIANT (enc10, true, 10)
XV_VARIANT (dec10, false, 10)
XV_VARIANT (enc14, true, 14)
XV_VARIANT (dec14, false, 14)
#undef XV_VARIANT

void
XV_CONVERT (const struct crypt_xts *x, bool enc, uint64_t toff,
            const char *in, char *out, uint64_t len)
{
  const unsigned char *i = (const unsigned char *) in;
  unsigned char *o = (unsigned char *) out;

  if (x->rounds == 10)
    (enc ? XV_(enc10) : XV_(dec10)) (x, toff, i, o, len);
  else
    (enc ? XV_(enc14) : XV_(dec14)) (x, toff, i, o, len);
  xts_stack_wipe ();            /* the spilled tweaks and keys */
}

#undef XV_CHUNK

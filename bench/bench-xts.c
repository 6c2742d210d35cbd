/* SPDX-License-Identifier: BSD-3-Clause */
/* bench-xts: the crypt target's transform alone (crypt-xts.c), without
 * nbdkit, fio or I/O: CPU time per request of xts_convert on the VAES
 * transforms (where the CPU has them: 512-bit registers, and 256-bit
 * ones, what CPUs without AVX-512 run) and on the OpenSSL one (the
 * batched AES-ECB XTS, as before crypt-xts-vaes.c), and OpenSSL's own AES-XTS
 * two ways: one EVP call per sector, each setting its IV (what a user of
 * OpenSSL encrypting sectors writes, and what the OpenSSL transform does
 * for sectors of 2048 bytes and more), and one call per request for
 * scale (no per-sector IV: what AES-XTS costs at best through OpenSSL
 * 3.0, but not sector encryption).
 *
 *   bench-xts [-s REQUEST_BYTES] [-n REQUESTS] [-r ROUNDS] [-k 32|64]
 *             [-S SECTOR_SIZE]
 *
 * Defaults: 131072-byte requests (bench-crypt's 128K), 2000 requests per
 * round, 7 rounds alternating the transforms, AES-256 (a 64-byte key),
 * 512-byte sectors; decryption in place, as a read does.  CPU time is
 * CLOCK_THREAD_CPUTIME_ID, which preemption by other load does not
 * count; medians are printed, in microseconds per request and GB/s.
 *
 * Built by "make check" (never run by it): make -C bench bench-xts.
 */
#include <config.h>

#include <endian.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "internal.h"
#include "targets/crypt-xts.h"

static size_t req = 131072, key_size = 64, sector = 512;
static long requests = 2000;

static uint64_t
cpu_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static struct crypt_xts *
xts_make (bool openssl, bool vaes256)
{
  struct crypt_xts *x = calloc (1, sizeof *x);
  struct mapper_err err = { "" };

  if (x == NULL)
    abort ();
  for (size_t i = 0; i < key_size; i++)
    x->key[i] = i * 7 + 1;
  x->key_size = key_size;
  x->sector_size = sector;
  x->iv_mode = XTS_IV_PLAIN64;
  mapper_crypt_openssl = openssl;
  mapper_crypt_vaes256 = vaes256;
  if (xts_init (x, &err) < 0) {
    fprintf (stderr, "bench-xts: xts_init: %s\n", err.msg);
    exit (1);
  }
  return x;
}

/* us per request of xts_convert (decrypt in place). */
static double
run_xts (struct crypt_xts *x, char *buf)
{
  uint64_t t0 = cpu_ns ();

  for (long i = 0; i < requests; i++)
    if (xts_convert (x, false, (uint64_t) i * req, buf, buf, req) < 0)
      abort ();
  return (cpu_ns () - t0) / 1e3 / requests;
}

/* us per request of EVP AES-XTS over the whole request: one call per
 * sector, each with its sector's plain64 IV (per_sector), or one call.
 */
static double
run_evp (char *buf, bool per_sector)
{
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new ();
  unsigned char key[64], iv[16] = { 0 };
  uint64_t t0;
  int outl;

  for (size_t i = 0; i < key_size; i++)
    key[i] = i * 7 + 1;
  if (ctx == NULL ||
      EVP_CipherInit_ex (ctx, key_size == 32 ? EVP_aes_128_xts ()
                         : EVP_aes_256_xts (), NULL, key, iv, 0) != 1)
    abort ();
  t0 = cpu_ns ();
  for (long i = 0; i < requests; i++)
    if (per_sector)
      for (size_t done = 0; done < req; done += sector) {
        uint64_t n = htole64 (((uint64_t) i * req + done) / 512);

        memcpy (iv, &n, sizeof n);
        if (EVP_CipherInit_ex2 (ctx, NULL, NULL, iv, 0, NULL) != 1 ||
            EVP_CipherUpdate (ctx, (unsigned char *) buf + done, &outl,
                              (unsigned char *) buf + done, sector) != 1)
          abort ();
      }
    else if (EVP_CipherUpdate (ctx, (unsigned char *) buf, &outl,
                               (unsigned char *) buf, req) != 1)
      abort ();
  t0 = cpu_ns () - t0;
  EVP_CIPHER_CTX_free (ctx);
  return t0 / 1e3 / requests;
}

static int
cmp (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;

  return (x > y) - (x < y);
}

int
main (int argc, char *argv[])
{
  int rounds = 7, c;
  char *buf;
  struct crypt_xts *xv = NULL, *xv256 = NULL, *xo;
  bool vaes = xts_vaes_usable (), vaes256 = xts_vaes256_usable ();
  double t[5][64];
  const char *name[5] = { "crypt, VAES transform",
                          "crypt, VAES-256 transform",
                          "crypt, OpenSSL transform",
                          "OpenSSL EVP AES-XTS, per sector",
                          "OpenSSL EVP AES-XTS, one call" };

  while ((c = getopt (argc, argv, "s:n:r:k:S:")) != -1)
    switch (c) {
    case 's': req = strtoul (optarg, NULL, 0); break;
    case 'n': requests = strtol (optarg, NULL, 0); break;
    case 'r': rounds = atoi (optarg); break;
    case 'k': key_size = strtoul (optarg, NULL, 0); break;
    case 'S': sector = strtoul (optarg, NULL, 0); break;
    default:
      fprintf (stderr, "usage: bench-xts [-s BYTES] [-n REQUESTS] "
               "[-r ROUNDS] [-k 32|64] [-S SECTOR]\n");
      return 2;
    }
  if (rounds < 1 || rounds > 64 || req == 0 || req % sector ||
      (key_size != 32 && key_size != 64)) {
    fprintf (stderr, "bench-xts: bad arguments\n");
    return 2;
  }
  buf = aligned_alloc (4096, req);
  if (buf == NULL)
    abort ();
  memset (buf, 0x5a, req);
  if (vaes)
    xv = xts_make (false, false);
  if (vaes256)
    xv256 = xts_make (false, true);
  xo = xts_make (true, false);
  printf ("bench-xts: %zu-byte requests, AES-%zu-XTS, %zu-byte sectors, "
          "%ld requests x %d rounds; VAES %s, VAES-256 %s\n", req,
          key_size * 4, sector, requests, rounds,
          vaes ? "available" : "not available",
          vaes256 ? "available" : "not available");
  for (int r = 0; r < rounds; r++) {
    t[0][r] = vaes ? run_xts (xv, buf) : 0;
    t[1][r] = vaes256 ? run_xts (xv256, buf) : 0;
    t[2][r] = run_xts (xo, buf);
    t[3][r] = run_evp (buf, true);
    t[4][r] = run_evp (buf, false);
  }
  for (int k = 0; k < 5; k++) {
    double m;

    if ((k == 0 && !vaes) || (k == 1 && !vaes256))
      continue;
    qsort (t[k], rounds, sizeof t[k][0], cmp);
    m = t[k][rounds / 2];
    printf ("%-32s %8.2f us per request %7.2f GB/s\n", name[k], m,
            req / m / 1e3);
    printf ("RESULT|xts %zuK: %s, us/request|-|%.2f|-|-|-\n", req / 1024,
            name[k], m);
  }
  if (xv) {
    xts_destroy (xv);
    free (xv);
  }
  if (xv256) {
    xts_destroy (xv256);
    free (xv256);
  }
  xts_destroy (xo);
  free (xo);
  free (buf);
  return 0;
}

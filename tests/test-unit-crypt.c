/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: the crypt target.  Every malformed table refused with its
 * message (odd-length key, wrong key length for the cipher, unknown
 * cipher or IV mode, sector_size not a power of two in 512..4096, offsets
 * not aligned to it, wrong option counts...); status round trips; and the
 * data paths: whatever is written reads back, at every alignment, for
 * every sector size; partial sectors are read-modify-written without
 * touching their neighbours, also under concurrent writers of different
 * bytes of one sector; zero writes encrypted zeros (not a hole); trim only
 * with allow_discards and only whole sectors; extents say data; and the
 * per-thread bounce buffers nest.  The bytes on disk are what OpenSSL's
 * own AES-XTS makes of each sector, one call per sector with the IV
 * computed here, both ways, for every key size, IV mode and sector size,
 * over requests of many lengths.  The transform alone (crypt-xts.c, no
 * device, no I/O) against the same reference, in place and not, from
 * every kind of offset, also when every context slot is taken, and its
 * refusals, and that it leaves no round key or tweak on the stack or in
 * the vector registers.  That
 * the bytes are what Linux writes is checked against an
 * independent implementation in test-crypt.sh.  dm-crypt's messages
 * (key wipe, key set) and the resume they block.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "internal.h"
#include "targets/crypt-xts.h"
#include "unit.h"
#include "unit-targets.h"

#define S 512ULL
#define FILE_SECTORS 2048               /* 1 MiB */

#define KEY256 "000102030405060708090a0b0c0d0e0f" \
               "f0e0d0c0b0a090807060504030201000"
#define KEY512 "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f" \
               "1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100"

static char *A, *B;
static int dev_nr;

static void
setup (void)
{
  unit_write_file (unit_path ("a"), NULL, FILE_SECTORS * S);
  unit_write_file (unit_path ("b"), NULL, FILE_SECTORS * S);
  A = realpath (unit_path ("a"), NULL);
  B = realpath (unit_path ("b"), NULL);
  if (!A || !B)
    UNIT_FATAL ("realpath: %s", strerror (errno));
}

static void
test_bad_tables (void)
{
  const char *c = "aes-xts-plain64";

  UNIT_FAIL (EINVAL, 1, "crypt", "expected <cipher> <key> <iv_offset> <dev> "
             "<offset>", "got 0 arguments", "0 8 crypt\n");
  UNIT_FAIL (EINVAL, 1, "crypt", "got 4 arguments", NULL,
             "0 8 crypt %s %s 0 %s\n", c, KEY512, A);

  /* Keys. */
  UNIT_FAIL (EINVAL, 1, "crypt", "odd number of hex digits (63)", NULL,
             "0 8 crypt %s %.63s 0 %s 0\n", c, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "odd number of hex digits (1)", NULL,
             "0 8 crypt %s 0 0 %s 0\n", c, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "key is not hexadecimal (character 3)", NULL,
             "0 8 crypt %s 00g1%.60s 0 %s 0\n", c, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "key of 384 bits is not valid for aes-xts",
             "256 bits for AES-128-XTS or 512 bits for AES-256-XTS",
             "0 8 crypt %s %.96s 0 %s 0\n", c, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "key of 128 bits is not valid", NULL,
             "0 8 crypt %s %.32s 0 %s 0\n", c, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "key of 1024 bits is too long", NULL,
             "0 8 crypt %s %s%s 0 %s 0\n", c, KEY512, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "no key", NULL, "0 8 crypt %s - 0 %s 0\n",
             c, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "kernel keyring keys", NULL,
             "0 8 crypt %s :64:logon:cryptsetup:x 0 %s 0\n", c, A);
  /* OpenSSL refuses XTS keys whose two halves are equal. */
  UNIT_FAIL (EINVAL, 1, "crypt", "key refused by OpenSSL", "identical",
             "0 8 crypt %s %.32s%.32s 0 %s 0\n", c, KEY512, KEY512, A);
  /* Also for AES-256-XTS, and for sectors done by OpenSSL's XTS rather
   * than batched from ECB (which would take such a key).
   */
  UNIT_FAIL (EINVAL, 1, "crypt", "key refused by OpenSSL AES-256-XTS",
             "identical", "0 8 crypt %s %.64s%.64s 0 %s 0\n", c, KEY512,
             KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "key refused by OpenSSL AES-128-XTS",
             "identical",
             "0 8 crypt %s %.32s%.32s 0 %s 0 1 sector_size:4096\n",
             c, KEY512, KEY512, A);

  /* Ciphers and IV modes. */
  UNIT_FAIL (EINVAL, 1, "crypt", "unknown cipher 'serpent'", NULL,
             "0 8 crypt serpent-xts-plain64 %s 0 %s 0\n", KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "chain mode 'cbc' is not supported", NULL,
             "0 8 crypt aes-cbc-essiv:sha256 %s 0 %s 0\n", KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "chain mode 'cbc'", NULL,
             "0 8 crypt aes %s 0 %s 0\n", KEY256, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "IV mode required", NULL,
             "0 8 crypt aes-xts %s 0 %s 0\n", KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "unknown IV mode 'essiv'", NULL,
             "0 8 crypt aes-xts-essiv:sha256 %s 0 %s 0\n", KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "unknown IV mode 'benbi'", NULL,
             "0 8 crypt aes-xts-benbi %s 0 %s 0\n", KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "IV mode plain64 takes no options", NULL,
             "0 8 crypt aes-xts-plain64:sha256 %s 0 %s 0\n", KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "key count '2' is not supported", NULL,
             "0 8 crypt aes:2-xts-plain64 %s 0 %s 0\n", KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "cipher 'cbc(aes)' is not supported", NULL,
             "0 8 crypt capi:cbc(aes)-plain64 %s 0 %s 0\n", KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "IV mode missing", NULL,
             "0 8 crypt capi:xts(aes) %s 0 %s 0\n", KEY512, A);

  /* Optional parameters. */
  UNIT_FAIL (EINVAL, 1, "crypt", "invalid number of optional parameters 'x'",
             NULL, "0 8 crypt %s %s 0 %s 0 x\n", c, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "invalid number of optional parameters '9'",
             NULL, "0 8 crypt %s %s 0 %s 0 9 %s\n", c, KEY512, A,
             "a a a a a a a a a");
  UNIT_FAIL (EINVAL, 1, "crypt", "2 optional parameters declared but 1 given",
             NULL, "0 8 crypt %s %s 0 %s 0 2 allow_discards\n", c, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "1 optional parameter declared but 2 given",
             NULL,
             "0 8 crypt %s %s 0 %s 0 1 allow_discards iv_large_sectors\n",
             c, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "unknown optional parameter 'discard'", NULL,
             "0 8 crypt %s %s 0 %s 0 1 discard\n", c, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "'integrity:28:aead' is not supported", NULL,
             "0 8 crypt %s %s 0 %s 0 1 integrity:28:aead\n", c, KEY512, A);
  {
    static const char *bad_ss[] = { "1000", "256", "0", "8192", "511",
                                    "1536", "x", "", "4096x", "-512" };
    for (size_t i = 0; i < ARRAY_SIZE (bad_ss); i++) {
      char want[64];
      snprintf (want, sizeof want, "invalid sector_size '%s'", bad_ss[i]);
      UNIT_FAIL (EINVAL, 1, "crypt", want, "power of two from 512 to 4096",
                 "0 64 crypt %s %s 0 %s 0 1 sector_size:%s\n", c, KEY512, A,
                 bad_ss[i]);
    }
  }
  UNIT_FAIL (EINVAL, 1, "crypt", "target length 9 sectors is not a multiple "
             "of sector_size 4096", NULL,
             "0 9 crypt %s %s 0 %s 0 1 sector_size:4096\n", c, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "target length 3 sectors", NULL,
             "0 3 crypt %s %s 0 %s 0 1 sector_size:1024\n", c, KEY512, A);

  /* iv_offset and the device offset, aligned to sector_size. */
  UNIT_FAIL (EINVAL, 1, "crypt", "iv_offset 'x'", NULL,
             "0 8 crypt %s %s x %s 0\n", c, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "iv_offset '-1'", NULL,
             "0 8 crypt %s %s -1 %s 0\n", c, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "iv_offset 3 is not a multiple of "
             "sector_size 4096 (8 sectors)", NULL,
             "0 8 crypt %s %s 3 %s 0 1 sector_size:4096\n", c, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "iv_offset 2 is not a multiple", NULL,
             "0 8 crypt %s %s 2 %s 0 2 iv_large_sectors sector_size:2048\n", c,
             KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "offset 'y'", NULL,
             "0 8 crypt %s %s 0 %s y\n", c, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "offset 1 is not a multiple of sector_size "
             "4096 (8 sectors)", NULL,
             "0 8 crypt %s %s 0 %s 1 1 sector_size:4096\n", c, KEY512, A);
  UNIT_FAIL (EINVAL, 1, "crypt", "offset 4 is not a multiple of sector_size "
             "4096", NULL, "0 8 crypt %s %s 8 %s 4 1 sector_size:4096\n", c,
             KEY512, A);

  /* The device. */
  UNIT_FAIL (ENOENT, 1, "crypt", "nonexistent", NULL,
             "0 8 crypt %s %s 0 %s/nonexistent 0\n", c, KEY512,
             unit_tmpdir ());
  UNIT_FAIL (EINVAL, 1, "crypt", "beyond the end", NULL,
             "0 16 crypt %s %s 0 %s %d\n", c, KEY512, A, FILE_SECTORS - 8);
  /* A later line: the earlier crypt targets are freed. */
  UNIT_FAIL (EINVAL, 2, "crypt", "odd number", NULL,
             "0 8 crypt %s %s 0 %s 0\n8 8 crypt %s 123 0 %s 8\n", c, KEY512, A,
             c, A);
}

static void
test_format (void)
{
  static const struct { const char *in, *out; } cases[] = {
    { "aes-xts-plain64 " KEY512 " 0 %s 0", NULL },
    { "aes-xts-plain " KEY256 " 7 %s 16", NULL },
    { "aes-xts-plain64be " KEY256 " 0 %s 0", NULL },
    { "capi:xts(aes)-plain64 " KEY512 " 0 %s 0", NULL },
    { "aes:1-xts-plain64 " KEY512 " 0 %s 0", NULL },
    /* Uppercase hex prints lowercase; options in dm's order. */
    { "aes-xts-plain64 000102030405060708090A0B0C0D0E0F"
      "F0E0D0C0B0A090807060504030201000 0 %s 0",
      "aes-xts-plain64 " KEY256 " 0 %s 0" },
    { "aes-xts-plain64 " KEY512 " 16 %s 8 3 iv_large_sectors SECTOR_SIZE:4096 "
      "allow_discards",
      "aes-xts-plain64 " KEY512 " 16 %s 8 3 allow_discards sector_size:4096 "
      "iv_large_sectors" },
    { "aes-xts-plain64 " KEY512 " 0 %s 0 0", "aes-xts-plain64 " KEY512
      " 0 %s 0" },
    { "aes-xts-plain64 " KEY512 " 0 %s 0 1 sector_size:512",
      "aes-xts-plain64 " KEY512 " 0 %s 0" },
    { "aes-xts-plain64 " KEY512 " 0 %s 0 5 no_write_workqueue "
      "no_read_workqueue submit_from_crypt_cpus same_cpu_crypt allow_discards",
      "aes-xts-plain64 " KEY512 " 0 %s 0 5 allow_discards same_cpu_crypt "
      "submit_from_crypt_cpus no_read_workqueue no_write_workqueue" },
  };

  for (size_t i = 0; i < ARRAY_SIZE (cases); i++) {
    char *in = unit_sprintf (cases[i].in, A);
    char *out = unit_sprintf (cases[i].out ? cases[i].out : cases[i].in, A);
    char *text = unit_sprintf ("0 64 crypt %s\n", in);
    char *want = unit_sprintf ("0 64 crypt %s\n", out);

    unit_check_roundtrip (text, want);
    free (in);
    free (out);
    free (text);
    free (want);
  }
}

/* --- data ---------------------------------------------------------------- */

/* A device: one crypt target of 1000 sectors over A at sector 8 (aligned
 * to every sector size), then 24 linear sectors over B.
 */
static struct device *
crypt_dev (const char *cipher, const char *key, const char *opts)
{
  char name[32];

  unit_write_file (A, NULL, FILE_SECTORS * S);
  unit_write_file (B, NULL, FILE_SECTORS * S);
  snprintf (name, sizeof name, "c%d", dev_nr++);
  return unit_device (name, unit_parse ("0 1024 crypt %s %s 64 %s 8 %s\n"
                                        "1024 24 linear %s 0\n",
                                        cipher, key, A, opts, B));
}

/* Random-ish writes at every alignment against a model of the device;
 * then everything reads back, and the backing file holds ciphertext
 * (nothing of the plaintext).
 */
static void
test_roundtrip (const char *cipher, const char *key, const char *opts)
{
  const size_t size = 1048 * S;
  unsigned char *model = calloc (1, size), *buf = malloc (size);
  unsigned char *disk;
  struct device *dev = crypt_dev (cipher, key, opts);
  static const uint64_t offs[] = { 0, 1, 511, 512, 513, 1023, 4095, 4096,
                                   4097, 8191, 12345, 1000 * S - 4097,
                                   1024 * S - 1, 1024 * S - 4096 };
  static const uint64_t lens[] = { 1, 2, 15, 16, 17, 511, 512, 513, 4095,
                                   4096, 4097, 8192, 12289, 65536 + 7 };
  uint64_t seed = 100;

  if (model == NULL || buf == NULL)
    UNIT_FATAL ("out of memory");
  /* Reads of fresh (all zero) ciphertext are whatever it decrypts to:
   * make the model right by reading it first.
   */
  CHECK (device_pread (dev, model, size, 0, 0) == 0);
  for (size_t i = 0; i < ARRAY_SIZE (offs); i++)
    for (size_t j = 0; j < ARRAY_SIZE (lens); j++) {
      uint64_t off = offs[i], len = MIN (lens[j], size - off);
      uint32_t flags = (i + j) % 5 == 0 ? MAPPER_FUA : 0;

      unit_fill (buf, len, seed++, 0);
      if (device_pwrite (dev, buf, len, off, flags) != 0) {
        CHECKF (false, "write %" PRIu64 "+%" PRIu64, off, len);
        continue;
      }
      memcpy (model + off, buf, len);
      /* Read a window around it: neighbours untouched. */
      {
        uint64_t a = off > 5000 ? off - 5000 : 0;
        uint64_t b = MIN (size, off + len + 5000);
        CHECK (device_pread (dev, buf, b - a, a, 0) == 0);
        CHECKF (memcmp (buf, model + a, b - a) == 0,
                "%s %s: after write %" PRIu64 "+%" PRIu64 " differs at %ld",
                cipher, opts, off, len,
                (long) a + unit_first_diff (buf, model + a, b - a));
      }
    }
  /* Whole device, and odd-sized reads everywhere. */
  CHECK (device_pread (dev, buf, size, 0, 0) == 0);
  CHECK (memcmp (buf, model, size) == 0);
  for (uint64_t off = 0; off + 777 < size; off += 4093) {
    CHECK (device_pread (dev, buf, 777, off, 0) == 0);
    CHECK (memcmp (buf, model + off, 777) == 0);
  }
  CHECK (device_flush (dev, 0) == 0);
  /* The linear part is plaintext, the crypt part is not. */
  disk = unit_read_at (B, 0, 24 * S);
  CHECK (memcmp (disk, model + 1024 * S, 24 * S) == 0);
  free (disk);
  disk = unit_read_at (A, 8 * S, 1024 * S);
  for (uint64_t off = 0; off < 1024 * S; off += 512)
    CHECKF (memcmp (disk + off, model + off, 16) != 0,
            "plaintext on disk at %" PRIu64, off);
  free (disk);
  /* Sectors outside the target untouched. */
  disk = unit_read_at (A, 0, 8 * S);
  CHECK (unit_is_zero (disk, 8 * S));
  free (disk);
  disk = unit_read_at (A, 1032 * S, (FILE_SECTORS - 1032) * S);
  CHECK (unit_is_zero (disk, (FILE_SECTORS - 1032) * S));
  free (disk);
  device_destroy (dev);
  free (model);
  free (buf);
}

struct ext { uint64_t off, len; uint32_t type; };

static int
first_extent (void *opaque, uint64_t off, uint64_t len, uint32_t type)
{
  struct ext *x = opaque;

  if (x->type == 99)
    *x = (struct ext) { off, len, type };
  return 0;
}

/* --- against OpenSSL's XTS ----------------------------------------------- */

static void
write_at (const char *path, uint64_t off, const void *buf, size_t len)
{
  int fd = open (path, O_WRONLY | O_CLOEXEC);

  if (fd == -1 || pwrite (fd, buf, len, off) != (ssize_t) len)
    UNIT_FATAL ("write %s: %s", path, strerror (errno));
  close (fd);
}

/* dm-crypt's IV for the sector of ss bytes at byte toff of the target,
 * computed here from the rules (not by the code under test).
 */
static void
xts_ref_iv (const char *mode, uint64_t iv_offset, uint64_t ss, bool large,
            uint64_t toff, unsigned char iv[16])
{
  uint64_t n = toff / S + iv_offset;

  if (large)
    n /= ss / S;
  memset (iv, 0, 16);
  if (strcmp (mode, "plain") == 0)
    n &= 0xffffffff;
  for (int i = 0; i < 8; i++) {
    if (strcmp (mode, "plain64be") == 0)
      iv[15 - i] = n >> (8 * i);
    else
      iv[i] = n >> (8 * i);
  }
}

/* in -> out (len bytes, whole sectors of the target from toff) with
 * OpenSSL's AES-XTS, one EVP call per sector.
 */
static void
xts_ref (bool enc, const unsigned char *key, size_t key_len,
         const char *mode, uint64_t iv_offset, uint64_t ss, bool large,
         uint64_t toff, const unsigned char *in, unsigned char *out,
         size_t len)
{
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new ();
  const EVP_CIPHER *xts = key_len == 32 ? EVP_aes_128_xts ()
    : EVP_aes_256_xts ();

  if (ctx == NULL)
    UNIT_FATAL ("out of memory");
  for (size_t done = 0; done < len; done += ss) {
    unsigned char iv[16];
    int outl;

    xts_ref_iv (mode, iv_offset, ss, large, toff + done, iv);
    if (EVP_CipherInit_ex (ctx, xts, NULL, key, iv, enc) != 1 ||
        EVP_CipherUpdate (ctx, out + done, &outl, in + done, ss) != 1 ||
        outl != (int) ss)
      UNIT_FATAL ("OpenSSL AES-XTS failed");
  }
  EVP_CIPHER_CTX_free (ctx);
}

/* A crypt target of 1024 sectors over A at sector 8: random plaintext
 * written through it in requests of many lengths (one sector, a few,
 * around 16K and 64K, odd counts, unaligned pieces) must land on A as
 * OpenSSL's XTS encrypts it; random ciphertext put on A must read back
 * through it, also in pieces of many lengths, as OpenSSL decrypts it.
 */
static void
test_vs_openssl_xts (const char *mode, size_t key_len, uint64_t ss,
                     bool large, uint64_t iv_offset, uint64_t seed)
{
  const size_t size = 1024 * S;
  static const uint64_t sectors[] = { 1, 3, 7, 32, 33, 31, 2, 129, 5, 64 };
  static const uint64_t bytes[] = { 1, 511, 16384 + 17, 4097, 65536 + 512,
                                    12345, 4096, 3 };
  unsigned char key[64], *plain = malloc (size), *want = malloc (size);
  unsigned char *got;
  char hex[129], opts[64], name[32];
  struct device *dev;
  int nopts = (ss != S) + large;

  if (plain == NULL || want == NULL)
    UNIT_FATAL ("out of memory");
  unit_fill (key, key_len, seed, 0);
  for (size_t i = 0; i < key_len; i++)
    snprintf (hex + 2 * i, 3, "%02x", key[i]);
  if (ss != S)
    snprintf (opts, sizeof opts, "%d sector_size:%" PRIu64 "%s", nopts, ss,
              large ? " iv_large_sectors" : "");
  else
    snprintf (opts, sizeof opts, "%s", nopts ? "1 iv_large_sectors" : "");
  snprintf (name, sizeof name, "x%d", dev_nr++);
  unit_write_file (A, NULL, FILE_SECTORS * S);
  dev = unit_device (name, unit_parse ("0 1024 crypt aes-xts-%s %s %" PRIu64
                                       " %s 8 %s\n", mode, hex, iv_offset, A,
                                       opts));

  /* Writes: whole sectors in requests of many lengths, then a few bytes
   * rewritten unaligned (the same bytes: read-modify-write).
   */
  unit_fill (plain, size, seed + 1, 0);
  for (uint64_t off = 0, i = 0, n; off < size; off += n, i++) {
    n = MIN (sectors[i % ARRAY_SIZE (sectors)] * ss, size - off);
    CHECK (device_pwrite (dev, plain + off, n, off, 0) == 0);
  }
  CHECK (device_pwrite (dev, plain + ss - 3, 700, ss - 3, 0) == 0);
  xts_ref (true, key, key_len, mode, iv_offset, ss, large, 0, plain, want,
           size);
  got = unit_read_at (A, 8 * S, size);
  CHECKF (memcmp (got, want, size) == 0, "aes-xts-%s %zu-bit key "
          "sector_size %" PRIu64 "%s iv_offset %" PRIu64 ": encrypted "
          "sector %ld differs from OpenSSL's XTS", mode, key_len * 8, ss,
          large ? " iv_large_sectors" : "", iv_offset,
          unit_first_diff (got, want, size) / (long) ss);
  free (got);

  /* Reads: ciphertext from "elsewhere", read in pieces. */
  unit_fill (want, size, seed + 2, 0);
  write_at (A, 8 * S, want, size);
  xts_ref (false, key, key_len, mode, iv_offset, ss, large, 0, want, plain,
           size);
  got = malloc (size);
  if (got == NULL)
    UNIT_FATAL ("out of memory");
  for (uint64_t off = 0, i = 0, n; off < size; off += n, i++) {
    n = MIN (i % 2 ? bytes[i / 2 % ARRAY_SIZE (bytes)]
             : sectors[i / 2 % ARRAY_SIZE (sectors)] * ss, size - off);
    CHECK (device_pread (dev, got + off, n, off, 0) == 0);
  }
  CHECKF (memcmp (got, plain, size) == 0, "aes-xts-%s %zu-bit key "
          "sector_size %" PRIu64 "%s iv_offset %" PRIu64 ": decrypted byte "
          "%ld differs from OpenSSL's XTS", mode, key_len * 8, ss,
          large ? " iv_large_sectors" : "", iv_offset,
          unit_first_diff (got, plain, size));
  CHECK (device_pread (dev, got, size, 0, 0) == 0);
  CHECK (memcmp (got, plain, size) == 0);
  free (got);
  device_destroy (dev);
  free (plain);
  free (want);
}

static void
test_openssl_xts (void)
{
  static const char *const modes[] = { "plain64", "plain", "plain64be" };
  /* iv_offsets that are multiples of 8 (every sector size): plain wraps
   * at 2^32 a few sectors in; plain64 crosses into the high word.
   */
  static const uint64_t iv_offsets[] = { 0, 4294967288ULL, 1ULL << 40 };
  uint64_t seed = 1000;

  for (uint64_t ss = 512; ss <= 4096; ss *= 2)
    for (size_t m = 0; m < ARRAY_SIZE (modes); m++)
      for (size_t k = 32; k <= 64; k += 32)
        for (int large = 0; large <= (ss > 512); large++, seed++)
          test_vs_openssl_xts (modes[m], k, ss, large,
                               iv_offsets[seed % ARRAY_SIZE (iv_offsets)],
                               seed);
}

/* --- the transform alone ------------------------------------------------ */

/* A transform for key (key_len bytes), set up as the crypt target sets
 * up its own; calloc'd (it holds the context pool).
 */
static struct crypt_xts *
xts_new (const unsigned char *key, size_t key_len, const char *mode,
         uint64_t iv_offset, uint64_t ss, bool large)
{
  struct crypt_xts *x = calloc (1, sizeof *x);
  struct mapper_err err = { "" };

  if (x == NULL)
    UNIT_FATAL ("out of memory");
  memcpy (x->key, key, key_len);
  x->key_size = key_len;
  x->sector_size = ss;
  x->iv_mode = strcmp (mode, "plain") == 0 ? XTS_IV_PLAIN
    : strcmp (mode, "plain64") == 0 ? XTS_IV_PLAIN64 : XTS_IV_PLAIN64BE;
  x->iv_large_sectors = large;
  x->iv_offset = iv_offset;
  if (xts_init (x, &err) < 0)
    UNIT_FATAL ("xts_init: %s", err.msg);
  /* The path under test is the one chosen. */
  CHECKF (strcmp (xts_name (x), mapper_crypt_transform ()) == 0,
          "xts_init chose the %s transform, mapper_crypt_transform says %s",
          xts_name (x), mapper_crypt_transform ());
  return x;
}

/* Convert, from target offset toff, nsec sectors of random plaintext
 * out of place and back in place, against OpenSSL's XTS; then the same
 * with every slot of the pool taken (each conversion then keys
 * contexts of its own).  The buffers at odd addresses (the transform
 * may not assume any alignment: a client's buffer is read into as it
 * is).
 */
static void
test_xts_alone_one (const char *mode, size_t key_len, uint64_t ss,
                    bool large, uint64_t iv_offset, uint64_t toff,
                    size_t nsec, uint64_t seed)
{
  const size_t size = nsec * ss;
  unsigned char key[64], *plain_buf = malloc (size + 64);
  unsigned char *want = malloc (size), *got_buf = malloc (size + 64);
  unsigned char *plain = plain_buf + 1 + seed % 63;
  unsigned char *got = got_buf + 1 + (seed + 7) % 63;
  struct crypt_xts *x;

  if (plain_buf == NULL || want == NULL || got_buf == NULL)
    UNIT_FATAL ("out of memory");
  unit_fill (key, key_len, seed, 0);
  unit_fill (plain, size, seed + 1, 0);
  x = xts_new (key, key_len, mode, iv_offset, ss, large);
  xts_ref (true, key, key_len, mode, iv_offset, ss, large, toff, plain, want,
           size);
  for (int busy = 0; busy <= 1; busy++) {
    for (size_t i = 0; busy && i < XTS_SLOTS; i++)
      atomic_store (&x->slots[i].busy, true);
    memset (got, 0, size);
    CHECK (xts_convert (x, true, toff, (char *) plain, (char *) got,
                        size) == 0);
    CHECKF (memcmp (got, want, size) == 0, "aes-xts-%s %zu-bit sector_size "
            "%" PRIu64 "%s iv_offset %" PRIu64 " from %" PRIu64 "%s: sector "
            "%ld differs from OpenSSL's XTS", mode, key_len * 8, ss,
            large ? " iv_large_sectors" : "", iv_offset, toff,
            busy ? ", all slots busy" : "",
            unit_first_diff (got, want, size) / (long) ss);
    CHECK (xts_convert (x, false, toff, (char *) got, (char *) got,
                        size) == 0);
    CHECKF (memcmp (got, plain, size) == 0, "aes-xts-%s sector_size %" PRIu64
            ": in-place decryption differs at %ld", mode, ss,
            unit_first_diff (got, plain, size));
  }
  for (size_t i = 0; i < XTS_SLOTS; i++)
    atomic_store (&x->slots[i].busy, false);
  xts_destroy (x);
  CHECK (unit_is_zero (x->key, sizeof x->key));   /* wiped */
  CHECK (unit_is_zero (x->rk, sizeof x->rk));     /* the round keys too */
  CHECK (x->slots[0].ctx[XTS_CTX_ENC] == NULL);
  free (x);
  free (plain_buf);
  free (want);
  free (got_buf);
}

static void
test_xts_alone (void)
{
  static const char *const modes[] = { "plain64", "plain", "plain64be" };
  uint64_t seed = 5000;

  /* Every sector size, mode, key size and IV counting, from target
   * offsets 0 and well in; lengths across a batch (16K) and within one
   * sector.  iv_offsets that wrap plain, and reach plain64's high word.
   */
  for (uint64_t ss = 512; ss <= 4096; ss *= 2)
    for (size_t m = 0; m < ARRAY_SIZE (modes); m++)
      for (size_t k = 32; k <= 64; k += 32)
        for (int large = 0; large <= (ss > 512); large++, seed++) {
          test_xts_alone_one (modes[m], k, ss, large, 0, 0, 1, seed);
          test_xts_alone_one (modes[m], k, ss, large, 4294967288ULL,
                              123 * ss, 16384 / ss * 2 + 3, seed);
          test_xts_alone_one (modes[m], k, ss, large, 1ULL << 40,
                              ((uint64_t) 1 << 35) * ss, 5, seed);
        }

  /* Refusals: a key size XTS has no AES for; equal halves. */
  {
    struct crypt_xts *x = calloc (1, sizeof *x);
    struct mapper_err err = { "" };

    if (x == NULL)
      UNIT_FATAL ("out of memory");
    x->key_size = 48;
    x->sector_size = 512;
    CHECK_EQ (xts_init (x, &err), -EINVAL);
    CHECK (strstr (err.msg, "key of 384 bits is not valid for aes-xts"));
    xts_destroy (x);
    for (uint32_t ss = 512; ss <= 4096; ss *= 8) {
      memset (x, 0, sizeof *x);
      x->key_size = 64;
      x->sector_size = ss;
      memset (x->key, 0x5a, 64);
      CHECK_EQ (xts_init (x, &err), -EINVAL);
      CHECK (strstr (err.msg, "key refused by OpenSSL AES-256-XTS"));
      xts_destroy (x);
    }
    free (x);
  }
}

/* The stack a conversion ran on, after it returns: how many 16-byte
 * aligned blocks of it (STACK_SCAN bytes below the caller's frame, which
 * covers the frames of xts_convert and what it calls) equal one of pat.
 * Called from the frame that called xts_convert, it lies where those
 * frames were; the asm tells the compiler that buf holds something (what
 * the stack held), so that it neither warns nor assumes it undefined.
 */
#define STACK_SCAN 32768
static __attribute__ ((noinline)) size_t
stack_leftovers (const unsigned char (*pat)[16], size_t npat)
{
  unsigned char buf[STACK_SCAN] __attribute__ ((aligned (64)));
  size_t found = 0;

  __asm__ volatile ("" : "=m" (buf));
  for (size_t i = 0; i < sizeof buf; i += 16)
    for (size_t k = 0; k < npat; k++)
      found += memcmp (buf + i, pat[k], 16) == 0;
  return found;
}

/* The vector registers as a conversion left them: zmm0-31 into out,
 * 4 blocks of 16 bytes each (where the CPU has AVX-512), or ymm0-15, 2
 * blocks each (AVX2: all that crypt-xts-vaes256.c can use there).
 * Nothing between the conversion's return and this call may use them:
 * the caller calls it first.
 */
#if XTS_HAVE_VAES
#define ZMM_ALL(M)                                                      \
  M (0) M (1) M (2) M (3) M (4) M (5) M (6) M (7) M (8) M (9) M (10)    \
  M (11) M (12) M (13) M (14) M (15) M (16) M (17) M (18) M (19)        \
  M (20) M (21) M (22) M (23) M (24) M (25) M (26) M (27) M (28)        \
  M (29) M (30) M (31)
#define ZMM_STORE(n) "vmovdqu64 %%zmm" #n ", " #n "*64(%0)\n\t"
static __attribute__ ((noinline, target ("avx512f"))) void
vector_registers_avx512 (unsigned char (*out)[16])
{
  __asm__ volatile (ZMM_ALL (ZMM_STORE) : : "r" (out) : "memory");
}
#undef ZMM_STORE
#define YMM_ALL(M)                                                      \
  M (0) M (1) M (2) M (3) M (4) M (5) M (6) M (7) M (8) M (9) M (10)    \
  M (11) M (12) M (13) M (14) M (15)
#define YMM_STORE(n) "vmovdqu %%ymm" #n ", " #n "*32(%0)\n\t"
static __attribute__ ((noinline, target ("avx2"))) void
vector_registers_avx2 (unsigned char (*out)[16])
{
  __asm__ volatile (YMM_ALL (YMM_STORE) : : "r" (out) : "memory");
}
#undef YMM_STORE
#undef YMM_ALL

/* Zero zmm0-31 (where the CPU has AVX-512), so that what
 * registers_leftovers finds afterwards is what the code run in between
 * left: not the key copies of the test's own set-up (an ASan build's
 * memcpy, OpenSSL's key schedule).  A function of its own, which holds
 * nothing in them: the ABI has every vector register call-clobbered.
 */
#define ZMM_ZERO(n) "vpxord %%zmm" #n ", %%zmm" #n ", %%zmm" #n "\n\t"
static __attribute__ ((noinline, target ("avx512f"))) void
zero_vector_registers_avx512 (void)
{
  __asm__ volatile (ZMM_ALL (ZMM_ZERO) ::: "memory");
}
#undef ZMM_ZERO
#undef ZMM_ALL

/* ymm0-15, where the CPU has AVX but not AVX-512. */
static __attribute__ ((noinline, target ("avx"))) void
zero_vector_registers_avx (void)
{
  __asm__ volatile ("vzeroall" ::: "memory");
}

/* What a VAES transform could use: 0 (none), 256 or 512 bits. */
static unsigned
vector_bits (void)
{
  __builtin_cpu_init ();
  return xts_vaes_usable () ? 512 : xts_vaes256_usable () ? 256 : 0;
}

static void
zero_vector_registers (void)
{
  switch (vector_bits ()) {
  case 512: zero_vector_registers_avx512 (); break;
  case 256: zero_vector_registers_avx (); break;
  }
}
#else
static void
zero_vector_registers (void)
{
}
#endif

/* How many of the n blocks at regs equal one of pat. */
static size_t
blocks_found (const unsigned char (*regs)[16], size_t n,
              const unsigned char (*pat)[16], size_t npat)
{
  size_t found = 0;

  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < npat; k++)
      found += memcmp (regs[i], pat[k], 16) == 0;
  return found;
}

/* Blocks of pat in the vector registers, read at once (0 without
 * VAES: the OpenSSL transform's AES-NI registers are its own).
 */
static __attribute__ ((noinline)) size_t
registers_leftovers (const unsigned char (*pat)[16], size_t npat)
{
#if XTS_HAVE_VAES
  unsigned char regs[32 * 4][16];
  size_t found, n;

  switch (vector_bits ()) {
  case 512: vector_registers_avx512 (regs); n = 32 * 4; break;
  case 256: vector_registers_avx2 (regs); n = 16 * 2; break;
  default: return 0;
  }
  found = blocks_found ((const unsigned char (*)[16]) regs, n, pat, npat);
  explicit_bzero (regs, sizeof regs);   /* not for stack_leftovers to see */
  return found;
#else
  (void) pat, (void) npat;
  return 0;
#endif
}

/* T * x in GF(2^128) (P1619): the reference's tweak doubling. */
static void
tweak_double (unsigned char t[16])
{
  unsigned carry = 0;

  for (int i = 0; i < 16; i++) {
    unsigned b = t[i];

    t[i] = (unsigned char) (b << 1 | carry);
    carry = b >> 7;
  }
  if (carry)
    t[0] ^= 0x87;
}

/* Round keys and tweaks are secrets (the tweaks, E_K2 of the sector
 * numbers, with the ciphertext give the input of E_K1): after a
 * conversion none may be left on the stack, in spilled registers or
 * arrays (crypt-xts-vaes.c's frame is over 3K of them), nor in the
 * vector registers (a worker's zmm16-31 may keep them for as long as the
 * thread lives: past a key wipe, and into a core dump).  Every round key
 * (VAES: the transform's; OpenSSL: its contexts' are not ours to see,
 * the two key halves stand for them) and every block's tweak of the
 * sectors converted is looked for.
 */
static void
test_stack_wiped (void)
{
  /* 1, 6 and 20 sectors: the VAES transforms compute first tweaks in
   * batches of three sizes (1, a few, all registers).
   */
  static const size_t nsecs[] = { 1, 6, 20 };

  for (size_t key_len = 32; key_len <= 64; key_len += 32)
    for (uint64_t ss = 512; ss <= 4096; ss *= 8)
    for (size_t ni = 0; ni < ARRAY_SIZE (nsecs); ni++) {
      const size_t nsec = nsecs[ni], size = nsec * ss;
      /* Each block's tweak, alone and XORed with the last round key of
       * either direction (what the VAES transforms keep: the last
       * AddRoundKey's key), each direction's k[0] ^ k[last], the round
       * keys.
       */
      const size_t ntw = size / 16;
      const size_t npat = 3 * ntw + 2 + 3 * (XTS_MAX_ROUNDS + 1);
      unsigned char key[64], (*pat)[16] = calloc (npat, 16);
      unsigned char *buf = malloc (size);
      EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new ();
      struct crypt_xts *x;
      size_t n = 0, found;
      int outl;

      if (pat == NULL || buf == NULL || ctx == NULL)
        UNIT_FATAL ("out of memory");
      unit_fill (key, key_len, 77 + key_len + ss, 0);
      unit_fill (buf, size, 78, 0);
      x = xts_new (key, key_len, "plain64", 0, ss, false);
      /* The tweaks, from the reference's IVs through E_K2. */
      if (EVP_EncryptInit_ex (ctx, key_len == 32 ? EVP_aes_128_ecb ()
                              : EVP_aes_256_ecb (), NULL, key + key_len / 2,
                              NULL) != 1)
        UNIT_FATAL ("OpenSSL AES-ECB failed");
      EVP_CIPHER_CTX_set_padding (ctx, 0);
      for (size_t s = 0; s < nsec; s++) {
        unsigned char t[16];

        xts_ref_iv ("plain64", 0, ss, false, s * ss, t);
        if (EVP_EncryptUpdate (ctx, t, &outl, t, 16) != 1 || outl != 16)
          UNIT_FATAL ("OpenSSL AES-ECB failed");
        for (size_t j = 0; j < ss / 16; j++, tweak_double (t))
          memcpy (pat[n++], t, 16);
      }
      EVP_CIPHER_CTX_free (ctx);
      if (x->kind != XTS_KIND_OPENSSL) {
        for (size_t k = 0; k < 3; k++)
          for (unsigned r = 0; r <= x->rounds; r++)
            memcpy (pat[n++], x->rk[k][r], 16);
        for (int k = XTS_RK_ENC; k <= XTS_RK_DEC; k++) {
          const unsigned char *last = x->rk[k][x->rounds];

          for (size_t j = 0; j < ntw; j++, n++)
            for (size_t b = 0; b < 16; b++)
              pat[n][b] = pat[j][b] ^ last[b];
          for (size_t b = 0; b < 16; b++)
            pat[n][b] = x->rk[k][0][b] ^ last[b];
          n++;
        }
      }
      else {
        memcpy (pat[n++], key, 16);
        memcpy (pat[n++], key + key_len / 2, 16);
      }

      /* The key schedule (xts_init) too: the same keys again. */
      if (x->kind != XTS_KIND_OPENSSL) {
        struct mapper_err err = { "" };

        xts_destroy (x);
        memcpy (x->key, key, key_len);
        zero_vector_registers ();
        CHECK (xts_init (x, &err) == 0);
        found = registers_leftovers ((const unsigned char (*)[16]) pat, n);
        CHECKF (found == 0, "%s transform, %zu-bit key: %zu round keys "
                "left in vector registers by xts_init", xts_name (x),
                key_len * 8, found);
      }
      for (int enc = 1; enc >= 0; enc--) {
        const char *how = enc ? "encrypting" : "decrypting";
        size_t in_regs, on_stack;

        zero_vector_registers ();
        CHECK (xts_convert (x, enc, 0, (char *) buf, (char *) buf,
                            size) == 0);
        /* Registers first: stack_leftovers' memcmp may use them. */
        in_regs = registers_leftovers ((const unsigned char (*)[16]) pat, n);
        on_stack = stack_leftovers ((const unsigned char (*)[16]) pat, n);
        CHECKF (in_regs == 0 && on_stack == 0, "%s transform, %zu-bit key, "
                "sector_size %" PRIu64 ": blocks of round keys or tweaks "
                "left after %s: %zu in vector registers, %zu on the stack",
                xts_name (x), key_len * 8, ss, how, in_regs,
                on_stack);
      }
      xts_destroy (x);
      free (x);
      free (pat);
      free (buf);
    }
}

/* Zero writes encrypted zeros; fast zero is refused; trim passes only
 * with allow_discards and only whole sectors.
 */
static void
test_zero_trim (const char *opts, uint64_t ss)
{
  unsigned char buf[16384], *disk, *before;
  bool discards = strstr (opts, "allow_discards") != NULL;
  struct device *dev = crypt_dev ("aes-xts-plain64", KEY512, opts);
  struct ext e = { 0, 0, 99 };
  int r;

  unit_fill (buf, sizeof buf, 5, 0);
  CHECK (device_pwrite (dev, buf, sizeof buf, 0, 0) == 0);
  /* Zero, unaligned: zeros read back, neighbours kept, and the disk holds
   * ciphertext, not a hole.
   */
  CHECK (device_zero (dev, 5000, 100, MAPPER_MAY_TRIM) == 0);
  CHECK (device_pread (dev, buf, sizeof buf, 0, 0) == 0);
  {
    unsigned char want[16384];
    unit_fill (want, sizeof want, 5, 0);
    memset (want + 100, 0, 5000);
    CHECK (memcmp (buf, want, sizeof want) == 0);
  }
  disk = unit_read_at (A, 8 * S + ss, ss);
  CHECK (!unit_is_zero (disk, ss));
  free (disk);
  CHECK (device_zero (dev, 4096, 0, MAPPER_FAST_ZERO) == -ENOTSUP);

  /* Trim 100..10100: the whole sectors inside it are punched with
   * allow_discards; nothing changes without.  Bytes outside read the same.
   */
  CHECK (device_pread (dev, buf, sizeof buf, 0, 0) == 0);
  before = unit_read_at (A, 8 * S, sizeof buf);
  CHECK (device_trim (dev, 10000, 100, 0) == 0);
  disk = unit_read_at (A, 8 * S, sizeof buf);
  if (discards) {
    uint64_t first = (100 + ss - 1) / ss * ss, last = 10100 / ss * ss;
    CHECK (memcmp (disk, before, first) == 0);
    CHECK (unit_is_zero (disk + first, last - first));
    CHECK (memcmp (disk + last, before + last, sizeof buf - last) == 0);
  }
  else
    CHECK (memcmp (disk, before, sizeof buf) == 0);
  free (disk);
  free (before);
  {
    unsigned char now[16384];
    CHECK (device_pread (dev, now, sizeof now, 0, 0) == 0);
    CHECK (memcmp (now, buf, 100) == 0);
    CHECK (memcmp (now + 10100, buf + 10100, sizeof now - 10100) == 0);
  }

  /* Extents: data everywhere, even over the punched hole. */
  r = device_extents (dev, 1024 * S, 0, 0, first_extent, &e);
  CHECK (r == 0);
  CHECK (e.off == 0 && e.len == 1024 * S && e.type == 0);
  device_destroy (dev);
}

/* Concurrent partial writes to different bytes of the same sectors must
 * all land (read-modify-write is serialised per sector).
 */
struct writer {
  struct device *dev;
  unsigned id;
  int errors;
};

#define WRITERS 8
#define ROUNDS 200

static void *
writer_thread (void *arg)
{
  struct writer *w = arg;
  unsigned char buf[100];

  for (unsigned round = 0; round < ROUNDS; round++) {
    /* Thread id owns bytes [id*100, id*100+100) of sectors 0-1 (the
     * slices of threads 5 and 10 cross the sector edge).
     */
    memset (buf, (int) (w->id * 16 + round % 16), sizeof buf);
    if (device_pwrite (w->dev, buf, sizeof buf, w->id * 100, 0) != 0)
      w->errors++;
  }
  return NULL;
}

static void
test_concurrent_rmw (void)
{
  struct device *dev = crypt_dev ("aes-xts-plain64", KEY512, "");
  struct writer w[WRITERS];
  pthread_t th[WRITERS];
  unsigned char buf[WRITERS * 100];

  for (unsigned i = 0; i < WRITERS; i++) {
    w[i] = (struct writer) { .dev = dev, .id = i };
    if (pthread_create (&th[i], NULL, writer_thread, &w[i]) != 0)
      UNIT_FATAL ("pthread_create");
  }
  for (unsigned i = 0; i < WRITERS; i++) {
    pthread_join (th[i], NULL);
    CHECK (w[i].errors == 0);
  }
  CHECK (device_pread (dev, buf, sizeof buf, 0, 0) == 0);
  for (unsigned i = 0; i < WRITERS; i++)
    for (unsigned j = 0; j < 100; j++)
      if (buf[i * 100 + j] != i * 16 + (ROUNDS - 1) % 16) {
        CHECKF (false, "writer %u's byte %u is %u: a write was lost", i, j,
                buf[i * 100 + j]);
        break;
      }
  device_destroy (dev);
}

/* More threads than cipher context slots, each on its own 4K block: all
 * data round-trips.  Both ways of doing XTS: batched (512-byte sectors)
 * and per sector.  The temporary contexts of a thread that finds every
 * slot taken are not reached here (a slot is held only inside
 * xts_convert, so on a few cores 65 threads are never all in there at
 * once): test_xts_alone takes every slot itself.
 */
struct mover {
  struct device *dev;
  unsigned id;
  int errors;
};

static void *
mover_thread (void *arg)
{
  struct mover *m = arg;
  unsigned char in[4096], out[4096];

  for (unsigned round = 0; round < 50; round++) {
    unit_fill (in, sizeof in, m->id * 1000 + round, 0);
    if (device_pwrite (m->dev, in, sizeof in, m->id * 4096ULL, 0) != 0 ||
        device_pread (m->dev, out, sizeof out, m->id * 4096ULL, 0) != 0 ||
        memcmp (in, out, sizeof in) != 0)
      m->errors++;
  }
  return NULL;
}

static void
test_many_threads (const char *opts)
{
  enum { N = 100 };             /* > XTS_SLOTS (64); 100 4K blocks < 512K */
  struct device *dev = crypt_dev ("aes-xts-plain64", KEY512, opts);
  struct mover m[N];
  pthread_t th[N];

  for (unsigned i = 0; i < N; i++) {
    m[i] = (struct mover) { .dev = dev, .id = i };
    if (pthread_create (&th[i], NULL, mover_thread, &m[i]) != 0)
      UNIT_FATAL ("pthread_create");
  }
  for (unsigned i = 0; i < N; i++) {
    pthread_join (th[i], NULL);
    CHECKF (m[i].errors == 0, "thread %u: %d errors", i, m[i].errors);
  }
  device_destroy (dev);
}

/* bounce buffers: nested gets are distinct; deep nesting still works. */
static void
test_bounce (void)
{
  char *p[6];

  for (int i = 0; i < 6; i++) {
    p[i] = bounce_get (1000 + i);
    CHECK (p[i] != NULL);
    CHECK (((uintptr_t) p[i] & 4095) == 0);
    memset (p[i], i, 1000 + i);
    for (int j = 0; j < i; j++)
      CHECK (p[j] != p[i]);
  }
  for (int i = 0; i < 6; i++)
    CHECK ((unsigned char) p[i][999] == i);
  for (int i = 5; i >= 0; i--)
    bounce_put (p[i]);
  /* Reused at the same level, grown when needed. */
  {
    char *q = bounce_get (100);
    CHECK (q == p[0]);
    bounce_put (q);
    q = bounce_get (1 << 20);
    CHECK (q != NULL);
    memset (q, 0, 1 << 20);
    bounce_put (q);
  }
}

/* dm-crypt's messages: "key wipe" and "key set <key>" only while
 * suspended; after a wipe the key is zeros in memory and resume is
 * refused (ENXIO, the wrong state) until a key is set; every refused key set leaves the
 * key as it was; the same key reads back what was written before the
 * wipe, another does not; the key's text is overwritten in argv.
 */
static void
test_messages (void)
{
  const size_t size = 64 * S;
  static const char *const bad[][2] = {
    { "key set " KEY256, "key set: key of 64 hex digits is the wrong size: "
      "this target's key is 512 bits (128 hex digits)" },
    { "key set :64:logon:vol", "not supported here: no kernel keyring" },
    { "key set -", "key set: no key ('-')" },
    { "key set zz" KEY256 KEY256 "zz", "wrong size" },
    { "key set " KEY256 KEY256, "key set: key refused by OpenSSL "
      "AES-256-XTS (are its two halves identical?)" },
    { "key set", "key set: expected one key, got 0 words" },
    { "key wipe now", "key wipe: takes no argument, got 1" },
    { "key", "unrecognised message: crypt takes 'key set <key>' and 'key "
      "wipe'" },
    { "wipe key", "unrecognised message" },
  };
  struct device *dev = crypt_dev ("aes-xts-plain64", KEY512, "");
  unsigned char *data = malloc (size), *buf = malloc (size);
  struct mapper_err err = { "" };
  char msg[256], zeros[129], *other = strdup (KEY512);
  struct device_info info;

  if (data == NULL || buf == NULL || other == NULL)
    UNIT_FATAL ("out of memory");
  memset (zeros, '0', 128);
  zeros[128] = '\0';
  other[0] = 'f';                       /* another valid key */
  unit_fill (data, size, 77, 0);
  CHECK (device_pwrite (dev, data, size, 0, 0) == 0);

  /* Running: refused, nothing changed. */
  CHECK (unit_message (dev, 0, "key wipe", msg, sizeof msg) == -EBUSY);
  CHECKF (strstr (msg, "key wipe: the device is not suspended") != NULL,
          "%s", msg);
  CHECK (unit_message (dev, 0, "key set " KEY512, msg, sizeof msg) ==
         -EBUSY);
  CHECK (strstr (unit_table_text (dev), KEY512) != NULL);

  CHECK (device_suspend (dev, false) == 0);
  CHECK (unit_message (dev, 0, "key wipe", msg, sizeof msg) == 0);
  CHECK (strstr (unit_table_text (dev), zeros) != NULL);
  CHECK (device_resume (dev, &err) == -ENXIO);
  CHECKF (strstr (err.msg, "device 'c") && strstr (err.msg, "crypt target "
          "at sector 0: its key was wiped ('key wipe')"), "%s", err.msg);
  device_get_info (dev, &info);
  CHECK (info.suspended);
  for (size_t i = 0; i < ARRAY_SIZE (bad); i++) {
    int r = unit_message (dev, 0, bad[i][0], msg, sizeof msg);
    CHECKF (r == -EINVAL || r == -ENOTSUP, "%s: %d", bad[i][0], r);
    CHECKF (strstr (msg, bad[i][1]) != NULL, "'%s': '%s'", bad[i][0], msg);
    CHECK (strstr (unit_table_text (dev), zeros) != NULL);
    CHECK (device_resume (dev, &err) == -ENXIO);
  }
  {
    char *words = unit_sprintf ("key set x%s", KEY512 + 1);

    CHECK (unit_message (dev, 0, words, msg, sizeof msg) == -EINVAL);
    CHECKF (strstr (msg, "key set: key is not hexadecimal (character 1)"),
            "%s", msg);
    CHECK (strstr (unit_table_text (dev), zeros) != NULL);
    free (words);
  }
  /* The same key back: the data reads back, through a resume. */
  CHECK (unit_message (dev, 0, "key set " KEY512, msg, sizeof msg) ==
         MESSAGE_TABLE_CHANGED);
  CHECK (strstr (unit_table_text (dev), KEY512) != NULL);
  CHECK (device_resume (dev, &err) == 0);
  CHECK (device_pread (dev, buf, size, 0, 0) == 0);
  CHECK (memcmp (buf, data, size) == 0);

  /* A refused key set on a key that is there keeps it. */
  CHECK (device_suspend (dev, false) == 0);
  CHECK (unit_message (dev, 0, "key set " KEY256, msg, sizeof msg) ==
         -EINVAL);
  CHECK (device_resume (dev, &err) == 0);
  CHECK (device_pread (dev, buf, size, 0, 0) == 0);
  CHECK (memcmp (buf, data, size) == 0);

  /* Another key, set without a wipe: the same ciphertext, other data. */
  CHECK (device_suspend (dev, false) == 0);
  {
    char words[256], *argv[3] = { (char *) "key", (char *) "set", words };
    char *reply = NULL;

    snprintf (words, sizeof words, "%s", other);
    CHECK (device_message (dev, 0, 3, argv, &reply, &err) ==
           MESSAGE_TABLE_CHANGED);
    free (reply);
    CHECKF (strspn (words, "0") == 128, "the key's text is not wiped: %s",
            words);
  }
  CHECK (strstr (unit_table_text (dev), other) != NULL);
  CHECK (device_resume (dev, &err) == 0);
  CHECK (device_pread (dev, buf, size, 0, 0) == 0);
  CHECK (memcmp (buf, data, size) != 0);
  free (other);
  free (data);
  free (buf);
  device_destroy (dev);
}

int
main (void)
{
  setup ();
  test_bad_tables ();
  test_format ();
  test_roundtrip ("aes-xts-plain64", KEY512, "");
  test_roundtrip ("aes-xts-plain", KEY256, "");
  test_roundtrip ("aes-xts-plain64be", KEY512, "1 sector_size:4096");
  test_roundtrip ("aes-xts-plain64", KEY256,
                  "2 sector_size:1024 iv_large_sectors");
  test_roundtrip ("capi:xts(aes)-plain64", KEY512,
                  "2 sector_size:2048 allow_discards");
  /* Every transform the CPU runs: VAES on 512-bit registers
   * (crypt-xts-vaes.c), on 256-bit ones (crypt-xts-vaes256.c), then
   * OpenSSL's (batched ECB, or XTS per sector), which is all there is
   * elsewhere: the data paths against OpenSSL's XTS, the transform
   * alone, and its use from many threads.
   */
  /* Every CPU with the 512-bit transform's features has the 256-bit
   * one's: a check broken there would skip it without a word.
   */
  CHECK (!xts_vaes_usable () || xts_vaes256_usable ());
  static const struct { bool openssl, vaes256; const char *name; } kinds[] = {
    { false, false, "VAES" }, { false, true, "VAES-256" },
    { true, false, "OpenSSL" },
  };
  for (size_t k = 0; k < ARRAY_SIZE (kinds); k++) {
    mapper_crypt_openssl = kinds[k].openssl;
    mapper_crypt_vaes256 = kinds[k].vaes256;
    if (strcmp (mapper_crypt_transform (), kinds[k].name) != 0) {
      printf ("test-unit-crypt: the %s transform: this CPU does not run "
              "it\n", kinds[k].name);
      continue;
    }
    printf ("test-unit-crypt: the %s transform\n", kinds[k].name);
    test_openssl_xts ();
    test_xts_alone ();
    test_stack_wiped ();
    test_zero_trim ("", 512);
    test_zero_trim ("1 allow_discards", 512);
    test_zero_trim ("2 allow_discards sector_size:4096", 4096);
    test_concurrent_rmw ();
    test_many_threads ("");
    test_many_threads ("1 sector_size:4096");
    test_messages ();
  }
  test_bounce ();
  free (A);
  free (B);
  UNIT_EXIT ();
}

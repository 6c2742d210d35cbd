/* SPDX-License-Identifier: BSD-3-Clause */
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
 *   - extents: all data (ciphertext holes don't read as zeros).
 * The transform (crypt-xts.c: XTS, the IVs, the cipher contexts) needs
 * to see the data, so this target does its backend I/O itself,
 * synchronously inside map (io_sync), not through clones.
 *
 * Keys: the hex key in the table text is overwritten as soon as it is
 * decoded; the binary key and every cipher context made from it are
 * wiped when the table is freed (xts_destroy), or replaced or wiped by
 * dm-crypt's messages "key set <key>" and "key wipe" (suspended device
 * only; after a wipe, resume is refused until a key is set).
 * status TABLE prints the key, like dm; hiding it is the caller's job
 * (dmsetup table shows it only with --showkeys).
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>

#include "target.h"
#include "util.h"
#include "crypt-xts.h"

#define CRYPT_CHUNK (1024 * 1024)   /* bytes encrypted per bounce write */
#define CRYPT_MAX_OPTS 8

/* In enum xts_iv_mode's order. */
static const char *const iv_mode_name[] = { "plain", "plain64", "plain64be" };

struct crypt {
  /* Read-only after ctr. */
  struct backend *be;
  uint64_t start;               /* bytes into the backend */
  char *cipher_string;          /* as given, for status */
  bool allow_discards;
  bool same_cpu_crypt, submit_from_crypt_cpus;
  bool no_read_workqueue, no_write_workqueue;
  /* The key, sector size and IVs; keyed contexts.  Replaced only by a
   * message, on a suspended device (no I/O in flight).
   */
  struct crypt_xts xts;
  /* dm's DM_CRYPT_SUSPENDED and DM_CRYPT_KEY_VALID: changed and read
   * only with the device's lock held (postsuspend, resume, preresume,
   * message).
   */
  bool suspended;
  bool key_wiped;
};

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

/* Decode the hex key into the transform's key, then overwrite the text (as dm does)
 * whatever happens, so it never lingers in the table's copy.
 */
static int
crypt_take_key (struct crypt_xts *x, char *hex, struct mapper_err *err)
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
  else if (len / 2 > sizeof x->key)
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
      x->key[i / 2] = hi << 4 | lo;
    }
    x->key_size = len / 2;
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
      cc->xts.iv_mode = i;
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

/* [<#opt_params> <opt_params>...], the rest of as. */
static int
crypt_parse_opts (struct target *ti, struct crypt *cc, struct target_args *as,
                  struct mapper_err *err)
{
  struct target_args opts;
  const char *o;
  int r;

  if (as->argc == 0)
    return 0;
  r = target_read_group ("optional parameter", 0, CRYPT_MAX_OPTS, true, as,
                         &opts, err);
  if (r < 0)
    return r;
  while ((o = target_shift_arg (&opts)) != NULL) {
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
      cc->xts.iv_large_sectors = true;
    else if (strncasecmp (o, "sector_size:", 12) == 0) {
      if (parse_u64 (o + 12, &ss) < 0 || ss < 512 || ss > XTS_MAX_SECTOR ||
          !IS_POWER_OF_2 (ss)) {
        mapper_err_set (err, "invalid sector_size '%s' (a power of two from "
                        "512 to %d)", o + 12, XTS_MAX_SECTOR);
        return -EINVAL;
      }
      if (ti->len % ss) {
        mapper_err_set (err, "target length %" PRIu64 " sectors is not a "
                        "multiple of sector_size %" PRIu64,
                        ti->len >> MAPPER_SECTOR_SHIFT, ss);
        return -EINVAL;
      }
      cc->xts.sector_size = ss;
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

static void
crypt_free (struct crypt *cc)
{
  xts_destroy (&cc->xts);
  free (cc->cipher_string);
  free (cc);
}

static const struct target_arg iv_offset_arg = {
  "iv_offset", "sectors", 0, UINT64_MAX,
};

static int
crypt_ctr (struct target *ti, unsigned argc, char **argv,
           struct mapper_err *err)
{
  struct target_args as = { argc, argv };
  struct mapper_err key_err;
  struct crypt *cc;
  struct target_args opts;
  const char *cipher, *dev;
  uint32_t ss;
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
    key_r = crypt_take_key (&cc->xts, argv[1], &key_err);
  if (argc < 5) {
    mapper_err_set (err, "expected <cipher> <key> <iv_offset> <dev> <offset> "
                    "[<#opt_params> <opt_params>...], got %u argument%s",
                    argc, argc == 1 ? "" : "s");
    r = -EINVAL;
    goto err;
  }
  cipher = target_shift_arg (&as);
  target_shift_arg (&as);       /* the key, taken above */
  /* dm reads the optional parameters first (sector_size matters below):
   * they follow <iv_offset> <dev> <offset>.
   */
  opts = (struct target_args) { as.argc - 3, as.argv + 3 };
  cc->xts.sector_size = MAPPER_SECTOR_SIZE;
  if ((r = crypt_parse_opts (ti, cc, &opts, err)) < 0)
    goto err;
  ss = cc->xts.sector_size;
  if ((r = crypt_parse_cipher (cc, cipher, err)) < 0)
    goto err;
  if (key_r < 0) {
    *err = key_err;
    r = key_r;
    goto err;
  }
  if ((r = xts_init (&cc->xts, err)) < 0 ||
      (r = target_read_arg (&iv_offset_arg, &as, &cc->xts.iv_offset,
                            err)) < 0)
    goto err;
  if (cc->xts.iv_offset & ((ss >> MAPPER_SECTOR_SHIFT) - 1)) {
    mapper_err_set (err, "iv_offset %" PRIu64 " is not a multiple of "
                    "sector_size %" PRIu32 " (%" PRIu32 " sectors)",
                    cc->xts.iv_offset, ss, ss >> MAPPER_SECTOR_SHIFT);
    r = -EINVAL;
    goto err;
  }
  dev = target_shift_arg (&as);
  if ((r = target_read_sectors ("offset", &as, &cc->start, err)) < 0)
    goto err;
  if (cc->start & (ss - 1)) {
    mapper_err_set (err, "offset %" PRIu64 " is not a multiple of "
                    "sector_size %" PRIu32 " (%" PRIu32 " sectors)",
                    cc->start >> MAPPER_SECTOR_SHIFT, ss,
                    ss >> MAPPER_SECTOR_SHIFT);
    r = -EINVAL;
    goto err;
  }
  r = target_get_backend (ti, dev, cc->start, ti->len, &cc->be, err);
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

/* --- suspend, resume, messages ------------------------------------------ */

static void
crypt_postsuspend (struct target *ti)
{
  struct crypt *cc = ti->private;

  cc->suspended = true;
}

static void
crypt_resume (struct target *ti)
{
  struct crypt *cc = ti->private;

  cc->suspended = false;
}

/* dm's crypt_preresume: no I/O without a key.  dm answers -EAGAIN
 * ("aborting resume - crypt key is not set"), the ioctl's way of saying
 * "not now"; here the device's state is what is wrong, and the engine's
 * errno for that is ENXIO (the control protocol's "wrong device state",
 * as for a resume with nothing to resume), where EAGAIN would reach a
 * client as "invalid argument".  As in dm, the device stays suspended
 * and a key set followed by a resume goes on.
 */
static int
crypt_preresume (struct target *ti, struct mapper_err *err)
{
  struct crypt *cc = ti->private;

  if (cc->key_wiped) {
    mapper_err_set (err, "its key was wiped ('key wipe'): resume refused "
                    "until a message 'key set <key>' gives one");
    return -ENXIO;
  }
  return 0;
}

/* key set <key>: a key of the size the table has, checked (by OpenSSL
 * too) into a transform of its own before the old one is wiped, so that
 * a refused key changes nothing.  (dm clears its key-valid flag before
 * decoding the hex, so a bad one there also blocks resume.)  hex is
 * overwritten whatever happens.
 */
static int
crypt_set_key (struct crypt *cc, char *hex, struct mapper_err *err)
{
  struct crypt_xts x = {
    .sector_size = cc->xts.sector_size, .iv_mode = cc->xts.iv_mode,
    .iv_large_sectors = cc->xts.iv_large_sectors,
    .iv_offset = cc->xts.iv_offset,
  };
  size_t digits = strlen (hex);
  int r;

  if (hex[0] == ':') {
    memset (hex, '0', digits);
    mapper_err_set (err, "key set: kernel keyring keys (':<size>:<type>:"
                    "<description>') are not supported here: no kernel "
                    "keyring; give the key in hex");
    return -ENOTSUP;
  }
  /* The size first, as dm (get_key_size): it may not change. */
  if (strcmp (hex, "-") != 0 && digits != cc->xts.key_size * 2) {
    memset (hex, '0', digits);
    mapper_err_set (err, "key of %zu hex digits is the wrong size: this "
                    "target's key is %zu bits (%zu hex digits), and a "
                    "message cannot change that", digits,
                    cc->xts.key_size * 8, cc->xts.key_size * 2);
    r = -EINVAL;
    goto out;
  }
  if ((r = crypt_take_key (&x, hex, err)) < 0 ||
      (r = xts_init (&x, err)) < 0)
    goto out;
  xts_destroy (&cc->xts);
  memcpy (&cc->xts, &x, sizeof x);
  cc->key_wiped = false;
  OPENSSL_cleanse (&x, sizeof x);
  return MESSAGE_TABLE_CHANGED;

 out:
  mapper_err_prefix (err, "key set");
  xts_destroy (&x);
  return r;
}

/* dm-crypt's messages: "key set <key>" and "key wipe", only while
 * suspended.  Every word after "key set" or "key wipe" is overwritten
 * (it may be a key), and none is ever echoed.
 */
static int
crypt_message (struct target *ti, unsigned argc, char **argv, char *reply,
               size_t len, struct mapper_err *err)
{
  struct crypt *cc = ti->private;
  bool set = argc >= 2 && strcasecmp (argv[1], "set") == 0;
  bool wipe = argc >= 2 && strcasecmp (argv[1], "wipe") == 0;
  int r;

  if (argc < 2 || strcasecmp (argv[0], "key") != 0 || !(set || wipe)) {
    mapper_err_set (err, "unrecognised message: crypt takes 'key set "
                    "<key>' and 'key wipe'");
    r = -EINVAL;
  }
  else if (!cc->suspended) {
    mapper_err_set (err, "key %s: the device is not suspended (dm-crypt "
                    "changes keys only on a suspended device: suspend it "
                    "first)", set ? "set" : "wipe");
    r = -EBUSY;
  }
  else if (set && argc != 3) {
    mapper_err_set (err, "key set: expected one key, got %u words",
                    argc - 2);
    r = -EINVAL;
  }
  else if (wipe && argc != 2) {
    mapper_err_set (err, "key wipe: takes no argument, got %u", argc - 2);
    r = -EINVAL;
  }
  else if (set)
    r = crypt_set_key (cc, argv[2], err);
  else {
    /* The key and every context keyed from it; the size stays, for key
     * set and for status (a key of zeros, as dm shows).
     */
    xts_destroy (&cc->xts);
    cc->key_wiped = true;
    r = 0;
  }
  for (unsigned i = 2; i < argc; i++)
    memset (argv[i], '0', strlen (argv[i]));
  return r;
}

/* --- I/O ---------------------------------------------------------------- */

/* Read [off, off+len) (target bytes) into buf. */
static int
crypt_read (struct crypt *cc, uint64_t off, uint64_t len, char *buf)
{
  const uint64_t ss = cc->xts.sector_size, end = off + len;
  uint64_t pos = off, mid_end = end & ~(ss - 1);
  char sector[XTS_MAX_SECTOR];
  int r;

  /* A partial sector at the start (perhaps also the end). */
  if (pos & (ss - 1)) {
    uint64_t sec = pos & ~(ss - 1), n = MIN (end, sec + ss) - pos;

    if ((r = io_sync (IO_READ, cc->be, cc->start + sec, ss, sector, 0)) < 0 ||
        (r = xts_convert (&cc->xts, false, sec, sector, sector, ss)) < 0)
      return r;
    memcpy (buf, sector + (pos - sec), n);
    pos += n;
  }
  /* Whole sectors: in place in the client's buffer. */
  if (mid_end > pos) {
    char *p = buf + (pos - off);

    if ((r = io_sync (IO_READ, cc->be, cc->start + pos, mid_end - pos, p,
                      0)) < 0 ||
        (r = xts_convert (&cc->xts, false, pos, p, p, mid_end - pos)) < 0)
      return r;
    pos = mid_end;
  }
  /* A partial sector at the end. */
  if (pos < end) {
    if ((r = io_sync (IO_READ, cc->be, cc->start + pos, ss, sector, 0)) < 0 ||
        (r = xts_convert (&cc->xts, false, pos, sector, sector, ss)) < 0)
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
  const uint64_t ss = cc->xts.sector_size;
  pthread_mutex_t *lock = rmw_lock (cc->be, cc->start + sec);
  char sector[XTS_MAX_SECTOR];
  int r;

  pthread_mutex_lock (lock);
  if ((r = io_sync (IO_READ, cc->be, cc->start + sec, ss, sector, 0)) == 0 &&
      (r = xts_convert (&cc->xts, false, sec, sector, sector, ss)) == 0) {
    if (src)
      memcpy (sector + in_off, src, n);
    else
      memset (sector + in_off, 0, n);
    if ((r = xts_convert (&cc->xts, true, sec, sector, sector, ss)) == 0)
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
  const uint64_t ss = cc->xts.sector_size, end = off + len;
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
      r = xts_convert (&cc->xts, true, pos, src + (pos - off), b, n);
    else {
      memset (b, 0, n);
      r = xts_convert (&cc->xts, true, pos, b, b, n);
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
  uint64_t ss = cc->xts.sector_size, first, last;

  switch (io_req_op (req)) {
  case IO_READ:
    return crypt_read (cc, off, len, buf);
  case IO_WRITE:
    return crypt_write (cc, io_req_flags (req), off, len, buf);
  case IO_ZERO:
    /* Encrypted zeros must be written: never fast. */
    if (io_req_flags (req) & MAPPER_FAST_ZERO)
      return -ENOTSUP;
    return crypt_write (cc, io_req_flags (req), off, len, NULL);
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
  const struct crypt_xts *x = &cc->xts;
  unsigned nr;
  size_t used = 0;

  if (type == STATUSTYPE_INFO)
    return 0;
  EMIT ("%s ", cc->cipher_string);
  for (size_t i = 0; i < x->key_size; i++)
    EMIT ("%02x", x->key[i]);
  EMIT (" %" PRIu64 " %s %" PRIu64, x->iv_offset, backend_name (cc->be),
        cc->start >> MAPPER_SECTOR_SHIFT);
  /* dm's order. */
  nr = cc->allow_discards + cc->same_cpu_crypt + cc->submit_from_crypt_cpus +
    cc->no_read_workqueue + cc->no_write_workqueue +
    (x->sector_size != MAPPER_SECTOR_SIZE) + x->iv_large_sectors;
  if (nr) {
    EMIT (" %u", nr);
    if (cc->allow_discards)
      EMIT (" allow_discards");
    if (cc->same_cpu_crypt)
      EMIT (" same_cpu_crypt");
    if (cc->submit_from_crypt_cpus)
      EMIT (" submit_from_crypt_cpus");
    if (cc->no_read_workqueue)
      EMIT (" no_read_workqueue");
    if (cc->no_write_workqueue)
      EMIT (" no_write_workqueue");
    if (x->sector_size != MAPPER_SECTOR_SIZE)
      EMIT (" sector_size:%" PRIu32, x->sector_size);
    if (x->iv_large_sectors)
      EMIT (" iv_large_sectors");
  }
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
  .postsuspend = crypt_postsuspend,
  .preresume = crypt_preresume,
  .resume = crypt_resume,
  .message = crypt_message,
};

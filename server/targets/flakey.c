/* SPDX-License-Identifier: BSD-3-Clause */
/* flakey <dev> <offset> <up_interval> <down_interval>
 *        [<#features> <feature>...]
 *
 * dm-flakey: passes I/O through for up_interval seconds, then misbehaves
 * for down_interval seconds, and so on; the clock starts when the table
 * is loaded (constructed).  While down:
 *   error_reads        reads fail with EIO
 *   drop_writes        writes (and zero, trim, flush) succeed but are
 *                      silently dropped
 *   error_writes       writes (and zero, trim, flush) fail with EIO
 *   corrupt_bio_byte <Nth> <r|w> <value> <flags>
 *                      byte Nth (from 1) of each matching read's data
 *                      (after reading) or write's data (sent from a
 *                      constant: the client's buffer is const) is
 *                      replaced by value.  flags is a mask of Linux bi_opf
 *                      bits the request must all carry: 0 matches every
 *                      request; we know REQ_OP_WRITE (1) and REQ_FUA
 *                      (1 << 17), which NBD FUA writes carry.
 * With no features, reads and writes both fail (dm: error_reads +
 * error_writes, and status shows them).  Nth counts from the start of the
 * part of the request that falls in this target, as dm counts from the
 * start of the bio split at target boundaries.  Zero and trim carry no
 * data, so corruption never applies to them.
 *
 * Always up: down_interval 0.  Always down: up_interval 0.
 *
 * Message (ours; dm-flakey has none): "intervals <up> <down>" changes
 * the intervals at run time and starts the cycle again, up first.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "target.h"
#include "util.h"

#define ERROR_READS  0x1
#define DROP_WRITES  0x2
#define ERROR_WRITES 0x4

/* The bi_opf bits a request of ours carries, for corrupt_bio_byte flags. */
#define KERNEL_REQ_OP_WRITE 0x1
#define KERNEL_REQ_FUA      (1u << 17)

#define MAX_FEATURE_ARGS 11      /* dm-flakey's limit */

struct flakey {
  /* The cycle: set by ctr and by the "intervals" message, read by every
   * request.  up and down in one word (up << 32 | down, seconds), so a
   * request never sees one interval old and the other new; a request
   * racing the message may see the new intervals against the old start.
   */
  _Atomic uint64_t born_ns;     /* CLOCK_MONOTONIC when the cycle began */
  _Atomic uint64_t intervals;
  /* Read-only after ctr. */
  struct backend *be;
  uint64_t start;               /* bytes into the backend */
  unsigned flags;               /* ERROR_READS | DROP_WRITES | ... */
  uint32_t corrupt_byte;        /* 1-based; 0: no corruption */
  bool corrupt_write;           /* direction w (else r) */
  uint8_t corrupt_value;
  uint32_t corrupt_flags;
};

/* The numbers, as messages name them. */
static const struct target_arg up_arg = {
  "up interval", "seconds", 0, UINT32_MAX,
};
static const struct target_arg down_arg = {
  "down interval", "seconds", 0, UINT32_MAX,
};
static const struct target_arg byte_arg = { "byte number", NULL, 1,
                                            UINT32_MAX };
static const struct target_arg value_arg = { "value", NULL, 0, 255 };
static const struct target_arg flags_arg = { "flags mask", NULL, 0,
                                             UINT32_MAX };

/* The features that set a flag, and the one each excludes; in dm's
 * order, which status follows.
 */
static const struct flag_feature {
  const char *name;
  unsigned flag, excludes;
} flag_features[] = {
  { "error_reads", ERROR_READS, 0 },
  { "drop_writes", DROP_WRITES, ERROR_WRITES },
  { "error_writes", ERROR_WRITES, DROP_WRITES },
};

static const struct flag_feature *
flag_feature_find (const char *name, unsigned flag)
{
  for (size_t i = 0; i < ARRAY_SIZE (flag_features); i++)
    if (name ? strcasecmp (name, flag_features[i].name) == 0
        : flag == flag_features[i].flag)
      return &flag_features[i];
  return NULL;
}

static int
flakey_flag_feature (struct flakey *fc, const struct flag_feature *ff,
                     struct mapper_err *err)
{
  if (fc->flags & ff->flag) {
    mapper_err_set (err, "feature %s duplicated", ff->name);
    return -EINVAL;
  }
  if (fc->flags & ff->excludes) {
    mapper_err_set (err, "feature %s conflicts with feature %s", ff->name,
                    flag_feature_find (NULL, ff->excludes)->name);
    return -EINVAL;
  }
  fc->flags |= ff->flag;
  return 0;
}

/* corrupt_bio_byte <Nth_byte> <r|w> <value> <flags>, from the feature
 * arguments after its name.
 */
static int
flakey_corrupt_feature (struct flakey *fc, struct target_args *as,
                        struct mapper_err *err)
{
  uint64_t byte, value, flags;
  const char *dir;
  int r;

  if (fc->corrupt_byte) {
    mapper_err_set (err, "feature corrupt_bio_byte duplicated");
    return -EINVAL;
  }
  if (as->argc < 4) {
    mapper_err_set (err, "feature corrupt_bio_byte requires 4 "
                    "parameters <Nth_byte> <r|w> <value> <flags>");
    return -EINVAL;
  }
  if ((r = target_read_arg (&byte_arg, as, &byte, err)) < 0)
    goto err;
  dir = target_shift_arg (as);
  if (strcasecmp (dir, "w") == 0)
    fc->corrupt_write = true;
  else if (strcasecmp (dir, "r") != 0) {
    mapper_err_set (err, "invalid direction '%s' (r or w)", dir);
    r = -EINVAL;
    goto err;
  }
  if ((r = target_read_arg (&value_arg, as, &value, err)) < 0 ||
      (r = target_read_arg (&flags_arg, as, &flags, err)) < 0)
    goto err;
  fc->corrupt_byte = byte;
  fc->corrupt_value = value;
  fc->corrupt_flags = flags;
  return 0;

 err:
  mapper_err_prefix (err, "corrupt_bio_byte");
  return r;
}

static int
flakey_features (struct flakey *fc, struct target_args *as,
                 struct mapper_err *err)
{
  struct target_args features;
  const char *name;
  unsigned clash;
  int r;

  if (as->argc == 0)
    goto error_all_io;
  r = target_read_group ("feature argument", 0, MAX_FEATURE_ARGS, true, as,
                         &features, err);
  if (r < 0)
    return r;
  while ((name = target_shift_arg (&features)) != NULL) {
    const struct flag_feature *ff = flag_feature_find (name, 0);

    if (ff)
      r = flakey_flag_feature (fc, ff, err);
    else if (strcasecmp (name, "corrupt_bio_byte") == 0)
      r = flakey_corrupt_feature (fc, &features, err);
    else {
      mapper_err_set (err, "unknown feature '%s' (error_reads, drop_writes, "
                      "error_writes, corrupt_bio_byte)", name);
      r = -EINVAL;
    }
    if (r < 0)
      return r;
  }

  /* Corrupting the data of requests that fail or are dropped: dm refuses. */
  if (fc->corrupt_byte) {
    clash = fc->flags & (fc->corrupt_write ? DROP_WRITES | ERROR_WRITES
                         : ERROR_READS);
    if (clash) {
      mapper_err_set (err, "%s is incompatible with corrupt_bio_byte with "
                      "the %s flag set", flag_feature_find (NULL, clash)->name,
                      fc->corrupt_write ? "WRITE" : "READ");
      return -EINVAL;
    }
  }
  if (fc->flags || fc->corrupt_byte)
    return 0;
 error_all_io:
  fc->flags = ERROR_READS | ERROR_WRITES;
  return 0;
}

/* <up_interval> <down_interval> from as, checked as dm checks them:
 * *packed for fc->intervals.
 */
static int
flakey_read_intervals (struct target_args *as, uint64_t *packed,
                       struct mapper_err *err)
{
  uint64_t up, down;
  int r;

  if ((r = target_read_arg (&up_arg, as, &up, err)) < 0 ||
      (r = target_read_arg (&down_arg, as, &down, err)) < 0)
    return r;
  if (up + down == 0) {
    mapper_err_set (err, "total (up + down) interval is zero");
    return -EINVAL;
  }
  if (up + down > UINT32_MAX) {
    mapper_err_set (err, "interval overflow: up %" PRIu64 " + down %" PRIu64
                    " seconds exceeds %" PRIu32, up, down, UINT32_MAX);
    return -EINVAL;
  }
  *packed = up << 32 | down;
  return 0;
}

static int
flakey_ctr (struct target *ti, unsigned argc, char **argv,
            struct mapper_err *err)
{
  struct target_args as = { argc, argv };
  struct flakey *fc;
  const char *dev;
  uint64_t intervals;
  int r;

  if (argc < 4) {
    mapper_err_set (err, "expected <dev> <offset> <up_interval> "
                    "<down_interval> [<#features> <features>...], got %u "
                    "argument%s", argc, argc == 1 ? "" : "s");
    return -EINVAL;
  }
  fc = calloc (1, sizeof *fc);
  if (fc == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  fc->born_ns = monotonic_ns ();
  dev = target_shift_arg (&as);
  if ((r = target_read_sectors ("offset", &as, &fc->start, err)) < 0 ||
      (r = flakey_read_intervals (&as, &intervals, err)) < 0)
    goto err;
  fc->intervals = intervals;
  if ((r = flakey_features (fc, &as, err)) < 0)
    goto err;
  r = target_get_backend (ti, dev, fc->start, ti->len, &fc->be, err);
  if (r < 0)
    goto err;
  ti->private = fc;
  return 0;

 err:
  free (fc);
  return r;
}

static void
flakey_dtr (struct target *ti)
{
  free (ti->private);
}

static bool
flakey_is_down (const struct flakey *fc)
{
  uint64_t iv = atomic_load_explicit (&fc->intervals, memory_order_relaxed);
  uint64_t up = iv >> 32, down = (uint32_t) iv;
  uint64_t born = atomic_load_explicit (&fc->born_ns, memory_order_relaxed);
  uint64_t now = monotonic_ns ();
  uint64_t elapsed = (now > born ? now - born : 0) / 1000000000;

  return elapsed % (up + down) >= up;
}

/* Ours (dm-flakey takes no messages): "intervals <up> <down>" sets new
 * intervals, checked as the table's are, and starts the cycle again now,
 * up first, as a reload would, without one.
 */
static int
flakey_message (struct target *ti, unsigned argc, char **argv, char *reply,
                size_t len, struct mapper_err *err)
{
  struct flakey *fc = ti->private;
  struct target_args as = { argc - 1, argv + 1 };
  uint64_t intervals;
  int r;

  if (argc == 0 || strcasecmp (argv[0], "intervals") != 0) {
    mapper_err_set (err, "unrecognised message '%s': flakey takes "
                    "'intervals <up_interval> <down_interval>'",
                    argc ? argv[0] : "");
    return -EINVAL;
  }
  if (argc != 3) {
    mapper_err_set (err, "intervals: expected <up_interval> "
                    "<down_interval>, got %u argument%s", argc - 1,
                    argc == 2 ? "" : "s");
    return -EINVAL;
  }
  if ((r = flakey_read_intervals (&as, &intervals, err)) < 0) {
    mapper_err_prefix (err, "intervals");
    return r;
  }
  atomic_store (&fc->born_ns, monotonic_ns ());
  atomic_store (&fc->intervals, intervals);
  return MESSAGE_TABLE_CHANGED;
}

static bool
corrupt_matches (const struct flakey *fc, const struct io_req *req)
{
  uint32_t opf = 0;

  if (!io_req_is_read (req))
    opf |= KERNEL_REQ_OP_WRITE;
  if (io_req_flags (req) & MAPPER_FUA)
    opf |= KERNEL_REQ_FUA;
  return (opf & fc->corrupt_flags) == fc->corrupt_flags;
}

/* corrupt_matches for a read: one carries no bi_opf bit (NBD reads are
 * never FUA), so only flags 0 match it.
 */
static bool
corrupt_matches_read (const struct flakey *fc)
{
  return fc->corrupt_flags == 0;
}

/* Read, then corrupt the returned data. */
static int
flakey_read_corrupt (struct flakey *fc, uint64_t off, uint64_t len,
                     char *buf)
{
  int r = io_sync (IO_READ, fc->be, fc->start + off, len, buf, 0);

  if (r == 0 && fc->corrupt_byte <= len)
    buf[fc->corrupt_byte - 1] = fc->corrupt_value;
  return r;
}

/* Every byte value, for corrupted writes (backends only read it). */
static const unsigned char byte_value[256] = {
#define B4(n) (n), (n) + 1, (n) + 2, (n) + 3
#define B16(n) B4 (n), B4 ((n) + 4), B4 ((n) + 8), B4 ((n) + 12)
#define B64(n) B16 (n), B16 ((n) + 16), B16 ((n) + 32), B16 ((n) + 48)
  B64 (0), B64 (64), B64 (128), B64 (192)
#undef B64
#undef B16
#undef B4
};

/* The client's buffer is const, and copying it all for one byte would be
 * a waste: send the bytes before the corrupt one, the corrupt byte from
 * a constant, and the bytes after, as three clones of the request.
 */
static int
flakey_write_corrupt (struct flakey *fc, struct io_req *req, uint64_t off,
                      uint64_t len, char *buf)
{
  uint64_t n = fc->corrupt_byte - 1;
  int r;

  if (n >= len)
    return io_emit (req, fc->be, fc->start + off, len, buf);
  if (n > 0 &&
      (r = io_emit (req, fc->be, fc->start + off, n, buf)) < 0)
    return r;
  r = io_emit (req, fc->be, fc->start + off + n, 1,
               (char *) &byte_value[fc->corrupt_value]);
  if (r == 0 && n + 1 < len)
    r = io_emit (req, fc->be, fc->start + off + n + 1, len - n - 1,
                 buf + n + 1);
  return r;
}

static int
flakey_map (struct target *ti, struct io_req *req, uint64_t off,
            uint64_t len, char *buf)
{
  struct flakey *fc = ti->private;

  if (flakey_is_down (fc)) {
    if (io_req_is_read (req)) {
      if (fc->flags & ERROR_READS)
        return -EIO;
      if (fc->corrupt_byte && !fc->corrupt_write &&
          corrupt_matches (fc, req))
        return flakey_read_corrupt (fc, off, len, buf);
    }
    else {
      if (fc->flags & DROP_WRITES)
        return 0;               /* nothing emitted: "done" */
      if (fc->flags & ERROR_WRITES)
        return -EIO;
      if (fc->corrupt_byte && fc->corrupt_write && buf &&
          corrupt_matches (fc, req))
        return flakey_write_corrupt (fc, req, off, len, buf);
    }
  }
  return io_emit (req, fc->be, fc->start + off, len, buf);
}

/* A flush is a write to dm: dropped or failed while down. */
static int
flakey_flush (struct target *ti, struct io_req *req)
{
  struct flakey *fc = ti->private;

  if ((fc->flags & ERROR_WRITES) && flakey_is_down (fc))
    return -EIO;
  return 0;
}

/* While down, reads that fail or come back corrupted hold no hole or
 * zeros whatever the backend says: data.  A read's corrupt byte is at
 * its Nth byte, so any byte may be one.
 */
static int
flakey_extents (struct target *ti, struct extent_walk *w, uint64_t off,
                uint64_t len)
{
  struct flakey *fc = ti->private;

  if (flakey_is_down (fc) &&
      ((fc->flags & ERROR_READS) ||
       (fc->corrupt_byte && !fc->corrupt_write &&
        corrupt_matches_read (fc))))
    return extent_walk_add (w, ti, off, len, 0);
  return extent_walk_backend (w, ti, off, fc->be, fc->start + off, len);
}

static size_t
flakey_status (struct target *ti, enum status_type type, char *buf,
               size_t len)
{
  struct flakey *fc = ti->private;
  uint64_t iv = atomic_load (&fc->intervals);
  unsigned nr;
  size_t used = 0;

  if (type == STATUSTYPE_INFO)
    return 0;
  /* dm's order: the flag features in flag_features' order, corrupt. */
  nr = __builtin_popcount (fc->flags) + (fc->corrupt_byte ? 5 : 0);
  EMIT ("%s %" PRIu64 " %" PRIu64 " %" PRIu64 " %u", backend_name (fc->be),
        fc->start >> MAPPER_SECTOR_SHIFT, iv >> 32, iv & UINT32_MAX, nr);
  for (size_t i = 0; i < ARRAY_SIZE (flag_features); i++)
    if (fc->flags & flag_features[i].flag)
      EMIT (" %s", flag_features[i].name);
  if (fc->corrupt_byte)
    EMIT (" corrupt_bio_byte %" PRIu32 " %c %u %" PRIu32, fc->corrupt_byte,
          fc->corrupt_write ? 'w' : 'r', fc->corrupt_value,
          fc->corrupt_flags);
  return used;
}

static int
flakey_iterate_backends (struct target *ti,
                         int (*fn) (struct target *, struct backend *,
                                    void *),
                         void *data)
{
  struct flakey *fc = ti->private;

  return fn (ti, fc->be, data);
}

const struct target_type flakey_target = {
  .name = "flakey",
  .version = { 1, 5, 0 },
  .ctr = flakey_ctr,
  .dtr = flakey_dtr,
  .map = flakey_map,
  .extents = flakey_extents,
  .status = flakey_status,
  .iterate_backends = flakey_iterate_backends,
  .flush = flakey_flush,
  .message = flakey_message,
};

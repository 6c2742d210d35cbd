/* nbdmapper engine: named devices whose dm-style tables remap byte ranges
 * onto shared backends.  This is the engine's one public header; it knows
 * nothing of nbdkit.  Functions that can fail on input return 0 or -errno
 * and fill a struct mapper_err (like dm's ti->error).
 */
#ifndef NBDMAPPER_ENGINE_H
#define NBDMAPPER_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MAPPER_VERSION_STRING PACKAGE_VERSION
#define MAPPER_SECTOR_SHIFT 9
#define MAPPER_SECTOR_SIZE (1u << MAPPER_SECTOR_SHIFT)
#define MAPPER_NAME_MAX 127      /* device names, like dm's DM_NAME_LEN - 1 */
#define MAPPER_RESERVED_NAME "control"

struct mapper_err {
  char msg[512];
};
void mapper_err_set (struct mapper_err *err, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

struct table;
struct device;

/* I/O flags (same meaning as nbdkit's). */
#define MAPPER_FUA        0x1
#define MAPPER_MAY_TRIM   0x2
#define MAPPER_FAST_ZERO  0x4
#define MAPPER_REQ_ONE    0x8

/* Extent types (same bits as NBD base:allocation). */
#define MAPPER_EXTENT_HOLE 0x1
#define MAPPER_EXTENT_ZERO 0x2
typedef int (*mapper_extent_fn) (void *opaque, uint64_t offset,
                                 uint64_t length, uint32_t type);

/* What a table (and so a device) can do, merged over its targets and
 * backends when the table is built.  Read-only afterwards.
 */
struct mapper_caps {
  uint64_t size;                /* bytes */
  bool can_write;
  bool can_flush;
  bool can_fua;                 /* honoured (natively or emulated) */
  bool can_trim;
  bool can_zero;
  bool can_fast_zero;
  bool can_extents;
  bool can_multi_conn;
  uint32_t block_min, block_pref, block_max;
};

/* engine.c */
typedef void (*mapper_log_fn) (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));
extern mapper_log_fn mapper_debug;   /* NULL: no debug output */
extern bool mapper_trace_io;         /* log each request's split */
const char *mapper_version (void);
/* Start the engine's threads (call after any fork: nbdkit .after_fork)
 * and stop them (nbdkit .cleanup).  0 or -errno.
 */
int engine_start (struct mapper_err *err);
void engine_stop (void);

/* backends/nbd.c: remote backends opened from now on use up to
 * connections connections each when the server allows multi-conn
 * (default 4), and fail a request with EIO when it could not be done
 * within timeout seconds (default 30).  0 keeps the current value.
 */
void engine_set_remote (unsigned connections, unsigned timeout);

/* table.c */
int table_parse (const char *text, const char *origin,
                 struct table **out, struct mapper_err *err);
int table_parse_file (const char *path, struct table **out,
                      struct mapper_err *err);
void table_free (struct table *t);
const struct mapper_caps *table_caps (const struct table *t);
size_t table_nr_targets (const struct table *t);
size_t table_nr_backends (const struct table *t);
/* "linear×2, striped" style one-line summary; returns bytes needed. */
size_t table_summary (const struct table *t, char *buf, size_t len);
/* The table in dmsetup table format (one line per target). */
size_t table_format (const struct table *t, char *buf, size_t len);

/* device.c */
int device_check_name (const char *name, struct mapper_err *err);
int device_create (const char *name, struct device **out,
                   struct mapper_err *err);
int device_load (struct device *dev, struct table *t);  /* takes t */
int device_suspend (struct device *dev, bool noflush);
int device_resume (struct device *dev, struct mapper_err *err);
void device_destroy (struct device *dev);
struct device *device_lookup (const char *name);
size_t device_count (void);
struct device *device_nth (size_t i);       /* in creation order */
const char *device_name (const struct device *dev);
/* Snapshot of the live table's capabilities (false if none is live). */
bool device_get_caps (struct device *dev, struct mapper_caps *caps);
size_t device_summary (struct device *dev, char *buf, size_t len);
void device_open_count_add (struct device *dev, int delta);

/* io.c: the request path.  Return 0 or -errno. */
int device_pread (struct device *dev, void *buf, uint32_t count,
                  uint64_t offset, uint32_t flags);
int device_pwrite (struct device *dev, const void *buf, uint32_t count,
                   uint64_t offset, uint32_t flags);
int device_zero (struct device *dev, uint32_t count, uint64_t offset,
                 uint32_t flags);
int device_trim (struct device *dev, uint32_t count, uint64_t offset,
                 uint32_t flags);
int device_flush (struct device *dev, uint32_t flags);
int device_extents (struct device *dev, uint32_t count, uint64_t offset,
                    uint32_t flags, mapper_extent_fn fn, void *opaque);

#endif /* NBDMAPPER_ENGINE_H */

/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-mapper-plugin: serves every device of the engine as an NBD
 * export.  Reads top to bottom: configuration, connections, sizes and
 * capabilities, I/O, then the plugin struct.
 */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ev.h>
#include <libnbd.h>
#include <openssl/crypto.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "engine.h"
#include "target.h"
#include "control.h"
#include "clients.h"

/* -D mapper.io=1: log how each request is split. */
NBDKIT_DLL_PUBLIC int mapper_debug_io = 0;
/* -D mapper.flush_per_target=1: flush once per target, not once per
 * backend: reproduces the "before" for the flush benchmark.
 */
NBDKIT_DLL_PUBLIC int mapper_debug_flush_per_target = 0;
/* -D mapper.inline_off=1: remote requests always go through the I/O
 * loop: the "before" of bench/bench-remote's QD1 rows, and the loop's
 * path in tests.
 */
NBDKIT_DLL_PUBLIC int mapper_debug_inline_off = 0;
/* -D mapper.stats_off=1: keep no I/O statistics: the "before" of
 * bench/bench-stats, never for production.
 */
NBDKIT_DLL_PUBLIC int mapper_debug_stats_off = 0;
/* -D mapper.crypt_openssl=1: the crypt target's AES-XTS through OpenSSL
 * even where the VAES transform runs: for tests and bench/bench-crypt.
 */
NBDKIT_DLL_PUBLIC int mapper_debug_crypt_openssl = 0;
/* -D mapper.crypt_vaes256=1: the crypt target's AES-XTS on 256-bit VAES
 * registers (what CPUs without AVX-512 run) even where the 512-bit
 * transform runs: for tests and bench/bench-crypt.
 */
NBDKIT_DLL_PUBLIC int mapper_debug_crypt_vaes256 = 0;

/* The first table file's device: the default export. */
static char *default_name;

/* Table files from the command line, in order (table= and tables=). */
static char **table_files;
static size_t nr_table_files;

static int
add_table_file (const char *path)
{
  char **p = realloc (table_files, (nr_table_files + 1) * sizeof *p);

  if (p == NULL || (p[nr_table_files] = strdup (path)) == NULL) {
    nbdkit_error ("%s: out of memory", path);
    if (p)
      table_files = p;
    return -1;
  }
  table_files = p;
  nr_table_files++;
  return 0;
}

static int
cmp_strings (const void *a, const void *b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

/* tables=DIR: every *.table in DIR, in name order (stable default). */
static int
add_table_dir (const char *dir)
{
  size_t first = nr_table_files;
  struct dirent *d;
  DIR *dp;

  dp = opendir (dir);
  if (dp == NULL) {
    nbdkit_error ("tables=%s: %s", dir, mapper_strerror (errno));
    return -1;
  }
  while ((errno = 0, d = readdir (dp)) != NULL) {
    size_t len = strlen (d->d_name);
    char *path;
    int r;

    if (len <= 6 || strcmp (d->d_name + len - 6, ".table") != 0)
      continue;
    if (asprintf (&path, "%s/%s", dir, d->d_name) == -1) {
      nbdkit_error ("tables=%s: out of memory", dir);
      closedir (dp);
      return -1;
    }
    r = add_table_file (path);
    free (path);
    if (r == -1) {
      closedir (dp);
      return -1;
    }
  }
  if (errno != 0) {
    nbdkit_error ("tables=%s: readdir: %s", dir, mapper_strerror (errno));
    closedir (dp);
    return -1;
  }
  closedir (dp);
  /* An empty DIR is fine (devices come from the control export), but
   * table_files may still be NULL: qsort must not see it.
   */
  if (nr_table_files > first)
    qsort (table_files + first, nr_table_files - first,
           sizeof *table_files, cmp_strings);
  return 0;
}

static bool have_tables_dir;

/* remote-connections=N, remote-timeout=SECONDS: N in [1, max]. */
static int
parse_remote (const char *key, const char *value, unsigned max,
              unsigned *out)
{
  if (nbdkit_parse_unsigned (key, value, out) == -1)
    return -1;
  if (*out < 1 || *out > max) {
    nbdkit_error ("%s=%s: must be between 1 and %u", key, value, max);
    return -1;
  }
  return 0;
}

static int
mapper_config (const char *key, const char *value)
{
  unsigned n;
  int r;

  if (strcmp (key, "table") == 0)
    return add_table_file (value);
  if (strcmp (key, "tables") == 0) {
    /* The last tables=DIR is where runtime changes are saved. */
    have_tables_dir = true;
    control_set_tables_dir (value);
    return add_table_dir (value);
  }
  if (strcmp (key, "remote-connections") == 0) {
    if (parse_remote (key, value, 64, &n) == -1)
      return -1;
    engine_set_remote (n, 0);
    return 0;
  }
  if (strcmp (key, "remote-timeout") == 0) {
    if (parse_remote (key, value, 86400, &n) == -1)
      return -1;
    engine_set_remote (0, n);
    return 0;
  }
  if (strcmp (key, "remote-poll-max-us") == 0) {
    if (nbdkit_parse_unsigned (key, value, &n) == -1)
      return -1;
    if (n > REMOTE_POLL_MAX_US_LIMIT) {
      nbdkit_error ("%s=%s: must be between 0 (off) and %u", key, value,
                    REMOTE_POLL_MAX_US_LIMIT);
      return -1;
    }
    engine_set_remote_poll (n);
    return 0;
  }
  if ((r = control_config (key, value)) != 0)
    return r == 1 ? 0 : -1;
  nbdkit_error ("unknown parameter '%s'", key);
  return -1;
}

static void
log_debug (const char *fmt, ...)
{
  va_list ap;
  char buf[4096];

  va_start (ap, fmt);
  vsnprintf (buf, sizeof buf, fmt, ap);
  va_end (ap);
  nbdkit_debug ("%s", buf);
}

/* The engine's events (a mirror leg failed, resync complete): nbdkit
 * 1.32 has no level between debug and error, and only error is printed
 * at the default verbosity, so they go out as errors.
 */
static void
log_event (const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  nbdkit_verror (fmt, ap);
  va_end (ap);
}

/* mapper_request_abandoned: nbdkit 1.32 tells a plugin neither that the
 * server is stopping nor that a client has gone, and waits for every
 * request in the plugin before it exits: only nbdkit_nanosleep ends
 * early then (it polls the quit pipe and, in a connection's thread, the
 * connection's status pipe and socket).  A zero sleep asks without
 * waiting.  In a thread of the plugin's own it sees only the quit pipe.
 */
static int
request_abandoned (void)
{
  if (nbdkit_nanosleep (0, 0) == -1 && errno == ESHUTDOWN)
    return -ESHUTDOWN;
  return 0;
}

/* The device name of a table file: basename without ".table". */
static char *
device_name_of (const char *path)
{
  const char *base = strrchr (path, '/');
  size_t len;

  base = base ? base + 1 : path;
  len = strlen (base);
  if (len > 6 && strcmp (base + len - 6, ".table") == 0)
    len -= 6;
  return strndup (base, len);
}

/* 0; -1 (reported); or, when quiet, -ENXIO without a message if the table
 * stacks on a device not loaded yet.
 */
static int
load_device (const char *path, bool quiet)
{
  struct mapper_err err = { "" };
  struct device *dev;
  struct table *t;
  char *name;
  bool read_only = false;
  int r;

  name = device_name_of (path);
  if (name == NULL) {
    nbdkit_error ("%s: out of memory", path);
    return -1;
  }
  r = device_create (name, &dev, &err);
  free (name);
  if (r < 0) {
    nbdkit_error ("%s: %s", path, err.msg);
    return -1;
  }
  /* What the control export saved besides the table: the uuid, that the
   * table is read-only, or that the device has no table (it then comes
   * back suspended and empty).
   */
  if ((r = control_restore (dev, path, &read_only)) != 0) {
    if (r == 1)
      return 0;
    device_destroy (dev);
    return -1;
  }
  if ((r = table_parse_file (path, &t, &err)) < 0) {
    device_destroy (dev);
    if (quiet && r == -ENXIO)
      return -ENXIO;
    nbdkit_error ("%s", err.msg);
    return -1;
  }
  if (read_only)
    table_set_read_only (t);
  if (device_check_table (dev, t, &err) < 0) {
    nbdkit_error ("%s: %s", path, err.msg);
    table_free (t);
    device_destroy (dev);
    return -1;
  }
  device_load (dev, t);
  if (device_resume (dev, &err) < 0) {
    nbdkit_error ("%s: %s", path, err.msg);
    device_destroy (dev);
    return -1;
  }
  return 0;
}

static int
mapper_config_complete (void)
{
  mapper_debug = log_debug;
  mapper_log = log_event;
  mapper_request_abandoned = request_abandoned;
  mapper_trace_io = mapper_debug_io != 0;
  mapper_flush_per_target = mapper_debug_flush_per_target != 0;
  mapper_stats_disabled = mapper_debug_stats_off != 0;
  mapper_inline_disabled = mapper_debug_inline_off != 0;
  mapper_crypt_openssl = mapper_debug_crypt_openssl != 0;
  mapper_crypt_vaes256 = mapper_debug_crypt_vaes256 != 0;
  nbdkit_debug ("crypt: AES-XTS by the %s transform",
                mapper_crypt_transform ());

  if (nr_table_files == 0 && !have_tables_dir) {
    nbdkit_error ("no tables: use table=FILE (repeatable) or tables=DIR "
                  "(which may start empty: devices are then created at "
                  "run time with nbdmsetup)");
    return -1;
  }
  if (control_config_complete () == -1)
    return -1;
  /* A table may stack on the device of a later file ("mapper:NAME"):
   * load in passes, deferring such tables while a pass makes progress;
   * what is left (a missing device, a cycle) is then reported.
   */
  {
    bool *done = calloc (nr_table_files ? nr_table_files : 1, sizeof *done);
    size_t left = nr_table_files;
    bool progress = true;
    int r = 0;

    if (done == NULL) {
      nbdkit_error ("calloc: %s", mapper_strerror (errno));
      return -1;
    }
    while (left > 0 && progress && r == 0) {
      progress = false;
      for (size_t i = 0; i < nr_table_files && r == 0; i++) {
        if (done[i])
          continue;
        r = load_device (table_files[i], true);
        if (r == 0) {
          done[i] = true;
          left--;
          progress = true;
        }
        else if (r == -ENXIO)
          r = 0;                /* try again after the others */
      }
    }
    for (size_t i = 0; i < nr_table_files && r == 0 && left > 0; i++)
      if (!done[i])
        r = load_device (table_files[i], false);   /* reports it */
    free (done);
    if (r < 0)
      return -1;
  }
  if (nr_table_files > 0)
    default_name = device_name_of (table_files[0]);
  return 0;
}

static int
mapper_after_fork (void)
{
  struct mapper_err err = { "" };

  if (engine_start (&err) < 0) {
    nbdkit_error ("%s", err.msg);
    return -1;
  }
  return 0;
}

static void
mapper_cleanup (void)
{
  engine_stop ();
}

static void
mapper_unload (void)
{
  size_t n;

  /* Newest first: a device stacked on another ("mapper:NAME") was loaded
   * after it and holds it open until its own table is freed.
   */
  while ((n = device_count ()) > 0)
    device_destroy (device_nth (n - 1));
  free (default_name);
  for (size_t i = 0; i < nr_table_files; i++)
    free (table_files[i]);
  free (table_files);
  control_unload ();
}

static void
mapper_dump_plugin (void)
{
  struct nbd_handle *nbd = nbd_create ();

  printf ("mapper_version=%s\n", mapper_version ());
  printf ("libnbd_version=%s\n", nbd ? nbd_get_version (nbd) : "unknown");
  printf ("libev_version=%d.%d\n", ev_version_major (), ev_version_minor ());
  printf ("openssl_version=%s\n", OpenSSL_version (OPENSSL_VERSION));
  printf ("mapper_targets=");
  for (size_t i = 0; i < target_type_count (); i++)
    printf ("%s%s", i ? " " : "", target_type_info (i, NULL));
  printf ("\n");
  printf ("mapper_backends=file nbd nbds nbd+unix nbds+unix mapper\n");
  if (nbd)
    nbd_close (nbd);
}

#define HELP_STR_(x) #x
#define HELP_STR(x) HELP_STR_ (x)
#define mapper_config_help \
  "[table=]FILE        A device table (repeatable); the device is named\n" \
  "                    after the file, without \".table\".  The first\n" \
  "                    one is also the default export.\n" \
  "tables=DIR          Every *.table file in DIR is a device; changes made\n" \
  "                    through the control export are saved there.\n" \
  "remote-connections=N  Connections per remote (NBD URI) backend when\n" \
  "                    the server allows multi-conn (default 4).\n" \
  "remote-timeout=SECONDS  A remote request not done by then (retries\n" \
  "                    after reconnecting included) fails with EIO\n" \
  "                    (default 30).\n" \
  "remote-poll-max-us=N  A worker waiting for a remote reply polls for it\n" \
  "                    up to N microseconds (adaptively) before it\n" \
  "                    sleeps (0: never; default " \
  HELP_STR (REMOTE_POLL_MAX_US_DEFAULT) ").\n" \
  "In a table, mapper:NAME names another device of this server\n" \
  "(stacking, in process, in any file order; no cycles).\n" \
  control_config_help

/* --- exports and connections ----------------------------------------- */

/* nbdkit refuses a list of more than 10,000 exports (and then fails the
 * whole NBD_OPT_LIST): past that, list the first ones (creation order)
 * and say so.  Every device still opens by name, and "nbdmsetup ls"
 * lists them all.
 */
#define MAX_LISTED_EXPORTS 10000

struct export_list {
  struct nbdkit_exports *exports;
  size_t n;
};

/* Under the registry lock: devices created or removed at run time
 * appear in / vanish from the list at once.
 */
static int
add_export (struct device *dev, void *opaque)
{
  struct export_list *l = opaque;
  char desc[256];

  if (l->n == MAX_LISTED_EXPORTS)
    return 1;
  device_summary (dev, desc, sizeof desc);
  if (nbdkit_add_export (l->exports, device_name (dev), desc) == -1)
    return -1;
  l->n++;
  return 0;
}

static int
mapper_list_exports (int readonly, int is_tls, struct nbdkit_exports *exports)
{
  struct export_list l = { exports, 0 };
  int r = device_foreach (add_export, &l);

  if (r == 1)
    nbdkit_debug ("list_exports: %zu devices, listing the first %d "
                  "(nbdkit's limit); the rest open by name",
                  device_count (), MAX_LISTED_EXPORTS);
  return r < 0 ? -1 : 0;
}

static int
first_name (struct device *dev, void *out)
{
  *(const char **) out = nbdkit_strdup_intern (device_name (dev));
  return 1;
}

static const char *
mapper_default_export (int readonly, int is_tls)
{
  /* The first table file's device, even if it was loaded after a device
   * it stacks on; else the first device (devices come and go at run
   * time through the control export).
   */
  const char *name = NULL;
  struct device *dev = default_name ? device_get (default_name) : NULL;

  if (dev) {
    name = nbdkit_strdup_intern (device_name (dev));
    device_put (dev);
    return name;
  }

  device_foreach (first_name, &name);
  return name;
}

/* A connection: to a device (holding a reference and an open count) or
 * to the control export.  Read-only after open, but errseq.
 */
struct handle {
  struct device *dev;
  struct control_conn *ctl;
  struct client *client;        /* nbdmsetup clients */
  /* Backend errors this connection has heard of (device_flush_errseq):
   * from its open on, its next flush after each fails once.
   */
  _Atomic uint64_t errseq;
};

static void *
mapper_open (int readonly)
{
  const char *name = nbdkit_export_name ();
  struct handle *h;
  struct device *dev;

  if (name == NULL || *name == '\0')
    name = mapper_default_export (readonly, 0);
  if (control_is_export (name)) {
    h = calloc (1, sizeof *h);
    if (h == NULL) {
      nbdkit_error ("calloc: %s", mapper_strerror (errno));
      return NULL;
    }
    h->ctl = control_open (readonly);
    if (h->ctl == NULL || (h->client = client_open (NULL)) == NULL) {
      if (h->ctl)
        control_close (h->ctl);
      free (h);
      return NULL;
    }
    return h;
  }
  dev = name ? device_open_conn (name) : NULL;
  if (dev == NULL) {
    nbdkit_error ("no such device: %s", name ? name : "(none)");
    errno = ENOENT;
    return NULL;
  }
  h = calloc (1, sizeof *h);
  if (h == NULL || (h->client = client_open (dev)) == NULL) {
    if (h == NULL)
      nbdkit_error ("calloc: %s", mapper_strerror (errno));
    free (h);
    device_close_conn (dev);
    return NULL;
  }
  h->dev = dev;
  atomic_init (&h->errseq, device_errseq_sample ());
  return h;
}

static void
mapper_close (void *handle)
{
  struct handle *h = handle;

  client_close (h->client);
  if (h->ctl)
    control_close (h->ctl);
  else
    device_close_conn (h->dev);
  free (h);
}

static const char *
mapper_export_description (void *handle)
{
  struct handle *h = handle;
  char desc[256];

  if (h->ctl)
    return "nbdmapper control export: write a request at offset 0, "
      "flush to execute it, read the response at 0 (see nbdmsetup(8))";
  device_summary (h->dev, desc, sizeof desc);
  return nbdkit_strdup_intern (desc);
}

/* Capabilities come from the live table at the time of the call; nbdkit
 * asks once per connection.
 */
static struct mapper_caps
caps_of (void *handle)
{
  struct handle *h = handle;
  struct mapper_caps c = { 0 };

  if (h->ctl) {
    /* Written and flushed by one client at a time: no more. */
    c.size = control_get_size (h->ctl);
    c.can_write = c.can_flush = true;
    c.block_min = 1;
    c.block_pref = 4096;
    c.block_max = 0xffffffff;
    return c;
  }
  device_get_caps (h->dev, &c);
  return c;
}

static int64_t
mapper_get_size (void *handle)
{
  return caps_of (handle).size;
}

static int
mapper_block_size (void *handle, uint32_t *minimum, uint32_t *preferred,
                   uint32_t *maximum)
{
  struct mapper_caps c = caps_of (handle);

  *minimum = c.block_min;
  *preferred = c.block_pref;
  *maximum = c.block_max;
  return 0;
}

static int mapper_can_write (void *h) { return caps_of (h).can_write; }
static int mapper_can_flush (void *h) { return caps_of (h).can_flush; }
static int mapper_can_trim (void *h) { return caps_of (h).can_trim; }
static int mapper_can_zero (void *h) { return caps_of (h).can_zero; }
static int mapper_can_fast_zero (void *h) { return caps_of (h).can_fast_zero; }
static int mapper_can_extents (void *h) { return caps_of (h).can_extents; }
static int mapper_can_multi_conn (void *h)
{
  return caps_of (h).can_multi_conn;
}

static int
mapper_can_fua (void *h)
{
  /* Native where the backends have it, emulated by flushing the touched
   * backends otherwise: either way the engine honours the flag itself.
   */
  return caps_of (h).can_fua ? NBDKIT_FUA_NATIVE : NBDKIT_FUA_NONE;
}

static int
mapper_can_cache (void *h)
{
  return NBDKIT_CACHE_NONE;
}

/* --- I/O --------------------------------------------------------------- */

static uint32_t
engine_flags (uint32_t flags)
{
  return ((flags & NBDKIT_FLAG_FUA) ? MAPPER_FUA : 0) |
    ((flags & NBDKIT_FLAG_MAY_TRIM) ? MAPPER_MAY_TRIM : 0) |
    ((flags & NBDKIT_FLAG_FAST_ZERO) ? MAPPER_FAST_ZERO : 0) |
    ((flags & NBDKIT_FLAG_REQ_ONE) ? MAPPER_REQ_ONE : 0);
}

/* Engine result -> nbdkit: errno set in this (worker) thread. */
static int
result (int r)
{
  if (r == 0)
    return 0;
  nbdkit_set_error (-r);
  return -1;
}

/* Each request counts in its connection's record (nbdmsetup clients)
 * while it runs.
 */
#define COUNTED(h, call)                                                \
  ({                                                                    \
    struct client_slot *cs_ = client_request_start ((h)->client);       \
    int r_ = (call);                                                    \
    client_request_end (cs_);                                           \
    r_;                                                                 \
  })

static int
mapper_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
              uint32_t flags)
{
  struct handle *h = handle;
  if (h->ctl)
    return COUNTED (h, control_pread (h->ctl, buf, count, offset));
  return COUNTED (h, result (device_pread (h->dev, buf, count, offset,
                                           engine_flags (flags))));
}

static int
mapper_pwrite (void *handle, const void *buf, uint32_t count,
               uint64_t offset, uint32_t flags)
{
  struct handle *h = handle;
  if (h->ctl)
    return COUNTED (h, control_pwrite (h->ctl, buf, count, offset));
  return COUNTED (h, result (device_pwrite (h->dev, buf, count, offset,
                                            engine_flags (flags))));
}

static int
mapper_flush (void *handle, uint32_t flags)
{
  struct handle *h = handle;
  if (h->ctl)
    return COUNTED (h, control_flush (h->ctl));
  return COUNTED (h, result (device_flush_errseq (h->dev,
                                                  engine_flags (flags),
                                                  &h->errseq)));
}

static int
mapper_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  struct handle *h = handle;
  return COUNTED (h, result (device_trim (h->dev, count, offset,
                                          engine_flags (flags))));
}

static int
mapper_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  struct handle *h = handle;
  return COUNTED (h, result (device_zero (h->dev, count, offset,
                                          engine_flags (flags))));
}

static int
add_extent (void *opaque, uint64_t offset, uint64_t length, uint32_t type)
{
  return nbdkit_add_extent (opaque, offset, length, type) == -1 ? -errno : 0;
}

static int
mapper_extents (void *handle, uint32_t count, uint64_t offset,
                uint32_t flags, struct nbdkit_extents *extents)
{
  struct handle *h = handle;
  return COUNTED (h, result (device_extents (h->dev, count, offset,
                                             engine_flags (flags),
                                             add_extent, extents)));
}

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static struct nbdkit_plugin plugin = {
  .name               = "mapper",
  .longname           = "nbdmapper: device-mapper for the network",
  .version            = PACKAGE_VERSION,
  .description        = "Serves named block devices defined by dm-style "
                        "tables over local files, block devices and "
                        "remote NBD servers.",
  .magic_config_key   = "table",
  .config             = mapper_config,
  .config_help        = mapper_config_help,
  .config_complete    = mapper_config_complete,
  .after_fork         = mapper_after_fork,
  .cleanup            = mapper_cleanup,
  .unload             = mapper_unload,
  .dump_plugin        = mapper_dump_plugin,

  .list_exports       = mapper_list_exports,
  .default_export     = mapper_default_export,
  .open               = mapper_open,
  .close              = mapper_close,
  .export_description = mapper_export_description,

  .get_size           = mapper_get_size,
  .block_size         = mapper_block_size,
  .can_write          = mapper_can_write,
  .can_flush          = mapper_can_flush,
  .can_trim           = mapper_can_trim,
  .can_zero           = mapper_can_zero,
  .can_fast_zero      = mapper_can_fast_zero,
  .can_extents        = mapper_can_extents,
  .can_fua            = mapper_can_fua,
  .can_multi_conn     = mapper_can_multi_conn,
  .can_cache          = mapper_can_cache,

  .pread              = mapper_pread,
  .pwrite             = mapper_pwrite,
  .flush              = mapper_flush,
  .trim               = mapper_trim,
  .zero               = mapper_zero,
  .extents            = mapper_extents,
  .errno_is_preserved = 0,
};

NBDKIT_REGISTER_PLUGIN (plugin)

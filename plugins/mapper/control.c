/* The control export.  A client reads the HELLO (nonce) at offset 0,
 * writes one request at offset 0, FLUSHes to execute it and reads the
 * response at offset 0.  All device changes are serialised by one lock
 * and are atomic: a failed command leaves the server as it was.  With
 * tables=DIR every change is persisted there (temp file, fsync, rename,
 * fsync dir) before it is made visible.
 */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "engine.h"
#include "proto.h"
#include "control.h"

#define MIN_SIZE(a, b) ((a) < (b) ? (a) : (b))

/* Read-only after config_complete. */
static uint8_t *key;            /* NULL: no key, Unix peers by uid */
static size_t keylen;
static char *tables_dir;        /* NULL: no persistence */

/* Serialises every command that reads or changes devices (not wait). */
static pthread_mutex_t control_lock = PTHREAD_MUTEX_INITIALIZER;

struct control_conn {
  pthread_mutex_t lock;         /* protects everything below */
  uint8_t nonce[PROTO_NONCE_LEN];
  uint64_t last_seq;            /* highest sequence number accepted */
  char *denied;                 /* non-NULL: why this peer may not control */
  uint8_t *req;                 /* grows only as written */
  size_t req_len, req_cap;
  uint8_t *rsp;                 /* the last response (or the HELLO) */
  size_t rsp_len;
};

/* --- configuration ----------------------------------------------------- */

int
control_config (const char *k, const char *value)
{
  char errmsg[256];

  if (strcmp (k, "control-key") != 0)
    return 0;
  if (key) {
    nbdkit_error ("control-key given twice");
    return -1;
  }
  if (proto_read_key (value, &key, &keylen, errmsg, sizeof errmsg) == -1) {
    nbdkit_error ("control-key: %s", errmsg);
    return -1;
  }
  return 1;
}

void
control_set_tables_dir (const char *dir)
{
  free (tables_dir);
  tables_dir = strdup (dir);
}

static int remove_stale_tmp (void);

int
control_config_complete (void)
{
  /* A read-only DIR is reported now, not at the first change. */
  if (tables_dir && access (tables_dir, W_OK | X_OK) == -1) {
    nbdkit_error ("tables=%s: not writable (%s): runtime changes from the "
                  "control export could not be saved there", tables_dir,
                  mapper_strerror (errno));
    return -1;
  }
  if (tables_dir && remove_stale_tmp () == -1)
    return -1;
  return 0;
}

void
control_unload (void)
{
  if (key)
    OPENSSL_cleanse (key, keylen);
  free (key);
  free (tables_dir);
}

/* --- persistence ------------------------------------------------------- */

static int
fsync_dir (void)
{
  int fd = open (tables_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int r;

  if (fd == -1)
    return -errno;
  r = fsync (fd) == -1 ? -errno : 0;
  close (fd);
  return r;
}

/* persist_write's DIR/.NAME.table.tmp files left by a crash: that save
 * never finished (NAME.table is still the one before it, and the change
 * was never made live), and they may hold crypt keys.
 */
static int
remove_stale_tmp (void)
{
  DIR *dp = opendir (tables_dir);
  const size_t sfx = strlen (".table.tmp");
  struct dirent *d;
  bool removed = false;
  int r = 0;

  if (dp == NULL) {
    nbdkit_error ("tables=%s: %s", tables_dir, mapper_strerror (errno));
    return -1;
  }
  while (r == 0 && (errno = 0, d = readdir (dp)) != NULL) {
    size_t len = strlen (d->d_name);
    struct stat st;

    if (d->d_name[0] != '.' || len <= sfx + 1 ||
        strcmp (d->d_name + len - sfx, ".table.tmp") != 0 ||
        fstatat (dirfd (dp), d->d_name, &st, AT_SYMLINK_NOFOLLOW) == -1 ||
        !S_ISREG (st.st_mode))
      continue;                 /* not one of ours */
    if (unlinkat (dirfd (dp), d->d_name, 0) == -1) {
      nbdkit_error ("tables=%s: removing %s, left by a save that did not "
                    "finish: %s", tables_dir, d->d_name,
                    mapper_strerror (errno));
      r = -1;
    }
    else {
      nbdkit_debug ("tables=%s: removed %s, left by a save that did not "
                    "finish (the server stopped during it)", tables_dir,
                    d->d_name);
      removed = true;
    }
  }
  if (r == 0 && errno != 0) {
    nbdkit_error ("tables=%s: readdir: %s", tables_dir,
                  mapper_strerror (errno));
    r = -1;
  }
  closedir (dp);
  if (r == 0 && removed && (r = fsync_dir ()) < 0) {
    nbdkit_error ("tables=%s: fsync: %s", tables_dir, mapper_strerror (-r));
    r = -1;
  }
  return r;
}

#define UUID_TAG "# nbdmapper-uuid: "
#define NO_TABLE_TAG "# nbdmapper-no-table"

int
control_restore (struct device *dev, const char *path)
{
  struct mapper_err err = { "" };
  FILE *fp = fopen (path, "r");
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  int r = 0;

  if (fp == NULL)
    return 0;                   /* table_parse_file reports it */
  while (r == 0 && (n = getline (&line, &cap, fp)) > 0) {
    if (line[n - 1] == '\n')
      line[--n] = '\0';
    if (strncmp (line, UUID_TAG, strlen (UUID_TAG)) == 0) {
      if (device_set_uuid (dev, line + strlen (UUID_TAG), &err) < 0) {
        nbdkit_error ("%s: %s", path, err.msg);
        r = -1;
      }
    }
    else if (strcmp (line, NO_TABLE_TAG) == 0)
      r = 1;
    else if (line[0] != '#')
      break;                    /* the header ends at the first table line */
  }
  free (line);
  fclose (fp);
  return r;
}

/* DIR/NAME.table := header + text, atomically. */
static int
persist_write (const char *name, const char *uuid, const char *text,
               char **msg)
{
  char *tmp = NULL, *path = NULL, *all = NULL;
  size_t len;
  int fd = -1, r = 0;

  if (tables_dir == NULL)
    return 0;
  if (asprintf (&all, "%s%s%s%s%s", uuid ? UUID_TAG : "", uuid ? uuid : "",
                uuid ? "\n" : "", *text ? "" : NO_TABLE_TAG "\n",
                text) == -1) {
    all = NULL;
    r = -ENOMEM;
    goto out;
  }
  text = all;
  len = strlen (text);
  if (asprintf (&tmp, "%s/.%s.table.tmp", tables_dir, name) == -1 ||
      asprintf (&path, "%s/%s.table", tables_dir, name) == -1) {
    r = -ENOMEM;
    goto out;
  }
  /* 0600: a crypt table holds its key in clear. */
  fd = open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd == -1) {
    r = -errno;
    goto out;
  }
  for (size_t done = 0; done < len; ) {
    ssize_t n = write (fd, text + done, len - done);
    if (n == -1) {
      r = -errno;
      goto out;
    }
    done += n;
  }
  if (fsync (fd) == -1 || close (fd) == -1) {
    r = -errno;
    fd = -1;
    goto out;
  }
  fd = -1;
  if (rename (tmp, path) == -1) {
    r = -errno;
    goto out;
  }
  r = fsync_dir ();
 out:
  if (fd >= 0)
    close (fd);
  if (r < 0) {
    if (tmp)
      unlink (tmp);
    if (asprintf (msg, "tables=%s: saving %s.table: %s", tables_dir, name,
                  mapper_strerror (-r)) == -1)
      *msg = NULL;
  }
  free (tmp);
  free (path);
  free (all);
  return r;
}

static int
persist_remove (const char *name, char **msg)
{
  char *path;
  int r = 0;

  if (tables_dir == NULL)
    return 0;
  if (asprintf (&path, "%s/%s.table", tables_dir, name) == -1)
    return -ENOMEM;
  if (unlink (path) == -1 && errno != ENOENT)
    r = -errno;
  else
    r = fsync_dir ();
  if (r < 0 && asprintf (msg, "tables=%s: removing %s.table: %s",
                         tables_dir, name, mapper_strerror (-r)) == -1)
    *msg = NULL;
  free (path);
  return r;
}

static int
persist_rename (const char *old, const char *new, char **msg)
{
  char *from = NULL, *to = NULL;
  int r = 0;

  if (tables_dir == NULL)
    return 0;
  if (asprintf (&from, "%s/%s.table", tables_dir, old) == -1 ||
      asprintf (&to, "%s/%s.table", tables_dir, new) == -1)
    r = -ENOMEM;
  else if (rename (from, to) == -1)
    r = -errno;
  else
    r = fsync_dir ();
  if (r < 0 && asprintf (msg, "tables=%s: renaming %s.table: %s",
                         tables_dir, old, mapper_strerror (-r)) == -1)
    *msg = NULL;
  free (from);
  free (to);
  return r;
}

/* --- command execution ------------------------------------------------- */

/* The result of one command: status + payload (or error message). */
struct reply {
  unsigned status;
  uint32_t flags;               /* the request's PROTO_F_* */
  FILE *out;                    /* payload under construction */
  char *text;
  size_t len;
};

static int
fail (struct reply *rp, int err, const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));
static int
fail (struct reply *rp, int err, const char *fmt, ...)
{
  va_list ap;

  rp->status = proto_status_of_errno (err);
  if (rp->status == PROTO_OK)
    rp->status = PROTO_ERR_INVALID;
  rewind (rp->out);
  va_start (ap, fmt);
  vfprintf (rp->out, fmt, ap);
  va_end (ap);
  return -1;
}

static int
need_args (struct reply *rp, const struct proto_request *req,
           unsigned min, unsigned max)
{
  if (req->nargs < min || req->nargs > max)
    return fail (rp, EINVAL, "%s: takes %u to %u arguments, got %u",
                 proto_cmd_name (req->cmd), min, max, req->nargs);
  return 0;
}

/* A referenced device, or a NOENT reply. */
static struct device *
get_device (struct reply *rp, const char *cmd, const char *name)
{
  struct device *dev = device_get (name);

  if (dev == NULL)
    fail (rp, ENOENT, "%s: no such device: %s", cmd, name);
  return dev;
}

static struct table *
parse_table (struct reply *rp, const char *cmd, const char *name,
             const char *text)
{
  struct mapper_err err = { "" };
  struct table *t;
  char origin[MAPPER_NAME_MAX + 64];
  int r;

  snprintf (origin, sizeof origin, "%s %s", cmd, name);
  r = table_parse (text, origin, &t, &err);
  if (r < 0) {
    fail (rp, -r, "%s", err.msg);
    return NULL;
  }
  return t;
}

/* A table must not make dev stack on itself (mapper:NAME backends). */
static int
check_stacking (struct reply *rp, const char *cmd, struct device *dev,
                struct table *t)
{
  struct mapper_err err = { "" };
  int r = device_check_table (dev, t, &err);

  if (r < 0)
    return fail (rp, -r, "%s %s: %s", cmd, device_name (dev), err.msg);
  return 0;
}

static int
cmd_version (struct reply *rp, struct proto_request *req)
{
  fprintf (rp->out, "%s\t%d\n", mapper_version (), PROTO_VERSION);
  return 0;
}

static int
list_one (struct device *dev, void *opaque)
{
  struct reply *rp = opaque;
  struct device_info info;

  device_get_info (dev, &info);
  fprintf (rp->out, "%s\t%" PRIu64 "\t%s\n", device_name (dev), info.size,
           info.suspended ? "SUSPENDED" : "ACTIVE");
  return 0;
}

static int
cmd_list (struct reply *rp, struct proto_request *req)
{
  if (need_args (rp, req, 0, 0) == -1)
    return -1;
  device_foreach (list_one, rp);
  return 0;
}

static int
info_one (struct device *dev, void *opaque)
{
  struct reply *rp = opaque;
  struct device_info info;
  char *uuid = device_uuid (dev);

  char *holders = device_holders (dev);

  device_get_info (dev, &info);
  /* The holders (tab-separated names) last: a line may have any number. */
  fprintf (rp->out, "%s\t%s\t%d\t%d\t%u\t%" PRIu64 "\t%zu\t%s\t%" PRIu64
           "\t%s\n", device_name (dev),
           info.suspended ? "SUSPENDED" : "ACTIVE", info.live,
           info.inactive, info.open_count, info.event_nr, info.nr_targets,
           uuid ? uuid : "", info.size, holders ? holders : "");
  free (uuid);
  free (holders);
  return 0;
}

/* Run fn on one named device or, with no name, on all of them. */
static int
one_or_all (struct reply *rp, struct proto_request *req,
            int (*fn) (struct device *, void *))
{
  struct device *dev;

  if (need_args (rp, req, 0, 1) == -1)
    return -1;
  if (req->nargs == 0) {
    if (device_foreach (fn, rp) != 0)
      return -1;
    return 0;
  }
  dev = get_device (rp, proto_cmd_name (req->cmd), req->args[0]);
  if (dev == NULL)
    return -1;
  int r = fn (dev, rp);
  device_put (dev);
  return r ? -1 : 0;
}

static int
cmd_info (struct reply *rp, struct proto_request *req)
{
  return one_or_all (rp, req, info_one);
}

/* "name\tline" for each line of text; "name\t" alone for an empty one. */
static void
emit_lines (FILE *out, const char *name, const char *text)
{
  if (*text == '\0') {
    fprintf (out, "%s\t\n", name);
    return;
  }
  while (*text) {
    const char *nl = strchr (text, '\n');
    size_t n = nl ? (size_t) (nl - text) : strlen (text);
    fprintf (out, "%s\t%.*s\n", name, (int) n, text);
    text += n + (nl != NULL);
  }
}

static int
table_one (struct device *dev, void *opaque)
{
  struct reply *rp = opaque;
  bool inactive = rp->flags & PROTO_F_INACTIVE;
  int r = 0;
  char *text = device_table_text (dev, inactive, &r);

  if (text == NULL)
    return fail (rp, -r, "table: out of memory");
  if (!(rp->flags & PROTO_F_SHOWKEYS))
    proto_mask_crypt_keys (text);
  emit_lines (rp->out, device_name (dev), text);
  free (text);
  return 0;
}

static int
cmd_table (struct reply *rp, struct proto_request *req)
{
  return one_or_all (rp, req, table_one);
}

static int
status_one (struct device *dev, void *opaque)
{
  struct reply *rp = opaque;
  int r = 0;
  char *text = rp->flags & PROTO_F_BACKENDS ? device_backends_text (dev, &r)
    : device_status_text (dev, &r);

  if (text == NULL)
    return fail (rp, -r, "status: out of memory");
  emit_lines (rp->out, device_name (dev), text);
  free (text);
  return 0;
}

static int
cmd_status (struct reply *rp, struct proto_request *req)
{
  return one_or_all (rp, req, status_one);
}

static int
cmd_targets (struct reply *rp, struct proto_request *req)
{
  unsigned v[3];
  const char *name;

  if (need_args (rp, req, 0, 0) == -1)
    return -1;
  for (size_t i = 0; (name = target_type_info (i, v)) != NULL; i++)
    fprintf (rp->out, "%s\t%u.%u.%u\n", name, v[0], v[1], v[2]);
  return 0;
}

/* Persist what dev's live table will be (text) under name; on failure
 * the reply says why.
 */
static int
save (struct reply *rp, const char *name, const char *uuid,
      const char *text)
{
  char *msg = NULL;
  int r = persist_write (name, uuid, text, &msg);

  if (r < 0) {
    fail (rp, -r, "%s", msg ? msg : "out of memory");
    free (msg);
    return -1;
  }
  return 0;
}

static char *
format_table (struct reply *rp, struct table *t)
{
  size_t n = table_format (t, NULL, 0);
  char *text = malloc (n + 1);

  if (text == NULL) {
    fail (rp, ENOMEM, "out of memory");
    return NULL;
  }
  table_format (t, text, n + 1);
  return text;
}

static int
cmd_create (struct reply *rp, struct proto_request *req)
{
  struct mapper_err err = { "" };
  struct table *t = NULL;
  struct device *dev;
  const char *name, *uuid;
  char *text = NULL;
  int r;

  if (need_args (rp, req, 2, 3) == -1)
    return -1;
  name = req->args[0];
  uuid = req->args[1];
  if ((r = device_check_name (name, &err)) < 0)
    return fail (rp, -r, "create: %s", err.msg);
  if ((dev = device_get (name)) != NULL) {
    device_put (dev);
    return fail (rp, EEXIST, "create: device '%s' already exists", name);
  }
  if (req->nargs == 3) {
    if ((t = parse_table (rp, "create", name, req->args[2])) == NULL)
      return -1;
    if ((text = format_table (rp, t)) == NULL)
      goto err;
  }
  if ((r = device_create (name, &dev, &err)) < 0) {
    fail (rp, -r, "create: %s", err.msg);
    goto err;
  }
  if (*uuid && (r = device_set_uuid (dev, uuid, &err)) < 0) {
    fail (rp, -r, "create %s: %s", name, err.msg);
    goto err_dev;
  }
  if (save (rp, name, *uuid ? uuid : NULL, text ? text : "") == -1)
    goto err_dev;
  if (t) {
    device_load (dev, t);
    t = NULL;
    if ((r = device_resume (dev, &err)) < 0) {
      fail (rp, -r, "create %s: %s", name, err.msg);
      char *msg = NULL;
      persist_remove (name, &msg);
      free (msg);
      goto err_dev;
    }
  }
  free (text);
  return 0;

 err_dev:
  device_destroy (dev);
 err:
  table_free (t);
  free (text);
  return -1;
}

static int
cmd_load (struct reply *rp, struct proto_request *req)
{
  struct device *dev;
  struct table *t;

  if (need_args (rp, req, 2, 2) == -1)
    return -1;
  if ((dev = get_device (rp, "load", req->args[0])) == NULL)
    return -1;
  t = parse_table (rp, "load", req->args[0], req->args[1]);
  if (t && check_stacking (rp, "load", dev, t) == -1) {
    table_free (t);
    t = NULL;
  }
  if (t)
    device_load (dev, t);
  device_put (dev);
  return t ? 0 : -1;
}

static int
cmd_clear (struct reply *rp, struct proto_request *req)
{
  struct device *dev;

  if (need_args (rp, req, 1, 1) == -1)
    return -1;
  if ((dev = get_device (rp, "clear", req->args[0])) == NULL)
    return -1;
  device_clear (dev);
  device_put (dev);
  return 0;
}

static int
cmd_suspend (struct reply *rp, struct proto_request *req)
{
  struct device *dev;
  int r;

  if (need_args (rp, req, 1, 1) == -1)
    return -1;
  if ((dev = get_device (rp, "suspend", req->args[0])) == NULL)
    return -1;
  r = device_suspend (dev, req->flags & PROTO_F_NOFLUSH);
  device_put (dev);
  if (r < 0)
    return fail (rp, -r, "suspend %s: flush failed: %s", req->args[0],
                 mapper_strerror (-r));
  return 0;
}

/* Put back DIR/NAME.table as it was (text: its live table) after a
 * command saved the table it was about to make live and then failed
 * without making it so.
 */
static void
unsave (const char *name, const char *uuid, const char *text)
{
  char *msg = NULL;

  if (persist_write (name, uuid, text, &msg) < 0)
    nbdkit_error ("%s", msg ? msg : "out of memory");
  free (msg);
}

static int
cmd_resume (struct reply *rp, struct proto_request *req)
{
  struct mapper_err err = { "" };
  struct device_info info;
  struct device *dev;
  char *text = NULL, *old_text = NULL, *uuid = NULL;
  bool swapped = false;
  int r = 0;

  if (need_args (rp, req, 1, 1) == -1)
    return -1;
  if ((dev = get_device (rp, "resume", req->args[0])) == NULL)
    return -1;
  device_get_info (dev, &info);
  if (info.inactive) {
    /* The inactive table becomes live: check it can, then save it
     * first (a crash after the save restarts with it).
     */
    if ((r = device_check_resume (dev, &err)) < 0) {
      fail (rp, -r, "resume %s: %s", req->args[0], err.msg);
      goto out;
    }
    uuid = device_uuid (dev);
    if ((text = device_table_text (dev, true, &r)) == NULL ||
        (old_text = device_table_text (dev, false, &r)) == NULL) {
      r = fail (rp, -r, "out of memory");
      goto out;
    }
    if ((r = save (rp, req->args[0], uuid, text)) < 0)
      goto out;
  }
  if ((r = device_resume_swapped (dev, &swapped, &err)) < 0) {
    if (info.inactive && !swapped)
      unsave (req->args[0], uuid, old_text);
    fail (rp, -r, "resume: %s", err.msg);
  }
 out:
  free (text);
  free (old_text);
  free (uuid);
  device_put (dev);
  return r < 0 ? -1 : 0;
}

static int
cmd_replace (struct reply *rp, struct proto_request *req)
{
  struct mapper_err err = { "" };
  struct device *dev;
  struct table *t = NULL;
  char *text = NULL, *old_text = NULL, *uuid = NULL;
  bool swapped = false;
  int r = -1;

  if (need_args (rp, req, 2, 2) == -1)
    return -1;
  if ((dev = get_device (rp, "replace", req->args[0])) == NULL)
    return -1;
  t = parse_table (rp, "replace", req->args[0], req->args[1]);
  if (t == NULL || check_stacking (rp, "replace", dev, t) == -1 ||
      (text = format_table (rp, t)) == NULL)
    goto out;
  /* Before anything is saved: a table that would break a device stacked
   * on this one is refused, and a crash must not leave it in DIR.
   */
  if ((r = device_check_holders (dev, t, &err)) < 0) {
    r = fail (rp, -r, "replace %s: %s", req->args[0], err.msg);
    goto out;
  }
  uuid = device_uuid (dev);
  /* Kept to put the file back if the swap itself fails. */
  if ((old_text = device_table_text (dev, false, &r)) == NULL) {
    fail (rp, -r, "out of memory");
    r = -1;
    goto out;
  }
  if ((r = save (rp, req->args[0], uuid, text)) == -1)
    goto out;
  r = device_replace (dev, t, &swapped, &err);
  t = NULL;                     /* taken, even on failure */
  if (r < 0) {
    /* Swapped but not flushed: the new table is live, and stays saved. */
    if (!swapped)
      unsave (req->args[0], uuid, old_text);
    fail (rp, -r, "replace: %s", err.msg);
  }
 out:
  table_free (t);
  free (text);
  free (old_text);
  free (uuid);
  device_put (dev);
  return r < 0 ? -1 : 0;
}

static int
cmd_remove (struct reply *rp, struct proto_request *req)
{
  struct mapper_err err = { "" };
  struct device *dev;
  char *msg = NULL;
  int r;

  if (need_args (rp, req, 1, 1) == -1)
    return -1;
  if ((dev = get_device (rp, "remove", req->args[0])) == NULL)
    return -1;
  r = device_remove (dev, req->flags & PROTO_F_FORCE, &err);
  device_put (dev);
  if (r < 0)
    return fail (rp, -r, "remove: %s", err.msg);
  if (persist_remove (req->args[0], &msg) < 0) {
    /* The device is gone; say the file could not follow. */
    fail (rp, EIO, "%s", msg ? msg : "out of memory");
    free (msg);
    return -1;
  }
  return 0;
}

static int
cmd_rename (struct reply *rp, struct proto_request *req)
{
  struct mapper_err err = { "" };
  struct device *dev, *other;
  char *msg = NULL;
  int r;

  if (need_args (rp, req, 2, 2) == -1)
    return -1;
  if ((r = device_check_name (req->args[1], &err)) < 0)
    return fail (rp, -r, "rename: %s", err.msg);
  if ((dev = get_device (rp, "rename", req->args[0])) == NULL)
    return -1;
  if ((other = device_get (req->args[1])) != NULL) {
    device_put (other);
    device_put (dev);
    return fail (rp, EEXIST, "rename: device '%s' already exists",
                 req->args[1]);
  }
  /* A held device is refused before its file is renamed: renamed and
   * back, a crash in between (or a failed rename back) left a tables=DIR
   * whose holder names a device it no longer has, which does not start.
   */
  if ((r = device_check_rename (dev, &err)) < 0) {
    device_put (dev);
    return fail (rp, -r, "rename: %s", err.msg);
  }
  if (persist_rename (req->args[0], req->args[1], &msg) < 0) {
    device_put (dev);
    fail (rp, EIO, "%s", msg ? msg : "out of memory");
    free (msg);
    return -1;
  }
  r = device_rename (dev, req->args[1], &err);
  device_put (dev);
  if (r < 0) {
    persist_rename (req->args[1], req->args[0], &msg);
    free (msg);
    return fail (rp, -r, "rename: %s", err.msg);
  }
  return 0;
}

static int
cmd_message (struct reply *rp, struct proto_request *req)
{
  struct mapper_err err = { "" };
  struct device *dev;
  uint64_t sector = 0;
  char *reply = NULL, *end;
  int r;

  if (need_args (rp, req, 3, PROTO_MAX_ARGS) == -1)
    return -1;
  errno = 0;
  if (req->args[1][0] < '0' || req->args[1][0] > '9' ||
      (sector = strtoull (req->args[1], &end, 10), errno != 0) || *end)
    return fail (rp, EINVAL, "message: sector '%s' is not a number",
                 req->args[1]);
  if ((dev = get_device (rp, "message", req->args[0])) == NULL)
    return -1;
  r = device_message (dev, sector, req->nargs - 2, req->args + 2, &reply,
                      &err);
  device_put (dev);
  if (r < 0)
    return fail (rp, -r, "message %s: %s", req->args[0], err.msg);
  fputs (reply, rp->out);
  free (reply);
  return 0;
}

/* Called without the control lock: it may block for long. */
static int
cmd_wait (struct reply *rp, struct proto_request *req)
{
  struct mapper_err err = { "" };
  struct device_info info;
  struct device *dev;
  uint64_t event_nr, now = 0;
  int64_t timeout_ms = -1;
  char *end;
  int r;

  if (need_args (rp, req, 1, 3) == -1)
    return -1;
  if ((dev = get_device (rp, "wait", req->args[0])) == NULL)
    return -1;
  device_get_info (dev, &info);
  event_nr = info.event_nr;
  errno = 0;
  if (req->nargs >= 2 && *req->args[1] &&
      (req->args[1][0] < '0' || req->args[1][0] > '9' ||
       (event_nr = strtoull (req->args[1], &end, 10), errno) || *end)) {
    device_put (dev);
    return fail (rp, EINVAL, "wait: event number '%s' is not a number",
                 req->args[1]);
  }
  if (req->nargs == 3 &&
      (req->args[2][0] < '0' || req->args[2][0] > '9' ||
       (timeout_ms = strtoll (req->args[2], &end, 10), errno) || *end)) {
    device_put (dev);
    return fail (rp, EINVAL, "wait: timeout '%s' is not a number of "
                 "milliseconds", req->args[2]);
  }
  r = device_wait_event (dev, event_nr, timeout_ms, &now, &err);
  device_put (dev);
  if (r < 0)
    return fail (rp, -r, "wait: %s", err.msg);
  fprintf (rp->out, "%" PRIu64 "\n", now);
  return 0;
}

typedef int (*cmd_fn) (struct reply *rp, struct proto_request *req);
static const cmd_fn commands[] = {
  [PROTO_CMD_VERSION] = cmd_version, [PROTO_CMD_LIST] = cmd_list,
  [PROTO_CMD_CREATE] = cmd_create, [PROTO_CMD_LOAD] = cmd_load,
  [PROTO_CMD_CLEAR] = cmd_clear, [PROTO_CMD_SUSPEND] = cmd_suspend,
  [PROTO_CMD_RESUME] = cmd_resume, [PROTO_CMD_REPLACE] = cmd_replace,
  [PROTO_CMD_REMOVE] = cmd_remove, [PROTO_CMD_RENAME] = cmd_rename,
  [PROTO_CMD_INFO] = cmd_info, [PROTO_CMD_TABLE] = cmd_table,
  [PROTO_CMD_STATUS] = cmd_status, [PROTO_CMD_MESSAGE] = cmd_message,
  [PROTO_CMD_TARGETS] = cmd_targets, [PROTO_CMD_WAIT] = cmd_wait,
};

/* Decode, authenticate and run the request in c->req; leave the response
 * in c->rsp.  Called with c->lock held.
 */
static void
execute (struct control_conn *c)
{
  struct proto_request req = { 0 };
  struct reply rp = { PROTO_OK };
  char errmsg[256];
  uint8_t *msg;
  size_t msglen;
  int st;

  rp.out = open_memstream (&rp.text, &rp.len);
  if (rp.out == NULL) {
    nbdkit_error ("control: open_memstream: %s", mapper_strerror (errno));
    return;
  }
  if (c->denied) {
    fail (&rp, EACCES, "%s", c->denied);
    goto respond;
  }
  if (c->req_len == 0) {
    fail (&rp, EPROTO, "no request written before FLUSH");
    goto respond;
  }
  st = proto_decode_request (c->req, c->req_len, &req, errmsg,
                             sizeof errmsg);
  if (st != PROTO_OK) {
    rp.status = st;
    fputs (errmsg, rp.out);
    goto respond;
  }
  if (key && !proto_check_tag (c->req, c->req_len, key, keylen, c->nonce)) {
    fail (&rp, EACCES, "request %" PRIu64 ": bad HMAC tag: wrong key "
          "(control-key) or altered message", req.seq);
    goto respond;
  }
  if (req.seq <= c->last_seq) {
    fail (&rp, EACCES, "sequence number %" PRIu64 " is not above the last "
          "one (%" PRIu64 "): replayed or reordered request refused",
          req.seq, c->last_seq);
    goto respond;
  }
  c->last_seq = req.seq;
  rp.flags = req.flags;
  if (req.cmd == PROTO_CMD_HELLO || req.cmd > PROTO_CMD_MAX) {
    fail (&rp, ENOTSUP, "unknown command %u", req.cmd);
    goto respond;
  }
  nbdkit_debug ("control: %s (%u args)", proto_cmd_name (req.cmd),
                req.nargs);
  if (req.cmd == PROTO_CMD_WAIT)
    commands[req.cmd] (&rp, &req);
  else {
    pthread_mutex_lock (&control_lock);
    commands[req.cmd] (&rp, &req);
    pthread_mutex_unlock (&control_lock);
  }

 respond:
  fclose (rp.out);
  if (rp.len > PROTO_MAX_MSG - PROTO_RSP_HDR) {
    free (rp.text);
    rp.text = strdup ("response is larger than the 16 MiB maximum");
    rp.len = rp.text ? strlen (rp.text) : 0;
    rp.status = PROTO_ERR_TOOBIG;
  }
  if (rp.status != PROTO_OK)
    nbdkit_debug ("control: %s: %s", proto_status_name (rp.status),
                  rp.text ? rp.text : "");
  if (proto_encode_response (rp.status, req.seq, rp.text, rp.len,
                             &msg, &msglen) == 0) {
    free (c->rsp);
    c->rsp = msg;
    c->rsp_len = msglen;
  }
  free (rp.text);
  proto_request_free (&req);
  /* The next request starts afresh; idle connections keep no buffer. */
  free (c->req);
  c->req = NULL;
  c->req_len = c->req_cap = 0;
}

/* --- the export -------------------------------------------------------- */

bool
control_is_export (const char *name)
{
  return name && strcmp (name, MAPPER_RESERVED_NAME) == 0;
}

struct control_conn *
control_open (int readonly)
{
  struct control_conn *c = calloc (1, sizeof *c);
  uint8_t hello[PROTO_NONCE_LEN + 1];

  if (c == NULL) {
    nbdkit_error ("control: calloc: %s", mapper_strerror (errno));
    return NULL;
  }
  pthread_mutex_init (&c->lock, NULL);
  if (RAND_bytes (c->nonce, sizeof c->nonce) != 1) {
    nbdkit_error ("control: RAND_bytes failed");
    goto err;
  }
  if (key == NULL) {
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof ss;
    int64_t uid = -1;

    /* Only a Unix socket tells who the peer is (SO_PEERCRED). */
    if (nbdkit_peer_name ((struct sockaddr *) &ss, &sslen) == 0 &&
        ss.ss_family == AF_UNIX)
      uid = nbdkit_peer_uid ();
    bool deny = false;
    if (uid < 0 || uid == (uid_t) -1) {
      deny = true;
      c->denied = strdup ("control over TCP needs a key: start the server "
                          "with control-key=FILE and use nbdmsetup --key, "
                          "or connect over the Unix socket");
    }
    else if (uid != 0 && uid != (int64_t) geteuid ()) {
      deny = true;
      if (asprintf (&c->denied, "control refused for uid %" PRIi64 ": only "
                    "root and the server's user (uid %u) may control "
                    "without control-key=FILE", uid,
                    (unsigned) geteuid ()) == -1)
        c->denied = NULL;
    }
    /* Fail closed: no message, no connection. */
    if (deny && c->denied == NULL) {
      nbdkit_error ("control: out of memory");
      goto err;
    }
    if (c->denied)
      nbdkit_debug ("control: %s", c->denied);
  }
  /* HELLO: key-required flag, then the nonce. */
  hello[0] = key ? PROTO_HELLO_KEY_REQUIRED : 0;
  memcpy (hello + 1, c->nonce, PROTO_NONCE_LEN);
  if (proto_encode_response (PROTO_OK, 0, (const char *) hello, sizeof hello,
                             &c->rsp, &c->rsp_len) == -1) {
    nbdkit_error ("control: out of memory");
    goto err;
  }
  return c;

 err:
  pthread_mutex_destroy (&c->lock);
  free (c->denied);
  free (c);
  return NULL;
}

void
control_close (struct control_conn *c)
{
  pthread_mutex_destroy (&c->lock);
  free (c->denied);
  free (c->req);
  free (c->rsp);
  free (c);
}

int64_t
control_get_size (struct control_conn *c)
{
  return PROTO_MAX_MSG;
}

int
control_pread (struct control_conn *c, void *buf, uint32_t count,
               uint64_t offset)
{
  pthread_mutex_lock (&c->lock);
  memset (buf, 0, count);
  if (offset < c->rsp_len)
    memcpy (buf, c->rsp + offset, MIN_SIZE (count, c->rsp_len - offset));
  pthread_mutex_unlock (&c->lock);
  return 0;
}

int
control_pwrite (struct control_conn *c, const void *buf, uint32_t count,
                uint64_t offset)
{
  uint64_t end;

  if (__builtin_add_overflow (offset, (uint64_t) count, &end) ||
      end > PROTO_MAX_MSG) {
    nbdkit_error ("control: write beyond the %u MiB message maximum",
                  PROTO_MAX_MSG >> 20);
    nbdkit_set_error (EFBIG);
    return -1;
  }
  pthread_mutex_lock (&c->lock);
  if (end > c->req_cap) {
    /* Grow only as written: exactly to the end of this write. */
    uint8_t *p = realloc (c->req, end);
    if (p == NULL) {
      pthread_mutex_unlock (&c->lock);
      nbdkit_error ("control: realloc: %s", mapper_strerror (errno));
      nbdkit_set_error (ENOMEM);
      return -1;
    }
    c->req = p;
    c->req_cap = end;
  }
  if (offset > c->req_len)
    memset (c->req + c->req_len, 0, offset - c->req_len);
  memcpy (c->req + offset, buf, count);
  if (end > c->req_len)
    c->req_len = end;
  pthread_mutex_unlock (&c->lock);
  return 0;
}

int
control_flush (struct control_conn *c)
{
  pthread_mutex_lock (&c->lock);
  execute (c);
  pthread_mutex_unlock (&c->lock);
  return 0;
}

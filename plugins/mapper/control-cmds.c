/* SPDX-License-Identifier: BSD-3-Clause */
/* The control export's commands: one function per command, each
 * checking its arguments, then reading or changing devices through the
 * engine.  Every command that changes a device is atomic (a failed
 * command leaves the server as it was) and, with tables=DIR, saves the
 * change before it is made visible (control-persist.c).
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <openssl/crypto.h>

#include "engine.h"
#include "control-internal.h"
#include "clients.h"

/* Serialises every command that reads or changes devices (not wait). */
static pthread_mutex_t control_lock = PTHREAD_MUTEX_INITIALIZER;

int
reply_fail (struct reply *rp, int err, const char *fmt, ...)
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
    return reply_fail (rp, EINVAL, "%s: takes %u to %u arguments, got %u",
                       proto_cmd_name (req->cmd), min, max, req->nargs);
  return 0;
}

/* A referenced device, or a NOENT reply. */
static struct device *
get_device (struct reply *rp, const char *cmd, const char *name)
{
  struct device *dev = device_get (name);

  if (dev == NULL)
    reply_fail (rp, ENOENT, "%s: no such device: %s", cmd, name);
  return dev;
}

/* get_device for a command that changes the device's tables, files or
 * name: refused while a suspend or a swap waits for its requests in
 * flight (a swap waits without control_lock, control_drain_unlock).
 * Before anything is saved: a resume or replace refused by the engine
 * only after its save would put back the live table's text over what
 * the waiting swap saved.
 */
static struct device *
get_idle_device (struct reply *rp, const char *cmd, const char *name)
{
  struct mapper_err err = { "" };
  struct device *dev = get_device (rp, cmd, name);
  int r;

  if (dev && (r = device_check_busy (dev, &err)) < 0) {
    reply_fail (rp, -r, "%s: %s", cmd, err.msg);
    device_put (dev);
    return NULL;
  }
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
    reply_fail (rp, -r, "%s", err.msg);
    return NULL;
  }
  if (rp->flags & PROTO_F_READONLY)
    table_set_read_only (t);
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
    return reply_fail (rp, -r, "%s %s: %s", cmd, device_name (dev), err.msg);
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
           "\t%d\t%s\n", device_name (dev),
           info.suspended ? "SUSPENDED" : "ACTIVE", info.live,
           info.inactive, info.open_count, info.event_nr, info.nr_targets,
           uuid ? uuid : "", info.size, info.read_only,
           holders ? holders : "");
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

/* "name\tline" for each line of dev's text (taken); "name\t" alone for an
 * empty one.  text NULL: the reply says cmd ran out of memory (-r).
 */
static int
emit_lines (struct reply *rp, const char *cmd, struct device *dev,
            char *text, int r)
{
  const char *name = device_name (dev), *p = text;

  if (text == NULL)
    return reply_fail (rp, -r, "%s: out of memory", cmd);
  if (*p == '\0')
    fprintf (rp->out, "%s\t\n", name);
  while (*p) {
    const char *nl = strchr (p, '\n');
    size_t n = nl ? (size_t) (nl - p) : strlen (p);
    fprintf (rp->out, "%s\t%.*s\n", name, (int) n, p);
    p += n + (nl != NULL);
  }
  free_secret (text);          /* table --showkeys */
  return 0;
}

static int
table_one (struct device *dev, void *opaque)
{
  struct reply *rp = opaque;
  bool inactive = rp->flags & PROTO_F_INACTIVE;
  int r = 0;
  char *text = device_table_text (dev, inactive, &r);

  if (text && !(rp->flags & PROTO_F_SHOWKEYS))
    proto_mask_crypt_keys (text);
  return emit_lines (rp, "table", dev, text, r);
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

  return emit_lines (rp, "status", dev, text, r);
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

/* A persist_* function failed (-err): the reply says why (msg, taken). */
static int
persist_reply (struct reply *rp, int err, char *msg)
{
  reply_fail (rp, err, "%s", msg ? msg : "out of memory");
  free (msg);
  return -1;
}

/* Persist what dev's live table will be (text) under name; on failure
 * the reply says why.
 */
static int
save (struct reply *rp, const char *name, const char *uuid, bool read_only,
      const char *text)
{
  char *msg = NULL;
  int r = persist_write (name, uuid, read_only, text, &msg);

  return r < 0 ? persist_reply (rp, -r, msg) : 0;
}

/* Before a change to an existing device: tables=DIR holds its file, so
 * that the change saved there is the one a restart loads.
 */
static int
check_saved (struct reply *rp, const char *name)
{
  char *msg = NULL;
  int r = persist_check_saved (name, &msg);

  return r < 0 ? persist_reply (rp, -r, msg) : 0;
}

static char *
format_table (struct reply *rp, struct table *t)
{
  size_t n = table_format (t, NULL, 0);
  char *text = malloc (n + 1);

  if (text == NULL) {
    reply_fail (rp, ENOMEM, "out of memory");
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
    return reply_fail (rp, -r, "create: %s", err.msg);
  if ((dev = device_get (name)) != NULL) {
    device_put (dev);
    return reply_fail (rp, EEXIST, "create: device '%s' already exists", name);
  }
  if (req->nargs == 3) {
    if ((t = parse_table (rp, "create", name, req->args[2])) == NULL)
      return -1;
    if ((text = format_table (rp, t)) == NULL)
      goto err;
  }
  if ((r = device_create (name, &dev, &err)) < 0) {
    reply_fail (rp, -r, "create: %s", err.msg);
    goto err;
  }
  if (*uuid && (r = device_set_uuid (dev, uuid, &err)) < 0) {
    reply_fail (rp, -r, "create %s: %s", name, err.msg);
    goto err_dev;
  }
  if (save (rp, name, *uuid ? uuid : NULL, t && table_read_only (t),
            text ? text : "") == -1)
    goto err_dev;
  if (t) {
    device_load (dev, t);
    t = NULL;
    if ((r = device_resume (dev, &err)) < 0) {
      reply_fail (rp, -r, "create %s: %s", name, err.msg);
      char *msg = NULL;
      persist_remove (name, &msg);
      free (msg);
      goto err_dev;
    }
  }
  free_secret (text);
  return 0;

 err_dev:
  device_destroy (dev);
 err:
  table_free (t);
  free_secret (text);
  return -1;
}

static int
cmd_load (struct reply *rp, struct proto_request *req)
{
  struct device *dev;
  struct table *t;

  if (need_args (rp, req, 2, 2) == -1)
    return -1;
  if ((dev = get_idle_device (rp, "load", req->args[0])) == NULL)
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
  if ((dev = get_idle_device (rp, "clear", req->args[0])) == NULL)
    return -1;
  device_clear (dev);
  device_put (dev);
  return 0;
}

/* Called without the control lock: its drain waits for the requests in
 * flight, which may wait for another device's resume (one stacked on a
 * suspended device), and that resume needs the lock.  What else would
 * change this device meanwhile is refused by the engine (-EBUSY).
 */
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
  if (r == -EBUSY)
    return reply_fail (rp, EBUSY, "suspend %s: another suspend (or a swap) "
                       "is waiting for its requests in flight: retry once "
                       "it is done", req->args[0]);
  if (r < 0)
    return reply_fail (rp, -r, "suspend %s: flush failed: %s", req->args[0],
                       mapper_strerror (-r));
  return 0;
}

/* Put back DIR/NAME.table as it was (text: its live table) after a
 * command saved the table it was about to make live and then failed
 * without making it so.
 */
static void
unsave (const char *name, const char *uuid, bool read_only, const char *text)
{
  char *msg = NULL;

  if (persist_write (name, uuid, read_only, text, &msg) < 0)
    nbdkit_error ("%s", msg ? msg : "out of memory");
  free (msg);
}

/* A table about to become live is saved first (a crash after the save
 * restarts with it); what the file held, the live table, is kept to put
 * back should the swap fail before swapping.
 */
struct live_save {
  const char *name;
  char *uuid;
  char *old_text;               /* NULL: nothing saved */
  bool old_read_only;
};

/* read_only: the new table was loaded read-only. */
static int
save_live (struct reply *rp, struct device *dev, const char *name,
           bool read_only, const char *text, struct live_save *ls)
{
  struct device_info info;
  int r = 0;

  ls->name = name;
  if (check_saved (rp, name) == -1)
    return -1;
  ls->uuid = device_uuid (dev);
  device_get_info (dev, &info);
  ls->old_read_only = info.live_ro;
  if ((ls->old_text = device_table_text (dev, false, &r)) == NULL)
    return reply_fail (rp, -r, "out of memory");
  if (save (rp, name, ls->uuid, read_only, text) == -1) {
    free_secret (ls->old_text);
    ls->old_text = NULL;
    return -1;
  }
  return 0;
}

/* After the swap.  put_back: it failed before swapping (swapped but not
 * flushed, the new table is live, and stays saved).
 */
static void
save_live_end (struct live_save *ls, bool put_back)
{
  if (ls->old_text && put_back)
    unsave (ls->name, ls->uuid, ls->old_read_only, ls->old_text);
  free (ls->uuid);
  free_secret (ls->old_text);
}

static int
cmd_resume (struct reply *rp, struct proto_request *req)
{
  struct mapper_err err = { "" };
  struct live_save ls = { NULL };
  struct device_info info;
  struct device *dev;
  char *text = NULL;
  bool swapped = false;
  int r = 0;

  if (need_args (rp, req, 1, 1) == -1)
    return -1;
  if ((dev = get_idle_device (rp, "resume", req->args[0])) == NULL)
    return -1;
  device_get_info (dev, &info);
  if (info.inactive) {
    /* The inactive table becomes live: check it can, then save it. */
    if ((r = device_check_resume (dev, &err)) < 0) {
      reply_fail (rp, -r, "resume %s: %s", req->args[0], err.msg);
      goto out;
    }
    if ((text = device_table_text (dev, true, &r)) == NULL) {
      r = reply_fail (rp, -r, "out of memory");
      goto out;
    }
    if ((r = save_live (rp, dev, req->args[0], info.inactive_ro, text,
                        &ls)) < 0)
      goto out;
  }
  if ((r = device_resume_swapped (dev, &swapped, &err)) < 0)
    reply_fail (rp, -r, "resume: %s", err.msg);
 out:
  save_live_end (&ls, r < 0 && !swapped);
  free_secret (text);
  device_put (dev);
  return r < 0 ? -1 : 0;
}

static int
cmd_replace (struct reply *rp, struct proto_request *req)
{
  struct mapper_err err = { "" };
  struct live_save ls = { NULL };
  struct device *dev;
  struct table *t = NULL;
  char *text = NULL;
  bool swapped = false;
  int r = -1;

  if (need_args (rp, req, 2, 2) == -1)
    return -1;
  if ((dev = get_idle_device (rp, "replace", req->args[0])) == NULL)
    return -1;
  t = parse_table (rp, "replace", req->args[0], req->args[1]);
  if (t == NULL || check_stacking (rp, "replace", dev, t) == -1 ||
      (text = format_table (rp, t)) == NULL)
    goto out;
  /* Before anything is saved: a table that would break a device stacked
   * on this one is refused, and a crash must not leave it in DIR.
   */
  if ((r = device_check_holders (dev, t, &err)) < 0) {
    r = reply_fail (rp, -r, "replace %s: %s", req->args[0], err.msg);
    goto out;
  }
  if ((r = save_live (rp, dev, req->args[0], table_read_only (t), text,
                      &ls)) < 0)
    goto out;
  r = device_replace (dev, t, &swapped, &err);
  t = NULL;                     /* taken, even on failure */
  if (r < 0)
    reply_fail (rp, -r, "replace: %s", err.msg);
 out:
  save_live_end (&ls, r < 0 && !swapped);
  table_free (t);
  free_secret (text);
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
  if ((dev = get_idle_device (rp, "remove", req->args[0])) == NULL)
    return -1;
  if (check_saved (rp, req->args[0]) == -1) {
    device_put (dev);
    return -1;
  }
  /* The file first: a device removed whose file could not be was back
   * at the next start, after a remove that had reported failure.
   */
  if ((r = persist_remove_begin (req->args[0], &msg)) < 0) {
    device_put (dev);
    return persist_reply (rp, -r, msg);
  }
  r = device_remove (dev, req->flags & PROTO_F_FORCE, &err);
  device_put (dev);
  persist_remove_end (req->args[0], r == 0);
  if (r < 0)
    return reply_fail (rp, -r, "remove: %s", err.msg);
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
    return reply_fail (rp, -r, "rename: %s", err.msg);
  if ((dev = get_idle_device (rp, "rename", req->args[0])) == NULL)
    return -1;
  if ((other = device_get (req->args[1])) != NULL) {
    device_put (other);
    device_put (dev);
    return reply_fail (rp, EEXIST, "rename: device '%s' already exists",
                       req->args[1]);
  }
  /* A held device is refused before its file is renamed: renamed and
   * back, a crash in between (or a failed rename back) left a tables=DIR
   * whose holder names a device it no longer has, which does not start.
   */
  if ((r = device_check_rename (dev, &err)) < 0) {
    device_put (dev);
    return reply_fail (rp, -r, "rename: %s", err.msg);
  }
  if (check_saved (rp, req->args[0]) == -1) {
    device_put (dev);
    return -1;
  }
  if ((r = persist_rename (req->args[0], req->args[1], &msg)) < 0) {
    device_put (dev);
    return persist_reply (rp, -r, msg);
  }
  r = device_rename (dev, req->args[1], &err);
  device_put (dev);
  if (r < 0) {
    persist_rename (req->args[1], req->args[0], &msg);
    free (msg);
    return reply_fail (rp, -r, "rename: %s", err.msg);
  }
  return 0;
}

/* A message changed what the live table's text says (a crypt key set, a
 * delay's delays): a restart from tables=DIR must load what runs now, so
 * it is saved again.  After the change, which the target has made: a
 * failed save says the change is live but not saved.  A device that
 * tables=DIR does not hold keeps its table=FILE as it is, as dm's
 * messages change no table file.
 */
static int
save_message (struct reply *rp, struct device *dev, const char *name)
{
  struct device_info info;
  char *msg = NULL, *uuid, *text;
  int r = persist_check_saved (name, &msg);

  if (r == -EPERM) {
    free (msg);
    return 0;
  }
  /* Not known to be DIR's (an unreadable DIR, a symlink loop): refused
   * as every other change is, but the change is made already.
   */
  if (r == 0) {
    if ((text = device_table_text (dev, false, &r)) == NULL)
      return reply_fail (rp, -r, "message %s: out of memory", name);
    uuid = device_uuid (dev);
    device_get_info (dev, &info);
    r = persist_write (name, uuid, info.live_ro, text, &msg);
    free_secret (text);
    free (uuid);
  }
  if (r < 0) {
    reply_fail (rp, -r, "message %s: the change is live but was not saved: "
                "%s", name, msg ? msg : "out of memory");
    free (msg);
    return -1;
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
    return reply_fail (rp, EINVAL, "message: sector '%s' is not a number",
                       req->args[1]);
  if ((dev = get_device (rp, "message", req->args[0])) == NULL)
    return -1;
  r = device_message (dev, sector, req->nargs - 2, req->args + 2, &reply,
                      &err);
  if (r < 0) {
    device_put (dev);
    return reply_fail (rp, -r, "message %s: %s", req->args[0], err.msg);
  }
  if (r == MESSAGE_TABLE_CHANGED &&
      save_message (rp, dev, req->args[0]) == -1) {
    device_put (dev);
    free (reply);
    return -1;
  }
  device_put (dev);
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
    return reply_fail (rp, EINVAL, "wait: event number '%s' is not a number",
                       req->args[1]);
  }
  if (req->nargs == 3 &&
      (req->args[2][0] < '0' || req->args[2][0] > '9' ||
       (timeout_ms = strtoll (req->args[2], &end, 10), errno) || *end)) {
    device_put (dev);
    return reply_fail (rp, EINVAL, "wait: timeout '%s' is not a number of "
                       "milliseconds", req->args[2]);
  }
  r = device_wait_event (dev, event_nr, timeout_ms, &now, &err);
  device_put (dev);
  if (r < 0)
    return reply_fail (rp, -r, "wait: %s", err.msg);
  fprintf (rp->out, "%" PRIu64 "\n", now);
  return 0;
}

/* stats: one "region" line per region, then a "histogram" line per
 * operation of each region that has them (PROTOCOL.md).
 */
struct stats_args {
  struct reply *rp;
  long region;                  /* -1: all */
  bool all;                     /* every device: skip those without a table */
  const char *name;             /* the device's, while printing */
};

static int
stats_region (const struct mapper_stats_region *r, void *opaque)
{
  struct stats_args *a = opaque;
  struct reply *rp = a->rp;
  const char *name = a->name;
  static const char *const ops[] = { "read", "write", "discard", "flush" };

  fprintf (rp->out, "%s\tregion\t%u\t%" PRIu64 "\t%" PRIu64 "\t%s\t%" PRIu64,
           name, r->id, r->start >> MAPPER_SECTOR_SHIFT,
           r->len >> MAPPER_SECTOR_SHIFT, r->type, r->interval_ns);
  for (int op = 0; op < MAPPER_STATS_OPS; op++)
    fprintf (rp->out, "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64, r->ios[op],
             r->bytes[op], r->ns[op]);
  fprintf (rp->out, "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\n",
           r->in_progress, r->io_ns, r->queue_ns);
  for (int op = 0; r->has_histograms && op < MAPPER_STATS_OPS; op++) {
    fprintf (rp->out, "%s\thistogram\t%u\t%s\t", name, r->id, ops[op]);
    for (int k = 0; k < MAPPER_STATS_NR_BOUNDS; k++)
      fprintf (rp->out, "%s%" PRIu64, k ? "," : "",
               mapper_stats_bounds_ns[k]);
    fputc ('\t', rp->out);
    for (int k = 0; k < MAPPER_STATS_BUCKETS; k++)
      fprintf (rp->out, "%s%" PRIu64, k ? "," : "", r->hist[op][k]);
    fputc ('\n', rp->out);
  }
  return 0;
}

static int
stats_one (struct device *dev, void *opaque)
{
  struct stats_args *a = opaque;
  struct reply *rp = a->rp;
  struct mapper_err err = { "" };
  int r;

  a->name = device_name (dev);
  r = device_stats (dev, a->region, rp->flags & PROTO_F_CLEAR,
                    stats_region, a, &err);
  /* Every device asked for: one without a table has nothing to show. */
  if (r == -ENXIO && a->all)
    return 0;
  if (r < 0)
    return reply_fail (rp, -r, "stats: %s", err.msg);
  return 0;
}

/* Check every device first: a --clear that fails clears nothing. */
static int
stats_check (struct device *dev, void *opaque)
{
  struct stats_args *a = opaque;
  struct mapper_err err = { "" };
  int r = device_stats (dev, a->region, false, NULL, NULL, &err);

  if (r == -ENXIO && a->all)
    return 0;
  if (r < 0)
    return reply_fail (a->rp, -r, "stats: %s", err.msg);
  return 0;
}

static int
cmd_stats (struct reply *rp, struct proto_request *req)
{
  struct stats_args a = { rp, -1, false, NULL };
  struct device *dev = NULL;
  char *end;
  int r;

  if (need_args (rp, req, 0, 2) == -1)
    return -1;
  if (req->nargs == 2) {
    errno = 0;
    if (req->args[1][0] < '0' || req->args[1][0] > '9' ||
        (a.region = strtol (req->args[1], &end, 10), errno) || *end)
      return reply_fail (rp, EINVAL, "stats: region '%s' is not a number",
                         req->args[1]);
  }
  if (req->nargs >= 1 && *req->args[0] &&
      (dev = get_device (rp, "stats", req->args[0])) == NULL)
    return -1;
  if (req->nargs == 2 && dev == NULL)
    return reply_fail (rp, EINVAL, "stats: a region needs a device");
  if (dev) {
    r = stats_check (dev, &a);
    if (r == 0)
      r = stats_one (dev, &a);
    device_put (dev);
    return r;
  }
  a.all = true;
  if (device_foreach (stats_check, &a) != 0)
    return -1;
  return device_foreach (stats_one, &a) != 0 ? -1 : 0;
}

static int
cmd_clients (struct reply *rp, struct proto_request *req)
{
  struct device *dev = NULL;

  if (need_args (rp, req, 0, 1) == -1)
    return -1;
  if (req->nargs == 0 || control_is_export (req->args[0])) {
    clients_print (rp->out, req->nargs == 0, NULL);
    return 0;
  }
  if ((dev = get_device (rp, "clients", req->args[0])) == NULL)
    return -1;
  clients_print (rp->out, false, dev);
  device_put (dev);
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
  [PROTO_CMD_STATS] = cmd_stats, [PROTO_CMD_CLIENTS] = cmd_clients,
};

/* A resume or replace waits for the device's requests in flight without
 * control_lock (device_set_drain_unlock): one may be held at the gate of
 * a suspended device it stacks on, whose resume needs the lock.  What
 * would change the draining device meanwhile is refused (busy:
 * get_idle_device, and the engine for suspend, resume, replace and
 * message); every other command runs.
 */
static void
control_drain_unlock (bool relock)
{
  if (relock)
    pthread_mutex_lock (&control_lock);
  else
    pthread_mutex_unlock (&control_lock);
}

void
control_run (struct reply *rp, struct proto_request *req)
{
  if (req->cmd == PROTO_CMD_HELLO || req->cmd > PROTO_CMD_MAX) {
    reply_fail (rp, ENOTSUP, "unknown command %u", req->cmd);
    return;
  }
  nbdkit_debug ("control: %s (%u args)", proto_cmd_name (req->cmd),
                req->nargs);
  if (req->cmd == PROTO_CMD_WAIT || req->cmd == PROTO_CMD_SUSPEND)
    commands[req->cmd] (rp, req);
  else {
    pthread_mutex_lock (&control_lock);
    device_set_drain_unlock (control_drain_unlock);
    commands[req->cmd] (rp, req);
    device_set_drain_unlock (NULL);
    pthread_mutex_unlock (&control_lock);
  }
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* tables=DIR persistence for the control export: every change a command
 * makes is saved there (temp file, fsync, rename, fsync dir) before it is
 * made visible, so that a restart with tables=DIR serves what was live.
 * Table files are written 0600: a crypt table holds its key in clear.
 */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "engine.h"
#include "util.h"
#include "control-internal.h"

/* Read-only after config_complete.  NULL: no persistence. */
static char *tables_dir;

void
control_set_tables_dir (const char *dir)
{
  free (tables_dir);
  tables_dir = strdup (dir);
}

static int remove_stale_tmp (void);

int
persist_check_dir (void)
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
persist_unload (void)
{
  free (tables_dir);
  tables_dir = NULL;
}

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

/* After a rename into DIR/NAME.table that succeeded: the file is in
 * place, and it is what a restart loads, so the change is saved even if
 * the fsync of DIR fails.  Reported as not saved, the command undid a
 * change the next start made anyway (create, rename).  Only a crash
 * before the directory reaches the disk may bring back the file from
 * before: that is logged, and the command succeeds.
 */
static void
fsync_dir_after_rename (const char *name)
{
  int r = fsync_dir ();

  if (r < 0)
    nbdkit_error ("tables=%s: fsync: %s: %s.table is in place (a restart "
                  "loads it), but a crash before DIR reaches the disk may "
                  "bring back the file from before", tables_dir,
                  mapper_strerror (-r), name);
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

/* DIR/NAME.table, malloc'd; NULL if out of memory. */
static char *
table_path (const char *name)
{
  char *path;

  return asprintf (&path, "%s/%s.table", tables_dir, name) == -1 ? NULL
    : path;
}

/* DIR/.NAME.table.tmp, malloc'd; NULL if out of memory. */
static char *
tmp_path (const char *name)
{
  char *path;

  return asprintf (&path, "%s/.%s.table.tmp", tables_dir, name) == -1 ? NULL
    : path;
}

/* *msg := "tables=DIR: WHAT NAME.table: <error -r>" (NULL if out of
 * memory); returns r.
 */
static int
persist_failed (int r, const char *what, const char *name, char **msg)
{
  if (asprintf (msg, "tables=%s: %s %s.table: %s", tables_dir, what, name,
                mapper_strerror (-r)) == -1)
    *msg = NULL;
  return r;
}

#define UUID_TAG "# nbdmapper-uuid: "
#define NO_TABLE_TAG "# nbdmapper-no-table"
#define READ_ONLY_TAG "# nbdmapper-readonly"

int
control_restore (struct device *dev, const char *path, bool *read_only)
{
  struct mapper_err err = { "" };
  FILE *fp = fopen (path, "r");
  /* The file holds crypt keys: stdio's buffer is ours, wiped, and line
   * big enough that getline does not grow it (each growth frees a copy)
   * for any line but one longer than a path and a key.
   */
  char io[4096];
  size_t cap = 8192;
  char *line = malloc (cap);
  ssize_t n;
  int r = 0;

  if (fp == NULL || line == NULL) {
    free (line);
    if (fp)
      fclose (fp);
    return 0;                   /* table_parse_file reports it */
  }
  setvbuf (fp, io, _IOFBF, sizeof io);
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
    else if (strcmp (line, READ_ONLY_TAG) == 0)
      *read_only = true;
    else if (line[0] != '#')
      break;                    /* the header ends at the first table line */
  }
  /* It stops at the first table line, which may hold a crypt key. */
  if (line)
    explicit_bzero (line, cap);
  free (line);
  fclose (fp);
  explicit_bzero (io, sizeof io);
  return r;
}

/* DIR/NAME.table := header + text, atomically (a crash leaves the old
 * file or the new one, and at most a temp file remove_stale_tmp removes).
 */
int
persist_write (const char *name, const char *uuid, bool read_only,
               const char *text, char **msg)
{
  char *tmp = NULL, *path = NULL, *all = NULL;
  size_t len;
  int fd = -1, r = 0;

  if (tables_dir == NULL)
    return 0;
  /* Built in a buffer of the right size: asprintf's growth would leave
   * copies of a crypt key in freed memory.
   */
  {
    const char *parts[] = {
      uuid ? UUID_TAG : "", uuid ? uuid : "", uuid ? "\n" : "",
      read_only && *text ? READ_ONLY_TAG "\n" : "",
      *text ? "" : NO_TABLE_TAG "\n", text,
    };
    char *p;

    len = 0;
    for (size_t i = 0; i < ARRAY_SIZE (parts); i++)
      len += strlen (parts[i]);
    if ((all = malloc (len + 1)) == NULL) {
      r = -ENOMEM;
      goto out;
    }
    p = all;
    for (size_t i = 0; i < ARRAY_SIZE (parts); i++)
      p = stpcpy (p, parts[i]);
  }
  text = all;
  if ((tmp = tmp_path (name)) == NULL || (path = table_path (name)) == NULL) {
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
  fsync_dir_after_rename (name);
 out:
  if (fd >= 0)
    close (fd);
  if (r < 0) {
    if (tmp)
      unlink (tmp);
    persist_failed (r, "saving", name, msg);
  }
  free (tmp);
  free (path);
  free_secret (all);
  return r;
}

int
persist_check_saved (const char *name, char **msg)
{
  char *path;
  int r = 0;

  if (tables_dir == NULL)
    return 0;
  if ((path = table_path (name)) == NULL)
    r = -ENOMEM;
  else if (access (path, F_OK) == -1)
    r = -errno;
  free (path);
  if (r == -ENOENT) {
    if (asprintf (msg, "tables=%s holds no %s.table: the device came from "
                  "table=FILE or another tables=DIR, which a restart loads "
                  "again beside a change saved here: change that file "
                  "instead", tables_dir, name) == -1)
      *msg = NULL;
    return -EPERM;
  }
  return r < 0 ? persist_failed (r, "looking for", name, msg) : 0;
}

/* A remove in two steps, so that a failure on either side changes
 * nothing: NAME.table moves aside to .NAME.table.tmp (durably) before the
 * device goes; then the moved file is deleted, or put back when the
 * device could not be removed.  A crash between the steps leaves only a
 * temp file, which the next start deletes (remove_stale_tmp): the device
 * is gone, as the remove was under way.
 */
int
persist_remove_begin (const char *name, char **msg)
{
  char *path, *tmp;
  int r;

  if (tables_dir == NULL)
    return 0;
  path = table_path (name);
  tmp = tmp_path (name);
  if (path == NULL || tmp == NULL)
    r = -ENOMEM;
  else if (rename (path, tmp) == -1)
    r = errno == ENOENT ? 0 : -errno;
  else if ((r = fsync_dir ()) < 0 && rename (tmp, path) == -1)
    nbdkit_error ("tables=%s: putting back %s.table after a failed "
                  "fsync: %s", tables_dir, name, mapper_strerror (errno));
  free (path);
  free (tmp);
  return r < 0 ? persist_failed (r, "removing", name, msg) : 0;
}

void
persist_remove_end (const char *name, bool removed)
{
  char *path, *tmp;
  int r = 0;

  if (tables_dir == NULL)
    return;
  path = table_path (name);
  tmp = tmp_path (name);
  if (path == NULL || tmp == NULL)
    r = -ENOMEM;
  else if (removed ? unlink (tmp) == -1 : rename (tmp, path) == -1)
    r = -errno;
  else
    r = fsync_dir ();
  /* Removed: a temp file left here is deleted at the next start.  Not
   * removed: NAME.table could not be put back, and a restart would lose
   * a device that still exists.
   */
  if (r < 0 && r != -ENOENT)
    nbdkit_error ("tables=%s: %s .%s.table.tmp: %s%s", tables_dir,
                  removed ? "deleting" : "putting back", name,
                  mapper_strerror (-r),
                  removed ? "" : ": save the device again (replace) before "
                  "a restart, or it is lost");
  free (path);
  free (tmp);
}

int
persist_remove (const char *name, char **msg)
{
  int r = persist_remove_begin (name, msg);

  if (r == 0)
    persist_remove_end (name, true);
  return r;
}

int
persist_rename (const char *old, const char *new, char **msg)
{
  char *from = table_path (old), *to = table_path (new);
  int r;

  if (tables_dir == NULL)
    r = 0;
  else if (from == NULL || to == NULL)
    r = -ENOMEM;
  else if (rename (from, to) == -1)
    r = -errno;
  else {
    fsync_dir_after_rename (new);
    r = 0;
  }
  free (from);
  free (to);
  return r < 0 ? persist_failed (r, "renaming", old, msg) : 0;
}

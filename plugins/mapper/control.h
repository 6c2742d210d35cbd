/* SPDX-License-Identifier: BSD-3-Clause */
/* The control export: one reserved export ("control") per server through
 * which nbdmsetup drives the engine.  See proto/PROTOCOL.md.
 */
#ifndef NBDMAPPER_CONTROL_H
#define NBDMAPPER_CONTROL_H

#include <stdbool.h>
#include <stdint.h>

struct control_conn;

/* Configuration.  control_config returns 1 if it took the key, 0 if the
 * key is not its, -1 on error (already reported).
 */
int control_config (const char *key, const char *value);
void control_set_tables_dir (const char *dir);
int control_config_complete (void);
void control_unload (void);
/* At start, for a table file: apply the "# nbdmapper-uuid:" line saved
 * by the control export, and set *read_only if the file says the table
 * is served read-only ("# nbdmapper-readonly"); 1 if the file says the
 * device has no table ("# nbdmapper-no-table"), 0 otherwise, -1 on
 * error (reported).
 */
struct device;
int control_restore (struct device *dev, const char *path, bool *read_only);
#define control_config_help \
  "control-key=FILE    HMAC-SHA256 secret (>= 32 bytes, mode 0600) for\n" \
  "                    the control export; without it control is allowed\n" \
  "                    only over a Unix socket from root or this user."

/* The export. */
bool control_is_export (const char *name);
struct control_conn *control_open (int readonly);
void control_close (struct control_conn *c);
int64_t control_get_size (struct control_conn *c);
int control_pread (struct control_conn *c, void *buf, uint32_t count,
                   uint64_t offset);
int control_pwrite (struct control_conn *c, const void *buf, uint32_t count,
                    uint64_t offset);
int control_flush (struct control_conn *c);

#endif /* NBDMAPPER_CONTROL_H */

/* SPDX-License-Identifier: BSD-3-Clause */
/* Private to the control export's files (mapper.c sees only control.h):
 *
 *   control.c          transport and authentication: control-key, the
 *                      HELLO and its nonce, the HMAC tag and sequence
 *                      checks, the export callbacks;
 *   control-cmds.c     the commands (cmd_*), serialised by one lock;
 *   control-persist.c  tables=DIR: every change saved there atomically,
 *                      the saved header restored at start, the temp files
 *                      of an unfinished save removed.
 */
#ifndef NBDMAPPER_CONTROL_INTERNAL_H
#define NBDMAPPER_CONTROL_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "proto.h"
#include "control.h"

/* Free a string that may hold a crypt key (a table's text, a reply
 * with --showkeys), wiped first: freed memory keeps its bytes.
 */
void free_secret (char *s);

/* control-cmds.c */

/* The result of one command: status + payload (or error message). */
struct reply {
  unsigned status;
  uint32_t flags;               /* the request's PROTO_F_* */
  FILE *out;                    /* payload under construction */
  char *text;
  size_t len;
};

/* Make rp an error reply: the status for errno err (PROTO_ERR_INVALID
 * for 0), the message from fmt.  Returns -1.
 */
int reply_fail (struct reply *rp, int err, const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));
/* Run a decoded request whose tag and sequence number were accepted,
 * leaving the result in rp.  Unknown commands get ENOTSUP.
 */
void control_run (struct reply *rp, struct proto_request *req);

/* control-persist.c */

/* At config_complete: tables=DIR (if given) is writable, and holds no
 * temp file of a save that did not finish.  -1 on error (reported).
 */
int persist_check_dir (void);
void persist_unload (void);
/* Each does nothing and returns 0 without tables=DIR; on error -errno and
 * *msg (malloc'd, may be NULL on ENOMEM) says what failed.
 */
/* DIR/NAME.table := the uuid, read-only and no-table header + text,
 * atomically.
 */
int persist_write (const char *name, const char *uuid, bool read_only,
                   const char *text, char **msg);
/* Is the device NAME saved in DIR, where its changes are saved?  One
 * loaded from elsewhere is not: -EPERM.
 */
int persist_check_saved (const char *name, char **msg);
/* Remove NAME.table: persist_remove_begin moves it aside (durably);
 * persist_remove_end (removed) deletes it, or puts it back when the
 * device stayed (failures logged).  persist_remove does both.
 */
int persist_remove_begin (const char *name, char **msg);
void persist_remove_end (const char *name, bool removed);
int persist_remove (const char *name, char **msg);
int persist_rename (const char *old, const char *new, char **msg);

#endif /* NBDMAPPER_CONTROL_INTERNAL_H */

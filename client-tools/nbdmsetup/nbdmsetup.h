/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdmsetup's two parts: nbdmsetup.c (options, the connection, the
 * commands, batch) and devices.c (what the server says of every device,
 * and the commands made of it: info, info -c, deps, ls, ls --tree,
 * remove_all, wipe_table, -u UUID).
 */
#ifndef NBDMSETUP_H
#define NBDMSETUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The options of one command.  A batch line starts from the command
 * line's: one struct, so that is one assignment whatever options exist.
 */
struct options {
  bool json;
  unsigned given;               /* O_* given, to refuse a verb's others */
  uint32_t flags;               /* PROTO_F_* */
  const char *uuid;             /* -u: create's uuid, else selects NAME */
  const char *table_text;       /* --table TEXT */
  const char *fields;           /* -o */
  const char *sort;             /* -O */
  const char *separator;        /* --separator, NULL: aligned columns */
  const char *target;           /* --target TYPE */
  int verbose;                  /* -v */
  double timeout;               /* --timeout, or -1 */
  const char *region;           /* stats --region ID */
  const char *log;              /* move --log core|FILE */
  const char *region_size;      /* move --region-size SECTORS */
  const char *method;           /* move --method mirror|clone */
  const char *metadata;         /* move --metadata FILE (clone) */
};
extern struct options opts;
/* Options that belong to some verbs only (struct verb's opts). */
enum {
  O_NOFLUSH = 1 << 0, O_FORCE = 1 << 1, O_INACTIVE = 1 << 2,
  O_SHOWKEYS = 1 << 3, O_BACKENDS = 1 << 4, O_UUID = 1 << 5,
  O_TABLE = 1 << 6, O_NOTABLE = 1 << 7, O_READONLY = 1 << 8,
  O_COLUMNS = 1 << 9, O_OPTIONS = 1 << 10, O_NOHEADINGS = 1 << 11,
  O_SEPARATOR = 1 << 12, O_TARGET = 1 << 13, O_TREE = 1 << 14,
  O_SORT = 1 << 15, O_NAMEPREFIXES = 1 << 16, O_CLEAR = 1 << 17,
  O_PROMETHEUS = 1 << 18, O_REGION = 1 << 19, O_RESUME = 1 << 20,
  O_ABORT = 1 << 21, O_LOG = 1 << 22, O_REGION_SIZE = 1 << 23,
  O_METHOD = 1 << 24, O_METADATA = 1 << 25,
};
/* One line per verb (verbs[] in nbdmsetup.c): what it sends,
 * its arguments (NAME included), the options of its own (the others are
 * refused), whether its first argument is a device -u UUID may stand
 * for, and what runs it.  run NULL: a verb of dmsetup that cannot apply
 * here, and why.  A verb with local set runs without connecting.
 * Adding a verb is one line there and its run function.
 */
struct conn;
struct verb;
typedef void verb_fn (struct conn *c, const struct verb *v, int argc,
                      char **argv);
struct verb {
  const char *name;
  unsigned code;                /* the PROTO_CMD_* it sends first */
  int min, max;
  unsigned opts;                /* O_* of its own */
  bool named;                   /* argv[0] is a device: -u may stand for it */
  verb_fn *run;
  const char *why_not;
  bool local;
};

/* nbdmsetup.c */
void die (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2), noreturn));
extern const char *die_note;    /* said after die's message, in () */
/* Send one request (with flags, or the command line's); the response
 * payload, malloc'd and NUL-ended.  A server-side error is printed and
 * exits 1.
 */
char *call_flags (struct conn *c, unsigned cmd, uint32_t flags,
                  unsigned nargs, const char *const *args);
char *call (struct conn *c, unsigned cmd, unsigned nargs,
            const char *const *args);
/* The same, returning the server's status instead of exiting on an
 * error (the payload is then its message).
 */
char *call_status (struct conn *c, unsigned cmd, uint32_t flags,
                   unsigned nargs, const char *const *args,
                   uint16_t *status);
void json_string (const char *s);
/* Split payload into lines of tab-separated fields (in place). */
#define MAX_FIELDS 24          /* stats' region rows have 22 */
struct row {
  char *f[MAX_FIELDS];
  int n;
};

size_t split_rows (char *payload, struct row **rows);

/* devices.c */
verb_fn run_info, run_deps, run_ls, run_remove_all, run_wipe_table;
/* -u UUID: the name of the device with that uuid (malloc'd). */
char *name_of_uuid (struct conn *c, const char *uuid);
/* -v: the device's info block, as dmsetup prints it before deps, table,
 * status or after wait.
 */
void verbose_info (struct conn *c, const char *name);
void print_field_help (void);           /* info -c -o help, help -c */
/* Is line ("START LENGTH TYPE ...") a target of type type? */
bool line_has_target (const char *line, const char *type);

/* move.c */
verb_fn run_move;

#endif /* NBDMSETUP_H */

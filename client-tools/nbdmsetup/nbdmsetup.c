/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdmsetup: dmsetup for nbdmapper, over NBD to the control export.
 * A thin layer: parse arguments, connect, read the HELLO, send one
 * request, print the response in dmsetup's format or as JSON.
 */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libnbd.h>
#include <openssl/crypto.h>

#include "proto.h"

static const char *uri;
static const char *key_file;
/* The options of one command.  A batch line starts from the command
 * line's: one struct, so that is one assignment whatever options exist.
 */
static struct options {
  bool json;
  uint32_t flags;               /* PROTO_F_* */
  const char *uuid;
  const char *table_text;       /* --table TEXT */
  double timeout;               /* --timeout, or -1 */
  bool prometheus;              /* stats --prometheus */
  const char *region;           /* stats --region ID */
} opts = { .timeout = -1 };
/* Seconds to wait for the server to connect and for each reply, when
 * --timeout does not say (it does not for wait, where it is the event's
 * timeout): $NBDMSETUP_TIMEOUT, else this.  0: no limit.
 */
static double default_timeout = 30;
static bool default_from_env;   /* it is $NBDMSETUP_TIMEOUT */
static const char *batch_file;  /* the batch being run, or NULL */
static unsigned batch_lineno;   /* the line of it being run */
static bool stdin_is_batch;     /* the batch's lines come from stdin */

static void die (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2), noreturn));
static void
die (const char *fmt, ...)
{
  va_list ap;

  fputs ("nbdmsetup: ", stderr);
  if (batch_file)
    fprintf (stderr, "%s:%u: ", batch_file, batch_lineno);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
  exit (EXIT_FAILURE);
}

static void __attribute__ ((noreturn))
usage (FILE *fp, int status)
{
  fprintf (fp,
"Usage: nbdmsetup [-c URI] [-k KEYFILE] [--json] COMMAND [ARGS...]\n"
"Drive the devices of an nbdmapper server (nbdkit mapper) like dmsetup.\n"
"\n"
"Commands:\n"
"  version                          client and server versions\n"
"  ls                               list devices\n"
"  create NAME [--uuid U] [TABLE]   new device (no TABLE: suspended, empty)\n"
"  load|reload NAME [TABLE]         fill the inactive table slot\n"
"  clear NAME                       drop the inactive table\n"
"  suspend [--noflush] NAME         hold new I/O, drain, flush\n"
"  resume NAME                      make the inactive table live, release I/O\n"
"  replace NAME [TABLE]             load + suspend + resume in one step\n"
"  remove [--force] NAME            remove a device\n"
"  rename OLD NEW                   rename a device\n"
"  info [NAME]                      state, tables, counts (dmsetup info)\n"
"  table [--inactive] [--showkeys] [NAME]\n"
"  status [--backends] [NAME]       per-target status lines, or each\n"
"                                   backend's state (NBD connections)\n"
"  message NAME SECTOR WORDS...     send a message to a target\n"
"  targets                          target types and versions\n"
"  stats [--clear] [--region ID] [--json|--prometheus] [NAME]\n"
"                                   I/O statistics (dmstats report)\n"
"  clients [NAME]                   client connections (of NAME)\n"
"  wait NAME [EVENT_NR] [--timeout S]  (S: how long to wait for the event)\n"
"  batch [FILE]                     commands from FILE (default standard\n"
"                                   input), one per line, one connection\n"
"\n"
"TABLE is a file, or - for standard input (the default for load and\n"
"replace), or --table 'TEXT'.\n"
"\n"
"Options:\n"
"  -c, --connect URI   the control export (default $NBDMSETUP_URI), e.g.\n"
"                      nbd+unix:///control?socket=/run/nbdmapper.sock\n"
"  -k, --key FILE      HMAC key file (default $NBDMSETUP_KEY)\n"
"  -j, --json          JSON output for read commands\n"
"  --timeout SECONDS   give up when the server has not connected or\n"
"                      replied within SECONDS (default $NBDMSETUP_TIMEOUT,\n"
"                      else 30; 0: no limit)\n"
"  -h, --help          this help\n"
"  -V, --version       print the version\n");
  exit (status);
}

/* --- connection -------------------------------------------------------- */

/* Every wait for the server goes through libnbd's async API and a
 * deadline: the blocking calls would wait forever for a server that
 * accepted the connection and then went silent.
 */
struct conn {
  struct nbd_handle *nbd;
  uint8_t nonce[PROTO_NONCE_LEN];
  uint8_t *key;
  size_t keylen;
  /* What is being waited for, for the messages: the URI while
   * connecting, then the command; its limit in seconds (0: none); and,
   * once a request that changes something has been executed, a note
   * that a timeout does not mean it did not happen.
   */
  const char *who;
  double secs;
  const char *origin;           /* where secs came from */
  const char *note;
};

static double
now (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* An NBD command of the control protocol failed.  nbdmapper's control
 * export fails none of them (and the connection is checked to be
 * writable): if the server answered with an error, something else did.
 */
static void __attribute__ ((noreturn))
nbd_failed (struct conn *c, const char *what)
{
  if (nbd_aio_is_ready (c->nbd))
    die ("%s: %s: %s: nbdmapper's control export does not fail this: is a "
         "filter in front of the plugin (see nbdmsetup(8), FILTERS)?",
         c->who, what, nbd_get_error ());
  die ("%s: %s: %s", c->who, what, nbd_get_error ());
}

/* Run the connection until command cookie has completed (cookie 0: until
 * the handshake is over); die naming what after c->secs.
 */
static void
await (struct conn *c, int64_t cookie, const char *what)
{
  double deadline = c->secs > 0 ? now () + c->secs : 0;

  for (;;) {
    int r = cookie ? nbd_aio_command_completed (c->nbd, cookie)
      : !nbd_aio_is_connecting (c->nbd);
    int ms = -1;

    if (r == -1)
      nbd_failed (c, what);
    if (r == 1)
      return;
    if (deadline) {
      double left = deadline - now ();
      if (left <= 0)
        die ("%s: timed out after %g s %s (%s)%s", c->who, c->secs, what,
             c->origin, c->note);
      ms = left >= INT_MAX / 1000 ? INT_MAX : (int) (left * 1000) + 1;
    }
    if (nbd_poll (c->nbd, ms) == -1)
      die ("%s: %s: %s", c->who, what, nbd_get_error ());
  }
}

static void
control_pread (struct conn *c, void *buf, size_t count, const char *what)
{
  int64_t cookie = nbd_aio_pread (c->nbd, buf, count, 0,
                                  NBD_NULL_COMPLETION, 0);
  if (cookie == -1)
    die ("%s: %s: %s", c->who, what, nbd_get_error ());
  await (c, cookie, what);
}

/* What was read at offset 0 is no response.  After a HELLO, that is
 * what a filter in front of the plugin does: one that keeps writes to
 * itself (cow, cache) makes the request itself read back.
 */
static void __attribute__ ((noreturn))
not_a_response (struct conn *c, bool hello, const uint8_t *hdr,
                const char *errmsg)
{
  /* cow's overlay outlives the connection that wrote it. */
  if (hello && memcmp (hdr, "NBMQ", 4) == 0)
    die ("%s: the control export shows a request where its HELLO should "
         "be: is a filter in front of the plugin that keeps writes to "
         "itself (such as --filter=cow or --filter=cache)?  The plugin "
         "must see every write and flush: see nbdmsetup(8), FILTERS", uri);
  if (hello && memcmp (hdr, "NBMP", 4) != 0)
    die ("%s: %s: is it nbdmapper's export 'control', with no filter in "
         "front of the plugin that changes it (see nbdmsetup(8), FILTERS)?",
         uri, errmsg);
  if (hello)
    die ("%s: %s", uri, errmsg);
  if (memcmp (hdr, "NBMQ", 4) == 0)
    die ("%s: %s: the control export gave back the request instead of a "
         "response: is a filter in front of the plugin that keeps writes "
         "to itself (such as --filter=cow or --filter=cache)?  The plugin "
         "must see every write and flush: see nbdmsetup(8), FILTERS",
         uri, c->who);
  die ("%s: %s: the control export does not answer as nbdmapper's (%s): is "
       "a filter in front of the plugin (see nbdmsetup(8), FILTERS)?", uri,
       c->who, memcmp (hdr, "NBMP", 4) != 0
       ? "no response at offset 0 after the request" : errmsg);
}

/* Read the response at offset 0; returns the malloc'd whole message.
 * hello: this is the HELLO, which tells a control export from others.
 */
static uint8_t *
read_response (struct conn *c, bool hello, uint16_t *status,
               uint32_t *total)
{
  uint8_t hdr[PROTO_RSP_HDR];
  char errmsg[256];
  uint64_t seq;
  uint8_t *msg;

  control_pread (c, hdr, sizeof hdr, hello ? "reading the HELLO"
                 : "reading the response");
  if (proto_decode_response_header (hdr, sizeof hdr, status, &seq, total,
                                    errmsg, sizeof errmsg) == -1)
    not_a_response (c, hello, hdr, errmsg);
  msg = malloc (*total + 1);
  if (msg == NULL)
    die ("out of memory");
  control_pread (c, msg, *total, hello ? "reading the HELLO"
                 : "reading the response");
  msg[*total] = '\0';
  return msg;
}

/* Whether cmd may change something (a timeout then leaves it unknown). */
static bool
changes_state (unsigned cmd)
{
  switch (cmd) {
  case PROTO_CMD_VERSION: case PROTO_CMD_LIST: case PROTO_CMD_INFO:
  case PROTO_CMD_TABLE: case PROTO_CMD_STATUS: case PROTO_CMD_TARGETS:
  case PROTO_CMD_WAIT: case PROTO_CMD_CLIENTS:
    return false;
  case PROTO_CMD_STATS:
    return opts.flags & PROTO_F_CLEAR;
  default:
    return true;
  }
}

/* How long cmd's steps (or connecting for it) may wait for the server,
 * and where that comes from, for the message.  wait's --timeout is the
 * event's: wait's reply may come that late, and then take the usual
 * time.
 */
static double
time_limit (unsigned cmd, bool connecting, const char **origin)
{
  if (cmd != PROTO_CMD_WAIT && opts.timeout >= 0) {
    *origin = "--timeout";
    return opts.timeout;
  }
  *origin = default_from_env ? "$NBDMSETUP_TIMEOUT"
    : "the default: see --timeout";
  if (cmd != PROTO_CMD_WAIT || connecting)
    return default_timeout;
  if (opts.timeout < 0 || default_timeout == 0)
    return 0;                   /* waits for the event for ever */
  *origin = default_from_env ? "wait's --timeout plus $NBDMSETUP_TIMEOUT"
    : "wait's --timeout plus the default: see --timeout";
  return opts.timeout + default_timeout;
}

/* Connect for cmd (0: batch). */
static void
connect_control (struct conn *c, unsigned cmd)
{
  uint16_t status;
  uint32_t total;
  uint8_t *hello;
  char errmsg[256];
  int64_t size;

  c->who = uri;
  c->secs = time_limit (cmd, true, &c->origin);
  c->note = "";
  c->nbd = nbd_create ();
  if (c->nbd == NULL)
    die ("nbd_create: %s", nbd_get_error ());
  /* nbds:// URIs may name a tls-psk-file. */
  if (nbd_set_uri_allow_local_file (c->nbd, true) == -1)
    die ("nbd_set_uri_allow_local_file: %s", nbd_get_error ());
  if (nbd_aio_connect_uri (c->nbd, uri) == -1)
    die ("%s: %s", uri, nbd_get_error ());
  await (c, 0, "connecting");
  if (!nbd_aio_is_ready (c->nbd))
    die ("%s: the server closed the connection during the NBD handshake",
         uri);
  size = nbd_get_size (c->nbd);
  if (size < PROTO_RSP_HDR)
    die ("%s: not an nbdmapper control export (too small)", uri);

  /* Read before writing anything: a device export is never written. */
  hello = read_response (c, true, &status, &total);
  if (status != PROTO_OK || total != PROTO_RSP_HDR + 1 + PROTO_NONCE_LEN)
    die ("%s: not an nbdmapper control export (no HELLO at offset 0)", uri);
  memcpy (c->nonce, hello + PROTO_RSP_HDR + 1, PROTO_NONCE_LEN);
  /* It is nbdmapper's: what stands in the way of a request is how it is
   * served.
   */
  if (size != PROTO_MAX_MSG)
    die ("%s: the control export is %" PRIi64 " bytes, not %d: is a filter "
         "in front of the plugin that changes the size (see nbdmsetup(8), "
         "FILTERS)?", uri, size, PROTO_MAX_MSG);
  if (nbd_is_read_only (c->nbd) == 1)
    die ("%s: the server is read-only (nbdkit -r, or a filter): nbdmsetup "
         "writes its requests to the control export, so it can neither "
         "list nor change devices (nbdinfo --list still lists them).  "
         "Restart nbdkit without -r: a device whose backing files cannot "
         "be written is served read-only anyway", uri);
  if (nbd_can_flush (c->nbd) != 1)
    die ("%s: the control export does not take FLUSH, which executes a "
         "request: is a filter in front of the plugin (see nbdmsetup(8), "
         "FILTERS)?", uri);
  if ((hello[PROTO_RSP_HDR] & PROTO_HELLO_KEY_REQUIRED) && key_file == NULL)
    die ("%s: the server requires a key: use --key FILE or $NBDMSETUP_KEY",
         uri);
  free (hello);
  if (key_file &&
      proto_read_key (key_file, &c->key, &c->keylen, errmsg,
                      sizeof errmsg) == -1)
    die ("%s", errmsg);
}

/* The table a request carries came from this file ("stdin" for -), or
 * from --table (NULL).
 */
static const char *table_file;

/* The server names a bad table line "COMMAND NAME:LINE:" (and an empty
 * table "COMMAND NAME: table is empty"), not knowing the file: name the
 * file instead, as the server does at start.
 */
static void __attribute__ ((noreturn))
die_table_error (unsigned cmd, const char *name, const char *msg)
{
  const char *cmdname = proto_cmd_name (cmd);
  size_t n = strlen (cmdname), m = strlen (name);

  if (table_file && strncmp (msg, cmdname, n) == 0 && msg[n] == ' ' &&
      strncmp (msg + n + 1, name, m) == 0 && msg[n + 1 + m] == ':') {
    const char *rest = msg + n + 1 + m + 1;   /* after "COMMAND NAME:" */
    size_t digits = strspn (rest, "0123456789");
    if ((digits > 0 && rest[digits] == ':') ||
        strncmp (rest, " table is empty", 15) == 0)
      die ("%s:%s", table_file, rest);
  }
  die ("%s", msg);
}

/* Send one request; return the response payload (malloc'd, NUL-ended).
 * A server-side error is printed and exits 1.
 */
static char *
call (struct conn *c, unsigned cmd, unsigned nargs, const char *const *args)
{
  static uint64_t seq;
  char errmsg[256];
  uint8_t *msg, *rsp;
  size_t len;
  uint16_t status;
  uint32_t total;
  char *payload;
  int64_t cookie;

  c->who = proto_cmd_name (cmd);
  c->secs = time_limit (cmd, false, &c->origin);
  c->note = "";
  if (proto_encode_request (cmd, opts.flags, ++seq, nargs, args, c->key,
                            c->keylen, c->nonce, &msg, &len,
                            errmsg, sizeof errmsg) == -1)
    die ("%s: %s", proto_cmd_name (cmd), errmsg);
  cookie = nbd_aio_pwrite (c->nbd, msg, len, 0, NBD_NULL_COMPLETION, 0);
  if (cookie == -1)
    die ("%s: sending the request: %s", c->who, nbd_get_error ());
  await (c, cookie, "sending the request");
  free (msg);
  /* From the FLUSH on, the server runs the request. */
  if (changes_state (cmd))
    c->note = "; the server may still carry the request out (or have "
      "done so): see nbdmsetup info";
  cookie = nbd_aio_flush (c->nbd, NBD_NULL_COMPLETION, 0);
  if (cookie == -1)
    die ("%s: executing the request: %s", c->who, nbd_get_error ());
  await (c, cookie, "waiting for the server to execute the request");
  rsp = read_response (c, false, &status, &total);
  payload = strdup ((char *) rsp + PROTO_RSP_HDR);
  free (rsp);
  if (payload == NULL)
    die ("out of memory");
  if (status != PROTO_OK) {
    if (*payload == '\0')
      die ("%s", proto_status_name (status));
    if (cmd == PROTO_CMD_CREATE || cmd == PROTO_CMD_LOAD ||
        cmd == PROTO_CMD_REPLACE)
      die_table_error (cmd, args[0], payload);
    die ("%s", payload);
  }
  return payload;
}

/* NBD_CMD_DISC, and a short wait for the server to close: the command
 * has succeeded, so a server that does not close is left to itself.
 */
static void
disconnect (struct conn *c)
{
  double deadline = now () + 5;

  if (nbd_aio_disconnect (c->nbd, 0) == 0)
    while (!nbd_aio_is_closed (c->nbd) && !nbd_aio_is_dead (c->nbd) &&
           now () < deadline)
      if (nbd_poll (c->nbd, 100) == -1)
        break;
  nbd_close (c->nbd);
  if (c->key)
    OPENSSL_cleanse (c->key, c->keylen);
  free (c->key);
}

/* --- output helpers ---------------------------------------------------- */

static void
json_string (const char *s)
{
  putchar ('"');
  for (; *s; s++) {
    unsigned char ch = *s;
    if (ch == '"' || ch == '\\')
      printf ("\\%c", ch);
    else if (ch < 0x20)
      printf ("\\u%04x", ch);
    else
      putchar (ch);
  }
  putchar ('"');
}

/* Split payload into lines of tab-separated fields (in place). */
#define MAX_FIELDS 24
struct row {
  char *f[MAX_FIELDS];
  int n;
};

static size_t
split_rows (char *payload, struct row **rows)
{
  size_t n = 0, cap = 0;
  char *line, *save = NULL;

  *rows = NULL;
  for (line = strtok_r (payload, "\n", &save); line;
       line = strtok_r (NULL, "\n", &save)) {
    struct row r = { .n = 0 };
    char *p = line;
    while (r.n < MAX_FIELDS) {
      r.f[r.n++] = p;
      /* The last field of table/status lines may hold tabs: keep them. */
      p = strchr (p, '\t');
      if (p == NULL)
        break;
      *p++ = '\0';
    }
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      *rows = realloc (*rows, cap * sizeof **rows);
      if (*rows == NULL)
        die ("out of memory");
    }
    (*rows)[n++] = r;
  }
  return n;
}

/* The holders field(s) of an info row: names separated by tabs (the
 * last field of a row keeps its tabs), printed "a, b" or as JSON strings.
 */
static void
print_holders (char *field, bool more, bool json)
{
  char *save = NULL;
  int k = 0;

  for (char *name = strtok_r (field, "\t", &save); name;
       name = strtok_r (NULL, "\t", &save), k++) {
    if (more || k)
      printf (", ");
    if (json)
      json_string (name);
    else
      printf ("%s", name);
  }
}

/* --- commands ---------------------------------------------------------- */

/* cmd's TABLE from a file, "-" (stdin), or --table; sets table_file. */
static char *
read_table (const char *cmd, const char *arg)
{
  FILE *fp, *mem;
  char *buf = NULL, *nul;
  size_t len = 0;
  int ch;

  table_file = NULL;
  if (opts.table_text) {
    buf = strdup (opts.table_text);
    if (buf == NULL)
      die ("out of memory");
    return buf;
  }
  if (arg == NULL || strcmp (arg, "-") == 0) {
    /* It would swallow the rest of the batch. */
    if (stdin_is_batch)
      die ("%s: give the table as a file or --table TEXT in a batch "
           "read from standard input", cmd);
    fp = stdin;
    table_file = "stdin";
  }
  else if ((fp = fopen (arg, "r")) == NULL)
    die ("%s: %s", arg, strerror (errno));
  else
    table_file = arg;
  mem = open_memstream (&buf, &len);
  if (mem == NULL)
    die ("out of memory");
  while ((ch = getc (fp)) != EOF)
    putc (ch, mem);
  if (ferror (fp))
    die ("%s: read error", table_file);
  if (fp != stdin)
    fclose (fp);
  if (fclose (mem) == EOF)
    die ("out of memory");
  /* The request carries text: a NUL would end the table there and the
   * server would load the part before it (it refuses such a file at
   * start).
   */
  if ((nul = memchr (buf, '\0', len)) != NULL)
    die ("%s: table contains a NUL byte at offset %zu", table_file,
         (size_t) (nul - buf));
  return buf;
}

static void
print_version (struct conn *c)
{
  char *p = call (c, PROTO_CMD_VERSION, 0, NULL);
  struct row *rows;
  size_t n = split_rows (p, &rows);
  const char *server = n && rows[0].n >= 1 ? rows[0].f[0] : "?";
  const char *proto = n && rows[0].n >= 2 ? rows[0].f[1] : "?";

  if (opts.json) {
    printf ("{\"client\": ");
    json_string (PACKAGE_VERSION);
    printf (", \"server\": ");
    json_string (server);
    printf (", \"protocol\": %s}\n", proto);
  }
  else {
    printf ("Client version:    %s\n", PACKAGE_VERSION);
    printf ("Server version:    %s\n", server);
    printf ("Protocol version:  %s\n", proto);
  }
  free (rows);
  free (p);
}

static void
print_ls (char *p)
{
  struct row *rows;
  size_t n = split_rows (p, &rows);

  if (opts.json) {
    printf ("{\"devices\": [");
    for (size_t i = 0; i < n; i++) {
      if (rows[i].n < 3)
        die ("ls: malformed response");
      printf ("%s{\"name\": ", i ? ", " : "");
      json_string (rows[i].f[0]);
      printf (", \"size\": %s, \"state\": ", rows[i].f[1]);
      json_string (rows[i].f[2]);
      putchar ('}');
    }
    printf ("]}\n");
  }
  else if (n == 0)
    printf ("No devices found\n");
  else
    for (size_t i = 0; i < n; i++)
      printf ("%s\n", rows[i].f[0]);
  free (rows);
}

static const char *
tables_present (const char *live, const char *inactive)
{
  bool l = strcmp (live, "1") == 0, i = strcmp (inactive, "1") == 0;
  return l && i ? "LIVE & INACTIVE" : l ? "LIVE" : i ? "INACTIVE" : "None";
}

static void
print_info (char *p)
{
  struct row *rows;
  size_t n = split_rows (p, &rows);

  if (opts.json)
    printf ("{\"devices\": [");
  for (size_t i = 0; i < n; i++) {
    char **f = rows[i].f;
    if (rows[i].n < 9)
      die ("info: malformed response");
    if (opts.json) {
      printf ("%s{\"name\": ", i ? ", " : "");
      json_string (f[0]);
      printf (", \"state\": \"%s\", \"live_table\": %s, "
              "\"inactive_table\": %s, \"open_count\": %s, "
              "\"event_nr\": %s, \"targets\": %s, \"uuid\": ",
              strcmp (f[1], "SUSPENDED") == 0 ? "SUSPENDED" : "ACTIVE",
              strcmp (f[2], "1") == 0 ? "true" : "false",
              strcmp (f[3], "1") == 0 ? "true" : "false",
              f[4], f[5], f[6]);
      if (*f[7])
        json_string (f[7]);
      else
        printf ("null");
      printf (", \"size\": %s, \"holders\": [", f[8]);
      for (int j = 9; j < rows[i].n; j++)
        print_holders (f[j], j > 9, true);
      printf ("]}");
      continue;
    }
    if (i)
      putchar ('\n');
    printf ("Name:              %s\n", f[0]);
    printf ("State:             %s\n", f[1]);
    printf ("Tables present:    %s\n", tables_present (f[2], f[3]));
    printf ("Open count:        %s\n", f[4]);
    if (rows[i].n > 9 && *f[9]) {
      printf ("Holders:           ");
      for (int j = 9; j < rows[i].n; j++)
        print_holders (f[j], j > 9, false);
      putchar ('\n');
    }
    printf ("Event number:      %s\n", f[5]);
    printf ("Number of targets: %s\n", f[6]);
    if (*f[7])
      printf ("UUID: %s\n", f[7]);
  }
  if (opts.json)
    printf ("]}\n");
  else if (n == 0)
    printf ("No devices found\n");
  free (rows);
}

/* Rows "NAME\tFIELD..." grouped by device: a device without anything to
 * show is one row "NAME\t".  Each row with content is printed by item
 * (JSON: one value of the device's KEY array), after "NAME: " when all
 * devices were asked for, as dmsetup does.
 */
static void
print_grouped (char *p, bool one, const char *key, int nfields,
               void (*item) (char **f))
{
  struct row *rows;
  size_t n = split_rows (p, &rows);
  const char *prev = NULL;

  if (opts.json)
    printf ("{\"devices\": [");
  for (size_t i = 0; i < n; i++) {
    char **f = rows[i].f;
    bool first = prev == NULL || strcmp (prev, f[0]) != 0;
    bool some = rows[i].n > 1 && *f[1];

    if (some && rows[i].n < nfields + 1)
      die ("%s: malformed response", key);
    if (opts.json) {
      if (first) {
        printf ("%s{\"name\": ", prev ? "]}, " : "");
        json_string (f[0]);
        printf (", \"%s\": [", key);
      }
      if (some) {
        if (!first)
          printf (", ");
        item (f + 1);
      }
    }
    else {
      if (!one)
        printf ("%s: ", f[0]);
      if (some)
        item (f + 1);
      else if (!one)
        putchar ('\n');
    }
    prev = f[0];
  }
  if (opts.json)
    printf ("%s]}\n", prev ? "]}" : "");
  else if (!one && n == 0)
    printf ("No devices found\n");
  free (rows);
}

/* table, status: one line of text. */
static void
line_item (char **f)
{
  if (opts.json)
    json_string (f[0]);
  else
    printf ("%s\n", f[0]);
}

/* status --backends: BACKEND, KIND, STATE. */
static void
backend_item (char **f)
{
  if (!opts.json) {
    printf ("%s %s: %s\n", f[1], f[0], f[2]);
    return;
  }
  printf ("{\"backend\": ");
  json_string (f[0]);
  printf (", \"kind\": ");
  json_string (f[1]);
  printf (", \"state\": ");
  json_string (f[2]);
  printf ("}");
}

static void
print_targets (char *p)
{
  struct row *rows;
  size_t n = split_rows (p, &rows);

  if (opts.json)
    printf ("{\"targets\": [");
  for (size_t i = 0; i < n; i++) {
    if (rows[i].n < 2)
      die ("targets: malformed response");
    if (opts.json) {
      printf ("%s{\"name\": ", i ? ", " : "");
      json_string (rows[i].f[0]);
      printf (", \"version\": ");
      json_string (rows[i].f[1]);
      putchar ('}');
    }
    else
      printf ("%-16s v%s\n", rows[i].f[0], rows[i].f[1]);
  }
  if (opts.json)
    printf ("]}\n");
  free (rows);
}

/* stats: the regions' rows (PROTOCOL.md, stats), in the response's
 * order, each with its histograms when it has them.
 */
enum { ST_READ, ST_WRITE, ST_DISCARD, ST_FLUSH, ST_OPS };
static const char *const st_ops[ST_OPS] = { "read", "write", "discard",
                                            "flush" };
static const char *const st_ops_plural[ST_OPS] = { "reads", "writes",
                                                   "discards", "flushes" };
#define ST_MAX_BUCKETS 64
struct stats_row {
  const char *dev, *type;
  unsigned id;
  uint64_t start, len;          /* sectors */
  uint64_t interval_ns;
  uint64_t ios[ST_OPS], bytes[ST_OPS], ns[ST_OPS];
  uint64_t in_progress, io_ns, queue_ns;
  size_t nbounds;               /* 0: no histograms */
  uint64_t bounds[ST_MAX_BUCKETS - 1];
  uint64_t hist[ST_OPS][ST_MAX_BUCKETS];
};

static uint64_t
stats_u64 (const char *s)
{
  char *end;
  uint64_t v;

  errno = 0;
  v = strtoull (s, &end, 10);
  if (errno || end == s || *end)
    die ("stats: malformed response (number '%s')", s);
  return v;
}

/* "a,b,c" into out[0..max); the count. */
static size_t
stats_list (char *s, uint64_t *out, size_t max)
{
  size_t n = 0;
  char *save = NULL;

  for (char *w = strtok_r (s, ",", &save); w; w = strtok_r (NULL, ",", &save)) {
    if (n == max)
      die ("stats: malformed response (too many buckets)");
    out[n++] = stats_u64 (w);
  }
  return n;
}

static size_t
parse_stats (char *p, struct stats_row **out)
{
  struct row *rows;
  size_t n = split_rows (p, &rows), nr = 0;
  struct stats_row *st = calloc (n ? n : 1, sizeof *st);

  if (st == NULL)
    die ("out of memory");
  for (size_t i = 0; i < n; i++) {
    char **f = rows[i].f;

    if (rows[i].n >= 22 && strcmp (f[1], "region") == 0) {
      struct stats_row *r = &st[nr++];
      r->dev = f[0];
      r->id = stats_u64 (f[2]);
      r->start = stats_u64 (f[3]);
      r->len = stats_u64 (f[4]);
      r->type = f[5];
      r->interval_ns = stats_u64 (f[6]);
      for (int op = 0; op < ST_OPS; op++) {
        r->ios[op] = stats_u64 (f[7 + 3 * op]);
        r->bytes[op] = stats_u64 (f[8 + 3 * op]);
        r->ns[op] = stats_u64 (f[9 + 3 * op]);
      }
      r->in_progress = stats_u64 (f[19]);
      r->io_ns = stats_u64 (f[20]);
      r->queue_ns = stats_u64 (f[21]);
    }
    else if (rows[i].n >= 6 && strcmp (f[1], "histogram") == 0 && nr &&
             strcmp (st[nr - 1].dev, f[0]) == 0 &&
             st[nr - 1].id == stats_u64 (f[2])) {
      struct stats_row *r = &st[nr - 1];
      int op;
      for (op = 0; op < ST_OPS && strcmp (f[3], st_ops[op]) != 0; op++)
        ;
      if (op == ST_OPS)
        die ("stats: malformed response (operation '%s')", f[3]);
      r->nbounds = stats_list (f[4], r->bounds, ST_MAX_BUCKETS - 1);
      if (stats_list (f[5], r->hist[op], ST_MAX_BUCKETS) != r->nbounds + 1)
        die ("stats: malformed response (histogram of %s)", f[3]);
    }
    else
      die ("stats: malformed response");
  }
  free (rows);
  *out = st;
  return nr;
}

/* A size as LVM prints one (dmstats' default units): 1024-based, two
 * decimals and the unit's letter, "0" for nothing.
 */
static const char *
stats_size (double bytes, char *buf, size_t len)
{
  static const char units[] = "bkmgtpe";
  int u = 0;

  if (bytes < 0.005) {
    snprintf (buf, len, "0");
    return buf;
  }
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    u++;
  }
  snprintf (buf, len, "%.2f%c", bytes, units[u]);
  return buf;
}

/* dmstats report's default columns, over the interval since the
 * counters started (created, reloaded or cleared).  Nothing is merged
 * here (nbdkit hands the plugin each NBD request as it comes): the
 * merge columns are 0.
 */
static void
print_stats_report (const struct stats_row *st, size_t n)
{
  char a[32], b[32], c[32], d[32], e[32];

  printf ("%-16s %4s %4s %7s %7s %6s %6s %8s %8s %7s %7s %7s %5s %5s "
          "%7s %7s %7s\n", "Name", "RgID", "ArID", "ArStart", "ArSize",
          "RMrg/s", "WMrg/s", "R/s", "W/s", "RSz/s", "WSz/s", "AvgRqSz",
          "QSize", "Util%", "AWait", "RdAWait", "WrAWait");
  for (size_t i = 0; i < n; i++) {
    const struct stats_row *r = &st[i];
    double secs = r->interval_ns > 0 ? r->interval_ns / 1e9 : 1;
    uint64_t rw = r->ios[ST_READ] + r->ios[ST_WRITE];
    uint64_t rwbytes = r->bytes[ST_READ] + r->bytes[ST_WRITE];
    double util = 100.0 * r->io_ns / (r->interval_ns ? r->interval_ns : 1);

    printf ("%-16s %4u %4u %7s %7s %6.2f %6.2f %8.2f %8.2f %7s %7s %7s "
            "%5.2f %5.2f %7.2f %7.2f %7.2f\n", r->dev, r->id, 0,
            stats_size (r->start * 512.0, a, sizeof a),
            stats_size (r->len * 512.0, b, sizeof b), 0.0, 0.0,
            r->ios[ST_READ] / secs, r->ios[ST_WRITE] / secs,
            stats_size (r->bytes[ST_READ] / secs, c, sizeof c),
            stats_size (r->bytes[ST_WRITE] / secs, d, sizeof d),
            stats_size (rw ? (double) rwbytes / rw : 0, e, sizeof e),
            r->queue_ns / 1e9 / secs, util > 100 ? 100 : util,
            rw ? (r->ns[ST_READ] + r->ns[ST_WRITE]) / 1e6 / rw : 0,
            r->ios[ST_READ] ? r->ns[ST_READ] / 1e6 / r->ios[ST_READ] : 0,
            r->ios[ST_WRITE] ? r->ns[ST_WRITE] / 1e6 / r->ios[ST_WRITE] : 0);
  }
}

static void
print_stats_json (const struct stats_row *st, size_t n)
{
  const char *prev = NULL;

  printf ("{\"devices\": [");
  for (size_t i = 0; i < n; i++) {
    const struct stats_row *r = &st[i];

    if (prev == NULL || strcmp (prev, r->dev) != 0) {
      printf ("%s{\"name\": ", prev ? "]}, " : "");
      json_string (r->dev);
      printf (", \"regions\": [");
    }
    else
      printf (", ");
    prev = r->dev;
    printf ("{\"region_id\": %u, \"start\": %" PRIu64 ", \"length\": %"
            PRIu64 ", \"target\": ", r->id, r->start, r->len);
    json_string (r->type);
    printf (", \"interval_ns\": %" PRIu64, r->interval_ns);
    for (int op = 0; op < ST_OPS; op++) {
      const char *o = st_ops[op];
      printf (", \"%s\": %" PRIu64, st_ops_plural[op], r->ios[op]);
      if (op != ST_FLUSH)
        printf (", \"%s_merged\": 0, \"%s_sectors\": %" PRIu64
                ", \"%s_bytes\": %" PRIu64, st_ops_plural[op], o,
                r->bytes[op] / 512, o, r->bytes[op]);
      printf (", \"%s_ns\": %" PRIu64, o, r->ns[op]);
    }
    printf (", \"in_progress\": %" PRIu64 ", \"io_ns\": %" PRIu64
            ", \"queue_ns\": %" PRIu64, r->in_progress, r->io_ns,
            r->queue_ns);
    if (r->nbounds) {
      printf (", \"histograms\": {\"bounds_ns\": [");
      for (size_t k = 0; k < r->nbounds; k++)
        printf ("%s%" PRIu64, k ? ", " : "", r->bounds[k]);
      printf ("]");
      for (int op = 0; op < ST_OPS; op++) {
        printf (", \"%s\": [", st_ops[op]);
        for (size_t k = 0; k <= r->nbounds; k++)
          printf ("%s%" PRIu64, k ? ", " : "", r->hist[op][k]);
        printf ("]");
      }
      printf ("}");
    }
    printf ("}");
  }
  printf ("%s]}\n", prev ? "]}" : "");
}

/* A label value of the exposition format: \, " and newline escaped. */
static void
prom_label (const char *s)
{
  putchar ('"');
  for (; *s; s++)
    if (*s == '\\' || *s == '"')
      printf ("\\%c", *s);
    else if (*s == '\n')
      printf ("\\n");
    else
      putchar (*s);
  putchar ('"');
}

static void
prom_labels (const struct stats_row *r)
{
  printf ("{device=");
  prom_label (r->dev);
  printf (",region=\"%u\",start=\"%" PRIu64 "\",length=\"%" PRIu64
          "\",target=", r->id, r->start, r->len);
  prom_label (r->type);
}

/* The Prometheus text exposition format (version 0.0.4): each family's
 * HELP and TYPE, then its samples for every region of every device.
 */
static void
print_stats_prometheus (const struct stats_row *st, size_t n)
{
  static const struct {
    const char *name, *type, *help;
    int what, op;               /* what: 0 ios, 1 bytes, 2 seconds, 3.. */
  } fam[] = {
    { "reads_total", "counter", "Reads completed.", 0, ST_READ },
    { "read_bytes_total", "counter", "Bytes read.", 1, ST_READ },
    { "read_seconds_total", "counter", "Time spent reading (the requests' "
      "times, summed).", 2, ST_READ },
    { "writes_total", "counter", "Writes (and write zeroes) completed.", 0,
      ST_WRITE },
    { "written_bytes_total", "counter", "Bytes written.", 1, ST_WRITE },
    { "write_seconds_total", "counter", "Time spent writing.", 2, ST_WRITE },
    { "discards_total", "counter", "Discards (trims) completed.", 0,
      ST_DISCARD },
    { "discarded_bytes_total", "counter", "Bytes discarded.", 1,
      ST_DISCARD },
    { "discard_seconds_total", "counter", "Time spent discarding.", 2,
      ST_DISCARD },
    { "flushes_total", "counter", "Flushes completed (device region "
      "only).", 0, ST_FLUSH },
    { "flush_seconds_total", "counter", "Time spent flushing.", 2,
      ST_FLUSH },
    { "in_progress", "gauge", "Requests in flight.", 3, 0 },
    { "io_seconds_total", "counter", "Time with requests in flight (an "
      "upper bound with concurrent requests).", 4, 0 },
    { "queue_seconds_total", "counter", "Weighted time in flight (the "
      "requests' times, summed).", 5, 0 },
  };

  for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++) {
    printf ("# HELP nbdmapper_%s %s\n# TYPE nbdmapper_%s %s\n", fam[k].name,
            fam[k].help, fam[k].name, fam[k].type);
    for (size_t i = 0; i < n; i++) {
      const struct stats_row *r = &st[i];
      int op = fam[k].op;

      printf ("nbdmapper_%s", fam[k].name);
      prom_labels (r);
      printf ("} ");
      switch (fam[k].what) {
      case 0: printf ("%" PRIu64 "\n", r->ios[op]); break;
      case 1: printf ("%" PRIu64 "\n", r->bytes[op]); break;
      case 2: printf ("%.9f\n", r->ns[op] / 1e9); break;
      case 3: printf ("%" PRIu64 "\n", r->in_progress); break;
      case 4: printf ("%.9f\n", r->io_ns / 1e9); break;
      default: printf ("%.9f\n", r->queue_ns / 1e9); break;
      }
    }
  }
  printf ("# HELP nbdmapper_request_duration_seconds Request latency, per "
          "operation (device region).\n"
          "# TYPE nbdmapper_request_duration_seconds histogram\n");
  for (size_t i = 0; i < n; i++) {
    const struct stats_row *r = &st[i];

    for (int op = 0; r->nbounds && op < ST_OPS; op++) {
      uint64_t cum = 0;

      for (size_t k = 0; k <= r->nbounds; k++) {
        cum += r->hist[op][k];
        printf ("nbdmapper_request_duration_seconds_bucket");
        prom_labels (r);
        printf (",op=\"%s\",le=", st_ops[op]);
        if (k < r->nbounds)
          printf ("\"%g\"} %" PRIu64 "\n", r->bounds[k] / 1e9, cum);
        else
          printf ("\"+Inf\"} %" PRIu64 "\n", cum);
      }
      printf ("nbdmapper_request_duration_seconds_sum");
      prom_labels (r);
      printf (",op=\"%s\"} %.9f\n", st_ops[op], r->ns[op] / 1e9);
      printf ("nbdmapper_request_duration_seconds_count");
      prom_labels (r);
      printf (",op=\"%s\"} %" PRIu64 "\n", st_ops[op], cum);
    }
  }
}

static void
print_stats (char *p)
{
  struct stats_row *st;
  size_t n = parse_stats (p, &st);

  if (opts.json)
    print_stats_json (st, n);
  else if (opts.prometheus)
    print_stats_prometheus (st, n);
  else
    print_stats_report (st, n);
  free (st);
}

/* clients: EXPORT, FAMILY, PEER, TLS, SINCE (Unix time), IN-FLIGHT,
 * REQUESTS.
 */
static void
print_clients (char *p)
{
  struct row *rows;
  size_t n = split_rows (p, &rows);

  if (opts.json)
    printf ("{\"clients\": [");
  else
    printf ("%-16s %-24s %-3s %-20s %8s %10s\n", "Export", "Peer", "TLS",
            "Since", "InFlight", "Requests");
  for (size_t i = 0; i < n; i++) {
    char **f = rows[i].f;
    char since[32] = "?";
    double t;
    time_t secs;
    struct tm tm;

    if (rows[i].n < 7)
      die ("clients: malformed response");
    t = strtod (f[4], NULL);
    secs = (time_t) t;
    if (gmtime_r (&secs, &tm))
      strftime (since, sizeof since, "%Y-%m-%dT%H:%M:%SZ", &tm);
    if (opts.json) {
      printf ("%s{\"export\": ", i ? ", " : "");
      json_string (f[0]);
      printf (", \"family\": ");
      json_string (f[1]);
      printf (", \"peer\": ");
      json_string (f[2]);
      printf (", \"tls\": %s, \"since\": %s, \"since_utc\": \"%s\", "
              "\"in_flight\": %s, \"requests\": %s}",
              strcmp (f[3], "1") == 0 ? "true" : "false", f[4], since, f[5],
              f[6]);
    }
    else
      printf ("%-16s %-24s %-3s %-20s %8s %10s\n", f[0],
              strcmp (f[1], "unix") == 0 || strcmp (f[1], "tcp") == 0
              ? f[2] : "-", strcmp (f[3], "1") == 0 ? "yes" : "no", since,
              f[5], f[6]);
  }
  if (opts.json)
    printf ("]}\n");
  free (rows);
}

static void
need (int argc, int min, int max, const char *cmd)
{
  if (argc < min || argc > max)
    die ("%s: wrong number of arguments (see nbdmsetup --help)", cmd);
}

/* A number of seconds, 0 to a year. */
static double
parse_seconds (const char *what, const char *s)
{
  char *end;
  double v;

  errno = 0;
  v = strtod (s, &end);
  if (errno || *end || end == s || !(v >= 0) || v > 86400 * 365)
    die ("%s: '%s' is not a number of seconds", what, s);
  return v;
}

/* Parse options (GNU getopt permutes: they may follow the command).
 * In a batch line only the per-command options are allowed.
 */
static void
parse_options (int argc, char *argv[], bool batch_line)
{
  enum { OPT_NOFLUSH = 256, OPT_FORCE, OPT_INACTIVE, OPT_SHOWKEYS, OPT_UUID,
         OPT_TABLE, OPT_TIMEOUT, OPT_BACKENDS, OPT_CLEAR, OPT_PROMETHEUS,
         OPT_REGION };
  static const struct option long_opts[] = {
    { "connect", required_argument, NULL, 'c' },
    { "key", required_argument, NULL, 'k' },
    { "json", no_argument, NULL, 'j' },
    { "help", no_argument, NULL, 'h' },
    { "version", no_argument, NULL, 'V' },
    { "noflush", no_argument, NULL, OPT_NOFLUSH },
    { "force", no_argument, NULL, OPT_FORCE },
    { "inactive", no_argument, NULL, OPT_INACTIVE },
    { "showkeys", no_argument, NULL, OPT_SHOWKEYS },
    { "backends", no_argument, NULL, OPT_BACKENDS },
    { "uuid", required_argument, NULL, OPT_UUID },
    { "table", required_argument, NULL, OPT_TABLE },
    { "timeout", required_argument, NULL, OPT_TIMEOUT },
    { "clear", no_argument, NULL, OPT_CLEAR },
    { "prometheus", no_argument, NULL, OPT_PROMETHEUS },
    { "region", required_argument, NULL, OPT_REGION },
    { NULL },
  };
  int opt;

  optind = 0;                   /* GNU: start afresh (batch lines) */
  opterr = !batch_line;
  while ((opt = getopt_long (argc, argv, "c:k:jhV", long_opts,
                             NULL)) != -1) {
    if (batch_line && (opt == 'c' || opt == 'k' || opt == 'h' || opt == 'V'))
      die ("-%c: give it on the command line, not in a batch", opt);
    if (batch_line && opt == '?') {
      /* A short option may sit in a cluster (-jx) that optind has not
       * passed yet: name the letter.  optopt is 0 for an unknown long
       * option and the option's value (> 255) for a missing argument.
       */
      if (optopt > 0 && optopt < 256)
        die ("'-%c': unknown option or missing value", optopt);
      die ("'%s': unknown option or missing value", argv[optind - 1]);
    }
    switch (opt) {
    case 'c': uri = optarg; break;
    case 'k': key_file = optarg; break;
    case 'j': opts.json = true; break;
    case 'h': usage (stdout, EXIT_SUCCESS);
    case 'V': printf ("nbdmsetup %s\n", PACKAGE_VERSION); exit (EXIT_SUCCESS);
    case OPT_NOFLUSH: opts.flags |= PROTO_F_NOFLUSH; break;
    case OPT_FORCE: opts.flags |= PROTO_F_FORCE; break;
    case OPT_INACTIVE: opts.flags |= PROTO_F_INACTIVE; break;
    case OPT_SHOWKEYS: opts.flags |= PROTO_F_SHOWKEYS; break;
    case OPT_BACKENDS: opts.flags |= PROTO_F_BACKENDS; break;
    case OPT_UUID: opts.uuid = optarg; break;
    case OPT_TABLE: opts.table_text = optarg; break;
    case OPT_TIMEOUT: opts.timeout = parse_seconds ("--timeout", optarg); break;
    case OPT_CLEAR: opts.flags |= PROTO_F_CLEAR; break;
    case OPT_PROMETHEUS: opts.prometheus = true; break;
    case OPT_REGION: opts.region = optarg; break;
    default: usage (stderr, EXIT_FAILURE);
    }
  }
}

static const struct { const char *name; unsigned code; int min, max; }
commands[] = {
  { "version", PROTO_CMD_VERSION, 0, 0 }, { "ls", PROTO_CMD_LIST, 0, 0 },
  { "create", PROTO_CMD_CREATE, 1, 2 }, { "load", PROTO_CMD_LOAD, 1, 2 },
  { "reload", PROTO_CMD_LOAD, 1, 2 }, { "clear", PROTO_CMD_CLEAR, 1, 1 },
  { "suspend", PROTO_CMD_SUSPEND, 1, 1 },
  { "resume", PROTO_CMD_RESUME, 1, 1 },
  { "replace", PROTO_CMD_REPLACE, 1, 2 },
  { "remove", PROTO_CMD_REMOVE, 1, 1 },
  { "rename", PROTO_CMD_RENAME, 2, 2 }, { "info", PROTO_CMD_INFO, 0, 1 },
  { "table", PROTO_CMD_TABLE, 0, 1 }, { "status", PROTO_CMD_STATUS, 0, 1 },
  { "message", PROTO_CMD_MESSAGE, 3, PROTO_MAX_ARGS - 2 },
  { "targets", PROTO_CMD_TARGETS, 0, 0 }, { "wait", PROTO_CMD_WAIT, 1, 2 },
  { "stats", PROTO_CMD_STATS, 0, 1 }, { "clients", PROTO_CMD_CLIENTS, 0, 1 },
};

/* The options that belong to one command: given to another, they would
 * be ignored without a word.
 */
static void
check_options (const char *cmd, unsigned code, int argc, char *argv[])
{
  static const struct { uint32_t flag; const char *name; unsigned code; }
  flag_opts[] = {
    { PROTO_F_NOFLUSH, "--noflush", PROTO_CMD_SUSPEND },
    { PROTO_F_FORCE, "--force", PROTO_CMD_REMOVE },
    { PROTO_F_INACTIVE, "--inactive", PROTO_CMD_TABLE },
    { PROTO_F_SHOWKEYS, "--showkeys", PROTO_CMD_TABLE },
    { PROTO_F_BACKENDS, "--backends", PROTO_CMD_STATUS },
    { PROTO_F_CLEAR, "--clear", PROTO_CMD_STATS },
  };
  bool takes_table = code == PROTO_CMD_CREATE || code == PROTO_CMD_LOAD ||
    code == PROTO_CMD_REPLACE;

  for (size_t i = 0; i < sizeof flag_opts / sizeof flag_opts[0]; i++)
    if ((opts.flags & flag_opts[i].flag) && code != flag_opts[i].code)
      die ("%s is an option of %s", flag_opts[i].name,
           proto_cmd_name (flag_opts[i].code));
  if (opts.uuid && code != PROTO_CMD_CREATE)
    die ("--uuid is an option of create");
  if ((opts.prometheus || opts.region) && code != PROTO_CMD_STATS)
    die ("%s is an option of stats",
         opts.prometheus ? "--prometheus" : "--region");
  if (opts.prometheus && opts.json)
    die ("stats: --json or --prometheus, not both");
  if (opts.region) {
    if (argc == 0)
      die ("stats: --region needs a device name");
    if (strspn (opts.region, "0123456789") != strlen (opts.region) ||
        !*opts.region || strlen (opts.region) > 9)
      die ("stats: --region '%s' is not a region number", opts.region);
  }
  if (opts.table_text && !takes_table)
    die ("--table is an option of create, load, reload and replace");
  /* The table is the argument after NAME or --table, not both. */
  if (opts.table_text && argc == 2)
    die ("%s: a table file ('%s') and --table: give one of them", cmd,
         argv[1]);
}

/* Check a command's name, arguments and options (before connecting). */
static unsigned
command_code (const char *cmd, int argc, char *argv[])
{
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp (cmd, commands[i].name) == 0) {
      need (argc, commands[i].min, commands[i].max, cmd);
      check_options (cmd, commands[i].code, argc, argv);
      return commands[i].code;
    }
  die ("unknown command '%s' (see nbdmsetup --help)", cmd);
}

/* Run one checked command: argv holds its arguments after the name. */
static void
run_command (struct conn *c, const char *cmd, unsigned code, int argc,
             char *argv[])
{
  char *p = NULL;

  switch (code) {
  case PROTO_CMD_VERSION:
    print_version (c);
    break;
  case PROTO_CMD_LIST:
    p = call (c, code, 0, NULL);
    print_ls (p);
    break;
  case PROTO_CMD_INFO:
    p = call (c, code, argc, (const char *const *) argv);
    print_info (p);
    break;
  case PROTO_CMD_TABLE: case PROTO_CMD_STATUS:
    p = call (c, code, argc, (const char *const *) argv);
    if (opts.flags & PROTO_F_BACKENDS)
      print_grouped (p, argc == 1, "backends", 3, backend_item);
    else
      print_grouped (p, argc == 1, code == PROTO_CMD_TABLE ? "table" : "status",
                     1, line_item);
    break;
  case PROTO_CMD_TARGETS:
    p = call (c, code, 0, NULL);
    print_targets (p);
    break;
  case PROTO_CMD_CREATE: {
    char *t = NULL;
    const char *args[3] = { argv[0], opts.uuid ? opts.uuid : "", NULL };
    if (argc == 2 || opts.table_text)
      t = read_table (cmd, argc == 2 ? argv[1] : NULL);
    args[2] = t;
    p = call (c, code, t ? 3 : 2, args);
    free (t);
    break;
  }
  case PROTO_CMD_LOAD: case PROTO_CMD_REPLACE: {
    char *t = read_table (cmd, argc == 2 ? argv[1] : NULL);
    const char *args[2] = { argv[0], t };
    p = call (c, code, 2, args);
    free (t);
    break;
  }
  case PROTO_CMD_WAIT: {
    char ms[32] = "";
    const char *args[3] = { argv[0], argc == 2 ? argv[1] : "", ms };
    if (opts.timeout >= 0)
      snprintf (ms, sizeof ms, "%lld", (long long) (opts.timeout * 1000));
    p = call (c, code, opts.timeout >= 0 ? 3 : 2, args);
    if (opts.json)
      printf ("{\"event_nr\": %s}\n", strtok (p, "\n") ? p : "0");
    break;
  }
  case PROTO_CMD_STATS: {
    const char *args[2] = { argc ? argv[0] : "", opts.region };
    p = call (c, code, opts.region ? 2 : argc, args);
    print_stats (p);
    break;
  }
  case PROTO_CMD_CLIENTS:
    p = call (c, code, argc, (const char *const *) argv);
    print_clients (p);
    break;
  case PROTO_CMD_MESSAGE:
    p = call (c, code, argc, (const char *const *) argv);
    if (*p)
      printf ("%s%s", p, p[strlen (p) - 1] == '\n' ? "" : "\n");
    break;
  default:
    p = call (c, code, argc, (const char *const *) argv);
    break;
  }
  free (p);
  if (fflush (stdout) == EOF)
    die ("standard output: %s", strerror (errno));
}

/* Split a batch line into words, in place: blanks separate words,
 * '...' and "..." quote, a backslash escapes the next character (outside
 * single quotes), '#' at the start of a word begins a comment.
 * Returns the number of words; at most max (the rest is an error).
 */
static int
split_words (char *line, char **words, int max)
{
  char *in = line, *out = line;
  int n = 0;

  for (;;) {
    while (*in == ' ' || *in == '\t' || *in == '\r' || *in == '\n')
      in++;
    if (*in == '\0' || *in == '#')
      return n;
    if (n == max)
      die ("too many words (at most %d)", max);
    words[n++] = out;
    while (*in && *in != ' ' && *in != '\t' && *in != '\r' && *in != '\n') {
      char q = *in;
      if (q == '\'' || q == '"') {
        in++;
        while (*in && *in != q) {
          if (q == '"' && *in == '\\' && in[1])
            in++;
          *out++ = *in++;
        }
        if (*in != q)
          die ("unterminated %c quote", q);
        in++;
      }
      else {
        if (*in == '\\' && in[1])
          in++;
        *out++ = *in++;
      }
    }
    if (*in)
      in++;
    *out++ = '\0';
  }
}

/* nbdmsetup batch [FILE]: one command per line, over one connection.
 * The first failing line stops the batch; the message names the line.
 */
static void
run_batch (struct conn *c, const char *file)
{
  FILE *fp = stdin;
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  const struct options defaults = opts;   /* from the command line */

  if (file && strcmp (file, "-") != 0 && (fp = fopen (file, "r")) == NULL)
    die ("%s: %s", file, strerror (errno));
  stdin_is_batch = fp == stdin;
  if (stdin_is_batch)
    file = "stdin";
  batch_file = file;
  while ((len = getline (&line, &cap, fp)) != -1) {
    char *words[PROTO_MAX_ARGS + 3];  /* "nbdmsetup", words, NULL */
    char *nul;
    int n;

    batch_lineno++;
    /* It would end the line there, and the rest be dropped unseen. */
    if ((nul = memchr (line, '\0', len)) != NULL)
      die ("NUL byte at offset %zu of the line", (size_t) (nul - line));
    n = split_words (line, words + 1, PROTO_MAX_ARGS + 1);
    if (n == 0)
      continue;
    words[0] = (char *) "nbdmsetup";
    words[n + 1] = NULL;
    opts = defaults;
    parse_options (n + 1, words, true);
    if (optind >= n + 1)
      die ("no command");
    const char *cmd = words[optind];
    if (strcmp (cmd, "batch") == 0)
      die ("batch: not a command of a batch");
    int argc = n + 1 - optind - 1;
    unsigned code = command_code (cmd, argc, words + optind + 1);
    run_command (c, cmd, code, argc, words + optind + 1);
  }
  batch_file = NULL;
  if (ferror (fp))
    die ("%s: read error", file);
  free (line);
  if (fp != stdin)
    fclose (fp);
}

int
main (int argc, char *argv[])
{
  struct conn c = { NULL };
  const char *cmd, *env;
  unsigned code = 0;

  uri = getenv ("NBDMSETUP_URI");
  key_file = getenv ("NBDMSETUP_KEY");
  if (key_file && *key_file == '\0')
    key_file = NULL;
  if ((env = getenv ("NBDMSETUP_TIMEOUT")) != NULL && *env) {
    default_timeout = parse_seconds ("$NBDMSETUP_TIMEOUT", env);
    default_from_env = true;
  }
  parse_options (argc, argv, false);
  argv += optind;
  argc -= optind;
  if (argc < 1)
    die ("no command (see nbdmsetup --help)");
  cmd = *argv++;
  argc--;
  if (uri == NULL)
    die ("no control export: use --connect URI or $NBDMSETUP_URI");

  /* Check the arguments before connecting. */
  if (strcmp (cmd, "batch") == 0)
    need (argc, 0, 1, cmd);
  else
    code = command_code (cmd, argc, argv);

  connect_control (&c, code);
  if (code == 0)
    run_batch (&c, argc ? argv[0] : NULL);
  else
    run_command (&c, cmd, code, argc, argv);
  disconnect (&c);
  return EXIT_SUCCESS;
}

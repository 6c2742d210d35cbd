/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdmsetup: dmsetup for nbdmapper, over NBD to the control export.
 * A thin layer: parse arguments, connect, read the HELLO, send one
 * request, print the response in dmsetup's format or as JSON.
 */
#include <config.h>

#include <assert.h>
#include <ctype.h>
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
#include "nbdmsetup.h"

static const char *uri;
static const char *key_file;
struct options opts = { .timeout = -1 };
/* Seconds to wait for the server to connect and for each reply, when
 * --timeout does not say (it does not for wait, where it is the event's
 * timeout): $NBDMSETUP_TIMEOUT, else this.  0: no limit.
 */
static double default_timeout = 30;
static bool default_from_env;   /* it is $NBDMSETUP_TIMEOUT */
static const char *batch_file;  /* the batch being run, or NULL */
static unsigned batch_lineno;   /* the line of it being run */
static bool stdin_is_batch;     /* the batch's lines come from stdin */
const char *die_note;

void
die (const char *fmt, ...)
{
  va_list ap;

  fputs ("nbdmsetup: ", stderr);
  if (batch_file)
    fprintf (stderr, "%s:%u: ", batch_file, batch_lineno);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  if (die_note)
    fprintf (stderr, " (%s)", die_note);
  fputc ('\n', stderr);
  exit (EXIT_FAILURE);
}

static void __attribute__ ((noreturn))
usage (FILE *fp, int status)
{
  fprintf (fp,
"Usage: nbdmsetup [-a URI] [-k KEYFILE] [--json] [-v] COMMAND [ARGS...]\n"
"Drive the devices of an nbdmapper server (nbdkit mapper) like dmsetup.\n"
"NAME may be replaced by -u UUID.\n"
"\n"
"Commands:\n"
"  version                          client and server versions\n"
"  ls [--target TYPE] [--tree [-o OPTIONS]]\n"
"                                   list devices (or their stacking tree)\n"
"  create NAME [-u UUID] [-r] [-n|--table TEXT|TABLE]\n"
"                                   new device (-n: suspended, no table)\n"
"  load|reload NAME [-r] [TABLE]    fill the inactive table slot\n"
"  clear NAME                       drop the inactive table\n"
"  suspend [--noflush] NAME         hold new I/O, drain, flush\n"
"  resume NAME                      make the inactive table live, release I/O\n"
"  replace NAME [-r] [TABLE]        load + suspend + resume in one step\n"
"  remove [-f] NAME                 remove a device\n"
"  remove_all [-f]                  remove every device, holders first\n"
"  wipe_table NAME                  replace the table with an error table\n"
"  rename OLD NEW                   rename a device\n"
"  info [NAME]                      state, tables, counts (dmsetup info)\n"
"  info -c [-o FIELDS] [-O FIELDS] [--noheadings] [--separator S]\n"
"       [--nameprefixes] [NAME]     the same in columns (-o help: fields)\n"
"  deps [NAME]                      the backends each device uses\n"
"  table [--inactive] [--showkeys] [--target TYPE] [NAME]\n"
"  status [--backends] [--target TYPE] [NAME]\n"
"                                   per-target status lines, or each\n"
"                                   backend's state (NBD connections)\n"
"  message NAME SECTOR WORDS...     send a message to a target\n"
"  targets, target-version [TYPE...]  target types and versions\n"
"  stats [--clear] [--region ID] [--json|--prometheus] [NAME]\n"
"                                   I/O statistics (dmstats report)\n"
"  clients [NAME]                   client connections (of NAME)\n"
"  wait NAME [EVENT_NR] [--timeout S]  (S: how long to wait for the event)\n"
"  move [--method mirror|clone] [--log core|FILE] [--metadata FILE]\n"
"       [--region-size SECTORS] NAME DEST\n"
"                                   move NAME's data to DEST while in use\n"
"                                   (a mirror or clone, then a linear table\n"
"                                   on DEST)\n"
"  move --resume NAME [DEST]        go on with an interrupted move\n"
"  move --abort NAME                back to the source (mirror only)\n"
"  batch [FILE]                     commands from FILE (default standard\n"
"                                   input), one per line, one connection\n"
"  help [-c]                        this help (-c: the info -c fields)\n"
"\n"
"TABLE is a file, or - for standard input (the default for create,\n"
"load and replace), or --table 'TEXT'.  -- ends the options.\n"
"\n"
"Options:\n"
"  -a, --connect URI   the control export (default $NBDMSETUP_URI), e.g.\n"
"                      nbd+unix:///control?socket=/run/nbdmapper.sock\n"
"  -k, --key FILE      HMAC key file (default $NBDMSETUP_KEY)\n"
"  --json              JSON output for read commands\n"
"  -c, -C, --columns   info in columns; -o, --options FIELDS selects them\n"
"  -u, --uuid UUID     create: the uuid; else the device with this uuid\n"
"  -f, --force         remove, remove_all: even while clients are connected\n"
"  -n, --notable       create: no table;  -r, --readonly: a read-only table\n"
"  -v, --verbose       deps, table, status, wait: the device's info first\n"
"  -y, --yes           accepted (nbdmsetup never asks)\n"
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

/* Send one request with flags; return the response payload (malloc'd,
 * NUL-ended) and its status in *status, whatever it is: the caller
 * deals with a server-side error (move waits with a timeout, and says
 * what a refusal left unchanged).  Transport failures still exit 1.
 */
char *
call_status (struct conn *c, unsigned cmd, uint32_t flags, unsigned nargs,
             const char *const *args, uint16_t *status)
{
  static uint64_t seq;
  char errmsg[256];
  uint8_t *msg, *rsp;
  size_t len;
  uint32_t total;
  char *payload;
  int64_t cookie;

  c->who = proto_cmd_name (cmd);
  c->secs = time_limit (cmd, false, &c->origin);
  c->note = "";
  if (proto_encode_request (cmd, flags, ++seq, nargs, args, c->key,
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
  rsp = read_response (c, false, status, &total);
  payload = strdup ((char *) rsp + PROTO_RSP_HDR);
  free (rsp);
  if (payload == NULL)
    die ("out of memory");
  return payload;
}

/* Send one request with flags; return the response payload (malloc'd,
 * NUL-ended).  A server-side error is printed and exits 1.
 */
char *
call_flags (struct conn *c, unsigned cmd, uint32_t flags, unsigned nargs,
            const char *const *args)
{
  uint16_t status;
  char *payload = call_status (c, cmd, flags, nargs, args, &status);

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

/* The same with the command line's flags. */
char *
call (struct conn *c, unsigned cmd, unsigned nargs, const char *const *args)
{
  return call_flags (c, cmd, opts.flags, nargs, args);
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

void
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

/* s is a decimal number that fits in 64 bits. */
static bool
is_u64 (const char *s)
{
  char *end;

  errno = 0;
  strtoull (s, &end, 10);
  return isdigit (*s) && !errno && *end == '\0';
}

/* Split payload into lines of tab-separated fields (in place). */
size_t
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

/* Rows "NAME\tFIELD..." grouped by device: a device without anything to
 * show is one row "NAME\t".  Each row with content is printed by item
 * (JSON: one value of the device's KEY array), after "NAME: " when all
 * devices were asked for, as dmsetup does.  --target keeps the lines of
 * targets of that type (and the devices that have some).
 */
static void
print_grouped (struct conn *c, char *p, bool one, const char *key,
               int nfields, void (*item) (char **f))
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
    if (opts.target && (!some || !line_has_target (f[1], opts.target)))
      continue;
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
      if (first && opts.verbose) {
        if (prev)
          putchar ('\n');
        verbose_info (c, f[0]);
      }
      else if (!one)
        printf ("%s: ", f[0]);
      if (some)
        item (f + 1);
      else if (!one && !opts.verbose)
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
print_targets (char *p, int argc, char **argv)
{
  struct row *rows;
  size_t n = split_rows (p, &rows), shown = 0;

  if (opts.json)
    printf ("{\"targets\": [");
  for (size_t i = 0; i < n; i++) {
    bool match = argc == 0;
    if (rows[i].n < 2)
      die ("targets: malformed response");
    for (int j = 0; j < argc && !match; j++)
      match = strcmp (argv[j], rows[i].f[0]) == 0;
    if (!match)
      continue;
    if (opts.json) {
      printf ("%s{\"name\": ", shown ? ", " : "");
      json_string (rows[i].f[0]);
      printf (", \"version\": ");
      json_string (rows[i].f[1]);
      putchar ('}');
    }
    else
      printf ("%-16s v%s\n", rows[i].f[0], rows[i].f[1]);
    shown++;
  }
  if (opts.json)
    printf ("]}\n");
  /* dmsetup target-version: an unknown target is an error. */
  for (int j = 0; j < argc; j++) {
    bool known = false;
    for (size_t i = 0; i < n && !known; i++)
      known = strcmp (argv[j], rows[i].f[0]) == 0;
    if (!known)
      die ("target-version: unknown target type '%s' (see targets)", argv[j]);
  }
  free (rows);
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

/* --- options --------------------------------------------------------------- */

enum {
  OPT_NOFLUSH = 256, OPT_INACTIVE, OPT_SHOWKEYS, OPT_TABLE, OPT_TIMEOUT,
  OPT_BACKENDS, OPT_NOHEADINGS, OPT_SEPARATOR, OPT_TARGET, OPT_TREE,
  OPT_NAMEPREFIXES, OPT_JSON, OPT_CLEAR, OPT_PROMETHEUS, OPT_REGION,
  OPT_RESUME, OPT_ABORT, OPT_LOG, OPT_REGION_SIZE, OPT_METHOD, OPT_METADATA,
  OPT_IGNORED,                  /* dmsetup's, nothing to do here */
  OPT_NOT_HERE,                 /* dmsetup's, cannot apply here */
};

/* dmsetup's options that nbdmsetup takes and ignores (nothing to do:
 * no udev, no device nodes, no filesystem on the server to freeze) or
 * refuses (they would do something nbdmapper cannot), saying why.
 * Their long_opts entries carry OPT_IGNORED or OPT_NOT_HERE.
 */
static const struct { const char *name; int has_arg; const char *why; }
dmsetup_opts[] = {
  { "nolockfs", no_argument, NULL },
  { "noopencount", no_argument, NULL },
  { "noudevrules", no_argument, NULL },
  { "noudevsync", no_argument, NULL },
  { "verifyudev", no_argument, NULL },
  { "addnodeoncreate", no_argument, NULL },
  { "addnodeonresume", no_argument, NULL },
  { "udevcookie", required_argument, NULL },
  { "retry", no_argument, NULL },
  { "checks", no_argument, NULL },
  { "major", required_argument, "nbdmapper devices have no device numbers "
    "(they are NBD exports): name the device, or -u UUID" },
  { "minor", required_argument, "nbdmapper devices have no device numbers "
    "(they are NBD exports): name the device, or -u UUID" },
  { "uid", required_argument, "nbdmapper devices have no device node to "
    "own: an NBD client (nbd-client, qemu-nbd -c) makes one" },
  { "gid", required_argument, "nbdmapper devices have no device node to "
    "own: an NBD client (nbd-client, qemu-nbd -c) makes one" },
  { "mode", required_argument, "nbdmapper devices have no device node to "
    "own: an NBD client (nbd-client, qemu-nbd -c) makes one" },
  { "select", required_argument, "not supported: filter info -c "
    "--noheadings --separator S output instead" },
  { "readahead", required_argument, "read-ahead is the NBD client's (e.g. "
    "blockdev --setra on /dev/nbdN)" },
  { "deferred", no_argument, "not supported: remove --force swaps in an "
    "error table at once instead" },
  { "manglename", required_argument, "names are not mangled: any valid "
    "name is served as it is" },
  { "concise", no_argument, "not supported: use table and create --table" },
  { "exec", required_argument, "not supported: use ls | xargs -n1 CMD" },
  { "setuuid", no_argument, "a device's uuid is set by create -u" },
  { "count", required_argument, "not supported: use watch(1)" },
  { "interval", required_argument, "not supported: use watch(1)" },
};
/* Short options of dmsetup that cannot apply, by letter. */
static const struct { char letter; const char *name; } dmsetup_short[] = {
  { 'j', "major" }, { 'm', "minor" }, { 'U', "uid" }, { 'G', "gid" },
  { 'M', "mode" }, { 'S', "select" },
};

#define SHORT_OPTS "a:cCfhk:no:O:ru:vyVj:m:U:G:M:S:"
#define NR_DMSETUP_OPTS (sizeof dmsetup_opts / sizeof dmsetup_opts[0])
static struct option long_opts[40 + NR_DMSETUP_OPTS] = {
  { "connect", required_argument, NULL, 'a' },
  { "key", required_argument, NULL, 'k' },
  { "json", no_argument, NULL, OPT_JSON },
  { "help", no_argument, NULL, 'h' },
  { "version", no_argument, NULL, 'V' },
  { "verbose", no_argument, NULL, 'v' },
  { "yes", no_argument, NULL, 'y' },
  { "columns", no_argument, NULL, 'c' },
  { "options", required_argument, NULL, 'o' },
  { "sort", required_argument, NULL, 'O' },
  { "noheadings", no_argument, NULL, OPT_NOHEADINGS },
  { "separator", required_argument, NULL, OPT_SEPARATOR },
  { "nameprefixes", no_argument, NULL, OPT_NAMEPREFIXES },
  { "target", required_argument, NULL, OPT_TARGET },
  { "tree", no_argument, NULL, OPT_TREE },
  { "noflush", no_argument, NULL, OPT_NOFLUSH },
  { "force", no_argument, NULL, 'f' },
  { "notable", no_argument, NULL, 'n' },
  { "readonly", no_argument, NULL, 'r' },
  { "inactive", no_argument, NULL, OPT_INACTIVE },
  { "showkeys", no_argument, NULL, OPT_SHOWKEYS },
  { "backends", no_argument, NULL, OPT_BACKENDS },
  { "uuid", required_argument, NULL, 'u' },
  { "table", required_argument, NULL, OPT_TABLE },
  { "timeout", required_argument, NULL, OPT_TIMEOUT },
  { "clear", no_argument, NULL, OPT_CLEAR },
  { "prometheus", no_argument, NULL, OPT_PROMETHEUS },
  { "region", required_argument, NULL, OPT_REGION },
  { "resume", no_argument, NULL, OPT_RESUME },
  { "abort", no_argument, NULL, OPT_ABORT },
  { "log", required_argument, NULL, OPT_LOG },
  { "region-size", required_argument, NULL, OPT_REGION_SIZE },
  { "method", required_argument, NULL, OPT_METHOD },
  { "metadata", required_argument, NULL, OPT_METADATA },
  /* dmsetup_opts are added after these by init_long_opts. */
};

static size_t nr_own_opts;     /* long_opts before dmsetup_opts */

static void
init_long_opts (void)
{
  size_t n = 0;

  while (long_opts[n].name)
    n++;
  nr_own_opts = n;
  assert (n + NR_DMSETUP_OPTS < sizeof long_opts / sizeof long_opts[0]);
  for (size_t i = 0; i < NR_DMSETUP_OPTS; i++)
    long_opts[n + i] = (struct option) {
      dmsetup_opts[i].name, dmsetup_opts[i].has_arg, NULL,
      dmsetup_opts[i].why ? OPT_NOT_HERE : OPT_IGNORED };
}

/* The name of the option getopt_long just returned, for messages:
 * "--force", or "-f" when it was given so.
 */
static const char *
given_name (int opt, int longindex, char *buf, size_t len)
{
  if (longindex >= 0)
    snprintf (buf, len, "--%s", long_opts[longindex].name);
  else
    snprintf (buf, len, "-%c", opt);
  return buf;
}

/* Parse options (GNU getopt permutes: they may follow the command; --
 * ends them).  In a batch line only the per-command options are
 * allowed.  A bad option is one line and "see --help".
 */
static void
parse_options (int argc, char *argv[], bool batch_line)
{
  int opt, longindex;
  char name[64];

  optind = 0;                   /* GNU: start afresh (batch lines) */
  opterr = 0;                   /* our message, one line */
  for (;;) {
    longindex = -1;
    /* Options may follow the command, as in dmsetup. */
    opt = getopt_long (argc, argv, SHORT_OPTS, long_opts, &longindex);
    if (opt == -1)
      break;
    if (batch_line && (opt == 'a' || opt == 'k' || opt == 'h' || opt == 'V'))
      die ("%s: give it on the command line, not in a batch",
           given_name (opt, longindex, name, sizeof name));
    if (opt == '?') {
      /* optopt: 0 for an unknown long option, the option's value for
       * a missing argument (> 255 for long-only ones) or the unknown
       * letter; a letter may sit in a cluster (-fx).
       */
      if (optopt == 0)
        die ("'%s': unknown option (see nbdmsetup --help)", argv[optind - 1]);
      if (optopt < 256 && strchr (SHORT_OPTS, optopt) == NULL)
        die ("-%c: unknown option (see nbdmsetup --help)", optopt);
      if (strncmp (argv[optind - 1], "--", 2) == 0)
        die ("'%s': missing value (see nbdmsetup --help)", argv[optind - 1]);
      die ("-%c: missing value (see nbdmsetup --help)", optopt);
    }
    for (size_t i = 0; i < sizeof dmsetup_short / sizeof dmsetup_short[0];
         i++)
      if (opt == dmsetup_short[i].letter)
        for (size_t j = 0; j < NR_DMSETUP_OPTS; j++)
          if (strcmp (dmsetup_opts[j].name, dmsetup_short[i].name) == 0)
            die ("-%c: %s", opt, dmsetup_opts[j].why);
    switch (opt) {
    case 'a': uri = optarg; break;
    case 'k': key_file = optarg; break;
    case OPT_JSON: opts.json = true; break;
    case 'h': usage (stdout, EXIT_SUCCESS);
    case 'V': printf ("nbdmsetup %s\n", PACKAGE_VERSION); exit (EXIT_SUCCESS);
    case 'v': opts.verbose++; break;
    case 'y': break;            /* nbdmsetup never asks */
    case 'c': case 'C': opts.given |= O_COLUMNS; break;
    case 'o': opts.given |= O_OPTIONS; opts.fields = optarg; break;
    case 'O': opts.given |= O_SORT; opts.sort = optarg; break;
    case OPT_NOHEADINGS: opts.given |= O_NOHEADINGS; break;
    case OPT_SEPARATOR:
      opts.given |= O_SEPARATOR;
      opts.separator = optarg;
      break;
    case OPT_NAMEPREFIXES: opts.given |= O_NAMEPREFIXES; break;
    case OPT_TARGET: opts.given |= O_TARGET; opts.target = optarg; break;
    case OPT_TREE: opts.given |= O_TREE; break;
    case OPT_NOFLUSH:
      opts.given |= O_NOFLUSH;
      opts.flags |= PROTO_F_NOFLUSH;
      break;
    case 'f': opts.given |= O_FORCE; opts.flags |= PROTO_F_FORCE; break;
    case 'n': opts.given |= O_NOTABLE; break;
    case 'r':
      opts.given |= O_READONLY;
      opts.flags |= PROTO_F_READONLY;
      break;
    case OPT_INACTIVE:
      opts.given |= O_INACTIVE;
      opts.flags |= PROTO_F_INACTIVE;
      break;
    case OPT_SHOWKEYS:
      opts.given |= O_SHOWKEYS;
      opts.flags |= PROTO_F_SHOWKEYS;
      break;
    case OPT_BACKENDS:
      opts.given |= O_BACKENDS;
      opts.flags |= PROTO_F_BACKENDS;
      break;
    case 'u':
      /* "" would match the first device without a uuid. */
      if (*optarg == '\0')
        die ("-u: the uuid is empty");
      opts.given |= O_UUID;
      opts.uuid = optarg;
      break;
    case OPT_TABLE: opts.given |= O_TABLE; opts.table_text = optarg; break;
    case OPT_TIMEOUT: opts.timeout = parse_seconds ("--timeout", optarg); break;
    case OPT_CLEAR: opts.given |= O_CLEAR; opts.flags |= PROTO_F_CLEAR; break;
    case OPT_PROMETHEUS: opts.given |= O_PROMETHEUS; break;
    case OPT_REGION: opts.given |= O_REGION; opts.region = optarg; break;
    case OPT_RESUME: opts.given |= O_RESUME; break;
    case OPT_ABORT: opts.given |= O_ABORT; break;
    case OPT_LOG: opts.given |= O_LOG; opts.log = optarg; break;
    case OPT_REGION_SIZE:
      opts.given |= O_REGION_SIZE;
      opts.region_size = optarg;
      break;
    case OPT_METHOD: opts.given |= O_METHOD; opts.method = optarg; break;
    case OPT_METADATA: opts.given |= O_METADATA; opts.metadata = optarg; break;
    case OPT_IGNORED: break;
    case OPT_NOT_HERE:
      die ("--%s: %s", long_opts[longindex].name,
           dmsetup_opts[longindex - nr_own_opts].why);
    default:
      abort ();
    }
  }
}

/* --- stats, clients -------------------------------------------------------- */

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
  else if (opts.given & O_PROMETHEUS)
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
    char since[32] = "?", *end;
    double t;
    time_t secs;
    struct tm tm;

    if (rows[i].n < 7)
      die ("clients: malformed response");
    /* Printed as they are in the JSON: numbers, or it would not be. */
    errno = 0;
    t = strtod (f[4], &end);
    if (errno || end == f[4] || *end || !isdigit (*f[4]) || !(t < 1e18) ||
        !is_u64 (f[5]) || !is_u64 (f[6]))
      die ("clients: malformed response (row %zu)", i + 1);
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

/* --- verbs ---------------------------------------------------------------- */

static void
run_version (struct conn *c, const struct verb *v, int argc, char **argv)
{
  print_version (c);
}

static void
run_create (struct conn *c, const struct verb *v, int argc, char **argv)
{
  char *t = NULL;
  const char *args[3] = { argv[0], opts.uuid ? opts.uuid : "", NULL };

  /* As dmsetup: the table is the file, --table, or standard input,
   * unless -n (--notable).
   */
  if (opts.given & O_NOTABLE) {
    if (argc == 2 || opts.table_text)
      die ("create: -n (--notable) and a table: give one of them");
  }
  else
    t = read_table (v->name, argc == 2 ? argv[1] : NULL);
  args[2] = t;
  free (call (c, v->code, t ? 3 : 2, args));
  free (t);
}

/* load, reload, replace: NAME [TABLE]. */
static void
run_load (struct conn *c, const struct verb *v, int argc, char **argv)
{
  char *t = read_table (v->name, argc == 2 ? argv[1] : NULL);
  const char *args[2] = { argv[0], t };

  free (call (c, v->code, 2, args));
  free (t);
}

/* The verbs that send their arguments as they are and print nothing. */
static void
run_plain (struct conn *c, const struct verb *v, int argc, char **argv)
{
  free (call (c, v->code, argc, (const char *const *) argv));
}

static void
run_table_status (struct conn *c, const struct verb *v, int argc,
                  char **argv)
{
  char *p;

  if ((opts.given & O_TARGET) && (opts.given & O_BACKENDS))
    die ("status: --target and --backends: give one of them");
  p = call (c, v->code, argc, (const char *const *) argv);
  if (opts.flags & PROTO_F_BACKENDS)
    print_grouped (c, p, argc == 1, "backends", 3, backend_item);
  else
    print_grouped (c, p, argc == 1, v->name, 1, line_item);
  free (p);
}

static void
run_message (struct conn *c, const struct verb *v, int argc, char **argv)
{
  char *p = call (c, v->code, argc, (const char *const *) argv);

  if (*p)
    printf ("%s%s", p, p[strlen (p) - 1] == '\n' ? "" : "\n");
  free (p);
}

static void
run_targets (struct conn *c, const struct verb *v, int argc, char **argv)
{
  char *p = call (c, v->code, 0, NULL);

  print_targets (p, argc, argv);
  free (p);
}

static void
run_wait (struct conn *c, const struct verb *v, int argc, char **argv)
{
  char ms[32] = "";
  const char *args[3] = { argv[0], argc == 2 ? argv[1] : "", ms };
  char *p;

  if (opts.timeout >= 0)
    snprintf (ms, sizeof ms, "%lld", (long long) (opts.timeout * 1000));
  p = call (c, v->code, opts.timeout >= 0 ? 3 : 2, args);
  if (opts.json)
    printf ("{\"event_nr\": %s}\n", strtok (p, "\n") ? p : "0");
  else
    verbose_info (c, argv[0]);
  free (p);
}

static void
run_stats (struct conn *c, const struct verb *v, int argc, char **argv)
{
  const char *args[2] = { argc ? argv[0] : "", opts.region };
  char *p;

  if ((opts.given & O_PROMETHEUS) && opts.json)
    die ("stats: --json or --prometheus, not both");
  if (opts.region) {
    if (argc == 0)
      die ("stats: --region needs a device name");
    if (strspn (opts.region, "0123456789") != strlen (opts.region) ||
        !*opts.region || strlen (opts.region) > 9)
      die ("stats: --region '%s' is not a region number", opts.region);
  }
  p = call (c, v->code, opts.region ? 2 : argc, args);
  print_stats (p);
  free (p);
}

static void
run_clients (struct conn *c, const struct verb *v, int argc, char **argv)
{
  char *p = call (c, v->code, argc, (const char *const *) argv);

  print_clients (p);
  free (p);
}

static void
run_help (struct conn *c, const struct verb *v, int argc, char **argv)
{
  if (opts.given & O_COLUMNS)
    print_field_help ();
  else
    usage (stdout, EXIT_SUCCESS);
}

static const struct verb verbs[] = {
#define VERB(name, code, min, max, opts, named, run) \
  { name, code, min, max, opts, named, run, NULL, false }
#define LOCAL_VERB(name, min, max, opts, run) \
  { name, 0, min, max, opts, false, run, NULL, true }
#define NOT_HERE(name, why) { name, 0, 0, 0, 0, false, NULL, why, false }
#define NO_UDEV "there is no udev here: devices are NBD exports, made " \
  "without uevents or cookies"
  VERB ("version", PROTO_CMD_VERSION, 0, 0, 0, false, run_version),
  VERB ("ls", PROTO_CMD_LIST, 0, 0, O_TARGET | O_TREE | O_OPTIONS, false,
        run_ls),
  VERB ("create", PROTO_CMD_CREATE, 1, 2,
        O_UUID | O_TABLE | O_NOTABLE | O_READONLY, false, run_create),
  VERB ("load", PROTO_CMD_LOAD, 1, 2, O_TABLE | O_READONLY, true, run_load),
  VERB ("reload", PROTO_CMD_LOAD, 1, 2, O_TABLE | O_READONLY, true, run_load),
  VERB ("clear", PROTO_CMD_CLEAR, 1, 1, 0, true, run_plain),
  VERB ("suspend", PROTO_CMD_SUSPEND, 1, 1, O_NOFLUSH, true, run_plain),
  VERB ("resume", PROTO_CMD_RESUME, 1, 1, 0, true, run_plain),
  VERB ("replace", PROTO_CMD_REPLACE, 1, 2, O_TABLE | O_READONLY, true,
        run_load),
  VERB ("remove", PROTO_CMD_REMOVE, 1, 1, O_FORCE, true, run_plain),
  VERB ("remove_all", PROTO_CMD_REMOVE, 0, 0, O_FORCE, false,
        run_remove_all),
  VERB ("wipe_table", PROTO_CMD_REPLACE, 1, 1, 0, true, run_wipe_table),
  VERB ("rename", PROTO_CMD_RENAME, 2, 2, 0, true, run_plain),
  VERB ("info", PROTO_CMD_INFO, 0, 1, O_COLUMNS | O_OPTIONS | O_SORT |
        O_NOHEADINGS | O_SEPARATOR | O_NAMEPREFIXES, true, run_info),
  VERB ("deps", PROTO_CMD_STATUS, 0, 1, O_OPTIONS, true, run_deps),
  VERB ("table", PROTO_CMD_TABLE, 0, 1, O_INACTIVE | O_SHOWKEYS | O_TARGET,
        true, run_table_status),
  VERB ("status", PROTO_CMD_STATUS, 0, 1, O_BACKENDS | O_TARGET | O_NOFLUSH,
        true, run_table_status),
  VERB ("message", PROTO_CMD_MESSAGE, 3, PROTO_MAX_ARGS - 2, 0, true,
        run_message),
  VERB ("targets", PROTO_CMD_TARGETS, 0, 0, 0, false, run_targets),
  VERB ("target-version", PROTO_CMD_TARGETS, 1, PROTO_MAX_ARGS, 0, false,
        run_targets),
  VERB ("wait", PROTO_CMD_WAIT, 1, 2, O_NOFLUSH, true, run_wait),
  VERB ("stats", PROTO_CMD_STATS, 0, 1, O_CLEAR | O_PROMETHEUS | O_REGION,
        true, run_stats),
  VERB ("clients", PROTO_CMD_CLIENTS, 0, 1, 0, true, run_clients),
  VERB ("move", PROTO_CMD_REPLACE, 1, 2, O_RESUME | O_ABORT | O_LOG |
        O_REGION_SIZE | O_METHOD | O_METADATA, true, run_move),
  LOCAL_VERB ("help", 0, 0, O_COLUMNS, run_help),
  NOT_HERE ("mknodes", "nbdmapper devices are NBD exports, not /dev/mapper "
            "nodes: an NBD client (nbd-client, qemu-nbd -c) makes a node"),
  NOT_HERE ("mangle", "names are not mangled: any valid name is served as "
            "it is"),
  NOT_HERE ("measure", "IMA measurement is the kernel's: the server has "
            "none"),
  NOT_HERE ("splitname", "nbdmapper names are not LVM's VG-LV names: there "
            "is nothing to split"),
  NOT_HERE ("setgeometry", "NBD exports have no C/H/S geometry"),
  NOT_HERE ("udevcomplete", NO_UDEV),
  NOT_HERE ("udevcomplete_all", NO_UDEV),
  NOT_HERE ("udevcookies", NO_UDEV),
  NOT_HERE ("udevcreatecookie", NO_UDEV),
  NOT_HERE ("udevreleasecookie", NO_UDEV),
  NOT_HERE ("udevflags", NO_UDEV),
#undef VERB
#undef LOCAL_VERB
#undef NOT_HERE
#undef NO_UDEV
};

/* The names of the O_* options, for messages. */
static const struct { unsigned bit; const char *name; } opt_names[] = {
  { O_NOFLUSH, "--noflush" }, { O_FORCE, "--force" },
  { O_INACTIVE, "--inactive" }, { O_SHOWKEYS, "--showkeys" },
  { O_BACKENDS, "--backends" }, { O_UUID, "--uuid" },
  { O_TABLE, "--table" }, { O_NOTABLE, "--notable" },
  { O_READONLY, "--readonly" }, { O_COLUMNS, "--columns" },
  { O_OPTIONS, "--options" }, { O_NOHEADINGS, "--noheadings" },
  { O_SEPARATOR, "--separator" }, { O_TARGET, "--target" },
  { O_TREE, "--tree" }, { O_SORT, "--sort" },
  { O_NAMEPREFIXES, "--nameprefixes" }, { O_CLEAR, "--clear" },
  { O_PROMETHEUS, "--prometheus" }, { O_REGION, "--region" },
  { O_RESUME, "--resume" }, { O_ABORT, "--abort" }, { O_LOG, "--log" },
  { O_REGION_SIZE, "--region-size" }, { O_METHOD, "--method" },
  { O_METADATA, "--metadata" },
};

/* The options that belong to other verbs: given to this one, they
 * would be ignored without a word.  -u stands for NAME where the verb
 * takes one.
 */
/* Options dmsetup takes on a verb where nbdmsetup cannot, and why. */
static const struct { const char *verb; unsigned bit; const char *why; }
not_here_opts[] = {
  { "resume", O_NOFLUSH, "not supported: resume flushes what the live "
    "table wrote before the swap, so that no acknowledged write is lost "
    "(suspend --noflush skips the suspend's flush)" },
  { "wipe_table", O_NOFLUSH, "not supported: the swap flushes what the "
    "live table wrote, so that no acknowledged write is lost" },
};

static void
check_options (const struct verb *v)
{
  unsigned bad = opts.given & ~(v->opts | (v->named ? O_UUID : 0));

  for (size_t i = 0; i < sizeof not_here_opts / sizeof not_here_opts[0]; i++)
    if ((bad & not_here_opts[i].bit) && strcmp (v->name,
                                                 not_here_opts[i].verb) == 0)
      for (size_t j = 0; j < sizeof opt_names / sizeof opt_names[0]; j++)
        if (opt_names[j].bit == not_here_opts[i].bit)
          die ("%s %s: %s", v->name, opt_names[j].name, not_here_opts[i].why);
  for (size_t i = 0; i < sizeof opt_names / sizeof opt_names[0]; i++)
    if (bad & opt_names[i].bit) {
      char takers[256] = "";
      size_t at = 0;
      for (size_t j = 0; j < sizeof verbs / sizeof verbs[0]; j++)
        if ((verbs[j].opts & opt_names[i].bit) && at < sizeof takers)
          at += snprintf (takers + at, sizeof takers - at, "%s%s",
                          at ? ", " : "", verbs[j].name);
      die ("%s is an option of %s%s", opt_names[i].name, takers, opt_names[i].bit == O_UUID
           ? " and of the commands that take a NAME" : "");
    }
}

/* Check a command's name, arguments and options (before connecting). */
static const struct verb *
find_verb (const char *cmd, int argc, char *argv[])
{
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
    const struct verb *v = &verbs[i];
    int min = v->min, max = v->max;
    if (strcmp (cmd, v->name) != 0)
      continue;
    if (v->run == NULL)
      die ("%s: not for nbdmapper: %s", cmd, v->why_not);
    check_options (v);
    if (v->run == run_info && (opts.given & O_COLUMNS) && opts.json)
      die ("info -c: --json gives every field already: give one of them");
    /* -u UUID stands for NAME. */
    if (v->named && opts.uuid) {
      if (max == 1 && argc == 1)
        die ("%s: -u %s and NAME '%s': give one of them", cmd, opts.uuid,
             argv[0]);
      min = min ? min - 1 : 0;
      max = max - 1;
    }
    if (argc < min || argc > max)
      die ("%s: wrong number of arguments (see nbdmsetup --help)", cmd);
    /* An empty NAME names no device: the server would take it for
     * "every device" where NAME is optional.
     */
    if ((v->named || v->run == run_create) && !opts.uuid && argc > 0 &&
        *argv[0] == '\0')
      die ("%s: the device name is empty", cmd);
    if (v->run == run_plain && v->code == PROTO_CMD_RENAME &&
        *argv[argc - 1] == '\0')
      die ("%s: the new name is empty", cmd);
    /* The table is the argument after NAME or --table, not both. */
    if (opts.table_text && argc == max && argc > min)
      die ("%s: a table file ('%s') and --table: give one of them", cmd,
           argv[argc - 1]);
    return v;
  }
  /* nbdmsetup -c URI ls, from before -c was dmsetup's --columns. */
  if (strstr (cmd, "://"))
    die ("unknown command '%s': the control export is -a URI (--connect); "
         "-c is --columns, as in dmsetup", cmd);
  die ("unknown command '%s' (see nbdmsetup --help)", cmd);
}

/* Run one checked command: argv holds its arguments after the name. */
static void
run_command (struct conn *c, const struct verb *v, int argc, char *argv[])
{
  char *name = NULL;
  char **args = argv;

  if (v->named && opts.uuid) {
    /* NAME := the device with that uuid, before the other arguments. */
    name = name_of_uuid (c, opts.uuid);
    args = malloc ((argc + 2) * sizeof *args);
    if (args == NULL)
      die ("out of memory");
    args[0] = name;
    memcpy (args + 1, argv, (argc + 1) * sizeof *args);
    argc++;
  }
  v->run (c, v, argc, args);
  if (args != argv)
    free (args);
  free (name);
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
    const struct verb *v = find_verb (cmd, argc, words + optind + 1);
    run_command (c, v, argc, words + optind + 1);
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
  const struct verb *v = NULL;
  const char *cmd, *env;

  uri = getenv ("NBDMSETUP_URI");
  key_file = getenv ("NBDMSETUP_KEY");
  if (key_file && *key_file == '\0')
    key_file = NULL;
  if ((env = getenv ("NBDMSETUP_TIMEOUT")) != NULL && *env) {
    default_timeout = parse_seconds ("$NBDMSETUP_TIMEOUT", env);
    default_from_env = true;
  }
  init_long_opts ();
  parse_options (argc, argv, false);
  argv += optind;
  argc -= optind;
  if (argc < 1)
    die ("no command (see nbdmsetup --help)");
  cmd = *argv++;
  argc--;

  /* Check the arguments before connecting. */
  if (strcmp (cmd, "batch") == 0) {
    if (argc > 1)
      die ("batch: wrong number of arguments (see nbdmsetup --help)");
  }
  else
    v = find_verb (cmd, argc, argv);
  if (v && v->local) {
    v->run (NULL, v, argc, argv);
    return EXIT_SUCCESS;
  }
  if (uri == NULL)
    die ("no control export: use --connect URI (-a URI) or $NBDMSETUP_URI");

  connect_control (&c, v ? v->code : 0);
  if (v == NULL)
    run_batch (&c, argc ? argv[0] : NULL);
  else
    run_command (&c, v, argc, argv);
  disconnect (&c);
  return EXIT_SUCCESS;
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* What the server says of every device (info and status --backends)
 * and nbdmsetup's commands made of it, as dmsetup shows them: info and
 * info -c (dmsetup's report fields), deps, ls (--target, --tree),
 * remove_all (holders first), wipe_table, and -u UUID for NAME.
 */
#include <config.h>

#include <ctype.h>
#include <errno.h>
#include <langinfo.h>
#include <locale.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "nbdmsetup.h"

/* One device as info and status --backends describe it: what deps,
 * ls --tree, info -c, remove_all and -u UUID are made of.
 */
#define INFO_FIELDS 10          /* before the holders */
struct dev {
  char **f;                     /* its info row: INFO_FIELDS, then holders */
  int nf;
  char **holders;               /* names: live or inactive tables on it */
  size_t nholders;
  struct row *bes;              /* its live table's backends: BACKEND, KIND */
  size_t nbes;
  bool removed;                 /* remove_all */
};
struct devs {
  struct dev *d;
  size_t n;
  char *info, *backends;        /* the payloads the rows point into */
  struct row *irows, *brows;
  struct row *bes;              /* every device's backends, by device */
};

static struct dev *
devs_find (struct devs *ds, const char *name)
{
  for (size_t i = 0; i < ds->n; i++)
    if (strcmp (ds->d[i].f[0], name) == 0)
      return &ds->d[i];
  return NULL;
}

/* Ask for every device's info (and its backends, if backends), or for
 * the one named.
 */
static void
devs_get (struct conn *c, struct devs *ds, const char *name, bool backends)
{
  const char *args[1] = { name };
  size_t nb = 0;

  memset (ds, 0, sizeof *ds);
  ds->info = call_flags (c, PROTO_CMD_INFO, 0, name != NULL, args);
  ds->n = split_rows (ds->info, &ds->irows);
  ds->d = calloc (ds->n + 1, sizeof *ds->d);
  if (ds->d == NULL)
    die ("out of memory");
  for (size_t i = 0; i < ds->n; i++) {
    struct dev *d = &ds->d[i];
    if (ds->irows[i].n < INFO_FIELDS)
      die ("info: malformed response");
    d->f = ds->irows[i].f;
    d->nf = ds->irows[i].n;
    for (int j = INFO_FIELDS; j < d->nf; j++)
      for (char *h = d->f[j]; *h; h += strcspn (h, "\t"), h += *h == '\t') {
        d->holders = realloc (d->holders,
                              (d->nholders + 1) * sizeof *d->holders);
        if (d->holders == NULL)
          die ("out of memory");
        d->holders[d->nholders++] = h;
      }
    /* Cut the holders apart now that they are counted. */
    for (size_t k = 0; k < d->nholders; k++)
      d->holders[k][strcspn (d->holders[k], "\t")] = '\0';
  }
  if (!backends)
    return;
  ds->backends = call_flags (c, PROTO_CMD_STATUS, PROTO_F_BACKENDS,
                             name != NULL, args);
  nb = split_rows (ds->backends, &ds->brows);
  /* Each row's device, then each device's rows in their order: the
   * protocol does not say a device's rows come together.
   */
  struct dev **owner = calloc (nb + 1, sizeof *owner);
  size_t nused = 0, at = 0;
  if (owner == NULL)
    die ("out of memory");
  for (size_t i = 0; i < nb; i++) {
    struct row *r = &ds->brows[i];
    if (r->n > 1 && *r->f[1] && r->n < 4)
      die ("status: malformed response");
    /* Not found: created between the two requests. */
    if (r->n < 2 || *r->f[1] == '\0' ||
        (owner[i] = devs_find (ds, r->f[0])) == NULL)
      continue;
    owner[i]->nbes++;
    nused++;
  }
  ds->bes = calloc (nused + 1, sizeof *ds->bes);
  if (ds->bes == NULL)
    die ("out of memory");
  for (size_t i = 0; i < ds->n; i++) {
    ds->d[i].bes = ds->bes + at;
    at += ds->d[i].nbes;
    ds->d[i].nbes = 0;
  }
  for (size_t i = 0; i < nb; i++) {
    if (owner[i] == NULL)
      continue;
    struct row *r = &owner[i]->bes[owner[i]->nbes++];
    *r = ds->brows[i];
    r->f[0] = r->f[1];          /* BACKEND, KIND from here */
    r->f[1] = r->f[2];
  }
  free (owner);
}

static void
devs_free (struct devs *ds)
{
  for (size_t i = 0; i < ds->n; i++)
    free (ds->d[i].holders);
  free (ds->d);
  free (ds->irows);
  free (ds->brows);
  free (ds->bes);
  free (ds->info);
  free (ds->backends);
}

/* The device a backend is, if it is one ("mapper:NAME"). */
static struct dev *
backend_dev (struct devs *ds, const struct row *be)
{
  if (strcmp (be->f[1], "device") != 0 || strncmp (be->f[0], "mapper:", 7))
    return NULL;
  return devs_find (ds, be->f[0] + 7);
}

/* -u UUID: the name of the device with that uuid (malloc'd). */
char *
name_of_uuid (struct conn *c, const char *uuid)
{
  struct devs ds;
  char *name = NULL;

  devs_get (c, &ds, NULL, false);
  for (size_t i = 0; i < ds.n && name == NULL; i++)
    if (strcmp (ds.d[i].f[7], uuid) == 0)
      name = strdup (ds.d[i].f[0]);
  devs_free (&ds);
  if (name == NULL)
    die ("-u %s: no device has this uuid", uuid);
  return name;
}

/* --- info ----------------------------------------------------------------- */

static const char *
tables_present (const char *live, const char *inactive)
{
  bool l = strcmp (live, "1") == 0, i = strcmp (inactive, "1") == 0;
  return l && i ? "LIVE & INACTIVE" : l ? "LIVE" : i ? "INACTIVE" : "None";
}

static bool
is_read_only (const struct dev *d)
{
  return strcmp (d->f[9], "1") == 0;
}

/* dmsetup's info block. */
static void
print_info_block (const struct dev *d)
{
  char **f = d->f;

  printf ("Name:              %s\n", f[0]);
  printf ("State:             %s%s\n", f[1],
          is_read_only (d) ? " (READ-ONLY)" : "");
  printf ("Tables present:    %s\n", tables_present (f[2], f[3]));
  printf ("Open count:        %s\n", f[4]);
  if (d->nholders) {
    printf ("Holders:           ");
    for (size_t k = 0; k < d->nholders; k++)
      printf ("%s%s", k ? ", " : "", d->holders[k]);
    putchar ('\n');
  }
  printf ("Event number:      %s\n", f[5]);
  printf ("Number of targets: %s\n", f[6]);
  if (*f[7])
    printf ("UUID: %s\n", f[7]);
}

static void
print_info_json (const struct dev *d)
{
  char **f = d->f;

  printf ("{\"name\": ");
  json_string (f[0]);
  printf (", \"state\": \"%s\", \"read_only\": %s, \"live_table\": %s, "
          "\"inactive_table\": %s, \"open_count\": %s, "
          "\"event_nr\": %s, \"targets\": %s, \"uuid\": ",
          strcmp (f[1], "SUSPENDED") == 0 ? "SUSPENDED" : "ACTIVE",
          is_read_only (d) ? "true" : "false",
          strcmp (f[2], "1") == 0 ? "true" : "false",
          strcmp (f[3], "1") == 0 ? "true" : "false", f[4], f[5], f[6]);
  if (*f[7])
    json_string (f[7]);
  else
    printf ("null");
  printf (", \"size\": %s, \"holders\": [", f[8]);
  for (size_t k = 0; k < d->nholders; k++) {
    printf ("%s", k ? ", " : "");
    json_string (d->holders[k]);
  }
  printf ("]}");
}

/* info -c: dmsetup's report fields that apply (see nbdmsetup(8)).  A
 * field's value is column col of the info row, or made by get into buf.
 */
struct field {
  const char *id, *heading;
  int width;                    /* at least, as dmsetup's */
  bool number;                  /* right-aligned, sorted as numbers */
  bool deps;                    /* needs the backends */
  int col;
  void (*get) (struct devs *ds, const struct dev *d, char *buf, size_t len);
  const char *help;
};

static void
f_attr (struct devs *ds, const struct dev *d, char *buf, size_t len)
{
  snprintf (buf, len, "%c%c%c%c", *d->f[2] == '1' ? 'L' : '-',
            *d->f[3] == '1' ? 'I' : '-',
            strcmp (d->f[1], "SUSPENDED") == 0 ? 's' : '-',
            is_read_only (d) ? 'r' : 'w');
}

static void
f_tables (struct devs *ds, const struct dev *d, char *buf, size_t len)
{
  bool l = *d->f[2] == '1', i = *d->f[3] == '1';

  snprintf (buf, len, "%s", l && i ? "Both" : l ? "Live"
            : i ? "Inactive" : "None");
}

static void
f_suspended (struct devs *ds, const struct dev *d, char *buf, size_t len)
{
  snprintf (buf, len, "%s", strcmp (d->f[1], "SUSPENDED") == 0
            ? "Suspended" : "Active");
}

static void
f_readonly (struct devs *ds, const struct dev *d, char *buf, size_t len)
{
  snprintf (buf, len, "%s", is_read_only (d) ? "Read-only" : "Writeable");
}

static void
f_device_count (struct devs *ds, const struct dev *d, char *buf, size_t len)
{
  snprintf (buf, len, "%zu", d->nbes);
}

/* The backends that are devices of this server (devs), or the others. */
static void
used (struct devs *ds, const struct dev *d, bool devs, char *buf,
      size_t len)
{
  size_t at = 0;

  *buf = '\0';
  for (size_t i = 0; i < d->nbes && at < len; i++) {
    const struct row *be = &d->bes[i];
    bool dev = strcmp (be->f[1], "device") == 0;
    if (dev == devs)
      at += snprintf (buf + at, len - at, "%s%s", at ? "," : "",
                      dev ? be->f[0] + 7 : be->f[0]);
  }
}

static void
f_devs_used (struct devs *ds, const struct dev *d, char *buf, size_t len)
{
  used (ds, d, true, buf, len);
}

static void
f_blkdevs_used (struct devs *ds, const struct dev *d, char *buf, size_t len)
{
  used (ds, d, false, buf, len);
}

static void
f_ref_count (struct devs *ds, const struct dev *d, char *buf, size_t len)
{
  snprintf (buf, len, "%zu", d->nholders);
}

static void
f_names_using (struct devs *ds, const struct dev *d, char *buf, size_t len)
{
  size_t at = 0;

  *buf = '\0';
  for (size_t k = 0; k < d->nholders && at < len; k++)
    at += snprintf (buf + at, len - at, "%s%s", k ? "," : "",
                    d->holders[k]);
}

static const struct field fields[] = {
  { "name", "Name", 16, false, false, 0, NULL, "Name of the device." },
  { "uuid", "UUID", 32, false, false, 7, NULL,
    "Unique (optional) identifier of the device." },
  { "attr", "Stat", 4, false, false, -1, f_attr,
    "(L)ive, (I)nactive, (s)uspended, (r)ead-only, read-(w)rite." },
  { "tables_loaded", "Tables", 6, false, false, -1, f_tables,
    "Which of the live and inactive table slots are filled." },
  { "suspended", "Suspended", 9, false, false, -1, f_suspended,
    "Whether the device is suspended." },
  { "readonly", "Read-only", 9, false, false, -1, f_readonly,
    "Whether the device is read-only or writeable." },
  { "open", "Open", 4, true, false, 4, NULL,
    "Number of NBD client connections to the device." },
  { "segments", "Targ", 4, true, false, 6, NULL,
    "Number of targets in the live table." },
  { "events", "Event", 6, true, false, 5, NULL,
    "Number of the most recent event." },
  { "device_count", "#Devs", 5, true, true, -1, f_device_count,
    "Number of backends the live table uses." },
  { "devs_used", "DevNamesUsed", 16, false, true, -1, f_devs_used,
    "Devices of this server the live table uses (mapper:NAME)." },
  { "blkdevs_used", "BlkDevNamesUsed", 16, false, true, -1, f_blkdevs_used,
    "Files, block devices and NBD URIs the live table uses." },
  { "device_ref_count", "#Refs", 5, true, false, -1, f_ref_count,
    "Number of devices whose tables stack on this one." },
  { "names_using_dev", "RefNames", 8, false, false, -1, f_names_using,
    "Devices whose tables stack on this one." },
};

static void
field_value (const struct field *f, struct devs *ds, const struct dev *d,
             char *buf, size_t len)
{
  if (f->get)
    f->get (ds, d, buf, len);
  else
    snprintf (buf, len, "%s", d->f[f->col]);
}
#define NR_FIELDS (sizeof fields / sizeof fields[0])
#define DEFAULT_FIELDS "name,attr,open,segments,events,uuid"

/* dmsetup's fields that have no meaning here, and why. */
static const struct { const char *prefix, *why; } no_fields[] = {
  { "major", "nbdmapper devices have no device numbers (they are NBD "
    "exports)" },
  { "minor", NULL }, { "devno", NULL }, { "devnos_used", NULL },
  { "devnos_using_dev", NULL }, { "blkdevname", NULL },
  { "read_ahead", "read-ahead is the NBD client's" },
  { "mangled_", "names are not mangled" }, { "unmangled_", NULL },
  { "subsystem", "names are not split into LVM's VG and LV (splitname)" },
  { "vg_name", NULL }, { "lv_name", NULL }, { "lv_layer", NULL },
};

void
print_field_help (void)
{
  printf ("Device Fields\n-------------\n");
  for (size_t i = 0; i < NR_FIELDS; i++)
    printf ("  %-21s - %s\n", fields[i].id, fields[i].help);
  printf ("Default: " DEFAULT_FIELDS "; -o +FIELDS adds to it.\n");
}

static const struct field *
find_field (const char *what, const char *id, size_t n)
{
  const char *why = NULL;

  for (size_t i = 0; i < NR_FIELDS; i++)
    if (strlen (fields[i].id) == n && strncmp (fields[i].id, id, n) == 0)
      return &fields[i];
  for (size_t i = 0; i < sizeof no_fields / sizeof no_fields[0]; i++) {
    if (no_fields[i].why)
      why = no_fields[i].why;
    if (strncmp (id, no_fields[i].prefix, strlen (no_fields[i].prefix)) == 0)
      die ("%s: field '%.*s': %s", what, (int) n, id, why);
  }
  die ("%s: unknown field '%.*s' (see info -c -o help)", what, (int) n, id);
}

/* Parse a comma-separated list of fields (sort: with '-' for reverse). */
static size_t
parse_fields (const char *what, const char *list, const struct field **out,
              bool *reverse, size_t max)
{
  size_t n = 0;

  for (const char *p = list; ; ) {
    size_t len = strcspn (p, ",");
    bool rev = reverse && *p == '-';
    if (rev) {
      p++;
      len--;
    }
    if (len == 0)
      die ("%s: empty field name in '%s'", what, list);
    if (n == max)
      die ("%s: too many fields", what);
    if (reverse)
      reverse[n] = rev;
    out[n++] = find_field (what, p, len);
    p += len;
    if (*p++ == '\0')
      return n;
  }
}

struct sort_ctx {
  const struct field **keys;
  bool *reverse;
  size_t nkeys;
  struct devs *ds;
};
static struct sort_ctx sort_ctx;

static int
compare_devs (const void *a, const void *b)
{
  const struct dev *x = *(const struct dev *const *) a;
  const struct dev *y = *(const struct dev *const *) b;
  char u[4096], v[4096];

  for (size_t k = 0; k < sort_ctx.nkeys; k++) {
    const struct field *f = sort_ctx.keys[k];
    int r;
    field_value (f, sort_ctx.ds, x, u, sizeof u);
    field_value (f, sort_ctx.ds, y, v, sizeof v);
    if (f->number) {
      unsigned long long m = strtoull (u, NULL, 10), n = strtoull (v, NULL, 10);
      r = m < n ? -1 : m > n;
    }
    else
      r = strcmp (u, v);
    if (r)
      return sort_ctx.reverse[k] ? -r : r;
  }
  return 0;
}

/* A value for --nameprefixes: DM_FIELD='value', quotes escaped as the
 * shell reads them.
 */
static void
print_prefixed (const struct field *f, const char *value)
{
  printf ("DM_");
  for (const char *p = f->id; *p; p++)
    putchar (*p >= 'a' && *p <= 'z' ? *p - 'a' + 'A' : *p);
  putchar ('=');
  putchar ('\'');
  for (const char *p = value; *p; p++)
    if (*p == '\'')
      printf ("'\\''");
    else
      putchar (*p);
  putchar ('\'');
}

#define MAX_COLUMNS 64
static void
print_columns (struct conn *c, const char *name)
{
  const struct field *cols[MAX_COLUMNS], *keys[MAX_COLUMNS];
  bool reverse[MAX_COLUMNS];
  const char *list = opts.fields ? opts.fields : DEFAULT_FIELDS;
  bool prefixes = opts.given & O_NAMEPREFIXES;
  bool headings = !(opts.given & O_NOHEADINGS) && !prefixes;
  /* As dmsetup: --noheadings alone means ':' between the values, for
   * scripts (its "old dmsetup behaviour"); --separator and
   * --nameprefixes do not align either.
   */
  const char *sep = opts.separator ? opts.separator : headings || prefixes
    ? " " : ":";
  bool aligned = opts.separator == NULL && headings;
  size_t ncols = 0, nkeys = 0;
  int width[MAX_COLUMNS];
  bool need_deps = false;
  struct devs ds;
  struct dev **order;
  char buf[4096];

  if (*list == '+') {
    ncols = parse_fields ("-o", DEFAULT_FIELDS, cols, NULL, MAX_COLUMNS);
    list++;
  }
  ncols += parse_fields ("-o", list, cols + ncols, NULL, MAX_COLUMNS - ncols);
  if (opts.sort)
    nkeys = parse_fields ("-O", opts.sort, keys, reverse, MAX_COLUMNS);
  else
    keys[nkeys++] = &fields[0], reverse[0] = false;   /* by name */
  for (size_t i = 0; i < ncols; i++)
    need_deps |= cols[i]->deps;
  for (size_t i = 0; i < nkeys; i++)
    need_deps |= keys[i]->deps;
  devs_get (c, &ds, name, need_deps);
  order = malloc ((ds.n + 1) * sizeof *order);
  if (order == NULL)
    die ("out of memory");
  for (size_t i = 0; i < ds.n; i++)
    order[i] = &ds.d[i];
  sort_ctx = (struct sort_ctx) { keys, reverse, nkeys, &ds };
  qsort (order, ds.n, sizeof *order, compare_devs);
  for (size_t j = 0; j < ncols; j++) {
    width[j] = headings ? (int) strlen (cols[j]->heading) : 0;
    if (width[j] < cols[j]->width)
      width[j] = cols[j]->width;
    for (size_t i = 0; i < ds.n; i++) {
      field_value (cols[j], &ds, order[i], buf, sizeof buf);
      if ((int) strlen (buf) > width[j])
        width[j] = strlen (buf);
    }
  }
  /* Aligned as libdm's reports: every column padded to its width, the
   * last one too; headings and strings to the left, numbers to the
   * right.
   */
  if (headings && ds.n)
    for (size_t j = 0; j < ncols; j++)
      printf ("%-*s%s", aligned ? width[j] : 0, cols[j]->heading,
              j + 1 == ncols ? "\n" : sep);
  for (size_t i = 0; i < ds.n; i++)
    for (size_t j = 0; j < ncols; j++) {
      field_value (cols[j], &ds, order[i], buf, sizeof buf);
      if (prefixes)
        print_prefixed (cols[j], buf);
      else
        printf (cols[j]->number ? "%*s" : "%-*s", aligned ? width[j] : 0, buf);
      printf ("%s", j + 1 == ncols ? "\n" : sep);
    }
  if (ds.n == 0 && name == NULL)
    printf ("No devices found\n");
  free (order);
  devs_free (&ds);
}

void
run_info (struct conn *c, const struct verb *v, int argc, char **argv)
{
  struct devs ds;

  if (opts.given & O_COLUMNS) {
    if (opts.fields && strcmp (opts.fields, "help") == 0) {
      print_field_help ();
      return;
    }
    print_columns (c, argc ? argv[0] : NULL);
    return;
  }
  if (opts.given & (O_OPTIONS | O_NOHEADINGS | O_SEPARATOR | O_SORT |
                    O_NAMEPREFIXES))
    die ("info: -o, -O, --noheadings, --separator and --nameprefixes go "
         "with -c (columns)");
  devs_get (c, &ds, argc ? argv[0] : NULL, false);
  if (opts.json)
    printf ("{\"devices\": [");
  for (size_t i = 0; i < ds.n; i++) {
    if (opts.json) {
      printf ("%s", i ? ", " : "");
      print_info_json (&ds.d[i]);
      continue;
    }
    if (i)
      putchar ('\n');
    print_info_block (&ds.d[i]);
  }
  if (opts.json)
    printf ("]}\n");
  else if (ds.n == 0)
    printf ("No devices found\n");
  devs_free (&ds);
}

/* -v: dmsetup prints the device's info before its deps, table, status
 * or the event wait returns.
 */
void
verbose_info (struct conn *c, const char *name)
{
  struct devs ds;

  if (!opts.verbose || opts.json)
    return;
  devs_get (c, &ds, name, false);
  if (ds.n)
    print_info_block (&ds.d[0]);
  devs_free (&ds);
}

/* --- deps, ls --tree, ls ---------------------------------------------- */

void
run_deps (struct conn *c, const struct verb *v, int argc, char **argv)
{
  struct devs ds;
  bool one = argc == 1;

  if (opts.fields && strcmp (opts.fields, "devname") != 0 &&
      strcmp (opts.fields, "blkdevname") != 0)
    die ("deps: -o %s: deps names each backend as its table does (devname); "
         "nbdmapper backends have no device numbers", opts.fields);
  devs_get (c, &ds, one ? argv[0] : NULL, true);
  if (opts.json)
    printf ("{\"devices\": [");
  for (size_t i = 0; i < ds.n; i++) {
    struct dev *d = &ds.d[i];
    if (opts.json) {
      printf ("%s{\"name\": ", i ? ", " : "");
      json_string (d->f[0]);
      printf (", \"deps\": [");
      for (size_t k = 0; k < d->nbes; k++) {
        printf ("%s{\"backend\": ", k ? ", " : "");
        json_string (d->bes[k].f[0]);
        printf (", \"kind\": ");
        json_string (d->bes[k].f[1]);
        putchar ('}');
      }
      printf ("]}");
      continue;
    }
    if (opts.verbose) {
      print_info_block (d);
    }
    else if (!one)
      printf ("%s: ", d->f[0]);
    printf ("%zu dependencies\t:", d->nbes);
    for (size_t k = 0; k < d->nbes; k++)
      printf (" (%s)", d->bes[k].f[0]);
    putchar ('\n');
    if (!one && opts.verbose)
      putchar ('\n');
  }
  if (opts.json)
    printf ("]}\n");
  else if (ds.n == 0)
    printf ("No devices found\n");
  devs_free (&ds);
}

/* ls --tree's look: -o ascii|utf (default: utf where the locale's
 * character set is UTF-8, as dmsetup), and what to show beside a device.
 */
static struct {
  const char *branch, *vert, *last;
  bool active, open, rw, uuid;
} tree;

static void
tree_symbols (bool utf)
{
  if (utf)
    tree.branch = "\u251c\u2500", tree.vert = "\u2502 ",
      tree.last = "\u2514\u2500";
  else
    tree.branch = "|-", tree.vert = "| ", tree.last = "`-";
}

static void
tree_options (void)
{
  char *list, *save = NULL;

  /* LC_CTYPE only: numbers (--timeout 0.5) stay C's. */
  setlocale (LC_CTYPE, "");
  tree_symbols (strcmp (nl_langinfo (CODESET), "UTF-8") == 0);
  if (opts.fields == NULL)
    return;
  list = strdup (opts.fields);
  if (list == NULL)
    die ("out of memory");
  for (char *o = strtok_r (list, ",", &save); o;
       o = strtok_r (NULL, ",", &save)) {
    if (strcmp (o, "ascii") == 0 || strcmp (o, "utf") == 0)
      tree_symbols (*o == 'u');
    else if (strcmp (o, "active") == 0)
      tree.active = true;
    else if (strcmp (o, "open") == 0)
      tree.open = true;
    else if (strcmp (o, "rw") == 0)
      tree.rw = true;
    else if (strcmp (o, "uuid") == 0)
      tree.uuid = true;
    else if (strcmp (o, "notrunc") == 0 || strcmp (o, "nodevice") == 0)
      ;                         /* what nbdmsetup does anyway */
    else if (strcmp (o, "device") == 0 || strcmp (o, "blkdevname") == 0)
      die ("ls --tree: -o %s: nbdmapper devices have no device numbers or "
           "block device names (they are NBD exports)", o);
    else
      die ("ls --tree: -o %s: not an option here (ascii, utf, active, open, "
           "rw, uuid, notrunc)", o);
  }
  free (list);
}

/* more[l]: the node at depth l has siblings after it. */
#define TREE_DEPTH 64
static void
tree_node (struct devs *ds, const struct dev *d, const char *leaf,
           unsigned depth, bool *more)
{
  int attr = 0;

  for (unsigned l = 0; l < depth; l++)
    printf (" %s", l + 1 == depth ? (more[depth] ? tree.branch : tree.last)
            : more[l + 1] ? tree.vert : "  ");
  if (leaf) {
    printf ("%s(%s)\n", depth ? " " : "", leaf);
    return;
  }
  printf ("%s", d->f[0]);
  if (tree.active)
    printf ("%s%s", attr++ ? ", " : " [", d->f[1]);
  if (tree.rw)
    printf ("%s%s", attr++ ? ", " : " [", is_read_only (d) ? "RO" : "RW");
  if (tree.open)
    printf ("%s%s", attr++ ? ", " : " [", d->f[4]);
  if (tree.uuid)
    printf ("%s%s", attr++ ? ", " : " [", d->f[7]);
  printf ("%s\n", attr ? "]" : "");
  if (depth + 1 >= TREE_DEPTH)
    die ("ls --tree: stacked more than %d deep", TREE_DEPTH);
  for (size_t k = 0; k < d->nbes; k++) {
    const struct row *be = &d->bes[k];
    const struct dev *child = backend_dev (ds, be);
    more[depth + 1] = k + 1 < d->nbes;
    tree_node (ds, child, child ? NULL : be->f[0], depth + 1, more);
  }
}

static void
print_tree (struct conn *c)
{
  struct devs ds;
  bool more[TREE_DEPTH + 1] = { false };
  size_t nroots = 0, seen = 0;
  bool *held;

  tree_options ();
  devs_get (c, &ds, NULL, true);
  held = calloc (ds.n + 1, sizeof *held);
  if (held == NULL)
    die ("out of memory");
  /* The roots: devices no live table stacks on. */
  for (size_t i = 0; i < ds.n; i++)
    for (size_t k = 0; k < ds.d[i].nbes; k++) {
      const struct dev *child = backend_dev (&ds, &ds.d[i].bes[k]);
      if (child)
        held[child - ds.d] = true;
    }
  for (size_t i = 0; i < ds.n; i++)
    nroots += !held[i];
  for (size_t i = 0; i < ds.n; i++)
    if (!held[i]) {
      more[0] = ++seen < nroots;
      tree_node (&ds, &ds.d[i], NULL, 0, more);
    }
  if (ds.n == 0)
    printf ("No devices found\n");
  free (held);
  devs_free (&ds);
}

/* Does the table text of one device (lines "NAME\tLINE") have a target
 * of type type?  line is "START LENGTH TYPE ...".
 */
bool
line_has_target (const char *line, const char *type)
{
  size_t n = strlen (type);

  for (int w = 0; w < 2; w++) {
    line += strcspn (line, " ");
    line += strspn (line, " ");
  }
  return strncmp (line, type, n) == 0 && (line[n] == ' ' || line[n] == '\0');
}

void
run_ls (struct conn *c, const struct verb *v, int argc, char **argv)
{
  char *p;
  struct row *rows;
  size_t n, shown = 0;

  if (opts.given & O_TREE) {
    if (opts.json || opts.target)
      die ("ls --tree: not with --json or --target");
    print_tree (c);
    return;
  }
  if (opts.fields)
    die ("ls: -o goes with --tree");
  p = call (c, PROTO_CMD_LIST, 0, NULL);
  n = split_rows (p, &rows);
  /* --target: the devices with a live target of that type. */
  char *tp = NULL;
  struct row *trows = NULL;
  size_t tn = 0;
  if (opts.target) {
    tp = call_flags (c, PROTO_CMD_TABLE, 0, 0, NULL);
    tn = split_rows (tp, &trows);
  }
  if (opts.json)
    printf ("{\"devices\": [");
  for (size_t i = 0; i < n; i++) {
    bool match = opts.target == NULL;
    if (rows[i].n < 3)
      die ("ls: malformed response");
    for (size_t j = 0; j < tn && !match; j++)
      match = trows[j].n == 2 && strcmp (trows[j].f[0], rows[i].f[0]) == 0 &&
        line_has_target (trows[j].f[1], opts.target);
    if (!match)
      continue;
    if (opts.json) {
      printf ("%s{\"name\": ", shown ? ", " : "");
      json_string (rows[i].f[0]);
      printf (", \"size\": %s, \"state\": ", rows[i].f[1]);
      json_string (rows[i].f[2]);
      putchar ('}');
    }
    else
      printf ("%s\n", rows[i].f[0]);
    shown++;
  }
  if (opts.json)
    printf ("]}\n");
  else if (shown == 0)
    printf ("No devices found\n");
  free (trows);
  free (tp);
  free (rows);
  free (p);
}

/* remove_all: holders first, so that no device is refused for a table
 * stacked on it; the first failure stops it, naming what was removed.
 */
void
run_remove_all (struct conn *c, const struct verb *v, int argc, char **argv)
{
  struct devs ds;
  char *removed = NULL, *note = NULL;
  size_t removed_len = 0, left;
  FILE *fp = open_memstream (&removed, &removed_len);

  if (fp == NULL)
    die ("out of memory");
  devs_get (c, &ds, NULL, false);
  for (left = ds.n; left > 0; ) {
    size_t before = left;
    for (size_t i = 0; i < ds.n; i++) {
      struct dev *d = &ds.d[i];
      const char *args[1] = { d->f[0] };
      bool held = false;
      if (d->removed)
        continue;
      for (size_t k = 0; k < d->nholders && !held; k++) {
        struct dev *h = devs_find (&ds, d->holders[k]);
        held = h && !h->removed;
      }
      if (held)
        continue;
      if (removed_len) {
        free (note);
        if (asprintf (&note, "removed before it: %s", removed) == -1)
          die ("out of memory");
        die_note = note;
      }
      free (call (c, v->code, 1, args));
      fprintf (fp, "%s%s", removed_len ? ", " : "", d->f[0]);
      fflush (fp);
      d->removed = true;
      left--;
    }
    /* The server refuses cycles: a device was created or renamed
     * meanwhile.
     */
    if (left == before)
      die ("remove_all: the devices changed meanwhile: run it again");
  }
  die_note = NULL;
  fclose (fp);
  free (removed);
  free (note);
  devs_free (&ds);
}

/* wipe_table: as dmsetup, the live table becomes one error target of
 * the same size (replace lets the I/O in flight finish first).
 */
void
run_wipe_table (struct conn *c, const struct verb *v, int argc, char **argv)
{
  struct devs ds;
  char table[64];
  unsigned long long size;
  char *end;
  const char *args[2] = { argv[0], table };

  devs_get (c, &ds, argv[0], false);
  if (ds.n != 1 || *ds.d[0].f[2] != '1')
    die ("wipe_table %s: no live table", argv[0]);
  /* A size that is not whole sectors would make the error table
   * shorter than the device (and "0 0 error" of a bad number).
   */
  errno = 0;
  size = strtoull (ds.d[0].f[8], &end, 10);
  if (errno || end == ds.d[0].f[8] || *end || !isdigit (*ds.d[0].f[8]) ||
      size == 0 || size % 512)
    die ("wipe_table %s: malformed response (size '%s')", argv[0],
         ds.d[0].f[8]);
  devs_free (&ds);
  snprintf (table, sizeof table, "0 %llu error", size / 512);
  free (call_flags (c, v->code, 0, 2, args));
}


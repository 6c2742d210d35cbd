/* SPDX-License-Identifier: BSD-3-Clause */
/* Table text -> immutable struct table.  Everything is validated here, at
 * load time, so the request path only does arithmetic: no gaps, no
 * overlaps, start at 0, every backend area inside its backend, 64-bit
 * overflow checks on every number.
 */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The built-in types, from targets.def (the one list of them). */
#define TARGET(name) extern const struct target_type name##_target;
#include "targets.def"
#undef TARGET

static const struct target_type *const target_types[] = {
#define TARGET(name) &name##_target,
#include "targets.def"
#undef TARGET
};

static const struct target_type *
find_target_type (const char *name)
{
  for (size_t i = 0; i < ARRAY_SIZE (target_types); i++)
    if (strcmp (target_types[i]->name, name) == 0)
      return target_types[i];
  return NULL;
}

DEFINE_VECTOR_TYPE (string_vector, char *);

/* Blanks between words (a newline ends the line). */
static bool
is_blank (char c)
{
  return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* Split line (modified in place) into words; '#' starting a word begins a
 * comment.  0 or -ENOMEM.
 */
static int
split_words (char *line, string_vector *words)
{
  char *p = line;

  words->len = 0;
  for (;;) {
    while (is_blank (*p))
      p++;
    if (*p == '\0' || *p == '#')
      return 0;
    if (string_vector_append (words, p) == -1)
      return -ENOMEM;
    while (*p && !is_blank (*p))
      p++;
    if (*p)
      *p++ = '\0';
  }
}

/* The lines of text where split_words will find a word: the targets,
 * counted first so that they are built in place (see struct target).
 */
static size_t
count_target_lines (const char *p)
{
  size_t n = 0;

  for (;;) {
    while (is_blank (*p))
      p++;
    n += *p != '\0' && *p != '\n' && *p != '#';
    p = strchr (p, '\n');
    if (p == NULL)
      return n;
    p++;
  }
}

void *
target_private_alloc (struct target *ti, size_t size)
{
  if (size <= sizeof ti->private_inline) {
    memset (ti->private_inline, 0, sizeof ti->private_inline);
    return ti->private_inline;
  }
  return calloc (1, size);
}

void
target_private_free (struct target *ti, void *p)
{
  if (p != ti->private_inline)
    free (p);
}

int
target_ctr_no_args (struct target *ti, unsigned argc, char **argv,
                    struct mapper_err *err)
{
  if (argc != 0) {
    mapper_err_set (err, "takes no arguments, got %u", argc);
    return -EINVAL;
  }
  return 0;
}

static int
note_stack_use (struct table *t, struct backend *be, uint64_t end,
                uint64_t align)
{
  for (size_t i = 0; i < t->stack_uses.len; i++) {
    struct stack_use *u = &t->stack_uses.ptr[i];
    if (u->be == be) {
      u->end = MAX (u->end, end);
      u->align |= align;
      return 0;
    }
  }
  if (stack_use_vector_append (&t->stack_uses, (struct stack_use) {
        .be = be, .end = end, .align = align }) == -1)
    return -ENOMEM;
  return 0;
}

/* Is be in t's read-only uses (target_get_backend_read_only)?  Its
 * index there, or -1.
 */
static ssize_t
read_only_index (const struct table *t, const struct backend *be)
{
  for (size_t i = 0; t->read_only_uses && i < t->read_only_uses->len; i++)
    if (t->read_only_uses->ptr[i] == be)
      return i;
  return -1;
}

static int
get_backend (struct target *ti, const char *spec, uint64_t start,
             uint64_t len, bool flushed, bool read_only,
             struct backend **out, struct mapper_err *err)
{
  struct table *t = ti->table;
  struct backend *be;
  uint64_t end, size;
  size_t i;
  int r;

  r = backend_get (spec, &be, err);
  if (r < 0)
    return r;
  if ((r = be->ops->get_size (be, &size)) < 0) {
    mapper_err_set (err, "%s: cannot get size: %s", spec,
                    mapper_strerror (-r));
    backend_put (be);
    return r;
  }
  if (__builtin_add_overflow (start, len, &end) || end > size) {
    mapper_err_set (err, "%s: area (offset %" PRIu64 " + length %" PRIu64
                    " sectors) beyond the end of the device (%" PRIu64
                    " sectors)", spec, start >> MAPPER_SECTOR_SHIFT,
                    len >> MAPPER_SECTOR_SHIFT, size >> MAPPER_SECTOR_SHIFT);
    backend_put (be);
    return -EINVAL;
  }
  if (((start | len) & (be->caps.block_min - 1)) != 0) {
    mapper_err_set (err, "%s: area (offset %" PRIu64 " + length %" PRIu64
                    " sectors) not aligned to the device's minimum block "
                    "size (%" PRIu32 " bytes)", spec,
                    start >> MAPPER_SECTOR_SHIFT, len >> MAPPER_SECTOR_SHIFT,
                    be->caps.block_min);
    backend_put (be);
    return -EINVAL;
  }
  /* What the table maps of a device it stacks on: a change of that
   * device's table must keep it valid (device_check_holders).
   */
  if (backend_lower_device (be) && (r = note_stack_use (t, be, end,
                                                        start | len)) < 0) {
    backend_put (be);
    mapper_err_set (err, "out of memory");
    return r;
  }
  /* The table keeps one reference per distinct backend.  A backend
   * only read through (an external origin) does not make the table
   * read-only: it is in read_only_uses until a target asks to write it.
   */
  for (i = 0; i < t->backends.len; i++)
    if (t->backends.ptr[i] == be)
      break;
  if (i < t->backends.len) {
    ssize_t k = read_only_index (t, be);
    backend_put (be);
    if (!read_only && k >= 0)
      backend_vector_remove (t->read_only_uses, k);
  }
  else if (backend_vector_append (&t->backends, be) == -1 ||
           (read_only && (t->read_only_uses == NULL ||
                          backend_vector_append (t->read_only_uses,
                                                 be) == -1))) {
    if (t->backends.len && t->backends.ptr[t->backends.len - 1] == be)
      t->backends.len--;
    backend_put (be);
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  if (flushed) {
    for (i = 0; i < t->flushed.len; i++)
      if (t->flushed.ptr[i] == be)
        break;
    /* No reference of its own: be stays in backends (the table's). */
    if (i == t->flushed.len && backend_vector_append (&t->flushed, be) == -1) {
      mapper_err_set (err, "out of memory");
      return -ENOMEM;
    }
  }
  *out = be;
  return 0;
}

int
target_get_backend (struct target *ti, const char *spec, uint64_t start,
                    uint64_t len, struct backend **out,
                    struct mapper_err *err)
{
  return get_backend (ti, spec, start, len, true, false, out, err);
}

int
target_get_backend_read_only (struct target *ti, const char *spec,
                              uint64_t start, uint64_t len,
                              struct backend **out, struct mapper_err *err)
{
  return get_backend (ti, spec, start, len, true, true, out, err);
}

int
target_get_path (struct target *ti, const char *spec, uint64_t start,
                 uint64_t len, struct backend **out, struct mapper_err *err)
{
  return get_backend (ti, spec, start, len, false, false, out, err);
}

/* Merge the backends' and targets' capabilities into the table's. */
static void
table_merge_caps (struct table *t)
{
  struct mapper_caps *c = &t->caps;

  c->size = t->nr_targets ? t->ends[t->nr_targets - 1] : 0;
  c->can_write = c->can_flush = c->can_fua = c->can_trim = true;
  c->can_zero = c->can_fast_zero = c->can_extents = true;
  c->can_multi_conn = true;
  c->block_min = 1;               /* byte-granular: we split exactly */
  c->block_pref = 4096;
  c->block_max = 0xffffffff;
  t->has_flush_failed = false;
  for (size_t i = 0; i < t->nr_targets; i++)
    t->has_flush_failed |= t->targets[i].type->flush_failed != NULL;
  for (size_t i = 0; i < t->backends.len; i++) {
    const struct mapper_caps *b = &t->backends.ptr[i]->caps;
    c->can_flush &= b->can_flush;
    if (read_only_index (t, t->backends.ptr[i]) < 0) {
      c->can_write &= b->can_write;
      c->can_trim &= b->can_trim;
      c->can_zero &= b->can_zero;
      c->can_fast_zero &= b->can_fast_zero;
    }
    c->can_extents &= b->can_extents;
    c->can_multi_conn &= b->can_multi_conn;
    c->block_min = MAX (c->block_min, b->block_min);
    c->block_pref = MAX (c->block_pref, b->block_pref);
  }
}

void
table_free (struct table *t)
{
  if (t == NULL)
    return;
  /* A live table is unbound before it goes (table_bind). */
  assert (t->device == NULL);
  for (size_t i = 0; i < t->nr_targets; i++)
    if (t->targets[i].type->dtr)
      t->targets[i].type->dtr (&t->targets[i]);
  for (size_t i = 0; i < t->backends.len; i++)
    backend_put (t->backends.ptr[i]);
  if (t->flushed.ptr != t->backends.ptr)   /* not the backends' array */
    backend_vector_reset (&t->flushed);
  backend_vector_reset (&t->backends);
  stack_use_vector_reset (&t->stack_uses);
  free (t->targets);
  free (t->ends);
  free (t->levels);
  free (t->origin);
  free (t);
}

/* The lookup index: a static B-tree over ends, the shape of Linux
 * dm-table's, built once at load.  A node is one cache line of
 * TABLE_INDEX_KEYS keys with INDEX_CHILDREN children, so a lookup in
 * 100,000 targets reads 6 lines (the top levels stay cached) where a
 * binary search over ends reads 17, most of them cold; see
 * bench/bench-lookup.  Children are found by arithmetic (node n's are
 * n * INDEX_CHILDREN + k), so it costs only its keys: about a byte per
 * target.  Tables of up to TABLE_INDEX_KEYS targets have none, and keep
 * ends unpadded: idle one-target devices pay nothing for it.
 */
#define INDEX_CHILDREN (TABLE_INDEX_KEYS + 1)
#define INDEX_LINE 64
/* INDEX_CHILDREN^21 > 2^64 nodes: no table is deeper. */
#define INDEX_MAX_DEPTH 21

/* The largest key under node n of level l (level t->depth is ends):
 * the last key of its rightmost leaf, UINT64_MAX (padding) if that leaf
 * is beyond the end.  Nodes are never missing from the middle of a
 * level, so a node beyond a level's end has only such leaves below it.
 */
static uint64_t
index_subtree_max (const struct table *t, size_t leaves, unsigned l,
                   size_t n)
{
  for (; l < t->depth; l++)
    n = n * INDEX_CHILDREN + TABLE_INDEX_KEYS;
  return n < leaves ? t->ends[n * TABLE_INDEX_KEYS + TABLE_INDEX_KEYS - 1]
    : UINT64_MAX;
}

/* Fill t->ends and build the index over it: 0 or -ENOMEM. */
static int
table_build_index (struct table *t)
{
  size_t leaves, count[INDEX_MAX_DEPTH + 1], keys = 0, hdr;
  unsigned depth = 0;
  uint64_t *p;

  if (t->nr_targets <= TABLE_INDEX_KEYS) {
    t->ends = malloc (t->nr_targets * sizeof *t->ends);
    if (t->ends == NULL)
      return -ENOMEM;
    for (size_t i = 0; i < t->nr_targets; i++)
      t->ends[i] = t->targets[i].begin + t->targets[i].len;
    return 0;
  }

  /* Nodes per level: count[depth] leaves, up to count[0], the root. */
  leaves = DIV_ROUND_UP (t->nr_targets, TABLE_INDEX_KEYS);
  for (size_t n = leaves; n > 1; n = DIV_ROUND_UP (n, INDEX_CHILDREN))
    depth++;
  assert (depth >= 1 && depth <= INDEX_MAX_DEPTH);
  count[depth] = leaves;
  for (unsigned l = depth; l > 0; l--)
    count[l - 1] = DIV_ROUND_UP (count[l], INDEX_CHILDREN);
  assert (count[0] == 1);

  /* Leaves: ends, padded.  Sizes are whole cache lines. */
  t->ends = aligned_alloc (INDEX_LINE, leaves * INDEX_LINE);
  if (t->ends == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < leaves * TABLE_INDEX_KEYS; i++)
    t->ends[i] = i < t->nr_targets
      ? t->targets[i].begin + t->targets[i].len : UINT64_MAX;

  /* Upper levels: one allocation, the level pointers in its first
   * line(s), then the levels, root first.
   */
  for (unsigned l = 0; l < depth; l++)
    keys += count[l] * TABLE_INDEX_KEYS;
  hdr = DIV_ROUND_UP (depth * sizeof *t->levels, INDEX_LINE) * INDEX_LINE;
  t->levels = aligned_alloc (INDEX_LINE, hdr + keys * sizeof (uint64_t));
  if (t->levels == NULL)
    return -ENOMEM;             /* ends freed with the table */
  t->depth = depth;
  p = (uint64_t *) ((char *) t->levels + hdr);
  for (unsigned l = 0; l < depth; l++) {
    t->levels[l] = p;
    for (size_t n = 0; n < count[l]; n++)
      for (size_t k = 0; k < TABLE_INDEX_KEYS; k++)
        *p++ = index_subtree_max (t, leaves, l + 1, n * INDEX_CHILDREN + k);
  }
  return 0;
}

/* Parse one non-empty line into *ti (appended by the caller). */
static int
parse_line (struct table *t, uint64_t expect, string_vector *w,
            struct target *ti, struct mapper_err *err)
{
  uint64_t begin, len, end;
  int r;

  if (w->len < 3) {
    mapper_err_set (err, "expected <start> <length> <target> [args...], "
                    "got %zu word%s", w->len, w->len == 1 ? "" : "s");
    return -EINVAL;
  }
  if ((r = parse_sectors (w->ptr[0], &begin)) < 0) {
    mapper_err_set (err, "start '%s' %s", w->ptr[0], parse_error_text (r));
    return -EINVAL;
  }
  if ((r = parse_sectors (w->ptr[1], &len)) < 0) {
    mapper_err_set (err, "length '%s' %s", w->ptr[1], parse_error_text (r));
    return -EINVAL;
  }
  if (len == 0) {
    mapper_err_set (err, "length is 0");
    return -EINVAL;
  }
  if (__builtin_add_overflow (begin, len, &end) || end > INT64_MAX) {
    mapper_err_set (err, "start %s + length %s overflows the maximum "
                    "device size: a device ends at sector "
                    MAPPER_MAX_SECTORS_TEXT " at most (NBD sizes are below "
                    "2^63 bytes)", w->ptr[0], w->ptr[1]);
    return -EINVAL;
  }
  if (expect == 0 && begin != 0) {
    mapper_err_set (err, "first target must start at sector 0, not %s",
                    w->ptr[0]);
    return -EINVAL;
  }
  if (begin < expect) {
    mapper_err_set (err, "target at sector %s overlaps the previous target "
                    "(which ends at sector %" PRIu64 ")",
                    w->ptr[0], expect >> MAPPER_SECTOR_SHIFT);
    return -EINVAL;
  }
  if (begin > expect) {
    mapper_err_set (err, "gap: target starts at sector %s but the previous "
                    "target ends at sector %" PRIu64,
                    w->ptr[0], expect >> MAPPER_SECTOR_SHIFT);
    return -EINVAL;
  }

  *ti = (struct target) { .table = t, .begin = begin, .len = len };
  ti->type = find_target_type (w->ptr[2]);
  if (ti->type == NULL) {
    mapper_err_set (err, "unknown target type '%s'", w->ptr[2]);
    return -EINVAL;
  }
  r = ti->type->ctr (ti, w->len - 3, &w->ptr[3], err);
  if (r < 0)
    mapper_err_prefix (err, "%s", ti->type->name);
  return r;
}

/* A copy of table text, wiped before it is freed: it may hold keys
 * (crypt) on lines that were never parsed.
 */
struct text_copy {
  char *p;
  size_t len;
};

static void
text_copy_free (struct text_copy *c)
{
  if (c->p) {
    explicit_bzero (c->p, c->len);
    free (c->p);
  }
}

int
table_parse (const char *text, const char *origin, struct table **out,
             struct mapper_err *err)
{
  __attribute__ ((cleanup (text_copy_free)))
    struct text_copy copy_ = { strdup (text), strlen (text) };
  char *copy = copy_.p;
  string_vector words = empty_vector;
  backend_vector read_only_uses = empty_vector;
  struct table *t;
  char *line, *next;
  size_t lineno = 0, nr_lines, bytes;
  uint64_t expect = 0;
  int r = 0;

  t = calloc (1, sizeof *t);
  if (t == NULL || copy == NULL || (t->origin = strdup (origin)) == NULL) {
    free (t);
    mapper_err_set (err, "%s: out of memory", origin);
    return -ENOMEM;
  }
  t->read_only_uses = &read_only_uses;

  /* The targets' array, exactly sized and cache-line aligned: each
   * target is constructed in its final place (a target's private data
   * may live inside it).
   */
  nr_lines = count_target_lines (copy);
  if (nr_lines == 0) {
    mapper_err_set (err, "%s: table is empty (no targets)", origin);
    r = -EINVAL;
    goto err;
  }
  if (__builtin_mul_overflow (nr_lines, sizeof *t->targets, &bytes) ||
      (t->targets = aligned_alloc (_Alignof (struct target), bytes))
      == NULL) {
    mapper_err_set (err, "%s: out of memory", origin);
    r = -ENOMEM;
    goto err;
  }

  for (line = copy; line; line = next) {
    struct target *ti = &t->targets[t->nr_targets];

    lineno++;
    next = strchr (line, '\n');
    if (next)
      *next++ = '\0';
    if ((r = split_words (line, &words)) < 0) {
      mapper_err_set (err, "out of memory");
      goto err_line;
    }
    if (words.len == 0)
      continue;
    assert (t->nr_targets < nr_lines);
    if ((r = parse_line (t, expect, &words, ti, err)) < 0)
      goto err_line;
    t->nr_targets++;            /* table_free destroys it from here */
    expect = ti->begin + ti->len;
  }
  assert (t->nr_targets == nr_lines);

  /* Immutable from here: give back the backends' growth room (10,000
   * idle devices pay for it).
   */
  if (t->backends.len > 0 && t->backends.len < t->backends.cap) {
    struct backend **p = realloc (t->backends.ptr,
                                  t->backends.len * sizeof *p);
    if (p) {
      t->backends.ptr = p;
      t->backends.cap = t->backends.len;
    }
  }
  /* Most tables flush every backend they have, in the same order: the
   * flushed list is then the backends' own array (cap 0, never freed
   * as flushed's), not an allocation of each idle device's table.
   */
  if (t->flushed.len == t->backends.len && t->flushed.len > 0 &&
      memcmp (t->flushed.ptr, t->backends.ptr,
              t->flushed.len * sizeof t->flushed.ptr[0]) == 0) {
    backend_vector_reset (&t->flushed);
    t->flushed.ptr = t->backends.ptr;
    t->flushed.len = t->backends.len;
    t->flushed.cap = 0;
  }
  if (table_build_index (t) < 0) {
    mapper_err_set (err, "%s: out of memory", origin);
    r = -ENOMEM;
    goto err;
  }
  for (size_t i = 0; i < t->nr_targets; i++) {
    t->nr_flush_hooks += t->targets[i].type->flush != NULL;
    t->nr_path_flushers += t->targets[i].type->paths;
  }
  table_merge_caps (t);
  t->read_only_uses = NULL;
  backend_vector_reset (&read_only_uses);
  string_vector_reset (&words);
  *out = t;
  return 0;

 err_line:
  mapper_err_prefix (err, "%s:%zu", origin, lineno);
 err:
  t->read_only_uses = NULL;
  backend_vector_reset (&read_only_uses);
  string_vector_reset (&words);
  table_free (t);
  return r;
}

int
table_parse_file (const char *path, struct table **out,
                  struct mapper_err *err)
{
  CLEANUP_FREE char *text = NULL;
  const char *nul;
  size_t size = 0;
  FILE *fp;
  int r;

  fp = fopen (path, "re");
  if (fp == NULL) {
    r = -errno;
    mapper_err_set (err, "%s: %s", path, mapper_strerror (errno));
    return r;
  }
  {
    /* The text may hold keys (crypt): read through no buffer that is
     * freed unwiped (open_memstream's growth, fp's stdio buffer).
     */
    struct secret_stream mem;
    char buf[65536];
    size_t n;

    if (secret_stream_open (&mem) == NULL) {
      fclose (fp);
      mapper_err_set (err, "%s: out of memory", path);
      return -ENOMEM;
    }
    setvbuf (fp, NULL, _IONBF, 0);
    while ((n = fread (buf, 1, sizeof buf, fp)) > 0)
      fwrite (buf, 1, n, mem.fp);
    r = ferror (fp) ? -errno : 0;
    explicit_bzero (buf, sizeof buf);
    fclose (fp);
    if (secret_stream_close (&mem, &text, &size) == -1 && r == 0)
      r = -ENOMEM;
    if (r < 0) {
      if (text)
        explicit_bzero (text, size);
      mapper_err_set (err, "%s: read: %s", path, mapper_strerror (-r));
      return r;
    }
  }
  if ((nul = memchr (text, '\0', size)) != NULL) {
    mapper_err_set (err, "%s: table contains a NUL byte at offset %zu",
                    path, (size_t) (nul - text));
    r = -EINVAL;
  }
  else
    r = table_parse (text, path, out, err);
  /* The text may hold keys (crypt): don't leave them in freed memory. */
  explicit_bzero (text, size);
  return r;
}

/* How many of a node's keys are <= off: the child to take, or in a leaf
 * the entry.  Without a branch: where the answer falls is random, and a
 * mispredicted branch per level costs more than the compares.
 */
static inline size_t
node_rank (const uint64_t *node, uint64_t off)
{
  size_t k = 0;

#pragma GCC unroll 8
  for (size_t i = 0; i < TABLE_INDEX_KEYS; i++)
    k += node[i] <= off;
  return k;
}

size_t
table_find_target (const struct table *t, uint64_t off)
{
  size_t n = 0;

  /* The first target whose end is beyond off. */
  if (t->depth == 0) {
    /* A single short node, unpadded; the last end (caps.size > off)
     * needs no look.
     */
    for (size_t i = 0; i + 1 < t->nr_targets; i++)
      n += t->ends[i] <= off;
    return n;
  }
  for (unsigned l = 0; l < t->depth; l++)
    n = n * INDEX_CHILDREN +
      node_rank (t->levels[l] + n * TABLE_INDEX_KEYS, off);
  /* Leaf n: the target is one of its TABLE_INDEX_KEYS, and every caller
   * reads it next.  On a wide table it is cold: fetch all their lines
   * (one each) now, while the leaf comes in, rather than one miss after
   * the other.  Only the last leaf is short.
   */
  n *= TABLE_INDEX_KEYS;
  if (n + TABLE_INDEX_KEYS <= t->nr_targets) {
#pragma GCC unroll 8
    for (size_t i = 0; i < TABLE_INDEX_KEYS; i++)
      __builtin_prefetch (&t->targets[n + i]);
  }
  else
    for (size_t i = n; i < t->nr_targets; i++)
      __builtin_prefetch (&t->targets[i]);
  return n + node_rank (t->ends + n, off);
}

/* Protects every table's device pointer and is held while an event is
 * raised through it, so that the swap unbinding a table, or the free of
 * its device, waits for an event in flight on it (dm's _event_lock).
 * Order: dev->lock, then this, then device_events_lock.
 */
static pthread_mutex_t table_event_lock = PTHREAD_MUTEX_INITIALIZER;

void
table_bind (struct table *t, struct device *dev)
{
  if (t == NULL)
    return;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&table_event_lock);
  t->device = dev;
}

void
target_event (struct target *ti, const char *fmt, ...)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&table_event_lock);
  struct device *dev = ti->table->device;

  /* Logged first: whoever the event wakes finds the line written. */
  if (mapper_log) {
    char msg[512];
    va_list ap;

    va_start (ap, fmt);
    vsnprintf (msg, sizeof msg, fmt, ap);
    va_end (ap);
    if (dev)
      mapper_log ("%s: device %s: %s", ti->type->name, device_name (dev),
                  msg);
    else
      mapper_log ("%s: %s (not live): %s", ti->type->name, ti->table->origin,
                  msg);
  }
  if (dev)
    device_event (dev);
}

void
table_presuspend (struct table *t)
{
  for (size_t i = 0; i < t->nr_targets; i++)
    if (t->targets[i].type->presuspend)
      t->targets[i].type->presuspend (&t->targets[i]);
}

bool
target_noflush_suspending (const struct target *ti)
{
  return atomic_load (&ti->table->noflush_suspending);
}

void
table_resume (struct table *t)
{
  for (size_t i = 0; i < t->nr_targets; i++)
    if (t->targets[i].type->resume)
      t->targets[i].type->resume (&t->targets[i]);
}

int
table_preresume (struct table *t, struct mapper_err *err)
{
  for (size_t i = 0; i < t->nr_targets; i++) {
    struct target *ti = &t->targets[i];
    int r;

    if (ti->type->preresume && (r = ti->type->preresume (ti, err)) < 0) {
      mapper_err_prefix (err, "%s target at sector %" PRIu64, ti->type->name,
                         ti->begin >> MAPPER_SECTOR_SHIFT);
      return r;
    }
  }
  return 0;
}

void
table_postsuspend (struct table *t)
{
  for (size_t i = 0; i < t->nr_targets; i++)
    if (t->targets[i].type->postsuspend)
      t->targets[i].type->postsuspend (&t->targets[i]);
}

/* Suspend's flush of the paths of targets that flush their own
 * (target_type.paths): their flush hooks.
 */
int
table_flush_paths (struct table *t)
{
  struct io_req req;
  int r = 0;

  if (t->nr_path_flushers == 0)
    return 0;
  io_req_init (&req, IO_FLUSH, 0);
  for (size_t i = 0; i < t->nr_targets && r == 0; i++)
    if (t->targets[i].type->paths)
      r = t->targets[i].type->flush (&t->targets[i], &req);
  io_req_release (&req);
  return r;
}

/* Called for each device flush of a table with nr_flush_hooks > 0. */
int
table_flush_hooks (struct table *t, uint32_t flags)
{
  struct io_req req;
  int r = 0;

  io_req_init (&req, IO_FLUSH, flags);
  for (size_t i = 0; i < t->nr_targets && r == 0; i++)
    if (t->targets[i].type->flush)
      r = t->targets[i].type->flush (&t->targets[i], &req);
  io_req_release (&req);
  return r;
}

void
table_set_read_only (struct table *t)
{
  assert (t->device == NULL);
  t->read_only = true;
  t->caps.can_write = t->caps.can_trim = false;
  t->caps.can_zero = t->caps.can_fast_zero = false;
}

bool
table_read_only (const struct table *t)
{
  return t->read_only;
}

const struct mapper_caps *
table_caps (const struct table *t)
{
  return &t->caps;
}

size_t
table_nr_targets (const struct table *t)
{
  return t->nr_targets;
}

size_t
table_nr_backends (const struct table *t)
{
  return t->backends.len;
}

size_t
table_summary (const struct table *t, char *buf, size_t len)
{
  size_t used = 0;

  if (len)
    buf[0] = '\0';
  for (size_t i = 0; i < ARRAY_SIZE (target_types); i++) {
    size_t n = 0;
    for (size_t j = 0; j < t->nr_targets; j++)
      n += t->targets[j].type == target_types[i];
    if (n)
      EMIT ("%s%zu %s", used ? ", " : "", n, target_types[i]->name);
  }
  return used;
}

static size_t
table_print (const struct table *t, enum status_type type, char *buf,
             size_t len)
{
  size_t used = 0;

  if (len)
    buf[0] = '\0';
  for (size_t i = 0; i < t->nr_targets; i++) {
    struct target *ti = &t->targets[i];
    EMIT ("%" PRIu64 " %" PRIu64 " %s", ti->begin >> MAPPER_SECTOR_SHIFT,
          ti->len >> MAPPER_SECTOR_SHIFT, ti->type->name);
    if (ti->type->status) {
      size_t n;
      /* The status goes after a space, into an empty string. */
      if (used + 1 < len) {
        buf[used] = ' ';
        buf[used + 1] = '\0';
        n = ti->type->status (ti, type, buf + used + 1, len - used - 1);
      }
      else
        n = ti->type->status (ti, type, NULL, 0);
      if (n > 0)
        used += 1 + n;
      else if (used < len)
        buf[used] = '\0';
    }
    EMIT ("\n");
  }
  return used;
}

size_t
table_format (const struct table *t, char *buf, size_t len)
{
  return table_print (t, STATUSTYPE_TABLE, buf, len);
}

size_t
table_status (const struct table *t, char *buf, size_t len)
{
  return table_print (t, STATUSTYPE_INFO, buf, len);
}

int
target_types_start (struct mapper_err *err)
{
  size_t i;
  int r = 0;

  for (i = 0; i < ARRAY_SIZE (target_types) && r == 0; i++)
    if (target_types[i]->start)
      r = target_types[i]->start (err);
  if (r < 0) {
    /* Type i - 1 failed: stop those before it. */
    for (i--; i-- > 0; )
      if (target_types[i]->stop)
        target_types[i]->stop ();
  }
  return r;
}

void
target_types_stop (void)
{
  for (size_t i = ARRAY_SIZE (target_types); i-- > 0; )
    if (target_types[i]->stop)
      target_types[i]->stop ();
}

size_t
target_type_count (void)
{
  return ARRAY_SIZE (target_types);
}

const char *
target_type_info (size_t i, unsigned version[3])
{
  if (i >= ARRAY_SIZE (target_types))
    return NULL;
  if (version)
    memcpy (version, target_types[i]->version, 3 * sizeof (unsigned));
  return target_types[i]->name;
}

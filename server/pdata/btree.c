/* SPDX-License-Identifier: BSD-3-Clause */
/* Btrees in dm's node format (dm-btree.c, dm-btree-remove.c): a 32-byte
 * header, max_entries 64-bit keys, then max_entries values; internal
 * nodes hold child block numbers, keys[i] being no more than the lowest
 * key below child i.  Changes go top-down through shadowed nodes: insert
 * splits a full node before descending into it, remove rebalances a child
 * with at most max_entries / 3 entries with a sibling first, so no node
 * but the root ever holds fewer than a third (thin_check's rule).  A
 * shared node (count > 1, after a snapshot) is copied and its children
 * incremented: internal children in the metadata space map, leaf values
 * through the tree's value type.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pdata.h"

static inline uint32_t nr_entries (const uint8_t *n) { return pd_le32 (n + 16); }
static inline uint32_t max_entries (const uint8_t *n) { return pd_le32 (n + 20); }
static inline uint32_t vsize (const uint8_t *n) { return pd_le32 (n + 24); }
static inline bool is_leaf (const uint8_t *n) { return pd_le32 (n + 4) == PD_LEAF_NODE; }
static inline uint8_t *key_ptr (uint8_t *n, uint32_t i) { return n + PD_NODE_HEADER + 8 * i; }
static inline uint64_t key_at (const uint8_t *n, uint32_t i)
{ return pd_le64 (n + PD_NODE_HEADER + 8 * i); }
static inline uint8_t *value_ptr (uint8_t *n, uint32_t i)
{ return n + PD_NODE_HEADER + 8 * max_entries (n) + vsize (n) * i; }
static inline uint64_t child_at (uint8_t *n, uint32_t i)
{ return pd_le64 (value_ptr (n, i)); }
static inline void set_nr (uint8_t *n, uint32_t v) { pd_put32 (n + 16, v); }

uint32_t
pd_btree_max_entries (uint32_t value_size)
{
  uint32_t n = (PD_BLOCK_SIZE - PD_NODE_HEADER) / (8 + value_size);
  return 3 * (n / 3);
}

static void
init_node (uint8_t *n, bool leaf, uint32_t value_size)
{
  pd_put32 (n + 4, leaf ? PD_LEAF_NODE : PD_INTERNAL_NODE);
  set_nr (n, 0);
  pd_put32 (n + 20, pd_btree_max_entries (value_size));
  pd_put32 (n + 24, value_size);
}

/* Largest i with keys[i] <= key, or -1. */
static int
lower_bound (const uint8_t *n, uint64_t key)
{
  int lo = -1, hi = (int) nr_entries (n);

  while (hi - lo > 1) {
    int mid = lo + (hi - lo) / 2;
    if (key_at (n, (uint32_t) mid) <= key)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

/* A node of tree t: the validator checked the header; here its value
 * size must be the tree's (or 8 for internal nodes).
 */
static int
check_node (struct pd_btree *t, struct pd_block *blk)
{
  uint32_t want = is_leaf (blk->data) ? t->vt->size : 8;

  if (vsize (blk->data) != want)
    return pd_error (&t->tm->bm, EIO, "metadata block %llu (%s node): value "
                     "size %u, expected %u", (unsigned long long) blk->nr,
                     t->vt->name, vsize (blk->data), want);
  return 0;
}

static int
read_node (struct pd_btree *t, uint64_t b, struct pd_block **out)
{
  int r = pd_tm_read (t->tm, b, PD_BTREE_NODE, out);

  if (r == 0 && (r = check_node (t, *out)) < 0)
    pd_tm_put (t->tm, *out);
  return r;
}

static int
too_deep (struct pd_btree *t, uint64_t b)
{
  return pd_error (&t->tm->bm, EIO, "metadata block %llu (%s): tree deeper "
                   "than %d levels (a loop?)", (unsigned long long) b,
                   t->vt->name, PD_MAX_DEPTH);
}

/* Shadow node b; when it was shared, take a reference to each child. */
static int
shadow_node (struct pd_btree *t, uint64_t b, struct pd_block **out)
{
  bool inc;
  int r = pd_tm_shadow (t->tm, b, PD_BTREE_NODE, out, &inc);
  uint8_t *n;

  if (r < 0)
    return r;
  n = (*out)->data;
  if ((r = check_node (t, *out)) < 0)
    goto err;
  if (inc) {
    for (uint32_t i = 0; i < nr_entries (n); i++) {
      if (!is_leaf (n))
        r = pd_tm_inc (t->tm, child_at (n, i));
      else if (t->vt->inc)
        r = t->vt->inc (t->vt->context, value_ptr (n, i));
      if (r < 0)
        goto err;
    }
  }
  return 0;
 err:
  pd_tm_put (t->tm, *out);
  return r;
}

int
pd_btree_empty (struct pd_btree *t, uint64_t *root)
{
  struct pd_block *blk;
  int r = pd_tm_new_block (t->tm, PD_BTREE_NODE, &blk);

  if (r < 0)
    return r;
  init_node (blk->data, true, t->vt->size);
  *root = blk->nr;
  pd_tm_put (t->tm, blk);
  return 0;
}

int
pd_btree_lookup (struct pd_btree *t, uint64_t root, uint64_t key,
                 void *value)
{
  uint64_t b = root;

  for (int depth = 0; depth < PD_MAX_DEPTH; depth++) {
    struct pd_block *blk;
    int i, r = read_node (t, b, &blk);

    if (r < 0)
      return r;
    i = lower_bound (blk->data, key);
    if (is_leaf (blk->data)) {
      r = -ENODATA;
      if (i >= 0 && key_at (blk->data, (uint32_t) i) == key) {
        memcpy (value, value_ptr (blk->data, (uint32_t) i), t->vt->size);
        r = 0;
      }
      pd_tm_put (t->tm, blk);
      return r;
    }
    b = i < 0 ? 0 : child_at (blk->data, (uint32_t) i);
    pd_tm_put (t->tm, blk);
    if (i < 0)
      return -ENODATA;
  }
  return too_deep (t, root);
}

static int
lookup_ge (struct pd_btree *t, uint64_t b, uint64_t key, uint64_t *found,
           void *value, int depth)
{
  struct pd_block *blk;
  int i, r;

  if (depth >= PD_MAX_DEPTH)
    return too_deep (t, b);
  if ((r = read_node (t, b, &blk)) < 0)
    return r;
  i = lower_bound (blk->data, key);
  if (is_leaf (blk->data)) {
    uint32_t j = i >= 0 && key_at (blk->data, (uint32_t) i) == key ?
      (uint32_t) i : (uint32_t) (i + 1);
    r = -ENODATA;
    if (j < nr_entries (blk->data)) {
      *found = key_at (blk->data, j);
      memcpy (value, value_ptr (blk->data, j), t->vt->size);
      r = 0;
    }
  }
  else {
    r = -ENODATA;
    for (uint32_t j = i < 0 ? 0 : (uint32_t) i;
         r == -ENODATA && j < nr_entries (blk->data); j++)
      r = lookup_ge (t, child_at (blk->data, j), key, found, value,
                     depth + 1);
  }
  pd_tm_put (t->tm, blk);
  return r;
}

int
pd_btree_lookup_ge (struct pd_btree *t, uint64_t root, uint64_t key,
                    uint64_t *found_key, void *value)
{
  return lookup_ge (t, root, key, found_key, value, 0);
}

int
pd_btree_highest (struct pd_btree *t, uint64_t root, uint64_t *key)
{
  uint64_t b = root;

  for (int depth = 0; depth < PD_MAX_DEPTH; depth++) {
    struct pd_block *blk;
    uint32_t n;
    int r = read_node (t, b, &blk);

    if (r < 0)
      return r;
    n = nr_entries (blk->data);
    if (n == 0) {
      pd_tm_put (t->tm, blk);
      return -ENODATA;
    }
    if (is_leaf (blk->data)) {
      *key = key_at (blk->data, n - 1);
      pd_tm_put (t->tm, blk);
      return 0;
    }
    b = child_at (blk->data, n - 1);
    pd_tm_put (t->tm, blk);
  }
  return too_deep (t, root);
}

/* Move entries [from, nr) of node src to the start of the empty node dst
 * (same kind).
 */
static void
move_tail (uint8_t *dst, uint8_t *src, uint32_t from)
{
  uint32_t n = nr_entries (src), k = n - from, vs = vsize (src);

  memcpy (key_ptr (dst, 0), key_ptr (src, from), 8 * k);
  memcpy (value_ptr (dst, 0), value_ptr (src, from), vs * k);
  set_nr (dst, k);
  set_nr (src, from);
}

static void
insert_at (uint8_t *n, uint32_t i, uint64_t key, const void *value)
{
  uint32_t nr = nr_entries (n), vs = vsize (n);

  memmove (key_ptr (n, i + 1), key_ptr (n, i), 8 * (nr - i));
  memmove (value_ptr (n, i + 1), value_ptr (n, i), vs * (nr - i));
  pd_put64 (key_ptr (n, i), key);
  memcpy (value_ptr (n, i), value, vs);
  set_nr (n, nr + 1);
}

static void
delete_at (uint8_t *n, uint32_t i)
{
  uint32_t nr = nr_entries (n), vs = vsize (n);

  memmove (key_ptr (n, i), key_ptr (n, i + 1), 8 * (nr - i - 1));
  memmove (value_ptr (n, i), value_ptr (n, i + 1), vs * (nr - i - 1));
  set_nr (n, nr - 1);
}

/* The full root moves its entries into two new children and becomes an
 * internal node over them (dm's btree_split_beneath).
 */
static int
split_beneath (struct pd_btree *t, struct pd_block *root)
{
  struct pd_block *l, *r;
  uint8_t *n = root->data, v[8];
  uint32_t half = nr_entries (n) / 2;
  bool leaf = is_leaf (n);
  int e;

  if ((e = pd_tm_new_block (t->tm, PD_BTREE_NODE, &l)) < 0)
    return e;
  if ((e = pd_tm_new_block (t->tm, PD_BTREE_NODE, &r)) < 0) {
    pd_tm_put (t->tm, l);
    return e;
  }
  init_node (l->data, leaf, vsize (n));
  init_node (r->data, leaf, vsize (n));
  move_tail (r->data, n, half);
  move_tail (l->data, n, 0);
  init_node (n, false, 8);
  pd_put64 (v, l->nr);
  insert_at (n, 0, key_at (l->data, 0), v);
  pd_put64 (v, r->nr);
  insert_at (n, 1, key_at (r->data, 0), v);
  pd_tm_put (t->tm, l);
  pd_tm_put (t->tm, r);
  return 0;
}

/* Split the full child (entry i of parent, already shadowed) in two; the
 * new right half goes in at i + 1.
 */
static int
split_child (struct pd_btree *t, uint8_t *parent, uint32_t i,
             struct pd_block *child)
{
  struct pd_block *right;
  uint8_t v[8];
  int r = pd_tm_new_block (t->tm, PD_BTREE_NODE, &right);

  if (r < 0)
    return r;
  init_node (right->data, is_leaf (child->data), vsize (child->data));
  move_tail (right->data, child->data, nr_entries (child->data) / 2);
  pd_put64 (v, right->nr);
  insert_at (parent, i + 1, key_at (right->data, 0), v);
  pd_tm_put (t->tm, right);
  return 0;
}

int
pd_btree_insert (struct pd_btree *t, uint64_t *root, uint64_t key,
                 const void *value, bool keep_old, bool *inserted)
{
  struct pd_block *blk, *cblk;
  int r, depth;

  if ((r = shadow_node (t, *root, &blk)) < 0)
    return r;
  *root = blk->nr;
  if (nr_entries (blk->data) == max_entries (blk->data) &&
      (r = split_beneath (t, blk)) < 0)
    goto out;

  for (depth = 0; depth < PD_MAX_DEPTH; depth++) {
    uint8_t *n = blk->data;
    int i = lower_bound (n, key);

    if (is_leaf (n)) {
      if (i >= 0 && key_at (n, (uint32_t) i) == key) {
        uint8_t *old = value_ptr (n, (uint32_t) i);
        if (!keep_old && t->vt->dec && memcmp (old, value, t->vt->size) &&
            (r = t->vt->dec (t->vt->context, old)) < 0)
          goto out;
        memcpy (old, value, t->vt->size);
        if (inserted)
          *inserted = false;
      }
      else {
        insert_at (n, (uint32_t) (i + 1), key, value);
        if (inserted)
          *inserted = true;
      }
      r = 0;
      goto out;
    }
    if (i < 0) {
      pd_put64 (key_ptr (n, 0), key);     /* the new lowest key */
      i = 0;
    }
    if ((r = shadow_node (t, child_at (n, (uint32_t) i), &cblk)) < 0)
      goto out;
    pd_put64 (value_ptr (n, (uint32_t) i), cblk->nr);
    if (nr_entries (cblk->data) == max_entries (cblk->data)) {
      if ((r = split_child (t, n, (uint32_t) i, cblk)) < 0) {
        pd_tm_put (t->tm, cblk);
        goto out;
      }
      if (key >= key_at (n, (uint32_t) i + 1)) {
        uint64_t rb = child_at (n, (uint32_t) i + 1);
        pd_tm_put (t->tm, cblk);
        /* made in this transaction, count 1: no copy */
        if ((r = shadow_node (t, rb, &cblk)) < 0)
          goto out;
      }
    }
    pd_tm_put (t->tm, blk);
    blk = cblk;
  }
  r = too_deep (t, *root);
 out:
  pd_tm_put (t->tm, blk);
  return r;
}

/* Make sure child i of the (shadowed) internal node n holds more than a
 * third of its capacity, merging with or borrowing from a sibling.
 */
static int
rebalance (struct pd_btree *t, uint8_t *n, uint32_t i)
{
  struct pd_block *lb, *rb, *c;
  uint32_t l, nl, nr, max, total;
  int r;

  if ((r = read_node (t, child_at (n, i), &c)) < 0)
    return r;
  nl = nr_entries (c->data);
  max = max_entries (c->data);
  pd_tm_put (t->tm, c);
  if (nl > max / 3 || nr_entries (n) < 2)
    return 0;
  l = i + 1 < nr_entries (n) ? i : i - 1;
  if ((r = shadow_node (t, child_at (n, l), &lb)) < 0)
    return r;
  pd_put64 (value_ptr (n, l), lb->nr);
  if ((r = shadow_node (t, child_at (n, l + 1), &rb)) < 0) {
    pd_tm_put (t->tm, lb);
    return r;
  }
  pd_put64 (value_ptr (n, l + 1), rb->nr);
  if (is_leaf (lb->data) != is_leaf (rb->data) ||
      max_entries (lb->data) != max_entries (rb->data)) {
    r = pd_error (&t->tm->bm, EIO, "metadata blocks %llu and %llu (%s): "
                  "siblings of different kinds", (unsigned long long) lb->nr,
                  (unsigned long long) rb->nr, t->vt->name);
    goto out;
  }
  nl = nr_entries (lb->data);
  nr = nr_entries (rb->data);
  total = nl + nr;
  max = max_entries (lb->data);
  if (total <= max) {
    uint32_t vs = vsize (lb->data);
    memcpy (key_ptr (lb->data, nl), key_ptr (rb->data, 0), 8 * nr);
    memcpy (value_ptr (lb->data, nl), value_ptr (rb->data, 0), vs * nr);
    set_nr (lb->data, total);
    set_nr (rb->data, 0);
    delete_at (n, l + 1);
    /* rb's children now belong to lb: free the node alone */
    r = pd_tm_dec (t->tm, rb->nr);
  }
  else if (nl < total / 2) {
    /* move the head of the right node to the tail of the left */
    uint32_t k = total / 2 - nl, vs = vsize (lb->data);
    memcpy (key_ptr (lb->data, nl), key_ptr (rb->data, 0), 8 * k);
    memcpy (value_ptr (lb->data, nl), value_ptr (rb->data, 0), vs * k);
    set_nr (lb->data, nl + k);
    memmove (key_ptr (rb->data, 0), key_ptr (rb->data, k), 8 * (nr - k));
    memmove (value_ptr (rb->data, 0), value_ptr (rb->data, k), vs * (nr - k));
    set_nr (rb->data, nr - k);
    pd_put64 (key_ptr (n, l + 1), key_at (rb->data, 0));
  }
  else {
    /* move the tail of the left node to the head of the right */
    uint32_t k = nl - total / 2, vs = vsize (lb->data);
    memmove (key_ptr (rb->data, k), key_ptr (rb->data, 0), 8 * nr);
    memmove (value_ptr (rb->data, k), value_ptr (rb->data, 0), vs * nr);
    memcpy (key_ptr (rb->data, 0), key_ptr (lb->data, nl - k), 8 * k);
    memcpy (value_ptr (rb->data, 0), value_ptr (lb->data, nl - k), vs * k);
    set_nr (rb->data, nr + k);
    set_nr (lb->data, nl - k);
    pd_put64 (key_ptr (n, l + 1), key_at (rb->data, 0));
  }
 out:
  pd_tm_put (t->tm, lb);
  pd_tm_put (t->tm, rb);
  return r;
}

int
pd_btree_remove (struct pd_btree *t, uint64_t *root, uint64_t key)
{
  struct pd_block *blk, *cblk;
  uint8_t v[PD_BLOCK_SIZE];
  int r, depth;

  /* Nothing to remove: change nothing (no shadow). */
  if (t->vt->size > sizeof v)
    return -EINVAL;
  if ((r = pd_btree_lookup (t, *root, key, v)) < 0)
    return r;
  if ((r = shadow_node (t, *root, &blk)) < 0)
    return r;
  *root = blk->nr;

  for (depth = 0; depth < PD_MAX_DEPTH; depth++) {
    uint8_t *n = blk->data;
    int i = lower_bound (n, key);

    if (i < 0) {
      r = pd_error (&t->tm->bm, EIO, "metadata block %llu (%s node): key "
                    "%llu vanished", (unsigned long long) blk->nr,
                    t->vt->name, (unsigned long long) key);
      goto out;
    }
    if (is_leaf (n)) {
      if (key_at (n, (uint32_t) i) != key) {
        r = -ENODATA;
        goto out;
      }
      if (t->vt->dec &&
          (r = t->vt->dec (t->vt->context, value_ptr (n, (uint32_t) i))) < 0)
        goto out;
      delete_at (n, (uint32_t) i);
      r = 0;
      goto out;
    }
    if ((r = rebalance (t, n, (uint32_t) i)) < 0)
      goto out;
    i = lower_bound (n, key);
    if (i < 0)
      i = 0;
    if ((r = shadow_node (t, child_at (n, (uint32_t) i), &cblk)) < 0)
      goto out;
    pd_put64 (value_ptr (n, (uint32_t) i), cblk->nr);
    if (blk->nr == *root && nr_entries (n) == 1) {
      /* the root has a single child left: it becomes the root */
      uint64_t old = blk->nr;
      pd_tm_put (t->tm, blk);
      *root = cblk->nr;
      blk = cblk;
      if ((r = pd_tm_dec (t->tm, old)) < 0)
        goto out;
      continue;
    }
    pd_tm_put (t->tm, blk);
    blk = cblk;
  }
  r = too_deep (t, *root);
 out:
  pd_tm_put (t->tm, blk);
  return r;
}

static int
del (struct pd_btree *t, uint64_t b, int depth)
{
  struct pd_block *blk;
  int r;

  if (depth >= PD_MAX_DEPTH)
    return too_deep (t, b);
  if (pd_tm_count (t->tm, b) > 1)
    return pd_tm_dec (t->tm, b);
  if ((r = read_node (t, b, &blk)) < 0)
    return r;
  for (uint32_t i = 0; r == 0 && i < nr_entries (blk->data); i++) {
    if (!is_leaf (blk->data))
      r = del (t, child_at (blk->data, i), depth + 1);
    else if (t->vt->dec)
      r = t->vt->dec (t->vt->context, value_ptr (blk->data, i));
  }
  pd_tm_put (t->tm, blk);
  return r < 0 ? r : pd_tm_dec (t->tm, b);
}

int
pd_btree_del (struct pd_btree *t, uint64_t root)
{
  return del (t, root, 0);
}

static int
walk (struct pd_btree *t, uint64_t b,
      int (*fn) (void *, uint64_t, const uint8_t *),
      int (*node_fn) (void *, uint64_t), void *opaque, void *node_opaque,
      int depth)
{
  struct pd_block *blk;
  int r;

  if (depth >= PD_MAX_DEPTH)
    return too_deep (t, b);
  if ((r = read_node (t, b, &blk)) < 0)
    return r;
  if (node_fn)
    r = node_fn (node_opaque, b);
  for (uint32_t i = 0; r == 0 && i < nr_entries (blk->data); i++) {
    if (!is_leaf (blk->data))
      r = walk (t, child_at (blk->data, i), fn, node_fn, opaque, node_opaque,
                depth + 1);
    else if (fn)
      r = fn (opaque, key_at (blk->data, i), value_ptr (blk->data, i));
  }
  pd_tm_put (t->tm, blk);
  return r;
}

int
pd_btree_walk_nodes (struct pd_btree *t, uint64_t root,
                     int (*fn) (void *, uint64_t, const uint8_t *),
                     int (*node_fn) (void *, uint64_t), void *opaque,
                     void *node_opaque)
{
  return walk (t, root, fn, node_fn, opaque, node_opaque, 0);
}

int
pd_btree_build (struct pd_tm *tm, uint32_t value_size,
                const uint64_t *keys, const uint8_t *values, size_t n,
                uint64_t *root, uint64_t **blocks, size_t *nr_blocks)
{
  uint64_t *level_keys = NULL, *nodes = NULL;
  uint8_t *level_values = NULL;
  size_t nr_nodes = 0;
  bool leaf = true;
  int r = 0;

  for (;;) {
    uint32_t max = pd_btree_max_entries (value_size);
    size_t count = n ? (n + max - 1) / max : 1;
    uint64_t *nk = malloc (count * sizeof *nk);
    uint8_t *nv = malloc (count * 8);
    uint64_t *nn = realloc (nodes, (nr_nodes + count) * sizeof *nn);

    if (nn)
      nodes = nn;
    if (!nk || !nv || !nn) {
      free (nk);
      free (nv);
      r = pd_error (&tm->bm, ENOMEM, "metadata space map: out of memory");
      goto out;
    }
    for (size_t j = 0; j < count; j++) {
      /* even shares, so every node holds at least half of max */
      size_t from = j * n / count, to = (j + 1) * n / count;
      struct pd_block *blk;

      if ((r = pd_tm_new_block (tm, PD_BTREE_NODE, &blk)) < 0) {
        free (nk);
        free (nv);
        goto out;
      }
      init_node (blk->data, leaf, value_size);
      for (size_t k = from; k < to; k++)
        insert_at (blk->data, (uint32_t) (k - from), keys[k],
                   values + (size_t) value_size * k);
      nk[j] = to > from ? keys[from] : 0;
      pd_put64 (nv + 8 * j, blk->nr);
      nodes[nr_nodes++] = blk->nr;
      pd_tm_put (tm, blk);
    }
    free (level_keys);
    free (level_values);
    level_keys = nk;
    level_values = nv;
    if (count == 1) {
      *root = pd_le64 (nv);
      break;
    }
    keys = level_keys;
    values = level_values;
    n = count;
    value_size = 8;
    leaf = false;
  }
 out:
  free (level_keys);
  free (level_values);
  if (r < 0) {
    free (nodes);
    return r;
  }
  *blocks = nodes;
  *nr_blocks = nr_nodes;
  return 0;
}

static int
scan (struct pd_btree *t, uint64_t b, uint64_t begin, uint64_t end,
      int (*fn) (void *, uint64_t, const uint8_t *), void *opaque,
      int depth)
{
  struct pd_block *blk;
  uint32_t j;
  int i, r;

  if (depth >= PD_MAX_DEPTH)
    return too_deep (t, b);
  if ((r = read_node (t, b, &blk)) < 0)
    return r;
  i = lower_bound (blk->data, begin);
  j = i < 0 ? 0 : (uint32_t) i;
  for (; r == 0 && j < nr_entries (blk->data); j++) {
    uint64_t k = key_at (blk->data, j);
    if (k >= end)
      break;
    if (!is_leaf (blk->data))
      r = scan (t, child_at (blk->data, j), begin, end, fn, opaque,
                depth + 1);
    else if (k >= begin)
      r = fn (opaque, k, value_ptr (blk->data, j));
  }
  pd_tm_put (t->tm, blk);
  return r;
}

int
pd_btree_scan (struct pd_btree *t, uint64_t root, uint64_t begin,
               uint64_t end, int (*fn) (void *, uint64_t, const uint8_t *),
               void *opaque)
{
  return scan (t, root, begin, end, fn, opaque, 0);
}

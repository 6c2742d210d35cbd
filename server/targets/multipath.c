/* SPDX-License-Identifier: BSD-3-Clause */
/* multipath <#features> [<feature>...] <#hw_handler_args> [<hw_handler>...]
 *           <#groups> <initial_group>
 *           (<selector> <#selector_args> <#paths> <#path_args>
 *            (<path> [<path_arg>...])...)...
 *
 * dm-multipath, with multipathd's part (the path checker, no_path_retry,
 * failback) built in.  Every path reaches the same storage (NBD servers
 * over one file, replicas kept identical below); each request goes to
 * one path of the current priority group, chosen by the group's path
 * selector (round-robin, queue-length, service-time, as dm's).  A path
 * that fails a request is failed ('F', an event) and the clone goes to
 * another path of the group, then of the next group (CLONE_REMAP: the
 * request's waiter chooses, and may wait there with queue_if_no_path).
 * A path that has not answered anything for the path timeout while it
 * has requests is failed too, and its requests are given up on it
 * (backend_abandon: the connection carrying them is closed before they
 * complete, so no late reply lands in a buffer reissued elsewhere) and
 * reissued elsewhere: detection never waits for remote-timeout.
 *
 * Paths are the target's to flush (target_get_path, .paths): a device
 * flush flushes each active path that carried writes since its last
 * good flush; the writes of a path that failed are covered by a
 * successful flush on another path started after them, which is what
 * the storage must honour (nbdkit-mapper-plugin(1)).
 *
 * Features (dm's, multipathd's and ours): queue_if_no_path,
 * no_path_retry N (checker intervals), path_timeout_msecs N,
 * checker_interval_msecs N, failback immediate|manual (manual, as
 * multipathd's default).  Hardware handlers: none (0) only.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "target.h"
#include "util.h"
#include "multipath.h"

/* A clone's end_io arg: the path, and whether it writes (the flush
 * rule counts writes per path).
 */
#define ARG_PATH(a) ((unsigned) ((a) & 0xffff))
#define ARG_WRITE 0x10000ULL

static const char *const selector_name[] = {
  [PS_ROUND_ROBIN] = "round-robin",
  [PS_QUEUE_LENGTH] = "queue-length",
  [PS_SERVICE_TIME] = "service-time",
};
/* Path arguments each selector takes (dm's table_args), and the status
 * words it prints per path (info_args).
 */
static const unsigned selector_table_args[] = { 1, 1, 2 };
static const unsigned selector_info_args[] = { 0, 1, 2 };

/* --- path state ------------------------------------------------------ */

void
mpath_update_queueing (struct mpath *m)
{
  bool q = m->msg_queueing ? m->msg_queueing > 0
    : m->queue_if_no_path && !m->exhausted;

  atomic_store (&m->queueing, q && !m->suspending);
  pthread_cond_broadcast (&m->cond);
}

/* keep_last: not if p is the last active path and the device would
 * fail I/O without it (neither queueing nor in a noflush suspend, which
 * holds it at the gate): false then, and nothing changes.
 */
static bool
fail_path (struct mpath *m, struct mpath_path *p, bool admin,
           bool keep_last, const char *why)
{
  unsigned left;

  if (admin)
    atomic_store (&p->admin_failed, true);
  pthread_mutex_lock (&m->lock);
  if (!atomic_load (&p->active)) {
    pthread_mutex_unlock (&m->lock);
    return true;
  }
  if (keep_last && atomic_load (&m->nr_valid) == 1 &&
      !atomic_load (&m->queueing) && !m->noflush_suspending) {
    pthread_mutex_unlock (&m->lock);
    return false;
  }
  atomic_store (&p->active, false);
  atomic_fetch_add (&p->fail_count, 1);
  left = atomic_fetch_sub (&m->nr_valid, 1) - 1;
  if (left == 0)
    m->nopath_since_ns = monotonic_ns ();
  p->next_check_ns = monotonic_ns () + m->checker_ns;
  pthread_cond_broadcast (&m->cond);
  pthread_mutex_unlock (&m->lock);
  target_event (m->ti, "path %s failed (%s), %u of %u paths left",
                backend_name (p->be), why, left, m->nr_paths);
  return true;
}

void
mpath_fail_path (struct mpath *m, struct mpath_path *p, bool admin,
                 const char *why)
{
  fail_path (m, p, admin, false, why);
}

bool
mpath_fail_silent_path (struct mpath *m, struct mpath_path *p,
                        const char *why)
{
  return fail_path (m, p, false, true, why);
}

void
mpath_reinstate_path (struct mpath *m, struct mpath_path *p, bool checker)
{
  int cur, g = (int) (p->pg - m->groups);

  atomic_store (&p->admin_failed, false);
  pthread_mutex_lock (&m->lock);
  if (atomic_load (&p->active)) {
    pthread_mutex_unlock (&m->lock);
    return;
  }
  atomic_store (&p->active, true);
  if (atomic_fetch_add (&m->nr_valid, 1) == 0) {
    /* multipathd queues again by no_path_retry's rule (its
     * update_queue_mode_add_path): the count restarts, and a message's
     * queueing under no_path_retry lapses.
     */
    m->exhausted = false;
    m->msg_queueing = 0;
    mpath_update_queueing (m);
  }
  /* multipathd's failback: back to a better group as soon as one of its
   * paths returns (immediate), or when told (manual: switch_group).
   */
  cur = atomic_load (&m->current_pg);
  if (checker && m->failback_immediate && cur > g && !p->pg->bypassed)
    atomic_store (&m->next_pg, g);
  pthread_cond_broadcast (&m->cond);
  pthread_mutex_unlock (&m->lock);
  target_event (m->ti, "path %s reinstated (%s), %u of %u paths active",
                backend_name (p->be), checker ? "path checker" : "message",
                atomic_load (&m->nr_valid), m->nr_paths);
}

/* Counters only, no clock: no selector needs the time (service-time
 * weighs bytes in flight, as dm-ps-service-time does), and the watchdog
 * times silence with its own clock, from when it sees inflight busy and
 * completions not moving (multipath-check.c).
 */
void
mpath_path_start (struct mpath_path *p, uint64_t len)
{
  atomic_fetch_add_explicit (&p->inflight_bytes, len, memory_order_relaxed);
  atomic_fetch_add (&p->inflight, 1);
}

void
mpath_path_end (struct mpath_path *p, uint64_t len)
{
  atomic_fetch_add_explicit (&p->completions, 1, memory_order_relaxed);
  atomic_fetch_sub_explicit (&p->inflight_bytes, len, memory_order_relaxed);
  atomic_fetch_sub (&p->inflight, 1);
}

/* --- path selectors -------------------------------------------------- */

static bool
path_usable (struct mpath_path *p)
{
  return atomic_load_explicit (&p->active, memory_order_relaxed);
}

/* round-robin: each path repeat_count requests in turn (a ticket per
 * request, lock-free), skipping failed paths.
 */
static struct mpath_path *
rr_select (struct mpath *m, struct mpath_group *g)
{
  uint64_t t = atomic_fetch_add_explicit (&g->rr_ticket, 1,
                                          memory_order_relaxed) % g->rr_cycle;
  unsigned start = 0;

  while (m->paths[g->first + start].rr_end <= t)
    start++;
  for (unsigned i = 0; i < g->nr_paths; i++) {
    struct mpath_path *p = &m->paths[g->first + (start + i) % g->nr_paths];
    if (path_usable (p))
      return p;
  }
  return NULL;
}

/* queue-length: the fewest requests in flight (the first on a tie). */
static struct mpath_path *
ql_select (struct mpath *m, struct mpath_group *g)
{
  struct mpath_path *best = NULL;
  unsigned best_n = 0;

  for (unsigned i = 0; i < g->nr_paths; i++) {
    struct mpath_path *p = &m->paths[g->first + i];
    unsigned n = atomic_load_explicit (&p->inflight, memory_order_relaxed);
    if (path_usable (p) && (best == NULL || n < best_n))
      best = p, best_n = n;
  }
  return best;
}

/* service-time, as dm-ps-service-time's st_compare_load: the shortest
 * (bytes in flight + this request) / relative throughput; a path of
 * throughput 0 only when every other one is 0 too.  < 0: p1 is better.
 */
static int
st_compare (struct mpath_path *p1, struct mpath_path *p2, uint64_t incoming)
{
  uint64_t s1 = atomic_load_explicit (&p1->inflight_bytes,
                                      memory_order_relaxed) + incoming;
  uint64_t s2 = atomic_load_explicit (&p2->inflight_bytes,
                                      memory_order_relaxed) + incoming;
  unsigned __int128 l1, l2;

  if (p1->rel_tp == p2->rel_tp)
    return s1 < s2 ? -1 : s1 > s2;
  if (s1 == s2 || p1->rel_tp == 0 || p2->rel_tp == 0)
    return p1->rel_tp > p2->rel_tp ? -1 : 1;
  l1 = (unsigned __int128) s1 * p2->rel_tp;
  l2 = (unsigned __int128) s2 * p1->rel_tp;
  if (l1 != l2)
    return l1 < l2 ? -1 : 1;
  return p1->rel_tp > p2->rel_tp ? -1 : 1;
}

static struct mpath_path *
st_select (struct mpath *m, struct mpath_group *g, uint64_t len)
{
  struct mpath_path *best = NULL;

  for (unsigned i = 0; i < g->nr_paths; i++) {
    struct mpath_path *p = &m->paths[g->first + i];
    if (path_usable (p) && (best == NULL || st_compare (p, best, len) < 0))
      best = p;
  }
  return best;
}

static struct mpath_path *
select_in_group (struct mpath *m, struct mpath_group *g, uint64_t len)
{
  switch (g->ps) {
  case PS_ROUND_ROBIN: return rr_select (m, g);
  case PS_QUEUE_LENGTH: return ql_select (m, g);
  case PS_SERVICE_TIME: return st_select (m, g, len);
  }
  return NULL;
}

/* lock held: make group g current (a debug line when it changes). */
static void
set_current_pg (struct mpath *m, int g)
{
  if (atomic_exchange (&m->current_pg, g) != g && g >= 0 && mapper_debug)
    mapper_debug ("multipath %s: priority group %d is active",
                  target_origin (m->ti), g + 1);
}

/* dm's choose_pgpath, under lock: the group switch_group (or the table)
 * named, once: it is used up whether or not it has a path (a switch to
 * a group with none is not kept for later, which would fail back when
 * one of its paths returns, whatever failback says); else the current
 * group while it has a path; else the first group in priority order
 * with one, disabled groups last.  NULL: no path.
 */
static struct mpath_path *
choose_path_locked (struct mpath *m, uint64_t len)
{
  struct mpath_path *p;
  int n = atomic_exchange (&m->next_pg, -1), cur;

  if (n >= 0 && (p = select_in_group (m, &m->groups[n], len)) != NULL) {
    set_current_pg (m, n);
    return p;
  }
  cur = atomic_load (&m->current_pg);
  if (cur >= 0 && (p = select_in_group (m, &m->groups[cur], len)) != NULL)
    return p;
  for (int bypassed = 0; bypassed <= 1; bypassed++)
    for (unsigned i = 0; i < m->nr_groups; i++) {
      if (atomic_load (&m->groups[i].bypassed) != bypassed)
        continue;
      if ((p = select_in_group (m, &m->groups[i], len)) != NULL) {
        set_current_pg (m, (int) i);
        return p;
      }
    }
  set_current_pg (m, -1);
  return NULL;
}

/* A path for a request: lock-free while the current group serves and no
 * switch is due; group changes are decided under the lock, so that two
 * requests never undo each other's choice.
 */
static struct mpath_path *
choose_path (struct mpath *m, uint64_t len)
{
  struct mpath_path *p;
  int cur;

  if (atomic_load (&m->next_pg) < 0 &&
      (cur = atomic_load (&m->current_pg)) >= 0 &&
      (p = select_in_group (m, &m->groups[cur], len)) != NULL)
    return p;
  pthread_mutex_lock (&m->lock);
  p = choose_path_locked (m, len);
  pthread_mutex_unlock (&m->lock);
  return p;
}

/* The path block status asks first: the first active path of the group
 * I/O goes to (or will, after switch_group).  A query, not I/O: it
 * leaves the selectors' state (round-robin's turn) and the group as
 * they are.  NULL: none.
 */
static struct mpath_path *
peek_path (struct mpath *m)
{
  int g = atomic_load (&m->next_pg);

  if (g < 0 && (g = atomic_load (&m->current_pg)) < 0)
    return NULL;
  for (unsigned i = 0; i < m->groups[g].nr_paths; i++)
    if (path_usable (&m->paths[m->groups[g].first + i]))
      return &m->paths[m->groups[g].first + i];
  return NULL;
}

/* No path: wait while queueing (queue_if_no_path) for one to come back.
 * 0: look again; -EIO: fail the I/O; -ESHUTDOWN: the request was given
 * up (the client went, the server is stopping); MAPPER_EREQUEUE: a
 * noflush suspend, which holds it at the device's gate instead.
 */
static int
wait_for_path (struct mpath *m, uint64_t *asked)
{
  int r = 0;

  pthread_mutex_lock (&m->lock);
  /* A noflush suspend: back to the device's gate, queueing or not (dm's
   * must_push_back_rq), and mapped again after the resume.
   */
  if (atomic_load (&m->nr_valid) == 0 && m->noflush_suspending)
    r = MAPPER_EREQUEUE;
  while (atomic_load (&m->nr_valid) == 0 && atomic_load (&m->queueing) &&
         r == 0) {
    r = request_wait (&m->cond, &m->lock, 0, asked);
    if (r == 0 && m->noflush_suspending)
      r = MAPPER_EREQUEUE;
  }
  if (r == 0 && atomic_load (&m->nr_valid) == 0)
    r = -EIO;
  pthread_mutex_unlock (&m->lock);
  return r;
}

/* A path, waiting for one if queueing; NULL with *error set if none. */
static struct mpath_path *
get_path (struct mpath *m, uint64_t len, int *error)
{
  uint64_t asked = 0;
  struct mpath_path *p;

  while ((p = choose_path (m, len)) == NULL)
    if ((*error = wait_for_path (m, &asked)) < 0)
      return NULL;
  return p;
}

/* --- I/O ------------------------------------------------------------- */

/* Errors that say nothing against the path: the request itself was
 * refused (dm's noretry errors), or given up.
 */
static bool
path_error (int error)
{
  switch (-error) {
  case ENOSPC: case EPERM: case ENOTSUP: case EINVAL: case EOVERFLOW:
  case ESHUTDOWN: case ECANCELED: case ENOMEM:
    return false;
  default:
    return true;
  }
}

static int
mpath_end_io (struct clone *c, void *ctx, uint64_t arg, int error)
{
  struct mpath *m = ctx;
  struct mpath_path *p = &m->paths[ARG_PATH (arg)];
  uint64_t offset, len;
  char why[64];

  clone_range (c, &offset, &len);
  mpath_path_end (p, len);
  /* A failed write may have written part: it counts for the flush. */
  if ((arg & ARG_WRITE) && error != -ECANCELED)
    atomic_fetch_add (&p->writes, 1);
  if (error == 0 || !path_error (error))
    return error;
  snprintf (why, sizeof why, "%s", error == -EIO ? "I/O error"
            : mapper_strerror (-error));
  mpath_fail_path (m, p, false, why);
  return CLONE_REMAP;           /* mpath_remap, in the request's waiter */
}

/* In the thread waiting for the request: another path, or the wait for
 * one.
 */
static int
mpath_remap (struct clone *c, void *ctx, uint64_t arg)
{
  struct mpath *m = ctx;
  struct mpath_path *p;
  uint64_t offset, len;
  int r;

  clone_range (c, &offset, &len);
  if ((p = get_path (m, len, &r)) == NULL)
    return r;
  mpath_path_start (p, len);
  clone_retry (c, p->be, offset, p->nr | (arg & ARG_WRITE));
  return 0;
}

static int
mpath_map (struct target *ti, struct io_req *req, uint64_t off,
           uint64_t len, char *buf)
{
  struct mpath *m = ti->private;
  struct mpath_path *p;
  uint64_t arg = io_req_is_read (req) ? 0 : ARG_WRITE;
  int r;

  if ((p = get_path (m, len, &r)) == NULL)
    return r;
  mpath_path_start (p, len);
  r = io_emit_remap (req, p->be, off, len, buf, mpath_end_io, mpath_remap,
                     m, p->nr | arg);
  if (r < 0)
    mpath_path_end (p, len);
  return r;
}

/* The target's own I/O on one path (probes, flushes): counted, so that
 * the watchdog gives it up when the path stalls, and never retried.
 */
static int
own_end_io (struct clone *c, void *ctx, uint64_t arg, int error)
{
  struct mpath *m = ctx;
  uint64_t offset, len;

  clone_range (c, &offset, &len);
  mpath_path_end (&m->paths[ARG_PATH (arg)], len);
  return error == CLONE_RETRY || error == CLONE_REMAP ? -EIO : error;
}

static int
own_io (struct mpath *m, struct mpath_path *p, enum io_op op, uint64_t len,
        char *buf)
{
  mpath_path_start (p, len);
  return io_sync_end_io (op, p->be, 0, len, buf, own_end_io, m, p->nr);
}

int
mpath_probe (struct mpath *m, struct mpath_path *p)
{
  const struct mapper_caps *caps = backend_caps (p->be);
  uint64_t len = MIN (MAX (caps->block_min, 512u), m->ti->len);
  char *buf = bounce_get (len);
  int r;

  if (buf == NULL)
    return -ENOMEM;
  r = own_io (m, p, IO_READ, len, buf);
  bounce_put (buf);
  return r;
}

/* The writes p has completed up to w are durable. */
static void
mark_flushed (struct mpath_path *p, uint64_t w)
{
  uint64_t old = atomic_load (&p->flushed);

  while (old < w && !atomic_compare_exchange_weak (&p->flushed, &old, w))
    ;
}

/* The flush rule (nbdkit-mapper-plugin(1), server/README.md): every
 * active path that carried writes since its last good flush is flushed;
 * the writes of a path that failed (before or during this flush) are
 * covered by a successful flush on another path, which started after
 * they completed; with no such flush yet, one path is flushed for them
 * (waiting for one with queue_if_no_path).  A flush that fails fails
 * its path.
 */
static int
mpath_flush (struct target *ti, struct io_req *req)
{
  struct mpath *m = ti->private;
  uint64_t w[MPATH_MAX_PATHS];
  bool dirty[MPATH_MAX_PATHS], covered = false, uncovered = false;
  struct mpath_path *p;
  int r;

  for (unsigned i = 0; i < m->nr_paths; i++) {
    w[i] = atomic_load (&m->paths[i].writes);
    dirty[i] = w[i] != atomic_load (&m->paths[i].flushed);
  }
  for (unsigned i = 0; i < m->nr_paths; i++) {
    p = &m->paths[i];
    if (!dirty[i])
      continue;
    if (!path_usable (p)) {
      uncovered = true;
      continue;
    }
    r = own_io (m, p, IO_FLUSH, 0, NULL);
    if (r == 0) {
      mark_flushed (p, w[i]);
      dirty[i] = false;
      covered = true;
    }
    else if (r == -ESHUTDOWN)
      return r;
    else {
      mpath_fail_path (m, p, false, "flush failed");
      uncovered = true;
    }
  }
  while (uncovered && !covered) {
    if ((p = get_path (m, 0, &r)) == NULL)
      return r;
    r = own_io (m, p, IO_FLUSH, 0, NULL);
    if (r == -ESHUTDOWN)
      return r;
    if (r == 0)
      covered = true;
    else
      mpath_fail_path (m, p, false, "flush failed");
  }
  for (unsigned i = 0; i < m->nr_paths; i++)
    if (dirty[i])
      mark_flushed (&m->paths[i], w[i]);
  return 0;
}

/* Block status from an active path of the current group, then any other
 * active path; data where none answers.
 */
static int
mpath_extents (struct target *ti, struct extent_walk *w, uint64_t off,
               uint64_t len)
{
  struct mpath *m = ti->private;
  uint64_t end = off + len;
  struct mpath_path *first = peek_path (m);

  for (unsigned i = 0; i <= m->nr_paths && !extent_walk_done (w); i++) {
    struct mpath_path *p = i == 0 ? first : &m->paths[i - 1];
    uint64_t pos = extent_walk_pos (w, ti);
    int r;

    if (p == NULL || (i > 0 && p == first) || !path_usable (p))
      continue;
    r = extent_walk_backend_try (w, ti, pos, p->be, pos, end - pos);
    if (r != EXTENT_BACKEND_FAILED)
      return r;
  }
  return extent_walk_data (w, ti, end);
}

/* --- status ----------------------------------------------------------- */

static unsigned
nr_features (const struct mpath *m)
{
  return (m->queue_if_no_path && m->no_path_retry < 0) +
    2 * (m->no_path_retry >= 0) +
    2 * (m->path_timeout_ns != MPATH_PATH_TIMEOUT_MS * 1000000ULL) +
    2 * (m->checker_ns != MPATH_CHECKER_MS * 1000000ULL) +
    2 * m->failback_immediate;
}

static size_t
mpath_status (struct target *ti, enum status_type type, char *buf,
              size_t len)
{
  struct mpath *m = ti->private;
  size_t used = 0;
  int n, cur;
  unsigned pg_num;

  /* One moment's groups: they change under the lock. */
  pthread_mutex_lock (&m->lock);
  n = atomic_load (&m->next_pg);
  cur = atomic_load (&m->current_pg);
  pg_num = n >= 0 ? (unsigned) n + 1 : cur >= 0 ? (unsigned) cur + 1
    : m->nr_groups ? 1 : 0;
  if (type == STATUSTYPE_INFO)
    /* dm: queue_io, pg_init_count; queue_io here: I/O is being queued. */
    EMIT ("2 %d 0 0", atomic_load (&m->nr_valid) == 0 &&
          atomic_load (&m->queueing));
  else {
    /* With no_path_retry, queue_if_no_path says nothing more (N > 0
     * queues, 0 fails) and messages do not change the table: printed
     * without it, the table loads back as it runs.
     */
    EMIT ("%u", nr_features (m));
    if (m->queue_if_no_path && m->no_path_retry < 0)
      EMIT (" queue_if_no_path");
    if (m->no_path_retry >= 0)
      EMIT (" no_path_retry %ld", m->no_path_retry);
    if (m->path_timeout_ns != MPATH_PATH_TIMEOUT_MS * 1000000ULL)
      EMIT (" path_timeout_msecs %" PRIu64, m->path_timeout_ns / 1000000);
    if (m->checker_ns != MPATH_CHECKER_MS * 1000000ULL)
      EMIT (" checker_interval_msecs %" PRIu64, m->checker_ns / 1000000);
    if (m->failback_immediate)
      EMIT (" failback immediate");
    EMIT (" 0");
  }
  pthread_mutex_unlock (&m->lock);
  EMIT (" %u %u", m->nr_groups, pg_num);

  for (unsigned g = 0; g < m->nr_groups; g++) {
    struct mpath_group *pg = &m->groups[g];

    if (type == STATUSTYPE_INFO)
      EMIT (" %c 0 %u %u", atomic_load (&pg->bypassed) ? 'D'
            : (int) g == cur ? 'A' : 'E', pg->nr_paths,
            selector_info_args[pg->ps]);
    else
      EMIT (" %s 0 %u %u", selector_name[pg->ps], pg->nr_paths,
            selector_table_args[pg->ps]);
    for (unsigned i = 0; i < pg->nr_paths; i++) {
      struct mpath_path *p = &m->paths[pg->first + i];

      EMIT (" %s", backend_name (p->be));
      if (type == STATUSTYPE_INFO) {
        EMIT (" %c %u", path_usable (p) ? 'A' : 'F',
              atomic_load (&p->fail_count));
        if (pg->ps == PS_QUEUE_LENGTH)
          EMIT (" %u", atomic_load (&p->inflight));
        else if (pg->ps == PS_SERVICE_TIME)
          EMIT (" %" PRIu64 " %u", atomic_load (&p->inflight_bytes),
                p->rel_tp);
      }
      else {
        EMIT (" %u", p->repeat_count);
        if (pg->ps == PS_SERVICE_TIME)
          EMIT (" %u", p->rel_tp);
      }
    }
  }
  return used;
}

/* --- messages ---------------------------------------------------------- */

static struct mpath_path *
find_path (struct mpath *m, const char *name)
{
  for (unsigned i = 0; i < m->nr_paths; i++)
    if (strcmp (m->paths[i].spec, name) == 0 ||
        strcmp (backend_name (m->paths[i].be), name) == 0)
      return &m->paths[i];
  return NULL;
}

static int
group_arg (struct mpath *m, const char *msg, const char *s, unsigned *g,
           struct mapper_err *err)
{
  uint64_t v;

  if (parse_u64 (s, &v) < 0 || v < 1 || v > m->nr_groups) {
    mapper_err_set (err, "%s: invalid priority group '%s' (1 to %u)", msg,
                    s, m->nr_groups);
    return -EINVAL;
  }
  *g = v - 1;
  return 0;
}

static int
mpath_message (struct target *ti, unsigned argc, char **argv, char *reply,
               size_t len, struct mapper_err *err)
{
  struct mpath *m = ti->private;
  struct mpath_path *p;
  unsigned g;

  if (argc == 0) {
    mapper_err_set (err, "missing message (fail_path, reinstate_path, "
                    "switch_group, disable_group, enable_group, "
                    "queue_if_no_path, fail_if_no_path)");
    return -EINVAL;
  }
  if (strcasecmp (argv[0], "queue_if_no_path") == 0 ||
      strcasecmp (argv[0], "fail_if_no_path") == 0) {
    bool q = strcasecmp (argv[0], "queue_if_no_path") == 0;

    if (argc != 1) {
      mapper_err_set (err, "%s takes no argument, got %u", argv[0],
                      argc - 1);
      return -EINVAL;
    }
    pthread_mutex_lock (&m->lock);
    if (m->no_path_retry >= 0)
      /* multipathd's queue mode: the message holds until a path comes
       * back after none was left (dm's flag, which multipathd sets again
       * from no_path_retry then), or a reload; no_path_retry stays the
       * table's, and what a restart does.
       */
      m->msg_queueing = q ? 1 : -1;
    else {
      m->queue_if_no_path = q;
      if (q)
        m->exhausted = false;
    }
    mpath_update_queueing (m);
    pthread_mutex_unlock (&m->lock);
    if (m->no_path_retry >= 0) {
      target_event (ti, "%s: %s when no path is left, until a path comes "
                    "back (then no_path_retry %ld)", argv[0],
                    q ? "queueing" : "failing I/O", m->no_path_retry);
      return 0;
    }
    target_event (ti, "%s", q ? "queue_if_no_path: queueing when no path "
                  "is left" : "fail_if_no_path: failing I/O when no path "
                  "is left");
    /* The table's features say so: saved where the table is kept. */
    return MESSAGE_TABLE_CHANGED;
  }
  if (strcasecmp (argv[0], "fail_path") != 0 &&
      strcasecmp (argv[0], "reinstate_path") != 0 &&
      strcasecmp (argv[0], "switch_group") != 0 &&
      strcasecmp (argv[0], "disable_group") != 0 &&
      strcasecmp (argv[0], "enable_group") != 0) {
    mapper_err_set (err, "unrecognised multipath message '%s'", argv[0]);
    return -EINVAL;
  }
  if (argc != 2) {
    mapper_err_set (err, "%s takes 1 argument, got %u", argv[0], argc - 1);
    return -EINVAL;
  }
  if (!atomic_load (&m->live)) {
    mapper_err_set (err, "%s: the device is suspended", argv[0]);
    return -EBUSY;
  }
  if (strcasecmp (argv[0], "fail_path") == 0 ||
      strcasecmp (argv[0], "reinstate_path") == 0) {
    if ((p = find_path (m, argv[1])) == NULL) {
      mapper_err_set (err, "%s: no path '%s' in this target", argv[0],
                      argv[1]);
      return -EINVAL;
    }
    if (strcasecmp (argv[0], "fail_path") == 0)
      mpath_fail_path (m, p, true, "fail_path message");
    else
      mpath_reinstate_path (m, p, false);
    return 0;
  }
  if (group_arg (m, argv[0], argv[1], &g, err) < 0)
    return -EINVAL;
  pthread_mutex_lock (&m->lock);
  if (strcasecmp (argv[0], "switch_group") == 0) {
    /* dm's switch_pg_num: every group enabled, g next. */
    for (unsigned i = 0; i < m->nr_groups; i++)
      atomic_store (&m->groups[i].bypassed, false);
    atomic_store (&m->next_pg, (int) g);
    atomic_store (&m->current_pg, -1);
  }
  else {
    bool off = strcasecmp (argv[0], "disable_group") == 0;
    atomic_store (&m->groups[g].bypassed, off);
    if (off && atomic_load (&m->current_pg) == (int) g)
      atomic_store (&m->current_pg, -1);
  }
  pthread_mutex_unlock (&m->lock);
  target_event (ti, "%s %u", argv[0], g + 1);
  return 0;
}

/* --- constructor -------------------------------------------------------- */

static void mpath_dtr (struct target *ti);

static const struct target_arg groups_arg = {
  "number of priority groups", NULL, 0, MPATH_MAX_GROUPS };
static const struct target_arg paths_arg = {
  "number of paths", NULL, 1, MPATH_MAX_PATHS };
static const struct target_arg npr_arg = {
  "no_path_retry", "checker intervals", 0, 1000000 };
static const struct target_arg timeout_arg = {
  "path_timeout_msecs", "milliseconds", 10, 3600000 };
static const struct target_arg checker_arg = {
  "checker_interval_msecs", "milliseconds", 10, 3600000 };
static const struct target_arg repeat_arg = {
  "repeat count", NULL, 1, 1000000 };
static const struct target_arg tp_arg = {
  "relative throughput", NULL, 0, 100 };

static int
parse_features (struct mpath *m, struct target_args *as,
                struct mapper_err *err)
{
  struct target_args fs;
  const char *arg;
  uint64_t v;

  if (target_read_group ("feature argument", 0, 9, false, as, &fs, err) < 0)
    return -EINVAL;
  while ((arg = target_shift_arg (&fs)) != NULL) {
    if (strcasecmp (arg, "queue_if_no_path") == 0)
      m->queue_if_no_path = true;
    else if (strcasecmp (arg, "no_path_retry") == 0) {
      if (target_read_arg (&npr_arg, &fs, &v, err) < 0)
        return -EINVAL;
      m->no_path_retry = v;
    }
    else if (strcasecmp (arg, "path_timeout_msecs") == 0) {
      if (target_read_arg (&timeout_arg, &fs, &v, err) < 0)
        return -EINVAL;
      m->path_timeout_ns = v * 1000000;
    }
    else if (strcasecmp (arg, "checker_interval_msecs") == 0) {
      if (target_read_arg (&checker_arg, &fs, &v, err) < 0)
        return -EINVAL;
      m->checker_ns = v * 1000000;
    }
    else if (strcasecmp (arg, "failback") == 0) {
      arg = target_shift_arg (&fs);
      if (arg && strcasecmp (arg, "immediate") == 0)
        m->failback_immediate = true;
      else if (arg == NULL || strcasecmp (arg, "manual") != 0) {
        mapper_err_set (err, "invalid failback '%s' (immediate or manual)",
                        arg ? arg : "");
        return -EINVAL;
      }
    }
    else if (strcasecmp (arg, "pg_init_retries") == 0 ||
             strcasecmp (arg, "pg_init_delay_msecs") == 0 ||
             strcasecmp (arg, "retain_attached_hw_handler") == 0) {
      mapper_err_set (err, "feature '%s' needs a hardware handler, and none "
                      "is supported", arg);
      return -EINVAL;
    }
    else {
      mapper_err_set (err, "unrecognised multipath feature '%s' (expected "
                      "queue_if_no_path, no_path_retry N, path_timeout_msecs "
                      "N, checker_interval_msecs N or failback "
                      "immediate|manual)", arg);
      return -EINVAL;
    }
  }
  /* multipathd: no_path_retry N queues for N checker intervals, 0 fails
   * at once (it overrides queue_if_no_path).
   */
  if (m->no_path_retry >= 0)
    m->queue_if_no_path = m->no_path_retry > 0;
  return 0;
}

static int
parse_selector (const char *s, enum mpath_selector *ps,
                struct mapper_err *err)
{
  for (unsigned i = 0; i < ARRAY_SIZE (selector_name); i++)
    if (strcmp (s, selector_name[i]) == 0) {
      *ps = i;
      return 0;
    }
  mapper_err_set (err, "unknown path selector '%s' (round-robin, "
                  "queue-length or service-time)", s);
  return -EINVAL;
}

/* Every path presents what the first one does: the same size and block
 * sizes, and writable alike (a read-only path beside writable ones
 * would make the whole device read-only, as the table merges it, or
 * fail the writes sent its way: refused, as dm cannot open such a path
 * for a writable table).  The other capabilities may differ: the device
 * presents their intersection (table_merge_caps: fast zero only if
 * every path has it), and FUA is native on a path that has it and
 * emulated with a flush of that path on one that has not (io_emit,
 * clone_retry), so a request means the same on whichever path it lands.
 */
static int
check_like_first (struct mpath *m, struct mpath_path *p,
                  struct mapper_err *err)
{
  const struct mapper_caps *a = backend_caps (m->paths[0].be);
  const struct mapper_caps *b = backend_caps (p->be);

  for (unsigned i = 0; i < p->nr; i++)
    if (m->paths[i].be == p->be) {
      mapper_err_set (err, "path %s is given twice", backend_name (p->be));
      return -EINVAL;
    }
  if (a->size != b->size) {
    mapper_err_set (err, "path %s: size %" PRIu64 " sectors differs from "
                    "path %s's (%" PRIu64 " sectors): every path must reach "
                    "the same storage", backend_name (p->be),
                    b->size >> MAPPER_SECTOR_SHIFT,
                    backend_name (m->paths[0].be),
                    a->size >> MAPPER_SECTOR_SHIFT);
    return -EINVAL;
  }
  if (a->can_write != b->can_write) {
    mapper_err_set (err, "path %s is %s, path %s is not: every path must "
                    "reach the same storage, writable alike",
                    backend_name (p->be), b->can_write ? "writable"
                    : "read-only", backend_name (m->paths[0].be));
    return -EINVAL;
  }
  if (a->block_min != b->block_min || a->block_pref != b->block_pref ||
      a->block_max != b->block_max) {
    mapper_err_set (err, "path %s: block sizes %" PRIu32 "/%" PRIu32 "/%"
                    PRIu32 " (minimum/preferred/maximum) differ from path "
                    "%s's (%" PRIu32 "/%" PRIu32 "/%" PRIu32 ")",
                    backend_name (p->be), b->block_min, b->block_pref,
                    b->block_max, backend_name (m->paths[0].be),
                    a->block_min, a->block_pref, a->block_max);
    return -EINVAL;
  }
  return 0;
}

static int
parse_group (struct mpath *m, struct mpath_group *pg, struct target_args *as,
             struct mapper_err *err)
{
  struct target_args sel;
  const char *s = target_shift_arg (as);
  uint64_t npaths, nargs, v;
  int r;

  if (s == NULL) {
    mapper_err_set (err, "missing path selector");
    return -EINVAL;
  }
  if (parse_selector (s, &pg->ps, err) < 0 ||
      target_read_group ("selector argument", 0, 0, false, as, &sel, err) < 0 ||
      target_read_arg (&paths_arg, as, &npaths, err) < 0)
    return -EINVAL;
  if (m->nr_paths + npaths > MPATH_MAX_PATHS) {
    mapper_err_set (err, "too many paths (at most %u in all groups)",
                    MPATH_MAX_PATHS);
    return -EINVAL;
  }
  {
    const struct target_arg nargs_arg = {
      "number of path arguments", NULL, 0, selector_table_args[pg->ps] };
    if (target_read_arg (&nargs_arg, as, &nargs, err) < 0)
      return -EINVAL;
  }
  if (as->argc < npaths * (1 + nargs)) {
    mapper_err_set (err, "%" PRIu64 " paths of %" PRIu64 " argument%s each "
                    "need %" PRIu64 " words, got %u", npaths, nargs,
                    nargs == 1 ? "" : "s", npaths * (1 + nargs), as->argc);
    return -EINVAL;
  }
  pg->first = m->nr_paths;
  for (unsigned i = 0; i < npaths; i++) {
    struct mpath_path *p = &m->paths[m->nr_paths];
    const char *spec = target_shift_arg (as);

    p->m = m;
    p->pg = pg;
    p->nr = m->nr_paths;
    p->repeat_count = 1;
    p->rel_tp = 1;
    if (nargs >= 1) {
      if (target_read_arg (&repeat_arg, as, &v, err) < 0)
        goto prefix;
      p->repeat_count = v;
    }
    if (nargs >= 2) {
      if (target_read_arg (&tp_arg, as, &v, err) < 0)
        goto prefix;
      p->rel_tp = v;
    }
    if ((p->spec = strdup (spec)) == NULL) {
      mapper_err_set (err, "out of memory");
      return -ENOMEM;
    }
    /* A path is the whole device: the target's sector s is the path's
     * sector s (target-relative, as linear <dev> 0).
     */
    r = target_get_path (m->ti, spec, 0, m->ti->len, &p->be, err);
    if (r < 0) {
      free (p->spec);
      p->spec = NULL;
      goto prefix_r;
    }
    m->nr_paths++;
    pg->nr_paths++;
    atomic_init (&p->active, true);
    pg->rr_cycle += p->repeat_count;
    p->rr_end = pg->rr_cycle;
    if (check_like_first (m, p, err) < 0)
      return -EINVAL;
    continue;
  prefix:
    r = -EINVAL;
  prefix_r:
    mapper_err_prefix (err, "path %u (%s)", i + 1, spec);
    return r;
  }
  return 0;
}

static int
mpath_ctr (struct target *ti, unsigned argc, char **argv,
           struct mapper_err *err)
{
  struct target_args as = { argc, argv }, hw;
  struct mpath *m;
  uint64_t ngroups, initial;
  const char *arg;
  int r;

  m = calloc (1, sizeof *m);
  if (m == NULL) {
    mapper_err_set (err, "out of memory");
    return -ENOMEM;
  }
  m->ti = ti;
  m->no_path_retry = -1;
  m->path_timeout_ns = MPATH_PATH_TIMEOUT_MS * 1000000ULL;
  m->checker_ns = MPATH_CHECKER_MS * 1000000ULL;
  atomic_init (&m->current_pg, -1);
  atomic_init (&m->next_pg, -1);
  pthread_mutex_init (&m->lock, NULL);
  pthread_cond_init (&m->cond, NULL);
  ti->private = m;

  if (argc == 0) {
    mapper_err_set (err, "expected <#features> [<feature>...] <#hw_handler_"
                    "args> <#groups> <initial_group> (<selector> ...)..., "
                    "got no arguments");
    goto einval;
  }
  if (parse_features (m, &as, err) < 0)
    goto einval;
  if (target_read_group ("hardware handler argument", 0, 1024, false, &as,
                         &hw, err) < 0)
    goto einval;
  if (hw.argc > 0) {
    mapper_err_set (err, "hardware handler '%s' is not supported (only 0: "
                    "none)", hw.argv[0]);
    goto einval;
  }
  if (target_read_arg (&groups_arg, &as, &ngroups, err) < 0)
    goto einval;
  {
    const struct target_arg initial_arg = {
      "initial priority group", NULL, ngroups ? 1 : 0, ngroups };
    if (target_read_arg (&initial_arg, &as, &initial, err) < 0)
      goto einval;
  }
  m->groups = calloc (ngroups ? ngroups : 1, sizeof *m->groups);
  m->paths = aligned_alloc (64, MPATH_MAX_PATHS * sizeof *m->paths);
  if (m->groups == NULL || m->paths == NULL) {
    mapper_err_set (err, "out of memory");
    r = -ENOMEM;
    goto fail;
  }
  memset (m->paths, 0, MPATH_MAX_PATHS * sizeof *m->paths);
  for (unsigned g = 0; g < ngroups; g++) {
    m->groups[g].nr = g + 1;
    m->nr_groups = g + 1;
    if ((r = parse_group (m, &m->groups[g], &as, err)) < 0) {
      mapper_err_prefix (err, "priority group %u", g + 1);
      goto fail;
    }
  }
  if ((arg = target_shift_arg (&as)) != NULL) {
    mapper_err_set (err, "too many arguments: '%s' after the last priority "
                    "group", arg);
    goto einval;
  }
  atomic_init (&m->nr_valid, m->nr_paths);
  atomic_init (&m->next_pg, (int) initial - 1);
  mpath_update_queueing (m);
  return 0;

 einval:
  r = -EINVAL;
 fail:
  mpath_dtr (ti);
  ti->private = NULL;
  return r;
}

static void
mpath_presuspend (struct target *ti)
{
  struct mpath *m = ti->private;

  /* dm (multipath_presuspend): queued I/O fails rather than holding the
   * suspend up, except in a noflush suspend (multipathd's reloads),
   * which keeps it queued across: it goes back to the device's gate
   * (wait_for_path: MAPPER_EREQUEUE) and is mapped again after the
   * resume, on the table then live.
   */
  pthread_mutex_lock (&m->lock);
  if (target_noflush_suspending (ti))
    m->noflush_suspending = true;
  else
    m->suspending = true;
  mpath_update_queueing (m);
  pthread_mutex_unlock (&m->lock);
}

/* The watchdog and the path checker must run before the table does:
 * a failure to start them refuses the resume (or the load, at
 * engine_start), rather than leave a device failing over nothing.
 */
static int
mpath_preresume (struct target *ti, struct mapper_err *err)
{
  return mpath_threads_ensure (err);
}

static void
mpath_resume (struct target *ti)
{
  struct mpath *m = ti->private;

  pthread_mutex_lock (&m->lock);
  m->suspending = false;
  m->noflush_suspending = false;
  mpath_update_queueing (m);
  pthread_mutex_unlock (&m->lock);
  atomic_store (&m->live, true);
  mpath_register (m);
}

static void
mpath_postsuspend (struct target *ti)
{
  struct mpath *m = ti->private;

  atomic_store (&m->live, false);
}

static void
mpath_dtr (struct target *ti)
{
  struct mpath *m = ti->private;

  if (m == NULL)
    return;
  mpath_unregister (m);
  if (m->paths)
    for (unsigned i = 0; i < m->nr_paths; i++)
      free (m->paths[i].spec);
  free (m->paths);
  free (m->groups);
  pthread_cond_destroy (&m->cond);
  pthread_mutex_destroy (&m->lock);
  free (m);
}

static int
mpath_iterate_backends (struct target *ti,
                        int (*fn) (struct target *, struct backend *, void *),
                        void *data)
{
  struct mpath *m = ti->private;
  int r;

  for (unsigned i = 0; i < m->nr_paths; i++)
    if ((r = fn (ti, m->paths[i].be, data)) != 0)
      return r;
  return 0;
}

const struct target_type multipath_target = {
  .name = "multipath",
  .version = { 1, 14, 0 },
  .ctr = mpath_ctr,
  .dtr = mpath_dtr,
  .map = mpath_map,
  .extents = mpath_extents,
  .status = mpath_status,
  .iterate_backends = mpath_iterate_backends,
  .flush = mpath_flush,
  .presuspend = mpath_presuspend,
  .preresume = mpath_preresume,
  .resume = mpath_resume,
  .postsuspend = mpath_postsuspend,
  .message = mpath_message,
  .start = mpath_threads_start,
  .stop = mpath_threads_stop,
  .paths = true,
};

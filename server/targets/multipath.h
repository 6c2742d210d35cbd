/* SPDX-License-Identifier: BSD-3-Clause */
/* The multipath target's private header: its state, shared by
 * multipath.c (the table, I/O, status, messages) and multipath-check.c
 * (the engine-wide watchdog and path checker threads, multipathd's part).
 */
#ifndef NBDMAPPER_MULTIPATH_H
#define NBDMAPPER_MULTIPATH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "target.h"
#include "util.h"

#define MPATH_MAX_GROUPS 64
#define MPATH_MAX_PATHS 64              /* over every group */
#define MPATH_PATH_TIMEOUT_MS 1000      /* defaults */
#define MPATH_CHECKER_MS 1000

enum mpath_selector { PS_ROUND_ROBIN, PS_QUEUE_LENGTH, PS_SERVICE_TIME };

struct mpath;
struct mpath_group;

/* One path: its own cache line or more, as every request touches its
 * counters.
 */
struct mpath_path {
  struct mpath *m;
  struct mpath_group *pg;
  struct backend *be;
  char *spec;                   /* as the table names it (messages) */
  unsigned nr;                  /* index in m->paths */
  unsigned repeat_count;        /* the selector's path arguments */
  unsigned rel_tp;              /* service-time's relative throughput */
  uint64_t rr_end;              /* round-robin: repeat counts up to it */

  _Atomic bool active;          /* 'A', else 'F' */
  _Atomic bool admin_failed;    /* by fail_path: the checker leaves it */
  _Atomic unsigned fail_count;
  _Atomic unsigned inflight;    /* clones issued and not completed */
  _Atomic uint64_t inflight_bytes;
  _Atomic uint64_t completions; /* clones completed: the watchdog's sign
                                 * of life (no clock read per request) */
  _Atomic uint64_t writes;      /* write-type clones completed on it */
  _Atomic uint64_t flushed;     /* writes covered by a successful flush */

  /* The watchdog's (multipath-check.c). */
  uint64_t busy_seen_ns;        /* first seen busy, 0: seen idle */
  uint64_t seen_completions;    /* completions when it last looked */
  uint64_t progress_ns;         /* when it saw them move, or busy_seen_ns */
  uint64_t abandoned_mark;      /* the last sign of life it gave up on */
  uint64_t kept_mark;           /* ...or logged as kept (the last path) */
  /* The checker's. */
  uint64_t next_check_ns;
} __attribute__ ((aligned (64)));

struct mpath_group {
  unsigned nr;                  /* 1-based, as messages and status say */
  enum mpath_selector ps;
  unsigned first, nr_paths;     /* m->paths[first, first + nr_paths) */
  uint64_t rr_cycle;            /* round-robin: sum of repeat counts */
  _Atomic uint64_t rr_ticket;
  _Atomic bool bypassed;        /* disable_group: 'D' */
};

struct mpath {
  struct target *ti;
  unsigned nr_groups, nr_paths;
  struct mpath_group *groups;
  struct mpath_path *paths;

  /* Read-only after ctr. */
  long no_path_retry;           /* checker intervals; -1: not given */
  uint64_t path_timeout_ns, checker_ns;
  bool failback_immediate;

  /* Written under lock, read without it by the fast path of
   * choose_path.
   */
  _Atomic int current_pg;       /* index, -1: none chosen */
  _Atomic int next_pg;          /* switch_group, initial group; -1: none */
  _Atomic unsigned nr_valid;    /* active paths */
  /* Queued I/O waits on cond.  lock protects the fields below and path
   * state changes (nr_valid); a leaf lock (server/README.md).
   */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool queue_if_no_path;        /* the feature, or messages; with
                                 * no_path_retry N: N > 0 */
  bool exhausted;               /* no_path_retry ran out (a path resets) */
  int msg_queueing;             /* with no_path_retry, the last message
                                 * until a path comes back: 1 queue, -1
                                 * fail, 0 none (no_path_retry rules) */
  bool suspending;              /* presuspend to resume: never queue */
  bool noflush_suspending;      /* ...a noflush one: I/O with no path
                                 * goes back to the gate (requeued) */
  _Atomic bool queueing;        /* queue now, if there is no path */
  uint64_t nopath_since_ns;     /* nr_valid fell to 0 then */

  /* Engine-wide lists (multipath-check.c's lock). */
  _Atomic bool live;            /* resumed, not postsuspended */
  bool registered;
  unsigned users;               /* threads working on it */
  struct mpath *next;
};

/* multipath.c: path state changes (each an event and a log line). */
void mpath_fail_path (struct mpath *m, struct mpath_path *p, bool admin,
                      const char *why);
void mpath_reinstate_path (struct mpath *m, struct mpath_path *p,
                           bool checker);
/* The watchdog's: mpath_fail_path, except that the last active path of
 * a device that would then fail I/O (not queueing) stays: false then.
 * Failing it could only turn its requests into EIO, and a silence shared
 * by every path (a slow flush on the storage behind them all, a stalled
 * host) is no reason to: they wait where they are, for remote-timeout at
 * most, as without a path timeout.
 */
bool mpath_fail_silent_path (struct mpath *m, struct mpath_path *p,
                             const char *why);
/* The accounting around a clone on p. */
void mpath_path_start (struct mpath_path *p, uint64_t len);
void mpath_path_end (struct mpath_path *p, uint64_t len);
/* A small read of p: 0 if it answered. */
int mpath_probe (struct mpath *m, struct mpath_path *p);
/* lock held: queue_if_no_path, no_path_retry and suspend, combined. */
void mpath_update_queueing (struct mpath *m);

/* multipath-check.c */
/* preresume: the threads running (if the engine runs), or -errno with
 * err filled.
 */
int mpath_threads_ensure (struct mapper_err *err);
void mpath_register (struct mpath *m);
void mpath_unregister (struct mpath *m);
int mpath_threads_start (struct mapper_err *err);
void mpath_threads_stop (void);

#endif /* NBDMAPPER_MULTIPATH_H */

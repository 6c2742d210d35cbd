/* SPDX-License-Identifier: BSD-3-Clause */
/* Flush bookkeeping: one flush per distinct backend, skipped when the
 * backend is clean, shared between concurrent flushes from any number of
 * connections, and never reported durable when it may not be.
 *
 * Per backend (struct backend_flush), write_gen moves past started_gen
 * (the value the last flush to start saw) when a write completes after
 * that start; further writes before the next start need not bump it
 * again.  A flush request that sees write_gen == T needs a backend
 * flush that *started* when write_gen was >= T to have finished
 * successfully:
 *   - flushed_gen >= T: clean, nothing to do;
 *   - a flush is running that began at running_gen >= T: join it;
 *   - a flush is running that began earlier: wait for it, then decide again;
 *   - otherwise start one.
 * A failed flush fails everyone who shared it, and the next flush once
 * more (after a failed fdatasync the kernel may have dropped the dirty
 * pages: a later flush succeeding says nothing about them).
 *
 * "The next flush" is per observer, as Linux's errseq_t did it (4.13) for
 * files: a failed flush, or a connection lost with writes not yet
 * flushed (backend_writes_lost), stamps the backend with a new number
 * from one clock.  Every observer (a client connection, through
 * device_flush_errseq) keeps the clock's value from when it last
 * flushed, or opened: its next flush fails with EIO once if any backend
 * it flushes carries a later stamp.  So every connection open at the
 * loss hears of it exactly once, and none opened later does.
 *
 * The counting is beside the backends, not in the request path:
 * clone_done (here), the completion every backend calls, bumps
 * write_gen and ends flushes before it hands the result to the
 * request (io_req_clone_end), which knows nothing of generations.
 */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

/* The error clock: the last stamp given out. */
static _Atomic uint64_t errseq_clock;

uint64_t
errseq_sample (void)
{
  return atomic_load (&errseq_clock);
}

/* A new error on be: everyone who sampled the clock before sees it. */
static void
errseq_raise (struct backend_flush *f)
{
  atomic_store (&f->err_seq, atomic_fetch_add (&errseq_clock, 1) + 1);
}

static void
errseq_max (_Atomic uint64_t *where, uint64_t v)
{
  uint64_t old = atomic_load (where);

  while (old < v && !atomic_compare_exchange_weak (where, &old, v))
    ;
}

uint64_t
backend_errseq (struct backend *be)
{
  uint64_t e = atomic_load (&be->flush.err_seq);

  /* A stacked device: the errors of what it stacks on. */
  if (be->ops->errseq)
    e = MAX (e, be->ops->errseq (be));
  return e;
}

void
errseq_note_dropped (_Atomic uint64_t *dev_err, struct backend *be)
{
  errseq_max (dev_err, backend_errseq (be));
}

void
errseq_seen (_Atomic uint64_t *seen, uint64_t sample)
{
  errseq_max (seen, sample);
}

void
backend_flush_init (struct backend *be)
{
  struct backend_flush *f = &be->flush;

  atomic_init (&f->write_gen, 0);
  atomic_init (&f->started_gen, 0);
  pthread_mutex_init (&f->lock, NULL);
  pthread_cond_init (&f->cond, NULL);
  f->running = false;
  f->running_gen = f->running_seq = f->done_seq = f->failed_seq = 0;
  f->flushed_gen = 0;
  atomic_init (&f->err_seq, 0);
  f->lost_seq = 0;
  f->nr_flushes = 0;
}

void
backend_flush_destroy (struct backend *be)
{
  pthread_cond_destroy (&be->flush.cond);
  pthread_mutex_destroy (&be->flush.lock);
}

void
backend_writes_lost (struct backend *be)
{
  struct backend_flush *f = &be->flush;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&f->lock);

  if (f->running || atomic_load (&f->write_gen) != f->flushed_gen)
    errseq_raise (f);
  /* The running flush may have been sent after the loss (retried on a
   * new connection): its success would say nothing about the lost writes.
   */
  if (f->running)
    f->lost_seq = f->running_seq;
}

/* A write-type clone completed on be (clone_done) and may have dirtied
 * it.
 */
void
flush_note_write (struct backend *be)
{
  struct backend_flush *f = &be->flush;

  /* One bump after each flush start is enough: write_gen then exceeds
   * what that flush covers, and the next flush request sees it.  A write
   * that reads the old started_gen completed before the new flush stored
   * it, so before that flush reached the backend: covered by it.
   */
  if (atomic_load (&f->write_gen) == atomic_load (&f->started_gen))
    atomic_fetch_add (&f->write_gen, 1);
}

/* Flush number seq of be completed (clone_done); its result. */
static int
flush_end (struct backend *be, uint64_t seq, int error)
{
  struct backend_flush *f = &be->flush;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&f->lock);

  assert (f->running && f->running_seq == seq);
  if (error == 0 && seq <= f->lost_seq)
    error = -EIO;
  f->running = false;
  f->done_seq = seq;
  if (error) {
    f->failed_seq = seq;
    errseq_raise (f);
  }
  else if (f->running_gen > f->flushed_gen)
    f->flushed_gen = f->running_gen;
  pthread_cond_broadcast (&f->cond);
  return error;
}

static bool
writes (enum io_op op)
{
  return op == IO_WRITE || op == IO_ZERO || op == IO_TRIM;
}

void
clone_done (struct clone *c, int error)
{
  int seen = error;             /* what the request sees */

  /* A target's hook (mirror, multipath) may send the clone again
   * elsewhere, or decide what the request sees; the bookkeeping below
   * still records what happened on this backend.
   */
  if (c->end_io) {
    struct backend *be = c->be;   /* clone_retry moves c */

    seen = c->end_io (c, c->end_io_ctx, c->end_io_arg, error);
    if (seen == CLONE_RETRY || seen == CLONE_REMAP) {
      /* The attempt here failed, and may have written part, as below:
       * be's next flush must not be skipped, wherever the clone goes
       * (its completion there is counted there).
       */
      if (writes (c->op) && error)
        flush_note_write (be);
      c->remap_due = seen == CLONE_REMAP;
      io_req_clone_retry (c);
      return;
    }
  }
  switch (c->op) {
  case IO_WRITE: case IO_ZERO: case IO_TRIM:
    /* A write the backend made durable itself (native FUA) dirties
     * nothing; a failed one may have written part, so it counts.
     */
    if (error || !(c->flags & MAPPER_FUA))
      flush_note_write (c->be);
    break;
  case IO_FLUSH:
    if (c->seq)                 /* one of ours (flush_decide) */
      seen = flush_end (c->be, c->seq, error);
    break;
  case IO_READ:
    break;
  }
  io_req_clone_end (c, seen);
}

enum flush_plan {
  PLAN_DECIDE,                  /* not decided yet */
  PLAN_DONE,                    /* clean, started by us, or failed */
  PLAN_JOIN,                    /* share the running flush seq */
  PLAN_WAIT,                    /* wait for seq, then decide again */
};

struct flush_slot {
  struct backend *be;
  void *owner;                  /* the end_io_ctx of a flush it starts */
  uint64_t target;              /* write_gen when the request came */
  uint64_t seq;
  enum flush_plan plan;
};

/* Decide what slot s needs; may add a flush clone to req. */
static int
flush_decide (struct flush_slot *s, struct io_req *req)
{
  struct backend_flush *f = &s->be->flush;
  struct clone *c;

  pthread_mutex_lock (&f->lock);
  if (f->flushed_gen >= s->target) {
    s->plan = PLAN_DONE;
  }
  else if (f->running) {
    s->seq = f->running_seq;
    s->plan = f->running_gen >= s->target ? PLAN_JOIN : PLAN_WAIT;
  }
  else {
    c = io_req_new_clone (req);
    if (c == NULL) {
      pthread_mutex_unlock (&f->lock);
      s->plan = PLAN_DONE;
      return -ENOMEM;
    }
    f->running = true;
    f->running_gen = atomic_load (&f->write_gen);
    atomic_store (&f->started_gen, f->running_gen);
    f->running_seq = f->done_seq + 1;
    f->nr_flushes++;
    *c = (struct clone) {
      .req = req, .be = s->be, .op = IO_FLUSH, .seq = f->running_seq,
      .end_io_ctx = s->owner,
    };
    /* Its result comes through req; joining our own flush also gives
     * this backend's own result (io_flush_backends_seen's errs).
     */
    s->seq = f->running_seq;
    s->plan = PLAN_JOIN;
  }
  pthread_mutex_unlock (&f->lock);
  return 0;
}

/* Wait until flush number s->seq has finished; its result. */
static int
flush_wait (struct flush_slot *s)
{
  struct backend_flush *f = &s->be->flush;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&f->lock);

  while (f->done_seq < s->seq)
    pthread_cond_wait (&f->cond, &f->lock);
  /* Conservative: a failure of this flush or a later one. */
  return f->failed_seq >= s->seq ? -EIO : 0;
}

int
io_flush_backends (struct backend *const *bes, size_t n)
{
  return io_flush_backends_seen (bes, n, NULL, UINT64_MAX);
}

static int flush_backends (struct backend *const *bes, size_t n, int *errs,
                           uint64_t seen, void *owner);

int
io_flush_backends_seen (struct backend *const *bes, size_t n, int *errs,
                        uint64_t seen)
{
  return flush_backends (bes, n, errs, seen, NULL);
}

int
io_flush_backend_owned (struct backend *be, void *owner)
{
  return flush_backends (&be, 1, NULL, UINT64_MAX, owner);
}

static int
flush_backends (struct backend *const *bes, size_t n, int *errs,
                uint64_t seen, void *owner)
{
  struct flush_slot inline_slots[IO_INLINE_CLONES];
  struct flush_slot *slots = inline_slots;
  bool again;
  size_t i;
  int r = 0, e;

  if (n > ARRAY_SIZE (inline_slots)) {
    slots = malloc (n * sizeof *slots);
    if (slots == NULL)
      return -ENOMEM;
  }
  for (i = 0; i < n; i++)
    slots[i] = (struct flush_slot) {
      .be = bes[i], .owner = owner,
      .target = atomic_load (&bes[i]->flush.write_gen),
      .plan = PLAN_DECIDE,
    };
  if (errs)
    for (i = 0; i < n; i++)
      errs[i] = 0;

  do {
    struct io_req req;

    /* Start what needs starting, all in parallel, then wait for ours and
     * for the ones we joined.
     */
    io_req_init (&req, IO_FLUSH, 0);
    for (i = 0; i < n; i++)
      if (slots[i].plan == PLAN_DECIDE &&
          (e = flush_decide (&slots[i], &req)) < 0) {
        if (r == 0)
          r = e;
        if (errs)
          errs[i] = e;
      }
    e = io_req_run (&req);
    if (e < 0 && r == 0)
      r = e;
    io_req_release (&req);

    again = false;
    for (i = 0; i < n; i++) {
      if (slots[i].plan == PLAN_JOIN) {
        if ((e = flush_wait (&slots[i])) < 0) {
          if (r == 0)
            r = e;
          if (errs)
            errs[i] = e;
        }
        slots[i].plan = PLAN_DONE;
      }
      else if (slots[i].plan == PLAN_WAIT) {
        flush_wait (&slots[i]);
        slots[i].plan = PLAN_DECIDE;
        again = true;
      }
    }
  } while (again);

  /* Errors the observer has not heard of (errseq, above): EIO once.
   * Looked at after the flushes, not before: a loss stamped while this
   * flush waited for an older one (PLAN_WAIT) or before it decided
   * leaves no trace in the flush it then starts on a new connection,
   * which succeeds, though writes acknowledged before this request may
   * be gone.  No flush lock is held here: a stacked device's errors
   * come from its own table, under its lock.
   */
  for (i = 0; seen != UINT64_MAX && i < n; i++) {
    e = backend_errseq (bes[i]) > seen ? -EIO : 0;
    if (e < 0 && r == 0)
      r = e;
    if (errs && e < 0 && errs[i] == 0)
      errs[i] = e;
  }

  if (slots != inline_slots)
    free (slots);
  return r;
}

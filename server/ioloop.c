/* SPDX-License-Identifier: BSD-3-Clause */
/* The I/O loop: one thread running a libev loop that owns every remote
 * connection.  Workers hand it clones through a lock-free queue and an
 * ev_async (a whole split request is one batch and one wake-up: the
 * loop registers itself on the submitting thread's plug, plug.c); other
 * threads run short jobs in it (extents queries, closing a backend,
 * status).  Nothing here knows NBD: backends with an ops->start are
 * called in the loop thread for each clone queued to them, and add their
 * own watchers to the loop (ioloop_ev).
 *
 * The thread starts in engine_start (nbdkit's .after_fork: threads do not
 * survive fork) or, for users of the engine that never call it (the unit
 * tests), lazily at the first remote request.  engine_stop ends it when
 * nothing is in flight.
 */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>

#include <ev.h>

#include "internal.h"

/* Protects starting and stopping: loop, thread, generation.  Held by
 * ioloop_call while a job runs inline (no loop), so the loop cannot
 * start under it.  The loop thread never takes it.
 */
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ev_loop *loop;
static pthread_t thread;
static _Atomic bool running;           /* loop thread started, not stopped */
static _Atomic unsigned generation;    /* bumped at each start */
static _Atomic bool stopping;
static ev_async wake;

/* Submitted clones: a lock-free stack, newest first (the per-request
 * path takes no global lock).  Producers push with a compare-and-swap;
 * the loop takes the whole stack with one exchange and reverses it, so
 * there is no ABA problem and clones start in submission order.
 */
static _Atomic (struct clone *) queue_head;

/* Jobs (control path, rare) keep a mutex-protected FIFO. */
static pthread_mutex_t jobs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ioloop_job *jobs_head, **jobs_tail = &jobs_head;

static __thread bool in_loop;   /* this is the loop thread */
/* While this thread is plugged (plug.c): its clones, newest first,
 * pushed as one chain by batch_unplug.  batch_newest is NULL while
 * batch_cb is not registered on the plug.
 */
static __thread struct clone *batch_newest, *batch_oldest;
static void batch_unplug (struct io_plug_cb *cb);
static __thread struct io_plug_cb batch_cb = { .unplug = batch_unplug };

struct ev_loop *
ioloop_ev (void)
{
  assert (in_loop);
  return loop;
}

unsigned
ioloop_generation (void)
{
  return atomic_load (&generation);
}

bool
ioloop_in_loop_thread (void)
{
  return in_loop;
}

/* Take every queued clone, oldest first. */
static struct clone *
take_clones (void)
{
  struct clone *c = atomic_exchange (&queue_head, NULL), *fifo = NULL, *next;

  for (; c; c = next) {
    next = c->qnext;
    c->qnext = fifo;
    fifo = c;
  }
  return fifo;
}

static struct ioloop_job *
take_jobs (void)
{
  struct ioloop_job *j;

  pthread_mutex_lock (&jobs_lock);
  j = jobs_head;
  jobs_head = NULL;
  jobs_tail = &jobs_head;
  pthread_mutex_unlock (&jobs_lock);
  return j;
}

/* Fail everything queued (the loop could not start, or has stopped). */
static void
fail_queued (int error)
{
  struct clone *c = take_clones (), *next_c;
  struct ioloop_job *j = take_jobs (), *next_j;

  for (; c; c = next_c) {
    next_c = c->qnext;
    clone_done (c, error);
  }
  for (; j; j = next_j) {
    next_j = j->next;
    j->fn (j, error);
  }
}

static void
on_wake (struct ev_loop *l, ev_async *w, int revents)
{
  struct clone *c, *next_c;
  struct ioloop_job *j, *next_j;

  if (atomic_load (&stopping)) {
    ev_break (l, EVBREAK_ALL);
    return;
  }
  j = take_jobs ();
  c = take_clones ();

  for (; j; j = next_j) {
    next_j = j->next;           /* fn may free j */
    j->fn (j, 0);
  }
  for (; c; c = next_c) {
    next_c = c->qnext;          /* start may complete c at once */
    c->be->ops->start (c->be, c);
  }
}

static void *
loop_thread (void *arg)
{
  in_loop = true;
  ev_run (loop, 0);
  return NULL;
}

int
ioloop_start (struct mapper_err *err)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&state_lock);
  int r;

  if (atomic_load (&running))
    return 0;
  loop = ev_loop_new (EVFLAG_NOSIGMASK);
  if (loop == NULL) {
    mapper_err_set (err, "I/O loop: ev_loop_new failed");
    return -ENOMEM;
  }
  atomic_store (&stopping, false);
  ev_async_init (&wake, on_wake);
  ev_async_start (loop, &wake);
  atomic_fetch_add (&generation, 1);

  r = mapper_thread_create (&thread, loop_thread, "mapper-ioloop");
  if (r != 0) {
    mapper_err_set (err, "I/O loop: pthread_create: %s", mapper_strerror (r));
    ev_loop_destroy (loop);
    loop = NULL;
    return -r;
  }
  atomic_store (&running, true);
  if (mapper_debug)
    mapper_debug ("I/O loop started");
  return 0;
}

void
ioloop_stop (void)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&state_lock);

  if (!atomic_load (&running))
    return;
  atomic_store (&stopping, true);
  ev_async_send (loop, &wake);
  pthread_join (thread, NULL);
  atomic_store (&running, false);
  ev_loop_destroy (loop);
  loop = NULL;
  if (mapper_debug)
    mapper_debug ("I/O loop stopped");
  /* Callers stop the engine when it is idle: nothing should be left. */
  fail_queued (-ESHUTDOWN);
}

/* Wake the loop for what this thread queued; start it if need be. */
static void
kick (void)
{
  struct mapper_err err;

  if (!atomic_load (&running) && ioloop_start (&err) < 0) {
    if (mapper_debug)
      mapper_debug ("%s", err.msg);
    fail_queued (-EIO);
    return;
  }
  ev_async_send (loop, &wake);
}

/* Push the chain newest .. oldest (linked by qnext) onto the stack. */
static void
push_clones (struct clone *newest, struct clone *oldest)
{
  struct clone *head = atomic_load_explicit (&queue_head,
                                             memory_order_relaxed);

  do
    oldest->qnext = head;
  while (!atomic_compare_exchange_weak_explicit (&queue_head, &head, newest,
                                                 memory_order_release,
                                                 memory_order_relaxed));
}

void
ioloop_submit (struct backend *be, struct clone *c)
{
  /* Not plugged: at once.  Plugged: the first clone registers the batch
   * on the plug, the next ones join it.
   */
  if (batch_newest == NULL && !io_plug_add_cb (&batch_cb)) {
    push_clones (c, c);
    kick ();
    return;
  }
  c->qnext = batch_newest;
  batch_newest = c;
  if (batch_oldest == NULL)
    batch_oldest = c;
}

/* The plug is finishing: this thread's batch, one push, one wake-up. */
static void
batch_unplug (struct io_plug_cb *cb)
{
  push_clones (batch_newest, batch_oldest);
  batch_newest = batch_oldest = NULL;
  kick ();
}

static void
append_job (struct ioloop_job *job)
{
  job->next = NULL;
  pthread_mutex_lock (&jobs_lock);
  *jobs_tail = job;
  jobs_tail = &job->next;
  pthread_mutex_unlock (&jobs_lock);
}

void
ioloop_queue_job (struct ioloop_job *job)
{
  append_job (job);
  kick ();
}

bool
ioloop_post (struct ioloop_job *job, unsigned gen)
{
  /* Under state_lock the loop can neither stop (its queue failed by
   * ioloop_stop, which also holds it) nor start anew.
   */
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&state_lock);

  if (!atomic_load (&running) || atomic_load (&generation) != gen)
    return false;
  append_job (job);
  ev_async_send (loop, &wake);
  return true;
}

/* ioloop_call: fn(arg) in the loop thread, waiting for it. */
struct call_job {
  struct ioloop_job job;
  void (*fn) (void *arg);
  void *arg;
  sem_t done;
};

static void
call_job_run (struct ioloop_job *job, int error)
{
  struct call_job *cj = (struct call_job *) job;

  cj->fn (cj->arg);       /* also when cancelled: the caller owns it all */
  sem_post (&cj->done);
}

void
ioloop_call (void (*fn) (void *arg), void *arg)
{
  struct call_job cj = { .job.fn = call_job_run, .fn = fn, .arg = arg };

  if (in_loop) {
    fn (arg);
    return;
  }
  pthread_mutex_lock (&state_lock);
  if (!atomic_load (&running)) {
    /* No loop: the caller owns the connections for the moment. */
    fn (arg);
    pthread_mutex_unlock (&state_lock);
    return;
  }
  sem_init (&cj.done, 0, 0);
  ioloop_queue_job (&cj.job);
  while (sem_wait (&cj.done) == -1 && errno == EINTR)
    ;
  sem_destroy (&cj.done);
  pthread_mutex_unlock (&state_lock);
}

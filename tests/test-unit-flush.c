/* Flush bookkeeping (server/flush.c) against a backend whose flushes we
 * count and fail on demand: clean backends are not flushed, concurrent
 * flushes share one backend flush, failures poison the next flush once,
 * and a lost connection with unflushed writes fails the next flush.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "unit.h"

static _Atomic int nr_flushes;
static _Atomic int fail_next;           /* next backend flush fails EIO */
static _Atomic int slow;                /* complete flushes from a thread */

static void *
late_completion (void *arg)
{
  struct clone *c = arg;
  int err = atomic_exchange (&fail_next, 0) ? -EIO : 0;

  usleep (50000);
  clone_done (c, err);
  return NULL;
}

static void
test_submit (struct backend *be, struct clone *c)
{
  CHECK (c->op == IO_FLUSH);
  atomic_fetch_add (&nr_flushes, 1);
  if (atomic_load (&slow)) {
    pthread_t t;
    pthread_create (&t, NULL, late_completion, c);
    pthread_detach (t);
    return;
  }
  clone_done (c, atomic_exchange (&fail_next, 0) ? -EIO : 0);
}

static const struct backend_ops test_ops = {
  .kind = "test", .submit = test_submit,
};

static void
write_done (struct backend *be)
{
  struct clone c = { .be = be, .op = IO_WRITE };
  flush_note_write (&c);
}

static int
flush1 (struct backend *be)
{
  struct backend *bes[1] = { be };
  return io_flush_backends (bes, 1);
}

static struct backend *shared_be;
static _Atomic int thread_errors;

static void *
flusher (void *arg)
{
  if (flush1 (shared_be) != 0)
    atomic_fetch_add (&thread_errors, 1);
  return NULL;
}

int
main (void)
{
  struct backend be = { .ops = &test_ops, .name = "test" };
  struct backend be2 = { .ops = &test_ops, .name = "test2" };
  struct backend *both[2] = { &be, &be2 };
  pthread_t th[8];

  backend_flush_init (&be);
  backend_flush_init (&be2);

  /* Clean: nothing to flush. */
  CHECK (flush1 (&be) == 0 && nr_flushes == 0);
  write_done (&be);
  CHECK (flush1 (&be) == 0 && nr_flushes == 1);
  CHECK (flush1 (&be) == 0 && nr_flushes == 1);

  /* Only the dirty one of two. */
  write_done (&be2);
  CHECK (io_flush_backends (both, 2) == 0 && nr_flushes == 2);
  write_done (&be);
  write_done (&be2);
  CHECK (io_flush_backends (both, 2) == 0 && nr_flushes == 4);

  /* A failed flush fails, and fails the next one once, even when that
   * one would otherwise find nothing new to flush.
   */
  write_done (&be);
  fail_next = 1;
  CHECK (flush1 (&be) == -EIO);
  CHECK (flush1 (&be) == -EIO);
  CHECK (flush1 (&be) == 0);    /* retried for real: still dirty */
  CHECK (nr_flushes == 6);
  CHECK (flush1 (&be) == 0 && nr_flushes == 6);

  /* Lost connection: with unflushed writes the next flush fails once;
   * with none, nothing happens.
   */
  backend_writes_lost (&be);
  CHECK (flush1 (&be) == 0);
  write_done (&be);
  backend_writes_lost (&be);
  CHECK (flush1 (&be) == -EIO);
  CHECK (flush1 (&be) == 0);

  /* Eight concurrent flushes after one write share the backend flush. */
  slow = 1;
  shared_be = &be;
  write_done (&be);
  nr_flushes = 0;
  for (int i = 0; i < 8; i++)
    pthread_create (&th[i], NULL, flusher, NULL);
  for (int i = 0; i < 8; i++)
    pthread_join (th[i], NULL);
  CHECK (thread_errors == 0);
  CHECK (nr_flushes == 1);

  /* A write completing while a flush runs needs a new flush: a flush
   * that started before it does not cover it.
   */
  nr_flushes = 0;
  write_done (&be);
  {
    pthread_t t;
    pthread_create (&t, NULL, flusher, NULL);
    usleep (10000);             /* let that flush start */
    write_done (&be);
    CHECK (flush1 (&be) == 0);  /* waits, then flushes again */
    pthread_join (t, NULL);
  }
  CHECK (nr_flushes == 2);

  /* A concurrent flush that fails fails everyone who shared it. */
  nr_flushes = 0;
  thread_errors = 0;
  write_done (&be);
  fail_next = 1;
  for (int i = 0; i < 4; i++)
    pthread_create (&th[i], NULL, flusher, NULL);
  for (int i = 0; i < 4; i++)
    pthread_join (th[i], NULL);
  CHECK (nr_flushes >= 1);
  CHECK (thread_errors >= 1);

  backend_flush_destroy (&be);
  backend_flush_destroy (&be2);
  UNIT_EXIT ();
}

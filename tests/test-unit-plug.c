/* SPDX-License-Identifier: BSD-3-Clause */
/* Plugging (server/plug.c) and the I/O loop's batching through it: a
 * callback registered on a thread's plug runs when the plug finishes
 * (every callback at every finish, nested or not), and the clones a
 * request hands the I/O loop stay with the submitting thread until
 * io_req_run unplugs, then go to the loop together.
 */
#include <config.h>

#include <stdatomic.h>

#include "internal.h"
#include "unit.h"

/* --- the plug itself --------------------------------------------- */

struct counted_cb {
  struct io_plug_cb cb;
  int ran;
};

static void
count_unplug (struct io_plug_cb *cb)
{
  ((struct counted_cb *) cb)->ran++;
}

static void
test_plug (void)
{
  struct counted_cb a = { .cb.unplug = count_unplug };
  struct counted_cb b = { .cb.unplug = count_unplug };

  /* Not plugged: nothing to register on, the caller sends at once. */
  CHECK (!io_plug_add_cb (&a.cb));
  CHECK_EQ (a.ran, 0);

  io_plug_start ();
  CHECK (io_plug_add_cb (&a.cb));
  CHECK_EQ (a.ran, 0);                  /* held until the finish */
  io_plug_start ();                     /* nested */
  CHECK (io_plug_add_cb (&b.cb));
  io_plug_finish ();
  /* The inner finish runs the outer's callback too: its caller goes on
   * to wait for what may be in the outer's batch.
   */
  CHECK_EQ (a.ran, 1);
  CHECK_EQ (b.ran, 1);
  CHECK (io_plug_add_cb (&a.cb));       /* the outer is still on */
  io_plug_finish ();
  CHECK_EQ (a.ran, 2);
  CHECK_EQ (b.ran, 1);
  CHECK (!io_plug_add_cb (&a.cb));
}

/* --- the I/O loop's batch ---------------------------------------- */

enum { NR_CLONES = 8 };
static _Atomic int nr_started;
static int nr_submitted;
static int started_before_unplug = -1;

static void
nothing (void *arg)
{
}

/* In the loop thread. */
static void
loop_start (struct backend *be, struct clone *c)
{
  atomic_fetch_add (&nr_started, 1);
  clone_done (c, 0);
}

static void
loop_submit (struct backend *be, struct clone *c)
{
  ioloop_submit (be, c);
  if (++nr_submitted < NR_CLONES)
    return;
  /* Every clone is submitted, io_req_run has not unplugged yet.  Two
   * jobs through the loop, one after the other: a clone the loop had
   * been handed by now would have started before the second job ran
   * (the loop runs a wake-up's jobs, then its clones, before it takes
   * the next wake-up's jobs).
   */
  ioloop_call (nothing, NULL);
  ioloop_call (nothing, NULL);
  started_before_unplug = atomic_load (&nr_started);
}

static const struct backend_ops loop_ops = {
  .kind = "test-loop", .submit = loop_submit, .start = loop_start,
};

static void
test_batch (void)
{
  struct backend be = { .ops = &loop_ops, .name = "test-loop" };
  static char buf[NR_CLONES * 512];
  struct mapper_err err;
  struct io_req req;

  backend_flush_init (&be);
  CHECK_EQ (ioloop_start (&err), 0);
  io_req_init (&req, IO_READ, 0);
  /* Apart on the backend, so that io_emit does not merge them. */
  for (size_t i = 0; i < NR_CLONES; i++)
    CHECK_EQ (io_emit (&req, &be, i * 4096, 512, buf + i * 512), 0);
  CHECK_EQ (req.nr, NR_CLONES);
  CHECK_EQ (io_req_run (&req), 0);
  io_req_release (&req);
  CHECK_EQ (nr_submitted, NR_CLONES);
  CHECKF (started_before_unplug == 0,
          "%d clone(s) reached the loop before the plug finished",
          started_before_unplug);
  CHECK_EQ (atomic_load (&nr_started), NR_CLONES);
  ioloop_stop ();
  backend_flush_destroy (&be);
}

int
main (void)
{
  test_plug ();
  test_batch ();
  UNIT_EXIT ();
}

/* SPDX-License-Identifier: BSD-3-Clause */
/* Plugging, the block layer's blk_start_plug/blk_finish_plug idea: while
 * a thread issues the clones of a request, whoever can send them more
 * cheaply together holds them back and registers a callback on the
 * thread's plug; finishing the plug runs the callbacks, and each sends
 * what it held as one batch.  The I/O loop (ioloop.c) does so: a split
 * request reaches it as one queue push and one wake-up.  The request
 * core (io.c) only plugs and unplugs, and names no one who batches.
 *
 * Per thread, without a lock or an allocation: a plug is a depth count
 * and a list of callbacks, each a struct of the registrant's own.
 */
#include <config.h>

#include <assert.h>
#include <stddef.h>

#include "internal.h"

static __thread unsigned plug_depth;
static __thread struct io_plug_cb *plug_cbs;

void
io_plug_start (void)
{
  plug_depth++;
}

void
io_plug_finish (void)
{
  struct io_plug_cb *cb;

  assert (plug_depth > 0);
  plug_depth--;
  /* Every callback, even when an outer plug is still on: the caller
   * goes on to wait for its clones, which may be in a batch that began
   * under the outer plug.
   */
  while ((cb = plug_cbs) != NULL) {
    plug_cbs = cb->next;
    cb->unplug (cb);
  }
}

bool
io_plug_add_cb (struct io_plug_cb *cb)
{
  if (plug_depth == 0)
    return false;
  cb->next = plug_cbs;
  plug_cbs = cb;
  return true;
}

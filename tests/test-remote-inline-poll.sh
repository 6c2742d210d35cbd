#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test-remote-inline.sh with its inline requests polling for their
# replies (remote-poll-max-us=100000, the adaptive window opening after
# the first reply): every fault case again, met while the worker polls
# or once it sleeps, and replies are polled for (the status's count).
INLINE_POLL_US=100000 exec bash "${top_srcdir:-$(dirname "$0")/..}/tests/test-remote-inline.sh"

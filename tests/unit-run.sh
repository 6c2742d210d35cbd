#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# How automake runs a C unit test (LOG_COMPILER in tests/Makefile.am):
# inside the shell tests' harness, so that what the test leaves running
# (an nbdkit it started: its pid file and socket are in unit.h's scratch
# directory, here under $tmpdir) fails it as it would a shell test.
# (automake runs the shell tests through it too: they have their own.)
case "$1" in *.sh) exec "$@" ;; esac
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

rc=0
TMPDIR=$tmpdir "$@" || rc=$?
exit "$rc"

#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# How automake runs every test (LOG_COMPILER in tests/Makefile.am,
# client-tools/nbdmsetup/Makefile.am and systemd/Makefile.am): unit-run.sh
# TEST [ARGS...].  The test runs inside the shell tests' harness, with
# a C test's TMPDIR in this scratch directory ($tmpdir): what it leaves
# running (an nbdkit it started, whose pid file and socket are in
# unit.h's scratch directory) fails it, as functions.sh's leak check
# fails a shell test.
#
# A per-test time limit: a hung test fails on its own rather than running
# until scripts/test's whole-suite timeout.  The limit is, first found:
#   NBDMAPPER_TEST_TIMEOUT=SECS   the environment (0: no limit)
#   a line "# test-timeout: SECS" in the header of a test that is a
#   script (the comment lines it starts with)
#   600 s
# At the limit the test fails: unit-run.sh names what was still running
# (_scan), sends SIGTERM to the test's process group and every
# descendant (a shell test's trap then runs its cleanups and its own leak
# check), and after NBDMAPPER_TEST_KILL_GRACE s (default 30: a test's
# cleanups may wait 10 s for each server) sends SIGKILL to whatever of the
# test is left (_scan again: its daemonised servers too), naming it.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

_limit=${NBDMAPPER_TEST_TIMEOUT:-}
if [ -z "$_limit" ] && [ -f "$1" ] && [ "$(head -c 2 "$1")" = '#!' ]; then
    # In its first comment block (its header), not in what it writes.
    _limit=$(awk '!/^#/ { exit } sub(/^# test-timeout: /, "") { print; exit }' "$1")
fi
: "${_limit:=600}"
_grace=${NBDMAPPER_TEST_KILL_GRACE:-30}
[[ $_limit =~ ^[0-9]+$ ]] && [[ $_grace =~ ^[0-9]+$ ]] ||
    die "unit-run.sh: NBDMAPPER_TEST_TIMEOUT ($_limit) and" \
        "NBDMAPPER_TEST_KILL_GRACE ($_grace) are whole seconds"

# A C test's scratch directory is made in $tmpdir (unit.h, under
# TMPDIR); a shell test's where it always is (its paths, as long as
# ever), and functions.sh notes it in NBDMAPPER_SCRATCH_LOG, for
# _scan after a timeout.
export NBDMAPPER_SCRATCH_LOG=$tmpdir/scratch-dirs
: > "$NBDMAPPER_SCRATCH_LOG"
rc=0
# The test in a process group of its own (job control for this one
# start: its pgid is its pid), so that SIGTERM reaches what it runs in
# the foreground too.  make's SIGINT or SIGTERM (a terminal's ^C, a
# timeout around make) goes on to it.
set -m
case "$1" in
    *.sh) "$@" & ;;
    *) TMPDIR=$tmpdir "$@" & ;;
esac
_test=$!
set +m
trap 'kill -INT -- -$_test 2>/dev/null || :' INT
trap 'kill -TERM -- -$_test 2>/dev/null || :' TERM
trap 'kill -HUP -- -$_test 2>/dev/null || :' HUP
_timer=
if [ "$_limit" -gt 0 ]; then
    sleep "$_limit" &
    _timer=$!
fi

# _descendants PID: PID's descendants, in _desc.
_descendants ()
{
    local todo=("$1") p f kids
    _desc=()
    while [ "${#todo[@]}" -gt 0 ]; do
        p=${todo[-1]}; unset 'todo[-1]'
        for f in /proc/"$p"/task/*/children; do
            kids=()
            read -ra kids 2>/dev/null < "$f" || :
            _desc+=(${kids[@]+"${kids[@]}"})
            todo+=(${kids[@]+"${kids[@]}"})
        done
    done
}
# _name_procs WHAT: one line for each of _procs ("PID WHY"), after WHAT.
_name_procs ()
{
    local p args
    for p in ${_procs[@]+"${_procs[@]}"}; do
        [ "${p%% *}" != "$_timer" ] || continue
        args=()
        mapfile -d '' args 2>/dev/null < "/proc/${p%% *}/cmdline" || :
        echo "$0: $1: pid ${p%% *} (${p#* }): ${args[*]-}" >&2
    done
}

# _scan: _test_procs for $tmpdir and every scratch directory the test
# made (NBDMAPPER_SCRATCH_LOG): its processes, daemonised servers too.
_scan ()
{
    local own=$tmpdir d p
    local -A seen=()
    local all=()
    _test_procs
    all=(${_procs[@]+"${_procs[@]}"})
    while read -r d; do
        [ -n "$d" ] || continue
        tmpdir=$d
        _test_procs
        all+=(${_procs[@]+"${_procs[@]}"})
    done < "$NBDMAPPER_SCRATCH_LOG"
    tmpdir=$own
    _procs=()
    for p in ${all[@]+"${all[@]}"}; do
        [ -z "${seen[${p%% *}]:-}" ] || continue
        seen[${p%% *}]=1
        _procs+=("$p")
    done
}

# _starttime PID: its start time (/proc/PID/stat's 22nd field), in _st:
# the same pid with another start time is another process.
_starttime ()
{
    local st f
    _st=
    read -r st 2>/dev/null < "/proc/$1/stat" || return 1
    read -ra f <<< "${st##*) }"
    _st=${f[19]}
}

while :; do
    _done=
    wait -n -p _done "$_test" ${_timer:+"$_timer"} && rc=0 || rc=$?
    # Interrupted by a trap (a signal passed on): wait again.
    [ -n "$_done" ] || continue
    if [ "$_done" = "$_test" ]; then
        [ -z "$_timer" ] || { kill "$_timer" 2>/dev/null || :; wait "$_timer" || :; }
        break
    fi
    # The limit.
    echo "$0: FAIL: $*: timed out after $_limit s" \
         "(NBDMAPPER_TEST_TIMEOUT, or the test's \"# test-timeout:\")." \
         "Still running:" >&2
    _scan
    _name_procs "still running at the timeout"
    # What is the test's now, to look at again after the grace: a
    # descendant whose parent exits meanwhile is no longer one.
    _first=()
    for p in ${_procs[@]+"${_procs[@]}"}; do
        ! _starttime "${p%% *}" || _first+=("${p%% *} $_st ${p#* }")
    done
    _descendants "$$"
    kill -TERM -- "-$_test" 2>/dev/null || :
    for p in ${_desc[@]+"${_desc[@]}"}; do kill -TERM "$p" 2>/dev/null || :; done
    # The test's end (its cleanups done), or the grace.
    for (( i = 0; i < _grace * 10; i++ )); do
        _running "$_test" || break
        sleep 0.1
    done
    _scan
    for p in ${_first[@]+"${_first[@]}"}; do
        read -r pid st why <<< "$p"
        _starttime "$pid" && [ "$_st" = "$st" ] || continue
        [[ " ${_procs[*]-} " == *" $pid "* ]] || _procs+=("$pid $why")
    done
    _await_gone 0 || {
        _name_procs "did not exit within $_grace s of SIGTERM (the timeout): killed with SIGKILL"
        for p in "${_procs[@]}"; do kill -KILL "${p%% *}" 2>/dev/null || :; done
    }
    wait "$_test" 2>/dev/null || :
    rc=1
    break
done
trap - INT TERM HUP
# A test that timed out or was killed by a signal: functions.sh's leak
# check, at exit, says what of it is still running.
[ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] || exit "$rc"
[ "$rc" -lt 128 ] || echo "$0: FAIL: $*: killed by signal $((rc - 128))" >&2
exit "$rc"

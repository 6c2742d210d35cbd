# Sourced by the nbdmsetup tests: tests/functions.sh plus a daemonised
# server on a Unix socket and helpers to run nbdmsetup.
: "${top_srcdir:=$(cd "$(dirname "$0")/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
source "$top_srcdir/tests/functions.sh"
: "${NBDMSETUP:=$top_builddir/client-tools/nbdmsetup/nbdmsetup}"
export NBDMSETUP

requires nbdkit --version
requires test -x "$NBDMSETUP"

sock=$tmpdir/sock
export NBDMSETUP_URI="nbd+unix:///control?socket=$sock"
unset NBDMSETUP_KEY

# start_server ARGS...: nbdkit mapper in the background on $sock.
start_server ()
{
    rm -f "$tmpdir/pid"
    mapper -U "$sock" -P "$tmpdir/pid" "$@"
    cleanup_fn "stop_server"
}
# stop_server: 1 (and a failed test) if it had to be killed, in any
# context ("stop_server || die" too).
stop_server ()
{
    local rc=0
    # It holds the socket and the table files.
    stop_pidfile "$tmpdir/pid" || rc=$?
    rm -f "$sock"
    return $rc
}

ms () { "$NBDMSETUP" "$@"; }

# fails PATTERN CMD...: CMD must exit 1 with a "nbdmsetup: " message
# matching PATTERN (grep -E).
fails ()
{
    local pat=$1 rc=0
    shift
    "$@" > "$tmpdir/fails.out" 2> "$tmpdir/fails.err" || rc=$?
    [ "$rc" -eq 1 ] || { cat "$tmpdir/fails.err"; die "$*: exit $rc, expected 1"; }
    grep -q '^nbdmsetup: ' "$tmpdir/fails.err" ||
        die "$*: no 'nbdmsetup:' message: $(cat "$tmpdir/fails.err")"
    grep -Eq -- "$pat" "$tmpdir/fails.err" ||
        die "$*: message '$(cat "$tmpdir/fails.err")' does not match /$pat/"
    echo "refused as expected: $(cat "$tmpdir/fails.err")"
}

# mapper_timeout SECS NBDKIT-ARGS...: nbdkit (ASan-aware, like mapper) under
# timeout, for servers expected to refuse to start, so that one that hangs
# instead of exiting ends the test rather than stalling it.  A server that
# had to be killed fails the test (exit 124 or 137, as from timeout; the
# test exits 1 even if the caller takes any failure for a refusal).  Put
# the plugin ("$PLUGIN") yourself after the options.
mapper_timeout ()
{
    local secs=$1 rc=0
    shift
    if [ -n "$SANITIZER_LIBASAN" ]; then
        timeout -k 5 "$secs" env LD_PRELOAD="$SANITIZER_LIBASAN" \
            ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0:exitcode=99}" \
            nbdkit "$@" || rc=$?
    else
        timeout -k 5 "$secs" nbdkit "$@" || rc=$?
    fi
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "$0: FAIL: nbdkit $* did not exit within $secs s: killed" >&2
        _stop_failed=1
    fi
    return "$rc"
}

# steady CMD...: CMD's output once it has stayed the same for 0.5 s (at
# most 10 s): a client's connection threads and fds go a little after it
# disconnects, so a count read at once may still include them.
steady ()
{
    local v last n=0 i
    last=$("$@")
    for (( i = 0; i < 100 && n < 5; i++ )); do
        sleep 0.1
        v=$("$@")
        if [ "$v" = "$last" ]; then n=$((n + 1)); else n=0 last=$v; fi
    done
    echo "$last"
}

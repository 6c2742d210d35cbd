# SPDX-License-Identifier: BSD-3-Clause
# Sourced by the nbdmsetup tests: tests/functions.sh plus the control
# export of the server the tests start (start_server ctl mapper ...:
# $sock) and helpers to run nbdmsetup.
: "${top_srcdir:=$(cd "$(dirname "$0")/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
source "$top_srcdir/tests/functions.sh"
: "${NBDMSETUP:=$top_builddir/client-tools/nbdmsetup/nbdmsetup}"
export NBDMSETUP

requires nbdkit --version
requires test -x "$NBDMSETUP"

sock=$tmpdir/ctl.sock
export NBDMSETUP_URI="nbd+unix:///control?socket=$sock"
unset NBDMSETUP_KEY

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

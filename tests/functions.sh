# Sourced by every shell test.  Run from automake (tests/Makefile.am sets
# top_srcdir, top_builddir, PLUGIN) or by hand from the build tree.
set -e
set -u

# nbdsh runs "python3 -m nbd": only Debian's python3 has the module.
PATH=/usr/bin:/usr/sbin:/bin:/sbin:$PATH
export PATH

: "${top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
# The tests' Python parts share tests/nbdcheck.py.
export PYTHONPATH="$top_srcdir/tests${PYTHONPATH:+:$PYTHONPATH}"
: "${PLUGIN:=$top_builddir/plugins/mapper/.libs/nbdkit-mapper-plugin.so}"
: "${SANITIZER_LIBASAN:=}"

# requires CMD [ARGS...]: skip the test (exit 77) unless CMD ARGS succeeds.
requires ()
{
    if ! "$@" >/dev/null 2>&1; then
        echo "$0: skipped: requires $*"
        exit 77
    fi
}

# A scratch directory removed at exit; cleanup_fn CMD... adds cleanups
# (run in reverse order, before the directory goes).
_cleanups=()
cleanup_fn () { _cleanups+=("$*"); }
_stop_failed=
_run_cleanups ()
{
    local status=$?
    local i
    for (( i=${#_cleanups[@]}-1; i>=0; i-- )); do
        eval "${_cleanups[$i]}" || :
    done
    rm -rf "$tmpdir"
    # A server that had to be killed (stop_pidfile) fails the test, even
    # when it was stopped by a cleanup after everything else passed.
    if [ "$status" -eq 0 ] && [ -n "$_stop_failed" ]; then
        status=1
    fi
    exit $status
}
tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/nbdmapper-test.XXXXXX")
# A signal exits with 128+N, which runs the cleanups once (as the EXIT
# trap) and fails the test: trapping INT and TERM with _run_cleanups too
# ran them twice and exited with the last command's status, often 0.
trap _run_cleanups EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The command nbdkit --run should get: its children must not inherit the
# ASan runtime (qemu-img, python and fio are not built for it).
_run_cmd ()
{
    if [ -n "$SANITIZER_LIBASAN" ]; then
        printf 'unset LD_PRELOAD ASAN_OPTIONS; %s' "$1"
    else
        printf '%s' "$1"
    fi
}

# mapper ARGS...: run nbdkit with the freshly built plugin.  ARGS are
# nbdkit options and plugin parameters, e.g.
#   mapper -U - "$tmpdir/a.table" --run 'nbdinfo "$uri"'
# The plugin path goes after the leading options.  Under a sanitizer build,
# the ASan runtime is preloaded into nbdkit (which is not itself
# instrumented); children of --run do not get it.  With MAPPER_NETNS=NAME,
# nbdkit runs in that network namespace (ip netns exec), environment and
# all.
mapper ()
{
    local opts=() rest=()
    while [ $# -gt 0 ]; do
        case "$1" in
            --run) opts+=("$1" "$(_run_cmd "$2")"); shift 2 ;;
            -U|-t|-p|-P|-e|-D|-i|--filter|--tls|--tls-psk|--tls-certificates|--log|--exportname|--selinux-label|--user|--group|--mask-handshake|--threads|--unix|--port|--pidfile|--ipaddr)
                opts+=("$1" "$2"); shift 2 ;;
            -*) opts+=("$1"); shift ;;
            *) break ;;
        esac
    done
    while [ $# -gt 0 ]; do
        if [ "$1" = --run ] && [ $# -ge 2 ]; then
            rest+=("$1" "$(_run_cmd "$2")"); shift 2
        else
            rest+=("$1"); shift
        fi
    done
    # "env" rather than VAR=... so that the settings go through a
    # wrapper such as "ip netns exec" and reach nbdkit alone.
    local pre=()
    if [ -n "${MAPPER_NETNS:-}" ]; then
        pre=(ip netns exec "$MAPPER_NETNS")
    fi
    if [ -n "$SANITIZER_LIBASAN" ]; then
        pre+=(env LD_PRELOAD="$SANITIZER_LIBASAN"
              ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0:exitcode=99}")
    fi
    local rc=0
    "${pre[@]}" nbdkit "${opts[@]}" "$PLUGIN" "${rest[@]}" || rc=$?
    [ "$rc" -eq 0 ] || return "$rc"
    # A daemonised nbdkit writes its pid file after the parent has exited:
    # callers read it at once, so wait for it here.
    local i pidfile= fg=false
    for (( i = 0; i < ${#opts[@]}; i++ )); do
        case "${opts[i]}" in
            -P|--pidfile) pidfile=${opts[i+1]} ;;
            --foreground|--run|-[!-]*f*) fg=true ;;
        esac
    done
    if [ -n "$pidfile" ] && ! $fg; then
        wait_for test -s "$pidfile" || return 1
    fi
}

# mkfile NAME SIZE: a sparse backing file in the scratch dir; prints its path.
mkfile ()
{
    truncate -s "$2" "$tmpdir/$1"
    echo "$tmpdir/$1"
}

# die MSG: fail the test with a message.
die () { echo "$0: FAIL: $*" >&2; exit 1; }

# --- generic helpers added for the shell tests ----------------------------

# fill_random FILE SIZE [SEED]: (over)write FILE with SIZE deterministic
# pseudo-random bytes (the same SEED always gives the same bytes).
fill_random ()
{
    python3 - "$1" "$2" "${3:-1}" <<'PYEOF'
import random, sys
path, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
with open(path, "wb") as f:
    left = size
    while left > 0:
        n = min(left, 1 << 20)
        f.write(rng.randbytes(n))
        left -= n
PYEOF
}

# wait_for CMD...: retry CMD every 0.1s for up to 30s; fail if it never
# succeeds.
wait_for ()
{
    local i
    for (( i=0; i<300; i++ )); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "$0: timed out waiting for: $*" >&2
    return 1
}

# stop_pidfile PIDFILE [SIGNAL]: stop the daemonised server whose pid is
# in PIDFILE (SIGTERM unless told) and remove the file; wait until it is
# gone (or a zombie: a daemon's parent is init, which may be slow to reap
# it, and a zombie has closed its sockets and files).  A server still
# there after 10 s hangs at exit: it is killed with SIGKILL, and the test
# fails (stop_pidfile returns 1, and a test whose cleanup had to kill a
# server exits 1).  Does nothing without a pid file.
stop_pidfile ()
{
    local pid i threads
    [ -s "$1" ] || return 0
    pid=$(cat "$1")
    rm -f "$1"
    kill "-${2:-TERM}" "$pid" 2>/dev/null || return 0
    for (( i = 0; i < 100; i++ )); do
        kill -0 "$pid" 2>/dev/null || return 0
        [ "$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 0
        sleep 0.1
    done
    # What it was and where its threads wait, for the report.
    threads=$(for t in /proc/$pid/task/*; do
                  printf ' %s(%s)' "$(cat "$t/comm")" "$(cat "$t/wchan")"
              done 2>/dev/null)
    echo "$0: FAIL: pid $pid ($1) did not exit within 10 s of" \
         "SIG${2:-TERM}: killed with SIGKILL." \
         "Command: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)" \
         "Threads:$threads" >&2
    kill -9 "$pid" 2>/dev/null || :
    _stop_failed=1
    return 1
}

# ext4_fuse_preflight: skip the test (exit 77) unless an ext4 filesystem
# on nbdfuse + a loop device can work here at all, independent of the
# plugin (containers often cannot): the tools, a loop device on a file with
# ext4 mounted from it, and (given nbdkit's memory plugin) an nbdfuse mount.
ext4_fuse_preflight ()
{
    local preloop pf
    requires nbdfuse --version
    requires fusermount3 --version
    requires test -c /dev/fuse
    requires losetup --version
    requires mkfs.ext4 -V
    requires fsck.ext4 -V
    requires mount --version
    requires sha256sum --version
    truncate -s 8M "$tmpdir/pre.img"
    mkfs.ext4 -q -F "$tmpdir/pre.img" >/dev/null 2>&1 || {
        echo "$0: skipped: mkfs.ext4 on a file fails"; exit 77; }
    mkdir "$tmpdir/pre"
    if ! preloop=$(losetup -f --show "$tmpdir/pre.img" 2>/dev/null); then
        echo "$0: skipped: cannot attach a loop device"; exit 77
    fi
    if ! mount -t ext4 "$preloop" "$tmpdir/pre" 2>/dev/null; then
        losetup -d "$preloop"
        echo "$0: skipped: cannot mount ext4"; exit 77
    fi
    umount "$tmpdir/pre"
    losetup -d "$preloop"
    nbdkit memory --dump-plugin >/dev/null 2>&1 || return 0
    mkdir "$tmpdir/prefuse"
    pf=$tmpdir/prefuse
    if ! nbdkit -U - memory 1M --run "
            nbdfuse '$pf' \"\$uri\" & pid=\$!
            for i in \$(seq 100); do
                [ -e '$pf/nbd' ] && break; sleep 0.1
            done
            ok=0; [ -e '$pf/nbd' ] && ok=1
            fusermount3 -u '$pf' 2>/dev/null || kill \$pid 2>/dev/null
            wait \$pid 2>/dev/null
            [ \$ok = 1 ]" >/dev/null 2>&1; then
        grep -q " $pf " /proc/mounts &&
            { fusermount3 -u -z "$pf" || umount -l "$pf"; }
        echo "$0: skipped: nbdfuse cannot mount here"; exit 77
    fi
}

# fuse_attach URI: nbdfuse URI on $tmpdir/fuse (made by the caller) and a
# fresh loop device on its file (no blocks cached from before); sets $loop
# to the device and writes $tmpdir/{fusepid,loopdev} for fuse_detach.
# Fails if nbdfuse does not come up within 30 s (the caller says so).
fuse_attach ()
{
    nbdfuse "$tmpdir/fuse" "$1" &
    echo $! > "$tmpdir/fusepid"
    wait_for test -e "$tmpdir/fuse/nbd" || return 1
    loop=$(losetup -f --show "$tmpdir/fuse/nbd") || return 1
    echo "$loop" > "$tmpdir/loopdev"
}

# fuse_detach: undo an nbdfuse + losetup + mount stack set up in
# $tmpdir/{fuse,mnt,loopdev,fusepid}, in reverse order; safe to run more
# than once or when only part was set up, and never hangs on a dead FUSE
# mount.
fuse_detach ()
{
    if mountpoint -q "$tmpdir/mnt" 2>/dev/null; then
        umount "$tmpdir/mnt" 2>/dev/null || umount -l "$tmpdir/mnt" || :
    fi
    if [ -s "$tmpdir/loopdev" ]; then
        losetup -d "$(cat "$tmpdir/loopdev")" 2>/dev/null || :
        rm -f "$tmpdir/loopdev"
    fi
    if grep -q " $tmpdir/fuse " /proc/mounts 2>/dev/null; then
        fusermount3 -u "$tmpdir/fuse" 2>/dev/null ||
            fusermount3 -u -z "$tmpdir/fuse" 2>/dev/null ||
            umount -l "$tmpdir/fuse" 2>/dev/null || :
    fi
    if [ -s "$tmpdir/fusepid" ]; then
        kill "$(cat "$tmpdir/fusepid")" 2>/dev/null || :
        rm -f "$tmpdir/fusepid"
    fi
}

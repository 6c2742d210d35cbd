# SPDX-License-Identifier: BSD-3-Clause
# Sourced by the multipath tests: tests/functions.sh, the servers behind
# the paths (nbdkit, qemu-nbd, nbd-server over one file), the mapper with
# its control export, and what status says of a path.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

: "${NBDMSETUP:=$top_builddir/client-tools/nbdmsetup/nbdmsetup}"
requires test -x "$NBDMSETUP"
export NBDMSETUP_URI="nbd+unix:///control?socket=$tmpdir/ctl.sock"
unset NBDMSETUP_KEY
ms () { "$NBDMSETUP" "$@"; }
# The device m of the mapper started by start_mapper.
dev_uri="nbd+unix:///m?socket=$tmpdir/ctl.sock"

# kit NAME FILE [--OPTION...] [KEY=VALUE...]: nbdkit file FILE on
# $tmpdir/NAME.sock, with those options (--filter=log) and parameters.
kit ()
{
    local n=$1 f=$2 opts=() params=()
    shift 2
    for a in "$@"; do
        case $a in --*) opts+=("$a") ;; *) params+=("$a") ;; esac
    done
    start_server "$n" "${opts[@]}" file "$f" "${params[@]}"
}
kit_uri () { echo "nbd+unix:///?socket=$tmpdir/$1.sock"; }
# qemu NAME FILE: qemu-nbd (raw) on $tmpdir/NAME.sock.
qemu () { start_qemu_nbd "$1" "$2"; }
qemu_uri () { echo "nbd+unix:///?socket=$tmpdir/$1.sock"; }
# nbds NAME FILE: nbd-server exporting FILE as "disk" on $tmpdir/NAME.sock
# (it forks a process per client: kill9 kills those too).
nbds ()
{
    rm -f "$tmpdir/$1.sock" "$tmpdir/$1.pid"
    cat > "$tmpdir/$1.conf" <<CONF
[generic]
    unixsock = $tmpdir/$1.sock
[disk]
    exportname = $2
    flush = true
    fua = true
CONF
    nbd-server -C "$tmpdir/$1.conf" -p "$tmpdir/$1.pid" ||
        die "nbd-server $1 did not start"
    _started "$1" false
    wait_file "$tmpdir/$1.pid"
    wait_for test -S "$tmpdir/$1.sock" || die "nbd-server $1: no socket"
}
nbds_uri () { echo "nbd+unix:///disk?socket=$tmpdir/$1.sock"; }

# two_paths SEED: $disk (4 MiB of random bytes from SEED), servers a
# and b (nbdkit file) over it, $A and $B their URIs; both_down kills
# both, both_up starts them again and waits until both paths are active.
two_paths ()
{
    disk=$(mkfile disk.img 4M)
    fill_random "$disk" 4194304 "$1"
    kit a "$disk"
    kit b "$disk"
    A=$(kit_uri a) B=$(kit_uri b)
}
both_down () { kill9 a; kill9 b; }
both_up () { kit a "$disk"; kit b "$disk"; wait_path "$A" A; wait_path "$B" A; }

# kill9 NAME: the server NAME dies (SIGKILL), its clients' processes too.
kill9 ()
{
    local pid
    pid=$(cat "$tmpdir/$1.pid")
    pkill -9 -P "$pid" 2>/dev/null || :
    kill -9 "$pid"
    rm -f "$tmpdir/$1.pid" "$tmpdir/$1.sock"
    if [ -s "$tmpdir/$1.job" ]; then
        wait "$(cat "$tmpdir/$1.job")" 2>/dev/null || :
        rm -f "$tmpdir/$1.job"
    fi
}

# start_mapper TABLE-FILE [ARGS...]: the mapper in the foreground (its
# log in $tmpdir/log: path events are logged at the default verbosity),
# control and devices on $tmpdir/ctl.sock.
start_mapper ()
{
    local t=$1; shift
    start_server --stderr "$tmpdir/log" ctl -f mapper "$@" "$t"
}

# path_is URI A|F: status of device m says so of that path.
path_is () { ms status m | grep -q " $1 $2 "; }
# wait_path URI A|F: until it does (30 s).
wait_path ()
{
    wait_for path_is "$1" "$2" ||
        { ms status m; grep -E 'multipath|nbd[+a-z]*://' "$tmpdir/log" | tail -40
          die "path $1 never became $2"; }
}

# fio_start NAME SECONDS [FIO-ARGS...]: a verified random read/write fio
# run on device m, in the background (pid in $fio).
fio_start ()
{
    local name=$1 secs=$2; shift 2
    ( cd "$tmpdir" &&
      exec timeout -k 10 120 fio --name="$name" --ioengine=nbd --uri="$dev_uri" \
        --rw=randrw --bs=16k --size=16M --iodepth=8 --fsync=16 --time_based \
        --runtime="$secs" --verify=crc32c --verify_backlog=64 \
        --verify_fatal=1 --verify_state_save=0 "$@" ) \
        > "$tmpdir/$name.fio" 2>&1 &
    fio=$!
}
# fio_check NAME: the run ended well, with no error of any kind.
fio_check ()
{
    wait "$fio" || { cat "$tmpdir/$1.fio"; die "fio $1 failed"; }
    if grep -Ei 'verify.*(fail|bad)|bad magic|crc32c.*wanted|err= *[1-9]' \
            "$tmpdir/$1.fio"; then
        cat "$tmpdir/$1.fio"; die "fio $1 reported errors"
    fi
    grep -E 'READ:|WRITE:' "$tmpdir/$1.fio"
}

# same_data FILE: device m reads back exactly FILE.
same_data ()
{
    timeout 120 nbdcopy "$dev_uri" "$tmpdir/readback.img" ||
        die "reading device m back failed"
    cmp "$tmpdir/readback.img" "$1" || die "device m and $1 differ"
    rm -f "$tmpdir/readback.img"
}

# logged PATTERN: the mapper's log has a line matching PATTERN (grep -E).
logged ()
{
    grep -E -- "$1" "$tmpdir/log" ||
        { tail -30 "$tmpdir/log"; die "the log has no line matching /$1/"; }
}

# re TEXT: TEXT as a grep -E pattern matching itself.
re () { printf '%s' "$1" | sed 's/[][\.*^$+?(){}|]/\\&/g'; }
# status_ends TEXT: status of device m ends with TEXT.
status_ends ()
{
    local s
    s=$(ms status m)
    [[ $s == *"$1" ]] ||
        { grep -v 'debug: mapper\[' "$tmpdir/log" | tail -30
          die "status '$s' does not end with '$1'"; }
}

# read_check [EXPECT]: read 64 KiB at 1 MiB of device m (timeout 60 s);
# EXPECT ok: the bytes of file $disk (the test's); EIO: fails with EIO;
# gone: fails any way.
read_check ()
{
    timeout 60 python3 - "$dev_uri" "$disk" "${1:-ok}" <<'PY'
import errno, sys, nbd
uri, disk, expect = sys.argv[1:]
h = nbd.NBD()
h.connect_uri(uri)
want = open(disk, "rb").read()[1 << 20:(1 << 20) + 65536]
try:
    got = h.pread(65536, 1 << 20)
except nbd.Error as e:
    if expect == "EIO" and e.errnum == errno.EIO or expect == "gone":
        print("read failed as expected:", e)
        sys.exit(0)
    sys.exit("read failed: %s" % e)
if expect != "ok":
    sys.exit("read succeeded, expected %s" % expect)
if got != want:
    sys.exit("read returned the wrong data")
print("read ok")
PY
}
# read_bg [EXPECT]: read_check in the background (pid in $rd).
read_bg () { read_check "$@" > "$tmpdir/rd.out" 2>&1 & rd=$!; }
read_wait ()
{
    wait "$rd" || { cat "$tmpdir/rd.out"; die "$1"; }
    cat "$tmpdir/rd.out"
}
# read_wait WHY: the background read ended as expected, else die WHY.
# queued: status says I/O is queued (no path, queueing), and the reader
# is still waiting (device m is 8192 sectors).
queued ()
{
    wait_for sh -c "'$NBDMSETUP' status m | grep -q '^0 8192 multipath 2 1 0 '" ||
        die "status does not say I/O is queued: $(ms status m)"
    kill -0 "$rd" 2>/dev/null || { cat "$tmpdir/rd.out"; die "the read did not wait"; }
}

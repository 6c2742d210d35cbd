#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The test harness itself (tests/functions.sh): each case is a small test
# run here, whose exit status and messages are checked.  A server that
# needed SIGKILL fails its test even when the test passed; so does one
# that outlived mapper --timeout; mapper refuses to leave a daemon
# behind; a server that cannot start fails the test with nbdkit's
# message; at exit the mapper stops before the backend it is a client of,
# whatever the order of their starts; our plugin, and only it, runs with
# the sanitizer runtime, and --run's command without it; a sanitizer
# report of a server fails the test; what a test leaves running (a
# server whose pid file another took over, a forgotten child) fails it,
# is named and stopped, and nothing else does (another test's processes,
# one a cleanup signalled and which is going); a test past its time limit
# (unit-run.sh) fails, naming what ran, and is stopped; loop_attach
# waits (bounded) for a free loop device.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit memory --version
requires nbdsh --version

echo "0 2048 zero" > "$tmpdir/z.table"

# run_case NAME WANT-STATUS: runs $tmpdir/NAME.sh (the harness, then the
# case read from stdin) and checks its exit status; its output is in
# $tmpdir/NAME.out.
run_case ()
{
    local rc=0
    { echo "source '$top_srcdir/tests/functions.sh'"; cat; } > "$tmpdir/$1.sh"
    bash "$tmpdir/$1.sh" > "$tmpdir/$1.out" 2>&1 || rc=$?
    [ "$rc" -eq "$2" ] ||
        { cat "$tmpdir/$1.out"; die "case $1: exit $rc, expected $2"; }
}
# says NAME PATTERN: the case's output matches PATTERN (grep -E).
says ()
{
    grep -Eq -- "$2" "$tmpdir/$1.out" ||
        { cat "$tmpdir/$1.out"; die "case $1: no /$2/ in its output"; }
}

# 1. A client holds a connection, so nbdkit does not exit on SIGTERM: the
#    cleanup kills it, and the test that passed fails.
run_case killed 1 <<EOF
_stop_wait=2
# Registered first, so run last: the server must still be held.
cleanup_fn 'kill "\$(cat "\$tmpdir/holder.pid")"'
start_server s memory 1M
nbdsh -u "nbd+unix:///?socket=\$tmpdir/s.sock" \\
      -c 'print("up", flush=True); import time; time.sleep(60)' \\
      > "\$tmpdir/holder.out" &
echo \$! > "\$tmpdir/holder.pid"
wait_for grep -q up "\$tmpdir/holder.out"
echo "case passed"
EOF
says killed 'case passed'
says killed 'did not exit within 2 s of SIGTERM: killed with SIGKILL'
# ...and where its threads were, when gdb is there (install-deps has it).
if command -v gdb > /dev/null; then
    says killed '^Thread [0-9]+ .*LWP [0-9]+'
    says killed '^#[0-9]+ +.* in '
fi

# 2. mapper --timeout: nbdkit killed, the caller sees 124, the test fails.
run_case timeout 1 <<EOF
rc=0
mapper --timeout 1 -U - "$tmpdir/z.table" --run 'sleep 60' || rc=\$?
echo "rc=\$rc"
EOF
says timeout '^rc=124$'
says timeout 'did not exit within 1 s: killed'

# 3. mapper does not start a daemon nobody would stop.
run_case daemon 1 <<EOF
# Should mapper start it after all, it goes at exit.
cleanup_fn 'stop_pidfile "\$tmpdir/d.pid"'
mapper -U "\$tmpdir/d.sock" -P "\$tmpdir/d.pid" "$tmpdir/z.table"
echo "not reached"
EOF
says daemon 'a server that outlives the call .* is started with start_server'
! grep -q 'not reached' "$tmpdir/daemon.out" || die "case daemon: went on"

# 4. A server that cannot start fails the test, with nbdkit's message,
#    daemonised or in the foreground.
for fg in "" -f; do
    run_case "nostart$fg" 1 <<EOF
start_server --stderr "\$tmpdir/log" bad $fg mapper "$tmpdir/missing.table"
echo "not reached"
EOF
    says "nostart$fg" 'missing\.table: No such file or directory'
    says "nostart$fg" 'FAIL: start_server bad: nbdkit exited'
done

# 5. The mapper is a client of b, restarted after the mapper started: at
#    exit the mapper stops first, and b is not held by it.
run_case order 0 <<EOF
_stop_wait=5
start_server b memory 1M
echo "0 2048 linear nbd+unix:///?socket=\$tmpdir/b.sock 0" > "\$tmpdir/d.table"
start_server m mapper "\$tmpdir/d.table"
stop_server b KILL
start_server b memory 1M
# Until the mapper is connected to the new b.
nbdsh -u "nbd+unix:///d?socket=\$tmpdir/m.sock" -c '
from nbdcheck import when_back
when_back(h.pread, 512, 0)'
EOF

# 6. Our plugin runs with plugin_env (the sanitizer runtime under a
#    sanitizer build), nbdkit's own plugins and --run's command without.
run_case env 0 <<EOF
environ () { tr '\0' '\n' < "/proc/\$(cat "\$tmpdir/\$1.pid")/environ"; }
start_server m mapper "$tmpdir/z.table"
start_server b memory 1M
echo "mine: \$(environ m | grep '^LD_PRELOAD=' || :)"
echo "want: \${plugin_env[0]:-}"
echo "other: \$(environ b | grep '^LD_PRELOAD=' || :)"
mapper -U - "$tmpdir/z.table" --run 'echo "run: \${LD_PRELOAD:-}"'
EOF
mine=$(sed -n 's/^mine: //p' "$tmpdir/env.out")
want=$(sed -n 's/^want: //p' "$tmpdir/env.out")
[ "$mine" = "$want" ] ||
    { cat "$tmpdir/env.out"; die "case env: the mapper's LD_PRELOAD"; }
says env '^other: $'
says env '^run: $'
# 7. A server that ends with a sanitizer report (report-shim.so makes
#    one, whatever the build) fails the test: mapper --run's, whose
#    status nbdkit does not pass on and whose report came after --run
#    returned (the test passed), and start_server's.
shim=$top_builddir/tests/.libs/report-shim.so
[ -f "$shim" ] || die "no $shim"
# mapper returns 99 (set -e ends the case with it); stop_server fails.
for how in run:99 start:1; do
    want=${how#*:} how=${how%:*}
    run_case "report-$how" "$want" <<EOF
plugin_env[0]="LD_PRELOAD=\${SANITIZER_LIBASAN:+\$SANITIZER_LIBASAN:}$shim"
plugin_env[1]=\${plugin_env[1]:-NBDMAPPER_TEST=1}
if [ $how = run ]; then
    mapper -U - "$tmpdir/z.table" --run 'nbdinfo --size "\$uri"'
else
    start_server m mapper "$tmpdir/z.table"
    nbdinfo --size "nbd+unix:///?socket=\$tmpdir/m.sock"
    stop_server m
fi
echo "case went on"
EOF
    says "report-$how" 'made by tests/report-shim.c'
    says "report-$how" 'sanitizer report'
done
# 8. kill_job signals a running job of the test and nothing else: a pid
#    that is not one (an ended job's, which another process may have got
#    since: here a process started elsewhere) is left alone.
run_case killjob 0 <<EOF
sleep 60 & job=\$!
sh -c 'sleep 60 > /dev/null & echo \$!' > "\$tmpdir/other.pid"
other=\$(cat "\$tmpdir/other.pid")
kill_job "\$other"
# (Signalled, it would be a zombie until init reaps it.)
state=\$(cut -d' ' -f3 "/proc/\$other/stat" 2>/dev/null) || :
[ -n "\$state" ] && [ "\$state" != Z ] ||
    { echo "kill_job signalled a process not its job (\$state)"; exit 1; }
kill "\$other"
kill_job "\$job"
! wait "\$job" || { echo "kill_job did not signal its job"; exit 1; }
echo "case passed"
EOF
says killjob 'case passed'

# 9. What a test leaves running fails it, named, and is stopped.  The
#    second server takes over a's pid file (as a restart without stopping
#    did in test-multipath-groups.sh): the cleanup stops only it.
run_case leak 1 <<EOF
start_server a memory 1M
echo "first=\$(cat "\$tmpdir/a.pid")"
nbdkit -P "\$tmpdir/a.pid" -U "\$tmpdir/a2.sock" memory 1M
wait_file "\$tmpdir/a.pid"
echo "second=\$(cat "\$tmpdir/a.pid")"
echo "case passed"
EOF
first=$(sed -n 's/^first=//p' "$tmpdir/leak.out")
second=$(sed -n 's/^second=//p' "$tmpdir/leak.out")
[ -n "$first" ] && [ "$first" != "$second" ] ||
    { cat "$tmpdir/leak.out"; die "case leak: the pid file was not taken over"; }
says leak 'case passed'
says leak "FAIL: pid $first still running at the end of the test \\(.*command-line.*\\): nbdkit -P /[^ ]*/a\\.pid -U /[^ ]*/a\\.sock"
! grep -q "pid $second still running" "$tmpdir/leak.out" ||
    { cat "$tmpdir/leak.out"; die "case leak: named the server it stopped"; }
wait_for test ! -e "/proc/$first" || die "case leak: pid $first left running"

# 10. A child of the test shell it forgot fails it; one a cleanup
#    signalled without waiting for it does not; nor do the processes of
#    another test (another scratch directory: here one of this test's,
#    working there).  One that ignores SIGTERM is killed, and says so.
mkdir "$tmpdir/other"
(cd "$tmpdir/other" && exec sleep 60) &
other=$!
cleanup_fn "kill $other; wait $other"
run_case child 1 <<EOF
sleep 60 &
echo "child=\$!"
EOF
child=$(sed -n 's/^child=//p' "$tmpdir/child.out")
says child "FAIL: pid $child still running at the end of the test \\( ?child\\): sleep 60"
run_case clean 0 <<EOF
start_server a memory 1M
nbdinfo --size "nbd+unix:///?socket=\$tmpdir/a.sock"
# Once it is sleep: SIGTERM to the shell forked for it, before its exec,
# can be lost (its trap, exit 143, pending when it execs).
sleep 60 &
wait_for grep -qx sleep "/proc/\$!/comm"
cleanup_fn "kill \$!"
EOF
! grep -q 'still running' "$tmpdir/clean.out" ||
    { cat "$tmpdir/clean.out"; die "case clean: a leak reported"; }
run_case stubborn 1 <<EOF
_stop_wait=1
bash -c 'trap "" TERM; echo up; exec sleep 60' > "\$tmpdir/up" &
wait_for grep -q up "\$tmpdir/up"
EOF
says stubborn 'still running at the end of the test .*: sleep 60'
says stubborn 'did not exit within 1 s of SIGTERM: killed with SIGKILL'

# 11. nbdcheck.mapper_run (the Python tests' server in the foreground):
#     one that needs SIGKILL fails the command it ran for, which passed.
#     Stopped (SIGSTOP), it cannot act on SIGTERM.
run_case pykilled 0 <<EOF
python3 - "$tmpdir/z.table" <<'PY'
import sys
from nbdcheck import mapper_run
r = mapper_run([], [sys.argv[1]],
               'kill -STOP "\$(cat "\$(dirname "\$unixsocket")/pid")"',
               stop_wait=1)
print("rc=%d" % r.returncode)
print(r.stderr)
PY
EOF
says pykilled '^rc=1$'
says pykilled 'did not exit within 1 s of SIGTERM: killed with SIGKILL'

# 12. A C unit test runs in the harness (unit-run.sh, with its scratch
#     directory under $tmpdir): a server it leaves running fails it too.
rc=0
bash "$top_srcdir/tests/unit-run.sh" sh -c \
    'nbdkit -P "$TMPDIR/u.pid" -U "$TMPDIR/u.sock" memory 1M' \
    > "$tmpdir/unit.out" 2>&1 || rc=$?
[ "$rc" -eq 1 ] || { cat "$tmpdir/unit.out"; die "case unit: exit $rc, not 1"; }
says unit 'still running at the end of the test .*: nbdkit -P /[^ ]*/u\.pid'

# 13. unit-run.sh's time limit.  A test past it fails, naming the limit
#     and what was still running; SIGTERM reaches what it runs in the
#     foreground, and its cleanups and leak check still run (the server it
#     started is stopped); one that ignores SIGTERM is killed after the
#     grace, and says so.  One within its limit passes; a script's
#     "# test-timeout:" sets its limit, the environment overrides it.
#     (The limits are far from the sleeps: nothing here depends on time.)
cat > "$tmpdir/slow.sh" <<EOF
#!/bin/bash
source '$top_srcdir/tests/functions.sh'
start_server a memory 1M
cleanup_fn "echo 'slow: cleanup ran'"
echo "slow: server \$(cat "\$tmpdir/a.pid")"
sleep 600
echo "slow: not reached"
EOF
timed ()
{
    local name=$1 want=$2 rc=0; shift 2
    chmod +x "$tmpdir/$name.sh"
    env "$@" bash "$top_srcdir/tests/unit-run.sh" "$tmpdir/$name.sh" \
        > "$tmpdir/$name.out" 2>&1 || rc=$?
    [ "$rc" -eq "$want" ] ||
        { cat "$tmpdir/$name.out"; die "case $name: exit $rc, not $want"; }
}
timed slow 1 NBDMAPPER_TEST_TIMEOUT=1
says slow "FAIL: .*slow\\.sh: timed out after 1 s"
says slow 'still running at the timeout: pid [0-9]+ \( ?child\): sleep 600'
says slow 'still running at the timeout: pid [0-9]+ .*nbdkit -P /[^ ]*/a\.pid'
says slow '^slow: cleanup ran$'
! grep -q 'not reached' "$tmpdir/slow.out" || die "case slow: not stopped"
server=$(sed -n 's/^slow: server //p' "$tmpdir/slow.out")
wait_for test ! -e "/proc/$server" || die "case slow: server $server left"
# Its own "# test-timeout: 1" (after the #! line, where tests say it).
sed '1a # test-timeout: 1' "$tmpdir/slow.sh" > "$tmpdir/slowown.sh"
timed slowown 1
says slowown "timed out after 1 s"
# Stubborn ones, SIGTERM ignored: a child in a process group of its own,
# and one daemonised (init's child, working in the test's scratch dir).
cat > "$tmpdir/stubborn2.sh" <<EOF
#!/bin/bash
source '$top_srcdir/tests/functions.sh'
setsid bash -c 'trap "" TERM; exec sleep 600' &
setsid -f bash -c 'trap "" TERM; cd "\$1" && exec sleep 601' _ "\$tmpdir"
sleep 600
EOF
timed stubborn2 1 NBDMAPPER_TEST_TIMEOUT=1 NBDMAPPER_TEST_KILL_GRACE=1
says stubborn2 'did not exit within 1 s of SIGTERM \(the timeout\): killed with SIGKILL: pid [0-9]+ \( ?child\): sleep 600'
says stubborn2 'did not exit within 1 s of SIGTERM \(the timeout\): killed with SIGKILL: pid [0-9]+ \( ?cwd\): sleep 601'
# Within the limit: passes (the environment's limit over the script's 1 s).
cat > "$tmpdir/quick.sh" <<EOF
#!/bin/bash
# test-timeout: 1
source '$top_srcdir/tests/functions.sh'
start_server a memory 1M
nbdinfo --size "nbd+unix:///?socket=\$tmpdir/a.sock"
EOF
timed quick 0 NBDMAPPER_TEST_TIMEOUT=600
timed quick 0 NBDMAPPER_TEST_TIMEOUT=0
! grep -q 'FAIL' "$tmpdir/quick.out" || { cat "$tmpdir/quick.out"; die "case quick"; }

# 14. loop_attach: with no free loop device (a losetup that says so, here
#     a stub: nothing depends on the machine's devices) it waits, says
#     so, and gets the one that comes free; it gives up after
#     NBDMAPPER_LOOP_WAIT s naming the devices in use; any other error
#     fails at once.
mkdir "$tmpdir/bin"
cat > "$tmpdir/bin/losetup" <<'EOF'
#!/bin/bash
# $LOOP_BUSY attaches fail for want of a device, then one succeeds.
n=$(( $(cat "$LOOP_COUNT" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$LOOP_COUNT"
case "$1" in
    -a) echo "/dev/loop0: []: (/elsewhere/held.img)"; exit 0 ;;
esac
case "$LOOP_BUSY" in
    file) echo "losetup: ${!#}: failed to set up loop device: No such file or directory" >&2
          exit 1 ;;
esac
if [ "$n" -le "$LOOP_BUSY" ]; then
    if [ $(( n % 2 )) = 1 ]; then
        echo "losetup: cannot find an unused loop device" >&2
    else
        echo "losetup: /dev/loop7: failed to set up loop device: Device or resource busy" >&2
    fi
    exit 1
fi
echo "losetup: ${!#}: Warning: file does not fit into a 512-byte sector" >&2
echo /dev/loop42
EOF
chmod +x "$tmpdir/bin/losetup"
run_case loopwait 0 <<EOF
PATH=$tmpdir/bin:\$PATH
export LOOP_COUNT=\$tmpdir/count LOOP_BUSY=3
dev=\$(loop_attach -r "\$tmpdir/x.img")
echo "dev=\$dev calls=\$(cat "\$LOOP_COUNT")"
EOF
says loopwait '^dev=/dev/loop42 calls=4$'
says loopwait 'no free loop device \(losetup: cannot find an unused loop device\): waiting'
says loopwait 'got /dev/loop42'
run_case loopnone 1 <<EOF
PATH=$tmpdir/bin:\$PATH
export LOOP_COUNT=\$tmpdir/count LOOP_BUSY=1000000 NBDMAPPER_LOOP_WAIT=1
loop_attach "\$tmpdir/x.img" || die "loop_attach failed"
EOF
says loopnone 'FAIL: no free loop device within 1 s \(NBDMAPPER_LOOP_WAIT\)'
says loopnone '^/dev/loop0: \[\]: \(/elsewhere/held\.img\)$'
run_case loopfile 1 <<EOF
PATH=$tmpdir/bin:\$PATH
export LOOP_COUNT=\$tmpdir/count LOOP_BUSY=file
loop_attach "\$tmpdir/x.img" || die "loop_attach failed after \$(cat "\$LOOP_COUNT") call"
EOF
says loopfile 'x\.img: failed to set up loop device: No such file or directory'
says loopfile 'loop_attach failed after 1 call$'
echo "test-harness: ok"

# Sourced by the remote-backend tests after functions.sh: captive NBD
# servers on Unix sockets or 127.0.0.1, killed at exit.

# backend NAME ARGS...: start "nbdkit ARGS" on $tmpdir/NAME.sock (in the
# background, pid in $tmpdir/NAME.pid), wait until it listens.
backend ()
{
    local name=$1; shift
    rm -f "$tmpdir/$name.sock" "$tmpdir/$name.pid"
    nbdkit -U "$tmpdir/$name.sock" -P "$tmpdir/$name.pid" "$@" ||
        die "backend $name: nbdkit $* failed"
    cleanup_fn "kill_backend $name"
    wait_file "$tmpdir/$name.pid"
}

# backend_tcp NAME PORT ARGS...: the same on 127.0.0.1:PORT.
backend_tcp ()
{
    local name=$1 port=$2; shift 2
    rm -f "$tmpdir/$name.pid"
    nbdkit --ipaddr 127.0.0.1 -p "$port" -P "$tmpdir/$name.pid" "$@" ||
        die "backend $name: nbdkit $* failed"
    cleanup_fn "kill_backend $name"
    wait_file "$tmpdir/$name.pid"
}

# kill_backend NAME [SIGNAL]: stop it (and wait until it is gone).
kill_backend () { stop_pidfile "$tmpdir/$1.pid" "${2:-TERM}"; }

# wait_file FILE: until FILE is there and not empty (a pid file).
wait_file () { wait_for test -s "$1" || die "timed out waiting for $1"; }

# free_port: a TCP port on 127.0.0.1 that nothing listens on right now.
free_port ()
{
    python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# netns_skip WHAT CMD...: skip (77) with the reason if CMD fails.
netns_skip ()
{
    local what=$1; shift
    if ! "$@" > "$tmpdir/netns.err" 2>&1; then
        echo "$0: skipped: cannot $what: $(head -1 "$tmpdir/netns.err")"
        exit 77
    fi
}

# netns_new NAME: a network namespace with its loopback up, deleted at
# exit; skips (77) where namespaces cannot be made or entered.
netns_new ()
{
    netns_skip "create a network namespace" ip netns add "$1"
    cleanup_fn "ip netns delete '$1'"
    netns_skip "run a command in a network namespace" ip netns exec "$1" true
    ip -n "$1" link set lo up
}

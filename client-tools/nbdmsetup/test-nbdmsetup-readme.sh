#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# README.md's nbdmsetup walk-through runs as written: the code blocks
# after a "<!-- README-test: NAME -->" line, in one bash -e, as the root
# running the tests does.  Only which programs the names find differs:
# nbdmsetup is the one built, and nbdkit's plugin "mapper" is the one
# built (the README's reader has run make install).  And no command in
# README needs sudo: none of its code blocks has a line starting with it.
source "$(dirname "$0")/functions-ms.sh"
requires nbdinfo --version
requires nbdsh --version

readme=$top_srcdir/README.md

# No sudo in a code block; the nbdsh / python3 note is in README.
python3 - "$readme" <<'PY' || die "README"
import sys
inside, bad = False, []
for n, line in enumerate(open(sys.argv[1]), 1):
    if line.startswith("```"):
        inside = not inside
    elif inside and line.lstrip().startswith("sudo "):
        bad.append("%d: %s" % (n, line.rstrip()))
assert not bad, "sudo in README code blocks:\n" + "\n".join(bad)
PY
grep -q 'PATH=/usr/bin:\$PATH nbdsh' "$readme" || die "README: no PATH=/usr/bin nbdsh line"
grep -q 'No module named nbd' "$readme" || die "README: no note on nbdsh and python3"

# The blocks, in order.
python3 - "$readme" > "$tmpdir/readme.sh" <<'PY'
import sys
lines = open(sys.argv[1]).read().split("\n")
i, n = 0, 0
while i < len(lines):
    if lines[i].startswith("<!-- README-test: "):
        i += 1
        assert lines[i] == "```", "no code block after the marker at %d" % i
        i += 1
        while lines[i] != "```":
            print(lines[i])
            i += 1
        n += 1
    i += 1
assert n >= 1, "no README-test block"
PY
grep -q '^nbdmsetup ls --tree' "$tmpdir/readme.sh" || die "block not extracted"

# The programs of the README's reader.
bin=$tmpdir/bin
mkdir "$bin" "$tmpdir/readme"
ln -s "$NBDMSETUP" "$bin/nbdmsetup"
# Under a sanitizer build (NBDMAPPER_PLUGIN_ENV set) a server of ours
# that would daemonise runs in the foreground, in the background of the
# wrapper, as start_server runs it: a daemon has no stderr for a report
# and its exit status (99 after one) is seen by no one.  Its stderr
# goes to $tmpdir/nbdkit.err, its exit status to PIDFILE.exit (one per
# server: the walk-through starts more than one), each listed in
# $tmpdir/nbdkit.exits and checked at the end.
cat > "$bin/nbdkit" <<EOT
#!/usr/bin/env bash
# nbdkit, with the built plugin for the plugin name "mapper".
args=() mine=false fg=false pidfile= prev=
for a in "\$@"; do
    [ "\$a" = mapper ] && { a=$PLUGIN; mine=true; }
    case "\$a" in
        -f|--foreground|--run|--help|--version|--dump-plugin) fg=true ;;
    esac
    case "\$prev" in -P|--pidfile) pidfile=\$a ;; esac
    prev=\$a
    args+=("\$a")
done
envs=()
[ -z "\$NBDMAPPER_PLUGIN_ENV" ] || mapfile -t envs <<< "\$NBDMAPPER_PLUGIN_ENV"
if \$mine && ! \$fg && [ \${#envs[@]} -gt 0 ] && [ -n "\$pidfile" ]; then
    rm -f "\$pidfile" "\$pidfile.exit"
    echo "\$pidfile.exit" >> "$tmpdir/nbdkit.exits"
    ( st=0
      env "\${envs[@]}" $(command -v nbdkit) -f "\${args[@]}" \\
          2>> "$tmpdir/nbdkit.err" < /dev/null > /dev/null || st=\$?
      echo "\$st" > "\$pidfile.exit" ) &
    # As the daemon would: back once it serves (its pid file written).
    for (( i = 0; i < 300; i++ )); do
        [ -s "\$pidfile" ] && exit 0
        [ -e "\$pidfile.exit" ] && break
        sleep 0.1
    done
    cat "$tmpdir/nbdkit.err" >&2
    exit 1
fi
exec env "\${envs[@]}" $(command -v nbdkit) "\${args[@]}"
EOT
chmod +x "$bin/nbdkit"
# A server the walk-through leaves running (it failed) is stopped (and
# fails the test if it needs SIGKILL).
cleanup_fn 'for p in "$tmpdir"/readme/*/nbdkit.pid; do stop_pidfile "$p" || :; done'

env -u NBDMSETUP_URI TMPDIR="$tmpdir/readme" PATH="$bin:$PATH" \
    bash -e -u -o pipefail -x "$tmpdir/readme.sh" > "$tmpdir/out" 2>&1 ||
    { cat "$tmpdir/out"; die "README's walk-through failed"; }
cat "$tmpdir/out"
# The servers ours ran in the foreground (sanitizer build): each
# exited, killed by the walk-through, with status 0 and no report.
if [ "${#plugin_env[@]}" -gt 0 ]; then
    [ -s "$tmpdir/nbdkit.exits" ] || die "no server of ours ran"
    while read -r x; do
        for (( i = 0; i < 100; i++ )); do
            [ -s "$x" ] && break
            sleep 0.1
        done
        [ "$(cat "$x" 2>/dev/null)" = 0 ] ||
            { cat "$tmpdir/nbdkit.err"; die "README's server exited" \
                  "$(cat "$x" 2>/dev/null || echo "?") ($x)"; }
    done < "$tmpdir/nbdkit.exits"
fi
# What the comments promise.
grep -q '^State:             ACTIVE (READ-ONLY)$' "$tmpdir/out" || die "info ro"
grep -qx '1 dependencies	: (mapper:data)' "$tmpdir/out" || die "deps top"
grep -Eqx ' (└─|`-)data' "$tmpdir/out" || die "ls --tree"
grep -qx '536870912' "$tmpdir/out" || die "nbdsh"
grep -Eqx '0 131072 linear nbd\+unix:///\?socket=.*/nbd.sock 0' "$tmpdir/out" || die "move vol"
echo "$0: ok"

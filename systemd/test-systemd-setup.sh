#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdmapper-setup, the units' ExecStartPre: on first start it makes the
# layout (CONFDIR 0700, CONFDIR/tables 0700, CONFDIR/control.key 0600 with
# 64 hex digits that nbdkit and nbdmsetup take as a key); again it changes
# nothing; a key or directory that is wrong is refused with one line
# saying why and what to do, and is left as it was.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"
: "${SETUP:=$top_builddir/systemd/nbdmapper-setup}"
requires test -x "$SETUP"
requires stat --version

conf=$tmpdir/etc/nbdmapper
mkdir "$tmpdir/etc"
uid=$(id -u)

# snapshot: what the layout is now (names, modes, owners, key content).
snapshot ()
{
    (cd "$tmpdir/etc" && find . -printf '%p %m %U %s %y\n' | sort &&
         cksum nbdmapper/control.key 2>/dev/null) || :
}

# refused PATTERN: the setup exits 1 with one "nbdmapper-setup: " line
# matching PATTERN, and changes nothing.
refused ()
{
    local before rc=0
    before=$(snapshot)
    "$SETUP" "$conf" > "$tmpdir/out" 2> "$tmpdir/err" || rc=$?
    [ "$rc" -eq 1 ] || die "setup exit $rc, expected 1: $(cat "$tmpdir/err")"
    [ "$(wc -l < "$tmpdir/err")" -eq 1 ] &&
        grep -Eq "^nbdmapper-setup: .*$1" "$tmpdir/err" ||
        die "setup said '$(cat "$tmpdir/err")', expected /$1/"
    [ ! -s "$tmpdir/out" ] || die "setup printed $(cat "$tmpdir/out")"
    [ "$(snapshot)" = "$before" ] || die "a refused setup changed the layout"
    echo "refused as expected: $(cat "$tmpdir/err")"
}

# First start: everything made, said once each.
"$SETUP" "$conf" > "$tmpdir/out"
cat "$tmpdir/out"
[ "$(grep -c '^nbdmapper-setup: created ' "$tmpdir/out")" -eq 3 ] ||
    die "first start: $(cat "$tmpdir/out")"
[ "$(stat -c '%a %u' "$conf")" = "700 $uid" ] || die "confdir mode"
[ "$(stat -c '%a %u' "$conf/tables")" = "700 $uid" ] || die "tables mode"
[ "$(stat -c '%a %u %s %F' "$conf/control.key")" = "600 $uid 64 regular file" ] ||
    die "key: $(stat -c '%a %u %s %F' "$conf/control.key")"
grep -Eqx '[0-9a-f]{64}' "$conf/control.key" || die "key is not 64 hex digits"
[ -z "$(find "$conf" -name '.control.key.*')" ] || die "temporary file left"
key1=$(cat "$conf/control.key")

# Idempotent: again, and again, nothing said and nothing changed.
before=$(snapshot)
"$SETUP" "$conf" > "$tmpdir/out"
"$SETUP" "$conf" >> "$tmpdir/out"
[ ! -s "$tmpdir/out" ] || die "second start said: $(cat "$tmpdir/out")"
[ "$(snapshot)" = "$before" ] || die "second start changed the layout"
# A key made by hand (any bytes, 32 to 4096) is kept as it is.
head -c 4096 /dev/urandom > "$conf/control.key"
cp "$conf/control.key" "$tmpdir/handmade"
"$SETUP" "$conf"
cmp "$conf/control.key" "$tmpdir/handmade" || die "a good key was replaced"
printf '%s' "$key1" > "$conf/control.key"

# The key, wrong.
chmod 640 "$conf/control.key"
refused 'control.key has mode 640, looser than 0600 .*: chmod 600 '
chmod 604 "$conf/control.key"
refused 'mode 604, looser than 0600'
chmod 400 "$conf/control.key"
"$SETUP" "$conf" || die "a 0400 key is strict enough"
chmod 600 "$conf/control.key"
head -c 31 /dev/urandom > "$tmpdir/short"
mv "$conf/control.key" "$tmpdir/key.good"
install -m 600 "$tmpdir/short" "$conf/control.key"
refused 'control.key is 31 bytes: a key is 32 to 4096 bytes'
head -c 4097 /dev/zero > "$conf/control.key"
refused 'is 4097 bytes'
rm "$conf/control.key"
ln -s "$tmpdir/key.good" "$conf/control.key"
refused 'control.key is a symbolic link'
rm "$conf/control.key"
mkdir -m 700 "$conf/control.key"
refused 'control.key is not a regular file'
rmdir "$conf/control.key"
mv "$tmpdir/key.good" "$conf/control.key"
if [ "$uid" -eq 0 ]; then
    chown 4242 "$conf/control.key"
    refused 'control.key is owned by uid 4242, not uid 0: chown 0 '
    chown 0 "$conf/control.key"
fi

# The directories, wrong.
chmod 720 "$conf"
refused "$conf is writable by group or others \(mode 720\): chmod go-w "
chmod 755 "$conf"
"$SETUP" "$conf" || die "a 0755 confdir (readable) is accepted"
chmod 702 "$conf/tables"
refused 'tables is writable by group or others'
chmod 700 "$conf/tables"
if [ "$uid" -eq 0 ]; then
    chown 4242 "$conf/tables"
    refused 'tables is owned by uid 4242, not uid 0'
    chown 0 "$conf/tables"
fi
rmdir "$conf/tables"
touch "$conf/tables"
refused 'tables is not a directory'
rm "$conf/tables"

# After all that, a start mends only what is missing: the tables
# directory; the key is the first one.
"$SETUP" "$conf" > "$tmpdir/out"
[ "$(cat "$tmpdir/out")" = "nbdmapper-setup: created $conf/tables (mode 0700)" ] ||
    die "mend: $(cat "$tmpdir/out")"
[ "$(cat "$conf/control.key")" = "$key1" ] || die "the key changed"

# Two first starts at once: one key, both succeed.
rm -r "$conf"
"$SETUP" "$conf" > /dev/null
rm "$conf/control.key"
for i in 1 2 3 4; do "$SETUP" "$conf" > "$tmpdir/race$i" & done
wait
[ "$(cat "$tmpdir"/race* | grep -c 'created .*control.key')" -ge 1 ] ||
    die "no start made the key"
[ "$(stat -c %s "$conf/control.key")" = 64 ] || die "raced key"
[ -z "$(find "$conf" -name '.control.key.*')" ] || die "temporary file left"
echo "test-systemd-setup: OK"

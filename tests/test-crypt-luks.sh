#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The crypt target against two third-party LUKS implementations, on a
# LUKS1 volume made by cryptsetup: with the volume key that
# "cryptsetup luksDump --dump-master-key" prints and the payload offset
# it shows, `0 N crypt aes-xts-plain64 KEY 0 VOLUME PAYLOAD` must read
# and write the same plaintext as nbdkit's luks filter and QEMU's luks
# driver (qemu-nbd --image-opts driver=luks) given only the passphrase:
#   - plaintext written through the mapper reads back through each;
#   - plaintext written through each (the luks filter in pieces of many
#     lengths) reads back through the mapper;
# for AES-256-XTS (a 512-bit key) and AES-128-XTS (256-bit), by each of
# the plugin's AES-XTS transforms the CPU runs: VAES on 512-bit
# registers, VAES on 256-bit ones (-D mapper.crypt_vaes256=1 where the
# 512-bit one runs; what CPUs without AVX-512 run), and OpenSSL's (-D
# mapper.crypt_openssl=1), the log saying which ran.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires cryptsetup --version
requires nbdkit --filter=luks null --dump-plugin
requires qemu-nbd --version
requires nbdsh --version
requires nbdcopy --version
requires cmp --version

mb=8                            # payload, MiB
pass=$tmpdir/pass
printf 'test-crypt-luks passphrase' > "$pass"

# check KEYBITS TRANSFORM: TRANSFORM (VAES, VAES-256 or OpenSSL) is the
# one the mapper must log that it uses.
check ()
{
    local bits=$1 transform=$2 f key given payload sectors
    local flag=()
    case $transform in
    VAES-256) flag=(-D mapper.crypt_vaes256=1) ;;
    OpenSSL) flag=(-D mapper.crypt_openssl=1) ;;
    esac
    f=$(mkfile "luks$bits.img" $(( (mb + 2) << 20 )))
    head -c $((bits / 8)) /dev/urandom > "$tmpdir/mk$bits"
    cryptsetup luksFormat --batch-mode --type luks1 \
        --cipher aes-xts-plain64 --key-size "$bits" --hash sha256 \
        --pbkdf-force-iterations 1000 --master-key-file "$tmpdir/mk$bits" \
        --key-file "$pass" "$f" || die "luksFormat failed"
    payload=$(cryptsetup luksDump "$f" | awk '/^Payload offset:/ { print $3 }')
    key=$(cryptsetup luksDump --dump-master-key --batch-mode \
              --key-file "$pass" "$f" |
              awk '/^MK dump:/ { on = 1; sub (/^MK dump:/, "") }
                   on && /^[[:space:]]*([0-9a-f][0-9a-f] )+/ { gsub (/[[:space:]]/, ""); printf "%s", $0; next }
                   on { on = 0 }')
    given=$(od -An -tx1 -v "$tmpdir/mk$bits" | tr -d ' \n')
    [ "$key" = "$given" ] ||
        die "$bits bits: luksDump printed key '$key', not the one given"
    sectors=$(( $(stat -c %s "$f") / 512 - payload ))
    [ "$sectors" -ge $((mb * 2048)) ] || die "payload of $sectors sectors"
    echo "0 $sectors crypt aes-xts-plain64 $key 0 $f $payload" \
        > "$tmpdir/luks$bits.table"
    local m="nbd+unix:///luks$bits?socket=$tmpdir/map.sock"
    local l="nbd+unix:///?socket=$tmpdir/lf.sock"
    local q="nbd+unix:///?socket=$tmpdir/qn.sock"

    start_server --stderr "$tmpdir/map.log" map -f -v "${flag[@]}" mapper \
        "$tmpdir/luks$bits.table"
    grep -q "crypt: AES-XTS by the $transform transform" "$tmpdir/map.log" ||
        { tail -20 "$tmpdir/map.log"; die "$bits bits: the mapper does not" \
                                          "say it uses the $transform transform"; }
    start_server lf --filter=luks file "$f" passphrase=+"$pass"
    [ "$(nbdinfo --size "$l")" = $((sectors * 512)) ] ||
        die "$bits bits: the luks filter's size is not $sectors sectors"

    # 1. Through the mapper, read by the luks filter.
    fill_random "$tmpdir/p1" $((sectors * 512)) "$bits"
    nbdcopy "$tmpdir/p1" "$m"
    nbdcopy "$l" "$tmpdir/got1"
    cmp "$tmpdir/p1" "$tmpdir/got1" ||
        die "$bits bits: written by crypt, the luks filter reads otherwise"

    # 2. Through the luks filter, pieces of many lengths (it advertises a
    #    512-byte minimum block size, which libnbd enforces), read by the
    #    mapper.
    fill_random "$tmpdir/p2" $((sectors * 512)) $((bits + 1))
    nbdsh -u "$l" -c "
d = open('$tmpdir/p2', 'rb').read()
cuts = [0, 512, 1536, 4096, 4608, 12800, 70144, 300032, len(d)]
for a, b in zip(cuts, cuts[1:]):
    h.pwrite(d[a:b], a)
h.flush()
"
    nbdcopy "$m" "$tmpdir/got2"
    cmp "$tmpdir/p2" "$tmpdir/got2" ||
        die "$bits bits: written by the luks filter, crypt reads otherwise"
    stop_server lf

    # 3. QEMU's luks driver: reads what the filter wrote; then writes.
    rm -f "$tmpdir/qn.sock" "$tmpdir/qn.pid"
    qemu-nbd -t -k "$tmpdir/qn.sock" --pid-file="$tmpdir/qn.pid" \
        --object secret,id=sec0,file="$pass" \
        --image-opts driver=luks,key-secret=sec0,file.filename="$f" &
    _started qn false
    wait_for test -S "$tmpdir/qn.sock" || die "qemu-nbd did not start"
    nbdcopy "$q" "$tmpdir/got3"
    cmp "$tmpdir/p2" "$tmpdir/got3" ||
        die "$bits bits: qemu's luks driver reads the volume otherwise"
    fill_random "$tmpdir/p3" $((sectors * 512)) $((bits + 2))
    nbdcopy "$tmpdir/p3" "$q"
    stop_server qn
    nbdcopy "$m" "$tmpdir/got4"
    cmp "$tmpdir/p3" "$tmpdir/got4" ||
        die "$bits bits: written by qemu's luks driver, crypt reads otherwise"
    stop_server map
    echo "$0: $bits-bit LUKS1 volume: crypt ($transform transform)," \
         "nbdkit's luks filter and qemu's luks driver agree"
}

# Every transform the CPU runs (the plugin says which it would use at
# start, before any table): with VAES on 512-bit registers, the 256-bit
# one too; OpenSSL's everywhere.
mkdir "$tmpdir/none"
said=$(mapper -v -U - tables="$tmpdir/none" --run true 2>&1) ||
    die "the plugin did not start: $said"
best=$(sed -n 's/.*crypt: AES-XTS by the \([^ ]*\) transform.*/\1/p' \
           <<< "$said" | head -n 1)
case $best in
VAES) transforms="VAES VAES-256 OpenSSL" ;;
VAES-256) transforms="VAES-256 OpenSSL" ;;
OpenSSL) transforms=OpenSSL ;;
*) die "the plugin does not say which AES-XTS transform it uses" ;;
esac
for t in $transforms; do
    check 512 "$t"
    check 256 "$t"
done

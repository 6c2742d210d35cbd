#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Bad input to the thin-pool and thin targets and to the pool's messages:
# each one refused with a message naming the argument, and nothing
# changed (no device made, the pool's status and metadata as they were).
source "$(dirname "$0")/functions-ms.sh"
requires thin_check -V
requires nbdsh --version

md=$(mkfile md.img 4M)
data=$(mkfile data.img 16M)
small=$(mkfile small.img 4K)
mkdir "$tmpdir/tables"
start_server --stderr "$tmpdir/log" ctl -f mapper tables="$tmpdir/tables"

# refused PATTERN TABLE: creating a device with TABLE fails so, and
# leaves no device behind.
refused ()
{
    fails "$1" ms create bad --table "$2"
    ! ms info bad >/dev/null 2>&1 || die "device 'bad' exists after: $2"
}

# thin-pool's table.
refused 'thin-pool: expected <metadata dev> <data dev> <data block size> <low water mark>.*got 3 arguments' \
    "0 32768 thin-pool $md $data 128"
refused "invalid data block size 'x' \(sectors, 128 to 2097152\)" \
    "0 32768 thin-pool $md $data x 10"
refused "invalid data block size '64' \(sectors, 128 to 2097152\)" \
    "0 32768 thin-pool $md $data 64 10"
refused "invalid data block size '4194304'" \
    "0 32768 thin-pool $md $data 4194304 10"
refused 'data block size 192 sectors is not a multiple of 128' \
    "0 32768 thin-pool $md $data 192 10"
refused "invalid low water mark '-1' \(blocks" \
    "0 32768 thin-pool $md $data 128 -1"
refused "unrecognised pool feature 'zero_blocks' \(expected skip_block_zeroing" \
    "0 32768 thin-pool $md $data 128 10 1 zero_blocks"
refused '2 feature arguments declared but 1 given' \
    "0 32768 thin-pool $md $data 128 10 2 read_only"
refused 'invalid number of feature arguments' \
    "0 32768 thin-pool $md $data 128 10 x"
refused 'metadata and data devices are the same' \
    "0 32768 thin-pool $data $data 128 10"
refused 'smaller than one data block' \
    "0 64 thin-pool $md $data 128 10"
refused 'data device: .*beyond the end of the device' \
    "0 65536 thin-pool $md $data 128 10"
refused 'metadata device: .*nosuch' \
    "0 32768 thin-pool $tmpdir/nosuch $data 128 10"
refused "metadata device $small is too small" \
    "0 32768 thin-pool $small $data 128 10"
# Nothing was written to the metadata device by any of those.
cmp "$md" <(head -c 4M /dev/zero) || die "a refused table wrote metadata"

ms create pool --table "0 32768 thin-pool $md $data 128 10"
ms message pool 0 create_thin 1
before=$(ms status pool)

# A second pool on the same metadata with another block size, or on the
# same data device.
refused 'is in use by a pool with a data block size of 128 sectors, not 256' \
    "0 32768 thin-pool $md $data 256 10"
md2=$(mkfile md2.img 4M)
refused 'is already the data device of the pool' \
    "0 32768 thin-pool $md2 $data 128 10"
# Nor a reload of a pool onto another pool's data device (the pool made
# last is found first on its own metadata device: the check still looks
# at every other pool).
md3=$(mkfile md3.img 4M)
data3=$(mkfile data3.img 16M)
ms create pool3 --table "0 32768 thin-pool $md3 $data3 128 10"
before3=$(ms table pool3)
fails "data device $data is already the data device of the pool on metadata device $md" \
    ms reload pool3 --table "0 32768 thin-pool $md3 $data 128 10"
[ "$(ms table pool3)" = "$before3" ] || die "pool3 changed: $(ms table pool3)"
ms info pool3 | grep -q '^Tables present: *LIVE$' ||
    die "a table was loaded: $(ms info pool3)"
# Nor a new pool on the data device of another pool's inactive table:
# that pool's resume binds it there (either order, two pools on one
# data device).
data4=$(mkfile data4.img 16M)
md4=$(mkfile md4.img 4M)
ms reload pool3 --table "0 32768 thin-pool $md3 $data4 128 10"
fails "data device $data4 is already the data device of the pool on metadata device $md3" \
    ms create pool4 --table "0 32768 thin-pool $md4 $data4 128 10"
ms info pool4 >/dev/null 2>&1 && die "pool4 was made"
ms clear pool3
ms create pool4 --table "0 32768 thin-pool $md4 $data4 128 10"
fails "data device $data4 is already the data device of the pool on metadata device $md4" \
    ms reload pool3 --table "0 32768 thin-pool $md3 $data4 128 10"
ms remove pool4
ms remove pool3
# A reload of the pool may not shrink it.
data_s=$(mkfile data-small.img 8M)
fails 'cannot shrink' ms reload pool --table "0 16384 thin-pool $md $data_s 128 10"

# thin's table.
refused 'thin: expected <pool dev> <dev id> \[<external origin dev>\], got 1 argument' \
    "0 2048 thin mapper:pool"
refused 'got 4 arguments' "0 2048 thin mapper:pool 1 $data x"
refused "pool device '$data' is not a device of this server" \
    "0 2048 thin $data 1"
refused "pool device: .*no such device 'nopool'" "0 2048 thin mapper:nopool 1"
ms create lin --table "0 2048 linear $data 0"
refused 'pool device mapper:lin has no live thin-pool target' \
    "0 2048 thin mapper:lin 1"
refused "invalid device id 'x' \(0 to 16777215\)" "0 2048 thin mapper:pool x"
refused "invalid device id '16777216'" "0 2048 thin mapper:pool 16777216"
refused 'pool mapper:pool has no thin device 7 \(create it with: nbdmsetup message pool 0 create_thin 7\)' \
    "0 2048 thin mapper:pool 7"
refused 'external origin: .*nosuch' "0 2048 thin mapper:pool 1 $tmpdir/nosuch"

# Messages.
fails "unrecognised message 'create' \(expected create_thin" \
    ms message pool 0 create 2
fails 'create_thin takes 1 argument, got 0' ms message pool 0 create_thin
fails 'create_snap takes 2 arguments, got 1' ms message pool 0 create_snap 2
fails 'set_transaction_id takes 2 arguments, got 3' \
    ms message pool 0 set_transaction_id 0 1 2
fails 'reserve_metadata_snap takes 0 arguments, got 1' \
    ms message pool 0 reserve_metadata_snap x
fails "create_thin: invalid device id 'x'" ms message pool 0 create_thin x
fails "create_thin: invalid device id '16777216'" \
    ms message pool 0 create_thin 16777216
fails 'create_thin: device 1 already exists' ms message pool 0 create_thin 1
fails 'create_snap: device 1 already exists' ms message pool 0 create_snap 1 1
fails 'create_snap: device 5 does not exist' ms message pool 0 create_snap 2 5
fails 'delete: device 5 does not exist' ms message pool 0 delete 5
ms create t1 --table "0 2048 thin mapper:pool 1"
ms info pool | grep -Eq '^Holders: +t1$' || die "holders: $(ms info pool)"
# The pool device may not swap its pool under a thin volume (another
# metadata and data device, or no thin-pool at all): the thin's I/O
# would reach another data device at this pool's block offsets.
data2=$(mkfile data2.img 16M)
ms reload pool --table "0 32768 thin-pool $md2 $data2 128 10"
fails "device 't1' \(its live table\): thin volume 1 of the pool on metadata device $md needs that pool on mapper:pool" \
    ms resume pool
fails "thin volume 1 of the pool on metadata device" \
    ms replace pool --table "0 32768 linear $data 0"
ms clear pool
ms table pool | grep -q "^0 32768 thin-pool $md $data 128 10 0$" ||
    die "pool table changed: $(ms table pool)"
nbdsh -u "nbd+unix:///t1?socket=$sock" -c 'h.pwrite(b"y" * 4096, 0); h.flush()'
before=$(ms status pool)
fails 'delete: device 1 is open' ms message pool 0 delete 1
fails 'set_transaction_id: the transaction id is 0, not 3' \
    ms message pool 0 set_transaction_id 3 4
fails "set_transaction_id: invalid transaction id 'x'" \
    ms message pool 0 set_transaction_id 0 x
fails 'release_metadata_snap: no metadata snapshot held' \
    ms message pool 0 release_metadata_snap
fails 'does not accept messages' ms message t1 0 create_thin 3
[ "$(ms status pool)" = "$before" ] ||
    die "status changed: $before -> $(ms status pool)"
# And the pool still works.
ms message pool 0 set_transaction_id 0 1
ms status pool | grep -q '^0 32768 thin-pool 1 ' || die "transaction id 1"

fails "device .pool. is in use by device .t1." ms remove pool
ms remove t1
ms remove lin
stop_server ctl
thin_check "$md" || die "thin_check"
echo "$0: ok"

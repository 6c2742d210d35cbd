#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Byte-granular reads, writes, zero, trim, flush, FUA and extents at every
# target edge and every stripe chunk edge, checked against an independent
# Python model of the mapping (which byte of which backing file each device
# byte lands on), and finally byte for byte against the backing files.
# The model and the checks: tests/rw_edges.py.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'

# ---------------------------------------------------------------------------
# Device "mixed": linear over three files, a 3-stripe set with a 3-sector
# chunk, a zero target, more linear, a 2-stripe set with a 4-sector chunk.
setup_mixed ()
{
    local dir=$1 fill=$2 f
    mkdir -p "$dir"
    for f in A B C S0 S1 S2; do
        truncate -s 0 "$dir/$f"
        if [ "$fill" = random ]; then
            fill_random "$dir/$f" $(( 256 * 1024 )) "$RANDOM"
        else
            truncate -s $(( 256 * 1024 )) "$dir/$f"
        fi
    done
    cat > "$dir/mixed.table" <<EOF
# start length target args
0   100 linear $dir/A 7
100 50  linear $dir/B 0
150 90  striped 3 3 $dir/S0 1 $dir/S1 0 $dir/S2 5
240 20  zero
260 33  linear $dir/C 11
293 1   linear $dir/A 200
294 24  striped 2 4 $dir/B 60 $dir/C 50
EOF
}

# Device "pow2": a power-of-two stripe set (4 stripes, chunk 8) that starts
# at an odd sector, and linear after it.
setup_pow2 ()
{
    local dir=$1 fill=$2 f
    mkdir -p "$dir"
    for f in A P0 P1 P2 P3; do
        truncate -s 0 "$dir/$f"
        if [ "$fill" = random ]; then
            fill_random "$dir/$f" $(( 128 * 1024 )) "$RANDOM"
        else
            truncate -s $(( 128 * 1024 )) "$dir/$f"
        fi
    done
    cat > "$dir/pow2.table" <<EOF
0 5 linear $dir/A 100
5 256 striped 4 8 $dir/P0 0 $dir/P1 3 $dir/P2 8 $dir/P3 1
261 7 linear $dir/A 3
EOF
}

# Device "odd": degenerate stripe sets: one stripe, a chunk as long as a
# whole stripe, a one-sector chunk; and a one-sector zero target.
setup_odd ()
{
    local dir=$1 fill=$2 f
    mkdir -p "$dir"
    for f in A B C; do
        truncate -s 0 "$dir/$f"
        if [ "$fill" = random ]; then
            fill_random "$dir/$f" $(( 64 * 1024 )) "$RANDOM"
        else
            truncate -s $(( 64 * 1024 )) "$dir/$f"
        fi
    done
    cat > "$dir/odd.table" <<EOF
0  7  striped 1 7 $dir/A 3
7  30 striped 5 6 $dir/B 1 $dir/C 2 $dir/A 50 $dir/B 20 $dir/C 30
37 1  zero
38 2  striped 2 1 $dir/A 90 $dir/B 40
40 9  linear $dir/C 100
EOF
}

run_model ()
{
    local mode=$1 table=$2 seed=$3
    mapper -U - "$table" \
        --run "python3 '$top_srcdir/tests/rw_edges.py' $mode \"\$uri\" '$table' $seed" ||
        die "$mode on $(basename "$table") failed"
}

setup_mixed "$tmpdir/rw" random
run_model rw "$tmpdir/rw/mixed.table" 11

setup_pow2 "$tmpdir/rwp" random
run_model rw "$tmpdir/rwp/pow2.table" 12

setup_odd "$tmpdir/rwo" random
run_model rw "$tmpdir/rwo/odd.table" 15

# Extents on sparse backing files.
setup_mixed "$tmpdir/ext" sparse
run_model extents "$tmpdir/ext/mixed.table" 13

setup_pow2 "$tmpdir/extp" sparse
run_model extents "$tmpdir/extp/pow2.table" 14

setup_odd "$tmpdir/exto" sparse
run_model extents "$tmpdir/exto/odd.table" 16

echo "$0: ok"

#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The restart property (restart_property.py): after random sequences of
# control commands over stacked and unstacked devices, a server started
# on a copy of tables=DIR serves the same devices with the same tables.
# NBDMAPPER_PROPERTY_SEQUENCES and NBDMAPPER_PROPERTY_SEED override the
# count (200; 60 under the sanitizers, whose nbdkit starts slowly) and
# the seed (the day, so that runs cover new sequences; a failure prints
# the seed and the commands).
source "$(dirname "$0")/functions-ms.sh"
requires python3 -c 'import nbd'

dir=$tmpdir/tables
mkdir "$dir"
start_server ctl mapper tables="$dir"
if [ -n "$SANITIZER_LIBASAN" ]; then
    n=${NBDMAPPER_PROPERTY_SEQUENCES:-60}
else
    n=${NBDMAPPER_PROPERTY_SEQUENCES:-200}
fi
seed=${NBDMAPPER_PROPERTY_SEED:-$(date +%Y%m%d)}
echo "$0: $n sequences, seed $seed"
DIR=$dir WORK=$tmpdir \
    python3 "$(dirname "$0")/restart_property.py" "$n" "$seed"
echo "$0: ok"

#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# More devices than nbdkit will list (10,000): list_exports shows the first
# 10,000 instead of failing the whole NBD_OPT_LIST, and a device past the
# limit still opens by name.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"
requires nbdkit --version
requires nbdsh --version

b=$(mkfile b.img 1M)
mkdir "$tmpdir/t"
for (( i = 0; i < 10005; i++ )); do
    printf -v name 'd%05d' "$i"
    echo "0 8 linear $b $(( i % 256 * 8 ))" > "$tmpdir/t/$name.table"
done
mapper -U - tables="$tmpdir/t" --run 'nbdsh -c "
h.set_opt_mode(True)
h.connect_unix(\"$unixsocket\")
names = []
h.opt_list(lambda name, desc: names.append(name))
assert len(names) == 10000, len(names)
assert names[0] == \"d00000\" and names[-1] == \"d09999\", (names[0], names[-1])
h.set_export_name(\"d10004\")
h.opt_go()
assert h.get_size() == 4096
"'

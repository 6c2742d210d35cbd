#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The crypt target's 256-bit VAES transform is for CPUs without AVX-512
# (Zen 3, Intel's client CPUs), and this machine has AVX-512, so running
# it here cannot show that it never executes an AVX-512 instruction
# (qemu-user's TCG has no VPCLMULQDQ to emulate such a CPU).  This reads
# the built plugin instead: every function reachable by direct calls and
# jumps from what the 256-bit path runs (its conversion, the key
# schedule, the wipes) must be free of AVX-512: no zmm register, no
# xmm/ymm16-31, no opmask, no EVEX-only instruction.  One call is
# allowed by name: xts_clear_vectors calls xts_clear_zmm only where the
# CPU has AVX-512 (__builtin_cpu_supports), which is checked too.  The
# 512-bit path must show AVX-512, or the check would see nothing.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires objdump --version
requires /usr/bin/python3 --version
[ "$(uname -m)" = x86_64 ] || skip "not x86-64: no VAES transform"

/usr/bin/python3 - "$PLUGIN" <<'EOF' || die "an AVX-512 instruction is reachable from the 256-bit VAES path"
import re, subprocess, sys

so = sys.argv[1]
out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", so],
                     check=True, capture_output=True, text=True).stdout
funcs, cur = {}, None
for line in out.splitlines():
    m = re.match(r"^[0-9a-f]+ <([^>]+)>:$", line)
    if m:
        cur = funcs.setdefault(m.group(1), [])
    elif cur is not None and re.match(r"^\s+[0-9a-f]+:\t", line):
        cur.append(line.split("\t", 1)[1].strip())

avx512 = re.compile(r"%zmm|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|%k[0-7]\b|\{%k"
                    r"|\bvpternlog|\bvpshl?dv?[dqw]\b|\bvpshrdv?[dqw]\b"
                    r"|\bvmovdq[au](8|16|32|64)\b|\bvp(xor|and|or)[dq]\b"
                    r"|\bvbroadcasti(32|64)x")
call = re.compile(r"\b(call|jmp|j[a-z]+)\s+[0-9a-f]+ <([^>+@]+)(\+0x[0-9a-f]+)?>")
# Calls that only run where the CPU has AVX-512, each checked below.
guarded = {("xts_clear_vectors", "xts_clear_zmm")}

roots = ["xts_vaes256_convert", "xts_vaes_keys", "xts_stack_wipe",
         "xts_clear_vectors"]
for r in roots:
    if r not in funcs:
        sys.exit("test-crypt-isa: no function %s in %s" % (r, so))
# The conversion calls its variants through a pointer: each a root.
variants = [f for f in funcs if f.startswith("xts_vaes256_") and
            f != "xts_vaes256_convert" and f != "xts_vaes256_usable"]
if len(variants) < 4:
    sys.exit("test-crypt-isa: the 256-bit variants (xts_vaes256_enc10...) "
             "are not in %s: %s" % (so, variants))
roots += variants
seen, todo, bad = set(), list(roots), []
while todo:
    f = todo.pop()
    if f in seen:
        continue
    seen.add(f)
    for insn in funcs.get(f, []):
        if avx512.search(insn):
            bad.append("%s: %s" % (f, insn))
        m = call.search(insn)
        if m and m.group(2) in funcs and m.group(2) != f and \
           (f, m.group(2)) not in guarded:
            todo.append(m.group(2))
for b in bad[:20]:
    print("test-crypt-isa: AVX-512 on the 256-bit path:", b)
print("test-crypt-isa: %d functions reachable from the 256-bit path: %s"
      % (len(seen), " ".join(sorted(seen))))

# The guarded call is there, and under a CPU check in its caller: a call
# of __cpu_indicator_init / a read of __cpu_model before it.
cv = funcs["xts_clear_vectors"]
calls_zmm = [i for i, s in enumerate(cv) if "<xts_clear_zmm>" in s]
checks = [i for i, s in enumerate(cv) if "__cpu_model" in s or
          "__cpu_indicator_init" in s]
if not calls_zmm or not checks or min(checks) > min(calls_zmm):
    bad.append("xts_clear_vectors: no CPU check before xts_clear_zmm")
    print("test-crypt-isa: xts_clear_vectors does not check the CPU before "
          "calling xts_clear_zmm")

# The check sees AVX-512 where it is: the 512-bit path.
if not any(avx512.search(s) for s in funcs.get("xts_clear_zmm", [])) or \
   not any(avx512.search(s) for f, body in funcs.items()
           if f.startswith("xts_vaes_enc") for s in body):
    bad.append("the 512-bit path shows no AVX-512: the check sees nothing")
    print("test-crypt-isa: found no AVX-512 in the 512-bit path either")
sys.exit(1 if bad else 0)
EOF
echo "$0: the 256-bit VAES path reaches no AVX-512 instruction"

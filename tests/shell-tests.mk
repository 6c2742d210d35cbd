# SPDX-License-Identifier: BSD-3-Clause
# Integration tests: shell scripts driving a captive nbdkit with real NBD
# clients (nbdinfo, nbdsh/python3-libnbd, qemu-img, nbdcopy, fio, nbdfuse).
# Each may exit 77 to skip when a tool or a privilege is missing.
SHELL_TESTS = \
	test-harness.sh \
	test-layering.sh \
	test-info.sh \
	test-bad-tables.sh \
	test-rw-edges.sh \
	test-error-target.sh \
	test-striped-extents.sh \
	test-beyond-end.sh \
	test-large-requests.sh \
	test-many-targets.sh \
	test-debug-io.sh \
	test-shared-backing.sh \
	test-blockdev.sh \
	test-qemu.sh \
	test-fio.sh \
	test-ext4.sh \
	test-ext4-mount-ns.sh \
	test-mirror.sh \
	test-mirror-remote.sh \
	test-mirror-read-balance.sh \
	test-stacking.sh \
	test-flush-dedup.sh \
	test-delay.sh \
	test-flakey.sh \
	test-flakey-ext4.sh \
	test-crypt.sh \
	test-crypt-luks.sh \
	test-crypt-isa.sh \
	test-remote-basic.sh \
	test-remote-striped.sh \
	test-remote-reconnect.sh \
	test-remote-timeout.sh \
	test-remote-tls.sh \
	test-remote-caps.sh \
	test-remote-flush.sh \
	test-remote-errseq.sh \
	test-remote-loss-elsewhere.sh \
	test-remote-netns.sh \
	test-multipath.sh \
	test-multipath-nopath.sh \
	test-multipath-groups.sh \
	test-multipath-persist.sh \
	test-multipath-flush.sh \
	test-multipath-caps.sh \
	test-multipath-netns.sh \
	test-multipath-stall.sh \
	test-remote-multiconn.sh \
	test-remote-replies.sh \
	test-remote-lookup.sh \
	test-remote-direct.sh \
	test-remote-inline.sh \
	test-remote-inline-poll.sh \
	test-remote-parked-status.sh \
	test-list-exports-limit.sh

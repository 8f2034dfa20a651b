#!/bin/bash
# 64: io-read-bandwidth-max / io-write-bandwidth-max (per block device) reach the team slice's
# io.max through systemd; they read back as set (a second reconcile changes nothing); a drop-in
# with "infinity" lifts one of them; the generator writes them into the boot-time unit file.
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

# The guest's first whole disk (io.max takes whole disks, not partitions).
disk=$(for d in /sys/block/*; do case ${d##*/} in loop*|ram*|sr*) ;; *) echo "${d##*/}"; break ;; esac; done)
dev=/dev/$disk
majmin=$(cat "/sys/block/$disk/dev")
echo "disk: $dev ($majmin)"
io=/sys/fs/cgroup/gpu.slice/gpu-infer.slice/io.max

gpuctld_setup
put_policy 10-io.toml <<P
version = 1
[teams.infer]
io-weight = 50
io-read-bandwidth-max = { "$dev" = "10M" }
io-write-bandwidth-max = { "$dev" = 2097152 }
[[gpu]]
index = [0]
owner = "infer"
P
check_output "policy validates" gpuctl validate
gpuctld_start
wait_for 30 grep -q "^$majmin .*rbps=10000000" "$io"
echo "--- $io:"; cat "$io"
check "io.max: read 10M (powers of 1000, as systemd), write 2 MiB" grep -q "^$majmin rbps=10000000 wbps=2097152 " "$io"
check "systemd holds IOReadBandwidthMax" test "$(systemctl show -P IOReadBandwidthMax gpu-infer.slice)" = "$dev 10000000"
check "systemd holds IOWriteBandwidthMax" test "$(systemctl show -P IOWriteBandwidthMax gpu-infer.slice)" = "$dev 2097152"
# Read back through D-Bus (a(st)) equals what was set: a second reconcile sets nothing.
before=$(gpuctld_journal | grep -c '^set gpu-')
check "the first reconcile logged its slice change ('set gpu-...': $before)" test "$before" -ge 1
reload_wait
after=$(gpuctld_journal | grep -c '^set gpu-')
check "second reconcile changes nothing (read-back matches)" test "$before" = "$after"
check_output "gpuctl plan shows the limits" sh -c "gpuctl plan | grep -F 'read $dev 10MB/s write $dev 2097152B/s'"
# A later drop-in lifts the write limit; the read limit stays.
put_policy 20-io.toml <<'P'
version = 1
[teams.infer]
io-write-bandwidth-max = "infinity"
P
wait_for 30 grep -q "^$majmin rbps=10000000 wbps=max " "$io"
echo "--- $io after the drop-in:"; cat "$io"
check "write limit lifted, read limit kept" grep -q "^$majmin rbps=10000000 wbps=max " "$io"
check_empty "systemd's IOWriteBandwidthMax is empty" systemctl show -P IOWriteBandwidthMax gpu-infer.slice
# The generator writes the limits for boot (before gpuctld runs).
out=$(mktemp -d)
"$(dpkg -L gpuctl | grep "/gpuctl-generator$")" "$out" "$out" "$out"
echo "--- generated gpu-infer.slice:"; cat "$out/gpu-infer.slice"
check "generator writes IOReadBandwidthMax" grep -qx "IOReadBandwidthMax=$dev 10000000" "$out/gpu-infer.slice"
check_not "generator writes no IOWriteBandwidthMax" grep -q IOWriteBandwidthMax "$out/gpu-infer.slice"
finish

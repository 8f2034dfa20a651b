#!/bin/bash
# 56: boot without gpuctld: the generator alone puts gpu-<team>.slice with limits and
# DeviceAllow in place from the last applied state. Simulated boot in one guest: apply once,
# stop and disable gpuctld, drop the runtime drop-ins, re-run generators (daemon-reload), then
# start a service with Slice=gpu-infer.slice.
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
memory-max = "96M"
tasks-max = 77
[[gpu]]
index = [0]
owner = "infer"
P
gpuctld_start
# The line whose absence below shows "no change": the first run logs it when it sets the slice.
check "the first run logged 'set gpu-infer.slice'" wait_for 20 journal_has '^set gpu-infer.slice'
systemctl stop gpuctld.service
systemctl stop gpu-infer.slice
rm -rf /run/systemd/system.control/gpu-*.slice.d
systemctl daemon-reload
echo "--- /run/systemd/generator/gpu-infer.slice"; cat /run/systemd/generator/gpu-infer.slice
check "generator wrote gpu-infer.slice" test -f /run/systemd/generator/gpu-infer.slice
check "unit comes from the generator" test "$(systemctl show -P FragmentPath gpu-infer.slice)" = /run/systemd/generator/gpu-infer.slice
check "no runtime drop-ins left" test -z "$(systemctl show -P DropInPaths gpu-infer.slice)"
cat > /etc/systemd/system/infer-job.service <<'U'
[Service]
Slice=gpu-infer.slice
ExecStart=/bin/sleep 600
U
systemctl daemon-reload
systemctl start infer-job.service
check "gpuctld not running" sh -c "! systemctl is-active -q gpuctld.service"
check "job landed in gpu-infer.slice" test "$(systemctl show -P ControlGroup infer-job.service)" = /gpu.slice/gpu-infer.slice/infer-job.service
check "memory.max from the generator" test "$(cat /sys/fs/cgroup/gpu.slice/gpu-infer.slice/memory.max)" = 100663296
check "pids.max from the generator" test "$(cat /sys/fs/cgroup/gpu.slice/gpu-infer.slice/pids.max)" = 77
r=$(probe gpu-infer.slice /dev/nvidia0); check "own GPU (ENXIO)" test "$r" = ENXIO
r=$(probe gpu-infer.slice /dev/nvidia1); check "other GPU (EPERM)" test "$r" = EPERM
# gpuctld starting later finds the slice already right and changes nothing.
systemctl start gpuctld.service
check_not "gpuctld converges with no slice change" grep -q '^set gpu-infer.slice' <(gpuctld_journal _PID="$(systemctl show -P MainPID gpuctld.service)")
systemctl stop infer-job.service
finish

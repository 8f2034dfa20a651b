#!/bin/bash
# 76: a member joins a team the policy gives no devices: the scope lands in the device-closed
# slice, nothing is allowed, the env says GPUCTL_DEVICES=none; exit 5 only when the policy gives
# the team a GPU that is missing now, and the message names it.
# vmtest: group=own
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

shell_setup
out=$(as alice "gpuctl run --team empty -- sh -c 'cat /proc/self/cgroup; env | grep -E \"^(GPUCTL|CUDA|NVIDIA)_\" | sort'" 2>&1); rc=$?
echo "$out"
check "alice joins the device-less team (exit 0)" test $rc = 0
check "in a scope of gpu-empty.slice" grep -Eq '^0::/gpu.slice/gpu-empty.slice/gpuctl-run-[0-9a-f]{16}.scope$' <<<"$out"
check "the env says so" grep -qx 'GPUCTL_DEVICES=none' <<<"$out"
check "no CUDA device" grep -qx 'CUDA_VISIBLE_DEVICES=' <<<"$out"
check "the slice is device-closed" test "$(systemctl show -P DevicePolicy gpu-empty.slice)" = closed
r=$(probe_in empty alice /dev/nvidia0); echo "alice in empty -> /dev/nvidia0: $r"
check "no GPU opens from there (EPERM)" test "$r" = EPERM
# A team whose GPU is missing now: exit 5, naming what the policy gives it.
put_policy 70-ghost.toml <<'P'
version = 1
[teams.ghost]
members = ["alice"]
[[gpu]]
index = [7]
owner = "ghost"
P
reload_wait
msg=$(as alice 'gpuctl run --team ghost -- true' 2>&1); rc=$?
echo "ghost: rc=$rc: $msg"
check "exit 5 for a team whose GPU is missing" test $rc = 5
check "the message names the policy entry" grep -q 'index 7, owned' <<<"$msg"
finish

#!/bin/bash
# 51: a process over MemoryMax in one team is OOM-killed while another team's process lives on.
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
memory-max = "64M"
[teams.train]
memory-max = "512M"
[[gpu]]
index = [0]
owner = "infer"
[[gpu]]
index = [1]
owner = "train"
P
gpuctld_start
check "limits live" test "$(cat /sys/fs/cgroup/gpu.slice/gpu-infer.slice/memory.max)" = 67108864
systemd-run -q --unit=train-job --slice=gpu-train.slice sleep 600
systemctl show -p ActiveState -p Slice train-job.service
# `tail` keeps the current (newline-free) line in memory: 300M of zeros outgrows 64M.
systemd-run -q --unit=infer-hog --slice=gpu-infer.slice -p MemorySwapMax=0 sh -c 'head -c 300M /dev/zero | tail > /dev/null'
wait_for 30 sh -c '! systemctl is-active -q infer-hog.service'
res=$(systemctl show -P Result infer-hog.service); echo "infer-hog Result=$res"
check "hog in gpu-infer.slice OOM-killed" test "$res" = oom-kill
echo "memory.events of gpu-infer.slice: $(tr '\n' ' ' < /sys/fs/cgroup/gpu.slice/gpu-infer.slice/memory.events)"
check "train job lives on" systemctl is-active -q train-job.service
systemctl stop train-job.service
finish

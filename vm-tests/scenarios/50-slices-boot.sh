#!/bin/bash
# 50: team slices from a policy: limits, DevicePolicy=closed + DeviceAllow live; a service in
# gpu-infer.slice opens its own /dev/nvidia0 (ENXIO: allowed, no driver) and gets EPERM on
# another team's; STATUS=; structured journal fields; the state file the generator reads.
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
memory-max = "256M"
memory-high = "200M"
cpu-weight = 300
allowed-cpus = "0"
tasks-max = 128
io-weight = 200
[teams.train]
memory-max = "512M"
[[gpu]]
index = [0]
owner = "infer"
[[gpu]]
index = [1]
owner = "train"
P
t0=$(date +%s%N)
gpuctld_start
echo "gpuctld start (READY=1) took $(( ($(date +%s%N)-t0)/1000000 )) ms"
systemctl show -p ActiveState -p StatusText gpuctld.service
check "StatusText says converged" status_converged 2 2
systemctl show -p ActiveState -p MemoryMax -p MemoryHigh -p CPUWeight -p AllowedCPUs -p TasksMax -p IOWeight -p DevicePolicy -p DeviceAllow gpu-infer.slice
check "gpu-infer.slice active" test "$(systemctl show -P ActiveState gpu-infer.slice)" = active
check "MemoryMax=256M" test "$(systemctl show -P MemoryMax gpu-infer.slice)" = 268435456
check "CPUWeight=300" test "$(systemctl show -P CPUWeight gpu-infer.slice)" = 300
check "AllowedCPUs=0" test "$(systemctl show -P AllowedCPUs gpu-infer.slice)" = 0
check "TasksMax=128" test "$(systemctl show -P TasksMax gpu-infer.slice)" = 128
check "DevicePolicy=closed" test "$(systemctl show -P DevicePolicy gpu-infer.slice)" = closed
da=$(systemctl show -P DeviceAllow gpu-infer.slice)
# rwm: a container engine under the slice creates the team's nodes with mknod (docs/containers.md)
check "DeviceAllow has nvidia0 rwm" sh -c "echo '$da' | grep -q '/dev/nvidia0 rwm'"
check "DeviceAllow lacks nvidia1" sh -c "! echo '$da' | grep -q '/dev/nvidia1 '"
cg=/sys/fs/cgroup/gpu.slice/gpu-infer.slice
echo "cgroupfs: memory.max=$(cat $cg/memory.max) memory.high=$(cat $cg/memory.high) cpu.weight=$(cat $cg/cpu.weight) pids.max=$(cat $cg/pids.max) cpuset.cpus=$(cat $cg/cpuset.cpus)"
check "cgroupfs memory.max" test "$(cat $cg/memory.max)" = 268435456
check "cgroupfs pids.max" test "$(cat $cg/pids.max)" = 128
r=$(probe gpu-infer.slice /dev/nvidia0); echo "infer -> nvidia0: $r"; check "own GPU allowed (ENXIO)" test "$r" = ENXIO
r=$(probe gpu-infer.slice /dev/nvidia1); echo "infer -> nvidia1: $r"; check "other team's GPU denied (EPERM)" test "$r" = EPERM
r=$(probe gpu-train.slice /dev/nvidia1); echo "train -> nvidia1: $r"; check "train's own GPU (ENXIO)" test "$r" = ENXIO
r=$(probe gpu-infer.slice /dev/nvidiactl); check "nvidiactl allowed (ENXIO)" test "$r" = ENXIO
ls /run/systemd/system.control/gpu-infer.slice.d/ 2>/dev/null && cat /run/systemd/system.control/gpu-infer.slice.d/50-DeviceAllow.conf
check "state file for the generator" grep -q '"infer"' /var/lib/gpuctl/slices.json
# The devices by NVML UUID, as the fake NVML reports them.
check_output "team env file names GPU 0 by UUID" grep -x "CUDA_VISIBLE_DEVICES=$(gpu_uuid 0)" /run/gpuctl/teams/infer.env
j=$(journalctl --since "@$VMTEST_SCENARIO_START" -o verbose GPUCTL_TEAM=infer GPUCTL_ACTION=slices --no-pager | grep -c 'GPUCTL_TEAM=infer')
echo "journal entries with GPUCTL_TEAM=infer GPUCTL_ACTION=slices: $j"
check "journald structured fields" test "$j" -ge 1
# Idempotent: a second reconcile changes nothing.
# The count below is of the line the first reconcile logged for each slice it set: it exists.
before=$(gpuctld_journal | grep -c '^set gpu-')
check "the first reconcile logged its slice changes ('set gpu-...': $before)" test "$before" -ge 2
reload_wait
after=$(gpuctld_journal | grep -c '^set gpu-')
check "second reconcile changes nothing" test "$before" = "$after"
finish

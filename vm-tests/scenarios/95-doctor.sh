#!/bin/bash
# `gpuctl doctor` on a real systemd + cgroup v2 host: the host checks read the guest's own
# cgroup2 hierarchy, systemd (as init, version from libsystemd-shared-N.so) and kernel config;
# without a driver NVML and the kernel module FAIL and doctor exits 1. With faked NVIDIA
# hardware (device nodes 195:N, /proc/devices and mig-minors overlays, the fake NVML with an
# H100 in MIG mode) nothing FAILs; --record writes a recording that replays to the same
# report and the same recording.
# vmtest: group=pkg
# vmtest: timeout=600
. lib/common.sh
. lib/fake-hw.sh

out=$(GPUCTL_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 gpuctl doctor 2>&1)
rc=$?
_vm_show "$out" 40
if [ $rc -eq 1 ]; then pass "no driver: exit 1"; else fail "no driver: exit 1 (got $rc)"; fi
for l in "FAIL nvml: NVML not available" "FAIL kernel-module:" "OK   cgroup: cgroup v2" \
    "OK   systemd: running, version 252"; do
    if grep -qF -- "$l" <<<"$out"; then pass "line: $l"; else fail "line: $l"; fi
done
# DeviceAllow= evidence: cgroup v2 + systemd 252 + CONFIG_CGROUP_BPF from /boot/config-$(uname -r)
# when the image has it (OK), else WARN naming what could not be verified; never FAIL here.
if grep -qE '^(OK +|WARN )device-control:' <<<"$out"; then
    pass "device-control is OK or WARN: $(grep device-control <<<"$out")"
else
    fail "device-control is OK or WARN"
fi

fake_gpus 1
lib=$(fake_nvml) || { fail "fake NVML not brought by the harness"; finish; }
fake_mps_control
# fake_mig_minors put a tmpfs over /proc/driver: the kernel module's version file goes there too.
mkdir -p /proc/driver/nvidia
printf 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  (vm-tests fake)\n' \
    >/proc/driver/nvidia/version
mkdir -p /run/vmtest-doctor
cat >/run/vmtest-doctor/state.json <<'JSON'
{"gpus": [{"model": "H100-SXM5-80GB", "mig": {"current": 1, "pending": 1},
  "gpu_instances": [{"id": 1, "profile_id": 9, "start": 4, "size": 4, "compute_instances": [
    {"id": 0, "profile_id": 2, "start": 0, "size": 3}]}]}],
 "processes": [{"pid": 4242, "gpu": 0, "gi": 1, "ci": 0, "used_memory_mib": 512}]}
JSON
export GPUCTL_NVML_LIBRARY=$lib FAKE_NVML_STATE=/run/vmtest-doctor/state.json
unset FAKE_NVML_SPEC FAKE_NVML_ROOT

out=$(gpuctl doctor 2>&1)
rc=$?
_vm_show "$out" 40
if [ $rc -eq 0 ]; then pass "faked hardware: exit 0"; else fail "faked hardware: exit 0 (got $rc)"; fi
if grep -q '^FAIL' <<<"$out"; then fail "no FAIL line"; else pass "no FAIL line"; fi
for l in "OK   majors.nvidia: nvidia major 195" "OK   node.nvidia0: /dev/nvidia0 195:0" \
    "OK   mig-minors:" "OK   cap-nodes: /dev/nvidia-caps: 2 nodes" "OK   gpu0.gi-profiles: 7 GI profiles" \
    "OK   gpu0.processes: 1: pid 4242 (gi1/ci0, 512 MiB)"; do
    if grep -qF -- "$l" <<<"$out"; then pass "line: $l"; else fail "line: $l"; fi
done
json=$(gpuctl doctor --json)
check "--json: every check has id, status, summary; fail count 0" \
    jq -e '(.checks | all(.id and .status and .summary)) and .fail == 0' <<<"$json"

check "--record" gpuctl doctor --record /run/vmtest-doctor/rec.json
cp /run/vmtest-doctor/rec.json /run/vmtest-doctor/replay.json
replayed=$(FAKE_NVML_STATE=/run/vmtest-doctor/replay.json gpuctl doctor --record /run/vmtest-doctor/rec2.json 2>&1)
if [ "$(grep -v '^recorded to' <<<"$replayed")" = "$out" ]; then
    pass "the replayed recording gives the same report"
else
    fail "the replayed recording gives the same report"
    _vm_show "$replayed" 40
fi
check "recording the replay gives the same recording" cmp /run/vmtest-doctor/rec.json /run/vmtest-doctor/rec2.json
check "doctor changed nothing in the fake (no mutating NVML call)" \
    jq -e '(.mutating_calls // 0) == 0' /run/vmtest-doctor/state.json
finish

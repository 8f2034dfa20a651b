#!/bin/bash
# 72: the policy removes team infer while alice's `gpuctl run` job runs on GPU 0 and gives GPU 0 to
# train: the GPU is not handed over while her job can still open it (blocked, holder named, status
# not "converged"); when the job ends, train gets it.
# vmtest: timeout=300
# vmtest: group=own
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

shell_setup
# alice's job in infer; the fake NVML sees its pid on GPU 0 (as the driver would).
as alice 'gpuctl run --team infer -- sleep 600' &
# Checked, not assumed: without the job nothing below holds GPU 0, and the checks test nothing.
check "alice's job started" wait_for 60 sh -c 'pgrep -u alice -x sleep >/dev/null' || finish
pid=$(pgrep -u alice -x sleep | head -1)
echo "alice's job: pid $pid, cgroup $(cat /proc/"$pid"/cgroup)"
jq ".processes += [{\"pid\": $pid, \"gpu\": 0, \"used_memory_mib\": 100}]" "$FAKE_NVML_STATE" >"$FAKE_NVML_STATE.new" && mv "$FAKE_NVML_STATE.new" "$FAKE_NVML_STATE"

put_policy 60-shell.toml <<'P'
version = 1
[teams.train]
members = ["@ml-train", "alice"]
[[gpu]]
index = [0, 1]
owner = "train"
P
reload_wait
echo "gpuctld: $(status_text)"
da=$(systemctl show -P DeviceAllow gpu-train.slice); echo "gpu-train.slice DeviceAllow: $da"
check_not "train does not get GPU 0 while infer's job runs" grep -q '/dev/nvidia0 ' <<<"$da"
check "train keeps its own GPU 1" grep -q '/dev/nvidia1 ' <<<"$da"
r=$(probe gpu-train.slice /dev/nvidia0); echo "train -> /dev/nvidia0: $r"
check "GPU 0 denied to train (EPERM)" test "$r" = EPERM
check "alice's job still runs" kill -0 "$pid"
check "status says not converged" is_not_converged "$(status_text)"
check_output "status says what waits and who holds it" sh -c "gpuctl status --json | jq -r '.last_reconcile.differs[]' | grep 'not handed over' | grep 'pid $pid'"
gpuctl status; rc=$?
check "gpuctl status exits non-zero while the host differs" test $rc != 0

# The job ends: the GPU moves.
kill "$pid"; wait 2>/dev/null
jq '.processes = []' "$FAKE_NVML_STATE" >"$FAKE_NVML_STATE.new" && mv "$FAKE_NVML_STATE.new" "$FAKE_NVML_STATE"
reload_wait
echo "gpuctld: $(status_text)"
check "train gets GPU 0 once the job ended" sh -c "systemctl show -P DeviceAllow gpu-train.slice | grep -q '/dev/nvidia0 '"
check "converged" status_converged
finish

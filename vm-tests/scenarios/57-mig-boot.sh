#!/bin/bash
# 57: MIG at boot. Two H100s through the fake NVML, MIG off, no instances (GPU and compute
# instances never survive a reboot); gpuctld starts as at boot and applies the geometry: GPU 0
# split into 3g.40gb for infer and 2g.20gb + 1g.10gb for train, GPU 1 whole to train. The cap
# nodes of every GI and CI exist under /dev/nvidia-caps with the nvidia-caps major from
# /proc/devices and the minors from /proc/driver/nvidia-caps/mig-minors; each team's DeviceAllow
# has exactly its own caps (plus the parent /dev/nvidia0), and its env names its MIG devices by
# UUID. A second start changes nothing on the GPUs. Driver calls that time out are retried
# within seconds.
# vmtest: timeout=240
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup 2
put_policy 10-mig.toml <<'P'
version = 1
[teams.infer]
memory-max = "256M"
[teams.train]
memory-max = "512M"
[[gpu]]
index = [0]
mig = [
  { profile = "3g.40gb", owner = "infer" },
  { profile = "2g.20gb", owner = "train" },
  { profile = "1g.10gb", owner = "train" },
]
[[gpu]]
index = [1]
owner = "train"
P
t0=$(date +%s%N)
gpuctld_start
echo "gpuctld start (first reconcile, MIG applied) took $((($(date +%s%N) - t0) / 1000000)) ms"
st=$(status_text)
echo "StatusText: $st"
# What gpuctld's mount namespace sees of the faked driver files (its sandbox is its own).
gpuctl plan 2>&1 | grep -E 'devices:|error' | sed 's/^/    plan| /'
echo "mig-minors as gpuctld sees it: $(nsenter -t "$(systemctl show -P MainPID gpuctld.service)" -m sh -c 'grep -c access /proc/driver/nvidia-caps/mig-minors' 2>&1)"
check "gpuctld converged" is_converged "$st" 2 2

S=$FAKE_NVML_STATE
check_output "fake NVML: MIG on for GPU 0" test "$(jq -r '.gpus[0].mig.current' "$S")" = 1
profiles=$(jq -r '[.gpus[0].gpu_instances[].profile_id] | sort | map(tostring) | join(",")' "$S")
check_output "GPU 0 holds exactly 3g.40gb (9), 2g.20gb (14), 1g.10gb (19)" test "$profiles" = "9,14,19"
check "GPU 1 stays whole (MIG off, no instances)" \
    test "$(jq -r '[.gpus[1].mig.current, (.gpus[1].gpu_instances | length)] | map(tostring) | join(" ")' "$S")" = "0 0"

caps_major=$(awk '$2 == "nvidia-caps" {print $1}' /proc/devices)
echo "nvidia-caps major from /proc/devices: $caps_major"
# caps_of PROFILE_IDS...: the cap node paths of the GIs with these profiles on GPU 0, and of
# their CIs, through mig-minors.
caps_of() {
    local want gi ci
    want=$(printf '%s,' "$@")
    for gi in $(jq -r --arg w ",$want" '.gpus[0].gpu_instances[] | select(.profile_id as $p | $w | contains("," + ($p | tostring) + ",")) | .id' "$S"); do
        echo "/dev/nvidia-caps/nvidia-cap$(awk -v k="gpu0/gi$gi/access" '$1 == k {print $2}' /proc/driver/nvidia-caps/mig-minors)"
        for ci in $(jq -r --argjson g "$gi" '.gpus[0].gpu_instances[] | select(.id == $g) | .compute_instances[].id' "$S"); do
            echo "/dev/nvidia-caps/nvidia-cap$(awk -v k="gpu0/gi$gi/ci$ci/access" '$1 == k {print $2}' /proc/driver/nvidia-caps/mig-minors)"
        done
    done | sort
}
mig_uuids_of() {
    local want
    want=$(printf '%s,' "$@")
    jq -r --arg w ",$want" '.gpus[0].gpu_instances[] | select(.profile_id as $p | $w | contains("," + ($p | tostring) + ",")) | .compute_instances[].uuid' "$S" | sort
}
infer_caps=$(caps_of 9)
train_caps=$(caps_of 14 19)
echo "infer's caps: $(echo "$infer_caps" | xargs)"
echo "train's caps: $(echo "$train_caps" | xargs)"
check "infer has a GI and a CI cap" test "$(grep -c nvidia-cap <<<"$infer_caps")" = 2
check "train has two GIs and two CIs caps" test "$(grep -c nvidia-cap <<<"$train_caps")" = 4
bad_nodes=
for n in $infer_caps $train_caps; do
    minor=${n##*nvidia-cap}
    got=$(stat -c '%F %t:%T' "$n" 2>&1)
    want=$(printf 'character special file %x:%x' "$caps_major" "$minor")
    [ "$got" = "$want" ] || bad_nodes+="$n: $got (want $want); "
done
stat -c '    | %n %F %t:%T' /dev/nvidia-caps/*
check "every cap node exists with major $caps_major and its mig-minors minor" test -z "$bad_nodes"
[ -n "$bad_nodes" ] && echo "    $bad_nodes"

# DeviceAllow: the caps it lists are exactly the team's.
caps_allowed() { systemctl show -P DeviceAllow "gpu-$1.slice" | tr ' ' '\n' | grep '^/dev/nvidia-caps/' | sort; }
echo "gpu-infer.slice DeviceAllow: $(systemctl show -P DeviceAllow gpu-infer.slice)"
echo "gpu-train.slice DeviceAllow: $(systemctl show -P DeviceAllow gpu-train.slice)"
check "infer's DeviceAllow has exactly infer's caps" test "$(caps_allowed infer)" = "$infer_caps"
check "train's DeviceAllow has exactly train's caps" test "$(caps_allowed train)" = "$train_caps"
check "infer's DeviceAllow has the parent /dev/nvidia0 (rwm), not /dev/nvidia1" \
    sh -c "systemctl show -P DeviceAllow gpu-infer.slice | grep -q '/dev/nvidia0 rwm' && ! systemctl show -P DeviceAllow gpu-infer.slice | grep -q '/dev/nvidia1 '"
check "DevicePolicy=closed on both" test "$(systemctl show -P DevicePolicy gpu-infer.slice gpu-train.slice | grep . | sort -u)" = closed
ic=$(head -n1 <<<"$infer_caps") tc=$(head -n1 <<<"$train_caps")
r=$(probe gpu-infer.slice "$ic"); echo "infer -> $ic: $r"
check "infer opens its own GI cap (ENXIO)" test "$r" = ENXIO
r=$(probe gpu-infer.slice "$tc"); echo "infer -> $tc: $r"
check "infer is denied train's GI cap (EPERM)" test "$r" = EPERM

# The environment names MIG devices by UUID.
cat /run/gpuctl/teams/infer.env /run/gpuctl/teams/train.env 2>&1 | sed 's/^/    | /'
env_devs() { sed -n 's/^CUDA_VISIBLE_DEVICES=//p' "/run/gpuctl/teams/$1.env" | tr ',' '\n' | sort; }
check "infer's CUDA_VISIBLE_DEVICES is its MIG device's UUID" test "$(env_devs infer)" = "$(mig_uuids_of 9)"
check "train's CUDA_VISIBLE_DEVICES: its two MIG devices and GPU 1" \
    test "$(env_devs train)" = "$({ mig_uuids_of 14 19; gpu_uuid 1; } | sort)"

# Starting again (as at the next boot with the instances still there) changes nothing.
calls=$(jq -r '.mutating_calls // 0' "$S")
check "the fake NVML counted the first start's MIG changes ($calls calls)" test "$calls" -gt 0
gpuctld_start
check_output "a second start makes no NVML change (mutating calls stay $calls)" \
    test "$(jq -r '.mutating_calls // 0' "$S")" = "$calls"
check "still converged" status_converged 2 2

# Driver calls that time out (the fake's one-shot faults on the next two mutating calls) are
# retried within seconds and the change converges: no wait for the drift timer. Two, because
# the first failed run's own slice writes queue one more run, which meets the second.
n=$(jq -r '.mutating_calls // 0' "$S")
flock "$S.lock" sh -c "jq '.faults.fail_at += [{call: $((n + 1)), code: \"TIMEOUT\"}, {call: $((n + 2)), code: \"TIMEOUT\"}]' '$S' >'$S.new' && mv '$S.new' '$S'"
t0=$(date +%s%N)
put_policy 10-mig.toml < <(sed '/1g.10gb/d' /etc/gpuctl/policy.d/10-mig.toml)
# Done when the 1g.10gb is gone and the status says converged (it said so before the change).
# shellcheck disable=SC2317 # called through wait_for
changed() { [ "$(jq -r '[.gpus[0].gpu_instances[].profile_id] | sort | map(tostring) | join(",")' "$S")" = "9,14" ] && status_converged 2 2; }
check "after two driver timeouts, the change converges by retries" wait_for 30 changed
echo "    converged $((($(date +%s%N) - t0) / 1000000)) ms after the policy change"
gpuctld_journal | grep -E 'Timeout|retry|reconcile \(' | tail -n 8 | sed 's/^/    | /'
check "the journal says it retries in 1 s" journal_has 'retrying in 1 s'
check "the journal shows a retry run" journal_has 'reconcile (retry [0-9]* after transient errors)'
check_output "calls $((n + 1)) and $((n + 2)) timed out (the injected faults), a later one succeeded" \
    test "$(jq -r --argjson n "$((n + 1))" '[.call_log[] | select(.seq >= $n) | .result] | .[0] + " " + .[1] + " " + .[-1]' "$S")" = \
    "NVML_ERROR_TIMEOUT NVML_ERROR_TIMEOUT NVML_SUCCESS"
finish

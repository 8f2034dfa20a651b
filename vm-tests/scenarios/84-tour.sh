#!/bin/bash
# 84: the tour a newcomer gets from `vm-tests/try --tour` (and, without --tour, the host that
# `vm-tests/try` leaves them in): two fake H100s with MIG and a fake L40S, gpuctld running an
# example policy, alice in team infer and carol in team train. Each step prints the command and
# its output and checks what a reader should see there: status, plan, a job on infer's MIG
# slice, top, a limit change going live, the idle job warned.
# vmtest: timeout=300
# vmtest: group=usage
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup 3
# GPU 2 is an L40S (no MIG): the fake NVML's state names each GPU's model.
jq '.gpus[2].model = "L40S"' "$FAKE_NVML_STATE" >"$FAKE_NVML_STATE.new" && mv "$FAKE_NVML_STATE.new" "$FAKE_NVML_STATE"
test_users
# Short idle windows, so that the tour can show a warning within seconds.
idle_sampling_fast
tour_policy() {
    put_policy 50-tour.toml <<P
# The tour's policy: infer and train share GPU 0 in MIG halves; train also has GPU 1 whole
# in MIG (one 7g.80gb) and the L40S.
version = 1
[teams.infer]
members = ["@ml-infer"]
memory-max = "$1"
[teams.infer.idle]
after = "10s"
action = "warn"
[teams.train]
members = ["@ml-train"]
[[gpu]]
index = [0]
mig = [ { profile = "3g.40gb", owner = "infer" }, { profile = "3g.40gb", owner = "train" } ]
[[gpu]]
index = [1]
mig = [ { profile = "7g.80gb", owner = "train" } ]
[[gpu]]
index = [2]
owner = "train"
P
}
# Limits below the guest's RAM (2 GiB): gpuctld refuses a limit above the host's RAM.
tour_policy 512M
gpuctld_start
check "gpuctld converged on the tour's host (2 teams, 3 GPUs)" wait_converged 90 2 3

# step TITLE PATTERN CMD...: print the command and its output as a reader sees them, and check
# that the output matches the extended regular expression PATTERN.
step() {
    local title=$1 pattern=$2 out
    shift 2
    printf '\n### %s\n$ %s\n' "$title" "$*"
    out=$("$@" 2>&1)
    printf '%s\n' "$out" | sed 's/^/  /'
    check "$title" grep -Eq -- "$pattern" <<<"$out"
}
alice=(setpriv --reuid=alice --regid=alice --init-groups)

echo "The policy in /etc/gpuctl/policy.d/50-tour.toml:"
sed 's/^/  /' /etc/gpuctl/policy.d/50-tour.toml
step "gpuctld reports the host converged" "^gpuctld: 2 teams, 3 GPUs converged$" gpuctl status
step "the plan is empty: the host matches the policy" "Plan: 0 actions, 0 blocked \(converged\)" gpuctl plan
step "the plan shows infer's MIG half as gi@START+SIZE" "gi@[0-9]+\+4 3g\.40gb → infer \[kept\]" gpuctl plan
step "alice's job runs in infer's slice on its MIG device" "^MIG-.* 0::/gpu\.slice/gpu-infer\.slice/" \
    "${alice[@]}" gpuctl run --team infer -- sh -c 'echo "$CUDA_VISIBLE_DEVICES $(cat /proc/self/cgroup)"'
step "carol may not join infer" "not a member of team \"infer\"" \
    "${alice[@]/alice/carol}" gpuctl run --team infer -- true

# A job that holds infer's MIG device and does nothing: the fake NVML lists its pid there.
"${alice[@]}" gpuctl run --team infer -- sleep 600 &
wait_for 30 pgrep -xf 'sleep 600' >/dev/null
P_JOB=$(pgrep -xf 'sleep 600')
S=$FAKE_NVML_STATE
# infer's instance: the one at the placement the plan gives infer.
start=$(gpuctl plan --json | jq -r '.teams.infer.mig_devices[0].gi_placement.start')
gi=$(jq -r --argjson s "$start" '.gpus[0].gpu_instances[] | select(.start == $s) | .id' "$S")
ci=$(jq -r --argjson s "$start" '.gpus[0].gpu_instances[] | select(.start == $s) | .compute_instances[0].id' "$S")
echo "alice's idle job: pid $P_JOB on GPU 0 gi$gi ci$ci (infer's gi@$start)"
flock "$S.lock" sh -c "jq '.processes += [{pid: $P_JOB, gpu: 0, gi: $gi, ci: $ci, used_memory_mib: 2000}]' '$S' >'$S.new' && mv '$S.new' '$S'"
step "top shows alice's job with her team" " $P_JOB +alice +infer " \
    "${alice[@]}" gpuctl top --once

step "infer's slice has its memory limit" "^536870912$" systemctl show -P MemoryMax gpu-infer.slice
tour_policy 768M
reload_wait
step "a limit change in the policy goes live" "^805306368$" systemctl show -P MemoryMax gpu-infer.slice

# shellcheck disable=SC2317 # called through wait_for
warned() { gpuctld_journal GPUCTL_ACTION=idle-warn | grep -q .; }
wait_for 90 warned
step "the idle job is warned (journal)" "idle" gpuctld_journal GPUCTL_ACTION=idle-warn
step "gpuctl idle lists it" "$P_JOB|warned" "${alice[@]}" gpuctl idle

kill "$P_JOB" 2>/dev/null
finish

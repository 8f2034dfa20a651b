#!/bin/bash
# 78: geometry that follows demand (docs/policy.md, "Layouts a GPU may take"). GPU 0 and GPU 1
# are seven 1g.10gb slices for interns; GPU 1 may also be two 3g.40gb for train. Bob holds three
# of GPU 1's slices; carol queues a 3g.40gb job: nothing changes while the slices in the way are
# busy, and a new interns job goes to GPU 0. Once they end, GPU 1 re-slices (7 GI destroyed, 2
# created, no NVML call on GPU 0), carol's job starts on a 3g instance there, train's slice opens
# GPU 1 and interns' no longer does; status, plan, journal and metrics say why, and the ledger
# keeps each job's time by profile across the switch. With carol's job over and the hold past,
# GPU 1 goes back to its default layout, not before the hold. Then a plain request of train,
# which has no device, waits for GPU 1's train layout; the driver refuses the switch part-way
# (the fake's one-shot fault): GPU 1 is rebuilt in its last layout, and past the hold the switch
# is tried again and carol's job starts.
# vmtest: timeout=300
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup 2
test_users
HOLD=20
put_policy 78-reslice.toml <<P
version = 1
[host]
accounting = "on"
[teams.interns]
members = ["bob"]
[teams.train]
members = ["carol"]
[[gpu]]
index = [0]
mig = [{ profile = "1g.10gb", owner = "interns", count = 7 }]
[[gpu]]
index = [1]
mig = [{ profile = "1g.10gb", owner = "interns", count = 7 }]
reslice = { after = "2s", hold = "${HOLD}s" }
[[gpu.layout]]
name = "train-3g"
mig = [{ profile = "3g.40gb", owner = "train", count = 2 }]
P
idle_sampling_fast
gpuctld_start
wait_converged 60 2 2
S=$FAKE_NVML_STATE
# profiles GPU: its GI profile ids, sorted (19: 1g.10gb, 9: 3g.40gb).
profiles() { jq -r --argjson g "$1" '[.gpus[$g].gpu_instances[].profile_id] | sort | map(tostring) | join(",")' "$S"; }
uuids() { jq -r --argjson g "$1" '.gpus[$g].gpu_instances[].compute_instances[].uuid' "$S"; }
calls() { jq -r '.mutating_calls // 0' "$S"; }
# fake_jq FILTER...: change the fake NVML's state under its lock.
fake_jq() { (flock 9 && jq "$@" "$S" >"$S.new" && mv "$S.new" "$S") 9>"$S.lock"; }
# gpu_proc SCOPE UUID: the scope's first process on that MIG device, as NVML reports it (the
# ledger counts device time from NVML's processes).
gpu_proc() {
    local pid
    pid=$(head -n1 "/sys/fs/cgroup$(systemctl show -P ControlGroup "$1")/cgroup.procs")
    fake_jq --arg u "$2" --argjson p "$pid" '.processes += [first(.gpus | to_entries[] | .key as $g
        | .value.gpu_instances[] | .id as $gi | .compute_instances[] | select(.uuid == $u)
        | {pid: $p, gpu: $g, gi: $gi, ci: .id, used_memory_mib: 1024})]'
}
gpuctl status | grep -A1 '^  1 ' | sed 's/^/    status| /'
check "GPU 1 starts in its default layout (status)" \
    sh -c "gpuctl status | grep -A1 '^  1 ' | grep -q '^    layout default (not switched since boot)$'"

d=$(mktemp -d)
chmod 777 "$d"
# Bob holds three of GPU 1's slices, by device.
i=0
HELD=$(uuids 1 | head -n 3)
for u in $HELD; do
    as bob "gpuctl run --team interns --device $u -- sh -c 'echo \$GPUCTL_SCOPE >$d/hold$i; exec sleep 600'" >/dev/null 2>&1 &
    i=$((i + 1))
done
wait_for 30 sh -c "test -s $d/hold0 && test -s $d/hold1 && test -s $d/hold2"
require_nonempty "bob's three holders" "$(cat "$d"/hold[0-2] 2>/dev/null)"
HELD0=$(head -n1 <<<"$HELD")
gpu_proc "$(cat "$d/hold0")" "$HELD0"
n0=$(calls)
as carol "gpuctl run --team train --profile 3g.40gb --wait=120s -- sh -c 'echo \$CUDA_VISIBLE_DEVICES >$d/carol.env; echo \$GPUCTL_SCOPE >$d/carol.scope; exec sleep 600'" >"$d/carol.out" 2>&1 &
wait_for 20 sh -c "gpuctl status | grep -q '^  train #1: carol'"
st=$(gpuctl status)
grep '^  train #' <<<"$st" | sed 's/^/    status| /'
check "carol's 3g.40gb request waits in train's queue, for a layout that has one" \
    grep -q "^  train #1: carol (uid [0-9]*) --profile 3g.40gb: no 3g.40gb device in team train's share now; waiting for a GPU to take a layout that has one (gpu\[1\] layout \"train-3g\")$" <<<"$st"
sleep 5
check "while bob's slices are busy GPU 1 keeps its seven 1g.10gb" test "$(profiles 1)" = "19,19,19,19,19,19,19"
check "... and no NVML change was made" test "$(calls)" = "$n0"
check_not "... and gpuctld switched nothing" journal_has "re-sliced to"
# A new interns job meanwhile goes to one of GPU 0's slices.
as bob "gpuctl run --team interns -- sh -c 'echo \$CUDA_VISIBLE_DEVICES >$d/bob0.env; echo \$GPUCTL_SCOPE >$d/bob0.scope; exec sleep 600'" >/dev/null 2>&1 &
wait_for 20 test -s "$d/bob0.scope"
check "a new interns job goes to GPU 0's slices" grep -qxF "$(cat "$d/bob0.env" 2>/dev/null)" <(uuids 0)

# Bob's slices on GPU 1 end: it re-slices for carol.
fake_jq '.processes = []'
for i in 0 1 2; do systemctl kill -s KILL "$(cat "$d/hold$i")"; done
t_end=$(date +%s)
wait_for 60 test -s "$d/carol.env"
sed 's/^/    carol| /' "$d/carol.out"
check "GPU 1 is re-sliced to two 3g.40gb" test "$(profiles 1)" = "9,9"
check "carol's job starts on a 3g.40gb instance of GPU 1" \
    grep -qxF "$(cat "$d/carol.env" 2>/dev/null)" <(jq -r '.gpus[1].gpu_instances[] | select(.profile_id == 9) | .compute_instances[].uuid' "$S")
gpu_proc "$(cat "$d/carol.scope")" "$(cat "$d/carol.env")"
log() { jq -r --argjson n "$n0" "[.call_log[] | select(.seq > \$n and .result == \"NVML_SUCCESS\") | $1] | length" "$S"; }
echo "    NVML calls for the switch: $(log 'select(.function | test("GpuInstanceDestroy"))') GI destroyed, $(log 'select(.function | test("CreateGpuInstance"))') GI created, $(($(calls) - n0)) mutating calls in all"
check "the switch destroys the seven 1g GIs and creates two 3g: no more" \
    test "$(log 'select(.function | test("GpuInstanceDestroy"))') $(log 'select(.function | test("CreateGpuInstance"))')" = "7 2"
check "... and makes no NVML change on GPU 0" test "$(log 'select(.args.gpu == 0)')" = 0
check "GPU 0 keeps its seven slices" test "$(profiles 0)" = "19,19,19,19,19,19,19"
check "bob's GPU 0 job still runs" systemctl is-active -q "$(cat "$d/bob0.scope")"
check "train's slice opens GPU 1 (ENXIO)" test "$(probe gpu-train.slice /dev/nvidia1)" = ENXIO
check "interns' slice no longer does (EPERM)" test "$(probe gpu-interns.slice /dev/nvidia1)" = EPERM
st=$(gpuctl status)
grep -A1 '^  1 ' <<<"$st" | sed 's/^/    status| /'
check "gpuctl status names the layout and why" \
    grep -q "^    layout train-3g since [0-9]* (unix): GPU 1 re-sliced to train-3g (3g.40gb x2) for train's waiting 3g.40gb request: keeps 0, destroys 7, creates 2$" <<<"$st"
check "the journal says why" journal_has "GPU 1 re-sliced to train-3g .* for train's waiting 3g.40gb request"
m=$(gpuctl metrics 2>&1)
check "the switch is counted (gpuctl_gpu_reslices_total)" \
    grep -q '^gpuctl_gpu_reslices_total{gpu="1",layout="train-3g",cause="waiting"} 1$' <<<"$m"
check "... and GPU 1's layout is shown (gpuctl_gpu_layout_info)" \
    grep -q '^gpuctl_gpu_layout_info{gpu="1",layout="train-3g"} 1$' <<<"$m"
pl=$(gpuctl plan 2>&1)
grep -E '^Plan:|now on gpu' <<<"$pl" | sed 's/^/    plan| /'
check "the plan is empty after the switch" grep -qE '^Plan: 0 actions, 0 blocked \(converged\)' <<<"$pl"
check "... and says GPU 1 has train-3g now" grep -q '^    train-3g: .* · now on gpu 1$' <<<"$pl"
since=$(sed -n 's/^    layout train-3g since \([0-9]*\) .*/\1/p' <<<"$st")

# Carol's job ends: once idle and past the hold, GPU 1 goes back to its default layout.
fake_jq '.processes = []'
systemctl kill -s KILL "$(cat "$d/carol.scope")"
wait_for $((HOLD + 30)) sh -c "test \"\$(jq -r '[.gpus[1].gpu_instances[].profile_id] | length' $S)\" = 7"
back=$(date +%s)
check "GPU 1 goes back to seven 1g.10gb" test "$(profiles 1)" = "19,19,19,19,19,19,19"
echo "    switched to train-3g at $since, back at about $back (hold ${HOLD} s; bob's slices ended at $t_end)"
check "... not before the hold" test "$((back - since))" -ge "$HOLD"
st=$(gpuctl status)
r=$(gpuctl report --json --since 1d --by device)
jq -c '.rows[] | [.device, .kind, .held_s]' <<<"$r" | sed 's/^/    report| /'
check "the ledger counts carol's time on the new 3g.40gb instance" \
    jq -e --arg d "$(cat "$d/carol.env")" '[.rows[] | select(.device == $d and .kind == "3g.40gb") | .held_s] | add > 0' <<<"$r"
check "... and keeps the 1g.10gb time of bob's slice that the switch destroyed" \
    jq -e --arg d "$HELD0" '[.rows[] | select(.device == $d and .kind == "1g.10gb") | .held_s] | add > 0' <<<"$r"
check "status says the calendar chose the default again" \
    grep -q "^    layout default since [0-9]* (unix): GPU 1 re-sliced to default (1g.10gb x7): the calendar prefers it" <<<"$st"
wait_converged 30 2 2
check "interns' slice opens GPU 1 again (ENXIO)" test "$(probe gpu-interns.slice /dev/nvidia1)" = ENXIO

# A plain request of train, which has no device now, waits for the layout that gives it one;
# the driver refuses the switch's first 3g create (once): GPU 1 goes back to its last layout.
fake_jq '.faults.fail_once.nvmlDeviceCreateGpuInstanceWithPlacement = "NVML_ERROR_INSUFFICIENT_RESOURCES"'
n1=$(calls)
as carol "gpuctl run --team train --wait=150s -- sh -c 'echo \$CUDA_VISIBLE_DEVICES >$d/plain.env; echo \$GPUCTL_SCOPE >$d/plain.scope; exec sleep 600'" >"$d/plain.out" 2>&1 &
# Polled: while the tick tries the switch, the reason says so for a moment.
# shellcheck disable=SC2317 # called through wait_for
plain_reason() { gpuctl status | grep -q "^  train #1: carol (uid [0-9]*): team train has no device now; waiting for a GPU to take a layout that gives it one (gpu\[1\] layout \"train-3g\")$"; }
check "a plain request of train (no device now) waits for the layout that gives it one" wait_for 20 plain_reason
gpuctl status | grep '^  train #' | sed 's/^/    status| /'
wait_for $((HOLD + 40)) journal_has "GPU 1 back to default: the switch to train-3g failed"
gpuctld_journal | grep "GPU 1 back to default" | tail -n1 | sed 's/^/    journal| /'
check "the driver refused the switch's 3g create (the injected fault)" \
    test "$(jq --argjson n "$n1" '[.call_log[] | select(.seq > $n and (.function | test("CreateGpuInstance")) and .result == "NVML_ERROR_INSUFFICIENT_RESOURCES")] | length' "$S")" = 1
wait_for 30 sh -c "test \"\$(jq -r '[.gpus[1].gpu_instances[].profile_id] | sort | map(tostring) | join(\",\")' $S)\" = 19,19,19,19,19,19,19"
check "GPU 1 is rebuilt in its last layout, seven 1g.10gb" test "$(profiles 1)" = "19,19,19,19,19,19,19"
rolled=$(date +%s)
st=$(gpuctl status)
grep -A1 '^  1 ' <<<"$st" | sed 's/^/    status| /'
check "gpuctl status says the switch failed and GPU 1 went back" \
    grep -q "^    layout default since [0-9]* (unix): GPU 1 back to default: the switch to train-3g failed (.*insufficient resources)" <<<"$st"
check "the roll-back is counted" \
    grep -q '^gpuctl_gpu_reslices_total{gpu="1",layout="default",cause="rollback"} 1$' <(gpuctl metrics 2>&1)
check "carol's request still waits" grep -q '^  train #1: carol' <<<"$st"
# Past the hold, counted from the roll-back, the switch is tried again and succeeds.
wait_for $((HOLD + 40)) test -s "$d/plain.env"
sed 's/^/    carol| /' "$d/plain.out"
echo "    rolled back at about $rolled, carol's job started at $(date +%s) (hold ${HOLD} s)"
check "... then, past the hold, GPU 1 takes train-3g and carol's plain job starts on a 3g.40gb instance" \
    grep -qxF "$(cat "$d/plain.env" 2>/dev/null)" <(jq -r '.gpus[1].gpu_instances[] | select(.profile_id == 9) | .compute_instances[].uuid' "$S")
check "... not before the hold" test "$(($(date +%s) - rolled))" -ge $((HOLD - 2))
systemctl kill -s KILL "$(cat "$d/plain.scope")" 2>/dev/null || true
check "gpuctld still active" systemctl is-active -q gpuctld.service
finish

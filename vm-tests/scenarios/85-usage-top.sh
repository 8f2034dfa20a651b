#!/bin/bash
# 85: who uses what. Real guest processes in two teams' slices and one stray (root, in
# system.slice, on train's MIG device), the fake NVML's process list pointing at their pids;
# `gpuctl top --once --json` run by root shows each with the right user, team and unit, flags
# the stray, and reports no utilisation for the MIG GPU (not a made-up 0). Who sees what: alice
# (infer) sees her team's processes by name and only counts of train's and the stray; bob (no
# team) sees every device and only counts. Admit what fits: infer-job, in infer's slice but in
# no gpuctl job, holds GPU 0, so alice's `gpuctl run` there is refused naming it, and placed,
# with --wait, once it is gone.
# vmtest: timeout=300
# vmtest: group=usage
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
. lib/usage.sh

usage_setup
alice=(setpriv --reuid=alice --regid=alice --init-groups)
bob=(setpriv --reuid=bob --regid=bob --init-groups)
j=$(gpuctl top --once --json 2>&1)
echo "$j" | head -c 3000 | sed 's/^/    top| /'
proc() { jq -c --argjson p "$1" '[.. | objects | select(has("pid") and .pid == $p)] | first | [.user, .team, .unit, .stray]' <<<"$j"; }
check_output "infer's job: alice, infer, infer-job.service, not stray" \
    test "$(proc "$P_INFER")" = '["alice","infer","infer-job.service",false]'
check_output "train's job: carol, train, train-job.service, not stray" \
    test "$(proc "$P_TRAIN")" = '["carol","train","train-job.service",false]'
check_output "the root job on train's MIG device is a stray" \
    test "$(proc "$P_STRAY")" = '["root",null,"stray-job.service",true]'
check "train's job sits on its MIG device" \
    test "$(jq -r --argjson p "$P_TRAIN" '.gpus[1].mig_devices[] | select(any(.processes[]; .pid == $p)) | .teams | join(",")' <<<"$j")" = train
check_output "GPU 0: utilisation reported; GPU 1 (MIG): not available, not 0" \
    test "$(jq -c '[.gpus[0].utilization_gpu != null, .gpus[1].utilization_gpu, .gpus[1].mig_devices[0].activity]' <<<"$j")" = '[true,null,null]'
check_output "owners: GPU 0 infer, train's 3g.40gb" \
    test "$(jq -c '[.gpus[0].teams, .gpus[1].mig_devices[0].teams, .gpus[1].mig_devices[0].profile]' <<<"$j")" = '[["infer"],["train"],"3g.40gb"]'
human=$(gpuctl top --once 2>&1)
while IFS= read -r l; do echo "    top| $l"; done <<<"$human"
check "the human view marks the stray" grep -Eq "^ +!$P_STRAY +root" <<<"$human"
check_output "--team train shows only train's device" \
    test "$("${alice[@]}" gpuctl top --once --json --team train | jq -c '[(.gpus | length), .gpus[0].index, (.gpus[0].mig_devices | length)]')" = '[1,1,1]'

# Who sees what (docs/monitoring.md): per-process detail of a team for root and its members.
ja=$("${alice[@]}" gpuctl top --once --json | jq -c .)
jb=$("${bob[@]}" gpuctl top --once --json | jq -c .)
echo "$jb" | head -c 1500 | sed 's/^/    bob top| /'
pids() { jq -c '[.. | objects | select(has("pid")) | .pid] | sort' <<<"$1"; }
hidden() { jq -c '[.. | objects | select(has("hidden")) | .hidden[] | [.team, .stray, .processes]] | sort' <<<"$1"; }
check_output "root sees all three processes" \
    test "$(pids "$j")" = "$(printf '%s\n' "$P_INFER" "$P_TRAIN" "$P_STRAY" | sort -n | jq -sc .)"
check_output "alice (infer) sees her job by name, and only hers" test "$(pids "$ja")" = "[$P_INFER]"
check_output "alice: train's job and the stray as counts" \
    test "$(hidden "$ja")" = '[[null,true,1],["train",false,1]]'
leaks() { grep -oE "carol|root|train-job|stray-job|\"pid\":($P_TRAIN|$P_STRAY)[,}]" <<<"$1" | sort -u | tr '\n' ' '; }
check_output "alice finds no user, pid or unit of train's job or the stray" test -z "$(leaks "$ja")"
check_output "bob (no team) sees no process by name" test "$(pids "$jb")" = "[]"
check_output "bob: every device, with counts per team" \
    test "$(jq -c '[(.gpus | length), (.gpus[1].mig_devices | length)]' <<<"$jb"),$(hidden "$jb")" = \
    '[2,1],[[null,true,1],["infer",false,1],["train",false,1]]'
bleaks() { grep -oE "alice|carol|root|sleep|-job\.service|\"pid\":($P_INFER|$P_TRAIN|$P_STRAY)[,}]" <<<"$1" | sort -u | tr '\n' ' '; }
check_output "bob finds no user, pid, command or unit of anyone" test -z "$(bleaks "$jb")"
hb=$("${bob[@]}" gpuctl top --once 2>&1)
while IFS= read -r l; do echo "    bob top| $l"; done <<<"$hb"
check_output "bob's top: 3 processes counted, shown as (hidden), no names" \
    bash -c 'grep -q "3 process(es), 1 stray(s)" <<<"$1" && ! grep -E "alice|carol|job.service" <<<"$1"' _ "$hb"
check "and the stray line is marked" grep -Eq '^ +!- +\(hidden\) +- ' <<<"$hb"
mb=$("${bob[@]}" gpuctl metrics 2>&1)
check_output "bob's metrics: per-team process counts whole" \
    grep -q 'gpuctl_team_gpu_processes{.*team="train"} 1' <<<"$mb"

out=$("${alice[@]}" gpuctl run --team infer -- true 2>&1); rc=$?
_vm_show "$out" 4
check "a job is refused a device a process outside every lease holds (exit 8, got $rc)" test $rc = 8
check "... naming the process" grep -q "is busy: pid $P_INFER (sleep) holds 78000 MiB, outside every lease" <<<"$out"
systemctl stop infer-job.service
S=$FAKE_NVML_STATE
flock "$S.lock" sh -c "jq '.processes |= map(select(.pid != $P_INFER))' '$S' >'$S.new' && mv '$S.new' '$S'"
# With --wait: a placement reads the usage collection, which sees the process gone at its next
# sample (every 2 s), not at once.
out=$("${alice[@]}" gpuctl run --team infer --wait=30s -- sh -c 'echo "on $CUDA_VISIBLE_DEVICES"' 2>&1); rc=$?
_vm_show "$out" 4
check "once it is gone the job is placed there" bash -c 'test "$1" = 0 && grep -q "^on GPU-" <<<"$2"' _ "$rc" "$out"
usage_teardown
finish

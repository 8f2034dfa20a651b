#!/bin/bash
# 85: who uses what. Real guest processes in two teams' slices and one stray (root, in
# system.slice, on train's MIG device), the fake NVML's process list pointing at their pids;
# `gpuctl top --once --json` run by alice (an unprivileged member, through the bus) shows each
# with the right user, team and unit, flags the stray, and reports no utilisation for the MIG
# GPU (not a made-up 0).
# vmtest: timeout=300
# vmtest: group=usage
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
. lib/usage.sh

usage_setup
alice=(setpriv --reuid=alice --regid=alice --init-groups)
j=$("${alice[@]}" gpuctl top --once --json 2>&1)
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
human=$("${alice[@]}" gpuctl top --once 2>&1)
while IFS= read -r l; do echo "    top| $l"; done <<<"$human"
check "the human view marks the stray" grep -Eq "^ +!$P_STRAY +root" <<<"$human"
check_output "--team train shows only train's device" \
    test "$("${alice[@]}" gpuctl top --once --json --team train | jq -c '[(.gpus | length), .gpus[0].index, (.gpus[0].mig_devices | length)]')" = '[1,1,1]'
usage_teardown
finish

#!/bin/bash
# 58: MPS around a MIG change. One H100 (fake NVML) split 3g.40gb for infer (with MPS, one
# daemon per MIG device as NVIDIA requires) and 3g.40gb for train. infer's share then grows to
# 4g.40gb: gpuctld stops infer's MPS daemon (`quit`) before it destroys the GPU instance under
# it, creates the new one, and starts MPS again on the new MIG device's UUID; train's instance
# and its jobs are untouched.
# vmtest: timeout=240
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup 1
policy() { # policy INFER_PROFILE
    put_policy 10-mig.toml <<P
version = 1
[teams.infer]
[teams.infer.mps]
active-thread-percentage = 50
[teams.train]
[[gpu]]
index = [0]
mig = [
  { profile = "$1", owner = "infer" },
  { profile = "3g.40gb", owner = "train" },
]
P
}
policy 3g.40gb
gpuctld_start
echo "StatusText: $(status_text)"
S=$FAKE_NVML_STATE
mig_uuid() { jq -r --argjson p "$1" '.gpus[0].gpu_instances[] | select(.profile_id == $p) | .compute_instances[0].uuid' "$S"; }
mps_unit() { systemctl list-units --plain --no-legend --state=active 'gpuctl-mps@infer-*.service' | awk '{print $1}'; }
# Both shares are 3g.40gb (profile 9): infer's MIG device is the one its env names.
old_uuid=$(sed -n 's/^CUDA_VISIBLE_DEVICES=//p' /run/gpuctl/teams/infer.env)
u1=$(mps_unit)
i1=${u1#gpuctl-mps@}
i1=${i1%.service}
echo "before: infer's MIG device $old_uuid, MPS unit $u1"
check "one MPS daemon for infer's MIG device" test "$(wc -w <<<"$u1")" = 1
check "infer's env names one MIG device" grep -Eqx 'MIG-[0-9a-f-]+' <<<"$old_uuid"
check_output "it serves exactly that MIG device" grep -E "CUDA_VISIBLE_DEVICES=$old_uuid( |\$)" "/var/log/gpuctl/mps/$i1/control.log"
train_gi=$(jq -c '.gpus[0].gpu_instances[] | select(.profile_id == 9 and (.compute_instances[0].uuid != "'"$old_uuid"'")) | {id, start}' "$S")
echo "train's GI: $train_gi"
systemd-run -q --unit=train-job --slice=gpu-train.slice sleep 600

cur_change=$(journal_cursor)
t_us=$(date +%s%6N)
# Done means: the 4g instance exists *and* a reconcile that started after the change has
# finished. The instance alone is not enough: it appears mid-reconcile, before MPS is started
# again, while StatusText still says "converged" from the run before (the release build hit
# that window).
# shellcheck disable=SC2317 # called through wait_for
changed() {
    jq -e '[.gpus[0].gpu_instances[].profile_id] | index(5)' "$S" >/dev/null &&
        _reconciled_since "$t_us" && status_converged
}
policy 4g.40gb
wait_for 60 changed
new_uuid=$(mig_uuid 5)
u2=$(mps_unit)
i2=${u2#gpuctl-mps@}
i2=${i2%.service}
echo "after: infer's MIG device $new_uuid, MPS unit $u2; StatusText: $(status_text)"
check "infer now has a 4g.40gb instance with a new MIG device" test -n "$new_uuid" -a "$new_uuid" != null -a "$new_uuid" != "$old_uuid"
check "the old daemon was told quit" grep -q 'cmd quit -> ok' "/var/log/gpuctl/mps/$i1/control.log"
check_output "MPS runs again, on the new MIG device" grep -E "CUDA_VISIBLE_DEVICES=$new_uuid( |\$)" "/var/log/gpuctl/mps/$i2/control.log"
check "the new daemon got the thread percentage" grep -q 'cmd set_default_active_thread_percentage 50 -> ok' "/var/log/gpuctl/mps/$i2/control.log"
check "exactly one MPS daemon for infer" test "$(wc -w <<<"$u2")" = 1

# Order, from the journal. gpuctld logs each action once its apply is done, in the order it ran
# them, so the order is read from its lines alone: systemd's, written as they happen, come before
# all of them. systemd's lines show the stop and the start happened after the change.
journalctl --after-cursor "$cur_change" -o cat --no-pager >/tmp/j.txt
line() { grep -n -m1 -E "$1" /tmp/j.txt | cut -d: -f1; }
stopped=$(line "^stop MPS daemon $i1 ")
destroyed=$(line '^destroy GI 3g.40gb')
created=$(line '^create GI 4g.40gb')
started=$(line "^start MPS daemon $i2 on $new_uuid ")
grep -n -E "share $i1|share $i2|^(stop|start) MPS|^(destroy|create) GI|^(destroy|create) CI" /tmp/j.txt | head -n 20 | sed 's/^/    | /'
echo "gpuctld's lines: MPS stopped $stopped, GI destroyed $destroyed, GI created $created, MPS started $started"
check "systemd stopped the old MPS daemon and started the new one" \
    sh -c "grep -q '^Stopped .*share $i1' /tmp/j.txt && grep -q '^Started .*share $i2' /tmp/j.txt"
check "MPS stopped before the GPU instance was destroyed" test -n "$stopped" -a -n "$destroyed" -a "${stopped:-0}" -lt "${destroyed:-0}"
check "MPS started after the new GPU instance was created" test -n "$created" -a -n "$started" -a "${created:-0}" -lt "${started:-0}"

check_output "train's GPU instance untouched" test "$(jq -c '.gpus[0].gpu_instances[] | select(.compute_instances[0].uuid != "'"$new_uuid"'") | {id, start}' "$S")" = "$train_gi"
check "train's job lives on" systemctl is-active -q train-job.service
systemctl stop train-job.service
finish

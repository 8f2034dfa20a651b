#!/bin/bash
# 70: gpuctl owns its slices. A hand `systemctl set-property` on a team slice -- runtime or
# persistent, a memory limit or an added DeviceAllow= -- is reverted within 1 s, logged with what
# changed; a persistent override file under /etc/systemd/system.control is removed and named in
# the journal. BENCH: repair latency per kind of drift (median), against the latency of the hand
# set-property itself in the same run.
# vmtest: timeout=300
# vmtest: group=own
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
memory-max = "256M"
[teams.train]
[[gpu]]
index = [0]
owner = "infer"
[[gpu]]
index = [1]
owner = "train"
P
gpuctld_start
wait_for 20 sh -c 'systemctl show -P StatusText gpuctld.service | grep -q "GPUs converged"'
echo "gpuctld: $(status_text)"
MEM=/sys/fs/cgroup/gpu.slice/gpu-infer.slice/memory.max
check "policy limit live" test "$(cat $MEM)" = 268435456
check "train's GPU denied to infer" test "$(probe gpu-infer.slice /dev/nvidia1)" = EPERM

N=${BENCH_N:-5}
now_us() { date +%s%6N; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# One drift: KIND (mem|dev), MODE (--runtime or empty). Prints "applied_us repaired_us".
drift_once() {
    local kind=$1 mode=$2 t0 t1 t2
    t0=$(now_us)
    if [ "$kind" = mem ]; then
        # shellcheck disable=SC2086 # mode is empty or one word
        systemctl set-property $mode gpu-infer.slice MemoryMax=1G
        t1=$(now_us)
        wait_for 5 sh -c "test \"\$(cat $MEM)\" = 268435456" || { echo "not repaired"; return 1; }
    else
        # shellcheck disable=SC2086
        systemctl set-property $mode gpu-infer.slice "DeviceAllow=/dev/nvidia1 rw"
        t1=$(now_us)
        wait_for 5 sh -c '! systemctl show -P DeviceAllow gpu-infer.slice | grep -q "/dev/nvidia1 "' || { echo "not repaired"; return 1; }
    fi
    t2=$(now_us)
    echo "$((t1 - t0)) $((t2 - t1))"
}

for kind in mem dev; do
    for mode in --runtime persistent; do
        m=$mode; [ "$m" = persistent ] && m=
        hand=() rep=() fails=0
        for _ in $(seq "$N"); do
            if r=$(drift_once "$kind" "$m"); then
                hand+=("${r% *}") rep+=("${r#* }")
            else
                fails=$((fails + 1))
            fi
            sleep 0.3
        done
        med=$(printf '%s\n' "${rep[@]}" | median)
        hmed=$(printf '%s\n' "${hand[@]}" | median)
        echo "drift $kind $mode: repair times (us): ${rep[*]}"
        check "$kind drift ($mode) repaired every time ($N of $N)" test "$fails" = 0
        check "$kind drift ($mode) repaired within 1 s (median ${med:-?} us)" test "${med:-9999999}" -lt 1000000
        echo "BENCH drift repair ($kind, $mode): median $((med / 1000)) ms over $N; the hand set-property itself took median $((hmed / 1000)) ms (ratio $(awk -v a="$med" -v b="$hmed" 'BEGIN{printf "%.1f", a/b}')x)"
    done
done

check "the persistent override files are gone" sh -c '! ls /etc/systemd/system.control/gpu-infer.slice.d/*.conf 2>/dev/null'
systemctl daemon-reload
sleep 1
check "after a daemon-reload the policy still holds (memory)" test "$(cat $MEM)" = 268435456
check "after a daemon-reload the policy still holds (devices)" sh -c '! systemctl show -P DeviceAllow gpu-infer.slice | grep -q "/dev/nvidia1 "'
check "train's GPU denied to infer again" test "$(probe gpu-infer.slice /dev/nvidia1)" = EPERM
j=$(gpuctld_journal)
check_output "the repair is logged with what changed" grep -m3 'differs from the policy: MemoryMax=1073741824 (policy: 268435456)' <<<"$j"
check_output "an added DeviceAllow is logged" grep -m1 'DeviceAllow +/dev/nvidia1' <<<"$j"
check_output "the removed persistent override is named" grep -m2 'removed persistent override /etc/systemd/system.control/gpu-infer.slice.d/50-' <<<"$j"
check_output "the trigger names the drop-in" grep -m2 'drift: control drop-ins changed' <<<"$j"
wait_for 10 sh -c 'systemctl show -P StatusText gpuctld.service | grep -q "GPUs converged"'
echo "gpuctld: $(status_text)"
finish

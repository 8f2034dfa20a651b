#!/bin/bash
# 65: a full-size host at boot (issue 14 item 4). 8 H100s (fake NVML) in MIG mode with no
# instances -- what a reboot leaves: the mode persists, GPU and compute instances do not -- and a
# policy of 32 teams sharing 56 1g.10gb MIG devices (7 per GPU), each team with MPS: 56 MPS units.
# gpuctld starts as at boot; measured: from its start to READY=1, and to every team slice and
# MPS unit active. The floor, in the same run: the same 56 MPS units and their slices (the
# control drop-ins and env files gpuctld left, i.e. plain files) started by systemd alone, one
# `systemctl start` after another (gpuctld starts them one by one too).
# BENCH: both times and their ratio (goal <= 1.5x).
# vmtest: timeout=600
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

GPUS=$(bench_size 8 2) PER_GPU=$(bench_size 7 2) TEAMS=$(bench_size 32 4)
gpuctld_setup "$GPUS"
systemctl stop gpuctld.service
# MIG on, no instances.
jq '.gpus[].mig = {"current": 1, "pending": 1}' "$FAKE_NVML_STATE" >"$FAKE_NVML_STATE.new" &&
    mv "$FAKE_NVML_STATE.new" "$FAKE_NVML_STATE"
team() { printf 't%02d' "$(($1 % TEAMS))"; }
{
    echo "version = 1"
    for ((t = 0; t < TEAMS; t++)); do
        printf '[teams.%s]\nmemory-max = "256M"\n[teams.%s.mps]\nactive-thread-percentage = 50\n' "$(team $t)" "$(team $t)"
    done
    for ((g = 0; g < GPUS; g++)); do
        printf '[[gpu]]\nindex = [%d]\nmig = [\n' "$g"
        for ((j = 0; j < PER_GPU; j++)); do
            printf '  { profile = "1g.10gb", owner = "%s" },\n' "$(team $((g * PER_GPU + j)))"
        done
        echo "]"
    done
} | put_policy 10-scale.toml
gpuctl validate /etc/gpuctl/policy.d/10-scale.toml >/dev/null 2>&1
check "the $TEAMS-team policy is valid" test $? = 0

MPS_N=$((GPUS * PER_GPU))
now_us() { date +%s%6N; }
active_mps() { systemctl list-units --plain --no-legend --state=active 'gpuctl-mps@*.service' | wc -l; }
active_slices() { systemctl list-units --plain --no-legend --state=active 'gpu-t??.slice' | wc -l; }
# shellcheck disable=SC2317 # called through wait_for
all_up() { [ "$(active_mps)" = "$MPS_N" ] && [ "$(active_slices)" = "$TEAMS" ]; }

# gpuctld from start (Type=notify: `systemctl start` returns at READY=1) to all units active.
t0=$(now_us)
systemctl start gpuctld.service
t1=$(now_us)
wait_for 400 all_up
t2=$(now_us)
echo "gpuctld: $(status_text)"
check "all $MPS_N MPS units active" test "$(active_mps)" = "$MPS_N"
check "all $TEAMS team slices active" test "$(active_slices)" = "$TEAMS"
check "gpuctld converged" status_converged
gis=$(jq '[.gpus[].gpu_instances | length] | add' "$FAKE_NVML_STATE")
check "$MPS_N GPU instances made" test "$gis" = "$MPS_N"
t_plan0=$(now_us)
gpuctl plan >/dev/null 2>&1
t_plan1=$(now_us)
echo "gpuctl plan on this host (guest, TCG): $(((t_plan1 - t_plan0) / 1000)) ms"
ready_ms=$(((t1 - t0) / 1000)) all_ms=$(((t2 - t0) / 1000))

# The floor: the same units from plain files. gpuctld's control drop-ins (slice properties), its
# MPS env/ctl files and User= drop-ins stay; gpuctld itself does not run.
mapfile -t units < <(systemctl list-units --plain --no-legend --state=active 'gpuctl-mps@*.service' | awk '{print $1}')
systemctl stop gpuctld.service
systemctl stop gpu.slice
wait_for 120 sh -c '[ "$(systemctl list-units --plain --no-legend --state=active "gpuctl-mps@*.service" "gpu-t??.slice" | wc -l)" = 0 ]'
check "everything stopped before the floor run" test "$(active_mps)" = 0
# One at a time, as gpuctld starts them: all 56 in one transaction overloaded the 2-vCPU TCG
# guest, and their ExecStartPost (the control pipe's limits) hit the 90 s start timeout.
t3=$(now_us)
for u in "${units[@]}"; do systemctl start "$u"; done
wait_for 400 all_up
t4=$(now_us)
check "the floor run brought up the same units" all_up
floor_ms=$(((t4 - t3) / 1000))
ratio=$(awk -v a="$all_ms" -v b="$floor_ms" 'BEGIN {printf "%.2f", a / b}')
echo "BENCH scale boot ($GPUS GPUs x $PER_GPU MIG, $TEAMS teams, $MPS_N MPS units): gpuctld start to READY=1 ${ready_ms} ms, to all units active ${all_ms} ms; systemd alone (floor) ${floor_ms} ms; ratio ${ratio}x (goal <= 1.5x)"
printf 'ready_ms %s\nall_ms %s\nfloor_ms %s\nratio %s\n' "$ready_ms" "$all_ms" "$floor_ms" "$ratio" >"$VMTEST_RESULTS/bench.txt"
systemctl stop 'gpuctl-mps@*.service' gpu.slice
finish

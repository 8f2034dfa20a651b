#!/bin/bash
# 93: the GPU-hours ledger (docs/ledger.md) over a compressed day. Three fake H100s with
# scripted utilisation: team train holds GPU 0 busy (90%); team interns holds GPU 1 busy (80%)
# and GPU 2 idle (0%). Phase 1, no idle rule, `[host] accounting = "on"`: every holder for a
# scripted span, then removed; `gpuctl report --json` gives each held/active within one sample
# interval of the script. Phase 2 gives interns a stop rule: its idle holder is stopped, its
# held time counted as reclaimed, and the team's utilisation over the phase rises above phase 1's.
# A member (alice, interns) sees her team only, bob (no team) none until he joins
# `[host] admin-group`; root sees both. Figures as BENCH lines.
# vmtest: timeout=480
# vmtest: group=usage
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

IDLE_MS=2000
USAGE_MS=500
# The ledger's nominal interval: a collection is served for one usage interval.
NOMINAL=$((IDLE_MS + USAGE_MS))
# Long enough for phase 2's stop (after 6 s, grace 4 s) to leave a busy stretch after it.
PHASE=${LEDGER_PHASE_S:-24}

gpuctld_setup 3
test_users
mkdir -p /etc/systemd/system/gpuctld.service.d
cat >/etc/systemd/system/gpuctld.service.d/60-vmtest-ledger.conf <<EOF
[Service]
Environment=GPUCTL_IDLE_INTERVAL_MS=$IDLE_MS GPUCTL_USAGE_INTERVAL_MS=$USAGE_MS
EOF
systemctl daemon-reload
policy() {
    put_policy 93-ledger.toml <<P
version = 1
[host]
accounting = "on"
[teams.train]
members = ["@ml-train"]
[teams.interns]
members = ["alice"]
$1
[[gpu]]
index = [0]
owner = "train"
[[gpu]]
index = [1, 2]
owner = "interns"
P
}
policy ""
check_output "accounting = \"on\" validates" gpuctl validate /etc/gpuctl/policy.d/93-ledger.toml
gpuctld_start
check "gpuctld converged" wait_converged 60

S=$FAKE_NVML_STATE
fake() { flock "$S.lock" sh -c "jq '$1' '$S' >'$S.new' && mv '$S.new' '$S'"; }
fake '.usage.gpus["0"] = {utilization_gpu: 90, gpm_sm_activity: 90.0}
    | .usage.gpus["1"] = {utilization_gpu: 80, gpm_sm_activity: 80.0}
    | .usage.gpus["2"] = {utilization_gpu: 0, gpm_sm_activity: 0.0}'
now_ms() { date +%s%3N; }
jobs_start() {
    systemd-run -q --unit="train-$1" --slice=gpu-train.slice -p User=carol sleep 600
    systemd-run -q --unit="busy-$1" --slice=gpu-interns.slice -p User=alice sleep 600
    systemd-run -q --unit="nb-$1" --slice=gpu-interns.slice -p User=alice sleep 600
    P_TRAIN=$(systemctl show -P MainPID "train-$1.service")
    P_BUSY=$(systemctl show -P MainPID "busy-$1.service")
    P_NB=$(systemctl show -P MainPID "nb-$1.service")
    fake ".processes += [{pid: $P_TRAIN, gpu: 0, used_memory_mib: 4096},
        {pid: $P_BUSY, gpu: 1, used_memory_mib: 2048}, {pid: $P_NB, gpu: 2, used_memory_mib: 1024}]"
    T_START=$(now_ms)
}
jobs_end() {
    fake '.processes = []'
    T_END=$(now_ms)
    systemctl stop "train-$1" "busy-$1" "nb-$1" 2>/dev/null || true
    # Let the next samples see them gone.
    sleep $((3 * NOMINAL / 1000 + 1))
}
report() { gpuctl report --json --since 1d --by "${1:-team}"; }
fig() { jq -r --arg t "$2" --arg f "$3" '[.rows[] | select(.team == $t) | .[$f] // 0] | add // 0' <<<"$1"; }
# within A B TOL: |A - B| <= TOL (seconds, decimals allowed)
# shellcheck disable=SC2317 # called through check_output
within() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t) }'; }
TOL=$(awk -v n=$NOMINAL 'BEGIN { print n / 1000 }')

# Phase 1: no idle rule; accounting = "on" keeps the sampler going.
jobs_start p1
sleep "$PHASE"
jobs_end p1
SCRIPTED1=$(awk -v a="$T_START" -v b="$T_END" 'BEGIN { print (b - a) / 1000 }')
R1=$(report)
echo "$R1" | jq -c '.rows[]' | sed 's/^/    report1| /'
th1=$(fig "$R1" train held_s); ta1=$(fig "$R1" train active_s)
ih1=$(fig "$R1" interns held_s); ia1=$(fig "$R1" interns active_s)
check_output "train held GPU 0 for the scripted ${SCRIPTED1}s, within one interval (${TOL}s): $th1" \
    within "$th1" "$SCRIPTED1" "$TOL"
check_output "and used all of it (90% >= the 5% default): active $ta1" within "$ta1" "$th1" 0.001
check_output "interns held two GPUs: $ih1 s within 2 intervals of 2 x ${SCRIPTED1}" \
    within "$ih1" "$(awk -v s="$SCRIPTED1" 'BEGIN { print 2 * s }')" "$(awk -v t="$TOL" 'BEGIN { print 2 * t }')"
check_output "interns used the busy one only: active $ia1 within one interval of ${SCRIPTED1}" \
    within "$ia1" "$SCRIPTED1" "$TOL"
U1=$(awk -v a="$ia1" -v h="$ih1" 'BEGIN { printf "%.3f", a / h }')
check_output "the report's utilisation is active/held: $(jq -r '.rows[] | select(.team == "interns") | .utilisation' <<<"$R1") ~ $U1" \
    within "$(jq -r '.rows[] | select(.team == "interns") | .utilisation' <<<"$R1")" "$U1" 0.001
BYUSER=$(report user)
check_output "by user: alice's and carol's rows" \
    test "$(jq -c '[.rows[] | [.team, .user]] | sort' <<<"$BYUSER")" = '[["interns","alice"],["train","carol"]]'
check_output "the idle holder heads the top idle list" \
    test "$(jq -c '.top_idle[0] | [.team, .user]' <<<"$BYUSER")" = '["interns","alice"]'
MINE=$(setpriv --reuid=alice --regid=alice --init-groups gpuctl report --json --since 1d)
check_output "alice (interns) sees her team only" \
    test "$(jq -c '[.all_teams, [.rows[].team]]' <<<"$MINE")" = '[false,["interns"]]'
BOB=(setpriv --reuid=bob --regid=bob --init-groups gpuctl report --json --since 1d)
check_output "bob (no team) sees no team" \
    test "$("${BOB[@]}" | jq -c '[.all_teams, [.rows[].team]]')" = '[false,[]]'
# The admin group widens the view as it does for Usage (docs/ledger.md, "Who sees what").
getent group gpu-admins >/dev/null || groupadd gpu-admins
usermod -aG gpu-admins bob
put_policy 94-admins.toml <<'P'
version = 1
[host]
admin-group = "gpu-admins"
P
reload_wait
# shellcheck disable=SC2317 # called through wait_for
bob_sees_all() { test "$("${BOB[@]}" | jq -c '[.all_teams, ([.rows[].team] | sort)]')" = '[true,["interns","train"]]'; }
wait_for 10 bob_sees_all
check "bob, in [host] admin-group, sees both teams" bob_sees_all
gpasswd -q -d bob gpu-admins
check_output "the day file is under /var/lib/gpuctl/ledger" \
    sh -c "ls -l /var/lib/gpuctl/ledger/ && jq -e '.rows | length == 3' /var/lib/gpuctl/ledger/$(date -u +%F).json"
check_output "the counters reach the metrics" \
    sh -c "gpuctl metrics | grep -E '^gpuctl_ledger_held_seconds_total\{team=\"interns\",user=\"alice\",kind=\"gpu\"\}'"

# Phase 2: interns gets a stop rule; its idle holder is warned and stopped.
policy '[teams.interns.idle]
after = "6s"
action = "stop"
grace = "4s"'
reload_wait
jobs_start p2
wait_for 90 sh -c '! systemctl is-active -q nb-p2.service'
T_STOP=$(now_ms)
check "the idle holder nb-p2 was stopped by the idle rule" sh -c '! systemctl is-active -q nb-p2.service'
fake ".processes |= map(select(.pid != $P_NB))"
sleep $((PHASE - (T_STOP - T_START) / 1000 > 5 ? PHASE - (T_STOP - T_START) / 1000 : 5))
jobs_end p2
SCRIPTED2=$(awk -v a="$T_START" -v b="$T_END" 'BEGIN { print (b - a) / 1000 }')
NB_HELD=$(awk -v a="$T_START" -v b="$T_STOP" 'BEGIN { print (b - a) / 1000 }')
R2=$(report)
echo "$R2" | jq -c '.rows[]' | sed 's/^/    report2| /'
ih2=$(fig "$R2" interns held_s); ia2=$(fig "$R2" interns active_s)
rec=$(fig "$R2" interns reclaimed_s); stops=$(fig "$R2" interns stops)
dh=$(awk -v a="$ih2" -v b="$ih1" 'BEGIN { print a - b }')
da=$(awk -v a="$ia2" -v b="$ia1" 'BEGIN { print a - b }')
U2=$(awk -v a="$da" -v h="$dh" 'BEGIN { printf "%.3f", a / h }')
check_output "phase 2: interns held ${dh}s ~ busy ${SCRIPTED2}s + idle until its stop ${NB_HELD}s" \
    within "$dh" "$(awk -v s="$SCRIPTED2" -v n="$NB_HELD" 'BEGIN { print s + n }')" "$(awk -v t="$TOL" 'BEGIN { print 3 * t }')"
check_output "one stop, its held time counted as reclaimed: ${rec}s ~ ${NB_HELD}s" \
    sh -c "test '$stops' = 1 && awk -v a='$rec' -v b='$NB_HELD' -v t='$TOL' 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 2 * t) }'"
check_output "the idle rule raised interns' utilisation: $U1 -> $U2" \
    awk -v a="$U1" -v b="$U2" 'BEGIN { exit !(b > a + 0.1) }'
check_output "gpuctl report shows reclaimed hours for interns" \
    sh -c "gpuctl report --since 1d | grep -E '^interns .*\(1\)\$'"
check_output "gpuctl report --csv" sh -c "gpuctl report --csv --since 1d | head -3"
echo "BENCH ledger phase1 scripted_s=$SCRIPTED1 train_held_s=$th1 train_active_s=$ta1 interns_held_s=$ih1 interns_active_s=$ia1 interns_utilisation=$U1 nominal_interval_ms=$NOMINAL"
echo "BENCH ledger phase2 (idle stop rule) scripted_s=$SCRIPTED2 interns_held_s=$dh interns_active_s=$da interns_utilisation=$U2 reclaimed_s=$rec idle_holder_until_stop_s=$NB_HELD"
rm -f /etc/systemd/system/gpuctld.service.d/60-vmtest-ledger.conf
finish

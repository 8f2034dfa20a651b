#!/bin/bash
# 81 (issue #18): bob (no team) hammers Plan and Join on the bus from 8 clients for 20 s. gpuctld
# stays healthy: root's Status answers, alice's joins work, NRestarts stays 0, RSS stays
# bounded; bob is rate limited (LimitsExceeded) and his refusals cost the journal a few lines.
# Then bob floods the read methods (Usage, Idle, Metrics) and carol's `gpuctl status` keeps its
# time. BENCH: alice's `gpuctl run` and carol's status during each flood against before it.
# vmtest: timeout=420
# vmtest: group=own
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
# Bob's read budget lowered (gpuctld(8): GPUCTL_READ_LIMIT, default 50/25) so that his read flood
# below goes past it on any guest: at 25 calls a second a slow guest's flood stays under it, and
# at 1 a second so did one under TCG on a loaded host (13 draws from 4 clients in 40 s). One call
# per 20 s leaves 4 clients that each finish more than one call in 20 s over it.
READ_BURST=5 READ_PER_SEC=0.05
mkdir -p /etc/systemd/system/gpuctld.service.d
printf '[Service]\nEnvironment=GPUCTL_READ_LIMIT=%s/%s\n' "$READ_BURST" "$READ_PER_SEC" \
    >/etc/systemd/system/gpuctld.service.d/60-vmtest-reads.conf
shell_setup
restarts0=$(systemctl show -P NRestarts gpuctld.service)
since=$(date '+%Y-%m-%d %H:%M:%S')

run_ms() { # alice's gpuctl run, in ms
    local t0 t1
    t0=$(date +%s%N)
    as alice 'gpuctl run --team infer -- true' || echo "run failed: $?" >&2
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000000))
}
before=0
for _ in 1 2 3; do before=$((before + $(run_ms))); done

out=/tmp/flood
mkdir -p $out
chmod 777 $out
for i in 1 2 3 4; do
    as bob "end=\$((\$(date +%s) + 20)); while [ \$(date +%s) -lt \$end ]; do busctl call org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Plan >/dev/null 2>>$out/plan$i; done" &
    as bob "end=\$((\$(date +%s) + 20)); while [ \$(date +%s) -lt \$end ]; do busctl call org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Join s infer >/dev/null 2>>$out/join$i; done" &
done
sleep 5
during=0
for _ in 1 2 3; do during=$((during + $(run_ms))); done
check "root's gpuctl status answers during the flood" timeout 30 gpuctl status
check "alice joins during the flood" test "$(as alice 'gpuctl run --team infer -- cat /proc/self/cgroup' | grep -c gpu-infer.slice)" = 1
wait
limited=$(cat $out/plan* $out/join* | grep -c 'LimitsExceeded\|too many calls')
refused=$(cat $out/join* | grep -c 'not a member')
echo "bob: $limited calls rate limited, $refused Join refusals answered"
check "bob was rate limited" test "$limited" -gt 0
check "NRestarts unchanged" test "$(systemctl show -P NRestarts gpuctld.service)" = "$restarts0"
lines=$(journalctl -u gpuctld.service --since "$since" -o cat | grep -c 'join-refused\|over its rate\|not a member\|refused')
echo "journal lines about bob's refusals: $lines"
check "refusal logging is rate limited (<= 30 lines in ~25 s)" test "$lines" -le 30
rss=$(awk '/VmRSS/ {print $2}' "/proc/$(systemctl show -P MainPID gpuctld.service)/status")
echo "BENCH harden-rss-after-flood-kib $rss"
check "RSS bounded (< 64 MiB)" test "$rss" -lt 65536
echo "BENCH harden-alice-run-during-flood-ms $((during / 3)) baseline-before-flood-ms $((before / 3)) ratio $(awk -v a="$during" -v b="$before" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')"

# bob floods the read methods (Usage, Idle, Metrics) from 6 clients: they are served from the
# shared last sample and drawn from his read budget, so carol's `gpuctl status` stays near its
# own time (issue 34: within 2 s on the release package; the figure goes to performance.md).
status_ms() {
    local t0 t1
    t0=$(date +%s%N)
    # A failed status is a failure, not a fast answer.
    as carol 'gpuctl status >/dev/null' || echo "status failed: $?" >>/tmp/81-status-failed
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000000))
}
rm -f /tmp/81-status-failed
sbefore=0
for _ in 1 2 3; do sbefore=$((sbefore + $(status_ms))); done
fstart=$(date +%s%N)
for m in "Usage" "Idle" "Metrics s prometheus-text"; do
    for i in 1 2; do
        as bob "end=\$((\$(date +%s) + 15)); while [ \$(date +%s) -lt \$end ]; do busctl call org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 $m >/dev/null 2>>$out/read-${m%% *}$i; echo >>$out/count-${m%% *}$i; done" &
    done
done
sleep 4
sduring=0 smax=0
for _ in 1 2 3; do
    ms=$(status_ms)
    sduring=$((sduring + ms))
    [ "$ms" -gt "$smax" ] && smax=$ms
done
wait
# The budget refills only while bob draws: from the flood's start to its last call (the newest
# count file), not to the end of carol's status calls after it.
flood_end=$(stat -c %Y $out/count-* | sort -n | tail -n 1)
fsecs=$((flood_end - fstart / 1000000000 + 1))
rlimited=$(cat $out/read-* | grep -c 'LimitsExceeded\|too many calls')
# Usage and Idle draw from bob's read budget (set above); cached Metrics do not. More draws than
# the budget can refill in the flood's time must have been refused.
draws=$(cat $out/count-Usage* $out/count-Idle* | wc -l)
budget=$(awk -v b="$READ_BURST" -v r="$READ_PER_SEC" -v s="$fsecs" 'BEGIN { x = b + r * s; printf "%d", (x > int(x) ? int(x) + 1 : x) }')
echo "bob's read flood: $draws Usage/Idle calls in ${fsecs} s (budget $budget), $rlimited rate limited"
check "bob's read flood went past his budget ($draws draws, budget $budget)" test "$draws" -gt "$budget"
check "bob's read flood, past his budget, is rate limited" test "$rlimited" -ge $((draws - budget))
check_empty "carol's gpuctl status answered every time" sh -c 'cat /tmp/81-status-failed 2>/dev/null || true'
echo "BENCH carol-status-during-read-flood-ms $((sduring / 3)) max $smax baseline-before-flood-ms $((sbefore / 3)) ratio $(awk -v a="$sduring" -v b="$sbefore" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')"
check "carol's status during bob's read flood within 5x its time before" \
    test "$sduring" -le $((5 * sbefore + 300))
check "NRestarts still unchanged" test "$(systemctl show -P NRestarts gpuctld.service)" = "$restarts0"
finish

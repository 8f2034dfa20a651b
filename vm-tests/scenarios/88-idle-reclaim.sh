#!/bin/bash
# 88: idle shares (issue 12). Two teams on three fake H100s (GPM activity). research has a stop
# rule with short windows: its idle holder, a `gpuctl run` scope of alice's on GPU 0, is warned
# (on her terminal and in the journal with her uid) and then stopped; its busy service on GPU 1
# (GPM activity 80%) and an excluded idle service on GPU 3 survive. infer (report only) has an
# idle service on GPU 2: reported, untouched. The journal names user and unit. Who sees what:
# carol (research) reads research's holders by name and infer's without; bob (no team) and the
# exporter read no unit or user at all, root reads everything. Placement and idle reclaim
# agree: with two research devices leased and the third held by the excluded service (a process
# outside every lease: busy), a `--wait` job of carol's queues, and alice's idle stop hands it
# her device. `gpuctl events --follow` as alice prints her warning and stop as they happen and
# carol's queued job starting (her team's); as bob it prints nothing of theirs.
# vmtest: timeout=600
# vmtest: group=usage
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
. lib/usage.sh

gpuctld_setup 4
test_users
idle_sampling_fast
put_policy 88-idle.toml <<'P'
version = 1
[teams.research]
members = ["alice", "@ml-train"]
[teams.research.idle]
after = "20s"
below = "5%"
action = "stop"
grace = "15s"
exclude = ["triton-*.service"]
[teams.infer]
members = ["@ml-infer"]
[teams.infer.idle]
after = "20s"
action = "report"
[[gpu]]
index = [0, 1, 3]
owner = "research"
[[gpu]]
index = [2]
owner = "infer"
P
check_output "the policy with idle rules validates" gpuctl validate /etc/gpuctl/policy.d/88-idle.toml
gpuctld_start
check "gpuctld converged" wait_converged 60
# Following from now on (-n 0), before anything happens; and the bus's Event signals.
timeout 400 busctl --system --json=short monitor org.gpuctl.Agent1 >/tmp/88-bus.json 2>/dev/null &
setpriv --reuid=alice --regid=alice --init-groups \
    gpuctl events --follow -n 0 --json >/tmp/88-alice.events 2>/tmp/88-alice.events.err &
A_EV=$!
setpriv --reuid=bob --regid=bob --init-groups \
    gpuctl events --follow -n 0 --json >/tmp/88-bob.events 2>/tmp/88-bob.events.err &
B_EV=$!

# alice's terminal: a pty she owns (script(1) run as her), its output kept in a file.
rm -f /tmp/alice-tty.log
setpriv --reuid=alice --regid=alice --init-groups \
    script -q -f -c 'sleep 400' /tmp/alice-tty.log </dev/null >/dev/null 2>&1 &
# The idle holder: alice's `gpuctl run` scope.
setpriv --reuid=alice --regid=alice --init-groups gpuctl run --team research -- sleep 401 &
wait_for 30 pgrep -xf 'sleep 401' >/dev/null
P_IDLE=$(pgrep -xf 'sleep 401')
SCOPE=$(sed -nE 's#^0::.*/(gpuctl-run-[^/]+\.scope).*#\1#p' "/proc/$P_IDLE/cgroup")
# carol's busy job: placed on the other device (alice's holds GPU 0, one job per whole GPU).
setpriv --reuid=carol --regid=carol --init-groups gpuctl run --team research -- sleep 405 &
wait_for 30 pgrep -xf 'sleep 405' >/dev/null
P_CJOB=$(pgrep -xf 'sleep 405')
CSCOPE=$(sed -nE 's#^0::.*/(gpuctl-run-[^/]+\.scope).*#\1#p' "/proc/$P_CJOB/cgroup")
dev_of() { tr '\0' '\n' <"/proc/$1/environ" | sed -n 's/^CUDA_VISIBLE_DEVICES=//p'; }
check "placement: alice's job on GPU 0, carol's on GPU 1" \
    test "$(dev_of "$P_IDLE") $(dev_of "$P_CJOB")" = "$(gpu_uuid 0) $(gpu_uuid 1)"
systemd-run -q --unit=triton-x --slice=gpu-research.slice -p User=carol sleep 402
systemd-run -q --unit=train-busy --slice=gpu-research.slice -p User=carol sleep 403
systemd-run -q --unit=infer-nb --slice=gpu-infer.slice -p User=alice sleep 404
P_TRITON=$(systemctl show -P MainPID triton-x.service)
P_BUSY=$(systemctl show -P MainPID train-busy.service)
P_INFER=$(systemctl show -P MainPID infer-nb.service)
echo "idle $P_IDLE ($SCOPE), triton $P_TRITON, busy $P_BUSY, infer $P_INFER; tty: $(find /dev/pts -user alice | tr "\n" " ")"
check "the idle holder runs in a gpuctl run scope" test -n "$SCOPE"
S=$FAKE_NVML_STATE
flock "$S.lock" sh -c "jq '.processes += [
    {pid: $P_IDLE, gpu: 0, used_memory_mib: 2000},
    {pid: $P_TRITON, gpu: 3, used_memory_mib: 1000},
    {pid: $P_BUSY, gpu: 1, used_memory_mib: 3000},
    {pid: $P_CJOB, gpu: 1, used_memory_mib: 1000},
    {pid: $P_INFER, gpu: 2, used_memory_mib: 500}]
  | .usage.gpus[\"1\"] = {utilization_gpu: 80, gpm_sm_activity: 80.0}' '$S' >'$S.new' && mv '$S.new' '$S'"

# With GPUs 0 and 1 leased and GPU 3 held by triton (in no gpuctl job), carol's next job waits
# in the queue; the idle stop of alice's scope ends its lease and the waiter gets GPU 0.
rm -f /tmp/88-waited.dev
setpriv --reuid=carol --regid=carol --init-groups gpuctl run --team research --wait=300s -- \
    sh -c 'echo $CUDA_VISIBLE_DEVICES >/tmp/88-waited.dev; exec sleep 406' >/dev/null 2>&1 &
check "carol's third job waits in research's queue, GPU 3 busy with triton's memory" \
    wait_for 20 sh -c "gpuctl status | grep -q '^  research #1: carol'"

j() { gpuctld_journal "$@" -o json | jq -r '[.GPUCTL_ACTION, .GPUCTL_UNIT, .GPUCTL_USER, .GPUCTL_UID, .MESSAGE] | @tsv'; }
# shellcheck disable=SC2317 # called through wait_for and check
stopped() { ! systemctl is-active -q "$SCOPE"; }
wait_for 150 stopped
J=/tmp/88-journal.tsv
j GPUCTL_ACTION=idle GPUCTL_ACTION=idle-warn GPUCTL_ACTION=idle-stop >"$J"
sed 's/^/    journal| /' "$J"
uid=$(id -u alice)
check_output "the idle scope was warned, in the journal with alice's uid" \
    grep -P "^idle-warn\t$SCOPE\talice\t$uid\t" "$J"
check_output "then stopped, the journal naming user, unit and idle time" \
    grep -P "^idle-stop\t$SCOPE\talice\t$uid\tstopping $SCOPE of user alice .* idle for " "$J"
check "the idle scope is gone" stopped
wait_for 10 test -s /tmp/88-waited.dev
check "the waiter started once the idle stop ended alice's lease, on her device" \
    test "$(cat /tmp/88-waited.dev 2>&1)" = "$(gpu_uuid 0)"
check "the warning reached alice's terminal" grep -q "Message from gpuctld" /tmp/alice-tty.log
# The position of alice's event of kind $1 for unit $2 (empty: none).
seq_of() { jq -r --arg k "$1" --arg s "$2" 'select(.kind == $k and .unit == $s) | .seq' /tmp/88-alice.events; }
# alice_has JQ [jq options]: one of alice's events matches JQ (read as one array: jq 1.6's -e
# looks at the last line only).
# shellcheck disable=SC2317 # called through wait_for and check
alice_has() { jq -se "${@:2}" "any(.[]; $1)" /tmp/88-alice.events >/dev/null; }
# shellcheck disable=SC2317 # called through wait_for and check
placed_seen() { alice_has '.kind == "queue-placed" and .uid == $u' --argjson u "$(id -u carol)"; }
wait_for 10 placed_seen
sed 's/^/    alice events| /' /tmp/88-alice.events /tmp/88-alice.events.err
sed 's/^/    bob events| /' /tmp/88-bob.events /tmp/88-bob.events.err
check "alice's follower printed her warning with her uid and device" \
    alice_has '.kind == "idle-warn" and .unit == $s and .uid == $u and .team == "research" and .device == "0"' \
    --arg s "$SCOPE" --argjson u "$uid"
WSEQ=$(seq_of idle-warn "$SCOPE")
SSEQ=$(seq_of idle-stop "$SCOPE")
check "and her stop, after the warning (positions $WSEQ, $SSEQ)" test "${SSEQ:-0}" -gt "${WSEQ:-0}" -a -n "$WSEQ"
check "and carol's queued job starting (alice's team's)" placed_seen
check_output "the bus carried the Event signal of the warning, its team and not its user" \
    jq -se --argjson n "${WSEQ:-0}" 'any(.[]; .member == "Event" and .payload.data == [$n, "idle-warn", "research"])' /tmp/88-bus.json
check "alice's follower still runs" kill -0 "$A_EV"
check "bob's follower still runs" kill -0 "$B_EV"
check_not "bob (no team) was shown no event of research" grep -q . /tmp/88-bob.events
ea=$(setpriv --reuid=alice --regid=alice --init-groups gpuctl events 2>&1)
check_output "gpuctl events as alice, in words" grep -E "^[0-9T:-]+Z idle-warn research alice: Your GPU job $SCOPE" <<<"$ea"
er=$(gpuctl events --json 2>&1)
check_output "root reads the same events" grep -q "\"unit\":\"$SCOPE\"" <<<"$er"
kill "$A_EV" "$B_EV" 2>/dev/null || true
pkill -f 'busctl --system --json=short monitor' || true
check_output "the busy service survives" systemctl is-active train-busy.service
check_output "the excluded idle service survives" systemctl is-active triton-x.service
check_output "the excluded service was reported" grep -P "^idle\ttriton-x.service\t" "$J"
check_not "and neither warned nor stopped" grep -P "^idle-(warn|stop)\ttriton-x" "$J"
check_output "infer's idle service was reported" grep -P "^idle\tinfer-nb.service\talice\t" "$J"
check_output "and left running (report only)" systemctl is-active infer-nb.service
check_not "infer's service was neither warned nor stopped" grep -P "^idle-(warn|stop)\tinfer-nb" "$J"
check_not "the busy service was never flagged" grep -q "train-busy" "$J"
idle=$(gpuctl idle --json)
echo "$idle" | jq -c '.holders[] | [.team, .unit, .phase, .excluded]' | sed 's/^/    idle| /'
check_output "gpuctl idle lists infer's holder as idle" \
    test "$(jq -r '.holders[] | select(.unit == "infer-nb.service") | .phase' <<<"$idle")" = idle
top=$(gpuctl top --once 2>&1)
check_output "gpuctl top marks it" grep -E 'infer-nb.service.*\[idle\]' <<<"$top"
plan=$(gpuctl plan 2>&1)
check_output "gpuctl plan says what is pending" grep -E '^idle actions' <<<"$plan"
metrics=$(gpuctl metrics 2>&1)
check_output "the idle metric names it" grep -E 'gpuctl_idle_holder\{.*unit="infer-nb.service"' <<<"$metrics"

carol=(setpriv --reuid=carol --regid=carol --init-groups)
bob=(setpriv --reuid=bob --regid=bob --init-groups)
names() { jq -c '[.holders[] | [.team, .unit, .user, (.pids | length)]] | sort' <<<"$1"; }
ic=$("${carol[@]}" gpuctl idle --json)
ib=$("${bob[@]}" gpuctl idle --json)
names "$ic" | sed 's/^/    carol idle| /'
names "$ib" | sed 's/^/    bob idle| /'
check_output "carol (research) reads research's holders by name" \
    test "$(jq -r '[.holders[] | select(.team == "research") | .unit] | sort | join(",")' <<<"$ic")" = "$CSCOPE,train-busy.service,triton-x.service"
check_output "but not infer's: no unit, user or pids" \
    test "$(jq -c '[.holders[] | select(.team == "infer") | [.unit, .user, .uid, (.pids | length)]] | unique' <<<"$ic")" = '[["",null,null,0]]'
check_output "bob (no team) reads every holder, without unit, user or pids" \
    test "$(jq -c '[.holders[] | [.unit, .user, .uid, (.pids | length)]] | unique' <<<"$ib"),$(jq '[.holders[].team] | unique' <<<"$ib" | jq -c .)" = \
    '[["",null,null,0]],["infer","research"]'
check_output "bob's gpuctl idle shows the holders as (hidden)" \
    sh -c '"$@" gpuctl idle | grep -q "(hidden)" && ! "$@" gpuctl idle | grep -qE "alice|carol|infer-nb|triton"' _ "${bob[@]}"
mb=$("${bob[@]}" gpuctl metrics 2>&1)
check_output "bob's metrics: idle series without unit or user" \
    bash -c 'grep -q "^gpuctl_idle_holder{team=\"infer\",user=\"\",unit=\"\"" <<<"$1" && ! grep -E "(user|unit)=\"[^\"]" <<<"$1"' _ "$mb"
tb=$("${bob[@]}" gpuctl top --once 2>&1)
check_output "bob's top names nobody" sh -c '! grep -qE "alice|carol|infer-nb|triton|train-busy|gpuctl-run"' <<<"$tb"
check_output "bob's top counts the processes" grep -qE "^[0-9]+ GPU\(s\), [1-9][0-9]* process" <<<"$tb"
systemctl start gpuctl-exporter.socket
E=http://127.0.0.1:9849/metrics
ex=$(http get "$E" 2>&1)
grep '^gpuctl_idle_holder' <<<"$ex" | sed 's/^/    exporter| /'
check_output "the exporter's scrape: idle series, no unit or user label" \
    bash -c 'grep -q "^gpuctl_idle_holder{team=\"infer\"" <<<"$1" && ! grep -E "(user|unit)=\"[^\"]" <<<"$1"' _ "$ex"
systemctl stop gpuctl-exporter.socket gpuctl-exporter.service 2>/dev/null || true
systemctl stop triton-x.service train-busy.service infer-nb.service 2>/dev/null || true
pkill -u alice -x script || true
pkill -xf 'sleep 40[56]' || true
finish

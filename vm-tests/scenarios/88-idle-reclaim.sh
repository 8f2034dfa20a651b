#!/bin/bash
# 88: idle shares (issue 12). Two teams on three fake H100s (GPM activity). research has a stop
# rule with short windows: its idle holder, a `gpuctl run` scope of alice's on GPU 0, is warned
# (on her terminal and in the journal with her uid) and then stopped; its busy service on GPU 1
# (GPM activity 80%) and an excluded idle service on GPU 0 survive. infer (report only) has an
# idle service on GPU 2: reported, untouched. The journal names user and unit.
# vmtest: timeout=420
# vmtest: group=usage
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup 3
test_users
mkdir -p /etc/systemd/system/gpuctld.service.d
cat >/etc/systemd/system/gpuctld.service.d/60-vmtest-idle.conf <<'EOF'
[Service]
Environment=GPUCTL_IDLE_INTERVAL_MS=2000 GPUCTL_USAGE_INTERVAL_MS=500
EOF
systemctl daemon-reload
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
index = [0, 1]
owner = "research"
[[gpu]]
index = [2]
owner = "infer"
P
check_output "the policy with idle rules validates" gpuctl validate /etc/gpuctl/policy.d/88-idle.toml
gpuctld_start
check "gpuctld converged" wait_converged 60

# alice's terminal: a pty she owns (script(1) run as her), its output kept in a file.
rm -f /tmp/alice-tty.log
setpriv --reuid=alice --regid=alice --init-groups \
    script -q -f -c 'sleep 400' /tmp/alice-tty.log </dev/null >/dev/null 2>&1 &
# The idle holder: alice's `gpuctl run` scope.
setpriv --reuid=alice --regid=alice --init-groups gpuctl run --team research -- sleep 401 &
wait_for 30 pgrep -xf 'sleep 401' >/dev/null
P_IDLE=$(pgrep -xf 'sleep 401')
SCOPE=$(sed -nE 's#^0::.*/(gpuctl-run-[^/]+\.scope).*#\1#p' "/proc/$P_IDLE/cgroup")
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
    {pid: $P_TRITON, gpu: 0, used_memory_mib: 1000},
    {pid: $P_BUSY, gpu: 1, used_memory_mib: 3000},
    {pid: $P_INFER, gpu: 2, used_memory_mib: 500}]
  | .usage.gpus[\"1\"] = {utilization_gpu: 80, gpm_sm_activity: 80.0}' '$S' >'$S.new' && mv '$S.new' '$S'"

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
check "the warning reached alice's terminal" grep -q "Message from gpuctld" /tmp/alice-tty.log
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
systemctl stop triton-x.service train-busy.service infer-nb.service 2>/dev/null || true
pkill -u alice -x script || true
finish

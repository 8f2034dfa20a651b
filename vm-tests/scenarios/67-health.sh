#!/bin/bash
# 67: device health (docs/health.md). Three fake H100s whole for team train, one job per device.
# alice holds GPU 1 (her terminal a script(1) pty), carol GPUs 0 and 2, and carol waits with
# --wait. The fake raises XID 79 on GPU 1: within seconds gpuctl device list shows GPU 1 out of
# service with the XID, the journal has the quarantine, alice's terminal has the message; when
# alice's job ends carol's waiter does not get GPU 1, a new job is refused naming GPU 1 as out of
# service, and the waiter gets GPU 2 when that frees. XID 13 on GPU 0 only counts. The quarantine
# survives a gpuctld restart; a non-root drain is refused; `gpuctl device resume 1 --reason`
# brings GPU 1 back (journalled with the reason) and the next job may land there. Both are
# events (`gpuctl events`) that anyone reads, a user in no team too. With on-fault = "stop" the
# job there is stopped after its grace; with reset-when-idle, GPU 1 is reset once nothing holds
# it and comes back.
# vmtest: timeout=600
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup 3
test_users
# Counters every second (events wake the watcher at once either way).
cat >>/etc/systemd/system/gpuctld.service.d/50-vmtest-nvml.conf <<'EOF2'
Environment=GPUCTL_HEALTH_INTERVAL_MS=1000
EOF2
systemctl daemon-reload
# policy [HEALTH-TOML]: train holds the three GPUs, one job per device; HEALTH-TOML goes under
# [host.health].
policy() {
    put_policy 67-health.toml <<P
version = 1
[host.health]
${1:-}
[teams.train]
members = ["alice", "carol"]
[teams.train.placement]
jobs-per-device = 1
[[gpu]]
index = [0, 1, 2]
owner = "train"
P
}
policy
gpuctld_start
check "gpuctld converged" wait_converged 60
G0=$(gpu_uuid 0) G1=$(gpu_uuid 1) G2=$(gpu_uuid 2)
d=$(mktemp -d)
chmod 777 "$d"

rm -f /tmp/alice-tty.log
setpriv --reuid=alice --regid=alice --init-groups \
    script -q -f -c 'sleep 400' /tmp/alice-tty.log </dev/null >/dev/null 2>&1 &
su -s /bin/sh alice -c "gpuctl run --team train --device $G1 -- sleep 301" >/dev/null 2>&1 &
su -s /bin/sh carol -c "gpuctl run --team train --device $G0 -- sleep 302" >/dev/null 2>&1 &
su -s /bin/sh carol -c "gpuctl run --team train --device $G2 -- sleep 303" >/dev/null 2>&1 &
wait_for 30 sh -c "test \$(systemctl list-units --plain --no-legend 'gpuctl-run-*.scope' | wc -l) = 3"
su -s /bin/sh carol -c "gpuctl run --team train --wait=120s -- sh -c 'echo \$CUDA_VISIBLE_DEVICES >$d/waited.dev; sleep 60'" \
    >"$d/wait.out" 2>&1 &
# The scope holding device $1: root's gpuctl status names it (a scope's own name and
# description are opaque).
scope_on() {
    gpuctl status | sed -nE "s#^  train $1: .* (gpuctl-run-[0-9a-f]+\.scope) since .*#\1#p" | head -1
}
# shellcheck disable=SC2317 # called through wait_for
queued() { gpuctld_journal GPUCTL_ACTION=queued | grep -q .; }
wait_for 20 queued
check "every device is held: carol's job waits" test ! -e "$d/waited.dev"

t0=$(date +%s%N)
fake_xid 1 79
check "GPU 1 is out of service within 15 s" wait_for 15 sh -c "gpuctl device list | grep '$G1' | grep -q 'OUT since .* by gpuctld: XID 79'"
echo "BENCH XID 79 to out of service: $((($(date +%s%N) - t0) / 1000000)) ms"
gpuctl device list | sed 's/^/    device| /'
check "gpuctl teams shows GPU 1 out in train's share" \
    sh -c "gpuctl teams | grep -A1 '\] $G1 out ' | grep -q 'OUT OF SERVICE since .* by gpuctld: XID 79'"
check "gpuctl status marks GPU 1 out of service with the XID" \
    sh -c "gpuctl status | grep -q '^    OUT OF SERVICE $G1 since [0-9]* (unix) by gpuctld: XID 79'"
check "gpuctl top marks GPU 1 out of service under its line" \
    sh -c "gpuctl top --once | grep -A1 '^GPU 1 ' | grep -q 'OUT OF SERVICE since .* (gpuctld): XID 79'"
ENV=/run/gpuctl/teams/train.env
check_output "train's env file leaves GPU 1 out" wait_for 15 sh -c "grep '^CUDA_VISIBLE_DEVICES=' $ENV | grep -q '$G0' && ! grep -q '$G1' $ENV"
check "its slice still allows /dev/nvidia1 for the job there" sh -c "systemctl show -P DeviceAllow gpu-train.slice | grep -q '/dev/nvidia1 '"
check "the journal has the quarantine with its device and reason" \
    grep -q "device $G1 out of service: XID 79" <<<"$(gpuctld_journal GPUCTL_ACTION=health-quarantine GPUCTL_GPU="$G1")"
check "alice was told on her terminal" wait_for 10 grep -q "$G1 is out of service: XID 79" /tmp/alice-tty.log
# The host's events: anyone reads them, bob (in no team) too.
ev=$(su -s /bin/sh bob -c "gpuctl events --json" 2>&1)
check_output "bob reads GPU 1's device-out event in gpuctl events" \
    jq -se --arg d "$G1" 'any(.[]; .kind == "device-out" and .device == $d and .team == null and (.message | test("XID 79")))' <<<"$ev"

systemctl kill -s KILL "$(scope_on "$G1")"
sleep 3
check "with GPU 1 free but out of service the waiter still waits" test ! -e "$d/waited.dev"
rc=0
out=$(su -s /bin/sh alice -c "gpuctl run --team train -- true" 2>&1) || rc=$?
echo "    new job: rc=$rc $out"
check "a new job exits 8 (nothing free now)" test "$rc" = 8
check "its message names GPU 1 out of service and why" grep -q "out of service: $G1 since [0-9]* (XID 79" <<<"$out"
systemctl kill -s KILL "$(scope_on "$G2")"
wait_for 30 test -s "$d/waited.dev"
check "the waiter got GPU 2, not GPU 1" test "$(cat "$d/waited.dev" 2>/dev/null)" = "$G2"

fake_xid 0 13
check "XID 13 on GPU 0 is counted" wait_for 15 sh -c "gpuctl device list | grep '$G0' | grep -q '13×1'"
check "and GPU 0 stays in service" sh -c "gpuctl device list | grep '$G0' | grep -q 'in service'"

systemctl restart gpuctld.service
check "gpuctld converged after a restart" wait_converged 60
check "after a restart GPU 1 is still out of service" sh -c "gpuctl device list | grep '$G1' | grep -q 'OUT since'"
check_not "a non-root drain is refused" su -s /bin/sh alice -c "gpuctl device drain 0 --reason test"
out=$(gpuctl device resume 1 --reason "reseated the board" 2>&1)
echo "    resume: $out"
check "gpuctl device resume brings GPU 1 back" grep -q "$G1: back in service (reseated the board by" <<<"$out"
check "the journal has the resume with the reason" journal_has "device $G1 back in service .*: reseated the board"
ev=$(su -s /bin/sh alice -c "gpuctl events --json" 2>&1)
check_output "alice reads its device-back event" \
    jq -se --arg d "$G1" 'any(.[]; .kind == "device-back" and .device == $d and (.message | test("reseated the board")))' <<<"$ev"
check "train's env file lists GPU 1 again" wait_for 15 grep -q "^CUDA_VISIBLE_DEVICES=.*$G1" "$ENV"
out=$(su -s /bin/sh alice -c "gpuctl run --team train --device 1 -- sh -c 'echo \$CUDA_VISIBLE_DEVICES'" 2>&1)
check "a new job lands on GPU 1 again" test "$out" = "$G1"

# on-fault = "stop": a job on a device a fault takes out is told at once and stopped after its
# grace, not before; the quarantine's own journal time is the start of the grace.
policy 'on-fault = "stop"
grace = "4s"'
reload_wait
su -s /bin/sh alice -c "gpuctl run --team train --device 1 -- sleep 304" >/dev/null 2>&1 &
wait_for 30 sh -c "gpuctl status | grep -q '^  train $G1: .*gpuctl-run-'"
s1=$(scope_on "$G1") s0=$(scope_on "$G0")
echo "    GPU 1: ${s1:-none}, GPU 0: ${s0:-none}"
fake_xid 1 79
check "GPU 1 is out of service again" wait_for 15 sh -c "gpuctl device list | grep '$G1' | grep -q 'OUT since'"
check "alice is told her job will be stopped" wait_for 10 grep -q "Jobs on it are stopped in 4 s" /tmp/alice-tty.log
check "the job on GPU 1 is stopped" wait_for 30 sh -c "! systemctl is-active -q '$s1'"
# The quarantine and the stop, each with its journal time in microseconds.
jtime() { journalctl -u gpuctld.service -o json --since "@${VMTEST_SCENARIO_START:-0}" "GPUCTL_ACTION=$1" "GPUCTL_GPU=$G1" | tail -n1 | jq -r .__REALTIME_TIMESTAMP; }
q=$(jtime health-quarantine) st=$(jtime health-stop)
echo "    quarantine $q, stop $st: $(((${st:-0} - ${q:-0}) / 1000)) ms"
check "the stop came after the 4 s grace" test "$((${st:-0} - ${q:-0}))" -ge 4000000
check "the journal names the stopped job" journal_has "device $G1: grace over (on-fault = stop): stopped 1 job(s): $s1"
check "carol's job on GPU 0, in service, still runs" systemctl is-active -q "${s0:-none}"

# reset-when-idle: GPU 1, out of service and now with a row remap pending, is reset only once
# nothing holds it, through the fake's reset, which refuses while another NVML client of
# gpuctld (its health watcher, its usage collector) is open; the reset carries out the remap
# and GPU 1 comes back and stays back.
S=$FAKE_NVML_STATE
fake_jq() { (flock 9 && jq "$@" "$S" >"$S.new" && mv "$S.new" "$S") 9>"$S.lock"; }
resets() { jq -c '[.call_log[]? | select(.function == "fakeNvmlResetGpu") | .result]' "$S"; }
sleep 600 &
P=$!
fake_jq --argjson p "$P" '.processes += [{pid: $p, gpu: 1, used_memory_mib: 100}] | .health.gpus["1"].remap_pending = true'
policy 'reset-when-idle = true'
reload_wait
check "the reset waits while a process holds GPU 1" \
    wait_for 20 journal_has "GPU 1 ($G1) needs a reset; waiting until it is idle: held by pid $P"
check "and GPU 1 is not reset meanwhile" test "$(resets)" = "[]"
fake_jq --argjson p "$P" 'del(.processes[] | select(.pid == $p))'
kill "$P"
check "once idle gpuctld resets GPU 1" wait_for 30 journal_has "GPU 1 ($G1) reset$"
check_output "with its other NVML clients closed: one reset, accepted" test "$(resets)" = '["NVML_SUCCESS"]'
check "the reset carried out the pending remap" \
    test "$(jq '.health.gpus["1"].remap_pending' "$S")" = false
check "the journal has GPU 1 back in service by the reset" \
    wait_for 10 journal_has "device $G1 back in service (reset): GPU reset while idle"
check "train's env file lists GPU 1 again after the reset" wait_for 15 grep -q "^CUDA_VISIBLE_DEVICES=.*$G1" "$ENV"
check "the metrics count one idle reset of GPU 1" \
    sh -c "gpuctl metrics | grep -qx 'gpuctl_device_resets_total{gpu=\"1\",device=\"$G1\"} 1'"
sleep 3
check "GPU 1 stays in service over the next counter reads" \
    sh -c "gpuctl device list | grep '$G1' | grep -q 'in service'"

pkill -u alice -x script || true
finish

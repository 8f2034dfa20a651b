#!/bin/bash
# 60: members step into their team's share with `gpuctl run`; everyone else gets one clear line
# and a documented exit code. alice (group ml-infer) lands in gpu-infer.slice with the daemon's
# environment (an inherited CUDA_VISIBLE_DEVICES=evil is replaced); in there her own GPU opens
# (ENXIO) and train's is denied (EPERM); bob (no team) is refused with 3; hostile names 4 on
# both sides; a device-less team joinable; daemon stopped 6; the bus policy keeps Apply/Reload
# from users.
# vmtest: timeout=420
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
shell_setup

out=$(as alice 'gpuctl run --team infer -- cat /proc/self/cgroup')
echo "alice: gpuctl run --team infer -- cat /proc/self/cgroup -> $out"
check "alice's command runs in a scope in gpu-infer.slice" \
    grep -Eq '^0::/gpu.slice/gpu-infer.slice/gpuctl-run-[0-9a-f]{16}.scope$' <<<"$out"

env_out=$(as alice 'CUDA_VISIBLE_DEVICES=evil NVIDIA_VISIBLE_DEVICES=all GPUCTL_TEAM=train gpuctl run --team infer -- env' | grep -E '^(CUDA|NVIDIA|GPUCTL)_' | sort)
check_output "the daemon's environment wins over an inherited one" \
    test "$(grep -c . <<<"$env_out")" -ge 4 -a -n "$(grep -x "CUDA_VISIBLE_DEVICES=$(gpu_uuid 0)" <<<"$env_out")" \
    -a -n "$(grep -x 'GPUCTL_TEAM=infer' <<<"$env_out")" -a -z "$(grep evil <<<"$env_out")" \
    -a -n "$(grep -x "NVIDIA_VISIBLE_DEVICES=$(gpu_uuid 0)" <<<"$env_out")"
while IFS= read -r l; do echo "    env: $l"; done <<<"$env_out"

r=$(probe_in infer alice /dev/nvidia0); echo "alice in infer -> /dev/nvidia0: $r"
check "own GPU allowed inside the scope (ENXIO)" test "$r" = ENXIO
r=$(probe_in infer alice /dev/nvidia1); echo "alice in infer -> /dev/nvidia1: $r"
check "train's GPU denied inside infer's scope (EPERM)" test "$r" = EPERM
r=$(probe_in train alice /dev/nvidia1); echo "alice in train -> /dev/nvidia1: $r"
check "alice as a listed member of train reaches train's GPU (ENXIO)" test "$r" = ENXIO
r=$(probe_in train alice /dev/nvidia0); echo "alice in train -> /dev/nvidia0: $r"
check "... and not infer's from there (EPERM)" test "$r" = EPERM

as alice 'gpuctl run --team infer -- sh -c "exit 42"'; rc=$?
check "the command's exit status passes through (42)" test $rc = 42
as alice 'gpuctl run --team infer -- /no/such/cmd' 2>/dev/null; rc=$?
check "a missing command gives 127" test $rc = 127

msg=$(as bob 'gpuctl run --team infer -- true' 2>&1); rc=$?
echo "bob: rc=$rc: $msg"
check "bob (no team) is refused with exit 3" test $rc = 3
check "the refusal is one line naming the policy's members" \
    test "$(grep -c . <<<"$msg")" = 1 -a -n "$(grep -F 'bob is not a member of team "infer" (members: @ml-infer)' <<<"$msg")"
msg=$(as bob 'gpuctl shell --team infer' 2>&1 </dev/null); rc=$?
check "bob's gpuctl shell is refused with 3 too" test $rc = 3

msg=$(as alice 'gpuctl run --team nope -- true' 2>&1); rc=$?
echo "unknown team: rc=$rc: $msg"
check "unknown team: exit 4, the known teams named" test $rc = 4 -a -n "$(grep -F '(teams: empty, infer, train)' <<<"$msg")"
for bad in '../x' 'a-b' "$(printf 'in\tfer')" "$(head -c 300 /dev/zero | tr '\0' a)"; do
    as alice "gpuctl run --team '$bad' -- true" >/dev/null 2>&1; rc=$?
    check "client refuses hostile name $(printf %q "${bad:0:20}") with 4" test $rc = 4
done
# Server side: the same names sent straight over the bus, bypassing the client's check.
for bad in '../x' 'a-b' 'x/../../etc' "$(head -c 300 /dev/zero | tr '\0' a)"; do
    out=$(as alice "busctl call org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Join s '$bad'" 2>&1)
    check "gpuctld refuses hostile name $(printf %q "${bad:0:20}") before any lookup" \
        grep -q 'is not a valid team name' <<<"$out"
done
for i in $(seq 50); do [ -z "$(systemctl list-units --all --plain --no-legend 'gpuctl-run-*')" ] && break; sleep 0.2; done
check_empty "no scope left: placed ones ended with their command, refused ones were never made" \
    systemctl list-units --all --plain --no-legend 'gpuctl-run-*'

msg=$(as alice 'gpuctl run --team empty -- true' 2>&1); rc=$?
echo "team without devices: rc=$rc: $msg"
check "a team the policy gives no devices is joinable (issue 17; exit 5 is for missing devices, 76)" test $rc = 0

out=$(as alice 'gpuctl env --team infer --format systemd'); while IFS= read -r l; do echo "    alice env: $l"; done <<<"$out"
check "gpuctl env (systemd format) matches the env file" test "$out" = "$(grep -v '^#' /run/gpuctl/teams/infer.env | LC_ALL=C sort)"
check "gpuctl env --format shell evals" as alice "eval \"\$(gpuctl env --team infer)\"; test \"\$CUDA_VISIBLE_DEVICES\" = $(gpu_uuid 0)"
as bob 'gpuctl env --team infer' >/dev/null 2>&1; rc=$?
check "bob may not read infer's env through gpuctl (3)" test $rc = 3
check_output "gpuctl teams (alice) lists infer and train, not empty's devices" \
    sh -c "su -s /bin/sh alice -c 'gpuctl teams' | tee /dev/stderr | grep -q '^infer  (via group @ml-infer)'"
check_output "gpuctl teams (bob): no team" sh -c "su -s /bin/sh bob -c 'gpuctl teams' | grep -q 'may not join any team'"
check_output "gpuctl status (as alice)" as alice 'gpuctl status'

# Bus policy: users may call the read and join methods, not Apply or Reload.
out=$(as bob 'busctl call org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Reload' 2>&1)
echo "bob Reload: $out"
check "bus policy refuses Reload to users" grep -qi 'access denied\|AccessDenied\|not allowed' <<<"$out"
out=$(as bob 'busctl call org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Apply' 2>&1)
check "bus policy refuses Apply to users" grep -qi 'access denied\|AccessDenied\|not allowed' <<<"$out"
check "users may call Status" as bob 'busctl call org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Status >/dev/null'
echo "bus credentials offered to gpuctld (bookworm dbus-daemon):"
busctl call org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus GetConnectionCredentials s org.gpuctl.Agent1 | cut -c1-200 | sed 's/^/    /'

journalctl -u gpuctld -o cat --no-pager | grep -E 'joined team|not a member' | tail -n 4 | sed 's/^/    journal: /'
check "joins are logged with user, team and scope" sh -c "journalctl -u gpuctld -o cat | grep -q 'alice joined team infer (group @ml-infer) as gpuctl-run-'"

systemctl stop gpuctld.service
msg=$(as alice 'gpuctl run --team infer -- true' 2>&1); rc=$?
echo "daemon stopped: rc=$rc: $msg"
check "daemon not running: exit 6 with the hint" test $rc = 6 -a -n "$(grep -F 'systemctl start gpuctld' <<<"$msg")"
finish

#!/bin/bash
# 52: a file dropped into /etc/gpuctl/policy.d converges via inotify (rename dance, loaded once the file has landed);
# moving GPU 1 from train to infer removes it from train's device list (reset-then-set), so a
# process in gpu-train.slice now gets EPERM on /dev/nvidia1. A drop-in naming a GPU the host
# lacks leaves gpuctld not converged (status exits 1) and says which file, line and GPU.
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
memory-max = "256M"
[teams.train]
memory-max = "256M"
[[gpu]]
index = [0]
owner = "infer"
P
put_policy 20-gpu1.toml <<'P'
version = 1
[[gpu]]
index = [1]
owner = "train"
P
gpuctld_start
r=$(probe gpu-train.slice /dev/nvidia1); check "before: train opens nvidia1 (ENXIO)" test "$r" = ENXIO
echo "before: train DeviceAllow=$(systemctl show -P DeviceAllow gpu-train.slice)"
t0=$(date +%s%N)
put_policy 20-gpu1.toml <<'P'
version = 1
[[gpu]]
index = [1]
owner = "infer"
P
if wait_for 20 sh -c "! systemctl show -P DeviceAllow gpu-train.slice | grep -q '/dev/nvidia1 '"; then
  live_ms=$(( ($(date +%s%N)-t0)/1000000 ))
  pass "train's DeviceAllow shrank after the file change ($live_ms ms)"
else fail "train's DeviceAllow did not shrink"; live_ms=20000; fi
echo "after: train DeviceAllow=$(systemctl show -P DeviceAllow gpu-train.slice)"
echo "after: infer DeviceAllow=$(systemctl show -P DeviceAllow gpu-infer.slice)"
echo "--- /run/systemd/system.control/gpu-train.slice.d/50-DeviceAllow.conf:"; cat /run/systemd/system.control/gpu-train.slice.d/50-DeviceAllow.conf
r=$(probe gpu-train.slice /dev/nvidia1); echo "train -> nvidia1: $r"; check "after: train denied nvidia1 (EPERM)" test "$r" = EPERM
r=$(probe gpu-infer.slice /dev/nvidia1); echo "infer -> nvidia1: $r"; check "after: infer opens nvidia1 (ENXIO)" test "$r" = ENXIO
check "journal shows inotify trigger" grep -q 'reconcile (policy files changed)' <(gpuctld_journal)
# The runtime drop-in composes with the generator's unit file across daemon-reload.
systemctl daemon-reload
r=$(probe gpu-train.slice /dev/nvidia1); check "after daemon-reload: still EPERM" test "$r" = EPERM
echo "after reload: train DeviceAllow=$(systemctl show -P DeviceAllow gpu-train.slice)"
# An editor's swap file must not trigger anything.
# A file change was live above in live_ms: a reconcile the swap file started would show in that
# time; three times it (at least 1 s) is the margin, measured on this guest, not a fixed sleep.
# shellcheck disable=SC2317 # called through wait_for
not_reconciling() { [ "$(_agent_prop Reconciling)" = false ]; }
wait_for 10 not_reconciling
n1=$(gpuctld_journal | grep -c '^reconcile (')
reconciled_again() { [ "$(gpuctld_journal | grep -c '^reconcile (')" != "$n1" ]; }
wait_ms=$((3 * live_ms > 1000 ? 3 * live_ms : 1000))
echo junk > /etc/gpuctl/policy.d/.20-gpu1.toml.swp
t_swp=$(date +%s%N)
while ! reconciled_again && [ $((($(date +%s%N) - t_swp) / 1000000)) -lt "$wait_ms" ]; do sleep 0.1; done
check_not "swap file ignored: no reconcile in ${wait_ms} ms (3x a file change's ${live_ms} ms)" reconciled_again
rm -f /etc/gpuctl/policy.d/.20-gpu1.toml.swp

# One view of the host: the daemon makes the host checks `gpuctl check` makes.
put_policy 30-ghost.toml <<'P'
version = 1
[[gpu]]
index = [7]
owner = "train"
P
reload_wait
st=$(gpuctl status 2>&1); rc=$?
# shellcheck disable=SC2001 # a prefix on every line
sed 's/^/    status| /' <<<"$st"
check_output "a drop-in naming missing GPU 7: status exits 1" test "$rc" = 1
check "and says why, with file and line" grep -qE "30-ghost.toml:[0-9]+:[0-9]+: .*gpu 7 does not exist" <<<"$st"
check_output "StatusText is not converged" sh -c 'systemctl show -P StatusText gpuctld.service | grep -q "does not fit this host"'
rm -f /etc/gpuctl/policy.d/30-ghost.toml
reload_wait
check_output "without it: converged again" gpuctl status
finish

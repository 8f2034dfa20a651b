#!/bin/bash
# --- gpuctl systemd-layer scenario prelude (self-contained on purpose: no /test/lib.sh yet) ---
# Uses the installed package when present; otherwise installs binaries from /test/bin and
# units from /test/units-draft (how the systemd branch runs before packaging lands).
set -u
PASS=0; FAIL=0
ok()  { echo "PASS: $*"; PASS=$((PASS+1)); }
bad() { echo "FAIL: $*"; FAIL=$((FAIL+1)); }
check() { local d=$1; shift; if "$@"; then ok "$d"; else bad "$d"; fi; }
finish() { echo "== $PASS passed, $FAIL failed"; [ "$FAIL" = 0 ]; }
status_text() { systemctl show -P StatusText gpuctld.service; }
# wait_for SECS CMD...: poll (no busy loop in the product; the test may poll)
wait_for() { local t=$1; shift; local i; for i in $(seq $((t*10))); do "$@" && return 0; sleep 0.1; done; "$@"; }
# probe SLICE NODE: open NODE from a service in SLICE; prints ENXIO/EPERM/OK/other
probe() {
  local out
  out=$(systemd-run --wait --pipe -q --slice="$1" bash -c "exec 3<>$2" 2>&1)
  case $out in
    *"No such device or address"*) echo ENXIO ;;
    *"Operation not permitted"*) echo EPERM ;;
    "") echo OK ;;
    *) echo "other: $out" ;;
  esac
}
sysd_setup() {
  local b
  for b in gpuctld nvidia-cuda-mps-control; do
    [ -x /usr/bin/$b ] || install -m755 /test/bin/$b /usr/bin/$b
  done
  if [ ! -x /usr/lib/systemd/system-generators/gpuctl-generator ] && [ ! -x /lib/systemd/system-generators/gpuctl-generator ]; then
    install -D -m755 /test/bin/gpuctl-generator /usr/lib/systemd/system-generators/gpuctl-generator
  fi
  for u in gpuctld.service gpuctl-mps@.service gpuctl-ready.target; do
    [ -e /usr/lib/systemd/system/$u ] || [ -e /lib/systemd/system/$u ] || install -m644 /test/units-draft/$u /etc/systemd/system/$u
  done
  if [ ! -e /usr/share/dbus-1/system.d/org.gpuctl.Agent1.conf ]; then
    install -D -m644 /test/units-draft/org.gpuctl.Agent1.conf /usr/share/dbus-1/system.d/org.gpuctl.Agent1.conf
    systemctl reload dbus.service
  fi
  # Fake GPU nodes: major 195 like the real driver; uvm on an unused major.
  local i
  for i in 0 1 2 3; do [ -e /dev/nvidia$i ] || mknod -m666 /dev/nvidia$i c 195 $i; done
  [ -e /dev/nvidiactl ] || mknod -m666 /dev/nvidiactl c 195 255
  [ -e /dev/nvidia-uvm ] || mknod -m666 /dev/nvidia-uvm c 237 0
  [ -e /dev/nvidia-uvm-tools ] || mknod -m666 /dev/nvidia-uvm-tools c 237 1
  mkdir -p /etc/gpuctl/policy.d
  systemctl daemon-reload
}
# reload_wait: `systemctl reload gpuctld` (SIGHUP), then wait until a reconcile that started
# after it has finished (systemd 252 ends the reload job when ExecReload's kill returns).
reload_wait() {
  local t; t=$(date +%s%6N); systemctl reload gpuctld.service
  wait_for 30 sh -c "[ \$(busctl get-property org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 LastReconcileStartUsec | cut -d' ' -f2) -gt $t ] && [ \$(busctl get-property org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Reconciling | cut -d' ' -f2) = false ]"
}
put_policy() { # put_policy NAME < content   (atomic, like config management does)
  cat > "/etc/gpuctl/policy.d/.$1.tmp" && mv "/etc/gpuctl/policy.d/.$1.tmp" "/etc/gpuctl/policy.d/$1"
}
# --- end of prelude ---
# 52: a file dropped into /etc/gpuctl/policy.d converges via inotify (rename dance, debounced);
# moving GPU 1 from train to infer removes it from train's device list (reset-then-set), so a
# process in gpu-train.slice now gets EPERM on /dev/nvidia1.
sysd_setup
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
systemctl start gpuctld.service
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
  ok "train's DeviceAllow shrank after the file change ($(( ($(date +%s%N)-t0)/1000000 )) ms incl. 300 ms debounce)"
else bad "train's DeviceAllow did not shrink"; fi
echo "after: train DeviceAllow=$(systemctl show -P DeviceAllow gpu-train.slice)"
echo "after: infer DeviceAllow=$(systemctl show -P DeviceAllow gpu-infer.slice)"
echo "--- /run/systemd/system.control/gpu-train.slice.d/50-DeviceAllow.conf:"; cat /run/systemd/system.control/gpu-train.slice.d/50-DeviceAllow.conf
r=$(probe gpu-train.slice /dev/nvidia1); echo "train -> nvidia1: $r"; check "after: train denied nvidia1 (EPERM)" test "$r" = EPERM
r=$(probe gpu-infer.slice /dev/nvidia1); echo "infer -> nvidia1: $r"; check "after: infer opens nvidia1 (ENXIO)" test "$r" = ENXIO
check "journal shows inotify trigger" sh -c "journalctl -u gpuctld -o cat --no-pager | grep -q 'reconcile (policy files changed)'"
# The runtime drop-in composes with the generator's unit file across daemon-reload.
systemctl daemon-reload
r=$(probe gpu-train.slice /dev/nvidia1); check "after daemon-reload: still EPERM" test "$r" = EPERM
echo "after reload: train DeviceAllow=$(systemctl show -P DeviceAllow gpu-train.slice)"
# An editor's swap file must not trigger anything.
n1=$(journalctl -u gpuctld -o cat --no-pager | grep -c '^reconcile (')
echo junk > /etc/gpuctl/policy.d/.20-gpu1.toml.swp; sleep 1.5
n2=$(journalctl -u gpuctld -o cat --no-pager | grep -c '^reconcile (')
check "swap file ignored" test "$n1" = "$n2"
rm -f /etc/gpuctl/policy.d/.20-gpu1.toml.swp
finish

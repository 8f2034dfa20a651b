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
# 53: a bad file leaves the last good state; StatusText, the journal and Status name file, line
# and key; SIGHUP reconciles; fixing the file converges. Root-only D-Bus methods refuse others.
sysd_setup
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
memory-max = "256M"
[[gpu]]
index = [0]
owner = "infer"
P
systemctl start gpuctld.service
check "converged" sh -c "systemctl show -P StatusText gpuctld.service | grep -q converged"
cat > /etc/gpuctl/policy.d/20-x.toml <<'P'
version = 1

[teams.x]
memory-max = "lots"
P
reload_wait   # SIGHUP
st=$(status_text); echo "StatusText: $st"
check "StatusText names file:line and key" sh -c "echo '$st' | grep -q 'policy error in /etc/gpuctl/policy.d/20-x.toml:3: teams.x.memory-max: bad size'"
check "StatusText says last good in force" sh -c "echo '$st' | grep -q 'last good policy in force'"
check "slice untouched" test "$(systemctl show -P MemoryMax gpu-infer.slice)" = 268435456
check "no slice for the bad team" sh -c "! systemctl is-active -q gpu-x.slice"
check "journal has the error" sh -c "journalctl -u gpuctld --no-pager -o cat | grep -q 'policy error: /etc/gpuctl/policy.d/20-x.toml:3'"
js=$(busctl call --json=short org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Status)
echo "Status: $js" | cut -c1-600
check "Status JSON has policy_error" sh -c "echo '$js' | grep -q 'policy_error.*20-x.toml:3'"
check "Status JSON says last-good" sh -c "echo '$js' | grep -q 'last-good'"
check "StatusText property" sh -c "busctl get-property org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 StatusText | grep -q 'policy error'"
out=$(setpriv --reuid=65534 --regid=65534 --clear-groups busctl call org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Reload 2>&1); echo "nobody Reload: $out"
check "non-root Reload refused" sh -c "echo '$out' | grep -qi 'root only\|denied'"
out=$(setpriv --reuid=65534 --regid=65534 --clear-groups busctl call org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Status 2>&1)
check "non-root Status allowed" sh -c "echo '$out' | grep -q '^s '"
# Restart with the bad file still there: the on-disk last good policy is used.
systemctl restart gpuctld.service
check "after restart: last good from disk" sh -c "systemctl show -P StatusText gpuctld.service | grep -q 'last good policy in force'"
check "after restart: slice still 256M" test "$(systemctl show -P MemoryMax gpu-infer.slice)" = 268435456
# Fix the file: inotify converges it.
put_policy 20-x.toml <<'P'
version = 1
[teams.x]
memory-max = "128M"
P
wait_for 20 sh -c "systemctl show -P StatusText gpuctld.service | grep -q '2 teams.*converged'"
st=$(status_text); echo "StatusText: $st"
check "fixed file converges" sh -c "echo '$st' | grep -q converged"
check "gpu-x.slice now 128M" test "$(systemctl show -P MemoryMax gpu-x.slice)" = 134217728
out=$(busctl call org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Reload 2>&1); echo "root Reload: $out" | cut -c1-300
check "root Reload allowed" sh -c "echo '$out' | grep -q converged"
finish

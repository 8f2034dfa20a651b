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
# 56: boot without gpuctld: the generator alone puts gpu-<team>.slice with limits and
# DeviceAllow in place from the last applied state. Simulated boot in one guest: apply once,
# stop and disable gpuctld, drop the runtime drop-ins, re-run generators (daemon-reload), then
# start a service with Slice=gpu-infer.slice.
sysd_setup
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
memory-max = "96M"
tasks-max = 77
[[gpu]]
index = [0]
owner = "infer"
P
systemctl start gpuctld.service
systemctl stop gpuctld.service
systemctl stop gpu-infer.slice
rm -rf /run/systemd/system.control/gpu-*.slice.d
systemctl daemon-reload
echo "--- /run/systemd/generator/gpu-infer.slice"; cat /run/systemd/generator/gpu-infer.slice
check "generator wrote gpu-infer.slice" test -f /run/systemd/generator/gpu-infer.slice
check "unit comes from the generator" test "$(systemctl show -P FragmentPath gpu-infer.slice)" = /run/systemd/generator/gpu-infer.slice
check "no runtime drop-ins left" test -z "$(systemctl show -P DropInPaths gpu-infer.slice)"
cat > /etc/systemd/system/infer-job.service <<'U'
[Service]
Slice=gpu-infer.slice
ExecStart=/bin/sleep 600
U
systemctl daemon-reload
systemctl start infer-job.service
check "gpuctld not running" sh -c "! systemctl is-active -q gpuctld.service"
check "job landed in gpu-infer.slice" test "$(systemctl show -P ControlGroup infer-job.service)" = /gpu.slice/gpu-infer.slice/infer-job.service
check "memory.max from the generator" test "$(cat /sys/fs/cgroup/gpu.slice/gpu-infer.slice/memory.max)" = 100663296
check "pids.max from the generator" test "$(cat /sys/fs/cgroup/gpu.slice/gpu-infer.slice/pids.max)" = 77
r=$(probe gpu-infer.slice /dev/nvidia0); check "own GPU (ENXIO)" test "$r" = ENXIO
r=$(probe gpu-infer.slice /dev/nvidia1); check "other GPU (EPERM)" test "$r" = EPERM
# gpuctld starting later finds the slice already right and changes nothing.
systemctl start gpuctld.service
check "gpuctld converges with no slice change" sh -c "! journalctl -u gpuctld -o cat --no-pager _PID=$(systemctl show -P MainPID gpuctld.service) | grep -q '^set gpu-infer.slice'"
systemctl stop infer-job.service
finish

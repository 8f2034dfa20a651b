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
# 50: team slices from a policy: limits, DevicePolicy=closed + DeviceAllow live; a service in
# gpu-infer.slice opens its own /dev/nvidia0 (ENXIO: allowed, no driver) and gets EPERM on
# another team's; STATUS=; structured journal fields; the state file the generator reads.
sysd_setup
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
memory-max = "256M"
memory-high = "200M"
cpu-weight = 300
allowed-cpus = "0"
tasks-max = 128
io-weight = 200
[teams.train]
memory-max = "512M"
[[gpu]]
index = [0]
owner = "infer"
[[gpu]]
index = [1]
owner = "train"
P
t0=$(date +%s%N)
systemctl start gpuctld.service
echo "gpuctld start (READY=1) took $(( ($(date +%s%N)-t0)/1000000 )) ms"
systemctl show -p ActiveState -p StatusText gpuctld.service
check "StatusText says converged" sh -c "systemctl show -P StatusText gpuctld.service | grep -q '2 teams, 2 GPUs converged'"
systemctl show -p ActiveState -p MemoryMax -p MemoryHigh -p CPUWeight -p AllowedCPUs -p TasksMax -p IOWeight -p DevicePolicy -p DeviceAllow gpu-infer.slice
check "gpu-infer.slice active" test "$(systemctl show -P ActiveState gpu-infer.slice)" = active
check "MemoryMax=256M" test "$(systemctl show -P MemoryMax gpu-infer.slice)" = 268435456
check "CPUWeight=300" test "$(systemctl show -P CPUWeight gpu-infer.slice)" = 300
check "AllowedCPUs=0" test "$(systemctl show -P AllowedCPUs gpu-infer.slice)" = 0
check "TasksMax=128" test "$(systemctl show -P TasksMax gpu-infer.slice)" = 128
check "DevicePolicy=closed" test "$(systemctl show -P DevicePolicy gpu-infer.slice)" = closed
da=$(systemctl show -P DeviceAllow gpu-infer.slice)
check "DeviceAllow has nvidia0" sh -c "echo '$da' | grep -q '/dev/nvidia0 rw'"
check "DeviceAllow lacks nvidia1" sh -c "! echo '$da' | grep -q '/dev/nvidia1 '"
cg=/sys/fs/cgroup/gpu.slice/gpu-infer.slice
echo "cgroupfs: memory.max=$(cat $cg/memory.max) memory.high=$(cat $cg/memory.high) cpu.weight=$(cat $cg/cpu.weight) pids.max=$(cat $cg/pids.max) cpuset.cpus=$(cat $cg/cpuset.cpus)"
check "cgroupfs memory.max" test "$(cat $cg/memory.max)" = 268435456
check "cgroupfs pids.max" test "$(cat $cg/pids.max)" = 128
r=$(probe gpu-infer.slice /dev/nvidia0); echo "infer -> nvidia0: $r"; check "own GPU allowed (ENXIO)" test "$r" = ENXIO
r=$(probe gpu-infer.slice /dev/nvidia1); echo "infer -> nvidia1: $r"; check "other team's GPU denied (EPERM)" test "$r" = EPERM
r=$(probe gpu-train.slice /dev/nvidia1); echo "train -> nvidia1: $r"; check "train's own GPU (ENXIO)" test "$r" = ENXIO
r=$(probe gpu-infer.slice /dev/nvidiactl); check "nvidiactl allowed (ENXIO)" test "$r" = ENXIO
ls /run/systemd/system.control/gpu-infer.slice.d/ 2>/dev/null && cat /run/systemd/system.control/gpu-infer.slice.d/50-DeviceAllow.conf
check "state file for the generator" grep -q '"infer"' /var/lib/gpuctl/slices.json
check "team env file" grep -q 'CUDA_VISIBLE_DEVICES=0' /run/gpuctl/teams/infer.env
j=$(journalctl -o verbose GPUCTL_TEAM=infer GPUCTL_ACTION=set-slice --no-pager | grep -c 'GPUCTL_TEAM=infer')
echo "journal entries with GPUCTL_TEAM=infer GPUCTL_ACTION=set-slice: $j"
check "journald structured fields" test "$j" -ge 1
# Idempotent: a second reconcile changes nothing.
before=$(journalctl -u gpuctld -o cat --no-pager | grep -c '^set gpu-')
reload_wait
after=$(journalctl -u gpuctld -o cat --no-pager | grep -c '^set gpu-')
check "second reconcile changes nothing" test "$before" = "$after"
finish

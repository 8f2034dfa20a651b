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
# 51: a process over MemoryMax in one team is OOM-killed while another team's process lives on.
sysd_setup
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
memory-max = "64M"
[teams.train]
memory-max = "512M"
[[gpu]]
index = [0]
owner = "infer"
[[gpu]]
index = [1]
owner = "train"
P
systemctl start gpuctld.service
check "limits live" test "$(cat /sys/fs/cgroup/gpu.slice/gpu-infer.slice/memory.max)" = 67108864
systemd-run -q --unit=train-job --slice=gpu-train.slice sleep 600
systemctl show -p ActiveState -p Slice train-job.service
# `tail` keeps the current (newline-free) line in memory: 300M of zeros outgrows 64M.
systemd-run -q --unit=infer-hog --slice=gpu-infer.slice -p MemorySwapMax=0 sh -c 'head -c 300M /dev/zero | tail > /dev/null'
wait_for 30 sh -c '! systemctl is-active -q infer-hog.service'
res=$(systemctl show -P Result infer-hog.service); echo "infer-hog Result=$res"
check "hog in gpu-infer.slice OOM-killed" test "$res" = oom-kill
echo "memory.events of gpu-infer.slice: $(tr '\n' ' ' < /sys/fs/cgroup/gpu.slice/gpu-infer.slice/memory.events)"
check "train job lives on" systemctl is-active -q train-job.service
systemctl stop train-job.service
finish

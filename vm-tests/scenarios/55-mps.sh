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
# 55: MPS units per team with the fake control daemon: they run in the team's slice and receive
# the thread percentage and pinned memory limit; a settings change restarts them; a team losing
# MPS stops its daemon with `quit`.
sysd_setup
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
memory-max = "256M"
[teams.infer.mps]
active-thread-percentage = 40
pinned-memory-limit = "1G"
[teams.train]
[[gpu]]
index = [0, 1]
owner = "infer"
[[gpu]]
index = [2]
owner = "train"
P
systemctl start gpuctld.service
u=gpuctl-mps@infer-0.service
systemctl status --no-pager $u | head -12
check "MPS unit active" systemctl is-active -q $u
cg=$(systemctl show -P ControlGroup $u); echo "cgroup: $cg"
check "MPS daemon in the team's slice" test "$cg" = /gpu.slice/gpu-infer.slice/gpu-infer-0.slice/$u
log=/var/log/gpuctl/mps/infer-0/control.log
echo "--- $log"; cat $log
check "daemon saw CUDA_VISIBLE_DEVICES=0,1" grep -q 'CUDA_VISIBLE_DEVICES=0,1' $log
check "thread percentage sent" grep -q 'cmd set_default_active_thread_percentage 40 -> ok' $log
check "pinned limit sent per device" sh -c "grep -q 'cmd set_default_device_pinned_mem_limit 0 1024M -> ok' $log && grep -q 'cmd set_default_device_pinned_mem_limit 1 1024M -> ok' $log"
q=$(echo get_default_active_thread_percentage | env $(grep -v '^#' /run/gpuctl/mps/infer-0.env | xargs) nvidia-cuda-mps-control)
check "client query through the pipe dir answers 40.0" test "$q" = 40.0
check "no MPS for train" sh -c "! systemctl is-active -q gpuctl-mps@train-0.service"
check "team env points at the MPS pipe" grep -q 'CUDA_MPS_PIPE_DIRECTORY=/run/gpuctl/mps/infer-0/pipe' /run/gpuctl/teams/infer.env
sed -i 's/active-thread-percentage = 40/active-thread-percentage = 60/' /etc/gpuctl/policy.d/10-teams.toml
reload_wait
check "restarted with 60" sh -c "grep -q 'cmd set_default_active_thread_percentage 60 -> ok' $log"
check "old daemon got quit on restart" sh -c "grep -q 'cmd quit -> ok' $log"
check "unit active after change" systemctl is-active -q $u
# A crash of the daemon: Restart=on-failure brings it back and ExecStartPost resends limits.
n=$(grep -c 'set_default_active_thread_percentage 60' $log)
systemctl kill -s KILL $u; sleep 4
check "restarted after crash" systemctl is-active -q $u
check "limits resent after crash" test "$(grep -c 'set_default_active_thread_percentage 60' $log)" -gt "$n"
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
[[gpu]]
index = [0, 1]
owner = "infer"
P
reload_wait
check "MPS stopped when the policy drops it" sh -c "! systemctl is-active -q $u"
tail -3 $log
finish

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
# 54: SIGKILL during apply, automatic restart, convergence without duplicates or orphans.
sysd_setup
gen() { # gen N MEM: N teams with memory MEM, MPS on team t0
  echo "version = 1"
  for i in $(seq 0 $(($1-1))); do printf '[teams.t%s]\nmemory-max = "%s"\ntasks-max = %s\n' $i "$2" $((100+i)); done
  printf '[teams.t0.mps]\nactive-thread-percentage = 30\n'
  printf '[[gpu]]\nindex = [0]\nowner = "t0"\n[[gpu]]\nindex = [1]\nowner = "t1"\n'
}
gen 6 256M | put_policy 10-teams.toml
systemctl start gpuctld.service
check "initial converge" sh -c "systemctl show -P StatusText gpuctld.service | grep -q '6 teams.*converged'"
pid1=$(systemctl show -P MainPID gpuctld.service)
gen 6 300M | put_policy 10-teams.toml
# Kill as soon as the apply has started (first slice changed), before it can finish.
wait_for 10 sh -c "test \$(systemctl show -P MemoryMax gpu-t0.slice) = 314572800"
kill -9 "$pid1"; echo "killed gpuctld pid $pid1 mid-apply; t5 MemoryMax at kill: $(systemctl show -P MemoryMax gpu-t5.slice)"
wait_for 30 sh -c "p=\$(systemctl show -P MainPID gpuctld.service); [ \"\$p\" != 0 ] && [ \"\$p\" != $pid1 ] && systemctl show -P StatusText gpuctld.service | grep -q 'converged'"
echo "restarted: pid $(systemctl show -P MainPID gpuctld.service), NRestarts=$(systemctl show -P NRestarts gpuctld.service), StatusText: $(status_text)"
check "restarted automatically" test "$(systemctl show -P NRestarts gpuctld.service)" -ge 1
for i in 0 1 2 3 4 5; do
  check "t$i MemoryMax converged" test "$(systemctl show -P MemoryMax gpu-t$i.slice)" = 314572800
done
n=$(systemctl list-units --no-legend --plain 'gpuctl-mps@*' | wc -l); echo "MPS units: $(systemctl list-units --no-legend --plain 'gpuctl-mps@*')"
check "exactly one MPS unit" test "$n" = 1
n=$(systemctl list-units --no-legend --plain --state=active 'gpu-*.slice' | grep -c '^gpu-t[0-9].slice')
check "exactly 6 team slices" test "$n" = 6
check "state file matches (300M)" grep -q 314572800 /var/lib/gpuctl/slices.json
finish

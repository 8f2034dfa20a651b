#!/bin/bash
# 54: SIGKILL during apply, automatic restart, convergence without duplicates or orphans.
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup
gen() { # gen N MEM: N teams with memory MEM, MPS on team t0
  echo "version = 1"
  for i in $(seq 0 $(($1-1))); do printf '[teams.t%s]\nmemory-max = "%s"\ntasks-max = %s\n' "$i" "$2" $((100+i)); done
  printf '[teams.t0.mps]\nactive-thread-percentage = 30\n'
  printf '[[gpu]]\nindex = [0]\nowner = "t0"\n[[gpu]]\nindex = [1]\nowner = "t1"\n'
}
# Enough teams that the apply (one slice after another) outlasts the poll that spots its start.
N=16
gen $N 256M | put_policy 10-teams.toml
gpuctld_start
check "initial converge" wait_converged 20 $N 2
slices=$(for i in $(seq 0 $((N - 1))); do printf 'gpu-t%s.slice ' "$i"; done)
# at_limit BYTES: how many team slices have MemoryMax=BYTES (one systemctl call).
# shellcheck disable=SC2086 # the slice list is words
at_limit() { systemctl show -P MemoryMax $slices | grep -cx "$1"; }
# Kill as soon as the apply has started (first slice changed), before it can finish; the
# precondition is checked: at the kill some slices still have the old limit. A kill that came too
# late (the whole apply done) is tried again with another limit, three times at most.
landed='' want=''
for mib in 300 304 308; do
    pid1=$(systemctl show -P MainPID gpuctld.service)
    want=$((mib * 1048576))
    gen $N "${mib}M" | put_policy 10-teams.toml
    wait_for 10 sh -c "test \$(systemctl show -P MemoryMax gpu-t0.slice) = $want" || { fail "the apply of ${mib}M did not start"; break; }
    kill -9 "$pid1"
    done_at_kill=$(at_limit "$want")
    echo "killed gpuctld pid $pid1 with $done_at_kill of $N slices at ${mib}M"
    wait_for 30 sh -c "p=\$(systemctl show -P MainPID gpuctld.service); [ \"\$p\" != 0 ] && [ \"\$p\" != $pid1 ]"
    wait_converged 30 $N 2
    if [ "$done_at_kill" -lt "$N" ]; then landed=$mib; break; fi
done
check "the kill landed mid-apply (some slices still had the old limit)" test -n "$landed"
echo "restarted: pid $(systemctl show -P MainPID gpuctld.service), NRestarts=$(systemctl show -P NRestarts gpuctld.service), StatusText: $(status_text)"
check "restarted automatically" test "$(systemctl show -P NRestarts gpuctld.service)" -ge 1
check "converged after the restart" status_converged $N 2
check "every team's MemoryMax converged (${landed:-?}M)" test "$(at_limit "$want")" = $N
n=$(systemctl list-units --no-legend --plain 'gpuctl-mps@*' | wc -l); echo "MPS units: $(systemctl list-units --no-legend --plain 'gpuctl-mps@*')"
check "exactly one MPS unit" test "$n" = 1
n=$(systemctl list-units --no-legend --plain --state=active 'gpu-*.slice' | grep -c '^gpu-t[0-9]*.slice')
check "exactly $N team slices" test "$n" = $N
check "state file matches (${landed:-?}M)" grep -q "$want" /var/lib/gpuctl/slices.json

# The watchdog (#18) restarts a wedged load or reconcile, so it is armed while gpuctld works;
# idle, it is disarmed, so an idle gpuctld needs no wakeup (#14). systemd logging at debug shows
# gpuctld's notifications as systemd got them for one policy change: the arm (the unit's 60 s,
# with a ping), then the disarm. (59, a benchmark run on request, also checks that no restart comes
# over an idle minute.)
# shellcheck disable=SC2317 # called through wait_for
idle() { [ "$(_agent_prop Reconciling)" = false ] && [ "$(systemctl show -P WatchdogUSec gpuctld.service)" = infinity ]; }
check "idle, systemd's watchdog for gpuctld is disarmed (WatchdogUSec=infinity)" wait_for 20 idle
systemd-analyze log-level debug
cur=$(journal_cursor)
gen $N 320M | put_policy 10-teams.toml
wait_for 20 sh -c "test \$(systemctl show -P MemoryMax gpu-t5.slice) = 335544320"
wait_for 20 idle
systemd-analyze log-level info
journalctl _PID=1 -o cat --no-pager --after-cursor "$cur" |
    grep -E '^gpuctld.service: Got notification message.*WATCHDOG' >/tmp/wd.txt || true
sed 's/^/    | /' /tmp/wd.txt | head -n 6
check "a policy change arms the watchdog (WATCHDOG_USEC=60000000 and WATCHDOG=1), then idle disarms it" \
    awk '/WATCHDOG_USEC=60000000/ && /WATCHDOG=1/ {a = NR} /WATCHDOG_USEC=18446744073709551615/ && a {d = NR} END {exit !(a && d > a)}' /tmp/wd.txt
check "idle again: disarmed" test "$(systemctl show -P WatchdogUSec gpuctld.service)" = infinity
finish

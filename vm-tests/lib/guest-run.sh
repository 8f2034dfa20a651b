#!/bin/bash
# vm-tests/lib/guest-run.sh - runs in the guest as /test/run.sh (see run-vm.sh): waits for the
# boot to finish, installs the package with dpkg -i (unless the scenario has a line
# "# vmtest: no-install"), and runs the scenarios in /test/scenarios/ in name order: one, or the
# members of a group (# vmtest: group=NAME) sharing this boot, with gpuctl's run-time state reset
# between them (vm_group_reset; gpuctld is left stopped unless the next member has a line
# "# vmtest: reset=start"). Each scenario is framed on stdout by
#   ==== vmtest-begin NAME            and            ==== vmtest-end NAME RC
# which the host uses to split the output and to take each scenario's exit code; a line
# "==== vmtest-time NAME SECONDS" follows the end frame. Exits with the
# first non-zero code.
set -u
cd /test || exit 125
export VMTEST_DIR=/test
RESULTS_ROOT=$VMTEST_RESULTS
mkdir -p "$RESULTS_ROOT"
touch /run/vmtest-start # vm_group_reset removes units written after this
# shellcheck source=vm-tests/lib/common.sh
. lib/common.sh

vm_wait_booted
echo "== guest: $(uname -r), systemd $(systemctl --version | awk 'NR==1{print $2}'), state $(systemctl is-system-running 2>&1)"
first=$(find scenarios -maxdepth 1 -name '*.sh' | sort | head -n1)
if ! grep -q '^# vmtest: no-install' "$first"; then
    echo "== dpkg -i $(basename "$(vm_deb)")"
    t0=$(cut -d' ' -f1 /proc/uptime)
    VMTEST_RESULTS=$RESULTS_ROOT
    export VMTEST_DPKG_LOG=$RESULTS_ROOT/dpkg-install.log # what 10-install reads
    if ! vm_install_package; then
        echo "not ok - dpkg -i failed"
        sed 's/^/    | /' "$RESULTS_ROOT/dpkg-install.log" | tail -n 30
        exit 1
    fi
    echo "   installed in $(awk -v t0="$t0" '{printf "%.1f", $1 - t0}' /proc/uptime) s"
fi
final=0 n=0
for f in $(find scenarios -maxdepth 1 -name '*.sh' | sort); do
    name=$(basename "$f" .sh)
    if [ $n -gt 0 ]; then
        a=
        grep -q '^# vmtest: reset=start' "$f" && a=start
        # A member that sets up the fake NVML finds its drop-in kept and loaded, and skips a
        # second daemon-reload (seconds each under TCG).
        [ -z "$a" ] && grep -qE '^[^#]*\b(gpuctld_setup|gpuctld_use_fake_nvml|shell_setup|usage_setup)\b' "$f" &&
            a=keep-nvml
        tr=$(cut -d' ' -f1 /proc/uptime)
        vm_group_reset $a >"$RESULTS_ROOT/reset-before-$name.log" 2>&1
        echo "== reset gpuctl's run-time state for the next scenario${a:+ ($a)} in $(awk -v t="$tr" '{printf "%.1f", $1 - t}' /proc/uptime) s"
    fi
    n=$((n + 1))
    to=$(sed -n 's/^# vmtest: timeout=\([0-9][0-9]*\).*/\1/p' "$f" | head -n1)
    export VMTEST_RESULTS=$RESULTS_ROOT/$name
    # A benchmark-only scenario in a full run: its checks on a small size (common.sh bench_size).
    if [ -e "scenarios/$name.short" ]; then export VMTEST_SHORT=1; else unset VMTEST_SHORT; fi
    mkdir -p "$VMTEST_RESULTS"
    VMTEST_SCENARIO_START=$(date +%s)
    export VMTEST_SCENARIO_START
    ts=$(cut -d' ' -f1 /proc/uptime)
    echo "==== vmtest-begin $name"
    # A hanging scenario must not take the rest of its group with it.
    timeout -k 10 "${to:-300}" bash "$f"
    rc=$?
    echo "==== vmtest-end $name $rc"
    # Its own time, for the report: a group's VM time alone does not say which member is slow.
    echo "==== vmtest-time $name $(awk -v t="$ts" '{printf "%.1f", $1 - t}' /proc/uptime)"
    # Evidence for the host: the state of gpuctl's units at the end.
    systemctl status --no-pager --full 'gpuctl*' 'gpu*.slice' >"$VMTEST_RESULTS/units-status.txt" 2>&1
    [ $final = 0 ] && final=$rc
done
# vm-tests/try: the host stays up for the person at the console until they power it off.
if grep -qw 'vmtest.try=1' /proc/cmdline; then
    echo
    echo "== ready: log in on the console as root (no password); the tour's policy is in force,"
    echo "   users alice (team infer) and carol (team train). Try: gpuctl status; gpuctl plan;"
    echo "   setpriv --reuid=alice --regid=alice --init-groups gpuctl run --team infer -- env;"
    echo "   gpuctl top. Leave with: poweroff"
    while :; do sleep 3600; done
fi
exit $final

# shellcheck shell=bash
# vm-tests/lib/common.sh - sourced by every scenario, inside the guest (bash, as root, cwd /test).
#
# What the guest has when a scenario starts:
#   /test/scenario.sh      the scenario itself
#   /test/lib/             this library and fake-hw.sh
#   /test/pkg/*.deb        the package under test (already installed unless the scenario says
#                          "# vmtest: no-install")
#   /test/policies/        the repository's example policies (when the repository has them)
#   /test/fakes/           test fakes built on the host (libfake_nvml.so, ...) when present
#   $VMTEST_RESULTS        files written here come back to the host (vm-tests/results/<scenario>/files)
#
# Checks print "ok - ..." or "not ok - ..." with the evidence, and `finish` ends the scenario:
# exit 0 when every check passed, 1 otherwise.

VMTEST_CHECKS_OK=0
VMTEST_CHECKS_FAILED=0
VMTEST_DIR=${VMTEST_DIR:-/test}

_vm_pass() { VMTEST_CHECKS_OK=$((VMTEST_CHECKS_OK + 1)); echo "ok - $*"; }
_vm_fail() { VMTEST_CHECKS_FAILED=$((VMTEST_CHECKS_FAILED + 1)); echo "not ok - $*"; }
# Indent captured output so the report shows it under the check it belongs to.
_vm_show() { [ -n "$1" ] && printf '%s\n' "$1" | tail -n "${2:-15}" | sed 's/^/    | /'; return 0; }

# check DESC CMD...: CMD exits 0. Its output is shown when it fails.
check() {
    local desc=$1 out rc
    shift
    out=$("$@" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then
        _vm_pass "$desc"
    else
        _vm_fail "$desc (exit $rc: $*)"
        _vm_show "$out"
    fi
    return $rc
}

# check_output DESC CMD...: like check, and always shows CMD's output (the evidence).
check_output() {
    local desc=$1 out rc
    shift
    out=$("$@" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then _vm_pass "$desc"; else _vm_fail "$desc (exit $rc: $*)"; fi
    _vm_show "$out" "${VMTEST_SHOW_LINES:-8}"
    return $rc
}

# check_not [-s STATUS] DESC CMD...: CMD fails: exits STATUS when given, else with a status that
# says it ran and answered no. Refused without -s: 124 (timeout(1): the answer never came),
# 126/127 (not run: not executable, no such command), above 128 (killed by a signal), and grep's
# 2 (an error, such as a missing file): each would pass a check that the behaviour is absent.
check_not() {
    local want='' desc out rc
    if [ "$1" = -s ]; then want=$2; shift 2; fi
    desc=$1
    shift
    out=$("$@" 2>&1)
    rc=$?
    local why=
    if [ -n "$want" ]; then
        [ $rc = "$want" ] || why="expected exit $want, got $rc"
    elif [ $rc = 0 ]; then
        why="expected failure, got exit 0"
    elif [ $rc = 124 ] || [ $rc = 126 ] || [ $rc = 127 ] || [ $rc -gt 128 ]; then
        why="exit $rc: the command did not answer (timeout, not run or killed)"
    elif [ $rc = 2 ] && [ "${1##*/}" = grep ]; then
        why="exit 2: grep failed (a missing file?)"
    fi
    if [ -z "$why" ]; then
        _vm_pass "$desc"
    else
        _vm_fail "$desc ($why: $*)"
        _vm_show "$out"
        return 1
    fi
}

# check_empty DESC CMD...: CMD succeeds and prints nothing (e.g. "no leftover files").
check_empty() {
    local desc=$1 out rc
    shift
    out=$("$@" 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && [ -z "$out" ]; then
        _vm_pass "$desc"
    else
        _vm_fail "$desc (exit $rc, output follows)"
        _vm_show "$out" 30
        return 1
    fi
}

# num_gt V LIMIT: V is a decimal number above LIMIT. Fails on anything else, so an empty query
# result ("null", "") fails (awk alone compares "null" > 0.9 as strings, which is true).
num_gt() {
    [[ $1 =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]] || { echo "not a number: '$1'"; return 1; }
    awk -v v="$1" -v l="$2" 'BEGIN {exit !(v + 0 > l + 0)}'
}

# require_nonempty DESC LIST: a check that LIST (what a scenario found and is about to loop over)
# is not empty: a loop over nothing checks nothing and would pass.
require_nonempty() {
    local desc=$1 list=$2
    if [ -n "${list//[[:space:]]/}" ]; then
        _vm_pass "$desc: $(wc -w <<<"$list") found"
    else
        _vm_fail "$desc: none found, so nothing below would be checked"
        return 1
    fi
}

# bench_size FULL SHORT: a benchmark's size: FULL when it runs as a benchmark, SHORT when a full
# run (and so CI) runs a benchmark-only scenario for its checks alone (VMTEST_SHORT=1, set by the
# harness: vm-tests/run, bench-only.list), whose figures are then left out.
bench_size() { if [ "${VMTEST_SHORT:-0}" = 1 ]; then echo "$2"; else echo "$1"; fi; }

# fail DESC: record a failed check without a command (for conditions computed by the scenario).
fail() { _vm_fail "$*"; }
pass() { _vm_pass "$*"; }

# journal_cursor: the journal's newest entry. `journalctl --after-cursor` reads what came after
# it; `--since @SECONDS` would take in the rest of that second, an earlier step's lines too.
journal_cursor() { journalctl -n1 -o json --no-pager | jq -r .__CURSOR; }

# The package under test.
vm_deb() { find "$VMTEST_DIR/pkg" -maxdepth 1 -name 'gpuctl_*.deb' | head -n1; }

# Install the package as an admin would. Output goes to $VMTEST_RESULTS/dpkg-install.log.
vm_install_package() {
    local deb
    deb=$(vm_deb)
    [ -n "$deb" ] || { echo "vm_install_package: no .deb in $VMTEST_DIR/pkg" >&2; return 1; }
    DEBIAN_FRONTEND=noninteractive dpkg -i "$deb" >"$VMTEST_RESULTS/dpkg-install.log" 2>&1
}

# Wait until systemd finished the boot transaction (degraded is fine: tests inspect units).
vm_wait_booted() { systemctl is-system-running --wait >/dev/null 2>&1 || true; }

# End the scenario: summary line and exit status.
finish() {
    echo "-- $VMTEST_CHECKS_OK checks passed, $VMTEST_CHECKS_FAILED failed"
    [ "$VMTEST_CHECKS_FAILED" -eq 0 ] && [ "$VMTEST_CHECKS_OK" -gt 0 ]
    exit $?
}

# Between the scenarios of a group (one boot): put gpuctl's run-time state back to "package just
# installed": stop the agent, its MPS daemons and everything in the team slices, drop policy
# files, state, env files, runtime properties, scenario drop-ins and units. The agent stays
# stopped unless asked (`vm_group_reset start`, for a scenario with "# vmtest: reset=start"):
# every scenario so far writes its fake devices and policy and then starts gpuctld itself, and an
# agent started here ran without the fake NVML and reacted to the next scenario's policy files
# before that scenario's own start. Users, fake devices and the fake MPS control binary stay;
# with `keep-nvml` (the next scenario sets up the fake NVML) so does gpuctld's fake-NVML drop-in.
vm_group_reset() {
    systemctl stop gpuctld.service 'gpuctl-mps@*.service' 'gpuctl-run-*.scope' gpu.slice
    rm -rf /etc/gpuctl/policy.d /run/gpuctl/policy.d /run/gpuctl/teams /run/gpuctl/mps \
        /run/gpuctl/health.json /run/gpuctl/layouts.json
    rm -f /run/cdi/gpuctl.io-team-*.json
    mkdir -p /etc/gpuctl/policy.d
    find /var/lib/gpuctl -mindepth 1 -maxdepth 1 ! -name '.preset-applied' -exec rm -rf {} +
    rm -rf /run/systemd/system.control/gpu* /run/systemd/system/gpuctl-mps@* /var/lib/vmtest-nvml
    if [ "${1:-}" = keep-nvml ]; then
        find /etc/systemd/system/gpuctld.service.d -mindepth 1 ! -name 50-vmtest-nvml.conf \
            -exec rm -rf {} + 2>/dev/null
    else
        rm -rf /etc/systemd/system/gpuctld.service.d
    fi
    # Units a scenario wrote for itself (e.g. a team service).
    find /etc/systemd/system -maxdepth 1 -type f -name '*.service' -newer /run/vmtest-start -delete
    systemctl daemon-reload
    systemctl reset-failed
    if [ "${1:-}" = start ]; then systemctl start gpuctld.service; fi
    # Journal queries use --since at second granularity: start the next scenario in a new second
    # (waiting for the next one to begin, half a second on average, instead of a whole one).
    local s0
    s0=$(date +%s)
    while [ "$(date +%s)" = "$s0" ]; do sleep 0.05; done
}

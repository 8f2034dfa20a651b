#!/bin/bash
# vm-tests/lib/guest-run.sh - runs in the guest as /test/run.sh (see run-vm.sh): waits for the
# boot to finish, installs the package with dpkg -i (unless the scenario has a line
# "# vmtest: no-install"), runs /test/scenario.sh and passes its exit code on.
set -u
cd /test || exit 125
export VMTEST_DIR=/test
mkdir -p "$VMTEST_RESULTS"
# shellcheck source=vm-tests/lib/common.sh
. lib/common.sh

vm_wait_booted
echo "== guest: $(uname -r), systemd $(systemctl --version | awk 'NR==1{print $2}'), state $(systemctl is-system-running 2>&1)"
if ! grep -q '^# vmtest: no-install' scenario.sh; then
    echo "== dpkg -i $(basename "$(vm_deb)")"
    t0=$(cut -d' ' -f1 /proc/uptime)
    if ! vm_install_package; then
        echo "not ok - dpkg -i failed"
        sed 's/^/    | /' "$VMTEST_RESULTS/dpkg-install.log" | tail -n 30
        exit 1
    fi
    echo "   installed in $(awk -v t0="$t0" '{printf "%.1f", $1 - t0}' /proc/uptime) s"
fi
echo "== scenario"
bash ./scenario.sh
rc=$?
# Evidence for the host: the state of gpuctl's units at the end.
systemctl status --no-pager --full 'gpuctl*' 'gpu*.slice' >"$VMTEST_RESULTS/units-status.txt" 2>&1
exit $rc

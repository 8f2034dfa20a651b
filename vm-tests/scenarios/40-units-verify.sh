#!/bin/bash
# `systemd-analyze verify` is clean on every unit the package ships, and the units load.
# vmtest: group=pkg
. lib/common.sh
. lib/fake-hw.sh

# The MPS template runs the driver's nvidia-cuda-mps-control; verify checks that it exists.
fake_mps_control

units=$(dpkg -L gpuctl | grep -E '^(/usr)?/lib/systemd/system/[^/]*$')
require_nonempty "units the package ships" "$units" && echo "    units: $(echo "$units" | xargs -n1 basename | xargs)"
for u in $units; do
    name=${u##*/}
    if [[ $name == *@.* ]]; then
        # A template is verified through an instance of it.
        inst=${name/@./@infer-gpus.}
        check_empty "systemd-analyze verify $inst" systemd-analyze verify "$inst"
    else
        check_empty "systemd-analyze verify $name" systemd-analyze verify "$u"
    fi
    check "$name loads" test "$(systemctl show -P LoadState "${name/@./@infer-gpus.}")" = loaded
done
check_output "gpu-infer.slice nests under gpu.slice" \
    sh -c 'systemctl show -P Slice gpu-infer.slice | grep -x gpu.slice'
check_output "gpuctl-mps@infer-gpus.service runs in gpu-infer-gpus.slice, nested in gpu-infer.slice" \
    sh -c 'systemctl show -P Slice gpuctl-mps@infer-gpus.service | grep -x gpu-infer-gpus.slice &&
        systemctl show -P Slice gpu-infer-gpus.slice | grep -x gpu-infer.slice'
# WatchdogUSec shows gpuctld's run-time override once it has run (infinity while idle: 59 checks
# that), so the unit's own setting is read from the unit.
check_output "gpuctld.service is Type=notify with a 60 s watchdog" \
    sh -c 'systemctl show -P Type gpuctld.service | grep -x notify &&
        systemctl cat gpuctld.service | grep -x "WatchdogSec=60s"'
# Evidence only: systemd's own exposure score of the agent's sandbox.
systemd-analyze security --no-pager gpuctld.service 2>&1 | tail -n 1 | sed 's/^/    | security: /'
finish

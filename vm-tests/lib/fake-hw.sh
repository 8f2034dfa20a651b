# shellcheck shell=bash
# vm-tests/lib/fake-hw.sh - fake NVIDIA hardware for scenarios (guest side, sourced, as root).
#
# The guest has no NVIDIA driver, so nothing is behind these device nodes: opening one that the
# cgroup device filter allows fails with ENXIO, one it denies with EPERM. That difference is what
# slice scenarios test.
#
# Device numbers. 195 is the NVIDIA driver's fixed major (nvidiaN = 195:N, nvidiactl = 195:255).
# nvidia-uvm and nvidia-caps get *dynamic* majors from the kernel on a real host, read from
# /proc/devices. The values below are the ones the fake driver "registers"; they live here and
# nowhere else. Code under test must read them (from /proc/devices, which fake_proc_devices
# overlays), never hard-code them.
FAKE_NVIDIA_MAJOR=195
FAKE_NVIDIA_UVM_MAJOR=510
FAKE_NVIDIA_CAPS_MAJOR=511
export FAKE_NVIDIA_MAJOR FAKE_NVIDIA_UVM_MAJOR FAKE_NVIDIA_CAPS_MAJOR

# fake_gpus N: /dev/nvidia0..N-1, /dev/nvidiactl, /dev/nvidia-uvm(-tools), /dev/nvidia-caps/
# config and monitor nodes, and the /proc overlays below. Idempotent.
fake_gpus() {
    local n=$1 i
    for ((i = 0; i < n; i++)); do
        [ -e /dev/nvidia$i ] || mknod -m 666 /dev/nvidia$i c "$FAKE_NVIDIA_MAJOR" $i
    done
    [ -e /dev/nvidiactl ] || mknod -m 666 /dev/nvidiactl c "$FAKE_NVIDIA_MAJOR" 255
    [ -e /dev/nvidia-uvm ] || mknod -m 666 /dev/nvidia-uvm c "$FAKE_NVIDIA_UVM_MAJOR" 0
    [ -e /dev/nvidia-uvm-tools ] || mknod -m 666 /dev/nvidia-uvm-tools c "$FAKE_NVIDIA_UVM_MAJOR" 1
    mkdir -p /dev/nvidia-caps
    chmod 755 /dev/nvidia-caps
    # The modes the driver's capability files give (DeviceFileMode): mig/config 0400 (root
    # creates instances), mig/monitor and every GI/CI access node 0444 (any user runs on MIG).
    [ -e /dev/nvidia-caps/nvidia-cap1 ] || mknod -m 400 /dev/nvidia-caps/nvidia-cap1 c "$FAKE_NVIDIA_CAPS_MAJOR" 1
    [ -e /dev/nvidia-caps/nvidia-cap2 ] || mknod -m 444 /dev/nvidia-caps/nvidia-cap2 c "$FAKE_NVIDIA_CAPS_MAJOR" 2
    fake_proc_devices
    fake_mig_minors "$n"
}

# fake_cap_node MINOR: create /dev/nvidia-caps/nvidia-capMINOR as `nvidia-modprobe -f` would.
fake_cap_node() {
    [ -e "/dev/nvidia-caps/nvidia-cap$1" ] ||
        mknod -m 444 "/dev/nvidia-caps/nvidia-cap$1" c "$FAKE_NVIDIA_CAPS_MAJOR" "$1"
}

# /proc/devices is not writable, but a file can be bind-mounted over it (as lxcfs does for
# /proc/meminfo): the overlay is the real list plus the majors above.
fake_proc_devices() {
    grep -q ' nvidia-caps$' /proc/devices && return 0
    mkdir -p /run/vmtest-fake
    awk -v n="$FAKE_NVIDIA_MAJOR" -v u="$FAKE_NVIDIA_UVM_MAJOR" -v c="$FAKE_NVIDIA_CAPS_MAJOR" '
        { print }
        /^Character devices:/ {
            printf "%3d nvidia-frontend\n%3d nvidia-uvm\n%3d nvidia-caps\n", n, u, c
        }' /proc/devices >/run/vmtest-fake/devices
    mount --bind /run/vmtest-fake/devices /proc/devices
}

# /proc/driver/nvidia-caps/mig-minors as the driver writes it: "config 1", "monitor 2", then per
# GPU N (0..N-1), GPU instance G (0..14) and compute instance C (0..7):
#   gpuN/giG/access  3 + N*135 + G*9
#   gpuN/giG/ciC/access  3 + N*135 + G*9 + 1 + C
# A tmpfs over /proc/driver carries it (procfs itself is read-only).
fake_mig_minors() {
    local gpus=$1 g gi ci base
    # Kept when it already covers this many GPUs; an earlier scenario of the same VM may have
    # written it for fewer (65 after 59 found gpu4's GIs missing).
    grep -q "^gpu$((gpus - 1))/gi14/ci7/access " /proc/driver/nvidia-caps/mig-minors 2>/dev/null && return 0
    mkdir -p /proc/driver 2>/dev/null
    mountpoint -q /proc/driver || mount -t tmpfs -o mode=755,size=1M fake-nvidia-driver /proc/driver
    mkdir -p /proc/driver/nvidia-caps
    {
        echo "config 1"
        echo "monitor 2"
        for ((g = 0; g < gpus; g++)); do
            for ((gi = 0; gi < 15; gi++)); do
                base=$((3 + g * 135 + gi * 9))
                echo "gpu$g/gi$gi/access $base"
                for ((ci = 0; ci < 8; ci++)); do echo "gpu$g/gi$gi/ci$ci/access $((base + 1 + ci))"; done
            done
        done
    } >/proc/driver/nvidia-caps/mig-minors
}

# fake_nvml: the fake libnvidia-ml built on the host (fakes/fake-nvml), when the harness brought
# it. Installs it where the NVML loader looks (libnvidia-ml.so.1) and prints its path; returns 1
# when there is none.
fake_nvml() {
    local so=${VMTEST_DIR:-/test}/fakes/libfake_nvml.so
    [ -r "$so" ] || return 1
    install -D -m 644 "$so" /usr/local/lib/fake-nvml/libnvidia-ml.so.1
    ln -sf libnvidia-ml.so.1 /usr/local/lib/fake-nvml/libnvidia-ml.so
    echo /usr/local/lib/fake-nvml/libnvidia-ml.so.1
}

# fake_mps_control: an nvidia-cuda-mps-control at /usr/bin, as the driver package installs it. A
# fake from fakes/ (when the harness brought one) or a placeholder that only exists, so that unit
# checks (systemd-analyze verify) see the executable the units name.
fake_mps_control() {
    local fake=${VMTEST_DIR:-/test}/fakes/nvidia-cuda-mps-control
    [ -e /usr/bin/nvidia-cuda-mps-control ] && return 0
    if [ -x "$fake" ]; then
        install -m 755 "$fake" /usr/bin/nvidia-cuda-mps-control
    else
        printf '#!/bin/sh\necho "placeholder nvidia-cuda-mps-control (vm-tests)" >&2\nexit 1\n' \
            >/usr/bin/nvidia-cuda-mps-control
        chmod 755 /usr/bin/nvidia-cuda-mps-control
    fi
}

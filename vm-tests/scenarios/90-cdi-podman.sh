#!/bin/bash
# 90: the per-team CDI spec with a real container engine (Debian's podman + crun, as root).
# gpuctld writes /var/run/cdi/gpuctl.io-team-<team>.json; a container started with
# `podman run $(gpuctl env --team infer --format cdi)` (= --device gpuctl.io/team=infer
# --cgroup-parent=gpu-infer.slice) sees exactly infer's nodes (they open: ENXIO, no driver), not
# GPU 1's, and GPU 1's node forced in with --device /dev/nvidia1 is denied (EPERM: crun's mknod
# of it) by the slice's device filter; the env is infer's; the container's cgroup is under gpu-infer.slice with its
# memory.max; under a slice granting the nodes only `rw` crun's mknod is denied (why `rwm`).
# Without the cgroup parent the forced node opens: CDI alone does not isolate. An MPS
# team gets its pipe directory mounted; a device-less team starts without GPUs.
# vmtest: timeout=600
# vmtest: group=usage
# Probe output is indented with sed; the flags of `gpuctl env --format cdi` are meant to split.
# shellcheck disable=SC2001,SC2011,SC2012,SC2046,SC2086,SC2119
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
. lib/cdi.sh

gpuctld_setup 4
test_users
fake_mps_control
put_policy 90-cdi.toml <<'P'
version = 1
[teams.infer]
members = ["@ml-infer"]
memory-max = "256M"
[teams.train]
members = ["@ml-train"]
memory-max = "512M"
[teams.train.mps]
active-thread-percentage = 50
[teams.idle]
members = ["alice"]
[teams.pair]
members = ["alice"]
[[gpu]]
index = [0]
owner = "infer"
[[gpu]]
index = [1]
owner = "train"
[[gpu]]
index = [2, 3]
owner = "pair"
P
gpuctld_start
check "gpuctld converged" wait_converged 30
echo "engines: $(podman --version), $(crun --version | head -n1), conmon $(conmon --version | head -n1)"

ls -l /var/run/cdi/ | sed 's/^/    cdi| /'
for t in infer train idle; do
    n=1
    [ "$t" = idle ] && n=0
    check "spec for $t: kind gpuctl.io/team, the share named $t, then $n device(s) named $t.<UUID>" \
        test "$(jq -r '[.kind, .devices[0].name, ([.devices[1:][].name | split(".")[0]] | unique | join(",")), (.devices | length - 1)] | map(tostring) | join(" ")' "$(cdi_spec $t)")" = "gpuctl.io/team $t ${t/idle/} $n"
done
check "infer's spec nodes are exactly gpu-infer.slice's DeviceAllow" test \
    "$(jq -r '.devices[0].containerEdits.deviceNodes[].path' "$(cdi_spec infer)" | sort | xargs)" = \
    "$(systemctl show -P DeviceAllow gpu-infer.slice | tr ' ' '\n' | grep '^/' | sort | xargs)"
sed 's/^/    infer.json| /' "$(cdi_spec infer)" | head -30

flags=$(gpuctl env --team infer --format cdi)
echo "gpuctl env --team infer --format cdi: $flags"
check "env --format cdi prints the device and the cgroup parent" \
    test "$flags" = "--device gpuctl.io/team=infer --cgroup-parent=gpu-infer.slice"

check_output "busybox-static rootfs for the containers" cdi_rootfs
export NODES="/dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia1 /dev/nvidia2"
# shellcheck disable=SC2086 # flags are words
out=$(in_ctr $flags --cgroupns=host -e NODES -- "$PROBE" 2>&1)
echo "$out" | sed 's/^/    infer| /'
for n in /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools; do
    check "inside: infer's $n exists and opens (ENXIO: allowed, no driver)" test "$(field "$out" "node $n")" = ENXIO
done
check "inside: GPU 1's and 2's nodes are absent" \
    test "$(field "$out" "node /dev/nvidia1") $(field "$out" "node /dev/nvidia2")" = "ABSENT ABSENT"
check "inside: CUDA_VISIBLE_DEVICES is infer's GPU" test "$(field "$out" env | grep '^CUDA_VISIBLE_DEVICES=')" = "CUDA_VISIBLE_DEVICES=$(gpu_uuid 0)"
check "inside: NVIDIA_VISIBLE_DEVICES and GPUCTL_TEAM are infer's" \
    test "$(field "$out" env | grep -E '^(NVIDIA_VISIBLE_DEVICES|GPUCTL_TEAM)=' | xargs)" = "GPUCTL_TEAM=infer NVIDIA_VISIBLE_DEVICES=$(gpu_uuid 0)"
cg=$(field "$out" cgroup)
check "inside: the container's cgroup is under gpu-infer.slice ($cg)" grep -q '^/gpu.slice/gpu-infer.slice/' <<<"$cg"
check "inside: memory.max of gpu-infer.slice seen from the container is 256M" \
    test "$(field "$out" memmax | awk '$1 == "/gpu.slice/gpu-infer.slice" {print $2}')" = 268435456

# Why team slices grant `rwm`: under a slice whose DeviceAllow= grants the same nodes only `rw`
# (what gpuctl set before), crun cannot create them in the container, because the cgroup device
# filter checks mknod too.
{
    printf '[Slice]\nDevicePolicy=closed\n'
    for n in $(jq -r '.devices[0].containerEdits.deviceNodes[].path' "$(cdi_spec infer)"); do echo "DeviceAllow=$n rw"; done
} >/run/systemd/system/vmtest-rw.slice
systemctl daemon-reload
out=$(in_ctr --device gpuctl.io/team=infer --cgroup-parent=vmtest-rw.slice -- true 2>&1)
echo "$out" | tail -n 3 | sed 's/^/    rw-only| /'
check "under DeviceAllow=... rw (no m) the container fails: mknod of a team node denied" \
    grep -q 'mknod.*Operation not permitted' <<<"$out"
rm -f /run/systemd/system/vmtest-rw.slice
systemctl daemon-reload

# shellcheck disable=SC2086
# With `rwm` crun creates every node of the container with mknod under the slice, so a foreign
# node is stopped already there: the device filter denies its mknod and the container does not
# start. (Were it created some other way, opening it would give EPERM: either is a denial.)
out=$(in_ctr $flags --device /dev/nvidia1 -e NODES -- "$PROBE" 2>&1)
echo "$out" | grep -E '^(node|Error)' | sed 's/^/    forced| /'
check "another team's node forced in with --device /dev/nvidia1 is denied by the slice (mknod or open: EPERM)" \
    sh -c 'grep -q "mknod .*/dev/nvidia1.*Operation not permitted" || grep -q "^node /dev/nvidia1 EPERM$"' <<<"$out"
check "... and does not open: no 'node /dev/nvidia1 ENXIO|OK'" sh -c '! grep -qE "^node /dev/nvidia1 (ENXIO|OK)$"' <<<"$out"

# Without a cgroup parent root podman's container lands in machine.slice, which gpuctld fences
# (`[host] outside = "closed"`, the default): no NVIDIA node is created or opens there.
out=$(in_ctr --device gpuctl.io/team=infer --device /dev/nvidia1 -e NODES -- "$PROBE" 2>&1)
echo "$out" | grep -E '^(node|cgroup|Error)' | sed 's/^/    no-parent| /'
check "without --cgroup-parent (machine.slice, fenced) the GPU nodes are denied (mknod or open: EPERM)" \
    sh -c 'grep -q "mknod .*/dev/nvidia.*Operation not permitted" || grep -q "^node /dev/nvidia1 EPERM$"' <<<"$out"
check "... and none opens: no 'node /dev/nvidia* ENXIO|OK'" sh -c '! grep -qE "^node /dev/nvidia[0-9]+ (ENXIO|OK)$"' <<<"$out"

# An MPS team: its pipe directory is mounted, CUDA_MPS_PIPE_DIRECTORY points at it.
inst=$(jq -r '.devices[0].containerEdits.mounts[0].hostPath' "$(cdi_spec train)")
echo "train's pipe dir: $inst ($(ls "$inst" 2>&1 | xargs))"
check "train's spec mounts its MPS pipe directory (CDI 0.4.0: typed mount)" \
    test "$(jq -r '.cdiVersion' "$(cdi_spec train)") $inst" = "0.4.0 /run/gpuctl/mps/train-gpus"
out=$(in_ctr $(gpuctl env --team train --format cdi) -- 'echo "pipe $CUDA_MPS_PIPE_DIRECTORY"; ls -a "$CUDA_MPS_PIPE_DIRECTORY" | sed "s/^/entry /"; grep " $CUDA_MPS_PIPE_DIRECTORY " /proc/self/mountinfo | sed "s/^/mnt /"' 2>&1)
echo "$out" | sed 's/^/    train| /'
check "inside train's container: CUDA_MPS_PIPE_DIRECTORY is the mounted pipe dir" \
    test "$(field "$out" pipe)" = "$inst"
check "inside train's container: the pipe dir is a bind mount of the host's" grep -q '^mnt ' <<<"$out"
check "inside train's container: same entries as on the host" \
    test "$(field "$out" entry | grep -v '^\.\.\?$' | sort | xargs)" = "$(ls "$inst" | sort | xargs)"

# A device-less team: the entry grants nothing, the container starts without GPUs.
out=$(in_ctr $(gpuctl env --team idle --format cdi) -e NODES -- "$PROBE" 2>&1)
echo "$out" | sed 's/^/    idle| /'
check "idle team: container starts, no GPU node inside" \
    test "$(field "$out" "node /dev/nvidia0") $(field "$out" "node /dev/nvidiactl")" = "ABSENT ABSENT"
check "idle team: CUDA_VISIBLE_DEVICES empty, NVIDIA_VISIBLE_DEVICES=void" \
    test "$(field "$out" env | grep -E '^(CUDA|NVIDIA)_VISIBLE' | xargs)" = "CUDA_VISIBLE_DEVICES= NVIDIA_VISIBLE_DEVICES=void"

# One device by its own CDI name (`<team>.<UUID>`, what a placed `gpuctl run` exports as
# GPUCTL_CDI_DEVICE): podman accepts the name and the container gets that device.
one="gpuctl.io/team=infer.$(gpu_uuid 0)"
out=$(in_ctr --device "$one" --cgroup-parent=gpu-infer.slice -e NODES -- "$PROBE" 2>&1)
echo "$out" | grep -E '^(node|env|Error)' | sed 's/^/    one-device| /'
check "podman takes a per-device name ($one): its node opens, its UUID alone in the env" \
    test "$(field "$out" "node /dev/nvidia0") $(field "$out" env | grep '^CUDA_VISIBLE_DEVICES=')" = "ENXIO CUDA_VISIBLE_DEVICES=$(gpu_uuid 0)"

# A share of two whole GPUs: each device entry carries its own node and UUID, not its sibling's.
one="gpuctl.io/team=pair.$(gpu_uuid 3)"
out=$(NODES="/dev/nvidia2 /dev/nvidia3" in_ctr --device "$one" --cgroup-parent=gpu-pair.slice -e NODES -- "$PROBE" 2>&1)
echo "$out" | grep -E '^(node|env|Error)' | sed 's/^/    pair-one| /'
check "two-GPU share, device $one: GPU 3 opens, GPU 2 absent, GPU 3's UUID alone in the env" \
    test "$(field "$out" "node /dev/nvidia3") $(field "$out" "node /dev/nvidia2") $(field "$out" env | grep '^CUDA_VISIBLE_DEVICES=')" = "ENXIO ABSENT CUDA_VISIBLE_DEVICES=$(gpu_uuid 3)"

# Unknown team: a clear engine error, not a silent GPU-less start.
# Podman answers a device it cannot resolve with its own 126 (the contained command could not
# be invoked), which check_not reads as a command that never ran: the error itself is checked.
rc=0
out=$(in_ctr --device gpuctl.io/team=nosuch -- true 2>&1) || rc=$?
check "an unknown team's device is refused by podman (exit $rc)" test "$rc" != 0
check "... as an unresolvable CDI device" grep -q 'unresolvable CDI devices gpuctl.io/team=nosuch' <<<"$out"

# The same through an image imported offline from the rootfs tar (slow under TCG: last).
t0=$SECONDS
check_output "tiny image imported offline from busybox-static (podman import)" cdi_image
echo "podman import took $((SECONDS - t0)) s"
out=$(podman run --rm --network=none $flags -e NODES "$CDI_IMAGE" sh -c "$PROBE" 2>&1)
echo "$out" | grep '^node' | sed 's/^/    image| /'
check "from the imported image: infer's node opens, GPU 1's is absent" \
    test "$(field "$out" "node /dev/nvidia0") $(field "$out" "node /dev/nvidia1")" = "ENXIO ABSENT"
finish

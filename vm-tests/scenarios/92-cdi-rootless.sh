#!/bin/bash
# 92: members and rootless podman. `gpuctl env --format cdi` is for members only. alice (a member
# of infer) runs rootless podman inside her team share: `gpuctl run --team infer -- podman run
# --cgroups=disabled --device gpuctl.io/team=infer ...`: with cgroups disabled the container stays
# in the caller's cgroup, the `gpuctl run` scope under gpu-infer.slice, so the slice's device
# filter and memory limit hold (docs/containers.md, "Rootless"). Outside gpuctl run, rootless
# podman's container is not under the team slice. bob (no team) gets neither infer's CDI device
# (the spec is for members) nor, forced in, its node (the outside fence of user.slice). A member
# removed from the policy loses read access to the spec at the next reconcile.
# vmtest: timeout=480
# vmtest: group=usage
# Probe output is indented with sed; the flags of `gpuctl env --format cdi` are meant to split.
# shellcheck disable=SC2001,SC2011,SC2012,SC2046,SC2086,SC2119
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
. lib/cdi.sh

shell_setup
echo "subuid: $(grep -c . /etc/subuid) entries; newuidmap: $(command -v newuidmap || echo absent)"
check_output "a member gets the flags" as alice "gpuctl env --team infer --format cdi"
check_not "a non-member is refused (bob, infer)" as bob "gpuctl env --team infer --format cdi"

# Without newuidmap (package uidmap, not in the image) podman refuses a user with subordinate
# ids; a user without them runs with only their own uid mapped, which is all this needs.
sed -i '/^alice:/d' /etc/subuid /etc/subgid
rootfs=$(cdi_rootfs alice)

# The fake driver's /proc overlays (lib/fake-hw.sh: a file bound over /proc/devices, a tmpfs over
# /proc/driver) make procfs "not fully visible", and the kernel then refuses a fresh procfs mount
# in a user namespace: rootless crun fails with "mount `proc` to `proc`: Operation not permitted"
# (the first run of this scenario). A real host has no such overlays (an lxcfs host has, with the
# same effect); alice's podman runs in a private mount namespace without them.
# Its own XDG_RUNTIME_DIR: logind mounts /run/user/UID when a session opens, and a mount made
# after the unshare does not reach the private namespace, so whether alice's podman saw her
# runtime dir or the bare root-owned mount point depended on whether her previous session's
# mount had been torn down yet ("XDG_RUNTIME_DIR ... is not owned by the current user": the
# forced run of a CI check failed so).
# as_np USER CMD: CMD as USER in such a namespace, with a runtime dir of their own.
as_np() {
    local u=$1
    shift
    install -d -o "$u" -g "$u" -m 0700 "/run/vmtest-$u"
    unshare -m --propagation private sh -c 'umount -l /proc/devices; umount -l /proc/driver; exec su -s /bin/sh "$1" -c "export XDG_RUNTIME_DIR=/run/vmtest-$1; $2"' sh "$u" "$*"
}
as_alice_np() { as_np alice "$@"; }

export NODES="/dev/nvidia0 /dev/nvidiactl /dev/nvidia1"
# as alice, inside her team share; --cgroupns=host to read the slice's memory.max.
run_as_alice() {
    as_alice_np "cd ~ && NODES='$NODES' gpuctl run --team infer -- podman run --rm --network=none --cgroups=disabled $* --cgroupns=host -e NODES --rootfs $rootfs sh -c '$PROBE'"
}
# Rootless podman keeps one pause process per user in the cgroup where it first runs: started
# inside a job's scope it would keep the scope, and so the job's device lease, alive after the
# job (docs/containers.md). Started here, in the session, as a user's first podman would be.
as_alice_np "cd ~ && podman unshare true"
out=$(run_as_alice --device gpuctl.io/team=infer 2>&1)
echo "$out" | sed 's/^/    rootless| /'
check "rootless: the container started with infer's CDI device" grep -q '^node /dev/nvidia0 ' <<<"$out"
check "rootless: infer's node opens (ENXIO)" test "$(field "$out" "node /dev/nvidia0")" = ENXIO
check "rootless: GPU 1's node absent" test "$(field "$out" "node /dev/nvidia1")" = ABSENT
check "rootless: CUDA_VISIBLE_DEVICES is infer's" test "$(field "$out" env | sed -n 's/^CUDA_VISIBLE_DEVICES=//p')" = "$(gpu_uuid 0)"
cg=$(field "$out" cgroup)
check "rootless: the container stays under gpu-infer.slice ($cg)" grep -q '^/gpu.slice/gpu-infer.slice/' <<<"$cg"
check "rootless: memory.max of gpu-infer.slice seen inside is 256M" \
    test "$(field "$out" memmax | awk '$1 == "/gpu.slice/gpu-infer.slice" {print $2}')" = 268435456
out=$(run_as_alice --device gpuctl.io/team=infer --device /dev/nvidia1 2>&1)
echo "$out" | grep -E '^(node|Error|cgroup)|level=error|gpuctl:' | sed 's/^/    forced| /'
check "rootless: another team's node forced in is denied (EPERM)" test "$(field "$out" "node /dev/nvidia1")" = EPERM

# Outside gpuctl run, rootless podman's container is in alice's own cgroup, not the team's.
out=$(as_alice_np "cd ~ && podman run --rm --network=none --device gpuctl.io/team=infer --cgroupns=host --rootfs $rootfs cat /proc/self/cgroup" 2>&1)
echo "$out" | tail -n 2 | sed 's/^/    outside| /'
# The container must have run (its cgroup line is there) and be elsewhere: a podman that failed
# to start would otherwise pass (the earlier form of this check did: podman had refused to
# start, see below).
check "rootless without gpuctl run: the container ran" grep -q '^0::/' <<<"$out"
check "rootless without gpuctl run: not under gpu-infer.slice" bash -c "! grep -q '^0::/gpu.slice/gpu-infer.slice/' <<<'$out'"
# --cgroup-parent=gpu-infer.slice does not reach the system slice from a user's podman: without
# a user session podman falls back to cgroupfs and refuses a slice name as the parent.
out=$(as_alice_np "cd ~ && podman run --rm --network=none --device gpuctl.io/team=infer --cgroup-parent=gpu-infer.slice --cgroupns=host --rootfs $rootfs cat /proc/self/cgroup" 2>&1)
rc=$?
echo "$out" | tail -n 2 | sed 's/^/    parent| /'
# Either outcome keeps the container out of the slice, and each is checked for itself: a podman
# that failed for another reason proves nothing.
if grep -q '^0::/' <<<"$out"; then
    check "rootless --cgroup-parent=gpu-infer.slice: the container ran, not under the team slice" \
        bash -c "! grep -q '^0::/gpu.slice/gpu-infer.slice/' <<<\"\$1\"" _ "$out"
else
    check "rootless --cgroup-parent=gpu-infer.slice: podman refuses the slice as the parent (rc $rc)" \
        grep -q 'systemd slice received as cgroup parent when using cgroupfs' <<<"$out"
fi

# bob (no team) with rootless podman: infer's spec is not his to read, so the CDI device does
# not resolve; forcing infer's node in from his session (user.slice) meets the outside fence.
sed -i '/^bob:/d' /etc/subuid /etc/subgid
rootfs_bob=$(cdi_rootfs bob)
out=$(as_np bob "cd ~ && podman run --rm --network=none --cgroups=disabled --device gpuctl.io/team=infer --rootfs $rootfs_bob true" 2>&1)
rc=$?
echo "$out" | tail -n 2 | sed 's/^/    bob-cdi| /'
check "bob: podman with infer's CDI device fails (rc $rc)" test "$rc" != 0
check "bob: ... because the device does not resolve for him" grep -qi 'cdi' <<<"$out"
out=$(as_np bob "cd ~ && podman run --rm --network=none --cgroups=disabled --device /dev/nvidia0 -e NODES=/dev/nvidia0 --cgroupns=host --rootfs $rootfs_bob sh -c 'grep ^0:: /proc/self/cgroup; $PROBE'" 2>&1)
echo "$out" | grep -E '^(0::|node|Error)' | sed 's/^/    bob-forced| /'
check "bob: his rootless container runs in user.slice" grep -q '^0::/user.slice/' <<<"$out"
check "bob: infer's node forced in is denied there (EPERM)" test "$(field "$out" "node /dev/nvidia0")" = EPERM

# A member removed from the policy: train's devices and environment stay as they were, so only
# the read-back ACL shows that alice can still read the spec; gpuctld writes it again without her.
spec=$(cdi_spec train)
check "alice (a member of train by name) reads train's spec" as alice "test -r $spec"
sed -i 's/^members = \["@ml-train", "alice"\]$/members = ["@ml-train"]/' /etc/gpuctl/policy.d/60-shell.toml
check "the policy no longer lists alice in train" sh -c '! grep -q "\"@ml-train\", \"alice\"" /etc/gpuctl/policy.d/60-shell.toml'
reload_wait
check "gpuctld converged after the change" wait_converged 30
check_not "alice can no longer read train's spec" as alice "cat $spec"
check "the journal says why it was written again" journal_has "train's CDI spec is readable by alice outside the team"
check_output "carol (@ml-train) still reads it" as carol "test -r $spec"
finish

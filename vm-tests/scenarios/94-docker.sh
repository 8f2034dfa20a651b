#!/bin/bash
# 94: Docker without CDI (Debian's docker.io 20.10, docker-compose 1.29; docs/containers.md,
# "Docker"). dockerd with the systemd cgroup driver; an image imported offline from
# busybox-static. A container started with `gpuctl env --team infer --format docker` runs in
# gpu-infer.slice, opens infer's nodes (ENXIO: allowed, no driver), gets EPERM on train's forced
# in with --device, and sits under the slice's memory.max; train's (MPS) gets its pipe directory
# mounted. Inside `gpuctl run --team infer --gpus 1` the flags name only the placed GPU. The
# compose fragment passes `docker-compose config` and `docker-compose up` runs the service the
# same way; `gpuctl top` names the container, in infer's slice, and one started without the flags
# (system.slice, unfenced) as a stray. With the daemon's cgroup-parent set to machine.slice, a
# container started without the flags gets no GPU (the outside fence).
# vmtest: timeout=600
# vmtest: group=usage
# Probe output is indented with sed; the flags of `gpuctl env --format docker` are meant to split.
# shellcheck disable=SC2001,SC2046,SC2086
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
. lib/cdi.sh

gpuctld_setup 4
test_users
put_policy 94-docker.toml <<'P'
version = 1
[teams.infer]
members = ["@ml-infer"]
memory-max = "256M"
[teams.infer.placement]
jobs-per-device = 1
[teams.train]
members = ["@ml-train"]
memory-max = "512M"
[teams.train.mps]
active-thread-percentage = 50
[[gpu]]
index = [0, 2]
owner = "infer"
[[gpu]]
index = [1]
owner = "train"
P
gpuctld_start
check "gpuctld converged" wait_converged 30

# The daemon as the docs say: systemd cgroup driver. No network in the guest: no bridge, no
# iptables; containers run with --network=none.
mkdir -p /etc/docker
echo '{ "exec-opts": ["native.cgroupdriver=systemd"], "bridge": "none", "iptables": false }' >/etc/docker/daemon.json
t0=$SECONDS
check "dockerd starts" systemctl start docker.service
echo "dockerd started in $((SECONDS - t0)) s: docker $(docker version --format '{{.Server.Version}}'), $(docker-compose version --short 2>/dev/null | head -n1 | sed 's/^/docker-compose /'), $(runc --version | head -n1)"
check "docker uses the systemd cgroup driver" test "$(docker info --format '{{.CgroupDriver}}')" = systemd

# The image: the CDI scenarios' busybox-static rootfs plus the probe as a script.
t0=$SECONDS
img=$(mktemp -d)
_cdi_rootfs_tar | tar -C "$img" -xf -
printf '%s\n' "$PROBE" >"$img/probe.sh"
ln -s busybox "$img/bin/sleep"
check "image gpuctl-bb imported offline (docker import)" sh -c "tar -C '$img' -cf - . | docker import - gpuctl-bb >/dev/null"
rm -rf "$img"
echo "docker import took $((SECONDS - t0)) s"

export NODES="/dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools"
# dk ARGS...: a probe container (foreground, removed after), host cgroup namespace so that the
# probe sees its cgroup path and the slice's memory.max.
dk() { docker run --rm --network=none --cgroupns=host -e NODES "$@" gpuctl-bb sh /probe.sh 2>&1; }

flags=$(gpuctl env --team infer --format docker)
echo "gpuctl env --team infer --format docker: $flags"
check "the flags name gpu-infer.slice as cgroup parent" grep -q -- '^--cgroup-parent=gpu-infer.slice ' <<<"$flags"
check "their --device nodes are exactly gpu-infer.slice's DeviceAllow" test \
    "$(grep -o -- '--device=[^ ]*' <<<"$flags" | cut -d= -f2 | sort | xargs)" = \
    "$(systemctl show -P DeviceAllow gpu-infer.slice | tr ' ' '\n' | grep '^/' | sort | xargs)"
check "... which are infer's CDI spec's" test \
    "$(grep -o -- '--device=[^ ]*' <<<"$flags" | cut -d= -f2 | sort | xargs)" = \
    "$(jq -r '.devices[0].containerEdits.deviceNodes[].path' "$(cdi_spec infer)" | sort | xargs)"
check "CUDA_VISIBLE_DEVICES is infer's two GPUs" grep -q -- "-e CUDA_VISIBLE_DEVICES=$(gpu_uuid 0),$(gpu_uuid 2) " <<<"$flags"

out=$(dk $flags)
echo "$out" | sed 's/^/    infer| /'
for n in /dev/nvidia0 /dev/nvidia2 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools; do
    check "inside: infer's $n opens (ENXIO: allowed, no driver)" test "$(field "$out" "node $n")" = ENXIO
done
check "inside: train's /dev/nvidia1 is absent" test "$(field "$out" "node /dev/nvidia1")" = ABSENT
check "inside: the env is infer's" test "$(field "$out" env | grep -E '^(GPUCTL_TEAM|NVIDIA_VISIBLE_DEVICES)=' | xargs)" = \
    "GPUCTL_TEAM=infer NVIDIA_VISIBLE_DEVICES=$(gpu_uuid 0),$(gpu_uuid 2)"
cg=$(field "$out" cgroup)
check "inside: the container runs in gpu-infer.slice ($cg)" grep -Eq '^/gpu.slice/gpu-infer.slice/docker-[0-9a-f]{64}.scope$' <<<"$cg"
check "inside: its memory limit is the slice's 256M" \
    test "$(field "$out" memmax | awk '$1 == "/gpu.slice/gpu-infer.slice" {print $2}')" = 268435456

# Train's node forced in: runc's mknod of it is denied by the slice's filter, and runc then
# bind-mounts the host's node, which the filter denies to open (EPERM) as well.
out=$(dk $flags --device /dev/nvidia1)
echo "$out" | grep -E '^node|rror' | sed 's/^/    forced| /'
check "train's /dev/nvidia1 forced in with --device is denied (EPERM)" \
    grep -Eq '^node /dev/nvidia1 EPERM$|nvidia1.*[Oo]peration not permitted' <<<"$out"
check "... and does not open" sh -c '! grep -qE "^node /dev/nvidia1 (ENXIO|OK)$"' <<<"$out"

# An MPS team: its pipe directory is mounted (--mount, so a missing one would fail the start).
tflags=$(gpuctl env --team train --format docker)
echo "gpuctl env --team train --format docker: $tflags"
out=$(docker run --rm --network=none $tflags gpuctl-bb sh -c 'echo "pipe $CUDA_MPS_PIPE_DIRECTORY"; grep " $CUDA_MPS_PIPE_DIRECTORY " /proc/self/mountinfo | sed "s/^/mnt /"' 2>&1)
echo "$out" | sed 's/^/    train| /'
check "train: CUDA_MPS_PIPE_DIRECTORY is its daemon's pipe dir" test "$(field "$out" pipe)" = /run/gpuctl/mps/train-gpus
check "train: the pipe dir is a bind mount of the host's" grep -q '^mnt ' <<<"$out"

# Placement: inside `gpuctl run --gpus 1` the flags name the placed GPU only.
pflags=$(gpuctl run --team infer --gpus 1 -- gpuctl env --team infer --format docker 2>&1)
echo "placed: $pflags"
pdev=$(tr ' ' '\n' <<<"$pflags" | grep -E '^--device=/dev/nvidia[0-9]+$' | cut -d= -f2 | xargs)
check "placed: exactly one GPU node ($pdev)" grep -Eq '^/dev/nvidia[02]$' <<<"$pdev"
check "placed: CUDA_VISIBLE_DEVICES is that GPU" grep -q -- "-e CUDA_VISIBLE_DEVICES=$(gpu_uuid "${pdev#/dev/nvidia}") " <<<"$pflags"
check "placed: the control nodes are still there" grep -q -- '--device=/dev/nvidiactl' <<<"$pflags"
# shellcheck disable=SC2016 # expanded in the placed job
out=$(gpuctl run --team infer --gpus 1 -- sh -c 'exec docker run --rm --network=none --cgroupns=host -e NODES $(gpuctl env --team infer --format docker) gpuctl-bb sh /probe.sh' 2>&1)
echo "$out" | grep '^node' | sed 's/^/    placed| /'
opened=$(grep -E '^node /dev/nvidia[0-9] ENXIO$' <<<"$out" | cut -d' ' -f2 | xargs)
check "placed container: one of infer's GPUs opens, the other is absent ($opened)" grep -Eq '^/dev/nvidia[02]$' <<<"$opened"

# Compose: the fragment as an override file of a service "probe".
dc=$(mktemp -d)
cat >"$dc/docker-compose.yml" <<'Y'
services:
  probe:
    image: gpuctl-bb
    network_mode: none
    environment:
      NODES: "/dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidiactl"
    command: ["sh", "-c", "sh /probe.sh; exec sleep 600"]
Y
gpuctl env --team infer --format compose --service probe >"$dc/gpu.yml"
sed 's/^/    gpu.yml| /' "$dc/gpu.yml"
cd "$dc" || exit 1
# One `config` run (each docker-compose start is seconds of python under TCG): its status, then
# its output read by the checks below.
merged=$(docker-compose -p vmt -f docker-compose.yml -f gpu.yml config 2>&1)
rc=$?
VMTEST_SHOW_LINES=40 check_output "docker-compose config accepts the fragment as an override" \
    sh -c 'printf "%s\n" "$1"; exit "$2"' _ "$merged" "$rc"
check "merged service: cgroup_parent gpu-infer.slice" grep -q 'cgroup_parent: gpu-infer.slice' <<<"$merged"
check "merged service: infer's GPU nodes among its devices" \
    test "$(grep -cE '^ *- /dev/nvidia[02]:/dev/nvidia[02]$' <<<"$merged")" = 2
t0=$SECONDS
check_output "docker-compose up -d runs it" docker-compose -p vmt -f docker-compose.yml -f gpu.yml up -d
echo "docker-compose up took $((SECONDS - t0)) s"
id=$(docker-compose -p vmt -f docker-compose.yml -f gpu.yml ps -q probe)
check "compose: its container runs in gpu-infer.slice (docker-$id.scope)" \
    test -d "/sys/fs/cgroup/gpu.slice/gpu-infer.slice/docker-$id.scope"
check "compose: under the slice's memory.max of 256M" \
    test "$(cat /sys/fs/cgroup/gpu.slice/gpu-infer.slice/memory.max)" = 268435456
wait_for 30 sh -c "docker logs $id 2>&1 | grep -q '^cgroup '"
out=$(docker logs "$id" 2>&1)
echo "$out" | grep -E '^(node|env)' | sed 's/^/    compose| /'
check "compose: infer's nodes open (ENXIO), train's is absent" \
    test "$(field "$out" "node /dev/nvidia0") $(field "$out" "node /dev/nvidia2") $(field "$out" "node /dev/nvidiactl") $(field "$out" "node /dev/nvidia1")" = "ENXIO ENXIO ENXIO ABSENT"
check "compose: CUDA_VISIBLE_DEVICES is infer's" test "$(field "$out" env | sed -n 's/^CUDA_VISIBLE_DEVICES=//p')" = "$(gpu_uuid 0),$(gpu_uuid 2)"
cd / || exit 1

# gpuctl top: the compose container's process on GPU 0 is infer's and named; one started without
# the flags (system.slice: Docker's default parent, not fenced) on GPU 0 too is a stray.
docker run -d --name vmt-stray --network=none --device /dev/nvidia0 gpuctl-bb sleep 600 >/dev/null
P_CTR=$(docker inspect -f '{{.State.Pid}}' "$id")
P_STRAY=$(docker inspect -f '{{.State.Pid}}' vmt-stray)
sid=$(docker inspect -f '{{.Id}}' vmt-stray)
echo "container pids: compose $P_CTR ($(sed -n 's/^0:://p' /proc/$P_CTR/cgroup)), stray $P_STRAY ($(sed -n 's/^0:://p' /proc/$P_STRAY/cgroup))"
S=$FAKE_NVML_STATE
flock "$S.lock" sh -c "jq '.processes += [
    {pid: $P_CTR, gpu: 0, used_memory_mib: 2000},
    {pid: $P_STRAY, gpu: 0, used_memory_mib: 1000}]' '$S' >'$S.new' && mv '$S.new' '$S'"
# shellcheck disable=SC2317 # called through wait_for
top_has() {
    gpuctl top --once --json | jq -e --argjson a "$P_CTR" --argjson b "$P_STRAY" '
      [.. | objects | select(has("pid")) | select(.pid == $a or .pid == $b)] | length == 2' >/dev/null
}
wait_for 30 top_has
j=$(gpuctl top --once --json 2>&1)
proc() { jq -c --argjson p "$1" '[.. | objects | select(has("pid") and .pid == $p)] | first | [.team, .container, .stray]' <<<"$j"; }
check_output "top: the compose container's process is infer's, named, not a stray" \
    test "$(proc "$P_CTR")" = "[\"infer\",\"docker ${id:0:12}\",false]"
check_output "top: the container outside any team slice is a stray, named" \
    test "$(proc "$P_STRAY")" = "[null,\"docker ${sid:0:12}\",true]"
human=$(gpuctl top --once 2>&1)
echo "$human" | sed 's/^/    top| /'
# The pid column shows the pid inside the container too: "<host pid>(1)".
check "top's table names the compose container by short id, in infer" \
    grep -Eq "^ +$P_CTR(\\([0-9]+\\))? +root +infer +docker ${id:0:12} " <<<"$human"
check "top's table marks the other as a stray and names it" \
    grep -Eq "^ +!$P_STRAY(\\([0-9]+\\))? +root +- +docker ${sid:0:12} " <<<"$human"
(cd "$dc" && docker-compose -p vmt -f docker-compose.yml -f gpu.yml down -t 0 >/dev/null 2>&1)
docker rm -f vmt-stray >/dev/null

# Docker's default parent, system.slice, is the admin's and unfenced: a container started
# without the flags opens any GPU. The daemon's cgroup-parent = machine.slice puts such
# containers under the outside fence instead.
out=$(dk --device /dev/nvidia1)
echo "$out" | grep -E '^(node /dev/nvidia1|cgroup)' | sed 's/^/    default| /'
check "without the flags (system.slice): the container is not fenced, /dev/nvidia1 opens" \
    test "$(field "$out" "node /dev/nvidia1")" = ENXIO
echo '{ "exec-opts": ["native.cgroupdriver=systemd"], "bridge": "none", "iptables": false, "cgroup-parent": "machine.slice" }' >/etc/docker/daemon.json
check "dockerd restarts with cgroup-parent machine.slice" systemctl restart docker.service
out=$(dk)
check "with cgroup-parent machine.slice: a container without the flags runs there" grep -q '^cgroup /machine.slice/docker-' <<<"$out"
out=$(dk --device /dev/nvidia1)
echo "$out" | grep -E '^(node /dev/nvidia1|cgroup)|rror' | sed 's/^/    machine| /'
check "... and the GPU node is denied (EPERM: the outside fence)" \
    grep -Eq '^node /dev/nvidia1 EPERM$|nvidia1.*[Oo]peration not permitted' <<<"$out"
systemctl stop docker.service docker.socket containerd.service
finish

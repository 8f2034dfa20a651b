# shellcheck shell=bash
# vm-tests/lib/cdi.sh - helpers for the CDI scenarios (90-94, group cdi): a tiny offline image
# and a probe that runs inside a podman container (guest side, sourced after gpuctld.sh).
#
#   cdi_rootfs [USER]       a busybox-static rootfs directory (owned by USER for rootless
#                           podman); prints its path
#   cdi_image [USER]        import it as localhost/gpuctl-bb (a rootfs tar, no registry, no
#                           network) into root's store, or USER's rootless one
#   cdi_spec TEAM           path of TEAM's spec as gpuctld writes it
#   in_ctr ARGS... -- CMD   podman run --rm --network=none ARGS --rootfs ROOTFS sh -c CMD
#                           (the rootfs directly: under TCG an image import costs minutes)
#   PROBE                   a sh snippet for in_ctr: "node PATH ENXIO|EPERM|OK|ABSENT|other:..."
#                           per path in $NODES, then the team env, /proc/self/cgroup and the
#                           memory.max of every ancestor cgroup

CDI_IMAGE=localhost/gpuctl-bb

cdi_spec() { echo "/var/run/cdi/gpuctl.io-team-$1.json"; }

# The rootfs: busybox and relative links to it (so they work at any root), plus the
# directories a runtime mounts over.
_cdi_rootfs_tar() {
    local d
    d=$(mktemp -d)
    mkdir -p "$d/bin" "$d/dev" "$d/proc" "$d/sys" "$d/tmp" "$d/etc" "$d/run"
    cp /bin/busybox "$d/bin/busybox"
    # Only the applets the probes use: one link costs a fork under TCG.
    for a in sh cat echo env grep sed sort ls true; do ln -s busybox "$d/bin/$a"; done
    echo 'root:x:0:0:root:/:/bin/sh' >"$d/etc/passwd"
    echo 'root:x:0:' >"$d/etc/group"
    tar -C "$d" -cf - .
    rm -rf "$d"
}

# shellcheck disable=SC2120 # USER is optional
cdi_rootfs() {
    local d=/var/lib/vmtest-cdi/rootfs${1:+-$1}
    if [ ! -x "$d/bin/sh" ]; then
        mkdir -p "$d"
        _cdi_rootfs_tar | tar -C "$d" -xf -
        [ -n "${1:-}" ] && chown -R "$1:" "$d"
    fi
    echo "$d"
}

cdi_image() {
    if [ -n "${1:-}" ]; then
        _cdi_rootfs_tar >/tmp/gpuctl-bb.tar
        chmod 644 /tmp/gpuctl-bb.tar
        su -s /bin/sh "$1" -c "cd ~ && podman image exists $CDI_IMAGE || podman import -q /tmp/gpuctl-bb.tar $CDI_IMAGE"
    else
        podman image exists "$CDI_IMAGE" || _cdi_rootfs_tar | podman import -q - "$CDI_IMAGE"
    fi
}

# shellcheck disable=SC2016,SC2034 # expanded inside the container; PROBE is for the scenarios
PROBE='for n in $NODES; do
  if [ ! -e "$n" ]; then echo "node $n ABSENT"; continue; fi
  e=$( (exec 3<>"$n") 2>&1 )
  case $e in
    *"No such device or address"*) r=ENXIO ;;
    *"Operation not permitted"*) r=EPERM ;;
    *"Permission denied"*) r=EACCES ;;
    "") r=OK ;;
    *) r="other:$e" ;;
  esac
  echo "node $n $r"
done
env | grep -E "^(CUDA_|NVIDIA_|GPUCTL_)" | sort | sed "s/^/env /"
cg=$(sed -n "s/^0:://p" /proc/self/cgroup); echo "cgroup $cg"
p=$cg; while [ -n "$p" ] && [ "$p" != / ]; do
  [ -r "/sys/fs/cgroup$p/memory.max" ] && echo "memmax $p $(cat "/sys/fs/cgroup$p/memory.max")"
  p=${p%/*}
done'

in_ctr() {
    local args=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
    shift
    # shellcheck disable=SC2119 # root's rootfs
    podman run --rm --network=none "${args[@]}" --rootfs "$(cdi_rootfs)" sh -c "$*"
}

# field OUT KEY: the values after "KEY " in the probe output (e.g. field "$out" "node /dev/nvidia0").
field() { sed -n "s|^$2 ||p" <<<"$1"; }

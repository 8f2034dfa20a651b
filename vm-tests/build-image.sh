#!/bin/bash
# build-image.sh - build the minimal Debian bookworm guest of gpuctl's vm-tests (systemd PID 1,
# pure cgroup v2). Boot it with run-vm.sh; vm-tests/run calls both and caches the image keyed by a
# hash of this file and image-packages.txt. Started from the recipe in ../shared/vm/.
#
# Usage: build-image.sh [OUTDIR]          (default OUTDIR: /var/tmp/vm-image)
#        build-image.sh --host-tools      only install the host tools (step 1) and exit
# Env:   VM_EXTRA_PACKAGES="pkg1,pkg2"  extra Debian packages to put into the guest
#        VM_IMAGE_SIZE=3G               size of the (sparse) ext4 root image
#        DEBIAN_MIRROR=URL              the Debian mirror (the URL before /debian); default:
#                                       the one this host's apt uses (/etc/apt/sources.list*),
#                                       so a host behind a local mirror builds from it
#        DEBIAN_SECURITY_MIRROR=URL     the same for debian-security (default: the host's, else
#                                       DEBIAN_MIRROR)
#        PYPI_FILES=URL                 where Python wheels are fetched from (default:
#                                       https://files.pythonhosted.org; a host behind a mirror of
#                                       PyPI's files sets it); each wheel is pinned by sha256
#        VM_CUSTOMIZE='cmd'             extra mmdebstrap --customize-hook ($1 = guest root dir),
#                                       e.g. 'cp ./agent "$1/usr/local/bin/"'
#
# Produces in OUTDIR:  vmlinuz  initrd.img  rootfs.img (raw ext4, sparse)  build-info.txt
# Needs root (mmdebstrap --mode=root, chroot, mounts). Debian 12 host, x86_64.
set -euo pipefail

HOST_TOOLS_ONLY=0
[ "${1:-}" = --host-tools ] && { HOST_TOOLS_ONLY=1; shift; }
OUT=${1:-/var/tmp/vm-image}
SIZE=${VM_IMAGE_SIZE:-3G}
SUITE=bookworm
# The base URL of the host's apt source whose path ends in /$1 (debian, debian-security): from
# deb822 files (URIs:) and one-line ones (deb [opts] URL suite ...).
host_mirror() {
  {
    sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | tr ' ' '\n'
    sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\{0,1\}\([^[:space:]]*\).*/\2/p' \
      /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null
  } | sed -n "s#^\(.*\)/$1/\{0,1\}\$#\1#p" | head -n1 || true  # none found: empty
}
MIRROR=${DEBIAN_MIRROR:-$(host_mirror debian)}
[ -n "$MIRROR" ] || { echo "build-image.sh: no Debian mirror in /etc/apt/sources.list*; set DEBIAN_MIRROR" >&2; exit 1; }
SECURITY=${DEBIAN_SECURITY_MIRROR:-$(host_mirror debian-security)}
SECURITY=${SECURITY:-$MIRROR}
EXTRA=${VM_EXTRA_PACKAGES:-}
# Packages the scenarios need beyond the base system, one per line (part of the cache key).
PKG_LIST=$(dirname "$0")/image-packages.txt
if [ -r "$PKG_LIST" ]; then
  listed=$(sed 's/#.*//' "$PKG_LIST" | tr -s ' \n' '\n' | sed '/^$/d' | paste -sd, -)
  [ -n "$listed" ] && EXTRA=${EXTRA:+$EXTRA,}$listed
fi

t0=$(date +%s%N)
log() { local ms=$(( ($(date +%s%N) - t0) / 1000000 )); printf '[recipe %4d.%03ds] %s\n' $((ms/1000)) $((ms%1000)) "$*" >&2; }

[ "$(id -u)" = 0 ] || { echo "build-image.sh: must run as root" >&2; exit 1; }

# ---- 1. host tools -----------------------------------------------------------
# Under TCG, QEMU 10 runs the guests' fork+exec about 3x as fast as bookworm's 7.2, and every
# scenario is a shell script (docs/performance.md): a bookworm host takes it from backports.
qemu_major() { qemu-system-x86_64 --version 2>/dev/null | sed -n '1s/^QEMU emulator version \([0-9]*\)\..*/\1/p'; }
bpo=()
major=$(qemu_major || true)
if [ "${major:-0}" -lt 10 ] && grep -qx 'VERSION_CODENAME=bookworm' /etc/os-release; then
  bpo=(qemu-system-x86)
  echo "deb $MIRROR/debian bookworm-backports main" >/etc/apt/sources.list.d/gpuctl-vm-tests-backports.list
fi
need=()
[ -n "$major" ] || [ ${#bpo[@]} -gt 0 ] || need+=(qemu-system-x86)
command -v mmdebstrap          >/dev/null || need+=(mmdebstrap)
command -v mke2fs              >/dev/null || need+=(e2fsprogs)
command -v curl                >/dev/null || need+=(curl ca-certificates)
if [ ${#need[@]} -gt 0 ] || [ ${#bpo[@]} -gt 0 ]; then
  log "installing host packages: ${need[*]}${bpo[*]:+${need[*]:+ }${bpo[*]} (bookworm-backports; QEMU ${major:-none} here)}"
  # A mirror without backports leaves the host's own QEMU (or bookworm's): slower, not wrong.
  if ! apt-get update -qq && [ ${#bpo[@]} -gt 0 ]; then
    log "warning: no bookworm-backports at $MIRROR: the guests run on bookworm's QEMU, slower"
    rm -f /etc/apt/sources.list.d/gpuctl-vm-tests-backports.list
    bpo=()
    [ -n "$major" ] || need+=(qemu-system-x86)
    apt-get update -qq
  fi
  [ ${#need[@]} -eq 0 ] ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  [ ${#bpo[@]} -eq 0 ] ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t bookworm-backports \
      "${bpo[@]}" >/dev/null
  log "QEMU $(qemu_major)"
fi
[ $HOST_TOOLS_ONLY = 1 ] && exit 0

# ---- 2. root filesystem --------------------------------------------------------
mkdir -p "$OUT"
ROOT=$(mktemp -d "$OUT/rootdir.XXXXXX")
cleanup() {  # never follow a mount left behind by an interrupted mmdebstrap
  set +e
  findmnt -rno TARGET | grep -F "$ROOT/" | sort -r | xargs -r -n1 umount -l 2>/dev/null
  rm -rf --one-file-system "$ROOT" "$ROOT.wheels"
}
trap cleanup EXIT

# Python packages Debian does not have, from the Python package index, pinned (the wheel's path
# under PyPI's file host and its sha256): jupyterhub-systemdspawner 1.0.2 for the JupyterHub
# scenario. Pure-Python wheels, unpacked into the guest's /usr/local site-packages next to
# Debian's jupyterhub.
WHEELS="packages/6c/18/99cbc20baa19cc8256ed4fb3c9890d5a0427079fd750653c12ef6d7b27aa/jupyterhub_systemdspawner-1.0.2-py3-none-any.whl b99e78b555b82187a5ee28387d0ebc6ee4e0bdc83cb67f5272c71377cb54c2a4"
PYPI=${PYPI_FILES:-https://files.pythonhosted.org}
mkdir -p "$ROOT.wheels"
while read -r path sha; do
  [ -n "$path" ] || continue
  whl=${path##*/}
  log "fetching $whl"
  curl -fsSL --retry 3 -o "$ROOT.wheels/$whl" "$PYPI/$path" \
    || { echo "build-image.sh: cannot fetch $whl from $PYPI (set PYPI_FILES)" >&2; exit 1; }
  echo "$sha  $ROOT.wheels/$whl" | sha256sum -c --quiet - \
    || { echo "build-image.sh: $whl does not have the pinned sha256" >&2; exit 1; }
done <<<"$WHEELS"
export WHEEL_DIR=$ROOT.wheels

PKGS=systemd,systemd-sysv,dbus,udev,libpam-systemd,procps,iproute2,kmod,util-linux,bash,coreutils,tar,tiny-initramfs,linux-image-cloud-amd64
[ -n "$EXTRA" ] && PKGS="$PKGS,$EXTRA"

# The guest-side test runner: started by vmtest.service when the kernel
# command line contains vmtest=1. Input: a tar archive on the virtio disk with
# serial "vmtest-in" (must contain run.sh). Output: a tar archive written to
# the disk with serial "vmtest-out"; live output also goes to /dev/ttyS1.
read -r -d '' RUNNER <<'EOF' || true
#!/bin/bash
set -u
IN=/dev/disk/by-id/virtio-vmtest-in
OUT=/dev/disk/by-id/virtio-vmtest-out
R=/run/vmtest-results
mkdir -p /test "$R"
echo "runner_start_uptime $(cut -d' ' -f1 /proc/uptime)" > "$R/timing"
for i in $(seq 300); do [ -b "$IN" ] && [ -b "$OUT" ] && break; sleep 0.1; done
# live output goes to the 2nd serial port (host: RESULTS_DIR/output.log)
LIVE=/dev/ttyS1; stty -F "$LIVE" raw -echo 2>/dev/null || LIVE=/dev/null
if ! tar -xf "$IN" -C /test; then
  echo "vmtest: cannot unpack $IN" | tee "$LIVE"
  rc=125
else
  cd /test
  chmod +x run.sh 2>/dev/null || true
  echo "script_start_uptime $(cut -d' ' -f1 /proc/uptime)" >> "$R/timing"
  # run.sh may write extra files into $VMTEST_RESULTS; they come back to the host.
  VMTEST_RESULTS=$R/files; mkdir -p "$VMTEST_RESULTS"; export VMTEST_RESULTS
  set -o pipefail
  ./run.sh 2>&1 | tee "$R/output.log" > "$LIVE"
  rc=$?
  set +o pipefail
  echo "script_end_uptime $(cut -d' ' -f1 /proc/uptime)" >> "$R/timing"
fi
echo "$rc" > "$R/exit_code"
systemd-analyze time > "$R/systemd-analyze.txt" 2>&1 || true
journalctl -b --no-pager -o short-monotonic > "$R/journal.txt" 2>&1 || true
tar -cf "$OUT" -C "$R" . && sync && blockdev --flushbufs "$OUT"
echo "vmtest: done rc=$rc"
exit 0
EOF

read -r -d '' UNIT <<'EOF' || true
[Unit]
Description=vm-tests runner (/test/run.sh from virtio disk vmtest-in)
ConditionKernelCommandLine=vmtest=1
After=multi-user.target
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
# Type=exec: the boot transaction completes as soon as the runner is started,
# so "systemctl is-system-running --wait" works inside tests.
Type=exec
ExecStart=/usr/local/sbin/vmtest-runner
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
EOF

# Generators this guest has no use for (no encrypted, verity, integrity or GPT-auto disks, no
# hibernation, no offline updates, no rc.local, no systemd.run=/systemd.mask= on the kernel line).
# systemd runs every generator on each boot and each daemon-reload, and the scenarios reload
# often (docs/performance.md). Also masked: fstab (the root mount is the kernel line's) and getty
# (the serial console's getty, which vm-tests/try logs in through, is enabled below). Kept: sysv
# (slapd's and nslcd's init scripts) and gpuctl's own.
# podman.service and podman-auto-update.service come enabled (default.target.wants); at boot
# the auto-update run took 10.7 s of CPU under TCG, for containers no scenario has.
MASK_GENERATORS="systemd-cryptsetup-generator systemd-debug-generator systemd-gpt-auto-generator
  systemd-hibernate-resume-generator systemd-integritysetup-generator systemd-rc-local-generator
  systemd-run-generator systemd-system-update-generator systemd-veritysetup-generator
  systemd-fstab-generator systemd-getty-generator"
export RUNNER UNIT MASK_GENERATORS
HOOKS=()
[ -n "${VM_CUSTOMIZE:-}" ] && HOOKS+=(--customize-hook="$VM_CUSTOMIZE")
log "mmdebstrap $SUITE -> $ROOT"
mmdebstrap --mode=root --variant=minbase --include="$PKGS" \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --essential-hook='mkdir -p "$1/etc/tiny-initramfs"; printf "MICROCODE=no\nAUTO_MODULES=no\nINCLUDE_MODULES=\"virtio_pci,virtio_blk\"\n" > "$1/etc/tiny-initramfs/tiny-initramfs.conf"' \
  --customize-hook='echo vmtest > "$1/etc/hostname"; printf "127.0.0.1 localhost\n127.0.1.1 vmtest\n" > "$1/etc/hosts"' \
  --customize-hook='printf "/dev/vda / ext4 rw,noatime 0 0\n" > "$1/etc/fstab"' \
  --customize-hook='chroot "$1" passwd --delete root >/dev/null' \
  --customize-hook='printf "%s\n" "$RUNNER" > "$1/usr/local/sbin/vmtest-runner"; chmod 755 "$1/usr/local/sbin/vmtest-runner"' \
  --customize-hook='printf "%s\n" "$UNIT" > "$1/etc/systemd/system/vmtest.service"; chroot "$1" systemctl enable vmtest.service' \
  --customize-hook='rm -f "$1/etc/dpkg/dpkg.cfg.d/99mmdebstrap" "$1/var/lib/man-db/auto-update"' \
  --customize-hook='chroot "$1" systemctl mask apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer e2scrub_reap.service systemd-pstore.service getty@tty1.service' \
  --customize-hook='for u in jupyterhub prometheus prometheus-alertmanager prometheus-node-exporter slapd nslcd podman podman-restart podman-auto-update podman-auto-update.timer podman-clean-transient slurmctld slurmd munge docker docker.socket containerd apparmor; do chroot "$1" systemctl disable "$u" >/dev/null 2>&1 || true; done' \
  --customize-hook='site=$(chroot "$1" python3 -c "import sysconfig; print(sysconfig.get_path(\"purelib\"))") && mkdir -p "$1$site" && for w in "$WHEEL_DIR"/*.whl; do cp "$w" "$1/tmp/w.whl" && chroot "$1" python3 -m zipfile -e /tmp/w.whl "$site/" && rm "$1/tmp/w.whl" || exit 1; done' \
  --customize-hook='mkdir -p "$1/etc/systemd/system-generators"; for g in $MASK_GENERATORS; do ln -sf /dev/null "$1/etc/systemd/system-generators/$g"; done' \
  --customize-hook='chroot "$1" systemctl enable serial-getty@ttyS0.service >/dev/null 2>&1' \
  --customize-hook='cp -L "$1/vmlinuz" "'"$OUT"'/vmlinuz"; cp -L "$1/initrd.img" "'"$OUT"'/initrd.img"; chmod 644 "'"$OUT"'/initrd.img"' \
  --customize-hook='chroot "$1" dpkg-query -W -f="\${Package} \${Version}\n" systemd linux-image-cloud-amd64 dbus udev > "'"$OUT"'/build-info.txt"; readlink "$1/vmlinuz" >> "'"$OUT"'/build-info.txt"' \
  "${HOOKS[@]}" \
  "$SUITE" "$ROOT" \
  "deb $MIRROR/debian $SUITE main" \
  "deb $MIRROR/debian $SUITE-updates main" \
  "deb $SECURITY/debian-security $SUITE-security main" >"$OUT/mmdebstrap.log" 2>&1 \
  || { tail -30 "$OUT/mmdebstrap.log" >&2; exit 1; }

# mmdebstrap empties /etc/machine-id at cleanup; give the image a fixed one so
# boots are not "first boot" (ConditionFirstBoot units, systemd-firstboot).
tr -d - < /proc/sys/kernel/random/uuid > "$ROOT/etc/machine-id"

# ---- 3. ext4 image -----------------------------------------------------------
log "mke2fs -d ($(du -sh "$ROOT" | cut -f1) of files) -> $OUT/rootfs.img ($SIZE sparse)"
rm -f "$OUT/rootfs.img"
mke2fs -q -t ext4 -L vmroot -E root_owner=0:0 -d "$ROOT" "$OUT/rootfs.img" "$SIZE"
log "done: $(du -h --apparent-size "$OUT/rootfs.img" | cut -f1) apparent, $(du -h "$OUT/rootfs.img" | cut -f1) on disk"
cat "$OUT/build-info.txt" >&2

#!/bin/bash
# run-vm.sh - boot the image built by build-image.sh (systemd PID 1, cgroup v2 only),
# run a test script inside the guest as a systemd service, collect the results,
# power off, and exit with the guest script's exit code.
#
# Usage: run-vm.sh [options] SCRIPT [FILE|DIR ...]
#   SCRIPT          executable run in the guest as /test/run.sh (cwd /test, as root,
#                   in vmtest.service, after multi-user.target is reached)
#   FILE|DIR ...    extra files copied into /test in the guest (e.g. binaries)
# Options:
#   -i DIR   image dir from build-image.sh (default: /var/tmp/vm-image, or $VM_IMAGE_DIR)
#   -o DIR   results dir (default: ./vm-results); gets output.log console.log
#            exit_code timing journal.txt systemd-analyze.txt files/
#   -t SECS  wall-clock timeout for the whole VM run (default 600)
#   -m MiB   guest memory (default 2048)      -c N   guest vCPUs (default 2)
#   -a MODE  accelerator: auto|kvm|tcg (default auto; see below)
#   -q       do not stream the guest output to stdout while it runs
#   -s       interactive: boot without running a test, serial console on stdio
#            (log in as root, empty password; Ctrl-a x quits qemu)
#   -S       interactive with SCRIPT: run it as usual (its output streams here), and the serial
#            console on stdio too (vm-tests/try); no time limit unless -t is given
# Env: VM_APPEND (extra kernel args), VM_QEMU_ARGS (extra qemu args, word-split),
#      VM_CPU (qemu -cpu for kvm; VM_TCG_CPU for tcg, default max), VM_KERNEL /
#      VM_INITRD (override kernel/initrd, e.g. a PVM guest kernel), VM_OUT_SIZE
#      (size of the results disk, default 256M; results larger than that are lost).
# Exit code: the guest script's exit code; 124 = timeout; 125 = VM/infra failure.
#
# In the guest, the script can put extra files into $VMTEST_RESULTS; they land
# in RESULTS_DIR/files/. Guest stdout+stderr streams live to RESULTS_DIR/output.log.
#
# Accelerator "auto": KVM only when /dev/kvm is usable and backed by hardware
# virtualization (kvm_intel / kvm_amd). On hosts whose /dev/kvm is PVM
# (kvm_pvm module, e.g. Firecracker sandboxes with nested_pvm=1), a stock Debian
# kernel hangs right after "Probing EDD", so auto falls back to TCG there.
set -uo pipefail

IMG=${VM_IMAGE_DIR:-/var/tmp/vm-image}
RES=./vm-results
TIMEOUT=600 MEM=2048 CPUS=2 ACCEL=auto STREAM=1 SHELL_MODE=0 CONSOLE=0 TIMEOUT_SET=0
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 125; }
while getopts i:o:t:m:c:a:qsSh opt; do
  case $opt in
    i) IMG=$OPTARG ;; o) RES=$OPTARG ;; t) TIMEOUT=$OPTARG; TIMEOUT_SET=1 ;; m) MEM=$OPTARG ;;
    c) CPUS=$OPTARG ;; a) ACCEL=$OPTARG ;; q) STREAM=0 ;; s) SHELL_MODE=1 ;; S) CONSOLE=1 ;; *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $SHELL_MODE = 1 ] || [ $# -ge 1 ] || usage
KERNEL=${VM_KERNEL:-$IMG/vmlinuz}
INITRD=${VM_INITRD:-$IMG/initrd.img}
for f in "$KERNEL" "$INITRD" "$IMG/rootfs.img"; do
  [ -r "$f" ] || { echo "run-vm: missing $f (run build-image.sh first)" >&2; exit 125; }
done
command -v qemu-system-x86_64 >/dev/null || { echo "run-vm: qemu-system-x86_64 not installed" >&2; exit 125; }

# ---- accelerator ---------------------------------------------------------------
kvm_hw() { [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; }
if [ "$ACCEL" = auto ]; then if kvm_hw; then ACCEL=kvm; else ACCEL=tcg; fi; fi
# shellcheck disable=SC2054 # qemu option values contain commas
case $ACCEL in
  kvm) # -arch-capabilities: PVM-backed /dev/kvm rejects MSR 0x10a that -cpu host sets
       if [ -d /sys/module/kvm_pvm ]; then CPU=${VM_CPU:-host,-arch-capabilities}; else CPU=${VM_CPU:-host}; fi
       ACCEL_ARGS=(-accel kvm -cpu "$CPU") ;;
  tcg) ACCEL_ARGS=(-accel tcg,thread=multi -cpu "${VM_TCG_CPU:-max}") ;;
  *) echo "run-vm: bad -a $ACCEL" >&2; exit 125 ;;
esac

APPEND="console=ttyS0 root=/dev/vda rw quiet panic=-1 systemd.unified_cgroup_hierarchy=1 systemd.firstboot=off fsck.mode=skip ${VM_APPEND:-}"
# shellcheck disable=SC2054 # qemu option values contain commas
BASE=(qemu-system-x86_64 "${ACCEL_ARGS[@]}" -smp "$CPUS" -m "$MEM" -nodefaults -no-reboot
      -display none -monitor none -kernel "$KERNEL" -initrd "$INITRD"
      # root first so it is /dev/vda; snapshot=on: the image itself is never modified
      -drive "file=$IMG/rootfs.img,format=raw,if=none,id=root,snapshot=on"
      -device virtio-blk-pci,drive=root,serial=vmtest-root)
# shellcheck disable=SC2206
[ -n "${VM_QEMU_ARGS:-}" ] && BASE+=(${VM_QEMU_ARGS})

if [ $SHELL_MODE = 1 ]; then
  exec "${BASE[@]}" -append "$APPEND" -nographic -serial mon:stdio
fi

# ---- test input: tar archive on a raw virtio disk -------------------------------
mkdir -p "$RES"; RES=$(cd "$RES" && pwd)
rm -rf "$RES"/{output.log,console.log,exit_code,timing,journal.txt,systemd-analyze.txt,files}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/run-vm.XXXXXX")
QPID=
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() { [ -n "$QPID" ] && kill "$QPID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir "$WORK/in"
install -m 755 "$1" "$WORK/in/run.sh"; shift
for extra in "$@"; do cp -a "$extra" "$WORK/in/"; done
tar -cf "$WORK/in.tar" -C "$WORK/in" .
truncate -s "${VM_OUT_SIZE:-256M}" "$WORK/out.img"   # sparse; guest writes a tar here
: > "$RES/output.log"

t0=$(date +%s%N)
# shellcheck disable=SC2054 # qemu option values contain commas
DISKS=(-drive "file=$WORK/in.tar,format=raw,if=none,id=in,readonly=on" -device virtio-blk-pci,drive=in,serial=vmtest-in
  -drive "file=$WORK/out.img,format=raw,if=none,id=out" -device virtio-blk-pci,drive=out,serial=vmtest-out)
if [ $CONSOLE = 1 ]; then
  # The person's terminal is the serial console (ttyS0: the kernel, then a login prompt); the
  # script's output (ttyS1) streams to it as well. qemu stops when the guest powers off.
  [ $TIMEOUT_SET = 1 ] || TIMEOUT=0
  tail -n +1 -F "$RES/output.log" 2>/dev/null &
  TPID=$!
  timeout -k 10 "$TIMEOUT" "${BASE[@]}" -append "$APPEND vmtest=1 vmtest.try=1" "${DISKS[@]}" \
    -nographic -serial mon:stdio -serial "file:$RES/output.log"
  qrc=$?
  kill $TPID 2>/dev/null
  exit $qrc
fi
timeout -k 10 "$TIMEOUT" "${BASE[@]}" -append "$APPEND vmtest=1" "${DISKS[@]}" \
  -serial "file:$RES/console.log" -serial "file:$RES/output.log" &
QPID=$!
[ $STREAM = 1 ] && tail -n +1 -F --pid=$QPID "$RES/output.log" 2>/dev/null &
TPID=$!
wait $QPID; qrc=$?; QPID=
[ $STREAM = 1 ] && wait $TPID 2>/dev/null
ms=$(( ($(date +%s%N) - t0) / 1000000 ))

rc=125
if tar -xf "$WORK/out.img" -C "$RES" 2>/dev/null && [ -s "$RES/exit_code" ]; then
  rc=$(cat "$RES/exit_code")
elif [ $qrc = 124 ] || [ $qrc = 137 ]; then
  rc=124; echo "run-vm: TIMEOUT after ${TIMEOUT}s (qemu killed); last console lines:" >&2
  tail -n 20 "$RES/console.log" >&2
else
  echo "run-vm: no results from the guest (qemu rc=$qrc); last console lines:" >&2
  tail -n 40 "$RES/console.log" >&2
fi
echo "qemu_wall_ms $ms accel $ACCEL" >> "$RES/timing"
printf 'run-vm: accel=%s exit=%s wall=%d.%03ds results=%s\n' "$ACCEL" "$rc" $((ms/1000)) $((ms%1000)) "$RES" >&2
exit "$rc"

#!/bin/bash
# 61: an interactive `gpuctl shell` under a pty (script(1)): alice gets her login shell's prompt
# inside a scope in gpu-infer.slice with the team's environment, `exit 7` leaves it with status
# 7, and the scope is gone afterwards.
# vmtest: timeout=300
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
shell_setup

# Typed slowly into the pty, as a person would: bash reads the pty line by line.
typein() {
    sleep 3
    printf 'echo "CG=$(cat /proc/self/cgroup)"\n'
    sleep 1
    printf 'echo "CVD=$CUDA_VISIBLE_DEVICES TEAM=$GPUCTL_TEAM SCOPE=$GPUCTL_SCOPE"\n'
    sleep 1
    printf 'exit 7\n'
    sleep 2
}
typein | su - alice -c "CUDA_VISIBLE_DEVICES=evil script -qefc 'gpuctl shell --team infer' /dev/null" >/tmp/pty.log 2>&1
rc=$?
tr -d '\r' </tmp/pty.log | sed 's/\x1b\[[0-9;?]*[a-zA-Z]//g' >/tmp/pty.txt
sed 's/^/    pty| /' /tmp/pty.txt | head -n 20
cp /tmp/pty.txt "$VMTEST_RESULTS/pty.txt"
check "the shell showed alice's prompt" grep -q 'alice@.*\$' /tmp/pty.txt
check "the shell runs in a scope in gpu-infer.slice" \
    grep -Eq '^CG=0::/gpu.slice/gpu-infer.slice/gpuctl-run-[0-9a-f]{16}.scope' /tmp/pty.txt
check "with the team's environment, not the inherited one" grep -q "^CVD=$(gpu_uuid 0) TEAM=infer SCOPE=gpuctl-run-" /tmp/pty.txt
check "the banner names the team and scope" grep -Eq '^gpuctl: team infer \(gpuctl-run-[0-9a-f]{16}.scope' /tmp/pty.txt
check "exit 7 leaves the shell with status 7" test $rc = 7
for i in $(seq 50); do [ -z "$(systemctl list-units --all --plain --no-legend 'gpuctl-run-*')" ] && break; sleep 0.2; done
check_empty "the scope is gone after the shell exited" systemctl list-units --all --plain --no-legend 'gpuctl-run-*'
check "gpuctld is still active" systemctl is-active --quiet gpuctld.service
finish

#!/bin/bash
# 73: one process of a member's `gpuctl run` killed by the OOM killer (team MemoryMax) does not
# end the member's scope: the shell that started it goes on, as in a login session.
# vmtest: group=own
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

shell_setup
# infer's slice has MemoryMax=256M; `tail` keeps a newline-free 600M line in memory.
out=$(as alice "gpuctl run --team infer -- bash -c 'head -c 600M /dev/zero | tail >/dev/null; echo \"hog exit \$?\"; sleep 2; echo shell-alive; cat /proc/self/cgroup'" 2>&1); rc=$?
echo "$out"
check "the hog was OOM-killed (exit 137)" grep -q 'hog exit 137' <<<"$out"
check "the shell went on after the kill" grep -q 'shell-alive' <<<"$out"
check "gpuctl run returned the shell's own status (0)" test $rc = 0
echo "oom_kill in gpu-infer.slice: $(grep oom_kill /sys/fs/cgroup/gpu.slice/gpu-infer.slice/memory.events)"
j=$(gpuctld_journal)
grep -i 'OOMPolicy\|abandon' <<<"$j" | head -3
check_not "systemd did not fail the scope with oom-kill" sh -c "journalctl -o cat --since @${VMTEST_SCENARIO_START:-0} | grep -E 'gpuctl-run-[0-9a-f]+.scope.*Failed with result .oom-kill.'"
finish

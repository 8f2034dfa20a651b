#!/bin/bash
# 75: one writer. gpuctld holds /run/gpuctl/apply.lock while it applies (the file names it);
# `gpuctl apply --local` while another writer holds the lock waits, then fails naming the holder,
# and gpuctld waits for `apply --local` the same way.
# vmtest: group=own
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
[[gpu]]
index = [0]
owner = "infer"
P
gpuctld_start
check "gpuctld converged" wait_converged 20
main=$(systemctl show -P MainPID gpuctld.service)
check_output "the lock file names gpuctld as its last holder" grep -x "pid $main (gpuctld)" /run/gpuctl/apply.lock

# Another writer holds the lock (as gpuctld does during an apply): apply --local waits, then
# gives up naming it.
( exec 9<>/run/gpuctl/apply.lock; flock -x 9; echo "pid $BASHPID (vmtest holder)" >/run/gpuctl/apply.lock; sleep 8 ) &
holder=$!
sleep 1
out=$(gpuctl apply --local --lock-wait 2 2>&1); rc=$?
echo "apply --local: rc=$rc: $out"
check "apply --local gave up (non-zero)" test $rc != 0
check "it said it waits, naming the holder" grep -q 'waiting for the apply lock: held by pid .* (vmtest holder)' <<<"$out"
check "and that another apply is running" grep -q 'another apply is running' <<<"$out"
# gpuctld meanwhile waits too, and applies once the holder lets go.
t=$(date +%s%6N)
systemctl reload gpuctld.service
sleep 1
check_output "gpuctld logs that it waits for the holder" sh -c "journalctl -u gpuctld.service -o cat --since @${VMTEST_SCENARIO_START:-0} | grep -m1 'waiting for the apply lock held by'"
wait "$holder"
wait_for 30 _reconciled_since "$t"
echo "gpuctld: $(status_text)"
check "after the holder ended, gpuctld converged" status_converged
out=$(gpuctl apply --local --lock-wait 30 2>&1); rc=$?
echo "apply --local (free lock): rc=$rc: $(tail -3 <<<"$out")"
check "apply --local with a free lock runs" test $rc = 0
finish

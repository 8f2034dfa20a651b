#!/bin/bash
# 71: a stopped MPS daemon of a team is started again at once (ActiveState watch), logged.
# vmtest: group=own
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
[teams.infer.mps]
active-thread-percentage = 40
[[gpu]]
index = [0]
owner = "infer"
P
gpuctld_start
wait_for 20 sh -c 'systemctl list-units --plain --no-legend "gpuctl-mps@infer-*.service" | grep -q running'
u=$(systemctl list-units --plain --no-legend 'gpuctl-mps@infer-*.service' | awk '{print $1}')
echo "MPS unit: $u"
check "MPS unit active" systemctl is-active -q "$u"
t0=$(date +%s%6N)
systemctl stop "$u"
check "MPS unit started again within 5 s" wait_for 5 systemctl is-active -q "$u"
t1=$(date +%s%6N)
echo "BENCH drift repair (stopped MPS unit): $(((t1 - t0) / 1000)) ms (one sample)"
check_output "the restart is logged with why" sh -c "journalctl -u gpuctld.service -o cat --since @${VMTEST_SCENARIO_START:-0} | grep -m1 'drift: $u is'"
finish

#!/bin/bash
# 82 (issue #18): systemd-analyze security scores of gpuctld and of an MPS unit, with a threshold;
# an MPS daemon of a team that is one @group runs as gpuctl-mps with the team's group, its pipe
# directory 0750, its env file and the team's env file 0640.
# vmtest: group=own
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
gpuctld_setup
test_users
put_policy 10-mps.toml <<'P'
version = 1
[teams.infer]
members = ["@ml-infer"]
[teams.infer.mps]
active-thread-percentage = 50
[[gpu]]
index = [0]
owner = "infer"
P
gpuctld_start
wait_for 30 sh -c 'systemctl list-units --plain --no-legend --state=active "gpuctl-mps@infer-*" | grep -q .'
u=$(systemctl list-units --plain --no-legend 'gpuctl-mps@infer-*.service' | awk '{print $1}')
inst=${u#gpuctl-mps@}
inst=${inst%.service}
score() { systemd-analyze security "$1" 2>/dev/null | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p'; }
g=$(score gpuctld.service)
m=$(score "$u")
echo "BENCH harden-security-gpuctld $g (threshold 3.5; 3.2 before #18)"
echo "BENCH harden-security-mps $m (threshold 2.5; 8.9 before #18)"
check "gpuctld scores <= 3.5" awk -v s="$g" 'BEGIN { exit !(s != "" && s <= 3.5) }'
check "the MPS unit scores <= 2.5" awk -v s="$m" 'BEGIN { exit !(s != "" && s <= 2.5) }'
check "MPS daemon runs as gpuctl-mps" test "$(ps -o user= -p "$(systemctl show -P MainPID "$u")")" = gpuctl-mps
st=$(stat -c '%a %U %G' "/run/gpuctl/mps/$inst"); echo "pipe dir: $st"
check "pipe dir 0750 gpuctl-mps:ml-infer" test "$st" = "750 gpuctl-mps ml-infer"
st=$(stat -c '%a %U %G' "/run/gpuctl/mps/$inst.env"); echo "MPS env file: $st"
check "MPS env file 0640" test "${st%% *}" = 640
st=$(stat -c '%a %U %G' /run/gpuctl/teams/infer.env); echo "team env file: $st"
check "team env file 0640" test "${st%% *}" = 640
check "alice (ml-infer) reaches the pipe dir" as alice "test -x /run/gpuctl/mps/$inst"
check_not "bob does not" as bob "test -x /run/gpuctl/mps/$inst"
out=$(as alice 'gpuctl env --team infer' 2>&1)
check "alice still gets the team env through the bus" grep -q CUDA_VISIBLE_DEVICES <<<"$out"
finish

#!/bin/bash
# 55: MPS units per team with the fake control daemon: they run in the team's slice and receive
# the thread percentage and pinned memory limit; a settings change restarts them; a team losing
# MPS stops its daemon with `quit`.
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
memory-max = "256M"
[teams.infer.mps]
active-thread-percentage = 40
pinned-memory-limit = "1G"
[teams.train]
[[gpu]]
index = [0, 1]
owner = "infer"
[[gpu]]
index = [2]
owner = "train"
P
gpuctld_start
# The instance name is gpuctld's (<team>-<share>): take it from systemd.
u=$(systemctl list-units --plain --no-legend 'gpuctl-mps@infer-*.service' | awk '{print $1}')
inst=${u#gpuctl-mps@}
inst=${inst%.service}
echo "MPS unit of team infer: $u"
check "exactly one MPS unit for infer" test "$(wc -w <<<"$u")" = 1
systemctl status --no-pager "$u" | head -12
check "MPS unit active" systemctl is-active -q "$u"
cg=$(systemctl show -P ControlGroup "$u"); echo "cgroup: $cg"
check "MPS daemon under the team's slice" grep -Eq "^/gpu.slice/gpu-infer.slice/(.*/)?$u\$" <<<"$cg"
log=/var/log/gpuctl/mps/$inst/control.log
echo "--- $log"; cat "$log"
check "daemon saw CUDA_VISIBLE_DEVICES with the UUIDs of GPUs 0,1" grep -q "CUDA_VISIBLE_DEVICES=$(gpu_uuid 0),$(gpu_uuid 1)" "$log"
check "thread percentage sent" grep -q 'cmd set_default_active_thread_percentage 40 -> ok' "$log"
check "pinned limit sent per device" sh -c "grep -q 'cmd set_default_device_pinned_mem_limit 0 1024M -> ok' $log && grep -q 'cmd set_default_device_pinned_mem_limit 1 1024M -> ok' $log"
# shellcheck disable=SC2046 # KEY=VALUE words for env
q=$(echo get_default_active_thread_percentage | env $(grep -v '^#' "/run/gpuctl/mps/$inst.env" | xargs) nvidia-cuda-mps-control)
check "client query through the pipe dir answers 40.0" test "$q" = 40.0
check_empty "no MPS for train" systemctl list-units --plain --no-legend --state=active 'gpuctl-mps@train-*'
pipe=$(sed -n 's/^CUDA_MPS_PIPE_DIRECTORY=//p' "/run/gpuctl/mps/$inst.env")
check_output "team env points at the MPS daemon's pipe directory ($pipe)" grep -x "CUDA_MPS_PIPE_DIRECTORY=$pipe" /run/gpuctl/teams/infer.env
sed -i 's/active-thread-percentage = 40/active-thread-percentage = 60/' /etc/gpuctl/policy.d/10-teams.toml
reload_wait
check "restarted with 60" sh -c "grep -q 'cmd set_default_active_thread_percentage 60 -> ok' $log"
check "old daemon got quit on restart" sh -c "grep -q 'cmd quit -> ok' $log"
check "unit active after change" systemctl is-active -q "$u"
# A crash of the daemon: Restart=on-failure brings it back and ExecStartPost resends limits.
n=$(grep -c 'set_default_active_thread_percentage 60' "$log")
systemctl kill -s KILL "$u"
# A deadline, not a fixed sleep: RestartSec=2s, then the sandboxed start and ExecStartPost's
# wait for the control pipe took 4.3 s under TCG (vm-tests 55 after #18).
check "restarted after crash" wait_for 30 systemctl is-active -q "$u"
check "limits resent after crash" test "$(grep -c 'set_default_active_thread_percentage 60' "$log")" -gt "$n"
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
[[gpu]]
index = [0, 1]
owner = "infer"
P
reload_wait
check_not "MPS stopped when the policy drops it" systemctl is-active -q "$u"
tail -3 "$log"
finish

#!/bin/bash
# 74: under reconfigure = "drain", a job started from a login session (a session-*.scope) on a GPU
# that must change is never stopped: the change waits and says why, naming the session.
# vmtest: group=own
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup
put_policy 10-teams.toml <<'P'
version = 1
[host]
reconfigure = "drain"
drain-timeout = "10s"
[teams.infer]
[[gpu]]
index = [0]
owner = "infer"
P
gpuctld_start
check "gpuctld converged" wait_converged 20
# A login session's job: a scope named like logind's, in user.slice.
systemd-run -q --scope --unit=session-970.scope --slice=user-1000.slice sleep 600 &
wait_for 10 systemctl is-active -q session-970.scope
pid=$(systemctl show -P ControlGroup session-970.scope | xargs -I{} cat /sys/fs/cgroup{}/cgroup.procs | head -1)
echo "login job: pid $pid in $(cat /proc/"$pid"/cgroup)"
jq ".processes += [{\"pid\": $pid, \"gpu\": 0, \"used_memory_mib\": 100}]" "$FAKE_NVML_STATE" >"$FAKE_NVML_STATE.new" && mv "$FAKE_NVML_STATE.new" "$FAKE_NVML_STATE"
# GPU 0 goes MIG: the whole GPU must be idle first.
put_policy 10-teams.toml <<'P'
version = 1
[host]
reconfigure = "drain"
drain-timeout = "10s"
[teams.infer]
[[gpu]]
index = [0]
mig = [{ profile = "3g.40gb", owner = "infer", count = 2 }]
P
reload_wait
echo "gpuctld: $(status_text)"
check "the login session is not stopped" systemctl is-active -q session-970.scope
check "its job still runs" kill -0 "$pid"
check_output "the change waits, naming the session" sh -c "systemctl show -P StatusText gpuctld.service | grep 'session-970.scope'"
check_output "and saying why drain does not touch it" sh -c "journalctl -u gpuctld.service -o cat --since @${VMTEST_SCENARIO_START:-0} | grep -m1 'never a login session'"
systemctl stop session-970.scope
finish

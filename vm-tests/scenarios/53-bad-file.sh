#!/bin/bash
# 53: a bad file leaves the last good state; StatusText, the journal and Status name file, line
# and key; SIGHUP reconciles; fixing the file converges. Root-only D-Bus methods refuse others.
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup
put_policy 10-teams.toml <<'P'
version = 1
[teams.infer]
memory-max = "256M"
[[gpu]]
index = [0]
owner = "infer"
P
gpuctld_start
check "converged (1 team, 1 GPU)" wait_converged 20 1 1
cat > /etc/gpuctl/policy.d/20-x.toml <<'P'
version = 1

[teams.x]
memory-max = "lots"
P
reload_wait   # SIGHUP
st=$(status_text); echo "StatusText: $st"
# The error points at the bad value: line 4, column 14 (memory-max = "lots"), and its key.
check "StatusText names file:line and key" grep -q "policy error in /etc/gpuctl/policy.d/20-x.toml:4:14: teams.x.memory-max: 'lots' is not a size" <<<"$st"
check "StatusText is a policy error" is_policy_error "$st"
check "StatusText says last good in force" grep -q 'last good policy in force' <<<"$st"
check "slice untouched" test "$(systemctl show -P MemoryMax gpu-infer.slice)" = 268435456
check "no slice for the bad team" sh -c "! systemctl is-active -q gpu-x.slice"
check "journal has the error" grep -q 'policy error: /etc/gpuctl/policy.d/20-x.toml:4:14: teams.x.memory-max' <(gpuctld_journal)
js=$(busctl call --json=short org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Status)
echo "Status: $js" | cut -c1-600
check "Status JSON has policy_error" grep -q 'policy_error.*20-x.toml:4:14' <<<"$js"
check "Status JSON says last-good" grep -q 'last-good' <<<"$js"
check "StatusText property" sh -c "busctl get-property org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 StatusText | grep -q 'policy error'"
out=$(setpriv --reuid=65534 --regid=65534 --clear-groups busctl call org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Reload 2>&1); echo "nobody Reload: $out"
check "non-root Reload refused" grep -qi 'root only\|denied' <<<"$out"
out=$(setpriv --reuid=65534 --regid=65534 --clear-groups busctl call org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Status 2>&1)
check "non-root Status allowed" grep -q '^s ' <<<"$out"
# Restart with the bad file still there: the on-disk last good policy is used.
systemctl restart gpuctld.service
check "after restart: last good from disk" sh -c "systemctl show -P StatusText gpuctld.service | grep -q ' — last good policy in force$'"
check "after restart: slice still 256M" test "$(systemctl show -P MemoryMax gpu-infer.slice)" = 268435456
# Fix the file: inotify converges it.
put_policy 20-x.toml <<'P'
version = 1
[teams.x]
memory-max = "128M"
P
check "fixed file converges (2 teams, 1 GPU)" wait_converged 20 2 1
echo "StatusText: $(status_text)"
check "gpu-x.slice now 128M" test "$(systemctl show -P MemoryMax gpu-x.slice)" = 134217728
out=$(busctl call --json=short org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 Reload 2>&1); echo "root Reload: $out" | cut -c1-300
# The reply is a ReportReply whose key "converged" is there either way: read its value.
check "root Reload allowed, and reports converged" test "$(jq -r '.data[0] | fromjson | .converged' <<<"$out")" = true
finish

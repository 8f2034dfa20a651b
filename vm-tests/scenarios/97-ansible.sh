#!/bin/bash
# 97: the Ansible role (contrib/ansible) with Debian's ansible-core, connection local. It installs
# the .deb and pushes a two-team policy (limits live) with an extra drop-in; a broken variable is
# caught by `gpuctl validate --as` before anything is installed (file, limits and gpuctld's status
# stay); a problem gpuctld reports (a drop-in naming a GPU the host lacks) fails the play's
# default verify; a changed limit goes live and the extra drop-in no longer listed is removed,
# one installed by hand stays; last, a run with nothing to do changes nothing (changed=0).
# Five plays, two of them a task or two: each task is a python start under TCG.
# BENCH: ansible-playbook start -> new MemoryMax live, against a no-op run of the same play.
# Under TCG each task is a python start: on a quiet host (release deb) the first run took 128 s,
# a no-op run 74 s; on a host loaded by compiles, each several times that.
# vmtest: timeout=1500
# vmtest: group=fleet
# vmtest: no-install
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

echo "ansible: $(ansible-playbook --version | head -n1)"
check "gpuctl is not installed before the play" sh -c '! dpkg-query -W gpuctl 2>/dev/null'
gpuctld_setup 2 # fake GPUs + fake NVML drop-in for the gpuctld the role installs
test_users

W=/tmp/ansible
mkdir -p "$W"
DEB=$(vm_deb)
cat >"$W/inventory" <<'EOF2'
localhost ansible_connection=local ansible_python_interpreter=/usr/bin/python3
EOF2
cat >"$W/play.yml" <<'EOF2'
- hosts: localhost
  gather_facts: false
  roles: [gpuctl]
EOF2
# vars MEM OWNER1: the inventory variables, as a site would keep them.
vars() {
    cat >"$W/vars.yml" <<EOF2
gpuctl_package_path: $DEB
gpuctl_teams:
  infer: {members: ["@ml-infer"], memory-max: "$1", tasks-max: 512}
  train: {members: ["@ml-train", "carol"], memory-max: "256M"}
gpuctl_gpus:
  - {index: [0], owner: infer}
  - {index: [1], owner: ${2:-train}}
EOF2
}
# Pipelining: one python per task instead of mkdir/put/chmod/exec/rm (each a process, slow
# under TCG). Each run's log is kept in the results as it goes.
export ANSIBLE_ROLES_PATH=$VMTEST_DIR/contrib/ansible/roles ANSIBLE_NOCOLOR=1 \
    ANSIBLE_LOCALHOST_WARNING=false ANSIBLE_INVENTORY_UNPARSED_WARNING=false \
    ANSIBLE_PIPELINING=1
n_play=0
play() { # [ansible-playbook options, e.g. --tags]
    n_play=$((n_play + 1))
    ansible-playbook -i "$W/inventory" -e "@$W/vars.yml" "$@" "$W/play.yml" >"$W/last.log" 2>&1
    local rc=$?
    cp "$W/last.log" "$VMTEST_RESULTS/play-$n_play.log"
    return $rc
}
recap() { grep -E '^localhost +:' "$W/last.log"; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
memmax() { systemctl show -P MemoryMax gpu-infer.slice; }
DEST=/etc/gpuctl/policy.d/50-ansible.toml

# extra: the extra drop-in a run lists, as gpuctl_extra_dropins
extra() {
    cat >>"$W/vars.yml" <<'EOF2'
gpuctl_extra_dropins:
  60-extra.toml: |
    version = 1
    [teams.extra]
    members = ["alice"]
EOF2
}

# 1. Install, first policy, an extra drop-in.
vars 256M
extra
t=$(date +%s%N); play; rc=$?; first_ms=$(ms_since "$t")
_vm_show "$(cat "$W/last.log")" 40
check "first run succeeds (${first_ms} ms)" test $rc = 0
check "the role installed the package" sh -c 'dpkg-query -W -f="\${db:Status-Status}" gpuctl | grep -qx installed'
check "the drop-in is in place" test -s $DEST
echo "--- $DEST:"; cat $DEST
check "gpuctld runs" systemctl is-active -q gpuctld.service
check "infer's MemoryMax is live (256M)" test "$(memmax)" = 268435456
check "train's slice exists with its limit" test "$(systemctl show -P MemoryMax gpu-train.slice)" = 268435456
check "gpuctl status is clean" gpuctl status
check "the extra drop-in is installed, marked as the role's" \
    grep -q "^# installed by the gpuctl Ansible role" /etc/gpuctl/policy.d/60-extra.toml
check "its team's slice exists" systemctl cat gpu-extra.slice

# 2. A broken variable (a typo in an owner) is caught before install. Only the role's policy
# tasks: the whole play fails at the same task (the package tasks before it change nothing, as
# the last step shows), and under TCG each task is a python start.
sum=$(sha256sum $DEST)
vars 256M trian
extra
play --tags gpuctl_policy; rc=$?
_vm_show "$(grep -E 'fatal|msg|error' "$W/last.log")" 10
check "the play fails on the broken variable" test $rc != 0
check "in-place validation names the unknown team" grep -q "gpu\[1\].owner: unknown team 'trian'" "$W/last.log"
check "the installed drop-in is unchanged" test "$(sha256sum $DEST)" = "$sum"
check "gpuctld still has the good policy (status clean)" gpuctl status
check "infer's limit is unchanged" test "$(memmax)" = 268435456

# 3. A problem gpuctld reports fails the play: a drop-in naming a GPU the host lacks (which
# validate --as, not knowing the GPUs, would pass). Only the verify task runs.
put_policy 70-ghost.toml <<<'version = 1
[[gpu]]
index = [7]
owner = "train"'
reload_wait
play --tags gpuctl_verify; rc=$?
_vm_show "$(grep -A3 'gpuctld reports no problem' "$W/last.log")" 8
check "the play fails on a GPU the host lacks, which gpuctld reports" test $rc != 0
check "... naming it" grep -q "gpu 7 does not exist" "$W/last.log"
rm -f /etc/gpuctl/policy.d/70-ghost.toml
reload_wait

# 4. A changed limit goes live (the BENCH line times it); the role owns what it installs: the
# list without step 1's extra drop-in removes it, and one installed by hand stays.
echo 'version = 1' >/etc/gpuctl/policy.d/61-hand.toml
vars 384M
t=$(date +%s%N)
play &
pid=$!
# shellcheck disable=SC2317 # called through wait_for
live() { test "$(memmax)" = 402653184; }
if wait_for 1200 live; then live_ms=$(ms_since "$t"); else live_ms=; fi
wait $pid; rc=$?; total_ms=$(ms_since "$t")
echo "changed run: $(recap)"
check "the changed run succeeds" test $rc = 0
check "infer's new MemoryMax (384M) is live" test -n "$live_ms"
check "the changed run reloaded gpuctld" grep -q 'systemctl reload gpuctld' "$W/last.log"
check "gpuctl status is clean after the change" gpuctl status
check "the drop-in no longer listed is removed" test ! -e /etc/gpuctl/policy.d/60-extra.toml
check "a drop-in the role did not install stays" test -e /etc/gpuctl/policy.d/61-hand.toml
check_output "gpuctld no longer has the extra team" sh -c '! gpuctl status --json | jq -e ".teams.extra" >/dev/null'

# 5. Idempotent: the whole play again changes nothing and reloads nothing, the package tasks and
# the removal of drop-ins no longer listed included. Last, so that one run shows it for all.
t=$(date +%s%N); play; rc=$?; noop_ms=$(ms_since "$t")
echo "no-op run: $(recap) (${noop_ms} ms)"
check "the same play again succeeds" test $rc = 0
check "... and reports changed=0" grep -Eq '^localhost +: ok=[0-9]+ +changed=0 +unreachable=0 +failed=0' <(recap)
check "no reload task ran" sh -c "! grep -q 'systemctl reload gpuctld' $W/last.log"
check "a drop-in the role did not install still stays" test -e /etc/gpuctl/policy.d/61-hand.toml
rm -f /etc/gpuctl/policy.d/61-hand.toml
if [ -n "$live_ms" ]; then
    echo "BENCH ansible: playbook start -> new MemoryMax live ${live_ms} ms; same play, no change: ${noop_ms} ms; ratio $(awk -v a="$live_ms" -v b="$noop_ms" 'BEGIN{printf "%.2f", a/b}') (changed run total ${total_ms} ms, first run with install ${first_ms} ms)"
fi

finish

#!/bin/bash
# 99: gpuctl on a one-node Slurm cluster (Debian's slurmctld, slurmd, munge; docs/slurm.md).
# gpuctld carves GPU 0 and keeps the GRES file and the node's Gres= current; a job asking for a
# team's MIG type gets exactly that device (its cap nodes open, a neighbour's are denied by
# Slurm's device constraint); a member of another team cannot use the team's partition, nor a
# member the other team's type in their own (the generated job_submit.lua); a
# layout change while a job runs drains the node, waits for the job, applies, rewrites the GRES
# file, restarts Slurm, resumes, and the next job sees the new types; `gpuctl top` names the job;
# a fatal XID drains the node until `gpuctl device resume`.
# vmtest: timeout=600
# vmtest: group=fleet
# The node lists are meant to split; job output is indented with sed.
# shellcheck disable=SC2016,SC2086,SC2001,SC2317
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

H=$(hostname -s)
# The guest has no network, only lo. Slurm resolves even "127.0.0.1" with getaddrinfo's
# AI_ADDRCONFIG, which glibc answers "Name or service not known" on a host whose only IPv4
# address is 127.0.0.1; a second loopback address is enough to count as configured.
ip addr add 127.0.0.2/8 dev lo 2>/dev/null || true
gpuctld_setup 2
test_users
layout() { # $1: infer's profile, $2: train's profile and count
    put_policy 50-gpus.toml <<P
version = 1
[teams.infer]
members = ["@ml-infer"]
[teams.train]
members = ["@ml-train"]
[[gpu]]
index = 0
mig = [{ profile = "$1", owner = "infer" }, { profile = "$2", owner = "train", count = $3 }]
P
}
layout 3g.40gb 1g.10gb 2
gpuctld_start
check "gpuctld converged (2 teams, 1 GPU in the policy)" wait_converged 60 2 1
echo "gpuctld: $(status_text)"

# The docs' setup: Slurm's config includes what gpuctld keeps; gpuctld may write there and
# reach slurmctld (its sandbox allows neither by default).
mkdir -p /etc/slurm/gres.d /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm
cat >/etc/slurm/slurm.conf <<EOF
ClusterName=vm
SlurmctldHost=$H(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
ReturnToService=2
SchedulerParameters=sched_interval=5
Include /etc/slurm/gres.d/node.conf
NodeName=$H NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$H AllowGroups=root Default=YES State=UP
PartitionName=infer Nodes=$H AllowGroups=ml-infer State=UP
PartitionName=train Nodes=$H AllowGroups=ml-train State=UP
EOF
printf 'Include /etc/slurm/gres.d/gpuctl.conf\n' >/etc/slurm/gres.conf
printf 'CgroupPlugin=cgroup/v2\nConstrainDevices=yes\n' >/etc/slurm/cgroup.conf
mkdir -p /etc/systemd/system/gpuctld.service.d
cat >/etc/systemd/system/gpuctld.service.d/60-slurm.conf <<'EOF'
[Service]
ReadWritePaths=-/etc/slurm/gres.d
RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_INET AF_INET6
EOF
# The two commands of docs/slurm.md: the files from the live layout (with the [slurm] keys
# already there, so the types carry the teams), then [slurm] on.
slurm_policy() {
    put_policy 60-slurm.toml <<P
version = 1
[slurm]
enabled = $1
node-name = "$H"
team-types = true
node-file = "/etc/slurm/gres.d/node.conf"
restart = ["slurmctld.service", "slurmd.service"]
P
}
slurm_policy false
gpuctl export slurm --node "$H" >/etc/slurm/gres.d/gpuctl.conf
gpuctl export slurm --node-file >/etc/slurm/gres.d/node.conf
sed 's/^/    gres| /' /etc/slurm/gres.d/gpuctl.conf /etc/slurm/gres.d/node.conf
[ -s /etc/munge/munge.key ] || mungekey -c
# Under TCG, slurmd's cgroup/v2 set-up can give up waiting for its stepd scope to show up after
# the D-Bus call ("Long time waiting for ..._slurmstepd.scope") and exit: it starts again, as a
# site's unit would be set to (the scope exists by then).
mkdir -p /etc/systemd/system/slurmd.service.d
printf '[Service]\nRestart=on-failure\nRestartSec=2\n' >/etc/systemd/system/slurmd.service.d/50-vmtest-restart.conf
systemctl daemon-reload
systemctl start munge slurmctld slurmd
slurm_policy true
systemctl daemon-reload
gpuctld_start
wait_for 90 sh -c "scontrol show node -o $H | grep -q 'State=IDLE '"
check_output "Slurm sees the node idle with gpuctl's types" sh -c "scontrol show node -o $H | grep -o 'Gres=[^ ]*\|State=[^ ]*'; scontrol show node -o $H | grep 'State=IDLE ' | grep 'infer_3g.40gb:1' | grep -q 'train_1g.10gb:2'"
[ "$VMTEST_CHECKS_FAILED" = 0 ] || { tail -n 30 /var/log/slurm/slurmd.log /var/log/slurm/slurmctld.log | sed 's/^/    log| /'; }

# Device fence: every node of the GPU, and which of them a job may open.
files_of() { grep "Type=$1 " /etc/slurm/gres.d/gpuctl.conf | head -n1 | sed 's/.*MultipleFiles=//' | tr , ' '; }
INFER=$(files_of infer_3g.40gb)
TRAIN_ALL=$(grep 'Type=train_1g.10gb ' /etc/slurm/gres.d/gpuctl.conf | sed 's/.*MultipleFiles=//' | tr , '\n' | grep caps | sort -u | xargs)
require_nonempty "infer's device files in gres.conf" "$INFER"
require_nonempty "train's MIG cap nodes in gres.conf" "$TRAIN_ALL"
cat >/usr/local/bin/vmprobe <<'EOF'
#!/bin/bash
for n in "$@"; do
    out=$(bash -c "exec 3<>$n" 2>&1)
    case $out in
        *"No such device or address"*) r=ENXIO ;; *"Operation not permitted"*) r=EPERM ;; "") r=OK ;; *) r="other: $out" ;;
    esac
    echo "node $n $r"
done
EOF
chmod 755 /usr/local/bin/vmprobe
out=$(timeout 120 srun -p debug --gres=gpu:infer_3g.40gb:1 /usr/local/bin/vmprobe $INFER $TRAIN_ALL 2>&1)
echo "$out" | sed 's/^/    job| /'
for n in $INFER; do
    check "a job with infer_3g.40gb opens $n (ENXIO: allowed, no driver)" grep -q "^node $n ENXIO" <<<"$out"
done
for n in $TRAIN_ALL; do
    check "the same job is denied train's $n (EPERM)" grep -q "^node $n EPERM" <<<"$out"
done
check_output "the job's CUDA_VISIBLE_DEVICES names one device" \
    sh -c "timeout 60 srun -p debug --gres=gpu:infer_3g.40gb:1 printenv CUDA_VISIBLE_DEVICES | grep -x '[0-9][0-9]*'"

# Teams: carol (ml-train) cannot use infer's partition; alice (ml-infer) can. This is Slurm's
# AllowGroups= as docs/slurm.md sets the partitions up (the half gpuctl relies on, not gpuctl's
# own): refused by slurmctld, for that reason, not timed out.
out=$(timeout 60 runuser -u carol -- srun -p infer --gres=gpu:infer_3g.40gb:1 true 2>&1)
rc=$?
echo "$out" | sed 's/^/    carol| /'
check "carol is refused in infer's partition (srun exit 1, got $rc)" test "$rc" = 1
check "... by the partition's AllowGroups=" grep -q "User's group not permitted to use this partition" <<<"$out"
check_output "alice runs in infer's partition" timeout 60 runuser -u alice -- srun -p infer --gres=gpu:infer_3g.40gb:1 id -un

# The generated job_submit.lua (docs/slurm.md): a team's GPU type only in the team's partition,
# which closes what AllowGroups= leaves open (a member of infer asking for train's type).
lua_plugin=$(find /usr/lib -name job_submit_lua.so 2>/dev/null | head -n1)
if [ -z "$lua_plugin" ]; then
    # Debian's slurmctld brings it (slurm-wlm-basic-plugins): its absence is a broken guest.
    fail "this Slurm has no job_submit_lua.so: the GPU type rule cannot be checked"
else
    gpuctl export slurm --job-submit >/etc/slurm/job_submit.lua
    echo "JobSubmitPlugins=lua" >>/etc/slurm/slurm.conf
    systemctl restart slurmctld
    wait_for 60 sh -c "scontrol show node -o $H | grep -q 'State=IDLE'"
    out=$(timeout 60 runuser -u alice -- srun -p infer --gres=gpu:train_1g.10gb:1 true 2>&1)
    rc=$?
    echo "$out" | sed 's/^/    lua| /'
    check "job_submit.lua: alice is refused train's type in infer's partition (rc $rc)" test "$rc" != 0
    check "... told which partition the type is for" grep -q "is team train's" <<<"$out"
    check_not "job_submit.lua: an untyped GPU request is refused" \
        timeout 60 runuser -u alice -- srun -p infer --gres=gpu:1 true
    check_output "job_submit.lua: alice still gets infer's type in infer's partition" \
        timeout 60 runuser -u alice -- srun -p infer --gres=gpu:infer_3g.40gb:1 id -un
fi

# gpuctl top names a Slurm job holding a MIG device.
J=$(sbatch --parsable -p debug -o /dev/null --gres=gpu:train_1g.10gb:1 --wrap 'echo $$ >/run/vmtest-job.pid; exec sleep 600')
wait_for 60 test -s /run/vmtest-job.pid
P_JOB=$(cat /run/vmtest-job.pid)
S=$FAKE_NVML_STATE
gi=$(jq -r '[.gpus[0].gpu_instances[] | select(.profile_id == 19)][0].id' "$S")
echo "job $J pid $P_JOB cgroup $(cat /proc/"$P_JOB"/cgroup); train's first 1g.10gb: gi$gi"
flock "$S.lock" sh -c "jq '.processes += [{pid: $P_JOB, gpu: 0, gi: $gi, ci: 0, used_memory_mib: 1000}]' '$S' >'$S.new' && mv '$S.new' '$S'"
j=$(gpuctl top --once --json 2>&1)
check_output "gpuctl top: the process is Slurm job $J, root's, no stray" \
    test "$(jq -c --argjson p "$P_JOB" '[.. | objects | select(has("pid") and .pid == $p)] | first | [.slurm_job, .user, .stray]' <<<"$j")" = "[$J,\"root\",false]"
check_output "gpuctl top (text) says slurm job $J" sh -c "gpuctl top --once | grep 'slurm job $J'"
flock "$S.lock" sh -c "jq '.processes = []' '$S' >'$S.new' && mv '$S.new' '$S'"

# A layout change while the job runs: drain, wait, apply, rewrite, resume.
gis_before=$(jq -c '[.gpus[0].gpu_instances[].profile_id] | sort' "$S")
layout 3g.40gb 3g.40gb 1
reload_wait
check_output "the node drains for the MIG change (gpuctl's reason)" sh -c "scontrol show node -o $H | grep -o 'State=[^ ]*\|Reason=.*' ; scontrol show node -o $H | grep -q 'State=[A-Z]*+DRAIN.*Reason=gpuctl: MIG change'"
check "while the job runs, the MIG layout is untouched" test "$(jq -c '[.gpus[0].gpu_instances[].profile_id] | sort' "$S")" = "$gis_before"
journal_says_drain() { gpuctld_journal | grep -i 'slurm node'; }
check_output "gpuctld's journal: the drain and the wait" journal_says_drain
scancel "$J"
wait_for 60 sh -c "scontrol show node -o $H | grep -q 'State=IDLE+DRAIN'"
reload_wait
wait_for 120 sh -c "scontrol show node -o $H | grep -q 'State=IDLE '"
check_output "after the job: the node is resumed" sh -c "scontrol show node -o $H | grep -o 'State=[^ ]*'; scontrol show node -o $H | grep -q 'State=IDLE '"
check "the new layout is applied" test "$(jq -c '[.gpus[0].gpu_instances[].profile_id] | sort' "$S")" = "[9,9]"
check_output "gres.conf names the new types" sh -c "cat /etc/slurm/gres.d/gpuctl.conf; grep -q 'Type=train_3g.40gb MultipleFiles' /etc/slurm/gres.d/gpuctl.conf && ! grep -q 1g.10gb /etc/slurm/gres.d/gpuctl.conf"
check_output "the next job gets the new type" timeout 120 srun -p debug --gres=gpu:train_3g.40gb:1 printenv CUDA_VISIBLE_DEVICES
check_not "the old type is gone" timeout 60 srun -p debug --immediate=20 --gres=gpu:train_1g.10gb:1 true

# A fatal XID on GPU 0 (docs/health.md): gpuctld takes it out of service and drains the node with
# its reason (Slurm cannot take one GRES device out of a running node); a resume brings it back.
fake_xid 0 79
node_state() { scontrol show node -o $H | grep -o 'State=[^ ]*\|Reason=.*'; }
check "a fatal XID on GPU 0 drains the node, naming the GPU" \
    wait_for 30 sh -c "scontrol show node -o $H | grep -q 'State=[A-Z]*+DRAIN.*Reason=gpuctl: GPU 0 out of service'"
node_state | sed 's/^/    node| /'
gpuctl device resume 0 --reason "reseated" | sed 's/^/    resume| /'
check "gpuctl device resume 0: gpuctld resumes the node" wait_for 30 sh -c "scontrol show node -o $H | grep -q 'State=IDLE '"
[ "$VMTEST_CHECKS_FAILED" = 0 ] || { gpuctld_journal | tail -n 40 | sed 's/^/    gpuctld| /'; tail -n 30 /var/log/slurm/slurmd.log /var/log/slurm/slurmctld.log | sed 's/^/    log| /'; }

systemctl stop slurmd slurmctld munge
rm -f /etc/systemd/system/gpuctld.service.d/60-slurm.conf /etc/systemd/system/slurmd.service.d/50-vmtest-restart.conf
finish

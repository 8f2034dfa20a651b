#!/bin/bash
# 66: placement (docs/shell.md, "Placement"). Three fake H100s: GPU 0 cut into four 1g.10gb
# instances for team interns, GPUs 1 and 2 whole for team train (MPS, daemon limit 8G). Four
# concurrent `gpuctl run --team interns` get four distinct MIG UUIDs, each opens exactly its own two
# cap nodes and gets EPERM on the neighbours'; a fifth exits 8 naming the holders; the leases
# survive a gpuctld restart and end with `kill -9` and an OOM kill; a `--wait` job starts within 1 s
# of a device freeing and says its place in the queue on a terminal; alice's ten queued requests do
# not hold back bob's one (and `gpuctl status` lists them so); `--gpus 2` is refused on the MIG
# share and gives two whole GPUs on train; `--gpu-memory 2G` on train's MPS devices puts the client
# limit in the job's environment and 20G (above the daemon's 8G) is refused; a placed job's
# GPUCTL_CDI_DEVICE names its device in the team's CDI spec; a `Slice=gpu-interns.slice` service
# whose ExecStart is `gpuctl run` gets one MIG device and a lease; a benchmark (BENCH line) of
# `gpuctl run` with and without placement against `systemd-run --scope`.
# vmtest: timeout=420
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup 3
test_users
put_policy 66-placement.toml <<'P'
version = 1
[teams.interns]
members = ["alice", "bob", "carol"]
memory-max = "256M"
[teams.interns.placement]
jobs-per-device = 1
[teams.train]
members = ["alice", "carol"]
[teams.train.mps]
pinned-memory-limit = "8G"
# Plain jobs see the whole share (the unplaced path of the CDI check and the benchmark); jobs
# that ask (--gpus, --gpu-memory) are still placed, without a cap.
[teams.train.placement]
jobs-per-device = 0
[[gpu]]
index = [0]
mig = [{ profile = "1g.10gb", owner = "interns", count = 4 }]
[[gpu]]
index = [1, 2]
owner = "train"
P
gpuctld_start
check "gpuctld converged (2 teams, 3 GPUs)" wait_converged 60 2 3
echo "gpuctld: $(status_text)"

d=$(mktemp -d)
chmod 777 "$d"
# no_lease REGEX: gpuctl status answered (its leases section is there) and lists no lease line
# matching REGEX: a status that failed (no output) is not "the lease ended".
# shellcheck disable=SC2317 # called through check and wait_for
no_lease() {
    local st
    st=$(gpuctl status 2>&1)
    grep -q '^leases:$' <<<"$st" && ! grep -q -- "$1" <<<"$st"
}
# A job that reports its device and which cap nodes its fence lets it open (read-only, as CUDA
# opens them): ENXIO is the fake node opened, EPERM the device filter; the config node (0400)
# fails its mode check first and counts as neither.
cat >"$d/job.sh" <<'J'
#!/bin/bash
out=$1
{
    echo "DEV=$CUDA_VISIBLE_DEVICES"
    for n in /dev/nvidia-caps/nvidia-cap*; do
        case $( (exec 3<"$n") 2>&1 ) in
            *"No such device or address"*) echo "OPEN $n" ;;
            *"Operation not permitted"*) echo "DENY $n" ;;
            *) echo "MODE $n" ;;
        esac
    done
} >"$out.tmp"
mv "$out.tmp" "$out"
exec sleep 300
J
chmod 755 "$d/job.sh"

users=(alice bob carol alice)
for i in 0 1 2 3; do
    su -s /bin/sh "${users[$i]}" -c "gpuctl run --team interns -- $d/job.sh $d/job$i" \
        >"$d/run$i.out" 2>&1 &
done
wait_for 60 sh -c "ls $d/job0 $d/job1 $d/job2 $d/job3" >/dev/null 2>&1
cat "$d"/job[0-3] | sed 's/^/    /'
devs=$(grep -h '^DEV=' "$d"/job[0-3] | sort -u)
check "four jobs on four distinct MIG devices" test "$(grep -c '^DEV=MIG-' <<<"$devs")" = 4
for i in 0 1 2 3; do
    check "job $i opens exactly two cap nodes (its GI and CI)" test "$(grep -c '^OPEN' "$d/job$i")" = 2
done
check "no cap node is open to two jobs" test "$(grep -h '^OPEN' "$d"/job[0-3] | sort | uniq -d | wc -l)" = 0
check "every job is denied its neighbours' cap nodes" test "$(cat "$d"/job[0-3] | grep -c '^DENY')" -ge 24

rc=0
out=$(su -s /bin/sh carol -c "gpuctl run --team interns -- true" 2>&1) || rc=$?
echo "    fifth: rc=$rc $out"
check "a fifth job exits 8 (no free device)" test "$rc" = 8
check "its message names holders, units and since" grep -Eq 'held: MIG-[^:]+: (alice|bob|carol) \(gpuctl-run-[0-9a-f]{16}\.scope\) since 20' <<<"$out"
check_output "gpuctl teams shows the devices held" sh -c "su -s /bin/sh alice -c 'gpuctl teams' | grep -c ' held (1/1)' | grep -qx 4"
check "the journal has a lease entry per job" test "$(gpuctld_journal GPUCTL_ACTION=lease | wc -l)" -ge 4

systemctl restart gpuctld.service
check "gpuctld converged again after the restart" wait_converged 60 2 3
check "after a restart gpuctl status lists the four leases" test "$(gpuctl status | grep -c '^  interns MIG-')" = 4
rc=0
su -s /bin/sh carol -c "gpuctl run --team interns -- true" >/dev/null 2>&1 || rc=$?
check "after a restart a fifth job still exits 8" test "$rc" = 8

scope_on() { # the scope holding device $1 (root's gpuctl status names it)
    gpuctl status | sed -nE "s#^  interns $1: .* (gpuctl-run-[0-9a-f]+\.scope) since .*#\1#p" | head -1
}
victim=$(grep -h '^DEV=' "$d/job2" | cut -d= -f2)
scope_of_victim=$(scope_on "$victim")
# --wait: carol's fifth queues, and starts when kill -9 ends a job. It runs on a terminal
# (script(1)), where a waiter prints its place in the queue.
setpriv --reuid=carol --regid=carol --init-groups script -q -f -c \
    "gpuctl run --team interns --wait=120s -- sh -c 'date +%s%N >$d/waited; echo \$CUDA_VISIBLE_DEVICES >$d/waited.dev'" \
    "$d/wait.tty" </dev/null >/dev/null 2>&1 &
wait_for 20 grep -q 'position' "$d/wait.tty"
sed 's/^/    wait.tty| /' "$d/wait.tty"
check "the waiting job has not started while every device is held" test ! -e "$d/waited"
check "on its terminal the waiter says its place in the queue" \
    grep -q 'gpuctl: waiting for a device of team interns: position 1 of 1' "$d/wait.tty"
echo "    killing $scope_of_victim ($victim)"
t_end=$(date +%s%N)
systemctl kill -s KILL "$scope_of_victim"
wait_for 30 test -s "$d/waited.dev"
delay=$((($(cat "$d/waited") - t_end) / 1000000))
echo "BENCH --wait job start after kill -9 of a holder: ${delay} ms"
check "kill -9 freed the lease: the waiting job got that device" test "$(cat "$d/waited.dev")" = "$victim"
wait_for 20 sh -c "! systemctl is-active --quiet $scope_of_victim"
out=$(su -s /bin/sh bob -c "gpuctl run --team interns -- sh -c 'echo \$CUDA_VISIBLE_DEVICES'" 2>&1)
check "after the waiter ended, the next job gets that device again" test "$out" = "$victim"
# The handoff's bound, against this guest's own speed: the handoff is systemd ending the killed
# scope, the waiter's next look at the leases (every 250 ms: src/dbus_api/join.rs WAIT_TICK) and
# a start as a fresh `gpuctl run` makes. Both parts are measured here (medians of 3: a plain
# scope killed until inactive; `su` to a fresh run's first line), so load grows the bound with
# them; a waiter that looked seconds apart, or only at its --wait limit, still fails it.
for i in 1 2 3; do
    systemd-run -q --scope --unit="vmtest66-td$i" sleep 300 &
    wait_for 10 systemctl is-active -q "vmtest66-td$i.scope"
    t_td=$(date +%s%N)
    systemctl kill -s KILL "vmtest66-td$i.scope"
    wait_for 20 sh -c "! systemctl is-active -q vmtest66-td$i.scope"
    echo $((($(date +%s%N) - t_td) / 1000000)) >>"$d/teardown.ms"
    t_fresh=$(date +%s%N)
    started=$(su -s /bin/sh bob -c "gpuctl run --team interns -- date +%s%N" 2>&1)
    echo $(((started - t_fresh) / 1000000)) >>"$d/fresh.ms"
done
teardown=$(sort -n "$d/teardown.ms" | sed -n 2p) fresh=$(sort -n "$d/fresh.ms" | sed -n 2p)
bound=$((2 * (teardown + fresh) + 250))
echo "BENCH --wait handoff bound: 2 x (scope teardown ${teardown} ms + fresh run ${fresh} ms) + 250 ms = ${bound} ms"
check "a --wait job starts within the bound of a device freeing (${delay} ms, bound ${bound} ms)" \
    test "$delay" -le "$bound"

# Fairness: every device held again, alice queues ten, then bob one; one device frees: bob's
# is served second, not eleventh.
su -s /bin/sh carol -c "gpuctl run --team interns -- sleep 300" >/dev/null 2>&1 &
wait_for 30 sh -c "test \$(gpuctl status | grep -c '^  interns MIG-') = 4"
: >"$d/order"
chmod 666 "$d/order"
for i in $(seq 10); do
    su -s /bin/sh alice -c "gpuctl run --team interns --wait=300s -- sh -c 'echo alice >>$d/order; sleep 1'" >/dev/null 2>&1 &
done
sleep 4
su -s /bin/sh bob -c "gpuctl run --team interns --wait=300s -- sh -c 'echo bob >>$d/order; sleep 1'" >/dev/null 2>&1 &
sleep 2
gpuctld_journal GPUCTL_ACTION=queued | tail -3 | sed 's/^/    /'
st=$(gpuctl status)
grep -A3 '^waiting' <<<"$st" | sed 's/^/    status| /'
check "gpuctl status lists the eleven waiting requests" test "$(grep -Ec '^  interns #[0-9]+: (alice|bob) \(uid [0-9]+\)$' <<<"$st")" = 11
check "bob's in second place" grep -Eq "^  interns #2: bob \(uid $(id -u bob)\)$" <<<"$st"
systemctl kill -s KILL "$(scope_on "$(grep -h '^DEV=' "$d/job1" | cut -d= -f2)")"
wait_for 60 sh -c "grep -q bob $d/order"
echo "    start order: $(tr '\n' ' ' <"$d/order")"
check "bob's one request is served within the first two, not behind alice's ten" sh -c "head -2 $d/order | grep -q bob"
wait_for 90 sh -c "test \$(wc -l <$d/order) = 11"
check "all eleven queued requests ran" test "$(wc -l <"$d/order")" = 11

rc=0
out=$(su -s /bin/sh alice -c "gpuctl run --team interns --gpus 2 -- true" 2>&1) || rc=$?
check "--gpus 2 on a MIG share exits 7" test "$rc" = 7
check "saying a process uses one MIG device" grep -q 'only one MIG device' <<<"$out"

out=$(su -s /bin/sh carol -c "gpuctl run --team train --gpus 2 -- sh -c 'echo \$CUDA_VISIBLE_DEVICES'" 2>&1)
check "--gpus 2 on train gets both whole GPUs" test "$out" = "$(gpu_uuid 1),$(gpu_uuid 2)"
out=$(su -s /bin/sh carol -c "gpuctl run --team train --gpu-memory 2G -- sh -c 'echo \$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'" 2>&1)
check "--gpu-memory 2G sets the MPS client limit" test "$out" = "0=2048M"
rc=0
out=$(su -s /bin/sh carol -c "gpuctl run --team train --gpu-memory 20G -- true" 2>&1) || rc=$?
check "--gpu-memory above the daemon's limit exits 7" test "$rc" = 7
check "naming the daemon's limit" grep -q "above the MPS daemon's own limit" <<<"$out"
rc=0
out=$(su -s /bin/sh carol -c "gpuctl run --team interns --gpu-memory 2G -- true" 2>&1) || rc=$?
check "--gpu-memory without MPS exits 7" test "$rc" = 7
check "saying nothing can enforce it there" grep -q 'nothing can enforce' <<<"$out"

# shellcheck disable=SC2317 # called through wait_for
no_interns_scopes() { test -z "$(systemctl list-units --plain --no-legend 'gpuctl-run-*.scope')"; }
systemctl kill -s KILL 'gpuctl-run-*.scope' 2>/dev/null || true
wait_for 30 no_interns_scopes

# An OOM kill frees the lease as kill -9 does: the job's one process (`tail` of /dev/zero keeps a
# newline-free line in memory) outgrows the team's 256M and the kernel kills it.
oom_before=$(sed -n 's/^oom_kill //p' /sys/fs/cgroup/gpu.slice/gpu-interns.slice/memory.events)
rc=0
su -s /bin/sh alice -c "gpuctl run --team interns -- sh -c 'echo \$CUDA_VISIBLE_DEVICES >$d/oom.dev; exec tail /dev/zero'" \
    >/dev/null 2>&1 || rc=$?
oom_after=$(sed -n 's/^oom_kill //p' /sys/fs/cgroup/gpu.slice/gpu-interns.slice/memory.events)
echo "    OOM job: exit $rc on $(cat "$d/oom.dev"), oom_kill $oom_before -> $oom_after"
check "the job was OOM-killed (exit 137, the slice's oom_kill counted it)" test "$rc:$((oom_after - oom_before))" = 137:1
check "its lease ended with it" wait_for 20 no_lease "^  interns $(cat "$d/oom.dev"):"

# CDI per device: a placed job's GPUCTL_CDI_DEVICE names its device, and the team's spec has
# that device with its UUID alone; a job that is not placed names the whole share.
out=$(su -s /bin/sh alice -c "gpuctl run --team interns -- sh -c 'echo \$CUDA_VISIBLE_DEVICES \$GPUCTL_CDI_DEVICE'" 2>&1)
echo "    placed run: $out"
dev=${out%% *} cdi=${out#* }
check "a placed run's GPUCTL_CDI_DEVICE names its device" test "$cdi" = "gpuctl.io/team=interns.$dev"
spec=/var/run/cdi/gpuctl.io-team-interns.json
check "the team's CDI spec has that device with its UUID alone" \
    test "$(jq -r --arg n "interns.$dev" '.devices[] | select(.name == $n) | .containerEdits.env[]' $spec | grep '^CUDA_VISIBLE_DEVICES=')" = "CUDA_VISIBLE_DEVICES=$dev"
check "the spec has a device per MIG instance, two cap nodes each" \
    test "$(jq -r '[.devices[] | select(.name | startswith("interns.MIG-")) | [.containerEdits.deviceNodes[].path | select(contains("nvidia-caps/"))] | length] | map(tostring) | join(" ")' $spec)" = "2 2 2 2"
out=$(su -s /bin/sh carol -c "gpuctl run --team train -- sh -c 'echo \$GPUCTL_CDI_DEVICE'" 2>&1)
check "an unplaced run's GPUCTL_CDI_DEVICE is the whole share" test "$out" = "gpuctl.io/team=train"

# A service in the team's slice gets a placement through `gpuctl run` in ExecStart (no tty, a
# system service's context): one MIG UUID, a lease in alice's name, the job's scope in the team
# slice; stopping the service ends the lease.
systemd-run -q --unit=svc-interns -p Slice=gpu-interns.slice -p User=alice \
    /usr/bin/gpuctl run --team interns -- sleep 60
svc_pid() { systemctl show -P MainPID svc-interns.service; }
wait_for 30 sh -c "test \"\$(cat /proc/\$(systemctl show -P MainPID svc-interns.service)/comm 2>/dev/null)\" = sleep"
pid=$(svc_pid)
svc_dev=$(tr '\0' '\n' <"/proc/$pid/environ" | sed -n 's/^CUDA_VISIBLE_DEVICES=//p')
echo "    svc-interns: pid $pid, CUDA_VISIBLE_DEVICES=$svc_dev, cgroup $(cat "/proc/$pid/cgroup")"
systemctl status --no-pager svc-interns.service 2>&1 | head -5 | sed 's/^/    | /'
check "the service's job got one MIG UUID" grep -Eqx 'MIG-[^,]+' <<<"$svc_dev"
svc_scope=$(sed -nE 's#^0::/gpu.slice/gpu-interns.slice/(gpuctl-run-[0-9a-f]{16}\.scope)$#\1#p' "/proc/$pid/cgroup")
check "its job scope sits in the team slice" test -n "$svc_scope"
check "it holds a lease in alice's name" sh -c "gpuctl status | grep -q '^  interns $svc_dev: alice (uid [0-9]*) $svc_scope since'"
check "the service stays active with its job in the scope" systemctl is-active --quiet svc-interns.service
systemctl stop svc-interns.service
wait_for 20 no_lease "$svc_scope"
check "stopping the service ends the lease" no_lease "$svc_scope"

# Benchmark (no timed assertion): `gpuctl run` with placement (interns), without (train:
# jobs-per-device = 0) and `systemd-run --scope`, interleaved, medians of 15, as root.
ms() { local t; t=$(date +%s%N); "$@" >/dev/null 2>&1 || echo "FAIL $*" >>"$d/bench.fail"; echo $((($(date +%s%N) - t) / 1000)); }
median() { sort -n "$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
gpuctl run --team interns -- true; gpuctl run --team train -- true; systemd-run -q --scope true
for i in $(seq 15); do
    ms gpuctl run --team interns -- true >>"$d/placed"
    ms gpuctl run --team train -- true >>"$d/unplaced"
    ms systemd-run -q --scope true >>"$d/scope"
done
p=$(median "$d/placed") u=$(median "$d/unplaced") sc=$(median "$d/scope")
echo "BENCH placement start (medians of 15, us): placed ${p}, unplaced ${u}, systemd-run --scope ${sc}; placed/unplaced $(awk -v a="$p" -v b="$u" 'BEGIN {printf "%.2f", a / b}')x, placed/systemd-run $(awk -v a="$p" -v b="$sc" 'BEGIN {printf "%.2f", a / b}')x, unplaced/systemd-run $(awk -v a="$u" -v b="$sc" 'BEGIN {printf "%.2f", a / b}')x"
check "every benchmark run succeeded" test ! -e "$d/bench.fail"

systemctl kill -s KILL 'gpuctl-run-*.scope' 2>/dev/null || true
wait_for 30 no_interns_scopes

# Leases are private: bob, in no team of the job, lists and shows carol's placed train job's
# scope and reads no user, uid, pid or device, and the team only as the slice it runs in; the
# lease's detail is a record only root reads, keyed to the live scope.
su -s /bin/sh carol -c "gpuctl run --team train --gpus 1 -- sh -c 'echo \$CUDA_VISIBLE_DEVICES >$d/priv.dev; exec sleep 300'" \
    >/dev/null 2>&1 &
wait_for 30 test -s "$d/priv.dev"
pdev=$(cat "$d/priv.dev")
pscope=$(gpuctl status | sed -nE "s#^  train $pdev: carol \(uid [0-9]+\) (gpuctl-run-[^ ]+\.scope) since .*#\1#p")
echo "    carol's train job: $pscope on $pdev"
check "root's gpuctl status names the job's lease and scope" test -n "$pscope"
rec=/run/gpuctl/leases/$pscope.json
ppid=$(head -n1 "/sys/fs/cgroup/gpu.slice/gpu-train.slice/$pscope/cgroup.procs")
lu=$(su -s /bin/sh bob -c "systemctl list-units --all --plain --no-legend 'gpuctl-run-*'")
sh=$(su -s /bin/sh bob -c "systemctl show $pscope")
awk '{print "    bob: list-units| " $0}' <<<"$lu"
grep -E '^(Id|Description|Slice|ControlGroup|DeviceAllow)=' <<<"$sh" | sed 's/^/    bob: show| /'
check "bob's systemctl list-units lists the scope" grep -q "^$pscope " <<<"$lu"
check_not "naming no user, team or device in it" grep -Eq "carol|train|uid |pid |GPU-|MIG-" <<<"$lu"
check "bob's systemctl show: a neutral description" grep -qx "Description=gpuctl job $(basename "$pscope" .scope | sed 's/^gpuctl-run-//')" <<<"$sh"
check_not "no user, uid, pid or device UUID in any property" grep -Eq "carol|uid |GPU-|MIG-" <<<"$sh"
check_not "the pid in no name, description or cgroup" grep -Eq "^(Id|Names|Description|ControlGroup)=.*\b$ppid\b" <<<"$sh"
check_not "the team only as the slice it runs in" sh -c "grep -v 'gpu-train\.slice' | grep -q train" <<<"$sh"
check "the lease's record is root's alone (directory 0700, file 0600)" \
    test "$(stat -c '%a %U' /run/gpuctl/leases) $(stat -c '%a %U' "$rec")" = "700 root 600 root"
check_not "bob cannot read it" su -s /bin/sh bob -c "cat $rec"
# A record whose scope no longer exists is ignored and removed; the live one survives a restart.
jq -c '.unit = "gpuctl-run-0000000000000000.scope" | .pid = 1' "$rec" \
    >/run/gpuctl/leases/gpuctl-run-0000000000000000.scope.json
touch -d '-10 min' /run/gpuctl/leases/gpuctl-run-0000000000000000.scope.json
check "a stale record is planted" test -s /run/gpuctl/leases/gpuctl-run-0000000000000000.scope.json
systemctl restart gpuctld.service
wait_for 60 sh -c 'systemctl show -P StatusText gpuctld.service | grep -q converged'
check "after a restart the live lease is read back from its record" sh -c "gpuctl status | grep -q '^  train $pdev: carol (uid [0-9]*) $pscope since'"
check "and only it" test "$(gpuctl status | grep -c "^  train $pdev:")" = 1
check "a record of no live scope is removed" test ! -e /run/gpuctl/leases/gpuctl-run-0000000000000000.scope.json
systemctl kill -s KILL "$pscope"
wait_for 20 sh -c "! gpuctl status | grep -q '$pscope'"
check "its record goes once its scope has ended and the grace has passed" sh -c "touch -d '-10 min' $rec; gpuctl status >/dev/null; test ! -e $rec"

check "gpuctld still active" systemctl is-active --quiet gpuctld.service
finish

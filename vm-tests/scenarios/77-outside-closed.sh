#!/bin/bash
# 77: closed by default (issue 31). Outside the team shares no NVIDIA node opens: login sessions
# (su -l, a logind session in user.slice) of bob (no team) and alice (infer) get EPERM on every
# one while /dev/null, /dev/tty, a pty and /dev/fuse still open; system.slice stays open and its
# user shows as a stray; a major registered later is usable once gpuctld sees it; the fence
# holds before gpuctld runs (the generator's drop-in, as at boot); a removed
# team's job loses the team's devices before another team is given them; outside = "open" is
# today's behaviour, and closing again names the process that holds a GPU outside, in the plan
# and the journal. ENXIO = allowed (no driver behind the fake node), EPERM = denied.
# vmtest: timeout=420
# vmtest: group=own
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

NV_NODES="/dev/nvidia0 /dev/nvidia1 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools"
OTHER_NODES="/dev/null /dev/zero /dev/urandom /dev/tty /dev/ptmx /dev/fuse"
# Opens each node from a login session of USER: "node PATH RESULT" lines, and the cgroup.
session_probe() {
    local u=$1
    shift
    su -l "$u" -c "grep '^0::' /proc/self/cgroup | sed 's/^/cgroup /'
        for n in $*; do
            [ -e \"\$n\" ] || { echo \"node \$n ABSENT\"; continue; }
            out=\$( (exec 3<>\"\$n\") 2>&1 )
            case \$out in
                '') r=OK ;; *'No such device or address'*) r=ENXIO ;;
                *'Operation not permitted'*) r=EPERM ;; *'Permission denied'*) r=EACCES ;; *) r=\"other: \$out\" ;;
            esac
            echo \"node \$n \$r\"
        done" 2>&1
}
field() { sed -n "s|^$2 ||p" <<<"$1" | head -1; }

shell_setup
echo "user.slice: DevicePolicy=$(systemctl show -P DevicePolicy user.slice)"
allow=$(systemctl show -P DeviceAllow user.slice)
echo "user.slice DeviceAllow: $allow"
check "user.slice is fenced by default (DevicePolicy=closed)" test "$(systemctl show -P DevicePolicy user.slice)" = closed
check "machine.slice too" test "$(systemctl show -P DevicePolicy machine.slice)" = closed
# shellcheck disable=SC2317 # called through check
has_all() { grep -q 'char-mem ' <<<"$allow" && grep -q 'char-misc ' <<<"$allow" && grep -q 'block-' <<<"$allow"; }
check "the allow-list has the guest's majors by name (char-mem, char-misc, block-...)" has_all
check_not "... and none of NVIDIA's" grep -q nvidia <<<"$allow"

for u in bob alice; do
    # shellcheck disable=SC2086 # the node lists are split into arguments on purpose
    out=$(session_probe "$u" $NV_NODES $OTHER_NODES)
    # shellcheck disable=SC2001 # a prefix on every line
    echo "$out" | sed "s/^/    $u| /"
    check "$u's login shell runs in a logind session under user.slice" \
        grep -Eq '^cgroup 0::/user.slice/user-[0-9]+.slice/session-[^/]+.scope$' <<<"$out"
    for n in $NV_NODES; do
        check "$u's session: $n denied (EPERM)" test "$(field "$out" "node $n")" = EPERM
    done
    for n in /dev/null /dev/zero /dev/urandom /dev/ptmx; do
        check "$u's session: $n opens" test "$(field "$out" "node $n")" = OK
    done
    # No controlling terminal under su -c: /dev/tty answers ENXIO, which the filter allowed.
    check "$u's session: /dev/tty not denied" sh -c "test \"$(field "$out" "node /dev/tty")\" != EPERM"
    r=$(field "$out" "node /dev/fuse")
    if [ "$r" = ABSENT ]; then echo "NOTE: no /dev/fuse in this guest: FUSE not checked"; else
        check "$u's session: /dev/fuse opens ($r)" test "$r" = OK
    fi
done
# Root in user.slice: the 0400 capability nodes too (a user meets their mode first).
r=$(probe user.slice /dev/nvidia-caps/nvidia-cap1); echo "root in user.slice -> nvidia-cap1: $r"
check "user.slice: nvidia-caps denied even to root (EPERM)" test "$r" = EPERM
check "inside gpuctl run: alice opens infer's GPU (ENXIO)" test "$(probe_in infer alice /dev/nvidia0)" = ENXIO
check "inside gpuctl run: alice's infer job is denied train's GPU (EPERM)" test "$(probe_in infer alice /dev/nvidia1)" = EPERM

# bob's CDI: the spec is for members (ACL), so his engine does not find it.
spec=/var/run/cdi/gpuctl.io-team-infer.json
echo "spec: $(stat -c '%A %U:%G' $spec); ACL: $(getfacl -p $spec 2>/dev/null | grep -v '^#' | xargs)"
check "the CDI spec is not readable by others" sh -c "test \$(( 0\$(stat -c %a $spec) & 7 )) = 0"
check_not "bob cannot read infer's CDI spec" su -s /bin/sh bob -c "cat $spec"
check "alice (via @ml-infer) can" su -s /bin/sh alice -c "cat $spec >/dev/null"
# Root podman without a team slice runs in machine.slice: 90 checks the forced node is denied.

# system.slice stays the admin's: a plain service opens GPU 0 and, on it per NVML, is a stray.
systemd-run -q --unit=nvtest sleep 600
r=$(probe system.slice /dev/nvidia0); echo "system.slice -> nvidia0: $r"
check "a system service still opens /dev/nvidia0 (ENXIO)" test "$r" = ENXIO
P_SVC=$(systemctl show -P MainPID nvtest.service)
S=$FAKE_NVML_STATE
flock "$S.lock" sh -c "jq '.processes += [{pid: $P_SVC, gpu: 0, used_memory_mib: 100}]' '$S' >'$S.new' && mv '$S.new' '$S'"
check_output "gpuctl status names the service holding infer's GPU outside its slice" \
    sh -c "gpuctl status | sed -n '/^strays/,\$p' | grep -E 'pid $P_SVC \\(nvtest.service'"
systemctl stop nvtest.service
flock "$S.lock" sh -c "jq '.processes = []' '$S' >'$S.new' && mv '$S.new' '$S'"

# A major registered after the fence was set. The overlay of /proc/devices (lib/fake-hw.sh) is
# rewritten in place, so systemd and gpuctld read the new list as they would the kernel's; the
# node is made in a subdirectory first (no event on /dev itself), then in /dev, which is what a
# driver's node does and what gpuctld watches.
mkdir -p /dev/vmtest77
sleep 1
awk '{print} /^Character devices:/ {print "241 vmtest77"}' /run/vmtest-fake/devices >/run/vmtest-fake/devices.new
cat /run/vmtest-fake/devices.new >/run/vmtest-fake/devices
mknod /dev/vmtest77/node c 241 0
r=$(probe user.slice /dev/vmtest77/node); echo "new major, before gpuctld noticed: $r"
check "a major registered after the fence was set is not in it yet (EPERM)" test "$r" = EPERM
mknod /dev/vmtest77-node c 241 0
# shellcheck disable=SC2317 # called through wait_for
new_major_opens() { test "$(probe user.slice /dev/vmtest77/node)" = ENXIO; }
check "after its node appears in /dev gpuctld re-fences and it opens from user.slice (ENXIO)" \
    wait_for 30 new_major_opens
check "the journal says why" grep -q 'registered device majors changed' <<<"$(gpuctld_journal)"
check "user.slice's list has it" sh -c "systemctl show -P DeviceAllow user.slice | grep -q 'char-vmtest77 '"
rm -rf /dev/vmtest77 /dev/vmtest77-node
grep -v ' vmtest77$' /run/vmtest-fake/devices >/run/vmtest-fake/devices.new
cat /run/vmtest-fake/devices.new >/run/vmtest-fake/devices

# At boot, before gpuctld's first reconcile, the generator's drop-in (from the last applied
# state) holds the fence. Shown without a reboot: gpuctld stopped, its runtime properties
# reverted as a reboot drops them, the generators run again.
systemctl stop gpuctld.service
systemctl revert user.slice >/dev/null 2>&1
systemctl daemon-reload
systemctl cat user.slice 2>&1 | grep -E '^# /|DevicePolicy' | sed 's/^/    | /'
check "the generator writes user.slice's fence" test -f /run/systemd/generator/user.slice.d/10-gpuctl-fence.conf
check "no runtime fence is left" sh -c '! ls /run/systemd/system.control/user.slice.d/*Device* 2>/dev/null'
check "without gpuctld, user.slice is closed by the generator's fence (EPERM)" test "$(probe user.slice /dev/nvidia0)" = EPERM
check "... and /dev/null opens there" test "$(probe user.slice /dev/null)" = OK
gpuctld_start
check "gpuctld converged again" wait_converged 60

# The removal sequence: alice's job in infer's scope; infer removed, GPU 0 given to train.
as alice 'gpuctl run --team infer -- sleep 600' &
wait_for 15 sh -c 'pgrep -u alice -x sleep >/dev/null'
pid=$(pgrep -u alice -x sleep | head -1)
cg=$(sed -n 's/^0:://p' /proc/"$pid"/cgroup)
echo "alice's job: pid $pid in $cg"
from_job() { bash -c "echo \$\$ >/sys/fs/cgroup$cg/cgroup.procs && exec 3<>$1" 2>&1 | grep -o 'Operation not permitted\|No such device or address'; }
check "before: the job's cgroup opens infer's GPU 0 (ENXIO)" test "$(from_job /dev/nvidia0)" = "No such device or address"
put_policy 60-shell.toml <<'P'
version = 1
[teams.train]
members = ["@ml-train", "alice"]
[[gpu]]
index = [0, 1]
owner = "train"
P
reload_wait
echo "gpuctld: $(status_text)"
for n in /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools; do
    check "after: from the removed team's job, $n is denied (EPERM)" test "$(from_job $n)" = "Operation not permitted"
done
check "alice's job was left running, without the devices" kill -0 "$pid"
check "train got GPU 0 (ENXIO)" test "$(probe gpu-train.slice /dev/nvidia0)" = ENXIO
j=$(gpuctld_journal)
# The two events that matter: GPU 0's node leaves infer's slice, and it enters train's (the
# first train line naming it; train never had GPU 0 before this change).
w=$(grep -nE 'team infer is no longer in the policy and loses .*/dev/nvidia0([^0-9]|$)' <<<"$j" | head -1 | cut -d: -f1)
g=$(grep -nE '^set gpu-train\.slice .*/dev/nvidia0([^0-9]|$)' <<<"$j" | head -1 | cut -d: -f1)
printf '%s\n' "$j" | sed -n "${w:-0}p;${g:-0}p" | cut -c1-200 | sed 's/^/    journal| /'
echo "journal: infer's withdrawal of /dev/nvidia0 at line ${w:-none}, train's grant of it at line ${g:-none}"
check "infer's slice lost GPU 0 before train's slice got it" test -n "$w" -a -n "$g" -a "${w:-0}" -lt "${g:-0}"
kill "$pid"; wait 2>/dev/null

# outside = "open": today's behaviour; closing again names who holds a GPU outside.
put_policy 10-host.toml <<'P'
version = 1
[host]
outside = "open"
P
reload_wait
check "outside = open: user.slice has no filter" test "$(systemctl show -P DevicePolicy user.slice)" = auto
check "outside = open: GPU 0 opens from user.slice (ENXIO)" test "$(probe user.slice /dev/nvidia0)" = ENXIO
systemd-run -q --unit=holder77 --slice=user.slice sleep 600
P_H=$(systemctl show -P MainPID holder77.service)
flock "$S.lock" sh -c "jq '.processes += [{pid: $P_H, gpu: 2, used_memory_mib: 100}]' '$S' >'$S.new' && mv '$S.new' '$S'"
printf 'version = 1\n[host]\noutside = "closed"\n' >/tmp/77-closed.toml
check_output "the plan to close names the holder in user.slice" \
    sh -c "gpuctl plan /etc/gpuctl/policy.d/60-shell.toml /tmp/77-closed.toml | grep -E 'user.slice.*pid $P_H'"
rm /etc/gpuctl/policy.d/10-host.toml
reload_wait
check "closed again" test "$(systemctl show -P DevicePolicy user.slice)" = closed
check_output "the journal names the holder" grep -E "still holding a GPU.*pid $P_H" <<<"$(gpuctld_journal)"
check "the holder was left running" kill -0 "$P_H"
systemctl stop holder77.service
flock "$S.lock" sh -c "jq '.processes = []' '$S' >'$S.new' && mv '$S.new' '$S'"
finish

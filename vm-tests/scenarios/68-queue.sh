#!/bin/bash
# 68: the --wait queue as users meet it (docs/shell.md, "Placement"). GPU 0 cut into four
# 1g.10gb instances for team interns; GPU 1 shared by teams sa and sb. A request that names a busy
# device holds back nobody: carol's plain request behind alice's gets the device that frees, and
# alice gets hers when it frees. Five waiters outlive `systemctl restart gpuctld` and all run. On
# the shared GPU, the default one job per device is the device's cap across both teams.
# vmtest: timeout=420
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup 2
test_users
put_policy 68-queue.toml <<'P'
version = 1
[teams.interns]
members = ["alice", "bob", "carol"]
[teams.sa]
members = ["alice"]
[teams.sb]
members = ["carol"]
[[gpu]]
index = [0]
mig = [{ profile = "1g.10gb", owner = "interns", count = 4 }]
[[gpu]]
index = [1]
shared = ["sa", "sb"]
P
gpuctld_start
wait_converged 60 3 2

d=$(mktemp -d)
chmod 777 "$d"
# shellcheck disable=SC2317 # called through wait_for
n_scopes() { test "$(systemctl list-units --plain --no-legend 'gpuctl-run-*.scope' | wc -l)" = "$1"; }
# Four holders, each recording its device; their scopes by device for the kills below.
for i in 0 1 2 3; do
    su -s /bin/sh bob -c "gpuctl run --team interns -- sh -c 'echo \$CUDA_VISIBLE_DEVICES >$d/hold$i; echo \$GPUCTL_SCOPE >$d/scope$i; exec sleep 600'" \
        >/dev/null 2>&1 &
done
wait_for 60 sh -c "test -s $d/scope0 && test -s $d/scope1 && test -s $d/scope2 && test -s $d/scope3"
require_nonempty "the four holders' devices" "$(cat "$d"/hold[0-3])"
check "four holders on four distinct devices" test "$(sort -u "$d"/hold[0-3] | wc -l)" = 4
dev_a=$(cat "$d/hold0") dev_b=$(cat "$d/hold1")

# alice waits for dev_a by name; carol, behind her, for any device.
su -s /bin/sh alice -c "gpuctl run --team interns --device $dev_a --wait=120s -- sh -c 'echo \$CUDA_VISIBLE_DEVICES >$d/alice.dev; exec sleep 600'" \
    >"$d/alice.out" 2>&1 &
wait_for 20 sh -c "gpuctl status | grep -q '^  interns #1: alice '"
su -s /bin/sh carol -c "gpuctl run --team interns --wait=120s -- sh -c 'echo \$CUDA_VISIBLE_DEVICES >$d/carol.dev; exec sleep 600'" \
    >"$d/carol.out" 2>&1 &
wait_for 20 sh -c "gpuctl status | grep -q '^  interns #2: carol '"
st=$(gpuctl status)
grep -A3 '^waiting' <<<"$st" | sed 's/^/    status| /'
check "alice is first and carol second in the queue" \
    bash -c "grep -q '^  interns #1: alice ' <<<\"\$0\" && grep -q '^  interns #2: carol ' <<<\"\$0\"" "$st"
# Another device than alice's frees: carol, behind alice, gets it.
systemctl kill -s KILL "$(cat "$d/scope1")"
wait_for 15 test -s "$d/carol.dev"
check "carol behind a blocked head gets the device that freed" test "$(cat "$d/carol.dev" 2>/dev/null)" = "$dev_b"
check "alice still waits for the device she named" test ! -e "$d/alice.dev"
systemctl kill -s KILL "$(cat "$d/scope0")"
wait_for 15 test -s "$d/alice.dev"
check "alice gets her device when it frees" test "$(cat "$d/alice.dev" 2>/dev/null)" = "$dev_a"

# Five waiters and a restart: every device is held (alice, carol, two of bob's).
wait_for 20 n_scopes 4
: >"$d/ran"
chmod 666 "$d/ran"
waiters=(alice bob carol alice bob)
for i in 0 1 2 3 4; do
    su -s /bin/sh "${waiters[$i]}" -c "gpuctl run --team interns --wait=240s -- sh -c 'echo $i >>$d/ran'" \
        >"$d/w$i.out" 2>&1 &
    echo $! >"$d/w$i.pid"
done
wait_for 30 sh -c "test \$(gpuctl status | grep -c '^  interns #') = 5"
check "five requests wait before the restart" test "$(gpuctl status | grep -c '^  interns #')" = 5
gpuctl status | grep '^  interns #' | sed 's/^/    before| /'
systemctl restart gpuctld.service
wait_converged 60 3 2
sleep 3
gpuctl status | grep '^  interns #' | sed 's/^/    after| /'
check "five requests wait after the restart" test "$(gpuctl status | grep -c '^  interns #')" = 5
alive=0
for i in 0 1 2 3 4; do kill -0 "$(cat "$d/w$i.pid")" 2>/dev/null && alive=$((alive + 1)); done
check "no waiting client exited with the restart" test "$alive" = 5
check "the waiters asked again (their own words)" grep -q 'asking again when it is back' "$d/w0.out"
check "the restarted gpuctld gave them back their places" \
    test "$(gpuctld_journal GPUCTL_ACTION=queue-returned | wc -l)" -ge 1
systemctl kill -s KILL 'gpuctl-run-*.scope'
wait_for 60 sh -c "test \$(wc -l <$d/ran) = 5"
check "all five waiters ran after the restart" test "$(wc -l <"$d/ran")" = 5
for i in 0 1 2 3 4; do sed "s/^/    w$i| /" "$d/w$i.out"; done
systemctl kill -s KILL 'gpuctl-run-*.scope' 2>/dev/null || true

# The shared GPU: alice's job of team sa holds it; carol's job of team sb is refused, naming
# the holder's team and not alice.
su -s /bin/sh alice -c "gpuctl run --team sa -- sh -c 'echo \$GPUCTL_SCOPE >$d/sa.scope; echo \$CUDA_VISIBLE_DEVICES >$d/sa.dev; exec sleep 600'" >/dev/null 2>&1 &
wait_for 60 test -s "$d/sa.dev"
check "sa's job is placed on the shared GPU" test "$(cat "$d/sa.dev" 2>/dev/null)" = "$(gpu_uuid 1)"
rc=0
out=$(su -s /bin/sh carol -c "gpuctl run --team sb -- true" 2>&1) || rc=$?
echo "    sb: rc=$rc $out"
check "sb's job waits its turn on the GPU sa holds (exit 8)" test "$rc" = 8
check "the refusal names the holder's team, not its user" \
    bash -c "grep -q 'a job of team sa since' <<<\"\$0\" && ! grep -q alice <<<\"\$0\"" "$out"
systemctl kill -s KILL "$(cat "$d/sa.scope")"
wait_for 20 sh -c "! gpuctl status | grep -q '^  sa '"
out=$(su -s /bin/sh carol -c "gpuctl run --team sb -- sh -c 'echo \$CUDA_VISIBLE_DEVICES'" 2>&1)
check "once sa's job ends, sb's job gets the GPU" test "$out" = "$(gpu_uuid 1)"

check "gpuctld still active" systemctl is-active --quiet gpuctld.service
finish

#!/bin/bash
# 69: lending (docs/policy.md, "Lending idle devices"). Team train lends GPU 1 to interns, who
# own GPU 0. gpuctld keeps gpu-loans.slice, the slice borrowed jobs run in: closed, opening
# train's GPU and not interns'; an interns job still cannot open train's GPU. With interns' GPU
# busy, bob's `--borrow` job gets train's idle GPU in the loans slice, fenced to it, under
# interns' memory limit. Carol (train) asks for her GPU: bob's job gets SIGTERM and a journal
# notice, is stopped after the grace (it ignores SIGTERM), and carol's job starts; interns cannot
# open the GPU afterwards. Again with `kill -9` of gpuctld mid-grace: the restarted gpuctld stops
# the borrower on time, not early. A lend window that closes takes a loan back. A reconcile after
# a restart leaves the loans slice as it is; it follows a lender that gives its GPU up and goes
# when nobody lends. A team named "loans" is refused with its file:line. The borrower reads the
# reclaim in `gpuctl events`; the owner's member does not. A `--requeue` borrower whose loan the
# window takes back is queued again and runs on its own team's GPU once that frees.
# vmtest: timeout=420
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup 2
test_users
lending_policy() {
    cat <<P
version = 1
[teams.interns]
members = ["bob"]
memory-max = "1G"
[teams.train]
members = ["carol"]
$1
[[gpu]]
index = [0]
owner = "$2"
[[gpu]]
index = [1]
owner = "$3"
P
}
LEND='[teams.train.lend]
to = ["interns"]
after = "1s"
grace = "8s"'
lending_policy "$LEND" interns train | put_policy 69-lending.toml
gpuctld_start
wait_converged 60 2 2

systemctl show -p ActiveState -p DevicePolicy -p DeviceAllow gpu-loans.slice | sed 's/^/    loans| /'
check "gpu-loans.slice is active and closed" \
    test "$(systemctl show -P ActiveState gpu-loans.slice) $(systemctl show -P DevicePolicy gpu-loans.slice)" = "active closed"
check "in the loans slice train's GPU opens (ENXIO)" test "$(probe gpu-loans.slice /dev/nvidia1)" = ENXIO
check "... and interns' own GPU does not (EPERM)" test "$(probe gpu-loans.slice /dev/nvidia0)" = EPERM
check "interns' slice does not open train's GPU (EPERM)" test "$(probe gpu-interns.slice /dev/nvidia1)" = EPERM
check "an interns job cannot open train's GPU (EPERM)" test "$(probe_in interns bob /dev/nvidia1)" = EPERM
check "... and opens its own (ENXIO)" test "$(probe_in interns bob /dev/nvidia0)" = ENXIO

gpuctld_start
wait_converged 60 2 2
check_output "after a restart the plan is empty: the loans slice is left as it is" \
    sh -c "gpuctl plan | grep -E 'Plan: 0 actions, 0 blocked \(converged\)'"

d=$(mktemp -d)
chmod 777 "$d"
GRACE=8
# shellcheck disable=SC2317 # called through wait_for
gone() { ! systemctl is-active -q "$1"; }
# borrower N [OPTION...]: bob's --borrow job, recording its devices, its lender, what it opens,
# and when it gets SIGTERM, which it ignores (a job that does not stop by itself); gpuctl's exit
# status goes to bN.rc. The trap forks nothing: systemd's SIGTERM reaches every new process of
# the scope, and a forked `date` would die before it wrote.
borrower() {
    local n=$1
    shift
    { as bob "gpuctl run --team interns --borrow $* -- bash -c 'trap \"echo \\\$EPOCHREALTIME >$d/term$n\" TERM; \
        echo \$CUDA_VISIBLE_DEVICES >$d/b$n.env; echo \$GPUCTL_BORROWED_FROM >$d/b$n.from; \
        (exec 3<>/dev/nvidia1) 2>$d/b$n.open1; (exec 3<>/dev/nvidia0) 2>$d/b$n.open0; \
        echo \$GPUCTL_SCOPE >$d/b$n.scope; while :; do sleep 0.2; done'" >"$d/b$n.out" 2>&1
        echo $? >"$d/b$n.rc"; } &
    wait_for 30 test -s "$d/b$n.scope"
}
# Interns' own GPU is busy.
as bob "gpuctl run --team interns -- sh -c 'echo \$CUDA_VISIBLE_DEVICES >$d/own.env; echo \$GPUCTL_SCOPE >$d/own.scope; exec sleep 900'" >/dev/null 2>&1 &
wait_for 30 test -s "$d/own.scope"
# refused TEXT: bob's second interns job is refused with TEXT in its answer.
# shellcheck disable=SC2317 # called through wait_for
refused() {
    local out
    out=$(as bob "gpuctl run --team interns -- true" 2>&1) && { echo "placed: $out"; return 1; }
    grep -qF "$1" <<<"$out" || { echo "$out"; return 1; }
}
# The restarted gpuctld counts train's GPU idle from its first look, so for `after` (1 s) the
# answer is "idle, lent once idle for 1 s" (src/lending/tests.rs); the wait covers that second.
check "without --borrow a second interns job is refused and told it could borrow" \
    wait_for 10 refused 'train has 1 idle device(s) to lend: wait with --borrow'
borrower 1
require_nonempty "the borrowed job's device" "$(cat "$d/b1.env" 2>/dev/null)"
bscope=$(cat "$d/b1.scope")
lent=$(cat "$d/b1.env")
check "the borrowed job is on another device than interns' own" test "$lent" != "$(cat "$d/own.env")"
check "... lent by train (GPUCTL_BORROWED_FROM)" test "$(cat "$d/b1.from")" = train
check "... in the loans slice" test "$(systemctl show -P Slice "$bscope")" = gpu-loans.slice
check "... it opens train's GPU (ENXIO) and not interns' (EPERM)" \
    sh -c "grep -q 'No such device or address' $d/b1.open1 && grep -q 'Operation not permitted' $d/b1.open0"
check "... under interns' memory limit on its scope (1G)" test "$(systemctl show -P MemoryMax "$bscope")" = 1073741824
check "interns' slice still does not open train's GPU (EPERM)" test "$(probe gpu-interns.slice /dev/nvidia1)" = EPERM
st=$(gpuctl status)
grep 'borrowed from' <<<"$st" | sed 's/^/    status| /'
check "gpuctl status names the lender on the borrowed lease" grep -q "^  interns $lent: bob .*, borrowed from train$" <<<"$st"
check "gpuctl teams shows train's GPU lent to bob of interns" \
    sh -c "gpuctl teams | grep -A1 '\] $lent lent' | grep -q 'lent to interns: bob'"

# Carol asks for train's GPU: the loan comes back within the grace.
# The clock starts in carol's shell, right before gpuctl: su's session start is not gpuctl's.
as carol "date +%s.%N >$d/t0; gpuctl run --team train -- sh -c 'date +%s.%N >$d/t1; echo \$GPUCTL_SCOPE >$d/carol1.scope; echo \$CUDA_VISIBLE_DEVICES >$d/carol1.env; exec sleep 900'" >"$d/carol1.out" 2>&1 &
wait_for 20 test -s "$d/term1"
check "the borrower gets SIGTERM at once" test -s "$d/term1"
bob_uid=$(id -u bob)
check "the journal names the reclaim with GPUCTL_UID" \
    sh -c "journalctl -u gpuctld -o cat --since @${VMTEST_SCENARIO_START:-0} GPUCTL_ACTION=loan-reclaim GPUCTL_UID=$bob_uid | grep -q 'taking back'"
ev=$(as bob "gpuctl events --json" 2>&1)
check_output "bob reads the reclaim of his job in gpuctl events" \
    jq -se --arg s "$bscope" --argjson u "$bob_uid" 'any(.[]; .kind == "loan-reclaim" and .unit == $s and .uid == $u and .team == "interns")' <<<"$ev"
rc=0
ec=$(as carol "gpuctl events --json" 2>&1) || rc=$?
check "carol's gpuctl events answers (rc $rc)" test "$rc" = 0
check_not "... with no event of interns' (she is in train)" grep -q '"team":"interns"' <<<"$ec"
sleep 1
check "the borrower still runs inside its grace" systemctl is-active -q "$bscope"
wait_for $((GRACE + 20)) test -s "$d/carol1.env"
waited=$(awk "BEGIN { printf \"%.1f\", $(cat "$d/t1") - $(cat "$d/t0") }")
echo "    owner waited ${waited} s for its lent GPU (grace ${GRACE} s)"
check "carol's job starts on train's GPU" test "$(cat "$d/carol1.env" 2>/dev/null)" = "$lent"
check "... within grace + 2 s" awk "BEGIN { exit !($waited <= $GRACE + 2) }"
check "the borrower's scope is gone" gone "$bscope"
check "interns cannot open train's GPU afterwards (EPERM)" test "$(probe gpu-interns.slice /dev/nvidia1)" = EPERM
check "the loans slice has no job left" test -z "$(systemd-cgls --no-pager -u gpu-loans.slice 2>/dev/null | grep scope)"
systemctl kill -s KILL "$(cat "$d/carol1.scope")"

# Again, with gpuctld killed mid-grace: the restarted one stops the borrower on time.
wait_for 20 gone "$(cat "$d/carol1.scope")"
sleep 2
borrower 2
bscope=$(cat "$d/b2.scope")
as carol "gpuctl run --team train --wait=60s -- sh -c 'echo \$GPUCTL_SCOPE >$d/carol2.scope; echo \$CUDA_VISIBLE_DEVICES >$d/carol2.env; exec sleep 900'" >"$d/carol2.out" 2>&1 &
wait_for 10 test -s "$d/term2"
systemctl kill -s KILL gpuctld.service
check "the reclaim is recorded for the next gpuctld" sh -c "ls /run/gpuctl/reclaims/ | grep -q '$bscope'"
wait_for 30 systemctl is-active -q gpuctld.service
wait_for $((GRACE + 20)) gone "$bscope"
t_end=$(date +%s.%N)
held=$(awk "BEGIN { printf \"%.1f\", $t_end - $(cat "$d/term2") }")
echo "    borrower stopped ${held} s after its notice, across a gpuctld kill -9"
check "the borrower is stopped after the restart" gone "$bscope"
check "... not before its grace" awk "BEGIN { exit !($held >= $GRACE - 0.5) }"
wait_for 30 test -s "$d/carol2.env"
check "carol's waiting job gets train's GPU" test "$(cat "$d/carol2.env" 2>/dev/null)" = "$lent"
wait_for 20 sh -c "! ls /run/gpuctl/reclaims/ | grep -q ."
check "the reclaim record is gone once the loan is back" test -z "$(ls /run/gpuctl/reclaims/)"
systemctl kill -s KILL "$(cat "$d/carol2.scope")"
wait_for 20 gone "$(cat "$d/carol2.scope")"

# A lend window that closes takes the loan back.
lending_policy "$LEND
when = [\"Mon..Sun\"]" interns train | put_policy 69-lending.toml
reload_wait
sleep 2
# This one with --requeue: taken back, it runs again when a device frees.
borrower 3 --requeue
bscope=$(cat "$d/b3.scope")
check "inside its window train lends" test "$(cat "$d/b3.from")" = train
lending_policy "$LEND
when = [\"$(date -d '+2 days' +%a)\"]" interns train | put_policy 69-lending.toml
reload_wait
wait_for 10 test -s "$d/term3"
check "the window closing sends the borrower SIGTERM" test -s "$d/term3"
wait_for $((GRACE + 10)) gone "$bscope"
check "... and stops it after the grace" gone "$bscope"
check "the journal says why" journal_has "lending window closed"
# --requeue: queued again, and placed when interns' own GPU frees (nothing is lent now).
wait_for 20 grep -q 'queued again' "$d/b3.out"
sed 's/^/    b3| /' "$d/b3.out"
check "bob's --requeue job says its loan was taken back and it is queued again" \
    grep -q "^gpuctl: the lent device of $bscope was taken back by its owner; queued again (--requeue)$" "$d/b3.out"
check "... and waits in interns' queue" wait_for 20 sh -c "gpuctl status | grep -q '^  interns #1: bob'"
rm -f "$d/b3.scope" "$d/b3.env" "$d/b3.from"
systemctl kill -s KILL "$(cat "$d/own.scope")"
wait_for 30 test -s "$d/b3.scope"
check "... and runs again on interns' own GPU once it frees" \
    test "$(cat "$d/b3.env" 2>&1)" = "$(cat "$d/own.env")"
check "... as interns' own job, not a loan" test -z "$(cat "$d/b3.from" 2>&1)"
check "... in a new scope" test "$(cat "$d/b3.scope")" != "$bscope"
# Its end now is its own (killed, not taken back): gpuctl ends with the command's status.
systemctl kill -s KILL "$(cat "$d/b3.scope")"
wait_for 20 test -s "$d/b3.rc"
check "a round not taken back ends gpuctl --requeue with the command's status (137)" \
    test "$(cat "$d/b3.rc" 2>&1)" = 137
check "... queued again only once" test "$(grep -c 'queued again' "$d/b3.out")" = 1
lending_policy "$LEND" interns train | put_policy 69-lending.toml
reload_wait

# Train gives GPU 1 to interns and takes GPU 0: the loans slice opens GPU 0 only.
lending_policy "$LEND" train interns | put_policy 69-lending.toml
reload_wait
wait_converged 60 2 2
check "the loans slice follows the lender: GPU 0 opens there (ENXIO)" test "$(probe gpu-loans.slice /dev/nvidia0)" = ENXIO
check "... and GPU 1, now interns', does not (EPERM)" test "$(probe gpu-loans.slice /dev/nvidia1)" = EPERM

# Nobody lends: the slice goes.
lending_policy "" train interns | put_policy 69-lending.toml
reload_wait
wait_converged 60 2 2
check "with no lender there is no loans slice" sh -c "! systemctl is-active -q gpu-loans.slice"

# The name is reserved.
printf 'version = 1\n[teams.loans]\nmembers = ["bob"]\n' >/tmp/69-loans.toml
out=$(gpuctl validate /tmp/69-loans.toml 2>&1)
while IFS= read -r l; do echo "    validate| $l"; done <<<"$out"
check "a team named loans is refused with file:line:col and key" \
    grep -q '69-loans.toml:2:8: error: teams.loans: .*reserved' <<<"$out"

check "gpuctld still active" systemctl is-active --quiet gpuctld.service
finish

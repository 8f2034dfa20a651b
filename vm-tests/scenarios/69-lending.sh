#!/bin/bash
# 69: lending, the host side (docs/policy.md, "Lending idle devices"). Team train lends GPU 1 to
# interns, who own GPU 0. gpuctld keeps gpu-loans.slice, the slice borrowed jobs run in: closed,
# opening train's GPU and not interns'; an interns job still cannot open train's GPU. A reconcile
# after a restart leaves it as it is; it follows a lender that gives its GPU up and goes when
# nobody lends. A team named "loans" is refused with its file:line.
# vmtest: timeout=300
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
grace = "5s"'
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

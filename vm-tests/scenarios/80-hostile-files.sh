#!/bin/bash
# 80 (issue #18): a running gpuctld is fed the files that crashed or hung it through its policy
# directory: a FIFO and a link to /dev/zero named *.toml, a 2 MiB file, a drain-timeout whose sum
# overflowed Duration, a members list over its cap, a name that is not UTF-8. After each one it
# answers Status, names the file, keeps the last good policy in force, alice's joins still work,
# and NRestarts stays 0.
#
# The large inputs are written as hidden files (which the loader skips) and renamed into place:
# gpuctld sees each once, whole, from inotify, instead of parsing every partial write (under TCG
# with a debug build, each parse of a ~0.5 MiB file costs seconds). The members list is 5,000
# (over the cap of 4,096), not 100,000: the cap is what is checked; linear time on 100,000 is a
# unit test (tests/policy_harden.rs).
# vmtest: timeout=600
# vmtest: group=own
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
shell_setup
d=/etc/gpuctl/policy.d
restarts0=$(systemctl show -P NRestarts gpuctld.service)

healthy() { # $1: what was fed
    local st
    st=$(status_text)
    echo "  after $1: $st" | cut -c1-300
    # `gpuctl status` exits 1 (INVALID) while a policy error is shown: it must answer (not time
    # out: 124) with that exit and the last good policy in force.
    local out rc=0
    out=$(timeout 30 gpuctl status 2>&1) || rc=$?
    check "$1: gpuctl status answers, exit 1 for the policy error" test "$rc" = 1
    check "$1: gpuctl status shows the last good policy in force" grep -q 'policy in force: last-good' <<<"$out"
    check "$1: last good policy in force" grep -q 'last good policy in force' <<<"$st"
    check "$1: alice still joins infer" test "$(as alice 'gpuctl run --team infer -- cat /proc/self/cgroup' | grep -c gpu-infer.slice)" = 1
    check "$1: NRestarts unchanged" test "$(systemctl show -P NRestarts gpuctld.service)" = "$restarts0"
}

put_whole() { # put_whole NAME: rename $d/.NAME (complete) to $d/NAME, wait for the reconcile
    local t
    t=$(date +%s%6N)
    mv "$d/.$1" "$d/$1"
    wait_for 120 _reconciled_since "$t"
}

mkfifo $d/90-fifo.toml
reload_wait
check "FIFO named in StatusText" grep -q '90-fifo.toml: cannot read: a FIFO' <<<"$(status_text)"
healthy "a FIFO"
rm -f $d/90-fifo.toml

ln -s /dev/zero $d/91-zero.toml
reload_wait
check "/dev/zero link named" grep -q '91-zero.toml: cannot read: a character device' <<<"$(status_text)"
healthy "a link to /dev/zero"
rm -f $d/91-zero.toml

head -c $((2 << 20)) /dev/zero | tr '\0' '#' >$d/.92-big.toml
put_whole 92-big.toml
check "2 MiB file refused naming the cap" grep -q '92-big.toml: cannot read: .* over the 1024 KiB limit' <<<"$(status_text)"
healthy "a 2 MiB file"
rm -f $d/92-big.toml

# ~50,000 terms of u32::MAX days overflow Duration (u64 seconds); 52,000 to be sure.
{ printf 'version = 1\n[host]\ndrain-timeout = "'; yes 4294967295d | head -n 52000 | tr -d '\n'; printf '"\n'; } >$d/.93-panic.toml
put_whole 93-panic.toml
check "the overflowing duration is an error with file:line:key" grep -q '93-panic.toml:3:17: host.drain-timeout: .* is too large' <<<"$(status_text)"
healthy "an overflowing drain-timeout"
rm -f $d/93-panic.toml

{ printf 'version = 1\n[teams.infer]\nmembers = ['; seq -f '"u%g",' 5000 | tr -d '\n'; printf '"z"]\n'; } >$d/.94-members.toml
t0=$(date +%s%N)
put_whole 94-members.toml
t1=$(date +%s%N)
check "5,001 members: error naming the cap" grep -q '94-members.toml:3:11: teams.infer.members: 5001 members is over the limit of 4096 (MAX_MEMBERS)' <<<"$(status_text)"
echo "BENCH harden-5k-members-load-ms $(((t1 - t0) / 1000000))"
healthy "5,001 members"
rm -f $d/94-members.toml

printf 'version = 1\n' >"$d/95-$(printf '\xff\xfe').toml"
reload_wait
check "a non-UTF-8 name is warned about" grep -q 'skipped: the file name is not UTF-8' <(gpuctld_journal)
rm -f "$d/95-$(printf '\xff\xfe').toml"

reload_wait
check "clean again: converged" status_converged 3 2
rss=$(awk '/VmRSS/ {print $2}' "/proc/$(systemctl show -P MainPID gpuctld.service)/status")
echo "BENCH harden-rss-after-hostile-files-kib $rss"
check "RSS bounded (< 64 MiB)" test "$rss" -lt 65536
finish

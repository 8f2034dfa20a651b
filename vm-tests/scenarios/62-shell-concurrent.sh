#!/bin/bash
# 62: 50 concurrent `gpuctl run` from three users: alice (ml-infer) and carol (ml-train) are all
# placed in their team's slice, bob is refused every time with exit 3; gpuctld stays healthy
# (active, no restart, still converged, answers Status) and no scope is left behind.
# vmtest: timeout=420
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
shell_setup
# Many jobs on one GPU at once is what this scenario asks of Join; placement would give the
# GPU to one job at a time (66 tests that), so these teams opt out.
put_policy 62-unplaced.toml <<'P'
version = 1
[teams.infer.placement]
jobs-per-device = 0
[teams.train.placement]
jobs-per-device = 0
P
reload_wait

d=$(mktemp -d); chmod 777 "$d"
t0=$(date +%s%N)
for i in $(seq 1 50); do
    case $((i % 3)) in
        0) u=alice t=infer ;;
        1) u=carol t=train ;;
        2) u=bob t=infer ;;
    esac
    ( su -s /bin/sh "$u" -c "gpuctl run --team $t -- sh -c 'sleep 0.5; cat /proc/self/cgroup'" >"$d/$i.out" 2>"$d/$i.err"
      echo "$? $u $t" >"$d/$i.rc" ) &
done
wait
echo "50 concurrent gpuctl run finished in $((($(date +%s%N) - t0) / 1000000)) ms"
placed=0 refused=0 wrong=0 want_placed=0 want_refused=0
for i in $(seq 1 50); do
    read -r rc u t <"$d/$i.rc"
    if [ "$u" = bob ]; then want_refused=$((want_refused + 1)); else want_placed=$((want_placed + 1)); fi
    if [ "$u" = bob ]; then
        if [ "$rc" = 3 ] && grep -q 'bob is not a member of team "infer"' "$d/$i.err"; then
            refused=$((refused + 1))
        else wrong=$((wrong + 1)); echo "    run $i ($u/$t): rc=$rc $(cat "$d/$i.err" "$d/$i.out")"; fi
    else
        if [ "$rc" = 0 ] && grep -Eq "^0::/gpu.slice/gpu-$t.slice/gpuctl-run-[0-9a-f]{16}.scope$" "$d/$i.out"; then
            placed=$((placed + 1))
        else wrong=$((wrong + 1)); echo "    run $i ($u/$t): rc=$rc $(cat "$d/$i.err" "$d/$i.out")"; fi
    fi
done
echo "placed $placed, refused $refused, wrong $wrong"
check "every alice/carol run placed in its own team's slice ($want_placed)" test $placed = $want_placed
check "every bob run refused with 3 ($want_refused)" test $refused = $want_refused
check "no run ended up anywhere else" test $wrong = 0
check "gpuctld still active" systemctl is-active --quiet gpuctld.service
check "gpuctld did not restart" test "$(systemctl show -P NRestarts gpuctld.service)" = 0
check_output "gpuctld still converged and answering" gpuctl status
for i in $(seq 50); do [ -z "$(systemctl list-units --all --plain --no-legend 'gpuctl-run-*')" ] && break; sleep 0.2; done
check_empty "no scope left behind" systemctl list-units --all --plain --no-legend 'gpuctl-run-*'
finish

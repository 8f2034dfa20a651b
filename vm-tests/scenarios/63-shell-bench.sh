#!/bin/bash
# 63 (benchmark): median wall time of `gpuctl run --team infer -- true` against
# `systemd-run --scope --slice=gpu-infer.slice true`, both as root, interleaved in the same run;
# prints both medians and the ratio (goal <= 1.1x). Checks only that both ran every time:
# speed is reported, not asserted. Also reported: the same run by alice, an unprivileged member
# (through her group ml-infer), started with setpriv: her path adds the bus policy and NSS
# lookups; setpriv's own start is measured alongside so it can be told apart. `.ci/run`
# installs the release package (as shipped); a `vm-tests/run` of a debug build measures mostly
# the debug binary's start-up. Placement: team infer's run is placed (its GPU leased to the
# job, the scope fenced to it); team open (jobs-per-device = 0) takes the path without
# placement on a GPU of its own, interleaved in the same loop.
# vmtest: timeout=420
# vmtest: group=daemon
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
shell_setup
put_policy 63-open.toml <<'P'
version = 1
[teams.infer.placement]
jobs-per-device = 1
[teams.open]
members = ["alice"]
[teams.open.placement]
jobs-per-device = 0
[[gpu]]
index = [2]
owner = "open"
P
reload_wait

N=${BENCH_N:-$(bench_size 25 2)}
ms() { local t; t=$(date +%s%N); "$@" >/dev/null 2>&1 || echo FAIL >>/tmp/bench.fail; echo $((($(date +%s%N) - t) / 1000)); }
rm -f /tmp/bench.fail /tmp/g.txt /tmp/s.txt /tmp/v.txt /tmp/a.txt /tmp/p.txt /tmp/o.txt
alice=(setpriv --reuid=alice --regid=alice --init-groups)
# Warm both paths (page cache, first bus connection) before measuring.
gpuctl run --team infer -- true; systemd-run -q --scope --slice=gpu-infer.slice true
gpuctl run --team open -- true
for i in $(seq "$N"); do
    ms gpuctl run --team infer -- true >>/tmp/g.txt
    ms systemd-run -q --scope --slice=gpu-infer.slice true >>/tmp/s.txt
    ms gpuctl run --team open -- true >>/tmp/o.txt
    # Breakdown: what starting the gpuctl binary alone costs (no bus, no placement).
    ms gpuctl --version >>/tmp/v.txt
    ms "${alice[@]}" gpuctl run --team infer -- true >>/tmp/a.txt
    ms "${alice[@]}" true >>/tmp/p.txt
done
median() { sort -n "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}'; }
g=$(median /tmp/g.txt) s=$(median /tmp/s.txt)
ratio=$(awk -v g="$g" -v s="$s" 'BEGIN {printf "%.2f", g / s}')
echo "BENCH gpuctl run --team infer -- true: median ${g} us over $N"
echo "BENCH systemd-run --scope --slice=gpu-infer.slice true: median ${s} us over $N"
o=$(median /tmp/o.txt)
echo "BENCH gpuctl run --team open -- true (jobs-per-device = 0, no placement): median ${o} us over $N"
echo "BENCH ratio placed/unplaced gpuctl run: $(awk -v g="$g" -v o="$o" 'BEGIN {printf "%.2f", g / o}')x (goal <= 1.1x)"
echo "BENCH gpuctl --version (process start only): median $(median /tmp/v.txt) us"
echo "BENCH ratio gpuctl/systemd-run: ${ratio}x (goal <= 1.1x)"
a=$(median /tmp/a.txt)
echo "BENCH alice (member via @ml-infer): setpriv … gpuctl run --team infer -- true: median ${a} us; setpriv … true alone: median $(median /tmp/p.txt) us; ratio to root's systemd-run $(awk -v a="$a" -v s="$s" 'BEGIN {printf "%.2f", a / s}')x"
printf 'gpuctl_us %s\nsystemd_run_us %s\nratio %s\nunplaced_us %s\n' "$g" "$s" "$ratio" "$o" >"$VMTEST_RESULTS/bench.txt"
check "every measured run succeeded" test ! -e /tmp/bench.fail
check "each was measured $N times" test "$(cat /tmp/[gsao].txt | wc -l)" = $((4 * N))
finish

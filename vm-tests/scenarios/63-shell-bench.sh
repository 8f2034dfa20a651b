#!/bin/bash
# 63 (benchmark): median wall time of `gpuctl run --team infer -- true` against
# `systemd-run --scope --slice=gpu-infer.slice true`, both as root, interleaved in the same run;
# prints both medians and the ratio (goal <= 1.1x). Checks only that both ran every time:
# speed is reported, not asserted.
# vmtest: timeout=420
. lib/common.sh
. lib/fake-hw.sh
# --- gpuctl shell scenarios: common setup (copied into each 6x scenario; lib/ belongs to the harness) ---
# Uses the installed package; before packaging lands on main, binaries from /test/bin and units
# from /test/units-draft (local runs of this branch).
shell_setup() {
    local b
    if ! command -v gpuctld >/dev/null; then
        for b in gpuctl gpuctld; do install -m755 /test/bin/$b /usr/bin/$b; done
        install -m644 /test/units-draft/gpuctld.service /etc/systemd/system/gpuctld.service
        install -m644 /test/units-draft/gpuctl-ready.target /etc/systemd/system/gpuctl-ready.target
    fi
    if [ -r /test/units-draft/org.gpuctl.Agent1.conf ] &&
        ! grep -q 'send_member="Join"' /usr/share/dbus-1/system.d/org.gpuctl.Agent1.conf 2>/dev/null; then
        install -D -m644 /test/units-draft/org.gpuctl.Agent1.conf /usr/share/dbus-1/system.d/org.gpuctl.Agent1.conf
        systemctl reload dbus.service
    fi
    fake_gpus 4
    getent group ml-infer >/dev/null || groupadd ml-infer
    getent group ml-train >/dev/null || groupadd ml-train
    id alice >/dev/null 2>&1 || useradd -m -s /bin/bash -G ml-infer alice
    id bob >/dev/null 2>&1 || useradd -m -s /bin/bash bob
    id carol >/dev/null 2>&1 || useradd -m -s /bin/bash -G ml-train carol
    mkdir -p /etc/gpuctl/policy.d
    cat >/etc/gpuctl/policy.d/.60-shell.tmp <<'P'
version = 1
[teams.infer]
members = ["@ml-infer"]
memory-max = "256M"
tasks-max = 512
[teams.train]
members = ["@ml-train", "alice"]
[teams.empty]
members = ["alice"]
[[gpu]]
index = [0]
owner = "infer"
[[gpu]]
index = [1]
owner = "train"
P
    mv /etc/gpuctl/policy.d/.60-shell.tmp /etc/gpuctl/policy.d/60-shell.toml
    systemctl daemon-reload
    systemctl restart gpuctld.service
    local i
    for i in $(seq 100); do
        systemctl show -P StatusText gpuctld.service | grep -q converged && break
        sleep 0.2
    done
    echo "gpuctld: $(systemctl show -P StatusText gpuctld.service)"
}
# as USER CMD: run CMD (a shell string) as USER through a login-less su; prints output, keeps rc.
as() { local u=$1; shift; su -s /bin/sh "$u" -c "$*"; }
# probe_in TEAM USER NODE: open NODE from `gpuctl run` as USER; prints ENXIO/EPERM/OK/other
probe_in() {
    local out
    out=$(as "$2" "gpuctl run --team $1 -- bash -c 'exec 3<>$3'" 2>&1)
    case $out in
        *"No such device or address"*) echo ENXIO ;;
        *"Operation not permitted"*) echo EPERM ;;
        "") echo OK ;;
        *) echo "other: $out" ;;
    esac
}
# --- end of common setup ---
shell_setup

N=${BENCH_N:-25}
ms() { local t=$(date +%s%N); "$@" >/dev/null 2>&1 || echo FAIL >>/tmp/bench.fail; echo $((($(date +%s%N) - t) / 1000)); }
rm -f /tmp/bench.fail /tmp/g.txt /tmp/s.txt /tmp/v.txt
# Warm both paths (page cache, first bus connection) before measuring.
gpuctl run --team infer -- true; systemd-run -q --scope --slice=gpu-infer.slice true
for i in $(seq "$N"); do
    ms gpuctl run --team infer -- true >>/tmp/g.txt
    ms systemd-run -q --scope --slice=gpu-infer.slice true >>/tmp/s.txt
    # Breakdown: what starting the gpuctl binary alone costs (no bus, no placement).
    ms gpuctl --version >>/tmp/v.txt
done
median() { sort -n "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}'; }
g=$(median /tmp/g.txt) s=$(median /tmp/s.txt)
ratio=$(awk -v g="$g" -v s="$s" 'BEGIN {printf "%.2f", g / s}')
echo "BENCH gpuctl run --team infer -- true: median ${g} us over $N"
echo "BENCH systemd-run --scope --slice=gpu-infer.slice true: median ${s} us over $N"
echo "BENCH gpuctl --version (process start only): median $(median /tmp/v.txt) us"
echo "BENCH ratio gpuctl/systemd-run: ${ratio}x (goal <= 1.1x)"
printf 'gpuctl_us %s\nsystemd_run_us %s\nratio %s\n' "$g" "$s" "$ratio" >"$VMTEST_RESULTS/bench.txt"
check "every run of both commands succeeded" test ! -e /tmp/bench.fail
check "both were measured $N times" test "$(wc -l </tmp/g.txt)" = "$N" -a "$(wc -l </tmp/s.txt)" = "$N"
finish

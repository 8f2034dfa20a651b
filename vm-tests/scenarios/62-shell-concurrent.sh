#!/bin/bash
# 62: 50 concurrent `gpuctl run` from three users: alice (ml-infer) and carol (ml-train) are all
# placed in their team's slice, bob is refused every time with exit 3; gpuctld stays healthy
# (active, no restart, still converged, answers Status) and no scope is left behind.
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

d=$(mktemp -d); chmod 777 "$d"
t0=$(date +%s%N)
for i in $(seq 1 50); do
    case $((i % 3)) in
        0) u=alice t=infer ;;
        1) u=carol t=train ;;
        2) u=bob t=infer ;;
    esac
    ( su -s /bin/sh $u -c "gpuctl run --team $t -- sh -c 'sleep 0.5; cat /proc/self/cgroup'" >"$d/$i.out" 2>"$d/$i.err"
      echo "$? $u $t" >"$d/$i.rc" ) &
done
wait
echo "50 concurrent gpuctl run finished in $((($(date +%s%N) - t0) / 1000000)) ms"
placed=0 refused=0 wrong=0 want_placed=0 want_refused=0
for i in $(seq 1 50); do
    read -r rc u t <"$d/$i.rc"
    if [ $u = bob ]; then want_refused=$((want_refused + 1)); else want_placed=$((want_placed + 1)); fi
    if [ $u = bob ]; then
        if [ "$rc" = 3 ] && grep -q 'bob is not a member of team "infer"' "$d/$i.err"; then
            refused=$((refused + 1))
        else wrong=$((wrong + 1)); echo "    run $i ($u/$t): rc=$rc $(cat "$d/$i.err" "$d/$i.out")"; fi
    else
        if [ "$rc" = 0 ] && grep -Eq "^0::/gpu.slice/gpu-$t.slice/gpuctl-run-$t-[0-9]+.scope$" "$d/$i.out"; then
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

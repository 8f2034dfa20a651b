#!/bin/bash
# 61: an interactive `gpuctl shell` under a pty (script(1)): alice gets her login shell's prompt
# inside a scope in gpu-infer.slice with the team's environment, `exit 7` leaves it with status
# 7, and the scope is gone afterwards.
# vmtest: timeout=300
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

# Typed slowly into the pty, as a person would: bash reads the pty line by line.
typein() {
    sleep 3
    printf 'echo "CG=$(cat /proc/self/cgroup)"\n'
    sleep 1
    printf 'echo "CVD=$CUDA_VISIBLE_DEVICES TEAM=$GPUCTL_TEAM SCOPE=$GPUCTL_SCOPE"\n'
    sleep 1
    printf 'exit 7\n'
    sleep 2
}
typein | su - alice -c "CUDA_VISIBLE_DEVICES=evil script -qefc 'gpuctl shell --team infer' /dev/null" >/tmp/pty.log 2>&1
rc=$?
tr -d '\r' </tmp/pty.log | sed 's/\x1b\[[0-9;?]*[a-zA-Z]//g' >/tmp/pty.txt
sed 's/^/    pty| /' /tmp/pty.txt | head -n 20
cp /tmp/pty.txt "$VMTEST_RESULTS/pty.txt"
check "the shell showed alice's prompt" grep -q 'alice@.*\$' /tmp/pty.txt
check "the shell runs in a scope in gpu-infer.slice" \
    grep -Eq '^CG=0::/gpu.slice/gpu-infer.slice/gpuctl-run-infer-[0-9]+.scope' /tmp/pty.txt
check "with the team's environment, not the inherited one" grep -q '^CVD=0 TEAM=infer SCOPE=gpuctl-run-infer-' /tmp/pty.txt
check "the banner names the team and scope" grep -q '^gpuctl: team infer (gpuctl-run-infer-' /tmp/pty.txt
check "exit 7 leaves the shell with status 7" test $rc = 7
for i in $(seq 50); do [ -z "$(systemctl list-units --all --plain --no-legend 'gpuctl-run-*')" ] && break; sleep 0.2; done
check_empty "the scope is gone after the shell exited" systemctl list-units --all --plain --no-legend 'gpuctl-run-*'
check "gpuctld is still active" systemctl is-active --quiet gpuctld.service
finish

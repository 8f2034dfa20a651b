# shellcheck shell=bash
# vm-tests/lib/gpuctld.sh - helpers for scenarios that run the installed gpuctld (guest side,
# sourced after common.sh and fake-hw.sh, as root).
#
#   gpuctld_setup [N]       N fake GPUs (default 4) known to the device files *and* to gpuctld
#                           through the fake NVML, the fake MPS control daemon, /etc/gpuctl/policy.d
#   gpu_uuid I              the UUID the fake NVML reports for GPU I
#   put_policy NAME <TEXT   drop a policy file into /etc/gpuctl/policy.d atomically (rename)
#   idle_sampling_fast      gpuctld samples idleness every 2 s (a drop-in; before gpuctld_start)
#   gpuctld_start           (re)start gpuctld and wait for READY=1
#   reload_wait             SIGHUP, then wait until a reconcile that started after it finished
#   status_text             gpuctld's StatusText
#   is_converged TEXT [TEAMS [GPUS]]   TEXT is a converged StatusText (of TEAMS teams, GPUS GPUs)
#   is_not_converged TEXT   TEXT says the host differs (something waits)
#   is_policy_error TEXT    TEXT says a policy error keeps the last good policy (or none) in force
#   status_converged [TEAMS [GPUS]]    gpuctld's StatusText is converged (is_converged)
#   wait_converged SECS [TEAMS [GPUS]] wait until it is; on timeout print it and fail
#   wait_for SECS CMD...    poll CMD every 0.1 s (the product may not poll; a test may)
#   probe SLICE NODE        open NODE from a service in SLICE: ENXIO (allowed, no driver),
#                           EPERM (denied by the device filter), OK, or other: ...
#   gpuctld_journal [ARGS]  gpuctld's journal (-o cat) since this scenario started: scenarios
#                           that share a boot (# vmtest: group=...) see only their own lines
#   journal_has REGEX       that journal has a line matching REGEX
#   test_users              alice (group ml-infer), bob (no team), carol (group ml-train)

# The fake NVML's state: written by the scenario (known UUIDs), read and updated by every
# process that loads the library (gpuctld, gpuctl).
VMTEST_NVML_DIR=/var/lib/vmtest-nvml
FAKE_NVML_STATE=$VMTEST_NVML_DIR/state.json
export FAKE_NVML_STATE

gpu_uuid() { printf 'GPU-00000000-1111-2222-3333-%012d\n' "$1"; }
# fake_xid GPU XID: the fake NVML raises a critical XID event on GPU (appended under its lock, as
# every NVML call takes it).
fake_xid() {
    local S=$FAKE_NVML_STATE
    flock "$S.lock" sh -c "jq '.health.events += [{gpu: $1, type: 8, data: $2}]' '$S' >'$S.new' && mv '$S.new' '$S'"
}

# fake_nvml_state MODEL N: a state file with N GPUs of MODEL (fake-nvml model key), MIG off,
# UUIDs from gpu_uuid.
fake_nvml_state() {
    local model=$1 n=$2 i sep=
    mkdir -p "$VMTEST_NVML_DIR"
    {
        printf '{"gpus": ['
        for ((i = 0; i < n; i++)); do
            printf '%s{"model": "%s", "uuid": "%s"}' "$sep" "$model" "$(gpu_uuid "$i")"
            sep=', '
        done
        printf ']}\n'
    } >"$FAKE_NVML_STATE"
}

# gpuctld_use_fake_nvml: point gpuctld (drop-in) and gpuctl (environment) at the fake NVML.
gpuctld_use_fake_nvml() {
    local lib
    lib=$(fake_nvml) || { fail "no fake NVML library (the harness copies target/*/libfake_nvml.so)"; return 1; }
    export GPUCTL_NVML_LIBRARY=$lib GPUCTL_GPU_RESET_CMD=fake:
    mkdir -p /etc/systemd/system/gpuctld.service.d
    # Written only when it differs: an unchanged drop-in needs no daemon-reload (gpuctld_setup).
    local dropin=/etc/systemd/system/gpuctld.service.d/50-vmtest-nvml.conf
    cat >"$dropin.new" <<EOF
# vm-tests: the fake NVML instead of the driver's libnvidia-ml.
[Service]
Environment=GPUCTL_NVML_LIBRARY=$lib FAKE_NVML_STATE=$FAKE_NVML_STATE GPUCTL_GPU_RESET_CMD=fake:
ReadWritePaths=$VMTEST_NVML_DIR
# gpuctld's sandbox gets a fresh /proc, without fake_gpus' overlays: bind them in, as the
# driver's own files would be there.
BindReadOnlyPaths=/proc/driver /proc/devices
EOF
    if cmp -s "$dropin.new" "$dropin"; then
        rm -f "$dropin.new"
        _nvml_dropin_written=0
    else
        mv "$dropin.new" "$dropin"
        _nvml_dropin_written=1
    fi
}

# shellcheck disable=SC2120 # N is optional
gpuctld_setup() {
    local n=${1:-4}
    fake_gpus "$n"
    fake_mps_control
    fake_nvml_state H100-SXM5-80GB "$n"
    gpuctld_use_fake_nvml
    mkdir -p /etc/gpuctl/policy.d
    # After a group reset that kept the drop-in, systemd has it loaded already, unless the
    # scenario wrote a drop-in of its own (NeedDaemonReload). That alone is not enough: systemd
    # caches the unit directories at a reload and misses a drop-in directory created since.
    if [ "${_nvml_dropin_written:-1}" = 1 ] ||
        [ "$(systemctl show -P NeedDaemonReload gpuctld.service)" != no ] ||
        ! systemctl show -P DropInPaths gpuctld.service |
        grep -qF /etc/systemd/system/gpuctld.service.d/50-vmtest-nvml.conf; then
        systemctl daemon-reload
    fi
}

test_users() {
    getent group ml-infer >/dev/null || groupadd ml-infer
    getent group ml-train >/dev/null || groupadd ml-train
    id alice >/dev/null 2>&1 || useradd -m -s /bin/bash -G ml-infer alice
    id bob >/dev/null 2>&1 || useradd -m -s /bin/bash bob
    id carol >/dev/null 2>&1 || useradd -m -s /bin/bash -G ml-train carol
}

status_text() { systemctl show -P StatusText gpuctld.service; }

# The StatusText forms, as src/dbus_api/reply.rs (ReconcileReport::summary) and src/daemon/mod.rs
# write them; tests/vm_status.rs runs these predicates on the real texts:
#   "N teams, M GPUs converged"
#   "N teams, M GPUs: not converged, K change(s) waiting, first: ..."
#   "N teams, M GPUs: K error(s), first: ..."
#   "policy error in WHERE — last good policy in force" (or "— no good policy yet, nothing applied")
# Match a whole form, never a word: "not converged" contains "converged".
is_converged() {
    local re='^([0-9]+) teams, ([0-9]+) GPUs converged$'
    [[ $1 =~ $re ]] || return 1
    [ -z "${2:-}" ] || [ "${BASH_REMATCH[1]}" = "$2" ] || return 1
    [ -z "${3:-}" ] || [ "${BASH_REMATCH[2]}" = "$3" ]
}
is_not_converged() { [[ $1 =~ ^[0-9]+\ teams,\ [0-9]+\ GPUs:\ not\ converged,\ [0-9]+\ change\(s\)\ waiting ]]; }
is_policy_error() { [[ $1 =~ ^policy\ error\ in\ .+\ —\ (last\ good\ policy\ in\ force|no\ good\ policy\ yet) ]]; }
# shellcheck disable=SC2120 # TEAMS and GPUS are optional
status_converged() { is_converged "$(status_text)" "$@"; }
wait_converged() {
    local secs=$1
    shift
    wait_for "$secs" status_converged "$@" && return 0
    echo "not converged after ${secs} s: $(status_text)"
    return 1
}

wait_for() {
    local start=$SECONDS end=$((SECONDS + $1)) pause
    shift
    # A deadline, not a count of tries: under TCG one try (a jq, a busctl) can take a second.
    # The pause grows with the wait. A try costs CPU that the awaited work needs (two vCPUs
    # under TCG): in 97, a try every 0.1 s through a minute-long Ansible play was some 200
    # systemctl runs beside it. A short wait keeps 0.1 s resolution; a long one needs no more
    # than a second's.
    while [ $SECONDS -lt $end ]; do
        "$@" && return 0
        case $((SECONDS - start)) in
            [0-2]) pause=0.1 ;;
            [3-9]) pause=0.3 ;;
            *) pause=1 ;;
        esac
        sleep $pause
    done
    "$@"
}

probe() {
    local out
    out=$(systemd-run --wait --pipe -q --slice="$1" bash -c "exec 3<>$2" 2>&1)
    case $out in
        *"No such device or address"*) echo ENXIO ;;
        *"Operation not permitted"*) echo EPERM ;;
        "") echo OK ;;
        *) echo "other: $out" ;;
    esac
}

# Usage every 0.5 s too: idle rules with windows of seconds act on time.
idle_sampling_fast() {
    mkdir -p /etc/systemd/system/gpuctld.service.d
    cat >/etc/systemd/system/gpuctld.service.d/60-vmtest-idle.conf <<'EOF'
[Service]
Environment=GPUCTL_IDLE_INTERVAL_MS=2000 GPUCTL_USAGE_INTERVAL_MS=500
EOF
    systemctl daemon-reload
}

put_policy() {
    cat >"/etc/gpuctl/policy.d/.$1.tmp" && mv "/etc/gpuctl/policy.d/.$1.tmp" "/etc/gpuctl/policy.d/$1"
}

gpuctld_start() {
    systemctl restart gpuctld.service
}

# systemd 252 ends the reload job when ExecReload's kill returns, before the reconcile ran.
_agent_prop() {
    busctl get-property org.gpuctl.Agent1 /org/gpuctl/Agent1 org.gpuctl.Agent1 "$1" | cut -d' ' -f2
}
_reconciled_since() { [ "$(_agent_prop LastReconcileStartUsec)" -gt "$1" ] && [ "$(_agent_prop Reconciling)" = false ]; }
reload_wait() {
    local t
    t=$(date +%s%6N)
    systemctl reload gpuctld.service
    wait_for 30 _reconciled_since "$t"
}

# shellcheck disable=SC2120 # extra journalctl matches are optional
gpuctld_journal() {
    journalctl -u gpuctld.service -o cat --no-pager --since "@${VMTEST_SCENARIO_START:-0}" "$@"
}
# journal_has REGEX: gpuctld logged a line matching REGEX in this scenario (for wait_for).
journal_has() { gpuctld_journal | grep -q -- "$1"; }

# shell_setup: the gpuctl shell/run scenarios' host: 4 fake GPUs, alice/bob/carol, teams infer
# (@ml-infer, GPU 0), train (@ml-train and alice, GPU 1) and empty (alice, no GPU); gpuctld
# restarted on it.
shell_setup() {
    gpuctld_setup 4
    test_users
    put_policy 60-shell.toml <<'P'
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
    gpuctld_start
    check "gpuctld converged on the shell host (3 teams, 2 GPUs)" wait_converged 20 3 2
}

# as USER CMD: run CMD (a shell string) as USER through a login-less su; prints output, keeps rc.
as() {
    local u=$1
    shift
    su -s /bin/sh "$u" -c "$*"
}

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

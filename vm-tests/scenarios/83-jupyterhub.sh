#!/bin/bash
# 83: notebooks in team shares (docs/jupyterhub.md). Debian's JupyterHub 3.0 with
# jupyterhub-systemdspawner (PyPI, pinned in the image) and the GpuctlSpawner the package ships,
# started by Debian's jupyterhub.service with the shipped config and driven through the hub's
# REST API with a service token. Two fake H100s: GPU 0 cut into two 1g.10gb instances for team
# infer (one job per device, an idle stop rule), GPU 1 whole for train. alice (infer through
# her group, train by name) spawns a server for infer: its unit runs in gpu-infer.slice, its job
# scope there holds a lease in her name on one MIG device, its environment names that device
# only, and it opens its own cap nodes and not train's GPU. A team she is not in is refused,
# naming hers; bob (no team) is refused (the default) and no unit starts. The idle rule stops
# her GPU-idle server, the hub reports it stopped and the lease is gone; her next spawn gets a
# device again, and stopping it through the hub ends that lease. Dropped from train, alice is not
# spawned on a last choice that is no longer hers: her form offers infer alone. With no_team =
# "cpu", bob gets a server outside every share, CUDA_VISIBLE_DEVICES empty, no lease.
# vmtest: timeout=480
# vmtest: group=usage
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

gpuctld_setup 2
test_users
idle_sampling_fast
# policy TRAIN_MEMBERS: the policy, train's members as given.
policy() {
    cat <<P
version = 1
[teams.infer]
members = ["@ml-infer"]
[teams.infer.idle]
after = "10s"
action = "stop"
grace = "5s"
[teams.train]
members = [$1]
# Not alice's: the form and the refusal list her teams, not all of them.
[teams.research]
members = ["carol"]
[[gpu]]
index = [0]
mig = [{ profile = "1g.10gb", owner = "infer", count = 2 }]
[[gpu]]
index = [1]
owner = "train"
P
}
policy '"alice", "carol"' | put_policy 83-jupyterhub.toml
gpuctld_start
check "gpuctld converged" wait_converged 60 3 2

SHIPPED=/usr/share/gpuctl/jupyterhub
check "the package ships the spawner and its config" \
    test -s "$SHIPPED/gpuctl_spawner.py" -a -s "$SHIPPED/jupyterhub_config.py"

# The notebook command: reports what the server's process may open, then becomes the server.
d=/tmp/83-nb
mkdir -p "$d"
chmod 1777 "$d"
cat >/usr/local/bin/vmtest-notebook <<'J'
#!/bin/bash
out=/tmp/83-nb/$(id -un).$$
{
    echo "DEV=$CUDA_VISIBLE_DEVICES"
    echo "CGROUP=$(cat /proc/self/cgroup)"
    for n in /dev/nvidia1 /dev/nvidia-caps/nvidia-cap*; do
        case $( (exec 3<"$n") 2>&1 ) in
            *"No such device or address"*) echo "OPEN $n" ;;
            *"Operation not permitted"*) echo "DENY $n" ;;
            *) echo "MODE $n" ;;
        esac
    done
} >"$out.tmp"
mv "$out.tmp" "$out"
exec jupyterhub-singleuser "$@"
J
chmod 755 /usr/local/bin/vmtest-notebook

# The shipped config as docs/jupyterhub.md says (copied), then this hub's own lines.
TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
mkdir -p /etc/jupyterhub /var/lib/jupyterhub
cp "$SHIPPED/jupyterhub_config.py" /etc/jupyterhub/jupyterhub_config.py
cat >>/etc/jupyterhub/jupyterhub_config.py <<EOF
c.JupyterHub.bind_url = "http://127.0.0.1:8000"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.services = [{"name": "vmtest", "api_token": "$TOKEN", "admin": True}]
c.Spawner.cmd = ["/usr/local/bin/vmtest-notebook"]
# Python starts slowly under TCG.
c.Spawner.start_timeout = 240
c.Spawner.http_timeout = 240
c.Spawner.poll_interval = 3
# No PAM session (a logind session per login) for the form check's login.
c.PAMAuthenticator.open_sessions = False
EOF
mkdir -p /etc/systemd/system/jupyterhub.service.d
cat >/etc/systemd/system/jupyterhub.service.d/50-gpuctl.conf <<'EOF'
[Service]
ExecStart=
ExecStart=/usr/bin/python3 -m jupyterhub.app -f /etc/jupyterhub/jupyterhub_config.py --upgrade-db
EOF
systemctl daemon-reload
systemctl start jupyterhub.service

# hub METHOD PATH [JSON]: "STATUS BODY" of a hub URL path, as the vmtest service (an admin).
hub() {
    python3 - "$TOKEN" "$@" <<'PY'
import sys, urllib.request, urllib.error
token, method, path = sys.argv[1:4]
data = sys.argv[4].encode() if len(sys.argv) > 4 else None
req = urllib.request.Request("http://127.0.0.1:8000" + path, data=data, method=method,
                             headers={"Authorization": "token " + token})
try:
    with urllib.request.urlopen(req, timeout=60) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
except OSError as e:
    print(0, e)
PY
}
# api METHOD PATH [JSON]: the same for the REST API.
api() { hub "$1" "/hub/api$2" "${@:3}"; }
# shellcheck disable=SC2317 # called through wait_for and check
hub_up() { api GET / | grep -q '^200 '; }
check "JupyterHub answers its REST API" wait_for 120 hub_up
journalctl -u jupyterhub.service --no-pager | tail -n 5 | sed 's/^/    hub| /'
for u in alice bob; do api POST "/users/$u" >/dev/null; done
# server_of USER: the user's default server as JSON (null when none).
# shellcheck disable=SC2317 # called through ready and stopped
server_of() { api GET "/users/$1" | sed 's/^[0-9]* //' | jq -c '.servers[""] // null'; }
# shellcheck disable=SC2317 # called through wait_for and check
ready() { test "$(server_of "$1" | jq -r '.ready // false')" = true; }
# shellcheck disable=SC2317 # called through wait_for and check
stopped() { test "$(server_of "$1")" = null; }
# no_lease REGEX: gpuctl status answered and lists no lease line matching REGEX.
# shellcheck disable=SC2317 # called through wait_for and check
no_lease() {
    local st
    st=$(gpuctl status 2>&1)
    grep -q '^leases:$' <<<"$st" && ! grep -q -- "$1" <<<"$st"
}
UNIT=jupyter-alice-singleuser.service

# The spawn page alice sees after logging in (PAM, a password set here) offers her two teams
# (infer through her group, train by name), as gpuctld lists them for her.
echo 'alice:vmtest-83-pw' | chpasswd
# alice_form: the teams alice's spawn page offers, comma-separated (empty: no form).
alice_form() {
    local form
    form=$(python3 - <<'PY'
import http.cookiejar, urllib.parse, urllib.request
o = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
base = "http://127.0.0.1:8000/hub/"
o.open(base + "login", urllib.parse.urlencode({"username": "alice", "password": "vmtest-83-pw"}).encode(), timeout=60)
print(o.open(base + "spawn", timeout=60).read().decode())
PY
)
    grep -o '<select[^>]*name="team"[^>]*>\|<option [^>]*>[^<]*</option>' <<<"$form" | sed 's/^/    form| /' >&2
    grep -o '<option value="[^"]*"' <<<"$form" | cut -d'"' -f2 | paste -sd, -
}
check "alice's spawn form offers exactly her teams, infer and train" test "$(alice_form)" = infer,train

r=$(api POST /users/alice/server '{"team": "infer"}')
echo "    spawn alice/infer: $r"
check "alice's spawn for team infer is taken" grep -Eq '^20[12] ' <<<"$r"
check "her server becomes ready" wait_for 240 ready alice
journalctl -u jupyterhub.service --no-pager | grep -i "gpuctl\|alice" | tail -n 5 | sed 's/^/    hub| /'
systemctl status --no-pager "$UNIT" 2>&1 | head -n 8 | sed 's/^/    | /'
PID=$(systemctl show -P MainPID "$UNIT")
DEV=$(tr '\0' '\n' <"/proc/$PID/environ" | sed -n 's/^CUDA_VISIBLE_DEVICES=//p')
SCOPE=$(sed -nE 's#^0::/gpu.slice/gpu-infer.slice/(gpuctl-run-[0-9a-f]{16}\.scope)$#\1#p' "/proc/$PID/cgroup")
echo "    server: pid $PID, CUDA_VISIBLE_DEVICES=$DEV, cgroup $(cat "/proc/$PID/cgroup")"
check "the server's unit runs in gpu-infer.slice" test "$(systemctl show -P Slice "$UNIT")" = gpu-infer.slice
check "its process is in a gpuctl job scope of the team slice" test -n "$SCOPE"
check "its environment names one MIG device" grep -Eqx 'MIG-[^,]+' <<<"$DEV"
check_output "it holds a lease in alice's name on that device" \
    sh -c "gpuctl status | grep -q '^  infer $DEV: alice (uid [0-9]*) $SCOPE since'"
probe=$(cat "$d"/alice.* 2>/dev/null)
printf '%s\n' "$probe" | sed 's/^/    probe| /'
check "the notebook command saw the same device" grep -qx "DEV=$DEV" <<<"$probe"
check "it cannot open train's GPU" grep -qx 'DENY /dev/nvidia1' <<<"$probe"
check "it opens exactly two cap nodes (its instance's)" test "$(grep -c '^OPEN /dev/nvidia-caps/' <<<"$probe")" = 2

r=$(api POST /users/bob/server)
echo "    spawn bob: $r"
check "bob (no team) is refused" grep -Eq '^(4|5)[0-9][0-9] ' <<<"$r"
check "the refusal says he is in no gpuctl team" grep -q 'in no gpuctl team' <<<"$r"
check_not "no server unit of bob's started" systemctl is-active -q jupyter-bob-singleuser.service

# Idle: the server's process holds GPU memory on its MIG device (as a notebook that loaded a
# model), with no activity: the rule warns and then stops its job scope.
S=$FAKE_NVML_STATE
gi=$(jq -r --arg u "$DEV" '.gpus[0].gpu_instances[] | select(.compute_instances[0].uuid == $u) | .id' "$S")
ci=$(jq -r --arg u "$DEV" '.gpus[0].gpu_instances[] | select(.compute_instances[0].uuid == $u) | .compute_instances[0].id' "$S")
echo "    $DEV: GPU 0 gi$gi ci$ci"
flock "$S.lock" sh -c "jq '.processes += [{pid: $PID, gpu: 0, gi: $gi, ci: $ci, used_memory_mib: 3000}]' '$S' >'$S.new' && mv '$S.new' '$S'"
check "the idle rule stops alice's GPU-idle server and the hub shows it stopped" wait_for 150 stopped alice
gpuctld_journal GPUCTL_ACTION=idle-stop | tail -n 2 | sed 's/^/    journal| /'
check_output "the journal names the stop of her server's job scope" \
    sh -c "journalctl -b --no-pager GPUCTL_ACTION=idle-stop GPUCTL_UNIT=$SCOPE GPUCTL_USER=alice | grep -q ."
check "her lease is gone" wait_for 20 no_lease "$SCOPE"
flock "$S.lock" sh -c "jq '.processes |= map(select(.pid != $PID))' '$S' >'$S.new' && mv '$S.new' '$S'"

rm -f "$d"/alice.*
r=$(api POST /users/alice/server '{"team": "infer"}')
echo "    spawn alice/infer again: $r"
check "her next spawn is ready" wait_for 240 ready alice
PID2=$(systemctl show -P MainPID "$UNIT")
DEV2=$(tr '\0' '\n' <"/proc/$PID2/environ" | sed -n 's/^CUDA_VISIBLE_DEVICES=//p')
SCOPE2=$(sed -nE 's#^0::/gpu.slice/gpu-infer.slice/(gpuctl-run-[0-9a-f]{16}\.scope)$#\1#p' "/proc/$PID2/cgroup")
check "and names one MIG device again" grep -Eqx 'MIG-[^,]+' <<<"$DEV2"
check_output "with a lease in alice's name" \
    sh -c "gpuctl status | grep -q '^  infer $DEV2: alice (uid [0-9]*) $SCOPE2 since'"

r=$(api DELETE /users/alice/server)
echo "    stop alice: $r"
check "stopping it through the hub stops the server" wait_for 60 stopped alice
check "and ends its lease" wait_for 20 no_lease "$SCOPE2"
check_not "the server's unit is gone" systemctl is-active -q "$UNIT"

r=$(api POST /users/alice/server '{"team": "ops"}')
echo "    spawn alice/ops: $r"
check "a team alice is not in is refused, naming hers" grep -q "may not use team 'ops'; yours: infer, train" <<<"$r"
check_not "and no server unit started" systemctl is-active -q "$UNIT"

# The hub keeps her last choice (ops) for a spawn that names none. With one team left (train
# drops her), that stale choice is not reused: she gets the form again, offering infer alone.
policy '"carol"' | put_policy 83-jupyterhub.toml
reload_wait
check "with one team left and a stale last choice, alice's form offers infer alone" \
    test "$(alice_form)" = infer

# The other policy for a user in no team: a CPU-only server, outside every share.
echo 'c.GpuctlSpawner.no_team = "cpu"' >>/etc/jupyterhub/jupyterhub_config.py
systemctl restart jupyterhub.service
check "the hub is back with no_team = cpu" wait_for 120 hub_up
r=$(api POST /users/bob/server)
echo "    spawn bob, no_team = cpu: $r"
check "bob's spawn is taken now" grep -Eq '^20[12] ' <<<"$r"
check "his server becomes ready" wait_for 240 ready bob
BUNIT=jupyter-bob-singleuser.service
BPID=$(systemctl show -P MainPID "$BUNIT")
echo "    bob's server: pid $BPID, slice $(systemctl show -P Slice "$BUNIT"), cgroup $(cat "/proc/$BPID/cgroup")"
check "it runs outside every team's slice" \
    sh -c "! grep -q '/gpu.slice/' /proc/$BPID/cgroup && test '$(systemctl show -P Slice "$BUNIT")' = system.slice"
check "its environment sets CUDA_VISIBLE_DEVICES empty" \
    sh -c "tr '\\0' '\\n' </proc/$BPID/environ | grep -qx 'CUDA_VISIBLE_DEVICES='"
check "and no lease is bob's" no_lease ': bob '
api DELETE /users/bob/server >/dev/null
check "stopping it through the hub stops it" wait_for 60 stopped bob

systemctl stop jupyterhub.service
systemctl stop 'jupyter-*' 2>/dev/null || true
rm -rf /etc/systemd/system/jupyterhub.service.d /etc/systemd/system/gpuctld.service.d/60-vmtest-idle.conf
systemctl daemon-reload
finish

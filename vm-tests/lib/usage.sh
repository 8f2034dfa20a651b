# shellcheck shell=bash
# vm-tests/lib/usage.sh - the usage scenarios' host (85-89), sourced after gpuctld.sh.
#
#   usage_setup        2 fake H100s: GPU 0 whole to infer (@ml-infer: alice), GPU 1 MIG with one
#                      3g.40gb for train (@ml-train: carol); three real guest jobs, infer-job
#                      (alice, gpu-infer.slice), train-job (carol, gpu-train.slice) and
#                      stray-job (root, system.slice), put on the GPUs through the fake NVML's
#                      process list (infer 78000 MiB on GPU 0: over 90% of it; train and the
#                      stray on train's MIG device). Sets P_INFER, P_TRAIN, P_STRAY.
#   http ARGS...       the python HTTP helper below (get URL, query URL EXPR, slots URL N,
#                      burst URL N, ...)
#   gpuctld_wakeups S  context switches of gpuctld's main thread over S seconds: its wakeups
#   exporter_setup     usage_setup, then gpuctld's wakeups over 10 s before anything scrapes
#                      (IDLE_BEFORE), then gpuctl-exporter.socket started; E is its /metrics URL

usage_setup() {
    gpuctld_setup 2
    test_users
    put_policy 85-usage.toml <<'P'
version = 1
[teams.infer]
members = ["@ml-infer"]
[teams.train]
members = ["@ml-train"]
[[gpu]]
index = [0]
owner = "infer"
[[gpu]]
index = [1]
mig = [ { profile = "3g.40gb", owner = "train" } ]
P
    gpuctld_start
    systemd-run -q --unit=infer-job --slice=gpu-infer.slice -p User=alice sleep 900
    systemd-run -q --unit=train-job --slice=gpu-train.slice -p User=carol sleep 900
    systemd-run -q --unit=stray-job sleep 900
    P_INFER=$(systemctl show -P MainPID infer-job.service)
    P_TRAIN=$(systemctl show -P MainPID train-job.service)
    P_STRAY=$(systemctl show -P MainPID stray-job.service)
    local S=$FAKE_NVML_STATE gi ci
    gi=$(jq -r '.gpus[1].gpu_instances[0].id' "$S")
    ci=$(jq -r '.gpus[1].gpu_instances[0].compute_instances[0].id' "$S")
    echo "jobs: infer $P_INFER, train $P_TRAIN, stray $P_STRAY; train's MIG device: GPU 1 gi$gi ci$ci"
    # Under the fake's own lock, as every NVML call takes it.
    flock "$S.lock" sh -c "jq '.processes += [
        {pid: $P_INFER, gpu: 0, used_memory_mib: 78000},
        {pid: $P_TRAIN, gpu: 1, gi: $gi, ci: $ci, used_memory_mib: 4000},
        {pid: $P_STRAY, gpu: 1, gi: $gi, ci: $ci, used_memory_mib: 1000}]' '$S' >'$S.new' && mv '$S.new' '$S'"
    echo "StatusText: $(status_text)"
}

usage_teardown() {
    systemctl stop infer-job.service train-job.service stray-job.service \
        gpuctl-exporter.socket gpuctl-exporter.service vmtest-prometheus.service 2>/dev/null || true
}

# http get URL | http status URL RAW | http alerts URL | http query URL EXPR
# | http bench URL N | http stall URL  (see the python below)
http() {
    python3 - "$@" <<'PY'
import json, socket, sys, time, urllib.parse, urllib.request
cmd, url = sys.argv[1], sys.argv[2]
u = urllib.parse.urlsplit(url)
host, port = u.hostname, u.port or 80

def raw(req, timeout=10):
    s = socket.create_connection((host, port), timeout=timeout)
    s.sendall(req)
    out = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
    s.close()
    return out

if cmd == "get":
    print(urllib.request.urlopen(url, timeout=10).read().decode())
elif cmd == "status":
    print(raw(sys.argv[3].encode().decode("unicode_escape").encode("latin1")).split(b"\r\n")[0].decode())
elif cmd == "query":
    q = urllib.parse.urlencode({"query": sys.argv[3]})
    r = json.load(urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10))
    print(json.dumps(r["data"]["result"]))
elif cmd == "alerts":
    r = json.load(urllib.request.urlopen(f"{url}/api/v1/alerts", timeout=10))
    print(json.dumps(r["data"]["alerts"]))
elif cmd == "bench":
    n, t = int(sys.argv[3]), []
    req = f"GET {u.path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    for _ in range(n):
        a = time.perf_counter()
        r = raw(req)
        t.append(time.perf_counter() - a)
        assert r.startswith(b"HTTP/1.1 200") or r.startswith(b"HTTP/1.0 200"), r[:80]
    t.sort()
    print(f"{t[len(t)//2]*1e3:.2f} {t[int(len(t)*0.99)]*1e3:.2f}")
elif cmd == "stall":
    # Five clients that never finish their request, then a real scrape: its time in ms.
    idle = [socket.create_connection((host, port)) for _ in range(5)]
    idle[0].sendall(b"GET /metr")
    a = time.perf_counter()
    r = raw(f"GET {u.path} HTTP/1.1\r\n\r\n".encode())
    line = r.split(b"\r\n")[0].decode()
    print(f"{(time.perf_counter()-a)*1e3:.0f} {line}")
    for s in idle:
        s.close()
elif cmd == "slots":
    # N clients that connect and send nothing, then a real scrape: its status line.
    idle = [socket.create_connection((host, port)) for _ in range(int(sys.argv[3]))]
    time.sleep(0.5)
    try:
        print(raw(f"GET {u.path} HTTP/1.1\r\n\r\n".encode()).split(b"\r\n")[0].decode())
    except OSError as e:
        print(f"error {e!r}")
    for s in idle:
        s.close()
elif cmd == "burst":
    # N scrapes at once: how many got a whole 200, a whole 503, a reset, a cut answer, another error.
    import threading
    res = []
    def one():
        try:
            r = raw(f"GET {u.path} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), timeout=60)
        except ConnectionResetError:
            return res.append("reset")
        except OSError:
            return res.append("error")
        head, _, body = r.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        cl = [int(l.split(b":")[1]) for l in lines[1:] if l.lower().startswith(b"content-length:")]
        whole = bool(cl) and len(body) == cl[0]
        st = lines[0][9:12].decode(errors="replace")
        res.append(st if whole and st in ("200", "503") else "cut")
    ts = [threading.Thread(target=one) for _ in range(int(sys.argv[3]))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(" ".join(f"{k}={res.count(k)}" for k in ["200", "503", "reset", "cut", "error"]))
PY
}

gpuctld_wakeups() {
    local pid c0
    pid=$(systemctl show -P MainPID gpuctld.service)
    # Voluntary + involuntary switches of the main thread (/proc/PID/status is per task).
    _switches() { awk '/ctxt_switches/ {s += $2} END {print s}' "/proc/$pid/status"; }
    c0=$(_switches)
    sleep "$1"
    echo $(($(_switches) - c0))
}

exporter_setup() {
    usage_setup
    sleep 2
    # shellcheck disable=SC2034 # IDLE_BEFORE and E are read by the scenarios (87, 89)
    IDLE_BEFORE=$(gpuctld_wakeups 10)
    systemctl start gpuctl-exporter.socket
    # shellcheck disable=SC2034
    E=http://127.0.0.1:9849/metrics
}

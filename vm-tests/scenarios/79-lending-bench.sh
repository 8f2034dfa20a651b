#!/bin/bash
# 79 (benchmark): what lending buys on a day of jobs. Six fake GPUs, two per team
# (train, interns, research); the compressed day of lib/lending-trace.tsv (why that day: its
# header) is replayed twice in this guest: lending off (no lend tables, no --borrow), then on
# (every team lends to all, after 1 s, grace 2 s; every job asks with --borrow). Each job is
# `gpuctl run --wait` of a script that holds its device for the job's time (a sleep: the fake
# NVML has no activity to make), records when it started, on which device, lent by whom, and
# traps SIGTERM (a notice) to record it and stop; a reclaimed job asks again for what it had
# left. Reported side by side (BENCH): device utilisation (device-time held by jobs / device-time
# of the 6 GPUs over the day), jobs completed, queue wait p50/p95 per team, the owners' reclaim
# latency (request to job start when a loan was taken back for it), kills without notice and
# two-team openings (a device leased to two teams in samples of the lease records, or two teams'
# job intervals overlapping on one device). Goals (printed, met or missed): utilisation >= 1.8x
# the static run, reclaim p95 <= grace + 2 s, each team's jobs completed and wait p95 within 10%
# of static. Asserted: no kill without notice, no two-team opening, every team ran on its own
# share, and with lending a borrowed job ran and was taken back with notice for its owner.
# Short (a full run, CI): the lending run over the day's first two hours, where research's
# 17:00 jobs take back the GPUs train and interns borrowed at 16:00.
# vmtest: timeout=780
# vmtest: group=own
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

TRACE=lib/lending-trace.tsv
H=10                               # seconds per simulated hour
SPAN_H=$(bench_size 24 2)          # simulated hours replayed
MODES=$(bench_size "off on" "on")  # lending off, then on
WAIT=$((H * 3 / 2))                # a request waits 1.5 simulated hours at most, then gives up
AFTER=1 GRACE=2
NDEV=6
declare -A USER_OF=([train]=carol [interns]=bob [research]=alice)

gpuctld_setup $NDEV
test_users
# policy on|off
policy() {
    cat <<P
version = 1
[teams.train]
members = ["carol"]
[teams.interns]
members = ["bob"]
[teams.research]
members = ["alice"]
[[gpu]]
index = [0, 1]
owner = "train"
[[gpu]]
index = [2, 3]
owner = "interns"
[[gpu]]
index = [4, 5]
owner = "research"
P
    [ "$1" = on ] || return 0
    for t in train interns research; do
        printf '[teams.%s.lend]\nto = "all"\nafter = "%ss"\ngrace = "%ss"\n' "$t" "$AFTER" "$GRACE"
    done
}

BASE=$(mktemp -d)
chmod 755 "$BASE"
# The job: job DIR ID SECONDS. Holds its device SECONDS; records its start (time, device, lender)
# and its end; on SIGTERM (a loan's notice) records it, "checkpoints" for 0.3 s and exits.
# Placed after the replay's cut-off, it only says so.
cat >"$BASE/job" <<'J'
#!/bin/bash
d=$1 id=$2
now() { date +%s.%N; }
if [ -e "$d/cutoff" ]; then now >"$d/$id.late"; exit 0; fi
echo "$(now) ${CUDA_VISIBLE_DEVICES:-none} ${GPUCTL_BORROWED_FROM:--}" >"$d/$id.start"
trap 'now >"$d/$id.term"; kill "$pid" 2>/dev/null; sleep 0.3; now >"$d/$id.end"; exit 143' TERM
sleep "$3" &
pid=$!
wait "$pid"
now >"$d/$id.end"
: >"$d/$id.done"
J
chmod 755 "$BASE/job"

# submit DIR JOB TEAM SECONDS BORROW: the user's request; a job taken back asks again for what it
# had left, until the replay's cut-off. setpriv, not su: su's PAM session starts the user's
# systemd manager, seconds of CPU under TCG that the replay's clock would pay for.
submit() {
    local dir=$1 j=$2 team=$3 left=$4 borrow=$5 k=0 a s t user=${USER_OF[$3]}
    while [ ! -e "$dir/cutoff" ]; do
        k=$((k + 1))
        a=$j-$team-$k
        setpriv --reuid="$user" --regid="$user" --init-groups \
            sh -c "date +%s.%N >$dir/$a.req; exec gpuctl run --team $team $borrow --wait=${WAIT}s -- $BASE/job $dir $a $left" \
            >"$dir/$a.out" 2>&1
        echo $? >"$dir/$a.rc"
        if [ ! -e "$dir/$a.term" ] || [ -e "$dir/$a.done" ]; then break; fi
        read -r s _ <"$dir/$a.start"
        t=$(cat "$dir/$a.term")
        left=$(awk -v l="$left" -v s="$s" -v t="$t" 'BEGIN { r = l - (t - s); printf "%.1f", (r > 0.5 ? r : 0.5) }')
    done
}

# sampler DIR: every 2 s, the devices leased to two teams at once: the lease records
# (/run/gpuctl/leases, what `gpuctl status` lists) of the live job scopes. Read here, not through
# `gpuctl status`: a Status call every 3 s (each took seconds under TCG) slowed the placements
# the replay measures.
sampler() {
    local units u
    while [ ! -e "$1/cutoff" ]; do
        units=$(systemctl list-units --state=active --plain --no-legend 'gpuctl-run-*.scope' | awk '{print $1}')
        for u in $units; do cat "/run/gpuctl/leases/$u.json" 2>/dev/null; echo; done |
            jq -rs '[.[] | .team as $t | .devices[] | {d: ., t: $t}]
                | group_by(.d)[] | select((map(.t) | unique | length) > 1) | "\(.[0].d) \(map(.t) | unique | join(","))"' \
                >>"$1/two-team" && echo >>"$1/samples"
        sleep 2
    done
}

sleep_until() { local s; s=$(awk -v t="$1" -v n="$(date +%s.%N)" 'BEGIN { d = t - n; printf "%.3f", (d > 0 ? d : 0) }'); sleep "$s"; }

# replay MODE: the trace's first SPAN_H hours, lending off or on; results in $BASE/MODE.
replay() {
    local mode=$1 dir=$BASE/$1 borrow='' t0 hh mm team hours m n=0 spid pids=()
    [ "$mode" = on ] && borrow=--borrow
    mkdir -p "$dir"
    chmod 777 "$dir"
    t0=$(date +%s.%N)
    echo "$t0" >"$dir/t0"
    sampler "$dir" &
    spid=$!
    while read -r m team hours; do
        n=$((n + 1))
        echo "$n $team" >>"$dir/jobs"
        sleep_until "$(awk -v t="$t0" -v m="$m" -v h=$H 'BEGIN { printf "%.3f", t + m * h / 60 }')"
        submit "$dir" "$(printf %02d $n)" "$team" "$(awk -v x="$hours" -v h=$H 'BEGIN { printf "%.1f", x * h }')" "$borrow" </dev/null &
        pids+=($!)
    done < <(grep -v '^#' "$TRACE" | while read -r at team hours; do
        hh=${at%:*} mm=${at#*:}
        m=$(((10#$hh * 60 + 10#$mm - 16 * 60 + 1440) % 1440))
        [ $m -lt $((SPAN_H * 60)) ] && echo "$m $team $hours"
    done | sort -n -k1,1 -s)
    sleep_until "$(awk -v t="$t0" -v s="$SPAN_H" -v h=$H 'BEGIN { printf "%.3f", t + s * h }')"
    # The day is over: what still runs is cut (its SIGTERM comes after the cut-off, no notice of
    # a loan); what still waits gives up within its wait.
    date +%s.%N >"$dir/cutoff"
    systemctl kill -s TERM 'gpuctl-run-*.scope' 2>/dev/null
    wait "$spid"
    for p in "${pids[@]}"; do wait "$p"; done
    systemctl kill -s KILL 'gpuctl-run-*.scope' 2>/dev/null
    wait_for 20 sh -c "gpuctl status --json | jq -e '(.leases | length) == 0 and (.queue | length) == 0' >/dev/null"
    journalctl -u gpuctld.service -o cat --no-pager --since "@${t0%.*}" >"$dir/journal"
    cp -r "$dir" "$VMTEST_RESULTS/$mode"
}

# analyse MODE: the figures of a replay, as shell assignments (python3 comes with ansible-core).
analyse() {
    python3 - "$BASE/$1" "$SPAN_H" "$H" "$GRACE" "$WAIT" "$NDEV" <<'PY'
import glob, os, re, sys
d, span_h, h, grace, wait, ndev = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
rd = lambda p: open(p).read().split() if os.path.exists(p) else None
t0 = float(rd(d + "/t0")[0]); cut = float(rd(d + "/cutoff")[0]); end = t0 + span_h * h
teams = ["train", "interns", "research"]
jobs = {}
for l in open(d + "/jobs"):
    n, t = l.split(); jobs["%02d" % int(n)] = t
att = []
for p in sorted(glob.glob(d + "/*.req")):
    a = os.path.basename(p)[:-4]
    j, team, k = a.split("-")
    r = dict(id=a, job=j, team=team, req=float(rd(p)[0]))
    s = rd(d + "/" + a + ".start")
    if s: r.update(start=float(s[0]), dev=s[1], lender=s[2])
    for f in ("term", "end"):
        v = rd(d + "/" + a + "." + f)
        if v: r[f] = float(v[0])
    r["done"] = os.path.exists(d + "/" + a + ".done")
    rc = rd(d + "/" + a + ".rc"); r["rc"] = int(rc[0]) if rc else None
    att.append(r)
out = {}
def q(xs, p):
    if not xs: return "-"
    xs = sorted(xs); return "%.1f" % xs[min(len(xs) - 1, int(p * len(xs)))]
# Device-time held within the day: start to end; a job stopped without its own end record at
# its notice + grace; one with neither, to the cut-off (and counted below).
held = 0.0; nonotice = []; iv = {}
for r in att:
    if "start" not in r: continue
    e = r.get("end") or (r["term"] + grace if "term" in r else cut)
    if "end" not in r and "term" not in r and not r["done"]: nonotice.append(r["id"])
    held += max(0.0, min(e, end) - max(r["start"], t0))
    for dev in r["dev"].split(","):
        iv.setdefault(dev, []).append((r["start"], e, r["team"], r["id"]))
out["util"] = "%.1f" % (100 * held / (ndev * span_h * h))
out["nonotice"] = len(nonotice); out["nonotice_ids"] = ",".join(nonotice)
# Two teams' jobs on one device at overlapping times.
ov = 0
for dev, xs in iv.items():
    xs.sort()
    for i, a in enumerate(xs):
        for b in xs[i + 1:]:
            if b[0] < a[1] and b[2] != a[2]: ov += 1
out["overlaps"] = ov
done = {t: 0 for t in teams}; total = {t: 0 for t in teams}
for j, t in jobs.items(): total[t] += 1
for j in {r["job"] for r in att if r["done"]}: done[jobs[j]] += 1
out["done"] = sum(done.values()); out["total"] = sum(total.values())
for t in teams:
    # A request's wait: to its start, or its whole wait when it gave up (exit 8); one still
    # waiting at the cut-off is left out.
    ws = [r["start"] - r["req"] for r in att if r["team"] == t and "start" in r]
    gave = [r for r in att if r["team"] == t and "start" not in r and r["rc"] == 8]
    ws += [wait] * len(gave)
    out[t + "_done"] = "%d/%d" % (done[t], total[t]); out[t + "_gave"] = len(gave)
    out[t + "_p50"] = q(ws, 0.5); out[t + "_p95"] = q(ws, 0.95)
    out[t + "_own"] = sum(1 for r in att if r["team"] == t and r.get("lender") == "-")
    out[t + "_borrowed"] = sum(1 for r in att if r["team"] == t and r.get("lender") not in (None, "-"))
# Loans taken back before the cut-off, and the owner requests they were taken back for: an own
# job whose device's borrower got SIGTERM between the owner's request and its start.
bor = [r for r in att if r.get("lender") not in (None, "-")]
pre = [r for r in bor if "term" in r and r["term"] < cut]
lat = []
for a in att:
    if a.get("lender") != "-": continue
    if any(b["dev"] == a["dev"] and a["req"] <= b["term"] <= a["start"] for b in pre):
        lat.append(a["start"] - a["req"])
out["borrowed"] = len(bor); out["reclaimed"] = len(pre); out["reclaims"] = len(lat)
out["reclaim_p50"] = q(lat, 0.5); out["reclaim_p95"] = q(lat, 0.95)
out["reclaim_max"] = "%.1f" % max(lat) if lat else "-"
out["noticed_ok"] = sum(1 for b in pre if "end" in b)
js = open(d + "/journal").read() if os.path.exists(d + "/journal") else ""
back = [int(x) for x in re.findall(r"is back with \S+ \((\d+) ms after the notice\)", js)]
out["journal_back"] = len(back); out["journal_back_p95"] = q([b / 1000 for b in back], 0.95)
out["journal_reclaim"] = len(re.findall(r"^taking back ", js, re.M))
out["journal_stop"] = len(re.findall(r"^the grace of borrowed job ", js, re.M))
out["failed"] = ",".join("%s:%s" % (r["id"], r["rc"]) for r in att if r["rc"] not in (0, 8, 143, None))
s = open(d + "/samples").read().count("\n") if os.path.exists(d + "/samples") else 0
tt = open(d + "/two-team").read().splitlines() if os.path.exists(d + "/two-team") else []
out["samples"] = s; out["two_team"] = len(tt)
for k, v in out.items(): print("%s=%s" % (k, v))
PY
}

declare -A R
for mode in $MODES; do
    policy "$mode" | put_policy 79-lending-bench.toml
    if [ -z "${started:-}" ]; then gpuctld_start; started=1; else reload_wait; fi
    check "gpuctld converged, lending $mode (3 teams, $NDEV GPUs)" wait_converged 60 3 $NDEV
    if [ "$mode" = on ]; then
        check "lending on: gpu-loans.slice is active" systemctl is-active -q gpu-loans.slice
    else
        check "lending off: no loans slice" sh -c "! systemctl is-active -q gpu-loans.slice"
    fi
    echo "    replaying ${SPAN_H} simulated hours at ${H} s/h, lending $mode"
    replay "$mode"
    while IFS='=' read -r k v; do R[$mode.$k]=$v; done < <(analyse "$mode")
    for k in util 'done' total borrowed reclaimed reclaims reclaim_p95 nonotice overlaps two_team samples journal_reclaim journal_back journal_stop failed; do
        printf '    %s %s=%s\n' "$mode" "$k" "${R[$mode.$k]}"
    done
    check "lending $mode: every request ran, waited or gave up (none failed otherwise)" test -z "${R[$mode.failed]}"
    check "lending $mode: no kill without notice (${R[$mode.nonotice_ids]:-none})" test "${R[$mode.nonotice]}" = 0
    check "lending $mode: the leases were sampled (${R[$mode.samples]} times)" test "${R[$mode.samples]}" -gt 0
    check "lending $mode: no device leased to two teams in those samples" test "${R[$mode.two_team]}" = 0
    check "lending $mode: no two teams' jobs overlap on a device" test "${R[$mode.overlaps]}" = 0
done

if [ "${R[off.util]:-}" ]; then
    for t in train interns research; do
        check "lending off: team $t ran on its own share" test "${R[off.${t}_own]}" -gt 0
    done
fi
check "lending on: jobs ran on borrowed GPUs (${R[on.borrowed]})" test "${R[on.borrowed]}" -gt 0
check "lending on: loans were taken back for their owners (${R[on.reclaims]} owner jobs)" test "${R[on.reclaims]}" -gt 0
check "... each borrower got its notice and stopped by itself (${R[on.noticed_ok]}/${R[on.reclaimed]})" \
    test "${R[on.noticed_ok]}" = "${R[on.reclaimed]}"
check "... the journal names the reclaims (${R[on.journal_reclaim]})" test "${R[on.journal_reclaim]}" -gt 0
check "... and the loans back (${R[on.journal_back]})" test "${R[on.journal_back]}" -gt 0
check "gpuctld still active" systemctl is-active --quiet gpuctld.service

# The figures, lending off against on (a short run has the lending run alone).
v() { echo "${R[$1]:--}"; }
# goal EXPR: met or MISSED; n/a where a figure is missing (a short run has no static run).
goal() {
    case " $1 " in *" - "*) echo n/a; return ;; esac
    if awk "BEGIN { exit !($1) }" 2>/dev/null; then echo met; else echo MISSED; fi
}
echo "BENCH lending trace: ${SPAN_H} simulated h at ${H} s/h, $NDEV GPUs (2 per team), $(v on.total) jobs, wait ${WAIT} s, after ${AFTER} s, grace ${GRACE} s"
ratio=-
[ "$(v off.util)" != - ] && ratio=$(awk -v a="$(v on.util)" -v b="$(v off.util)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
echo "BENCH lending utilisation (held/available): off $(v off.util)% on $(v on.util)%, ${ratio}x (goal >= 1.8x: $(goal "$ratio >= 1.8"))"
echo "BENCH lending jobs completed: off $(v off.done)/$(v off.total) on $(v on.done)/$(v on.total); borrowed runs $(v on.borrowed), taken back $(v on.reclaimed)"
owners=met
for t in train interns research; do
    echo "BENCH lending $t: completed off $(v off.${t}_done) on $(v on.${t}_done); wait p50/p95 off $(v off.${t}_p50)/$(v off.${t}_p95) s on $(v on.${t}_p50)/$(v on.${t}_p95) s; gave up off $(v off.${t}_gave) on $(v on.${t}_gave); borrowed $(v on.${t}_borrowed)"
    [ "$(v off.util)" = - ] && owners=- && continue
    don=${R[on.${t}_done]%/*} doff=${R[off.${t}_done]%/*}
    [ "$(goal "$don >= 0.9 * $doff && $(v on.${t}_p95) <= 1.1 * $(v off.${t}_p95)")" = met ] || owners="MISSED ($t)"
done
echo "BENCH lending owner reclaim latency (owner request to its job's start): p50 $(v on.reclaim_p50) s p95 $(v on.reclaim_p95) s max $(v on.reclaim_max) s over $(v on.reclaims) (goal p95 <= grace + 2 s = $((GRACE + 2)) s: $(goal "$(v on.reclaims) > 0 && $(v on.reclaim_p95) <= $GRACE + 2")); journal: $(v on.journal_reclaim) notices, $(v on.journal_back) loans back (notice to back p95 $(v on.journal_back_p95) s), $(v on.journal_stop) stopped at the grace's end"
echo "BENCH lending owners' jobs completed >= 90% and wait p95 <= 110% of static, per team: $owners"
echo "BENCH lending kills without notice: off $(v off.nonotice) on $(v on.nonotice) (must be 0)"
echo "BENCH lending two-team openings: off $(v off.two_team) in $(v off.samples) lease samples, $(v off.overlaps) overlapping job intervals; on $(v on.two_team) in $(v on.samples), $(v on.overlaps) (must be 0)"
finish

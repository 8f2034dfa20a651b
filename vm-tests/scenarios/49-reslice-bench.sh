#!/bin/bash
# 49 (benchmark): what layouts that follow demand buy on a day of mixed-size jobs. Two fake
# H100s; by day interns send a burst of small jobs (`--profile 1g.10gb`), by night train sends
# large ones (`--profile 3g.40gb`). Replayed twice in this guest: fixed layouts (the compromise an
# admin writes once: GPU 0 seven 1g.10gb for interns, GPU 1 two 3g.40gb for train), then with
# each GPU allowed both shapes (same defaults; `[[gpu.layout]]` gives GPU 0 train's and GPU 1
# interns' shape; after 1 s, hold 10 s). Each job is `gpuctl run --wait` of a script that holds
# its device for the job's time and records when it started and on which device. Reported side
# by side (BENCH): jobs completed, wait p50/p95 by size, the time the last job ended, compute
# utilisation (job-time x the instance's compute slices / the two GPUs' 14 slices over the span)
# and the re-slices (journal). Asserted: every job ran to its end on a device of the profile it
# asked for, the fixed run switched nothing, and the other one switched at least once.
# Short (a full run, CI): the layouts run alone with a smaller trace.
# vmtest: timeout=900
# vmtest: group=own
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

SMALL=$(bench_size 14 4)             # by day: 1g.10gb jobs, all at once
LARGE=$(bench_size 4 2)              # by night: 3g.40gb jobs, all at once
DAY_S=$(bench_size 20 8)             # a small job's seconds
NIGHT_S=$(bench_size 25 8)           # a large job's seconds
NIGHT_AT=$(bench_size 60 25)         # when the night's jobs come, seconds from the start
MODES=$(bench_size "fixed layouts" "layouts")  # two runs: fixed, then layouts
WAIT=300
HOLD=10

gpuctld_setup 2
test_users
# policy fixed|layouts
policy() {
    cat <<P
version = 1
[teams.interns]
members = ["bob"]
[teams.train]
members = ["carol"]
[[gpu]]
index = [0]
mig = [{ profile = "1g.10gb", owner = "interns", count = 7 }]
P
    [ "$1" = layouts ] && cat <<P
reslice = { after = "1s", hold = "${HOLD}s" }
[[gpu.layout]]
name = "train-3g"
mig = [{ profile = "3g.40gb", owner = "train", count = 2 }]
P
    cat <<P
[[gpu]]
index = [1]
mig = [{ profile = "3g.40gb", owner = "train", count = 2 }]
P
    [ "$1" = layouts ] && cat <<P
reslice = { after = "1s", hold = "${HOLD}s" }
[[gpu.layout]]
name = "interns-1g"
mig = [{ profile = "1g.10gb", owner = "interns", count = 7 }]
P
    return 0
}

BASE=$(mktemp -d)
chmod 755 "$BASE"
# job DIR ID SECONDS: holds its device SECONDS, recording its start (time, device) and its end.
cat >"$BASE/job" <<'J'
#!/bin/bash
echo "$(date +%s.%N) ${CUDA_VISIBLE_DEVICES:-none}" >"$1/$2.start"
sleep "$3"
date +%s.%N >"$1/$2.end"
J
chmod 755 "$BASE/job"

# submit DIR ID USER TEAM PROFILE SECONDS. setpriv, not su: su's PAM session costs seconds of
# CPU under TCG that the replay's clock would pay for.
submit() {
    setpriv --reuid="$3" --regid="$3" --init-groups \
        sh -c "date +%s.%N >$1/$2.req; exec gpuctl run --team $4 --profile $5 --wait=${WAIT}s -- $BASE/job $1 $2 $6" \
        >"$1/$2.out" 2>&1
    echo $? >"$1/$2.rc"
}

replay() {
    local mode=$1 dir=$BASE/$1 i pids=()
    mkdir -p "$dir"
    chmod 777 "$dir"
    date +%s.%N >"$dir/t0"
    for ((i = 0; i < SMALL; i++)); do
        submit "$dir" "$(printf 's%02d' "$i")" bob interns 1g.10gb "$DAY_S" &
        pids+=($!)
    done
    sleep "$NIGHT_AT"
    for ((i = 0; i < LARGE; i++)); do
        submit "$dir" "$(printf 'l%02d' "$i")" carol train 3g.40gb "$NIGHT_S" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    jq '[.gpus[] | [.gpu_instances[] | {p: .profile_id, u: [.compute_instances[].uuid]}]]' "$FAKE_NVML_STATE" >"$dir/layout-end"
    journalctl -u gpuctld.service -o cat --no-pager --since "@$(cut -d. -f1 "$dir/t0")" >"$dir/journal"
    cp -r "$dir" "$VMTEST_RESULTS/$mode"
}

# analyse MODE: the figures of a replay, as shell assignments.
analyse() {
    python3 - "$BASE/$1" <<'PY'
import glob, os, re, sys
d = sys.argv[1]
rd = lambda p: open(p).read().split() if os.path.exists(p) else None
t0 = float(rd(d + "/t0")[0])
slices = {"s": 1, "l": 3}        # compute slices: 1g.10gb 1 of 7, 3g.40gb 3 of 7
out = {}; waits = {"s": [], "l": []}; done = {"s": 0, "l": 0}; total = {"s": 0, "l": 0}
busy = 0.0; last = t0; failed = []
for p in sorted(glob.glob(d + "/*.req")):
    j = os.path.basename(p)[:-4]; k = j[0]; total[k] += 1
    req = float(rd(p)[0]); s = rd(d + "/" + j + ".start"); e = rd(d + "/" + j + ".end")
    rc = rd(d + "/" + j + ".rc")
    if not (s and e) or not rc or rc[0] != "0":
        failed.append("%s:%s" % (j, rc[0] if rc else "?")); continue
    done[k] += 1; waits[k].append(float(s[0]) - req)
    busy += (float(e[0]) - float(s[0])) * slices[k]; last = max(last, float(e[0]))
def q(xs, p):
    if not xs: return "-"
    xs = sorted(xs); return "%.1f" % xs[min(len(xs) - 1, int(p * len(xs)))]
for k, n in (("s", "small"), ("l", "large")):
    out[n + "_done"] = "%d/%d" % (done[k], total[k])
    out[n + "_p50"] = q(waits[k], 0.5); out[n + "_p95"] = q(waits[k], 0.95)
span = last - t0
out["span"] = "%.1f" % span
out["util"] = "%.1f" % (100 * busy / (14 * span)) if span > 0 else "-"
js = open(d + "/journal").read()
out["reslices"] = len(re.findall(r"^GPU \d+ re-sliced to ", js, re.M))
out["failed"] = ",".join(failed)
for k, v in out.items(): print("%s=%s" % (k, v))
PY
}

# on_profile DIR: jobs whose device was not of the profile they asked for, as recorded at their
# start against the instances of that profile the fake NVML had at any switch (its call log).
on_profile() {
    local dir=$1 j dev p bad=0
    for f in "$dir"/*.start; do
        j=$(basename "$f" .start)
        read -r _ dev <"$f"
        case $j in s*) p=19 ;; *) p=9 ;; esac
        # The device's GI profile: the job's MIG UUID names a CI of a GI created with profile p.
        jq -e --arg u "$dev" --argjson p "$p" \
            '[.gpus[].gpu_instances[] | select(.profile_id == $p) | .compute_instances[].uuid] | index($u) != null' \
            "$FAKE_NVML_STATE" >/dev/null 2>&1 ||
            grep -q "$dev" "$dir/seen-$p" 2>/dev/null || bad=$((bad + 1))
    done
    echo "$bad"
}

# record_devices DIR: every second while DIR's replay runs, the MIG UUIDs of each profile.
record_devices() {
    while [ ! -e "$1/over" ]; do
        for p in 9 19; do
            jq -r --argjson p "$p" '.gpus[].gpu_instances[] | select(.profile_id == $p) | .compute_instances[].uuid' \
                "$FAKE_NVML_STATE" >>"$1/seen-$p" 2>/dev/null
        done
        sleep 1
    done
}

declare -A R
for mode in $MODES; do
    policy "$mode" | put_policy 49-reslice-bench.toml
    rm -f /run/gpuctl/layouts.json
    if [ -z "${started:-}" ]; then gpuctld_start; started=1; else reload_wait; fi
    check "gpuctld converged, $mode (2 teams, 2 GPUs)" wait_converged 90 2 2
    echo "    replaying $SMALL small jobs of ${DAY_S} s, then at ${NIGHT_AT} s $LARGE large ones of ${NIGHT_S} s: $mode"
    mkdir -p "$BASE/$mode" && chmod 777 "$BASE/$mode"
    record_devices "$BASE/$mode" &
    rpid=$!
    replay "$mode"
    : >"$BASE/$mode/over"
    wait "$rpid"
    while IFS='=' read -r k v; do R[$mode.$k]=$v; done < <(analyse "$mode")
    for k in small_done large_done small_p95 large_p95 span util reslices failed; do
        printf '    %s %s=%s\n' "$mode" "$k" "${R[$mode.$k]}"
    done
    check "$mode: every job ran to its end (${R[$mode.failed]:-none failed})" test -z "${R[$mode.failed]}"
    check "$mode: every job ran on a device of the profile it asked for" test "$(on_profile "$BASE/$mode")" = 0
    # Back to the defaults before the next run: no job left, the hold past.
    wait_for $((HOLD + 60)) sh -c "test \"\$(jq -c '[.gpus[] | [.gpu_instances[].profile_id] | sort]' $FAKE_NVML_STATE)\" = '[[19,19,19,19,19,19,19],[9,9]]'"
done
# A short run has no fixed run.
if [ "${R[fixed.reslices]:-}" ]; then
    check "fixed: nothing was re-sliced" test "${R[fixed.reslices]}" = 0
fi
check "layouts: GPUs were re-sliced (${R[layouts.reslices]})" test "${R[layouts.reslices]}" -gt 0
check "gpuctld still active" systemctl is-active --quiet gpuctld.service

v() { echo "${R[$1]:--}"; }
echo "BENCH reslice trace: $SMALL x 1g.10gb jobs of ${DAY_S} s at 0 s, $LARGE x 3g.40gb jobs of ${NIGHT_S} s at ${NIGHT_AT} s, 2 H100s; layouts: after 1 s, hold ${HOLD} s"
echo "BENCH reslice jobs completed: fixed small $(v fixed.small_done) large $(v fixed.large_done); layouts small $(v layouts.small_done) large $(v layouts.large_done)"
echo "BENCH reslice wait p50/p95 small: fixed $(v fixed.small_p50)/$(v fixed.small_p95) s, layouts $(v layouts.small_p50)/$(v layouts.small_p95) s"
echo "BENCH reslice wait p50/p95 large: fixed $(v fixed.large_p50)/$(v fixed.large_p95) s, layouts $(v layouts.large_p50)/$(v layouts.large_p95) s"
echo "BENCH reslice last job ended: fixed $(v fixed.span) s, layouts $(v layouts.span) s after the start; compute utilisation fixed $(v fixed.util)%, layouts $(v layouts.util)%"
echo "BENCH reslice re-slices: fixed $(v fixed.reslices), layouts $(v layouts.reslices)"
finish

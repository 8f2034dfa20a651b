#!/bin/bash
# 87: the exporter under bad clients and a steady scraper. Five clients that never finish their
# request do not stall a scrape; a malformed request gets 400, an unknown path 404; 200 scrapes
# back to back (past the reads budget's burst of 50; one uid, the exporter's, for all of them) are
# all answered 200; 70 silent connections (more than its 64 slots) do not stop a scrape; 200
# concurrent scrapes each get a whole 200 or 503, never a reset; and gpuctld's wakeups over 10 s idle after the scrapes stopped are no more
# than before any scrape (it does not poll when nobody asks). The latency benchmark against
# Prometheus's own /metrics is 89 (benchmark-only).
# vmtest: timeout=420
# vmtest: group=usage
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
. lib/usage.sh

exporter_setup
r=$(http stall $E)
echo "    scrape with 5 silent clients connected: $r"
check_output "a scrape is served while 5 clients hang (< 5 s, 200)" \
    awk -v ms="${r%% *}" -v st="${r#* }" 'BEGIN {exit !(ms < 5000 && st ~ /200 OK/)}'
check_output "malformed request: 400" test "$(http status $E '\x16\x03\x01junk\r\n\r\n')" = "HTTP/1.1 400 Bad Request"
check_output "unknown path: 404" test "$(http status $E 'GET /x HTTP/1.1\r\n\r\n')" = "HTTP/1.1 404 Not Found"
# shellcheck disable=SC2317 # called through check
served() { http get "$E" | grep -q '^gpuctl_up 1'; }
check "metrics still served" served

# `http bench` fails on the first answer that is not 200 (a 503 from the rate limit).
read -r g50 g99 < <(http bench $E 200)
echo "    200 scrapes back to back: p50 ${g50:-?} ms, p99 ${g99:-?} ms"
check "200 scrapes back to back, every one answered 200" test -n "$g99"

r=$(http slots $E 70)
check_output "70 silent connections do not stop a scrape (got: $r)" test "$r" = "HTTP/1.1 200 OK"
r=$(http burst $E 200)
echo "    200 concurrent scrapes: $r"
check_output "200 concurrent scrapes: a whole 200 or 503 each, never a reset" \
    test "${r#* 503=* }" = "reset=0 cut=0 error=0"

sleep 3
idle_after=$(gpuctld_wakeups 10)
echo "    gpuctld context switches in 10 s idle: before any scrape ${IDLE_BEFORE}, after the scrapes ${idle_after}"
check_output "gpuctld does not poll when nobody asks (idle wakeups after <= before + 5)" test "$idle_after" -le $((IDLE_BEFORE + 5))
usage_teardown
finish

#!/bin/bash
# 87: the exporter under bad clients and load. Five clients that never finish their request do
# not stall a scrape; a malformed request gets 400; then BENCH: scrape latency p50/p99 over 1,000
# scrapes of gpuctl-exporter against 1,000 of Prometheus's own /metrics (the same-run baseline),
# and gpuctld's wakeups over 10 s idle before any scrape and after the scrapes stopped.
# vmtest: timeout=600
# vmtest: group=usage
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
. lib/usage.sh

usage_setup
gpid=$(systemctl show -P MainPID gpuctld.service)
ctx() { awk '/ctxt_switches/ {s += $2} END {print s}' "/proc/$gpid/status"; }
sleep 2
c0=$(ctx); sleep 10; idle_before=$(($(ctx) - c0))

systemctl start gpuctl-exporter.socket
E=http://127.0.0.1:9849/metrics
r=$(http stall $E)
echo "    scrape with 5 silent clients connected: $r"
check_output "a scrape is served while 5 clients hang (< 5 s, 200)" \
    awk -v ms="${r%% *}" -v st="${r#* }" 'BEGIN {exit !(ms < 5000 && st ~ /200 OK/)}'
check_output "malformed request: 400" test "$(http status $E '\x16\x03\x01junk\r\n\r\n')" = "HTTP/1.1 400 Bad Request"
check_output "unknown path: 404" test "$(http status $E 'GET /x HTTP/1.1\r\n\r\n')" = "HTTP/1.1 404 Not Found"
# shellcheck disable=SC2317 # called through check
served() { http get "$E" | grep -q '^gpuctl_up 1'; }
check "metrics still served" served

mkdir -p /tmp/prom
printf 'global: {scrape_interval: 1h}\nscrape_configs: []\n' >/tmp/prom/empty.yml
systemd-run -q --unit=vmtest-prometheus /usr/bin/prometheus --config.file=/tmp/prom/empty.yml \
    --storage.tsdb.path=/tmp/prom/data2 --web.listen-address=127.0.0.1:9090
# shellcheck disable=SC2317 # called through wait_for
ready() { http get http://127.0.0.1:9090/-/ready >/dev/null 2>&1; }
wait_for 60 ready
read -r g50 g99 < <(http bench $E 1000)
read -r p50 p99 < <(http bench http://127.0.0.1:9090/metrics 1000)
echo "BENCH exporter scrape latency over 1000 scrapes: p50 ${g50} ms, p99 ${g99} ms; Prometheus's own /metrics (baseline): p50 ${p50} ms, p99 ${p99} ms; ratio p50 $(awk -v a="$g50" -v b="$p50" 'BEGIN {printf "%.2f", a / b}')x, p99 $(awk -v a="$g99" -v b="$p99" 'BEGIN {printf "%.2f", a / b}')x"
check "1000 scrapes answered" test -n "$g99"

systemctl stop vmtest-prometheus.service
sleep 3
c0=$(ctx); sleep 10; idle_after=$(($(ctx) - c0))
echo "BENCH gpuctld idle wakeups (context switches in 10 s, nobody scraping): before any scrape ${idle_before}, after 2000+ scrapes ${idle_after}; ratio $(awk -v a="$idle_after" -v b="$idle_before" 'BEGIN {printf "%.2f", (b ? a / b : 0)}')x"
check_output "gpuctld does not poll when nobody asks (idle wakeups after <= before + 5)" test "$idle_after" -le $((idle_before + 5))
usage_teardown
finish

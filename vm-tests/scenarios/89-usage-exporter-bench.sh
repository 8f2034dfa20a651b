#!/bin/bash
# 89 (benchmark): scrape latency p50/p99 over 1,000 scrapes of gpuctl-exporter against 1,000 of
# Prometheus's own /metrics (the same-run baseline), and gpuctld's wakeups over 10 s idle before
# any scrape and after the 2,000 scrapes stopped. Figures are printed (BENCH lines); it asserts
# only that every scrape was answered. 87 checks in every run what the exporter must do under
# bad clients and a steady scraper, and that gpuctld does not poll after it.
# vmtest: timeout=600
# vmtest: group=usage
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
. lib/usage.sh

exporter_setup
mkdir -p /tmp/prom
printf 'global: {scrape_interval: 1h}\nscrape_configs: []\n' >/tmp/prom/empty.yml
systemd-run -q --unit=vmtest-prometheus /usr/bin/prometheus --config.file=/tmp/prom/empty.yml \
    --storage.tsdb.path=/tmp/prom/data2 --web.listen-address=127.0.0.1:9090
# shellcheck disable=SC2317 # called through wait_for
ready() { http get http://127.0.0.1:9090/-/ready >/dev/null 2>&1; }
wait_for 60 ready
n=$(bench_size 1000 20)
read -r g50 g99 < <(http bench $E "$n")
read -r p50 p99 < <(http bench http://127.0.0.1:9090/metrics "$n")
echo "BENCH exporter scrape latency over $n scrapes: p50 ${g50} ms, p99 ${g99} ms; Prometheus's own /metrics (baseline): p50 ${p50} ms, p99 ${p99} ms; ratio p50 $(awk -v a="$g50" -v b="$p50" 'BEGIN {printf "%.2f", a / b}')x, p99 $(awk -v a="$g99" -v b="$p99" 'BEGIN {printf "%.2f", a / b}')x"
check "$n scrapes of the exporter answered" test -n "$g99"
check "$n scrapes of Prometheus answered" test -n "$p99"

systemctl stop vmtest-prometheus.service
sleep 3
idle_after=$(gpuctld_wakeups "$(bench_size 10 1)")
echo "BENCH gpuctld idle wakeups (context switches in 10 s, nobody scraping): before any scrape ${IDLE_BEFORE}, after 2000+ scrapes ${idle_after}; ratio $(awk -v a="$idle_after" -v b="$IDLE_BEFORE" 'BEGIN {printf "%.2f", (b ? a / b : 0)}')x"
usage_teardown
finish

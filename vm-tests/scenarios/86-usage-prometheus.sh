#!/bin/bash
# 86: a real Prometheus (Debian's) scrapes gpuctl-exporter, socket-activated on 127.0.0.1:9849
# and running as the unprivileged gpuctl-exporter user; PromQL over Prometheus's HTTP API returns team-labelled series,
# and the memory-near-full alert (infer holds 95% of GPU 0; `for:` shortened in a test copy of
# the shipped rules) reaches `firing` in /api/v1/alerts.
# vmtest: timeout=600
# vmtest: group=usage
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
. lib/usage.sh

usage_setup
systemctl start gpuctl-exporter.socket
check_output "promtool accepts the shipped rules" promtool check rules /usr/share/gpuctl/gpuctl.rules.yml
mkdir -p /tmp/prom
sed '/GpuctlTeamGpuMemoryNearFull/,/for:/ s/for: 5m/for: 5s/' /usr/share/gpuctl/gpuctl.rules.yml >/tmp/prom/rules.yml
cat >/tmp/prom/prometheus.yml <<'Y'
global: {scrape_interval: 5s, scrape_timeout: 5s, evaluation_interval: 1s}
rule_files: [/tmp/prom/rules.yml]
scrape_configs:
  - job_name: gpuctl
    static_configs: [{targets: ['127.0.0.1:9849']}]
Y
systemd-run -q --unit=vmtest-prometheus /usr/bin/prometheus --config.file=/tmp/prom/prometheus.yml \
    --storage.tsdb.path=/tmp/prom/data --web.listen-address=127.0.0.1:9090
P=http://127.0.0.1:9090
# shellcheck disable=SC2317 # called through wait_for
scraped() { [ "$(http query "$P" 'up{job="gpuctl"}' 2>/dev/null | jq -r '.[0].value[1]')" = 1 ]; }
check "Prometheus scrapes the exporter (up == 1)" wait_for 240 scraped

pid=$(systemctl show -P MainPID gpuctl-exporter.service)
uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
echo "    exporter: pid $pid, uid ${uid:-?}, NRestarts $(systemctl show -P NRestarts gpuctl-exporter.service)"
check_output "the exporter runs as the gpuctl-exporter system user" test "${uid:-x}" = "$(id -u gpuctl-exporter)"
check_output "which is unprivileged (uid ${uid:-?}: a system uid, not root)" test "${uid:-0}" -gt 0 -a "${uid:-0}" -lt 1000

r=$(http query "$P" 'sum by (team) (gpuctl_team_gpu_processes{team!=""})')
echo "    processes per team: $r"
check_output "PromQL: processes per team, team-labelled" test "$(jq -cS '[.[] | {(.metric.team): .value[1]}] | add' <<<"$r")" = '{"infer":"1","train":"1"}'
r=$(http query "$P" 'gpuctl_device_memory_used_bytes / gpuctl_device_memory_total_bytes and on (device) gpuctl_device_team_info{team="infer"}')
echo "    infer's GPU 0 used/total: $r"
check "PromQL: one series for infer's GPU 0" test "$(jq length <<<"$r")" = 1
check "PromQL: infer's GPU 0 is over 90% full" num_gt "$(jq -r '.[0].value[1]' <<<"$r")" 0.9
r=$(http query "$P" 'gpuctl_device_team_info{team="train"}')
check_output "PromQL: the dcgm join labels of train's MIG device" \
    test "$(jq -c '.[0].metric | [.gpu, .GPU_I_PROFILE, (.GPU_I_ID != ""), (.UUID | startswith("GPU-"))]' <<<"$r")" = '["1","3g.40gb",true,true]'
r=$(http query "$P" 'gpuctl_device_stray_processes{device_team="train"}')
check_output "PromQL: one stray on train's device" test "$(jq -r '.[0].value[1]' <<<"$r")" = 1

# shellcheck disable=SC2317 # called through wait_for
firing() { http alerts "$P" | jq -e '.[] | select(.labels.alertname == "GpuctlTeamGpuMemoryNearFull" and .labels.team == "infer" and .state == "firing")' >/dev/null; }
check "GpuctlTeamGpuMemoryNearFull is firing for infer" wait_for 180 firing
http alerts "$P" | jq -c '.[] | [.labels.alertname, .labels.team, .state]' | sed 's/^/    alert| /'
# shellcheck disable=SC2317 # called through check_not
train_alert() { http alerts "$P" | jq -e '.[] | select(.labels.alertname == "GpuctlTeamGpuMemoryNearFull" and .labels.team == "train")' >/dev/null; }
check_not "train (10% full) has no memory alert" train_alert

# GPU 0 shared by infer and train: the info metric names both owners, the device series still
# count it once, so a plain sum() is the memory in use on the host.
u0=$(gpu_uuid 0)
put_policy 85-usage.toml <<'P'
version = 1
[teams.infer]
members = ["@ml-infer"]
[teams.train]
members = ["@ml-train"]
[[gpu]]
index = [0]
shared = ["infer", "train"]
[[gpu]]
index = [1]
mig = [ { profile = "3g.40gb", owner = "train" } ]
P
reload_wait
# shellcheck disable=SC2317 # called through wait_for
two_owners() { [ "$(http query "$P" "count(gpuctl_device_team_info{device=\"$u0\"})" | jq -r '.[0].value[1]')" = 2 ]; }
check "PromQL: GPU 0 has two owners in gpuctl_device_team_info" wait_for 60 two_owners
r=$(http query "$P" "gpuctl_device_memory_used_bytes{device=\"$u0\"}")
echo "    GPU 0 memory series: $(jq -c '[.[] | .metric.team]' <<<"$r")"
check_output "PromQL: one memory series for the shared GPU" test "$(jq length <<<"$r")" = 1
r=$(http query "$P" 'sum(gpuctl_device_memory_used_bytes) - sum(max by (device) (gpuctl_device_memory_used_bytes))')
check_output "PromQL: a plain sum() counts each device once" test "$(jq -r '.[0].value[1]' <<<"$r")" = 0
r=$(http query "$P" 'sum by (team) (gpuctl_device_memory_used_bytes * on (device) group_right gpuctl_device_team_info{team!=""})')
check_output "PromQL: joined to the info metric, the shared GPU is each owner's" \
    test "$(jq -r '[.[] | .metric.team] | sort | join(" ")' <<<"$r")" = "infer train"
journalctl -u gpuctl-exporter.service -o cat --no-pager | tail -n 5 | sed 's/^/    exporter journal| /'
usage_teardown
finish

#!/bin/bash
# 86: a real Prometheus (Debian's) scrapes gpuctl-exporter, socket-activated on 127.0.0.1:9849
# and running as the unprivileged gpuctl-exporter user; PromQL over Prometheus's HTTP API returns team-labelled series,
# and the memory-near-full alert (infer holds 95% of GPU 0; `for:` shortened in a test copy of
# the shipped rules) reaches `firing` in /api/v1/alerts. A fatal XID on GPU 1 fires
# GpuctlDeviceOutOfService (its `for:` shortened too), which ends once `gpuctl device resume`
# brings the GPU back. Debian's Alertmanager, with the routing `gpuctl export alertmanager`
# renders for the policy's teams, delivers infer's alert to infer's webhook and Slack receivers
# (listeners on loopback) and to the admins', and nothing to train's; the device alert (no
# team) goes to the admins only.
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
sed -e '/GpuctlTeamGpuMemoryNearFull/,/for:/ s/for: 5m/for: 5s/' \
    -e '/GpuctlDeviceOutOfService/,/for:/ s/for: 1m/for: 5s/' /usr/share/gpuctl/gpuctl.rules.yml >/tmp/prom/rules.yml
check "the test copy shortened both rules' for:" test "$(grep -c 'for: 5s' /tmp/prom/rules.yml)" = 2

# Alertmanager: the rendered routing (group_wait shortened in the test copy), each receiver a
# loopback listener that keeps every POST it gets, one file per receiver and call.
A=/tmp/am
mkdir -p $A/got
for t in admins infer train; do echo "http://127.0.0.1:9901/slack/$t" >"$A/slack-$t.url"; done
check_output "gpuctl export alertmanager renders the routing for the host's teams" \
    sh -c "gpuctl export alertmanager --webhook 'http://127.0.0.1:9901/hook/{team}' \
        --slack-channel '#gpu-{team}' --slack-api-url-file '$A/slack-{team}.url' >$A/rendered.yml"
check_output "amtool accepts the rendered configuration" amtool check-config $A/rendered.yml
check_output "and the shipped example" amtool check-config /usr/share/gpuctl/alertmanager.example.yml
sed 's/group_wait: 30s/group_wait: 1s/' $A/rendered.yml >$A/am.yml
systemd-run -q --unit=vmtest-listener python3 -c '
import http.server, itertools
n = itertools.count()
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        name = self.path.strip("/").replace("/", "-")
        with open(f"/tmp/am/got/{name}.{next(n)}.json", "wb") as f:
            f.write(body)
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", 9901), H).serve_forever()'
systemd-run -q --unit=vmtest-alertmanager /usr/bin/prometheus-alertmanager --config.file=$A/am.yml \
    --storage.path=$A/data --web.listen-address=127.0.0.1:9093 --cluster.listen-address=
cat >/tmp/prom/prometheus.yml <<'Y'
global: {scrape_interval: 5s, scrape_timeout: 5s, evaluation_interval: 1s}
rule_files: [/tmp/prom/rules.yml]
alerting:
  alertmanagers: [{static_configs: [{targets: ['127.0.0.1:9093']}]}]
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
# got RECEIVER JQ: some POST to RECEIVER (hook-infer, slack-train, ...) matches JQ.
# shellcheck disable=SC2317 # called through wait_for and check
got() { for f in "$A/got/$1".*.json; do [ -e "$f" ] && jq -e "$2" "$f" >/dev/null && return 0; done; return 1; }
near_full='.alerts[] | select(.labels.alertname == "GpuctlTeamGpuMemoryNearFull" and .labels.team == "infer" and .status == "firing")'
check "Alertmanager delivered infer's alert to infer's webhook" wait_for 90 got hook-infer "$near_full"
check "... and to infer's Slack receiver, in Slack's format, in #gpu-infer" \
    wait_for 30 got slack-infer '.channel == "#gpu-infer" and (.attachments[0].title | test("FIRING.*GpuctlTeamGpuMemoryNearFull"))'
check "... and to the admins' webhook" wait_for 30 got hook-admins "$near_full"
find $A/got -type f -printf '%f\n' | sort | sed 's/^/    delivered| /'
check_not "train's webhook got nothing of infer's" got hook-train '.alerts[] | select(.labels.team == "infer")'
check_not "train's Slack receiver got nothing of infer's" got slack-train '.attachments[0].title | test("GpuctlTeamGpuMemoryNearFull")'

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

fake_xid 1 79
# shellcheck disable=SC2317 # called through wait_for and check_not
out_alert() { http alerts "$P" | jq -e '.[] | select(.labels.alertname == "GpuctlDeviceOutOfService" and .labels.gpu == "1" and .state == "firing")' >/dev/null; }
check "GpuctlDeviceOutOfService is firing for GPU 1 after XID 79" wait_for 120 out_alert
gpuctl metrics | grep '^gpuctl_device_in_service' | sed 's/^/    gpuctl metrics| /'
http query "$P" 'gpuctl_device_in_service' | jq -c '.[] | [.metric.gpu, .metric.device, .value[1]]' | sed 's/^/    prometheus| /'
http alerts "$P" | jq -c '.[] | [.labels.alertname, .labels.gpu, .labels.device, .state]' | sed 's/^/    alert| /'
# shellcheck disable=SC2317 # called through check_not
gpu0_alert() { http alerts "$P" | jq -e '.[] | select(.labels.alertname == "GpuctlDeviceOutOfService" and .labels.gpu == "0")' >/dev/null; }
check_not "and not for GPU 0" gpu0_alert
gpuctl device resume 1 --reason "vm test" | sed 's/^/    resume| /'
# shellcheck disable=SC2317 # called through wait_for
out_gone() { ! out_alert; }
check "it ends once GPU 1 is back in service" wait_for 120 out_gone
device_out='.alerts[] | select(.labels.alertname == "GpuctlDeviceOutOfService" and .labels.gpu == "1")'
check "Alertmanager told the admins of GPU 1" wait_for 60 got hook-admins "$device_out"
# shellcheck disable=SC2317 # called through check
no_team_got() { ! got hook-infer "$device_out" && ! got hook-train "$device_out"; }
check "and no team's receiver (the alert has no team)" no_team_got
journalctl -u gpuctl-exporter.service -o cat --no-pager | tail -n 5 | sed 's/^/    exporter journal| /'
systemctl stop vmtest-alertmanager.service vmtest-listener.service 2>/dev/null || true
usage_teardown
finish

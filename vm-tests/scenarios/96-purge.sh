#!/bin/bash
# Remove keeps the admin's policy and the running team slices; purge then leaves nothing behind:
# no files, no units, no gpu*.slice, no cgroups, no enablement symlinks.
# The last member of the package group's VM (one boot and one `dpkg -i` fewer than a VM of its
# own); the harness resets gpuctl's run-time state
# before it, and what it removes is what the members before it installed.
# vmtest: group=pkg
. lib/common.sh
. lib/fake-hw.sh
fake_gpus 2

files=$(dpkg -L gpuctl | while read -r p; do [ -f "$p" ] && echo "$p"; done)
require_nonempty "files the package installed" "$files"

# What gpuctld leaves on a host at run time: a team slice with a running job and runtime
# properties, team env files, state, MPS logs, an admin drop-in and a locally edited conffile.
# Made by hand with gpuctld stopped: a running gpuctld repairs hand drift on the spot (issue 17)
# and would rewrite slices.json to its own (here empty) policy before the checks below.
systemctl stop gpuctld.service
systemd-run -q --unit=team-job --slice=gpu-infer.slice sleep 1000
systemctl set-property --runtime gpu-infer.slice MemoryMax=1G "DeviceAllow=/dev/nvidia0 rw"
mkdir -p /run/gpuctl/teams /var/log/gpuctl/mps/infer /etc/gpuctl/policy.d
echo CUDA_VISIBLE_DEVICES=0 >/run/gpuctl/teams/infer.env
echo '{}' >/var/lib/gpuctl/last-good.json
# The last applied state: the generator turns it into unit files on every daemon-reload.
cat >/var/lib/gpuctl/slices.json <<'J'
{"version": 1, "slices": {"infer": {"memory_max": 1073741824, "memory_high": null,
 "cpu_weight": null, "allowed_cpus": null, "tasks_max": 64, "io_weight": null,
 "device_allow": ["/dev/nvidia0", "/dev/nvidiactl"]}}}
J
systemctl daemon-reload
echo '# local edit' >>/etc/gpuctl/policy.toml
echo 'version = 1' >/etc/gpuctl/policy.d/10-local.toml
check_output "setup: team job runs in gpu-infer.slice" systemctl show -P ControlGroup team-job.service
check_output "setup: the generator wrote team slices" ls /run/systemd/generator/gpu.slice /run/systemd/generator/gpu-infer.slice

check_output "dpkg -r gpuctl" dpkg -r gpuctl
check "after remove: /etc/gpuctl/policy.toml kept (conffile)" grep -q '# local edit' /etc/gpuctl/policy.toml
check "after remove: the team job still runs" systemctl is-active team-job.service
check_not "after remove: gpuctld.service no longer enabled (no wants symlink)" test -L /etc/systemd/system/multi-user.target.wants/gpuctld.service

check_output "dpkg --purge gpuctl" dpkg --purge gpuctl
check_not "dpkg no longer knows gpuctl" sh -c 'dpkg -s gpuctl 2>/dev/null | grep -q "^Status: .* installed"'
left=$(for f in $files; do if [ -e "$f" ]; then echo "$f"; fi; done)
check_empty "no shipped file remains" echo -n "$left"
for d in /etc/gpuctl /var/lib/gpuctl /run/gpuctl /var/log/gpuctl; do
    check_not "$d is gone" test -e $d
done
check_empty "no gpu* or gpuctl* units loaded" \
    sh -c "systemctl list-units --all --plain --no-legend 'gpu*' 'gpuctl*'"
check_empty "no gpu* or gpuctl* unit files" \
    sh -c "systemctl list-unit-files --no-legend 'gpu*' 'gpuctl*'; true"
check_empty "no gpu* files under /etc/systemd, /run/systemd, /lib/systemd" \
    sh -c "find /etc/systemd /run/systemd /lib/systemd /usr/lib/systemd -name 'gpu*' 2>/dev/null"
check_empty "no gpu* cgroups" sh -c "find /sys/fs/cgroup -maxdepth 2 -name 'gpu*'"
check_not "the job in the purged slice was stopped" systemctl is-active team-job.service
finish

#!/bin/bash
# Upgrading (here: reinstalling over itself, which dpkg runs as an upgrade) keeps the admin's
# edits to the conffile and their choice to disable the agent; a reinstall after `remove` applies
# the preset again.
# In the package group's VM (one boot fewer): it ends as 10-install left the guest, with the package installed and gpuctld enabled by the preset, and the harness
# resets gpuctl's run-time state before the next member.
# vmtest: group=pkg
. lib/common.sh

deb=$(vm_deb)
echo '# local edit' >>/etc/gpuctl/policy.toml
check "admin disables gpuctld" systemctl disable gpuctld.service
check_output "dpkg -i over the installed version (upgrade path)" dpkg -i "$deb"
check "the local edit of policy.toml is kept" grep -q '^# local edit' /etc/gpuctl/policy.toml
check_not "no .dpkg-dist/.dpkg-old left next to it" sh -c 'ls /etc/gpuctl/*.dpkg-* 2>/dev/null'
check_output "gpuctld stays disabled" sh -c 'test "$(systemctl is-enabled gpuctld.service)" = disabled && echo disabled'
check "units still installed" test -f /lib/systemd/system/gpuctld.service

check_output "dpkg -r gpuctl" dpkg -r gpuctl
check_output "dpkg -i after remove" dpkg -i "$deb"
check_output "the preset enables gpuctld again" systemctl is-enabled gpuctld.service
check "the local edit survived remove + install" grep -q '^# local edit' /etc/gpuctl/policy.toml
finish

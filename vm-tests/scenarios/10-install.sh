#!/bin/bash
# The package installs with dpkg -i (done by the harness) and puts its files where packaging/
# says; the maintainer scripts enabled the agent per preset and created its directories.
# vmtest: group=pkg
. lib/common.sh

check_output "dpkg reports gpuctl installed" dpkg-query -W -f='${Package} ${Version} ${Status}\n' gpuctl
check_output "dpkg -i printed no warnings" sh -c '! grep -i "warn\|error" "$VMTEST_DPKG_LOG"'

# The check list: every path the package must ship (packaging/build.sh stages them).
expected=(
    /usr/bin/gpuctl
    /usr/sbin/gpuctld
    /lib/systemd/system/gpuctld.service
    /lib/systemd/system/gpu.slice
    /lib/systemd/system/gpuctl-ready.target
    /lib/systemd/system/gpuctl-mps@.service
    /lib/systemd/system-generators/gpuctl-generator
    /lib/systemd/system-preset/90-gpuctl.preset
    /usr/lib/tmpfiles.d/gpuctl.conf
    /usr/lib/sysusers.d/gpuctl.conf
    /usr/share/dbus-1/system.d/org.gpuctl.Agent1.conf
    /etc/gpuctl/policy.toml
    /usr/share/man/man1/gpuctl.1.gz
    /usr/share/man/man8/gpuctld.8.gz
    /usr/share/man/man5/gpuctl.policy.5.gz
    /usr/share/bash-completion/completions/gpuctl
    /usr/share/zsh/vendor-completions/_gpuctl
    /usr/share/fish/vendor_completions.d/gpuctl.fish
    /usr/share/doc/gpuctl/copyright
    /usr/share/gpuctl/gpuctld.service.d/nss-network.conf
    /lib/systemd/system/gpuctl-exporter.service
    /lib/systemd/system/gpuctl-exporter.socket
    /lib/systemd/system/gpuctl-textfile.service
    /lib/systemd/system/gpuctl-textfile.timer
    /usr/libexec/gpuctl-exporter
    /usr/share/doc/gpuctl/monitoring.md
    /usr/share/gpuctl/alertmanager.example.yml
    /usr/share/gpuctl/gpuctl-dashboard.json
    /usr/share/gpuctl/gpuctl.rules.test.yml
    /usr/share/gpuctl/gpuctl.rules.yml
    /usr/share/gpuctl/jupyterhub/gpuctl_spawner.py
    /usr/share/gpuctl/jupyterhub/jupyterhub_config.py
    /usr/share/doc/gpuctl/jupyterhub.md
)
missing=()
for p in "${expected[@]}"; do
    if [ -f "$p" ] && dpkg -S "$p" >/dev/null 2>&1; then :; else missing+=("$p"); fi
done
if [ ${#missing[@]} -eq 0 ]; then
    pass "all ${#expected[@]} expected files are installed and owned by the package"
else
    fail "files missing or not owned by gpuctl: ${missing[*]}"
fi
# Nothing unexpected: every shipped file is on the list (or a man page, or an example policy).
extra=$(dpkg -L gpuctl | while read -r p; do
    [ -f "$p" ] || continue
    case $p in /usr/share/man/man1/gpuctl-*.1.gz | /usr/share/doc/gpuctl/examples/*.toml) continue ;; esac
    printf '%s\n' "${expected[@]}" | grep -qxF "$p" || echo "$p"
done)
check_empty "the package ships no file outside the check list" echo -n "$extra"
check "/etc/gpuctl/policy.toml is a conffile" sh -c 'dpkg-query -W -f="\${Conffiles}\n" gpuctl | grep -q "^ /etc/gpuctl/policy.toml "'
check "binaries are executable" test -x /usr/bin/gpuctl -a -x /usr/sbin/gpuctld -a -x /lib/systemd/system-generators/gpuctl-generator
check_output "gpuctl --version runs" gpuctl --version

# Maintainer scripts: daemon-reload, preset, tmpfiles.
check_output "systemd loads the unit from the package" systemctl show -P FragmentPath gpuctld.service
check "the unit is loaded (daemon-reload ran)" test "$(systemctl show -P LoadState gpuctld.service)" = loaded
check_output "gpuctld.service enabled by the preset" systemctl is-enabled gpuctld.service
check_output "sysusers made the gpuctl-mps system user (the MPS daemons run as it)" getent passwd gpuctl-mps
check_output "and the gpuctl-exporter system user (the Prometheus exporter runs as it)" getent passwd gpuctl-exporter
check "tmpfiles made /run/gpuctl" test -d /run/gpuctl
check "tmpfiles made /var/lib/gpuctl" test -d /var/lib/gpuctl

# The bus accepts the policy file: ReloadConfig fails on a malformed configuration.
check_output "dbus-daemon reloads its configuration with the gpuctl policy" \
    dbus-send --system --print-reply --dest=org.freedesktop.DBus / org.freedesktop.DBus.ReloadConfig
check_empty "dbus-daemon logged no configuration error" \
    sh -c 'journalctl -b -u dbus.service --no-pager -q | grep -i "gpuctl\|org.gpuctl" | grep -i "error\|fail\|invalid" || true'

# Man pages are gzip'd roff with a title line; completions load in their shells.
for m in /usr/share/man/man1/gpuctl.1.gz /usr/share/man/man8/gpuctld.8.gz /usr/share/man/man5/gpuctl.policy.5.gz; do
    check "$m is a man page" sh -c "zcat '$m' | grep -q '^\\.TH '"
done
check_output "bash completion registers for gpuctl" \
    bash -c '. /usr/share/bash-completion/completions/gpuctl && complete -p gpuctl'
check "zsh completion parses" zsh -n /usr/share/zsh/vendor-completions/_gpuctl
check "fish completion parses" fish --no-execute /usr/share/fish/vendor_completions.d/gpuctl.fish
check_output "fish completes gpuctl subcommands" \
    sh -c "fish -c 'complete -C\"gpuctl \"' | grep -w validate"
finish

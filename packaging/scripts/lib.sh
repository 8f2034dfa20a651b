# Shell functions shared by the .deb maintainer scripts and the .rpm scriptlets; build.sh pastes
# this file into each of them (maintainer scripts must be self-contained). POSIX sh.

GPUCTL_UNIT=gpuctld.service
# Written by the maintainer scripts once the preset was applied, so that an admin's later
# `systemctl disable gpuctld` survives upgrades, while a reinstall after `remove` applies it again.
GPUCTL_PRESET_MARK=/var/lib/gpuctl/.preset-applied

gpuctl_systemd_running() { [ -d /run/systemd/system ]; }

gpuctl_daemon_reload() {
    if gpuctl_systemd_running; then systemctl daemon-reload >/dev/null 2>&1 || true; fi
}

# First install (or reinstall after remove): create directories, enable per preset, start.
gpuctl_configure() {
    # The MPS daemons' default user, before any unit can start as it.
    systemd-sysusers gpuctl.conf >/dev/null 2>&1 || true
    systemd-tmpfiles --create gpuctl.conf >/dev/null 2>&1 || true
    gpuctl_daemon_reload
    if [ ! -e "$GPUCTL_PRESET_MARK" ]; then
        # Works offline (chroot, image build) as well as on a running system.
        systemctl --no-reload preset "$GPUCTL_UNIT" >/dev/null 2>&1 || true
        mkdir -p "${GPUCTL_PRESET_MARK%/*}"
        : > "$GPUCTL_PRESET_MARK"
        if gpuctl_systemd_running && systemctl --quiet is-enabled "$GPUCTL_UNIT" 2>/dev/null; then
            # --no-block: the first reconcile may take minutes (MIG changes); do not hold dpkg.
            systemctl --no-block start "$GPUCTL_UNIT" >/dev/null 2>&1 || true
        fi
    elif gpuctl_systemd_running; then
        # Upgrade: the agent is restart-safe (it converges again); MPS units and team slices are
        # separate units and keep running.
        systemctl --no-block try-restart "$GPUCTL_UNIT" >/dev/null 2>&1 || true
    fi
}

# Removal (not upgrade): stop the agent and its MPS daemons, disable it. Team slices stay, with
# their limits, so running jobs are neither killed nor released from their caps; purge removes
# them.
gpuctl_remove() {
    systemctl --no-reload disable "$GPUCTL_UNIT" >/dev/null 2>&1 || true
    if gpuctl_systemd_running; then
        systemctl stop "$GPUCTL_UNIT" 'gpuctl-mps@*.service' >/dev/null 2>&1 || true
    fi
    rm -f "$GPUCTL_PRESET_MARK"
}

# Purge: nothing of gpuctl stays on the host, including the team slices gpuctld created at run
# time (stopping a slice stops what runs in it: purge is the admin's explicit request).
gpuctl_purge() {
    if gpuctl_systemd_running; then
        systemctl stop gpuctld.service 'gpuctl-mps@*.service' 'gpu-*.slice' gpu.slice \
            gpuctl-ready.target >/dev/null 2>&1 || true
    fi
    [ -n "${GPUCTL_KEEP_ETC:-}" ] || rm -rf /etc/gpuctl
    rm -rf /var/lib/gpuctl /run/gpuctl /var/log/gpuctl
    # The team CDI specs (only gpuctl's: /run/cdi also holds other vendors' specs).
    rm -f /run/cdi/gpuctl.io-team-*.json
    # Unit files, drop-ins and `set-property` settings gpuctld may have written for team slices
    # and MPS units, and gpuctl-generator's output (its binary went with the package's files
    # and its input, /var/lib/gpuctl/slices.json, just above; the daemon-reload below would
    # empty the generator directories anyway, but not on a host where systemd is not running).
    for d in /etc/systemd/system /run/systemd/system /etc/systemd/system.control \
        /run/systemd/system.control /run/systemd/transient /run/systemd/generator \
        /run/systemd/generator.early /run/systemd/generator.late; do
        [ -d "$d" ] || continue
        for f in "$d"/gpu.slice "$d"/gpu.slice.d "$d"/gpu-*.slice "$d"/gpu-*.slice.d \
            "$d"/gpuctld.service.d "$d"/gpuctl-mps@*; do
            if [ -e "$f" ] || [ -L "$f" ]; then rm -rf "$f"; fi
        done
    done
    gpuctl_daemon_reload
    if gpuctl_systemd_running; then
        systemctl reset-failed gpuctld.service 'gpuctl-mps@*.service' 'gpu-*.slice' gpu.slice \
            >/dev/null 2>&1 || true
    fi
}

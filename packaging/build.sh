#!/bin/bash
# packaging/build.sh - build the gpuctl .deb and .rpm from this checkout.
#
# Usage: packaging/build.sh [--debug] [--no-rpm] [OUTDIR]
#   OUTDIR    where the packages go (default: target/packages)
#   --debug   package the debug build (quicker to build, for trying a change in a VM; CI and
#             vm-tests install the release build, the default)
#   --no-rpm  skip the .rpm (e.g. on a host without rpmbuild)
#
# Produces OUTDIR/gpuctl_<version>-<release>_amd64.deb and OUTDIR/gpuctl-<version>-<release>.x86_64.rpm,
# plus OUTDIR/deb-root and OUTDIR/rpm-root (the staged trees, for inspection).
# Needs: cargo, dpkg-deb, fakeroot-free (dpkg-deb --root-owner-group), gzip, and for the .rpm
# rpmbuild (Debian package `rpm`). dpkg-shlibdeps (dpkg-dev) computes the .deb's library
# dependencies when present.
#
# Environment:
#   CARGO_TARGET_DIR                  where cargo builds (as cargo reads it; default target/)
#   GPUCTL_PKG_RELEASE=N              package release (default 1)
#   GPUCTL_ALLOW_MISSING_POLICY_MAN=1 build without docs/man/gpuctl.policy.5 (the package is then
#                                     incomplete; only for branches where it has not landed yet)
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PROFILE=release
RPM=1
OUT=
while [ $# -gt 0 ]; do
    case $1 in
        --debug) PROFILE=debug ;;
        --release) PROFILE=release ;;
        --no-rpm) RPM=0 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "build.sh: unknown option $1" >&2; exit 2 ;;
        *) OUT=$1 ;;
    esac
    shift
done
OUT=${OUT:-$ROOT/target/packages}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

t0=$(date +%s%N)
log() {
    local ms=$((($(date +%s%N) - t0) / 1000000))
    printf '[packaging %3d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*" >&2
}
die() { echo "packaging/build.sh: error: $*" >&2; exit 1; }

VERSION=$(awk -F'"' '/^\[package\]/{p=1} p && /^version *=/{print $2; exit}' Cargo.toml)
[ -n "$VERSION" ] || die "cannot read the package version from Cargo.toml"
SUMMARY=$(awk -F'"' '/^\[package\]/{p=1} p && /^description *=/{print $2; exit}' Cargo.toml)
RELEASE=${GPUCTL_PKG_RELEASE:-1}

# ---- 1. binaries ---------------------------------------------------------------------------------
BINS=(--bin gpuctl --bin gpuctld --bin gpuctl-generator --bin gpuctl-exporter)
if [ "$PROFILE" = release ]; then
    log "cargo build (release): gpuctl, gpuctld, gpuctl-generator, gpuctl-exporter"
    cargo build --locked -q --release "${BINS[@]}"
else
    log "cargo build (debug): gpuctl, gpuctld, gpuctl-generator, gpuctl-exporter"
    cargo build --locked -q "${BINS[@]}"
fi
# Where cargo put them: CARGO_TARGET_DIR when set (relative to the checkout, where cargo ran).
TARGET=${CARGO_TARGET_DIR:-target}
[[ $TARGET = /* ]] || TARGET=$ROOT/$TARGET
BIN=$TARGET/$PROFILE
# The man pages and completions rendered from the clap command, checked in: tests/assets.rs fails
# when they drift from the CLI (so no generator is built here, in a profile of its own).
GEN=packaging/assets

POLICY_MAN=docs/man/gpuctl.policy.5
if [ ! -f "$POLICY_MAN" ]; then
    if [ -n "${GPUCTL_ALLOW_MISSING_POLICY_MAN:-}" ]; then
        echo "packaging/build.sh: WARNING: $POLICY_MAN is missing; the packages lack gpuctl.policy(5)" >&2
        POLICY_MAN=
    else
        die "$POLICY_MAN is missing: the packages must carry gpuctl.policy(5) (set GPUCTL_ALLOW_MISSING_POLICY_MAN=1 to build without it)"
    fi
fi

# ---- 2. staged tree (shared by both formats) ----------------------------------------------------
# $1: staging root; $2: zsh completion dir; $3: systemd's unit/preset base dir (Debian bookworm
# ships units under /lib/systemd, which dpkg does not see as /usr/lib/systemd; Fedora under
# /usr/lib/systemd).
stage() {
    local d=$1 zsh_dir=$2 sd=$3
    rm -rf "$d"
    install -D -m 755 "$BIN/gpuctl" "$d/usr/bin/gpuctl"
    install -D -m 755 "$BIN/gpuctld" "$d/usr/sbin/gpuctld"
    # systemd runs it at boot and on every daemon-reload: team slices from the last applied state.
    install -D -m 755 "$BIN/gpuctl-generator" "$d$sd/system-generators/gpuctl-generator"
    # Debug builds carry ~100 MB of DWARF; the package needs none of it.
    install -D -m 755 "$BIN/gpuctl-exporter" "$d/usr/libexec/gpuctl-exporter"
    strip --strip-debug "$d/usr/bin/gpuctl" "$d/usr/sbin/gpuctld" "$d$sd/system-generators/gpuctl-generator" \
        "$d/usr/libexec/gpuctl-exporter"
    local u
    for u in units/*; do install -D -m 644 "$u" "$d$sd/system/${u##*/}"; done
    install -D -m 644 packaging/files/90-gpuctl.preset "$d$sd/system-preset/90-gpuctl.preset"
    install -D -m 644 packaging/files/gpuctl.tmpfiles "$d/usr/lib/tmpfiles.d/gpuctl.conf"
    install -D -m 644 packaging/files/gpuctl.sysusers "$d/usr/lib/sysusers.d/gpuctl.conf"
    install -D -m 644 packaging/files/org.gpuctl.Agent1.conf "$d/usr/share/dbus-1/system.d/org.gpuctl.Agent1.conf"
    install -D -m 644 packaging/files/policy.toml "$d/etc/gpuctl/policy.toml"
    # Shipped disabled: an admin links it into /etc/systemd/system/gpuctld.service.d/.
    install -D -m 644 packaging/files/nss-network.conf "$d/usr/share/gpuctl/gpuctld.service.d/nss-network.conf"
    # Monitoring (docs/monitoring.md): alert rules, their promtool unit tests, Grafana dashboard,
    # an Alertmanager routing example.
    for f in gpuctl.rules.yml gpuctl.rules.test.yml gpuctl-dashboard.json alertmanager.example.yml; do
        install -D -m 644 "monitoring/$f" "$d/usr/share/gpuctl/$f"
    done
    # JupyterHub (docs/jupyterhub.md): the spawner a hub imports from here, and its config.
    for f in gpuctl_spawner.py jupyterhub_config.py; do
        install -D -m 644 "contrib/jupyterhub/$f" "$d/usr/share/gpuctl/jupyterhub/$f"
    done
    install -d -m 755 "$d/etc/gpuctl/policy.d" "$d/usr/lib/gpuctl/policy.d"
    local m
    for m in "$GEN"/man/*.1; do install -D -m 644 "$m" "$d/usr/share/man/man1/${m##*/}"; done
    install -D -m 644 docs/man/gpuctld.8 "$d/usr/share/man/man8/gpuctld.8"
    [ -n "$POLICY_MAN" ] && install -D -m 644 "$POLICY_MAN" "$d/usr/share/man/man5/gpuctl.policy.5"
    gzip -9n "$d"/usr/share/man/man*/*
    install -D -m 644 "$GEN/completions/gpuctl" "$d/usr/share/bash-completion/completions/gpuctl"
    install -D -m 644 "$GEN/completions/_gpuctl" "$d$zsh_dir/_gpuctl"
    install -D -m 644 "$GEN/completions/gpuctl.fish" "$d/usr/share/fish/vendor_completions.d/gpuctl.fish"
    if compgen -G 'policies/*.toml' >/dev/null; then
        install -d -m 755 "$d/usr/share/doc/gpuctl/examples"
        install -m 644 policies/*.toml "$d/usr/share/doc/gpuctl/examples/"
    fi
    install -D -m 644 docs/monitoring.md "$d/usr/share/doc/gpuctl/monitoring.md"
    install -D -m 644 docs/jupyterhub.md "$d/usr/share/doc/gpuctl/jupyterhub.md"
}

# $1: maintainer script body; prints a self-contained POSIX sh script.
with_lib() {
    printf '#!/bin/sh\nset -e\n\n'
    cat packaging/scripts/lib.sh
    printf '\n'
    cat "$1"
}

# ---- 3. .deb ---------------------------------------------------------------------------------------
DEB_ARCH=$(dpkg --print-architecture 2>/dev/null || echo amd64)
DEB_VERSION=$VERSION-$RELEASE
DR=$OUT/deb-root
log "staging $DR"
stage "$DR" /usr/share/zsh/vendor-completions /lib/systemd
install -D -m 644 packaging/deb/copyright "$DR/usr/share/doc/gpuctl/copyright"
mkdir -p "$DR/DEBIAN"
SHLIBS="libc6"
if command -v dpkg-shlibdeps >/dev/null; then
    tmp=$(mktemp -d)
    mkdir "$tmp/debian"
    printf 'Source: gpuctl\n\nPackage: gpuctl\nArchitecture: any\n' >"$tmp/debian/control"
    SHLIBS=$(cd "$tmp" && dpkg-shlibdeps -O --warnings=0 "$DR/usr/bin/gpuctl" "$DR/usr/sbin/gpuctld" \
        "$DR/usr/libexec/gpuctl-exporter" \
        "$DR/lib/systemd/system-generators/gpuctl-generator" |
        sed -n 's/^shlibs:Depends=//p')
    rm -rf "$tmp"
fi
sed -e "s|@DEB_VERSION@|$DEB_VERSION|" -e "s|@DEB_ARCH@|$DEB_ARCH|" \
    -e "s|@INSTALLED_SIZE@|$(du -sk --exclude=DEBIAN "$DR" | cut -f1)|" \
    -e "s|@SHLIBS@|$SHLIBS|" -e "s|@SUMMARY@|$SUMMARY|" packaging/deb/control.in >"$DR/DEBIAN/control"
(cd "$DR" && find etc -type f | sed 's|^|/|') >"$DR/DEBIAN/conffiles"
for s in postinst prerm postrm; do
    with_lib "packaging/deb/$s" >"$DR/DEBIAN/$s"
    chmod 755 "$DR/DEBIAN/$s"
done
(cd "$DR" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
    xargs -0 md5sum) >"$DR/DEBIAN/md5sums"
DEB=$OUT/gpuctl_${DEB_VERSION}_${DEB_ARCH}.deb
rm -f "$OUT"/gpuctl_*.deb
dpkg-deb --root-owner-group -Zxz --build "$DR" "$DEB" >/dev/null
log "built $DEB ($(du -h "$DEB" | cut -f1))"

# ---- 4. .rpm ---------------------------------------------------------------------------------------
if [ "$RPM" = 1 ]; then
    command -v rpmbuild >/dev/null || die "rpmbuild not found (apt-get install rpm), or pass --no-rpm"
    RR=$OUT/rpm-root
    log "staging $RR"
    stage "$RR" /usr/share/zsh/site-functions /usr/lib/systemd
    install -D -m 644 packaging/deb/copyright "$RR/usr/share/licenses/gpuctl/copyright"
    # %files: every file; directories only where the package is their only owner.
    files=$(
        cd "$RR"
        echo '%dir /etc/gpuctl'
        echo '%dir /etc/gpuctl/policy.d'
        echo '%dir /usr/lib/gpuctl'
        echo '%dir /usr/lib/gpuctl/policy.d'
        echo '%dir /usr/share/gpuctl'
        echo '%dir /usr/share/gpuctl/jupyterhub'
        [ -d usr/share/doc/gpuctl ] && echo '%dir /usr/share/doc/gpuctl'
        [ -d usr/share/doc/gpuctl/examples ] && echo '%dir /usr/share/doc/gpuctl/examples'
        echo '%dir /usr/share/licenses/gpuctl'
        echo '%ghost %dir /run/gpuctl'
        echo '%ghost %dir /var/lib/gpuctl'
        echo '%ghost %dir /var/log/gpuctl'
        find . -type f -printf '%P\n' | LC_ALL=C sort | while read -r f; do
            case $f in
                etc/*) echo "%config(noreplace) /$f" ;;
                usr/share/licenses/*) echo "%license /$f" ;;
                *) echo "/$f" ;;
            esac
        done
    )
    lib=$(cat packaging/scripts/lib.sh)
    top=$(mktemp -d)
    SPEC=$top/gpuctl.spec
    awk -v files="$files" -v lib="$lib" -v ver="$VERSION" -v rel="$RELEASE" -v sum="$SUMMARY" '
        { gsub(/@VERSION@/, ver); gsub(/@RELEASE@/, rel); gsub(/@SUMMARY@/, sum) }
        /^@FILES@$/ { print files; next }
        /^@LIB@$/ { print lib; next }
        { print }' packaging/rpm/gpuctl.spec.in >"$SPEC"
    rm -f "$OUT"/gpuctl-*.rpm
    rpmbuild -bb --quiet --nodeps --define "_topdir $top" --define "stage $RR" \
        --define "_rpmdir $OUT" --define '_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm' \
        --target x86_64-linux "$SPEC" >"$top/rpmbuild.log" 2>&1 ||
        { cat "$top/rpmbuild.log" >&2; die "rpmbuild failed"; }
    cp "$SPEC" "$OUT/gpuctl.spec"
    rm -rf "$top"
    log "built $OUT/gpuctl-$VERSION-$RELEASE.x86_64.rpm ($(du -h "$OUT/gpuctl-$VERSION-$RELEASE.x86_64.rpm" | cut -f1))"
fi

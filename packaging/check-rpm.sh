#!/bin/bash
# packaging/check-rpm.sh - check the .rpm, which no VM scenario installs (the guests are Debian),
# against the .deb that they do install:
#   1. files: the same files with the same modes, once the two layouts' known differences are
#      mapped (units under /lib/systemd on Debian, /usr/lib/systemd on Fedora; zsh's completion
#      directory; the copyright file under doc/ or licenses/);
#   2. scriptlets: each parses (sh -n), carries the shared functions of packaging/scripts/lib.sh
#      and calls the one the .deb's matching maintainer script calls;
#   3. dependencies: systemd and dbus with the .deb's versions, and every shared library the
#      .rpm requires is one that a .deb dependency provides on this host;
#   4. install: into a scratch root with Debian's rpm (--nodeps: that rpm database knows no
#      package, Debian's are dpkg's, so every RHEL name is unmet there; they are listed), then
#      `rpm -V`, the files on disk against the payload, and an erase that leaves no file behind.
#      The scriptlets are not run there (--noscripts: the root has no /bin/sh); the .deb runs the
#      same functions in VM 10, 46 and 96.
#
# Usage: packaging/check-rpm.sh RPM DEB
# Exit status: 0 when every check passed, 1 otherwise, 2 on a usage error.
set -euo pipefail

if [ $# != 2 ] || [ ! -f "$1" ] || [ ! -f "$2" ]; then echo "usage: packaging/check-rpm.sh RPM DEB" >&2; exit 2; fi
cd "$(dirname "$0")/.."
RPM_F=$1 DEB_F=$2
failed=0
ok() { echo "check-rpm: ok - $*"; }
bad() {
    echo "check-rpm: FAIL - $1" >&2
    [ -z "${2:-}" ] || printf '%s\n' "$2" | sed 's/^/    | /' >&2
    failed=1
}

# ---- 1. files --------------------------------------------------------------------------------------
layout() {
    sed -e 's#^\(.* \)/lib/systemd/#\1/usr/lib/systemd/#' \
        -e 's#^\(.* \)/usr/share/zsh/vendor-completions/#\1/usr/share/zsh/site-functions/#' \
        -e 's#^\(.* \)/usr/share/doc/gpuctl/copyright$#\1/usr/share/licenses/gpuctl/copyright#' |
        LC_ALL=C sort
}
# "MODE PATH" of every regular file.
deb_files=$(dpkg-deb --fsys-tarfile "$DEB_F" | tar -tv | awk '$1 ~ /^-/ {p = $6; sub(/^\./, "", p); print $1, p}' | layout)
rpm_files=$(rpm -qp --qf '[%{FILEMODES:perms} %{FILENAMES}\n]' "$RPM_F" | awk '$1 ~ /^-/' | layout)
n=$(wc -l <<<"$deb_files")
if [ "$deb_files" = "$rpm_files" ]; then
    ok "the .rpm has the .deb's $n files, with the same modes"
else
    bad "the .rpm's files differ from the .deb's (< .deb, > .rpm)" "$(diff <(echo "$deb_files") <(echo "$rpm_files") || true)"
fi
[ "$n" -ge 20 ] || bad "only $n files in the .deb: not a full package"

# ---- 2. scriptlets ---------------------------------------------------------------------------------
scripts=$(mktemp -d)
trap 'rm -rf "$scripts"' EXIT
# `rpm --scripts` prints each as "NAME scriptlet (using /bin/sh):" and its body.
rpm -qp --scripts "$RPM_F" | awk -v d="$scripts" '
    / scriptlet \(using \/bin\/sh\):$/ {f = d "/rpm-" $1; next}
    / scriptlet \(using / {f = d "/rpm-other"; print > f; next}
    f {print > f}'
dpkg-deb -e "$DEB_F" "$scripts/deb"
lib_fns=$(grep -o '^gpuctl_[a-z_]*()' packaging/scripts/lib.sh | LC_ALL=C sort | xargs)
# rpm scriptlet, the .deb script it stands for, the function both must call.
for pair in postinstall:postinst:gpuctl_configure preuninstall:prerm:gpuctl_remove postuninstall:postrm:gpuctl_purge; do
    IFS=: read -r r d fn <<<"$pair"
    s=$scripts/rpm-$r
    if [ ! -s "$s" ]; then bad "the .rpm has no $r scriptlet"; continue; fi
    if ! out=$(sh -n "$s" 2>&1); then bad "the $r scriptlet does not parse" "$out"; continue; fi
    fns=$(grep -o '^gpuctl_[a-z_]*()' "$s" | LC_ALL=C sort | xargs)
    [ "$fns" = "$lib_fns" ] || bad "the $r scriptlet's functions are not lib.sh's" "rpm: $fns"$'\n'"lib.sh: $lib_fns"
    if grep -Eq "^[^#]*\\b$fn\\b([^(]|$)" "$s" && grep -Eq "^[^#]*\\b$fn\\b([^(]|$)" "$scripts/deb/$d"; then
        ok "the $r scriptlet parses and calls $fn, as the .deb's $d does"
    else
        bad "the $r scriptlet or the .deb's $d does not call $fn"
    fi
done
[ ! -e "$scripts/rpm-other" ] || bad "a scriptlet not run by /bin/sh" "$(cat "$scripts/rpm-other")"

# ---- 3. dependencies -------------------------------------------------------------------------------
deb_deps=$(dpkg-deb -f "$DEB_F" Depends)
rpm_deps=$(rpm -qpR "$RPM_F")
ver() { sed -n "s/^$1 (>= \\([^)]*\\))\$/\\1/p" <<<"$(tr ',' '\n' <<<"$deb_deps" | sed 's/^ *//')"; }
for p in systemd dbus; do
    v=$(ver "$p")
    want=$p${v:+ >= $v}
    if grep -qx "$want" <<<"$rpm_deps"; then ok "the .rpm requires '$want', as the .deb does"; else bad "the .rpm does not require '$want' (the .deb: $deb_deps)" "$rpm_deps"; fi
done
# The newest glibc symbol version the binaries use: the .deb says it as libc6's minimum.
rpm_glibc=$(grep -o 'GLIBC_[0-9.]*' <<<"$rpm_deps" | sort -V | tail -n1)
if [ -n "$rpm_glibc" ] && [ "$rpm_glibc" = "GLIBC_$(ver libc6)" ]; then
    ok "both need glibc $(ver libc6) (the .rpm's symbols up to $rpm_glibc)"
else
    bad "glibc: the .rpm's symbols go up to ${rpm_glibc:-none}, the .deb needs libc6 >= $(ver libc6)" "$deb_deps"
fi
deb_pkgs=$(tr ',' '\n' <<<"$deb_deps" | sed 's/^ *//; s/ .*//' | LC_ALL=C sort -u)
while read -r so; do
    # The Debian package that ships this library on this host.
    pkg=$(dpkg -S "*/$so" 2>/dev/null | sed -n '1s/:.*//p' | sed 's/:.*//')
    if [ -n "$pkg" ] && grep -qx "$pkg" <<<"$deb_pkgs"; then
        ok "the .rpm's $so is the .deb's $pkg"
    else
        bad "the .rpm requires $so, which no .deb dependency ships (dpkg -S: ${pkg:-none})" "$deb_deps"
    fi
done < <(sed -n 's/^\(lib[^(]*\.so[.0-9]*\)(.*/\1/p' <<<"$rpm_deps" | LC_ALL=C sort -u)

# ---- 4. install into a scratch root --------------------------------------------------------------
root=$(mktemp -d)
trap 'rm -rf "$scripts" "$root"' EXIT
rpm --root "$root" --dbpath /var/lib/rpm --initdb
unmet=$({ rpm --root "$root" --dbpath /var/lib/rpm -i --test "$RPM_F" 2>&1 || true; } |
    sed -n 's/^[[:space:]]*\(.*\) is needed by .*/\1/p')
# One line: each name once, the library symbol versions (GLIBC_2.34, ...) folded into it.
names=$(sed 's/(GLIBC_[^)]*)(64bit)$/()(64bit)/; s/(GCC_[^)]*)(64bit)$/()(64bit)/' <<<"$unmet" | LC_ALL=C sort -u | paste -sd, - | sed 's/,/, /g')
glibc=$(grep -o 'GLIBC_[0-9.]*' <<<"$unmet" | sort -V | tail -n1)
echo "check-rpm: RHEL names Debian's rpm cannot satisfy (its database has no package: Debian's are dpkg's), so --nodeps: $names (glibc symbols up to $glibc)"
[ -n "$unmet" ] || bad "rpm -i --test into an empty root found no unmet dependency: the .rpm requires nothing?"
if ! out=$(rpm --root "$root" --dbpath /var/lib/rpm -i --nodeps --noscripts "$RPM_F" 2>&1); then
    bad "rpm -i into a scratch root failed" "$out"
else
    if out=$(rpm --root "$root" --dbpath /var/lib/rpm -V --nodeps gpuctl 2>&1); then
        ok "rpm -V: every installed file matches the package (digest, mode, size)"
    else
        bad "rpm -V reports differences" "$out"
    fi
    on_disk=$(cd "$root" && find . -type f ! -path './var/lib/rpm/*' ! -path './usr/lib/sysimage/*' -printf '/%P\n' | LC_ALL=C sort)
    payload=$(rpm -qp --qf '[%{FILEMODES:perms} %{FILENAMES}\n]' "$RPM_F" | awk '$1 ~ /^-/ {print $2}' | LC_ALL=C sort)
    if [ "$on_disk" = "$payload" ]; then ok "installed: the payload's $(wc -l <<<"$payload") files, nothing else"; else bad "the scratch root's files differ from the payload" "$(diff <(echo "$payload") <(echo "$on_disk") || true)"; fi
    rpm --root "$root" --dbpath /var/lib/rpm -e --nodeps --noscripts gpuctl
    left=$(cd "$root" && find . -type f ! -path './var/lib/rpm/*' ! -path './usr/lib/sysimage/*' -printf '/%P\n')
    if [ -z "$left" ]; then ok "rpm -e removed every file"; else bad "rpm -e left files behind" "$left"; fi
fi

if [ $failed = 0 ]; then echo "check-rpm: PASS"; else echo "check-rpm: FAIL"; fi
exit $failed

#!/bin/bash
# 98: `@group` membership from LDAP, for real: slapd (a fresh directory on 127.0.0.1) and
# nslcd/libnss-ldapd with nsswitch `group: files ldap`. dave's group ldap-ml exists only in LDAP;
# team ml = ["@ldap-ml"]: dave joins it with `gpuctl run`; removed from the group in LDAP, he is
# refused on the next try (nslcd keeps no cache, nscd is not installed). The shipped
# nss-network.conf drop-in, enabled, gives gpuctld AF_INET/AF_INET6 (NSS modules that open TCP
# themselves); nslcd itself needs no drop-in, it answers over a Unix socket.
# vmtest: timeout=600
# vmtest: group=fleet
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh

echo "slapd: $(dpkg-query -W -f='${Version}' slapd), nslcd: $(dpkg-query -W -f='${Version}' nslcd)"
gpuctld_setup 2
id dave >/dev/null 2>&1 || useradd -m -s /bin/bash dave
check "ldap-ml is not a local group" sh -c '! grep -q "^ldap-ml:" /etc/group'

# --- the directory: our own slapd instance (the package's is disabled and unconfigured) ----------
L=/tmp/ldap
mkdir -p $L/db
cat >$L/slapd.conf <<'EOF2'
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/nis.schema
include /etc/ldap/schema/inetorgperson.schema
pidfile /tmp/ldap/slapd.pid
modulepath /usr/lib/ldap
moduleload back_mdb
database mdb
maxsize 16777216
suffix "dc=example,dc=org"
rootdn "cn=admin,dc=example,dc=org"
rootpw secret
directory /tmp/ldap/db
access to * by * read
EOF2
systemctl stop slapd.service nslcd.service 2>/dev/null
slapd -f $L/slapd.conf -h ldap://127.0.0.1/ </dev/null >$L/start.log 2>&1 # detaches
ADM=(-x -H ldap://127.0.0.1/ -D "cn=admin,dc=example,dc=org" -w secret)
check "slapd answers on ldap://127.0.0.1/" wait_for 20 ldapsearch -x -H ldap://127.0.0.1/ -b "" -s base
check_output "the directory takes the group" ldapadd "${ADM[@]}" <<'EOF2'
dn: dc=example,dc=org
objectClass: dcObject
objectClass: organization
o: example
dc: example

dn: ou=groups,dc=example,dc=org
objectClass: organizationalUnit
ou: groups

dn: cn=ldap-ml,ou=groups,dc=example,dc=org
objectClass: posixGroup
cn: ldap-ml
gidNumber: 5100
memberUid: dave
EOF2

# --- NSS: nslcd + libnss-ldapd, groups from files then LDAP --------------------------------------
cat >/etc/nslcd.conf <<'EOF2'
uid nslcd
gid nslcd
uri ldap://127.0.0.1/
base dc=example,dc=org
EOF2
chmod 640 /etc/nslcd.conf; chgrp nslcd /etc/nslcd.conf
sed -i 's/^group:.*/group:          files ldap/' /etc/nsswitch.conf
grep '^group:' /etc/nsswitch.conf
check "nslcd starts" systemctl start nslcd.service
check_output "NSS sees the LDAP group" getent group ldap-ml
check "dave is in ldap-ml through NSS" sh -c 'id -nG dave | grep -qw ldap-ml'

# --- gpuctl: team ml is @ldap-ml ------------------------------------------------------------------
put_policy 98-ldap.toml <<'P'
version = 1
[teams.ml]
members = ["@ldap-ml"]
memory-max = "256M"
[[gpu]]
index = [0]
owner = "ml"
P
gpuctld_start
echo "gpuctld RestrictAddressFamilies=$(systemctl show -P RestrictAddressFamilies gpuctld.service)"
out=$(as dave 'gpuctl run --team ml -- cat /proc/self/cgroup' 2>&1); rc=$?
echo "dave: gpuctl run --team ml -> rc=$rc: $out"
check "dave (group only in LDAP) joins team ml" \
    grep -Eq '^0::/gpu.slice/gpu-ml.slice/gpuctl-run-[0-9a-f]{16}.scope$' <<<"$out"
check_output "gpuctl teams lists ml for dave" sh -c "su -s /bin/sh dave -c 'gpuctl teams' | grep -w ml"

# --- removed from the group in LDAP: refused on the next try -------------------------------------
check_output "dave removed from ldap-ml in LDAP" ldapmodify "${ADM[@]}" <<'EOF2'
dn: cn=ldap-ml,ou=groups,dc=example,dc=org
changetype: modify
delete: memberUid
memberUid: dave
EOF2
check "NSS no longer lists dave in ldap-ml" sh -c '! id -nG dave | grep -qw ldap-ml'
t=$(date +%s%N)
msg=$(as dave 'gpuctl run --team ml -- true' 2>&1); rc=$?
echo "dave after removal: rc=$rc: $msg ($((($(date +%s%N) - t) / 1000000)) ms)"
check "dave is refused with exit 3 (not a member)" test $rc = 3
check "the refusal names the team's members" grep -qF '(members: @ldap-ml)' <<<"$msg"

# --- the network drop-in, as shipped: disabled; enabled, gpuctld may open AF_INET sockets -------
D=/usr/share/gpuctl/gpuctld.service.d/nss-network.conf
check "the drop-in is shipped" test -f $D
stock=$(systemctl show -P RestrictAddressFamilies gpuctld.service)
check "stock sandbox: no AF_INET" bash -c '! grep -qw AF_INET <<<"$1"' _ "$stock"
# What the property does, shown on the same LDAP server: TCP from a sandbox like gpuctld's.
tcp() { systemd-run --wait --pipe -q -p RestrictAddressFamilies="$1" bash -c 'exec 3<>/dev/tcp/127.0.0.1/389 && echo connected' 2>&1; }
r=$(tcp "$stock"); echo "TCP to slapd under gpuctld's stock families: $r"
check "stock families refuse a TCP socket" grep -q 'Address family not supported' <<<"$r"
mkdir -p /etc/systemd/system/gpuctld.service.d
ln -sf $D /etc/systemd/system/gpuctld.service.d/
systemctl daemon-reload
gpuctld_start
wide=$(systemctl show -P RestrictAddressFamilies gpuctld.service)
echo "with the drop-in: RestrictAddressFamilies=$wide"
check "enabled: gpuctld may use AF_INET and AF_INET6" \
    bash -c 'grep -qw AF_INET <<<"$1" && grep -qw AF_INET6 <<<"$1"' _ "$wide"
r=$(tcp "$wide"); echo "TCP to slapd under the drop-in's families: $r"
check "the drop-in's families allow the TCP socket" test "$r" = connected
check "gpuctld runs with it" systemctl is-active -q gpuctld.service
# Back in the group: joins again under the wider sandbox, no restart of anything LDAP-side.
ldapmodify "${ADM[@]}" >/dev/null <<'EOF2'
dn: cn=ldap-ml,ou=groups,dc=example,dc=org
changetype: modify
add: memberUid
memberUid: dave
EOF2
out=$(as dave 'gpuctl run --team ml -- cat /proc/self/cgroup' 2>&1)
check "dave, added back in LDAP, joins again" grep -q 'gpu-ml.slice' <<<"$out"

rm -f /etc/systemd/system/gpuctld.service.d/nss-network.conf
systemctl stop nslcd.service
kill "$(cat $L/slapd.pid)" 2>/dev/null
sed -i 's/^group:.*/group:          files/' /etc/nsswitch.conf
finish

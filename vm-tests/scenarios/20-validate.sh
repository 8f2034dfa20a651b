#!/bin/bash
# `gpuctl validate` accepts the shipped default policy and every example in policies/, and rejects
# a broken file naming it (so a validate that accepts everything does not pass).
# vmtest: group=pkg
. lib/common.sh

check_output "gpuctl validate (the host's policy directories)" gpuctl validate
check_output "gpuctl validate /etc/gpuctl/policy.toml" gpuctl validate /etc/gpuctl/policy.toml

n=0
for p in /test/policies/*.toml; do
    [ -e "$p" ] || continue
    n=$((n + 1))
    check_output "gpuctl validate policies/${p##*/}" gpuctl validate "$p"
done
if [ $n -gt 0 ]; then pass "$n example policies found"; else fail "no example policies in policies/"; fi

printf 'version = 1\nno_such_key = true\n' >/tmp/broken.toml
out=$(gpuctl validate /tmp/broken.toml 2>&1)
rc=$?
_vm_show "$out"
if [ $rc -eq 1 ]; then pass "a file with an unknown key exits 1"; else fail "a file with an unknown key exits 1 (got $rc)"; fi
if echo "$out" | grep -q '/tmp/broken.toml:2'; then
    pass "the error names the file and line"
else
    fail "the error names the file and line (/tmp/broken.toml:2)"
fi
finish

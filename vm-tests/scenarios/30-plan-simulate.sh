#!/bin/bash
# `gpuctl plan --simulate` runs on the installed binary: on the default policy, and on example D
# (8 GPUs, 5 teams) placed as /etc/gpuctl/policy.toml of a test root; then apply + check converge.
# vmtest: group=pkg
. lib/common.sh

check_output "gpuctl plan --simulate 'h100-80gb*8' (default policy)" gpuctl plan --simulate 'h100-80gb*8'

ex=$(find /test/policies -maxdepth 1 -name 'd-*.toml' | head -n1)
if [ -z "$ex" ]; then
    fail "example D (policies/d-*.toml) is in the repository"
else
    root=/tmp/root-d
    mkdir -p $root/etc/gpuctl
    cp "$ex" $root/etc/gpuctl/policy.toml
    VMTEST_SHOW_LINES=25 check_output "gpuctl --root $root plan --simulate 'h100-80gb*8' (${ex##*/})" \
        gpuctl --root $root plan --simulate 'h100-80gb*8'
    plan=$(gpuctl --root $root plan --simulate 'h100-80gb*8' 2>&1)
    empty=$(gpuctl plan --simulate 'h100-80gb*8' 2>&1)
    check_not "example D's plan differs from the empty policy's" test "$plan" = "$empty"
    st=/tmp/sim-state.json
    check_output "apply --simulate --state" gpuctl --root $root apply --simulate 'h100-80gb*8' --state $st
    check_output "check after apply: converged (exit 0)" gpuctl --root $root check --simulate 'h100-80gb*8' --state $st
fi
finish

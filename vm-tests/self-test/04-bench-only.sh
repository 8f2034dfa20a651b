#!/bin/bash
# Harness self-test: a benchmark-only scenario (bench-only.list). A full run runs it short: the
# guest sees VMTEST_SHORT=1 and its BENCH lines stay out of the summary.
# vmtest: group=selftest
. lib/common.sh
check "a full run runs a bench-only scenario short (VMTEST_SHORT=1)" test "$(bench_size full short)" = short
echo "BENCH self-test: a figure of a short run, never reported"
finish

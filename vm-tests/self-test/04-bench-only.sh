#!/bin/bash
# Harness self-test: a benchmark-only scenario (bench-only.list). A full run does not run it;
# --short runs it with VMTEST_SHORT=1 and leaves its BENCH lines out of the summary.
# vmtest: no-install
. lib/common.sh
check "--short runs a bench-only scenario short (VMTEST_SHORT=1)" test "$(bench_size full short)" = short
echo "BENCH self-test: a figure of a short run, never reported"
finish

#!/bin/bash
# Harness self-test: a benchmark-only scenario. Full runs must list it and never boot it; were it
# run, it would fail.
# vmtest: bench-only=self-test: must not run in a full run
. lib/common.sh
check "a full run does not run a bench-only scenario" false
finish

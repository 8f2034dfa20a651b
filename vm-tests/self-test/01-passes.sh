#!/bin/bash
# Harness self-test: must PASS. The package is installed by the harness before this runs.
# vmtest: group=selftest
. lib/common.sh
check "gpuctl is installed" dpkg -s gpuctl
finish

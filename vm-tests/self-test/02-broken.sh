#!/bin/bash
# Harness self-test: deliberately broken, must be reported FAIL with this evidence.
# vmtest: group=selftest
. lib/common.sh
check "the package is installed" dpkg -s gpuctl
check "deliberately broken: /etc/gpuctl/no-such-file exists" test -e /etc/gpuctl/no-such-file
finish

#!/bin/bash
# Harness self-test: hangs; the harness must kill the VM and report a timeout.
# 60 s: enough for the guest to print something on an idle 2-core host; on a loaded one it may
# print nothing, and the harness's "printed nothing" path (boot again, then fail) is checked.
# vmtest: no-install
# vmtest: timeout=60
echo "about to hang"
sleep infinity

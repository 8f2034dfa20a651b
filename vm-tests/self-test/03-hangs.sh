#!/bin/bash
# Harness self-test: hangs; the harness must kill the VM and report a timeout.
# 60 s, not less: the check that its console is kept needs the guest to have printed something,
# and on a loaded 2-core host a TCG guest printed nothing in its first 30 s.
# vmtest: no-install
# vmtest: timeout=60
echo "about to hang"
sleep infinity

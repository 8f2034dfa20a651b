#!/bin/bash
# Harness self-test: hangs; the harness must kill the VM and report a timeout.
# vmtest: no-install
# vmtest: timeout=30
echo "about to hang"
sleep infinity

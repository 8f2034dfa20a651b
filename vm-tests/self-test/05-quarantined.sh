#!/bin/bash
# Harness self-test: a quarantined scenario. A full run never boots it and counts it as failed.
# vmtest: quarantine=self-test: a full run must report this as failed, not drop it
. lib/common.sh
check "a full run does not run a quarantined scenario" false
finish

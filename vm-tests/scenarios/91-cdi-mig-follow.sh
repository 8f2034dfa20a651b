#!/bin/bash
# 91: the CDI spec follows the MIG layout. GPU 0 split 3g.40gb for infer; the spec names its
# parent node and the GI/CI cap nodes gpuctld created, and a container sees and opens exactly
# those. The policy changes to two 1g.10gb for infer: after the reload the spec names the new cap
# nodes and MIG UUIDs (the old caps are gone from it), a new container gets them, and a further
# reconcile writes nothing (the plan stays empty).
# vmtest: timeout=600
# vmtest: group=usage
# Probe output is indented with sed; the flags of `gpuctl env --format cdi` are meant to split.
# shellcheck disable=SC2001,SC2011,SC2012,SC2046,SC2086,SC2119
. lib/common.sh
. lib/fake-hw.sh
. lib/gpuctld.sh
. lib/cdi.sh

gpuctld_setup 2
put_policy 91-mig.toml <<'P'
version = 1
[teams.infer]
memory-max = "256M"
[teams.train]
[[gpu]]
index = [0]
mig = [
  { profile = "3g.40gb", owner = "infer" },
  { profile = "2g.20gb", owner = "train" },
]
[[gpu]]
index = [1]
owner = "train"
P
gpuctld_start
check "gpuctld converged (2 teams, 2 GPUs)" wait_converged 60 2 2
S=$FAKE_NVML_STATE
spec_caps() { jq -r '.devices[0].containerEdits.deviceNodes[].path' "$(cdi_spec infer)" | grep nvidia-caps/ | sort; }
slice_caps() { systemctl show -P DeviceAllow gpu-infer.slice | tr ' ' '\n' | grep '^/dev/nvidia-caps/' | sort; }
spec_cvd() { jq -r '.devices[0].containerEdits.env[]' "$(cdi_spec infer)" | sed -n 's/^CUDA_VISIBLE_DEVICES=//p'; }
infer_uuids() { jq -r --argjson p "$1" '[.gpus[0].gpu_instances[] | select(.profile_id == $p) | .compute_instances[].uuid] | join(",")' "$S"; }

caps1=$(spec_caps)
echo "infer's caps (3g.40gb): $(xargs <<<"$caps1")"
check "spec caps = DeviceAllow caps (one GI + one CI)" test "$caps1" = "$(slice_caps)" -a "$(wc -l <<<"$caps1")" = 2
check "spec CUDA_VISIBLE_DEVICES = the 3g.40gb MIG device's UUID" test "$(spec_cvd)" = "$(infer_uuids 9)"
NODES="/dev/nvidia0 /dev/nvidia1 $(xargs <<<"$caps1")"
export NODES
out=$(in_ctr $(gpuctl env --team infer --format cdi) -e NODES -- "$PROBE" 2>&1)
echo "$out" | sed 's/^/    before| /'
require_nonempty "infer's cap nodes (3g.40gb)" "$caps1"
for c in $caps1 /dev/nvidia0; do
    check "inside: $c opens (ENXIO)" test "$(field "$out" "node $c")" = ENXIO
done
check "inside: /dev/nvidia1 (train's whole GPU) absent" test "$(field "$out" "node /dev/nvidia1")" = ABSENT

# The layout changes: infer gets two 1g.10gb instead.
put_policy 91-mig.toml <<'P'
version = 1
[teams.infer]
memory-max = "256M"
[teams.train]
[[gpu]]
index = [0]
mig = [
  { profile = "1g.10gb", owner = "infer", count = 2 },
  { profile = "2g.20gb", owner = "train" },
]
[[gpu]]
index = [1]
owner = "train"
P
reload_wait
check "converged on the new layout" wait_converged 60 2 2
caps2=$(spec_caps)
echo "infer's caps (2x 1g.10gb): $(xargs <<<"$caps2")"
check "after the change: spec caps = DeviceAllow caps (two GIs + two CIs)" test "$caps2" = "$(slice_caps)" -a "$(wc -l <<<"$caps2")" = 4
check "after the change: spec CUDA_VISIBLE_DEVICES = the two 1g.10gb UUIDs" test "$(spec_cvd)" = "$(infer_uuids 19)"
check "after the change: no placeholder in the spec" sh -c "! grep -q '<' $(cdi_spec infer)"
gone=$(comm -23 <(echo "$caps1") <(echo "$caps2"))
echo "caps no longer infer's: $(xargs <<<"$gone")"
NODES="/dev/nvidia0 $(xargs <<<"$caps2") $(xargs <<<"$gone")"
out=$(in_ctr $(gpuctl env --team infer --format cdi) -e NODES -- "$PROBE" 2>&1)
echo "$out" | sed 's/^/    after| /'
require_nonempty "infer's cap nodes (2x 1g.10gb)" "$caps2"
for c in $caps2; do
    check "inside: new $c opens (ENXIO)" test "$(field "$out" "node $c")" = ENXIO
done
require_nonempty "cap nodes infer lost" "$gone"
for c in $gone; do
    check "inside: old $c is not there" test "$(field "$out" "node $c")" = ABSENT
done
check "inside: CUDA_VISIBLE_DEVICES names the new MIG devices" \
    test "$(field "$out" env | sed -n 's/^CUDA_VISIBLE_DEVICES=//p')" = "$(infer_uuids 19)"

m1=$(stat -c %Y "$(cdi_spec infer)")
reload_wait
check "a further reconcile leaves the spec alone (plan empty)" test "$(stat -c %Y "$(cdi_spec infer)")" = "$m1"
check_output "gpuctl check: converged" gpuctl check
finish

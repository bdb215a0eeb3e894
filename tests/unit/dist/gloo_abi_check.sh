#!/usr/bin/env bash
# The Gloo declaration shim (src/dist/gloo_shim) is only safe while (1) the wheel's GlooStore
# vtable still has the 14 slots the shim declares, and (2) no Strata binary emits a GlooStore
# vtable or references a gloo symbol of its own (libtorch's copies are the only ones used).
# usage: gloo_abi_check.sh LIBTORCH_CPU BINARY
set -euo pipefail
libtorch=$1 binary=$2
vtable=$(nm -DS --defined-only "$libtorch" | awk '$4 == "_ZTVN4c10d16ProcessGroupGloo9GlooStoreE" {print $2}')
if [[ $vtable != 0000000000000070 ]]; then
  echo "FAIL: the GlooStore vtable in $libtorch is '$vtable' bytes, the shim declares 0x70"
  exit 1
fi
if nm -C "$binary" | grep -E " [VvWwTt] (vtable for c10d::ProcessGroupGloo::GlooStore|gloo::)"; then
  echo "FAIL: $binary defines gloo code or the GlooStore vtable itself"
  exit 1
fi
echo "1 passed, 0 failed"

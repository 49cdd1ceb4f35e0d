#!/usr/bin/env bash
# Builds the kernel variants of runs 37, 38 and 40 from their patches: each NAME.patch is a
# unified diff of one kernel as this build generates it (op_attention_decode.wgsl or
# op_attention_combine_q8.wgsl) to the variant, applied to the kernels `gpu_decode_profile`
# dumps (LOWBIT_PROFILE_DUMP, the binary's own with LOWBIT_PROFILE_BUILTIN=1; any bundle
# serves to start it) into OUT/NAME/FILE, the layout LOWBIT_PROFILE_SOURCES=OUT/NAME takes.
# Run here before a device run and carry OUT (the device image may lack `patch`); a build
# whose kernels moved makes a patch fail to apply, which stops the script.
#   make.sh GPU_DECODE_PROFILE BUNDLE OUT
set -eu
[ $# -eq 3 ] || { echo "usage: make.sh GPU_DECODE_PROFILE BUNDLE OUT" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
out=$3
base=$(mktemp -d)
trap 'rm -rf "$base"' EXIT
LOWBIT_PROFILE_BUILTIN=1 LOWBIT_PROFILE_DUMP=$base "$1" "$2" > /dev/null
rm -rf "$out"
for p in "$here"/*.patch; do
  name=$(basename "$p" .patch)
  file=$(sed -n 's/^+++ //p' "$p" | head -1)
  mkdir -p "$out/$name"
  patch -s -o "$out/$name/$file" "$base/$file" < "$p"
done
echo "$(ls "$here"/*.patch | wc -l) variants in $out"

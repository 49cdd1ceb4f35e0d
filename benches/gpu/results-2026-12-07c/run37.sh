#!/usr/bin/env bash
# Device run 37 (twenty-sixth session, 2026-12-07): where the decode attention's and the
# combine's time goes in the 8B step, and one candidate that keeps every bit. Each
# variant (variants/NAME.patch, built by `variants/make.sh .gpubin/gpu_decode_profile BUNDLE
# .gpubin/variants` here before the run) is a kernel source that `gpu_decode_profile`
# compiles in place of the one of the same name (LOWBIT_PROFILE_SOURCES; it first compares one decode step's logits
# with and without the variant): a1 (the attention's first tile of cache words loaded
# before q is staged: the same bits), and probes with wrong outputs (p_attn_exit: the
# attention's workgroups exit at once; p_attn_noloop: staging and stores without the tile
# loop; p_comb_exit; p_comb_noquant: the combine without the int8 quantization). Baseline
# and a1 alternate. All with LOWBIT_GPU_UNCHECKED=1 (a replaced kernel is not the binary's
# own). Carry .gpubin (convert, gpu_decode_profile) and .anchor.
set -u
cd "$(dirname "$0")/../../.."
RUN=run37; . benches/gpu/device_env.sh
V=$B/variants
save() { tar czf $O/run37.tar.gz -C $W .; }
rm -rf /tmp/minicpm8b.bundle
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
el "setup"
export LOWBIT_GPU_UNCHECKED=1
prof() { # NAME [VARIANT]
  if [ -n "${2:-}" ]; then LOWBIT_PROFILE_SOURCES=$V/$2 $B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-$1.md 2>&1
  else $B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-$1.md 2>&1; fi
  echo "== $1"; grep -h "logits\|step (one pass)\|op_attention\|Error" $W/profile-$1.md | sed 's/items in passes.*//'
}
prof base-1; prof a1-1 a1; prof base-2; prof a1-2 a1
el "a1"; save
for v in p_attn_exit p_attn_noloop p_comb_exit p_comb_noquant; do prof $v $v; done
el "probes"; save

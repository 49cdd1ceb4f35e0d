#!/usr/bin/env bash
# The decode step's team (src/runtime/team.rs) against rayon's fork-join per loop: the same
# binary, LOWBIT_CPU_TEAM=1 (default) and =0 alternating, ROUNDS rounds, each model in turn,
# beside llama-bench's decode in the same minutes. Usage:
#   team-ab.sh CONVERT LLAMA_BENCH [ROUNDS] [THREADS]
# with /tmp/b/{smollm2,qwen,gemma}.bundle (`convert pack -q GGUF -o ...`) and the GGUFs in
# $LOWBIT_CACHE/models. Prints one line per run: model, side, decode tok/s.
set -u
C=$1; LB=$2; R=${3:-3}; T=${4:-2}
M=${LOWBIT_CACHE:-$HOME/.cache/lowbit}/models
declare -A G=([smollm2]=SmolLM2-135M-Instruct.Q4_1.gguf [qwen]=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf [gemma]=gemma-3-270m-q4_k_m.gguf)
dec() { python3 -c "import json,sys; print(round(json.load(sys.stdin)['decode_tokens_per_second'],1))"; }
for r in $(seq "$R"); do
  for m in smollm2 qwen gemma; do
    a=$(LOWBIT_CPU_TEAM=1 "$C" bench /tmp/b/$m.bundle --threads "$T" --prompt-tokens 64 --gen-tokens 64 --repeats 2 --json | dec)
    b=$(LOWBIT_CPU_TEAM=0 "$C" bench /tmp/b/$m.bundle --threads "$T" --prompt-tokens 64 --gen-tokens 64 --repeats 2 --json | dec)
    l=$("$LB" -m "$M/${G[$m]}" -t "$T" -p 0 -n 64 -r 2 -o csv 2>/dev/null | tail -1 | awk -F, '{gsub(/"/,""); print $(NF-1)}')
    echo "round $r $m team $a rayon $b llama $l"
  done
done

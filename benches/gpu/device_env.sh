# Sourced by device run scripts (benches/gpu/results-*/run*.sh from 2026-12-05 on; the first,
# results-2026-12-05/run1.sh, was written as benches/gpu/next_run.sh): the setup the earlier
# run scripts each wrote out. Run from the
# repository root on an offline nvidia-h200 machine with `.gpubin` (convert and the examples,
# built here and stripped) and `.anchor` (../shared/anchors/gpu/prepare.sh; `.anchor/shapes`
# from `benches/gpu/shape_copy.py describe`) carried.
#   RUN  the run's name (its work folder /tmp/$RUN and tarball $OUT/$RUN.tar.gz)
#   NO_8B  set: no 8B GGUF (a run on the shape copies only; .anchor's generator and
#          tokenizer need not be carried)
# `.gpubin/bin.tar.xz`, where carried, is unpacked into .gpubin first (three stripped binaries
# are about 35 MB, 10 xz-compressed, against the 64 MiB a run carries).
# Gives: R (root), B (.gpubin), O ($OUT), W (work folder), el (elapsed-time echo), summary
# (one line from a `convert bench --json` report), `greedy_check` (below), the Vulkan loader
# and gguf-py installed,
# /tmp/minicpm8b.gguf generated (once a machine), VK_DRIVER_FILES at NVIDIA's ICD, and
# `copies` (the shape copies' GGUFs and bundles in /tmp, once a machine).
R=$PWD; B=$R/.gpubin; [ -f "$B/bin.tar.xz" ] && tar xJf "$B/bin.tar.xz" -C "$B"; O=${OUT:-/tmp/out}; W=/tmp/${RUN:?RUN names the run}; mkdir -p "$O" "$W" /tmp/shapes
t0=$(date +%s); el() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
for f in .anchor/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/gguf-site .anchor/gguf-0.19.0-py3-none-any.whl
[ -n "${NO_8B:-}" ] || [ -f /tmp/minicpm8b.gguf ] || PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json > /dev/null
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$W/nvidia-smi.txt" 2>&1
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token') or 0, 3))" "$1"; }
copies() { # SmolLM2, Qwen2.5 and Gemma 3 shape copies: /tmp/NAME.copy.gguf and /tmp/NAME.bundle
  for m in smollm2 qwen2.5 gemma3; do
    [ -f .anchor/shapes/$m.json.gz ] || continue
    [ -f /tmp/$m.copy.gguf ] || { gunzip -c .anchor/shapes/$m.json.gz > /tmp/shapes/$m.json
      PYTHONPATH=/tmp/gguf-site python3 benches/gpu/shape_copy.py generate /tmp/shapes/$m.json /tmp/$m.copy.gguf > /dev/null; }
    [ -d /tmp/$m.bundle ] || "$B/convert" pack -q -o /tmp/$m.bundle /tmp/$m.copy.gguf
  done
}
# greedy_check BUNDLE N: N greedy ids of a fixed 40-token prompt and the first step's logits on
# the GPU against the CPU f32 reference; one line into $W/checks.txt (and stdout).
greedy_check() {
  local ids=1,2345,678,9012,345,6789,1111,2222,3333,4444,5555,6666,7777,8888,9999,1234,4321,100,200,300,400,500,600,700,800,900,1000,1100,1200,1300,1400,1500,1600,1700,1800,1900,2000,2100,2200,2300
  "$B/convert" run "$1" --backend gpu --prompt-ids $ids --max-tokens "$2" --ignore-eos --print-ids --dump-logits $W/logits-gpu.f32 > $W/run-gpu.txt 2> $W/ids-gpu.txt
  "$B/convert" run "$1" --prompt-ids $ids --max-tokens "$2" --ignore-eos --print-ids --kernel f32 --dump-logits $W/logits-cpu.f32 > $W/run-cpu.txt 2> $W/ids-cpu.txt
  python3 - $W "$2" <<'PY' | tee -a $W/checks.txt
import sys, struct
w, n = sys.argv[1], sys.argv[2]
def f(k):
    b = open('%s/logits-%s.f32' % (w, k), 'rb').read(); return struct.unpack('%df' % (len(b) // 4), b)
def ids(k):
    l = [l for l in open('%s/ids-%s.txt' % (w, k)) if 'generated ids' in l.lower()]; return l[-1].strip() if l else 'none'
c = f('cpu'); g = f('gpu'); top = sorted(range(len(c)), key=lambda i: -c[i])[:2]
print('cpu f32 first-step top-2 margin %.4g' % (c[top[0]] - c[top[1]]))
print('gpu max |logit - cpu f32| %.4g, argmax equal %s, %s greedy ids equal to cpu f32: %s' % (max(abs(a - b) for a, b in zip(g, c)), max(range(len(g)), key=g.__getitem__) == top[0], n, ids('gpu') == ids('cpu')))
PY
  rm -f $W/*.f32
}

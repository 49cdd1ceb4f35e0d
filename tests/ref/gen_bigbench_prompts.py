#!/usr/bin/env python3
"""BIG-bench's own prompt formatting and output post-processing, the reference of
tests/eval.rs.

    gen_bigbench_prompts.py BIGBENCH_DIR [--out testdata/eval/bigbench-prompts.json]

BIGBENCH_DIR is the `bigbench` package folder of the bigbench==1.0.0 sdist (`make eval-data`
extracts it). bigbench/api/json_task.py imports TensorFlow at module level, so the two
functions used here (`default_format_fn` from api/json_task.py and `postprocess_output` from
models/model_utils.py) are taken from the sources by name with `ast` and run on their own
with numpy and re: the prompt of the first examples of each task (task_prefix + the formatted
input, zero-shot), and the post-processed form of sample outputs under each task's
stop_string/output_regex.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np

TASKS = ["arithmetic/2_digit_addition", "strategyqa", "sports_understanding", "navigate"]
DEFAULT_REGEX = None  # read from json_task.py
SAMPLES = ["109", " 109\nQ: What", "The answer is 42. 7*7 = 49", "Yes. Because", "\n\nNo", "",
           "plausible\n", "  implausible. It is", "-12 apples", "True;False"]


def function_from(path: Path, name: str, env: dict):
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec")
            exec(code, env)
            return env[name]
    sys.exit(f"{path}: no function {name}")


def constant_from(path: Path, name: str):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    sys.exit(f"{path}: no constant {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bigbench", type=Path)
    ap.add_argument("--out", type=Path, default=Path("testdata/eval/bigbench-prompts.json"))
    ap.add_argument("--examples", type=int, default=5)
    a = ap.parse_args()
    env = {"np": np, "re": re, "Dict": dict, "Any": object, "List": list}
    jt = a.bigbench / "api" / "json_task.py"
    fmt = function_from(jt, "default_format_fn", env)
    post = function_from(a.bigbench / "models" / "model_utils.py", "postprocess_output", env)
    default_regex = constant_from(jt, "_DEFAULT_REGEX")
    out = {"generator": "tests/ref/gen_bigbench_prompts.py", "bigbench": "1.0.0", "tasks": {}}
    for t in TASKS:
        p = a.bigbench / "benchmark_tasks" / t / "task.json"
        raw = p.read_bytes()
        d = json.loads(raw)
        mc = d.get("preferred_score") != "exact_str_match"
        prompts = []
        for ex in d["examples"][: a.examples]:
            ex = dict(ex)
            if not mc:
                # lowbit runs exact-match tasks without listing choices (module doc of
                # src/eval/tasks.rs): format the example as BIG-bench would without them.
                ex.pop("target_scores", None)
            s = fmt(ex, input_prefix=d.get("example_input_prefix", "\nQ: "),
                    output_prefix=d.get("example_output_prefix", "\nA: "),
                    choice_prefix=d.get("choice_prefix", "\n  choice: "), random_seed=42,
                    append_choices_to_input=d.get("append_choices_to_input", True))
            prompts.append(d.get("task_prefix", "") + s["input"])
        stop = d.get("stop_string")
        regex = d.get("output_regex")
        if regex is None and stop is None:
            regex = default_regex
        outputs = [[x, post(x, None, stop, regex)] for x in SAMPLES]
        out["tasks"][t] = {"sha256": hashlib.sha256(raw).hexdigest(), "prompts": prompts,
                           "postprocess": outputs}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

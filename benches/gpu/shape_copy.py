"""A GGUF with a real model's metadata, tensor names, shapes and types, and random block bytes
(valid, small block scales): for speed measurement on a machine the real file cannot reach (the
GPU machine takes at most 64 MiB per transfer). Decode and prompt speed depend on the shapes and
the encodings, not on the values.

usage: shape_copy.py describe IN.gguf OUT.json     (here: metadata and tensor list)
       shape_copy.py generate IN.json OUT.gguf [SEED]  (there: a GGUF of random blocks)
"""
import json
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as VT


def describe(src, out):
    r = gguf.GGUFReader(src)
    fields = []
    for name, f in r.fields.items():
        if name.startswith('GGUF.') or name == 'general.alignment':
            continue
        vt = f.types[0]
        sub = f.types[1] if vt == VT.ARRAY and len(f.types) > 1 else None
        fields.append({'name': name, 'type': int(vt), 'sub': None if sub is None else int(sub),
                       'value': f.contents()})
    tensors = [{'name': t.name, 'type': int(t.tensor_type), 'shape': [int(x) for x in t.shape]}
               for t in r.tensors]
    json.dump({'source': src.split('/')[-1], 'arch': r.fields['general.architecture'].contents(),
               'fields': fields, 'tensors': tensors}, open(out, 'w'))


def blocks(rng, ty, n):
    """n elements of type ty: random bytes with small, finite block scales."""
    bs, ts = gguf.GGML_QUANT_SIZES[ty]
    nb = n // bs
    b = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    h = lambda v: np.frombuffer(np.float16(v).tobytes(), np.uint8)
    if ty in (Q.Q4_0, Q.Q5_0, Q.Q8_0):
        b[:, 0:2] = h(0.0004 if ty == Q.Q8_0 else 0.004)
    elif ty in (Q.Q4_1, Q.Q5_1):
        b[:, 0:2] = h(0.004); b[:, 2:4] = h(-0.03)
    elif ty in (Q.Q4_K, Q.Q5_K, Q.Q2_K):
        b[:, 0:2] = h(0.0002); b[:, 2:4] = h(0.0001)
    elif ty == Q.Q3_K:
        b[:, ts - 2:ts] = h(0.0005)
    elif ty == Q.Q6_K:
        b[:, 192:208] = rng.integers(-8, 8, size=(nb, 16), dtype=np.int8).view(np.uint8)
        b[:, 208:210] = h(0.0005)
    elif ty == Q.TQ2_0:
        b[:, 64:66] = h(0.02)
    else:
        raise SystemExit(f'shape_copy: no generator for {ty.name}')
    return b.reshape(-1)


def generate(desc, out, seed):
    d = json.load(open(desc))
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(out, d['arch'])
    for f in d['fields']:
        if f['name'] == 'general.architecture':
            continue
        vt = VT(f['type'])
        if vt == VT.ARRAY:
            w.add_key_value(f['name'], f['value'], vt, sub_type=VT(f['sub']))
        else:
            w.add_key_value(f['name'], f['value'], vt)
    for t in d['tensors']:
        ty, shape = Q(t['type']), t['shape']
        n = int(np.prod(shape))
        if ty == Q.F32:
            name = t['name']
            v = np.ones(n, np.float32) if 'norm' in name else (0.01 * rng.standard_normal(n)).astype(np.float32)
            w.add_tensor(name, v.reshape(list(reversed(shape))))
        elif ty == Q.F16:
            w.add_tensor(t['name'], (0.02 * rng.standard_normal(n)).astype(np.float16).reshape(list(reversed(shape))))
        else:
            rows = n // shape[0]
            raw = blocks(rng, ty, n).reshape(rows, -1)
            w.add_tensor(t['name'], raw, raw_dtype=ty)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


if __name__ == '__main__':
    if sys.argv[1] == 'describe':
        describe(sys.argv[2], sys.argv[3])
    else:
        generate(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 0)

"""Decoding at long contexts: the transformers engine with transformers' DynamicCache (every
decode step concatenates, i.e. copies, the whole KV cache) vs engine/kvcache.py's GrowingCache
(appends in place), side by side on the same prompts. SmolLM2-135M-Instruct, fp32, greedy,
prompts of random tokens of the given lengths (a multi-turn episode's prompt is its history),
the whole batch in one chunk. Prints the generate wall time of each, whether the tokens came
out identical, and RATIO growing_vs_dynamic (wall time dynamic / growing) per shape.

    ../shared/tools/alone .venv/bin/python benchmarks/kv_decode.py [ROWSxLEN ...]   (default 16x512 40x1500)
"""
import random
import sys
import time

import torch

torch.set_num_threads(2)
from transformers import DynamicCache  # noqa: E402

import honing.engine.hf as hf  # noqa: E402
from honing.engine.kvcache import GrowingCache  # noqa: E402
from honing.engine.types import SamplingParams  # noqa: E402
from honing.models import load_policy  # noqa: E402

shapes = [tuple(int(x) for x in a.split("x")) for a in sys.argv[1:]] or [(16, 512), (40, 1500)]
NEW = 128
model, tok = load_policy("smollm2-135m-instruct")
engine = hf.TransformersEngine(model, eos_ids=[], pad_id=tok.pad_token_id, max_batch_size=4096,
                               max_batch_tokens=1 << 30)
params = SamplingParams(max_new_tokens=NEW, temperature=0.0)
caches = {"dynamic": lambda reserve: DynamicCache(), "growing": GrowingCache}
for rows, length in shapes:
    rng = random.Random(rows * 100003 + length)
    prompts = [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(rows)]
    walls, outs = {}, {}
    for name, make in caches.items():
        hf.GrowingCache = make  # what _generate_chunk builds its cache with
        t0 = time.perf_counter()
        outs[name] = [s.token_ids for g in engine.generate(prompts, params) for s in g]
        walls[name] = time.perf_counter() - t0
    hf.GrowingCache = GrowingCache
    same = sum(a == b for a, b in zip(outs["dynamic"], outs["growing"], strict=True))
    print(f"{rows} rows x {length} prompt tokens, {NEW} new: dynamic {walls['dynamic']:6.1f} s, "
          f"growing {walls['growing']:6.1f} s, identical rows {same}/{rows}", flush=True)
    print(f"RATIO growing_vs_dynamic[{rows}x{length}]={walls['dynamic'] / walls['growing']:.2f}", flush=True)

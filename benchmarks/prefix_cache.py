"""Prefix caching in multi-turn rollouts: repair episodes (level 1) with SmolLM2-135M-Instruct,
greedy, the repair recipe's turn and token limits, run twice side by side on the same tasks: every
turn prefilling its whole history (`rollout.prefix_cache_tokens=0`) vs reusing the KV of the
history prefilled the turn before (the default). Prints the rollout wall time of each, the share
of prompt tokens served from the cache, how many episodes' replies came out identical, and
RATIO cached_vs_plain (wall time plain / cached).

    ../shared/tools/alone .venv/bin/python benchmarks/prefix_cache.py [N_EPISODES]
"""
import itertools
import sys
import time

import torch

torch.set_num_threads(2)
from honing.engine.hf import TransformersEngine  # noqa: E402
from honing.engine.types import SamplingParams  # noqa: E402
from honing.models import load_policy  # noqa: E402
from honing.rollout.multiturn import MultiTurnConfig, multiturn_rollout  # noqa: E402
from honing.sandbox import Sandbox  # noqa: E402
from honing.tasks.repair import RepairSource  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 8
model, tok = load_policy("smollm2-135m-instruct")
eos = [tok.convert_tokens_to_ids("<|im_end|>")]
engine = TransformersEngine(model, eos_ids=eos, pad_id=tok.pad_token_id, max_batch_size=16)
tasks = list(itertools.islice(RepairSource({"levels": [1]}).tasks("heldout", 0), N))
sb = Sandbox("bwrap", max_concurrency=2)
params = SamplingParams(max_new_tokens=320, temperature=0.0)
runs = {}
for name, cache_tokens in (("plain", 0), ("cached", 65536)):
    cfg = MultiTurnConfig(max_turns=6, max_total_tokens=6144, prefix_cache_tokens=cache_tokens)
    before = dict(engine.prefix_stats)
    t0 = time.perf_counter()
    trajs = multiturn_rollout(engine, tok, tasks, params, sb, cfg, seed=0)
    wall = time.perf_counter() - t0
    stats = {k: engine.prefix_stats.get(k, 0) - before.get(k, 0) for k in ("prompt_tokens", "reused_tokens")}
    runs[name] = (wall, trajs, stats)
    turns = sum(len(t.turns) for t in trajs) / len(trajs)
    ctx = sum(len(t.prompt_ids) + len(t.completion_ids) for t in trajs) / len(trajs)
    print(f"{name:7s} {N} episodes: rollout {wall:7.1f} s, {turns:.1f} turns/episode, {ctx:.0f} tokens/episode"
          + (f", prompt tokens from the cache {stats['reused_tokens'] / max(stats['prompt_tokens'], 1):.0%}"
             if cache_tokens else ""), flush=True)
same = sum([tu.action_text for tu in a.turns] == [tu.action_text for tu in b.turns]
           for a, b in zip(runs["plain"][1], runs["cached"][1], strict=True))
print(f"episodes with identical replies (greedy): {same}/{N}")
print(f"RATIO cached_vs_plain={runs['plain'][0] / runs['cached'][0]:.2f}")

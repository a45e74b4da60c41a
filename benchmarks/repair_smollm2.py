"""20 repair episodes (level 1) with SmolLM2-135M-Instruct through the multi-turn harness: pass@1,
turns and tokens per episode, and the time split (generation vs sandbox vs verification).

    .venv/bin/python benchmarks/repair_smollm2.py [N]
"""
import itertools, time, json, sys
import torch
torch.set_num_threads(2)
from honing.engine.hf import TransformersEngine
from honing.engine.types import SamplingParams
from honing.models import load_policy
from honing.rollout.multiturn import MultiTurnConfig, multiturn_rollout
from honing.sandbox import Sandbox
from honing.tasks.repair import RepairSource
from honing.verify import VerifyContext, get_verifier
N = int(sys.argv[1]) if len(sys.argv) > 1 else 20
model, tok = load_policy("smollm2-135m-instruct")
eos = [tok.convert_tokens_to_ids("<|im_end|>")]
engine = TransformersEngine(model, eos_ids=eos, pad_id=tok.pad_token_id)
tasks = list(itertools.islice(RepairSource({"levels": [1]}).tasks("train", 0), N))
sb = Sandbox("bwrap", max_concurrency=2)
cfg = MultiTurnConfig(max_turns=4, max_observation_chars=1500, max_parse_errors=4, wall_time_s=3600)
t0 = time.perf_counter()
trajs = multiturn_rollout(engine, tok, tasks, SamplingParams(max_new_tokens=128, temperature=0.7), sb, cfg, seed=0)
roll_s = time.perf_counter() - t0
t1 = time.perf_counter()
verdicts = [get_verifier("repair").verify(t, tr, VerifyContext(extra={"sandbox": sb})) for t, tr in zip(tasks, trajs)]
ver_s = time.perf_counter() - t1
gen_s = sum({tr.turns[i].timings["gen_s"] for tr in trajs for i in range(len(tr.turns))})  # per batch, dedup
env_s = sum(tr.timings["env_s"] + tr.timings["snapshot_s"] for tr in trajs)
print(json.dumps({
    "episodes": len(trajs), "pass@1": sum(v.passed for v in verdicts) / len(trajs),
    "mean_score": sum(v.score for v in verdicts) / len(trajs),
    "infra_errors": sum(v.infra_error for v in verdicts),
    "turns_per_episode": sum(len(tr.turns) for tr in trajs) / len(trajs),
    "tokens_per_episode": sum(len(tr.prompt_ids) + len(tr.completion_ids) for tr in trajs) / len(trajs),
    "generated_tokens_per_episode": sum(sum(tr.loss_mask) for tr in trajs) / len(trajs),
    "stop_reasons": {r: sum(tr.stop_reason == r for tr in trajs) for r in {tr.stop_reason for tr in trajs}},
    "parse_errors_per_episode": sum(tr.stats.get("parse_errors", 0) for tr in trajs) / len(trajs),
    "rollout_wall_s": round(roll_s, 1), "generation_s": round(gen_s, 1),
    "sandbox_s_sum_over_episodes": round(env_s, 2), "verification_s": round(ver_s, 1)}, indent=1))
print("--- sample reply:", repr(trajs[0].turns[0].action_text[:400]))
print("--- sample obs:", repr(trajs[0].turns[0].observation_text[:300]))

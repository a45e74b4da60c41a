"""The fast variant of a release against the standard one, side by side in one process: output
tokens/s of one stream (greedy, the engines interleaved round by round) and held-out pass@1 with
95% bootstrap CIs on a suite, for every option honing's release/fast.py measures (int8 dynamic
quantization of the decode steps with the prompt run in fp32, `int8-decode`; bf16 where the CPU has
native bf16; speculative decoding with an n-gram draft; the combinations; `--methods` takes any,
e.g. `int8-dynamic`, which quantizes the prompt's forward too). A speculative option's pass@1 is
measured on its own path: every sample decoded stream by stream, speculatively.

    .venv/bin/python benchmarks/fast_variant.py                       # SmolLM2-135M-Instruct, quick suite
    .venv/bin/python benchmarks/fast_variant.py --model tiny-random --limit 4
    .venv/bin/python benchmarks/fast_variant.py --model RUN/checkpoints/final --suite finance --samples 1

Last line: RATIO fast_vs_standard_tokens_per_s=<the option honing would choose: fastest inside the
standard CI> with both pass@1s and CIs.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--suite", default="quick")
    ap.add_argument("--limit", type=int, default=8, help="held-out tasks per suite source")
    ap.add_argument("--samples", type=int, default=2, help="samples per task for pass@1")
    ap.add_argument("--prompts", type=int, default=3, help="prompts decoded one by one for tokens/s")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--methods", default="", help="comma-separated options (default: every option release/fast.py has)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from honing.eval.runner import evaluate_suite
    from honing.eval.suite import load_suite, suite_tasks
    from honing.models import load_policy
    from honing.release.fast import apply_method, chat_prompts, engine_for, options, split_method, tokens_per_s

    model, tok = load_policy(args.model)
    engines = {"standard": engine_for(model, tok)}
    weights: dict = {}
    for m in (args.methods.split(",") if args.methods else options()):
        w, _ = split_method(m)
        if w is not None and w not in weights:
            weights[w] = apply_method(model, w)
        engines[m] = engine_for(weights[w] if w else model, tok, m, standard=model)
    suite = load_suite(args.suite)
    tasks = suite_tasks(suite, args.limit).tasks
    step = max(1, len(tasks) // max(args.prompts, 1))  # spread over the suite's sources
    prompts = chat_prompts(tok, tasks[::step][: args.prompts])
    t0 = time.perf_counter()
    speed = tokens_per_s(engines, prompts, args.max_new_tokens, args.rounds)
    print(f"speed measured in {time.perf_counter() - t0:.0f} s on {len(prompts)} prompts x {args.max_new_tokens} "
          f"new tokens, one stream, greedy, best of {args.rounds} interleaved rounds:", flush=True)
    for k, v in speed.items():
        st = getattr(engines[k], "spec_stats", {})
        extra = (f"  draft tokens accepted {st['accepted']}/{st['drafted']} over {st['forwards']} verify forwards"
                 if st.get("forwards") else "")
        print(f"  {k:<26} {v:7.2f} tokens/s  {v / speed['standard']:5.2f}x{extra}", flush=True)
    res = {}
    for m, eng in engines.items():
        t1 = time.perf_counter()
        r = evaluate_suite(args.model, suite, samples=args.samples, limit=args.limit, engine=eng, tokenizer=tok)
        o = r["overall"]
        res[m] = (o["pass@1"], o["ci"]["pass@1"], o["n_tasks"])
        print(f"{m:<26} pass@1 {o['pass@1']:.3f} [{o['ci']['pass@1'][0]:.3f}, {o['ci']['pass@1'][1]:.3f}] "
              f"over {o['n_tasks']} tasks x {args.samples} ({time.perf_counter() - t1:.0f} s)", flush=True)
    p_std, ci_std, _ = res["standard"]
    inside = [m for m in engines if m != "standard" and ci_std[0] <= res[m][0] <= ci_std[1]]
    pick = max(inside, key=lambda m: speed[m]) if inside else max((m for m in engines if m != "standard"),
                                                                  key=lambda m: speed[m])
    p_f, ci_f, n = res[pick]
    print(f"{args.model}, suite {args.suite} (limit {args.limit}, {n} tasks), {args.threads} threads; "
          f"{'inside' if pick in inside else 'OUTSIDE'} the standard CI")
    print(f"RATIO fast_vs_standard_tokens_per_s={speed[pick] / speed['standard']:.2f} method={pick} "
          f"standard_tokens_per_s={speed['standard']:.2f} fast_tokens_per_s={speed[pick]:.2f} "
          f"standard_pass@1={p_std:.3f} [{ci_std[0]:.3f}, {ci_std[1]:.3f}] "
          f"fast_pass@1={p_f:.3f} [{ci_f[0]:.3f}, {ci_f[1]:.3f}]")


if __name__ == "__main__":
    main()

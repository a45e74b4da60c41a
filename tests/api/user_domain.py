"""A new single-turn domain as a user writes it: a task source, a verifier and a recipe.
tests/api/test_api.py checks it stays under 50 lines and that the tiny model learns it."""
import random

import honing


@honing.register_source("double")
def double_tasks(split, seed):
    """'Double 3.' -> '6'; held-out tasks come from their own seed stream."""
    rng = random.Random(f"{split}:{seed}")
    for i in range(10_000):
        n = rng.randint(0, 4)
        yield {"id": f"double/{split}/{seed}/{i}", "prompt": f"Double {n}.", "answer": str(2 * n)}


@honing.register_verifier("double_exact")
def double_exact(completion, answer):
    words = completion.strip().split()
    return float(bool(words) and words[0].strip(".") == answer)


RECIPE = {
    "model": {"name": "tiny-random", "bf16_autocast": False},
    "tasks": {"sources": [{"name": "double", "verifier": "double_exact"}], "prompts_per_step": 8,
              "samples_per_prompt": 8, "exclude_heldout_questions": False},
    "generation": {"max_new_tokens": 4},
    "train": {"steps": 20, "learning_rate": 1.0e-3, "micro_batch_size": 64},
    "sft": {"steps": 80, "learning_rate": 3.0e-3, "batch_size": 32},
    "eval": {"heldout_tasks": 32, "contamination": {"mode": "off"}},  # 5 questions: overlap is expected
}

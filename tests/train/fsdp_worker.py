"""Run under torchrun by test_fsdp.py: one PolicyTrainer.step per case on FSDP2 shards (gloo),
each rank computing its slice of the batch; rank 0 saves the gathered weights and metrics.

usage: torchrun --nproc_per_node=2 fsdp_worker.py OUT.pt CASES.json
Each case: {"name", "train": TrainConfig kwargs, "advs": [...], "wrong_norm": bool}.
wrong_norm: the control: each rank normalises the loss by its own slice's token / sequence
counts (the bug global normalisation prevents).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from honing.models import build_tiny_random  # noqa: E402
from honing.train import distributed as dp  # noqa: E402
from honing.train.trainer import PolicyTrainer  # noqa: E402
from train.helpers import make_trainer, sampled_trajectories  # noqa: E402


class Counting(PolicyTrainer):
    dummies = 0

    def _dummy(self):  # noqa: ANN202
        Counting.dummies += 1
        return super()._dummy()


class LocalNorm(Counting):
    def _normalisers(self, mini):  # noqa: ANN001, ANN202
        return super()._normalisers(self.dist.mine(mini))


def main() -> None:
    torch.set_num_threads(1)
    out, cases = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    dp.init_from_env(600)
    results = {}
    for case in cases:
        model, tok = build_tiny_random(seed=0)
        trajs = sampled_trajectories(model, tok, advs=tuple(case["advs"]))
        trainer = make_trainer(build_tiny_random(seed=0)[0], tok, **case["train"])  # for its config
        cls = LocalNorm if case.get("wrong_norm") else Counting
        Counting.dummies = 0
        t = cls(build_tiny_random(seed=0)[0], tok.pad_token_id, trainer.cfg, trainer_lora(), bf16_autocast=False,
                temperature=1.0, distributed=True)
        m = t.step(trajs)
        weights = dp.full_state_dict(t.dist.root)
        dummies = dp.all_reduce_floats([Counting.dummies])[0]
        if dp.rank() == 0:
            results[case["name"]] = {"weights": weights, "metrics": m, "dummy_micro_batches": dummies}
    if dp.rank() == 0:
        torch.save(results, out)
    dp.teardown()


def trainer_lora():  # noqa: ANN201
    from honing.config import LoraConfig

    return LoraConfig()


if __name__ == "__main__":
    main()

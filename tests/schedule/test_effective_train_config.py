"""Which old log-probs a run trains against (issue 18's TRL parity ablation made the trainer's own the default)."""

from honing.config import load_config
from honing.schedule.loop import effective_train_config


def _train(*overrides: str):
    cfg, _ = load_config("quickstart", list(overrides))
    return effective_train_config(cfg)


def test_a_synchronous_run_recomputes_old_logprobs_by_default() -> None:
    t = _train()
    assert t.recompute_old_logprobs is True
    assert t.tis_cap is None  # on-policy: no importance weights


def test_an_explicit_false_keeps_the_engines_logprobs() -> None:
    assert _train("train.recompute_old_logprobs=false").recompute_old_logprobs is False


def test_stale_rollouts_still_get_off_policy_correction() -> None:
    t = _train("schedule.staleness=1")
    assert t.recompute_old_logprobs is True and t.tis_cap == 2.0
    t = _train("schedule.staleness=1", "train.tis_cap=3.0")
    assert t.tis_cap == 3.0

"""The Python API: train and evaluate from a script or a notebook. The CLI runs the same code.

    import honing

    def reward(completion, answer):              # any per-sample function, fields by name
        return float(completion.strip() == answer)

    summary = honing.train("smoke", ["train.steps=20"], reward_funcs=[reward],
                           tasks=[{"prompt": "2+2?", "answer": "4"}, ...], out="runs/mine")
    print(summary.heldout_after["pass@1"])
    result = honing.evaluate("runs/mine", suite="quick")

`reward_funcs`: one function grades every task (it becomes the sources' verifier); several are
averaged (reward layers of weight 1/n, or `reward_weights`), the first deciding `passed`. A
function importable by name (`module:function`, not a lambda, not defined in `__main__`) is
registered under exactly that name, so it is the same verifier a recipe names that way and it
also works in rollout worker processes; any other callable is registered in this process only.

`tasks`: a TaskSource, a `fn(split, seed)` yielding Tasks or task dicts, or an iterable of them
(read into memory once; 10% go to the held-out split by a stable hash of the id or prompt, or
by each dict's `split`; training items repeat in epochs, each shuffled).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from honing.config import RunConfig, SourceConfig, load_config
from honing.errors import ConfigError, HoningError



class Summary(dict):
    """A run's summary (also run_dir/summary.json), with attribute access: `s.heldout_after`."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def _config(config: str | Path | RunConfig | Mapping[str, Any] | None, overrides: Sequence[str]) -> tuple[RunConfig, str]:
    if isinstance(config, RunConfig):
        if overrides:
            data = config.model_dump(mode="json")
            from honing.config import _set_dotted, parse_override  # the same parser as the CLI

            for text in overrides:
                keys, value = parse_override(text)
                _set_dotted(data, keys, value)
            return RunConfig.model_validate(data), config.name or "api"
        return config.model_copy(deep=True), config.name or "api"
    if isinstance(config, Mapping):
        from pydantic import ValidationError

        from honing.config import _explain

        try:
            cfg = RunConfig.model_validate(dict(config))
        except ValidationError as e:
            raise _explain(e, "config") from None
        return _config(cfg, overrides)
    cfg, path = load_config(config, list(overrides))
    return cfg, path.stem


def _importable_name(fn: Any) -> str | None:
    """'module:qualname' when that name imports back to `fn` (so worker processes can find it)."""
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not mod or mod == "__main__" or "<" in qual:
        return None
    import importlib

    try:
        obj: Any = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return f"{mod}:{qual}" if obj is fn else None


def register_reward(fn: Any) -> tuple[str, bool]:
    """Register a reward function (or a Verifier); (its verifier name, whether workers can import it)."""
    from honing.verify import register_verifier

    if isinstance(fn, str):
        return fn, True
    if not callable(fn) and not hasattr(fn, "verify"):
        raise HoningError(f"reward_funcs: {fn!r} is neither a function, a Verifier nor a verifier name")
    name = _importable_name(fn)
    if name is not None:
        register_verifier(name, fn)
        return name, True
    label = getattr(fn, "__qualname__", type(fn).__name__)
    name = f"api:{label}:{id(fn):x}"
    register_verifier(name, fn)
    return name, False


class ListSource:
    """Tasks handed over as an iterable, split by each item's `split` or a stable hash."""

    def __init__(self, items: Iterable[Any], domain: str = "api") -> None:
        self.items = list(items)
        self.domain = domain
        if not self.items:
            raise HoningError("tasks: the iterable is empty")

    @staticmethod
    def _split(item: Any, i: int) -> str:
        if isinstance(item, Mapping) and item.get("split") in ("train", "heldout"):
            return str(item["split"])
        from honing.tasks.jsonl import _split_of  # the same stable 10% as a JSONL task file

        return _split_of(str(item.get("id", item.get("prompt")) if isinstance(item, Mapping) else getattr(item, "id", i)))

    def tasks(self, split: str, seed: int) -> Iterable[Any]:
        """Held-out items once; training items in epochs, each pass shuffled by (seed, pass)."""
        mine = [item for i, item in enumerate(self.items) if self._split(item, i) == split]
        if split != "train":
            yield from mine
            return
        if not mine:
            return
        import random

        for epoch in itertools.count():
            order = list(range(len(mine)))
            random.Random(f"{seed}/{epoch}").shuffle(order)
            for k in order:
                item = mine[k]
                if isinstance(item, Mapping) and "id" not in item:
                    item = {**item, "id": f"{self.domain}/{k}"}
                yield item


def register_tasks(tasks: Any) -> tuple[str, bool]:
    """Register tasks for a run; (the source name, whether workers can import it)."""
    from honing.tasks import register_source

    if isinstance(tasks, str):
        return tasks, True
    if hasattr(tasks, "tasks") and hasattr(tasks, "domain"):
        name = f"api:{tasks.domain}"
        register_source(name, tasks)
        return name, False
    if callable(tasks):
        name = _importable_name(tasks)
        if name is None:
            register_source("api:tasks", tasks)
            return "api:tasks", False
        return name, True
    register_source("api:tasks", ListSource(tasks))
    return "api:tasks", False


def _apply(cfg: RunConfig, reward_funcs: Sequence[Any] | None, reward_weights: Sequence[float] | None,
           tasks: Any) -> bool:
    """Put the API's tasks and rewards into the config; True when everything is importable by name."""
    portable = True
    if tasks is not None:
        name, ok = register_tasks(tasks)
        portable &= ok
        cfg.tasks.sources = [SourceConfig(name=name)]
    if reward_funcs:
        named = [register_reward(f) for f in reward_funcs]
        portable &= all(ok for _, ok in named)
        for s in cfg.tasks.sources:
            s.verifier = named[0][0]
        if len(named) > 1:
            weights = list(reward_weights) if reward_weights is not None else [1.0 / len(named)] * len(named)
            if len(weights) != len(named):
                raise ConfigError(f"reward_weights has {len(weights)} weights for {len(named)} reward_funcs")
            from honing.verify.reward import RewardConfig

            layers = [{"name": f"fn{i}", "weight": w, "verifier": n} for i, ((n, _), w) in enumerate(zip(named, weights))]
            cfg.reward = RewardConfig.model_validate({**cfg.reward.model_dump(), "layers": layers})
    elif reward_weights is not None:
        raise ConfigError("reward_weights without reward_funcs")
    return portable


def train(config: str | Path | RunConfig | Mapping[str, Any] | None = None, overrides: Sequence[str] = (), *,
          reward_funcs: Sequence[Callable[..., float] | str] | None = None,
          reward_weights: Sequence[float] | None = None, tasks: Any = None, out: str | Path | None = None,
          callbacks: Sequence[Callable[[int, dict], Any]] = (), show_progress: bool = False,
          plain_progress: bool = False, resume: bool = False, from_step: int | None = None,
          on_start: Callable[[], Any] | None = None) -> Summary:
    """Train a policy (a recipe name/path, a RunConfig or a dict, plus dotted overrides) and
    return the summary. `callbacks` are called as `cb(step, metrics)` after every committed step;
    `plain_progress` prints one line per step on stderr (what `honing train` does off a terminal)."""
    from honing.models import resolve_model_dir
    from honing.schedule.loop import build_tasks, default_run_dir, train as run_train

    cfg, stem = _config(config, overrides)
    portable = _apply(cfg, reward_funcs, reward_weights, tasks)
    if not portable and (cfg.schedule.staleness > 0 or cfg.schedule.workers in ("process", "ray")) \
            and cfg.schedule.workers != "inprocess":
        raise ConfigError("rollouts in a worker process need tasks and reward functions importable by name "
                          "('module:function', not a lambda or a function defined in __main__); "
                          "or set schedule.workers=inprocess")
    from honing.schedule.stages import run_stages, stage_config
    from honing.train.demos import check_source

    staged = [stage_config(cfg, i, st, None) for i, st in enumerate(cfg.stages)]  # (a staged recipe)
    for c in staged or [cfg]:
        build_tasks(c)  # bad names, params and verifiers fail here, before anything is written
        check_source(c)  # a missing or malformed demonstration file too
    resolve_model_dir(cfg.model.name)
    run_dir = Path(out) if out is not None else default_run_dir(cfg, stem)
    if on_start is not None:
        on_start()
    if staged:
        if from_step is not None:
            raise ConfigError("--from-step is for one run; a staged recipe resumes stage by stage")
        return Summary(run_stages(cfg, run_dir, show_progress=show_progress, resume=resume,
                                  plain_progress=plain_progress))
    return Summary(run_train(cfg, run_dir, show_progress=show_progress, resume=resume, from_step=from_step,
                             callbacks=list(callbacks), plain_progress=plain_progress))


def evaluate(model: str, suite: str | Path | None = None, *, tasks: Any = None,
             reward_funcs: Sequence[Any] | None = None, count: int = 32, samples: int | None = None,
             seed: int | None = None, limit: int | None = None, out: str | Path | None = None) -> dict:
    """Evaluate a model spec or run directory on a suite (name or YAML path), or on your own
    `tasks` graded by `reward_funcs` (held-out split, `count` tasks); returns the result dict
    (pass@k / maj@k per domain with CIs, every sample), saved to `out` when given."""
    from honing.eval.runner import evaluate_suite, save_result
    from honing.eval.suite import Suite, load_suite

    if (suite is None) == (tasks is None):
        raise HoningError("evaluate: give a suite, or tasks (with reward_funcs unless they carry a verifier)")
    if suite is not None:
        s = load_suite(str(suite))
    else:
        name, _ = register_tasks(tasks)
        verifier = register_reward(reward_funcs[0])[0] if reward_funcs else None
        s = Suite(name="api", sources=[{"name": name, "verifier": verifier, "count": count}])
    result = evaluate_suite(model, s, samples, seed, limit, None)
    if out is not None:
        save_result(result, Path(out))
    return result

"""Where step metrics go besides metrics.jsonl: `report_to: [tensorboard, wandb, mlflow]`.

Every reporter gets the numeric values of each metrics.jsonl row under the same names, at the
same step (MLflow forbids some characters in names: see `mlflow_name`).

- tensorboard: event files in <run>/tb/ (`tensorboard --logdir runs`).
- wandb: `wandb.init(dir=<run>, name=<run name>, config=<resolved config>)`, project
  $WANDB_PROJECT (default "honing"). The mode is $WANDB_MODE; without it, and without
  $WANDB_API_KEY, it is "offline": the run lands in <run>/wandb/offline-run-*/ (upload it later
  with `wandb sync`). A logged-in user who wants it live sets WANDB_MODE=online.
- mlflow: tracking URI $MLFLOW_TRACKING_URI, else a file store at <run>/mlruns
  (`mlflow ui --backend-store-uri <run>/mlruns`; for a file store, MLFLOW_ALLOW_FILE_STORE=true
  is set, which mlflow 3 asks for since it favours a database); experiment $MLFLOW_EXPERIMENT_NAME (default
  "honing"); the run is named after the run directory, its params are the flattened config
  (`train.learning_rate`, lists as JSON).

A resume continues the same wandb and MLflow runs (their ids are kept in <run>/reporters.json)
and never logs a (step, metric) pair twice: their histories cannot be rewound, so the steps a
resume re-does (those after the checkpoint it goes back to) keep the values logged the first
time there, while metrics.jsonl and TensorBoard show the re-done ones. A reporter that fails
mid-run is switched off with a warning; the run goes on.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Protocol

from honing.errors import ConfigError

STATE_FILE = "reporters.json"
_INSTALL = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
            "mlflow": ("mlflow", "mlflow-skinny")}  # report_to name -> (module, pip package)


def check_reporters(report_to: Iterable[str]) -> None:
    """Fail at start-up, before anything is written, when a reporter's package is missing."""
    for name in report_to:
        module, package = _INSTALL[name]
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"report_to includes {name!r} but {module!r} cannot be imported ({e}); install it "
                              f"with `pip install {package}` or drop {name} from report_to") from None


_MLFLOW_BAD = re.compile(r"[^\w\-. :/]")


def mlflow_name(key: str) -> str:
    """MLflow names allow letters, digits, `_ - . : /` and spaces: '@' becomes '_at_'
    (heldout/pass@1 -> heldout/pass_at_1) and any other character '_'."""
    return _MLFLOW_BAD.sub("_", key.replace("@", "_at_"))


def flatten_config(d: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """Dotted keys with string values: nested dicts flattened, lists (and empty dicts) as JSON."""
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            yield from flatten_config(v, key + ".")
        else:
            yield key, json.dumps(v) if isinstance(v, (list, dict)) else str(v)


class Reporter(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self, status: str) -> None: ...


class TensorBoardReporter:
    def __init__(self, run_dir: Path, purge_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=purge_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.tb.add_scalar(k, v, step)
        self.tb.flush()

    def close(self, status: str) -> None:
        self.tb.close()


class WandbReporter:
    def __init__(self, run_dir: Path, name: str, config: dict, state: dict) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE") or (None if os.environ.get("WANDB_API_KEY") else "offline")
        state.setdefault("id", secrets.token_hex(6))
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "honing"), name=name, id=state["id"],
                              resume="allow", dir=str(run_dir), config=config, mode=mode)  # type: ignore[arg-type]

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=1 if status == "failed" else 0)


class MlflowReporter:
    _STATUS = {"finished": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}

    def __init__(self, run_dir: Path, name: str, config: dict, state: dict) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri:  # mlflow 3 wants an opt-in for its file store
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = c = MlflowClient(tracking_uri=uri)
        run = None
        if state.get("run_id"):
            try:
                run = c.get_run(state["run_id"])
                c.update_run(run.info.run_id, status="RUNNING")
            except Exception:  # the store was moved or wiped: start a new MLflow run
                run = None
        if run is None:
            state.pop("step", None), state.pop("names", None)  # a new MLflow run has logged nothing yet
            exp_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "honing")
            exp = c.get_experiment_by_name(exp_name)
            exp_id = exp.experiment_id if exp else c.create_experiment(exp_name)
            run = c.create_run(exp_id, run_name=name, tags={"honing.run_dir": str(run_dir.resolve())})
            params = [Param(mlflow_name(k), v[:6000]) for k, v in flatten_config(config)]
            for i in range(0, len(params), 100):
                c.log_batch(run.info.run_id, params=params[i:i + 100])
        state["run_id"] = self.run_id = run.info.run_id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        rows = [Metric(mlflow_name(k), float(v), ts, step) for k, v in metrics.items()]
        for i in range(0, len(rows), 1000):
            self.client.log_batch(self.run_id, metrics=rows[i:i + 1000])

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, self._STATUS.get(status, "FAILED"))


class Reporters:
    """The run's reporters; keeps wandb/MLflow run ids and the last logged (step, names) in
    reporters.json so a resume continues their runs without logging a pair twice."""

    def __init__(self, report_to: list[str], run_dir: Path, name: str, config: dict, purge_step: int | None,
                 resume: bool) -> None:
        check_reporters(report_to)
        self.path = run_dir / STATE_FILE
        try:
            self.state: dict[str, dict] = json.loads(self.path.read_text()) if resume else {}
        except (OSError, ValueError):
            self.state = {}
        self.active: dict[str, Any] = {}
        for kind in dict.fromkeys(report_to):
            st = self.state.setdefault(kind, {})
            if kind == "tensorboard":
                self.active[kind] = TensorBoardReporter(run_dir, purge_step)
            elif kind == "wandb":
                self.active[kind] = WandbReporter(run_dir, name, config, st)
            elif kind == "mlflow":
                self.active[kind] = MlflowReporter(run_dir, name, config, st)
        self._save()

    def _save(self) -> None:
        from honing.schedule.runlog import atomic_write_text

        atomic_write_text(self.path, json.dumps(self.state, indent=1))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        changed = False
        for kind, rep in list(self.active.items()):
            st = self.state[kind]
            if kind != "tensorboard":  # (TensorBoard purges re-done steps itself)
                last = st.get("step", -1)
                if step < last:
                    continue
                done = set(st.get("names", [])) if step == last else set()
                todo = {k: v for k, v in metrics.items() if k not in done}
                if not todo:
                    continue
                if self._log(kind, rep, step, todo):
                    st["step"], st["names"] = step, sorted(done | set(todo))
                    changed = True
            else:
                self._log(kind, rep, step, metrics)
        if changed:
            self._save()

    def _log(self, kind: str, rep: Any, step: int, metrics: dict[str, float]) -> bool:
        """A reporter that fails (a server gone, a full disk) is switched off with a warning; the
        run goes on, and metrics.jsonl still has every row."""
        try:
            rep.log(step, metrics)
            return True
        except Exception as e:
            import sys

            print(f"honing: warning: report_to {kind} failed at step {step} ({type(e).__name__}: {e}); "
                  f"not reporting to it for the rest of this run", file=sys.stderr, flush=True)
            del self.active[kind]
            try:
                rep.close("failed")
            except Exception:
                pass
            return False

    def close(self, status: str = "finished") -> None:
        errors = []
        for kind, rep in self.active.items():
            try:
                rep.close(status)
            except Exception as e:  # one reporter failing to close must not keep the others open
                errors.append(f"{kind}: {e}")
        self.active = {}
        if errors:
            import sys

            print(f"honing: warning: closing reporters: {'; '.join(errors)}", file=sys.stderr)

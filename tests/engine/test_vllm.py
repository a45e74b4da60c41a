"""The vLLM engine for real (no mocks): skipped unless vllm imports (`make setup-vllm`, then
`.venv-vllm/bin/pytest -m slow tests/engine`). One engine per model for the module: vLLM's start
is 20-25 s on 2 cores.

honing's tiny-random model has attention heads of 16, which vLLM's CPU kernels do not take, so
these tests build a tiny Llama with heads of 32 (same tokenizer)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm")

from honing.engine.types import SamplingParams  # noqa: E402
from honing.engine.vllm import VLLMEngine  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[2]


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    from honing.models import _build_tiny_tokenizer, _prepare_tokenizer

    tok = _prepare_tokenizer(_build_tiny_tokenizer())
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=128, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return model.eval(), tok


@pytest.fixture(scope="module")
def engine():
    model, tok = tiny_llama(0)
    eng = VLLMEngine(model, tok, [tok.eos_token_id], max_num_seqs=32)
    eng.tok = tok
    yield eng
    eng.close()


def prompts(tok):
    return [tok("12+3=").input_ids, tok("hello there").input_ids, tok("7").input_ids]


def trainer_logprobs(model, prompt, sample, temperature=1.0):
    """What the trainer recomputes: log softmax(logits / T) of each sampled token, fp32."""
    ids = torch.tensor([list(prompt) + list(sample.token_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(sample.token_ids)[:, None]).squeeze(-1)


def mismatch(model, ps, out, temperature=1.0):
    d = torch.cat([(torch.tensor(s.logprobs) - trainer_logprobs(model, p, s, temperature)).abs()
                   for p, g in zip(ps, out) for s in g])
    return float(d.mean()), float(d.max())


@pytest.mark.xdist_group("vllm-engine")  # one engine for the group: its tests stay on one worker
def test_generate_shapes_finish_reasons_and_seeds(engine):
    tok = engine.tok
    ps = prompts(tok)
    sp = SamplingParams(max_new_tokens=10, temperature=1.0, n=4)
    out = engine.generate(ps, sp, seed=5)
    assert len(out) == 3 and all(len(g) == 4 for g in out)
    for g in out:
        for s in g:
            assert 1 <= len(s.token_ids) <= 10 and len(s.logprobs) == len(s.token_ids)
            assert all(lp <= 0 for lp in s.logprobs)
            if s.finish_reason == "stop":
                assert s.token_ids[-1] == tok.eos_token_id  # the stop token is kept, as the hf engine does
            else:
                assert s.finish_reason == "length" and len(s.token_ids) == 10
    again = engine.generate(ps, sp, seed=5)
    assert [[s.token_ids for s in g] for g in out] == [[s.token_ids for s in g] for g in again]
    other = engine.generate(ps, sp, seed=6)
    assert [[s.token_ids for s in g] for g in out] != [[s.token_ids for s in g] for g in other]
    # samples of a group differ, and neighbouring prompts do not share random streams
    flat = [s.token_ids for g in out for s in g]
    assert len(set(flat)) > len(flat) // 2
    greedy = engine.generate(ps, SamplingParams(max_new_tokens=10, temperature=0.0, n=1))
    assert greedy == engine.generate(ps, SamplingParams(max_new_tokens=10, temperature=0.0, n=1))
    stop = engine.generate([ps[0]], SamplingParams(max_new_tokens=200, temperature=1.0, n=8), seed=1)[0]
    assert {s.finish_reason for s in stop} <= {"stop", "length"}


@pytest.mark.xdist_group("vllm-engine")  # one engine for the group: its tests stay on one worker
def test_logprobs_match_the_trainer(engine):
    model = engine.source
    ps = prompts(engine.tok)
    for t in (1.0, 0.7):
        out = engine.generate(ps, SamplingParams(max_new_tokens=12, temperature=t, n=4), seed=2)
        mean, mx = mismatch(model, ps, out, t)
        assert mean < 0.02 and mx < 0.1, (t, mean, mx)


@pytest.mark.xdist_group("vllm-engine")  # one engine for the group: its tests stay on one worker
def test_full_weight_push_serves_the_new_weights(engine):
    ps = prompts(engine.tok)
    sp = SamplingParams(max_new_tokens=12, temperature=1.0, n=4)
    old = engine.source
    new, _ = tiny_llama(1)
    engine.load_weights({k: v.clone() for k, v in new.state_dict().items()}, version=7)
    assert engine.version == 7
    out = engine.generate(ps, sp, seed=3)
    assert mismatch(new, ps, out)[0] < 0.02
    assert mismatch(old, ps, out)[0] > 0.05  # control: the previous weights' log-probs differ
    # the trainer's path: load_weights(None) re-exports the source module after an in-place update
    engine.set_model(new)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn_like(p))
    before = engine.generate(ps, sp, seed=3)
    engine.load_weights(None, version=8)
    after = engine.generate(ps, sp, seed=3)
    assert mismatch(new, ps, after)[0] < 0.02 and mismatch(new, ps, before)[0] > 0.05


@pytest.mark.xdist_group("vllm-engine")  # one engine for the group: its tests stay on one worker
def test_lora_push_serves_the_adapter(engine):
    """A LoRA run pushes merged weights: after the adapter trains, the engine serves the adapted policy."""
    from peft import LoraConfig, get_peft_model

    base, _ = tiny_llama(2)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    engine.set_model(lora)
    ps = prompts(engine.tok)
    sp = SamplingParams(max_new_tokens=12, temperature=1.0, n=4)
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.copy_(0.5 * torch.randn_like(p))  # a trained adapter (B starts at 0)
    stale = engine.generate(ps, sp, seed=4)
    engine.load_weights(None, version=9)
    out = engine.generate(ps, sp, seed=4)
    assert mismatch(lora, ps, out)[0] < 0.02
    assert mismatch(lora, ps, stale)[0] > 0.05  # control: before the push it served the base weights
    assert any("lora_B" in n for n, _ in lora.named_parameters())  # the trainer's module is untouched


@pytest.mark.xdist_group("vllm-engine")  # one engine for the group: its tests stay on one worker
def test_bad_push_is_a_clear_error(engine):
    from honing.engine.vllm import EngineError

    state = {k: v.clone() for k, v in engine.source.state_dict().items()}
    state["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(EngineError, match="weight reload failed"):
        engine.load_weights(state, version=10)


@pytest.mark.xdist_group("vllm-engine")  # one engine for the group: its tests stay on one worker
def test_honing_serve_over_the_vllm_engine(engine):
    """`honing serve --engine vllm`: the OpenAI server over the vLLM engine, real uvicorn on
    loopback. Whole, streamed and concurrent completions answer exactly what the engine generates
    directly (greedy), with usage counted from its tokens and every request in /metrics."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from honing.serve.app import Server
    from honing.serve.model import Served
    from honing.serve.server import RunningServer

    tok = engine.tok
    texts = ["12+3=", "hello there", "7"]
    direct = engine.generate([tok(t).input_ids for t in texts], SamplingParams(max_new_tokens=8, temperature=0.0))
    want = [(tok.decode(g[0].token_ids, skip_special_tokens=True), len(g[0].token_ids)) for g in direct]
    served = Served(name="tiny-vllm", engine=engine, tokenizer=tok, eos_ids=[tok.eos_token_id], path="")
    with RunningServer(Server(served, window_s=0.2)) as s, httpx.Client(base_url=s.url, timeout=120) as c:
        def one(text: str) -> tuple[str, int]:
            r = c.post("/v1/completions", json={"model": "tiny-vllm", "prompt": text, "max_tokens": 8,
                                                "temperature": 0})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"], r.json()["usage"]["completion_tokens"]

        with ThreadPoolExecutor(3) as pool:  # concurrent: batched into one generate call
            assert list(pool.map(one, texts)) == want
        deltas = []
        with c.stream("POST", "/v1/completions", json={"prompt": texts[0], "max_tokens": 8, "temperature": 0,
                                                      "stream": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    deltas.append(json.loads(line[6:])["choices"][0].get("text", ""))
        assert "".join(deltas) == want[0][0]
        assert c.get("/v1/models").json()["data"][0]["id"] == "tiny-vllm"
        m = c.get("/metrics").json()
        assert m["requests"] == 4 and m["completion_tokens"] == 2 * want[0][1] + want[1][1] + want[2][1]


def test_unservable_model_is_one_error_line():
    from honing.errors import HoningError
    from honing.models import load_policy

    model, tok = load_policy("tiny-random")
    with pytest.raises(HoningError, match="head size 16"):
        VLLMEngine(model, tok, [tok.eos_token_id])


def test_short_train_run_with_vllm_in_a_stale_rollout_worker(tmp_path):
    """`honing train --config smoke generation.backend=vllm schedule.staleness=1 train.steps=3` on
    SmolLM2 (tiny-random's heads are not servable on CPU): the vLLM engine lives in the rollout worker
    process, which gets each version's weights; the run completes with recomputed old log-probs, TIS
    and the mismatch logged (the in-process, staleness-0 path: the engine-kill test below)."""

    out = tmp_path / "run"
    cmd = [str(Path(sys.executable).parent / "honing"), "train", "--config", "smoke", "--out", str(out),
           "--no-progress", "generation.backend=vllm", "train.steps=3", "model.name=smollm2-135m-instruct",
           "sft.steps=0", "tasks.prompts_per_step=2", "tasks.samples_per_prompt=4", "train.micro_batch_size=8",
           "eval.heldout_tasks=8", "eval.every_steps=0", "generation.max_new_tokens=8", "schedule.staleness=1",
           "train.learning_rate=1e-5"]  # the mismatch then is the engine's, not a big step's policy lag
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    run = next(p for p in [out, *out.iterdir()] if (p / "summary.json").exists())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1 and "train/reward" in r]
    assert len(steps) == 3
    assert all("train/logprob_mismatch" in r for r in steps)
    assert all(r["train/logprob_mismatch"] < 0.5 for r in steps)
    assert max(r["staleness/max"] for r in steps) == 1.0  # generated one version behind, as asked


def engine_core_procs():
    """The vLLM engine core child processes of this process (process title VLLM::EngineCore)."""
    import psutil

    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def kill_engine_core(engine, wait=True, timeout=30.0):
    import signal
    import time

    procs = engine_core_procs()
    assert procs, "no EngineCore child process found"
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while wait and not engine._core_dead() and time.monotonic() < deadline:  # vLLM's monitor notices the death
        time.sleep(0.05)
    return [p.pid for p in procs]


def test_killed_engine_core_is_restarted_with_the_pushed_weights(capfd):
    initial, tok = tiny_llama(0)
    eng = VLLMEngine(initial, tok, [tok.eos_token_id], max_num_seqs=32)
    try:
        ps = prompts(tok)
        sp = SamplingParams(max_new_tokens=12, temperature=1.0, n=4)
        pushed, _ = tiny_llama(3)
        eng.load_weights({k: v.clone() for k, v in pushed.state_dict().items()}, version=1)
        before = eng.generate(ps, sp, seed=3)
        assert mismatch(pushed, ps, before)[0] < 0.02
        killed = kill_engine_core(eng)
        out = eng.generate(ps, sp, seed=3)
        assert eng.stats["restarts"] == 1 and eng.version == 1
        assert not set(killed) & {p.pid for p in engine_core_procs()}  # a new engine core serves
        mean, mx = mismatch(pushed, ps, out)
        assert mean < 0.02 and mx < 0.1, (mean, mx)  # the pushed (version-1) weights, not the initial ones
        assert mismatch(initial, ps, out)[0] > 0.05  # control: the initial weights' log-probs differ
        err = capfd.readouterr().err
        assert sum("engine core died" in line and "restarting" in line for line in err.splitlines()) == 1
        # killed with no pause before the next call (it may find the core alive and wait on it), that
        # call is woken and retried: a push after a restart works, and it is a second restart
        kill_engine_core(eng, wait=False)
        eng.load_weights({k: v.clone() for k, v in initial.state_dict().items()}, version=2)
        assert eng.stats["restarts"] == 2
        assert mismatch(initial, ps, eng.generate(ps, sp, seed=3))[0] < 0.02
    finally:
        eng.close()


def state_adds_up(run_dir, steps, k):
    """Nothing lost, nothing counted twice: every committed step trained on `groups x k` trajectories
    of its own, every consumed batch's rows are indexed once, and the outcomes count those samples."""
    import sqlite3

    db = sqlite3.connect(run_dir / "state.sqlite")
    q = lambda sql, *a: db.execute(sql, a).fetchall()  # noqa: E731
    assert [r[0] for r in q("SELECT step FROM steps ORDER BY step")] == list(range(steps + 1))
    for step, metrics in q("SELECT step, metrics FROM steps WHERE step > 0"):
        groups = json.loads(metrics)["train/groups"]
        used = q("SELECT COUNT(*) FROM trajectories WHERE step=? AND status='used'", step)[0][0]
        assert used == groups * k, (step, used, groups)
    for bid, rows in q("SELECT batch_id, rows FROM batches WHERE status='consumed'"):
        assert q("SELECT COUNT(*) FROM trajectories WHERE batch_id=?", bid)[0][0] == rows, bid
    dup = q("SELECT shard, row, COUNT(*) FROM trajectories GROUP BY shard, row HAVING COUNT(*) > 1")
    assert not dup
    counted = q("SELECT COUNT(*) FROM trajectories WHERE status IN ('used', 'dropped')")[0][0]
    assert q("SELECT SUM(samples) FROM outcomes WHERE step > 0")[0][0] <= counted
    db.close()


def test_engine_core_killed_mid_training_run_restarts_and_the_run_completes(tmp_path):
    """`honing train generation.backend=vllm`: SIGKILL the engine core after step 1 commits; the
    engine restarts with the pushed weights, the batch in flight is resubmitted, the run completes and
    state.sqlite adds up."""
    import signal
    import time

    import psutil

    out = tmp_path / "run"
    steps, k = 4, 4
    cmd = [str(Path(sys.executable).parent / "honing"), "train", "--config", "smoke", "--out", str(out),
           "--no-progress", "generation.backend=vllm", f"train.steps={steps}", "model.name=smollm2-135m-instruct",
           "sft.steps=0", "tasks.prompts_per_step=2", f"tasks.samples_per_prompt={k}", "train.micro_batch_size=8",
           "eval.heldout_tasks=4", "eval.every_steps=0", "generation.max_new_tokens=16"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = []
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:  # wait for step 1's commit
            if any('"step": 1' in m.read_text() for m in out.rglob("metrics.jsonl")):
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        for p in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                    os.kill(p.pid, signal.SIGKILL)
                    killed.append(p.pid)
        assert killed, "no engine core process found under the training run"
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert sum("engine core died" in ln and "restarting" in ln for ln in err.splitlines()) == 1, err[-3000:]
    run = next(m.parent for m in out.rglob("summary.json"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/reward" in r] == list(range(1, steps + 1))
    assert all(r["train/logprob_mismatch"] < 0.5 for r in rows if "train/reward" in r)  # the pushed weights serve
    state_adds_up(run, steps, k)


def _honing(*args, timeout=900):
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run([str(Path(sys.executable).parent / "honing"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_honing_eval_with_the_vllm_engine(tmp_path):
    """`honing eval --engine vllm` on the quick suite (arithmetic and sandboxed code tasks): a
    complete result that names its engine."""
    out = tmp_path / "eval.json"
    r = _honing("eval", "--model", "smollm2-135m-instruct", "--suite", "quick", "--limit", "2", "--samples", "2",
                "--engine", "vllm", "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["meta"]["engine"] == "vllm" and res["meta"]["n_tasks"] == 8
    assert "code:functions" in {t["domain"] for t in res["tasks"]}
    assert res["overall"]["infra_errors"] == 0 and res["overall"]["n_graded"] == 8


def test_honing_rollout_multi_turn_with_the_vllm_engine():
    """`honing rollout --task repair --engine vllm`: a real multi-turn episode (model turns, sandboxed
    tools) whose next turn reuses the history's KV (prefix caching) rather than re-prefilling it."""
    r = _honing("rollout", "--task", "repair", "--n", "1", "--max-turns", "3", "--max-new-tokens", "48",
                "--engine", "vllm", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    v = json.loads(line)
    assert v["domain"] == "repair" and v["infra_error"] is False and v["turns"] >= 1 and v["tokens"] > 0

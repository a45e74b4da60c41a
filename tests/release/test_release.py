"""honing release: immutable checksummed releases, a SQLite registry with lineage, gated promote,
rollback, diff, export; and `honing serve release:current` following the pointer."""

from __future__ import annotations

import copy
import json
import os
import stat
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from honing.errors import HoningError
from honing.release import build, ops
from honing.release.registry import Registry


def _eval_like(base: dict, correct_frac: float) -> dict:
    """An evaluation JSON like `base` with every task's correct count set to a fraction of n."""
    out = copy.deepcopy(base)
    for t in out["tasks"]:
        t["correct"] = int(round(t["n"] * correct_frac))
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, suite_path: str, make_run) -> dict:  # noqa: ANN001
    root = tmp_path_factory.mktemp("release")
    reg = root / "registry"
    run1, run2 = make_run(root, 1, (1, 2)), make_run(root, 2, (3,), [{"name": "pool:/data/pool@v3"}])
    v1 = build.create(f"{run1}@1", "v1", registry=reg, suite=suite_path)
    ev = json.loads((Path(v1.path) / "eval.json").read_text())
    evals = {}
    for name, frac in (("good", 1.0), ("bad", 0.0), ("mid", 0.5)):
        evals[name] = root / f"{name}.json"
        evals[name].write_text(json.dumps(_eval_like(ev, frac)))
    return {"root": root, "reg": reg, "run1": run1, "run2": run2, "v1": v1, "evals": evals, "suite": suite_path}


def test_release_is_immutable_checksummed_and_loadable(world: dict) -> None:
    v1 = world["v1"]
    d = Path(v1.path)
    assert v1.step == 1 and v1.run == str(world["run1"].resolve()) and v1.parent is None
    for f in ("model.safetensors", "config.json", "tokenizer.json", "manifest.json", "README.md", "eval.json",
              "provenance.json", "recipe.yaml"):
        assert (d / f).is_file(), f
    assert not (d / "trainer_state.pt").exists() and not (d / "adapter").exists()
    assert stat.S_IMODE(os.stat(d / "model.safetensors").st_mode) == 0o444
    Registry(world["reg"]).verify("v1")
    model = AutoModelForCausalLM.from_pretrained(d)
    ck = AutoModelForCausalLM.from_pretrained(world["run1"] / "checkpoints" / "step-1")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ck.state_dict().values()))
    card = (d / "README.md").read_text()
    ev = json.loads((d / "eval.json").read_text())
    dom, block = next(iter(ev["domains"].items()))
    assert f"| {dom} |" in card and "pass@2" in card and "95%" in card
    assert f"{block['pass@1']:.3f} [{block['ci']['pass@1'][0]:.3f}" in card
    assert "## Provenance" in card and "## Recipe" in card and str(world["run1"].resolve()) in card


def test_promote_gate_rollback_and_errors(world: dict, cli) -> None:  # noqa: ANN001
    reg, ev = str(world["reg"]), world["evals"]
    assert cli("release", "promote", "v1", "--registry", reg)[0] == 0
    r2 = build.create(str(world["run2"]), "v2", registry=reg, eval_json=ev["good"])
    assert r2.parent == "v1" and r2.step == 3 and r2.data_snapshot == "pool:/data/pool@v3"
    build.create(str(world["run2"]), "v3-bad", registry=reg, eval_json=ev["bad"])
    code, out, err = cli("release", "promote", "v2", "--registry", reg)
    assert code == 0 and "current: v2 (was v1)" in out
    # a significant regression: the table is printed, one error line, exit 2, current unchanged
    code, out, err = cli("release", "promote", "v3-bad", "--registry", reg)
    assert code == 2 and "REGRESSION" in out
    assert err.strip().count("\n") == 0 and "refused: significant regression" in err and "stays v2" in err
    assert Registry(reg).current().name == "v2"
    t0 = time.perf_counter()
    code, out, _ = cli("release", "rollback", "--registry", reg)
    assert code == 0 and "current: v1 (was v2)" in out and time.perf_counter() - t0 < 30
    assert Registry(reg).current().name == "v1"
    code, out, _ = cli("release", "list", "--registry", reg)
    assert "* v1" in out and "v3-bad" in out
    code, out, _ = cli("release", "diff", "v1", "v2", "--registry", reg)
    assert code == 0 and "model.safetensors" in out and "step" in out
    shown = json.loads(cli("release", "show", "v2", "--registry", reg)[1])
    assert shown["parent"] == "v1" and shown["checksum"] == "ok" and shown["data_snapshot"].startswith("pool:")
    for args, msg in ((("release", "show", "nope"), "release 'nope' not found"),
                      (("release", "create", str(world["run1"]), "--name", "v1"), "already exists"),
                      (("release", "create", f"{world['run1']}@step-9", "--name", "x"), "no checkpoint 'step-9'")):
        code, _, err = cli(*args, "--registry", reg)
        assert code == 2 and msg in err and err.strip().count("\n") == 0, err


def test_corrupt_release_is_refused_everywhere(world: dict, cli) -> None:  # noqa: ANN001
    reg = str(world["reg"])
    rel = build.create(f"{world['run1']}@2", "v-corrupt", registry=reg, eval_json=world["evals"]["mid"],
                       parent="v1")
    p = Path(rel.path) / "config.json"
    os.chmod(p, 0o644)
    p.write_text(p.read_text().replace("64", "65", 1))
    for args in (("release", "promote", "v-corrupt", "--no-gate"), ("serve", "release:v-corrupt")):
        code, _, err = cli(*args, "--registry", reg)
        assert code == 2 and "fails its checksum: config.json" in err and err.strip().count("\n") == 0
    assert json.loads(cli("release", "show", "v-corrupt", "--registry", reg)[1])["checksum"].startswith("release")
    code, _, err = cli("serve", "release:missing", "--registry", reg)
    assert code == 2 and "not found" in err


def test_export_and_lora_adapter_merge(world: dict, cli, tmp_path: Path) -> None:  # noqa: ANN001
    from peft import LoraConfig, get_peft_model

    from honing.models import build_tiny_random

    from honing.serve.model import load_served

    assert load_served(f"{world['run1']}@step-2").path.endswith("step-2")  # serve RUN@step-N
    code, out, _ = cli("export", f"{world['run1']}@2", "--out", str(tmp_path / "plain"))
    assert code == 0 and (tmp_path / "plain" / "model.safetensors").is_file()
    AutoModelForCausalLM.from_pretrained(tmp_path / "plain")
    base, _ = build_tiny_random(3)
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.peft_config["default"].base_model_name_or_path = "tiny-random:3"
    lora.save_pretrained(tmp_path / "adapter")
    want = copy.deepcopy(lora).merge_and_unload().state_dict()
    assert build.materialize(tmp_path / "adapter", tmp_path / "merged") == "merged"
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
    assert all(torch.allclose(want[k], got[k], atol=1e-6) for k in want if k in got)
    assert not torch.allclose(want["model.layers.0.self_attn.q_proj.weight"],
                              build_tiny_random(3)[0].state_dict()["model.layers.0.self_attn.q_proj.weight"])


def test_serve_follows_current_pointer(world: dict, tmp_path: Path) -> None:
    httpx = pytest.importorskip("httpx")
    from honing.serve.server import start_server

    reg = world["root"] / "follow-registry"
    build.create(f"{world['run1']}@1", "a", registry=reg, eval_json=world["evals"]["mid"])
    build.create(str(world["run2"]), "b", registry=reg, eval_json=world["evals"]["mid"])
    ops.promote("a", reg)
    ask = {"messages": [{"role": "user", "content": "1 + 2 ="}], "max_tokens": 8, "temperature": 0}

    def wait_for(c: httpx.Client, name: str) -> dict:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = c.post("/v1/chat/completions", json=ask).json()
            if r["model"] == name:
                return r
            time.sleep(0.1)
        raise AssertionError(f"server never switched to {name}")

    with start_server("release:current", registry=reg, follow_s=0.1, log_dir=tmp_path / "logs") as s, \
            httpx.Client(base_url=s.url, timeout=60) as c:
        first = wait_for(c, "a")
        ops.promote("b", reg, require_gate=False)
        wait_for(c, "b")
        ops.rollback(reg)
        again = wait_for(c, "a")
        assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        assert c.get("/health").json()["release"] == "a"
    recs = [json.loads(x) for p in (tmp_path / "logs").iterdir() for x in p.read_text().splitlines()]
    assert {r["release"] for r in recs} == {"a", "b"}


def test_fast_variant_measures_and_records_both(world: dict) -> None:
    rel = build.create(f"{world['run1']}@1", "v1-fast", registry=world["reg"], suite=world["suite"],
                       variant="fast", parent="v1")
    fast = rel.meta["fast"]
    methods = [c["method"] for c in fast["candidates"]]
    assert methods[0] == "standard" and "int8-decode" in methods
    assert "ngram-spec" in methods and "int8-decode+ngram-spec" in methods
    assert all(c["tokens_per_s"] > 0 and c["pass@1"] is not None for c in fast["candidates"])
    d = Path(rel.path)
    assert json.loads((d / "variant.json").read_text())["method"] == fast["method"]
    card = (d / "README.md").read_text()
    assert "## Fast variant" in card and "int8-decode" in card and "standard" in card
    from honing.serve.model import load_served

    served = load_served("release:v1-fast", registry=world["reg"])
    assert served.variant == "fast"
    quantized = any("quantized" in type(m).__module__ for m in served.engine.model.modules())
    assert quantized == fast["method"].startswith("int8")
    # the decoding part: a lone request decodes speculatively, concurrent ones stay batched
    assert (served.engine.speculative is not None) == fast["method"].endswith("ngram-spec")
    assert served.engine.speculative_max_rows == 1


def test_served_int8_decode_variant_runs_prompts_with_the_standard_weights(world: dict,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the tiny model's gate picks, a release whose variant is int8-decode is served with
    int8 decode weights and the standard (unquantized) weights for prompts, on the CPU."""
    import honing.release.fast as fast
    from honing.serve.model import load_served

    build.create(f"{world['run1']}@1", "v1-int8", registry=world["reg"], eval_json=world["evals"]["mid"])
    monkeypatch.setattr(fast, "read_variant", lambda d: {"variant": "fast", "method": "int8-decode+ngram-spec"})
    served = load_served("release:v1-int8", registry=world["reg"])
    eng = served.engine
    assert served.variant == "fast" and eng.speculative is not None
    assert any("quantized" in type(m).__module__ for m in eng.model.modules())
    assert eng.prefill_model is not None and eng.prefill_model.device.type == "cpu"
    assert not any("quantized" in type(m).__module__ for m in eng.prefill_model.modules())
    from honing.engine.types import SamplingParams

    [[s]] = eng.generate([[5, 6, 7, 8]], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert s.token_ids


def test_bad_names_and_missing_registry(tmp_path: Path) -> None:
    with pytest.raises(HoningError, match="bad release name"):
        build.create(str(tmp_path), "current", registry=tmp_path / "r")
    with pytest.raises(HoningError, match="nothing to roll back"):
        ops.rollback(tmp_path / "none")

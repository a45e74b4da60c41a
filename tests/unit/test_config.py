"""honing.config: recipes, dotted overrides, and error messages that name the problem."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from honing.config import REPO_CONFIGS, RunConfig, dump_config, help_config, load_config, parse_override
from honing.errors import ConfigError


def _write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_smoke_recipe_by_name() -> None:
    cfg, path = load_config("smoke")
    assert path.resolve() == (REPO_CONFIGS / "smoke.yaml").resolve()
    assert isinstance(cfg, RunConfig)
    raw = yaml.safe_load(path.read_text())
    assert cfg.model.name == raw["model"]["name"] == "tiny-random"
    assert cfg.train.steps == raw["train"]["steps"]
    assert cfg.train.learning_rate == pytest.approx(raw["train"]["learning_rate"])
    assert cfg.tasks.sources[0].name == raw["tasks"]["sources"][0]["name"]
    assert cfg.tasks.sources[0].params == raw["tasks"]["sources"][0]["params"]
    # Keys absent from the recipe keep their defaults.
    assert cfg.train.clip_eps_low == RunConfig().train.clip_eps_low


def test_load_quickstart_recipe() -> None:
    if not (REPO_CONFIGS / "quickstart.yaml").is_file():
        pytest.skip("configs/quickstart.yaml does not exist yet")
    cfg, path = load_config("quickstart")
    assert path.name == "quickstart.yaml" and isinstance(cfg, RunConfig)
    cfg_default, path_default = load_config(None)  # quickstart is the default recipe
    assert path_default.resolve() == path.resolve() and cfg_default == cfg


def test_load_by_path_and_dump_round_trip(tmp_path: Path) -> None:
    path = _write(tmp_path, "train:\n  steps: 3\nmodel:\n  name: tiny-random:4\n")
    cfg, got = load_config(str(path))
    assert got == path and cfg.train.steps == 3 and cfg.model.name == "tiny-random:4"
    again, _ = load_config(_write(tmp_path, dump_config(cfg), "dumped.yaml"))
    assert again == cfg


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    cfg, _ = load_config(_write(tmp_path, ""))
    assert cfg == RunConfig()


def test_override_yaml_typing() -> None:
    cfg, _ = load_config("smoke", ["train.learning_rate=2e-5", "train.steps=7", "model.bf16_autocast=true",
                                   "train.betas=[0.8, 0.9]"])
    assert isinstance(cfg.train.learning_rate, float) and cfg.train.learning_rate == 2e-5
    assert cfg.train.steps == 7 and isinstance(cfg.train.steps, int)
    assert cfg.model.bf16_autocast is True
    assert cfg.train.betas == (0.8, 0.9)
    # Later overrides win; untouched keys keep the recipe's values.
    cfg2, _ = load_config("smoke", ["train.steps=7", "train.steps=9"])
    base, _ = load_config("smoke")
    assert cfg2.train.steps == 9 and base.train.steps != 9
    assert cfg2.train.learning_rate == base.train.learning_rate == 1.0e-3


def test_override_string_value_and_nested_lora() -> None:
    cfg, _ = load_config("smoke", ["model.name=tiny-random:3", "model.lora.enabled=true", "model.lora.r=4"])
    assert cfg.model.name == "tiny-random:3"
    assert cfg.model.lora.enabled is True and cfg.model.lora.r == 4


def test_parse_override_basics() -> None:
    assert parse_override("train.steps=5") == (["train", "steps"], 5)
    assert parse_override("model.name=a=b") == (["model", "name"], "a=b")
    assert parse_override("run.x=") == (["run", "x"], "")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("train.steps")
    with pytest.raises(ConfigError, match="empty key"):
        parse_override("=3")


def test_parse_override_docstring_example_gives_float() -> None:
    keys, value = parse_override("train.learning_rate=2e-5")
    assert keys == ["train", "learning_rate"]
    assert isinstance(value, float) and value == 2e-5


@pytest.mark.parametrize(
    ("override", "bad_key", "nearest"),
    [
        ("train.learnig_rate=1", "train.learnig_rate", "learning_rate"),
        ("trian.steps=1", "trian", "train"),
        ("model.lora.rr=4", "model.lora.rr", "r"),
        ("generation.max_new_token=5", "generation.max_new_token", "max_new_tokens"),
    ],
)
def test_unknown_override_key_names_key_and_nearest(override: str, bad_key: str, nearest: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("smoke", [override])
    msg = str(info.value)
    assert f"'{bad_key}'" in msg
    assert f"did you mean '{nearest}'" in msg


def test_unknown_key_without_near_match_lists_valid_keys() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("smoke", ["train.zzzzzz=1"])
    msg = str(info.value)
    assert "'train.zzzzzz'" in msg and "valid:" in msg and "learning_rate" in msg


def test_unknown_key_in_file_names_file_key_and_nearest(tmp_path: Path) -> None:
    path = _write(tmp_path, "train:\n  stesp: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert str(path) in msg and "'train.stesp'" in msg and "did you mean 'steps'" in msg


def test_unknown_key_inside_source_list(tmp_path: Path) -> None:
    path = _write(tmp_path, "tasks:\n  sources:\n    - name: gym:basic_arithmetic\n      wieght: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "'tasks.sources.0.wieght'" in msg and "did you mean 'weight'" in msg


@pytest.mark.parametrize(("override", "key"), [("train.steps=abc", "train.steps"),
                                                ("train.learning_rate=-1", "train.learning_rate"),
                                                ("verify.extractor=regex", "verify.extractor")])
def test_wrong_type_or_value_names_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("smoke", [override])
    msg = str(info.value)
    assert f"'{key}'" in msg and override in msg


def test_wrong_type_in_file_names_file_and_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "train:\n  micro_batch_size: lots\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert str(path) in msg and "'train.micro_batch_size'" in msg and "lots" in msg


def test_override_into_scalar_is_not_a_section() -> None:
    with pytest.raises(ConfigError, match="'train.steps' is not a section"):
        load_config("smoke", ["train.steps.x=1"])


def test_nonexistent_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="not found") as info:
        load_config(str(missing))
    assert str(missing) in str(info.value)
    with pytest.raises(ConfigError, match="no_such_recipe"):
        load_config("no_such_recipe")


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "model:\n  name: tiny-random\ntrain:\n  steps: [1, 2\n  learning_rate: 1.0e-3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert str(path) in msg and "not valid YAML" in msg
    # The problem mark is on line 5 (the flow sequence is unterminated when the next key starts).
    assert "line 5" in msg


def test_non_mapping_top_level(tmp_path: Path) -> None:
    path = _write(tmp_path, "- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_help_config_lists_every_leaf_with_docs() -> None:
    lines = help_config()
    text = "\n".join(lines)
    keys = {line.split(" = ", 1)[0] for line in lines}
    for key in ("train.learning_rate", "train.steps", "model.lora.r", "generation.max_new_tokens",
                "tasks.sources", "verify.format_weight", "seed"):
        assert key in keys
    assert "train.learning_rate = 1e-05\n    AdamW learning rate." in lines
    assert "model.lora" not in keys and "train" not in keys  # sections are expanded, not listed
    assert "Gradient clipping norm." in text

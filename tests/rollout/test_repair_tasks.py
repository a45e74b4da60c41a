"""The repair task generator and the task-directory format.

The solvability proof of the generator: for a few dozen tasks across all levels, in the
sandbox, the buggy repo fails the visible tests and scores 0 on the hidden ones, and the
reference fix (applied as the recorded unified diff, the way an agent would) passes both."""

from __future__ import annotations

import ast
import itertools
import random
import textwrap

import pytest

from honing.errors import TaskError
from honing.rollout.tools import apply_hunks, parse_unified_diff
from honing.rollout.types import Trajectory
from honing.tasks import make_source, task_from_json, task_to_json
from honing.tasks.repair import TEST_COMMAND, RepairDirSource, RepairSource
from honing.tasks.repair_families import FAMILIES
from honing.verify import VerifyContext, get_verifier

from .conftest import needs_bwrap


def patched(files: dict[str, str], patch: str) -> dict[str, str]:
    out = dict(files)
    for old, new, hunks in parse_unified_diff(patch):
        out[new] = apply_hunks(out.get(old, "") if old else "", hunks)
    return out


def test_generator_is_seedable_levelled_and_splits_are_disjoint():
    src = RepairSource()
    a = list(itertools.islice(src.tasks("train", 3), 15))
    b = list(itertools.islice(src.tasks("train", 3), 15))
    assert [task_to_json(t) for t in a] == [task_to_json(t) for t in b]
    train = list(itertools.islice(src.tasks("train", 0), 60))
    held = list(itertools.islice(src.tasks("heldout", 0), 30))
    key = lambda t: (t.metadata["family"], tuple(sorted(t.environment["files"].items())))  # noqa: E731
    assert not {key(t) for t in train} & {key(t) for t in held}
    assert not {t.id for t in train} & {t.id for t in held}
    assert {t.metadata["level"] for t in train} == {1, 2, 3, 4, 5}
    assert {t.metadata["family"] for t in train} == {f.name for f in FAMILIES}
    for t in train[:20]:
        files = t.environment["files"]
        assert "tests/test_visible.py" in files and not any("hidden" in p for p in files)
        hidden_src = t.hidden["tests"]["tests/test_hidden.py"]
        assert hidden_src not in files.values() and "Hidden tests." not in t.question
        assert t.environment["test_command"] == TEST_COMMAND and t.verifier.name == "repair"
        if t.metadata["level"] == 5:
            assert len(t.hidden["solution"]) == 2 and len({b["file"] for b in t.hidden["bugs"]}) == 2
        assert task_from_json(task_to_json(t)) == t
    with pytest.raises(TaskError, match="levels"):
        RepairSource({"levels": [7]})
    with pytest.raises(TaskError, match="unknown parameters"):
        RepairSource({"level": [1]})
    with pytest.raises(TaskError, match="families must be a non-empty subset"):
        RepairSource({"families": ["shop", "gears"]})
    with pytest.raises(TaskError, match="split_by must be one of structure, site"):
        RepairSource({"split_by": "family"})
    assert isinstance(make_source("repair", {"levels": [1, 2]}), RepairSource)


def test_every_family_has_every_bug_kind_each_at_one_place():
    rng = random.Random(0)
    for fam in FAMILIES:
        assert {"operator", "off_by_one", "branch", "edge"} <= {b.kind for b in fam.bugs}, fam.name
        assert {b.module for b in fam.bugs} == {"core", "dep"}, fam.name  # level 5 needs one of each
        src = {"core": fam.core[1].format(**fam.constants(rng)), "dep": fam.dep[1].format(**fam.constants(rng))}
        public = {n.name for m in src.values() for n in ast.parse(m).body if isinstance(n, ast.FunctionDef)}
        assert public == set(fam.args), fam.name  # every public function gets generated test inputs
        for b in fam.bugs:
            assert src[b.module].count(b.old) == 1 and b.old != b.new, (fam.name, b)
    assert len({f.name for f in FAMILIES}) == len(FAMILIES) == 6


def site(task):
    return task.metadata["family"], tuple(sorted(b["old"] for b in task.hidden["bugs"]))


def test_split_by_site_holds_out_whole_bug_sites():
    src = RepairSource({"split_by": "site", "levels": [1, 2, 3, 4]})
    train = list(itertools.islice(src.tasks("train", 0), 120))
    held = list(itertools.islice(src.tasks("heldout", 0), 40))
    assert not {site(t) for t in train} & {site(t) for t in held}
    assert {t.metadata["level"] for t in held} == {t.metadata["level"] for t in train} == {1, 2, 3, 4}
    assert len({t.metadata["family"] for t in held}) >= 3
    # the default split (by structure) holds out packages and constants, not sites: that is why `site` exists
    dflt = RepairSource({"levels": [1]})
    dflt_train = {site(t) for t in itertools.islice(dflt.tasks("train", 0), 80)}
    assert {site(t) for t in itertools.islice(dflt.tasks("heldout", 0), 20)} <= dflt_train
    with pytest.raises(TaskError, match="two or more bug sites at level 3"):
        RepairSource({"split_by": "site", "levels": [3], "families": ["shop"]})


@needs_bwrap
def test_every_generated_bug_fails_on_the_buggy_repo_and_passes_on_the_reference(sandbox):
    verifier = get_verifier("repair")
    ctx = VerifyContext(extra={"sandbox": sandbox})
    for fam, level in itertools.product([f.name for f in FAMILIES], range(1, 6)):
        for task in itertools.islice(RepairSource({"levels": [level], "families": [fam]}).tasks("train", 100 * level), 1):
            assert task.metadata["family"] == fam and task.metadata["level"] == level
            buggy = dict(task.environment["files"])
            fixed = patched(buggy, task.hidden["reference_patch"])
            assert {p: fixed[p] for p in task.hidden["solution"]} == dict(task.hidden["solution"])
            vis_bug = sandbox.exec(TEST_COMMAND, files=buggy, profile="python")
            vis_fix = sandbox.exec(TEST_COMMAND, files=fixed, profile="python")
            assert vis_bug.exit_code != 0 and not vis_bug.infra_error, (task.id, vis_bug.stdout[-500:])
            assert vis_fix.exit_code == 0, (task.id, vis_fix.stdout[-800:])
            for files, want in ((buggy, 0.0), (fixed, 1.0)):
                traj = Trajectory.from_text(task.id, task.domain, "")
                traj.files = files
                v = verifier.verify(task, traj, ctx)
                assert not v.infra_error and v.score == want, (task.id, level, want, v.details)


def write_task_dir(root, name="fix-mean"):
    d = root / name
    (d / "repo" / "stats").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "task.yaml").write_text(textwrap.dedent("""\
        instruction: |
          `stats.mean` crashes on an empty list; it should return 0.0 then.
        difficulty: easy
        tags: [python, edge-case]
        max_test_timeout_sec: 30
        source_files: ["stats/*.py"]
        """))
    (d / "repo" / "stats" / "__init__.py").write_text("")
    (d / "repo" / "stats" / "core.py").write_text("def mean(xs):\n    return sum(xs) / len(xs)\n")
    (d / "tests" / "test_mean.py").write_text(textwrap.dedent("""\
        import unittest
        from stats.core import mean


        class TestMean(unittest.TestCase):
            def test_empty(self):
                self.assertEqual(mean([]), 0.0)

            def test_values(self):
                self.assertEqual(mean([1, 2, 3]), 2.0)
        """))
    (d / "solution.patch").write_text(
        "--- a/stats/core.py\n+++ b/stats/core.py\n@@ -1,2 +1,4 @@\n def mean(xs):\n"
        "+    if not xs:\n+        return 0.0\n     return sum(xs) / len(xs)\n")
    return d


def test_task_directory_format(tmp_path):
    d = write_task_dir(tmp_path)
    [task] = list(make_source(f"repair:dir:{d}").tasks("train", 0))
    assert isinstance(make_source(f"repair:dir:{d}"), RepairDirSource)
    assert task.id == "repair:dir/fix-mean" and "crashes on an empty list" in task.question
    assert set(task.environment["files"]) == {"stats/__init__.py", "stats/core.py"}
    assert set(task.hidden["tests"]) == {"tests/test_mean.py"} and "solution.patch" not in task.environment["files"]
    assert task.difficulty == 0.2 and task.tags == ("python", "edge-case") and task.verifier.params["timeout_s"] == 30
    assert list(make_source(f"repair:dir:{d}").tasks("heldout", 0)) == []  # a single task is train only
    for i in range(6):  # a folder of task folders is split between train and heldout
        write_task_dir(tmp_path / "many", f"t{i}")
    src = make_source(f"repair:dir:{tmp_path / 'many'}")
    tr, he = list(src.tasks("train", 0)), list(src.tasks("heldout", 0))
    assert len(tr) + len(he) == 6 and not {t.id for t in tr} & {t.id for t in he}
    (d / "task.yaml").write_text("difficulty: easy\n")
    with pytest.raises(TaskError, match="instruction"):
        list(make_source(f"repair:dir:{d}").tasks("train", 0))
    with pytest.raises(TaskError, match="not a directory"):
        make_source(f"repair:dir:{tmp_path / 'nope'}")


@needs_bwrap
def test_task_directory_is_graded_on_its_hidden_tests(tmp_path, sandbox):
    [task] = list(RepairDirSource(write_task_dir(tmp_path)).tasks("train", 0))
    ctx = VerifyContext(extra={"sandbox": sandbox})
    traj = Trajectory.from_text(task.id, task.domain, "")
    traj.files = dict(task.environment["files"])
    v = get_verifier("repair").verify(task, traj, ctx)
    assert v.score == 0.5 and not v.passed and "1/2" in v.details
    traj.files = patched(traj.files, task.hidden["reference_patch"])
    assert get_verifier("repair").verify(task, traj, ctx).score == 1.0

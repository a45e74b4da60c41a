"""The cad package's own tests (honing's tests/envs/test_cad.py has the full set): tasks split by
structure, bad params fail clearly, and (with bwrap and `make setup-cad`) a reference scores 1
while a box with the right bounding box does not."""

from __future__ import annotations

import itertools
import shutil

import pytest

from honing.errors import TaskError
from honing.sandbox.profiles import cad_toolchain_problem
from honing.tasks.user import _task_from_dict
from honing_env_cad.grader import grade_script
from honing_env_cad.tasks import make_tasks

needs_box = pytest.mark.skipif(shutil.which("bwrap") is None or cad_toolchain_problem() is not None,
                               reason="needs bubblewrap and the cad toolchain (make setup-cad)")


def test_held_out_structures_never_train() -> None:
    train = {t["metadata"]["structure_key"] for t in itertools.islice(make_tasks("train", 0), 200)}
    held = {t["metadata"]["structure_key"] for t in itertools.islice(make_tasks("heldout", 0), 200)}
    assert train and held and not train & held


def test_unknown_family_is_one_clear_error() -> None:
    with pytest.raises(TaskError, match="unknown family 'gear'"):
        make_tasks("train", 0, families=["gear"])


@needs_box
def test_reference_passes_and_a_bbox_box_does_not() -> None:
    task = _task_from_dict(next(make_tasks("train", 0, families=["flange"], levels=[2])), "cad", 0, "env:cad")
    assert grade_script(task.hidden["program"], task).score == 1.0
    lo, hi = task.hidden["spec"]["bbox_min"], task.hidden["spec"]["bbox_max"]
    box = (f"from build123d import *\nresult = Box({hi[0] - lo[0]}, {hi[1] - lo[1]}, {hi[2]}, "
           "align=(Align.CENTER, Align.CENTER, Align.MIN))\n")
    v = grade_script(box, task)
    assert v.components["bbox"] == 1.0 and v.score < 1.0 and not v.passed

"""Shared pieces for the multi-turn suites: the tiny ChatML tokenizer, a bwrap sandbox (the
suites that need one skip cleanly without bubblewrap), tool-call text, scripted episodes."""

from __future__ import annotations

import json
import shutil

import pytest

HAVE_BWRAP = shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap (bwrap) is not installed")


def call(name: str, **arguments) -> str:
    """One assistant reply holding one tool call, in the documented text format."""
    return f"Let me use {name}.\n<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture(scope="session")
def tok():
    from honing.models import load_tokenizer

    return load_tokenizer("tiny-random")


@pytest.fixture(scope="session")
def sandbox():
    if not HAVE_BWRAP:
        pytest.skip("bubblewrap (bwrap) is not installed")
    from honing.sandbox import Sandbox

    sb = Sandbox("bwrap", max_concurrency=2)
    yield sb
    sb.close()


@pytest.fixture(scope="session")
def repair_tasks():
    """One generated repair task per level (1..5), from the train split."""
    from honing.tasks.repair import RepairSource

    return {lv: next(RepairSource({"levels": [lv]}).tasks("train", 0)) for lv in range(1, 6)}

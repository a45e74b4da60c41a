"""Final-answer extraction shared by verifiers.

Each extractor returns (answer or None, format_ok). An answer is taken only when there is
exactly one: two different <answer> tags or boxed answers get no credit.
"""

from __future__ import annotations

import re
from typing import Callable

_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def _one(found: list[str]) -> str | None:
    distinct = {f.strip() for f in found}
    return distinct.pop() if len(distinct) == 1 else None


def answer_tag(text: str) -> tuple[str | None, bool]:
    found = _TAG.findall(text)
    return _one(found), len(found) == 1


def _boxed_contents(text: str) -> list[str]:
    out, i = [], 0
    while (i := text.find("\\boxed{", i)) >= 0:
        depth, j = 1, i + len("\\boxed{")
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth == 0:
            out.append(text[i + len("\\boxed{"): j - 1])
        i = j
    return out


def boxed(text: str) -> tuple[str | None, bool]:
    found = _boxed_contents(text)
    return _one(found), len(found) == 1


def last_number(text: str) -> tuple[str | None, bool]:
    """The last number in the text; format_ok when the reply is just that number."""
    found = _NUMBER.findall(text)
    if not found:
        return None, False
    ans = found[-1].replace(",", "")
    return ans, text.strip().rstrip(".") == found[-1]


def full(text: str) -> tuple[str | None, bool]:
    stripped = text.strip()
    return (stripped or None), bool(stripped)


EXTRACTORS: dict[str, Callable[[str], tuple[str | None, bool]]] = {
    # `auto`: each verifier's own reading. The `math` verifier reads maths (honing.verify.math_extract),
    # `reasoning_gym` its own way (builtin.py); exact and numeric take the last number, as they always have.
    "auto": last_number,
    "answer_tag": answer_tag,
    "boxed": boxed,
    "last_number": last_number,
    "full": full,
}

"""Final-answer extraction shared by verifiers.

Each extractor returns (answer or None, format_ok). An answer is taken only when there is
exactly one: two different <answer> tags or boxed answers get no credit.
"""

from __future__ import annotations

import re
from typing import Callable

_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")  # a plain number as last_number reads it


def single_answer(found: list[str]) -> str | None:
    """The answer when all found answers say the same thing (stripped), else None."""
    distinct = {f.strip() for f in found}
    return distinct.pop() if len(distinct) == 1 else None


def answer_tag(text: str) -> tuple[str | None, bool]:
    found = _TAG.findall(text)
    return single_answer(found), len(found) == 1


def braced_after(text: str, cmd: str) -> list[tuple[int, int, str]]:
    """(start, end, contents) of every `cmd{...}` with balanced braces (a backslash escapes one char)."""
    out, i = [], 0
    while (i := text.find(cmd + "{", i)) >= 0:
        depth, j = 1, i + len(cmd) + 1
        while j < len(text) and depth:
            c = text[j]
            if c == "\\" and j + 1 < len(text):
                j += 2
                continue
            depth += {"{": 1, "}": -1}.get(c, 0)
            j += 1
        if depth == 0:
            out.append((i, j, text[i + len(cmd) + 1: j - 1]))
        i = j
    return out


def boxed(text: str) -> tuple[str | None, bool]:
    found = [b[2] for b in braced_after(text, "\\boxed")]
    return single_answer(found), len(found) == 1


def last_number(text: str) -> tuple[str | None, bool]:
    """The last number in the text; format_ok when the reply is just that number."""
    found = NUMBER.findall(text)
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

"""User tasks from a JSONL file: one object per line with a prompt and a reference answer.

Line format: {"prompt": "..." | [messages], "answer": "...", "verifier": "exact" (optional),
"id": "..." (optional), "domain": "..." (optional), "split": "train"|"heldout" (optional)}.
Lines without a split go to train unless their stable hash puts them in the held-out 10%.
The file is streamed, never loaded whole.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterator

from honing.errors import TaskError
from honing.tasks.types import Task, VerifierSpec

HELDOUT_FRACTION = 0.1


def _split_of(key: str) -> str:
    h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return "heldout" if h < HELDOUT_FRACTION * 0xFFFFFFFF else "train"


class JsonlSource:
    def __init__(self, path: str, verifier: str | None = None, system_prompt: str | None = None,
                 prompt_template: str = "{question}") -> None:
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise TaskError(f"task file not found: {self.path}")
        self.domain = f"jsonl:{self.path.stem}"
        self.verifier = verifier or "exact"
        self.system_prompt = system_prompt
        self.prompt_template = prompt_template

    def _parse(self, lineno: int, line: str) -> dict[str, Any]:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskError(f"{self.path}:{lineno}: not valid JSON: {e.msg}") from None
        if not isinstance(obj, dict):
            raise TaskError(f"{self.path}:{lineno}: expected an object")
        for key in ("prompt", "answer"):
            if key not in obj:
                raise TaskError(f"{self.path}:{lineno}: missing key '{key}'")
        return obj

    def _task(self, obj: dict[str, Any], lineno: int) -> Task:
        raw = obj["prompt"]
        if isinstance(raw, str):
            msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
            msgs.append({"role": "user", "content": self.prompt_template.replace("{question}", raw)})
        else:
            msgs = list(raw)
        return Task(
            id=str(obj.get("id", f"{self.domain}/{lineno}")),
            domain=str(obj.get("domain", self.domain)),
            prompt=tuple(msgs),
            verifier=VerifierSpec(str(obj.get("verifier", self.verifier)), obj.get("verifier_params", {})),
            hidden={"answer": str(obj["answer"])},
            difficulty=obj.get("difficulty"),
            metadata={"line": lineno},
        )

    def tasks(self, split: str, seed: int) -> Iterator[Task]:
        """File order (seed is unused: the scheduler shuffles); split by field or stable hash."""
        with self.path.open() as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                obj = self._parse(lineno, line)
                key = str(obj.get("id", obj["prompt"]))
                if obj.get("split", _split_of(key)) == split:
                    yield self._task(obj, lineno)

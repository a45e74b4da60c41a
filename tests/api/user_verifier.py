"""A new verifier as a user writes it (a class with partial credit), under 30 lines."""
from honing.verify import Verdict


class CloseEnough:
    """Full marks for the exact number, half for one off, nothing otherwise."""

    def verify(self, task, trajectory, ctx):
        words = trajectory.completion_text.strip().split()
        try:
            got, want = int(words[0].strip(".")), int(task.hidden["answer"])
        except (IndexError, ValueError):
            return Verdict(0.0, False, {"correct": 0.0}, "no number")
        score = 1.0 if got == want else 0.5 if abs(got - want) == 1 else 0.0
        return Verdict(score, score == 1.0, {"correct": score}, f"{got} vs {want}")


def reward(completion, answer):
    """The same rule as a plain function."""
    words = completion.strip().split()
    try:
        got, want = int(words[0].strip(".")), int(answer)
    except (IndexError, ValueError):
        return 0.0
    return 1.0 if got == want else 0.5 if abs(got - want) == 1 else 0.0

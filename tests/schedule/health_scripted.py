"""Scripted verifiers for the run-health tests. What they return follows the policy version that
generated a sample (a training sample of step s comes from version s - 1, a held-out one evaluated
at step s from version s), not the completion, so each event comes on cue whatever the tiny model
writes. A small per-sample wobble keeps the rewards of a group apart."""
import zlib

from honing.verify import Verdict


def _wobble(trajectory) -> float:
    return (zlib.crc32(trajectory.completion_text.encode()) % 5) / 100


class FormatGain:
    """`correct` stays 0 while `format` climbs 0.3 a version: the format layer drives all of the reward
    gain. From version 2 on, the samples of every fourth training task are infrastructure errors."""

    def verify(self, task, trajectory, ctx):
        v = max(trajectory.policy_version, 0)
        if "/heldout/" not in task.id and v >= 2 and zlib.crc32(task.id.encode()) % 4 == 0:
            return Verdict.infra("scripted sandbox failure")
        fmt = min(1.0, 0.3 * v + _wobble(trajectory))
        return Verdict(fmt / 2, False, {"correct": 0.0, "format": fmt}, "scripted format")


class HeldoutDrop:
    """Training samples pass more often every version (train reward rises); held-out tasks pass
    until version 3 and fail from then on (held-out pass@1 falls)."""

    def verify(self, task, trajectory, ctx):
        v = max(trajectory.policy_version, 0)
        if "/heldout/" in task.id:
            ok = v < 3
        else:
            ok = zlib.crc32(trajectory.completion_text.encode() + task.id.encode()) % 10 < 3 * v
        return Verdict(float(ok), ok, {"correct": float(ok)}, "scripted")

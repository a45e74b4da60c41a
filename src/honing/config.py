"""The config tree: one pydantic model, YAML recipes in configs/, dotted overrides on the CLI.

Every field's docstring is its help text (`honing train --help-config`). Field names carry
their unit. Unknown keys fail at start-up naming the key and the nearest valid one.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from honing.errors import ConfigError
from honing.verify.reward import RewardConfig

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"
DEFAULT_RECIPE = "quickstart"


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class LoraConfig(_Node):
    enabled: bool = False
    """Train a LoRA adapter (peft) instead of all weights."""
    r: int = Field(16, gt=0)
    """LoRA rank."""
    alpha: int = Field(32, gt=0)
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the LoRA branch."""
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    """Module names that get adapters."""


class ModelConfig(_Node):
    name: str = "smollm2-135m-instruct"
    """Policy: 'smollm2-135m-instruct' (default), 'tiny-random[:SEED]', a local HF directory or a hub id."""
    bf16_autocast: bool = True
    """Use bf16 autocast for generation and training where the CPU/GPU supports bf16 (AMX, AVX512-BF16, CUDA)."""
    lora: LoraConfig = LoraConfig()
    """LoRA settings (off by default: full fine-tuning)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the trainer's policy lives: 'auto' is the GPU when torch sees one, else the CPU."""


class SourceConfig(_Node):
    name: str
    """Task source: 'gym:<reasoning_gym dataset>', 'jsonl:<path>', 'humaneval', 'code:functions', 'finance', 'repair'."""
    weight: float = Field(1.0, gt=0)
    """Mixing weight of this source among the sources."""
    params: dict[str, Any] = {}
    """Source parameters (for gym: the dataset's config, e.g. min_digits, max_digits)."""
    verifier: str | None = None
    """Verifier name for this source's tasks (default: the source's own, e.g. 'reasoning_gym')."""
    level: int = Field(0, ge=0)
    """Curriculum level within the source's domain: with schedule.curriculum.enabled, level L+1 sources
    open once the domain's pass rate at level L crosses schedule.curriculum.advance_at."""


class TasksConfig(_Node):
    sources: list[SourceConfig] = [
        SourceConfig(
            name="gym:basic_arithmetic",
            params={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+"]},
        )
    ]
    """Where training and held-out tasks come from."""
    system_prompt: str | None = None
    """System message put before every task prompt (None: the chat template's default)."""
    prompt_template: str = "{question}"
    """User message; '{question}' is replaced by the task's question."""
    prompts_per_step: int = Field(2, gt=0)
    """Distinct tasks per training step."""
    samples_per_prompt: int = Field(8, gt=0)
    """Samples per task (the GRPO group size)."""
    train_seed: int = 0
    """Seed of the training task stream."""
    heldout_seed: int = 1_000_003
    """Seed of the held-out tasks; held-out and training tasks come from disjoint seed ranges."""
    exclude_heldout_questions: bool = True
    """Also skip training tasks whose question text equals a held-out question (small domains repeat)."""


class GenerationConfig(_Node):
    backend: Literal["hf", "vllm", "vllm-server"] = "hf"
    """Generation engine: 'hf' (honing's transformers decode loop; the default, no extra install), 'vllm'
    (an in-process vLLM engine; `make setup-vllm`), 'vllm-server' (an OpenAI-compatible vLLM server that
    honing starts, or the one at `generation.server_url`)."""
    server_url: str | None = None
    """With backend 'vllm-server': the base URL of a server you run (None: honing starts one on loopback)."""
    max_new_tokens: int = Field(48, gt=0)
    """Most tokens generated per sample."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature for training rollouts."""
    top_p: float = Field(1.0, gt=0, le=1.0)
    """Nucleus sampling mass (1.0: off)."""
    top_k: int = Field(0, ge=0)
    """Top-k sampling (0: off)."""
    max_batch_size: int = Field(64, gt=0)
    """Most sequences decoded together in one generate call."""
    max_batch_tokens: int | None = Field(None, gt=0)
    """Backend 'hf': most KV-cache tokens (prompt + max_new_tokens, summed over the rows) one decode batch
    holds; a larger call runs in several batches. None: a quarter of the device's total memory (RAM on CPU)."""
    weights: Literal["auto", "shared", "bf16"] = "auto"
    """Generation weights: 'shared' decodes with the trainer's module (under autocast when on);
    'bf16' keeps a bf16 copy synced after every update (faster decoding, a small logged
    engine/trainer mismatch); 'auto' is 'bf16' when model.bf16_autocast is on and the device has bf16."""


class VerifyConfig(_Node):
    extractor: Literal["auto", "answer_tag", "last_number", "boxed", "full"] = "auto"
    """How the final answer is taken from a completion: 'auto' is each verifier's own reading (math:
    boxed, answer tags, answer phrases, LaTeX spans, plain expressions; exact/numeric/reasoning_gym:
    the last number); any other value is used alone, as named."""
    format_weight: float = Field(0.0, ge=0.0, le=1.0)
    """Weight of the format layer in the reward (score = (1-w)*correct + w*format)."""
    concurrency: int = Field(16, gt=0)
    """Most completions graded at the same time (verifier calls run on worker threads / sandboxes)."""
    timeout_s: float = Field(120.0, gt=0)
    """A verifier call that takes longer is an infrastructure error (dropped, never scored 0)."""
    max_completion_bytes: int = Field(1 << 20, gt=0)
    """Completions longer than this score 0 with a reason instead of being graded."""
    max_infra_error_frac: float = Field(0.5, ge=0.0, le=1.0)
    """Stop the run when more than this fraction of a step's samples are infrastructure errors."""


class RolloutConfig(_Node):
    """Multi-turn episodes (tasks with an environment, e.g. `repair`)."""

    max_turns: int = Field(8, gt=0)
    """Most assistant turns per episode (a task may set fewer)."""
    max_total_tokens: int = Field(4096, gt=0)
    """Most tokens per episode: prompt, replies and observations."""
    wall_time_s: float = Field(600.0, gt=0)
    """Time budget per episode: its own tool and sandbox time plus its share of each batched generation (a batch
    of n episodes charges each 1/n of it), so the budget means the same for 8 episodes or 64 evaluated at once."""
    max_parse_errors: int = Field(3, ge=0)
    """Replies without a usable tool call before the episode stops."""
    context_tokens: int | None = Field(None, gt=0)
    """Context budget (None: the tokenizer's model_max_length, capped at 32768)."""
    truncation: Literal["oldest_observations", "none"] = "oldest_observations"
    """When the context is full: replace the oldest observations by a placeholder, or stop."""
    keep_last_observations: int = Field(1, ge=0)
    """Observations never truncated (the most recent ones)."""
    mask_stale_turns: bool = True
    """Give loss mask 0 to replies sampled under a context that was later truncated."""
    max_observation_chars: int = Field(4000, gt=0)
    """Tool output longer than this is cut (head and tail kept)."""
    prefix_cache_tokens: int = Field(65536, ge=0)
    """Within a rollout, a turn's prompt reuses the KV of the history prefilled the turn before, up to
    this many tokens cached (the transformers engine; 0 = off: every turn prefills its whole history)."""


class SandboxConfig(_Node):
    backend: str = "bwrap"
    """Where code runs: 'bwrap' (isolated), 'local' (NO isolation; trusted code only), or
    'faulty:<backend>:fail=P,hang=P,hang_s=S,seed=N' (fault injection for testing the scheduler)."""

    @model_validator(mode="after")
    def _check_backend(self) -> "SandboxConfig":
        name = self.backend.split(":")[1] if self.backend.startswith("faulty:") else self.backend
        if name not in ("bwrap", "local"):
            raise ValueError(f"sandbox.backend='{self.backend}': unknown backend (bwrap, local, faulty:<backend>:...)")
        if self.backend.startswith("faulty:"):
            from honing.sandbox.faulty import parse_faulty

            try:
                parse_faulty(self.backend)
            except Exception as e:  # noqa: BLE001 - the parser's message names the bad option
                raise ValueError(f"sandbox.backend='{self.backend}': {e}") from None
        return self
    max_concurrency: int = Field(0, ge=0)
    """Most boxes running at once (0: the number of CPUs)."""


class TrainConfig(_Node):
    steps: int = Field(40, ge=0)
    """RL steps (one batch of rollouts and one optimizer step each)."""
    learning_rate: float = Field(1e-5, gt=0)
    """AdamW learning rate."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    warmup_steps: int = Field(0, ge=0)
    """Linear LR warm-up steps."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradient clipping norm."""
    micro_batch_size: int = Field(8, gt=0)
    """Sequences per forward/backward; gradients accumulate over the step's batch."""
    clip_eps_low: float = Field(0.2, gt=0)
    """PPO clip: ratio lower bound 1 - clip_eps_low."""
    clip_eps_high: float = Field(0.2, gt=0)
    """PPO clip: ratio upper bound 1 + clip_eps_high (DAPO clip-higher when > low)."""
    kl_coef: float = Field(0.0, ge=0)
    """Coefficient of the KL to the frozen reference (initial policy); 0 loads no reference model."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator (Schulman 2020): k1 = logp - ref, k2 = (logp - ref)^2 / 2, k3 = exp(ref - logp) - (ref - logp) - 1."""
    kl_in_reward: bool = False
    """Fold the KL into the reward (r - kl_coef * sum_t KL_t, before advantages) instead of adding a loss term."""
    scale_rewards: bool = True
    """GRPO: divide group-centred rewards by the group std (False: Dr. GRPO-style centring only)."""
    advantage_estimator: str = "grpo"
    """grpo (group mean/std), dr_grpo (group mean only), rloo (leave-one-out mean), reinforce_pp (batch mean/std),
    or your own `fn(rewards, group_size) -> advantages` named 'package.module:fn' or './file.py:fn'."""
    policy_loss: Literal["ppo_clip", "gspo", "cispo"] = "ppo_clip"
    """ppo_clip (per-token ratio, clip_eps_low/high; DAPO clip-higher), gspo (sequence ratio), cispo (clipped IS weight)."""
    loss_aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_sum_norm"] = "token_mean"
    """token_mean (DAPO), seq_mean_token_mean (original GRPO), seq_sum_norm (Dr. GRPO: / (sequences * loss_norm_tokens))."""
    loss_norm_tokens: int | None = Field(None, gt=0)
    """seq_sum_norm's constant (e.g. generation.max_new_tokens); None: the longest completion of the step."""
    gspo_clip_low: float = Field(3e-4, gt=0, lt=1)
    """GSPO: sequence-ratio lower bound 1 - gspo_clip_low."""
    gspo_clip_high: float = Field(4e-4, gt=0)
    """GSPO: sequence-ratio upper bound 1 + gspo_clip_high."""
    cispo_max_weight: float = Field(5.0, gt=1)
    """CISPO: importance weights are clipped to at most this (stop-gradient)."""
    tis_cap: float | None = Field(None, gt=1)
    """Truncated importance sampling: weight tokens by min(exp(old_logp - engine_logp), tis_cap); None: off."""
    seq_mask_low: float | None = Field(None, gt=0, lt=1)
    """Drop sequences whose geometric-mean trainer/engine ratio is below this; None: off."""
    seq_mask_high: float | None = Field(None, gt=1)
    """Drop sequences whose geometric-mean trainer/engine ratio is above this; None: off."""
    recompute_old_logprobs: bool | None = None
    """Old log-probs from the trainer (before the update) rather than the engine's. None (auto): on in every run
    of `honing train` (the engine samples from its own copy, bf16 by default, so its log-probs are not the
    trainer's: with them the PPO ratio starts off 1 and clips by precision noise); False: the engine's (one
    forward less). Always on when ppo_epochs * mini_batches > 1 or with tis_cap / seq_mask_*."""
    ppo_epochs: int = Field(1, gt=0)
    """Passes over each batch of rollouts (PPO-style reuse)."""
    mini_batches: int = Field(1, gt=0)
    """Optimizer steps per epoch: the batch is shuffled and split into this many mini-batches."""
    micro_batch_tokens: int = Field(0, ge=0)
    """Padded-token budget per forward/backward: sequences sorted by length and packed up to it (0: micro_batch_size)."""
    share_prompt: bool = True
    """Run each distinct prompt once for all its completions in the trainer's forward (a 4D mask
    keeps completions apart; same log-probs and gradients as one row per sample). Falls back to
    one row per sample for models without plain lm_head logits or a custom-mask attention."""
    packed_row_tokens: int = Field(1024, gt=0)
    """With share_prompt: most tokens in one [prompt | completions...] row (attention is quadratic in it)."""
    logprob_chunk_tokens: int = Field(4096, ge=0)
    """Compute log-probs this many (row x position) tokens at a time, never the whole batch's vocabulary logits (0: off)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal (no signal) and refill the step with new tasks."""
    dynamic_sampling_max_rounds: int = Field(3, ge=1)
    """Most extra rollout rounds per step when refilling (then the step trains on what it has)."""

    @model_validator(mode="after")
    def _check_ranges(self) -> "TrainConfig":
        from honing.plugins import is_reference

        builtin = ("grpo", "dr_grpo", "rloo", "reinforce_pp")
        if self.advantage_estimator not in builtin and not is_reference(self.advantage_estimator):
            raise ValueError(f"train.advantage_estimator={self.advantage_estimator!r}: not one of {', '.join(builtin)} "
                             "nor a 'package.module:fn' / './file.py:fn' reference"
                             + _nearest(self.advantage_estimator, list(builtin)))
        if self.clip_eps_low >= 1:
            raise ValueError(f"train.clip_eps_low={self.clip_eps_low} must be < 1 (ratio lower bound 1 - clip_eps_low > 0)")
        for lo, hi in (("clip_eps_low", "clip_eps_high"), ("gspo_clip_low", "gspo_clip_high")):
            if getattr(self, hi) < getattr(self, lo):
                raise ValueError(f"train.{hi}={getattr(self, hi)} < train.{lo}={getattr(self, lo)}: clip range "
                                 "inverted (the upper clip must be at least the lower; DAPO clip-higher raises it)")
        if self.kl_in_reward and self.kl_coef == 0:
            raise ValueError("train.kl_in_reward needs train.kl_coef > 0")
        return self


class SFTConfig(_Node):
    steps: int = Field(0, ge=0)
    """Warm-start SFT steps on graded demonstrations before RL (0: off; `honing sft` runs this stage alone)."""
    source: str = "reference"
    """Where demonstrations come from: reference (the tasks' own solvers), rejection (best-of-n of the policy,
    verified), teacher:SPEC (a model spec, or an endpoint http://HOST/v1#MODEL), file:PATH (JSONL/Parquet chat
    transcripts). Every one is graded by the task's verifier and screened against the held-out tasks."""
    tasks: int = Field(0, ge=0)
    """Training tasks to draw demonstrations from (0: batch_size x 8)."""
    samples: int = Field(8, gt=0)
    """Samples per task for rejection and teacher sources (best-of-n)."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature for rejection and teacher sources."""
    keep: Literal["best", "all"] = "best"
    """Rejection/teacher: keep the best passing sample per task, or every passing one."""
    allow_ungraded: bool = False
    """file source: train on transcripts that carry no task to grade them with (marked ungraded)."""
    refuse_contaminated: bool = True
    """Refuse demonstrations that overlap a held-out task (same question, 13-gram or MinHash near-duplicate).
    Not applied where RL itself may train on held-out questions (tasks.exclude_heldout_questions=false: a tiny
    question space shared on purpose, as in configs/smoke.yaml)."""
    lora: bool = False
    """Train the SFT stage through LoRA adapters (model.lora's shape), merged into the weights afterwards."""
    micro_batch_tokens: int = Field(0, ge=0)
    """Split each SFT batch into forwards of at most this many padded tokens, gradients accumulated (the same
    update; bounds memory on long prompts such as finance statements). 0: one forward per batch."""
    checkpoint_every: int = Field(0, ge=0)
    """Save the SFT stage's progress (weights + optimizer) every N steps so a killed run resumes mid-SFT (0: off)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the SFT backward pass instead of storing them: less memory on long multi-turn
    demonstrations (repair episodes of several thousand tokens), slower steps. Off again before RL."""

    @model_validator(mode="after")
    def _check_source(self) -> "SFTConfig":
        kind, _, arg = self.source.partition(":")
        if not ((kind in ("reference", "rejection") and not arg) or (kind in ("teacher", "file") and arg)):
            raise ValueError(f"sft.source={self.source!r}: unknown demonstration source (valid: reference, "
                             "rejection, teacher:SPEC, file:PATH)")
        return self
    learning_rate: float = Field(1e-3, gt=0)
    """SFT learning rate."""
    batch_size: int = Field(16, gt=0)
    """Demonstrations per SFT step."""
    response_template: str = "{answer}"
    """Assistant reply of a demonstration; '{answer}' is the reference answer."""
    pack_tokens: int = Field(0, ge=0)
    """Pack demonstrations into rows of at most this many tokens (no attention across them; 0: off). Pays off
    when demonstration lengths vary widely; for near-equal lengths padding is cheaper."""


class ContaminationCheckConfig(_Node):
    mode: Literal["off", "warn", "fail"] = "warn"
    """At start-up, compare training tasks with the held-out tasks (13-grams + MinHash): warn, fail, or skip."""
    max_fraction: float = Field(0.0, ge=0.0, le=1.0)
    """Fraction of held-out tasks allowed to overlap a training task before the check warns/fails."""
    train_tasks: int = Field(500, gt=0)
    """Training tasks scanned per source."""
    threshold: float = Field(0.8, gt=0.0, le=1.0)
    """MinHash Jaccard similarity at which a near-duplicate counts."""


class EvalConfig(_Node):
    heldout_tasks: int = Field(64, ge=0)
    """Held-out tasks evaluated at start, every `every_steps` and at the end (0: no evaluation)."""
    samples_per_task: int = Field(1, gt=0)
    """Samples per held-out task (pass@1 is the mean over them)."""
    temperature: float = Field(0.0, ge=0)
    """Evaluation sampling temperature (0: greedy)."""
    every_steps: int = Field(0, ge=0)
    """Evaluate every N steps (0: only at start and end)."""
    weights: Literal["export", "engine"] = "export"
    """Which weights held-out evaluation decodes with. 'export': the trainer's full-precision weights
    (LoRA applied), exactly what a checkpoint saves and `honing eval CHECKPOINT` measures, decoded by an
    hf engine without autocast. 'engine': the generation engine's copy (bf16 or vLLM): faster, but not
    the weights that ship (greedy decoding from a bf16 copy swung 3 of 48 quickstart tasks)."""
    reuse_before: bool = False
    """Reuse the held-out evaluation of the initial policy from an earlier run when the weights, the
    held-out tasks, every setting that affects decoding or grading, and the code are all the same
    (stored under $HONING_HOME/evals/; eval/before_cache.py). Saves the base model's evaluation on
    each rerun of a recipe (repair's takes 17 min on 2 cores); the summary names the run it came from."""
    contamination: ContaminationCheckConfig = ContaminationCheckConfig()
    """Start-up overlap check between training sources and the held-out tasks."""


class CheckpointConfig(_Node):
    every_steps: int = Field(0, ge=0)
    """Save a checkpoint every N steps (0: only at the end)."""
    keep_last: int = Field(2, gt=0)
    """How many step checkpoints to keep."""


class CurriculumConfig(_Node):
    enabled: bool = False
    """Easy first: start each domain at its lowest source `level` and advance when its pass rate crosses `advance_at`."""
    advance_at: float = Field(0.7, gt=0, le=1)
    """A domain advances to its next level when its rolling pass rate reaches this."""
    min_samples: int = Field(64, gt=0)
    """Samples a domain must have at its current level before it may advance."""
    window: int = Field(256, gt=0)
    """Samples in each domain's rolling pass-rate window."""
    lookahead: int = Field(0, ge=0)
    """Tasks buffered per stream to serve the easiest first by the task's `difficulty` knob (0: stream order)."""


class PriorityConfig(_Node):
    revisit_frac: float = Field(0.0, ge=0, le=1)
    """Share of each step's tasks drawn from revisits of seen tasks, informative ones (pass rate strictly
    between 0 and 1) first (0: only fresh tasks)."""
    rest_steps: int = Field(20, ge=0)
    """Tasks that every sample passed or every sample failed rest this many steps before a revisit."""
    max_visits: int = Field(4, gt=0)
    """Most times one task is drawn in a run."""
    queue_size: int = Field(4096, gt=0)
    """Most tasks held for revisits (the lowest-priority ones are forgotten first)."""


class BalanceConfig(_Node):
    regression_threshold: float = Field(0.05, ge=0)
    """A domain whose held-out pass@1 drops this far below its best gets its weight raised (needs eval.every_steps)."""
    boost: float = Field(2.0, ge=1)
    """Factor on a regressed domain's mixing weight until it recovers to within half the threshold of its best."""


class OrchestrationConfig(_Node):
    max_retries: int = Field(3, ge=0)
    """Retries of a rollout job (a task's group) after an infrastructure error; then it is dropped and counted."""
    backoff_s: float = Field(0.5, ge=0)
    """First retry delay; doubles per attempt."""
    backoff_max_s: float = Field(8.0, ge=0)
    """Longest retry delay."""
    job_deadline_s: float = Field(600.0, gt=0)
    """Wall-clock limit for one job's rollout and grading; past it the job counts as an infrastructure error."""
    env_concurrency: dict[str, int] = {}
    """Most jobs grading at once per verifier name, e.g. {code: 4, repair: 2} (unlisted: verify.concurrency)."""
    bucket_by_cost: bool = True
    """Queue jobs in buckets of similar estimated cost (tokens, turns, sandbox time learned per domain)."""


class RayConfig(_Node):
    address: str | None = None
    """Ray cluster to join ('host:port' of its GCS, 'ray://host:port' for Ray Client, or 'auto'); None: start a
    local cluster in this process with `local_cpus` CPUs. An address that does not answer within
    `connect_timeout_s` is an error."""
    local_cpus: int | None = Field(None, ge=1)
    """CPUs of the local cluster started when `address` is None (None: this machine's CPU count)."""
    rollout_workers: int = Field(1, ge=1)
    """Rollout actors at the start (each builds its own copy of the policy and grades in its own sandbox);
    change it mid-run with `honing workers RUN_DIR --rollout N`."""
    num_cpus: float = Field(1.0, gt=0)
    """CPUs Ray reserves for each rollout actor (fractional allowed); its torch threads: schedule.worker_threads,
    else max(1, int(num_cpus))."""
    call_timeout_s: float = Field(600.0, gt=0)
    """Longest a rollout request (or an actor's start) may take before its actor counts as hung: it is killed,
    replaced, and the request goes to another actor."""
    connect_timeout_s: float = Field(15.0, gt=0)
    """How long to try to reach `address` before giving up with an error."""
    tasks_per_request: int = Field(0, ge=0)
    """Split each batch into requests of this many tasks, spread over the actors (each chunk with its own seed
    derived from the batch's); 0: a batch is one request (the same samples as in process)."""
    env: dict[str, str] = {}
    """Environment variables of the rollout and grading actors (Ray's runtime_env env_vars), e.g. HF_HOME."""
    grading_workers: int = Field(0, ge=0)
    """Grading actors (the run's verifiers and their own sandbox, no policy) that single-turn samples are
    graded on; 0: each rollout actor grades its own. Multi-turn episodes always grade where their box is."""
    grading_num_cpus: float = Field(0.25, gt=0)
    """CPUs Ray reserves for each grading actor (fractional: grading mostly waits on sandboxed processes)."""


class ScheduleConfig(_Node):
    staleness: int = Field(0, ge=0)
    """Most policy versions between generating a batch and training on it (0: synchronous). With staleness s the
    batch for step t is generated by policy t-1-s while the trainer updates; off-policy correction turns on."""
    workers: Literal["auto", "inprocess", "process", "ray"] = "auto"
    """Where rollouts run: 'process' (a separate worker process with its own copy of the policy), 'inprocess',
    'ray' (Ray actors, see schedule.ray) or 'auto' (a process when staleness > 0)."""
    worker_threads: int = Field(0, ge=0)
    """Torch threads of a rollout worker process (0: half of this process's threads, at least 1)."""
    oversample: float = Field(1.0, ge=1)
    """Generate this many times the step's prompts and train on the most informative groups first; the rest wait
    for the next step (within the staleness bound) or are dropped."""
    prefer_variance: bool = True
    """Information-dense first: groups whose rewards differ come before groups with one reward."""
    prefer_corrections: bool = True
    """Information-dense first: multi-turn groups with error-and-correction rounds come before others."""
    curriculum: CurriculumConfig = CurriculumConfig()
    priority: PriorityConfig = PriorityConfig()
    balance: BalanceConfig = BalanceConfig()
    orchestration: OrchestrationConfig = OrchestrationConfig()
    ray: RayConfig = RayConfig()
    """Rollout actors on Ray (schedule.workers=ray; `pip install honing[ray]`)."""


HEALTH_EVENTS = ("heldout_drop", "length_collapse", "entropy_collapse", "non_correctness_gain", "infra_errors",
                 "is_ratio", "memory_pressure")
"""The run-health monitor's events (honing.schedule.health)."""


class HealthConfig(_Node):
    """The run-health monitor: windowed checks of each step's metrics (honing.schedule.health). A window check
    compares the mean over the latest `window` steps with the mean over the run's first `window` steps."""

    enabled: bool = True
    """Watch the run and raise health events (progress line, state.sqlite, report, summary.json)."""
    window: int = Field(8, gt=0)
    """Steps per window: the first `window` RL steps are the baseline; checks start after 2 x `window` steps."""
    heldout_ci: float = Field(0.95, gt=0, lt=1)
    """heldout_drop: level of the paired bootstrap CI of held-out pass@1 (now minus the best evaluation so far)."""
    heldout_reward_rise: float = Field(0.05, ge=0)
    """heldout_drop: the rise in train reward (window mean now vs at the best evaluation) that, with held-out
    pass@1 below the best evaluation's beyond its CI, raises the event (held-out runs every eval.every_steps
    and at the end)."""
    length_collapse: float = Field(0.4, gt=0, lt=1)
    """length_collapse: latest window's mean completion length below this fraction of the first window's."""
    entropy_collapse: float = Field(0.25, gt=0, lt=1)
    """entropy_collapse: latest window's token entropy (train/neg_logprob, the mean -log p of the sampled
    completion tokens) below this fraction of the first window's."""
    layer_gain_share: float = Field(0.5, gt=0, le=1)
    """non_correctness_gain: share of the reward gain (latest window vs first) contributed by one reward layer
    other than a `component: correct` one (format, judge, a penalty going away); needs reward.layers."""
    layer_min_gain: float = Field(0.05, ge=0)
    """non_correctness_gain: the reward gain (latest window vs first) below which the check stays quiet."""
    infra_rise: float = Field(0.1, gt=0, le=1)
    """infra_errors: rise of the infrastructure-error share of rollout samples (attempts and retries included)."""
    is_logratio_rise: float = Field(0.1, gt=0)
    """is_ratio: rise of the mean |log IS ratio| between the trainer's and the engine's log-probs
    (train/logprob_mismatch, logged when old log-probs are recomputed)."""
    is_clip_rise: float = Field(0.1, gt=0, le=1)
    """is_ratio: rise of the share of tokens whose IS ratio is clipped (train/clip_frac: the PPO/GSPO clip;
    train/tis_clip_frac: above train.tis_cap)."""
    memory_fraction: float = Field(0.85, gt=0, le=1)
    """memory_pressure: a step's peak resident memory (rollout or update) above this fraction of the memory the
    process may use (cgroup memory.max or the machine's RAM): the next longer batch may be killed by the kernel."""


class RunOptions(_Node):
    deterministic: bool = False
    """Bitwise-reproducible runs on CPU (deterministic torch kernels, one fixed schedule): 2N steps equal N steps
    + kill + resume + N steps."""
    health: HealthConfig = HealthConfig()
    """Run-health monitor thresholds (events: heldout_drop, length_collapse, entropy_collapse,
    non_correctness_gain, infra_errors, is_ratio, memory_pressure)."""
    halt_on: list[Literal[HEALTH_EVENTS]] = []  # type: ignore[valid-type]
    """Health events that stop the run: after the step that raised one is committed and checkpointed, the run
    exits (130) naming the event; `honing train --resume RUN` continues (an event halts again only after its
    condition cleared and came back). Names: heldout_drop, length_collapse, entropy_collapse,
    non_correctness_gain, infra_errors, is_ratio, memory_pressure."""


class StageConfig(_Node):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """The stage's name; its run directory is <run>/stages/NN-<name>."""
    kind: Literal["rl", "sft"]
    """rl: GRPO for train.steps (sft.steps off); sft: the SFT stage alone (sft.steps; e.g. sft.source=rejection)."""
    set: dict[str, Any] = {}
    """Dotted keys this stage changes, e.g. {train.steps: 10, sft.source: rejection}."""

    @model_validator(mode="after")
    def _check_name(self) -> "StageConfig":
        if self.name == "before":
            raise ValueError("stages: 'before' names the initial evaluation; pick another stage name")
        return self


class RunConfig(_Node):
    name: str | None = None
    """Run name (default: recipe name + timestamp)."""
    plugins: list[str] = []
    """Python modules (`my_pkg.rewards`) or files (`./my_rewards.py`, relative to the recipe) imported at
    start-up, before anything is built: their register_verifier/register_source calls make names usable."""
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = ["tensorboard"]
    """Where step metrics go besides metrics.jsonl (same names; mlflow's with '@' as '_at_'): tensorboard
    (tb/), wandb (offline, in wandb/), mlflow (a file store in mlruns/), unless WANDB_MODE / WANDB_API_KEY /
    MLFLOW_TRACKING_URI say otherwise. wandb and mlflow need `pip install wandb` / `pip install mlflow-skinny`."""
    out_dir: str = "runs"
    """Parent folder of run directories."""
    seed: int = 0
    """Seed for torch / sampling."""
    model: ModelConfig = ModelConfig()
    tasks: TasksConfig = TasksConfig()
    generation: GenerationConfig = GenerationConfig()
    verify: VerifyConfig = VerifyConfig()
    reward: RewardConfig = RewardConfig()
    """Layered reward (layers, penalties, clipping); empty: the verifier's score is the reward."""
    rollout: RolloutConfig = RolloutConfig()
    """Multi-turn episode limits."""
    sandbox: SandboxConfig = SandboxConfig()
    """Sandbox for verifiers that execute code (code, repair)."""
    train: TrainConfig = TrainConfig()
    sft: SFTConfig = SFTConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    """What to sample, when, where it runs (curriculum, priorities, domain balance, retries, asynchronous rollouts)."""
    run: RunOptions = RunOptions()
    """Run-wide switches (deterministic mode, the run-health monitor and the events that halt the run)."""
    stages: list[StageConfig] = []
    """Run these stages in order, each a whole run started from the previous one's final weights (sft -> rl,
    rl -> rejection -> rl; schedule/stages.py). Empty: one run (the SFT stage when sft.steps, then RL)."""


# ---------------------------------------------------------------------------------------------


def _nearest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else f" (valid: {', '.join(sorted(options))})"


def _node_at(path: tuple[Any, ...]) -> type[BaseModel] | None:
    node: Any = RunConfig
    for part in path:
        if isinstance(part, int):
            continue
        field = node.model_fields.get(part) if isinstance(node, type) and issubclass(node, BaseModel) else None
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        candidates = [ann, *args]
        node = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if node is None:
            return None
    return node


def _explain(err: ValidationError, origin: str) -> ConfigError:
    errors = err.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])  # a typo explains the rest
    loc = tuple(first["loc"])
    dotted = ".".join(str(p) for p in loc)
    if first["type"] == "extra_forbidden":
        parent = _node_at(loc[:-1])
        hint = _nearest(str(loc[-1]), list(parent.model_fields)) if parent else ""
        return ConfigError(f"{origin}: unknown key '{dotted}'{hint}")
    value = first.get("input")
    return ConfigError(f"{origin}: bad value for '{dotted}': {first['msg']} (got {value!r})")


def resolve_recipe(ref: str | Path | None) -> Path:
    """A recipe path, or a recipe name looked up in configs/ (default: quickstart)."""
    ref = DEFAULT_RECIPE if ref is None else ref
    path = Path(ref)
    if path.is_file():
        return path
    for folder in (Path.cwd() / "configs", REPO_CONFIGS):
        cand = folder / f"{ref}.yaml"
        if cand.is_file():
            return cand
    raise ConfigError(f"config file not found: {ref}")


def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.learning_rate=2e-5' -> (['train', 'learning_rate'], 2e-05). Values parse as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not KEY=VALUE (e.g. train.learning_rate=2e-5)")
    key, raw = text.split("=", 1)
    if not key:
        raise ConfigError(f"override '{text}' has an empty key")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and _FLOAT.fullmatch(value):  # YAML 1.1 reads '2e-5' as a string
        value = float(value)
    return key.strip().split("."), value


def _set_dotted(tree: dict[str, Any], keys: list[str], value: Any) -> None:
    node = tree
    for i, k in enumerate(keys[:-1]):
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override: '{'.'.join(keys[: i + 1])}' is not a section")
        node = child
    node[keys[-1]] = value


def load_config(ref: str | Path | None = None, overrides: list[str] = ()) -> tuple[RunConfig, Path]:
    """Load a recipe, apply dotted overrides, validate once. Errors name file, key and nearest key."""
    path = resolve_recipe(ref)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} is not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    try:
        RunConfig.model_validate(data)
    except ValidationError as e:
        raise _explain(e, str(path)) from None
    for text in overrides:
        keys, value = parse_override(text)
        _set_dotted(data, keys, value)
        try:
            RunConfig.model_validate(data)
        except ValidationError as e:
            raise _explain(e, f"override '{text}'") from None
    cfg = absolute_refs(RunConfig.model_validate(data), path.resolve().parent)
    from honing.plugins import load_plugins

    load_plugins(cfg.plugins, path.resolve().parent)
    return cfg, path


def absolute_refs(cfg: RunConfig, base: Path) -> RunConfig:
    """File references (`./my_rewards.py`, `./my_tasks.py:make`) made absolute against the recipe's
    folder: the run directory's config.yaml then resolves wherever it is resumed from."""
    from honing.plugins import absolute_ref

    cfg.plugins = [absolute_ref(p, base) for p in cfg.plugins]
    for s in cfg.tasks.sources:
        s.name = absolute_ref(s.name, base)
        if s.verifier:
            s.verifier = absolute_ref(s.verifier, base)
    for layer in cfg.reward.layers:
        if layer.verifier:
            layer.verifier = absolute_ref(layer.verifier, base)
    cfg.train.advantage_estimator = absolute_ref(cfg.train.advantage_estimator, base)
    return cfg


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def help_config(node: type[BaseModel] = RunConfig, prefix: str = "") -> list[str]:
    """Every leaf key with its default and docstring, for `--help-config`."""
    lines: list[str] = []
    for name, field in node.model_fields.items():
        ann = field.annotation
        key = f"{prefix}{name}"
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            lines.extend(help_config(ann, key + "."))
            continue
        default = field.default
        lines.append(f"{key} = {default!r}\n    {field.description or ''}")
    return lines

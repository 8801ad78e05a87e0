"""The typed config tree. Every component owns one section; YAML files are plain data over it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from raytrain_vla.config.families import default_family, default_sections

# Choices as named aliases: draccus's field-comment reader (for --help) skips quoted types.
NormalizationMode = Literal["mean_std", "min_max", "quantile", "quantile10"]
OptimizerType = Literal["adamw", "muon"]
MuonAdjustLR = Literal["match_rms_adamw", "original"]
MuonNSDtype = Literal["bfloat16", "float32"]
SchedulerType = Literal["constant", "cosine"]
Precision = Literal["fp32", "bf16"]
EvalEnv = Literal["demo", "metaworld"]
FrozenParams = Literal["auto", "replicate", "shard"]
ResumeMode = Literal["auto", "never"]
WandbMode = Literal["offline", "online", "disabled"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


@dataclass
class AugmentConfig:
    """Image augmentation, keyed to (seed, epoch, sample id); all zero means off."""

    brightness: float = 0.0  # +- fraction of full scale added
    contrast: float = 0.0  # +- fraction of gain around the image mean
    max_shift_px: int = 0  # random translation, edge pixels repeated


@dataclass
class MixtureEntry:
    """One dataset of `data.mixture`: exactly one of `root` and `repo_id`."""

    root: str = ""  # as data.root: a LeRobot dataset, shards, a URI, or `demo`
    repo_id: str = ""  # as data.repo_id: a dataset in the local LeRobot cache
    weight: float = 1.0  # its share of every global batch (the weights are normalised)
    # The embodiment's name in metrics, samples.jsonl and predict_action(embodiment=...);
    # empty: the directory's (or repo's) name.
    name: str = ""


@dataclass
class DataConfig:
    # LeRobot dataset root (v3.0 or v2.1) or a shards directory. `demo` is the built-in demo
    # dataset under ~/.cache/raytrain_vla, written on first use; any other path must exist.
    root: str = "demo"
    # A dataset in the local LeRobot cache ($HF_LEROBOT_HOME, default
    # ~/.cache/huggingface/lerobot), e.g. lerobot/svla_so100_pickplace; replaces `root`.
    repo_id: str = ""
    # Also write the demo dataset at an explicit `root` that does not exist (benchmarks).
    write_demo_if_missing: bool = False
    demo_episodes: int = 1500  # episodes of the demo dataset (data.root=demo)
    demo_seed: int = 0  # seed of the demo dataset's scenes
    # Future actions per sample (the action chunk). Left unset in a config, it is the model
    # family's default (or the chunk of the LeRobot checkpoint `model.init_from` names).
    chunk_size: int = 8
    # Share of episodes held out for validation (chosen by a seeded hash of the index).
    val_fraction: float = 0.05
    # Held-out episodes by index; a non-empty list wins over the fraction.
    val_episodes: list[int] = field(default_factory=list)
    val_max_samples: int = 512  # validation samples scored at each validation
    # Sample plan (DESIGN.md): spans of this many consecutive frames are shuffled first...
    span_len: int = 16
    # ...then samples are shuffled within windows of this many (larger: closer to i.i.d.).
    shuffle_window: int = 2048
    normalization: NormalizationMode = "mean_std"  # quantile maps q01..q99 to -1..1
    # Per-feature override of the mode, e.g. {action: quantile}.
    normalization_per_feature: dict[str, NormalizationMode] = field(default_factory=dict)
    # Resize camera images to [H, W] for the model; empty keeps the dataset's resolution.
    image_size: list[int] = field(default_factory=list)
    # [low, high]: training and validation targets are actions clipped to this range, and
    # their statistics (normalisation, the mean-action baseline) are those of the clipped
    # actions, computed when the dataset opens. For data that stores what a controller asked
    # for beyond what the robot executes (lerobot/metaworld_mt50: the env clips to [-1, 1]).
    # Empty: actions as stored.
    action_clip: list[float] = field(default_factory=list)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    # Ray Data: at most this many samples per read task. Tasks also end where the plan's
    # shuffle window changes (see read_tasks_follow_windows) and at read_task_max_mb.
    samples_per_read_task: int = 2048
    # Cut read tasks on shuffle-window boundaries (whole windows, packed up to the caps), so
    # each window's spans are decoded together (fewer GOPs decoded twice); applies when a
    # window spans at least one global batch (preflight says when not). The order of samples
    # is the same either way.
    read_tasks_follow_windows: bool = True
    # Cap on the decoded frames one read task holds (all cameras, before any resize), in MiB.
    read_task_max_mb: int = 256
    # Object storage (data.root=s3://...): each node keeps whole video files here, shared by
    # its processes, so read tasks that use the same file download it once.
    cache_dir: str = "~/.cache/raytrain_vla/object_cache"
    # Size of that cache per node, in GiB (least recently used files go first); 0 = no cache,
    # every read is by byte range.
    cache_max_gb: float = 20.0
    # Read tasks per segment: decode parallelism and look-ahead (one segment is decoded ahead
    # while the loop consumes the current one).
    read_tasks_per_segment: int = 4
    # Train on several datasets at once, e.g. [{root: demo, weight: 0.7}, {repo_id: me/arm,
    # weight: 0.3, name: arm}]: each global batch holds them by weight; state and actions are
    # padded to the largest with masks, each keeps its own normalisation (README "Mixtures").
    # Replaces data.root / data.repo_id; every other data key applies to all of them.
    mixture: list[MixtureEntry] = field(default_factory=list)


@dataclass(frozen=True)
class LoRAConfig:
    """`model.lora`: low-rank adapters (peft) on the VLM's text layers; r = 0 is off. Only the
    adapters, the action expert and what else is unfrozen train and are checkpointed; exports
    merge the adapters, so they load without peft."""

    r: int = 0  # adapter rank; 0 turns LoRA off
    alpha: float = 16.0  # scaling numerator (the update is scaled by alpha / r)
    dropout: float = 0.0  # dropout on the adapter input
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")  # module names in a text layer


@dataclass
class ModelConfig:
    """`model`: the family (`type`), its options (`model.<type>`, one section per registered
    family, see config/families.py) and what every family shares."""

    # `sections` holds the families' option sections; they read as `model.<family>`.
    OPEN_SECTIONS: ClassVar[str] = "sections"

    type: str = field(default_factory=default_family)  # the family; its options: model.<type>
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    # Start from a pretrained policy: an exported policy directory, a LeRobot policy directory
    # (`pretrained_model/`, for families that read LeRobot's format) or a .safetensors file.
    init_from: str = ""
    # Regexes of parameter names that may be missing or change shape (they keep a fresh init),
    # e.g. the action input and output layers for a robot with another action dimension.
    init_allow: list[str] = field(default_factory=list)
    # Allow instructions longer than the model's text budget (they are cut to it); without it,
    # a dataset with such an instruction is refused before training starts.
    truncate_text: bool = False
    # Every registered family's options by name (not a key of its own: `model.<family>`).
    sections: dict[str, Any] = field(default_factory=default_sections, repr=False)

    def __getattr__(self, name: str) -> Any:
        """`model.<family>`: that family's options section."""
        sections = self.__dict__.get("sections")
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"'ModelConfig' has no attribute or family section {name!r}")

    @property
    def options(self) -> Any:
        """The selected family's options (`model.<type>`)."""
        return self.sections[self.type]


@dataclass
class LRGroupConfig:
    name: str = ""
    # Parameter roles the model declares (vision, backbone, action_expert, ...) and regexes over
    # parameter names (re.search); a parameter joins the first group whose roles or patterns
    # match it.
    patterns: list[str] = field(default_factory=list)
    lr: float = 1e-3
    weight_decay: float = 0.01
    roles: list[str] = field(default_factory=list)


def _default_lr_groups() -> list[LRGroupConfig]:
    return [
        LRGroupConfig("vision", lr=1e-3, weight_decay=0.01, roles=["vision"]),
        LRGroupConfig("backbone", lr=1e-3, weight_decay=0.01, roles=["backbone"]),
        LRGroupConfig("action_expert", lr=1e-3, weight_decay=0.01, roles=["action_expert"]),
    ]


def _default_muon_exclusions() -> list[str]:
    return ["embed", "lm_head", r"(^|[._])(state|action)_(in|out|proj)"]


@dataclass
class MuonConfig:
    """Muon (torch.optim.Muon's update) for hidden weight matrices: the weight of every
    nn.Linear whose name no `exclude_patterns` regex matches. Embeddings, LM heads, norms,
    biases, convolutions and anything not 2-D use AdamW. On FSDP2 shards each matrix is
    orthogonalised whole on one owner rank."""

    momentum: float = 0.95  # momentum of the gradient buffer
    nesterov: bool = True  # Nesterov momentum (false: plain momentum)
    ns_steps: int = 5  # quintic Newton-Schulz iterations
    # bfloat16: torch.optim.Muon's bits; float32: the same iteration 10-26x faster on CPUs
    # without bf16 matrix units (the Meta-World recipe's choice on 2 CPUs)
    ns_dtype: MuonNSDtype = "bfloat16"
    # match_rms_adamw: the update's RMS that of AdamW, so each group's LR keeps its meaning;
    # original: Keller Jordan's sqrt(max(1, rows / cols)).
    adjust_lr: MuonAdjustLR = "match_rms_adamw"
    lr_scale: float = 1.0  # Muon matrices train at this times their LR group's LR
    # Regexes over parameter names (re.search) whose matrices stay with AdamW: by default
    # embeddings, LM heads and the state/action input and output projections.
    exclude_patterns: list[str] = field(default_factory=_default_muon_exclusions)


@dataclass
class OptimizerConfig:
    # adamw: torch.optim.AdamW for every parameter; muon: Muon for hidden weight matrices
    # (`optimizer.muon`), AdamW for the rest, with the same LR groups.
    type: OptimizerType = "adamw"
    lr: float = 1e-3  # LR for parameters that no group claims
    weight_decay: float = 0.01  # weight decay for parameters that no group claims
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW moment decay rates
    eps: float = 1e-8  # AdamW denominator epsilon
    # LR groups: {name, roles, patterns, lr, weight_decay}; a parameter joins the first match.
    groups: list[LRGroupConfig] = field(default_factory=_default_lr_groups)
    # Parameter roles kept frozen (left out of checkpoints too); `train_action_expert_only`
    # freezes every role but `action_expert`.
    freeze_roles: list[str] = field(default_factory=list)
    train_action_expert_only: bool = False  # freeze every role but action_expert
    muon: MuonConfig = field(default_factory=MuonConfig)  # with type=muon


@dataclass
class SchedulerConfig:
    type: SchedulerType = "cosine"  # LR after warm-up: constant or cosine decay
    warmup_steps: int = 100  # linear warm-up from 0
    min_lr_ratio: float = 0.05  # cosine ends at this fraction of each group's LR


@dataclass
class TrainConfig:
    steps: int = 3000  # optimizer steps in total (a resume continues up to it)
    # Samples per optimizer step over all workers; fixed whatever the world size.
    global_batch_size: int = 64
    # Samples per forward pass per worker; global / (workers x micro) steps are accumulated.
    micro_batch_size: int = 32
    grad_clip: float = 1.0  # max global gradient norm; 0 turns clipping off
    # Stop the run when this many updates in a row are skipped for non-finite gradients.
    max_consecutive_skipped_updates: int = 20
    precision: Precision = "fp32"  # bf16: FSDP2 mixed precision, fp32 reduction
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    # Dense peak TFLOP/s per device for MFU; 0 looks it up from the GPU name (none on CPU).
    peak_tflops: float = 0.0
    cpu_offload: bool = False  # FSDP2 parameters and optimizer state on CPU between uses
    # FSDP2: free gathered parameters after forward (less memory, one more all-gather).
    reshard_after_forward: bool = True
    # HSDP: ranks per shard group (a 2-D mesh, replicated across groups, e.g. the GPUs of one
    # node); 0 shards across every worker. Every world size must be a multiple of it.
    dp_shard: int = 0
    # Frozen parameters (never in the optimizer or a checkpoint): replicate keeps a full copy on
    # every rank in the compute dtype, never all-gathered; shard treats them as FSDP2 does the
    # trained ones; auto replicates them when they take at most a quarter of a rank's memory.
    frozen_params: FrozenParams = "auto"
    # Save checkpoints in the background (DCP async_save): the step loop goes on while the
    # state, staged to host memory, is written; Ray Train registers it once complete.
    async_checkpoint: bool = False
    seed: int = 0  # model init, noise, the sample plan and the validation split
    log_interval: int = 100  # steps between metric lines
    val_interval: int = 1000  # steps between validations
    save_interval: int = 1000  # steps between checkpoints (the last step is always saved)


@dataclass
class RayConfig:
    # Address of an existing cluster; empty starts (or joins) a local one.
    address: str = ""
    # Logical CPUs of the embedded local cluster; 0 picks enough for workers plus Ray Data.
    local_num_cpus: int = 0
    num_workers: int | tuple[int, int] = 2  # training workers; [min, max] is elastic
    use_gpu: bool = False  # one GPU per worker (nccl); CPU workers use gloo
    # Ray resources of one worker, e.g. {CPU: 8, trainer: 1}.
    resources_per_worker: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    storage_path: str = "./runs"  # runs live in storage_path/run_name (shared by every node)
    run_name: str = "demo"  # the same name resumes that run
    # auto: resume the run's latest checkpoint if there is one; never: start a new run under a
    # fresh name (run_name plus a timestamp) and leave any existing run untouched.
    resume: ResumeMode = "auto"
    max_failures: int = 0  # worker-group restarts allowed after a failure (-1: no limit)
    num_to_keep: int = 2  # checkpoints kept (the latest ones)
    # Elastic runs (num_workers: [min, max]) check this often whether more workers would fit.
    elastic_resize_monitor_interval_s: float = 60.0


@dataclass
class LoggingConfig:
    wandb_mode: WandbMode = "offline"  # offline: RUN/wandb
    wandb_project: str = "raytrain_vla"  # the wandb project of runs and sweeps
    console: bool = True  # rank 0 prints a line per log_interval with an ETA
    # Ray Train's own console lines (worker group start, checkpoint created, ...). Its session
    # log files (/tmp/ray/session_latest/logs/train) keep every level whatever this says.
    ray_train_log_level: LogLevel = "WARNING"


@dataclass
class EvalConfig:
    """Closed-loop episodes: the demo task's simulator (on the demo dataset), or Meta-World."""

    # `demo`: the demo task, scored only on the demo dataset. `metaworld`: Meta-World's tasks
    # in Ray actors (needs the metaworld extra), for data written by `data metaworld` or
    # LeRobot's Meta-World datasets.
    env: EvalEnv = "demo"
    # Episodes run with the exported policy when training ends (0: none), next to baselines
    # on the same scenes: random and instruction-blind (demo), random and the scripted expert
    # (metaworld, where this counts episodes per task).
    episodes: int = 0
    # Also run the policy's episodes at every validation (weights gathered on rank 0).
    at_validation: bool = False
    # Policy episodes kept as frames: PNG strips and mp4s in RUN/rollouts/, a wandb table.
    rollouts_logged: int = 4
    seed: int = 1000  # scenes differ from the demo dataset's (seed data.demo_seed)
    n_action_steps: int = 0  # actions executed per predicted chunk; 0: the whole chunk
    # metaworld: the tasks scored (mt10, mt50, easy|medium|hard|very_hard, or task names,
    # comma-separated); empty: the dataset's own tasks.
    tasks: str = ""
    max_steps: int = 500  # metaworld: an episode not done by then fails (LeRobot's limit)
    # metaworld: Ray actors running episodes. They ask for no CPUs: the training workers hold
    # theirs and wait while rank 0 scores.
    workers: int = 2


@dataclass
class DebugConfig:
    log_sample_ids: bool = False  # write RUN/samples.jsonl: the sample ids of every step
    # Fault injection for tests: make the loss NaN on one rank at one step.
    nan_loss_step: int = -1
    nan_loss_rank: int = 0  # the rank whose loss nan_loss_step makes NaN
    # SIGKILL rank `kill_rank` once, right after this step; or crash it inside this step's
    # checkpoint write (after its shards are written, before the report).
    kill_at_step: int = -1
    crash_in_checkpoint_at_step: int = -1  # (see kill_at_step)
    # Raise a data error on rank `kill_rank` after this step, on every attempt (a bad file).
    bad_data_at_step: int = -1
    kill_rank: int = 0  # the rank that the kill, crash and bad-data faults hit
    # Sleep this long after every step, so tests can change the cluster mid-run; no effect on math.
    step_delay_s: float = 0.0


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)

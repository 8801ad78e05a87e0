"""The typed config tree. Every component owns one section; YAML files are plain data over it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

NormalizationMode = Literal["mean_std", "min_max", "quantile", "quantile10"]


@dataclass
class AugmentConfig:
    """Image augmentation, keyed to (seed, epoch, sample id); all zero means off."""

    brightness: float = 0.0  # +- fraction of full scale added
    contrast: float = 0.0  # +- fraction of gain around the image mean
    max_shift_px: int = 0  # random translation, edge pixels repeated


@dataclass
class DataConfig:
    # LeRobot dataset root. The demo dataset is written here when it is missing and `demo` is set.
    root: str = "~/.cache/raytrain_vla/demo_v1"
    write_demo_if_missing: bool = True
    demo_episodes: int = 1500
    demo_seed: int = 0
    # Future actions per sample (the action chunk). Left unset in a config, it is the model
    # family's default (flow_vla 8, smolvla 50 as in LeRobot).
    chunk_size: int = 8
    # Held-out episodes: an explicit list wins over the fraction.
    val_fraction: float = 0.05
    val_episodes: list[int] = field(default_factory=list)
    val_max_samples: int = 512
    # Sample plan (DESIGN.md): spans of consecutive frames, then a windowed sample shuffle.
    span_len: int = 16
    shuffle_window: int = 2048
    normalization: NormalizationMode = "mean_std"  # quantile maps q01..q99 to -1..1
    # Per-feature override of the mode, e.g. {action: quantile}.
    normalization_per_feature: dict[str, NormalizationMode] = field(default_factory=dict)
    # Resize camera images to [H, W] for the model; empty keeps the dataset's resolution.
    image_size: list[int] = field(default_factory=list)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    # Ray Data: samples decoded per read task; read tasks per segment (decode parallelism and
    # look-ahead: one segment is decoded ahead while the loop consumes the current one).
    samples_per_read_task: int = 512
    read_tasks_per_segment: int = 4


@dataclass(frozen=True)
class FlowVLAOptions:
    """`model.flow_vla`: the built-in from-scratch VLA (models/flow_vla)."""

    DEFAULT_CHUNK_SIZE: ClassVar[int] = 8

    size: Literal["tiny", "small", "base"] = "tiny"
    num_inference_steps: int = 10
    max_text_len: int = 48  # instructions are byte-tokenized; longer ones are an error


@dataclass(frozen=True)
class SmolVLAOptions:
    """`model.smolvla`: LeRobot's SmolVLA on a SmolVLM backbone (models/smolvla).

    Start from LeRobot's checkpoint with `model.init_from=<pretrained_model dir>` (its
    architecture, and its VLM directory if `vlm_path` is empty), or from a SmolVLM directory
    (`vlm_path`; its safetensors weights are loaded when present). Options left empty (None)
    take the checkpoint's value, else LeRobot's default; an architecture option that
    contradicts the checkpoint is an error.
    """

    DEFAULT_CHUNK_SIZE: ClassVar[int] = 50

    vlm_path: str = ""  # a SmolVLM directory: config, tokenizer, processor (+ weights)
    # Model camera -> dataset camera, e.g. {observation.images.camera1: observation.image}.
    # Empty: each model camera reads the dataset camera of the same name (a fresh model takes
    # the dataset's cameras).
    cameras: dict[str, str] = field(default_factory=dict)
    # Architecture (LeRobot's SmolVLAConfig names and defaults).
    num_vlm_layers: int | None = None  # 16
    num_expert_layers: int | None = None  # -1: one expert layer per VLM layer
    expert_width_multiplier: float | None = None  # 0.75
    self_attn_every_n_layers: int | None = None  # 2
    attention_mode: Literal["cross_attn", "self_attn"] | None = None  # cross_attn
    max_state_dim: int | None = None  # 32
    max_action_dim: int | None = None  # 32
    # Behaviour.
    resize_imgs_with_padding: tuple[int, int] | None = None  # (512, 512), as (W, H)
    tokenizer_max_length: int | None = None  # 48
    pad_language_to: Literal["longest", "max_length"] | None = None  # longest
    num_steps: int | None = None  # 10 Euler steps
    empty_cameras: int | None = None  # 0
    freeze_vision_encoder: bool | None = None  # true
    train_expert_only: bool | None = None  # true
    train_state_proj: bool | None = None  # true


@dataclass(frozen=True)
class LoRAConfig:
    """`model.lora`: low-rank adapters (peft) on the VLM's text layers; r = 0 is off. Only the
    adapters, the action expert and what else is unfrozen train and are checkpointed; exports
    merge the adapters, so they load without peft."""

    r: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")  # module names in a text layer


@dataclass
class ModelConfig:
    # The model family (models/registry.py); its options are the section of the same name.
    type: Literal["flow_vla", "smolvla"] = "flow_vla"
    flow_vla: FlowVLAOptions = field(default_factory=FlowVLAOptions)
    smolvla: SmolVLAOptions = field(default_factory=SmolVLAOptions)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    # Start from a pretrained policy: an exported policy directory, a LeRobot policy directory
    # (`pretrained_model/`, for smolvla) or a .safetensors file.
    init_from: str = ""
    # Regexes of parameter names that may be missing or change shape (they keep a fresh init),
    # e.g. the action input and output layers for a robot with another action dimension.
    init_allow: list[str] = field(default_factory=list)


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


@dataclass
class OptimizerConfig:
    type: Literal["adamw"] = "adamw"
    # LR and weight decay for parameters that no group claims.
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    groups: list[LRGroupConfig] = field(default_factory=_default_lr_groups)
    # Parameter roles kept frozen (left out of checkpoints too); `train_action_expert_only`
    # freezes every role but `action_expert`.
    freeze_roles: list[str] = field(default_factory=list)
    train_action_expert_only: bool = False


@dataclass
class SchedulerConfig:
    type: Literal["constant", "cosine"] = "cosine"
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05


@dataclass
class TrainConfig:
    steps: int = 3000
    global_batch_size: int = 64
    micro_batch_size: int = 32
    grad_clip: float = 1.0
    # Stop the run when this many updates in a row are skipped for non-finite gradients.
    max_consecutive_skipped_updates: int = 20
    precision: Literal["fp32", "bf16"] = "fp32"
    activation_checkpointing: bool = False
    # Dense peak TFLOP/s per device for MFU; 0 looks it up from the GPU name (none on CPU).
    peak_tflops: float = 0.0
    cpu_offload: bool = False
    reshard_after_forward: bool = True
    seed: int = 0
    log_interval: int = 100
    val_interval: int = 1000
    save_interval: int = 1000


@dataclass
class RayConfig:
    # Address of an existing cluster; empty starts (or joins) a local one.
    address: str = ""
    # Logical CPUs of the embedded local cluster; 0 picks enough for workers plus Ray Data.
    local_num_cpus: int = 0
    num_workers: int | tuple[int, int] = 2
    use_gpu: bool = False
    resources_per_worker: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    storage_path: str = "./runs"
    run_name: str = "demo"
    # auto: resume the run's latest checkpoint if there is one; never: start a new run under a
    # fresh name (run_name plus a timestamp) and leave any existing run untouched.
    resume: Literal["auto", "never"] = "auto"
    max_failures: int = 0
    num_to_keep: int = 2
    # Elastic runs (num_workers: [min, max]) check this often whether more workers would fit.
    elastic_resize_monitor_interval_s: float = 60.0


@dataclass
class LoggingConfig:
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    wandb_project: str = "raytrain_vla"
    console: bool = True
    # Ray Train's own console lines (worker group start, checkpoint created, ...). Its session
    # log files (/tmp/ray/session_latest/logs/train) keep every level whatever this says.
    ray_train_log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"


@dataclass
class EvalConfig:
    """Closed-loop episodes in the demo task's simulator; ignored for other datasets."""

    # Episodes run with the exported policy when training ends (0: none), next to a random and
    # an instruction-blind baseline on the same scenes.
    episodes: int = 0
    # Also run the policy's episodes at every validation (weights gathered on rank 0).
    at_validation: bool = False
    # Policy episodes kept as frames: PNG strips and mp4s in RUN/rollouts/, a wandb table.
    rollouts_logged: int = 4
    seed: int = 1000  # scenes differ from the demo dataset's (seed data.demo_seed)
    n_action_steps: int = 0  # actions executed per predicted chunk; 0: the whole chunk


@dataclass
class DebugConfig:
    log_sample_ids: bool = False
    # Fault injection for tests: make the loss NaN on one rank at one step.
    nan_loss_step: int = -1
    nan_loss_rank: int = 0
    # SIGKILL rank `kill_rank` once, right after this step; or crash it inside this step's
    # checkpoint write (after its shards are written, before the report).
    kill_at_step: int = -1
    crash_in_checkpoint_at_step: int = -1
    # Raise a data error on rank `kill_rank` after this step, on every attempt (a bad file).
    bad_data_at_step: int = -1
    kill_rank: int = 0
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

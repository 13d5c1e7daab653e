"""The sections of a run config (`draft:`, `train:`, `vllm:`, `regenerate:`, `evaluate:`, `hidden_states:`,
`parity:`, `plan:`): one pydantic model each, strict (an unknown key is bad input). RunConfig (config.py) holds
them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


# The kinds of draft `speculators train --speculator-type` names (0.9.0). Whether the installed speculators
# trains one and the host's vLLM serves it is read from their code by the doctor (doctor/_kinds.py), not here.
DRAFT_METHODS = ("eagle3", "dflash", "dflash2", "dspark", "xpress", "peagle", "mtp")
# Kinds drafting a block of tokens in one pass (speculators' `dflash` group: --block-size)
BLOCK_METHODS = ("dflash", "dflash2", "dspark", "xpress")
# speculators' default draft depth when --num-layers is unset (train/config/schema.py _resolve_derived_defaults)
DEFAULT_LAYERS = {"dflash": 5, "dflash2": 5, "dspark": 5, "xpress": 5}


class DraftSettings(_Strict):
    # the kind of speculator speculators trains (--speculator-type); eagle3 keeps every eagle3 run as it was
    method: Literal["eagle3", "dflash", "dflash2", "dspark", "xpress", "peagle", "mtp"] = "eagle3"
    vocab_size: int = Field(32000, gt=0)
    # decoder layers of the draft; null: 1 for eagle3 and peagle, speculators' 5 for the block kinds;
    # mtp reuses the target's own MTP layers and takes none
    num_layers: int | None = Field(None, gt=0)
    ttt_steps: int = Field(3, gt=0)
    # block kinds only: tokens drafted per block (speculators' --block-size; null: its default, 16 for dflash and
    # xpress, 8 for dflash2 and dspark); vLLM drafts block_size - 1 tokens a step with it
    block_size: int | None = Field(None, gt=1)
    # peagle only: parallel prediction depths (speculators' --num-depths; null: its default, 8)
    num_depths: int | None = Field(None, gt=0)
    # mtp only: prediction steps (speculators' --num-speculative-steps; null: its default, 3)
    num_speculative_steps: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _settings_of_the_kind(self) -> DraftSettings:
        own = {"block_size": BLOCK_METHODS, "num_depths": ("peagle",), "num_speculative_steps": ("mtp",)}
        for key, kinds in own.items():
            if getattr(self, key) is not None and self.method not in kinds:
                raise ValueError(f"{key} is a setting of {', '.join(kinds)} drafts, not of method {self.method}")
        if self.method == "mtp" and self.num_layers is not None:
            raise ValueError("num_layers: an mtp draft reuses the target's own MTP layers (speculators refuses "
                             "--num-layers with it); leave it out")
        return self

    @property
    def layers(self) -> int:
        """The draft's decoder layers as speculators will build it (mtp: one MTP layer counted)."""
        return self.num_layers if self.num_layers is not None else DEFAULT_LAYERS.get(self.method, 1)


class StopIf(_Strict):
    """End a draft that learns nothing: after epoch `epoch` (speculators' number, 0 = the first), a mean
    acceptance length below `acceptance_length_below` on the per-epoch held-out prompts stops the trainer."""
    epoch: int = Field(ge=0)
    acceptance_length_below: float = Field(gt=1)  # 1.0 is nothing accepted: a bound at or below it never fires


class TrainSettings(_Strict):
    epochs: int = Field(10, gt=0)
    lr: float = Field(1e-4, gt=0)
    loss_implementation: Literal["auto", "eager", "fused"] = "auto"
    draft_attn_impl: str | None = None
    # Tokens packed into one training batch (speculators' --total-seq-len; its default is 8192).
    total_seq_len: int | None = Field(None, gt=0)
    # Unset: speculators' own defaults (0.9.0: Muon, a log line and a GPU sync every step, 12 workers).
    optimizer: Literal["adamw", "muon"] | None = None
    log_freq: int | None = Field(None, gt=0)  # log (and time) every N steps
    loader_workers: int | None = Field(None, ge=0)  # dataloader worker processes (--num-workers)
    extra_args: list[str] = Field(default_factory=list)
    stop_if: StopIf | None = None

    @field_validator("stop_if")
    @classmethod
    def _stop_within_epochs(cls, value: StopIf | None, info: Any) -> StopIf | None:
        epochs = info.data.get("epochs")
        if value is not None and epochs is not None and value.epoch >= epochs:
            raise ValueError(f"epoch {value.epoch} is not below train.epochs ({epochs}): the check would never "
                             "run (epochs count from 0)")
        return value


class VllmSettings(_Strict):
    serve_args: list[str] = Field(default_factory=list)
    port: int = Field(8000, gt=0, lt=65536)
    # the run's server outlives its pipeline only when asked (a next run on the same target reuses it);
    # else it is stopped with the run's last step: it holds the GPUs' memory and the port. true: until
    # stopped by hand; an idle timeout (seconds, or "30m", "2h", "90s"): it stops itself once unused that long
    keep_server: bool | int = False
    # vLLM's own parallelism (--tensor-parallel-size / --data-parallel-size); left out, they are derived
    # from the host's GPUs and the model's size (specops.planning.default_sizes)
    tensor_parallel: int | None = Field(None, gt=0)
    data_parallel: int | None = Field(None, gt=0)

    @field_validator("keep_server", mode="before")
    @classmethod
    def _keep_for(cls, value: Any) -> bool | int:
        return keep_seconds(value)


_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def keep_seconds(value: Any) -> bool | int:
    """vllm.keep_server as the run means it: False, True (until stopped by hand) or an idle timeout in seconds."""
    import re

    if isinstance(value, bool):
        return value
    seconds: float | None = None
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (found := re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", value.lower())):
        seconds = float(found.group(1)) * _UNITS[found.group(2)]
    if seconds is None:
        raise ValueError(f"{value!r} is not true, false or an idle timeout (seconds, or e.g. 90s, 30m, 2h)")
    if seconds < 1:
        raise ValueError(f"an idle timeout of {value!r} is under a second (false: stopped with the run's last step)")
    return round(seconds)


class RegenerateSettings(_Strict):
    """The target answers the conversations' prompts itself (step `regenerate`, before prepare)."""
    enabled: bool = False
    backend: Literal["vllm", "hf"] | None = None  # None: the run's backend
    # tokens per generated answer; max_seq_len: an answer may run until its row (prompt + answer) fills the run's
    # max_seq_len (the field's whole answers: more loss tokens a row), and the conversation then goes on to its next
    # turn while its rows fit (hf backend: with speculators' client a conversation whose next prompt outgrows the
    # server's max-model-len fails whole: vLLM 0.32 caps an answer at it, then refuses that prompt)
    max_tokens: Annotated[int, Field(gt=0)] | Literal["max_seq_len"] = 128
    # a prompt (the conversation so far, the target's own earlier answers in it) too long for max_seq_len: drop
    # (the default: a first turn that long fails its conversation, a later one ends it) or shorten (whole turns, a
    # question with its answer, dropped from the front, system turns kept, until it leaves room for an answer; every
    # turn of the conversation is then asked); hf backend
    long_prompts: Literal["drop", "shorten"] = "drop"
    temperature: float = Field(0.0, ge=0)  # 0: greedy
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int = 0  # sampling seed (temperature > 0)
    concurrency: int = Field(32, gt=0)  # vllm: requests in flight; hf: conversations per batch
    # vllm: the server the answers come from. extraction: the run's extraction server (one load for regenerate and
    # extract; vLLM's hidden-states connector writes every request's prompt states, so it answers slower: 68 a second
    # on an H100 with the GPU 2-6 % busy); own: a plain server of the target alone, which also measures evaluation's
    # baseline (the target alone) before it stops, so evaluate needs no load for it; null: own on a GPU host whose
    # evaluation loads the target alone anyway (vllm, baseline_server), else the extraction server (never a load more)
    server: Literal["extraction", "own"] | None = None

    @property
    def whole_answers(self) -> bool:
        """Answers run to the run's max_seq_len (max_tokens: max_seq_len) rather than a fixed count."""
        return self.max_tokens == "max_seq_len"

    def answer_tokens(self, max_seq_len: int) -> int:
        """The most tokens one answer may take: max_tokens, or with whole answers the run's max_seq_len."""
        return max_seq_len if isinstance(self.max_tokens, str) else self.max_tokens

    def beyond_defaults(self) -> list[str]:
        """The settings only the hf backend answers with (speculators' client asks one fixed max_tokens and never
        shortens a prompt), as `key: value`."""
        return ([f"max_tokens: {self.max_tokens}"] if self.whole_answers else []) + (
            [f"long_prompts: {self.long_prompts}"] if self.long_prompts != "drop" else [])


class EvaluateSettings(_Strict):
    """Acceptance of the draft served as the target's EAGLE-3 speculator (step `evaluate`, after train)."""
    enabled: bool = False
    heldout_prompts: int = Field(0, ge=0)  # set aside by prepare, never trained on; evaluation's prompts
    backend: Literal["vllm", "hf"] | None = None  # None: the run's backend
    num_speculative_tokens: int = Field(3, gt=0)
    max_tokens: int = Field(64, gt=0)
    checkpoint: str = "best"  # best (by the acceptance recorded every epoch) | last | an epoch number
    # After every epoch, the acceptance on the first N held-out prompts (the replay); 0 turns it off
    epoch_prompts: int = Field(8, ge=0)
    # vllm: the untrained draft's floor by the replay (no server load of its own) or by a server of its own
    untrained: Literal["replay", "server"] = "replay"
    # vllm: the speedup's baseline (the target alone). true: on a server of its own (a load), the honest figure;
    # false: as measured on the extraction server during extract (no load, but its captures slow the target:
    # 0.78 of a plain server's rate on the tiny CPU run, 0.14 on an H100 with the real target, where the speedup
    # would read ~7x high), and with no such rate the report says the speedup was not measured;
    # null: a server of its own on a GPU host, the extraction server's rate on a CPU host
    baseline_server: bool | None = None
    # benchmark sets evaluated beside the held-out prompts, NAME: FILE (JSONL or .jsonl.gz, relative to the
    # workdir, or pkg:MODULE/PATH inside an installed package): MT-Bench `turns`, GSM8K `question`, HumanEval
    # `prompt`, or conversations (`messages`)
    sets: dict[str, str] = Field(default_factory=dict)
    # the first N conversations of each set (MT-Bench's 80 two-turn questions and HumanEval's 164 prompts take
    # a CPU server many minutes a draft); None: every one. The command's --prompts, when given, wins
    set_prompts: int | None = Field(None, gt=0)
    # published figures shown beside ours, labelled as theirs: LABEL: {SET: mean acceptance length}
    compare: dict[str, dict[str, float]] = Field(default_factory=dict)


class HiddenStatesSettings(_Strict):
    """Where the trainer's hidden states come from: offline (all extracted to disk first), online (the
    run's vLLM server makes them as the trainer asks) or hybrid (up to the disk budget on disk, the rest
    online). `invoke plan` shows what each costs; a mode that does not fit is refused before launch.

    offline  extract writes every row's file, then training reads them (`--on-missing raise`);
    online   the run's vllm-server job stays up through training and speculators asks it for every
             row (`--on-missing generate`); generated states are discarded once loaded; no extract;
    hybrid   extract writes the first rows that fit `disk_budget_gb`, the trainer generates the rest.
    """
    mode: Literal["offline", "online", "hybrid"] = "offline"
    # how the states travel, one of speculators' own hs_connectors backends (HiddenStatesBackend.registry):
    # file   bf16/fp32 safetensors files (vLLM's ExampleHiddenStatesConnector);
    # fp8    the same files quantised to float8_e4m3fn with one fp32 scale per token (FP8HiddenStatesConnector,
    #        read back dequantised by FP8Transfer): about half the disk of bf16;
    # mooncake  a Mooncake store between server and trainer (MooncakeHiddenStatesConnector): no files, online only
    backend: Literal["file", "fp8", "mooncake"] = "file"
    # decimal GB of hidden-state files on disk at any time: the run's files and the server's staged
    # ones; watched while training, not only planned before
    disk_budget_gb: float | None = Field(None, gt=0)
    # GPUs of one host: split (server on some, trainer on the rest) or shared (the server's memory
    # share lowered); null: the plan chooses
    placement: Literal["split", "shared"] | None = None
    server_gpus: int | None = Field(None, gt=0)  # split: the server's GPUs (default: the plan's)
    server_memory_share: float | None = Field(None, gt=0, lt=1)  # shared: vLLM --gpu-memory-utilization
    # speculators' bounds on one generation request (--request-timeout, --max-retries) and its circuit
    # breaker (--max-consecutive-generation-failures); our own watch of the server job comes first
    request_timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(1, ge=0)
    max_consecutive_failures: int = Field(3, gt=0)
    # vllm: extraction requests in flight (speculators' --concurrency). The server batches what is in flight
    # as it arrives, and a prompt's states can differ in their last bits with the batch it was in; 1: each
    # prompt alone, its file's bytes a function of the prompt only (slower on a GPU)
    concurrency: int = Field(8, gt=0)
    # a folder every host of the run sees at this same absolute path (a shared mount): with `hosts: {serve,
    # train}` the serve hosts' servers write the states there and the train host's trainer reads them
    shared_dir: str | None = None

    @property
    def extracts(self) -> bool:
        """The step table's enable rule of extract and validate: every mode writes files but online."""
        return self.mode != "online"

    @model_validator(mode="after")
    def _budget_for_hybrid(self) -> HiddenStatesSettings:
        if self.mode == "hybrid" and self.disk_budget_gb is None:
            raise ValueError("mode hybrid needs disk_budget_gb (extraction writes up to it)")
        if self.server_gpus is not None and self.placement == "shared":
            raise ValueError("server_gpus is for placement split, not shared")
        if self.backend == "mooncake" and self.mode != "online":
            raise ValueError(f"backend mooncake keeps no files, so mode {self.mode} (which extracts to disk) "
                             "cannot use it: mode online, or backend file or fp8")
        if self.shared_dir is not None and not self.shared_dir.startswith("/"):
            raise ValueError(f"shared_dir: must be an absolute path (every host sees it there), "
                             f"got {self.shared_dir!r}")
        return self


class HostRoles(_Strict):
    """A run's hosts by role: servers on some (each runs the run's vLLM server, the producer of hidden
    states), the trainer on another (speculators' trainer, the consumer, asks them). Separate hosts: a host
    that both serves and trains is the one-host online mode."""
    serve: list[str] = Field(min_length=1)
    train: list[str] = Field(min_length=1, max_length=1)  # speculators 0.9 trains online on one host

    @model_validator(mode="after")
    def _separate(self) -> HostRoles:
        both = sorted(set(self.serve) & set(self.train))
        if both:
            raise ValueError(f"{both[0]} is both a serve and a train host; one host that does both is the "
                             "one-host online mode (hosts: [NAME])")
        if len(set(self.serve)) != len(self.serve):
            raise ValueError("serve: a host is named twice")
        return self


class ParitySettings(_Strict):
    """The parity gate (pipeline/parity) before training: its config checks always run; the served
    request (one completion through a vLLM server with the untrained draft) costs a server load."""
    serve: bool | None = None  # None: where it is cheap (a GPU host or a vllm run, with a serve env)


class PlanSettings(_Strict):
    """What the plan reads on the host, given instead (a host not at hand), and rates measured elsewhere
    (left out: this run's earlier jobs on the host, else unknown)."""
    gpus: int | None = Field(None, ge=0)
    gpu_memory_gib: float | None = Field(None, gt=0)
    disk_free_gb: float | None = Field(None, ge=0)
    extract_tokens_per_s: float | None = Field(None, gt=0)  # hidden states written per second
    train_tokens_per_s: float | None = Field(None, gt=0)
    serve_tokens_per_s: float | None = Field(None, gt=0)  # hidden states the server hands the trainer online
    load_seconds: float | None = Field(None, gt=0)  # one vLLM load of the target (Kimi-K2.5 on 8 H200: ~1080)
    load_gb_per_s: float | None = Field(None, gt=0)  # or the host's read rate of its weights

"""The run's effective settings on this host: the run config, the command line and the host's facts
resolved ONCE per invocation; the doctor (through pipeline.preflight), the parity gate and every step read
that one resolution, so one run never has two answers to "which backend".

    backend             --backend, else the run's `backend:`, else hf on a host without GPUs, vllm otherwise
    regenerate_backend  the regenerate command's --backend, else `regenerate.backend`, else `backend`
    evaluate_backend    the evaluate command's --backend, else `evaluate.backend`, else `backend`; where it is
                        vllm only by default and this host's vLLM cannot serve the draft beside the target
                        (the attention backends' KV cache blocks, read from its files by the doctor), the hf
                        replay stands in, said in one line
    dtype               what the target computes in here (bf16 on GPUs, fp32 on CPUs, unless `dtype:`)
    serve_dtype         what vLLM serves the target in: `dtype`, except on a CPU host whose vLLM gives the target
                        an attention backend that does not take it while the run says `dtype: auto` (AMX_MLA:
                        bfloat16 only), said in one line (pipeline.vllm.serve_dtype applies the same rule)
    serve_python        the serve env's interpreter (SPECOPS_SERVE_PYTHON, from the inventory's envs.serve)
    vllm_path           where the vLLM that serves is read: the serve env, else this env (None: no vLLM)
    serves_draft        "asked" (the run asks vLLM to serve the draft: evaluate.backend: vllm, parity.serve:
                        true, evaluate --backend vllm), "default" (only by the run's backend), None
    parity_serve        the gate's served request runs: `parity.serve`, else where it is cheap (a vLLM to
                        read and a GPU host, or vLLM serving the run) and the draft can be served here
    baseline_server     the speedup's baseline (the target alone) on a server of its own: `evaluate.baseline_server`,
                        else on a GPU host (there the extraction server's captures slow the target ~7x: an H100
                        read the real SmolLM2 at 94 tokens/s on it, 680 on a plain server), not on a CPU host
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput

if TYPE_CHECKING:
    from specops.doctor import AttentionReading
    from specops.pipeline.run.config import Run

BACKENDS = ("hf", "vllm")


@dataclass(frozen=True)
class EffectiveSettings:
    backend: str
    regenerate_backend: str
    evaluate_backend: str
    dtype: str
    gpus: int
    serve_python: str | None = None
    vllm_path: list[str] | None = None
    vllm_version: str | None = None
    serves_draft: str | None = None
    parity_serve: bool = False
    attention: AttentionReading | None = None
    origins: dict[str, str] = field(default_factory=dict)  # setting -> where its value came from
    notes: tuple[str, ...] = ()  # what the resolution changed, one line each (a fallback)
    serve_dtype: str | None = None  # None: no vLLM serves this run here
    baseline_server: bool = False

    @property
    def draft_unservable(self) -> str | None:
        """Why this host's vLLM cannot serve the draft beside the target; None when it can or cannot be told."""
        if self.attention is None or self.attention.servable is not False:
            return None
        return f"vLLM {self.vllm_version} cannot serve the EAGLE-3 draft beside this target here: {self.attention.why}"

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "regenerate_backend": self.regenerate_backend,
                "evaluate_backend": self.evaluate_backend, "dtype": self.dtype, "serve_dtype": self.serve_dtype,
                "gpus": self.gpus,
                "serve_python": self.serve_python, "vllm": self.vllm_version, "serves_draft": self.serves_draft,
                "parity_serve": self.parity_serve, "baseline_server": self.baseline_server,
                "origins": dict(self.origins), "notes": list(self.notes),
                "attention": self.attention.to_dict() if self.attention is not None else None}

    @classmethod
    def fixed(cls, backend: str, gpus: int = 0) -> EffectiveSettings:
        """Settings that are only a backend (a host that reads nothing else: tests of the engine's order)."""
        return cls(backend, backend, backend, "float32" if gpus == 0 else "bfloat16", gpus)


def baseline_server(run: Run, gpus: int) -> tuple[bool, str]:
    """Whether evaluate measures the target alone on a server of its own, and why (the settings' origin)."""
    if run.config.evaluate.baseline_server is not None:
        return run.config.evaluate.baseline_server, f"{run.label}: evaluate.baseline_server"
    if gpus > 0:
        return True, ("a GPU host: the extraction server's captures slow the target there (0.14 of a plain "
                      "server's rate on an H100), so the speedup is measured against a server of its own")
    return False, "a CPU host: the extraction server's rate (0.78 of a plain server's on the tiny run), no load"


def regenerate_server(run: Run, gpus: int) -> tuple[str, str]:
    """Which server regenerate's vllm backend asks (`own` or `extraction`), and why (the settings' origin)."""
    if run.config.regenerate.server is not None:
        return run.config.regenerate.server, f"{run.label}: regenerate.server"
    if gpus > 0 and run.config.evaluate.enabled and (run.config.evaluate.backend or run.config.backend) == "vllm" \
            and run.config.evaluate.heldout_prompts and baseline_server(run, gpus)[0]:
        return "own", ("a GPU host whose evaluation loads the target alone anyway: a plain server answers (the "
                       "extraction server writes every request's prompt states: 68 answers a second on an H100, the "
                       "GPU 2-6 % busy) and measures evaluation's baseline in that load's place")
    return "extraction", ("a CPU host: one load for regenerate and extract" if gpus == 0 else
                          "a GPU host whose evaluation needs no target-alone server: a plain one would be a load more")


def _checked(value: str, flag: str) -> str:
    if value not in BACKENDS:
        raise BadInput(f"{flag}: {value!r} is not one of {', '.join(BACKENDS)}")
    return value


def resolve(run: Run, *, backend: str | None = None, regenerate: str | None = None, evaluate: str | None = None,
            gpus: int | None = None, serve_python: str | None = None) -> EffectiveSettings:
    """The one resolution of this invocation. `backend`: the run's backend from the command line (pipeline,
    extract, prepare); `regenerate`/`evaluate`: that step command's own --backend."""
    from specops.doctor import chosen_serve_python, is_cpu_build, vllm_path, vllm_version
    from specops.pipeline.run.config import default_backend
    from specops.planning import hidden_state_dtype

    if gpus is None:
        from specops.host.gpus import device_count

        gpus = device_count()
    config, origins, notes = run.config, {}, []
    if backend is not None:
        chosen, origins["backend"] = _checked(backend, "--backend"), "--backend"
    else:
        chosen, origins["backend"] = default_backend(run, gpus)
    if regenerate is not None:
        regenerate_backend, origins["regenerate_backend"] = _checked(regenerate, "--backend"), "--backend"
    elif config.regenerate.backend is not None:
        regenerate_backend = config.regenerate.backend
        origins["regenerate_backend"] = f"{run.label}: regenerate.backend"
    else:
        regenerate_backend, origins["regenerate_backend"] = chosen, "the run's backend"
    if chosen == "vllm":
        refuse_short_server(run)
    beyond = config.regenerate.beyond_defaults() if config.regenerate.enabled else []
    if beyond and regenerate_backend == "vllm":  # one line before any step or server
        raise BadInput(f"{run.label}: regenerate.{beyond[0]}: answered by the hf backend only (regenerate.backend: "
                       "hf); speculators' client never shortens a prompt, and a conversation whose next prompt "
                       "outgrows the server's max-model-len fails whole (vLLM caps an answer at it, then refuses that "
                       "prompt)")
    if evaluate is not None:
        evaluate_backend, origins["evaluate_backend"] = _checked(evaluate, "--backend"), "--backend"
    elif config.evaluate.backend is not None:
        evaluate_backend, origins["evaluate_backend"] = config.evaluate.backend, f"{run.label}: evaluate.backend"
    else:
        evaluate_backend, origins["evaluate_backend"] = chosen, "the run's backend"
    asked_to_serve = (evaluate_backend == "vllm" and origins["evaluate_backend"] != "the run's backend"
                      and (evaluate is not None or config.evaluate.enabled)) or config.parity.serve is True
    serve_python = chosen_serve_python(serve_python)
    path = vllm_path(serve_python)
    version = vllm_version(path) if path else None
    refuse_unservable_kind(run, path, cpu_host=gpus == 0 or (path is not None and is_cpu_build(path)))
    if path is not None and "vllm" in (chosen, regenerate_backend, evaluate_backend):
        refuse_mismatched_build(run, path)
    kind = config.draft.method
    # the hf replay drafts as EAGLE-3 only (evaluation.kinds.REPLAYED): any other kind under it would train for
    # minutes and then read "vLLM only"; said here, before training, or scored by the host's serve env instead
    if config.evaluate.enabled and evaluate_backend == "hf" and kind != "eagle3":
        if path is not None and origins["evaluate_backend"] == "the run's backend":
            evaluate_backend = "vllm"
            origins["evaluate_backend"] = f"the serve env: the hf replay cannot draft as a {kind} draft does"
            asked_to_serve = True
            notes.append(f"evaluate: the {kind} draft is scored through the serve env's vLLM {version} (the hf replay "
                         "drafts as EAGLE-3 only)")
        else:
            notes.append(f"evaluate: the {kind} draft this run trains gets no acceptance figure here: the hf replay "
                         "drafts as EAGLE-3 only and no serve env with vLLM is named (inventory envs.serve), or "
                         f"evaluate.backend is hf in {run.label}")
    if config.parity.serve is not None:
        parity_serve, origins["parity_serve"] = config.parity.serve, f"{run.label}: parity.serve"
    else:
        parity_serve = path is not None and (gpus > 0 or chosen == "vllm" or evaluate_backend == "vllm")
        origins["parity_serve"] = "where cheap: " + ("a vLLM to read and a GPU host or a vllm run" if parity_serve else
                                                     "no vLLM here, or neither a GPU host nor a vllm run")
    serves_draft = "asked" if asked_to_serve else "default" if (
        evaluate_backend == "vllm" and config.evaluate.enabled) else None
    served = "vllm" in (chosen, regenerate_backend, evaluate_backend) or parity_serve
    attention = _attention(run, path, gpus) if path is not None and served else None
    dtype = hidden_state_dtype(config.dtype, gpus > 0)
    serve_dtype = None
    if path is not None and served:
        serve_dtype = attention.serve_dtype(dtype) if attention is not None and config.dtype == "auto" else dtype
        if serve_dtype != dtype and attention is not None and attention.target is not None:
            notes.append(f"dtype: vLLM {version} serves this target with {attention.target.name} here, which takes "
                         f"only {', '.join(attention.target.dtypes or [])}: the server computes in {serve_dtype} "
                         f"(dtype: auto in {run.label}; the hf backend stays in {dtype})")
    if attention is not None and attention.servable is False and not asked_to_serve:
        why = f"vLLM {version} cannot serve the EAGLE-3 draft beside this target here: {attention.why}"
        if evaluate_backend == "vllm":
            evaluate_backend, origins["evaluate_backend"] = "hf", "fallback: this host's vLLM cannot serve the draft"
            notes.append(f"evaluate: {why}; the draft is evaluated by the hf replay instead "
                         f"(set evaluate.backend: hf in {run.label} to say so)")
        if parity_serve:
            parity_serve, origins["parity_serve"] = False, "skipped: this host's vLLM cannot serve the draft"
            notes.append(f"parity: the served request is skipped: {why}")
    refuse_unloadable_target(run, path if served else None, gpus, (chosen, regenerate_backend, evaluate_backend))
    own_baseline, origins["baseline_server"] = baseline_server(run, gpus)
    return EffectiveSettings(chosen, regenerate_backend, evaluate_backend, dtype, gpus, serve_python, path, version,
                             serves_draft, parity_serve, attention, origins, tuple(notes), serve_dtype,
                             own_baseline)


def refuse_unloadable_target(run: Run, vllm_search_path: list[str] | None, gpus: int,
                             backends: tuple[str, ...]) -> None:
    """A target published quantized (its config's quantization_config) that an env which loads it cannot load is
    bad input before any step, so before the first load: this env's transformers where a step loads it with the hf
    backend, the serve env's vLLM where one serves it, and speculators' needs of the verifier (embeddings and
    lm_head unquantized). Judged by the doctor from the installed files (doctor/_quantization.py); one line,
    naming what mends it. An unquantized target reads only its config.json here."""
    import sys

    from specops.doctor import RunSettings, quantization_refusal, read_quantization, target_quantization
    from specops.pipeline.run.config import read_model_config

    if not (run.model_path / "config.json").is_file():
        return
    if read_quantization(read_model_config(run.model_path), "") is None:
        return
    settings = RunSettings(model_path=str(run.model_path), backend="vllm" if vllm_search_path else "hf", gpus=gpus,
                           dtype=run.config.dtype)
    line = quantization_refusal(target_quantization(settings, sys.path, vllm_search_path, loads_hf="hf" in backends))
    if line:
        raise BadInput(f"{run.label}: model: {line}")


def served_max_model_len(serve_args: list[str]) -> int | None:
    """vllm.serve_args' --max-model-len as a number of tokens (None: not given, or a form not read here)."""
    for index, arg in enumerate(serve_args):
        name, sep, value = arg.partition("=")
        if name in ("--max-model-len", "--max_model_len"):
            value = value if sep else (serve_args[index + 1] if index + 1 < len(serve_args) else "")
            return int(value) if value.isdigit() else None
    return None


def refuse_short_server(run: Run) -> None:
    """Extraction through the run's server sends each prepared row, up to max_seq_len tokens, as a prompt and asks
    for one token more (speculators' generate-offline-data, max_tokens 1): a server whose --max-model-len is not
    above max_seq_len refuses the longest rows (HTTP 400) after the whole load and most of the extraction (measured
    on an H100: 15 GB of hidden states written, then a 1,024-token row of a 1,024-token server). One line first."""
    limit = served_max_model_len(list(run.config.vllm.serve_args))
    if limit is not None and limit <= run.config.max_seq_len:
        raise BadInput(f"{run.label}: vllm.serve_args: --max-model-len {limit} leaves no room for extraction's one "
                       f"token after a row of max_seq_len ({run.config.max_seq_len}) tokens: set --max-model-len "
                       f"{run.config.max_seq_len + 1} or more, or max_seq_len {limit - 1}")


def refuse_mismatched_build(run: Run, vllm_search_path: list[str]) -> None:
    """A serve env whose vLLM was built for another torch (its wheel's pin) or another CUDA (the major its extension
    links against the one its torch was built for) is bad input before any step: every server of the run would
    load the model and then fail (doctor/_build.py reads both from the files)."""
    from specops.doctor import read_build

    refused = read_build(vllm_search_path).refusal()
    if refused:
        raise BadInput(f"{run.label}: {refused}")


def refuse_unservable_kind(run: Run, vllm_search_path: list[str] | None, *, cpu_host: bool = False) -> None:
    """A run whose kind of draft (`draft.method`) this env's speculators does not train, or the host's vLLM does not
    serve, is bad input before any step: read from their files by the doctor (doctor/_kinds.py: speculators'
    model registry, vLLM's speculators-config loader and the speculative methods it accepts; on a CPU host, what its
    Model Runner V1 refuses: dspark, DFlash2's candidate head in 0.32). eagle3 is judged
    by the doctor's serving check, as it always was; where a side cannot be read nothing is refused here."""
    import sys

    from specops.doctor import draft_kind

    kind = run.config.draft.method
    if kind == "eagle3":
        return
    refused = draft_kind(kind, sys.path, vllm_search_path, cpu_host=cpu_host).refusal()
    if refused:
        raise BadInput(f"{run.label}: draft.method: {refused}")


def _attention(run: Run, path: list[str], gpus: int) -> AttentionReading | None:
    from specops.doctor import draft_attention
    from specops.pipeline.run.config import read_model_config, text_config

    if not (run.model_path / "config.json").is_file():
        return None
    return draft_attention(path, text_config(read_model_config(run.model_path)), gpus,
                           serve_args=tuple(run.config.vllm.serve_args))

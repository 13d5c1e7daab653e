"""A run as the doctor sees it: Run -> RunSettings, read straight off the loaded run, its effective settings
(pipeline.run.settings: the same resolution the steps and the gate read: backend, serve env, whether vLLM
serves the draft here) and the command lines its steps will launch, so the doctor checks exactly what will run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specops.contract.errors import BadInput
from specops.doctor import RunSettings

if TYPE_CHECKING:
    from specops.pipeline.run import EffectiveSettings, Run


def run_settings(name: str, backend: str | None = None, serve_python: str | None = None) -> RunSettings:
    """runs/NAME.yaml on this host as the command line will run it (`backend`: its --backend; `serve_python`:
    the host's serve env, else $SPECOPS_SERVE_PYTHON); an embedded target is generated first (its first step
    would)."""
    from specops.pipeline import open_run
    from specops.pipeline.engine import enter

    run = open_run(name, weights=False)  # the engine's entry makes the settings, as the launch's own entry will
    return settings_for(run, enter(run, backend=backend, serve_python=serve_python).settings)


def settings_for(run: Run, effective: EffectiveSettings) -> RunSettings:
    """The doctor's view of the run: its effective settings (the ones the steps and the gate read)."""
    gpus = effective.gpus
    has_model = (run.model_path / "config.json").exists()
    backend = effective.backend
    sizes = run.parallel_sizes(gpus) if backend == "vllm" else None
    return RunSettings(
        model_path=str(run.model_path),
        trust_remote_code=run.config.trust_remote_code,
        layer_ids=run.layer_ids() if has_model else None,
        draft_vocab_size=run.config.draft.vocab_size,
        samples=run.config.samples,
        max_seq_len=run.config.max_seq_len,
        backend=backend,
        output_dir=str(run.paths.hidden_states),
        staging_dir=str(run.paths.run_dir / "vllm-staging"),
        serve_flags=_serve_flags(run, gpus) if backend == "vllm" and has_model else [],
        serve_args=list(run.config.vllm.serve_args) if backend == "vllm" else [],
        train_flags=_train_flags(run, gpus) if has_model else [],
        gpus=gpus,
        tensor_parallel=sizes.tensor if sizes else None,
        data_parallel=sizes.data if sizes else None,
        expert_parallel="--enable-expert-parallel" in run.config.vllm.serve_args,
        dtype=run.config.dtype,
        **_tokens(run),
        hidden_states_mode=run.config.hidden_states.mode,
        hidden_states_backend=run.config.hidden_states.backend,
        disk_budget_gb=run.config.hidden_states.disk_budget_gb,
        serve_python=effective.serve_python,
        serves_draft=effective.serves_draft,
        draft_method=run.config.draft.method,
        advice=_advice(run, gpus),
    )


def _advice(run: Run, gpus: int) -> list[str]:
    from specops.pipeline.plan import run_advice

    try:
        return run_advice(run, gpus)
    except (BadInput, OSError):  # what it reads is not there yet: the doctor's own checks say so
        return []


def _tokens(run: Run) -> dict:
    """The rows' tokens as the plan counts them at the launch boundary (the same figure run check used)."""
    from specops.pipeline.plan import checked_plan

    try:
        plan = checked_plan(run)
    except (BadInput, OSError):  # what the plan reads is not there yet: the doctor's own checks say so
        return {}
    return {"tokens": plan.run.tokens, "tokens_source": plan.run.tokens_source} if plan else {}


def _options(argv: list[str]) -> list[str]:
    return [arg for arg in argv if arg.startswith("--")]


def _train_flags(run: Run, gpus: int) -> list[str]:
    from specops.pipeline.training import build_train_command, train_plan

    try:
        return _options(build_train_command(train_plan(run), gpus))
    except (BadInput, OSError):  # what the plan reads is not there yet: the train step reports it
        return []


def _serve_flags(run: Run, gpus: int) -> list[str]:
    from specops.pipeline.vllm import build_serve_command

    try:
        argv, _env = build_serve_command(run, gpus, run.config.vllm.port, run.paths.workdir)
    except (BadInput, OSError):
        return []
    return _options(argv)

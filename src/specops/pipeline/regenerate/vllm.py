"""Regenerate with the `vllm` backend: speculators' own `regenerate-responses` against the run's server.

speculators 0.9 does the work (chat endpoint, concurrency, `--resume` by stable row id, the errors
file); specops starts or reuses the server job, tidies what an interrupted run left (a cut last
line, a conversation whose rows were not all written) so that `--resume` neither skips a half
answered conversation nor glues a new row to a cut one, runs the client, and checks its output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specops.pipeline.run import Run

PREFIX_FILE = "source.prefix.jsonl"  # the first conversations of source.jsonl, when only some are asked


def regenerate_argv(run: Run, endpoint: str, model: str, folder: Path, python: str | None = None,
                    dataset: Path | None = None) -> list[str]:
    from specops.pipeline.regenerate.hf import sampling_params
    from specops.pipeline.regenerate.output import RESPONSES_FILE
    from specops.pipeline.regenerate.source import SOURCE_FILE

    settings = run.config.regenerate
    return [python or sys.executable, "-m", "speculators", "regenerate-responses",
            "--endpoint", f"{endpoint}/v1/chat/completions", "--model", model,
            "--dataset", str(dataset or folder / SOURCE_FILE), "--outfile", str(folder / RESPONSES_FILE), "--resume",
            "--concurrency", str(settings.concurrency),
            "--max-tokens", str(settings.answer_tokens(run.config.max_seq_len)),
            "--sampling-params", json.dumps(sampling_params(settings), sort_keys=True)]


def run_client(argv: list[str], trust_remote_code: bool = False) -> int:
    """Run speculators' client, its output copied to stderr (the job log; stdout carries the JSON). The
    run's trust_remote_code reaches the client's tokenizer through its environment (the client has no
    flag for it: patch set speculators-0.9.0-remote-code)."""
    import os
    import subprocess

    env = {**os.environ, "COLUMNS": "400"}  # rich would wrap its log lines at 80 columns
    env["SPECOPS_TRUST_REMOTE_CODE"] = "1" if trust_remote_code else "0"
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          env=env) as process:
        assert process.stdout is not None
        for raw in process.stdout:
            sys.stderr.write(raw.decode(errors="replace"))
        sys.stderr.flush()
    return process.returncode


def regenerate_vllm(run: Run, folder: Path, source: list[dict[str, Any]], *, samples: int | None = None,
                    stop_server: bool = False, port: int | None = None, share: bool = False) -> dict[str, Any]:
    """speculators' client over the source; with `samples`, over its first conversations only (as many as
    rows are asked, doubled until the answers hold that many rows prepare keeps; --resume skips the
    conversations answered before), and the report's `answered` says how many. The server: the run's
    extraction server, or with regenerate.server own (a GPU host's default) a plain one of the target alone,
    which then measures evaluation's baseline (not for a host's `share` of a run across hosts) and stops."""
    from specops.contract.errors import BadInput, CheckFailed
    from specops.host import atomic, gpus

    beyond = run.config.regenerate.beyond_defaults()
    if beyond:  # before any server: speculators' client asks one fixed max_tokens and never shortens a prompt
        raise BadInput(f"{run.label}: regenerate.{beyond[0]}: the hf backend's (regenerate.backend: hf); speculators' "
                       "client never shortens a prompt, and a conversation whose next prompt outgrows the server's "
                       "max-model-len fails whole")
    from specops.pipeline import vllm
    from specops.pipeline.data import regenerated
    from specops.pipeline.regenerate.output import tidy
    from specops.pipeline.regenerate.source import SOURCE_FILE, prompt_turns

    expected = {row["id"]: sum(1 for turn in prompt_turns(row["messages"]) if turn["role"] == "user") for row in source}
    tidied = tidy(folder, expected, run.config.regenerate.answer_tokens(run.config.max_seq_len))
    if any(tidied.values()):
        print(f"regenerate: removed {tidied['cut_lines']} cut lines and {tidied['partial_rows']} rows of partly "
              "written conversations before resuming", file=sys.stderr)
    from specops.pipeline.run import regenerate_server

    own = regenerate_server(run, gpus.device_count())[0] == "own"
    if own:  # the target alone: nothing captured, so it answers at the GPU's pace
        plain = vllm.generating_server(run, port=port)
        server, endpoint, model, staging = plain["server"], plain["endpoint"], plain["model"], None
    else:
        # the run's one server: the target capturing hidden states, which extract reuses as it is (one load
        # for both steps); its captures of these chat requests are discarded as they finish (vllm.captures)
        server = vllm.start_server_job(run, gpus.device_count(), port=port)
        endpoint = f"http://127.0.0.1:{server.port}"
        # the server's own staging and served name: another run's server that fits (vllm/sharing.py) has its owner's
        staging, model = server.staging or vllm.staging_dir(run), server.served_model or str(run.model_path)
    lines = (folder / SOURCE_FILE).read_text(encoding="utf-8").splitlines(keepends=True)
    answered = len(source) if samples is None else min(len(source), max(samples, 1, _asked_before(folder)))
    stopped = None
    baseline = None
    with vllm.Discarded(staging) if staging is not None else _NoCaptures() as discarded:
        try:
            while True:
                dataset = None
                if answered < len(source):
                    dataset = folder / PREFIX_FILE
                    atomic.write_text(dataset, "".join(lines[:answered]))
                # The model name the server knows is its path; the client loads the tokenizer from it too.
                argv = regenerate_argv(run, endpoint, model, folder, dataset=dataset)
                code = _client_shown(argv, run, folder, [row["id"] for row in source[:answered]])
                if code != 0 or answered == len(source) or samples is None:
                    break
                if regenerated.usable_rows(folder, run.config.max_seq_len) >= samples:
                    break
                answered = min(len(source), 2 * answered)
            if own and code == 0 and not share:
                baseline = target_alone_here(run, endpoint, model, server)
        finally:
            if stop_server or own:  # own: the extraction server needs the GPUs next
                stopped = server.stop("--stop-server" if stop_server else "regenerate's own server: the answers "
                                      "are written")
    if code != 0:
        raise CheckFailed(f"speculators regenerate-responses exited {code} (log: the job log)")
    report: dict[str, Any] = {"tidied": tidied, "server": {**server.describe(stopped), **discarded.describe(),
                                                           "own": own}, "command": argv}
    if baseline is not None:
        report["baseline"] = baseline
    if samples is not None:
        report["answered"] = answered
    return report


class _NoCaptures:
    """Discarded's shape for a server that captures nothing."""

    def __enter__(self) -> _NoCaptures:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {}


def target_alone_here(run: Run, endpoint: str, model: str, server: Any) -> dict[str, Any] | None:
    """Evaluation's baseline on regenerate's own server while it is up: the held-out prompts (as prepare will write
    them) and each benchmark set, at evaluation's settings (vllm.baseline, plain); None where evaluate will not
    serve."""
    settings = run.config.evaluate
    if not settings.enabled or (settings.backend or run.config.backend) != "vllm" or not settings.heldout_prompts:
        return None
    from specops.pipeline import vllm
    from specops.pipeline.data import Conversation, heldout, load_tokenizer, read_conversations, render_ids
    from specops.pipeline.evaluation import chosen_sets, target_alone_on_sets

    conversations = [record for record in read_conversations(run.config.data, run.paths.resolve(run.config.data))
                     if isinstance(record, Conversation)]
    rows = heldout.prompt_rows(conversations, heldout.choose(conversations, settings.heldout_prompts))
    tokenizer = load_tokenizer(run)  # the ids evaluation sends (evaluation.prompts.heldout_token_ids)
    prompts = [render_ids(tokenizer, row["messages"], generation_prompt=True) for row in rows]
    sets = chosen_sets(run, None)
    rates = target_alone_on_sets(run, {"endpoint": endpoint, "model": model}, sets, settings.set_prompts,
                                 settings.num_speculative_tokens, settings.max_tokens, vllm.baseline.OWN_HOW)
    for name, path in sets.items():
        rates[name]["key"] = vllm.baseline.set_key(run, path, settings.set_prompts, settings.max_tokens,
                                                    server.version)
    record = vllm.baseline.measure(run, endpoint, model, prompts, settings.max_tokens, server.version,
                                   server.record["id"], plain=True, sets=rates)
    print(f"regenerate: the target alone, for evaluation's speedup: {record['tokens_per_s']} tokens/s on "
          f"{record['prompts']} held-out prompts" + "".join(f", {name} {rate['tokens_per_s']}" for name, rate in
                                                             rates.items()) + " (regenerate's own server)",
          file=sys.stderr, flush=True)
    return record


def _client_shown(argv: list[str], run: Run, folder: Path, asked: list[Any]) -> int:
    """run_client, with its progress shown while it runs: the conversations it answers of those it was given
    that the outfile does not hold yet (--resume skips those), counted as it appends them (regenerate.progress)."""
    from specops.pipeline.regenerate.output import ERRORS_FILE, RESPONSES_FILE
    from specops.pipeline.regenerate.progress import PROGRESS_FILE, Answering, OutfileWatcher, answered_before

    before = answered_before(folder / RESPONSES_FILE)
    progress = Answering(folder / PROGRESS_FILE, sum(1 for key in asked if str(key) not in before))
    with OutfileWatcher(progress, folder / RESPONSES_FILE, folder / ERRORS_FILE):
        code = run_client(argv, run.config.trust_remote_code)
    progress.finish()
    return code


def _asked_before(folder: Path) -> int:
    """How many source conversations an earlier client run was given (its rows' and errors' positions)."""
    from specops.pipeline.data import regenerated

    rows = [*regenerated.read_jsonl(folder / regenerated.RESPONSES_FILE)[0],
            *regenerated.read_jsonl(folder / regenerated.ERRORS_FILE)[0]]
    return max(((row.get("metadata") or {}).get("idx", -1) for row in rows), default=-1) + 1

"""The agent's command lines: one builder per command the control side (or the engine) runs.

`python -m specops <argv>`: each builder returns that argv as a list, built from typed values and
checked here, in one place, before anything is sent. Its keyword names are the `dest` names of the
agent's own parser, so tests/test_commandline.py runs every builder's output through that parser
(specops.cli) and compares what it parsed with what was built. Standard library only: remote/
imports this module too.

A value that cannot be sent raises BadArgument: one line naming the flag, which the control side
reports as bad input (exit 2).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from specops.protocol import name_problem

BACKENDS = ("hf", "vllm")
CHECKPOINTS = ("best", "last")  # or an epoch number
REFERENCES = ("auto", "hf", "vllm")
PATCH_ACTIONS = ("apply", "verify", "status", "revert", "new")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class BadArgument(ValueError):
    """A value that no agent command accepts: one line, starting with the flag."""


# ---- checks (each returns the value as the command line carries it)

def _name(value: object, flag: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise BadArgument(f"{flag}: {problem}")
    return str(value)


def _whole(value: object, flag: str, minimum: int = 1) -> int:
    """A whole number >= minimum, from an int or its text (invoke hands flags over as text)."""
    if isinstance(value, bool):
        raise BadArgument(f"{flag}: expected a whole number, got {value!r}")
    try:
        number = int(str(value).strip())
    except ValueError:
        raise BadArgument(f"{flag}: expected a whole number, got {value!r}") from None
    if number < minimum:
        raise BadArgument(f"{flag}: must be {'> 0' if minimum == 1 else f'>= {minimum}'}, got {number}")
    return number


def _choice(value: object, flag: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise BadArgument(f"{flag}: expected {' or '.join(choices)}, got {value!r}")
    return str(value)


def _part(value: Sequence[int], flag: str = "--part") -> str:
    """(I, COUNT) as I/COUNT, share I (0-based) of COUNT."""
    index, count = value
    if not (isinstance(index, int) and isinstance(count, int)) or not 0 <= index < count:
        raise BadArgument(f"{flag}: expected (I, COUNT) with 0 <= I < COUNT, got {tuple(value)!r}")
    return f"{index}/{count}"


def _text(value: object, flag: str) -> str:
    if not isinstance(value, str) or not value or value.startswith("-"):
        raise BadArgument(f"{flag}: expected a non-empty value not starting with '-', got {value!r}")
    return value


def _sweep(value: object, flag: str) -> str:
    """num_speculative_tokens=1,2,3 (specops.sweeps reads it the same way on the host)."""
    from specops.sweeps import sweep_setting

    try:
        return f"num_speculative_tokens={','.join(map(str, sweep_setting(str(value))))}"
    except ValueError as exc:
        raise BadArgument(str(exc)) from None


def _concurrency(value: object, flag: str) -> str:
    from specops.sweeps import positive_list

    try:
        return ",".join(map(str, positive_list(str(value), flag)))
    except ValueError as exc:
        raise BadArgument(str(exc)) from None


def _flags(**values: Any) -> list[str]:
    """--name VALUE for each value given (None: left out), --name alone for True; in order."""
    argv: list[str] = []
    for key, value in values.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def _optional(value: object, check: Any, flag: str, *extra: Any) -> Any:
    return None if value is None else check(value, flag, *extra)


# ---- step <name>: one step of a run

def step_regenerate(*, run: str, backend: str | None = None, stop_server: bool = False, port: int | None = None,
                    part: tuple[int, int] | None = None, require_whole: bool = False,
                    wait: bool = False) -> list[str]:
    if part is not None and require_whole:
        raise BadArgument("--part and --require-whole exclude each other: a share writes, the check does not")
    return ["step", "regenerate", *_flags(run=_name(run, "--run"),
                                          backend=_optional(backend, _choice, "--backend", BACKENDS),
                                          stop_server=stop_server, port=_optional(port, _whole, "--port"),
                                          part=_optional(part, _part, "--part"), require_whole=require_whole,
                                          wait=wait)]


def step_prepare(*, run: str, samples: int | None = None, strict: bool = False, wait: bool = False) -> list[str]:
    return ["step", "prepare", *_flags(run=_name(run, "--run"), samples=_optional(samples, _whole, "--samples"),
                                       strict=strict, wait=wait)]


def step_extract(*, run: str, samples: int | None = None, backend: str | None = None,
                 batch_tokens: int | None = None, stop_server: bool = False, port: int | None = None,
                 processes: int | None = None, part: tuple[int, int] | None = None,
                 require_whole: bool = False, wait: bool = False) -> list[str]:
    if part is not None and require_whole:
        raise BadArgument("--part and --require-whole exclude each other: a share writes, the check does not")
    return ["step", "extract", *_flags(run=_name(run, "--run"), samples=_optional(samples, _whole, "--samples"),
                                       backend=_optional(backend, _choice, "--backend", BACKENDS),
                                       batch_tokens=_optional(batch_tokens, _whole, "--batch-tokens"),
                                       stop_server=stop_server, port=_optional(port, _whole, "--port"),
                                       processes=_optional(processes, _whole, "--processes"),
                                       part=_optional(part, _part, "--part"), require_whole=require_whole,
                                       wait=wait)]


def step_extract_shard(*, run: str, shard: int) -> list[str]:
    return ["step", "extract-shard", *_flags(run=_name(run, "--run"), shard=_whole(shard, "--shard", 0))]


def step_validate(*, run: str, fidelity_samples: int | None = None, reference: str | None = None,
                  wait: bool = False) -> list[str]:
    return ["step", "validate", *_flags(run=_name(run, "--run"),
                                        fidelity_samples=_optional(fidelity_samples, _whole, "--fidelity-samples"),
                                        reference=_optional(reference, _choice, "--reference", REFERENCES),
                                        wait=wait)]


def step_vocab(*, run: str, wait: bool = False) -> list[str]:
    return ["step", "vocab", *_flags(run=_name(run, "--run"), wait=wait)]


def step_train(*, run: str, fresh: bool = False, epochs: int | None = None, gpus: int | None = None,
               dry_run: bool = False, nnodes: int | None = None, node_rank: int | None = None,
               rdzv_endpoint: str | None = None, rdzv_id: str | None = None, local_addr: str | None = None,
               interface: str | None = None, wait: bool = False) -> list[str]:
    """One host's training, or with nnodes one node of a torchrun group (rank, endpoint and id together)."""
    node = (node_rank, rdzv_endpoint, rdzv_id)
    if nnodes is None and any(value is not None for value in (*node, local_addr, interface)):
        raise BadArgument("--node-rank/--rdzv-endpoint/--rdzv-id/--local-addr/--interface: only with --nnodes")
    if nnodes is not None and any(value is None for value in node):
        raise BadArgument("--nnodes: give --node-rank, --rdzv-endpoint HOST:PORT and --rdzv-id with it")
    return ["step", "train", *_flags(run=_name(run, "--run"), fresh=fresh,
                                     epochs=_optional(epochs, _whole, "--epochs"),
                                     gpus=_optional(gpus, _whole, "--gpus", 0), dry_run=dry_run,
                                     nnodes=_optional(nnodes, _whole, "--nnodes"),
                                     node_rank=_optional(node_rank, _whole, "--node-rank", 0),
                                     rdzv_endpoint=_optional(rdzv_endpoint, _text, "--rdzv-endpoint"),
                                     rdzv_id=_optional(rdzv_id, _name, "--rdzv-id"),
                                     local_addr=_optional(local_addr, _text, "--local-addr"),
                                     interface=_optional(interface, _text, "--interface"), wait=wait)]


def _checkpoint(value: object, flag: str) -> str:
    text = str(value)
    if not (text in CHECKPOINTS or text.isdigit()):
        raise BadArgument(f"{flag}: expected best, last or an epoch number, got {value!r}")
    return text


def step_evaluate(*, run: str, checkpoint: str | None = None, all_epochs: bool = False, prompts: int | None = None,
                  backend: str | None = None, sweep: str | None = None, concurrency: str | None = None,
                  wait: bool = False) -> list[str]:
    if concurrency is not None and sweep is None:
        raise BadArgument("--concurrency: only with --sweep (evaluate sends its prompts one at a time)")
    if sweep is not None and all_epochs:
        raise BadArgument("--sweep and --all-epochs exclude each other: a sweep scores one checkpoint")
    return ["step", "evaluate", *_flags(run=_name(run, "--run"),
                                        checkpoint=_optional(checkpoint, _checkpoint, "--checkpoint"),
                                        all_epochs=all_epochs, prompts=_optional(prompts, _whole, "--prompts"),
                                        backend=_optional(backend, _choice, "--backend", BACKENDS),
                                        sweep=_optional(sweep, _sweep, "--sweep"),
                                        concurrency=_optional(concurrency, _concurrency, "--concurrency"),
                                        wait=wait)]


def step_metrics(*, run: str, no_plot: bool = False) -> list[str]:
    return ["step", "metrics", *_flags(run=_name(run, "--run"), no_plot=no_plot)]


# ---- the whole pipeline: on one host, or one host's node of a run across several

def pipeline(*, run: str, samples: int | None = None, backend: str | None = None, skip_patches: bool = False,
             hosts: Sequence[str] | None = None, node_rank: int | None = None, rendezvous: str | None = None,
             group: str | None = None, local_addr: str | None = None, interface: str | None = None,
             wait: bool = False) -> list[str]:
    """With `hosts` (every host's name, by node rank): node `node_rank` of the run across them, meeting at
    `rendezvous` (HOST0:PORT; the training meets at PORT+1), in launch `group`. `wait`: queue behind the
    job or step holding the run on this host instead of being refused."""
    node = (node_rank, rendezvous, group)
    if hosts is None and any(value is not None for value in (*node, local_addr, interface)):
        raise BadArgument("--node-rank/--rendezvous/--group/--local-addr/--interface: only with --hosts")
    names = None
    if hosts is not None:
        if any(value is None for value in node):
            raise BadArgument("--hosts: give --node-rank, --rendezvous HOST0:PORT and --group with it")
        names = ",".join(_name(name, "--hosts") for name in hosts)
        if len(set(hosts)) != len(hosts) or len(hosts) < 2:
            raise BadArgument(f"--hosts: two or more distinct names, got {list(hosts)!r}")
        if not 0 <= _whole(node_rank, "--node-rank", 0) < len(hosts):
            raise BadArgument(f"--node-rank: expected 0..{len(hosts) - 1}, got {node_rank}")
    return ["pipeline", *_flags(run=_name(run, "--run"), samples=_optional(samples, _whole, "--samples"),
                                backend=_optional(backend, _choice, "--backend", BACKENDS),
                                skip_patches=skip_patches, hosts=names,
                                node_rank=_optional(node_rank, _whole, "--node-rank", 0),
                                rendezvous=_optional(rendezvous, _text, "--rendezvous"),
                                group=_optional(group, _name, "--group"),
                                local_addr=_optional(local_addr, _text, "--local-addr"),
                                interface=_optional(interface, _text, "--interface"), wait=wait)]


# ---- jobs

def job_launch(*, name: str, command: Sequence[str], run: str | None = None, env: Mapping[str, str] | None = None,
               revision: Mapping[str, Any] | None = None, meta: Mapping[str, Any] | None = None, wait: bool = False,
               within: str | None = None) -> list[str]:
    """`job launch`: `command` (an argument list) runs under tmux as job `name`; env on top of the agent's.
    A job of a run holds it while it runs: `wait` queues behind the job or step holding it instead of
    being refused; `within` names the holder this job works for (the engine's driver)."""
    if not command or not all(isinstance(part, str) for part in command):
        raise BadArgument(f"job launch: the command must be a non-empty list of strings, got {command!r}")
    if (wait or within is not None) and run is None:
        raise BadArgument("--wait/--within: only for a job of a run (--run)")
    argv = ["job", "launch", "--name", _name(name, "--name"),
            *_flags(run=_optional(run, _name, "--run"), wait=wait, within=_optional(within, _name, "--within"))]
    for key, value in (env or {}).items():
        if not ENV_NAME.fullmatch(key):
            raise BadArgument(f"--env {key!r}: expected NAME=VALUE with NAME like {ENV_NAME.pattern}")
        argv += ["--env", f"{key}={value}"]
    if revision is not None:
        argv += ["--revision", json.dumps(dict(revision))]
    if meta is not None:
        argv += ["--meta", json.dumps(dict(meta))]
    return [*argv, "--", *command]


def job_list(*, all: bool = False) -> list[str]:  # the agent's flag is --all
    return ["job", "list", *_flags(all=all)]


def job_show(*, job: str, run: str | None = None) -> list[str]:
    return ["job", "show", _name(job, "job"), *_flags(run=_optional(run, _name, "--run"))]


def job_stop(*, job: str, run: str | None = None, grace: float | None = None) -> list[str]:
    if grace is not None and (not isinstance(grace, int | float) or grace < 0):
        raise BadArgument(f"--grace: must be zero or more seconds, got {grace!r}")
    return ["job", "stop", _name(job, "job"), *_flags(run=_optional(run, _name, "--run"), grace=grace)]


def job_tail(*, job: str, run: str | None = None, offset: int | None = None, lines: int | None = None,
             follow: bool = False) -> list[str]:
    return ["job", "tail", _name(job, "job"), *_flags(run=_optional(run, _name, "--run"),
                                                      offset=_optional(offset, _whole, "--offset", 0),
                                                      lines=_optional(lines, _whole, "--lines", 0), follow=follow)]


# ---- the host, its stack and its runs

def check(*, gpus: int = 0, env: Mapping[str, str] | None = None) -> list[str]:
    """`check`: the host's envs (role -> python) and the GPUs the inventory expects."""
    argv = ["check", "--gpus", str(_whole(gpus, "--gpus", 0))]
    for role, python in (env or {}).items():
        argv += ["--env", f"{_name(role, '--env')}={_text(python, '--env ' + role)}"]
    return argv


def ping() -> list[str]:
    """`ping`: the agent's version (what installing the bundle runs)."""
    return ["ping"]


def doctor(*, run: str | None = None) -> list[str]:
    return ["doctor", *_flags(run=_optional(run, _name, "--run"))]


def run_check(*, run: str) -> list[str]:
    return ["run", "check", *_flags(run=_name(run, "--run"))]


def plan(*, run: str, samples: int | None = None) -> list[str]:
    """`plan`: what the run costs on the host, before any model load."""
    return ["plan", *_flags(run=_name(run, "--run"), samples=_optional(samples, _whole, "--samples"))]


def fetch_list(*, run: str, with_training_state: bool = False, drop: str | None = None) -> list[str]:
    return ["fetch-list", *_flags(run=_name(run, "--run"), with_training_state=with_training_state,
                                  drop=_optional(drop, _name, "--drop"))]


def patch(*, action: str, sets: Sequence[str] = (), dry_run: bool = False, deep: bool = False,
          module: str | None = None, edited: str | None = None, patch_id: str | None = None,
          reason: str | None = None, from_finding: str | None = None) -> list[str]:
    argv = ["patch", _choice(action, "patch", PATCH_ACTIONS)]
    for name in sets:
        argv += ["--set", _name(name, "--set")]  # a set's name is a folder under patches/
    return [*argv, *_flags(dry_run=dry_run, deep=deep, module=_optional(module, _text, "--module"),
                           edited=_optional(edited, _text, "--edited"),
                           id=_optional(patch_id, _name, "--id"), reason=_optional(reason, _text, "--reason"),
                           from_finding=_optional(from_finding, _text, "--from-finding"))]

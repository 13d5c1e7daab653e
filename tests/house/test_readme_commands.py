"""The README's commands are the tasks' own: every `--flag` a README line gives a task is one of that task's
flags (README once promised `invoke stop --all`, which Invoke answered with "No idea what '--all' is!")."""

from __future__ import annotations

import re

import pytest

from tests.support.repo import REPO


def _block_lines() -> list[str]:
    lines, inside = [], False
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            lines.append(line)
    return lines


def _claims(comment: str) -> list[tuple[str, str]]:
    """What a comment says of a task's flags: `status and stop take --x`, `status --all: ...`."""
    pairs = [(task, flag) for tasks_, flag in re.findall(r"((?:[a-z]+(?:, | and ))*[a-z]+) takes? (--[a-z-]+)", comment)
             for task in re.split(r", | and ", tasks_)]
    return pairs + re.findall(r"\b([a-z]+) (--[a-z][a-z-]*):", comment)


def _uses(line: str) -> list[tuple[str, str]]:
    """(task, --flag) pairs: `invoke a|b --x / c --y` gives a and b --x, c --y."""
    pairs = []
    for segment in line.removeprefix("invoke ").split(" / "):
        words = segment.split()
        if not words or words[0].startswith("-"):  # `invoke --list`: Invoke's own flag
            continue
        for task in words[0].split("|"):
            pairs += [(task, flag) for flag in re.findall(r"--[a-z][a-z-]*", segment)]
    return pairs


USES = sorted({pair for line in _block_lines() if line.startswith("invoke ") for pair in _uses(line.split("#")[0])}
              | {pair for line in _block_lines() if "#" in line for pair in _claims(line.split("#", 1)[1])})


def test_the_readme_says_what_status_and_stop_take() -> None:
    assert {("status", "--all-hosts"), ("stop", "--all-hosts"), ("status", "--all")} <= set(USES)


@pytest.mark.parametrize(("task", "flag"), USES, ids=lambda value: value)
def test_every_flag_the_readme_gives_a_task_is_the_tasks_own(task: str, flag: str) -> None:
    import tasks

    names = {name for argument in tasks.ns.tasks[task].get_arguments() for name in argument.names}
    assert flag.removeprefix("--") in names, f"README: invoke {task} {flag}: the task has no such flag"


def _inline_invokes(text: str) -> list[str]:
    """`invoke ...` command lines quoted inline: in the README's prose, or in a message's string."""
    return [match.split("#")[0] for match in re.findall(r"`(invoke [^`\n]+)`", text)]


def _message_invokes(text: str) -> list[str]:
    """`invoke TASK ... --flag` as a message in the code writes it (quoted or not), up to the sentence's end."""
    return [f"invoke {task}{tail}" for task, tail in re.findall(r"invoke ([a-z][a-z-]*)((?: [^\s\"'`),;]+)*)", text)
            if task not in {"the", "a", "it", "its"}]


def _sources() -> list[tuple[str, str]]:
    files = [REPO / "tasks.py", *sorted((REPO / "remote").rglob("*.py")), *sorted((REPO / "src").rglob("*.py"))]
    return [(path.relative_to(REPO).as_posix(), path.read_text()) for path in files]


INLINE = sorted({(task, flag, "README.md") for line in _inline_invokes((REPO / "README.md").read_text())
                 for task, flag in _uses(line)}
                | {(task, flag, name) for name, text in _sources()
                   for line in [*_inline_invokes(text), *_message_invokes(text)] for task, flag in _uses(line)})


def test_the_inline_commands_are_read() -> None:
    assert ("logs", "--follow", "README.md") in INLINE and ("doctor", "--no-import", "README.md") in INLINE
    assert ("train", "--fresh", "src/specops/pipeline/training/step.py") in INLINE


@pytest.mark.parametrize(("task", "flag", "where"), INLINE, ids=lambda value: value)
def test_every_flag_a_message_or_the_readme_names_is_the_tasks_own(task: str, flag: str, where: str) -> None:
    import tasks

    assert task in tasks.ns.tasks, f"{where}: invoke {task}: no such task"
    names = {name for argument in tasks.ns.tasks[task].get_arguments() for name in argument.names}
    assert flag.removeprefix("--") in names, f"{where}: invoke {task} {flag}: the task has no such flag"


def test_a_flag_no_task_has_is_bad_input_exit_2_and_one_line() -> None:
    import subprocess
    import sys
    from pathlib import Path

    invoke = Path(sys.executable).parent / "invoke"
    done = subprocess.run([str(invoke), "extract", "--sample", "3"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "specops: invoke extract: No idea what '--sample' is! (invoke --help extract lists its flags)"]

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

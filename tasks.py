"""specops: Invoke tasks. Thin: parse flags, call remote/, render. `invoke --list` shows them all.

One explicit registry: every task group is imported by name, so a typo fails loudly. The task
modules import their heavy parts (fabric, rich, pydantic) inside the tasks, so listing is quick.
"""

import sys
from pathlib import Path

from invoke import Collection, Exit, ParseError, Program

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Invoke turns bytecode writing off unless --write-pyc is given, so every task would compile this
# checkout's modules again on each run. Turn it back on (git ignores __pycache__; the agent bundle and
# rsync leave it out), unless the user asked for none (PYTHONDONTWRITEBYTECODE or python -B: both set
# sys.flags.dont_write_bytecode at start-up, before Invoke runs).
if not sys.flags.dont_write_bytecode:
    sys.dont_write_bytecode = False

from remote.tasks import compat, core, doctor, jobs, patch, pipeline, plan, sync


def _parse_tasks(program: Program, parse=Program.parse_tasks) -> None:
    """A task's flags Invoke cannot parse (`--sample`) are bad input: exit 2 and one line, as every other bad
    flag (Invoke's Program exits 1 on a ParseError, but ends with an Exit's own code)."""
    try:
        parse(program)
    except ParseError as error:
        task_name = getattr(error.context, "name", None)
        where = f"invoke {task_name}: " if task_name else "invoke: "
        hint = f" (invoke --help {task_name} lists its flags)" if task_name else ""
        raise Exit(f"specops: {where}{error}{hint}", code=2) from None


Program.parse_tasks = _parse_tasks  # tasks.py is loaded by parse_collection, just before parse_tasks runs

ns = Collection()
for group in (core, sync, jobs, patch, doctor, compat, pipeline, plan):
    for task_object in group.TASKS:
        ns.add_task(task_object)

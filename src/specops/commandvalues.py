"""The kinds of value an agent flag takes: each a `Kind` (specops.commandspec) — the control side's check
(the value as the agent will parse it, or BadArgument naming the flag), the agent's parse, the text between
them. The command specs (specops.commandline) name them. Standard library only: remote/ imports this too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

from specops.commandspec import BadArgument, Kind
from specops.errors import BadInput
from specops.protocol import Endpoint, name_problem

BACKENDS = ("hf", "vllm")
ALONE_STEPS = ("train",)  # steps the engine may be entered with alone (`pipeline --only`): invoke train --hosts
CHECKPOINTS = ("best", "last")  # or an epoch number
REFERENCES = ("auto", "hf", "vllm")
PATCH_ACTIONS = ("apply", "verify", "status", "revert", "new")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# ---- checks (each returns the value as the agent's parser reads it)

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


def _part(value: object, flag: str) -> tuple[int, int]:
    """(I, COUNT): share I (0-based) of COUNT, written I/COUNT."""
    index, count = value if isinstance(value, tuple | list) and len(value) == 2 else (None, None)
    if not (isinstance(index, int) and isinstance(count, int)) or not 0 <= index < count:
        raise BadArgument(f"{flag}: expected (I, COUNT) with 0 <= I < COUNT, got {value!r}")
    return index, count


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


def _checkpoint(value: object, flag: str) -> str:
    text = str(value)
    if not (text in CHECKPOINTS or text.isdigit()):
        raise BadArgument(f"{flag}: expected best, last or an epoch number, got {value!r}")
    return text


def _hosts(value: object, flag: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise BadArgument(f"{flag}: expected a list of host names, got {value!r}")
    return [_name(name, flag) for name in value]


def _endpoint_kind(option: str, why: Callable[[object, ValueError], str]) -> Kind:
    """An Endpoint, parsed once on either side: the builder's check (BadArgument) and the agent's parse
    (BadInput: argparse would turn a ValueError into its own message)."""
    def parsed(value: object) -> Endpoint:
        return value if isinstance(value, Endpoint) else Endpoint.parse(str(value))

    def check(value: object, flag: str) -> Endpoint:
        try:
            return parsed(value)
        except ValueError as exc:
            raise BadArgument(f"{flag}: {why(value, exc)}") from None

    def parse(text: str) -> Endpoint:
        try:
            return parsed(text)
        except ValueError as exc:
            raise BadInput(f"{option}: {why(text, exc)}") from None

    return Kind(check, "Endpoint | str | None", parse=parse)


def _env_pairs(value: object, flag: str) -> list[str]:
    """An environment (NAME -> value) as the NAME=VALUE items of a repeated --env."""
    if not isinstance(value, Mapping):
        raise BadArgument(f"{flag}: expected a mapping of NAME to value, got {value!r}")
    for key in value:
        if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
            raise BadArgument(f"{flag} {key!r}: expected NAME=VALUE with NAME like {ENV_NAME.pattern}")
    return [f"{key}={item}" for key, item in value.items()]


def _role_pythons(value: object, flag: str) -> list[str]:
    """The host's envs (role -> interpreter) as the ROLE=PYTHON items of a repeated --env."""
    if not isinstance(value, Mapping):
        raise BadArgument(f"{flag}: expected a mapping of role to interpreter, got {value!r}")
    return [f"{_name(role, flag)}={_text(python, f'{flag} {role}')}" for role, python in value.items()]


def _set_files(value: object, flag: str) -> list[str]:
    """Benchmark sets (NAME -> FILE) as the NAME=FILE items of a repeated --set."""
    if not isinstance(value, Mapping):  # the agent's own parse: its NAME=FILE items, each checked again
        if isinstance(value, str) or not isinstance(value, Sequence) or not all(
                isinstance(item, str) and "=" in item for item in value):
            raise BadArgument(f"{flag}: expected a mapping of NAME to FILE, got {value!r}")
        value = dict(item.split("=", 1) for item in value)
    return [f"{_name(name, flag)}={_text(file, f'{flag} {name}')}" for name, file in value.items()]


def _names(value: object, flag: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise BadArgument(f"{flag}: expected a list of names, got {value!r}")
    return [_name(name, flag) for name in value]


def _texts(value: object, flag: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise BadArgument(f"{flag}: expected a list, got {value!r}")
    return [_text(item, flag) for item in value]


def _json_object(value: object, flag: str) -> dict[str, object]:
    """A mapping that travels as one JSON object (the agent reads it back with specops.flags.json_object)."""
    if not isinstance(value, Mapping):
        raise BadArgument(f"{flag}: expected a mapping (sent as a JSON object), got {value!r}")
    return dict(value)


def _command(value: object, flag: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not value or not all(
            isinstance(part, str) for part in value):
        raise BadArgument(f"job launch: the command must be a non-empty list of strings, got {value!r}")
    return list(value)


def _seconds(value: object, flag: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise BadArgument(f"{flag}: must be zero or more seconds, got {value!r}")
    return value


# ---- kinds of value

def _parse_with(name: str) -> Callable[[str], object]:
    """specops.flags' parse `name`, imported when the agent parses a number (`job list` never does)."""
    def parse(text: str) -> object:
        from specops import flags

        return getattr(flags, name)(text)

    parse.__name__ = name
    return parse


NAME = Kind(_name)
TEXT = Kind(_text)
WHOLE = Kind(_whole, "int | str | None", parse=_parse_with("positive_int"))  # invoke hands numbers over as text
COUNT = Kind(partial(_whole, minimum=0), "int | str | None", parse=_parse_with("non_negative_int"))
BACKEND = Kind(partial(_choice, choices=BACKENDS), choices=BACKENDS)
ALONE_STEP = Kind(partial(_choice, choices=ALONE_STEPS), choices=ALONE_STEPS)
REFERENCE = Kind(partial(_choice, choices=REFERENCES), choices=REFERENCES)
PART = Kind(_part, "tuple[int, int] | None", parse=_parse_with("part_of"), text=lambda part: "{}/{}".format(*part))
CHECKPOINT = Kind(_checkpoint)
SWEEP = Kind(_sweep)
CONCURRENCY = Kind(_concurrency)
ENDPOINT = _endpoint_kind("--rendezvous", lambda _value, exc: str(exc))
RDZV_ENDPOINT = _endpoint_kind("--rdzv-endpoint", lambda value, _exc: f"{value!r} is not HOST:PORT")
HOSTS = Kind(_hosts, "Sequence[str] | None", parse=lambda text: text.split(","), text=",".join)
PATH = Kind(_text, "str | None", parse=Path)
PATCH_ACTION = Kind(partial(_choice, choices=PATCH_ACTIONS), choices=PATCH_ACTIONS)
# repeated flags: the check turns the whole value into the items, each sent as `--flag ITEM`
ENV_PAIRS = Kind(_env_pairs, "Mapping[str, str] | None")
ROLE_PYTHONS = Kind(_role_pythons, "Mapping[str, str] | None")
SET_NAMES = Kind(_names, "Sequence[str] | None")
SET_FILES = Kind(_set_files, "Mapping[str, str] | None")
SITES = Kind(_texts, "Sequence[str] | None")
JSON_OBJECT = Kind(_json_object, "Mapping[str, object] | None", text=json.dumps)
COMMAND = Kind(_command, "Sequence[str]")  # the words after `--`, to the end of the line
SECONDS = Kind(_seconds, "float | None", parse=float)

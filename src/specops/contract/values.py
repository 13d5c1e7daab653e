"""The kinds of value an agent flag takes, and the one parser of each, for both sides.

Each flag's kind is a `Kind` (specops.contract.commandspec): the control side's check (the value as the
agent will parse it, or BadArgument naming the flag), the agent's parse, the text between them. The
command specs (specops.contract.commandline) name them. The parsers underneath (`whole_number`,
`positive_list`, `sweep_setting`) raise ValueError saying what is wrong; each side names the flag its own
way: BadArgument in the builders and the task flags of remote/, BadInput in the agent's argparse types.
Standard library only: remote/ imports this too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from specops.contract.commandspec import BadArgument, Kind
from specops.contract.errors import BadInput, as_bad_input
from specops.contract.protocol import Endpoint, name_problem

BACKENDS = ("hf", "vllm")
ROLES = ("serve", "train")  # a host's part of a role split (the run's hosts: {serve, train}; plan --role)
ALONE_STEPS = ("train",)  # steps the engine may be entered with alone (`pipeline --only`): invoke train --hosts
CHECKPOINTS = ("best", "last")  # or an epoch number
REFERENCES = ("auto", "hf", "vllm")
PATCH_ACTIONS = ("apply", "verify", "status", "revert", "new")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SWEEP_SETTINGS = ("num_speculative_tokens",)  # what `evaluate --sweep` can vary
MAX_SPECULATIVE_TOKENS = 16  # beyond this no server is worth asking
# `evaluate --compare`: the speculators compared side by side. none: the target alone (no speculation);
# vLLM's training-free ones; the kinds speculators 0.9.0 trains (a run's draft.method), each from a run's draft
NO_SPECULATION = "none"
TRAINING_FREE = ("ngram", "suffix")
TRAINED_KINDS = ("eagle3", "peagle", "dflash", "dflash2", "dspark", "xpress", "mtp")
SPECULATOR_KINDS = (NO_SPECULATION, *TRAINING_FREE, *TRAINED_KINDS)


# ---- parsers: ValueError without the flag's name (each side adds it)

def whole_number(value: object, minimum: int = 1) -> int:
    """A whole number >= minimum, from an int or its text (invoke and argparse hand flags over as text)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a whole number, got {value!r}")
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"expected a whole number, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"must be {'> 0' if minimum == 1 else f'>= {minimum}'}, got {number}")
    return number


def positive_list(text: str, flag: str, highest: int | None = None) -> list[int]:
    """`1,8` -> [1, 8]: whole numbers > 0 (at most `highest`), each once, in the order given; the
    ValueError names `flag` (one message for the whole list)."""
    values: list[int] = []
    for part in str(text).split(","):
        try:
            number: int | None = whole_number(part)
        except ValueError:
            number = None
        if number is None or (highest is not None and number > highest):
            bound = f" up to {highest}" if highest else ""
            raise ValueError(f"{flag}: expected whole numbers > 0{bound} separated by commas, got {text!r}")
        if number in values:
            raise ValueError(f"{flag}: {part.strip()} appears twice in {text!r}")
        values.append(number)
    return values


def sweep_setting(text: str) -> list[int]:
    """`num_speculative_tokens=1,2,3` -> [1, 2, 3] (`evaluate --sweep`, read the same way on both sides)."""
    name, _, values = str(text).partition("=")
    if name.strip() not in SWEEP_SETTINGS or not values.strip():
        raise ValueError(f"--sweep: expected {SWEEP_SETTINGS[0]}=1,2,3 (a comma-separated list), got {text!r}")
    return positive_list(values, f"--sweep {SWEEP_SETTINGS[0]}", MAX_SPECULATIVE_TOKENS)


TRAIN_SWEEP_KEY = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*")


def train_sweep(items: Sequence[str] | str) -> list[tuple[str, list[str]]]:
    """`train.lr=1e-3,3e-4` items (each a flag's value; several KEY=V1,V2 in one value separated by spaces) ->
    [("train.lr", ["1e-3", "3e-4"])] (`train --sweep`, read the same way on both sides). Only the shape is
    judged here: what a key and its values mean is the run config's to say (the agent reads them against it)."""
    texts = [items] if isinstance(items, str) else list(items)
    settings: list[tuple[str, list[str]]] = []
    for text in (word for item in texts for word in str(item).split()) if texts else ():
        key, sep, listed = text.partition("=")
        if not sep or not TRAIN_SWEEP_KEY.fullmatch(key):
            raise ValueError(f"--sweep: expected KEY=V1,V2 (a run-config key such as train.lr, '=', then a "
                             f"comma-separated list of values), got {text!r}")
        values = [value.strip() for value in listed.split(",")]
        if not any(values):
            raise ValueError(f"--sweep {key}: no values (an empty sweep trains nothing), got {text!r}")
        if not all(values):
            raise ValueError(f"--sweep {key}: an empty value in {text!r}")
        twice = next((value for at, value in enumerate(values) if value in values[:at]), None)
        if twice is not None:
            raise ValueError(f"--sweep {key}: {twice} appears twice in {text!r}")
        if any(key == known for known, _ in settings):
            raise ValueError(f"--sweep {key}: given twice (one KEY=V1,V2 a key)")
        settings.append((key, values))
    if not settings:
        raise ValueError("--sweep: no settings (an empty sweep trains nothing): give KEY=V1,V2")
    return settings


def speculator_list(text: str) -> list[str]:
    """`none,ngram,suffix,eagle3` -> ["none", "ngram", "suffix", "eagle3"] (`evaluate --compare`, read the same
    way on both sides): kinds of SPECULATOR_KINDS, each once; a trained kind may name the run whose draft it is
    (`dflash@tiny-dflash`; without it, the evaluated run's own draft)."""
    labels: list[str] = []
    for part in str(text).split(","):
        label = part.strip()
        kind, at, run = label.partition("@")
        if kind not in SPECULATOR_KINDS:
            raise ValueError(f"--compare: {label!r} is not a speculator kind; choose from "
                             f"{', '.join(SPECULATOR_KINDS)} (a trained kind may name its run: KIND@RUN), got {text!r}")
        if at and (kind not in TRAINED_KINDS or name_problem(run) is not None):
            raise ValueError(f"--compare: {label!r}: only a trained kind names a run (KIND@RUN, a run name)")
        if label in labels:
            raise ValueError(f"--compare: {label} appears twice in {text!r}")
        labels.append(label)
    return labels


# ---- the agent's argparse types: BadInput, one line (argparse would reword a ValueError)

def positive_int(value: str) -> int:
    """A whole number > 0."""
    return as_bad_input(whole_number, value)


def non_negative_int(value: str) -> int:
    """A whole number >= 0 (e.g. a GPU count, where 0 means a CPU host)."""
    return as_bad_input(whole_number, value, 0)


def part_of(value: str) -> tuple[int, int]:
    """I/COUNT: this host's share I (0-based) of work cut into COUNT shares."""
    index, _, total = value.partition("/")
    try:
        share = whole_number(index, minimum=0), whole_number(total)
    except ValueError:
        share = (0, 0)
    if not share[0] < share[1]:
        raise BadInput(f"expected I/COUNT with 0 <= I < COUNT, got {value!r}")
    return share


def positive_seconds(value: str) -> float:
    """A duration in seconds > 0."""
    try:
        seconds = float(value)
    except ValueError:
        raise BadInput(f"expected seconds, got {value!r}") from None
    if seconds <= 0:
        raise BadInput(f"expected seconds > 0, got {value}")
    return seconds


def json_object(source: str, text: str | None) -> dict[str, Any] | None:
    """A JSON object given on the command line (None when not given); `source` names the flag."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{source}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, dict):
        raise BadInput(f"{source}: expected a JSON object, got {type(value).__name__}")
    return value


# ---- checks (each returns the value as the agent's parser reads it)

def _name(value: object, flag: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise BadArgument(f"{flag}: {problem}")
    return str(value)


def whole_flag(value: object, flag: str, minimum: int = 1) -> int | None:
    """A flag's whole number >= minimum (None: not given), or BadArgument naming the flag: the builders'
    check, and how the control side's tasks read number flags of their own (`invoke logs --lines`)."""
    if value is None:
        return None
    try:
        return whole_number(value, minimum)
    except ValueError as exc:
        raise BadArgument(f"{flag}: {exc}") from None


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
    """num_speculative_tokens=1,2,3"""
    try:
        return f"{SWEEP_SETTINGS[0]}={','.join(map(str, sweep_setting(str(value))))}"
    except ValueError as exc:
        raise BadArgument(str(exc)) from None


def _train_sweep(value: object, flag: str) -> list[str]:
    """[KEY=V1,V2, ...]: each setting one --sweep item."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or not all(isinstance(item, str) for item in value):
        raise BadArgument(f"{flag}: expected KEY=V1,V2 items, got {value!r}")
    try:
        return [f"{key}={','.join(values)}" for key, values in train_sweep(value)]
    except ValueError as exc:
        raise BadArgument(str(exc)) from None


def _train_sweep_item(text: str) -> str:
    """The agent's parse of one --sweep item: its shape (the whole list is read again by the handler)."""
    as_bad_input(train_sweep, text)
    return text


def _concurrency(value: object, flag: str) -> str:
    try:
        return ",".join(map(str, positive_list(str(value), flag)))
    except ValueError as exc:
        raise BadArgument(str(exc)) from None


def _compare(value: object, flag: str) -> str:
    """none,ngram,suffix,eagle3"""
    try:
        return ",".join(speculator_list(str(value)))
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
    """A mapping that travels as one JSON object (the agent reads it back with json_object)."""
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

NAME = Kind(_name)
TEXT = Kind(_text)
WHOLE = Kind(whole_flag, "int | str | None", parse=positive_int)  # invoke hands numbers over as text
COUNT = Kind(partial(whole_flag, minimum=0), "int | str | None", parse=non_negative_int)
BACKEND = Kind(partial(_choice, choices=BACKENDS), choices=BACKENDS)
ALONE_STEP = Kind(partial(_choice, choices=ALONE_STEPS), choices=ALONE_STEPS)
ROLE = Kind(partial(_choice, choices=ROLES), choices=ROLES)
REFERENCE = Kind(partial(_choice, choices=REFERENCES), choices=REFERENCES)
PART = Kind(_part, "tuple[int, int] | None", parse=part_of, text=lambda part: "{}/{}".format(*part))
CHECKPOINT = Kind(_checkpoint)
SWEEP = Kind(_sweep)
TRAIN_SWEEP = Kind(_train_sweep, "Sequence[str] | str | None", parse=_train_sweep_item)
CONCURRENCY = Kind(_concurrency)
COMPARE = Kind(_compare)
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

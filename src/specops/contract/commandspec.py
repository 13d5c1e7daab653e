"""One declaration per agent command, from which both of its sides are made.

A `Command` lists its flags (each a `Flag`: its keyword, its `Kind`, its help) and its cross-flag rules.
From it come the control side's builder (`command.builder()`: keywords in, a checked argv out, BadArgument
naming the flag) and the agent's argparse parser (`command.add_to(subparsers, handler)`: the same flags,
the same rules checked before the handler runs, BadInput). A flag or rule added to the spec reaches both;
tests/foundation/test_commandline.py round-trips every builder through the agent's parser.
Standard library only, and light: remote/ imports this module (through specops.contract.commandline), and so does
every `job` command on the host (named tuples, not dataclasses: `job list` is what `invoke status` waits for).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from specops.contract.errors import BadInput

Values = Mapping[str, object]


class BadArgument(ValueError):
    """A value that no agent command accepts: one line, starting with the flag."""


def _as_text(value: object) -> str:
    return str(value)


class Kind(NamedTuple):
    """How a flag's value travels: `check(value, flag)` is the control side's check (the value as the agent
    will parse it, or BadArgument), `text` writes it on the command line, `parse` is the agent's argparse
    type (None: the text as it is), `annotation` is the builder's keyword type."""

    check: Callable[[object, str], object]
    annotation: str = "str | None"
    parse: Callable[[str], object] | None = None
    text: Callable[[object], str] = _as_text
    choices: tuple[str, ...] | None = None


class Flag(NamedTuple):
    """`--dest-with-dashes`: `kind` None is a switch (given alone, or not at all); `tristate`: --x / --no-x /
    neither; `positional`: a bare value after the command's words (`job show ID`); `repeat`: the option once
    per item (`--env K=V --env ...`; the kind's check turns the whole value into the items); `rest`: the words
    after `--` to the end of the line (`job launch ... -- CMD ARGS`); `spelled`: the option's own name where it
    is not the dest's (`--set` for `sets`). `default` is the agent's value when the flag is not given (the
    builder then leaves it out)."""

    dest: str
    kind: Kind | None = None
    help: str | None = None
    default: object = None
    required: bool = False
    metavar: str | None = None
    tristate: bool = False
    positional: bool = False
    repeat: bool = False
    rest: bool = False
    spelled: str | None = None

    @property
    def option(self) -> str:
        """How the command line and its messages name it: --name-with-dashes, or a positional's name."""
        name = self.spelled or self.dest
        return name if self.positional or self.rest else "--" + name.replace("_", "-")


class Rule(NamedTuple):
    """A rule between flags: `broken(values)` is the one line that refuses them, or None. `values` holds
    every flag's value (None or False: not given), as the agent parses them."""

    broken: Callable[[Values], str | None]


def given(value: object) -> bool:
    return value is not None and value is not False


def excludes(first: str, second: str, why: str) -> Rule:
    """`--first` and `--second` exclude each other."""
    message = f"--{first.replace('_', '-')} and --{second.replace('_', '-')} exclude each other: {why}"
    return Rule(lambda values: message if given(values[first]) and given(values[second]) else None)


def only_with(anchor: str, dependents: Sequence[str], message: str) -> Rule:
    """The dependents make sense only when `anchor` is given."""
    return Rule(lambda values: message if not given(values[anchor]) and any(
        given(values[name]) for name in dependents) else None)


def needs(anchor: str, required: Sequence[str], message: str) -> Rule:
    """`anchor` given: every one of `required` too."""
    return Rule(lambda values: message if given(values[anchor]) and not all(
        given(values[name]) for name in required) else None)


class Command(NamedTuple):
    """An agent command: `python -m specops <words...> <flags>`."""

    words: tuple[str, ...]
    help: str
    flags: tuple[Flag, ...]
    rules: tuple[Rule, ...] = ()

    @property
    def name(self) -> str:
        """The builder's name: `step extract-shard` -> step_extract_shard."""
        return "_".join(self.words).replace("-", "_")

    def helps(self, *dests: str, **renamed: str) -> dict[str, str]:
        """These flags' help, by dest (`renamed`: the caller's name -> the flag's dest, as an Invoke task's
        `set_` for `sets`). An Invoke task hands it to `@task(help=...)`, so the task's --help and the agent's
        say the same, written once here. A flag without help is an error, never a silently missing line."""
        flags = {flag.dest: flag for flag in self.flags}
        found: dict[str, str] = {}
        for name, dest in [*((dest, dest) for dest in dests), *renamed.items()]:
            if dest not in flags or not flags[dest].help:
                raise ValueError(f"{' '.join(self.words)}: no flag {dest!r} with a help to share")
            found[name] = flags[dest].help  # type: ignore[assignment]
        return found

    def problem(self, values: Values) -> str | None:
        """The first rule the values break, or None."""
        return next((line for line in (rule.broken(values) for rule in self.rules) if line), None)

    def argv(self, **values: object) -> list[str]:
        """The command line for these keyword values: each checked, then the rules, in one place."""
        known = {flag.dest: flag for flag in self.flags}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise TypeError(f"{self.name}() got unexpected keyword arguments {unknown}")
        checked: dict[str, object] = {}
        for flag in self.flags:
            value = values.get(flag.dest)
            if flag.required and value is None:
                raise TypeError(f"{self.name}() missing required keyword argument: {flag.dest!r}")
            checked[flag.dest] = _checked(flag, value)
        problem = self.problem(checked)
        if problem:
            raise BadArgument(problem)
        argv = list(self.words)
        argv += [flag.kind.text(checked[flag.dest]) for flag in self.flags if flag.positional and flag.kind]
        for flag in self.flags:
            value = checked[flag.dest]
            if flag.positional or flag.rest:
                continue
            if flag.repeat and flag.kind is not None:
                for item in value or ():  # type: ignore[attr-defined]
                    argv += [flag.option, flag.kind.text(item)]
            elif flag.tristate and value is not None:
                argv.append(flag.option if value else "--no-" + flag.option[2:])
            elif value is True:
                argv.append(flag.option)
            elif given(value):
                argv += [flag.option, flag.kind.text(value) if flag.kind else str(value)]
        for flag in self.flags:
            if flag.rest and flag.kind is not None and given(checked[flag.dest]):
                argv += ["--", *map(flag.kind.text, checked[flag.dest])]  # type: ignore[call-overload]
        return argv

    def builder(self, module: str) -> Callable[..., list[str]]:
        """A real keyword-only function `name(*, flag=default, ...) -> argv`, its parameters the flags (so
        `help()`, `inspect` and a caller's TypeError see them). Written as source and compiled, as the
        standard library's namedtuple does: building an `inspect.Signature` would import inspect on every
        agent call."""
        parameters = ", ".join(f"{flag.dest}: {_annotation(flag)}" + (
            "" if flag.required else f" = {None if flag.tristate or flag.kind else False}") for flag in self.flags)
        source = (f"def {self.name}({'*, ' + parameters if parameters else ''}) -> list[str]:\n"
                  f"    return _spec_.argv(**locals())\n")  # _spec_: no flag's dest (`command` is one)
        namespace: dict[str, object] = {"_spec_": self}
        exec(source, namespace)  # the flags' dests are identifiers: the spec is ours, not input
        build = namespace[self.name]
        build.__module__ = module  # type: ignore[attr-defined]
        build.__doc__ = f"`{' '.join(self.words)}`: {self.help}"
        return build  # type: ignore[return-value]

    def add_to(self, subparsers: argparse._SubParsersAction, handler: Callable[[argparse.Namespace], object],
               helps: Mapping[str, str] | None = None, **parser_options: object) -> argparse.ArgumentParser:
        """The agent's parser for the last word, under `subparsers`; its handler checks the rules first.
        `helps`: a flag's help as only the agent can word it (from what it alone imports), by dest."""
        parser = subparsers.add_parser(self.words[-1], **{"help": self.help, **parser_options})
        for flag in self.flags:
            options: dict[str, object] = {"help": (helps or {}).get(flag.dest, flag.help)}
            if flag.rest:
                parser.add_argument(flag.dest, nargs=argparse.REMAINDER, **options)  # type: ignore[arg-type]
                continue
            if flag.positional and flag.kind is not None:
                options.update(metavar=flag.metavar)
                if flag.kind.parse is not None:
                    options["type"] = flag.kind.parse
                if flag.kind.choices is not None:
                    options["choices"] = flag.kind.choices
                parser.add_argument(flag.dest, **options)  # type: ignore[arg-type]
                continue
            if flag.kind is None:
                options["action"] = argparse.BooleanOptionalAction if flag.tristate else "store_true"
                if flag.tristate:
                    options["default"] = None
            else:
                options.update(default=flag.default, required=flag.required)
                if flag.repeat:
                    options["action"] = "append"
                if flag.kind.parse is not None:
                    options["type"] = flag.kind.parse
                if flag.kind.choices is not None:
                    options["choices"] = flag.kind.choices
                if flag.metavar is not None:
                    options["metavar"] = flag.metavar
            parser.add_argument(flag.option, dest=flag.dest, **options)  # type: ignore[arg-type]

        def checked(args: argparse.Namespace) -> object:
            problem = self.problem(vars(args))
            if problem:
                raise BadInput(problem)
            return handler(args)

        parser.set_defaults(handler=checked)
        return parser


def _checked(flag: Flag, value: object) -> object:
    if flag.kind is None:
        if value is None or isinstance(value, bool):
            return value if flag.tristate else bool(value)
        raise BadArgument(f"{flag.option}: expected True or False, got {value!r}")
    return None if value is None else flag.kind.check(value, flag.option)


def _annotation(flag: Flag) -> str:
    if flag.kind is None:
        return "bool | None" if flag.tristate else "bool"
    return flag.kind.annotation.removesuffix(" | None") if flag.required else flag.kind.annotation

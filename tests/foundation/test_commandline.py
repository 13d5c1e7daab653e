"""Every builder of the agent's command line (specops.contract.commandline) round-trips through the agent's own
parser (specops.cli): what the agent parses is what the control side built.

The builders are discovered from the module: a new builder without cases here fails
test_every_builder_has_cases, and a keyword no case sets fails test_every_keyword_is_exercised.
"""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from specops import cli
from specops.contract import commandline
from specops.contract.commandline import BadArgument
from specops.contract.protocol import Endpoint
from tests.support.cli import Cli

RUN = "tiny"

CASES: dict[str, list[dict[str, Any]]] = {
    "step_regenerate": [{"run": RUN},
                        {"run": RUN, "backend": "vllm", "stop_server": True, "port": 8123, "part": (1, 3)},
                        {"run": RUN, "require_whole": True, "wait": True}],
    "step_prepare": [{"run": RUN}, {"run": RUN, "samples": 50, "strict": True, "retire": True, "wait": True}],
    "step_extract": [{"run": RUN},
                     {"run": RUN, "samples": 8, "backend": "hf", "batch_tokens": 4096, "processes": 2,
                      "part": (0, 2)},
                     {"run": RUN, "backend": "vllm", "stop_server": True, "port": 9000, "require_whole": True,
                      "retire": True, "wait": True}],
    "step_extract_shard": [{"run": RUN, "shard": 0}, {"run": RUN, "shard": 3}],
    "step_validate": [{"run": RUN}, {"run": RUN, "fidelity_samples": 2, "reference": "vllm", "wait": True}],
    "step_vocab": [{"run": RUN}, {"run": RUN, "wait": True}],
    "step_train": [{"run": RUN}, {"run": RUN, "fresh": True, "epochs": 3, "gpus": 0, "dry_run": True, "wait": True},
                   {"run": RUN, "nnodes": 2, "node_rank": 1, "rdzv_endpoint": "10.0.0.1:29400",
                    "rdzv_id": "tiny-20260101-000000", "local_addr": "10.0.0.2", "interface": "eth1"},
                   {"run": RUN, "fresh": True, "sweep": ["train.lr=1e-3,3e-4", "draft.num_layers=1,2"]}],
    "step_evaluate": [{"run": RUN}, {"run": RUN, "checkpoint": "best", "all_epochs": True, "prompts": 4,
                                     "backend": "hf", "wait": True},
                      {"run": RUN, "checkpoint": "2"},
                      {"run": RUN, "checkpoint": "2", "backend": "vllm", "sweep": "num_speculative_tokens=1,2,5",
                       "concurrency": "1,8"},
                      {"run": RUN, "sets": {"mtbench": "bench/question.jsonl", "gsm8k": "/data/gsm8k.jsonl"}},
                      {"run": RUN, "reproduce": "/w/runs/tiny/evaluation/record.json"},
                      {"run": RUN, "backend": "vllm", "compare": "none,ngram,suffix,eagle3", "concurrency": "1,8",
                       "prompts": 4, "rounds": 5},
                      {"run": RUN, "compare": "eagle3,dflash@tiny-dflash"}],
    "step_parity": [{"run": RUN}, {"run": RUN, "checkpoint": "last", "serve": True, "wait": True},
                    {"run": RUN, "serve": False}],
    "step_metrics": [{"run": RUN}, {"run": RUN, "no_plot": True}],
    "pipeline": [{"run": RUN}, {"run": RUN, "samples": 16, "backend": "vllm", "skip_patches": True, "wait": True},
                 {"run": RUN, "hosts": ["gpu1", "gpu2"], "node_rank": 1, "rendezvous": "10.0.0.1:29400",
                  "group": "tiny-20260101-000000", "local_addr": "10.0.0.2", "interface": "eth1"},
                 {"run": RUN, "hosts": ["a", "b"], "node_rank": 0, "rendezvous": "[fd00::1]:29400", "group": "g"},
                 {"run": RUN, "hosts": ["a", "b"], "node_rank": 1, "rendezvous": "a:29400", "group": "g",
                  "only": "train", "epochs": 3, "fresh": True},
                 {"run": RUN, "hosts": ["gpu1", "gpu2", "gpu3"], "node_rank": 2, "rendezvous": "gpu1:29400",
                  "group": "g", "train_hosts": ["gpu3"]}],
    "vllm_extract": [{"run": RUN}, {"run": RUN, "port": 8123, "endpoint": "http://10.0.0.1:8000/v1", "samples": 8,
                                     "gpus": 0, "part": (1, 2), "validate": True, "fidelity_samples": 2, "wait": True},
                     {"run": RUN, "require_whole": True}],
    "job_launch": [{"name": "train", "command": ["/usr/bin/python3", "-m", "specops", "step", "train", "--run", RUN]},
                   {"name": "extract", "run": RUN, "command": ["sh", "-c", "echo --run $1", "x", "--flag"],
                    "env": {"SPECOPS_SERVE_PYTHON": "/opt/serve/bin/python", "EMPTY": ""},
                    "revision": {"commit": "abc", "dirty": False}, "meta": {"group": "g-1", "hosts": ["a", "b"]},
                    "wait": True},
                   {"name": "extract", "run": RUN, "command": ["true"], "within": "pipeline-20260101-000000-abcd"}],
    "job_list": [{}, {"all": True}],
    "job_show": [{"job": "train-20260101-000000-abcd"}, {"job": "train", "run": RUN}],
    "job_stop": [{"job": "train-20260101-000000-abcd"}, {"job": "train", "run": RUN, "grace": 5}],
    "job_tail": [{"job": "extract-20260101-000000-abcd", "offset": 0, "follow": True},
                 {"job": "extract", "run": RUN, "lines": 20}],
    "check": [{}, {"gpus": 8, "env": {"serve": "/opt/serve/bin/python", "train": "/opt/train/bin/python"}}],
    "ping": [{}],
    "doctor": [{}, {"run": RUN}, {"run": RUN, "backend": "vllm", "serve_python": "/opt/serve/bin/python"},
               {"run": RUN, "as_patched": True},
               {"run_json": '{"target": "m"}', "site": ["/opt/site-a", "/opt/site-b"], "checks": "api,flags",
                "no_import": True}],
    "run_check": [{"run": RUN}, {"run": RUN, "pipeline": True}, {"run": RUN, "pipeline": True, "backend": "vllm"},
                  {"run": RUN, "launch": ["step", "evaluate", "--run", RUN, "--checkpoint", "99"]},
                  {"run": RUN, "serve_python": "/opt/serve/bin/python", "launch": ["pipeline", "--run", RUN]},
                  {"run": RUN, "pipeline": True, "node_rank": 1}],
    "plan": [{"run": RUN}, {"run": RUN, "samples": 10}, {"run": RUN, "role": "serve"}, {"run": RUN, "role": "train"},
             {"run": RUN, "serve_python": "/opt/serve/bin/python"}],
    "run_restore": [{"run": RUN}, {"run": RUN, "retired": "20260101T000000"}],
    "fetch_list": [{"run": RUN}, {"run": RUN, "with_training_state": True, "drop": "snapshot-1"}],
    "patch": [{"action": "verify"}, {"action": "apply", "sets": ["vllm-0.16", "speculators"], "dry_run": True},
              {"action": "verify", "sets": ["vllm-0.16"], "deep": True},
              {"action": "new", "sets": ["vllm-0.16"], "module": "vllm.config", "edited": "/w/tmp/patch-new-x.py",
               "patch_id": "x", "reason": "one line why"},
              {"action": "new", "sets": ["vllm-0.16"], "from_finding": "f-1"},
              {"action": "status", "patches_dir": "/w/patches"}],
}


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    return dict(pair.partition("=")[::2] for pair in pairs)


def _launched(parsed: argparse.Namespace, key: str) -> Any:
    """`job launch` values as the agent's handler reads them."""
    from specops.jobs import commands

    if key == "command":
        return commands._command(parsed.command)
    if key == "env":
        return commands._env_pairs(parsed.env)
    return json.loads(getattr(parsed, key))


# How the agent reads back a value its parser keeps in another form.
DECODED = {
    ("job_launch", "command"): _launched, ("job_launch", "env"): _launched,
    ("job_launch", "revision"): _launched, ("job_launch", "meta"): _launched,
    ("check", "env"): lambda parsed, _key: _env_pairs(parsed.env),
    ("run_check", "launch"): lambda parsed, _key: parsed.launch[1:] if parsed.launch[:1] == ["--"] else parsed.launch,
    ("patch", "edited"): lambda parsed, _key: str(parsed.edited),
    ("patch", "patches_dir"): lambda parsed, _key: str(parsed.patches_dir),
    ("patch", "sets"): lambda parsed, _key: tuple(parsed.sets),
}
NORMAL = {("patch", "sets"): tuple, ("pipeline", "rendezvous"): Endpoint.parse,
          ("step_train", "rdzv_endpoint"): Endpoint.parse,
          ("step_evaluate", "sets"): lambda sets: [f"{name}={file}" for name, file in sets.items()]}


def builders() -> dict[str, Any]:
    return {name: function for name, function in inspect.getmembers(commandline, inspect.isfunction)
            if function.__module__ == commandline.__name__ and not name.startswith("_")}


def parse(argv: list[str]) -> argparse.Namespace:
    return cli.build_parser(argv[0]).parse_args(argv)


def test_every_builder_has_cases() -> None:
    assert sorted(builders()) == sorted(CASES)


def test_every_keyword_is_exercised() -> None:
    for name, function in builders().items():
        keywords = set(inspect.signature(function).parameters)
        set_somewhere = {key for case in CASES[name] for key in case}
        assert keywords == set_somewhere, f"{name}: no case sets {sorted(keywords - set_somewhere)}"


@pytest.mark.parametrize(("name", "case"), [(name, case) for name, cases in CASES.items() for case in cases],
                         ids=lambda value: value if isinstance(value, str) else "")
def test_the_agent_parses_what_was_built(name: str, case: dict[str, Any]) -> None:
    argv = builders()[name](**case)
    assert all(isinstance(part, str) for part in argv)
    parsed = parse(argv)
    assert callable(parsed.handler)  # a whole command, not a group's parser
    for key, built in case.items():
        read = DECODED.get((name, key), lambda parsed, key: getattr(parsed, key))(parsed, key)
        assert read == NORMAL.get((name, key), lambda value: value)(built), f"{name} {key}: {argv}"


def test_the_step_is_the_builders_name() -> None:
    for name in (name for name in builders() if name.startswith("step_")):
        argv = builders()[name](**CASES[name][0])
        assert parse(argv).step == name.removeprefix("step_").replace("_", "-")


@pytest.mark.parametrize(("build", "flag"), [
    (lambda: commandline.step_prepare(run="../etc"), "--run"),
    (lambda: commandline.step_prepare(run=RUN, samples=0), "--samples"),
    (lambda: commandline.step_prepare(run=RUN, samples="many"), "--samples"),
    (lambda: commandline.step_extract(run=RUN, backend="tgi"), "--backend"),
    (lambda: commandline.step_extract(run=RUN, part=(2, 2)), "--part"),
    (lambda: commandline.step_extract(run=RUN, part=(0, 2), require_whole=True), "--part"),
    (lambda: commandline.step_evaluate(run=RUN, checkpoint="newest"), "--checkpoint"),
    (lambda: commandline.step_evaluate(run=RUN, sweep="num_speculative_tokens=0,2"), "--sweep"),
    (lambda: commandline.step_evaluate(run=RUN, sweep="temperature=1"), "--sweep"),
    (lambda: commandline.step_evaluate(run=RUN, concurrency="8"), "--concurrency"),
    (lambda: commandline.step_evaluate(run=RUN, sets={"mt bench!": "q.jsonl"}), "--set"),
    (lambda: commandline.step_evaluate(run=RUN, sweep="num_speculative_tokens=2", concurrency="1,x"), "--concurrency"),
    (lambda: commandline.step_evaluate(run=RUN, compare="none,medusa"), "--compare"),
    (lambda: commandline.step_evaluate(run=RUN, compare="none,none"), "--compare"),
    (lambda: commandline.step_evaluate(run=RUN, compare="ngram@other"), "--compare"),
    (lambda: commandline.step_evaluate(run=RUN, compare="dflash@../x"), "--compare"),
    (lambda: commandline.step_train(run=RUN, gpus=-1), "--gpus"),
    (lambda: commandline.step_train(run=RUN, sweep=["train.lr="]), "--sweep train.lr: no values"),
    (lambda: commandline.step_train(run=RUN, sweep=["train.lr=1,1"]), "--sweep train.lr: 1 appears twice"),
    (lambda: commandline.step_train(run=RUN, sweep=["lr"]), "--sweep: expected KEY=V1,V2"),
    (lambda: commandline.step_train(run=RUN, sweep=["train.lr=1", "train.lr=2"]), "--sweep train.lr: given twice"),
    (lambda: commandline.step_train(run=RUN, sweep=["train.lr=1"], epochs=2), "--sweep and --epochs exclude"),
    (lambda: commandline.step_train(run=RUN, node_rank=1), "--node-rank"),
    (lambda: commandline.step_train(run=RUN, nnodes=2), "--nnodes"),
    (lambda: commandline.step_train(run=RUN, nnodes=2, node_rank=0, rdzv_endpoint="h", rdzv_id="r"),
     "--rdzv-endpoint: 'h' is not HOST:PORT"),
    (lambda: commandline.step_train(run=RUN, nnodes=2, node_rank=0, rdzv_endpoint="h:99999", rdzv_id="r"),
     "--rdzv-endpoint: 'h:99999' is not HOST:PORT"),
    (lambda: commandline.pipeline(run=RUN, hosts=["a", "b"], node_rank=0, rendezvous="h:65535", group="g"),
     "--rendezvous"),
    (lambda: commandline.job_launch(name="x y", command=["true"]), "--name"),
    (lambda: commandline.job_launch(name="x", command=["true"], env={"1BAD": "v"}), "--env"),
    (lambda: commandline.job_stop(job="train", grace=-1), "--grace"),
    (lambda: commandline.job_launch(name="x", command=["true"], wait=True), "--wait"),
    (lambda: commandline.patch(action="explode"), "patch"),
    (lambda: commandline.patch(action="apply", sets=["../x"]), "--set"),
])
def test_a_value_no_agent_command_takes_is_refused_naming_its_flag(build: Any, flag: str) -> None:
    with pytest.raises(BadArgument) as refused:
        build()
    assert str(refused.value).startswith(flag)


@pytest.mark.parametrize("argv", [
    ["step", "regenerate", "--run", RUN, "--part", "0/2", "--require-whole"],
    ["step", "extract", "--run", RUN, "--part", "1/2", "--require-whole"],
    ["vllm", "extract", "--run", RUN, "--part", "1/2", "--require-whole"],
    ["step", "evaluate", "--run", RUN, "--concurrency", "1,8"],
    ["step", "evaluate", "--run", RUN, "--sweep", "num_speculative_tokens=1", "--all-epochs"],
    ["step", "evaluate", "--run", RUN, "--reproduce", "r.json", "--sweep", "num_speculative_tokens=1"],
    ["step", "evaluate", "--run", RUN, "--compare", "none,eagle3", "--sweep", "num_speculative_tokens=1"],
    ["step", "evaluate", "--run", RUN, "--compare", "none,eagle3", "--all-epochs"],
    ["step", "evaluate", "--run", RUN, "--rounds", "3"],
    ["step", "evaluate", "--run", RUN, "--compare", "none,eagle3", "--reproduce", "r.json"],
    ["step", "train", "--run", RUN, "--node-rank", "1"],
    ["step", "train", "--run", RUN, "--sweep", "train.lr=1,2", "--dry-run"],
    ["step", "train", "--run", RUN, "--nnodes", "2", "--node-rank", "1"],
    ["pipeline", "--run", RUN, "--group", "g"],
    ["pipeline", "--run", RUN, "--hosts", "a,b", "--node-rank", "0"],
    ["pipeline", "--run", RUN, "--hosts", "a,a", "--node-rank", "0", "--rendezvous", "h:1", "--group", "g"],
    ["pipeline", "--run", RUN, "--hosts", "a,b", "--node-rank", "2", "--rendezvous", "h:1", "--group", "g"],
    ["pipeline", "--run", RUN, "--train-hosts", "b"],
    ["pipeline", "--run", RUN, "--hosts", "a,b", "--node-rank", "0", "--rendezvous", "h:1", "--group", "g",
     "--train-hosts", "c"],
    ["pipeline", "--run", RUN, "--hosts", "a,b", "--node-rank", "0", "--rendezvous", "h:1", "--group", "g",
     "--train-hosts", "a,b"],
    ["pipeline", "--run", RUN, "--epochs", "3"],
    ["pipeline", "--run", RUN, "--fresh"],
], ids=lambda argv: " ".join(argv[:2]))
def test_a_rule_between_flags_refuses_alike_on_both_sides(argv: list[str]) -> None:
    """One rule, declared once in the command's spec: the builder refuses the values with the same line
    the agent refuses their command line with, before the step's handler (or its run lock) is reached."""
    from specops.contract.errors import BadInput

    parsed = parse(argv)
    with pytest.raises(BadInput) as agent_refused:
        parsed.handler(parsed)
    builder = builders()["_".join(argv[:1] if argv[0] == "pipeline" else argv[:2])]
    values = {key: value for key, value in vars(parsed).items()
              if key not in {"command", "step", "vllm_command", "handler"}}
    with pytest.raises(BadArgument) as builder_refused:
        builder(**{key: value for key, value in values.items()
                   if key in inspect.signature(builder).parameters and value is not None})
    assert str(builder_refused.value) == str(agent_refused.value)
    assert "\n" not in str(agent_refused.value)


@pytest.mark.parametrize(("argv", "name", "values"), [
    (["doctor", "--run", RUN, "--run-json", "{}"], "doctor", {"run": RUN, "run_json": "{}"}),
    (["doctor", "--as-patched"], "doctor", {"as_patched": True}),
    (["doctor", "--backend", "vllm"], "doctor", {"backend": "vllm"}),
    (["patch", "verify", "--dry-run"], "patch", {"action": "verify", "dry_run": True}),
    (["patch", "apply", "--deep"], "patch", {"action": "apply", "deep": True}),
    (["patch", "status", "--id", "x"], "patch", {"action": "status", "patch_id": "x"}),
    (["job", "launch", "--name", "x", "--wait", "--", "true"], "job_launch",
     {"name": "x", "wait": True, "command": ["true"]}),
], ids=lambda value: " ".join(value[:2]) if isinstance(value, list) else "")
def test_the_host_commands_rules_refuse_alike_on_both_sides(argv: list[str], name: str,
                                                             values: dict[str, Any]) -> None:
    """job launch, doctor and patch: their rules are their specs' too, one line on either side."""
    from specops.contract.errors import BadInput

    parsed = parse(argv)
    with pytest.raises(BadInput) as agent_refused:
        parsed.handler(parsed)
    with pytest.raises(BadArgument) as builder_refused:
        builders()[name](**values)
    assert str(builder_refused.value) == str(agent_refused.value) and "\n" not in str(agent_refused.value)


@pytest.mark.parametrize("endpoint", ["h", "h:99999"])
def test_a_rendezvous_endpoint_is_parsed_once_where_the_agent_reads_it(endpoint: str) -> None:
    """--rdzv-endpoint reaches the training as an Endpoint (specops.pipeline.hosts.TorchrunNode), or one line."""
    from specops.contract.errors import BadInput

    with pytest.raises(BadInput, match=f"^--rdzv-endpoint: '{endpoint}' is not HOST:PORT$"):
        parse(["step", "train", "--run", RUN, "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", endpoint,
               "--rdzv-id", "r"])


def test_invoke_text_becomes_numbers_once() -> None:
    """The tasks hand invoke's text to the builders: checked and converted here, nowhere else."""
    assert commandline.step_prepare(run=RUN, samples="50") == ["step", "prepare", "--run", RUN, "--samples", "50"]
    assert parse(commandline.step_train(run=RUN, gpus="0")).gpus == 0


def test_remote_builds_no_agent_argv_by_hand() -> None:
    """The control side's sources hold no agent flag literal and hand no list literal to the calls that
    reach the agent: every command line comes from a builder."""
    import ast

    root = Path(__file__).resolve().parents[2]
    flags = {"--run", "--samples", "--backend", "--part", "--require-whole", "--skip-doctor", "--no-plot",
             "--grace", "--all", "--name", "--offset", "--follow", "--gpus", "--env", "--set"}
    callers = {"agent_call", "agent_stream", "job_call", "agent_argv", "agent_step_command", "run_step_job"}
    found = []
    for path in [root / "tasks.py", *sorted((root / "remote").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            words = {item.value for item in getattr(node, "elts", []) if isinstance(item, ast.Constant)}
            called = getattr(getattr(node, "func", None), "id", getattr(getattr(node, "func", None), "attr", None))
            if (isinstance(node, ast.List) and words & flags) or (
                    isinstance(node, ast.Call) and called in callers
                    and any(isinstance(arg, ast.List | ast.BinOp) for arg in node.args)):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == []


def test_one_whole_number_parser_on_both_sides() -> None:
    """The builders, the agent's argparse types and the tasks' own number flags read numbers with one parser
    (specops.contract.values.whole_number) and word a refusal alike."""
    from specops.contract import values
    from specops.contract.errors import BadInput

    assert values.whole_number(" 7 ") == values.positive_int("7") == values.whole_flag("7", "--lines") == 7
    assert values.whole_flag(None, "--lines") is None
    for bad, why in (("many", "expected a whole number, got 'many'"), ("0", "must be > 0, got 0"),
                     (True, "expected a whole number, got True")):
        with pytest.raises(BadArgument, match=f"^--samples: {why}$"):
            commandline.step_prepare(run=RUN, samples=bad)
        with pytest.raises(BadArgument, match=f"^--lines: {why}$"):
            values.whole_flag(bad, "--lines")
    with pytest.raises(BadInput, match=r"^must be >= 0, got -1$"):
        values.non_negative_int("-1")
    assert values.positive_list("1, 8", "--concurrency") == [1, 8]


def test_a_tasks_flag_help_is_the_agents(cli: Cli) -> None:
    """An Invoke task that hands a flag to a builder takes that flag's help from the same Flag: written once."""
    evaluate = {flag.dest: flag.help for flag in commandline.STEPS["evaluate"].flags}
    helped = cli("--help", "evaluate")
    assert helped.exit_code == 0
    shown = " ".join(helped.stdout.split())  # invoke wraps the help column
    for dest in ("checkpoint", "backend", "sweep", "concurrency", "sets", "reproduce", "wait"):
        assert " ".join(str(evaluate[dest]).split()) in shown, dest
    assert commandline.PATCH.helps("patch_id", id_="patch_id") == {"patch_id": "new: id of the new patch",
                                                                   "id_": "new: id of the new patch"}
    with pytest.raises(ValueError, match="no flag 'run' with a help"):
        commandline.STEPS["prepare"].helps("run")  # the run flag has no help of its own: the task says its default

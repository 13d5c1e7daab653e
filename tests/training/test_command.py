"""Step 4 without training: the command, layer ids, metrics parsing, the plot, the patch sets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specops.contract.errors import BadInput
from specops.contract.protocol import Endpoint
from specops.patching.spec import load_set
from specops.pipeline.hosts import TorchrunNode
from specops.pipeline.training import metrics, plot
from specops.pipeline.training.command import TrainPlan, aux_layer_ids, build_train_command
from tests.support.repo import REPO

PLAN = TrainPlan(
    verifier="/m/Llama", data_path=Path("/r/prepared"), hidden_states_path=Path("/r/hidden_states"),
    save_path=Path("/r/checkpoints"), target_layer_ids=(2, 16, 29), draft_vocab_size=32000,
    d2t_path=Path("/r/vocab/d2t-32000.npy"), t2d_path=Path("/r/vocab/t2d-32000.npy"), trust_remote_code=True,
    num_layers=1, ttt_steps=3, epochs=5, lr=3e-4,
)


def node(count: int, rank: int, endpoint: str, rdzv_id: str, local_addr: str | None = None,
         interface: str | None = None) -> TorchrunNode:
    """A node as the agent's command line makes it (its endpoint parsed there, specops.contract.commandline)."""
    return TorchrunNode(count, rank, Endpoint.parse(endpoint), rdzv_id, local_addr, interface)


def flag(command: list[str], name: str) -> list[str]:
    """The values following `name` up to the next flag."""
    start = command.index(name) + 1
    end = next((i for i in range(start, len(command)) if command[i].startswith("--")), len(command))
    return command[start:end]


def test_single_gpu_command_is_speculators_train_with_every_setting() -> None:
    command = build_train_command(PLAN, gpus=1)
    assert command[:2] == ["speculators", "train"]
    assert flag(command, "--verifier-name-or-path") == ["/m/Llama"]
    assert flag(command, "--data-path") == ["/r/prepared"]
    assert flag(command, "--hidden-states-path") == ["/r/hidden_states"]
    assert flag(command, "--on-missing") == ["raise"]
    assert flag(command, "--target-layer-ids") == ["2", "16", "29"]
    assert flag(command, "--draft-vocab-size") == ["32000"]
    assert flag(command, "--d2t-path") == ["/r/vocab/d2t-32000.npy"]
    assert flag(command, "--t2d-path") == ["/r/vocab/t2d-32000.npy"]
    assert flag(command, "--ttt-steps") == ["3"] and flag(command, "--epochs") == ["5"]
    assert flag(command, "--lr") == ["0.0003"] and flag(command, "--save-path") == ["/r/checkpoints"]
    assert "--trust-remote-code" in command
    # a GPU keeps speculators' defaults: fused loss, flex attention
    assert "--loss-implementation" not in command and "--draft-attn-impl" not in command


def test_several_gpus_go_through_torchrun_and_the_module_entry_point() -> None:
    command = build_train_command(PLAN, gpus=8)
    assert command[:5] == ["torchrun", "--standalone", "--nproc_per_node=8", "-m", "speculators.train"]
    assert flag(command, "--on-missing") == ["raise"]


def test_one_node_of_several_hosts_goes_through_torchrun_with_a_c10d_rendezvous_at_node_0() -> None:
    command = build_train_command(PLAN, gpus=8, nodes=node(2, 1, "gpu1.example:29500", "tiny-20261201"))
    assert command[:9] == ["torchrun", "--nnodes=2", "--node-rank=1", "--nproc_per_node=8", "--rdzv-backend=c10d",
                           "--rdzv-endpoint=gpu1.example:29500", "--rdzv-id=tiny-20261201", "--max-restarts=0",
                           "-m"]
    assert command[9] == "speculators.train" and flag(command, "--on-missing") == ["raise"]
    # a CPU host is one process, over gloo (the CPU patch set's distributed-gloo-cpu)
    cpu = build_train_command(PLAN, gpus=0, nodes=node(2, 0, "10.0.0.1:29500", "r1"))
    assert "--nproc_per_node=1" in cpu and flag(cpu, "--loss-implementation") == ["eager"]


def test_a_node_with_a_training_address_binds_it_and_node_0_hosts_the_rendezvous() -> None:
    # torch's guesses go by the hostname, which may resolve to loopback or to another network
    host = build_train_command(PLAN, gpus=0, nodes=node(2, 0, "10.0.0.1:29500", "r1", "10.0.0.1"))
    other = build_train_command(PLAN, gpus=0, nodes=node(2, 1, "10.0.0.1:29500", "r1", "10.0.0.5"))
    assert "--local-addr=10.0.0.1" in host and "--rdzv-conf=is_host=1" in host
    assert "--local-addr=10.0.0.5" in other and "--rdzv-conf=is_host=0" in other
    assert host.index("--rdzv-conf=is_host=1") < host.index("-m")  # torchrun's, not the trainer's


def test_the_collectives_use_the_interface_named_or_the_one_holding_the_address() -> None:
    from specops.host.netif import addresses
    from specops.pipeline.training.command import collectives_environment

    assert collectives_environment(node(2, 0, "h:1", "r", None, "lo")) == {
        "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert collectives_environment(node(2, 0, "h:1", "r", "127.0.0.1")) == {
        "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    with pytest.raises(BadInput, match=re.escape("--interface: nosuch0 is not an interface of this host (it has ")):
        collectives_environment(node(2, 0, "h:1", "r", "127.0.0.1", "nosuch0"))
    assert collectives_environment(node(2, 0, "h:1", "r")) == {}  # torch's own choice
    assert "127.0.0.1" in addresses()["lo"]  # the standard-library answer where iproute2 is missing
    with pytest.raises(BadInput, match=re.escape("--local-addr: 203.0.113.254 is not an address of this host")):
        collectives_environment(node(2, 0, "h:1", "r", "203.0.113.254"))


@pytest.mark.parametrize(("nodes", "message"), [
    ((2, 0, "h:1", "r", "gpu1"), "--local-addr: 'gpu1' is not an IP address"),
    ((2, 0, "h:1", "r", None, "eth 0"), "--interface: 'eth 0' is not a network interface name"),
    ((1, 0, "h:1", "r"), "--nnodes: a training over hosts needs at least 2, got 1"),
    ((2, 2, "h:1", "r"), "--node-rank: 2 is not in 0..1"),
    ((2, 0, "h:1", "a b"), "--rdzv-id: 'a b' is not a simple id"),
])
def test_a_bad_node_placement_is_bad_input(nodes: tuple, message: str) -> None:
    with pytest.raises(BadInput, match=re.escape(message)):
        build_train_command(PLAN, gpus=0, nodes=node(*nodes))


def test_cpu_command_uses_eager_loss_sdpa_and_no_loader_workers() -> None:
    command = build_train_command(PLAN, gpus=0)
    assert flag(command, "--loss-implementation") == ["eager"]
    assert flag(command, "--draft-attn-impl") == ["sdpa"]
    assert flag(command, "--num-workers") == ["0"]


def test_explicit_settings_and_extra_args_win() -> None:
    plan = TrainPlan(**{**PLAN.__dict__, "loss_implementation": "fused", "draft_attn_impl": "eager",
                        "extra_args": ("--num-workers", "4")})
    command = build_train_command(plan, gpus=0)
    assert flag(command, "--loss-implementation") == ["fused"]
    assert flag(command, "--draft-attn-impl") == ["eager"]
    assert command[-2:] == ["--num-workers", "4"]  # argparse: the last occurrence wins


def test_bad_loss_implementation_is_bad_input() -> None:
    with pytest.raises(BadInput, match="loss_implementation"):
        build_train_command(TrainPlan(**{**PLAN.__dict__, "loss_implementation": "triton"}), gpus=1)


def test_target_layer_ids_drop_the_final_layer() -> None:
    assert aux_layer_ids([2, 16, 29, 32], 32) == (2, 16, 29)
    assert aux_layer_ids([1, 2, 3], 4) == (1, 2, 3)
    with pytest.raises(BadInput, match="must lie in"):
        aux_layer_ids([2, 40, 32], 32)


# What speculators' rich console prints: records wrap at spaces, times repeat as blanks.
RICH_LOG = """\
### specops launch 2026-11-02T10:00:00: ["speculators", "train"]
[10:00:01] INFO     trainer/epochs=2, optimizer/lr=1.00e-04, loss/ttt_steps=3      logger.py:740
[10:00:05] INFO     train/loss_0=0.500, train/full_acc_0=0.100,                  trainer.py:589
                    train/loss=1.500, train/error_records=0.00e+00,
                    profile/step_ms=900.000, profile/tokens_per_s=100.000,
                    epoch=0, lr=9.09e-05, global_step=0
           INFO     train/loss_0=0.400, train/full_acc_0=0.300,                  trainer.py:589
                    train/loss=1.300, profile/step_ms=100.000,
                    profile/tokens_per_s=1000.000, epoch=0, lr/Muon=9.09e-05,
                    lr/AdamW=9.09e-05, global_step=1
           INFO     val/loss_0_epoch=0.450, val/full_acc_0_epoch=0.250,          trainer.py:673
                    val/loss_epoch=1.350, epoch=0
### specops launch 2026-11-02T10:05:00: ["speculators", "train"]
           INFO     Resuming training on epoch 1.                                trainer.py:277
           INFO     train/loss_0=0.300, train/full_acc_0=0.500, train/loss=1.000, trainer.py:589
                    profile/step_ms=500.000, profile/tokens_per_s=200.000,
                    epoch=1, lr=8.0e-05, global_step=2
"""


def test_metrics_table_from_wrapped_rich_log() -> None:
    log = metrics.parse_log(RICH_LOG)
    assert [step.global_step for step in log.steps] == [0, 1, 2] and log.launches == 2
    table = metrics.epoch_table(log)
    assert [row["epoch"] for row in table] == [0, 1]
    first = table[0]
    assert first["steps"] == 2
    assert first["train"]["loss"] == pytest.approx(1.4)
    assert first["train"]["full_acc_0"] == pytest.approx(0.2)
    assert "error_records" not in first["train"]
    assert first["val"] == {"loss_0": 0.45, "full_acc_0": 0.25, "loss": 1.35}
    assert first["tokens_per_s"] == 1000.0  # the launch's first step (compile, warm-up) is left out
    assert table[1]["tokens_per_s"] == 200.0  # an epoch with only a first step keeps it
    assert metrics.loss_per_step(log) == [(0, 1.5), (1, 1.3), (2, 1.0)]


def test_a_replayed_step_replaces_the_earlier_record() -> None:
    replay = RICH_LOG + "  INFO  train/loss=0.9, epoch=1, global_step=2\n"
    assert metrics.parse_log(replay).steps[-1].train["loss"] == 0.9


def test_loss_plot_is_a_png_with_validation_loss_epoch_marks_legend_and_units(tmp_path: Path) -> None:
    drawn = plot.plot_loss(metrics.parse_log(RICH_LOG), tmp_path / "loss.png", run="tiny")
    assert drawn is not None and Path(drawn["path"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn["series"] == [plot.TRAIN_SERIES, plot.VAL_SERIES]
    assert drawn["validation_points"] == [(1, 1.35)]  # epoch 0's validation, at its last step
    assert drawn["epoch_marks"] == [{"epoch": 0, "step": 0}, {"epoch": 1, "step": 2}]
    assert "step" in drawn["x_label"] and "nats" in drawn["y_label"] and "tiny" in drawn["title"]
    empty = metrics.parse_log("")
    assert plot.plot_loss(empty, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


@pytest.mark.wheels
@pytest.mark.parametrize("name", ["speculators-0.9.0-cpu", "speculators-0.9.0-fused-loss",
                                  "speculators-0.9.0-endpoints", "speculators-0.9.0-remote-code",
                                  "speculators-0.9.0-wrapper"])
def test_patch_set_replacements_match_the_pristine_wheel(name: str, tmp_path: Path) -> None:
    from tests.support.wheels import site_with

    site = site_with(tmp_path / "site", ("speculators", "0.9.0"))
    patch_set = load_set(REPO / "patches" / name)
    assert patch_set.package == "speculators"
    # a GPU host never gets the CPU shims; the endpoints, remote-code and wrapper fixes are for every host
    assert patch_set.host == {"speculators-0.9.0-cpu": "cpu", "speculators-0.9.0-fused-loss": "gpu"}.get(name, "any")
    for patch in patch_set.patches:
        source = (site / (patch.module.replace(".", "/") + ".py")).read_text()
        for replacement in patch.replacements:
            assert source.count(replacement.old) == replacement.count, (patch.id, replacement.old)
            source = source.replace(replacement.old, replacement.new)
        compile(source, patch.module, "exec")  # the patched module still parses


def test_optimizer_log_freq_and_loader_workers_reach_speculators() -> None:
    plan = TrainPlan(**{**PLAN.__dict__, "optimizer": "adamw", "log_freq": 10, "loader_workers": 6})
    for gpus in (1, 2):
        command = build_train_command(plan, gpus=gpus)
        assert flag(command, "--optimizer") == ["adamw"]
        assert flag(command, "--log-freq") == ["10"]
        assert flag(command, "--num-workers") == ["6"]
    # an explicit worker count wins on a CPU host too, and is the only --num-workers given
    command = build_train_command(plan, gpus=0)
    assert flag(command, "--num-workers") == ["6"] and command.count("--num-workers") == 1


def test_unset_optimizer_log_freq_and_workers_leave_speculators_defaults() -> None:
    command = build_train_command(PLAN, gpus=1)
    assert "--optimizer" not in command and "--log-freq" not in command and "--num-workers" not in command


@pytest.mark.parametrize(("field", "value", "message"), [
    ("optimizer", "sgd", "train.optimizer: 'sgd' is not one of adamw, muon"),
    ("log_freq", 0, "train.log_freq: 0 is not a whole number > 0"),
    ("loader_workers", -1, "train.loader_workers: -1 is not a whole number >= 0"),
])
def test_bad_optimizer_log_freq_or_workers_are_bad_input(field: str, value: object, message: str) -> None:
    with pytest.raises(BadInput) as raised:
        build_train_command(TrainPlan(**{**PLAN.__dict__, field: value}), gpus=1)
    assert str(raised.value) == message


def test_the_trainer_runs_with_its_numerics_pinned_and_a_hosts_own_value_wins(tmp_path: Path) -> None:
    """Issue 53: what a warm cache or a GPU's timings would choose is pinned in the trainer's environment (the
    fused loss's tile, Inductor's reduction configs); a value the host's environment names is kept."""
    import json
    import sys

    from specops.pipeline.training.command import LOG_FILE, PINNED, pinned_numerics, run_training, train_environment

    assert PINNED == {"SPECOPS_FIXED_LOSS_TILE": "1", "TORCHINDUCTOR_DETERMINISTIC": "1"}
    names = sorted(PINNED)
    show = [sys.executable, "-c", f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {names}}}))"]
    given_back = {"TORCHINDUCTOR_DETERMINISTIC": "0"}  # the host gives one choice back to timing
    for host, seen in (({}, PINNED), (given_back, {**PINNED, **given_back})):
        save = tmp_path / str(len(host))
        base = {"PATH": "/usr/bin:/bin", **host}
        assert run_training(show, save, env=base) == 0
        assert json.loads((save / LOG_FILE).read_text().splitlines()[-1]) == seen
        assert pinned_numerics(train_environment(base)) == seen  # what the step's record says it ran with

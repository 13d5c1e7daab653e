"""What the pipeline's tasks print for people: the sweep and acceptance tables, the vocabulary's coverage,
the pipeline's summary, what a fetch brought. Each takes the agent's JSON document (`--json` prints that)."""

from __future__ import annotations

from typing import Any

from remote.tasks.shared import number_text


def render_coverage(result: dict[str, Any]) -> None:
    """The draft vocabulary's coverage of the assistant tokens, one row per vocabulary size."""
    from remote import render

    view = render.table("draft vocabulary coverage of assistant tokens", ["draft vocab", "covered"])
    for row in result.get("coverage") or []:
        view.add_row(str(row["draft_vocab"]), f"{100 * row['share']:.2f}%")
    render.console().print(view)


def render_sweep(document: dict[str, Any]) -> None:
    """One row per cell: acceptance, per position, and with vllm tokens/s with and without the draft."""
    from remote import render

    served = document.get("backend") == "vllm"
    columns = ["k", "concurrency", "mean acceptance length", "accepted / drafted", "per position"]
    if served:
        columns += ["tokens/s with draft", "tokens/s without", "speedup"]
    view = render.table(f"sweep of checkpoint {document.get('checkpoint')} on {document.get('prompts')} held-out "
                        f"prompts ({document.get('backend')}, {document.get('max_tokens')} tokens each)", columns)
    for cell in document.get("cells") or []:
        row = [str(cell["num_speculative_tokens"]), str(cell["concurrency"]), f"{cell['mean_acceptance_length']:.3f}",
               f"{cell['num_accepted_tokens']} / {cell['num_draft_tokens']}",
               " / ".join(f"{value:.3f}" for value in cell.get("per_position_acceptance") or [])]
        if served:
            row += [number_text(cell.get("tokens_per_s_spec")), number_text(cell.get("tokens_per_s_base")),
                    "-" if cell.get("speedup") is None else f"{cell['speedup']:.2f}x"]
        view.add_row(*row)
    render.console().print(view)
    if document.get("plot"):
        render.console().print(f"plot: {document['plot']} (on the host; `invoke fetch` brings it home)")


def render_train_sweep(document: dict[str, Any]) -> None:
    """`train --sweep`: one row per setting, per set its mean acceptance length (per position; untrained), its
    epochs and last loss; the best per set and overall with its margin over the runner-up."""
    from remote import render

    sets = document.get("sets") or []
    view = render.table(f"training sweep of run {document.get('run')}: {len(document.get('rows') or [])} settings",
                        ["setting", "epochs", "last loss",
                         *[f"{name}: mean acceptance length (per position; untrained)" for name in sets]])
    best = document.get("best") or {}
    for row in document.get("rows") or []:
        label = row["label"] + (" (the run's own)" if row.get("own") else "") + (
            " *" if row["label"] == best.get("label") else "")
        if row.get("status") != "done":
            view.add_row(label, f"failed: {row.get('error')}", *[""] * (len(sets) + 1))
            continue
        cells = [label, str(row.get("epochs", "-")), number_text(row.get("loss_last"), 4)]
        for name in sets:
            figures = (row.get("sets") or {}).get(name) or {}
            length = figures.get("mean_acceptance_length")
            cells.append("-" if length is None else f"{length:.3f} ("
                         + " / ".join(f"{value:.2f}" for value in figures.get("per_position_acceptance") or [])
                         + f"; {number_text(figures.get('untrained'), 3)})")
        view.add_row(*cells)
    out = render.console()
    out.print(view)
    for name, ranked in (best.get("per_set") or {}).items():
        out.print(f"best on {name}: {ranked['label']}, {ranked['score']:.3f}" + _margin(ranked))
    if best:
        out.print(f"best overall (* above; {best['by']}): {best['label']}, {best['score']:.3f}" + _margin(best))
    if document.get("file"):
        out.print(f"sweep: {document['file']} (on the host)")


def _margin(ranked: dict[str, Any]) -> str:
    if ranked.get("runner_up") is None:
        return " (the only setting scored)"
    return f", {ranked['margin']:+.3f} over {ranked['runner_up']}"


def render_compare(document: dict[str, Any]) -> None:
    """One row per speculator kind: acceptance per set (mean acceptance length and per position), with vllm the
    output tokens/s and the speedup against none at each concurrency; a kind with no number says why; the best."""
    from remote import render

    sets = ["heldout", *(document.get("sets") or {})]
    concurrency = document.get("concurrency") or []
    served = document.get("backend") == "vllm"
    columns = ["kind", *[f"{name}: mean acceptance length (per position)" for name in sets]]
    if served:
        columns += [f"tokens/s c={c}" for c in concurrency] + [f"speedup c={c}" for c in concurrency]
    view = render.table(f"speculators compared on {document.get('prompts')} held-out prompts "
                        f"({document.get('backend')}, k={document.get('num_speculative_tokens')}, "
                        f"{document.get('max_tokens')} tokens each)", columns)
    for row in document.get("rows") or []:
        if row.get("unavailable"):  # one line, never a number
            view.add_row(row["label"], row["unavailable"], *[""] * (len(columns) - 2))
            continue
        acceptance = row.get("acceptance") or {}
        cells = [row["label"]]
        for name in sets:
            figures = acceptance.get(name)
            cells.append("-" if not figures else f"{figures['mean_acceptance_length']:.3f} ("
                         + " / ".join(f"{value:.2f}" for value in figures.get("per_position_acceptance") or [])
                         + ")")
        if served:
            by_c = {cell["concurrency"]: cell for cell in row.get("speed") or []}
            cells += [number_text((by_c.get(c) or {}).get("tokens_per_s"), 2) for c in concurrency]
            cells += ["-" if (by_c.get(c) or {}).get("speedup") is None else f"{by_c[c]['speedup']:.2f}x"
                      for c in concurrency]
        view.add_row(*cells)
    out = render.console()
    out.print(view)
    for best in document.get("best") or []:
        text = f"best at concurrency {best['concurrency']}: {best['label']}, {best['tokens_per_s']:.2f} tokens/s"
        if best.get("speedup") is not None:
            text += f" ({best['speedup']:.2f}x none)"
        if best.get("runner_up"):
            text += f", {100 * best['margin']:.1f}% ahead of {best['runner_up']}"
        out.print(text, highlight=False)
    if document.get("speedup_note"):
        out.print(f"speedup {document['speedup_note']}", highlight=False)
    if document.get("plot"):
        out.print(f"plot: {document['plot']} (on the host; `invoke fetch` brings it home)", highlight=False)


def render_evaluation(evaluation: dict[str, Any] | None) -> None:
    """The acceptance table: the trained draft (each epoch with --all-epochs), the untrained one, the previous."""
    if not evaluation or not evaluation.get("report"):
        return
    from remote import render

    trained = evaluation["report"]
    k = len(trained.get("per_position_acceptance") or [])
    columns = ["draft", "mean acceptance length", "accepted / drafted", *[f"pos {p}" for p in range(k)], "speedup"]
    view = render.table(f"acceptance on {trained['prompts']} held-out prompts ({trained['backend']}, k={k})", columns)
    rows = [(f"trained (epoch {row['checkpoint']})", row) for row in evaluation.get("epochs") or []] \
        or [(f"trained ({trained['checkpoint']})", trained)]
    if evaluation.get("untrained"):
        rows.append(("untrained", evaluation["untrained"]))
    if evaluation.get("previous"):
        rows.append((f"previous ({evaluation['previous'].get('checkpoint')})", evaluation["previous"]))
    for label, row in rows:
        positions = [f"{value:.3f}" for value in row.get("per_position_acceptance") or []]
        view.add_row(label, f"{row['mean_acceptance_length']:.3f}",
                     f"{row.get('num_accepted_tokens')} / {row.get('num_draft_tokens')}",
                     *(positions + ["-"] * (k - len(positions))),
                     "-" if row.get("speedup") is None else f"{row['speedup']:.2f}x")
    render.console().print(view)
    if evaluation.get("best"):  # evaluate.checkpoint best: which epoch, and why
        render.console().print(f"best checkpoint by acceptance: {evaluation['best']['why']}", highlight=False)
    render_sets(evaluation)


def render_sets(evaluation: dict[str, Any]) -> None:
    """Benchmark sets x drafts: ours (trained, untrained) and the published figures, labelled as theirs."""
    sets, compare = evaluation.get("sets") or {}, evaluation.get("compare") or {}
    if not sets:
        return
    from remote import render

    names = list(sets)
    view = render.table("mean acceptance length per benchmark set", ["draft", *names])
    first = next(iter(sets.values()))
    view.add_row(f"trained ({first['trained']['checkpoint']}, {first['trained']['backend']})",
                 *(f"{sets[name]['trained']['mean_acceptance_length']:.3f}" for name in names))
    view.add_row("untrained", *(f"{sets[name]['untrained']['mean_acceptance_length']:.3f}" for name in names))
    view.add_row("prompts (tokens)", *(f"{sets[name]['prompts']} ({sets[name]['tokens']})" for name in names))
    for label, figures in compare.items():
        view.add_row(f"theirs: {label}", *("-" if figures.get(name) is None else f"{figures[name]:.3f}"
                                           for name in names))
    render.console().print(view)


def acceptance_rows(evaluation: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not evaluation or not evaluation.get("report"):
        return []
    trained, untrained = evaluation["report"], evaluation.get("untrained") or {}
    rows = [("mean acceptance length", f"{trained['mean_acceptance_length']:.3f} trained vs "
             f"{number_text(untrained.get('mean_acceptance_length'))} untrained "
             f"({trained['prompts']} held-out prompts, {trained['backend']})")]
    for name, result in (evaluation.get("sets") or {}).items():  # briefly: the per-set table is above
        rows.append((f"  on {name}", f"{result['trained']['mean_acceptance_length']:.3f} trained vs "
                     f"{number_text(result['untrained'].get('mean_acceptance_length'))} untrained "
                     f"({result['prompts']} prompts)"))
    if evaluation.get("record"):
        rows.append(("evaluation record", f"{evaluation['record']} (on the host: `invoke evaluate --reproduce`)"))
    return rows


def render_summary(summary: dict[str, Any]) -> None:
    from remote import render

    out = render.console()
    view = render.table(f"pipeline — run {summary['run']} on {', '.join(summary['hosts'])}", ["", ""])
    steps = ", ".join(f"{name} {info.get('status')}" for name, info in summary["steps"].items())
    rows = [
        ("steps", steps),
        ("samples", str(summary.get("samples"))),
        ("tokens (assistant)", f"{summary.get('tokens')} ({summary.get('loss_tokens')})"),
        ("hidden-state bytes", render.human_bytes(summary.get("hidden_state_bytes"))),
        ("fidelity", number_text(summary.get("fidelity"))),
        ("loss first → last", f"{number_text(summary.get('loss_first'))} → {number_text(summary.get('loss_last'))}"),
        *acceptance_rows(summary.get("evaluation")),
        ("checkpoints on host", f"{summary.get('saved_on') or summary['host']}: {summary.get('checkpoints')}"),
        ("fetched to", str(summary.get("fetched") or "-")),
        ("elapsed", f"{summary['elapsed_s']} s"),
    ]
    for key, value in rows:
        view.add_row(key, value)
    out.print(view)


def fetched_text(document: dict[str, Any]) -> str:
    """What a fetch brought: which epoch (the newest finished checkpoint), how much, and how far the log went."""
    from remote import render

    best = document.get("best_epoch")
    # speculators' checkpoint_best is the lowest validation loss; evaluate's "best" is the highest acceptance:
    # named for what it is, so the two never read as one claim
    best_text = ("" if best is None or best == document["epoch"]
                 else f"; the lowest validation loss so far is epoch {best}")
    log = (document.get("logs") or {}).get("train.log")
    log_text = f"; train.log up to byte {log['offset']}" if log else ""
    return (f"fetched {document['verified']} files ({render.human_bytes(document['total_bytes'])}, sha256 verified) "
            f"of epoch {document['epoch']} (the newest finished checkpoint, {document['checkpoint']}{best_text})"
            f"{log_text} to {document['destination']}")

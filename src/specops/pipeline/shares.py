"""The shares of a step that runs a share per host (the step table's SHARE_PER_HOST): whether the hosts'
shares fit together. Share logic only: the transport between the hosts is pipeline.hosts (the rendezvous),
which carries each host's plan (`all_gather`) and its files (`exchange`) and knows nothing of shares.
"""

from __future__ import annotations

from typing import Any

from specops.contract.errors import CheckFailed


def shares_fit(step: str, plans: list[dict[str, Any]], names: list[str], amount: str, differ: str) -> None:
    """Every host planned the same work for its share of `step` — the same inputs hash and the same
    `amount` (a plan's key: rows, conversations) — else the shares would not fit together: CheckFailed
    naming each host's plan and what may differ between them."""
    if len({(plan["inputs_hash"], plan[amount]) for plan in plans}) > 1:
        shown = ", ".join(f"{name}: {plan['inputs_hash'][:12]} of {plan[amount]} {amount}"
                          for name, plan in zip(names, plans, strict=True))
        raise CheckFailed(f"{step} across hosts: the hosts planned different work ({shown}); their {differ} "
                          "differ, so their shares would not fit together")

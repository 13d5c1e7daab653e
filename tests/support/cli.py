"""testing.cli, under the name the tests have always imported it by (testing/ is shared with bench/)."""

from testing.cli import INVOKE, REPO, Cli, CliResult, write_inventory

__all__ = ["INVOKE", "REPO", "Cli", "CliResult", "write_inventory"]

"""testing.agent, under the name the tests have always imported it by (testing/ is shared with bench/)."""

from testing.agent import (
    PYTHON,
    QUIET,
    REPO,
    SRC,
    Agent,
    agent_argv,
    agent_env,
    group_alive,
    one_document,
    python_job,
    run_agent,
    start_agent,
    wait_until,
)

__all__ = [
    "PYTHON", "QUIET", "REPO", "SRC", "Agent", "agent_argv", "agent_env", "group_alive", "one_document",
    "python_job", "run_agent", "start_agent", "wait_until",
]

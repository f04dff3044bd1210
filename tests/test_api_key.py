"""Servers started with `--api-key`: the worker sends EAGLE_SYNTH_SERVER_API_KEY as a bearer
token to every server; a server that refuses it is refused (status says why) and no prompt is
burned. The real vLLM's side is in tests/test_real_vllm.py; what each server guards, in
tests/test_devserver_settings.py (SGLang) and tests/test_vllm.py (vLLM)."""

from __future__ import annotations

from eagle_synth.state.node_state import REFUSED, NodeState
from eagle_synth.testing.harness import free_port, wait_for
from tests.helpers import (
    assert_exactly_once,
    campaign,
    cli,
    enqueue_rows,
    folder_text,
    records_by_key,
    redis_text,
    wait_finished,
)
from tests.tcp_forward import TcpForward
from tests.test_exactly_once import FAST, single_rows
from tests.test_preflight import gate_state

KEY, ROTATED = "sk-sglang-not-for-records", "sk-rotated-not-for-records"
PROMPTS = 32
# Slow enough that the campaign is mid-way when the key changes (about 0.8 s a prompt).
SLOW = ("--token-latency", "0.02", "--mean-output-tokens", "40", "--slots", "8")


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_a_worker_without_the_key_is_refused_at_start_naming_the_variable(tmp_path, redis_server, stack):
    _, url = stack.devserver("--api-key", KEY)
    start = ("worker", "--server", url, "--out", str(tmp_path / "out"), "--redis", redis_server.url)
    refused = cli(*start, check=False, env={"EAGLE_SYNTH_SERVER_API_KEY": ""})
    assert refused.returncode == 2, refused.stderr.decode()
    assert "answered 401 (Unauthorized): the server checks an API key" in refused.stderr.decode()
    assert "set EAGLE_SYNTH_SERVER_API_KEY to it" in refused.stderr.decode()


def test_a_key_rotated_mid_campaign_refuses_the_server_and_burns_no_prompt(
    tmp_path, redis_server, stack, tokenizer_path
):
    """The server behind the worker's address restarts with another key (here: a forwarder
    switched to a second server). Its /health stays open, so only the batches see the 401: the
    server is refused, the worker exits 2, nothing is failed; restarted with the new key, it
    finishes the campaign exactly once. The key is in no log, Redis value, record or manifest."""
    enqueue_rows(tmp_path, redis_server.url, "rot", single_rows(PROMPTS), tokenizer=tokenizer_path, batch_size=4)
    first, first_url = stack.devserver("--api-key", KEY, *SLOW)
    _, second_url = stack.devserver("--api-key", ROTATED, *SLOW)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    forward = TcpForward(port, port_of(first_url))
    try:
        out = tmp_path / "out"
        worker = stack.worker(
            servers=[url], out=out, redis_url=redis_server.url, env={**FAST, "EAGLE_SYNTH_SERVER_API_KEY": KEY}
        )
        c = campaign(redis_server.url, "rot")
        wait_for(lambda: c.progress().done >= 4, timeout=120, what="the first records")
        forward.target_port = port_of(second_url)  # new connections reach the server with the new key
        first.stop()  # and the old server's connections close
        wait_for(lambda: not worker.alive(), timeout=120, what="the worker to exit")
        assert worker.proc.returncode == 2, worker.log()[-3000:]
        progress = c.progress()
        assert progress.failed == 0 and progress.done < PROMPTS, "nothing burned, the rest left to do"
        assert len(records_by_key(out / "rot")) == progress.done
        # `status` no longer lists a worker whose process it knows is gone; what it published
        # before it exited is still in its heartbeat hash until the hash lapses.
        node = worker.args[worker.args.index("--name") + 1]
        published = NodeState(c.client, node).states()[url]
        assert published.state == "refused", published
        assert "is not the key the server was started with" in published.detail
        again = stack.worker(
            servers=[url], out=out, redis_url=redis_server.url, env={**FAST, "EAGLE_SYNTH_SERVER_API_KEY": ROTATED}
        )
        wait_finished(redis_server.url, "rot", expected=PROMPTS, stack=stack, timeout=180)
        assert_exactly_once(redis_server.url, "rot", out / "rot", expected=PROMPTS)
        assert c.progress().failed == 0
        for where, text in (
            ("logs", worker.log() + again.log()),
            ("Redis", redis_text(c.client)),
            ("--out", folder_text(out)),
        ):
            assert KEY not in text and ROTATED not in text, f"an API key is in the {where}"
    finally:
        forward.close()


def test_a_proxy_that_wants_a_key_even_for_health_refuses_the_server(redis_server):
    """SGLang and vLLM leave /health open; an authenticating proxy in front may not. Its 401
    refuses the server at the health probe instead of leaving it `loading` for ever."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Proxy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{proxy.server_address[1]}"
        state, _ = gate_state(redis_server.url, url)
        assert state.state == REFUSED and "/health answered 401" in state.detail, state.detail
        assert "set EAGLE_SYNTH_SERVER_API_KEY to it" in state.detail
    finally:
        proxy.shutdown()

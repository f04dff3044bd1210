"""DevServerApp: what each devserver endpoint answers, independent of the HTTP transport.

Every endpoint method takes the raw request body and returns a Reply; the transport
(`server.py`) writes it, drops the connection, or lets the app die afterwards.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from eagle_synth.devserver.config import DevServerConfig
from eagle_synth.devserver.faults import DROP, FAIL, MALFORMED, FaultPlan, GenerateFate, malform
from eagle_synth.devserver.generation import Completion, Generator
from eagle_synth.devserver.prefix_cache import PrefixCache
from eagle_synth.devserver.protocol import (
    SAMPLING_400_VERSION,
    PromptRequest,
    ProtocolError,
    ServerRules,
    parse_generate_request,
    version_tuple,
)
from eagle_synth.devserver.scheduler import (
    ABORTED_RUNNING,
    ABORTED_WAITING,
    KILLED,
    QueueFullError,
    SlotJob,
    SlotScheduler,
)
from eagle_synth.devserver.stats import DevStats
from eagle_synth.devserver.vocab import ModelVocab

log = logging.getLogger("eagle_synth.devserver")

# Body of an uncaught exception in SGLang's FastAPI server (unknown sampling key, ...).
INTERNAL_ERROR_BODY = b"Internal Server Error"
# What /flush_cache says on success (SGLang's wording).
FLUSH_OK_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)
# meta_info.weight_version of newer SGLang versions; clients must tolerate such extra fields.
WEIGHT_VERSION = "default"
# SGLang's warning on every call of a deprecated info endpoint ({old} -> {new}).
DEPRECATED_ENDPOINT_WARNING = (
    "Endpoint '{old}' is deprecated and will be removed in a future version. Please use '{new}' instead."
)


@dataclass(slots=True)
class Reply:
    """What the transport does with a request.

    Parameters:
        status: HTTP status.
        body: response bytes.
        content_type: response content type.
        drop: close the connection without any response instead.
        die_reason: after replying (or dropping), the server dies with this log message.
        trickle: seconds between the body's bytes (0: all at once), as a stuck proxy sends them.
    """

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    drop: bool = False
    die_reason: str | None = None
    trickle: float = 0.0


# What a trickling /health sends, a byte at a time: long enough to outlast any probe timeout.
TRICKLE_BODY = b"." * 4096


def json_reply(obj: Any, status: int = 200) -> Reply:
    """A JSON response."""
    return Reply(status=status, body=json.dumps(obj, separators=(",", ":")).encode())


def text_reply(text: str, status: int = 200) -> Reply:
    """A plain-text response."""
    return Reply(status=status, body=text.encode(), content_type="text/plain; charset=utf-8")


def error_reply(err: ProtocolError) -> Reply:
    """SGLang's answer to a ValueError (400 JSON) or an uncaught exception (500 text)."""
    if err.status == 500:
        return Reply(status=500, body=INTERNAL_ERROR_BODY, content_type="text/plain")
    return json_reply({"error": {"message": err.message}}, status=err.status)


class DevServerApp:
    """The emulated SGLang server behind HTTP: info, health, /generate, faults, death.

    Behaviour: /generate validates like SGLang, dies on an out-of-vocabulary id, generates
    deterministic completions (Generator), holds a slot per prompt for the emulated time
    (SlotScheduler) and answers in SGLang's shape. Health answers 503 until `warmup` seconds
    after `mark_listening()`. Faults come from a seeded FaultPlan. `die()` calls `on_death`
    (the transport stops listening) and then, if config.exit_on_death, ends the process.

    Parameters:
        config: launch arguments.
        vocab: the loaded token space.
        on_death: called once when the server dies, before the process exits.
    """

    def __init__(
        self,
        *,
        config: DevServerConfig,
        vocab: ModelVocab,
        on_death: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.vocab = vocab
        self.generator = Generator(
            vocab=vocab,
            mean_output_tokens=config.mean_output_tokens,
            seed=config.seed,
            length_median=config.length_median,
            length_sigma=config.length_sigma,
        )
        self.cache = PrefixCache()
        self.stats = DevStats()
        self.faults = FaultPlan(
            fail_rate=config.fail_rate,
            drop_rate=config.drop_rate,
            health_fail_rate=config.health_fail_rate,
            die_after=config.die_after,
            seed=config.seed,
            malformed_rate=config.malformed_rate,
        )
        self.rules = ServerRules(
            context_length=config.effective_context_length,
            reserved_tokens=config.draft_reserved_tokens,
            max_req_len=min(config.effective_context_length, self.max_total_num_tokens) - 1,
            allow_auto_truncate=config.allow_auto_truncate,
            preferred=config.preferred_params,
            sampling_errors_are_400=version_tuple(config.sglang_version) >= SAMPLING_400_VERSION,
        )
        self.scheduler = SlotScheduler(
            slots=config.slots,
            max_queued=config.max_queued_requests,
            token_latency=config.token_latency,
            prefill_latency=config.prefill_latency,
            on_done=lambda job, held: self.stats.slot_released(held),
            on_load=self.stats.load,
        )
        self.dead = False
        self._on_death = on_death
        self._death_lock = threading.Lock()
        self._listening_mono: float | None = None
        self._listening_at: float | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    def mark_listening(self) -> None:
        """The port is bound: the warm-up clock starts now."""
        self._listening_mono = time.monotonic()
        self._listening_at = time.time()

    def healthy(self) -> bool:
        """True once listening for at least `warmup` seconds."""
        if self._listening_mono is None:
            return False
        return time.monotonic() - self._listening_mono >= self.config.warmup

    def die(self, reason: str) -> None:
        """Die like SGLang after a fatal GPU error: log, stop listening, exit (or stop)."""
        with self._death_lock:
            if self.dead:
                return
            self.dead = True
        log.error("devserver dying: %s", reason)
        self.scheduler.kill_all()
        self._on_death()
        if self.config.exit_on_death:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    # ---- health and information ----------------------------------------------------------

    def health(self, body: bytes) -> Reply:
        """/health and /health_generate: 503 while warming up (or on a seeded false alarm)."""
        self.stats.count("health_requests")
        if not self.healthy() or self.faults.health_flake():
            self.stats.count("health_unavailable")
            return Reply(status=503)
        if self.config.trickle_health:
            self.stats.count("health_trickled")
            return Reply(status=200, body=TRICKLE_BODY, content_type="text/plain", trickle=self.config.trickle_health)
        return Reply(status=200)

    @property
    def max_total_num_tokens(self) -> int:
        """The KV-cache size reported in server_info: room for every slot at full context, so
        the context (not the cache) is what limits one request, as on a well-sized server."""
        return self.config.slots * self.config.effective_context_length

    def model_info(self, body: bytes) -> Reply:
        """/model_info: answers during warm-up too, as in SGLang."""
        return json_reply(
            {
                "model_path": self.config.effective_model_path,
                "tokenizer_path": self.config.tokenizer,
                "is_generation": True,
                "preferred_sampling_params": self.config.preferred_sampling_params,
                "weight_version": WEIGHT_VERSION,
                "has_image_understanding": False,
                "has_audio_understanding": False,
            }
        )

    def get_model_info(self, body: bytes) -> Reply:
        """/get_model_info: the deprecated form; SGLang logs a warning on every call."""
        self._deprecated("/get_model_info", "/model_info")
        return self.model_info(body)

    def server_info(self, body: bytes) -> Reply:
        """/server_info: launch arguments (secrets included, as SGLang returns them), the
        scheduler's limits and version."""
        c = self.config
        return json_reply(
            {
                "model_path": c.effective_model_path,
                "tokenizer_path": c.tokenizer,
                "served_model_name": c.effective_model_path,
                "host": c.host,
                "port": c.port,
                "context_length": c.context_length,
                "skip_tokenizer_init": c.skip_tokenizer_init,
                "reasoning_parser": c.reasoning_parser,
                "tool_call_parser": c.tool_call_parser,
                "tp_size": 1,
                "dp_size": 1,
                "page_size": 1,
                "max_running_requests": c.slots,
                "max_queued_requests": c.max_queued_requests,
                "random_seed": c.seed,
                "api_key": c.api_key,
                "admin_api_key": c.admin_api_key,
                "ssl_keyfile_password": None,
                "allow_auto_truncate": c.allow_auto_truncate,
                "preferred_sampling_params": c.preferred_sampling_params,
                "sampling_defaults": "model",
                "enable_deterministic_inference": c.enable_deterministic_inference,
                "speculative_algorithm": c.speculative_algorithm,
                "speculative_num_steps": c.speculative_num_steps,
                "speculative_eagle_topk": c.speculative_eagle_topk,
                "speculative_num_draft_tokens": c.speculative_num_draft_tokens,
                "vocab_size": self.vocab.size,
                # From the scheduler (SGLang merges its scheduler_info into server_info).
                "max_total_num_tokens": self.max_total_num_tokens,
                "max_req_input_len": self.rules.max_req_input_len,
                "version": c.sglang_version,
                "devserver": True,
            }
        )

    def get_server_info(self, body: bytes) -> Reply:
        """/get_server_info: the deprecated form; SGLang logs a warning on every call."""
        self._deprecated("/get_server_info", "/server_info")
        return self.server_info(body)

    def _deprecated(self, old: str, new: str) -> None:
        self.stats.count("deprecated_info_calls")
        log.warning(DEPRECATED_ENDPOINT_WARNING.format(old=old, new=new))

    def models(self, body: bytes) -> Reply:
        """/v1/models: `data[0].max_model_len` is the effective context length."""
        path = self.config.effective_model_path
        return json_reply(
            {
                "object": "list",
                "data": [
                    {
                        "id": path,
                        "object": "model",
                        "created": int(self.stats.started_at),
                        "owned_by": "sglang",
                        "root": path,
                        "max_model_len": self.config.effective_context_length,
                    }
                ],
            }
        )

    def flush_cache(self, body: bytes) -> Reply:
        """/flush_cache: refused while requests run or wait, as in SGLang."""
        running, waiting = self.scheduler.load
        if running or waiting:
            return text_reply(
                f"Cache not flushed because there are pending requests. #queue-req: {waiting}, #running-req: {running}",
                status=400,
            )
        self.cache.flush()
        return text_reply(FLUSH_OK_TEXT)

    def abort_request(self, body: bytes) -> Reply:
        """/abort_request {"rid": str | [str], "abort_all": bool}: aborted prompts answer 200
        with finish_reason abort."""
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            return json_reply({"error": {"message": "Invalid JSON body."}}, status=400)
        if not isinstance(req, dict):
            return json_reply({"error": {"message": "The body must be a JSON object."}}, status=400)
        if req.get("abort_all"):
            self.scheduler.abort(rids=None)
        else:
            rid = req.get("rid")
            rids = {rid} if isinstance(rid, str) else {r for r in rid or [] if isinstance(r, str)}
            if rids:
                self.scheduler.abort(rids=rids)
        return Reply(status=200)

    def dev_stats(self, body: bytes) -> Reply:
        """/dev/stats: devserver-only counters for benchmarks and fault tests."""
        running, waiting = self.scheduler.load
        healthy_at = None
        if self._listening_at is not None and self.healthy():
            healthy_at = self._listening_at + self.config.warmup
        return json_reply(
            self.stats.snapshot(
                slots=self.config.slots,
                running=running,
                waiting=waiting,
                healthy=self.healthy(),
                listening_at=self._listening_at,
                healthy_at=healthy_at,
            )
        )

    def dev_reset_stats(self, body: bytes) -> Reply:
        """/dev/reset_stats: zero the counters of /dev/stats."""
        self.stats.reset()
        return json_reply({"ok": True})

    # ---- generation ----------------------------------------------------------------------

    def fated(self, body: bytes, endpoint: str, serve: Callable[[bytes, GenerateFate], Reply]) -> Reply:
        """One generation request (either API) with its fault drawn; the --die-after one dies
        once answered."""
        self.stats.generate_received(healthy=self.healthy())
        fate = self.faults.next_generate()
        reply = serve(body, fate)
        if fate.die_after_response and reply.die_reason is None:
            reply.die_reason = f"--die-after {fate.number}: answered the last allowed {endpoint}"
        return reply

    def hold_slots(self, prompts: list[PromptRequest], completions: list[Completion]) -> list[SlotJob] | None:
        """Each prompt holds a slot for its emulated time (QueueFullError past the queue cap);
        None when the GPU died meanwhile, which drops the reply."""
        jobs = [
            SlotJob(rid=p.rid, group_rid=p.group_rid, output_tokens=len(c.output_ids))
            for p, c in zip(prompts, completions)
        ]
        self.scheduler.submit(jobs)
        for job in jobs:
            job.done.wait()
        return None if any(job.outcome == KILLED for job in jobs) else jobs

    def text(self, prompt: PromptRequest, completion: Completion, output_ids: list[int], aborted: bool) -> str:
        """A reply's text: the rendered completion, or an aborted one's tokens decoded."""
        if aborted:
            return self.vocab.decode(output_ids, skip_special_tokens=prompt.params.skip_special_tokens)
        return self.generator.render_text(completion, prompt.params)

    def generate(self, body: bytes) -> Reply:
        """/generate: SGLang's native generation endpoint, with faults applied."""
        return self.fated(body, "/generate", partial(self._generate, received=time.monotonic()))

    def _generate(self, body: bytes, fate: GenerateFate, *, received: float) -> Reply:
        if fate.action == FAIL:
            self.stats.count("injected_failures")
            return Reply(status=500, body=INTERNAL_ERROR_BODY, content_type="text/plain")
        try:
            req = parse_generate_request(
                json.loads(body),
                rules=self.rules,
                tokenize=None if self.config.skip_tokenizer_init else self.vocab.encode,
            )
        except ValueError:
            self.stats.count("client_errors")
            return json_reply({"error": {"message": "Invalid JSON body."}}, status=400)
        except ProtocolError as err:
            self.stats.count("client_errors")
            if err.status == 500:
                log.error("/generate raised %s", err.message)
            return error_reply(err)

        size = self.vocab.size
        for prompt in req.prompts:
            bad = next((i for i in prompt.input_ids if not 0 <= i < size), None)
            if bad is not None:
                return Reply(
                    drop=True,
                    die_reason=(
                        f"input id {bad} outside the vocabulary [0, {size}): device-side assert "
                        "(real SGLang dies the same way)"
                    ),
                )

        completions = [self.generator.complete(p) for p in req.prompts]
        cached = [self.cache.lookup(p.input_ids) for p in req.prompts]
        try:
            jobs = self.hold_slots(req.prompts, completions)
        except QueueFullError as err:
            self.stats.count("queue_full")
            return json_reply(
                {"object": "error", "message": str(err), "type": "Service Unavailable", "code": 503},
                status=503,
            )
        if jobs is None:
            return Reply(drop=True)

        items = [
            self._item(prompt, completion, job, cached_tokens, received)
            for prompt, completion, job, cached_tokens in zip(req.prompts, completions, jobs, cached)
        ]
        if fate.action == DROP:
            self.stats.count("injected_drops")
            return Reply(drop=True)
        reply_items: list[Any] = list(items)
        if fate.action == MALFORMED and fate.malformed_shape is not None:
            # A 200 whose first item cannot be a record: what a buggy or patched server sends.
            self.stats.count("injected_malformed")
            reply_items[0] = malform(items[0], fate.malformed_shape)
        return json_reply(reply_items[0] if req.single else reply_items)

    def _item(self, prompt, completion, job: SlotJob, cached_tokens: int, received: float) -> dict:
        output_ids = completion.output_ids
        finish: dict[str, Any] = completion.finish_reason
        if job.outcome == ABORTED_WAITING:
            output_ids, finish = [], {"type": "abort", "message": "Abort in waiting queue"}
        elif job.outcome == ABORTED_RUNNING:
            output_ids = output_ids[: job.tokens_done]
            finish = {"type": "abort", "message": "Aborted"}
        else:
            self.cache.insert(prompt.input_ids + output_ids)
        aborted = job.outcome in (ABORTED_WAITING, ABORTED_RUNNING)
        self.stats.prompt_done(output_tokens=len(output_ids), aborted=aborted)
        shown = output_ids
        if self.config.drop_stop_id and finish.get("type") == "stop" and isinstance(finish.get("matched"), int):
            shown = output_ids = [i for i in output_ids[:-1]] if output_ids[-1:] == [finish["matched"]] else output_ids
        if self.config.prefix_bug:
            shown = prompt.input_ids[-self.config.prefix_bug :] + output_ids
        item: dict[str, Any] = {}
        if not self.config.skip_tokenizer_init:
            item["text"] = self.text(prompt, completion, output_ids, aborted)
        item["output_ids"] = shown
        item["meta_info"] = {
            "id": prompt.rid,
            "finish_reason": finish,
            "prompt_tokens": len(prompt.input_ids),
            "completion_tokens": max(0, len(output_ids) - self.config.understate_completion),
            "cached_tokens": cached_tokens,
            "e2e_latency": time.monotonic() - received,
            "weight_version": WEIGHT_VERSION,
        }
        return item

"""VllmApi: what each endpoint of the emulated vLLM server answers (`--api vllm`).

vLLM's OpenAI-compatible server as a token-in/token-out client sees it: /health (200, empty
body), /v1/models (`owned_by` "vllm", `max_model_len`), /version, /v1/completions with
`return_token_ids`, and /server_info only in dev mode (VLLM_SERVER_DEV_MODE=1). It shares the
devserver's generator, slot scheduler, fault plan and counters with the SGLang endpoints
(app.py), so the same campaign gives the same ids, timing and faults on both APIs.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from eagle_synth.devserver.app import Reply, json_reply
from eagle_synth.devserver.faults import DROP, FAIL, MALFORMED, GenerateFate, malform_completion
from eagle_synth.devserver.protocol import ProtocolError, version_tuple
from eagle_synth.devserver.scheduler import ABORTED_RUNNING, ABORTED_WAITING, SlotJob
from eagle_synth.devserver.vllm_protocol import (
    SHORTENS_MAX_TOKENS_FROM,
    ModelNotFound,
    VllmRules,
    parse_completion_request,
)

if TYPE_CHECKING:
    from eagle_synth.devserver.app import DevServerApp

log = logging.getLogger("eagle_synth.devserver")

# vLLM's message when its engine fails mid-request (EngineDeadError / GenerationError), HTTP 500.
ENGINE_ERROR_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
# The dtype the dev-mode configuration reports (the devserver computes nothing).
REPORTED_DTYPE = "bfloat16"


def error_reply(message: str, *, status: int, err_type: str, param: str | None = None) -> Reply:
    """vLLM's ErrorResponse: {"error": {"message", "type", "param", "code"}}."""
    return json_reply({"error": {"message": message, "type": err_type, "param": param, "code": status}}, status=status)


class VllmApi:
    """The vLLM endpoints over a DevServerApp's shared parts.

    Behaviour: /v1/completions validates like vLLM (400s worded as vLLM's, 404 for another
    `model`, ids outside the vocabulary refused rather than fatal), holds a slot per choice
    for its emulated time and answers in vLLM's shape; faults come from the app's FaultPlan
    (500s in vLLM's error shape, drops, malformed 200s, death after the N-th request).

    Parameters:
        app: the devserver application whose generator, scheduler, faults and stats are used.
    """

    def __init__(self, app: DevServerApp) -> None:
        self.app = app
        c = app.config
        self.rules = VllmRules(
            max_model_len=c.effective_context_length,
            vocab_size=app.vocab.size,
            served_model_name=c.effective_served_model_name,
            overrides=c.generation_overrides,
            shortens_max_tokens=version_tuple(c.vllm_version) >= SHORTENS_MAX_TOKENS_FROM,
        )
        self._ignored_logged: set[tuple[str, ...]] = set()

    # ---- health and information ----------------------------------------------------------

    def models(self, body: bytes) -> Reply:
        """/v1/models: the served name, the model path as root, max_model_len."""
        c = self.app.config
        created = int(self.app.stats.started_at)
        return json_reply(
            {
                "object": "list",
                "data": [
                    {
                        "id": c.effective_served_model_name,
                        "object": "model",
                        "created": created,
                        "owned_by": "vllm",
                        "root": c.effective_model_path,
                        "parent": None,
                        "max_model_len": c.effective_context_length,
                        "permission": [
                            {
                                "id": f"modelperm-{uuid.uuid4().hex}",
                                "object": "model_permission",
                                "created": created,
                                "allow_create_engine": False,
                                "allow_sampling": True,
                                "allow_logprobs": True,
                                "allow_search_indices": False,
                                "allow_view": True,
                                "allow_fine_tuning": False,
                                "organization": "*",
                                "group": None,
                                "is_blocking": False,
                            }
                        ],
                    }
                ],
            }
        )

    def version(self, body: bytes) -> Reply:
        """/version."""
        return json_reply({"version": self.app.config.vllm_version})

    def server_info(self, body: bytes) -> Reply:
        """/server_info: only in dev mode, the configuration as `?config_format=json` gives it."""
        c = self.app.config
        if not c.dev_mode:
            return json_reply({"detail": "Not Found"}, status=404)
        config = {
            "model_config": {
                "model": c.effective_model_path,
                "served_model_name": c.effective_served_model_name,
                "tokenizer": c.tokenizer,
                "max_model_len": c.effective_context_length,
                "dtype": REPORTED_DTYPE,
                "seed": c.seed,
                "generation_config": c.generation_config,
                "override_generation_config": json.loads(c.override_generation_config or "{}"),
                "skip_tokenizer_init": c.skip_tokenizer_init,
                "logits_processors": None,
                "runner_type": "generate",
            },
            "scheduler_config": {"max_num_seqs": c.slots, "max_num_batched_tokens": c.effective_context_length},
            "cache_config": {"enable_prefix_caching": True, "kv_cache_dtype": "auto"},
            "parallel_config": {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1},
            "structured_outputs_config": {"reasoning_parser": c.reasoning_parser or ""},
            "speculative_config": None,
        }
        return json_reply({"vllm_config": config, "vllm_env": {}, "system_env": {}})

    def tokenize(self, body: bytes) -> Reply:
        """/tokenize of a text prompt (vLLM's TokenizeCompletionRequest): `tokens`, `count`,
        `max_model_len`; `add_special_tokens` defaults to true, as vLLM's does."""
        try:
            request = json.loads(body)
        except ValueError:
            return error_reply("JSON decode error", status=400, err_type="BadRequestError")
        prompt = request.get("prompt") if isinstance(request, dict) else None
        if not isinstance(prompt, str):
            return error_reply("Field required: ('body', 'prompt')", status=400, err_type="BadRequestError")
        model = request.get("model")
        if model is not None and model != self.rules.served_model_name:
            return error_reply(
                f"The model `{model}` does not exist.", status=404, err_type="NotFoundError", param="model"
            )
        add_special = request.get("add_special_tokens", True) is not False
        tokens = [int(i) for i in self.app.vocab.tokenizer.encode(prompt, add_special_tokens=add_special)]
        return json_reply(
            {"count": len(tokens), "max_model_len": self.rules.max_model_len, "tokens": tokens, "token_strs": None}
        )

    # ---- generation ----------------------------------------------------------------------

    def completions(self, body: bytes) -> Reply:
        """/v1/completions, with faults applied."""
        return self.app.fated(body, "/v1/completions", self._complete)

    def _complete(self, body: bytes, fate: GenerateFate) -> Reply:
        app = self.app
        if fate.action == FAIL:
            app.stats.count("injected_failures")
            return error_reply(ENGINE_ERROR_MESSAGE, status=500, err_type="InternalServerError")
        try:
            req = parse_completion_request(
                json.loads(body),
                rules=self.rules,
                tokenize=None if app.config.skip_tokenizer_init else app.vocab.encode,
            )
        except ValueError:
            app.stats.count("client_errors")
            return error_reply("JSON decode error", status=400, err_type="BadRequestError")
        except ModelNotFound as err:
            app.stats.count("client_errors")
            return error_reply(err.message, status=404, err_type="NotFoundError", param="model")
        except ProtocolError as err:
            app.stats.count("client_errors")
            return error_reply(
                err.message, status=err.status, err_type="BadRequestError", param=getattr(err, "param", None)
            )
        if req.unknown_fields and req.unknown_fields not in self._ignored_logged:
            self._ignored_logged.add(req.unknown_fields)
            log.warning("The following fields were present in the request but ignored: %s", set(req.unknown_fields))

        completions = [app.generator.complete(p) for p in req.prompts]
        jobs = app.hold_slots(req.prompts, completions)  # vLLM has no queue cap: requests wait
        if jobs is None:
            return Reply(drop=True)
        choices, completion_tokens = [], 0
        for i, (prompt, completion, job) in enumerate(zip(req.prompts, completions, jobs)):
            choice, generated = self._choice(i, prompt, completion, job, req.return_token_ids)
            choices.append(choice)
            completion_tokens += generated
        prompt_tokens = sum(len(p.input_ids) for p in req.prompts if p.sample_index == 0)
        reply: dict[str, Any] = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.rules.served_model_name,
            "choices": choices,
            "service_tier": None,
            # vLLM 0.32 answers "vllm-<version>-<build hash>"; the rest as the real CPU build does.
            "system_fingerprint": f"vllm-{app.config.vllm_version}-devserver",
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "completion_tokens": completion_tokens,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
        if fate.action == DROP:
            app.stats.count("injected_drops")
            return Reply(drop=True)
        if fate.action == MALFORMED and fate.malformed_shape is not None:
            app.stats.count("injected_malformed")
            return json_reply(malform_completion(reply, fate.malformed_shape))
        return json_reply(reply)

    def _choice(self, index: int, prompt, completion, job: SlotJob, return_token_ids: bool) -> tuple[dict, int]:
        """One choice of the reply and the tokens it generated."""
        app = self.app
        output_ids = completion.output_ids
        finish = completion.finish_reason
        aborted = job.outcome in (ABORTED_WAITING, ABORTED_RUNNING)
        if aborted:
            output_ids = output_ids[: job.tokens_done]
            finish_reason, stop_reason = "abort", None
        else:
            finish_reason = finish["type"]
            matched = finish.get("matched")
            # vLLM reports the matched stop id or string; the model's EOS is reported as None.
            stop_reason = None if matched is None or matched == app.vocab.eos_id else matched
        app.stats.prompt_done(output_tokens=len(output_ids), aborted=aborted)
        return {
            "index": index,
            "text": "" if app.config.skip_tokenizer_init else app.text(prompt, completion, output_ids, aborted),
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
            "token_ids": output_ids if return_token_ids else None,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt.input_ids if return_token_ids else None,
            "routed_experts": None,
        }, len(output_ids)

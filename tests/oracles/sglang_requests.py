"""Answer request bodies as SGLang 0.5.23's HTTP server does, without a GPU or a model.

Run with the SGLang venv's python. Reads JSON from stdin, a list of servers,

    [{"argv": [...], "context_len": 1024, "vocab_size": 128256,
      "cases": [{"endpoint": "/v1/chat/completions", "body": "<JSON text>"}, ...]}, ...]

where `argv` is the server's launch arguments (what follows `sglang.launch_server`), and
writes, per server, one answer per case to stdout:

    {"status": 400, "error": "Requested token count exceeds ...", "in_stream": false}
    {"status": 200, "error": null, "in_stream": false}    # admitted
    {"status": 200, "error": "...", "in_stream": true}    # /generate streams its errors

Each body takes the path `sglang/srt/entrypoints/http_server.py` gives it, through SGLang's
own code: FastAPI's parse of the route's body type (`GenerateReqInput`, `CompletionRequest`,
`ChatCompletionRequest`; a validation error is a 400, `validation_exception_handler`), the
`/generate` contract check (`generate_contract_error`), the OpenAI serving class's
`handle_request` (`_validate_request`, `_convert_to_internal_request`), then
`TokenizerManager.generate_request`: `GenerateReqInput.normalize_batch_and_arguments`, the
routed-DP-rank check, tokenization, `_validate_one_request` (the context-length and
total-token rules, `--allow-auto-truncate`) and `SamplingParams(...).normalize/verify`. A
request that reaches the scheduler is admitted: what the scheduler checks after that runs on
the GPU host and is not run here (see `SCHEDULER_CHECKS`).

Seams, where only a model or a GPU host has the real thing:

- The tokenizer is the sim's emulated one (`kit.sim.tokens`: a text is ceil(UTF-8 bytes / 4)
  tokens), and a chat's messages are rendered with the sim's chat template
  (`tokens.render_chat`) instead of the model's Jinja template (`_process_messages`).
- The model config is a stand-in with the given context length and vocabulary.
- The tokenizer manager is SGLang's class, built without its `__init__` (which starts ZMQ
  sockets and loads the tokenizer); sending to the scheduler and waiting for its answer are
  replaced by "admitted".
- http_server.py itself cannot be imported (it imports the engine and the scheduler): its
  three generation routes and its validation-error handler are declared again in `Server.app`,
  each citing its line; FastAPI and Starlette run for real, over ASGI calls. An exception no
  SGLang handler catches is Starlette's 500.
- The modules imported on the way that need a GPU stack are answered with `sglang_hooks`'
  inert stubs (none of them is called by these checks); `torch.compile` is a no-op decorator.

(No `from __future__ import annotations` here: FastAPI reads the routes' annotations.)

Nothing here touches a device or the network.
"""

import asyncio
import contextlib
import importlib.util
import json
import logging
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# kit.sim.tokens, the emulated tokenizer (kit.byte_tokenizer), imports the standard library only.
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

import sglang_hooks

from kit.sim import tokens

# Imported by the tokenizer manager and the serving modules, never called by the checks run
# here (quantization, model loading, hub downloads, tool-schema checks).
_STUBBED = (
    "tvm_ffi",
    "transformers",
    "compressed_tensors",
    "gguf",
    "dill",
    "jsonschema",
    "huggingface_hub",
    "einops",
)

# What the scheduler checks on the GPU host after the tokenizer manager admitted a request
# (sglang/srt/managers/scheduler.py, handle_generate_request); not run here.
SCHEDULER_CHECKS = (
    "validate_input_length: input >= max_req_input_len (KV pool or context) -> 400",
    "logprob_start_len higher than the number of input tokens -> 400",
    "init_req_max_new_tokens: max_new_tokens capped at the context left",
)


class Admitted(BaseException):
    """The request reached the scheduler. A BaseException, so that SGLang's
    `except Exception` handlers let it through."""


def prepare_imports() -> None:
    """sglang_hooks' set-up, plus stubs for what the serving path imports."""
    sglang_hooks.prepare_imports()  # first: it decides on stubbing sglang.srt.configs
    missing = tuple(name for name in _STUBBED if importlib.util.find_spec(name) is None)
    if missing:
        sys.meta_path.insert(0, sglang_hooks._ImportStubFinder(missing))
    import torch  # noqa: PLC0415

    def no_compile(model: Any = None, **kwargs: Any) -> Any:
        return model if model is not None else (lambda fn: fn)

    torch.compile = no_compile  # type: ignore[assignment]
    # protocol.py falls back to `StructuralTag = Any` without xgrammar; the function-call
    # modules imported later need the name only.
    import sglang.srt.entrypoints.openai.protocol  # noqa: F401, PLC0415

    if importlib.util.find_spec("xgrammar") is None:
        sys.meta_path.insert(0, sglang_hooks._ImportStubFinder(("xgrammar",)))


class EmulatedTokenizer:
    """The sim's tokenizer with the calls SGLang's request path makes."""

    is_fast = False
    chat_template = None  # the chat is rendered by `Server._render_chat`

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.eos_token_id = tokens.EOS_TOKEN_ID
        self.additional_stop_token_ids = None

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        return tokens.encode(text, self.vocab_size)

    def __call__(self, texts: Any, **kwargs: Any) -> dict[str, Any]:
        if isinstance(texts, str):
            return {"input_ids": self.encode(texts)}
        return {"input_ids": [self.encode(t) for t in texts]}

    def decode(self, ids: Any, **kwargs: Any) -> str:
        return tokens.decode(list(ids))

    def convert_ids_to_tokens(self, ids: Any) -> Any:
        return [tokens.decode_token(i) for i in ids] if isinstance(ids, list) else ""


class Server:
    """SGLang's serving objects over one ServerArgs, with the seams in the module doc."""

    def __init__(self, argv: list[str], context_len: int, vocab_size: int) -> None:
        from sglang.srt.entrypoints.openai.serving_chat import (  # noqa: PLC0415
            OpenAIServingChat,
        )
        from sglang.srt.entrypoints.openai.serving_completions import (  # noqa: PLC0415
            OpenAIServingCompletion,
        )
        from sglang.srt.parser.template_manager import TemplateManager  # noqa: PLC0415
        from sglang.srt.runtime_context import get_context  # noqa: PLC0415
        from sglang.srt.server_args import prepare_server_args  # noqa: PLC0415

        server_args = prepare_server_args(list(argv))
        get_context().set_server_args(server_args)
        self.server_args = server_args
        self.context_len = context_len
        self.tokenizer = EmulatedTokenizer(vocab_size)
        self.tokenizer_manager = self._tokenizer_manager(server_args, context_len, vocab_size)
        templates = TemplateManager()  # no template loaded: see `_render_chat`
        self.chat = OpenAIServingChat(self.tokenizer_manager, templates)
        self.chat._process_messages = self._render_chat  # type: ignore[method-assign]
        self.completion = OpenAIServingCompletion(self.tokenizer_manager, templates)

    def _tokenizer_manager(self, server_args: Any, context_len: int, vocab_size: int) -> Any:
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput  # noqa: PLC0415
        from sglang.srt.managers.tokenizer_manager import TokenizerManager  # noqa: PLC0415
        from sglang.srt.managers.utils import compute_num_reserved_tokens  # noqa: PLC0415
        from sglang.srt.runtime_context import get_serving  # noqa: PLC0415
        from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: PLC0415

        tm = TokenizerManager.__new__(TokenizerManager)
        model_config = SimpleNamespace(
            context_len=context_len,
            vocab_size=vocab_size,
            is_multimodal=False,
            is_generation=True,
            joint_head_config=None,
            pointer_head=None,
            hf_config=SimpleNamespace(architectures=["LlamaForCausalLM"], model_type="llama"),
            hf_eos_token_id=None,
            is_embedding_gemma=False,
            get_default_sampling_params=dict,
        )
        attributes = {
            "server_args": server_args,
            "model_config": model_config,
            "tokenizer": self.tokenizer,
            "processor": None,
            "mm_processor": None,
            "async_dynamic_batch_tokenizer": None,
            "context_len": context_len,
            "max_req_input_len": None,
            "num_reserved_tokens": compute_num_reserved_tokens(),
            "validate_total_tokens": True,
            "allow_auto_truncate": get_serving().allow_auto_truncate,
            "is_generation": True,
            "preferred_sampling_params": None,
            "sampling_params_class": SamplingParams,
            "tokenized_generate_req_type": TokenizedGenerateReqInput,
            "served_model_name": server_args.served_model_name,
            "rid_to_state": {},
            "encoder_dispatch_ready": {},
            "enable_priority_scheduling": False,
            "default_priority_value": None,
            "elastic_worker_count": server_args.dp_size,
            "enable_trace": False,
            "enable_lora": bool(server_args.enable_lora),
            "disaggregation_mode": _disaggregation_mode(server_args),
            "request_logger": SimpleNamespace(
                log_requests=False,
                log_requests_level=0,
                log_received_request=lambda *a, **k: None,
                log_openai_received_request=lambda *a, **k: None,
            ),
            "is_pause": False,
            "is_pause_cond": asyncio.Condition(),
            "model_update_lock": SimpleNamespace(reader_lock=contextlib.nullcontext()),
            "fake_bootstrap_room_counter": 0,
            "event_loop": object(),  # auto_create_handle_loop: the loop "runs" already
        }
        for name, value in attributes.items():
            setattr(tm, name, value)

        async def send(*args: Any, **kwargs: Any) -> None:
            return None

        def wait_one(*args: Any, **kwargs: Any) -> Any:
            async def admitted() -> Any:
                raise Admitted
                yield  # an async generator, as SGLang's

            return admitted()

        async def collect(*args: Any, **kwargs: Any) -> Any:
            raise Admitted

        def stream_batch(*args: Any, **kwargs: Any) -> Any:
            return wait_one()

        tm._send_one_request = send
        tm._send_batch_request = send
        tm._wait_one_response = wait_one
        tm._collect_batch_responses = collect
        tm._stream_batch_responses = stream_batch
        tm.create_abort_task = lambda *a, **k: None
        return tm

    def _render_chat(self, request: Any, is_multimodal: bool, **kwargs: Any) -> Any:
        """`_process_messages` with the sim's chat template in place of the model's."""
        from sglang.srt.entrypoints.openai.protocol import (  # noqa: PLC0415
            MessageProcessingResult,
        )

        messages = [m.model_dump() if hasattr(m, "model_dump") else m for m in request.messages]
        prompt = tokens.render_chat(messages)
        stop = request.stop or []
        return MessageProcessingResult(
            prompt=prompt,
            prompt_ids=tokens.encode(prompt, self.tokenizer.vocab_size),
            image_data=None,
            audio_data=None,
            video_data=None,
            modalities=[],
            stop=[stop] if isinstance(stop, str) else list(stop),
        )

    # -- routes (sglang/srt/entrypoints/http_server.py) ---------------------------------------

    def app(self) -> Any:
        """A FastAPI app with http_server.py's three generation routes, their body types and
        its validation-error handler (http_server.py cannot be imported without the GPU
        stack: it imports the engine and the scheduler)."""
        from http import HTTPStatus  # noqa: PLC0415

        from fastapi import FastAPI, Request  # noqa: PLC0415
        from fastapi.exceptions import RequestValidationError  # noqa: PLC0415
        from fastapi.responses import ORJSONResponse  # noqa: PLC0415
        from sglang.srt.entrypoints.api_contract import generate_contract_error  # noqa: PLC0415
        from sglang.srt.entrypoints.openai.protocol import (  # noqa: PLC0415
            ChatCompletionRequest,
            CompletionRequest,
            ErrorResponse,
        )
        from sglang.srt.managers.io_struct import GenerateReqInput  # noqa: PLC0415

        app = FastAPI()
        tokenizer_manager = self.tokenizer_manager

        @app.exception_handler(RequestValidationError)
        async def validation_exception_handler(request: Request, exc: RequestValidationError):
            # http_server.py:635, the branch for these routes.
            exc_str = str(exc)
            errors_str = str(exc.errors())
            message = f"{exc_str} {errors_str}" if errors_str and errors_str != exc_str else exc_str
            err = ErrorResponse(
                message=message, type=HTTPStatus.BAD_REQUEST.phrase, code=HTTPStatus.BAD_REQUEST
            )
            return ORJSONResponse(status_code=400, content=err.model_dump())

        @app.api_route("/generate", methods=["POST", "PUT"])
        async def generate_request(obj: GenerateReqInput, request: Request):
            # http_server.py:933 and serve_generate_request
            contract_error = generate_contract_error(await request.json())
            if contract_error is not None:
                return ORJSONResponse(status_code=400, content={"error": contract_error})
            try:
                await tokenizer_manager.generate_request(obj, request).__anext__()
            except ValueError as e:
                if obj.stream:  # the stream has started: the error is one of its events
                    raise StreamError(str(e)) from e
                return ORJSONResponse(
                    {"error": {"message": str(e)}},
                    status_code=getattr(e, "status_code", HTTPStatus.BAD_REQUEST),
                )
            raise AssertionError("generate_request answered without reaching the scheduler")

        @app.post("/v1/completions")
        async def openai_v1_completions(request: CompletionRequest, raw_request: Request):
            return await self.completion.handle_request(request, raw_request)

        @app.post("/v1/chat/completions")
        async def openai_v1_chat_completions(request: ChatCompletionRequest, raw_request: Request):
            return await self.chat.handle_request(request, raw_request)

        return app


class StreamError(BaseException):
    """/generate with `stream`: SGLang answers 200 and sends this error as an event."""


async def call(app: Any, endpoint: str, body: bytes) -> dict[str, Any]:
    """POST `body` (JSON text) to `endpoint` of the ASGI `app`; SGLang's answer as
    {"status", "error"} (the error message, None when admitted) and "in_stream" for an
    error sent inside a 200 stream."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": endpoint,
        "raw_path": endpoint.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"sglang")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 30000),
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    response: dict[str, Any] = {"status": None, "body": b""}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            response["status"] = message["status"]
        elif message["type"] == "http.response.body":
            response["body"] += message.get("body", b"")

    try:
        await app(scope, receive, send)
    except Admitted:
        return {"status": 200, "error": None, "in_stream": False}
    except StreamError as exc:
        return {"status": 200, "error": str(exc), "in_stream": True}
    except Exception as exc:
        # Uncaught by SGLang's handlers: Starlette's ServerErrorMiddleware answers 500.
        error = f"Internal Server Error ({type(exc).__name__}: {exc})"
        return {"status": 500, "error": error, "in_stream": False}
    return {"status": response["status"], "error": _message(response["body"]), "in_stream": False}


def _message(raw: bytes) -> str:
    """The message of one of SGLang's error bodies: `{"message"}` (OpenAI's ErrorResponse),
    `{"error": {"message"}}` or `{"error": "..."}` (/generate)."""
    try:
        content = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")
    if isinstance(content, dict):
        error = content.get("error", content)
        if isinstance(error, dict):
            return str(error.get("message", error))
        return str(error)
    return str(content)


def _disaggregation_mode(server_args: Any) -> Any:
    from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: PLC0415

    return DisaggregationMode(server_args.disaggregation_mode)


def main() -> int:
    servers = json.load(sys.stdin)
    real_stdout = sys.stdout
    logging.disable(logging.WARNING)  # SGLang warns about auto-truncation and CPU quantization
    warnings.simplefilter("ignore")  # FastAPI's deprecation of ORJSONResponse, CPU-only kernels
    answers = []
    with contextlib.redirect_stdout(sys.stderr):
        prepare_imports()
        loop = asyncio.new_event_loop()
        for spec in servers:
            app = Server(spec["argv"], spec["context_len"], spec["vocab_size"]).app()
            answers.append(
                [
                    loop.run_until_complete(call(app, case["endpoint"], case["body"].encode()))
                    for case in spec["cases"]
                ]
            )
        loop.close()
    json.dump(answers, real_stdout, sort_keys=True)
    real_stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

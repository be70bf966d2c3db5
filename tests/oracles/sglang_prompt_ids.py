"""SGLang 0.5.23's own prompt ids for chat bodies and texts, without a server or a GPU.

Run with the SGLang CPU venv's python: ``python sglang_prompt_ids.py MODEL_DIR...`` reads JSON
from stdin, ``{"chats": [body, ...], "texts": [str, ...]}``, and writes one line per model folder,
``{"model": MODEL_DIR, "chats": [ids or {"error": str}, ...], "texts": [ids, ...]}`` (one run
for several folders: importing SGLang takes seconds).

Chats go through `OpenAIServingChat._process_messages` itself, on the tokenizer SGLang loads
(`get_tokenizer`) and the templates its `TemplateManager` picks for the model folder; only the
tokenizer manager and the server-wide settings around them are stand-ins. Texts go through the
tokenizer call of `TokenizerManager._tokenize_texts` (``tokenizer([text])``).
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.parser.template_manager import TemplateManager
from sglang.srt.server_args import prepare_server_args, set_global_server_args_for_tokenizer
from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer


class _TokenizerManager(SimpleNamespace):
    def config_value(self, name: str) -> object:
        return None


def main() -> None:
    cases = json.load(sys.stdin)
    for model_dir in sys.argv[1:]:
        print(json.dumps({"model": model_dir, **prompt_ids(model_dir, cases)}), flush=True)


def prompt_ids(model_dir: str, cases: dict) -> dict:
    server_args = prepare_server_args(["--model-path", model_dir, "--device", "cpu"])
    set_global_server_args_for_tokenizer(server_args)
    tokenizer = get_tokenizer(model_dir)
    manager = _TokenizerManager(
        tokenizer=tokenizer,
        model_config=ModelConfig.from_server_args(server_args),
        served_model_name="tiny",
        server_args=server_args,
        processor=None,
    )
    templates = TemplateManager()
    templates.initialize_templates(manager, model_dir)
    serving = OpenAIServingChat.__new__(OpenAIServingChat)
    try:
        OpenAIServingChat.__init__(serving, manager, templates)
    except Exception as exc:  # the stand-in lacks what a real server has; say so
        print(json.dumps({"error": f"OpenAIServingChat.__init__: {exc!r}"}))
        raise
    chats = []
    for body in cases["chats"]:
        try:
            request = ChatCompletionRequest.model_validate(body)
            result = serving._process_messages(request, False)
            chats.append(list(result.prompt_ids))
        except Exception as exc:
            chats.append({"error": repr(exc)})
    texts = [list(tokenizer([t])["input_ids"][0]) for t in cases["texts"]]
    return {"chats": chats, "texts": texts}


if __name__ == "__main__":
    main()

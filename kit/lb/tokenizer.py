"""The served model's tokenizer in the router: a request's prompt ids, as SGLang 0.5.23 makes them.

The router computes a request's token ids once, from the model folder's `tokenizer.json`,
`tokenizer_config.json` (or `chat_template.jinja`) and `config.json`, with the `tokenizers`
package and jinja2, following what SGLang 0.5.23 runs (transformers 5 under it):

1. Loading (transformers' `TokenizersBackend.__init__`, tokenization_utils_tokenizers.py
   ~453-525): the named special tokens of tokenizer_config.json that the vocabulary lacks are
   added as special tokens; the generic class keeps tokenizer.json's post-processor, the Llama
   class rebuilds it as ``[bos] $A [eos]`` (`update_post_processor`, add_bos_token true
   unless the config says false).
2. `/generate` ``text`` and `/v1/completions` ``prompt`` strings: ``tokenizer(text)``, special
   tokens added (tokenizer_manager.py `_tokenize_texts`).
3. `/v1/chat/completions` ``messages`` (serving_chat.py `_apply_jinja_template`, ~2011-2255):
   each message without its null fields, content parts flattened to one string joined by
   spaces (or kept as text parts when the template loops over the content), a final assistant
   message turned into a user one (or, with ``continue_final_message``, cut off and appended to
   the ids afterwards, a leading BOS dropped); the template rendered as transformers'
   `render_jinja_template` does (a sandboxed environment with trim_blocks, lstrip_blocks,
   loopcontrols, its own `tojson`, `raise_exception`, `strftime_now`; the special tokens as
   variables) with ``add_generation_prompt=True``; the text encoded without special tokens when
   the tokenizer adds some to an empty string.

4. Encoding goes through a cache of pieces (`kit.lb.segments.SegmentCache`): the text is cut at
   added tokens and, for the pre-tokenizers where that provably changes no id, before a space
   that follows a letter about every 512 characters; a piece seen before (a system prompt, a shared
   document, earlier turns) is not encoded again, and a long piece that begins as the last
   one seen with its first characters takes the spans the two share from it (one comparison
   per cut tried, no look-up per span). What is new is encoded in one call of the tokenizer's
   `encode_batch_fast` (no character offsets: the same ids for two thirds of the CPU).

Requests outside what is reproduced here get no ids (`None`: the router routes them as it does
without a tokenizer): tools, assistant tool calls, ``input_ids`` given with messages, messages
with fields other than role, content and name, content parts other than text, and batches.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, processors

from kit.lb.config import LbConfig, prompt_sim_workers, prompt_tokenizer_path, prompt_vocab
from kit.lb.errors import LbError
from kit.lb.segments import SegmentCache

log = logging.getLogger("kit.lb")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json")
"""What the router needs from the model folder (and chat_template.jinja where there is one)."""

SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""transformers' SPECIAL_TOKENS_ATTRIBUTES: the special tokens a chat template sees by name."""

_GENERIC_CLASSES = (None, "PreTrainedTokenizerFast", "TokenizersBackend")
_BOS_BY_DEFAULT = ("LlamaTokenizer", "LlamaTokenizerFast")
"""tokenizer_config.json's ``tokenizer_class`` values whose loading is reproduced here (as
transformers 5.19 loads them for SGLang 0.5.23); another class loads the same way, with
`ModelTokenizer.verified` False so that the router says its ids are unverified."""

_MESSAGE_KEYS = frozenset({"role", "content", "name"})
_TEXT_PART_TYPES = ("text", "input_text")


# model_config.get_default_sampling_params: the generation_config.json keys SGLang 0.5.23's chat
# uses for the sampling fields a request leaves unset.
SAMPLING_DEFAULT_KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")


class TokenizerError(LbError):
    """The model folder has no usable tokenizer; the message says which file and why."""


@dataclass(frozen=True)
class ModelLimits:
    """What config.json says about the model's inputs: `vocab_size` rows in the embedding (an id
    outside [0, vocab_size) crashes SGLang 0.5.23) and `max_position_embeddings` (tokens)."""

    vocab_size: int
    max_position_embeddings: int | None


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"{path}: cannot read it ({exc})") from exc
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: not a JSON object")
    return data


def _chat_template(folder: Path, config: Mapping[str, Any]) -> str | None:
    """The default chat template: chat_template.jinja beside the tokenizer wins (transformers 5
    saves it there), else tokenizer_config.json's ``chat_template`` (a string, or a list of
    named templates whose "default" is used when a request has no tools)."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        default = named.get("default")
        return default if isinstance(default, str) else None
    return None


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' own filter: jinja's escapes HTML characters.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def compile_chat_template(source: str) -> jinja2.Template:
    """The template compiled as transformers' `_cached_compile_jinja_template` compiles it."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    template = env.from_string(source)
    # A plain dict for the ChainMap of the template's and the environment's globals (the same
    # names and values): each render copies them into its context, and a ChainMap is copied
    # key by key in Python.
    template.globals = dict(template.globals)
    return template


def _iterates_content(node: jinja2.nodes.Node) -> bool:
    """``message['content']``, ``message.content`` (or msg / m): the loop target SGLang's
    `_is_var_or_elems_access` looks for."""
    if isinstance(node, jinja2.nodes.Filter) and node.node is not None:
        return _iterates_content(node.node)
    if isinstance(node, jinja2.nodes.Test):
        return _iterates_content(node.node)
    if isinstance(node, jinja2.nodes.Getattr):
        target, key = node.node, node.attr
    elif isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const):
        target, key = node.node, node.arg.value
    else:
        return False
    return (
        key == "content"
        and isinstance(target, jinja2.nodes.Name)
        and target.name in ("message", "msg", "m")
    )


def content_format(source: str) -> str:
    """ "openai" when the template loops over a message's content parts, else "string": SGLang's
    `detect_jinja_template_content_format` (parser/jinja_template_utils.py:83)."""
    if any(word in source for word in ("image", "audio", "video", "vision")):
        return "openai"
    try:
        tree = jinja2.Environment().parse(source)
    except jinja2.TemplateSyntaxError:
        return "string"
    for loop in tree.find_all(jinja2.nodes.For):
        if _iterates_content(loop.iter):
            return "openai"
    return "string"


class ModelTokenizer:
    """The served model's tokenizer and chat template; see the module docstring for the rules."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        special_tokens: Mapping[str, str],
        chat_template: str | None,
        limits: ModelLimits,
        *,
        verified: bool = True,
        sampling_defaults: Mapping[str, float] | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self.verified = verified
        # generation_config.json's sampling fields: what SGLang's chat takes for the ones a
        # request leaves unset (`--sampling-defaults model`, its default)
        self.sampling_defaults = dict(sampling_defaults or {})
        self.special_tokens = dict(special_tokens)
        self.limits = limits
        self.chat_template = chat_template
        self._template = compile_chat_template(chat_template) if chat_template else None
        self._content_format = content_format(chat_template) if chat_template else "string"
        bos = self.special_tokens.get("bos_token")
        self.bos_token_id = tokenizer.token_to_id(bos) if bos else None
        # serving_chat.py ~456-465: a tokenizer that adds tokens to "" encodes the rendered
        # chat without special tokens (the template wrote them).
        self._adds_specials = len(tokenizer.encode("", add_special_tokens=True).ids) > 0
        self._segments = SegmentCache.for_tokenizer(tokenizer)
        self._wrap = _special_wrap(tokenizer)
        self._post_adds = _post_adds(tokenizer)  # once: it encodes twice

    @classmethod
    def load(cls, folder: Path) -> ModelTokenizer:
        """The tokenizer of the model in `folder`; TokenizerError names what is missing."""
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(
                f"{path}: no such file (the router needs the model's fast tokenizer)"
            )
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises plain Exception on a bad file
            raise TokenizerError(f"{path}: not a tokenizer ({exc})") from exc
        config_path = folder / "tokenizer_config.json"
        config = _read_json(config_path) if config_path.is_file() else {}
        model_config = _read_json(folder / "config.json")
        special = {
            name: text
            for name in SPECIAL_TOKEN_NAMES
            if (text := _token_text(config.get(name))) is not None
        }
        missing = [t for t in special.values() if tokenizer.token_to_id(t) is None]
        if missing:
            tokenizer.add_special_tokens(
                [AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(missing)]
            )
        tokenizer_class = config.get("tokenizer_class")
        if tokenizer_class in _BOS_BY_DEFAULT:
            # transformers 5's LlamaTokenizer: add_bos_token defaults to True and rebuilds
            # the post-processor; the generic class keeps tokenizer.json's (add_bos_token
            # ignored: both measured on 0.5.23's environment).
            tokenizer.post_processor = _post_processor(
                tokenizer,
                special.get("bos_token") if config.get("add_bos_token", True) else None,
                special.get("eos_token") if config.get("add_eos_token", False) else None,
            )
        text_config = model_config.get("text_config")
        source = text_config if isinstance(text_config, Mapping) else model_config
        vocab = source.get("vocab_size", model_config.get("vocab_size"))
        if not isinstance(vocab, int):
            vocab = tokenizer.get_vocab_size(with_added_tokens=True)
        positions = source.get("max_position_embeddings")
        limits = ModelLimits(vocab, positions if isinstance(positions, int) else None)
        verified = tokenizer_class in _BOS_BY_DEFAULT or tokenizer_class in _GENERIC_CLASSES
        generation_path = folder / "generation_config.json"
        generation = _read_json(generation_path) if generation_path.is_file() else {}
        defaults = {
            key: float(value)
            for key in SAMPLING_DEFAULT_KEYS
            if isinstance(value := generation.get(key), int | float) and not isinstance(value, bool)
        }
        return cls(
            tokenizer,
            special,
            _chat_template(folder, config),
            limits,
            verified=verified,
            sampling_defaults=defaults,
        )

    def encode_text(self, text: str) -> list[int]:
        """Ids of a /generate ``text`` or a /v1/completions ``prompt`` string."""
        if self._segments is not None and self._wrap is not None:
            head, tail = self._wrap
            return self._segments.encode(text, head, tail)
        return list(self._tokenizer.encode(text, add_special_tokens=True).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def render_chat(
        self, messages: Sequence[Mapping[str, Any]], **template_kwargs: Any
    ) -> str | None:
        """The prompt text of already processed messages, generation prompt included."""
        if self._template is None:
            return None
        variables = {**self.special_tokens, **template_kwargs}
        return str(
            self._template.render(
                messages=list(messages),
                tools=None,
                documents=None,
                add_generation_prompt=True,
                **variables,
            )
        )

    def chat_ids(self, body: Mapping[str, Any]) -> list[int] | None:
        """Prompt ids of a /v1/chat/completions body, or None where they are not reproduced."""
        if self._template is None or body.get("input_ids") is not None:
            return None
        if body.get("tools") and body.get("tool_choice", "auto") != "none":
            return None
        kwargs: dict[str, Any] = {}
        if body.get("reasoning_effort") is not None:
            kwargs["reasoning_effort"] = body["reasoning_effort"]
        extra = body.get("chat_template_kwargs")
        if isinstance(extra, Mapping):
            kwargs.update(extra)
        elif extra is not None:
            return None
        messages = self._messages(body.get("messages"))
        if not messages:
            return None
        prefix = None
        last = messages[-1]
        if last["role"] == "assistant" and isinstance(last.get("content"), str):
            if body.get("continue_final_message"):
                prefix = last["content"]
                messages = messages[:-1]
            else:
                messages[-1] = {"role": "user", "content": last["content"]}
        try:
            text = self.render_chat(messages, **kwargs)
        except (jinja2.TemplateError, TypeError, ValueError):
            return None  # SGLang answers these with a 400 of its own
        if text is None:
            return None
        add_special = not self._adds_specials
        if self._segments is not None and not (add_special and self._post_adds):
            ids = self._segments.encode(text)
        else:
            ids = list(self._tokenizer.encode(text, add_special_tokens=add_special).ids)
        if prefix:
            tail = self.encode_text(prefix)
            if tail and tail[0] == self.bos_token_id:
                tail = tail[1:]
            ids += tail
        return ids

    def _messages(self, raw: object) -> list[dict[str, Any]] | None:
        """Messages as SGLang hands them to the template, or None for a shape not reproduced."""
        if not isinstance(raw, list) or not raw:
            return None
        out = []
        for message in raw:
            if not isinstance(message, Mapping) or not _MESSAGE_KEYS.issuperset(message):
                return None
            role, content = message.get("role"), message.get("content")
            if not isinstance(role, str):
                return None
            if isinstance(content, list):
                texts = [_part_text(part) for part in content]
                if any(t is None for t in texts):
                    return None
                if self._content_format == "string" or role == "tool":
                    content = " ".join(t for t in texts if t is not None)
                else:
                    content = [{"type": "text", "text": t} for t in texts]
            elif content is None:
                content = ""
            elif not isinstance(content, str):
                return None
            processed: dict[str, Any] = {"role": role, "content": content}
            # SGLang's user message model has no name field (it is dropped); the others keep it.
            if message.get("name") is not None and role != "user":
                processed["name"] = message["name"]
            out.append(processed)
        return out

    def prompt_ids(self, path: str, body: Mapping[str, Any]) -> list[int] | None:
        """The one prompt's ids of a request to `path`; None for batches, embeddings and shapes
        not reproduced (ids a client sent are returned as they are)."""
        if path == "/v1/chat/completions":
            return self.chat_ids(body)
        if path == "/generate":
            ids = body.get("input_ids")
            if ids is not None:
                return list(ids) if _is_id_list(ids) else None
            text = body.get("text")
            return self.encode_text(text) if isinstance(text, str) else None
        if path == "/v1/completions":
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                return self.encode_text(prompt)
            if isinstance(prompt, list) and _is_id_list(prompt):
                return list(prompt)
            if isinstance(prompt, list) and len(prompt) == 1:
                only = prompt[0]
                if isinstance(only, str):
                    return self.encode_text(only)
                return list(only) if _is_id_list(only) else None
        return None


def load_for_router(folder: str | None) -> tuple[ModelTokenizer | None, str]:
    """The tokenizer of ``--prompt-tokens model:PATH`` and the line the router logs once at
    start-up about it. Without one the router does what it does without a tokenizer: text
    prompts are routed by prefix_affinity and their lengths estimated (UTF-8 bytes / 4)."""
    fallback = (
        "text prompts are routed by prefix_affinity and their lengths estimated (UTF-8 bytes / "
        "4), and OpenAI streams cut by a dead decode end with an error instead of going on"
    )
    if folder is None:
        return None, f"no model tokenizer (--prompt-tokens model:PATH): {fallback}"
    try:
        tokenizer = ModelTokenizer.load(Path(folder))
    except TokenizerError as exc:
        return None, f"no model tokenizer: {exc}; {fallback}"
    chat = "with its chat template" if tokenizer.chat_template else "without a chat template"
    verified = "" if tokenizer.verified else " (its tokenizer class is unverified against SGLang)"
    return tokenizer, (
        f"model tokenizer from {folder} {chat}, vocabulary {tokenizer.limits.vocab_size}"
        f"{verified}: text prompts get their token ids here"
    )


@dataclass(frozen=True)
class RouterPrompts:
    """What the router knows of its prompts' tokens, settled once at start-up."""

    tokenizer: ModelTokenizer | None
    kind: str  # model, sim or none: pdkit_lb_prompt_tokenizer's label
    vocab_size: int | None
    context_length: int | None


def router_prompts(config: LbConfig) -> RouterPrompts:
    """The router's prompt tokens from its flags, said once in its log: whether text prompts get
    exact ids, and what it costs if not."""
    vocab = prompt_vocab(config)
    if vocab is not None:
        log.info(
            "the emulated model's tokenizer (--prompt-tokens %s): text prompts get the sim "
            "workers' own ids here",
            config.prompt_tokens,
        )
        return RouterPrompts(None, "sim", vocab, config.context_length or None)
    if prompt_sim_workers(config):
        log.info(
            "the emulated model's tokenizer (--prompt-tokens sim): text prompts get the sim "
            "workers' own ids here once a worker's /server_info has said its vocabulary"
        )
        return RouterPrompts(None, "sim", None, config.context_length or None)
    tokenizer, note = load_for_router(prompt_tokenizer_path(config))
    log.log(logging.INFO if tokenizer else logging.WARNING, "%s", note)
    if tokenizer is None:
        return RouterPrompts(None, "none", None, config.context_length or None)
    if tokenizer.chat_template and not config.chat_bridge:
        log.info(
            "--no-chat-bridge: chats go to the workers' own /v1/chat/completions (they parse "
            "reasoning or tool calls that /v1/completions would not), so a chat stream cut by "
            "a dead decode ends with an error instead of going on"
        )
    limits = tokenizer.limits
    return RouterPrompts(
        tokenizer,
        "model",
        limits.vocab_size,
        config.context_length or limits.max_position_embeddings,
    )


def _part_text(part: object) -> str | None:
    if isinstance(part, Mapping) and part.get("type") in _TEXT_PART_TYPES:
        text = part.get("text")
        return text if isinstance(text, str) else None
    return None


def _is_id_list(value: object) -> bool:
    # `type(i) is int`: a bool is not an id (and JSON gives no other int subclass).
    return isinstance(value, list) and bool(value) and all(type(i) is int for i in value)


def _post_processor(
    tokenizer: Tokenizer, bos: str | None, eos: str | None
) -> processors.TemplateProcessing:
    """transformers' `update_post_processor`: ``[bos:0] $A:0 [eos:0]``."""
    single = f"{bos + ':0 ' if bos else ''}$A:0{' ' + eos + ':0' if eos else ''}"
    pair = f"{single}{' ' + bos + ':1' if bos else ''} $B:1{' ' + eos + ':1' if eos else ''}"
    specials = [(t, tokenizer.token_to_id(t)) for t in (bos, eos) if t]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def _post_adds(tokenizer: Tokenizer) -> bool:
    """Whether encoding with special tokens adds any (to a non-empty text)."""
    return len(tokenizer.encode("a", add_special_tokens=True).ids) != len(
        tokenizer.encode("a", add_special_tokens=False).ids
    )


def _special_wrap(tokenizer: Tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The ids the post-processor puts before and after a text's own (a BOS, an EOS), when
    they are the same for every text (found on two texts), else None."""
    found = []
    for probe in ("a", "hello world"):
        full = tokenizer.encode(probe, add_special_tokens=True).ids
        bare = tokenizer.encode(probe, add_special_tokens=False).ids
        at = next(
            (i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare),
            None,
        )
        if at is None or not bare:
            return None
        found.append((tuple(full[:at]), tuple(full[at + len(bare) :])))
    return found[0] if found[0] == found[1] else None

"""The load balancer's settings and its command line.

`parse_args(argv, environ)` is the only way an `LbConfig` is built from the outside: it checks
every option and reads the secrets (API keys come from the environment or a file, never from
the command line, so they do not show in `ps`). The options themselves, their parser entries
and their checks come from the one table, `kit.topology.router_options`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from yarl import URL

from kit.lb.errors import LbConfigError
from kit.net import url_host
from kit.secrets import SecretError, SecretSource, read_secret
from kit.topology.router_flags import RouterOption
from kit.topology.router_options import (
    DEFAULTS,
    GROUPS,
    KEY_FILES,
    ROUTER_OPTIONS,
    RouterOptions,
    model_tokenizer_path,
    option_problems,
    sim_from_workers,
    sim_vocab,
)

Role = Literal["prefill", "decode"]

DEFAULT_PREFILL_POLICY = DEFAULTS.prefill_policy
DEFAULT_DECODE_POLICY = DEFAULTS.decode_policy

API_KEY_ENV = KEY_FILES["--api-key-file"]
ADMIN_KEY_ENV = KEY_FILES["--admin-key-file"]
WORKER_KEY_ENV = KEY_FILES["--worker-api-key-file"]


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """A worker as configured: base URL (no trailing slash) and, for prefill, its bootstrap port.

    `bootstrap_port` None means "not given": decode then uses its own
    `--disaggregation-bootstrap-port`.
    """

    url: str
    role: Role
    bootstrap_port: int | None = None

    @property
    def bootstrap_host(self) -> str:
        """Host part of the URL as the decode must dial it (IPv6 in brackets)."""
        return url_host(URL(self.url).raw_host or "")


@dataclass(frozen=True, slots=True, kw_only=True)
class LbConfig(RouterOptions):
    """Everything the load balancer needs: its workers, its keys and its options (the fields
    of `RouterOptions`); durations in seconds, sizes in bytes."""

    prefill: tuple[WorkerSpec, ...]
    decode: tuple[WorkerSpec, ...]
    api_key: str | None = field(default=None, repr=False)
    admin_key: str | None = field(default=None, repr=False)
    worker_api_key: str | None = field(default=None, repr=False)


EPILOG = """\
examples:
  # one prefill (bootstrap port 8998) and one decode, on this host
  python -m kit.lb --prefill http://127.0.0.1:30000 8998 --decode http://127.0.0.1:30100

  # two prefills, two decodes, explicit policies, clients must send a key
  export PDKIT_LB_API_KEY=$(cat /etc/pdkit/api-key)
  python -m kit.lb --prefill http://10.0.0.1:30000 8998 --prefill http://10.0.0.1:30001 8999 \\
      --decode http://10.0.0.2:30100 --decode http://10.0.0.2:30101 \\
      --prefill-policy prefix_affinity --decode-policy least_inflight --port 8000

  # admission: answer 429 at once to requests predicted to miss a 400 ms TTFT / 40 ms TPOT SLO
  python -m kit.lb --prefill http://127.0.0.1:30000 8998 --decode http://127.0.0.1:30100 \\
      --admission --slo-ttft-ms 400 --slo-tpot-ms 40

  # from a topology (pdkit renders the same options from the Plan)
  pdkit lb --topology topologies/local.yaml

keys (never on the command line):
  PDKIT_LB_API_KEY / --api-key-file        clients send `Authorization: Bearer KEY`
  PDKIT_LB_ADMIN_KEY / --admin-key-file    enables /workers (add, remove with drain, list)
  PDKIT_LB_WORKER_API_KEY / --worker-api-key-file   sent to workers started with --api-key

policies: round_robin, random, least_inflight (power of two choices on in-flight requests),
  prefix_affinity (prefill only: same prompt prefix -> same prefill, bounded by load),
  cache_aware (prefill only: the prefill DP rank with the least prefill work for this prompt,
  counting what its KV events say it has cached; see kit/lb/cache_aware.py)

access log: one line per PD request on stderr, `access {json}` (logger kit.lb.access); off with
  --no-access-log
"""


class _WorkerAction(argparse.Action):
    """`--prefill URL [PORT|none]` and `--decode URL`, repeatable."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        items = [str(v) for v in (values or [])]
        role: Role = "prefill" if self.dest == "prefill" else "decode"
        limit = 2 if role == "prefill" else 1
        if not items or len(items) > limit:
            usage = "URL [BOOTSTRAP_PORT|none]" if role == "prefill" else "URL"
            parser.error(f"{option_string} takes {usage}, got {' '.join(items) or 'nothing'}")
        port: int | None = None
        if len(items) == 2 and items[1].lower() != "none":
            try:
                port = int(items[1])
            except ValueError:
                parser.error(
                    f"{option_string} {items[0]}: bootstrap port {items[1]!r} is not a "
                    "number; give a port such as 8998, or none"
                )
            if not 1 <= port <= 65535:
                parser.error(f"{option_string} {items[0]}: bootstrap port {port} is out of range")
        specs = list(getattr(namespace, self.dest) or [])
        specs.append(WorkerSpec(normalize_url(items[0], parser), role, port))
        setattr(namespace, self.dest, specs)


class _RefuseSecret(argparse.Action):
    """A key on the command line would show in `ps` and shell history: say where it goes."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        env = {"--api-key": API_KEY_ENV, "--admin-key": ADMIN_KEY_ENV}.get(
            option_string or "", WORKER_KEY_ENV
        )
        parser.error(
            f"{option_string} is not taken on the command line (it would show in ps); "
            f"set ${env} or use {option_string}-file PATH"
        )


def normalize_url(raw: str, parser: argparse.ArgumentParser | None = None) -> str:
    """`http(s)://host:port[/prefix]` without a trailing slash; raises LbConfigError otherwise."""
    try:
        url = URL(raw)
    except ValueError:
        url = URL()
    if url.scheme not in ("http", "https") or not url.raw_host:
        message = f"worker URL {raw!r} must look like http://HOST:PORT"
        if parser is not None:
            parser.error(message)
        raise LbConfigError(message + ". To fix: give the worker's HTTP address.")
    return str(url).rstrip("/")


def _typed(option: RouterOption) -> Callable[[str], object]:
    """argparse's type for `option`: its value from the flag's text, bounds checked."""

    def convert(text: str) -> object:
        try:
            return option.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _add_option(group: argparse._ArgumentGroup, option: RouterOption) -> None:
    """`option` as argparse takes it; unset options stay out of the namespace (SUPPRESS), so
    that their default is the table's, not a round trip through the flag's unit."""
    if option.kind is bool:
        action = argparse.BooleanOptionalAction if option.negatable else "store_true"
        group.add_argument(
            *option.spellings,
            dest=option.name,
            action=action,
            default=argparse.SUPPRESS,
            help=option.help,
        )
        return
    group.add_argument(
        *option.spellings,
        dest=option.name,
        type=_typed(option),
        choices=option.choices or None,
        metavar=option.metavar,
        default=argparse.SUPPRESS,
        help=option.help,
    )


def build_parser(prog: str = "pdkit lb") -> argparse.ArgumentParser:
    """The argparse parser: the workers and key files, then every option of the table."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="pdkit's prefill/decode load balancer for SGLang PD disaggregation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
        usage=f"{prog} --prefill URL [BOOTSTRAP_PORT|none] ... --decode URL ... [options]",
    )
    p.add_argument(
        "--api-key", "--admin-key", "--worker-api-key", action=_RefuseSecret, help=argparse.SUPPRESS
    )
    groups = {key: p.add_argument_group(title) for key, title in GROUPS.items()}
    w = groups["workers"]
    w.add_argument(
        "--prefill",
        action=_WorkerAction,
        nargs="+",
        metavar=("URL", "BOOTSTRAP_PORT"),
        default=[],
        help="prefill worker URL, then its bootstrap port, or none (decode then uses its own "
        "default); repeat per prefill",
    )
    w.add_argument(
        "--decode",
        action=_WorkerAction,
        nargs=1,
        metavar="URL",
        default=[],
        help="decode worker URL; repeat per decode",
    )
    for flag, env in KEY_FILES.items():
        what = {"--api-key-file": "the client key", "--admin-key-file": "the /workers admin key"}
        groups["server"].add_argument(
            flag,
            type=Path,
            help=f"file with {what.get(flag, 'the key sent to workers')} (or ${env})",
        )
    for option in ROUTER_OPTIONS:
        _add_option(groups[option.group], option)
    return p


def _read_secret(
    path: Path | None, option: str, env_name: str, environ: Mapping[str, str]
) -> str | None:
    """A key from `option`'s file, else from `env_name` (optional)."""
    source = SecretSource(option, file=path, env=env_name, required=False)
    try:
        return read_secret(source, environ)
    except SecretError as exc:
        raise LbConfigError(str(exc)) from exc


def parse_args(argv: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> LbConfig:
    """Parse and check a command line; argparse exits with status 2 on malformed options."""
    env = os.environ if environ is None else environ
    ns = build_parser().parse_args(list(argv) if argv is not None else None)
    prefill: list[WorkerSpec] = ns.prefill
    decode: list[WorkerSpec] = ns.decode
    if not prefill or not decode:
        raise LbConfigError(
            "need at least one --prefill URL [BOOTSTRAP_PORT] and one "
            "--decode URL. To fix: list the workers, or use --topology."
        )
    urls = [w.url for w in (*prefill, *decode)]
    dupes = sorted({u for u in urls if urls.count(u) > 1})
    if dupes:
        raise LbConfigError(f"worker listed twice: {', '.join(dupes)}. To fix: list each once.")
    given = {o.name: getattr(ns, o.name) for o in ROUTER_OPTIONS if hasattr(ns, o.name)}
    problems = option_problems(replace(DEFAULTS, **given))
    if problems:
        raise LbConfigError(problems[0])
    config = LbConfig(
        prefill=tuple(prefill),
        decode=tuple(decode),
        api_key=_read_secret(ns.api_key_file, "--api-key-file", API_KEY_ENV, env),
        admin_key=_read_secret(ns.admin_key_file, "--admin-key-file", ADMIN_KEY_ENV, env),
        worker_api_key=_read_secret(
            ns.worker_api_key_file, "--worker-api-key-file", WORKER_KEY_ENV, env
        ),
    )
    return replace(config, **given)


def prompt_tokenizer_path(config: LbConfig) -> str | None:
    """The model folder of --prompt-tokens model:PATH, else None."""
    return model_tokenizer_path(config.prompt_tokens) if config.prompt_tokens else None


def prompt_sim_workers(config: LbConfig) -> bool:
    """--prompt-tokens sim: the emulated model's tokenizer, its vocabulary from the workers."""
    return sim_from_workers(config.prompt_tokens)


def prompt_vocab(config: LbConfig) -> int | None:
    """The sim tokenizer's vocabulary size, when the router hashes text prompts with it."""
    return sim_vocab(config.prompt_tokens) if config.prompt_tokens else None

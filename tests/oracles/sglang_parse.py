"""Parse launch_server argument lists with SGLang's own parser, as `launch_server` does.

Run with the SGLang venv's python. Reads JSON from stdin: a list of argv lists (the arguments
after `python -m sglang.launch_server`). Writes JSON to stdout: one entry per argv,

    {"ok": true, "error": null, "args": {dest: value, ...}, "deprecations": []}
    {"ok": false, "error": "ambiguous option: --cuda-graph-max-bs could match ...", "args": {},
     "deprecations": []}

`deprecations` holds the warnings SGLang's deprecated-flag actions printed while parsing
(`arg_groups/argparse_actions.print_deprecated_warning`), e.g. "'--enable-dp-attention' is
deprecated and will be removed in a future release. Use '--attn-dp-size <dp-size>' instead.".

Each argv goes through `sglang.srt.server_args.prepare_server_args` (argparse, `--config`
merging, `ServerArgs.from_cli_args`), which needs no GPU, model files or network. Resolution
(`ServerArgs.resolve_once`, which reads the model config and the device) is not run, so values
are the operator's input: e.g. the deprecated `--dp-size 2 --enable-dp-attention` reports
`dp_size=2`, `enable_dp_attention=true`; turning that into `attn_dp_size` happens at resolution.

`args` holds every ServerArgs field, made JSON-safe. Anything SGLang prints goes to stderr;
stdout carries only the JSON result.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sglang_shim


def _argparse_message(captured: str, code: object) -> str:
    """The `error: ...` line argparse printed after the usage text, without its prefix."""
    for line in reversed(captured.splitlines()):
        marker = " error: "
        if marker in line:
            return line.split(marker, 1)[1].strip()
    tail = [line for line in captured.splitlines() if line.strip()]
    if code == 0:
        return "the parser exited without parsing (status 0), as it does for --help"
    return tail[-1].strip() if tail else f"the parser exited with status {code}"


@contextlib.contextmanager
def _deprecations() -> Iterator[list[str]]:
    """The messages SGLang's deprecated-flag actions print, collected while the block runs."""
    from sglang.srt.arg_groups import argparse_actions  # noqa: PLC0415

    seen: list[str] = []
    original = argparse_actions.print_deprecated_warning
    argparse_actions.print_deprecated_warning = seen.append
    try:
        yield seen
    finally:
        argparse_actions.print_deprecated_warning = original


def parse_one(argv: list[str]) -> dict[str, Any]:
    from sglang.srt.arg_groups.arg_utils import record_fields  # noqa: PLC0415
    from sglang.srt.server_args import ServerArgs, prepare_server_args  # noqa: PLC0415

    captured = io.StringIO()
    with _deprecations() as deprecations:
        try:
            with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
                server_args = prepare_server_args(list(argv))
        except SystemExit as exc:
            # Not the whole usage text (thousands of lines): the message says what is wrong.
            message = _argparse_message(captured.getvalue(), exc.code)
            sys.stderr.write(f"sglang_parse: {message}\n")
            return {"ok": False, "error": message, "args": {}, "deprecations": deprecations}
        except Exception as exc:  # a type converter or ServerArgs itself refused the input
            sys.stderr.write(captured.getvalue())
            error = f"{type(exc).__name__}: {exc}"
            return {"ok": False, "error": error, "args": {}, "deprecations": deprecations}
    sys.stderr.write(captured.getvalue())
    args = {
        field.name: sglang_shim.json_safe(getattr(server_args, field.name, None))
        for field in record_fields(ServerArgs)
    }
    return {"ok": True, "error": None, "args": args, "deprecations": deprecations}


def main() -> int:
    try:
        argvs = json.load(sys.stdin)
    except json.JSONDecodeError as exc:
        print(f"stdin is not JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(argvs, list) or not all(
        isinstance(argv, list) and all(isinstance(a, str) for a in argv) for argv in argvs
    ):
        print("stdin must be a JSON list of lists of strings", file=sys.stderr)
        return 2
    real_stdout = sys.stdout
    # SGLang and argparse (--help) may print; keep stdout for the JSON answer only.
    with contextlib.redirect_stdout(sys.stderr):
        sglang_shim.prepare_imports()
        results = [parse_one(argv) for argv in argvs]
    json.dump(results, real_stdout, sort_keys=True)
    real_stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

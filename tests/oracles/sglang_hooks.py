"""Run SGLang's own start-up validation hooks on launch arguments, without a GPU or a model.

Run with the SGLang venv's python. Reads JSON from stdin: a list of cases,

    {"argv": ["--model-path", "m", ...], "hooks": ["validation_hook.check_server_args", ...]}

where `argv` is what follows `python -m sglang.launch_server` and each hook names a function
of `sglang.srt.arg_groups` ("<module>.<function>"); one of `overrides` is a post-process pass
and runs through `run_post_process_pass`, as the pipeline runs it. Writes JSON to stdout, one
entry per case:

    {"refused": true, "hook": "validation_hook.check_server_args",
     "error": "AssertionError: schedule_conservativeness must be non-negative",
     "source": "arg_groups/validation_hook.py:314"}
    {"refused": false, "hook": null, "error": null, "source": null}

`source` is where under `sglang/srt` the refusal was raised (the innermost SGLang frame).

Each case builds a ServerArgs with `prepare_server_args(argv)` (as `launch_server` does) and
calls the hooks in the order given, as `ServerArgs.resolve_once()` and `check_server_args()`
would, stopping at the first that raises. Two seams stand in for what only a GPU host has:

- `model_config_of` (reads the model's config.json) raises `ModelConfigNeeded`; a hook that
  gets that far has accepted every flag it checks first, so the runner moves on to the next
  hook. A check that comes after the model config is read cannot be run here.
- `validate_ib_devices` (reads /sys/class/infiniband) returns its input unchanged.

The hook modules import more than the parser does: `tqdm`, `IPython` and `safetensors` (through
`sglang.utils` and `sglang.srt.connector`), `granian` (the HTTP/2 server, imported by the SSL
check once `--enable-http2` is on) and the model-config package `sglang.srt.configs` (which
needs `transformers`). Where those are not installed they are answered with the same inert
stubs `sglang_shim` uses for triton: no check run here calls into them.

Nothing here touches a device or the network.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import io
import json
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sglang_shim

# Imported by the hook modules, never called by the checks run here.
_STUBBED_PACKAGES = ("tqdm", "IPython", "safetensors", "granian")
_MODEL_CONFIGS = "sglang.srt.configs"


class _ImportStubFinder(sglang_shim._TritonStubFinder):
    """Answers the packages in `roots` (and their submodules) with sglang_shim's stubs."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if any(fullname == root or fullname.startswith(f"{root}.") for root in self.roots):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None


def prepare_imports() -> None:
    """sglang_shim's set-up, plus stubs for what only the hook modules import."""
    missing = tuple(name for name in _STUBBED_PACKAGES if importlib.util.find_spec(name) is None)
    if importlib.util.find_spec("transformers") is None:
        missing += (_MODEL_CONFIGS,)
    if missing:
        sys.meta_path.insert(0, _ImportStubFinder(missing))
    sglang_shim.prepare_imports()


class ModelConfigNeeded(Exception):
    """A hook asked for the model's config: it accepted the flags it checks before that."""


def _needs_model_config(*args: Any, **kwargs: Any) -> Any:
    raise ModelConfigNeeded


def _same_ib_devices(device: str | None) -> str | None:
    return device


def _hook(name: str) -> Any:
    module_name, function = name.rsplit(".", 1)
    module = importlib.import_module(f"sglang.srt.arg_groups.{module_name}")
    if hasattr(module, "model_config_of"):
        module.model_config_of = _needs_model_config  # type: ignore[attr-defined]
    step = getattr(module, function)
    if module_name == "overrides":
        return lambda server_args: module.run_post_process_pass(server_args, step)
    return step


def _source(exc: BaseException) -> str | None:
    """file:line under sglang/srt of the innermost SGLang frame that raised `exc`."""
    marker = "/sglang/srt/"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if marker in f.filename]
    if not frames:
        return None
    return f"{frames[-1].filename.split(marker, 1)[1]}:{frames[-1].lineno}"


def run_case(argv: list[str], hooks: list[str]) -> dict[str, Any]:
    from sglang.srt.arg_groups import overrides, validation_hook  # noqa: PLC0415
    from sglang.srt.server_args import prepare_server_args  # noqa: PLC0415

    overrides.model_config_of = _needs_model_config  # type: ignore[attr-defined]
    validation_hook.validate_ib_devices = _same_ib_devices  # type: ignore[attr-defined]
    captured = io.StringIO()
    with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
        try:
            server_args = prepare_server_args(list(argv))
        except SystemExit:
            error = captured.getvalue()
            return {"refused": True, "hook": "prepare_server_args", "error": error, "source": None}
        for name in hooks:
            try:
                _hook(name)(server_args)
            except ModelConfigNeeded:
                continue
            except Exception as exc:  # the refusal under test, whatever its type
                error = f"{type(exc).__name__}: {exc}"
                return {"refused": True, "hook": name, "error": error, "source": _source(exc)}
    return {"refused": False, "hook": None, "error": None, "source": None}


def main() -> int:
    cases = json.load(sys.stdin)
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        prepare_imports()
        results = [run_case(case["argv"], case["hooks"]) for case in cases]
    json.dump(results, real_stdout, sort_keys=True)
    real_stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

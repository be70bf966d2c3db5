"""The `pdkit lb` command line: the argv a topology's Plan renders, checks, and secrets."""

from __future__ import annotations

import pytest

from kit.errors import TopologyError
from kit.lb.config import LbConfig, WorkerSpec, build_parser, parse_args
from kit.lb.errors import LbConfigError
from kit.plan.resolve import resolve
from kit.topology.args import flag_groups, flatten, normalize_flag
from kit.topology.router_options import ROUTER_OPTIONS
from tests.conftest import TOPOLOGIES, base_topology

PLAN_ARGV = [
    "--prefill", "http://10.0.0.1:30000", "8998",
    "--prefill", "http://10.0.0.1:30001", "none",
    "--prefill", "http://10.0.0.1:30002",
    "--decode", "http://10.0.0.2:30100",
    "--decode", "http://10.0.0.2:30101/",
    "--host", "0.0.0.0", "--port", "8000",
    "--prefill-policy", "prefix_affinity", "--decode-policy", "least_inflight",
]  # fmt: skip


def test_worker_options_take_a_bootstrap_port_none_or_nothing():
    cfg = parse_args(PLAN_ARGV, {})
    assert cfg.prefill == (
        WorkerSpec("http://10.0.0.1:30000", "prefill", 8998),
        WorkerSpec("http://10.0.0.1:30001", "prefill", None),
        WorkerSpec("http://10.0.0.1:30002", "prefill", None),
    )
    assert [w.url for w in cfg.decode] == ["http://10.0.0.2:30100", "http://10.0.0.2:30101"]
    assert (cfg.host, cfg.port) == ("0.0.0.0", 8000)
    assert (cfg.prefill_policy, cfg.decode_policy) == ("prefix_affinity", "least_inflight")
    assert cfg.api_key is None and cfg.admin_key is None


PDKIT_ROUTED = [t for t in TOPOLOGIES if resolve(t).router.kind == "pdkit"]


@pytest.mark.parametrize("topology", PDKIT_ROUTED, ids=lambda p: p.stem)
def test_the_router_argv_every_example_plan_renders_parses(topology):
    plan = resolve(topology)
    router = plan.router
    cfg = parse_args(router.command.args, {})
    serving = [w for w in plan.workers if w.serves_http]
    assert cfg.prefill == tuple(
        WorkerSpec(w.url, "prefill", w.bootstrap_port) for w in serving if w.role == "prefill"
    )
    assert cfg.decode == tuple(WorkerSpec(w.url, "decode") for w in serving if w.role == "decode")
    assert (cfg.host, cfg.port) == (router.bind, router.port)
    assert (cfg.prefill_policy, cfg.decode_policy) == (router.prefill_policy, router.decode_policy)


def test_router_admission_renders_the_flags_with_the_topology_slo(write_topology):
    data = base_topology()
    data["slo"] = {"ttft_ms": 800, "tpot_ms": 60}
    data["router"]["admission"] = {"enabled": True, "tpot_ms": 50}
    cfg = parse_args(resolve(write_topology(data)).router.command.args, {})
    assert cfg.admission and (cfg.slo_ttft, cfg.slo_tpot) == (0.8, 0.05)
    assert cfg.admission_margin == 0.2
    data["router"]["admission"] = {"enabled": False, "margin": 0.1}
    assert "--admission" not in resolve(write_topology(data)).router.command.args


def test_admission_with_smg_is_refused_naming_the_key(write_topology):
    data = base_topology()
    data["router"] = {"kind": "smg", "admission": {"enabled": True}}
    with pytest.raises(TopologyError, match="only pdkit's router admits by SLO"):
        resolve(write_topology(data))


def test_argparse_defaults_are_the_config_defaults():
    cfg = parse_args(["--prefill", "http://a:1", "--decode", "http://b:2"], {})
    assert cfg == LbConfig(prefill=cfg.prefill, decode=cfg.decode)
    assert cfg.upstream_keepalive < 5  # below uvicorn's keep-alive, so a pooled socket is live


def test_admission_is_off_and_the_access_log_on_unless_asked():
    workers = ["--prefill", "http://a:1", "--decode", "http://b:2"]
    cfg = parse_args(workers, {})
    assert not cfg.admission and cfg.access_log
    cfg = parse_args(
        [*workers, "--admission", "--slo-ttft-ms", "800", "--slo-tpot-ms", "50", "--no-access-log"],
        {},
    )
    assert cfg.admission and (cfg.slo_ttft, cfg.slo_tpot) == (0.8, 0.05) and not cfg.access_log


def test_keys_come_from_the_environment_or_files(tmp_path):
    env = {"PDKIT_LB_API_KEY": "client-secret", "PDKIT_LB_ADMIN_KEY": " admin \n"}
    cfg = parse_args(["--prefill", "http://a:1", "--decode", "http://b:2"], env)
    assert (cfg.api_key, cfg.admin_key) == ("client-secret", "admin")
    assert "client-secret" not in repr(cfg)
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    cfg = parse_args(
        [
            "--prefill",
            "http://a:1",
            "--decode",
            "http://b:2",
            "--api-key-file",
            str(key_file),
            "--worker-api-key-file",
            str(key_file),
        ],
        env,
    )
    assert cfg.api_key == "from-file" and cfg.worker_api_key == "from-file"


def test_there_is_no_way_to_put_a_key_on_the_command_line(capsys):
    for flag in ("--api-key", "--admin-key", "--worker-api-key"):
        with pytest.raises(SystemExit):
            parse_args(["--prefill", "http://a:1", "--decode", "http://b:2", flag, "x"], {})
        assert "not taken on the command line" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--decode", "http://b:2"], "at least one --prefill"),
        (["--prefill", "http://a:1", "--decode", "http://a:1"], "listed twice"),
        (
            [
                "--prefill",
                "http://a:1",
                "--decode",
                "http://b:2",
                "--decode-policy",
                "prefix_affinity",
            ],
            "prefill only",
        ),
        (
            [
                "--prefill",
                "http://a:1",
                "--decode",
                "http://b:2",
                "--eject-backoff",
                "9",
                "--eject-backoff-max",
                "1",
            ],
            "backoff-max",
        ),
        (
            ["--prefill", "http://a:1", "--decode", "http://b:2", "--admission-margin", "0.5"],
            "margin below 0.5",
        ),
    ],
)
def test_inconsistent_options_are_refused_with_the_fix(argv, needle):
    with pytest.raises(LbConfigError, match=needle):
        parse_args(argv, {})


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--prefill", "ftp://a:1", "--decode", "http://b:2"], "must look like http"),
        (["--prefill", "http://a:1", "port", "--decode", "http://b:2"], "not a number"),
        (["--prefill", "http://a:1", "1", "2", "--decode", "http://b:2"], "URL [BOOTSTRAP_PORT"),
        (["--prefill", "http://a:1", "--decode", "http://b:2", "3"], "unrecognized arguments: 3"),
        (["--prefill", "http://a:1", "--decode", "http://b:2", "--retries", "-1"], ">= 0"),
    ],
)
def test_malformed_options_exit_2_naming_the_option(argv, needle, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(argv, {})
    assert info.value.code == 2
    assert needle in capsys.readouterr().err


def test_a_missing_key_file_says_how_to_fix(tmp_path):
    with pytest.raises(LbConfigError, match=r"--admin-key-file .* cannot be read"):
        parse_args(
            [
                "--prefill",
                "http://a:1",
                "--decode",
                "http://b:2",
                "--admin-key-file",
                str(tmp_path / "nope"),
            ],
            {},
        )


def test_help_has_examples_and_the_policies():
    text = build_parser().format_help()
    assert "examples:" in text and "--topology" in text
    for policy in ("round_robin", "random", "least_inflight", "prefix_affinity"):
        assert policy in text


WORKERS = ["--prefill", "http://a:1", "--decode", "http://b:2"]


def test_the_ejection_counts_say_which_is_which_and_the_old_flags_still_work():
    cfg = parse_args([*WORKERS, "--eject-after", "5", "--eject-after-failures", "4"], {})
    assert (cfg.eject_after_failed_probes, cfg.eject_after_failed_requests) == (5, 4)
    cfg = parse_args(
        [*WORKERS, "--eject-after-failed-probes", "6", "--eject-after-failed-requests", "7"], {}
    )
    assert (cfg.eject_after_failed_probes, cfg.eject_after_failed_requests) == (6, 7)


def _sample(option):
    """A value of `option` other than its default, that the router takes."""
    if option.kind is bool:
        return not option.default
    if option.choices:
        return next(c for c in option.choices if c != option.default and "_" not in c)
    if option.kind is str:
        return {
            "prompt_tokens": "sim:1000",
            "health_path": "/ping",
            "client_limits": f"team=a{'0' * 63}:5:0:1",
        }.get(option.name, "127.0.0.2")
    special = {"port": 9001, "admission_margin": 0.1, "seed": 7}
    return special.get(option.name, option.kind(2 * (option.default or 1) + 1))


@pytest.mark.parametrize("option", ROUTER_OPTIONS, ids=lambda o: o.name)
def test_each_option_of_the_table_is_a_flag_the_router_reads_back(option):
    value = _sample(option)
    assert value != option.default
    pair = {"tls_cert": ["--tls-key", "/k"], "tls_key": ["--tls-cert", "/c"]}  # go together
    cfg = parse_args([*WORKERS, *option.render(value), *pair.get(option.name, [])], {})
    assert getattr(cfg, option.name) == pytest.approx(value)
    assert option.flag in build_parser().format_help()


ROUTER_ARGS = [
    {"health-interval": 0.2, "no-access-log": True, "seed": 3, "access-log": False},
    {"eject-after": 4, "prefill-max-inflight": 2, "prompt-tokens": "sim:512"},
    {"admission": True, "slo-ttft-ms": 5000, "slo-tpot-ms": 500},
    {"health-intervall": 0.2},
    {"health-interval": "soon"},
    {"retries": -1},
    {"max-body-mb": 0},
    {"log-level": "loud"},
    {"eject-backoff-max": 0.5},
    {"admission-margin": 0.5},
    {"decode-policy": "cache_aware"},
    {"migrate": 3},
    {"prompt-tokens": "words"},
    {"health-path": "health"},
]


@pytest.mark.parametrize("args", ROUTER_ARGS, ids=str)
def test_validate_refuses_exactly_the_router_args_the_router_would_refuse(args, write_topology):
    """The Plan checks the values it gives the router (never its argv); the router's parser
    on the rendered argv must agree."""
    data = base_topology()
    data["router"]["args"] = args
    path = write_topology(data)
    try:
        argv = resolve(path).router.command.args
    except TopologyError:
        refused_by_plan = True
        data["router"]["args"] = {}
        plan = resolve(write_topology(data))
        argv = (*plan.router.command.args, *flatten(extra_flags_of(args)))
    else:
        refused_by_plan = False
    try:
        parse_args(argv, {})
    except (SystemExit, LbConfigError):
        refused_by_router = True
    else:
        refused_by_router = False
    assert refused_by_plan == refused_by_router


def extra_flags_of(args):
    return flag_groups({normalize_flag(k): v for k, v in args.items()})


def test_a_switch_on_by_default_set_false_in_router_args_is_refused_with_the_fix(
    write_topology,
):
    """`validate: false` would render nothing: the checks would stay on without a word."""
    data = base_topology()
    data["router"]["args"] = {"validate": False}
    with pytest.raises(TopologyError, match="validate: false leaves --validate on") as err:
        resolve(write_topology(data))
    assert "set no-validate: true" in str(err.value)
    data["router"]["args"] = {"no-validate": True}
    assert "--no-validate" in resolve(write_topology(data, "b.yaml")).router.command.args

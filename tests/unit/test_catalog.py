"""The SGLang flag catalog: finding flags the way users spell them, and checking YAML values."""

from __future__ import annotations

import pytest

from kit.errors import RenderError
from kit.sglang.catalog import Catalog, FlagSpec, load_catalog, supported_versions


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog("0.5.23")


def spec_of(catalog: Catalog, name: str) -> FlagSpec:
    spec = catalog.lookup(name)
    assert spec is not None, name
    return spec


def test_shipped_catalog_describes_the_pd_flags(catalog):
    assert catalog.version == "0.5.23"
    assert len(catalog) > 500
    mode = spec_of(catalog, "--disaggregation-mode")
    assert mode.kind == "value"
    assert mode.choices == ("null", "prefill", "decode")
    assert mode.default == "null"
    bootstrap = spec_of(catalog, "--disaggregation-bootstrap-port")
    assert (bootstrap.type, bootstrap.default) == ("int", 8998)
    assert spec_of(catalog, "--enable-metrics").kind == "bool"
    assert spec_of(catalog, "--page-size").default is None


@pytest.mark.parametrize(
    "name",
    [
        "--chunked-prefill-size",
        "chunked-prefill-size",
        "chunked_prefill_size",
        "--chunked_prefill_size",
    ],
)
def test_lookup_accepts_dashes_or_underscores_with_or_without_leading_dashes(catalog, name):
    assert spec_of(catalog, name).flag == "--chunked-prefill-size"


def test_lookup_finds_aliases_under_the_canonical_flag(catalog):
    spec = spec_of(catalog, "tensor_parallel_size")
    assert spec.flag == "--tp-size"
    assert spec.dest == "tp_size"
    assert "--tensor-parallel-size" in spec.aliases
    assert spec_of(catalog, "--ep").flag == "--ep-size"
    assert spec_of(catalog, "model").flag == "--model-path"


def test_lookup_does_not_expand_prefixes(catalog):
    # argparse would expand --tp to --tp-size; pdkit writes full names, so it is unknown.
    assert catalog.lookup("tp") is None
    # Removed in 0.5.23; as a prefix it is ambiguous in SGLang's parser.
    assert catalog.lookup("cuda-graph-max-bs") is None
    assert catalog.lookup("help") is None


@pytest.mark.parametrize(
    ("typo", "flag"),
    [
        ("chunk-prefill-size", "--chunked-prefill-size"),
        ("disagg_mode", "--disaggregation-mode"),
        ("kv-cache-type", "--kv-cache-dtype"),
        ("tp", "--tp-size"),
    ],
)
def test_suggest_names_the_closest_flag(catalog, typo, flag):
    assert catalog.suggest(typo) == flag


def test_suggest_gives_nothing_for_gibberish(catalog):
    assert catalog.suggest("qqqqqqqq") is None


def test_deprecated_flags_are_marked_and_say_what_replaces_them(catalog):
    spec = spec_of(catalog, "enable-dp-attention")
    assert spec.deprecated
    assert spec.kind == "bool"
    assert "--attn-dp-size" in spec.help


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("chunked-prefill-size", 8192),
        ("chunked-prefill-size", "8192"),
        ("chunked-prefill-size", -1),
        ("mem-fraction-static", 0.8),
        ("mem-fraction-static", 1),
        ("mem-fraction-static", "0.85"),
        ("kv-cache-dtype", "fp8_e4m3"),
        ("log-requests-level", 3),
        ("log-requests-level", "3"),
        ("enable-metrics", True),
        ("enable-metrics", False),
        ("served-model-name", "llama"),
        ("served-model-name", 8),
        ("cuda-graph-bs-decode", [1, 2, 4, 8]),
        ("cuda-graph-bs-decode", 8),
        ("context-bucket", "32k"),
        ("context-bucket", 4096),
        ("default-chat-template-kwargs", '{"enable_thinking": false}'),
        ("page-size", None),
    ],
)
def test_values_sglang_accepts_pass(catalog, name, value):
    assert catalog.check_value(spec_of(catalog, name), value) is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("chunked-prefill-size", "abc", "expects an integer, got 'abc'"),
        ("chunked-prefill-size", 2.5, "expects an integer, got 2.5"),
        ("chunked-prefill-size", True, "expects an integer, got true"),
        ("chunked-prefill-size", [1, 2], "expects a single value, got a list of 2"),
        ("mem-fraction-static", "most", "expects a number, got 'most'"),
        (
            "kv-cache-dtype",
            "fp9",
            "must be one of auto, fp8_e5m2, fp8_e4m3, mxfp8, bf16, bfloat16, nvfp4, "
            "fp4_mx_block16; got 'fp9'",
        ),
        ("log-requests-level", 7, "must be one of 0, 1, 2, 3; got 7"),
        ("enable-metrics", "yes please", "is a switch: expects true or false, got 'yes please'"),
        ("enable-metrics", 1, "is a switch: expects true or false, got 1"),
        ("cuda-graph-bs-decode", [1, "two"], "item 2: expects an integer, got 'two'"),
        ("cuda-graph-bs-decode", [], "expects at least one value, got an empty list"),
        ("context-bucket", "32q", "expects an integer (suffixes"),
        ("default-chat-template-kwargs", "{rope", "expects a JSON string, got '{rope'"),
        ("served-model-name", False, "expects a string, got false"),
    ],
)
def test_values_sglang_refuses_are_explained(catalog, name, value, message):
    problem = catalog.check_value(spec_of(catalog, name), value)
    assert problem is not None
    assert problem.startswith(message)


def test_choices_on_a_list_flag_are_checked_per_item():
    spec = FlagSpec(
        flag="--colors",
        aliases=(),
        dest="colors",
        kind="list",
        type="str",
        choices=("red", "green"),
        default=None,
        nargs="*",
    )
    catalog = Catalog("test", [spec])
    assert catalog.check_value(spec, ["red", "green"]) is None
    assert catalog.check_value(spec, []) is None
    assert catalog.check_value(spec, "blue") == "must be one of red, green; got 'blue'"


def test_unknown_version_names_the_supported_ones_and_the_fix():
    with pytest.raises(RenderError) as raised:
        load_catalog("0.4.0")
    message = str(raised.value)
    assert message.startswith("no flag catalog for SGLang 0.4.0; supported: 0.5.22, 0.5.23.")
    assert "To fix: set sglang_version to a supported version" in message
    assert "`make catalog`" in message


def test_path_like_versions_are_not_read_as_files():
    with pytest.raises(RenderError):
        load_catalog("../catalogs/0.5.23")


def test_catalogs_are_loaded_once():
    assert load_catalog("0.5.23") is load_catalog("0.5.23")
    assert supported_versions() == ["0.5.22", "0.5.23"]


def test_a_mapping_for_a_json_flag_is_told_to_be_quoted(catalog):
    spec = spec_of(catalog, "cuda-graph-config")
    assert catalog.check_value(spec, '{"decode": {"max_bs": 256}}') is None
    assert catalog.check_value(spec, "[1]") == "expects a JSON object, got '[1]'"
    problem = catalog.check_value(spec, {"decode": {}})
    assert problem == "expects a single value, got a mapping; quote it as a JSON string"


@pytest.mark.parametrize(
    ("flag", "replacement"),
    [
        ("disable-cuda-graph", "--cuda-graph-backend-{decode,prefill}=disabled"),
        ("enable-dp-attention", "--attn-dp-size <dp-size>"),
        ("grpc-mode", "--smg-grpc-mode"),
        ("enable-flashinfer-allreduce-fusion", "--flashinfer-allreduce-fusion-backend=auto"),
        ("tp-size", None),
    ],
)
def test_a_deprecated_flag_names_sglangs_replacement(catalog, flag, replacement):
    assert spec_of(catalog, flag).replacement == replacement

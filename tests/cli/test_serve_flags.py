"""`specserve serve`'s flags -> ServerSettings, before any model loads."""
import pytest

from specserve.cli import build_parser
from specserve.cli.common import CliError
from specserve.cli.serve import settings_from


def served_name(*argv: str) -> str:
    args = build_parser().parse_args(["serve", *argv])
    return settings_from(args, "/models/some-target.gguf").model_name


def test_the_served_model_is_named_after_the_pairs_target_without_m():
    assert served_name() == "qwen2.5-coder-1.5b-f16"
    assert served_name("--pair", "smollm2") == "smollm2-f16"


def test_a_packaged_name_a_path_and_an_alias_name_the_model():
    assert served_name("-m", "smollm2-f16") == "smollm2-f16"
    assert served_name("-m", "/models/some-target.gguf") == "some-target"
    assert served_name("--pair", "smollm2", "--alias", "mine") == "mine"


def settings(*argv: str):
    return settings_from(build_parser().parse_args(["serve", *argv]), "/models/some-target.gguf")


def test_sleep_idle_seconds_is_off_by_default_and_must_be_positive():
    assert settings().sleep_idle_seconds == -1
    assert settings("--sleep-idle-seconds", "2.5").sleep_idle_seconds == 2.5
    for bad in ("0", "-3", "nan"):
        with pytest.raises(CliError, match="sleep_idle_seconds must be > 0"):
            settings("--sleep-idle-seconds", bad)


def test_sleep_idle_seconds_with_replicas_is_refused_with_the_reason():
    args = build_parser().parse_args(["serve", "--replicas", "2", "--sleep-idle-seconds", "5"])
    with pytest.raises(CliError, match="--sleep-idle-seconds is for one server"):
        args.run(args)


def test_spec_synth_rates_is_accepted_with_a_warning_and_changes_no_speculation(caplog):
    """Issue 63: llama.cpp's test_with_and_without_draft starts llama-server with it; it exited 2 here."""
    from specserve.cli.llama_flags import llama_overrides

    plain = build_parser().parse_args(["serve"])
    args = build_parser().parse_args(["serve", "--spec-synth-rates", "0.5,0.3"])
    with caplog.at_level("WARNING", logger="specserve.server"):
        llama_overrides(args)
    assert "--spec-synth-rates" in caplog.text and "ignored" in caplog.text
    assert args.spec == plain.spec and settings("--spec-synth-rates", "0").model_name == settings().model_name
    with pytest.raises(CliError, match="--spec-synth-len is not supported"):
        llama_overrides(build_parser().parse_args(["serve", "--spec-synth-len", "4"]))

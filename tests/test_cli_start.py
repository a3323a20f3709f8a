"""`vrag-rollout --help` (and every subcommand's) starts without loading torch, tensordict or vLLM:
the package's public names are imported on first use. Checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

COMMANDS = [[], ["demo"], ["rollout"], ["learn"], ["check"], ["view"], ["convert-dataset"]]
# Each command's --help in turn, in one fresh interpreter (a start each cost 0.25 s): the heavy
# libraries loaded after each, which can only grow, so the first command that loads one is named.
PROBE = """
import io, json, sys
from contextlib import redirect_stdout
from vrag_rollout.cli import main
heavy_names = ("torch", "tensordict", "vllm", "transformers")
for command in json.loads(sys.argv[1]):
    shown = io.StringIO()
    try:
        with redirect_stdout(shown):
            main(command + ["--help"])
    except SystemExit:
        pass
    heavy = sorted(name for name in heavy_names if name in sys.modules)
    print(json.dumps({"command": command, "usage": "usage: vrag-rollout" in shown.getvalue(), "heavy": heavy}))
"""


@pytest.mark.process
def test_help_loads_no_heavy_library():
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(COMMANDS)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = [json.loads(line) for line in done.stdout.splitlines()]
    assert [row["command"] for row in seen] == COMMANDS, done.stdout[-500:]
    assert [row["command"] for row in seen if not row["usage"]] == []
    assert [(row["command"], row["heavy"]) for row in seen if row["heavy"]] == []


def test_the_public_names_resolve_on_first_use():
    import vrag_rollout

    assert vrag_rollout.AgentRolloutConfig().load_format == "auto"
    from vrag_rollout import DataProto, PromptSample, build_prompts, vLLMRolloutAgent  # noqa: F401

    assert set(vrag_rollout.__all__) <= set(dir(vrag_rollout))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        vrag_rollout.nope


@pytest.mark.parametrize("command", ["demo", "learn"])
def test_a_model_directory_that_cannot_run_is_one_line_and_exit_2(command, tmp_path, capsys):
    from vrag_rollout.cli import main

    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text('{"model_type": "llama"}')
    for model, message in ((tmp_path / "missing", "not a local model directory"),
                           (tmp_path / "llama", "model_type 'llama' is not supported")):
        assert main([command, "--model", str(model), "--out", str(tmp_path / "out")]) == 2
        said = capsys.readouterr().err
        assert message in said and said.startswith(f"vrag-rollout {command}: error: ") and "usage:" not in said
    assert not (tmp_path / "out").exists()



def test_every_option_of_every_subcommand_is_explained():
    import argparse

    from vrag_rollout.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    silent = [f"{name} {action.option_strings or action.dest}"
              for name, sub in subparsers.choices.items() for action in sub._actions
              if not isinstance(action, argparse._HelpAction) and not action.help]
    assert silent == []


@pytest.mark.parametrize("command", ["demo", "learn"])
def test_help_shows_no_empty_default(command, capsys):
    from vrag_rollout.cli import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in help_text
    assert "(default qwen2-vl)" in help_text  # the family option still says what runs without it


def test_a_value_error_in_a_subcommand_is_one_line_and_a_usage_error_shows_the_usage(capsys):
    """A value out of range is one line (issue 48: no usage tail for a value error); a choice the
    subcommand does not offer is a usage error and still prints that subcommand's usage."""
    from vrag_rollout.cli import main

    assert main(["learn", "--n", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vrag-rollout learn: error: ") and "n must be >= 2" in err and "usage:" not in err
    assert err.count("vrag-rollout learn:") == 1  # the prefix once
    with pytest.raises(SystemExit) as exit_info:
        main(["learn", "--guard", "nope"])
    assert exit_info.value.code == 2 and capsys.readouterr().err.startswith("usage: vrag-rollout learn")


def test_learn_on_a_question_file_says_to_convert_it_first(tmp_path, capsys):
    from vrag_rollout.cli import main

    (tmp_path / "samples.json").write_text('[{"query": "q", "reference_answer": "a"}]')
    assert main(["learn", "--data", str(tmp_path / "samples.json"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "usage:" not in err
    assert "not a parquet file" in err and f"vrag-rollout convert-dataset {tmp_path / 'samples.json'}" in err
    assert not (tmp_path / "out").exists()

"""What the commands say to a person (issue 33, item 10): counts with their noun in the singular
for one (`learn`'s summary, `convert-dataset`'s report, the view's captions); `view --truths`
with a file of other questions refused, and one lacking some warned about; no GPU-only warnings
on a CPU run. Fast: small batches built here, no engine."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from vrag_rollout.cli import main as cli_main
from vrag_rollout.devkit.learn_report import summary_line
from vrag_rollout.verify.saved_batch import FORMAT, FORMAT_VERSION


# --------------------------------------------------------------------------- plurals


@pytest.mark.parametrize("window, steps, said", [
    (1, 1, "reward over the first step 0.100, over the last step 0.300 (gain +0.200, 1 step)"),
    (1, 3, "reward over the first step 0.100, over the last step 0.300 (gain +0.200, 3 steps)"),
    (2, 8, "reward over the first 2 steps 0.100, over the last 2 0.300 (gain +0.200, 8 steps)"),
])
def test_the_learn_summary_says_step_for_one_step(window, steps, said):
    assert summary_line({"window": window, "steps": steps, "first": 0.1, "last": 0.3, "gain": 0.2}) == said


def test_convert_dataset_says_page_for_a_one_page_document(tmp_path, capsys):
    from tests.rollout.test_dataset import make_index, question, write_jsonl

    index = make_index(tmp_path, {"report": 1, "guide": 2})
    source = write_jsonl(tmp_path / "qa.jsonl", [question("a", pages=[1]), question("b", pages=[2]),
                                                 question("c", file_name="guide.pdf", pages=[3])])
    assert cli_main(["convert-dataset", str(source), "--out", str(tmp_path / "t.parquet"), "--index", str(index),
                     "--drop-missing"]) == 0
    printed = capsys.readouterr().out
    assert "wrote 1 of 3 questions" in printed
    assert "question b: gold page(s) [2] past the end of 'report' (1 page)" in printed
    assert "question c: gold page(s) [3] past the end of 'guide' (2 pages)" in printed


# --------------------------------------------------------------------------- view --truths

TOKENS = {1: "<|im_start|>user\n", 2: "<|im_end|>", 3: "<answer>", 4: "1", 5: "</answer>"}


def saved_batch(path, questions: list[str]):
    """A saved batch of one sample per question, each prompt `user: <question>`, each response
    `<answer>1</answer>`: what the view reads, without a rollout."""
    texts = {**TOKENS, **{10 + k: text for k, text in enumerate(questions)}}
    prompts = torch.tensor([[1, 10 + k, 2] for k in range(len(questions))])
    responses = torch.tensor([[3, 4, 5]] * len(questions))
    size = len(questions)
    batch = {
        "format": FORMAT, "version": FORMAT_VERSION, "images": [[] for _ in questions], "token_text": texts,
        "tensors": {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
                    "attention_mask": torch.ones(size, 6, dtype=torch.long),
                    "response_mask": torch.ones(size, 3, dtype=torch.long),
                    "loss_mask": torch.ones(size, 3, dtype=torch.long)},
        "columns": {"doc_id": ["d"] * size, "termination_reason": ["answered"] * size, "page_ids": [[]] * size,
                    "num_turns": [1] * size, "num_searches": [0] * size, "num_fetches": [0] * size},
    }
    torch.save(batch, path)
    return path


def view(tmp_path, questions: list[str], truths: dict) -> int:
    (tmp_path / "truths.json").write_text(json.dumps(truths))
    batch = saved_batch(tmp_path / "batch.pt", questions)
    return cli_main(["view", str(batch), "-o", str(tmp_path / "out.html"), "--truths", str(tmp_path / "truths.json")])


def test_view_refuses_truths_that_match_no_question_of_the_batch(tmp_path, capsys):
    long = "Which chapter of the annual report of the year before last covers the pension fund?"
    assert view(tmp_path, [long, "Who?"], {"What is the capital of France?": "Paris"}) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and len(printed.err.splitlines()) == 1, printed
    said = printed.err
    assert str(tmp_path / "truths.json") in said and "nothing written" in said
    assert "holds 1 question (e.g. 'What is the capital of France?')" in said
    assert "the batch asks 2 (e.g. 'Which chapter of the annual report of the year before last…')" in said
    assert not (tmp_path / "out.html").exists()


def test_view_warns_about_the_questions_its_truths_lack_and_writes_the_page(tmp_path, capsys):
    assert view(tmp_path, ["Who?", "Where?", "When?"], {"Who?": "1", "  When? ": "1"}) == 0
    printed = capsys.readouterr()
    assert printed.err == (f"view: warning: --truths {tmp_path / 'truths.json'} has no ground truth for 1 of the "
                           "batch's 3 questions (e.g. 'Where?'): their episodes show none\n")
    page = (tmp_path / "out.html").read_text()
    assert page.count('<td class="truth">1</td>') == 2


def test_view_with_truths_for_every_question_says_nothing_more(tmp_path, capsys):
    assert view(tmp_path, ["Who?"], {"Who?": "1"}) == 0
    printed = capsys.readouterr()
    assert printed.err == "" and "1 episode ·" in (tmp_path / "out.html").read_text()
    assert "prompt (3 tokens, 0 images)" in (tmp_path / "out.html").read_text()


# --------------------------------------------------------------------------- start-up noise on CPU

CPU_NOISE = {"vllm.triton_utils.importing": "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
             "torch.utils.cpp_extension": "No CUDA runtime is found, using CUDA_HOME='%s'"}


def test_configure_cpu_defaults_drops_only_the_gpu_warnings(monkeypatch):
    from vrag_rollout.engine.llm import configure_cpu_defaults

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # its defaults stay in this test
    configure_cpu_defaults()
    configure_cpu_defaults()  # again: nothing added twice
    for name, noise in CPU_NOISE.items():
        logger = logging.getLogger(name)
        assert len(logger.filters) == 1
        assert not logger.filter(logger.makeRecord(name, logging.WARNING, __file__, 1, noise, ("/usr/local",), None))
        assert logger.filter(logger.makeRecord(name, logging.WARNING, __file__, 1, "something else", (), None))


STARTS_VLLM = """
import sys
if sys.argv[1] == "configured":
    from vrag_rollout.engine.llm import configure_cpu_defaults
    configure_cpu_defaults()
import torch.utils.cpp_extension
import vllm.triton_utils.importing
"""


@pytest.mark.engine  # two processes importing vLLM
def test_a_cpu_run_starts_without_the_gpu_warnings(tmp_path):
    """vLLM's import and torch's extension module, as an engine start imports them (CUDA_HOME
    set, no GPU visible), print their GPU-only warnings; not after `configure_cpu_defaults`."""
    env = {**os.environ, "CUDA_HOME": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    runs = {way: subprocess.Popen([sys.executable, "-c", STARTS_VLLM, way], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for way in ("plain", "configured")}
    said = {way: run.communicate(timeout=120) for way, run in runs.items()}
    assert all(run.returncode == 0 for run in runs.values()), said
    for line in ("Triton is installed, but doesn't include CPU backend", "No CUDA runtime is found"):
        assert line in said["plain"][1]  # the control: this install does print it
        assert line not in said["configured"][1], said["configured"][1]


def test_the_engine_commands_keep_torchs_cpp_log_to_errors_without_a_gpu(monkeypatch):
    """vLLM's CPU worker prints a NUMA-binding notice through torch's C++ log, which no Python
    logger sees: the rollout commands set its level before torch loads (a user's setting wins)."""
    import glob

    from vrag_rollout import cli

    monkeypatch.setattr(glob, "glob", lambda pattern: [])  # no GPU device node
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    cli.quiet_cpu_start()
    assert cli.os.environ["TORCH_CPP_LOG_LEVEL"] == "ERROR"
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO")
    cli.quiet_cpu_start()
    assert cli.os.environ["TORCH_CPP_LOG_LEVEL"] == "INFO"
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL")
    monkeypatch.setattr(glob, "glob", lambda pattern: ["/dev/nvidia0"])
    cli.quiet_cpu_start()
    assert "TORCH_CPP_LOG_LEVEL" not in cli.os.environ
    assert set(cli.ENGINE_COMMANDS) == {"demo", "rollout", "learn", "evaluate"}

"""The tiny Qwen2-VL builder: deterministic, idempotent, and loadable by transformers and vLLM."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
from PIL import Image

from vrag_rollout.devkit import tiny_model
from vrag_rollout.devkit.tiny_model import SPECIAL_TOKENS, build_tiny_qwen2vl, default_model_dir
from vrag_rollout.core.vision import PixelBand, fit_to_band


def _digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


def test_two_builds_are_byte_identical_and_seed_matters(tmp_path, tiny_model_dir):
    a = build_tiny_qwen2vl(tmp_path / "a", seed=0)
    assert _digests(a) == _digests(tiny_model_dir)  # a fresh build equals the cached one
    assert {"model.safetensors", "tokenizer.json", "config.json", "generation_config.json"} <= set(_digests(a))
    b = build_tiny_qwen2vl(tmp_path / "b", seed=1)
    assert _digests(a)["model.safetensors"] != _digests(b)["model.safetensors"]


def test_build_is_idempotent_and_redoes_half_built_dirs(tmp_path, monkeypatch):
    out = build_tiny_qwen2vl(tmp_path / "m")
    before = _digests(out)
    calls = []
    monkeypatch.setattr(tiny_model, "_build_into", lambda d, seed, family: calls.append(d))
    assert build_tiny_qwen2vl(out) == out and calls == []  # complete: reused
    monkeypatch.undo()

    (out / tiny_model.MARKER_NAME).unlink()  # simulate a crash before the marker was written
    (out / "model.safetensors").write_bytes(b"half")
    assert build_tiny_qwen2vl(out) == out
    assert _digests(out) == before

    marker = json.loads((out / tiny_model.MARKER_NAME).read_text())
    assert marker["builder_version"] == tiny_model.BUILDER_VERSION
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_default_model_dir(monkeypatch, tmp_path):
    version = tiny_model.BUILDER_VERSION
    monkeypatch.setenv("VRAG_ROLLOUT_CACHE", str(tmp_path))
    assert default_model_dir() == tmp_path / f"tiny-qwen2vl-compact-v{version}"
    assert default_model_dir("qwen2.5-vl", "released") == tmp_path / f"tiny-qwen25vl-released-v{version}"
    monkeypatch.delenv("VRAG_ROLLOUT_CACHE")
    assert default_model_dir() == Path.home() / ".cache" / "vrag-rollout" / f"tiny-qwen2vl-compact-v{version}"
    with pytest.raises(ValueError, match="unknown tiny-model shape 'huge'"):
        default_model_dir("qwen2-vl", "huge")


def test_a_build_of_another_shape_is_replaced_not_reused(tmp_path):
    from transformers import AutoConfig

    out = build_tiny_qwen2vl(tmp_path / "m")
    assert tiny_model.built_shape(out) == "compact"
    assert build_tiny_qwen2vl(out, shape="released") == out
    assert tiny_model.built_shape(out) == "released"
    assert AutoConfig.from_pretrained(out).text_config.vocab_size == 151936
    assert tiny_model.built_shape(tmp_path) is None  # not a tiny model


def test_the_cli_builds_either_shape(tmp_path, capsys):
    from vrag_rollout.cli import main

    assert main(["build-tiny-model", str(tmp_path / "r"), "--shape", "released", "--family", "qwen3-vl"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "r")
    assert tiny_model.built_shape(tmp_path / "r") == "released"
    with pytest.raises(SystemExit):
        main(["build-tiny-model", "--shape", "huge"])


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer, GenerationConfig

    return (
        AutoTokenizer.from_pretrained(tiny_model_dir),
        AutoProcessor.from_pretrained(tiny_model_dir),
        AutoConfig.from_pretrained(tiny_model_dir),
        GenerationConfig.from_pretrained(tiny_model_dir),
    )


def test_tokenizer_special_tokens_round_trip(hf):
    tok, _, config, gen = hf
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    assert len(set(ids.values())) == len(SPECIAL_TOKENS)
    for t, i in ids.items():
        assert tok.encode(t, add_special_tokens=False) == [i]  # never split into pieces
        assert tok.decode([i]) == t
    text = "<think>find page 3</think><search>annual report</search><|im_end|>"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert len(tok) < config.text_config.vocab_size  # padded, as the released embedding is
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert sorted(gen.eos_token_id) == sorted([ids["<|im_end|>"], ids["<|endoftext|>"]])
    assert config.image_token_id == ids["<|image_pad|>"]
    assert config.vision_start_token_id == ids["<|vision_start|>"]
    assert config.vision_end_token_id == ids["<|vision_end|>"]


def test_chat_template_and_processor_expand_images(hf):
    tok, processor, _, _ = hf
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "which page?"}]}]
    text = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>which page?<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    out = processor(text=[text], images=[Image.new("RGB", (280, 140), "white")], return_tensors="pt")
    grid = out["image_grid_thw"][0].tolist()
    assert grid == [1, 10, 20]
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    assert int((out["input_ids"] == pad).sum()) == 10 * 20 // 4


def test_transformers_model_forward_with_image(tiny_model_dir, hf):
    from transformers import Qwen2VLForConditionalGeneration

    _, processor, _, _ = hf
    model = Qwen2VLForConditionalGeneration.from_pretrained(tiny_model_dir).eval()
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "read"}]}]
    text = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[Image.new("RGB", (112, 112), "gray")], return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits
    # logits are as wide as the padded embedding, wider than the tokenizer (the released shape)
    assert logits.shape == (1, inputs["input_ids"].shape[1], model.config.text_config.vocab_size)
    assert logits.shape[-1] > len(processor.tokenizer)
    assert torch.isfinite(logits).all()


PROTOCOL = r"<think>[a-z ]{3,20}</think>(<search>[a-z ]{3,20}</search>|<fetch>(image|text), [1-9]</fetch>|<answer>[a-z ]{1,10}</answer>)"


def test_vllm_generates_protocol_actions_with_an_image(tiny_llm, tiny_model_dir):
    from transformers import AutoProcessor
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    tok = tiny_llm.get_tokenizer()
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "find the report"}]}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    prompt = list(enc if isinstance(enc, list) else enc["input_ids"])  # transformers 5: BatchEncoding
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    assert prompt.count(ids["<|image_pad|>"]) == 1  # vLLM expands the single pad itself
    ban = {ids[t]: -100.0 for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>")}
    sps = [
        SamplingParams(
            max_tokens=80, temperature=1.0, seed=i, logit_bias=ban, stop=["</search>", "</fetch>"],
            include_stop_str_in_output=True, structured_outputs=StructuredOutputsParams(regex=PROTOCOL),
        )
        for i in range(16)  # distinct seeds: identical seeds would give identical samples
    ]
    # A page fitted into the band by vision.fit_to_band: vLLM's own processor must expand the
    # single pad into exactly page.num_tokens pads (the page is a fixed point of its resize).
    band = PixelBand.from_processor(AutoProcessor.from_pretrained(tiny_model_dir))
    page = fit_to_band(Image.new("RGB", (211, 277), "white"), band)
    req = {"prompt_token_ids": prompt, "multi_modal_data": {"image": [page.image]}}
    outs = tiny_llm.generate([req] * len(sps), sps, use_tqdm=False)
    seen = set()
    eos = {ids["<|im_end|>"], ids["<|endoftext|>"]}
    for o in outs:
        c = o.outputs[0]
        assert re.fullmatch(PROTOCOL, c.text), c.text
        # RequestOutput.prompt_token_ids is the expanded prompt: one pad became num_tokens pads.
        assert list(o.prompt_token_ids).count(ids["<|image_pad|>"]) == page.num_tokens
        assert len(o.prompt_token_ids) == len(prompt) - 1 + page.num_tokens
        assert c.finish_reason == "stop"
        action = re.search(r"<(search|fetch|answer)>", c.text).group(1)
        seen.add(action)
        if action == "answer":  # ends on an EOS id (stop_reason None for the tokenizer's EOS)
            assert c.token_ids[-1] in eos and c.stop_reason in (None, ids["<|endoftext|>"])
        else:
            assert c.stop_reason == f"</{action}>"
    assert seen == {"search", "fetch", "answer"}

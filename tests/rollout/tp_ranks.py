"""One rank of a two-rank tensor-parallel group, run in its own process by test_tensor_parallel.py.

Every rank runs the real rollout loop and the real retriever client over a deterministic scripted
engine (a stand-in for the collective vLLM engine, which must receive identical requests on every
rank). Rank 1's retriever is down; rank 0's answers from the recorded fixtures after a random,
per-process delay. The rank writes what it saw to a pickle for the test to compare.
"""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import torch.distributed as dist


class ScriptedEngine:
    """What a turn says is a function of its request's seed alone; each request finishes a
    seed-dependent number of steps after it was added. Every request is logged in order."""

    def __init__(self, tokenizer, queries):
        self.tokenizer, self.queries = tokenizer, queries
        self.llm_engine = self
        self.log: list = []
        self._pending: dict = {}
        self._steps = 0

    def _turn(self, params):
        seed = params.seed
        kind = seed % 3
        if kind == 0:
            text, stop = f"<search>{self.queries[seed % len(self.queries)]}</search>", "</search>"
        elif kind == 1:
            text, stop = f"<fetch>image, {seed % 4 + 1}</fetch>", "</fetch>"
        else:
            text, stop = "<answer>done</answer>", None
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if stop is None:
            ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        finish = "stop" if len(ids) <= params.max_tokens else "length"
        completion = SimpleNamespace(token_ids=ids[: params.max_tokens], text=text, finish_reason=finish,
                                     stop_reason=stop if finish == "stop" else None, logprobs=None)
        return SimpleNamespace(outputs=[completion])

    @staticmethod
    def _fingerprint(prompt):
        images = prompt.get("multi_modal_data", {}).get("image", [])
        return (tuple(prompt["prompt_token_ids"]), tuple(image.size for image in images))

    def generate(self, prompts, params, use_tqdm=False):
        self.log.append(("generate", [(self._fingerprint(p), sp.seed) for p, sp in zip(prompts, params)]))
        return [self._turn(sp) for sp in params]

    def add_request(self, request_id, prompt, params):
        self.log.append(("add", self._steps, request_id, self._fingerprint(prompt), params.seed))
        self._pending[request_id] = (self._steps + params.seed % 4 + 1, self._turn(params))

    def has_unfinished_requests(self):
        return bool(self._pending)

    def abort_request(self, request_ids):
        for request_id in request_ids:
            self._pending.pop(request_id, None)

    def step(self):
        self._steps += 1
        done = [rid for rid, (due, _) in self._pending.items() if due <= self._steps]
        out = []
        for rid in sorted(done):
            _, result = self._pending.pop(rid)
            out.append(SimpleNamespace(request_id=rid, finished=True, outputs=result.outputs))
        return out


class Down:
    def post(self, path, body, timeout):
        from vrag_rollout.retrieval.client import TransportConnectionError

        raise TransportConnectionError("connection refused (this rank's retriever is down)")

    def get(self, path, timeout):
        return self.post(path, {}, timeout)

    def close(self):
        pass


def run_rank(rank: int, port: int, model_dir: str, out_path: str) -> None:
    from transformers import AutoProcessor

    from retriever_server.sample_corpus import SAMPLE_FACTS
    from tests.rollout.agent_helpers import DelayedReplay, prompt_batch, sample_prompts
    from vrag_rollout import vLLMRolloutAgent
    from vrag_rollout.devkit.demo import demo_config, demo_page_band
    from vrag_rollout.engine.group_sync import GroupSync, LocalSync
    from vrag_rollout.retrieval.client import RetrieverClient

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        processor = AutoProcessor.from_pretrained(model_dir)
        transport = DelayedReplay() if rank == 0 else Down()
        seen = {}
        for mode in ("sync", "continuous"):
            for synced in (True, False):
                engine = ScriptedEngine(processor.tokenizer, sorted(SAMPLE_FACTS))
                client = RetrieverClient(None, transport=transport, retries=0)
                # One TP group of two ranks: one data-parallel rank, so both ranks derive the same seeds.
                # Synced, rank 1 (its retriever down) takes rank 0's preflight verdict and passes
                # it; unsynced it would refuse its own batch, so the check is off there.
                config = demo_config(**demo_page_band(processor), n=2, max_turns=4, rollout_mode=mode,
                                     action_regex=None, tensor_parallel_size=2,
                                     retriever_preflight="fail" if synced else "off")
                agent = vLLMRolloutAgent(model_dir, config, processor.tokenizer, processor, inference_engine=engine,
                                         retriever=client,
                                         group_sync=GroupSync(dist.group.WORLD, 0) if synced else LocalSync())
                output = agent.generate_sequences(prompt_batch(processor, sample_prompts(4), agent))
                seen[(mode, synced)] = {
                    "responses": output.batch["responses"].tolist(),
                    "loss_mask": output.batch["loss_mask"].tolist(),
                    "position_ids": output.batch["position_ids"].tolist(),
                    "termination": list(output.non_tensor_batch["termination_reason"]),
                    "page_ids": [list(p) for p in output.non_tensor_batch["page_ids"]],
                    "retriever_errors": output.meta_info["metrics"]["rollout/retriever_errors"],
                    "engine_log": engine.log,
                }
        with open(out_path, "wb") as f:
            pickle.dump(seen, f)
    finally:
        dist.destroy_process_group()

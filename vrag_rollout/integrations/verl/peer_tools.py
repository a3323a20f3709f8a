"""The agent's two tools as verl `BaseTool`s, for verl's own `tool_agent` loop (`ToolAgentLoop`).

`SearchTool` (`search`) and `FetchTool` (`fetch`) are what `vrag_agent` does in its native
tool-call format, in verl's tool contract, so verl's loop can run the same task against the
same retriever (scripts/bench_verl.py runs the two loops side by side):

- schemas: `core.tool_turns.TOOLS` (`search(query)`, `fetch(page, mode)`), the very schemas
  `vrag_agent` renders into its prompts, so both loops' system turns are the same;
- retrieval: the project's `RetrieverClient` (`batch_search` of one query with `top_n`,
  `batch_fetch` of one `FetchSpec`), in a worker thread so the event loop of verl's worker goes on;
- pages: decoded and resized into the agent's pixel band (`core.vision.page_band` of the
  model's processor, narrowed by `page_min_pixels`/`page_max_pixels`, and `decode_page` /
  `decode_page_file`), returned as PIL images in `ToolResponse.image` (verl does not resize tool
  images: the band is the tool's business); the text beside them names the pages as the agent's
  observations do (`pages: id, id`; `page id:` then a text page's contents, cut to
  `max_text_chars` when set; `no pages found.` style text when nothing matched; `error: ...` for a
  retriever failure or bad arguments, never an exception);
- the document: each trajectory's `doc_id` comes from its row's `tools_kwargs`
  (`{"search": {"create_kwargs": {"doc_id": ...}}, "fetch": {...}}`, verl's per-row tool
  arguments), kept per instance between `create` and `release`.

Config (the tool YAML's `config`, or the dict given to the constructor): `retriever_url` (or
`client`: a `RetrieverClient` to share), `top_n` (default 2), `model_path` (or `band`: a
`PixelBand`), `page_min_pixels`, `page_max_pixels`, `timeout`, `retries`, `max_concurrency`,
`max_text_chars`. Instances are shared by every trajectory of a worker and are thread-safe.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any, Optional

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from ...core.observation import NO_PAGES
from ...core.tool_turns import FETCH_TOOL, SEARCH_TOOL
from ...core.vision import ImageDecodeError, decode_page, decode_page_file, page_band
from ...retrieval.client import FetchSpec, RetrieverClient, RetrieverFailure


class _RetrieverTool(BaseTool):
    schema: dict = {}

    def __init__(self, config: Optional[dict] = None, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        super().__init__(dict(config or {}), tool_schema)
        config = self.config
        self.client = config.get("client") or RetrieverClient(
            config["retriever_url"], timeout=float(config.get("timeout", 10.0)),
            retries=int(config.get("retries", 2)), max_concurrency=int(config.get("max_concurrency", 4)))
        self.top_n = int(config.get("top_n", 2))
        self.band = config.get("band") or self._band(config)
        self.max_text_chars = config.get("max_text_chars")
        self._doc_ids: dict[str, str] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _band(config: dict) -> Any:
        from transformers import AutoProcessor

        if not config.get("model_path"):
            raise ValueError("the tool needs `model_path` (or `band`): pages are resized into the model's pixel band")
        processor = AutoProcessor.from_pretrained(config["model_path"])
        return page_band(processor, config.get("page_min_pixels"), config.get("page_max_pixels"))

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.model_validate(self.schema)

    async def create(self, instance_id: Optional[str] = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        instance_id = instance_id or uuid.uuid4().hex
        create_kwargs = kwargs.get("create_kwargs") or {}
        doc_id = create_kwargs.get("doc_id", kwargs.get("doc_id"))
        with self._lock:
            if doc_id is not None:
                self._doc_ids[instance_id] = str(doc_id)
        return instance_id, ToolResponse()

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        with self._lock:
            self._doc_ids.pop(instance_id, None)

    def _doc_id(self, instance_id: str) -> Optional[str]:
        with self._lock:
            return self._doc_ids.get(instance_id)

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        doc_id = self._doc_id(instance_id)
        if doc_id is None:
            return ToolResponse(text="error: this question has no document to search."), 0.0, {}
        problem = self._invalid(parameters)
        if problem:
            return ToolResponse(text=f"error: {problem}"), 0.0, {}
        response = await asyncio.to_thread(self._run, doc_id, parameters)
        return response, 0.0, {}

    def _invalid(self, parameters: dict) -> Optional[str]:
        raise NotImplementedError

    def _run(self, doc_id: str, parameters: dict) -> ToolResponse:
        raise NotImplementedError

    def _answer(self, outcome: Any) -> ToolResponse:
        """One retriever outcome (pages, a page or a failure) as the tool's answer."""
        if isinstance(outcome, RetrieverFailure):
            return ToolResponse(text=f"error: {outcome.message}")
        found = outcome if isinstance(outcome, list) else [outcome]
        if not found:
            return ToolResponse(text=NO_PAGES)
        if found[0].modality == "text":
            text = found[0].contents if isinstance(found[0].contents, str) else str(found[0].contents)
            if self.max_text_chars is not None:
                text = text[: int(self.max_text_chars)]
            return ToolResponse(text=f"page {found[0].page_id}:\n{text}")
        pages = [(self._decode(page), page.page_id) for page in found]
        images = [(image, page_id) for image, page_id in pages if image is not None]
        if not images:
            return ToolResponse(text="error: the page images could not be decoded.")
        return ToolResponse(image=[image for image, _ in images],
                            text="pages: " + ", ".join(page_id for _, page_id in images))

    def _decode(self, page: Any) -> Any:
        try:
            if isinstance(page.contents, (bytes, bytearray)):
                return decode_page_file(bytes(page.contents), self.band).image
            return decode_page(page.contents, self.band).image
        except ImageDecodeError:
            return None


class SearchTool(_RetrieverTool):
    """`search(query)`: the `top_n` best pages of the trajectory's document, as images."""

    schema = SEARCH_TOOL

    def _invalid(self, parameters: dict) -> Optional[str]:
        query = parameters.get("query")
        if not isinstance(query, str) or not query.strip():
            return "search needs a non-empty string `query`."
        return None

    def _run(self, doc_id: str, parameters: dict) -> ToolResponse:
        (outcome,) = self.client.batch_search([parameters["query"].strip()], [doc_id], self.top_n)
        return self._answer(outcome)


class FetchTool(_RetrieverTool):
    """`fetch(page, mode)`: one page of the trajectory's document, as an image or its text."""

    schema = FETCH_TOOL

    def _invalid(self, parameters: dict) -> Optional[str]:
        page, mode = parameters.get("page"), parameters.get("mode")
        if isinstance(page, bool) or not isinstance(page, int) or page < 1:
            return "fetch needs an integer `page` from 1."
        if mode not in ("image", "text"):
            return "fetch needs `mode` \"image\" or \"text\"."
        return None

    def _run(self, doc_id: str, parameters: dict) -> ToolResponse:
        (outcome,) = self.client.batch_fetch([FetchSpec(parameters["mode"], int(parameters["page"]))], [doc_id])
        return self._answer(outcome)

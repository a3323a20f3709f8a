"""A user's own documents and questions, written by the tests (not the sample corpus): two small
PDFs with a text layer, their retriever index, a question file naming them and its conversion."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# doc_id -> the text of each page (page numbers from 1)
OWN_DOCUMENTS = {
    "garden_plan": ["Tomatoes need six hours of sun.", "Water the basil every morning.",
                    "Compost bins sit by the north fence."],
    "bike_manual": ["Inflate the tyres to four bar.", "Oil the chain every month."],
}
OWN_QUESTIONS = [
    {"uid": "g1", "query": "Where do the compost bins sit?", "reference_answer": "north fence",
     "meta_info": {"file_name": "garden_plan.pdf", "reference_page": [3]}},
    {"uid": "b1", "query": "How hard are the tyres inflated?", "reference_answer": "four bar",
     "meta_info": {"file_name": "bike_manual.pdf", "reference_page": [1]}},
]


@dataclass(frozen=True)
class OwnData:
    documents: Path  # the PDFs
    index: Path  # their retriever index
    questions: Path  # the question file (VRAG-style JSON)
    parquet: Path  # its conversion against the index
    partial_index: Path  # an index of bike_manual alone: garden_plan is missing from it


def write_pdfs(folder: Path, documents: dict) -> list[Path]:
    from reportlab.lib.pagesizes import letter
    from reportlab.pdfgen import canvas

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for doc_id, pages in documents.items():
        path = folder / f"{doc_id}.pdf"
        pdf = canvas.Canvas(str(path), pagesize=letter, invariant=1)
        for text in pages:
            pdf.setFont("Helvetica", 28)
            pdf.drawString(72, 600, text)
            pdf.showPage()
        pdf.save()
        paths.append(path)
    return paths


def write_own_data(root: Path) -> OwnData:
    from retriever_server.indexing.indexer import build_index
    from vrag_rollout.data.dataset import convert_dataset

    pdfs = write_pdfs(root / "docs", OWN_DOCUMENTS)
    band = dict(min_pixels=32 * 28 * 28, max_pixels=128 * 28 * 28, progress=False)
    build_index(pdfs, root / "index", **band)
    build_index([path for path in pdfs if path.stem == "bike_manual"], root / "bike-index", **band)
    (root / "questions.json").write_text(json.dumps(OWN_QUESTIONS), encoding="utf-8")
    convert_dataset(root / "questions.json", root / "questions.parquet", index_dir=root / "index")
    return OwnData(root / "docs", root / "index", root / "questions.json", root / "questions.parquet",
                   root / "bike-index")

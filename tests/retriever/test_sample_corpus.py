import hashlib

import pypdfium2 as pdfium

from retriever_server.backends.bm25 import tokenize
from retriever_server.sample_corpus import SAMPLE_DOC_IDS, SAMPLE_FACTS, write_sample_corpus


def _digests(paths):
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def test_corpus_is_byte_for_byte_reproducible(tmp_path, sample_pdfs):
    again = write_sample_corpus(tmp_path)
    assert [p.name for p in again] == [p.name for p in sample_pdfs]
    assert _digests(again) == _digests(sample_pdfs)


def test_three_multi_page_pdfs_with_simple_ids(sample_pdfs):
    assert tuple(p.stem for p in sample_pdfs) == SAMPLE_DOC_IDS
    for path in sample_pdfs:
        pdf = pdfium.PdfDocument(path)
        assert 3 <= len(pdf) <= 5
        pdf.close()


def test_fact_terms_are_on_their_page(sample_pdfs):
    by_id = {p.stem: p for p in sample_pdfs}
    for query, (doc_id, page) in SAMPLE_FACTS.items():
        pdf = pdfium.PdfDocument(by_id[doc_id])
        text = pdf[page - 1].get_textpage().get_text_range()
        pdf.close()
        page_tokens = set(tokenize(text))
        missing = [t for t in tokenize(query) if t not in page_tokens]
        assert not missing, (query, missing)

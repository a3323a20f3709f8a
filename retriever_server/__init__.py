"""Page-image retriever: index PDFs and page images, search inside one document, fetch a page."""

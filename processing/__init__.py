"""Pure document processing: page markdown from text and HTML, header/footer clean-up, OCR layout, chunking.

No I/O to external systems and no orchestration here: resources/ (adapters) and orchestration/ (Dagster) call
these functions; the import-linter contracts in pyproject.toml keep it so.
"""

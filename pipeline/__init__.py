"""PySpark data source and sink for trio-rmq topics (needs the `spark` extra)."""

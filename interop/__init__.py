"""Other projects' formats: their checkpoints read into ours and ours written back (peer_weights.py),
and EasyOCR's own recognizer run beside ours (easyocr_reader.py). Neither training nor evaluation
needs this package: scripts/import_weights.py, scripts/export.py and tools/compare_easyocr.py do."""

"""Other projects' formats: their checkpoints read into ours and ours written back (peer_weights.py),
and EasyOCR's own recognizer run beside ours (easyocr_reader.py); our models written for other
runtimes and checked against PyTorch: ONNX and torch.export programs (export.py), int8 ONNX models
with their accuracy gate (int8.py), and EasyOCR's custom-model folder (easyocr_export.py). Neither
training nor evaluation needs this package: scripts/import_weights.py, scripts/export.py and
tools/compare_easyocr.py do."""

"""Reading a model's output against the labels: the evaluation loop over every rank (evaluate.py), the
metrics (metrics.py), the decoders (decoders.py: greedy, beam, lexicon), long crops read in pieces
(long_crops.py), the --dump file (prediction_dump.py), two models on the same words (paired.py), accuracy
by slice and character confusions (slices.py), the images of readings (visualize.py), the confidence's
temperature and calibration error (calibration.py) and its reliability diagram (reliability.py)."""

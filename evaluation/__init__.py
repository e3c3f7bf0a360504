"""Reading a model's output against the labels: the evaluation loop over every rank (evaluate.py),
the metrics (metrics.py) and the images of readings (visualize.py)."""

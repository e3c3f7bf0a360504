"""Infrastructure any command needs and none is about text recognition: the config (config.py),
processes and devices (distributed.py, sync_batchnorm.py), precision (precision.py), random state
(rng.py), signals (preemption.py), one-line errors (cli.py) and the wording of a refused value (checks.py),
JSON-lines files (jsonl.py)."""

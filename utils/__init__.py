"""Infrastructure any command needs and none is about text recognition: processes and devices
(distributed.py, sync_batchnorm.py), precision (precision.py), random state (rng.py), signals
(preemption.py), one-line errors (cli.py) and the wording of a refused value (checks.py), files written
whole or not at all (atomic_write.py), run-folder files opened never through a symbolic link
(run_files.py), JSON-lines files (jsonl.py), the user's cache folder (cache_home.py),
and the memory a CPU process keeps (host_memory.py)."""

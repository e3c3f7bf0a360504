"""A training run: its schema (config.py: every key, its default and its range), its optimizers and
schedules (optim.py), what it trains with (setup.py), the checkpoint schema (checkpoint.py), the run
folder (run_folder.py), the log's sinks (run_log.py) and its numbers summed over ranks (log_window.py),
the state the loop changes (state.py), and the run as one object that saves and resumes in one call
each (run.py). The loop itself is train.py."""

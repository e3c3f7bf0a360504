"""A training run's state and files: the checkpoint schema (checkpoint.py), the run folder
(run_folder.py), the log's sinks (run_log.py) and its numbers summed over ranks (log_window.py),
what a run trains with (setup.py), the state the loop changes (state.py), and the run as one object
that saves and resumes in one call each (run.py). The loop itself is train.py."""

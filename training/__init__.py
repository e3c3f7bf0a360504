"""A training run: its schema (config.py: every key, its default and its range; config_yaml.py reads YAML
files and key=value overrides into it), its optimizers and
schedules (optim.py), the run set up from its config, in one place (setup.py), the checkpoint schema
(checkpoint.py), the run folder (run_folder.py), the log's sinks (run_log.py) and its numbers summed over
ranks (log_window.py), the state the loop changes (state.py), the run as one object, what it trains with
included, that saves and resumes in one call each (run.py), and train.max_minutes: its arithmetic
(time_budget.py) and the one object the loop calls (time_limit.py); the moving average of the weights
(weight_average.py) and precision auto's timing of fp32 against bf16 (precision_choice.py). The loop
itself is train.py; the check train.overfit_batches runs instead of it is overfit.py; train.calibrate's fit of
best.pt's temperature at the end is calibration.py. A fine-tune's alphabet, new or union, is decided in
alphabet_policy.py; what it keeps of its start (the frozen backbone, the start against best.pt) in
forgetting.py."""

"""The training log's window: the share of the time spent waiting for the loader, from a clock the test drives."""

from __future__ import annotations

import torch

from training import log_window
from training.log_window import LogWindow


def test_the_time_spent_waiting_for_batches_is_the_data_wait_share_of_the_window(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(log_window.time, "perf_counter", lambda: now[0])

    def slow_loader():  # each batch takes 3 s to arrive
        for number in range(2):
            now[0] += 3.0
            yield number

    window = LogWindow(torch.device("cpu"))
    for _ in window.timed(slow_loader()):
        now[0] += 7.0  # the step itself
        window.add(torch.tensor(1.0), torch.tensor(0), 0, 4)
    record = window.record(world_size=1)
    assert record["data_wait_share"] == 6.0 / 20.0 and record["images_per_s"] == 8 / 20.0
    now[0] += 5.0
    window.restart_clock()  # a validation's time is neither waiting nor training
    assert window.waiting == 0.0

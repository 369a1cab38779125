"""The trainer's progress line."""

from trainer.progress import format_duration, progress_line


def test_durations_read_naturally():
    assert format_duration(42.4) == "42s"
    assert format_duration(187) == "3m07s"
    assert format_duration(7500) == "2h05m"
    assert format_duration(float("inf")) == "?"


def test_progress_line_has_step_loss_speed_and_eta():
    line = progress_line(200, 1000, 0.43214, 40.0, 1280.0)
    assert line == "step 200/1000 (20%)  loss 0.43214  40.0 steps/s  1280 examples/s  ETA 20s"

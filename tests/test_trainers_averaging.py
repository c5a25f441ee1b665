"""Averaging strategies on scripted loss sequences, against expectations computed by hand.

The iterates are scalars: theta_t = t. An average of iterates a..b is then (a + b) / 2, so every
evaluation can be checked for which weights it scored and which it reported.
"""

from __future__ import annotations

import pytest
import torch

from lm_tuner.trainers.triggered_averaging import TriggeredAveraging, non_monotone_trigger, tail_trigger
from lm_tuner.trainers.two_tailed_averaging import TwoTailedAveraging


class Iterates:
    """theta_t = t, one scalar parameter."""

    def __init__(self) -> None:
        self.raw = [torch.zeros(1)]
        self.t = 0

    def advance(self, averaging, steps: int) -> None:
        for _ in range(steps):
            self.t += 1
            self.raw[0].fill_(self.t)
            averaging.add(self.raw)


def scripted(losses: dict[float, float], scored: list[float]):
    """A loss function that knows only the weight values in `losses`, and notes each value it scores."""

    def loss_of(weights):
        value = weights[0].item()
        assert value in losses, f"scored unexpected weights {value}; expected one of {sorted(losses)}"
        scored.append(value)
        return losses[value]

    return loss_of


# Two-Tailed Averaging, Algorithm 2, evaluation period E = 2, stagnation patience 2. Each row: the
# losses of the weights the evaluation must score (short average, long average, raw weights), then
# the reported (loss, weight value, averaging length). Hand derivation, S and L as iterate ranges:
TWO_TAILED_SCRIPT = [
    # t=2: S = L = 1..2 (scored once). Switch (F_S <= F_L), L = 1..2. Raw 4.0 <= 5.0 and L = E:
    # the raw weights have always been better, so both averages restart.
    ({1.5: 5.0, 2.0: 4.0}, (4.0, 2.0, 1)),
    # t=4: S = L = 3..4. Switch, L = 3..4; raw 3.2 > 3.0: report the long average.
    ({3.5: 3.0, 4.0: 3.2}, (3.0, 3.5, 2)),
    # t=6: S = 5..6 (2.9), L = 3..6 (2.5): no switch; raw 2.7 is worse.
    ({5.5: 2.9, 4.5: 2.5, 6.0: 2.7}, (2.5, 4.5, 4)),
    # t=8: S = 5..8 (2.95, no better than its 2.9: 1 evaluation without improvement), L = 3..8 (2.4).
    ({6.5: 2.95, 5.5: 2.4, 8.0: 2.6}, (2.4, 5.5, 6)),
    # t=10: S = 5..10 (2.92, 2 evaluations without improvement: stagnating, restarted), L = 3..10.
    ({7.5: 2.92, 6.5: 2.3, 10.0: 2.5}, (2.3, 6.5, 8)),
    # t=12: S = 11..12 (2.2) <= L = 3..12 (2.25): switch, L = 11..12, S restarts.
    ({11.5: 2.2, 7.5: 2.25, 12.0: 2.21}, (2.2, 11.5, 2)),
    # t=14: S = 13..14 (2.3), L = 11..14 (2.25, no better than its 2.2: 1 evaluation).
    ({13.5: 2.3, 12.5: 2.25, 14.0: 2.4}, (2.25, 12.5, 4)),
    # t=16: S = 13..16 (2.35) is worse, but L = 11..16 (2.26) is stagnating (2 evaluations): switch,
    # L = 13..16. Raw 2.3 <= 2.35: report the raw weights; L = 4 != E, so the averages are kept.
    ({14.5: 2.35, 13.5: 2.26, 16.0: 2.3}, (2.3, 16.0, 1)),
    # t=18: S = 17..18 (2.1) <= L = 13..18 (2.2): switch, L = 17..18. Raw 2.1 <= 2.1 and L = E:
    # Algorithm 2 restarts both averages.
    ({17.5: 2.1, 15.5: 2.2, 18.0: 2.1}, (2.1, 18.0, 1)),
    # t=20: S = L = 19..20 again, scored once; the average wins.
    ({19.5: 2.0, 20.0: 2.05}, (2.0, 19.5, 2)),
]


def test_two_tailed_averaging_follows_algorithm_2_on_a_scripted_run() -> None:
    iterates = Iterates()
    averaging = TwoTailedAveraging(iterates.raw, patience=2)
    for number, (losses, (loss, value, length)) in enumerate(TWO_TAILED_SCRIPT, 1):
        iterates.advance(averaging, 2)
        scored: list[float] = []
        reported = averaging.evaluate(iterates.raw, scripted(losses, scored), progress=0.0)
        assert sorted(scored) == sorted(losses), f"evaluation {number} scored {scored}"
        assert (reported.loss, reported.weights[0].item(), reported.length) == (loss, value, length), \
            f"evaluation {number}"
        if length == 1:
            assert reported.weights is iterates.raw


def test_two_tailed_averaging_state_round_trips() -> None:
    iterates = Iterates()
    averaging = TwoTailedAveraging(iterates.raw, patience=2)
    for losses, _ in TWO_TAILED_SCRIPT[:5]:
        iterates.advance(averaging, 2)
        averaging.evaluate(iterates.raw, scripted(losses, []), progress=0.0)
    restored = TwoTailedAveraging(iterates.raw, patience=2)
    restored.load_state_dict(averaging.state_dict())
    for instance in (averaging, restored):
        instance.add([torch.tensor([11.0])])
        instance.add([torch.tensor([12.0])])
    losses, (loss, value, length) = TWO_TAILED_SCRIPT[5]
    iterates.raw[0].fill_(12.0)
    for instance in (averaging, restored):
        reported = instance.evaluate(iterates.raw, scripted(losses, []), progress=0.0)
        assert (reported.loss, reported.weights[0].item(), reported.length) == (loss, value, length)


def test_nt_asgd_triggers_on_a_loss_worse_than_the_best_before_the_last_n() -> None:
    trigger = non_monotone_trigger(interval=2)
    history = [5.0, 4.0, 3.0, 3.5, 3.2, 3.1]
    # 3.5 is worse than the last evaluation but not than min([5.0]); 3.2 is not worse than min([5, 4]);
    # 3.1 is worse than min([5, 4, 3]) = 3.0.
    fired = [trigger(history[: n + 1], progress=0.0) for n in range(len(history))]
    assert fired == [False, False, False, False, False, True]


def test_nt_asgd_averages_every_iterate_after_the_trigger() -> None:
    iterates = Iterates()
    averaging = TriggeredAveraging(iterates.raw, non_monotone_trigger(interval=2))
    for loss in [5.0, 4.0, 3.0, 3.5, 3.2]:
        iterates.advance(averaging, 2)
        reported = averaging.evaluate(iterates.raw, lambda weights, loss=loss: loss, progress=0.0)
        assert reported.length == 1 and reported.weights is iterates.raw
    iterates.advance(averaging, 2)  # t = 12
    assert averaging.evaluate(iterates.raw, lambda weights: 3.1, progress=0.0).length == 1
    iterates.advance(averaging, 3)  # iterates 13, 14, 15 are averaged
    reported = averaging.evaluate(iterates.raw, lambda weights: weights[0].item(), progress=0.0)
    assert (reported.loss, reported.length) == (14.0, 3)


@pytest.mark.parametrize(("history", "progress", "fires"), [
    ([5.0, 4.0, 4.5], 0.5, False),  # one evaluation without improvement
    ([5.0, 4.0, 4.5, 4.2], 0.5, True),  # two: patience reached
    ([5.0, 4.0, 3.0], 0.8, True),  # still improving, but 80% of the budget is used
])
def test_tail_averaging_trigger(history: list[float], progress: float, fires: bool) -> None:
    assert tail_trigger(patience=2, latest_start=0.8)(history, progress) is fires

"""The loop's declared state (loop/state.py): what a checkpoint holds of it comes back exactly,
in the keys older checkpoints were written with."""

from dataclasses import fields

from fastsgd.loop.state import SHARED, LoopState


def _filled() -> LoopState:
    return LoopState(level=8, members=[0, 2], weight=1.5, sent=10, received=20, skipped=3,
                     bad_in_a_row=1, evaluated=4, eval_time=0.5, paused=0.25, start=7.0,
                     wall=2.0, penultimate=3.5)


def test_state_dict_round_trips_every_field():
    saved = _filled().state_dict(clock=9.0, wall=2.0)
    back = LoopState()
    back.load_state_dict(saved)
    assert back == _filled()
    assert {f.name for f in fields(LoopState)} - {"bad_in_a_row"} <= set(saved)


def test_the_keys_of_older_checkpoints_are_kept():
    saved = _filled().state_dict(clock=9.0, wall=6.0)
    assert saved["skipped"] == [3, 1] and saved["clock"] == 9.0 and saved["wall"] == 6.0
    older = {k: v for k, v in saved.items() if k not in ("members", "weight", "level")}
    back = LoopState(members=[0, 1, 2])
    back.load_state_dict(older)
    assert back.members == [0, 1, 2] and back.sent == 10 and back.bad_in_a_row == 1


def test_a_joiner_takes_only_the_runs_clocks():
    joiner = LoopState(sent=1)
    joiner.load_state_dict(_filled().state_dict(clock=9.0, wall=2.0), only=SHARED)
    assert (joiner.sent, joiner.skipped, joiner.evaluated, joiner.paused) == (1, 0, 4, 0.25)

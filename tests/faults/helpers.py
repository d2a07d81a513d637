"""What a new process in a lost worker's place must show in metrics.jsonl (run.rejoin, and
fastsgd join): it trained every step from its join on, both ways, from the live model."""

import json


def assert_joined_from_a_live_state(out, rank: int, joined: int, steps: int,
                                    since: int) -> None:
    """After step `since`, `rank`'s rows are the new process's: steps joined + 1 to `steps`
    (the lost one's last lines, not yet flushed, died with it); it sent and received; its
    first loss is the live model's: well under a fresh MLP's on digits (about 2.3). One
    batch's loss of a live model is noisy: 0.5 was once too tight (ltfb, joined at step 53)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r["step"] for r in rows if r["rank"] == rank and r["step"] > since] == [
        *range(joined + 1, steps + 1)]
    after = [r for r in rows if r["rank"] == rank and r["step"] > joined]
    assert sum(r["bytes_sent"] for r in after) > 0 and sum(r["bytes_received"] for r in after)
    first = next(r for r in rows if r["rank"] == rank and r["step"] == joined + 1)
    fresh = next(r for r in rows if r["rank"] == 0 and r["step"] == 1)
    assert first["loss"] < fresh["loss"] / 2, (first["loss"], fresh["loss"])

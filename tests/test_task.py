"""A Task makes its space once (what the space finds once stays found) and travels to workers without it."""

from __future__ import annotations

import pickle

from autotune.task import make_task


def test_a_tasks_space_is_made_once_and_not_pickled():
    task = make_task("qmatmul", "cpu:rocketlake", m=8, k=32, n=16, mode="int8", bias=True, relu=False, a_bits=8)
    space = task.space
    assert task.space is space and len(space) > 0
    copy = pickle.loads(pickle.dumps(task))
    assert copy == task and hash(copy) == hash(task) and "space" not in copy.__dict__
    assert copy.space is not space and len(copy.space) == len(space)

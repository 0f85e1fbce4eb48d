"""Starting a local Ray on a loaded machine: a start that timed out is tried again."""

import pytest

ray = pytest.importorskip("ray")

from gosched.runtime import ray_cluster  # noqa: E402

RAYLET_TIMEOUT = (
    "The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)


def test_a_start_whose_raylet_timed_out_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ray raises this as a plain Exception after a fixed 30 s; only RuntimeError was retried, and
    # `gosched up` failed on a loaded 2-core machine. The first try fails, the real second one runs.
    real_init = ray.init
    calls: list[int] = []

    def init(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise Exception(RAYLET_TIMEOUT)
        return real_init(*args, **kwargs)

    ray.shutdown()
    monkeypatch.setattr(ray, "init", init)
    try:
        ray_cluster._start_ray(None)
        # the fake failure was retried (on a loaded machine the real start may need a try more)
        assert len(calls) >= 2 and ray.is_initialized()
    finally:
        ray.shutdown()


def test_a_start_that_failed_otherwise_is_not_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def init(*args: object, **kwargs: object) -> object:
        calls.append(1)
        raise ValueError("bad address")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray_cluster, "_check_reachable", lambda address: None)
    with pytest.raises(ray_cluster.RayJoinFailed, match="at nowhere:1: ValueError: bad address") as err:
        ray_cluster._start_ray("nowhere:1")
    assert isinstance(err.value.__cause__, ValueError)
    assert len(calls) == 1

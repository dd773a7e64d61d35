"""Matplotlib scene drawings (jax_drive.render.axes) and the coop storyboard's panel times."""

import jax
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from jax_drive.coop.render import storyboard_steps
from jax_drive.pdm import Violations
from jax_drive.render.axes import draw_proposal, draw_scene, violating_points
from jax_drive.scenes import straight_road_scene
from jax_drive.types import AgentType


def _axes():
    fig = Figure()
    FigureCanvasAgg(fig)
    return fig.add_subplot()


def _violations(dac=(), nc=(), ttc=()):
    """Violations (8,) with the given poses failing; NC / TTC hit a 4 x 2 m box at (20, 0)."""
    flags = {name: np.isin(np.arange(8), list(idx)) for name, idx in (("dac", dac), ("nc", nc), ("ttc", ttc))}
    box = np.tile(np.array([20.0, 0.0, 0.0, 4.0, 2.0, 1.5, 0.0], np.float32), (8, 1))
    obj = np.where(flags["nc"], 0, -1).astype(np.int32)
    return Violations(dac_point=flags["dac"], nc_point=flags["nc"], nc_object=obj, nc_box=box, nc_class=obj,
                      ttc_point=flags["ttc"], ttc_object=obj, ttc_box=box, ttc_class=obj)


def test_draw_scene_draws_each_object_present_at_the_step():
    scene = straight_road_scene(agents=[{"x": 20.0, "y": 0.0}, {"x": -15.0, "y": 3.5}])
    scene = jax.tree.map(np.asarray, scene)
    ax = _axes()
    draw_scene(ax, scene)
    drivable = int(np.asarray(scene.map.drivable.valid).sum())
    agents = int(np.asarray(scene.agents.valid)[:, 0].sum())
    assert agents == 2
    assert len(ax.patches) == drivable + agents + 1  # polygons, objects, the ego


def test_static_objects_are_drawn_apart_from_agents():
    from jax_drive.scenes import add_static, straight_road

    spec = straight_road()
    add_static(spec, 15.0, 0.0, agent_type=int(AgentType.TRAFFIC_CONE))
    ax = _axes()
    draw_scene(ax, jax.tree.map(np.asarray, spec.build()))
    colours = {tuple(np.round(p.get_facecolor()[:3], 3)) for p in ax.patches}
    from matplotlib.colors import to_rgb

    assert tuple(np.round(to_rgb("tab:brown"), 3)) in colours and tuple(np.round(to_rgb("tab:blue"), 3)) not in colours


def test_violating_points_is_the_union_of_the_rules():
    v = _violations(dac=[1], nc=[3], ttc=[3, 5])
    np.testing.assert_array_equal(violating_points(v), np.isin(np.arange(8), [1, 3, 5]))
    batched = jax.tree.map(lambda a: np.stack([a, np.zeros_like(a)]), v)
    np.testing.assert_array_equal(violating_points(batched, 1), np.zeros(8, bool))


def test_draw_proposal_marks_each_rule_and_outlines_the_hit_objects():
    poses = np.stack([np.arange(1, 9) * 5.0, np.zeros(8), np.zeros(8)], -1)
    ax = _axes()
    draw_proposal(ax, poses, _violations(dac=[0, 1], nc=[4], ttc=[3]), detail=True)
    sizes = sorted(len(c.get_offsets()) for c in ax.collections)
    assert sizes == [1, 1, 2]  # TTC, NC, DAC markers
    assert len(ax.patches) == 2  # the collided object and the TTC object
    plain = _axes()
    draw_proposal(plain, poses, _violations(dac=[0, 1], nc=[4], ttc=[4]))
    assert [len(c.get_offsets()) for c in plain.collections] == [3] and not plain.patches
    none = _axes()
    draw_proposal(none, poses)
    assert not none.collections and len(none.lines) == 1


def test_storyboard_steps_span_the_episode():
    np.testing.assert_array_equal(storyboard_steps(34, 4), [0, 11, 22, 33])
    np.testing.assert_array_equal(storyboard_steps(2, 4), [0, 1])
    np.testing.assert_array_equal(storyboard_steps(1, 3), [0])
    with pytest.raises(ValueError, match="panels"):
        storyboard_steps(10, 0)


@pytest.mark.slow
def test_plot_refinement_draws_each_usable_turn_with_its_violations(tmp_path, monkeypatch):
    """Fig. 4 on one scene: a first answer through a parked car (NC violations circled), a
    second that stops short of it; an out-of-format turn is left out."""
    from jax_drive.pipelines.mtdrive.plots import plot_refinement
    from jax_drive.scenes import stack_scenes
    from jax_drive.text import format_trajectory

    scene = straight_road_scene(agents=[{"x": 25.0, "y": 0.0, "speed": 0.0}])
    t = np.arange(1, 9) * 0.5
    through = np.stack([10.0 * t, 0 * t, 0 * t], -1)
    stop = np.stack([np.minimum(10.0 * t, 12.0), 0 * t, 0 * t], -1)
    steps = np.arange(1, 41) * 0.1
    reference = np.stack([np.minimum(10.0 * steps, 12.0), 0 * steps, 0 * steps], -1)[None].astype(np.float32)
    turns = [{"text": format_trajectory(through), "pdms": 0.0, "usable": True},
             {"text": "no trajectory here", "pdms": 0.0, "usable": False},
             {"text": format_trajectory(stop), "pdms": 1.0, "usable": True}]
    results = {"_transcripts": {"sft": [turns]}, "_held_out": [(stack_scenes([scene]), reference)]}
    from jax_drive.render import axes

    drawn = []
    real = axes.draw_proposal

    def spy(ax, poses, violations=None, index=(), **kwargs):
        drawn.append((np.asarray(poses), violating_points(violations, index), kwargs["label"]))
        real(ax, poses, violations, index, **kwargs)

    monkeypatch.setattr(axes, "draw_proposal", spy)
    path = tmp_path / "refinement.png"
    assert plot_refinement(results, path, stage="rl")  # falls back to the stage that was evaluated
    assert path.stat().st_size > 10_000
    assert [label for *_, label in drawn] == ["turn 1 (PDMS 0.00)", "turn 3 (PDMS 1.00)"]
    np.testing.assert_allclose(drawn[0][0], through, atol=0.01)
    bad = drawn[0][1]  # poses at 5, 10, ..., 40 m: the car at 25 m is hit, the first and last are clear of it
    assert bad[4] and not bad[0] and not bad[7]
    assert not drawn[1][1].any()
    assert plot_refinement({"_transcripts": {}, "_held_out": []}, path) is False

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

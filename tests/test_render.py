"""Scene rendering: camera geometry, depth ordering, BEV drivable pixels against the scorer's
drivable mask, batching, PNG files and contact sheets.

* A vehicle straight ahead on a straight road appears in the image's centre columns, its
  lowest pixel row where the pinhole model puts its rear bottom edge: row + 0.5 within one
  pixel of H / 2 + f tan(atan(z / d) - pitch) (d: distance from the camera to the rear face),
  also for a pitched camera; its top edge likewise.
* A pedestrian in front of a taller truck hides it where they overlap; the truck shows above.
* BEV: at 4000 random pixel centres of generated scenes (straight, curved, intersection and
  merge layouts), the drivable layer equals the scorer's DAC test (the band-table
  `inside_bits` of `jax_drive.pdm`, its production path) and shapely's polygon containment;
  pixels painted asphalt are drivable and pixels painted off-road are not.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_drive.pdm.polygons import build_band_table, inside_bits, map_budget
from jax_drive.render import (
    BEVConfig,
    CameraConfig,
    bev_layers,
    contact_sheet,
    encode_png,
    pixel_centres,
    project_points,
    render_bev,
    render_camera,
    write_png,
)
from jax_drive.render import style
from jax_drive.scenes import generate_scenes
from jax_drive.scenes.builders import stack_scenes, straight_road_scene
from jax_drive.types import AgentType

SMALL_CAMERA = CameraConfig(width=224, height=126)


def _object_mask(image):
    """(H, W) True where a pixel is not a ground or sky colour, i.e. shows an object."""
    background = [style.ASPHALT, style.MARKING, style.OFFROAD, style.SKY, style.HORIZON]
    return ~np.any([np.all(image == np.asarray(c, np.uint8), -1) for c in background], axis=0)


def _expected_row(config, distance, height_above_ground):
    """Pinhole row (continuous) of a point straight ahead: distance from the camera along x,
    at the given height above the ground."""
    below = math.atan2(config.z - height_above_ground, distance) - math.radians(config.pitch_deg)
    return config.height / 2 + config.focal * math.tan(below)


@pytest.mark.parametrize("pitch", [0.0, 6.0])
def test_vehicle_ahead_appears_centred_at_the_expected_rows(pitch):
    config = CameraConfig(width=224, height=126, pitch_deg=pitch)
    length, height, ahead = 4.5, 1.6, 20.0
    scene = straight_road_scene(agents=[dict(x=ahead, y=0.0, length=length, height=height)])
    image = np.asarray(render_camera(scene, config))
    assert image.shape == (126, 224, 3) and image.dtype == np.uint8
    centre = config.width // 2
    mask = _object_mask(image)
    rows = np.flatnonzero(mask[:, centre])
    assert rows.size > 3
    distance = ahead - length / 2 - config.x  # camera to the rear face
    bottom, top = _expected_row(config, distance, 0.0), _expected_row(config, distance, height)
    assert abs(rows.max() + 0.5 - bottom) <= 1.0, (rows.max(), bottom)
    assert abs(rows.min() + 0.5 - top) <= 1.0, (rows.min(), top)
    (u, v), _ = project_points(jnp.asarray([distance + config.x, 0.0, 0.0]), config)
    assert abs(float(v) - bottom) < 1e-3 and abs(float(u) - config.width / 2) < 1e-3
    # horizontally centred: the object's columns are symmetric about the image centre
    cols = np.flatnonzero(mask.any(0))
    assert abs((cols.min() + cols.max() + 1) / 2 - config.width / 2) <= 1.0
    vehicle = np.asarray(style.AGENT_COLOURS[AgentType.VEHICLE])
    shaded = image[int(round(bottom)) - 2, centre].astype(int)
    assert np.all(np.abs(shaded - vehicle) <= 60)  # a (shaded) vehicle face


def test_nearer_object_hides_farther_one():
    scene = straight_road_scene(agents=[
        dict(x=10.0, y=0.0, length=0.6, width=0.6, height=1.8, agent_type=int(AgentType.PEDESTRIAN)),
        dict(x=25.0, y=0.0, length=8.0, width=2.5, height=3.8)])
    image = np.asarray(render_camera(scene, SMALL_CAMERA))
    column = image[:, SMALL_CAMERA.width // 2].astype(int)
    ped = np.asarray(style.AGENT_COLOURS[AgentType.PEDESTRIAN])
    truck = np.asarray(style.AGENT_COLOURS[AgentType.VEHICLE])
    is_ped = np.all(np.abs(column - ped) <= 60, -1)
    is_truck = np.all(np.abs(column - truck) <= 60, -1)
    assert is_ped.sum() > 3 and is_truck.sum() > 1
    assert np.flatnonzero(is_truck).max() < np.flatnonzero(is_ped).min()  # truck above only


@pytest.fixture(scope="module")
def scenes():
    return generate_scenes(jax.random.key(11), 4)


def test_bev_drivable_pixels_match_the_scorer(scenes):
    import shapely
    config = BEVConfig(height=160, width=128, metres_per_pixel=0.5)
    budget = map_budget(scenes)
    centres = np.asarray(pixel_centres(config))
    rng = np.random.default_rng(0)
    images = np.asarray(render_bev(scenes, config))
    assert images.shape == (4, 160, 128, 3)
    for i in range(4):
        scene = jax.tree.map(lambda a: a[i], scenes)
        layers = jax.tree.map(np.asarray, bev_layers(scene, config))
        rows = rng.integers(0, config.height, 1000)
        cols = rng.integers(0, config.width, 1000)
        pts = centres[rows, cols]
        drv = scene.map.drivable
        table = build_band_table(jnp.asarray(drv.vertices, jnp.float32), jnp.asarray(drv.valid),
                                 budget.drivable)
        scorer = np.asarray(jnp.any(inside_bits(jnp.asarray(pts), table) != 0, axis=-1))
        ours = layers["drivable"][rows, cols]
        np.testing.assert_array_equal(ours, scorer)
        polys = [shapely.Polygon(np.asarray(v)) for v, ok in zip(drv.vertices, drv.valid) if ok]
        inside = np.array([any(p.contains(shapely.Point(*q)) for p in polys) for q in pts])
        near_edge = np.array([min(p.exterior.distance(shapely.Point(*q)) for p in polys) < 1e-3
                              for q in pts])
        np.testing.assert_array_equal(ours[~near_edge], inside[~near_edge])
        assert 0.05 < ours.mean() < 0.95  # both kinds of pixels were sampled
        colours = [tuple(c) for c in images[i][rows, cols]]
        asphalt = np.array([c == style.ASPHALT for c in colours])
        offroad = np.array([c == style.OFFROAD for c in colours])
        assert asphalt.any() and offroad.any()
        assert ours[asphalt].all() and not ours[offroad].any()


def test_bev_draws_ego_objects_and_history():
    scene = straight_road_scene(agents=[dict(x=12.0, y=3.5, agent_type=int(AgentType.BICYCLE),
                                             length=1.8, width=0.6)], ego_speed=8.0)
    config = BEVConfig()
    image = np.asarray(render_bev(scene, config))
    m = config.metres_per_pixel
    ego_pixel = image[int(config.row_of_ego - 1.4 / m), config.width // 2]  # ~ego box centre
    np.testing.assert_array_equal(ego_pixel, style.EGO)
    bike = image[int(config.row_of_ego - 12.0 / m), int(config.width / 2 - 3.5 / m)]
    np.testing.assert_array_equal(bike, style.AGENT_COLOURS[AgentType.BICYCLE])
    behind = image[int(config.row_of_ego + 8.0 * 1.0 / m), config.width // 2]  # 1 s back
    np.testing.assert_array_equal(behind, style.HISTORY)


def test_batched_rendering_equals_one_by_one():
    a = straight_road_scene(agents=[dict(x=15.0, y=0.0)])
    b = straight_road_scene(agents=[dict(x=30.0, y=-3.5)], num_lanes=2, ego_lane=1)
    batch = stack_scenes([a, b])
    both = np.asarray(render_camera(batch, SMALL_CAMERA))
    np.testing.assert_array_equal(both[1], np.asarray(render_camera(b, SMALL_CAMERA)))
    nested = jax.tree.map(lambda x: x[None], batch)  # leading dims (1, 2)
    assert render_bev(nested, BEVConfig(height=32, width=32)).shape == (1, 2, 32, 32, 3)


def test_png_and_contact_sheet(tmp_path):
    from PIL import Image as pil
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(20, 30), (10, 40), (25, 25)]]
    sheet = contact_sheet(images, columns=2, pad=3)
    assert sheet.shape == (3 + 2 * (25 + 3), 3 + 2 * (40 + 3), 3)
    np.testing.assert_array_equal(sheet[3:23, 3:33], images[0])
    np.testing.assert_array_equal(sheet[31:56, 3:28], images[2])
    path = write_png(tmp_path / "sheet.png", sheet)
    np.testing.assert_array_equal(np.asarray(pil.open(path)), sheet)
    grey = images[0][..., 0]
    from io import BytesIO
    np.testing.assert_array_equal(np.asarray(pil.open(BytesIO(encode_png(grey)))), grey)
    with pytest.raises(ValueError, match="uint8"):
        encode_png(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError, match="no images"):
        contact_sheet([])
    with pytest.raises(ValueError, match="above the ground"):
        CameraConfig(z=0.0)

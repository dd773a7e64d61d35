"""`jax-drive score` and the trajectory-file loader."""

import json

import numpy as np
import pytest

from jax_drive.cli import main
from jax_drive.evaluate import TrajectoryFileError, load_trajectories


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def _line(scene, poses=None):
    poses = poses if poses is not None else [[2.0 * (k + 1), 0.0, 0.0] for k in range(8)]
    return json.dumps({"scene": scene, "poses": poses})


def test_load_trajectories_ok_and_blank_lines(tmp_path):
    f = _write(tmp_path / "t.jsonl", [_line(1), "", _line(0, [[1.0, 0.5, 0.1]] * 8)])
    out = load_trajectories(f, 2)
    assert out.shape == (2, 8, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out[0], [[1.0, 0.5, 0.1]] * 8)
    np.testing.assert_allclose(out[1, :, 0], 2.0 * np.arange(1, 9))


@pytest.mark.parametrize(
    "lines, message",
    [
        (["{not json"], r":1: invalid JSON"),
        ([_line(0), "[1, 2]"], r":2: expected an object"),
        ([_line("a")], r":1: 'scene' must be an integer"),
        ([_line(5)], r":1: scene 5 out of range"),
        ([_line(0), _line(0)], r":2: duplicate scene 0 \(first on line 1\)"),
        ([_line(0, [[1.0, 2.0, 3.0]] * 7)], r":1: 'poses' must be a list of 8"),
        ([_line(0, [[1.0, 2.0]] * 8)], r":1: 'poses' must be a list of 8"),
        ([_line(0, [["x", 2.0, 3.0]] * 8)], r":1: 'poses' must contain numbers"),
        ([json.dumps({"scene": 0, "poses": [[1e400, 0, 0]] * 8})], r":1: 'poses' must contain finite"),
        ([_line(0)], r"no trajectory for 1 scene\(s\): 1"),
    ],
)
def test_load_trajectories_bad_lines(tmp_path, lines, message):
    f = _write(tmp_path / "bad.jsonl", lines)
    with pytest.raises(TrajectoryFileError, match=message):
        load_trajectories(f, 2)


def test_cli_rejects_bad_file_with_line_number(tmp_path, capsys):
    f = _write(tmp_path / "bad.jsonl", [_line(0), '{"scene": 1, "poses": 3}'])
    rc = main(["score", "--planner", "file", "--file", str(f), "--scenes", "2"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:2" in err and "'poses'" in err
    assert main(["score", "--planner", "file", "--scenes", "2"]) == 2  # no --file
    assert main(["score", "--planner", "expert", "--scenes", "0"]) == 2
    with pytest.raises(SystemExit):
        main(["score", "--planner", "nonsense"])


@pytest.mark.slow
def test_cli_scores_expert_and_file_consistently(tmp_path, capsys):
    n = 24  # same generator batch as tests/test_scenes.py, scored in chunks of 8
    out_json = tmp_path / "expert.json"
    rc = main(["score", "--planner", "expert", "--scenes", str(n), "--seed", "0", "--batch-size", "8", "--json", str(out_json)])
    assert rc == 0
    text = capsys.readouterr().out
    for label in ("NC", "DAC", "TTC", "EP", "PDMS", "EPDMS", "DDC", "TLC", "LK", "HC", "EC"):
        assert f"\n{label} " in text
    data = json.loads(out_json.read_text())
    assert data["planner"] == "expert" and data["scenes"] == n and len(data["per_scene"]["pdms"]) == n
    m = data["metrics"]
    assert 0.0 <= m["pdms"] <= 1.0 and m["nc"] >= 0.85
    np.testing.assert_allclose(m["pdms"], np.mean(data["per_scene"]["pdms"]), atol=1e-5)

    # writing the expert's poses to a file and scoring it gives the same numbers
    import jax

    from jax_drive.scenes.generator import generate_scenes

    scenes = generate_scenes(jax.random.PRNGKey(0), n)
    f = _write(tmp_path / "traj.jsonl", [_line(i, np.asarray(scenes.expert[i]).tolist()) for i in range(n)])
    out2 = tmp_path / "file.json"
    assert main(["score", "--planner", "file", "--file", str(f), "--scenes", str(n), "--batch-size", "8", "--json", str(out2)]) == 0
    data2 = json.loads(out2.read_text())
    np.testing.assert_allclose(data2["per_scene"]["pdms"], data["per_scene"]["pdms"], atol=1e-5)

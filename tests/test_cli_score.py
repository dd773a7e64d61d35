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
    n = 12  # one chunk: each chunk's map budget is its own compilation
    out_json = tmp_path / "expert.json"
    rc = main(["score", "--planner", "expert", "--scenes", str(n), "--seed", "0", "--batch-size", "12", "--json",
               str(out_json), "--no-progress"])
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
    assert main(["score", "--planner", "file", "--file", str(f), "--scenes", str(n), "--batch-size", "12", "--json",
                 str(out2), "--no-progress"]) == 0
    data2 = json.loads(out2.read_text())
    np.testing.assert_allclose(data2["per_scene"]["pdms"], data["per_scene"]["pdms"], atol=1e-5)


# ------------------------------------------------------------------ scene files
EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "scenes"


def test_token_trajectories_any_spacing_and_errors(tmp_path):
    from jax_drive.evaluate import load_token_trajectories

    t = np.arange(1, 17) * 0.25
    fine = np.stack([3.0 * t, np.zeros(16), np.zeros(16)], -1).tolist()
    f = _write(tmp_path / "t.jsonl", [json.dumps({"token": "b", "poses": fine, "dt": 0.25})])
    out = load_token_trajectories(f, ["a", "b"])
    assert np.isnan(out[0]).all()  # no trajectory for "a": an invalid row
    np.testing.assert_allclose(out[1, :, 0], 3.0 * 0.5 * np.arange(1, 9), atol=1e-6)
    cases = [
        ([json.dumps({"token": "c", "poses": fine, "dt": 0.25})], r":1: token 'c' is not in the scene file"),
        ([json.dumps({"token": "a", "poses": fine[:8], "dt": 0.25})], r":1: 8 poses at 0.25 s cover 2 s, need 4 s"),
        ([json.dumps({"token": "a", "poses": fine, "dt": 0.25})] * 2, r":2: duplicate token 'a' \(first on line 1\)"),
        ([json.dumps({"token": "a", "poses": fine, "dt": "x"})], r":1: 'dt' must be a number"),
        ([json.dumps({"token": 3, "poses": fine})], r":1: 'token' must be a string"),
        ([json.dumps({"token": "a", "poses": [[1, 2]] * 8})], r":1: poses must be a list of \[x, y, heading\]"),
    ]
    for lines, message in cases:
        with pytest.raises(TrajectoryFileError, match=message):
            load_token_trajectories(_write(tmp_path / "bad.jsonl", lines), ["a", "b"])


def test_navsim_submission_pickle_is_read_without_navsim(tmp_path, monkeypatch):
    """NAVSIM's submission.pkl ({"predictions": [{token: Trajectory}]}) pickles navsim's
    Trajectory class; it is read here with stand-ins, and nothing else is unpickled."""
    import dataclasses
    import pickle
    import sys
    import types

    from jax_drive.evaluate import load_token_trajectories

    @dataclasses.dataclass
    class TrajectorySampling:
        num_poses: int = 8
        interval_length: float = 0.5

    @dataclasses.dataclass
    class Trajectory:
        poses: np.ndarray
        trajectory_sampling: TrajectorySampling

    stand_ins = []
    for module, cls in (("navsim.common.dataclasses", Trajectory),
                        ("nuplan.planning.simulation.trajectory.trajectory_sampling", TrajectorySampling)):
        parts = module.split(".")
        for depth in range(1, len(parts) + 1):  # the module and its parent packages
            name = ".".join(parts[:depth])
            if name not in sys.modules:
                monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
                stand_ins.append(name)
        setattr(sys.modules[module], cls.__name__, cls)
        cls.__module__, cls.__qualname__ = module, cls.__name__
    poses = np.stack([np.arange(1, 9) * 1.5, np.zeros(8), np.zeros(8)], -1).astype(np.float32)
    submission = {"team_name": "x", "predictions": [{"tok": Trajectory(poses, TrajectorySampling())}]}
    path = tmp_path / "submission.pkl"
    path.write_bytes(pickle.dumps(submission))
    for name in stand_ins:  # gone again: the reader must not need them
        monkeypatch.delitem(sys.modules, name)
    out = load_token_trajectories(path, ["other", "tok"])
    np.testing.assert_allclose(out[1], poses, atol=1e-6)
    assert np.isnan(out[0]).all()

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path.write_bytes(pickle.dumps({"predictions": [{"tok": Evil()}]}))
    with pytest.raises(TrajectoryFileError, match="refusing to load builtins.print"):
        load_token_trajectories(path, ["tok"])


@pytest.mark.slow
def test_cli_scores_the_example_scene_file(tmp_path, capsys):
    """The 20 hand-built example scenes (examples/scenes) with their trajectories, one left
    out: NAVSIM's CSV columns, an invalid row for the missing token, the "average" row over
    the valid ones, the JSON and the failure plot; every sub-score as the scene was built
    to show (examples/scenes/example_expected.json)."""
    import csv

    expected = json.loads((EXAMPLES / "example_expected.json").read_text())
    lines = (EXAMPLES / "example_trajectories.jsonl").read_text().splitlines()
    traj = _write(tmp_path / "t.jsonl", [line for line in lines if '"clear-road"' not in line])
    out_csv, out_json, out_png = tmp_path / "s.csv", tmp_path / "s.json", tmp_path / "f.png"
    rc = main(["score", "--scenes-file", str(EXAMPLES / "example_scenes.json.gz"), "--trajectories", str(traj),
               "--csv", str(out_csv), "--json", str(out_json), "--plot", str(out_png), "--no-progress"])
    assert rc == 0
    assert "1 of 20 scenes have no trajectory" in capsys.readouterr().err
    rows = list(csv.DictReader(out_csv.open()))
    assert list(rows[0]) == ["token", "valid", "no_at_fault_collisions", "drivable_area_compliance", "ego_progress",
                             "time_to_collision_within_bound", "comfort", "driving_direction_compliance", "score"]
    assert [r["token"] for r in rows] == list(expected) + ["average"]
    assert rows[0]["valid"] == "False" and rows[0]["score"] == "nan" and rows[-1]["valid"] == "False"
    data = json.loads(out_json.read_text(), parse_constant=_not_json)  # strict: no NaN / Infinity
    per_scene = data["per_scene"]
    assert data["valid"] == 19 and per_scene["pdms"][0] is None
    assert data["meta"]["command"] == "score" and "date_utc" in data["meta"] and "non_finite" not in data
    np.testing.assert_allclose(float(rows[-1]["score"]), np.mean(per_scene["pdms"][1:]), atol=1e-5)
    column = {"nc": "no_at_fault_collisions", "dac": "drivable_area_compliance", "ttc": "time_to_collision_within_bound",
              "comfort": "comfort", "ddc": "driving_direction_compliance", "ep": "ego_progress", "pdms": "score"}
    for i, (token, entry) in enumerate(expected.items()):
        if i == 0:
            continue
        for name, want in entry["expected"].items():
            if name == "ep_range":
                assert want[0] <= per_scene["ep"][i] <= want[1], (token, per_scene["ep"][i])
                continue
            got = float(rows[i][column[name]]) if name in column else per_scene[name][i]
            assert got == pytest.approx(want, abs=1e-3), (token, name, got, want)
    assert set(data["failures"]) >= {"NC", "DAC", "TTC", "C"} and data["failures"]["NC"]["static"] > 0
    assert out_png.stat().st_size > 1000
    # Errors name the file and the field; wrong combinations are refused.
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "jax-drive-scenes", "version": 1, "scenes": [{"token": "x"}]}')
    assert main(["score", "--scenes-file", str(bad)]) == 2
    assert "scenes[0] (token 'x'): ego: missing" in capsys.readouterr().err
    assert main(["score", "--scenes-file", str(bad), "--scenes", "4"]) == 2
    assert main(["score", "--csv", str(out_csv), "--scenes", "4"]) == 2


def _not_json(name):
    raise AssertionError(f"{name} in a results file")


def test_a_trajectory_file_matching_no_scene_is_refused_before_scoring(tmp_path, capsys, monkeypatch):
    import jax_drive.evaluate as evaluate

    def never(*_, **__):
        raise AssertionError("scored")

    monkeypatch.setattr(evaluate, "evaluate_scene_file", never)
    out_json, out_png = tmp_path / "s.json", tmp_path / "f.png"
    scenes = str(EXAMPLES / "example_scenes.json.gz")
    for lines in ([], ["", "   "]):  # empty, blank lines only
        traj = _write(tmp_path / "t.jsonl", lines)
        assert main(["score", "--scenes-file", scenes, "--trajectories", str(traj), "--json", str(out_json),
                     "--plot", str(out_png), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"--trajectories {traj}: no trajectory for any of the 20 scenes" in err and "nothing to score" in err
    assert not out_json.exists() and not out_png.exists()


def test_a_score_over_no_valid_row_is_an_error_not_a_result(tmp_path, capsys, monkeypatch):
    """Whatever leaves no valid row (here a scorer stand-in that marks every row invalid), the
    command fails instead of reporting means over nothing and a plot with 0 % failing."""
    import types

    import jax_drive.evaluate as evaluate

    monkeypatch.setattr(evaluate, "evaluate_scene_file",
                        lambda scenes, *_, **__: types.SimpleNamespace(finite=np.zeros(len(scenes.tokens), bool)))
    out_json, out_png = tmp_path / "s.json", tmp_path / "f.png"
    assert main(["score", "--scenes-file", str(EXAMPLES / "example_scenes.json.gz"), "--planner", "expert",
                 "--json", str(out_json), "--plot", str(out_png), "--no-progress"]) == 1
    assert "no valid row among the 20 scored" in capsys.readouterr().err
    assert not out_json.exists() and not out_png.exists()


# ------------------------------------------------------------------ several proposals, v2 rules, timing
@pytest.mark.slow
def test_cli_scores_several_proposals_per_scene_with_navsim_v2_rules(tmp_path, capsys):
    """Three proposals per scene ("proposals" lines; one scene gives only two): one CSV row
    per proposal with a "proposal" column, NaN rows for the missing one, NAVSIM v2's columns
    with two_frame_extended_comfort empty (no previous frame), the same scores as
    evaluate_scene_file with NAVSIM v2's rules, and the time split printed and in the JSON."""
    import csv

    from jax_drive.compile_cache import ExecutableStore
    from jax_drive.evaluate import evaluate_scene_file, load_token_proposals
    from jax_drive.pdm import PDMConfig
    from jax_drive.scenes.io import load_scenes

    scenes_file = EXAMPLES / "example_scenes.json.gz"
    tokens = load_scenes(scenes_file).tokens[:4]
    lines = []
    for i, token in enumerate(tokens):
        count = 2 if i == 1 else 3
        props = [[[(4.0 + k) * 0.5 * (j + 1), 0.3 * k * (j + 1) / 8, 0.0] for j in range(8)] for k in range(count)]
        lines.append(json.dumps({"token": token, "proposals": props, "dt": 0.5}))
    traj = _write(tmp_path / "p.jsonl", lines)
    out_csv, out_json = tmp_path / "s.csv", tmp_path / "s.json"
    rc = main(["score", "--scenes-file", str(scenes_file), "--trajectories", str(traj), "--navsim-version", "2",
               "--csv", str(out_csv), "--json", str(out_json), "--no-progress"])
    assert rc == 0
    out, err = capsys.readouterr()
    assert "time: load" in out and "compile" in out and "score" in out
    assert "proposal rows have no trajectory" in err
    rows = list(csv.DictReader(out_csv.open()))
    assert list(rows[0])[:3] == ["token", "proposal", "valid"] and "history_comfort" in rows[0]
    n = len(load_scenes(scenes_file))
    assert len(rows) == 3 * n + 1 and rows[-1]["token"] == "average"
    assert all(r["two_frame_extended_comfort"] == "nan" for r in rows)
    by_key = {(r["token"], int(r["proposal"])): r for r in rows[:-1]}
    assert by_key[(tokens[1], 2)]["valid"] == "False" and by_key[(tokens[0], 2)]["valid"] == "True"
    data = json.loads(out_json.read_text())
    assert set(data["timing"]) >= {"load_s", "compile_s", "score_s", "programs_compiled", "programs_from_cache"}
    scene_file = load_scenes(scenes_file)
    store = ExecutableStore()  # the program the command stored: loaded, not compiled again
    want = evaluate_scene_file(scene_file, "file", PDMConfig(navsim_version="2"),
                               proposals=load_token_proposals(traj, scene_file.tokens), executables=store)
    assert store.hits == 1 and data["timing"]["programs_compiled"] >= 1
    for (token, k), row in by_key.items():
        i = scene_file.tokens.index(token)
        if row["valid"] == "True":
            assert float(row["score"]) == pytest.approx(float(want.epdms[i, k]), abs=1e-6)
            assert float(row["history_comfort"]) == float(want.hc[i, k])


def test_proposals_file_errors(tmp_path):
    from jax_drive.evaluate import load_token_proposals

    good = [[float(j + 1), 0.0, 0.0] for j in range(8)]
    cases = [
        ([json.dumps({"token": "a", "proposals": []})], r":1: 'proposals' must be a non-empty list"),
        ([json.dumps({"token": "a", "proposals": [good, [[1, 2]] * 8]})],
         r":1: proposal 1: poses must be a list of \[x, y, heading\]"),
        ([json.dumps({"token": "a", "poses": good, "proposals": [good]})], r":1: expected an object with keys"),
        ([json.dumps({"token": "z", "proposals": [good]})], r":1: token 'z' is not in the scene file"),
    ]
    for lines, message in cases:
        with pytest.raises(TrajectoryFileError, match=message):
            load_token_proposals(_write(tmp_path / "bad.jsonl", lines), ["a", "b"])
    out = load_token_proposals(_write(tmp_path / "ok.jsonl", [json.dumps({"token": "b", "proposals": [good, good]}),
                                                              json.dumps({"token": "a", "poses": good})]), ["a", "b"])
    assert out.shape == (2, 2, 8, 3) and np.isnan(out[0, 1]).all() and not np.isnan(out[1]).any()


# ------------------------------------------------------------------ the persistent compilation cache
def _cache_dir_in_fresh_process(env_extra: dict, tmp_path) -> str:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_DRIVE_NO_"))}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), **env_extra)
    code = ("from jax_drive.compile_cache import enable_compile_cache; import sys; "
            "print(enable_compile_cache(), 'jax' in sys.modules)")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.split()


def test_compile_cache_location_opt_out_and_checkout_guard(tmp_path):
    from jax_drive.compile_cache import _CHECKOUT

    directory, imported_jax = _cache_dir_in_fresh_process({}, tmp_path)
    assert directory == str(tmp_path / "xdg" / "jax_drive" / "xla") and imported_jax == "False"
    assert _cache_dir_in_fresh_process({"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "mine")}, tmp_path)[0] == str(
        tmp_path / "mine")
    assert _cache_dir_in_fresh_process({"JAX_DRIVE_NO_COMPILE_CACHE": "1"}, tmp_path)[0] == "None"
    inside = str(_CHECKOUT / "xla_cache_here")
    assert _cache_dir_in_fresh_process({"JAX_COMPILATION_CACHE_DIR": inside}, tmp_path)[0] == "None"


def test_executable_store_loads_what_it_stored(tmp_path):
    """A second store (a new process in real use) loads the stored executable instead of
    compiling; results are the same."""
    import jax
    import jax.numpy as jnp

    from jax_drive.compile_cache import ExecutableStore

    def f(x, scale):
        return jnp.cumsum(jnp.sin(x) * scale)

    fn = jax.jit(f, static_argnames=("scale",))
    x = np.linspace(0.0, 1.0, 17, dtype=np.float32)
    first = ExecutableStore(tmp_path)
    a = np.asarray(first.get("f", fn, (x,), {"scale": 2.0})(x))
    assert (first.hits, first.misses) == (0, 1)
    second = ExecutableStore(tmp_path)
    b = np.asarray(second.get("f", fn, (x,), {"scale": 2.0})(x))
    assert (second.hits, second.misses) == (1, 0)
    np.testing.assert_array_equal(a, b)
    second.get("f", fn, (x,), {"scale": 3.0})  # another static argument: another program
    assert second.misses == 1 and len(list((tmp_path / "jax_drive_executables").glob("*.bin"))) == 2

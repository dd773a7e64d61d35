"""Building lane centreline paths (NumPy, Python side, used by the scenario builders).

A lane path is a polyline of C points with uniform spacing (built by :func:`resample`).
Projection onto paths and points along them are :mod:`jax_drive.geometry`'s polyline
table functions; the simulator projects with ``extrapolate=True`` so that vehicles
slightly before the start or beyond the end get negative / over-length arcs.
"""

from __future__ import annotations

import numpy as np


def resample(points: np.ndarray, num: int) -> np.ndarray:
    """Resamples a polyline (P, 2) to ``num`` points equally spaced in arc length."""
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 2 or len(points) < 2:
        raise ValueError(f"polyline must be (P>=2, 2), got {points.shape}")
    seg = np.linalg.norm(np.diff(points, axis=0), axis=1)
    keep = np.concatenate([[True], seg > 1e-9])
    points = points[keep]
    cum = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(points, axis=0), axis=1))])
    if cum[-1] <= 0:
        raise ValueError("polyline has zero length")
    s = np.linspace(0.0, cum[-1], num)
    return np.stack([np.interp(s, cum, points[:, 0]), np.interp(s, cum, points[:, 1])], -1)


def straight(p0, p1, num: int = 8) -> np.ndarray:
    """Points (num, 2) on the segment p0 -> p1."""
    t = np.linspace(0.0, 1.0, num)[:, None]
    return (1 - t) * np.asarray(p0, float) + t * np.asarray(p1, float)


def bezier(p0, c, p1, num: int = 16) -> np.ndarray:
    """Quadratic Bezier (num, 2) from p0 to p1 with control point c."""
    t = np.linspace(0.0, 1.0, num)[:, None]
    p0, c, p1 = (np.asarray(v, float) for v in (p0, c, p1))
    return (1 - t) ** 2 * p0 + 2 * (1 - t) * t * c + t**2 * p1


def join(*parts: np.ndarray) -> np.ndarray:
    """Concatenates polylines, dropping duplicated joint points."""
    out = [np.asarray(parts[0], float)]
    for part in parts[1:]:
        part = np.asarray(part, float)
        if np.linalg.norm(part[0] - out[-1][-1]) < 1e-6:
            part = part[1:]
        out.append(part)
    return np.concatenate(out, axis=0)


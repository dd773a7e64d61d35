"""The bound checks configs share (``configs.at_least`` / ``configs.above``): one message format."""

import dataclasses

import pytest

from jax_drive.configs import above, at_least


@dataclasses.dataclass(frozen=True)
class _Sizes:
    a: int = 1
    b: int = 1
    c: float = 0.5


def test_names_are_listed_with_commas_and_a_final_and():
    with pytest.raises(ValueError, match=r"^a, b and c must be >= 1$"):
        at_least(_Sizes(b=0), 1, "a", "b", "c")
    with pytest.raises(ValueError, match=r"^a and c must be > 0$"):
        above(_Sizes(c=0.0), 0, "a", "c")
    with pytest.raises(ValueError, match=r"^b must be >= 2$"):
        at_least(_Sizes(), 2, "b")


def test_bounds_hold_at_the_edge_and_nan_fails():
    at_least(_Sizes(), 1, "a", "b")  # equal to the bound passes
    above(_Sizes(), 0, "c")
    with pytest.raises(ValueError, match="must be > 0"):
        above(_Sizes(c=float("nan")), 0, "c")
    with pytest.raises(ValueError, match="must be >= 0"):
        at_least(_Sizes(c=float("nan")), 0, "c")


def test_the_error_class_is_the_callers():
    class InputError(ValueError):
        pass

    with pytest.raises(InputError, match="^a must be >= 2$"):
        at_least(_Sizes(), 2, "a", error=InputError)


def test_one_of_shows_the_choices_as_given_and_the_value_repr():
    from jax_drive.configs import one_of

    one_of("mode", "a", ("a", "b"))
    with pytest.raises(ValueError, match=r"^mode must be one of \('a', 'b'\), got 'c'$"):
        one_of("mode", "c", ("a", "b"))
    with pytest.raises(KeyError, match=r"\['x', 'y'\], got 3"):
        one_of("split", 3, sorted({"y", "x"}), error=KeyError)

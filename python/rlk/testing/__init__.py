"""Test helpers shared by every op: bitwise assertions and the shape catalog."""

from rlk.testing.asserts import assert_batch_invariant, assert_bitwise_equal, first_difference
from rlk.testing.shapes import SHAPES, Shape, cases

__all__ = ["assert_bitwise_equal", "assert_batch_invariant", "first_difference", "SHAPES", "Shape", "cases"]

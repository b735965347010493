"""The scheduling rules' closed forms (in which step a decoder first meets a rule, as the
stretch planner asks) against the rules applied step by step."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from slotune.engine.rules import (
    alloc_step,
    fill_step,
    fills_block,
    length_step,
    needs_blocks,
    reaches_length,
)

# a decoder computes (and samples) one token in each step from ``first`` on


@given(st.integers(1, 50), st.integers(0, 600), st.integers(1, 64))
def test_fill_step_is_the_first_step_that_fills_a_block(first: int, computed: int, bs: int) -> None:
    step = first
    while not fills_block(computed + step - first + 1, 1, bs):
        step += 1
    assert fill_step(first, computed, bs) == step


@given(st.integers(1, 50), st.integers(0, 600), st.integers(0, 64))
def test_alloc_step_is_the_first_step_that_needs_blocks(
    first: int, computed: int, spare: int
) -> None:
    slots = computed + spare  # a running request holds the slots of what it computed
    step = first
    while not needs_blocks(computed + step - first, 1, slots):
        step += 1
    assert alloc_step(first, computed, slots) == step


@given(st.integers(1, 50), st.integers(1, 600), st.integers(1, 300))
def test_length_step_is_the_step_that_samples_the_last_token(
    first: int, num_tokens: int, left: int
) -> None:
    max_num_tokens = num_tokens + left
    step = first
    while not reaches_length(num_tokens + step - first + 1, max_num_tokens):
        step += 1
    assert length_step(first, num_tokens, max_num_tokens) == step

"""The synthetic, checkable tasks of the RL loop.

``target_byte`` (:class:`TargetByteTask`): produce a target byte. The trained ``tiny`` model is byte-level (vocabulary 256, trained on Python source), so a prompt is
a short byte string and a response is bytes. The reward of a response is the fraction of its
tokens equal to ``target`` (default ``e``: about 9% of the trained model's sampled bytes after
these prompts), so it lies in ``[0, 1]``, its optimum is known (1.0: every byte ``target``) and a
working loop raises it within a few steps.

``token_class`` (:class:`TokenClassTask`): for models with a large vocabulary (Qwen3's 151,936
tokens), where one target token would almost never be sampled and give no learning signal. The
reward of a response is the fraction of its tokens in a residue class (``id % modulus ==
residue``, default the even ids): about ``1 / modulus`` of the mass of a model that does not know
the rule, optimum 1.0, and the group's rewards differ from the first step on.
"""

from __future__ import annotations

import dataclasses

import torch

from rlk.errors import UnsupportedConfigError

# Prompt prefixes, each a few bytes of Python; a step takes consecutive ones, cycling.
PROMPTS = (b"def ", b"import ", b"class ", b"return ", b"    if ", b"for x in ", b"self.", b"# ")


@dataclasses.dataclass(frozen=True)
class _PromptTask:
    """What both tasks share: byte prompts taken in turn, and a reward that is the fraction of a
    response's tokens that :meth:`hit` accepts."""

    prompts: tuple[bytes, ...] = PROMPTS

    def hit(self, token: int) -> bool:
        raise NotImplementedError

    def reward_rule(self) -> str:
        """The reward in words (reports and plots)."""
        raise NotImplementedError

    def check(self, vocab_size: int) -> None:
        if not self.prompts or any(not p for p in self.prompts):
            raise UnsupportedConfigError("the task needs at least one prompt, none of them empty")
        bad = [p for p in self.prompts if any(b >= vocab_size for b in p)]
        if bad:
            raise UnsupportedConfigError(f"prompt {bad[0]!r} holds a byte outside the vocabulary [0, {vocab_size})")

    def step_prompts(self, step: int, n: int) -> list[list[int]]:
        """The ``n`` prompts of step ``step`` (consecutive prompts, cycling), as token lists."""
        k = len(self.prompts)
        return [list(self.prompts[(step * n + i) % k]) for i in range(n)]

    def reward(self, response: list[int]) -> float:
        if not response:
            raise UnsupportedConfigError("empty response (every request has max_new_tokens >= 1)")
        return sum(self.hit(int(t)) for t in response) / len(response)

    def rewards(self, responses: list[list[int]]) -> torch.Tensor:
        """``[N]`` fp32 rewards of ``responses``."""
        return torch.tensor([self.reward(r) for r in responses], dtype=torch.float32)

    def _dict(self, name: str, **fields) -> dict:
        return {"name": name, **fields, "reward_rule": self.reward_rule(),
                "prompts": [p.decode("latin-1") for p in self.prompts]}


@dataclasses.dataclass(frozen=True)
class TargetByteTask(_PromptTask):
    """Reward = fraction of response tokens equal to ``target`` (a token id of the byte vocabulary)."""

    target: int = ord("e")

    def hit(self, token: int) -> bool:
        return token == self.target

    def reward_rule(self) -> str:
        return f"fraction of response bytes equal to {chr(self.target)!r}"

    def check(self, vocab_size: int) -> None:
        if not 0 <= self.target < vocab_size:
            raise UnsupportedConfigError(f"target token {self.target} outside the vocabulary [0, {vocab_size})")
        super().check(vocab_size)

    def to_dict(self) -> dict:
        return self._dict("target_byte", target=self.target, target_char=chr(self.target))


@dataclasses.dataclass(frozen=True)
class TokenClassTask(_PromptTask):
    """Reward = fraction of response tokens ``t`` with ``t % modulus == residue``; the prompts are
    :data:`PROMPTS`' bytes (token ids below 256, valid in any vocabulary of at least 256)."""

    modulus: int = 2
    residue: int = 0

    def hit(self, token: int) -> bool:
        return token % self.modulus == self.residue

    def reward_rule(self) -> str:
        return f"fraction of response tokens with id % {self.modulus} == {self.residue}"

    def check(self, vocab_size: int) -> None:
        if self.modulus < 2 or not 0 <= self.residue < self.modulus:
            raise UnsupportedConfigError(f"token class: modulus {self.modulus} must be >= 2 and residue "
                                         f"{self.residue} in [0, modulus)")
        if vocab_size < max(self.modulus, 256):
            raise UnsupportedConfigError(f"token class: vocabulary {vocab_size} smaller than 256 or the modulus")
        super().check(vocab_size)

    def to_dict(self) -> dict:
        return self._dict("token_class", modulus=self.modulus, residue=self.residue)


TASKS = ("target_byte", "token_class")

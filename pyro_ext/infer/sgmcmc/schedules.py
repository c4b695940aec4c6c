"""Step-size schedules: callables from the step index ``t = 0, 1, ...`` to a step size."""

import math

from ...ops.validation import check_int, check_positive, check_real


class ConstantStepSize:
    """A fixed step size, the practical choice of thesis section 2.3.3."""

    def __init__(self, step_size: float):
        self.step_size = check_positive(step_size, "step_size")

    def __call__(self, t: int) -> float:
        return self.step_size

    def __repr__(self):
        return f"ConstantStepSize({self.step_size:g})"


class PolynomialDecay:
    r"""
    Robbins-Monro decay :math:`\epsilon_t = a (b + t)^{-\gamma}`. With
    :math:`\gamma \in (0.5, 1]` it meets :math:`\sum_t \epsilon_t = \infty`,
    :math:`\sum_t \epsilon_t^2 < \infty` (thesis section 2.3, after Proposition 2.1).

    >>> schedule = PolynomialDecay(a=0.1, b=1.0, gamma=0.5)
    >>> [round(schedule(t), 4) for t in (0, 3, 99)]
    [0.1, 0.05, 0.01]
    """

    def __init__(self, a: float, b: float = 1.0, gamma: float = 0.55):
        self.a = check_positive(a, "a")
        self.b = check_positive(b, "b")
        self.gamma = check_real(gamma, "gamma", 0, 1, low_open=True)

    def __call__(self, t: int) -> float:
        return self.a * (self.b + t) ** (-self.gamma)

    def __repr__(self):
        return f"PolynomialDecay(a={self.a:g}, b={self.b:g}, gamma={self.gamma:g})"


class CyclicalStepSize:
    r"""
    Cosine cycles of Zhang et al. (2020, cyclical SG-MCMC):
    :math:`\epsilon_t = \frac{\epsilon_0}{2}[\cos(\pi \bmod(t, c) / c) + 1]`,
    :math:`c = \lceil T / M \rceil` for ``M = num_cycles`` cycles over ``T = num_steps``.

    >>> schedule = CyclicalStepSize(0.1, num_cycles=2, num_steps=100)
    >>> [round(schedule(t), 3) for t in (0, 25, 50)]
    [0.1, 0.05, 0.1]
    """

    def __init__(self, step_size: float, num_cycles: int, num_steps: int):
        self.step_size = check_positive(step_size, "step_size")
        num_cycles = check_int(num_cycles, "num_cycles", low=1)
        num_steps = check_int(num_steps, "num_steps", low=1)
        if num_cycles > num_steps:
            raise ValueError(
                f"need 1 <= num_cycles <= num_steps, got num_cycles={num_cycles}, "
                f"num_steps={num_steps}"
            )
        self.cycle_length = math.ceil(num_steps / num_cycles)

    def __call__(self, t: int) -> float:
        phase = (t % self.cycle_length) / self.cycle_length
        return 0.5 * self.step_size * (math.cos(math.pi * phase) + 1.0)

    def __repr__(self):
        return f"CyclicalStepSize({self.step_size:g}, cycle_length={self.cycle_length})"


def as_schedule(step_size):
    """A number becomes :class:`ConstantStepSize`; a callable ``t -> float`` is kept."""
    if callable(step_size):
        return step_size
    return ConstantStepSize(step_size)

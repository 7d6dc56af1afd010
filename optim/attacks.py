"""Byzantine attacks, for simulation and tests only.

    attack = optim.attacks.build("alie")
    bad = attack(own, honest, round=r, rng=generator, num_byzantine=f)

``own`` (d,) is the attacker's own honestly computed update; ``honest`` (k, d)
are this round's honest updates (the attacker is omniscient, the strongest
assumption); ``history`` is the list of updates this attacker saw in earlier
rounds, oldest first (the simulator decides which: usually its own past
updates). The result is the (d,) float32 update the attacker submits.

Names: ``sign-flip`` (scale), ``gaussian`` (sigma), ``label-flip`` (a data
attack: the update is honest work on poisoned batches, see
:func:`poison_batch`), ``alie`` (z), ``ipm`` (eps), ``mimic`` (peer),
``stale-replay`` (delay), ``free-rider`` (mode), ``nan`` (inf),
``huge-norm`` (factor), ``min-max`` / ``min-sum`` (perturbation) and
``agr-tailored`` (rule, perturbation): the optimisation attacks of
optim/attacks_minmax.py; ``index-poison`` (scale, fraction), ``slow-accumulate``
(magnitude, fraction, seed) and ``vote-tailored`` (scale, max_honest), each also
with the codec's chunk and topk: the compression-aware attacks of
optim/attacks_sparse.py, made for a per-chunk top-K codec and a rule that
aggregates each coordinate over its senders.

A data attack needs no hook in the trainer: wrap the attacker's sampler,
``InnerTrainer(model, cfg, PoisonedSampler(sampler))``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist
from typing import Any

import torch

from optim import attacks_minmax as minmax
from optim import attacks_sparse as sparse

# name -> default options
_OPTIONS: dict[str, dict[str, Any]] = {
    "sign-flip": {"scale": 1.0},
    "gaussian": {"sigma": 1.0},
    "label-flip": {},
    "alie": {"z": None},  # None: Baruch et al. (2019) formula from n and f
    "ipm": {"eps": 0.1},
    "mimic": {"peer": None},  # None: the honest update farthest from the honest mean
    "stale-replay": {"delay": 1},
    "free-rider": {"mode": "zero"},  # "zero" or "copy" (submit the honest mean, doing no work)
    "nan": {"inf": False},
    "huge-norm": {"factor": 1e6},
    **minmax.OPTIONS,
    **sparse.OPTIONS,
}
NAMES: tuple[str, ...] = tuple(_OPTIONS)


def alie_z(num_peers: int, num_byzantine: int) -> float:
    """Baruch, Baruch & Goldberg (2019), "A Little Is Enough": with n peers of
    which f are Byzantine, s = floor(n/2 + 1) - f honest peers must be won over,
    and z = Phi^-1((n - s) / n) is how far (in honest standard deviations) the
    attackers can sit from the mean while still looking like a majority."""
    s = math.floor(num_peers / 2 + 1) - num_byzantine
    if s < 1:
        raise ValueError(
            f"alie: with n={num_peers} peers and f={num_byzantine} Byzantine ones the attackers already hold a "
            f"majority (s = floor(n/2 + 1) - f = {s} < 1); pass the z option explicitly"
        )
    return NormalDist().inv_cdf((num_peers - s) / num_peers)


def poison_batch(x: torch.Tensor, y: torch.Tensor, vocab: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Label flipping for a token model: targets y -> vocab - 1 - y (for bytes,
    255 - y); the inputs stay as they are, so the poisoned peer still looks
    like it trains on real text."""
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= vocab):
        raise ValueError(f"poison_batch: targets must lie in [0, {vocab}), got [{int(y.min())}, {int(y.max())}]")
    return x, (vocab - 1) - y


class PoisonedSampler:
    """A sampler whose batches go through :func:`poison_batch` (label flipping);
    its state (for --resume) is the wrapped sampler's."""

    def __init__(self, sampler: Any, vocab: int = 256) -> None:
        self.sampler, self.vocab = sampler, vocab

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.sampler.next_batch()  # (B, T) each
        return poison_batch(x, y, self.vocab)

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


class Attack:
    """A callable malicious-update generator; build it with :func:`build`."""

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        self.name = name
        self.options = options
        self.data_poisoning = name == "label-flip"
        self._craft: Callable[..., torch.Tensor] = _CRAFT[name]

    def __repr__(self) -> str:
        return f"Attack({self.name!r}, options={self.options})"

    def __call__(
        self,
        own: torch.Tensor,
        honest: torch.Tensor,
        *,
        round: int,
        rng: torch.Generator,
        num_byzantine: int,
        history: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if own.dim() != 1:
            raise ValueError(f"{self.name}: own must be a (d,) update, got shape {tuple(own.shape)}")
        if honest.dim() != 2 or honest.shape[1] != own.shape[0]:
            raise ValueError(
                f"{self.name}: honest must be (k, {own.shape[0]}) to match own, got shape {tuple(honest.shape)}"
            )
        if num_byzantine < 1:
            raise ValueError(f"{self.name}: num_byzantine counts the attackers, this one included; must be >= 1")
        out = self._craft(
            self.options,
            own=own.detach().float(),
            honest=honest.detach().float(),
            round=round,
            rng=rng,
            num_byzantine=num_byzantine,
            history=history or [],
        )
        return out.to(torch.float32)


def build(name: str, **options: Any) -> Attack:
    if name not in _OPTIONS:
        raise ValueError(f"unknown attack {name!r}; valid names: {', '.join(NAMES)}")
    defaults = _OPTIONS[name]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        accepted = ", ".join(defaults) or "none"
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for attack {name!r}; accepted: {accepted}")
    resolved = {**defaults, **options}
    _check_options(name, resolved)
    return Attack(name, resolved)


def _check_options(name: str, o: dict[str, Any]) -> None:
    for key in ("scale", "sigma", "eps", "factor"):
        if key in o and (isinstance(o[key], bool) or not isinstance(o[key], (int, float)) or not o[key] > 0):
            raise ValueError(f"attack {name}: option {key} must be a number > 0, got {o[key]!r}")
    if o.get("z") is not None and (isinstance(o["z"], bool) or not isinstance(o["z"], (int, float))):
        raise ValueError(f"attack {name}: option z must be a number, got {o['z']!r}")
    for key, minimum in (("delay", 1), ("peer", 0)):
        value = o.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
            raise ValueError(f"attack {name}: option {key} must be an integer >= {minimum}, got {value!r}")
    if "mode" in o and o["mode"] not in ("zero", "copy"):
        raise ValueError(f"attack {name}: option mode must be 'zero' or 'copy', got {o['mode']!r}")
    if "inf" in o and not isinstance(o["inf"], bool):
        raise ValueError(f"attack {name}: option inf must be True or False, got {o['inf']!r}")
    minmax.check_options(name, o)
    sparse.check_options(name, o)


def _need_honest(name: str, honest: torch.Tensor) -> None:
    if honest.shape[0] == 0:
        raise ValueError(f"{name}: needs at least one honest update to work from, got none")


def _sign_flip(o: dict[str, Any], *, own: torch.Tensor, **_: Any) -> torch.Tensor:
    return -o["scale"] * own


def _gaussian(o: dict[str, Any], *, own: torch.Tensor, rng: torch.Generator, **_: Any) -> torch.Tensor:
    return torch.randn(own.shape, generator=rng, dtype=torch.float32) * o["sigma"]


def _label_flip(o: dict[str, Any], *, own: torch.Tensor, **_: Any) -> torch.Tensor:
    # The poison is in the data (PoisonedSampler); the update itself is submitted as computed.
    return own.clone()


def _alie(o: dict[str, Any], *, honest: torch.Tensor, num_byzantine: int, **_: Any) -> torch.Tensor:
    _need_honest("alie", honest)
    z = alie_z(honest.shape[0] + num_byzantine, num_byzantine) if o["z"] is None else o["z"]
    # Unbiased std across honest peers; undefined for a single one, so 0 there.
    std = honest.std(dim=0) if honest.shape[0] > 1 else torch.zeros_like(honest[0])
    return honest.mean(dim=0) - z * std


def _ipm(o: dict[str, Any], *, honest: torch.Tensor, **_: Any) -> torch.Tensor:
    # Inner-product manipulation (Xie, Koyejo & Gupta, 2019): small, so it passes
    # distance filters, and anti-aligned with the true mean.
    _need_honest("ipm", honest)
    return -o["eps"] * honest.mean(dim=0)


def _mimic(o: dict[str, Any], *, honest: torch.Tensor, **_: Any) -> torch.Tensor:
    # Over-represent one honest peer (Karimireddy et al., 2022): with non-iid data
    # this drags the aggregate towards that peer's distribution. Default target:
    # the most atypical honest update, which skews the aggregate most.
    _need_honest("mimic", honest)
    if o["peer"] is not None:
        if o["peer"] >= honest.shape[0]:
            raise ValueError(f"mimic: peer={o['peer']} but only {honest.shape[0]} honest updates this round")
        return honest[o["peer"]].clone()
    spread = torch.linalg.vector_norm(honest.double() - honest.double().mean(dim=0), dim=1)
    return honest[int(torch.argmax(spread))].clone()


def _stale_replay(o: dict[str, Any], *, own: torch.Tensor, history: list[torch.Tensor], **_: Any) -> torch.Tensor:
    delay = o["delay"]
    if len(history) < delay:
        return own.clone()
    return history[-delay].detach().float().clone()


def _free_rider(o: dict[str, Any], *, own: torch.Tensor, honest: torch.Tensor, **_: Any) -> torch.Tensor:
    if o["mode"] == "copy":
        _need_honest("free-rider", honest)
        return honest.mean(dim=0)
    return torch.zeros_like(own)


def _nan(o: dict[str, Any], *, own: torch.Tensor, **_: Any) -> torch.Tensor:
    return torch.full_like(own, float("inf") if o["inf"] else float("nan"))


def _huge_norm(o: dict[str, Any], *, own: torch.Tensor, honest: torch.Tensor, **_: Any) -> torch.Tensor:
    _need_honest("huge-norm", honest)
    target = o["factor"] * torch.linalg.vector_norm(honest.double(), dim=1).mean()
    direction = own.double()
    if not bool(direction.any()):  # a zero update has no direction; use the all-ones one
        direction = torch.ones_like(direction)
    return direction * (target / torch.linalg.vector_norm(direction))


_CRAFT: dict[str, Callable[..., torch.Tensor]] = {
    "sign-flip": _sign_flip,
    "gaussian": _gaussian,
    "label-flip": _label_flip,
    "alie": _alie,
    "ipm": _ipm,
    "mimic": _mimic,
    "stale-replay": _stale_replay,
    "free-rider": _free_rider,
    "nan": _nan,
    "huge-norm": _huge_norm,
    **minmax.CRAFT,
    **sparse.CRAFT,
}

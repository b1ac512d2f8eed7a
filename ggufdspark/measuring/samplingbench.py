"""``bench --sampling-check``: the target alone and the target with the DSpark draft each sample
many seeded completions of one prompt at temperature > 0; ``ggufdspark.measuring.sampling_check`` compares
the two arms' token frequencies position by position (chi-square, Bonferroni).

Both servers are the ones ``bench`` measures (``measure.base_settings`` / ``arm_settings``: the
drafted arm is what ``serve`` would start). The plain arm's requests use seeds ``seed .. seed+N-1``,
the drafted arm's ``seed+N .. seed+2N-1``: independent samples (equal seeds would reproduce the
plain tokens exactly, see ``sampling_check``). The drafted arm's ``draft_n`` / ``draft_n_accepted``
are summed from the responses' timings: a check in which no drafted token was accepted did not
exercise speculative sampling and is reported ``inconclusive``.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ggufdspark.errors import BenchError, BenchOptionError, LosslessGateError
from ggufdspark.measuring.measure import arm_settings, base_settings, kept_logs, log_directory, prepare, running
from ggufdspark.measuring.profiles import pair_record
from ggufdspark.measuring.sampling_check import ALPHA, SamplingCheck, check_samples
from ggufdspark.runners.client import Client
from ggufdspark.serve_checks import ServingOptions

log = logging.getLogger(__name__)

DEFAULT_PROMPT = "Once upon a time"
DEFAULT_SAMPLES = 400
DEFAULT_N_PREDICT = 8
DEFAULT_TEMPERATURE = 1.0
DEFAULT_CLIENTS = 4
CTX_PER_SLOT = 512


@dataclass
class ArmSamples:
    """One arm's completions (token ids, in seed order) and its summed draft counts."""

    label: str
    seeds: list[int]
    tokens: list[list[int]]
    draft_n: int = 0
    draft_n_accepted: int = 0

    @property
    def acceptance(self) -> float | None:
        return self.draft_n_accepted / self.draft_n if self.draft_n else None

    def to_dict(self) -> dict:
        return {"label": self.label, "samples": len(self.tokens), "seeds": [self.seeds[0], self.seeds[-1]],
                "draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted, "acceptance": self.acceptance}


def sampling_request(*, temperature: float, top_k: int, top_p: float = 1.0, min_p: float = 0.0,
                     extra: dict | None = None) -> dict:
    """The sampler part of each request: ``temperature`` and ``top_k`` (0: the whole vocabulary),
    the other truncations off unless ``extra`` sets them (``extra`` also carries e.g. ``logit_bias``)."""
    return {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "typical_p": 1.0,
            "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
            "xtc_probability": 0.0, **(extra or {})}


def sample_arm(client: Client, prompt: str | list[int], seeds: list[int], *, n_predict: int, temperature: float,
               top_k: int = 0, concurrency: int = DEFAULT_CLIENTS, extra: dict | None = None,
               label: str = "") -> ArmSamples:
    """One completion of ``prompt`` per seed, ``concurrency`` requests in flight.

    Raises:
        EngineError: a request failed.
    """
    body = sampling_request(temperature=temperature, top_k=top_k, extra=extra)

    def one(seed: int):
        return client.complete(prompt, n_predict=n_predict, seed=seed, **body)

    with ThreadPoolExecutor(max(1, concurrency)) as ex:
        done = list(ex.map(one, seeds))
    out = ArmSamples(label, list(seeds), [list(c.tokens or []) for c in done])
    out.draft_n = sum(c.timings.draft_n or 0 for c in done)
    out.draft_n_accepted = sum(c.timings.draft_n_accepted or 0 for c in done)
    return out


@dataclass
class SamplingReport:
    """``status``: the check's (pass, fail, inconclusive), or ``inconclusive`` when no drafted token
    was accepted (``reason`` says which)."""

    status: str
    check: SamplingCheck
    arms: dict[str, ArmSamples]
    settings: dict[str, Any]
    logs: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    pair: dict | None = None  # profiles.pair_record: what publish --results checks

    def to_dict(self) -> dict:
        return {"kind": "ggufdspark bench --sampling-check", "pair": self.pair, "status": self.status,
                "reason": self.reason,
                "settings": self.settings,
                "arms": {k: a.to_dict() for k, a in self.arms.items()}, "check": self.check.to_dict(),
                "logs": self.logs}

    def text(self) -> str:
        d = self.arms["drafted"]
        acc = f"{d.draft_n_accepted} of {d.draft_n} drafted tokens accepted"
        acc += f" ({d.acceptance:.0%})" if d.acceptance is not None else ""
        s = self.settings
        lines = [f"prompt {s['prompt']!r}, {s['n_predict']} tokens, temperature {s['temperature']:g}, top_k {s['top_k']}, "
                 f"draft length {s['draft_n_max']}; drafted arm: {acc}", self.check.describe()]
        if self.reason and self.reason != self.check.reason:
            lines.append(f"{self.status}: {self.reason}")
        return "\n".join(lines)

    def raise_for_status(self) -> None:
        """LosslessGateError (exit 3) on a fail; BenchError on an inconclusive run."""
        if self.status == "fail":
            raise LosslessGateError(self.check.describe())
        if self.status == "inconclusive":
            raise BenchError(f"sampling check inconclusive: {self.reason}")


def check_options(*, samples: int, n_predict: int, temperature: float, top_k: int, alpha: float) -> None:
    """Raises BenchOptionError (a usage error, exit 2) naming the first unusable value."""
    if samples < 20:
        raise BenchOptionError(f"--samples {samples}: at least 20 a side (a few hundred give the test power)")
    if n_predict < 1:
        raise BenchOptionError(f"-n {n_predict}: at least 1 token")
    if temperature <= 0:
        raise BenchOptionError(f"--temperature {temperature:g}: must be > 0 (greedy output is the lossless gate's)")
    if top_k < 0:
        raise BenchOptionError(f"--top-k {top_k}: 0 (off) or more")
    if not 0 < alpha < 1:
        raise BenchOptionError(f"--alpha {alpha:g}: must be in (0, 1)")


def run_sampling_check(opts: ServingOptions, *, prompt: str = DEFAULT_PROMPT, samples: int = DEFAULT_SAMPLES,
                       n_predict: int = DEFAULT_N_PREDICT, temperature: float = DEFAULT_TEMPERATURE, top_k: int = 0,
                       alpha: float = ALPHA, seed: int = 1, clients: int = DEFAULT_CLIENTS,
                       log_dir: str | Path | None = None) -> SamplingReport:
    """Sample ``samples`` completions from each arm and compare them (see the module docstring).
    ``opts``: the pair (``model``, ``draft``), the engine and the server's options (``draft_n_max``,
    ``threads``, ``extra_args``; a slot's context ``CTX_PER_SLOT`` unless ``ctx_per_slot``);
    ``serve``'s own options are refused (``ServingOptions.check_measured``).

    Raises:
        BenchOptionError: bad options (before anything loads).
        InputNotFoundError, PairMismatchError, EngineError, BenchError: files, pair, engine or a
            server that died or failed a request.
    """
    target, draft, draft_n_max = opts.model, opts.draft, opts.draft_n_max
    opts.check_measured("bench --sampling-check")
    check_options(samples=samples, n_predict=n_predict, temperature=temperature, top_k=top_k, alpha=alpha)
    info, _devices, decision, limits = prepare(opts, concurrency=[clients])
    n_max = draft_n_max or decision.draft_n_max or limits.max_n
    if n_max > limits.max_n:
        raise BenchError(f"draft length {n_max} exceeds what {Path(draft).name} can draft ({limits.max_n})")
    seeds = {"plain": list(range(seed, seed + samples)), "drafted": list(range(seed + samples, seed + 2 * samples))}
    arms: dict[str, ArmSamples] = {}
    with log_directory(log_dir, "ggufdspark-sampling-") as logs:
        base = base_settings(info, replace(opts, ctx_per_slot=opts.ctx_per_slot or CTX_PER_SLOT), decision=decision,
                             parallel=clients)
        settings = {"plain": arm_settings(base, None),
                    "drafted": arm_settings(base, draft, n_max=None if draft_n_max is None and base.draft else n_max)}
        for arm, s in settings.items():
            log.info("sampling check, %s arm: %d samples (%s)", arm, samples, logs / f"{arm}.log")
            with running(s, logs / f"{arm}.log") as c:
                arms[arm] = sample_arm(c, prompt, seeds[arm], n_predict=n_predict, temperature=temperature,
                                       top_k=top_k, concurrency=clients, label=arm)
        check = check_samples(arms["plain"].tokens, arms["drafted"].tokens, alpha=alpha, positions=n_predict)
        status, reason = check.status, check.reason if check.status == "inconclusive" else ""
        if not arms["drafted"].draft_n_accepted:
            status, reason = "inconclusive", ("no drafted token was accepted, so speculative sampling was not "
                                              "exercised (lower the temperature or set --top-k)")
        shown = {"prompt": prompt, "samples": samples, "n_predict": n_predict, "temperature": temperature,
                 "top_k": top_k, "alpha": alpha, "seed": seed, "clients": clients,
                 "draft_n_max": settings["drafted"].draft_n_max, "engine": str(info.path)}
        return SamplingReport(status, check, arms, shown, kept_logs({a: str(logs / f"{a}.log") for a in settings},
                                                                    log_dir), reason,
                              pair=pair_record(target, draft))

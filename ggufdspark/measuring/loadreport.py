"""The result of a ``bench --load`` run (``loadbench.run_load``): every arm's figures level by
level, drafted / plain of each, the JSON it writes (``LoadReport.to_dict``) and the table it prints
(``LoadReport.text``), with ``--noise-floor``'s band (a second plain server against the first)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ggufdspark.measuring import traffic as tr

NOISE_ARM = "plain2"  # --noise-floor's second plain server


@dataclass
class LoadReport:
    """The result of one ``bench --load`` run (``to_dict`` is the JSON written)."""

    command: str | None
    engine: dict
    hardware: dict
    traffic: dict
    settings: dict
    synthetic: str | None
    arms: dict[str, list[tr.LevelResult]]
    logs: dict[str, str] = field(default_factory=dict)
    pair: dict | None = None  # profiles.pair_record: what publish --results checks

    @property
    def drafted_arms(self) -> list[str]:
        return [a for a in self.arms if a != "plain"]

    def ratios_of(self, arm: str) -> list[dict]:
        """``arm`` / plain of each figure, level by level."""
        return [tr.ratios(p, d) for p, d in zip(self.arms["plain"], self.arms[arm])]

    @property
    def ratios(self) -> list[dict]:
        return self.ratios_of(self.drafted_arms[0])

    def to_dict(self) -> dict:
        out = {"kind": "ggufdspark bench --load", "command": self.command, "pair": self.pair, "engine": self.engine,
               "hardware": self.hardware, "traffic": self.traffic, "settings": self.settings,
               "synthetic": self.synthetic, "ratios": self.ratios,
               "arms": {a: [lv.to_dict() for lv in levels] for a, levels in self.arms.items()}, "logs": self.logs}
        if len(self.drafted_arms) > 1:
            out["ratios_by_arm"] = {a: self.ratios_of(a) for a in self.drafted_arms}
        return out

    def noise_floor_text(self) -> str:
        """One line: how far the second plain server (``--noise-floor``) ran from the first, the band
        inside which drafted / plain says nothing."""
        rs = self.ratios_of(NOISE_ARM)
        agg = [r["aggregate_tps"] for r in rs if r.get("aggregate_tps") is not None]
        rounds = [v for r in rs for v in r.get("aggregate_tps_rounds") or [] if v is not None]
        ttft = [r["ttft_p50_s"] for r in rs if r.get("ttft_p50_s") is not None]

        def band(v: list[float]) -> str:
            return f"{min(v):.2f}-{max(v):.2f}x" if v else "-"

        return (f"noise floor: a second plain server ({NOISE_ARM}, the same command) ran {band(agg)} of the first's "
                f"aggregate over the levels" + (f" (single rounds {band(rounds)})" if rounds else "")
                + f", TTFT p50 {band(ttft)}; a drafted / plain ratio inside that band is no measured difference")

    def level_block(self, title: str, key: str, ratios: dict[str, list[dict]]) -> list[str]:
        """One figure (``key``, in seconds) of every arm level by level, and drafted / plain."""
        arms = ["plain", *self.drafted_arms]
        unit = "clients" if self.traffic["shape"]["mode"] == "closed" else "req/s"
        head = f"{unit:>7} " + " ".join(f"{a:>9}" for a in arms) + " " + " ".join(
            f"{(a + '/pl') if len(arms) > 2 else 'ratio':>9}" for a in arms[1:])
        out = [title, head]
        for i, p in enumerate(self.arms["plain"]):
            out.append(f"{p.level:>7g} " + " ".join(_ms(getattr(self.arms[a][i], key)) for a in arms) + " "
                       + " ".join(_x(ratios[a][i].get(key), 9) for a in arms[1:]))
        return out

    TAILS = (("TTFT p99", "ttft_p99_s"), ("lat p99", "latency_p99_s"), ("gap p99", "longest_gap_p99_s"),
             ("ITL p50", "itl_p50_s"), ("ITL p95", "itl_p95_s"), ("ITL p99", "itl_p99_s"), ("TPOT p50", "tpot_p50_s"),
             ("TPOT p99", "tpot_p99_s"))

    def tails_block(self, ratios: dict[str, list[dict]]) -> list[str]:
        """p99 of TTFT, latency and a request's longest wait; inter-token latency (every wait between
        two streamed chunks, pooled over the requests) and time per output token, per arm and level."""
        unit = "clients" if self.traffic["shape"]["mode"] == "closed" else "req/s"
        head = f"{unit:>7} {'arm':>8} " + " ".join(f"{t:>9}" for t, _ in self.TAILS)
        out = ["Tails and inter-token latency (ITL: every wait between two streamed chunks, a drafted step's "
               "tokens one chunk, pooled over the requests; TPOT: (latency - TTFT) / (tokens - 1) per request):",
               head]
        several = len(self.drafted_arms) > 1
        for i, p in enumerate(self.arms["plain"]):
            for a in ["plain", *self.drafted_arms]:
                lv = self.arms[a][i]
                out.append(f"{lv.level:>7g} {a:>8} " + " ".join(_ms(getattr(lv, k), 1) for _, k in self.TAILS))
                if a != "plain":
                    out.append(f"{'':>7} {a + '/pl' if several else 'ratio':>8} "
                               + " ".join(_x(ratios[a][i].get(k), 9) for _, k in self.TAILS))
        return out

    def requests_block(self) -> list[str]:
        """Per level and arm: requests answered, those with an image (--image-share), those failed."""
        unit = "clients" if self.traffic["shape"]["mode"] == "closed" else "req/s"
        out = ["Requests: answered, with an image, failed (the server answered with an error):",
               f"{unit:>7} {'arm':>8} {'answered':>9} {'image':>6} {'failed':>7}"]
        for i, p in enumerate(self.arms["plain"]):
            for a in self.arms:
                lv = self.arms[a][i]
                out.append(f"{lv.level:>7g} {a:>8} {lv.requests:>9} {lv.image_requests:>6} {lv.failed:>7}")
        return out

    def text(self) -> str:
        """The report as a table: per level, each arm's figures and drafted / plain."""
        t, s = self.traffic, self.settings
        pl = t["prompt_tokens"]
        lines = [f"ggufdspark bench --load: {Path(s['target']).name} + {Path(s['draft']).name} "
                 f"({self.hardware['backend']}, engine {self.engine['commit'] or self.engine['version']}, "
                 f"{len(self.engine['patches'])} patches)",
                 f"traffic: {t['shape']['describe']}",
                 f"prompts: {pl['count']} ({t['prompts']}), {pl['min']}-{pl['max']} tokens, median {pl['median']:g}",
                 f"drafted arm: draft length {s['draft_n_max']}" + (f", SYNTHETIC SPEED: {self.synthetic}"
                                                                    if self.synthetic else ", real acceptance"),
                 *(f"  {a}: {d}" for a, d in (s.get("drafted_arms") or {}).items()),
                 ""]
        unit = "clients" if t["shape"]["mode"] == "closed" else "req/s"
        head = (f"{unit:>7} {'arm':>8} {'reqs':>5} {'agg tok/s':>10} {'dec tok/s':>10} {'TTFT p50':>9} "
                f"{'TTFT p95':>9} {'lat p50':>8} {'lat p95':>8} {'accept':>7}")
        lines += [head, "-" * len(head)]

        def row(lv: tr.LevelResult, arm: str) -> str:
            return (f"{lv.level:>7g} {arm:>8} {lv.requests:>5} {lv.aggregate_tps:>10.1f} {_f(lv.decode_tps_median, 10, 1)} "
                    f"{_ms(lv.ttft_p50_s)} {_ms(lv.ttft_p95_s)} {_s(lv.latency_p50_s)} {_s(lv.latency_p95_s)} "
                    f"{_f(lv.accept_length, 7, 2)}")

        several = len(self.drafted_arms) > 1
        ratios = {a: self.ratios_of(a) for a in self.drafted_arms}
        for i, p in enumerate(self.arms["plain"]):
            lines.append(row(p, "plain"))
            for a in self.drafted_arms:
                r = ratios[a][i]
                spread = [v for v in r.get("aggregate_tps_rounds") or [] if v is not None]
                lines += [row(self.arms[a][i], a),
                          f"{'':>7} {'ratio' if not several else a + '/pl':>8} {'':>5} {_x(r['aggregate_tps'], 10)} "
                          f"{_x(r['decode_tps_median'], 10)} {_x(r['ttft_p50_s'], 9)} {_x(r['ttft_p95_s'], 9)} "
                          f"{_x(r['latency_p50_s'], 8)} {_x(r['latency_p95_s'], 8)}"
                          + (f"   agg by round {min(spread):.2f}-{max(spread):.2f}x" if spread else "")]
        if t["shape"]["mode"] == "closed" and any(lv.ttft_p50_later_s is not None for lv in self.arms["plain"]):
            # every client sends its first request at the level's start: those prompts are processed
            # together (the opening burst), the later ones join running answers
            lines += ["", *self.level_block("TTFT p50 of the requests after each client's first (the opening "
                                            "burst left out):", "ttft_p50_later_s", ratios)]
        if any(lv.longest_gap_p95_s is not None for lv in self.arms["plain"]):
            lines += ["", *self.level_block("A request's longest wait between two tokens (a stall: a prompt joining "
                                            "the batch), p95 over the requests:", "longest_gap_p95_s", ratios)]
        if any(lv.itl_p50_s is not None or lv.ttft_p99_s is not None for lv in self.arms["plain"]):
            lines += ["", *self.tails_block(ratios)]
        if any(lv.image_requests or lv.failed for a in self.arms.values() for lv in a):
            lines += ["", *self.requests_block()]
        if s.get("noise_floor"):
            lines += ["", self.noise_floor_text()]
        lines += ["", "agg = output tokens / wall time of the level; dec = median over requests of (tokens - 1) / "
                      "(latency - TTFT); TTFT and latency measured by the client (streamed); ratio = drafted / plain"
                  + ("; several rounds: every figure over all rounds' requests, 'agg by round' the lowest and "
                     "highest drafted / plain of one round's aggregate" if t["shape"].get("rounds", 1) > 1 else "")]
        return "\n".join(lines)


def _f(v: float | None, w: int, d: int) -> str:
    return f"{v:>{w}.{d}f}" if v is not None else f"{'-':>{w}}"


def _x(v: float | None, w: int) -> str:
    return f"{v:>{w - 1}.2f}x" if v is not None else f"{'-':>{w}}"


def _ms(v: float | None, d: int = 0) -> str:
    return f"{v * 1000:>7.{d}f}ms" if v is not None else f"{'-':>9}"


def _s(v: float | None) -> str:
    return f"{v:>7.2f}s" if v is not None else f"{'-':>8}"

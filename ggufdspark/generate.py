"""``generate``: a random target and/or DSpark drafter shaped like one published pair, in Hub layout.

The shapes are the family's (``ggufdspark.families``); the writing is ``ggufdspark.synthetic``'s.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ggufdspark.errors import InvalidArgumentError, OutputExistsError
from ggufdspark.families import DEFAULT_FAMILY, FAMILIES, SIZES
from ggufdspark.synthetic import synth

log = logging.getLogger(__name__)

ONLY = ("both", "target", "drafter")
DTYPES = ("BF16", "F16", "F32")


@dataclass
class WrittenFile:
    path: str
    bytes: int


@dataclass
class GenerateResult:
    """What ``generate`` wrote: the family imitated, the directories and every file with its size."""

    out: str
    family: str
    model: str  # the published target the shapes come from
    size: str
    dtype: str
    vl: bool
    moe: bool
    target: str | None = None  # the target directory, when written now
    drafter: str | None = None  # the drafter directory, when written now
    files: list[WrittenFile] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_dict(self) -> dict:
        return {**asdict(self), "bytes": self.bytes}


def generate(out: str | Path, *, family: str = DEFAULT_FAMILY, size: str = "small", only: str = "both",
             dtype: str = "BF16", vl: bool = False, force: bool = False,
             on_step: Callable[[str], None] = lambda msg: None) -> GenerateResult:
    """Write a random target (``OUT/target``) and/or its DSpark drafter (``OUT/drafter``).

    A drafter is made for a target: with ``only="drafter"`` and no ``OUT/target`` yet, the target
    is written first. ``on_step`` gets one line before each checkpoint is written.

    Raises:
        InvalidArgumentError: an unknown family, size, ``only`` or dtype, or ``vl`` for a text family.
        MissingDependencyError: the ``generate`` extra is not installed (checked before writing).
        OutputExistsError: ``out`` is a non-empty directory and ``force`` is false.
    """
    for name, value, known in (("family", family, FAMILIES), ("size", size, SIZES), ("only", only, ONLY),
                               ("dtype", dtype, DTYPES)):
        if value not in known:
            raise InvalidArgumentError(f"{name} {value!r}: expected one of {', '.join(known)}")
    fam = FAMILIES[family]
    if vl and not fam.vl:
        raise InvalidArgumentError(f"--vl: the {family} family ({fam.model}) is a text model; "
                                   f"only --family vl-3b has a vision part")
    synth.require_dependencies()  # before anything is written: no half-made OUT to clean up
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise OutputExistsError(f"{out}: directory is not empty (use --force)")
    tspec, dspec = fam.targets[size], fam.drafters[size]
    existed = out.exists()
    ours = not existed or not any(out.iterdir())  # a failed run may remove what it wrote
    try:
        return _generate(out, fam, tspec, dspec, family=family, size=size, only=only, dtype=dtype, vl=vl,
                         on_step=on_step)
    except BaseException:
        if ours:  # nothing of the user's was there: leave nothing half-written to block a re-run
            _remove_contents(out)
            if not existed:
                shutil.rmtree(out, ignore_errors=True)
        raise


def _remove_contents(d: Path) -> None:
    if d.is_dir():
        for p in d.iterdir():
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)


def _generate(out: Path, fam, tspec, dspec, *, family: str, size: str, only: str, dtype: str, vl: bool,
              on_step: Callable[[str], None]) -> GenerateResult:
    before = _snapshot(out)  # with --force, what was there: not reported as written unless rewritten
    result = GenerateResult(out=str(out), family=family, model=fam.model, size=size, dtype=dtype, vl=vl, moe=fam.moe)
    what = f"{fam.title}-shaped{' LFM2-VL' if vl else ''}{' LFM2-MoE' if fam.moe else ''}"
    tdir = out / "target"
    if only in ("both", "target"):
        on_step(f"generating {what} target ({size}) in {tdir}")
        if vl:
            from ggufdspark.synthetic import synth_vl

            vision = synth_vl.SO400M_VISION if size == "full" else synth_vl.SMALL_VISION
            synth_vl.make_vl_target(tdir, tspec, vision, dtype=dtype)
        else:
            synth.make_target(tdir, tspec, dtype=dtype)
        result.target = str(tdir)
    elif not (tdir / "config.json").is_file():
        on_step(f"no target in {tdir}: generating one ({fam.title}, {size}) for the drafter")
        synth.make_target(tdir, tspec, dtype=dtype)
        result.target = str(tdir)
    if only in ("both", "drafter"):
        on_step(f"generating {fam.title} drafter ({size}) in {out / 'drafter'}")
        synth.make_drafter(out / "drafter", tdir, dspec, dtype=dtype)
        result.drafter = str(out / "drafter")
    result.files = [WrittenFile(str(f), st[1]) for f, st in _snapshot(out).items() if before.get(f) != st]
    log.debug("generate: %d files, %d bytes in %s", len(result.files), result.bytes, out)
    return result


def _snapshot(root: Path) -> dict[Path, tuple[int, int]]:
    """Every file below ``root``, in path order: (modification time in ns, size)."""
    if not root.is_dir():
        return {}
    return {f: (st.st_mtime_ns, st.st_size) for f in sorted(root.rglob("*")) if f.is_file() and (st := f.stat())}


def generate_trained(out: str | Path, *, force: bool = False,
                     on_step: Callable[[str], None] = lambda msg: None) -> GenerateResult:
    """Write the trained pair that ships with the package (``ggufdspark.trained.shipped``) to
    ``OUT/target`` and ``OUT/drafter``: a pair that predicts, where ``generate``'s random ones only
    have the right shapes.

    Raises:
        InvalidArgumentError: this installation has no trained pair.
        OutputExistsError: ``out`` is a non-empty directory and ``force`` is false.
    """
    from ggufdspark.trained import shipped

    out = Path(out)
    existed = out.exists()
    on_step(f"writing {shipped.describe()} to {out}")
    try:
        files = shipped.write(out, force=force)
    except (InvalidArgumentError, OutputExistsError):
        raise
    except BaseException:
        if not existed:
            shutil.rmtree(out, ignore_errors=True)
        raise
    return GenerateResult(out=str(out), family="trained", model="ggufdspark trained LFM2 pair", size="trained",
                          dtype="BF16", vl=False, moe=False, target=str(out / "target"), drafter=str(out / "drafter"),
                          files=[WrittenFile(str(f), f.stat().st_size) for f in files])
